/* peermap.c — what several devices in one process ask of the library's
 * mappings and drains.
 *
 * Regions live on the managed devices as VMM mappings, whose access only
 * cuMemSetAccess grants: peer access (cuCtxEnablePeerAccess) opens
 * cudaMalloc memory to another device but, as CUDA defines it, not VMM
 * memory. So a program's peer access to a managed device is turned here
 * into access for the peer device on every mapping the library has made
 * on it (the table below, each mapping with its device), and on every one
 * it makes later (sh_peers_mapped, from vmm_map); disabling the last link
 * from a device to it takes that away. A peer's kernels can then use
 * regions, and a copy on any device's stream can, so a drain waits for
 * those contexts too, after its own device's (sh_peers_sync): the
 * contexts that opened a managed device, those whose streams issued work
 * on regions (sh_peers_note), those the program created on a managed
 * device (sh_peers_own, contexts.c), whose kernels reach every region, and
 * with several managed devices each one's own context.
 *
 * With one device in the process (several = 0) no mapping is listed and
 * vmm_map sets the managed device's access alone, as before; a drain then
 * costs one relaxed load here until the program creates a context.
 *
 * Shared state, all under peers_mu: the links, the mapping table and the
 * other contexts. peers_mu is a leaf: it is taken under the pool's locks
 * (vmm_map), and cuMemSetAccess, which does not block, is called under it,
 * so that a mapping and a link change are seen in one order. Contexts are
 * copied out before they are waited for. life_lock: its read side is held
 * while a drain waits for the other contexts, its write side while the
 * program destroys one (cuda.h: no call may use a context meanwhile); the
 * one lock of this file held across blocking calls, taken with no other
 * lock but the gate.
 */
#include "interpose/peermap.h"

#include "sh_log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define MAX_LINKS  256
#define MAX_DEVS   64 /* device ordinals the grants follow */
#define SYNC_BATCH 16

struct link {
    CUcontext ctx; /* the context that enabled access */
    int from, to;  /* its device, and the device it may reach */
};

struct maprec {
    uintptr_t va; /* 0: empty; TOMB: removed */
    size_t size;
    int dev; /* the device it is on */
};
#define TOMB ((uintptr_t)1)

static pthread_mutex_t peers_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t managed; /* bit d: device d is managed (d < MAX_DEVS) */
static int several;
static struct link links[MAX_LINKS];
static size_t nlinks;
static struct maprec *maps;
static size_t mcap, mused, mlive; /* slots, slots not empty, live records */
static CUcontext *others;
static size_t nothers, capothers;
static atomic_size_t waited;             /* nothers, for the drain's lock-free test */
static atomic_uint generation;           /* bumped when a context is forgotten */
static _Atomic uint64_t reach[MAX_DEVS]; /* bit t: a link lets device d reach device t */
static pthread_rwlock_t life_lock = PTHREAD_RWLOCK_INITIALIZER;

/* ---- the mapping table: open addressing on va ---- */

/* The product's high half: its low bits keep the zeros of aligned
 * addresses, which would crowd every mapping into a few slots. */
static size_t slot_of(uintptr_t va, size_t cap)
{
    return (size_t)(((uint64_t)va * 0x9e3779b97f4a7c15ull) >> 32) & (cap - 1);
}

/* The slot holding va, or mcap. mu held. */
static size_t map_find(uintptr_t va)
{
    for (size_t i = 0, h = mcap ? slot_of(va, mcap) : 0; i < mcap; i++, h = (h + 1) & (mcap - 1)) {
        if (maps[h].va == va)
            return h;
        if (maps[h].va == 0)
            break;
    }
    return mcap;
}

static void map_put(struct maprec *tab, size_t cap, struct maprec rec)
{
    size_t h = slot_of(rec.va, cap);
    while (tab[h].va != 0 && tab[h].va != TOMB)
        h = (h + 1) & (cap - 1);
    tab[h] = rec;
}

/* Room for one more record, rehashed without tombstones when half full;
 * -1 when the table cannot grow. mu held. */
static int map_reserve(void)
{
    if ((mused + 1) * 2 <= mcap)
        return 0;
    size_t cap = 64;
    while (cap < (mlive + 1) * 4)
        cap *= 2;
    struct maprec *tab = calloc(cap, sizeof *tab);
    if (!tab)
        return -1;
    for (size_t i = 0; i < mcap; i++)
        if (maps[i].va > TOMB)
            map_put(tab, cap, maps[i]);
    free(maps);
    maps = tab;
    mcap = cap;
    mused = mlive;
    return 0;
}

