/* test_evict.c — moving regions between device chunks and host slabs, with
 * the real pool, host slab pool, copy engine and gate over a fake VMM whose
 * handles are real memory.
 *
 * A handle is a memfd; reserving address space maps PROT_NONE; mapping a
 * handle at an address maps the memfd there (MAP_SHARED | MAP_FIXED), so a
 * slab mapped at its staging address and at a region's address shows the
 * same bytes at both, exactly as host-located VMM memory does. Copies are
 * memcpy. The fake checks the driver's contracts (a map lies inside a
 * reservation, overlaps nothing, uses a live handle of its exact size; an
 * unmap removes exactly one mapping; only unmapped handles are released)
 * and, while a test asks it to, that no map or unmap happens while a
 * launcher thread is inside the gate's read side.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "pool/pool.h"
#include "sh_err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_vmm.h"

/* ---- fake copy streams: synchronous memcpy ---------------------------------------- */

static int c_copy(void *ctx, int dir, uintptr_t dst, uintptr_t src, size_t n, uint64_t *token)
{
    (void)ctx;
    memcpy((void *)dst, (const void *)src, n);
    pthread_mutex_lock(&fk.mu);
    fk.copies[dir]++;
    fk.copy_bytes[dir] += n;
    if (dir == SH_D2H && fk.nd2h < MAXC) {
        fk.d2h_src[fk.nd2h] = src;
        fk.d2h_n[fk.nd2h++] = n;
    }
    *token = ++fk.next_token;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static int c_done(void *ctx, uint64_t token)
{
    (void)ctx;
    (void)token;
    return 1;
}

static int c_wait(void *ctx, uint64_t token)
{
    (void)ctx;
    (void)token;
    return 0;
}

static void c_forget(void *ctx, uint64_t token)
{
    (void)ctx;
    (void)token;
}

static int c_drain(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    fk.drains++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static const struct sh_copy_ops copy_ops = {NULL, c_copy, c_done, c_wait, c_forget, c_drain};

/* ---- the system under test ---------------------------------------------------------- */

#include "pool_sys.h"

static void start(const struct opts *o)
{
    sys_start(o, &copy_ops);
}

static int teardown(void **state)
{
    (void)state;
    sys_teardown();
    return 0;
}

static void touch(uintptr_t va)
{
    size_t host = 0;
    sh_pool_touch(sys.pool, &va, 1, &host);
}

static uint64_t id_of(uintptr_t va)
{
    struct sh_region_info ri;
    assert_int_equal(sh_pool_lookup(sys.pool, va, &ri), 0);
    return ri.id;
}

/* Where the bytes at va live: SH_LOC_DEVICE, SH_LOC_HOST, or -1 if unmapped. */
static int loc_at(uintptr_t va)
{
    pthread_mutex_lock(&fk.mu);
    int i = find_mapping(va);
    int loc = i < 0 ? -1 : fk.h[fk.m[i].h].loc;
    pthread_mutex_unlock(&fk.mu);
    return loc;
}

/* Every granule of [va, va+size) is backed from loc. */
static int all_at(uintptr_t va, size_t size, int loc)
{
    for (size_t off = 0; off < size; off += G)
        if (loc_at(va + off) != loc)
            return 0;
    return 1;
}

#define MAX_LIVE 256

static int by_last_use(const void *a, const void *b)
{
    const struct sh_pool_region_report *x = a, *y = b;
    return x->last_use < y->last_use ? -1 : x->last_use > y->last_use;
}

static int protects(const struct sh_pool_region_report *r, const uintptr_t *protect, size_t np)
{
    for (size_t i = 0; i < np; i++)
        if (protect[i] - r->va < r->mapped)
            return 1;
    return 0;
}

/* The pool never chooses victims: this stands for the policy. Freed
 * regions go first (trim), then the least recently used resident ones, never
 * one holding an address in protect[0..np), until need bytes are released.
 * 0, or SH_ENOMEM when nothing was. */
static int evict(size_t need, const uintptr_t *protect, size_t np, size_t *released)
{
    *released = sh_pool_trim(sys.pool, need);
    if (*released >= need)
        return 0;
    struct sh_pool_region_report r[MAX_LIVE];
    uintptr_t vas[MAX_LIVE], out[MAX_LIVE];
    size_t n = sh_pool_regions(sys.pool, r, MAX_LIVE), nv = 0, bytes = 0, got = 0, ne = 0;
    qsort(r, n, sizeof *r, by_last_use);
    for (size_t i = 0; i < n && *released + bytes < need; i++)
        if (r[i].state == SH_RS_RESIDENT && !protects(&r[i], protect, np)) {
            vas[nv++] = r[i].va;
            bytes += r[i].mapped;
        }
    if (nv && sh_pool_evict_these(sys.pool, vas, nv, &got, out, &ne) == 0)
        *released += got;
    return *released ? 0 : SH_ENOMEM;
}

static int restore1(uintptr_t va)
{
    return sh_pool_restore(sys.pool, &va, 1);
}

static struct sh_hostpool_stats hstats(void)
{
    struct sh_hostpool_stats st;
    sh_hostpool_stats(sys.host, &st);
    return st;
}

/* Runs fn with stderr going to a buffer. */
static void capture_stderr(void (*fn)(void *), void *arg, char *buf, size_t len)
{
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(tmp), STDERR_FILENO);
    fn(arg);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, len - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
}

static const struct opts plain = {.slabs = {8, 8, 8}};

/* ---- tests ---------------------------------------------------------------------------- */

static void test_evict_and_restore(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(2 * CH), c = alloc(2 * CH);
    fill(a, 2 * CH, 1);
    fill(b, 2 * CH, 2);
    fill(c, 2 * CH, 3);
    touch(a);
    touch(b);
    touch(c);
    assert_int_equal(fk.bytes[SH_LOC_DEVICE], 6 * CH);
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(released, 2 * CH);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(state_of(b), SH_RS_RESIDENT);
    assert_int_equal(state_of(c), SH_RS_RESIDENT);
    assert_true(all_at(a, 2 * CH, SH_LOC_HOST));
    assert_true(all_at(b, 2 * CH, SH_LOC_DEVICE));
    /* The device memory went back to the driver. */
    assert_int_equal(fk.bytes[SH_LOC_DEVICE], 4 * CH);
    assert_int_equal(pstats().device_bytes, 4 * CH);
    /* Copied once, chunk by chunk, from the region itself. */
    assert_int_equal(fk.copies[SH_D2H], 2);
    assert_int_equal(fk.copy_bytes[SH_D2H], 2 * CH);
    assert_int_equal(fk.d2h_src[0], a);
    assert_int_equal(fk.d2h_src[1], a + CH);
    assert_int_equal(fk.copies[SH_H2D], 0);
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.evicted_bytes, 2 * CH);
    assert_int_equal(st.host_bytes, 2 * CH);
    assert_int_equal(st.regions[SH_RS_HOST], 1);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 2);
    assert_int_equal(hstats().class_free[2], 6);
    assert_int_equal(sh_gate_windows(sys.gate), 1);
    assert_int_equal(fk.drains, 1);
    /* Evicted, it still reads and writes at the same address. */
    assert_int_equal(bad_words(a, 2 * CH, 1), 0);
    ((uint32_t *)a)[10] = 77;
    /* A launch that uses it learns what bringing it back costs. */
    uintptr_t addrs[3] = {a + 100, b, 12345};
    size_t host = 0;
    sh_pool_touch(sys.pool, addrs, 3, &host);
    assert_int_equal(host, 2 * CH);
    assert_int_equal(restore1(a + 5), 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_true(all_at(a, 2 * CH, SH_LOC_DEVICE));
    assert_int_equal(((uint32_t *)a)[10], 77);
    ((uint32_t *)a)[10] = word(1, 10);
    assert_int_equal(bad_words(a, 2 * CH, 1), 0);
    assert_int_equal(bad_words(b, 2 * CH, 2), 0);
    assert_int_equal(bad_words(c, 2 * CH, 3), 0);
    st = pstats();
    assert_int_equal(st.restores, 1);
    assert_int_equal(st.restored_bytes, 2 * CH);
    assert_int_equal(st.host_bytes, 0);
    assert_int_equal(st.regions[SH_RS_HOST], 0);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 3);
    assert_int_equal(fk.copies[SH_H2D], 2);
    assert_int_equal(hstats().class_free[2], 8); /* slabs back in the pool */
    assert_int_equal(fk.bytes[SH_LOC_DEVICE], 6 * CH);
    assert_int_equal(sh_gate_windows(sys.gate), 2);
    /* Restoring what is resident, or no region at all, does nothing. */
    assert_int_equal(restore1(b), 0);
    assert_int_equal(restore1(7), 0);
    assert_int_equal(sh_gate_windows(sys.gate), 2);
    assert_int_equal(pstats().restores, 1);
    stop();
}

