/* launch.c — seeing kernel launches: which regions each one points into.
 *
 * Launches reach sh_launch_begin/end from the CUPTI callbacks (cupti.c) or,
 * when the library does not hold CUPTI, from the exported hooks on the same
 * calls; a per-thread depth makes the outermost one the launch (a runtime
 * launch raises the driver launch it makes, and during a switch between
 * the two mechanisms both may see one launch).
 *
 * Each launch's parameter buffer is scanned at every 4-byte-aligned
 * position against the region index, using the parameter offsets and sizes
 * of its function (layouts.c). Evicted regions it touches are
 * restored before the launch proceeds (restore.c); the launch then holds
 * the remap gate's read side until it has been issued.
 *
 * Locking: ranges_mu guards the pointer-table ranges (ranges_min/max are
 * read without it); the layouts are layouts.c's. The depth counter is
 * thread-local. The tracked drain's per-stream events are slots.c's.
 */
#include "interpose/interpose.h"

#include "sh_clock.h"
#include "sh_log.h"
#include "telemetry/telemetry.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MAX_ADDRS SH_LAUNCH_MAX_REGIONS

/* Region pointers went where no scan reads them (a module's globals): any
 * kernel may follow them, so all work is opaque from then on. */
static atomic_int hidden_pointers;
static _Thread_local struct {
    uintptr_t bases[MAX_ADDRS];
    void *regions[MAX_ADDRS]; /* of bases, as the scan found them (found) */
    uint64_t gen;             /* the index's generation then */
    int found;
    size_t n;
    CUstream stream;
    int opaque;      /* its accesses cannot be bounded: it counts as using every region */
    int any;         /* on streams the library cannot name: a drain waits for the device */
    int quiet;       /* not scanned: it counts as using every region on any stream */
    int graph;       /* a graph: its copies may use regions from another device's stream */
    int depth;       /* launch calls open on the thread: the outermost is the launch */
    uint32_t held;   /* the devices whose gates it holds (sh_gates_enter) */
    uint32_t others; /* bit i: it uses regions of sh_rt.devs[i], i > 0 (the main
                      * device's are in bases) */
    uint32_t coarse; /* bit i: ... more than obases holds: stamped as a whole */
    uintptr_t obases[MAX_ADDRS]; /* the other devices' regions it uses */
    uint8_t odev[MAX_ADDRS];     /* the index in sh_rt.devs of each */
    size_t on;
} pending;                      /* the launch being issued on this thread */
static atomic_ullong unscanned; /* launches issued without a scan */

/* ---- parameter layouts ---- */

/* Why launches go opaque, at debug level: the first few of each reason
 * (told counts them, one per place that calls). */
static void opaque_told(atomic_int *told, const char *why, int detail)
{
    if (sh_log_get_level() >= SH_LOG_DEBUG && atomic_fetch_add(told, 1) < 16)
        sh_log(SH_LOG_DEBUG, "launch opaque: %s (%d)", why, detail);
}
#define opaque_because(why, detail)                                                                \
    do {                                                                                           \
        static atomic_int told_;                                                                   \
        opaque_told(&told_, why, detail);                                                          \
    } while (0)

/* ---- device memory the library does not manage that holds pointers ----
 *
 * A small allocation goes to the driver untouched, so a pointer table the
 * program uploads there is no region. Its range is kept here when a
 * host-to-device copy put pointers into regions in it; a launch whose
 * parameters point into one is opaque. When the table is full, its ranges
 * fold into one that covers them all: more launches count as opaque, none
 * fewer. A range outlives the memory (frees are not followed): speed, not
 * data. */

#define PTR_RANGES 64

static pthread_mutex_t ranges_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t range_lo[PTR_RANGES], range_hi[PTR_RANGES];
static int nranges;
static uintptr_t ranges_min = UINTPTR_MAX, ranges_max; /* atomics, for the quick test */
static uint64_t ranges_gen;                            /* atomic: ranges added so far */

