/* test_e2e_faults.c — the fault-injection matrix.
 *
 * An eviction- and restore-heavy workload runs in a child process once for
 * every (driver call, nth call) pair, with SIMCUDA_FAIL making that call
 * fail. Each outcome must be one of two: the library recovers and every
 * byte is right, or the program gets a CUDA error (as it would without us)
 * and every byte of every region it still holds is right. On top of that:
 * no device memory unaccounted for at the end (a leak), and no hang.
 *
 * Failures are injected once, twice in a row, for good (cleared with
 * simcuda_fail_clear before the check, so the bytes are still checked), and
 * two calls together; a few cases run the same work as CUDA graphs.
 * FAULT_MATRIX=full (make faults) runs the whole sweep; the summary line
 * reads "N injected, N recovered-or-propagated, N lost, N leaked, N hung,
 * N contexts lost". A context lost is an illegal address the program did
 * not cause.
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
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REGION (2u << 20)
#define WORDS  (REGION / 4)
#define NREG   20 /* 40 MB against a 24 MB budget */

enum {
    OK_RECOVERED = 0,
    OK_PROPAGATED = 3,
    LOST = 4,
    LEAKED = 5,
    SETUP = 6,
    CTX_LOST = 7,
    NO_EVICTION = 8 /* E2E_FAULTS_MUST_EVICT: the library never evicted */
};

static char **saved_argv;
static int preloaded;
static const dim3 one = {1, 1, 1};

static void k_bump(void **a) /* (uint32_t *p, uint32_t by) */
{
    uint32_t *p = *(uint32_t **)a[0];
    uint32_t by = *(uint32_t *)a[1];
    for (size_t i = 0; i < WORDS; i++)
        p[i] += by + (uint32_t)i;
}

/* ---- the workload (child) ---- */

/* k_bump over r by `by`: a kernel launch, or with E2E_FAULTS_GRAPH a graph
 * of that launch, captured, instantiated and launched (CUDA graphs as a
 * program that replays them would, one per call here). */
static cudaError_t bump(void *r, uint32_t by)
{
    void *args[] = {&r, &by};
    if (!getenv("E2E_FAULTS_GRAPH"))
        return cudaLaunchKernel((const void *)k_bump, one, one, args, 0, NULL);
    static cudaStream_t s;
    cudaError_t e = s ? cudaSuccess : cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    if (e == cudaSuccess)
        e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (e == cudaSuccess) {
        cudaError_t l = cudaLaunchKernel((const void *)k_bump, one, one, args, 0, s);
        e = cudaStreamEndCapture(s, &g);
        e = l != cudaSuccess ? l : e;
    }
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&x, g, 0);
    if (e == cudaSuccess)
        e = cudaGraphLaunch(x, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (x)
        cudaGraphExecDestroy(x);
    if (g)
        cudaGraphDestroy(g);
    return e;
}

static int workload(void)
{
    size_t sizes[] = {sizeof(void *), sizeof(uint32_t)};
    simcuda_register_kernel(k_bump, "bump", 2, sizes, 0);
    void *r[NREG] = {0};
    uint32_t sum[NREG] = {0}, times[NREG] = {0};
    int errors = 0;
    for (int i = 0; i < NREG; i++)
        if (cudaMalloc(&r[i], REGION) != cudaSuccess ||
            cudaMemset(r[i], 0, REGION) != cudaSuccess) {
            errors++;
            if (r[i])
                cudaFree(r[i]);
            r[i] = NULL;
        }
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < NREG; i++) {
            if (!r[i])
                continue;
            uint32_t by = (uint32_t)(i + pass);
            if (bump(r[i], by) == cudaSuccess) {
                sum[i] += by;
                times[i]++;
            } else {
                errors++;
            }
        }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) /* the program's own call failed: it sees the error */
        errors++;
    /* The failure passes (persistent ones too): what is left must be whole. */
    simcuda_fail_clear();
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    if (sim.faults)
        return CTX_LOST; /* an access the program did not cause: the context is gone */
    if (cudaDeviceSynchronize() != cudaSuccess)
        return LOST;
    uint32_t *h = malloc(REGION);
    for (int i = 0; h && i < NREG; i++) {
        if (!r[i])
            continue;
        if (cudaMemcpy(h, r[i], REGION, cudaMemcpyDeviceToHost) != cudaSuccess)
            return LOST;
        for (size_t k = 0; k < WORDS; k++)
            if (h[k] != sum[i] + times[i] * (uint32_t)k) {
                fprintf(stderr, "faults: region %d word %zu wrong\n", i, k);
                return LOST;
            }
    }
    free(h);
    for (int i = 0; i < NREG; i++)
        if (r[i] && cudaFree(r[i]) != cudaSuccess)
            errors++;
    /* Leak check: what the device holds is what the library says it keeps. */
    simcuda_get_stats(&sim);
    stagehand_stats_t st = {0};
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    if (get)
        get(&st, sizeof st);
    if (sim.device_bytes_in_use > st.device_bytes) {
        fprintf(stderr, "faults: %zu device bytes unaccounted for\n",
                sim.device_bytes_in_use - (size_t)st.device_bytes);
        return LEAKED;
    }
    if (getenv("E2E_FAULTS_MUST_EVICT") && st.evictions == 0)
        return NO_EVICTION;
    return errors ? OK_PROPAGATED : OK_RECOVERED;
}

