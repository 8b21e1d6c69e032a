/* text.c — a character-grid canvas (for --once and the tests) and the
 * machine-readable outputs: --json (one object) and --prometheus (the text
 * exposition format). Strings from the segment are never trusted: JSON gets
 * them escaped and made valid UTF-8, Prometheus labels only carry numbers.
 */
#include "tools/stagehand-top/top.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- the grid ------------------------------------------------------------------ */

struct cell {
    char g[5]; /* one UTF-8 glyph */
    int attr;
};

struct top_grid {
    struct top_canvas cv;
    struct cell *cells;
    char *line; /* top_grid_row's buffer */
};

static void grid_put(struct top_canvas *cv, int y, int x, const char *s, int ncells, int attr)
{
    struct top_grid *g = cv->ctx;
    for (int i = 0; i < ncells && *s; i++) {
        int n = (unsigned char)*s < 0x80    ? 1
                : (unsigned char)*s >= 0xf0 ? 4
                : (unsigned char)*s >= 0xe0 ? 3
                                            : 2;
        if (y < 0 || y >= cv->rows || x + i < 0 || x + i >= cv->cols) {
            cv->offscreen++;
        } else {
            struct cell *c = &g->cells[(size_t)y * (size_t)cv->cols + (size_t)(x + i)];
            memcpy(c->g, s, (size_t)n);
            c->g[n] = '\0';
            c->attr = attr;
        }
        s += n;
    }
}

struct top_grid *top_grid_new(int rows, int cols, int utf8)
{
    if (rows <= 0 || cols <= 0 || rows > 10000 || cols > 10000)
        return NULL;
    struct top_grid *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->cells = calloc((size_t)rows * (size_t)cols, sizeof *g->cells);
    g->line = malloc((size_t)cols * 4 + 1);
    if (!g->cells || !g->line) {
        top_grid_free(g);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) {
        g->cells[i].g[0] = ' ';
        g->cells[i].attr = -1; /* never drawn */
    }
    g->cv = (struct top_canvas){rows, cols, utf8, grid_put, g, 0};
    return g;
}

void top_grid_free(struct top_grid *g)
{
    if (!g)
        return;
    free(g->cells);
    free(g->line);
    free(g);
}

struct top_canvas *top_grid_canvas(struct top_grid *g)
{
    return &g->cv;
}

const char *top_grid_row(struct top_grid *g, int y)
{
    size_t len = 0, keep = 0;
    if (y < 0 || y >= g->cv.rows)
        return "";
    for (int x = 0; x < g->cv.cols; x++) {
        const char *c = g->cells[(size_t)y * (size_t)g->cv.cols + (size_t)x].g;
        size_t n = strlen(c);
        memcpy(g->line + len, c, n);
        len += n;
        if (strcmp(c, " ") != 0)
            keep = len;
    }
    g->line[keep] = '\0';
    return g->line;
}

int top_grid_attr(const struct top_grid *g, int y, int x)
{
    if (y < 0 || y >= g->cv.rows || x < 0 || x >= g->cv.cols)
        return -1;
    return g->cells[(size_t)y * (size_t)g->cv.cols + (size_t)x].attr;
}

void top_grid_print(struct top_grid *g, FILE *out)
{
    for (int y = 0; y < g->cv.rows; y++)
        fprintf(out, "%s\n", top_grid_row(g, y));
}

/* ---- --once ----------------------------------------------------------------------- */

int top_once_rows(const struct top_model *m, int cols, int max_regions)
{
    int want = (int)m->snap.n_regions < max_regions ? (int)m->snap.n_regions : max_regions;
    want = want < 3 ? 3 : want;
    for (int rows = TOP_MIN_ROWS; rows < 200; rows++) {
        struct top_layout l;
        top_layout(rows, cols, top_meter_rows(&m->snap), &l);
        if (!l.too_small && l.table.h - 1 >= want)
            return rows;
    }
    return 200;
}

int top_print_once(FILE *out, const struct top_model *m, int cols, int utf8)
{
    int rows = top_once_rows(m, cols, 20);
    struct top_grid *g = top_grid_new(rows, cols, utf8);
    if (!g)
        return -1;
    struct top_view v = {.once = 1};
    top_render(top_grid_canvas(g), m, &v);
    top_grid_print(g, out);
    top_grid_free(g);
    return ferror(out) ? -1 : 0;
}

