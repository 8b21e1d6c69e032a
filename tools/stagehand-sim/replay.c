/* replay.c — the model stagehand-sim replays a trace against: one GPU that
 * runs launches in trace order, VRAM of a given size, and a PCIe link per
 * direction (or one shared link) that carries copies one at a time at a
 * given bandwidth, at most max_inflight issued copies per direction.
 *
 * The link (copies queued, issued, finished) is copy.c.
 *
 * The policy decides exactly as inside the library: at each launch, after
 * making its regions resident; room is made by the library's engine
 * (engine/, run over the model by room.c) when an allocation or a restore
 * needs it. A launch whose
 * region is on the host waits for its restore; one whose region is being
 * prefetched waits for that copy; one whose region is being evicted keeps
 * it (the eviction is abandoned: the device copy is still mapped). Memory
 * under an eviction counts as used until the eviction is committed; copies
 * are committed in remap windows between launches, which cost time.
 *
 * No shared state: everything lives in one struct per run (replay.h).
 */
#include "tools/stagehand-sim/replay.h"

#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_clock.h"
#include "sh_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int run_fail(struct run *r, const char *fmt, ...)
{
    if (!r->failed && r->err && r->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->errlen, fmt, ap);
        va_end(ap);
    }
    r->failed = 1;
    return SH_EINVAL;
}

static size_t reg_of(const struct run *r, uint64_t id)
{
    return idmap_get(&r->ids, id);
}

/* ---- decisions ---- */

static int decide(struct run *r);

/* Processes copy completions up to time t. They are not decision points:
 * the library plans only as a launch is prepared (sh_sched_plan), with no
 * thread watching copies finish, and so does the model. */
int advance(struct run *r, uint64_t t)
{
    for (;;) {
        int c = next_done(r);
        if (c < 0 || r->cp[c].done_ns > t)
            break;
        if (r->cp[c].done_ns > r->now)
            r->now = r->cp[c].done_ns;
        if (finish(r, c))
            return SH_EINVAL;
    }
    if (t > r->now)
        r->now = t;
    return 0;
}

int run_hold(struct run *r, uint64_t ns)
{
    return advance(r, r->now + ns);
}

/* Waits for the next copy to finish; fails when none is in flight. The GPU
 * is idle meanwhile, so a finished eviction is committed at once (a remap
 * window has nothing to drain) and its memory goes to the next restore. */
int wait_one(struct run *r)
{
    int c = next_done(r);
    if (c < 0)
        return run_fail(r, "deadlock: waiting with no copy in flight");
    if (advance(r, r->cp[c].done_ns))
        return SH_EINVAL;
    if (!any_ready(r, D2H))
        return 0;
    return commit_window(r, 1 << D2H, 0, W_EARLY);
}

static uint64_t chunks(const struct run *r, uint64_t bytes)
{
    return (bytes + r->sp->chunk_bytes - 1) / r->sp->chunk_bytes;
}

/* When the copies on the link now will have finished. */
static uint64_t copies_done_ns(const struct run *r)
{
    uint64_t t = r->now;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < r->issued[d].n; i++) {
            const struct copy *cp = &r->cp[r->issued[d].v[r->issued[d].head + i]];
            t = cp->done_ns > t ? cp->done_ns : t;
        }
    return t;
}

/* 1 when the window committing dirs from `from` on compares a kept copy:
 * it drains the whole device first, whatever drain_mode says (a writer the
 * scan missed must be done). */
static int compares(const struct run *r, int dirs, size_t from)
{
    for (size_t i = 0; i < r->nready; i++) {
        int c = r->ready[i];
        const struct copy *cp = &r->cp[c];
        if (cp->state == C_READY && cp->kept && (dirs & 1 << cp->dir) && (size_t)c >= from)
            return 1;
    }
    return 0;
}

/* A window waited for the work issued so far (--verbose x4 says when). */
static void mark_drained(struct run *r)
{
    r->drained = r->clock;
    if (r->sp->verbose > 3)
        fprintf(stderr, "      drained at %.3f ms\n", (double)r->now / 1e6);
}