static void test_mixed_chunks(void **state)
{
    (void)state;
    start(&plain);
    /* 448K: chunks of 256K, 128K and 64K, each its own slab class. */
    size_t size = 7 * G;
    uintptr_t a = alloc(size);
    fill(a, size, 9);
    struct sh_region_info ri;
    assert_int_equal(sh_pool_lookup(sys.pool, a, &ri), 0);
    assert_int_equal(ri.nchunks, 3);
    size_t released;
    assert_int_equal(evict(1, NULL, 0, &released), 0);
    assert_int_equal(released, size);
    struct sh_hostpool_stats hs = hstats();
    assert_int_equal(hs.class_free[0], 7);
    assert_int_equal(hs.class_free[1], 7);
    assert_int_equal(hs.class_free[2], 7);
    assert_int_equal(hs.fallbacks, 0);
    assert_true(all_at(a, size, SH_LOC_HOST));
    assert_int_equal(bad_words(a, size, 9), 0);
    assert_int_equal(restore1(a), 0);
    assert_int_equal(bad_words(a, size, 9), 0);
    assert_true(all_at(a, size, SH_LOC_DEVICE));
    stop();
}

static void test_lru_order(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t r[4];
    for (int i = 0; i < 4; i++) {
        r[i] = alloc(CH);
        fill(r[i], CH, 10u + (uint32_t)i);
    }
    /* Used in the order 3, 1, 0, 2: 3 is the least recently used. */
    touch(r[3]);
    touch(r[1]);
    touch(r[0]);
    touch(r[2]);
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(released, 2 * CH);
    assert_int_equal(state_of(r[3]), SH_RS_HOST);
    assert_int_equal(state_of(r[1]), SH_RS_HOST);
    assert_int_equal(state_of(r[0]), SH_RS_RESIDENT);
    assert_int_equal(state_of(r[2]), SH_RS_RESIDENT);
    /* A use moves a region to the back of the line. */
    touch(r[0]);
    assert_int_equal(evict(CH / 2, NULL, 0, &released), 0);
    assert_int_equal(released, CH); /* whole regions move */
    assert_int_equal(state_of(r[2]), SH_RS_HOST);
    assert_int_equal(state_of(r[0]), SH_RS_RESIDENT);
    for (int i = 0; i < 4; i++)
        assert_int_equal(bad_words(r[i], CH, 10u + (uint32_t)i), 0);
    /* Restoring several at once: one window. */
    uint64_t w = sh_gate_windows(sys.gate);
    uintptr_t back[3] = {r[1], r[2], r[3] + 8};
    assert_int_equal(sh_pool_restore(sys.pool, back, 3), 0);
    assert_int_equal(sh_gate_windows(sys.gate), w + 1);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(state_of(r[i]), SH_RS_RESIDENT);
        assert_int_equal(bad_words(r[i], CH, 10u + (uint32_t)i), 0);
    }
    assert_int_equal(pstats().restores, 3);
    stop();
}