static void add_ptr_range(uintptr_t lo, uintptr_t hi)
{
    pthread_mutex_lock(&ranges_mu);
    if (nranges == PTR_RANGES) {
        for (int i = 1; i < nranges; i++) {
            range_lo[0] = range_lo[i] < range_lo[0] ? range_lo[i] : range_lo[0];
            range_hi[0] = range_hi[i] > range_hi[0] ? range_hi[i] : range_hi[0];
        }
        nranges = 1;
    }
    range_lo[nranges] = lo;
    range_hi[nranges++] = hi;
    if (lo < ranges_min)
        __atomic_store_n(&ranges_min, lo, __ATOMIC_RELAXED);
    if (hi > ranges_max)
        __atomic_store_n(&ranges_max, hi, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ranges_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ranges_mu);
}

static int in_ptr_range(uintptr_t v)
{
    if (v < __atomic_load_n(&ranges_min, __ATOMIC_RELAXED) ||
        v >= __atomic_load_n(&ranges_max, __ATOMIC_RELAXED))
        return 0;
    int hit = 0;
    pthread_mutex_lock(&ranges_mu);
    for (int i = 0; i < nranges && !hit; i++)
        hit = v - range_lo[i] < range_hi[i] - range_lo[i];
    pthread_mutex_unlock(&ranges_mu);
    return hit;
}

/* ---- the scan ---- */

/* Where a value must lie to point into a region, a pointer table or host
 * memory kernels read: [lo[i], lo[i] + span[i]) for some i. */
struct plausible {
    uintptr_t lo[3], span[3];
};

static void plausible_now(struct plausible *pl)
{
    uintptr_t lo[3], hi[3];
    sh_pool_bounds(sh_dev_main()->pool, &lo[0], &hi[0]);
    if (atomic_load_explicit(&sh_rt.ndevs, memory_order_relaxed) > 1)
        sh_dev_bounds(&lo[0], &hi[0]);
    lo[1] = __atomic_load_n(&ranges_min, __ATOMIC_RELAXED);
    hi[1] = __atomic_load_n(&ranges_max, __ATOMIC_RELAXED);
    sh_hostmem_bounds(&lo[2], &hi[2]);
    for (int i = 0; i < 3; i++) {
        pl->lo[i] = lo[i];
        pl->span[i] = hi[i] > lo[i] ? hi[i] - lo[i] : 0;
    }
}

static inline int plausible(const struct plausible *pl, uintptr_t v)
{
    return v - pl->lo[0] < pl->span[0] || v - pl->lo[1] < pl->span[1] ||
           v - pl->lo[2] < pl->span[2];
}

/* v may point into a pointer table or pinned host memory: only then does
 * sh_launch_in_tables have anything to find. */
static inline int maybe_table(const struct plausible *pl, uintptr_t v)
{
    return v - pl->lo[1] < pl->span[1] || v - pl->lo[2] < pl->span[2];
}

/* A texture object's handle at v: the ends of the memory under it join
 * vals (1), or there is no room, or handles were lost, and the launch is
 * opaque. 0: no handle. */
static int texture_ends(uintptr_t v, uintptr_t *vals, size_t *n)
{
    uintptr_t lo = 0, hi = 0;
    int r = sh_textures_range(v, &lo, &hi);
    if (r == 0)
        return 0;
    if (r < 0 || *n + 2 > MAX_ADDRS) {
        opaque_because(r < 0 ? "texture objects not kept" : "more pointers than are followed",
                       (int)*n);
        pending.opaque = 1;
        return 1;
    }
    vals[(*n)++] = lo;
    vals[(*n)++] = hi - 1;
    return 1;
}

/* Every 4-byte-aligned position of each parameter that can hold an 8-byte
 * pointer: a packed struct argument may keep one at offset 4. Returns the
 * candidates (non-zero values; with pl, only those that may point into a
 * region or a table now); the pool's index tells which are pointers into
 * regions (sh_pool_use), in one pass. More than MAX_ADDRS of them (a list
 * of tensors passed by value, as fused optimizers pass them, holds a few
 * hundred) make the launch opaque: the pointers past that are not
 * followed. */
