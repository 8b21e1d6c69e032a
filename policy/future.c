/* future.c — the exact future for belady (stagehand-sim): launches,
 * allocations and frees by position, and each region's uses in order. A
 * region is an incarnation (an allocation, or a region that existed
 * before), not an id: ids may come back after their free.
 *
 * Not thread-safe: the caller serialises every call (the library's lock).
 */
#include "policy/policy_int.h"

#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------- */
/* the future, for belady */

void pol_future_free(struct future *f)
{
    free(f->loff);
    free(f->linc);
    free(f->aoff);
    free(f->abytes);
    free(f->foff);
    free(f->finc);
    free(f->inc_id);
    free(f->use_pos);
    free(f->use_off);
    free(f->use_n);
    sh_map_free(&f->pre);
    memset(f, 0, sizeof *f);
}

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
    if (*na >= NONE32 || *nids >= NONE32)
        return SH_EINVAL;
    return 0;
}

static int future_alloc(struct future *f, size_t nids, size_t na, size_t nf)
{
    size_t nl = (size_t)f->nl, ninc = na + nids; /* at most: each reference a region of before */
    f->loff = calloc(nl + 2, sizeof *f->loff);
    f->linc = malloc((nids + 1) * sizeof *f->linc);
    f->aoff = calloc(nl + 2, sizeof *f->aoff);
    f->abytes = malloc((na + 1) * sizeof *f->abytes);
    f->foff = calloc(nl + 2, sizeof *f->foff);
    f->finc = malloc((nf + 1) * sizeof *f->finc);
    f->inc_id = malloc((ninc + 1) * sizeof *f->inc_id);
    f->use_pos = malloc((nids + 1) * sizeof *f->use_pos);
    f->use_off = calloc(ninc + 1, sizeof *f->use_off);
    f->use_n = calloc(ninc + 1, sizeof *f->use_n);
    if (!f->loff || !f->linc || !f->aoff || !f->abytes || !f->foff || !f->finc || !f->inc_id ||
        !f->use_pos || !f->use_off || !f->use_n)
        return SH_ENOMEM;
    f->nalloc = (uint32_t)na;
    f->ninc = (uint32_t)na;
    return 0;
}

/* The incarnation id names now: the last allocation of it so far, or the
 * region that existed before the future (numbered on first sight). cur
 * maps an id to its slot in last[]. */
struct naming {
    struct sh_map cur;
    uint32_t *last;
    uint32_t n;
};

static int name_now(struct future *f, struct naming *nm, uint64_t id, uint32_t *out)
{
    uint32_t slot;
    if (sh_map_add(&nm->cur, id, nm->n, &slot))
        return SH_ENOMEM;
    if (slot == nm->n) { /* first sight, and not allocated: a region of before */
        nm->n++;
        uint32_t got;
        if (sh_map_add(&f->pre, id, f->ninc, &got))
            return SH_ENOMEM;
        f->inc_id[f->ninc] = id;
        nm->last[slot] = f->ninc++;
    }
    *out = nm->last[slot];
    return 0;
}

static int name_alloc(struct future *f, struct naming *nm, uint64_t id, uint32_t a)
{
    uint32_t slot;
    if (sh_map_add(&nm->cur, id, nm->n, &slot))
        return SH_ENOMEM;
    if (slot == nm->n)
        nm->n++;
    nm->last[slot] = a;
    f->inc_id[a] = id;
    return 0;
}

/* One launch at position q: its incarnations, each once. */
static int fill_launch(struct future *f, struct naming *nm, const struct sh_policy_future *e,
                       uint64_t q, uint64_t *nid)
{
    uint64_t start = *nid;
    for (size_t j = 0; j < e->n; j++) {
        uint32_t inc;
        if (name_now(f, nm, e->ids[j], &inc))
            return SH_ENOMEM;
        int dup = 0;
        for (uint64_t k = start; k < *nid && !dup; k++)
            dup = f->linc[k] == inc;
        if (!dup)
            f->linc[(*nid)++] = inc;
    }
    f->loff[q + 1] = *nid;
    return 0;
}

