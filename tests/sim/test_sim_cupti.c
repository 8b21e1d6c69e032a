/* test_sim_cupti.c — the simulated CUPTI (libcupti.so.13): one subscriber,
 * callbacks enabled by id or by domain, and the API callbacks of kernel
 * launches through the driver and the runtime, carrying the real callback ids
 * and the real parameter structs of <cupti.h>.
 *
 * The callback copies what it is given (the data is valid only during the
 * call) into a log the tests read afterwards.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/sim/simcuda.h"

cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);

/* ---- the log ---- */

struct record {
    CUpti_CallbackDomain domain;
    CUpti_CallbackId cbid;
    CUpti_ApiCallbackSite site;
    const char *function;
    char symbol[64];
    bool has_symbol;
    uint32_t corr;
    uint64_t corr_data; /* at EXIT: what ENTER left there */
    CUcontext context;
    int ret; /* at EXIT */
    pthread_t thread;
    void *user;
    union {
        cuLaunchKernel_params launch;
        cuLaunchKernelEx_params ex;
        cuLaunchCooperativeKernel_params coop;
        cudaLaunchKernel_v7000_params rt;
    } p;
    CUlaunchConfig config; /* a copy of *p.ex.config */
};

static struct record logv[64];
static int nlog;

static void CUPTIAPI on_callback(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *cbdata)
{
    const CUpti_CallbackData *d = cbdata;
    if (nlog >= 64)
        return;
    struct record *r = &logv[nlog++];
    memset(r, 0, sizeof *r);
    r->domain = domain;
    r->cbid = cbid;
    r->site = d->callbackSite;
    r->function = d->functionName;
    r->has_symbol = d->symbolName != NULL;
    if (d->symbolName)
        snprintf(r->symbol, sizeof r->symbol, "%s", d->symbolName);
    r->corr = d->correlationId;
    r->context = d->context;
    r->thread = pthread_self();
    r->user = user;
    if (d->callbackSite == CUPTI_API_ENTER) {
        *d->correlationData = 0xc0ffee00ull + d->correlationId;
    } else {
        r->corr_data = *d->correlationData;
        r->ret = *(const int *)d->functionReturnValue;
    }
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel)
        r->p.launch = *(const cuLaunchKernel_params *)d->functionParams;
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx) {
        r->p.ex = *(const cuLaunchKernelEx_params *)d->functionParams;
        if (r->p.ex.config)
            r->config = *r->p.ex.config;
    }
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API &&
        cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel)
        r->p.coop = *(const cuLaunchCooperativeKernel_params *)d->functionParams;
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API &&
        cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000)
        r->p.rt = *(const cudaLaunchKernel_v7000_params *)d->functionParams;
}

static int user_token;

/* ---- helpers ---- */

/* (int *dst, int v): *dst = v */
static void k_set(void **args)
{
    **(int **)args[0] = *(int *)args[1];
}
static void k_unknown(void **args)
{
    (void)args;
}

static CUcontext ctx;
static CUpti_SubscriberHandle sub;

