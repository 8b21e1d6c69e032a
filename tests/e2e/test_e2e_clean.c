/* test_e2e_clean.c — clean regions on the simulated GPU ([policy]
 * clean_skip): a restored region keeps its host copy, and its next
 * eviction copies only what changed, as the library's fingerprint kernel
 * (its PTX, run by the simulated GPU as its host stand-in) tells.
 *
 *   write paths   a region is restored, written one way, evicted: every way
 *                 must make a dirty eviction and come back exact — a kernel
 *                 through a pointer the launch scan sees, one through a
 *                 pointer in device memory it cannot see (still running as
 *                 the eviction starts), cudaMemcpy host- and device-to-
 *                 device, cudaMemset, the driver's cuMemcpyHtoD and
 *                 cuMemsetD8, an async copy on another stream, one byte at
 *                 the region's last byte (only the last chunk is copied);
 *                 and no write at all: a clean eviction. Again with
 *                 drain_mode = tracked, whose windows then drain the device.
 *   always dirty  written at every turn: after a few dirty evictions the
 *                 region stops keeping copies, and the fingerprint
 *                 launches stop with it.
 *   lora          a frozen-weights training loop (LoRA shape) at about
 *                 twice the budget: at most half the device-to-host bytes of
 *                 the same run with clean_skip = false, and the same bytes;
 *                 its trace says which regions its clean evictions found
 *                 unchanged (`i unchanged`), and no launch of such a span
 *                 writes its region.
 *
 * Each runs in a child with its own configuration. Under STAGEHAND_DISABLE
 * the children only check bytes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "clean/clean.h"
#include "reexec.h"
#include "simcuda.h"
#include "stagehand.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MB     ((size_t)1 << 20)
#define TSIZE  (8 * MB) /* two 4 MB chunks (max_chunk_mb = 4) */
#define NFILL  8
#define LAYERS 8
#define STEPS  6
#define WSIZE  (8 * MB)
#define ASIZE  (2 * MB)
#define XSIZE  (4 * MB)

static const dim3 one = {1, 1, 1};
static int failures;
static unsigned long long launched; /* the program's own launches */

/* ---- kernels ---- */

static uint32_t pattern(uint32_t seed, size_t i)
{
    return seed * 2654435761u + (uint32_t)i;
}

static void k_fill(void **a) /* (p, n, seed) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t seed = *(uint32_t *)a[2];
    for (size_t i = 0; i < n / 4; i++)
        p[i] = pattern(seed, i);
}

static void k_read(void **a) /* (p): reads, writes nothing */
{
    volatile const uint32_t *p = *(uint32_t **)a[0];
    (void)p[0];
}

static void k_set(void **a) /* (p, byte offset, value) */
{
    unsigned char *p = *(unsigned char **)a[0];
    p[*(size_t *)a[1]] = *(unsigned char *)a[2];
}

static void k_store_ptr(void **a) /* (table, p): table[0] = p, in device memory */
{
    void **t = *(void ***)a[0];
    t[0] = *(void **)a[1];
}

static void k_hidden(void **a) /* (table, byte offset, value): through table[0] */
{
    unsigned char *p = **(unsigned char ***)a[0];
    p[*(size_t *)a[1]] = *(unsigned char *)a[2];
}

/* LoRA: x = f(w, a, x_prev); the gradient of a from x and w; a += g. */
static void k_fwd(void **a) /* (w, adapter, x, layer) */
{
    const uint32_t *w = *(uint32_t **)a[0], *ad = *(uint32_t **)a[1];
    uint32_t *x = *(uint32_t **)a[2], layer = *(uint32_t *)a[3];
    for (size_t i = 0; i < XSIZE / 4; i++)
        x[i] = w[i % (WSIZE / 4)] ^ (ad[i % (ASIZE / 4)] + layer);
}

static void k_bwd(void **a) /* (w, x, g, layer) */
{
    const uint32_t *w = *(uint32_t **)a[0], *x = *(uint32_t **)a[1];
    uint32_t *g = *(uint32_t **)a[2], layer = *(uint32_t *)a[3];
    for (size_t i = 0; i < ASIZE / 4; i++)
        g[i] = (x[i] >> 7) + w[i + layer] + layer;
}

