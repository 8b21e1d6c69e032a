/* start.c — on the first managed call, the driver, the device, the pool and
 * everything over them, in order; and the out-of-memory answers that name
 * what the pool holds. Above every file it starts, below the entry points
 * that call sh_managed().
 *
 * Shared state: sh_rt (runtime.c) and the main device, written inside
 * init_once. The current-context flag is per thread.
 */
#include "interpose/interpose.h"

#include "sh_err.h"
#include "sh_log.h"
#include "telemetry/telemetry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static _Thread_local int ctx_ready;
static struct sh_dev main_dev;

static uint64_t host_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* Start-up calls are tried this often: one transient failure must not
 * turn the library or eviction off for the whole run. */
#define START_TRIES 3

/* A device attribute, asked again if the driver fails to answer; 0 if it
 * never does. */
static int attribute(const struct sh_dev *dv, CUdevice_attribute what)
{
    int v = 0;
    for (int i = 0; i < START_TRIES; i++)
        if (sh_rt.drv.cuDeviceGetAttribute(&v, what, dv->dev) == CUDA_SUCCESS)
            return v;
    return 0;
}

static int open_device(struct sh_dev *dv)
{
    struct sh_driver *d = &sh_rt.drv;
    int dev = 0, want = sh_rt.cfg.general.device;
    /* Lets the runtime create and select its context first, as the program expects. */
    if (sh_real()->cudaGetDevice && sh_real()->cudaGetDevice(&dev) != cudaSuccess)
        return SH_EDRIVER;
    dev = want >= 0 ? want : dev;
    if (d->cuInit(0) != CUDA_SUCCESS)
        return SH_EDRIVER;
    dv->ordinal = dev;
    if (d->cuDeviceGet(&dv->dev, dev) != CUDA_SUCCESS) {
        fprintf(stderr, "stagehand: [general] device = %d: no such CUDA device here\n", dev);
        _exit(1); /* like a bad configuration: the first allocation has not happened yet */
    }
    if (d->cuDevicePrimaryCtxRetain(&dv->ctx, dv->dev) != CUDA_SUCCESS ||
        d->cuDeviceTotalMem(&dv->card_bytes, dv->dev) != CUDA_SUCCESS)
        return SH_EDRIVER;
    d->ctx = dv->ctx;
    sh_driver_dev_init(&dv->drvdev, d, dv->dev, dv->ctx);
    /* Several devices cost a little on the mapping and copy paths
     * (peermap.c); a count the driver cannot give counts as several. */
    int n = 0;
    for (int i = 0; n <= 0 && i < START_TRIES; i++)
        if (d->cuDeviceGetCount(&n) != CUDA_SUCCESS)
            n = 0;
    d->several = n != 1;
    sh_peers_manage(dv->dev, dv->ctx, d->several);
    if (!attribute(dv, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) {
        sh_log(SH_LOG_WARN, "device %d has no virtual memory management; passing through", dev);
        return SH_EDRIVER;
    }
    return SH_OK;
}

/* The largest chunk of a region: the configuration's, at least a granule
 * (dv->gran, set by open_pool). The slab pool has a class for each size
 * a chunk can have. */
static size_t max_chunk(const struct sh_dev *dv)
{
    size_t m = sh_rt.cfg.regions.max_chunk.bytes;
    return m < dv->gran ? dv->gran : m;
}

static int open_pool(struct sh_dev *dv)
{
    struct sh_driver *d = &sh_rt.drv;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, dv->dev}};
    size_t gran = 0;
    for (int i = 0; !gran && i < START_TRIES; i++)
        if (d->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
            gran = 0;
    if (!gran)
        return SH_EDRIVER;
    dv->gran = gran;
    if (sh_gate_create(&dv->gate) != SH_OK)
        return SH_ENOMEM;
    const struct sh_config *c = &sh_rt.cfg;
    struct sh_pool_params p = {.granularity = gran,
                               .max_chunk = max_chunk(dv),
                               .va_block = 1ull << 30,
                               .va_cache = c->regions.va_cache.bytes,
                               .device_cache = c->regions.device_cache.bytes,
                               .suballoc_max = c->regions.suballoc_max.bytes};
    struct sh_vmm_ops vmm;
    struct sh_fence_ops fences;
    sh_driver_vmm_ops(&dv->drvdev, &vmm);
    sh_driver_fence_ops(&dv->drvdev, &fences);
    return sh_pool_create(&p, &vmm, &fences, &dv->pool);
}

