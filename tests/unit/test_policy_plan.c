/* test_policy_plan.c — the scheduler's plans on synthetic event streams:
 * prefetch timing, window and budget, idle plans, and exchange planning
 * (evictions ahead, the wait for a better victim, room for allocations). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "policy/policy.h"
#include "sh_err.h"

#include <string.h>

#include "policy_loop.h"

/* ---- prefetch ---- */

static void test_prefetch_soonest_first(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    assert_int_equal(sh_policy_residency(p, 4, SH_RES_HOST), 0);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    uint64_t out[16];
    assert_int_equal(prefetch(p, 1000, out), 2);
    assert_int_equal(out[0], 3); /* needed in 1 launch */
    assert_int_equal(out[1], 4); /* in 2 */
    sh_policy_destroy(p);
}

static void test_prefetch_window(void **state)
{
    (void)state;
    struct sh_policy_params q = params(SH_POLICY_LEARNED);
    q.prefetch_window = 2;
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    alloc_weights(p, same);
    fwd_bwd(p, 0);
    launch1(p, KF, 1);
    assert_int_equal(sh_policy_residency(p, 4, SH_RES_HOST), 0);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    uint64_t out[16];
    assert_int_equal(prefetch(p, 1000, out), 1); /* W4 is 2 launches away */
    assert_int_equal(out[0], 3);
    launch1(p, KF, 2);
    assert_int_equal(prefetch(p, 1000, out), 2); /* the window moved */
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 4);
    sh_policy_destroy(p);
}

/* A plan that finds nothing to do is not made again for a few launches,
 * unless what it read changes: a region going to the host is seen by the
 * very next plan, and so is one that enters the window as launches pass. */
static void test_plan_idle_until_something_changes(void **state)
{
    (void)state;
    struct sh_policy_params q = params(SH_POLICY_LEARNED);
    q.prefetch_window = 2;
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    alloc_weights(p, same);
    fwd_bwd(p, 0);
    launch1(p, KF, 1);
    uint64_t out[16];
    assert_int_equal(prefetch(p, 1000, out), 0); /* all on the device */
    assert_int_equal(prefetch(p, 1000, out), 0);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    assert_int_equal(prefetch(p, 1000, out), 1);
    assert_int_equal(out[0], 3);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_DEVICE), 0);
    assert_int_equal(sh_policy_residency(p, 1, SH_RES_HOST), 0); /* needed again at the end */
    assert_int_equal(prefetch(p, 1000, out), 0);                 /* 7 launches away */
    for (uint64_t id = 2; id <= 4; id++)
        launch1(p, KF, id);
    launch1(p, KB, 4);
    launch1(p, KB, 3);
    assert_int_equal(prefetch(p, 1000, out), 1); /* 2 away: in the window now */
    assert_int_equal(out[0], 1);
    sh_policy_destroy(p);
}

/* A window that covers the whole recorded step: a plan that finds nothing
 * stays idle across steps, launch after launch, and the first change (a
 * region going to the host, wherever it is next needed) is seen at once. */
static void test_plan_idle_over_whole_step(void **state)
{
    (void)state;
    struct sh_policy_params q = params(SH_POLICY_LEARNED);
    q.prefetch_window = 4; /* walked twice over: the 8 launches of a step */
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    alloc_weights(p, same);
    fwd_bwd(p, 0);
    launch1(p, KF, 1);
    uint64_t out[16];
    for (int step = 0; step < 3; step++) {
        for (int i = step ? 0 : 1; i < 8; i++) {
            assert_int_equal(prefetch(p, 1000, out), 0);
            static const uint64_t order[] = {1, 2, 3, 4, 4, 3, 2, 1};
            launch1(p, i < 4 ? KF : KB, order[i]);
        }
    }
    /* now just after W1's launch of a step: W2 is next */
    assert_int_equal(sh_policy_residency(p, 2, SH_RES_HOST), 0);
    assert_int_equal(prefetch(p, 1000, out), 1);
    assert_int_equal(out[0], 2);
    assert_int_equal(sh_policy_residency(p, 2, SH_RES_DEVICE), 0);
    assert_int_equal(prefetch(p, 1000, out), 0);
    sh_policy_destroy(p);
}

