/* test_policy.c — the scheduler on synthetic event streams: step detection,
 * classes, next-use distance, eviction order of every kind, protection,
 * divergence and recovery, several recordings, phases, commit batching,
 * configuration (planning: test_policy_plan.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "config/config.h"
#include "policy/policy.h"
#include "sh_err.h"

#include <string.h>

#include "policy_loop.h"

/* ---- creation, errors ---- */

static void test_bad_params(void **state)
{
    (void)state;
    struct sh_policy *p = NULL;
    struct sh_policy_params q = params(7);
    assert_int_equal(sh_policy_create(&q, &p), SH_EINVAL);
    q = params(SH_POLICY_LEARNED);
    q.low_watermark = 900;
    assert_int_equal(sh_policy_create(&q, &p), SH_EINVAL);
    q = params(SH_POLICY_LEARNED);
    q.prefetch_window = 0;
    assert_int_equal(sh_policy_create(&q, &p), SH_EINVAL);
    q = params(SH_POLICY_LEARNED);
    q.high_watermark = 1001;
    assert_int_equal(sh_policy_create(&q, &p), SH_EINVAL);
    assert_null(p);
    sh_policy_destroy(NULL);
}

static void test_event_errors(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    assert_int_equal(sh_policy_alloc(p, 0, 1, 0, 7), SH_EINVAL);
    assert_int_equal(sh_policy_alloc(p, 0, 1, 10, 7), 0);
    assert_int_equal(sh_policy_alloc(p, 0, 1, 10, 7), SH_EINVAL);
    assert_int_equal(sh_policy_free(p, 0, 2), SH_ENOTFOUND);
    assert_int_equal(sh_policy_residency(p, 2, SH_RES_HOST), SH_ENOTFOUND);
    assert_int_equal(sh_policy_residency(p, 1, 9), SH_EINVAL);
    assert_int_equal(sh_policy_phase(p, 0, 5), SH_EINVAL);
    assert_int_equal(sh_policy_class(p, 2), SH_ENOTFOUND);
    assert_int_equal(sh_policy_forget(p, 2), SH_ENOTFOUND);
    /* unknown and repeated ids in a launch are ignored, and counted */
    uint64_t ids[] = {1, 99, 1};
    launch(p, KF, ids, 3);
    assert_int_equal(stats(p).unknown_refs, 1);
    assert_int_equal(sh_policy_free(p, 0, 1), 0);
    assert_int_equal(sh_policy_free(p, 0, 1), SH_ENOTFOUND);
    sh_policy_destroy(p);
}

/* ---- steps ---- */

static void test_auto_steps(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    fwd_bwd(p, 0);
    struct sh_policy_stats st = stats(p);
    assert_int_equal(st.step, 0);
    assert_int_equal(st.trace_ready, 0);
    assert_int_equal(st.launches_this_step, 8);
    launch1(p, KF, 1); /* the first launch recurs: step 0 is over */
    st = stats(p);
    assert_int_equal(st.step, 1);
    assert_int_equal(st.trace_ready, 1);
    assert_int_equal(st.following, 1);
    assert_int_equal(st.marked, 0);
    assert_int_equal(st.launches_this_step, 1);
    assert_int_equal(st.steps_diverged, 1); /* step 0 had nothing to follow */
    fwd_bwd(p, 1);
    launch1(p, KF, 1);
    st = stats(p);
    assert_int_equal(st.step, 2);
    assert_int_equal(st.steps_matched, 1);
    assert_int_equal(st.recordings, 1);
    assert_int_equal(st.launches, 17);
    sh_policy_destroy(p);
}

/* The first launch reads the batch: the next batch (same size, allocated
 * after that launch) counts as the same launch; another block's weight of
 * the same size does not, nor a batch of another size. */