/* A region just allocated, new or reused, is as recent as the last use:
 * the LRU takes the region used before it, not the fresh one. */
static void test_fresh_allocation_is_recent(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(CH), b = alloc(CH);
    fill(a, CH, 3);
    touch(a);
    touch(b);
    assert_int_equal(sh_pool_free(sys.pool, b, ANY, 0), 0);
    uintptr_t reused = alloc(CH), built = alloc(2 * CH);
    assert_int_equal(reused, b); /* the freed region, and its old age */
    size_t released;
    assert_int_equal(evict(CH, NULL, 0, &released), 0);
    assert_int_equal(released, CH);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(state_of(reused), SH_RS_RESIDENT);
    assert_int_equal(state_of(built), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, CH, 3), 0);
    stop();
}

static void test_protected(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(CH), b = alloc(CH), c = alloc(CH);
    touch(a);
    touch(b);
    touch(c);
    /* a is the oldest, but an interior pointer protects it. */
    uintptr_t p1[1] = {a + CH - 1};
    size_t released;
    assert_int_equal(evict(CH, p1, 1, &released), 0);
    assert_int_equal(released, CH);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(state_of(b), SH_RS_HOST);
    /* Everything resident is protected: nothing can go. */
    uintptr_t p2[2] = {c + 4, a};
    uint64_t w = sh_gate_windows(sys.gate);
    assert_int_equal(evict(CH, p2, 2, &released), SH_ENOMEM);
    assert_int_equal(released, 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(state_of(c), SH_RS_RESIDENT);
    assert_int_equal(sh_gate_windows(sys.gate), w); /* no window for nothing */
    assert_int_equal(pstats().evictions, 1);
    stop();
}

static int copied_from(uintptr_t va, size_t size)
{
    int n = 0;
    for (int i = 0; i < fk.nd2h; i++)
        n += fk.d2h_src[i] - va < size;
    return n;
}

static void test_freed_dropped_first(void **state)
{
    (void)state;
    struct opts o = plain;
    o.device_cache = 4 * M;
    start(&o);
    uintptr_t a = alloc(CH), f1 = alloc(2 * CH), f2 = alloc(2 * CH);
    fill(a, CH, 5);
    touch(f1);
    touch(f2);
    touch(a);
    assert_int_equal(sh_pool_free(sys.pool, f1, ANY, 0), 0);
    assert_int_equal(sh_pool_free(sys.pool, f2, ANY, 0), 0);
    assert_int_equal(pstats().regions[SH_RS_FREED], 2);
    assert_int_equal(fk.bytes[SH_LOC_DEVICE], 5 * CH); /* kept for reuse */
    size_t released;
    assert_int_equal(evict(4 * CH, NULL, 0, &released), 0);
    assert_int_equal(released, 4 * CH);
    assert_int_equal(fk.copies[SH_D2H], 0); /* never copied */
    assert_int_equal(state_of(f1), -1);
    assert_int_equal(state_of(f2), -1);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(pstats().regions[SH_RS_FREED], 0);
    assert_int_equal(pstats().evictions, 0);
    assert_int_equal(fk.bytes[SH_LOC_DEVICE], CH);
    /* Freed and live together: the freed one goes uncopied, then a. */
    uintptr_t f3 = alloc(CH);
    touch(f3);
    assert_int_equal(sh_pool_free(sys.pool, f3, ANY, 0), 0);
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(released, 2 * CH);
    assert_int_equal(fk.nd2h, 1);
    assert_int_equal(copied_from(a, CH), 1);
    assert_int_equal(copied_from(f3, CH), 0);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(fk.bytes[SH_LOC_DEVICE], 0);
    assert_int_equal(bad_words(a, CH, 5), 0);
    stop();
}

static void test_free_while_evicted(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(CH);
    fill(a, 2 * CH, 4);
    fill(b, CH, 6);
    touch(a);
    touch(b);
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(hstats().class_free[2], 6);
    size_t device = fk.bytes[SH_LOC_DEVICE];
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    /* Torn down where it lies: slabs back, nothing copied back, nothing mapped. */
    assert_int_equal(state_of(a), -1);
    assert_int_equal(hstats().class_free[2], 8);
    assert_int_equal(fk.copies[SH_H2D], 0);
    assert_int_equal(loc_at(a), -1);
    assert_int_equal(loc_at(a + CH), -1);
    assert_int_equal(fk.bytes[SH_LOC_DEVICE], device);
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.host_bytes, 0);
    assert_int_equal(st.regions[SH_RS_HOST], 0);
    assert_int_equal(st.regions[SH_RS_FREED], 0);
    assert_int_equal(st.frees, 1);
    assert_int_equal(st.restores, 0);
    /* The slabs serve the next eviction. */
    assert_int_equal(evict(CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(b), SH_RS_HOST);
    assert_int_equal(bad_words(b, CH, 6), 0);
    assert_int_equal(hstats().class_total[2], 8);
    stop();
}

struct restore_arg {
    uintptr_t va;
    int rc;
};

static void do_restore(void *arg)
{
    struct restore_arg *r = arg;
    r->rc = restore1(r->va);
}

static void test_checksums(void **state)
{
    (void)state;
    struct opts o = plain;
    o.checksums = 1;
    start(&o);
    uintptr_t a = alloc(2 * CH);
    fill(a, 2 * CH, 8);
    size_t released;
    char buf[4096];
    /* Untouched while evicted: verified clean, silently. */
    assert_int_equal(evict(1, NULL, 0, &released), 0);
    struct restore_arg ra = {a, -1};
    capture_stderr(do_restore, &ra, buf, sizeof buf);
    assert_int_equal(ra.rc, 0);
    assert_string_equal(buf, "");
    assert_int_equal(pstats().checksum_mismatches, 0);
    /* Written by work issued against it while evicted: a legitimate
     * change, not a mismatch. */
    assert_int_equal(evict(1, NULL, 0, &released), 0);
    sh_pool_issued(sys.pool, &a, 1, 0);
    ((unsigned char *)a)[CH + 12345] ^= 0x5a;
    capture_stderr(do_restore, &ra, buf, sizeof buf);
    assert_int_equal(ra.rc, 0);
    assert_string_equal(buf, "");
    assert_int_equal(pstats().checksum_mismatches, 0);
    ((unsigned char *)a)[CH + 12345] ^= 0x5a;
    /* A byte changed behind the library's back while evicted. */
    assert_int_equal(evict(1, NULL, 0, &released), 0);
    ((unsigned char *)a)[CH + 12345] ^= 0x5a;
    capture_stderr(do_restore, &ra, buf, sizeof buf);
    assert_int_equal(ra.rc, 0);
    assert_int_equal(pstats().checksum_mismatches, 1);
    char want[64];
    snprintf(want, sizeof want, "region %llu ", (unsigned long long)id_of(a));
    assert_non_null(strstr(buf, "stagehand: "));
    assert_non_null(strstr(buf, "checksum mismatch"));
    assert_non_null(strstr(buf, want));
    assert_non_null(strstr(buf, "+262144"));          /* the second chunk */
    assert_null(strchr(strchr(buf, '\n') + 1, '\n')); /* one line: one chunk changed */
    /* The write was the program's: it is kept. */
    assert_int_equal(bad_words(a, 2 * CH, 8), 1);
    ((unsigned char *)a)[CH + 12345] ^= 0x5a;
    assert_int_equal(bad_words(a, 2 * CH, 8), 0);
    stop();

    /* Without checksums the same change goes unremarked. */
    start(&plain);
    a = alloc(2 * CH);
    assert_int_equal(evict(1, NULL, 0, &released), 0);
    ((unsigned char *)a)[CH + 1] ^= 1;
    ra.va = a;
    capture_stderr(do_restore, &ra, buf, sizeof buf);
    assert_int_equal(ra.rc, 0);
    assert_string_equal(buf, "");
    assert_int_equal(pstats().checksum_mismatches, 0);
    stop();
}

static void test_host_exhausted(void **state)
{
    (void)state;
    struct opts o = {.slabs = {0, 0, 1}}; /* one 256K slab, and no more ever */
    start(&o);
    uintptr_t a = alloc(2 * CH), b = alloc(CH);
    fill(a, 2 * CH, 21);
    fill(b, CH, 22);
    touch(a);
    touch(b);
    size_t released;
    /* a needs two slabs: it stays where it is, whole. */
    assert_int_equal(evict(2 * CH, (const uintptr_t[]){b}, 1, &released), SH_ENOMEM);
    assert_int_equal(released, 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_true(all_at(a, 2 * CH, SH_LOC_DEVICE));
    assert_int_equal(hstats().class_free[2], 1); /* the slab it took came back */
    assert_int_equal(fk.copies[SH_D2H], 0);
    assert_int_equal(sh_gate_windows(sys.gate), 0);
    assert_int_equal(bad_words(a, 2 * CH, 21), 0);
    /* The least recently used does not fit, the next one does. */
    assert_int_equal(evict(3 * CH, NULL, 0, &released), 0);
    assert_int_equal(released, CH);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(state_of(b), SH_RS_HOST);
    assert_int_equal(hstats().class_free[2], 0);
    assert_int_equal(bad_words(a, 2 * CH, 21), 0);
    assert_int_equal(bad_words(b, CH, 22), 0);
    /* Now the host side is spent. */
    assert_int_equal(evict(CH, NULL, 0, &released), SH_ENOMEM);
    assert_int_equal(released, 0);
    assert_true(hstats().misses >= 2);
    stop();
}

static void test_restore_without_device_memory(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH);
    fill(a, 2 * CH, 31);
    size_t released;
    assert_int_equal(evict(1, NULL, 0, &released), 0);
    fk.device_limit = 1; /* the device is full */
    assert_int_equal(restore1(a), SH_ENOMEM);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_true(all_at(a, 2 * CH, SH_LOC_HOST));
    assert_int_equal(bad_words(a, 2 * CH, 31), 0);
    assert_int_equal(hstats().class_free[2], 6); /* still holding its slabs */
    assert_int_equal(pstats().host_bytes, 2 * CH);
    assert_int_equal(pstats().regions[SH_RS_HOST], 1);
    assert_int_equal(fk.live[SH_LOC_DEVICE], 0);
    fk.device_limit = 0;
    assert_int_equal(restore1(a), 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, 2 * CH, 31), 0);
    stop();
}

