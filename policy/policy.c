/* policy.c — the scheduler: region table, step detection and recording,
 * next-use prediction, victims, prefetch and exchange planning.
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
#include "policy/policy.h"

#include "config/config.h"
#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

#define NONE32         UINT32_MAX
#define FAR            UINT64_MAX
#define MAX_RECORDINGS 4
#define POS_LIMIT      ((int64_t)1 << 39) /* positional identities are |relpos| below this */
#define RIDX_LIMIT     ((uint32_t)1 << 23)

typedef unsigned __int128 u128;

/* ---------------------------------------------------------------------- */
/* u64 -> u32 map without deletion (recordings, future), cleared per build */

struct u64map {
    uint64_t *k;
    uint32_t *v; /* NONE32 = empty */
    size_t cap, n;
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static void map_clear(struct u64map *m)
{
    for (size_t i = 0; i < m->cap; i++)
        m->v[i] = NONE32;
    m->n = 0;
}

static void map_free(struct u64map *m)
{
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof *m);
}

/* Empties m for about `want` keys. Clearing costs the capacity, so a map
 * that one large step grew (a model's initialisation) shrinks back rather
 * than costing every later step its size. */
static void map_reset(struct u64map *m, size_t want)
{
    if (m->cap > 64 && m->cap > 8 * want)
        map_free(m); /* map_put allocates again on first use */
    else
        map_clear(m);
}

static uint32_t map_get(const struct u64map *m, uint64_t key)
{
    if (!m->cap)
        return NONE32;
    size_t mask = m->cap - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
        if (m->v[i] == NONE32)
            return NONE32;
        if (m->k[i] == key)
            return m->v[i];
    }
}

static int map_rehash(struct u64map *m, size_t cap)
{
    struct u64map n = {.cap = cap};
    n.k = malloc(cap * sizeof *n.k);
    n.v = malloc(cap * sizeof *n.v);
    if (!n.k || !n.v) {
        map_free(&n);
        return SH_ENOMEM;
    }
    map_clear(&n);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->v[i] == NONE32)
            continue;
        size_t j = mix(m->k[i]) & (cap - 1);
        while (n.v[j] != NONE32)
            j = (j + 1) & (cap - 1);
        n.k[j] = m->k[i];
        n.v[j] = m->v[i];
        n.n++;
    }
    map_free(m);
    *m = n;
    return 0;
}

/* Inserts key -> v unless key is present; returns the value in the map. */
static int map_put(struct u64map *m, uint64_t key, uint32_t v, uint32_t *out)
{
    if ((m->n + 1) * 4 > m->cap * 3 && map_rehash(m, m->cap ? m->cap * 2 : 64))
        return SH_ENOMEM;
    size_t mask = m->cap - 1, i = mix(key) & mask;
    while (m->v[i] != NONE32) {
        if (m->k[i] == key) {
            *out = m->v[i];
            return 0;
        }
        i = (i + 1) & mask;
    }
    m->k[i] = key;
    m->v[i] = v;
    m->n++;
    *out = v;
    return 0;
}

/* Grows *arr to hold need elements (doubling); no-op when it does. */
static int reserve(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 4 / elem)
            return SH_ENOMEM;
        c *= 2;
    }
    void *n = realloc(*arr, c * elem);
    if (!n)
        return SH_ENOMEM;
    *arr = n;
    *cap = c;
    return 0;
}
#define RESERVE(arr, cap, need) reserve((void **)&(arr), &(cap), (need), sizeof *(arr))

static uint64_t pos_key(int64_t relpos, uint32_t ridx)
{
    return ((uint64_t)(relpos + POS_LIMIT) << 23) | ridx;
}

/* ---------------------------------------------------------------------- */
/* regions */

struct region {
    uint64_t id;
    uint64_t bytes;
    uint64_t gpos;                    /* launches seen (all steps) when it was allocated */
    uint64_t aseq;                    /* allocation number (all steps) */
    uint64_t last_use;                /* launches seen at its last reference: LRU order */
    uint64_t seen;                    /* 1 + number of the launch that last referenced it */
    uint64_t mark;                    /* plan/victim stamp: needed or chosen in this pass */
    uint64_t vmark;                   /* plan stamp: chosen as a victim in this pass */
    uint64_t prot;                    /* protect stamp */
    int64_t alloc_step;               /* step that allocated it */
    int64_t use_step;                 /* step that `uses` counts */
    uint32_t uses;                    /* references in use_step */
    uint32_t ridx;                    /* allocations after it at its position; NONE32 until known */
    uint32_t key, key_gen;            /* its key in the active recording, and when found */
    uint32_t fut_off, fut_n, fut_cur; /* belady: its future uses */
    uint8_t state;                    /* table slot: 0 empty, 1 live, 2 deleted */
    uint8_t res;
    uint8_t cls;
    uint8_t freed;
};

/* An identity as recorded: id, allocation position, reverse index. */
struct ident {
    uint64_t id;
    uint64_t gpos;
    uint32_t ridx;
};

/* ---------------------------------------------------------------------- */
/* recordings */

struct rkey {
    uint64_t id;
    int64_t relpos; /* allocation position relative to the step's start */
    uint32_t ridx;
    uint32_t positional; /* allocated in this step or the one before */
    uint64_t bytes;
    uint32_t use_off, nuse;
    uint32_t free_pos; /* NONE32: not freed within the step */
    uint32_t seen;     /* scratch while building */
};

struct recording {
    int used;
    uint64_t hits;  /* complete steps that followed it */
    uint64_t stamp; /* larger = used more recently */
    uint32_t nl;    /* launches */
    uint64_t *kernel;
    uint32_t *loff, *lkey; /* launch i references lkey[loff[i]..loff[i+1]) */
    struct rkey *keys;
    uint32_t nkeys;
    uint32_t *uses;                /* by key: launch positions, ascending */
    uint32_t *aoff, *akey;         /* allocations at position q (before launch q), q = 0..nl */
    uint32_t *arec;                /* of those, how many (first) are freed within the step */
    uint32_t *foff, *fkey;         /* frees at position q */
    uint32_t bwd_start, opt_start; /* detected phases: launch positions */
    struct u64map ids, pos;
    size_t cap_kernel, cap_loff, cap_lkey, cap_keys, cap_uses, cap_aoff, cap_akey, cap_arec,
        cap_foff, cap_fkey;
};

/* The step being recorded. */
struct rec_alloc {
    struct ident who;
    uint64_t bytes;
    uint32_t pos;
};
struct rec_free {
    struct ident who;
    uint32_t pos;
};
struct rec {
    uint64_t *kernel;
    uint32_t *loff;
    struct ident *lref;
    struct rec_alloc *allocs;
    struct rec_free *frees;
    size_t nl, nr, na, nf;
    size_t cap_kernel, cap_loff, cap_lref, cap_allocs, cap_frees;
    size_t open_from; /* allocs[open_from..na) still wait for their ridx */
};

/* Allocation positions of the current and previous step, to find the region
 * playing a recorded role. */
struct posent {
    uint64_t gpos;
    uint32_t ridx;
    uint64_t id;
};

/* ---------------------------------------------------------------------- */
/* the future (belady) */