static void need_ctx(void)
{
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    if (!ctx) {
        assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        const size_t sz[] = {sizeof(int *), sizeof(int)};
        assert_int_equal(simcuda_register_kernel(k_set, "k_set", 2, sz, 1), 0);
    }
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

static void subscribe(void)
{
    assert_int_equal(cuptiSubscribe(&sub, on_callback, &user_token), CUPTI_SUCCESS);
    assert_non_null(sub);
    nlog = 0;
}

static void unsubscribe(void)
{
    assert_int_equal(cuptiUnsubscribe(sub), CUPTI_SUCCESS);
    sub = NULL;
}

#include "capture.h"

/* The ENTER/EXIT pair of one call at log[i], log[i + 1]. */
static void assert_pair(int i, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                        const char *function)
{
    assert_true(i + 1 < nlog);
    const struct record *in = &logv[i], *out = &logv[i + 1];
    assert_int_equal(in->domain, domain);
    assert_int_equal(out->domain, domain);
    assert_int_equal(in->cbid, cbid);
    assert_int_equal(out->cbid, cbid);
    assert_int_equal(in->site, CUPTI_API_ENTER);
    assert_int_equal(out->site, CUPTI_API_EXIT);
    assert_non_null(in->function);
    assert_string_equal(in->function, function);
    assert_string_equal(out->function, function);
    assert_true(in->corr != 0);
    assert_int_equal(in->corr, out->corr);
    assert_int_equal(out->corr_data, 0xc0ffee00ull + in->corr);
    assert_ptr_equal(in->context, ctx);
    assert_ptr_equal(in->user, &user_token);
    assert_true(pthread_equal(in->thread, pthread_self()));
    assert_true(pthread_equal(out->thread, pthread_self()));
}

/* ---- subscribers ---- */

static void one_subscriber_at_a_time(void **state)
{
    (void)state;
    CUpti_SubscriberHandle a = NULL, b = NULL;
    assert_int_equal(cuptiSubscribe(&a, on_callback, NULL), CUPTI_SUCCESS);
    assert_non_null(a);
    assert_int_equal(cuptiSubscribe(&b, on_callback, NULL),
                     CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
    CUpti_SubscriberParams p;
    memset(&p, 0, sizeof p);
    p.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    assert_int_equal(cuptiSubscribe_v2(&b, on_callback, NULL, &p),
                     CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
    assert_int_equal(cuptiUnsubscribe(a), CUPTI_SUCCESS);
    assert_int_equal(cuptiUnsubscribe(a), CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiUnsubscribe(NULL), CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiEnableDomain(1, a, CUPTI_CB_DOMAIN_DRIVER_API),
                     CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiSubscribe(NULL, on_callback, NULL), CUPTI_ERROR_INVALID_PARAMETER);

    /* The other entry point, with and without parameters. */
    p.subscriberName = "second";
    assert_int_equal(cuptiSubscribe_v2(&b, on_callback, NULL, &p), CUPTI_SUCCESS);
    assert_non_null(b);
    assert_int_equal(cuptiSubscribe(&a, on_callback, NULL),
                     CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
    assert_int_equal(cuptiUnsubscribe(b), CUPTI_SUCCESS);
    assert_int_equal(cuptiSubscribe_v2(&b, on_callback, NULL, NULL), CUPTI_SUCCESS);
    assert_int_equal(cuptiUnsubscribe(b), CUPTI_SUCCESS);
}

/* cupti_callbacks.h, cuptiSubscribe_v2: CUPTI_ERROR_INVALID_PARAMETER "if
 * pParams.structSize is not filled with the size of the structure". */
static void subscribe_v2_checks_the_struct_size(void **state)
{
    (void)state;
    CUpti_SubscriberHandle a = NULL;
    CUpti_SubscriberParams p;
    memset(&p, 0, sizeof p);
    CUptiResult r = cuptiSubscribe_v2(&a, on_callback, NULL, &p);
    if (r == CUPTI_SUCCESS)
        cuptiUnsubscribe(a);
    assert_int_equal(r, CUPTI_ERROR_INVALID_PARAMETER);
}

/* cupti_callbacks.h, CUpti_SubscriberParams::oldSubscriberName: "In case of
 * CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED return code, the name of the
 * incompatible tool or the existing CUPTI subscriber will be written to this
 * location." */
static void subscribe_v2_names_the_existing_subscriber(void **state)
{
    (void)state;
    CUpti_SubscriberHandle a = NULL, b = NULL;
    CUpti_SubscriberParams p;
    memset(&p, 0, sizeof p);
    p.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    p.subscriberName = "first-tool";
    assert_int_equal(cuptiSubscribe_v2(&a, on_callback, NULL, &p), CUPTI_SUCCESS);
    char old[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = "";
    CUpti_SubscriberParams q;
    memset(&q, 0, sizeof q);
    q.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    q.subscriberName = "second-tool";
    q.oldSubscriberName = old;
    q.oldSubscriberSize = sizeof old;
    CUptiResult r = cuptiSubscribe_v2(&b, on_callback, NULL, &q);
    assert_int_equal(cuptiUnsubscribe(a), CUPTI_SUCCESS);
    assert_int_equal(r, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
    assert_non_null(strstr(old, "first-tool"));
}

static void result_strings(void **state)
{
    (void)state;
    static const struct {
        CUptiResult r;
        const char *s;
    } want[] = {
#define E(code) {code, #code}
        E(CUPTI_SUCCESS),
        E(CUPTI_ERROR_INVALID_PARAMETER),
        E(CUPTI_ERROR_NOT_SUPPORTED),
        E(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED),
#undef E
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *s = NULL;
        assert_int_equal(cuptiGetResultString(want[i].r, &s), CUPTI_SUCCESS);
        assert_non_null(s);
        assert_string_equal(s, want[i].s);
    }
    assert_int_equal(cuptiGetResultString(CUPTI_SUCCESS, NULL), CUPTI_ERROR_INVALID_PARAMETER);
}

/* ---- enabling ---- */

static void callbacks_are_enabled_by_id(void **state)
{
    (void)state;
    need_ctx();
    subscribe();
    CUfunction f = simcuda_function(k_set);
    int *out = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&out, 64, 0), CUDA_SUCCESS);
    int v = 1;
    void *args[] = {&out, &v};
    CUlaunchConfig cfg = {.gridDimX = 1,
                          .gridDimY = 1,
                          .gridDimZ = 1,
                          .blockDimX = 1,
                          .blockDimY = 1,
                          .blockDimZ = 1};

    /* Nothing enabled: nothing delivered. */
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 0);

    assert_int_equal(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API,
                                         CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
                     CUPTI_SUCCESS);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 2);
    assert_pair(0, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                "cuLaunchKernel");
    /* Other ids stay off. */
    assert_int_equal(cuLaunchKernelEx(&cfg, f, args, NULL), CUDA_SUCCESS);
    assert_int_equal(cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args), CUDA_SUCCESS);
    assert_int_equal(
        cudaLaunchKernel((const void *)k_set, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, NULL),
        cudaSuccess);
    assert_int_equal(nlog, 4); /* only the runtime launch's nested cuLaunchKernel */
    assert_pair(2, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                "cuLaunchKernel");

    assert_int_equal(cuptiEnableCallback(0, sub, CUPTI_CB_DOMAIN_DRIVER_API,
                                         CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
                     CUPTI_SUCCESS);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 4);

    assert_int_equal(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_INVALID,
                                         CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
                     CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(
        cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_SIZE, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
        CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiEnableCallback(1, (CUpti_SubscriberHandle)&nlog,
                                         CUPTI_CB_DOMAIN_DRIVER_API,
                                         CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
                     CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    unsubscribe();
    assert_int_equal(cuMemFreeHost(out), CUDA_SUCCESS);
}

static void callbacks_are_enabled_by_domain(void **state)
{
    (void)state;
    need_ctx();
    subscribe();
    CUfunction f = simcuda_function(k_set);
    int *out = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&out, 64, 0), CUDA_SUCCESS);
    int v = 1;
    void *args[] = {&out, &v};
    CUlaunchConfig cfg = {.gridDimX = 1,
                          .gridDimY = 1,
                          .gridDimZ = 1,
                          .blockDimX = 1,
                          .blockDimY = 1,
                          .blockDimZ = 1};

    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 0);
    assert_int_equal(
        cudaLaunchKernel((const void *)k_set, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, NULL),
        cudaSuccess);
    assert_int_equal(nlog, 2);
    assert_pair(0, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
                "cudaLaunchKernel");

    nlog = 0;
    assert_int_equal(cuptiEnableDomain(0, sub, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API), CUPTI_SUCCESS);
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    assert_int_equal(cuLaunchKernelEx(&cfg, f, args, NULL), CUDA_SUCCESS);
    assert_int_equal(cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args), CUDA_SUCCESS);
    assert_int_equal(nlog, 6);
    assert_pair(0, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                "cuLaunchKernel");
    assert_pair(2, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
                "cuLaunchKernelEx");
    assert_pair(4, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
                "cuLaunchCooperativeKernel");
    /* Each call has its own correlation id. */
    assert_true(logv[0].corr != logv[2].corr);
    assert_true(logv[2].corr != logv[4].corr);

    /* Domains other than the API ones are refused, loudly. */
    struct capture c;
    char err[512];
    capture_begin(&c);
    CUptiResult r = cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RESOURCE);
    capture_end(&c, err, sizeof err);
    assert_int_equal(r, CUPTI_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(err, "cuptiEnableDomain"));
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_INVALID),
                     CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_SIZE),
                     CUPTI_ERROR_INVALID_PARAMETER);

    /* After unsubscribing, nothing is delivered. */
    unsubscribe();
    nlog = 0;
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 0);
    /* And a new subscriber starts with nothing enabled. */
    subscribe();
    assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 0);
    unsubscribe();
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(out), CUDA_SUCCESS);
}

