/* driver.h — the CUDA driver, reached through one table of entry points
 * (entries.h).
 *
 * The table is filled once from dlopen("libcuda.so.1") and cuGetProcAddress,
 * never by linking -lcuda, so tools and tests run without a GPU and the
 * simulated driver can stand in. It also implements the pool's VMM and fence
 * operations over the driver.
 */
#ifndef SH_INTERPOSE_DRIVER_H
#define SH_INTERPOSE_DRIVER_H

#include "interpose/entries.h"
#include "pool/pool.h"
#include "transfer/transfer.h"

#include <cuda.h>
#include <pthread.h>

/* One device as the operations below serve it: its context, its two copy
 * streams and the recycled events its fences use (an event is recorded
 * only on a stream of its own context). The pool's VMM, fence and copy
 * operations and the fingerprint kernel point at one; it must outlive
 * them. */
#define SH_DRIVER_EVENT_CACHE 256
struct sh_driver_dev {
    struct sh_driver *drv;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream[2]; /* SH_D2H, SH_H2D: made by sh_driver_copy_ops */
    pthread_mutex_t event_mu;
    CUevent spare[SH_DRIVER_EVENT_CACHE];
    int nspare;
};
void sh_driver_dev_init(struct sh_driver_dev *dd, struct sh_driver *drv, CUdevice dev,
                        CUcontext ctx);

/* Loads the driver; SH_EDRIVER with a log line naming what is missing.
 * drv->version is the driver's CUDA version (12040 for 12.4). */
int sh_driver_load(struct sh_driver *drv, const char *path);

/* Waits for all work in dd's context, whatever context the calling thread
 * has current: a program that drives two GPUs calls in with the other
 * one's current, and a wait for that one would let dd's kernels run on
 * under a remap. Then for the other contexts that may touch regions
 * (sh_peers_sync_except): with several devices, those of peers, copies and
 * the other managed devices; with one or several, those the program
 * created on a managed device. Before dd->ctx is known: the current
 * context. Returns dd's context's result. */
CUresult sh_driver_sync_dev(const struct sh_driver_dev *dd);

/* With several devices, or once the program created a context, makes dd's
 * context current for a call that acts on the current one (creating an
 * event, asking for free memory): returns 1 when it pushed it, for
 * sh_driver_leave. */
int sh_driver_enter_dev(const struct sh_driver_dev *dd);
void sh_driver_leave(const struct sh_driver *drv, int pushed);

/* The device of context ctx; -1 if the driver cannot say. */
int sh_driver_ctx_device(const struct sh_driver *drv, CUcontext ctx);

/* An entry point newer than CUDA 12.0, asked for at the version that
 * brought it in (since, as 12040); NULL where this driver lacks it. */
void *sh_driver_optional(const struct sh_driver *drv, const char *name, int since);

/* The driver's name for r, for messages. */
const char *sh_driver_error(const struct sh_driver *drv, CUresult r);

/* VMM and fence operations for the pool, on dd's device. */
void sh_driver_vmm_ops(struct sh_driver_dev *dd, struct sh_vmm_ops *ops);
void sh_driver_fence_ops(struct sh_driver_dev *dd, struct sh_fence_ops *ops);

/* Copy operations for the transfer engine: two high-priority non-blocking
 * streams in dd's context (current meanwhile), an event per copy.
 * SH_EDRIVER if the streams cannot be made. */
int sh_driver_copy_ops(struct sh_driver_dev *dd, struct sh_copy_ops *ops);

/* dd's copy stream for dir (SH_D2H, SH_H2D); NULL before sh_driver_copy_ops
 * made it. */
CUstream sh_driver_copy_stream(const struct sh_driver_dev *dd, int dir);

/* A fence: an event of dd's context recorded on stream (one of that
 * context's). 0 if none could be recorded. Dropped (its event kept for the
 * next) once waited for. */
uint64_t sh_driver_fence_record(struct sh_driver_dev *dd, CUstream stream);
void sh_driver_fence_drop(struct sh_driver_dev *dd, uint64_t fence);

#endif
