/* test_cubin.c — kernel parameter layouts from cubins and fatbins.
 *
 * Fixtures (tests/unit/cubin/, rebuilt by regen.sh from kparams.cu with
 * nvcc for sm_90): a raw cubin, a fatbin with an sm_90 ELF and compressed
 * PTX, and a fatbin whose ELF entries are all compressed. The expected
 * offsets and sizes below are the C ABI layout of each parameter list
 * (kparams.cu), which is also what the EIATTR_KPARAM_INFO records of the
 * cubin say (readelf -x .nv.info.<kernel>). Then hand-made damage, a
 * mixed fatbin, and many truncated and bit-flipped variants, which must
 * all be refused cleanly (run this under ASan).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "interpose/cubin.h"
#include "sh_err.h"

#include <gelf.h>
#include <libelf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIR "tests/unit/cubin/"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- expected layouts ---- */

static const struct sh_cubin_param P_PTRS[] = {{0, 8}, {8, 8}, {16, 8}};
static const struct sh_cubin_param P_SCALARS[] = {{0, 1},  {2, 2},  {4, 4}, {8, 8},
                                                  {16, 1}, {24, 8}, {32, 8}};
/* int *, Padded (24 bytes, align 8), char, Vec16 (16 bytes, align 16) */
static const struct sh_cubin_param P_STRUCT[] = {{0, 8}, {8, 24}, {32, 1}, {48, 16}};
/* five times: int *, char, int, short, double, unsigned char, long long, float */
static const struct sh_cubin_param P_MANY[] = {
    {0, 8},   {8, 1},   {12, 4},  {16, 2},  {24, 8},  {32, 1},  {40, 8},  {48, 4},
    {56, 8},  {64, 1},  {68, 4},  {72, 2},  {80, 8},  {88, 1},  {96, 8},  {104, 4},
    {112, 8}, {120, 1}, {124, 4}, {128, 2}, {136, 8}, {144, 1}, {152, 8}, {160, 4},
    {168, 8}, {176, 1}, {180, 4}, {184, 2}, {192, 8}, {200, 1}, {208, 8}, {216, 4},
    {224, 8}, {232, 1}, {236, 4}, {240, 2}, {248, 8}, {256, 1}, {264, 8}, {272, 4},
};
static const struct sh_cubin_param P_TMPL[] = {{0, 8}, {8, 4}, {12, 4}};
/* KPARAM_INFO_V2 records: the buffer passes 4.3 KB */
static const struct sh_cubin_param P_BIG[] = {{0, 8}, {8, 4400}, {4408, 2}};

struct kernel {
    const char *name;
    const struct sh_cubin_param *params;
    size_t n;
};

#define K(name, arr)                                                                               \
    {                                                                                              \
        name, arr, N_OF(arr)                                                                       \
    }
static const struct kernel KERNELS[] = {
    K("k_ptrs", P_PTRS),
    K("k_scalars", P_SCALARS),
    K("_Z8k_structPi6Paddedc5Vec16", P_STRUCT),
    K("_Z6k_manyPicisdhxfS_cisdhxfS_cisdhxfS_cisdhxfS_cisdhxf", P_MANY),
    K("_Z6k_tmplIfEvPT_S0_i", P_TMPL),
    {"k_none", NULL, 0},
    K("k_big", P_BIG),
};

/* ---- fixtures ---- */

struct blob {
    unsigned char *p;
    size_t n;
};

static struct blob cubin, fatbin, zfatbin;