static int map_add(int dev, uintptr_t va, size_t size)
{
    size_t i = map_find(va);
    if (i < mcap) {
        maps[i].size = size;
        maps[i].dev = dev;
        return 0;
    }
    if (map_reserve() != 0)
        return -1;
    size_t h = slot_of(va, mcap);
    while (maps[h].va > TOMB)
        h = (h + 1) & (mcap - 1);
    mused += maps[h].va == 0;
    maps[h] = (struct maprec){va, size, dev};
    mlive++;
    return 0;
}

static void map_del(uintptr_t va)
{
    size_t i = map_find(va);
    if (i < mcap) {
        maps[i].va = TOMB;
        mlive--;
    }
}

/* ---- links and grants ---- */

static int is_managed(int dev)
{
    return dev >= 0 && dev < MAX_DEVS && (managed >> dev & 1);
}

/* How many links let device `from` reach device `to`. mu held. */
static int opened(int from, int to)
{
    int n = 0;
    for (size_t i = 0; i < nlinks; i++)
        n += links[i].from == from && links[i].to == to;
    return n;
}

/* Sets dev's access on every listed mapping on device `to`. mu held. */
static void set_all(const struct sh_driver *drv, int dev, int to, CUmemAccess_flags flags)
{
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, flags};
    size_t failed = 0;
    for (size_t i = 0; i < mcap; i++)
        if (maps[i].va > TOMB && maps[i].dev == to &&
            drv->cuMemSetAccess(maps[i].va, maps[i].size, &d, 1) != 0)
            failed++;
    if (failed)
        sh_log(SH_LOG_WARN,
               "device %d: access to %zu of the library's mappings could not be %s (peer "
               "access)",
               dev, failed, flags == CU_MEM_ACCESS_FLAGS_PROT_NONE ? "revoked" : "granted");
}

/* mu held. */
static void add_other(CUcontext c)
{
    for (size_t i = 0; i < nothers; i++)
        if (others[i] == c)
            return;
    if (nothers == capothers) {
        size_t cap = capothers ? capothers * 2 : 16;
        CUcontext *t = realloc(others, cap * sizeof *t);
        if (!t) {
            sh_log(SH_LOG_ERROR, "out of memory noting a context that uses regions: a move "
                                 "may not wait for its work");
            return;
        }
        others = t;
        capothers = cap;
    }
    others[nothers++] = c;
    atomic_store_explicit(&waited, nothers, memory_order_relaxed);
}

/* The managed devices' contexts: with two or more, each is one of the
 * others the rest wait for (a kernel of one may use another's regions
 * through peer access, a copy on its stream may read them). mu held. */
static CUcontext managed_ctx[MAX_DEVS];

void sh_peers_manage(CUdevice dev, CUcontext ctx, int several_devices)
{
    pthread_mutex_lock(&peers_mu);
    if ((int)dev >= 0 && (int)dev < MAX_DEVS) {
        managed |= 1ull << (int)dev;
        managed_ctx[(int)dev] = ctx;
    }
    for (size_t i = 0; i < nlinks; i++) /* links to it made before */
        if (links[i].to == (int)dev)
            add_other(links[i].ctx);
    several = several_devices;
    if (__builtin_popcountll(managed) > 1)
        for (int d = 0; d < MAX_DEVS; d++)
            if (managed_ctx[d])
                add_other(managed_ctx[d]);
    pthread_mutex_unlock(&peers_mu);
}

void sh_peers_link(const struct sh_driver *drv, CUcontext ctx, int from, int to, int on)
{
    if (!ctx || from < 0 || to < 0 || from == to)
        return;
    pthread_mutex_lock(&peers_mu);
    int before = opened(from, to);
    size_t i = 0;
    while (i < nlinks && !(links[i].ctx == ctx && links[i].to == to))
        i++;
    if (on && i == nlinks && nlinks < MAX_LINKS)
        links[nlinks++] = (struct link){ctx, from, to};
    else if (on && i == nlinks)
        sh_log(SH_LOG_ERROR,
               "more than %d peer-access links: device %d's access to device %d "
               "is not given to the library's mappings",
               MAX_LINKS, from, to);
    else if (!on && i < nlinks)
        links[i] = links[--nlinks];
    /* Kept after a disable: work it issued before may still run. */
    if (on && (!managed || is_managed(to)))
        add_other(ctx);
    int after = opened(from, to);
    if (from < MAX_DEVS && to < 64) {
        if (after)
            atomic_fetch_or(&reach[from], 1ull << to);
        else
            atomic_fetch_and(&reach[from], ~(1ull << to));
    }
    if (several && is_managed(to) && from < MAX_DEVS && (before > 0) != (after > 0))
        set_all(drv, from, to,
                after ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE);
    pthread_mutex_unlock(&peers_mu);
}

