/* test_keep.c — clean regions in the pool: host copies kept at restore and
 * prefetch commit, evictions that find them unchanged copying nothing, a
 * change anywhere (down to the last byte of one chunk) copied, only the
 * chunks that changed; copies given up first when slabs run short, and at
 * a free or a pin; what a fingerprint failure leaves; early evictions of
 * kept regions; and the learning that stops keeping copies of regions
 * dirty at every eviction. Over the fake VMM of fake_vmm.h (real memory)
 * with synchronous copies and the fingerprint on the CPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_vmm.h"

/* ---- fake copy streams: synchronous memcpy ---- */

static int c_copy(void *ctx, int dir, uintptr_t dst, uintptr_t src, size_t n, uint64_t *token)
{
    (void)ctx;
    memcpy((void *)dst, (const void *)src, n);
    pthread_mutex_lock(&fk.mu);
    fk.copies[dir]++;
    fk.copy_bytes[dir] += n;
    *token = ++fk.next_token;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static int c_done(void *ctx, uint64_t token)
{
    (void)ctx;
    (void)token;
    return 1;
}

static int c_wait(void *ctx, uint64_t token)
{
    (void)ctx;
    (void)token;
    return 0;
}

static void c_forget(void *ctx, uint64_t token)
{
    (void)ctx;
    (void)token;
}

static int c_drain(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    fk.drains++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static const struct sh_copy_ops copy_ops = {NULL, c_copy, c_done, c_wait, c_forget, c_drain};

#include "pool_sys.h"

static void sys_start_ops(const struct opts *o)
{
    sys_start(o, &copy_ops);
}

static int teardown(void **state)
{
    (void)state;
    sys_teardown();
    return 0;
}

static void restore_one(uintptr_t va)
{
    assert_int_equal(sh_pool_restore(sys.pool, &va, 1), 0);
    assert_int_equal(state_of(va), SH_RS_RESIDENT);
}

static size_t d2h(void)
{
    return fk.copy_bytes[SH_D2H];
}

#define RSIZE (CH + 2 * G) /* two chunks: 256K + 128K */

static const struct opts clean_opts = {.clean = 1, .device_cache = 4 * M, .slabs = {8, 8, 8}};

/* Evicted, restored (a copy kept), evicted again unchanged: no byte copied,
 * the bytes exact. */
static void test_clean_eviction_copies_nothing(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 1);
    evict_one(a);
    assert_int_equal(d2h(), RSIZE);
    assert_int_equal(pstats().kept_bytes, 0);
    uint8_t kept = 9;
    sh_pool_kept_of(sys.pool, &a, 1, &kept);
    assert_int_equal(kept, 0);
    restore_one(a);
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.kept_bytes, RSIZE);
    assert_int_equal(st.fingerprints, 2); /* one per chunk, at the restore */
    uintptr_t asked[] = {a, a + RSIZE / 2, 4096};
    uint8_t got[3] = {9, 9, 9};
    sh_pool_kept_of(sys.pool, asked, 3, got); /* interior pointers too */
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], 1);
    assert_int_equal(got[2], 0);
    evict_one(a);
    st = pstats();
    assert_int_equal(d2h(), RSIZE); /* nothing more */
    assert_int_equal(st.evicted_bytes, RSIZE);
    assert_int_equal(st.clean_evictions, 1);
    assert_int_equal(st.clean_bytes, RSIZE);
    assert_int_equal(st.kept_bytes, 0); /* the copy is the eviction's now */
    sh_pool_kept_of(sys.pool, &a, 1, &kept);
    assert_int_equal(kept, 0);
    assert_int_equal(bad_words(a, RSIZE, 1), 0);
    restore_one(a);
    assert_int_equal(bad_words(a, RSIZE, 1), 0);
    stop();
}

