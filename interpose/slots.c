/* slots.c — drain_mode = tracked: the streams that used each region.
 *
 * Each stream that issues work on regions gets a slot (up to 63) and an
 * event; the work's issue re-records the slot's event on its stream, and a
 * region remembers the slots that used it (a bit mask). A remap window then
 * waits for those events only, not for the whole device. Work that names no
 * region re-records its stream's event too (interpose/launch.c): it may
 * write one through a pointer no scan saw, and the stream's event must mark
 * the end of everything issued on it. Bit 63 names work on a stream
 * without a slot: its drain waits for the whole device.
 *
 * Locking: slots_mu guards the slots. A slot's event is read without it by
 * the launch that records it, whose stream's context cannot be destroyed
 * meanwhile.
 */
#include "interpose/interpose.h"

#include <pthread.h>

#define STREAM_SLOTS 63         /* bit 63: a stream without a slot; drain the device */
#define DEAD_KEY     UINT64_MAX /* a slot of a destroyed context: no stream matches */

static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t slot_key[STREAM_SLOTS];  /* sh_stream_key of the slot's stream */
static CUevent slot_event[STREAM_SLOTS]; /* NULL once its context is destroyed */
static CUcontext slot_ctx[STREAM_SLOTS]; /* the context the event was made in */
static int nslots;

/* An event for stream s: made in s's context, or recording it there fails
 * (and the drain falls back to waiting for the whole device). */
static CUresult slot_event_create(CUstream s, CUevent *ev, CUcontext *made_in)
{
    const struct sh_driver *d = &sh_rt.drv;
    CUcontext c = NULL, popped;
    if (!d->several || d->cuStreamGetCtx(s, &c) != CUDA_SUCCESS || !c ||
        d->cuCtxPushCurrent(c) != CUDA_SUCCESS) {
        if (d->cuCtxGetCurrent(made_in) != CUDA_SUCCESS)
            *made_in = NULL;
        return d->cuEventCreate(ev, CU_EVENT_DISABLE_TIMING);
    }
    *made_in = c;
    CUresult r = d->cuEventCreate(ev, CU_EVENT_DISABLE_TIMING);
    d->cuCtxPopCurrent(&popped);
    return r;
}

/* The slot of a stream, made on first sight; 63 when they are all taken.
 * Keyed by identity: every thread's per-thread stream has its own slot, or
 * one thread's launch would re-record the event another's work is behind. */
static int stream_slot(CUstream s)
{
    uint64_t key = sh_stream_key(s);
    pthread_mutex_lock(&slots_mu);
    int i = 0;
    while (i < nslots && slot_key[i] != key)
        i++;
    if (i == nslots && nslots < STREAM_SLOTS &&
        slot_event_create(s, &slot_event[i], &slot_ctx[i]) == CUDA_SUCCESS)
        slot_key[nslots++] = key;
    pthread_mutex_unlock(&slots_mu);
    return i < nslots ? i : STREAM_SLOTS;
}

uint64_t sh_slots_record(CUstream s)
{
    int slot = stream_slot(s);
    if (slot < STREAM_SLOTS && sh_rt.drv.cuEventRecord(slot_event[slot], s) != CUDA_SUCCESS)
        slot = STREAM_SLOTS;
    return 1ull << slot;
}

void sh_slots_forget_context(CUcontext ctx)
{
    pthread_mutex_lock(&slots_mu);
    for (int i = 0; i < nslots; i++)
        if (slot_ctx[i] == ctx) {
            slot_key[i] = DEAD_KEY;
            slot_event[i] = NULL;
        }
    pthread_mutex_unlock(&slots_mu);
}

/* The events of the slots in mask, NULL for those whose context is gone
 * (its work ended before it was destroyed). */
static void slot_events(uint64_t mask, CUevent *ev)
{
    pthread_mutex_lock(&slots_mu);
    for (int i = 0; i < STREAM_SLOTS; i++)
        ev[i] = mask >> i & 1 ? slot_event[i] : NULL;
    pthread_mutex_unlock(&slots_mu);
}

/* ctx: the pool's device (struct sh_driver_dev). */
static int drain_streams(void *ctx, uint64_t mask)
{
    CUevent ev[STREAM_SLOTS];
    if (mask >> STREAM_SLOTS) {
        if (sh_driver_sync_dev(ctx) != CUDA_SUCCESS)
            return -1;
        /* with several devices a slot's stream may be in a context the
         * device-wide wait did not reach */
        if (!sh_rt.drv.several)
            return 0;
        mask &= ~SH_SLOTS_ANY;
    }
    slot_events(mask, ev);
    for (int i = 0; i < STREAM_SLOTS; i++)
        if (ev[i] && sh_rt.drv.cuEventSynchronize(ev[i]) != CUDA_SUCCESS)
            return -1;
    return 0;
}

/* 1 when every launch issued so far on the streams in mask has finished. */
static int streams_idle(void *ctx, uint64_t mask)
{
    (void)ctx;
    CUevent ev[STREAM_SLOTS];
    if (mask >> STREAM_SLOTS)
        return 0;
    slot_events(mask, ev);
    for (int i = 0; i < STREAM_SLOTS; i++)
        if (ev[i] && sh_rt.drv.cuEventQuery(ev[i]) != CUDA_SUCCESS)
            return 0;
    return 1;
}

void sh_slots_tracked_drain(int (**drain)(void *, uint64_t), int (**idle)(void *, uint64_t))
{
    *drain = sh_slots_tracked() ? drain_streams : NULL;
    *idle = sh_slots_tracked() ? streams_idle : NULL;
}
