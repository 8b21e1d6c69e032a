/* interpose.h — state shared by the interposer's files.
 *
 * interpose/ holds thin exported symbols; decisions live in pool/ and
 * policy/. runtime.c owns the process-wide state below: it is set up once
 * (configuration at load time; the driver and the pool at the first managed
 * call, by start.c) and read without locks afterwards. The files are in
 * layers, none calling a file above it (docs/DESIGN.md).
 */
#ifndef SH_INTERPOSE_H
#define SH_INTERPOSE_H

#include "config/config.h"
#include "engine/engine.h"
#include "interpose/driver.h"
#include "interpose/peermap.h"
#include "node/node.h"
#include "pool/pool.h"
#include "transfer/transfer.h"

#include <cuda_runtime_api.h>
#include <stdatomic.h>

struct sh_real {
    __typeof__(cudaMalloc) *cudaMalloc;
    __typeof__(cudaFree) *cudaFree;
    __typeof__(cudaMallocAsync) *cudaMallocAsync;
    __typeof__(cudaFreeAsync) *cudaFreeAsync;
    __typeof__(cudaMemGetInfo) *cudaMemGetInfo;
    __typeof__(cudaGetDevice) *cudaGetDevice;
    __typeof__(cudaSetDevice) *cudaSetDevice;
    __typeof__(cudaGetLastError) *cudaGetLastError;
    __typeof__(cudaPeekAtLastError) *cudaPeekAtLastError;
};

enum sh_track_mode { SH_TRACK_NONE = 0, SH_TRACK_CUPTI = 1, SH_TRACK_HOOKS = 2 };
enum sh_key_kind { SH_KEY_HOST_FN = 1, SH_KEY_FUNCTION = 2, SH_KEY_KERNEL = 3 };

/* One managed device (start.c sets it up, devices.c finds it): its pool,
 * the host slabs and copy streams that move its regions, and the engine
 * and scheduler that decide those moves. Written once, before it is
 * published in sh_rt.devs; read without locks afterwards. */
struct sh_sched; /* sched.c */
struct sh_fp;    /* fingerprint.c */
struct sh_dev {
    int ordinal; /* as the runtime numbers devices */
    CUdevice dev;
    CUcontext ctx; /* its primary context */
    size_t card_bytes, gran;
    struct sh_driver_dev drvdev; /* its copy streams and fences (driver.h) */
    struct sh_pool *pool;
    struct sh_gate *gate;     /* its remap gate: its windows, and the work that may reach it */
    struct sh_hostpool *host; /* NULL when eviction is off */
    struct sh_xfer *xfer;
    struct sh_engine engine; /* its pressure and deferred counters too */
    struct sh_sched *sched;
    struct sh_fp *fp; /* NULL when eviction is off */
    /* engine.pressure as it was when the scheduler last found the pool all
     * on the device, nothing in flight (sh_sched_quiet). */
    atomic_ullong quiet_at;
};

#define SH_DEVICES_MAX 16

struct sh_runtime {
    struct sh_config cfg;
    struct sh_real real;
    struct sh_driver drv;
    struct sh_node *node; /* the node's shared host budget; NULL: per process */
    struct sh_dev *devs[SH_DEVICES_MAX];
    atomic_int ndevs; /* devs[0..ndevs) are published */
    atomic_ullong passthrough, oom, launches;
    atomic_int captures; /* streams capturing now */
    int disabled;        /* STAGEHAND_DISABLE or enabled=false, at load time */
    atomic_int managed;  /* set once, when start.c has brought everything up */
    atomic_llong step;
    atomic_int phase;
};

extern struct sh_runtime sh_rt;

/* The managed devices (devices.c). sh_dev_main: the first, [general]
 * device (NULL before start.c brought it up). sh_dev_of: the device whose
 * pool holds address p, NULL when none does. sh_dev_ordinal: the device
 * managing the runtime's device number ordinal, NULL when none does. */
static inline struct sh_dev *sh_dev_main(void)
{
    return sh_rt.devs[0];
}
struct sh_dev *sh_dev_of(uintptr_t p);
struct sh_dev *sh_dev_ordinal(int ordinal);
/* Widens [*lo, *hi) (empty when *hi <= *lo) to hold every device's pool. */
void sh_dev_bounds(uintptr_t *lo, uintptr_t *hi);

