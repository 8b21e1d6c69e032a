/* test_hostpool_share.c — host slab pools on a budget they share: with
 * other processes (node/), whose refusals fail a waiting caller for now,
 * and with other pools in the process (other devices'), whose idle slabs
 * are given back for a slab a caller waits for. Over the fake VMM of
 * hostpool_fakes.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "hostpool_fakes.h"

/* ---- a shared budget, counting what it was asked ---- */

struct fshare {
    pthread_mutex_t mu;
    size_t budget, used, peak;
    int reserves, refusals, releases;
};

static struct fshare fs;

static int fs_reserve(void *ctx, size_t bytes)
{
    struct fshare *f = ctx;
    pthread_mutex_lock(&f->mu);
    int no = f->used + bytes > f->budget;
    f->reserves++;
    f->refusals += no;
    if (!no)
        f->used += bytes;
    f->peak = f->used > f->peak ? f->used : f->peak;
    pthread_mutex_unlock(&f->mu);
    return no;
}

static void fs_release(void *ctx, size_t bytes)
{
    struct fshare *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->used -= bytes;
    f->releases++;
    pthread_mutex_unlock(&f->mu);
}

static void fs_set_budget(size_t budget)
{
    pthread_mutex_lock(&fs.mu);
    fs.budget = budget;
    pthread_mutex_unlock(&fs.mu);
}

/* Every slab's bytes are reserved before it is pinned and released after it
 * is unpinned; a refusal fails the waiting caller at once, as a spent budget
 * of its own does, and a later request asks again. */
static void test_shared_budget(void **state)
{
    (void)state;
    fs = (struct fshare){.mu = PTHREAD_MUTEX_INITIALIZER, .budget = 3 * G};
    struct sh_hostpool_params p = params3(2, 1, 0, 64 * M, M, 1);
    p.share = (struct sh_hostpool_share){.reserve = fs_reserve, .release = fs_release, .ctx = &fs};
    struct sh_hostpool *hp = mk(&p);
    /* Pre-pinning stops where the shared budget does, not at its targets. */
    struct sh_hostpool_stats st = hstats(hp);
    assert_int_equal(st.pinned_bytes, 2 * G);
    assert_int_equal(st.refused, 1);
    assert_int_equal(fs.used, 2 * G);
    struct sh_slab *a = get(hp, G, 0), *b = get(hp, G, 0);
    /* One more slab fits the shared budget: the grower pins it for the caller. */
    struct sh_slab *c = get(hp, G, 2000);
    assert_int_equal(fs.used, 3 * G);
    /* Then it is spent: refused without waiting out the 2 s. */
    struct sh_slab *x = NULL;
    double t0 = now_ms();
    assert_int_equal(sh_hostpool_get(hp, G, 2000, &x), SH_ENOMEM);
    assert_true(now_ms() - t0 < 1000);
    assert_null(x);
    st = hstats(hp);
    assert_int_equal(st.pinned_bytes, 3 * G);
    assert_true(st.refused >= 2); /* and maybe the grower, towards its targets */
    /* Another process left: the next request asks again and gets its slab. */
    fs_set_budget(5 * G);
    struct sh_slab *d = get(hp, G, 2000);
    st = hstats(hp); /* growth towards the targets resumes, within the budget */
    assert_true(st.pinned_bytes >= 4 * G && st.pinned_bytes <= 5 * G);
    sh_hostpool_put(hp, a);
    sh_hostpool_put(hp, b);
    sh_hostpool_put(hp, c);
    sh_hostpool_put(hp, d);
    destroy(hp);
    /* Every byte was reserved before it was pinned, and all given back. */
    assert_true(fs.peak <= 5 * G);
    assert_true((size_t)fk.host_peak <= fs.peak);
    assert_int_equal(fs.used, 0);
    assert_int_equal(fs.releases, fk.creates);
    books_balance();
}

/* Two pools on one budget (two devices' in a process): one pool's idle
 * slabs are given back for a slab the other's caller waits for, never for
 * the other's growth towards its targets. */
struct pshare {
    struct sh_hostpool *other;
    int reclaims;
};

static int ps_reserve(void *ctx, size_t bytes)
{
    (void)ctx;
    return fs_reserve(&fs, bytes);
}

static void ps_release(void *ctx, size_t bytes)
{
    (void)ctx;
    fs_release(&fs, bytes);
}

