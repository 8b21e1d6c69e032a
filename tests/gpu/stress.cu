/* stress.cu — threads and streams of random alloc/free/launch under eviction.
 *
 * THREADS threads, each with two non-blocking streams and SLOTS slots, do
 * OPS random operations: allocate (cudaMallocAsync, cudaMalloc or the
 * pluggable entry point stagehand_malloc when preloaded) and fill, bump,
 * check on the device, or check every word on the host and free. A slot's
 * work stays on one stream, so its order is the program's. The live set
 * is about twice the budget, so regions keep moving both ways; at the end
 * the library must have moved at least STRESS_MIN_TRAFFIC_MB.
 *
 * Usage: stress [OPS]
 *   env STRESS_THREADS (4), STRESS_SLOTS (12), STRESS_OPS (200),
 *       STRESS_MIN_MB (32), STRESS_MAX_MB (320), STRESS_SEED (12345),
 *       STRESS_MIN_TRAFFIC_MB (2048), STRESS_SLACK_MB (256)
 */
#include "common.cuh"

#include <vector>

struct slot {
    uint32_t *p = nullptr;
    size_t words = 0;
    uint32_t seed = 0, bumps = 0;
    int how = 0; /* 0 cudaMallocAsync, 1 cudaMalloc, 2 stagehand_malloc */
};

struct worker {
    unsigned id = 0, rng = 0;
    int slots = 0, ops = 0;
    size_t min_mb = 0, max_mb = 0;
    size_t bad = 0, failures = 0, checks = 0, allocs = 0;
    char first_error[256] = "";
};

static sh_api g_api;

static unsigned next_rand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

static void note(worker *w, const char *what, cudaError_t e)
{
    w->failures++;
    if (!w->first_error[0])
        snprintf(w->first_error, sizeof w->first_error, "thread %u: %s: %s", w->id, what,
                 cudaGetErrorString(e));
}

