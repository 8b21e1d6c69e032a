/* clean.h — clean regions: telling whether a region's device bytes still
 * equal the host copy kept since its last restore, and what each region has
 * taught about keeping one.
 *
 * The fingerprint is a keyed 128-bit hash whose key is drawn at random in
 * each process, so a program cannot arrange two different contents with
 * one fingerprint. The bytes are cut into blocks of SH_CLEAN_BLOCK, hashed
 * in parallel and combined so that each block's position counts:
 *
 *   NH(b)   four 64-bit NH sums (UMAC's, with Toeplitz-shifted keys) of
 *           block b's 32-bit little-endian words, zero-padded
 *   D(b)    SipHash-2-4-128 under key.sip of the 40 bytes
 *           LE64(b) LE64(NH0) LE64(NH1) LE64(NH2) LE64(NH3)
 *   X       the XOR of D(b) over every block (what the kernel computes)
 *   FP      SipHash-2-4-128 under key.fin of LE64(n) LE64(X.lo) LE64(X.hi)
 *
 * The device computes X with the library's kernel (clean/fp.cu, shipped as
 * PTX: sh_clean_ptx) and the host finishes it; sh_clean_blocks is the same
 * function on the CPU, bit for bit (the simulated GPU runs it as that
 * kernel; tests/gpu checks the PTX against it on a real card).
 *
 * No shared state: the key is the caller's, learning state lives in each
 * region.
 */
#ifndef SH_CLEAN_H
#define SH_CLEAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* tests/gpu's fingerprint.cu checks the kernel against this */
#endif

#define SH_CLEAN_BLOCK    4096 /* bytes per block */
#define SH_CLEAN_NH_ROUND 4    /* NH sums per block */
#define SH_CLEAN_NH_WORDS (SH_CLEAN_BLOCK / 4 + 4 * (SH_CLEAN_NH_ROUND - 1))
/* The device memory the library's fingerprint and prefilter kernels use
 * (their key and result slots), from the first eviction on: counted
 * against the budget, and by stagehand-sim's model of it. */
#define SH_CLEAN_DEVICE_BYTES ((size_t)64 << 10)

/* The kernel reads this struct from device memory as it is laid out here. */
struct sh_clean_key {
    uint32_t nh[SH_CLEAN_NH_WORDS];
    uint64_t sip[2]; /* the per-block digests */
    uint64_t fin[2]; /* the final digest */
};

struct sh_clean_fp {
    uint64_t lo, hi;
};

/* A key from the kernel's random source; 0, or SH_EDRIVER when none could
 * be had (nothing is fingerprinted then). */
int sh_clean_key_random(struct sh_clean_key *k);

/* x[0..1] ^= X of the n bytes at data (the kernel's part). */
void sh_clean_blocks(const struct sh_clean_key *k, const void *data, uint64_t n, uint64_t x[2]);
/* FP of n bytes whose X is x. */
struct sh_clean_fp sh_clean_finish(const struct sh_clean_key *k, uint64_t n, const uint64_t x[2]);
/* Both: the fingerprint of the n bytes at data, on the CPU. */
struct sh_clean_fp sh_clean_hash(const struct sh_clean_key *k, const void *data, uint64_t n);
static inline int sh_clean_fp_equal(struct sh_clean_fp a, struct sh_clean_fp b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* SipHash-2-4 with a 128-bit tag (out[0] holds bytes 0-7 of the tag, read
 * little-endian) and with a 64-bit one, on any message. */
void sh_clean_siphash128(const uint64_t key[2], const void *msg, size_t len, uint64_t out[2]);
uint64_t sh_clean_siphash64(const uint64_t key[2], const void *msg, size_t len);

/* ---- the kernel -------------------------------------------------------
 * stagehand_fp_v1(const void *src, uint64_t n, const struct sh_clean_key
 * *key, uint64_t out[2]): XORs X of the n bytes at src into out, which the
 * caller zeroes first. src is 8-byte aligned. Blocks of SH_CLEAN_THREADS
 * threads; any grid (SH_CLEAN_GRID_MAX is what the library launches at
 * most). The name carries the version: a kernel that computes anything else
 * gets another name. */
#define SH_CLEAN_KERNEL   "stagehand_fp_v1"
#define SH_CLEAN_THREADS  256
#define SH_CLEAN_GRID_MAX 1024
extern const char sh_clean_ptx[]; /* NUL-terminated, for cuModuleLoadData */
/* The kernel on the host, for the simulated GPU: args as cuLaunchKernel
 * gets them. */
void sh_clean_kernel_host(void **args);

/* stagehand_ptrs_v1(const uint32_t *words, uint64_t n, uint32_t top,
 * uint32_t span, uint32_t *found), in the same PTX: sets *found to 1 (the
 * caller zeroes it) when a word among words[1..n) could be the high half
 * of a pointer into the pool, (w - top) <= span unsigned. A pointer at any
 * 4-byte-aligned offset has its high half there, so a range it finds
 * nothing in holds no pointer into the pool; what it finds the CPU checks
 * exactly. words is 4-byte aligned; blocks of SH_CLEAN_THREADS threads, any
 * grid. */
#define SH_PTRS_KERNEL "stagehand_ptrs_v1"
/* The same on the host: 1 when found, else 0. */
int sh_clean_ptr_candidate(const uint32_t *words, uint64_t n, uint32_t top, uint32_t span);
void sh_clean_ptrs_host(void **args);

/* ---- learning which regions stay clean -----------------------------------
 * A region found dirty SH_CLEAN_DIRTY_RUN evictions in a row stops keeping
 * host copies (and so stops paying for fingerprints) for a while: 8
 * restores, then twice as long each time it is found dirty again, up to
 * 128; a clean eviction forgets all that. */
#define SH_CLEAN_DIRTY_RUN 3

struct sh_clean_learn {
    uint8_t dirty_run; /* dirty evictions in a row */
    uint8_t skip;      /* restores left that keep no copy */
    uint8_t backoff;   /* the last skip given, 0 for none */
};

/* At a restore: 1 when a host copy should be kept this time. */
int sh_clean_learn_keep(struct sh_clean_learn *l);
/* At an eviction that compared a kept copy: clean or dirty. */
void sh_clean_learn_note(struct sh_clean_learn *l, int clean);

#ifdef __cplusplus
}
#endif
#endif
