/* test_state.c — residency state machine: all 36 (from, to) pairs, the loud
 * report on invalid moves, and compare-and-swap under contention. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool_parts.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- stderr capture ---------------------------------------------------------- */

static int saved_fd = -1;
static FILE *cap;
static char captured[4096];

static void capture_begin(void)
{
    fflush(stderr);
    cap = tmpfile();
    assert_non_null(cap);
    saved_fd = dup(STDERR_FILENO);
    assert_true(saved_fd >= 0);
    assert_true(dup2(fileno(cap), STDERR_FILENO) >= 0);
}

static const char *capture_end(void)
{
    fflush(stderr);
    dup2(saved_fd, STDERR_FILENO);
    close(saved_fd);
    rewind(cap);
    size_t n = fread(captured, 1, sizeof captured - 1, cap);
    captured[n] = '\0';
    fclose(cap);
    return captured;
}

/* ---- the table, written out independently of the implementation ------------ */

static const int valid_pairs[][2] = {
    {SH_RS_RESIDENT, SH_RS_EVICTING},  {SH_RS_EVICTING, SH_RS_HOST},
    {SH_RS_EVICTING, SH_RS_RESIDENT},  {SH_RS_HOST, SH_RS_RESTORING},
    {SH_RS_RESTORING, SH_RS_RESIDENT}, {SH_RS_RESTORING, SH_RS_HOST},
    {SH_RS_RESIDENT, SH_RS_FREED},     {SH_RS_HOST, SH_RS_FREED},
    {SH_RS_FREED, SH_RS_RESIDENT},     {SH_RS_FREED, SH_RS_DEAD},
};

static int expected(int from, int to)
{
    for (size_t i = 0; i < sizeof valid_pairs / sizeof valid_pairs[0]; i++)
        if (valid_pairs[i][0] == from && valid_pairs[i][1] == to)
            return 1;
    return 0;
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(sh_state_name(SH_RS_RESIDENT), "RESIDENT");
    assert_string_equal(sh_state_name(SH_RS_EVICTING), "EVICTING");
    assert_string_equal(sh_state_name(SH_RS_HOST), "HOST");
    assert_string_equal(sh_state_name(SH_RS_RESTORING), "RESTORING");
    assert_string_equal(sh_state_name(SH_RS_FREED), "FREED");
    assert_string_equal(sh_state_name(SH_RS_DEAD), "DEAD");
    assert_string_equal(sh_state_name(-1), "INVALID");
    assert_string_equal(sh_state_name(SH_RS_COUNT), "INVALID");
}

static void test_valid_table(void **state)
{
    (void)state;
    int n = 0;
    for (int from = 0; from < SH_RS_COUNT; from++)
        for (int to = 0; to < SH_RS_COUNT; to++) {
            assert_int_equal(sh_state_valid(from, to), expected(from, to));
            n += sh_state_valid(from, to);
        }
    assert_int_equal(n, 10);
    assert_int_equal(sh_state_valid(-1, SH_RS_RESIDENT), 0);
    assert_int_equal(sh_state_valid(SH_RS_RESIDENT, SH_RS_COUNT), 0);
    assert_int_equal(sh_state_valid(SH_RS_FREED, 99), 0);
}

/* Every pair through sh_state_move: valid ones move silently, invalid ones
 * leave the state alone and say exactly what happened. */
static void test_move_all_pairs(void **state)
{
    (void)state;
    for (int from = 0; from < SH_RS_COUNT; from++)
        for (int to = 0; to < SH_RS_COUNT; to++) {
            int s = from;
            capture_begin();
            int rc = sh_state_move(&s, to, 42);
            const char *out = capture_end();
            if (expected(from, to)) {
                assert_int_equal(rc, 0);
                assert_int_equal(s, to);
                assert_string_equal(out, "");
            } else {
                char want[256];
                snprintf(want, sizeof want,
                         "stagehand: error: bug: region 42: invalid transition %s -> %s\n",
                         sh_state_name(from), sh_state_name(to));
                assert_int_equal(rc, SH_ESTATE);
                assert_int_equal(s, from);
                assert_string_equal(out, want);
            }
        }
}

