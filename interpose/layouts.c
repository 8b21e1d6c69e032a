/* layouts.c — what a kernel's parameters are: their offsets and sizes,
 * asked of the driver (cuFuncGetParamInfo, cuKernelGetParamInfo) or, where
 * it cannot answer, read from the module images seen (modules.c), and
 * cached per function; and whether its accesses have no bound.
 *
 * Locking: layout_mu guards filling the cache; a filled slot is read
 * without it.
 */
#include "interpose/cubin.h"
#include "interpose/dl.h"
#include "interpose/interpose.h"

#include "sh_log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LAYOUTS    SH_LAYOUTS
#define MAX_PARAMS SH_LAYOUT_MAX_PARAMS

static pthread_mutex_t layout_mu = PTHREAD_MUTEX_INITIALIZER;
struct sh_layout *sh_layouts; /* open addressing on key */
static __typeof__(cudaGetFuncBySymbol) *real_get_func;
static CUresult (*kernel_param_info)(CUkernel, size_t, size_t *, size_t *);
static CUresult (*func_param_info)(CUfunction, size_t, size_t *, size_t *);
static CUresult (*func_get_name)(const char **, CUfunction);
static CUresult (*kernel_get_name)(const char **, CUkernel);

/* The kernel's mangled name, for the image fallback. */
static const char *kernel_name(const struct sh_layout *l, const void *key, CUfunction f)
{
    const char *name = NULL;
    if (l->from == SH_KEY_HOST_FN)
        name = sh_modules_stub_name(key);
    if (!name && f && func_get_name)
        func_get_name(&name, f);
    if (!name && l->from == SH_KEY_KERNEL && kernel_get_name)
        kernel_get_name(&name, (CUkernel)(uintptr_t)key);
    return name;
}

/* Reads the layout from the module images (cubin.c), for drivers without
 * cuFuncGetParamInfo. 0 if no image describes the kernel (or it has no
 * name here: cuFuncGetName came in 12.3): its pointers cannot be seen. */
static int fill_from_images(struct sh_layout *l, const void *key, CUfunction f)
{
    const char *name = kernel_name(l, key, f);
    struct sh_cubin_param p[MAX_PARAMS];
    size_t n = 0;
    if (!name || sh_modules_layout(name, p, MAX_PARAMS, &n) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].offset > UINT16_MAX || p[i].size > UINT16_MAX)
            return 0;
        l->off[i] = (uint16_t)p[i].offset;
        l->size[i] = (uint16_t)p[i].size;
        l->nparams = (int)i + 1;
    }
    return 1;
}

/* NCCL's kernels take their buffers from work queues in device memory:
 * no parameter names them. A kernel the driver will not name may be one. */
static int keeps_pointers(const char *name)
{
    return !name || strstr(name, "ncclKernel") || strstr(name, "ncclDevKernel");
}

/* The function of a launch stub into *f (NULL if it is none). 0 when it
 * could not be asked: cudaGetFuncBySymbol leaves its failure as the
 * thread's last error, which the program would read as its own, so it is
 * asked only while no error of the program's is pending, and its own
 * failure is cleared. */
static int stub_function(const void *key, CUfunction *f)
{
    const struct sh_real *rt = sh_real();
    *f = NULL;
    if (!real_get_func || !rt->cudaPeekAtLastError || !rt->cudaGetLastError)
        return 1;
    if (rt->cudaPeekAtLastError() != cudaSuccess)
        return 0;
    if (real_get_func((cudaFunction_t *)f, key) != cudaSuccess) {
        rt->cudaGetLastError();
        *f = NULL;
    }
    return 1;
}

/* 0 when the layout cannot be read now (stub_function): it is not kept,
 * and asked again at the next launch. */