struct future {
    int set;
    uint64_t nl;
    uint64_t *loff, *lids;     /* launch refs (deduplicated) */
    uint64_t *aoff, *abytes;   /* allocation bytes before launch q */
    uint64_t *foff, *fids;     /* frees before launch q */
    uint64_t *use_pos;         /* per id, grouped */
    struct u64map uses;        /* id -> index into use_off/use_n */
    uint32_t *use_off, *use_n; /* per index */
};

/* ---------------------------------------------------------------------- */

struct victim {
    uint32_t slot;
    uint32_t group; /* 0 freed, 1 outside the window, 2 inside it */
    u128 score;     /* larger goes first */
};

struct sh_policy {
    struct sh_policy_params prm;
    struct sh_policy_rules *rules;

    struct region *tab;
    size_t cap, live, used; /* used counts deleted slots too */
    struct region *spare;   /* the last table, reused when the size stays */
    size_t spare_cap;

    /* clocks */
    uint64_t glaunches; /* launches seen */
    uint64_t gallocs;
    uint64_t stamp;
    int64_t step;
    uint64_t step_start, prev_start; /* glaunches at this step's and the last one's start */
    uint32_t pos;                    /* launches in this step */
    int phase, marked_steps, marked_phases;
    uint32_t key_gen;

    /* step detection */
    int have_anchor;
    uint64_t anchor_kernel;
    uint64_t *anchor_ids, *anchor_bytes;
    uint64_t anchor_allocs; /* allocations made before the first launch */
    size_t anchor_n;
    uint64_t *seen; /* signatures of step 0's launches, until its end is found */
    int step_mixed; /* this step ran another kernel than the anchor's, or used a
                       region older than the anchor: more than an init loop */
    int found_loop; /* a boundary has been detected */

    /* recording and matching */
    struct rec rec;
    struct recording recs[MAX_RECORDINGS];
    int cand[MAX_RECORDINGS];
    int ncand;
    int active; /* recording followed, -1 for none */
    int any_recording;
    uint64_t rec_stamp;

    struct posent *cur_pos, *prev_pos;
    size_t ncur_pos, nprev_pos, cap_cur_pos, cap_prev_pos;
    struct u64map posidx; /* pos_key(gpos, ridx) -> index: bit 31 = previous list */

    struct future fut;

    /* a plan that found nothing to do, and what it saw (plan_skip) */
    uint64_t version; /* bumped by every event that can change a plan */
    uint64_t idle_until;
    struct plan_sig {
        uint64_t version, device_bytes;
        uint32_t key_gen;
        int active;
        size_t fetch_max, evict_max;
        struct sh_policy_hints h;
    } idle_sig;

    /* accounting */
    uint64_t pending_d2h; /* bytes of regions whose eviction is in flight */
    struct sh_policy_stats st;

    /* scratch */
    struct victim *vic;
    size_t cap_vic;
    uint64_t *dedup;
    size_t cap_dedup;
    struct region **dreg; /* the regions of dedup */
    size_t cap_dreg;
    uint32_t *scratch; /* building a recording */
    size_t cap_scratch;
};

/* ---------------------------------------------------------------------- */
/* region table (open addressing, tombstones) */

static struct region *find(const struct sh_policy *p, uint64_t id)
{
    if (!p->cap)
        return NULL;
    size_t mask = p->cap - 1;
    for (size_t i = mix(id) & mask;; i = (i + 1) & mask) {
        const struct region *r = &p->tab[i];
        if (r->state == 0)
            return NULL;
        if (r->state == 1 && r->id == id)
            return (struct region *)r;
    }
}

/* Rehashing to the same size (clearing deleted slots, as regions come and
 * go every step) reuses the previous table: no allocation in steady state. */
static int table_resize(struct sh_policy *p, size_t cap)
{
    struct region *n;
    if (p->spare && p->spare_cap == cap) {
        n = p->spare;
        memset(n, 0, cap * sizeof *n);
        p->spare = NULL;
    } else {
        n = calloc(cap, sizeof *n);
    }
    if (!n)
        return SH_ENOMEM;
    if (RESERVE(p->vic, p->cap_vic, cap)) {
        free(n);
        return SH_ENOMEM;
    }
    for (size_t i = 0; i < p->cap; i++) {
        if (p->tab[i].state != 1)
            continue;
        size_t j = mix(p->tab[i].id) & (cap - 1);
        while (n[j].state)
            j = (j + 1) & (cap - 1);
        n[j] = p->tab[i];
    }
    free(p->spare);
    p->spare = p->tab;
    p->spare_cap = p->cap;
    p->tab = n;
    p->cap = cap;
    p->used = p->live;
    return 0;
}

static struct region *table_insert(struct sh_policy *p, uint64_t id)
{
    if ((p->used + 1) * 4 > p->cap * 3) {
        size_t cap = p->cap ? p->cap : 64;
        while ((p->live + 1) * 2 > cap)
            cap *= 2;
        if (table_resize(p, cap))
            return NULL;
    }
    size_t mask = p->cap - 1, i = mix(id) & mask;
    while (p->tab[i].state == 1)
        i = (i + 1) & mask;
    if (p->tab[i].state == 0)
        p->used++;
    p->live++;
    struct region *r = &p->tab[i];
    memset(r, 0, sizeof *r);
    r->state = 1;
    r->id = id;
    return r;
}

static void account_class(struct sh_policy *p, const struct region *r, int sign);

static void table_delete(struct sh_policy *p, struct region *r)
{
    account_class(p, r, -1);
    if (r->res == SH_RES_TO_HOST)
        p->pending_d2h -= r->bytes;
    r->state = 2;
    p->live--;
}

/* Live persistent regions and bytes allocated this step, kept as counters. */
static void account_class(struct sh_policy *p, const struct region *r, int sign)
{
    if (r->freed)
        return;
    if (r->cls == SH_CLASS_PERSISTENT) {
        p->st.persistent += (uint64_t)(int64_t)sign;
        p->st.persistent_bytes += (uint64_t)((int64_t)sign * (int64_t)r->bytes);
    } else if (r->alloc_step == p->step) {
        p->st.step_bytes += (uint64_t)((int64_t)sign * (int64_t)r->bytes);
    }
}

static uint32_t uses_now(const struct sh_policy *p, const struct region *r)
{
    return r->use_step == p->step ? r->uses : 0;
}

/* ---------------------------------------------------------------------- */
/* identities: region <-> recorded key */

static int kind_is(const struct sh_policy *p, int kind)
{
    return p->prm.kind == kind;
}

static int positional_region(const struct sh_policy *p, const struct region *r)
{
    return r->ridx != NONE32 && r->ridx < RIDX_LIMIT && r->gpos >= p->prev_start;
}

/* The key a region plays in recording rc; NONE32 when it plays none. */
static uint32_t key_in(const struct sh_policy *p, const struct recording *rc,
                       const struct region *r)
{
    if (positional_region(p, r)) {
        int64_t rel = (int64_t)(r->gpos - p->step_start);
        if (rel > -POS_LIMIT && rel < POS_LIMIT) {
            uint32_t k = map_get(&rc->pos, pos_key(rel, r->ridx));
            if (k != NONE32)
                return k;
        }
    }
    return map_get(&rc->ids, r->id);
}

