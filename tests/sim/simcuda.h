/* simcuda.h — the test-side API of the simulated GPU (build/sim/libcuda.so.1).
 *
 * Kernels are host functions registered with their parameter layout. A
 * program launches one with cudaLaunchKernel((const void *)fn, ...) or with
 * cuLaunchKernel(simcuda_function(fn), ...); the simulated stream runs it on
 * its worker thread, where device memory is real process memory.
 *
 * Environment: SIMCUDA_DEVICES (1, up to 8), SIMCUDA_VRAM_MB (1024; or one
 * size per device, "64,32"), SIMCUDA_HOST_MB (8192),
 * SIMCUDA_GRANULARITY_KB (2048), SIMCUDA_PCIE_GBPS (0 = instant),
 * SIMCUDA_KERNEL_US (0), SIMCUDA_NO_HOST_VMM (0: host-located VMM supported),
 * SIMCUDA_DRIVER_VERSION (13000; see README).
 */
#ifndef SIMCUDA_H
#define SIMCUDA_H

#include <cuda.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Gets the args array exactly as cudaLaunchKernel/cuLaunchKernel got it. */
typedef void (*simcuda_kernel_fn)(void **args);

/* 0, or -1 if the table is full, a parameter size is 0, or fn is NULL.
 * duration_us 0 means SIMCUDA_KERNEL_US. Registering fn again replaces it.
 *
 * The parameters are laid out as nvcc lays them out: each at the next
 * multiple of its alignment (cuFuncGetParamInfo reports the offsets). nvcc
 * aligns a parameter by its type's alignment, which only the caller knows;
 * simcuda_register_kernel assumes it from the size: 1 for 1 byte, 2 for 2-3,
 * 4 for 4-7 and 8 for 8 or more (right for scalars, pointers and most
 * structs, wrong for e.g. float3 (align 4) or float4 (align 16)). */
int simcuda_register_kernel(simcuda_kernel_fn fn, const char *name, int nparams,
                            const size_t *param_sizes, unsigned duration_us);

/* The same with each parameter's alignment given (_Alignof of its type): a
 * power of two up to 16, or 0 for the rule above; param_aligns may be NULL.
 * -1 also for an alignment that is not a power of two or is above 16. */
int simcuda_register_kernel_aligned(simcuda_kernel_fn fn, const char *name, int nparams,
                                    const size_t *param_sizes, const size_t *param_aligns,
                                    unsigned duration_us);

/* The CUfunction for a registered kernel, or NULL. */
CUfunction simcuda_function(simcuda_kernel_fn fn);

/* cuLaunchKernel (grid and block in x only), reached as a library that
 * resolved the driver before anything could interpose does: no exported
 * symbol in between, only the driver's CUPTI callbacks see it. kernelParams
 * or extra (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE) as cuLaunchKernel takes. */
CUresult simcuda_launch_unhooked(CUfunction f, unsigned int grid, unsigned int block,
                                 CUstream hStream, void **kernelParams, void **extra);

typedef struct {
    size_t device_bytes_in_use, device_bytes_peak, host_bytes_in_use;
    unsigned long long copies_h2d, copies_d2h, bytes_h2d, bytes_d2h, launches, faults;
    /* Microseconds the copies over the modelled link (SIMCUDA_PCIE_GBPS) took,
     * each from its start to its end: never less than modelled, more when
     * moving the bytes here took longer (pages touched for the first time). */
    unsigned long long us_h2d, us_d2h;
    /* The library's own kernels (fingerprints, the pointer prefilter),
     * paced at SIMCUDA_HBM_GBPS: the bytes they read and the microseconds
     * they took, more than modelled when the CPU standing in for the
     * card's memory could not keep up. */
    unsigned long long bytes_hbm, us_hbm;
} simcuda_stats_t;

void simcuda_get_stats(simcuda_stats_t *out);

/* In the simulated CUPTI (libcupti.so.13): fn(event, arg) is called as
 * cuptiSubscribe starts (SIMCUDA_CUPTI_SUBSCRIBING, before anything is
 * checked) and once cuptiUnsubscribe or cuptiFinalize has removed a
 * subscriber (SIMCUDA_CUPTI_UNSUBSCRIBED), on the calling thread with no lock held:
 * a test acts at the exact points where one subscriber gives way to the
 * next. NULL stops it. */
enum { SIMCUDA_CUPTI_SUBSCRIBING = 1, SIMCUDA_CUPTI_UNSUBSCRIBED = 2 };
typedef void (*simcuda_cupti_probe_fn)(int event, void *arg);
void simcuda_cupti_probe(simcuda_cupti_probe_fn fn, void *arg);

/* Ends every SIMCUDA_FAIL rule, persistent ones included: from here on no
 * call fails by injection (a fault sweep checks what is left once the
 * failure has passed). */
void simcuda_fail_clear(void);

/* The address a texture object's linear (or pitched) memory starts at:
 * how a kernel reads through the object here. NULL for no live object. */
void *simcuda_texture_address(unsigned long long tex);

/* In the simulated runtime (libcudart.so.13): symbol, the host shadow of a
 * __device__ variable of size bytes, becomes known to cudaGetSymbolAddress,
 * cudaGetSymbolSize and cudaMemcpy{To,From}Symbol[Async] (unknown symbols
 * get cudaErrorInvalidSymbol). Its device memory comes from the driver at
 * its first use there and reads zero until written. 0, or -1 for a NULL
 * symbol, size 0, a full table, or symbol registered with another size. */
int simcuda_register_var(const void *symbol, const char *name, size_t size);

/* The device address kernels reach symbol's variable at (what compiled
 * device code refers to), without an API call; NULL before its first use. */
void *simcuda_var_address(const void *symbol);

#ifdef __cplusplus
}
#endif
#endif
