/* test_e2e_process.c — the library inside a real process's life:
 * fork() with evicted regions (the child does no CUDA, like a DataLoader
 * worker), signals delivered while regions are being evicted and restored,
 * and exit while copies and kernels are still in flight.
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
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REGION (16u << 20)
#define WORDS  (REGION / 4)
#define NREG   24 /* 384 MB against a 256 MB budget */

static int preloaded;
static char **saved_argv;
static const dim3 one = {1, 1, 1};

static void k_bump(void **a) /* (uint32_t *p, size_t n, uint32_t by) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t by = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] += by + (uint32_t)i;
}

static cudaError_t bump(void *p, uint32_t by, cudaStream_t s)
{
    size_t n = WORDS;
    void *args[] = {&p, &n, &by};
    return cudaLaunchKernel((const void *)k_bump, one, one, args, 0, s);
}

static size_t wrong_words(const void *d, uint32_t sum, uint32_t times)
{
    uint32_t *h = malloc(REGION);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, REGION, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += h[i] != sum + times * (uint32_t)i;
    free(h);
    return bad;
}

static uint64_t evictions(void)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    stagehand_stats_t st = {0};
    if (get)
        get(&st, sizeof st);
    return st.evictions;
}

static void alloc_all(void **r)
{
    for (int i = 0; i < NREG; i++) {
        assert_int_equal(cudaMalloc(&r[i], REGION), cudaSuccess);
        assert_int_equal(cudaMemset(r[i], 0, REGION), cudaSuccess);
        assert_int_equal(bump(r[i], (uint32_t)i, NULL), cudaSuccess);
    }
}

static void free_all(void **r)
{
    for (int i = 0; i < NREG; i++)
        assert_int_equal(cudaFree(r[i]), cudaSuccess);
}

static void test_fork_child_without_cuda(void **state)
{
    (void)state;
    void *r[NREG];
    alloc_all(r);
    if (preloaded)
        assert_true(evictions() > 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* A DataLoader-like worker: host work only, then a normal exit. */
        volatile uint64_t acc = 0;
        for (uint64_t i = 0; i < 10000000; i++)
            acc += i * i;
        _exit(acc ? 0 : 1); /* as Python multiprocessing workers end */
    }
    for (int i = 0; i < NREG; i++) /* the parent keeps evicting and restoring */
        assert_int_equal(bump(r[i], 1, NULL), cudaSuccess);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    for (int i = 0; i < NREG; i++)
        assert_int_equal(wrong_words(r[i], (uint32_t)i + 1, 2), 0);
    free_all(r);
}

static volatile sig_atomic_t signals_seen;

static void on_usr1(int sig)
{
    (void)sig;
    signals_seen++;
}

struct pelter {
    pthread_t target;
    atomic_int stop;
};

static void *pelt(void *arg)
{
    struct pelter *p = arg;
    struct timespec ts = {0, 200000};
    while (!atomic_load(&p->stop)) {
        pthread_kill(p->target, SIGUSR1);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_signals_mid_eviction(void **state)
{
    (void)state;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1; /* no SA_RESTART: interrupted waits must cope */
    sigaction(SIGUSR1, &sa, NULL);
    struct pelter p = {pthread_self(), 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pelt, &p), 0);
    void *r[NREG];
    alloc_all(r);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < NREG; i++)
            assert_int_equal(bump(r[i], 1, NULL), cudaSuccess);
    atomic_store(&p.stop, 1);
    pthread_join(t, NULL);
    for (int i = 0; i < NREG; i++)
        assert_int_equal(wrong_words(r[i], (uint32_t)i + 2, 3), 0);
    assert_true(signals_seen > 10);
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    assert_int_equal(sim.faults, 0);
    free_all(r);
    signal(SIGUSR1, SIG_DFL);
}

/* The child: queue work and copies, then exit at once. */
static int exit_in_flight(void)
{
    void *r[NREG];
    for (int i = 0; i < NREG; i++) {
        if (cudaMalloc(&r[i], REGION) != cudaSuccess || bump(r[i], 1, NULL) != cudaSuccess)
            return 2;
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    static uint32_t host[WORDS];
    for (int i = 0; i < NREG; i++)
        cudaMemcpyAsync(host, r[i], REGION, cudaMemcpyDeviceToHost, s);
    exit(0); /* no synchronisation, no frees */
}

static void test_exit_with_work_in_flight(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("E2E_PROCESS_MODE", "exit", 1);
        e2e_reexec(saved_argv);
        _exit(127);
    }
    int status = 0;
    for (int waited = 0; waited < 300; waited++) { /* 30 s: a hang fails the test */
        if (waitpid(pid, &status, WNOHANG) == pid)
            break;
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        if (waited == 299) {
            kill(pid, SIGKILL);
            fail_msg("the process hung at exit");
        }
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static int setup(void **state)
{
    (void)state;
    size_t sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    return simcuda_register_kernel(k_bump, "bump", 3, sizes, 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_PROCESS_CONFIGURED")) {
        setenv("E2E_PROCESS_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "512", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "256", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    if (getenv("E2E_PROCESS_MODE")) {
        setup(NULL);
        return exit_in_flight();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_child_without_cuda),
        cmocka_unit_test(test_signals_mid_eviction),
        cmocka_unit_test(test_exit_with_work_in_flight),
    };
    return cmocka_run_group_tests_name(
        preloaded ? "e2e_process (preloaded)" : "e2e_process (disabled)", tests, setup, NULL);
}