/* Every device's host slabs come out of one budget: the process's
 * ([budget] host_ram_budget_mb), and the node's when there is one. */
static atomic_size_t host_pinned;

static int host_reserve(void *ctx, size_t bytes)
{
    (void)ctx;
    size_t was = atomic_fetch_add(&host_pinned, bytes);
    if (was + bytes > sh_rt.cfg.budget.host_ram_budget.bytes ||
        (sh_rt.node && sh_node_reserve(sh_rt.node, bytes) != 0)) {
        atomic_fetch_sub(&host_pinned, bytes);
        return -1;
    }
    return 0;
}

static void host_release(void *ctx, size_t bytes)
{
    (void)ctx;
    if (sh_rt.node)
        sh_node_release(sh_rt.node, bytes);
    atomic_fetch_sub(&host_pinned, bytes);
}

/* A slab device ctx waits for did not fit: the other devices give back
 * idle slabs (each pool grows towards its targets in the background, and
 * the first device's would otherwise hold the whole budget). */
static int host_reclaim(void *ctx, size_t bytes)
{
    size_t got = 0;
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    for (int i = 0; i < n && got < bytes; i++)
        if (sh_rt.devs[i] != ctx && sh_rt.devs[i]->host)
            got += sh_hostpool_shed(sh_rt.devs[i]->host, bytes - got);
    return got > 0;
}

/* [budget] host_ram_scope = node, or auto in a job of several ranks: this
 * process's pinned slabs come out of a budget the user's processes on this
 * machine share. A segment that cannot be used is named with what is
 * wrong, and the budget stays per process. The slot is never given up
 * before exit: the grower may pin until the end, and the others reclaim it
 * once the process is gone. In a secure-execution program no launcher's
 * variable is read. */
static void open_node(void)
{
    extern char **environ;
    const struct sh_config *c = &sh_rt.cfg;
    char why[128], scope[160];
    if (sh_config_host_scope(c, sh_config_secure() ? NULL : environ, why, sizeof why) !=
        SH_CONFIG_HOST_NODE)
        return;
    snprintf(scope, sizeof scope, "host_ram_scope = %s%s%s", why[0] ? "auto (" : "node", why,
             why[0] ? ")" : "");
    struct sh_node_params p = {.name = c->budget.host_ram_segment,
                               .budget = c->budget.host_ram_budget.bytes};
    char err[SH_CONFIG_ERR_MAX] = "";
    if (sh_node_open(&p, &sh_rt.node, err, sizeof err) != SH_OK) {
        sh_rt.node = NULL;
        sh_log(SH_LOG_WARN,
               "[budget] %s: %s; this process keeps to a host budget of its own (%llu MB)", scope,
               err, (unsigned long long)(p.budget >> 20));
        return;
    }
    struct sh_node_stats ns;
    sh_node_stats(sh_rt.node, &ns);
    sh_log(SH_LOG_INFO, "host budget of %llu MB shared through %s with %u other process(es) (%s)",
           (unsigned long long)(ns.budget >> 20), sh_node_path(sh_rt.node), ns.ranks - 1, scope);
}

