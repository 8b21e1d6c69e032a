/* test_top.c — stagehand-top without a terminal: the layout across terminal
 * sizes (inside the screen, no overlap, a too-small mode), the full render
 * onto a character grid at many sizes (nothing off screen, nothing outside
 * its panel), sorting, rates, and the --json / --prometheus / --once outputs
 * (JSON checked with json-c).
 *
 * The tool's own files are compiled in here (they are not in the library);
 * ui.c and main.c, which need ncurses, are not.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tools/stagehand-top/collect.c"
#include "tools/stagehand-top/layout.c"
#include "tools/stagehand-top/render.c"
#include "tools/stagehand-top/text.c"

#include <json-c/json.h>
#include <regex.h>
#include <stdlib.h>

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

/* ---- layout -------------------------------------------------------------------------- */

static int overlap(const struct top_rect *a, const struct top_rect *b)
{
    return a->y < b->y + b->h && b->y < a->y + a->h && a->x < b->x + b->w && b->x < a->x + a->w;
}

static void check_layout(int rows, int cols, int ncls)
{
    struct top_layout l;
    top_layout(rows, cols, ncls, &l);
    struct top_rect r[16];
    int n = top_layout_rects(&l, r, 16);
    for (int i = 0; i < n; i++) {
        if (r[i].y < 0 || r[i].x < 0 || r[i].y + r[i].h > rows || r[i].x + r[i].w > cols)
            fail_msg("%dx%d: rect %d {%d,%d,%d,%d} off screen", cols, rows, i, r[i].y, r[i].x,
                     r[i].h, r[i].w);
        for (int j = i + 1; j < n; j++)
            if (overlap(&r[i], &r[j]))
                fail_msg("%dx%d (%d classes): rects %d and %d overlap", cols, rows, ncls, i, j);
    }
    if (l.too_small)
        return;
    /* Everything the issue asks for is on screen at every supported size. */
    assert_true(l.title.h == 1 && l.title.y == 0 && l.title.w == cols);
    assert_true(l.status.h == 1 && l.status.y == rows - 1);
    assert_true(l.vram.h == 1 && l.vram.w >= TOP_MIN_COLS / 2 - 1);
    assert_true(l.host.h >= 1);
    assert_true(l.info.h >= 2);
    assert_true(l.spark_h2d.h >= 1 && l.spark_d2h.h >= 1);
    assert_true(l.table.h >= 4 && l.table.w >= 40);
}

static void test_layout_all_sizes(void **state)
{
    (void)state;
    static const int classes[] = {0, 1, 5, 16};
    long checked = 0;
    for (int rows = 20; rows <= 200; rows++)
        for (int cols = 60; cols <= 300; cols++)
            for (int c = 0; c < 4; c++, checked++)
                check_layout(rows, cols, classes[c]);
    assert_true(checked > 150000);
}

static void test_layout_too_small(void **state)
{
    (void)state;
    static const int sizes[][2] = {{0, 0},   {1, 1},    {5, 200}, {11, 80},
                                   {40, 49}, {200, 10}, {-3, 50}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        struct top_layout l;
        top_layout(sizes[i][0], sizes[i][1], 5, &l);
        assert_true(l.too_small);
        check_layout(sizes[i][0], sizes[i][1], 5);
    }
    struct top_layout l;
    top_layout(TOP_MIN_ROWS, TOP_MIN_COLS, 5, &l);
    assert_false(l.too_small);
    check_layout(TOP_MIN_ROWS, TOP_MIN_COLS, 5);
    for (int rows = TOP_MIN_ROWS; rows < 20; rows++)
        for (int cols = TOP_MIN_COLS; cols < 60; cols++)
            check_layout(rows, cols, 16);
}

static void test_layout_wide_and_tall_extras(void **state)
{
    (void)state;
    struct top_layout l;
    top_layout(30, 80, 5, &l); /* narrow: stacked, no events */
    assert_int_equal(l.info.x, 0);
    assert_int_equal(l.events.h, 0);
    top_layout(30, 120, 5, &l); /* wide: info beside the meters */
    assert_true(l.info.x > l.vram.x + l.vram.w - 1);
    assert_int_equal(l.spark_h2d.y, l.spark_d2h.y);
    top_layout(60, 120, 5, &l); /* tall: events below the table */
    assert_true(l.events.h >= 4 && l.events.y > l.table.y);
    top_layout(50, 200, 5, &l); /* very wide: events beside the table */
    assert_int_equal(l.events.y, l.table.y);
    assert_int_equal(l.events.w, TOP_EVENTS_W);
    for (int rows = 20; rows <= 200; rows += 9)
        for (int cols = 50; cols <= 300; cols += 7) {
            struct top_rect h = top_help_rect(rows, cols);
            assert_true(h.y >= 0 && h.x >= 0 && h.y + h.h <= rows && h.x + h.w <= cols);
        }
}

