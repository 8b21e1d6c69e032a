/* top.h — stagehand-top's parts and how they meet.
 *
 *   collect.c  snapshots in, a model out: rates, hit rates, sort order (no I/O
 *              but the segment read, no drawing)
 *   layout.c   terminal size in, rectangles out (pure)
 *   render.c   model + layout drawn onto an abstract canvas (pure)
 *   text.c     a character-grid canvas, and the --once, --json and
 *              --prometheus outputs
 *   ui.c       the ncurses canvas, the key loop, the process picker
 *   main.c     options and choosing the process
 *
 * Everything but ui.c and main.c is also compiled into the unit tests.
 * Single-threaded: no locks anywhere in the tool.
 */
#ifndef SH_TOP_H
#define SH_TOP_H

#include "telemetry/telemetry.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- the model ---------------------------------------------------------------- */

enum top_sort { TOP_SORT_SIZE = 0, TOP_SORT_STATE = 1, TOP_SORT_EVICTIONS = 2, TOP_SORT_N = 3 };

struct top_model {
    struct sh_tm_snapshot snap; /* the latest good snapshot */
    int have;                   /* snap holds one */
    int pid;
    int stale;       /* the process is gone: snap is its last word */
    int sort;        /* enum top_sort */
    uint64_t now_us; /* our clock when the snapshot was taken (sh_tm_now_us) */
    /* derived by top_model_update() */
    int n_rates;                 /* points in the rate arrays, oldest first */
    double h2d_rate[SH_TM_HIST]; /* bytes per second */
    double d2h_rate[SH_TM_HIST];
    double h2d_now, d2h_now;    /* over the last second or so */
    double hit_recent, hit_all; /* prefetch hit rate in [0,1]; < 0 when no data */
    double stalls_per_s, stall_ms_per_s, steps_per_s;
    int order[SH_TM_MAX_REGIONS]; /* display order of snap.regions */
};

/* Recomputes everything derived from m->snap (after a read or a sort change). */
void top_model_update(struct top_model *m);
/* Reads the segment into m (keeping the old snapshot on failure); 0 or SH_E*. */
int top_collect(struct top_model *m, struct sh_tm_reader *r);
const char *top_sort_name(int sort);

/* "1.5G", "512M", "12K", "800B": at most 6 characters. */
void top_human_bytes(char *buf, size_t len, double bytes);
/* "1.2s", "45ms", "3m04s", "never" */
void top_human_age(char *buf, size_t len, int64_t us);
/* Printable ASCII only (control and non-ASCII bytes become '?'): for text
 * from the segment, which the tool does not trust. */
void top_sanitize(char *dst, size_t len, const char *src);

/* ---- layout -------------------------------------------------------------------- */

#define TOP_MIN_ROWS  12
#define TOP_MIN_COLS  50
#define TOP_INFO_ROWS 5
#define TOP_EVENTS_W  58

struct top_rect {
    int y, x, h, w; /* h or w 0: not shown */
};

struct top_layout {
    int rows, cols;
    int too_small;           /* only `message` is set */
    struct top_rect message; /* the too-small notice */
    struct top_rect title;   /* line 0 */
    struct top_rect vram;    /* the VRAM bar */
    struct top_rect host;    /* one bar per host pool class */
    struct top_rect info;    /* step, phase, prefetch, stalls, ... */
    struct top_rect spark_h2d, spark_d2h;
    struct top_rect table;  /* header row + region rows */
    struct top_rect events; /* recent events (wide or tall terminals) */
    struct top_rect status; /* the last line: keys */
};

/* Pure: depends on nothing but its arguments. nclasses: meter rows under
 * the VRAM bar, host pool classes and devices (0 still gets one line
 * saying so). */
void top_layout(int rows, int cols, int nclasses, struct top_layout *out);
/* The meter rows a snapshot asks for: a bar per device when it reports
 * several, then the host pool classes. */
int top_meter_rows(const struct sh_tm_snapshot *s);
/* The help box, centred; inside the screen for any size >= TOP_MIN_*. */
struct top_rect top_help_rect(int rows, int cols);
/* Number of rects a layout shows, and each one (for tests). */
int top_layout_rects(const struct top_layout *l, struct top_rect *out, int max);

/* ---- drawing ---------------------------------------------------------------------- */

enum top_attr {
    TA_NORMAL = 0,
    TA_TITLE,
    TA_TITLE_BAD,
    TA_LABEL,
    TA_VALUE,
    TA_DIM,
    TA_OK,
    TA_WARN,
    TA_BAD,
    TA_MARK_LOW,
    TA_MARK_HIGH,
    TA_BRACKET,
    TA_HEADER,
    TA_HEADER_SORT,
    TA_KEY,
    TA_SPARK_H2D,
    TA_SPARK_D2H,
    TA_RESIDENT,
    TA_HOST,
    TA_MOVING,
    TA_FREED,
    TA_SELECT,
    TA_COUNT
};

/* Where drawing goes: put() receives at most ncells glyphs (UTF-8), all on
 * screen; a canvas counts anything it had to refuse in `offscreen`. */
struct top_canvas {
    int rows, cols;
    int utf8; /* Unicode blocks and lines; else ASCII */
    void (*put)(struct top_canvas *cv, int y, int x, const char *s, int ncells, int attr);
    void *ctx;
    long offscreen;
};

/* Draws s (UTF-8; each sequence one cell) at (y, x), clipped to clip and the
 * canvas; returns the cells drawn. */
int top_text(struct top_canvas *cv, const struct top_rect *clip, int y, int x, int attr,
             const char *s);
int top_textf(struct top_canvas *cv, const struct top_rect *clip, int y, int x, int attr,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* What the UI adds to the model. */
struct top_view {
    int help;         /* the help box is open */
    int once;         /* a --once snapshot: no key hints */
    double delay_s;   /* refresh period */
    const char *note; /* a transient message for the status line, or NULL */
};

void top_render(struct top_canvas *cv, const struct top_model *m, const struct top_view *v);
void top_render_help(struct top_canvas *cv);
/* The process picker: segs[0..n), the selected row, and where they live. */
void top_render_picker(struct top_canvas *cv, const struct sh_tm_seg_info *segs, int n, int sel,
                       const char *dir);

/* Sparkline glyph for level 0..8 (0 = blank). */
const char *top_spark_glyph(int utf8, int level);

/* ---- text outputs (text.c) ---------------------------------------------------------- */

/* A character grid that implements the canvas. */
struct top_grid;
struct top_grid *top_grid_new(int rows, int cols, int utf8);
void top_grid_free(struct top_grid *g);
struct top_canvas *top_grid_canvas(struct top_grid *g);
/* Row y as text, trailing blanks removed (static buffer, valid until the next call). */
const char *top_grid_row(struct top_grid *g, int y);
/* The attribute drawn at (y, x); -1 where nothing was drawn. */
int top_grid_attr(const struct top_grid *g, int y, int x);
void top_grid_print(struct top_grid *g, FILE *out);

/* Rows a --once snapshot needs to show up to max_regions regions at cols. */
int top_once_rows(const struct top_model *m, int cols, int max_regions);
int top_print_once(FILE *out, const struct top_model *m, int cols, int utf8);
int top_print_json(FILE *out, const struct top_model *m);
int top_print_prometheus(FILE *out, const struct top_model *m);

#endif