/* Cached for the active recording. */
static uint32_t key_of(struct sh_policy *p, struct region *r)
{
    if (p->active < 0)
        return NONE32;
    if (r->key_gen != p->key_gen) {
        r->key = key_in(p, &p->recs[p->active], r);
        r->key_gen = p->key_gen;
    }
    return r->key;
}

static struct region *live_region(const struct sh_policy *p, uint64_t id)
{
    struct region *r = find(p, id);
    return r && !r->freed ? r : NULL;
}

/* The region allocated at (gpos, ridx) in this step or the last one. */
static struct region *region_at(const struct sh_policy *p, uint64_t gpos, uint32_t ridx)
{
    uint32_t v = map_get(&p->posidx, pos_key((int64_t)gpos - POS_LIMIT, ridx));
    if (v == NONE32)
        return NULL;
    const struct posent *e = (v & 0x80000000u) ? &p->prev_pos[v & 0x7fffffffu] : &p->cur_pos[v];
    return e->gpos == gpos && e->ridx == ridx ? live_region(p, e->id) : NULL;
}

/* The live region that plays key k, `shift` launches after this step's
 * start (0: this step, the recording's length: the next one). */
static struct region *region_for(const struct sh_policy *p, const struct recording *rc, uint32_t k,
                                 uint64_t shift)
{
    const struct rkey *key = &rc->keys[k];
    if (key->positional) {
        int64_t g = (int64_t)(p->step_start + shift) + key->relpos;
        if (g >= 0 && !(shift && key->relpos >= 0)) { /* not allocated yet */
            struct region *r = region_at(p, (uint64_t)g, key->ridx);
            if (r)
                return r;
        }
    }
    return live_region(p, key->id);
}

/* ---------------------------------------------------------------------- */
/* next use */

static const uint32_t *key_uses(const struct recording *rc, uint32_t k)
{
    return rc->uses + rc->keys[k].use_off;
}

/* Position (in launches from this step's start) at which key k is used
 * next, given c uses so far; FAR when never. */
static uint64_t key_next(const struct recording *rc, uint32_t k, uint32_t c, uint32_t pos)
{
    const struct rkey *key = &rc->keys[k];
    const uint32_t *u = key_uses(rc, k);
    while (c < key->nuse && u[c] < pos)
        c++;
    if (c < key->nuse)
        return u[c];
    if (key->free_pos != NONE32)
        return FAR;
    /* Alive at the end: its role in the next step. */
    uint32_t k2 = NONE32;
    if (key->positional && key->relpos - (int64_t)rc->nl > -POS_LIMIT)
        k2 = map_get(&rc->pos, pos_key(key->relpos - (int64_t)rc->nl, key->ridx));
    if (k2 == NONE32)
        k2 = k;
    return rc->keys[k2].nuse ? (uint64_t)rc->nl + key_uses(rc, k2)[0] : FAR;
}

static int following(const struct sh_policy *p)
{
    return p->active >= 0;
}

/* Launches from now to the region's next use; FAR when unknown. */
static uint64_t distance(struct sh_policy *p, struct region *r)
{
    if (kind_is(p, SH_POLICY_BELADY)) {
        if (!p->fut.set || r->fut_cur >= r->fut_n)
            return FAR;
        uint64_t at = p->fut.use_pos[r->fut_off + r->fut_cur];
        return at >= p->glaunches ? at - p->glaunches : 0;
    }
    if (!following(p))
        return FAR;
    uint32_t k = key_of(p, r);
    if (k == NONE32)
        return FAR;
    uint64_t at = key_next(&p->recs[p->active], k, uses_now(p, r), p->pos);
    return at == FAR ? FAR : at - p->pos;
}

/* Whether next uses are known now (a matching recording, or the future). */
static int predicting(const struct sh_policy *p)
{
    if (kind_is(p, SH_POLICY_BELADY))
        return p->fut.set;
    if (kind_is(p, SH_POLICY_REACTIVE))
        return 0;
    return following(p);
}

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
    if ((rc = sh_policy_rules_create(&rp, &p->rules)) || (rc = table_resize(p, 64))) {
        sh_policy_destroy(p);
        return rc;
    }
    p->active = -1;
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
    map_free(&rc->ids);
    map_free(&rc->pos);
}

static void future_free(struct future *f)
{
    free(f->loff);
    free(f->lids);
    free(f->aoff);
    free(f->abytes);
    free(f->foff);
    free(f->fids);
    free(f->use_pos);
    free(f->use_off);
    free(f->use_n);
    map_free(&f->uses);
    memset(f, 0, sizeof *f);
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
    map_free(&p->posidx);
    future_free(&p->fut);
    free(p->vic);
    free(p->dedup);
    free(p->dreg);
    free(p->scratch);
    free(p);
}

/* ---------------------------------------------------------------------- */
/* building a recording from the step just finished */

static int rec_key(struct sh_policy *p, struct recording *rc, const struct ident *w, uint32_t *out)
{
    uint32_t k;
    int rc2 = map_put(&rc->ids, w->id, rc->nkeys, &k);
    if (rc2)
        return rc2;
    *out = k;
    if (k != rc->nkeys)
        return 0;
    if (RESERVE(rc->keys, rc->cap_keys, rc->nkeys + 1))
        return SH_ENOMEM;
    struct rkey *key = &rc->keys[rc->nkeys++];
    memset(key, 0, sizeof *key);
    key->id = w->id;
    key->relpos = (int64_t)w->gpos - (int64_t)p->step_start;
    key->ridx = w->ridx;
    key->free_pos = NONE32;
    key->positional = w->ridx < RIDX_LIMIT && w->gpos >= p->prev_start &&
                      key->relpos > -POS_LIMIT && key->relpos < POS_LIMIT;
    const struct region *r = find(p, w->id);
    key->bytes = r ? r->bytes : 0;
    if (key->positional) {
        uint32_t got;
        if (map_put(&rc->pos, pos_key(key->relpos, key->ridx), k, &got))
            return SH_ENOMEM;
        if (got != k)
            key->positional = 0; /* two regions claim one position: trust ids */
    }
    return 0;
}

/* Groups items by position q = 0..nl into CSR arrays off[]/val[]. */
static int by_position(uint32_t nl, size_t n, const uint32_t *posv, const uint32_t *keyv,
                       uint32_t **off, size_t *cap_off, uint32_t **val, size_t *cap_val)
{
    if (reserve((void **)off, cap_off, (size_t)nl + 2, sizeof **off) ||
        reserve((void **)val, cap_val, n ? n : 1, sizeof **val))
        return SH_ENOMEM;
    memset(*off, 0, ((size_t)nl + 2) * sizeof **off);
    for (size_t i = 0; i < n; i++)
        (*off)[posv[i] + 1]++;
    for (uint32_t q = 0; q <= nl; q++)
        (*off)[q + 1] += (*off)[q];
    for (size_t i = 0; i < n; i++)
        (*val)[(*off)[posv[i]]++] = keyv[i];
    for (uint32_t q = nl + 1; q > 0; q--)
        (*off)[q] = (*off)[q - 1];
    (*off)[0] = 0;
    return 0;
}

