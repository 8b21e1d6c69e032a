/* plan.c — the decisions: victims to evict, and the plan of what to
 * prefetch and what to evict ahead of need (exchange), from a walk over the
 * launches the recording followed (or, for belady, the exact future) says
 * come next.
 *
 * Not thread-safe: the caller serialises every call (the library's lock).
 */
#include "policy/policy_int.h"

#include "sh_err.h"

#include <string.h>

/* ---------------------------------------------------------------------- */
/* victims */

static void mark_protected(struct sh_policy *p, const uint64_t *protect, size_t np)
{
    p->stamp++;
    for (size_t i = 0; protect && i < np; i++) {
        struct region *r = find(p, protect[i]);
        if (r)
            r->prot = p->stamp;
    }
}

static u128 lru_score(const struct region *r)
{
    return (u128)(UINT64_MAX - r->last_use);
}

/* Learned: the device memory an eviction frees, in bytes × launches, per
 * copy it costs. A region used again is away until that use and costs a
 * copy out and one back, or only the one back when it keeps a host copy;
 * a region the recording frees before any use is away until its free, which
 * would release it anyway, and costs the copy out. So one freed soon waits
 * for its free, and one freed late goes before one that must come back. */
static u128 learned_score(struct sh_policy *p, struct region *r, uint64_t dist)
{
    if (dist == DEAD) {
        uint64_t span = pol_free_distance(p, r);
        return (u128)(span == FAR ? dist : span) * r->bytes * 2;
    }
    return (u128)dist * r->bytes * (r->kept ? 2 : 1);
}

/* The victim order of the kind, for a region outside the window. */
static u128 order_score(struct sh_policy *p, struct region *r, uint64_t dist)
{
    if (kind_is(p, SH_POLICY_BELADY))
        return (u128)dist;
    if (kind_is(p, SH_POLICY_LEARNED) && predicting(p))
        return learned_score(p, r, dist);
    return lru_score(r);
}

static int victim_before(const struct sh_policy *p, const struct victim *a, const struct victim *b)
{
    if (a->group != b->group)
        return a->group < b->group;
    if (a->score != b->score)
        return a->score > b->score;
    const struct region *ra = &p->tab[a->slot], *rb = &p->tab[b->slot];
    if (ra->bytes != rb->bytes)
        return ra->bytes > rb->bytes;
    return ra->aseq < rb->aseq; /* allocation order: ids may come back */
}

static int window_of(const struct sh_policy *p)
{
    struct sh_policy_hints h;
    sh_policy_rules_hints(p->rules, &h);
    return h.prefetch_window;
}

/* Candidates: resident, not protected, not chosen in this pass. In order:
 * freed regions (no copy), those not needed within the window (by the
 * kind's order), then those needed within it (a copy out and a copy back
 * soon). The other kinds than learned, which weighs what each costs, put
 * after the second group the regions the recording frees before any use. */
enum { VG_FREED, VG_LATER, VG_DEAD, VG_SOON };
static size_t collect_victims(struct sh_policy *p)
{
    size_t n = 0;
    int pred = predicting(p), learned = kind_is(p, SH_POLICY_LEARNED);
    uint64_t window = (uint64_t)window_of(p);
    for (size_t k = 0; k < p->ndset; k++) { /* the live regions on the device */
        uint32_t i = p->dset[k];
        struct region *r = &p->tab[i];
        if (r->prot == p->stamp || r->mark == p->stamp || r->pinned)
            continue;
        struct victim *v = &p->vic[n++];
        v->slot = i;
        if (r->freed) {
            v->group = VG_FREED;
            v->score = (u128)r->bytes;
            continue;
        }
        uint64_t d = pred ? pol_distance(p, r) : FAR;
        v->group = pred && d < window ? VG_SOON : d == DEAD && !learned ? VG_DEAD : VG_LATER;
        v->score = v->group == VG_SOON ? (u128)d : order_score(p, r, d);
    }
    return n;
}

static void sort_victims(struct sh_policy *p, size_t n)
{
    /* insertion sort over a gap sequence: no allocation, deterministic */
    static const size_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        size_t gap = gaps[g];
        for (size_t i = gap; i < n; i++) {
            struct victim t = p->vic[i];
            size_t j = i;
            for (; j >= gap && victim_before(p, &t, &p->vic[j - gap]); j -= gap)
                p->vic[j] = p->vic[j - gap];
            p->vic[j] = t;
        }
    }
}

