/* drv_exec.c — kernels, launches, and the fault guard (copies and memsets
 * are in drv_copy.c).
 *
 * Work runs on stream workers inside a guard: a SIGSEGV/SIGBUS raised there
 * (an address with no mapping or no access) becomes the context's sticky
 * CUDA_ERROR_ILLEGAL_ADDRESS, as a GPU fault would; a fault anywhere else is
 * passed on to whatever handler was there before. A handler the application
 * installs later (a test framework, a crash reporter) would take device
 * faults away from the guard, so before each piece of guarded work the guard
 * checks that its own handler is still installed, and if not reinstalls it,
 * chaining to the application's: a device fault never reaches a host handler.
 *
 * With several devices, the pages of every device's memory are open to the
 * whole process (kernels run on the CPU), so before a kernel runs on device
 * D its parameters are checked instead: any pointer in them (at 8-byte
 * stride, as a pointer is laid out) into memory that D may not touch faults
 * as an illegal address, before the kernel runs.
 *
 * Locking: kern_mu guards the kernel table; kernel entries are never freed,
 * so a CUfunction stays valid for the life of the process. guard_mu
 * serialises reinstalling the handler; the handlers chained to are kept in
 * records that are never freed, published through an atomic pointer.
 */
#include "sim.h"

#include <cupti.h> /* the launch parameter structs CUPTI hands out */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KERNELS         4096
#define MAX_PARAMS          64
#define SIM_MAX_PARAM_ALIGN 16

struct sim_kernel {
    simcuda_kernel_fn fn;
    char name[96];
    int nparams;
    size_t sizes[MAX_PARAMS], offsets[MAX_PARAMS], total;
    unsigned duration_us;
    bool builtin;        /* a kernel of a module (drv_module.c): paced by SIMCUDA_HBM_GBPS */
    int bytes_param;     /* a builtin's: the parameter saying how much it reads */
    unsigned bytes_unit; /* ... in units of this many bytes */
};

static pthread_mutex_t kern_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_kernel kernels[MAX_KERNELS];
static int nkernels;

/* ---- the fault guard ---- */

/* A handler to chain to for faults outside guarded work. */
struct chained {
    struct sigaction sa;
    struct chained *prev; /* every record ever made, so none is lost */
};

static _Thread_local sigjmp_buf *guard_jmp;
static _Thread_local uintptr_t guard_addr;
/* The frame of on_fault while it runs a chained handler (0 when none): a
 * fault that comes back to on_fault from deeper down is a chained handler
 * calling us in turn, a loop that only the default action can end. (A
 * chained handler that jumps out leaves it set; a later host fault on that
 * thread from deeper down is then taken for a loop too.) */
static _Thread_local uintptr_t forwarding_frame;
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static struct chained *records; /* guard_mu */
static struct chained *_Atomic chain_segv, *_Atomic chain_bus;

static void on_fault(int sig, siginfo_t *info, void *uc)
{
    if (guard_jmp) {
        guard_addr = (uintptr_t)info->si_addr;
        siglongjmp(*guard_jmp, 1);
    }
    uintptr_t frame = (uintptr_t)__builtin_frame_address(0);
    struct chained *c = atomic_load(sig == SIGSEGV ? &chain_segv : &chain_bus);
    bool loop = forwarding_frame && frame < forwarding_frame;
    const struct sigaction *old = c && !loop ? &c->sa : NULL;
    uintptr_t saved = forwarding_frame;
    if (old && (old->sa_flags & SA_SIGINFO) && old->sa_sigaction && old->sa_sigaction != on_fault) {
        forwarding_frame = frame;
        old->sa_sigaction(sig, info, uc);
        forwarding_frame = saved;
    } else if (old && !(old->sa_flags & SA_SIGINFO) && old->sa_handler != SIG_IGN &&
               old->sa_handler != SIG_DFL) {
        forwarding_frame = frame;
        old->sa_handler(sig);
        forwarding_frame = saved;
    } else {
        signal(sig, SIG_DFL); /* returning re-executes the access and dies */
    }
}

static bool ours(const struct sigaction *sa)
{
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_fault;
}

/* Installs on_fault for sig unless it is there already, chaining to what
 * is. */