static void test_step_next_batch(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    assert_int_equal(sh_policy_alloc(p, 0, 1, 100, 7), 0); /* W1 */
    assert_int_equal(sh_policy_alloc(p, 0, 2, 100, 7), 0); /* W2, same size */
    assert_int_equal(sh_policy_alloc(p, 0, 10, 8, 7), 0);  /* batch 0 */
    uint64_t a[] = {1, 10};
    launch(p, KF, a, 2);
    uint64_t b[] = {1, 2}; /* W2 is older than the first launch */
    launch(p, KF, b, 2);
    assert_int_equal(stats(p).step, 0);
    assert_int_equal(sh_policy_alloc(p, 0, 11, 9, 7), 0); /* another size */
    uint64_t c[] = {1, 11};
    launch(p, KF, c, 2);
    assert_int_equal(stats(p).step, 0);
    assert_int_equal(sh_policy_free(p, 0, 10), 0);
    assert_int_equal(sh_policy_alloc(p, 0, 12, 8, 7), 0); /* the next batch */
    uint64_t d[] = {1, 12};
    launch(p, KF, d, 2);
    assert_int_equal(stats(p).step, 1);
    sh_policy_destroy(p);
}

/* Warm-up launches that never recur (weight initialisation) must not hide
 * the loop: a launch that repeats itself after two whole periods that
 * repeated exactly ends step 0 and anchors the next ones. */
static void test_step_after_warmup(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    for (uint64_t id = 1; id <= 3; id++)
        assert_int_equal(sh_policy_alloc(p, 0, id, 100, 7), 0);
    for (uint64_t id = 1; id <= 3; id++)
        launch1(p, KX, id); /* init, once each */
    for (int step = 0; step < 4; step++) {
        assert_int_equal(stats(p).step, step < 3 ? 0 : step - 2);
        for (uint64_t id = 1; id <= 3; id++)
            launch1(p, KF, id);
        for (uint64_t id = 3; id >= 1; id--)
            launch1(p, KB, id);
    }
    /* Step 0 ran from the init to the third KF(1), which followed two
     * iterations alike; the fourth began step 2. */
    assert_int_equal(stats(p).step, 2);
    assert_true(stats(p).trace_ready);
    launch1(p, KF, 1);
    assert_int_equal(stats(p).step, 3);
    assert_int_equal(next_use(p, 2), 0); /* learned: W2 is needed by the very next launch */
    assert_int_equal(next_use(p, 1), 4); /* W1: after KF3, KB3, KB2 and KB1 reads it */
    sh_policy_destroy(p);
}

static void test_marked_steps_win(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    assert_int_equal(sh_policy_step(p, 0), 0); /* no launch yet: ignored */
    assert_int_equal(stats(p).step, 0);
    assert_int_equal(stats(p).marked, 1);
    fwd_bwd(p, 0);
    launch1(p, KF, 1); /* would end step 0 without the marks */
    assert_int_equal(stats(p).step, 0);
    assert_int_equal(sh_policy_step(p, 0), 0);
    assert_int_equal(sh_policy_phase(p, 0, SH_PHASE_STEP_BEGIN), 0); /* same boundary */
    assert_int_equal(stats(p).step, 1);
    assert_int_equal(stats(p).trace_ready, 1);
    sh_policy_destroy(p);
}

/* ---- classes ---- */

