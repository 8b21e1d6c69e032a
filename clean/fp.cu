// fp.cu — the library's kernels: the fingerprint and the pointer prefilter
// (clean.h defines both). Their PTX is clean/ptx.c, made by mk/gen_ptx.sh;
// the library loads that PTX, so nothing here is compiled at build or run time.
//
// One thread block per 4 KiB block at a time (grid-stride): 256 threads
// each take two 8-byte words, the four NH sums are added across the block,
// and thread 0 turns them into the block's digest, XORed into its running
// total; each thread block XORs its total into out at the end.
#include <stdint.h>

#define BLOCK   4096
#define PAIRS   (BLOCK / 8)
#define ROUNDS  4
#define THREADS 256
#define WARPS   (THREADS / 32)
#define NH_KEY  (BLOCK / 4 + 4 * (ROUNDS - 1))

__device__ static uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

__device__ static void sipround(uint64_t &v0, uint64_t &v1, uint64_t &v2, uint64_t &v3)
{
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
}

// SipHash-2-4-128 of the 40 bytes m[0..5), little-endian words.
__device__ static void sip128_40(const uint64_t k[2], const uint64_t m[5], uint64_t out[2])
{
    uint64_t v0 = k[0] ^ 0x736f6d6570736575ull, v1 = k[1] ^ 0x646f72616e646f6dull ^ 0xee;
    uint64_t v2 = k[0] ^ 0x6c7967656e657261ull, v3 = k[1] ^ 0x7465646279746573ull;
#pragma unroll 1
    for (int i = 0; i < 6; i++) {
        uint64_t w = i < 5 ? m[i] : 40ull << 56;
        v3 ^= w;
        sipround(v0, v1, v2, v3);
        sipround(v0, v1, v2, v3);
        v0 ^= w;
    }
    v2 ^= 0xee;
#pragma unroll 1
    for (int i = 0; i < 4; i++)
        sipround(v0, v1, v2, v3);
    out[0] = v0 ^ v1 ^ v2 ^ v3;
    v1 ^= 0xdd;
#pragma unroll 1
    for (int i = 0; i < 4; i++)
        sipround(v0, v1, v2, v3);
    out[1] = v0 ^ v1 ^ v2 ^ v3;
}

// The 8 bytes at off, zero past n.
__device__ static uint64_t word(const unsigned char *src, uint64_t off, uint64_t n)
{
    if (off + 8 <= n)
        return *(const uint64_t *)(src + off);
    uint64_t w = 0;
#pragma unroll 1
    for (uint64_t i = off; i < n; i++)
        w |= (uint64_t)src[i] << (8 * (i - off));
    return w;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    stagehand_fp_v1(const unsigned char *src, uint64_t n, const uint32_t *key, uint64_t *out)
{
    __shared__ uint32_t k[NH_KEY];
    __shared__ uint64_t part[WARPS][ROUNDS];
#pragma unroll 1
    for (int i = threadIdx.x; i < NH_KEY; i += THREADS)
        k[i] = key[i];
    const uint64_t *sipkey = (const uint64_t *)(key + NH_KEY);
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    uint64_t acc0 = 0, acc1 = 0;
    const uint64_t nblocks = (n + BLOCK - 1) / BLOCK;
    for (uint64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
        uint64_t s[ROUNDS] = {0, 0, 0, 0};
        for (int p = threadIdx.x; p < PAIRS; p += THREADS) {
            uint64_t w = word(src, b * BLOCK + (uint64_t)p * 8, n);
            uint32_t m0 = (uint32_t)w, m1 = (uint32_t)(w >> 32);
            for (int t = 0; t < ROUNDS; t++)
                s[t] += (uint64_t)(uint32_t)(m0 + k[2 * p + 4 * t]) *
                        (uint64_t)(uint32_t)(m1 + k[2 * p + 1 + 4 * t]);
        }
        for (int t = 0; t < ROUNDS; t++) {
            for (int o = 16; o > 0; o /= 2)
                s[t] += __shfl_xor_sync(0xffffffffu, s[t], o);
            if (lane == 0)
                part[warp][t] = s[t];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint64_t m[5] = {b, 0, 0, 0, 0}, d[2];
#pragma unroll 1
            for (int w = 0; w < WARPS; w++)
                for (int t = 0; t < ROUNDS; t++)
                    m[1 + t] += part[w][t];
            sip128_40(sipkey, m, d);
            acc0 ^= d[0];
            acc1 ^= d[1];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && (acc0 | acc1)) {
        atomicXor((unsigned long long *)&out[0], (unsigned long long)acc0);
        atomicXor((unsigned long long *)&out[1], (unsigned long long)acc1);
    }
}

// stagehand_ptrs_v1 (clean.h): whether any of words[1..n) could be the high
// half of a pointer into the pool, (w - top) <= span unsigned: the device's
// pass over an evicted region's bytes before the CPU reads any of them.
extern "C" __global__ void __launch_bounds__(THREADS)
    stagehand_ptrs_v1(const uint32_t *words, uint64_t n, uint32_t top, uint32_t span,
                      uint32_t *found)
{
    uint32_t hit = 0;
    const uint64_t stride = (uint64_t)gridDim.x * THREADS;
    for (uint64_t i = 1 + (uint64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride)
        hit |= words[i] - top <= span;
    if (__syncthreads_or(hit) && threadIdx.x == 0)
        atomicOr(found, 1u);
}
