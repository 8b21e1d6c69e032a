/* rules.c — the Conductor rules (seed 004) as limits over the phases:
 * backward pressure, optimizer protection, contention back-off.
 *
 * They restrain guesses. While the policy is confident (it follows a
 * recording that a whole step has confirmed, so it knows what the step will
 * allocate and touch), the rules leave the configured limits alone; the
 * moment it is not, they apply.
 *
 * Within a step every hint only tightens: the window and the slot caps never
 * grow, the watermarks never rise, suppress_speculative never clears. Only
 * sh_policy_rules_step() starts afresh, from the configured values with the
 * contention back-off (the one thing that spans steps) applied.
 *
 * No shared state of its own: the owner serialises calls (the policy's caller
 * holds its lock).
 */
#include "policy/policy.h"
#include "sh_err.h"

#include <stdlib.h>

#define RULE_BACKWARD  (1u << 0)
#define RULE_OPTIMIZER (1u << 1)
#define RULE_BACKOFF   (1u << 2)

struct sh_policy_rules {
    struct sh_policy_params base;
    struct sh_policy_hints h;
    int phase;
    int h2d_busy, d2h_busy;
    uint64_t device_bytes; /* last pressure seen */
    int confident;         /* following a confirmed recording */
    int level;             /* rule 3: the window is base >> level */
    int step_contended;    /* this step saw a stall with every H2D slot busy */
    int contended_run, calm_run;
    uint64_t gen; /* moves on at every call that may change h */
};

static int max_level(const struct sh_policy_rules *r)
{
    int l = 0;
    while ((r->base.prefetch_window >> (l + 1)) >= 1)
        l++;
    return l;
}

static int backoff_window(const struct sh_policy_rules *r)
{
    int w = r->base.prefetch_window >> r->level;
    return w < 1 ? 1 : w;
}

static void reset_hints(struct sh_policy_rules *r)
{
    r->h.prefetch_window = r->confident ? r->base.prefetch_window : backoff_window(r);
    r->h.max_inflight_h2d = r->base.max_inflight_h2d;
    r->h.max_inflight_d2h = r->base.max_inflight_d2h;
    r->h.suppress_speculative = 0;
    r->h.high_watermark = r->base.high_watermark;
    r->h.low_watermark = r->base.low_watermark;
    r->h.rules_fired = !r->confident && r->level > 0 ? RULE_BACKOFF : 0;
}

int sh_policy_rules_create(const struct sh_policy_params *params, struct sh_policy_rules **out)
{
    if (!params || !out)
        return SH_EINVAL;
    *out = NULL;
    struct sh_policy_rules *r = calloc(1, sizeof *r);
    if (!r)
        return SH_ENOMEM;
    r->base = *params;
    r->phase = SH_PHASE_STEP_BEGIN;
    reset_hints(r);
    *out = r;
    return 0;
}

void sh_policy_rules_destroy(struct sh_policy_rules *r)
{
    free(r);
}

static int on(const struct sh_policy_rules *r)
{
    return r->base.conductor_enabled && !r->confident;
}

/* Tightening helpers: each only ever lowers a limit. */
static void cap_int(int *v, int cap, uint32_t *fired, uint32_t bit)
{
    if (*v > cap) {
        *v = cap;
        *fired |= bit;
    }
}

static void cap_u64(uint64_t *v, uint64_t cap, uint32_t *fired, uint32_t bit)
{
    if (*v > cap) {
        *v = cap;
        *fired |= bit;
    }
}

static void suppress(struct sh_policy_rules *r, uint32_t bit)
{
    if (!r->h.suppress_speculative) {
        r->h.suppress_speculative = 1;
        r->h.rules_fired |= bit;
    }
}