/* Forward ends at the first launch that references again a region that
 * existed when the step began; the optimizer starts after the last use of
 * the transients allocated during forward. */
static void detect_phases(struct recording *rc)
{
    rc->bwd_start = rc->opt_start = rc->nl;
    for (uint32_t k = 0; k < rc->nkeys; k++)
        rc->keys[k].seen = 0;
    for (uint32_t i = 0; i < rc->nl && rc->bwd_start == rc->nl; i++) {
        for (uint32_t j = rc->loff[i]; j < rc->loff[i + 1]; j++) {
            struct rkey *key = &rc->keys[rc->lkey[j]];
            if (key->relpos > 0)
                continue;
            if (key->seen) {
                rc->bwd_start = i;
                break;
            }
            key->seen = 1;
        }
    }
    if (rc->bwd_start == rc->nl)
        return;
    uint32_t last = 0;
    for (uint32_t k = 0; k < rc->nkeys; k++) {
        const struct rkey *key = &rc->keys[k];
        if (key->free_pos == NONE32 || key->relpos < 0 || key->relpos > (int64_t)rc->bwd_start ||
            !key->nuse)
            continue;
        uint32_t u = key_uses(rc, k)[key->nuse - 1];
        if (u + 1 > last)
            last = u + 1;
    }
    rc->opt_start = last > rc->bwd_start ? last : rc->bwd_start;
}

/* Puts first, at each position, the allocations the step also freed: only
 * those recur in the next step, and the walk ahead reads just them there
 * (a model's initial allocations, made once, are many). */
static int order_recurring(struct recording *rc)
{
    if (RESERVE(rc->arec, rc->cap_arec, (size_t)rc->nl + 1))
        return SH_ENOMEM;
    for (uint32_t q = 0; q <= rc->nl; q++) {
        uint32_t lo = rc->aoff[q], hi = rc->aoff[q + 1], k = lo;
        for (uint32_t j = lo; j < hi; j++) {
            if (rc->keys[rc->akey[j]].free_pos == NONE32)
                continue;
            uint32_t t = rc->akey[k];
            rc->akey[k++] = rc->akey[j];
            rc->akey[j] = t;
        }
        rc->arec[q] = k - lo;
    }
    return 0;
}

static int build_uses(struct recording *rc, const uint32_t *lpos)
{
    size_t nr = rc->loff[rc->nl];
    if (RESERVE(rc->uses, rc->cap_uses, nr ? nr : 1))
        return SH_ENOMEM;
    for (uint32_t k = 0; k < rc->nkeys; k++)
        rc->keys[k].nuse = 0;
    for (size_t j = 0; j < nr; j++)
        rc->keys[rc->lkey[j]].nuse++;
    uint32_t off = 0;
    for (uint32_t k = 0; k < rc->nkeys; k++) {
        rc->keys[k].use_off = off;
        off += rc->keys[k].nuse;
        rc->keys[k].nuse = 0;
    }
    for (size_t j = 0; j < nr; j++) {
        struct rkey *key = &rc->keys[rc->lkey[j]];
        rc->uses[key->use_off + key->nuse++] = lpos[j];
    }
    return 0;
}

static int build_recording(struct sh_policy *p, struct recording *rc)
{
    struct rec *r = &p->rec;
    rc->used = 0;
    rc->nl = (uint32_t)r->nl;
    rc->nkeys = 0;
    map_clear(&rc->ids);
    map_clear(&rc->pos);
    size_t nr = r->nr;
    /* scratch: launch position of each reference, then alloc/free positions */
    if (RESERVE(p->scratch, p->cap_scratch, nr + 2 * (r->na + r->nf) + 1) ||
        RESERVE(rc->kernel, rc->cap_kernel, r->nl + 1) ||
        RESERVE(rc->loff, rc->cap_loff, r->nl + 1) || RESERVE(rc->lkey, rc->cap_lkey, nr + 1))
        return SH_ENOMEM;
    uint32_t *tmp = p->scratch;
    memcpy(rc->kernel, r->kernel, r->nl * sizeof *r->kernel);
    memcpy(rc->loff, r->loff, (r->nl + 1) * sizeof *r->loff);
    int err = 0;
    for (size_t i = 0; i < r->na && !err; i++) {
        uint32_t k;
        err = rec_key(p, rc, &r->allocs[i].who, &k);
        if (!err)
            rc->keys[k].bytes = r->allocs[i].bytes;
    }
    for (size_t i = 0; i < r->nl && !err; i++) {
        for (uint32_t j = r->loff[i]; j < r->loff[i + 1] && !err; j++) {
            err = rec_key(p, rc, &r->lref[j], &rc->lkey[j]);
            tmp[j] = (uint32_t)i;
        }
    }
    uint32_t *apos = tmp + nr, *akey = apos + r->na, *fpos = akey + r->na, *fkey = fpos + r->nf;
    for (size_t i = 0; i < r->na && !err; i++) {
        apos[i] = r->allocs[i].pos;
        err = rec_key(p, rc, &r->allocs[i].who, &akey[i]);
    }
    for (size_t i = 0; i < r->nf && !err; i++) {
        fpos[i] = r->frees[i].pos;
        err = rec_key(p, rc, &r->frees[i].who, &fkey[i]);
        if (!err)
            rc->keys[fkey[i]].free_pos = fpos[i];
    }
    if (!err)
        err = build_uses(rc, tmp);
    if (!err)
        err = by_position(rc->nl, r->na, apos, akey, &rc->aoff, &rc->cap_aoff, &rc->akey,
                          &rc->cap_akey);
    if (!err)
        err = order_recurring(rc);
    if (!err)
        err = by_position(rc->nl, r->nf, fpos, fkey, &rc->foff, &rc->cap_foff, &rc->fkey,
                          &rc->cap_fkey);
    if (err)
        return err;
    detect_phases(rc);
    rc->used = 1;
    rc->hits = 0;
    rc->stamp = ++p->rec_stamp;
    return 0;
}

/* ---------------------------------------------------------------------- */
/* the step being recorded */

static void ident_of(const struct region *r, struct ident *w)
{
    w->id = r->id;
    w->gpos = r->gpos;
    w->ridx = r->ridx;
}

/* Allocations since the last launch now know how many followed them at
 * their position: that count is their stable identity. */
static int close_position(struct sh_policy *p)
{
    struct rec *r = &p->rec;
    size_t n = r->na - r->open_from;
    for (size_t i = r->open_from; i < r->na; i++) {
        struct rec_alloc *a = &r->allocs[i];
        a->who.ridx = (uint32_t)(n - 1 - (i - r->open_from));
        struct region *reg = find(p, a->who.id);
        if (reg) {
            reg->ridx = a->who.ridx;
            reg->key_gen = p->key_gen - 1; /* its identity just changed */
        }
        if (RESERVE(p->cur_pos, p->cap_cur_pos, p->ncur_pos + 1))
            return SH_ENOMEM;
        struct posent *e = &p->cur_pos[p->ncur_pos];
        e->gpos = a->who.gpos;
        e->ridx = a->who.ridx;
        e->id = a->who.id;
        uint32_t got;
        if (e->ridx < RIDX_LIMIT &&
            map_put(&p->posidx, pos_key((int64_t)e->gpos - POS_LIMIT, e->ridx),
                    (uint32_t)p->ncur_pos, &got))
            return SH_ENOMEM;
        p->ncur_pos++;
    }
    r->open_from = r->na;
    return 0;
}

