/* test_prefetch.c — prefetch: restores whose copy overlaps compute and whose
 * commit comes later, in a remap window. The real pool, host slab pool,
 * copy engine and gate run over the fake VMM of test_evict.c (handles are
 * real memory), with copy streams whose host-to-device copies stay queued
 * until the test completes them by hand, so a test can act while a copy is
 * "in flight": write the slab through the region's host mapping, free the
 * region, evict others, fail a copy (moves_sys.h). Early evictions, the
 * move verifier and failures too; pointer tables are test_ptrscan.c's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

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

#include "moves_sys.h"

/* Prefetch then commit: exact bytes, device-mapped, slabs back. */
static void test_prefetch_commit_exact(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    fill(a, RSIZE, 1);
    fill(b, RSIZE, 2);
    issue(a); /* work before the eviction was drained by it: no redo */
    evict_one(a);
    evict_one(b);
    assert_int_equal(start_prefetch(a), 1);
    assert_int_equal(state_of(a), SH_RS_RESTORING);
    /* Still host-mapped and intact while the copy is in flight. */
    assert_int_equal(bad_words(a, RSIZE, 1), 0);
    size_t inflight = 0;
    assert_int_equal(sh_pool_prefetch_ready(sys.pool, &inflight), 0);
    assert_int_equal(inflight, 1);
    assert_int_equal(commit(0), 0); /* nothing finished yet */
    /* b's copies pass the engine's cap of two: a's are finalised to make room. */
    assert_int_equal(start_prefetch(b), 1);
    assert_int_equal(sh_pool_prefetch_ready(sys.pool, &inflight), 1);
    assert_int_equal(inflight, 2);
    complete_copies();
    assert_int_equal(sh_pool_prefetch_ready(sys.pool, NULL), 2);
    assert_int_equal(commit(0), 2);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(state_of(b), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 1), 0);
    assert_int_equal(bad_words(b, RSIZE, 2), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetches, 2);
    assert_int_equal(st.prefetch_commits, 2);
    assert_int_equal(st.prefetch_redos, 0);
    assert_int_equal(st.host_bytes, 0);
    /* The region is on device handles now: a new eviction round-trips. */
    evict_one(a);
    assert_int_equal(bad_words(a, RSIZE, 1), 0);
    stop();
}

/* A window that issues more copies than may be in flight (two a
 * direction here) waits for the oldest first: that wait is the window's
 * copy wait too, beside the one for its last copies. Restoring two
 * regions of two chunks in one window waits twice, once for a slot and
 * once at the end, each for a transfer of 20 ms. */
static void test_slot_waits_are_copy_waits(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t v[2] = {alloc(RSIZE), alloc(RSIZE)};
    fill(v[0], RSIZE, 1);
    fill(v[1], RSIZE, 2);
    evict_one(v[0]);
    evict_one(v[1]);
    wait_sleep_us = 20000;
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    uint64_t before = st.copy_wait_ns, h2d = fk.copies[SH_H2D];
    assert_int_equal(sh_pool_restore(sys.pool, v, 2), 0);
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(fk.copies[SH_H2D] - h2d, 4);
    assert_true(st.copy_wait_ns - before >= 2 * 20000 * 1000ull);
    assert_int_equal(bad_words(v[0], RSIZE, 1), 0);
    assert_int_equal(bad_words(v[1], RSIZE, 2), 0);
    stop();
}

/* A launch writes the slab through the host mapping while the copy is in
 * flight: the commit redoes the copy in the window; the new bytes win. */
static void test_prefetch_redo_after_launch(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 1);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    complete_copies(); /* the copy read the old bytes */
    issue(a);          /* a launch used the region meanwhile ... */
    fill(a, RSIZE, 7); /* ... and wrote it over the host mapping */
    assert_int_equal(commit(0), 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 7), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_redos, 1);
    stop();
}

/* The same, with the copy still queued when commit(all) opens the window. */
static void test_prefetch_redo_in_flight(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 1);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    issue(a);
    fill(a, RSIZE, 9);
    assert_int_equal(commit(1), 1);
    assert_int_equal(bad_words(a, RSIZE, 9), 0);
    stop();
}

/* A launch prepared (touched) before the eviction but issued after it runs
 * on the slab: what counts is when work is issued, not when it was seen. */
static void test_prefetch_redo_issued_late(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 1);
    size_t host = 0;
    sh_pool_touch(sys.pool, &a, 1, &host); /* prepared while resident ... */
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    complete_copies();
    issue(a); /* ... issued once it was on the host, and it wrote the slab */
    fill(a, RSIZE, 5);
    assert_int_equal(commit(0), 1);
    assert_int_equal(bad_words(a, RSIZE, 5), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_redos, 1);
    stop();
}

