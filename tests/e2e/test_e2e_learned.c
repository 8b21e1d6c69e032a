/* test_e2e_learned.c — the learned scheduler against the reactive and LRU
 * baselines, end to end on the simulated GPU, and stagehand-sim's
 * prediction of it.
 *
 * A training-like loop (forward over N weight regions, backward in reverse
 * writing gradients, an optimizer reading weight, gradient and state of
 * each block) three times the budget, with copies and kernels that both
 * take time (SIMCUDA_PCIE_GBPS, each kernel's registered duration). The
 * loop runs in three children — reactive (eviction = lru, prefetch off),
 * lru with prefetch, and learned — each reporting its steady step time (the
 * mean of the steps after the first two) and recording a trace with
 * measured launch durations. The parent prints how learned compares, and
 * how close stagehand-sim, replaying the learned trace with the same budget
 * and link, comes to the measured step time. Every child also checks that
 * the bytes it computed are exact.
 *
 * With STAGEHAND_DISABLE=1 the loop does not fit and there is nothing to
 * compare: the test skips.
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

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCKS    8
#define REGION_MB 8
#define BUDGET_MB 64 /* weights, gradients and states: 192 MB */
#define VRAM_MB   256
#define PCIE_GBPS "2"
#define KERNEL_US 4000
#define STEPS     6
#define WORDS     (((size_t)REGION_MB << 20) / 4)
/* One 8 MB copy takes a kernel's time on this link: with the default two
 * copies in flight per direction the link, not the policy, sets the pace.
 * The library and stagehand-sim both read this file. */
/* Fixed watermarks: the figures compared (docs/POLICY.md) were taken with
 * them, and they keep headroom for the prefetches to land in. Clean regions
 * off: the simulated GPU runs their fingerprints on the CPU, inside remap
 * windows, about 2 ms for each 8 MB region, which a card does in
 * microseconds; that cost, not the scheduling, would be what is measured
 * (test_e2e_clean covers clean regions). */
#define CONFIG                                                                                     \
    "[transfer]\nmax_inflight_d2h = 8\nmax_inflight_h2d = 8\n"                                     \
    "[budget]\nvram_high_watermark_mb = 80%\nvram_low_watermark_mb = 60%\n"                        \
    "[policy]\nclean_skip = false\n"

/* ---- the kernels: each touches a few words of every region it is given
 * (the bytes stay checkable; the registered duration is the time). ---- */

static void touch(uint32_t *p, uint32_t add)
{
    p[0] += add;
    p[WORDS / 2] += add;
    p[WORDS - 1] += add;
}

static void k_fwd(void **a) /* (weight, act) */
{
    uint32_t *w = *(uint32_t **)a[0], *x = *(uint32_t **)a[1];
    x[0] += w[0];
}

static void k_bwd(void **a) /* (weight, grad) */
{
    uint32_t *w = *(uint32_t **)a[0], *g = *(uint32_t **)a[1];
    (void)w;
    touch(g, 1);
}

static void k_opt(void **a) /* (weight, grad, state) */
{
    uint32_t *w = *(uint32_t **)a[0], *g = *(uint32_t **)a[1], *s = *(uint32_t **)a[2];
    touch(s, 1);
    touch(w, g[0]);
}

static dim3 one = {1, 1, 1};

static int failures;