/* Only what fits, in order: a region that does not fit holds back the
 * later ones. What the very next launch needs may use the whole budget. */
static void test_prefetch_budget(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    assert_int_equal(sh_policy_residency(p, 4, SH_RES_HOST), 0);
    uint64_t out[16];
    assert_int_equal(prefetch(p, 150, out), 1);
    assert_int_equal(out[0], 3);
    assert_int_equal(prefetch(p, 99, out), 0);
    assert_int_equal(sh_policy_residency(p, 2, SH_RES_HOST), 0);
    /* W2 is needed next: room 0 under the high watermark, 200 under the budget */
    assert_int_equal(prefetch(p, 0, out), 1);
    assert_int_equal(out[0], 2);
    sh_policy_destroy(p);
}

static void test_no_prefetch_without_trace_or_reactive(void **state)
{
    (void)state;
    uint64_t out[16];
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    launch1(p, KF, 1);
    assert_int_equal(sh_policy_residency(p, 2, SH_RES_HOST), 0);
    assert_int_equal(prefetch(p, 1000, out), 0); /* no recording yet: like LRU */
    sh_policy_destroy(p);
    p = trained(SH_POLICY_REACTIVE, same);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    assert_int_equal(prefetch(p, 1000, out), 0);
    sh_policy_destroy(p);
    p = trained(SH_POLICY_LRU, same);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    assert_int_equal(prefetch(p, 1000, out), 1);
    assert_int_equal(out[0], 3);
    sh_policy_destroy(p);
}

/* ---- exchange planning ---- */

