/* sim.h — internals shared by the files of the simulated driver.
 *
 * Layout: drv_core.c (init and configuration, sticky errors, fault
 * injection, strings, cuGetProcAddress, the API-callback hub), drv_device.c
 * (devices, contexts, peer access), drv_mem.c (tables, physical handles,
 * pointer information), drv_vmm.c (reservations, mappings, access),
 * drv_alloc.c (allocations, pinned host memory), drv_pool.c (memory pools
 * and their attributes), drv_ptr.c (pointer
 * queries), drv_stream.c (streams, worker threads), drv_event.c (events),
 * drv_exec.c (kernels, launches, fault guard), drv_copy.c (copies,
 * memsets), drv_graph.c (capture and graphs), drv_module.c (modules: the
 * library's own PTX). mem.h is shared by the memory
 * files.
 */
#ifndef SIM_H
#define SIM_H

#include "simcuda.h"

#include <cuda.h>
#include <cupti_callbacks.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_EXPORT __attribute__((visibility("default")))

/* ---- configuration (read once, at cuInit) ---- */
/* The most devices SIMCUDA_DEVICES may ask for. */
#define SIM_MAX_DEVICES 8
/* Context slots: the primary contexts', then those the program creates
 * (cuCtxCreate), each slot used once in the life of the process. */
#define SIM_MAX_CTX 64

struct sim_cfg {
    int ndevices;                       /* SIMCUDA_DEVICES */
    size_t vram_bytes[SIM_MAX_DEVICES]; /* SIMCUDA_VRAM_MB, per device */
    size_t vram_total, host_bytes, gran;
    double pcie_bytes_per_us; /* 0: copies take no modelled time */
    double hbm_bytes_per_us;  /* 0: the library's kernels take their CPU time */
    unsigned kernel_us;
    bool no_host_vmm;
};
extern struct sim_cfg sim_cfg;

/* ---- core ---- */
/* The CUDA version the driver claims (SIMCUDA_DRIVER_VERSION, 13000). */
int sim_driver_version(void);
/* Host-located VMM memory (CU_MEM_LOCATION_TYPE_HOST*) came in CUDA 12.2. */
#define SIM_HOST_VMM_SINCE 12020

/* Common prologue: CUDA_ERROR_NOT_INITIALIZED before cuInit, the sticky
 * error once the context has faulted, CUDA_SUCCESS otherwise. A fault is
 * sticky to the device whose work faulted: the caller sees its current
 * context's, or with none current, that of any device. */
CUresult sim_check(void);
/* As sim_check, and also CUDA_ERROR_INVALID_CONTEXT with no current context. */
CUresult sim_check_ctx(void);
/* The prologue of an entry point, called once per call with the entry
 * point's API name: sim_check (or sim_check_ctx when needs_ctx), and fault
 * injection: SIMCUDA_FAIL=<call>:<nth>[+][:<error>][,...] fails the nth call
 * of <call> (and every later one with '+') with <error> (any CUresult name,
 * or a number; default CUDA_ERROR_UNKNOWN). Calls are counted whatever their
 * outcome; _v2/_ptsz suffixes are ignored. A call refused by the prologue
 * itself returns that error, counted but not injected. */
CUresult sim_enter(const char *fn, bool needs_ctx);
/* As sim_enter(fn, false) for a call about device dev (a device query, its
 * primary context, making one of its contexts current): dev's sticky error
 * rather than the current context's, so that one device's fault leaves the
 * others usable. An invalid dev: as sim_enter. */
CUresult sim_enter_dev(const char *fn, int dev);
/* The injection alone, for entry points with their own prologue. */
CUresult sim_inject(const char *fn);
/* Records a fault of the device whose work the calling thread runs
 * (sim_running_device): sets its sticky error and names the address. */
void sim_fault(uintptr_t addr, const char *what);
/* Whether dev's context has faulted. */
bool sim_device_faulted(int dev);
/* Which cuMemMap mapped the VMM memory at va (a new number for each map),
 * 0 when none does: a kernel checks that its memory stayed mapped. */
uint64_t sim_map_serial(uintptr_t va);
int sim_refuse_driver(const char *name, int code);
void sim_sleep_us(double us);

/* Work with a modelled time, as a copy over the bus: it takes max(us, its
 * own time), and its effect lands near the end. The work starts when us
 * less what it is expected to take (learned per byte, with a margin) has
 * passed, so that it ends on time even when it runs slower than the last
 * ones; the rest is slept out. work returns false when it faulted
 * instead: nothing is learned from it. Returns the microseconds it took. */
struct sim_pace {
    _Atomic double us_per_byte;
};
double sim_paced(struct sim_pace *p, double us, size_t bytes, bool (*work)(void *), void *arg);

/* Name/value tables of the error enums, generated from the headers by
 * gen_errors.sh: sim_cu_errors (CUresult, in libcuda) and sim_rt_errors
 * (cudaError_t, in libcudart). `text` is derived from the name. */