static size_t scan(const struct sh_layout *l, void **args, uintptr_t *vals,
                   const struct plausible *pl)
{
    size_t n = 0;
    int textures = sh_textures_any(), tables = !pl;
    for (int i = 0; i < l->nparams; i++) {
        const unsigned char *p = args ? args[i] : NULL;
        if (!p) { /* packed in `extra` (as CUPTI reports such a launch), or missing */
            opaque_because("parameters not passed one by one", i);
            pending.opaque = 1;
            break;
        }
        for (size_t off = 0; off + 8 <= l->size[i]; off += 4) {
            uintptr_t v;
            memcpy(&v, p + off, sizeof v);
            if (!v)
                continue;
            if (textures && texture_ends(v, vals, &n)) {
                tables = 1; /* the memory under a handle may hold a table too */
                continue;
            }
            if (pl && !plausible(pl, v))
                continue;
            tables = tables || maybe_table(pl, v); /* pl is set when tables is 0 */
            if (n == MAX_ADDRS) {
                opaque_because("more pointers than are followed", l->nparams);
                pending.opaque = 1;
                return n;
            }
            vals[n++] = v;
        }
    }
    if (tables && sh_launch_in_tables(vals, n))
        pending.opaque = 1;
    return n;
}

int sh_launch_in_tables(const uintptr_t *vals, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (in_ptr_range(vals[i])) {
            opaque_because("a pointer table outside the regions", (int)i);
            return 1;
        }
    if (sh_hostmem_hit(vals, n)) { /* host memory the CPU may have filled with pointers */
        opaque_because("host memory that may hold pointers", (int)n);
        return 1;
    }
    return 0;
}

uint64_t sh_launch_tables_gen(void)
{
    return __atomic_load_n(&ranges_gen, __ATOMIC_ACQUIRE) + sh_hostmem_gen();
}

/* The candidates of one launch's parameters; the layout's opaque flag goes
 * to the launch being issued. A launch without a layout (the table is
 * full) is opaque: nothing bounds what it touches. With every, values no
 * region or table holds now are kept too (a graph checks them again when
 * tables change). */
static size_t scan_launch(const void *key, int kind, void **args, uintptr_t *vals, int every)
{
    const struct sh_layout *l = key ? sh_layout_of(key, kind) : NULL;
    if (!l) {
        opaque_because("no layout", kind);
        pending.opaque = 1;
        return 0;
    }
    pending.opaque |= l->opaque;
    struct plausible pl;
    if (!every)
        plausible_now(&pl);
    return scan(l, args, vals, every ? NULL : &pl);
}

/* ns->cands gets vals[0..n) (growing it); 0, or out of memory. */
static int keep_cands(struct sh_node_scan *ns, const uintptr_t *vals, size_t n)
{
    if (ns->ncands + n > ns->cap) {
        size_t cap = ns->cap ? ns->cap : 256;
        while (cap < ns->ncands + n)
            cap *= 2;
        uintptr_t *c = realloc(ns->cands, cap * sizeof *c);
        if (!c)
            return -1;
        ns->cands = c;
        ns->cap = cap;
    }
    memcpy(ns->cands + ns->ncands, vals, n * sizeof *vals);
    ns->ncands += n;
    return 0;
}

static int ndevs(void)
{
    return atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
}

/* Keeps in vals[0..return) those of vals[0..n) that point into a region of
 * any device, in order. */
static size_t keep_regions(uintptr_t *vals, size_t n)
{
    if (ndevs() == 1)
        return sh_pool_use(sh_dev_main()->pool, vals, n, 0, NULL);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (sh_dev_of(vals[i]))
            vals[k++] = vals[i];
    return k;
}

size_t sh_launch_scan(const void *key, int kind, void **args, uintptr_t *addrs, size_t max,
                      struct sh_node_scan *ns)
{
    uintptr_t found[MAX_ADDRS];
    int was = pending.opaque; /* a graph's scan is no launch: what it finds goes to ns */
    pending.opaque = 0;
    size_t c = scan_launch(key, kind, args, found, ns != NULL);
    if (ns && (pending.opaque || keep_cands(ns, found, c) != 0))
        ns->opaque = 1; /* now, or whatever tables come */
    pending.opaque = was;
    size_t n = keep_regions(found, c);
    n = n < max ? n : max;
    memcpy(addrs, found, n * sizeof *addrs);
    return n;
}

/* A copy or graph on another device's stream can use regions with no peer
 * access: drains wait for its context from now on. A kernel on another
 * device reaches them only through peer access (peers.c), so a kernel
 * launch does not ask. */
