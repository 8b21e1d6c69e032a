/* rwlock.h — the region index's lock: a reader-preferring reader-writer
 * lock whose read side is one atomic add to take and one atomic subtract
 * to give back while no writer holds it (every launch takes it twice).
 *
 * Like glibc's default rwlock it prefers readers: a reader waits only for
 * a writer that holds the lock, never for one that waits, so a thread may
 * take the read side again while holding it. A writer takes the lock when
 * no reader holds it.
 *
 * state counts the readers, with SH_RW_WRITER set while a writer holds it
 * (set only from 0, so a reader that holds it never sees the bit; a reader
 * that sees it had counted itself in by mistake and counts itself out).
 * Whoever must wait sleeps on cv under mu, counted in waiters; a change
 * that may let a sleeper go (the bit cleared, the count down to 0) reads
 * waiters after making it, both sequentially consistent, so either the
 * sleeper sees the change before it sleeps or it is woken.
 */
#ifndef SH_POOL_RWLOCK_H
#define SH_POOL_RWLOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define SH_RW_WRITER ((uint64_t)1 << 63)

struct sh_rwlock {
    _Atomic uint64_t state;
    atomic_uint waiters;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

void sh_rw_init(struct sh_rwlock *l);
void sh_rw_destroy(struct sh_rwlock *l);
void sh_rw_wrlock(struct sh_rwlock *l);
/* The slow paths. */
void sh_rw_read_wait(struct sh_rwlock *l);
void sh_rw_wake(struct sh_rwlock *l);

static inline void sh_rw_rdlock(struct sh_rwlock *l)
{
    if (atomic_fetch_add(&l->state, 1) & SH_RW_WRITER)
        sh_rw_read_wait(l);
}

/* Either side: a reader never holds it with the writer's bit set. */
static inline void sh_rw_unlock(struct sh_rwlock *l)
{
    if (atomic_load(&l->state) & SH_RW_WRITER) {
        atomic_fetch_and(&l->state, ~SH_RW_WRITER);
        if (atomic_load(&l->waiters))
            sh_rw_wake(l);
    } else if (atomic_fetch_sub(&l->state, 1) == 1 && atomic_load(&l->waiters)) {
        sh_rw_wake(l);
    }
}

#endif
