/* test_e2e_fits.c — a program that fits runs as if the library were not
 * there.
 *
 * A training loop (persistent weights, activations allocated in the forward
 * pass and freed after the backward) whose peak is 95% of the simulated
 * card, with the built-in configuration: under the library it moves not one
 * byte either way and ends with the weights a host reference computes; so
 * does the same program with the library disabled. Run again on a card
 * two thirds the size (the peak is then 150% of it), it completes byte-exact
 * under the library, with eviction, and runs out of memory without it.
 * On both cards an allocation larger than the card fails at once, evicting
 * nothing, and a small pass-through allocation still succeeds once the pool
 * has filled the card. On a card far larger it records no launch and pins
 * no host memory.
 *
 * The program re-executes itself to set the card and the configuration
 * before anything (the library reads them as it loads).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "simcuda.h"
#include "stagehand.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REGION_MB 2
#define LAYERS    38 /* weights and activations: 76 regions, 152 MB at the peak */
#define STEPS     3
#define PEAK_MB   (2 * LAYERS * REGION_MB)
#define FIT_MB    160 /* the peak is 95% of it */
#define OVER_MB   101 /* ... and 150% of this */
#define WORDS     (((size_t)REGION_MB << 20) / 4)

static int preloaded, over, marks;
static const char *want_recorded; /* "none" or "some": the launches the policy must see */
static char **saved_argv;

static uint32_t init_word(uint32_t seed, size_t i)
{
    return seed * 2654435761u + (uint32_t)i;
}

static uint32_t forward_word(uint32_t w, uint32_t in)
{
    return (in ^ w) * 2246822519u + 374761393u;
}

/* init(p, n, seed) */
static void k_init(void **a)
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t seed = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = init_word(seed, i);
}

/* forward(w, in, out, n): out = f(w, in) */
static void k_forward(void **a)
{
    const uint32_t *w = *(uint32_t **)a[0], *in = *(uint32_t **)a[1];
    uint32_t *out = *(uint32_t **)a[2];
    size_t n = *(size_t *)a[3];
    for (size_t i = 0; i < n; i++)
        out[i] = forward_word(w[i], in[i]);
}

/* update(w, act, n): w += act >> 7 */
static void k_update(void **a)
{
    uint32_t *w = *(uint32_t **)a[0];
    const uint32_t *act = *(uint32_t **)a[1];
    size_t n = *(size_t *)a[2];
    for (size_t i = 0; i < n; i++)
        w[i] += act[i] >> 7;
}

static dim3 one = {1, 1, 1};

static cudaError_t init(void *p, uint32_t seed)
{
    size_t n = WORDS;
    void *args[] = {&p, &n, &seed};
    return cudaLaunchKernel((const void *)k_init, one, one, args, 0, NULL);
}

static cudaError_t forward(void *w, void *in, void *out)
{
    size_t n = WORDS;
    void *args[] = {&w, &in, &out, &n};
    return cudaLaunchKernel((const void *)k_forward, one, one, args, 0, NULL);
}

static cudaError_t update(void *w, void *act)
{
    size_t n = WORDS;
    void *args[] = {&w, &act, &n};
    return cudaLaunchKernel((const void *)k_update, one, one, args, 0, NULL);
}

/* The weights' word i after the loop, computed on the host: every kernel
 * works word by word, so one word's history is enough. */
static void reference(size_t i, uint32_t w[LAYERS])
{
    uint32_t act[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        w[l] = init_word(1000u + (uint32_t)l, i);
    for (int s = 0; s < STEPS; s++) {
        uint32_t in = init_word(7u + (uint32_t)s, i);
        for (int l = 0; l < LAYERS; l++)
            in = act[l] = forward_word(w[l], in);
        for (int l = LAYERS - 1; l >= 0; l--)
            w[l] += act[l] >> 7;
    }
}

static void stats(stagehand_stats_t *st)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    memset(st, 0, sizeof *st);
    if (get)
        get(st, sizeof *st);
}

/* One step: the first activation is the batch; each layer's output is a
 * new activation; the backward pass updates the weights from them. */