static void launch(void (*fn)(void **), void **args)
{
    failures += cudaLaunchKernel((const void *)fn, one, one, args, 0, NULL) != cudaSuccess;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void mark_step(void)
{
    if (getenv("E2E_LEARNED_NOMARKS"))
        return; /* the scheduler finds the steps itself */
    int64_t (*step)(void) = (int64_t(*)(void))dlsym(RTLD_DEFAULT, "stagehand_step");
    if (step)
        step();
}

static uint32_t word(const void *p, size_t i)
{
    uint32_t v = UINT32_MAX;
    failures += cudaMemcpy(&v, (const uint32_t *)p + i, 4, cudaMemcpyDeviceToHost) != cudaSuccess;
    return v;
}

/* One line per step on stderr, with the library's moves so far. */
static void print_step(int step, double dt)
{
    uint64_t st[32] = {0};
    int (*get)(void *, size_t) =
        (int (*)(void *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    if (get)
        get(st, sizeof st);
    /* evictions, restores, d2h and h2d bytes, remap windows (stagehand.h order) */
    fprintf(stderr,
            "step %d: %.4f s  evictions %llu restores %llu d2h %llu MB h2d %llu MB "
            "windows %llu\n",
            step, dt, (unsigned long long)st[19], (unsigned long long)st[20],
            (unsigned long long)(st[21] >> 20), (unsigned long long)(st[22] >> 20),
            (unsigned long long)st[28]);
}

/* The learned scheduler found the steps (from the marks, or without them
 * from the launches repeating), followed a recording and prefetched: what
 * the library's statistics say, for a program to check. */
static int scheduler_followed(void)
{
    stagehand_stats_t st = {0};
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    if (!get || get(&st, sizeof st) != 0)
        return 0;
    fprintf(stderr,
            "steps_found %lld followed %llu departed %llu prefetches %llu (%llu committed) "
            "stalls %llu (%llu us) windows %llu us: drain %llu, copies %llu, remap %llu\n",
            (long long)st.steps_found, (unsigned long long)st.steps_followed,
            (unsigned long long)st.steps_departed, (unsigned long long)st.prefetches,
            (unsigned long long)st.prefetch_commits, (unsigned long long)st.stalls,
            (unsigned long long)st.stall_us, (unsigned long long)st.window_us,
            (unsigned long long)st.drain_us, (unsigned long long)st.copy_wait_us,
            (unsigned long long)st.remap_us);
    fprintf(stderr,
            "early evictions %llu (%llu committed) scan %llu us (waited %llu us, %llu MB) "
            "prefilters %llu, scans skipped %llu, fingerprints %llu\n",
            (unsigned long long)st.early_evictions, (unsigned long long)st.early_commits,
            (unsigned long long)st.scan_us, (unsigned long long)st.scan_wait_us,
            (unsigned long long)(st.scanned_bytes >> 20), (unsigned long long)st.prefilters,
            (unsigned long long)st.scans_skipped, (unsigned long long)st.fingerprints);
    /* Without marks, two whole steps alike are needed before the first
     * boundary is found. */
    return st.steps_found >= STEPS - 3 && st.steps_followed >= 1 && st.prefetches >= 1 &&
           st.prefetch_commits >= 1 && st.window_us >= st.drain_us + st.copy_wait_us + st.remap_us;
}

/* The loop; prints "step_s=..." (steady mean) on stdout. */
static int child_main(void)
{
    void *w[BLOCKS], *g[BLOCKS], *s[BLOCKS], *x;
    size_t bytes = (size_t)REGION_MB << 20;
    for (int i = 0; i < BLOCKS; i++) {
        if (cudaMalloc(&w[i], bytes) || cudaMalloc(&g[i], bytes) || cudaMalloc(&s[i], bytes))
            return 2;
        cudaMemset(w[i], 0, bytes);
        cudaMemset(g[i], 0, bytes);
        cudaMemset(s[i], 0, bytes);
    }
    if (cudaMalloc(&x, 2u << 20) || cudaMemset(x, 0, 2u << 20))
        return 2;
    cudaDeviceSynchronize();
    double sum = 0;
    for (int step = 0; step < STEPS; step++) {
        double t0 = now_s();
        mark_step();
        for (int i = 0; i < BLOCKS; i++) {
            void *args[] = {&w[i], &x};
            launch(k_fwd, args);
        }
        for (int i = BLOCKS - 1; i >= 0; i--) {
            void *args[] = {&w[i], &g[i]};
            launch(k_bwd, args);
        }
        for (int i = 0; i < BLOCKS; i++) {
            void *args[] = {&w[i], &g[i], &s[i]};
            launch(k_opt, args);
        }
        cudaDeviceSynchronize();
        double dt = now_s() - t0;
        print_step(step, dt);
        if (step >= 2)
            sum += dt;
    }
    /* g counts the steps; w adds 1 + 2 + ... + STEPS; s counts the steps. */
    uint32_t want_w = STEPS * (STEPS + 1) / 2;
    for (int i = 0; i < BLOCKS; i++)
        for (size_t k = 0; k < 3; k++) {
            size_t at = k == 0 ? 0 : k == 1 ? WORDS / 2 : WORDS - 1;
            if (word(g[i], at) != STEPS || word(s[i], at) != STEPS || word(w[i], at) != want_w) {
                fprintf(stderr, "block %d word %zu: wrong bytes\n", i, at);
                return 4;
            }
        }
    if (failures)
        return 5;
    if (getenv("E2E_LEARNED_EXPECT") && !scheduler_followed())
        return 6;
    printf("step_s=%.6f\n", sum / (STEPS - 2));
    fflush(stdout);
    return 0;
}

/* ---- the parent ---- */

static const char *build_dir(void)
{
    const char *b = getenv("STAGEHAND_TEST_BUILD");
    return b && *b ? b : "build";
}

/* Runs the loop under an eviction policy, with or without prefetch; the
 * steady step time, or -1. */
static double run_child(const char *config, const char *policy, int prefetch, const char *trace,
                        const char *env)
{
    char cmd[1024];
    snprintf(
        cmd, sizeof cmd,
        "E2E_LEARNED_CHILD=1 STAGEHAND_CONFIG=%s STAGEHAND_POLICY_EVICTION=%s "
        "STAGEHAND_POLICY_PREFETCH_ENABLED=%s STAGEHAND_TRACE=%s STAGEHAND_GENERAL_LOG_LEVEL=warn "
        "%s /proc/%d/exe",
        config, policy, prefetch ? "true" : "false", trace, env, (int)getpid());
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    double step = -1;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "step_s=%lf", &step) == 1)
            break;
    int rc = pclose(f);
    if (rc != 0) {
        fprintf(stderr, "%s child exited with status %d\n", policy, rc);
        return -1;
    }
    return step;
}

/* The simulated card's rates, GB/s, for its two kernels that read a whole
 * region: the fingerprint and the pointer prefilter. It runs them as
 * clean/hash.c on the CPU, where a card reads its memory at terabytes a
 * second. Every early eviction pays two fingerprints and every eviction a
 * prefilter (docs/POLICY.md), so the model charges them at these rates, as
 * it charges copies at the simulated link's. The fastest of a few timings
 * of one region's bytes. */
struct rates {
    double fingerprint, prefilter;
};

static double seconds(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

static struct rates kernel_rates(void)
{
    const size_t n = (size_t)REGION_MB << 20;
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    memset(buf, 0x5a, n);
    struct sh_clean_key k;
    assert_int_equal(sh_clean_key_random(&k), 0);
    double fp = 1e9, pf = 1e9;
    int hits = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t x[2];
        struct timespec a, b, c;
        clock_gettime(CLOCK_MONOTONIC, &a);
        sh_clean_blocks(&k, buf, n, x);
        clock_gettime(CLOCK_MONOTONIC, &b);
        hits += sh_clean_ptr_candidate((const uint32_t *)(void *)buf, n / 4, 0x7f00u, 2);
        clock_gettime(CLOCK_MONOTONIC, &c);
        fp = seconds(&a, &b) < fp ? seconds(&a, &b) : fp;
        pf = seconds(&b, &c) < pf ? seconds(&b, &c) : pf;
    }
    free(buf);
    assert_int_equal(hits, 0); /* 0x5a5a5a5a is no pointer's high half there */
    return (struct rates){(double)n / fp / 1e9, (double)n / pf / 1e9};
}

/* stagehand-sim's steady step time for the trace, or -1. */
static double simulate(const char *config, const char *trace)
{
    char cmd[1024];
    struct rates k = kernel_rates();
    printf("simulated card's fingerprint: %.2f GB/s, prefilter: %.2f GB/s\n", k.fingerprint,
           k.prefilter);
    snprintf(cmd, sizeof cmd,
             "%s/stagehand-sim --trace %s --config %s --vram-gb %.6f --pcie-gbps %s "
             "--hbm-gbps %.3f --prefilter-gbps %.3f --policy learned",
             build_dir(), trace, config, (double)BUDGET_MB / 1024.0, PCIE_GBPS, k.fingerprint,
             k.prefilter);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    double step = -1;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "step_s=");
        if (p && sscanf(p, "step_s=%lf", &step) == 1)
            break;
    }
    pclose(f);
    return step;
}