static int fill_layout(struct sh_layout *l, const void *key)
{
    CUfunction f = NULL;
    l->from = l->kind;
    if (l->kind == SH_KEY_HOST_FN && sh_modules_is_kernel(key))
        l->from = SH_KEY_KERNEL; /* CUDA 13's stubs launch the kernel handle */
    else if (l->kind == SH_KEY_HOST_FN && !stub_function(key, &f))
        return 0;
    else if (l->kind == SH_KEY_FUNCTION)
        f = (CUfunction)(uintptr_t)key;
    /* Neither a stub nor a kernel seen loaded: its arguments cannot be read. */
    int known = l->from != SH_KEY_HOST_FN || f;
    /* The driver says "invalid value" past the last parameter; any other
     * answer, or more parameters than a layout holds, leaves some unread. */
    int cut = 0;
    for (int i = 0; i <= MAX_PARAMS; i++) {
        size_t off = 0, size = 0;
        CUresult r = CUDA_ERROR_INVALID_VALUE;
        int asked = 1;
        if (l->from == SH_KEY_KERNEL && kernel_param_info)
            r = kernel_param_info((CUkernel)(uintptr_t)key, (size_t)i, &off, &size);
        else if (l->from != SH_KEY_KERNEL && f && func_param_info)
            r = func_param_info(f, (size_t)i, &off, &size);
        else
            asked = 0; /* no entry point for this kind: the images say, or nothing */
        if (i == 0 && (r == CUDA_ERROR_NOT_SUPPORTED ||
                       (!asked && (known || (!func_param_info && !kernel_param_info))))) {
            sh_modules_keep_images(1); /* from now on */
            known = fill_from_images(l, key, f);
            break;
        }
        if (r == CUDA_ERROR_INVALID_VALUE)
            break;
        if (r != CUDA_SUCCESS || off > UINT16_MAX || size > UINT16_MAX || i == MAX_PARAMS) {
            cut = 1;
            break;
        }
        l->off[i] = (uint16_t)off;
        l->size[i] = (uint16_t)size;
        l->nparams = i + 1;
    }
    l->opaque = !known || cut || keeps_pointers(kernel_name(l, key, f));
    sh_log(SH_LOG_DEBUG, "layout of %p (kind %d, read as %d): %d parameters%s", key, l->kind,
           l->from, l->nparams, l->opaque ? ", opaque" : "");
    return 1;
}

/* The cached layout of a function. A slot's key is published last, with
 * release, and a filled layout never changes: a hit reads it without the
 * lock. Misses (one per function) fill a slot under layout_mu. */
const struct sh_layout *sh_layout_fill(const void *key, int kind)
{
    size_t h = sh_layout_slot(key);
    const struct sh_layout *found = NULL;
    pthread_mutex_lock(&layout_mu);
    for (size_t i = 0; i < LAYOUTS && !found; i++) {
        struct sh_layout *l = &sh_layouts[(h + i) % LAYOUTS];
        if (l->key == key && l->kind == kind) {
            found = l;
        } else if (!l->key) {
            l->kind = kind;
            if (!fill_layout(l, key))
                break; /* the slot stays free */
            __atomic_store_n(&l->key, key, __ATOMIC_RELEASE);
            found = l;
        }
    }
    pthread_mutex_unlock(&layout_mu);
    return found; /* NULL: table full, or not readable now; the launch is opaque */
}

int sh_layouts_init(void)
{
    sh_layouts = calloc(LAYOUTS, sizeof *sh_layouts);
    if (!sh_layouts)
        return -1;
    real_get_func =
        (__typeof__(cudaGetFuncBySymbol) *)sh_dl_lookup(RTLD_NEXT, "cudaGetFuncBySymbol");
    const struct sh_driver *d = &sh_rt.drv;
    func_param_info =
        (__typeof__(func_param_info))sh_driver_optional(d, "cuFuncGetParamInfo", 12040);
    kernel_param_info =
        (__typeof__(kernel_param_info))sh_driver_optional(d, "cuKernelGetParamInfo", 12040);
    func_get_name = (__typeof__(func_get_name))sh_driver_optional(d, "cuFuncGetName", 12030);
    kernel_get_name = (__typeof__(kernel_get_name))sh_driver_optional(d, "cuKernelGetName", 12030);
    sh_modules_keep_images(!func_param_info);
    if (!func_param_info)
        sh_log(SH_LOG_INFO, "the driver has no cuFuncGetParamInfo: reading parameter layouts "
                            "from module images");
    return 0;
}