static void rec_reset(struct rec *r)
{
    r->nl = r->nr = r->na = r->nf = 0;
    r->open_from = 0;
    if (r->cap_loff)
        r->loff[0] = 0;
}

/* The previous step's positions become the old list; the index keeps both. */
static int rotate_positions(struct sh_policy *p)
{
    struct posent *t = p->prev_pos;
    size_t tc = p->cap_prev_pos;
    p->prev_pos = p->cur_pos;
    p->cap_prev_pos = p->cap_cur_pos;
    p->nprev_pos = p->ncur_pos;
    p->cur_pos = t;
    p->cap_cur_pos = tc;
    p->ncur_pos = 0;
    map_reset(&p->posidx, p->nprev_pos);
    for (size_t i = 0; i < p->nprev_pos; i++) {
        const struct posent *e = &p->prev_pos[i];
        uint32_t got;
        if (e->ridx < RIDX_LIMIT &&
            map_put(&p->posidx, pos_key((int64_t)e->gpos - POS_LIMIT, e->ridx),
                    (uint32_t)i | 0x80000000u, &got))
            return SH_ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* steps */

static void set_phase(struct sh_policy *p, int phase)
{
    if (phase == p->phase)
        return;
    p->phase = phase;
    sh_policy_rules_phase(p->rules, phase);
}

static void start_candidates(struct sh_policy *p)
{
    p->ncand = 0;
    for (int i = 0; i < MAX_RECORDINGS; i++)
        if (p->recs[i].used)
            p->cand[p->ncand++] = i;
    /* most recently confirmed first */
    for (int i = 1; i < p->ncand; i++)
        for (int j = i; j > 0 && p->recs[p->cand[j]].stamp > p->recs[p->cand[j - 1]].stamp; j--) {
            int t = p->cand[j];
            p->cand[j] = p->cand[j - 1];
            p->cand[j - 1] = t;
        }
    p->active = p->ncand ? p->cand[0] : -1;
    p->key_gen++;
}

/* Following a recording that a complete step has confirmed. */
static int confident(const struct sh_policy *p)
{
    return following(p) && p->recs[p->active].hits > 0;
}

static struct recording *slot_for_new(struct sh_policy *p)
{
    struct recording *best = NULL;
    for (int i = 0; i < MAX_RECORDINGS; i++) {
        struct recording *rc = &p->recs[i];
        if (!rc->used)
            return rc;
        if (!best || rc->stamp < best->stamp)
            best = rc;
    }
    return best;
}

/* Regions allocated this step and still live now cross a boundary. */
static void promote_survivors(struct sh_policy *p)
{
    for (size_t i = 0; i < p->ncur_pos; i++) {
        struct region *r = live_region(p, p->cur_pos[i].id);
        if (r && r->alloc_step == p->step && r->cls != SH_CLASS_PERSISTENT) {
            account_class(p, r, -1);
            r->cls = SH_CLASS_PERSISTENT;
            account_class(p, r, +1);
        }
    }
    /* regions allocated before any launch of this step are not in cur_pos
     * until closed; close_position() ran before, so the list is complete */
}

static int end_step(struct sh_policy *p)
{
    int err = close_position(p);
    if (err)
        return err;
    /* the step matched a recording when one agreed to its very end (an
     * evaluation step may be a prefix of the training step followed) */
    int matched = 0;
    for (int c = 0; c < p->ncand && !matched; c++) {
        if (p->recs[p->cand[c]].nl == p->pos) {
            p->active = p->cand[c];
            matched = 1;
        }
    }
    if (matched) {
        p->recs[p->active].stamp = ++p->rec_stamp;
        p->recs[p->active].hits++;
        p->st.steps_matched++;
    } else {
        p->st.steps_diverged++;
        if (p->rec.nl) {
            err = build_recording(p, slot_for_new(p));
            if (err)
                return err;
            p->any_recording = 1;
        }
    }
    promote_survivors(p);
    return 0;
}

static int begin_step(struct sh_policy *p)
{
    int err = rotate_positions(p);
    if (err)
        return err;
    p->step++;
    p->prev_start = p->step_start;
    p->step_start = p->glaunches;
    p->pos = 0;
    p->step_mixed = 0;
    p->st.step_bytes = 0;
    rec_reset(&p->rec);
    p->phase = SH_PHASE_STEP_BEGIN;
    start_candidates(p);
    sh_policy_rules_step(p->rules, confident(p));
    return 0;
}

static int boundary(struct sh_policy *p)
{
    int err = end_step(p);
    return err ? err : begin_step(p);
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
    struct region *r = table_insert(p, id);
    if (!r)
        return SH_ENOMEM;
    r->bytes = bytes;
    r->gpos = p->glaunches;
    r->aseq = p->gallocs++;
    r->last_use = p->glaunches;
    r->alloc_step = p->step;
    r->use_step = p->step;
    r->ridx = NONE32;
    r->key_gen = p->key_gen - 1;
    r->res = SH_RES_DEVICE;
    r->cls = SH_CLASS_UNKNOWN;
    if (p->fut.set) {
        uint32_t i = map_get(&p->fut.uses, id);
        if (i != NONE32) {
            r->fut_off = p->fut.use_off[i];
            r->fut_n = p->fut.use_n[i];
        }
    }
    account_class(p, r, +1);
    struct rec_alloc *a = &rr->allocs[rr->na++];
    a->who.id = id;
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
    ident_of(r, &f->who);
    f->pos = p->pos;
    account_class(p, r, -1);
    if (r->cls != SH_CLASS_PERSISTENT) {
        r->cls = r->alloc_step == p->step ? SH_CLASS_TRANSIENT : SH_CLASS_PERSISTENT;
        if (r->cls == SH_CLASS_TRANSIENT)
            p->st.transient++;
    }
    r->freed = 1;
    if (r->res == SH_RES_HOST)
        table_delete(p, r);
    return 0;
}

int sh_policy_forget(struct sh_policy *p, uint64_t id)
{
    if (!p)
        return SH_EINVAL;
    struct region *r = find(p, id);
    if (!r)
        return SH_ENOTFOUND;
    table_delete(p, r);
    return 0;
}

/* The seed's rule: the first launch recurring ends a step. It recurs when
 * the kernel is the same and each region is the same one, or one of the
 * same size allocated after that first launch (the next batch). */
static int is_anchor(const struct sh_policy *p, uint64_t kernel, const uint64_t *ids, size_t n)
{
    if (!p->have_anchor || kernel != p->anchor_kernel || n != p->anchor_n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == p->anchor_ids[i])
            continue;
        /* A new region of the same size is the next batch only if a whole
         * step ran in between: a loop that allocates and initialises
         * weights one by one repeats one kernel on fresh regions too. */
        const struct region *r = p->dreg[i];
        if (!p->step_mixed || !r || r->bytes != p->anchor_bytes[i] || r->aseq < p->anchor_allocs)
            return 0;
    }
    return 1;
}

/* A launch after the anchor that an init loop would not make: another
 * kernel, or one reading a region older than the anchor (not its own). */
static int more_than_init(const struct sh_policy *p, uint64_t kernel, const uint64_t *ids, size_t n)
{
    if (kernel != p->anchor_kernel)
        return 1;
    for (size_t i = 0; i < n; i++) {
        int own = 0;
        for (size_t k = 0; k < p->anchor_n && !own; k++)
            own = ids[i] == p->anchor_ids[k];
        if (!own && p->dreg[i]->aseq < p->anchor_allocs)
            return 1;
    }
    return 0;
}

static int set_anchor(struct sh_policy *p, uint64_t kernel, const uint64_t *ids, size_t n)
{
    size_t nb = (n ? n : 1) * sizeof(uint64_t);
    free(p->anchor_ids); /* a retry after running out of memory */
    free(p->anchor_bytes);
    p->anchor_ids = malloc(nb);
    p->anchor_bytes = malloc(nb);
    if (!p->anchor_ids || !p->anchor_bytes)
        return SH_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        p->anchor_ids[i] = ids[i];
        p->anchor_bytes[i] = p->dreg[i]->bytes;
    }
    p->anchor_allocs = p->gallocs;
    p->anchor_kernel = kernel;
    p->anchor_n = n;
    p->have_anchor = 1;
    return 0;
}

