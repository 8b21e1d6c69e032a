/* test_ptrscan.c — pointer tables, found by their bytes: in an upload's
 * source and in an evicted region's landed bytes (read by the pool's
 * scanner thread, or by whoever needs the answer first), at any position;
 * work using a table is opaque, and the moves in flight that it may reach
 * redo their copy or stay (moves_sys.h has the system under test).
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
#include <string.h>

#include "moves_sys.h"

/* A pointer is found wherever it lies: at any 4-byte offset, in the first
 * or last word of a block of the scan, in a partial vector at a block's
 * end or in the tail; values whose high half is in range but that point
 * into no region are not pointers. */
static void test_pointer_found_anywhere(void **state)
{
    (void)state;
    const struct opts o = {.device_cache = 4 * M, .slabs = {8, 8, 8}};
    start(&o);
    uintptr_t a = alloc(RSIZE), t = alloc(G);
    enum { BYTES = 3 * 4096 + 12 };
    static unsigned char buf[BYTES];
    memset(buf, 0, sizeof buf);
    assert_int_equal(sh_pool_find_pointers(sys.pool, buf, sizeof buf, t), 0);
    uintptr_t near = (a & ~(uintptr_t)0xffffffffu) | 0x10; /* high half in range, no region */
    for (size_t off = 0; off + 8 <= sizeof buf; off += 4)
        if (off % 8 == 0)
            memcpy(buf + off, &near, sizeof near);
    assert_true(near < a || near >= a + RSIZE);
    assert_int_equal(sh_pool_find_pointers(sys.pool, buf, sizeof buf, t), 0);
    static const size_t offs[] = {0,    4,    8,    12,   16,   20,   24,         28,
                                  4088, 4092, 4096, 4100, 8184, 8188, BYTES - 12, BYTES - 8};
    uintptr_t inside = a + 8;
    memset(buf, 0, sizeof buf); /* the only candidate is the pointer itself */
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
        unsigned char save[8];
        memcpy(save, buf + offs[k], 8);
        memcpy(buf + offs[k], &inside, sizeof inside);
        if (sh_pool_find_pointers(sys.pool, buf, sizeof buf, t) != 1)
            print_error("a pointer at offset %zu was missed\n", offs[k]);
        assert_int_equal(sh_pool_find_pointers(sys.pool, buf, sizeof buf, t), 1);
        memcpy(buf + offs[k], save, 8);
    }
    stop();
}

/* A region whose bytes (a host-to-device copy's source) hold a pointer into
 * another region is a pointer table: work using it is opaque. A kernel that
 * writes a through the table, while a's prefetch is in flight, makes the
 * commit redo the copy; the verifier finds nothing lost. */
static void test_pointer_table_prefetch(void **state)
{
    (void)state;
    const struct opts o = {.device_cache = 4 * M, .slabs = {8, 8, 8}, .verify_moves = 1};
    start(&o);
    uintptr_t a = alloc(RSIZE), t = alloc(G);
    /* No pointer: not a table. A pointer 4 bytes into a packed record: one. */
    uint32_t host[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(sh_pool_find_pointers(sys.pool, host, sizeof host, t), 0);
    uintptr_t inside = a + 4096;
    memcpy(&host[3], &inside, sizeof inside);
    assert_int_equal(sh_pool_find_pointers(sys.pool, host, sizeof host, t), 1);
    fill(a, RSIZE, 1);
    evict_one(a);
    assert_int_equal(start_prefetch(a), 1);
    complete_copies();
    /* The launch's parameters name only the table: it is opaque ... */
    int ptrs = 0;
    uintptr_t base;
    assert_int_equal(sh_pool_bases_ptrs(sys.pool, &t, 1, &base, &ptrs), 1);
    assert_int_equal(ptrs, 1);
    issue(t);
    sh_pool_issued_opaque(sys.pool, 0);
    fill(a, RSIZE, 3); /* ... and it wrote a through it */
    assert_int_equal(commit(0), 1);
    assert_int_equal(bad_words(a, RSIZE, 3), 0);
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    assert_int_equal(st.prefetch_redos, 1);
    assert_int_equal(st.opaque, 1);
    assert_int_equal(st.lost_writes, 0);
    stop();
}

static int holds_ptrs(uintptr_t va)
{
    int ptrs = 0;
    uintptr_t base;
    assert_int_equal(sh_pool_bases_ptrs(sys.pool, &va, 1, &base, &ptrs), 1);
    return ptrs;
}

/* A table a kernel wrote on the device, where no copy showed it, is known
 * by its bytes once they land on the host: an eviction, a plain one or an
 * early one. A value that only looks like one in its high half (just past
 * the last region) is not a pointer. */
static void test_landed_bytes_mark_pointer_tables(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), t = alloc(RSIZE), u = alloc(RSIZE), e = alloc(RSIZE);
    uintptr_t inside = a + 100, past = e + RSIZE + 64;
    fill(t, RSIZE, 1);
    memcpy((void *)(t + RSIZE - 12), &inside, sizeof inside); /* 4-aligned, last chunk */
    fill(u, RSIZE, 2);
    memcpy((void *)(u + 40), &past, sizeof past);
    fill(e, RSIZE, 3);
    memcpy((void *)(e + CH + 4), &inside, sizeof inside);
    assert_false(holds_ptrs(t)); /* nothing seen yet */
    evict_one(t);
    evict_one(u);
    assert_true(holds_ptrs(t));
    assert_false(holds_ptrs(u));
    assert_int_equal(start_early(e), 1);
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 1);
    assert_true(holds_ptrs(e));
    assert_false(holds_ptrs(a));
    /* Freed and allocated again, a region holds its new owner's bytes. */
    assert_int_equal(sh_pool_free(sys.pool, e, ANY, 0), 0);
    assert_int_equal(alloc(RSIZE), e);
    assert_false(holds_ptrs(e));
    stop();
}

