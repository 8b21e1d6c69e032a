/* counters.c — per-thread counter slots, gauges, host pool classes, phases,
 * Conductor hints and the event ring.
 *
 * Locking (order: the publisher's pub_mu before slots_mu):
 *   slots_mu   guards the slot list, each slot's `live` flag and `retired`
 *              (the figures of exited threads). Only registration, thread
 *              exit and readers take it; the hot path (sh_tm_add) never does.
 *   a slot's values are written by their owner thread only (relaxed atomics)
 *              and read by anyone.
 *   gauges, host classes, the phase clock: atomics, no lock.
 *   the event ring: lock-free; each entry is its own little seqlock, and
 *              writers take an entry with a CAS (see struct ev_slot).
 */
#include "telemetry/tm_internal.h"

#include "sh_clock.h"
#include "stagehand.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* ---- thread slots ---------------------------------------------------------- */

struct tm_slot {
    struct sh_tm_slots pub; /* first, so &slot->pub == slot */
    struct tm_slot *next;
    int live;
};

_Thread_local struct sh_tm_slots *sh_tm_tls_;

static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tm_slot *slots_head;
static uint64_t retired[SH_TM_NCOUNTERS];
static struct tm_slot spare; /* shared by threads whose slot could not be allocated */
static pthread_key_t slot_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void slots_lock(void)
{
    pthread_mutex_lock(&slots_mu);
}

static void slots_unlock(void)
{
    pthread_mutex_unlock(&slots_mu);
}

/* A thread's figures move to `retired` and its slot becomes reusable, so a
 * program that churns threads does not grow the list without bound. */
static void slot_exit(void *arg)
{
    struct tm_slot *s = arg;
    slots_lock();
    for (int i = 0; i < SH_TM_NCOUNTERS; i++) {
        retired[i] += atomic_load_explicit(&s->pub.v[i], memory_order_relaxed);
        atomic_store_explicit(&s->pub.v[i], 0, memory_order_relaxed);
    }
    s->live = 0;
    slots_unlock();
    sh_tm_tls_ = NULL; /* a later add (another destructor) registers again */
}

static void make_key(void)
{
    if (pthread_key_create(&slot_key, slot_exit) != 0)
        slot_key = (pthread_key_t)-1;
    /* A fork child must find the lock free whatever the parent was doing. */
    pthread_atfork(slots_lock, slots_unlock, slots_unlock);
}

static struct tm_slot *slot_take(void)
{
    for (struct tm_slot *s = slots_head; s; s = s->next)
        if (!s->live && s != &spare) {
            s->live = 1;
            return s;
        }
    struct tm_slot *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->live = 1;
    s->next = slots_head;
    slots_head = s;
    return s;
}

void sh_tm_counters_init(void)
{
    pthread_once(&key_once, make_key);
}

struct sh_tm_slots *sh_tm_register_(void)
{
    sh_tm_counters_init();
    slots_lock();
    struct tm_slot *s = slot_take();
    if (!s && !spare.live) {
        spare.live = 1;
        spare.next = slots_head;
        slots_head = &spare;
    }
    slots_unlock();
    if (!s)
        return sh_tm_tls_ = &spare.pub; /* shared: racing adds may be lost, never torn */
    if (slot_key != (pthread_key_t)-1)
        pthread_setspecific(slot_key, s);
    return sh_tm_tls_ = &s->pub;
}

void sh_tm_counters(uint64_t out[SH_TM_NCOUNTERS])
{
    slots_lock();
    for (int i = 0; i < SH_TM_NCOUNTERS; i++)
        out[i] = retired[i];
    for (struct tm_slot *s = slots_head; s; s = s->next)
        for (int i = 0; i < SH_TM_NCOUNTERS; i++)
            out[i] += atomic_load_explicit(&s->pub.v[i], memory_order_relaxed);
    slots_unlock();
}

uint64_t sh_tm_counter(enum sh_tm_counter c)
{
    uint64_t all[SH_TM_NCOUNTERS];
    if ((unsigned)c >= SH_TM_NCOUNTERS)
        return 0;
    sh_tm_counters(all);
    return all[c];
}

/* ---- gauges ---------------------------------------------------------------- */

static _Atomic int64_t gauges[SH_TM_NGAUGES];

void sh_tm_set(enum sh_tm_gauge g, int64_t v)
{
    if ((unsigned)g < SH_TM_NGAUGES)
        atomic_store_explicit(&gauges[g], v, memory_order_relaxed);
}

void sh_tm_gauge_add(enum sh_tm_gauge g, int64_t delta)
{
    if ((unsigned)g < SH_TM_NGAUGES)
        atomic_fetch_add_explicit(&gauges[g], delta, memory_order_relaxed);
}

