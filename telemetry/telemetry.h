/* telemetry.h — counters, per-step JSONL and the live shared-memory snapshot.
 *
 * Three layers, all in this header:
 *
 *   counters   monotonic figures (sh_tm_add/sh_tm_inc: a plain add to a
 *              thread-local slot, no lock, no shared cache line) and gauges
 *              (sh_tm_set: one relaxed atomic store). Readers sum the slots.
 *   publisher  sh_tm_start() creates /dev/shm/stagehand.<pid> and a thread
 *              that, every period, sums the counters, asks the library for
 *              its largest regions, copies recent events and writes the
 *              snapshot under a seqlock; sh_tm_step() makes that thread append
 *              one JSONL line every `interval` steps. sh_tm_stop() (also run
 *              at exit and on a fatal SIGTERM/SIGINT/SIGHUP) removes the segment.
 *   reader     for stagehand-top and scripts: list segments, open one (every
 *              field of a possibly corrupt segment is checked), take a
 *              consistent snapshot, tell a live process from a stale segment.
 *
 * Counter and gauge names are the JSONL field names of the seeds wherever one
 * exists; the lists below are the single source of those names.
 */
#ifndef SH_TELEMETRY_H
#define SH_TELEMETRY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- counters: monotonic, per thread, summed by readers --------------------
 * X(name, unit, help). Append only: the position is the shared-memory index.
 */
#define SH_TM_COUNTERS(X)                                                                          \
    X(activations_saved, "regions", "transient regions (allocated and freed within one step)")     \
    X(activations_kept, "regions", "transient regions freed without ever leaving the device")      \
    X(activations_spilled, "regions", "evictions of transient regions")                            \
    X(activations_restored, "regions", "restores of transient regions")                            \
    X(spill_bytes, "bytes", "bytes of transient regions evicted")                                  \
    X(restore_bytes, "bytes", "bytes of transient regions restored")                               \
    X(stall_time_us, "us", "time launches waited for a restore")                                   \
    X(stall_count, "stalls", "launches that waited for a restore")                                 \
    X(pool_hits, "slabs", "host slabs served from the pre-pinned pool")                            \
    X(pool_misses, "slabs", "host slab requests the pool could not serve at once")                 \
    X(h2d_bytes, "bytes", "bytes copied host to device (restores and prefetches)")                 \
    X(d2h_bytes, "bytes", "bytes copied device to host (evictions)")                               \
    X(evictions, "regions", "regions moved to host memory")                                        \
    X(restores, "regions", "regions moved back to the device")                                     \
    X(prefetch_issued, "regions", "prefetch copies started")                                       \
    X(prefetch_hits, "regions", "regions resident (or arriving) when a launch needed them")        \
    X(prefetch_misses, "regions", "regions a launch needed that were still on the host")           \
    X(allocs, "regions", "region allocations")                                                     \
    X(frees, "regions", "region frees")                                                            \
    X(oom, "calls", "allocations refused for lack of memory")                                      \
    X(launches, "launches", "kernel launches seen")                                                \
    X(hint_changes, "hints", "Conductor hints that tightened a limit")                             \
    X(deferred, "moves", "evictions and restores put off while a stream captured a graph")         \
    X(phase_step_begin_us, "us", "time spent in the STEP_BEGIN phase")                             \
    X(phase_forward_us, "us", "time spent in the FORWARD phase")                                   \
    X(phase_backward_us, "us", "time spent in the BACKWARD phase")                                 \
    X(phase_optimizer_us, "us", "time spent in the OPTIMIZER phase")                               \
    X(phase_step_end_us, "us", "time spent in the STEP_END phase")                                 \
    X(cupti_handovers, "times",                                                                    \
      "CUPTI given up to another subscriber (a profiler): hooks meanwhile")                        \
    X(cupti_returns, "times", "CUPTI taken back once the other subscriber unsubscribed")           \
    X(clean_evictions, "regions", "evictions that found the region unchanged since its restore")   \
    X(clean_bytes, "bytes", "bytes evictions did not copy: unchanged since their restore")         \
    X(fingerprints, "launches", "fingerprint kernel launches (clean_skip, early evictions)")       \
    X(unseen_writes, "regions",                                                                    \
      "regions found changed with no work naming them (early evictions, kept copies)")             \
    X(host_launches, "launches",                                                                   \
      "launches issued with regions still on the host: no room for all within the budget")

