/* state.c — residency state machine of a region.
 *
 * A region's state is one int moved with atomic compare-and-swap, so readers
 * (launch hooks, the monitor) never need the region lock to look at it. An
 * invalid move is a bug in the caller: it is refused, leaving the state as it
 * was, and reported on one loud line so it is seen in any log.
 */
#include "pool/pool_parts.h"

#include "sh_err.h"
#include "sh_log.h"

#define BIT(s) (1u << (s))

/* next[from]: the states `from` may move to. */
static const unsigned next[SH_RS_COUNT] = {
    [SH_RS_RESIDENT] = BIT(SH_RS_EVICTING) | BIT(SH_RS_FREED),
    [SH_RS_EVICTING] = BIT(SH_RS_HOST) | BIT(SH_RS_RESIDENT),
    [SH_RS_HOST] = BIT(SH_RS_RESTORING) | BIT(SH_RS_FREED),
    [SH_RS_RESTORING] = BIT(SH_RS_RESIDENT) | BIT(SH_RS_HOST),
    [SH_RS_FREED] = BIT(SH_RS_RESIDENT) | BIT(SH_RS_DEAD),
    [SH_RS_DEAD] = 0,
};

static int in_range(int s)
{
    return s >= 0 && s < SH_RS_COUNT;
}

const char *sh_state_name(int state)
{
    static const char *const names[SH_RS_COUNT] = {
        "RESIDENT", "EVICTING", "HOST", "RESTORING", "FREED", "DEAD",
    };
    return in_range(state) ? names[state] : "INVALID";
}

int sh_state_valid(int from, int to)
{
    return in_range(from) && in_range(to) && (next[from] & BIT(to)) != 0;
}

int sh_state_get(const int *state)
{
    return __atomic_load_n(state, __ATOMIC_ACQUIRE);
}

static int refuse(uint64_t region_id, int from, int to)
{
    sh_log(SH_LOG_ERROR, "bug: region %llu: invalid transition %s -> %s",
           (unsigned long long)region_id, sh_state_name(from), sh_state_name(to));
    return SH_ESTATE;
}

int sh_state_move(int *state, int to, uint64_t region_id)
{
    int from = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    do {
        if (!sh_state_valid(from, to))
            return refuse(region_id, from, to);
    } while (!__atomic_compare_exchange_n(state, &from, to, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return 0;
}

int sh_state_move_from(int *state, int from, int to, uint64_t region_id)
{
    if (!sh_state_valid(from, to))
        return refuse(region_id, from, to);
    int cur = from;
    if (__atomic_compare_exchange_n(state, &cur, to, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    return SH_EBUSY;
}
