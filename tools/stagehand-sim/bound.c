/* bound.c — what a trace needs whatever the policy: its footprint, its
 * compute per step, and the lower bound max(compute, unavoidable bytes /
 * bandwidth) (docs/POLICY.md explains why those bytes are unavoidable).
 *
 * No shared state.
 */
#include "tools/stagehand-sim/sim.h"

#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_err.h"

#include <stdlib.h>

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
        else if (e->type == SH_TRACE_FREE)
            rc = sh_policy_free(p, e->t_us, e->id);
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
                       struct idmap *used)
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
    struct idmap sizes = {0}, used = {0};
    uint64_t live = 0, peak = 0, live_used = 0, peak_used = 0;
    double steady_us = 0;
    size_t k = 0;
    rc = steady_used(t, starts, nst, &used);
    for (size_t i = 0; i < sh_trace_count(t) && !rc; i++) {
        while (k + 1 < nst && starts[k + 1] <= i)
            k++;
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_ALLOC) {
            rc = idmap_put(&sizes, e->id, (size_t)e->bytes);
            live += e->bytes;
            peak = live > peak ? live : peak;
            live_used += idmap_get(&used, e->id) == SIZE_MAX ? 0 : e->bytes;
            peak_used = live_used > peak_used ? live_used : peak_used;
        } else if (e->type == SH_TRACE_FREE) {
            size_t b = idmap_get(&sizes, e->id);
            live -= b == SIZE_MAX ? 0 : (uint64_t)b;
            if (b != SIZE_MAX && idmap_get(&used, e->id) != SIZE_MAX)
                live_used -= (uint64_t)b;
        } else if (e->type == SH_TRACE_LAUNCH && k >= (nst > 2 ? 2 : nst - 1)) {
            steady_us +=
                e->dur_us == SH_TRACE_NO_DUR ? (double)default_ns / 1000 : (double)e->dur_us;
        }
    }
    idmap_free(&sizes);
    idmap_free(&used);
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

/* One step, launches e[0..n): the best partition into segments of
 * sum max(compute, (bytes live before the segment and used in it - VRAM) /
 * bandwidth). At a segment's start at most VRAM bytes are on the device, so
 * the rest of what it uses that already existed must cross PCIe within it. */
struct seg_in {
    const struct sh_trace *t;
    const size_t *launch; /* event indices of the step's launches */
    size_t n;
    const struct idmap *ids;
    const uint64_t *born;  /* per region: launches seen when allocated */
    const uint64_t *bytes; /* per region */
    uint64_t first;        /* launches seen before the step */
    uint64_t default_ns;
};

static double dur_s(const struct seg_in *in, size_t i)
{
    const struct sh_trace_event *e = sh_trace_at(in->t, in->launch[i]);
    return e->dur_us == SH_TRACE_NO_DUR ? (double)in->default_ns / 1e9 : (double)e->dur_us / 1e6;
}

static double segment_dp(const struct seg_in *in, const struct sim_params *sp, uint64_t *stamp)
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
        pre[i + 1] = pre[i] + dur_s(in, i);
    for (size_t a = 0; a < m; a++) {
        uint64_t held = 0, mark = in->first + a * stride + 1;
        for (size_t b = a; b < m; b++) {
            for (size_t i = b * stride; i < (b + 1) * stride && i < n; i++) {
                const struct sh_trace_event *e = sh_trace_at(in->t, in->launch[i]);
                for (size_t j = 0; j < e->n; j++) {
                    size_t g = idmap_get(in->ids, e->ids[j]);
                    if (g == SIZE_MAX || stamp[g] == mark || in->born[g] > in->first + a * stride)
                        continue;
                    stamp[g] = mark;
                    held += in->bytes[g];
                }
            }
            size_t hi = (b + 1) * stride < n ? (b + 1) * stride : n;
            double compute = pre[hi] - pre[a * stride];
            double over = held > sp->vram_bytes ? (double)(held - sp->vram_bytes) : 0;
            double link = over / sp->pcie_bytes_per_s;
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

int sim_segment_bound(const struct sh_trace *t, const struct sim_params *sp, double *out)
{
    size_t *starts, nst;
    int rc = sim_step_starts(t, &starts, &nst);
    if (rc)
        return rc;
    size_t ne = sh_trace_count(t), nreg = 0;
    struct idmap ids = {0};
    uint64_t *born = malloc((ne + 1) * sizeof *born), *bytes = malloc((ne + 1) * sizeof *bytes);
    uint64_t *stamp = calloc(ne + 1, sizeof *stamp);
    size_t *launch = malloc((ne + 1) * sizeof *launch), *lstep = malloc((nst + 1) * sizeof *lstep);
    if (!born || !bytes || !stamp || !launch || !lstep)
        rc = SH_ENOMEM;
    uint64_t nl = 0;
    size_t k = 0;
    for (size_t i = 0; i < ne && !rc; i++) {
        while (k < nst && starts[k] <= i)
            lstep[k++] = (size_t)nl;
        const struct sh_trace_event *e = sh_trace_at(t, i);
        if (e->type == SH_TRACE_ALLOC) {
            born[nreg] = nl;
            bytes[nreg] = e->bytes;
            rc = idmap_put(&ids, e->id, nreg++);
        } else if (e->type == SH_TRACE_LAUNCH) {
            launch[nl++] = i;
        }
    }
    while (k <= nst)
        lstep[k++] = (size_t)nl;
    double sum = 0;
    size_t first = nst > 2 ? 2 : nst - 1; /* as the replay measures */
    for (size_t s = first; s < nst && !rc; s++) {
        struct seg_in in = {.t = t,
                            .launch = launch + lstep[s],
                            .n = lstep[s + 1] - lstep[s],
                            .ids = &ids,
                            .born = born,
                            .bytes = bytes,
                            .first = lstep[s],
                            .default_ns = sp->default_ns};
        sum += segment_dp(&in, sp, stamp);
    }
    *out = rc ? 0 : sum / (double)(nst - first);
    idmap_free(&ids);
    free(born);
    free(bytes);
    free(stamp);
    free(launch);
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
    double link_s = (double)over / sp->pcie_bytes_per_s * (sp->shared_link ? 2 : 1);
    return s->compute_s > link_s ? s->compute_s : link_s;
}
