/* test_e2e_top.c — stagehand-top --json against a live simulated workload:
 * valid JSON with the documented keys, whose figures agree with what the
 * simulated GPU itself counted (bytes each way, device memory in use).
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
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REGION (8u << 20)
#define NREG   20 /* 160 MB against a 96 MB budget */

static int preloaded;
static const dim3 one = {1, 1, 1};

static void k_bump(void **a)
{
    uint32_t *p = *(uint32_t **)a[0];
    for (size_t i = 0; i < REGION / 4; i++)
        p[i]++;
}

/* The workload: evicts and restores, then reports the simulator's counts
 * on `out` and waits on `in` until the parent has looked. */
static int workload(int out, int in)
{
    size_t sizes[] = {sizeof(void *)};
    simcuda_register_kernel(k_bump, "bump", 1, sizes, 0);
    void *r[NREG + 1];
    for (int i = 0; i < NREG; i++)
        if (cudaMalloc(&r[i], REGION) != cudaSuccess)
            return 2;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < NREG; i++) {
            void *args[] = {&r[i]};
            cudaLaunchKernel((const void *)k_bump, one, one, args, 0, NULL);
        }
    /* Last, a region of two thirds of the budget, which must make room
     * however much the scheduler evicted early: its pressure event is among
     * the recent ones the snapshot keeps. */
    if (cudaMalloc(&r[NREG], 64u << 20) != cudaSuccess)
        return 2;
    cudaDeviceSynchronize();
    simcuda_stats_t st;
    simcuda_get_stats(&st);
    if (write(out, &st, sizeof st) != (ssize_t)sizeof st)
        return 2;
    char c;
    return read(in, &c, 1) == 1 ? 0 : 2;
}

static json_object *get(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v))
        fail_msg("stagehand-top --json: no key '%s'", key);
    return v;
}

static json_object *top_json(pid_t pid)
{
    const char *build = getenv("STAGEHAND_TEST_BUILD");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/stagehand-top --json -p %d", build ? build : "build", (int)pid);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    assert_int_equal(pclose(f), 0);
    json_object *o = json_tokener_parse(buf);
    if (!o)
        fail_msg("stagehand-top --json printed no valid JSON: %.200s", buf);
    return o;
}

/* 1 if the snapshot's recent events include one of this kind. */
static int has_event(json_object *o, const char *kind)
{
    json_object *ev = get(o, "events");
    for (size_t i = 0; i < json_object_array_length(ev); i++)
        if (!strcmp(json_object_get_string(get(json_object_array_get_idx(ev, i), "kind")), kind))
            return 1;
    return 0;
}

static void test_json_agrees_with_the_gpu(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    int to_parent[2], to_child[2];
    assert_int_equal(pipe(to_parent), 0);
    assert_int_equal(pipe(to_child), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_parent[0]);
        close(to_child[1]);
        exit(workload(to_parent[1], to_child[0])); /* exit: its segment is removed */
    }
    close(to_parent[1]);
    close(to_child[0]);
    simcuda_stats_t sim;
    assert_int_equal(read(to_parent[0], &sim, sizeof sim), (ssize_t)sizeof sim);
    json_object *o = NULL, *counters = NULL;
    for (int tries = 0; tries < 30; tries++) { /* the publisher refreshes every 250 ms */
        struct timespec ts = {0, 200000000};
        nanosleep(&ts, NULL);
        if (o)
            json_object_put(o);
        o = top_json(pid);
        counters = get(o, "counters");
        if ((uint64_t)json_object_get_int64(get(counters, "d2h_bytes")) == sim.bytes_d2h)
            break;
    }
    assert_int_equal(json_object_get_int(get(o, "pid")), pid);
    (void)get(o, "device");
    (void)get(o, "host_pool");
    assert_true(json_object_is_type(get(o, "regions"), json_type_array));
    assert_true(json_object_array_length(get(o, "regions")) > 0);
    json_object *vram = get(o, "vram");
    assert_int_equal(json_object_get_int64(get(vram, "budget")), 96ll << 20);
    assert_true(json_object_get_int64(get(vram, "high")) <
                json_object_get_int64(get(vram, "budget")));
    assert_true(json_object_get_int64(get(vram, "low")) < json_object_get_int64(get(vram, "high")));
    /* Every byte that crossed the simulated bus was the library's doing. */
    assert_true(sim.bytes_d2h > 0);
    assert_int_equal((uint64_t)json_object_get_int64(get(counters, "d2h_bytes")), sim.bytes_d2h);
    assert_int_equal((uint64_t)json_object_get_int64(get(counters, "h2d_bytes")), sim.bytes_h2d);
    assert_int_equal((uint64_t)json_object_get_int64(get(vram, "used")), sim.device_bytes_in_use);
    /* The moves behind those bytes are in the event list, as the monitor draws them:
     * the bytes came back on demand or ahead of their launch, as the scheduler found room. */
    assert_true(has_event(o, "evict"));
    assert_true(has_event(o, "restore") || has_event(o, "prefetch"));
    assert_true(has_event(o, "stall"));
    assert_true(has_event(o, "pressure"));
    json_object_put(o);
    assert_int_equal(write(to_child[1], "x", 1), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("E2E_TOP_CONFIGURED")) {
        setenv("E2E_TOP_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "256", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "96", 1);
        setenv("STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB", "80%", 1); /* shown below the budget */
        setenv("STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB", "60%", 1);
        setenv("STAGEHAND_POOL_PREPIN_MB", "64", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_json_agrees_with_the_gpu)};
    return cmocka_run_group_tests_name(preloaded ? "e2e_top (preloaded)" : "e2e_top (disabled)",
                                       tests, NULL, NULL);
}
