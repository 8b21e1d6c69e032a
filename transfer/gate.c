/* gate.c — the remap gate: a writer-preferring rwlock whose read side nests
 * per thread.
 *
 * Locking: the rwlock itself; the per-thread depth is thread-local (one gate
 * per process in practice, so one depth counter suffices and is checked).
 */
#include "transfer/transfer.h"

#include "sh_err.h"

#include <pthread.h>
#include <stdlib.h>

struct sh_gate {
    pthread_rwlock_t rw;
    uint64_t windows;
    unsigned waiting; /* readers blocked on the read side now */
};

static _Thread_local const struct sh_gate *held_gate;
static _Thread_local unsigned depth;

int sh_gate_create(struct sh_gate **out)
{
    struct sh_gate *g = calloc(1, sizeof *g);
    if (!g)
        return SH_ENOMEM;
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&g->rw, &attr);
    pthread_rwlockattr_destroy(&attr);
    *out = g;
    return 0;
}

void sh_gate_destroy(struct sh_gate *g)
{
    if (!g)
        return;
    pthread_rwlock_destroy(&g->rw);
    free(g);
}

void sh_gate_enter(struct sh_gate *g)
{
    if (depth++ == 0) {
        __atomic_add_fetch(&g->waiting, 1, __ATOMIC_RELAXED);
        pthread_rwlock_rdlock(&g->rw);
        __atomic_sub_fetch(&g->waiting, 1, __ATOMIC_RELAXED);
        held_gate = g;
    }
}

void sh_gate_leave(struct sh_gate *g)
{
    (void)g;
    if (depth > 0 && --depth == 0) {
        held_gate = NULL;
        pthread_rwlock_unlock(&g->rw);
    }
}

int sh_gate_held(const struct sh_gate *g)
{
    return depth > 0 && held_gate == g;
}

int sh_gate_lock(struct sh_gate *g)
{
    if (sh_gate_held(g))
        return SH_EBUSY;
    pthread_rwlock_wrlock(&g->rw);
    __atomic_add_fetch(&g->windows, 1, __ATOMIC_RELAXED);
    return 0;
}

void sh_gate_unlock(struct sh_gate *g)
{
    pthread_rwlock_unlock(&g->rw);
}

uint64_t sh_gate_windows(const struct sh_gate *g)
{
    return __atomic_load_n(&g->windows, __ATOMIC_RELAXED);
}

unsigned sh_gate_waiting(const struct sh_gate *g)
{
    return __atomic_load_n(&g->waiting, __ATOMIC_RELAXED);
}
