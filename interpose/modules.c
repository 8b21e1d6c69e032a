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

static struct {
    void **(*register_fatbin)(void *);
    void (*register_function)(void **, const char *, char *, const char *, int, uint3 *, uint3 *,
                              dim3 *, dim3 *, int *);
    __typeof__(cuModuleLoadData) *cuModuleLoadData;
    __typeof__(cuLibraryLoadData) *cuLibraryLoadData;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
    real.register_fatbin = (void **(*)(void *))sh_dl_lookup(RTLD_NEXT, "__cudaRegisterFatBinary");
    real.register_function =
        (__typeof__(real.register_function))sh_dl_lookup(RTLD_NEXT, "__cudaRegisterFunction");
    real.cuModuleLoadData =
        (__typeof__(cuModuleLoadData) *)sh_dl_lookup(RTLD_NEXT, "cuModuleLoadData");
    real.cuLibraryLoadData =
        (__typeof__(cuLibraryLoadData) *)sh_dl_lookup(RTLD_NEXT, "cuLibraryLoadData");
}

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
    pthread_once(&real_once, resolve);
    const __fatBinC_Wrapper_t *w = fat;
    size_t size = 0;
    if (w && w->magic == FATBINC_MAGIC && w->data &&
        sh_cubin_image_size(w->data, SIZE_MAX, &size) == 0)
        add_image(w->data, size, NULL);
    return real.register_fatbin ? real.register_fatbin(fat) : NULL;
}

EXPORT void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                                   const char *device_name, int thread_limit, uint3 *tid,
                                   uint3 *bid, dim3 *bdim, dim3 *gdim, int *wsize);
void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                            const char *device_name, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bdim, dim3 *gdim, int *wsize)
{
    pthread_once(&real_once, resolve);
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
    if (real.register_function)
        real.register_function(handle, host_fun, device_fun, device_name, thread_limit, tid, bid,
                               bdim, gdim, wsize);
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    pthread_once(&real_once, resolve);
    CUresult r = real.cuModuleLoadData(module, image);
    if (r == CUDA_SUCCESS)
        keep_copy(image);
    return r;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jit_options,
                                  void **jit_values, unsigned int njit, CUlibraryOption *options,
                                  void **values, unsigned int noptions)
{
    pthread_once(&real_once, resolve);
    CUresult r = real.cuLibraryLoadData(library, code, jit_options, jit_values, njit, options,
                                        values, noptions);
    if (r == CUDA_SUCCESS)
        keep_copy(code);
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

int sh_modules_layout(const char *name, struct sh_cubin_param *params, size_t cap, size_t *count)
{
    int rc = SH_ENOTFOUND;
    pthread_mutex_lock(&mod_mu);
    for (struct image *im = images; im && rc != 0 && rc != SH_ERANGE; im = im->next)
        rc = sh_cubin_kernel_params(im->data, im->size, name, params, cap, count, NULL);
    pthread_mutex_unlock(&mod_mu);
    return rc;
}
