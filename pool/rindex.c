/* rindex.c — address -> payload lookup over non-overlapping intervals.
 *
 * An AVL tree keyed by interval start. Lookup runs on every kernel launch and
 * is bound by one cache miss per level, so nodes are 32 bytes, two to a cache
 * line (the array is line-aligned), and refer to each other by 32-bit index
 * (index 0 is the empty tree); the AVL heights, needed only by updates, live
 * in a separate array. Freed nodes go on a free list, so steady state never
 * allocates.
 *
 * Locking: none here. The registry holds a rwlock around every call (read
 * side for the const functions, write side for the others); lookups never
 * write, so concurrent readers are safe.
 */
#include "pool/pool_parts.h"

#include "sh_err.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define LINE 64

struct node {
    uintptr_t start;
    size_t len;
    uint32_t kid[2]; /* 0: lower addresses, 1: higher */
    void *payload;
};

struct sh_rindex {
    struct node *n; /* n[0] is the empty tree: no kids */
    int8_t *h;      /* AVL height by node; h[0] = 0 */
    uint32_t cap;   /* entries in n and h, node 0 included */
    uint32_t root;
    uint32_t free_head; /* recycled nodes, linked through kid[0] */
    uint32_t nfree;
    size_t count;
    uintptr_t lo, hi; /* [lo, hi) spans every interval: cheap rejection */
    uint64_t gen;     /* from gens: unique across indices */
};

static atomic_uint_fast64_t gens;

static void next_gen(struct sh_rindex *ri)
{
    ri->gen = atomic_fetch_add_explicit(&gens, 1, memory_order_relaxed) + 1;
}

int sh_rindex_create(struct sh_rindex **out)
{
    struct sh_rindex *ri = calloc(1, sizeof *ri);
    if (!ri)
        return SH_ENOMEM;
    if (sh_rindex_reserve(ri, 0)) {
        free(ri);
        return SH_ENOMEM;
    }
    next_gen(ri);
    *out = ri;
    return 0;
}

void sh_rindex_destroy(struct sh_rindex *ri)
{
    if (!ri)
        return;
    free(ri->n);
    free(ri->h);
    free(ri);
}

/* Moves the node array to a line-aligned one of cap entries. */
static int grow(struct sh_rindex *ri, size_t cap)
{
    void *n;
    if (posix_memalign(&n, LINE, cap * sizeof *ri->n))
        return SH_ENOMEM;
    int8_t *h = realloc(ri->h, cap);
    if (!h) {
        free(n);
        return SH_ENOMEM;
    }
    if (ri->cap) {
        memcpy(n, ri->n, ri->cap * sizeof *ri->n);
    } else { /* node 0: the empty tree */
        memset(n, 0, sizeof *ri->n);
        h[0] = 0;
    }
    free(ri->n);
    ri->n = n;
    ri->h = h;
    return 0;
}

int sh_rindex_reserve(struct sh_rindex *ri, size_t want)
{
    if (ri->cap && ri->nfree >= want)
        return 0;
    size_t need = (size_t)ri->cap + (want - ri->nfree);
    size_t cap = (size_t)ri->cap * 2 > 64 ? (size_t)ri->cap * 2 : 64;
    while (cap < need)
        cap *= 2;
    if (cap > UINT32_MAX || grow(ri, cap))
        return SH_ENOMEM;
    for (size_t i = cap - 1; i >= ri->cap && i > 0; i--) {
        ri->n[i].kid[0] = ri->free_head;
        ri->free_head = (uint32_t)i;
    }
    ri->nfree += (uint32_t)(cap - (ri->cap ? ri->cap : 1));
    ri->cap = (uint32_t)cap;
    return 0;
}

static int height(const struct sh_rindex *ri, uint32_t t)
{
    return ri->h[t];
}

static void fix_height(struct sh_rindex *ri, uint32_t t)
{
    int l = height(ri, ri->n[t].kid[0]), r = height(ri, ri->n[t].kid[1]);
    ri->h[t] = (int8_t)((l > r ? l : r) + 1);
}

/* Rotates t's kid on side d up into t's place; returns the new subtree root. */
static uint32_t rotate(struct sh_rindex *ri, uint32_t t, int d)
{
    uint32_t k = ri->n[t].kid[d];
    ri->n[t].kid[d] = ri->n[k].kid[!d];
    ri->n[k].kid[!d] = t;
    fix_height(ri, t);
    fix_height(ri, k);
    return k;
}