static void k_opt(void **a) /* (adapter, g) */
{
    uint32_t *ad = *(uint32_t **)a[0];
    const uint32_t *g = *(uint32_t **)a[1];
    for (size_t i = 0; i < ASIZE / 4; i++)
        ad[i] += g[i];
}

static void launch(void (*fn)(void **), void **args)
{
    failures += cudaLaunchKernel((const void *)fn, one, one, args, 0, NULL) != cudaSuccess;
    launched++;
}

static int register_kernels(void)
{
    size_t fill[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    size_t ptr[] = {sizeof(void *)};
    size_t set[] = {sizeof(void *), sizeof(size_t), 1};
    size_t two[] = {sizeof(void *), sizeof(void *)};
    size_t four[] = {sizeof(void *), sizeof(void *), sizeof(void *), sizeof(uint32_t)};
    return simcuda_register_kernel(k_fill, "fill", 3, fill, 0) ||
           simcuda_register_kernel(k_read, "read", 1, ptr, 0) ||
           simcuda_register_kernel(k_set, "set", 3, set, 0) ||
           simcuda_register_kernel(k_store_ptr, "store_ptr", 2, two, 0) ||
           /* still running when the eviction's window opens */
           simcuda_register_kernel(k_hidden, "hidden", 3, set, 20000) ||
           simcuda_register_kernel(k_fwd, "fwd", 4, four, 0) ||
           simcuda_register_kernel(k_bwd, "bwd", 4, four, 0) ||
           simcuda_register_kernel(k_opt, "opt", 2, two, 0);
}

/* ---- the library's figures ---- */

static stagehand_stats_t stats(void)
{
    stagehand_stats_t st = {0};
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    if (get)
        get(&st, sizeof st);
    return st;
}

/* 1 on the device, 0 on the host, -1 when no library manages it. */
static int residency(const void *p)
{
    int (*res)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "stagehand_residency");
    return res ? res(p) : -1;
}

static void mark_step(void)
{
    int64_t (*step)(void) = (int64_t(*)(void))dlsym(RTLD_DEFAULT, "stagehand_step");
    if (step)
        step();
}

/* ---- write paths ---- */

/* Allocates and fills new regions until t is evicted (it is the only
 * other one), then frees them: they are never restored, so every clean or
 * dirty eviction counted is t's. 0 when t went, or when no library evicts
 * anything. */
static int evict(void *t)
{
    void *f[NFILL];
    size_t n = TSIZE;
    uint32_t seed = 77;
    int k = 0;
    for (; k < NFILL && residency(t) == 1; k++) {
        if (cudaMalloc(&f[k], TSIZE))
            break;
        void *args[] = {&f[k], &n, &seed};
        launch(k_fill, args);
    }
    cudaDeviceSynchronize();
    int stayed = residency(t) == 1;
    while (k-- > 0)
        cudaFree(f[k]);
    return stayed;
}

/* Brings t back by reading it (a launch names it). */
static void restore(void *t)
{
    void *args[] = {&t};
    launch(k_read, args);
    cudaDeviceSynchronize();
}

/* Copies t back to the host (the copy restores it) and compares it with
 * the mirror. */
static int same(void *t, const unsigned char *mirror)
{
    unsigned char *h = malloc(TSIZE);
    int ok = h && cudaMemcpy(h, t, TSIZE, cudaMemcpyDeviceToHost) == cudaSuccess &&
             memcmp(h, mirror, TSIZE) == 0;
    free(h);
    return ok;
}

struct ctx {
    void *t, *table, *src, *pinned;
    unsigned char *mirror;
    cudaStream_t other;
};