/* The access a new mapping gets: dev's, and every peer device's. mu held. */
static size_t access_list(CUdevice dev, CUmemAccessDesc *d)
{
    unsigned char seen[MAX_DEVS] = {0};
    size_t n = 0;
    d[n++] =
        (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (size_t i = 0; i < nlinks; i++) {
        int f = links[i].from;
        if (links[i].to != (int)dev || f >= MAX_DEVS || f == (int)dev || seen[f])
            continue;
        seen[f] = 1;
        d[n++] =
            (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, f}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    }
    return n;
}

CUresult sh_peers_mapped(const struct sh_driver *drv, CUdevice dev, uintptr_t va, size_t size)
{
    CUmemAccessDesc d[MAX_DEVS + 1];
    pthread_mutex_lock(&peers_mu);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (map_add((int)dev, va, size) == 0) {
        r = drv->cuMemSetAccess((CUdeviceptr)va, size, d, access_list(dev, d));
        if (r != CUDA_SUCCESS)
            map_del(va);
    }
    pthread_mutex_unlock(&peers_mu);
    return r;
}

void sh_peers_listed(CUdevice dev, uintptr_t va, size_t size, int listed)
{
    pthread_mutex_lock(&peers_mu);
    if (listed && map_add((int)dev, va, size) != 0)
        sh_log(SH_LOG_ERROR, "out of memory listing a mapping: peer access changes will "
                             "not reach it");
    else if (!listed)
        map_del(va);
    pthread_mutex_unlock(&peers_mu);
}

size_t sh_peers_mappings(void)
{
    pthread_mutex_lock(&peers_mu);
    size_t n = mlive;
    pthread_mutex_unlock(&peers_mu);
    return n;
}

/* ---- the other contexts a drain waits for ---- */

void sh_peers_note(CUcontext ctx)
{
    pthread_mutex_lock(&peers_mu);
    add_other(ctx);
    pthread_mutex_unlock(&peers_mu);
}

/* Before the managed device is known, every created context counts. */
void sh_peers_own(CUcontext ctx, int dev)
{
    pthread_mutex_lock(&peers_mu);
    if (!managed || is_managed(dev))
        add_other(ctx);
    pthread_mutex_unlock(&peers_mu);
}

void sh_peers_destroying(int on)
{
    if (on)
        pthread_rwlock_wrlock(&life_lock);
    else
        pthread_rwlock_unlock(&life_lock);
}

/* Under life_lock's write side: no drain is reading the list. */
void sh_peers_forget(CUcontext ctx)
{
    pthread_mutex_lock(&peers_mu);
    for (size_t i = 0; i < nothers; i++)
        if (others[i] == ctx) {
            others[i] = others[--nothers];
            break;
        }
    atomic_store_explicit(&waited, nothers, memory_order_relaxed);
    atomic_fetch_add(&generation, 1);
    pthread_mutex_unlock(&peers_mu);
}

uint64_t sh_peers_reach(int from)
{
    return from >= 0 && from < MAX_DEVS ? atomic_load(&reach[from]) : 0;
}

unsigned sh_peers_generation(void)
{
    return atomic_load(&generation);
}

int sh_peers_waiting(void)
{
    return atomic_load_explicit(&waited, memory_order_relaxed) != 0;
}

/* Their errors are theirs: a context that faulted runs nothing more, and
 * the managed device's drain must go on. The list only grows while
 * life_lock is read, so it is read in batches, each copied out under the
 * lock. A context noted before the drain's window is seen: the note
 * happens before the work it is for passes the gate. */
void sh_peers_sync(const struct sh_driver *drv)
{
    sh_peers_sync_except(drv, drv->ctx);
}

void sh_peers_sync_except(const struct sh_driver *drv, CUcontext done)
{
    if (!sh_peers_waiting())
        return;
    CUcontext batch[SYNC_BATCH], popped;
    size_t at = 0, n;
    pthread_rwlock_rdlock(&life_lock);
    do {
        pthread_mutex_lock(&peers_mu);
        for (n = 0; n < SYNC_BATCH && at + n < nothers; n++)
            batch[n] = others[at + n];
        pthread_mutex_unlock(&peers_mu);
        for (size_t i = 0; i < n; i++) {
            if (batch[i] == done || drv->cuCtxPushCurrent(batch[i]) != CUDA_SUCCESS)
                continue;
            drv->cuCtxSynchronize();
            drv->cuCtxPopCurrent(&popped);
        }
        at += n;
    } while (n == SYNC_BATCH);
    pthread_rwlock_unlock(&life_lock);
}