/* A launch issued while the region was on the host (one a partial restore
 * left there, say) still runs when the plan made right after it starts the
 * region's prefetch: the copy reads the slab before the kernel writes it.
 * The launch's issue stamp is later than the eviction, whenever the
 * prefetch started: the commit redoes the copy, and the kernel's bytes
 * win. */
static void test_prefetch_redo_issued_before_start(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 1);
    evict_one(a);
    issue(a); /* the launch runs on the host mapping ... */
    assert_int_equal(start_prefetch(a), 1);
    complete_copies(); /* the copy read the old bytes */
    fill(a, RSIZE, 6); /* ... and writes the slab after it */
    assert_int_equal(commit(0), 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_redos, 1);
    stop();
}

/* Freeing a region whose prefetch is in flight cancels it (no deadlock,
 * no leak: stop() checks every handle and mapping is gone). */
static void test_free_during_prefetch(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    fill(b, RSIZE, 3);
    evict_one(a);
    evict_one(b);
    assert_int_equal(start_prefetch(a), 1);
    assert_int_equal(start_prefetch(b), 1);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    size_t inflight = 0;
    sh_pool_prefetch_ready(sys.pool, &inflight);
    assert_int_equal(inflight, 1);
    complete_copies();
    assert_int_equal(commit(0), 1);
    assert_int_equal(bad_words(b, RSIZE, 3), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_cancels, 1);
    assert_int_equal(sh_pool_free(sys.pool, b, ANY, 0), 0);
    stop();
}

/* Memory the program maps itself (adopt.c): unmapped while its prefetch
 * is in flight, the prefetch is called off and the backing keeps the bytes,
 * on its slabs, to be mapped at another address of the program's. Released
 * while mapped, it lives until its unmap. */
static void test_backing_unmap_during_prefetch(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t va = 0, va2 = 0;
    assert_int_equal(vmm.reserve(vmm.ctx, RSIZE, 0, &va), 0); /* the program's own VA */
    assert_int_equal(vmm.reserve(vmm.ctx, RSIZE, 0, &va2), 0);
    struct sh_backing *b = NULL;
    assert_int_equal(sh_pool_backing_create(sys.pool, RSIZE + 1, &b), SH_EINVAL);
    assert_int_equal(sh_pool_backing_create(sys.pool, RSIZE, &b), 0);
    assert_int_equal(sh_pool_backing_map(sys.pool, b, va), 0);
    assert_int_equal(sh_pool_backing_map(sys.pool, b, va2), SH_EBUSY);  /* one address */
    assert_int_equal(sh_pool_free(sys.pool, va, ANY, 0), SH_ENOTFOUND); /* not cudaFree's */
    fill(va, RSIZE, 7);
    evict_one(va);
    assert_int_equal(start_prefetch(va), 1);
    assert_int_equal(sh_pool_backing_unmap(sys.pool, va), 0);
    assert_int_equal(state_of(va), -1);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_cancels, 1);
    assert_int_equal(st.host_bytes, RSIZE); /* still on its slabs */
    assert_int_equal(sh_pool_backing_map(sys.pool, b, va2), 0);
    assert_int_equal(state_of(va2), SH_RS_HOST);
    assert_int_equal(bad_words(va2, RSIZE, 7), 0);
    /* Back on the device, then the last reference goes while mapped. */
    assert_int_equal(sh_pool_restore(sys.pool, &va2, 1), 0);
    assert_int_equal(bad_words(va2, RSIZE, 7), 0);
    assert_int_equal(sh_pool_backing_release(sys.pool, b), 1);
    assert_int_equal(bad_words(va2, RSIZE, 7), 0); /* still mapped, still there */
    assert_int_equal(sh_pool_backing_unmap(sys.pool, va2), 0);
    assert_int_equal(sh_pool_backing_unmap(sys.pool, va2), SH_ENOTFOUND);
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.live_bytes, 0);
    assert_int_equal(st.host_bytes, 0);
    assert_int_equal(vmm.unreserve(vmm.ctx, va, RSIZE), 0);
    assert_int_equal(vmm.unreserve(vmm.ctx, va2, RSIZE), 0);
    stop();
}

/* Two backings the program maps side by side in one reservation, as
 * PyTorch's expandable segments do (at[0], at[1]); filled with 1 and 2. */
static void map_pair(uintptr_t *va, struct sh_backing **b, uintptr_t at[2])
{
    assert_int_equal(vmm.reserve(vmm.ctx, 2 * RSIZE, 0, va), 0);
    for (int i = 0; i < 2; i++) {
        at[i] = *va + (uintptr_t)i * RSIZE;
        assert_int_equal(sh_pool_backing_create(sys.pool, RSIZE, &b[i]), 0);
        assert_int_equal(sh_pool_backing_map(sys.pool, b[i], at[i]), 0);
        fill(at[i], RSIZE, (uint32_t)i + 1);
    }
}

