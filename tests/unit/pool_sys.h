/* pool_sys.h — the pool under test with its collaborators (host slab pool,
 * copy engine, gate) over the fake VMM of fake_vmm.h, and the helpers the
 * pool tests share. Each test file brings its own copy streams.
 * Include it once, after fake_vmm.h. */
#ifndef SH_TESTS_POOL_SYS_H
#define SH_TESTS_POOL_SYS_H

/* Every stream-ordered free has been reached: these tests free at once. */
static int fe_done(void *ctx, uint64_t fence)
{
    (void)ctx;
    (void)fence;
    return 1;
}

static void fe_wait(void *ctx, uint64_t fence)
{
    (void)ctx;
    (void)fence;
}

static void fe_drop(void *ctx, uint64_t fence)
{
    (void)ctx;
    (void)fence;
}

static const struct sh_fence_ops fences = {NULL, fe_done, fe_wait, fe_drop};

static struct {
    struct sh_pool *pool;
    struct sh_hostpool *host;
    struct sh_xfer *xfer;
    struct sh_gate *gate;
} sys;

/* The fingerprint (clean regions, early evictions) on the CPU over the
 * bytes the fake maps (its memory is real), counted; fail makes every call
 * fail. */
static struct {
    struct sh_clean_key key;
    int calls, ranges, fail;
    /* Queued ones (opts.queue_fp): taken at queue time, as the fake copy
     * streams run each copy as it is queued; held by ticket until taken. */
    int queued, outstanding, fail_queue, fail_take;
    struct sh_clean_fp held[64][8];
    size_t held_n[64];
} fpk;

static int fake_fingerprint(void *ctx, const uintptr_t *addr, const size_t *len, size_t n,
                            struct sh_clean_fp *out, uint64_t bus[2])
{
    (void)ctx;
    (void)bus; /* on the CPU: nothing crosses a bus */
    fpk.calls++;
    if (fpk.fail)
        return SH_EDRIVER;
    for (size_t i = 0; i < n; i++)
        out[i] = sh_clean_hash(&fpk.key, (const void *)addr[i], len[i]);
    fpk.ranges += (int)n;
    return 0;
}

static int fake_fp_queue(void *ctx, const uintptr_t *addr, const size_t *len, size_t n, int dir,
                         uint64_t *ticket, uint64_t bus[2])
{
    (void)dir;
    size_t t = 0;
    while (t < 64 && fpk.held_n[t])
        t++;
    if (fpk.fail_queue || t == 64 || n > 8)
        return SH_EDRIVER;
    fpk.calls--; /* counted as queued, not as waited for */
    int rc = fake_fingerprint(ctx, addr, len, n, fpk.held[t], bus);
    if (rc)
        return rc;
    fpk.held_n[t] = n;
    fpk.queued++;
    fpk.outstanding++;
    *ticket = t + 1;
    return 0;
}

static int fake_fp_take(void *ctx, uint64_t ticket, size_t n, struct sh_clean_fp *out)
{
    (void)ctx;
    assert_true(ticket >= 1 && ticket <= 64 && fpk.held_n[ticket - 1] == n);
    if (out)
        memcpy(out, fpk.held[ticket - 1], n * sizeof *out);
    fpk.held_n[ticket - 1] = 0;
    fpk.outstanding--;
    return out && fpk.fail_take ? SH_EDRIVER : 0;
}

/* The pointer prefilter on the CPU over the "device" bytes (host memory
 * here), as the kernel computes it; prefilter_fails makes it fail;
 * prefilter_calls counts its launches. */
static int prefilter_fails, prefilter_calls;

static int fake_ptr_candidates(void *ctx, const uintptr_t *addr, const size_t *len, size_t n,
                               uintptr_t lo, uintptr_t hi, unsigned char *found, uint64_t bus[2])
{
    (void)ctx;
    (void)bus;
    prefilter_calls++;
    if (prefilter_fails || hi <= lo)
        return SH_EDRIVER;
    uint32_t top = (uint32_t)((uint64_t)lo >> 32);
    uint32_t span = (uint32_t)((uint64_t)(hi - 1) >> 32) - top;
    for (size_t i = 0; i < n; i++)
        found[i] =
            (unsigned char)sh_clean_ptr_candidate((const uint32_t *)addr[i], len[i] / 4, top, span);
    return 0;
}

struct opts {
    int prefilter; /* the pointer prefilter above */
    int clean;     /* clean_skip: the fake fingerprint above */
    int queue_fp;  /* early evictions queue their start's fingerprints */
    size_t device_cache;
    int checksums;
    int verify_moves, plant_lost_write;
    unsigned slabs[3]; /* slabs of 64K, 128K, 256K pinned at start */
    /* drain_mode = tracked, when set */
    int (*drain_streams)(void *ctx, uint64_t mask);
    int (*streams_idle)(void *ctx, uint64_t mask);
    int (*capturing)(void); /* a stream captures: no window opens */
};

