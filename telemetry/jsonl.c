/* jsonl.c — one per-step JSONL line from two captured step records.
 *
 * Counts are the difference between the records (the steps the line covers);
 * gauges are the values at the later boundary. Field names follow the seeds
 * (docs/TELEMETRY.md lists them all). Pure formatting: no state, no I/O.
 */
#include "telemetry/tm_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

struct jbuf {
    char *p;
    size_t len, cap;
    int full;
};

static void jb_printf(struct jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void jb_printf(struct jbuf *b, const char *fmt, ...)
{
    if (b->full)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len)
        b->full = 1;
    else
        b->len += (size_t)n;
}

/* JSON has no NaN or infinity. */
static double json_num(double v)
{
    return isfinite(v) ? v : 0.0;
}

static void key_u(struct jbuf *b, const char *k, uint64_t v)
{
    jb_printf(b, ",\"%s\":%llu", k, (unsigned long long)v);
}

static void key_i(struct jbuf *b, const char *k, int64_t v)
{
    jb_printf(b, ",\"%s\":%lld", k, (long long)v);
}

static void key_f(struct jbuf *b, const char *k, double v, int prec)
{
    jb_printf(b, ",\"%s\":%.*f", k, prec, json_num(v));
}

static uint64_t delta(const struct sh_tm_steprec *a, const struct sh_tm_steprec *b, int c)
{
    return b->c[c] >= a->c[c] ? b->c[c] - a->c[c] : 0;
}