/* ---- JSON ------------------------------------------------------------------------------ */

/* Length of a valid UTF-8 sequence at s, or 0. */
static int utf8_ok(const unsigned char *s)
{
    int n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (s[0] >= 0xf8)
        return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

static void json_str(FILE *out, const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', out);
    while (*s) {
        if (*s == '"' || *s == '\\') {
            fprintf(out, "\\%c", *s++);
        } else if (*s < 0x20 || *s == 0x7f) {
            fprintf(out, "\\u%04x", *s++);
        } else if (*s < 0x80) {
            fputc(*s++, out);
        } else {
            int n = utf8_ok(s);
            if (n) {
                fwrite(s, 1, (size_t)n, out);
                s += n;
            } else {
                fputs("\\ufffd", out); /* not UTF-8: keep the JSON valid */
                s++;
            }
        }
    }
    fputc('"', out);
}

static void json_num(FILE *out, double v)
{
    if (isfinite(v))
        fprintf(out, "%.6g", v);
    else
        fputs("null", out);
}

static void json_rate(FILE *out, const char *key, double v, int nullable)
{
    fprintf(out, ",\"%s\":", key);
    if (nullable && v < 0)
        fputs("null", out);
    else
        json_num(out, v);
}

static void json_vram(FILE *out, const int64_t *g)
{
    fprintf(out,
            ",\"vram\":{\"used\":%lld,\"budget\":%lld,\"high\":%lld,\"low\":%lld,"
            "\"peak\":%lld,\"step_peak\":%lld}",
            (long long)g[SH_TM_G_vram_used], (long long)g[SH_TM_G_vram_budget],
            (long long)g[SH_TM_G_vram_high], (long long)g[SH_TM_G_vram_low],
            (long long)g[SH_TM_G_vram_peak], (long long)g[SH_TM_G_vram_step_peak]);
}

static void json_host(FILE *out, const struct sh_tm_snapshot *s)
{
    fputs(",\"host_pool\":[", out);
    for (uint32_t i = 0; i < s->n_classes; i++)
        fprintf(out, "%s{\"class_bytes\":%llu,\"in_use\":%llu,\"total\":%llu}", i ? "," : "",
                (unsigned long long)s->classes[i].class_bytes,
                (unsigned long long)s->classes[i].in_use, (unsigned long long)s->classes[i].total);
    fputc(']', out);
}

/* Every managed device, when there are several (else an empty list). */
static void json_devices(FILE *out, const struct sh_tm_snapshot *s)
{
    fputs(",\"devices\":[", out);
    for (uint32_t i = 0; i < s->n_devices; i++) {
        const struct sh_tm_device *d = &s->devices[i];
        fprintf(out,
                "%s{\"device\":%d,\"regions\":%d,\"budget\":%llu,\"used\":%llu,"
                "\"host_bytes\":%llu,\"evictions\":%llu,\"restores\":%llu,\"d2h_bytes\":%llu,"
                "\"h2d_bytes\":%llu,\"prefetches\":%llu,\"early_evictions\":%llu}",
                i ? "," : "", (int)d->device, (int)d->regions, (unsigned long long)d->budget,
                (unsigned long long)d->used, (unsigned long long)d->host_bytes,
                (unsigned long long)d->evictions, (unsigned long long)d->restores,
                (unsigned long long)d->d2h_bytes, (unsigned long long)d->h2d_bytes,
                (unsigned long long)d->prefetches, (unsigned long long)d->early_evictions);
    }
    fputc(']', out);
}

static void json_figures(FILE *out, const struct sh_tm_snapshot *s)
{
    fputs(",\"counters\":{", out);
    for (int i = 0; i < SH_TM_NCOUNTERS; i++)
        fprintf(out, "%s\"%s\":%llu", i ? "," : "", sh_tm_counter_name(i),
                (unsigned long long)s->counters[i]);
    fputs("},\"gauges\":{", out);
    for (int i = 0; i < SH_TM_NGAUGES; i++)
        fprintf(out, "%s\"%s\":%lld", i ? "," : "", sh_tm_gauge_name(i), (long long)s->gauges[i]);
    fputc('}', out);
}

static void json_rates(FILE *out, const struct top_model *m)
{
    fprintf(out, ",\"rates\":{\"h2d_bytes_per_s\":");
    json_num(out, m->h2d_now);
    json_rate(out, "d2h_bytes_per_s", m->d2h_now, 0);
    json_rate(out, "prefetch_hit_rate", m->hit_all, 1);
    json_rate(out, "prefetch_hit_rate_recent", m->hit_recent, 1);
    json_rate(out, "stalls_per_s", m->stalls_per_s, 0);
    json_rate(out, "stall_ms_per_s", m->stall_ms_per_s, 0);
    json_rate(out, "steps_per_s", m->steps_per_s, 0);
    fputc('}', out);
}

static void json_regions(FILE *out, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    fprintf(out, ",\"regions_total\":%llu,\"sort\":\"%s\",\"regions\":[",
            (unsigned long long)s->regions_total, top_sort_name(m->sort));
    for (uint32_t i = 0; i < s->n_regions; i++) {
        const struct sh_tm_region *g = &s->regions[m->order[i]];
        fputs(i ? ",{" : "{", out);
        if (s->n_devices) /* several managed: whose region it is */
            fprintf(out, "\"device\":%d,", (int)s->region_device[m->order[i]]);
        fprintf(out,
                "\"address\":\"0x%llx\",\"size\":%llu,\"id\":%llu,\"class\":\"%s\","
                "\"state\":\"%s\",\"evictions\":%u,\"restores\":%u,\"last_use_s_ago\":",
                (unsigned long long)g->va, (unsigned long long)g->size, (unsigned long long)g->id,
                sh_tm_class_name(g->cls), sh_tm_state_name(g->state), g->evictions, g->restores);
        if (!g->last_use_us)
            fputs("null", out);
        else
            json_num(out,
                     s->now_us > g->last_use_us ? (double)(s->now_us - g->last_use_us) / 1e6 : 0.0);
        fputc('}', out);
    }
    fputc(']', out);
}

static void json_events(FILE *out, const struct sh_tm_snapshot *s)
{
    fprintf(out, ",\"events_total\":%llu,\"events\":[", (unsigned long long)s->events_total);
    for (uint32_t i = 0; i < s->n_events; i++) {
        const struct sh_tm_ev *e = &s->events[i];
        fprintf(out, "%s{\"kind\":\"%s\",\"id\":%llu,\"bytes\":%llu,\"s_ago\":", i ? "," : "",
                sh_tm_event_name((int)e->kind), (unsigned long long)e->id,
                (unsigned long long)e->bytes);
        json_num(out, s->now_us > e->t_us ? (double)(s->now_us - e->t_us) / 1e6 : 0.0);
        fputc('}', out);
    }
    fputc(']', out);
}

int top_print_json(FILE *out, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    const int64_t *g = s->gauges;
    fprintf(out, "{\"pid\":%d,\"stale\":%s,\"device\":%d,\"device_name\":", m->pid,
            m->stale ? "true" : "false", s->device);
    json_str(out, s->device_name);
    fputs(",\"cmdline\":", out);
    json_str(out, s->cmdline);
    fputs(",\"version\":", out);
    json_str(out, s->version);
    fputs(",\"config\":", out);
    json_str(out, s->config);
    fprintf(out, ",\"time\":%.3f,\"age_s\":", (double)s->now_unix_us / 1e6);
    json_num(out, m->now_us > s->now_us ? (double)(m->now_us - s->now_us) / 1e6 : 0.0);
    fprintf(out, ",\"step\":%lld,\"phase\":\"%s\",\"tracking\":\"%s\"", (long long)g[SH_TM_G_step],
            sh_tm_phase_name((int)g[SH_TM_G_phase]), sh_tm_tracking_name((int)g[SH_TM_G_tracking]));
    json_vram(out, g);
    json_host(out, s);
    json_devices(out, s);
    json_figures(out, s);
    json_rates(out, m);
    json_regions(out, m);
    json_events(out, s);
    fputs("}\n", out);
    return ferror(out) ? -1 : 0;
}

/* ---- Prometheus ------------------------------------------------------------------------ */

/* name_us counters become _seconds (Prometheus' base unit); counters end in _total. */
static void prom_name(char *buf, size_t len, const char *name, const char *unit, int counter)
{
    size_t n = strlen(name);
    if (!strcmp(unit, "us") && n > 3 && !strcmp(name + n - 3, "_us"))
        snprintf(buf, len, "stagehand_%.*s_seconds%s", (int)(n - 3), name, counter ? "_total" : "");
    else if (!strcmp(unit, "bytes") && (n < 6 || strcmp(name + n - 6, "_bytes")))
        snprintf(buf, len, "stagehand_%s_bytes%s", name, counter ? "_total" : "");
    else
        snprintf(buf, len, "stagehand_%s%s", name, counter ? "_total" : "");
}

static void prom_one(FILE *out, const char *name, const char *help, const char *type, int pid,
                     double v)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n%s{pid=\"%d\"} ", name, help, name, type, name, pid);
    if (v == floor(v) && fabs(v) < 9007199254740992.0)
        fprintf(out, "%.0f\n", v); /* whole numbers stay exact */
    else
        fprintf(out, "%.9g\n", isfinite(v) ? v : 0.0);
}

