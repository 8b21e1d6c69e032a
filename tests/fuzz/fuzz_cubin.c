/* fuzz_cubin.c — libFuzzer target: cubin and fatbin images read for kernel
 * parameter layouts. */
#include "interpose/cubin.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int visit(void *ctx, const struct sh_cubin_kernel *k)
{
    (void)ctx;
    (void)k;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sh_cubin_param p[64];
    size_t n = 0, extent = 0;
    const char *why = NULL;
    sh_cubin_image_size(data, size, &extent);
    sh_cubin_kernel_params(data, size, "k_ptrs", p, 64, &n, &why);
    sh_cubin_list_kernels(data, size, visit, NULL, &why);
    return 0;
}