#define SEEN_SLOTS (1u << 16)

static uint64_t signature(uint64_t kernel, const uint64_t *ids, size_t n)
{
    uint64_t h = kernel * 0x9e3779b97f4a7c15ull + n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ids[i]) * 0xff51afd7ed558ccdull;
    return h | 1; /* 0 marks an empty slot */
}

/* Warm-up work before a loop (initialising weights, say) never recurs, so
 * the seed's rule would never end step 0. Until a boundary is found, a
 * launch that exactly repeats an earlier one (same kernel, same regions)
 * marks the loop: step 0 ends there and that launch becomes the anchor.
 * Returns 1 when it moved the anchor. */
static int repeat_found(struct sh_policy *p, uint64_t kernel, const uint64_t *ids, size_t n)
{
    if (p->found_loop || n == 0 || p->pos >= SEEN_SLOTS / 2)
        return 0; /* a launch touching no region says nothing about the loop */
    if (!p->seen && !(p->seen = calloc(SEEN_SLOTS, sizeof *p->seen)))
        return 0;
    uint64_t sig = signature(kernel, ids, n);
    for (uint32_t i = (uint32_t)sig & (SEEN_SLOTS - 1);; i = (i + 1) & (SEEN_SLOTS - 1)) {
        if (p->seen[i] == sig)
            return set_anchor(p, kernel, ids, n) == 0;
        if (!p->seen[i]) {
            p->seen[i] = sig;
            return 0;
        }
    }
}

/* Known ids of one launch, each once, in order (into p->dedup), and their
 * regions (p->dreg): the launch's steps read them from there, not the table
 * (nothing inserts or deletes regions during a launch). */
static int dedup_refs(struct sh_policy *p, const uint64_t *ids, size_t n, size_t *out)
{
    if (RESERVE(p->dedup, p->cap_dedup, n ? n : 1) || RESERVE(p->dreg, p->cap_dreg, n ? n : 1))
        return SH_ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct region *r = find(p, ids[i]);
        if (!r || r->freed) {
            p->st.unknown_refs++;
            continue;
        }
        if (r->seen == p->glaunches + 1)
            continue;
        r->seen = p->glaunches + 1;
        p->dreg[m] = r;
        p->dedup[m++] = ids[i];
    }
    *out = m;
    return 0;
}

/* Keeps the recordings that agree with launch number p->pos. */
static void match_launch(struct sh_policy *p, uint64_t kernel, size_t n)
{
    int kept = 0, old_active = p->active;
    for (int c = 0; c < p->ncand; c++) {
        const struct recording *rc = &p->recs[p->cand[c]];
        int ok = p->pos < rc->nl && rc->kernel[p->pos] == kernel &&
                 rc->loff[p->pos + 1] - rc->loff[p->pos] == n;
        for (size_t j = 0; ok && j < n; j++)
            ok = key_in(p, rc, p->dreg[j]) == rc->lkey[rc->loff[p->pos] + j];
        if (ok)
            p->cand[kept++] = p->cand[c];
    }
    p->ncand = kept;
    p->active = kept ? p->cand[0] : -1;
    if (p->active != old_active) {
        p->key_gen++;
        sh_policy_rules_confident(p->rules, confident(p));
    }
}

static int record_launch(struct sh_policy *p, uint64_t kernel, size_t n)
{
    struct rec *r = &p->rec;
    if (RESERVE(r->kernel, r->cap_kernel, r->nl + 1) || RESERVE(r->loff, r->cap_loff, r->nl + 2) ||
        RESERVE(r->lref, r->cap_lref, r->nr + n))
        return SH_ENOMEM;
    if (r->nl == 0)
        r->loff[0] = 0;
    r->kernel[r->nl] = kernel;
    for (size_t j = 0; j < n; j++)
        ident_of(p->dreg[j], &r->lref[r->nr++]);
    r->loff[++r->nl] = (uint32_t)r->nr;
    return 0;
}

/* Phases without marks: from the recording followed, else forward until a
 * region that existed when the step began is referenced a second time. */
static void auto_phase(struct sh_policy *p, size_t n)
{
    if (p->marked_phases)
        return;
    if (following(p)) {
        const struct recording *rc = &p->recs[p->active];
        set_phase(p, p->pos < rc->bwd_start   ? SH_PHASE_FORWARD
                     : p->pos < rc->opt_start ? SH_PHASE_BACKWARD
                                              : SH_PHASE_OPTIMIZER);
        return;
    }
    int phase = p->phase == SH_PHASE_STEP_BEGIN ? SH_PHASE_FORWARD : p->phase;
    for (size_t i = 0; i < n && phase == SH_PHASE_FORWARD; i++) {
        const struct region *r = p->dreg[i];
        if (r->gpos <= p->step_start && uses_now(p, r) > 0)
            phase = SH_PHASE_BACKWARD;
    }
    set_phase(p, phase);
}

int sh_policy_launch(struct sh_policy *p, uint64_t t_us, uint64_t kernel, uint64_t stream,
                     const uint64_t *ids_in, size_t n_in)
{
    (void)t_us;
    (void)stream;
    if (!p || (n_in && !ids_in))
        return SH_EINVAL;
    size_t n;
    int err = dedup_refs(p, ids_in, n_in, &n);
    if (err)
        return err;
    const uint64_t *ids = p->dedup;
    if ((err = close_position(p)))
        return err;
    if (!p->marked_steps) {
        if (!p->have_anchor && (err = set_anchor(p, kernel, ids, n)))
            return err;
        if (p->have_anchor && p->pos > 0 && !p->step_mixed)
            p->step_mixed = more_than_init(p, kernel, ids, n);
        int moved = repeat_found(p, kernel, ids, n);
        if (p->pos > 0 && (moved || is_anchor(p, kernel, ids, n))) {
            if ((err = boundary(p)))
                return err;
            p->found_loop = 1;
            free(p->seen);
            p->seen = NULL;
        }
    }
    if (p->ncand)
        match_launch(p, kernel, n);
    auto_phase(p, n);
    if ((err = record_launch(p, kernel, n)))
        return err;
    for (size_t i = 0; i < n; i++) {
        struct region *r = p->dreg[i];
        if (r->use_step != p->step) {
            r->use_step = p->step;
            r->uses = 0;
        }
        r->uses++;
        r->last_use = p->glaunches;
        if (r->fut_cur < r->fut_n)
            r->fut_cur++;
    }
    p->pos++;
    p->glaunches++;
    p->st.launches++;
    return 0;
}