int drain(struct run *r)
{
    mark_drained(r); /* tracked: the program's stream is among those waited for */
    if (!r->sp->drain_copies)
        return 0;
    uint64_t t0 = r->now;
    int rc = advance(r, copies_done_ns(r));
    tally(r)->drain_ns += r->now - t0;
    return rc;
}

void sim_kept(struct run *r, struct sreg *s, int kept)
{
    if (s->kept != kept && s->live)
        sh_policy_kept(r->pol, s->id, kept);
    s->kept = kept;
}

/* A restore lands: with clean_skip its slabs stay, as a copy of the bytes
 * fingerprinted in this window (unless the region learnt to keep none). */
static uint64_t keep_copy(struct run *r, struct sreg *s)
{
    if (!r->sp->clean_skip || !s->live || !sh_clean_learn_keep(&s->learn))
        return 0;
    sim_kept(r, s, 1);
    s->dirty = 0;
    return (uint64_t)((double)s->bytes / r->sp->hbm_bytes_per_s * 1e9 + 0.5);
}

/* A finished copy takes effect (its region's window is open). */
static uint64_t commit_one(struct run *r, struct copy *cp)
{
    cp->state = C_DONE;
    struct sreg *s = &r->reg[cp->reg];
    s->copy = -1;
    uint64_t cost = r->sp->map_ns * chunks(r, cp->bytes) + cp->fp_ns;
    if (cp->kept) {
        sh_clean_learn_note(&s->learn, cp->clean);
        tally(r)->clean += cp->clean;
    }
    if (cp->dir == H2D) {
        s->res = SH_RES_DEVICE;
        cost += keep_copy(r, s);
    } else {
        /* the prefilter reads the bytes about to leave, copied or clean */
        cost += (uint64_t)((double)s->bytes / r->sp->prefilter_bytes_per_s * 1e9 + 0.5);
        s->res = SH_RES_HOST;
        r->used -= s->bytes;
        r->evicting -= s->bytes;
    }
    if (s->live)
        sh_policy_residency(r->pol, s->id, s->res);
    else if (cp->dir == H2D)
        r->used -= s->bytes; /* freed while coming back */
    return cost;
}

int commit_window(struct run *r, int dirs, size_t from, int kind)
{
    uint64_t t0 = r->now;
    int cmp = compares(r, dirs, from); /* the whole device drains, whatever drain_mode says */
    if (cmp ? advance(r, copies_done_ns(r)) : drain(r))
        return SH_EINVAL;
    if (cmp) {
        tally(r)->drain_ns += r->now - t0;
        mark_drained(r);
    }
    uint64_t cost = r->sp->remap_base_ns;
    size_t keep = 0;
    for (size_t i = 0; i < r->nready; i++) {
        int c = r->ready[i];
        struct copy *cp = &r->cp[c];
        if (cp->state != C_READY)
            continue; /* abandoned after it finished */
        if (!(dirs & 1 << cp->dir) || (size_t)c < from) {
            r->ready[keep++] = c; /* another window's */
            continue;
        }
        r->nready_dir[cp->dir]--;
        cost += commit_one(r, cp);
    }
    r->nready = keep;
    tally(r)->work_ns += cost;
    tally(r)->windows++;
    tally(r)->win[kind]++;
    return advance(r, r->now + cost);
}

int commit_all(struct run *r)
{
    return commit_window(r, 1 << H2D | 1 << D2H, 0, W_PREFETCH);
}

/* Every prefetch in flight committed, as the library's sh_sched commit_all
 * does (sh_pool_prefetch_commit with all set): the window waits for them. */
static int commit_prefetches(struct run *r)
{
    while (r->issued[H2D].n && !r->failed) /* one link a direction: in order */
        if (advance(r, r->cp[r->issued[H2D].v[r->issued[H2D].head]].done_ns))
            return SH_EINVAL;
    return r->failed ? SH_EINVAL : commit_window(r, 1 << H2D, 0, W_PREFETCH);
}

