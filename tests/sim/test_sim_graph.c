/* test_sim_graph.c — stream capture and graphs on the simulated GPU:
 * captured work runs only when the graph is launched, as often as it is
 * launched, with the parameter values it was captured with; synchronising
 * a capturing stream, or the whole context, or touching the legacy stream
 * during a capture is refused and invalidates it; graph launches raise the
 * CUPTI callback; kernel nodes report their function and parameters.
 * cudaMallocAsync inside a capture makes a graph memory node whose address
 * belongs to the graph until the graph and its executable copies are gone;
 * a free in a capture must name a graph allocation; the legacy stream's
 * capture status during another stream's capture is an error. Memset and
 * memcpy nodes report what they touch; an executable graph's nodes can be
 * given new parameters, or all be replaced from a graph of the same shape
 * (cudaGraphExecUpdate), and a launch then does the new work; the same
 * through the generic cudaGraphExecNodeSetParams/cuGraphExecNodeSetParams.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "simcuda.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <string.h>

static void k_add(void **a) /* (int *p, int v): *p += v */
{
    int *p = *(int **)a[0];
    *p += *(int *)a[1];
}

static const dim3 one = {1, 1, 1};

static int *counter;
static cudaStream_t stream;

static int setup(void **state)
{
    (void)state;
    size_t sizes[] = {sizeof(int *), sizeof(int)};
    assert_int_equal(simcuda_register_kernel(k_add, "add", 2, sizes, 0), 0);
    assert_int_equal(cudaMalloc((void **)&counter, 4096), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    return 0;
}

static int read_counter(void)
{
    int v = -1;
    assert_int_equal(cudaMemcpy(&v, counter, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

static cudaGraph_t capture_adds(int first, int second)
{
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    enum cudaStreamCaptureStatus st;
    assert_int_equal(cudaStreamIsCapturing(stream, &st), cudaSuccess);
    assert_int_equal(st, cudaStreamCaptureStatusActive);
    int v = first;
    void *args[] = {&counter, &v};
    assert_int_equal(cudaLaunchKernel((const void *)k_add, one, one, args, 0, stream), cudaSuccess);
    v = second; /* the first node keeps the value it was captured with */
    assert_int_equal(cudaLaunchKernel((const void *)k_add, one, one, args, 0, stream), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaSuccess);
    assert_int_equal(cudaStreamIsCapturing(stream, &st), cudaSuccess);
    assert_int_equal(st, cudaStreamCaptureStatusNone);
    return g;
}

static void test_capture_runs_only_when_launched(void **state)
{
    (void)state;
    assert_int_equal(cudaMemset(counter, 0, 4), cudaSuccess);
    cudaGraph_t g = capture_adds(1, 10);
    assert_non_null(g);
    assert_int_equal(read_counter(), 0); /* nothing ran during capture */
    cudaGraphExec_t e;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    assert_int_equal(read_counter(), 33);
    assert_int_equal(cudaGraphExecDestroy(e), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
}

static void test_kernel_nodes(void **state)
{
    (void)state;
    cudaGraph_t g = capture_adds(2, 3);
    size_t n = 0;
    assert_int_equal(cuGraphGetNodes((CUgraph)g, NULL, &n), CUDA_SUCCESS);
    assert_int_equal(n, 2);
    CUgraphNode nodes[2];
    assert_int_equal(cuGraphGetNodes((CUgraph)g, nodes, &n), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        CUgraphNodeType t;
        assert_int_equal(cuGraphNodeGetType(nodes[i], &t), CUDA_SUCCESS);
        assert_int_equal(t, CU_GRAPH_NODE_TYPE_KERNEL);
        CUDA_KERNEL_NODE_PARAMS p;
        assert_int_equal(cuGraphKernelNodeGetParams(nodes[i], &p), CUDA_SUCCESS);
        assert_ptr_equal(p.func, simcuda_function(k_add));
        assert_ptr_equal(*(int **)p.kernelParams[0], counter);
        assert_int_equal(*(int *)p.kernelParams[1], i == 0 ? 2 : 3);
    }
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
    assert_int_equal(cuGraphDestroy((CUgraph)g), CUDA_ERROR_INVALID_VALUE); /* already gone */
}

static void test_sync_during_capture_invalidates(void **state)
{
    (void)state;
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
    enum cudaStreamCaptureStatus st;
    assert_int_equal(cudaStreamIsCapturing(stream, &st), cudaSuccess);
    assert_int_equal(st, cudaStreamCaptureStatusInvalidated);
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);

    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaErrorStreamCaptureInvalidated);

    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    int v = 0;
    assert_int_equal(cudaMemcpy(&v, counter, 4, cudaMemcpyDeviceToHost),
                     cudaErrorStreamCaptureImplicit); /* the legacy stream may not join */
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
}

static void test_capture_on_legacy_stream_refused(void **state)
{
    (void)state;
    assert_int_equal(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal),
                     cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
                     cudaErrorIllegalState);
    cudaGraph_t g;
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
    cudaGetLastError();
}

static int graph_callbacks;

static void CUPTIAPI on_cb(void *u, CUpti_CallbackDomain d, CUpti_CallbackId id, const void *data)
{
    (void)u;
    const CUpti_CallbackData *cb = data;
    if (cb->callbackSite == CUPTI_API_ENTER &&
        ((d == CUPTI_CB_DOMAIN_DRIVER_API && id == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch) ||
         (d == CUPTI_CB_DOMAIN_RUNTIME_API &&
          id == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000)))
        graph_callbacks++;
}

static void test_graph_launch_callbacks(void **state)
{
    (void)state;
    CUpti_SubscriberHandle sub;
    assert_int_equal(cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_cb, NULL), CUPTI_SUCCESS);
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API), CUPTI_SUCCESS);
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
    cudaGraph_t g = capture_adds(1, 1);
    cudaGraphExec_t e;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(graph_callbacks, 2); /* runtime, then the driver launch it makes */
    assert_int_equal(cuptiUnsubscribe(sub), CUPTI_SUCCESS);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
}

