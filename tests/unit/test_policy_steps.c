/* test_policy_steps.c — steps as real models make them: found without
 * marks although launches repeat within a step (chunked multi-tensor ops, a
 * kernel reading only a constant once per layer), on the recorded models of
 * tools/stagehand-sim/traces with their marks left out; and confidence in
 * the part of a recording an earlier step ran too (a first training step
 * that creates the optimizer's state). Run from the repository root. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_err.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kernels of the synthetic loop. */
#include "policy_loop.h"

/* Kernels beside the loop's. */
enum { KZ = 15, KM = 16, KC = 17 };

/* The loop's parameters, with the Conductor's rules on or off. */
static struct sh_policy_params cparams(int kind, int conductor)
{
    struct sh_policy_params q = params(kind);
    q.conductor_enabled = conductor;
    return q;
}

static struct sh_policy *mkc(int kind, int conductor)
{
    struct sh_policy_params q = cparams(kind, conductor);
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    return p;
}

static struct sh_policy_hints hints(const struct sh_policy *p)
{
    struct sh_policy_hints h;
    sh_policy_hints(p, &h);
    return h;
}

/* ---- steps found without marks ---- */

static void weights(struct sh_policy *p)
{
    for (uint64_t i = 1; i <= 4; i++)
        assert_int_equal(sh_policy_alloc(p, t_now, i, 100, 7), 0);
}

/* A step of a model with a causal mask M and weights 1..4: each layer
 * reads its weight and the activation before it into a new one, then the
 * mask alone (its output is too small to be a region); the optimizer
 * updates weight 1 in three chunks, one launch each, back to back.
 * Activations are new each step, the batch too. Returns the launches made. */
static int masked_step(struct sh_policy *p, uint64_t first_act)
{
    int n = 0;
    assert_int_equal(sh_policy_alloc(p, t_now, first_act, 50, 7), 0); /* the batch */
    for (uint64_t l = 0; l < 4; l++) {
        uint64_t a = first_act + l, x[] = {l + 1, a, a + 1};
        assert_int_equal(sh_policy_alloc(p, t_now, a + 1, 50, 7), 0);
        assert_int_equal(sh_policy_launch(p, t_now++, KF, 7, x, 3), 0);
        launch1(p, KM, 100);
        n += 2;
    }
    for (uint64_t l = 4; l-- > 0;) {
        uint64_t x[] = {l + 1, first_act + l + 1};
        assert_int_equal(sh_policy_launch(p, t_now++, KB, 7, x, 2), 0);
        n++;
    }
    for (int c = 0; c < 3; c++, n++)
        launch1(p, KC, 1);
    for (uint64_t a = first_act; a <= first_act + 4; a++) {
        assert_int_equal(sh_policy_free(p, t_now, a), 0);
        assert_int_equal(sh_policy_forget(p, a), 0);
    }
    return n;
}

/* A launch that repeats exactly within a step is no step: the mask's
 * kernel once per layer, the chunks back to back. The step is found where
 * it begins again, with the next batch (it used to end at the second mask
 * launch, then at every mask and chunk launch). */
static void test_repeats_within_a_step(void **state)
{
    (void)state;
    struct sh_policy *p = mkc(SH_POLICY_LEARNED, 0);
    weights(p);
    assert_int_equal(sh_policy_alloc(p, t_now, 100, 10, 7), 0); /* the mask */
    int per_step = 0;
    for (int s = 0; s < 4; s++) {
        per_step = masked_step(p, 1000 + 10 * (uint64_t)s);
        assert_int_equal(stats(p).step, s);
        assert_int_equal(stats(p).launches_this_step, per_step);
    }
    assert_int_equal(stats(p).steps_matched, 2);
    sh_policy_destroy(p);
}

/* Launch numbers (counted from 0) at which steps begin: from the trace's
 * own marks (a mark before the first launch begins nothing), or (found)
 * from the policy, told everything but the marks. */
static size_t step_starts(const struct sh_trace *t, int found, uint64_t *out, size_t max)
{
    struct sh_policy_params q = cparams(SH_POLICY_LEARNED, 1);
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    size_t k = 0;
    uint64_t launches = 0;
    int64_t step = 0;
    for (size_t i = 0; i < sh_trace_count(t); i++) {
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_STEP && !found && launches && k < max)
            out[k++] = launches;
        if (e->type == SH_TRACE_ALLOC)
            assert_int_equal(sh_policy_alloc(p, e->t_us, e->id, e->bytes, e->stream), 0);
        if (e->type == SH_TRACE_FREE) {
            assert_int_equal(sh_policy_free(p, e->t_us, e->id), 0);
            assert_int_equal(sh_policy_forget(p, e->id), 0); /* as the library does */
        }
        if (e->type != SH_TRACE_LAUNCH)
            continue;
        assert_int_equal(sh_policy_launch(p, e->t_us, e->kernel, e->stream, e->ids, e->n), 0);
        struct sh_policy_stats st = stats(p);
        if (found && st.step != step && k < max)
            out[k++] = launches;
        step = st.step;
        launches++;
    }
    sh_policy_destroy(p);
    return k;
}

/* The recorded models with their marks left out: the policy finds a
 * step wherever the program marked one, and nowhere else. */