int any_ready(const struct run *r, int dir)
{
    return r->nready_dir[dir] > 0;
}

int reserve_buf(struct run *r, size_t n)
{
    if (n <= r->capbuf)
        return 0;
    uint64_t *b = realloc(r->buf, n * sizeof *b);
    if (!b)
        return run_fail(r, "out of memory");
    r->buf = b;
    r->capbuf = n;
    return 0;
}

int evict_list(struct run *r, const uint64_t *ids, size_t n, int demand)
{
    for (size_t i = 0; i < n && !r->failed; i++) {
        size_t g = reg_of(r, ids[i]);
        if (g == SIZE_MAX || r->reg[g].res != SH_RES_DEVICE)
            return run_fail(r, "policy chose region %llu, which is not resident",
                            (unsigned long long)ids[i]);
        if (!r->reg[g].live) {
            /* a freed region: its memory goes back without a copy */
            r->used -= r->reg[g].bytes;
            continue;
        }
        start_copy(r, g, D2H, demand);
    }
    return r->failed ? SH_EINVAL : 0;
}

static int busy(const struct run *r, int dir)
{
    return (int)(r->queued[dir].n + r->issued[dir].n);
}

/* ---- a decision point's moves, on the model (the engine's ops) ---- */

size_t sim_evicted_ready(void *ctx)
{
    return (size_t)any_ready(ctx, D2H);
}

/* Finished early evictions, in a window. */
int sim_commit_evicted(void *ctx)
{
    return commit_window(ctx, 1 << D2H, 0, W_EARLY);
}

/* The device bytes a plan counts, as the library's sh_sched_read: the
 * regions', and with the watermarks auto the room kept beside the pool. */
static uint64_t plan_dev(struct run *r)
{
    return r->used + r->held + sh_engine_reserve_recent(&r->eng, r->used + r->own, 0);
}

void sim_read(void *ctx, struct sh_engine_plan_in *in)
{
    struct run *r = ctx;
    *in = (struct sh_engine_plan_in){.dev = plan_dev(r),
                                     .fetching = (size_t)busy(r, H2D),
                                     .evicting = (size_t)busy(r, D2H),
                                     .fetched = r->nready_dir[H2D]};
}

/* The library starts an early eviction only for a region nothing it knows
 * of may still be running on (pool/early.c's ev_idle): under a
 * whole-device drain, one no launch used since the last window; tracked,
 * also one whose stream has moved on, which the model's launches, run one
 * at a time, take to be any but the last. The others stay (tracked) or
 * have the device drained first (drain_for_early). */
static int idle(const struct run *r, const struct sreg *s)
{
    return s->issued <= r->drained || (!r->sp->drain_copies && s->issued < r->clock);
}

/* pool/early.c's sh_pool_evict_drain: an early eviction that cannot start
 * for a launch since the last window drains the device now (the copies on
 * the link too) rather than wait for the next window. Not when tracked. */
static int drain_for_early(struct run *r, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n && r->sp->drain_copies; i++) {
        size_t g = reg_of(r, ids[i]);
        if (g != SIZE_MAX && r->reg[g].res == SH_RES_DEVICE && !idle(r, &r->reg[g]))
            return drain(r);
    }
    return 0;
}

int sim_start_evictions(void *ctx, const uint64_t *ids, size_t n)
{
    struct run *r = ctx;
    if (drain_for_early(r, ids, n))
        return SH_EINVAL;
    for (size_t i = 0; i < n && !r->failed; i++) {
        size_t g = reg_of(r, ids[i]);
        if (g != SIZE_MAX && !idle(r, &r->reg[g]))
            continue;
        if (evict_list(r, &ids[i], 1, 0))
            return SH_EINVAL;
    }
    return r->failed ? SH_EINVAL : 0;
}