/* A map that fails halfway through a region's eviction must leave the whole
 * region on the device: the slabs go back to the pool, so none of them may
 * stay mapped at the region's address. */
static void test_evict_remap_failure(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(2 * CH);
    fill(a, 2 * CH, 41);
    fill(b, 2 * CH, 42);
    touch(a);
    touch(b);
    fk.fail_map_at = fk.map_calls + 2; /* the second chunk's */
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), SH_ENOMEM);
    assert_int_equal(released, 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_true(all_at(a, 2 * CH, SH_LOC_DEVICE));
    assert_int_equal(hstats().class_free[2], 8);
    assert_int_equal(bad_words(a, 2 * CH, 41), 0);
    /* The slabs now hold b: a must not see them. */
    touch(a);
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(b), SH_RS_HOST);
    memset((void *)b, 0xee, 2 * CH);
    assert_int_equal(bad_words(a, 2 * CH, 41), 0);
    /* And a can move later, intact. */
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(restore1(a), 0);
    assert_int_equal(bad_words(a, 2 * CH, 41), 0);
    assert_int_equal(pstats().evictions, 2);
    stop();
}

/* Likewise for restore: a region whose restore failed halfway stays on the
 * host, whole, and keeps its slabs. */
static void test_restore_remap_failure(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(2 * CH);
    fill(a, 2 * CH, 51);
    fill(b, 2 * CH, 52);
    touch(a);
    touch(b);
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(a), SH_RS_HOST);
    fk.fail_map_at = fk.map_calls + 2;
    struct restore_arg ra = {a, 0};
    char buf[1024];
    capture_stderr(do_restore, &ra, buf, sizeof buf);
    assert_int_equal(ra.rc, SH_EDRIVER);
    assert_non_null(strstr(buf, "stagehand: error: restore failed"));
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_true(all_at(a, 2 * CH, SH_LOC_HOST));
    assert_int_equal(hstats().class_free[2], 6);
    assert_int_equal(bad_words(a, 2 * CH, 51), 0);
    assert_int_equal(pstats().host_bytes, 2 * CH);
    assert_int_equal(pstats().restores, 0);
    /* Its slabs are not handed to anyone else. */
    touch(a);
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(b), SH_RS_HOST);
    memset((void *)b, 0xee, 2 * CH);
    assert_int_equal(bad_words(a, 2 * CH, 51), 0);
    assert_int_equal(restore1(a), 0);
    assert_int_equal(state_of(a), SH_RS_RESIDENT);
    assert_int_equal(bad_words(a, 2 * CH, 51), 0);
    stop();
}

