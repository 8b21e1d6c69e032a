/* table.c — the scheduler's tables: arrays that grow by doubling, and the
 * region table with the per-class counters it keeps.
 *
 * Not thread-safe: the caller serialises every call (the library's lock).
 */
#include "policy/policy_int.h"

#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

/* Grows *arr to hold need elements (doubling); no-op when it does. */
int pol_reserve(void **arr, size_t *cap, size_t need, size_t elem)
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

/* ---------------------------------------------------------------------- */
/* region table (open addressing, tombstones) */

/* dset: appends slot i (room is always there: cap_vic >= cap); returns
 * its dpos. */
static uint32_t dset_push(struct sh_policy *p, uint32_t i)
{
    p->dset[p->ndset++] = i;
    return (uint32_t)p->ndset;
}

/* Takes r out of dset, the last entry into its place. */
static void dset_drop(struct sh_policy *p, struct region *r)
{
    if (!r->dpos)
        return;
    uint32_t at = r->dpos - 1, last = p->dset[--p->ndset];
    p->dset[at] = last;
    p->tab[last].dpos = at + 1;
    r->dpos = 0;
}

void pol_set_res(struct sh_policy *p, struct region *r, int res)
{
    if (res == SH_RES_DEVICE && !r->dpos)
        r->dpos = dset_push(p, (uint32_t)(r - p->tab));
    else if (res != SH_RES_DEVICE)
        dset_drop(p, r);
    r->res = (uint8_t)res;
}

/* Rehashing to the same size (clearing deleted slots, as regions come and
 * go every step) reuses the previous table: no allocation in steady state. */
int pol_table_resize(struct sh_policy *p, size_t cap)
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
    size_t cap_vic = p->cap_vic;
    if (RESERVE(p->vic, p->cap_vic, cap)) {
        free(n);
        return SH_ENOMEM;
    }
    if (p->cap_vic != cap_vic) { /* dset has the same room */
        uint32_t *d = realloc(p->dset, p->cap_vic * sizeof *d);
        if (!d) {
            free(n);
            return SH_ENOMEM;
        }
        p->dset = d;
    }
    for (size_t i = 0; i < p->cap; i++) {
        if (p->tab[i].state != 1)
            continue;
        size_t j = sh_map_mix(p->tab[i].id) & (cap - 1);
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
    p->ndset = 0; /* the regions moved: their places again */
    for (size_t i = 0; i < cap; i++)
        n[i].dpos = n[i].state == 1 && n[i].res == SH_RES_DEVICE ? dset_push(p, (uint32_t)i) : 0;
    return 0;
}

struct region *pol_table_insert(struct sh_policy *p, uint64_t id)
{
    if ((p->used + 1) * 4 > p->cap * 3) {
        size_t cap = p->cap ? p->cap : 64;
        while ((p->live + 1) * 2 > cap)
            cap *= 2;
        if (pol_table_resize(p, cap))
            return NULL;
    }
    size_t mask = p->cap - 1, i = sh_map_mix(id) & mask;
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

void pol_table_delete(struct sh_policy *p, struct region *r)
{
    pol_account_class(p, r, -1);
    if (r->res == SH_RES_TO_HOST)
        p->pending_d2h -= r->bytes;
    dset_drop(p, r);
    r->state = 2;
    p->live--;
}

/* Live persistent regions and bytes allocated this step, kept as counters. */
void pol_account_class(struct sh_policy *p, const struct region *r, int sign)
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
