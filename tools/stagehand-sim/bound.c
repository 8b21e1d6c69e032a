/* bound.c — what a trace needs whatever the policy: its footprint, its
 * compute per step, and two lower bounds on a step: max(compute, bytes off
 * the device at the peak / bandwidth), and the same per segment of the step
 * with the bytes that must come in and go out counted per direction
 * (docs/POLICY.md explains why those bytes are unavoidable;
 * tests/unit/test_sim_bound.c checks no schedule beats them).
 *
 * No shared state.
 */
#include "tools/stagehand-sim/sim.h"

#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

/* Steps from the trace's own marks: every step mark after the first launch
 * starts a step (marks before it, and the allocations there, belong to the
 * first step). */
static int starts_from_marks(const struct sh_trace *t, size_t *starts, size_t *n)
{
    size_t k = 0;
    int launched = 0;
    starts[k++] = 0;
    for (size_t i = 0; i < sh_trace_count(t); i++) {
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_LAUNCH)
            launched = 1;
        else if (e->type == SH_TRACE_STEP && launched)
            starts[k++] = i;
    }
    *n = k;
    return k > 1 || launched;
}

/* No marks at all: let the policy find the steps. */
static int starts_from_policy(const struct sh_trace *t, size_t *starts, size_t *n)
{
    struct sh_policy_params pp = {.kind = SH_POLICY_REACTIVE,
                                  .budget_bytes = UINT64_MAX,
                                  .high_watermark = UINT64_MAX,
                                  .low_watermark = UINT64_MAX,
                                  .prefetch_window = 1,
                                  .max_inflight_h2d = 1,
                                  .max_inflight_d2h = 1,
                                  .batch_max = 1};
    struct sh_policy *p;
    int rc = sh_policy_create(&pp, &p);
    if (rc)
        return rc;
    size_t k = 0;
    starts[k++] = 0;
    int64_t step = 0;
    for (size_t i = 0; i < sh_trace_count(t) && !rc; i++) {
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_ALLOC)
            rc = sh_policy_alloc(p, e->t_us, e->id, e->bytes, e->stream);
        else if (e->type == SH_TRACE_FREE && !(rc = sh_policy_free(p, e->t_us, e->id)))
            rc = sh_policy_forget(p, e->id); /* at once, as the library does: ids come back */
        else if (e->type == SH_TRACE_LAUNCH)
            rc = sh_policy_launch(p, e->t_us, e->kernel, e->stream, e->ids, e->n);
        struct sh_policy_stats st;
        sh_policy_stats(p, &st);
        if (st.step != step) {
            step = st.step;
            starts[k++] = i;
        }
    }
    sh_policy_destroy(p);
    *n = k;
    return rc;
}

int sim_step_starts(const struct sh_trace *t, size_t **starts, size_t *n)
{
    size_t cap = sh_trace_count(t) + 1;
    *starts = malloc(cap * sizeof **starts);
    if (!*starts)
        return SH_ENOMEM;
    int has_marks = 0;
    for (size_t i = 0; i < sh_trace_count(t) && !has_marks; i++)
        has_marks = sh_trace_at(t, i)->type == SH_TRACE_STEP;
    if (has_marks && starts_from_marks(t, *starts, n))
        return 0;
    int rc = starts_from_policy(t, *starts, n);
    if (rc) {
        free(*starts);
        *starts = NULL;
    }
    return rc;
}

/* The regions a measured (steady) step uses: only they must cross the link.
 * One the program keeps but never touches again (the optimizer state of a run
 * that only evaluates) can stay on the host for nothing. */
static int steady_used(const struct sh_trace *t, const size_t *starts, size_t nst,
                       struct sh_map *used)
{
    size_t k = 0, first = nst > 2 ? 2 : nst - 1;
    int rc = 0;
    for (size_t i = 0; i < sh_trace_count(t) && !rc; i++) {
        while (k + 1 < nst && starts[k + 1] <= i)
            k++;
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_LAUNCH && k >= first)
            for (size_t j = 0; j < e->n && !rc; j++)
                rc = idmap_put(used, e->ids[j], 1);
    }
    return rc;
}

