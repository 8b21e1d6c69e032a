/* past_budget.cu — one launch that names more regions than the budget
 * holds.
 *
 * A kernel receives sixteen region pointers by value (one struct) and
 * bumps every word of every region: 1.5x the budget in one launch. The
 * library cannot bring them all back, so it restores as many as fit and
 * the kernel reaches the rest in host memory, at their unchanged device
 * addresses (README, "Eviction and restore"). The launch is counted in
 * host_launches; every word is then checked on the device.
 *
 * Usage: past_budget [TOTAL_MB]
 *   env PAST_TOTAL_MB (1.5x the budget, else 6144)
 */
#include "common.cuh"

#define REGIONS 16

struct many {
    uint32_t *p[REGIONS];
};

/* bump_all(m, n): every region m names, p[i] += 1 */
__global__ void k_bump_all(many m, size_t n)
{
    for (int r = 0; r < REGIONS; r++)
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            m.p[r][i] += 1;
}

int main(int argc, char **argv)
{
    set_test_name("past_budget");
    long long budget_mb = budget_mb_from_env();
    long long total_mb = env_ll("PAST_TOTAL_MB", budget_mb ? budget_mb * 3 / 2 : 6144);
    if (argc > 1)
        total_mb = atoll(argv[1]);
    long long region_mb = total_mb / REGIONS / 2 * 2; /* whole 2 MB granules */
    if (region_mb <= 0)
        fail("bad size: total %lld MB", total_mb);
    const size_t region = (size_t)region_mb << 20, words = region / 4;

    CK(cudaSetDevice(0));
    many m;
    for (int i = 0; i < REGIONS; i++) {
        CK(cudaMalloc((void **)&m.p[i], region));
        k_fill<<<kGrid, kBlock>>>(m.p[i], words, (uint32_t)(300 + i));
        CK(cudaGetLastError());
    }
    CK(cudaDeviceSynchronize());

    const int managed = sh_managed();
    stagehand_stats_t before = sh_stats();
    if (managed)
        print_sh_stats("before", before);
    double t0 = now_s();
    k_bump_all<<<kGrid, kBlock>>>(m, words);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize()); /* a fault here would be sticky and fatal */
    double t_kernel = now_s() - t0;
    stagehand_stats_t after = sh_stats();

    unsigned long long *bad_d = NULL, bad = 0;
    CK(cudaMalloc((void **)&bad_d, sizeof *bad_d));
    CK(cudaMemset(bad_d, 0, sizeof *bad_d));
    for (int i = 0; i < REGIONS; i++) {
        k_count_bad<<<kGrid, kBlock>>>(m.p[i], words, (uint32_t)(300 + i), 1, bad_d);
        CK(cudaGetLastError());
    }
    CK(cudaMemcpy(&bad, bad_d, sizeof bad, cudaMemcpyDeviceToHost));
    CK(cudaFree(bad_d));
    for (int i = 0; i < REGIONS; i++)
        CK(cudaFree(m.p[i]));

    unsigned long long host_launches = after.host_launches - before.host_launches;
    unsigned long long restored = after.restores - before.restores;
    printf("RESULT past_budget mode=%s regions=%d total_mb=%lld host_mb_at_launch=%llu "
           "kernel_s=%.3f restores_during_launch=%llu host_launches=%llu bad_words=%llu\n",
           managed ? "preloaded" : "plain", REGIONS, (long long)REGIONS * region_mb,
           (unsigned long long)(before.host_bytes >> 20), t_kernel, restored, host_launches, bad);
    if (bad)
        fail("%llu words differ after the launch", bad);
    if (!managed) {
        pass("no library: one launch over %d regions, every word exact", REGIONS);
        return 0;
    }
    if (before.host_bytes == 0)
        fail("no region was in host memory at the launch (%lld MB against a %llu MB budget): "
             "the case was not exercised",
             (long long)REGIONS * region_mb, (unsigned long long)(before.budget_bytes >> 20));
    if (host_launches != 1)
        fail("host_launches counted %llu for the one launch past the budget", host_launches);
    pass("one launch over %d regions (%lld MB, %llu MB of them on the host): %llu came back, the "
         "rest reached in host memory; every word exact",
         REGIONS, (long long)REGIONS * region_mb, (unsigned long long)(before.host_bytes >> 20),
         restored);
    return 0;
}
