/* render.c — the screen, drawn onto an abstract canvas: the same code feeds
 * ncurses (ui.c), the --once text grid and the tests. Every write is clipped
 * to its panel's rectangle and to the canvas, so nothing lands off screen or
 * in a neighbour's panel whatever the data.
 */
#include "tools/stagehand-top/top.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- clipped text -------------------------------------------------------------- */

static int glyph_len(unsigned char c)
{
    return c < 0x80 ? 1 : c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
}

static int inside(const struct top_canvas *cv, const struct top_rect *r, int y, int x)
{
    return y >= 0 && x >= 0 && y < cv->rows && x < cv->cols &&
           (!r || (y >= r->y && y < r->y + r->h && x >= r->x && x < r->x + r->w));
}

int top_text(struct top_canvas *cv, const struct top_rect *clip, int y, int x, int attr,
             const char *s)
{
    int drawn = 0;
    const char *run = NULL;
    int run_x = 0, run_n = 0;
    for (size_t i = 0; s[i]; x++) {
        int n = glyph_len((unsigned char)s[i]);
        for (int k = 1; k < n; k++)
            if (!s[i + (size_t)k]) /* a cut sequence at the end: stop */
                return drawn;
        if (inside(cv, clip, y, x)) {
            if (!run) {
                run = s + i;
                run_x = x;
            }
            run_n++;
        } else if (run) {
            break; /* clipping leaves one contiguous run */
        }
        i += (size_t)n;
    }
    if (run) {
        char buf[1024];
        size_t len = 0;
        const char *p = run;
        for (int g = 0; g < run_n; g++) {
            int n = glyph_len((unsigned char)*p);
            if (len + (size_t)n >= sizeof buf) {
                run_n = g;
                break;
            }
            memcpy(buf + len, p, (size_t)n);
            len += (size_t)n;
            p += n;
        }
        buf[len] = '\0';
        if (run_n > 0)
            cv->put(cv, y, run_x, buf, run_n, attr);
        drawn = run_n;
    }
    return drawn;
}

int top_textf(struct top_canvas *cv, const struct top_rect *clip, int y, int x, int attr,
              const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return top_text(cv, clip, y, x, attr, buf);
}

static void fill(struct top_canvas *cv, const struct top_rect *r, int y, int attr)
{
    char line[257];
    memset(line, ' ', sizeof line - 1);
    line[sizeof line - 1] = '\0';
    for (int x = r->x; x < r->x + r->w; x += (int)sizeof line - 1)
        top_text(cv, r, y, x, attr, line); /* clipped to r, so any width is covered */
}

/* Label then value, returning the column after them (and a space). */
static int pair(struct top_canvas *cv, const struct top_rect *r, int y, int x, const char *label,
                int vattr, const char *value)
{
    x += top_text(cv, r, y, x, TA_LABEL, label);
    x += top_text(cv, r, y, x, TA_NORMAL, " ");
    x += top_text(cv, r, y, x, vattr, value);
    return x + 2;
}

const char *top_spark_glyph(int utf8, int level)
{
    static const char *const blocks[] = {" ",      "\u2581", "\u2582", "\u2583", "\u2584",
                                         "\u2585", "\u2586", "\u2587", "\u2588"};
    static const char *const ascii[] = {" ", "_", "_", ".", "-", "-", "=", "*", "#"};
    level = level < 0 ? 0 : level > 8 ? 8 : level;
    return utf8 ? blocks[level] : ascii[level];
}

/* Evictions that copied nothing, and the bytes they did not copy. */
static void clean_pair(struct top_canvas *cv, const struct top_rect *r, int y, int x,
                       const uint64_t *c)
{
    char saved[16], v[48];
    top_human_bytes(saved, sizeof saved, (double)c[SH_TM_C_clean_bytes]);
    snprintf(v, sizeof v, "%llu (%s)", (unsigned long long)c[SH_TM_C_clean_evictions], saved);
    pair(cv, r, y, x, "Clean", c[SH_TM_C_clean_evictions] ? TA_OK : TA_VALUE, v);
}

/* ---- title and status -------------------------------------------------------------- */

/* The title: who we watch on the left, where it is on the right. The
 * command line gets what room is left; on a narrow screen the device name
 * goes first, then the program name. */