static void unmap_pair(uintptr_t va, struct sh_backing **b, const uintptr_t at[2])
{
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sh_pool_backing_release(sys.pool, b[i]), 1);
        assert_int_equal(sh_pool_backing_unmap(sys.pool, at[i]), 0);
    }
    assert_int_equal(vmm.unreserve(vmm.ctx, va, 2 * RSIZE), 0);
}

/* A tensor spanning two of the program's mappings: the kernel's pointer
 * lands in the first, and it writes the second, on the host, while that
 * one's prefetch is in flight. The commit redoes the copy. */
static void test_prefetch_redo_spanned(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t va, at[2];
    struct sh_backing *b[2];
    map_pair(&va, b, at);
    evict_one(at[1]);
    assert_int_equal(start_prefetch(at[1]), 1);
    complete_copies();
    issue(at[0]);          /* the launch names the first ... */
    fill(at[1], RSIZE, 7); /* ... and writes past its end */
    assert_int_equal(commit(0), 1);
    assert_int_equal(bad_words(at[1], RSIZE, 7), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_redos, 1);
    unmap_pair(va, b, at);
    stop();
}

/* The pool's own regions are whole allocations: work on one does not
 * redo the prefetch of the next, wherever it lies. */
static void test_prefetch_not_spanned(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), c = alloc(RSIZE);
    fill(c, RSIZE, 3);
    evict_one(c);
    assert_int_equal(start_prefetch(c), 1);
    complete_copies();
    issue(a);
    assert_int_equal(commit(0), 1);
    assert_int_equal(bad_words(c, RSIZE, 3), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_redos, 0);
    stop();
}

/* With a tracked drain, the streams of work on a neighbour count for the
 * program's mappings: the second waits for a launch that named the first. */
static void test_early_eviction_tracked_spanned(void **state)
{
    (void)state;
    const struct opts o = {.device_cache = 4 * M,
                           .slabs = {8, 8, 8},
                           .drain_streams = t_drain,
                           .streams_idle = t_idle};
    start(&o);
    uintptr_t va, at[2];
    struct sh_backing *b[2];
    map_pair(&va, b, at);
    sh_pool_issued(sys.pool, &at[0], 1, 1u << 3); /* a launch on stream slot 3 */
    busy_mask = 1u << 3;
    assert_int_equal(start_early(at[1]), 0);
    busy_mask = 0;
    assert_int_equal(start_early(at[1]), 1);
    assert_int_equal(commit_early(0, NULL), 1);
    assert_int_equal(state_of(at[1]), SH_RS_HOST);
    assert_int_equal(bad_words(at[1], RSIZE, 2), 0);
    assert_true(drained_mask & 1u << 3);
    unmap_pair(va, b, at);
    stop();
}

/* Teardown with a prefetch in flight leaves nothing mapped. */
static void test_destroy_during_prefetch(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    stop();
}

/* ---- early eviction: the D2H copy ahead, the remap later ---- */

/* A region with work issued since the last drain cannot start: that work
 * may still be writing it. After a window drained the device, it can; the
 * commit puts it on its slabs with every byte. */
static void test_early_eviction_exact(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    fill(a, RSIZE, 4);
    issue(a);
    assert_int_equal(start_early(a), 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    evict_one(b); /* a window: drains everything issued so far */
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    uint64_t fp_ns = st.fingerprint_ns;
    assert_int_equal(st.fingerprint_start_ns, 0);
    assert_int_equal(start_early(a), 1);
    assert_int_equal(state_of(a), SH_RS_EVICTING);
    /* its start fingerprints, taken at once (none is queued here): counted
     * apart too, as time in no window */
    sh_pool_stats(sys.pool, &st);
    assert_true(st.fingerprint_start_ns > 0);
    assert_true(st.fingerprint_start_ns <= st.fingerprint_ns - fp_ns);
    assert_int_equal(bad_words(a, RSIZE, 4), 0); /* still on the device, readable */
    size_t inflight = 0;
    assert_int_equal(sh_pool_evict_ready(sys.pool, &inflight), 1);
    assert_int_equal(inflight, 1);
    size_t back = 9;
    assert_int_equal(commit_early(0, &back), 1);
    assert_int_equal(back, 0);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(bad_words(a, RSIZE, 4), 0);
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.early_evictions, 1);
    assert_int_equal(st.early_commits, 1);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.host_bytes, 2 * RSIZE);
    stop();
}

/* Under the whole-device drain an early eviction the planner wants now need
 * not wait for the next window: sh_pool_evict_drain drains the device (the
 * copies on the link with it) when one of the regions named was used since
 * the last drain, and then it starts. It drains for nothing else: a region
 * idle already, one on the host, or under the tracked drain. */
