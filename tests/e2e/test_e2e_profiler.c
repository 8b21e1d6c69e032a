/* test_e2e_profiler.c — a profiler subscribes to CUPTI mid-run and leaves.
 *
 * CUPTI takes one subscriber. The library holds it from its first
 * allocation; when the program subscribes a second client (as
 * torch.profiler's Kineto does), the library must give CUPTI up and track
 * launches through its hooks, and take CUPTI back when that client
 * unsubscribes, with no launch unseen on any thread at any moment. The
 * workload writes regions three times the budget, so launches restore
 * evicted regions throughout; a second thread launches across both
 * switches, and the simulated CUPTI's probe holds each switch at the exact
 * point where one subscriber has gone and the next is not yet there until
 * that thread has launched twice more. The library must count every launch
 * once, the client's callbacks must fire while it is subscribed and only
 * then, and every byte must be right.
 *
 * The scenarios run in children (the parent checks the JSONL a child
 * leaves): one subscribes mid-run, one before the library's first
 * allocation. With STAGEHAND_DISABLE=1 the same scenarios run on the
 * simulated GPU alone, which holds all of it (the budget is what is small).
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
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h" /* after stdio.h and unistd.h */

#define REGION (16u << 20)
#define WORDS  (REGION / 4)
#define NMAIN  20 /* 320 MB on the main thread, */
#define NB     4  /* 64 MB on the second: three times the 128 MB budget */

static int preloaded, loaded; /* managing; just loaded (STAGEHAND_DISABLE=1) */
static char **saved_argv;
static const dim3 one = {1, 1, 1};

static void k_fill(void **a) /* (uint32_t *p, size_t n, uint32_t seed) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t seed = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = seed * 2654435761u + (uint32_t)i;
}

static void k_bump(void **a) /* (uint32_t *p, size_t n) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    for (size_t i = 0; i < n; i++)
        p[i] += 1;
}

static int fill(void *p, uint32_t seed, cudaStream_t s)
{
    size_t n = WORDS;
    void *args[] = {&p, &n, &seed};
    return cudaLaunchKernel((const void *)k_fill, one, one, args, 0, s) == cudaSuccess;
}

static int bump(void *p, cudaStream_t s)
{
    size_t n = WORDS;
    void *args[] = {&p, &n};
    return cudaLaunchKernel((const void *)k_bump, one, one, args, 0, s) == cudaSuccess;
}

/* Words of p that are not fill(seed) bumped `bumps` times. */
static size_t wrong_words(const void *p, uint32_t seed, uint32_t bumps)
{
    uint32_t *h = malloc(REGION);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, p, REGION, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += h[i] != seed * 2654435761u + (uint32_t)i + bumps;
    free(h);
    return bad;
}

static void stats(stagehand_stats_t *st)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    memset(st, 0, sizeof *st);
    if (get)
        get(st, sizeof *st);
}

static void step(void)
{
    int64_t (*mark)(void) = (int64_t(*)(void))dlsym(RTLD_DEFAULT, "stagehand_step");
    if (mark)
        mark();
}

/* ---- the client: counts the runtime launches it is told of ---- */

static atomic_uint client_launches;
static CUpti_SubscriberHandle client;
/* Set: at the next launch's exit the client tears CUPTI down from inside
 * its callback, as Kineto does with TEARDOWN_CUPTI=1. */
static atomic_int teardown;

static void CUPTIAPI client_cb(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                               const void *data)
{
    (void)user;
    const CUpti_CallbackData *cb = data;
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API ||
        cbid != CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000)
        return;
    if (cb->callbackSite == CUPTI_API_ENTER)
        atomic_fetch_add(&client_launches, 1);
    else if (atomic_exchange(&teardown, 0) &&
             (cuptiUnsubscribe(client) != CUPTI_SUCCESS || cuptiFinalize() != CUPTI_SUCCESS))
        atomic_store(&teardown, -1); /* checked by the test */
}

static CUpti_SubscriberHandle client_subscribe(void)
{
    CUpti_SubscriberHandle h = NULL;
    assert_int_equal(cuptiSubscribe(&h, (CUpti_CallbackFunc)client_cb, NULL), CUPTI_SUCCESS);
    assert_int_equal(cuptiEnableCallback(1, h, CUPTI_CB_DOMAIN_RUNTIME_API,
                                         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000),
                     CUPTI_SUCCESS);
    client = h;
    return h;
}

/* ---- the second thread: bumps its own regions until told to stop ---- */