size_t sh_policy_victims(struct sh_policy *p, uint64_t need, const uint64_t *protect, size_t np,
                         uint64_t *out, size_t max)
{
    if (!p || !out || !max)
        return 0;
    mark_protected(p, protect, np);
    size_t n = collect_victims(p);
    sort_victims(p, n);
    size_t k = 0;
    uint64_t got = 0;
    for (size_t i = 0; i < n && k < max && got < need; i++) {
        const struct region *r = &p->tab[p->vic[i].slot];
        out[k++] = r->id;
        got += r->bytes;
    }
    return k;
}

/* ---------------------------------------------------------------------- */
/* planning: walk the launches ahead */

struct walk {
    uint64_t room;   /* bytes that fit now under the high watermark */
    uint64_t budget; /* bytes that fit now under the budget */
    int64_t proj;    /* room once evictions in flight land, minus what comes */
    /* Given back by frees of allocations the walk made: room for evicting
     * ahead, not for restores, which would bring regions back early only
     * to evict them again (GPT full fine-tune, 2x: 7% slower). */
    int64_t freed;
    int blocked;  /* a fetch had to wait: keep later ones in order */
    int exchange; /* this kind evicts ahead of need */
    uint64_t fetch_window;
    size_t fetch_max, evict_max;
    size_t ncand; /* exchange candidates, collected on first need */
    int collected;
    uint64_t at; /* the position being walked */
    struct sh_policy_plan *plan;
};

/* Launches between a region's last use in a walk and a need its memory
 * meets there: time for a later plan to evict it. */
#define DEFER_LEAD 2

/* The best candidate not yet needed by the walk nor chosen; NULL if none.
 * A linear scan: a plan picks few victims, so this beats sorting them all. */
static const struct victim *best_candidate(struct sh_policy *p, struct walk *w)
{
    const struct victim *best = NULL;
    for (size_t i = 0; i < w->ncand; i++) {
        const struct victim *v = &p->vic[i];
        if (p->tab[v->slot].mark == p->stamp)
            continue; /* needed within the walk, or chosen already */
        if (!best || victim_before(p, v, best))
            best = v;
    }
    return best;
}

/* Counts towards deficit the regions on the device that the walk needs only
 * DEFER_LEAD or more positions before this one: a later plan, past those
 * uses, evicts them (or what it then finds better). Returns what is left.
 * Looks only at what the walk needed (its cost is the walk's, not the
 * number of regions). */
static int64_t defer_room(struct sh_policy *p, struct walk *w, int64_t deficit)
{
    for (size_t k = 0; deficit > 0 && k < p->nwanted; k++) {
        struct region *r = &p->tab[p->wanted[k]];
        if (r->mark != p->stamp || r->vmark == p->stamp || r->prot == p->stamp || r->pinned ||
            r->res != SH_RES_DEVICE || r->wlast + DEFER_LEAD > w->at)
            continue;
        r->vmark = r->dmark = p->stamp; /* counted: its free gives nothing back */
        w->proj += (int64_t)r->bytes;
        deficit -= (int64_t)r->bytes;
    }
    return deficit;
}

/* Evicts, best victim first, regions needed later than anything walked so
 * far until deficit bytes are on their way out; 0 when that worked. When
 * the best victim is needed again soon (a copy out and one back within the
 * window), regions whose uses in the walk end early enough count first
 * instead: evicting now would choose among the regions needed after this
 * position only, where a later plan may choose among those too. */
static int make_room(struct sh_policy *p, struct walk *w, int64_t deficit)
{
    struct sh_policy_plan *pl = w->plan;
    if (!w->exchange || pl->nevict >= w->evict_max)
        return -1;
    if (!w->collected) {
        w->ncand = collect_victims(p);
        w->collected = 1;
    }
    const struct victim *best = best_candidate(p, w);
    if (!best || best->group == VG_SOON)
        deficit = defer_room(p, w, deficit);
    while (deficit > 0) {
        best = best_candidate(p, w);
        struct region *r = best ? &p->tab[best->slot] : NULL;
        if (!r)
            return -1;
        if (pl->nevict >= w->evict_max)
            return -1;
        r->mark = r->vmark = p->stamp;
        pl->evict[pl->nevict++] = r->id;
        w->proj += (int64_t)r->bytes;
        deficit -= (int64_t)r->bytes;
    }
    return 0;
}

