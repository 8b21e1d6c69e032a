/* test_sim_symbols.c — device variables in the simulated runtime
 * (simcuda_register_var): cudaGetSymbolAddress, cudaGetSymbolSize,
 * cudaMemcpyToSymbol(Async) and cudaMemcpyFromSymbol(Async), what a kernel
 * reads there, and the runtime's errors for unknown symbols, spans past a
 * variable's end and wrong directions.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <string.h>

#include "tests/sim/simcuda.h"

static const dim3 one = {1, 1, 1};

/* The host shadows of __device__ variables; `unknown` is never registered. */
static int table[16];
static double scalar;
static int unknown[4];

/* (int *out): *out = the sum of table, read where device code reads it. */
static void k_sum(void **args)
{
    const int *t = simcuda_var_address(table);
    int s = 0;
    for (int i = 0; t && i < 16; i++)
        s += t[i];
    **(int **)args[0] = s;
}

static int setup(void **state)
{
    (void)state;
    const size_t sz[] = {sizeof(int *)};
    return simcuda_register_var(table, "table", sizeof table) ||
           simcuda_register_var(&scalar, "scalar", sizeof scalar) ||
           simcuda_register_kernel(k_sum, "k_sum", 1, sz, 0);
}

static void registration_rules(void **state)
{
    (void)state;
    assert_int_equal(simcuda_register_var(table, "table", sizeof table), 0); /* again: kept */
    assert_int_equal(simcuda_register_var(table, "table", 4), -1);
    assert_int_equal(simcuda_register_var(NULL, "none", 4), -1);
    assert_int_equal(simcuda_register_var(unknown, "unknown", 0), -1);
    assert_null(simcuda_var_address(unknown));
}

/* The address is device memory of the variable's size, reading zero, and
 * what device code reaches; size and address stay the same. */
