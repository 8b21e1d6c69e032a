/* oversub.cu — three times the budget, every byte exact.
 *
 * Allocates TOTAL_MB of regions (default: three times the budget the
 * library was given in STAGEHAND_BUDGET_VRAM_BUDGET_MB, else 12 GB) through
 * cudaMalloc and cudaMallocAsync alternately, fills each with a kernel,
 * bumps every region PASSES times with more kernels, and reads every word
 * back. Under LD_PRELOAD=libstagehand.so it also checks that the library
 * evicted and restored, and that the device memory in use (the driver's
 * cuMemGetInfo, sampled on a helper thread) never rose more than the budget
 * (plus OVERSUB_SLACK_MB for what the CUDA context itself allocates) above
 * what was in use before the first region.
 *
 * Without the library the same program runs on the card's own memory, as
 * the reference: tests/gpu/run.sh compares the digest both runs print.
 *
 * Usage: oversub [TOTAL_MB [REGION_MB [PASSES]]]
 *   env OVERSUB_TOTAL_MB, OVERSUB_REGION_MB (256), OVERSUB_PASSES (2),
 *       OVERSUB_SLACK_MB (256)
 */
#include "common.cuh"

#include <vector>

int main(int argc, char **argv)
{
    set_test_name("oversub");
    long long budget_mb = budget_mb_from_env();
    long long total_mb = env_ll("OVERSUB_TOTAL_MB", budget_mb ? 3 * budget_mb : 12288);
    long long region_mb = env_ll("OVERSUB_REGION_MB", 256);
    long long passes = env_ll("OVERSUB_PASSES", 2);
    long long slack_mb = env_ll("OVERSUB_SLACK_MB", 256);
    if (argc > 1)
        total_mb = atoll(argv[1]);
    if (argc > 2)
        region_mb = atoll(argv[2]);
    if (argc > 3)
        passes = atoll(argv[3]);
    if (region_mb <= 0 || total_mb < region_mb)
        fail("bad sizes: total %lld MB, region %lld MB", total_mb, region_mb);

    CK(cudaSetDevice(0));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    /* Warm-up: starts the library (pool, copy streams, tracking) and loads
     * the kernels, so the baseline below holds the context's own memory. */
    const size_t region = (size_t)region_mb << 20, words = region / 4;
    void *warm = NULL;
    CK(cudaMalloc(&warm, region));
    k_fill<<<kGrid, kBlock, 0, stream>>>((uint32_t *)warm, words, 1);
    k_bump<<<kGrid, kBlock, 0, stream>>>((uint32_t *)warm, words);
    CK(cudaStreamSynchronize(stream));
    CK(cudaFree(warm));
    CK(cudaDeviceSynchronize());

    const int managed = sh_managed();
    stagehand_stats_t st0 = sh_stats();
    if (managed && !budget_mb)
        budget_mb = (long long)(st0.budget_bytes >> 20);
    const size_t base = device_used();
    used_sampler sampler;
    sampler.start();

    const int n = (int)(total_mb / region_mb);
    info("%s, %d regions of %lld MB (%lld MB) against a %lld MB budget, %lld passes",
         managed ? "preloaded" : "no library", n, region_mb, (long long)n * region_mb, budget_mb,
         passes);
    std::vector<uint32_t *> r(n, nullptr);
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        cudaError_t e = (i & 1) ? cudaMallocAsync((void **)&r[i], region, stream)
                                : cudaMalloc((void **)&r[i], region);
        if (e != cudaSuccess)
            fail("allocation %d of %d (%lld MB) failed: %s", i, n, region_mb,
                 cudaGetErrorString(e));
        k_fill<<<kGrid, kBlock, 0, stream>>>(r[i], words, (uint32_t)i + 1);
        CK(cudaGetLastError());
    }
    CK(cudaStreamSynchronize(stream));
    double t_fill = now_s() - t0;
    stagehand_stats_t st1 = sh_stats();

    t0 = now_s();
    for (long long p = 0; p < passes; p++)
        for (int i = 0; i < n; i++) {
            k_bump<<<kGrid, kBlock, 0, stream>>>(r[i], words);
            CK(cudaGetLastError());
        }
    CK(cudaStreamSynchronize(stream));
    double t_bump = now_s() - t0;
    stagehand_stats_t st2 = sh_stats();

    /* Every word, through a copy to pinned host memory. */
    uint32_t *h = NULL;
    CK(cudaMallocHost((void **)&h, region));
    uint64_t digest = 0xcbf29ce484222325ull;
    size_t bad = 0;
    t0 = now_s();
    for (int i = 0; i < n; i++) {
        CK(cudaMemcpyAsync(h, r[i], region, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        size_t b = host_mismatches(h, words, (uint32_t)i + 1, (uint32_t)passes);
        if (b && !bad)
            info("region %d: %zu of %zu words differ (first of any)", i, b, words);
        bad += b;
        digest = fnv1a(digest, h, words);
    }
    double t_check = now_s() - t0;
    sampler.stop();
    stagehand_stats_t st3 = sh_stats();
    for (int i = 0; i < n; i++)
        CK((i & 1) ? cudaFreeAsync(r[i], stream) : cudaFree(r[i]));
    CK(cudaStreamSynchronize(stream));
    CK(cudaFreeHost(h));

    const size_t peak = sampler.peak_used() > base ? sampler.peak_used() - base : 0;
    const double moved_mb =
        (double)((st2.d2h_bytes - st1.d2h_bytes) + (st2.h2d_bytes - st1.h2d_bytes)) / (1 << 20);
    printf("RESULT oversub mode=%s regions=%d region_mb=%lld total_mb=%lld budget_mb=%lld "
           "passes=%lld fill_s=%.3f bump_s=%.3f check_s=%.3f peak_used_mb=%zu "
           "peak_sh_device_mb=%zu bump_moved_mb=%.0f bump_moved_gbps=%.2f digest=%016llx "
           "bad_words=%zu\n",
           managed ? "preloaded" : "plain", n, region_mb, (long long)n * region_mb, budget_mb,
           passes, t_fill, t_bump, t_check, peak >> 20, sampler.peak_sh_device() >> 20, moved_mb,
           t_bump > 0 ? moved_mb / 1024.0 / t_bump : 0.0, (unsigned long long)digest, bad);
    if (managed)
        print_sh_stats("after", st3);

    if (bad)
        fail("%zu words differ from what the kernels wrote", bad);
    if (!managed) {
        pass("no library: %d regions, %lld MB, every word exact (digest %016llx)", n,
             (long long)n * region_mb, (unsigned long long)digest);
        return 0;
    }
    if (st3.evictions == 0 || st3.restores == 0)
        fail("no eviction or no restore at %lld MB against a %lld MB budget (evictions %llu, "
             "restores %llu)",
             (long long)n * region_mb, budget_mb, (unsigned long long)st3.evictions,
             (unsigned long long)st3.restores);
    if (st3.checksum_mismatches)
        fail("%llu chunk checksums differed", (unsigned long long)st3.checksum_mismatches);
    if ((long long)(sampler.peak_sh_device() >> 20) > budget_mb)
        fail("the library held %zu MB on the device, above the %lld MB budget",
             sampler.peak_sh_device() >> 20, budget_mb);
    if ((long long)(peak >> 20) > budget_mb + slack_mb)
        fail("device use rose %zu MB above the baseline: over the %lld MB budget + %lld MB slack",
             peak >> 20, budget_mb, slack_mb);
    pass("%d regions, %lld MB = %.1fx the %lld MB budget, every word exact (digest %016llx); "
         "device use peaked %zu MB above the baseline; %llu evictions, %llu restores",
         n, (long long)n * region_mb, (double)(n * region_mb) / (double)budget_mb, budget_mb,
         (unsigned long long)digest, peak >> 20, (unsigned long long)st3.evictions,
         (unsigned long long)st3.restores);
    return 0;
}