/* Writes t one way at offset off (mirrored). */
static int write_one(struct ctx *c, const char *how, size_t off)
{
    unsigned char v = (unsigned char)(off * 31 + 7);
    size_t n = 4096;
    if (strcmp(how, "kernel") == 0) {
        void *args[] = {&c->t, &off, &v};
        launch(k_set, args);
        n = 1;
    } else if (strcmp(how, "hidden") == 0) {
        void *args[] = {&c->table, &off, &v};
        launch(k_hidden, args); /* the scan sees only the table: no region */
        n = 1;
    } else if (strcmp(how, "h2d") == 0) {
        memset(c->pinned, v, n);
        failures += cudaMemcpy((char *)c->t + off, c->pinned, n, cudaMemcpyHostToDevice) != 0;
    } else if (strcmp(how, "d2d") == 0) {
        failures += cudaMemset(c->src, v, n) != 0;
        failures += cudaMemcpy((char *)c->t + off, c->src, n, cudaMemcpyDeviceToDevice) != 0;
    } else if (strcmp(how, "memset") == 0) {
        failures += cudaMemset((char *)c->t + off, v, n) != 0;
    } else if (strcmp(how, "last") == 0) { /* one byte */
        n = 1;
        failures += cudaMemset((char *)c->t + off, v, n) != 0;
    } else if (strcmp(how, "cuMemcpyHtoD") == 0) {
        memset(c->pinned, v, n);
        failures += cuMemcpyHtoD((CUdeviceptr)(uintptr_t)c->t + off, c->pinned, n) != 0;
    } else if (strcmp(how, "cuMemsetD8") == 0) {
        failures += cuMemsetD8((CUdeviceptr)(uintptr_t)c->t + off, v, n) != 0;
    } else if (strcmp(how, "async") == 0) { /* another stream, not waited for */
        n = MB;
        memset(c->pinned, v, n);
        failures += cudaMemcpyAsync((char *)c->t + off, c->pinned, n, cudaMemcpyHostToDevice,
                                    c->other) != 0;
    } else {
        return strcmp(how, "none") == 0 ? 0 : -1;
    }
    memset(c->mirror + off, v, n);
    return 0;
}

static const char *const paths[] = {"kernel",       "hidden",     "h2d",   "d2d", "memset",
                                    "cuMemcpyHtoD", "cuMemsetD8", "async", "last"};

/* One turn: t restored (keeping a copy), written `how` (or not at all),
 * evicted; 0 when the eviction was what the write calls for and t comes
 * back exact. A clean turn before each write also keeps the region from
 * learning that it is always dirty. */
static int turn(struct ctx *c, const char *how, size_t off, int managed)
{
    int last = strcmp(how, "last") == 0, clean = strcmp(how, "none") == 0;
    restore(c->t);
    stagehand_stats_t a = stats();
    if (write_one(c, how, off) != 0)
        return 2;
    if (evict(c->t))
        return 3;
    stagehand_stats_t b = stats();
    uint64_t dirty = b.dirty_evictions - a.dirty_evictions;
    uint64_t cleaned = b.clean_evictions - a.clean_evictions;
    if (managed &&
        (a.kept_bytes < TSIZE || dirty != (uint64_t)!clean || cleaned != (uint64_t)clean)) {
        fprintf(stderr, "%s: kept %llu, dirty +%llu, clean +%llu\n", how,
                (unsigned long long)a.kept_bytes, (unsigned long long)dirty,
                (unsigned long long)cleaned);
        return 4;
    }
    if (managed && last && b.clean_bytes - a.clean_bytes != 4 * MB) {
        fprintf(stderr, "last byte: %llu bytes not copied, want the first chunk's\n",
                (unsigned long long)(b.clean_bytes - a.clean_bytes));
        return 4;
    }
    cudaStreamSynchronize(c->other);
    if (!same(c->t, c->mirror)) {
        fprintf(stderr, "%s: bytes wrong after the restore\n", how);
        return 5;
    }
    return 0;
}

