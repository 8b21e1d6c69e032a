/* share.c — slots, reservations and the reclaiming of dead processes'
 * shares in the node-budget segment (layout and locking: node_int.h).
 *
 * A process's share is reclaimed only by a process of the same PID
 * namespace (or where either namespace is unknown): a pid means nothing in
 * another one, and taking a live process's share would let the group pin
 * more than the budget. Such a slot is freed when its process leaves, or by
 * a process of its own namespace once it is gone.
 */
#include "node/node_int.h"

#include "sh_err.h"
#include "sh_log.h"
#include "telemetry/telemetry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t load64(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static int32_t load_pid(const struct sh_node_slot *s)
{
    return __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
}

/* Takes the segment's lock: 0, or SH_EBUSY (said once) when another
 * process holds it too long or it cannot be recovered. */
static int lock(struct sh_node *n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += n->lock_ms / 1000;
    ts.tv_nsec += (long)(n->lock_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int rc = pthread_mutex_timedlock(&n->hdr->lock.mu, &ts);
    if (rc == EOWNERDEAD) /* its holder died; every change is one store (node_int.h) */
        rc = pthread_mutex_consistent(&n->hdr->lock.mu);
    if (rc == 0)
        return SH_OK;
    sh_log_once(&n->lock_said, SH_LOG_WARN,
                "%s: %s; this process pins no more host memory until it can take the lock", n->path,
                rc == ETIMEDOUT ? "its lock has been held for too long by another process"
                                : "its lock is unusable");
    return SH_EBUSY;
}

static void unlock(struct sh_node *n)
{
    pthread_mutex_unlock(&n->hdr->lock.mu);
}

/* 1 if slot i belongs to a process that is gone; lock held. */
static int slot_dead(const struct sh_node *n, int i)
{
    const struct sh_node_slot *s = &n->slots[i];
    int32_t pid = load_pid(s);
    if (pid <= 0 || i == n->slot)
        return 0;
    uint64_t ns = load64(&s->pidns);
    if (ns && n->pidns && ns != n->pidns)
        return 0; /* its pid means nothing here */
    return sh_tm_proc_gone(pid, load64(&s->start_ticks));
}

/* Frees the slots of dead processes; lock held. */
static int reclaim_locked(struct sh_node *n)
{
    int freed = 0;
    for (uint32_t i = 0; i < n->nslots; i++)
        if (slot_dead(n, (int)i)) {
            __atomic_store_n(&n->slots[i].pid, 0, __ATOMIC_RELEASE);
            freed++;
        }
    return freed;
}

/* The bytes held and the slots taken; no lock needed. */
static uint64_t used(const struct sh_node *n, uint32_t *ranks)
{
    uint64_t sum = 0;
    uint32_t r = 0;
    for (uint32_t i = 0; i < n->nslots; i++)
        if (load_pid(&n->slots[i]) > 0) {
            sum += load64(&n->slots[i].bytes);
            r++;
        }
    if (ranks)
        *ranks = r;
    return sum;
}

/* Takes a free slot; lock held. The group's first process sets the budget. */
static int take_slot(struct sh_node *n, uint64_t budget)
{
    uint32_t ranks = 0;
    reclaim_locked(n);
    used(n, &ranks);
    if (ranks == 0 || __atomic_load_n(&n->hdr->budget, __ATOMIC_RELAXED) == 0) {
        __atomic_store_n(&n->hdr->budget, budget, __ATOMIC_RELEASE);
        __atomic_store_n(&n->hdr->budget_pid, n->pid, __ATOMIC_RELAXED);
    }
    for (uint32_t i = 0; i < n->nslots; i++) {
        struct sh_node_slot *s = &n->slots[i];
        if (load_pid(s) != 0)
            continue;
        __atomic_store_n(&s->bytes, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->start_ticks, sh_tm_proc_start_ticks(n->pid), __ATOMIC_RELAXED);
        __atomic_store_n(&s->pidns, n->pidns, __ATOMIC_RELAXED);
        __atomic_store_n(&s->pid, n->pid, __ATOMIC_RELEASE); /* last: the slot is now whole */
        n->slot = (int)i;
        return SH_OK;
    }
    return SH_EBUSY;
}

static void say_budget(const struct sh_node *n, uint64_t mine)
{
    uint64_t b = load64(&n->hdr->budget);
    if (b != mine)
        sh_log(SH_LOG_WARN,
               "%s: the node's host budget is %llu MB, set by its first process (pid %d); "
               "this process's %llu MB bounds its own share only",
               n->path, (unsigned long long)(b >> 20),
               (int)__atomic_load_n(&n->hdr->budget_pid, __ATOMIC_RELAXED),
               (unsigned long long)(mine >> 20));
}

int sh_node_open(const struct sh_node_params *p, struct sh_node **out, char *err, size_t errlen)
{
    char name[SH_NODE_NAME_MAX + 1];
    const char *why = NULL;
    if (!p || !out || p->budget == 0)
        return SH_EINVAL;
    if (sh_node_name(p->name, name, sizeof name, &why) != SH_OK) {
        snprintf(err, errlen, "node-budget segment name \"%s\": %s", p->name, why);
        return SH_EINVAL;
    }
    struct sh_node *n = calloc(1, sizeof *n);
    if (!n)
        return SH_ENOMEM;
    n->fd = -1;
    n->slot = -1;
    n->pid = getpid();
    n->pidns = sh_node_pidns(0);
    n->lock_ms = p->lock_ms > 0 ? p->lock_ms : SH_NODE_LOCK_MS;
    int rc = sh_node_seg_open(n, p->dir, name, p->budget, err, errlen);
    if (rc == SH_OK && (rc = lock(n)) == SH_OK) {
        rc = take_slot(n, p->budget);
        unlock(n);
        if (rc)
            snprintf(err, errlen, "%s: all %u slots are held by live processes", n->path,
                     n->nslots);
    } else if (rc == SH_EBUSY)
        snprintf(err, errlen, "%s: cannot take its lock", n->path);
    if (rc) {
        sh_node_seg_close(n);
        free(n);
        return rc;
    }
    say_budget(n, p->budget);
    *out = n;
    return SH_OK;
}

void sh_node_close(struct sh_node *n)
{
    if (!n)
        return;
    /* Only the process that took the slot gives it up; a fork child just unmaps. */
    if (n->slot >= 0 && getpid() == n->pid && lock(n) == SH_OK) {
        __atomic_store_n(&n->slots[n->slot].pid, 0, __ATOMIC_RELEASE);
        unlock(n);
    }
    sh_node_seg_close(n);
    free(n);
}

int sh_node_reserve(struct sh_node *n, uint64_t bytes)
{
    if (getpid() != n->pid)
        return SH_ENOMEM; /* a fork child holds no slot of its own */
    int rc = lock(n);
    if (rc)
        return rc;
    uint64_t budget = load64(&n->hdr->budget), u = used(n, NULL);
    if (u + bytes > budget && reclaim_locked(n) > 0)
        u = used(n, NULL);
    rc = u + bytes <= budget && u + bytes >= u ? SH_OK : SH_ENOMEM;
    if (rc == SH_OK)
        __atomic_fetch_add(&n->slots[n->slot].bytes, bytes, __ATOMIC_ACQ_REL);
    unlock(n);
    if (rc)
        __atomic_fetch_add(&n->refused, 1, __ATOMIC_RELAXED);
    return rc;
}

/* Our slot's bytes have no other writer: no lock to give them back. */
void sh_node_release(struct sh_node *n, uint64_t bytes)
{
    if (getpid() != n->pid)
        return;
    uint64_t *b = &n->slots[n->slot].bytes, cur = load64(b);
    while (!__atomic_compare_exchange_n(b, &cur, cur > bytes ? cur - bytes : 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
        ;
}

int sh_node_reclaim(struct sh_node *n)
{
    if (lock(n))
        return 0;
    int freed = reclaim_locked(n);
    unlock(n);
    return freed;
}

void sh_node_stats(struct sh_node *n, struct sh_node_stats *st)
{
    st->budget = load64(&n->hdr->budget);
    st->used = used(n, &st->ranks);
    st->share = load64(&n->slots[n->slot].bytes);
    st->slot = n->slot;
    st->refused = __atomic_load_n(&n->refused, __ATOMIC_RELAXED);
}

const char *sh_node_path(const struct sh_node *n)
{
    return n->path;
}