int sim_start_fetches(void *ctx, const uint64_t *ids, size_t n)
{
    struct run *r = ctx;
    for (size_t i = 0; i < n; i++) {
        size_t g = reg_of(r, ids[i]);
        if (g == SIZE_MAX || r->reg[g].res != SH_RES_HOST)
            return run_fail(r, "policy fetched region %llu, which is not on the host",
                            (unsigned long long)ids[i]);
        /* as the library's fetches_fitting: what no longer fits waits */
        if (plan_dev(r) + r->own + r->reg[g].bytes > r->eng.cfg.budget)
            break;
        if (r->used + r->held + r->reg[g].bytes > r->sp->vram_bytes)
            return run_fail(r, "policy fetch of region %llu would pass the VRAM size",
                            (unsigned long long)ids[i]);
        if (start_copy(r, g, H2D, 0))
            return SH_EINVAL;
    }
    return 0;
}

int sim_commit_fetched(void *ctx)
{
    return commit_prefetches(ctx);
}

/* A decision point: the engine's (engine/decide.c), as the library's
 * sh_sched_plan() makes it. Eviction under the watermarks is the engine's
 * too, when an allocation or a restore needs room (room.c), as in the
 * library. */
static int decide(struct run *r)
{
    if (reserve_buf(r, r->nreg + 16))
        return SH_EINVAL;
    size_t half = r->capbuf / 2;
    struct sh_policy_plan plan = {
        .fetch = r->buf, .fetch_max = half, .evict = r->buf + half, .evict_max = half};
    uint64_t t0 = sh_clock_ns();
    int rc = sh_engine_decide(&r->eng, r->pol, r->prot, r->nprot, &plan);
    r->policy_ns += sh_clock_ns() - t0;
    if (rc != 0 && !r->failed)
        return run_fail(r, "policy plan failed: %s", sh_strerror(rc));
    return rc ? SH_EINVAL : 0;
}

/* ---- trace events ---- */

static int on_alloc(struct run *r, const struct sh_trace_event *e)
{
    uint64_t t0 = r->now;
    if (room_make(r, e->bytes, NULL, 0))
        return SH_EINVAL;
    if (r->now > t0) {
        tally(r)->alloc_waits++;
        if (r->sp->verbose > 2)
            fprintf(stderr, "    alloc wait %.3f ms at %.4f s: %llu bytes\n",
                    (double)(r->now - t0) / 1e6, (double)t0 / 1e9, (unsigned long long)e->bytes);
    }
    size_t g = r->nreg++;
    r->reg[g] = (struct sreg){.id = e->id, .bytes = e->bytes, .live = 1, .copy = -1};
    if (idmap_put(&r->ids, e->id, g))
        return run_fail(r, "out of memory");
    r->used += e->bytes;
    if (r->used > r->peak)
        r->peak = r->used;
    if (sh_policy_alloc(r->pol, r->now / 1000, e->id, e->bytes, e->stream))
        return run_fail(r, "trace line %u: policy refused allocation %llu", e->line,
                        (unsigned long long)e->id);
    return 0;
}

static int on_free(struct run *r, const struct sh_trace_event *e)
{
    size_t g = reg_of(r, e->id);
    if (g == SIZE_MAX)
        return run_fail(r, "trace line %u: free of unknown region", e->line);
    struct sreg *s = &r->reg[g];
    s->live = 0;
    sim_kept(r, s, 0); /* a free gives the copy back */
    /* As the library does (sh_sched_free): the policy records the free and
     * forgets the region at once, whatever its memory is still doing, so
     * that the id may come back for the next allocation (the pool reuses a
     * freed region's address). A copy in flight is called off. */
    sh_policy_free(r->pol, r->now / 1000, e->id);
    sh_policy_forget(r->pol, e->id);
    if (s->copy >= 0)
        return cancel_copy(r, s);
    if (s->res == SH_RES_DEVICE)
        r->used -= s->bytes;
    return 0;
}