static struct blob load(const char *path)
{
    struct blob b = {NULL, 0};
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s (run from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_true(n > 0);
    b.n = (size_t)n;
    b.p = malloc(b.n);
    assert_non_null(b.p);
    assert_int_equal(fread(b.p, 1, b.n, f), b.n);
    fclose(f);
    return b;
}

/* An exact-size heap copy, so that ASan sees any read past its end. */
static struct blob dup_blob(const unsigned char *p, size_t n)
{
    struct blob b = {malloc(n ? n : 1), n};
    assert_non_null(b.p);
    if (n)
        memcpy(b.p, p, n);
    return b;
}

static int setup(void **state)
{
    (void)state;
    cubin = load(DIR "kparams_sm90.cubin");
    fatbin = load(DIR "kparams.fatbin");
    zfatbin = load(DIR "kparams_z.fatbin");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(cubin.p);
    free(fatbin.p);
    free(zfatbin.p);
    return 0;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Entry i of a well-formed fatbin: offset, header size, payload size. */
struct fentry {
    size_t off, hsize, psize;
    unsigned kind, arch;
    uint64_t flags;
};

static size_t fat_entries(const struct blob *b, struct fentry *out, size_t max)
{
    size_t off = 16, end = 16 + (size_t)le64(b->p + 8), n = 0;
    assert_int_equal(le32(b->p), 0xBA55ED50u);
    assert_int_equal(end, b->n);
    while (off < end && n < max) {
        const unsigned char *h = b->p + off;
        struct fentry e = {
            off,          le32(h + 4), (size_t)le64(h + 8), (unsigned)(h[0] | h[1] << 8),
            le32(h + 28), le64(h + 40)};
        out[n++] = e;
        off += e.hsize + e.psize;
    }
    assert_int_equal(off, end);
    return n;
}

/* The index of the first entry of this kind. */
static size_t of_kind(const struct fentry *e, size_t n, unsigned kind)
{
    for (size_t i = 0; i < n; i++)
        if (e[i].kind == kind)
            return i;
    fail_msg("no fatbin entry of kind %u", kind);
    return 0;
}

/* The file range of a section of an ELF blob, by name. */
static void section(const unsigned char *p, size_t n, const char *name, size_t *off, size_t *len)
{
    assert_int_not_equal(elf_version(EV_CURRENT), EV_NONE);
    Elf *e = elf_memory((char *)p, n);
    assert_non_null(e);
    size_t shstrndx;
    assert_int_equal(elf_getshdrstrndx(e, &shstrndx), 0);
    Elf_Scn *scn = NULL;
    GElf_Shdr sh;
    while ((scn = elf_nextscn(e, scn))) {
        assert_non_null(gelf_getshdr(scn, &sh));
        const char *s = elf_strptr(e, shstrndx, sh.sh_name);
        if (s && strcmp(s, name) == 0) {
            *off = sh.sh_offset;
            *len = sh.sh_size;
            elf_end(e);
            return;
        }
    }
    elf_end(e);
    fail_msg("no section %s", name);
}

static void check_layout(const struct blob *b, const struct kernel *k)
{
    struct sh_cubin_param got[64];
    size_t count = 99;
    const char *why = NULL;
    int rc = sh_cubin_kernel_params(b->p, b->n, k->name, got, N_OF(got), &count, &why);
    if (rc)
        fail_msg("%s: %d (%s)", k->name, rc, why ? why : "?");
    assert_int_equal(count, k->n);
    for (size_t i = 0; i < k->n; i++) {
        if (got[i].offset != k->params[i].offset || got[i].size != k->params[i].size)
            fail_msg("%s param %zu: got {%u, %u}, want {%u, %u}", k->name, i, got[i].offset,
                     got[i].size, k->params[i].offset, k->params[i].size);
    }
}

/* ---- layouts ---- */

static void test_cubin_layouts(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_OF(KERNELS); i++)
        check_layout(&cubin, &KERNELS[i]);
}

static void test_fatbin_layouts(void **state)
{
    (void)state;
    struct fentry e[8];
    size_t n = fat_entries(&fatbin, e, N_OF(e));
    /* the fixture is what it claims: compressed PTX, an sm_90 ELF stored plainly */
    assert_int_equal(n, 2);
    size_t elf = of_kind(e, n, 2), ptx = of_kind(e, n, 1);
    assert_int_equal(e[elf].arch, 90);
    assert_int_equal(e[elf].flags & 0xA000, 0);
    assert_memory_equal(fatbin.p + e[elf].off + e[elf].hsize,
                        "\x7f"
                        "ELF",
                        4);
    assert_int_not_equal(e[ptx].flags & 0x8000, 0);
    for (size_t i = 0; i < N_OF(KERNELS); i++)
        check_layout(&fatbin, &KERNELS[i]);
}

static void test_exact_size_copies(void **state)
{
    (void)state;
    struct blob c = dup_blob(cubin.p, cubin.n), f = dup_blob(fatbin.p, fatbin.n);
    for (size_t i = 0; i < N_OF(KERNELS); i++) {
        check_layout(&c, &KERNELS[i]);
        check_layout(&f, &KERNELS[i]);
    }
    free(c.p);
    free(f.p);
}

/* ---- listing ---- */

struct seen {
    unsigned mask, arch, visits;
};

static int visit(void *ctx, const struct sh_cubin_kernel *k)
{
    struct seen *s = ctx;
    s->visits++;
    for (size_t i = 0; i < N_OF(KERNELS); i++) {
        if (strcmp(k->name, KERNELS[i].name) != 0)
            continue;
        assert_int_equal(s->mask & (1u << i), 0);
        s->mask |= 1u << i;
        s->arch = k->arch;
        assert_int_equal(k->nparams, KERNELS[i].n);
        if (k->nparams == 0)
            assert_null(k->params);
        for (size_t j = 0; j < k->nparams; j++) {
            assert_int_equal(k->params[j].offset, KERNELS[i].params[j].offset);
            assert_int_equal(k->params[j].size, KERNELS[i].params[j].size);
        }
        return 0;
    }
    fail_msg("unexpected kernel %s", k->name);
    return 0;
}

static void check_list(const struct blob *b)
{
    struct seen s = {0, 0, 0};
    const char *why = NULL;
    assert_int_equal(sh_cubin_list_kernels(b->p, b->n, visit, &s, &why), 0);
    assert_int_equal(s.visits, N_OF(KERNELS));
    assert_int_equal(s.mask, (1u << N_OF(KERNELS)) - 1);
    assert_int_equal(s.arch, 90);
}

static void test_list_cubin(void **state)
{
    (void)state;
    check_list(&cubin);
}

static void test_list_fatbin(void **state)
{
    (void)state;
    check_list(&fatbin);
}

static int stop_at_third(void *ctx, const struct sh_cubin_kernel *k)
{
    (void)k;
    return ++*(int *)ctx == 3 ? 42 : 0;
}

static void test_list_stops(void **state)
{
    (void)state;
    int calls = 0;
    const char *why = NULL;
    assert_int_equal(sh_cubin_list_kernels(cubin.p, cubin.n, stop_at_third, &calls, &why), 42);
    assert_int_equal(calls, 3);
    assert_string_equal(why, "the callback stopped the listing");
}

/* ---- compressed entries ---- */

static void test_compressed(void **state)
{
    (void)state;
    struct fentry e[8];
    size_t n = fat_entries(&zfatbin, e, N_OF(e));
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(e[i].kind, 2);
        assert_int_not_equal(e[i].flags & 0x8000, 0);
        assert_memory_equal(zfatbin.p + e[i].off + e[i].hsize, "\x28\xb5\x2f\xfd", 4); /* zstd */
    }
    assert_int_equal(e[0].arch, 80);
    assert_int_equal(e[1].arch, 90);

