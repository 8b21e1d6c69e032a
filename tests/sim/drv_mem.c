/* drv_mem.c — simulated device and host memory: the tables, accounting,
 * physical handles, and what the driver knows of an address.
 *
 * A physical handle is a memfd; a reservation is a PROT_NONE mapping; cuMemMap
 * maps the memfd there still PROT_NONE, and only cuMemSetAccess opens it, so
 * a kernel that touches a range at the wrong moment really faults. Device-
 * located handles count against SIMCUDA_VRAM_MB, host-located handles and
 * pinned allocations against SIMCUDA_HOST_MB.
 *
 * Locking: mem_mu guards every table (mem.h) and the byte counters.
 */
#include "mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
struct sim_handle **handles; /* index = handle value; 0 unused */
size_t nhandles;
static size_t caphandles;
struct vec maps = {.elem = sizeof(struct map_entry)};
struct vec resvs = {.elem = sizeof(struct resv_entry)};
struct vec hosts = {.elem = sizeof(struct host_entry)};
struct vec allocs = {.elem = sizeof(struct alloc_entry)};
static size_t dev_in_use[SIM_MAX_DEVICES], all_in_use, all_peak, host_in_use;

/* ---- sorted range vectors ---- */

struct range *vec_at(struct vec *v, size_t i)
{
    return (struct range *)((char *)v->data + i * v->elem);
}

/* Index of the first entry with va > addr. */
size_t vec_upper(struct vec *v, uintptr_t addr)
{
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (vec_at(v, mid)->va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry containing addr, or NULL. */
void *vec_find(struct vec *v, uintptr_t addr)
{
    size_t i = vec_upper(v, addr);
    if (i == 0)
        return NULL;
    struct range *r = vec_at(v, i - 1);
    return addr - r->va < r->size ? r : NULL;
}

bool vec_overlaps(struct vec *v, uintptr_t va, size_t size)
{
    size_t i = vec_upper(v, va);
    if (i > 0 && va - vec_at(v, i - 1)->va < vec_at(v, i - 1)->size)
        return true;
    return i < v->n && vec_at(v, i)->va < va + size;
}

int vec_insert(struct vec *v, const void *entry)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        void *d = realloc(v->data, cap * v->elem);
        if (!d)
            return -1;
        v->data = d;
        v->cap = cap;
    }
    size_t i = vec_upper(v, ((const struct range *)entry)->va);
    memmove(vec_at(v, i + 1), vec_at(v, i), (v->n - i) * v->elem);
    memcpy(vec_at(v, i), entry, v->elem);
    v->n++;
    return 0;
}

void vec_erase(struct vec *v, void *entry)
{
    size_t i = (size_t)((char *)entry - (char *)v->data) / v->elem;
    memmove(vec_at(v, i), vec_at(v, i + 1), (v->n - i - 1) * v->elem);
    v->n--;
}

/* ---- accounting ---- */

bool charge(int loc, int dev, size_t bytes)
{
    if (loc == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (bytes > sim_cfg.vram_bytes[dev] - dev_in_use[dev])
            return false;
        dev_in_use[dev] += bytes;
        all_in_use += bytes;
        if (all_in_use > all_peak)
            all_peak = all_in_use;
    } else {
        if (bytes > sim_cfg.host_bytes - host_in_use)
            return false;
        host_in_use += bytes;
    }
    return true;
}

void uncharge(int loc, int dev, size_t bytes)
{
    if (loc == CU_MEM_LOCATION_TYPE_DEVICE) {
        dev_in_use[dev] -= bytes;
        all_in_use -= bytes;
    } else
        host_in_use -= bytes;
}

void sim_mem_stats(size_t *dev, size_t *peak, size_t *host)
{
    pthread_mutex_lock(&mem_mu);
    *dev = all_in_use;
    *peak = all_peak;
    *host = host_in_use;
    pthread_mutex_unlock(&mem_mu);
}

SIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = sim_current_device();
    pthread_mutex_lock(&mem_mu);
    *total = sim_cfg.vram_bytes[dev];
    *free_bytes = sim_cfg.vram_bytes[dev] - dev_in_use[dev];
    pthread_mutex_unlock(&mem_mu);
    return CUDA_SUCCESS;
}

enum sim_memkind sim_mem_kind(uintptr_t addr)
{
    enum sim_memkind k = SIM_MEM_PAGEABLE;
    pthread_mutex_lock(&mem_mu);
    struct map_entry *m = vec_find(&maps, addr);
    if (m)
        k = handles[m->handle]->loc == CU_MEM_LOCATION_TYPE_DEVICE ? SIM_MEM_DEVICE
                                                                   : SIM_MEM_PINNED;
    else if (vec_find(&hosts, addr))
        k = SIM_MEM_PINNED;
    pthread_mutex_unlock(&mem_mu);
    return k;
}

