/* test_clean.c — the clean-region fingerprint and what regions teach about
 * keeping host copies: SipHash against its published known answers, the
 * fingerprint against a byte-at-a-time reference written from clean.h's
 * definition, its dependence on every byte, on the blocks' order, on the
 * length and on the key, the kernel's host stand-in, and the learning rule. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "clean/clean.h"

#include <stdlib.h>
#include <string.h>

/* The SipHash paper's key: bytes 00 01 ... 0f. */
static const uint64_t ref_key[2] = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};

static void counting(unsigned char *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        m[i] = (unsigned char)i;
}

static void test_siphash_known_answers(void **state)
{
    (void)state;
    unsigned char m[64];
    counting(m, sizeof m);
    /* The reference implementation's vectors: message 00 01 .. (len-1). */
    assert_true(sh_clean_siphash64(ref_key, m, 0) == 0x726fdb47dd0e0e31ull);
    assert_true(sh_clean_siphash64(ref_key, m, 15) == 0xa129ca6149be45e5ull);
    static const struct {
        size_t len;
        unsigned char tag[16];
    } v[] = {
        {0,
         {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02,
          0x93}},
        {15,
         {0x54, 0x93, 0xe9, 0x99, 0x33, 0xb0, 0xa8, 0x11, 0x7e, 0x08, 0xec, 0x0f, 0x97, 0xcf, 0xc3,
          0xd9}},
        {24,
         {0x2d, 0xb4, 0x79, 0xae, 0x78, 0xbd, 0x50, 0xd8, 0x88, 0x2a, 0x8a, 0x17, 0x8a, 0x61, 0x32,
          0xad}},
        {40,
         {0xdf, 0x6a, 0x30, 0x1e, 0x95, 0xc9, 0x5d, 0xad, 0x97, 0xae, 0x0c, 0xc8, 0xc6, 0x91, 0x3b,
          0xd8}},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint64_t out[2];
        sh_clean_siphash128(ref_key, m, v[i].len, out);
        assert_memory_equal(out, v[i].tag, 16);
    }
}

/* ---- a reference written from the definition, a byte at a time ---- */

static uint32_t le32_at(const unsigned char *p, uint64_t n, uint64_t off)
{
    uint32_t w = 0;
    for (int i = 0; i < 4; i++)
        if (off + (uint64_t)i < n)
            w |= (uint32_t)p[off + (uint64_t)i] << (8 * i);
    return w;
}

static void put_le64(unsigned char *out, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (8 * i));
}

static struct sh_clean_fp ref_hash(const struct sh_clean_key *k, const unsigned char *p, uint64_t n)
{
    uint64_t x[2] = {0, 0};
    for (uint64_t b = 0; b * SH_CLEAN_BLOCK < n; b++) {
        unsigned char msg[40];
        put_le64(msg, b);
        for (int t = 0; t < 4; t++) {
            uint64_t s = 0;
            for (int i = 0; i < SH_CLEAN_BLOCK / 4; i += 2) {
                uint64_t off = b * SH_CLEAN_BLOCK + 4 * (uint64_t)i;
                uint32_t a = le32_at(p, n, off) + k->nh[i + 4 * t];
                uint32_t c = le32_at(p, n, off + 4) + k->nh[i + 1 + 4 * t];
                s += (uint64_t)a * c;
            }
            put_le64(msg + 8 + 8 * t, s);
        }
        uint64_t d[2];
        sh_clean_siphash128(k->sip, msg, sizeof msg, d);
        x[0] ^= d[0];
        x[1] ^= d[1];
    }
    unsigned char fin[24];
    put_le64(fin, n);
    put_le64(fin + 8, x[0]);
    put_le64(fin + 16, x[1]);
    uint64_t out[2];
    sh_clean_siphash128(k->fin, fin, sizeof fin, out);
    return (struct sh_clean_fp){out[0], out[1]};
}

