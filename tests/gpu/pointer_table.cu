/* pointer_table.cu — regions the launch scan cannot see.
 *
 * A kernel receives only a table of pointers (itself in device memory) and
 * bumps every region the table lists. The library sees the table in the
 * launch's parameters, never the regions behind it, so the regions that
 * are evicted at that moment stay in host memory and the kernel reaches
 * them there, over PCIe, at their unchanged device addresses (DESIGN.md
 * §2: a launch we failed to see costs speed, never a crash). Every word is
 * then checked.
 *
 * Usage: pointer_table [TOTAL_MB [REGION_MB]]
 *   env PTABLE_TOTAL_MB (1.5x the budget, else 6144), PTABLE_REGION_MB (256)
 */
#include "common.cuh"

#include <vector>

/* table_bump(table, count, n): every region the table lists, p[i] += 1 */
__global__ void k_table_bump(uint32_t *const *table, int count, size_t n)
{
    for (int r = 0; r < count; r++) {
        uint32_t *p = table[r];
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            p[i] += 1;
    }
}

int main(int argc, char **argv)
{
    set_test_name("pointer_table");
    long long budget_mb = budget_mb_from_env();
    long long total_mb = env_ll("PTABLE_TOTAL_MB", budget_mb ? budget_mb * 3 / 2 : 6144);
    long long region_mb = env_ll("PTABLE_REGION_MB", 256);
    if (argc > 1)
        total_mb = atoll(argv[1]);
    if (argc > 2)
        region_mb = atoll(argv[2]);
    if (region_mb <= 0 || total_mb < region_mb)
        fail("bad sizes: total %lld MB, region %lld MB", total_mb, region_mb);
    const int n = (int)(total_mb / region_mb);
    const size_t region = (size_t)region_mb << 20, words = region / 4;

    CK(cudaSetDevice(0));
    std::vector<uint32_t *> r(n, nullptr);
    for (int i = 0; i < n; i++) {
        CK(cudaMalloc((void **)&r[i], region));
        k_fill<<<kGrid, kBlock>>>(r[i], words, (uint32_t)(100 + i));
        CK(cudaGetLastError());
    }
    uint32_t **table = NULL;
    CK(cudaMalloc((void **)&table, 2u << 20));
    CK(cudaMemcpy(table, r.data(), n * sizeof(uint32_t *), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());

    const int managed = sh_managed();
    stagehand_stats_t before = sh_stats();
    if (managed)
        print_sh_stats("before", before);
    double t0 = now_s();
    k_table_bump<<<kGrid, kBlock>>>(table, n, words);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize()); /* a fault here would be sticky and fatal */
    double t_kernel = now_s() - t0;
    stagehand_stats_t after = sh_stats();

    uint32_t *h = NULL;
    CK(cudaMallocHost((void **)&h, region));
    size_t bad = 0;
    for (int i = 0; i < n; i++) {
        CK(cudaMemcpy(h, r[i], region, cudaMemcpyDeviceToHost));
        bad += host_mismatches(h, words, (uint32_t)(100 + i), 1);
    }
    CK(cudaFreeHost(h));
    for (int i = 0; i < n; i++)
        CK(cudaFree(r[i]));
    CK(cudaFree(table));

    printf("RESULT pointer_table mode=%s regions=%d total_mb=%lld host_mb_at_launch=%llu "
           "kernel_s=%.3f restores_during_launch=%llu bad_words=%zu\n",
           managed ? "preloaded" : "plain", n, (long long)n * region_mb,
           (unsigned long long)(before.host_bytes >> 20), t_kernel,
           (unsigned long long)(after.restores - before.restores), bad);
    if (bad)
        fail("%zu words differ after the table kernel", bad);
    if (!managed) {
        pass("no library: %d regions behind a table, every word exact", n);
        return 0;
    }
    if (before.host_bytes == 0)
        fail("no region was in host memory when the table kernel ran (%lld MB against a %llu MB "
             "budget): the case was not exercised",
             (long long)n * region_mb, (unsigned long long)(before.budget_bytes >> 20));
    pass("%d regions behind a table, %llu MB of them in host memory at the launch, reached at "
         "their device addresses; every word exact",
         n, (unsigned long long)(before.host_bytes >> 20));
    return 0;
}