/* A region under eviction is needed: keep the device copy. */
static void abandon_eviction(struct run *r, struct sreg *s)
{
    struct copy *cp = &r->cp[s->copy];
    if (cp->state == C_QUEUED) {
        fifo_remove(&r->queued[D2H], s->copy);
        cp->state = C_DONE;
    } else if (cp->state == C_READY) {
        cp->state = C_DONE; /* stays in the ready list, skipped at commit */
        r->nready_dir[D2H]--;
    } else {
        cp->cancelled = 1;
    }
    s->copy = -1;
    r->evicting -= s->bytes;
    s->res = SH_RES_DEVICE;
    sim_kept(r, s, cp->kept && cp->clean); /* nothing was copied into it: still good */
    sh_policy_residency(r->pol, s->id, SH_RES_DEVICE);
}

/* A prefetch the launch needs (on the link or finished, not committed). */
static int needs_prefetch(const struct run *r, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct sreg *s = &r->reg[reg_of(r, ids[i])];
        if (s->copy >= 0 && r->cp[s->copy].dir == H2D)
            return 1;
    }
    return 0;
}

/* The restores on demand, as sh_pool_restore makes them: one window that
 * drains the device, then copies and waits for them, then remaps. */
static int restore_window(struct run *r, const uint64_t *ids, size_t n, uint64_t *waited_for)
{
    size_t first = r->ncp;
    for (size_t i = 0; i < n && !r->failed; i++) {
        size_t g = reg_of(r, ids[i]);
        if (r->reg[g].res != SH_RES_HOST)
            continue;
        if (r->ncp == first && drain(r)) /* the window opens */
            return SH_EINVAL;
        *waited_for = r->reg[g].id;
        if (start_copy(r, g, H2D, 1))
            return SH_EINVAL;
    }
    if (r->ncp == first)
        return r->failed ? SH_EINVAL : 0;
    for (size_t c = first; c < r->ncp && !r->failed; c++)
        while (r->cp[c].state == C_QUEUED || r->cp[c].state == C_ISSUED)
            if (advance(r, r->cp[next_done(r)].done_ns))
                return SH_EINVAL;
    return r->failed ? SH_EINVAL : commit_window(r, 1 << H2D, first, W_RESTORE);
}

/* The restores on demand when not all of the launch's regions fit: those
 * the engine keeps come back; the others stay on the host. */
static int restore_some(struct run *r, const uint64_t *ids, size_t n, uint64_t *waited_for)
{
    uint64_t *fit = malloc((n ? n : 1) * sizeof *fit);
    if (!fit)
        return run_fail(r, "out of memory");
    size_t nfit = 0;
    int rc = room_some(r, ids, n, fit, &nfit);
    if (rc == 0)
        rc = restore_window(r, fit, nfit, waited_for);
    free(fit);
    return rc;
}

/* Brings the regions of the launch to the device, as the library's launch
 * path does (interpose/launch.c, restore.c): prefetches it needs are
 * committed first (all those in flight, in one window), then room is made
 * for the rest at once, then they are restored; when they cannot all fit,
 * as many as do. Counts the stall. */
static int make_resident(struct run *r, const uint64_t *ids, size_t n)
{
    uint64_t t0 = r->now, waited_for = 0;
    for (size_t i = 0; i < n; i++) {
        struct sreg *s = &r->reg[reg_of(r, ids[i])];
        if (s->res == SH_RES_TO_HOST)
            abandon_eviction(r, s);
    }
    if (needs_prefetch(r, ids, n)) {
        waited_for = ids[0];
        if (commit_prefetches(r))
            return SH_EINVAL;
    }
    int room = room_make(r, 0, ids, n);
    if (room == SH_ENOMEM)
        room = restore_some(r, ids, n, &waited_for);
    else if (room == 0)
        room = restore_window(r, ids, n, &waited_for);
    if (room)
        return SH_EINVAL;
    if (r->now > t0 && r->sp->verbose > 2) {
        fprintf(stderr, "    stall %.3f ms at %.4f s: region %llu\n", (double)(r->now - t0) / 1e6,
                (double)t0 / 1e9, (unsigned long long)waited_for);
    }
    if (r->now > t0) {
        tally(r)->stalls++;
        tally(r)->stall_ns += r->now - t0;
        sh_policy_stall(r->pol, r->now / 1000, waited_for, (r->now - t0) / 1000);
    }
    return 0;
}

