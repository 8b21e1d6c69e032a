/* timing.c — launch durations for the trace, measured on the GPU.
 *
 * Two timing events per launch on the legacy default stream: one recorded
 * just before the launch is issued, and the next launch's first (recorded
 * as its preparation starts, before any remap window). The time between
 * them on the GPU is the launch's run time, plus any time the GPU waited
 * for the program to issue the next one (host work the simulator then
 * counts as part of the launch). Remap windows fall outside every launch:
 * stagehand-sim models them itself. Only while a trace is recorded: an
 * event on the legacy stream orders it against the program's blocking
 * streams. A launch still pending at exit keeps no duration. The
 * scheduler (sched.c), above this file, writes what is measured.
 *
 * Locking: timing_mu guards the ring; the event calls made under it never
 * block. The launch number waiting for its start event is per thread.
 */
#include "interpose/interpose.h"

#include "policy/trace.h"

#include <pthread.h>

#define TIMINGS 1024

struct timing {
    uint64_t seq;
    CUevent start, end;
};

static pthread_mutex_t timing_mu = PTHREAD_MUTEX_INITIALIZER;
static struct timing ring[TIMINGS];
static unsigned ring_head, ring_count;
static CUresult (*event_elapsed)(float *, CUevent, CUevent);
static int timing_on;
static void (*write_durations)(const uint64_t *seqs, const uint64_t *us, size_t n);
static _Thread_local uint64_t last_seq = UINT64_MAX; /* this thread's last launch in the trace */

void sh_timing_init(void (*write)(const uint64_t *seqs, const uint64_t *us, size_t n))
{
    write_durations = write;
    CUdriverProcAddressQueryResult q;
    if (sh_rt.drv.cuGetProcAddress("cuEventElapsedTime", (void **)&event_elapsed, SH_DRIVER_ABI, 0,
                                   &q) != CUDA_SUCCESS)
        event_elapsed = NULL;
    timing_on = event_elapsed != NULL;
}

void sh_timing_launch(uint64_t seq)
{
    last_seq = seq;
}

static CUevent timing_event(void)
{
    CUevent ev = NULL;
    if (sh_rt.drv.cuEventCreate(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return NULL;
    if (sh_rt.drv.cuEventRecord(ev, NULL) != CUDA_SUCCESS) {
        sh_rt.drv.cuEventDestroy(ev);
        return NULL;
    }
    return ev;
}

static void drop_timing(const struct timing *t)
{
    if (t->start)
        sh_rt.drv.cuEventDestroy(t->start);
    if (t->end)
        sh_rt.drv.cuEventDestroy(t->end);
}

/* Takes the measured launches off the ring, oldest first; timing_mu held. */
static size_t timings_done(struct timing *out, uint64_t *us, size_t max)
{
    size_t n = 0;
    while (ring_count > 0 && n < max) {
        struct timing *t = &ring[ring_head];
        float ms = 0;
        if (!t->end || sh_rt.drv.cuEventQuery(t->end) != CUDA_SUCCESS)
            break;
        us[n] = event_elapsed(&ms, t->start, t->end) == CUDA_SUCCESS && ms >= 0
                    ? (uint64_t)((double)ms * 1000.0 + 0.5)
                    : SH_TRACE_NO_DUR;
        out[n++] = *t;
        ring_head = (ring_head + 1) % TIMINGS;
        ring_count--;
    }
    return n;
}

void sh_timing_begin(void)
{
    if (!timing_on)
        return;
    CUevent ev = timing_event();
    struct timing done[64];
    uint64_t us[64];
    pthread_mutex_lock(&timing_mu);
    struct timing *last = ring_count ? &ring[(ring_head + ring_count - 1) % TIMINGS] : NULL;
    if (last && !last->end) {
        last->end = ev;
        ev = NULL;
    }
    size_t n = timings_done(done, us, 64);
    pthread_mutex_unlock(&timing_mu);
    if (ev)
        sh_rt.drv.cuEventDestroy(ev);
    uint64_t seqs[64];
    for (size_t i = 0; i < n; i++)
        seqs[i] = done[i].seq;
    write_durations(seqs, us, n);
    for (size_t i = 0; i < n; i++)
        drop_timing(&done[i]);
}

void sh_timing_issue(void)
{
    if (!timing_on || last_seq == UINT64_MAX)
        return;
    struct timing t = {.seq = last_seq, .start = timing_event()}, old = {0};
    last_seq = UINT64_MAX;
    if (!t.start)
        return;
    pthread_mutex_lock(&timing_mu);
    if (ring_count == TIMINGS) { /* never measured: that launch keeps no duration */
        old = ring[ring_head];
        ring_head = (ring_head + 1) % TIMINGS;
        ring_count--;
    }
    ring[(ring_head + ring_count) % TIMINGS] = t;
    ring_count++;
    pthread_mutex_unlock(&timing_mu);
    drop_timing(&old);
}
