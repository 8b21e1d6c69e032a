/* test_sim_streams.c — streams, events, host functions and modelled time on
 * the simulated GPU: in-order execution, the legacy default stream's implicit
 * synchronisation with blocking (but not non-blocking) streams, events across
 * streams, elapsed time, the race of reading a kernel's output without
 * synchronising, and the copy time SIMCUDA_PCIE_GBPS models.
 *
 * main() sets SIMCUDA_PCIE_GBPS=0.5 and SIMCUDA_KERNEL_US=40000 before the
 * first call. Kernels that are not about time are registered with 1 us.
 * Bounds on measured time are generous above (a loaded machine) and exact
 * below (a modelled duration is a sleep, never shorter).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

#define MiB        (1024ull * 1024)
#define RACE_MS    250
#define MID_MS     120
#define DEFAULT_MS 40
#define GBPS       0.5

/* ---- kernels: one body, several registered durations ---- */

/* (uint32_t *dst, uint32_t value, size_t n) */
static void fill32(void **args)
{
    uint32_t *dst = *(uint32_t **)args[0];
    uint32_t v = *(uint32_t *)args[1];
    size_t n = *(size_t *)args[2];
    for (size_t i = 0; i < n; i++)
        dst[i] = v;
}

static void k_fill_fast(void **args)
{
    fill32(args);
}
static void k_fill_race(void **args)
{
    fill32(args);
}
/* Only for the race tests: its writes race with a copy on purpose. */
static void k_fill_racing(void **args)
{
    fill32(args);
}
static void k_fill_racing_mid(void **args)
{
    fill32(args);
}
static void k_fill_mid(void **args)
{
    fill32(args);
}
static void k_fill_default(void **args)
{
    fill32(args);
}

/* (int *log, int *pos, int value): log[pos++] = value */
static void append(void **args)
{
    int *log = *(int **)args[0];
    int *pos = *(int **)args[1];
    log[__atomic_fetch_add(pos, 1, __ATOMIC_SEQ_CST)] = *(int *)args[2];
}

static void k_append_fast(void **args)
{
    append(args);
}
static void k_append_slow(void **args)
{
    append(args);
}

/* The race tests read the output of k_fill_racing and k_fill_racing_mid while
 * it is being written: a data race by design, which ThreadSanitizer must not
 * report. Nothing else is suppressed. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifdef UNDER_TSAN
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "race:k_fill_racing\n";
}
#endif

/* ---- helpers ---- */

static CUcontext ctx;

static void need_ctx(void)
{
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    if (!ctx) {
        assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        const size_t fs[] = {sizeof(void *), sizeof(uint32_t), sizeof(size_t)};
        const size_t as[] = {sizeof(void *), sizeof(void *), sizeof(int)};
        assert_int_equal(simcuda_register_kernel(k_fill_fast, "fill_fast", 3, fs, 1), 0);
        assert_int_equal(simcuda_register_kernel(k_fill_race, "fill_race", 3, fs, RACE_MS * 1000),
                         0);
        assert_int_equal(
            simcuda_register_kernel(k_fill_racing, "fill_racing", 3, fs, RACE_MS * 1000), 0);
        assert_int_equal(
            simcuda_register_kernel(k_fill_racing_mid, "fill_racing_mid", 3, fs, MID_MS * 1000), 0);
        assert_int_equal(simcuda_register_kernel(k_fill_mid, "fill_mid", 3, fs, MID_MS * 1000), 0);
        assert_int_equal(simcuda_register_kernel(k_fill_default, "fill_default", 3, fs, 0), 0);
        assert_int_equal(simcuda_register_kernel(k_append_fast, "append_fast", 3, as, 1), 0);
        assert_int_equal(simcuda_register_kernel(k_append_slow, "append_slow", 3, as, 20 * 1000),
                         0);
    }
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void fill(simcuda_kernel_fn k, CUdeviceptr dst, uint32_t v, size_t n, CUstream s)
{
    void *p = (void *)(uintptr_t)dst;
    void *args[] = {&p, &v, &n};
    assert_int_equal(cuLaunchKernel(simcuda_function(k), 1, 1, 1, 1, 1, 1, 0, s, args, NULL),
                     CUDA_SUCCESS);
}

static CUdeviceptr zeroed(size_t bytes)
{
    CUdeviceptr d = 0;
    assert_int_equal(cuMemAlloc(&d, bytes), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8(d, 0, bytes), CUDA_SUCCESS);
    return d;
}

static CUstream stream(unsigned flags)
{
    CUstream s = NULL;
    assert_int_equal(cuStreamCreate(&s, flags), CUDA_SUCCESS);
    assert_non_null(s);
    return s;
}

static bool all_equal(const uint32_t *p, size_t n, uint32_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) {
            print_error("word %zu is 0x%x, want 0x%x\n", i, p[i], v);
            return false;
        }
    return true;
}

