/* stagehand.h — the control API of libstagehand.
 *
 * Everything here is plain C with fixed-width types, so Python can call it
 * through ctypes:
 *
 *   lib = ctypes.CDLL(None)            # the preloaded library's symbols
 *   lib.stagehand_step()
 *
 * All functions are safe to call when the library is disabled or not yet
 * initialised: they then report an inactive library and do nothing.
 */
#ifndef STAGEHAND_H
#define STAGEHAND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STAGEHAND_VERSION_MAJOR 0
#define STAGEHAND_VERSION_MINOR 1
#define STAGEHAND_VERSION_PATCH 0

/* Training phases, in the order a step goes through them. */
enum stagehand_phase_id {
    STAGEHAND_PHASE_STEP_BEGIN = 0,
    STAGEHAND_PHASE_FORWARD = 1,
    STAGEHAND_PHASE_BACKWARD = 2,
    STAGEHAND_PHASE_OPTIMIZER = 3,
    STAGEHAND_PHASE_STEP_END = 4,
};

/* "major.minor.patch". */
const char *stagehand_version(void);

/* 1 when allocations are being managed, 0 when the library passes through. */
int stagehand_active(void);

/* Marks a step boundary; returns the number of the step that begins. */
int64_t stagehand_step(void);

/* Marks the phase the program enters; 0, or -1 for an unknown phase. */
int stagehand_phase(int phase);

/* A snapshot of the library's figures. Fields are only ever appended; pass
 * sizeof(stagehand_stats_t) so an older caller keeps working. */