static void guard_install(int sig)
{
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0 || ours(&cur))
        return;
    pthread_mutex_lock(&guard_mu);
    struct chained *c = NULL;
    if (sigaction(sig, NULL, &cur) == 0 && !ours(&cur) && (c = calloc(1, sizeof *c))) {
        c->sa = cur;
        c->prev = records;
        records = c;
        atomic_store(sig == SIGSEGV ? &chain_segv : &chain_bus, c);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, NULL);
    }
    pthread_mutex_unlock(&guard_mu);
}

void sim_exec_init(void)
{
    guard_install(SIGSEGV);
    guard_install(SIGBUS);
}

bool sim_guarded(void (*fn)(void *), void *arg, const char *what)
{
    forwarding_frame = 0;
    guard_install(SIGSEGV);
    guard_install(SIGBUS);
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1)) {
        guard_jmp = NULL;
        sim_fault(guard_addr, what);
        return false;
    }
    guard_jmp = &jb;
    fn(arg);
    guard_jmp = NULL;
    return true;
}

static void op_free(struct sim_op *op)
{
    free(op->waits);
    free(op);
}

/* ---- kernels ---- */

/* The alignment simcuda.h promises when the caller gives none. */
static size_t default_align(size_t sz)
{
    return sz >= 8 ? 8 : sz >= 4 ? 4 : sz >= 2 ? 2 : 1;
}

SIM_EXPORT int simcuda_register_kernel_aligned(simcuda_kernel_fn fn, const char *name, int nparams,
                                               const size_t *param_sizes,
                                               const size_t *param_aligns, unsigned duration_us)
{
    if (!fn || nparams < 0 || nparams > MAX_PARAMS || (nparams > 0 && !param_sizes))
        return -1;
    struct sim_kernel k = {.fn = fn, .nparams = nparams, .duration_us = duration_us};
    snprintf(k.name, sizeof k.name, "%s", name ? name : "kernel");
    for (int i = 0; i < nparams; i++) {
        size_t sz = param_sizes[i];
        size_t align = param_aligns && param_aligns[i] ? param_aligns[i] : default_align(sz);
        if (sz == 0 || (align & (align - 1)) || align > SIM_MAX_PARAM_ALIGN)
            return -1;
        k.offsets[i] = (k.total + align - 1) & ~(align - 1); /* as nvcc lays out */
        k.sizes[i] = sz;
        k.total = k.offsets[i] + sz;
    }
    pthread_mutex_lock(&kern_mu);
    int slot = -1;
    for (int i = 0; i < nkernels; i++)
        if (kernels[i].fn == fn)
            slot = i;
    if (slot < 0 && nkernels < MAX_KERNELS)
        slot = nkernels++;
    if (slot >= 0)
        kernels[slot] = k;
    pthread_mutex_unlock(&kern_mu);
    return slot < 0 ? -1 : 0;
}

SIM_EXPORT int simcuda_register_kernel(simcuda_kernel_fn fn, const char *name, int nparams,
                                       const size_t *param_sizes, unsigned duration_us)
{
    return simcuda_register_kernel_aligned(fn, name, nparams, param_sizes, NULL, duration_us);
}

CUfunction sim_builtin_kernel(simcuda_kernel_fn fn, const char *name, int nparams,
                              const size_t *param_sizes, int bytes_param, unsigned bytes_unit)
{
    if (simcuda_register_kernel(fn, name, nparams, param_sizes, 0) != 0)
        return NULL;
    struct sim_kernel *k = (struct sim_kernel *)simcuda_function(fn);
    pthread_mutex_lock(&kern_mu);
    k->builtin = true;
    k->bytes_param = bytes_param;
    k->bytes_unit = bytes_unit;
    pthread_mutex_unlock(&kern_mu);
    return (CUfunction)k;
}

SIM_EXPORT CUfunction simcuda_function(simcuda_kernel_fn fn)
{
    CUfunction f = NULL;
    pthread_mutex_lock(&kern_mu);
    for (int i = 0; i < nkernels && !f; i++)
        if (kernels[i].fn == fn)
            f = (CUfunction)&kernels[i];
    pthread_mutex_unlock(&kern_mu);
    return f;
}

static struct sim_kernel *kernel_get(const void *f)
{
    const struct sim_kernel *k = f;
    if (k < kernels || k >= kernels + MAX_KERNELS ||
        (size_t)((const char *)k - (const char *)kernels) % sizeof *k)
        return NULL;
    pthread_mutex_lock(&kern_mu);
    bool live = k - kernels < nkernels;
    pthread_mutex_unlock(&kern_mu);
    return live ? (struct sim_kernel *)k : NULL;
}