static uint32_t balance(struct sh_rindex *ri, uint32_t t)
{
    fix_height(ri, t);
    int bf = height(ri, ri->n[t].kid[0]) - height(ri, ri->n[t].kid[1]);
    if (bf >= -1 && bf <= 1)
        return t;
    int d = bf > 1 ? 0 : 1; /* the heavy side */
    uint32_t k = ri->n[t].kid[d];
    if (height(ri, ri->n[k].kid[!d]) > height(ri, ri->n[k].kid[d]))
        ri->n[t].kid[d] = rotate(ri, k, !d);
    return rotate(ri, t, d);
}

/* Overlap shows up on the search path: any interval that overlaps x would
 * have stopped the descent where the path left its subtree. */
static uint32_t insert_at(struct sh_rindex *ri, uint32_t t, uint32_t x, int *err)
{
    if (!t)
        return x;
    const struct node *nx = &ri->n[x], *nt = &ri->n[t];
    int d;
    if (nx->start + nx->len <= nt->start)
        d = 0;
    else if (nx->start >= nt->start + nt->len)
        d = 1;
    else {
        *err = SH_EINVAL;
        return t;
    }
    uint32_t k = insert_at(ri, nt->kid[d], x, err);
    ri->n[t].kid[d] = k;
    return *err ? t : balance(ri, t);
}

static void bounds_update(struct sh_rindex *ri)
{
    if (!ri->root) {
        ri->lo = ri->hi = 0;
        return;
    }
    uint32_t t = ri->root;
    while (ri->n[t].kid[0])
        t = ri->n[t].kid[0];
    ri->lo = ri->n[t].start;
    t = ri->root;
    while (ri->n[t].kid[1])
        t = ri->n[t].kid[1];
    ri->hi = ri->n[t].start + ri->n[t].len;
}

int sh_rindex_insert(struct sh_rindex *ri, uintptr_t start, size_t len, void *payload)
{
    if (len == 0 || start + len < start)
        return SH_EINVAL;
    int err = sh_rindex_reserve(ri, 1);
    if (err)
        return err;
    uint32_t x = ri->free_head, next = ri->n[x].kid[0];
    ri->n[x] = (struct node){.start = start, .len = len, .payload = payload};
    ri->h[x] = 1;
    uint32_t root = insert_at(ri, ri->root, x, &err);
    if (err) {
        ri->n[x].kid[0] = next; /* x stays at the head of the free list */
        return err;
    }
    ri->free_head = next;
    ri->root = root;
    ri->nfree--;
    ri->count++;
    next_gen(ri);
    if (ri->count == 1 || start < ri->lo)
        ri->lo = start;
    if (ri->count == 1 || start + len > ri->hi)
        ri->hi = start + len;
    return 0;
}

/* Detaches the leftmost node of subtree t into *min; returns the new root. */
static uint32_t remove_min(struct sh_rindex *ri, uint32_t t, uint32_t *min)
{
    if (!ri->n[t].kid[0]) {
        *min = t;
        return ri->n[t].kid[1];
    }
    ri->n[t].kid[0] = remove_min(ri, ri->n[t].kid[0], min);
    return balance(ri, t);
}

static uint32_t remove_at(struct sh_rindex *ri, uint32_t t, uintptr_t start, uint32_t *found)
{
    if (!t)
        return 0;
    struct node *nt = &ri->n[t];
    if (start != nt->start) {
        int d = start > nt->start;
        uint32_t k = remove_at(ri, nt->kid[d], start, found);
        ri->n[t].kid[d] = k;
        return *found ? balance(ri, t) : t;
    }
    *found = t;
    uint32_t l = nt->kid[0], r = nt->kid[1], m;
    if (!l || !r)
        return l ? l : r;
    r = remove_min(ri, r, &m);
    ri->n[m].kid[0] = l;
    ri->n[m].kid[1] = r;
    return balance(ri, m);
}

int sh_rindex_remove(struct sh_rindex *ri, uintptr_t start, void **payload)
{
    uint32_t found = 0;
    uint32_t root = remove_at(ri, ri->root, start, &found);
    if (!found)
        return SH_ENOTFOUND;
    ri->root = root;
    struct node *n = &ri->n[found];
    uintptr_t end = n->start + n->len;
    if (payload)
        *payload = n->payload;
    n->kid[0] = ri->free_head;
    ri->free_head = found;
    ri->nfree++;
    ri->count--;
    next_gen(ri);
    if (start == ri->lo || end == ri->hi)
        bounds_update(ri);
    return 0;
}