static void test_learned_beats_reactive(void **state)
{
    (void)state;
    if (!dlsym(RTLD_DEFAULT, "stagehand_get_stats") || getenv("STAGEHAND_DISABLE"))
        skip(); /* disabled: the loop does not fit, there is nothing to compare */
    char traces[3][40], config[] = "/tmp/stagehand-e2e-XXXXXX.ini";
    for (int i = 0; i < 3; i++) {
        snprintf(traces[i], sizeof traces[i], "/tmp/stagehand-e2e-%d-XXXXXX", i);
        int fd = mkstemp(traces[i]);
        assert_true(fd >= 0);
        close(fd);
    }
    int fd = mkstemps(config, 4);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, CONFIG, strlen(CONFIG)), (ssize_t)strlen(CONFIG));
    close(fd);
    /* reactive: evict least recently used on demand, restore on a miss */
    double reactive = run_child(config, "lru", 0, traces[0], "");
    double lru = run_child(config, "lru", 1, traces[1], "");
    double learned = run_child(config, "learned", 1, traces[2], "E2E_LEARNED_EXPECT=1");
    double predicted = simulate(config, traces[2]);
    double err = predicted > 0 ? fabs(predicted - learned) / learned : 1;
    printf("learned_step_s=%.4f reactive_step_s=%.4f lru_step_s=%.4f ratio=%.3f "
           "sim_learned_step_s=%.4f sim_error=%.1f%%\n",
           learned, reactive, lru, learned / reactive, predicted, err * 100);
    fflush(stdout);
    if (!getenv("E2E_LEARNED_KEEP")) {
        for (int i = 0; i < 3; i++)
            unlink(traces[i]);
        unlink(config);
    }
    assert_true(reactive > 0 && lru > 0 && learned > 0); /* all completed, exact bytes */
    assert_true(predicted > 0);
    /* Times are printed, not asserted by default: timing belongs to the
     * benchmarks, and sanitizer builds run this too (docs/POLICY.md has
     * the figures). E2E_LEARNED_STRICT=1 asserts them. */
    if (getenv("E2E_LEARNED_STRICT")) {
        assert_true(learned < reactive);
        assert_true(err <= 0.15);
    }
}

