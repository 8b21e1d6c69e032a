/* engine.c — the copy engine: per-direction queues of in-flight copies with
 * caps and inline finalize.
 *
 * Locking: x->mu guards the queues and counters. Waiting for a copy happens
 * without it (the copy is taken off the queue first), so one thread's
 * finalize never blocks another thread's bookkeeping. A copy being waited
 * for is still in flight: it counts against the cap until its wait returns
 * (x->finished is signalled then).
 */
#include "transfer/transfer.h"

#include "sh_err.h"

#include <pthread.h>
#include <stdlib.h>

#define MAX_INFLIGHT 64

/* Copies are numbered per direction from 1 in the order they are queued.
 * One stream per direction runs them in that order, so once copy s has
 * finished every copy before it has too: `done` is the highest number seen
 * finished, and a number at or below it is complete. */
struct queue {
    uint64_t tokens[MAX_INFLIGHT];
    unsigned head, count, cap;
    unsigned finishing; /* taken off the queue, still being waited for */
    uint64_t popped;    /* number of the last copy taken off the queue */
    uint64_t done;      /* copies up to this number have finished */
    uint64_t failed;    /* number of the latest copy whose wait failed; 0 none */
};

struct sh_xfer {
    struct sh_copy_ops ops;
    pthread_mutex_t mu;
    pthread_cond_t finished;
    struct queue q[2];
    struct sh_xfer_stats st;
};

static unsigned clamp_cap(unsigned cap)
{
    return cap == 0 ? 1 : cap > MAX_INFLIGHT ? MAX_INFLIGHT : cap;
}

int sh_xfer_create(const struct sh_copy_ops *ops, unsigned max_d2h, unsigned max_h2d,
                   struct sh_xfer **out)
{
    if (!ops || !out)
        return SH_EINVAL;
    struct sh_xfer *x = calloc(1, sizeof *x);
    if (!x)
        return SH_ENOMEM;
    x->ops = *ops;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->finished, NULL);
    x->q[SH_D2H].cap = clamp_cap(max_d2h);
    x->q[SH_H2D].cap = clamp_cap(max_h2d);
    *out = x;
    return 0;
}

