/* drv_mem.c — simulated device and host memory.
 *
 * A physical handle is a memfd; a reservation is a PROT_NONE mapping; cuMemMap
 * maps the memfd there still PROT_NONE, and only cuMemSetAccess opens it, so
 * a kernel that touches a range at the wrong moment really faults. Device-
 * located handles count against SIMCUDA_VRAM_MB, host-located handles and
 * pinned allocations against SIMCUDA_HOST_MB.
 *
 * Locking: mem_mu guards every table below and the byte counters.
 */
#include "sim.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct sim_handle {
    int fd;
    size_t size;
    int loc;      /* CU_MEM_LOCATION_TYPE_DEVICE or _HOST: what it is charged to */
    int loc_type; /* the CU_MEM_LOCATION_TYPE_* it was created with */
    int nmaps;
    int retains; /* references cuMemRetainAllocationHandle handed out */
    bool released;
};

/* Ranges kept sorted by va in growable arrays; `va` and `size` come first. */
struct range {
    uintptr_t va;
    size_t size;
};
struct map_entry {
    uintptr_t va;
    size_t size;
    unsigned long long handle;
    /* CUmemAccess_flags per location: the device, and the host (HOST and
     * HOST_NUMA alike). The pages get the union of the two, since kernels
     * run on the CPU here. */
    unsigned long long dev_access, host_access;
    bool vmm; /* mapped by cuMemMap (not a cuMemAlloc allocation) */
};
struct resv_entry {
    uintptr_t va;
    size_t size;
};
struct host_entry {
    uintptr_t va;
    size_t size;
    bool registered; /* cuMemHostRegister'd (not ours to unmap) */
};
struct alloc_entry {
    uintptr_t va;
    size_t size, mapped;
    unsigned long long handle;
    bool graph;            /* a graph allocation: the graph's until its last node goes */
    struct sim_pool *pool; /* the pool a stream-ordered allocation came from */
};

struct vec {
    void *data;
    size_t n, cap, elem;
};

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_handle **handles; /* index = handle value; 0 unused */
static size_t nhandles, caphandles;
static struct vec maps = {.elem = sizeof(struct map_entry)};
static struct vec resvs = {.elem = sizeof(struct resv_entry)};
static struct vec hosts = {.elem = sizeof(struct host_entry)};
static struct vec allocs = {.elem = sizeof(struct alloc_entry)};
static size_t dev_in_use, dev_peak, host_in_use;

/* ---- sorted range vectors ---- */

static struct range *at(struct vec *v, size_t i)
{
    return (struct range *)((char *)v->data + i * v->elem);
}

/* Index of the first entry with va > addr. */
static size_t upper(struct vec *v, uintptr_t addr)
{
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (at(v, mid)->va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry containing addr, or NULL. */
static void *find(struct vec *v, uintptr_t addr)
{
    size_t i = upper(v, addr);
    if (i == 0)
        return NULL;
    struct range *r = at(v, i - 1);
    return addr - r->va < r->size ? r : NULL;
}

static bool overlaps(struct vec *v, uintptr_t va, size_t size)
{
    size_t i = upper(v, va);
    if (i > 0 && va - at(v, i - 1)->va < at(v, i - 1)->size)
        return true;
    return i < v->n && at(v, i)->va < va + size;
}

static int insert(struct vec *v, const void *entry)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        void *d = realloc(v->data, cap * v->elem);
        if (!d)
            return -1;
        v->data = d;
        v->cap = cap;
    }
    size_t i = upper(v, ((const struct range *)entry)->va);
    memmove(at(v, i + 1), at(v, i), (v->n - i) * v->elem);
    memcpy(at(v, i), entry, v->elem);
    v->n++;
    return 0;
}

static void erase(struct vec *v, void *entry)
{
    size_t i = (size_t)((char *)entry - (char *)v->data) / v->elem;
    memmove(at(v, i), at(v, i + 1), (v->n - i - 1) * v->elem);
    v->n--;
}