int sim_shape_of(const struct sh_trace *t, uint64_t default_ns, struct sim_shape *out)
{
    size_t *starts, nst;
    int rc = sim_step_starts(t, &starts, &nst);
    if (rc)
        return rc;
    struct sh_map sizes = {0}, used = {0};
    uint64_t live = 0, peak = 0, live_used = 0, peak_used = 0;
    double steady_us = 0;
    size_t k = 0;
    rc = steady_used(t, starts, nst, &used);
    for (size_t i = 0; i < sh_trace_count(t) && !rc; i++) {
        while (k + 1 < nst && starts[k + 1] <= i)
            k++;
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_ALLOC) {
            rc = idmap_put(&sizes, e->id, i); /* where its size is */
            live += e->bytes;
            peak = live > peak ? live : peak;
            live_used += idmap_get(&used, e->id) == SIZE_MAX ? 0 : e->bytes;
            peak_used = live_used > peak_used ? live_used : peak_used;
        } else if (e->type == SH_TRACE_FREE) {
            size_t a = idmap_get(&sizes, e->id);
            uint64_t b = a == SIZE_MAX ? 0 : sh_trace_at(t, a)->bytes;
            live -= b;
            if (idmap_get(&used, e->id) != SIZE_MAX)
                live_used -= b;
        } else if (e->type == SH_TRACE_LAUNCH && k >= (nst > 2 ? 2 : nst - 1)) {
            steady_us +=
                e->dur_us == SH_TRACE_NO_DUR ? (double)default_ns / 1000 : (double)e->dur_us;
        }
    }
    sh_map_free(&sizes);
    sh_map_free(&used);
    if (rc) {
        free(starts);
        return rc;
    }
    out->footprint = peak;
    out->used_peak = peak_used;
    out->steps = (int)nst;
    out->compute_s = steady_us / 1e6 / (double)(nst > 2 ? nst - 2 : 1);
    free(starts);
    return 0;
}

/* The segment bound. A segment is launches [A, B) of a step; it lasts from
 * the start of launch A to the start of launch B (or to the end of the last
 * launch). At any instant at most VRAM bytes are on the device (resident,
 * or with a copy in flight either way), so:
 *
 *   H2D: at A's start at most VRAM of what the segment uses and existed
 *   before it is there; the rest is restored within the segment.
 *   D2H: every region on the device at some time in the segment (used by
 *   one of its launches, or allocated within it) and still live at B's
 *   start, together with B's own regions (which must be there then), beyond
 *   VRAM, was evicted within it: after its last use there (a launch keeps
 *   its regions) and before B.
 *
 * With clean_skip an eviction copies nothing when the region was not written
 * since its restore, so only the regions allocated or written in the
 * segment count towards D2H: of the bytes that must leave, at most those of
 * the others leave for free.
 *
 * Each direction's bytes take bytes / bandwidth on its own link, or the sum
 * on a shared one, and the launches run one at a time: a segment lasts at
 * least max(compute, link). Segments do not overlap, so the sum over any
 * partition of the step bounds it; the best partition is found by dynamic
 * programming. */
struct seg_in {
    const struct sh_trace *t;
    const size_t *launch;                /* event index of each launch of the trace */
    size_t nl;                           /* launches in the trace */
    size_t lo, n;                        /* this step: launches [lo, lo + n) */
    const uint64_t *born, *died, *bytes; /* per region: launches before its alloc, its free
                                           (UINT64_MAX: never freed), its size */
    const size_t *loff, *lreg;           /* the regions launch k touches */
    const uint8_t *lwr;                  /* ... and whether it writes each */
    uint64_t *dstamp;                    /* per region: the segment that dirtied it */
    int clean;                           /* clean_skip: only dirty bytes must be copied out */
    const size_t *aoff, *alist;          /* regions allocated just before launch k */
    const size_t *foff, *flist;          /* regions freed just before launch k */
    uint64_t default_ns;
};

/* One DP row's running sums: segments [A, B) for a fixed A, B growing. */
struct seg_acc {
    uint64_t mark;   /* stamp of the regions in the segment */
    uint64_t before; /* bytes used in it that existed before A */
    uint64_t live;   /* bytes on the device within it and still live at B */
    uint64_t dirty;  /* of those, allocated or written within it (clean_skip) */
    uint64_t B;      /* launches covered so far, from the trace's first */
};