static void test_early_eviction_drains_to_start(void **state)
{
    (void)state;
    const struct opts captures = {
        .device_cache = 4 * M, .slabs = {8, 8, 8}, .capturing = t_capturing};
    start(&captures);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE), c = alloc(RSIZE);
    fill(a, RSIZE, 5);
    fill(b, RSIZE, 6);
    evict_one(c); /* a window: a, b and c idle */
    uint64_t drains = fk.drains;
    assert_int_equal(sh_pool_evict_drain(sys.pool, &b, 1), 0); /* idle: nothing to wait for */
    assert_int_equal(sh_pool_evict_drain(sys.pool, &c, 1), 0); /* on the host */
    assert_int_equal(fk.drains, drains);
    assert_int_equal(start_prefetch(c), 1); /* a copy on the link */
    issue(a);
    assert_int_equal(start_early(a), 0); /* that work may still be writing it */
    uintptr_t both[2] = {b, a};
    capture_on = 1;
    assert_int_equal(sh_pool_evict_drain(sys.pool, both, 2), 0); /* a capture */
    assert_int_equal(fk.drains, drains);
    capture_on = 0;
    assert_int_equal(sh_pool_evict_drain(sys.pool, both, 2), 1);
    assert_int_equal(fk.drains, drains + 1);
    assert_int_equal(sh_pool_prefetch_ready(sys.pool, NULL), 1); /* waited for with it */
    assert_int_equal(start_early(a), 1);
    assert_int_equal(commit_early(0, NULL), 1);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(bad_words(a, RSIZE, 5), 0);
    assert_int_equal(commit(0), 1);
    assert_int_equal(bad_words(b, RSIZE, 6), 0);
    stop();
    const struct opts o = {.device_cache = 4 * M,
                           .slabs = {8, 8, 8},
                           .drain_streams = t_drain,
                           .streams_idle = t_idle};
    start(&o);
    a = alloc(RSIZE);
    sh_pool_issued(sys.pool, &a, 1, 1u << 2);
    busy_mask = 1u << 2;
    drains = fk.drains;
    assert_int_equal(sh_pool_evict_drain(sys.pool, &a, 1), 0); /* tracked: the streams decide */
    assert_int_equal(fk.drains, drains);
    assert_int_equal(start_early(a), 0);
    stop();
}

/* A write that no work named (through a pointer the scan never saw) under
 * an early eviction's copy: the window's fingerprint differs from the
 * start's, so the region stays on the device with the write, the pool
 * counts an unseen write, and no prefetch starts from then on (a prefetch
 * could not be compared as cheaply). Before the fingerprints the commit put
 * the region on slabs holding the bytes from before the write. */
static void test_early_eviction_unseen_write(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    evict_one(b);
    fill(a, RSIZE, 5);
    assert_int_equal(start_early(a), 1);
    fill(a, RSIZE, 6); /* no issue(): the library saw nothing */
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 0);
    assert_int_equal(back, 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.unseen_writes, 1);
    assert_int_equal(st.early_commits, 0);
    assert_int_equal(start_prefetch(b), 0);
    assert_int_equal(state_of(b), SH_RS_HOST);
    /* An unchanged region still goes early, compared. */
    assert_int_equal(start_early(a), 1);
    assert_int_equal(commit_early(1, &back), 1);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    stop();
}

/* Without a fingerprint a lost write could not be told: no early eviction
 * starts (the region waits for pressure, whose window copies). */