static void test_classes(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    launch1(p, KF, 1);
    assert_int_equal(sh_policy_alloc(p, 0, 20, 30, 7), 0); /* transient */
    assert_int_equal(sh_policy_alloc(p, 0, 21, 40, 7), 0); /* lives on */
    launch1(p, KF, 20);
    assert_int_equal(sh_policy_class(p, 20), SH_CLASS_UNKNOWN);
    assert_int_equal(sh_policy_free(p, 0, 20), 0);
    assert_int_equal(sh_policy_class(p, 20), SH_CLASS_TRANSIENT);
    assert_int_equal(sh_policy_class(p, 21), SH_CLASS_UNKNOWN);
    assert_int_equal(sh_policy_class(p, 1), SH_CLASS_UNKNOWN);
    struct sh_policy_stats st = stats(p);
    assert_int_equal(st.transient, 1);
    assert_int_equal(st.persistent, 0);
    assert_int_equal(st.step_bytes, 440); /* W1..W4 and region 21 */
    launch1(p, KF, 1);                    /* step 1 */
    assert_int_equal(sh_policy_class(p, 21), SH_CLASS_PERSISTENT);
    assert_int_equal(sh_policy_class(p, 2), SH_CLASS_PERSISTENT);
    st = stats(p);
    assert_int_equal(st.persistent, 5);
    assert_int_equal(st.persistent_bytes, 440);
    assert_int_equal(st.step_bytes, 0);
    assert_int_equal(sh_policy_free(p, 0, 21), 0); /* freed a step later: persistent */
    assert_int_equal(sh_policy_class(p, 21), SH_CLASS_PERSISTENT);
    assert_int_equal(stats(p).persistent, 4);
    assert_int_equal(stats(p).transient, 1);
    sh_policy_destroy(p);
}

/* ---- next use ---- */

static void test_next_use(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    /* recorded uses: W1 0,7  W2 1,6  W3 2,5  W4 3,4; now at launch 1 */
    assert_int_equal(next_use(p, 1), 6);
    assert_int_equal(next_use(p, 2), 0);
    assert_int_equal(next_use(p, 3), 1);
    assert_int_equal(next_use(p, 4), 2);
    fwd_bwd(p, 1);
    /* after the step's last launch: the next step's first uses */
    assert_int_equal(next_use(p, 1), 0);
    assert_int_equal(next_use(p, 4), 3);
    uint64_t d;
    assert_int_equal(sh_policy_next_use(p, 77, &d), SH_ENOTFOUND);
    sh_policy_destroy(p);
}

static void test_next_use_unknown_before_trace(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    fwd_bwd(p, 0);
    assert_true(next_use(p, 1) == FAR);
    sh_policy_destroy(p);
}

/* ---- eviction order ---- */

static void victims_are(struct sh_policy *p, uint64_t need, const uint64_t *protect, size_t np,
                        const uint64_t *want, size_t nwant)
{
    uint64_t out[16];
    size_t n = sh_policy_victims(p, need, protect, np, out, 16);
    assert_int_equal(n, nwant);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(out[i], want[i]);
}

static void test_lru_order(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_REACTIVE, same);
    /* last uses: W4 at 4, W3 at 5, W2 at 6, W1 at 8 */
    static const uint64_t all[] = {4, 3, 2, 1};
    victims_are(p, 1000, NULL, 0, all, 4);
    static const uint64_t two[] = {4, 3};
    victims_are(p, 150, NULL, 0, two, 2);
    sh_policy_destroy(p);
}

/* Learned: outside the window, farthest next use x size first; inside it
 * (window 4), farthest first and last of all. */
static void test_learned_order(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    /* distances: W1 6 (outside), W4 2, W3 1, W2 0 (inside) */
    static const uint64_t want[] = {1, 4, 3, 2};
    victims_are(p, 1000, NULL, 0, want, 4);
    sh_policy_destroy(p);
}

static void test_learned_score_uses_size(void **state)
{
    (void)state;
    struct sh_policy_params q = params(SH_POLICY_LEARNED);
    q.prefetch_window = 2;
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    static const uint64_t sizes[] = {100, 100, 100, 400};
    alloc_weights(p, sizes);
    fwd_bwd(p, 0);
    launch1(p, KF, 1);
    /* W4: 2 x 400 = 800 beats W1: 6 x 100 = 600; W3, W2 in the window */
    static const uint64_t want[] = {4, 1, 3, 2};
    victims_are(p, 1000, NULL, 0, want, 4);
    sh_policy_destroy(p);
}