static void address_and_size(void **state)
{
    (void)state;
    void *a = NULL, *b = NULL;
    size_t n = 0;
    assert_int_equal(cudaGetSymbolAddress(&a, table), cudaSuccess);
    assert_non_null(a);
    assert_ptr_equal(simcuda_var_address(table), a);
    assert_int_equal(cudaGetSymbolAddress(&b, table), cudaSuccess);
    assert_ptr_equal(a, b);
    assert_int_equal(cudaGetSymbolSize(&n, table), cudaSuccess);
    assert_int_equal(n, sizeof table);
    assert_int_equal(cudaGetSymbolSize(&n, &scalar), cudaSuccess);
    assert_int_equal(n, sizeof scalar);
    struct cudaPointerAttributes at;
    assert_int_equal(cudaPointerGetAttributes(&at, a), cudaSuccess);
    assert_int_equal(at.type, cudaMemoryTypeDevice);
    int got[16], zero[16] = {0};
    assert_int_equal(cudaMemcpy(got, a, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(got, zero, sizeof got);
}

/* To and from the symbol, at an offset, every direction each accepts. */
static void copies_to_and_from(void **state)
{
    (void)state;
    int in[4] = {1, 2, 3, 4}, out[16] = {0};
    void *a = NULL, *dev = NULL;
    assert_int_equal(cudaGetSymbolAddress(&a, table), cudaSuccess);
    assert_int_equal(
        cudaMemcpyToSymbol(table, in, sizeof in, 8 * sizeof(int), cudaMemcpyHostToDevice),
        cudaSuccess);
    assert_int_equal(cudaMemcpy(out, a, sizeof out, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(out[7], 0);
    assert_memory_equal(&out[8], in, sizeof in);
    assert_int_equal(out[12], 0);

    /* Device to device both ways, through a cudaMalloc buffer. */
    assert_int_equal(cudaMalloc(&dev, sizeof in), cudaSuccess);
    assert_int_equal(
        cudaMemcpyFromSymbol(dev, table, sizeof in, 8 * sizeof(int), cudaMemcpyDeviceToDevice),
        cudaSuccess);
    assert_int_equal(cudaMemcpyToSymbol(table, dev, sizeof in, 0, cudaMemcpyDeviceToDevice),
                     cudaSuccess);
    memset(out, 0, sizeof out);
    assert_int_equal(cudaMemcpyFromSymbol(out, table, sizeof in, 0, cudaMemcpyDefault),
                     cudaSuccess);
    assert_memory_equal(out, in, sizeof in);

    /* Asynchronous, on a stream, then what a kernel reads there. */
    cudaStream_t s;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    int all[16];
    for (int i = 0; i < 16; i++)
        all[i] = i + 1;
    double pi = 3.25, back = 0;
    assert_int_equal(cudaMemcpyToSymbolAsync(table, all, sizeof all, 0, cudaMemcpyDefault, s),
                     cudaSuccess);
    assert_int_equal(cudaMemcpyToSymbolAsync(&scalar, &pi, sizeof pi, 0, cudaMemcpyHostToDevice, s),
                     cudaSuccess);
    assert_int_equal(
        cudaMemcpyFromSymbolAsync(&back, &scalar, sizeof back, 0, cudaMemcpyDeviceToHost, s),
        cudaSuccess);
    int *sum = NULL, host_sum = 0;
    assert_int_equal(cudaMalloc((void **)&sum, sizeof *sum), cudaSuccess);
    void *args[] = {&sum};
    assert_int_equal(cudaLaunchKernel((const void *)k_sum, one, one, args, 0, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_true(back == pi);
    assert_int_equal(cudaMemcpy(&host_sum, sum, sizeof host_sum, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    assert_int_equal(host_sum, 16 * 17 / 2);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaFree(sum), cudaSuccess);
    assert_int_equal(cudaFree(dev), cudaSuccess);
}

static void errors(void **state)
{
    (void)state;
    int buf[16] = {0};
    void *a = NULL;
    size_t n = 7;
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaGetSymbolAddress(&a, unknown), cudaErrorInvalidSymbol);
    assert_null(a);
    assert_int_equal(cudaGetSymbolSize(&n, unknown), cudaErrorInvalidSymbol);
    assert_int_equal(n, 7);
    assert_int_equal(cudaGetSymbolAddress(&a, NULL), cudaErrorInvalidSymbol);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidSymbol);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaGetSymbolAddress(NULL, table), cudaErrorInvalidValue);
    assert_int_equal(cudaGetSymbolSize(NULL, table), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyToSymbol(unknown, buf, 4, 0, cudaMemcpyHostToDevice),
                     cudaErrorInvalidSymbol);
    assert_int_equal(cudaMemcpyFromSymbolAsync(buf, unknown, 4, 0, cudaMemcpyDeviceToHost, NULL),
                     cudaErrorInvalidSymbol);

    /* offset + count past the end, or an offset beyond it. */
    assert_int_equal(cudaMemcpyToSymbol(table, buf, sizeof table, 4, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyToSymbol(table, buf, 0, sizeof table + 1, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    assert_int_equal(
        cudaMemcpyFromSymbol(buf, &scalar, sizeof scalar + 1, 0, cudaMemcpyDeviceToHost),
        cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyToSymbolAsync(table, buf, 8, SIZE_MAX - 4, cudaMemcpyDefault, NULL),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyToSymbol(table, buf, 4, sizeof table - 4, cudaMemcpyHostToDevice),
                     cudaSuccess);

    /* To a symbol from the host or a device; from one to the host or one. */
    assert_int_equal(cudaMemcpyToSymbol(table, buf, 4, 0, cudaMemcpyDeviceToHost),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaMemcpyToSymbol(table, buf, 4, 0, cudaMemcpyHostToHost),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaMemcpyFromSymbol(buf, table, 4, 0, cudaMemcpyHostToDevice),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaMemcpyFromSymbolAsync(buf, table, 4, 0, (enum cudaMemcpyKind)9, NULL),
                     cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registration_rules),
        cmocka_unit_test(address_and_size),
        cmocka_unit_test(copies_to_and_from),
        cmocka_unit_test(errors),
    };
    return cmocka_run_group_tests_name("sim_symbols", tests, setup, NULL);
}