/* ---- a model to draw ------------------------------------------------------------------- */

static void demo_model(struct top_model *m, int nregions)
{
    memset(m, 0, sizeof *m);
    struct sh_tm_snapshot *s = &m->snap;
    m->pid = 4242;
    m->have = 1;
    s->pid = 4242;
    snprintf(s->cmdline, sizeof s->cmdline, "python train.py --model ltx2 --batch 4");
    snprintf(s->device_name, sizeof s->device_name, "NVIDIA H100 80GB HBM3");
    s->now_us = 100000000;
    m->now_us = s->now_us + 300000;
    s->n_counters = SH_TM_NCOUNTERS;
    s->n_gauges = SH_TM_NGAUGES;
    int64_t *g = s->gauges;
    g[SH_TM_G_vram_budget] = (int64_t)(80 * GiB);
    g[SH_TM_G_vram_high] = (int64_t)(64 * GiB);
    g[SH_TM_G_vram_low] = (int64_t)(48 * GiB);
    g[SH_TM_G_vram_used] = (int64_t)(55 * GiB);
    g[SH_TM_G_step] = 1234;
    g[SH_TM_G_phase] = 2;
    g[SH_TM_G_tracking] = SH_TM_TRACK_CUPTI;
    s->counters[SH_TM_C_prefetch_hits] = 970;
    s->counters[SH_TM_C_prefetch_misses] = 30;
    s->n_classes = 5;
    for (int i = 0; i < 5; i++)
        s->classes[i] = (struct sh_tm_host){MiB << (2 * i), (uint64_t)(i * 3), 16};
    s->n_hist = 200;
    for (uint32_t i = 0; i < s->n_hist; i++)
        s->hist[i] = (struct sh_tm_sample){.t_us = s->now_us - (200 - i) * 250000,
                                           .h2d_bytes = (uint64_t)i * i * 10 * MiB,
                                           .d2h_bytes = (uint64_t)i * 100 * MiB,
                                           .step = 1000 + i / 4};
    s->n_regions = (uint32_t)nregions;
    for (int i = 0; i < nregions; i++)
        s->regions[i] =
            (struct sh_tm_region){.va = 0x7f0000000000ull + (uint64_t)i * GiB,
                                  .size = (uint64_t)((i * 37) % 101 + 1) * MiB,
                                  .id = (uint64_t)i,
                                  .last_use_us = i % 5 ? s->now_us - 1000 * (uint64_t)i : 0,
                                  .evictions = (uint32_t)((i * 13) % 29),
                                  .state = i % 4,
                                  .cls = i % 3};
    s->regions_total = 999;
    s->n_events = 20;
    s->events_total = 5000;
    for (int i = 0; i < 20; i++)
        s->events[i] = (struct sh_tm_ev){.t_us = s->now_us - 1000 * (uint64_t)(20 - i),
                                         .kind = (uint32_t)(1 + i % 12),
                                         .id = (uint64_t)i,
                                         .bytes = MiB};
    top_model_update(m);
}

/* ---- rendering ---------------------------------------------------------------------------- */

static int in_any(const struct top_rect *r, int n, int y, int x)
{
    for (int i = 0; i < n; i++)
        if (y >= r[i].y && y < r[i].y + r[i].h && x >= r[i].x && x < r[i].x + r[i].w)
            return 1;
    return 0;
}

static int grid_has(struct top_grid *g, const char *text)
{
    for (int y = 0; y < top_grid_canvas(g)->rows; y++)
        if (strstr(top_grid_row(g, y), text))
            return 1;
    return 0;
}