/* The registered name of a kernel handle, or NULL: for the runtime's launch
 * callbacks. Internal ABI, not for tests. */
SIM_EXPORT const char *simcuda__function_name(CUfunction f);
const char *simcuda__function_name(CUfunction f)
{
    struct sim_kernel *k = kernel_get(f);
    return k ? k->name : NULL;
}

/* The runtime's kernels by name, as CUDA 13's runtime asks for them when a
 * launch stub first runs (the library argument is not checked: the
 * simulated runtime has one). */
SIM_EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    (void)library;
    if (!kernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    *kernel = NULL;
    pthread_mutex_lock(&kern_mu);
    for (int i = 0; i < nkernels && !*kernel; i++)
        if (kernels[i].name[0] && strcmp(kernels[i].name, name) == 0)
            *kernel = (CUkernel)&kernels[i];
    pthread_mutex_unlock(&kern_mu);
    return *kernel ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult param_info(const char *api, CUfunction func, size_t paramIndex, size_t *paramOffset,
                           size_t *paramSize)
{
    CUresult r = sim_enter(api, false);
    if (r)
        return r;
    struct sim_kernel *k = kernel_get(func);
    if (!k)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!paramOffset || paramIndex >= (size_t)k->nparams)
        return CUDA_ERROR_INVALID_VALUE;
    *paramOffset = k->offsets[paramIndex];
    if (paramSize)
        *paramSize = k->sizes[paramIndex];
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                       size_t *paramSize)
{
    return param_info(__func__, func, paramIndex, paramOffset, paramSize);
}

SIM_EXPORT CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                                         size_t *paramSize)
{
    return param_info(__func__, (CUfunction)kernel, paramIndex, paramOffset, paramSize);
}