/* ---- gauges: the latest value, set with atomic stores ---------------------- */
#define SH_TM_GAUGES(X)                                                                            \
    X(vram_used, "bytes", "device bytes held by regions and caches")                               \
    X(vram_peak, "bytes", "highest vram_used since start")                                         \
    X(vram_step_peak, "bytes", "highest vram_used in the current step")                            \
    X(vram_budget, "bytes", "the VRAM budget")                                                     \
    X(vram_high, "bytes", "high watermark: eviction starts above it")                              \
    X(vram_low, "bytes", "low watermark: eviction stops below it")                                 \
    X(prefetch_window, "launches", "prefetch look-ahead in force (after Conductor hints)")         \
    X(max_inflight_h2d, "copies", "H2D copies allowed at once (Conductor hint)")                   \
    X(max_inflight_d2h, "copies", "D2H copies allowed at once (Conductor hint)")                   \
    X(suppress_speculative, "bool", "speculative prefetch suppressed (Conductor hint)")            \
    X(rules_fired, "mask", "Conductor rules that tightened a limit this step (bit i: rule i+1)")   \
    X(h2d_inflight, "copies", "H2D copies in flight")                                              \
    X(d2h_inflight, "copies", "D2H copies in flight")                                              \
    X(step, "step", "current step")                                                                \
    X(phase, "phase", "current phase (enum stagehand_phase_id)")                                   \
    X(tracking, "mode", "launch tracking: 0 none, 1 CUPTI, 2 runtime/driver hooks")                \
    X(regions_resident, "regions", "regions in state RESIDENT")                                    \
    X(regions_evicting, "regions", "regions in state EVICTING")                                    \
    X(regions_host, "regions", "regions in state HOST")                                            \
    X(regions_restoring, "regions", "regions in state RESTORING")                                  \
    X(regions_freed, "regions", "freed regions kept for reuse")                                    \
    X(regions_persistent, "regions", "live regions of class persistent")                           \
    X(regions_transient, "regions", "live regions of class transient")                             \
    X(regions_unknown, "regions", "live regions not yet classified")                               \
    X(regions_pinned, "regions", "regions another party holds the pages of: never moved again")    \
    X(host_node_budget, "bytes", "host budget shared by the node's processes; 0: per process")     \
    X(host_node_used, "bytes", "pinned host bytes the processes sharing the node budget hold")     \
    X(host_node_share, "bytes", "this process's part of host_node_used")                           \
    X(host_node_ranks, "processes", "processes sharing the node budget, this one included")        \
    X(kept_bytes, "bytes", "host memory held by copies of resident regions (clean_skip)")

#define SH_TM_ENUM_C_(name, unit, help) SH_TM_C_##name,
#define SH_TM_ENUM_G_(name, unit, help) SH_TM_G_##name,
enum sh_tm_counter { SH_TM_COUNTERS(SH_TM_ENUM_C_) SH_TM_NCOUNTERS };
enum sh_tm_gauge { SH_TM_GAUGES(SH_TM_ENUM_G_) SH_TM_NGAUGES };
#undef SH_TM_ENUM_C_
#undef SH_TM_ENUM_G_

/* Room in the segment; the lists may grow up to these within a major version. */
#define SH_TM_MAX_COUNTERS 64
#define SH_TM_MAX_GAUGES   64

/* Launch tracking modes (gauge `tracking`). */
enum sh_tm_tracking { SH_TM_TRACK_NONE = 0, SH_TM_TRACK_CUPTI = 1, SH_TM_TRACK_HOOKS = 2 };

