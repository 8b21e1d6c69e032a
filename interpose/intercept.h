/* intercept.h — the interception table: one wrapper for every CUDA entry
 * point that enqueues device work or reads or writes device memory.
 *
 * mk/gen_intercept.py writes the wrappers from the CUDA headers and
 * interpose/intercept.def. Each one is
 *
 *     if (!sh_work_begin(&w, stream, per_thread)) return real(...);
 *     <the entry's access, from intercept.def: the verbs below>;
 *     r = sh_work_issue(&w)      enters the remap gate, or refuses:
 *         ? <out of memory>      (a hole it might reach, pool/repair.c)
 *         : real(...);
 *     sh_work_end(&w, r);        marks what it touched, leaves the gate
 *
 * so no work is issued into a range inside a remap window, and the regions
 * it touches take the issue stamp and, with drain_mode = tracked, the
 * stream. Work whose reach the verbs cannot bound is opaque: it counts as
 * touching every region. Nested calls (a runtime copy reaching the driver's
 * through the table) pass straight through: the outermost one is the work.
 *
 * cuGetProcAddress, cudaGetDriverEntryPoint[ByVersion] and dlsym hand out
 * the wrappers in place of the driver's own functions (intercept.c).
 */
#ifndef SH_INTERCEPT_H
#define SH_INTERCEPT_H

#include "interpose/dl.h"
#include "interpose/interpose.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SH_WORK_ENDS 16 /* range endpoints one call records */

enum sh_work_kind { SH_WORK_ACCESS, SH_WORK_LAUNCH, SH_WORK_GRAPH, SH_WORK_CAPTURE };

struct sh_work {
    enum sh_work_kind kind;
    CUstream stream;
    int per_thread;  /* a _ptsz/_ptds entry: the default stream is the thread's */
    int any_stream;  /* work on streams the library cannot name */
    int opaque;      /* its reach cannot be bounded */
    int pass;        /* left to CUPTI's callbacks (sh_cupti_pass_begin) */
    int begin;       /* SH_WORK_CAPTURE: 1 begins, 0 ends */
    int refused;     /* sh_work_issue refused it: nothing to end */
    uint32_t gates;  /* the devices whose gates it holds (interpose.h) */
    const void *key; /* SH_WORK_LAUNCH, SH_WORK_GRAPH */
    int key_kind;
    void **params;
    size_t n; /* endpoints used */
    uintptr_t ends[SH_WORK_ENDS];
};

struct sh_icept_entry {
    const char *name;
    int runtime; /* 1: a cudart entry point, 0: the driver's */
};

/* Generated: the table, in name order, and the wrappers, in table order. */
extern const struct sh_icept_entry sh_icept_table[];
extern const size_t sh_icept_count;
extern void *const sh_icept_wrappers[];

/* The real entry point of table entry i, resolved on first use; NULL when
 * the loaded driver or runtime lacks it. Every intercepted call asks, so
 * the resolved ones are read inline. */
#define SH_ICEPT_MAX 1024
extern _Atomic(void *) sh_icept_reals[SH_ICEPT_MAX];
void *sh_icept_resolve(size_t i);
static inline void *sh_icept_real(size_t i)
{
    void *f =
        i < SH_ICEPT_MAX ? atomic_load_explicit(&sh_icept_reals[i], memory_order_acquire) : NULL;
    return f ? f : sh_icept_resolve(i);
}
/* The wrapper standing for the real function f, or f itself. */
void *sh_icept_wrap(void *f);

/* 0: pass the call straight through (the library manages nothing yet, or
 * this thread is inside an intercepted call already). per_thread: the
 * entry is a _ptsz/_ptds variant, so a default stream is the thread's. */
/* Inline: a call the library itself makes from inside an intercepted one
 * (a runtime launch's driver launch) leaves at the first test. */
extern _Thread_local int sh_work_depth; /* inside an intercepted call */
int sh_work_open(struct sh_work *w, CUstream stream, int per_thread);
static inline int sh_work_begin(struct sh_work *w, CUstream stream, int per_thread)
{
    return sh_work_depth > 0 ? 0 : sh_work_open(w, stream, per_thread);
}
/* A capture's start or end: the library starts managing at the first one
 * if it has not yet, so that no capture runs uncounted (a window then
 * would break it). */
int sh_work_open_capture(struct sh_work *w, CUstream stream, int per_thread);
static inline int sh_work_begin_capture(struct sh_work *w, CUstream stream, int per_thread)
{
    return sh_work_depth > 0 ? 0 : sh_work_open_capture(w, stream, per_thread);
}
int sh_work_issue(struct sh_work *w); /* nonzero: refused, do not issue */
/* 1 when w might reach memory the pool cannot map again (pool/repair.c);
 * it is said once. Inline: with no hole anywhere, one load. */
int sh_work_refused_slow(const struct sh_work *w);
static inline int sh_work_refused(const struct sh_work *w)
{
    return sh_pool_any_hole() && sh_work_refused_slow(w);
}
void sh_work_end(struct sh_work *w, int result);