static void test_move_from_all_pairs(void **state)
{
    (void)state;
    for (int from = 0; from < SH_RS_COUNT; from++)
        for (int to = 0; to < SH_RS_COUNT; to++) {
            int s = from;
            capture_begin();
            int rc = sh_state_move_from(&s, from, to, 7);
            const char *out = capture_end();
            assert_int_equal(rc, expected(from, to) ? 0 : SH_ESTATE);
            assert_int_equal(s, expected(from, to) ? to : from);
            assert_int_equal(out[0] != '\0', !expected(from, to));
        }
}

static void test_lifecycle(void **state)
{
    (void)state;
    static const int path[] = {SH_RS_EVICTING,  SH_RS_HOST,     SH_RS_RESTORING, SH_RS_HOST,
                               SH_RS_RESTORING, SH_RS_RESIDENT, SH_RS_EVICTING,  SH_RS_RESIDENT,
                               SH_RS_FREED,     SH_RS_RESIDENT, SH_RS_EVICTING,  SH_RS_HOST,
                               SH_RS_FREED,     SH_RS_DEAD};
    int s = SH_RS_RESIDENT;
    for (size_t i = 0; i < sizeof path / sizeof path[0]; i++) {
        assert_int_equal(sh_state_move(&s, path[i], 1), 0);
        assert_int_equal(sh_state_get(&s), path[i]);
    }
    capture_begin();
    int rc = sh_state_move(&s, SH_RS_RESIDENT, 18446744073709551615ull);
    const char *out = capture_end();
    assert_int_equal(rc, SH_ESTATE);
    assert_non_null(strstr(out, "bug: region 18446744073709551615: invalid transition "
                                "DEAD -> RESIDENT"));
}

static void test_out_of_range(void **state)
{
    (void)state;
    int s = SH_RS_HOST;
    capture_begin();
    int rc = sh_state_move(&s, 99, 3);
    const char *out = capture_end();
    assert_int_equal(rc, SH_ESTATE);
    assert_int_equal(s, SH_RS_HOST);
    assert_non_null(strstr(out, "bug: region 3: invalid transition HOST -> INVALID"));
    s = 17; /* corrupted word: nothing may move it */
    capture_begin();
    rc = sh_state_move(&s, SH_RS_RESIDENT, 4);
    out = capture_end();
    assert_int_equal(rc, SH_ESTATE);
    assert_int_equal(s, 17);
    assert_non_null(strstr(out, "INVALID -> RESIDENT"));
}

/* Someone else moved first: a quiet SH_EBUSY, state untouched. */
static void test_move_from_lost_race(void **state)
{
    (void)state;
    int s = SH_RS_HOST;
    capture_begin();
    int rc = sh_state_move_from(&s, SH_RS_RESIDENT, SH_RS_EVICTING, 5);
    const char *out = capture_end();
    assert_int_equal(rc, SH_EBUSY);
    assert_int_equal(s, SH_RS_HOST);
    assert_string_equal(out, "");
}

/* RESIDENT -> EVICTING as a try-lock: at most one thread may be in EVICTING. */
#define THREADS 4
#define ROUNDS  20000

static int shared_state = SH_RS_RESIDENT;
static int holders, overlap, wins;

static void *contender(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        if (sh_state_move_from(&shared_state, SH_RS_RESIDENT, SH_RS_EVICTING, 9) != 0)
            continue;
        if (__atomic_add_fetch(&holders, 1, __ATOMIC_SEQ_CST) > 1)
            __atomic_store_n(&overlap, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&wins, 1, __ATOMIC_SEQ_CST);
        __atomic_sub_fetch(&holders, 1, __ATOMIC_SEQ_CST);
        if (sh_state_move(&shared_state, SH_RS_RESIDENT, 9) != 0)
            __atomic_store_n(&overlap, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void test_concurrent_cas(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, contender, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(overlap, 0);
    assert_true(wins > 0);
    assert_int_equal(sh_state_get(&shared_state), SH_RS_RESIDENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_valid_table),
        cmocka_unit_test(test_move_all_pairs),
        cmocka_unit_test(test_move_from_all_pairs),
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_move_from_lost_race),
        cmocka_unit_test(test_concurrent_cas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