/* ---- the parameters ---- */

static void driver_launch_callbacks_carry_the_call(void **state)
{
    (void)state;
    need_ctx();
    subscribe();
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API), CUPTI_SUCCESS);
    CUfunction f = simcuda_function(k_set);
    CUstream s = NULL;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    int *out = NULL;
    assert_int_equal(cuMemHostAlloc((void **)&out, 64, 0), CUDA_SUCCESS);
    int v = 31;
    void *args[] = {&out, &v};

    assert_int_equal(cuLaunchKernel(f, 2, 3, 4, 5, 6, 7, 128, s, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 2);
    assert_pair(0, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                "cuLaunchKernel");
    for (int i = 0; i < 2; i++) {
        const cuLaunchKernel_params *p = &logv[i].p.launch;
        assert_ptr_equal(p->f, f);
        assert_int_equal(p->gridDimX, 2);
        assert_int_equal(p->gridDimY, 3);
        assert_int_equal(p->gridDimZ, 4);
        assert_int_equal(p->blockDimX, 5);
        assert_int_equal(p->blockDimY, 6);
        assert_int_equal(p->blockDimZ, 7);
        assert_int_equal(p->sharedMemBytes, 128);
        assert_ptr_equal(p->hStream, s);
        assert_ptr_equal(p->kernelParams, args);
        assert_null(p->extra);
        assert_true(logv[i].has_symbol);
        assert_string_equal(logv[i].symbol, "k_set");
    }
    assert_int_equal(logv[1].ret, CUDA_SUCCESS);

    /* A refused launch reports its result on EXIT. */
    assert_int_equal(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, s, args, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(nlog, 4);
    assert_pair(2, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                "cuLaunchKernel");
    assert_int_equal(logv[3].ret, CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(logv[2].p.launch.gridDimX, 0);
    assert_true(logv[2].corr != logv[0].corr);

    /* cuLaunchKernelEx: the config pointer itself, and what it points to. */
    CUlaunchConfig cfg = {.gridDimX = 9,
                          .gridDimY = 1,
                          .gridDimZ = 2,
                          .blockDimX = 32,
                          .blockDimY = 2,
                          .blockDimZ = 1,
                          .sharedMemBytes = 64,
                          .hStream = s};
    assert_int_equal(cuLaunchKernelEx(&cfg, f, args, NULL), CUDA_SUCCESS);
    assert_int_equal(nlog, 6);
    assert_pair(4, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
                "cuLaunchKernelEx");
    assert_ptr_equal(logv[4].p.ex.config, &cfg);
    assert_ptr_equal(logv[4].p.ex.f, f);
    assert_ptr_equal(logv[4].p.ex.kernelParams, args);
    assert_null(logv[4].p.ex.extra);
    assert_int_equal(logv[4].config.gridDimX, 9);
    assert_int_equal(logv[4].config.gridDimZ, 2);
    assert_int_equal(logv[4].config.blockDimY, 2);
    assert_ptr_equal(logv[4].config.hStream, s);
    assert_string_equal(logv[4].symbol, "k_set");
    assert_int_equal(logv[5].ret, CUDA_SUCCESS);

    /* cuLaunchCooperativeKernel. */
    assert_int_equal(cuLaunchCooperativeKernel(f, 4, 1, 1, 256, 1, 1, 16, s, args), CUDA_SUCCESS);
    assert_int_equal(nlog, 8);
    assert_pair(6, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
                "cuLaunchCooperativeKernel");
    const cuLaunchCooperativeKernel_params *cp = &logv[6].p.coop;
    assert_ptr_equal(cp->f, f);
    assert_int_equal(cp->gridDimX, 4);
    assert_int_equal(cp->blockDimX, 256);
    assert_int_equal(cp->sharedMemBytes, 16);
    assert_ptr_equal(cp->hStream, s);
    assert_ptr_equal(cp->kernelParams, args);
    assert_string_equal(logv[6].symbol, "k_set");
    assert_int_equal(logv[7].ret, CUDA_SUCCESS);

    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(*out, 31);
    unsubscribe();
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(out), CUDA_SUCCESS);
}

static void runtime_launch_nests_the_driver_launch(void **state)
{
    (void)state;
    need_ctx();
    subscribe();
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API), CUPTI_SUCCESS);
    assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    int *out = NULL;
    assert_int_equal(cudaMallocHost((void **)&out, 64), cudaSuccess);
    int v = 77;
    void *args[] = {&out, &v};
    dim3 grid = {3, 2, 1}, block = {64, 2, 2};

    assert_int_equal(cudaLaunchKernel((const void *)k_set, grid, block, args, 48, s), cudaSuccess);
    assert_int_equal(nlog, 4);
    /* runtime ENTER, driver ENTER, driver EXIT, runtime EXIT */
    assert_int_equal(logv[0].domain, CUPTI_CB_DOMAIN_RUNTIME_API);
    assert_int_equal(logv[0].site, CUPTI_API_ENTER);
    assert_int_equal(logv[1].domain, CUPTI_CB_DOMAIN_DRIVER_API);
    assert_int_equal(logv[1].site, CUPTI_API_ENTER);
    assert_int_equal(logv[2].domain, CUPTI_CB_DOMAIN_DRIVER_API);
    assert_int_equal(logv[2].site, CUPTI_API_EXIT);
    assert_int_equal(logv[3].domain, CUPTI_CB_DOMAIN_RUNTIME_API);
    assert_int_equal(logv[3].site, CUPTI_API_EXIT);
    assert_int_equal(logv[0].cbid, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    assert_int_equal(logv[3].cbid, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    assert_int_equal(logv[1].cbid, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
    assert_int_equal(logv[2].cbid, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
    assert_string_equal(logv[0].function, "cudaLaunchKernel");
    assert_string_equal(logv[1].function, "cuLaunchKernel");
    assert_int_equal(logv[0].corr, logv[3].corr);
    assert_int_equal(logv[1].corr, logv[2].corr);
    assert_true(logv[0].corr != logv[1].corr);
    assert_int_equal(logv[3].corr_data, 0xc0ffee00ull + logv[0].corr);
    assert_int_equal(logv[2].corr_data, 0xc0ffee00ull + logv[1].corr);
    assert_int_equal(logv[3].ret, cudaSuccess);
    assert_int_equal(logv[2].ret, CUDA_SUCCESS);
    assert_ptr_equal(logv[0].context, ctx);

    const cudaLaunchKernel_v7000_params *rp = &logv[0].p.rt;
    assert_ptr_equal(rp->func, (const void *)k_set);
    assert_int_equal(rp->gridDim.x, 3);
    assert_int_equal(rp->gridDim.y, 2);
    assert_int_equal(rp->gridDim.z, 1);
    assert_int_equal(rp->blockDim.x, 64);
    assert_int_equal(rp->blockDim.y, 2);
    assert_int_equal(rp->blockDim.z, 2);
    assert_ptr_equal(rp->args, args);
    assert_int_equal(rp->sharedMem, 48);
    assert_ptr_equal(rp->stream, s);
    const cuLaunchKernel_params *dp = &logv[1].p.launch;
    assert_ptr_equal(dp->f, simcuda_function(k_set));
    assert_ptr_equal(dp->kernelParams, args);
    assert_ptr_equal(dp->hStream, (CUstream)s);
    assert_int_equal(dp->gridDimX, 3);
    assert_int_equal(dp->gridDimY, 2);
    assert_int_equal(dp->blockDimZ, 2);
    assert_int_equal(dp->sharedMemBytes, 48);
    assert_string_equal(logv[1].symbol, "k_set");

    /* An unregistered function: the runtime's pair only, with the error. */
    nlog = 0;
    assert_int_equal(cudaLaunchKernel((const void *)k_unknown, grid, block, args, 0, s),
                     cudaErrorInvalidDeviceFunction);
    assert_int_equal(nlog, 2);
    assert_pair(0, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
                "cudaLaunchKernel");
    assert_int_equal(logv[1].ret, cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDeviceFunction);

    /* The CUDA 13 stub entry point: CUPTI names it cudaLaunchKernel, with
     * the kernel handle as func (as on a real H200 with CUDA 13.0). */
    nlog = 0;
    cudaKernel_t k = NULL;
    assert_int_equal(__cudaGetKernel(&k, (const void *)k_set), cudaSuccess);
    assert_int_equal(nlog, 0);
    assert_int_equal(__cudaLaunchKernel(k, grid, block, args, 0, s), cudaSuccess);
    assert_int_equal(nlog, 4);
    assert_int_equal(logv[0].cbid, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    assert_int_equal(logv[0].domain, CUPTI_CB_DOMAIN_RUNTIME_API);
    assert_string_equal(logv[0].function, "cudaLaunchKernel");
    assert_ptr_equal(logv[0].p.rt.func, k);
    assert_int_equal(logv[0].corr, logv[3].corr);
    assert_int_equal(logv[3].cbid, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    assert_int_equal(logv[3].site, CUPTI_API_EXIT);
    assert_int_equal(logv[3].ret, cudaSuccess);
    assert_pair(1, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                "cuLaunchKernel");
    assert_ptr_equal(logv[1].p.launch.kernelParams, args);

    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(*out, 77);
    unsubscribe();
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaFreeHost(out), cudaSuccess);
}

/* cupti_callbacks.h, CUpti_CallbackData::symbolName: "This entry is valid
 * only for driver and runtime launch callbacks, where it returns the name of
 * the kernel." */
static void runtime_launch_callbacks_name_the_kernel(void **state)
{
    (void)state;
    need_ctx();
    subscribe();
    assert_int_equal(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                                         CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000),
                     CUPTI_SUCCESS);
    int *out = NULL;
    assert_int_equal(cudaMallocHost((void **)&out, 64), cudaSuccess);
    int v = 1;
    void *args[] = {&out, &v};
    assert_int_equal(
        cudaLaunchKernel((const void *)k_set, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, NULL),
        cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    unsubscribe();
    assert_int_equal(cudaFreeHost(out), cudaSuccess);
    assert_int_equal(nlog, 2);
    assert_true(logv[0].has_symbol);
    assert_string_equal(logv[0].symbol, "k_set");
}

/* ---- what CUPTI does not implement ---- */

/* cuptiFinalize ends the subscription (its callbacks stop, its handle is
 * dead) and CUPTI takes a new subscriber afterwards. */
static void finalize_ends_the_subscription(void **state)
{
    (void)state;
    need_ctx();
    CUpti_SubscriberHandle a = NULL, b = NULL;
    assert_int_equal(cuptiSubscribe(&a, on_callback, NULL), CUPTI_SUCCESS);
    assert_int_equal(cuptiFinalize(), CUPTI_SUCCESS);
    assert_int_equal(cuptiEnableDomain(1, a, CUPTI_CB_DOMAIN_DRIVER_API),
                     CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiUnsubscribe(a), CUPTI_ERROR_INVALID_PARAMETER);
    assert_int_equal(cuptiSubscribe(&b, on_callback, NULL), CUPTI_SUCCESS);
    assert_int_equal(cuptiUnsubscribe(b), CUPTI_SUCCESS);
    assert_int_equal(cuptiFinalize(), CUPTI_SUCCESS); /* nothing subscribed: still fine */
}

static void unimplemented_calls_are_refused_loudly(void **state)
{
    (void)state;
    struct capture c;
    char err[1024];
    capture_begin(&c);
    CUptiResult r1 = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    CUptiResult r2 = cuptiActivityFlushAll(0);
    capture_end(&c, err, sizeof err);
    assert_int_equal(r1, CUPTI_ERROR_NOT_SUPPORTED);
    assert_int_equal(r2, CUPTI_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(err, "cuptiActivityEnable"));
    assert_non_null(strstr(err, "cuptiActivityFlushAll"));
}

int main(void)
{
    static const char *const env[] = {"SIMCUDA_VRAM_MB",        "SIMCUDA_HOST_MB",
                                      "SIMCUDA_GRANULARITY_KB", "SIMCUDA_PCIE_GBPS",
                                      "SIMCUDA_KERNEL_US",      "SIMCUDA_NO_HOST_VMM"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        unsetenv(env[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_subscriber_at_a_time),
        cmocka_unit_test(subscribe_v2_checks_the_struct_size),
        cmocka_unit_test(subscribe_v2_names_the_existing_subscriber),
        cmocka_unit_test(result_strings),
        cmocka_unit_test(callbacks_are_enabled_by_id),
        cmocka_unit_test(callbacks_are_enabled_by_domain),
        cmocka_unit_test(driver_launch_callbacks_carry_the_call),
        cmocka_unit_test(runtime_launch_nests_the_driver_launch),
        cmocka_unit_test(runtime_launch_callbacks_name_the_kernel),
        cmocka_unit_test(finalize_ends_the_subscription),
        cmocka_unit_test(unimplemented_calls_are_refused_loudly),
    };
    return cmocka_run_group_tests_name("sim_cupti", tests, NULL, NULL);
}