    struct sh_cubin_param p[8];
    size_t count = 7;
    const char *why = NULL;
    assert_int_equal(sh_cubin_kernel_params(zfatbin.p, zfatbin.n, "k_ptrs", p, 8, &count, &why),
                     SH_ENOTFOUND);
    assert_int_equal(count, 0);
    assert_non_null(why);
    assert_non_null(strstr(why, "compressed"));

    struct seen s = {0, 0, 0};
    why = NULL;
    assert_int_equal(sh_cubin_list_kernels(zfatbin.p, zfatbin.n, visit, &s, &why), SH_ENOTFOUND);
    assert_int_equal(s.visits, 0);
    assert_non_null(why);
    assert_non_null(strstr(why, "compressed"));
}

/* A container made of the compressed sm_80 ELF of kparams_z.fatbin followed
 * by the entries of kparams.fatbin (sm_90 ELF, compressed PTX). */
static struct blob mixed(void)
{
    struct fentry z[8], f[8];
    assert_int_equal(fat_entries(&zfatbin, z, N_OF(z)), 2);
    assert_int_equal(fat_entries(&fatbin, f, N_OF(f)), 2);
    size_t zlen = z[0].hsize + z[0].psize, flen = fatbin.n - 16;
    struct blob m = {malloc(16 + zlen + flen), 16 + zlen + flen};
    assert_non_null(m.p);
    memcpy(m.p, fatbin.p, 16);
    put64(m.p + 8, zlen + flen);
    memcpy(m.p + 16, zfatbin.p + z[0].off, zlen);
    memcpy(m.p + 16 + zlen, fatbin.p + 16, flen);
    return m;
}

static void test_mixed_fatbin(void **state)
{
    (void)state;
    struct blob m = mixed();
    for (size_t i = 0; i < N_OF(KERNELS); i++)
        check_layout(&m, &KERNELS[i]);
    check_list(&m); /* only the sm_90 ELF is listed */
    size_t size = 0;
    assert_int_equal(sh_cubin_image_size(m.p, m.n, &size), 0);
    assert_int_equal(size, m.n);

    const char *why = NULL;
    size_t count;
    assert_int_equal(sh_cubin_kernel_params(m.p, m.n, "nope", NULL, 0, &count, &why), SH_ENOTFOUND);
    assert_non_null(strstr(why, "compressed")); /* it might be in the compressed entry */
    free(m.p);
}