/* Rule 1, evaluated whenever the phase or the pressure changes. */
static void rule_backward(struct sh_policy_rules *r, uint64_t device_bytes)
{
    if (!on(r) || r->phase != SH_PHASE_BACKWARD)
        return;
    uint64_t pct = (uint64_t)r->base.backward_pressure_pct;
    uint64_t threshold =
        r->base.high_watermark / 100 * pct + r->base.high_watermark % 100 * pct / 100;
    if (device_bytes <= threshold)
        return;
    uint32_t *f = &r->h.rules_fired;
    cap_u64(&r->h.high_watermark, threshold, f, RULE_BACKWARD);
    cap_u64(&r->h.low_watermark,
            r->base.low_watermark / 100 * pct + r->base.low_watermark % 100 * pct / 100, f,
            RULE_BACKWARD);
    cap_int(&r->h.prefetch_window, r->base.backward_prefetch_window, f, RULE_BACKWARD);
    suppress(r, RULE_BACKWARD);
}

/* Rule 2. */
static void rule_optimizer(struct sh_policy_rules *r)
{
    if (!on(r) || r->phase != SH_PHASE_OPTIMIZER)
        return;
    cap_int(&r->h.max_inflight_h2d, r->base.optimizer_max_inflight_h2d, &r->h.rules_fired,
            RULE_OPTIMIZER);
    suppress(r, RULE_OPTIMIZER);
}

/* Rule 3 at the end of a step: move the back-off level by one after a run
 * of contended (or calm) steps. */
static void rule_backoff(struct sh_policy_rules *r)
{
    if (!r->base.conductor_enabled) {
        r->level = 0;
        return;
    }
    if (r->step_contended) {
        r->calm_run = 0;
        if (++r->contended_run >= r->base.contention_checks) {
            r->contended_run = 0;
            if (r->level < max_level(r))
                r->level++;
        }
    } else {
        r->contended_run = 0;
        if (++r->calm_run >= r->base.contention_checks) {
            r->calm_run = 0;
            if (r->level > 0)
                r->level--;
        }
    }
    r->step_contended = 0;
}

void sh_policy_rules_step(struct sh_policy_rules *r, int confident)
{
    if (!r)
        return;
    r->gen++;
    rule_backoff(r);
    r->phase = SH_PHASE_STEP_BEGIN;
    r->confident = confident != 0;
    reset_hints(r);
}

void sh_policy_rules_confident(struct sh_policy_rules *r, int confident)
{
    if (!r || (confident != 0) == r->confident)
        return;
    r->gen++;
    if (confident) {
        r->confident = 1; /* stops further tightening; loosens nothing */
        return;
    }
    r->confident = 0;
    if (r->base.conductor_enabled)
        cap_int(&r->h.prefetch_window, backoff_window(r), &r->h.rules_fired, RULE_BACKOFF);
    rule_optimizer(r);
    rule_backward(r, r->device_bytes);
}

void sh_policy_rules_phase(struct sh_policy_rules *r, int phase)
{
    if (!r || phase < SH_PHASE_STEP_BEGIN || phase > SH_PHASE_STEP_END)
        return;
    r->gen++;
    r->phase = phase;
    rule_optimizer(r);
    rule_backward(r, r->device_bytes);
}

void sh_policy_rules_pressure(struct sh_policy_rules *r, uint64_t device_bytes)
{
    if (!r)
        return;
    r->gen++;
    r->device_bytes = device_bytes;
    rule_backward(r, device_bytes);
}

void sh_policy_rules_slots(struct sh_policy_rules *r, int h2d_busy, int d2h_busy)
{
    if (!r)
        return;
    r->h2d_busy = h2d_busy;
    r->d2h_busy = d2h_busy;
}

void sh_policy_rules_stall(struct sh_policy_rules *r)
{
    if (r && !r->confident && r->h2d_busy > 0 && r->h2d_busy >= r->h.max_inflight_h2d)
        r->step_contended = 1;
}

void sh_policy_rules_hints(const struct sh_policy_rules *r, struct sh_policy_hints *out)
{
    if (r && out)
        *out = r->h;
}

uint64_t sh_policy_rules_gen(const struct sh_policy_rules *r)
{
    return r->gen;
}

int sh_policy_rules_level(const struct sh_policy_rules *r)
{
    return r ? r->level : 0;
}