/* Host slabs and copy streams, set up once; on failure nothing is kept. */
static int try_mover(struct sh_dev *dv)
{
    const struct sh_config *c = &sh_rt.cfg;
    struct sh_hostpool_params hp = {.granularity = dv->gran,
                                    .chunk_max = max_chunk(dv),
                                    .ram_budget = c->budget.host_ram_budget.bytes,
                                    .prepin = c->pool.prepin.bytes,
                                    .grow_in_background = c->pool.grow_in_background,
                                    .dormant = 1}; /* woken near the limit (room.c) */
    hp.share = (struct sh_hostpool_share){host_reserve, host_release, host_reclaim, dv};
    hp.nclasses = c->pool.classes_mb.n;
    for (unsigned i = 0; i < hp.nclasses && i < SH_HOSTPOOL_MAX_CLASSES; i++) {
        hp.class_bytes[i] = (size_t)c->pool.classes_mb.v[i] << 20;
        hp.slabs[i] = c->pool.slabs_per_class.v[i];
    }
    struct sh_vmm_ops vmm;
    struct sh_copy_ops copy;
    sh_driver_vmm_ops(&dv->drvdev, &vmm);
    if (sh_hostpool_create(&hp, &vmm, &dv->host) != SH_OK ||
        sh_driver_copy_ops(&dv->drvdev, &copy) != SH_OK ||
        sh_xfer_create(&copy, (unsigned)c->transfer.max_inflight_d2h,
                       (unsigned)c->transfer.max_inflight_h2d, &dv->xfer) != SH_OK) {
        sh_hostpool_destroy(dv->host);
        dv->host = NULL;
        return SH_EDRIVER;
    }
    return SH_OK;
}

/* With several devices, a device's bytes may point into any device's
 * regions (struct sh_pool_mover's targets). */
static void targets_bounds(void *ctx, uintptr_t *lo, uintptr_t *hi)
{
    (void)ctx;
    sh_dev_bounds(lo, hi);
}

static int targets_has(void *ctx, uintptr_t v)
{
    (void)ctx;
    return sh_dev_of(v) != NULL;
}

/* Host slabs and the copy engine; without them the library still manages
 * allocations, it just cannot evict. */
