/* vmm.c — the program's own virtual-memory calls: device memory it creates
 * and maps itself (cuMemCreate, cuMemMap), as PyTorch's caching allocator
 * does with expandable_segments:True, reaching the driver through
 * cudaGetDriverEntryPoint or dlsym (intercept.c and dlsym.c hand out these
 * hooks).
 *
 * A cuMemCreate of device memory on a managed device gets a handle of the
 * library's own, backed by that device's pool's chunks (pool/adopt.c);
 * cuMemMap of that handle makes the mapped range a region of that pool at
 * the program's address, which is evicted and restored like any other.
 * cuMemUnmap, cuMemRelease and cuMemAddressFree give it back. Everything
 * else passes through: devices not managed, host locations, compressible
 * memory, sizes off the pool's granularity, and any handle the driver
 * made. What the library
 * cannot do with one of its handles (map part of it, map it twice, export
 * it to another process) is refused with an error and a line saying what
 * to change; the memory is never lost.
 *
 * Handle values carry a tag above any user-space address, so they can
 * never be a driver's handle (the driver's are small numbers or pointers).
 *
 * Shared state: the handle table, guarded by table_mu (never held across a
 * pool or driver call); the real functions, resolved once.
 */
#include "interpose/intercept.h"

#include "sh_err.h"
#include "sh_log.h"

#include <pthread.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

#define TAG      0x5348000000000000ull /* "SH": no user-space address looks like it */
#define TAG_MASK 0xffff000000000000ull
#define IDX_BITS 24
#define IDX_MASK ((1ull << IDX_BITS) - 1)

static struct {
    __typeof__(cuMemCreate) *create;
    __typeof__(cuMemRelease) *release;
    __typeof__(cuMemMap) *map;
    __typeof__(cuMemUnmap) *unmap;
    __typeof__(cuMemSetAccess) *set_access;
    __typeof__(cuMemAddressFree) *address_free;
    __typeof__(cuMemGetAllocationPropertiesFromHandle) *props;
    __typeof__(cuMemExportToShareableHandle) *export_handle;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
#define REAL(field, name) real.field = (__typeof__(real.field))sh_icept_lookup(0, name)
    REAL(create, "cuMemCreate");
    REAL(release, "cuMemRelease");
    REAL(map, "cuMemMap");
    REAL(unmap, "cuMemUnmap");
    REAL(set_access, "cuMemSetAccess");
    REAL(address_free, "cuMemAddressFree");
    REAL(props, "cuMemGetAllocationPropertiesFromHandle");
    REAL(export_handle, "cuMemExportToShareableHandle");
#undef REAL
}

#define RESOLVE() pthread_once(&real_once, resolve)

/* ---- the handle table ---- */

struct slot {
    struct sh_backing *b; /* NULL: free */
    struct sh_dev *d;     /* whose pool holds it */
    CUmemAllocationProp prop;
    uint32_t gen; /* bumped as the slot is freed: a stale value finds nothing */
};

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static struct slot *slots;
static size_t nslots, capslots;

static CUmemGenericAllocationHandle value_of(size_t i)
{
    return TAG | (uint64_t)(slots[i].gen & 0xffffff) << IDX_BITS | i;
}

/* A slot for b: its own if it has one (a retained reference), else a new
 * one; 0 when the table cannot grow. table_mu held. */
static CUmemGenericAllocationHandle slot_add(struct sh_dev *d, struct sh_backing *b,
                                             const CUmemAllocationProp *prop)
{
    size_t i = 0;
    for (; i < nslots && slots[i].b != b; i++)
        ;
    if (i < nslots)
        return value_of(i);
    for (i = 0; i < nslots && slots[i].b; i++)
        ;
    if (i == nslots && nslots == capslots) {
        size_t cap = capslots ? capslots * 2 : 64;
        struct slot *t = cap <= IDX_MASK ? realloc(slots, cap * sizeof *t) : NULL;
        if (!t)
            return 0;
        slots = t;
        capslots = cap;
    }
    if (i == nslots)
        slots[nslots++] = (struct slot){0};
    slots[i].b = b;
    slots[i].d = d;
    slots[i].prop = *prop;
    slots[i].prop.allocFlags.gpuDirectRDMACapable = 0; /* what the chunks are */
    return value_of(i);
}

/* The slot a value names, or NULL for a value that is not ours (or no
 * longer). table_mu held. */
static struct slot *slot_of(CUmemGenericAllocationHandle h)
{
    size_t i = h & IDX_MASK;
    if ((h & TAG_MASK) != TAG || i >= nslots || !slots[i].b ||
        (slots[i].gen & 0xffffff) != ((h >> IDX_BITS) & 0xffffff))
        return NULL;
    return &slots[i];
}