static int known_regions(struct run *r, const struct sh_trace_event *e)
{
    for (size_t i = 0; i < e->n; i++)
        if (reg_of(r, e->ids[i]) == SIZE_MAX)
            return run_fail(r, "trace line %u: launch of an unknown region", e->line);
    return 0;
}

/* A launch with `host` bytes of its regions left on the host reads them
 * over the link as it runs: it lasts at least those bytes at the link's
 * bandwidth, and they count as crossing it. */
static uint64_t over_the_bus(struct run *r, uint64_t host, uint64_t dur)
{
    if (host == 0)
        return dur;
    tally(r)->host_launches++;
    tally(r)->h2d += host;
    uint64_t bus = (uint64_t)((double)host * 1e9 / r->sp->pcie_bytes_per_s);
    return bus > dur ? bus : dur;
}

static int on_launch(struct run *r, const struct sh_trace_event *e)
{
    r->prot = e->ids;
    r->nprot = e->n;
    if (known_regions(r, e))
        return SH_EINVAL;
    if (r->sp->verbose > 3) {
        fprintf(stderr, "      launch at %.3f ms:", (double)r->now / 1e6);
        for (size_t k = 0; k < e->n; k++)
            fprintf(stderr, " %llu", (unsigned long long)e->ids[k]);
        fputc('\n', stderr);
    }
    if (make_resident(r, e->ids, e->n))
        return SH_EINVAL;
    /* what it reaches on the host, before the plan made after it moves any */
    uint64_t host = launch_host_bytes(r, e->ids, e->n);
    for (size_t k = 0; k < e->n; k++) /* a kept copy of what it writes goes stale */
        if (sh_trace_writes(e, k))
            r->reg[reg_of(r, e->ids[k])].dirty = 1;
    uint64_t t0 = sh_clock_ns();
    if (sh_policy_launch(r->pol, r->now / 1000, e->kernel, e->stream, e->ids, e->n))
        return run_fail(r, "trace line %u: policy refused the launch", e->line);
    r->launch_ns += sh_clock_ns() - t0;
    r->launches++;
    if (decide(r))
        return SH_EINVAL;
    r->clock++; /* issued: what it names was used since the last drain */
    for (size_t k = 0; k < e->n; k++)
        r->reg[reg_of(r, e->ids[k])].issued = r->clock;
    uint64_t dur = e->dur_us == SH_TRACE_NO_DUR ? r->sp->default_ns : e->dur_us * 1000;
    tally(r)->compute_ns += dur;
    return advance(r, r->now + over_the_bus(r, host, dur));
}

static int on_mark(struct run *r, const struct sh_trace_event *e)
{
    if (!e->marked || r->sp->ignore_marks)
        return 0; /* detected marks are the policy's own business */
    if (e->type == SH_TRACE_STEP)
        return sh_policy_step(r->pol, r->now / 1000);
    return sh_policy_phase(r->pol, r->now / 1000, e->phase);
}

/* ---- the run ---- */

static int set_future(struct run *r)
{
    size_t n = sh_trace_count(r->t);
    struct sh_policy_future *f = calloc(n ? n : 1, sizeof *f);
    if (!f)
        return run_fail(r, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct sh_trace_event *e = sh_trace_at(r->t, i);
        if (e->type == SH_TRACE_ALLOC)
            f[k++] =
                (struct sh_policy_future){.kind = SH_FUTURE_ALLOC, .id = e->id, .bytes = e->bytes};
        else if (e->type == SH_TRACE_FREE)
            f[k++] = (struct sh_policy_future){.kind = SH_FUTURE_FREE, .id = e->id};
        else if (e->type == SH_TRACE_LAUNCH)
            f[k++] = (struct sh_policy_future){.kind = SH_FUTURE_LAUNCH, .ids = e->ids, .n = e->n};
    }
    int rc = sh_policy_set_future(r->pol, f, k);
    free(f);
    return rc ? run_fail(r, "out of memory") : 0;
}

