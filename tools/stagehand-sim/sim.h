/* sim.h — stagehand-sim's parts: the synthetic trace generator, the
 * VRAM/PCIe replay model, and the lower bound. No shared state.
 */
#ifndef SH_SIM_H
#define SH_SIM_H

#include "map/map.h"
#include "sh_err.h"

#include <stddef.h>
#include <stdint.h>

struct sh_trace;

#define SIM_MIB (1024.0 * 1024.0)
#define SIM_GIB (1024.0 * 1024.0 * 1024.0)

/* ---- id -> dense index, in the project's map (map/map.h) ---- */
static inline size_t idmap_get(const struct sh_map *m, uint64_t id) /* SIZE_MAX when absent */
{
    uint32_t v = sh_map_get(m, id);
    return v == SH_MAP_NONE ? SIZE_MAX : v;
}

static inline int idmap_put(struct sh_map *m, uint64_t id, size_t v)
{
    return v >= SH_MAP_NONE ? SH_ENOMEM : sh_map_set(m, id, (uint32_t)v);
}

/* ---- synthetic transformer training (gen.c) ---- */
struct gen_params {
    int blocks;
    double weight_mb, act_mb, grad_mb; /* per block; MiB */
    double optim_mb;                   /* optimizer state per block; < 0: 2 x gradient */
    double lora_mb;                    /* adapter per block with lora; < 0: weight / 64 */
    double ckpt_mb;                    /* block output kept with checkpointing; < 0: act / 8 */
    double compute_ms;                 /* forward of one block; backward is bwd_factor x */
    double bwd_factor;
    double hbm_gbps; /* optimizer kernels: bytes touched / this */
    int lora, checkpointing;
    int steps;
    int marks;      /* write the program's step/phase marks (api), not only detected ones */
    int eval_every; /* every n-th step is an evaluation step (forward only); 0: none */
};

void gen_defaults(struct gen_params *g);
/* Builds the trace; a one-line description of it goes to desc. */
int gen_trace(const struct gen_params *g, struct sh_trace **out, char *desc, size_t desclen);

/* ---- the model (replay.c) ---- */
struct sim_params {
    uint64_t vram_bytes;
    double pcie_bytes_per_s; /* per direction; host to device alone with d2h */
    double d2h_bytes_per_s;  /* device to host */
    int shared_link;         /* both directions share one link */
    uint64_t remap_base_ns;  /* each remap window (drain) */
    uint64_t map_ns;         /* per chunk committed */
    /* drain_mode = device: a window waits for the whole device (copies in
     * flight), and an early eviction starts only for a region no launch
     * used since the last such wait (pool/early.c's ev_idle). */
    int drain_copies;
    uint64_t chunk_bytes;
    /* What the library holds on the device beside the regions: its
     * fingerprint and prefilter buffers from the first eviction, and with
     * the watermarks auto one allocation granule kept free (engine/room.c). */
    uint64_t own_bytes, gran_bytes;
    uint64_t default_ns; /* launches with no duration */
    /* [policy] clean_skip: a restore keeps a host copy; an eviction of a
     * region no launch wrote since copies nothing. Fingerprints (one at the
     * restore, one at the eviction) take bytes / hbm_bytes_per_s in the
     * remap window. */
    int clean_skip;
    /* [budget] watermarks auto: eviction starts only when the next
     * allocation or restore would not fit in the budget, and frees no more
     * than it needs (engine/room.c), as in the library. */
    int high_auto, low_auto;
    double hbm_bytes_per_s;
    /* Every eviction's bytes are read once more in its window by the
     * library's pointer prefilter (a kernel; pool/ptrscan.c), at this rate. */
    double prefilter_bytes_per_s;
    int verbose;
    int ignore_marks; /* the policy is told no mark: it finds the steps itself */
};

struct sim_result {
    int steps;
    double step_s;               /* mean over steady steps (after the first two) */
    double compute_s;            /* per steady step */
    uint64_t h2d_bytes;          /* per steady step */
    uint64_t d2h_bytes;          /* per steady step */
    uint64_t stalls;             /* per steady step: launches that waited for a copy */
    double stall_s;              /* per steady step */
    uint64_t alloc_waits;        /* per steady step: allocations that waited for room */
    uint64_t peak_bytes;         /* device bytes, whole run */
    uint64_t windows;            /* remap windows per steady step */
    uint64_t clean;              /* per steady step: evictions that copied nothing */
    uint64_t host_launches;      /* per steady step: launches run with regions on the host */
    double policy_ns_per_launch; /* host time in the policy's decisions, per launch */
    double launch_ns_per_launch; /* host time in sh_policy_launch(), per launch */
    char error[256];
};

/* Replays the trace with the policy params given (kind included). */
struct sh_policy_params;
int sim_run(const struct sh_trace *t, const struct sim_params *sp,
            const struct sh_policy_params *pp, struct sim_result *res);

/* ---- bounds (bound.c) ---- */
struct sim_shape {
    uint64_t footprint; /* peak live bytes */
    uint64_t used_peak; /* the same, of regions a measured step uses: what the bound counts */
    double compute_s;   /* per steady step */
    int steps;          /* steps seen */
};
int sim_shape_of(const struct sh_trace *t, uint64_t default_ns, struct sim_shape *out);
/* max(compute, unavoidable bytes / bandwidth) for one steady step: each byte
 * off the device at the peak crosses the link at least once. */
double sim_lower_bound(const struct sim_shape *s, const struct sim_params *sp,
                       uint64_t *unavoidable_bytes);

/* Per segment of a step, max(compute, what must be restored / bandwidth,
 * what must be evicted / bandwidth) (the two added on a shared link),
 * summed over the best partition into segments (mean over steady steps). */
int sim_segment_bound(const struct sh_trace *t, const struct sim_params *sp, double *out);

/* Where steps begin in the trace: event indices of its step marks, or of
 * the launches where the policy found a boundary. Caller frees *starts. */
int sim_step_starts(const struct sh_trace *t, size_t **starts, size_t *n);

#endif