static double mb(int64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

/* The seeds' activation and weight figures, as differences. */
static void counts(struct jbuf *b, const struct sh_tm_steprec *a, const struct sh_tm_steprec *z)
{
    static const int plain[] = {SH_TM_C_activations_saved,   SH_TM_C_activations_kept,
                                SH_TM_C_activations_spilled, SH_TM_C_activations_restored,
                                SH_TM_C_spill_bytes,         SH_TM_C_restore_bytes};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        key_u(b, sh_tm_counter_name(plain[i]), delta(a, z, plain[i]));
    key_f(b, "stall_time_ms", (double)delta(a, z, SH_TM_C_stall_time_us) / 1000.0, 3);
    static const int more[] = {SH_TM_C_stall_count,
                               SH_TM_C_pool_hits,
                               SH_TM_C_pool_misses,
                               SH_TM_C_h2d_bytes,
                               SH_TM_C_d2h_bytes,
                               SH_TM_C_evictions,
                               SH_TM_C_restores,
                               SH_TM_C_prefetch_issued,
                               SH_TM_C_prefetch_hits,
                               SH_TM_C_prefetch_misses,
                               SH_TM_C_allocs,
                               SH_TM_C_frees,
                               SH_TM_C_oom,
                               SH_TM_C_launches,
                               SH_TM_C_hint_changes,
                               SH_TM_C_deferred,
                               SH_TM_C_cupti_handovers,
                               SH_TM_C_cupti_returns,
                               SH_TM_C_clean_evictions,
                               SH_TM_C_clean_bytes,
                               SH_TM_C_fingerprints,
                               SH_TM_C_unseen_writes,
                               SH_TM_C_host_launches};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        key_u(b, sh_tm_counter_name(more[i]), delta(a, z, more[i]));
    uint64_t hits = delta(a, z, SH_TM_C_prefetch_hits), miss = delta(a, z, SH_TM_C_prefetch_misses);
    if (hits + miss)
        key_f(b, "prefetch_hit_rate", (double)hits / (double)(hits + miss), 4);
    else
        jb_printf(b, ",\"prefetch_hit_rate\":null");
}

static void vram(struct jbuf *b, const struct sh_tm_steprec *z)
{
    const int64_t *g = z->g;
    key_f(b, "vram_peak_mb", mb(z->step_peak), 1);
    key_f(b, "vram_used_mb", mb(g[SH_TM_G_vram_used]), 1);
    key_f(b, "vram_budget_mb", mb(g[SH_TM_G_vram_budget]), 1);
    key_f(b, "vram_headroom_mb", mb(g[SH_TM_G_vram_budget] - g[SH_TM_G_vram_used]), 1);
    key_f(b, "vram_lifetime_peak_mb", mb(g[SH_TM_G_vram_peak]), 1);
}

static void host_pool(struct jbuf *b, const struct sh_tm_steprec *z)
{
    uint64_t used = 0, total = 0;
    jb_printf(b, ",\"host_pool\":[");
    for (int i = 0; i < z->n_classes; i++) {
        const struct sh_tm_host *h = &z->classes[i];
        jb_printf(b, "%s{\"class_mb\":%.3g,\"in_use\":%llu,\"total\":%llu}", i ? "," : "",
                  json_num(mb((int64_t)h->class_bytes)), (unsigned long long)h->in_use,
                  (unsigned long long)h->total);
        used += h->in_use * h->class_bytes;
        total += h->total * h->class_bytes;
    }
    jb_printf(b, "]");
    key_f(b, "pool_utilization", total ? (double)used / (double)total : 0.0, 4);
}

static void conductor(struct jbuf *b, const struct sh_tm_steprec *z)
{
    const int64_t *g = z->g;
    key_i(b, "prefetch_window", g[SH_TM_G_prefetch_window]);
    key_i(b, "h2d_inflight", g[SH_TM_G_h2d_inflight]);
    key_i(b, "d2h_inflight", g[SH_TM_G_d2h_inflight]);
    jb_printf(b,
              ",\"hints\":{\"prefetch_window\":%lld,\"max_inflight_h2d\":%lld,"
              "\"max_inflight_d2h\":%lld,\"suppress_speculative\":%s,\"rules_fired\":%lld}",
              (long long)g[SH_TM_G_prefetch_window], (long long)g[SH_TM_G_max_inflight_h2d],
              (long long)g[SH_TM_G_max_inflight_d2h],
              g[SH_TM_G_suppress_speculative] ? "true" : "false",
              (long long)g[SH_TM_G_rules_fired]);
}

static void phases(struct jbuf *b, const struct sh_tm_steprec *a, const struct sh_tm_steprec *z)
{
    static const char *const names[] = {"step_begin", "forward", "backward", "optimizer",
                                        "step_end"};
    jb_printf(b, ",\"phase_durations\":{");
    for (int i = 0; i < 5; i++)
        jb_printf(b, "%s\"%s\":%.4f", i ? "," : "", names[i],
                  (double)delta(a, z, SH_TM_C_phase_step_begin_us + i) / 1e6);
    jb_printf(b, "}");
}

static void regions(struct jbuf *b, const struct sh_tm_steprec *z)
{
    const int64_t *g = z->g;
    jb_printf(b,
              ",\"regions\":{\"resident\":%lld,\"evicting\":%lld,\"host\":%lld,"
              "\"restoring\":%lld,\"freed\":%lld,\"persistent\":%lld,\"transient\":%lld,"
              "\"unknown\":%lld,\"pinned\":%lld}",
              (long long)g[SH_TM_G_regions_resident], (long long)g[SH_TM_G_regions_evicting],
              (long long)g[SH_TM_G_regions_host], (long long)g[SH_TM_G_regions_restoring],
              (long long)g[SH_TM_G_regions_freed], (long long)g[SH_TM_G_regions_persistent],
              (long long)g[SH_TM_G_regions_transient], (long long)g[SH_TM_G_regions_unknown],
              (long long)g[SH_TM_G_regions_pinned]);
}

/* Device d's record in r, or NULL (not managed then). */
static const struct sh_tm_device *device_in(const struct sh_tm_steprec *r, int32_t d)
{
    for (int i = 0; i < r->n_devices; i++)
        if (r->devices[i].device == d)
            return &r->devices[i];
    return NULL;
}

static uint64_t since(uint64_t now, uint64_t then)
{
    return now >= then ? now - then : 0;
}

/* With several devices managed, each one's moves in the steps the line
 * covers and its memory at their end (the counters above are the main
 * device's). */
static void devices(struct jbuf *b, const struct sh_tm_steprec *a, const struct sh_tm_steprec *z)
{
    if (z->n_devices < 2)
        return;
    jb_printf(b, ",\"devices\":[");
    for (int i = 0; i < z->n_devices; i++) {
        const struct sh_tm_device *d = &z->devices[i], none = {0}, *p = device_in(a, d->device);
        if (!p)
            p = &none;
        jb_printf(b,
                  "%s{\"device\":%d,\"evictions\":%llu,\"restores\":%llu,\"d2h_bytes\":%llu,"
                  "\"h2d_bytes\":%llu,\"prefetch_issued\":%llu,\"early_evictions\":%llu",
                  i ? "," : "", (int)d->device,
                  (unsigned long long)since(d->evictions, p->evictions),
                  (unsigned long long)since(d->restores, p->restores),
                  (unsigned long long)since(d->d2h_bytes, p->d2h_bytes),
                  (unsigned long long)since(d->h2d_bytes, p->h2d_bytes),
                  (unsigned long long)since(d->prefetches, p->prefetches),
                  (unsigned long long)since(d->early_evictions, p->early_evictions));
        key_f(b, "vram_used_mb", mb((int64_t)d->used), 1);
        key_f(b, "vram_budget_mb", mb((int64_t)d->budget), 1);
        key_f(b, "host_mb", mb((int64_t)d->host_bytes), 1);
        key_i(b, "regions", d->regions);
        jb_printf(b, "}");
    }
    jb_printf(b, "]");
}

size_t sh_tm_jsonl_format(char *buf, size_t len, int pid, const struct sh_tm_steprec *prev,
                          const struct sh_tm_steprec *cur)
{
    struct jbuf b = {buf, 0, len, len == 0};
    int64_t steps = cur->step - prev->step;
    if (steps < 1)
        steps = 1;
    double secs = cur->t_us > prev->t_us ? (double)(cur->t_us - prev->t_us) / 1e6 : 0.0;
    jb_printf(&b, "{\"step\":%lld", (long long)(cur->step - 1));
    key_i(&b, "steps", steps);
    key_i(&b, "pid", pid);
    key_f(&b, "time", (double)cur->unix_us / 1e6, 3);
    key_f(&b, "step_time_s", secs / (double)steps, 4);
    counts(&b, prev, cur);
    vram(&b, cur);
    host_pool(&b, cur);
    conductor(&b, cur);
    phases(&b, prev, cur);
    regions(&b, cur);
    devices(&b, prev, cur);
    jb_printf(&b, ",\"tracking\":\"%s\"}\n", sh_tm_tracking_name((int)cur->g[SH_TM_G_tracking]));
    return b.full ? 0 : b.len;
}
