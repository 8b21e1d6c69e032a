/* policy.c — the scheduler: creation, the events it is told and what it
 * knows. Its other parts live beside it, over one private header
 * (policy_int.h): the region table (table.c), step detection and
 * recording (record.c), next-use prediction (predict.c), victims,
 * prefetch and exchange planning (plan.c), and the exact future
 * (future.c).
 *
 * Four kinds share one machine (docs/POLICY.md):
 *   reactive  LRU victims, no prefetch;
 *   lru       LRU victims, prefetch of what the last matching recording
 *             needs next (into free room only);
 *   learned   freed first, then farthest next use x size from a recording
 *             of an earlier step; prefetch plus exchange (evict what is
 *             needed later to bring back what is needed sooner); LRU while
 *             no recording matches the current step;
 *   belady    the same planner fed with the exact future (stagehand-sim).
 *
 * Every step is recorded. A region's identity across steps is its id when
 * it lives on, or its allocation position (launches before it, counted from
 * the step's start, and how many allocations followed it there) when it is
 * allocated anew each step. At a step's end the recording either confirms
 * the one it followed or is kept as a new one (up to MAX_RECORDINGS).
 *
 * Not thread-safe: the caller serialises every call (the library's lock).
 */
#include "policy/policy_int.h"

#include "config/config.h"
#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------- */
/* creation */

static int check_params(const struct sh_policy_params *q)
{
    if (q->kind < SH_POLICY_REACTIVE || q->kind > SH_POLICY_BELADY)
        return SH_EINVAL;
    if (q->low_watermark > q->high_watermark || q->high_watermark > q->budget_bytes)
        return SH_EINVAL;
    if (q->prefetch_window < 1 || q->max_inflight_h2d < 1 || q->max_inflight_d2h < 1 ||
        q->batch_max < 1)
        return SH_EINVAL;
    if (q->conductor_enabled && (q->backward_pressure_pct < 1 || q->backward_pressure_pct > 100 ||
                                 q->backward_prefetch_window < 0 ||
                                 q->optimizer_max_inflight_h2d < 0 || q->contention_checks < 1))
        return SH_EINVAL;
    return 0;
}

int sh_policy_params_from_config(const struct sh_config *cfg, struct sh_policy_params *out)
{
    if (!cfg || !out || !cfg->resolved)
        return SH_EINVAL;
    memset(out, 0, sizeof *out);
    out->kind = cfg->policy.eviction == SH_CONFIG_EVICT_LRU ? SH_POLICY_LRU : SH_POLICY_LEARNED;
    out->budget_bytes = cfg->budget.vram_budget.bytes;
    out->high_watermark = cfg->budget.vram_high_watermark.bytes;
    out->low_watermark = cfg->budget.vram_low_watermark.bytes;
    out->prefetch_window = cfg->policy.prefetch_window;
    out->prefetch_enabled = cfg->policy.prefetch_enabled;
    out->max_inflight_h2d = cfg->transfer.max_inflight_h2d;
    out->max_inflight_d2h = cfg->transfer.max_inflight_d2h;
    out->batch_max = cfg->transfer.batch_max;
    out->conductor_enabled = cfg->conductor.enabled;
    out->backward_pressure_pct = cfg->conductor.backward_pressure_pct;
    out->backward_prefetch_window = cfg->conductor.backward_prefetch_window;
    out->optimizer_max_inflight_h2d = cfg->conductor.optimizer_max_inflight_h2d;
    out->contention_checks = cfg->conductor.contention_checks;
    return 0;
}

int sh_policy_create(const struct sh_policy_params *params, struct sh_policy **out)
{
    if (!params || !out)
        return SH_EINVAL;
    *out = NULL;
    int rc = check_params(params);
    if (rc)
        return rc;
    struct sh_policy *p = calloc(1, sizeof *p);
    if (!p)
        return SH_ENOMEM;
    p->prm = *params;
    struct sh_policy_params rp = *params;
    if (rp.kind == SH_POLICY_BELADY)
        rp.conductor_enabled = 0; /* the oracle runs unconstrained */
    if ((rc = sh_policy_rules_create(&rp, &p->rules)) || (rc = pol_table_resize(p, 64))) {
        sh_policy_destroy(p);
        return rc;
    }
    p->active = -1;
    p->align_rec = -1;
    p->phase = SH_PHASE_STEP_BEGIN;
    *out = p;
    return 0;
}

