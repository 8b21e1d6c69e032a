/* drv_event.c — events: a point in a stream, recorded as that stream's
 * ticket, so "has the event happened" is one comparison. An event belongs
 * to the device current when it was made: recording it on another device's
 * stream, or timing two of different devices, is an invalid handle, while
 * querying, synchronising and waiting work across devices (the CUDA
 * Programming Guide's "Stream and Event Behavior"). An event made in a
 * context the program created goes with it: once the context is destroyed
 * its handle is invalid.
 *
 * Locking: event_mu guards the free list; each event's mu guards its
 * record. Event structs are never returned to malloc: destroyed ones are
 * marked dead and reused, so a stale handle is detected, never dereferenced
 * freed.
 */
#include "sim.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define EVENT_MAGIC 0x45564e54u

struct sim_event {
    unsigned magic;
    unsigned flags;
    int dev; /* the device current when it was created */
    int ctx; /* the context's slot, likewise */
    pthread_mutex_t mu;
    struct sim_stream *stream; /* NULL until recorded */
    uint64_t ticket, gen;
    double stamp_us;
    bool stamped;
    struct sim_event *next_free;
    struct sim_event *next_all;
};

static pthread_mutex_t event_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_event *free_events; /* event_mu */
/* Every event made, event_mu: those that went with their context stay
 * reachable (and dead), never freed nor reused. */
static struct sim_event *all_events;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void op_free(struct sim_op *op)
{
    free(op->waits);
    free(op);
}

static struct sim_event *event_get(CUevent h)
{
    struct sim_event *e = (struct sim_event *)h;
    if (!e || e->magic != EVENT_MAGIC || sim_ctx_destroyed(sim_ctx_handle(e->ctx)))
        return NULL;
    return e;
}

SIM_EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!ph || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&event_mu);
    struct sim_event *e = free_events;
    if (e)
        free_events = e->next_free;
    pthread_mutex_unlock(&event_mu);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e)
            return CUDA_ERROR_OUT_OF_MEMORY;
        pthread_mutex_init(&e->mu, NULL);
        pthread_mutex_lock(&event_mu);
        e->next_all = all_events;
        all_events = e;
        pthread_mutex_unlock(&event_mu);
    }
    pthread_mutex_lock(&e->mu);
    e->flags = flags;
    e->dev = sim_current_device();
    e->ctx = sim_ctx_current_index();
    e->stream = NULL;
    e->ticket = 0;
    e->gen++;
    e->stamped = false;
    e->magic = EVENT_MAGIC;
    pthread_mutex_unlock(&e->mu);
    *ph = (CUevent)e;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventDestroy_v2(CUevent h)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_event *e = event_get(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->mu);
    e->magic = 0;
    e->gen++;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&event_mu);
    e->next_free = free_events;
    free_events = e;
    pthread_mutex_unlock(&event_mu);
    return CUDA_SUCCESS;
}

struct record_op {
    struct sim_op op;
    struct sim_event *event;
    uint64_t gen;
};

static void record_run(struct sim_op *op)
{
    struct record_op *ro = (struct record_op *)op;
    struct sim_event *e = ro->event;
    pthread_mutex_lock(&e->mu);
    if (e->gen == ro->gen) {
        e->stamp_us = now_us();
        e->stamped = true;
    }
    pthread_mutex_unlock(&e->mu);
}

static CUresult event_record(const char *api, CUevent h, CUstream hs, unsigned flags)
{
    CUresult r = sim_enter(api, true);
    if (r)
        return r;
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *e = event_get(h);
    struct sim_stream *s = sim_stream_get(hs);
    /* cuda.h: "event and stream must be on the same CUDA context" */
    if (!e || !s || e->dev != sim_stream_device(s))
        return CUDA_ERROR_INVALID_HANDLE;
    struct record_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->op.run = record_run;
    op->op.fini = op_free;
    op->op.size = sizeof *op;
    op->op.capture = SIM_CAP_DROP; /* a linear capture needs no event nodes */
    op->event = e;
    /* The event now stands for this point of this stream. Hold e->mu across
     * the submission so a concurrent query never sees the new generation
     * paired with the old ticket. */
    pthread_mutex_lock(&e->mu);
    op->gen = ++e->gen;
    e->stamped = false;
    uint64_t ticket = 0;
    r = sim_stream_submit(s, &op->op, &ticket);
    if (r == CUDA_SUCCESS) {
        e->stream = s;
        e->ticket = ticket;
    }
    pthread_mutex_unlock(&e->mu);
    return r;
}

SIM_EXPORT CUresult cuEventRecord(CUevent h, CUstream hs)
{
    return event_record(__func__, h, hs, 0);
}

SIM_EXPORT CUresult cuEventRecordWithFlags(CUevent h, CUstream hs, unsigned int flags)
{
    return event_record(__func__, h, hs, flags);
}

/* Where the event stands: its stream and ticket (stream NULL if never recorded). */
static void event_point(struct sim_event *e, struct sim_stream **s, uint64_t *ticket)
{
    pthread_mutex_lock(&e->mu);
    *s = e->stream;
    *ticket = e->ticket;
    pthread_mutex_unlock(&e->mu);
}

SIM_EXPORT CUresult cuEventQuery(CUevent h)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_event *e = event_get(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s;
    uint64_t t;
    event_point(e, &s, &t);
    return !s || sim_stream_done(s, t) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuEventSynchronize(CUevent h)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_event *e = event_get(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s;
    uint64_t t;
    event_point(e, &s, &t);
    if (s)
        sim_stream_wait_ticket(s, t);
    return sim_check();
}

SIM_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_event *a = event_get(start), *b = event_get(end);
    if (!a || !b)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING || a->dev != b->dev)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *sa, *sb;
    uint64_t ta, tb;
    event_point(a, &sa, &ta);
    event_point(b, &sb, &tb);
    if (!sa || !sb)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!sim_stream_done(sa, ta) || !sim_stream_done(sb, tb))
        return CUDA_ERROR_NOT_READY;
    pthread_mutex_lock(&a->mu);
    double t0 = a->stamp_us;
    bool ok = a->stamped;
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_lock(&b->mu);
    double t1 = b->stamp_us;
    ok = ok && b->stamped;
    pthread_mutex_unlock(&b->mu);
    if (!ok)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((t1 - t0) / 1e3);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamWaitEvent(CUstream hs, CUevent h, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(hs);
    struct sim_event *e = event_get(h);
    if (!s || !e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *es;
    uint64_t t;
    event_point(e, &es, &t);
    if (!es || es == s)
        return CUDA_SUCCESS; /* nothing to wait for, or already in order */
    struct sim_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->fini = op_free;
    op->size = sizeof *op;
    op->capture = SIM_CAP_DROP;
    if ((r = sim_op_add_wait(op, es, t))) {
        free(op);
        return r;
    }
    return sim_stream_submit(s, op, NULL);
}
