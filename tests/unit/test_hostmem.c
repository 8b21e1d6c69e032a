/* test_hostmem.c — the host memory kernels can read (interpose/hostmem.c):
 * which values point into it, as allocations and registrations come and
 * go. The module's state is the process's: each test removes what it adds,
 * but the last, whose failure to record a range lasts (the module's realloc
 * is wrapped at link time: -Wl,--wrap=realloc).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "interpose/interpose.h"

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);
static int fail_realloc;

void *__wrap_realloc(void *p, size_t n)
{
    return fail_realloc ? NULL : __real_realloc(p, n);
}

static int hit(uintptr_t v)
{
    return sh_hostmem_hit(&v, 1);
}

/* Nothing recorded: nothing hits, whatever the value. */
static void test_empty(void **state)
{
    (void)state;
    assert_false(hit(0x1000));
    assert_false(hit(UINTPTR_MAX));
    assert_false(sh_hostmem_hit(NULL, 0));
}

/* A range covers [start, start + size): both ends are exact. */
static void test_bounds(void **state)
{
    (void)state;
    sh_hostmem_add((void *)0x10000, 0x1000);
    assert_false(hit(0xffff));
    assert_true(hit(0x10000));
    assert_true(hit(0x10fff));
    assert_false(hit(0x11000));
    assert_false(hit(UINTPTR_MAX));
    uintptr_t some[] = {1, 2, 0x10800, 3};
    assert_true(sh_hostmem_hit(some, 4)); /* any of them */
    assert_false(sh_hostmem_hit(some, 2));
    sh_hostmem_del((void *)0x10000);
    assert_false(hit(0x10000));
}

/* Ranges out of order, one recorded twice (the runtime's call and the
 * driver's underneath), one removed from the middle, an unknown start
 * removed (nothing happens); more than the first allocation holds. */
static void test_many(void **state)
{
    (void)state;
    enum { N = 300 };
    for (uintptr_t i = N; i-- > 0;)
        sh_hostmem_add((void *)(0x100000 + i * 0x10000), 0x100);
    sh_hostmem_add((void *)0x100000, 0x100);
    sh_hostmem_del((void *)0x123);
    for (uintptr_t i = 0; i < N; i++) {
        uintptr_t at = 0x100000 + i * 0x10000;
        assert_true(hit(at + 0xff));
        assert_false(hit(at + 0x100));
    }
    sh_hostmem_del((void *)(0x100000 + 7 * 0x10000));
    assert_false(hit(0x100000 + 7 * 0x10000));
    assert_true(hit(0x100000 + 8 * 0x10000));
    assert_true(hit(0x100000 + 6 * 0x10000));
    for (uintptr_t i = 0; i < N; i++)
        sh_hostmem_del((void *)(0x100000 + i * 0x10000));
    for (uintptr_t i = 0; i < N; i++)
        assert_false(hit(0x100000 + i * 0x10000));
}

/* Out of memory to record a range: from then on every value between the
 * first and the last range added hits (a table there may be unrecorded),
 * and tables are said to have changed; values outside still miss. */
static void test_out_of_memory(void **state)
{
    (void)state;
    enum { N = 1200 }; /* past what test_many's growth left room for */
    uint64_t gen = sh_hostmem_gen();
    fail_realloc = 1;
    for (uintptr_t i = 0; i < N; i++)
        sh_hostmem_add((void *)(0x1000000 + i * 0x10000), 0x100);
    fail_realloc = 0;
    assert_true(sh_hostmem_gen() > gen + 1);
    assert_true(hit(0x1000000 + (N - 1) * 0x10000)); /* not recorded */
    assert_true(hit(0x1000000 + 0x200));             /* between ranges */
    assert_false(hit(0xffff));                       /* below test_bounds' range, the first */
    assert_false(hit(0x1000000 + N * 0x10000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty), cmocka_unit_test(test_bounds), cmocka_unit_test(test_many),
        cmocka_unit_test(test_out_of_memory), /* last: it lasts */
    };
    return cmocka_run_group_tests_name("hostmem", tests, NULL, NULL);
}