/* The verbs intercept.def writes accesses in. */
void sh_work_range(struct sh_work *w, uintptr_t p, size_t n);
void sh_work_up(struct sh_work *w, uintptr_t dst, const void *src, size_t n);
void sh_work_copy(struct sh_work *w, uintptr_t dst, uintptr_t src, size_t n);
void sh_work_dcopy(struct sh_work *w, uintptr_t dst, uintptr_t src, size_t n);
void sh_work_rcopy(struct sh_work *w, uintptr_t dst, uintptr_t src, size_t n, int kind);
void sh_work_pitch(struct sh_work *w, uintptr_t p, size_t pitch, size_t width, size_t height);
void sh_work_rcopy2d(struct sh_work *w, uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch,
                     size_t width, size_t height, int kind);
void sh_work_copy2d(struct sh_work *w, const CUDA_MEMCPY2D *p);
void sh_work_copy3d(struct sh_work *w, const CUDA_MEMCPY3D *p);
void sh_work_copy3dpeer(struct sh_work *w, const CUDA_MEMCPY3D_PEER *p);
void sh_work_rcopy3d(struct sh_work *w, const struct cudaMemcpy3DParms *p);
void sh_work_rcopy3dpeer(struct sh_work *w, const struct cudaMemcpy3DPeerParms *p);
void sh_work_batch(struct sh_work *w, const void *dsts, const void *srcs, const size_t *sizes,
                   size_t count);
void sh_work_memops(struct sh_work *w, const CUstreamBatchMemOpParams *ops, unsigned count);
void sh_work_symbol_up(struct sh_work *w, const void *src, size_t n, int kind);
void sh_work_launch(struct sh_work *w, const void *key, int kind, void **params);
void sh_work_extra_params(struct sh_work *w, void **params, void **extra);
void sh_work_graph(struct sh_work *w, CUgraphExec exec);
void sh_work_capture(struct sh_work *w, int begin);
void sh_work_stream(struct sh_work *w, CUstream s);
void sh_work_any_stream(struct sh_work *w);
void sh_work_opaque(struct sh_work *w);

#ifdef SH_ICEPT_VERBS /* the generated file only */
#define range(p, n)         sh_work_range(&w, (uintptr_t)(p), (size_t)(n))
#define up(d, s, n)         sh_work_up(&w, (uintptr_t)(d), (const void *)(s), (size_t)(n))
#define down(d, s, n)       sh_work_range(&w, (uintptr_t)(s), (size_t)(n))
#define copy(d, s, n)       sh_work_copy(&w, (uintptr_t)(d), (uintptr_t)(s), (size_t)(n))
#define dcopy(d, s, n)      sh_work_dcopy(&w, (uintptr_t)(d), (uintptr_t)(s), (size_t)(n))
#define rcopy(d, s, n, k)   sh_work_rcopy(&w, (uintptr_t)(d), (uintptr_t)(s), (size_t)(n), (int)(k))
#define pitch(p, pi, wd, h) sh_work_pitch(&w, (uintptr_t)(p), (pi), (wd), (h))
#define set(p, n)           sh_work_range(&w, (uintptr_t)(p), (size_t)(n))
#define rcopy2d(d, dp, s, sp, wd, h, k)                                                            \
    sh_work_rcopy2d(&w, (uintptr_t)(d), (dp), (uintptr_t)(s), (sp), (wd), (h), (int)(k))
#define copy2d(p)            sh_work_copy2d(&w, (const CUDA_MEMCPY2D *)(p))
#define copy3d(p)            sh_work_copy3d(&w, (const CUDA_MEMCPY3D *)(p))
#define copy3dpeer(p)        sh_work_copy3dpeer(&w, (p))
#define rcopy3d(p)           sh_work_rcopy3d(&w, (p))
#define rcopy3dpeer(p)       sh_work_rcopy3dpeer(&w, (p))
#define batch(d, s, z, c)    sh_work_batch(&w, (d), (s), (z), (size_t)(c))
#define value(p, n)          sh_work_range(&w, (uintptr_t)(p), (n))
#define memops(o, c)         sh_work_memops(&w, (o), (c))
#define symbol_up(s, n, k)   sh_work_symbol_up(&w, (s), (size_t)(n), (int)(k))
#define launch(k, kind, pa)  sh_work_launch(&w, (const void *)(k), (kind), (pa))
#define extra_params(pa, ex) sh_work_extra_params(&w, (pa), (ex))
#define graph(e)             sh_work_graph(&w, (CUgraphExec)(e))
#define capture(b)           sh_work_capture(&w, (b))
#define stream(s)            sh_work_stream(&w, (CUstream)(s))
#define any_stream()         sh_work_any_stream(&w)
#define opaque()             sh_work_opaque(&w)
#define none()               ((void)0)
#endif

#endif