struct sim_error_name {
    int code;
    const char *name, *text;
};
extern const struct sim_error_name sim_cu_errors[], sim_rt_errors[];
extern const size_t sim_cu_errors_count, sim_rt_errors_count;

struct sim_stats {
    atomic_ullong copies_h2d, copies_d2h, bytes_h2d, bytes_d2h, launches, faults;
    atomic_ullong us_h2d, us_d2h;    /* what the copies over the modelled link took */
    atomic_ullong bytes_hbm, us_hbm; /* what the builtin kernels read, and took */
};
extern struct sim_stats sim_stats;

/* API callbacks (CUPTI). `call` lives on the caller's stack between the two.
 * Never inlined: tests/bench/launch.sh counts what these two do (the
 * simulated CUPTI's dispatch, callback record included) apart from the
 * library's callback, by their names. */
struct sim_api_call {
    CUpti_CallbackData data;
    CUpti_CallbackDomain domain;
    CUpti_CallbackId cbid;
    uint64_t corr_data;
    bool active;
};
__attribute__((noinline)) void sim_api_enter(struct sim_api_call *call, CUpti_CallbackDomain domain,
                                             CUpti_CallbackId cbid, const char *fname,
                                             const char *symbol, const void *params);
__attribute__((noinline)) void sim_api_exit(struct sim_api_call *call, void *ret);

/* ---- devices and contexts (drv_device.c) ---- */
/* The calling thread's current context, or NULL. */
CUcontext sim_ctx_current(void);
/* The device of the current context; 0 with none current. */
int sim_current_device(void);
/* The device whose work the calling thread runs: a stream worker's
 * stream's, else the current one. */
int sim_running_device(void);
void sim_set_running_device(int dev);
bool sim_device_valid(CUdevice dev);
/* dev's primary context (its handle: valid whether retained or not). */
CUcontext sim_primary_ctx(int dev);
/* The device of a context handle; -1 if it is none or destroyed. */
int sim_ctx_device(CUcontext ctx);
/* The slot of a context handle (live or destroyed), -1 if it is none; of
 * the current context, 0 (device 0's primary) with none current. */
int sim_ctx_index(CUcontext ctx);
int sim_ctx_current_index(void);
CUcontext sim_ctx_handle(int index);
/* Whether ctx is a created context since destroyed. */
bool sim_ctx_destroyed(CUcontext ctx);
/* Whether contexts on `from` may access cuMemAlloc memory of `to`
 * (cuCtxEnablePeerAccess). */
bool sim_peer_enabled(int from, int to);

/* ---- memory ---- */
enum sim_memkind { SIM_MEM_PAGEABLE = 0, SIM_MEM_PINNED = 1, SIM_MEM_DEVICE = 2 };
/* Where the byte at addr lives, for modelling copy time. */
enum sim_memkind sim_mem_kind(uintptr_t addr);
void sim_mem_stats(size_t *dev_in_use, size_t *dev_peak, size_t *host_in_use);

/* What the driver knows of the memory at p (drv_mem.c): a cuMemAlloc
 * allocation is one range; a VMM mapping is its handle's range, located
 * where the handle lives; pinned host memory is host memory. type 0: not a
 * CUDA pointer. */
struct sim_ptr_info {
    CUmemorytype type;
    uintptr_t base;
    size_t size;
    bool vmm;
    int dev; /* the owning device (device memory), or the allocating one */
};
struct sim_ptr_info sim_ptr_info(uintptr_t p);
/* Whether a kernel running on dev may touch the memory at p (several
 * devices only): memory of another device needs peer access (cuMemAlloc
 * memory) or access granted to dev (VMM mappings); stream-ordered and graph
 * allocations are their device's alone. Memory the driver does not know is
 * not its business. On refusal, says why in why[n]. */
bool sim_kernel_may_touch(int dev, uintptr_t p, char *why, size_t n);

/* ---- memory pools (drv_pool.c) ---- */
/* Stream-ordered allocations come from a pool: the device's current one
 * (its default pool unless cuDeviceSetMemPool chose another) or the one
 * named. The simulated pool keeps no memory back: a free returns it at
 * once, so a pool's reserved bytes are its used bytes. */
struct sim_pool;
struct sim_pool *sim_pool_current(void);
/* The live pool behind a handle, or NULL. */
struct sim_pool *sim_pool_get(CUmemoryPool h);
/* bytes allocated from (add) or freed to the pool. */
void sim_pool_charge(struct sim_pool *p, size_t bytes, bool add);

/* ---- streams ---- */
struct sim_stream;
struct sim_op;
typedef void (*sim_op_fn)(struct sim_op *op);

struct sim_wait {
    struct sim_stream *stream;
    uint64_t ticket;
};

/* How stream capture treats an op: recorded as a graph node, dropped
 * (ordering ops that a linear capture makes redundant), or refused. */