static void note_other(CUstream stream)
{
    if (sh_rt.drv.several)
        sh_stream_note(stream);
}

/* While a launch or copy is issued (inside the gate): the regions it uses
 * take the issue stamp that tells a prefetch in flight to redo its copy.
 * With a tracked drain, its stream's event now marks the end of that work
 * and the regions remember the stream; re-recording the event is what
 * makes a later wait cover every launch before it. Work issued into a
 * stream capture does not run, and an event recorded there is never
 * recorded for real: it marks nothing (the graph's launch does). */
/* Adds the bases[0..n) of device i's regions to the launch's (others). */
static void add_others(int i, const uintptr_t *bases, size_t n)
{
    __typeof__(pending) *pd = &pending;
    pd->others |= n ? 1u << i : 0;
    for (size_t k = 0; k < n; k++) {
        if (pd->on == MAX_ADDRS) {
            pd->coarse |= 1u << i;
            return;
        }
        pd->obases[pd->on] = bases[k];
        pd->odev[pd->on++] = (uint8_t)i;
    }
}

/* The other devices' regions the launch uses: each device's own (a
 * device with more than the list holds, or all), or every region of every
 * device as used (all, or opaque). Only on the devices whose gates it
 * holds (held): it reaches no other's regions (gates.c). */
static void mark_others(int all, int opaque, uint64_t streams, uint32_t held)
{
    __typeof__(pending) *pd = &pending;
    uintptr_t bases[MAX_ADDRS];
    for (int i = 1; i < ndevs(); i++) {
        struct sh_pool *pool = sh_rt.devs[i]->pool;
        if (!(held >> i & 1))
            continue;
        if (opaque) {
            sh_pool_issued_opaque(pool, streams);
        } else if (all || (pd->coarse >> i & 1)) {
            sh_pool_issued_any(pool, streams);
        } else if (pd->others >> i & 1) {
            size_t n = 0;
            for (size_t k = 0; k < pd->on; k++)
                if (pd->odev[k] == i)
                    bases[n++] = pd->obases[k];
            sh_pool_issued(pool, bases, n, streams);
        }
    }
}

static void mark_issued(void)
{
    __typeof__(pending) *pd = &pending; /* one thread-local lookup */
    struct sh_dev *d = sh_dev_main();
    uint32_t held = pd->held;
    if (pd->quiet) {
        /* the next move's drain waits for the whole device */
        uint64_t streams = sh_slots_tracked() ? SH_SLOTS_ANY : 0;
        if (held & 1)
            sh_pool_issued_any(d->pool, streams);
        if (ndevs() > 1)
            mark_others(1, 0, streams, held);
        pd->quiet = 0;
        return;
    }
    /* region pointers in a module global: any launch may follow them */
    pd->opaque |= atomic_load_explicit(&hidden_pointers, memory_order_relaxed);
    if (held == 0 || (pd->n == 0 && !pd->opaque && !pd->others)) {
        /* It names no region: nothing to stamp. A tracked drain that waits
         * for its stream must still wait for it: it may write a region
         * through a pointer no scan saw (a table a kernel built). */
        if (held && sh_slots_tracked() && !pd->any && !sh_stream_capturing(pd->stream))
            sh_slots_record(pd->stream);
        return;
    }
    uint64_t streams = 0;
    if (sh_slots_tracked()) {
        if (sh_stream_capturing(pd->stream)) {
            pd->n = 0;
            return;
        }
        streams = pd->any ? SH_SLOTS_ANY : sh_slots_record(pd->stream);
    }
    /* nothing moves: no region needs its own stamp; else the regions the
     * scan found, not looked up twice */
    if (held & 1) { /* else the main device's regions are out of its reach */
        if (streams == 0 && pd->n && sh_sched_quiet(d))
            sh_pool_issued_any(d->pool, 0);
        else
            sh_pool_issued_found(d->pool, pd->bases, pd->found ? pd->regions : NULL, pd->n, pd->gen,
                                 streams);
        if (pd->opaque)
            sh_pool_issued_opaque(d->pool, streams);
    }
    if (pd->others || (pd->opaque && ndevs() > 1))
        mark_others(0, pd->opaque, streams, held);
    pd->n = 0;
    pd->found = 0;
    pd->opaque = 0;
    pd->any = 0;
    pd->others = pd->coarse = 0;
    pd->on = 0;
}