/* runtime.c: the real cudart functions; resolved on first use, never NULL
 * afterwards unless the program has no CUDA runtime at all. */
const struct sh_real *sh_real(void);

/* start.c: 1 when allocations are managed: the library is enabled and the
 * driver and pool came up. Initialises on first call; makes the primary
 * context current on the calling thread. */
int sh_managed(void);

/* runtime.c: 1 when allocations are managed already; unlike sh_managed(),
 * never initialises (before the first managed allocation no region
 * exists). */
int sh_active(void);

/* sh_managed(), and the calling thread's current device is a managed one
 * ([general] device): that device, or NULL (an allocation for any other
 * device passes through). */
struct sh_dev *sh_managed_here(void);
/* The managed device for the runtime's device number ordinal: with
 * [general] devices = all, one not managed yet is brought up (start.c);
 * NULL when it is not managed (the call passes through). */
struct sh_dev *sh_dev_open(int ordinal);

/* cudaErrorMemoryAllocation, with one stderr line saying why. */
cudaError_t sh_oom(struct sh_dev *d, size_t size, const char *what);
/* The same for a request larger than the pool could ever hold. */
cudaError_t sh_oom_too_big(struct sh_dev *d, size_t size, const char *what);

/* PyTorch's allocator settings (torch.c). sh_torch_expandable: 1 when the
 * setting conf ("key:value,...") turns expandable_segments on for the
 * native allocator, which then maps its own memory (vmm.c manages it).
 * sh_torch_check_env: when the environment does, says once, naming the
 * variable, whether that memory is managed (a warning where it is not). */
int sh_torch_expandable(const char *conf);
void sh_torch_check_env(void);

/* Pins the region at p (pool.h's sh_pool_pin), restoring it first if it is
 * evicted: 0, or an error (its pages cannot be the device's now). An
 * address in no region is left alone: 0 (vmm.c). */
int sh_pin_region(uintptr_t p);

/* The program's own virtual memory (vmm.c). sh_vmm_retain: cuMemRetain-
 * AllocationHandle for an address a handle of the library's is mapped at:
 * 1 with *handle set (another reference), 0 when addr is not in one, -1
 * when the reference could not be handed out. */
int sh_vmm_retain(uintptr_t addr, CUmemGenericAllocationHandle *handle);

/* d's engine (engine/) over its pool, its scheduler and the driver
 * (room.c), set up once the pool is, with c resolved for its card. */
void sh_room_init(struct sh_dev *d, const struct sh_config *c);

/* Stream identity (streams.c). sh_stream_key: one id per stream CUDA
 * orders work on, the calling thread's own for its per-thread stream.
 * sh_stream_ptsz: the handle a per-thread-default entry point (_ptsz,
 * _ptds) means by s. sh_stream_capturing: 1 when work enqueued on s now
 * would be captured into a graph rather than run, or CUDA would refuse it. */
uint64_t sh_stream_key(CUstream s);
CUstream sh_stream_ptsz(CUstream s);
int sh_stream_capturing(CUstream s);

/* The bytes a row of a runtime 3D copy (cudaMemcpy3DParms) may span on its
 * linear side: extent.width counts the CUDA array's elements when one takes
 * part, of up to 16 bytes (four 32-bit channels), else bytes. */
static inline size_t sh_copy3d_row_bytes(size_t width, int array)
{
    return array ? width * 16 : width;
}
/* drain_mode = tracked (slots.c): each stream that uses regions has a slot
 * and an event. sh_slots_tracked: the mode is on. sh_slots_record: records
 * s's slot's event behind the work just issued on s and returns its bit
 * (SH_SLOTS_ANY when s has none: a drain waits for the whole device).
 * sh_slots_tracked_drain: the drain that waits for given slots and the poll
 * that says whether they are idle; NULL otherwise. sh_slots_forget_context:
 * the program destroyed ctx, whose work had ended: a tracked drain no
 * longer waits for the events made there (their handles are gone), and its
 * streams' slots are not used again. */