static void fill_key(struct sh_clean_key *k, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    unsigned char *p = (unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++) {
        s = s * 1103515245u + 12345u;
        p[i] = (unsigned char)(s >> 16);
    }
}

static unsigned char *random_bytes(size_t n, uint32_t seed)
{
    unsigned char *p = malloc(n ? n : 1);
    assert_non_null(p);
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (unsigned char)(s >> 24);
    }
    return p;
}

static void test_matches_reference(void **state)
{
    (void)state;
    struct sh_clean_key k;
    fill_key(&k, 7);
    static const size_t lens[] = {0, 1, 7, 8, 9, 4095, 4096, 4097, 3 * 4096 + 5, 5 * 4096};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        unsigned char *p = random_bytes(lens[i], (uint32_t)i + 1);
        struct sh_clean_fp a = sh_clean_hash(&k, p, lens[i]), b = ref_hash(&k, p, lens[i]);
        assert_true(sh_clean_fp_equal(a, b));
        free(p);
    }
    /* An unaligned start reads the same bytes. */
    unsigned char *p = random_bytes(2 * 4096 + 1, 99);
    assert_true(
        sh_clean_fp_equal(sh_clean_hash(&k, p + 1, 2 * 4096), ref_hash(&k, p + 1, 2 * 4096)));
    free(p);
}

static void test_every_byte_counts(void **state)
{
    (void)state;
    struct sh_clean_key k;
    fill_key(&k, 3);
    const size_t n = 3 * 4096;
    unsigned char *p = random_bytes(n, 5);
    struct sh_clean_fp base = sh_clean_hash(&k, p, n);
    for (size_t pos = 0; pos < n; pos += 97) {
        for (int bit = 0; bit < 8; bit += 3) {
            p[pos] ^= (unsigned char)(1u << bit);
            assert_false(sh_clean_fp_equal(sh_clean_hash(&k, p, n), base));
            p[pos] ^= (unsigned char)(1u << bit);
        }
    }
    p[n - 1] ^= 0x80; /* the very last byte */
    assert_false(sh_clean_fp_equal(sh_clean_hash(&k, p, n), base));
    p[n - 1] ^= 0x80;
    assert_true(sh_clean_fp_equal(sh_clean_hash(&k, p, n), base));
    free(p);
}

static void test_block_order_counts(void **state)
{
    (void)state;
    struct sh_clean_key k;
    fill_key(&k, 11);
    const size_t n = 4 * 4096;
    unsigned char *p = random_bytes(n, 17), tmp[4096];
    struct sh_clean_fp base = sh_clean_hash(&k, p, n);
    /* Blocks 1 and 3 swapped: the same blocks, in another order. */
    memcpy(tmp, p + 4096, 4096);
    memcpy(p + 4096, p + 3 * 4096, 4096);
    memcpy(p + 3 * 4096, tmp, 4096);
    assert_false(sh_clean_fp_equal(sh_clean_hash(&k, p, n), base));
    /* Two equal blocks swapped: nothing changed. */
    memcpy(p + 4096, p, 4096);
    base = sh_clean_hash(&k, p, n);
    memcpy(tmp, p, 4096);
    memcpy(p, p + 4096, 4096);
    memcpy(p + 4096, tmp, 4096);
    assert_true(sh_clean_fp_equal(sh_clean_hash(&k, p, n), base));
    /* All-equal blocks do not cancel out in the XOR: the index differs. */
    memset(p, 0, n);
    struct sh_clean_fp two = sh_clean_hash(&k, p, 2 * 4096), zero = sh_clean_hash(&k, p, 0);
    assert_false(sh_clean_fp_equal(two, zero));
    free(p);
}