/* --verbose x5, after event i: the device bytes recounted from the regions
 * equal r->used, and no freed region moves still (its copy was called off). */
static int check_held(struct run *r, size_t i, const struct sh_trace_event *e)
{
    uint64_t held = 0;
    for (size_t g = 0; g < r->nreg; g++) {
        const struct sreg *s = &r->reg[g];
        if (!s->live && s->copy >= 0)
            return run_fail(r, "event %zu (type %d): freed region %llu still moves", i, e->type,
                            (unsigned long long)s->id);
        held += s->live && s->res != SH_RES_HOST ? s->bytes : 0;
    }
    if (held != r->used)
        return run_fail(r, "event %zu (type %d): used %llu, regions hold %llu", i, e->type,
                        (unsigned long long)r->used, (unsigned long long)held);
    return 0;
}

static int replay(struct run *r, const size_t *starts, size_t nst)
{
    size_t next = 1;
    r->steps[0].start_ns = 0;
    for (size_t i = 0; i < sh_trace_count(r->t) && !r->failed; i++) {
        if (next < nst && starts[next] == i) {
            r->cur_step = next++;
            tally(r)->start_ns = r->now;
            if (r->sp->verbose > 1) {
                struct sh_policy_stats st;
                sh_policy_stats(r->pol, &st);
                fprintf(stderr,
                        "  policy: step %lld following %d diverged %d matched %llu departed %llu "
                        "recordings %llu\n",
                        (long long)st.step, st.following, st.diverged,
                        (unsigned long long)st.steps_matched, (unsigned long long)st.steps_diverged,
                        (unsigned long long)st.recordings);
            }
        }
        const struct sh_trace_event *e = sh_trace_at(r->t, i);
        r->prot = NULL;
        r->nprot = 0;
        int rc = 0;
        switch (e->type) {
        case SH_TRACE_ALLOC:
            rc = on_alloc(r, e);
            break;
        case SH_TRACE_FREE:
            rc = on_free(r, e);
            break;
        case SH_TRACE_LAUNCH:
            rc = on_launch(r, e);
            break;
        default:
            rc = on_mark(r, e);
            break;
        }
        if (rc)
            return run_fail(r, "trace line %u: replay failed", e->line);
        if (r->sp->verbose > 4 && check_held(r, i, e))
            return SH_EINVAL;
    }
    return r->failed ? SH_EINVAL : 0;
}