static double dur_s(const struct seg_in *in, size_t i)
{
    const struct sh_trace_event *e = sh_trace_at(in->t, in->launch[i]);
    return e->dur_us == SH_TRACE_NO_DUR ? (double)in->default_ns / 1e9 : (double)e->dur_us / 1e6;
}

static void seg_take(const struct seg_in *in, struct seg_acc *acc, uint64_t *stamp, size_t g,
                     uint64_t A)
{
    if (stamp[g] == acc->mark)
        return;
    stamp[g] = acc->mark;
    acc->before += in->born[g] <= A ? in->bytes[g] : 0;
    acc->live += in->bytes[g];
}

/* Region g holds bytes no kept copy has: its eviction copies. */
static void seg_dirty(const struct seg_in *in, struct seg_acc *acc, size_t g)
{
    if (!in->clean || in->dstamp[g] == acc->mark)
        return;
    in->dstamp[g] = acc->mark;
    acc->dirty += in->bytes[g];
}

/* Extends the segment to launch B (exclusive): B's uses, the allocations up
 * to B, and the frees up to B (a region freed before B is not live at B). */
static void seg_extend(const struct seg_in *in, struct seg_acc *acc, uint64_t *stamp, uint64_t A,
                       uint64_t B)
{
    for (uint64_t i = acc->B; i < B; i++) {
        for (size_t j = in->loff[i]; j < in->loff[i + 1]; j++) {
            seg_take(in, acc, stamp, in->lreg[j], A);
            if (in->lwr[j])
                seg_dirty(in, acc, in->lreg[j]);
        }
        for (size_t j = in->aoff[i + 1]; j < in->aoff[i + 2]; j++) {
            seg_take(in, acc, stamp, in->alist[j], A);
            seg_dirty(in, acc, in->alist[j]);
        }
        for (size_t j = in->foff[i + 1]; j < in->foff[i + 2]; j++) {
            size_t g = in->flist[j];
            if (stamp[g] == acc->mark)
                acc->live -= in->bytes[g];
            if (in->clean && in->dstamp[g] == acc->mark)
                acc->dirty -= in->bytes[g];
        }
    }
    acc->B = B;
}

/* Bytes of launch B's regions not already counted as live in the segment. */
static uint64_t seg_next(const struct seg_in *in, const struct seg_acc *acc, uint64_t *stamp,
                         uint64_t *stamp2, uint64_t mark2)
{
    if (acc->B >= in->nl)
        return 0;
    uint64_t extra = 0;
    for (size_t j = in->loff[acc->B]; j < in->loff[acc->B + 1]; j++) {
        size_t g = in->lreg[j];
        if (stamp[g] == acc->mark || stamp2[g] == mark2)
            continue;
        stamp2[g] = mark2;
        extra += in->bytes[g];
    }
    return extra;
}

static double link_s(const struct sim_params *sp, uint64_t h2d, uint64_t d2h)
{
    uint64_t v = sp->vram_bytes;
    double in = h2d > v ? (double)(h2d - v) / sp->pcie_bytes_per_s : 0;
    double out = d2h > v ? (double)(d2h - v) / sp->d2h_bytes_per_s : 0;
    return sp->shared_link ? in + out : in > out ? in : out;
}