/* Names, units and help lines; NULL past the end. */
const char *sh_tm_counter_name(int c);
const char *sh_tm_counter_unit(int c);
const char *sh_tm_counter_help(int c);
const char *sh_tm_gauge_name(int g);
const char *sh_tm_gauge_unit(int g);
const char *sh_tm_gauge_help(int g);

/* ---- the hot path ---------------------------------------------------------
 * One slot array per thread, found through a thread-local pointer; the owner
 * is its only writer (relaxed load + store: a plain add, yet race-free for a
 * concurrent reader). A thread registers on its first add; when it exits its
 * figures are folded into a shared total, so nothing is ever lost.
 * The pointer has the default TLS model, not initial-exec: that would mark
 * the library STATIC_TLS, and dlopen (PyTorch's CUDAPluggableAllocator
 * without LD_PRELOAD) then fails with "cannot allocate memory in static TLS
 * block". With TLS descriptors (the Makefile's -mtls-dialect=gnu2) the
 * access costs about the same.
 */
struct sh_tm_slots {
    _Atomic uint64_t v[SH_TM_NCOUNTERS];
};

extern _Thread_local struct sh_tm_slots *sh_tm_tls_;
struct sh_tm_slots *sh_tm_register_(void);

static inline void sh_tm_add(enum sh_tm_counter c, uint64_t n)
{
    struct sh_tm_slots *s = sh_tm_tls_;
    if (__builtin_expect(s == NULL, 0))
        s = sh_tm_register_();
    uint64_t v = atomic_load_explicit(&s->v[c], memory_order_relaxed);
    atomic_store_explicit(&s->v[c], v + n, memory_order_relaxed);
}

static inline void sh_tm_inc(enum sh_tm_counter c)
{
    sh_tm_add(c, 1);
}

/* Every counter summed over all threads, live and exited. */
void sh_tm_counters(uint64_t out[SH_TM_NCOUNTERS]);
uint64_t sh_tm_counter(enum sh_tm_counter c);

/* ---- gauges ---- */
void sh_tm_set(enum sh_tm_gauge g, int64_t v);
void sh_tm_gauge_add(enum sh_tm_gauge g, int64_t delta);
int64_t sh_tm_get(enum sh_tm_gauge g);
void sh_tm_gauges(int64_t out[SH_TM_NGAUGES]);

/* Device bytes now: sets vram_used and raises vram_peak and vram_step_peak.
 * Cheap enough for every allocation and free (a store and, rarely, a CAS). */
void sh_tm_vram(uint64_t used);

/* The host pinned pool, one entry per size class (classes in increasing
 * size; at most SH_TM_MAX_CLASSES). in_use and total count slabs. */
#define SH_TM_MAX_CLASSES 16
void sh_tm_host_class(int index, uint64_t class_bytes, uint64_t in_use, uint64_t total);
void sh_tm_host_classes(int n); /* how many entries are valid */

/* The current phase (enum stagehand_phase_id): sets the gauge, adds the time
 * spent in the previous phase to its phase_*_us counter, logs an event. */
void sh_tm_phase(int phase);

/* Conductor hints in force; counts a change that tightens a limit. */
void sh_tm_hints(int prefetch_window, int max_inflight_h2d, int max_inflight_d2h,
                 int suppress_speculative, uint32_t rules_fired);

/* CLOCK_MONOTONIC in microseconds: the clock of last_use_us and events. */
uint64_t sh_tm_now_us(void);