static int explicit_boundary(struct sh_policy *p)
{
    p->marked_steps = 1;
    if (p->pos == 0)
        return 0; /* nothing since the last boundary */
    return boundary(p);
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
    set_phase(p, phase);
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
    r->res = (uint8_t)residency;
    if (residency == SH_RES_TO_HOST)
        p->pending_d2h += r->bytes;
    if (r->freed && residency == SH_RES_HOST)
        table_delete(p, r);
    return 0;
}

void sh_policy_slots(struct sh_policy *p, int h2d_busy, int d2h_busy)
{
    if (p)
        sh_policy_rules_slots(p->rules, h2d_busy, d2h_busy);
}

void sh_policy_pressure(struct sh_policy *p, uint64_t device_bytes)
{
    if (p)
        sh_policy_rules_pressure(p->rules, device_bytes);
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

/* The victim order of the kind, for a region outside the window. */
static u128 order_score(struct sh_policy *p, struct region *r, uint64_t dist)
{
    if (kind_is(p, SH_POLICY_BELADY))
        return (u128)dist;
    if (kind_is(p, SH_POLICY_LEARNED) && predicting(p))
        return dist == FAR ? ~(u128)0 : (u128)dist * r->bytes;
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
    return ra->id < rb->id;
}

static int window_of(const struct sh_policy *p)
{
    struct sh_policy_hints h;
    sh_policy_rules_hints(p->rules, &h);
    return h.prefetch_window;
}

/* Candidates: resident, not protected, not chosen in this pass. */
static size_t collect_victims(struct sh_policy *p)
{
    size_t n = 0;
    int pred = predicting(p);
    uint64_t window = (uint64_t)window_of(p);
    for (size_t i = 0; i < p->cap; i++) {
        struct region *r = &p->tab[i];
        if (r->state != 1 || r->res != SH_RES_DEVICE || r->prot == p->stamp || r->mark == p->stamp)
            continue;
        struct victim *v = &p->vic[n++];
        v->slot = (uint32_t)i;
        if (r->freed) {
            v->group = 0;
            v->score = (u128)r->bytes;
            continue;
        }
        uint64_t d = pred ? distance(p, r) : FAR;
        v->group = pred && d < window ? 2 : 1;
        v->score = v->group == 2 ? (u128)d : order_score(p, r, d);
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
    int blocked;     /* a fetch had to wait: keep later ones in order */
    int exchange;    /* this kind evicts ahead of need */
    uint64_t fetch_window;
    size_t fetch_max, evict_max;
    size_t ncand; /* exchange candidates, collected on first need */
    int collected;
    struct sh_policy_plan *plan;
};

/* The best candidate not yet needed by the walk nor chosen; NULL if none.
 * A linear scan: a plan picks few victims, so this beats sorting them all. */
static struct region *best_candidate(struct sh_policy *p, struct walk *w)
{
    const struct victim *best = NULL;
    for (size_t i = 0; i < w->ncand; i++) {
        const struct victim *v = &p->vic[i];
        if (p->tab[v->slot].mark == p->stamp)
            continue; /* needed within the walk, or chosen already */
        if (!best || victim_before(p, v, best))
            best = v;
    }
    return best ? &p->tab[best->slot] : NULL;
}

/* Evicts, best victim first, regions needed later than anything walked so
 * far until deficit bytes are on their way out; 0 when that worked. */
static int make_room(struct sh_policy *p, struct walk *w, int64_t deficit)
{
    struct sh_policy_plan *pl = w->plan;
    if (!w->exchange || pl->nevict >= w->evict_max)
        return -1;
    if (!w->collected) {
        w->ncand = collect_victims(p);
        w->collected = 1;
    }
    while (deficit > 0) {
        struct region *r = best_candidate(p, w);
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
    if (r->mark == p->stamp)
        return 0;
    r->mark = p->stamp;
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
    if (w->proj >= 0)
        return 0;
    return make_room(p, w, -w->proj);
}

static int want_alloc(struct sh_policy *p, struct walk *w, uint64_t bytes)
{
    w->proj -= (int64_t)bytes;
    if (w->proj >= 0)
        return 0;
    return make_room(p, w, -w->proj);
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
    for (uint32_t j = rc->foff[q]; j < rc->foff[q + 1]; j++)
        give_back(p, w, region_for(p, rc, rc->fkey[j], shift));
    /* the launch's regions first: room made for its allocations must not
     * come from what the same launch reads */
    for (uint32_t j = rc->loff[q]; j < rc->loff[q + 1]; j++) {
        struct region *r = region_for(p, rc, rc->lkey[j], shift);
        if (r && want_region(p, w, r, i))
            return -1;
    }
    /* next step allocates again only what this one freed (ordered first) */
    uint32_t end = shift ? rc->aoff[q] + rc->arec[q] : rc->aoff[q + 1];
    for (uint32_t j = rc->aoff[q]; j < end; j++)
        if (want_alloc(p, w, rc->keys[rc->akey[j]].bytes))
            return -1;
    return 0;
}

static int walk_future(struct sh_policy *p, struct walk *w, uint64_t i)
{
    const struct future *f = &p->fut;
    uint64_t q = p->glaunches + i;
    if (q >= f->nl)
        return WALK_END;
    for (uint64_t j = f->foff[q]; j < f->foff[q + 1]; j++)
        give_back(p, w, live_region(p, f->fids[j]));
    for (uint64_t j = f->loff[q]; j < f->loff[q + 1]; j++) {
        struct region *r = live_region(p, f->lids[j]);
        if (r && want_region(p, w, r, i))
            return -1;
    }
    for (uint64_t j = f->aoff[q]; j < f->aoff[q + 1]; j++)
        if (want_alloc(p, w, f->abytes[j]))
            return -1;
    return 0;
}

/* A plan that finds nothing to do over its window and PLAN_STRIDE launches
 * past it stays right for those launches while nothing it read changes:
 * the launches in between skip the walk. */
#define PLAN_STRIDE 8

static void plan_sig(const struct sh_policy *p, uint64_t device_bytes,
                     const struct sh_policy_plan *plan, const struct sh_policy_hints *h,
                     struct plan_sig *out)
{
    memset(out, 0, sizeof *out); /* compared whole, padding included */
    out->version = p->version;
    out->device_bytes = device_bytes;
    out->key_gen = p->key_gen;
    out->active = p->active;
    out->fetch_max = plan->fetch_max;
    out->evict_max = plan->evict_max;
    out->h = *h;
}

/* One position of the walk: 0 to go on, WALK_END at the end of what is
 * known, else a stop. */
static int walk_at(struct sh_policy *p, struct walk *w, uint64_t i)
{
    int rc = kind_is(p, SH_POLICY_BELADY) ? walk_future(p, w, i) : walk_recording(p, w, i);
    return rc ? rc : w->blocked && !w->exchange ? -1 : 0;
}

static int found_nothing(const struct walk *w)
{
    return !w->blocked && w->plan->nfetch == 0 && w->plan->nevict == 0;
}

/* After a walk that found nothing: 1 if the next PLAN_STRIDE positions
 * want nothing either (what they would do is dropped: it is not due yet). */
static int idle_ahead(struct sh_policy *p, struct walk *w, uint64_t horizon)
{
    w->fetch_window += PLAN_STRIDE;
    int rc = 0;
    for (uint64_t i = horizon; i < horizon + PLAN_STRIDE && rc == 0 && found_nothing(w); i++)
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
    if (p->glaunches < p->idle_until && !memcmp(&sig, &p->idle_sig, sizeof sig))
        return 0;
    p->idle_until = 0;
    mark_protected(p, protect, np);
    int rc = 0;
    for (uint64_t i = 0; i < horizon && rc == 0; i++)
        rc = walk_at(p, &w, i);
    if ((rc == 0 || rc == WALK_END) && found_nothing(&w) &&
        (rc == WALK_END || idle_ahead(p, &w, horizon))) {
        p->idle_sig = sig;
        p->idle_until = p->glaunches + PLAN_STRIDE;
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

int sh_policy_commit_due(const struct sh_policy *p, size_t nready, int needed)
{
    if (!p || nready == 0)
        return 0;
    return needed || nready >= (size_t)p->prm.batch_max;
}

void sh_policy_hints(const struct sh_policy *p, struct sh_policy_hints *out)
{
    if (p && out)
        sh_policy_rules_hints(p->rules, out);
}

/* ---------------------------------------------------------------------- */
/* what it knows */

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
    *launches = distance(p, r);
    return 0;
}

/* ---------------------------------------------------------------------- */
/* the future, for belady */

static int future_count(struct future *f, const struct sh_policy_future *ev, size_t n, size_t *nids,
                        size_t *na, size_t *nf)
{
    f->nl = 0;
    *nids = *na = *nf = 0;
    for (size_t i = 0; i < n; i++) {
        switch (ev[i].kind) {
        case SH_FUTURE_LAUNCH:
            if (ev[i].n && !ev[i].ids)
                return SH_EINVAL;
            f->nl++;
            *nids += ev[i].n;
            break;
        case SH_FUTURE_ALLOC:
            (*na)++;
            break;
        case SH_FUTURE_FREE:
            (*nf)++;
            break;
        default:
            break;
        }
    }
    return 0;
}

static int future_alloc(struct future *f, size_t nids, size_t na, size_t nf)
{
    size_t nl = (size_t)f->nl;
    f->loff = calloc(nl + 2, sizeof *f->loff);
    f->lids = malloc((nids + 1) * sizeof *f->lids);
    f->aoff = calloc(nl + 2, sizeof *f->aoff);
    f->abytes = malloc((na + 1) * sizeof *f->abytes);
    f->foff = calloc(nl + 2, sizeof *f->foff);
    f->fids = malloc((nf + 1) * sizeof *f->fids);
    f->use_pos = malloc((nids + 1) * sizeof *f->use_pos);
    if (!f->loff || !f->lids || !f->aoff || !f->abytes || !f->foff || !f->fids || !f->use_pos)
        return SH_ENOMEM;
    return 0;
}

/* Fills launches, allocations and frees by position, and per-id use lists. */
static int future_fill(struct future *f, const struct sh_policy_future *ev, size_t n)
{
    uint64_t q = 0, nid = 0, na = 0, nf = 0;
    uint32_t nkeys = 0;
    for (size_t i = 0; i < n; i++) {
        const struct sh_policy_future *e = &ev[i];
        if (e->kind == SH_FUTURE_ALLOC) {
            f->abytes[na++] = e->bytes;
        } else if (e->kind == SH_FUTURE_FREE) {
            f->fids[nf++] = e->id;
        } else if (e->kind == SH_FUTURE_LAUNCH) {
            f->aoff[q + 1] = na;
            f->foff[q + 1] = nf;
            uint64_t start = nid;
            for (size_t j = 0; j < e->n; j++) {
                int dup = 0;
                for (uint64_t k = start; k < nid && !dup; k++)
                    dup = f->lids[k] == e->ids[j];
                if (!dup)
                    f->lids[nid++] = e->ids[j];
            }
            f->loff[++q] = nid;
            f->aoff[q + 1] = na;
            f->foff[q + 1] = nf;
            continue;
        }
        f->aoff[q + 1] = na;
        f->foff[q + 1] = nf;
    }
    /* positions run 0..nl: allocations after the last launch sit at nl */
    for (uint64_t k = 0; k < nid; k++) {
        uint32_t got;
        if (map_put(&f->uses, f->lids[k], nkeys, &got))
            return SH_ENOMEM;
        if (got == nkeys)
            nkeys++;
    }
    f->use_off = calloc((size_t)nkeys + 1, sizeof *f->use_off);
    f->use_n = calloc((size_t)nkeys + 1, sizeof *f->use_n);
    if (!f->use_off || !f->use_n)
        return SH_ENOMEM;
    for (uint64_t k = 0; k < nid; k++)
        f->use_n[map_get(&f->uses, f->lids[k])]++;
    for (uint32_t k = 1; k < nkeys; k++)
        f->use_off[k] = f->use_off[k - 1] + f->use_n[k - 1];
    memset(f->use_n, 0, ((size_t)nkeys + 1) * sizeof *f->use_n);
    for (uint64_t l = 0; l < q; l++)
        for (uint64_t k = f->loff[l]; k < f->loff[l + 1]; k++) {
            uint32_t key = map_get(&f->uses, f->lids[k]);
            f->use_pos[f->use_off[key] + f->use_n[key]++] = l;
        }
    return 0;
}

int sh_policy_set_future(struct sh_policy *p, const struct sh_policy_future *ev, size_t n)
{
    if (p)
        p->version++;
    if (!p || (n && !ev))
        return SH_EINVAL;
    future_free(&p->fut);
    size_t nids, na, nf;
    int err = future_count(&p->fut, ev, n, &nids, &na, &nf);
    if (!err)
        err = future_alloc(&p->fut, nids, na, nf);
    if (!err)
        err = future_fill(&p->fut, ev, n);
    if (err) {
        future_free(&p->fut);
        return err;
    }
    p->fut.set = 1;
    /* regions that exist already */
    for (size_t i = 0; i < p->cap; i++) {
        struct region *r = &p->tab[i];
        if (r->state != 1)
            continue;
        uint32_t k = map_get(&p->fut.uses, r->id);
        r->fut_off = k == NONE32 ? 0 : p->fut.use_off[k];
        r->fut_n = k == NONE32 ? 0 : p->fut.use_n[k];
        r->fut_cur = 0;
    }
    return 0;
}
