/* devices.c — which managed device an address or a device number belongs
 * to. Devices are published once (start.c) and never withdrawn, so the
 * lookups read sh_rt.devs without a lock.
 *
 * Shared state: none of its own.
 */
#include "interpose/interpose.h"

struct sh_dev *sh_dev_of(uintptr_t p)
{
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        struct sh_dev *d = sh_rt.devs[i];
        uintptr_t lo, hi;
        sh_pool_bounds(d->pool, &lo, &hi);
        /* Pools' reservations may interleave: with several, the pool says. */
        if (p >= lo && p < hi && (n == 1 || sh_pool_lookup(d->pool, p, NULL) == 0))
            return d;
    }
    return NULL;
}

void sh_dev_bounds(uintptr_t *lo, uintptr_t *hi)
{
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        uintptr_t l, h;
        sh_pool_bounds(sh_rt.devs[i]->pool, &l, &h);
        if (h <= l)
            continue;
        if (*hi <= *lo)
            *lo = l, *hi = h;
        *lo = l < *lo ? l : *lo;
        *hi = h > *hi ? h : *hi;
    }
}

struct sh_dev *sh_dev_ordinal(int ordinal)
{
    int n = atomic_load_explicit(&sh_rt.ndevs, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (sh_rt.devs[i]->ordinal == ordinal)
            return sh_rt.devs[i];
    return NULL;
}