/* Without stagehand_step(), the scheduler finds the steps itself and
 * follows them as it does with marks (scheduler_followed, in the child). */
static void test_learned_finds_unmarked_steps(void **state)
{
    (void)state;
    if (!dlsym(RTLD_DEFAULT, "stagehand_get_stats") || getenv("STAGEHAND_DISABLE"))
        skip();
    char trace[] = "/tmp/stagehand-e2e-u-XXXXXX", config[] = "/tmp/stagehand-e2e-XXXXXX.ini";
    int fd = mkstemp(trace);
    assert_true(fd >= 0);
    close(fd);
    fd = mkstemps(config, 4);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, CONFIG, strlen(CONFIG)), (ssize_t)strlen(CONFIG));
    close(fd);
    double step =
        run_child(config, "learned", 1, trace, "E2E_LEARNED_EXPECT=1 E2E_LEARNED_NOMARKS=1");
    unlink(trace);
    unlink(config);
    assert_true(step > 0);
}

static int register_kernels(void)
{
    size_t two[] = {sizeof(void *), sizeof(void *)};
    size_t three[] = {sizeof(void *), sizeof(void *), sizeof(void *)};
    return simcuda_register_kernel(k_fwd, "fwd", 2, two, KERNEL_US) ||
           simcuda_register_kernel(k_bwd, "bwd", 2, two, KERNEL_US) ||
           simcuda_register_kernel(k_opt, "opt", 3, three, KERNEL_US);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_LEARNED_CONFIGURED")) {
        /* The library reads its configuration at load: set it, start again. */
        setenv("E2E_LEARNED_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("SIMCUDA_PCIE_GBPS", PCIE_GBPS, 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "64", 1);
        setenv("STAGEHAND_POOL_SLABS_PER_CLASS", "0", 1);
        setenv("STAGEHAND_POOL_PREPIN_MB", "0", 1);
        e2e_reexec(argv);
        return 1;
    }
    if (getenv("E2E_LEARNED_CHILD"))
        return register_kernels() ? 2 : child_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learned_beats_reactive),
        cmocka_unit_test(test_learned_finds_unmarked_steps),
    };
    return cmocka_run_group_tests_name("e2e_learned", tests, NULL, NULL);
}