static size_t free_now(void)
{
    size_t f = 0, t = 0;
    assert_int_equal(cudaMemGetInfo(&f, &t), cudaSuccess);
    return f;
}

static void test_alloc_in_capture_is_the_graphs(void **state)
{
    (void)state;
    size_t before = free_now();
    int *p = NULL, *outside = NULL;
    cudaGraph_t g = NULL;
    assert_int_equal(cudaMalloc((void **)&outside, 1 << 20), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaMallocAsync((void **)&p, 1 << 20, stream), cudaSuccess);
    assert_non_null(p);
    enum cudaStreamCaptureStatus st;
    assert_int_equal(cudaStreamIsCapturing(NULL, &st), cudaErrorStreamCaptureImplicit);
    /* A free node may free only what the graph allocated. */
    assert_int_equal(cudaFreeAsync(outside, stream), cudaErrorInvalidValue);
    int v = 5;
    void *args[] = {&p, &v};
    assert_int_equal(cudaLaunchKernel((const void *)k_add, one, one, args, 0, stream), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaSuccess);
    assert_int_equal(cudaStreamIsCapturing(NULL, &st), cudaSuccess);
    assert_int_equal(st, cudaStreamCaptureStatusNone);
    cudaGraphExec_t e;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess); /* the exec keeps the memory */
    int *q = NULL;
    assert_int_equal(cudaMalloc((void **)&q, 1 << 20), cudaSuccess);
    assert_true((uintptr_t)q + (1 << 20) <= (uintptr_t)p ||
                (uintptr_t)q >= (uintptr_t)p + (1 << 20));
    assert_int_equal(cudaMemset(p, 0, 4), cudaSuccess);
    for (int i = 0; i < 2; i++)
        assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    int got = -1;
    assert_int_equal(cudaMemcpy(&got, p, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(got, 10);
    assert_true(free_now() < before - (2u << 20));
    assert_int_equal(cudaGraphExecDestroy(e), cudaSuccess); /* the last holder */
    assert_int_equal(cudaFree(q), cudaSuccess);
    assert_int_equal(cudaFree(outside), cudaSuccess);
    assert_int_equal(free_now(), before);
}

static void test_free_node_frees_graph_memory(void **state)
{
    (void)state;
    size_t before = free_now();
    int *p = NULL;
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaMallocAsync((void **)&p, 4096, stream), cudaSuccess);
    assert_int_equal(cudaFreeAsync(p, stream), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaSuccess);
    cudaGraphExec_t e;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    assert_int_equal(cudaGraphExecDestroy(e), cudaSuccess);
    assert_true(free_now() < before);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
    assert_int_equal(free_now(), before);
}

/* Captures: memset a to v (words); counter += 1; copy a -> b. */
static cudaGraph_t capture_set_add_copy(int *a, int *b, unsigned v)
{
    cudaGraph_t g = NULL;
    int one_ = 1;
    void *args[] = {&counter, &one_};
    assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cuMemsetD32Async((CUdeviceptr)(uintptr_t)a, v, 256, (CUstream)stream),
                     CUDA_SUCCESS);
    assert_int_equal(cudaLaunchKernel((const void *)k_add, one, one, args, 0, stream), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(b, a, 1024, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(stream, &g), cudaSuccess);
    return g;
}

