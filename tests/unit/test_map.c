/* test_map.c — the hash map (map/map.h): insertion, replacement, deletion
 * by backward shift, against a plain array that holds the same keys. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "map/map.h"
#include "sh_err.h"

#include <stdlib.h>

static void test_add_keeps_the_first(void **state)
{
    (void)state;
    struct sh_map m = {0};
    uint32_t out = 0;
    assert_int_equal(sh_map_get(&m, 7), SH_MAP_NONE); /* an all-zero map is empty */
    assert_int_equal(sh_map_add(&m, 7, 1, &out), 0);
    assert_int_equal(out, 1);
    assert_int_equal(sh_map_add(&m, 7, 2, &out), 0);
    assert_int_equal(out, 1); /* present: unchanged */
    assert_int_equal(sh_map_set(&m, 7, 3), 0);
    assert_int_equal(sh_map_get(&m, 7), 3);
    assert_int_equal(m.n, 1);
    /* every key is a key, the value SH_MAP_NONE is not a value */
    assert_int_equal(sh_map_set(&m, 0, 10), 0);
    assert_int_equal(sh_map_set(&m, UINT64_MAX, 11), 0);
    assert_int_equal(sh_map_get(&m, 0), 10);
    assert_int_equal(sh_map_get(&m, UINT64_MAX), 11);
    assert_int_equal(sh_map_set(&m, 5, SH_MAP_NONE), SH_EINVAL);
    assert_int_equal(sh_map_add(&m, 5, SH_MAP_NONE, &out), SH_EINVAL);
    assert_int_equal(sh_map_get(&m, 5), SH_MAP_NONE);
    assert_int_equal(m.n, 3);
    sh_map_free(&m);
}

/* Random additions, replacements and deletions over a small key space
 * (long probe runs that wrap the table's end) agree with an array, and
 * churn does not grow the table: a deletion leaves no tombstone. */
static void test_random_ops_match_an_array(void **state)
{
    (void)state;
    enum { KEYS = 300, OPS = 200000 };
    uint32_t model[KEYS];
    for (int i = 0; i < KEYS; i++)
        model[i] = SH_MAP_NONE;
    struct sh_map m = {0};
    srand(12345);
    size_t live = 0, max_cap = 0;
    for (int op = 0; op < OPS; op++) {
        int k = rand() % KEYS;
        uint64_t key = (uint64_t)k * 0x100000001ull; /* high and low bits both vary */
        uint32_t v = (uint32_t)rand() % 1000;
        switch (rand() % 3) {
        case 0:
            assert_int_equal(sh_map_set(&m, key, v), 0);
            live += model[k] == SH_MAP_NONE;
            model[k] = v;
            break;
        case 1: {
            uint32_t out;
            assert_int_equal(sh_map_add(&m, key, v, &out), 0);
            live += model[k] == SH_MAP_NONE;
            if (model[k] == SH_MAP_NONE)
                model[k] = v;
            assert_int_equal(out, model[k]);
            break;
        }
        default:
            assert_int_equal(sh_map_del(&m, key), model[k] != SH_MAP_NONE);
            live -= model[k] != SH_MAP_NONE;
            model[k] = SH_MAP_NONE;
        }
        assert_int_equal(m.n, live);
        if (op % 1000 == 0)
            for (int i = 0; i < KEYS; i++)
                assert_int_equal(sh_map_get(&m, (uint64_t)i * 0x100000001ull), model[i]);
        max_cap = m.cap > max_cap ? m.cap : max_cap;
    }
    assert_true(max_cap <= 512); /* never more than 300 keys at 3/4 full */
    sh_map_free(&m);
    assert_null(m.k);
    assert_int_equal(m.cap, 0);
}

/* Deleting from the middle of a cluster keeps every key after it
 * reachable, including those whose run wrapped past the table's end. */
static void test_delete_inside_runs(void **state)
{
    (void)state;
    struct sh_map m = {0};
    for (uint64_t k = 0; k < 40; k++)
        assert_int_equal(sh_map_set(&m, k, (uint32_t)k), 0);
    assert_int_equal(m.cap, 64);
    for (uint64_t k = 0; k < 40; k += 3)
        assert_int_equal(sh_map_del(&m, k), 1);
    for (uint64_t k = 0; k < 40; k++)
        assert_int_equal(sh_map_get(&m, k), k % 3 ? (uint32_t)k : SH_MAP_NONE);
    assert_int_equal(sh_map_del(&m, 0), 0);
    sh_map_free(&m);
}

static void test_clear_and_reset(void **state)
{
    (void)state;
    struct sh_map m = {0};
    for (uint64_t k = 0; k < 10000; k++)
        assert_int_equal(sh_map_set(&m, k, 1), 0);
    size_t big = m.cap;
    sh_map_clear(&m);
    assert_int_equal(m.n, 0);
    assert_int_equal(m.cap, big); /* memory kept */
    assert_int_equal(sh_map_get(&m, 5), SH_MAP_NONE);
    assert_int_equal(sh_map_set(&m, 5, 2), 0);
    sh_map_reset(&m, 100); /* far smaller than the table: memory given back */
    assert_int_equal(m.cap, 0);
    assert_int_equal(sh_map_get(&m, 5), SH_MAP_NONE);
    assert_int_equal(sh_map_set(&m, 5, 3), 0);
    sh_map_reset(&m, 60); /* about its size: kept */
    assert_int_equal(m.cap, 64);
    assert_int_equal(m.n, 0);
    sh_map_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_keeps_the_first),
        cmocka_unit_test(test_random_ops_match_an_array),
        cmocka_unit_test(test_delete_inside_runs),
        cmocka_unit_test(test_clear_and_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
