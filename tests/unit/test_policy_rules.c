/* test_policy_rules.c — the Conductor rules one by one (backward pressure,
 * optimizer protection, contention back-off), confidence, and the promise
 * that within a step hints only tighten, over long random sequences. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "policy/policy.h"
#include "sh_err.h"

static struct sh_policy_params base(void)
{
    struct sh_policy_params q = {
        .kind = SH_POLICY_LEARNED,
        .budget_bytes = 1000,
        .high_watermark = 800,
        .low_watermark = 600,
        .prefetch_window = 64,
        .prefetch_enabled = 1,
        .max_inflight_h2d = 2,
        .max_inflight_d2h = 2,
        .batch_max = 16,
        .conductor_enabled = 1,
        .backward_pressure_pct = 80,
        .backward_prefetch_window = 1,
        .optimizer_max_inflight_h2d = 1,
        .contention_checks = 2,
    };
    return q;
}

static struct sh_policy_rules *mk(const struct sh_policy_params *q)
{
    struct sh_policy_rules *r = NULL;
    assert_int_equal(sh_policy_rules_create(q, &r), 0);
    sh_policy_rules_step(r, 0);
    return r;
}

static struct sh_policy_hints hints(const struct sh_policy_rules *r)
{
    struct sh_policy_hints h;
    sh_policy_rules_hints(r, &h);
    return h;
}

static void assert_untouched(const struct sh_policy_hints *h)
{
    assert_int_equal(h->prefetch_window, 64);
    assert_int_equal(h->max_inflight_h2d, 2);
    assert_int_equal(h->max_inflight_d2h, 2);
    assert_int_equal(h->suppress_speculative, 0);
    assert_int_equal(h->high_watermark, 800);
    assert_int_equal(h->low_watermark, 600);
    assert_int_equal(h->rules_fired, 0);
}

static void test_create(void **state)
{
    (void)state;
    struct sh_policy_rules *r = NULL;
    assert_int_equal(sh_policy_rules_create(NULL, &r), SH_EINVAL);
    struct sh_policy_params q = base();
    r = mk(&q);
    struct sh_policy_hints h = hints(r);
    assert_untouched(&h);
    assert_int_equal(sh_policy_rules_level(r), 0);
    sh_policy_rules_destroy(r);
    sh_policy_rules_destroy(NULL);
}

/* Rule 1: only in BACKWARD, only above 80% of the high watermark (640). */
static void test_backward_pressure(void **state)
{
    (void)state;
    struct sh_policy_params q = base();
    struct sh_policy_rules *r = mk(&q);
    sh_policy_rules_phase(r, SH_PHASE_FORWARD);
    sh_policy_rules_pressure(r, 790);
    struct sh_policy_hints h = hints(r);
    assert_untouched(&h);
    sh_policy_rules_phase(r, SH_PHASE_BACKWARD); /* the pressure seen counts */
    h = hints(r);
    assert_int_equal(h.prefetch_window, 1);
    assert_int_equal(h.high_watermark, 640);
    assert_int_equal(h.low_watermark, 480);
    assert_int_equal(h.suppress_speculative, 1);
    assert_int_equal(h.max_inflight_h2d, 2);
    assert_int_equal(h.rules_fired, 1);
    sh_policy_rules_destroy(r);

    r = mk(&q);
    sh_policy_rules_phase(r, SH_PHASE_BACKWARD);
    sh_policy_rules_pressure(r, 640); /* at the threshold: not above */
    h = hints(r);
    assert_untouched(&h);
    sh_policy_rules_pressure(r, 641);
    assert_int_equal(hints(r).prefetch_window, 1);
    sh_policy_rules_pressure(r, 0); /* pressure falls: the limits stay */
    assert_int_equal(hints(r).high_watermark, 640);
    sh_policy_rules_destroy(r);
}

/* Rule 2: OPTIMIZER caps the restores in flight and stops speculation. */
static void test_optimizer_protection(void **state)
{
    (void)state;
    struct sh_policy_params q = base();
    struct sh_policy_rules *r = mk(&q);
    sh_policy_rules_phase(r, SH_PHASE_OPTIMIZER);
    struct sh_policy_hints h = hints(r);
    assert_int_equal(h.max_inflight_h2d, 1);
    assert_int_equal(h.max_inflight_d2h, 2);
    assert_int_equal(h.suppress_speculative, 1);
    assert_int_equal(h.prefetch_window, 64);
    assert_int_equal(h.high_watermark, 800);
    assert_int_equal(h.rules_fired, 2);
    sh_policy_rules_phase(r, SH_PHASE_FORWARD); /* gradient accumulation: stays tight */
    assert_int_equal(hints(r).max_inflight_h2d, 1);
    sh_policy_rules_step(r, 0);
    h = hints(r);
    assert_untouched(&h);
    sh_policy_rules_destroy(r);
}

static void contended_step(struct sh_policy_rules *r)
{
    sh_policy_rules_slots(r, 2, 2);
    sh_policy_rules_stall(r);
    sh_policy_rules_step(r, 0);
}

static void calm_step(struct sh_policy_rules *r)
{
    sh_policy_rules_slots(r, 1, 2); /* a stall with a free H2D slot is not contention */
    sh_policy_rules_stall(r);
    sh_policy_rules_step(r, 0);
}

/* Rule 3: two contended steps in a row halve the window; two calm ones
 * double it back. */
