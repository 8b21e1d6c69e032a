/* mem.h — the simulated driver's memory tables, shared by drv_mem.c
 * (tables, accounting, physical handles, pointer queries), drv_vmm.c
 * (reservations, mappings, access) and drv_alloc.c (cuMemAlloc, stream-
 * ordered and graph allocations, pinned host memory).
 *
 * Locking: mem_mu guards every table below and the byte counters; every
 * function here expects it held unless it says otherwise.
 */
#ifndef SIM_MEM_H
#define SIM_MEM_H

#include "sim.h"

#include <pthread.h>

struct sim_handle {
    int fd;
    size_t size;
    int loc;      /* CU_MEM_LOCATION_TYPE_DEVICE or _HOST: what it is charged to */
    int loc_type; /* the CU_MEM_LOCATION_TYPE_* it was created with */
    int dev;      /* the device of a device-located handle */
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
    /* CUmemAccess_flags per location: each device, and the host (HOST and
     * HOST_NUMA alike). The pages get the union of them all, since kernels
     * run on the CPU here; a kernel on a device without access is caught by
     * its launch's pointer check (sim_kernel_may_touch). */
    unsigned char dev_access[SIM_MAX_DEVICES];
    unsigned long long host_access;
    bool vmm;        /* mapped by cuMemMap (not a cuMemAlloc allocation) */
    uint64_t serial; /* which cuMemMap made it: never the same twice */
};
struct resv_entry {
    uintptr_t va;
    size_t size;
};
struct host_entry {
    uintptr_t va;
    size_t size;
    bool registered; /* cuMemHostRegister'd (not ours to unmap) */
    int dev;         /* the device current when it was allocated */
};
struct alloc_entry {
    uintptr_t va;
    size_t size, mapped;
    unsigned long long handle;
    bool graph; /* a graph allocation: the graph's until its last node goes */
    bool pool;  /* from a pool (stream-ordered or graph): its device's alone */
    int dev;
    struct sim_pool *mpool; /* the memory pool a stream-ordered allocation came from */
};

struct vec {
    void *data;
    size_t n, cap, elem;
};

extern pthread_mutex_t mem_mu;
extern struct sim_handle **handles; /* index = handle value; 0 unused */
extern size_t nhandles;
extern struct vec maps, resvs, hosts, allocs;

/* Sorted range vectors: entries start with `va` and `size`. */
struct range *vec_at(struct vec *v, size_t i);
/* Index of the first entry with va > addr. */
size_t vec_upper(struct vec *v, uintptr_t addr);
/* The entry containing addr, or NULL. */
void *vec_find(struct vec *v, uintptr_t addr);
bool vec_overlaps(struct vec *v, uintptr_t va, size_t size);
int vec_insert(struct vec *v, const void *entry);
void vec_erase(struct vec *v, void *entry);

/* Counts bytes against device dev's limit (loc DEVICE) or the host's;
 * false if over. */
bool charge(int loc, int dev, size_t bytes);
void uncharge(int loc, int dev, size_t bytes);
/* A multiple of the allocation granularity. */
bool aligned(size_t x);
/* A usable handle, or NULL. */
struct sim_handle *handle_get(unsigned long long h);
CUresult handle_create(size_t size, int loc, int dev, unsigned long long *out);
void handle_destroy(unsigned long long h);

/* A PROT_NONE mapping at at_addr (anywhere if NULL; replacing what is
 * there if fixed). Needs no lock. */
void *map_none(void *at_addr, size_t size, bool fixed);
/* Reserves size bytes aligned to align, at hint if it is free; 0 if none.
 * Needs no lock. */
uintptr_t reserve(size_t size, size_t align, uintptr_t hint);

static inline size_t round_up(size_t x, size_t to)
{
    return (x + to - 1) / to * to;
}

#endif
