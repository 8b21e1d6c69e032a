/* drv_module.c — modules, as far as the simulated GPU can run them: the
 * library's own PTX (clean/ptx.c, its two kernels). A module loaded from
 * exactly that text binds its entries, stagehand_fp_v1 and
 * stagehand_ptrs_v1, to the kernels' host stand-ins (clean/hash.c), which
 * compute what the PTX computes, bit for bit (tests/gpu checks that they
 * agree on a real card). Any other image
 * is refused loudly: the simulated GPU cannot compile or run device code.
 *
 * Locking: mod_mu guards the module list. Modules are never freed: an
 * unloaded one is marked dead, so a stale handle is caught, never followed.
 */
#include "sim.h"

#include "clean/clean.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODULE_MAGIC 0x4d4f444cu
#define MODULE_DEAD  0x44454144u

struct sim_module {
    unsigned magic;
    CUfunction fn, ptrs; /* SH_CLEAN_KERNEL, SH_PTRS_KERNEL */
    struct sim_module *next;
};

static pthread_mutex_t mod_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_module *modules; /* every module ever loaded */

/* The live module behind h, or NULL; mod_mu held. */
static struct sim_module *module_get(CUmodule h)
{
    for (struct sim_module *m = modules; m; m = m->next)
        if ((CUmodule)m == h)
            return m->magic == MODULE_MAGIC ? m : NULL;
    return NULL;
}

SIM_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(image, sh_clean_ptx) != 0) {
        fprintf(stderr, "simcuda: cuModuleLoadData: the simulated GPU runs no device code but "
                        "the library's own PTX (" SH_CLEAN_KERNEL ")\n");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    static const size_t sizes[] = {sizeof(void *), sizeof(uint64_t), sizeof(void *),
                                   sizeof(void *)};
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = MODULE_MAGIC;
    static const size_t ptrs_sizes[] = {sizeof(void *), sizeof(uint64_t), sizeof(uint32_t),
                                        sizeof(uint32_t), sizeof(void *)};
    /* The fingerprint reads its bytes, the prefilter its 32-bit words. */
    m->fn = sim_builtin_kernel(sh_clean_kernel_host, SH_CLEAN_KERNEL, 4, sizes, 1, 1);
    m->ptrs = sim_builtin_kernel(sh_clean_ptrs_host, SH_PTRS_KERNEL, 5, ptrs_sizes, 1, 4);
    if (!m->fn || !m->ptrs) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&mod_mu);
    m->next = modules;
    modules = m;
    pthread_mutex_unlock(&mod_mu);
    *module = (CUmodule)m;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mod_mu);
    struct sim_module *m = module_get(hmod);
    CUfunction fn = m ? m->fn : NULL, ptrs = m ? m->ptrs : NULL;
    pthread_mutex_unlock(&mod_mu);
    if (!fn)
        return CUDA_ERROR_INVALID_HANDLE;
    if (strcmp(name, SH_CLEAN_KERNEL) == 0)
        *hfunc = fn;
    else if (strcmp(name, SH_PTRS_KERNEL) == 0)
        *hfunc = ptrs;
    else
        return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    pthread_mutex_lock(&mod_mu);
    struct sim_module *m = module_get(hmod);
    if (m)
        m->magic = MODULE_DEAD;
    pthread_mutex_unlock(&mod_mu);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