/* The device's prefilter in the eviction window: a region whose bytes
 * hold no word a pointer could start with is never read on the CPU; one
 * that does is scanned as before, plain evictions and early ones alike; a
 * prefilter that fails leaves every region to the CPU. */
static void test_prefilter(void **state)
{
    (void)state;
    struct opts o = std_opts;
    o.prefilter = 1;
    start(&o);
    uintptr_t a = alloc(RSIZE), t = alloc(RSIZE), u = alloc(RSIZE), e = alloc(RSIZE);
    uintptr_t w = alloc(RSIZE), inside = a + 100;
    fill(t, RSIZE, 1);
    memcpy((void *)(t + RSIZE - 12), &inside, sizeof inside);
    fill(u, RSIZE, 2);
    fill(e, RSIZE, 3);
    memcpy((void *)(e + CH + 4), &inside, sizeof inside);
    fill(w, RSIZE, 4);
    evict_one(t);
    evict_one(u);
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.scans_skipped, 1); /* u: nothing to read */
    assert_int_equal(st.prefilters, 4);    /* two chunks each */
    assert_true(holds_ptrs(t));
    assert_false(holds_ptrs(u));
    assert_true(pstats().scanned_bytes <= RSIZE); /* t alone was read */
    assert_int_equal(start_early(e), 1);
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 1);
    assert_true(holds_ptrs(e));
    assert_int_equal(pstats().scans_skipped, 1);
    /* Known tables are not looked at again; a failing prefilter leaves w
     * to the CPU. */
    uint64_t looked = pstats().prefilters;
    assert_int_equal(sh_pool_restore(sys.pool, &t, 1), 0);
    prefilter_fails = 1;
    evict_one(t);
    assert_int_equal(pstats().prefilters, looked);
    evict_one(w);
    assert_false(holds_ptrs(w));
    st = pstats();
    assert_int_equal(st.scans_skipped, 1);
    assert_true(st.scanned_bytes > 2 * RSIZE); /* w read on the CPU after all */
    stop();
}

/* Early evictions committed in one window are fingerprinted in one call
 * and prefiltered in one launch (a round trip to the device each would
 * hold the window that much longer), and each is still judged on its own
 * bytes. */
static void test_prefilter_once_per_window(void **state)
{
    (void)state;
    struct opts o = std_opts;
    o.prefilter = 1;
    start(&o);
    uintptr_t a = alloc(RSIZE), b = alloc(RSIZE), c = alloc(RSIZE), inside = a + 64;
    fill(a, RSIZE, 5);
    fill(b, RSIZE, 6);
    fill(c, RSIZE, 7);
    memcpy((void *)(c + 4), &inside, sizeof inside);
    assert_int_equal(start_early(a), 1);
    assert_int_equal(start_early(b), 1);
    assert_int_equal(start_early(c), 1);
    int calls = prefilter_calls, fingerprints = fpk.calls;
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 3);
    assert_int_equal(back, 0);
    assert_int_equal(prefilter_calls, calls + 1);
    assert_int_equal(fpk.calls, fingerprints + 1);
    assert_int_equal(pstats().scans_skipped, 2); /* a and b: nothing to read */
    assert_true(holds_ptrs(c));
    assert_false(holds_ptrs(a) || holds_ptrs(b));
    stop();
}