/* With clean_skip off, nothing is kept and every eviction copies. */
static void test_without_clean_skip(void **state)
{
    (void)state;
    const struct opts o = {.device_cache = 4 * M, .slabs = {8, 8, 8}};
    sys_start_ops(&o);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 2);
    evict_one(a);
    restore_one(a);
    assert_int_equal(pstats().kept_bytes, 0);
    evict_one(a);
    assert_int_equal(d2h(), 2 * RSIZE);
    assert_int_equal(fpk.calls, 0);
    stop();
}

/* The last byte of the region changed: its chunk is copied, the other not. */
static void test_last_byte_dirty(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 3);
    evict_one(a);
    restore_one(a);
    ((volatile unsigned char *)a)[RSIZE - 1] ^= 0x5a;
    evict_one(a);
    struct sh_pool_stats st = pstats();
    assert_int_equal(d2h(), RSIZE + 2 * G); /* only the 128K chunk */
    assert_int_equal(st.dirty_evictions, 1);
    assert_int_equal(st.clean_evictions, 0);
    assert_int_equal(st.clean_bytes, CH);
    assert_int_equal(st.unseen_writes, 1); /* no work named it since the restore */
    restore_one(a);
    ((volatile unsigned char *)a)[RSIZE - 1] ^= 0x5a;
    assert_int_equal(bad_words(a, RSIZE, 3), 0);
    stop();
}

/* The same change made by work the library saw is no unseen write. */
static void test_seen_write_is_no_unseen_write(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 3);
    evict_one(a);
    restore_one(a);
    issue(a);
    ((volatile unsigned char *)a)[RSIZE - 1] ^= 0x5a;
    evict_one(a);
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.dirty_evictions, 1);
    assert_int_equal(st.unseen_writes, 0);
    stop();
}

/* Copies held are the first host memory to go: an eviction that needs
 * slabs when none is free takes a kept copy's, oldest first. */
static void test_copies_given_up_first(void **state)
{
    (void)state;
    const struct opts o = {.clean = 1, .device_cache = 4 * M, .slabs = {0, 0, 2}};
    sys_start_ops(&o); /* two 256K slabs in all */
    uintptr_t a = alloc(CH), b = alloc(CH);
    fill(a, CH, 4);
    fill(b, CH, 5);
    evict_one(a);
    restore_one(a); /* a keeps one slab */
    evict_one(b);   /* b takes the other */
    restore_one(b); /* b keeps it */
    assert_int_equal(pstats().kept_bytes, 2 * CH);
    uintptr_t c = alloc(CH);
    fill(c, CH, 6);
    evict_one(c); /* no free slab: a's copy, the oldest, goes */
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.kept_dropped, 1);
    assert_int_equal(st.kept_bytes, CH);
    uintptr_t ab[] = {a, b};
    uint8_t kept[2] = {9, 9};
    sh_pool_kept_of(sys.pool, ab, 2, kept);
    assert_int_equal(kept[0], 0);
    assert_int_equal(kept[1], 1);
    evict_one(b); /* still kept: clean */
    assert_int_equal(pstats().clean_evictions, 1);
    restore_one(c);
    assert_int_equal(bad_words(c, CH, 6), 0);
    restore_one(b);
    assert_int_equal(bad_words(b, CH, 5), 0);
    evict_one(a); /* its copy is gone: copied as usual */
    restore_one(a);
    assert_int_equal(bad_words(a, CH, 4), 0);
    stop();
}

/* A free gives the copy back at once, and the next region at that address
 * keeps nothing of it. */
static void test_free_and_pin_drop_copies(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    fill(a, RSIZE, 7);
    evict_one(a);
    restore_one(a);
    assert_int_equal(pstats().kept_bytes, RSIZE);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    assert_int_equal(pstats().kept_bytes, 0);
    uintptr_t a2 = alloc(RSIZE); /* the freed region, reused */
    assert_true(a2 == a);
    fill(a2, RSIZE, 8);
    evict_one(a2);
    assert_int_equal(pstats().clean_evictions, 0);
    restore_one(a2);
    assert_int_equal(bad_words(a2, RSIZE, 8), 0);
    evict_one(b);
    restore_one(b);
    assert_int_equal(pstats().kept_bytes, 2 * RSIZE);
    assert_int_equal(sh_pool_pin(sys.pool, b), 0); /* never moves again */
    assert_int_equal(pstats().kept_bytes, RSIZE);
    stop();
}