static void open_mover(struct sh_dev *dv)
{
    const struct sh_config *c = &sh_rt.cfg;
    if (!attribute(dv, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) {
        sh_log(SH_LOG_WARN, "the driver cannot map host memory into the device's address space; "
                            "eviction is off");
        return;
    }
    static int node_tried; /* once per process: the main device's start */
    if (!node_tried++)
        open_node();
    int rc = SH_EDRIVER;
    for (int i = 0; rc != SH_OK && i < START_TRIES; i++)
        rc = try_mover(dv);
    if (rc != SH_OK) {
        sh_log(SH_LOG_WARN, "cannot set up host slabs or copy streams; eviction is off");
        return;
    }
    dv->fp = sh_fingerprint_new(&dv->drvdev);
    struct sh_pool_mover m = {.host = dv->host,
                              .xfer = dv->xfer,
                              .gate = dv->gate,
                              .checksums = c->debug.debug_checksums,
                              .verify_moves = c->debug.debug_verify_moves,
                              .slab_wait_ms = 2000,
                              .fingerprint = sh_fingerprint,
                              .fingerprint_queue = sh_fingerprint_queue,
                              .fingerprint_take = sh_fingerprint_take,
                              .ptr_candidates = sh_fingerprint_ptrs,
                              .clean_skip = c->policy.clean_skip};
    if (!dv->fp) /* no fingerprints: no clean skip, no early eviction */
        m.fingerprint = NULL, m.fingerprint_queue = NULL, m.fingerprint_take = NULL,
        m.ptr_candidates = NULL;
    m.fp_ctx = dv->fp;
    if (c->general.devices == SH_CONFIG_DEVICES_ALL) {
        m.targets_bounds = targets_bounds;
        m.targets_has = targets_has;
    }
    m.drain_ctx = &dv->drvdev;
    m.capturing = sh_capturing;
    sh_slots_tracked_drain(&m.drain_streams, &m.streams_idle);
    sh_pool_set_mover(dv->pool, &m);
}

static void init(void)
{
    struct sh_dev *dv = &main_dev;
    if (sh_rt.disabled || !sh_real()->cudaMalloc)
        return;
    if (sh_driver_load(&sh_rt.drv, "libcuda.so.1") != SH_OK)
        return; /* it said why */
    if (open_device(dv) != SH_OK) {
        sh_log(SH_LOG_WARN, "CUDA driver unavailable; passing all calls through");
        return;
    }
    char err[SH_CONFIG_ERR_MAX];
    if (sh_config_resolve(&sh_rt.cfg, dv->card_bytes, host_ram(), err, sizeof err) != 0) {
        fprintf(stderr, "stagehand: %s\n", err);
        _exit(1); /* the first allocation has not happened yet */
    }
    /* What is set up now (copy streams, events) belongs to the managed
     * device, whichever the program has current. */
    CUcontext popped;
    if (sh_rt.drv.cuCtxPushCurrent(dv->ctx) != CUDA_SUCCESS) {
        sh_log(SH_LOG_WARN, "cannot make device %d's context current; passing all calls through",
               dv->ordinal);
        return;
    }
    if (open_pool(dv) != SH_OK) {
        sh_log(SH_LOG_WARN, "cannot set up the region pool; passing all calls through");
        sh_rt.drv.cuCtxPopCurrent(&popped);
        return;
    }
    open_mover(dv);
    sh_room_init(dv, &sh_rt.cfg);
    sh_rt.devs[0] = dv; /* the main device: the scheduler keeps the trace there */
    if (sh_sched_init(dv) != SH_OK) {
        sh_log(SH_LOG_WARN, "cannot set up the scheduler; passing all calls through");
        sh_rt.drv.cuCtxPopCurrent(&popped);
        return;
    }
    atomic_store_explicit(&sh_rt.ndevs, 1, memory_order_release);
    if (sh_launch_init() == 0)
        sh_cupti_init();
    sh_monitor_start();
    sh_rt.drv.cuCtxPopCurrent(&popped);
    char summary[512];
    sh_config_summary(&sh_rt.cfg, summary, sizeof summary);
    sh_log(SH_LOG_INFO, "managing allocations on device %d%s: %s", dv->ordinal,
           !sh_rt.drv.several                                   ? ""
           : sh_rt.cfg.general.devices == SH_CONFIG_DEVICES_ALL ? " (the others once used)"
                                                                : " (other devices pass through)",
           summary);
    sh_torch_check_env();
    atomic_store(&sh_rt.managed, 1);
}

int sh_managed(void)
{
    if (sh_rt.disabled)
        return 0;
    pthread_once(&init_once, init);
    if (!atomic_load(&sh_rt.managed))
        return 0;
    if (!ctx_ready) {
        CUcontext cur = NULL;
        sh_rt.drv.cuCtxGetCurrent(&cur);
        if (!cur)
            sh_rt.drv.cuCtxSetCurrent(main_dev.ctx);
        ctx_ready = 1;
    }
    return 1;
}

struct sh_dev *sh_managed_here(void)
{
    int dev = 0;
    if (!sh_managed())
        return NULL;
    if (!sh_real()->cudaGetDevice)
        return &main_dev;
    return sh_real()->cudaGetDevice(&dev) == cudaSuccess ? sh_dev_open(dev) : NULL;
}

/* ---- the other devices, with [general] devices = all ---- */

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t refused; /* devices that could not be brought up (bit: ordinal) */

/* Device ordinal's context, card, and configuration resolved for it (its
 * budget and watermarks are of its own card). open_mu held. SH_EINVAL,
 * having said why, when it cannot be managed. */
static int other_device(struct sh_dev *dv, int ordinal, struct sh_config *c)
{
    struct sh_driver *d = &sh_rt.drv;
    char err[SH_CONFIG_ERR_MAX];
    dv->ordinal = ordinal;
    if (d->cuDeviceGet(&dv->dev, ordinal) != CUDA_SUCCESS ||
        d->cuDevicePrimaryCtxRetain(&dv->ctx, dv->dev) != CUDA_SUCCESS ||
        d->cuDeviceTotalMem(&dv->card_bytes, dv->dev) != CUDA_SUCCESS) {
        sh_log(SH_LOG_WARN, "device %d: the driver cannot open it; its memory is not managed",
               ordinal);
        return SH_EINVAL;
    }
    if (!attribute(dv, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) {
        sh_log(SH_LOG_WARN, "device %d has no virtual memory management; its memory is not managed",
               ordinal);
        return SH_EINVAL;
    }
    *c = sh_rt.cfg;
    if (sh_config_resolve(c, dv->card_bytes, host_ram(), err, sizeof err) != 0) {
        sh_log(SH_LOG_WARN, "device %d: %s; its memory is not managed", ordinal, err);
        return SH_EINVAL;
    }
    sh_driver_dev_init(&dv->drvdev, d, dv->dev, dv->ctx);
    return SH_OK;
}

/* Brings up device ordinal beside the main one, as init does, and
 * publishes it; open_mu held. */
static struct sh_dev *open_other(int ordinal)
{
    struct sh_dev *dv = calloc(1, sizeof *dv);
    struct sh_config *c = malloc(sizeof *c);
    CUcontext popped;
    int rc = dv && c ? other_device(dv, ordinal, c) : SH_ENOMEM;
    if (rc == SH_OK && sh_rt.drv.cuCtxPushCurrent(dv->ctx) != CUDA_SUCCESS)
        rc = SH_EDRIVER;
    else if (rc == SH_OK) {
        if ((rc = open_pool(dv)) == SH_OK) {
            open_mover(dv);
            sh_room_init(dv, c);
            rc = sh_sched_init(dv);
        }
        sh_rt.drv.cuCtxPopCurrent(&popped);
    }
    free(c);
    if (rc != SH_OK) {
        if (rc != SH_EINVAL) /* else other_device said why */
            sh_log(SH_LOG_WARN, "device %d: cannot set up its pool; its memory is not managed",
                   ordinal);
        if (dv && !dv->pool) { /* else kept: a pool that came up may have mappings */
            sh_gate_destroy(dv->gate);
            free(dv);
        }
        return NULL;
    }
    sh_peers_manage(dv->dev, dv->ctx, sh_rt.drv.several);
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_relaxed);
    sh_rt.devs[n] = dv;
    atomic_store_explicit(&sh_rt.ndevs, n + 1, memory_order_release);
    sh_log(SH_LOG_INFO, "managing allocations on device %d too (%llu MB budget)", ordinal,
           (unsigned long long)(dv->engine.cfg.budget >> 20));
    return dv;
}

/* With devices = one, the first call for another device says, once, that
 * its memory is CUDA's: a rank of a job whose first allocation landed on
 * the wrong device learns which one is managed, and how to change it. */
static void say_unmanaged(int ordinal)
{
    static atomic_ullong told;
    if (atomic_load_explicit(&told, memory_order_relaxed) >> ordinal & 1 ||
        atomic_fetch_or(&told, 1ull << ordinal) >> ordinal & 1)
        return;
    int count = 0;
    if (sh_rt.drv.cuDeviceGetCount(&count) != CUDA_SUCCESS || ordinal >= count)
        return; /* no such device: the call's own error says so */
    const struct sh_dev *m = sh_dev_main();
    const char *rank = sh_config_secure() ? NULL : getenv("LOCAL_RANK");
    int chosen = sh_rt.cfg.general.device >= 0;
    sh_log(chosen ? SH_LOG_INFO : SH_LOG_WARN,
           "device %d is not managed: its allocations go to CUDA and are never evicted; "
           "stagehand manages device %d (%s%s%.12s); set [general] device = %d "
           "(STAGEHAND_GENERAL_DEVICE=%d) to manage it instead, or devices = all for every device",
           ordinal, m->ordinal, chosen ? "[general] device" : "current at the first allocation",
           rank && !chosen ? ", LOCAL_RANK is " : "", rank && !chosen ? rank : "", ordinal,
           ordinal);
}

struct sh_dev *sh_dev_open(int ordinal)
{
    struct sh_dev *d = sh_dev_ordinal(ordinal);
    if (d || ordinal < 0 || ordinal >= 64 || !sh_active())
        return d;
    if (sh_rt.cfg.general.devices != SH_CONFIG_DEVICES_ALL) {
        say_unmanaged(ordinal);
        return NULL;
    }
    pthread_mutex_lock(&open_mu);
    d = sh_dev_ordinal(ordinal);
    if (!d && !(refused >> ordinal & 1) && atomic_load(&sh_rt.ndevs) < SH_DEVICES_MAX &&
        !(d = open_other(ordinal)))
        refused |= 1ull << ordinal;
    pthread_mutex_unlock(&open_mu);
    return d;
}

/* Why nothing more could be evicted, for the out-of-memory line. */
static const char *host_side(const struct sh_dev *d, char *buf, size_t len)
{
    if (!d->host)
        return "nothing can be evicted on this device";
    struct sh_hostpool_stats hs;
    sh_hostpool_stats(d->host, &hs);
    int n = snprintf(buf, len, "host side: %zu MB pinned of a %zu MB budget%s",
                     hs.pinned_bytes >> 20, hs.budget_bytes >> 20,
                     hs.pinned_bytes + (2u << 20) > hs.budget_bytes ? ", exhausted" : "");
    if (hs.timeouts && n > 0 && (size_t)n < len) /* pinning slower than an eviction waits */
        n += snprintf(buf + n, len - (size_t)n, ", %llu wait(s) for a slab to be pinned timed out",
                      (unsigned long long)hs.timeouts);
    if (sh_rt.node && n > 0 && (size_t)n < len) {
        struct sh_node_stats ns;
        sh_node_stats(sh_rt.node, &ns);
        snprintf(buf + n, len - (size_t)n,
                 "; node: %llu MB of a %llu MB budget pinned by %u process(es)%s",
                 (unsigned long long)(ns.used >> 20), (unsigned long long)(ns.budget >> 20),
                 ns.ranks, hs.refused ? ", exhausted" : "");
    }
    return buf;
}

cudaError_t sh_oom_too_big(struct sh_dev *d, size_t size, const char *what)
{
    atomic_fetch_add(&sh_rt.oom, 1);
    sh_monitor_event(SH_TM_EV_OOM, 0, size);
    sh_log(SH_LOG_WARN,
           "%s(%zu bytes): out of memory: larger than device %d's %llu MB budget less memory "
           "held outside stagehand; nothing evicted",
           what, size, d->ordinal, (unsigned long long)(d->engine.cfg.budget >> 20));
    return cudaErrorMemoryAllocation;
}

cudaError_t sh_oom(struct sh_dev *d, size_t size, const char *what)
{
    atomic_fetch_add(&sh_rt.oom, 1);
    sh_monitor_event(SH_TM_EV_OOM, 0, size);
    struct sh_pool_stats st;
    sh_pool_stats(d->pool, &st);
    char host[256];
    sh_log(SH_LOG_WARN,
           "%s(%zu bytes): out of memory: %zu MB on device %d of a %llu MB budget, "
           "%zu MB evicted (%s)",
           what, size, st.device_bytes >> 20, d->ordinal,
           (unsigned long long)(d->engine.cfg.budget >> 20), st.host_bytes >> 20,
           host_side(d, host, sizeof host));
    return cudaErrorMemoryAllocation;
}
