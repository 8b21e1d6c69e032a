/* tm_internal.h — the segment's on-disk header, the seqlock, and the JSONL
 * formatter: shared by the telemetry files and the unit tests, not by the library.
 *
 * Segment layout: one struct sh_tm_shm_hdr at offset 0, then the snapshot
 * (struct sh_tm_snapshot) at hdr.snap_offset, hdr.snap_size bytes; the file
 * is hdr.total_size bytes (page-rounded). Everything is native-endian: a
 * segment is only ever read on the machine that wrote it.
 *
 * The seqlock: hdr.seq is even when the snapshot is stable and odd while the
 * publisher rewrites it. The writer stores seq odd, then the snapshot word by
 * word with release stores (each keeps "seq is odd" ahead of it), then seq
 * even (release). A reader loads seq (acquire), copies word by word with
 * acquire loads (so the final seq load cannot move above them) and retries
 * unless seq is unchanged and even. No fences (ThreadSanitizer does not model
 * them), every shared access atomic: a concurrent copy races on nothing. On
 * x86 all of these are plain moves.
 */
#ifndef SH_TM_INTERNAL_H
#define SH_TM_INTERNAL_H

#include "telemetry/telemetry.h"

#include <stddef.h>
#include <stdint.h>

#define SH_TM_MAGIC      "SHTMSEG1" /* 8 bytes, no NUL stored */
#define SH_TM_MAJOR      1
#define SH_TM_MINOR      2
#define SH_TM_HDR_SIZE   128
#define SH_TM_MAX_SNAP   (16u << 20) /* a reader refuses anything larger */
#define SH_TM_READ_WAIT  500000      /* us a reader waits for a stable copy */
#define SH_TM_JSONL_LINE 8192        /* the longest JSONL line (16 devices fit) */
#define SH_TM_EVENT_RING 1024        /* in-process event ring (power of two) */
#define SH_TM_STEP_RING  64          /* captured step records not yet written */

struct sh_tm_shm_hdr {
    char magic[8]; /* written last, so a reader never sees a half-built header */
    uint16_t major, minor;
    uint32_t hdr_size;
    uint64_t total_size;
    uint64_t snap_offset;
    uint64_t snap_size;
    int32_t pid;
    uint32_t flags;
    uint64_t start_ticks; /* /proc/<pid>/stat field 22: tells a reused pid */
    uint64_t seq;         /* the seqlock word; accessed atomically only */
    uint64_t reserved[8];
};

_Static_assert(sizeof(struct sh_tm_shm_hdr) == SH_TM_HDR_SIZE, "segment header is 128 bytes");
_Static_assert(sizeof(struct sh_tm_snapshot) % 8 == 0, "snapshot is whole words");
_Static_assert(SH_TM_NCOUNTERS <= SH_TM_MAX_COUNTERS, "room for the counters");
_Static_assert(SH_TM_NGAUGES <= SH_TM_MAX_GAUGES, "room for the gauges");

/* ---- seqlock over word-aligned memory (n a multiple of 8) ---- */
void sh_tm_seq_write(uint64_t *seq, void *dst, const void *src, size_t n);
/* 0 with a stable copy, SH_EBUSY if none came within timeout_us (a writer
 * that died mid-write leaves seq odd for ever). */
int sh_tm_seq_read(const uint64_t *seq, void *dst, const void *src, size_t n, int timeout_us);

/* ---- process facts ---- */
/* /proc/self/cmdline with spaces for NULs, cut to len-1 bytes. */
void sh_tm_self_cmdline(char *buf, size_t len);
/* Copies src into dst (len bytes with the NUL), cutting it if needed. */
void sh_tm_strcpy(char *dst, size_t len, const char *src);
/* dir/stagehand.<pid> into buf; SH_ERANGE if it does not fit. */
int sh_tm_seg_path(char *buf, size_t len, const char *dir, int pid);

/* ---- counters: clamping a snapshot a reader copied ---- */
void sh_tm_sanitize(struct sh_tm_snapshot *s);

/* ---- JSONL ---- */
/* Figures captured at a step boundary (by sh_tm_step, on the caller). */
struct sh_tm_steprec {
    int64_t step; /* the step that begins */
    uint64_t t_us;
    uint64_t unix_us;
    uint64_t c[SH_TM_NCOUNTERS];
    int64_t g[SH_TM_NGAUGES];
    int64_t step_peak; /* vram_step_peak of the steps that ended */
    struct sh_tm_host classes[SH_TM_MAX_CLASSES];
    int n_classes;
    struct sh_tm_device devices[SH_TM_MAX_DEVICES]; /* taken at step marks */
    int n_devices;
};

/* One JSONL line ('\n' included) for the steps between prev and cur, into
 * buf; returns its length, or 0 if it does not fit. pid and tracking are
 * fields of the line. */
size_t sh_tm_jsonl_format(char *buf, size_t len, int pid, const struct sh_tm_steprec *prev,
                          const struct sh_tm_steprec *cur);

/* ---- internals the publisher shares with counters.c ---- */
void sh_tm_capture(struct sh_tm_steprec *r); /* counters, gauges, classes, now */
int sh_tm_events_copy(struct sh_tm_ev *out, int max, uint64_t *total); /* newest max */
void sh_tm_host_snapshot(struct sh_tm_host *out, uint32_t *n);
/* Sets up the counters' thread-exit key and fork handlers. The publisher
 * calls it before registering its own fork handlers, so that before a fork
 * its lock is taken first, in the same order as everywhere else. */
void sh_tm_counters_init(void);

/* signals.c: the SIGTERM/SIGINT/SIGHUP handlers (installed once) and the
 * path they unlink while armed. */
void sh_tm_signals_install(void);
void sh_tm_signals_arm(const char *path, int owner_pid);
void sh_tm_signals_disarm(void);

/* Starts a new step's VRAM peak at vram_used; returns the old step's peak. */
int64_t sh_tm_step_peak_reset(void);

#endif