static double segment_dp(const struct seg_in *in, const struct sim_params *sp, uint64_t *stamp,
                         uint64_t *stamp2, uint64_t *marks)
{
    size_t n = in->n;
    /* long steps: segment edges only every `stride` launches (still a bound) */
    size_t stride = n > 1024 ? (n + 1023) / 1024 : 1, m = (n + stride - 1) / stride;
    double *best = calloc(m + 1, sizeof *best);
    double *pre = calloc(n + 1, sizeof *pre);
    if (!best || !pre) {
        free(best);
        free(pre);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        pre[i + 1] = pre[i] + dur_s(in, in->lo + i);
    for (size_t a = 0; a < m; a++) {
        uint64_t A = in->lo + a * stride;
        struct seg_acc acc = {.mark = ++marks[0], .B = A};
        for (size_t b = a; b < m; b++) {
            size_t hi = (b + 1) * stride < n ? (b + 1) * stride : n;
            seg_extend(in, &acc, stamp, A, in->lo + hi);
            uint64_t next = seg_next(in, &acc, stamp, stamp2, ++marks[1]);
            double compute = pre[hi] - pre[a * stride];
            double link = link_s(sp, acc.before, (in->clean ? acc.dirty : acc.live) + next);
            double v = best[a] + (compute > link ? compute : link);
            if (v > best[b + 1])
                best[b + 1] = v;
        }
    }
    double r = best[m];
    free(best);
    free(pre);
    return r;
}

/* Per region, what the segments need: size, launches seen at its allocation
 * and at its free. Per launch, the regions it touches (an id may be reused
 * after a free: resolved as the trace is read). Per launch gap k (just
 * before launch k; k = nl after the last), the regions allocated and freed
 * there. Lists are offset lists: item k is list[off[k]] .. list[off[k + 1]]. */
struct seg_index {
    struct sh_map ids;
    size_t nreg, nl, nlreg;
    uint64_t *born, *died, *bytes;
    size_t *launch, *loff, *lreg, *aoff, *alist, *foff, *flist;
    uint8_t *lwr;
};

static void seg_index_free(struct seg_index *x)
{
    sh_map_free(&x->ids);
    free(x->born);
    free(x->died);
    free(x->bytes);
    free(x->launch);
    free(x->loff);
    free(x->lreg);
    free(x->lwr);
    free(x->aoff);
    free(x->alist);
    free(x->foff);
    free(x->flist);
}

/* Counting sort of regions by gap (off has nl + 3 zeroed entries); after it,
 * gap k is list[off[k]] .. list[off[k + 1]]. */
static void seg_bucket(const uint64_t *key, size_t nreg, size_t nl, size_t *off, size_t *list)
{
    for (size_t g = 0; g < nreg; g++)
        if (key[g] <= nl)
            off[key[g] + 2]++;
    for (size_t k = 2; k < nl + 3; k++)
        off[k] += off[k - 1];
    for (size_t g = 0; g < nreg; g++)
        if (key[g] <= nl)
            list[off[key[g] + 1]++] = g;
}

/* Records launch i's regions as they are now. */
static void seg_index_launch(struct seg_index *x, const struct sh_trace_event *e, size_t i)
{
    x->launch[x->nl] = i;
    for (size_t j = 0; j < e->n; j++) {
        size_t g = idmap_get(&x->ids, e->ids[j]);
        if (g != SIZE_MAX) {
            x->lwr[x->nlreg] = (uint8_t)sh_trace_writes(e, j);
            x->lreg[x->nlreg++] = g;
        }
    }
    x->loff[++x->nl] = x->nlreg;
}

static int seg_index_build(const struct sh_trace *t, struct seg_index *x)
{
    size_t ne = sh_trace_count(t) + 1, touches = 1;
    for (size_t i = 0; i + 1 < ne; i++)
        if (sh_trace_at(t, i)->type == SH_TRACE_LAUNCH)
            touches += sh_trace_at(t, i)->n;
    memset(x, 0, sizeof *x);
    x->lreg = malloc(touches * sizeof *x->lreg);
    x->lwr = malloc(touches);
    x->born = malloc(ne * sizeof *x->born);
    x->died = malloc(ne * sizeof *x->died);
    x->bytes = malloc(ne * sizeof *x->bytes);
    x->launch = malloc(ne * sizeof *x->launch);
    x->loff = calloc(ne + 1, sizeof *x->loff);
    x->aoff = calloc(ne + 3, sizeof *x->aoff);
    x->foff = calloc(ne + 3, sizeof *x->foff);
    x->alist = malloc(ne * sizeof *x->alist);
    x->flist = malloc(ne * sizeof *x->flist);
    if (!x->born || !x->died || !x->bytes || !x->launch || !x->loff || !x->lreg || !x->lwr ||
        !x->aoff || !x->foff || !x->alist || !x->flist)
        return SH_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i + 1 < ne && !rc; i++) {
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_ALLOC) {
            x->born[x->nreg] = x->nl;
            x->died[x->nreg] = UINT64_MAX;
            x->bytes[x->nreg] = e->bytes;
            rc = idmap_put(&x->ids, e->id, x->nreg++);
        } else if (e->type == SH_TRACE_FREE) {
            size_t g = idmap_get(&x->ids, e->id);
            if (g != SIZE_MAX)
                x->died[g] = x->nl;
        } else if (e->type == SH_TRACE_LAUNCH) {
            seg_index_launch(x, e, i);
        }
    }
    seg_bucket(x->born, x->nreg, x->nl, x->aoff, x->alist);
    seg_bucket(x->died, x->nreg, x->nl, x->foff, x->flist);
    return rc;
}