static void title(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    char cmd[SH_TM_CMDLINE_MAX], dev[64], left[160], right[128];
    top_sanitize(cmd, sizeof cmd, s->cmdline);
    top_sanitize(dev, sizeof dev, s->device_name);
    snprintf(right, sizeof right, " step %lld  %s %s", (long long)s->gauges[SH_TM_G_step],
             sh_tm_phase_name((int)s->gauges[SH_TM_G_phase]), m->stale ? "" : " ");
    int rw = (int)strlen(right) + (m->stale ? 21 : 0);
    snprintf(left, sizeof left, " stagehand-top  pid %d  GPU %d %s  ", m->pid, s->device, dev);
    if ((int)strlen(left) + rw > r->w)
        snprintf(left, sizeof left, " stagehand-top  pid %d  GPU %d  ", m->pid, s->device);
    if ((int)strlen(left) + rw > r->w)
        snprintf(left, sizeof left, " pid %d ", m->pid);
    fill(cv, r, r->y, TA_TITLE);
    int x = r->x + top_text(cv, r, r->y, r->x, TA_TITLE, left);
    int rx = r->x + r->w - rw;
    if (rx < x)
        rx = x;
    if (rx > x + 8) {
        top_text(cv, r, r->y, x, TA_TITLE, cmd);
        top_text(cv, r, r->y, rx - 1, TA_TITLE, " "); /* keeps a long command apart */
    }
    rx += top_text(cv, r, r->y, rx, TA_TITLE, right);
    if (m->stale)
        top_text(cv, r, r->y, rx, TA_TITLE_BAD, " STALE: process gone ");
}

static void status(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m,
                   const struct top_view *v)
{
    int x = r->x, y = r->y;
    fill(cv, r, y, TA_NORMAL);
    if (!v->once) {
        static const char *const keys[][2] = {
            {"h", "Help "}, {"s", "Sort:"}, {"p", "Pick "}, {"q", "Quit "}};
        for (int i = 0; i < 4; i++) {
            x += top_text(cv, r, y, x, TA_KEY, keys[i][0]);
            x += top_text(cv, r, y, x, TA_NORMAL, keys[i][1]);
            if (i == 1)
                x += top_textf(cv, r, y, x, TA_VALUE, "%-9s ", top_sort_name(m->sort));
        }
    }
    char right[160], age[16];
    int64_t since = m->now_us >= m->snap.now_us ? (int64_t)(m->now_us - m->snap.now_us) : 0;
    top_human_age(age, sizeof age, since);
    if (v->note)
        snprintf(right, sizeof right, "%s ", v->note);
    else if (m->stale)
        snprintf(right, sizeof right, "pid %d has exited: showing its last snapshot ", m->pid);
    else if (v->once)
        snprintf(right, sizeof right, "snapshot of pid %d, %s old ", m->pid, age);
    else
        snprintf(right, sizeof right, "updated %s ago  every %.1fs ", age, v->delay_s);
    int rw = (int)strlen(right);
    int attr = m->stale || since > 5000000 ? TA_WARN : TA_DIM;
    top_text(cv, r, y, r->x + r->w - rw > x ? r->x + r->w - rw : x, attr, right);
}

/* ---- meters --------------------------------------------------------------------------- */

struct bar_spec {
    const char *label; /* drawn in label_w cells */
    int label_w;
    double frac;      /* filled share, 0..1 */
    double low, high; /* watermark shares, or < 0 for none */
    const char *text; /* right-aligned inside the bar */
    int fill_attr;    /* < 0: colour by zone against low/high */
};

static int zone_attr(const struct bar_spec *b, double pos)
{
    if (b->fill_attr >= 0)
        return b->fill_attr;
    return pos >= b->high ? TA_BAD : pos >= b->low ? TA_WARN : TA_OK;
}

/* A fraction of n cells, rounded, within [0, hi]. The figures come from another
 * process's segment: NaN, infinities and values far past 1 (a watermark above
 * the budget) must not reach a conversion to int. */
static int cells(double frac, int n, int hi)
{
    if (!(frac > 0))
        return 0;
    double c = frac * n + 0.5;
    return c >= hi ? hi : (int)c;
}

