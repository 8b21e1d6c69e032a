/* drv_stream.c — streams (events are in drv_event.c).
 *
 * Every stream runs its queue in order on its own worker thread. Each op gets
 * a ticket; a stream's `completed` is the ticket of its last finished op, so
 * "has the stream passed this point" is one comparison. Streams belong to a
 * context, and so to its device; each context (a device's primary one, or
 * one the program created) has its own legacy default stream, which waits
 * for all that context's blocking streams while they wait for it, as on a
 * GPU, and each thread its own per-thread stream in each context. A
 * context's synchronisation waits for its own streams only.
 *
 * Locking: submit_mu serialises submissions (tickets and the legacy barriers
 * are taken together) and guards the stream list and each stream's state
 * (magic); each stream's mu guards its queue and counters. Stream structs
 * are never returned to malloc: destroyed ones are marked dead and reused,
 * so a stale handle is detected, never dereferenced freed.
 *
 * A stream's life: live (STREAM_MAGIC) until cuStreamDestroy, which returns
 * at once; dying (STREAM_DYING) while its detached worker finishes the queued
 * work; free (0) once the worker has let go of the struct, when
 * create_stream may claim it (STREAM_CLAIMED) and bring it back to life.
 * A claimed struct's fields are rewritten under submit_mu, before it is live
 * again. Tickets are never reset, so a wait on a dead stream's ticket stays
 * true after reuse.
 */
#include "sim.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_MAGIC   0x5354524du
#define STREAM_DYING   0x44594e47u
#define STREAM_CLAIMED 0x434c4d44u

struct sim_stream {
    unsigned magic;
    bool legacy;
    bool per_thread;
    atomic_int dev; /* rewritten when a dead struct is reused */
    int ctx;        /* the context's index (sim_ctx_index); likewise */
    unsigned flags;
    int priority;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sim_op *head, *tail;
    uint64_t submitted, completed;
    bool stop;
    pthread_t thread;
    struct sim_stream *next_all;
    struct sim_graph *capture; /* non-NULL while capturing */
    bool capture_invalid;
};

static pthread_mutex_t submit_mu = PTHREAD_MUTEX_INITIALIZER;
static int capturing[SIM_MAX_DEVICES]; /* streams capturing now; submit_mu */
static struct sim_stream *all_streams; /* live and dead, for barriers and sync */
static struct sim_stream legacy_streams[SIM_MAX_DEVICES];
static _Atomic(struct sim_stream *) created_legacy[SIM_MAX_CTX]; /* created contexts' */
static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;

/* The calling thread's per-thread streams, one per context. */
struct per_thread {
    struct sim_stream *s[SIM_MAX_CTX];
};
static _Thread_local struct per_thread *per_thread;

/* ---- workers ---- */

static void run_op(void *arg)
{
    struct sim_op *op = arg;
    op->run(op);
}

static void *worker(void *arg)
{
    struct sim_stream *s = arg;
    sim_set_running_device(s->dev); /* a fault here is this device's */
    prctl(PR_SET_TIMERSLACK, 1UL);  /* modelled times are slept: to the microsecond, not 50 */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        struct sim_op *op = s->head;
        pthread_mutex_unlock(&s->mu);
        if (!op) {
            /* Stopped and drained: the last touch of s, which may then be
             * reused (the thread is detached). */
            pthread_mutex_lock(&submit_mu);
            s->magic = 0;
            pthread_mutex_unlock(&submit_mu);
            return NULL;
        }
        for (int i = 0; i < op->nwaits; i++)
            sim_stream_wait_ticket(op->waits[i].stream, op->waits[i].ticket);
        if (!sim_device_faulted(s->dev) && op->run) /* a faulted context runs nothing more */
            sim_guarded(run_op, op, "stream work");
        pthread_mutex_lock(&s->mu);
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->completed = op->ticket;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (op->fini)
            op->fini(op);
    }
}

