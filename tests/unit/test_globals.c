/* test_globals.c — the module globals whose address the program took
 * (interpose/globals.c): which copies meet them, the same global recorded
 * again and again, and a full table folding into one range that still
 * covers every global. The module's state is the process's and only grows:
 * the tests run in order, each above the addresses of the one before.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "interpose/interpose.h"

#include <pthread.h>

/* Nothing recorded: nothing meets, whatever the span. */
static void test_empty(void **state)
{
    (void)state;
    assert_false(sh_globals_meet(0x1000, 16));
    assert_false(sh_globals_meet(0, UINTPTR_MAX));
    sh_globals_add(0, 16); /* a NULL address or no bytes: nothing */
    sh_globals_add(0x1000, 0);
    assert_false(sh_globals_meet(0, 0x2000));
}

/* [p, p + n) meets a global when any byte of it lies inside. */
static void test_bounds(void **state)
{
    (void)state;
    sh_globals_add(0x10000, 0x100);
    assert_false(sh_globals_meet(0xff00, 0x100)); /* ends just before */
    assert_true(sh_globals_meet(0xff00, 0x101));
    assert_true(sh_globals_meet(0x10000, 1));
    assert_true(sh_globals_meet(0x100ff, 8));
    assert_true(sh_globals_meet(0x8000, 0x10000)); /* covers it */
    assert_false(sh_globals_meet(0x10100, 8));     /* starts just after */
    assert_false(sh_globals_meet(0x10000, 0));
}

/* Asked for every step (and by the runtime and the driver underneath):
 * recorded once, so the table does not fill and fold over a gap. */
static void test_again(void **state)
{
    (void)state;
    for (int i = 0; i < 1000; i++) {
        sh_globals_add(0x20000, 0x40);
        sh_globals_add(0x20010, 0x10); /* inside it */
    }
    assert_true(sh_globals_meet(0x20000, 1));
    assert_false(sh_globals_meet(0x10100, 0xff00)); /* the gap between the two */
}

/* More globals than the table holds, from several threads: every one is
 * still met afterwards (the fold covers them; more copies are checked). */
#define THREADS 4
#define EACH    100

static void *add_many(void *arg)
{
    uintptr_t base = 0x100000 + (uintptr_t)arg * 0x100000;
    for (uintptr_t i = 0; i < EACH; i++)
        sh_globals_add(base + i * 0x1000, 8);
    return NULL;
}

static void test_fold(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    for (intptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, add_many, (void *)i), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    for (uintptr_t k = 0; k < THREADS; k++)
        for (uintptr_t i = 0; i < EACH; i++)
            assert_true(sh_globals_meet(0x100000 + k * 0x100000 + i * 0x1000, 8));
    assert_true(sh_globals_meet(0x10000, 1));
    assert_true(sh_globals_meet(0x20000, 1));
    assert_false(sh_globals_meet(0x100000 + THREADS * 0x100000, 8)); /* above them all */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_again),
        cmocka_unit_test(test_fold),
    };
    return cmocka_run_group_tests_name("globals", tests, NULL, NULL);
}
