/* dlsym.c — the interposed dlsym, and the dynamic-linker helpers the
 * interception table uses.
 *
 * A program that opens libcuda and looks its functions up by name gets the
 * wrappers, as one that links it does (and so does the CUDA runtime, which
 * finds the driver's cuGetProcAddress this way); one that opens libcupti
 * gets the library's cuptiSubscribe and its kin (cupti.c), as one that
 * links it does. Lookups by the library itself, or by a CUDA library of
 * its own functions, get the real ones.
 *
 * Built without sanitizers (their runtimes call dlsym while they start,
 * before instrumented code may run) and with sibling calls on (see dlsym
 * below). Nothing here allocates or locks; the real dlsym is found once
 * (a benign race: every thread finds the same).
 */
#include "interpose/intercept.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) real_dlsym;

static dlsym_fn find_dlsym(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    dlsym_fn f = atomic_load_explicit(&real_dlsym, memory_order_acquire);
    for (size_t i = 0; !f && i < sizeof versions / sizeof *versions; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (f)
        atomic_store_explicit(&real_dlsym, f, memory_order_release);
    return f;
}

void *sh_dl_lookup(void *handle, const char *name)
{
    dlsym_fn f = find_dlsym();
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

/* RTLD_DEFAULT and RTLD_NEXT depend on who asks (the caller's own scope,
 * the objects after the caller's), and glibc learns that from the return
 * address: so those go to the real dlsym as a tail call, which leaves the
 * caller's return address in place (this file is built with sibling calls
 * on; test_e2e_dlsym fails if one is not). Our exports come first in the
 * global scope anyway. A handle's lookup does not depend on the caller. */
EXPORT void *dlsym(void *handle, const char *name)
{
    dlsym_fn real = find_dlsym();
    if (!real)
        return NULL;
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return real(handle, name);
    void *f = real(handle, name);
    struct link_map *owner = f ? sh_dl_object(f) : NULL;
    if (!owner || !sh_dl_is_cuda(owner))
        return f;
    struct link_map *from = sh_dl_object(__builtin_return_address(0));
    if (from == owner || from == sh_dl_self())
        return f; /* a CUDA library's own lookup, or ours */
    return sh_icept_wrap(f);
}