static void test_ptx_only_fatbin(void **state)
{
    (void)state;
    struct fentry f[8];
    assert_int_equal(fat_entries(&fatbin, f, N_OF(f)), 2);
    size_t ptx = of_kind(f, 2, 1), plen = f[ptx].hsize + f[ptx].psize;
    struct blob m = {malloc(16 + plen), 16 + plen};
    assert_non_null(m.p);
    memcpy(m.p, fatbin.p, 16);
    put64(m.p + 8, plen);
    memcpy(m.p + 16, fatbin.p + f[ptx].off, plen);
    const char *why = NULL;
    size_t count;
    assert_int_equal(sh_cubin_kernel_params(m.p, m.n, "k_ptrs", NULL, 0, &count, &why),
                     SH_ENOTFOUND);
    assert_non_null(strstr(why, "no ELF"));
    struct seen s = {0, 0, 0};
    assert_int_equal(sh_cubin_list_kernels(m.p, m.n, visit, &s, NULL), SH_ENOTFOUND);
    free(m.p);
}

/* ---- lookups that find nothing, small arrays, bad arguments ---- */

static void test_not_found(void **state)
{
    (void)state;
    const char *names[] = {"", "k_ptr", "k_ptrsx", "k_struct", "_Z6k_tmplIfEvPT_S0_", "main"};
    for (size_t i = 0; i < N_OF(names); i++) {
        struct sh_cubin_param p[4];
        size_t count = 5;
        const char *why = NULL;
        assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, names[i], p, 4, &count, &why),
                         SH_ENOTFOUND);
        assert_int_equal(count, 0);
        assert_string_equal(why, "no kernel of that name");
        why = NULL;
        assert_int_equal(sh_cubin_kernel_params(fatbin.p, fatbin.n, names[i], p, 4, &count, &why),
                         SH_ENOTFOUND);
        assert_string_equal(why, "no kernel of that name");
    }
}

static void test_small_array(void **state)
{
    (void)state;
    struct sh_cubin_param p[40];
    size_t count = 0;
    const char *why = NULL;
    const char *many = KERNELS[3].name;
    assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, many, NULL, 0, &count, &why),
                     SH_ERANGE);
    assert_int_equal(count, 40);
    memset(p, 0xab, sizeof p);
    assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, many, p, 39, &count, NULL),
                     SH_ERANGE);
    assert_int_equal(count, 40);
    assert_int_equal(p[0].offset, 0xabababab); /* nothing written */
    assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, many, p, 40, &count, NULL), 0);
    assert_int_equal(p[39].offset, 272);
    /* no parameters: no array needed */
    assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, "k_none", NULL, 0, &count, NULL), 0);
    assert_int_equal(count, 0);
}

static void test_bad_args(void **state)
{
    (void)state;
    struct sh_cubin_param p[4];
    size_t count, size;
    const char *why = NULL;
    assert_int_equal(sh_cubin_kernel_params(NULL, 10, "k", p, 4, &count, &why), SH_EINVAL);
    assert_non_null(why);
    assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, NULL, p, 4, &count, NULL), SH_EINVAL);
    assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, "k_ptrs", p, 4, NULL, NULL),
                     SH_EINVAL);
    assert_int_equal(sh_cubin_kernel_params(cubin.p, cubin.n, "k_ptrs", NULL, 4, &count, NULL),
                     SH_EINVAL);
    assert_int_equal(sh_cubin_list_kernels(NULL, 10, visit, NULL, NULL), SH_EINVAL);
    assert_int_equal(sh_cubin_list_kernels(cubin.p, cubin.n, NULL, NULL, NULL), SH_EINVAL);
    assert_int_equal(sh_cubin_image_size(NULL, 10, &size), SH_EINVAL);
    assert_int_equal(sh_cubin_image_size(cubin.p, cubin.n, NULL), SH_EINVAL);
}

