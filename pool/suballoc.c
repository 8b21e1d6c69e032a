/* suballoc.c — small blocks from slabs, with stream-ordered frees.
 *
 * One tensor per cudaMallocAsync would otherwise cost a region, a VA range
 * and a VMM map each. Sizes up to max_block instead come from power-of-two
 * classes (512 B up) carved from slabs that the registry backs with regions
 * that are never evicted.
 *
 * A block freed on stream S behind fence F may still be in use by work queued
 * on S. It sits on S's pending list for its class: the next allocation on S
 * takes it at once (stream order protects it), any other stream only after
 * fence_done(F). Fences of one stream complete in order, so pending lists are
 * polled oldest first and a poll stops at the first fence not yet done.
 *
 * A slab whose blocks are all ready (free, no fence outstanding) is "empty";
 * each class keeps `keep` of them and hands the rest back through slab_put.
 *
 * Locking: sa->mu guards everything in struct sh_suballoc, the slabs and
 * their block records. fence_done and fence_drop are called with it held;
 * slab_get and slab_put without.
 */
#include "pool/pool_parts.h"

#include "sh_err.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#define MIN_SHIFT       9 /* smallest class: 512 B */
#define MAX_CLASSES     40
#define SLAB_MIN_BLOCKS 2
#define DEFAULT_MAX     ((size_t)1 << 20)
#define DEFAULT_SLAB    ((size_t)2 << 20)

enum { B_READY, B_USED, B_PENDING };

struct blk {
    struct blk *prev, *next; /* in the class's ready list or a pending list */
    uint64_t stream, fence;  /* where and behind what it was freed (pending) */
    uint32_t idx;            /* position in its slab */
    uint8_t state;
};

struct slab {
    uintptr_t base;
    size_t bytes;
    struct slab *next; /* on a list of slabs to hand back */
    int cls;
    uint32_t nblocks, nready;
    struct blk b[];
};

struct blist {
    struct blk *head, *tail; /* newest at head */
};

struct sclass {
    size_t bsize;
    unsigned shift;
    size_t slab_bytes;
    struct blist ready;
    unsigned empty; /* slabs whose blocks are all ready */
};

struct sstream {
    uint64_t id;
    size_t npending;
    struct blist pending[]; /* one per class */
};

struct sh_suballoc {
    pthread_mutex_t mu;
    struct sh_suballoc_ops ops;
    unsigned nclass, keep;
    struct sclass cls[MAX_CLASSES];
    struct sh_rindex *slabs; /* slab range -> struct slab */
    struct sstream **streams;
    size_t nstreams, streams_cap, last; /* last: where the last stream was found */
    struct sh_suballoc_stats st;
};

static void push_head(struct blist *l, struct blk *b)
{
    b->prev = NULL;
    b->next = l->head;
    if (l->head)
        l->head->prev = b;
    else
        l->tail = b;
    l->head = b;
}

static void unlink_blk(struct blist *l, struct blk *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        l->head = b->next;
    if (b->next)
        b->next->prev = b->prev;
    else
        l->tail = b->prev;
}

static struct slab *slab_of(struct blk *b)
{
    return (struct slab *)((char *)(b - b->idx) - offsetof(struct slab, b));
}

static uintptr_t blk_addr(const struct sh_suballoc *sa, struct blk *b)
{
    const struct slab *s = slab_of(b);
    return s->base + ((uintptr_t)b->idx << sa->cls[s->cls].shift);
}

static int class_of(const struct sh_suballoc *sa, size_t size)
{
    if (size == 0)
        return -1;
    int c = size <= (1u << MIN_SHIFT)
                ? 0
                : 64 - __builtin_clzll((unsigned long long)(size - 1)) - MIN_SHIFT;
    return c < (int)sa->nclass ? c : -1;
}

int sh_suballoc_create(const struct sh_suballoc_ops *ops, const struct sh_suballoc_config *cfg,
                       struct sh_suballoc **out)
{
    size_t max = cfg && cfg->max_block ? cfg->max_block : DEFAULT_MAX;
    size_t slab = cfg && cfg->slab_bytes ? cfg->slab_bytes : DEFAULT_SLAB;
    if (!ops || !ops->slab_get || !ops->slab_put || !ops->fence_done || !out)
        return SH_EINVAL;
    if (max < (1u << MIN_SHIFT) || (max & (max - 1)) || max > ((size_t)1 << 40))
        return SH_EINVAL;
    struct sh_suballoc *sa = calloc(1, sizeof *sa);
    if (!sa)
        return SH_ENOMEM;
    if (sh_rindex_create(&sa->slabs)) {
        free(sa);
        return SH_ENOMEM;
    }
    pthread_mutex_init(&sa->mu, NULL);
    sa->ops = *ops;
    sa->keep = cfg ? cfg->keep_empty : 1;
    sa->nclass = (unsigned)__builtin_ctzll((unsigned long long)max) - MIN_SHIFT + 1;
    for (unsigned i = 0; i < sa->nclass; i++) {
        struct sclass *c = &sa->cls[i];
        c->shift = MIN_SHIFT + i;
        c->bsize = (size_t)1 << c->shift;
        c->slab_bytes = slab > SLAB_MIN_BLOCKS * c->bsize ? slab : SLAB_MIN_BLOCKS * c->bsize;
    }
    *out = sa;
    return 0;
}