/* The other devices' regions that hold one of addrs[0..n), to pending. */
static void others_of(const uintptr_t *addrs, size_t n)
{
    uintptr_t bases[MAX_ADDRS];
    for (int i = 1; i < ndevs(); i++)
        add_others(i, bases, sh_pool_bases(sh_rt.devs[i]->pool, addrs, n, bases));
}

void sh_launch_mark_work(CUstream stream, int any, const uintptr_t *ends, size_t n, int opaque,
                         uint32_t gates)
{
    if (!sh_active())
        return;
    n = n < MAX_ADDRS ? n : MAX_ADDRS;
    pending.n = sh_pool_bases(sh_dev_main()->pool, ends, n, pending.bases);
    pending.others = pending.coarse = 0;
    pending.on = 0;
    if (ndevs() > 1)
        others_of(ends, n);
    pending.found = 0;
    pending.stream = stream;
    pending.any = any;
    pending.held = gates;
    if (opaque)
        opaque_because("a copy or call the scan cannot bound", (int)n);
    pending.opaque = opaque || hidden_pointers;
    if (pending.n > 0 || pending.opaque || pending.others)
        note_other(stream);
    mark_issued();
}

void sh_launch_set_opaque(void)
{
    if (pending.depth > 0) {
        opaque_because("an opaque call", 0);
        pending.opaque = 1;
    }
}

void sh_launch_hide_pointers(void)
{
    if (!atomic_exchange(&hidden_pointers, 1))
        sh_log(SH_LOG_WARN, "device pointers were copied into a module's global variable: "
                            "every launch now counts as touching every region (slower, safe)");
}

int sh_launch_find_pointers(const void *bytes, size_t n, uintptr_t into)
{
    struct sh_dev *at = NULL;
    for (int i = 0; i < ndevs(); i++) {
        struct sh_pool *pool = sh_rt.devs[i]->pool;
        if (!sh_pool_find_pointers(pool, bytes, n, into))
            continue;
        /* A table of one device's pointers in another's region. */
        if (ndevs() > 1 && (at = sh_dev_of(into)) && at != sh_rt.devs[i])
            sh_pool_mark_pointers(at->pool, into);
        return 1;
    }
    return 0;
}

void sh_launch_mark_upload_rows(const void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t rows)
{
    if (!sh_active() || !width || !rows || !src)
        return;
    uintptr_t d = (uintptr_t)dst;
    const char *s = src;
    size_t y = 0;
    while (y < rows && !sh_launch_find_pointers(s + y * spitch, width, d + y * dpitch))
        y++;
    if (y == rows)
        return;
    size_t span = dpitch * (rows - 1) + width;
    if (!sh_dev_of(d))
        add_ptr_range(d, d + span);
    /* A module global whose address the program took: kernels read it
     * without naming it (globals.c), as after cudaMemcpyToSymbol. */
    if (sh_globals_meet(d, span))
        sh_launch_hide_pointers();
}

void sh_launch_mark_upload_slices(uintptr_t dst, size_t dpitch, size_t drows, const void *src,
                                  size_t spitch, size_t srows, size_t width, size_t height,
                                  size_t depth)
{
    for (size_t z = 0; z < depth; z++)
        sh_launch_mark_upload_rows((const void *)(dst + z * drows * dpitch), dpitch,
                                   (const char *)src + z * srows * spitch, spitch, width, height);
}

void sh_launch_mark_upload(const void *dst, const void *src, size_t n)
{
    sh_launch_mark_upload_rows(dst, 0, src, 0, n, 1);
}

/* Makes the launch's regions resident: prefetches in flight are committed
 * first, then evicted ones are restored. u is what sh_pool_use found at t0
 * (a commit makes its host count stale: counted again). Returns the
 * microseconds the launch waited, 0 if none. */