static void render_at(const struct top_model *m, int rows, int cols, int utf8)
{
    struct top_grid *g = top_grid_new(rows, cols, utf8);
    assert_non_null(g);
    struct top_view v = {.delay_s = 1.0};
    top_render(top_grid_canvas(g), m, &v);
    assert_int_equal(top_grid_canvas(g)->offscreen, 0);
    struct top_layout l;
    top_layout(rows, cols, top_meter_rows(&m->snap), &l);
    struct top_rect r[16];
    int n = top_layout_rects(&l, r, 16);
    for (int y = 0; y < rows; y++) /* every drawn cell belongs to some panel */
        for (int x = 0; x < cols; x++)
            if (top_grid_attr(g, y, x) >= 0 && !in_any(r, n, y, x))
                fail_msg("%dx%d: cell (%d,%d) drawn outside every panel", cols, rows, y, x);
    if (!l.too_small) {
        assert_true(grid_has(g, "VRAM"));
        assert_true(grid_has(g, "ADDRESS"));
        assert_true(grid_has(g, "H2D"));
        assert_true(grid_has(g, "D2H"));
        char pid[32];
        snprintf(pid, sizeof pid, "pid %d", m->pid);
        assert_true(grid_has(g, pid));
    } else {
        assert_true(rows < 1 || cols < 18 || grid_has(g, "too small"));
    }
    top_grid_free(g);
}

static void test_render_many_sizes(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 100);
    for (int rows = 20; rows <= 200; rows += 5)
        for (int cols = 60; cols <= 300; cols += 6)
            render_at(m, rows, cols, (rows + cols) % 2);
    for (int rows = 1; rows < TOP_MIN_ROWS; rows += 3)
        render_at(m, rows, 80, 1);
    render_at(m, 30, 30, 0);
    render_at(m, 60, 1000, 1); /* wider than any fixed buffer */
    demo_model(m, 0);          /* nothing reported yet */
    render_at(m, 24, 80, 1);
    memset(m, 0, sizeof *m); /* an all-zero snapshot */
    render_at(m, 24, 80, 0);
    free(m);
}

static void test_render_bar_marks_and_text(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 10);
    struct top_grid *g = top_grid_new(30, 80, 0);
    struct top_view v = {.delay_s = 1.0};
    top_render(top_grid_canvas(g), m, &v);
    const char *bar = top_grid_row(g, 1);
    const char *l = strchr(bar, 'L'), *h = strchr(bar, 'H'), *open = strchr(bar, '[');
    assert_non_null(open);
    assert_non_null(l);
    assert_non_null(h);
    assert_true(open < l && l < h); /* low before high, inside the bar */
    assert_non_null(strstr(bar, "55G/80G"));
    assert_true(grid_has(g, "Sort:"));
    assert_true(grid_has(g, "size"));
    assert_true(grid_has(g, "97.0%"));    /* prefetch hit rate over all */
    assert_false(grid_has(g, "On host")); /* no launch ran from the host */
    top_grid_free(g);
    /* Launches that ran with regions left on the host are shown. */
    m->snap.counters[SH_TM_C_host_launches] = 182;
    g = top_grid_new(30, 100, 0);
    top_render(top_grid_canvas(g), m, &v);
    assert_true(grid_has(g, "On host 182"));
    top_grid_free(g);
    m->snap.counters[SH_TM_C_host_launches] = 0;
    /* The help box opens over the screen, inside it. */
    g = top_grid_new(24, 60, 1);
    v.help = 1;
    top_render(top_grid_canvas(g), m, &v);
    assert_int_equal(top_grid_canvas(g)->offscreen, 0);
    assert_true(grid_has(g, "sort regions"));
    top_grid_free(g);
    free(m);
}

/* Watermarks and use far above the budget (a hostile or corrupt segment): the
 * bar is full and the marks go to its last cell, under the text, instead of
 * overflowing an int (make ubsan catches that conversion; so does the fuzz
 * target "top"). */
static void test_render_clamps_watermarks(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 10);
    int64_t *g = m->snap.gauges;
    g[SH_TM_G_vram_budget] = 1;
    g[SH_TM_G_vram_high] = INT64_MAX;
    g[SH_TM_G_vram_low] = INT64_MAX / 2;
    g[SH_TM_G_vram_used] = INT64_MAX;
    top_model_update(m);
    struct top_grid *grid = top_grid_new(30, 80, 0);
    struct top_view v = {.delay_s = 1.0};
    top_render(top_grid_canvas(grid), m, &v);
    const char *bar = top_grid_row(grid, 1), *open = strchr(bar, '['), *close = strrchr(bar, ']');
    assert_non_null(open);
    assert_non_null(close);
    for (const char *c = open + 1; c < close; c++) /* full, the marks past its end */
        if (*c == ' ' || *c == 'H' || *c == 'L')
            fail_msg("bar \"%s\": '%c' at %d", bar, *c, (int)(c - open));
    top_grid_free(grid);
    render_at(m, 24, 80, 1);
    free(m);
}

