/* gate.c — the remap gate: a writer-preferring reader-writer lock whose
 * read side nests per thread.
 *
 * Every launch takes the read side, so it costs two atomic operations
 * while no window is open or waiting: a reader counts itself in, then
 * checks that no writer has come; a writer raises its flag, then waits for
 * the readers to drain. Both sequentially consistent, so a reader and a
 * writer that race always see each other: either the writer counts the
 * reader (and waits for it to leave) or the reader sees the flag (and
 * backs out). Whoever must wait does it under mu, on cv.
 *
 * Work that may touch several devices' memory takes their gates' read
 * sides as one set, always in the callers' one order (device order): a
 * reader waits only for gates after those it holds, and a writer holds no
 * read side (sh_gate_lock refuses), so no wait closes a cycle.
 *
 * Locking: readers and writer are atomics; mu guards the waits (a reader
 * that drains the gate under a waiting writer wakes it under mu, so the
 * wake-up is never lost). The thread's depth and the set its outermost
 * enter took are thread-local.
 */
#include "transfer/transfer.h"

#include "sh_clock.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct sh_gate {
    atomic_uint readers; /* threads holding the read side */
    atomic_int writer;   /* a window is open, or waits for the readers */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the readers drained, or a window closed */
    uint64_t windows;
    uint64_t opened_ns; /* of the open window: only its writer touches it */
    uint64_t open_ns;   /* the windows' time open, in all */
    unsigned waiting;   /* readers blocked on the read side now */
};

static _Thread_local struct {
    struct sh_gate *gates[SH_GATE_SET_MAX]; /* the set held, in the order taken */
    unsigned n, depth;
} held;

int sh_gate_create(struct sh_gate **out)
{
    struct sh_gate *g = calloc(1, sizeof *g);
    if (!g)
        return SH_ENOMEM;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return 0;
}

void sh_gate_destroy(struct sh_gate *g)
{
    if (!g)
        return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Counts a reader out; the last one out under a waiting writer wakes it. */
static void read_release(struct sh_gate *g)
{
    if (atomic_fetch_sub(&g->readers, 1) == 1 && atomic_load(&g->writer)) {
        pthread_mutex_lock(&g->mu);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
}

/* 1 if the read side was taken: no writer before the count, nor after.
 * Inline: it is most of a launch's cost here. */
static inline __attribute__((always_inline)) int read_try(struct sh_gate *g)
{
    if (atomic_load(&g->writer))
        return 0;
    atomic_fetch_add(&g->readers, 1);
    if (!atomic_load(&g->writer))
        return 1;
    read_release(g); /* a window came meanwhile: it goes first */
    return 0;
}

/* Waits out the windows, then takes the read side. */
static void read_wait(struct sh_gate *g)
{
    __atomic_add_fetch(&g->waiting, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (atomic_load(&g->writer))
            pthread_cond_wait(&g->cv, &g->mu);
        atomic_fetch_add(&g->readers, 1);
        if (!atomic_load(&g->writer))
            break;
        /* read_release() without mu: held here */
        if (atomic_fetch_sub(&g->readers, 1) == 1)
            pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    __atomic_sub_fetch(&g->waiting, 1, __ATOMIC_RELAXED);
}

void sh_gate_enter_set(struct sh_gate *const *gates, unsigned n)
{
    __typeof__(held) *h = &held;
    if (h->depth++ > 0)
        return;
    h->n = n < SH_GATE_SET_MAX ? n : SH_GATE_SET_MAX;
    for (unsigned i = 0; i < h->n; i++) {
        struct sh_gate *g = h->gates[i] = gates[i];
        if (!read_try(g))
            read_wait(g);
    }
}

void sh_gate_leave_set(void)
{
    __typeof__(held) *h = &held;
    if (h->depth > 0 && --h->depth == 0) {
        while (h->n > 0)
            read_release(h->gates[--h->n]);
    }
}

/* One gate: the set's path without its loop (every launch of a process
 * with one device comes here). */
void sh_gate_enter(struct sh_gate *g)
{
    __typeof__(held) *h = &held;
    if (h->depth++ > 0)
        return;
    h->n = 1;
    h->gates[0] = g;
    if (!read_try(g))
        read_wait(g);
}

void sh_gate_leave(struct sh_gate *g)
{
    __typeof__(held) *h = &held;
    if (h->depth > 0 && --h->depth == 0) {
        h->n = 0;
        read_release(g); /* the one the outermost enter took */
    }
}

int sh_gate_held(const struct sh_gate *g)
{
    const __typeof__(held) *h = &held;
    for (unsigned i = 0; h->depth > 0 && i < h->n; i++)
        if (h->gates[i] == g)
            return 1;
    return 0;
}

int sh_gate_held_any(void)
{
    return held.depth > 0;
}

int sh_gate_lock(struct sh_gate *g)
{
    if (sh_gate_held_any())
        return SH_EBUSY;
    pthread_mutex_lock(&g->mu);
    while (atomic_load(&g->writer)) /* another window */
        pthread_cond_wait(&g->cv, &g->mu);
    atomic_store(&g->writer, 1); /* no new reader from here */
    while (atomic_load(&g->readers) != 0)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    __atomic_add_fetch(&g->windows, 1, __ATOMIC_RELAXED);
    g->opened_ns = sh_clock_ns();
    return 0;
}

void sh_gate_unlock(struct sh_gate *g)
{
    __atomic_add_fetch(&g->open_ns, sh_clock_ns() - g->opened_ns, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g->mu);
    atomic_store(&g->writer, 0);
    pthread_cond_broadcast(&g->cv); /* the readers waiting, and the next window */
    pthread_mutex_unlock(&g->mu);
}

uint64_t sh_gate_windows(const struct sh_gate *g)
{
    return __atomic_load_n(&g->windows, __ATOMIC_RELAXED);
}

uint64_t sh_gate_open_us(const struct sh_gate *g)
{
    return __atomic_load_n(&g->open_ns, __ATOMIC_RELAXED) / 1000u;
}

unsigned sh_gate_waiting(const struct sh_gate *g)
{
    return __atomic_load_n(&g->waiting, __ATOMIC_RELAXED);
}
