/* test_sim_module.c — modules on the simulated GPU: the library's PTX
 * loads and its kernel computes the CPU fingerprint's part, on a stream,
 * from device memory, with any grid; any other image, a changed copy of
 * the PTX included, is refused loudly; handles are checked.
 *
 * main() sets SIMCUDA_KERNEL_US, which the library's kernels must ignore,
 * and SIMCUDA_HBM_GBPS, the rate at which they read device memory.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include "simcuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clean/clean.h"

static CUcontext ctx;

static void need_ctx(void)
{
    if (ctx)
        return;
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    CUdevice dev;
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

/* Runs the kernel over n bytes of device memory filled from host bytes p
 * with `grid` blocks; returns X. */
static void run_kernel(CUfunction f, const unsigned char *p, uint64_t n, unsigned grid,
                       const struct sh_clean_key *k, uint64_t x[2])
{
    CUdeviceptr src, key, out;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&src, n), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&key, sizeof *k), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&out, 16), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD(src, p, n), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD(key, k, sizeof *k), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8Async(out, 0, 16, s), CUDA_SUCCESS);
    void *args[] = {&src, &n, &key, &out};
    assert_int_equal(cuLaunchKernel(f, grid, 1, 1, SH_CLEAN_THREADS, 1, 1, 0, s, args, NULL),
                     CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(x, out, 16, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    cuMemFree(src);
    cuMemFree(key);
    cuMemFree(out);
    cuStreamDestroy(s);
}

static void test_kernel_matches_cpu(void **state)
{
    (void)state;
    need_ctx();
    CUmodule m;
    CUfunction f;
    assert_int_equal(cuModuleLoadData(&m, sh_clean_ptx), CUDA_SUCCESS);
    assert_int_equal(cuModuleGetFunction(&f, m, SH_CLEAN_KERNEL), CUDA_SUCCESS);
    struct sh_clean_key k;
    assert_int_equal(sh_clean_key_random(&k), 0);
    const uint64_t n = 3 * SH_CLEAN_BLOCK + 12;
    unsigned char *p = malloc(n);
    assert_non_null(p);
    for (uint64_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 7 + 3);
    uint64_t want[2] = {0, 0};
    sh_clean_blocks(&k, p, n, want);
    static const unsigned grids[] = {1, 2, 4, 1024};
    for (size_t g = 0; g < sizeof grids / sizeof *grids; g++) {
        uint64_t x[2];
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        run_kernel(f, p, n, grids[g], &k, x);
        clock_gettime(CLOCK_MONOTONIC, &b);
        assert_memory_equal(x, want, sizeof want);
        /* SIMCUDA_KERNEL_US (2 s) is not this kernel's time; its bytes
         * at SIMCUDA_HBM_GBPS are (12 KB at 50 MB/s: a quarter of a ms). */
        assert_true(b.tv_sec - a.tv_sec < 2);
    }
    free(p);
    assert_int_equal(cuModuleUnload(m), CUDA_SUCCESS);
    assert_int_equal(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuModuleGetFunction(&f, m, SH_CLEAN_KERNEL), CUDA_ERROR_INVALID_HANDLE);
}

/* The prefilter over nw words copied to the device: its found flag. */
static uint32_t run_ptrs(CUfunction f, const uint32_t *w, uint64_t nw, uint32_t top, uint32_t span)
{
    CUdeviceptr words, found;
    uint32_t got = 7;
    assert_int_equal(cuMemAlloc(&words, nw * 4 + 4), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&found, 4), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD(words, w, nw * 4), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8(found, 0, 4), CUDA_SUCCESS);
    void *args[] = {&words, &nw, &top, &span, &found};
    assert_int_equal(cuLaunchKernel(f, 4, 1, 1, SH_CLEAN_THREADS, 1, 1, 0, NULL, args, NULL),
                     CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(&got, found, 4), CUDA_SUCCESS);
    cuMemFree(words);
    cuMemFree(found);
    return got;
}

/* The pointer prefilter from the same PTX: a word in [top, top + span]
 * anywhere but word 0 (no pointer's high half can be there) is found. */
static void test_ptrs_kernel(void **state)
{
    (void)state;
    need_ctx();
    CUmodule m;
    CUfunction f;
    assert_int_equal(cuModuleLoadData(&m, sh_clean_ptx), CUDA_SUCCESS);
    assert_int_equal(cuModuleGetFunction(&f, m, SH_PTRS_KERNEL), CUDA_SUCCESS);
    enum { NW = 3000 };
    static uint32_t w[NW];
    for (uint32_t i = 0; i < NW; i++)
        w[i] = i * 2654435761u | 0x80000000u; /* never in [0x7f00, 0x7f10] */
    const uint32_t top = 0x7f00, span = 0x10;
    assert_int_equal(run_ptrs(f, w, NW, top, span), 0);
    assert_int_equal(sh_clean_ptr_candidate(w, NW, top, span), 0);
    static const uint32_t at[] = {0, 1, 1234, NW - 1}, val[] = {0x7f00, 0x7f10, 0x7f08, 0x7f10};
    for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
        uint32_t was = w[at[k]];
        w[at[k]] = val[k];
        uint32_t want = at[k] != 0;
        assert_int_equal(run_ptrs(f, w, NW, top, span), want);
        assert_int_equal(sh_clean_ptr_candidate(w, NW, top, span), want);
        w[at[k]] = top - 1; /* just below: nothing */
        assert_int_equal(run_ptrs(f, w, NW, top, span), 0);
        w[at[k]] = top + span + 1; /* just above */
        assert_int_equal(run_ptrs(f, w, NW, top, span), 0);
        w[at[k]] = was;
    }
    assert_int_equal(run_ptrs(f, w, 1, top, span), 0); /* one word: no high half */
    assert_int_equal(cuModuleUnload(m), CUDA_SUCCESS);
}

