/* copy.c — the link of stagehand-sim's model: copies queued per
 * direction, issued while the policy's in-flight cap allows (a demand copy
 * always gets a slot), carried one at a time at the link's bandwidth (one
 * link per direction, or one shared), then ready for a remap window.
 *
 * No shared state: everything lives in the run (replay.h).
 */
#include "tools/stagehand-sim/replay.h"

#include "policy/policy.h"
#include "sh_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fifo_push(struct fifo *f, int c, int front)
{
    if (f->head + f->n == f->cap) {
        if (f->head) {
            memmove(f->v, f->v + f->head, f->n * sizeof *f->v);
            f->head = 0;
        } else {
            size_t cap = f->cap ? f->cap * 2 : 64;
            int *v = realloc(f->v, cap * sizeof *v);
            if (!v)
                return SH_ENOMEM;
            f->v = v;
            f->cap = cap;
        }
    }
    if (front) {
        memmove(f->v + f->head + 1, f->v + f->head, f->n * sizeof *f->v);
        f->v[f->head] = c;
    } else {
        f->v[f->head + f->n] = c;
    }
    f->n++;
    return 0;
}

int fifo_pop(struct fifo *f)
{
    int c = f->v[f->head++];
    if (--f->n == 0)
        f->head = 0;
    return c;
}

void fifo_remove(struct fifo *f, int c)
{
    for (size_t i = 0; i < f->n; i++) {
        if (f->v[f->head + i] == c) {
            memmove(f->v + f->head + i, f->v + f->head + i + 1, (f->n - i - 1) * sizeof *f->v);
            f->n--;
            return;
        }
    }
}

static int link_of(const struct run *r, int dir)
{
    return r->sp->shared_link ? 0 : dir;
}

static uint64_t copy_ns(const struct run *r, int dir, uint64_t bytes)
{
    double rate = dir == D2H ? r->sp->d2h_bytes_per_s : r->sp->pcie_bytes_per_s;
    return (uint64_t)((double)bytes / rate * 1e9 + 0.5);
}

/* One fingerprint of the region's bytes on the device. */
static uint64_t fp_ns(const struct run *r, uint64_t bytes)
{
    return (uint64_t)((double)bytes / r->sp->hbm_bytes_per_s * 1e9 + 0.5);
}

/* The copies in flight the engine allows now (the configured caps, or the
 * Conductor's tighter ones), as the library's copy engine is set to. */
static int cap_of(struct run *r, int dir)
{
    unsigned d2h, h2d;
    sh_engine_caps(&r->eng, &d2h, &h2d);
    return (int)(dir == H2D ? h2d : d2h);
}

static void issue(struct run *r, int c)
{
    struct copy *cp = &r->cp[c];
    int l = link_of(r, cp->dir);
    uint64_t start = r->link_free[l] > r->now ? r->link_free[l] : r->now;
    cp->done_ns = start + cp->pre_ns + copy_ns(r, cp->dir, cp->link);
    if (cp->link)
        r->link_free[l] = cp->done_ns;
    cp->state = C_ISSUED;
    if (r->sp->verbose > 3)
        fprintf(stderr, "      %s region %llu %s %.3f..%.3f ms %llu\n",
                cp->dir == H2D ? "h2d" : "d2h", (unsigned long long)r->reg[cp->reg].id,
                cp->demand ? "demand" : "ahead",
                (double)(cp->done_ns - cp->pre_ns - copy_ns(r, cp->dir, cp->link)) / 1e6,
                (double)cp->done_ns / 1e6, (unsigned long long)cp->link);
    fifo_push(&r->issued[cp->dir], c, 0);
    if (cp->dir == H2D)
        tally(r)->h2d += cp->link;
    else
        tally(r)->d2h += cp->link;
}

/* Issues queued copies while slots are free; a demand copy always gets one. */
static void refill(struct run *r, int dir)
{
    while (r->queued[dir].n) {
        int c = r->queued[dir].v[r->queued[dir].head];
        int cap = cap_of(r, dir);
        if (r->cp[c].demand && cap < 1)
            cap = 1;
        if ((int)r->issued[dir].n >= cap)
            return;
        fifo_pop(&r->queued[dir]);
        issue(r, c);
    }
}

static int ready(struct run *r, int c);

