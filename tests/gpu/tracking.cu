/* tracking.cu — launches are seen, by CUPTI or by the hooks.
 *
 * Regions worth 1.5x the budget are filled, then bumped in three passes,
 * each through another launch API: the <<<>>> syntax (__cudaLaunchKernel
 * since CUDA 13), cudaLaunchKernel, and the driver's cuLaunchKernel. A
 * launch that points into an evicted region must bring it back first, so
 * every pass must show restores; every word is checked at the end.
 *
 * Usage: tracking MODE
 *   cupti       the library tracks with CUPTI callbacks (tracking_mode 1)
 *   hooks       run with STAGEHAND_TRACKING_MODE=hooks: the launch hooks
 *               track (tracking_mode 2)
 *   subscriber  this program subscribes to CUPTI itself before its first
 *               allocation, as a profiler does; the library must find
 *               CUPTI taken, fall back to the hooks (tracking_mode 2), and
 *               this program's own callbacks must still fire
 *   env TRACKING_TOTAL_MB (1.5x the budget, else 6144), TRACKING_REGION_MB
 *       (256), STAGEHAND_TRACKING_CUPTI_PATH (the CUPTI library to load)
 */
#include "common.cuh"

#include <cupti.h>

#include <vector>

static std::atomic<unsigned long long> own_launches{0};

static void CUPTIAPI own_callback(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                  const void *data)
{
    (void)user;
    (void)domain;
    (void)cbid;
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    if (cb->callbackSite == CUPTI_API_ENTER)
        own_launches.fetch_add(1);
}

/* Takes CUPTI before anything else can, as torch.profiler or Nsight do. */
static void subscribe_first(void)
{
    const char *path = getenv("STAGEHAND_TRACKING_CUPTI_PATH");
    if (!path || !*path)
        path = "libcupti.so.13";
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        fail("cannot load CUPTI from %s: %s", path, dlerror());
    auto subscribe = (decltype(&cuptiSubscribe))dlsym(lib, "cuptiSubscribe");
    auto enable = (decltype(&cuptiEnableCallback))dlsym(lib, "cuptiEnableCallback");
    if (!subscribe || !enable)
        fail("%s lacks cuptiSubscribe", path);
    CUpti_SubscriberHandle sub;
    CUptiResult r = subscribe(&sub, (CUpti_CallbackFunc)own_callback, NULL);
    if (r != CUPTI_SUCCESS)
        fail("cuptiSubscribe failed (%d): something holds CUPTI already", (int)r);
    const CUpti_CallbackId rt[] = {CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
                                   CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000};
    for (CUpti_CallbackId id : rt)
        if (enable(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, id) != CUPTI_SUCCESS)
            fail("cuptiEnableCallback(runtime %u) failed", (unsigned)id);
    if (enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) !=
        CUPTI_SUCCESS)
        fail("cuptiEnableCallback(cuLaunchKernel) failed");
    info("this program holds the CUPTI subscription (%s)", path);
}

static const char *api_name[3] = {"<<<>>>", "cudaLaunchKernel", "cuLaunchKernel"};

static void bump(int api, uint32_t *p, size_t words, CUfunction f)
{
    void *args[] = {&p, &words};
    switch (api) {
    case 0:
        k_bump<<<kGrid, kBlock>>>(p, words);
        CK(cudaGetLastError());
        break;
    case 1:
        CK(cudaLaunchKernel((const void *)k_bump, dim3(kGrid), dim3(kBlock), args, 0, 0));
        break;
    default:
        CKD(cuLaunchKernel(f, kGrid, 1, 1, kBlock, 1, 1, 0, 0, args, NULL));
        break;
    }
}

