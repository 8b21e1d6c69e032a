/* names.c — names, units and help lines for counters, gauges, events, region
 * states and classes, phases and tracking modes. Static tables; no state.
 */
#include "telemetry/telemetry.h"

#define NAME_(name, unit, help) #name,
#define UNIT_(name, unit, help) unit,
#define HELP_(name, unit, help) help,

static const char *const counter_names[] = {SH_TM_COUNTERS(NAME_)};
static const char *const counter_units[] = {SH_TM_COUNTERS(UNIT_)};
static const char *const counter_help[] = {SH_TM_COUNTERS(HELP_)};
static const char *const gauge_names[] = {SH_TM_GAUGES(NAME_)};
static const char *const gauge_units[] = {SH_TM_GAUGES(UNIT_)};
static const char *const gauge_help[] = {SH_TM_GAUGES(HELP_)};

#undef NAME_
#undef UNIT_
#undef HELP_

static const char *pick(const char *const *table, int n, int i)
{
    return i >= 0 && i < n ? table[i] : NULL;
}

const char *sh_tm_counter_name(int c)
{
    return pick(counter_names, SH_TM_NCOUNTERS, c);
}

const char *sh_tm_counter_unit(int c)
{
    return pick(counter_units, SH_TM_NCOUNTERS, c);
}

const char *sh_tm_counter_help(int c)
{
    return pick(counter_help, SH_TM_NCOUNTERS, c);
}

const char *sh_tm_gauge_name(int g)
{
    return pick(gauge_names, SH_TM_NGAUGES, g);
}

const char *sh_tm_gauge_unit(int g)
{
    return pick(gauge_units, SH_TM_NGAUGES, g);
}

const char *sh_tm_gauge_help(int g)
{
    return pick(gauge_help, SH_TM_NGAUGES, g);
}

const char *sh_tm_event_name(int kind)
{
    static const char *const names[SH_TM_EV_KINDS] = {
        "none",  "evict", "restore",  "prefetch", "stall", "oom",   "step",
        "phase", "hint",  "pressure", "alloc",    "free",  "error", "tracking"};
    const char *s = pick(names, SH_TM_EV_KINDS, kind);
    return s ? s : "?";
}

/* The values of pool.h's enum sh_rstate. */
const char *sh_tm_state_name(int state)
{
    static const char *const names[] = {"RESIDENT",  "EVICTING", "HOST",
                                        "RESTORING", "FREED",    "DEAD"};
    const char *s = pick(names, 6, state);
    return s ? s : "?";
}

/* The values of policy.h's enum sh_policy_class. */
const char *sh_tm_class_name(int cls)
{
    static const char *const names[] = {"unknown", "persistent", "transient"};
    const char *s = pick(names, 3, cls);
    return s ? s : "?";
}

const char *sh_tm_phase_name(int phase)
{
    static const char *const names[] = {"STEP_BEGIN", "FORWARD", "BACKWARD", "OPTIMIZER",
                                        "STEP_END"};
    const char *s = pick(names, 5, phase);
    return s ? s : "?";
}

const char *sh_tm_tracking_name(int mode)
{
    static const char *const names[] = {"none", "cupti", "hooks"};
    const char *s = pick(names, 3, mode);
    return s ? s : "?";
}
