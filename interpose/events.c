/* events.c — what the library tells the monitor as it happens: events and
 * phases, for the live segment and the JSONL (telemetry/). Below every file
 * that tells (the scheduler among them); monitor.c, which reads their
 * figures, starts it.
 *
 * Shared state: sh_monitor_on, set once the monitor started (atomic).
 */
#include "interpose/interpose.h"

#include "telemetry/telemetry.h"

atomic_int sh_monitor_on; /* the publisher thread reads it */

void sh_monitor_phase(int phase)
{
    if (sh_monitor_on)
        sh_tm_phase(phase);
}

void sh_monitor_event(int kind, uint64_t id, uint64_t bytes)
{
    if (sh_monitor_on)
        sh_tm_event(kind, id, bytes);
}