/* ---- the matrix (parent) ---- */

static const char *const calls[] = {
    "cuMemCreate",      "cuMemMap",
    "cuMemSetAccess",   "cuMemUnmap",
    "cuMemRelease",     "cuMemAddressReserve",
    "cuMemAddressFree", "cuMemcpyAsync",
    "cuEventCreate",    "cuEventRecord",
    "cuEventQuery",     "cuEventSynchronize",
    "cuCtxSynchronize", "cuStreamCreateWithPriority",
    "cuptiSubscribe",
};

static int run_one(const char *spec, int graph)
{
    pid_t pid = fork();
    if (pid < 0)
        return SETUP;
    if (pid == 0) {
        int null = open("/dev/null", 1);
        if (null >= 0)
            dup2(null, 2);
        setenv("SIMCUDA_FAIL", spec, 1);
        setenv("E2E_FAULTS_CHILD", "1", 1);
        if (graph)
            setenv("E2E_FAULTS_GRAPH", "1", 1);
        e2e_reexec(saved_argv);
        _exit(SETUP);
    }
    for (int waited = 0; waited < 400; waited++) { /* 20 s */
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : LOST;
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1; /* hung */
}

enum { ONCE, TWICE, ALWAYS }; /* how a call fails from its nth on */

struct tally {
    int injected, fine, lost, leaked, hung, ctx;
};

/* SIMCUDA_FAIL for call failing at nth as mode says, and other (if any)
 * failing once at its own nth call. */
static void spec_of(char *b, size_t n, const char *call, int nth, int mode, const char *other)
{
    int k = mode == TWICE ? snprintf(b, n, "%s:%d,%s:%d", call, nth, call, nth + 1)
                          : snprintf(b, n, "%s:%d%s", call, nth, mode == ALWAYS ? "+" : "");
    if (other)
        snprintf(b + k, n - (size_t)k, ",%s:%d", other, nth);
}

static void run_case_as(struct tally *t, const char *call, int nth, int mode, const char *other,
                        int graph)
{
    char spec[160];
    spec_of(spec, sizeof spec, call, nth, mode, other);
    int rc = run_one(spec, graph);
    t->injected++;
    const char *what = NULL;
    if (rc == OK_RECOVERED || rc == OK_PROPAGATED)
        t->fine++;
    else if (rc == LEAKED)
        t->leaked++, what = "leaked";
    else if (rc == -1)
        t->hung++, what = "hung";
    else if (rc == CTX_LOST)
        t->ctx++, what = "context lost";
    else
        t->lost++, what = "lost";
    if (what)
        fprintf(stderr, "faults: %s%s -> %s\n", spec, graph ? " (graphs)" : "", what);
}

static void run_case(struct tally *t, const char *call, int nth, int mode, const char *other)
{
    run_case_as(t, call, nth, mode, other, 0);
}

#define NCALLS (sizeof calls / sizeof *calls)

/* FAULT_MATRIX=full: every call at every nth, once, twice and for good,
 * and every pair of calls failing together. */
static void full_sweep(struct tally *t)
{
    static const int nth[] = {1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144};
    static const int pair_nth[] = {3, 21};
    for (size_t c = 0; c < NCALLS; c++)
        for (size_t k = 0; k < sizeof nth / sizeof *nth; k++)
            for (int mode = ONCE; mode <= ALWAYS; mode++)
                run_case(t, calls[c], nth[k], mode, NULL);
    for (size_t c = 0; c < NCALLS; c++)
        for (size_t d = c + 1; d < NCALLS; d++)
            for (size_t k = 0; k < sizeof pair_nth / sizeof *pair_nth; k++)
                run_case(t, calls[c], pair_nth[k], ONCE, calls[d]);
}

/* make test: every call once at a few nth, and one of each other kind. */
static void quick_sweep(struct tally *t, size_t nn)
{
    static const int nth[] = {1, 3, 10, 40};
    static const struct {
        const char *call;
        int nth, mode;
        const char *other;
    } extra[] = {
        {"cuMemMap", 3, TWICE, NULL},
        {"cuMemUnmap", 3, TWICE, NULL},
        {"cuMemMap", 10, ALWAYS, NULL},
        {"cuEventSynchronize", 3, ALWAYS, NULL},
        {"cuMemMap", 3, ONCE, "cuMemUnmap"},
        {"cuMemcpyAsync", 10, ONCE, "cuEventQuery"},
        /* a copy's event wait failing mid-move (the full sweep found it) */
        {"cuEventSynchronize", 13, ONCE, NULL},
        {"cuEventSynchronize", 21, TWICE, NULL},
        /* the driver mapping nothing more, late: a hole is left, work that
         * might reach it is refused, and it is mapped again once it can be */
        {"cuMemMap", 144, ALWAYS, NULL},
        {"cuMemSetAccess", 144, ALWAYS, NULL},
        /* unmapping nothing more: a prefetch's copy address is stranded */
        {"cuMemUnmap", 55, ALWAYS, NULL},
        {"cuMemUnmap", 89, ALWAYS, NULL},
    };
    for (size_t c = 0; c < NCALLS; c++)
        for (size_t k = 0; k < nn; k++)
            run_case(t, calls[c], nth[k], ONCE, NULL);
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++)
        run_case(t, extra[i].call, extra[i].nth, extra[i].mode, extra[i].other);
    /* The same work as CUDA graphs: their launches restore too. */
    static const struct {
        const char *call;
        int nth, mode;
    } graphs[] = {{"cuMemMap", 3, ONCE},
                  {"cuMemMap", 144, ALWAYS},
                  {"cuMemSetAccess", 144, ALWAYS},
                  {"cuMemcpyAsync", 10, ONCE},
                  {"cuEventSynchronize", 13, ONCE}};
    for (size_t i = 0; i < sizeof graphs / sizeof *graphs; i++)
        run_case_as(t, graphs[i].call, graphs[i].nth, graphs[i].mode, NULL, 1);
}

