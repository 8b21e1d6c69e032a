/* fake_vmm.h — a fake driver for pool tests whose handles are real memory:
 * a handle is a memfd, a mapping is mmap(MAP_SHARED|MAP_FIXED), unmap puts
 * PROT_NONE back and copies are memcpy, so bytes really move. Shared by
 * test_evict.c and test_prefetch.c; include it once, after the system
 * headers it needs. */
#ifndef SH_TESTS_FAKE_VMM_H
#define SH_TESTS_FAKE_VMM_H

#define K    ((size_t)1 << 10)
#define M    ((size_t)1 << 20)
#define G    (64 * K) /* granularity */
#define CH   (4 * G)  /* largest chunk */
#define MAXH 4096
#define MAXM 1024
#define MAXR 1024
#define MAXC 4096
#define ANY  UINT64_MAX /* the stream of a cudaFree */

/* ---- fake VMM over real memory ----------------------------------------------------- */

struct handle {
    int fd, loc, maps;
    size_t size;
};

struct mapping {
    uintptr_t va;
    size_t size;
    uint64_t h;
};

struct resv {
    uintptr_t va;
    size_t size;
};

struct fake {
    pthread_mutex_t mu;
    struct handle h[MAXH];
    uint64_t nh;
    int live[2];
    size_t bytes[2];        /* live handle bytes by location */
    size_t device_limit;    /* 0: none */
    struct mapping m[MAXM]; /* live mappings */
    int nm;
    struct resv r[MAXR];
    int nr;
    long map_calls, unmap_calls;
    long fail_map_at;   /* this map call fails; 0: none */
    long fail_map_n;    /* and so many after it in a row (0 or 1: just that one) */
    long fail_unmap_at; /* likewise for unmap */
    long fail_unmap_n;
    int bad;
    /* copies */
    int copies[2];
    size_t copy_bytes[2];
    uintptr_t d2h_src[MAXC];
    size_t d2h_n[MAXC];
    int nd2h;
    int drains;
    uint64_t next_token;
    /* the gate check */
    int checking;
    int remaps_during_launch;
};

static struct fake fk;
static atomic_int launching;

static int find_mapping(uintptr_t va)
{
    for (int i = 0; i < fk.nm; i++)
        if (va - fk.m[i].va < fk.m[i].size)
            return i;
    return -1;
}

static int f_reserve(void *ctx, size_t size, size_t align, uintptr_t *va)
{
    (void)ctx;
    if (align < G)
        align = G;
    char *p =
        mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return SH_ENOMEM;
    uintptr_t base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    size_t tail = (uintptr_t)p + size + align - (base + size);
    if (tail)
        munmap((void *)(base + size), tail);
    pthread_mutex_lock(&fk.mu);
    if (fk.nr == MAXR) {
        pthread_mutex_unlock(&fk.mu);
        munmap((void *)base, size);
        return SH_ENOMEM;
    }
    fk.r[fk.nr++] = (struct resv){base, size};
    pthread_mutex_unlock(&fk.mu);
    *va = base;
    return 0;
}

static int f_unreserve(void *ctx, uintptr_t va, size_t size)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    int i = 0;
    while (i < fk.nr && !(fk.r[i].va == va && fk.r[i].size == size))
        i++;
    int ok = i < fk.nr;
    for (int k = 0; ok && k < fk.nm; k++)
        if (fk.m[k].va - va < size)
            ok = 0; /* something still mapped in it */
    if (!ok) {
        fk.bad++;
        pthread_mutex_unlock(&fk.mu);
        return SH_EINVAL;
    }
    fk.r[i] = fk.r[--fk.nr];
    pthread_mutex_unlock(&fk.mu);
    munmap((void *)va, size);
    return 0;
}

