/* test_rindex.c — interval index: edges, overlap refusal, removal, order,
 * and a long random run checked against a brute-force reference. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool_parts.h"
#include "sh_err.h"

#include <stdint.h>
#include <stdlib.h>

#define P(x) ((void *)(uintptr_t)(x))

static uint64_t rng = 88172645463325252ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static struct sh_rindex *mk(void)
{
    struct sh_rindex *ri = NULL;
    assert_int_equal(sh_rindex_create(&ri), 0);
    assert_non_null(ri);
    return ri;
}

static void test_empty(void **state)
{
    (void)state;
    struct sh_rindex *ri = mk();
    assert_int_equal(sh_rindex_count(ri), 0);
    assert_null(sh_rindex_lookup(ri, 0));
    assert_null(sh_rindex_lookup(ri, 12345));
    assert_null(sh_rindex_lookup(ri, UINTPTR_MAX));
    assert_int_equal(sh_rindex_find(ri, 5, NULL, NULL, NULL), SH_ENOTFOUND);
    assert_int_equal(sh_rindex_remove(ri, 0, NULL), SH_ENOTFOUND);
    assert_int_equal(sh_rindex_validate(ri), 0);
    sh_rindex_destroy(ri);
    sh_rindex_destroy(NULL);
}

struct span {
    uintptr_t start;
    size_t len;
};

static void test_every_address(void **state)
{
    (void)state;
    static const struct span s[] = {
        {1000, 100}, {1100, 50}, {2000, 1}, {3000, 64}, {0, 10}, {UINTPTR_MAX - 10, 10},
    };
    const size_t n = sizeof s / sizeof s[0];
    struct sh_rindex *ri = mk();
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sh_rindex_insert(ri, s[i].start, s[i].len, P(i + 1)), 0);
    assert_int_equal(sh_rindex_count(ri), n);
    for (size_t i = 0; i < n; i++) {
        uintptr_t lo = s[i].start, hi = s[i].start + s[i].len; /* [lo, hi) */
        for (uintptr_t a = lo; a != hi; a++)
            assert_ptr_equal(sh_rindex_lookup(ri, a), P(i + 1));
        uintptr_t got;
        size_t len;
        void *p;
        assert_int_equal(sh_rindex_find(ri, hi - 1, &got, &len, &p), 0);
        assert_int_equal(got, lo);
        assert_int_equal(len, s[i].len);
        assert_ptr_equal(p, P(i + 1));
    }
    /* Just outside each interval, where no neighbour is adjacent. */
    assert_null(sh_rindex_lookup(ri, 999));
    assert_ptr_equal(sh_rindex_lookup(ri, 1099), P(1)); /* [1000,1100) then [1100,1150) */
    assert_ptr_equal(sh_rindex_lookup(ri, 1100), P(2));
    assert_null(sh_rindex_lookup(ri, 1150));
    assert_null(sh_rindex_lookup(ri, 1999));
    assert_null(sh_rindex_lookup(ri, 2001));
    assert_null(sh_rindex_lookup(ri, 2999));
    assert_null(sh_rindex_lookup(ri, 3064));
    assert_null(sh_rindex_lookup(ri, 10));
    assert_null(sh_rindex_lookup(ri, UINTPTR_MAX - 11));
    assert_null(sh_rindex_lookup(ri, UINTPTR_MAX));
    assert_int_equal(sh_rindex_validate(ri), 0);
    sh_rindex_destroy(ri);
}

static void test_refuse(void **state)
{
    (void)state;
    struct sh_rindex *ri = mk();
    assert_int_equal(sh_rindex_insert(ri, 100, 0, P(1)), SH_EINVAL);
    assert_int_equal(sh_rindex_insert(ri, UINTPTR_MAX - 5, 10, P(1)), SH_EINVAL);
    assert_int_equal(sh_rindex_insert(ri, UINTPTR_MAX, 1, P(1)), SH_EINVAL); /* end would wrap */
    assert_int_equal(sh_rindex_insert(ri, 100, 100, P(1)), 0);               /* [100,200) */
    assert_int_equal(sh_rindex_insert(ri, 300, 100, P(2)), 0);               /* [300,400) */
    static const struct span bad[] = {
        {100, 100}, /* same */
        {150, 10},  /* inside */
        {50, 300},  /* covers one */
        {50, 51},   /* overlaps the left edge */
        {199, 10},  /* overlaps the right edge */
        {150, 200}, /* spans both */
        {0, 500},   /* covers both */
        {399, 1},   /* last byte */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(sh_rindex_insert(ri, bad[i].start, bad[i].len, P(9)), SH_EINVAL);
        assert_int_equal(sh_rindex_count(ri), 2);
        assert_int_equal(sh_rindex_validate(ri), 0);
    }
    assert_int_equal(sh_rindex_insert(ri, 200, 100, P(3)), 0); /* adjacent both sides */
    assert_int_equal(sh_rindex_insert(ri, 99, 1, P(4)), 0);
    assert_int_equal(sh_rindex_insert(ri, 400, 1, P(5)), 0);
    assert_int_equal(sh_rindex_count(ri), 5);
    assert_ptr_equal(sh_rindex_lookup(ri, 199), P(1));
    assert_ptr_equal(sh_rindex_lookup(ri, 200), P(3));
    assert_ptr_equal(sh_rindex_lookup(ri, 299), P(3));
    assert_ptr_equal(sh_rindex_lookup(ri, 99), P(4));
    assert_ptr_equal(sh_rindex_lookup(ri, 400), P(5));
    assert_int_equal(sh_rindex_validate(ri), 0);
    sh_rindex_destroy(ri);
}