static void test_early_eviction_needs_fingerprint(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    evict_one(b);
    fill(a, RSIZE, 3);
    fpk.fail = 1;
    assert_int_equal(start_early(a), 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    fpk.fail = 0;
    int calls = fpk.calls;
    assert_int_equal(start_early(a), 0); /* off for good: not even tried */
    assert_int_equal(fpk.calls, calls);
    evict_one(a);
    assert_int_equal(bad_words(a, RSIZE, 3), 0);
    stop();

    /* A fingerprint that fails in the window proves nothing: the region
     * stays, and no unseen write is counted. */
    start(&std_opts);
    a = alloc(RSIZE);
    b = alloc(RSIZE);
    evict_one(b);
    fill(a, RSIZE, 3);
    assert_int_equal(start_early(a), 1);
    fpk.fail = 1;
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 0);
    fpk.fail = 0;
    assert_int_equal(back, 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(pstats().unseen_writes, 0);
    assert_int_equal(bad_words(a, RSIZE, 3), 0);
    stop();
}

/* With a mover that queues fingerprints on the copy stream, an early
 * eviction's start waits for none: its fingerprints are taken in its
 * window, where a write no work named is caught as before. Every ticket is
 * taken once, whatever becomes of the eviction (stop() checks): committed,
 * left resident, freed, torn down. A queue that fails falls back to waiting,
 * and a take that fails proves nothing: the region stays. */
static void test_early_eviction_queued_fingerprint(void **state)
{
    (void)state;
    const struct opts q = {.device_cache = 4 * M, .slabs = {8, 8, 8}, .queue_fp = 1};
    start(&q);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE), c = alloc(RSIZE);
    evict_one(b);
    fill(a, RSIZE, 5);
    int calls = fpk.calls;
    assert_int_equal(start_early(a), 1);
    assert_int_equal(fpk.queued, 1);
    assert_int_equal(fpk.calls, calls); /* nothing waited for */
    assert_int_equal(pstats().fingerprint_start_ns, 0);
    fill(a, RSIZE, 6); /* unseen */
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 0);
    assert_int_equal(back, 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    assert_int_equal(pstats().unseen_writes, 1);
    assert_int_equal(fpk.outstanding, 0);
    /* unchanged: committed */
    fill(c, RSIZE, 7);
    assert_int_equal(start_early(c), 1);
    assert_int_equal(commit_early(1, &back), 1);
    assert_int_equal(state_of(c), SH_RS_HOST);
    assert_int_equal(bad_words(c, RSIZE, 7), 0);
    /* used meanwhile: stays, ticket given up */
    assert_int_equal(start_early(a), 1);
    issue(a);
    assert_int_equal(commit_early(1, &back), 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(fpk.outstanding, 0);
    /* freed meanwhile, and one left in flight at teardown */
    assert_int_equal(start_early(a), 1);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    assert_int_equal(fpk.outstanding, 0);
    uintptr_t d = alloc(RSIZE);
    assert_int_equal(start_early(d), 1);
    assert_int_equal(fpk.outstanding, 1);
    stop();

    start(&q);
    a = alloc(RSIZE);
    b = alloc(RSIZE);
    evict_one(b);
    fill(a, RSIZE, 3);
    fpk.fail_queue = 1; /* waited for instead */
    calls = fpk.calls;
    assert_int_equal(start_early(a), 1);
    assert_int_equal(fpk.calls, calls + 1);
    assert_int_equal(commit_early(1, &back), 1);
    assert_int_equal(bad_words(a, RSIZE, 3), 0);
    fpk.fail_queue = 0;
    assert_int_equal(sh_pool_restore(sys.pool, &a, 1), 0);
    assert_int_equal(start_early(a), 1);
    fpk.fail_take = 1; /* nothing proved: stays */
    assert_int_equal(commit_early(1, &back), 0);
    fpk.fail_take = 0;
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(pstats().unseen_writes, 0);
    assert_int_equal(bad_words(a, RSIZE, 3), 0);
    stop();
}

/* No remap window opens while a stream captures: its drain would break
 * the capture. The mover is asked once the gate is closed, when no capture
 * can begin, so a capture begun after the caller last looked (the engine
 * asks before it makes room, a launch before it restores) is seen too.
 * Evictions, restores and commits answer SH_EBUSY and leave every region
 * where it was, with its bytes; once the capture ends they go through. */
static void test_no_window_while_capturing(void **state)
{
    (void)state;
    const struct opts o = {.device_cache = 4 * M, .slabs = {8, 8, 8}, .capturing = t_capturing};
    start(&o);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE), c = alloc(RSIZE), e = alloc(RSIZE);
    fill(a, RSIZE, 1);
    fill(b, RSIZE, 2);
    fill(c, RSIZE, 3);
    fill(e, RSIZE, 4);
    evict_one(b);
    evict_one(c);
    assert_int_equal(start_prefetch(c), 1); /* no window: it may start */
    assert_int_equal(start_early(e), 1);
    complete_copies();
    long drains = fk.drains, maps = fk.map_calls;
    capture_on = 1;
    size_t released = 1, ne = 1, back = 0;
    uintptr_t out[1];
    assert_int_equal(sh_pool_evict_these(sys.pool, &a, 1, &released, out, &ne), SH_EBUSY);
    assert_int_equal(released, 0);
    assert_int_equal(ne, 0);
    assert_int_equal(sh_pool_restore(sys.pool, &b, 1), SH_EBUSY);
    assert_int_equal(commit(1), 0);
    assert_int_equal(commit_early(1, &back), 0);
    assert_int_equal(back, 1);
    issue(a);
    assert_int_equal(sh_pool_evict_drain(sys.pool, &a, 1), 0);
    assert_int_equal(fk.drains, drains);
    assert_int_equal(fk.map_calls, maps);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(state_of(b), SH_RS_HOST);
    assert_int_equal(state_of(c), SH_RS_HOST);     /* its prefetch given up */
    assert_int_equal(state_of(e), SH_RS_RESIDENT); /* its early eviction given up */
    capture_on = 0;
    evict_one(a);
    assert_int_equal(sh_pool_restore(sys.pool, &b, 1), 0);
    assert_int_equal(state_of(b), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 1), 0);
    assert_int_equal(bad_words(b, RSIZE, 2), 0);
    assert_int_equal(bad_words(c, RSIZE, 3), 0);
    assert_int_equal(bad_words(e, RSIZE, 4), 0);
    stop();
}