/* Each path: a clean turn, then a turn writing that way. */
static int write_paths_child(void)
{
    struct ctx c = {0};
    size_t n = TSIZE;
    c.mirror = malloc(TSIZE);
    if (!c.mirror || cudaMalloc(&c.t, TSIZE) || cudaMalloc(&c.table, 4096) ||
        cudaMalloc(&c.src, 4096) || cudaMallocHost(&c.pinned, MB) ||
        cudaStreamCreateWithFlags(&c.other, cudaStreamNonBlocking))
        return 2;
    uint32_t seed = 5;
    void *fargs[] = {&c.t, &n, &seed};
    launch(k_fill, fargs);
    for (size_t i = 0; i < TSIZE / 4; i++) {
        uint32_t w = pattern(seed, i);
        memcpy(c.mirror + 4 * i, &w, 4);
    }
    void *sargs[] = {&c.table, &c.t};
    launch(k_store_ptr, sargs); /* t's address in device memory, never seen */
    cudaDeviceSynchronize();
    int managed = stats().active != 0, rc = evict(c.t) ? 3 : 0;
    for (size_t p = 0; p < sizeof paths / sizeof *paths && rc == 0; p++) {
        size_t off = strcmp(paths[p], "last") == 0 ? TSIZE - 1 : (p * 1237 * 64) % (TSIZE - MB);
        rc = turn(&c, "none", 0, managed);
        if (rc == 0)
            rc = turn(&c, paths[p], off, managed);
    }
    stagehand_stats_t st = stats();
    if (rc == 0 && managed && getenv("E2E_CLEAN_TRACKED") && st.device_drains == 0)
        rc = 6; /* windows that compare kept copies drain the device */
    if (rc == 0 && managed && st.lost_writes)
        rc = 7;
    free(c.mirror);
    cudaFreeHost(c.pinned);
    return rc ? rc : failures ? 8 : 0;
}

/* ---- always dirty ---- */

static int always_dirty_child(void)
{
    void *t;
    size_t n = TSIZE;
    uint32_t seed = 9;
    if (cudaMalloc(&t, TSIZE))
        return 2;
    void *fargs[] = {&t, &n, &seed};
    launch(k_fill, fargs);
    unsigned char last = 0;
    const int turns = 30;
    stagehand_stats_t a = stats();
    for (int i = 0; i < turns; i++) {
        size_t off = (size_t)i;
        last = (unsigned char)i;
        void *args[] = {&t, &off, &last};
        launch(k_set, args); /* restores t, then writes it */
        if (evict(t))
            return 3;
    }
    stagehand_stats_t b = stats();
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    unsigned char h[64];
    if (cudaMemcpy(h, t, sizeof h, cudaMemcpyDeviceToHost))
        return 2;
    for (int i = 0; i < turns; i++)
        if (h[i] != (unsigned char)i)
            return 5;
    if (b.active) {
        unsigned long long fps = b.fingerprints - a.fingerprints;
        fprintf(stderr, "always dirty: %d evictions, %llu dirty, %llu fingerprint launches\n",
                turns, (unsigned long long)(b.dirty_evictions - a.dirty_evictions), fps);
        /* Kept while learning: the first run of dirty evictions and a few
         * retries; each costs both chunks at the restore and at the eviction. */
        if (b.dirty_evictions - a.dirty_evictions < SH_CLEAN_DIRTY_RUN ||
            fps > 4ull * (SH_CLEAN_DIRTY_RUN + 2) || b.clean_evictions != a.clean_evictions)
            return 4;
        /* Every one of them ran on the (simulated) device, beside the
         * pointer prefilter's launches. */
        if (sim.launches - launched != b.fingerprints + b.prefilters)
            return 6;
        /* ... and was waited for: the time the statistics give them. */
        if (fps && b.fingerprint_us == a.fingerprint_us)
            return 7;
    }
    return failures ? 8 : 0;
}