/* ---- events: a lock-free ring any thread appends to ------------------------ */
enum sh_tm_event_kind {
    SH_TM_EV_NONE = 0,
    SH_TM_EV_EVICT = 1,     /* id: region, bytes: size */
    SH_TM_EV_RESTORE = 2,   /* on-demand restore; id, bytes */
    SH_TM_EV_PREFETCH = 3,  /* prefetch copy started; id, bytes */
    SH_TM_EV_STALL = 4,     /* id: region waited for, bytes: the wait in us */
    SH_TM_EV_OOM = 5,       /* bytes: the refused size */
    SH_TM_EV_STEP = 6,      /* id: the step that begins (logged by sh_tm_step) */
    SH_TM_EV_PHASE = 7,     /* id: the phase entered (logged by sh_tm_phase) */
    SH_TM_EV_HINT = 8,      /* id: rules_fired, bytes: prefetch_window */
    SH_TM_EV_PRESSURE = 9,  /* high watermark crossed; bytes: vram_used */
    SH_TM_EV_ALLOC = 10,    /* id, bytes (large allocations only, by choice) */
    SH_TM_EV_FREE = 11,     /* id, bytes */
    SH_TM_EV_ERROR = 12,    /* id: an SH_E* code */
    SH_TM_EV_TRACKING = 13, /* launch tracking changed; id: the new enum sh_tm_tracking */
    SH_TM_EV_KINDS = 14
};

void sh_tm_event(int kind, uint64_t id, uint64_t bytes);
/* "evict", "restore", ...; "?" for an unknown kind. */
const char *sh_tm_event_name(int kind);

/* ---- the publisher ---------------------------------------------------------- */

/* One row of the regions table. state: enum sh_rstate; cls: enum
 * sh_policy_class (0 unknown, 1 persistent, 2 transient). */
struct sh_tm_region {
    uint64_t va;
    uint64_t size;
    uint64_t id;
    uint64_t last_use_us; /* sh_tm_now_us() of the last launch that used it; 0 never */
    uint32_t evictions;
    uint32_t restores;
    int32_t cls;
    int32_t state;
};

/* One managed device, for a process that manages several (the counters
 * and gauges are the main device's). */
#define SH_TM_MAX_DEVICES 16
struct sh_tm_device {
    int32_t device; /* its number, as the runtime counts */
    int32_t regions;
    uint64_t budget, used; /* device bytes: its budget, what its pool holds */
    uint64_t host_bytes;   /* its regions' bytes on the host now */
    uint64_t evictions, restores, d2h_bytes, h2d_bytes;
    uint64_t prefetches, early_evictions; /* started */
};

/* Called on the publisher thread. `regions` fills out[0..max) with the
 * largest live regions (any order; the publisher sorts) and returns the count;
 * it may take the library's locks but should not block for long. `sample`,
 * if set, runs first, to refresh gauges that are cheaper to poll than to
 * push (region counts by state, host pool classes). `devices`, if set,
 * fills out[0..max) with each managed device and returns the count. */
/* Fills up to max regions, in any order (the snapshot keeps them largest
 * first), and device[i] with out[i]'s device; returns how many. */
typedef int (*sh_tm_regions_fn)(void *ctx, struct sh_tm_region *out, int32_t *device, int max);
typedef int (*sh_tm_devices_fn)(void *ctx, struct sh_tm_device *out, int max);
typedef void (*sh_tm_sample_fn)(void *ctx);

enum sh_tm_flags {
    SH_TM_NO_SIGNALS = 1, /* do not install the SIGTERM/SIGINT/SIGHUP handlers */
    SH_TM_NO_ATEXIT = 2,  /* do not register the atexit hook */
};

struct sh_tm_params {
    int shm_enabled;        /* publish /dev/shm/stagehand.<pid> */
    const char *jsonl_path; /* NULL or "" = no JSONL; "%p" expands to the pid */
    int interval_steps;     /* one JSONL line every this many steps; <= 0 means 1 */
    int period_ms;          /* snapshot period; <= 0 means 250 */
    int device;
    const char *device_name;    /* may be NULL */
    uint64_t budget, high, low; /* bytes; also set the vram_* gauges */
    const char *config_summary; /* may be NULL */
    int tracking;               /* enum sh_tm_tracking */
    sh_tm_regions_fn regions;   /* may be NULL */
    sh_tm_sample_fn sample;     /* may be NULL */
    sh_tm_devices_fn devices;   /* may be NULL */
    void *ctx;
    const char *shm_dir; /* NULL = "/dev/shm" (tests point it elsewhere) */
    int flags;           /* enum sh_tm_flags */
};

