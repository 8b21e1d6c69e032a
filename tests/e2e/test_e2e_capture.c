/* test_e2e_capture.c — stream-ordered allocation inside stream capture, and
 * per-thread default streams, as ordinary programs use them.
 *
 * Capture: a graph that allocates a scratch buffer, uses it and frees it
 * (what torch.compile's CUDA graphs do) owns that buffer's address for as
 * long as the graph lives. A later cudaMalloc of the same size must get
 * other memory, and replays under memory pressure must neither overwrite it
 * nor fault. The same through stagehand_malloc/stagehand_free, PyTorch's
 * pluggable-allocator entry points.
 *
 * Per-thread streams: every thread's cudaStreamPerThread has the same handle
 * but is its own stream, so memory thread A frees behind a kernel still
 * running must not go to thread B before that kernel is done. The same
 * through the _ptsz entry points a program built with --default-stream
 * per-thread calls, with stream 0.
 *
 * Graphs: a graph's memset and memcpy nodes touch regions as its kernels
 * do, and an executable graph pointed at other regions after it was
 * instantiated (new node parameters, typed or generic, cudaGraphExecUpdate)
 * touches those: every launch finds them on the device, and the bytes are
 * exact.
 *
 * A launch on a stream that does not capture, while another thread
 * captures, still counts as using its regions: a move of one of them while
 * the kernel runs waits for it.
 *
 * Each runs in the default configuration, with drain_mode = tracked, and
 * with the learned scheduler's prefetch on; every result is compared byte
 * for byte with what the host computes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "simcuda.h"
#include "stagehand.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REGION (4u << 20)
#define WORDS  (REGION / 4)
#define NREG   20 /* 80 MB against a 64 MB budget */
#define REPLAY 4

static int preloaded;
static char **saved_argv;
static const dim3 one = {1, 1, 1};

/* The entry points of a program built with --default-stream per-thread. */
cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream);

static void k_bump(void **a) /* (uint32_t *p, size_t n): p[i] += i + 1 */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    for (size_t i = 0; i < n; i++)
        p[i] += (uint32_t)i + 1;
}

static void k_acc(void **a) /* (uint32_t *out, const uint32_t *tmp, size_t n) */
{
    uint32_t *out = *(uint32_t **)a[0];
    const uint32_t *tmp = *(const uint32_t **)a[1];
    size_t n = *(size_t *)a[2];
    for (size_t i = 0; i < n; i++)
        out[i] += tmp[i];
}

static void k_set(void **a) /* (uint32_t *p, size_t n, uint32_t v) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t v = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = v + (uint32_t)i;
}

/* A kernel that stays running until the test lets it go (bounded, so a
 * broken run fails instead of hanging), then writes its value. */
static atomic_int release;

static void k_slow_set(void **a) /* (uint32_t *p, size_t n, uint32_t v) */
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while (!atomic_load(&release) && t.tv_sec - t0.tv_sec < 5);
    k_set(a);
}

/* The same, taking TIMED_US as a GPU kernel does: the simulated GPU faults
 * it if its memory is remapped before it ends. */
#define TIMED_US 300000

static void k_timed_set(void **a)
{
    k_set(a);
}

/* Meets the test at this barrier: the stream's next kernel starts now. */
static pthread_barrier_t reached;

static void k_reach(void **a)
{
    (void)a;
    pthread_barrier_wait(&reached);
}

static void launch(void (*k)(void **), void **args, cudaStream_t s)
{
    assert_int_equal(cudaLaunchKernel((const void *)k, one, one, args, 0, s), cudaSuccess);
}

static void bump(void *p, size_t n, cudaStream_t s)
{
    void *args[] = {&p, &n};
    launch(k_bump, args, s);
}

/* Words of d (n of them) that differ from v + i * step. */
static size_t wrong_words(const void *d, size_t n, uint32_t v, uint32_t step)
{
    uint32_t *h = malloc(n * 4);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != v + (uint32_t)i * step;
    free(h);
    return bad;
}