static int cell_of(double frac, int n)
{
    return cells(frac, n, n - 1);
}

static void bar(struct top_canvas *cv, const struct top_rect *r, int y, const struct bar_spec *b)
{
    int x = r->x;
    top_textf(cv, r, y, x, TA_LABEL, "%-*.*s", b->label_w, b->label_w, b->label);
    x += b->label_w;
    int n = r->w - b->label_w - 2;
    if (n < 3)
        return;
    top_text(cv, r, y, x, TA_BRACKET, "[");
    top_text(cv, r, y, x + n + 1, TA_BRACKET, "]");
    int filled = cells(b->frac, n, n);
    int tlen = (int)strlen(b->text), t0 = tlen <= n - 2 ? n - tlen : n;
    int lo = b->low >= 0 ? cell_of(b->low, n) : -1, hi = b->high >= 0 ? cell_of(b->high, n) : -1;
    for (int i = 0; i < n; i++) {
        char c[2] = {i < filled ? '|' : ' ', '\0'};
        int attr = zone_attr(b, (i + 0.5) / n);
        if (i >= t0) {
            c[0] = b->text[i - t0];
            attr = TA_DIM;
        } else if (i == hi) {
            c[0] = 'H', attr = TA_MARK_HIGH;
        } else if (i == lo) {
            c[0] = 'L', attr = TA_MARK_LOW;
        }
        top_text(cv, r, y, x + 1 + i, attr, c);
    }
}

static double share(int64_t part, int64_t whole)
{
    return whole > 0 && part > 0 ? (double)part / (double)whole : 0.0;
}

static void vram_bar(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m)
{
    const int64_t *g = m->snap.gauges;
    char used[16], budget[16], text[48];
    top_human_bytes(used, sizeof used, (double)g[SH_TM_G_vram_used]);
    top_human_bytes(budget, sizeof budget, (double)g[SH_TM_G_vram_budget]);
    snprintf(text, sizeof text, "%s/%s", used, budget);
    struct bar_spec b = {
        "VRAM",
        5,
        share(g[SH_TM_G_vram_used], g[SH_TM_G_vram_budget]),
        g[SH_TM_G_vram_low] > 0 ? share(g[SH_TM_G_vram_low], g[SH_TM_G_vram_budget]) : -1,
        g[SH_TM_G_vram_high] > 0 ? share(g[SH_TM_G_vram_high], g[SH_TM_G_vram_budget]) : -1,
        text,
        -1};
    if (b.high < 0)
        b.high = 2; /* no watermark: never the red zone */
    if (b.low < 0)
        b.low = b.high;
    bar(cv, r, r->y, &b);
}

int top_meter_rows(const struct sh_tm_snapshot *s)
{
    return (int)s->n_classes + (s->n_devices > 1 ? (int)s->n_devices : 0);
}

/* With several devices, one bar each ("GPU1"): its pool against its own
 * budget, and what of it is on the host. Returns the rows drawn. */
static int device_bars(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    int n = s->n_devices > 1 ? (int)s->n_devices : 0;
    for (int i = 0; i < n && i < r->h; i++) {
        const struct sh_tm_device *d = &s->devices[i];
        char label[16], used[16], budget[16], host[16], text[64];
        snprintf(label, sizeof label, "GPU%d", (int)d->device);
        top_human_bytes(used, sizeof used, (double)d->used);
        top_human_bytes(budget, sizeof budget, (double)d->budget);
        top_human_bytes(host, sizeof host, (double)d->host_bytes);
        snprintf(text, sizeof text, "%s/%s host %s", used, budget, host);
        double f = d->budget ? (double)d->used / (double)d->budget : 0;
        struct bar_spec b = {label, 5, f, -1, -1, text, f >= 1.0 ? TA_BAD : TA_SPARK_D2H};
        bar(cv, r, r->y + i, &b);
    }
    return n < r->h ? n : r->h;
}