static void test_length_and_key_count(void **state)
{
    (void)state;
    struct sh_clean_key k1, k2;
    fill_key(&k1, 1);
    fill_key(&k2, 2);
    unsigned char *p = calloc(8192, 1);
    assert_non_null(p);
    /* Zero padding does not make a short buffer equal a longer one. */
    assert_false(sh_clean_fp_equal(sh_clean_hash(&k1, p, 4000), sh_clean_hash(&k1, p, 4096)));
    assert_false(sh_clean_fp_equal(sh_clean_hash(&k1, p, 8192), sh_clean_hash(&k2, p, 8192)));
    free(p);
    struct sh_clean_key r1, r2;
    assert_int_equal(sh_clean_key_random(&r1), 0);
    assert_int_equal(sh_clean_key_random(&r2), 0);
    assert_memory_not_equal(&r1, &r2, sizeof r1);
}

/* The stand-in the simulated GPU runs: XORs X into out, as the kernel's
 * atomics do, so two launches into one slot cancel. */
static void test_kernel_stand_in(void **state)
{
    (void)state;
    struct sh_clean_key k;
    fill_key(&k, 21);
    const uint64_t n = 2 * 4096 + 100;
    unsigned char *p = random_bytes(n, 23);
    uint64_t out[2] = {0, 0}, x[2] = {0, 0};
    const void *src = p;
    const struct sh_clean_key *key = &k;
    uint64_t *o = out;
    void *args[] = {&src, (void *)&n, &key, &o};
    sh_clean_kernel_host(args);
    sh_clean_blocks(&k, p, n, x);
    assert_memory_equal(out, x, sizeof x);
    assert_true(sh_clean_fp_equal(sh_clean_finish(&k, n, out), ref_hash(&k, p, n)));
    sh_clean_kernel_host(args);
    assert_true(out[0] == 0 && out[1] == 0);
    free(p);
    assert_non_null(strstr(sh_clean_ptx, ".entry " SH_CLEAN_KERNEL "("));
}

/* ---- learning ---- */

static void test_learn_stops_after_dirty_run(void **state)
{
    (void)state;
    struct sh_clean_learn l = {0};
    for (int i = 0; i < SH_CLEAN_DIRTY_RUN - 1; i++) {
        assert_true(sh_clean_learn_keep(&l));
        sh_clean_learn_note(&l, 0);
    }
    assert_true(sh_clean_learn_keep(&l));
    sh_clean_learn_note(&l, 0); /* the run is complete: a pause of 8 */
    for (int i = 0; i < 8; i++)
        assert_false(sh_clean_learn_keep(&l));
    assert_true(sh_clean_learn_keep(&l)); /* tried again */
    sh_clean_learn_note(&l, 0);
    for (int i = 0; i < 16; i++)
        assert_false(sh_clean_learn_keep(&l));
    assert_true(sh_clean_learn_keep(&l));
    sh_clean_learn_note(&l, 1); /* clean: all forgotten */
    assert_true(sh_clean_learn_keep(&l));
    sh_clean_learn_note(&l, 0);
    assert_true(sh_clean_learn_keep(&l));
}

static void test_learn_costs(void **state)
{
    (void)state;
    /* Always dirty: of 1000 restores, few keep a copy (each costs two
     * fingerprints); the pause never passes 128. */
    struct sh_clean_learn l = {0};
    int kept = 0, longest = 0, run = 0;
    for (int i = 0; i < 1000; i++) {
        if (sh_clean_learn_keep(&l)) {
            kept++;
            sh_clean_learn_note(&l, 0);
            run = 0;
        } else if (++run > longest) {
            longest = run;
        }
    }
    assert_true(kept <= SH_CLEAN_DIRTY_RUN + 11);
    assert_int_equal(longest, 128);
    /* Dirty every other time: never paused. */
    struct sh_clean_learn m = {0};
    for (int i = 0; i < 100; i++) {
        assert_true(sh_clean_learn_keep(&m));
        sh_clean_learn_note(&m, i % 2);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_known_answers),
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_every_byte_counts),
        cmocka_unit_test(test_block_order_counts),
        cmocka_unit_test(test_length_and_key_count),
        cmocka_unit_test(test_kernel_stand_in),
        cmocka_unit_test(test_learn_stops_after_dirty_run),
        cmocka_unit_test(test_learn_costs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