int main(int argc, char **argv)
{
    set_test_name("tracking");
    const char *mode = argc > 1 ? argv[1] : "cupti";
    uint64_t want;
    if (!strcmp(mode, "cupti"))
        want = 1;
    else if (!strcmp(mode, "hooks") || !strcmp(mode, "subscriber"))
        want = 2;
    else
        fail("usage: tracking cupti|hooks|subscriber");
    static char name[64];
    snprintf(name, sizeof name, "tracking-%s", mode);
    set_test_name(name);
    if (!strcmp(mode, "subscriber"))
        subscribe_first();

    long long budget_mb = budget_mb_from_env();
    long long total_mb = env_ll("TRACKING_TOTAL_MB", budget_mb ? budget_mb * 3 / 2 : 6144);
    long long region_mb = env_ll("TRACKING_REGION_MB", 256);
    const int n = (int)(total_mb / region_mb);
    const size_t region = (size_t)region_mb << 20, words = region / 4;
    if (n < 2)
        fail("bad sizes: total %lld MB, region %lld MB", total_mb, region_mb);

    CK(cudaSetDevice(0));
    std::vector<uint32_t *> r(n, nullptr);
    for (int i = 0; i < n; i++) {
        CK(cudaMalloc((void **)&r[i], region));
        k_fill<<<kGrid, kBlock>>>(r[i], words, (uint32_t)(7 + i));
        CK(cudaGetLastError());
    }
    CK(cudaDeviceSynchronize());
    stagehand_stats_t st = sh_stats();
    if (!st.active)
        fail("the library is not active: run under LD_PRELOAD=libstagehand.so");
    if (st.tracking_mode != want)
        fail("tracking mode is %s, expected %s", tracking_name(st.tracking_mode),
             tracking_name(want));
    info("tracking mode %s, %d regions of %lld MB against a %llu MB budget", tracking_name(want), n,
         region_mb, (unsigned long long)(st.budget_bytes >> 20));

    CUfunction f = NULL;
    CK(cudaGetFuncBySymbol((cudaFunction_t *)&f, (const void *)k_bump));
    unsigned long long own_before = own_launches.load();
    unsigned long long restores[3], launches[3];
    for (int api = 0; api < 3; api++) {
        stagehand_stats_t a = sh_stats();
        for (int i = 0; i < n; i++)
            bump(api, r[i], words, f);
        CK(cudaDeviceSynchronize());
        stagehand_stats_t b = sh_stats();
        restores[api] = b.restores - a.restores;
        launches[api] = b.launches - a.launches;
        info("%-16s %d launches: %llu seen, %llu restores", api_name[api], n, launches[api],
             restores[api]);
    }
    unsigned long long own = own_launches.load() - own_before;

    uint32_t *h = NULL;
    CK(cudaMallocHost((void **)&h, region));
    size_t bad = 0;
    for (int i = 0; i < n; i++) {
        CK(cudaMemcpy(h, r[i], region, cudaMemcpyDeviceToHost));
        bad += host_mismatches(h, words, (uint32_t)(7 + i), 3);
    }
    CK(cudaFreeHost(h));
    for (int i = 0; i < n; i++)
        CK(cudaFree(r[i]));
    st = sh_stats();
    print_sh_stats("after", st);
    printf("RESULT %s restores=%llu,%llu,%llu launches_seen=%llu,%llu,%llu own_callbacks=%llu "
           "bad_words=%zu\n",
           name, restores[0], restores[1], restores[2], launches[0], launches[1], launches[2], own,
           bad);
    if (bad)
        fail("%zu words differ", bad);
    for (int api = 0; api < 3; api++) {
        if (launches[api] < (unsigned long long)n)
            fail("%s: %llu of %d launches seen", api_name[api], launches[api], n);
        if (restores[api] == 0)
            fail("%s: no launch brought an evicted region back", api_name[api]);
    }
    if (!strcmp(mode, "subscriber") && own < 3ull * n)
        fail("this program's own CUPTI callbacks fired %llu times for %d launches", own, 3 * n);
    pass("tracking by %s: every launch API seen, evicted regions restored before their launches "
         "(%llu, %llu, %llu restores), every word exact%s",
         tracking_name(want), restores[0], restores[1], restores[2],
         !strcmp(mode, "subscriber") ? "; the other subscriber's callbacks still fired" : "");
    return 0;
}