/* Fills launches, allocations and frees by position, by incarnation. */
static int future_fill(struct future *f, struct naming *nm, const struct sh_policy_future *ev,
                       size_t n)
{
    uint64_t q = 0, nid = 0, na = 0, nf = 0;
    for (size_t i = 0; i < n; i++) {
        const struct sh_policy_future *e = &ev[i];
        int err = 0;
        if (e->kind == SH_FUTURE_ALLOC) {
            err = name_alloc(f, nm, e->id, (uint32_t)na);
            f->abytes[na++] = e->bytes;
        } else if (e->kind == SH_FUTURE_FREE) {
            uint32_t inc;
            err = name_now(f, nm, e->id, &inc);
            f->finc[nf++] = inc;
        } else if (e->kind == SH_FUTURE_LAUNCH) {
            f->aoff[q + 1] = na;
            f->foff[q + 1] = nf;
            err = fill_launch(f, nm, e, q++, &nid);
        }
        if (err)
            return err;
        /* positions run 0..nl: what comes after the last launch sits at nl */
        f->aoff[q + 1] = na;
        f->foff[q + 1] = nf;
    }
    return 0;
}

/* Each incarnation's launch positions, in order. */
static void future_uses(struct future *f)
{
    uint64_t nid = f->loff[f->nl];
    for (uint64_t k = 0; k < nid; k++)
        f->use_n[f->linc[k]]++;
    for (uint32_t k = 1; k < f->ninc; k++)
        f->use_off[k] = f->use_off[k - 1] + f->use_n[k - 1];
    memset(f->use_n, 0, ((size_t)f->ninc + 1) * sizeof *f->use_n);
    for (uint64_t l = 0; l < f->nl; l++)
        for (uint64_t k = f->loff[l]; k < f->loff[l + 1]; k++) {
            uint32_t inc = f->linc[k];
            f->use_pos[f->use_off[inc] + f->use_n[inc]++] = l;
        }
}

static void take_place(struct sh_policy *p, struct region *r, uint32_t inc)
{
    r->fut_inc = inc;
    r->fut_off = inc == NONE32 ? 0 : p->fut.use_off[inc];
    r->fut_n = inc == NONE32 ? 0 : p->fut.use_n[inc];
    r->fut_cur = 0;
}

void pol_future_alloc(struct sh_policy *p, struct region *r)
{
    struct future *f = &p->fut;
    take_place(p, r, f->set && f->allocs_seen < f->nalloc ? f->allocs_seen++ : NONE32);
}

struct region *pol_future_region(const struct sh_policy *p, uint32_t inc)
{
    struct region *r = live_region(p, p->fut.inc_id[inc]);
    return r && r->fut_inc == inc ? r : NULL;
}

static int set_future(struct future *f, const struct sh_policy_future *ev, size_t n)
{
    size_t nids, na, nf;
    int err = future_count(f, ev, n, &nids, &na, &nf);
    if (!err)
        err = future_alloc(f, nids, na, nf);
    struct naming nm = {.last = err ? NULL : malloc((na + nids + 1) * sizeof *nm.last)};
    if (!err && !nm.last)
        err = SH_ENOMEM;
    if (!err)
        err = future_fill(f, &nm, ev, n);
    if (!err)
        future_uses(f);
    sh_map_free(&nm.cur);
    free(nm.last);
    return err;
}

int sh_policy_set_future(struct sh_policy *p, const struct sh_policy_future *ev, size_t n)
{
    if (p)
        p->version++;
    if (!p || (n && !ev))
        return SH_EINVAL;
    pol_future_free(&p->fut);
    int err = set_future(&p->fut, ev, n);
    if (err) {
        pol_future_free(&p->fut);
        return err;
    }
    p->fut.set = 1;
    /* regions that exist already */
    for (size_t i = 0; i < p->cap; i++) {
        struct region *r = &p->tab[i];
        if (r->state == 1)
            take_place(p, r, sh_map_get(&p->fut.pre, r->id));
    }
    return 0;
}
