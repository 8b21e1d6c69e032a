/* policy_loop.h — the policy tests' synthetic loop: parameters, a policy
 * of a kind, launches by kernel and ids on one stream, and a loop of four
 * weights (forward W1..W4, backward W4..W1) trained for one step. Shared by
 * the test_policy*.c files; include it once, after cmocka and
 * policy/policy.h. */
#ifndef TESTS_UNIT_POLICY_LOOP_H
#define TESTS_UNIT_POLICY_LOOP_H

#define FAR UINT64_MAX

/* Kernels of the synthetic loop. */
enum { KF = 11, KB = 12, KO = 13, KX = 14 };

static inline struct sh_policy_params params(int kind)
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
        .conductor_enabled = 0,
        .backward_pressure_pct = 80,
        .backward_prefetch_window = 1,
        .optimizer_max_inflight_h2d = 1,
        .contention_checks = 2,
    };
    return q;
}

static inline struct sh_policy *mk(int kind)
{
    struct sh_policy_params q = params(kind);
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    return p;
}

static uint64_t t_now;

static inline void launch(struct sh_policy *p, uint64_t kernel, const uint64_t *ids, size_t n)
{
    assert_int_equal(sh_policy_launch(p, t_now++, kernel, 7, ids, n), 0);
}

static inline void launch1(struct sh_policy *p, uint64_t kernel, uint64_t id)
{
    launch(p, kernel, &id, 1);
}

/* The stats; sh_policy_where, asked after every launch instead, agrees. */
static inline struct sh_policy_stats stats(const struct sh_policy *p)
{
    struct sh_policy_stats st;
    sh_policy_stats(p, &st);
    int64_t step = -1;
    int phase = -1;
    sh_policy_where(p, &step, &phase);
    assert_int_equal(step, st.step);
    assert_int_equal(phase, st.phase);
    return st;
}

static inline uint64_t next_use(struct sh_policy *p, uint64_t id)
{
    uint64_t d = 0;
    assert_int_equal(sh_policy_next_use(p, id, &d), 0);
    return d;
}

/* The loop "forward W1..W4, backward W4..W1": 8 launches a step, steps
 * found from the first launch recurring. Sizes: W1..W4 as given. */
static inline void alloc_weights(struct sh_policy *p, const uint64_t *sizes)
{
    for (uint64_t i = 0; i < 4; i++)
        assert_int_equal(sh_policy_alloc(p, t_now, i + 1, sizes[i], 7), 0);
}

static inline void fwd_bwd(struct sh_policy *p, int from)
{
    static const uint64_t order[] = {1, 2, 3, 4, 4, 3, 2, 1};
    for (int i = from; i < 8; i++)
        launch1(p, i < 4 ? KF : KB, order[i]);
}

/* Steps 0 (recorded) and the first launch of step 1. */
static inline struct sh_policy *trained(int kind, const uint64_t *sizes)
{
    struct sh_policy *p = mk(kind);
    alloc_weights(p, sizes);
    fwd_bwd(p, 0);
    launch1(p, KF, 1); /* step 1 begins */
    return p;
}

/* Up to 16 prefetch candidates within room bytes. */
static inline size_t prefetch(struct sh_policy *p, uint64_t room, uint64_t *out)
{
    return sh_policy_prefetch(p, room, out, 16);
}

static const uint64_t same[4] = {100, 100, 100, 100};

#endif
