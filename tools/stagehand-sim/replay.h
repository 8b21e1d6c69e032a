/* replay.h — the state of one replay (replay.c), shared with the link
 * model that issues and finishes its copies (copy.c). Private to
 * stagehand-sim. No shared state: everything lives in one struct per run.
 */
#ifndef SH_SIM_REPLAY_H
#define SH_SIM_REPLAY_H

#include "clean/clean.h"
#include "engine/engine.h"
#include "tools/stagehand-sim/sim.h"

#include <stddef.h>
#include <stdint.h>

enum { H2D = 0, D2H = 1 };
enum { C_QUEUED, C_ISSUED, C_READY, C_DONE };
/* Remap windows by what opens them, as the library opens them: a launch
 * that needs a prefetch, early evictions committed, a synchronous eviction,
 * restores on demand. */
enum { W_PREFETCH, W_EARLY, W_EVICT, W_RESTORE, W_KINDS };

struct sreg {
    uint64_t id, bytes;
    int live;        /* allocated and not freed */
    int res;         /* enum sh_policy_residency, as the policy was told */
    int copy;        /* active copy, -1 for none */
    uint64_t seen;   /* run.stamp when last counted */
    uint64_t issued; /* run.clock of the last launch that named it */
    /* clean_skip: a host copy is kept since the last restore; a launch
     * wrote the region since; what its evictions taught (clean.h). */
    int kept, dirty;
    struct sh_clean_learn learn;
};

struct copy {
    size_t reg;
    int dir, state, cancelled, demand;
    uint64_t bytes, done_ns;
    uint64_t link;   /* bytes over the link: 0 for a clean eviction */
    uint64_t fp_ns;  /* fingerprints in its commit window */
    uint64_t pre_ns; /* fingerprints queued ahead of it on its stream */
    int kept, clean; /* an eviction that took a kept copy, and found it clean */
};

/* A FIFO of copy indices. */
struct fifo {
    int *v;
    size_t head, n, cap;
};

struct run {
    const struct sh_trace *t;
    const struct sim_params *sp;
    struct sh_policy *pol;
    struct sh_engine eng; /* the library's watermarks, hints and room chain (room.c) */
    int kind;
    struct sh_map ids;
    struct sreg *reg;
    size_t nreg;
    struct copy *cp;
    size_t ncp, capcp;
    struct fifo queued[2], issued[2];
    int *ready; /* copies finished, waiting for a remap window */
    size_t nready, capready, nready_dir[2];
    uint64_t link_free[2];
    uint64_t now;
    uint64_t used, peak;
    uint64_t evicting; /* bytes under an eviction not yet committed */
    uint64_t held;     /* room an allocation waits for: no plan restores into it */
    uint64_t stamp;    /* marks a launch's regions as counted (sreg.seen) */
    uint64_t own;      /* the library's own device bytes (sim_params.own_bytes, once used) */
    uint64_t clock;    /* launches issued */
    uint64_t drained;  /* clock at the last window that waited for the whole device */
    /* the launch being issued or running */
    const uint64_t *prot;
    size_t nprot;
    /* per-step tallies, indexed by step */
    struct tally {
        uint64_t start_ns, h2d, d2h, stalls, stall_ns, alloc_waits, windows, compute_ns, clean;
        uint64_t host_launches;     /* launches that ran with regions left on the host */
        uint64_t drain_ns, work_ns; /* windows: waiting for copies, then remaps and reads */
        uint64_t win[W_KINDS];      /* windows by kind */
    } * steps;
    size_t nsteps, cur_step;
    uint64_t policy_ns, launch_ns, launches;
    uint64_t *buf; /* scratch for victim and plan lists */
    size_t capbuf;
    char *err;
    size_t errlen;
    int failed;
};

/* Keeps the first error in the run's message; returns SH_EINVAL. */
__attribute__((format(printf, 2, 3))) int run_fail(struct run *r, const char *fmt, ...);

static inline struct tally *tally(struct run *r)
{
    return &r->steps[r->cur_step];
}

/* The host waits ns (copies go on meanwhile). */
int run_hold(struct run *r, uint64_t ns);
/* Waits for the next copy to finish, committing finished evictions. */
int wait_one(struct run *r);
/* Moves the clock to t, finishing the copies due by then. */
int advance(struct run *r, uint64_t t);
/* A window's drain: with drain_mode = device, every copy in flight ends. */
int drain(struct run *r);
/* Whether s keeps a host copy; the policy is told, as the library tells it. */
void sim_kept(struct run *r, struct sreg *s, int kept);
/* One remap window (drain, remap): the finished copies of the directions
 * in the mask dirs (1 << H2D, 1 << D2H) numbered from `from` on take
 * effect, as the library's windows commit only their own kind. */
int commit_window(struct run *r, int dirs, size_t from, int kind);
/* One remap window (a prefetch window): every finished copy takes effect. */
int commit_all(struct run *r);
int any_ready(const struct run *r, int dir);
int reserve_buf(struct run *r, size_t n);
/* Starts the eviction of each region listed (a freed one is released). */
int evict_list(struct run *r, const uint64_t *ids, size_t n, int demand);

/* A decision point's moves on the model: the engine's ops (engine.h). */
struct sh_engine_plan_in;
size_t sim_evicted_ready(void *ctx);
int sim_commit_evicted(void *ctx);
void sim_read(void *ctx, struct sh_engine_plan_in *in);
int sim_start_evictions(void *ctx, const uint64_t *ids, size_t n);
int sim_start_fetches(void *ctx, const uint64_t *ids, size_t n);
int sim_commit_fetched(void *ctx);

/* ---- the engine over the model (room.c) ---- */
struct sh_policy_params;
void room_init(struct run *r, const struct sh_policy_params *pp);
void room_destroy(struct run *r);
/* Makes room through the engine, waiting for copies if it must, for an
 * allocation of `bytes` (ids NULL; it holds the room while it waits; fails
 * the run when it cannot fit), or for the regions ids[0..n) that are on
 * the host (SH_ENOMEM when they cannot all fit: room_some). */
int room_make(struct run *r, uint64_t bytes, const uint64_t *ids, size_t n);
/* The bytes of the regions ids[0..n) on the host, each counted once. */
uint64_t launch_host_bytes(struct run *r, const uint64_t *ids, size_t n);
/* When a launch's regions on the host cannot all fit: those that can, as
 * the engine picks them for the library (sh_engine_resident), to
 * fit[0..*nfit) (room for n); the launch reaches the others over the bus. */
int room_some(struct run *r, const uint64_t *ids, size_t n, uint64_t *fit, size_t *nfit);

/* ---- FIFOs of copy indices and the link (copy.c) ---- */
int fifo_push(struct fifo *f, int c, int front);
int fifo_pop(struct fifo *f);
void fifo_remove(struct fifo *f, int c);
/* Starts a copy of region g (a demand one goes first); its device memory is
 * taken now for a restore, counted as evicting for an eviction. */
int start_copy(struct run *r, size_t g, int dir, int demand);
/* The earliest issued copy to finish, or -1. */
int next_done(const struct run *r);
/* Copy c left the link: ready for a remap window, unless cancelled. */
int finish(struct run *r, int c);
/* The program freed s: its copy in flight is called off, as the library's
 * free does (waiting for it if it is on the link). */
int cancel_copy(struct run *r, struct sreg *s);

#endif