/* hi if addr >= s, else lo, without a branch: the direction is a coin toss
 * the predictor cannot learn, and a miss costs more than the whole level.
 * GCC compiles the portable form to a longer dependent chain than one cmov;
 * on x86-64 the cmov made random lookups ~15% faster. */
static inline uint32_t pick(uintptr_t addr, uintptr_t s, uint32_t lo, uint32_t hi)
{
#if defined(__x86_64__)
    __asm__("cmpq %[s], %[a]\n\tcmovael %[hi], %[lo]"
            : [lo] "+r"(lo)
            : [s] "r"(s), [a] "r"(addr), [hi] "r"(hi)
            : "cc");
    return lo;
#else
    return hi ^ ((hi ^ lo) & -(uint32_t)(addr < s));
#endif
}

/* Both kids are read with the key (same line), so a level costs one memory
 * latency; the only branch per level is the hit test, almost always "no". */
static inline __attribute__((always_inline)) uint32_t find_node(const struct sh_rindex *ri,
                                                                uintptr_t addr)
{
    if (addr - ri->lo >= ri->hi - ri->lo)
        return 0;
    const struct node *n = ri->n;
    uint32_t t = ri->root;
    while (t) {
        const struct node *x = &n[t];
        if (addr - x->start < x->len)
            return t;
        t = pick(addr, x->start, x->kid[0], x->kid[1]);
    }
    return 0;
}

void *sh_rindex_lookup(const struct sh_rindex *ri, uintptr_t addr)
{
    uint32_t t = find_node(ri, addr);
    return t ? ri->n[t].payload : NULL;
}

int sh_rindex_find(const struct sh_rindex *ri, uintptr_t addr, uintptr_t *start, size_t *len,
                   void **payload)
{
    uint32_t t = find_node(ri, addr);
    if (!t)
        return SH_ENOTFOUND;
    if (start)
        *start = ri->n[t].start;
    if (len)
        *len = ri->n[t].len;
    if (payload)
        *payload = ri->n[t].payload;
    return 0;
}

size_t sh_rindex_count(const struct sh_rindex *ri)
{
    return ri->count;
}

uint64_t sh_rindex_gen(const struct sh_rindex *ri)
{
    return ri->gen;
}

static int walk(const struct sh_rindex *ri, uint32_t t, sh_rindex_visit_fn fn, void *arg)
{
    if (!t)
        return 0;
    const struct node *x = &ri->n[t];
    int rc = walk(ri, x->kid[0], fn, arg);
    if (!rc)
        rc = fn(arg, x->start, x->len, x->payload);
    return rc ? rc : walk(ri, x->kid[1], fn, arg);
}

int sh_rindex_foreach(const struct sh_rindex *ri, sh_rindex_visit_fn fn, void *arg)
{
    return walk(ri, ri->root, fn, arg);
}

struct vstate {
    size_t nodes;
    int seen;
    uintptr_t prev_end;
};

/* Returns the subtree height, or -1 if an invariant is broken. */
static int check(const struct sh_rindex *ri, uint32_t t, struct vstate *v)
{
    if (!t)
        return 0;
    if (t >= ri->cap || ++v->nodes > ri->count)
        return -1;
    const struct node *x = &ri->n[t];
    int l = check(ri, x->kid[0], v);
    if (l < 0 || x->len == 0 || (v->seen && x->start < v->prev_end))
        return -1;
    v->seen = 1;
    v->prev_end = x->start + x->len;
    int r = check(ri, x->kid[1], v);
    int h = (l > r ? l : r) + 1;
    if (r < 0 || l - r > 1 || r - l > 1 || h != ri->h[t])
        return -1;
    return h;
}

int sh_rindex_validate(const struct sh_rindex *ri)
{
    struct vstate v = {0};
    if (check(ri, ri->root, &v) < 0 || v.nodes != ri->count)
        return SH_EINVAL;
    if (ri->count + ri->nfree + 1 != ri->cap)
        return SH_EINVAL;
    uint32_t f = ri->free_head;
    for (uint32_t i = 0; i < ri->nfree; i++, f = ri->n[f].kid[0])
        if (f == 0 || f >= ri->cap)
            return SH_EINVAL;
    return 0;
}