static void *stress_main(void *arg)
{
    worker *w = (worker *)arg;
    std::vector<slot> slots(w->slots);
    cudaStream_t s[2];
    for (int i = 0; i < 2; i++)
        if (cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) != cudaSuccess)
            w->failures++;
    uint32_t *h = NULL;
    unsigned long long *counter = NULL, *hcount = NULL;
    cudaError_t e;
    if ((e = cudaMallocHost((void **)&h, w->max_mb << 20)) != cudaSuccess ||
        (e = cudaMallocHost((void **)&hcount, sizeof *hcount)) != cudaSuccess ||
        (e = cudaMalloc((void **)&counter, 2 * sizeof *counter)) != cudaSuccess) {
        note(w, "setup", e);
        return NULL;
    }
    for (int op = 0; op < w->ops; op++) {
        unsigned k = next_rand(&w->rng) % (unsigned)w->slots;
        slot *sl = &slots[k];
        cudaStream_t st = s[k & 1];
        unsigned what = next_rand(&w->rng) % 10;
        if (!sl->p) {
            size_t span = w->max_mb - w->min_mb + 1;
            size_t mb = w->min_mb + next_rand(&w->rng) % span;
            sl->words = (mb << 20) / 4;
            sl->seed = w->id * 1000003u + (unsigned)op;
            sl->bumps = 0;
            sl->how = (int)(next_rand(&w->rng) % 3);
            if (sl->how == 2 && !g_api.malloc_fn)
                sl->how = 0;
            if (sl->how == 2) {
                sl->p = (uint32_t *)g_api.malloc_fn((ssize_t)(sl->words * 4), 0, st);
                e = sl->p ? cudaSuccess : cudaErrorMemoryAllocation;
            } else if (sl->how == 1) {
                e = cudaMalloc((void **)&sl->p, sl->words * 4);
            } else {
                e = cudaMallocAsync((void **)&sl->p, sl->words * 4, st);
            }
            if (e != cudaSuccess) {
                note(w, "allocation", e);
                sl->p = NULL;
                continue;
            }
            w->allocs++;
            k_fill<<<kGrid, kBlock, 0, st>>>(sl->p, sl->words, sl->seed);
            if ((e = cudaGetLastError()) != cudaSuccess)
                note(w, "fill", e);
        } else if (what < 5) {
            k_bump<<<kGrid, kBlock, 0, st>>>(sl->p, sl->words);
            if ((e = cudaGetLastError()) != cudaSuccess)
                note(w, "bump", e);
            sl->bumps++;
        } else if (what < 8) { /* check on the device */
            cudaMemsetAsync(counter, 0, sizeof *counter, st);
            k_count_bad<<<kGrid, kBlock, 0, st>>>(sl->p, sl->words, sl->seed, sl->bumps, counter);
            cudaMemcpyAsync(hcount, counter, sizeof *hcount, cudaMemcpyDeviceToHost, st);
            if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
                note(w, "device check", e);
            w->bad += (size_t)*hcount;
            w->checks++;
        } else { /* every word on the host, then free */
            cudaMemcpyAsync(h, sl->p, sl->words * 4, cudaMemcpyDeviceToHost, st);
            if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
                note(w, "host check", e);
            w->bad += host_mismatches(h, sl->words, sl->seed, sl->bumps);
            w->checks++;
            if (sl->how == 2)
                g_api.free_fn(sl->p, (ssize_t)(sl->words * 4), 0, st);
            else if (sl->how == 1)
                e = cudaFree(sl->p);
            else
                e = cudaFreeAsync(sl->p, st);
            if (e != cudaSuccess)
                note(w, "free", e);
            sl->p = NULL;
        }
    }
    for (int i = 0; i < w->slots; i++) {
        slot *sl = &slots[i];
        if (!sl->p)
            continue;
        cudaStream_t st = s[i & 1];
        cudaMemcpyAsync(h, sl->p, sl->words * 4, cudaMemcpyDeviceToHost, st);
        if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
            note(w, "final check", e);
        w->bad += host_mismatches(h, sl->words, sl->seed, sl->bumps);
        w->checks++;
        if (sl->how == 2)
            g_api.free_fn(sl->p, (ssize_t)(sl->words * 4), 0, st);
        else if (sl->how == 1)
            cudaFree(sl->p);
        else
            cudaFreeAsync(sl->p, st);
    }
    for (int i = 0; i < 2; i++) {
        cudaStreamSynchronize(s[i]);
        cudaStreamDestroy(s[i]);
    }
    cudaFree(counter);
    cudaFreeHost(hcount);
    cudaFreeHost(h);
    return NULL;
}

