/* test_e2e_lazydriver.c — the driver loaded late, as the CUDA runtime
 * loads it.
 *
 * A program links libcudart, which opens libcuda only at its first call,
 * while the program's fatbins are registered before main. On an H200 the
 * library's module hooks looked their real functions up at that first
 * registration, found none, kept the answer and called NULL at the first
 * kernel load: every program that does not link libcuda itself crashed,
 * PyTorch included. This program links neither library. It registers a
 * fatbin first, then opens the (simulated) driver locally, as the runtime
 * does, and loads a module through the entry point cuGetProcAddress hands
 * out, which is the library's hook: the load must reach the driver.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "clean/clean.h"

#include <cuda.h>
#include <dlfcn.h>
#include <fatbinary_section.h>
#include <string.h>

typedef void **(*register_fatbin_fn)(void *);
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static void *driver;

/* A driver function found through cuGetProcAddress, as the runtime finds
 * them: what the library hands out in its place, if it hooks it. */
static void *entry(const char *name)
{
    get_proc_fn get = (get_proc_fn)dlsym(driver, "cuGetProcAddress_v2");
    assert_non_null(get);
    void *f = NULL;
    CUdriverProcAddressQueryResult q;
    assert_int_equal(get(name, &f, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q), CUDA_SUCCESS);
    assert_non_null(f);
    return f;
}

static void test_module_load_after_late_driver(void **state)
{
    (void)state;
    /* Before main in a real program: no runtime here to take it, so the
     * hook can only pass it on to nothing. The image is not one the
     * library reads (no magic): only the lookup matters. */
    register_fatbin_fn reg = (register_fatbin_fn)dlsym(RTLD_DEFAULT, "__cudaRegisterFatBinary");
    if (reg) {
        static __fatBinC_Wrapper_t w;
        assert_null(reg(&w));
    }
    assert_null(dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD));

    driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    assert_non_null(driver);
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))entry("cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))entry("cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))entry("cuCtxSetCurrent");
    assert_int_equal(init(0), CUDA_SUCCESS);
    CUcontext ctx = NULL;
    assert_int_equal(retain(&ctx, 0), CUDA_SUCCESS);
    assert_int_equal(set_current(ctx), CUDA_SUCCESS);

    CUresult (*load)(CUmodule *, const void *) =
        (CUresult(*)(CUmodule *, const void *))entry("cuModuleLoadData");
    CUresult (*get_function)(CUfunction *, CUmodule, const char *) =
        (CUresult(*)(CUfunction *, CUmodule, const char *))entry("cuModuleGetFunction");
    CUmodule mod = NULL;
    assert_int_equal(load(&mod, sh_clean_ptx), CUDA_SUCCESS);
    assert_non_null(mod);
    CUfunction f = NULL;
    assert_int_equal(get_function(&f, mod, SH_CLEAN_KERNEL), CUDA_SUCCESS);
    assert_non_null(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_module_load_after_late_driver),
    };
    return cmocka_run_group_tests_name("e2e_lazydriver", tests, NULL, NULL);
}
