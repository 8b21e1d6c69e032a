/* dl.h — finding real symbols: the bottom of interpose/, which every other
 * file may call and which calls none of them.
 *
 * Built without sanitizers (their runtimes call dlsym while they start,
 * before instrumented code may run, and the exported dlsym, dlsym.c, runs
 * on these). Nothing here allocates or locks.
 */
#ifndef SH_INTERPOSE_DL_H
#define SH_INTERPOSE_DL_H

struct link_map;

/* The C library's dlsym, found once (a benign race: every thread finds the
 * same); NULL if it cannot be found. */
typedef void *(*sh_dlsym_fn)(void *, const char *);
sh_dlsym_fn sh_dl_real(void);

/* The real dlsym's answer: the library's own lookups go here, never through
 * the exported dlsym, which hands out wrappers. */
void *sh_dl_lookup(void *handle, const char *name);

/* The loaded object containing addr; ours; whether an object is libcuda,
 * libcudart or libcupti. */
struct link_map *sh_dl_object(const void *addr);
struct link_map *sh_dl_self(void);
int sh_dl_is_cuda(const struct link_map *lm);

/* name in the loaded CUDA library of one kind (0: the driver, 1: the
 * runtime), else the next definition after ours. A library loaded
 * RTLD_LOCAL (as a Python extension's dependencies are) is found by name,
 * where dlsym(RTLD_NEXT) would miss it. Not cached. */
void *sh_icept_lookup(int runtime, const char *name);

/* sh_icept_lookup's answer, cached in *slot once found. A miss is never
 * cached: a hook may run before the CUDA runtime loads the driver (a
 * program's fatbins are registered before main), and the driver's entry
 * points exist from then on. */
void *sh_icept_lazy(void *_Atomic *slot, int runtime, const char *name);

#endif