int main(int argc, char **argv)
{
    set_test_name("stress");
    const int threads = (int)env_ll("STRESS_THREADS", 4);
    const int nslots = (int)env_ll("STRESS_SLOTS", 12);
    int ops = (int)env_ll("STRESS_OPS", 200);
    const size_t min_mb = (size_t)env_ll("STRESS_MIN_MB", 32);
    const size_t max_mb = (size_t)env_ll("STRESS_MAX_MB", 320);
    const unsigned seed = (unsigned)env_ll("STRESS_SEED", 12345);
    const long long min_traffic_mb = env_ll("STRESS_MIN_TRAFFIC_MB", 2048);
    const long long slack_mb = env_ll("STRESS_SLACK_MB", 256);
    if (argc > 1)
        ops = atoi(argv[1]);
    if (threads < 1 || nslots < 1 || min_mb < 1 || max_mb < min_mb)
        fail("bad settings");

    CK(cudaSetDevice(0));
    /* Starts the library before the baseline is taken. */
    void *warm = NULL;
    CK(cudaMalloc(&warm, min_mb << 20));
    k_fill<<<kGrid, kBlock>>>((uint32_t *)warm, (min_mb << 20) / 4, 1);
    k_bump<<<kGrid, kBlock>>>((uint32_t *)warm, (min_mb << 20) / 4);
    CK(cudaDeviceSynchronize());
    CK(cudaFree(warm));
    CK(cudaDeviceSynchronize());
    g_api = sh_lookup();
    const int managed = sh_managed();
    if (!managed)
        g_api.malloc_fn = NULL;
    stagehand_stats_t before = sh_stats();
    long long budget_mb = managed ? (long long)(before.budget_bytes >> 20) : 0;
    const size_t base = device_used();
    used_sampler sampler;
    sampler.start();

    info("%s, %d threads x 2 streams, %d slots of %zu..%zu MB each, %d ops per thread%s",
         managed ? "preloaded" : "no library", threads, nslots, min_mb, max_mb, ops,
         managed ? "" : " (no budget)");
    std::vector<pthread_t> t(threads);
    std::vector<worker> w(threads);
    double t0 = now_s();
    for (int i = 0; i < threads; i++) {
        w[i].id = (unsigned)i;
        w[i].rng = seed + (unsigned)i;
        w[i].slots = nslots;
        w[i].ops = ops;
        w[i].min_mb = min_mb;
        w[i].max_mb = max_mb;
        if (pthread_create(&t[i], NULL, stress_main, &w[i]) != 0)
            fail("pthread_create failed");
    }
    size_t bad = 0, failures = 0, checks = 0, allocs = 0;
    const char *first_error = NULL;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        bad += w[i].bad;
        failures += w[i].failures;
        checks += w[i].checks;
        allocs += w[i].allocs;
        if (w[i].first_error[0] && !first_error)
            first_error = w[i].first_error;
    }
    CK(cudaDeviceSynchronize());
    double elapsed = now_s() - t0;
    sampler.stop();
    stagehand_stats_t after = sh_stats();
    const size_t peak = sampler.peak_used() > base ? sampler.peak_used() - base : 0;
    const unsigned long long moved_mb =
        ((after.d2h_bytes - before.d2h_bytes) + (after.h2d_bytes - before.h2d_bytes)) >> 20;
    printf("RESULT stress mode=%s threads=%d ops=%d allocs=%zu checks=%zu seconds=%.2f "
           "evictions=%llu restores=%llu moved_mb=%llu peak_used_mb=%zu peak_sh_device_mb=%zu "
           "budget_mb=%lld bad_words=%zu failures=%zu\n",
           managed ? "preloaded" : "plain", threads, ops, allocs, checks, elapsed,
           (unsigned long long)(after.evictions - before.evictions),
           (unsigned long long)(after.restores - before.restores), moved_mb, peak >> 20,
           sampler.peak_sh_device() >> 20, budget_mb, bad, failures);
    if (managed)
        print_sh_stats("after", after);
    if (failures)
        fail("%zu CUDA calls failed; first: %s", failures, first_error ? first_error : "?");
    if (bad)
        fail("%zu words differ from what the kernels wrote", bad);
    if (!managed) {
        pass("no library: %zu allocations, %zu checks, every word exact", allocs, checks);
        return 0;
    }
    if ((long long)moved_mb < min_traffic_mb)
        fail("only %llu MB moved between device and host (wanted at least %lld MB): the live set "
             "did not oversubscribe the %lld MB budget enough",
             moved_mb, min_traffic_mb, budget_mb);
    if ((long long)(sampler.peak_sh_device() >> 20) > budget_mb)
        fail("the library held %zu MB on the device, above the %lld MB budget",
             sampler.peak_sh_device() >> 20, budget_mb);
    if ((long long)(peak >> 20) > budget_mb + slack_mb)
        fail("device use rose %zu MB above the baseline: over the %lld MB budget + %lld MB slack",
             peak >> 20, budget_mb, slack_mb);
    pass("%d threads x 2 streams, %zu allocations, %zu checks, every word exact; %llu MB moved "
         "(%llu evictions, %llu restores) in %.1f s; device use peaked %zu MB above the baseline "
         "(budget %lld MB)",
         threads, allocs, checks, moved_mb,
         (unsigned long long)(after.evictions - before.evictions),
         (unsigned long long)(after.restores - before.restores), elapsed, peak >> 20, budget_mb);
    return 0;
}