/* Belady: farthest next use first, whatever the size. */
static void test_belady_order(void **state)
{
    (void)state;
    struct sh_policy_params q = params(SH_POLICY_BELADY);
    q.prefetch_window = 2;
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    static const uint64_t sizes[] = {100, 100, 100, 400};
    static const uint64_t order[] = {1, 2, 3, 4, 4, 3, 2, 1, 1, 2, 3, 4};
    struct sh_policy_future f[16] = {{0}};
    for (uint64_t i = 0; i < 4; i++) {
        f[i].kind = SH_FUTURE_ALLOC;
        f[i].id = i + 1;
        f[i].bytes = sizes[i];
    }
    for (int i = 0; i < 12; i++) {
        f[4 + i].kind = SH_FUTURE_LAUNCH;
        f[4 + i].ids = &order[i];
        f[4 + i].n = 1;
    }
    assert_int_equal(sh_policy_set_future(p, f, 16), 0);
    alloc_weights(p, sizes);
    fwd_bwd(p, 0);
    launch1(p, KF, 1);
    /* next uses from launch 9: W1 none, W2 9, W3 10, W4 11 */
    assert_true(next_use(p, 1) == FAR);
    assert_int_equal(next_use(p, 2), 0);
    assert_int_equal(next_use(p, 4), 2);
    static const uint64_t want[] = {1, 4, 3, 2};
    victims_are(p, 1000, NULL, 0, want, 4);
    sh_policy_destroy(p);
}

static void test_freed_first(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    assert_int_equal(sh_policy_alloc(p, 0, 30, 50, 7), 0);
    assert_int_equal(sh_policy_free(p, 0, 30), 0);
    static const uint64_t want[] = {30, 1};
    victims_are(p, 120, NULL, 0, want, 2);
    assert_int_equal(stats(p).regions, 5);
    /* evicting a freed region is releasing it: it is gone */
    assert_int_equal(sh_policy_residency(p, 30, SH_RES_HOST), 0);
    assert_int_equal(sh_policy_class(p, 30), SH_ENOTFOUND);
    assert_int_equal(stats(p).regions, 4);
    sh_policy_destroy(p);
}

/* A step with two scratch regions of 100 bytes allocated at its start and
 * read by its first launch only: 51 freed at position 2, 50 at 6. */
static void step_with_two_scratch(struct sh_policy *p, int record)
{
    static const uint64_t order[] = {1, 2, 3, 4, 4, 3, 2, 1};
    assert_int_equal(sh_policy_alloc(p, t_now, 50, 100, 7), 0);
    assert_int_equal(sh_policy_alloc(p, t_now, 51, 100, 7), 0);
    uint64_t first[] = {1, 50, 51};
    launch(p, KF, first, 3);
    for (int i = 1; i < (record ? 8 : 1); i++) {
        if (i == 2 || i == 6) {
            uint64_t id = i == 2 ? 51 : 50;
            assert_int_equal(sh_policy_free(p, t_now, id), 0);
            assert_int_equal(sh_policy_forget(p, id), 0);
        }
        launch1(p, i < 4 ? KF : KB, order[i]);
    }
}

/* Learned weighs what an eviction frees against the copies it costs: a
 * region freed before any further use is away only until its free, which
 * would release it anyway, for one copy out; one used again is away until
 * that use, for a copy out and one back, or only the one back when it keeps
 * a host copy. So a region freed late goes before one needed later, one
 * freed soon after it, and all before those needed within the window. */