static int ps_reclaim(void *ctx, size_t bytes)
{
    struct pshare *ps = ctx;
    __atomic_fetch_add(&ps->reclaims, 1, __ATOMIC_SEQ_CST);
    struct sh_hostpool *other = __atomic_load_n(&ps->other, __ATOMIC_ACQUIRE);
    return other && sh_hostpool_shed(other, bytes) > 0;
}

/* Until the shared budget has refused hp n slabs it grew towards its
 * targets or was asked for (its grower's attempt has ended: its figures
 * hold still). */
static void await_refused(struct sh_hostpool *hp, uint64_t n)
{
    for (int i = 0; i < 5000 && hstats(hp).refused < n; i++)
        usleep(1000);
    assert_true(hstats(hp).refused >= n);
}

static void test_pools_share_idle_slabs(void **state)
{
    (void)state;
    fs = (struct fshare){.mu = PTHREAD_MUTEX_INITIALIZER, .budget = 4 * G};
    struct pshare for_a = {0}, for_b = {0};
    struct sh_hostpool_params pa = params3(4, 0, 0, 64 * M, 4 * G, 1);
    pa.share = (struct sh_hostpool_share){ps_reserve, ps_release, ps_reclaim, &for_a};
    struct sh_hostpool *a = mk(&pa);
    assert_int_equal(hstats(a).pinned_bytes, 4 * G); /* the whole budget, kept ready */
    /* A slab taken asks a's grower to grow back: refused, it stops growing
     * towards its targets until a growth succeeds. */
    struct sh_slab *t = get(a, G, 0);
    await_refused(a, 1);
    sh_hostpool_put(a, t);
    struct sh_hostpool_params pb = params3(2, 0, 0, 64 * M, 2 * G, 1);
    pb.share = (struct sh_hostpool_share){ps_reserve, ps_release, ps_reclaim, &for_b};
    struct sh_hostpool *b = NULL;
    assert_int_equal(sh_hostpool_create(&pb, &ops, &b), 0);
    __atomic_store_n(&for_a.other, b, __ATOMIC_RELEASE);
    __atomic_store_n(&for_b.other, a, __ATOMIC_RELEASE);
    /* Pre-pinning takes nothing from a: b starts with nothing. */
    assert_int_equal(hstats(b).pinned_bytes, 0);
    assert_int_equal(for_b.reclaims, 0);
    /* A caller of b waits for a slab: a gives back one idle slab for it.
     * (Refused first; and b's growth towards its targets after, which
     * takes nothing from a.) */
    assert_int_equal(hstats(b).refused, 1); /* its pre-pinning */
    struct sh_slab *b1 = get(b, G, 2000);
    await_refused(b, 2);
    assert_int_equal(hstats(a).pinned_bytes, 3 * G);
    assert_int_equal(hstats(a).shed, G);
    assert_int_equal(hstats(b).pinned_bytes, G);
    /* a's callers take what it has left: a does not grow back towards its
     * targets at b's expense. */
    struct sh_slab *a1 = get(a, G, 0), *a2 = get(a, G, 0), *a3 = get(a, G, 0);
    assert_int_equal(hstats(b).pinned_bytes, G);
    assert_int_equal(hstats(b).shed, 0);
    /* Nothing idle anywhere: a caller of b is refused, and nothing moved. */
    struct sh_slab *x = NULL;
    assert_int_equal(sh_hostpool_get(b, G, 2000, &x), SH_ENOMEM);
    assert_null(x);
    assert_int_equal(hstats(a).pinned_bytes + hstats(b).pinned_bytes, 4 * G);
    /* b's slab comes back idle: a caller of a gets it through a's grower. */
    sh_hostpool_put(b, b1);
    struct sh_slab *a4 = get(a, G, 2000);
    assert_int_equal(hstats(b).shed, G);
    sh_hostpool_put(a, a1);
    sh_hostpool_put(a, a2);
    sh_hostpool_put(a, a3);
    sh_hostpool_put(a, a4);
    __atomic_store_n(&for_a.other, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&for_b.other, NULL, __ATOMIC_RELEASE);
    sh_hostpool_destroy(b);
    destroy(a);
    assert_true(fs.peak <= 4 * G); /* the two never pinned more together */
    assert_int_equal(fs.used, 0);
    books_balance();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shared_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pools_share_idle_slabs, setup, teardown),
    };
    return cmocka_run_group_tests_name("hostpool_share", tests, NULL, NULL);
}