#define SH_SLOTS_ANY (1ull << 63)
static inline int sh_slots_tracked(void) /* inline: every launch asks */
{
    return sh_rt.cfg.transfer.drain_mode == SH_CONFIG_DRAIN_TRACKED;
}
uint64_t sh_slots_record(CUstream s);
void sh_slots_tracked_drain(int (**drain)(void *, uint64_t), int (**idle)(void *, uint64_t));
void sh_slots_forget_context(CUcontext ctx);
/* With several devices: sh_stream_device, the device whose memory a
 * stream-ordered allocation on s comes from (s's; the current one for the
 * special handles), -1 when the driver cannot say (the real call answers);
 * with one, the managed device. sh_stream_note: work on s used regions, so
 * every drain waits for s's context from now on (sh_peers_note). */
int sh_stream_device(CUstream s);
void sh_stream_note(CUstream s);

/* The remap gates work takes (gates.c), as a mask of sh_rt.devs indices
 * (bit i: devs[i]'s gate). sh_gates_kernel: those a kernel on stream s may
 * reach, its device's and its peer links' (every one when s's device
 * cannot be told; with one device, that one). sh_gates_ranges: the devices
 * whose pools may meet the ranges [ends[k], ends[k + 1]) of ends[0..n).
 * sh_gates_enter takes them in device order and returns the devices whose
 * gates the thread holds (those of devs published then), sh_gates_leave
 * gives them back; only a thread's outermost call takes or gives, nested
 * ones count. With one device, inline: its gate, whatever devs says
 * (every launch comes here). */
#define SH_GATES_ALL 0xffffffffu
uint32_t sh_gates_kernel(CUstream s);
uint32_t sh_gates_ranges(const uintptr_t *ends, size_t n);
uint32_t sh_gates_enter_set(uint32_t devs);
static inline uint32_t sh_gates_enter(uint32_t devs)
{
    if (atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire) != 1)
        return sh_gates_enter_set(devs);
    sh_gate_enter(sh_rt.devs[0]->gate);
    return 1;
}
static inline void sh_gates_leave(void)
{
    /* Devices are never withdrawn: one now means one at the enter. */
    if (atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire) == 1)
        sh_gate_leave(sh_rt.devs[0]->gate);
    else
        sh_gate_leave_set();
}

/* Kernel parameter layouts (layouts.c). sh_layout_of: the layout of the
 * function key of kind (enum sh_key_kind), filled on first use; NULL when
 * it cannot be read now or the cache is full (the launch is opaque). */
#define SH_LAYOUT_MAX_PARAMS 128
struct sh_layout {
    const void *key;
    int kind, nparams;
    int from; /* how it was read: kind, or SH_KEY_KERNEL for a kernel handle given as a function */
    int opaque; /* a kernel of a library known to keep pointers in memory, or one
                 * whose parameters cannot be read: its accesses have no bound */
    uint16_t off[SH_LAYOUT_MAX_PARAMS], size[SH_LAYOUT_MAX_PARAMS];
};
int sh_layouts_init(void);
/* The cache: a slot's key is published last, with release, and a filled
 * layout never changes, so a hit is read without a lock (inline: every
 * launch asks); a miss fills a slot under the cache's lock. */
#define SH_LAYOUTS 4096
extern struct sh_layout *sh_layouts;
const struct sh_layout *sh_layout_fill(const void *key, int kind);
static inline size_t sh_layout_slot(const void *key)
{
    return ((uintptr_t)key >> 4) * 0x9e3779b97f4a7c15ull % SH_LAYOUTS;
}
static inline const struct sh_layout *sh_layout_of(const void *key, int kind)
{
    size_t h = sh_layout_slot(key);
    for (size_t i = 0; i < SH_LAYOUTS; i++) {
        const struct sh_layout *l = &sh_layouts[(h + i) % SH_LAYOUTS];
        const void *k = __atomic_load_n(&l->key, __ATOMIC_ACQUIRE);
        if (!k)
            break;
        if (k == key && l->kind == kind)
            return l;
    }
    return sh_layout_fill(key, kind);
}