static int stream_start(struct sim_stream *s, int ctx, bool legacy, unsigned flags, int priority)
{
    s->magic = STREAM_MAGIC;
    s->legacy = legacy;
    s->ctx = ctx;
    s->dev = sim_ctx_device(sim_ctx_handle(ctx));
    s->flags = flags;
    s->priority = priority;
    s->head = s->tail = NULL;
    s->stop = false;
    s->submitted = s->completed = 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        s->magic = 0;
        return -1;
    }
    pthread_mutex_lock(&submit_mu);
    s->next_all = all_streams;
    all_streams = s;
    pthread_mutex_unlock(&submit_mu);
    return 0;
}

static void legacy_init(void)
{
    for (int d = 0; d < sim_cfg.ndevices; d++)
        if (stream_start(&legacy_streams[d], d, true, 0, 0) != 0) {
            fprintf(stderr, "simcuda: cannot start the default stream's worker\n");
            abort();
        }
}

/* Retires a live stream without waiting: its worker finishes the queued
 * work, then frees the struct for reuse. False if s was not live. */
static bool stream_retire(struct sim_stream *s)
{
    pthread_mutex_lock(&submit_mu);
    bool live = s->magic == STREAM_MAGIC;
    if (live) {
        s->magic = STREAM_DYING;
        pthread_detach(s->thread);
    }
    pthread_mutex_unlock(&submit_mu);
    if (!live)
        return false;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return true;
}

static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;

static void per_thread_exit(void *arg)
{
    struct per_thread *pt = arg;
    for (int c = 0; c < SIM_MAX_CTX; c++)
        if (pt->s[c])
            stream_retire(pt->s[c]);
    free(pt);
}

static void per_thread_key_init(void)
{
    pthread_key_create(&per_thread_key, per_thread_exit);
}

static struct sim_stream *per_thread_stream(int ctx)
{
    if (!per_thread) {
        pthread_once(&per_thread_once, per_thread_key_init);
        per_thread = calloc(1, sizeof *per_thread);
        if (!per_thread)
            return NULL;
        pthread_setspecific(per_thread_key, per_thread);
    }
    if (!per_thread->s[ctx]) {
        struct sim_stream *s = calloc(1, sizeof *s);
        if (!s)
            return NULL;
        s->per_thread = true; /* never claimed for reuse while the thread lives */
        if (stream_start(s, ctx, false, CU_STREAM_DEFAULT, 0) != 0) {
            free(s);
            return NULL;
        }
        per_thread->s[ctx] = s;
    }
    return per_thread->s[ctx];
}

/* A context's legacy stream; NULL for one destroyed. */
static struct sim_stream *legacy_of(int ctx)
{
    return ctx < SIM_MAX_DEVICES ? &legacy_streams[ctx] : atomic_load(&created_legacy[ctx]);
}

struct sim_stream *sim_stream_get(CUstream h)
{
    pthread_once(&legacy_once, legacy_init);
    int ctx = sim_ctx_current_index();
    if (h == NULL || h == CU_STREAM_LEGACY)
        return legacy_of(ctx);
    if (h == CU_STREAM_PER_THREAD)
        return sim_ctx_destroyed(sim_ctx_handle(ctx)) ? NULL : per_thread_stream(ctx);
    struct sim_stream *found = NULL;
    pthread_mutex_lock(&submit_mu);
    for (struct sim_stream *s = all_streams; s; s = s->next_all)
        if ((CUstream)s == h && s->magic == STREAM_MAGIC)
            found = s;
    pthread_mutex_unlock(&submit_mu);
    return found;
}

int sim_stream_device(const struct sim_stream *s)
{
    return s->dev;
}

int sim_stream_ctx(const struct sim_stream *s)
{
    return s->ctx;
}

static uint64_t submitted(struct sim_stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t t = s->submitted;
    pthread_mutex_unlock(&s->mu);
    return t;
}

