/* streams.c — what a stream handle stands for.
 *
 * CUDA's per-thread default stream has one handle value (cudaStreamPerThread,
 * CU_STREAM_PER_THREAD, or 0 in a program built with --default-stream
 * per-thread) but is a different stream on every thread, so a handle alone
 * is not an identity. Everything that orders work by stream (stream-ordered
 * reuse, the tracked drain's per-stream events, the policy's stream ids)
 * goes through sh_stream_key.
 *
 * Shared state: next_thread (atomic) hands out per-thread identities; each
 * thread keeps its own in thread-local storage.
 */
#include "interpose/interpose.h"

#define PER_THREAD_TAG (1ull << 63) /* above any stream handle's address */

static atomic_ullong next_thread = 1;
static _Thread_local uint64_t my_stream; /* this thread's per-thread stream */

CUstream sh_stream_ptsz(CUstream s)
{
    return s ? s : CU_STREAM_PER_THREAD;
}

uint64_t sh_stream_key(CUstream s)
{
    if (s == CU_STREAM_PER_THREAD) {
        if (!my_stream) /* never reused, so a new thread is never an old one */
            my_stream = PER_THREAD_TAG | atomic_fetch_add(&next_thread, 1);
        return my_stream;
    }
    if (s == CU_STREAM_LEGACY)
        return 0; /* one legacy stream, however it is named */
    return (uint64_t)(uintptr_t)s;
}

int sh_stream_capturing(CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    /* An error (the legacy stream while another stream captures, a bad
     * handle) counts too: the real call then answers with CUDA's error. */
    return sh_rt.drv.cuStreamIsCapturing(s, &st) != CUDA_SUCCESS ||
           st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int sh_stream_device(CUstream s)
{
    const struct sh_dev *d = sh_dev_main();
    if (!sh_rt.drv.several)
        return d->ordinal;
    CUcontext c = NULL;
    if (sh_rt.drv.cuStreamGetCtx(s, &c) != CUDA_SUCCESS || !c)
        return -1;
    return c == d->ctx ? d->ordinal : sh_driver_ctx_device(&sh_rt.drv, c);
}

void sh_stream_note(CUstream s)
{
    /* noted already, unless a context was forgotten since */
    static _Thread_local CUcontext last;
    static _Thread_local unsigned last_gen;
    CUcontext c = NULL;
    unsigned gen = sh_peers_generation();
    if (sh_rt.drv.cuStreamGetCtx(s, &c) != CUDA_SUCCESS || !c || c == sh_dev_main()->ctx ||
        (c == last && gen == last_gen))
        return;
    sh_peers_note(c);
    last = c;
    last_gen = gen;
}