static void test_contention_backoff(void **state)
{
    (void)state;
    struct sh_policy_params q = base();
    struct sh_policy_rules *r = mk(&q);
    contended_step(r);
    assert_int_equal(sh_policy_rules_level(r), 0);
    assert_int_equal(hints(r).prefetch_window, 64);
    contended_step(r);
    assert_int_equal(sh_policy_rules_level(r), 1);
    assert_int_equal(hints(r).prefetch_window, 32);
    assert_int_equal(hints(r).rules_fired, 4);
    contended_step(r);
    calm_step(r); /* the run is broken: no change */
    assert_int_equal(sh_policy_rules_level(r), 1);
    contended_step(r);
    contended_step(r);
    assert_int_equal(hints(r).prefetch_window, 16);
    calm_step(r);
    calm_step(r);
    assert_int_equal(hints(r).prefetch_window, 32);
    calm_step(r);
    calm_step(r);
    assert_int_equal(hints(r).prefetch_window, 64);
    assert_int_equal(hints(r).rules_fired, 0);
    for (int i = 0; i < 40; i++)
        contended_step(r);
    assert_int_equal(sh_policy_rules_level(r), 6); /* 64 >> 6 = 1: the floor */
    assert_int_equal(hints(r).prefetch_window, 1);
    sh_policy_rules_destroy(r);
}

/* Confident: nothing tightens; losing confidence applies what is due at
 * once; regaining it loosens nothing. */
static void test_confidence(void **state)
{
    (void)state;
    struct sh_policy_params q = base();
    struct sh_policy_rules *r = mk(&q);
    contended_step(r);
    contended_step(r); /* level 1 */
    sh_policy_rules_step(r, 1);
    assert_int_equal(hints(r).prefetch_window, 64);
    sh_policy_rules_phase(r, SH_PHASE_BACKWARD);
    sh_policy_rules_pressure(r, 790);
    sh_policy_rules_slots(r, 2, 2);
    sh_policy_rules_stall(r); /* not contention while confident */
    struct sh_policy_hints h = hints(r);
    assert_untouched(&h);
    sh_policy_rules_confident(r, 0);
    h = hints(r);
    assert_int_equal(h.prefetch_window, 1);
    assert_int_equal(h.high_watermark, 640);
    assert_int_equal(h.rules_fired, 1 | 4);
    sh_policy_rules_confident(r, 1);
    assert_int_equal(hints(r).prefetch_window, 1);
    sh_policy_rules_destroy(r);

    /* a stall while confident is no contention: had it counted, the
     * contended step after it would make two in a row */
    r = mk(&q);
    contended_step(r);
    contended_step(r);
    assert_int_equal(sh_policy_rules_level(r), 1);
    sh_policy_rules_confident(r, 1);
    sh_policy_rules_slots(r, 2, 2);
    sh_policy_rules_stall(r);
    sh_policy_rules_step(r, 0);
    contended_step(r);
    assert_int_equal(sh_policy_rules_level(r), 1);
    contended_step(r);
    assert_int_equal(sh_policy_rules_level(r), 2);
    sh_policy_rules_destroy(r);
}

static void test_disabled(void **state)
{
    (void)state;
    struct sh_policy_params q = base();
    q.conductor_enabled = 0;
    struct sh_policy_rules *r = mk(&q);
    for (int i = 0; i < 5; i++)
        contended_step(r);
    sh_policy_rules_phase(r, SH_PHASE_BACKWARD);
    sh_policy_rules_pressure(r, 999);
    sh_policy_rules_phase(r, SH_PHASE_OPTIMIZER);
    sh_policy_rules_confident(r, 0);
    struct sh_policy_hints h = hints(r);
    assert_untouched(&h);
    assert_int_equal(sh_policy_rules_level(r), 0);
    sh_policy_rules_destroy(r);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* within a step every hint only tightens */
static void assert_tighter(const struct sh_policy_hints *now, const struct sh_policy_hints *was)
{
    assert_true(now->prefetch_window <= was->prefetch_window);
    assert_true(now->max_inflight_h2d <= was->max_inflight_h2d);
    assert_true(now->max_inflight_d2h <= was->max_inflight_d2h);
    assert_true(now->suppress_speculative >= was->suppress_speculative);
    assert_true(now->high_watermark <= was->high_watermark);
    assert_true(now->low_watermark <= was->low_watermark);
    assert_true((now->rules_fired & was->rules_fired) == was->rules_fired);
}

static void test_monotone_within_steps(void **state)
{
    (void)state;
    struct sh_policy_params q = base();
    q.contention_checks = 1;
    struct sh_policy_rules *r = mk(&q);
    int tightened = 0;
    for (int step = 0; step < 300; step++) {
        sh_policy_rules_step(r, (int)(rnd() % 3 == 0));
        struct sh_policy_hints was = hints(r);
        /* a fresh step starts from the configured limits (and the back-off) */
        assert_int_equal(was.max_inflight_h2d, 2);
        assert_int_equal(was.high_watermark, 800);
        assert_int_equal(was.suppress_speculative, 0);
        for (int i = 0; i < 40; i++) {
            switch (rnd() % 5) {
            case 0:
                sh_policy_rules_phase(r, (int)(rnd() % 5));
                break;
            case 1:
                sh_policy_rules_pressure(r, rnd() % 1000);
                break;
            case 2:
                sh_policy_rules_slots(r, (int)(rnd() % 3), (int)(rnd() % 3));
                break;
            case 3:
                sh_policy_rules_stall(r);
                break;
            default:
                sh_policy_rules_confident(r, (int)(rnd() % 2));
                break;
            }
            struct sh_policy_hints now = hints(r);
            assert_tighter(&now, &was);
            tightened |= now.rules_fired != 0;
            was = now;
        }
    }
    assert_true(tightened);
    sh_policy_rules_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create),
        cmocka_unit_test(test_backward_pressure),
        cmocka_unit_test(test_optimizer_protection),
        cmocka_unit_test(test_contention_backoff),
        cmocka_unit_test(test_confidence),
        cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_monotone_within_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