static float elapsed(CUevent a, CUevent b)
{
    float ms = -1;
    assert_int_equal(cuEventElapsedTime(&ms, a, b), CUDA_SUCCESS);
    return ms;
}

/* ---- order within a stream ---- */

static void a_stream_runs_its_work_in_order(void **state)
{
    (void)state;
    need_ctx();
    CUstream s = stream(CU_STREAM_NON_BLOCKING);
    int *log = NULL, *pos = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&log, 64 * sizeof(int), 0), CUDA_SUCCESS);
    assert_int_equal(cuMemHostAlloc((void **)&pos, sizeof(int), 0), CUDA_SUCCESS);
    *pos = 0;
    /* Slow ones first in each pair: if anything overtook, the log shows it. */
    for (int i = 0; i < 16; i++) {
        simcuda_kernel_fn k = i % 4 == 0 ? k_append_slow : k_append_fast;
        void *args[] = {&log, &pos, &i};
        assert_int_equal(cuLaunchKernel(simcuda_function(k), 1, 1, 1, 1, 1, 1, 0, s, args, NULL),
                         CUDA_SUCCESS);
    }
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(*pos, 16);
    for (int i = 0; i < 16; i++)
        assert_int_equal(log[i], i);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(log), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(pos), CUDA_SUCCESS);
}

/* ---- the race: reading a kernel's output without synchronising ---- */

