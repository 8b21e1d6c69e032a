/* test_intercept.c — every entry of the interception table is gated: while
 * a remap window is open, a call to any wrapper waits on the gate and does
 * not reach the driver until the window closes.
 *
 * Built with the generated wrappers and their zero-argument callers
 * (SH_ICEPT_CALLS) and the library's archive, over the simulated GPU, so
 * the test holds the gate itself. Launch entries are gated in hook mode,
 * which STAGEHAND_TRACKING_MODE selects below.
 */
#define SH_ICEPT_CALLS
#include "gen/intercept.c" /* the wrappers, sh_icept_table and sh_icept_calls */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct caller {
    size_t entry;
    atomic_int done;
};

static void *call(void *arg)
{
    struct caller *c = arg;
    sh_icept_calls[c->entry]();
    atomic_store(&c->done, 1);
    return NULL;
}

static void test_every_entry_waits_out_a_window(void **state)
{
    (void)state;
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, 1 << 20), cudaSuccess); /* the library comes up */
    assert_true(sh_active());
    assert_int_equal(sh_cupti_mode(), SH_TRACK_HOOKS);
    size_t gated = 0;
    for (size_t i = 0; i < sh_icept_count; i++) {
        struct caller c = {.entry = i};
        assert_int_equal(sh_gate_lock(sh_dev_main()->gate), 0);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, call, &c), 0);
        /* The caller either blocks on the gate or gets past it: wait for
         * one of the two, then check which. */
        while (sh_gate_waiting(sh_dev_main()->gate) == 0 && !atomic_load(&c.done))
            sched_yield();
        if (atomic_load(&c.done))
            fail_msg("%s reached the driver inside a remap window", sh_icept_table[i].name);
        sh_gate_unlock(sh_dev_main()->gate);
        pthread_join(t, NULL);
        assert_true(atomic_load(&c.done));
        gated++;
    }
    assert_int_equal(gated, sh_icept_count);
    cudaFree(p);
}

/* The table covers the families the issue names, in every variant. */
static void test_table_names_the_variants(void **state)
{
    (void)state;
    static const char *const want[] = {
        "cuMemsetD32Async",     "cuMemsetD32Async_ptsz",       "cuMemcpyHtoD_v2",
        "cuMemcpyHtoD_v2_ptds", "cuMemcpy3DPeerAsync",         "cuMemcpyBatchAsync_v2",
        "cuStreamWriteValue32", "cuStreamBatchMemOp_v2",       "cuLaunchKernelEx_ptsz",
        "cuGraphLaunch_ptsz",   "cudaMemcpy2DAsync_ptsz",      "cudaMemset3D_ptds",
        "cudaLaunchKernelExC",  "cudaStreamBeginCapture_ptsz", "cuStreamBeginCaptureToGraph",
    };
    for (size_t w = 0; w < sizeof want / sizeof *want; w++) {
        size_t i = 0;
        while (i < sh_icept_count && strcmp(sh_icept_table[i].name, want[w]) != 0)
            i++;
        if (i == sh_icept_count)
            fail_msg("%s is not in the interception table", want[w]);
    }
}

/* A runtime 3D copy between a CUDA array and linear memory counts its
 * width in the array's elements: the linear side's range covers the widest
 * element (16 bytes) per element, not one byte. Without an array, bytes. */
static void test_array_copy_width(void **state)
{
    (void)state;
    static char dst[4 * 4096];
    struct cudaMemcpy3DParms p = {.srcArray = (cudaArray_t)(uintptr_t)0x1000,
                                  .dstPtr = (struct cudaPitchedPtr){dst, 4096, 1024, 4},
                                  .extent = {256, 4, 1},
                                  .kind = cudaMemcpyDeviceToDevice};
    struct sh_work w = {0};
    sh_work_rcopy3d(&w, &p);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.ends[0], (uintptr_t)dst);
    assert_int_equal(w.ends[1], (uintptr_t)dst + 3 * 4096 + 256 * 16 - 1);
    p.srcArray = NULL;
    p.srcPtr = (struct cudaPitchedPtr){dst, 4096, 1024, 4};
    struct sh_work bytes = {0};
    sh_work_rcopy3d(&bytes, &p);
    assert_int_equal(bytes.n, 4);
    assert_int_equal(bytes.ends[3], (uintptr_t)dst + 3 * 4096 + 256 - 1);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* The configuration is read before main: set it and start again. */
    const char *mode = getenv("STAGEHAND_TRACKING_MODE");
    if (!mode || strcmp(mode, "hooks") != 0) {
        setenv("STAGEHAND_TRACKING_MODE", "hooks", 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_names_the_variants),
        cmocka_unit_test(test_array_copy_width),
        cmocka_unit_test(test_every_entry_waits_out_a_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
