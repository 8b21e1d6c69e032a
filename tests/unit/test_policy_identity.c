/* test_policy_identity.c — a region's role when its id comes back: the
 * library names regions by address, and its pool gives a freed region's
 * address to the next allocation of the same size, within a step and
 * across steps. A recording, and belady's future, must tell those regions
 * apart. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "policy/policy.h"
#include "sh_err.h"

#include <string.h>

#include "policy_loop.h"

static void alloc(struct sh_policy *p, uint64_t id)
{
    assert_int_equal(sh_policy_alloc(p, t_now, id, 100, 7), 0);
}

/* As the library frees: the policy records the free and forgets at once. */
static void release(struct sh_policy *p, uint64_t id)
{
    assert_int_equal(sh_policy_free(p, t_now, id), 0);
    assert_int_equal(sh_policy_forget(p, id), 0);
}

static int following(const struct sh_policy *p)
{
    return stats(p).following;
}

/* One step with weights 1 and 2: activation X at the step's start, Y after
 * the first launch; X is freed and its address goes at once to Z, another
 * tensor; the two addresses swap roles from one step to the next, as the
 * pool hands them out. Asserts, once the policy follows, that it keeps
 * following and predicts each activation's next use. */
static void reusing_step(struct sh_policy *p, int s, int check)
{
    uint64_t a = s % 2 ? 51 : 50, b = s % 2 ? 50 : 51;
    assert_int_equal(sh_policy_step(p, t_now), 0);
    alloc(p, a); /* X */
    uint64_t f1[] = {1, a};
    launch(p, KF, f1, 2);
    alloc(p, b); /* Y */
    uint64_t f2[] = {2, b};
    launch(p, KF, f2, 2);
    release(p, a);
    alloc(p, a); /* Z, at X's address */
    if (check) { /* Z's place among its position's allocations is known at the next launch */
        assert_int_equal(following(p), 1);
        assert_int_equal(next_use(p, b), 0);
    }
    uint64_t b1[] = {2, a, b};
    launch(p, KB, b1, 3);
    if (check) {
        assert_int_equal(following(p), 1);
        assert_int_equal(next_use(p, b), 0);
        assert_int_equal(next_use(p, a), UINT64_MAX); /* Z: freed with no use left */
    }
    uint64_t b2[] = {1, b};
    launch(p, KB, b2, 2);
    if (check)
        assert_int_equal(following(p), 1);
    release(p, b);
    release(p, a);
}

static void test_learned_follows_reused_addresses(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc(p, 1);
    alloc(p, 2);
    for (int s = 0; s < 4; s++)
        reusing_step(p, s, s >= 2);
    struct sh_policy_stats st;
    sh_policy_stats(p, &st);
    assert_int_equal(st.steps_matched, 2);
    assert_int_equal(st.recordings, 1);
    sh_policy_destroy(p);
}

/* Belady's future names an allocation, not an id: a region allocated at an
 * address used before is next needed where that allocation is, and one
 * that existed before the future keeps its own uses. */
static void test_belady_future_by_allocation(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_BELADY);
    alloc(p, 1);
    static const uint64_t r1[] = {1}, r5[] = {5};
    const struct sh_policy_future fut[] = {
        {.kind = SH_FUTURE_ALLOC, .id = 5, .bytes = 100},
        {.kind = SH_FUTURE_LAUNCH, .ids = r5, .n = 1},
        {.kind = SH_FUTURE_FREE, .id = 5},
        {.kind = SH_FUTURE_LAUNCH, .ids = r1, .n = 1},
        {.kind = SH_FUTURE_LAUNCH, .ids = r1, .n = 1},
        {.kind = SH_FUTURE_FREE, .id = 1},
        {.kind = SH_FUTURE_ALLOC, .id = 5, .bytes = 100},
        {.kind = SH_FUTURE_ALLOC, .id = 1, .bytes = 100},
        {.kind = SH_FUTURE_LAUNCH, .ids = r1, .n = 1},
        {.kind = SH_FUTURE_LAUNCH, .ids = r5, .n = 1},
    };
    assert_int_equal(sh_policy_set_future(p, fut, sizeof fut / sizeof fut[0]), 0);
    assert_int_equal(next_use(p, 1), 1);
    alloc(p, 5);
    assert_int_equal(next_use(p, 5), 0);
    launch(p, KF, r5, 1);
    assert_int_equal(next_use(p, 5), UINT64_MAX); /* this allocation is not used again */
    release(p, 5);
    launch(p, KF, r1, 1);
    assert_int_equal(next_use(p, 1), 0);
    launch(p, KF, r1, 1);
    assert_int_equal(next_use(p, 1), UINT64_MAX);
    release(p, 1);
    alloc(p, 5);
    alloc(p, 1);
    assert_int_equal(next_use(p, 5), 1);
    assert_int_equal(next_use(p, 1), 0);
    sh_policy_destroy(p);
}

/* A region allocated since the last launch has no identity yet (its place
 * among its position's allocations is known at the next launch), but it is
 * there for the launches about to come: it goes last, not first, when room
 * is made before them. Checkpointed GPT at 2x evicted whole bursts of fresh
 * allocations this way, and restored them a few launches later. */
static void test_learned_keeps_fresh_allocations(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc(p, 1);
    alloc(p, 2);
    static const uint64_t w1[] = {1}, w2[] = {2};
    for (uint64_t s = 0; s < 4; s++) {
        uint64_t a = 100 + 2 * s, b = a + 1; /* new ids each step */
        assert_int_equal(sh_policy_step(p, t_now), 0);
        launch(p, KF, w1, 1);
        alloc(p, a);
        alloc(p, b);
        if (s == 3) {
            assert_int_equal(following(p), 1);
            assert_int_equal(next_use(p, a), 0);
            assert_true(next_use(p, b) <= 1); /* taken as due next, which is near enough */
            uint64_t v[4] = {0};
            assert_int_equal(sh_policy_victims(p, 100, NULL, 0, v, 4), 1);
            assert_int_equal(v[0], 2); /* the weight used last */
        }
        const uint64_t fa[] = {1, a}, fb[] = {b};
        launch(p, KF, fa, 2);
        launch(p, KB, fb, 1);
        launch(p, KB, w2, 1);
        release(p, a);
        release(p, b);
    }
    sh_policy_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learned_follows_reused_addresses),
        cmocka_unit_test(test_belady_future_by_allocation),
        cmocka_unit_test(test_learned_keeps_fresh_allocations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
