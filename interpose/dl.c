/* dl.c — real symbols: the C library's dlsym, the loaded objects, and a
 * CUDA library's functions by name (see dl.h).
 *
 * Shared state: the real dlsym and our own object, each found once.
 */
#include "interpose/dl.h"

#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

static _Atomic(sh_dlsym_fn) real_dlsym;

sh_dlsym_fn sh_dl_real(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    sh_dlsym_fn f = atomic_load_explicit(&real_dlsym, memory_order_acquire);
    for (size_t i = 0; !f && i < sizeof versions / sizeof *versions; i++)
        f = (sh_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (f)
        atomic_store_explicit(&real_dlsym, f, memory_order_release);
    return f;
}

void *sh_dl_lookup(void *handle, const char *name)
{
    sh_dlsym_fn f = sh_dl_real();
    return f ? f(handle, name) : NULL;
}

struct link_map *sh_dl_object(const void *addr)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!addr || !dladdr1(addr, &info, (void **)&lm, RTLD_DL_LINKMAP))
        return NULL;
    return lm;
}

struct link_map *sh_dl_self(void)
{
    static struct link_map *_Atomic me;
    struct link_map *m = atomic_load_explicit(&me, memory_order_acquire);
    if (!m) {
        m = sh_dl_object((const void *)sh_dl_self);
        atomic_store_explicit(&me, m, memory_order_release);
    }
    return m;
}

int sh_dl_is_cuda(const struct link_map *lm)
{
    const char *slash = lm && lm->l_name ? strrchr(lm->l_name, '/') : NULL;
    const char *base = slash ? slash + 1 : lm ? lm->l_name : NULL;
    return base &&
           (strncmp(base, "libcuda.so", 10) == 0 || strncmp(base, "libcudart.so", 12) == 0 ||
            strncmp(base, "libcupti.so", 11) == 0);
}

void *sh_icept_lookup(int runtime, const char *name)
{
    static const char *const driver[] = {"libcuda.so.1", NULL};
    static const char *const rt[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
    for (const char *const *n = runtime ? rt : driver; *n; n++) {
        void *h = dlopen(*n, RTLD_LAZY | RTLD_NOLOAD);
        void *f = h ? sh_dl_lookup(h, name) : NULL;
        if (h)
            dlclose(h); /* only our reference: someone else loaded it */
        if (f)
            return f;
    }
    return sh_dl_lookup(RTLD_NEXT, name);
}

void *sh_icept_lazy(void *_Atomic *slot, int runtime, const char *name)
{
    void *f = atomic_load_explicit(slot, memory_order_acquire);
    if (!f && (f = sh_icept_lookup(runtime, name)) != NULL)
        atomic_store_explicit(slot, f, memory_order_release);
    return f;
}