/* ---- physical handles ---- */

bool aligned(size_t x)
{
    return (x & (sim_cfg.gran - 1)) == 0;
}

struct sim_handle *handle_get(unsigned long long h)
{
    if (h == 0 || h >= nhandles || !handles[h] || (handles[h]->released && !handles[h]->retains))
        return NULL; /* a retained reference keeps it usable */
    return handles[h];
}

/* Device memory released goes back to the card, not to the kernel: its
 * backing files are kept (up to the VRAM size) and handed to the next
 * handle of the same size, stale bytes and all, as a GPU hands out pages
 * without clearing them. Touching fresh pages costs the process far more
 * than any modelled copy of them; mem_mu. */
static struct spare_fd {
    int fd;
    size_t size;
} * spares;
static size_t nspares, capspares, spare_bytes;

static void spare_put(int fd, size_t size)
{
    if (spare_bytes + size > sim_cfg.vram_total) {
        close(fd);
        return;
    }
    if (nspares == capspares) {
        size_t cap = capspares ? capspares * 2 : 64;
        struct spare_fd *t = realloc(spares, cap * sizeof *t);
        if (!t) {
            close(fd);
            return;
        }
        spares = t;
        capspares = cap;
    }
    spares[nspares++] = (struct spare_fd){fd, size};
    spare_bytes += size;
}

static int spare_take(size_t size)
{
    for (size_t i = nspares; i-- > 0;)
        if (spares[i].size == size) {
            int fd = spares[i].fd;
            spares[i] = spares[--nspares];
            spare_bytes -= size;
            return fd;
        }
    return -1;
}

void handle_destroy(unsigned long long h)
{
    struct sim_handle *sh = handles[h];
    uncharge(sh->loc, sh->dev, sh->size);
    if (sh->loc == CU_MEM_LOCATION_TYPE_DEVICE)
        spare_put(sh->fd, sh->size);
    else
        close(sh->fd);
    free(sh);
    handles[h] = NULL;
}