static void race_sync_copy_does_not_wait_for_a_nonblocking_stream(void **state)
{
    (void)state;
    need_ctx();
    enum { N = 16384 };
    CUdeviceptr d = zeroed(N * 4);
    uint32_t *h = calloc(N, 4);
    assert_non_null(h);
    CUstream nb = stream(CU_STREAM_NON_BLOCKING);

    double t0 = now_ms();
    fill(k_fill_racing, d, 0xabababab, N, nb);
    /* The legacy stream does not wait for a non-blocking one: stale. */
    assert_int_equal(cuMemcpyDtoH(h, d, N * 4), CUDA_SUCCESS);
    assert_true(now_ms() - t0 < RACE_MS - 100);
    assert_true(all_equal(h, N, 0));
    /* Half-way through the kernel its writes have still not landed. */
    sleep_ms(100);
    assert_int_equal(cuMemcpyDtoH(h, d, N * 4), CUDA_SUCCESS);
    assert_true(now_ms() - t0 < RACE_MS);
    assert_true(all_equal(h, N, 0));
    assert_int_equal(cuStreamQuery(nb), CUDA_ERROR_NOT_READY);

    assert_int_equal(cuStreamSynchronize(nb), CUDA_SUCCESS);
    assert_true(now_ms() - t0 >= RACE_MS);
    assert_int_equal(cuStreamQuery(nb), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(h, d, N * 4), CUDA_SUCCESS);
    assert_true(all_equal(h, N, 0xabababab));

    assert_int_equal(cuStreamDestroy(nb), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
    free(h);
}

static void race_async_copy_on_another_stream_is_stale_until_synchronised(void **state)
{
    (void)state;
    need_ctx();
    enum { N = 4096 };
    CUdeviceptr d = zeroed(N * 4);
    uint32_t *h = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&h, N * 4, 0), CUDA_SUCCESS);
    memset(h, 0x55, N * 4);
    CUstream writer = stream(CU_STREAM_NON_BLOCKING), reader = stream(CU_STREAM_NON_BLOCKING);

    double t0 = now_ms();
    fill(k_fill_racing, d, 0x01020304, N, writer);
    assert_int_equal(cuMemcpyDtoHAsync(h, d, N * 4, reader), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(reader), CUDA_SUCCESS); /* the reader only */
    assert_true(now_ms() - t0 < RACE_MS - 100);
    assert_true(all_equal(h, N, 0));

    assert_int_equal(cuStreamSynchronize(writer), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(h, d, N * 4, reader), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(reader), CUDA_SUCCESS);
    assert_true(all_equal(h, N, 0x01020304));

    assert_int_equal(cuStreamDestroy(writer), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(reader), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

/* ---- the legacy default stream ---- */

static void legacy_stream_waits_for_blocking_streams(void **state)
{
    (void)state;
    need_ctx();
    enum { N = 1024 };
    CUdeviceptr d = zeroed(N * 4);
    uint32_t h[N];
    CUstream s = stream(CU_STREAM_DEFAULT);
    double t0 = now_ms();
    fill(k_fill_mid, d, 0xfeedf00d, N, s);
    /* A synchronous copy is legacy-stream work: it waits for s. */
    assert_int_equal(cuMemcpyDtoH(h, d, sizeof h), CUDA_SUCCESS);
    assert_true(now_ms() - t0 >= MID_MS);
    assert_true(all_equal(h, N, 0xfeedf00d));
    /* So does asynchronous work on the NULL stream and on CU_STREAM_LEGACY. */
    fill(k_fill_mid, d, 0x11111111, N, s);
    memset(h, 0, sizeof h);
    assert_int_equal(cuMemcpyDtoHAsync(h, d, sizeof h, CU_STREAM_LEGACY), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    assert_true(all_equal(h, N, 0x11111111));
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void blocking_streams_wait_for_the_legacy_stream_nonblocking_ones_do_not(void **state)
{
    (void)state;
    need_ctx();
    enum { N = 1024 };
    CUdeviceptr d = zeroed(N * 4);
    uint32_t *h1 = NULL, *h2 = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&h1, N * 4, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemHostAlloc((void **)&h2, N * 4, 0), CUDA_SUCCESS);
    CUstream nb = stream(CU_STREAM_NON_BLOCKING), bl = stream(CU_STREAM_DEFAULT);

    double t0 = now_ms();
    fill(k_fill_racing_mid, d, 0xcafe0001, N, NULL);
    assert_int_equal(cuMemcpyDtoHAsync(h1, d, N * 4, nb), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(h2, d, N * 4, bl), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(nb), CUDA_SUCCESS);
    assert_true(now_ms() - t0 < MID_MS - 40);
    assert_true(all_equal(h1, N, 0));
    assert_int_equal(cuStreamSynchronize(bl), CUDA_SUCCESS);
    assert_true(now_ms() - t0 >= MID_MS);
    assert_true(all_equal(h2, N, 0xcafe0001));

    /* Work queued on the legacy stream after the NULL-stream kernel waits too. */
    assert_int_equal(cuStreamDestroy(nb), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(bl), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h1), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void legacy_stream_does_not_wait_for_nonblocking_streams(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr a = zeroed(64), b = zeroed(64);
    CUstream nb = stream(CU_STREAM_NON_BLOCKING);
    double t0 = now_ms();
    fill(k_fill_mid, a, 7, 16, nb);
    fill(k_fill_fast, b, 9, 16, NULL);
    assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_true(now_ms() - t0 < MID_MS - 40);
    assert_int_equal(cuStreamQuery(nb), CUDA_ERROR_NOT_READY);
    uint32_t h[16];
    assert_int_equal(cuMemcpyDtoH(h, b, sizeof h), CUDA_SUCCESS);
    assert_true(all_equal(h, 16, 9));
    assert_int_equal(cuStreamSynchronize(nb), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(h, a, sizeof h), CUDA_SUCCESS);
    assert_true(all_equal(h, 16, 7));
    assert_int_equal(cuStreamDestroy(nb), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(b), CUDA_SUCCESS);
}

static void per_thread_stream_is_a_blocking_stream(void **state)
{
    (void)state;
    need_ctx();
    unsigned flags = 99;
    assert_int_equal(cuStreamGetFlags(CU_STREAM_PER_THREAD, &flags), CUDA_SUCCESS);
    assert_int_equal(flags, 0);
    CUdeviceptr d = zeroed(64);
    fill(k_fill_mid, d, 0x600d, 16, CU_STREAM_PER_THREAD);
    uint32_t h[16];
    assert_int_equal(cuMemcpyDtoH(h, d, sizeof h), CUDA_SUCCESS); /* legacy: waits */
    assert_true(all_equal(h, 16, 0x600d));
    fill(k_fill_fast, d, 0x700d, 16, CU_STREAM_PER_THREAD);
    assert_int_equal(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    assert_true(all_equal((const uint32_t *)(uintptr_t)d, 16, 0x700d));
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

/* ---- concurrency and context synchronisation ---- */

static void streams_run_concurrently_and_ctx_sync_waits_for_all(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = zeroed(4 * 64);
    CUstream a = stream(CU_STREAM_NON_BLOCKING), b = stream(CU_STREAM_NON_BLOCKING),
             c = stream(CU_STREAM_NON_BLOCKING);
    double t0 = now_ms();
    fill(k_fill_race, d, 1, 16, a);
    fill(k_fill_race, d + 64, 2, 16, b);
    fill(k_fill_race, d + 128, 3, 16, c);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    double t = now_ms() - t0;
    assert_true(t >= RACE_MS);
    assert_true(t < 2 * RACE_MS); /* one after the other would take three times as long */
    const uint32_t *p = (const uint32_t *)(uintptr_t)d;
    assert_true(all_equal(p, 16, 1));
    assert_true(all_equal(p + 16, 16, 2));
    assert_true(all_equal(p + 32, 16, 3));
    assert_true(all_equal(p + 48, 16, 0));
    assert_int_equal(cuStreamDestroy(a), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(b), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(c), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

/* ---- events ---- */

static void events_order_work_across_streams(void **state)
{
    (void)state;
    need_ctx();
    enum { N = 1024 };
    CUdeviceptr d = zeroed(N * 4);
    uint32_t *h = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&h, N * 4, 0), CUDA_SUCCESS);
    CUstream a = stream(CU_STREAM_NON_BLOCKING), b = stream(CU_STREAM_NON_BLOCKING);
    CUevent e = NULL, never = NULL;
    assert_int_equal(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&never, 0), CUDA_SUCCESS);

    double t0 = now_ms();
    fill(k_fill_mid, d, 0x12345678, N, a);
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
    /* An event never recorded stands for no work: nothing to wait for. */
    assert_int_equal(cuStreamWaitEvent(b, never, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(h, d, N * 4, b), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamSynchronize(b), CUDA_SUCCESS);
    assert_true(now_ms() - t0 >= MID_MS);
    assert_true(all_equal(h, N, 0x12345678));

    /* Errors. */
    assert_int_equal(cuStreamWaitEvent(b, e, 0x8), CUDA_ERROR_INVALID_VALUE);
    CUevent dead = NULL;
    assert_int_equal(cuEventCreate(&dead, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(dead), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, dead, 0), CUDA_ERROR_INVALID_HANDLE);

    assert_int_equal(cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(never), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(a), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(b), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void event_query_synchronize_and_elapsed_time(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = zeroed(64);
    CUstream s = stream(CU_STREAM_NON_BLOCKING);
    CUevent start = NULL, end = NULL;
    assert_int_equal(cuEventCreate(&start, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&end, CU_EVENT_BLOCKING_SYNC), CUDA_SUCCESS);
    /* Never recorded: complete. */
    assert_int_equal(cuEventQuery(end), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(end), CUDA_SUCCESS);

    assert_int_equal(cuEventRecord(start, s), CUDA_SUCCESS);
    fill(k_fill_mid, d, 1, 16, s);
    assert_int_equal(cuEventRecord(end, s), CUDA_SUCCESS);
    /* Pending. */
    float ms = -1;
    assert_int_equal(cuEventQuery(end), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuEventElapsedTime(&ms, start, end), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    assert_true(ms == -1);

    assert_int_equal(cuEventSynchronize(end), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(end), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(start), CUDA_SUCCESS);
    ms = elapsed(start, end);
    assert_true(ms >= MID_MS);
    assert_true(ms < MID_MS + 400);
    assert_true(elapsed(start, start) == 0);
    float back = elapsed(end, start);
    assert_true(back <= -MID_MS);
    assert_true(back > -MID_MS - 400);

    /* Recording again captures the new point of the stream. */
    fill(k_fill_mid, d, 2, 16, s);
    assert_int_equal(cuEventRecordWithFlags(end, s, CU_EVENT_RECORD_DEFAULT), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(end), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuEventSynchronize(end), CUDA_SUCCESS);
    ms = elapsed(start, end);
    assert_true(ms >= 2 * MID_MS);
    assert_true(all_equal((const uint32_t *)(uintptr_t)d, 16, 2));

    /* Events on the legacy stream. */
    assert_int_equal(cuEventRecord(start, NULL), CUDA_SUCCESS);
    fill(k_fill_mid, d, 3, 16, NULL);
    assert_int_equal(cuEventRecord(end, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(end), CUDA_SUCCESS);
    ms = elapsed(start, end);
    assert_true(ms >= MID_MS);
    assert_true(ms < MID_MS + 400);

    assert_int_equal(cuEventDestroy(start), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(end), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void event_errors(void **state)
{
    (void)state;
    need_ctx();
    CUevent a = NULL, b = NULL, nt = NULL, dead = NULL;
    float ms = -1;
    assert_int_equal(cuEventCreate(&a, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&b, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&dead, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(dead), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CUevent x = NULL;
    assert_int_equal(cuEventCreate(&x, 0x10), CUDA_ERROR_INVALID_VALUE);

    /* Neither recorded, one recorded. */
    assert_int_equal(cuEventElapsedTime(&ms, a, b), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventRecord(a, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(a), CUDA_SUCCESS);
    assert_int_equal(cuEventElapsedTime(&ms, a, b), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventRecord(b, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(b), CUDA_SUCCESS);
    assert_int_equal(cuEventElapsedTime(NULL, a, b), CUDA_ERROR_INVALID_VALUE);
    /* Without timing. */
    assert_int_equal(cuEventRecord(nt, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(nt), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(nt), CUDA_SUCCESS);
    assert_int_equal(cuEventElapsedTime(&ms, a, nt), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventElapsedTime(&ms, nt, b), CUDA_ERROR_INVALID_HANDLE);
    assert_true(ms == -1);
    /* Destroyed. */
    assert_int_equal(cuEventRecord(dead, NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventQuery(dead), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventSynchronize(dead), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventElapsedTime(&ms, dead, b), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventDestroy(dead), CUDA_ERROR_INVALID_HANDLE);
    /* On a destroyed stream, or with unknown flags. */
    CUstream s = stream(0);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(a, s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventRecordWithFlags(a, NULL, 0x80), CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cuEventDestroy(a), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(b), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(nt), CUDA_SUCCESS);
}

/* ---- stream properties ---- */

static void stream_priorities_are_clamped_and_flags_kept(void **state)
{
    (void)state;
    need_ctx();
    static const struct {
        int asked, got;
    } cases[] = {{0, 0}, {-1, -1}, {-5, -5}, {-6, -5}, {-100, -5}, {1, 0}, {100, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CUstream s = NULL;
        int p = 99;
        assert_int_equal(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, cases[i].asked),
                         CUDA_SUCCESS);
        assert_int_equal(cuStreamGetPriority(s, &p), CUDA_SUCCESS);
        assert_int_equal(p, cases[i].got);
        unsigned f = 99;
        assert_int_equal(cuStreamGetFlags(s, &f), CUDA_SUCCESS);
        assert_int_equal(f, CU_STREAM_NON_BLOCKING);
        assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    }
    CUstream s = stream(CU_STREAM_DEFAULT);
    unsigned f = 99;
    int p = 99;
    assert_int_equal(cuStreamGetFlags(s, &f), CUDA_SUCCESS);
    assert_int_equal(f, CU_STREAM_DEFAULT);
    assert_int_equal(cuStreamGetPriority(s, &p), CUDA_SUCCESS);
    assert_int_equal(p, 0);
    assert_int_equal(cuStreamGetPriority(NULL, &p), CUDA_SUCCESS);
    assert_int_equal(p, 0);
    assert_int_equal(cuStreamGetFlags(NULL, &f), CUDA_SUCCESS);
    assert_int_equal(f, 0);
    assert_int_equal(cuStreamGetFlags(s, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamGetPriority(s, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);

    CUstream bad = NULL;
    assert_int_equal(cuStreamCreate(&bad, 0x2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamCreateWithPriority(&bad, 0x4, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    assert_null(bad);
}

static void no_stream_is_capturing(void **state)
{
    (void)state;
    need_ctx();
    CUstream s = stream(CU_STREAM_NON_BLOCKING);
    CUstream all[] = {NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, s};
    for (size_t i = 0; i < 4; i++) {
        CUstreamCaptureStatus st = (CUstreamCaptureStatus)99;
        assert_int_equal(cuStreamIsCapturing(all[i], &st), CUDA_SUCCESS);
        assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    }
    assert_int_equal(cuStreamIsCapturing(s, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    assert_int_equal(cuStreamIsCapturing(s, &st), CUDA_ERROR_INVALID_HANDLE);
}

static void destroyed_streams_are_invalid_handles(void **state)
{
    (void)state;
    need_ctx();
    CUstream s = stream(CU_STREAM_NON_BLOCKING);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
    unsigned f;
    assert_int_equal(cuStreamGetFlags(s, &f), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamDestroy(CU_STREAM_LEGACY), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamDestroy(CU_STREAM_PER_THREAD), CUDA_ERROR_INVALID_HANDLE);
    /* An idle stream is complete. */
    CUstream t = stream(0);
    assert_int_equal(cuStreamQuery(t), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(t), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(t), CUDA_SUCCESS);
}

/* cuda.h, cuStreamDestroy: "In case the device is still doing work in the
 * stream hStream when cuStreamDestroy() is called, the function will return
 * immediately and the resources associated with hStream will be released
 * automatically once the device has completed all work in hStream." */
static void stream_destroy_returns_while_work_is_pending(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = zeroed(64);
    CUstream s = stream(CU_STREAM_NON_BLOCKING);
    fill(k_fill_race, d, 0x5eed, 16, s);
    double t0 = now_ms();
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    double t = now_ms() - t0;
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    /* The queued work still ran. */
    assert_true(all_equal((const uint32_t *)(uintptr_t)d, 16, 0x5eed));
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
    if (t >= RACE_MS / 2)
        print_error("cuStreamDestroy took %.0f ms\n", t);
    assert_true(t < RACE_MS / 2);
}

/* ---- host functions ---- */

struct host_log {
    int order[8];
    int n;
    uint32_t seen;
    const uint32_t *watch;
    pthread_t thread;
};

static struct host_log hlog;

static void CUDA_CB host_fn_a(void *user)
{
    hlog.order[__atomic_fetch_add(&hlog.n, 1, __ATOMIC_SEQ_CST)] = (int)(intptr_t)user;
    hlog.seen = *hlog.watch;
    hlog.thread = pthread_self();
}

static void CUDA_CB host_fn_b(void *user)
{
    hlog.order[__atomic_fetch_add(&hlog.n, 1, __ATOMIC_SEQ_CST)] = (int)(intptr_t)user;
}

static void host_functions_run_in_stream_order_on_the_worker(void **state)
{
    (void)state;
    need_ctx();
    uint32_t *pinned = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&pinned, 64, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    memset(pinned, 0, 64);
    memset(&hlog, 0, sizeof hlog);
    hlog.watch = pinned;
    CUstream s = stream(CU_STREAM_NON_BLOCKING);

    fill(k_fill_mid, (CUdeviceptr)(uintptr_t)pinned, 0xabcd, 16, s);
    assert_int_equal(cuLaunchHostFunc(s, host_fn_a, (void *)(intptr_t)1), CUDA_SUCCESS);
    assert_int_equal(cuLaunchHostFunc(s, host_fn_b, (void *)(intptr_t)2), CUDA_SUCCESS);
    assert_int_equal(cuLaunchHostFunc(s, host_fn_b, (void *)(intptr_t)3), CUDA_SUCCESS);
    /* Nothing ran yet: the kernel is still going. */
    assert_int_equal(__atomic_load_n(&hlog.n, __ATOMIC_SEQ_CST), 0);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(hlog.n, 3);
    assert_int_equal(hlog.order[0], 1);
    assert_int_equal(hlog.order[1], 2);
    assert_int_equal(hlog.order[2], 3);
    assert_int_equal(hlog.seen, 0xabcd); /* after the kernel, in order */
    assert_false(pthread_equal(hlog.thread, pthread_self()));

    /* On the legacy stream too. */
    assert_int_equal(cuLaunchHostFunc(NULL, host_fn_b, (void *)(intptr_t)4), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(hlog.n, 4);
    assert_int_equal(hlog.order[3], 4);

    assert_int_equal(cuLaunchHostFunc(s, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuLaunchHostFunc(s, host_fn_b, NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(hlog.n, 4);
    assert_int_equal(cuMemFreeHost(pinned), CUDA_SUCCESS);
}

/* ---- modelled time ---- */

static void kernel_duration_defaults_to_simcuda_kernel_us(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = zeroed(64);
    CUstream s = stream(CU_STREAM_NON_BLOCKING);
    CUevent e0 = NULL, e1 = NULL, e2 = NULL;
    assert_int_equal(cuEventCreate(&e0, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&e1, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&e2, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e0, s), CUDA_SUCCESS);
    fill(k_fill_default, d, 1, 16, s);
    assert_int_equal(cuEventRecord(e1, s), CUDA_SUCCESS);
    fill(k_fill_fast, d, 2, 16, s);
    assert_int_equal(cuEventRecord(e2, s), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(e2), CUDA_SUCCESS);
    float def = elapsed(e0, e1), fast = elapsed(e1, e2);
    assert_true(def >= DEFAULT_MS);
    assert_true(def < DEFAULT_MS + 300);
    assert_true(fast < DEFAULT_MS - 10);
    assert_int_equal(cuEventDestroy(e0), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(e1), CUDA_SUCCESS);
    assert_int_equal(cuEventDestroy(e2), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

static void copies_across_the_bus_take_bytes_over_bandwidth(void **state)
{
    (void)state;
    need_ctx();
    const size_t n = 16 * MiB;
    const double bus_ms = (double)n / (GBPS * 1e6); /* GB/s = 1e6 bytes/ms */
    CUdeviceptr a = 0, b = 0;
    assert_int_equal(cuMemAlloc(&a, n), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&b, n), CUDA_SUCCESS);
    unsigned char *pageable = malloc(n), *pinned = NULL;
    assert_non_null(pageable);
    assert_int_equal(cuMemHostAlloc((void **)&pinned, n, 0), CUDA_SUCCESS);
    memset(pageable, 0x42, n);
    memset(pinned, 0, n);
    assert_int_equal(cuMemsetD8(a, 0, n), CUDA_SUCCESS); /* fault the pages in first */
    assert_int_equal(cuMemsetD8(b, 0, n), CUDA_SUCCESS);
    CUstream s = stream(CU_STREAM_NON_BLOCKING);
    CUevent e[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(cuEventCreate(&e[i], 0), CUDA_SUCCESS);

    /* Synchronous, from pageable memory: the call itself takes the time. */
    double t0 = now_ms();
    assert_int_equal(cuMemcpyHtoD(a, pageable, n), CUDA_SUCCESS);
    double sync_ms = now_ms() - t0;
    assert_true(sync_ms >= bus_ms);
    assert_true(sync_ms < bus_ms + 500);

    /* Asynchronous, measured with events: device->device costs no bus time. */
    assert_int_equal(cuEventRecord(e[0], s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(pinned, a, n, s), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e[1], s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoDAsync(b, a, n, s), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e[2], s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoDAsync(b, pinned, n, s), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e[3], s), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(e[3]), CUDA_SUCCESS);
    float d2h = elapsed(e[0], e[1]), d2d = elapsed(e[1], e[2]), h2d = elapsed(e[2], e[3]);
    assert_true(d2h >= bus_ms);
    assert_true(d2h < bus_ms + 500);
    assert_true(h2d >= bus_ms);
    assert_true(h2d < bus_ms + 500);
    assert_true(d2d < bus_ms * 0.75); /* device to device: no bus time */
    assert_int_equal(pinned[0], 0x42);
    assert_int_equal(pinned[n - 1], 0x42);

    for (int i = 0; i < 4; i++)
        assert_int_equal(cuEventDestroy(e[i]), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(pinned), CUDA_SUCCESS);
    free(pageable);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(b), CUDA_SUCCESS);
}

/* ---- streams created while another thread submits ---- */

static _Atomic int churn_done;

/* Creates and destroys streams (so their structs are reused), pausing while
 * each one exists, while the main thread keeps submitting to the legacy
 * stream, which looks at every stream's flags. */
static void *churn(void *arg)
{
    (void)arg;
    void *rc = NULL;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        rc = (void *)1;
    for (int i = 0; i < 60 && !rc; i++) {
        CUstream s = NULL;
        unsigned flags = i % 2 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
        if (cuStreamCreateWithPriority(&s, flags, -(i % 6)) != CUDA_SUCCESS)
            rc = (void *)2;
        sleep_ms(1);
        if (!rc && cuStreamDestroy(s) != CUDA_SUCCESS)
            rc = (void *)3;
    }
    churn_done = 1;
    return rc;
}

static void streams_come_and_go_while_another_thread_submits(void **state)
{
    (void)state;
    need_ctx();
    CUdeviceptr d = zeroed(64);
    churn_done = 0;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, churn, NULL), 0);
    uint32_t i = 0;
    struct timespec pace = {0, 100 * 1000};
    while (!churn_done) {
        fill(k_fill_fast, d, ++i, 16, NULL);
        nanosleep(&pace, NULL);
    }
    void *rc = (void *)-1;
    assert_int_equal(pthread_join(th, &rc), 0);
    assert_null(rc);
    assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_true(i > 0);
    assert_true(all_equal((const uint32_t *)(uintptr_t)d, 16, i));
    assert_int_equal(cuMemFree(d), CUDA_SUCCESS);
}

int main(void)
{
    static const char *const env[] = {"SIMCUDA_VRAM_MB", "SIMCUDA_HOST_MB",
                                      "SIMCUDA_GRANULARITY_KB", "SIMCUDA_NO_HOST_VMM"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    setenv("SIMCUDA_PCIE_GBPS", "0.5", 1);
    setenv("SIMCUDA_KERNEL_US", "40000", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_stream_runs_its_work_in_order),
        cmocka_unit_test(race_sync_copy_does_not_wait_for_a_nonblocking_stream),
        cmocka_unit_test(race_async_copy_on_another_stream_is_stale_until_synchronised),
        cmocka_unit_test(legacy_stream_waits_for_blocking_streams),
        cmocka_unit_test(blocking_streams_wait_for_the_legacy_stream_nonblocking_ones_do_not),
        cmocka_unit_test(legacy_stream_does_not_wait_for_nonblocking_streams),
        cmocka_unit_test(per_thread_stream_is_a_blocking_stream),
        cmocka_unit_test(streams_run_concurrently_and_ctx_sync_waits_for_all),
        cmocka_unit_test(events_order_work_across_streams),
        cmocka_unit_test(event_query_synchronize_and_elapsed_time),
        cmocka_unit_test(event_errors),
        cmocka_unit_test(stream_priorities_are_clamped_and_flags_kept),
        cmocka_unit_test(no_stream_is_capturing),
        cmocka_unit_test(destroyed_streams_are_invalid_handles),
        cmocka_unit_test(stream_destroy_returns_while_work_is_pending),
        cmocka_unit_test(host_functions_run_in_stream_order_on_the_worker),
        cmocka_unit_test(kernel_duration_defaults_to_simcuda_kernel_us),
        cmocka_unit_test(copies_across_the_bus_take_bytes_over_bandwidth),
        cmocka_unit_test(streams_come_and_go_while_another_thread_submits),
    };
    return cmocka_run_group_tests_name("sim_streams", tests, NULL, NULL);
}