static struct {
    pthread_t t;
    cudaStream_t s;
    void *r[NB];
    uint32_t bumps[NB];
    atomic_uint launched;
    atomic_int stop, failures;
} second;

static void *second_main(void *arg)
{
    (void)arg;
    for (unsigned k = 0; !atomic_load(&second.stop); k++) {
        if (!bump(second.r[k % NB], second.s)) {
            atomic_store(&second.failures, 1);
            break;
        }
        second.bumps[k % NB]++;
        atomic_fetch_add(&second.launched, 1);
        if (k % NB == NB - 1) /* a bounded queue: a remap window drains it */
            cudaStreamSynchronize(second.s);
    }
    cudaStreamSynchronize(second.s);
    return NULL;
}

/* At each hand-over point the second thread launches twice more before the
 * switch may go on: launches in the gap between two subscribers. */
static atomic_int probe_events;

static void on_probe(int event, void *arg)
{
    (void)event;
    (void)arg;
    atomic_fetch_add(&probe_events, 1);
    unsigned from = atomic_load(&second.launched);
    while (atomic_load(&second.launched) < from + 2 && !atomic_load(&second.stop) &&
           !atomic_load(&second.failures))
        sched_yield();
}

/* ---- the scenarios ---- */

static void *main_r[NMAIN];