static void sys_start(const struct opts *o, const struct sh_copy_ops *copy)
{
    pthread_mutex_destroy(&fk.mu);
    memset(&fk, 0, sizeof fk);
    pthread_mutex_init(&fk.mu, NULL);
    atomic_store(&launching, 0);
    memset(&sys, 0, sizeof sys);
    struct sh_hostpool_params hp = {.granularity = G,
                                    .class_bytes = {G, 2 * G, 4 * G},
                                    .slabs = {o->slabs[0], o->slabs[1], o->slabs[2]},
                                    .nclasses = 3,
                                    .ram_budget =
                                        (o->slabs[0] + 2 * o->slabs[1] + 4 * o->slabs[2]) * G,
                                    .prepin = 64 * M};
    assert_int_equal(sh_hostpool_create(&hp, &vmm, &sys.host), 0);
    assert_int_equal(sh_xfer_create(copy, 2, 2, &sys.xfer), 0);
    assert_int_equal(sh_gate_create(&sys.gate), 0);
    struct sh_pool_params p = {.granularity = G,
                               .max_chunk = CH,
                               .va_block = 16 * M,
                               .va_cache = 16 * M,
                               .device_cache = o->device_cache};
    assert_int_equal(sh_pool_create(&p, &vmm, &fences, &sys.pool), 0);
    struct sh_pool_mover m = {.host = sys.host,
                              .xfer = sys.xfer,
                              .gate = sys.gate,
                              .checksums = o->checksums,
                              .verify_moves = o->verify_moves,
                              .plant_lost_write = o->plant_lost_write,
                              .drain_streams = o->drain_streams,
                              .streams_idle = o->streams_idle,
                              .capturing = o->capturing,
                              .slab_wait_ms = 100,
                              .fingerprint = fake_fingerprint,
                              .fingerprint_queue = o->queue_fp ? fake_fp_queue : NULL,
                              .fingerprint_take = o->queue_fp ? fake_fp_take : NULL,
                              .ptr_candidates = o->prefilter ? fake_ptr_candidates : NULL,
                              .clean_skip = o->clean};
    memset(&fpk, 0, sizeof fpk);
    prefilter_fails = 0;
    for (size_t i = 0; i < sizeof fpk.key.nh / sizeof fpk.key.nh[0]; i++)
        fpk.key.nh[i] = (uint32_t)(i * 2654435761u);
    fpk.key.sip[0] = fpk.key.fin[1] = 0x0123456789abcdefull;
    sh_pool_set_mover(sys.pool, &m);
}

/* Slabs taken from the host pool and not given back. */
static inline unsigned slabs_out(void)
{
    struct sh_hostpool_stats hs;
    sh_hostpool_stats(sys.host, &hs);
    unsigned out = 0;
    for (unsigned c = 0; c < hs.nclasses; c++)
        out += hs.class_total[c] - hs.class_free[c];
    return out;
}

/* Every slab the host pool pinned is back on its free lists: the pool,
 * destroyed, gave back every slab its regions held, so one still out was
 * lost on the way (and would stay pinned for the process's life). */
static void assert_slabs_back(void)
{
    struct sh_hostpool_stats hs;
    sh_hostpool_stats(sys.host, &hs);
    for (unsigned c = 0; c < hs.nclasses; c++)
        assert_int_equal(hs.class_free[c], hs.class_total[c]);
}

/* Tears down and checks that no slab, handle, mapping or reservation is
 * left. */
static void stop(void)
{
    sh_pool_destroy(sys.pool);
    sys.pool = NULL;
    assert_slabs_back();
    sh_hostpool_destroy(sys.host);
    sh_xfer_destroy(sys.xfer);
    sh_gate_destroy(sys.gate);
    memset(&sys, 0, sizeof sys);
    assert_int_equal(fk.bad, 0);
    assert_int_equal(fk.nm, 0);
    assert_int_equal(fk.nr, 0);
    assert_int_equal(fk.live[SH_LOC_DEVICE], 0);
    assert_int_equal(fk.live[SH_LOC_HOST], 0);
    assert_int_equal(fpk.outstanding, 0); /* every queued fingerprint taken once */
}

/* After a test that failed midway: tear down without checking. */
static void sys_teardown(void)
{
    fk.fail_map_at = fk.fail_unmap_at = 0;
    fk.device_limit = 0;
    if (sys.pool)
        sh_pool_destroy(sys.pool);
    if (sys.host)
        sh_hostpool_destroy(sys.host);
    if (sys.xfer)
        sh_xfer_destroy(sys.xfer);
    if (sys.gate)
        sh_gate_destroy(sys.gate);
    memset(&sys, 0, sizeof sys);
}

static uintptr_t alloc(size_t size)
{
    uintptr_t va = 0;
    assert_int_equal(sh_pool_alloc(sys.pool, size, SH_PATH_MALLOC, 0, &va), 0);
    return va;
}

static uint32_t word(uint32_t seed, size_t i)
{
    return seed * 2654435761u + (uint32_t)i;
}

static void fill(uintptr_t va, size_t size, uint32_t seed)
{
    uint32_t *p = (uint32_t *)va;
    for (size_t i = 0; i < size / 4; i++)
        p[i] = word(seed, i);
}

static size_t bad_words(uintptr_t va, size_t size, uint32_t seed)
{
    const uint32_t *p = (const uint32_t *)va;
    size_t bad = 0;
    for (size_t i = 0; i < size / 4; i++)
        bad += p[i] != word(seed, i);
    return bad;
}

/* The region's state, -1 when there is none at va. */
static int state_of(uintptr_t va)
{
    struct sh_region_info ri;
    if (sh_pool_lookup(sys.pool, va, &ri) != 0)
        return -1;
    return ri.state;
}

static inline struct sh_pool_stats pstats(void)
{
    struct sh_pool_stats st;
    sh_pool_stats(sys.pool, &st);
    return st;
}

/* Work using va is issued, inside the gate (the stamp the moves read). */
static inline void issue(uintptr_t va)
{
    sh_pool_issued(sys.pool, &va, 1, 0);
}

/* The region at va goes to the host in a window of its own. */
static inline void evict_one(uintptr_t va)
{
    size_t released = 0, n = 0;
    uintptr_t out[1];
    assert_int_equal(sh_pool_evict_these(sys.pool, &va, 1, &released, out, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(state_of(va), SH_RS_HOST);
}

#endif