/* A thread that is issuing work (holds the gate's read side) cannot open a
 * window: nothing moves, nothing is lost, and it does not deadlock. */
/* Two map failures in a row inside one remap are survived: the eviction
 * completes and no range is ever left unmapped. */
static void test_double_map_failure_recovered(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(2 * CH);
    fill(a, 2 * CH, 61);
    fill(b, 2 * CH, 62);
    touch(a);
    touch(b);
    fk.fail_map_at = fk.map_calls + 2; /* the second chunk's map and the map back */
    fk.fail_map_n = 2;
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    fk.fail_map_at = 0;
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_true(all_at(a, 2 * CH, SH_LOC_HOST));
    assert_int_equal(bad_words(a, 2 * CH, 61), 0);
    assert_int_equal(restore1(a), 0);
    assert_true(all_at(a, 2 * CH, SH_LOC_DEVICE));
    assert_int_equal(bad_words(a, 2 * CH, 61), 0);
    stop();
}

/* A restore that fails and whose rollback fails too (the driver refuses to
 * unmap from then on): the region keeps every handle and slab it holds, its
 * bytes stay right where its mappings say, nobody else is given its memory,
 * and freeing it releases everything. */
static void test_restore_rollback_failure(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(2 * CH);
    fill(a, 2 * CH, 71);
    fill(b, 2 * CH, 72);
    touch(a);
    touch(b);
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(a), SH_RS_HOST);
    fk.fail_unmap_at = fk.unmap_calls + 2; /* the second chunk's, and every one after */
    fk.fail_unmap_n = 1000000;
    struct restore_arg ra = {a, 0};
    char buf[2048];
    capture_stderr(do_restore, &ra, buf, sizeof buf);
    fk.fail_unmap_at = 0;
    assert_int_equal(ra.rc, SH_EDRIVER);
    assert_non_null(strstr(buf, "could not be undone"));
    assert_null(strstr(buf, "are lost"));
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_int_equal(bad_words(a, 2 * CH, 71), 0);
    /* It is never moved again, and nobody shares its memory. */
    assert_int_equal(restore1(a), 0);
    touch(a);
    touch(b);
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(b), SH_RS_HOST);
    memset((void *)b, 0xee, 2 * CH);
    uintptr_t c = alloc(2 * CH);
    memset((void *)c, 0xdd, 2 * CH);
    assert_int_equal(bad_words(a, 2 * CH, 71), 0);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    stop();
}

