/* rwlock.c — the index lock's slow paths (rwlock.h says how it works).
 *
 * Locking: mu guards the sleeps on cv; state and waiters are atomics.
 */
#include "pool/rwlock.h"

void sh_rw_init(struct sh_rwlock *l)
{
    atomic_init(&l->state, 0);
    atomic_init(&l->waiters, 0);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
}

void sh_rw_destroy(struct sh_rwlock *l)
{
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
}

void sh_rw_wake(struct sh_rwlock *l)
{
    pthread_mutex_lock(&l->mu);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Counts a reader out that saw the writer's bit; mu held. The count may
 * reach 0 for a writer asleep. */
static void count_out(struct sh_rwlock *l)
{
    if (atomic_fetch_sub(&l->state, 1) == 1 && atomic_load(&l->waiters))
        pthread_cond_broadcast(&l->cv);
}

/* A reader that counted itself in under a writer: out, then in again once
 * the writer has gone. */
void sh_rw_read_wait(struct sh_rwlock *l)
{
    pthread_mutex_lock(&l->mu);
    count_out(l);
    atomic_fetch_add(&l->waiters, 1);
    for (;;) {
        while (atomic_load(&l->state) & SH_RW_WRITER)
            pthread_cond_wait(&l->cv, &l->mu);
        if (!(atomic_fetch_add(&l->state, 1) & SH_RW_WRITER))
            break;
        count_out(l); /* another writer came first */
    }
    atomic_fetch_sub(&l->waiters, 1);
    pthread_mutex_unlock(&l->mu);
}

static int try_write(struct sh_rwlock *l)
{
    uint64_t none = 0;
    return atomic_compare_exchange_strong(&l->state, &none, SH_RW_WRITER);
}

void sh_rw_wrlock(struct sh_rwlock *l)
{
    if (try_write(l))
        return;
    pthread_mutex_lock(&l->mu);
    atomic_fetch_add(&l->waiters, 1);
    while (!try_write(l))
        pthread_cond_wait(&l->cv, &l->mu);
    atomic_fetch_sub(&l->waiters, 1);
    pthread_mutex_unlock(&l->mu);
}
