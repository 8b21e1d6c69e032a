/* trace_mem.c — a trace in memory: its events, with every launch's region
 * ids in one pool, kernel names and the recorded source; built by the
 * generator and tests (sh_trace_append) and by the reader. Also the phase
 * words and the array growth the writer and the reader share.
 *
 * No shared state: a writer or a trace belongs to one caller at a time.
 */
#include "policy/trace_int.h"

#include "policy/policy.h"
#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

const char *const sh_trace_phases[5] = {"begin", "forward", "backward", "optimizer", "end"};

const char *sh_trace_phase_name(int phase)
{
    if (phase < 0 || phase > SH_PHASE_STEP_END)
        return "?";
    return sh_trace_phases[phase];
}

int sh_trace_create(struct sh_trace **out)
{
    if (!out)
        return SH_EINVAL;
    *out = calloc(1, sizeof **out);
    return *out ? 0 : SH_ENOMEM;
}

void sh_trace_destroy(struct sh_trace *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nnames; i++)
        free(t->names[i].name);
    free(t->names);
    free(t->ev);
    free(t->ids_off);
    free(t->pool);
    free(t->ro);
    free(t->source);
    free(t);
}

int sh_trace_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem)
            return SH_ENOMEM;
        c *= 2;
    }
    void *p = realloc(*arr, c * elem);
    if (!p)
        return SH_ENOMEM;
    *arr = p;
    *cap = c;
    return 0;
}

/* A pool moved: point every launch at its ids and flags again. */
static void rebase_ids(struct sh_trace *t)
{
    for (size_t i = 0; i < t->n; i++) {
        t->ev[i].ids = t->ev[i].n ? t->pool + t->ids_off[i] : NULL;
        t->ev[i].ro = t->ev[i].n && t->ro ? t->ro + t->ids_off[i] : NULL;
    }
}

/* Read-only flags for every id in the pool, the new ones clear; once a
 * trace has them, every launch points at its own. */
static int ro_cover(struct sh_trace *t, size_t need)
{
    size_t had = t->ro ? t->capro : 0;
    if (t->ro && need <= t->capro)
        return 0;
    size_t cap = need > t->cappool ? need : t->cappool;
    uint8_t *ro = realloc(t->ro, cap ? cap : 1);
    if (!ro)
        return SH_ENOMEM;
    memset(ro + had, 0, (cap ? cap : 1) - had);
    t->ro = ro;
    t->capro = cap ? cap : 1;
    rebase_ids(t);
    return 0;
}

int sh_trace_append(struct sh_trace *t, const struct sh_trace_event *ev)
{
    if (!t || !ev || (ev->n && !ev->ids))
        return SH_EINVAL;
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 256;
        struct sh_trace_event *e = realloc(t->ev, c * sizeof *e);
        if (!e)
            return SH_ENOMEM;
        t->ev = e;
        size_t *o = realloc(t->ids_off, c * sizeof *o);
        if (!o)
            return SH_ENOMEM;
        t->ids_off = o;
        t->cap = c;
    }
    uint64_t *old = t->pool;
    if (ev->n > SIZE_MAX - t->npool ||
        sh_trace_grow((void **)&t->pool, &t->cappool, t->npool + ev->n, sizeof *t->pool))
        return SH_ENOMEM;
    if ((ev->ro || t->ro) && ro_cover(t, t->npool + ev->n))
        return SH_ENOMEM;
    struct sh_trace_event *e = &t->ev[t->n];
    *e = *ev;
    t->ids_off[t->n] = t->npool;
    if (ev->n)
        memcpy(t->pool + t->npool, ev->ids, ev->n * sizeof *ev->ids);
    if (ev->n && ev->ro)
        memcpy(t->ro + t->npool, ev->ro, ev->n);
    t->npool += ev->n;
    e->ids = ev->n ? t->pool + t->ids_off[t->n] : NULL;
    e->ro = ev->n && t->ro ? t->ro + t->ids_off[t->n] : NULL;
    t->n++;
    if (old != t->pool)
        rebase_ids(t);
    return 0;
}

int sh_trace_set_kernel_name(struct sh_trace *t, uint64_t kernel, const char *name)
{
    if (!t || !name)
        return SH_EINVAL;
    char *copy = strdup(name);
    if (!copy)
        return SH_ENOMEM;
    for (size_t i = 0; i < t->nnames; i++) {
        if (t->names[i].kernel == kernel) {
            free(t->names[i].name);
            t->names[i].name = copy;
            return 0;
        }
    }
    if (sh_trace_grow((void **)&t->names, &t->capnames, t->nnames + 1, sizeof *t->names)) {
        free(copy);
        return SH_ENOMEM;
    }
    t->names[t->nnames].kernel = kernel;
    t->names[t->nnames].name = copy;
    t->nnames++;
    return 0;
}

int sh_trace_ro_at(struct sh_trace *t, size_t ev, size_t k)
{
    if (ro_cover(t, t->npool))
        return SH_ENOMEM;
    t->ro[t->ids_off[ev] + k] = 1;
    return 0;
}

int sh_trace_set_read_only(struct sh_trace *t, size_t ev, uint64_t id)
{
    if (!t || ev >= t->n || t->ev[ev].type != SH_TRACE_LAUNCH)
        return SH_EINVAL;
    const struct sh_trace_event *e = &t->ev[ev];
    size_t k = 0;
    while (k < e->n && e->ids[k] != id)
        k++;
    if (k == e->n)
        return SH_ENOTFOUND;
    if (ro_cover(t, t->npool))
        return SH_ENOMEM;
    for (; k < e->n; k++) /* a region listed twice: each mention */
        if (e->ids[k] == id)
            t->ro[t->ids_off[ev] + k] = 1;
    return 0;
}

size_t sh_trace_count(const struct sh_trace *t)
{
    return t ? t->n : 0;
}

const struct sh_trace_event *sh_trace_at(const struct sh_trace *t, size_t i)
{
    return t && i < t->n ? &t->ev[i] : NULL;
}

const char *sh_trace_kernel_name(const struct sh_trace *t, uint64_t kernel)
{
    if (!t)
        return NULL;
    for (size_t i = 0; i < t->nnames; i++)
        if (t->names[i].kernel == kernel)
            return t->names[i].name;
    return NULL;
}

const char *sh_trace_source(const struct sh_trace *t)
{
    return t && t->source ? t->source : "";
}
