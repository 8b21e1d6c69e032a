/* predict.c — next-use prediction: which live region plays which key of a
 * recording (by id, or by allocation position for a region allocated anew
 * each step), and how many launches away a region's next use is, from the
 * recording followed or, for belady, from the exact future.
 *
 * Not thread-safe: the caller serialises every call (the library's lock).
 */
#include "policy/policy_int.h"

/* ---------------------------------------------------------------------- */
/* identities: region <-> recorded key */

static int positional_region(const struct sh_policy *p, const struct region *r)
{
    return r->ridx != NONE32 && r->ridx < RIDX_LIMIT && r->gpos >= p->prev_start;
}

/* The key a region plays in recording rc; NONE32 when it plays none. */
uint32_t pol_key_in(const struct sh_policy *p, const struct recording *rc, const struct region *r)
{
    if (positional_region(p, r)) {
        int64_t rel = (int64_t)(r->gpos - p->step_start);
        if (rel > -POS_LIMIT && rel < POS_LIMIT) {
            uint32_t k = sh_map_get(&rc->pos, pos_key(rel, r->ridx));
            if (k != NONE32)
                return k;
        }
    }
    return sh_map_get(&rc->ids, r->aseq);
}

/* The key r plays in the active recording. */
static uint32_t key_of(struct sh_policy *p, struct region *r)
{
    return p->active < 0 ? NONE32 : pol_key_in_rec(p, p->active, r);
}

/* The region allocated at (gpos, ridx) in this step or the last one. */
static struct region *region_at(const struct sh_policy *p, uint64_t gpos, uint32_t ridx)
{
    uint32_t v = sh_map_get(&p->posidx, pos_key((int64_t)gpos - POS_LIMIT, ridx));
    if (v == NONE32)
        return NULL;
    const struct posent *e = (v & 0x80000000u) ? &p->prev_pos[v & 0x7fffffffu] : &p->cur_pos[v];
    return e->gpos == gpos && e->ridx == ridx ? live_incarnation(p, e->id, e->aseq) : NULL;
}

/* The live region that plays key k, `shift` launches after this step's
 * start (0: this step, the recording's length: the next one). */
static struct region *resolve(const struct sh_policy *p, const struct rkey *key, uint64_t shift)
{
    if (key->positional) {
        int64_t g = (int64_t)(p->step_start + shift) + key->relpos;
        if (g >= 0 && !(shift && key->relpos >= 0)) { /* not allocated yet */
            struct region *r = region_at(p, (uint64_t)g, key->ridx);
            if (r)
                return r;
        }
    }
    return live_incarnation(p, key->id, key->aseq);
}

/* Remembered per key and shift until an event changes the version (every
 * allocation, free, residency change and closed position) or the key
 * generation (every boundary, every change of the recording followed). */
struct region *pol_region_for(const struct sh_policy *p, const struct recording *rc, uint32_t k,
                              uint64_t shift)
{
    struct rkey *key = &rc->keys[k];
    int s = shift != 0;
    if (key->memo[s].version == p->version && key->memo[s].key_gen == p->key_gen)
        return key->memo[s].slot == NONE32 ? NULL : &p->tab[key->memo[s].slot];
    struct region *r = resolve(p, key, shift);
    key->memo[s].version = p->version;
    key->memo[s].key_gen = p->key_gen;
    key->memo[s].slot = r ? (uint32_t)(r - p->tab) : NONE32;
    return r;
}

/* ---------------------------------------------------------------------- */
/* next use */

const uint32_t *pol_key_uses(const struct recording *rc, uint32_t k)
{
    return rc->uses + rc->keys[k].use_off;
}

/* Position (in launches from this step's start) at which key k is used
 * next, given c uses so far; DEAD when it is freed first, FAR when never. */
static uint64_t key_next(const struct recording *rc, uint32_t k, uint32_t c, uint32_t pos)
{
    const struct rkey *key = &rc->keys[k];
    const uint32_t *u = pol_key_uses(rc, k);
    while (c < key->nuse && u[c] < pos)
        c++;
    if (c < key->nuse)
        return u[c];
    if (key->free_pos != NONE32)
        return DEAD;
    /* Alive at the end: its role in the next step. */
    uint32_t k2 = NONE32;
    if (key->positional && key->relpos - (int64_t)rc->nl > -POS_LIMIT)
        k2 = sh_map_get(&rc->pos, pos_key(key->relpos - (int64_t)rc->nl, key->ridx));
    if (k2 == NONE32)
        k2 = k;
    return rc->keys[k2].nuse ? (uint64_t)rc->nl + pol_key_uses(rc, k2)[0] : FAR;
}

/* Launches from now to the recording's free of the region's role; FAR when
 * it is not freed this step, or unknown. */
uint64_t pol_free_distance(struct sh_policy *p, struct region *r)
{
    uint32_t k = following(p) ? key_of(p, r) : NONE32;
    if (k == NONE32 || p->recs[p->active].keys[k].free_pos == NONE32)
        return FAR;
    uint32_t at = p->recs[p->active].keys[k].free_pos;
    return at > p->pos ? at - p->pos : 0;
}

/* Launches from now to the region's next use; DEAD when the recording says
 * it is freed before any, FAR when unknown. */
uint64_t pol_distance(struct sh_policy *p, struct region *r)
{
    if (kind_is(p, SH_POLICY_BELADY)) {
        if (!p->fut.set || r->fut_cur >= r->fut_n)
            return FAR;
        uint64_t at = p->fut.use_pos[r->fut_off + r->fut_cur];
        return at >= p->glaunches ? at - p->glaunches : 0;
    }
    if (!following(p))
        return FAR;
    if (r->ridx == NONE32 && r->gpos == p->glaunches)
        return 0; /* allocated since the last launch: for the next ones */
    uint32_t k = key_of(p, r);
    if (k == NONE32)
        return FAR;
    uint64_t at = key_next(&p->recs[p->active], k, uses_now(p, r), p->pos);
    return at >= DEAD ? at : at - p->pos;
}