enum sim_capture { SIM_CAP_NODE = 0, SIM_CAP_DROP = 1, SIM_CAP_REFUSE = 2 };

struct sim_op {
    struct sim_op *next;
    uint64_t ticket;
    sim_op_fn run;  /* on the worker, inside the fault guard */
    sim_op_fn fini; /* on the worker, after run; frees the op */
    int nwaits;
    struct sim_wait *waits;
    size_t size;        /* bytes of the whole op, so a graph can copy it */
    int capture;        /* enum sim_capture */
    int node_type;      /* CUgraphNodeType when captured */
    sim_op_fn relocate; /* fixes inner pointers after a copy (may be NULL) */
};

/* Resolves a CUstream handle (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
 * — the current device's — or a created stream); NULL if the handle is not
 * a live stream. */
struct sim_stream *sim_stream_get(CUstream h);
/* The device a stream belongs to. */
int sim_stream_device(const struct sim_stream *s);
/* The slot of the context a stream belongs to. */
int sim_stream_ctx(const struct sim_stream *s);
/* A created context's streams: its legacy stream started (open); every
 * stream of it waited for and retired (close). */
CUresult sim_ctx_open(int ctx);
void sim_ctx_close(int ctx);
/* Enqueues op (allocated by the caller, freed by op->fini) and returns its
 * ticket through *ticket (may be NULL). Adds the legacy-stream barriers. */
CUresult sim_stream_submit(struct sim_stream *s, struct sim_op *op, uint64_t *ticket);
void sim_stream_wait_ticket(struct sim_stream *s, uint64_t ticket);
/* Waits for everything submitted to s so far. */
void sim_stream_drain(struct sim_stream *s);
bool sim_stream_done(struct sim_stream *s, uint64_t ticket);
/* Waits for every stream of the current context (not the device's other
 * contexts); its sticky error. */
CUresult sim_ctx_synchronize(void);
/* Waits for every stream of dev. */
void sim_device_synchronize(int dev);
/* Stream capture (drv_graph.c keeps the graphs). */
struct sim_graph;
/* Begins or ends capture on s; see cuStreamBeginCapture/EndCapture. */
CUresult sim_capture_begin(struct sim_stream *s);
CUresult sim_capture_end(struct sim_stream *s, struct sim_graph **out, bool *invalid);
CUstreamCaptureStatus sim_capture_status(struct sim_stream *s);
/* cuStreamIsCapturing's answer: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT for the
 * legacy stream while any stream captures. */
CUresult sim_capture_query(struct sim_stream *s, CUstreamCaptureStatus *status);
/* Appends a captured op to a graph (the graph owns it from then on). */
CUresult sim_graph_append(struct sim_graph *g, struct sim_op *op);
struct sim_graph *sim_graph_new(void);
/* A copy of a template op, ready to submit. */
struct sim_op *sim_op_clone(const struct sim_op *op);
/* The kernel and parameters of a captured launch (false for other ops). */
bool sim_launch_info(const struct sim_op *op, CUfunction *f, void ***params);
/* What a memset or copy node does (false for another kind of op). */
bool sim_fill_info(const struct sim_op *op, CUDA_MEMSET_NODE_PARAMS *p);
bool sim_copy_info(const struct sim_op *op, CUDA_MEMCPY3D *p);
/* New nodes from node parameters (NULL with *r set when they are refused),
 * for executable-graph updates. */
struct sim_op *sim_fill_op(const CUDA_MEMSET_NODE_PARAMS *p, CUresult *r);
struct sim_op *sim_copy_op(const CUDA_MEMCPY3D *p, CUresult *r);
struct sim_op *sim_kernel_op(const CUDA_KERNEL_NODE_PARAMS *p, CUresult *r);
/* Adds a dependency to an op before it is submitted. */
CUresult sim_op_add_wait(struct sim_op *op, struct sim_stream *s, uint64_t ticket);

/* ---- execution ---- */
/* Registers fn as the kernel of a module (drv_module.c), whatever
 * SIMCUDA_KERNEL_US says: it reads bytes_unit times the 64-bit parameter
 * bytes_param of device memory, which takes that over SIMCUDA_HBM_GBPS (or,
 * unset, the time its work takes). NULL when the table is full. */
CUfunction sim_builtin_kernel(simcuda_kernel_fn fn, const char *name, int nparams,
                              const size_t *param_sizes, int bytes_param, unsigned bytes_unit);
/* Runs fn(arg) on the calling worker; returns false and records the fault
 * if it touched an address with no mapping or no access. */
bool sim_guarded(void (*fn)(void *), void *arg, const char *what);
void sim_exec_init(void);
/* Submits a copy of n bytes on s; waits for it when sync. api names the
 * entry point, for fault injection. */
CUresult sim_copy(const char *api, void *dst, const void *src, size_t n, CUstream s, bool sync);
CUresult sim_fill(const char *api, void *dst, unsigned value, size_t elem, size_t count, CUstream s,
                  bool sync);

#endif