/* One region needed at walk position i; 0 to go on, -1 to stop. */
static int want_region(struct sh_policy *p, struct walk *w, struct region *r, uint64_t i)
{
    r->wlast = i;
    if (r->dmark == p->stamp) { /* needed again after all: the room it was to make is not */
        r->dmark = r->vmark = 0;
        w->proj -= (int64_t)r->bytes;
        if (w->proj + w->freed < 0 && make_room(p, w, -(w->proj + w->freed)))
            return -1;
    }
    if (r->mark == p->stamp)
        return 0;
    r->mark = p->stamp;
    if (r->res == SH_RES_DEVICE && RESERVE(p->wanted, p->cap_wanted, p->nwanted + 1) == 0)
        p->wanted[p->nwanted++] = (uint32_t)(r - p->tab); /* else not deferred to: safe */
    if (r->res == SH_RES_DEVICE || r->res == SH_RES_TO_DEVICE)
        return 0;
    int64_t need = (int64_t)r->bytes;
    struct sh_policy_plan *pl = w->plan;
    /* What the next launch needs would be restored on demand a moment
     * later, with the whole budget to use: restoring it now is the same
     * restore, early. Deeper prefetch stays under the high watermark. */
    int fits = i == 0 ? r->bytes <= w->budget : r->bytes <= w->room && w->proj >= need;
    if (r->res == SH_RES_HOST && !w->blocked && i < w->fetch_window && pl->nfetch < w->fetch_max &&
        fits) {
        pl->fetch[pl->nfetch++] = r->id;
        w->room -= r->bytes < w->room ? r->bytes : w->room;
        w->budget -= r->bytes;
        w->proj -= need;
        return 0;
    }
    w->blocked = 1;
    w->proj -= need;
    if (w->proj + w->freed >= 0)
        return 0;
    return make_room(p, w, -(w->proj + w->freed));
}

static int want_alloc(struct sh_policy *p, struct walk *w, uint64_t bytes)
{
    w->proj -= (int64_t)bytes;
    if (w->proj + w->freed >= 0)
        return 0;
    return make_room(p, w, -(w->proj + w->freed));
}

/* A free ahead returns the region's device memory: what it holds now, or
 * what the walk set aside for it; not what an eviction already counted. */
static void give_back(struct sh_policy *p, struct walk *w, struct region *r)
{
    if (!r || r->vmark == p->stamp)
        return;
    int holds = r->res == SH_RES_DEVICE || r->res == SH_RES_TO_DEVICE;
    int reserved = r->mark == p->stamp && r->res != SH_RES_DEVICE && r->res != SH_RES_TO_DEVICE;
    if (holds || reserved)
        w->proj += (int64_t)r->bytes;
}

/* Launch i ahead of now in the recording followed: 0 to go on, WALK_END
 * past what it knows, -1 when room cannot be made. */
#define WALK_END 1

static int walk_recording(struct sh_policy *p, struct walk *w, uint64_t i)
{
    const struct recording *rc = &p->recs[p->active];
    uint64_t q = p->pos + i, shift = 0;
    if (q >= rc->nl) {
        q -= rc->nl;
        shift = rc->nl;
        if (q >= rc->nl)
            return WALK_END;
    }
    uint64_t walked = 2 * p->stamp + (shift != 0);
    for (uint32_t j = rc->foff[q]; j < rc->foff[q + 1]; j++) {
        struct rkey *k = &rc->keys[rc->fkey[j]];
        if (k->walked == walked)
            w->freed += (int64_t)k->bytes; /* allocated ahead in this walk */
        else
            give_back(p, w, pol_region_for(p, rc, rc->fkey[j], shift));
    }
    /* the launch's regions first: room made for its allocations must not
     * come from what the same launch reads */
    for (uint32_t j = rc->loff[q]; j < rc->loff[q + 1]; j++) {
        struct region *r = pol_region_for(p, rc, rc->lkey[j], shift);
        if (r && want_region(p, w, r, i))
            return -1;
    }
    /* next step allocates again only what this one freed (ordered first) */
    uint32_t end = shift ? rc->aoff[q] + rc->arec[q] : rc->aoff[q + 1];
    for (uint32_t j = rc->aoff[q]; j < end; j++) {
        rc->keys[rc->akey[j]].walked = walked;
        if (want_alloc(p, w, rc->keys[rc->akey[j]].bytes))
            return -1;
    }
    return 0;
}

