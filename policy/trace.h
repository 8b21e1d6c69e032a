/* trace.h — the access trace: a versioned, line-oriented text format
 * (docs/TRACE.md), a buffered writer for the library's hot path, and a reader
 * that never trusts its input.
 *
 * A trace is the library's event stream: region allocations and frees, kernel
 * launches with the regions they touch, step and phase marks. stagehand-sim
 * replays it through the policy; unit tests build traces in memory.
 *
 * Nothing here is thread-safe: a writer or a trace belongs to one caller at a
 * time (the library holds its own lock around the writer).
 */
#ifndef SH_TRACE_H
#define SH_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define SH_TRACE_VERSION  1
#define SH_TRACE_NO_DUR   UINT64_MAX /* a launch whose duration is not known */
#define SH_TRACE_MAX_REFS (1u << 20) /* regions one launch may reference */

enum sh_trace_type {
    SH_TRACE_ALLOC = 0,  /* a region: id, bytes, stream, cls */
    SH_TRACE_FREE = 1,   /* id, cls */
    SH_TRACE_LAUNCH = 2, /* kernel, stream, dur_us, ids[0..n) */
    SH_TRACE_STEP = 3,   /* step, marked */
    SH_TRACE_PHASE = 4,  /* phase (enum sh_policy_phase), marked */
};

/* One event. Plain data: readers look at it, builders fill it in. */
struct sh_trace_event {
    int type;            /* enum sh_trace_type */
    int cls;             /* ALLOC/FREE: enum sh_policy_class (0 = unknown) */
    int phase;           /* PHASE */
    int marked;          /* STEP/PHASE: 1 = the program marked it, 0 = detected */
    uint64_t t_us;       /* microseconds from the start of the recording */
    uint64_t dur_us;     /* LAUNCH: SH_TRACE_NO_DUR when unknown */
    uint64_t id;         /* ALLOC/FREE: the region */
    uint64_t bytes;      /* ALLOC */
    uint64_t stream;     /* ALLOC/LAUNCH */
    uint64_t kernel;     /* LAUNCH */
    uint64_t step;       /* STEP: the number of the step that begins */
    const uint64_t *ids; /* LAUNCH: the regions it touches */
    size_t n;
    /* LAUNCH: ro[k] is 1 when the launch only reads ids[k] (`i ro` records);
     * NULL when the trace says nothing of it: every region it touches counts
     * as written. Appending copies it too. */
    const uint8_t *ro;
    uint32_t line; /* where it was read, 0 when built in memory */
};

/* ---- writing (docs/TRACE.md) ---------------------------------------------
 * Events are formatted into a buffer without printf and written with one
 * fwrite per full buffer. An I/O error is remembered: every later call and
 * the close report it. */
struct sh_trace_writer;

/* Creates (truncates) path and writes the header; `source` names what
 * recorded it ("libstagehand 0.1.0", "stagehand-sim --gen ...", NULL). */
int sh_trace_writer_open(const char *path, const char *source, struct sh_trace_writer **out);
/* The same, saying in why "path: reason" when it fails. The file is opened without
 * following a final symbolic link or blocking on a FIFO; anything but a regular
 * file the caller owns is refused; a new file is created 0600. Records buffered by
 * a process that later forks are written by that process only. */
int sh_trace_writer_create(const char *path, const char *source, struct sh_trace_writer **out,
                           char *why, size_t whylen);
/* Flushes, closes and frees; returns the first error seen, if any. NULL is ok. */
int sh_trace_writer_close(struct sh_trace_writer *w);
int sh_trace_writer_flush(struct sh_trace_writer *w);

/* A name for a kernel id (once per kernel is enough). */
int sh_trace_write_kernel(struct sh_trace_writer *w, uint64_t kernel, const char *name);
int sh_trace_write_alloc(struct sh_trace_writer *w, uint64_t t_us, uint64_t id, uint64_t bytes,
                         uint64_t stream, int cls);
int sh_trace_write_free(struct sh_trace_writer *w, uint64_t t_us, uint64_t id, int cls);
/* *seq (may be NULL) gets the launch's number in the file (0, 1, ...), for
 * sh_trace_write_duration() once the duration is measured. */
int sh_trace_write_launch(struct sh_trace_writer *w, uint64_t t_us, uint64_t dur_us,
                          uint64_t stream, uint64_t kernel, const uint64_t *ids, size_t n,
                          uint64_t *seq);
int sh_trace_write_duration(struct sh_trace_writer *w, uint64_t seq, uint64_t dur_us);
/* Launch number seq only reads the regions ids[0..n) of those it touches
 * (an `i ro` record); every other region a launch touches counts as
 * written. */
int sh_trace_write_read_only(struct sh_trace_writer *w, uint64_t seq, const uint64_t *ids,
                             size_t n);
/* Region id was found, at an eviction, with the bytes its last restore
 * gave it: the launches numbered first..last that touch it only read it
 * (an `i unchanged` record; what the library learns from clean regions). */
int sh_trace_write_unchanged(struct sh_trace_writer *w, uint64_t id, uint64_t first, uint64_t last);
int sh_trace_write_step(struct sh_trace_writer *w, uint64_t t_us, uint64_t step, int marked);
int sh_trace_write_phase(struct sh_trace_writer *w, uint64_t t_us, int phase, int marked);
/* Bytes handed to the writer so far (written or buffered). */
uint64_t sh_trace_writer_bytes(const struct sh_trace_writer *w);
/* Launches written so far: the number the next one gets. */
uint64_t sh_trace_writer_launches(const struct sh_trace_writer *w);

/* ---- a trace in memory ------------------------------------------------- */
struct sh_trace;

int sh_trace_create(struct sh_trace **out);
void sh_trace_destroy(struct sh_trace *t);
/* Appends a copy of *ev (its ids too). No checks: a builder's job. */
int sh_trace_append(struct sh_trace *t, const struct sh_trace_event *ev);
int sh_trace_set_kernel_name(struct sh_trace *t, uint64_t kernel, const char *name);
/* The launch at event index ev only reads region id: SH_ENOTFOUND when it
 * does not touch id, SH_EINVAL when ev is no launch. */
int sh_trace_set_read_only(struct sh_trace *t, size_t ev, uint64_t id);
/* 1 when the launch e writes its k-th region (as far as the trace says). */
static inline int sh_trace_writes(const struct sh_trace_event *e, size_t k)
{
    return !e->ro || !e->ro[k];
}

size_t sh_trace_count(const struct sh_trace *t);
/* The i-th event, NULL past the end. Valid until the next append. */
const struct sh_trace_event *sh_trace_at(const struct sh_trace *t, size_t i);
/* The name given to a kernel, or NULL. */
const char *sh_trace_kernel_name(const struct sh_trace *t, uint64_t kernel);
/* "source" from the header's comment, "" when none. */
const char *sh_trace_source(const struct sh_trace *t);

/* Reads a trace file. On bad input returns SH_EINVAL with one line in err:
 * "path:line: what is wrong"; SH_ENOTFOUND when the file cannot be opened. */
int sh_trace_read(const char *path, struct sh_trace **out, char *err, size_t errlen);
/* The same from memory (any bytes at all); `name` stands for the path. */
int sh_trace_parse(const char *name, const char *text, size_t len, struct sh_trace **out, char *err,
                   size_t errlen);
/* Writes a whole trace with the writer above. */
int sh_trace_save(const struct sh_trace *t, const char *path, const char *source);

/* "begin", "forward", "backward", "optimizer", "end"; "?" for others. */
const char *sh_trace_phase_name(int phase);

#endif