/* With several devices managed, each one's figures, labelled by device
 * (the unlabelled ones above are the main device's). */
static void prom_devices(FILE *out, const struct top_model *m)
{
    static const struct {
        const char *name, *help, *type;
        size_t off;
    } f[] = {
#define DEV(field, name, help, type) {name, help, type, offsetof(struct sh_tm_device, field)}
        DEV(budget, "stagehand_device_budget_bytes", "the device's budget", "gauge"),
        DEV(used, "stagehand_device_used_bytes", "device memory its pool holds", "gauge"),
        DEV(host_bytes, "stagehand_device_host_bytes", "its regions' bytes on the host", "gauge"),
        DEV(evictions, "stagehand_device_evictions_total", "regions moved to the host", "counter"),
        DEV(restores, "stagehand_device_restores_total", "regions brought back", "counter"),
        DEV(d2h_bytes, "stagehand_device_d2h_bytes_total", "bytes copied to the host", "counter"),
        DEV(h2d_bytes, "stagehand_device_h2d_bytes_total", "bytes copied to the device", "counter"),
        DEV(prefetches, "stagehand_device_prefetches_total", "prefetches started", "counter"),
        DEV(early_evictions, "stagehand_device_early_evictions_total", "early evictions started",
            "counter"),
#undef DEV
    };
    const struct sh_tm_snapshot *s = &m->snap;
    uint32_t n = s->n_devices < SH_TM_MAX_DEVICES ? s->n_devices : SH_TM_MAX_DEVICES;
    if (n == 0)
        return;
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
        fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", f[k].name, f[k].help, f[k].name, f[k].type);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t v;
            memcpy(&v, (const char *)&s->devices[i] + f[k].off, sizeof v);
            fprintf(out, "%s{pid=\"%d\",device=\"%d\"} %llu\n", f[k].name, m->pid,
                    (int)s->devices[i].device, (unsigned long long)v);
        }
    }
}

