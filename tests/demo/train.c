/* train.c — the demo's training workload: an unmodified CUDA program.
 *
 * A 48-layer MLP (1024 wide) trained with SGD on synthetic data: weights
 * and gradients live in cudaMalloc'd buffers for the whole run, each step
 * saves every layer's input and pre-activation (cudaMallocAsync, freed
 * after the backward pass), computes an MSE loss, back-propagates and
 * updates. Its footprint is about 3x a 128 MB card. It knows nothing about
 * stagehand; run it with and without LD_PRELOAD=libstagehand.so.
 *
 * Kernels are host functions on the simulated GPU; every one is a fixed
 * sequence of float operations, so the loss is reproducible to the bit.
 * Output: one "step N loss X (0xBITS) time S" line per step, then
 * "summary key=value ...", or "oom ..." on stderr and exit 3.
 */
#include "simcuda.h"
#include "stagehand.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS 48
#define WIDTH  1024
#define BATCH  8
#define LR     0.05f

static float lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

/* ---- kernels ---- */

static void k_init(void **a) /* (float *p, size_t n, uint32_t seed, float scale) */
{
    float *p = *(float **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t s = *(uint32_t *)a[2];
    float scale = *(float *)a[3];
    for (size_t i = 0; i < n; i++)
        p[i] = lcg(&s) * scale;
}

static void k_forward(void **a) /* (W, x, z, y): z = x W^T, y = x + relu(z) */
{
    const float *w = *(float **)a[0], *x = *(float **)a[1];
    float *z = *(float **)a[2], *y = *(float **)a[3];
    for (int b = 0; b < BATCH; b++)
        for (int i = 0; i < WIDTH; i++) {
            float acc = 0;
            for (int k = 0; k < WIDTH; k++)
                acc += w[(size_t)i * WIDTH + k] * x[b * WIDTH + k];
            z[b * WIDTH + i] = acc;
            y[b * WIDTH + i] = x[b * WIDTH + i] + (acc > 0 ? acc : 0);
        }
}

static void k_loss(void **a) /* (y, t, g, loss): loss = mean (y-t)^2, g = dloss/dy */
{
    const float *y = *(float **)a[0], *t = *(float **)a[1];
    float *g = *(float **)a[2], *loss = *(float **)a[3];
    const int n = BATCH * WIDTH;
    float acc = 0;
    for (int i = 0; i < n; i++) {
        float d = y[i] - t[i];
        acc += d * d;
        g[i] = 2.0f * d / (float)n;
    }
    *loss = acc / (float)n;
}

static void k_backward(void **a) /* (W, x, z, g, dx, dW): through the block and its skip */
{
    const float *w = *(float **)a[0], *x = *(float **)a[1], *z = *(float **)a[2];
    float *g = *(float **)a[3], *dx = *(float **)a[4], *dw = *(float **)a[5];
    for (int i = 0; i < BATCH * WIDTH; i++) {
        dx[i] = g[i]; /* the skip connection */
        g[i] = z[i] > 0 ? g[i] : 0;
    }
    for (int i = 0; i < WIDTH; i++)
        for (int k = 0; k < WIDTH; k++) {
            float acc = 0;
            for (int b = 0; b < BATCH; b++)
                acc += g[b * WIDTH + i] * x[b * WIDTH + k];
            dw[(size_t)i * WIDTH + k] = acc;
        }
    for (int b = 0; b < BATCH; b++)
        for (int k = 0; k < WIDTH; k++) {
            float acc = 0;
            for (int i = 0; i < WIDTH; i++)
                acc += w[(size_t)i * WIDTH + k] * g[b * WIDTH + i];
            dx[b * WIDTH + k] += acc;
        }
}

static void k_sgd(void **a) /* (W, dW, n) */
{
    float *w = *(float **)a[0];
    const float *dw = *(float **)a[1];
    size_t n = *(size_t *)a[2];
    for (size_t i = 0; i < n; i++)
        w[i] -= LR * dw[i];
}

static void register_kernels(void)
{
    const size_t p = sizeof(void *);
    size_t init[] = {p, sizeof(size_t), sizeof(uint32_t), sizeof(float)};
    size_t fwd[] = {p, p, p, p}, loss[] = {p, p, p, p}, bwd[] = {p, p, p, p, p, p};
    size_t sgd[] = {p, p, sizeof(size_t)};
    simcuda_register_kernel(k_init, "init", 4, init, 0);
    simcuda_register_kernel(k_forward, "linear_relu_fwd", 4, fwd, 0);
    simcuda_register_kernel(k_loss, "mse_loss", 4, loss, 0);
    simcuda_register_kernel(k_backward, "linear_relu_bwd", 6, bwd, 0);
    simcuda_register_kernel(k_sgd, "sgd", 3, sgd, 0);
}

/* ---- the program ---- */

static const dim3 one = {1, 1, 1};

static void launch(simcuda_kernel_fn k, void **args, const char *what)
{
    cudaError_t e = cudaLaunchKernel((const void *)k, one, one, args, 0, NULL);
    if (e != cudaSuccess) {
        fprintf(stderr, "train: %s: %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}

static void *dalloc(size_t bytes, const char *what, int async)
{
    void *p = NULL;
    cudaError_t e = async ? cudaMallocAsync(&p, bytes, NULL) : cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        fprintf(stderr, "oom: %s (%zu MB) failed: CUDA out of memory (%zu MB free of %zu MB)\n",
                what, bytes >> 20, free_b >> 20, total >> 20);
        exit(3);
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "train: %s: %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
    return p;
}

static void init_buffer(float *p, size_t n, uint32_t seed, float scale)
{
    void *args[] = {&p, &n, &seed, &scale};
    launch(k_init, args, "init");
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(void)
{
    const char *steps_env = getenv("TRAIN_STEPS");
    const int STEPS = steps_env && atoi(steps_env) > 0 ? atoi(steps_env) : 3;
    register_kernels();
    const size_t wn = (size_t)WIDTH * WIDTH, an = (size_t)BATCH * WIDTH;
    float *w[LAYERS], *dw[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        w[l] = dalloc(wn * 4, "weights", 0);
        dw[l] = dalloc(wn * 4, "gradients", 0);
        init_buffer(w[l], wn, 1000u + (uint32_t)l, 0.5f / sqrtf((float)WIDTH));
    }
    float *input = dalloc(an * 4, "batch", 0), *target = dalloc(an * 4, "targets", 0);
    float *loss = dalloc(4, "loss", 0);
    init_buffer(input, an, 7u, 2.0f);
    init_buffer(target, an, 8u, 0.5f);
    double total = 0;
    for (int step = 0; step < STEPS; step++) {
        double t0 = now();
        float *x[LAYERS + 1], *z[LAYERS];
        x[0] = input;
        for (int l = 0; l < LAYERS; l++) { /* forward, saving activations */
            z[l] = dalloc(an * 4, "saved activation", 1);
            x[l + 1] = dalloc(an * 4, "saved activation", 1);
            void *args[] = {&w[l], &x[l], &z[l], &x[l + 1]};
            launch(k_forward, args, "forward");
        }
        float *g = dalloc(an * 4, "gradient", 1), *gx = dalloc(an * 4, "gradient", 1);
        void *largs[] = {&x[LAYERS], &target, &g, &loss};
        launch(k_loss, largs, "loss");
        for (int l = LAYERS - 1; l >= 0; l--) { /* backward */
            void *args[] = {&w[l], &x[l], &z[l], &g, &gx, &dw[l]};
            launch(k_backward, args, "backward");
            float *t = g;
            g = gx;
            gx = t;
        }
        for (int l = 0; l < LAYERS; l++) { /* SGD */
            void *args[] = {&w[l], &dw[l], (void *)&wn};
            launch(k_sgd, args, "sgd");
        }
        for (int l = 0; l < LAYERS; l++) {
            cudaFreeAsync(z[l], NULL);
            cudaFreeAsync(x[l + 1], NULL);
        }
        cudaFreeAsync(g, NULL);
        cudaFreeAsync(gx, NULL);
        float h = 0;
        if (cudaMemcpy(&h, loss, 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
            fprintf(stderr, "train: reading the loss failed\n");
            return 2;
        }
        double dt = now() - t0;
        total += dt;
        uint32_t bits;
        memcpy(&bits, &h, 4);
        printf("step %d loss %.9g (0x%08x) time %.2fs\n", step, h, bits, dt);
        fflush(stdout);
    }
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    stagehand_stats_t st = {0};
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    if (get)
        get(&st, sizeof st);
    printf("summary steps=%d step_s=%.2f peak_device_mb=%zu budget_mb=%llu d2h_mb=%llu "
           "h2d_mb=%llu evictions=%llu restores=%llu clean=%llu\n",
           STEPS, total / STEPS, sim.device_bytes_peak >> 20,
           (unsigned long long)(st.budget_bytes >> 20), (unsigned long long)(st.d2h_bytes >> 20),
           (unsigned long long)(st.h2d_bytes >> 20), (unsigned long long)st.evictions,
           (unsigned long long)st.restores, (unsigned long long)st.clean_evictions);
    return 0;
}