/* Launch tracking (launch.c). begin/end bracket the issue of one launch:
 * begin restores what it points into and enters the remap gate. busy: 1
 * while the calling thread is between begin and end (nested calls are
 * part of that launch). */
int sh_launch_init(void);
/* Launches issued without a scan: nothing was off the device or moving. */
uint64_t sh_launch_unscanned(void);
void sh_launch_begin(const void *key, int kind, void **args, CUstream stream);
void sh_launch_end(void);
int sh_launch_busy(void);
/* For launches whose regions are known already (graphs). */
void sh_launch_begin_addrs(uint64_t key, const uintptr_t *addrs, size_t n, int opaque,
                           CUstream stream);
/* Work other than a launch (a copy, a memset, a stream memory operation)
 * was just issued on stream, inside the gate: the regions containing
 * ends[0..n) take the issue stamp and, with a tracked drain, the stream.
 * any: its streams cannot be named (a drain waits for the whole device);
 * opaque: it counts as touching every region. */
void sh_launch_mark_work(CUstream stream, int any, const uintptr_t *ends, size_t n, int opaque,
                         uint32_t gates);
/* Between sh_launch_begin and sh_launch_end: the launch is opaque. */
void sh_launch_set_opaque(void);
/* Region pointers were copied where no scan can read them: from now on
 * every launch and copy is opaque. */
void sh_launch_hide_pointers(void);
/* hostmem.c: host memory kernels can read (pinned, registered), which the
 * CPU writes unseen. Ranges are added and removed by start. */
void sh_hostmem_add(const void *p, size_t n);
void sh_hostmem_del(const void *p);
/* 1 when one of v[0..n) points into such memory: a pointer table there is
 * invisible, so the work is opaque. */
int sh_hostmem_hit(const uintptr_t *v, size_t n);
/* Grows with every range added. */
uint64_t sh_hostmem_gen(void);
/* Every range ever added lies in [*lo, *hi) (empty when *hi <= *lo). */
void sh_hostmem_bounds(uintptr_t *lo, uintptr_t *hi);
/* globals.c: module globals whose device address the program took
 * (cudaGetSymbolAddress, cuModuleGetGlobal, cuLibraryGetGlobal). Kernels
 * read them without naming them, so region pointers copied into one are
 * hidden from every scan (sh_launch_hide_pointers). sh_globals_add
 * records [p, p + n); sh_globals_meet: 1 when [p, p + n) meets one. */
void sh_globals_add(uintptr_t p, size_t n);
int sh_globals_meet(uintptr_t p, size_t n);
/* textures.c: texture objects over linear memory, which kernels read
 * through a handle that is no pointer. sh_textures_any: 1 when one is
 * alive. sh_textures_range: 1 when v is a live object's handle, with the
 * memory under it in [*lo, *hi); -1 when any value may be one (an object
 * could not be kept). */
int sh_textures_any(void);
int sh_textures_range(uint64_t v, uintptr_t *lo, uintptr_t *hi);
/* A host-to-device copy of n bytes from src to dst is being issued: if the
 * bytes hold pointers into regions, dst's region becomes a pointer table
 * and work using it is opaque (into a module global: every launch is). */
void sh_launch_mark_upload(const void *dst, const void *src, size_t n);
/* The same for rows rows of width bytes, dpitch apart at dst and spitch
 * apart at src (a 2D copy, or one slice of a 3D one), and for depth slices
 * of such rows, drows and srows rows apart. */
void sh_launch_mark_upload_rows(const void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t rows);
/* 1 when the n bytes at bytes hold a pointer into any device's regions;
 * the region at into (on any device), if one, is then marked as holding
 * pointers. */
int sh_launch_find_pointers(const void *bytes, size_t n, uintptr_t into);
/* 1 when p is host memory the library may read (pageable, pinned or
 * managed), not device memory (hostmem.c). */
int sh_host_readable(uintptr_t p);
void sh_launch_mark_upload_slices(uintptr_t dst, size_t dpitch, size_t drows, const void *src,
                                  size_t spitch, size_t srows, size_t width, size_t height,
                                  size_t depth);
