/* test_policy_steps.c — the scheduler across steps that are not all alike:
 * confidence in the part of a recording an earlier step ran too (a first
 * training step that creates the optimizer's state). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "policy/policy.h"
#include "sh_err.h"

#include <string.h>

/* Kernels of the synthetic loop. */
enum { KF = 11, KB = 12, KO = 13, KZ = 15 };

static struct sh_policy_params params(int kind, int conductor)
{
    struct sh_policy_params q = {
        .kind = kind,
        .budget_bytes = 1000,
        .high_watermark = 800,
        .low_watermark = 600,
        .prefetch_window = 4,
        .prefetch_enabled = 1,
        .max_inflight_h2d = 8,
        .max_inflight_d2h = 8,
        .batch_max = 4,
        .conductor_enabled = conductor,
        .backward_pressure_pct = 80,
        .backward_prefetch_window = 1,
        .optimizer_max_inflight_h2d = 1,
        .contention_checks = 2,
    };
    return q;
}

static struct sh_policy *mk(int kind, int conductor)
{
    struct sh_policy_params q = params(kind, conductor);
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    return p;
}

static uint64_t t_now;

static void launch1(struct sh_policy *p, uint64_t kernel, uint64_t id)
{
    assert_int_equal(sh_policy_launch(p, t_now++, kernel, 7, &id, 1), 0);
}

static struct sh_policy_stats stats(const struct sh_policy *p)
{
    struct sh_policy_stats st;
    sh_policy_stats(p, &st);
    return st;
}

static struct sh_policy_hints hints(const struct sh_policy *p)
{
    struct sh_policy_hints h;
    sh_policy_hints(p, &h);
    return h;
}

/* ---- confidence in what two steps ran alike ---- */

/* Weights 1..4; a marked step: forward, backward, then the optimizer. The
 * first step (init != 0) zeroes the optimizer's state first, as AdamW does
 * in its first step, and so departs from the later ones there. */
static void marked_step(struct sh_policy *p, int init)
{
    assert_int_equal(sh_policy_step(p, t_now), 0);
    for (uint64_t i = 1; i <= 4; i++)
        launch1(p, KF, i);
    for (uint64_t i = 4; i >= 1; i--)
        launch1(p, KB, i);
    if (init)
        launch1(p, KZ, 1);
    for (uint64_t i = 1; i <= 4; i++)
        launch1(p, KO, i);
}

static void weights(struct sh_policy *p)
{
    for (uint64_t i = 1; i <= 4; i++)
        assert_int_equal(sh_policy_alloc(p, t_now, i, 100, 7), 0);
}

/* Step 2 follows step 1's recording, which no whole step has confirmed, but
 * whose forward and backward step 0 ran too: the rules leave those alone
 * (backward pressure would lower the watermarks) and apply from where step 1
 * departed from step 0 (optimizer protection caps the restores). */
static void test_confident_where_steps_agreed(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED, 1);
    weights(p);
    marked_step(p, 1);
    marked_step(p, 0);
    assert_int_equal(sh_policy_step(p, t_now), 0);
    for (uint64_t i = 1; i <= 4; i++)
        launch1(p, KF, i);
    assert_int_equal(sh_policy_phase(p, t_now, SH_PHASE_BACKWARD), 0);
    for (uint64_t i = 4; i >= 1; i--) {
        launch1(p, KB, i);
        sh_policy_pressure(p, 790);
        struct sh_policy_hints h = hints(p);
        assert_int_equal(h.high_watermark, 800);
        assert_int_equal(h.prefetch_window, 4);
        assert_int_equal(h.rules_fired, 0);
    }
    assert_int_equal(stats(p).following, 1);
    assert_int_equal(sh_policy_phase(p, t_now, SH_PHASE_OPTIMIZER), 0);
    launch1(p, KO, 1); /* step 0 ran KZ here: only step 1 ran this */
    struct sh_policy_hints h = hints(p);
    assert_int_equal(h.max_inflight_h2d, 1);
    assert_int_equal(h.rules_fired & 2, 2);
    for (uint64_t i = 2; i <= 4; i++)
        launch1(p, KO, i);
    marked_step(p, 0); /* step 2 confirmed step 1: confident throughout */
    assert_int_equal(sh_policy_phase(p, t_now, SH_PHASE_OPTIMIZER), 0);
    h = hints(p);
    assert_int_equal(h.max_inflight_h2d, 8);
    assert_int_equal(h.rules_fired, 0);
    sh_policy_destroy(p);
}

/* A step that agreed with no earlier one from its first launch gives a
 * recording with nothing seen twice: the next step guesses from the start. */
static void test_no_confidence_without_agreement(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED, 1);
    weights(p);
    marked_step(p, 1);
    assert_int_equal(sh_policy_step(p, t_now), 0);
    launch1(p, KZ, 2); /* unlike step 0 from the start */
    for (uint64_t i = 1; i <= 4; i++)
        launch1(p, KF, i);
    assert_int_equal(sh_policy_step(p, t_now), 0);
    launch1(p, KZ, 2);
    assert_int_equal(stats(p).following, 1);
    assert_int_equal(sh_policy_phase(p, t_now, SH_PHASE_BACKWARD), 0);
    sh_policy_pressure(p, 790);
    struct sh_policy_hints h = hints(p);
    assert_int_equal(h.high_watermark, 640);
    assert_int_equal(h.prefetch_window, 1);
    sh_policy_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_confident_where_steps_agreed),
        cmocka_unit_test(test_no_confidence_without_agreement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