static CUresult get_name(const char *call, const char **name, const void *handle)
{
    CUresult r = sim_enter(call, false);
    if (r)
        return r;
    struct sim_kernel *k = kernel_get(handle);
    if (!k)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = k->name;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncGetName(const char **name, CUfunction func)
{
    return get_name(__func__, name, func);
}

/* A kernel handle is its function here (cuLibraryGetKernel). */
SIM_EXPORT CUresult cuKernelGetName(const char **name, CUkernel kernel)
{
    return get_name(__func__, name, kernel);
}

struct launch_op {
    struct sim_op op;
    struct sim_kernel *k;
    double us;
    size_t bytes; /* a builtin's reads, paced at SIMCUDA_HBM_GBPS (us) */
    void *args[MAX_PARAMS];
    /* the parameter values, copied at launch as a GPU does */
    _Alignas(SIM_MAX_PARAM_ALIGN) unsigned char buf[];
};

/* The VMM mappings a launch's pointer parameters fall in, by serial. */
static void watch(const struct launch_op *l, uint64_t *serials)
{
    for (int i = 0; i < l->k->nparams; i++) {
        uintptr_t v = 0;
        if (l->k->sizes[i] == sizeof v)
            memcpy(&v, l->args[i], sizeof v);
        serials[i] = v ? sim_map_serial(v) : 0;
    }
}

/* A pointer parameter whose memory was unmapped or mapped anew since
 * watch(), or 0. */
static uintptr_t remapped(const struct launch_op *l, const uint64_t *serials)
{
    for (int i = 0; i < l->k->nparams; i++) {
        uintptr_t v;
        if (serials[i] && (memcpy(&v, l->args[i], sizeof v), sim_map_serial(v) != serials[i]))
            return v;
    }
    return 0;
}

/* False after raising the fault, if a parameter of l points into memory
 * its device may not touch (several devices only: one device reaches all
 * of its memory, and its mappings' access is the pages' own). */
static bool launch_reaches(const struct launch_op *l)
{
    if (sim_cfg.ndevices < 2)
        return true;
    int dev = sim_running_device();
    for (size_t off = 0; off + sizeof(uintptr_t) <= l->k->total; off += sizeof(uintptr_t)) {
        uintptr_t p;
        memcpy(&p, l->buf + off, sizeof p);
        char why[160], what[320];
        if (p && !sim_kernel_may_touch(dev, p, why, sizeof why)) {
            snprintf(what, sizeof what, "kernel %s on device %d: %s", l->k->name, dev, why);
            sim_fault(p, what);
            return false;
        }
    }
    return true;
}

/* A GPU kernel reads and writes all the while it runs: memory remapped
 * under it faults (or, between two chunks, loses writes). Here results
 * appear when it ends, so a remap meanwhile is caught at the end. */
struct watched {
    struct launch_op *l;
    uint64_t serials[MAX_PARAMS];
};

static bool launch_land(void *arg)
{
    struct watched *w = arg;
    uintptr_t moved = remapped(w->l, w->serials);
    if (moved) {
        sim_fault(moved, "a kernel whose memory was remapped while it ran");
        return false;
    }
    w->l->k->fn(w->l->args);
    return true;
}

/* The library's kernels read device memory at the card's rate. */
static struct sim_pace hbm_pace;

static void launch_run(struct sim_op *op)
{
    struct launch_op *l = (struct launch_op *)op;
    if (!launch_reaches(l))
        return;
    if (l->us <= 0) {
        l->k->fn(l->args);
        return;
    }
    struct watched w = {.l = l};
    watch(l, w.serials);
    if (l->k->builtin) {
        double took = sim_paced(&hbm_pace, l->us, l->bytes, launch_land, &w);
        atomic_fetch_add(&sim_stats.bytes_hbm, l->bytes);
        atomic_fetch_add(&sim_stats.us_hbm, (unsigned long long)(took + 0.5));
        return;
    }
    sim_sleep_us(l->us); /* then its work, which the program's kernels add */
    launch_land(&w);
}

/* A copied launch must point its args at its own copy of the values. */
static void launch_relocate(struct sim_op *op)
{
    struct launch_op *l = (struct launch_op *)op;
    for (int i = 0; i < l->k->nparams; i++)
        l->args[i] = l->buf + l->k->offsets[i];
}

bool sim_launch_info(const struct sim_op *op, CUfunction *f, void ***params)
{
    if (op->run != launch_run)
        return false;
    struct launch_op *l = (struct launch_op *)op;
    *f = (CUfunction)l->k;
    *params = l->args;
    return true;
}

/* A launch of k with the parameter values params point at, copied. */
static struct launch_op *launch_op_new(struct sim_kernel *k, void **params)
{
    struct launch_op *op = calloc(1, sizeof *op + k->total);
    if (!op)
        return NULL;
    op->op.run = launch_run;
    op->op.fini = op_free;
    op->op.size = sizeof *op + k->total;
    op->op.node_type = CU_GRAPH_NODE_TYPE_KERNEL;
    op->op.relocate = launch_relocate;
    op->k = k;
    op->us = k->duration_us ? k->duration_us : k->builtin ? 0 : sim_cfg.kernel_us;
    for (int i = 0; i < k->nparams; i++) {
        memcpy(op->buf + k->offsets[i], params[i], k->sizes[i]);
        op->args[i] = op->buf + k->offsets[i];
    }
    if (k->builtin && sim_cfg.hbm_bytes_per_us > 0) {
        uint64_t units;
        memcpy(&units, op->args[k->bytes_param], sizeof units);
        op->bytes = (size_t)units * k->bytes_unit;
        op->us = (double)op->bytes / sim_cfg.hbm_bytes_per_us;
    }
    return op;
}

/* The parameters of a packed buffer (`extra`: CU_LAUNCH_PARAM_BUFFER_POINTER
 * and CU_LAUNCH_PARAM_BUFFER_SIZE, then CU_LAUNCH_PARAM_END), each at its
 * offset in k's layout, into args. Both kernelParams and extra, another
 * key, or a buffer smaller than the layout are invalid values. */
static CUresult unpack_extra(const struct sim_kernel *k, void **params, void **extra, void **args)
{
    void *buf = NULL;
    const size_t *size = NULL;
    for (int i = 0; i < 8 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
            size = extra[i + 1];
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (params || !buf || !size || *size < k->total)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < k->nparams; i++)
        args[i] = (char *)buf + k->offsets[i];
    return CUDA_SUCCESS;
}

static CUresult launch(struct sim_kernel *k, CUstream hs, void **params, void **extra, unsigned gx,
                       unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz)
{
    void *unpacked[MAX_PARAMS];
    if (extra) {
        CUresult r = unpack_extra(k, params, extra, unpacked);
        if (r)
            return r;
        params = unpacked;
    }
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (k->nparams > 0 && !params)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s = sim_stream_get(hs);
    /* A kernel runs on the current device: a stream of another device is
     * refused (the CUDA Programming Guide, "Stream and Event Behavior"). */
    if (!s || sim_stream_device(s) != sim_current_device())
        return CUDA_ERROR_INVALID_HANDLE;
    struct launch_op *op = launch_op_new(k, params);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    atomic_fetch_add(&sim_stats.launches, 1);
    return sim_stream_submit(s, &op->op, NULL);
}

static CUresult launch_kernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                              unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                              unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                              void **kernelParams, void **extra)
{
    cuLaunchKernel_params p = {f,         gridDimX,     gridDimY,  gridDimZ,
                               blockDimX, blockDimY,    blockDimZ, sharedMemBytes,
                               hStream,   kernelParams, extra};
    struct sim_kernel *k = kernel_get(f);
    struct sim_api_call call;
    sim_api_enter(&call, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                  "cuLaunchKernel", k ? k->name : NULL, &p);
    CUresult r = sim_enter("cuLaunchKernel", true);
    if (r == CUDA_SUCCESS)
        r = k ? launch(k, hStream, kernelParams, extra, gridDimX, gridDimY, gridDimZ, blockDimX,
                       blockDimY, blockDimZ)
              : CUDA_ERROR_INVALID_HANDLE;
    sim_api_exit(&call, &r);
    return r;
}