static void alloc_all(void)
{
    for (int i = 0; i < NMAIN; i++) {
        assert_int_equal(cudaMalloc(&main_r[i], REGION), cudaSuccess);
        assert_true(fill(main_r[i], (uint32_t)i + 1, NULL));
    }
    assert_int_equal(cudaStreamCreateWithFlags(&second.s, cudaStreamNonBlocking), cudaSuccess);
    for (int i = 0; i < NB; i++) {
        assert_int_equal(cudaMalloc(&second.r[i], REGION), cudaSuccess);
        assert_true(fill(second.r[i], 1000u + (uint32_t)i, second.s));
    }
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

static void bump_main(void)
{
    for (int i = 0; i < NMAIN; i++)
        assert_true(bump(main_r[i], NULL));
}

static void check_and_free(uint32_t main_bumps)
{
    for (int i = 0; i < NMAIN; i++) {
        assert_int_equal(wrong_words(main_r[i], (uint32_t)i + 1, main_bumps), 0);
        assert_int_equal(cudaFree(main_r[i]), cudaSuccess);
    }
    for (int i = 0; i < NB; i++) {
        assert_int_equal(wrong_words(second.r[i], 1000u + (uint32_t)i, second.bumps[i]), 0);
        assert_int_equal(cudaFree(second.r[i]), cudaSuccess);
    }
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    assert_int_equal(sim.faults, 0);
}

/* cuptiSubscribe and its kin as the program finds them, linked or looked up
 * in libcupti, are the library's (preloaded), which forwards to CUPTI. */
static void check_exports(void)
{
    void *cupti = dlopen("libcupti.so.13", RTLD_LAZY | RTLD_NOLOAD);
    assert_non_null(cupti);
    void *looked_up = dlsym(cupti, "cuptiSubscribe");
    dlclose(cupti);
    Dl_info info;
    assert_true(dladdr(looked_up, &info));
    assert_ptr_equal(looked_up, (void *)cuptiSubscribe);
    assert_non_null(strstr(info.dli_fname, loaded ? "libstagehand" : "libcupti"));
}

static void expect_log(const char *got, const char *line)
{
    if (preloaded && !strstr(got, line))
        fail_msg("expected \"%s\" on stderr; got:\n%s", line, got);
}

static void test_mid_run(void **state)
{
    (void)state;
    if (!getenv("E2E_PROFILER_MID"))
        skip();
    check_exports();
    alloc_all();
    step();
    bump_main();
    stagehand_stats_t s0, s1, s2, s3;
    stats(&s0);
    assert_int_equal(s0.tracking_mode, preloaded ? 1 : 0);
    assert_int_equal(pthread_create(&second.t, NULL, second_main, NULL), 0);
    simcuda_cupti_probe(on_probe, NULL);

    struct capture c;
    char err[65536];
    capture_begin(&c);
    CUpti_SubscriberHandle h = client_subscribe();
    capture_end(&c, err, sizeof err);
    expect_log(err, "launch tracking: CUPTI given to another subscriber");
    /* The library's unsubscribe, then the client's subscribe. */
    assert_int_equal(atomic_load(&probe_events), preloaded ? 2 : 1);
    stats(&s1);
    bump_main();
    stats(&s2);
    step();

    capture_begin(&c);
    assert_int_equal(cuptiUnsubscribe(h), CUPTI_SUCCESS);
    capture_end(&c, err, sizeof err);
    expect_log(err, "launch tracking: CUPTI callbacks again");
    assert_int_equal(atomic_load(&probe_events), preloaded ? 4 : 2);
    simcuda_cupti_probe(NULL, NULL);
    /* A stale handle (the simulated CUPTI hands every subscriber the same
     * one) reaches nothing: the library's subscription stays whole. */
    assert_int_equal(cuptiUnsubscribe(h), CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiEnableCallback(0, h, CUPTI_CB_DOMAIN_RUNTIME_API,
                                         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000),
                     CUPTI_ERROR_INVALID_PARAMETER);
    atomic_store(&second.stop, 1);
    assert_int_equal(pthread_join(second.t, NULL), 0);
    assert_int_equal(atomic_load(&second.failures), 0);
    unsigned told = atomic_load(&client_launches); /* nothing is in flight now */
    bump_main();
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    stats(&s3);
    step();

    /* The client heard of the main thread's launches while it was there,
     * and of nothing after. */
    unsigned b = atomic_load(&second.launched);
    assert_true(told >= NMAIN && told <= NMAIN + b);
    assert_int_equal(atomic_load(&client_launches), told);
    check_and_free(3);
    fprintf(stderr, "profiler: the second thread launched %u times; %llu restores while lent\n", b,
            (unsigned long long)(s2.restores - s1.restores));
    if (!preloaded)
        return;
    assert_int_equal(s1.tracking_mode, 2);
    assert_int_equal(s1.cupti_handovers, 1);
    assert_int_equal(s1.cupti_returns, 0);
    assert_true(s2.restores > s1.restores); /* the hooks restored what launches used */
    assert_int_equal(s3.tracking_mode, 1);
    assert_int_equal(s3.cupti_handovers, 1);
    assert_int_equal(s3.cupti_returns, 1);
    /* Every launch after s0 seen once: the main thread's 2 x NMAIN and
     * every one of the second thread's, those in the gaps included. */
    assert_int_equal(s3.launches - s0.launches, 2 * NMAIN + b);
}

/* A client that subscribes before the library's first allocation: the
 * library starts on its hooks and takes CUPTI when the client leaves. */
static void test_before_first_alloc(void **state)
{
    (void)state;
    if (!getenv("E2E_PROFILER_EARLY"))
        skip();
    CUpti_SubscriberHandle h = client_subscribe();
    struct capture c;
    char err[65536];
    capture_begin(&c);
    alloc_all();
    capture_end(&c, err, sizeof err);
    expect_log(err, "runtime and driver hooks (another CUPTI subscriber (a profiler?) is active");
    stagehand_stats_t s0, s1, s2;
    stats(&s0);
    bump_main();
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(atomic_load(&client_launches), 2 * NMAIN + NB); /* fills and bumps */
    stats(&s1);
    assert_int_equal(cuptiUnsubscribe(h), CUPTI_SUCCESS);
    bump_main();
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    stats(&s2);
    assert_int_equal(atomic_load(&client_launches), 2 * NMAIN + NB);
    check_and_free(2);
    if (!preloaded)
        return;
    assert_int_equal(s0.tracking_mode, 2);
    assert_int_equal(s1.launches - s0.launches, NMAIN);
    assert_true(s1.restores > s0.restores);
    assert_int_equal(s2.tracking_mode, 1);
    assert_int_equal(s2.cupti_handovers, 0);
    assert_int_equal(s2.cupti_returns, 1);
    assert_int_equal(s2.launches - s1.launches, NMAIN);
}

/* CUPTI torn down: by the client from inside its own callback, mid-launch
 * (Kineto's TEARDOWN_CUPTI=1: cuptiUnsubscribe, then cuptiFinalize), and
 * by a program that finalizes CUPTI while the library holds it. Each time
 * the library tracks on, and holds CUPTI again once it can. */
static void test_teardown(void **state)
{
    (void)state;
    if (!getenv("E2E_PROFILER_TEARDOWN"))
        skip();
    alloc_all();
    stagehand_stats_t s0, s1, s2;
    stats(&s0);
    client_subscribe();
    bump_main();
    atomic_store(&teardown, 1);
    bump_main(); /* the first launch's exit tears down */
    assert_int_equal(atomic_load(&teardown), 0);
    unsigned told = atomic_load(&client_launches);
    bump_main();
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(atomic_load(&client_launches), told);
    stats(&s1);
    assert_int_equal(cuptiFinalize(), CUPTI_SUCCESS); /* no client now: the library's CUPTI */
    bump_main();
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    stats(&s2);
    check_and_free(4);
    if (!preloaded)
        return;
    assert_int_equal(s1.tracking_mode, 1);
    assert_int_equal(s1.launches - s0.launches, 3 * NMAIN);
    assert_int_equal(s2.launches - s1.launches, NMAIN);
    assert_int_equal(s2.tracking_mode, 1);
    assert_true(s2.cupti_returns > s1.cupti_returns);
}

/* The sum of a JSONL field over the file's lines, and the last line's
 * "tracking". */
static uint64_t jsonl_sum(const char *path, const char *field, char *last_tracking, size_t cap)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[8192], key[64];
    snprintf(key, sizeof key, "\"%s\":", field);
    uint64_t sum = 0;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, key), *t = strstr(line, "\"tracking\":\"");
        if (at)
            sum += strtoull(at + strlen(key), NULL, 10);
        if (t)
            snprintf(last_tracking, cap, "%.*s", (int)strcspn(t + 12, "\""), t + 12);
    }
    fclose(f);
    return sum;
}