static void test_remove(void **state)
{
    (void)state;
    struct sh_rindex *ri = mk();
    for (int i = 0; i < 10; i++)
        assert_int_equal(sh_rindex_insert(ri, 1000 + 100 * (uintptr_t)i, 50, P(i + 1)), 0);
    void *p = NULL;
    assert_int_equal(sh_rindex_remove(ri, 1510, &p), SH_ENOTFOUND); /* interior */
    assert_int_equal(sh_rindex_remove(ri, 1550, &p), SH_ENOTFOUND); /* past the end */
    assert_null(p);
    assert_int_equal(sh_rindex_remove(ri, 1500, &p), 0);
    assert_ptr_equal(p, P(6));
    assert_int_equal(sh_rindex_count(ri), 9);
    assert_null(sh_rindex_lookup(ri, 1500));
    assert_null(sh_rindex_lookup(ri, 1549));
    assert_ptr_equal(sh_rindex_lookup(ri, 1449), P(5));
    assert_ptr_equal(sh_rindex_lookup(ri, 1600), P(7));
    assert_int_equal(sh_rindex_remove(ri, 1500, NULL), SH_ENOTFOUND);
    /* Lowest and highest: the fast bounds check must follow. */
    assert_int_equal(sh_rindex_remove(ri, 1000, NULL), 0);
    assert_int_equal(sh_rindex_remove(ri, 1900, NULL), 0);
    assert_null(sh_rindex_lookup(ri, 1000));
    assert_null(sh_rindex_lookup(ri, 1949));
    assert_ptr_equal(sh_rindex_lookup(ri, 1100), P(2));
    assert_ptr_equal(sh_rindex_lookup(ri, 1849), P(9));
    /* The freed range can be taken again, with a different shape. */
    assert_int_equal(sh_rindex_insert(ri, 1490, 60, P(42)), 0);
    assert_ptr_equal(sh_rindex_lookup(ri, 1549), P(42));
    assert_int_equal(sh_rindex_validate(ri), 0);
    sh_rindex_destroy(ri);
}

struct walk {
    uintptr_t starts[64];
    int n, stop_at;
};

static int visit(void *arg, uintptr_t start, size_t len, void *payload)
{
    struct walk *w = arg;
    assert_int_equal(len, 10);
    assert_ptr_equal(payload, P(start));
    w->starts[w->n++] = start;
    return w->n == w->stop_at ? 77 : 0;
}

static void test_foreach(void **state)
{
    (void)state;
    struct sh_rindex *ri = mk();
    for (int i = 0; i < 40; i++) {
        uintptr_t s = (uintptr_t)((i * 17) % 40) * 100; /* scrambled order */
        assert_int_equal(sh_rindex_insert(ri, s, 10, P(s)), 0);
    }
    struct walk w = {.stop_at = -1};
    assert_int_equal(sh_rindex_foreach(ri, visit, &w), 0);
    assert_int_equal(w.n, 40);
    for (int i = 0; i < 40; i++)
        assert_int_equal(w.starts[i], (uintptr_t)i * 100);
    struct walk w2 = {.stop_at = 5};
    assert_int_equal(sh_rindex_foreach(ri, visit, &w2), 77);
    assert_int_equal(w2.n, 5);
    sh_rindex_destroy(ri);
}

/* Sequential inserts are the worst case for an unbalanced tree. */
static void test_balanced(void **state)
{
    (void)state;
    struct sh_rindex *ri = mk();
    assert_int_equal(sh_rindex_reserve(ri, 10000), 0);
    for (uintptr_t i = 0; i < 10000; i++)
        assert_int_equal(sh_rindex_insert(ri, i * 64, 64, P(i + 1)), 0);
    assert_int_equal(sh_rindex_validate(ri), 0);
    for (uintptr_t i = 0; i < 10000; i += 2)
        assert_int_equal(sh_rindex_remove(ri, i * 64, NULL), 0);
    assert_int_equal(sh_rindex_validate(ri), 0);
    assert_int_equal(sh_rindex_count(ri), 5000);
    for (uintptr_t i = 0; i < 10000; i++) {
        void *want = i % 2 ? P(i + 1) : NULL;
        assert_ptr_equal(sh_rindex_lookup(ri, i * 64 + 63), want);
    }
    sh_rindex_destroy(ri);
}

/* ---- random run against a brute-force reference ---------------------------- */

#define SPACE 16384
#define MAXN  2048

