/* test_peermap.c — several devices' bookkeeping (interpose/peermap.c),
 * over a fake driver that records every cuMemSetAccess and every context
 * it is asked to wait for.
 *
 * A device that opened the managed one gets access on every listed
 * mapping when its first link appears and loses it with its last; a new
 * mapping gets the managed device's access and every peer's; links to
 * other devices, from the managed device, or repeated, change nothing; a
 * mapping whose access fails is not listed; the table keeps thousands of
 * mappings through removals; drains wait for each noted context once,
 * never the managed one, past failures, in any number; and for each
 * context the program created on the managed device until it is
 * destroyed; with nothing noted they wait for nothing. With a second
 * managed device, links and grants are per device and each device's drain
 * waits for the other's context. The module's state
 * is the process's, so the tests run in order and each undoes its links.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "interpose/driver.h"
#include "interpose/peermap.h"

#include <stdlib.h>
#include <string.h>

#define MANAGED 1
#define CALLS   8192

/* ---- the fake driver ---- */

struct call {
    uintptr_t va;
    size_t size, count;
    CUmemAccessDesc desc[4];
};

static struct call calls[CALLS];
static size_t ncalls;
static uintptr_t fail_va; /* cuMemSetAccess fails there */
static CUcontext pushed[256], synced[256], fail_push, fail_sync;
static size_t npushed, nsynced;
static CUcontext top;

static CUresult fake_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *d, size_t n)
{
    if (va == fail_va)
        return CUDA_ERROR_INVALID_VALUE;
    assert_true(ncalls < CALLS);
    struct call *c = &calls[ncalls++];
    c->va = va;
    c->size = size;
    c->count = n;
    memcpy(c->desc, d, (n < 4 ? n : 4) * sizeof *d);
    return CUDA_SUCCESS;
}

static CUresult fake_push(CUcontext c)
{
    if (c == fail_push)
        return CUDA_ERROR_INVALID_CONTEXT;
    pushed[npushed++] = c;
    top = c;
    return CUDA_SUCCESS;
}