static int walk_future(struct sh_policy *p, struct walk *w, uint64_t i)
{
    const struct future *f = &p->fut;
    uint64_t q = p->glaunches + i;
    if (q >= f->nl)
        return WALK_END;
    for (uint64_t j = f->foff[q]; j < f->foff[q + 1]; j++) {
        uint32_t inc = f->finc[j]; /* the j-th allocation is incarnation j */
        struct region *r = pol_future_region(p, inc);
        if (!r && inc >= f->aoff[p->glaunches] && inc < f->aoff[q + 1])
            w->freed += (int64_t)f->abytes[inc]; /* allocated ahead in this walk */
        else
            give_back(p, w, r);
    }
    for (uint64_t j = f->loff[q]; j < f->loff[q + 1]; j++) {
        struct region *r = pol_future_region(p, f->linc[j]);
        if (r && want_region(p, w, r, i))
            return -1;
    }
    for (uint64_t j = f->aoff[q]; j < f->aoff[q + 1]; j++)
        if (want_alloc(p, w, f->abytes[j]))
            return -1;
    return 0;
}

/* A plan that finds nothing to do over its horizon and as many launches
 * past it stays right for that many launches while nothing it read
 * changes: the launches in between skip the walk. Each position is then
 * walked about twice per horizon, however long the horizon. */
static void plan_sig(const struct sh_policy *p, uint64_t device_bytes,
                     const struct sh_policy_plan *plan, const struct sh_policy_hints *h,
                     struct plan_sig *out)
{
    memset(out, 0, sizeof *out); /* compared whole, padding included */
    out->version = p->version;
    out->device_bytes = device_bytes;
    /* Each boundary moves which regions play positional keys, but only
     * regions allocated in this step or the last can: with none, keys
     * resolve by id, the same step after step. */
    out->key_gen = p->ncur_pos || p->nprev_pos ? p->key_gen : 0;
    out->active = p->active;
    out->built = p->active >= 0 ? p->recs[p->active].built : 0;
    out->fetch_max = plan->fetch_max;
    out->evict_max = plan->evict_max;
    out->h = *h;
}

/* What sh_policy_plan_idle() checks beside the signature, as of a plan
 * found idle. */
static void idle_noted(struct sh_policy *p)
{
    p->idle_h2d = p->told_h2d;
    p->idle_d2h = p->told_d2h;
    p->idle_hgen = sh_policy_rules_gen(p->rules);
}

/* The idle plan's signature still holds, as far as the policy's own state
 * goes (what plan_sig reads but the caller's limits). */
static int idle_holds(const struct sh_policy *p, uint64_t device_bytes, uint64_t hgen)
{
    const struct plan_sig *s = &p->idle_sig;
    return p->glaunches < p->idle_until && s->version == p->version &&
           s->device_bytes == device_bytes &&
           s->key_gen == (p->ncur_pos || p->nprev_pos ? p->key_gen : 0) && s->active == p->active &&
           s->built == (p->active >= 0 ? p->recs[p->active].built : 0) &&
           p->idle_h2d == p->told_h2d && p->idle_d2h == p->told_d2h && p->idle_hgen == hgen;
}

/* One position of the walk: 0 to go on, WALK_END at the end of what is
 * known, else a stop. */
static int walk_at(struct sh_policy *p, struct walk *w, uint64_t i)
{
    w->at = i;
    int rc = kind_is(p, SH_POLICY_BELADY) ? walk_future(p, w, i) : walk_recording(p, w, i);
    return rc ? rc : w->blocked && !w->exchange ? -1 : 0;
}

static int found_nothing(const struct walk *w)
{
    return !w->blocked && w->plan->nfetch == 0 && w->plan->nevict == 0;
}

/* A walk of `walked` positions from now covered every launch of the
 * recording followed: each later position repeats one of them, so while
 * nothing in the plan's signature changes, none will want anything. */
static int covers_cycle(const struct sh_policy *p, uint64_t walked)
{
    return !kind_is(p, SH_POLICY_BELADY) && p->active >= 0 && walked >= p->recs[p->active].nl;
}

/* After a walk that found nothing: 1 if the next horizon positions want
 * nothing either (what they would do is dropped: it is not due yet). */