static void test_bad_magic(void **state)
{
    (void)state;
    static const char ptx[] = "//\n.version 9.0\n.target sm_90\n.address_size 64\n";
    static const unsigned char wrapper[16] = {0xb1, 0x43, 0x62, 0x46, 1, 0, 0, 0}; /* fatBinC */
    static const unsigned char zero[128];
    const struct blob bad[] = {
        {(unsigned char *)ptx, sizeof ptx},
        {(unsigned char *)wrapper, sizeof wrapper},
        {(unsigned char *)zero, sizeof zero},
        {(unsigned char *)zero, 0},
        {cubin.p, 3},
        {fatbin.p, 3},
        {fatbin.p, 15},
        {cubin.p, 63},
    };
    for (size_t i = 0; i < N_OF(bad); i++) {
        struct blob b = dup_blob(bad[i].p, bad[i].n);
        size_t count, size;
        const char *why = NULL;
        assert_int_equal(sh_cubin_kernel_params(b.p, b.n, "k_ptrs", NULL, 0, &count, &why),
                         SH_EINVAL);
        assert_non_null(why);
        struct seen s = {0, 0, 0};
        assert_int_equal(sh_cubin_list_kernels(b.p, b.n, visit, &s, NULL), SH_EINVAL);
        assert_int_equal(s.visits, 0);
        assert_int_equal(sh_cubin_image_size(b.p, b.n, &size), SH_EINVAL);
        free(b.p);
    }
}

static void test_image_size(void **state)
{
    (void)state;
    size_t size = 0;
    assert_int_equal(sh_cubin_image_size(cubin.p, cubin.n, &size), 0);
    assert_int_equal(size, cubin.n);
    assert_int_equal(sh_cubin_image_size(cubin.p, SIZE_MAX, &size), 0);
    assert_int_equal(size, cubin.n);
    assert_int_equal(sh_cubin_image_size(cubin.p, cubin.n - 1, &size), SH_EINVAL);
    assert_int_equal(sh_cubin_image_size(fatbin.p, fatbin.n, &size), 0);
    assert_int_equal(size, fatbin.n);
    assert_int_equal(sh_cubin_image_size(fatbin.p, SIZE_MAX, &size), 0);
    assert_int_equal(size, fatbin.n);
    assert_int_equal(sh_cubin_image_size(fatbin.p, fatbin.n - 1, &size), SH_EINVAL);
    assert_int_equal(sh_cubin_image_size(zfatbin.p, zfatbin.n, &size), 0);
    assert_int_equal(size, zfatbin.n);

    /* a larger buffer around the image: the image's own extent */
    struct blob big = {calloc(1, cubin.n + 4096), cubin.n + 4096};
    assert_non_null(big.p);
    memcpy(big.p, cubin.p, cubin.n);
    assert_int_equal(sh_cubin_image_size(big.p, big.n, &size), 0);
    assert_int_equal(size, cubin.n);
    check_layout(&big, &KERNELS[2]);
    free(big.p);
}

/* ---- hand-made damage to real records ---- */

/* The k_ptrs .nv.info section of a private copy of the cubin. */
struct patch {
    struct blob b;
    unsigned char *info;
    size_t len;
};

static struct patch patch_open(const char *sec)
{
    struct patch pt;
    pt.b = dup_blob(cubin.p, cubin.n);
    size_t off;
    section(pt.b.p, pt.b.n, sec, &off, &pt.len);
    pt.info = pt.b.p + off;
    return pt;
}

/* The n-th record (from 0) with this attribute in pt's section. */
static unsigned char *record(const struct patch *pt, unsigned attr, int n)
{
    for (size_t pos = 0; pos + 4 <= pt->len;) {
        unsigned char *r = pt->info + pos;
        if (r[1] == attr && n-- == 0)
            return r;
        pos += r[0] == 4 ? 4u + (size_t)(r[2] | r[3] << 8) : 4u;
    }
    fail_msg("no record 0x%x", attr);
    return NULL;
}

static int patched_params(const struct patch *pt, const char *name, const char **why)
{
    struct sh_cubin_param p[16];
    size_t count;
    *why = NULL;
    return sh_cubin_kernel_params(pt->b.p, pt->b.n, name, p, 16, &count, why);
}

static void expect(const struct patch *pt, const char *name, int want, const char *why_has)
{
    const char *why;
    int rc = patched_params(pt, name, &why);
    if (rc != want)
        fail_msg("%s: got %d (%s), want %d", name, rc, why ? why : "-", want);
    if (why_has && (!why || !strstr(why, why_has)))
        fail_msg("%s: reason '%s' lacks '%s'", name, why ? why : "-", why_has);
    free(pt->b.p);
}