static void test_recorded_models_without_marks(void **state)
{
    (void)state;
    const char *dir = "tools/stagehand-sim/traces";
    DIR *d = opendir(dir);
    assert_non_null(d);
    int models = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len < 9 || strcmp(de->d_name + len - 9, ".trace.gz"))
            continue;
        char path[512], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct sh_trace *t = NULL;
        if (sh_trace_read(path, &t, err, sizeof err))
            fail_msg("%s", err);
        uint64_t marked[64], found[64];
        size_t nm = step_starts(t, 0, marked, 64), nf = step_starts(t, 1, found, 64);
        if (nm < 3 || nf != nm || memcmp(marked, found, nm * sizeof *marked))
            fail_msg("%s: %zu steps marked, %zu found (the second at launch %llu, marked at %llu)",
                     path, nm, nf, nf > 1 ? (unsigned long long)found[1] : 0ull,
                     (unsigned long long)marked[1]);
        sh_trace_destroy(t);
        models++;
    }
    closedir(d);
    assert_true(models >= 6);
}

/* ---- confidence in what two steps ran alike ---- */

/* Weights 1..4; a marked step: forward, backward, then the optimizer
 * (KO on each weight). `init` launches KZ first in the optimizer, as AdamW
 * zeroes its state in its first step; `extra` launches KX before the update
 * of weight `extra` (a step doing what the one before did not). */
static void marked_step(struct sh_policy *p, int init, uint64_t extra)
{
    assert_int_equal(sh_policy_step(p, t_now), 0);
    for (uint64_t i = 1; i <= 4; i++)
        launch1(p, KF, i);
    for (uint64_t i = 4; i >= 1; i--)
        launch1(p, KB, i);
    if (init)
        launch1(p, KZ, 1);
    for (uint64_t i = 1; i <= 4; i++) {
        if (i == extra)
            launch1(p, KX, i);
        launch1(p, KO, i);
    }
}

/* Step 2's forward and backward as the others', backward under pressure:
 * the rules must leave them alone (backward pressure would lower the
 * watermarks). */
static void confident_fwd_bwd(struct sh_policy *p)
{
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
}

/* Step 2 follows step 1's recording, which no whole step has confirmed, but
 * whose forward and backward step 0 ran too: the rules leave those alone,
 * and apply from where step 1 did what step 0 did not (optimizer
 * protection caps the restores). */
static void test_confident_where_steps_agreed(void **state)
{
    (void)state;
    struct sh_policy *p = mkc(SH_POLICY_LEARNED, 1);
    weights(p);
    marked_step(p, 0, 0);
    marked_step(p, 0, 1);
    confident_fwd_bwd(p);
    launch1(p, KX, 1); /* only step 1 ran this */
    struct sh_policy_hints h = hints(p);
    assert_int_equal(h.max_inflight_h2d, 1);
    assert_int_equal(h.rules_fired & 2, 2);
    for (uint64_t i = 1; i <= 4; i++)
        launch1(p, KO, i);
    marked_step(p, 0, 1); /* step 2 confirmed step 1: confident throughout */
    assert_int_equal(sh_policy_phase(p, t_now, SH_PHASE_OPTIMIZER), 0);
    h = hints(p);
    assert_int_equal(h.max_inflight_h2d, 8);
    assert_int_equal(h.rules_fired, 0);
    sh_policy_destroy(p);
}

/* Step 0 zeroes the optimizer's state, step 1 does not: step 1 departs from
 * step 0's recording there, but then runs the rest of it in order, so all
 * of step 1 was run twice, and step 2 follows it with confidence to its
 * end, optimizer included (the rules used to apply from the departure). */
static void test_confident_past_a_block_the_step_before_ran(void **state)
{
    (void)state;
    struct sh_policy *p = mkc(SH_POLICY_LEARNED, 1);
    weights(p);
    marked_step(p, 1, 0);
    marked_step(p, 0, 0);
    confident_fwd_bwd(p);
    for (uint64_t i = 1; i <= 4; i++) {
        launch1(p, KO, i);
        struct sh_policy_hints h = hints(p);
        assert_int_equal(h.max_inflight_h2d, 8);
        assert_int_equal(h.rules_fired, 0);
    }
    sh_policy_destroy(p);
}

/* One block is skipped, no more: after it, a launch that step 0 did not run
 * where step 1 ran it ends what was run twice, and step 2 guesses from
 * there. */
static void test_one_block_skipped(void **state)
{
    (void)state;
    struct sh_policy *p = mkc(SH_POLICY_LEARNED, 1);
    weights(p);
    marked_step(p, 1, 0);
    marked_step(p, 0, 3);
    confident_fwd_bwd(p);
    for (uint64_t i = 1; i <= 2; i++) {
        launch1(p, KO, i);
        assert_int_equal(hints(p).rules_fired, 0);
    }
    launch1(p, KX, 3);
    struct sh_policy_hints h = hints(p);
    assert_int_equal(h.max_inflight_h2d, 1);
    assert_int_equal(h.rules_fired & 2, 2);
    sh_policy_destroy(p);
}

/* A step that agreed with no earlier one from its first launch gives a
 * recording with nothing seen twice: the next step guesses from the start. */
static void test_no_confidence_without_agreement(void **state)
{
    (void)state;
    struct sh_policy *p = mkc(SH_POLICY_LEARNED, 1);
    weights(p);
    marked_step(p, 1, 0);
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
        cmocka_unit_test(test_repeats_within_a_step),
        cmocka_unit_test(test_recorded_models_without_marks),
        cmocka_unit_test(test_confident_where_steps_agreed),
        cmocka_unit_test(test_confident_past_a_block_the_step_before_ran),
        cmocka_unit_test(test_one_block_skipped),
        cmocka_unit_test(test_no_confidence_without_agreement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
