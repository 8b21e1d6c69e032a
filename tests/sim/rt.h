/* rt.h — what the files of the simulated runtime share: cudart.c (state,
 * errors, devices), cudart_mem.c (memory and copies), cudart_work.c
 * (streams, events, graphs, launches, entry points).
 */
#ifndef SIM_RT_H
#define SIM_RT_H

#include "sim.h"

#include <cuda_runtime_api.h>

SIM_EXPORT void simcuda__api_enter(struct sim_api_call *call, int domain, int cbid,
                                   const char *fname, const char *symbol, const void *params);
SIM_EXPORT void simcuda__api_exit(struct sim_api_call *call, void *ret);
SIM_EXPORT const char *simcuda__function_name(CUfunction f);
SIM_EXPORT int simcuda__device_count(void);
SIM_EXPORT int simcuda__current_device(void);

/* The runtime error for a driver result. */
cudaError_t rt_from_cu(CUresult r);
/* Records err as the thread's last error (success never overwrites it). */
cudaError_t rt_ret(cudaError_t err);
cudaError_t rt_ret_cu(CUresult r);
/* Lazy initialisation and a current context on this thread. */
cudaError_t rt_enter(void);
bool rt_device_valid(int dev);
/* The thread's current device. */
int rt_device(void);
/* dev's primary context, retained the first time it is asked for. */
CUresult rt_primary(int dev, CUcontext *out);

#define ENTER()                                                                                    \
    do {                                                                                           \
        cudaError_t e_ = rt_enter();                                                               \
        if (e_ != cudaSuccess)                                                                     \
            return e_;                                                                             \
    } while (0)

#endif