static void recording_free(struct recording *rc)
{
    free(rc->kernel);
    free(rc->loff);
    free(rc->lkey);
    free(rc->keys);
    free(rc->uses);
    free(rc->aoff);
    free(rc->akey);
    free(rc->arec);
    free(rc->foff);
    free(rc->fkey);
    sh_map_free(&rc->ids);
    sh_map_free(&rc->pos);
}

void sh_policy_destroy(struct sh_policy *p)
{
    if (!p)
        return;
    sh_policy_rules_destroy(p->rules);
    free(p->tab);
    free(p->spare);
    free(p->anchor_ids);
    free(p->anchor_bytes);
    free(p->seen);
    free(p->rec.kernel);
    free(p->rec.loff);
    free(p->rec.lref);
    free(p->rec.allocs);
    free(p->rec.frees);
    for (int i = 0; i < MAX_RECORDINGS; i++)
        recording_free(&p->recs[i]);
    free(p->cur_pos);
    free(p->prev_pos);
    sh_map_free(&p->posidx);
    pol_future_free(&p->fut);
    free(p->vic);
    free(p->dset);
    free(p->wanted);
    free(p->dedup);
    free(p->dreg);
    free(p->scratch);
    free(p);
}

/* ---------------------------------------------------------------------- */
/* events */

int sh_policy_alloc(struct sh_policy *p, uint64_t t_us, uint64_t id, uint64_t bytes,
                    uint64_t stream)
{
    (void)t_us;
    (void)stream;
    if (!p || bytes == 0)
        return SH_EINVAL;
    if (find(p, id))
        return SH_EINVAL;
    p->version++;
    struct rec *rr = &p->rec;
    if (RESERVE(rr->allocs, rr->cap_allocs, rr->na + 1))
        return SH_ENOMEM;
    struct region *r = pol_table_insert(p, id);
    if (!r)
        return SH_ENOMEM;
    r->bytes = bytes;
    r->gpos = p->glaunches;
    r->aseq = p->gallocs++;
    r->last_use = p->glaunches;
    r->alloc_step = p->step;
    r->use_step = p->step;
    r->ridx = NONE32;
    pol_keys_stale(p, r);
    pol_set_res(p, r, SH_RES_DEVICE);
    r->cls = SH_CLASS_UNKNOWN;
    pol_future_alloc(p, r);
    pol_account_class(p, r, +1);
    struct rec_alloc *a = &rr->allocs[rr->na++];
    a->who.id = id;
    a->who.aseq = r->aseq;
    a->who.gpos = r->gpos;
    a->who.ridx = NONE32;
    a->bytes = bytes;
    a->pos = p->pos;
    return 0;
}

int sh_policy_free(struct sh_policy *p, uint64_t t_us, uint64_t id)
{
    (void)t_us;
    if (!p)
        return SH_EINVAL;
    p->version++;
    struct region *r = find(p, id);
    if (!r || r->freed)
        return SH_ENOTFOUND;
    struct rec *rr = &p->rec;
    if (RESERVE(rr->frees, rr->cap_frees, rr->nf + 1))
        return SH_ENOMEM;
    struct rec_free *f = &rr->frees[rr->nf++];
    pol_ident_of(r, &f->who);
    f->pos = p->pos;
    pol_account_class(p, r, -1);
    if (r->cls != SH_CLASS_PERSISTENT) {
        r->cls = r->alloc_step == p->step ? SH_CLASS_TRANSIENT : SH_CLASS_PERSISTENT;
        if (r->cls == SH_CLASS_TRANSIENT)
            p->st.transient++;
    }
    r->freed = 1;
    if (r->res == SH_RES_HOST)
        pol_table_delete(p, r);
    return 0;
}

int sh_policy_forget(struct sh_policy *p, uint64_t id)
{
    if (!p)
        return SH_EINVAL;
    struct region *r = find(p, id);
    if (!r)
        return SH_ENOTFOUND;
    pol_table_delete(p, r);
    return 0;
}

static int explicit_boundary(struct sh_policy *p)
{
    p->marked_steps = 1;
    if (p->pos == 0)
        return 0; /* nothing since the last boundary */
    return pol_boundary(p);
}

int sh_policy_step(struct sh_policy *p, uint64_t t_us)
{
    (void)t_us;
    if (!p)
        return SH_EINVAL;
    return explicit_boundary(p);
}