SIM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams, void **extra)
{
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         sharedMemBytes, hStream, kernelParams, extra);
}

SIM_EXPORT CUresult simcuda_launch_unhooked(CUfunction f, unsigned int grid, unsigned int block,
                                            CUstream hStream, void **kernelParams, void **extra)
{
    return launch_kernel(f, grid, 1, 1, block, 1, 1, 0, hStream, kernelParams, extra);
}

SIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                     void **kernelParams, void **extra)
{
    cuLaunchKernelEx_params p = {config, f, kernelParams, extra};
    struct sim_kernel *k = kernel_get(f);
    struct sim_api_call call;
    sim_api_enter(&call, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
                  "cuLaunchKernelEx", k ? k->name : NULL, &p);
    CUresult r = sim_enter(__func__, true);
    if (r == CUDA_SUCCESS && !config)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = k ? launch(k, config->hStream, kernelParams, extra, config->gridDimX, config->gridDimY,
                       config->gridDimZ, config->blockDimX, config->blockDimY, config->blockDimZ)
              : CUDA_ERROR_INVALID_HANDLE;
    sim_api_exit(&call, &r);
    return r;
}

SIM_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                              unsigned int gridDimY, unsigned int gridDimZ,
                                              unsigned int blockDimX, unsigned int blockDimY,
                                              unsigned int blockDimZ, unsigned int sharedMemBytes,
                                              CUstream hStream, void **kernelParams)
{
    cuLaunchCooperativeKernel_params p = {f,         gridDimX,    gridDimY,  gridDimZ,
                                          blockDimX, blockDimY,   blockDimZ, sharedMemBytes,
                                          hStream,   kernelParams};
    struct sim_kernel *k = kernel_get(f);
    struct sim_api_call call;
    sim_api_enter(&call, CUPTI_CB_DOMAIN_DRIVER_API,
                  CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel",
                  k ? k->name : NULL, &p);
    CUresult r = sim_enter(__func__, true);
    if (r == CUDA_SUCCESS)
        r = k ? launch(k, hStream, kernelParams, NULL, gridDimX, gridDimY, gridDimZ, blockDimX,
                       blockDimY, blockDimZ)
              : CUDA_ERROR_INVALID_HANDLE;
    sim_api_exit(&call, &r);
    return r;
}

struct sim_op *sim_kernel_op(const CUDA_KERNEL_NODE_PARAMS *p, CUresult *r)
{
    *r = CUDA_ERROR_INVALID_VALUE;
    if (!p || !p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY ||
        !p->blockDimZ)
        return NULL;
    struct sim_kernel *k = kernel_get(p->func ? (const void *)p->func : (const void *)p->kern);
    void *unpacked[MAX_PARAMS], **params = p->kernelParams;
    if (k && p->extra) {
        if ((*r = unpack_extra(k, params, p->extra, unpacked)) != CUDA_SUCCESS)
            return NULL;
        params = unpacked;
    }
    if (!k || (k->nparams > 0 && !params))
        return NULL;
    struct launch_op *op = launch_op_new(k, params);
    *r = op ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    return op ? &op->op : NULL;
}