static void test_damaged_records(void **state)
{
    (void)state;
    struct patch pt;
    const char *sec = ".nv.info.k_ptrs";
    /* records, in file order: ordinal 2 (off 16), ordinal 1 (off 8), ordinal 0 (off 0) */

    pt = patch_open(sec); /* intact */
    expect(&pt, "k_ptrs", 0, NULL);

    pt = patch_open(sec);
    record(&pt, 0x17, 0)[8] = 3; /* ordinal 3 of 3 */
    expect(&pt, "k_ptrs", SH_EINVAL, "ordinal out of range");

    pt = patch_open(sec);
    record(&pt, 0x17, 1)[8] = 2; /* two ordinal 2 */
    expect(&pt, "k_ptrs", SH_EINVAL, "duplicate");

    pt = patch_open(sec);
    record(&pt, 0x17, 1)[14] = 0x41; /* ordinal 1: 16 bytes, into ordinal 2 */
    expect(&pt, "k_ptrs", SH_EINVAL, "overlap");

    pt = patch_open(sec);
    record(&pt, 0x17, 0)[10] = 0x18; /* ordinal 2 at 24: past the 24-byte buffer */
    expect(&pt, "k_ptrs", SH_EINVAL, "past the parameter buffer");

    pt = patch_open(sec);
    record(&pt, 0x19, 0)[2] = 0x10; /* CBANK_PARAM_SIZE 16 < 24 */
    expect(&pt, "k_ptrs", SH_EINVAL, "past the parameter buffer");

    pt = patch_open(sec);
    record(&pt, 0x17, 2)[0] = 7; /* unknown format */
    expect(&pt, "k_ptrs", SH_EINVAL, "format");

    pt = patch_open(sec);
    record(&pt, 0x17, 2)[2] = 0x0d; /* a 13-byte KPARAM_INFO */
    expect(&pt, "k_ptrs", SH_EINVAL, NULL);

    pt = patch_open(sec);
    record(&pt, 0x36, 0)[3] = 0x7f; /* the last record claims 32 KB */
    expect(&pt, "k_ptrs", SH_EINVAL, "truncated");

    pt = patch_open(sec);
    record(&pt, 0x19, 0)[0] = 4; /* CBANK_PARAM_SIZE as SVAL of 24 bytes: runs on */
    expect(&pt, "k_ptrs", SH_EINVAL, NULL);

    pt = patch_open(sec);
    for (int i = 0; i < 3; i++)
        record(&pt, 0x17, 0)[1] = 0x16; /* no KPARAM_INFO left, 24 parameter bytes */
    expect(&pt, "k_ptrs", SH_ENOTFOUND, "no KPARAM_INFO");

    pt = patch_open(".nv.info.k_big"); /* V2 records */
    record(&pt, 0x45, 1)[12] = 0x31;   /* 4401 bytes: into the short */
    expect(&pt, "k_big", SH_EINVAL, "overlap");

    pt = patch_open(sec); /* the section no longer names the kernel */
    pt.info = NULL;
    {
        size_t off, len;
        section(pt.b.p, pt.b.n, ".shstrtab", &off, &len);
        unsigned char *s = memmem(pt.b.p + off, len, ".nv.info.k_ptrs", 16);
        assert_non_null(s);
        s[9] = 'K';
    }
    expect(&pt, "k_ptrs", SH_ENOTFOUND, "no .nv.info section");
}

static void test_not_an_entry(void **state)
{
    (void)state;
    /* clear STO_CUDA_ENTRY on k_ptrs: a device function is not a kernel */
    struct blob b = dup_blob(cubin.p, cubin.n);
    Elf *e = elf_memory((char *)b.p, b.n);
    assert_non_null(e);
    Elf_Scn *scn = NULL;
    GElf_Shdr sh;
    int done = 0;
    while ((scn = elf_nextscn(e, scn)) && !done) {
        assert_non_null(gelf_getshdr(scn, &sh));
        if (sh.sh_type != SHT_SYMTAB)
            continue;
        for (size_t i = 0; i < sh.sh_size / sh.sh_entsize; i++) {
            unsigned char *sym = b.p + sh.sh_offset + i * sh.sh_entsize;
            Elf64_Sym s;
            memcpy(&s, sym, sizeof s);
            const char *name = elf_strptr(e, sh.sh_link, s.st_name);
            if (name && strcmp(name, "k_ptrs") == 0) {
                sym[offsetof(Elf64_Sym, st_other)] &= (unsigned char)~0x10;
                done = 1;
            }
        }
    }
    elf_end(e);
    assert_true(done);
    size_t count;
    const char *why = NULL;
    assert_int_equal(sh_cubin_kernel_params(b.p, b.n, "k_ptrs", NULL, 0, &count, &why),
                     SH_ENOTFOUND);
    assert_string_equal(why, "no kernel of that name");
    struct seen s = {0, 0, 0};
    assert_int_equal(sh_cubin_list_kernels(b.p, b.n, visit, &s, NULL), 0);
    assert_int_equal(s.visits, N_OF(KERNELS) - 1);
    assert_int_equal(s.mask & 1u, 0);
    free(b.p);
}