/* When that one call fails, no region of the window can be judged: all
 * stay resident with their bytes, none is lost. */
static void test_failed_window_call_keeps_all(void **state)
{
    (void)state;
    struct opts o = std_opts;
    o.prefilter = 1;
    start(&o);
    uintptr_t v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = alloc(RSIZE);
        fill(v[i], RSIZE, (uint32_t)i + 11);
        assert_int_equal(start_early(v[i]), 1);
    }
    fpk.fail = 1;
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 0);
    assert_int_equal(back, 3);
    fpk.fail = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(state_of(v[i]), SH_RS_RESIDENT);
        assert_int_equal(bad_words(v[i], RSIZE, (uint32_t)i + 11), 0);
    }
    assert_int_equal(lost_writes(), 0);
    stop();
}

/* An evicted region's bytes go to the pool's scanner thread, not scanned
 * by the evicting thread; held here, so that each region is needed before
 * its scan. A launch naming it scans it first (its answer is needed); a
 * restore or a prefetch does, before its slabs can go; a free drops the
 * scan, and the scanner, let go, never reads the slabs given back. */
static uintptr_t table_region(uintptr_t into)
{
    uintptr_t t = alloc(RSIZE);
    fill(t, RSIZE, 7);
    memcpy((void *)(t + CH + 8), &into, sizeof into);
    return t;
}

static void test_scan_waits_for_no_eviction(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), t = table_region(a + 8), u = table_region(a);
    sh_pool_scan_pause(sys.pool, 1);
    evict_one(t);
    evict_one(u);
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.scans_queued, 2); /* left to the scanner: the evictions did not scan */
    assert_int_equal(st.scans_settled, 0);
    /* a launch naming t: its answer first */
    assert_true(holds_ptrs(t));
    assert_int_equal(pstats().scans_settled, 1);
    assert_true(holds_ptrs(t)); /* once */
    assert_int_equal(pstats().scans_settled, 1);
    /* a restore of u: scanned before its slabs go back */
    assert_int_equal(sh_pool_restore(sys.pool, &u, 1), 0);
    assert_int_equal(state_of(u), SH_RS_RESIDENT);
    assert_int_equal(pstats().scans_settled, 2);
    assert_true(holds_ptrs(u));
    assert_int_equal(pstats().scans_settled, 2);
    sh_pool_scan_pause(sys.pool, 0);
    stop();
}

/* What a launch's one pass over its parameters (sh_pool_use) finds,
 * with the scans of both its evicted regions still pending: the table's
 * answer exactly (it would make the launch opaque), the plain region's
 * no (it would not), each scanned by the pass itself; a value into the
 * table's middle counts as well. */
static int use_ptrs(uintptr_t va)
{
    uintptr_t vals[1] = {va}, bases[1];
    struct sh_pool_use u = {.bases = bases};
    assert_int_equal(sh_pool_use(sys.pool, vals, 1, 0, &u), 1);
    return u.ptrs;
}

static void test_scan_settled_by_launch(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), t = table_region(a), u = alloc(RSIZE);
    fill(u, RSIZE, 3);
    sh_pool_scan_pause(sys.pool, 1);
    evict_one(t);
    evict_one(u);
    assert_int_equal(pstats().scans_queued, 2);
    assert_int_equal(pstats().scanned_bytes, 0);
    assert_int_equal(use_ptrs(t + 4096), 1);
    assert_int_equal(use_ptrs(u), 0);
    assert_int_equal(pstats().scans_settled, 2);
    /* the launch waited for both scans: what they read, and how long */
    struct sh_pool_stats st = pstats();
    assert_true(st.scanned_bytes > 0 && st.scanned_bytes <= 2 * RSIZE);
    assert_true(st.scan_ns > 0 && st.scan_wait_ns >= st.scan_ns);
    assert_int_equal(use_ptrs(t), 1); /* once: the answer stays */
    assert_int_equal(pstats().scans_settled, 2);
    assert_int_equal(pstats().scanned_bytes, st.scanned_bytes);
    sh_pool_scan_pause(sys.pool, 0);
    stop();
}

