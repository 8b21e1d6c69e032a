/* decide.c — a decision point carried out: the finished early evictions
 * committed, the plan made (plan.c), and what it chose started, the same
 * in the library (on the pool) and in stagehand-sim (on its model's link).
 * The order is the one thing both must share: the room that committed
 * evictions free is the plan's, and a plan's evictions start before its
 * fetches.
 *
 * Locking: the policy only under ops.policy_lock; the ops take what they
 * need themselves.
 */
#include "engine/engine.h"

#include "policy/policy.h"

int sh_engine_start(struct sh_engine *e, const struct sh_policy_plan *plan, int due)
{
    const struct sh_engine_ops *o = &e->ops;
    int rc = 0;
    if (plan->nevict)
        rc = o->start_evictions(e->ctx, plan->evict, plan->nevict);
    if (rc == 0 && plan->nfetch)
        rc = o->start_fetches(e->ctx, plan->fetch, plan->nfetch);
    if (rc == 0 && due > 0)
        rc = o->commit_fetched(e->ctx);
    return rc;
}

int sh_engine_decide(struct sh_engine *e, struct sh_policy *pol, const uint64_t *protect, size_t np,
                     struct sh_policy_plan *plan)
{
    const struct sh_engine_ops *o = &e->ops;
    if (o->evicted_ready(e->ctx) > 0 && o->commit_evicted(e->ctx))
        return SH_EINVAL;
    struct sh_engine_plan_in in;
    o->read(e->ctx, &in);
    struct sh_policy_hints h;
    int changed = 0;
    if (o->policy_lock)
        o->policy_lock(e->ctx);
    int due = sh_engine_plan(e, pol, &in, protect, np, plan, &h, &changed);
    if (o->policy_unlock)
        o->policy_unlock(e->ctx);
    if (changed && o->hints)
        o->hints(e->ctx, &h);
    if (due == SH_EBUSY)
        return 0; /* idle: nothing to start */
    if (due < 0)
        return due;
    return sh_engine_start(e, plan, due) ? SH_EINVAL : 0;
}