static void host_bars(struct top_canvas *cv, const struct top_rect *r0, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    int used = device_bars(cv, r0, m);
    struct top_rect rest = {r0->y + used, r0->x, r0->h - used, r0->w};
    const struct top_rect *r = &rest;
    if (r->h <= 0)
        return;
    if (!s->n_classes) {
        top_text(cv, r, r->y, r->x, TA_LABEL, "Host ");
        top_text(cv, r, r->y, r->x + 5, TA_DIM, "pinned pool not reported");
        return;
    }
    for (int i = 0; i < r->h && i < (int)s->n_classes; i++) {
        const struct sh_tm_host *h = &s->classes[i];
        char label[16], size[16], text[48];
        top_human_bytes(size, sizeof size, (double)h->class_bytes);
        snprintf(label, sizeof label, "%5s", size);
        if (i == r->h - 1 && (int)s->n_classes > r->h)
            snprintf(text, sizeof text, "%llu/%llu +%d more", (unsigned long long)h->in_use,
                     (unsigned long long)h->total, (int)s->n_classes - r->h);
        else
            snprintf(text, sizeof text, "%llu/%llu", (unsigned long long)h->in_use,
                     (unsigned long long)h->total);
        double f = h->total ? (double)h->in_use / (double)h->total : 0;
        struct bar_spec b = {label, 5, f, -1, -1, text, f >= 1.0 ? TA_BAD : TA_SPARK_H2D};
        bar(cv, r, r->y + i, &b);
    }
}

/* ---- the info panel ------------------------------------------------------------------ */