#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE uint64_t make_resident(struct sh_dev *d, const uintptr_t *addrs, size_t n,
                                            const struct sh_pool_use *u, uint64_t t0)
{
    size_t host = u->host_bytes, committed = 0;
    if (sh_pool_moving(d->pool)) /* else no prefetch is in flight to wait for */
        committed = sh_sched_prefetch_wait(d, u->bases, u->nbases);
    if (committed)
        sh_pool_touch(d->pool, addrs, n, &host);
    if (host == 0)
        return committed ? sh_clock_us() - t0 + 1 : 0;
    sh_launch_restore(d, addrs, n, u, host);
    return sh_clock_us() - t0 + 1;
}

void sh_launch_make_resident(struct sh_dev *d, const uintptr_t *addrs, size_t n)
{
    uintptr_t vals[MAX_ADDRS], bases[MAX_ADDRS];
    struct sh_pool_use u = {.bases = bases};
    n = n < MAX_ADDRS ? n : MAX_ADDRS;
    memcpy(vals, addrs, n * sizeof *vals);
    uint64_t t0 = sh_clock_us();
    n = sh_pool_use(d->pool, vals, n, t0, &u);
    make_resident(d, vals, n, &u, t0);
}

/* A launch's regions on device d, vals[0..n) its candidates (overwritten:
 * those in d's regions stay): their use recorded in u (found at t0), the
 * evicted ones brought back (not while a capture is under way), d's
 * scheduler told (not of a launch that uses none, unless d is the main
 * device). Returns how many candidates point into d's regions. */
static ALWAYS_INLINE size_t prepare_on(struct sh_dev *d, uint64_t kernel, uint64_t stream,
                                       uintptr_t *vals, size_t n, uint64_t t0,
                                       struct sh_pool_use *u)
{
    const uintptr_t *bases = u->bases;
    n = sh_pool_use(d->pool, vals, n, t0, u);
    if (u->ptrs) { /* a region of pointers: the kernel may follow them anywhere */
        opaque_because("a region that holds pointers", (int)u->nbases);
        pending.opaque = 1;
    }
    if (n == 0 && d != sh_dev_main())
        return 0;
    if (n > 0 && sh_capturing()) {
        /* A remap would drain the device and break the capture: the
         * captured launch will find the region where it is when it runs.
         * A launch on a stream that does not capture (another thread
         * captures) runs now, on the host mappings: it keeps the stamps
         * set above, so no move in flight misses it. */
        if (u->host_bytes)
            atomic_fetch_add(&d->engine.deferred, 1);
        sh_sched_launch(d, kernel, stream, bases, u->nbases);
        return n;
    }
    uint64_t waited = n > 0 ? make_resident(d, vals, n, u, t0) : 0;
    if (waited) {
        sh_sched_launch(d, kernel, stream, bases, u->nbases);
        sh_sched_stall(d, bases[0], waited);
        sh_sched_plan(d, bases, u->nbases);
    } else {
        sh_sched_launch_plan(d, kernel, stream, bases, u->nbases);
    }
    return n;
}

/* The launch's regions on the devices other than the main one; those it
 * uses go to pending.others. */
static void prepare_others(uint64_t kernel, uint64_t stream, const uintptr_t *vals, size_t n,
                           uint64_t t0)
{
    uintptr_t mine[MAX_ADDRS], bases[MAX_ADDRS];
    for (int i = 1; i < ndevs(); i++) {
        struct sh_pool_use u = {.bases = bases};
        memcpy(mine, vals, n * sizeof *vals);
        if (prepare_on(sh_rt.devs[i], kernel, stream, mine, n, t0, &u) > 0)
            add_others(i, bases, u.nbases);
    }
}

/* sh_launch_prepare(), inline in the launch path (each launch runs it). */
static ALWAYS_INLINE void launch_prepare(uint64_t kernel, uintptr_t *vals, size_t n)
{
    struct sh_dev *d = sh_dev_main();
    atomic_fetch_add(&sh_rt.launches, 1);
    sh_timing_begin();
    uint64_t t0 = sh_clock_us();
    uint64_t stream = sh_stream_key(pending.stream); /* as allocations name it */
    n = n < MAX_ADDRS ? n : MAX_ADDRS;
    if (ndevs() > 1) /* before the main device's pass keeps only its own */
        prepare_others(kernel, stream, vals, n, t0);
    /* Found straight into the launch being issued: its issue stamps go to
     * these regions. */
    struct sh_pool_use u = {.bases = pending.bases, .regions = pending.regions};
    n = prepare_on(d, kernel, stream, vals, n, t0, &u);
    pending.n = u.nbases;
    pending.found = 1;
    pending.gen = u.gen;
    if (n == 0 || !sh_capturing()) /* an event now could join the capture */
        sh_timing_issue();
}