static double seconds_since(const struct timespec *a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) + (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

/* Both kernels take at least their bytes over SIMCUDA_HBM_GBPS (HBM_GBPS
 * here), the fingerprint reading its length in bytes, the prefilter its
 * words, and still compute what they compute. The card's statistics count
 * what they read and the time they took (what a test tells stagehand-sim
 * of the card: at least the modelled time, and no more than was waited). */
#define HBM_GBPS "0.05"
static void test_kernels_read_at_hbm_rate(void **state)
{
    (void)state;
    need_ctx();
    CUmodule m;
    CUfunction fp, ptrs;
    assert_int_equal(cuModuleLoadData(&m, sh_clean_ptx), CUDA_SUCCESS);
    assert_int_equal(cuModuleGetFunction(&fp, m, SH_CLEAN_KERNEL), CUDA_SUCCESS);
    assert_int_equal(cuModuleGetFunction(&ptrs, m, SH_PTRS_KERNEL), CUDA_SUCCESS);
    const double rate = atof(HBM_GBPS) * 1e9;
    enum { NW = 1 << 20 }; /* 4 MB: 84 ms at 50 MB/s */
    uint32_t *w = calloc(NW, 4);
    assert_non_null(w);
    w[NW / 2] = 0x7f04;
    simcuda_stats_t st0, st1;
    simcuda_get_stats(&st0);
    struct timespec a;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(run_ptrs(ptrs, w, NW, 0x7f00, 0x10), 1);
    double waited = seconds_since(&a);
    assert_true(waited >= NW * 4.0 / rate);
    simcuda_get_stats(&st1);
    assert_int_equal(st1.bytes_hbm - st0.bytes_hbm, NW * 4ull);
    assert_true((double)(st1.us_hbm - st0.us_hbm) >= NW * 4.0 / rate * 1e6 - 1);
    assert_true((double)(st1.us_hbm - st0.us_hbm) <= waited * 1e6 + 1);
    struct sh_clean_key k;
    assert_int_equal(sh_clean_key_random(&k), 0);
    uint64_t want[2] = {0, 0}, got[2];
    sh_clean_blocks(&k, w, NW * 4ull, want);
    clock_gettime(CLOCK_MONOTONIC, &a);
    run_kernel(fp, (const unsigned char *)w, NW * 4ull, 64, &k, got);
    assert_true(seconds_since(&a) >= NW * 4.0 / rate);
    assert_memory_equal(got, want, sizeof want);
    free(w);
    assert_int_equal(cuModuleUnload(m), CUDA_SUCCESS);
}

static void test_other_images_refused(void **state)
{
    (void)state;
    need_ctx();
    size_t n = strlen(sh_clean_ptx);
    char *changed = malloc(n + 1);
    assert_non_null(changed);
    memcpy(changed, sh_clean_ptx, n + 1);
    changed[n - 2] = changed[n - 2] == ' ' ? '\t' : ' '; /* one byte off */
    char err[1024] = "";
    fflush(stderr);
    FILE *cap = tmpfile();
    assert_non_null(cap);
    int saved = dup(2);
    dup2(fileno(cap), 2);
    CUmodule m = NULL;
    CUresult r1 = cuModuleLoadData(&m, changed);
    CUresult r2 = cuModuleLoadData(&m, "\177ELF not a module");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(cap);
    err[fread(err, 1, sizeof err - 1, cap)] = 0;
    fclose(cap);
    free(changed);
    assert_int_equal(r1, CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(r2, CUDA_ERROR_NOT_SUPPORTED);
    assert_null(m);
    assert_non_null(strstr(err, "cuModuleLoadData"));
    assert_int_equal(cuModuleLoadData(NULL, sh_clean_ptx), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuModuleLoadData(&m, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuModuleLoadData(&m, sh_clean_ptx), CUDA_SUCCESS);
    CUfunction f = NULL;
    assert_int_equal(cuModuleGetFunction(&f, m, "another_kernel"), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(cuModuleGetFunction(&f, (CUmodule)&f, SH_CLEAN_KERNEL),
                     CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuModuleGetFunction(NULL, m, SH_CLEAN_KERNEL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuModuleUnload(m), CUDA_SUCCESS);
}

int main(void)
{
    setenv("SIMCUDA_KERNEL_US", "2000000", 1);
    setenv("SIMCUDA_HBM_GBPS", HBM_GBPS, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_matches_cpu),
        cmocka_unit_test(test_ptrs_kernel),
        cmocka_unit_test(test_kernels_read_at_hbm_rate),
        cmocka_unit_test(test_other_images_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
