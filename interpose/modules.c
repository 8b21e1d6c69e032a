/* modules.c — module images and kernel names, for drivers that cannot
 * report parameter layouts themselves.
 *
 * The runtime registers every fatbin a program or library carries
 * (__cudaRegisterFatBinary) and maps each host launch stub to its kernel's
 * device name (__cudaRegisterFunction); programs that load modules
 * themselves pass images to cuModuleLoadData / cuLibraryLoadData. We keep a
 * pointer to each registered fatbin (static data that lives as long as the
 * program) and a copy of each loaded image (which the program may free),
 * the latter only when the fallback is needed, then read layouts from them
 * on demand with cubin.c.
 *
 * Locking: mod_mu guards the image list and the stub -> name table.
 */
#include "interpose/dl.h"
#include "interpose/cubin.h"
#include "interpose/interpose.h"
#include "sh_err.h"

#include <dlfcn.h>
#include <fatbinary_section.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

struct image {
    const void *data;
    size_t size;
    void *owned; /* our copy, or NULL for static fatbins */
    struct image *next;
};

struct stub_name {
    const void *stub;
    char *name;
    struct stub_name *next;
};

static pthread_mutex_t mod_mu = PTHREAD_MUTEX_INITIALIZER;
/* Until launch.c finds the driver reports layouts, images are kept. */
static atomic_int keep_images = 1;
static struct image *images;
static struct stub_name *names;

/* The real functions, found at their first call (sh_icept_lazy): the
 * fatbins are registered before main, the driver loaded later still. */
static struct {
    void *_Atomic register_fatbin, *_Atomic register_function;
    void *_Atomic module_load_data, *_Atomic library_load_data;
    void *_Atomic library_get_kernel, *_Atomic library_enumerate_kernels;
} real;

/* Kernel handles seen, open addressing, doubled at half full; mod_mu. */
static const void **kernels;
static size_t kernels_cap, kernels_n;

static void add_image(const void *data, size_t size, void *owned)
{
    struct image *im = malloc(sizeof *im);
    if (!im) {
        free(owned);
        return;
    }
    *im = (struct image){data, size, owned, NULL};
    pthread_mutex_lock(&mod_mu);
    im->next = images;
    images = im;
    pthread_mutex_unlock(&mod_mu);
}

void sh_modules_keep_images(int on)
{
    atomic_store_explicit(&keep_images, on, memory_order_relaxed);
}

/* Keeps a copy of an image the driver accepted (the caller may free it). */
static void keep_copy(const void *image)
{
    size_t size = 0;
    if (!image || !atomic_load_explicit(&keep_images, memory_order_relaxed) ||
        sh_cubin_image_size(image, SIZE_MAX, &size) != 0)
        return;
    void *copy = malloc(size);
    if (copy) {
        memcpy(copy, image, size);
        add_image(copy, size, copy);
    }
}

EXPORT void **__cudaRegisterFatBinary(void *fat);
void **__cudaRegisterFatBinary(void *fat)
{
    void **(*f)(void *) =
        (void **(*)(void *))sh_icept_lazy(&real.register_fatbin, 1, "__cudaRegisterFatBinary");
    const __fatBinC_Wrapper_t *w = fat;
    size_t size = 0;
    if (w && w->magic == FATBINC_MAGIC && w->data &&
        sh_cubin_image_size(w->data, SIZE_MAX, &size) == 0)
        add_image(w->data, size, NULL);
    return f ? f(fat) : NULL;
}

EXPORT void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                                   const char *device_name, int thread_limit, uint3 *tid,
                                   uint3 *bid, dim3 *bdim, dim3 *gdim, int *wsize);
void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                            const char *device_name, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bdim, dim3 *gdim, int *wsize)
{
    void (*f)(void **, const char *, char *, const char *, int, uint3 *, uint3 *, dim3 *, dim3 *,
              int *) =
        (__typeof__(f))sh_icept_lazy(&real.register_function, 1, "__cudaRegisterFunction");
    struct stub_name *n = malloc(sizeof *n);
    if (n && device_fun && (n->name = strdup(device_fun))) {
        n->stub = host_fun;
        pthread_mutex_lock(&mod_mu);
        n->next = names;
        names = n;
        pthread_mutex_unlock(&mod_mu);
    } else {
        free(n);
    }
    if (f)
        f(handle, host_fun, device_fun, device_name, thread_limit, tid, bid, bdim, gdim, wsize);
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    __typeof__(cuModuleLoadData) *f =
        (__typeof__(f))sh_icept_lazy(&real.module_load_data, 0, "cuModuleLoadData");
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(module, image);
    if (r == CUDA_SUCCESS)
        keep_copy(image);
    return r;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jit_options,
                                  void **jit_values, unsigned int njit, CUlibraryOption *options,
                                  void **values, unsigned int noptions)
{
    __typeof__(cuLibraryLoadData) *f =
        (__typeof__(f))sh_icept_lazy(&real.library_load_data, 0, "cuLibraryLoadData");
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(library, code, jit_options, jit_values, njit, options, values, noptions);
    if (r == CUDA_SUCCESS)
        keep_copy(code);
    return r;
}