struct evict_arg {
    size_t need, released;
    int rc;
};

static void do_evict(void *arg)
{
    struct evict_arg *e = arg;
    e->rc = evict(e->need, NULL, 0, &e->released);
}

/* The driver maps nothing from the middle of an eviction on: both chunks of
 * a are left unmapped (holes), with their bytes on their device handles.
 * Nothing else moves while a hole stays (another move would make more),
 * work is told which ranges meet one, and once the driver maps again the
 * holes are filled with the bytes that were there. */
static void test_hole_kept_and_healed(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(2 * CH);
    fill(a, 2 * CH, 81);
    fill(b, 2 * CH, 82);
    touch(a);
    touch(b);
    fk.fail_map_at = fk.map_calls + 2; /* the second chunk's map, and every one after */
    fk.fail_map_n = 1000000;
    struct evict_arg e = {.need = 2 * CH};
    char buf[2048];
    capture_stderr(do_evict, &e, buf, sizeof buf);
    assert_int_equal(e.rc, SH_ENOMEM);
    assert_non_null(strstr(buf, "cannot map"));
    assert_int_equal(loc_at(a), -1);
    assert_int_equal(loc_at(a + CH), -1);
    assert_int_equal(sh_pool_heal(sys.pool), SH_ELOST);
    assert_int_equal(sh_pool_hole_in(sys.pool, a + CH + 5, a + CH + 9), 1);
    assert_int_equal(sh_pool_hole_in(sys.pool, b, b + 2 * CH - 1), 0);
    assert_int_equal(sh_pool_hole_in(sys.pool, b + 2 * CH - 1, a), 1); /* either order */
    /* No move while the hole stays. */
    long maps = fk.map_calls;
    assert_int_equal(evict(2 * CH, &a, 1, &e.released), SH_ENOMEM);
    assert_int_equal(e.released, 0);
    assert_int_equal(state_of(b), SH_RS_RESIDENT);
    assert_int_equal(fk.map_calls - maps, 2); /* only heal's tries */
    fk.fail_map_at = 0;
    assert_int_equal(sh_pool_heal(sys.pool), 0);
    assert_int_equal(sh_pool_hole_in(sys.pool, a, a + 2 * CH - 1), 0);
    assert_true(all_at(a, 2 * CH, SH_LOC_DEVICE));
    assert_int_equal(bad_words(a, 2 * CH, 81), 0);
    /* Stuck, a never moves again; the others do, and freeing a releases all. */
    assert_int_equal(evict(2 * CH, NULL, 0, &e.released), 0);
    assert_int_equal(state_of(b), SH_RS_HOST);
    assert_int_equal(bad_words(b, 2 * CH, 82), 0);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    stop();
}