/* The region addresses a launch's parameters point into (at most max). */
/* What a graph keeps of its kernel nodes' scans: every candidate value (a
 * table recorded later may hold one), and whether a launch of them counts
 * as opaque whatever tables come (a layout, a table already known, too
 * many candidates, no memory to keep them). */
struct sh_node_scan {
    uintptr_t *cands;
    size_t ncands, cap;
    int opaque;
};
size_t sh_launch_scan(const void *key, int kind, void **args, uintptr_t *addrs, size_t max,
                      struct sh_node_scan *ns);
/* 1 when one of vals[0..n) points into a known pointer table: device
 * memory an upload filled with region pointers, or host memory kernels
 * read (hostmem.c). */
int sh_launch_in_tables(const uintptr_t *vals, size_t n);
/* Grows whenever a table is recorded: a check of sh_launch_in_tables holds
 * while it stays the same. */
uint64_t sh_launch_tables_gen(void);
/* A launch is about to be issued with the candidate pointers vals[0..n)
 * (overwritten): records its use of the regions they point into, restores
 * the evicted ones among them and tells the scheduler. */
void sh_launch_prepare(uint64_t kernel, uintptr_t *vals, size_t n);
/* Commits prefetches of, and restores, the regions at addrs, as a launch
 * would (best effort: check where they are afterwards). */
void sh_launch_make_resident(struct sh_dev *d, const uintptr_t *addrs, size_t n);
/* The most regions one launch names that are followed one by one. */
#define SH_LAUNCH_MAX_REGIONS 256
/* restore.c: brings back d's evicted regions of a launch (addrs[0..n), what
 * sh_pool_use found in u, host bytes of them on the host), or as many as
 * fit the budget; tells the policy and the monitor. */
void sh_launch_restore(struct sh_dev *d, const uintptr_t *addrs, size_t n,
                       const struct sh_pool_use *u, size_t host);
/* Launches sh_launch_restore left with regions on the host, so far. */
uint64_t sh_launch_host_launches(void);

/* CUPTI (cupti.c): the library's subscription, and handing it to another
 * subscriber and back. sh_cupti_mode: enum sh_track_mode now.
 * sh_cupti_pass_begin: a wrapper is about to issue a launch; 1 when CUPTI's
 * callbacks will see it (then call sh_cupti_pass_end once the real call
 * returns), 0 when the wrapper must track it itself (sh_launch_begin/end).
 * sh_cupti_poll: a wrapper tracks a launch itself without asking to pass:
 * CUPTI is taken back first if it came free meanwhile, as a pass would.
 * sh_cupti_counts: times CUPTI was given up to another subscriber, and
 * taken back. */
int sh_cupti_init(void);
int sh_cupti_mode(void);
int sh_cupti_pass_begin(void);
void sh_cupti_pass_end(void);
void sh_cupti_poll(void);
void sh_cupti_counts(uint64_t *handovers, uint64_t *returns);

/* Module images (modules.c), for drivers that cannot report parameter
 * layouts: the kernel name of a runtime launch stub, and a kernel's
 * parameters read from the images seen (SH_EINVAL when two images give
 * one name two layouts). */
struct sh_cubin_param;
const char *sh_modules_stub_name(const void *stub);
/* Whether handle is a kernel the driver handed out (cuLibraryGetKernel,
 * cuLibraryEnumerateKernels): CUDA 13's launch stubs pass one where a
 * function symbol used to go. */
int sh_modules_is_kernel(const void *handle);
int sh_modules_layout(const char *name, struct sh_cubin_param *params, size_t cap, size_t *count);
/* on: the driver cannot report layouts, so loaded images must be kept
 * (launch.c says so at start, and again when a query finds it out). */
void sh_modules_keep_images(int on);

/* The scheduler (sched.c): each device's policy, told the program's events
 * and asked for decisions, and the trace (the main device's). Region ids
 * are region base addresses. */
struct sh_sched_stats {
    int64_t step;
    int phase, trace_ready;
    uint64_t persistent, transient;
    uint64_t launches;       /* recorded */
    uint64_t steps_followed; /* completed steps that followed a recording */
    uint64_t steps_departed; /* ... that departed from every one (or had none) */
};
/* d's scheduler, once its pool and engine are up (the trace with the
 * first device's). */
