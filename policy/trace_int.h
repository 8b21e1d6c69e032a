/* trace_int.h — what the trace files share (policy/trace_*.c; docs/TRACE.md):
 * the in-memory trace's insides, which trace_mem.c builds, trace_read.c fills
 * and trace_write.c saves; the format's phase words; array growth.
 * Nothing outside policy/trace_*.c includes this.
 *
 * No shared state: a writer or a trace belongs to one caller at a time.
 */
#ifndef SH_POLICY_TRACE_INT_H
#define SH_POLICY_TRACE_INT_H

#include "policy/trace.h"

#include <stddef.h>
#include <stdint.h>

#define NAME_MAX_LEN 4096

struct kname {
    uint64_t kernel;
    char *name;
};

struct sh_trace {
    struct sh_trace_event *ev;
    size_t *ids_off; /* per event: offset of its ids in pool */
    size_t n, cap;
    uint64_t *pool;
    size_t npool, cappool;
    uint8_t *ro; /* per entry of pool: 1 when that launch only reads it; NULL until needed */
    size_t capro;
    struct kname *names;
    size_t nnames, capnames;
    char *source;
};

/* "begin", "forward", "backward", "optimizer", "end", indexed by enum
 * sh_policy_phase (trace_mem.c). */
extern const char *const sh_trace_phases[5];

/* Marks the k-th region of launch event ev (k < its n) as only read. */
int sh_trace_ro_at(struct sh_trace *t, size_t ev, size_t k);

/* Grows an array to hold at least `need` elements (doubling). */
int sh_trace_grow(void **arr, size_t *cap, size_t need, size_t elem);

#endif
