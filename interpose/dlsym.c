/* dlsym.c — the interposed dlsym: the top of interpose/, since it hands
 * out the interception table's wrappers (intercept.c).
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
 * below), as are the helpers it runs on (dl.c). Nothing here allocates or
 * locks.
 */
#include "interpose/dl.h"
#include "interpose/intercept.h"

#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))

/* RTLD_DEFAULT and RTLD_NEXT depend on who asks (the caller's own scope,
 * the objects after the caller's), and glibc learns that from the return
 * address: so those go to the real dlsym as a tail call, which leaves the
 * caller's return address in place (this file is built with sibling calls
 * on; test_e2e_dlsym fails if one is not). Our exports come first in the
 * global scope anyway. A handle's lookup does not depend on the caller. */
EXPORT void *dlsym(void *handle, const char *name)
{
    sh_dlsym_fn real = sh_dl_real();
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