/* Launches before each step's start; lstep[nst] = all of them. */
static void step_launches(const struct sh_trace *t, const size_t *starts, size_t nst, size_t *lstep)
{
    size_t nl = 0, k = 0;
    for (size_t i = 0; i < sh_trace_count(t); i++) {
        while (k < nst && starts[k] <= i)
            lstep[k++] = nl;
        nl += sh_trace_at(t, i)->type == SH_TRACE_LAUNCH;
    }
    while (k <= nst)
        lstep[k++] = nl;
}

int sim_segment_bound(const struct sh_trace *t, const struct sim_params *sp, double *out)
{
    size_t *starts, nst;
    int rc = sim_step_starts(t, &starts, &nst);
    if (rc)
        return rc;
    struct seg_index x;
    rc = seg_index_build(t, &x);
    size_t ne = sh_trace_count(t) + 1;
    uint64_t *stamp = calloc(ne, sizeof *stamp), *stamp2 = calloc(ne, sizeof *stamp2);
    uint64_t *dstamp = calloc(ne, sizeof *dstamp);
    size_t *lstep = malloc((nst + 1) * sizeof *lstep);
    if (!rc && (!stamp || !stamp2 || !dstamp || !lstep))
        rc = SH_ENOMEM;
    if (!rc)
        step_launches(t, starts, nst, lstep);
    double sum = 0;
    uint64_t marks[2] = {0, 0};
    size_t first = nst > 2 ? 2 : nst - 1; /* as the replay measures */
    for (size_t s = first; s < nst && !rc; s++) {
        struct seg_in in = {.t = t,
                            .launch = x.launch,
                            .nl = x.nl,
                            .lo = lstep[s],
                            .n = lstep[s + 1] - lstep[s],
                            .loff = x.loff,
                            .lreg = x.lreg,
                            .lwr = x.lwr,
                            .dstamp = dstamp,
                            .clean = sp->clean_skip,
                            .born = x.born,
                            .died = x.died,
                            .bytes = x.bytes,
                            .aoff = x.aoff,
                            .alist = x.alist,
                            .foff = x.foff,
                            .flist = x.flist,
                            .default_ns = sp->default_ns};
        sum += segment_dp(&in, sp, stamp, stamp2, marks);
    }
    *out = rc ? 0 : sum / (double)(nst - first);
    seg_index_free(&x);
    free(dstamp);
    free(stamp);
    free(stamp2);
    free(lstep);
    free(starts);
    return rc;
}

double sim_lower_bound(const struct sim_shape *s, const struct sim_params *sp,
                       uint64_t *unavoidable_bytes)
{
    uint64_t over = s->used_peak > sp->vram_bytes ? s->used_peak - sp->vram_bytes : 0;
    if (unavoidable_bytes)
        *unavoidable_bytes = over;
    /* Each byte off the device at the peak crosses the link at least once:
     * out before the peak or back after it. Not twice on a shared link: a
     * region evicted and never used again only goes out (the segment bound
     * counts both directions where both are due). */
    double fast =
        sp->pcie_bytes_per_s > sp->d2h_bytes_per_s ? sp->pcie_bytes_per_s : sp->d2h_bytes_per_s;
    double link = (double)over / fast; /* whichever way each byte crosses */
    return s->compute_s > link ? s->compute_s : link;
}