/* A fingerprint that cannot be taken keeps nothing at the restore, and
 * at the eviction makes it copy everything. */
static void test_fingerprint_failure_copies(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE);
    fill(a, RSIZE, 9);
    fill(b, RSIZE, 10);
    evict_one(a);
    evict_one(b);
    fpk.fail = 1;
    restore_one(a);
    assert_int_equal(pstats().kept_bytes, 0);
    fpk.fail = 0;
    restore_one(b);
    assert_int_equal(pstats().kept_bytes, RSIZE);
    fpk.fail = 1;
    size_t before = d2h();
    evict_one(b);
    assert_int_equal(d2h() - before, RSIZE);
    assert_int_equal(pstats().clean_evictions, 0);
    fpk.fail = 0;
    restore_one(b);
    assert_int_equal(bad_words(b, RSIZE, 10), 0);
    assert_int_equal(bad_words(a, RSIZE, 9), 0);
    stop();
}

/* ---- early eviction ---- */

/* A window fingerprints all of its regions in one call to the device (a
 * round trip each would hold the window open that much longer): the
 * restore that keeps their copies, and the eviction that compares them,
 * which still tells each region's chunks apart. */
static void test_one_fingerprint_call_per_window(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t v[3], out[3];
    for (int i = 0; i < 3; i++) {
        v[i] = alloc(RSIZE);
        fill(v[i], RSIZE, i + 1);
    }
    size_t released = 0, n = 0;
    assert_int_equal(sh_pool_evict_these(sys.pool, v, 3, &released, out, &n), 0);
    assert_int_equal(n, 3);
    int calls = fpk.calls;
    assert_int_equal(sh_pool_restore(sys.pool, v, 3), 0);
    assert_int_equal(fpk.calls, calls + 1);
    assert_int_equal(pstats().kept_bytes, 3 * RSIZE);
    issue(v[1]);
    ((uint8_t *)v[1])[RSIZE - 1] ^= 0xff; /* its last chunk changes */
    size_t before = d2h();
    calls = fpk.calls;
    assert_int_equal(sh_pool_evict_these(sys.pool, v, 3, &released, out, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(fpk.calls, calls + 1);
    assert_int_equal(d2h() - before, 2 * G); /* that chunk (the 128K one) alone was copied */
    for (int i = 0; i < 3; i++) {
        restore_one(v[i]);
        assert_int_equal(bad_words(v[i], RSIZE, (uint32_t)i + 1), i == 1); /* the changed word */
    }
}

static size_t start_early(uintptr_t va)
{
    uintptr_t out[1];
    size_t n = 0;
    sh_pool_evict_start(sys.pool, &va, 1, out, &n);
    return n;
}

static size_t commit_early(size_t *back)
{
    uintptr_t out[16], kept[16];
    size_t n = 0, nback = 0, released = 0;
    sh_pool_evict_commit(sys.pool, 1, out, kept, 16, &n, &nback, &released);
    *back = nback;
    return n;
}

/* An early eviction of a kept region that still matches queues no copy:
 * its window compares, and copies what changed; one used meanwhile stays,
 * its copy kept. */
static void test_early_eviction_of_kept(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 11);
    evict_one(a);
    restore_one(a); /* a window: the device is drained */
    size_t before = d2h(), back = 0;
    assert_int_equal(start_early(a), 1);
    assert_int_equal(d2h(), before);
    assert_int_equal(commit_early(&back), 1);
    assert_int_equal(d2h(), before); /* clean */
    assert_int_equal(pstats().clean_evictions, 1);
    restore_one(a);
    assert_int_equal(bad_words(a, RSIZE, 11), 0);
    /* Used after its start: it stays resident, still holding its copy. */
    assert_int_equal(start_early(a), 1);
    sh_pool_issued(sys.pool, &a, 1, 0);
    assert_int_equal(commit_early(&back), 0);
    assert_int_equal(back, 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(pstats().kept_bytes, RSIZE);
    /* Written after its start by something no stamp saw: the window finds
     * the chunk changed and copies it there. */
    evict_one(alloc(G)); /* a window drains what was issued */
    assert_int_equal(start_early(a), 1);
    ((volatile uint32_t *)a)[0] ^= 1;
    before = d2h();
    assert_int_equal(commit_early(&back), 1);
    assert_int_equal(d2h() - before, CH);
    assert_int_equal(pstats().dirty_evictions, 1);
    restore_one(a);
    ((volatile uint32_t *)a)[0] ^= 1;
    assert_int_equal(bad_words(a, RSIZE, 11), 0);
    stop();
}

/* Changed before its start: the early eviction sees it, copies ahead as
 * usual (the copy overlaps compute), and its window still compares, so the
 * chunks that did not change keep their kept copies. */
static void test_early_eviction_copies_ahead(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 12);
    evict_one(a);
    restore_one(a);
    ((volatile uint32_t *)a)[RSIZE / 4 - 1] ^= 1; /* the 128K chunk */
    evict_one(alloc(G));
    size_t before = d2h(), back = 0;
    assert_int_equal(start_early(a), 1);
    assert_int_equal(d2h() - before, RSIZE); /* copied ahead, whole */
    struct sh_hostpool_stats hs;
    sh_hostpool_stats(sys.host, &hs);
    unsigned free_256k = hs.class_free[2];
    assert_int_equal(commit_early(&back), 1);
    assert_int_equal(d2h() - before, RSIZE); /* nothing more in the window */
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.dirty_evictions, 1);
    assert_int_equal(st.clean_bytes, 0); /* copied all the same */
    sh_hostpool_stats(sys.host, &hs);
    assert_int_equal(hs.class_free[2], free_256k + 1); /* the spare copy of the clean chunk */
    /* a's two chunks and the small region hold one slab each: the slabs
     * taken for the copy ahead are a's, not taken twice */
    assert_int_equal(slabs_out(), 3);
    restore_one(a);
    ((volatile uint32_t *)a)[RSIZE / 4 - 1] ^= 1;
    assert_int_equal(bad_words(a, RSIZE, 12), 0);
    /* Written and then used: called off; the fresh slabs go, the copy stays. */
    ((volatile uint32_t *)a)[0] ^= 1;
    evict_one(alloc(G));
    assert_int_equal(start_early(a), 1);
    sh_pool_issued(sys.pool, &a, 1, 0);
    assert_int_equal(commit_early(&back), 0);
    assert_int_equal(pstats().kept_bytes, RSIZE);
    ((volatile uint32_t *)a)[0] ^= 1;
    assert_int_equal(bad_words(a, RSIZE, 12), 0);
    stop();
}