static void pct(char *buf, size_t len, double v)
{
    if (v < 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.1f%%", v * 100.0);
}

/* The host budget this process shares with the node's others: its share,
 * what they all hold of the budget, how many they are. */
static void node_line(struct top_canvas *cv, const struct top_rect *r, int y, const int64_t *g)
{
    char a[32], b[72], u[32], d[32];
    top_human_bytes(a, sizeof a, (double)g[SH_TM_G_host_node_share]);
    top_human_bytes(u, sizeof u, (double)g[SH_TM_G_host_node_used]);
    top_human_bytes(d, sizeof d, (double)g[SH_TM_G_host_node_budget]);
    snprintf(b, sizeof b, "%s/%s", u, d);
    int full = g[SH_TM_G_host_node_used] >= g[SH_TM_G_host_node_budget];
    int x = pair(cv, r, y, r->x, "Node host", TA_VALUE, a);
    x = pair(cv, r, y, x, "all", full ? TA_WARN : TA_VALUE, b);
    snprintf(a, sizeof a, "%lld", (long long)g[SH_TM_G_host_node_ranks]);
    pair(cv, r, y, x, "ranks", TA_VALUE, a);
}

static void info(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    const uint64_t *c = s->counters;
    const int64_t *g = s->gauges;
    char a[32], b[32], d[32];
    int y = r->y, x;
    if (y < r->y + r->h) { /* step and phase */
        snprintf(a, sizeof a, "%lld", (long long)g[SH_TM_G_step]);
        x = pair(cv, r, y, r->x, "Step", TA_VALUE, a);
        x = pair(cv, r, y, x, "Phase", TA_VALUE, sh_tm_phase_name((int)g[SH_TM_G_phase]));
        snprintf(b, sizeof b, "%.2f/s", m->steps_per_s);
        pair(cv, r, y, x, "Rate", TA_VALUE, b);
        y++;
    }
    if (y < r->y + r->h) { /* prefetch */
        pct(a, sizeof a, m->hit_recent);
        pct(b, sizeof b, m->hit_all);
        int attr = m->hit_recent < 0      ? TA_DIM
                   : m->hit_recent >= 0.9 ? TA_OK
                   : m->hit_recent >= 0.6 ? TA_WARN
                                          : TA_BAD;
        x = pair(cv, r, y, r->x, "Prefetch hit", attr, a);
        x = pair(cv, r, y, x, "all", TA_VALUE, b);
        snprintf(d, sizeof d, "%lld", (long long)g[SH_TM_G_prefetch_window]);
        pair(cv, r, y, x, "window", g[SH_TM_G_suppress_speculative] ? TA_WARN : TA_VALUE, d);
        y++;
    }
    if (y < r->y + r->h) { /* stalls */
        snprintf(a, sizeof a, "%llu", (unsigned long long)c[SH_TM_C_stall_count]);
        snprintf(b, sizeof b, "%.1fms", (double)c[SH_TM_C_stall_time_us] / 1000.0);
        snprintf(d, sizeof d, "%.1f/s", m->stalls_per_s);
        x = pair(cv, r, y, r->x, "Stalls", m->stalls_per_s > 0 ? TA_WARN : TA_VALUE, a);
        x = pair(cv, r, y, x, "total", TA_VALUE, b);
        x = pair(cv, r, y, x, "now", m->stalls_per_s > 0 ? TA_WARN : TA_VALUE, d);
        if (c[SH_TM_C_host_launches] > 0) { /* launches that ran partly over the bus */
            snprintf(a, sizeof a, "%llu", (unsigned long long)c[SH_TM_C_host_launches]);
            pair(cv, r, y, x, "On host", TA_WARN, a);
        }
        y++;
    }
    if (y < r->y + r->h) { /* traffic */
        top_human_bytes(a, sizeof a, (double)c[SH_TM_C_d2h_bytes]);
        top_human_bytes(b, sizeof b, (double)c[SH_TM_C_h2d_bytes]);
        snprintf(d, sizeof d, "%llu", (unsigned long long)c[SH_TM_C_evictions]);
        x = pair(cv, r, y, r->x, "Evicted", TA_VALUE, a);
        x = pair(cv, r, y, x, "Restored", TA_VALUE, b);
        x = pair(cv, r, y, x, "Evictions", TA_VALUE, d);
        clean_pair(cv, r, y, x, c);
        y++;
    }
    if (y < r->y + r->h) { /* regions and tracking */
        if (g[SH_TM_G_regions_pinned] > 0)
            snprintf(a, sizeof a, "%llu (%lld pinned)", (unsigned long long)s->regions_total,
                     (long long)g[SH_TM_G_regions_pinned]);
        else
            snprintf(a, sizeof a, "%llu", (unsigned long long)s->regions_total);
        snprintf(b, sizeof b, "%lld/%lld", (long long)g[SH_TM_G_regions_persistent],
                 (long long)g[SH_TM_G_regions_transient]);
        x = pair(cv, r, y, r->x, "Regions", TA_VALUE, a);
        x = pair(cv, r, y, x, "pers/trans", TA_VALUE, b);
        pair(cv, r, y, x, "Tracking", TA_VALUE, sh_tm_tracking_name((int)g[SH_TM_G_tracking]));
        y++;
    }
    if (y < r->y + r->h && g[SH_TM_G_host_node_budget] > 0)
        node_line(cv, r, y, g);
}

/* ---- sparklines ----------------------------------------------------------------------- */

#define SPARK_LABEL 14

static void spark(struct top_canvas *cv, const struct top_rect *r, const char *name,
                  const double *v, int n, double now, int attr)
{
    char rate[16];
    top_human_bytes(rate, sizeof rate, now);
    top_text(cv, r, r->y, r->x, TA_LABEL, name);
    top_textf(cv, r, r->y, r->x + 4, TA_VALUE, "%7s/s", rate);
    int gw = r->w - SPARK_LABEL, gx = r->x + SPARK_LABEL;
    if (gw < 4)
        return;
    int shown = n < gw ? n : gw;
    double max = 1024.0 * 1024.0; /* below 1 MB/s the graph stays flat */
    for (int i = n - shown; i < n; i++)
        max = v[i] > max ? v[i] : max;
    if (r->h >= 2) {
        top_human_bytes(rate, sizeof rate, max);
        top_textf(cv, r, r->y + 1, r->x, TA_DIM, "max %5s/s", rate);
    }
    for (int col = 0; col < shown; col++) {
        double val = v[n - shown + col];
        int eighths = cells(val / max, r->h * 8, r->h * 8);
        if (val > 0 && eighths == 0)
            eighths = 1; /* any traffic shows */
        for (int row = 0; row < r->h; row++) {
            int level = eighths - (r->h - 1 - row) * 8;
            top_text(cv, r, r->y + row, gx + gw - shown + col, attr,
                     top_spark_glyph(cv->utf8, level));
        }
    }
}

/* ---- the regions table ------------------------------------------------------------------ */

enum {
    COL_GPU, /* only with several devices managed */
    COL_ADDR,
    COL_SIZE,
    COL_CLASS,
    COL_STATE,
    COL_LAST,
    COL_EVICT,
    COL_REST,
    COL_ID,
    NCOLS
};

static const struct {
    const char *name;
    int w, right, sort; /* sort: the enum top_sort this column orders by, or -1 */
} table_cols[NCOLS] = {
    {"GPU", 3, 1, -1},
    {"ADDRESS", 14, 0, -1},
    {"SIZE", 7, 1, TOP_SORT_SIZE},
    {"CLASS", 10, 0, -1},
    {"STATE", 9, 0, TOP_SORT_STATE},
    {"LAST USE", 8, 1, -1},
    {"EVICT", 6, 1, TOP_SORT_EVICTIONS},
    {"REST", 5, 1, -1},
    {"ID", 8, 1, -1},
};

static int state_attr(int state)
{
    switch (state) {
    case 0:
        return TA_RESIDENT;
    case 2:
        return TA_HOST;
    case 1:
    case 3:
        return TA_MOVING;
    default:
        return TA_FREED;
    }
}

static void cell_text(char *buf, size_t len, const struct top_model *m,
                      const struct sh_tm_region *g, int device, int col)
{
    switch (col) {
    case COL_GPU:
        snprintf(buf, len, "%d", device);
        break;
    case COL_ADDR:
        snprintf(buf, len, "0x%012llx", (unsigned long long)g->va);
        break;
    case COL_SIZE:
        top_human_bytes(buf, len, (double)g->size);
        break;
    case COL_CLASS:
        snprintf(buf, len, "%s", sh_tm_class_name(g->cls));
        break;
    case COL_STATE:
        snprintf(buf, len, "%s", sh_tm_state_name(g->state));
        break;
    case COL_LAST:
        top_human_age(buf, len,
                      !g->last_use_us                   ? -1
                      : m->snap.now_us > g->last_use_us ? (int64_t)(m->snap.now_us - g->last_use_us)
                                                        : 0);
        break;
    case COL_EVICT:
        snprintf(buf, len, "%u", g->evictions);
        break;
    case COL_REST:
        snprintf(buf, len, "%u", g->restores);
        break;
    default:
        snprintf(buf, len, "%llu", (unsigned long long)g->id);
    }
}

/* The columns shown, in order, into cols: those that fit in w (the later
 * ones go first when short), the device's only when there are several. */
static int visible_cols(const struct top_model *m, int w, int *cols)
{
    int n = 0, used = 0;
    for (int c = m->snap.n_devices > 1 ? 0 : COL_ADDR; c < NCOLS; c++) {
        if (used + table_cols[c].w + 1 > w)
            break;
        used += table_cols[c].w + 1;
        cols[n++] = c;
    }
    return n;
}

static void table_header(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m,
                         const int *cols, int ncols)
{
    fill(cv, r, r->y, TA_HEADER);
    int x = r->x;
    for (int i = 0; i < ncols; i++) {
        int c = cols[i];
        int sorted = table_cols[c].sort == m->sort;
        char name[24];
        snprintf(name, sizeof name, "%s%s", table_cols[c].name,
                 sorted ? (cv->utf8 ? "\u25bc" : "*") : "");
        int len = (int)strlen(table_cols[c].name) + sorted;
        int pad = table_cols[c].right ? table_cols[c].w - len : 0;
        top_text(cv, r, r->y, x + (pad > 0 ? pad : 0), sorted ? TA_HEADER_SORT : TA_HEADER, name);
        x += table_cols[c].w + 1;
    }
    char count[48];
    snprintf(count, sizeof count, " %u of %llu regions ", m->snap.n_regions,
             (unsigned long long)m->snap.regions_total);
    int cw = (int)strlen(count);
    if (r->x + r->w - cw >= x)
        top_text(cv, r, r->y, r->x + r->w - cw, TA_HEADER, count);
}

static void table(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m)
{
    int cols[NCOLS], ncols = visible_cols(m, r->w, cols);
    table_header(cv, r, m, cols, ncols);
    if (!m->snap.n_regions) {
        top_text(cv, r, r->y + 1, r->x + 1, TA_DIM, "no regions reported yet");
        return;
    }
    for (int row = 0; row < r->h - 1 && row < (int)m->snap.n_regions; row++) {
        const struct sh_tm_region *g = &m->snap.regions[m->order[row]];
        int x = r->x, y = r->y + 1 + row;
        for (int i = 0; i < ncols; i++) {
            int c = cols[i];
            char buf[32];
            cell_text(buf, sizeof buf, m, g, m->snap.region_device[m->order[row]], c);
            int attr = c == COL_STATE                   ? state_attr(g->state)
                       : c == COL_ADDR                  ? TA_DIM
                       : c == COL_EVICT && g->evictions ? TA_WARN
                                                        : TA_NORMAL;
            int pad = table_cols[c].right ? table_cols[c].w - (int)strlen(buf) : 0;
            top_text(cv, r, y, x + (pad > 0 ? pad : 0), attr, buf);
            x += table_cols[c].w + 1;
        }
    }
}

/* ---- events --------------------------------------------------------------------------------- */

static void events(struct top_canvas *cv, const struct top_rect *r, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    fill(cv, r, r->y, TA_HEADER);
    top_textf(cv, r, r->y, r->x, TA_HEADER, " RECENT EVENTS (%llu in all)",
              (unsigned long long)s->events_total);
    for (int i = 0; i < r->h - 1 && i < (int)s->n_events; i++) {
        const struct sh_tm_ev *e = &s->events[s->n_events - 1 - i];
        char age[16], bytes[16];
        int64_t ago = s->now_us > e->t_us ? (int64_t)(s->now_us - e->t_us) : 0;
        top_human_age(age, sizeof age, ago);
        if (e->kind == SH_TM_EV_STALL) /* bytes holds the wait, in us */
            top_human_age(bytes, sizeof bytes, (int64_t)(e->bytes & INT64_MAX));
        else
            top_human_bytes(bytes, sizeof bytes, (double)e->bytes);
        int bad = e->kind == SH_TM_EV_OOM || e->kind == SH_TM_EV_ERROR || e->kind == SH_TM_EV_STALL;
        int y = r->y + 1 + i;
        if (e->kind == SH_TM_EV_STEP)
            top_textf(cv, r, y, r->x, TA_DIM, " %7s  step     %llu", age,
                      (unsigned long long)e->id);
        else if (e->kind == SH_TM_EV_PHASE)
            top_textf(cv, r, y, r->x, TA_DIM, " %7s  phase    %s", age,
                      sh_tm_phase_name((int)e->id));
        else if (e->kind == SH_TM_EV_TRACKING)
            top_textf(cv, r, y, r->x, TA_NORMAL, " %7s  tracking %s", age,
                      sh_tm_tracking_name((int)e->id));
        else
            top_textf(cv, r, y, r->x, bad ? TA_WARN : TA_NORMAL, " %7s  %-8s #%-8llu %7s", age,
                      sh_tm_event_name((int)e->kind), (unsigned long long)e->id, bytes);
    }
}

/* ---- the whole screen ---------------------------------------------------------------------- */

static void too_small(struct top_canvas *cv, const struct top_layout *l)
{
    if (l->message.w)
        top_textf(cv, &l->message, l->message.y, 0, TA_WARN,
                  "terminal too small: %dx%d, need %dx%d", l->cols, l->rows, TOP_MIN_COLS,
                  TOP_MIN_ROWS);
}

void top_render(struct top_canvas *cv, const struct top_model *m, const struct top_view *v)
{
    struct top_layout l;
    top_layout(cv->rows, cv->cols, top_meter_rows(&m->snap), &l);
    if (l.too_small) {
        too_small(cv, &l);
        return;
    }
    title(cv, &l.title, m);
    vram_bar(cv, &l.vram, m);
    host_bars(cv, &l.host, m);
    info(cv, &l.info, m);
    spark(cv, &l.spark_h2d, "H2D", m->h2d_rate, m->n_rates, m->h2d_now, TA_SPARK_H2D);
    spark(cv, &l.spark_d2h, "D2H", m->d2h_rate, m->n_rates, m->d2h_now, TA_SPARK_D2H);
    table(cv, &l.table, m);
    if (l.events.h)
        events(cv, &l.events, m);
    status(cv, &l.status, m, v);
    if (v->help)
        top_render_help(cv);
}

void top_render_help(struct top_canvas *cv)
{
    static const char *const lines[] = {
        "stagehand-top: what stagehand is doing with GPU memory",
        "",
        "  q F10      quit",
        "  s F6       sort regions: size, state, evictions",
        "  p          pick another process",
        "  h F1 ?     this help (any key closes it)",
        "",
        "VRAM bar  |  used: green below L (low watermark),",
        "             yellow up to H (high watermark), red above",
        "Host bars    pinned slabs in use per size class",
        "H2D / D2H    copy throughput, newest on the right",
        "STATE        RESIDENT on the GPU, HOST in pinned memory,",
        "             EVICTING / RESTORING copying, FREED reusable",
        "LAST USE     time since a kernel last used the region",
    };
    struct top_rect r = top_help_rect(cv->rows, cv->cols);
    if (r.h < 3 || r.w < 10)
        return;
    for (int y = r.y; y < r.y + r.h; y++)
        fill(cv, &r, y, TA_SELECT);
    const char *h = cv->utf8 ? "\u2500" : "-", *vb = cv->utf8 ? "\u2502" : "|";
    for (int x = r.x; x < r.x + r.w; x++) {
        top_text(cv, &r, r.y, x, TA_SELECT, h);
        top_text(cv, &r, r.y + r.h - 1, x, TA_SELECT, h);
    }
    for (int y = r.y; y < r.y + r.h; y++) {
        top_text(cv, &r, y, r.x, TA_SELECT, vb);
        top_text(cv, &r, y, r.x + r.w - 1, TA_SELECT, vb);
    }
    struct top_rect in = {r.y + 1, r.x + 2, r.h - 2, r.w - 4};
    for (int i = 0; i < (int)(sizeof lines / sizeof lines[0]) && i < in.h; i++)
        top_text(cv, &in, in.y + i, in.x, TA_SELECT, lines[i]);
}

void top_render_picker(struct top_canvas *cv, const struct sh_tm_seg_info *segs, int n, int sel,
                       const char *dir)
{
    struct top_rect all = {0, 0, cv->rows, cv->cols};
    if (cv->rows < 4 || cv->cols < 20)
        return;
    struct top_rect line = {0, 0, 1, cv->cols};
    fill(cv, &line, 0, TA_TITLE);
    top_text(cv, &line, 0, 0, TA_TITLE, " stagehand-top: pick a process");
    line.y = 1;
    fill(cv, &line, 1, TA_HEADER);
    top_text(cv, &line, 1, 0, TA_HEADER, "     PID  STATE    COMMAND");
    if (n == 0)
        top_textf(cv, &all, 3, 2, TA_DIM, "no stagehand processes in %s; waiting for one",
                  dir ? dir : SH_TM_SHM_DIR);
    int first = sel >= cv->rows - 3 ? sel - (cv->rows - 4) : 0;
    for (int i = first; i < n && 2 + i - first < cv->rows - 1; i++) {
        int y = 2 + i - first;
        char cmd[SH_TM_CMDLINE_MAX];
        top_sanitize(cmd, sizeof cmd, segs[i].cmdline);
        line.y = y;
        if (i == sel)
            fill(cv, &line, y, TA_SELECT);
        const char *st = segs[i].corrupt ? "corrupt" : segs[i].stale ? "stale" : "live";
        int attr = i == sel ? TA_SELECT : segs[i].stale || segs[i].corrupt ? TA_DIM : TA_NORMAL;
        top_textf(cv, &line, y, 0, attr, "%8d  %-7s  %s", segs[i].pid, st, cmd);
    }
    line.y = cv->rows - 1;
    fill(cv, &line, line.y, TA_NORMAL);
    int x = 0;
    static const char *const keys[][2] = {
        {"Enter", "Attach "}, {"Up/Down", "Move "}, {"q", "Back "}};
    for (int i = 0; i < 3; i++) {
        x += top_text(cv, &line, line.y, x, TA_KEY, keys[i][0]);
        x += top_text(cv, &line, line.y, x, TA_NORMAL, keys[i][1]);
    }
}