/* ---- accounting ---- */

static bool charge(int loc, size_t bytes)
{
    if (loc == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (bytes > sim_cfg.vram_bytes - dev_in_use)
            return false;
        dev_in_use += bytes;
        if (dev_in_use > dev_peak)
            dev_peak = dev_in_use;
    } else {
        if (bytes > sim_cfg.host_bytes - host_in_use)
            return false;
        host_in_use += bytes;
    }
    return true;
}

static void uncharge(int loc, size_t bytes)
{
    if (loc == CU_MEM_LOCATION_TYPE_DEVICE)
        dev_in_use -= bytes;
    else
        host_in_use -= bytes;
}

void sim_mem_stats(size_t *dev, size_t *peak, size_t *host)
{
    pthread_mutex_lock(&mem_mu);
    *dev = dev_in_use;
    *peak = dev_peak;
    *host = host_in_use;
    pthread_mutex_unlock(&mem_mu);
}

enum sim_memkind sim_mem_kind(uintptr_t addr)
{
    enum sim_memkind k = SIM_MEM_PAGEABLE;
    pthread_mutex_lock(&mem_mu);
    struct map_entry *m = find(&maps, addr);
    if (m)
        k = handles[m->handle]->loc == CU_MEM_LOCATION_TYPE_DEVICE ? SIM_MEM_DEVICE
                                                                   : SIM_MEM_PINNED;
    else if (find(&hosts, addr))
        k = SIM_MEM_PINNED;
    pthread_mutex_unlock(&mem_mu);
    return k;
}

/* ---- physical handles ---- */

static bool aligned(size_t x)
{
    return (x & (sim_cfg.gran - 1)) == 0;
}

