/* sh_clock.h — the library's one clock: CLOCK_MONOTONIC, which the
 * monitor, the scheduler's traces and the pool's use stamps all read, so
 * that their times compare.
 */
#ifndef SH_CLOCK_H
#define SH_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t sh_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t sh_clock_us(void)
{
    return sh_clock_ns() / 1000u;
}

#endif