static int new_backing(size_t size, int loc)
{
    int fd = loc == CU_MEM_LOCATION_TYPE_DEVICE ? spare_take(size) : -1;
    if (fd >= 0)
        return fd;
    fd = memfd_create("simcuda", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Creates a handle; mem_mu held. */
CUresult handle_create(size_t size, int loc, int dev, unsigned long long *out)
{
    if (!charge(loc, dev, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_handle *sh = calloc(1, sizeof *sh);
    int fd = sh ? new_backing(size, loc) : -1;
    if (!sh || fd < 0) {
        if (fd >= 0)
            close(fd);
        free(sh);
        uncharge(loc, dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t id = 1;
    while (id < nhandles && handles[id])
        id++;
    if (id >= caphandles) {
        size_t cap = caphandles ? caphandles * 2 : 256;
        struct sim_handle **t = realloc(handles, cap * sizeof *t);
        if (!t) {
            close(fd);
            free(sh);
            uncharge(loc, dev, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memset(t + caphandles, 0, (cap - caphandles) * sizeof *t);
        handles = t;
        caphandles = cap;
    }
    if (id >= nhandles)
        nhandles = id + 1;
    *sh = (struct sim_handle){.fd = fd, .size = size, .loc = loc, .loc_type = loc, .dev = dev};
    handles[id] = sh;
    *out = id;
    return CUDA_SUCCESS;
}

static CUresult check_location(const CUmemLocation *l)
{
    switch (l->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return sim_device_valid(l->id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        if (sim_driver_version() < SIM_HOST_VMM_SINCE) /* a location type it does not know */
            return CUDA_ERROR_INVALID_VALUE;
        return sim_cfg.no_host_vmm ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!handle || !prop || flags != 0 || size == 0 || !aligned(size) ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    /* cuda.h: HOST_NUMA_CURRENT "will result in CUDA_ERROR_INVALID_VALUE";
     * HOST allocations "are not IPC capable and requestedHandleTypes must be
     * 0, any other value will result in CUDA_ERROR_INVALID_VALUE". */
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT ||
        (prop->location.type == CU_MEM_LOCATION_TYPE_HOST && prop->requestedHandleTypes != 0))
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check_location(&prop->location)))
        return r;
    int loc = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? CU_MEM_LOCATION_TYPE_DEVICE
                                                                 : CU_MEM_LOCATION_TYPE_HOST;
    int dev = loc == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : 0;
    pthread_mutex_lock(&mem_mu);
    unsigned long long h = 0;
    r = handle_create(size, loc, dev, &h);
    if (r == CUDA_SUCCESS)
        handles[h]->loc_type = prop->location.type;
    pthread_mutex_unlock(&mem_mu);
    if (r == CUDA_SUCCESS)
        *handle = h;
    return r;
}

SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    pthread_mutex_lock(&mem_mu);
    struct sim_handle *sh = handle && handle < nhandles ? handles[handle] : NULL;
    if (!sh || (sh->released && sh->retains == 0)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (sh->retains > 0 && !sh->released) {
        sh->retains--; /* a retained reference goes; the creator's stays */
    } else if (sh->retains > 0) {
        if (--sh->retains == 0 && sh->nmaps == 0)
            handle_destroy(handle);
    } else if (sh->nmaps > 0) {
        sh->released = true; /* freed when the last mapping goes */
    } else {
        handle_destroy(handle);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                  const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!granularity || !prop ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check_location(&prop->location)))
        return r;
    *granularity = sim_cfg.gran;
    return CUDA_SUCCESS;
}

/* ---- pointer queries (drv_ptr.c answers them) ---- */

/* (sim.h) A cuMemAlloc
 * allocation is one range; a VMM mapping is the range of the handle mapped
 * there (cuda.h: "the allocation" is the one handle), located where the
 * handle lives, so a host-located handle mapped at a device address reads
 * as host memory; pinned host memory is host memory. */
struct sim_ptr_info sim_ptr_info(uintptr_t p)
{
    struct sim_ptr_info i = {0};
    pthread_mutex_lock(&mem_mu);
    const struct alloc_entry *a = vec_find(&allocs, p);
    const struct map_entry *m = a ? NULL : vec_find(&maps, p);
    const struct host_entry *h = a || m ? NULL : vec_find(&hosts, p);
    if (a)
        i = (struct sim_ptr_info){CU_MEMORYTYPE_DEVICE, a->va, a->size, false, a->dev};
    else if (m)
        i = (struct sim_ptr_info){handles[m->handle]->loc == CU_MEM_LOCATION_TYPE_DEVICE
                                      ? CU_MEMORYTYPE_DEVICE
                                      : CU_MEMORYTYPE_HOST,
                                  m->va, m->size, m->vmm, handles[m->handle]->dev};
    else if (h)
        i = (struct sim_ptr_info){CU_MEMORYTYPE_HOST, h->va, h->size, false, h->dev};
    pthread_mutex_unlock(&mem_mu);
    return i;
}

/* ---- what a kernel on a device may touch (sim.h) ---- */

/* Whether device dev may touch a cuMemAlloc or pool allocation; mem_mu held. */
static bool alloc_reachable(int dev, const struct alloc_entry *a, char *why, size_t n)
{
    if (a->dev == dev || (!a->pool && sim_peer_enabled(dev, a->dev)))
        return true;
    if (a->pool)
        snprintf(why, n,
                 "a stream-ordered allocation of device %d (only cuMemPoolSetAccess, which "
                 "the simulated GPU does not offer, opens one to another device)",
                 a->dev);
    else
        snprintf(why, n, "memory of device %d, with no peer access from device %d", a->dev, dev);
    return false;
}

bool sim_kernel_may_touch(int dev, uintptr_t p, char *why, size_t n)
{
    bool ok = true;
    pthread_mutex_lock(&mem_mu);
    const struct alloc_entry *a = vec_find(&allocs, p);
    const struct map_entry *m = a ? NULL : vec_find(&maps, p);
    if (a) {
        ok = alloc_reachable(dev, a, why, n);
    } else if (m && !m->dev_access[dev]) {
        ok = false;
        snprintf(why, n, "a VMM mapping with no access for device %d (cuMemSetAccess)", dev);
    }
    pthread_mutex_unlock(&mem_mu);
    return ok;
}

/* ---- handles behind addresses, and IPC ---- */

/* Another reference to the handle mapped at addr (VMM memory only), to be
 * given back with cuMemRelease; the memory lives until every reference and
 * mapping is gone. */
SIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    const struct map_entry *m = vec_find(&maps, (uintptr_t)addr);
    if (!m || !m->vmm) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        handles[m->handle]->retains++;
        *handle = m->handle;
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                           CUmemGenericAllocationHandle handle)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    const struct sim_handle *sh = handle && handle < nhandles ? handles[handle] : NULL;
    if (!sh) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->location.type = (CUmemLocationType)sh->loc_type;
        if (sh->loc == CU_MEM_LOCATION_TYPE_DEVICE)
            prop->location.id = sh->dev;
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

/* Legacy IPC exports cuMemAlloc memory only: VMM memory is refused (it is
 * shared through cuMemExportToShareableHandle instead). The handle names
 * the allocation's address; nothing here opens one. */
SIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    const struct alloc_entry *a = vec_find(&allocs, dptr);
    if (!a || a->va != dptr) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        memset(handle, 0, sizeof *handle);
        memcpy(handle->reserved, &a->va, sizeof a->va);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}