static CUresult fake_sync(void)
{
    synced[nsynced++] = top;
    return top == fail_sync ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

static CUresult fake_pop(CUcontext *c)
{
    if (c)
        *c = top;
    top = NULL;
    return CUDA_SUCCESS;
}

static struct sh_driver drv;

static CUcontext ctx(uintptr_t n)
{
    return (CUcontext)(0x1000 + n * 0x100);
}

static void reset_calls(void)
{
    ncalls = npushed = nsynced = 0;
    fail_va = 0;
    fail_push = fail_sync = NULL;
}

static int setup(void **state)
{
    (void)state;
    memset(&drv, 0, sizeof drv);
    drv.cuMemSetAccess = fake_set_access;
    drv.cuCtxPushCurrent = fake_push;
    drv.cuCtxSynchronize = fake_sync;
    drv.cuCtxPopCurrent = fake_pop;
    drv.ctx = ctx(MANAGED);
    drv.several = 1;
    return 0;
}

static int before(void **state)
{
    (void)state;
    reset_calls();
    return 0;
}

/* The one access call made for va: its flags for dev, -1 if dev is not in it. */
static int flags_for(const struct call *c, int dev)
{
    for (size_t i = 0; i < c->count && i < 4; i++)
        if (c->desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
            c->desc[i].location.id == dev)
            return (int)c->desc[i].flags;
    return -1;
}

static const struct call *call_at(uintptr_t va)
{
    const struct call *found = NULL;
    for (size_t i = 0; i < ncalls; i++)
        if (calls[i].va == va) {
            assert_null(found); /* one call per mapping */
            found = &calls[i];
        }
    assert_non_null(found);
    return found;
}

/* ---- the tests ---- */

/* Links recorded before the library picks its device count once it has:
 * a mapping made afterwards opens to the peer, and drains wait for it. */
static void link_before_start(void **state)
{
    (void)state;
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 1);
    assert_int_equal(ncalls, 0);
    sh_peers_manage(MANAGED, NULL, 1);
    assert_int_equal(sh_peers_mapped(&drv, MANAGED, 0x200000, 0x200000), CUDA_SUCCESS);
    const struct call *c = call_at(0x200000);
    assert_int_equal(c->count, 2);
    assert_int_equal(flags_for(c, MANAGED), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(flags_for(c, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    sh_peers_sync(&drv);
    assert_int_equal(nsynced, 1);
    assert_ptr_equal(synced[0], ctx(0));
    reset_calls();
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 0);
    assert_int_equal(call_at(0x200000)->desc[0].flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    sh_peers_listed(MANAGED, 0x200000, 0x200000, 0);
    assert_int_equal(sh_peers_mappings(), 0);
}

/* The first link from a device grants, its last revokes; other links,
 * repeats and links that do not reach the managed device change nothing. */
static void first_link_grants_last_revokes(void **state)
{
    (void)state;
    const uintptr_t a = 0x10000000, b = 0x20000000;
    assert_int_equal(sh_peers_mapped(&drv, MANAGED, a, 0x400000), CUDA_SUCCESS);
    assert_int_equal(call_at(a)->count, 1); /* the managed device alone */
    assert_int_equal(flags_for(call_at(a), MANAGED), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    reset_calls();
    sh_peers_link(&drv, ctx(2), 2, 0, 1);       /* another pair of devices */
    sh_peers_link(&drv, ctx(MANAGED), 1, 0, 1); /* the managed device opens device 0 */
    sh_peers_link(&drv, ctx(3), 3, 3, 1);       /* not a pair */
    assert_int_equal(ncalls, 0);

    sh_peers_link(&drv, ctx(0), 0, MANAGED, 1);
    assert_int_equal(ncalls, 1);
    assert_int_equal(call_at(a)->size, 0x400000);
    assert_int_equal(flags_for(call_at(a), 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    reset_calls();
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 1);  /* again: already enabled */
    sh_peers_link(&drv, ctx(10), 0, MANAGED, 1); /* a second context on device 0 */
    assert_int_equal(ncalls, 0);
    assert_int_equal(sh_peers_mapped(&drv, MANAGED, b, 0x200000), CUDA_SUCCESS);
    assert_int_equal(call_at(b)->count, 2); /* device 0 once, however many links */
    assert_int_equal(flags_for(call_at(b), 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    reset_calls();

    sh_peers_link(&drv, ctx(0), 0, MANAGED, 0);
    assert_int_equal(ncalls, 0); /* ctx(10) still has it */
    sh_peers_link(&drv, ctx(10), 0, MANAGED, 0);
    assert_int_equal(ncalls, 2);
    assert_int_equal(flags_for(call_at(a), 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(flags_for(call_at(b), 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    reset_calls();
    sh_peers_link(&drv, ctx(10), 0, MANAGED, 0); /* not enabled: nothing */
    assert_int_equal(ncalls, 0);

    /* an unlisted mapping is left alone */
    sh_peers_listed(MANAGED, a, 0x400000, 0);
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 1);
    assert_int_equal(ncalls, 1);
    assert_int_equal(call_at(b)->va, b);
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 0);
    sh_peers_link(&drv, ctx(2), 2, 0, 0);
    sh_peers_link(&drv, ctx(MANAGED), 1, 0, 0);
    sh_peers_listed(MANAGED, b, 0x200000, 0);
    assert_int_equal(sh_peers_mappings(), 0);
}

/* With one device nothing is granted, whatever the program links. */
static void one_device_grants_nothing(void **state)
{
    (void)state;
    sh_peers_manage(MANAGED, NULL, 0);
    sh_peers_listed(MANAGED, 0x30000000, 0x200000, 1);
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 1);
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 0);
    assert_int_equal(ncalls, 0);
    sh_peers_listed(MANAGED, 0x30000000, 0x200000, 0);
    sh_peers_manage(MANAGED, NULL, 1);
}

/* A mapping whose access cannot be set is not listed. */
static void failed_access_is_not_listed(void **state)
{
    (void)state;
    fail_va = 0x40000000;
    assert_int_not_equal(sh_peers_mapped(&drv, MANAGED, fail_va, 0x200000), CUDA_SUCCESS);
    assert_int_equal(sh_peers_mappings(), 0);
    fail_va = 0;
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 1);
    assert_int_equal(ncalls, 0);
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 0);
}

/* Thousands of mappings, half removed and some made again at the same
 * addresses: a grant reaches each live one exactly once. */
static void table_keeps_every_mapping(void **state)
{
    (void)state;
    enum { N = 3000 };
    for (uintptr_t i = 0; i < N; i++)
        assert_int_equal(sh_peers_mapped(&drv, MANAGED, (i + 1) << 21, 1 << 21), CUDA_SUCCESS);
    for (uintptr_t i = 0; i < N; i += 2)
        sh_peers_listed(MANAGED, (i + 1) << 21, 1 << 21, 0);
    for (uintptr_t i = 0; i < N; i += 4)
        sh_peers_listed(MANAGED, (i + 1) << 21, 1 << 21, 1);
    sh_peers_listed(MANAGED, 2 << 21, 1 << 21, 1); /* listed already: still once */
    size_t live = N / 2 + N / 4;
    assert_int_equal(sh_peers_mappings(), live);
    reset_calls();
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 1);
    assert_int_equal(ncalls, live);
    for (uintptr_t i = 0; i < N; i++) {
        int want = i % 2 == 1 || i % 4 == 0;
        size_t seen = 0;
        for (size_t k = 0; k < ncalls; k++)
            seen += calls[k].va == (i + 1) << 21;
        assert_int_equal(seen, want);
    }
    sh_peers_link(&drv, ctx(0), 0, MANAGED, 0);
    for (uintptr_t i = 0; i < N; i++)
        sh_peers_listed(MANAGED, (i + 1) << 21, 1 << 21, 0);
    assert_int_equal(sh_peers_mappings(), 0);
}

/* Drains wait for each noted context once, never the managed one, on past
 * a context that cannot be made current or fails its wait. */
static void sync_waits_for_noted_contexts(void **state)
{
    (void)state;
    sh_peers_note(ctx(20));
    sh_peers_note(ctx(20));
    sh_peers_note(ctx(MANAGED));
    sh_peers_note(ctx(21));
    fail_push = ctx(20);
    fail_sync = ctx(21);
    sh_peers_sync(&drv);
    size_t s20 = 0, s21 = 0, sm = 0;
    for (size_t i = 0; i < nsynced; i++) {
        s20 += synced[i] == ctx(20);
        s21 += synced[i] == ctx(21);
        sm += synced[i] == ctx(MANAGED);
    }
    assert_int_equal(s20, 0); /* could not be made current */
    assert_int_equal(s21, 1);
    assert_int_equal(sm, 0);
    for (size_t i = 0; i < npushed; i++)
        assert_ptr_not_equal(pushed[i], ctx(MANAGED));
    assert_null(top); /* every push popped */

    /* more contexts than one batch: each waited for once */
    for (uintptr_t i = 100; i < 140; i++)
        sh_peers_note(ctx(i));
    reset_calls();
    sh_peers_sync(&drv);
    for (uintptr_t i = 100; i < 140; i++) {
        size_t seen = 0;
        for (size_t k = 0; k < nsynced; k++)
            seen += synced[k] == ctx(i);
        assert_int_equal(seen, 1);
    }
}

/* Contexts the program created on the managed device are waited for;
 * one on another device is not (its kernels reach regions only through
 * peer access, noted as a link); a destroyed one is forgotten. */
static void created_contexts_waited_until_destroyed(void **state)
{
    (void)state;
    unsigned gen = sh_peers_generation();
    sh_peers_own(ctx(200), MANAGED);
    sh_peers_own(ctx(201), 0);
    assert_true(sh_peers_waiting());
    sh_peers_sync(&drv);
    size_t s200 = 0, s201 = 0;
    for (size_t i = 0; i < nsynced; i++) {
        s200 += synced[i] == ctx(200);
        s201 += synced[i] == ctx(201);
    }
    assert_int_equal(s200, 1);
    assert_int_equal(s201, 0);
    sh_peers_destroying(1);
    sh_peers_forget(ctx(200));
    sh_peers_destroying(0);
    assert_int_not_equal(sh_peers_generation(), gen);
    reset_calls();
    sh_peers_sync(&drv);
    for (size_t i = 0; i < nsynced; i++)
        assert_ptr_not_equal(synced[i], ctx(200));
}

/* Nothing noted: a drain's wait for other contexts costs one load. */
static void nothing_noted_nothing_waited(void **state)
{
    (void)state;
    assert_false(sh_peers_waiting());
    sh_peers_sync(&drv);
    assert_int_equal(npushed, 0);
    assert_int_equal(nsynced, 0);
}

static size_t synced_count(CUcontext c)
{
    size_t n = 0;
    for (size_t i = 0; i < nsynced; i++)
        n += synced[i] == c;
    return n;
}

/* A second managed device: a link to it opens its mappings only, a new
 * mapping on either gets the devices linked to it, and each device's
 * drain waits for the other's context (a copy on one's stream may read
 * the other's regions). Last: the managed devices stay. */
static void two_managed_devices(void **state)
{
    (void)state;
    const int other = 3;
    const uintptr_t x = 0x40000000, y = 0x40400000, z = 0x40800000, w = 0x40c00000;
    sh_peers_manage(MANAGED, ctx(MANAGED), 1);
    sh_peers_manage(other, ctx(other), 1);
    assert_int_equal(sh_peers_mapped(&drv, other, x, 0x200000), CUDA_SUCCESS);
    assert_int_equal(sh_peers_mapped(&drv, MANAGED, y, 0x200000), CUDA_SUCCESS);
    assert_int_equal(flags_for(call_at(x), other), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(flags_for(call_at(x), MANAGED), -1);
    reset_calls();
    sh_peers_link(&drv, ctx(0), 0, other, 1); /* device 0 opens the other */
    assert_int_equal(flags_for(call_at(x), 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    for (size_t i = 0; i < ncalls; i++)
        assert_int_not_equal(calls[i].va, y); /* the main device's are not opened */
    reset_calls();
    assert_int_equal(sh_peers_mapped(&drv, other, z, 0x200000), CUDA_SUCCESS);
    assert_int_equal(sh_peers_mapped(&drv, MANAGED, w, 0x200000), CUDA_SUCCESS);
    assert_int_equal(flags_for(call_at(z), 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(flags_for(call_at(w), 0), -1);
    assert_int_equal(flags_for(call_at(w), MANAGED), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

    reset_calls();
    sh_peers_sync_except(&drv, ctx(other)); /* the other device's drain */
    assert_int_equal(synced_count(ctx(MANAGED)), 1);
    assert_int_equal(synced_count(ctx(0)), 1);
    assert_int_equal(synced_count(ctx(other)), 0);
    reset_calls();
    sh_peers_sync(&drv); /* the main device's */
    assert_int_equal(synced_count(ctx(other)), 1);
    assert_int_equal(synced_count(ctx(MANAGED)), 0);

    reset_calls();
    sh_peers_link(&drv, ctx(0), 0, other, 0);
    assert_int_equal(flags_for(call_at(x), 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(flags_for(call_at(z), 0), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    sh_peers_listed(other, x, 0x200000, 0);
    sh_peers_listed(other, z, 0x200000, 0);
    sh_peers_listed(MANAGED, y, 0x200000, 0);
    sh_peers_listed(MANAGED, w, 0x200000, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(nothing_noted_nothing_waited, before),
        cmocka_unit_test_setup(link_before_start, before),
        cmocka_unit_test_setup(first_link_grants_last_revokes, before),
        cmocka_unit_test_setup(one_device_grants_nothing, before),
        cmocka_unit_test_setup(failed_access_is_not_listed, before),
        cmocka_unit_test_setup(table_keeps_every_mapping, before),
        cmocka_unit_test_setup(sync_waits_for_noted_contexts, before),
        cmocka_unit_test_setup(created_contexts_waited_until_destroyed, before),
        cmocka_unit_test_setup(two_managed_devices, before),
    };
    return cmocka_run_group_tests_name("peermap", tests, setup, NULL);
}