int sh_sched_init(struct sh_dev *d);
void sh_sched_alloc(struct sh_dev *d, uintptr_t va, size_t size, uint64_t stream);
void sh_sched_free(struct sh_dev *d, uintptr_t va);
/* Records a launch for the policy once sh_engine_armed() (engine/); stream
 * as sh_stream_key() names the launch's. */
void sh_sched_launch(struct sh_dev *d, uint64_t kernel, uint64_t stream, const uintptr_t *bases,
                     size_t n);
/* A step mark (step != 0) or a phase mark, for every device. */
void sh_sched_mark(int step, int phase);
void sh_sched_residency(struct sh_dev *d, const uintptr_t *bases, size_t n, int on_device);
/* The region based at va is pinned (sh_pool_pin): never the policy's victim. */
void sh_sched_pinned(struct sh_dev *d, uintptr_t va);
/* Regions to evict to release need bytes, best first: the only source of
 * victims (room.c). 0 when the policy has none, or none is running. */
size_t sh_sched_victims(struct sh_dev *d, size_t need, const uintptr_t *protect, size_t np,
                        uintptr_t *out, size_t max);
int sh_sched_stats(struct sh_dev *d, struct sh_sched_stats *out);
/* Launches held until their regions were resident, and the microseconds
 * (every device's). */
void sh_sched_stalls(uint64_t *n, uint64_t *us);
/* Prefetch, driven by the policy (no-ops without it or with [policy]
 * prefetch_enabled off). sh_sched_prefetch_wait: a launch needs regions
 * whose prefetch is in flight: commits them (and the others in flight, in
 * the same window); returns how many were committed. sh_sched_plan: after a
 * launch's regions are resident, before it is issued: commits finished early
 * evictions, starts the plan's early evictions and prefetches, commits
 * prefetches when the policy says it is due. sh_sched_evict_commit: commits
 * early evictions (all, or the finished ones); returns the bytes released.
 * sh_sched_stall: a launch waited wait_us for region base. */
size_t sh_sched_prefetch_wait(struct sh_dev *d, const uintptr_t *bases, size_t n);
/* 1 while nothing has been evicted from d since the planner last saw its
 * pool all on the device (a hint: read without a lock). sh_quiet: the same
 * for every device. Inline: every launch asks. */
static inline int sh_sched_quiet(const struct sh_dev *d)
{
    return atomic_load_explicit(&d->quiet_at, memory_order_acquire) ==
           atomic_load_explicit(&d->engine.pressure, memory_order_acquire);
}
static inline int sh_quiet(void)
{
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (!sh_sched_quiet(sh_rt.devs[i]))
            return 0;
    return 1;
}
/* Tells the monitor that each region starting at bases[0..n) had an event
 * of kind (SH_TM_EV_*): its id and size. */
void sh_sched_announce(struct sh_dev *d, const uintptr_t *bases, size_t n, int kind);
/* The room lock (sh_engine_lock) held by the caller: */
size_t sh_sched_evict_commit(struct sh_dev *d, int all);
/* Commits every prefetch in flight; returns how many regions landed. */
size_t sh_sched_commit_all(struct sh_dev *d);
/* The device memory the budget bounds: the pool's, and the library's own
 * buffer (the fingerprints', fingerprint.c), as stagehand_get_stats counts
 * them. */
size_t sh_sched_device_bytes(struct sh_dev *d);
void sh_sched_plan(struct sh_dev *d, const uintptr_t *bases, size_t nb);
/* A decision point's moves on the pool: the engine's ops (room.c's table,
 * engine.h says what each does); ctx is the struct sh_dev. */
size_t sh_sched_evicted_ready(void *ctx);
int sh_sched_commit_evicted(void *ctx);
void sh_sched_read(void *ctx, struct sh_engine_plan_in *in);
void sh_sched_lock(void *ctx);
void sh_sched_unlock(void *ctx);
int sh_sched_start_evictions(void *ctx, const uint64_t *ids, size_t n);
int sh_sched_start_fetches(void *ctx, const uint64_t *ids, size_t n);
int sh_sched_commit_fetched(void *ctx);
void sh_sched_hints(void *ctx, const struct sh_policy_hints *h);
/* sh_sched_launch then sh_sched_plan, for a launch that did not wait: one
 * hold of the scheduler's lock where it can. */