/* A table uploaded into one of the program's mappings (side by side in
 * one reservation): a launch naming the next one may read it, through a
 * tensor that spans both; a launch naming a pool region may not. */
static void test_table_in_spanned_neighbour(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), va = 0;
    assert_int_equal(vmm.reserve(vmm.ctx, 2 * RSIZE, 0, &va), 0);
    struct sh_backing *b[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sh_pool_backing_create(sys.pool, RSIZE, &b[i]), 0);
        assert_int_equal(sh_pool_backing_map(sys.pool, b[i], va + (uintptr_t)i * RSIZE), 0);
    }
    assert_int_equal(use_ptrs(va + RSIZE), 0);
    uintptr_t table[4] = {a, a + 64, 0, 0};
    assert_int_equal(sh_pool_find_pointers(sys.pool, table, sizeof table, va), 1);
    assert_int_equal(use_ptrs(va + RSIZE), 1);
    assert_int_equal(use_ptrs(a), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sh_pool_backing_release(sys.pool, b[i]), 1);
        assert_int_equal(sh_pool_backing_unmap(sys.pool, va + (uintptr_t)i * RSIZE), 0);
    }
    assert_int_equal(vmm.unreserve(vmm.ctx, va, 2 * RSIZE), 0);
    stop();
}

static void test_scan_settled_by_prefetch(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), t = table_region(a);
    sh_pool_scan_pause(sys.pool, 1);
    evict_one(t);
    assert_int_equal(start_prefetch(t), 1);
    assert_int_equal(pstats().scans_settled, 1);
    complete_copies();
    assert_int_equal(commit(1), 1);
    assert_true(holds_ptrs(t));
    assert_int_equal(bad_words(t, CH, 7), 0);
    sh_pool_scan_pause(sys.pool, 0);
    stop();
}

static void test_scan_dropped_by_free(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE), t = table_region(a), u = table_region(a);
    sh_pool_scan_pause(sys.pool, 1);
    evict_one(t);
    evict_one(u);
    assert_int_equal(sh_pool_free(sys.pool, t, ANY, 0), 0); /* torn down, slabs back */
    assert_int_equal(pstats().scans_settled, 0);
    /* Let go, the scanner reads u's slabs and never touches t, torn down
     * (ASan would see the freed region on its queue). */
    sh_pool_scan_pause(sys.pool, 0);
    assert_true(holds_ptrs(u));
    /* Allocated again, t's address holds new bytes: nothing carried over. */
    uintptr_t t2 = alloc(RSIZE);
    fill(t2, RSIZE, 9);
    assert_false(holds_ptrs(t2));
    stop();
}

/* The same for an early eviction (it stays resident, with the new bytes),
 * and with a tracked drain: opaque work's stream keeps any early eviction
 * from starting until it is idle, and a window waits for it. */
static void test_pointer_table_early_tracked(void **state)
{
    (void)state;
    const struct opts o = {.device_cache = 4 * M,
                           .slabs = {8, 8, 8},
                           .verify_moves = 1,
                           .drain_streams = t_drain,
                           .streams_idle = t_idle};
    start(&o);
    uintptr_t a = alloc(RSIZE), t = alloc(G);
    uintptr_t table[2] = {a, a + G};
    assert_int_equal(sh_pool_find_pointers(sys.pool, table, sizeof table, t), 1);
    fill(a, RSIZE, 5);
    assert_int_equal(start_early(a), 1);
    sh_pool_issued_opaque(sys.pool, 1u << 4); /* opaque work on stream slot 4 */
    fill(a, RSIZE, 6);
    busy_mask = 1u << 4;
    size_t back = 0;
    assert_int_equal(commit_early(1, &back), 0);
    assert_int_equal(back, 1);
    assert_true(drained_mask & 1u << 4);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    assert_int_equal(lost_writes(), 0);
    /* a was never named, but the opaque work may still be writing it. */
    sh_pool_issued_opaque(sys.pool, 1u << 4);
    busy_mask = 1u << 4;
    assert_int_equal(start_early(a), 0);
    busy_mask = 0;
    assert_int_equal(start_early(a), 1);
    assert_int_equal(commit_early(1, NULL), 1);
    assert_int_equal(bad_words(a, RSIZE, 6), 0);
    stop();
}

/* The scanner under concurrent moves: two threads each evict and restore
 * a table and a plain region of their own, and free and allocate the plain
 * one again now and then, while a third reads the tables' answers; the
 * scanner runs beside them all. A table's answer is yes from its first
 * eviction on, a plain region's never (TSan runs this too). */