int start_copy(struct run *r, size_t g, int dir, int demand)
{
    if (r->ncp == r->capcp) {
        size_t cap = r->capcp ? r->capcp * 2 : 1024;
        struct copy *n = realloc(r->cp, cap * sizeof *n);
        if (!n)
            return run_fail(r, "out of memory");
        r->cp = n;
        r->capcp = cap;
    }
    int c = (int)r->ncp++;
    struct sreg *s = &r->reg[g];
    if (dir == D2H)
        r->own = r->sp->own_bytes; /* the fingerprint and prefilter buffers, set up */
    r->cp[c] =
        (struct copy){.reg = g, .dir = dir, .demand = demand, .bytes = s->bytes, .link = s->bytes};
    if (dir == D2H && !demand) {
        /* An early eviction fingerprints the region at its start and again
         * in its window, where a change no launch made calls it off. The
         * first runs on the copy stream ahead of the copy, or, for a region
         * with a kept copy (which decides at once whether to copy ahead),
         * holds up its planner. */
        r->cp[c].fp_ns = fp_ns(r, s->bytes);
        if (!s->kept)
            r->cp[c].pre_ns = fp_ns(r, s->bytes);
        else if (run_hold(r, fp_ns(r, s->bytes)))
            return SH_EINVAL;
    }
    if (dir == D2H && s->kept) {
        /* The window fingerprints it; a region no launch wrote since its
         * restore needs no copy (the library's clean eviction); an early
         * one found changed at its start copies ahead as usual. (A launch
         * that wrote it after that start used it, and calls the eviction
         * off.) */
        struct copy *cp = &r->cp[c];
        cp->kept = 1;
        cp->clean = !s->dirty;
        cp->link = cp->clean ? 0 : s->bytes;
        cp->fp_ns = fp_ns(r, s->bytes);
        sim_kept(r, s, 0);
    }
    s->copy = c;
    s->res = dir == H2D ? SH_RES_TO_DEVICE : SH_RES_TO_HOST;
    if (dir == H2D)
        r->used += s->bytes; /* the device chunks are taken now */
    else
        r->evicting += s->bytes;
    if (r->used > r->peak)
        r->peak = r->used;
    sh_policy_residency(r->pol, s->id, s->res);
    if (r->cp[c].kept && r->cp[c].clean) { /* nothing to carry: ready for its window */
        r->cp[c].done_ns = r->now;
        return ready(r, c);
    }
    if (fifo_push(&r->queued[dir], c, demand))
        return run_fail(r, "out of memory");
    refill(r, dir);
    return 0;
}

/* The earliest issued copy to finish, or -1. */
int next_done(const struct run *r)
{
    int best = -1;
    for (int d = 0; d < 2; d++) {
        if (!r->issued[d].n)
            continue;
        int c = r->issued[d].v[r->issued[d].head];
        if (best < 0 || r->cp[c].done_ns < r->cp[best].done_ns)
            best = c;
    }
    return best;
}

static int ready(struct run *r, int c)
{
    struct copy *cp = &r->cp[c];
    if (r->nready == r->capready) {
        size_t cap = r->capready ? r->capready * 2 : 64;
        int *v = realloc(r->ready, cap * sizeof *v);
        if (!v)
            return run_fail(r, "out of memory");
        r->ready = v;
        r->capready = cap;
    }
    cp->state = C_READY;
    r->ready[r->nready++] = c;
    r->nready_dir[cp->dir]++;
    return 0;
}

int finish(struct run *r, int c)
{
    struct copy *cp = &r->cp[c];
    fifo_pop(&r->issued[cp->dir]);
    if (cp->cancelled)
        cp->state = C_DONE;
    else if (ready(r, c))
        return SH_EINVAL;
    refill(r, cp->dir);
    return 0;
}

/* A free calls off the region's move in flight, as the library's
 * sh_pool_free does (settle): the freeing thread waits for the copy on the
 * link, if any, and the memory goes back with no window (a region freed
 * is never committed, nor its kept copy compared). */
int cancel_copy(struct run *r, struct sreg *s)
{
    struct copy *cp = &r->cp[s->copy];
    uint64_t t0 = r->now;
    if (cp->state == C_QUEUED)
        fifo_remove(&r->queued[cp->dir], s->copy);
    else if (cp->state == C_ISSUED && advance(r, cp->done_ns))
        return SH_EINVAL;
    if (r->sp->verbose > 3)
        fprintf(stderr, "      free of region %llu calls off its %s (waited %.3f ms)\n",
                (unsigned long long)s->id, cp->dir == H2D ? "restore" : "eviction",
                (double)(r->now - t0) / 1e6);
    if (cp->state == C_READY)
        r->nready_dir[cp->dir]--; /* stays in the ready list, skipped at commit */
    cp->state = C_DONE;
    s->copy = -1;
    if (cp->dir == D2H)
        r->evicting -= s->bytes;
    r->used -= s->bytes;
    return 0;
}