static void summarise(struct run *r, size_t nst, struct sim_result *res)
{
    /* step 0 records, step 1 confirms the recording: both are warm-up */
    size_t first = nst > 2 ? 2 : nst - 1, k = nst - first;
    struct tally sum = {0};
    for (size_t s = first; s < nst; s++) {
        uint64_t end = s + 1 < nst ? r->steps[s + 1].start_ns : r->now;
        sum.start_ns += end - r->steps[s].start_ns; /* the step's length */
        sum.h2d += r->steps[s].h2d;
        sum.d2h += r->steps[s].d2h;
        sum.stalls += r->steps[s].stalls;
        sum.stall_ns += r->steps[s].stall_ns;
        sum.alloc_waits += r->steps[s].alloc_waits;
        sum.windows += r->steps[s].windows;
        sum.compute_ns += r->steps[s].compute_ns;
        sum.clean += r->steps[s].clean;
        sum.host_launches += r->steps[s].host_launches;
    }
    res->steps = (int)nst;
    res->step_s = (double)sum.start_ns / 1e9 / (double)k;
    res->compute_s = (double)sum.compute_ns / 1e9 / (double)k;
    res->h2d_bytes = sum.h2d / k;
    res->d2h_bytes = sum.d2h / k;
    res->stalls = (sum.stalls + k / 2) / k;
    res->stall_s = (double)sum.stall_ns / 1e9 / (double)k;
    res->alloc_waits = (sum.alloc_waits + k / 2) / k;
    res->windows = (sum.windows + k / 2) / k;
    res->clean = (sum.clean + k / 2) / k;
    res->host_launches = (sum.host_launches + k / 2) / k;
    res->peak_bytes = r->peak;
    res->policy_ns_per_launch = r->launches ? (double)r->policy_ns / (double)r->launches : 0;
    res->launch_ns_per_launch = r->launches ? (double)r->launch_ns / (double)r->launches : 0;
    if (r->sp->verbose) {
        for (size_t s = 0; s < nst; s++) {
            uint64_t end = s + 1 < nst ? r->steps[s + 1].start_ns : r->now;
            fprintf(stderr,
                    "  step %zu: %.4f s, compute %.4f s, h2d %llu, d2h %llu, stalls %llu "
                    "(%.4f s), alloc waits %llu, windows %llu (prefetch %llu, early %llu, "
                    "evict %llu, restore %llu; drains %.4f s, remaps and reads %.4f s), clean "
                    "evictions %llu\n",
                    s, (double)(end - r->steps[s].start_ns) / 1e9,
                    (double)r->steps[s].compute_ns / 1e9, (unsigned long long)r->steps[s].h2d,
                    (unsigned long long)r->steps[s].d2h, (unsigned long long)r->steps[s].stalls,
                    (double)r->steps[s].stall_ns / 1e9, (unsigned long long)r->steps[s].alloc_waits,
                    (unsigned long long)r->steps[s].windows,
                    (unsigned long long)r->steps[s].win[W_PREFETCH],
                    (unsigned long long)r->steps[s].win[W_EARLY],
                    (unsigned long long)r->steps[s].win[W_EVICT],
                    (unsigned long long)r->steps[s].win[W_RESTORE],
                    (double)r->steps[s].drain_ns / 1e9, (double)r->steps[s].work_ns / 1e9,
                    (unsigned long long)r->steps[s].clean);
        }
    }
}

static void cleanup(struct run *r)
{
    room_destroy(r);
    sh_policy_destroy(r->pol);
    sh_map_free(&r->ids);
    free(r->reg);
    free(r->cp);
    for (int d = 0; d < 2; d++) {
        free(r->queued[d].v);
        free(r->issued[d].v);
    }
    free(r->steps);
    free(r->buf);
    free(r->ready);
}

int sim_run(const struct sh_trace *t, const struct sim_params *sp,
            const struct sh_policy_params *pp, struct sim_result *res)
{
    memset(res, 0, sizeof *res);
    struct run r = {
        .t = t, .sp = sp, .kind = pp->kind, .err = res->error, .errlen = sizeof res->error};
    room_init(&r, pp);
    size_t *starts = NULL, nst = 0;
    size_t nalloc = 0;
    for (size_t i = 0; i < sh_trace_count(t); i++)
        nalloc += sh_trace_at(t, i)->type == SH_TRACE_ALLOC;
    int rc = sim_step_starts(t, &starts, &nst);
    if (!rc)
        rc = sh_policy_create(pp, &r.pol);
    if (!rc) {
        r.reg = calloc(nalloc ? nalloc : 1, sizeof *r.reg);
        r.steps = calloc(nst, sizeof *r.steps);
        rc = r.reg && r.steps ? 0 : SH_ENOMEM;
    }
    if (rc) {
        snprintf(res->error, sizeof res->error, "cannot start: %d", rc);
    } else if (pp->kind == SH_POLICY_BELADY && set_future(&r)) {
        rc = SH_ENOMEM;
    } else if (replay(&r, starts, nst) == 0) {
        summarise(&r, nst, res);
    } else {
        rc = SH_EINVAL;
    }
    free(starts);
    cleanup(&r);
    return rc;
}