/* Work issued against a region while its copy ran may have changed it
 * under the copy: the commit leaves it resident, with the new bytes. */
static void test_early_eviction_abandoned(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    evict_one(b);
    fill(a, RSIZE, 5);
    assert_int_equal(start_early(a), 1);
    issue(a);
    fill(a, RSIZE, 6);
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 0);
    assert_int_equal(back, 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.early_abandons, 1);
    /* It can go again once drained, and then it does. */
    evict_one(alloc(RSIZE));
    assert_int_equal(start_early(a), 1);
    assert_int_equal(commit_early(1, NULL), 1);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    stop();
}

/* With a tracked drain nothing drains the whole device: a region can start
 * once the streams that used it are idle, and not before. */
static void test_early_eviction_tracked(void **state)
{
    (void)state;
    const struct opts o = {.device_cache = 4 * M,
                           .slabs = {8, 8, 8},
                           .drain_streams = t_drain,
                           .streams_idle = t_idle};
    start(&o);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 8);
    sh_pool_issued(sys.pool, &a, 1, 1u << 3); /* a launch on stream slot 3 */
    busy_mask = 1u << 3;
    assert_int_equal(start_early(a), 0);
    busy_mask = 0; /* that launch finished */
    assert_int_equal(start_early(a), 1);
    assert_int_equal(commit_early(0, NULL), 1);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(bad_words(a, RSIZE, 8), 0);
    assert_true(drained_mask & 1u << 3); /* the window waited for that stream */
    stop();
}

/* Freeing a region, or tearing the pool down, with its early eviction in
 * flight cancels it: nothing leaks, nothing stays mapped (stop checks). */
static void test_free_during_early_eviction(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE), c = alloc(RSIZE);
    evict_one(c);
    assert_int_equal(start_early(a), 1);
    assert_int_equal(start_early(b), 1);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    size_t inflight = 0;
    sh_pool_evict_ready(sys.pool, &inflight);
    assert_int_equal(inflight, 1);
    stop(); /* b is still in flight */
}

/* Eviction never takes a region being prefetched, named alone or beside
 * another. */
static void test_evict_skips_prefetching(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    fill(a, RSIZE, 1);
    fill(b, RSIZE, 2);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    size_t released = 0, n = 0;
    uintptr_t out[1];
    assert_int_equal(sh_pool_evict_these(sys.pool, &a, 1, &released, out, &n), SH_EBUSY);
    assert_int_equal(n, 0);
    uintptr_t both[2] = {a, b}, out2[2];
    assert_int_equal(sh_pool_evict_these(sys.pool, both, 2, &released, out2, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(out2[0], b);
    assert_int_equal(state_of(a), SH_RS_RESTORING);
    assert_int_equal(state_of(b), SH_RS_HOST);
    assert_int_equal(commit(1), 1);
    assert_int_equal(bad_words(a, RSIZE, 1), 0);
    assert_int_equal(bad_words(b, RSIZE, 2), 0);
    stop();
}

/* A failed map (at scratch, or at the region address in the window) and
 * a failed copy leave the region HOST with its bytes. */
static void check_host_and_exact(uintptr_t a, uint32_t seed)
{
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(bad_words(a, RSIZE, seed), 0);
}

static void test_fail_scratch_map(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 4);
    evict_one(a);
    fk.fail_map_at = fk.map_calls + 2; /* the second chunk at scratch */
    assert_int_equal(start_prefetch(a), 0);
    fk.fail_map_at = 0;
    check_host_and_exact(a, 4);
    assert_int_equal(start_prefetch(a), 1); /* and it can go again */
    assert_int_equal(commit(1), 1);
    assert_int_equal(bad_words(a, RSIZE, 4), 0);
    stop();
}

static void test_fail_window_map(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 5);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    complete_copies();
    fk.fail_map_at = fk.map_calls + 2; /* the second chunk at the region address */
    assert_int_equal(commit(0), 0);
    fk.fail_map_at = 0;
    check_host_and_exact(a, 5);
    stop();
}

static void test_fail_copy_issue(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 6);
    evict_one(a);
    fail_copy_at = 2; /* the second chunk's copy */
    assert_int_equal(start_prefetch(a), 0);
    fail_copy_at = 0;
    check_host_and_exact(a, 6);
    stop();
}

/* A copy whose wait fails is redone in the window from the slab. */
static void test_fail_copy_wait(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 8);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    fail_wait = 1;
    assert_int_equal(commit(1), 0); /* the redo's flush fails too: stays HOST */
    fail_wait = 0;
    check_host_and_exact(a, 8);
    assert_int_equal(start_prefetch(a), 1);
    assert_int_equal(commit(1), 1);
    assert_int_equal(bad_words(a, RSIZE, 8), 0);
    stop();
}