static cudaError_t step(void *w[LAYERS], int s)
{
    void *act[LAYERS] = {0};
    cudaError_t e = cudaSuccess;
    int n = 0;
    for (; n < LAYERS && e == cudaSuccess; n++) {
        e = cudaMallocAsync(&act[n], (size_t)REGION_MB << 20, NULL);
        if (e != cudaSuccess)
            break;
        e = n == 0 ? init(act[0], 7u + (uint32_t)s) : forward(w[n], act[n - 1], act[n]);
        if (e == cudaSuccess && n == 0) /* layer 0 reads the batch it overwrites */
            e = forward(w[0], act[0], act[0]);
    }
    for (int l = n - 1; l >= 0 && e == cudaSuccess; l--)
        e = update(w[l], act[l]);
    for (int l = 0; l < n; l++)
        cudaFreeAsync(act[l], NULL);
    cudaError_t sync = cudaStreamSynchronize(NULL);
    return e != cudaSuccess ? e : sync;
}

/* Runs the loop; cudaSuccess with every weight as the host computes it. */
static cudaError_t train(void)
{
    void *w[LAYERS] = {0};
    cudaError_t e = cudaSuccess;
    for (int l = 0; l < LAYERS && e == cudaSuccess; l++) {
        e = cudaMalloc(&w[l], (size_t)REGION_MB << 20);
        if (e == cudaSuccess)
            e = init(w[l], 1000u + (uint32_t)l);
    }
    int64_t (*mark)(void) = (int64_t(*)(void))dlsym(RTLD_DEFAULT, "stagehand_step");
    for (int s = 0; s < STEPS && e == cudaSuccess; s++) {
        e = step(w, s);
        if (marks && mark) /* a JSONL line per step */
            mark();
    }
    if (e == cudaSuccess) {
        uint32_t *h = malloc((size_t)LAYERS * WORDS * 4), ref[LAYERS];
        assert_non_null(h);
        for (int l = 0; l < LAYERS; l++)
            assert_int_equal(
                cudaMemcpy(h + (size_t)l * WORDS, w[l], WORDS * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
        size_t bad = 0;
        for (size_t i = 0; i < WORDS; i++) {
            reference(i, ref);
            for (int l = 0; l < LAYERS; l++)
                bad += h[(size_t)l * WORDS + i] != ref[l];
        }
        free(h);
        assert_int_equal(bad, 0);
    }
    for (int l = 0; l < LAYERS; l++)
        if (w[l])
            cudaFree(w[l]);
    return e;
}

static void test_training_loop(void **state)
{
    (void)state;
    stagehand_stats_t before, after;
    simcuda_stats_t sim;
    stats(&before);
    cudaError_t e = train();
    stats(&after);
    simcuda_get_stats(&sim);
    uint64_t d2h = after.d2h_bytes - before.d2h_bytes, h2d = after.h2d_bytes - before.h2d_bytes;
    fprintf(stderr, "%s: card %d MB, peak %zu MB, %llu MB d2h, %llu MB h2d, %llu evictions\n",
            over ? "150%" : "95%", over ? OVER_MB : FIT_MB, sim.device_bytes_peak >> 20,
            (unsigned long long)(d2h >> 20), (unsigned long long)(h2d >> 20),
            (unsigned long long)(after.evictions - before.evictions));
    if (over && !preloaded) { /* as it would without us: out of memory */
        assert_int_equal(e, cudaErrorMemoryAllocation);
        return;
    }
    assert_int_equal(e, cudaSuccess);
    if (want_recorded && preloaded) /* the policy saw the launches, or it did not */
        assert_int_equal(after.launches_recorded > 0, strcmp(want_recorded, "some") == 0);
    if (want_recorded && preloaded && !strcmp(want_recorded, "none"))
        assert_int_equal(after.pinned_bytes, 0); /* far below: no host memory pinned ahead */
    if (!over) {
        /* The loop really came near the card's size... */
        assert_true(sim.device_bytes_peak >= (size_t)PEAK_MB << 20);
        /* ... and nothing moved. */
        assert_int_equal(d2h, 0);
        assert_int_equal(h2d, 0);
        assert_int_equal(after.evictions - before.evictions, 0);
        assert_int_equal(after.restores - before.restores, 0);
    } else {
        assert_true(after.evictions > before.evictions);
        assert_true(d2h > 0 && h2d > 0);
    }
}

/* A request larger than the card fails at once with the ordinary error,
 * evicting nothing of what the program holds. */
static void test_too_big_evicts_nothing(void **state)
{
    (void)state;
    if (want_recorded) /* on a card of another size */
        skip();
    void *w[LAYERS / 2], *big = NULL;
    for (int l = 0; l < LAYERS / 2; l++) {
        assert_int_equal(cudaMalloc(&w[l], (size_t)REGION_MB << 20), cudaSuccess);
        assert_int_equal(init(w[l], (uint32_t)l), cudaSuccess);
    }
    stagehand_stats_t before, after;
    stats(&before);
    size_t card = (size_t)(over ? OVER_MB : FIT_MB) << 20;
    assert_int_equal(cudaMalloc(&big, card + ((size_t)REGION_MB << 20)), cudaErrorMemoryAllocation);
    cudaGetLastError();
    stats(&after);
    assert_int_equal(after.evictions, before.evictions);
    assert_int_equal(after.d2h_bytes, before.d2h_bytes);
    assert_int_equal(after.host_bytes, before.host_bytes);
    for (int l = 0; l < LAYERS / 2; l++)
        assert_int_equal(cudaFree(w[l]), cudaSuccess);
}

/* Once the pool holds the card, a small allocation that passes through
 * still succeeds: the pool gives back room for it. */
static void test_pass_through_after_the_pool_filled_the_card(void **state)
{
    (void)state;
    if (!over || !preloaded)
        skip();
    enum { N = OVER_MB / REGION_MB + 4, SMALL = 8 };
    void *w[N], *small[SMALL];
    for (int l = 0; l < N; l++) {
        assert_int_equal(cudaMalloc(&w[l], (size_t)REGION_MB << 20), cudaSuccess);
        assert_int_equal(init(w[l], (uint32_t)l), cudaSuccess);
    }
    for (int i = 0; i < SMALL; i++) {
        assert_int_equal(cudaMalloc(&small[i], 512 << 10), cudaSuccess);
        assert_int_equal(cudaMemset(small[i], i, 512 << 10), cudaSuccess);
    }
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int i = 0; i < SMALL; i++)
        assert_int_equal(cudaFree(small[i]), cudaSuccess);
    for (int l = 0; l < N; l++)
        assert_int_equal(cudaFree(w[l]), cudaSuccess);
}

/* cudaMemGetInfo keeps CUDA's invariants whatever the program holds:
 * free <= total and free + held <= total, held counting evicted regions
 * (PyTorch asserts the second). While the program fits, total is the
 * budget; past the card it grows with what is held. */
static void test_mem_get_info_invariants(void **state)
{
    (void)state;
    if (!preloaded || want_recorded)
        skip();
    enum { N = OVER_MB / REGION_MB + 8 };
    void *w[N];
    int n = over ? N : (int)(FIT_MB / REGION_MB / 2);
    for (int l = 0; l < n; l++) {
        assert_int_equal(cudaMalloc(&w[l], (size_t)REGION_MB << 20), cudaSuccess);
        assert_int_equal(init(w[l], (uint32_t)l), cudaSuccess);
    }
    size_t free_b = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    stagehand_stats_t st;
    stats(&st);
    assert_true(free_b <= total);
    assert_true(free_b + st.live_bytes <= total);
    assert_true(total >= st.budget_bytes);
    if (over) /* more is held than the card: evicted, and counted */
        assert_true(st.host_bytes > 0 && total > st.budget_bytes);
    else
        assert_int_equal(total, st.budget_bytes);
    for (int l = 0; l < n; l++)
        assert_int_equal(cudaFree(w[l]), cudaSuccess);
}

/* The Conductor hints in the last JSONL line: a planner that never ran
 * never set them, and the prefetch window shows 0. */
static long last_prefetch_window(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *key = "\"prefetch_window\":", *at = NULL;
    for (const char *p = strstr(buf, key); p; p = strstr(p + 1, key))
        at = p;
    assert_non_null(at);
    return strtol(at + strlen(key), NULL, 10);
}

/* Runs the training loop in a child, marking steps and writing JSONL;
 * returns the prefetch window its last line shows. */
static long child_window(int on_over_card)
{
    char path[64], tf[128];
    snprintf(path, sizeof path, "/tmp/e2e_fits_%d_%d.jsonl", (int)getpid(), on_over_card);
    snprintf(tf, sizeof tf, "STAGEHAND_TELEMETRY_TELEMETRY_FILE=%s", path);
    unlink(path);
    const char *env[] = {"E2E_FITS_MARKS=1", tf, "SIMCUDA_VRAM_MB=101", "E2E_FITS_OVER=1", NULL};
    if (!on_over_card)
        env[2] = NULL; /* the card this one runs on */
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
    long w = last_prefetch_window(path);
    unlink(path);
    return w;
}

/* While everything fits, the launch path never plans: the planner's first
 * act (publishing the hints in force) never happens. On the smaller card
 * it does, so the check can fail. */
static void test_no_planning_while_it_fits(void **state)
{
    (void)state;
    if (!preloaded || marks || over || want_recorded)
        skip();
    assert_int_equal(child_window(0), 0);
    assert_true(child_window(1) > 0);
}

/* Far below the card (15% of it), the launches are not recorded for the
 * policy. Near it (95%), or with record_above_pct = 0, they are, so the
 * check can fail. */
static void test_no_recording_far_below_the_card(void **state)
{
    (void)state;
    if (!preloaded || marks || over || want_recorded)
        skip();
    static const char *const far[] = {"SIMCUDA_VRAM_MB=1024", "E2E_FITS_RECORDED=none", NULL};
    static const char *const always[] = {"SIMCUDA_VRAM_MB=1024", "E2E_FITS_RECORDED=some",
                                         "STAGEHAND_POLICY_RECORD_ABOVE_PCT=0", NULL};
    static const char *const near[] = {"E2E_FITS_RECORDED=some", NULL};
    assert_int_equal(e2e_rerun(saved_argv, far), 0);
    assert_int_equal(e2e_rerun(saved_argv, always), 0);
    assert_int_equal(e2e_rerun(saved_argv, near), 0);
}

/* The same program on the smaller card, in a child. */
static void test_oversubscribed(void **state)
{
    (void)state;
    if (over || marks || want_recorded)
        skip();
    static const char *const env[] = {"E2E_FITS_OVER=1", "SIMCUDA_VRAM_MB=101", NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static int setup(void **state)
{
    (void)state;
    size_t init_sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    size_t fwd_sizes[] = {sizeof(void *), sizeof(void *), sizeof(void *), sizeof(size_t)};
    size_t upd_sizes[] = {sizeof(void *), sizeof(void *), sizeof(size_t)};
    assert_int_equal(simcuda_register_kernel(k_init, "init", 3, init_sizes, 0), 0);
    assert_int_equal(simcuda_register_kernel(k_forward, "forward", 4, fwd_sizes, 0), 0);
    assert_int_equal(simcuda_register_kernel(k_update, "update", 3, upd_sizes, 0), 0);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_FITS_CONFIGURED")) {
        setenv("E2E_FITS_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "160", 1);
        setenv("STAGEHAND_CONFIG", "/dev/null", 1); /* the built-in defaults, nothing else */
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    over = getenv("E2E_FITS_OVER") != NULL;
    marks = getenv("E2E_FITS_MARKS") != NULL;
    want_recorded = getenv("E2E_FITS_RECORDED");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_training_loop),
        cmocka_unit_test(test_too_big_evicts_nothing),
        cmocka_unit_test(test_pass_through_after_the_pool_filled_the_card),
        cmocka_unit_test(test_mem_get_info_invariants),
        cmocka_unit_test(test_oversubscribed),
        cmocka_unit_test(test_no_planning_while_it_fits),
        cmocka_unit_test(test_no_recording_far_below_the_card),
    };
    char name[64];
    snprintf(name, sizeof name, "e2e_fits %s (%s)", over ? "150%" : "95%",
             preloaded ? "preloaded" : "disabled");
    return cmocka_run_group_tests_name(name, tests, setup, NULL);
}
