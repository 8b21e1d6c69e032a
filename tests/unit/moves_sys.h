/* moves_sys.h — the system under test of the moves that overlap compute
 * (test_prefetch.c, test_ptrscan.c): pool_sys.h's pool, host pool, copy
 * engine and gate, over copy streams whose device-to-host copies run at
 * once and whose host-to-device copies stay queued until the test
 * completes them (complete_copies), so that a test can act while a
 * prefetch is "in flight"; tracked drains faked by stream mask.
 */
#ifndef SH_TEST_MOVES_SYS_H
#define SH_TEST_MOVES_SYS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "clean/clean.h"
#include "pool/pool.h"
#include "sh_err.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_vmm.h"

/* ---- fake copy streams: D2H at once, H2D queued until completed ---------------- */

struct pending {
    uintptr_t dst, src;
    size_t n;
    uint64_t token;
};

static struct pending queued[MAXC];
static int nqueued;
static uint64_t completed; /* tokens up to this one are done */
static long copy_calls, fail_copy_at;
static int fail_wait;
static unsigned wait_sleep_us; /* what waiting for queued copies takes: their transfer */

/* Runs the queued H2D copies, in order; fk.mu held. */
static inline void run_queued(void)
{
    for (int i = 0; i < nqueued; i++) {
        memcpy((void *)queued[i].dst, (const void *)queued[i].src, queued[i].n);
        completed = queued[i].token;
    }
    nqueued = 0;
}

static inline void complete_copies(void)
{
    pthread_mutex_lock(&fk.mu);
    run_queued();
    pthread_mutex_unlock(&fk.mu);
}

static inline int c_copy(void *ctx, int dir, uintptr_t dst, uintptr_t src, size_t n,
                         uint64_t *token)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    if (fail_copy_at && ++copy_calls == fail_copy_at) {
        pthread_mutex_unlock(&fk.mu);
        return SH_EDRIVER;
    }
    fk.copies[dir]++;
    fk.copy_bytes[dir] += n;
    *token = ++fk.next_token;
    if (dir == SH_D2H || nqueued == MAXC) {
        run_queued(); /* in order: what was queued before lands first */
        memcpy((void *)dst, (const void *)src, n);
        completed = *token;
    } else {
        queued[nqueued++] = (struct pending){dst, src, n, *token};
    }
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static inline int c_done(void *ctx, uint64_t token)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    int done = token <= completed;
    pthread_mutex_unlock(&fk.mu);
    return done;
}

static inline int c_wait(void *ctx, uint64_t token)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    int ran = token > completed;
    if (ran)
        run_queued();
    pthread_mutex_unlock(&fk.mu);
    if (ran && wait_sleep_us)
        usleep(wait_sleep_us);
    return fail_wait ? SH_EDRIVER : 0;
}

static inline void c_forget(void *ctx, uint64_t token)
{
    (void)ctx;
    (void)token;
}

static inline int c_drain(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    run_queued();
    fk.drains++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static const struct sh_copy_ops copy_ops = {NULL, c_copy, c_done, c_wait, c_forget, c_drain};

/* ---- the system under test ---------------------------------------------------------- */

/* drain_mode = tracked, faked: the streams whose bits are set in busy_mask
 * still run work; a drain of them finishes it. */
static uint64_t busy_mask, drained_mask;

static inline int t_drain(void *ctx, uint64_t mask)
{
    (void)ctx;
    drained_mask |= mask;
    busy_mask &= ~mask;
    return 0;
}

static inline int t_idle(void *ctx, uint64_t mask)
{
    (void)ctx;
    return (mask & busy_mask) == 0;
}

/* A stream capture, faked: while capture_on, the mover hears one. */
static int capture_on;

static inline int t_capturing(void)
{
    return capture_on;
}

#include "pool_sys.h"

static inline void start(const struct opts *o)
{
    nqueued = 0;
    completed = 0;
    copy_calls = fail_copy_at = 0;
    fail_wait = 0;
    wait_sleep_us = 0;
    busy_mask = drained_mask = 0;
    capture_on = 0;
    sys_start(o, &copy_ops);
}

static inline int teardown(void **state)
{
    (void)state;
    fail_copy_at = 0;
    fail_wait = 0;
    sys_teardown();
    return 0;
}

static inline size_t start_prefetch(uintptr_t va)
{
    uintptr_t out[1];
    size_t n = 0;
    sh_pool_prefetch_start(sys.pool, &va, 1, out, &n);
    return n;
}

static inline size_t commit(int all)
{
    uintptr_t out[16];
    size_t n = 0;
    sh_pool_prefetch_commit(sys.pool, all, out, 16, &n);
    return n;
}

static const struct opts std_opts = {.device_cache = 4 * M, .slabs = {8, 8, 8}};

#define RSIZE (CH + 2 * G) /* two chunks: 256K + 128K */

static inline size_t start_early(uintptr_t va)
{
    uintptr_t out[1];
    size_t n = 0;
    sh_pool_evict_start(sys.pool, &va, 1, out, &n);
    return n;
}

/* Commits early evictions; *back gets how many stayed resident. */
static inline size_t commit_early(int all, size_t *back)
{
    uintptr_t out[16], kept[16];
    size_t n = 0, nback = 0, released = 0;
    sh_pool_evict_commit(sys.pool, all, out, kept, 16, &n, &nback, &released);
    if (back)
        *back = nback;
    return n;
}

static inline uint64_t lost_writes(void)
{
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    return st.lost_writes;
}

#endif
