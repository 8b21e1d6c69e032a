/* test_region_threads.c — the region registry under threads: workers
 * allocating and freeing on every path while a monitor reads stats, looks
 * addresses up and trims. Over the fakes of region_fakes.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "region_fakes.h"

/* ---- threads ------------------------------------------------------------ */

#define NTHREADS 8
#define ITERS    3000
#define SLOTS    12

struct live {
    uintptr_t va;
    size_t size;
};

static struct sh_pool *mt_pool;
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct live live_set[NTHREADS * SLOTS];
static int mt_stop;
static int mt_errors;
static int mt_first_line;
static long mt_small[NTHREADS];

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (__atomic_fetch_add(&mt_errors, 1, __ATOMIC_RELAXED) == 0)                          \
                __atomic_store_n(&mt_first_line, __LINE__, __ATOMIC_RELAXED);                      \
        }                                                                                          \
    } while (0)

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Records [va, va+size) as live; 0 if it overlaps one already live. */
static int live_add(int slot, uintptr_t va, size_t size)
{
    int ok = 1;
    pthread_mutex_lock(&live_mu);
    for (int i = 0; i < NTHREADS * SLOTS; i++)
        if (live_set[i].size && overlaps(live_set[i].va, live_set[i].size, va, size))
            ok = 0;
    live_set[slot] = (struct live){va, size};
    pthread_mutex_unlock(&live_mu);
    return ok;
}

static void live_del(int slot)
{
    pthread_mutex_lock(&live_mu);
    live_set[slot].size = 0;
    pthread_mutex_unlock(&live_mu);
}

static void *mt_worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t stream = (uint64_t)t + 1, s = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1);
    static const size_t sizes[] = {512, 3000, 64 * K, M, M + 1, 2 * M, 6 * M + 3, 16 * M, 40 * M};
    static const int paths[] = {SH_PATH_ASYNC, SH_PATH_PLUGGABLE, SH_PATH_MALLOC};
    struct {
        uintptr_t va;
        size_t size;
        int small;
    } slot[SLOTS] = {{0, 0, 0}};
    uint64_t pending[64];
    int npending = 0;
    for (int it = 0; it < ITERS; it++) {
        int k = (int)(rnd(&s) % SLOTS), id = t * SLOTS + k;
        if (slot[k].size) {
            live_del(id);
            uint64_t fence = 0;
            if (rnd(&s) % 2 && npending < 64)
                pending[npending++] = fence = fence_new();
            CHECK(sh_pool_free(mt_pool, slot[k].va, stream, fence) == 0);
            slot[k].size = 0;
        } else {
            size_t size = sizes[rnd(&s) % (sizeof sizes / sizeof sizes[0])];
            int path = paths[rnd(&s) % 3];
            uintptr_t va = 0;
            int rc = sh_pool_alloc(mt_pool, size, path, stream, &va);
            CHECK(rc == 0);
            if (rc)
                continue;
            CHECK(live_add(id, va, size));
            CHECK(covered(va, size));
            int small = path != SH_PATH_MALLOC && size <= M;
            struct sh_region_info ri;
            CHECK(sh_pool_lookup(mt_pool, va + size - 1, &ri) == 0);
            CHECK(ri.state == SH_RS_RESIDENT);
            CHECK(va >= ri.va && va + size <= ri.va + ri.mapped);
            if (small) {
                CHECK(ri.path == SH_PATH_SLAB);
                mt_small[t]++;
            } else {
                CHECK(ri.va == va && ri.size == size && ri.path == path);
                CHECK(ri.mapped == (size + G - 1) / G * G);
            }
            slot[k].va = va;
            slot[k].size = size;
            slot[k].small = small;
        }
        /* The oldest fences of this stream complete as time goes by. */
        while (npending && rnd(&s) % 3 == 0) {
            fence_complete(pending[0]);
            memmove(pending, pending + 1, (size_t)--npending * sizeof pending[0]);
        }
    }
    for (int k = 0; k < SLOTS; k++)
        if (slot[k].size) {
            live_del(t * SLOTS + k);
            CHECK(sh_pool_free(mt_pool, slot[k].va, stream, 0) == 0);
        }
    for (int i = 0; i < npending; i++)
        fence_complete(pending[i]);
    return NULL;
}

/* What a monitor and the launch hooks do meanwhile: stats, lookups of
 * addresses that may be freed or reused under them, and trims. */
static void *mt_monitor(void *arg)
{
    (void)arg;
    uint64_t s = 12345;
    uintptr_t seen[256] = {0}; /* addresses once live: freed, torn down, built again */
    long n = 0;
    while (!__atomic_load_n(&mt_stop, __ATOMIC_RELAXED)) {
        struct sh_pool_stats st;
        sh_pool_stats(mt_pool, &st);
        int i = (int)(rnd(&s) % (NTHREADS * SLOTS));
        pthread_mutex_lock(&live_mu);
        struct live l = live_set[i];
        pthread_mutex_unlock(&live_mu);
        uintptr_t probe[2] = {0, seen[rnd(&s) % 256]};
        if (l.size)
            seen[n % 256] = probe[0] = l.va + rnd(&s) % l.size;
        for (int k = 0; k < 2; k++) {
            struct sh_region_info ri;
            if (probe[k] && sh_pool_lookup(mt_pool, probe[k], &ri) == 0) {
                CHECK(probe[k] >= ri.va && probe[k] < ri.va + ri.mapped);
                CHECK(ri.id != 0); /* a region is complete once it can be found */
                CHECK(ri.nchunks > 0 && ri.size > 0 && ri.size <= ri.mapped);
            }
        }
        if (++n % 64 == 0)
            sh_pool_trim(mt_pool, 8 * M);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct sh_pool_params p = defaults();
    p.max_chunk = 8 * M;
    p.va_block = 256 * M;
    p.va_cache = 256 * M;
    p.device_cache = 96 * M; /* small: teardowns race with everything else */
    mt_pool = mkpool(&p);
    memset(live_set, 0, sizeof live_set);
    memset(mt_small, 0, sizeof mt_small);
    mt_stop = 0;
    mt_errors = 0;
    pthread_t th[NTHREADS], mon;
    assert_int_equal(pthread_create(&mon, NULL, mt_monitor, NULL), 0);
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, mt_worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    __atomic_store_n(&mt_stop, 1, __ATOMIC_RELAXED);
    pthread_join(mon, NULL);
    if (mt_errors)
        fail_msg("%d failed checks, the first at line %d", mt_errors, mt_first_line);

    long small = 0;
    for (int i = 0; i < NTHREADS; i++)
        small += mt_small[i];
    struct sh_pool_stats st = pstats(mt_pool);
    assert_int_equal(st.small_allocs, small);
    assert_int_equal(st.small_frees, small);
    /* Only slabs are left live. */
    assert_int_equal(st.allocs - st.frees, st.regions[SH_RS_RESIDENT]);
    assert_int_equal(st.slabs, st.regions[SH_RS_RESIDENT]);
    assert_true(st.freed_bytes <= p.device_cache);
    assert_int_equal(st.vmm_maps - st.vmm_unmaps, (uint64_t)vf.nmaps);
    assert_int_equal(st.device_bytes, vf.device_bytes);
    assert_int_equal(vf.bad, 0);
    sh_pool_destroy(mt_pool);
    assert_books_balanced();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_threads, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