void sh_sched_launch_plan(struct sh_dev *d, uint64_t kernel, uint64_t stream,
                          const uintptr_t *bases, size_t n);
void sh_sched_stall(struct sh_dev *d, uintptr_t base, uint64_t wait_us);
/* Steps and phases the policy finds by itself go to fn (the monitor's,
 * which sits above the scheduler: it reads its figures); none before. */
void sh_sched_on_where(void (*fn)(int64_t step, int phase));
/* Launch durations for the trace (timing.c): sh_timing_init once a trace
 * is recorded, with the scheduler's function that writes what is measured
 * (seqs[0..n): the launches' numbers in the trace); sh_timing_launch: the launch the calling thread
 * is issuing has number seq in the trace; sh_timing_begin as a launch's preparation starts (it ends
 * the previous launch on the GPU), sh_timing_issue just before it is issued. */
void sh_timing_init(void (*write)(const uint64_t *seqs, const uint64_t *us, size_t n));
void sh_timing_launch(uint64_t seq);
void sh_timing_begin(void);
void sh_timing_issue(void);

/* The clean-region fingerprint on the device (fingerprint.c): the pool's
 * mover calls sh_fingerprint inside remap windows (struct sh_pool_mover),
 * with ctx the device's struct sh_fp (sh_fingerprint_new; NULL if there is
 * no memory for it).
 * sh_fingerprint_own: 1 while the calling thread launches the library's
 * own kernel (the launch tracking leaves it alone). device_bytes: the
 * device memory it holds for its key and results. */
struct sh_clean_fp;
int sh_fingerprint(void *ctx, const uintptr_t *addr, const size_t *len, size_t n,
                   struct sh_clean_fp *out, uint64_t bus[2]);
/* The same queued on dir's copy stream ahead of what follows there, and
 * its results taken later (struct sh_pool_mover's fingerprint_queue and
 * fingerprint_take). */
int sh_fingerprint_queue(void *ctx, const uintptr_t *addr, const size_t *len, size_t n, int dir,
                         uint64_t *ticket, uint64_t bus[2]);
int sh_fingerprint_take(void *ctx, uint64_t ticket, size_t n, struct sh_clean_fp *out);
/* The pointer prefilter (clean.h, stagehand_ptrs_v1) over each range, from
 * the same module: sh_pool_mover's ptr_candidates. */
int sh_fingerprint_ptrs(void *ctx, const uintptr_t *addr, const size_t *len, size_t n, uintptr_t lo,
                        uintptr_t hi, unsigned char *found, uint64_t bus[2]);
int sh_fingerprint_own(void);
size_t sh_fingerprint_device_bytes(const struct sh_fp *fp);
struct sh_fp *sh_fingerprint_new(struct sh_driver_dev *dd);

/* The live monitor and JSONL (monitor.c, over telemetry/): it reads the
 * pool's and the scheduler's figures, so it sits above them. */
void sh_monitor_start(void);
void sh_monitor_sync(void);
void sh_monitor_step(int64_t step);
/* What happens, told as it happens (events.c, below every file that
 * tells): no-ops until the monitor started. */
extern atomic_int sh_monitor_on;
void sh_monitor_phase(int phase);
void sh_monitor_event(int kind, uint64_t id, uint64_t bytes);
/* The class d's scheduler gives a region (enum sh_policy_class). */
int sh_sched_class(struct sh_dev *d, uintptr_t va);

/* While any stream captures, nothing is remapped or drained: it would
 * break the capture (runtime.c: sh_rt.captures). */
int sh_capturing(void);
/* Stream capture and graphs (graph.c). sh_graph_capture: a capture began
 * (begin = 1) or ended, with the call's result (inside the gates); 1 when
 * the last one ended. sh_graph_captures_ended: then, outside the gates,
 * the evictions that waited for the captures. */
int sh_graph_capture(int begin, int result);
void sh_graph_captures_ended(void);
void sh_graph_launch_begin(CUgraphExec exec, CUstream stream);

#endif