int top_print_prometheus(FILE *out, const struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    char name[128];
    prom_one(out, "stagehand_up", "1 while the process is alive, 0 for a stale segment", "gauge",
             m->pid, m->stale ? 0 : 1);
    for (int i = 0; i < SH_TM_NCOUNTERS; i++) {
        const char *unit = sh_tm_counter_unit(i);
        prom_name(name, sizeof name, sh_tm_counter_name(i), unit, 1);
        double v = (double)s->counters[i];
        prom_one(out, name, sh_tm_counter_help(i), "counter", m->pid,
                 strcmp(unit, "us") ? v : v / 1e6);
    }
    for (int i = 0; i < SH_TM_NGAUGES; i++) {
        prom_name(name, sizeof name, sh_tm_gauge_name(i), sh_tm_gauge_unit(i), 0);
        prom_one(out, name, sh_tm_gauge_help(i), "gauge", m->pid, (double)s->gauges[i]);
    }
    fputs("# HELP stagehand_host_pool_slabs pinned host slabs per size class\n"
          "# TYPE stagehand_host_pool_slabs gauge\n",
          out);
    for (uint32_t i = 0; i < s->n_classes; i++) {
        const struct sh_tm_host *h = &s->classes[i];
        fprintf(out,
                "stagehand_host_pool_slabs{pid=\"%d\",class_bytes=\"%llu\",kind=\"in_use\"} %llu\n"
                "stagehand_host_pool_slabs{pid=\"%d\",class_bytes=\"%llu\",kind=\"total\"} %llu\n",
                m->pid, (unsigned long long)h->class_bytes, (unsigned long long)h->in_use, m->pid,
                (unsigned long long)h->class_bytes, (unsigned long long)h->total);
    }
    prom_devices(out, m);
    return ferror(out) ? -1 : 0;
}
