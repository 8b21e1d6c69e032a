/* collect.c — from snapshots to what the screen shows: rates from the rate
 * history, prefetch hit rates, the regions' display order, and the small
 * formatting helpers shared by every output. No drawing, no terminal.
 *
 * State: the sort comparator's two statics below (qsort takes no context);
 * the tool is single-threaded.
 */
#include "tools/stagehand-top/top.h"

#include "sh_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *top_sort_name(int sort)
{
    static const char *const names[] = {"size", "state", "evictions"};
    return sort >= 0 && sort < TOP_SORT_N ? names[sort] : "?";
}

static double per_s(uint64_t a, uint64_t b, uint64_t dt_us)
{
    return dt_us && b >= a ? (double)(b - a) * 1e6 / (double)dt_us : 0.0;
}

#define MIN_SPAN_US 20000 /* shorter spans (a publish on demand) are merged */

static void rates(struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    m->n_rates = 0;
    if (!s->n_hist)
        return;
    const struct sh_tm_sample *a = &s->hist[0];
    for (uint32_t i = 1; i < s->n_hist; i++) {
        const struct sh_tm_sample *b = &s->hist[i];
        uint64_t dt = b->t_us > a->t_us ? b->t_us - a->t_us : 0;
        if (dt < MIN_SPAN_US)
            continue;
        m->h2d_rate[m->n_rates] = per_s(a->h2d_bytes, b->h2d_bytes, dt);
        m->d2h_rate[m->n_rates] = per_s(a->d2h_bytes, b->d2h_bytes, dt);
        m->n_rates++;
        a = b;
    }
}

/* The sample about `window_us` before the newest (the oldest if the history
 * is shorter), so that "now" figures average over a readable span. */
static const struct sh_tm_sample *back(const struct sh_tm_snapshot *s, uint64_t window_us)
{
    const struct sh_tm_sample *z = &s->hist[s->n_hist - 1];
    for (uint32_t i = s->n_hist - 1; i > 0; i--)
        if (z->t_us - s->hist[i - 1].t_us >= window_us)
            return &s->hist[i - 1];
    return &s->hist[0];
}

static double hit_rate(uint64_t hits, uint64_t misses)
{
    return hits + misses ? (double)hits / (double)(hits + misses) : -1.0;
}

static void recent(struct top_model *m)
{
    const struct sh_tm_snapshot *s = &m->snap;
    m->h2d_now = m->d2h_now = m->stalls_per_s = m->stall_ms_per_s = m->steps_per_s = 0;
    m->hit_recent = -1;
    m->hit_all = hit_rate(s->counters[SH_TM_C_prefetch_hits], s->counters[SH_TM_C_prefetch_misses]);
    if (s->n_hist < 2)
        return;
    const struct sh_tm_sample *z = &s->hist[s->n_hist - 1], *a = back(s, 1000000);
    uint64_t dt = z->t_us > a->t_us ? z->t_us - a->t_us : 0;
    m->h2d_now = per_s(a->h2d_bytes, z->h2d_bytes, dt);
    m->d2h_now = per_s(a->d2h_bytes, z->d2h_bytes, dt);
    m->stalls_per_s = per_s(a->stall_count, z->stall_count, dt);
    m->stall_ms_per_s = per_s(a->stall_time_us, z->stall_time_us, dt) / 1000.0;
    m->steps_per_s = z->step > a->step ? per_s((uint64_t)a->step, (uint64_t)z->step, dt) : 0;
    /* Hit rate over the whole history window: a second holds too few launches. */
    const struct sh_tm_sample *o = &s->hist[0];
    if (z->prefetch_hits >= o->prefetch_hits && z->prefetch_misses >= o->prefetch_misses)
        m->hit_recent =
            hit_rate(z->prefetch_hits - o->prefetch_hits, z->prefetch_misses - o->prefetch_misses);
}

/* ---- ordering ---------------------------------------------------------------------- */

static const struct sh_tm_region *sort_base;
static int sort_key;

/* Host-side and moving regions first: those are what a user watches. */
static int state_rank(int32_t state)
{
    static const int rank[] = {3, 1, 0, 2, 4, 5}; /* RESIDENT EVICTING HOST RESTORING FREED DEAD */
    return state >= 0 && state < 6 ? rank[state] : 6;
}

static int cmp_u64_desc(uint64_t a, uint64_t b)
{
    return (a < b) - (a > b);
}

static int cmp_regions(const void *pa, const void *pb)
{
    const struct sh_tm_region *a = &sort_base[*(const int *)pa], *b = &sort_base[*(const int *)pb];
    int c = 0;
    if (sort_key == TOP_SORT_STATE)
        c = state_rank(a->state) - state_rank(b->state);
    else if (sort_key == TOP_SORT_EVICTIONS)
        c = cmp_u64_desc(a->evictions, b->evictions);
    if (!c)
        c = cmp_u64_desc(a->size, b->size);
    if (!c)
        c = (a->va > b->va) - (a->va < b->va);
    return c;
}

static void order(struct top_model *m)
{
    for (uint32_t i = 0; i < m->snap.n_regions; i++)
        m->order[i] = (int)i;
    sort_base = m->snap.regions;
    sort_key = m->sort;
    qsort(m->order, m->snap.n_regions, sizeof m->order[0], cmp_regions);
}

void top_model_update(struct top_model *m)
{
    rates(m);
    recent(m);
    order(m);
}

int top_collect(struct top_model *m, struct sh_tm_reader *r)
{
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    if (!s)
        return SH_ENOMEM;
    int rc = sh_tm_read(r, s);
    m->stale = sh_tm_reader_stale(r);
    m->pid = sh_tm_reader_pid(r);
    if (rc == SH_OK) {
        m->snap = *s;
        m->have = 1;
        m->now_us = sh_tm_now_us();
        top_model_update(m);
    }
    free(s);
    return rc;
}

/* ---- formatting ------------------------------------------------------------------------ */

void top_human_bytes(char *buf, size_t len, double bytes)
{
    static const char units[] = "BKMGTPE";
    int u = 0;
    if (bytes < 0)
        bytes = 0;
    while (bytes >= 1024.0 && u < 6) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%.0fB", bytes);
    else if (bytes < 10.0)
        snprintf(buf, len, "%.1f%c", bytes, units[u]);
    else
        snprintf(buf, len, "%.0f%c", bytes, units[u]);
}

void top_human_age(char *buf, size_t len, int64_t us)
{
    if (us < 0)
        snprintf(buf, len, "never");
    else if (us < 1000000)
        snprintf(buf, len, "%lldms", (long long)(us / 1000));
    else if (us < 60000000)
        snprintf(buf, len, "%.1fs", (double)us / 1e6);
    else if (us < 3600LL * 1000000)
        snprintf(buf, len, "%lldm%02llds", (long long)(us / 60000000),
                 (long long)(us / 1000000 % 60));
    else
        snprintf(buf, len, "%lldh%02lldm", (long long)(us / 3600000000LL),
                 (long long)(us / 60000000 % 60));
}

void top_sanitize(char *dst, size_t len, const char *src)
{
    size_t i = 0;
    if (!len)
        return;
    for (; src && src[i] && i + 1 < len; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    dst[i] = '\0';
}
