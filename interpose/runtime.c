/* runtime.c — the process-wide state every file of interpose/ reads
 * (sh_rt), and what is known of it before anything else runs: the
 * configuration at load time (a bad stagehand.ini stops the program before
 * it runs) and the real runtime functions. start.c brings the rest up.
 *
 * Shared state: sh_rt, written at load time and inside start.c's
 * pthread_once, read-only after; the counters and flags in it are atomics.
 */
#include "interpose/dl.h"
#include "interpose/interpose.h"

#include "sh_log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

extern char **environ;

struct sh_runtime sh_rt;

static pthread_once_t real_once = PTHREAD_ONCE_INIT;

__attribute__((constructor)) static void load_config(void)
{
    if (sh_config_disabled(environ)) {
        sh_rt.disabled = 1;
        return;
    }
    char path[SH_CONFIG_STR_MAX], err[SH_CONFIG_ERR_MAX];
    if (sh_config_load(&sh_rt.cfg, environ, path, sizeof path, err, sizeof err) != 0) {
        fprintf(stderr, "stagehand: %s\n", err);
        _exit(1); /* nothing has run yet, so nothing is lost */
    }
    sh_log_set_level(sh_rt.cfg.general.log_level);
    if (sh_config_secure())
        sh_log(SH_LOG_WARN, "secure-execution mode: STAGEHAND_* variables ignored, and a "
                            "stagehand.ini is read only if root owns it");
    sh_rt.disabled = !sh_rt.cfg.general.enabled;
    if (path[0])
        sh_log(SH_LOG_INFO, "configuration from %s", path);
}

static void resolve_real(void)
{
    void *h = RTLD_NEXT;
#define REAL(name) sh_rt.real.name = (__typeof__(sh_rt.real.name))sh_dl_lookup(h, #name)
    REAL(cudaMalloc);
    if (!sh_rt.real.cudaMalloc) {
        /* The runtime was loaded after us: look in the global scope. */
        h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            h = RTLD_DEFAULT;
        REAL(cudaMalloc);
    }
    REAL(cudaFree);
    REAL(cudaMallocAsync);
    REAL(cudaFreeAsync);
    REAL(cudaMemGetInfo);
    REAL(cudaGetDevice);
    REAL(cudaSetDevice);
    REAL(cudaGetLastError);
    REAL(cudaPeekAtLastError);
#undef REAL
}

const struct sh_real *sh_real(void)
{
    pthread_once(&real_once, resolve_real);
    return &sh_rt.real;
}

int sh_active(void)
{
    return atomic_load_explicit(&sh_rt.managed, memory_order_acquire);
}

int sh_capturing(void)
{
    return atomic_load(&sh_rt.captures) > 0;
}
