/* transfer.h — moving bytes between device and host, and the remap gate.
 *
 * The copy engine queues copies on two dedicated streams (device->host and
 * host->device) through struct sh_copy_ops, keeps at most max_inflight
 * copies per direction, and when a direction is full finalises its oldest
 * copy inline (waits for it) instead of refusing, so the cap bounds PCIe
 * pressure without ever throttling spilling to one copy per step.
 *
 * The remap gate orders remaps against the work the program issues: launch
 * hooks and intercepted copies hold its read side while they issue work; a
 * remap takes the write side, drains the work that may touch the range,
 * unmaps, maps and sets access, then releases it. The read side nests on a
 * thread, so a hooked runtime call that reaches a hooked driver call is fine.
 */
#ifndef SH_TRANSFER_H
#define SH_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

enum sh_dir { SH_D2H = 0, SH_H2D = 1 };

/* Implemented over the CUDA driver in interpose/; fakes in tests. */
struct sh_copy_ops {
    void *ctx;
    /* Queues a copy on the direction's stream; *token identifies it. */
    int (*copy)(void *ctx, int dir, uintptr_t dst, uintptr_t src, size_t n, uint64_t *token);
    int (*done)(void *ctx, uint64_t token); /* 1 once finished */
    int (*wait)(void *ctx, uint64_t token); /* blocks until finished; 0 or SH_EDRIVER */
    void (*forget)(void *ctx, uint64_t token);
    int (*drain)(void *ctx); /* waits for all work on the device */
};

struct sh_xfer_stats {
    uint64_t copies[2], bytes[2];
    uint64_t inline_finalized[2]; /* copies waited for because the cap was reached */
    unsigned max_inflight_seen[2];
    uint64_t drains;
};

struct sh_xfer;

int sh_xfer_create(const struct sh_copy_ops *ops, unsigned max_d2h, unsigned max_h2d,
                   struct sh_xfer **out);
/* Waits for everything in flight, then frees. */
void sh_xfer_destroy(struct sh_xfer *x);
/* Queues one copy, first finalising the oldest in its direction if full. */
int sh_xfer_copy(struct sh_xfer *x, int dir, uintptr_t dst, uintptr_t src, size_t n);
/* Waits for every copy queued so far in dir; the first error, if any. */
int sh_xfer_flush(struct sh_xfer *x, int dir);
/* Completes copies that are already done, without waiting. */
void sh_xfer_poll(struct sh_xfer *x);
/* Per-copy completion. Copies are numbered per direction from 1, in the
 * order queued; each direction's copies run in order on one stream, so a
 * number is reached once it and every copy before it have finished.
 * sh_xfer_last: the number of the last copy queued in dir (0: none yet).
 * sh_xfer_reached: 1 once copies through seq have finished (polls, never
 * waits). sh_xfer_wait_seq: waits until copies through last have finished;
 * SH_EDRIVER if the wait of a copy numbered first..last failed (the engine
 * remembers the latest failure per direction). */
uint64_t sh_xfer_last(struct sh_xfer *x, int dir);
int sh_xfer_reached(struct sh_xfer *x, int dir, uint64_t seq);
int sh_xfer_wait_seq(struct sh_xfer *x, int dir, uint64_t first, uint64_t last);
unsigned sh_xfer_inflight(struct sh_xfer *x, int dir);
/* Changes the caps (the Conductor's hints); takes effect on the next copy. */
void sh_xfer_set_caps(struct sh_xfer *x, unsigned max_d2h, unsigned max_h2d);
int sh_xfer_drain(struct sh_xfer *x);
void sh_xfer_stats(struct sh_xfer *x, struct sh_xfer_stats *st);

/* ---- the remap gate ---- */
struct sh_gate;

int sh_gate_create(struct sh_gate **out);
void sh_gate_destroy(struct sh_gate *g);
/* Read side: issuing work. Nests per thread: only the outermost enter of
 * a thread takes anything, and its leave gives it back (sh_gate_leave's g
 * must be the one gate it took). */
void sh_gate_enter(struct sh_gate *g);
void sh_gate_leave(struct sh_gate *g);
/* The read sides of gates[0..n) as one (work that may touch several
 * devices' memory; n = 0: none), at most SH_GATE_SET_MAX. Every caller
 * gives gates in one order, so that readers never wait in a cycle. */
#define SH_GATE_SET_MAX 16
void sh_gate_enter_set(struct sh_gate *const *gates, unsigned n);
void sh_gate_leave_set(void);
/* Write side: a remap window. Must not be called while holding the read
 * side of any gate (returns SH_EBUSY instead of deadlocking). Writers go
 * before new readers, so a window is never starved by a busy launch loop. */
int sh_gate_lock(struct sh_gate *g);
void sh_gate_unlock(struct sh_gate *g);
/* 1 while the calling thread holds g's read side; _any: any gate's. */
int sh_gate_held(const struct sh_gate *g);
int sh_gate_held_any(void);
/* Windows opened so far. */
uint64_t sh_gate_windows(const struct sh_gate *g);
/* Microseconds windows have been open, in all: no work was issued then. */
uint64_t sh_gate_open_us(const struct sh_gate *g);
/* Threads entering the read side and not yet in (waiting out a window). */
unsigned sh_gate_waiting(const struct sh_gate *g);

#endif