static int f_create(void *ctx, size_t size, int loc, uint64_t *handle)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    if (size == 0 || size % G || fk.nh + 1 >= MAXH) {
        fk.bad++;
        pthread_mutex_unlock(&fk.mu);
        return SH_EINVAL;
    }
    if (loc == SH_LOC_DEVICE && fk.device_limit && fk.bytes[loc] + size > fk.device_limit) {
        pthread_mutex_unlock(&fk.mu);
        return SH_ENOMEM;
    }
    int fd = memfd_create("fake-handle", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        pthread_mutex_unlock(&fk.mu);
        return SH_ENOMEM;
    }
    uint64_t h = ++fk.nh;
    fk.h[h] = (struct handle){.fd = fd, .loc = loc, .size = size};
    fk.live[loc]++;
    fk.bytes[loc] += size;
    pthread_mutex_unlock(&fk.mu);
    *handle = h;
    return 0;
}

static int f_release(void *ctx, uint64_t h)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    if (h == 0 || h > fk.nh || fk.h[h].fd < 0 || fk.h[h].size == 0 || fk.h[h].maps) {
        fk.bad++;
        pthread_mutex_unlock(&fk.mu);
        return SH_EINVAL;
    }
    close(fk.h[h].fd);
    fk.h[h].fd = -1;
    fk.live[fk.h[h].loc]--;
    fk.bytes[fk.h[h].loc] -= fk.h[h].size;
    fk.h[h].size = 0;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static int f_map(void *ctx, uintptr_t va, size_t size, uint64_t h)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    fk.map_calls++;
    if (fk.checking && atomic_load(&launching))
        fk.remaps_during_launch++;
    if (fk.fail_map_at && fk.map_calls >= fk.fail_map_at &&
        fk.map_calls < fk.fail_map_at + (fk.fail_map_n > 1 ? fk.fail_map_n : 1)) {
        pthread_mutex_unlock(&fk.mu);
        return SH_EDRIVER;
    }
    int ok = h > 0 && h <= fk.nh && fk.h[h].size == size && fk.h[h].fd >= 0 && fk.nm < MAXM;
    int inside = 0;
    for (int i = 0; i < fk.nr; i++)
        inside |= va >= fk.r[i].va && va + size <= fk.r[i].va + fk.r[i].size;
    for (int i = 0; ok && i < fk.nm; i++)
        if (va < fk.m[i].va + fk.m[i].size && fk.m[i].va < va + size)
            ok = 0;
    if (!ok || !inside ||
        mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fk.h[h].fd, 0) ==
            MAP_FAILED) {
        fk.bad++;
        pthread_mutex_unlock(&fk.mu);
        return SH_EINVAL;
    }
    fk.m[fk.nm++] = (struct mapping){va, size, h};
    fk.h[h].maps++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static int f_unmap(void *ctx, uintptr_t va, size_t size)
{
    (void)ctx;
    pthread_mutex_lock(&fk.mu);
    fk.unmap_calls++;
    if (fk.checking && atomic_load(&launching))
        fk.remaps_during_launch++;
    if (fk.fail_unmap_at && fk.unmap_calls >= fk.fail_unmap_at &&
        fk.unmap_calls < fk.fail_unmap_at + (fk.fail_unmap_n > 1 ? fk.fail_unmap_n : 1)) {
        pthread_mutex_unlock(&fk.mu);
        return SH_EDRIVER; /* nothing changed: still mapped */
    }
    int i = find_mapping(va);
    if (i < 0 || fk.m[i].va != va || fk.m[i].size != size) {
        fk.bad++;
        pthread_mutex_unlock(&fk.mu);
        return SH_EINVAL;
    }
    /* Back to reserved-but-unmapped: any access faults. */
    mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
         0);
    fk.h[fk.m[i].h].maps--;
    fk.m[i] = fk.m[--fk.nm];
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

static const struct sh_vmm_ops vmm = {&fk,       f_reserve, f_unreserve, f_create,
                                      f_release, f_map,     f_unmap,     NULL};

#endif