static void test_dead_weighs_its_free(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    assert_int_equal(sh_policy_step(p, t_now), 0);
    step_with_two_scratch(p, 1);
    assert_int_equal(sh_policy_step(p, t_now), 0);
    assert_int_equal(stats(p).trace_ready, 1);
    step_with_two_scratch(p, 0);
    assert_true(next_use(p, 50) == FAR); /* no use left */
    assert_true(next_use(p, 51) == FAR);
    /* at position 1: 50 freed in 5 (100 B x 5 / 1 copy), W1 needed in 6
     * (100 B x 6 / 2 copies), 51 freed in 1; W4, W3, W2 within the window */
    static const uint64_t want[] = {50, 1, 51, 4, 3, 2};
    victims_are(p, 10000, NULL, 0, want, 6);
    /* W1 keeps a host copy: its eviction costs only the copy back */
    assert_int_equal(sh_policy_kept(p, 1, 1), 0);
    static const uint64_t kept[] = {1, 50, 51, 4, 3, 2};
    victims_are(p, 10000, NULL, 0, kept, 6);
    assert_int_equal(sh_policy_kept(p, 1, 0), 0);
    victims_are(p, 10000, NULL, 0, want, 6);
    assert_int_equal(sh_policy_kept(p, 99, 1), SH_ENOTFOUND);
    assert_int_equal(sh_policy_kept(NULL, 1, 1), SH_EINVAL);
    sh_policy_destroy(p);
}

/* The other kinds keep such a region after every region needed later. */
static void test_lru_dead_after_later(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LRU);
    alloc_weights(p, same);
    assert_int_equal(sh_policy_step(p, t_now), 0);
    step_with_two_scratch(p, 1);
    assert_int_equal(sh_policy_step(p, t_now), 0);
    step_with_two_scratch(p, 0);
    uint64_t out[16];
    size_t n = sh_policy_victims(p, 10000, NULL, 0, out, 16);
    assert_int_equal(n, 6);
    /* W1 (LRU among those needed later) before both scratch regions */
    assert_int_equal(out[0], 1);
    assert_true((out[1] == 50 && out[2] == 51) || (out[1] == 51 && out[2] == 50));
    sh_policy_destroy(p);
}

static void test_protect_and_in_flight(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    assert_int_equal(sh_policy_residency(p, 1, SH_RES_TO_HOST), 0);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_TO_DEVICE), 0);
    static const uint64_t protect[] = {4};
    static const uint64_t want[] = {2};
    victims_are(p, 1000, protect, 1, want, 1);
    assert_int_equal(sh_policy_residency(p, 1, SH_RES_HOST), 0);
    static const uint64_t none[] = {0};
    victims_are(p, 1000, (const uint64_t[]){4, 2}, 2, none, 0);
    sh_policy_destroy(p);
}

/* ---- divergence ---- */

static void test_divergence_falls_back_to_lru(void **state)
{
    (void)state;
    struct sh_policy *p = trained(SH_POLICY_LEARNED, same);
    launch1(p, KX, 2); /* not what step 0 did */
    struct sh_policy_stats st = stats(p);
    assert_int_equal(st.following, 0);
    assert_int_equal(st.diverged, 1);
    assert_true(next_use(p, 3) == FAR);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_HOST), 0);
    uint64_t out[16];
    assert_int_equal(prefetch(p, 1000, out), 0);
    /* LRU: W4 (4), W1 (8), W2 (9) */
    static const uint64_t want[] = {4, 1, 2};
    victims_are(p, 1000, NULL, 0, want, 3);
    assert_int_equal(sh_policy_residency(p, 3, SH_RES_DEVICE), 0);
    /* the step ends; the next one does what step 0 did: follows again */
    launch1(p, KF, 1);
    st = stats(p);
    assert_int_equal(st.steps_diverged, 2);
    assert_int_equal(st.recordings, 2);
    assert_int_equal(st.following, 1);
    fwd_bwd(p, 1);
    launch1(p, KF, 1);
    st = stats(p);
    assert_int_equal(st.steps_matched, 1);
    assert_int_equal(st.following, 1);
    assert_int_equal(next_use(p, 2), 0);
    sh_policy_destroy(p);
}

/* Training, evaluation (a prefix of training), training...: each shape is
 * recorded once and followed from then on. */