int sh_policy_phase(struct sh_policy *p, uint64_t t_us, int phase)
{
    (void)t_us;
    if (!p || phase < SH_PHASE_STEP_BEGIN || phase > SH_PHASE_STEP_END)
        return SH_EINVAL;
    if (phase == SH_PHASE_STEP_BEGIN)
        return explicit_boundary(p);
    p->marked_phases = 1;
    pol_set_phase(p, phase);
    return 0;
}

int sh_policy_residency(struct sh_policy *p, uint64_t id, int residency)
{
    if (!p || residency < SH_RES_DEVICE || residency > SH_RES_TO_DEVICE)
        return SH_EINVAL;
    p->version++;
    struct region *r = find(p, id);
    if (!r)
        return SH_ENOTFOUND;
    if (r->res == SH_RES_TO_HOST)
        p->pending_d2h -= r->bytes;
    pol_set_res(p, r, residency);
    if (residency == SH_RES_TO_HOST)
        p->pending_d2h += r->bytes;
    if (r->freed && residency == SH_RES_HOST)
        pol_table_delete(p, r);
    return 0;
}

int sh_policy_kept(struct sh_policy *p, uint64_t id, int kept)
{
    if (!p)
        return SH_EINVAL;
    struct region *r = find(p, id);
    if (!r)
        return SH_ENOTFOUND;
    if (r->kept != !!kept && kind_is(p, SH_POLICY_LEARNED))
        p->version++; /* only learned's order reads it */
    r->kept = !!kept;
    return 0;
}

int sh_policy_pinned(struct sh_policy *p, uint64_t id)
{
    if (!p)
        return SH_EINVAL;
    struct region *r = find(p, id);
    if (!r)
        return SH_ENOTFOUND;
    p->version += !r->pinned;
    r->pinned = 1;
    return 0;
}

void sh_policy_slots(struct sh_policy *p, int h2d_busy, int d2h_busy)
{
    if (!p)
        return;
    sh_policy_rules_slots(p->rules, h2d_busy, d2h_busy);
    p->told_h2d = h2d_busy;
    p->told_d2h = d2h_busy;
    p->told |= 2;
}

void sh_policy_pressure(struct sh_policy *p, uint64_t device_bytes)
{
    if (!p)
        return;
    sh_policy_rules_pressure(p->rules, device_bytes);
    p->told_bytes = device_bytes;
    p->told |= 1;
}

void sh_policy_stall(struct sh_policy *p, uint64_t t_us, uint64_t id, uint64_t wait_us)
{
    (void)t_us;
    (void)id;
    if (!p)
        return;
    p->st.stalls++;
    p->st.stall_us += wait_us;
    sh_policy_rules_stall(p->rules);
}

/* ---------------------------------------------------------------------- */
/* what it knows */

void sh_policy_hints(const struct sh_policy *p, struct sh_policy_hints *out)
{
    if (p && out)
        sh_policy_rules_hints(p->rules, out);
}

uint64_t sh_policy_hints_gen(const struct sh_policy *p)
{
    return p ? sh_policy_rules_gen(p->rules) : 0;
}

void sh_policy_stats(const struct sh_policy *p, struct sh_policy_stats *out)
{
    if (!p || !out)
        return;
    *out = p->st;
    out->step = p->step;
    out->phase = p->phase;
    out->trace_ready = p->any_recording;
    out->following = following(p);
    out->diverged = p->any_recording && !following(p);
    out->marked = p->marked_steps;
    out->launches_this_step = p->pos;
    out->recordings = 0;
    for (int i = 0; i < MAX_RECORDINGS; i++)
        out->recordings += p->recs[i].used ? 1 : 0;
    out->regions = p->live;
}

void sh_policy_where(const struct sh_policy *p, int64_t *step, int *phase)
{
    *step = p->step;
    *phase = p->phase;
}

int sh_policy_class(const struct sh_policy *p, uint64_t id)
{
    if (!p)
        return SH_EINVAL;
    const struct region *r = find(p, id);
    if (!r)
        return SH_ENOTFOUND;
    return r->cls;
}

int sh_policy_next_use(struct sh_policy *p, uint64_t id, uint64_t *launches)
{
    if (!p || !launches)
        return SH_EINVAL;
    struct region *r = find(p, id);
    if (!r)
        return SH_ENOTFOUND;
    uint64_t d = pol_distance(p, r);
    *launches = d == DEAD ? FAR : d;
    return 0;
}