/* ---- streams ------------------------------------------------------------- */

static struct sstream *find_stream(struct sh_suballoc *sa, uint64_t id)
{
    if (sa->last < sa->nstreams && sa->streams[sa->last]->id == id)
        return sa->streams[sa->last];
    for (size_t i = 0; i < sa->nstreams; i++)
        if (sa->streams[i]->id == id) {
            sa->last = i;
            return sa->streams[i];
        }
    return NULL;
}

/* Finds or adds the stream; an entry with nothing pending is recycled, so
 * the table stays as small as the set of streams with frees in flight. */
static struct sstream *get_stream(struct sh_suballoc *sa, uint64_t id)
{
    struct sstream *st = find_stream(sa, id);
    if (st)
        return st;
    for (size_t i = 0; i < sa->nstreams; i++)
        if (sa->streams[i]->npending == 0) {
            sa->streams[i]->id = id;
            sa->last = i;
            return sa->streams[i];
        }
    if (sa->nstreams == sa->streams_cap) {
        size_t cap = sa->streams_cap ? sa->streams_cap * 2 : 8;
        struct sstream **p = realloc(sa->streams, cap * sizeof *p);
        if (!p)
            return NULL;
        sa->streams = p;
        sa->streams_cap = cap;
    }
    st = calloc(1, sizeof *st + sa->nclass * sizeof st->pending[0]);
    if (!st)
        return NULL;
    st->id = id;
    sa->last = sa->nstreams;
    sa->streams[sa->nstreams++] = st;
    return st;
}

/* ---- block state changes --------------------------------------------------- */

static void drop_fence(struct sh_suballoc *sa, struct blk *b)
{
    if (sa->ops.fence_drop)
        sa->ops.fence_drop(sa->ops.ctx, b->fence);
    b->fence = 0;
}

/* Takes a slab out of service: its blocks (all ready) leave the ready list. */
static void detach_slab(struct sh_suballoc *sa, struct slab *s)
{
    struct sclass *c = &sa->cls[s->cls];
    for (uint32_t i = 0; i < s->nblocks; i++)
        unlink_blk(&c->ready, &s->b[i]);
    sh_rindex_remove(sa->slabs, s->base, NULL);
    c->empty--;
    sa->st.slabs--;
    sa->st.slab_puts++;
    sa->st.slab_bytes -= s->bytes;
}

/* The block is free for any stream. If that empties its slab beyond the
 * class's keep and rel is given, the slab goes onto *rel for slab_put. */
static void make_ready(struct sh_suballoc *sa, struct blk *b, struct slab **rel)
{
    struct slab *s = slab_of(b);
    struct sclass *c = &sa->cls[s->cls];
    b->state = B_READY;
    push_head(&c->ready, b);
    if (++s->nready < s->nblocks || ++c->empty <= sa->keep || !rel)
        return;
    detach_slab(sa, s);
    s->next = *rel;
    *rel = s;
}

static struct blk *take_ready(struct sclass *c)
{
    struct blk *b = c->ready.head;
    unlink_blk(&c->ready, b);
    struct slab *s = slab_of(b);
    if (s->nready-- == s->nblocks)
        c->empty--;
    return b;
}

/* Moves pending blocks of class ci whose fence is done to the ready list. */
static size_t poll(struct sh_suballoc *sa, int ci, struct slab **rel)
{
    size_t moved = 0, bsize = sa->cls[ci].bsize;
    for (size_t i = 0; i < sa->nstreams; i++) {
        struct sstream *st = sa->streams[i];
        struct blist *l = &st->pending[ci];
        struct blk *b;
        while ((b = l->tail) && sa->ops.fence_done(sa->ops.ctx, b->fence)) {
            unlink_blk(l, b);
            st->npending--;
            sa->st.pending_bytes -= bsize;
            drop_fence(sa, b);
            make_ready(sa, b, rel);
            moved++;
        }
    }
    return moved;
}