typedef struct stagehand_stats {
    uint64_t active;         /* 1 when managing allocations */
    int64_t step;            /* steps the program marked (stagehand_step) */
    int64_t phase;           /* current enum stagehand_phase_id */
    uint64_t budget_bytes;   /* the VRAM budget */
    uint64_t high_watermark; /* bytes */
    uint64_t low_watermark;  /* bytes */
    uint64_t device_bytes;   /* device memory held by regions and caches */
    uint64_t live_bytes;     /* bytes the program holds in regions */
    uint64_t regions_live;   /* regions the program holds */
    uint64_t regions_freed;  /* freed regions kept for reuse */
    uint64_t allocs;         /* region allocations */
    uint64_t frees;          /* region frees */
    uint64_t reuses;         /* allocations served by a freed region */
    uint64_t small_allocs;   /* allocations served by the sub-allocator */
    uint64_t small_frees;
    uint64_t passthrough;   /* calls passed to CUDA untouched */
    uint64_t vmm_maps;      /* cuMemMap calls made */
    uint64_t vmm_unmaps;    /* cuMemUnmap calls made */
    uint64_t oom;           /* allocations refused for lack of memory */
    uint64_t evictions;     /* regions moved to host memory */
    uint64_t restores;      /* regions brought back */
    uint64_t d2h_bytes;     /* bytes copied device -> host by eviction */
    uint64_t h2d_bytes;     /* bytes copied host -> device by restores */
    uint64_t host_bytes;    /* bytes of regions living in host memory now */
    uint64_t pinned_bytes;  /* host slab memory pinned */
    uint64_t launches;      /* launches seen */
    uint64_t tracking_mode; /* 0 none, 1 CUPTI, 2 hooks */
    uint64_t checksum_mismatches;
    uint64_t remap_windows;     /* remap windows opened */
    uint64_t device_drains;     /* windows that waited for the whole device */
    uint64_t lost_writes;       /* writes a committed move lost (debug_verify_moves) */
    uint64_t opaque_work;       /* launches and copies whose accesses could not be bounded */
    uint64_t regions_pinned;    /* regions whose pages another party holds: never moved */
    uint64_t launches_recorded; /* launches the policy recorded ([policy] record_above_pct) */
    /* [budget] host_ram_scope = node (or auto, in a job of several ranks):
     * the host budget this user's processes on the machine share; all 0
     * when the budget is per process. */
    uint64_t node_budget_bytes;  /* the shared budget */
    uint64_t node_used_bytes;    /* pinned bytes the sharing processes hold, this one included */
    uint64_t node_ranks;         /* processes sharing it, this one included */
    uint64_t launches_unscanned; /* launches issued without a look at their
                                  * arguments: nothing was off the device */
    /* Another CUPTI subscriber (a profiler) took CUPTI over: launches were
     * tracked through the runtime and driver hooks until it unsubscribed. */
    uint64_t cupti_handovers; /* times the library gave CUPTI up */
    uint64_t cupti_returns;   /* times it took CUPTI back */
    /* Device memory kept for reuse (freed regions, spare chunks, free
     * small blocks): what trimming the memory pool releases. */
    uint64_t cached_bytes;
    /* Clean regions ([policy] clean_skip): a restored region keeps its host
     * copy, and an eviction that finds its bytes unchanged copies nothing. */
    uint64_t clean_evictions; /* evictions that copied nothing */
    uint64_t dirty_evictions; /* evictions that compared a kept copy and found changes */
    uint64_t clean_bytes;     /* bytes evictions did not copy: unchanged since the restore */
    uint64_t fingerprints;    /* fingerprint kernel launches */
    uint64_t kept_bytes;      /* host memory the kept copies hold now */
    /* Regions whose bytes changed with no work naming them, under an early
     * eviction (which then stays resident) or since the restore that kept
     * their copy: something writes through a pointer the library cannot
     * see. After the first, no prefetch starts. */
    uint64_t unseen_writes;
    /* Where the time goes: microseconds, in all. While a remap window is
     * open no work is issued; a window waits for the work that may use the
     * regions it moves, then for its copies, and remaps their chunks. */
    uint64_t window_us;    /* remap windows open */
    uint64_t drain_us;     /* ... waiting for that work */
    uint64_t copy_wait_us; /* ... waiting for copies (and copy slots) */
    uint64_t remap_us;     /* ... remapping (the driver's unmap, map and access) */
    /* Evicted bytes are read on the CPU for pointers into regions (work
     * using a region that holds some counts as using every region). */
    uint64_t scan_us;       /* reading them, on any thread */
    uint64_t scan_wait_us;  /* ... waited for by a call of the program (launch, free) */
    uint64_t scanned_bytes; /* bytes read */
    /* Before that, the device reads them in the eviction window for any
     * word a pointer could start with; a region without one is not read. */
    uint64_t prefilters;    /* chunks it looked at (kernel launches) */
    uint64_t scans_skipped; /* evicted regions it found no candidate in */
    uint64_t stalls;        /* launches held until what they use was on the device */
    uint64_t stall_us;      /* ... and for how long */
    /* Moves ahead of need ([policy] eviction_policy = learned). */
    uint64_t prefetches;       /* restores started before a launch needed them */
    uint64_t prefetch_commits; /* ... that completed */
    uint64_t early_evictions;  /* evictions started before the room was needed */
    uint64_t early_commits;    /* ... that completed */
    /* The learned scheduler's view of the program: the step it is in,
     * found from stagehand_step() or, without marks, from the launches
     * repeating; 0 while it has found none (no prediction then). */
    int64_t steps_found;
    uint64_t steps_followed; /* completed steps that matched a recorded one */
    uint64_t steps_departed; /* completed steps that matched none */
    /* The device's own reads of the regions a window moves, waited for,
     * microseconds: fingerprints (clean regions, early evictions; also at
     * an early eviction's start) and the pointer prefilter. */
    uint64_t fingerprint_us;
    uint64_t prefilter_us;
    /* Launches issued with some of their regions still on the host: room
     * for all of them could not be made within the budget, so as many as
     * fit came back and the kernel reached the rest over the bus. */
    uint64_t host_launches;
    /* Of fingerprint_us, the early evictions' start fingerprints not
     * queued on the copy stream (a region with a kept copy, or no room in
     * the queue): taken at once, outside any remap window. */
    uint64_t fingerprint_start_us;
} stagehand_stats_t;

/* Fills *out (at most size bytes of it); 0, or -1 if out is NULL. The
 * device figures are the main device's ([general] device). */
int stagehand_get_stats(stagehand_stats_t *out, size_t size);

/* The same with the device figures of device (the runtime's number), one
 * the library manages ([general] devices = all manages every device the
 * program allocates on); the process-wide ones (step, phase, passthrough,
 * oom, launches and their tracking, stalls, remap windows, the node's
 * budget) are as stagehand_get_stats gives them. 0, or -1 (nothing
 * written) if out is NULL or the device is not managed. */
int stagehand_get_device_stats(int device, stagehand_stats_t *out, size_t size);

/* Where the memory at ptr lives now: 1 on the device, 0 in host memory
 * (evicted, or moving), -1 when it is not in a region the library manages
 * (small allocations, the library inactive, or not device memory at all). */
int stagehand_residency(const void *ptr);

/* PyTorch CUDAPluggableAllocator entry points. */
void *stagehand_malloc(ssize_t size, int device, void *stream);
void stagehand_free(void *ptr, ssize_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif
#endif