/* ---- a LoRA-shaped training loop ---- */

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int lora_child(const char *out)
{
    void *w[LAYERS], *ad[LAYERS];
    size_t wn = WSIZE, an = ASIZE;
    for (uint32_t i = 0; i < LAYERS; i++) {
        if (cudaMalloc(&w[i], WSIZE) || cudaMalloc(&ad[i], ASIZE))
            return 2;
        uint32_t ws = 100 + i, as = 200 + i;
        void *a1[] = {&w[i], &wn, &ws}, *a2[] = {&ad[i], &an, &as};
        launch(k_fill, a1);
        launch(k_fill, a2);
    }
    for (int step = 0; step < STEPS; step++) {
        mark_step();
        void *x[LAYERS], *g;
        for (uint32_t i = 0; i < LAYERS; i++) { /* forward: activations kept */
            if (cudaMalloc(&x[i], XSIZE))
                return 2;
            void *args[] = {&w[i], &ad[i], &x[i], &i};
            launch(k_fwd, args);
        }
        for (uint32_t i = LAYERS; i-- > 0;) { /* backward, then the adapter's step */
            if (cudaMalloc(&g, ASIZE))
                return 2;
            void *b[] = {&w[i], &x[i], &g, &i}, *o[] = {&ad[i], &g};
            launch(k_bwd, b);
            launch(k_opt, o);
            cudaFree(g);
            cudaFree(x[i]);
        }
    }
    cudaDeviceSynchronize();
    unsigned char *h = malloc(WSIZE);
    uint64_t hash = 1469598103934665603ull;
    for (uint32_t i = 0; h && i < LAYERS; i++) {
        if (cudaMemcpy(h, w[i], WSIZE, cudaMemcpyDeviceToHost))
            return 2;
        for (size_t k = 0; k < WSIZE / 4; k++) /* frozen: as filled */
            if (((uint32_t *)h)[k] != pattern(100 + i, k))
                return 5;
        if (cudaMemcpy(h, ad[i], ASIZE, cudaMemcpyDeviceToHost))
            return 2;
        hash = fnv(hash, h, ASIZE);
    }
    free(h);
    stagehand_stats_t st = stats();
    FILE *fp = fopen(out, "w");
    if (!fp)
        return 2;
    fprintf(fp, "%llu %llu %llu %llu\n", (unsigned long long)hash, (unsigned long long)st.d2h_bytes,
            (unsigned long long)st.h2d_bytes, (unsigned long long)st.clean_evictions);
    fclose(fp);
    return failures ? 8 : 0;
}

/* ---- the tests (parent) ---- */

static char **args;

static void run(const char *const *env)
{
    assert_int_equal(e2e_rerun(args, env), 0);
}

static void test_write_paths(void **state)
{
    (void)state;
    static const char *const env[] = {"E2E_CLEAN_CHILD=paths", "STAGEHAND_POLICY_EVICTION=lru",
                                      "STAGEHAND_POLICY_PREFETCH_ENABLED=false", NULL};
    run(env);
}

static void test_write_paths_verified(void **state)
{
    (void)state;
    static const char *const env[] = {"E2E_CLEAN_CHILD=paths", "STAGEHAND_POLICY_EVICTION=lru",
                                      "STAGEHAND_POLICY_PREFETCH_ENABLED=false",
                                      "STAGEHAND_DEBUG_DEBUG_VERIFY_MOVES=true", NULL};
    run(env);
}

static void test_write_paths_tracked(void **state)
{
    (void)state;
    static const char *const env[] = {"E2E_CLEAN_CHILD=paths",
                                      "E2E_CLEAN_TRACKED=1",
                                      "STAGEHAND_POLICY_EVICTION=lru",
                                      "STAGEHAND_POLICY_PREFETCH_ENABLED=false",
                                      "STAGEHAND_TRANSFER_DRAIN_MODE=tracked",
                                      NULL};
    run(env);
}

static void test_always_dirty(void **state)
{
    (void)state;
    static const char *const env[] = {"E2E_CLEAN_CHILD=dirty", "STAGEHAND_POLICY_EVICTION=lru",
                                      "STAGEHAND_POLICY_PREFETCH_ENABLED=false", NULL};
    run(env);
}

struct lora_result {
    unsigned long long hash, d2h, h2d, clean;
};

static struct lora_result lora(const char *clean_skip, const char *trace)
{
    char out[] = "/tmp/e2e_clean_XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    char path[64], skip[64], tr[96];
    snprintf(path, sizeof path, "E2E_CLEAN_OUT=%s", out);
    snprintf(skip, sizeof skip, "STAGEHAND_POLICY_CLEAN_SKIP=%s", clean_skip);
    snprintf(tr, sizeof tr, "STAGEHAND_TRACE=%s", trace ? trace : "");
    const char *const env[] = {"E2E_CLEAN_CHILD=lora", path, skip, tr, NULL};
    run(env);
    struct lora_result r = {0};
    FILE *fp = fopen(out, "r");
    assert_non_null(fp);
    assert_int_equal(fscanf(fp, "%llu %llu %llu %llu", &r.hash, &r.d2h, &r.h2d, &r.clean), 4);
    fclose(fp);
    unlink(out);
    return r;
}