/* A kept region that copies ahead is fingerprinted once in its window:
 * the comparison with its kept copy and the one with its start share the
 * call (nothing changes the bytes between them). A write after its start
 * that no stamp saw still keeps it resident, its bytes whole. */
static void test_early_ahead_fingerprinted_once(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    volatile uint32_t *w = (volatile uint32_t *)a;
    fill(a, RSIZE, 13);
    evict_one(a);
    restore_one(a);
    w[RSIZE / 4 - 1] ^= 1; /* changed since its restore, by a launch: it copies ahead */
    issue(a);
    evict_one(alloc(G)); /* a window drains what was issued */
    size_t back = 0;
    assert_int_equal(start_early(a), 1);
    int calls = fpk.calls;
    assert_int_equal(commit_early(&back), 1);
    assert_int_equal(fpk.calls, calls + 1);
    restore_one(a);
    w[RSIZE / 4 - 1] ^= 1;
    assert_int_equal(bad_words(a, RSIZE, 13), 0);
    w[0] ^= 1; /* changed again: ahead again */
    issue(a);
    evict_one(alloc(G));
    assert_int_equal(start_early(a), 1);
    w[RSIZE / 4 - 1] ^= 2; /* after its copy, by nothing the library saw */
    assert_int_equal(commit_early(&back), 0);
    assert_int_equal(back, 1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(pstats().unseen_writes, 1);
    w[0] ^= 1;
    w[RSIZE / 4 - 1] ^= 2;
    assert_int_equal(bad_words(a, RSIZE, 13), 0);
    stop();
}

/* A prefetch's commit keeps the slabs too. */
static void test_prefetch_keeps(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 12);
    evict_one(a);
    uintptr_t out[1];
    size_t n = 0;
    assert_int_equal(sh_pool_prefetch_start(sys.pool, &a, 1, out, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(sh_pool_prefetch_commit(sys.pool, 1, out, 1, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(pstats().kept_bytes, RSIZE);
    size_t before = d2h();
    evict_one(a);
    assert_int_equal(d2h(), before);
    restore_one(a);
    assert_int_equal(bad_words(a, RSIZE, 12), 0);
    stop();
}

/* Dirty at every eviction: after SH_CLEAN_DIRTY_RUN of them the region
 * keeps no copy, and pays no fingerprint, for a while. */
static void test_always_dirty_stops_fingerprinting(void **state)
{
    (void)state;
    sys_start_ops(&clean_opts);
    uintptr_t a = alloc(RSIZE);
    fill(a, RSIZE, 13);
    evict_one(a);
    for (int i = 0; i < 40; i++) {
        restore_one(a);
        ((volatile uint32_t *)a)[i] += 1; /* an optimizer step */
        evict_one(a);
    }
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.clean_evictions, 0);
    /* 40 restores: 3 dirty runs, then pauses of 8 and 16 with a try between. */
    assert_true(st.dirty_evictions >= SH_CLEAN_DIRTY_RUN);
    assert_true(st.dirty_evictions <= SH_CLEAN_DIRTY_RUN + 3);
    assert_true(st.fingerprints <= 4 * (SH_CLEAN_DIRTY_RUN + 3)); /* 2 chunks, 2 ends */
    /* Only the first chunk changed: the second was not copied when compared. */
    assert_int_equal(st.clean_bytes, st.dirty_evictions * 2 * G);
    assert_int_equal(st.evicted_bytes + st.clean_bytes, 41 * RSIZE);
    restore_one(a);
    const uint32_t *p = (const uint32_t *)a;
    for (int i = 0; i < 40; i++)
        assert_int_equal(p[i], word(13, (size_t)i) + 1);
    stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_clean_eviction_copies_nothing, teardown),
        cmocka_unit_test_teardown(test_without_clean_skip, teardown),
        cmocka_unit_test_teardown(test_last_byte_dirty, teardown),
        cmocka_unit_test_teardown(test_seen_write_is_no_unseen_write, teardown),
        cmocka_unit_test_teardown(test_copies_given_up_first, teardown),
        cmocka_unit_test_teardown(test_free_and_pin_drop_copies, teardown),
        cmocka_unit_test_teardown(test_fingerprint_failure_copies, teardown),
        cmocka_unit_test_teardown(test_one_fingerprint_call_per_window, teardown),
        cmocka_unit_test_teardown(test_early_eviction_of_kept, teardown),
        cmocka_unit_test_teardown(test_early_eviction_copies_ahead, teardown),
        cmocka_unit_test_teardown(test_early_ahead_fingerprinted_once, teardown),
        cmocka_unit_test_teardown(test_prefetch_keeps, teardown),
        cmocka_unit_test_teardown(test_always_dirty_stops_fingerprinting, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