/* Creates the segment (O_EXCL, mode 0600; a stale one left by a dead process
 * with our pid is replaced), opens the JSONL file and starts the thread.
 * Fails only when nothing that was asked for could be set up: SH_EINVAL (no
 * params), SH_EBUSY (already started), SH_ENOTFOUND / SH_ENOMEM / SH_ERANGE
 * (the segment or file could not be made; one log line names the path). If
 * one of the two outputs fails the other still comes up. Calls no callback
 * itself, so the caller may hold the locks the callbacks take. */
int sh_tm_start(const struct sh_tm_params *p);

/* Step `step` begins. Captures the counters now (so each JSONL line holds
 * exactly its steps' figures) and wakes the publisher, which writes the line
 * for the steps that ended when step % interval == 0. Never blocks on I/O. */
void sh_tm_step(int64_t step);

/* Wakes the publisher for an immediate snapshot (tests, tools). */
void sh_tm_publish_now(void);

/* Stops the thread, writes pending JSONL lines, removes the segment.
 * Idempotent; also runs from atexit in the process that called start (never
 * in a fork child). It waits for a callback in progress, so do not call it
 * holding a lock the callbacks take, and call it before tearing down what
 * they read. */
void sh_tm_stop(void);

/* The segment's path while started, else "". */
const char *sh_tm_shm_path(void);

/* ---- the snapshot: what the segment holds, as a reader sees it ------------ */
#define SH_TM_MAX_REGIONS 128
#define SH_TM_MAX_EVENTS  64
#define SH_TM_HIST        256
#define SH_TM_CMDLINE_MAX 256

struct sh_tm_host {
    uint64_t class_bytes;
    uint64_t in_use; /* slabs */
    uint64_t total;  /* slabs */
};

struct sh_tm_ev {
    uint64_t t_us;
    uint32_t kind;
    uint32_t pad_;
    uint64_t id;
    uint64_t bytes;
};

/* One point of the rate history: cumulative values at t_us. */
struct sh_tm_sample {
    uint64_t t_us;
    uint64_t h2d_bytes, d2h_bytes;
    uint64_t stall_time_us, stall_count;
    uint64_t prefetch_hits, prefetch_misses;
    uint64_t evictions, restores;
    uint64_t spill_bytes, restore_bytes;
    int64_t vram_used;
    int64_t step;
};

/* Fixed-width fields only, each array with its count: the segment's layout.
 * New fields go at the end (a minor version); readers of an older minor
 * see them zeroed. */
struct sh_tm_snapshot {
    int32_t pid;
    int32_t device;
    uint64_t start_unix_us; /* when the publisher started (wall clock) */
    uint64_t now_us;        /* sh_tm_now_us() at this publish */
    uint64_t now_unix_us;   /* the wall clock at this publish */
    uint64_t publishes;     /* snapshots written so far */
    uint32_t period_ms;
    uint32_t jsonl_interval;
    uint32_t n_counters, n_gauges;
    uint32_t n_classes, n_regions, n_events, n_hist;
    uint64_t events_total; /* events ever appended */
    uint64_t regions_total;
    char version[16];
    char device_name[64];
    char cmdline[SH_TM_CMDLINE_MAX];
    char config[512];
    char jsonl_path[256];
    uint64_t counters[SH_TM_MAX_COUNTERS];
    int64_t gauges[SH_TM_MAX_GAUGES];
    struct sh_tm_host classes[SH_TM_MAX_CLASSES];
    struct sh_tm_sample hist[SH_TM_HIST];           /* oldest first */
    struct sh_tm_region regions[SH_TM_MAX_REGIONS]; /* largest first */
    struct sh_tm_ev events[SH_TM_MAX_EVENTS];       /* oldest first */
    /* minor 1 */
    uint32_t n_devices; /* 0 when one device is managed */
    uint32_t pad_;
    struct sh_tm_device devices[SH_TM_MAX_DEVICES];
    /* minor 2 */
    int32_t region_device[SH_TM_MAX_REGIONS]; /* regions[i]'s device */
};