/* A committed prefetch whose copy address cannot be unmapped: its memory
 * stays on the device, so the handle is not released while mapped there
 * (it stays counted), and goes once the address can be unmapped. */
static void test_stranded_scratch(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 10);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    complete_copies();
    /* The window unmaps both slabs; then the first scratch chunk fails (3 tries). */
    fk.fail_unmap_at = fk.unmap_calls + 3;
    fk.fail_unmap_n = 3;
    int mappings = fk.nm; /* slabs and scratch at a's addresses, staging */
    assert_int_equal(commit(1), 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, RSIZE, 10), 0);
    assert_int_equal(fk.nm, mappings - 1); /* the scratch chunk that stays */
    /* Freed and trimmed while the address still cannot be unmapped. */
    fk.fail_unmap_at = fk.unmap_calls + 3; /* after the two at a */
    fk.fail_unmap_n = 3;
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    sh_pool_trim(sys.pool, 64 * M);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.device_bytes, CH);
    assert_int_equal(fk.live[SH_LOC_DEVICE], 1);
    assert_int_equal(fk.bad, 0);
    fk.fail_unmap_at = 0;
    sh_pool_trim(sys.pool, 64 * M);
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(fk.live[SH_LOC_DEVICE], 0);
    stop();
}

/* Pinning a region whose early eviction is in flight calls the eviction
 * off; a prefetching one goes back to the host (restore it, then pin).
 * Pinned, a region is never picked again. */
static void test_pin_settles_moves(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    fill(a, RSIZE, 11);
    fill(b, RSIZE, 12);
    assert_int_equal(start_early(a), 1);
    assert_int_equal(sh_pool_pin(sys.pool, a + 7), 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    evict_one(b);
    assert_int_equal(start_prefetch(b), 1);
    assert_int_equal(sh_pool_pin(sys.pool, b), SH_EBUSY);
    assert_int_equal(state_of(b), SH_RS_HOST);
    assert_int_equal(sh_pool_restore(sys.pool, &b, 1), 0);
    assert_int_equal(sh_pool_pin(sys.pool, b), 0);
    size_t released = 0, n = 0;
    uintptr_t vas[2] = {a, b}, out[2];
    assert_int_equal(sh_pool_evict_these(sys.pool, vas, 2, &released, out, &n), SH_EBUSY);
    assert_int_equal(n, 0);
    assert_int_equal(start_early(a), 0);
    assert_int_equal(bad_words(a, RSIZE, 11), 0);
    assert_int_equal(bad_words(b, RSIZE, 12), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.pinned, 2);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.pinned, 1);
    stop();
}

/* Two threads: one completes copies and commits, one evicts, prefetches
 * and frees. */
static void *committer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++) {
        complete_copies();
        commit(i & 1);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t v[6];
    for (int i = 0; i < 6; i++) {
        v[i] = alloc(RSIZE);
        fill(v[i], RSIZE, (uint32_t)(10 + i));
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, committer, NULL), 0);
    for (int round = 0; round < 100; round++) {
        int i = round % 6;
        size_t released = 0, n = 0;
        uintptr_t out[1];
        sh_pool_evict_these(sys.pool, &v[i], 1, &released, out, &n);
        start_prefetch(v[i]);
        if (round % 7 == 0) {
            assert_int_equal(sh_pool_free(sys.pool, v[i], ANY, 0), 0);
            v[i] = alloc(RSIZE);
            fill(v[i], RSIZE, (uint32_t)(10 + i));
        }
    }
    pthread_join(t, NULL);
    complete_copies();
    commit(1);
    for (int i = 0; i < 6; i++)
        assert_int_equal(bad_words(v[i], RSIZE, (uint32_t)(10 + i)), 0);
    stop();
}

/* ---- the move verifier and opaque work ---- */

/* Runs fn with stderr going to buf (NUL-terminated). */
static void with_stderr(void (*fn)(void), char *buf, size_t len)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, len - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
}

static size_t n_committed;
static void commit_pf(void)
{
    n_committed = commit(0);
}
static void commit_ev(void)
{
    n_committed = commit_early(1, NULL);
}

/* A launch writes the slab under a prefetch's copy. With the redo rule the
 * verifier finds both sides equal; with the rule planted away the commit
 * loses the write, and the verifier says so, naming the region and move. */
static void prefetch_write_under_copy(int plant, char *buf, size_t len)
{
    const struct opts o = {
        .device_cache = 4 * M, .slabs = {8, 8, 8}, .verify_moves = 1, .plant_lost_write = plant};
    start(&o);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 1);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    complete_copies();
    issue(a);
    fill(a, RSIZE, 7);
    with_stderr(commit_pf, buf, len);
    assert_int_equal(n_committed, 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
}