CUresult sim_op_add_wait(struct sim_op *op, struct sim_stream *s, uint64_t ticket)
{
    if (ticket == 0)
        return CUDA_SUCCESS;
    struct sim_wait *w = realloc(op->waits, (size_t)(op->nwaits + 1) * sizeof *w);
    if (!w)
        return CUDA_ERROR_OUT_OF_MEMORY;
    w[op->nwaits++] = (struct sim_wait){s, ticket};
    op->waits = w;
    return CUDA_SUCCESS;
}

/* Live or destroyed with work still queued: the stream's flags are stable
 * and its work still counts. submit_mu held. */
static bool in_use(const struct sim_stream *t)
{
    return t->magic == STREAM_MAGIC || t->magic == STREAM_DYING;
}

/* The implicit legacy-stream ordering within s's context (with the work a
 * destroyed blocking stream still has queued too); submit_mu held. */
static CUresult add_barriers(struct sim_stream *s, struct sim_op *op)
{
    if (s->legacy) {
        for (struct sim_stream *t = all_streams; t; t = t->next_all)
            if (t != s && t->ctx == s->ctx && in_use(t) && !(t->flags & CU_STREAM_NON_BLOCKING))
                if (sim_op_add_wait(op, t, submitted(t)))
                    return CUDA_ERROR_OUT_OF_MEMORY;
        return CUDA_SUCCESS;
    }
    if (s->flags & CU_STREAM_NON_BLOCKING)
        return CUDA_SUCCESS;
    struct sim_stream *l = legacy_of(s->ctx);
    return l ? sim_op_add_wait(op, l, l->submitted) : CUDA_SUCCESS;
}

/* Invalidates every capture in progress on dev (global capture mode);
 * submit_mu held. */
static void invalidate_captures(int dev)
{
    for (struct sim_stream *t = all_streams; t; t = t->next_all)
        if (t->capture && t->dev == dev)
            t->capture_invalid = true;
}

/* Diverts op into s's capture; submit_mu held. */
static CUresult capture_op(struct sim_stream *s, struct sim_op *op, uint64_t *ticket)
{
    if (ticket)
        *ticket = 0; /* captured work has no place in the stream */
    if (op->capture == SIM_CAP_REFUSE) {
        s->capture_invalid = true;
        if (op->fini)
            op->fini(op);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (op->capture == SIM_CAP_DROP || s->capture_invalid) {
        if (op->fini)
            op->fini(op);
        return s->capture_invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    }
    free(op->waits);
    op->waits = NULL;
    op->nwaits = 0;
    return sim_graph_append(s->capture, op);
}

CUresult sim_stream_submit(struct sim_stream *s, struct sim_op *op, uint64_t *ticket)
{
    pthread_mutex_lock(&submit_mu);
    if (s->capture) {
        CUresult c = capture_op(s, op, ticket);
        pthread_mutex_unlock(&submit_mu);
        return c;
    }
    if (capturing[s->dev] > 0 && s->legacy) {
        /* The legacy stream would join the capture implicitly: refused. */
        invalidate_captures(s->dev);
        pthread_mutex_unlock(&submit_mu);
        if (op->fini)
            op->fini(op);
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    CUresult r = add_barriers(s, op);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&s->mu);
        uint64_t t = op->ticket = ++s->submitted;
        op->next = NULL;
        if (s->tail)
            s->tail->next = op;
        else
            s->head = op;
        s->tail = op;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu); /* from here the worker may free op */
        if (ticket)
            *ticket = t;
    }
    pthread_mutex_unlock(&submit_mu);
    if (r != CUDA_SUCCESS && op->fini)
        op->fini(op);
    return r;
}