static void test_eval_steps(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    for (int s = 0; s < 6; s++) {
        if (s % 3 == 2) {
            for (uint64_t i = 1; i <= 4; i++)
                launch1(p, KF, i);
        } else {
            fwd_bwd(p, 0);
        }
    }
    launch1(p, KF, 1);
    struct sh_policy_stats st = stats(p);
    assert_int_equal(st.step, 6);
    assert_int_equal(st.recordings, 2);
    assert_int_equal(st.steps_diverged, 2); /* step 0 and the first evaluation */
    assert_int_equal(st.steps_matched, 4);
    sh_policy_destroy(p);
}

/* Another batch shape: same kernels, same structure, other sizes. */
static void test_batch_shape_still_follows(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    for (uint64_t s = 0; s < 3; s++) {
        uint64_t a = 100 + s;
        launch1(p, KF, 1);
        assert_int_equal(sh_policy_alloc(p, t_now, a, 50 + 10 * s, 7), 0);
        uint64_t ids[] = {2, a};
        launch(p, KF, ids, 2);
        assert_int_equal(stats(p).following, s > 0);
        assert_int_equal(sh_policy_free(p, t_now, a), 0);
        assert_int_equal(sh_policy_forget(p, a), 0);
    }
    assert_int_equal(stats(p).steps_matched, 1);
    sh_policy_destroy(p);
}

/* ---- phases ---- */

static void one_training_step(struct sh_policy *p, uint64_t first_act, int *phases)
{
    int k = 0;
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(sh_policy_alloc(p, t_now, first_act + i, 50, 7), 0);
        uint64_t ids[] = {i + 1, first_act + i};
        launch(p, KF, ids, 2);
        phases[k++] = stats(p).phase;
    }
    for (uint64_t i = 3; i-- > 0;) {
        uint64_t ids[] = {i + 1, first_act + i};
        launch(p, KB, ids, 2);
        phases[k++] = stats(p).phase;
        assert_int_equal(sh_policy_free(p, t_now, first_act + i), 0);
        assert_int_equal(sh_policy_forget(p, first_act + i), 0);
    }
    for (uint64_t i = 0; i < 3; i++) {
        launch1(p, KO, i + 1);
        phases[k++] = stats(p).phase;
    }
}

static void test_auto_phases(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    int ph[9];
    one_training_step(p, 100, ph);
    /* no recording yet: forward until W3 is used a second time */
    static const int online[] = {1, 1, 1, 2, 2, 2, 2, 2, 2};
    assert_memory_equal(ph, online, sizeof ph);
    one_training_step(p, 200, ph);
    /* following step 0's recording: the optimizer starts after the last
     * use of forward's activations */
    static const int learned[] = {1, 1, 1, 2, 2, 2, 3, 3, 3};
    assert_memory_equal(ph, learned, sizeof ph);
    assert_int_equal(sh_policy_phase(p, 0, SH_PHASE_BACKWARD), 0); /* marks win */
    assert_int_equal(stats(p).phase, SH_PHASE_BACKWARD);
    one_training_step(p, 300, ph); /* a new step, and no mark: STEP_BEGIN */
    static const int marked[] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(ph, marked, sizeof ph);
    assert_int_equal(sh_policy_phase(p, 0, SH_PHASE_OPTIMIZER), 0);
    assert_int_equal(stats(p).phase, SH_PHASE_OPTIMIZER);
    sh_policy_destroy(p);
}

/* ---- rules through the policy ---- */

static void test_rules_restrain_guesses_only(void **state)
{
    (void)state;
    struct sh_policy_params q = params(SH_POLICY_LEARNED);
    q.conductor_enabled = 1;
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    alloc_weights(p, same);
    int ph[9];
    struct sh_policy_hints h;
    one_training_step(p, 100, ph); /* step 0: guessing, ends in BACKWARD */
    sh_policy_pressure(p, 700);
    sh_policy_hints(p, &h);
    assert_int_equal(h.prefetch_window, 1);
    assert_int_equal(h.high_watermark, 640);
    assert_int_equal(h.rules_fired, 1);
    one_training_step(p, 200, ph); /* step 1 follows an unconfirmed recording */
    sh_policy_hints(p, &h);
    assert_int_equal(h.max_inflight_h2d, 1); /* optimizer protection */
    assert_int_equal(h.rules_fired & 2, 2);
    one_training_step(p, 300, ph); /* confirmed: confident from step 2 */
    sh_policy_pressure(p, 790);
    sh_policy_hints(p, &h);
    assert_int_equal(h.prefetch_window, 4);
    assert_int_equal(h.max_inflight_h2d, 8);
    assert_int_equal(h.high_watermark, 800);
    assert_int_equal(h.rules_fired, 0);
    sh_policy_destroy(p);
}