struct churn {
    uintptr_t t, u;
    uint32_t seed;
};
static atomic_int churn_bad, churn_done;

static int answer(uintptr_t va)
{
    int ptrs = 0;
    uintptr_t base;
    return sh_pool_bases_ptrs(sys.pool, &va, 1, &base, &ptrs) == 1 ? ptrs : -1;
}

static void *churner(void *arg)
{
    struct churn *c = arg;
    for (int round = 0; round < 150; round++) {
        uintptr_t v[2] = {c->t, c->u}, out[2];
        size_t released = 0, n = 0;
        if (sh_pool_evict_these(sys.pool, v, 2, &released, out, &n) != 0 || n != 2)
            atomic_fetch_add(&churn_bad, 1);
        if (answer(c->t) != 1 || answer(c->u) != 0)
            atomic_fetch_add(&churn_bad, 1);
        if (sh_pool_restore(sys.pool, v, 2) != 0)
            atomic_fetch_add(&churn_bad, 1);
        if (round % 10 == 9) { /* freed on the host, its scan perhaps pending */
            if (sh_pool_evict_these(sys.pool, &c->u, 1, &released, out, &n) != 0 ||
                sh_pool_free(sys.pool, c->u, ANY, 0) != 0 ||
                sh_pool_alloc(sys.pool, RSIZE, SH_PATH_MALLOC, 0, &c->u) != 0)
                atomic_fetch_add(&churn_bad, 1);
            memset((void *)c->u, (int)c->seed, RSIZE);
        }
    }
    atomic_fetch_add(&churn_done, 1);
    return NULL;
}

static void *answer_reader(void *arg)
{
    const uintptr_t *t = arg;
    int seen[2] = {0, 0};
    while (atomic_load(&churn_done) < 2)
        for (int k = 0; k < 2; k++) {
            int a = answer(t[k]);
            if (a < 0 || (seen[k] && a != 1)) /* once yes, always yes */
                atomic_fetch_add(&churn_bad, 1);
            seen[k] |= a == 1;
        }
    return NULL;
}

static void test_scan_threads(void **state)
{
    (void)state;
    start(&std_opts);
    uintptr_t a = alloc(RSIZE);
    struct churn c[2];
    for (int k = 0; k < 2; k++) {
        c[k] = (struct churn){.t = table_region(a + 64 * (uintptr_t)k),
                              .u = alloc(RSIZE),
                              .seed = 0x11u * (uint32_t)(k + 1)};
        memset((void *)c[k].u, (int)c[k].seed, RSIZE);
    }
    atomic_store(&churn_bad, 0);
    atomic_store(&churn_done, 0);
    uintptr_t t[2] = {c[0].t, c[1].t};
    pthread_t th[3];
    assert_int_equal(pthread_create(&th[0], NULL, churner, &c[0]), 0);
    assert_int_equal(pthread_create(&th[1], NULL, churner, &c[1]), 0);
    assert_int_equal(pthread_create(&th[2], NULL, answer_reader, t), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&churn_bad), 0);
    for (int k = 0; k < 2; k++)
        assert_int_equal(bad_words(c[k].t, CH, 7), 0);
    assert_true(pstats().scans_queued > 0);
    stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_pointer_found_anywhere, teardown),
        cmocka_unit_test_teardown(test_pointer_table_prefetch, teardown),
        cmocka_unit_test_teardown(test_pointer_table_early_tracked, teardown),
        cmocka_unit_test_teardown(test_prefilter_once_per_window, teardown),
        cmocka_unit_test_teardown(test_failed_window_call_keeps_all, teardown),
        cmocka_unit_test_teardown(test_landed_bytes_mark_pointer_tables, teardown),
        cmocka_unit_test_teardown(test_prefilter, teardown),
        cmocka_unit_test_teardown(test_scan_waits_for_no_eviction, teardown),
        cmocka_unit_test_teardown(test_scan_settled_by_launch, teardown),
        cmocka_unit_test_teardown(test_scan_settled_by_prefetch, teardown),
        cmocka_unit_test_teardown(test_table_in_spanned_neighbour, teardown),
        cmocka_unit_test_teardown(test_scan_dropped_by_free, teardown),
        cmocka_unit_test_teardown(test_scan_threads, teardown),
    };
    return cmocka_run_group_tests_name("ptrscan", tests, NULL, NULL);
}
