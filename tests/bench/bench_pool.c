/* bench_pool.c — hot paths of the pool parts, with malloc as a yardstick.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I include -I . tests/bench/bench_pool.c \
 *      pool/rindex.c pool/state.c pool/vaarena.c pool/chunkcache.c pool/suballoc.c \
 *      telemetry/log.c -pthread -o build/bench_pool
 *
 * rindex: random interior addresses of 10 000 live intervals inserted in
 * random order (the launch-scan worst case: no two lookups share a path).
 * suballoc: one alloc + stream-ordered free on the same stream, the
 * cudaMallocAsync/cudaFreeAsync steady state. Each figure is the best of
 * ROUNDS runs, so a busy neighbour on a shared machine does not set it.
 */
#include "pool/pool_parts.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define REGIONS 10000
#define LOOKUPS 4000000
#define NADDR   (1 << 16)
#define ALLOCS  2000000
#define ROUNDS  7

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile uintptr_t sink;

static double best_of(double (*round)(void *), void *arg)
{
    double best = 1e30;
    for (int i = 0; i < ROUNDS; i++) {
        double t = round(arg);
        if (t < best)
            best = t;
    }
    return best;
}

/* ---- rindex ------------------------------------------------------------------ */

static uintptr_t start[REGIONS];
static size_t len[REGIONS];
static uintptr_t addr[NADDR];

static double rindex_round(void *arg)
{
    const struct sh_rindex *ri = arg;
    uintptr_t acc = 0;
    double t0 = now();
    for (int i = 0; i < LOOKUPS; i++)
        acc += (uintptr_t)sh_rindex_lookup(ri, addr[i & (NADDR - 1)]);
    double t = now() - t0;
    sink = acc;
    return t * 1e9 / LOOKUPS;
}

static double bench_rindex(void)
{
    uintptr_t at = (uintptr_t)1 << 40;
    for (int i = 0; i < REGIONS; i++) {
        len[i] = ((size_t)1 + rnd() % 32) << 21; /* 2..64 MiB regions */
        start[i] = at;
        at += len[i] + ((rnd() % 4) << 21); /* with some gaps */
    }
    for (int i = REGIONS - 1; i > 0; i--) { /* insertion order: random */
        int j = (int)(rnd() % (uint64_t)(i + 1));
        uintptr_t s = start[i];
        size_t l = len[i];
        start[i] = start[j];
        len[i] = len[j];
        start[j] = s;
        len[j] = l;
    }
    struct sh_rindex *ri;
    if (sh_rindex_create(&ri))
        abort();
    for (int i = 0; i < REGIONS; i++)
        if (sh_rindex_insert(ri, start[i], len[i], (void *)start[i]))
            abort();
    for (int i = 0; i < NADDR; i++) {
        int k = (int)(rnd() % REGIONS);
        addr[i] = start[k] + rnd() % len[k];
    }
    double ns = best_of(rindex_round, ri);
    sh_rindex_destroy(ri);
    return ns;
}

/* ---- suballoc ---------------------------------------------------------------- */

static uintptr_t slab_next = (uintptr_t)1 << 44;

static int slab_get(void *ctx, size_t bytes, uintptr_t *base)
{
    (void)ctx;
    *base = slab_next;
    slab_next += bytes;
    return 0;
}

static void slab_put(void *ctx, uintptr_t base, size_t bytes)
{
    (void)ctx;
    (void)base;
    (void)bytes;
}

static int fence_done(void *ctx, uint64_t fence)
{
    (void)ctx;
    (void)fence;
    return 0;
}

static double suballoc_round(void *arg)
{
    struct sh_suballoc *sa = arg;
    static uint64_t fence;
    uintptr_t p;
    double t0 = now();
    for (int i = 0; i < ALLOCS; i++)
        if (sh_suballoc_alloc(sa, 4096, 1, &p) || sh_suballoc_free(sa, p, 1, ++fence))
            abort();
    return (now() - t0) * 1e9 / ALLOCS;
}

static double bench_suballoc(void)
{
    struct sh_suballoc_ops ops = {NULL, slab_get, slab_put, fence_done, NULL};
    struct sh_suballoc *sa;
    if (sh_suballoc_create(&ops, NULL, &sa))
        abort();
    uintptr_t keep;
    for (int i = 0; i < 64; i++) /* some live blocks around, as in a real step */
        if (sh_suballoc_alloc(sa, 4096 << (i % 4), 1, &keep))
            abort();
    double ns = best_of(suballoc_round, sa);
    sh_suballoc_destroy(sa);
    return ns;
}

/* ---- baseline ---------------------------------------------------------------- */

static double malloc_round(void *arg)
{
    (void)arg;
    double t0 = now();
    for (int i = 0; i < ALLOCS; i++) {
        void *volatile p = malloc(4096);
        free(p);
    }
    return (now() - t0) * 1e9 / ALLOCS;
}

int main(void)
{
    printf("rindex lookup (10000 regions): %.1f ns/op\n", bench_rindex());
    printf("suballoc alloc+free (same stream): %.1f ns/op\n", bench_suballoc());
    printf("malloc+free baseline: %.1f ns/op\n", best_of(malloc_round, NULL));
    return 0;
}