static void test_untrusted_text_is_sanitised(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 3);
    snprintf(m->snap.cmdline, sizeof m->snap.cmdline, "evil\x1b[2J\x07\xff\xfe cmd");
    struct top_grid *g = top_grid_new(24, 100, 1);
    struct top_view v = {0};
    top_render(top_grid_canvas(g), m, &v);
    const char *title = top_grid_row(g, 0);
    assert_null(strchr(title, '\x1b'));
    assert_non_null(strstr(title, "evil?[2J??? cmd"));
    top_grid_free(g);
    free(m);
}

/* ---- the model ------------------------------------------------------------------------------ */

static void test_sort_orders(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 60);
    const struct sh_tm_region *r = m->snap.regions;
    for (int i = 1; i < 60; i++)
        assert_true(r[m->order[i - 1]].size >= r[m->order[i]].size);
    m->sort = TOP_SORT_STATE;
    top_model_update(m);
    assert_int_equal(r[m->order[0]].state, 2); /* HOST first */
    for (int i = 1; i < 60; i++)
        assert_true(state_rank(r[m->order[i - 1]].state) <= state_rank(r[m->order[i]].state));
    m->sort = TOP_SORT_EVICTIONS;
    top_model_update(m);
    for (int i = 1; i < 60; i++)
        assert_true(r[m->order[i - 1]].evictions >= r[m->order[i]].evictions);
    assert_string_equal(top_sort_name(TOP_SORT_EVICTIONS), "evictions");
    free(m);
}

static void test_rates_from_history(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 1);
    /* d2h grows 100 MiB per 250 ms sample: 400 MiB/s everywhere. */
    assert_int_equal(m->n_rates, 199);
    for (int i = 0; i < m->n_rates; i++)
        assert_true(fabs(m->d2h_rate[i] - 400.0 * MiB) < 1.0);
    assert_true(fabs(m->d2h_now - 400.0 * MiB) < 1.0);
    assert_true(m->h2d_rate[m->n_rates - 1] > m->h2d_rate[0]); /* h2d accelerates */
    assert_true(fabs(m->hit_all - 0.97) < 1e-9);
    assert_true(fabs(m->steps_per_s - 1.0) < 0.3); /* a step every four samples */
    /* A publish on demand (tiny span) is merged, not a spike. */
    m->snap.hist[100].t_us = m->snap.hist[99].t_us + 10;
    top_model_update(m);
    assert_int_equal(m->n_rates, 198);
    m->snap.n_hist = 1;
    top_model_update(m);
    assert_int_equal(m->n_rates, 0);
    assert_true(m->hit_recent < 0);
    free(m);
}

static void test_human_formats(void **state)
{
    (void)state;
    char b[16];
    top_human_bytes(b, sizeof b, 800);
    assert_string_equal(b, "800B");
    top_human_bytes(b, sizeof b, 1.5 * GiB);
    assert_string_equal(b, "1.5G");
    top_human_bytes(b, sizeof b, 512 * MiB);
    assert_string_equal(b, "512M");
    top_human_bytes(b, sizeof b, -5);
    assert_string_equal(b, "0B");
    top_human_age(b, sizeof b, -1);
    assert_string_equal(b, "never");
    top_human_age(b, sizeof b, 45000);
    assert_string_equal(b, "45ms");
    top_human_age(b, sizeof b, 1200000);
    assert_string_equal(b, "1.2s");
    top_human_age(b, sizeof b, 184000000);
    assert_string_equal(b, "3m04s");
    for (int lv = 0; lv < 8; lv++)
        assert_string_not_equal(top_spark_glyph(1, lv), top_spark_glyph(1, lv + 1));
    assert_string_equal(top_spark_glyph(0, 8), "#");
    assert_string_equal(top_spark_glyph(1, 99), top_spark_glyph(1, 8));
}

/* ---- outputs --------------------------------------------------------------------------------- */

static char *capture(int (*print)(FILE *, const struct top_model *), const struct top_model *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(print(f, m), 0);
    fclose(f);
    return buf;
}

static json_object *get(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v))
        fail_msg("--json output lacks \"%s\"", key);
    return v;
}

