/* record.c — every step recorded: the launches, allocations and frees of
 * the step being recorded, recordings built from finished steps, step
 * boundaries (marked, or found from an anchor launch or a repeated one),
 * phases, and matching each launch against the recordings kept.
 *
 * Not thread-safe: the caller serialises every call (the library's lock).
 */
#include "policy/policy_int.h"

#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------- */
/* building a recording from the step just finished */

static int rec_key(struct sh_policy *p, struct recording *rc, const struct ident *w, uint32_t *out)
{
    uint32_t k;
    int rc2 = sh_map_add(&rc->ids, w->aseq, rc->nkeys, &k);
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
    key->aseq = w->aseq;
    key->relpos = (int64_t)w->gpos - (int64_t)p->step_start;
    key->ridx = w->ridx;
    key->free_pos = NONE32;
    key->memo[0].version = key->memo[1].version = UINT64_MAX;
    key->positional = w->ridx < RIDX_LIMIT && w->gpos >= p->prev_start &&
                      key->relpos > -POS_LIMIT && key->relpos < POS_LIMIT;
    const struct region *r = find(p, w->id);
    key->bytes = r && r->aseq == w->aseq ? r->bytes : 0;
    if (key->positional) {
        uint32_t got;
        if (sh_map_add(&rc->pos, pos_key(key->relpos, key->ridx), k, &got))
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
    if (pol_reserve((void **)off, cap_off, (size_t)nl + 2, sizeof **off) ||
        pol_reserve((void **)val, cap_val, n ? n : 1, sizeof **val))
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
        uint32_t u = pol_key_uses(rc, k)[key->nuse - 1];
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
    sh_map_clear(&rc->ids);
    sh_map_clear(&rc->pos);
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
    rc->built = ++p->rec_builds;
    return 0;
}

/* ---------------------------------------------------------------------- */
/* the step being recorded */

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
        if (reg && reg->aseq == a->who.aseq) {
            reg->ridx = a->who.ridx;
            pol_keys_stale(p, reg); /* its identity just changed */
        }
        if (RESERVE(p->cur_pos, p->cap_cur_pos, p->ncur_pos + 1))
            return SH_ENOMEM;
        struct posent *e = &p->cur_pos[p->ncur_pos];
        e->gpos = a->who.gpos;
        e->ridx = a->who.ridx;
        e->id = a->who.id;
        e->aseq = a->who.aseq;
        uint32_t got;
        if (e->ridx < RIDX_LIMIT &&
            sh_map_add(&p->posidx, pos_key((int64_t)e->gpos - POS_LIMIT, e->ridx),
                       (uint32_t)p->ncur_pos, &got))
            return SH_ENOMEM;
        p->ncur_pos++;
    }
    if (n)
        p->version++; /* the regions playing positional keys changed */
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
    sh_map_reset(&p->posidx, p->nprev_pos);
    for (size_t i = 0; i < p->nprev_pos; i++) {
        const struct posent *e = &p->prev_pos[i];
        uint32_t got;
        if (e->ridx < RIDX_LIMIT &&
            sh_map_add(&p->posidx, pos_key((int64_t)e->gpos - POS_LIMIT, e->ridx),
                       (uint32_t)i | 0x80000000u, &got))
            return SH_ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* steps */

void pol_set_phase(struct sh_policy *p, int phase)
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

/* Following a recording that a complete step has confirmed, or within the
 * part of it that an earlier step ran too: a first training step that
 * creates the optimizer's state departs from the next one only there, and
 * what both ran is as certain as a confirmed step. */
static int confident(const struct sh_policy *p)
{
    if (!following(p))
        return 0;
    const struct recording *rc = &p->recs[p->active];
    return rc->hits > 0 || p->pos < rc->agreed;
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
        struct region *r = live_incarnation(p, p->cur_pos[i].id, p->cur_pos[i].aseq);
        if (r && r->alloc_step == p->step && r->cls != SH_CLASS_PERSISTENT) {
            pol_account_class(p, r, -1);
            r->cls = SH_CLASS_PERSISTENT;
            pol_account_class(p, r, +1);
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
            struct recording *rc = slot_for_new(p);
            err = build_recording(p, rc);
            if (err)
                return err;
            rc->agreed = p->agreed;
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
    p->agreed = 0;
    p->align_rec = -1;
    p->step_mixed = 0;
    p->st.step_bytes = 0;
    rec_reset(&p->rec);
    p->phase = SH_PHASE_STEP_BEGIN;
    start_candidates(p);
    sh_policy_rules_step(p->rules, confident(p));
    return 0;
}

int pol_boundary(struct sh_policy *p)
{
    int err = end_step(p);
    return err ? err : begin_step(p);
}

/* ---------------------------------------------------------------------- */
/* step detection without marks */

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
#define MIN_PERIOD 4 /* launches: shorter loops are not training steps */

static uint64_t signature(uint64_t kernel, const uint64_t *ids, size_t n)
{
    uint64_t h = kernel * 0x9e3779b97f4a7c15ull + n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ids[i]) * 0xff51afd7ed558ccdull;
    return h | 1; /* 0 marks an empty slot */
}

/* The signature's last position before this one (NONE32: none), which
 * becomes this one. */
static uint32_t last_seen(struct sh_policy *p, uint64_t sig)
{
    for (uint32_t i = (uint32_t)sig & (SEEN_SLOTS - 1);; i = (i + 1) & (SEEN_SLOTS - 1)) {
        if (p->seen[i].sig == sig || !p->seen[i].sig) {
            uint32_t was = p->seen[i].sig ? p->seen[i].pos : NONE32;
            p->seen[i].sig = sig;
            p->seen[i].pos = p->pos;
            return was;
        }
    }
}

/* Recorded launches a and b of this step: same kernel, same regions. */
static int same_launch(const struct rec *r, uint32_t a, uint32_t b)
{
    uint32_t n = r->loff[a + 1] - r->loff[a];
    if (r->kernel[a] != r->kernel[b] || n != r->loff[b + 1] - r->loff[b])
        return 0;
    for (uint32_t j = 0; j < n; j++)
        if (r->lref[r->loff[a] + j].aseq != r->lref[r->loff[b] + j].aseq)
            return 0;
    return 1;
}

/* The launch being made is recorded launch a again. */
static int is_again(const struct sh_policy *p, uint64_t kernel, size_t n, uint32_t a)
{
    const struct rec *r = &p->rec;
    if (r->kernel[a] != kernel || r->loff[a + 1] - r->loff[a] != n)
        return 0;
    for (size_t j = 0; j < n; j++)
        if (r->lref[r->loff[a] + j].aseq != p->dreg[j]->aseq)
            return 0;
    return 1;
}

/* Warm-up work before a loop (initialising weights, say) never recurs, so
 * the seed's rule would never end step 0. Until a boundary is found, a
 * launch that repeats its last occurrence exactly (same kernel, same
 * regions), `period` launches ago, when those launches repeated the period
 * before them exactly too (two whole periods alike), marks the loop: step
 * 0 ends there, and that launch becomes the anchor. One launch
 * repeating proves nothing: a chunked multi-tensor op repeats one launch
 * back to back, a kernel reading only a constant (a causal mask) repeats
 * once per layer, and a real model's step, whose activations are new each
 * time, is found by the anchor instead. Returns 1 when it moved the
 * anchor. */
static int repeat_found(struct sh_policy *p, uint64_t kernel, const uint64_t *ids, size_t n)
{
    if (p->found_loop || n == 0 || p->pos >= SEEN_SLOTS / 2)
        return 0; /* a launch touching no region says nothing about the loop */
    if (!p->seen && !(p->seen = calloc(SEEN_SLOTS, sizeof *p->seen)))
        return 0;
    uint32_t prev = last_seen(p, signature(kernel, ids, n));
    if (prev == NONE32)
        return 0;
    uint32_t period = p->pos - prev;
    if (period < MIN_PERIOD || p->pos < 2 * period || !is_again(p, kernel, n, prev))
        return 0;
    for (uint32_t i = p->pos - period; i < p->pos; i++)
        if (!same_launch(&p->rec, i - period, i))
            return 0;
    return set_anchor(p, kernel, ids, n) == 0;
}

/* ---------------------------------------------------------------------- */
/* a launch: matching, recording, phases */

/* ---- what the step before ran too, once no recording agrees ----
 * A first training step that creates the optimizer's state (AdamW's
 * zeros_like for every parameter) runs the next step's launches with a
 * block of its own among them. The next step departs from its recording
 * there, and would be confirmed only up to that point; but if it goes on
 * to run what the recording ran after the block, in order, every one of its
 * launches was run twice. So after the departure, one block of the
 * recording may be skipped, and the launches that follow it in order count
 * as agreed too. */

/* Launch p->pos plays launch q of rc, allowing for the shift that the
 * skipped block gives the positions of what was allocated after the
 * departure: a region allocated since then in this step may play any role
 * the recording gives a region allocated since then in its step. */
static int plays_launch(struct sh_policy *p, const struct recording *rc, uint32_t q,
                        uint64_t kernel, size_t n)
{
    if (q >= rc->nl || rc->kernel[q] != kernel || rc->loff[q + 1] - rc->loff[q] != n)
        return 0;
    for (size_t j = 0; j < n; j++) {
        const struct region *r = p->dreg[j];
        const struct rkey *want = &rc->keys[rc->lkey[rc->loff[q] + j]];
        int moved = r->gpos > p->step_start + p->align_from && want->positional &&
                    want->relpos > (int64_t)p->align_from;
        if (!moved && pol_key_in(p, rc, r) != rc->lkey[rc->loff[q] + j])
            return 0;
    }
    return 1;
}

/* Follows the recording the step departed from (p->align_rec) in order,
 * past one skipped block at most; p->agreed counts the launches it ran. */
static void align_launch(struct sh_policy *p, uint64_t kernel, size_t n)
{
    if (p->align_rec < 0 || p->agreed != p->pos)
        return;
    const struct recording *rc = &p->recs[p->align_rec];
    uint32_t q = p->align_q;
    if (!plays_launch(p, rc, q, kernel, n)) {
        if (p->align_skipped) {
            p->align_rec = -1;
            return;
        }
        p->align_skipped = 1;
        while (++q < rc->nl && !plays_launch(p, rc, q, kernel, n))
            ;
        if (q >= rc->nl) {
            p->align_rec = -1;
            return;
        }
    }
    p->align_q = q + 1;
    p->agreed = p->pos + 1;
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
            ok = pol_key_in_rec(p, p->cand[c], p->dreg[j]) == rc->lkey[rc->loff[p->pos] + j];
        if (ok)
            p->cand[kept++] = p->cand[c];
    }
    p->ncand = kept;
    p->active = kept ? p->cand[0] : -1;
    if (kept) {
        p->agreed = p->pos + 1;
    } else { /* departed here: what follows may still be what it ran */
        p->align_rec = old_active;
        p->align_q = p->align_from = p->pos;
        p->align_skipped = 0;
        align_launch(p, kernel, n);
    }
    if (p->active != old_active) {
        p->key_gen++;
        sh_policy_rules_confident(p->rules, confident(p));
    } else if (following(p) && p->pos == p->recs[p->active].agreed) {
        sh_policy_rules_confident(p->rules, confident(p)); /* past what was seen twice */
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
        pol_ident_of(p->dreg[j], &r->lref[r->nr++]);
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
        pol_set_phase(p, p->pos < rc->bwd_start   ? SH_PHASE_FORWARD
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
    pol_set_phase(p, phase);
}

/* ---------------------------------------------------------------------- */
/* the launch event: in this file, so that the steps above inline into it */

/* find() for the ids launches name: a training step names the same few
 * regions launch after launch. tab and cap: p's, read once by the caller
 * (the stores it makes could alias them). */
static struct region *find_recent(struct sh_policy *p, struct region *tab, size_t cap, uint64_t id)
{
    uint32_t *c = &p->recent[(id * 0x9e3779b97f4a7c15ull) >> (64 - RECENT_BITS)];
    if (*c < cap && tab[*c].state == 1 && tab[*c].id == id)
        return &tab[*c];
    struct region *r = find(p, id);
    if (r)
        *c = (uint32_t)(r - tab);
    return r;
}

/* Known ids of one launch, each once, in order (into p->dedup), and their
 * regions (p->dreg): the launch's steps read them from there, not the table
 * (nothing inserts or deletes regions during a launch). */
static int dedup_refs(struct sh_policy *p, const uint64_t *ids, size_t n, size_t *out)
{
    if (RESERVE(p->dedup, p->cap_dedup, n ? n : 1) || RESERVE(p->dreg, p->cap_dreg, n ? n : 1))
        return SH_ENOMEM;
    struct region *tab = p->tab, **dreg = p->dreg;
    uint64_t *dedup = p->dedup, mark = p->glaunches + 1;
    size_t cap = p->cap, m = 0;
    for (size_t i = 0; i < n; i++) {
        struct region *r = find_recent(p, tab, cap, ids[i]);
        if (!r || r->freed) {
            p->st.unknown_refs++;
            continue;
        }
        if (r->seen == mark)
            continue;
        r->seen = mark;
        dreg[m] = r;
        dedup[m++] = ids[i];
    }
    *out = m;
    return 0;
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
    /* only allocations since the last launch have positions to close */
    if (p->rec.na != p->rec.open_from && (err = close_position(p)))
        return err;
    if (!p->marked_steps) {
        if (!p->have_anchor && (err = set_anchor(p, kernel, ids, n)))
            return err;
        if (p->have_anchor && p->pos > 0 && !p->step_mixed)
            p->step_mixed = more_than_init(p, kernel, ids, n);
        int moved = repeat_found(p, kernel, ids, n);
        if (p->pos > 0 && (moved || is_anchor(p, kernel, ids, n))) {
            if ((err = pol_boundary(p)))
                return err;
            p->found_loop = 1;
            free(p->seen);
            p->seen = NULL;
        }
    }
    if (p->ncand)
        match_launch(p, kernel, n);
    else
        align_launch(p, kernel, n);
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