static void test_plan_exchange(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    uint64_t f[8], e[8];
    struct sh_policy_plan plan = {.fetch = f, .fetch_max = 8, .evict = e, .evict_max = 8};
    /* at the high watermark: W3 (needed in 1) cannot come back until W1
     * (needed in 6) leaves; W2 (needed next) is never a candidate */
    assert_int_equal(sh_policy_plan(p, 800, NULL, 0, &plan), 0);
    assert_int_equal(plan.nfetch, 0);
    assert_int_equal(plan.nevict, 1);
    assert_int_equal(e[0], 1);
    /* protected: the next best is W4, needed after W3 */
    static const uint64_t prot[] = {1};
    assert_int_equal(sh_policy_plan(p, 800, prot, 1, &plan), 0);
    assert_int_equal(plan.nevict, 1);
    assert_int_equal(e[0], 4);
    /* the eviction under way counts as room to come: nothing more to do */
    assert_int_equal(sh_policy_residency(p, 1, SH_RES_TO_HOST), 0);
    assert_int_equal(sh_policy_plan(p, 800, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict + plan.nfetch, 0);
    /* landed: the room is there */
    assert_int_equal(sh_policy_residency(p, 1, SH_RES_HOST), 0);
    assert_int_equal(sh_policy_plan(p, 700, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 0);
    assert_int_equal(plan.nfetch, 1);
    assert_int_equal(f[0], 3);
    sh_policy_destroy(p);
}

/* Never evict ahead for a region needed later than the victim. */
static void test_plan_never_evicts_sooner(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    /* W1 is needed at 6; only W1 is on the host; W2, W3, W4 all sooner */
    assert_int_equal(sh_policy_residency(p, 1, SH_RES_HOST), 0);
    uint64_t f[8], e[8];
    struct sh_policy_plan plan = {.fetch = f, .fetch_max = 8, .evict = e, .evict_max = 8};
    assert_int_equal(sh_policy_plan(p, 800, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 0);
    assert_int_equal(plan.nfetch, 0);
    sh_policy_destroy(p);
}

/* The loop's regions X P H Y (sizes bytes[0..3]), each step launching
 * loop[0..n) one region at a time, twice, then the first of step 2 (the
 * recording followed), with Y on the host; window: the prefetch window. */
enum { X = 1, P = 2, H = 3, Y = 4 };
static struct sh_policy *looped(const uint64_t *bytes, const uint64_t *loop, size_t n, int window)
{
    struct sh_policy_params q = params(SH_POLICY_LEARNED);
    q.prefetch_window = window;
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    for (uint64_t id = X; id <= Y; id++)
        assert_int_equal(sh_policy_alloc(p, t_now, id, bytes[id - 1], 7), 0);
    for (int s = 0; s < 2; s++)
        for (size_t k = 0; k < n; k++)
            launch1(p, KF, loop[k]);
    launch1(p, KF, loop[0]);
    assert_int_equal(sh_policy_residency(p, Y, SH_RES_HOST), 0);
    return p;
}

/* The loop X P H Y, each region 100 bytes, each used once a step. At the
 * launch of P in step 2, with Y on the host and no room: Y's restore needs
 * X or P to go. X is needed again in three launches (soon), P only two
 * launches before Y: P's memory goes to Y once P has run, from a later
 * plan, and nothing goes now. That later plan, past P, evicts P. */
static void test_plan_defers_to_regions_used_before(void **state)
{
    (void)state;
    static const uint64_t bytes[] = {100, 100, 100, 100}, loop[] = {X, P, H, Y};
    struct sh_policy *p = looped(bytes, loop, 4, 4);
    uint64_t f[8], e[8];
    struct sh_policy_plan plan = {.fetch = f, .fetch_max = 8, .evict = e, .evict_max = 8};
    assert_int_equal(sh_policy_plan(p, 800, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 0); /* not X: needed soon; P counts */
    assert_int_equal(plan.nfetch, 0);
    launch1(p, KF, P);
    /* H runs next and Y right after: too close to wait for H's use */
    assert_int_equal(sh_policy_plan(p, 800, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 1);
    assert_int_equal(e[0], P); /* needed after X */
    sh_policy_destroy(p);
}

/* The loop X P H Y P (X, P, Y 100 bytes, H 10), with a window of 8. At the
 * launch of P in step 2, with Y on the host and no room: P, used before Y,
 * first counts as the room; but P is needed again right after Y, so that
 * room is not there. H, too small, cannot stand in: X (needed soon) goes. */
static void test_plan_defers_only_to_regions_done_with(void **state)
{
    (void)state;
    static const uint64_t bytes[] = {100, 100, 10, 100}, loop[] = {X, P, H, Y, P};
    struct sh_policy *p = looped(bytes, loop, 5, 8);
    uint64_t f[8], e[8];
    struct sh_policy_plan plan = {.fetch = f, .fetch_max = 8, .evict = e, .evict_max = 8};
    assert_int_equal(sh_policy_plan(p, 800, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 1);
    assert_int_equal(e[0], X);
    sh_policy_destroy(p);
}

static void test_plan_lru_has_no_exchange(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LRU, same);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    uint64_t f[8], e[8];
    struct sh_policy_plan plan = {.fetch = f, .fetch_max = 8, .evict = e, .evict_max = 8};
    assert_int_equal(sh_policy_plan(p, 800, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 0);
    assert_int_equal(plan.nfetch, 0);
    sh_policy_destroy(p);
}

/* The recording knows what will be allocated: room is made before. */
static void test_plan_room_for_allocations(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    uint64_t act = 100;
    for (int s = 0; s < 2; s++) {
        launch1(p, KF, 1);
        assert_int_equal(sh_policy_alloc(p, t_now, act, 300, 7), 0);
        uint64_t ids[] = {2, act};
        launch(p, KF, ids, 2);
        assert_int_equal(sh_policy_free(p, t_now, act), 0);
        assert_int_equal(sh_policy_forget(p, act), 0);
        act++;
        launch1(p, KF, 3);
        launch1(p, KF, 4);
    }
    launch1(p, KF, 1); /* step 2, following */
    /* 400 bytes of weights in use; the allocation of 300 before the next
     * launch must fit under 800 together with anything else: it does */
    uint64_t f[8], e[8];
    struct sh_policy_plan plan = {.fetch = f, .fetch_max = 8, .evict = e, .evict_max = 8};
    assert_int_equal(sh_policy_plan(p, 400, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 0);
    /* with 700 in use it does not: the farthest (W1, needed next step)
     * goes, then W4; W2, read by that launch, never */
    assert_int_equal(sh_policy_plan(p, 700, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 2);
    assert_int_equal(e[0], 1);
    assert_int_equal(e[1], 4);
    /* with only W2 and W3 left on the device, W3 goes, never W2 */
    assert_int_equal(sh_policy_residency(p, 1, SH_RES_HOST), 0);
    assert_int_equal(sh_policy_residency(p, 4, SH_RES_HOST), 0);
    assert_int_equal(sh_policy_plan(p, 700, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 1);
    assert_int_equal(e[0], 3);
    sh_policy_destroy(p);
}

/* Planned with W2 and a transient of 300 bytes next, then W3 and another:
 * with 400 bytes in use under 800 one at a time fits; with 600 the first
 * is 100 bytes short (W1 goes: needed last), and the second reuses its
 * room. */
static void plans_one_transient(struct sh_policy *p)
{
    uint64_t f[8], e[8];
    struct sh_policy_plan plan = {.fetch = f, .fetch_max = 8, .evict = e, .evict_max = 8};
    assert_int_equal(sh_policy_plan(p, 400, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 0);
    assert_int_equal(sh_policy_plan(p, 600, NULL, 0, &plan), 0);
    assert_int_equal(plan.nevict, 1);
    assert_int_equal(e[0], 1);
    sh_policy_destroy(p);
}

/* A transient allocated and freed within the walk gives its room back: two
 * of 300 bytes in turn need 300, not 600 (the walk once held each to its
 * end and evicted for a peak that never comes). */
static void test_plan_counts_frees_of_walked_allocations(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    uint64_t act = 100;
    for (int s = 0; s < 2; s++) {
        launch1(p, KF, 1);
        for (uint64_t w = 2; w <= 3; w++, act++) {
            assert_int_equal(sh_policy_alloc(p, t_now, act, 300, 7), 0);
            uint64_t ids[] = {w, act};
            launch(p, KF, ids, 2);
            assert_int_equal(sh_policy_free(p, t_now, act), 0);
            assert_int_equal(sh_policy_forget(p, act), 0);
        }
        launch1(p, KF, 4);
    }
    launch1(p, KF, 1); /* step 2, following */
    plans_one_transient(p);
}

/* The same for belady's exact future. */
static void test_plan_belady_counts_frees_of_walked_allocations(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_BELADY);
    static const uint64_t l0[] = {1}, l1[] = {2, 100}, l2[] = {3, 101}, l3[] = {4};
    const struct sh_policy_future f[] = {
        {SH_FUTURE_ALLOC, 1, 100, NULL, 0},   {SH_FUTURE_ALLOC, 2, 100, NULL, 0},
        {SH_FUTURE_ALLOC, 3, 100, NULL, 0},   {SH_FUTURE_ALLOC, 4, 100, NULL, 0},
        {SH_FUTURE_LAUNCH, 0, 0, l0, 1},      {SH_FUTURE_ALLOC, 100, 300, NULL, 0},
        {SH_FUTURE_LAUNCH, 0, 0, l1, 2},      {SH_FUTURE_FREE, 100, 0, NULL, 0},
        {SH_FUTURE_ALLOC, 101, 300, NULL, 0}, {SH_FUTURE_LAUNCH, 0, 0, l2, 2},
        {SH_FUTURE_FREE, 101, 0, NULL, 0},    {SH_FUTURE_LAUNCH, 0, 0, l3, 1},
    };
    assert_int_equal(sh_policy_set_future(p, f, sizeof f / sizeof f[0]), 0);
    alloc_weights(p, same);
    launch1(p, KF, 1);
    plans_one_transient(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefetch_soonest_first),
        cmocka_unit_test(test_prefetch_window),
        cmocka_unit_test(test_plan_idle_until_something_changes),
        cmocka_unit_test(test_plan_idle_over_whole_step),
        cmocka_unit_test(test_prefetch_budget),
        cmocka_unit_test(test_no_prefetch_without_trace_or_reactive),
        cmocka_unit_test(test_plan_exchange),
        cmocka_unit_test(test_plan_never_evicts_sooner),
        cmocka_unit_test(test_plan_defers_to_regions_used_before),
        cmocka_unit_test(test_plan_defers_only_to_regions_done_with),
        cmocka_unit_test(test_plan_lru_has_no_exchange),
        cmocka_unit_test(test_plan_room_for_allocations),
        cmocka_unit_test(test_plan_counts_frees_of_walked_allocations),
        cmocka_unit_test(test_plan_belady_counts_frees_of_walked_allocations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