/* The regions of the trace's launches, in order, as the LoRA loop's
 * kernels name them; the one each writes is its last (k_fill's only one,
 * k_fwd's activation, k_bwd's gradient), but k_opt's (adapter, gradient)
 * writes its first. */
#define MAX_TRACED 4096
static struct traced {
    unsigned n;
    unsigned long long id[3];
} traced[MAX_TRACED];

static unsigned long long written_by(const struct traced *l)
{
    return l->n == 2 ? l->id[0] : l->id[l->n - 1];
}

/* Every `i unchanged` record the library wrote is true of the loop: no
 * launch of its span writes its region. Returns how many there were. */
static int check_unchanged(const char *path)
{
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char line[512];
    size_t nl = 0;
    int records = 0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long long t, st, k, id, first, last;
        char dur[32];
        struct traced *l = &traced[nl < MAX_TRACED ? nl : MAX_TRACED - 1];
        int got = sscanf(line, "l %llu %31s %llu %llu %u %llu %llu %llu", &t, dur, &st, &k, &l->n,
                         &l->id[0], &l->id[1], &l->id[2]);
        if (got >= 6) {
            assert_true(l->n >= 1 && l->n <= 3 && got == 5 + (int)l->n);
            nl++;
        } else if (sscanf(line, "i unchanged %llu %llu %llu", &id, &first, &last) == 3) {
            records++;
            assert_true(first <= last && last < nl && nl < MAX_TRACED);
            for (unsigned long long s = first; s <= last; s++)
                assert_true(written_by(&traced[s]) != id);
        }
    }
    fclose(fp);
    return records;
}

static void test_lora(void **state)
{
    (void)state;
    char trace[] = "/tmp/e2e_clean_trace_XXXXXX";
    int fd = mkstemp(trace);
    assert_true(fd >= 0);
    close(fd);
    struct lora_result on = lora("true", trace), off = lora("false", NULL);
    int records = check_unchanged(trace);
    unlink(trace);
    fprintf(stderr,
            "lora: clean_skip on: d2h %llu h2d %llu (%llu clean evictions, %d spans traced "
            "unchanged); off: d2h %llu h2d %llu\n",
            on.d2h, on.h2d, on.clean, records, off.d2h, off.h2d);
    assert_true(on.hash == off.hash);
    if (off.d2h == 0)
        return; /* nothing managed (STAGEHAND_DISABLE): the bytes were all there was */
    assert_true(on.clean > 0);
    assert_true(on.d2h * 2 <= off.d2h);
    /* What the clean evictions taught went into the trace, for stagehand-sim. */
    assert_true(records > 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_CLEAN_CONFIGURED")) {
        /* The library reads its configuration at load: set it, start again. */
        setenv("E2E_CLEAN_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("SIMCUDA_PCIE_GBPS", "2", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "48", 1);
        setenv("STAGEHAND_REGIONS_MAX_CHUNK_MB", "4", 1);
        setenv("STAGEHAND_GENERAL_LOG_LEVEL", "warn", 1);
        e2e_reexec(argv);
        return 1;
    }
    const char *child = getenv("E2E_CLEAN_CHILD");
    if (child) {
        if (register_kernels())
            return 2;
        if (strcmp(child, "paths") == 0)
            return write_paths_child();
        if (strcmp(child, "dirty") == 0)
            return always_dirty_child();
        return lora_child(getenv("E2E_CLEAN_OUT"));
    }
    args = argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_paths),
        cmocka_unit_test(test_write_paths_verified),
        cmocka_unit_test(test_write_paths_tracked),
        cmocka_unit_test(test_always_dirty),
        cmocka_unit_test(test_lora),
    };
    return cmocka_run_group_tests_name("e2e_clean", tests, NULL, NULL);
}
