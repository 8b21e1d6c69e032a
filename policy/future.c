/* future.c — the exact future for belady (stagehand-sim): launches,
 * allocations and frees by position, and each region's uses in order.
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
    free(f->lids);
    free(f->aoff);
    free(f->abytes);
    free(f->foff);
    free(f->fids);
    free(f->use_pos);
    free(f->use_off);
    free(f->use_n);
    pol_map_free(&f->uses);
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
        if (pol_map_put(&f->uses, f->lids[k], nkeys, &got))
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
    pol_future_free(&p->fut);
    size_t nids, na, nf;
    int err = future_count(&p->fut, ev, n, &nids, &na, &nf);
    if (!err)
        err = future_alloc(&p->fut, nids, na, nf);
    if (!err)
        err = future_fill(&p->fut, ev, n);
    if (err) {
        pol_future_free(&p->fut);
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