static void test_json_output(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 40);
    /* Hostile text: quotes, backslashes, control bytes, broken UTF-8. */
    snprintf(m->snap.cmdline, sizeof m->snap.cmdline, "a \"q\" \\ \x01\n\xc3\x28 \xe2\x82\xac");
    char *out = capture(top_print_json, m);
    assert_non_null(strchr(out, '\n'));
    json_tokener *tok = json_tokener_new();
    json_object *o = json_tokener_parse_ex(tok, out, (int)strlen(out));
    assert_int_equal(json_tokener_get_error(tok), json_tokener_success);
    json_tokener_free(tok);
    assert_non_null(o);
    assert_int_equal(json_object_get_int(get(o, "pid")), 4242);
    assert_int_equal(json_object_get_int(get(o, "device")), 0);
    json_object *vram = get(o, "vram");
    assert_int_equal(json_object_get_int64(get(vram, "used")), (int64_t)(55 * GiB));
    assert_int_equal(json_object_get_int64(get(vram, "budget")), (int64_t)(80 * GiB));
    assert_int_equal(json_object_get_int64(get(vram, "high")), (int64_t)(64 * GiB));
    assert_int_equal(json_object_get_int64(get(vram, "low")), (int64_t)(48 * GiB));
    assert_int_equal(json_object_array_length(get(o, "host_pool")), 5);
    json_object *c = get(o, "counters");
    for (int i = 0; i < SH_TM_NCOUNTERS; i++)
        get(c, sh_tm_counter_name(i));
    assert_int_equal(json_object_get_int(get(c, "prefetch_hits")), 970);
    json_object *regs = get(o, "regions");
    assert_int_equal(json_object_array_length(regs), 40);
    json_object *r0 = json_object_array_get_idx(regs, 0);
    get(r0, "address");
    get(r0, "size");
    get(r0, "class");
    get(r0, "state");
    get(r0, "evictions");
    get(r0, "last_use_s_ago");
    assert_false(json_object_get_boolean(get(o, "stale")));
    const char *cmd = json_object_get_string(get(o, "cmdline"));
    assert_non_null(strstr(cmd, "\"q\" \\"));
    assert_non_null(strstr(cmd, "\xe2\x82\xac")); /* valid UTF-8 kept */
    json_object_put(o);
    free(out);
    free(m);
}

static void test_prometheus_output(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 5);
    m->snap.counters[SH_TM_C_stall_time_us] = 2500000;
    char *out = capture(top_print_prometheus, m);
    regex_t sample, comment;
    assert_int_equal(regcomp(&sample,
                             "^stagehand_[a-z0-9_]+\\{pid=\"4242\"(,[a-z_]+=\"[a-z0-9_]+\")*\\} "
                             "-?[0-9]+(\\.[0-9]+)?(e[-+][0-9]+)?$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    assert_int_equal(
        regcomp(&comment, "^# (HELP|TYPE) stagehand_[a-z0-9_]+ ", REG_EXTENDED | REG_NOSUB), 0);
    int samples = 0;
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (regexec(l[0] == '#' ? &comment : &sample, l, 0, NULL, 0) != 0)
            fail_msg("bad exposition line: %s", l);
        samples += l[0] != '#';
    }
    assert_int_equal(samples, 1 + SH_TM_NCOUNTERS + SH_TM_NGAUGES + 2 * 5);
    regfree(&sample);
    regfree(&comment);
    free(out);
    out = capture(top_print_prometheus, m);
    assert_non_null(strstr(out, "stagehand_stall_time_seconds_total{pid=\"4242\"} 2.5\n"));
    assert_non_null(strstr(out, "stagehand_prefetch_hits_total{pid=\"4242\"} 970\n"));
    assert_non_null(strstr(out, "stagehand_vram_used_bytes{pid=\"4242\"} 59055800320\n"));
    assert_non_null(strstr(out, "stagehand_up{pid=\"4242\"} 1\n"));
    free(out);
    free(m);
}

static int once_100(FILE *f, const struct top_model *m)
{
    return top_print_once(f, m, 100, 0);
}

static void test_once_output(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 12);
    char *out = capture(once_100, m);
    assert_non_null(strstr(out, "VRAM"));
    assert_non_null(strstr(out, "ADDRESS"));
    assert_non_null(strstr(out, "snapshot of pid 4242"));
    assert_null(strstr(out, "Quit")); /* no key hints in a snapshot */
    int lines = 0;
    for (const char *p = out; *p; p++) {
        lines += *p == '\n';
        assert_true((unsigned char)*p < 0x80); /* ASCII when asked */
    }
    struct top_layout l;
    top_layout(lines, 100, 5, &l);
    assert_true(l.table.h - 1 >= 12); /* every region fits */
    free(out);
    free(m);
}

