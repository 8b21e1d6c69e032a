/* drv_vmm.c — virtual memory management: reservations, mappings and
 * access (cuMemAddressReserve, cuMemMap, cuMemUnmap, cuMemSetAccess).
 *
 * Locking: mem_mu (mem.h).
 */
#include "mem.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- reservations ---- */

void *map_none(void *at_addr, size_t size, bool fixed)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (fixed)
        flags |= MAP_FIXED;
    else if (at_addr)
        flags |= MAP_FIXED_NOREPLACE;
    void *p = mmap(at_addr, size, PROT_NONE, flags, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Reserves size bytes aligned to align (a power of two >= granularity). */
uintptr_t reserve(size_t size, size_t align, uintptr_t hint)
{
    if (hint && (hint & (align - 1)) == 0) {
        void *p = map_none((void *)hint, size, false);
        if (p == (void *)hint)
            return hint;
        if (p)
            munmap(p, size);
    }
    char *p = map_none(NULL, size + align, false);
    if (!p)
        return 0;
    uintptr_t base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    size_t tail = (uintptr_t)p + size + align - (base + size);
    if (tail)
        munmap((void *)(base + size), tail);
    return base;
}

SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    /* cuda.h: size and address "must be a multiple of the host page size". */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!ptr || size == 0 || size % page || flags != 0 || addr % page ||
        (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > sim_cfg.gran ? alignment : sim_cfg.gran;
    uintptr_t va = reserve(size, align, addr);
    if (!va)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mem_mu);
    struct resv_entry e = {va, size};
    int bad = vec_insert(&resvs, &e);
    pthread_mutex_unlock(&mem_mu);
    if (bad) {
        munmap((void *)va, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = va;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    pthread_mutex_lock(&mem_mu);
    struct resv_entry *e = vec_find(&resvs, ptr);
    if (!e || e->va != ptr || e->size != size || vec_overlaps(&maps, ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        vec_erase(&resvs, e);
        munmap((void *)ptr, size);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

/* ---- mappings ---- */

static bool in_one_reservation(uintptr_t va, size_t size)
{
    struct resv_entry *e = vec_find(&resvs, va);
    return e && va + size <= e->va + e->size;
}

SIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (offset != 0 || flags != 0 || size == 0 || !aligned(size) || !aligned(ptr))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    struct sim_handle *sh = handle_get(handle);
    if (!sh || size > sh->size || !in_one_reservation(ptr, size) ||
        vec_overlaps(&maps, ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (size != sh->size) {
        /* An H200 with driver 580 maps a handle whole or not at all, for
         * device and host locations alike (tests/gpu, 2026-11-27). */
        r = CUDA_ERROR_NOT_SUPPORTED;
    } else if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, sh->fd, 0) ==
               MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        /* A new mapping starts with no access for anyone. */
        static uint64_t serials;
        struct map_entry m = {
            .va = ptr, .size = size, .handle = handle, .vmm = true, .serial = ++serials};
        if (vec_insert(&maps, &m) != 0) {
            map_none((void *)ptr, size, true);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            sh->nmaps++;
        }
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

/* The mappings [first, first+count) cover [va, va+size) exactly and
 * contiguously; mem_mu held. Returns false for gaps or partial overlap. */
static bool covers(uintptr_t va, size_t size, size_t *first, size_t *count)
{
    size_t i = vec_upper(&maps, va);
    if (i == 0)
        return false;
    i--;
    struct map_entry *m = (struct map_entry *)vec_at(&maps, i);
    *first = i;
    uintptr_t next = m->va;
    size_t n = 0;
    while (next < va + size && i + n < maps.n) {
        m = (struct map_entry *)vec_at(&maps, i + n);
        if (m->va != next)
            return false;
        next = m->va + m->size;
        n++;
    }
    *count = n;
    return next >= va + size;
}

static bool ends_at(size_t i, uintptr_t end)
{
    struct map_entry *m = (struct map_entry *)vec_at(&maps, i);
    return m->va + m->size == end;
}

/* Every mapping in [first, first+count) was made by cuMemMap; mem_mu held. */
static bool all_vmm(size_t first, size_t count)
{
    for (size_t k = 0; k < count; k++)
        if (!((struct map_entry *)vec_at(&maps, first + k))->vmm)
            return false;
    return true;
}

uint64_t sim_map_serial(uintptr_t va)
{
    pthread_mutex_lock(&mem_mu);
    const struct map_entry *m = vec_find(&maps, va);
    uint64_t serial = m && m->vmm ? m->serial : 0;
    pthread_mutex_unlock(&mem_mu);
    return serial;
}

SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (size == 0 || !aligned(size) || !aligned(ptr))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    size_t first, count;
    struct map_entry *m0 = vec_find(&maps, ptr);
    /* Only what cuMemMap mapped: cuMemAlloc memory goes back with cuMemFree. */
    if (!m0 || m0->va != ptr || !covers(ptr, size, &first, &count) ||
        !ends_at(first + count - 1, ptr + size) || !all_vmm(first, count)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        /* No wait for in-flight work: a kernel still using the range faults. */
        map_none((void *)ptr, size, true);
        for (size_t k = 0; k < count; k++) {
            struct map_entry *m = (struct map_entry *)vec_at(&maps, first);
            struct sim_handle *sh = handles[m->handle];
            if (--sh->nmaps == 0 && sh->released && sh->retains == 0)
                handle_destroy(m->handle);
            vec_erase(&maps, m);
        }
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

static int prot_of(unsigned long long flags)
{
    switch (flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
        return PROT_READ;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        return PROT_READ | PROT_WRITE;
    default:
        return PROT_NONE;
    }
}

static bool host_location(CUmemLocationType t)
{
    return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

/* What cuMemSetAccess asks for: each location's new flags, or -1 to leave
 * them as they are. */
struct access_req {
    int dev[SIM_MAX_DEVICES], host;
    bool host_numa;
};

static CUresult parse_access(const CUmemAccessDesc *desc, size_t count, struct access_req *q)
{
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        q->dev[d] = -1;
    q->host = -1;
    q->host_numa = false;
    for (size_t i = 0; i < count; i++) {
        const CUmemLocation *l = &desc[i].location;
        if (desc[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        if (l->type == CU_MEM_LOCATION_TYPE_DEVICE) {
            if (!sim_device_valid(l->id))
                return CUDA_ERROR_INVALID_DEVICE;
            q->dev[l->id] = (int)desc[i].flags;
        } else if (l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                   l->type == CU_MEM_LOCATION_TYPE_HOST) {
            q->host = (int)desc[i].flags;
            q->host_numa |= l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
        } else {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

/* Gives the part of m in [ptr, ptr + size) the access q asks for; the pages
 * get the union of every location's. mem_mu held. */
static CUresult apply_access(struct map_entry *m, const struct access_req *q, uintptr_t ptr,
                             size_t size)
{
    unsigned char dev[SIM_MAX_DEVICES];
    int prot = PROT_NONE;
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        dev[d] = q->dev[d] >= 0 ? (unsigned char)q->dev[d] : m->dev_access[d];
        prot |= prot_of(dev[d]);
    }
    unsigned long long h = q->host >= 0 ? (unsigned long long)q->host : m->host_access;
    uintptr_t lo = m->va > ptr ? m->va : ptr;
    uintptr_t hi = m->va + m->size < ptr + size ? m->va + m->size : ptr + size;
    if (mprotect((void *)lo, hi - lo, prot | prot_of(h)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(m->dev_access, dev, sizeof dev);
    m->host_access = h;
    return CUDA_SUCCESS;
}

/* Sets the access of each location named in desc and leaves the others as
 * they were. HOST_NUMA access is refused on memory created elsewhere, as
 * cuda.h says. Any device may be given access to memory of any other (every
 * pair can access each other's, cuDeviceCanAccessPeer). */
SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!desc || count == 0 || size == 0 || !aligned(size) || !aligned(ptr))
        return CUDA_ERROR_INVALID_VALUE;
    struct access_req q;
    if ((r = parse_access(desc, count, &q)))
        return r;
    pthread_mutex_lock(&mem_mu);
    size_t first = 0, n = 0;
    if (!covers(ptr, size, &first, &n) || !all_vmm(first, n)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (size_t k = 0; k < n && q.host_numa; k++) {
            struct map_entry *m = (struct map_entry *)vec_at(&maps, first + k);
            if (handles[m->handle]->loc_type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
                r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    for (size_t k = 0; r == CUDA_SUCCESS && k < n; k++)
        r = apply_access((struct map_entry *)vec_at(&maps, first + k), &q, ptr, size);
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                   CUdeviceptr ptr)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!flags || !location)
        return CUDA_ERROR_INVALID_VALUE;
    if (location->type == CU_MEM_LOCATION_TYPE_DEVICE && !sim_device_valid(location->id))
        return CUDA_ERROR_INVALID_DEVICE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE && !host_location(location->type))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    struct map_entry *m = vec_find(&maps, ptr);
    if (!m)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        *flags = location->type == CU_MEM_LOCATION_TYPE_DEVICE ? m->dev_access[location->id]
                                                               : m->host_access;
    pthread_mutex_unlock(&mem_mu);
    return r;
}