static struct sim_handle *handle_get(unsigned long long h)
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
    if (spare_bytes + size > sim_cfg.vram_bytes) {
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

static void handle_destroy(unsigned long long h)
{
    struct sim_handle *sh = handles[h];
    uncharge(sh->loc, sh->size);
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
static CUresult handle_create(size_t size, int loc, unsigned long long *out)
{
    if (!charge(loc, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_handle *sh = calloc(1, sizeof *sh);
    int fd = sh ? new_backing(size, loc) : -1;
    if (!sh || fd < 0) {
        if (fd >= 0)
            close(fd);
        free(sh);
        uncharge(loc, size);
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
            uncharge(loc, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memset(t + caphandles, 0, (cap - caphandles) * sizeof *t);
        handles = t;
        caphandles = cap;
    }
    if (id >= nhandles)
        nhandles = id + 1;
    *sh = (struct sim_handle){.fd = fd, .size = size, .loc = loc, .loc_type = loc};
    handles[id] = sh;
    *out = id;
    return CUDA_SUCCESS;
}

static CUresult check_location(const CUmemLocation *l)
{
    switch (l->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return l->id == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
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
    pthread_mutex_lock(&mem_mu);
    unsigned long long h = 0;
    r = handle_create(size, loc, &h);
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

/* ---- reservations ---- */

static void *map_none(void *at_addr, size_t size, bool fixed)
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
static uintptr_t reserve(size_t size, size_t align, uintptr_t hint)
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
    int bad = insert(&resvs, &e);
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
    struct resv_entry *e = find(&resvs, ptr);
    if (!e || e->va != ptr || e->size != size || overlaps(&maps, ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        erase(&resvs, e);
        munmap((void *)ptr, size);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

/* ---- mappings ---- */

static bool in_one_reservation(uintptr_t va, size_t size)
{
    struct resv_entry *e = find(&resvs, va);
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
    if (!sh || size > sh->size || !in_one_reservation(ptr, size) || overlaps(&maps, ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, sh->fd, 0) ==
               MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        /* A new mapping starts with no access for anyone. */
        struct map_entry m = {.va = ptr, .size = size, .handle = handle, .vmm = true};
        if (insert(&maps, &m) != 0) {
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
    size_t i = upper(&maps, va);
    if (i == 0)
        return false;
    i--;
    struct map_entry *m = (struct map_entry *)at(&maps, i);
    *first = i;
    uintptr_t next = m->va;
    size_t n = 0;
    while (next < va + size && i + n < maps.n) {
        m = (struct map_entry *)at(&maps, i + n);
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
    struct map_entry *m = (struct map_entry *)at(&maps, i);
    return m->va + m->size == end;
}

/* Every mapping in [first, first+count) was made by cuMemMap; mem_mu held. */
static bool all_vmm(size_t first, size_t count)
{
    for (size_t k = 0; k < count; k++)
        if (!((struct map_entry *)at(&maps, first + k))->vmm)
            return false;
    return true;
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
    struct map_entry *m0 = find(&maps, ptr);
    /* Only what cuMemMap mapped: cuMemAlloc memory goes back with cuMemFree. */
    if (!m0 || m0->va != ptr || !covers(ptr, size, &first, &count) ||
        !ends_at(first + count - 1, ptr + size) || !all_vmm(first, count)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        /* No wait for in-flight work: a kernel still using the range faults. */
        map_none((void *)ptr, size, true);
        for (size_t k = 0; k < count; k++) {
            struct map_entry *m = (struct map_entry *)at(&maps, first);
            struct sim_handle *sh = handles[m->handle];
            if (--sh->nmaps == 0 && sh->released && sh->retains == 0)
                handle_destroy(m->handle);
            erase(&maps, m);
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

/* Sets the access of each location named in desc and leaves the others as
 * they were. HOST_NUMA access is refused on memory created elsewhere, as
 * cuda.h says; the pages get the union of the device's and the host's. */
SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count)
{
    CUresult r = sim_enter(__func__, false);
    if (r)
        return r;
    if (!desc || count == 0 || size == 0 || !aligned(size) || !aligned(ptr))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long dev = 0, host = 0;
    bool set_dev = false, set_host = false, host_numa = false;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
            if (desc[i].location.id != 0)
                return CUDA_ERROR_INVALID_DEVICE;
            dev = desc[i].flags;
            set_dev = true;
        } else if (desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                   desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST) {
            host = desc[i].flags;
            set_host = true;
            host_numa |= desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
        } else {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_lock(&mem_mu);
    size_t first = 0, n = 0;
    if (!covers(ptr, size, &first, &n) || !all_vmm(first, n)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (size_t k = 0; k < n && host_numa; k++) {
            struct map_entry *m = (struct map_entry *)at(&maps, first + k);
            if (handles[m->handle]->loc_type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
                r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    for (size_t k = 0; r == CUDA_SUCCESS && k < n; k++) {
        struct map_entry *m = (struct map_entry *)at(&maps, first + k);
        unsigned long long d = set_dev ? dev : m->dev_access;
        unsigned long long h = set_host ? host : m->host_access;
        uintptr_t lo = m->va > ptr ? m->va : ptr;
        uintptr_t hi = m->va + m->size < ptr + size ? m->va + m->size : ptr + size;
        if (mprotect((void *)lo, hi - lo, prot_of(d) | prot_of(h)) != 0) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else {
            m->dev_access = d;
            m->host_access = h;
        }
    }
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
    if (location->type == CU_MEM_LOCATION_TYPE_DEVICE && location->id != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE && !host_location(location->type))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    struct map_entry *m = find(&maps, ptr);
    if (!m)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        *flags = location->type == CU_MEM_LOCATION_TYPE_DEVICE ? m->dev_access : m->host_access;
    pthread_mutex_unlock(&mem_mu);
    return r;
}

/* ---- cuMemAlloc: a private reservation with one device handle ---- */

static size_t round_up(size_t x, size_t to)
{
    return (x + to - 1) / to * to;
}

static CUresult alloc_device(uintptr_t *out, size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t mapped = round_up(size, page);
    uintptr_t va = reserve(mapped, 256 > page ? 256 : page, 0);
    if (!va)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mem_mu);
    unsigned long long h = 0;
    CUresult r = handle_create(mapped, CU_MEM_LOCATION_TYPE_DEVICE, &h);
    if (r == CUDA_SUCCESS) {
        struct alloc_entry a = {va, size, mapped, h, false, NULL};
        struct map_entry m = {.va = va,
                              .size = mapped,
                              .handle = h,
                              .dev_access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (mmap((void *)va, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, handles[h]->fd,
                 0) == MAP_FAILED ||
            insert(&allocs, &a) != 0 || insert(&maps, &m) != 0) {
            struct alloc_entry *e = find(&allocs, va);
            if (e)
                erase(&allocs, e);
            handle_destroy(h);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            handles[h]->nmaps = 1;
            handles[h]->released = true;
        }
    }
    pthread_mutex_unlock(&mem_mu);
    if (r != CUDA_SUCCESS)
        munmap((void *)va, mapped);
    else
        *out = va;
    return r;
}

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t va = 0;
    r = alloc_device(&va, bytesize);
    if (r == CUDA_SUCCESS)
        *dptr = va;
    return r;
}

/* Frees a cuMemAlloc allocation; mem_mu held. */
static CUresult free_device(uintptr_t va)
{
    struct alloc_entry *a = find(&allocs, va);
    if (!a || a->va != va)
        return CUDA_ERROR_INVALID_VALUE;
    struct map_entry *m = find(&maps, va);
    size_t mapped = a->mapped;
    if (a->pool)
        sim_pool_charge(a->pool, a->size, false);
    handle_destroy(a->handle);
    erase(&maps, m);
    erase(&allocs, a);
    munmap((void *)va, mapped);
    return CUDA_SUCCESS;
}

static bool graph_alloc(uintptr_t va);

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (dptr == 0)
        return CUDA_SUCCESS;
    /* Like the real driver, freeing waits for the device. */
    if ((r = sim_ctx_synchronize()))
        return r;
    if (graph_alloc(dptr))
        return CUDA_SUCCESS; /* the graph gives it back when it goes */
    pthread_mutex_lock(&mem_mu);
    r = free_device(dptr);
    pthread_mutex_unlock(&mem_mu);
    return r;
}

/* ---- graph memory nodes ----
 * cuMemAllocAsync inside a capture makes an allocation node: the address is
 * fixed when it is captured and belongs to the graph (and every executable
 * graph made from it) until the last of them is destroyed. Every copy of
 * the node holds a reference; the last one frees the memory. A free of a
 * graph allocation (a free node in the capture, or a plain free outside
 * it) leaves the memory to the graph. */

struct gmem {
    _Atomic int refs;
    uintptr_t va;
};

struct gmem_op {
    struct sim_op op;
    struct gmem *g;
};

static void gmem_run(struct sim_op *op)
{
    (void)op; /* the memory is there from capture to destruction */
}

static void gmem_ref(struct sim_op *op)
{
    struct gmem *g = ((struct gmem_op *)op)->g;
    if (g)
        atomic_fetch_add(&g->refs, 1);
}

static void gmem_fini(struct sim_op *op)
{
    struct gmem *g = ((struct gmem_op *)op)->g;
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) {
        pthread_mutex_lock(&mem_mu);
        struct alloc_entry *a = find(&allocs, g->va);
        if (a && a->va == g->va)
            a->graph = false;
        free_device(g->va);
        pthread_mutex_unlock(&mem_mu);
        free(g);
    }
    free(op->waits);
    free(op);
}

/* 1 when va is the start of a graph allocation. */
static bool graph_alloc(uintptr_t va)
{
    pthread_mutex_lock(&mem_mu);
    struct alloc_entry *a = find(&allocs, va);
    bool g = a && a->va == va && a->graph;
    pthread_mutex_unlock(&mem_mu);
    return g;
}

static CUresult capture_alloc(CUdeviceptr *dptr, size_t bytesize, struct sim_stream *s)
{
    uintptr_t va = 0;
    struct gmem_op *op = calloc(1, sizeof *op);
    struct gmem *g = calloc(1, sizeof *g);
    CUresult r = op && g ? alloc_device(&va, bytesize) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r) {
        free(op);
        free(g);
        return r;
    }
    pthread_mutex_lock(&mem_mu);
    ((struct alloc_entry *)find(&allocs, va))->graph = true;
    pthread_mutex_unlock(&mem_mu);
    *g = (struct gmem){1, va};
    *op = (struct gmem_op){.op = {.run = gmem_run,
                                  .fini = gmem_fini,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEM_ALLOC,
                                  .relocate = gmem_ref},
                           .g = g};
    if ((r = sim_stream_submit(s, &op->op, NULL))) /* op->fini has freed it */
        return r;
    *dptr = va;
    return CUDA_SUCCESS;
}

static CUresult capture_free(CUdeviceptr dptr, struct sim_stream *s)
{
    if (!graph_alloc(dptr)) /* a free node must free a graph allocation */
        return CUDA_ERROR_INVALID_VALUE;
    struct gmem_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *op = (struct gmem_op){.op = {.run = gmem_run,
                                  .fini = gmem_fini,
                                  .size = sizeof *op,
                                  .node_type = CU_GRAPH_NODE_TYPE_MEM_FREE}};
    return sim_stream_submit(s, &op->op, NULL);
}

/* Stream-ordered allocation from pool: memory is usable at once; the free
 * runs when the stream reaches it. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, struct sim_pool *pool,
                            CUstream stream)
{
    CUresult r;
    struct sim_stream *s = sim_stream_get(stream);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureStatus cs;
    if ((r = sim_capture_query(s, &cs)))
        return r; /* the legacy stream while another captures */
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
        return capture_alloc(dptr, bytesize, s);
    uintptr_t va = 0;
    r = alloc_device(&va, bytesize);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Memory freed earlier on this stream is this allocation's to
         * reuse, in stream order: let those frees happen, then retry. */
        sim_stream_drain(s);
        r = alloc_device(&va, bytesize);
    }
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&mem_mu);
    ((struct alloc_entry *)find(&allocs, va))->pool = pool;
    sim_pool_charge(pool, bytesize, true);
    pthread_mutex_unlock(&mem_mu);
    *dptr = va;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    CUresult r = sim_enter(__func__, true);
    return r ? r : alloc_async(dptr, bytesize, sim_pool_current(), stream);
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream stream)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_pool *p = sim_pool_get(pool);
    return p ? alloc_async(dptr, bytesize, p, stream) : CUDA_ERROR_INVALID_VALUE;
}

struct free_op {
    struct sim_op op;
    uintptr_t va;
};

static void free_op_run(struct sim_op *op)
{
    pthread_mutex_lock(&mem_mu);
    free_device(((struct free_op *)op)->va);
    pthread_mutex_unlock(&mem_mu);
}

static void op_free(struct sim_op *op)
{
    free(op->waits);
    free(op);
}

SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    struct sim_stream *s = sim_stream_get(stream);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mem_mu);
    struct alloc_entry *a = find(&allocs, dptr);
    bool ok = a && a->va == dptr;
    pthread_mutex_unlock(&mem_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureStatus cs;
    if ((r = sim_capture_query(s, &cs)))
        return r;
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
        return capture_free(dptr, s);
    if (graph_alloc(dptr))
        return CUDA_SUCCESS; /* the graph gives it back when it goes */
    struct free_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->op.run = free_op_run;
    op->op.fini = op_free;
    op->op.size = sizeof *op;
    op->op.capture = SIM_CAP_REFUSE; /* a free node frees only graph memory */
    op->va = dptr;
    return sim_stream_submit(s, &op->op, NULL);
}

SIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    *total = sim_cfg.vram_bytes;
    *free_bytes = sim_cfg.vram_bytes - dev_in_use;
    pthread_mutex_unlock(&mem_mu);
    return CUDA_SUCCESS;
}

/* ---- pinned host memory ---- */

static CUresult host_alloc(const char *api, void **pp, size_t bytesize, unsigned int flags)
{
    CUresult r = sim_enter(api, true);
    if (r)
        return r;
    if (!pp || bytesize == 0 || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    size_t size = round_up(bytesize, (size_t)sysconf(_SC_PAGESIZE));
    pthread_mutex_lock(&mem_mu);
    if (!charge(CU_MEM_LOCATION_TYPE_HOST, size)) {
        pthread_mutex_unlock(&mem_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct host_entry e = {(uintptr_t)p, size, false};
    if (p == MAP_FAILED || insert(&hosts, &e) != 0) {
        if (p != MAP_FAILED)
            munmap(p, size);
        uncharge(CU_MEM_LOCATION_TYPE_HOST, size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *pp = p;
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    return host_alloc(__func__, pp, bytesize, flags);
}

SIM_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return host_alloc(__func__, pp, bytesize, 0);
}

SIM_EXPORT CUresult cuMemFreeHost(void *p)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    pthread_mutex_lock(&mem_mu);
    struct host_entry *e = find(&hosts, (uintptr_t)p);
    if (!e || e->va != (uintptr_t)p || e->registered) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        munmap(p, e->size);
        uncharge(CU_MEM_LOCATION_TYPE_HOST, e->size);
        erase(&hosts, e);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!p || bytesize == 0 || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    if (overlaps(&hosts, (uintptr_t)p, bytesize)) {
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    } else if (!charge(CU_MEM_LOCATION_TYPE_HOST, bytesize)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct host_entry e = {(uintptr_t)p, bytesize, true};
        if (insert(&hosts, &e) != 0) {
            uncharge(CU_MEM_LOCATION_TYPE_HOST, bytesize);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostUnregister(void *p)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    pthread_mutex_lock(&mem_mu);
    struct host_entry *e = find(&hosts, (uintptr_t)p);
    if (!e || e->va != (uintptr_t)p || !e->registered) {
        r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    } else {
        uncharge(CU_MEM_LOCATION_TYPE_HOST, e->size);
        erase(&hosts, e);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}

SIM_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    CUresult r = sim_enter(__func__, true);
    if (r)
        return r;
    if (!pdptr || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mu);
    bool known = find(&hosts, (uintptr_t)p) != NULL;
    pthread_mutex_unlock(&mem_mu);
    if (!known)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)p; /* unified addressing */
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
    const struct alloc_entry *a = find(&allocs, p);
    const struct map_entry *m = a ? NULL : find(&maps, p);
    const struct host_entry *h = a || m ? NULL : find(&hosts, p);
    if (a)
        i = (struct sim_ptr_info){CU_MEMORYTYPE_DEVICE, a->va, a->size, false};
    else if (m)
        i = (struct sim_ptr_info){handles[m->handle]->loc == CU_MEM_LOCATION_TYPE_DEVICE
                                      ? CU_MEMORYTYPE_DEVICE
                                      : CU_MEMORYTYPE_HOST,
                                  m->va, m->size, m->vmm};
    else if (h)
        i = (struct sim_ptr_info){CU_MEMORYTYPE_HOST, h->va, h->size, false};
    pthread_mutex_unlock(&mem_mu);
    return i;
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
    const struct map_entry *m = find(&maps, (uintptr_t)addr);
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
    const struct alloc_entry *a = find(&allocs, dptr);
    if (!a || a->va != dptr) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        memset(handle, 0, sizeof *handle);
        memcpy(handle->reserved, &a->va, sizeof a->va);
    }
    pthread_mutex_unlock(&mem_mu);
    return r;
}
