/* plan.c — one decision point of the planner, the same in the library
 * (interpose/sched.c, as each launch is prepared) and in stagehand-sim (its
 * model's launches): the policy is told the pressure and the copy slots
 * busy; the Conductor's hints, when they change, go to the engine (the
 * watermarks that trigger eviction, the copies in flight allowed); the
 * plan may start no more copies than the hints leave free slots for; and
 * the finished prefetches are due a window when the policy says so. What
 * the plan chose is then started by the caller, on the pool or on the
 * model's link.
 *
 * Locking: the caller's, around every call into the policy (the library's
 * sched_mu); the hints last passed on are the engine's, under that lock.
 */
#include "engine/engine.h"

#include "policy/policy.h"

static size_t free_slots(int cap, size_t busy, size_t room)
{
    size_t n = cap > 0 && (size_t)cap > busy ? (size_t)cap - busy : 0;
    return n < room ? n : room;
}

/* Passes the hints on when they changed since last time; 1 if they did. */
static int pass_hints(struct sh_engine *e, const struct sh_policy_hints *h)
{
    const struct sh_policy_hints *t = &e->told;
    if (h->prefetch_window == t->prefetch_window && h->max_inflight_h2d == t->max_inflight_h2d &&
        h->max_inflight_d2h == t->max_inflight_d2h &&
        h->suppress_speculative == t->suppress_speculative && h->rules_fired == t->rules_fired &&
        h->high_watermark == t->high_watermark && h->low_watermark == t->low_watermark)
        return 0;
    e->told = *h;
    sh_engine_hints(e, h);
    return 1;
}

/* sh_engine_plan (engine.h), once the plan is not idle. */
int sh_engine_plan_now(struct sh_engine *e, struct sh_policy *pol,
                       const struct sh_engine_plan_in *in, const uint64_t *protect, size_t np,
                       struct sh_policy_plan *plan, struct sh_policy_hints *hints, int *changed)
{
    sh_policy_pressure(pol, in->dev);
    sh_policy_slots(pol, (int)in->fetching, (int)in->evicting);
    struct sh_policy_hints h;
    e->told_gen = sh_policy_hints_gen(pol);
    sh_policy_hints(pol, &h);
    int passed = pass_hints(e, &h);
    if (changed)
        *changed = passed;
    if (hints)
        *hints = h;
    plan->fetch_max = free_slots(h.max_inflight_h2d, in->fetching, plan->fetch_max);
    plan->evict_max = free_slots(h.max_inflight_d2h, in->evicting, plan->evict_max);
    int rc = sh_policy_plan(pol, in->dev, protect, np, plan);
    if (rc != 0)
        return rc;
    return sh_policy_commit_due(pol, in->fetched, 0);
}
