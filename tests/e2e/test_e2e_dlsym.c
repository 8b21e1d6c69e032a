/* test_e2e_dlsym.c — the library's dlsym answers as glibc's does where the
 * answer depends on the caller: RTLD_NEXT searches after the object that
 * asks (not after the library), and RTLD_DEFAULT includes the asker's own
 * local scope (a Python extension's dependencies, say). Lookups of the
 * driver still hand out the library's wrappers when it is preloaded.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

int sh_next_twice(void); /* dlsym_objs.c, OBJ_A */

static int from_stagehand(void *f)
{
    Dl_info info;
    return f && dladdr(f, &info) && info.dli_fname && strstr(info.dli_fname, "libstagehand");
}

static void test_next_is_after_the_caller(void **state)
{
    (void)state;
    assert_int_equal(sh_next_twice(), 2); /* 1 would be the caller's own */
}

static void test_default_includes_the_callers_scope(void **state)
{
    (void)state;
    void *c = dlopen("libshdl_c.so", RTLD_NOW | RTLD_LOCAL);
    assert_non_null(c);
    int (*probe)(void) = (int (*)(void))dlsym(c, "sh_local_probe");
    assert_non_null(probe);
    assert_int_equal(probe(), 4);
    assert_null(dlsym(RTLD_DEFAULT, "sh_only_in_d")); /* not in ours */
    dlclose(c);
}

static void test_driver_lookups_are_wrapped(void **state)
{
    (void)state;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(cuda);
    int preloaded = getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "libstagehand");
    assert_int_equal(from_stagehand(dlsym(cuda, "cuMemsetD32Async")), preloaded);
    assert_int_equal(from_stagehand(dlsym(RTLD_DEFAULT, "cuMemsetD32Async")), preloaded);
    assert_false(from_stagehand(dlsym(cuda, "cuDeviceGetCount"))); /* issues no work */
    dlclose(cuda);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_next_is_after_the_caller),
        cmocka_unit_test(test_default_includes_the_callers_scope),
        cmocka_unit_test(test_driver_lookups_are_wrapped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