static void test_damaged_fatbin(void **state)
{
    (void)state;
    struct fentry e[8];
    size_t n = fat_entries(&fatbin, e, N_OF(e));
    size_t elf = of_kind(e, n, 2), at = e[elf].off;
    struct {
        size_t at;
        unsigned char v;
    } cases[] = {
        {4, 2},                 /* version 2 */
        {6, 8},                 /* header size 8 */
        {6, 0xff},              /* header size 255 */
        {13, 1},                /* body far past the image */
        {16 + 4, 8},            /* first entry's header size 8 */
        {16 + 7, 0x7f},         /* first entry's header size huge */
        {16 + 12, 1},           /* first entry's payload far past the container */
        {at + 4, 8},            /* ELF entry's header size 8 */
        {at + 4, 0x48},         /* ELF entry's header size 72: payload runs on */
        {at + 13, 1},           /* ELF entry's payload far past the container */
        {at + e[elf].hsize, 0}, /* ELF magic gone from an uncompressed ELF entry */
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        struct blob b = dup_blob(fatbin.p, fatbin.n);
        b.p[cases[i].at] = cases[i].v;
        size_t count;
        const char *why = NULL;
        int rc = sh_cubin_kernel_params(b.p, b.n, "k_ptrs", NULL, 0, &count, &why);
        if (rc != SH_EINVAL)
            fail_msg("case %zu: %d", i, rc);
        assert_non_null(why);
        free(b.p);
    }
}

/* ---- truncated and bit-flipped variants ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int count_visit(void *ctx, const struct sh_cubin_kernel *k)
{
    size_t *n = ctx;
    assert_non_null(k->name);
    assert_true(k->nparams <= SH_CUBIN_MAX_PARAMS);
    uint64_t end = 0;
    for (size_t i = 0; i < k->nparams; i++) {
        assert_true(k->params[i].offset >= end);
        end = (uint64_t)k->params[i].offset + k->params[i].size;
    }
    ++*n;
    return 0;
}

/* Everything the module offers, on one image; it must answer cleanly. */
static void poke(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < N_OF(KERNELS); i++) {
        struct sh_cubin_param params[64];
        size_t count = 0;
        const char *why = NULL;
        int rc = sh_cubin_kernel_params(p, n, KERNELS[i].name, params, N_OF(params), &count, &why);
        if (rc != 0 && rc != SH_EINVAL && rc != SH_ENOTFOUND && rc != SH_ERANGE)
            fail_msg("%s: unexpected %d", KERNELS[i].name, rc);
        if (rc)
            assert_non_null(why);
        if (rc == 0) {
            assert_true(count <= N_OF(params));
            uint64_t end = 0;
            for (size_t j = 0; j < count; j++) {
                assert_true(params[j].offset >= end);
                end = (uint64_t)params[j].offset + params[j].size;
            }
        }
    }
    size_t kernels = 0, size = 0;
    const char *why = NULL;
    int rc = sh_cubin_list_kernels(p, n, count_visit, &kernels, &why);
    assert_true(rc == 0 || rc == SH_EINVAL || rc == SH_ENOTFOUND);
    if (rc)
        assert_non_null(why);
    rc = sh_cubin_image_size(p, n, &size);
    assert_true(rc == 0 || rc == SH_EINVAL);
    if (rc == 0)
        assert_true(size <= n);
}

/* Byte ranges worth hitting more often than chance would: headers, tables,
 * the .nv.info sections, the symbols and their names. */
struct range {
    size_t off, len;
};

static size_t hot_ranges(const struct blob *b, size_t base, struct range *out, size_t max)
{
    const unsigned char *p = b->p + base;
    size_t n = 0;
    out[n++] = (struct range){base, 64};
    Elf *e = elf_memory((char *)p, b->n - base);
    assert_non_null(e);
    GElf_Ehdr eh;
    assert_non_null(gelf_getehdr(e, &eh));
    out[n++] = (struct range){base + eh.e_shoff, (size_t)eh.e_shnum * eh.e_shentsize};
    size_t shstrndx;
    assert_int_equal(elf_getshdrstrndx(e, &shstrndx), 0);
    Elf_Scn *scn = NULL;
    GElf_Shdr sh;
    while ((scn = elf_nextscn(e, scn)) && n < max) {
        assert_non_null(gelf_getshdr(scn, &sh));
        const char *s = elf_strptr(e, shstrndx, sh.sh_name);
        if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_STRTAB ||
            (s && strncmp(s, ".nv.info", 8) == 0))
            out[n++] = (struct range){base + sh.sh_offset, sh.sh_size};
    }
    elf_end(e);
    return n;
}