int64_t sh_tm_get(enum sh_tm_gauge g)
{
    return (unsigned)g < SH_TM_NGAUGES ? atomic_load_explicit(&gauges[g], memory_order_relaxed) : 0;
}

void sh_tm_gauges(int64_t out[SH_TM_NGAUGES])
{
    for (int i = 0; i < SH_TM_NGAUGES; i++)
        out[i] = atomic_load_explicit(&gauges[i], memory_order_relaxed);
}

static void raise_max(enum sh_tm_gauge g, int64_t v)
{
    int64_t cur = atomic_load_explicit(&gauges[g], memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(
                          &gauges[g], &cur, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

void sh_tm_vram(uint64_t used)
{
    int64_t v = used > INT64_MAX ? INT64_MAX : (int64_t)used;
    atomic_store_explicit(&gauges[SH_TM_G_vram_used], v, memory_order_relaxed);
    raise_max(SH_TM_G_vram_peak, v);
    raise_max(SH_TM_G_vram_step_peak, v);
}

int64_t sh_tm_step_peak_reset(void)
{
    int64_t used = atomic_load_explicit(&gauges[SH_TM_G_vram_used], memory_order_relaxed);
    return atomic_exchange_explicit(&gauges[SH_TM_G_vram_step_peak], used, memory_order_relaxed);
}

/* ---- host pool classes ---------------------------------------------------- */

static _Atomic uint64_t host_cls[SH_TM_MAX_CLASSES][3];
static atomic_int host_n;

void sh_tm_host_class(int index, uint64_t class_bytes, uint64_t in_use, uint64_t total)
{
    if (index < 0 || index >= SH_TM_MAX_CLASSES)
        return;
    atomic_store_explicit(&host_cls[index][0], class_bytes, memory_order_relaxed);
    atomic_store_explicit(&host_cls[index][1], in_use, memory_order_relaxed);
    atomic_store_explicit(&host_cls[index][2], total, memory_order_relaxed);
}

void sh_tm_host_classes(int n)
{
    atomic_store_explicit(&host_n,
                          n < 0                   ? 0
                          : n > SH_TM_MAX_CLASSES ? SH_TM_MAX_CLASSES
                                                  : n,
                          memory_order_relaxed);
}

void sh_tm_host_snapshot(struct sh_tm_host *out, uint32_t *n)
{
    int k = atomic_load_explicit(&host_n, memory_order_relaxed);
    for (int i = 0; i < k; i++) {
        out[i].class_bytes = atomic_load_explicit(&host_cls[i][0], memory_order_relaxed);
        out[i].in_use = atomic_load_explicit(&host_cls[i][1], memory_order_relaxed);
        out[i].total = atomic_load_explicit(&host_cls[i][2], memory_order_relaxed);
    }
    *n = (uint32_t)k;
}

/* ---- clock, phases, hints --------------------------------------------------- */

uint64_t sh_tm_now_us(void)
{
    return sh_clock_us();
}

static _Atomic uint64_t phase_t0; /* when the current phase began; 0 before the first */

void sh_tm_phase(int phase)
{
    if (phase < STAGEHAND_PHASE_STEP_BEGIN || phase > STAGEHAND_PHASE_STEP_END)
        return;
    uint64_t now = sh_tm_now_us();
    uint64_t t0 = atomic_exchange_explicit(&phase_t0, now, memory_order_relaxed);
    int64_t old = atomic_exchange_explicit(&gauges[SH_TM_G_phase], phase, memory_order_relaxed);
    if (t0 && now > t0 && old >= STAGEHAND_PHASE_STEP_BEGIN && old <= STAGEHAND_PHASE_STEP_END)
        sh_tm_add((enum sh_tm_counter)(SH_TM_C_phase_step_begin_us + old), now - t0);
    if (old != phase || !t0)
        sh_tm_event(SH_TM_EV_PHASE, (uint64_t)phase, 0);
}

_Static_assert(SH_TM_C_phase_step_end_us - SH_TM_C_phase_step_begin_us ==
                   STAGEHAND_PHASE_STEP_END - STAGEHAND_PHASE_STEP_BEGIN,
               "one phase counter per phase, in phase order");

void sh_tm_hints(int prefetch_window, int max_inflight_h2d, int max_inflight_d2h,
                 int suppress_speculative, uint32_t rules_fired)
{
    int64_t pw = sh_tm_get(SH_TM_G_prefetch_window), h = sh_tm_get(SH_TM_G_max_inflight_h2d);
    int64_t d = sh_tm_get(SH_TM_G_max_inflight_d2h), s = sh_tm_get(SH_TM_G_suppress_speculative);
    int tighter = prefetch_window < pw || max_inflight_h2d < h || max_inflight_d2h < d ||
                  (suppress_speculative && !s);
    sh_tm_set(SH_TM_G_prefetch_window, prefetch_window);
    sh_tm_set(SH_TM_G_max_inflight_h2d, max_inflight_h2d);
    sh_tm_set(SH_TM_G_max_inflight_d2h, max_inflight_d2h);
    sh_tm_set(SH_TM_G_suppress_speculative, suppress_speculative != 0);
    sh_tm_set(SH_TM_G_rules_fired, rules_fired);
    if (tighter) {
        sh_tm_inc(SH_TM_C_hint_changes);
        sh_tm_event(SH_TM_EV_HINT, rules_fired,
                    (uint64_t)(prefetch_window < 0 ? 0 : prefetch_window));
    }
}

/* ---- the event ring -------------------------------------------------------- */

/* Entry states in seq: 2 * (index + 1) once entry `index` is complete,
 * odd while one writer owns the slot. A writer takes the slot with a CAS, so
 * two writers a ring apart never mix their fields; one that finds the slot
 * busy drops its event (the ring lapped a stalled writer: rare, harmless). */
struct ev_slot {
    _Atomic uint64_t seq;
    _Atomic uint64_t t_us, kind, id, bytes;
};

static struct ev_slot ev_ring[SH_TM_EVENT_RING];
static _Atomic uint64_t ev_head;

_Static_assert((SH_TM_EVENT_RING & (SH_TM_EVENT_RING - 1)) == 0, "ring size is a power of two");

static int ev_claim(struct ev_slot *s)
{
    uint64_t old = atomic_load_explicit(&s->seq, memory_order_relaxed);
    while (!(old & 1))
        if (atomic_compare_exchange_weak_explicit(&s->seq, &old, old | 1, memory_order_acq_rel,
                                                  memory_order_relaxed))
            return 1;
    return 0;
}

void sh_tm_event(int kind, uint64_t id, uint64_t bytes)
{
    uint64_t i = atomic_fetch_add_explicit(&ev_head, 1, memory_order_relaxed);
    struct ev_slot *s = &ev_ring[i & (SH_TM_EVENT_RING - 1)];
    if (!ev_claim(s))
        return;
    /* Release stores: a reader that sees a new field also sees seq odd. */
    atomic_store_explicit(&s->t_us, sh_tm_now_us(), memory_order_release);
    atomic_store_explicit(&s->kind, (uint64_t)kind, memory_order_release);
    atomic_store_explicit(&s->id, id, memory_order_release);
    atomic_store_explicit(&s->bytes, bytes, memory_order_release);
    atomic_store_explicit(&s->seq, 2 * (i + 1), memory_order_release);
}

/* Entry i if it is complete and was not overwritten while we copied it. */
static int ev_get(uint64_t i, struct sh_tm_ev *out)
{
    const struct ev_slot *s = &ev_ring[i & (SH_TM_EVENT_RING - 1)];
    uint64_t s1 = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (s1 != 2 * (i + 1))
        return 0;
    out->t_us = atomic_load_explicit(&s->t_us, memory_order_acquire);
    out->kind = (uint32_t)atomic_load_explicit(&s->kind, memory_order_acquire);
    out->id = atomic_load_explicit(&s->id, memory_order_acquire);
    out->bytes = atomic_load_explicit(&s->bytes, memory_order_acquire);
    out->pad_ = 0;
    return atomic_load_explicit(&s->seq, memory_order_relaxed) == s1;
}

int sh_tm_events_copy(struct sh_tm_ev *out, int max, uint64_t *total)
{
    uint64_t head = atomic_load_explicit(&ev_head, memory_order_acquire);
    uint64_t span = (uint64_t)max < SH_TM_EVENT_RING ? (uint64_t)max : SH_TM_EVENT_RING;
    uint64_t start = head > span ? head - span : 0;
    int n = 0;
    for (uint64_t i = start; i < head && n < max; i++)
        n += ev_get(i, &out[n]);
    *total = head;
    return n;
}

/* ---- a step's worth of figures ------------------------------------------------ */

void sh_tm_capture(struct sh_tm_steprec *r)
{
    r->t_us = sh_tm_now_us();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->unix_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    sh_tm_counters(r->c);
    sh_tm_gauges(r->g);
    uint32_t n = 0;
    sh_tm_host_snapshot(r->classes, &n);
    r->n_classes = (int)n;
}