/* ---- the reader ------------------------------------------------------------- */
#define SH_TM_SHM_DIR    "/dev/shm"
#define SH_TM_SHM_PREFIX "stagehand."

struct sh_tm_seg_info {
    int pid;
    int stale;   /* 1: the process is gone (or the pid was reused) */
    int corrupt; /* 1: the segment cannot be read (see sh_tm_open's message) */
    char cmdline[SH_TM_CMDLINE_MAX];
};

/* Segments in dir (NULL = /dev/shm) named stagehand.<pid>, by pid; fills up to
 * max entries and returns how many there are in all (may exceed max), or a
 * negative SH_E* if dir cannot be read. */
int sh_tm_list(const char *dir, struct sh_tm_seg_info *out, int max);

struct sh_tm_reader;

/* Opens dir/stagehand.<pid> and checks its header: SH_ENOTFOUND (no such
 * segment), SH_EINVAL (corrupt or truncated), SH_ERANGE (another major
 * version); err gets one line saying which. */
int sh_tm_open(const char *dir, int pid, struct sh_tm_reader **out, char *err, size_t errlen);
/* The same for any path (its pid comes from the header). */
int sh_tm_open_path(const char *path, struct sh_tm_reader **out, char *err, size_t errlen);
void sh_tm_close(struct sh_tm_reader *r);

/* A consistent copy of the snapshot, every count clamped to its array and
 * every string terminated, so a reader can trust what it gets even from a
 * corrupt segment. SH_EBUSY if no stable copy could be taken (a writer that
 * died while writing), SH_EINVAL if the segment shrank. */
int sh_tm_read(struct sh_tm_reader *r, struct sh_tm_snapshot *out);

int sh_tm_reader_pid(const struct sh_tm_reader *r);
/* 1 when the publishing process is gone (kill(pid, 0) fails with ESRCH, or
 * the pid now belongs to a process started later), else 0. */
int sh_tm_reader_stale(const struct sh_tm_reader *r);
/* Major and minor version of the open segment. */
void sh_tm_reader_version(const struct sh_tm_reader *r, int *major, int *minor);

/* 1 if pid is alive and (when start_ticks != 0) started at start_ticks. */
int sh_tm_pid_alive(int pid, uint64_t start_ticks);
/* Field 22 of /proc/<pid>/stat (start time in clock ticks); 0 if unknown. */
uint64_t sh_tm_proc_start_ticks(int pid);
/* 1 when the process that started at start_ticks (0: any) is gone: no such
 * pid, a later process under it, or a zombie (exited, its memory freed,
 * not yet reaped). */
int sh_tm_proc_gone(int pid, uint64_t start_ticks);

/* ---- files another user may have planted ---------------------------------- */
struct stat;
/* Opens path with flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC (O_CREAT makes
 * it with mode), then checks it is a regular file this user owns, and clears
 * O_NONBLOCK again: a planted link, FIFO or device neither redirects nor
 * hangs the caller. The fd, *st its status; or -1 with *why saying what is
 * wrong ("is a symbolic link; not following it", "owned by another user",
 * ...), static text. */
int sh_tm_open_own(const char *path, int flags, unsigned mode, struct stat *st, const char **why);

/* Names for the table columns: "RESIDENT"...; "persistent"...; "?" if unknown. */
const char *sh_tm_state_name(int state);
const char *sh_tm_class_name(int cls);
const char *sh_tm_phase_name(int phase);   /* "STEP_BEGIN", ... */
const char *sh_tm_tracking_name(int mode); /* "none", "cupti", "hooks" */

#endif