static size_t kernel_slot(const void **t, size_t cap, const void *k)
{
    size_t i = ((uintptr_t)k >> 4) * 0x9e3779b97f4a7c15ull & (cap - 1);
    while (t[i] && t[i] != k)
        i = (i + 1) & (cap - 1);
    return i;
}

/* mod_mu held. A handle that cannot be noted (no memory) stays unknown:
 * its launches are then unbounded, which costs speed only. */
static void note_kernel(const void *k)
{
    if (!k)
        return;
    if (2 * (kernels_n + 1) > kernels_cap) {
        size_t cap = kernels_cap ? 2 * kernels_cap : 256;
        const void **t = calloc(cap, sizeof *t);
        if (!t)
            return;
        for (size_t i = 0; i < kernels_cap; i++)
            if (kernels[i])
                t[kernel_slot(t, cap, kernels[i])] = kernels[i];
        free(kernels);
        kernels = t;
        kernels_cap = cap;
    }
    size_t i = kernel_slot(kernels, kernels_cap, k);
    kernels_n += !kernels[i];
    kernels[i] = k;
}

int sh_modules_is_kernel(const void *handle)
{
    pthread_mutex_lock(&mod_mu);
    int seen = handle && kernels_cap && kernels[kernel_slot(kernels, kernels_cap, handle)];
    pthread_mutex_unlock(&mod_mu);
    return seen;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name)
{
    __typeof__(cuLibraryGetKernel) *f =
        (__typeof__(f))sh_icept_lazy(&real.library_get_kernel, 0, "cuLibraryGetKernel");
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(kernel, library, name);
    if (r == CUDA_SUCCESS && kernel) {
        pthread_mutex_lock(&mod_mu);
        note_kernel(*kernel);
        pthread_mutex_unlock(&mod_mu);
    }
    return r;
}

EXPORT CUresult cuLibraryEnumerateKernels(CUkernel *kernels_out, unsigned int n, CUlibrary lib)
{
    __typeof__(cuLibraryEnumerateKernels) *f = (__typeof__(f))sh_icept_lazy(
        &real.library_enumerate_kernels, 0, "cuLibraryEnumerateKernels");
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(kernels_out, n, lib);
    if (r == CUDA_SUCCESS && kernels_out) {
        pthread_mutex_lock(&mod_mu);
        for (unsigned i = 0; i < n; i++)
            note_kernel(kernels_out[i]);
        pthread_mutex_unlock(&mod_mu);
    }
    return r;
}

const char *sh_modules_stub_name(const void *stub)
{
    const char *name = NULL;
    pthread_mutex_lock(&mod_mu);
    for (struct stub_name *n = names; n && !name; n = n->next)
        if (n->stub == stub)
            name = n->name; /* entries are never freed */
    pthread_mutex_unlock(&mod_mu);
    return name;
}

/* Whether image im describes kernel name as params[0..n) does (or not at
 * all). Two modules may each have a kernel of one name (static kernels of
 * two files); the name alone then cannot say which layout a launch has. */
static int agrees(const struct image *im, const char *name, const struct sh_cubin_param *params,
                  size_t n)
{
    struct sh_cubin_param other[128];
    size_t m = 0;
    int rc = sh_cubin_kernel_params(im->data, im->size, name, other, 128, &m, NULL);
    if (rc == SH_ENOTFOUND)
        return 1;
    return rc == 0 && m == n && memcmp(other, params, n * sizeof *params) == 0;
}

int sh_modules_layout(const char *name, struct sh_cubin_param *params, size_t cap, size_t *count)
{
    int rc = SH_ENOTFOUND;
    pthread_mutex_lock(&mod_mu);
    struct image *im = images;
    for (; im && rc != 0 && rc != SH_ERANGE; im = im->next)
        rc = sh_cubin_kernel_params(im->data, im->size, name, params, cap, count, NULL);
    for (; rc == 0 && im; im = im->next)
        if (!agrees(im, name, params, *count))
            rc = SH_EINVAL;
    pthread_mutex_unlock(&mod_mu);
    return rc;
}