void sh_launch_prepare(uint64_t kernel, uintptr_t *vals, size_t n)
{
    launch_prepare(kernel, vals, n);
}

/* Makes the regions a launch points into resident. */
static void prepare(const void *key, int kind, void **args)
{
    uintptr_t vals[MAX_ADDRS];
    launch_prepare((uint64_t)(uintptr_t)key, vals, scan_launch(key, kind, args, vals, 0));
}

/* A launch while no region is off the device or moving, launches are not
 * recorded and no capture is under way has nothing to restore and nothing
 * to teach: it is not scanned, which is what keeps a program that fits
 * free of the library's cost. It is marked as using every region on any
 * stream (one stamp, no lookup): a move that began meanwhile sees the
 * stamp and redoes its copy, and the first drain after waits for the whole
 * device. Recency is not kept meanwhile: LRU order is stale until the
 * first eviction, which costs speed at worst. */
static int quiet_launch(void)
{
    if (!sh_quiet() || sh_capturing())
        return 0;
    for (int i = 0; i < ndevs(); i++)
        if (sh_engine_armed(&sh_rt.devs[i]->engine))
            return 0;
    atomic_fetch_add_explicit(&sh_rt.launches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&unscanned, 1, memory_order_relaxed);
    return 1;
}

uint64_t sh_launch_unscanned(void)
{
    return atomic_load_explicit(&unscanned, memory_order_relaxed);
}

/* Opens the thread's launch; 1 when it is not scanned (quiet_launch). */
static int pending_begin(CUstream stream, int graph)
{
    __typeof__(pending) *pd = &pending;
    pd->stream = stream;
    pd->n = 0;
    pd->found = 0;
    pd->opaque = 0;
    pd->others = pd->coarse = 0;
    pd->on = 0;
    pd->graph = graph;
    pd->quiet = quiet_launch();
    return pd->quiet;
}

/* The gates the launch takes: with several devices, those its kernel may
 * reach and those of the regions it names; a graph's, every one. */
static uint32_t launch_gates(void)
{
    const __typeof__(pending) *pd = &pending;
    if (ndevs() == 1)
        return 1;
    if (pd->graph)
        return SH_GATES_ALL;
    return sh_gates_kernel(pd->stream) | (pd->n ? 1u : 0) | pd->others;
}

void sh_launch_begin(const void *key, int kind, void **args, CUstream stream)
{
    if (pending.depth++ == 0) {
        if (!pending_begin(stream, 0))
            prepare(key, kind, args);
        pending.held = sh_gates_enter(launch_gates());
    }
}

void sh_launch_begin_addrs(uint64_t key, const uintptr_t *addrs, size_t n, int opaque,
                           CUstream stream)
{
    if (pending.depth++ == 0) {
        int quiet = pending_begin(stream, 1);
        pending.opaque = opaque || n > MAX_ADDRS; /* beyond MAX_ADDRS: not stamped one by one */
        if (quiet) {
            pending.held = sh_gates_enter(launch_gates());
            return;
        }
        uintptr_t vals[MAX_ADDRS];
        n = n < MAX_ADDRS ? n : MAX_ADDRS;
        if (n > 0) /* addrs may be NULL when there are none */
            memcpy(vals, addrs, n * sizeof *vals);
        sh_launch_prepare(key, vals, n);
        pending.held = sh_gates_enter(launch_gates());
    }
}

void sh_launch_end(void)
{
    __typeof__(pending) *pd = &pending;
    if (pd->depth > 0 && --pd->depth == 0) {
        if (pd->graph) {
            note_other(pd->stream);
            pd->graph = 0;
        }
        mark_issued(); /* still inside the gates: no window between issue and mark */
        sh_gates_leave();
    }
}

int sh_launch_busy(void)
{
    return pending.depth > 0;
}

int sh_launch_init(void)
{
    return sh_layouts_init();
}
