/* interpose.h — state shared by the interposer's files.
 *
 * interpose/ holds thin exported symbols; decisions live in pool/ and
 * policy/. runtime.c owns the process-wide state below: it is set up once
 * (configuration at load time, the driver and the pool at the first managed
 * call) and read without locks afterwards.
 */
#ifndef SH_INTERPOSE_H
#define SH_INTERPOSE_H

#include "interpose/driver.h"
#include "policy/config.h"
#include "pool/pool.h"

#include <cuda_runtime_api.h>
#include <stdatomic.h>

struct sh_real {
    __typeof__(cudaMalloc) *cudaMalloc;
    __typeof__(cudaFree) *cudaFree;
    __typeof__(cudaMallocAsync) *cudaMallocAsync;
    __typeof__(cudaFreeAsync) *cudaFreeAsync;
    __typeof__(cudaMemGetInfo) *cudaMemGetInfo;
    __typeof__(cudaGetDevice) *cudaGetDevice;
};

struct sh_runtime {
    struct sh_config cfg;
    struct sh_real real;
    struct sh_driver drv;
    struct sh_pool *pool;
    CUdevice dev;
    CUcontext ctx;
    size_t card_bytes;
    atomic_ullong passthrough, oom;
    atomic_llong step;
    atomic_int phase;
};

extern struct sh_runtime sh_rt;

/* The real cudart functions; resolved on first use, never NULL afterwards
 * unless the program has no CUDA runtime at all. */
const struct sh_real *sh_real(void);

/* 1 when allocations are managed: the library is enabled and the driver
 * and pool came up. Initialises on first call; makes the primary context
 * current on the calling thread. */
int sh_managed(void);

/* cudaErrorMemoryAllocation, with one stderr line saying why. */
cudaError_t sh_oom(size_t size, const char *what);

#endif