static void test_verifier_prefetch(void **state)
{
    (void)state;
    char buf[4096];
    prefetch_write_under_copy(0, buf, sizeof buf);
    assert_string_equal(buf, "");
    assert_int_equal(lost_writes(), 0);
    stop();

    prefetch_write_under_copy(1, buf, sizeof buf);
    assert_int_equal(lost_writes(), 2); /* both chunks were rewritten */
    assert_non_null(strstr(buf, "LOST WRITE: prefetch of region"));
    assert_non_null(strstr(buf, "+262144")); /* the second chunk */
    uintptr_t a = 0;
    assert_int_equal(sscanf(strstr(buf, "(0x"), "(0x%" SCNxPTR, &a), 1);
    assert_true(bad_words(a, RSIZE, 7) > 0); /* the loss it reported is real */
    stop();
}

/* The same for an early eviction: a write to the device chunks under the
 * copy is dropped with the eviction; planted away, it is lost and reported. */
static void early_write_under_copy(int plant, uintptr_t *a, char *buf, size_t len)
{
    const struct opts o = {
        .device_cache = 4 * M, .slabs = {8, 8, 8}, .verify_moves = 1, .plant_lost_write = plant};
    start(&o);
    *a = alloc(RSIZE);
    evict_one(alloc(RSIZE));
    fill(*a, RSIZE, 5);
    assert_int_equal(start_early(*a), 1);
    issue(*a);
    fill(*a, RSIZE, 6);
    with_stderr(commit_ev, buf, len);
}

static void test_verifier_early_eviction(void **state)
{
    (void)state;
    char buf[4096];
    uintptr_t a;
    early_write_under_copy(0, &a, buf, sizeof buf);
    assert_int_equal(n_committed, 0);
    assert_string_equal(buf, "");
    assert_int_equal(lost_writes(), 0);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    stop();

    early_write_under_copy(1, &a, buf, sizeof buf);
    assert_int_equal(n_committed, 1);
    assert_int_equal(lost_writes(), 2);
    assert_non_null(strstr(buf, "LOST WRITE: early eviction of region"));
    assert_true(bad_words(a, RSIZE, 6) > 0);
    stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_prefetch_commit_exact, teardown),
        cmocka_unit_test_teardown(test_slot_waits_are_copy_waits, teardown),
        cmocka_unit_test_teardown(test_prefetch_redo_after_launch, teardown),
        cmocka_unit_test_teardown(test_prefetch_redo_in_flight, teardown),
        cmocka_unit_test_teardown(test_prefetch_redo_issued_late, teardown),
        cmocka_unit_test_teardown(test_prefetch_redo_issued_before_start, teardown),
        cmocka_unit_test_teardown(test_early_eviction_exact, teardown),
        cmocka_unit_test_teardown(test_early_eviction_drains_to_start, teardown),
        cmocka_unit_test_teardown(test_no_window_while_capturing, teardown),
        cmocka_unit_test_teardown(test_early_eviction_abandoned, teardown),
        cmocka_unit_test_teardown(test_early_eviction_unseen_write, teardown),
        cmocka_unit_test_teardown(test_early_eviction_needs_fingerprint, teardown),
        cmocka_unit_test_teardown(test_early_eviction_queued_fingerprint, teardown),
        cmocka_unit_test_teardown(test_early_eviction_tracked, teardown),
        cmocka_unit_test_teardown(test_free_during_early_eviction, teardown),
        cmocka_unit_test_teardown(test_free_during_prefetch, teardown),
        cmocka_unit_test_teardown(test_backing_unmap_during_prefetch, teardown),
        cmocka_unit_test_teardown(test_prefetch_redo_spanned, teardown),
        cmocka_unit_test_teardown(test_prefetch_not_spanned, teardown),
        cmocka_unit_test_teardown(test_early_eviction_tracked_spanned, teardown),
        cmocka_unit_test_teardown(test_destroy_during_prefetch, teardown),
        cmocka_unit_test_teardown(test_evict_skips_prefetching, teardown),
        cmocka_unit_test_teardown(test_fail_scratch_map, teardown),
        cmocka_unit_test_teardown(test_fail_window_map, teardown),
        cmocka_unit_test_teardown(test_fail_copy_issue, teardown),
        cmocka_unit_test_teardown(test_fail_copy_wait, teardown),
        cmocka_unit_test_teardown(test_stranded_scratch, teardown),
        cmocka_unit_test_teardown(test_pin_settles_moves, teardown),
        cmocka_unit_test_teardown(test_threads, teardown),
        cmocka_unit_test_teardown(test_verifier_prefetch, teardown),
        cmocka_unit_test_teardown(test_verifier_early_eviction, teardown),
    };
    return cmocka_run_group_tests_name("prefetch", tests, NULL, NULL);
}