/* Same-stream pending block first (newest: warmest), then a ready one, then
 * whatever the fences have released since. NULL: a new slab is needed. */
static struct blk *grab(struct sh_suballoc *sa, int ci, uint64_t stream)
{
    struct sclass *c = &sa->cls[ci];
    struct sstream *st = find_stream(sa, stream);
    struct blk *b = st ? st->pending[ci].head : NULL;
    if (b) {
        unlink_blk(&st->pending[ci], b);
        st->npending--;
        sa->st.pending_bytes -= c->bsize;
        sa->st.same_stream_reuse++;
        drop_fence(sa, b);
    } else if (c->ready.head || poll(sa, ci, NULL)) {
        b = take_ready(c);
    } else {
        return NULL;
    }
    b->state = B_USED;
    sa->st.used_bytes += c->bsize;
    sa->st.allocs++;
    return b;
}

/* ---- slabs ------------------------------------------------------------------ */

static void put_slabs(struct sh_suballoc *sa, struct slab *s)
{
    while (s) {
        struct slab *next = s->next;
        sa->ops.slab_put(sa->ops.ctx, s->base, s->bytes);
        free(s);
        s = next;
    }
}

/* Called without the lock. */
static int new_slab(struct sh_suballoc *sa, int ci, struct slab **out)
{
    const struct sclass *c = &sa->cls[ci];
    uint32_t n = (uint32_t)(c->slab_bytes >> c->shift);
    struct slab *s = calloc(1, sizeof *s + n * sizeof s->b[0]);
    if (!s)
        return SH_ENOMEM;
    int err = sa->ops.slab_get(sa->ops.ctx, c->slab_bytes, &s->base);
    if (err) {
        free(s);
        return err;
    }
    s->bytes = c->slab_bytes;
    s->cls = ci;
    s->nblocks = n;
    *out = s;
    return 0;
}

/* All blocks go on the ready list, lowest address first. */
static int add_slab(struct sh_suballoc *sa, struct slab *s)
{
    int err = sh_rindex_insert(sa->slabs, s->base, s->bytes, s);
    if (err)
        return err;
    struct sclass *c = &sa->cls[s->cls];
    for (uint32_t i = s->nblocks; i-- > 0;) {
        s->b[i].idx = i;
        s->b[i].state = B_READY;
        push_head(&c->ready, &s->b[i]);
    }
    s->nready = s->nblocks;
    c->empty++;
    sa->st.slabs++;
    sa->st.slab_bytes += s->bytes;
    sa->st.slab_gets++;
    return 0;
}

/* ---- API -------------------------------------------------------------------- */

int sh_suballoc_alloc(struct sh_suballoc *sa, size_t size, uint64_t stream, uintptr_t *ptr)
{
    int ci = class_of(sa, size);
    if (ci < 0 || !ptr)
        return SH_EINVAL;
    struct slab *fresh = NULL;
    int err = 0;
    pthread_mutex_lock(&sa->mu);
    for (;;) {
        if (fresh && (err = add_slab(sa, fresh)) != 0)
            break;
        fresh = NULL;
        struct blk *b = grab(sa, ci, stream);
        if (b) {
            *ptr = blk_addr(sa, b);
            break;
        }
        pthread_mutex_unlock(&sa->mu);
        err = new_slab(sa, ci, &fresh);
        pthread_mutex_lock(&sa->mu);
        if (err)
            break;
    }
    pthread_mutex_unlock(&sa->mu);
    if (fresh) /* could not be indexed */
        put_slabs(sa, fresh);
    return err;
}

/* The block in use starting at ptr, or NULL with *err set. */
static struct blk *used_block(struct sh_suballoc *sa, uintptr_t ptr, int *err)
{
    struct slab *s = sh_rindex_lookup(sa->slabs, ptr);
    if (!s) {
        *err = SH_ENOTFOUND;
        return NULL;
    }
    const struct sclass *c = &sa->cls[s->cls];
    uintptr_t off = ptr - s->base, idx = off >> c->shift;
    if ((off & (c->bsize - 1)) || idx >= s->nblocks || s->b[idx].state != B_USED) {
        *err = SH_EINVAL;
        return NULL;
    }
    return &s->b[idx];
}

size_t sh_suballoc_class_bytes(const struct sh_suballoc *sa, size_t size)
{
    int ci = class_of(sa, size);
    return ci < 0 ? 0 : sa->cls[ci].bsize;
}