static void mutate(const struct blob *src, const struct range *hot, size_t nhot, int rounds)
{
    struct blob b = dup_blob(src->p, src->n);
    for (int r = 0; r < rounds; r++) {
        memcpy(b.p, src->p, src->n);
        int flips = 1 + (int)(rnd() % 4);
        for (int f = 0; f < flips; f++) {
            size_t at;
            if (rnd() % 4) {
                const struct range *h = &hot[rnd() % nhot];
                at = h->off + (h->len ? rnd() % h->len : 0);
            } else {
                at = rnd() % src->n;
            }
            if (at >= src->n)
                continue;
            switch (rnd() % 4) {
            case 0:
                b.p[at] ^= (unsigned char)(1u << (rnd() % 8));
                break;
            case 1:
                b.p[at] = (unsigned char)rnd();
                break;
            case 2:
                b.p[at] = 0xff;
                break;
            default:
                b.p[at] = 0;
                break;
            }
        }
        poke(b.p, b.n);
    }
    free(b.p);
}

static void test_truncated(void **state)
{
    (void)state;
    const struct blob *srcs[] = {&cubin, &fatbin, &zfatbin};
    for (size_t s = 0; s < N_OF(srcs); s++) {
        for (size_t n = 0; n < srcs[s]->n; n += (n < 256 ? 1 : 61)) {
            struct blob b = dup_blob(srcs[s]->p, n);
            poke(b.p, b.n);
            /* a fatbin cut short but whose header agrees with the cut */
            if (srcs[s] != &cubin && n >= 16) {
                put64(b.p + 8, n - 16);
                poke(b.p, b.n);
            }
            free(b.p);
        }
    }
}

static void test_bit_flips(void **state)
{
    (void)state;
    struct range hot[64];
    size_t nhot = hot_ranges(&cubin, 0, hot, N_OF(hot));
    mutate(&cubin, hot, nhot, 20000);

    /* the fatbin: its headers, and the same hot spots of its ELF */
    struct fentry e[8];
    assert_int_equal(fat_entries(&fatbin, e, N_OF(e)), 2);
    size_t elf = of_kind(e, 2, 2);
    nhot = hot_ranges(&fatbin, e[elf].off + e[elf].hsize, hot, N_OF(hot) - 3);
    hot[nhot++] = (struct range){0, 16};
    hot[nhot++] = (struct range){e[0].off, e[0].hsize};
    hot[nhot++] = (struct range){e[1].off, e[1].hsize};
    mutate(&fatbin, hot, nhot, 20000);
}

/* ---- no shared state ---- */

static void *worker(void *arg)
{
    const struct blob *b = arg;
    for (int i = 0; i < 200; i++) {
        const struct kernel *k = &KERNELS[(size_t)i % N_OF(KERNELS)];
        struct sh_cubin_param p[64];
        size_t count;
        if (sh_cubin_kernel_params(b->p, b->n, k->name, p, 64, &count, NULL) != 0 || count != k->n)
            return (void *)1;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, i % 2 ? &fatbin : &cubin), 0);
    for (int i = 0; i < 4; i++) {
        void *rv;
        assert_int_equal(pthread_join(t[i], &rv), 0);
        assert_null(rv);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cubin_layouts),     cmocka_unit_test(test_fatbin_layouts),
        cmocka_unit_test(test_exact_size_copies), cmocka_unit_test(test_list_cubin),
        cmocka_unit_test(test_list_fatbin),       cmocka_unit_test(test_list_stops),
        cmocka_unit_test(test_compressed),        cmocka_unit_test(test_mixed_fatbin),
        cmocka_unit_test(test_ptx_only_fatbin),   cmocka_unit_test(test_not_found),
        cmocka_unit_test(test_small_array),       cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_bad_magic),         cmocka_unit_test(test_image_size),
        cmocka_unit_test(test_damaged_records),   cmocka_unit_test(test_not_an_entry),
        cmocka_unit_test(test_damaged_fatbin),    cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bit_flips),         cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