/* Freed while a hole stays: its handles and slabs are released all the
 * same, and nothing is left unmapped behind. */
static void test_hole_freed(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH);
    fill(a, 2 * CH, 91);
    touch(a);
    fk.fail_map_at = fk.map_calls + 1;
    fk.fail_map_n = 1000000;
    struct evict_arg e = {.need = 2 * CH};
    char buf[2048];
    capture_stderr(do_evict, &e, buf, sizeof buf);
    assert_int_equal(sh_pool_heal(sys.pool), SH_ELOST);
    assert_int_equal(sh_pool_free(sys.pool, a, ANY, 0), 0);
    sh_pool_trim(sys.pool, 64 * M);
    assert_int_equal(sh_pool_heal(sys.pool), 0);
    fk.fail_map_at = 0;
    stop();
}

static void test_gate_held_by_caller(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(CH);
    fill(a, 2 * CH, 71);
    fill(b, CH, 72);
    touch(a);
    touch(b);
    size_t released;
    assert_int_equal(evict(2 * CH, NULL, 0, &released), 0);
    assert_int_equal(state_of(a), SH_RS_HOST);
    sh_gate_enter(sys.gate);
    assert_int_equal(restore1(a), SH_EBUSY);
    assert_int_equal(state_of(a), SH_RS_HOST);
    assert_true(all_at(a, 2 * CH, SH_LOC_HOST));
    assert_int_equal(hstats().class_free[2], 6);
    assert_int_equal(evict(CH, NULL, 0, &released), SH_ENOMEM);
    assert_int_equal(released, 0);
    assert_int_equal(state_of(b), SH_RS_RESIDENT);
    assert_true(all_at(b, CH, SH_LOC_DEVICE));
    assert_int_equal(hstats().class_free[2], 6);
    sh_gate_leave(sys.gate);
    /* Inside another device's gate, the same: this pool's window, or a
     * wait for its move_mu, could close a cycle with that gate's readers. */
    struct sh_gate *other = NULL;
    assert_int_equal(sh_gate_create(&other), 0);
    sh_gate_enter(other);
    assert_int_equal(restore1(a), SH_EBUSY);
    assert_int_equal(evict(CH, NULL, 0, &released), SH_ENOMEM);
    assert_int_equal(state_of(b), SH_RS_RESIDENT);
    sh_gate_leave(other);
    sh_gate_destroy(other);
    struct sh_pool_stats st = pstats();
    assert_int_equal(st.regions[SH_RS_HOST], 1);
    assert_int_equal(st.regions[SH_RS_RESIDENT], 1);
    assert_int_equal(st.regions[SH_RS_EVICTING] + st.regions[SH_RS_RESTORING], 0);
    assert_int_equal(sh_gate_windows(sys.gate), 1);
    assert_int_equal(bad_words(a, 2 * CH, 71), 0);
    assert_int_equal(restore1(a), 0);
    assert_int_equal(bad_words(a, 2 * CH, 71), 0);
    assert_int_equal(bad_words(b, CH, 72), 0);
    stop();
}