static int idle_ahead(struct sh_policy *p, struct walk *w, uint64_t horizon)
{
    w->fetch_window += horizon;
    int rc = 0;
    for (uint64_t i = horizon; i < 2 * horizon && rc == 0 && found_nothing(w); i++)
        rc = walk_at(p, w, i);
    int idle = (rc == 0 || rc == WALK_END) && found_nothing(w);
    w->plan->nfetch = w->plan->nevict = 0;
    return idle;
}

int sh_policy_plan(struct sh_policy *p, uint64_t device_bytes, const uint64_t *protect, size_t np,
                   struct sh_policy_plan *plan)
{
    if (!p || !plan || (plan->fetch_max && !plan->fetch) || (plan->evict_max && !plan->evict))
        return SH_EINVAL;
    plan->nfetch = plan->nevict = 0;
    if (!p->prm.prefetch_enabled || !predicting(p))
        return 0;
    struct sh_policy_hints h;
    sh_policy_rules_hints(p->rules, &h);
    uint64_t fw = (uint64_t)h.prefetch_window;
    if (h.suppress_speculative && fw > 1)
        fw = 1;
    struct walk w = {
        .fetch_max = plan->fetch_max < (size_t)h.max_inflight_h2d ? plan->fetch_max
                                                                  : (size_t)h.max_inflight_h2d,
        .evict_max = plan->evict_max < (size_t)h.max_inflight_d2h ? plan->evict_max
                                                                  : (size_t)h.max_inflight_d2h,
        .room = h.high_watermark > device_bytes ? h.high_watermark - device_bytes : 0,
        .budget = p->prm.budget_bytes > device_bytes ? p->prm.budget_bytes - device_bytes : 0,
        .exchange = kind_is(p, SH_POLICY_LEARNED) || kind_is(p, SH_POLICY_BELADY),
        .fetch_window = fw,
        .plan = plan,
    };
    w.proj = (int64_t)(w.room + p->pending_d2h);
    /* Evictions plan over the configured window even when the rules shrink
     * the fetch window: making room early costs no device memory. */
    uint64_t horizon = w.exchange ? (uint64_t)p->prm.prefetch_window : fw;
    if (horizon < fw)
        horizon = fw;
    struct plan_sig sig;
    plan_sig(p, device_bytes, plan, &h, &sig);
    if (p->glaunches < p->idle_until && !memcmp(&sig, &p->idle_sig, sizeof sig)) {
        idle_noted(p); /* idle with these inputs too */
        return 0;
    }
    p->idle_until = 0;
    mark_protected(p, protect, np);
    p->nwanted = 0;
    int rc = 0;
    for (uint64_t i = 0; i < horizon && rc == 0; i++)
        rc = walk_at(p, &w, i);
    if ((rc == 0 || rc == WALK_END) && found_nothing(&w) &&
        (rc == WALK_END || idle_ahead(p, &w, horizon))) {
        p->idle_sig = sig;
        idle_noted(p);
        p->idle_until = p->glaunches + horizon;
        if (rc == WALK_END || covers_cycle(p, 2 * horizon))
            p->idle_until = UINT64_MAX;
    }
    return 0;
}

size_t sh_policy_prefetch(struct sh_policy *p, uint64_t room, uint64_t *out, size_t max)
{
    struct sh_policy_plan plan = {.fetch = out, .fetch_max = max};
    if (!p || !out)
        return 0;
    struct sh_policy_hints h;
    sh_policy_rules_hints(p->rules, &h);
    /* the device use at which the high watermark leaves `room` */
    uint64_t used = room < h.high_watermark ? h.high_watermark - room : 0;
    if (sh_policy_plan(p, used, NULL, 0, &plan))
        return 0;
    return plan.nfetch;
}

int sh_policy_plan_idle(const struct sh_policy *p, uint64_t device_bytes, int h2d_busy,
                        int d2h_busy, size_t nready, uint64_t told)
{
    if (!p || p->told != 3 || p->told_bytes != device_bytes || p->told_h2d != h2d_busy ||
        p->told_d2h != d2h_busy || (nready && sh_policy_commit_due(p, nready, 0)))
        return 0;
    uint64_t hgen = sh_policy_rules_gen(p->rules);
    if (hgen != told)
        return 0;
    if (!p->prm.prefetch_enabled || !predicting(p))
        return 1;
    return idle_holds(p, device_bytes, hgen);
}

int sh_policy_commit_due(const struct sh_policy *p, size_t nready, int needed)
{
    if (!p || nready == 0)
        return 0;
    return needed || nready >= (size_t)p->prm.batch_max;
}