/* A process that manages two devices: a bar for each under the VRAM bar
 * (its pool against its own budget, what is on the host), and a devices
 * list in --json; one device shows neither. */
static void test_several_devices(void **state)
{
    (void)state;
    struct top_model *m = malloc(sizeof *m);
    demo_model(m, 12);
    char *out = capture(once_100, m);
    assert_null(strstr(out, "GPU1"));
    assert_null(strstr(out, "GPU ADDRESS")); /* one device: no column for it */
    free(out);
    out = capture(top_print_json, m);
    assert_non_null(strstr(out, "\"devices\":[]"));
    json_object *one = json_tokener_parse(out), *regs = get(one, "regions"), *unused;
    for (size_t i = 0; i < json_object_array_length(regs); i++) /* nor a device per region */
        assert_false(
            json_object_object_get_ex(json_object_array_get_idx(regs, i), "device", &unused));
    json_object_put(one);
    free(out);
    assert_true(m->snap.n_regions >= 2);
    for (uint32_t i = 0; i < m->snap.n_regions; i++)
        m->snap.region_device[i] = (int32_t)(i % 2);
    m->snap.n_devices = 2;
    m->snap.devices[0] = (struct sh_tm_device){
        .device = 0, .regions = 30, .budget = 80 * GiB, .used = 55 * GiB, .host_bytes = 9 * GiB};
    m->snap.devices[1] = (struct sh_tm_device){.device = 1,
                                               .regions = 7,
                                               .budget = 24 * GiB,
                                               .used = 20 * GiB,
                                               .host_bytes = 3 * GiB,
                                               .evictions = 11,
                                               .restores = 5};
    out = capture(once_100, m);
    assert_non_null(strstr(out, "GPU0"));
    assert_non_null(strstr(out, "GPU1"));
    assert_non_null(strstr(out, "20G/24G host 3.0G"));
    assert_non_null(strstr(out, "GPU ADDRESS")); /* the regions table says whose */
    free(out);
    out = capture(top_print_json, m);
    json_object *o = json_tokener_parse(out);
    assert_non_null(o);
    json_object *devs = get(o, "devices");
    assert_int_equal(json_object_array_length(devs), 2);
    json_object *d1 = json_object_array_get_idx(devs, 1);
    assert_int_equal(json_object_get_int(get(d1, "device")), 1);
    assert_int_equal(json_object_get_int64(get(d1, "budget")), (int64_t)(24 * GiB));
    assert_int_equal(json_object_get_int(get(d1, "evictions")), 11);
    regs = get(o, "regions");
    assert_int_equal(json_object_array_length(regs), m->snap.n_regions);
    for (uint32_t i = 0; i < m->snap.n_regions; i++) /* each region's device, in the shown order */
        assert_int_equal(json_object_get_int(get(json_object_array_get_idx(regs, i), "device")),
                         m->snap.region_device[m->order[i]]);
    json_object_put(o);
    free(out);
    out = capture(top_print_prometheus, m);
    assert_non_null(strstr(out, "# TYPE stagehand_device_evictions_total counter\n"));
    assert_non_null(
        strstr(out, "stagehand_device_evictions_total{pid=\"4242\",device=\"1\"} 11\n"));
    assert_non_null(
        strstr(out, "stagehand_device_budget_bytes{pid=\"4242\",device=\"1\"} 25769803776\n"));
    assert_non_null(
        strstr(out, "stagehand_device_host_bytes{pid=\"4242\",device=\"0\"} 9663676416\n"));
    free(out);
    static const int sizes[][2] = {{12, 80}, {24, 80}, {30, 120}, {60, 200}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        render_at(m, sizes[i][0], sizes[i][1], 1);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_all_sizes),
        cmocka_unit_test(test_layout_too_small),
        cmocka_unit_test(test_layout_wide_and_tall_extras),
        cmocka_unit_test(test_render_many_sizes),
        cmocka_unit_test(test_render_bar_marks_and_text),
        cmocka_unit_test(test_untrusted_text_is_sanitised),
        cmocka_unit_test(test_render_clamps_watermarks),
        cmocka_unit_test(test_sort_orders),
        cmocka_unit_test(test_rates_from_history),
        cmocka_unit_test(test_human_formats),
        cmocka_unit_test(test_json_output),
        cmocka_unit_test(test_prometheus_output),
        cmocka_unit_test(test_once_output),
        cmocka_unit_test(test_several_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