static int in_a_child(void);

static char jsonl_path[128];

static int remove_jsonl(void **state)
{
    (void)state;
    if (jsonl_path[0])
        unlink(jsonl_path);
    return 0;
}

static void test_mid_run_in_a_child(void **state)
{
    (void)state;
    if (in_a_child())
        skip();
    char env_file[192];
    const char *path = jsonl_path;
    snprintf(jsonl_path, sizeof jsonl_path, "/tmp/stagehand-e2e-profiler-%d.jsonl", (int)getpid());
    snprintf(env_file, sizeof env_file, "STAGEHAND_TELEMETRY_TELEMETRY_FILE=%s", path);
    unlink(path);
    const char *const env[] = {"E2E_PROFILER_MID=1", env_file, NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
    if (!preloaded)
        return;
    /* The telemetry says it too: one hand-over, one return, CUPTI at the end. */
    char tracking[16] = "";
    assert_int_equal(jsonl_sum(path, "cupti_handovers", tracking, sizeof tracking), 1);
    assert_int_equal(jsonl_sum(path, "cupti_returns", tracking, sizeof tracking), 1);
    assert_string_equal(tracking, "cupti");
}

static int in_a_child(void)
{
    return getenv("E2E_PROFILER_MID") || getenv("E2E_PROFILER_EARLY") ||
           getenv("E2E_PROFILER_TEARDOWN");
}

static void test_before_first_alloc_in_a_child(void **state)
{
    (void)state;
    if (in_a_child())
        skip();
    const char *const env[] = {"E2E_PROFILER_EARLY=1", NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static void test_teardown_in_a_child(void **state)
{
    (void)state;
    if (in_a_child())
        skip();
    const char *const env[] = {"E2E_PROFILER_TEARDOWN=1", NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static int setup(void **state)
{
    (void)state;
    size_t fill_sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    size_t bump_sizes[] = {sizeof(void *), sizeof(size_t)};
    assert_int_equal(simcuda_register_kernel(k_fill, "fill", 3, fill_sizes, 0), 0);
    assert_int_equal(simcuda_register_kernel(k_bump, "bump", 2, bump_sizes, 0), 0);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_PROFILER_CONFIGURED")) {
        setenv("E2E_PROFILER_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "512", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "128", 1);
        setenv("STAGEHAND_POOL_SLABS_PER_CLASS", "0", 1);
        setenv("STAGEHAND_POOL_PREPIN_MB", "0", 1);
        setenv("STAGEHAND_GENERAL_LOG_LEVEL", "info", 1);
        e2e_reexec(argv);
        return 1;
    }
    loaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") != NULL;
    preloaded = loaded && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mid_run),
        cmocka_unit_test(test_before_first_alloc),
        cmocka_unit_test_teardown(test_mid_run_in_a_child, remove_jsonl),
        cmocka_unit_test(test_before_first_alloc_in_a_child),
        cmocka_unit_test(test_teardown),
        cmocka_unit_test(test_teardown_in_a_child),
    };
    return cmocka_run_group_tests_name(
        preloaded ? "e2e_profiler (preloaded)" : "e2e_profiler (disabled)", tests, setup, NULL);
}