int sh_suballoc_free(struct sh_suballoc *sa, uintptr_t ptr, uint64_t stream, uint64_t fence)
{
    return sh_suballoc_free_sized(sa, ptr, stream, fence, NULL);
}

int sh_suballoc_free_sized(struct sh_suballoc *sa, uintptr_t ptr, uint64_t stream, uint64_t fence,
                           size_t *bytes)
{
    struct slab *rel = NULL;
    int err = 0;
    pthread_mutex_lock(&sa->mu);
    struct blk *b = used_block(sa, ptr, &err);
    struct sstream *st = NULL;
    if (b && fence && !(st = get_stream(sa, stream)))
        err = SH_ENOMEM;
    if (!err) {
        int ci = slab_of(b)->cls;
        size_t bsize = sa->cls[ci].bsize;
        sa->st.used_bytes -= bsize;
        sa->st.frees++;
        if (bytes)
            *bytes = bsize;
        if (!fence) {
            make_ready(sa, b, &rel);
        } else {
            b->state = B_PENDING;
            b->stream = stream;
            b->fence = fence;
            push_head(&st->pending[ci], b);
            st->npending++;
            sa->st.pending_bytes += bsize;
        }
    }
    pthread_mutex_unlock(&sa->mu);
    put_slabs(sa, rel);
    return err;
}

int sh_suballoc_owns(struct sh_suballoc *sa, uintptr_t ptr)
{
    pthread_mutex_lock(&sa->mu);
    int owns = sh_rindex_lookup(sa->slabs, ptr) != NULL;
    pthread_mutex_unlock(&sa->mu);
    return owns;
}

int sh_suballoc_block_size(struct sh_suballoc *sa, uintptr_t ptr, size_t *size)
{
    int err = 0;
    pthread_mutex_lock(&sa->mu);
    struct blk *b = used_block(sa, ptr, &err);
    if (b)
        *size = sa->cls[slab_of(b)->cls].bsize;
    pthread_mutex_unlock(&sa->mu);
    return err;
}

int sh_suballoc_block_of(struct sh_suballoc *sa, uintptr_t ptr, uintptr_t *base, size_t *size)
{
    int err = SH_ENOTFOUND;
    pthread_mutex_lock(&sa->mu);
    const struct slab *s = sh_rindex_lookup(sa->slabs, ptr);
    if (s) {
        const struct sclass *c = &sa->cls[s->cls];
        uintptr_t idx = (ptr - s->base) >> c->shift;
        if (idx < s->nblocks && s->b[idx].state == B_USED) {
            *base = s->base + (idx << c->shift);
            *size = c->bsize;
            err = 0;
        }
    }
    pthread_mutex_unlock(&sa->mu);
    return err;
}

struct gather {
    struct slab *list;
    int all; /* every slab, not just the empty ones */
};

static int gather_slab(void *arg, uintptr_t start, size_t len, void *payload)
{
    struct gather *g = arg;
    struct slab *s = payload;
    (void)start;
    (void)len;
    if (g->all || s->nready == s->nblocks) {
        s->next = g->list;
        g->list = s;
    }
    return 0;
}

size_t sh_suballoc_trim(struct sh_suballoc *sa)
{
    struct gather g = {NULL, 0};
    size_t bytes = 0;
    pthread_mutex_lock(&sa->mu);
    for (unsigned ci = 0; ci < sa->nclass; ci++)
        poll(sa, (int)ci, NULL);
    sh_rindex_foreach(sa->slabs, gather_slab, &g);
    for (struct slab *s = g.list; s; s = s->next) {
        detach_slab(sa, s);
        bytes += s->bytes;
    }
    pthread_mutex_unlock(&sa->mu);
    put_slabs(sa, g.list);
    return bytes;
}

void sh_suballoc_stats(struct sh_suballoc *sa, struct sh_suballoc_stats *st)
{
    pthread_mutex_lock(&sa->mu);
    *st = sa->st;
    pthread_mutex_unlock(&sa->mu);
}

void sh_suballoc_destroy(struct sh_suballoc *sa)
{
    if (!sa)
        return;
    for (size_t i = 0; i < sa->nstreams; i++) {
        for (unsigned ci = 0; ci < sa->nclass; ci++)
            for (struct blk *b = sa->streams[i]->pending[ci].head; b; b = b->next)
                drop_fence(sa, b);
        free(sa->streams[i]);
    }
    free(sa->streams);
    struct gather g = {NULL, 1};
    sh_rindex_foreach(sa->slabs, gather_slab, &g);
    put_slabs(sa, g.list);
    sh_rindex_destroy(sa->slabs);
    pthread_mutex_destroy(&sa->mu);
    free(sa);
}