void sim_stream_wait_ticket(struct sim_stream *s, uint64_t ticket)
{
    pthread_mutex_lock(&s->mu);
    while (s->completed < ticket)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

bool sim_stream_done(struct sim_stream *s, uint64_t ticket)
{
    pthread_mutex_lock(&s->mu);
    bool done = s->completed >= ticket;
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* Waits for what dev's streams (ctx < 0), or context ctx's, have been
 * given so far. */
static void drain_streams(int dev, int ctx, struct sim_stream *list)
{
    /* Streams are only ever prepended, so walking from a snapshot is safe;
     * destroyed streams are on the list too, with whatever they still run. */
    for (struct sim_stream *s = list; s; s = s->next_all)
        if (ctx < 0 ? s->dev == dev : s->ctx == ctx)
            sim_stream_wait_ticket(s, submitted(s));
}

void sim_device_synchronize(int dev)
{
    pthread_once(&legacy_once, legacy_init);
    pthread_mutex_lock(&submit_mu);
    struct sim_stream *list = all_streams;
    pthread_mutex_unlock(&submit_mu);
    drain_streams(dev, -1, list);
}

CUresult sim_ctx_synchronize(void)
{
    int dev = sim_current_device(), ctx = sim_ctx_current_index();
    pthread_once(&legacy_once, legacy_init);
    pthread_mutex_lock(&submit_mu);
    struct sim_stream *list = all_streams;
    if (capturing[dev] > 0) {
        invalidate_captures(dev);
        pthread_mutex_unlock(&submit_mu);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    pthread_mutex_unlock(&submit_mu);
    drain_streams(dev, ctx, list);
    return sim_check();
}

CUresult sim_ctx_open(int ctx)
{
    pthread_once(&legacy_once, legacy_init);
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s || stream_start(s, ctx, true, 0, 0) != 0) {
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_store(&created_legacy[ctx], s);
    return CUDA_SUCCESS;
}

/* Per-thread streams stay with their threads (which retire them at exit):
 * nothing reaches them once the context is destroyed. */
void sim_ctx_close(int ctx)
{
    pthread_mutex_lock(&submit_mu);
    struct sim_stream *list = all_streams;
    pthread_mutex_unlock(&submit_mu);
    drain_streams(-1, ctx, list);
    for (struct sim_stream *t = list; t; t = t->next_all)
        if (t->ctx == ctx && !t->per_thread)
            stream_retire(t);
    atomic_store(&created_legacy[ctx], NULL);
}

/* Synchronising with a capturing stream is an error that ends the capture. */
static CUresult refuse_if_capturing(struct sim_stream *s)
{
    pthread_mutex_lock(&submit_mu);
    bool cap = s->capture != NULL;
    if (cap)
        s->capture_invalid = true;
    pthread_mutex_unlock(&submit_mu);
    return cap ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult sim_capture_begin(struct sim_stream *s)
{
    if (s->legacy)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct sim_graph *g = sim_graph_new();
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&submit_mu);
    CUresult r = CUDA_SUCCESS;
    if (s->capture) {
        r = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        s->capture = g;
        s->capture_invalid = false;
        capturing[s->dev]++;
    }
    pthread_mutex_unlock(&submit_mu);
    if (r != CUDA_SUCCESS)
        free(g);
    return r;
}

CUresult sim_capture_end(struct sim_stream *s, struct sim_graph **out, bool *invalid)
{
    pthread_mutex_lock(&submit_mu);
    struct sim_graph *g = s->capture;
    *invalid = s->capture_invalid;
    if (g) {
        s->capture = NULL;
        capturing[s->dev]--;
    }
    pthread_mutex_unlock(&submit_mu);
    *out = g;
    return g ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
}

CUstreamCaptureStatus sim_capture_status(struct sim_stream *s)
{
    pthread_mutex_lock(&submit_mu);
    CUstreamCaptureStatus st = !s->capture          ? CU_STREAM_CAPTURE_STATUS_NONE
                               : s->capture_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                    : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&submit_mu);
    return st;
}

CUresult sim_capture_query(struct sim_stream *s, CUstreamCaptureStatus *status)
{
    pthread_mutex_lock(&submit_mu);
    bool implicit = s->legacy && capturing[s->dev] > 0;
    pthread_mutex_unlock(&submit_mu);
    if (implicit) /* the legacy stream would join another stream's capture */
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    *status = sim_capture_status(s);
    return CUDA_SUCCESS;
}

/* ---- the stream API ---- */

static CUresult create_stream(const char *api, CUstream *ph, unsigned flags, int priority)
{
    CUresult r = sim_enter(api, true);
    if (r)
        return r;
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&legacy_once, legacy_init);
    /* Clamp to the range the device reports, as the driver does. */
    priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    struct sim_stream *s = NULL;
    pthread_mutex_lock(&submit_mu);
    for (struct sim_stream *t = all_streams; t && !s; t = t->next_all)
        if (t->magic == 0 && !t->legacy && !t->per_thread)
            s = t; /* a destroyed stream whose worker is gone */
    if (s) {
        s->magic = STREAM_CLAIMED; /* ours, but not live until its worker runs */
        s->legacy = false;
        s->dev = sim_current_device();
        s->ctx = sim_ctx_current_index();
        s->flags = flags;
        s->priority = priority;
        s->capture = NULL;
        s->capture_invalid = false;
    }
    pthread_mutex_unlock(&submit_mu);
    if (s) {
        pthread_mutex_lock(&s->mu);
        s->stop = false;
        pthread_mutex_unlock(&s->mu);
        bool started = pthread_create(&s->thread, NULL, worker, s) == 0;
        pthread_mutex_lock(&submit_mu);
        s->magic = started ? STREAM_MAGIC : 0;
        pthread_mutex_unlock(&submit_mu);
        if (!started)
            return CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        s = calloc(1, sizeof *s);
        if (!s || stream_start(s, sim_ctx_current_index(), false, flags, priority) != 0) {
            free(s);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    return create_stream(__func__, ph, flags, 0);
}

SIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    return create_stream(__func__, ph, flags, priority);
}

static bool user_stream(CUstream h, struct sim_stream **out)
{
    *out = NULL;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return false;
    *out = sim_stream_get(h);
    return *out != NULL;
}

SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream h)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s;
    if (!user_stream(h, &s))
        return CUDA_ERROR_INVALID_HANDLE;
    /* cuda.h: with work still queued the call "will return immediately";
     * the work still completes, and the stream is freed after it. */
    return stream_retire(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

void sim_stream_drain(struct sim_stream *s)
{
    sim_stream_wait_ticket(s, submitted(s));
}

SIM_EXPORT CUresult cuStreamSynchronize(CUstream h)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((r = refuse_if_capturing(s)))
        return r;
    sim_stream_wait_ticket(s, submitted(s));
    return sim_check();
}

SIM_EXPORT CUresult cuStreamQuery(CUstream h)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((r = refuse_if_capturing(s)))
        return r;
    return sim_stream_done(s, submitted(s)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuStreamGetPriority(CUstream h, int *priority)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    *priority = s->priority;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned int *flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = s->flags;
    return CUDA_SUCCESS;
}

/* cuda.h: a special handle (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD)
 * names the calling thread's current context, CUDA_ERROR_INVALID_CONTEXT
 * with none; a created stream, the context it was made in. */
SIM_EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *pctx)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        *pctx = sim_ctx_current();
        return *pctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    *pctx = sim_ctx_handle(s->ctx);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *status)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!sim_stream_get(h))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_capture_query(sim_stream_get(h), status);
    return CUDA_SUCCESS;
}

static void op_free(struct sim_op *op)
{
    free(op->waits);
    free(op);
}

struct host_fn_op {
    struct sim_op op;
    CUhostFn fn;
    void *user;
};

static void host_fn_run(struct sim_op *op)
{
    struct host_fn_op *h = (struct host_fn_op *)op;
    h->fn(h->user);
}

SIM_EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *userData)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct host_fn_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *op = (struct host_fn_op){
        .op = {.run = host_fn_run, .fini = op_free}, .fn = fn, .user = userData};
    return sim_stream_submit(s, &op->op, NULL);
}