void sh_xfer_destroy(struct sh_xfer *x)
{
    if (!x)
        return;
    sh_xfer_flush(x, SH_D2H);
    sh_xfer_flush(x, SH_H2D);
    pthread_cond_destroy(&x->finished);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

/* Takes the oldest copy of a direction off its queue; mu held. */
static uint64_t pop(struct queue *q)
{
    uint64_t t = q->tokens[q->head];
    q->head = (q->head + 1) % MAX_INFLIGHT;
    q->count--;
    q->popped++;
    return t;
}

static void finished(struct queue *q, uint64_t seq, int rc)
{
    if (seq > q->done)
        q->done = seq;
    if (rc)
        q->failed = seq;
}

/* Waits for the oldest copy of q; mu held, dropped meanwhile. */
static int finish_oldest(struct sh_xfer *x, struct queue *q)
{
    uint64_t token = pop(q), seq = q->popped;
    q->finishing++;
    pthread_mutex_unlock(&x->mu);
    int rc = x->ops.wait(x->ops.ctx, token);
    x->ops.forget(x->ops.ctx, token);
    pthread_mutex_lock(&x->mu);
    q->finishing--;
    finished(q, seq, rc);
    pthread_cond_broadcast(&x->finished);
    return rc;
}

int sh_xfer_copy(struct sh_xfer *x, int dir, uintptr_t dst, uintptr_t src, size_t n)
{
    if (dir != SH_D2H && dir != SH_H2D)
        return SH_EINVAL;
    struct queue *q = &x->q[dir];
    int rc = 0;
    pthread_mutex_lock(&x->mu);
    while (q->count + q->finishing >= q->cap) {
        if (q->count == 0) {
            /* Other threads are waiting for every copy in flight. */
            pthread_cond_wait(&x->finished, &x->mu);
            continue;
        }
        /* Inline finalize: make room by waiting for the oldest copy. */
        x->st.inline_finalized[dir]++;
        int r = finish_oldest(x, q);
        rc = rc ? rc : r;
    }
    uint64_t token = 0;
    int r = x->ops.copy(x->ops.ctx, dir, dst, src, n, &token);
    if (r == 0) {
        q->tokens[(q->head + q->count) % MAX_INFLIGHT] = token;
        q->count++;
        if (q->count + q->finishing > x->st.max_inflight_seen[dir])
            x->st.max_inflight_seen[dir] = q->count + q->finishing;
        x->st.copies[dir]++;
        x->st.bytes[dir] += n;
    }
    pthread_mutex_unlock(&x->mu);
    return rc ? rc : r;
}

int sh_xfer_flush(struct sh_xfer *x, int dir)
{
    int rc = 0;
    pthread_mutex_lock(&x->mu);
    while (x->q[dir].count > 0) {
        int r = finish_oldest(x, &x->q[dir]);
        rc = rc ? rc : r;
    }
    while (x->q[dir].finishing > 0) /* copies other threads are waiting for */
        pthread_cond_wait(&x->finished, &x->mu);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

void sh_xfer_poll(struct sh_xfer *x)
{
    pthread_mutex_lock(&x->mu);
    for (int d = 0; d < 2; d++) {
        struct queue *q = &x->q[d];
        while (q->count > 0 && x->ops.done(x->ops.ctx, q->tokens[q->head])) {
            x->ops.forget(x->ops.ctx, pop(q));
            finished(q, q->popped, 0);
        }
    }
    pthread_mutex_unlock(&x->mu);
}

uint64_t sh_xfer_last(struct sh_xfer *x, int dir)
{
    pthread_mutex_lock(&x->mu);
    uint64_t seq = x->q[dir].popped + x->q[dir].count;
    pthread_mutex_unlock(&x->mu);
    return seq;
}

int sh_xfer_reached(struct sh_xfer *x, int dir, uint64_t seq)
{
    pthread_mutex_lock(&x->mu);
    int early = x->q[dir].done >= seq;
    pthread_mutex_unlock(&x->mu);
    if (early)
        return 1;
    sh_xfer_poll(x);
    pthread_mutex_lock(&x->mu);
    int done = x->q[dir].done >= seq;
    pthread_mutex_unlock(&x->mu);
    return done;
}

int sh_xfer_wait_seq(struct sh_xfer *x, int dir, uint64_t first, uint64_t last)
{
    struct queue *q = &x->q[dir];
    int rc = 0;
    pthread_mutex_lock(&x->mu);
    while (q->done < last) {
        if (q->count > 0 && q->popped < last)
            finish_oldest(x, q); /* errors are judged by number below */
        else if (q->finishing > 0)
            pthread_cond_wait(&x->finished, &x->mu);
        else
            break; /* never queued: nothing to wait for */
    }
    if (q->failed >= first && q->failed <= last && first <= last)
        rc = SH_EDRIVER;
    pthread_mutex_unlock(&x->mu);
    return rc;
}

unsigned sh_xfer_inflight(struct sh_xfer *x, int dir)
{
    pthread_mutex_lock(&x->mu);
    unsigned n = x->q[dir].count;
    pthread_mutex_unlock(&x->mu);
    return n;
}

void sh_xfer_set_caps(struct sh_xfer *x, unsigned max_d2h, unsigned max_h2d)
{
    pthread_mutex_lock(&x->mu);
    x->q[SH_D2H].cap = clamp_cap(max_d2h);
    x->q[SH_H2D].cap = clamp_cap(max_h2d);
    pthread_mutex_unlock(&x->mu);
}

int sh_xfer_drain(struct sh_xfer *x)
{
    pthread_mutex_lock(&x->mu);
    x->st.drains++;
    pthread_mutex_unlock(&x->mu);
    return x->ops.drain(x->ops.ctx);
}

void sh_xfer_stats(struct sh_xfer *x, struct sh_xfer_stats *st)
{
    pthread_mutex_lock(&x->mu);
    *st = x->st;
    pthread_mutex_unlock(&x->mu);
}