/* ---- no remap while a launch is being issued --------------------------------------- */

static atomic_int launcher_stop;
static atomic_long launches;

static void *launcher_main(void *arg)
{
    struct sh_gate *g = arg;
    while (!atomic_load(&launcher_stop)) {
        sh_gate_enter(g);
        atomic_fetch_add(&launching, 1);
        for (volatile int k = 0; k < 2000; k++)
            ;
        atomic_fetch_sub(&launching, 1);
        sh_gate_leave(g);
        atomic_fetch_add(&launches, 1);
    }
    return NULL;
}

static void test_no_remap_during_launch(void **state)
{
    (void)state;
    start(&plain);
    uintptr_t a = alloc(2 * CH), b = alloc(CH);
    fill(a, 2 * CH, 61);
    fill(b, CH, 62);
    atomic_store(&launcher_stop, 0);
    atomic_store(&launches, 0);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, launcher_main, sys.gate), 0);
    while (atomic_load(&launches) < 10)
        usleep(100);
    pthread_mutex_lock(&fk.mu);
    fk.checking = 1;
    pthread_mutex_unlock(&fk.mu);
    int failures = 0;
    for (int i = 0; i < 40; i++) {
        size_t released;
        touch(i % 2 ? a : b);
        failures += evict(CH, NULL, 0, &released) != 0;
        uintptr_t both[2] = {a, b};
        failures += sh_pool_restore(sys.pool, both, 2) != 0;
    }
    pthread_mutex_lock(&fk.mu);
    fk.checking = 0;
    pthread_mutex_unlock(&fk.mu);
    long before = atomic_load(&launches);
    usleep(5000);
    atomic_store(&launcher_stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(failures, 0);
    assert_int_equal(fk.remaps_during_launch, 0);
    assert_true(atomic_load(&launches) > before); /* the launchers were busy throughout */
    assert_int_equal(pstats().evictions, 40);
    assert_int_equal(pstats().restores, 40);
    assert_int_equal(sh_gate_windows(sys.gate), 80);
    assert_int_equal(fk.drains, 80);
    assert_int_equal(bad_words(a, 2 * CH, 61), 0);
    assert_int_equal(bad_words(b, CH, 62), 0);
    stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_evict_and_restore, teardown),
        cmocka_unit_test_teardown(test_mixed_chunks, teardown),
        cmocka_unit_test_teardown(test_lru_order, teardown),
        cmocka_unit_test_teardown(test_fresh_allocation_is_recent, teardown),
        cmocka_unit_test_teardown(test_protected, teardown),
        cmocka_unit_test_teardown(test_freed_dropped_first, teardown),
        cmocka_unit_test_teardown(test_free_while_evicted, teardown),
        cmocka_unit_test_teardown(test_checksums, teardown),
        cmocka_unit_test_teardown(test_host_exhausted, teardown),
        cmocka_unit_test_teardown(test_restore_without_device_memory, teardown),
        cmocka_unit_test_teardown(test_evict_remap_failure, teardown),
        cmocka_unit_test_teardown(test_restore_remap_failure, teardown),
        cmocka_unit_test_teardown(test_double_map_failure_recovered, teardown),
        cmocka_unit_test_teardown(test_restore_rollback_failure, teardown),
        cmocka_unit_test_teardown(test_hole_kept_and_healed, teardown),
        cmocka_unit_test_teardown(test_hole_freed, teardown),
        cmocka_unit_test_teardown(test_gate_held_by_caller, teardown),
        cmocka_unit_test_teardown(test_no_remap_during_launch, teardown),
    };
    return cmocka_run_group_tests_name("evict", tests, NULL, NULL);
}