static unsigned word(const int *d, size_t i)
{
    unsigned v = 0;
    assert_int_equal(cudaMemcpy(&v, d + i, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

static void test_node_params_and_exec_updates(void **state)
{
    (void)state;
    int *a, *b, *c;
    assert_int_equal(cudaMalloc((void **)&a, 1024), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&b, 1024), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&c, 1024), cudaSuccess);
    assert_int_equal(cudaMemset(counter, 0, 4), cudaSuccess);
    assert_int_equal(cudaMemset(c, 0, 1024), cudaSuccess);
    cudaGraph_t g = capture_set_add_copy(a, b, 7);
    cudaGraphNode_t nodes[3];
    size_t n = 3;
    assert_int_equal(cudaGraphGetNodes(g, nodes, &n), cudaSuccess);
    assert_int_equal(n, 3);
    CUgraphNodeType t;
    assert_int_equal(cuGraphNodeGetType((CUgraphNode)nodes[0], &t), CUDA_SUCCESS);
    assert_int_equal(t, CU_GRAPH_NODE_TYPE_MEMSET);
    CUDA_MEMSET_NODE_PARAMS m;
    assert_int_equal(cuGraphMemsetNodeGetParams((CUgraphNode)nodes[0], &m), CUDA_SUCCESS);
    assert_int_equal(m.dst, (CUdeviceptr)(uintptr_t)a);
    assert_int_equal(m.elementSize * m.width * m.height, 1024);
    assert_int_equal(m.value, 7);
    CUDA_MEMCPY3D cp;
    assert_int_equal(cuGraphMemcpyNodeGetParams((CUgraphNode)nodes[2], &cp), CUDA_SUCCESS);
    assert_int_equal(cp.srcDevice, (CUdeviceptr)(uintptr_t)a);
    assert_int_equal(cp.dstDevice, (CUdeviceptr)(uintptr_t)b);
    assert_int_equal(cp.WidthInBytes, 1024);
    assert_int_equal(cuGraphMemsetNodeGetParams((CUgraphNode)nodes[1], &m),
                     CUDA_ERROR_INVALID_VALUE); /* a kernel node */

    cudaGraphExec_t e;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    /* The memset now sets c, to 9; the kernel adds 5. */
    struct cudaMemsetParams ms = {c, 0, 9, 4, 256, 1};
    assert_int_equal(cudaGraphExecMemsetNodeSetParams(e, nodes[0], &ms), cudaSuccess);
    assert_int_equal(cudaGraphExecMemsetNodeSetParams(e, nodes[1], &ms), cudaErrorInvalidValue);
    int five = 5;
    void *args[] = {&counter, &five};
    struct cudaKernelNodeParams kp = {(void *)k_add, one, one, 0, args, NULL};
    assert_int_equal(cudaGraphExecKernelNodeSetParams(e, nodes[1], &kp), cudaSuccess);
    assert_int_equal(cudaMemset(a, 0, 1024), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    assert_int_equal(word(c, 255), 9);
    assert_int_equal(word(a, 0), 0); /* the old target is left alone */
    assert_int_equal(read_counter(), 5);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);

    /* A graph of another shape cannot update it; one of the same can. */
    cudaGraph_t other = capture_adds(1, 1);
    cudaGraphExecUpdateResultInfo info;
    assert_int_equal(cudaGraphExecUpdate(e, other, &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorTopologyChanged);
    assert_int_equal(cudaGraphDestroy(other), cudaSuccess);
    cudaGraph_t same = capture_set_add_copy(c, a, 3);
    assert_int_equal(cudaGraphExecUpdate(e, same, &info), cudaSuccess);
    assert_int_equal(info.result, cudaGraphExecUpdateSuccess);
    assert_int_equal(cudaGraphDestroy(same), cudaSuccess); /* the exec keeps its copy */
    assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    assert_int_equal(word(c, 0), 3);
    assert_int_equal(word(a, 255), 3);
    assert_int_equal(read_counter(), 6);
    assert_int_equal(cudaGraphExecDestroy(e), cudaSuccess);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
}

/* The generic update (CUDA 12.2), runtime then driver: the memset, kernel
 * and memcpy nodes get new parameters and the launch does the new work;
 * parameters of another type than the node's, or none, are refused. */
static void test_generic_exec_node_updates(void **state)
{
    (void)state;
    int *a, *b, *c;
    assert_int_equal(cudaMalloc((void **)&a, 1024), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&b, 1024), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&c, 1024), cudaSuccess);
    assert_int_equal(cudaMemset(counter, 0, 4), cudaSuccess);
    cudaGraph_t g = capture_set_add_copy(a, b, 7);
    cudaGraphNode_t nodes[3];
    size_t n = 3;
    assert_int_equal(cudaGraphGetNodes(g, nodes, &n), cudaSuccess);
    cudaGraphExec_t e;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);

    /* Runtime: memset c to 9, add 5, copy c -> a. */
    struct cudaGraphNodeParams ms = {.type = cudaGraphNodeTypeMemset,
                                     .memset = {c, 0, 9, 4, 256, 1}};
    assert_int_equal(cudaGraphExecNodeSetParams(e, nodes[0], &ms), cudaSuccess);
    assert_int_equal(cudaGraphExecNodeSetParams(e, nodes[1], &ms), cudaErrorInvalidValue);
    assert_int_equal(cudaGraphExecNodeSetParams(e, nodes[0], NULL), cudaErrorInvalidValue);
    int five = 5;
    void *args[] = {&counter, &five};
    struct cudaGraphNodeParams kp = {.type = cudaGraphNodeTypeKernel,
                                     .kernel = {(void *)k_add, one, one, 0, args, NULL}};
    assert_int_equal(cudaGraphExecNodeSetParams(e, nodes[1], &kp), cudaSuccess);
    struct cudaGraphNodeParams cp = {.type = cudaGraphNodeTypeMemcpy};
    cp.memcpy.copyParams = (struct cudaMemcpy3DParms){.srcPtr = {c, 1024, 1024, 1},
                                                      .dstPtr = {a, 1024, 1024, 1},
                                                      .extent = {1024, 1, 1},
                                                      .kind = cudaMemcpyDeviceToDevice};
    assert_int_equal(cudaGraphExecNodeSetParams(e, nodes[2], &cp), cudaSuccess);
    assert_int_equal(cudaMemset(a, 0, 1024), cudaSuccess);
    assert_int_equal(cudaMemset(b, 0, 1024), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    assert_int_equal(word(c, 255), 9);
    assert_int_equal(word(a, 255), 9);
    assert_int_equal(word(b, 0), 0); /* the old targets are left alone */
    assert_int_equal(read_counter(), 5);

    /* Driver: memset b to 4, add 2; memory nodes' updates are refused. */
    CUgraphNodeParams dm = {.type = CU_GRAPH_NODE_TYPE_MEMSET,
                            .memset = {.dst = (CUdeviceptr)(uintptr_t)b,
                                       .value = 4,
                                       .elementSize = 4,
                                       .width = 256,
                                       .height = 1}};
    assert_int_equal(cuGraphExecNodeSetParams((CUgraphExec)e, (CUgraphNode)nodes[0], &dm),
                     CUDA_SUCCESS);
    int two = 2;
    void *args2[] = {&counter, &two};
    CUgraphNodeParams dk = {.type = CU_GRAPH_NODE_TYPE_KERNEL,
                            .kernel = {.func = simcuda_function(k_add),
                                       .gridDimX = 1,
                                       .gridDimY = 1,
                                       .gridDimZ = 1,
                                       .blockDimX = 1,
                                       .blockDimY = 1,
                                       .blockDimZ = 1,
                                       .kernelParams = args2}};
    assert_int_equal(cuGraphExecNodeSetParams((CUgraphExec)e, (CUgraphNode)nodes[1], &dk),
                     CUDA_SUCCESS);
    assert_int_equal(cuGraphExecNodeSetParams((CUgraphExec)e, (CUgraphNode)nodes[0], &dk),
                     CUDA_ERROR_INVALID_VALUE);
    CUgraphNodeParams free_node = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE};
    assert_int_equal(cuGraphExecNodeSetParams((CUgraphExec)e, (CUgraphNode)nodes[0], &free_node),
                     CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(cudaGraphLaunch(e, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    assert_int_equal(word(b, 255), 4);
    assert_int_equal(read_counter(), 7);
    assert_int_equal(cudaGraphExecDestroy(e), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_runs_only_when_launched),
        cmocka_unit_test(test_kernel_nodes),
        cmocka_unit_test(test_sync_during_capture_invalidates),
        cmocka_unit_test(test_capture_on_legacy_stream_refused),
        cmocka_unit_test(test_graph_launch_callbacks),
        cmocka_unit_test(test_alloc_in_capture_is_the_graphs),
        cmocka_unit_test(test_free_node_frees_graph_memory),
        cmocka_unit_test(test_node_params_and_exec_updates),
        cmocka_unit_test(test_generic_exec_node_updates),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