/* ---- commits, configuration ---- */

static void test_commit_due(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    assert_int_equal(sh_policy_commit_due(p, 0, 1), 0);
    assert_int_equal(sh_policy_commit_due(p, 3, 0), 0);
    assert_int_equal(sh_policy_commit_due(p, 1, 1), 1);
    assert_int_equal(sh_policy_commit_due(p, 4, 0), 1);
    sh_policy_destroy(p);
}

static void test_params_from_config(void **state)
{
    (void)state;
    struct sh_config cfg;
    char err[SH_CONFIG_ERR_MAX];
    struct sh_policy_params q;
    sh_config_defaults(&cfg);
    assert_int_equal(sh_policy_params_from_config(&cfg, &q), SH_EINVAL); /* not resolved */
    assert_int_equal(sh_config_resolve(&cfg, 10ull << 30, 64ull << 30, err, sizeof err), 0);
    assert_int_equal(sh_policy_params_from_config(&cfg, &q), 0);
    assert_int_equal(q.kind, SH_POLICY_LEARNED);
    assert_int_equal(q.budget_bytes, 10ull << 30);
    /* auto watermarks: the budget; the library narrows it at run time */
    assert_int_equal(q.high_watermark, 10ull << 30);
    assert_int_equal(q.low_watermark, 10ull << 30);
    assert_int_equal(q.prefetch_window, 64);
    assert_int_equal(q.prefetch_enabled, 1);
    assert_int_equal(q.max_inflight_h2d, 2);
    assert_int_equal(q.max_inflight_d2h, 2);
    assert_int_equal(q.batch_max, 16);
    assert_int_equal(q.conductor_enabled, 1);
    assert_int_equal(q.backward_pressure_pct, 80);
    assert_int_equal(q.backward_prefetch_window, 1);
    assert_int_equal(q.optimizer_max_inflight_h2d, 1);
    assert_int_equal(q.contention_checks, 3);
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    sh_policy_destroy(p);
    assert_int_equal(
        sh_config_load_string(&cfg, "t.ini", "[policy]\neviction = lru\n", err, sizeof err), 0);
    assert_int_equal(sh_config_resolve(&cfg, 10ull << 30, 64ull << 30, err, sizeof err), 0);
    assert_int_equal(sh_policy_params_from_config(&cfg, &q), 0);
    assert_int_equal(q.kind, SH_POLICY_LRU);
}

/* A long run through many regions: the table grows and shrinks, steps are
 * found, and nothing leaks (the sanitizer build checks that). */
static void test_many_regions(void **state)
{
    (void)state;
    struct sh_policy *p = mk(SH_POLICY_LEARNED);
    alloc_weights(p, same);
    uint64_t id = 1000;
    for (int s = 0; s < 5; s++) {
        launch1(p, KF, 1);
        for (int i = 0; i < 300; i++) {
            assert_int_equal(sh_policy_alloc(p, t_now, id + (uint64_t)i, 10, 7), 0);
            uint64_t ids[] = {2, id + (uint64_t)i};
            launch(p, KF, ids, 2);
        }
        for (int i = 0; i < 300; i++) {
            assert_int_equal(sh_policy_free(p, t_now, id + (uint64_t)i), 0);
            assert_int_equal(sh_policy_forget(p, id + (uint64_t)i), 0);
        }
        id += 300;
    }
    struct sh_policy_stats st = stats(p);
    assert_int_equal(st.step, 4);
    assert_int_equal(st.regions, 4);
    assert_int_equal(st.steps_matched, 3);
    assert_int_equal(st.transient, 1500);
    sh_policy_destroy(p);
}