static size_t wrong_set(const void *d, size_t n, uint32_t v)
{
    return wrong_words(d, n, v, 1);
}

/* Words of d that differ from times * (i + 1). */
static size_t wrong_bumped(const void *d, uint32_t times)
{
    uint32_t *h = malloc(REGION);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, d, REGION, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += h[i] != times * ((uint32_t)i + 1);
    free(h);
    return bad;
}

static uint64_t faults_now(void)
{
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    return sim.faults;
}

static void evictions(uint64_t *n)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    stagehand_stats_t st;
    memset(&st, 0, sizeof st);
    if (get)
        get(&st, sizeof st);
    *n = st.evictions;
}

/* ---- allocation inside stream capture ---- */

typedef void *(*alloc_fn)(ssize_t, int, void *);
typedef void (*free_fn)(void *, ssize_t, int, void *);

/* Captures: tmp = alloc; tmp[i] = i + 1; out += tmp; free tmp. Through
 * cudaMallocAsync/cudaFreeAsync, or the pluggable entry points if given. */
static cudaGraph_t capture_scratch(cudaStream_t s, void *out, alloc_fn a, free_fn f)
{
    cudaGraph_t g = NULL;
    void *tmp = NULL;
    size_t n = WORDS;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    if (a)
        tmp = a(REGION, 0, s);
    else
        assert_int_equal(cudaMallocAsync(&tmp, REGION, s), cudaSuccess);
    assert_non_null(tmp);
    assert_int_equal(cudaMemsetAsync(tmp, 0, REGION, s), cudaSuccess);
    bump(tmp, n, s);
    void *args[] = {&out, &tmp, &n};
    launch(k_acc, args, s);
    if (f)
        f(tmp, REGION, 0, s);
    else
        assert_int_equal(cudaFreeAsync(tmp, s), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    return g;
}

static void scratch_graph(alloc_fn a, free_fn f)
{
    uint64_t faults = faults_now(), ev0, ev1;
    evictions(&ev0);
    void *r[NREG], *out;
    for (int i = 0; i < NREG; i++) {
        assert_int_equal(cudaMalloc(&r[i], REGION), cudaSuccess);
        assert_int_equal(cudaMemset(r[i], 0, REGION), cudaSuccess);
    }
    assert_int_equal(cudaMalloc(&out, REGION), cudaSuccess);
    assert_int_equal(cudaMemset(out, 0, REGION), cudaSuccess);
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t g = capture_scratch(s, out, a, f);
    cudaGraphExec_t e;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);

    /* A plain allocation of the same size after the capture: its bytes are
     * the program's, whatever the graph does. */
    void *mine;
    assert_int_equal(cudaMalloc(&mine, REGION), cudaSuccess);
    size_t n = WORDS;
    uint32_t v = 0xc0ffee;
    void *args[] = {&mine, &n, &v};
    launch(k_set, args, NULL);
    for (int k = 0; k < REPLAY; k++) {
        assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        for (int i = 0; i < NREG; i++) /* pressure: everything else moves */
            bump(r[i], WORDS, NULL);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    }
    assert_int_equal(wrong_bumped(out, REPLAY), 0);
    assert_int_equal(wrong_set(mine, WORDS, v), 0);
    for (int i = 0; i < NREG; i++)
        assert_int_equal(wrong_bumped(r[i], REPLAY), 0);
    assert_int_equal(faults_now(), faults);
    evictions(&ev1);
    if (preloaded) /* the replays ran under pressure */
        assert_true(ev1 > ev0);
    assert_int_equal(cudaGraphExecDestroy(e), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    cudaFree(mine);
    cudaFree(out);
    for (int i = 0; i < NREG; i++)
        cudaFree(r[i]);
}

static void test_malloc_async_in_capture(void **state)
{
    (void)state;
    scratch_graph(NULL, NULL);
}

static void test_pluggable_in_capture(void **state)
{
    (void)state;
    alloc_fn a = (alloc_fn)dlsym(RTLD_DEFAULT, "stagehand_malloc");
    free_fn f = (free_fn)dlsym(RTLD_DEFAULT, "stagehand_free");
    if (!a || !f)
        skip();
    scratch_graph(a, f);
}

/* Memory allocated before a capture cannot be freed inside it (a free node
 * frees only graph allocations): refused with CUDA's error, bytes kept. */
static void test_free_of_outside_memory_in_capture_refused(void **state)
{
    (void)state;
    void *p;
    cudaStream_t s;
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&p, REGION, s), cudaSuccess);
    size_t n = WORDS;
    uint32_t v = 7;
    void *args[] = {&p, &n, &v};
    launch(k_set, args, s);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaFreeAsync(p, s), cudaErrorInvalidValue);
    cudaStreamEndCapture(s, &g);
    if (g)
        cudaGraphDestroy(g);
    void *q;
    assert_int_equal(cudaMallocAsync(&q, REGION, s), cudaSuccess);
    assert_ptr_not_equal(q, p);
    assert_int_equal(wrong_set(p, WORDS, v), 0);
    assert_int_equal(cudaFreeAsync(q, s), cudaSuccess);
    assert_int_equal(cudaFreeAsync(p, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* ---- per-thread default streams ---- */

struct handoff {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int freed;
    int ptsz;
    size_t bytes;
};

static void *stream_alloc(struct handoff *h)
{
    void *p = NULL;
    if (h->ptsz)
        assert_int_equal(cudaMallocAsync_ptsz(&p, h->bytes, NULL), cudaSuccess);
    else
        assert_int_equal(cudaMallocAsync(&p, h->bytes, cudaStreamPerThread), cudaSuccess);
    return p;
}

static void stream_free(struct handoff *h, void *p)
{
    if (h->ptsz)
        assert_int_equal(cudaFreeAsync_ptsz(p, NULL), cudaSuccess);
    else
        assert_int_equal(cudaFreeAsync(p, cudaStreamPerThread), cudaSuccess);
}

static void stream_launch(struct handoff *h, void (*k)(void **), void **args)
{
    if (!h->ptsz) {
        launch(k, args, cudaStreamPerThread);
        return;
    }
    cudaKernel_t kern;
    assert_int_equal(__cudaGetKernel(&kern, (const void *)k), cudaSuccess);
    assert_int_equal(__cudaLaunchKernel_ptsz(kern, one, one, args, 0, NULL), cudaSuccess);
}

/* Thread A: a kernel that is still running writes its block; A frees the
 * block behind it, in stream order, and tells B. */
static void *thread_a(void *arg)
{
    struct handoff *h = arg;
    void *p = stream_alloc(h);
    size_t n = h->bytes / 4;
    uint32_t v = 0xaaaa0000;
    void *args[] = {&p, &n, &v};
    stream_launch(h, k_slow_set, args);
    stream_free(h, p);
    pthread_mutex_lock(&h->mu);
    h->freed = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    assert_int_equal(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    return NULL;
}

/* Thread B allocates the same size once A has freed, writes its own bytes
 * and waits for them; then A's kernel is let go. B's bytes must survive. */
static void per_thread_handoff(int ptsz, size_t bytes)
{
    struct handoff h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, ptsz, bytes};
    uint64_t faults = faults_now();
    atomic_store(&release, 0);
    pthread_t a;
    assert_int_equal(pthread_create(&a, NULL, thread_a, &h), 0);
    pthread_mutex_lock(&h.mu);
    while (!h.freed)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    void *q = stream_alloc(&h);
    size_t n = bytes / 4;
    uint32_t v = 0xbbbb0000;
    void *args[] = {&q, &n, &v};
    stream_launch(&h, k_set, args);
    assert_int_equal(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    atomic_store(&release, 1);
    assert_int_equal(pthread_join(a, NULL), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(wrong_set(q, n, v), 0);
    stream_free(&h, q);
    assert_int_equal(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    assert_int_equal(faults_now(), faults);
}

static void test_per_thread_small_block(void **state)
{
    (void)state;
    per_thread_handoff(0, 256u << 10); /* from the sub-allocator */
}

static void test_per_thread_region(void **state)
{
    (void)state;
    per_thread_handoff(0, REGION);
}

static void test_ptsz_small_block(void **state)
{
    (void)state;
    per_thread_handoff(1, 256u << 10);
}

static void test_ptsz_region(void **state)
{
    (void)state;
    per_thread_handoff(1, REGION);
}

/* ---- graphs whose nodes are not (only) kernels, or change ---- */

static int resident(const void *p)
{
    int (*residency)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "stagehand_residency");
    return residency ? residency(p) : 1;
}

static int push_out(void **r, int cold);

/* Regions, zeroed, then all but the first few touched so those go out. */
static int cold_start(void **r, int cold)
{
    for (int i = 0; i < NREG; i++) {
        assert_int_equal(cudaMalloc(&r[i], REGION), cudaSuccess);
        assert_int_equal(cudaMemset(r[i], 0, REGION), cudaSuccess);
    }
    return push_out(r, cold);
}

/* Touches all but the first cold regions; how many of those are out. */
static int push_out(void **r, int cold)
{
    for (int i = cold; i < NREG; i++)
        bump(r[i], WORDS, NULL);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    int out = 0;
    for (int i = 0; preloaded && i < cold; i++)
        out += resident(r[i]) == 0;
    return out;
}

static void free_all(void **r)
{
    for (int i = 0; i < NREG; i++)
        cudaFree(r[i]);
}

/* Graph: memset r[0] to 0x01 bytes, copy r[0] -> r[1]. Both evicted
 * before every launch; the launch brings both back. */
static void test_graph_memset_memcpy_nodes(void **state)
{
    (void)state;
    uint64_t faults = faults_now();
    void *r[NREG];
    int were_out = cold_start(r, 2);
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t e;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaMemsetAsync(r[0], 1, REGION, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(r[1], r[0], REGION, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    for (int k = 1; k <= REPLAY; k++) {
        assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
        for (int i = 0; preloaded && i < 2; i++)
            assert_int_equal(resident(r[i]), 1);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        bump(r[1], WORDS, NULL); /* r[1] = 0x01010101 + i + 1 */
        were_out += push_out(r, 2);
    }
    if (preloaded) /* some launches found them evicted */
        assert_true(were_out > 0);
    assert_int_equal(wrong_words(r[0], WORDS, 0x01010101u, 0), 0);
    assert_int_equal(wrong_set(r[1], WORDS, 0x01010101u + 1), 0);
    for (int i = 2; i < NREG; i++)
        assert_int_equal(wrong_bumped(r[i], REPLAY + 1), 0);
    assert_int_equal(faults_now(), faults);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    free_all(r);
}

static cudaGraph_t capture_bump(void *p, cudaStream_t s)
{
    cudaGraph_t g;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    bump(p, WORDS, s);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    return g;
}

/* A graph that bumps r[0] is pointed at r[1] (new kernel node parameters),
 * then updated from a graph that bumps r[2], then pointed back at r[0]
 * through the driver API; each is evicted before its launch and must be on
 * the device when the launch is issued. */
static void test_graph_exec_pointed_elsewhere(void **state)
{
    (void)state;
    uint64_t faults = faults_now();
    void *r[NREG];
    int out = cold_start(r, 3);
    if (preloaded) /* the precondition: all three out */
        assert_int_equal(out, 3);
    cudaStream_t s;
    cudaGraphExec_t e;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t g = capture_bump(r[0], s);
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    cudaGraphNode_t node;
    size_t n = 1;
    assert_int_equal(cudaGraphGetNodes(g, &node, &n), cudaSuccess);
    size_t words = WORDS;
    void *args[] = {&r[1], &words};
    struct cudaKernelNodeParams kp = {(void *)k_bump, one, one, 0, args, NULL};
    assert_int_equal(cudaGraphExecKernelNodeSetParams(e, node, &kp), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
    if (preloaded)
        assert_int_equal(resident(r[1]), 1);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    push_out(r, 3);
    if (preloaded)
        assert_int_equal(resident(r[2]), 0);

    cudaGraph_t g2 = capture_bump(r[2], s);
    cudaGraphExecUpdateResultInfo info;
    assert_int_equal(cudaGraphExecUpdate(e, g2, &info), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
    if (preloaded)
        assert_int_equal(resident(r[2]), 1);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    push_out(r, 3);

    /* The driver's way: the updated exec's node, named by g2's node. */
    if (preloaded)
        assert_int_equal(resident(r[0]), 0);
    cudaGraphNode_t node2;
    n = 1;
    assert_int_equal(cudaGraphGetNodes(g2, &node2, &n), cudaSuccess);
    void *args0[] = {&r[0], &words};
    CUDA_KERNEL_NODE_PARAMS dp = {.func = simcuda_function(k_bump),
                                  .gridDimX = 1,
                                  .gridDimY = 1,
                                  .gridDimZ = 1,
                                  .blockDimX = 1,
                                  .blockDimY = 1,
                                  .blockDimZ = 1,
                                  .kernelParams = args0};
    assert_int_equal(cuGraphExecKernelNodeSetParams((CUgraphExec)e, (CUgraphNode)node2, &dp),
                     CUDA_SUCCESS);
    assert_int_equal(cuGraphLaunch((CUgraphExec)e, (CUstream)s), CUDA_SUCCESS);
    if (preloaded)
        assert_int_equal(resident(r[0]), 1);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(wrong_bumped(r[0], 1), 0);
    assert_int_equal(wrong_bumped(r[1], 1), 0);
    assert_int_equal(wrong_bumped(r[2], 1), 0);
    for (int i = 3; i < NREG; i++)
        assert_int_equal(wrong_bumped(r[i], 3), 0);
    assert_int_equal(faults_now(), faults);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    cudaGraphDestroy(g2);
    cudaStreamDestroy(s);
    free_all(r);
}

static CUDA_KERNEL_NODE_PARAMS_v3 drv_bump(void **args)
{
    return (CUDA_KERNEL_NODE_PARAMS_v3){.func = simcuda_function(k_bump),
                                        .gridDimX = 1,
                                        .gridDimY = 1,
                                        .gridDimZ = 1,
                                        .blockDimX = 1,
                                        .blockDimY = 1,
                                        .blockDimZ = 1,
                                        .kernelParams = args};
}

/* The same through the generic node updates of CUDA 12.2: a graph that
 * bumps the last region (on the device) is pointed at r[1] (runtime), then
 * at r[2] (driver); a graph that sets it is pointed at r[0]. Each target
 * is evicted, and used by no launch before, so only the update names it. */
static void test_graph_exec_generic_node_update(void **state)
{
    (void)state;
    uint64_t faults = faults_now();
    void *r[NREG], *last;
    int out = cold_start(r, 3);
    if (preloaded)
        assert_int_equal(out, 3);
    last = r[NREG - 1];
    cudaStream_t s;
    cudaGraphExec_t e;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t g = capture_bump(last, s);
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    cudaGraphNode_t node;
    size_t n = 1;
    assert_int_equal(cudaGraphGetNodes(g, &node, &n), cudaSuccess);
    size_t words = WORDS;
    void *args1[] = {&r[1], &words};
    struct cudaGraphNodeParams kp = {.type = cudaGraphNodeTypeKernel,
                                     .kernel = {(void *)k_bump, one, one, 0, args1, NULL}};
    assert_int_equal(cudaGraphExecNodeSetParams(e, node, &kp), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
    if (preloaded)
        assert_int_equal(resident(r[1]), 1);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    push_out(r, 3);

    if (preloaded)
        assert_int_equal(resident(r[2]), 0);
    void *args2[] = {&r[2], &words};
    CUgraphNodeParams dp = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .kernel = drv_bump(args2)};
    assert_int_equal(cuGraphExecNodeSetParams((CUgraphExec)e, (CUgraphNode)node, &dp),
                     CUDA_SUCCESS);
    assert_int_equal(cuGraphLaunch((CUgraphExec)e, (CUstream)s), CUDA_SUCCESS);
    if (preloaded)
        assert_int_equal(resident(r[2]), 1);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    push_out(r, 3);

    /* A memset node pointed at r[0] (0x02 bytes). */
    if (preloaded)
        assert_int_equal(resident(r[0]), 0);
    cudaGraph_t g2;
    cudaGraphExec_t e2;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaMemsetAsync(last, 1, REGION, s), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(s, &g2), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&e2, g2, 0), cudaSuccess);
    n = 1;
    assert_int_equal(cudaGraphGetNodes(g2, &node, &n), cudaSuccess);
    struct cudaGraphNodeParams mp = {.type = cudaGraphNodeTypeMemset,
                                     .memset = {r[0], 0, 0x02, 1, REGION, 1}};
    assert_int_equal(cudaGraphExecNodeSetParams(e2, node, &mp), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e2, s), cudaSuccess);
    if (preloaded)
        assert_int_equal(resident(r[0]), 1);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);

    assert_int_equal(wrong_words(r[0], WORDS, 0x02020202u, 0), 0);
    assert_int_equal(wrong_bumped(r[1], 1), 0);
    assert_int_equal(wrong_bumped(r[2], 1), 0);
    for (int i = 3; i < NREG; i++) /* the last one too: its graphs never ran on it */
        assert_int_equal(wrong_bumped(r[i], 3), 0);
    assert_int_equal(faults_now(), faults);
    cudaGraphExecDestroy(e);
    cudaGraphExecDestroy(e2);
    cudaGraphDestroy(g);
    cudaGraphDestroy(g2);
    cudaStreamDestroy(s);
    free_all(r);
}

/* ---- a launch beside another thread's capture ---- */

struct capturer {
    cudaStream_t s;
    pthread_barrier_t began, launched;
    int errors;
};

/* Captures on its own stream until the main thread has launched. */
static void *capture_beside(void *arg)
{
    /* No assert here: cmocka's checks jump back on the test's own thread.
     * Failures are counted and checked there, after the join. */
    struct capturer *c = arg;
    cudaGraph_t g = NULL;
    c->errors += cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal) != cudaSuccess;
    pthread_barrier_wait(&c->began);
    pthread_barrier_wait(&c->launched);
    c->errors += cudaStreamEndCapture(c->s, &g) != cudaSuccess;
    c->errors += g && cudaGraphDestroy(g) != cudaSuccess;
    return NULL;
}

/* While thread T captures, a kernel on stream b writes the evicted r[0]
 * for TIMED_US (it is not moved meanwhile: that would break T's capture);
 * k_reach, before it on b, tells the test when it starts. Once T is done,
 * a launch on stream c (after b's kernel, by an event) reads r[0] into
 * r[1], so r[0] comes back while b's kernel still runs: that move must
 * wait for it, whatever the drain mode. Half the regions are freed first,
 * so the move needs no eviction (whose window may wait for the whole
 * device, hiding a missed wait). */
static void test_launch_beside_capture(void **state)
{
    (void)state;
    uint64_t faults = faults_now();
    void *r[NREG];
    int out = cold_start(r, 2);
    if (preloaded)
        assert_int_equal(out, 2);
    for (int i = NREG / 2; i < NREG; i++) {
        assert_int_equal(cudaFree(r[i]), cudaSuccess);
        r[i] = NULL;
    }
    struct capturer cap = {.errors = 0};
    cudaStream_t b, c;
    cudaEvent_t ev;
    assert_int_equal(cudaStreamCreateWithFlags(&cap.s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    assert_int_equal(pthread_barrier_init(&cap.began, NULL, 2), 0);
    assert_int_equal(pthread_barrier_init(&cap.launched, NULL, 2), 0);
    assert_int_equal(pthread_barrier_init(&reached, NULL, 2), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, capture_beside, &cap), 0);
    pthread_barrier_wait(&cap.began);
    size_t n = WORDS;
    uint32_t v = 0x5e70000;
    void *set[] = {&r[0], &n, &v};
    launch(k_reach, NULL, b);
    launch(k_timed_set, set, b);
    assert_int_equal(cudaEventRecord(ev, b), cudaSuccess);
    pthread_barrier_wait(&reached);
    pthread_barrier_wait(&cap.launched);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(cap.errors, 0);

    if (preloaded)
        assert_int_equal(resident(r[0]), 0);
    assert_int_equal(cudaStreamWaitEvent(c, ev, 0), cudaSuccess);
    void *acc[] = {&r[1], &r[0], &n};
    launch(k_acc, acc, c);
    if (preloaded)
        assert_int_equal(resident(r[0]), 1);
    assert_int_equal(cudaStreamSynchronize(c), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(b), cudaSuccess);
    assert_int_equal(faults_now(), faults);
    assert_int_equal(wrong_set(r[0], WORDS, v), 0);
    assert_int_equal(wrong_set(r[1], WORDS, v), 0);
    pthread_barrier_destroy(&cap.began);
    pthread_barrier_destroy(&cap.launched);
    pthread_barrier_destroy(&reached);
    cudaEventDestroy(ev);
    cudaStreamDestroy(cap.s);
    cudaStreamDestroy(b);
    cudaStreamDestroy(c);
    free_all(r);
}

static void stats(stagehand_stats_t *st)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    assert_non_null(get);
    assert_int_equal(get(st, sizeof *st), 0);
}

/* Allocations made while a stream captures go past the high watermark (a
 * remap would break the capture) up to the budget; the capture's end
 * evicts down to the watermark at once. It ran inside the capture call's
 * remap gate, where no window may open, so nothing was evicted until the
 * next allocation or launch. The capture begins before the library manages
 * anything: uncounted, its allocations evicted and the drain broke it.
 * (Run in a child with fixed watermarks: test_watermarks.) */
static void test_capture_end_evicts(void **state)
{
    (void)state;
    if (!preloaded || !getenv("E2E_CAPTURE_WATERMARKS"))
        skip();
    enum { N = 12 }; /* 48 MB: above the 32 MB high watermark, within the 64 MB budget */
    void *r[N];
    cudaStream_t s;
    cudaGraph_t g;
    stagehand_stats_t st;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    for (int i = 0; i < N; i++)
        assert_int_equal(cudaMalloc(&r[i], REGION), cudaSuccess);
    stats(&st);
    assert_true(st.device_bytes > st.high_watermark); /* deferred */
    assert_int_equal(st.evictions, 0);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    stats(&st);
    assert_true(st.device_bytes <= st.high_watermark);
    assert_true(st.evictions > 0);
    cudaGraphDestroy(g);
    for (int i = 0; i < N; i++)
        assert_int_equal(cudaFree(r[i]), cudaSuccess);
    cudaStreamDestroy(s);
}

/* ---- the other configurations ---- */

static void test_tracked(void **state)
{
    (void)state;
    if (!preloaded || getenv("E2E_CAPTURE_VARIANT"))
        skip();
    static const char *const env[] = {"E2E_CAPTURE_VARIANT=tracked",
                                      "STAGEHAND_TRANSFER_DRAIN_MODE=tracked", NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static void test_learned_prefetch(void **state)
{
    (void)state;
    if (!preloaded || getenv("E2E_CAPTURE_VARIANT"))
        skip();
    static const char *const env[] = {"E2E_CAPTURE_VARIANT=learned",
                                      "STAGEHAND_POLICY_EVICTION=learned",
                                      "STAGEHAND_POLICY_PREFETCH_ENABLED=true", NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static void test_watermarks(void **state)
{
    (void)state;
    if (!preloaded || getenv("E2E_CAPTURE_VARIANT"))
        skip();
    static const char *const env[] = {"E2E_CAPTURE_VARIANT=watermarks",
                                      "E2E_CAPTURE_WATERMARKS=1",
                                      "E2E_CAPTURE_ONLY=test_capture_end_evicts",
                                      "STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB=32",
                                      "STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB=24",
                                      NULL};
    assert_int_equal(e2e_rerun(saved_argv, env), 0);
}

static int setup(void **state)
{
    (void)state;
    size_t bump_sizes[] = {sizeof(void *), sizeof(size_t)};
    size_t acc_sizes[] = {sizeof(void *), sizeof(void *), sizeof(size_t)};
    size_t set_sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    assert_int_equal(simcuda_register_kernel(k_bump, "bump", 2, bump_sizes, 0), 0);
    assert_int_equal(simcuda_register_kernel(k_acc, "acc", 3, acc_sizes, 0), 0);
    assert_int_equal(simcuda_register_kernel(k_set, "set", 3, set_sizes, 0), 0);
    assert_int_equal(simcuda_register_kernel(k_slow_set, "slow_set", 3, set_sizes, 0), 0);
    assert_int_equal(simcuda_register_kernel(k_timed_set, "timed_set", 3, set_sizes, TIMED_US), 0);
    assert_int_equal(simcuda_register_kernel(k_reach, "reach", 0, NULL, 0), 0);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    if (!getenv("E2E_CAPTURE_CONFIGURED")) {
        setenv("E2E_CAPTURE_CONFIGURED", "1", 1);
        setenv("SIMCUDA_VRAM_MB", "192", 1);
        setenv("STAGEHAND_BUDGET_VRAM_BUDGET_MB", "64", 1);
        e2e_reexec(argv);
        return 1;
    }
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const char *only = getenv("E2E_CAPTURE_ONLY"); /* one test, by name */
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_malloc_async_in_capture),
        cmocka_unit_test(test_pluggable_in_capture),
        cmocka_unit_test(test_free_of_outside_memory_in_capture_refused),
        cmocka_unit_test(test_per_thread_small_block),
        cmocka_unit_test(test_per_thread_region),
        cmocka_unit_test(test_ptsz_small_block),
        cmocka_unit_test(test_ptsz_region),
        cmocka_unit_test(test_graph_memset_memcpy_nodes),
        cmocka_unit_test(test_graph_exec_pointed_elsewhere),
        cmocka_unit_test(test_graph_exec_generic_node_update),
        cmocka_unit_test(test_launch_beside_capture),
        cmocka_unit_test(test_capture_end_evicts),
        cmocka_unit_test(test_tracked),
        cmocka_unit_test(test_learned_prefetch),
        cmocka_unit_test(test_watermarks),
    };
    struct CMUnitTest tests[sizeof all / sizeof all[0]];
    size_t n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!only || strcmp(only, all[i].name) == 0)
            tests[n++] = all[i];
    const char *v = getenv("E2E_CAPTURE_VARIANT");
    char name[64];
    snprintf(name, sizeof name, "e2e_capture (%s)", !preloaded ? "disabled" : v ? v : "preloaded");
    return _cmocka_run_group_tests(name, tests, n, setup, NULL);
}