static void test_matrix(void **state)
{
    (void)state;
    if (!preloaded) /* the matrix is about the library */
        skip();
    int wide = getenv("FAULT_MATRIX") && strcmp(getenv("FAULT_MATRIX"), "full") == 0;
    const char *san = getenv("SAN"); /* under a sanitizer each run is slower: fewer */
    struct tally t = {0};
    if (wide)
        full_sweep(&t);
    else
        quick_sweep(&t, san && *san ? 2 : 4);
    printf("fault matrix: %d injected, %d recovered-or-propagated, %d lost, %d leaked, %d hung, "
           "%d contexts lost\n",
           t.injected, t.fine, t.lost, t.leaked, t.hung, t.ctx);
    assert_int_equal(t.lost, 0);
    assert_int_equal(t.leaked, 0);
    assert_int_equal(t.hung, 0);
    assert_int_equal(t.ctx, 0);
}

/* A call the library makes once, as it starts, failing once or twice: the
 * library and eviction still come up, and the run is as without the fault. */
static void test_startup_failures_recover(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    static const char *const specs[] = {
        "cuDeviceGetAttribute:1",
        "cuDeviceGetAttribute:2",
        "cuMemGetAllocationGranularity:1",
        "cuStreamCreateWithPriority:1",
        "cuStreamCreateWithPriority:2",
        "cuMemCreate:1",
        "cuMemCreate:1,cuMemCreate:2",
        "cuMemAddressReserve:1",
        "cuMemMap:1",
    };
    setenv("E2E_FAULTS_MUST_EVICT", "1", 1);
    int bad = 0;
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        int rc = run_one(specs[i], 0);
        if (rc != OK_RECOVERED) {
            fprintf(stderr, "faults: %s at start-up -> %d\n", specs[i], rc);
            bad++;
        }
    }
    unsetenv("E2E_FAULTS_MUST_EVICT");
    assert_int_equal(bad, 0);
}

/* Drivers of the CUDA 12 era: the library comes up on each from 12.2 (it
 * asks for entry points at 12.0, newer ones where the driver has them) and
 * evicts (host-located VMM); on 12.0 it passes through (test_e2e_limits'
 * test_cuda_12_0_passes_through checks what it says). Every byte is right
 * on each. */
static void test_cuda12_drivers(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    static const struct {
        const char *version;
        int want;
    } drivers[] = {
        {"12000", NO_EVICTION},  {"12020", OK_RECOVERED}, {"12030", OK_RECOVERED},
        {"12040", OK_RECOVERED}, {"12080", OK_RECOVERED},
    };
    setenv("E2E_FAULTS_MUST_EVICT", "1", 1);
    int bad = 0;
    for (size_t i = 0; i < sizeof drivers / sizeof *drivers; i++) {
        setenv("SIMCUDA_DRIVER_VERSION", drivers[i].version, 1);
        int rc = run_one("", 0);
        if (rc != drivers[i].want) {
            fprintf(stderr, "faults: driver %s -> %d, want %d\n", drivers[i].version, rc,
                    drivers[i].want);
            bad++;
        }
    }
    unsetenv("SIMCUDA_DRIVER_VERSION");
    unsetenv("E2E_FAULTS_MUST_EVICT");
    assert_int_equal(bad, 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (getenv("E2E_FAULTS_CHILD"))
        return workload();
    if (!getenv("E2E_FAULTS_CONFIGURED")) {
        setenv("E2E_FAULTS_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "64", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "24", 1);
        setenv("STAGEHAND_POOL_PREPIN_MB", "16", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matrix),
                                       cmocka_unit_test(test_startup_failures_recover),
                                       cmocka_unit_test(test_cuda12_drivers)};
    return cmocka_run_group_tests_name(
        preloaded ? "e2e_faults (preloaded)" : "e2e_faults (disabled)", tests, NULL, NULL);
}