/* Victims come only from the live regions on the device that may move
 * (not pinned), whatever moved in and out, was freed or forgotten, and
 * across the table's growth and rehashing (the set of them is kept as
 * residency changes). */
static void test_victims_only_on_the_device(void **state)
{
    (void)state;
    enum { N = 400 };
    struct sh_policy *p = mk(SH_POLICY_LRU);
    static int want[N]; /* 1: a victim to expect */
    for (uint64_t id = 1; id <= N; id++) {
        assert_int_equal(sh_policy_alloc(p, t_now, id, 10, 7), 0);
        launch1(p, KF, id);
        want[id - 1] = 1;
        if (id % 3 == 0) { /* to the host, then half of them back */
            assert_int_equal(sh_policy_residency(p, id, SH_RES_HOST), 0);
            want[id - 1] = id % 2 == 0;
            if (want[id - 1])
                assert_int_equal(sh_policy_residency(p, id, SH_RES_DEVICE), 0);
        } else if (id % 5 == 0) { /* moving: neither here nor there */
            assert_int_equal(sh_policy_residency(p, id, SH_RES_TO_HOST), 0);
            want[id - 1] = 0;
        } else if (id % 7 == 0) { /* gone */
            assert_int_equal(sh_policy_free(p, t_now, id), 0);
            assert_int_equal(sh_policy_forget(p, id), 0);
            want[id - 1] = 0;
        } else if (id % 11 == 0) { /* its pages are shared: it never moves */
            assert_int_equal(sh_policy_pinned(p, id), 0);
            want[id - 1] = 0;
        }
    }
    assert_int_equal(sh_policy_pinned(p, N + 1), SH_ENOTFOUND);
    assert_int_equal(sh_policy_pinned(NULL, 1), SH_EINVAL);
    size_t expect = 0;
    for (int i = 0; i < N; i++)
        expect += (size_t)want[i];
    static uint64_t out[N];
    size_t n = sh_policy_victims(p, UINT64_MAX, NULL, 0, out, N);
    assert_int_equal(n, expect);
    for (size_t i = 0; i < n; i++) {
        assert_true(out[i] >= 1 && out[i] <= N);
        assert_true(want[out[i] - 1]);
        want[out[i] - 1] = 0; /* each once */
    }
    for (size_t i = 1; i < n; i++) /* least recently used first */
        assert_true(out[i - 1] < out[i]);
    sh_policy_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_victims_only_on_the_device),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_event_errors),
        cmocka_unit_test(test_auto_steps),
        cmocka_unit_test(test_step_next_batch),
        cmocka_unit_test(test_step_after_warmup),
        cmocka_unit_test(test_marked_steps_win),
        cmocka_unit_test(test_classes),
        cmocka_unit_test(test_next_use),
        cmocka_unit_test(test_next_use_unknown_before_trace),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_learned_order),
        cmocka_unit_test(test_learned_score_uses_size),
        cmocka_unit_test(test_belady_order),
        cmocka_unit_test(test_freed_first),
        cmocka_unit_test(test_dead_weighs_its_free),
        cmocka_unit_test(test_lru_dead_after_later),
        cmocka_unit_test(test_protect_and_in_flight),
        cmocka_unit_test(test_divergence_falls_back_to_lru),
        cmocka_unit_test(test_eval_steps),
        cmocka_unit_test(test_batch_shape_still_follows),
        cmocka_unit_test(test_auto_phases),
        cmocka_unit_test(test_rules_restrain_guesses_only),
        cmocka_unit_test(test_commit_due),
        cmocka_unit_test(test_params_from_config),
        cmocka_unit_test(test_many_regions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