/* The backing h names (NULL when none), with its device and properties
 * (each may be NULL). */
static struct sh_backing *backing_of(CUmemGenericAllocationHandle h, struct sh_dev **d,
                                     CUmemAllocationProp *prop)
{
    pthread_mutex_lock(&table_mu);
    struct slot *s = slot_of(h);
    struct sh_backing *b = s ? s->b : NULL;
    if (s && d)
        *d = s->d;
    if (s && prop)
        *prop = s->prop;
    pthread_mutex_unlock(&table_mu);
    return b;
}

static int ours(CUmemGenericAllocationHandle h)
{
    return (h & TAG_MASK) == TAG;
}

/* ---- creating and releasing ---- */

/* Memory a pool can hold for the program: pinned device memory on a
 * managed device (with [general] devices = all, one not managed yet is
 * brought up), whole granules, nothing the pool's chunks lack (the
 * handle types asked for matter only to an export, refused below).
 * GPUDirect RDMA is asked for by PyTorch wherever the card offers it; the
 * chunks are created without it, so a NIC that tries to register them is
 * refused (loudly) instead of writing into memory the library moves. */
static struct sh_dev *manageable(size_t size, const CUmemAllocationProp *p,
                                 unsigned long long flags)
{
    const CUmemAllocationHandleType types =
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;
    if (!sh_rt.cfg.regions.manage_program_vmm || !p || flags != 0 || size == 0 ||
        p->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->allocFlags.compressionType ||
        p->allocFlags.usage || (p->requestedHandleTypes & ~types) != 0 || !sh_managed())
        return NULL;
    struct sh_dev *d = sh_dev_open(p->location.id);
    return d && d->host && size % d->gran == 0 ? d : NULL;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    RESOLVE();
    struct sh_dev *d = handle ? manageable(size, prop, flags) : NULL;
    if (!d)
        return real.create ? real.create(handle, size, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
    struct sh_backing *b = NULL;
    sh_engine_lock(&d->engine);
    int rc = sh_engine_make_room(&d->engine, size, NULL, 0);
    if (rc == SH_OK)
        rc = sh_pool_backing_create(d->pool, size, &b);
    sh_engine_unlock(&d->engine);
    if (rc == SH_ENOMEM || rc == SH_ERANGE) {
        /* PyTorch frees its cache and asks again on exactly this error. */
        if (rc == SH_ERANGE)
            sh_oom_too_big(d, size, "cuMemCreate");
        else
            sh_oom(d, size, "cuMemCreate");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc != SH_OK)
        return real.create(handle, size, prop, flags);
    pthread_mutex_lock(&table_mu);
    CUmemGenericAllocationHandle h = slot_add(d, b, prop);
    pthread_mutex_unlock(&table_mu);
    if (!h) {
        sh_pool_backing_release(d->pool, b);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = h;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    RESOLVE();
    if (!ours(handle))
        return real.release ? real.release(handle) : CUDA_ERROR_NOT_INITIALIZED;
    struct sh_dev *d = NULL;
    struct sh_backing *b = backing_of(handle, &d, NULL);
    int rc = b ? sh_pool_backing_release(d->pool, b) : SH_EINVAL;
    if (rc == 1) { /* the last reference: the value names nothing from now on */
        pthread_mutex_lock(&table_mu);
        struct slot *s = slot_of(handle);
        if (s && s->b == b) {
            s->b = NULL;
            s->gen++;
        }
        pthread_mutex_unlock(&table_mu);
    }
    return rc < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

int sh_pin_region(uintptr_t p)
{
    struct sh_dev *d = sh_dev_of(p);
    if (!d)
        return 0;
    for (int tries = 0; tries < 3; tries++) {
        int rc = sh_pool_pin(d->pool, p);
        struct sh_region_info info;
        if (rc == SH_OK && sh_pool_lookup(d->pool, p, &info) == SH_OK)
            sh_sched_pinned(d, info.va);
        if (rc != SH_EBUSY)
            return rc == SH_ENOTFOUND ? 0 : rc;
        sh_launch_make_resident(d, &p, 1);
    }
    sh_log(SH_LOG_ERROR, "0x%llx: cannot bring the region back to the device to share its pages",
           (unsigned long long)p);
    return SH_ENOMEM;
}

int sh_vmm_retain(uintptr_t addr, CUmemGenericAllocationHandle *handle)
{
    struct sh_dev *d = sh_active() ? sh_dev_of(addr) : NULL;
    struct sh_backing *b = d ? sh_pool_backing_retain(d->pool, addr) : NULL;
    if (!b)
        return 0;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, d->ordinal}};
    pthread_mutex_lock(&table_mu);
    CUmemGenericAllocationHandle h = slot_add(d, b, &prop);
    pthread_mutex_unlock(&table_mu);
    if (!h) {
        sh_pool_backing_release(d->pool, b);
        return -1;
    }
    *handle = h;
    return 1;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                       CUmemGenericAllocationHandle handle)
{
    RESOLVE();
    if (!ours(handle))
        return real.props ? real.props(prop, handle) : CUDA_ERROR_NOT_INITIALIZED;
    CUmemAllocationProp p;
    if (!prop || !backing_of(handle, NULL, &p))
        return CUDA_ERROR_INVALID_VALUE;
    *prop = p;
    return CUDA_SUCCESS;
}

/* Another process would map the chunks behind the handle while the library
 * moves them: refused, with what to change. */
EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType type,
                                             unsigned long long flags)
{
    RESOLVE();
    if (!ours(handle))
        return real.export_handle ? real.export_handle(shareable, handle, type, flags)
                                  : CUDA_ERROR_NOT_INITIALIZED;
    if (!backing_of(handle, NULL, NULL))
        return CUDA_ERROR_INVALID_VALUE;
    sh_log(SH_LOG_ERROR,
           "cuMemExportToShareableHandle: stagehand manages this memory and may move it, so it "
           "cannot be shared with another process; set [regions] manage_program_vmm = false "
           "(STAGEHAND_REGIONS_MANAGE_PROGRAM_VMM=false) to share memory the program maps "
           "itself");
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- mapping ---- */

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    RESOLVE();
    if (!ours(handle))
        return real.map ? real.map(ptr, size, offset, handle, flags) : CUDA_ERROR_NOT_INITIALIZED;
    struct sh_dev *d = NULL;
    struct sh_backing *b = backing_of(handle, &d, NULL);
    if (!b || offset != 0 || flags != 0 || size == 0 || size > sh_pool_backing_size(b))
        return CUDA_ERROR_INVALID_VALUE; /* as the driver answers */
    if (size < sh_pool_backing_size(b)) {
        sh_log(SH_LOG_ERROR,
               "cuMemMap(0x%llx, %zu bytes): part of a handle of %zu bytes; stagehand maps "
               "whole handles only (set [regions] manage_program_vmm = false)",
               (unsigned long long)ptr, size, sh_pool_backing_size(b));
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int rc = sh_pool_backing_map(d->pool, b, (uintptr_t)ptr);
    if (rc == SH_EBUSY) {
        sh_log(SH_LOG_ERROR,
               "cuMemMap(0x%llx): the handle is mapped already; stagehand maps each handle at "
               "one address (set [regions] manage_program_vmm = false)",
               (unsigned long long)ptr);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (rc != SH_OK) /* the driver refused the address (not reserved, or mapped) */
        return rc == SH_ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    sh_sched_alloc(d, (uintptr_t)ptr, size, sh_stream_key(NULL));
    return CUDA_SUCCESS;
}

/* A backing mapped where the program asked, and the device whose pool
 * holds it. */
struct mapped {
    uintptr_t va;
    size_t len;
    struct sh_dev *d;
};

static int by_address(const void *a, const void *b)
{
    uintptr_t x = ((const struct mapped *)a)->va, y = ((const struct mapped *)b)->va;
    return (x > y) - (x < y);
}

/* Device d's backings in [ptr, ptr + size), appended to m[*n..cap). -1
 * when a region that is not the program's lies in the range. */
static int device_mappings(struct sh_dev *d, CUdeviceptr ptr, size_t size, struct mapped *m,
                           size_t *n, size_t cap)
{
    uintptr_t va[64];
    size_t len[64], got, at = ptr, end = ptr + size;
    int other = 0;
    do { /* in slices of 64, address order */
        got = sh_pool_backings_in(d->pool, at, end, va, len, 64, &other);
        if (other)
            return -1;
        for (size_t k = 0; k < got && k < 64; k++) {
            if (*n < cap && m)
                m[*n] = (struct mapped){va[k], len[k], d};
            ++*n;
            at = va[k] + len[k];
        }
    } while (got > 64);
    return 0;
}

/* The backings mapped in [ptr, ptr + size), on every managed device: a
 * malloc'd array in address order (NULL when none), *n their count. 0, or
 * CUDA_ERROR_INVALID_VALUE when one is cut by the range or a region that
 * is not the program's lies in it (the program's call would reach memory
 * it does not own). */
static CUresult mappings_in(CUdeviceptr ptr, size_t size, struct mapped **m, size_t *n)
{
    int ndevs = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    size_t cap = 0;
    *m = NULL;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        *n = 0;
        for (int i = 0; i < ndevs; i++)
            if (device_mappings(sh_rt.devs[i], ptr, size, *m, n, cap) != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (*n == 0 || *m)
            break;
        cap = *n;
        if (!(*m = malloc(cap * sizeof **m)))
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *n = *n < cap ? *n : cap;
    if (*n == 0)
        return CUDA_SUCCESS;
    qsort(*m, *n, sizeof **m, by_address);
    for (size_t k = 0; k < *n; k++)
        if ((*m)[k].va < ptr || (*m)[k].va + (*m)[k].len > ptr + size)
            return CUDA_ERROR_INVALID_VALUE; /* the driver unmaps whole mappings only */
    return CUDA_SUCCESS;
}

/* Calls fn on every part of [ptr, ptr + size) that none of the n sorted
 * mappings covers: the driver's own mappings there. */
static CUresult each_gap(CUdeviceptr ptr, size_t size, const struct mapped *m, size_t n,
                         CUresult (*fn)(CUdeviceptr, size_t, void *), void *arg)
{
    uintptr_t at = ptr, end = ptr + size;
    for (size_t k = 0; k <= n; k++) {
        uintptr_t next = k < n ? m[k].va : end;
        if (next > at) {
            CUresult r = fn(at, next - at, arg);
            if (r != CUDA_SUCCESS)
                return r;
        }
        if (k < n)
            at = m[k].va + m[k].len;
    }
    return CUDA_SUCCESS;
}

static CUresult unmap_gap(CUdeviceptr p, size_t size, void *arg)
{
    (void)arg;
    return real.unmap(p, size);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    RESOLVE();
    if (!real.unmap)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sh_active() || size == 0)
        return real.unmap(ptr, size);
    struct mapped *m;
    size_t n;
    CUresult r = mappings_in(ptr, size, &m, &n);
    if (r == CUDA_SUCCESS && n == 0)
        r = real.unmap(ptr, size);
    else if (r == CUDA_SUCCESS) /* the driver's own mappings first: it may refuse them */
        r = each_gap(ptr, size, m, n, unmap_gap, NULL);
    for (size_t k = 0; r == CUDA_SUCCESS && k < n; k++) {
        sh_sched_free(m[k].d, m[k].va);
        sh_pool_backing_unmap(m[k].d->pool, m[k].va);
    }
    free(m);
    return r;
}

struct access {
    const CUmemAccessDesc *desc;
    size_t count;
};

static CUresult access_gap(CUdeviceptr p, size_t size, void *arg)
{
    const struct access *a = arg;
    return real.set_access(p, size, a->desc, a->count);
}

/* 1 when every entry asks, for every mapping, what the library's mappings
 * always give: read and write for the device whose pool holds it. */
static int access_is_ours(const CUmemAccessDesc *desc, size_t count, const struct mapped *m,
                          size_t n)
{
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < count; i++)
            if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
                desc[i].location.id != m[k].d->ordinal ||
                desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                return 0;
    return 1;
}

/* The library's mappings already give their device read and write, at
 * every address a region moves to. Any other access (a peer device, read
 * only) is set on the mappings there now, so those regions are pinned
 * first: a move would map them again without it. */
EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    RESOLVE();
    if (!real.set_access)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sh_active() || !desc || count == 0 || size == 0)
        return real.set_access(ptr, size, desc, count);
    struct mapped *m;
    size_t n;
    CUresult r = mappings_in(ptr, size, &m, &n);
    struct access a = {desc, count};
    if (r == CUDA_SUCCESS && n > 0 && access_is_ours(desc, count, m, n)) {
        r = each_gap(ptr, size, m, n, access_gap, &a);
    } else if (r == CUDA_SUCCESS) {
        for (size_t k = 0; r == CUDA_SUCCESS && k < n; k++)
            r = sh_pin_region(m[k].va) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS)
            r = real.set_access(ptr, size, desc, count);
    }
    free(m);
    return r;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    RESOLVE();
    if (!real.address_free)
        return CUDA_ERROR_NOT_INITIALIZED;
    size_t n = 0;
    int ndevs = sh_active() && size ? atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire) : 0;
    for (int i = 0; i < ndevs; i++)
        n += sh_pool_backings_in(sh_rt.devs[i]->pool, ptr, ptr + size, NULL, NULL, 0, NULL);
    if (n) {
        sh_log(SH_LOG_ERROR, "cuMemAddressFree(0x%llx): %zu mapping(s) still there; unmap first",
               (unsigned long long)ptr, n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return real.address_free(ptr, size);
}
