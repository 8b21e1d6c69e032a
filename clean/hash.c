/* hash.c — the fingerprint on the CPU (clean.h has the definition), the
 * key, and the kernel's host stand-in for the simulated GPU.
 *
 * No shared state.
 */
#include "clean/clean.h"

#include "sh_err.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the fingerprint reads words little-endian, as the GPU does"
#endif

_Static_assert(offsetof(struct sh_clean_key, sip) == SH_CLEAN_NH_WORDS * 4,
               "the kernel finds the SipHash key right after the NH key");
_Static_assert(SH_CLEAN_NH_WORDS * 4 % 8 == 0, "the SipHash key is 8-byte aligned");

/* ---- SipHash-2-4 (Aumasson and Bernstein), 64- or 128-bit tag ---- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void sipround(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = ROTL(v[1], 13);
    v[1] ^= v[0];
    v[0] = ROTL(v[0], 32);
    v[2] += v[3];
    v[3] = ROTL(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = ROTL(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = ROTL(v[1], 17);
    v[1] ^= v[2];
    v[2] = ROTL(v[2], 32);
}

static void absorb(uint64_t v[4], uint64_t m)
{
    v[3] ^= m;
    sipround(v);
    sipround(v);
    v[0] ^= m;
}

static uint64_t squeeze(uint64_t v[4], uint64_t mark)
{
    v[2] ^= mark;
    for (int i = 0; i < 4; i++)
        sipround(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* Runs the compression over msg; wide: the 128-bit variant. */
static void sip(const uint64_t key[2], const unsigned char *msg, size_t len, int wide,
                uint64_t v[4])
{
    v[0] = key[0] ^ 0x736f6d6570736575ull;
    v[1] = key[1] ^ 0x646f72616e646f6dull ^ (wide ? 0xee : 0);
    v[2] = key[0] ^ 0x6c7967656e657261ull;
    v[3] = key[1] ^ 0x7465646279746573ull;
    size_t full = len & ~(size_t)7;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m;
        memcpy(&m, msg + i, 8);
        absorb(v, m);
    }
    uint64_t last = (uint64_t)len << 56;
    for (size_t i = full; i < len; i++)
        last |= (uint64_t)msg[i] << (8 * (i - full));
    absorb(v, last);
}

void sh_clean_siphash128(const uint64_t key[2], const void *msg, size_t len, uint64_t out[2])
{
    uint64_t v[4];
    sip(key, msg, len, 1, v);
    out[0] = squeeze(v, 0xee);
    v[1] ^= 0xdd;
    out[1] = squeeze(v, 0);
}

uint64_t sh_clean_siphash64(const uint64_t key[2], const void *msg, size_t len)
{
    uint64_t v[4];
    sip(key, msg, len, 0, v);
    return squeeze(v, 0xff);
}

/* ---- the blocks ---- */

/* Four NH sums of one block's 32-bit words m. Each round its own pass, so
 * that the compiler vectorises it. */
static void nh(const uint32_t *m, const uint32_t *key, uint64_t s[SH_CLEAN_NH_ROUND])
{
    for (int t = 0; t < SH_CLEAN_NH_ROUND; t++) {
        const uint32_t *k = key + 4 * t;
        uint64_t a = 0;
        for (int i = 0; i < SH_CLEAN_BLOCK / 4; i += 2)
            a += (uint64_t)(uint32_t)(m[i] + k[i]) * (uint32_t)(m[i + 1] + k[i + 1]);
        s[t] = a;
    }
}

/* D(b): the block's position and its NH sums, through the PRF. */
static void digest(const struct sh_clean_key *k, uint64_t b, const uint64_t s[4], uint64_t d[2])
{
    const uint64_t msg[5] = {b, s[0], s[1], s[2], s[3]};
    sh_clean_siphash128(k->sip, msg, sizeof msg, d);
}

void sh_clean_blocks(const struct sh_clean_key *k, const void *data, uint64_t n, uint64_t x[2])
{
    const unsigned char *p = data;
    uint32_t m[SH_CLEAN_BLOCK / 4];
    for (uint64_t b = 0, off = 0; off < n; b++, off += SH_CLEAN_BLOCK) {
        uint64_t len = n - off < SH_CLEAN_BLOCK ? n - off : SH_CLEAN_BLOCK;
        if (len < SH_CLEAN_BLOCK)
            memset(m, 0, sizeof m); /* the tail is zero-padded */
        memcpy(m, p + off, (size_t)len);
        uint64_t s[SH_CLEAN_NH_ROUND], d[2];
        nh(m, k->nh, s);
        digest(k, b, s, d);
        x[0] ^= d[0];
        x[1] ^= d[1];
    }
}

struct sh_clean_fp sh_clean_finish(const struct sh_clean_key *k, uint64_t n, const uint64_t x[2])
{
    const uint64_t msg[3] = {n, x[0], x[1]};
    uint64_t out[2];
    sh_clean_siphash128(k->fin, msg, sizeof msg, out);
    return (struct sh_clean_fp){out[0], out[1]};
}

struct sh_clean_fp sh_clean_hash(const struct sh_clean_key *k, const void *data, uint64_t n)
{
    uint64_t x[2] = {0, 0};
    sh_clean_blocks(k, data, n, x);
    return sh_clean_finish(k, n, x);
}

int sh_clean_key_random(struct sh_clean_key *k)
{
    unsigned char *p = (unsigned char *)k;
    size_t got = 0;
    while (got < sizeof *k) {
        ssize_t r = getrandom(p + got, sizeof *k - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return SH_EDRIVER;
        got += (size_t)r;
    }
    return 0;
}

void sh_clean_kernel_host(void **args)
{
    const void *src = *(const void *const *)args[0];
    uint64_t n = *(const uint64_t *)args[1];
    const struct sh_clean_key *key = *(const struct sh_clean_key *const *)args[2];
    uint64_t *out = *(uint64_t *const *)args[3];
    sh_clean_blocks(key, src, n, out);
}

int sh_clean_ptr_candidate(const uint32_t *words, uint64_t n, uint32_t top, uint32_t span)
{
    uint32_t hit = 0;
    for (uint64_t i = 1; i < n; i++)
        hit |= words[i] - top <= span;
    return hit != 0;
}

void sh_clean_ptrs_host(void **args)
{
    const uint32_t *words = *(const uint32_t *const *)args[0];
    uint64_t n = *(const uint64_t *)args[1];
    uint32_t top = *(const uint32_t *)args[2], span = *(const uint32_t *)args[3];
    uint32_t *found = *(uint32_t *const *)args[4];
    if (sh_clean_ptr_candidate(words, n, top, span))
        *found = 1;
}