static struct span ref[MAXN];
static size_t nref;

static void *ref_lookup(uintptr_t a)
{
    for (size_t i = 0; i < nref; i++)
        if (a >= ref[i].start && a - ref[i].start < ref[i].len)
            return P(ref[i].start + 1);
    return NULL;
}

static int ref_overlaps(uintptr_t s, size_t len)
{
    for (size_t i = 0; i < nref; i++)
        if (s < ref[i].start + ref[i].len && ref[i].start < s + len)
            return 1;
    return 0;
}

static int ref_remove(uintptr_t s)
{
    for (size_t i = 0; i < nref; i++)
        if (ref[i].start == s) {
            ref[i] = ref[--nref];
            return 1;
        }
    return 0;
}

struct order {
    uintptr_t prev;
    size_t n;
};

static int check_order(void *arg, uintptr_t start, size_t len, void *payload)
{
    struct order *o = arg;
    assert_true(o->n == 0 || start >= o->prev);
    assert_ptr_equal(payload, P(start + 1));
    assert_ptr_equal(ref_lookup(start), payload);
    o->prev = start + len;
    o->n++;
    return 0;
}

/* The generation changes with every change to the index and with nothing
 * else, and two indices never share one: a lookup remembered with it (the
 * pool's per-thread cache) is stale exactly when it differs. */
static void test_generation(void **state)
{
    (void)state;
    struct sh_rindex *a = mk(), *b = mk();
    uint64_t g = sh_rindex_gen(a);
    assert_true(g != 0);
    assert_true(sh_rindex_gen(b) != g);
    int x, y;
    assert_int_equal(sh_rindex_insert(a, 0x10000, 0x1000, &x), 0);
    uint64_t g1 = sh_rindex_gen(a);
    assert_true(g1 != g && g1 != sh_rindex_gen(b));
    assert_ptr_equal(sh_rindex_lookup(a, 0x10800), &x);
    assert_int_equal(sh_rindex_gen(a), g1); /* lookups change nothing */
    assert_int_equal(sh_rindex_insert(a, 0x10800, 0x10, &y), SH_EINVAL);
    assert_int_equal(sh_rindex_gen(a), g1); /* nor does a refused insert */
    assert_int_equal(sh_rindex_remove(a, 0x10000, NULL), 0);
    uint64_t g2 = sh_rindex_gen(a);
    assert_true(g2 != g1);
    /* the same interval back, another payload: a new generation again */
    assert_int_equal(sh_rindex_insert(a, 0x10000, 0x1000, &y), 0);
    assert_true(sh_rindex_gen(a) != g2 && sh_rindex_gen(a) != g1);
    assert_int_equal(sh_rindex_remove(a, 0x20000, NULL), SH_ENOTFOUND);
    sh_rindex_destroy(a);
    sh_rindex_destroy(b);
}

static void test_random_vs_reference(void **state)
{
    (void)state;
    rng = 0x5eed1234abcdull;
    nref = 0;
    struct sh_rindex *ri = mk();
    for (int op = 0; op < 30000; op++) {
        uint64_t r = rnd() % 10;
        if (r < 5 && nref < MAXN) {
            uintptr_t s = rnd() % SPACE;
            size_t len = 1 + rnd() % 48;
            int want = ref_overlaps(s, len) ? SH_EINVAL : 0;
            assert_int_equal(sh_rindex_insert(ri, s, len, P(s + 1)), want);
            if (!want)
                ref[nref++] = (struct span){s, len};
        } else if (r < 8) {
            /* Half the time a start that exists, else any address. */
            uintptr_t s = nref && rnd() % 2 ? ref[rnd() % nref].start : rnd() % SPACE;
            void *p = NULL;
            int had = ref_remove(s);
            assert_int_equal(sh_rindex_remove(ri, s, &p), had ? 0 : SH_ENOTFOUND);
            if (had)
                assert_ptr_equal(p, P(s + 1));
        }
        for (int k = 0; k < 8; k++) {
            uintptr_t a = rnd() % (SPACE + 64);
            assert_ptr_equal(sh_rindex_lookup(ri, a), ref_lookup(a));
        }
        assert_int_equal(sh_rindex_count(ri), nref);
        if (op % 1000 == 0) {
            assert_int_equal(sh_rindex_validate(ri), 0);
            struct order o = {0, 0};
            assert_int_equal(sh_rindex_foreach(ri, check_order, &o), 0);
            assert_int_equal(o.n, nref);
        }
    }
    for (uintptr_t a = 0; a < SPACE + 64; a++)
        assert_ptr_equal(sh_rindex_lookup(ri, a), ref_lookup(a));
    assert_int_equal(sh_rindex_validate(ri), 0);
    sh_rindex_destroy(ri);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),      cmocka_unit_test(test_every_address),
        cmocka_unit_test(test_refuse),     cmocka_unit_test(test_remove),
        cmocka_unit_test(test_foreach),    cmocka_unit_test(test_balanced),
        cmocka_unit_test(test_generation), cmocka_unit_test(test_random_vs_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
