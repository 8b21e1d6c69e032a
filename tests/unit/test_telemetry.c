/* test_telemetry.c — telemetry counters, gauges, events, and the per-step
 * JSONL file, every line checked with a real JSON parser (json-c).
 *
 * Counters are process-wide, so each test works with differences. Tests that
 * start the publisher stop it before they end.
 *
 * With STAGEHAND_TM_DEMO=SECONDS in the environment this program runs no
 * tests: it publishes a synthetic training run through the real API for that
 * long (segment in $STAGEHAND_TM_DEMO_DIR or /dev/shm), for
 * tests/tools/top_tmux.sh and for screenshots of stagehand-top.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sh_err.h"
#include "stagehand.h"
#include "telemetry/tm_internal.h"

#include <dirent.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Fresh directories for this run's files; removed when the tests end. */
static char dirs[64][64];
static int ndirs;

static char *temp_dir(void)
{
    assert_true(ndirs < 64);
    char *dir = dirs[ndirs++];
    snprintf(dir, sizeof dirs[0], "/tmp/sh_tm_test_XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_dirs(void)
{
    for (int i = 0; i < ndirs; i++) {
        DIR *d = opendir(dirs[i]);
        for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
            char path[512];
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
                snprintf(path, sizeof path, "%s/%s", dirs[i], e->d_name) < (int)sizeof path)
                unlink(path);
        }
        if (d)
            closedir(d);
        rmdir(dirs[i]);
    }
}

/* The whole file, NUL-terminated; NULL if it cannot be read. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf)
        return NULL;
    buf[got] = '\0';
    if (len)
        *len = got;
    return buf;
}

/* Complete lines in the file at path now (0 when it cannot be read). */
static int count_lines(const char *path)
{
    size_t len = 0;
    char *text = slurp(path, &len);
    int n = 0;
    for (size_t i = 0; text && i < len; i++)
        n += text[i] == '\n';
    free(text);
    return n;
}

/* ---- names ----------------------------------------------------------------------- */

static void test_names_follow_seeds(void **state)
{
    (void)state;
    /* The seeds' per-step JSONL vocabulary (activation and weight Stagehand). */
    static const char *const seed[] = {
        "activations_saved", "activations_kept", "activations_spilled", "activations_restored",
        "spill_bytes",       "restore_bytes",    "stall_count",         "pool_hits",
        "pool_misses",       "h2d_bytes",        "d2h_bytes",           "evictions",
        "prefetch_hits",     "prefetch_misses"};
    for (size_t i = 0; i < sizeof seed / sizeof seed[0]; i++) {
        int found = 0;
        for (int c = 0; c < SH_TM_NCOUNTERS; c++)
            found += !strcmp(sh_tm_counter_name(c), seed[i]);
        assert_int_equal(found, 1);
    }
    for (int a = 0; a < SH_TM_NCOUNTERS; a++)
        for (int b = a + 1; b < SH_TM_NCOUNTERS; b++)
            assert_string_not_equal(sh_tm_counter_name(a), sh_tm_counter_name(b));
    assert_null(sh_tm_counter_name(SH_TM_NCOUNTERS));
    assert_null(sh_tm_gauge_name(-1));
    assert_string_equal(sh_tm_gauge_name(SH_TM_G_vram_peak), "vram_peak");
    assert_string_equal(sh_tm_event_name(SH_TM_EV_EVICT), "evict");
    assert_string_equal(sh_tm_event_name(999), "?");
    assert_string_equal(sh_tm_state_name(2), "HOST");
    assert_string_equal(sh_tm_class_name(2), "transient");
    assert_string_equal(sh_tm_tracking_name(SH_TM_TRACK_CUPTI), "cupti");
}

/* ---- counters ----------------------------------------------------------------------- */

#define ADDERS 8
#define ADDS   20000

static void *adder(void *arg)
{
    (void)arg;
    for (int i = 0; i < ADDS; i++) {
        sh_tm_inc(SH_TM_C_evictions);
        sh_tm_add(SH_TM_C_d2h_bytes, 3);
    }
    return NULL;
}

static void test_counters_sum_threads_after_exit(void **state)
{
    (void)state;
    uint64_t e0 = sh_tm_counter(SH_TM_C_evictions), b0 = sh_tm_counter(SH_TM_C_d2h_bytes);
    pthread_t t[ADDERS];
    for (int i = 0; i < ADDERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, adder, NULL), 0);
    for (int i = 0; i < ADDERS; i++)
        pthread_join(t[i], NULL);
    /* Every thread has exited: their figures must still be there, exactly. */
    assert_int_equal(sh_tm_counter(SH_TM_C_evictions) - e0, (uint64_t)ADDERS * ADDS);
    assert_int_equal(sh_tm_counter(SH_TM_C_d2h_bytes) - b0, (uint64_t)ADDERS * ADDS * 3);
}

static void *one_add(void *arg)
{
    (void)arg;
    sh_tm_inc(SH_TM_C_frees);
    return NULL;
}

static void test_counters_thread_churn(void **state)
{
    (void)state;
    uint64_t f0 = sh_tm_counter(SH_TM_C_frees);
    for (int i = 0; i < 500; i++) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, one_add, NULL), 0);
        pthread_join(t, NULL);
    }
    assert_int_equal(sh_tm_counter(SH_TM_C_frees) - f0, 500);
}

static atomic_int adders_done;

static void *adder_flag(void *arg)
{
    adder(arg);
    atomic_fetch_add(&adders_done, 1);
    return NULL;
}

static void test_counters_read_while_adding(void **state)
{
    (void)state;
    atomic_store(&adders_done, 0);
    uint64_t prev = sh_tm_counter(SH_TM_C_evictions), start = prev;
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, adder_flag, NULL), 0);
    while (atomic_load(&adders_done) < 4) {
        uint64_t now = sh_tm_counter(SH_TM_C_evictions);
        assert_true(now >= prev); /* sums only grow, even across thread exits */
        prev = now;
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(sh_tm_counter(SH_TM_C_evictions) - start, 4u * ADDS);
}

/* ---- gauges, phases, hints ------------------------------------------------------------ */

static void test_vram_peaks(void **state)
{
    (void)state;
    sh_tm_step(1000); /* a fresh step peak */
    sh_tm_vram(5 * GiB);
    sh_tm_vram(9 * GiB);
    sh_tm_vram(2 * GiB);
    assert_int_equal(sh_tm_get(SH_TM_G_vram_used), 2 * GiB);
    assert_int_equal(sh_tm_get(SH_TM_G_vram_step_peak), 9 * GiB);
    assert_true(sh_tm_get(SH_TM_G_vram_peak) >= (int64_t)(9 * GiB));
    sh_tm_step(1001);
    assert_int_equal(sh_tm_get(SH_TM_G_vram_step_peak), 2 * GiB); /* restarts at vram_used */
    assert_int_equal(sh_tm_get(SH_TM_G_step), 1001);
    assert_int_equal(sh_tm_get(SH_TM_G_phase), STAGEHAND_PHASE_STEP_BEGIN);
    sh_tm_gauge_add(SH_TM_G_regions_host, 3);
    sh_tm_gauge_add(SH_TM_G_regions_host, -1);
    assert_int_equal(sh_tm_get(SH_TM_G_regions_host), 2);
    sh_tm_set(SH_TM_G_regions_host, 0);
}

static void test_phase_durations(void **state)
{
    (void)state;
    sh_tm_phase(STAGEHAND_PHASE_FORWARD);
    uint64_t f0 = sh_tm_counter(SH_TM_C_phase_forward_us);
    uint64_t b0 = sh_tm_counter(SH_TM_C_phase_backward_us);
    sh_tm_phase(STAGEHAND_PHASE_FORWARD); /* re-entering restarts nothing */
    sleep_ms(30);
    sh_tm_phase(STAGEHAND_PHASE_BACKWARD);
    sleep_ms(10);
    sh_tm_phase(STAGEHAND_PHASE_OPTIMIZER);
    uint64_t f = sh_tm_counter(SH_TM_C_phase_forward_us) - f0;
    uint64_t b = sh_tm_counter(SH_TM_C_phase_backward_us) - b0;
    assert_true(f >= 30000 && f < 2000000);
    assert_true(b >= 10000 && b < f);
    assert_int_equal(sh_tm_get(SH_TM_G_phase), STAGEHAND_PHASE_OPTIMIZER);
    sh_tm_phase(99); /* unknown: ignored */
    assert_int_equal(sh_tm_get(SH_TM_G_phase), STAGEHAND_PHASE_OPTIMIZER);
}

static void test_hints_count_tightening_only(void **state)
{
    (void)state;
    sh_tm_hints(4, 2, 2, 0, 0);
    uint64_t h0 = sh_tm_counter(SH_TM_C_hint_changes);
    sh_tm_hints(4, 2, 2, 0, 0); /* same */
    sh_tm_hints(6, 3, 2, 0, 0); /* looser */
    assert_int_equal(sh_tm_counter(SH_TM_C_hint_changes), h0);
    sh_tm_hints(1, 3, 2, 0, 1); /* rule 1: window down */
    sh_tm_hints(1, 3, 2, 1, 3); /* speculative suppressed */
    assert_int_equal(sh_tm_counter(SH_TM_C_hint_changes), h0 + 2);
    assert_int_equal(sh_tm_get(SH_TM_G_prefetch_window), 1);
    assert_int_equal(sh_tm_get(SH_TM_G_suppress_speculative), 1);
    assert_int_equal(sh_tm_get(SH_TM_G_rules_fired), 3);
}

/* ---- events ---------------------------------------------------------------------------- */

static void test_events_newest_in_order(void **state)
{
    (void)state;
    struct sh_tm_ev ev[SH_TM_MAX_EVENTS];
    uint64_t total0 = 0, total = 0;
    sh_tm_events_copy(ev, 1, &total0);
    for (uint64_t i = 0; i < 5000; i++)
        sh_tm_event(SH_TM_EV_EVICT, 100000 + i, i * 4096);
    int n = sh_tm_events_copy(ev, SH_TM_MAX_EVENTS, &total);
    assert_int_equal(total - total0, 5000);
    assert_int_equal(n, SH_TM_MAX_EVENTS);
    for (int i = 0; i < n; i++) {
        uint64_t want = 100000 + 5000 - SH_TM_MAX_EVENTS + (uint64_t)i;
        assert_int_equal(ev[i].id, want);
        assert_int_equal(ev[i].bytes, (want - 100000) * 4096);
        assert_int_equal(ev[i].kind, SH_TM_EV_EVICT);
        assert_true(i == 0 || ev[i].t_us >= ev[i - 1].t_us);
    }
}

static atomic_int ev_stop;

static void *event_writer(void *arg)
{
    uint64_t tag = (uint64_t)(uintptr_t)arg << 32;
    for (uint64_t i = 0; !atomic_load(&ev_stop); i++)
        sh_tm_event(SH_TM_EV_RESTORE, tag | (i & 0xffffffff), (tag | (i & 0xffffffff)) * 7);
    return NULL;
}

static void test_events_concurrent_never_torn(void **state)
{
    (void)state;
    pthread_t t[4];
    atomic_store(&ev_stop, 0);
    for (uintptr_t i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, event_writer, (void *)(i + 1)), 0);
    struct sh_tm_ev ev[SH_TM_MAX_EVENTS];
    long seen = 0;
    for (int round = 0; round < 2000; round++) {
        uint64_t total;
        int n = sh_tm_events_copy(ev, SH_TM_MAX_EVENTS, &total);
        for (int i = 0; i < n; i++) {
            assert_true(ev[i].kind == SH_TM_EV_RESTORE || ev[i].kind == SH_TM_EV_EVICT);
            if (ev[i].kind == SH_TM_EV_RESTORE) /* older entries are the last test's evicts */
                assert_int_equal(ev[i].bytes, ev[i].id * 7); /* one event's fields, never mixed */
        }
        seen += n;
    }
    atomic_store(&ev_stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_true(seen > 0);
}

/* ---- JSONL: the formatter ---------------------------------------------------------------- */

static json_object *field(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v))
        fail_msg("JSONL line lacks \"%s\"", key);
    return v;
}

static int64_t ifield(json_object *o, const char *key)
{
    return json_object_get_int64(field(o, key));
}

static void test_jsonl_format_fields(void **state)
{
    (void)state;
    struct sh_tm_steprec a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.step = 11;
    b.step = 12;
    a.t_us = 1000000;
    b.t_us = 11000000; /* one 10 s step */
    b.unix_us = 1700000000123456ull;
    a.c[SH_TM_C_activations_saved] = 100;
    b.c[SH_TM_C_activations_saved] = 736;
    b.c[SH_TM_C_activations_kept] = 214;
    b.c[SH_TM_C_activations_spilled] = 422;
    b.c[SH_TM_C_spill_bytes] = 394526720;
    b.c[SH_TM_C_stall_time_us] = 1500;
    b.c[SH_TM_C_pool_hits] = 420;
    b.c[SH_TM_C_pool_misses] = 2;
    b.c[SH_TM_C_prefetch_hits] = 3;
    b.c[SH_TM_C_prefetch_misses] = 1;
    b.c[SH_TM_C_phase_forward_us] = 3210000;
    b.step_peak = (int64_t)(16894.3 * MiB);
    b.g[SH_TM_G_vram_budget] = (int64_t)(24 * GiB);
    b.g[SH_TM_G_vram_used] = (int64_t)(20 * GiB);
    b.g[SH_TM_G_tracking] = SH_TM_TRACK_HOOKS;
    b.g[SH_TM_G_suppress_speculative] = 1;
    b.n_classes = 2;
    b.classes[0] = (struct sh_tm_host){MiB, 12, 512};
    b.classes[1] = (struct sh_tm_host){256 * MiB, 1, 2};
    char line[SH_TM_JSONL_LINE];
    size_t n = sh_tm_jsonl_format(line, sizeof line, 4242, &a, &b);
    assert_true(n > 0 && line[n - 1] == '\n' && strlen(line) == n);
    assert_null(memchr(line, '\n', n - 1)); /* one line */
    json_object *o = json_tokener_parse(line);
    assert_non_null(o);
    assert_true(json_object_is_type(o, json_type_object));
    assert_int_equal(ifield(o, "step"), 11); /* the step that ended */
    assert_int_equal(ifield(o, "steps"), 1);
    assert_int_equal(ifield(o, "pid"), 4242);
    assert_int_equal(ifield(o, "activations_saved"), 636);
    assert_int_equal(ifield(o, "activations_kept"), 214);
    assert_int_equal(ifield(o, "activations_spilled"), 422);
    assert_int_equal(ifield(o, "activations_restored"), 0);
    assert_int_equal(ifield(o, "spill_bytes"), 394526720);
    assert_int_equal(ifield(o, "pool_hits"), 420);
    assert_int_equal(ifield(o, "pool_misses"), 2);
    assert_true(fabs(json_object_get_double(field(o, "stall_time_ms")) - 1.5) < 1e-9);
    assert_true(fabs(json_object_get_double(field(o, "vram_peak_mb")) - 16894.3) < 0.06);
    assert_true(fabs(json_object_get_double(field(o, "step_time_s")) - 10.0) < 1e-6);
    assert_true(fabs(json_object_get_double(field(o, "prefetch_hit_rate")) - 0.75) < 1e-6);
    assert_true(fabs(json_object_get_double(field(o, "vram_headroom_mb")) - 4096.0) < 1e-6);
    assert_true(fabs(json_object_get_double(field(o, "time")) - 1700000000.123) < 1e-3);
    json_object *ph = field(o, "phase_durations");
    assert_true(fabs(json_object_get_double(field(ph, "forward")) - 3.21) < 1e-9);
    json_object *hp = field(o, "host_pool");
    assert_int_equal(json_object_array_length(hp), 2);
    assert_int_equal(ifield(json_object_array_get_idx(hp, 0), "total"), 512);
    assert_true(json_object_get_boolean(field(field(o, "hints"), "suppress_speculative")));
    assert_string_equal(json_object_get_string(field(o, "tracking")), "hooks");
    field(o, "regions");
    field(o, "prefetch_window");
    field(o, "h2d_inflight");
    json_object_put(o);
    /* A buffer too small yields nothing rather than half a line. */
    assert_int_equal(sh_tm_jsonl_format(line, 100, 1, &a, &b), 0);
}

/* With several devices managed, each one's moves in the steps a line
 * covers; a device managed since the last line counts from zero; with one
 * device there is no list. */
static void test_jsonl_devices(void **state)
{
    (void)state;
    struct sh_tm_steprec a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.step = 3;
    b.step = 4;
    a.n_devices = 1;
    a.devices[0] = (struct sh_tm_device){.device = 0, .evictions = 10, .d2h_bytes = 100 * MiB};
    b.n_devices = 2;
    b.devices[0] = (struct sh_tm_device){.device = 0,
                                         .regions = 7,
                                         .budget = 8 * GiB,
                                         .used = 6 * GiB,
                                         .evictions = 14,
                                         .d2h_bytes = 164 * MiB};
    b.devices[1] = (struct sh_tm_device){
        .device = 1, .budget = 4 * GiB, .host_bytes = 512 * MiB, .restores = 5, .prefetches = 2};
    char line[SH_TM_JSONL_LINE];
    assert_true(sh_tm_jsonl_format(line, sizeof line, 1, &a, &b) > 0);
    json_object *o = json_tokener_parse(line);
    assert_non_null(o);
    json_object *d = field(o, "devices");
    assert_int_equal(json_object_array_length(d), 2);
    json_object *d0 = json_object_array_get_idx(d, 0), *d1 = json_object_array_get_idx(d, 1);
    assert_int_equal(ifield(d0, "device"), 0);
    assert_int_equal(ifield(d0, "evictions"), 4);
    assert_int_equal(ifield(d0, "d2h_bytes"), 64 * MiB);
    assert_int_equal(ifield(d0, "regions"), 7);
    assert_true(fabs(json_object_get_double(field(d0, "vram_used_mb")) - 6144.0) < 1e-6);
    assert_true(fabs(json_object_get_double(field(d0, "vram_budget_mb")) - 8192.0) < 1e-6);
    assert_int_equal(ifield(d1, "device"), 1);
    assert_int_equal(ifield(d1, "restores"), 5);
    assert_int_equal(ifield(d1, "prefetch_issued"), 2);
    assert_true(fabs(json_object_get_double(field(d1, "host_mb")) - 512.0) < 1e-6);
    json_object_put(o);
    /* Sixteen devices still fit one line. */
    b.n_devices = SH_TM_MAX_DEVICES;
    for (int i = 0; i < SH_TM_MAX_DEVICES; i++)
        b.devices[i] = (struct sh_tm_device){.device = i,
                                             .budget = UINT64_MAX / 4,
                                             .used = UINT64_MAX / 4,
                                             .host_bytes = UINT64_MAX / 4,
                                             .evictions = UINT64_MAX,
                                             .restores = UINT64_MAX,
                                             .d2h_bytes = UINT64_MAX,
                                             .h2d_bytes = UINT64_MAX,
                                             .prefetches = UINT64_MAX,
                                             .early_evictions = UINT64_MAX};
    memset(&a, 0, sizeof a);
    for (int i = 0; i < SH_TM_NCOUNTERS; i++)
        b.c[i] = UINT64_MAX;
    assert_true(sh_tm_jsonl_format(line, sizeof line, 1, &a, &b) > 0);
    /* One device: no list. */
    b.n_devices = 1;
    assert_true(sh_tm_jsonl_format(line, sizeof line, 1, &a, &b) > 0);
    assert_null(strstr(line, "\"devices\""));
}

static void test_jsonl_no_hits_is_null(void **state)
{
    (void)state;
    struct sh_tm_steprec a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    b.step = 1;
    char line[SH_TM_JSONL_LINE];
    assert_true(sh_tm_jsonl_format(line, sizeof line, 1, &a, &b) > 0);
    json_object *o = json_tokener_parse(line);
    assert_non_null(o);
    assert_true(json_object_is_type(field(o, "prefetch_hit_rate"), json_type_null));
    json_object_put(o);
}

/* ---- JSONL: the publisher writes it -----------------------------------------------------------
 */

static struct sh_tm_params jsonl_params(const char *path, int interval)
{
    struct sh_tm_params p = {.shm_enabled = 0,
                             .jsonl_path = path,
                             .interval_steps = interval,
                             .period_ms = 20,
                             .flags = SH_TM_NO_SIGNALS | SH_TM_NO_ATEXIT};
    return p;
}

/* Every line of path parsed; returns the count, fills objs (caller puts them). */
static int parse_lines(const char *path, json_object **objs, int max)
{
    size_t len = 0;
    char *text = slurp(path, &len);
    assert_non_null(text);
    assert_true(len == 0 || text[len - 1] == '\n'); /* never half a line */
    int n = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_object *o = json_tokener_parse(l);
        if (!o || !json_object_is_type(o, json_type_object))
            fail_msg("not a JSON object: %s", l);
        if (n < max)
            objs[n] = o;
        else
            json_object_put(o);
        n++;
    }
    free(text);
    return n;
}

static void test_jsonl_one_line_per_step(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/steps.jsonl", temp_dir());
    struct sh_tm_params p = jsonl_params(path, 1);
    sh_tm_set(SH_TM_G_step, 0);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    assert_int_equal(sh_tm_start(&p), SH_EBUSY);
    sh_tm_vram(0);
    sh_tm_step(0); /* the first boundary: no step has ended, no line */
    for (int s = 1; s <= 20; s++) {
        sh_tm_add(SH_TM_C_spill_bytes, 1000u * (uint64_t)s);
        for (int k = 0; k < s; k++)
            sh_tm_inc(SH_TM_C_activations_spilled);
        sh_tm_vram((uint64_t)s * MiB);
        sh_tm_step(s);
    }
    sh_tm_stop();
    sh_tm_stop(); /* idempotent */
    json_object *o[32];
    int n = parse_lines(path, o, 32);
    assert_int_equal(n, 20);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ifield(o[i], "step"), i);
        assert_int_equal(ifield(o[i], "steps"), 1);
        assert_int_equal(ifield(o[i], "spill_bytes"), 1000 * (i + 1));
        assert_int_equal(ifield(o[i], "activations_spilled"), i + 1);
        assert_int_equal(ifield(o[i], "pid"), getpid());
        double peak = json_object_get_double(field(o[i], "vram_peak_mb"));
        assert_true(fabs(peak - (i + 1)) < 0.01);
        json_object_put(o[i]);
    }
}

static void test_jsonl_interval(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/every3.jsonl", temp_dir());
    struct sh_tm_params p = jsonl_params(path, 3);
    sh_tm_set(SH_TM_G_step, 0);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    for (int s = 1; s <= 10; s++) {
        sh_tm_inc(SH_TM_C_stall_count);
        sh_tm_step(s);
    }
    sh_tm_stop();
    json_object *o[8];
    int n = parse_lines(path, o, 8);
    assert_int_equal(n, 3); /* boundaries 3, 6, 9 */
    for (int i = 0; i < n; i++) {
        assert_int_equal(ifield(o[i], "step"), 3 * (i + 1) - 1);
        assert_int_equal(ifield(o[i], "steps"), 3);
        assert_int_equal(ifield(o[i], "stall_count"), 3);
        json_object_put(o[i]);
    }
}

static void test_jsonl_path_expands_pid(void **state)
{
    (void)state;
    char pattern[128], want[128];
    const char *dir = temp_dir();
    snprintf(pattern, sizeof pattern, "%s/rank-%%p.jsonl", dir);
    snprintf(want, sizeof want, "%s/rank-%d.jsonl", dir, (int)getpid());
    struct sh_tm_params p = jsonl_params(pattern, 1);
    sh_tm_set(SH_TM_G_step, 0);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    sh_tm_step(1);
    sh_tm_stop();
    json_object *o[2];
    assert_int_equal(parse_lines(want, o, 2), 1);
    json_object_put(o[0]);
}

/* A planted link or FIFO at the JSONL path is refused (nothing is appended to
 * what the link names, and the start does not block); a new file is private. */
static void test_jsonl_refuses_odd_files(void **state)
{
    (void)state;
    char path[160], target[160];
    const char *dir = temp_dir();
    snprintf(path, sizeof path, "%s/odd.jsonl", dir);
    snprintf(target, sizeof target, "%s/victim", dir);
    FILE *f = fopen(target, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(symlink(target, path), 0);
    struct sh_tm_params p = jsonl_params(path, 1);
    assert_int_equal(sh_tm_start(&p), SH_ENOTFOUND);
    struct stat st;
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_size, 0);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(10);
    assert_int_equal(sh_tm_start(&p), SH_ENOTFOUND);
    alarm(0);
    unlink(path);
    mode_t old = umask(0);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    umask(old);
    sh_tm_stop();
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    unlink(path);
    unlink(target);
}

static void test_jsonl_unwritable_fails_cleanly(void **state)
{
    (void)state;
    struct sh_tm_params p = jsonl_params("/nonexistent-dir/x.jsonl", 1);
    assert_int_equal(sh_tm_start(&p), SH_ENOTFOUND); /* nothing else was asked for */
    sh_tm_step(5);                                   /* harmless when not started */
    sh_tm_stop();
    assert_int_equal(sh_tm_start(NULL), SH_EINVAL);
}

/* A child writes lines as fast as it can until SIGKILL: what it leaves must
 * be whole lines only. */
static void test_jsonl_survives_sigkill(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/killed.jsonl", temp_dir());
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct sh_tm_params p = jsonl_params(path, 1);
        sh_tm_set(SH_TM_G_step, 0);
        if (sh_tm_start(&p) != SH_OK)
            _exit(1);
        for (int64_t s = 1;; s++) {
            sh_tm_add(SH_TM_C_h2d_bytes, 4096);
            sh_tm_step(s);
            if (s % 64 == 0)
                usleep(200);
        }
    }
    /* Killed once it has written some lines, however slow the machine:
     * the file is polled, with a deadline only for a child that never
     * writes. */
    for (int waited = 0; count_lines(path) <= 10 && waited < 60000; waited += 5)
        sleep_ms(5);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    /* Whole lines, each covering the steps since the previous one, with
     * exactly those steps' figures (4096 bytes a step). A kill inside the
     * write of a line that spans two pages of the page cache may cut that
     * last line short (the kernel stops a write between pages for a fatal
     * signal): only an unterminated last line is set aside. */
    size_t len = 0;
    char *text = slurp(path, &len);
    assert_non_null(text);
    char *nl = strrchr(text, '\n');
    assert_non_null(nl);
    nl[1] = '\0';
    int64_t prev = -1;
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_object *o = json_tokener_parse(l);
        if (!o)
            fail_msg("line %d is not JSON: %.80s", lines, l);
        int64_t step = ifield(o, "step"), steps = ifield(o, "steps");
        assert_true(step > prev);
        assert_int_equal(steps, step - prev);
        assert_int_equal(ifield(o, "h2d_bytes"), 4096 * steps);
        prev = step;
        lines++;
        json_object_put(o);
    }
    free(text);
    assert_true(lines > 10);
}

/* ---- the demo publisher (not a test) ------------------------------------------------------------
 */

#define DEMO_REGIONS 48

static uint64_t demo_t0;

static int demo_regions(void *ctx, struct sh_tm_region *out, int32_t *device, int max)
{
    (void)ctx;
    (void)device; /* one device: 0, as the buffer holds */
    uint64_t now = sh_tm_now_us(), tick = (now - demo_t0) / 700000;
    int n = DEMO_REGIONS < max ? DEMO_REGIONS : max;
    for (int i = 0; i < n; i++) {
        int phase = (int)((tick + (uint64_t)i * 3) % 10);
        int st = phase < 6 ? 0 : phase == 6 ? 1 : phase < 9 ? 2 : 3;
        if (i == 0)
            st = 0; /* the largest region stays on the device */
        if (i == 1)
            st = 2; /* and one region is always on the host */
        out[i] = (struct sh_tm_region){.va = 0x7f3a00000000ull + (uint64_t)i * 4 * GiB,
                                       .size = (uint64_t)(DEMO_REGIONS - i) * 64 * MiB,
                                       .id = (uint64_t)i + 1,
                                       .last_use_us = now - (uint64_t)i * 37000,
                                       .evictions = (uint32_t)((i * 7) % 23),
                                       .restores = (uint32_t)((i * 5) % 19),
                                       .cls = i % 4 == 0 ? 1 : 2,
                                       .state = st};
    }
    sh_tm_set(SH_TM_G_regions_resident, 1800);
    sh_tm_set(SH_TM_G_regions_host, 212);
    sh_tm_set(SH_TM_G_regions_evicting, 3);
    sh_tm_set(SH_TM_G_regions_restoring, 2);
    sh_tm_set(SH_TM_G_regions_persistent, 396);
    sh_tm_set(SH_TM_G_regions_transient, 1621);
    return n;
}

static void demo_tick(int64_t k)
{
    static const uint64_t cls[] = {1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB};
    static const uint64_t tot[] = {512, 64, 16, 8, 4};
    double w = sin((double)k / 9.0);
    sh_tm_add(SH_TM_C_h2d_bytes, (uint64_t)((1.2 + w) * 400 * MiB));
    sh_tm_add(SH_TM_C_d2h_bytes, (uint64_t)((1.1 - w) * 300 * MiB));
    sh_tm_add(SH_TM_C_prefetch_hits, 40);
    sh_tm_add(SH_TM_C_prefetch_misses, k % 7 == 0 ? 3 : 0);
    sh_tm_add(SH_TM_C_evictions, 5);
    sh_tm_add(SH_TM_C_restores, 4);
    sh_tm_add(SH_TM_C_spill_bytes, 120 * MiB);
    sh_tm_add(SH_TM_C_restore_bytes, 110 * MiB);
    sh_tm_add(SH_TM_C_activations_saved, 60);
    sh_tm_add(SH_TM_C_activations_spilled, 40);
    sh_tm_add(SH_TM_C_activations_restored, 40);
    sh_tm_add(SH_TM_C_activations_kept, 20);
    sh_tm_add(SH_TM_C_pool_hits, 40);
    if (k % 13 == 0) {
        sh_tm_inc(SH_TM_C_stall_count);
        sh_tm_add(SH_TM_C_stall_time_us, 2400);
        sh_tm_event(SH_TM_EV_STALL, 7, 2400);
    }
    sh_tm_vram((uint64_t)((0.70 + 0.12 * w) * 80.0 * (double)GiB));
    for (int i = 0; i < 5; i++)
        sh_tm_host_class(i, cls[i], (uint64_t)((double)tot[i] * (0.4 + 0.3 * fabs(w)) + i % 2),
                         tot[i]);
    sh_tm_host_classes(5);
    sh_tm_event(k % 3 ? SH_TM_EV_EVICT : SH_TM_EV_PREFETCH, (uint64_t)(k % 40) + 2,
                (uint64_t)(k % 5 + 1) * 64 * MiB);
}

static int run_demo(int seconds)
{
    const char *dir = getenv("STAGEHAND_TM_DEMO_DIR");
    struct sh_tm_params p = {.shm_enabled = 1,
                             .jsonl_path = getenv("STAGEHAND_TM_DEMO_JSONL"),
                             .period_ms = 100,
                             .device = 0,
                             .device_name = "NVIDIA H100 80GB HBM3 (demo)",
                             .budget = 80 * GiB,
                             .high = 64 * GiB,
                             .low = 48 * GiB,
                             .config_summary = "budget=81920MB high=65536MB low=49152MB",
                             .tracking = SH_TM_TRACK_CUPTI,
                             .regions = demo_regions,
                             .shm_dir = dir && *dir ? dir : NULL};
    demo_t0 = sh_tm_now_us();
    sh_tm_hints(3, 2, 1, 0, 0);
    if (sh_tm_start(&p) != SH_OK) {
        fprintf(stderr, "demo: cannot publish\n");
        return 1;
    }
    printf("demo publisher pid %d: %s\n", (int)getpid(), sh_tm_shm_path());
    fflush(stdout);
    static const int phases[] = {STAGEHAND_PHASE_FORWARD, STAGEHAND_PHASE_BACKWARD,
                                 STAGEHAND_PHASE_OPTIMIZER};
    uint64_t end = sh_tm_now_us() + (uint64_t)seconds * 1000000u;
    for (int64_t k = 1; sh_tm_now_us() < end; k++) {
        demo_tick(k);
        if (k % 8 == 0)
            sh_tm_step(1200 + k / 8);
        else
            sh_tm_phase(phases[(k % 8) * 3 / 8]);
        sleep_ms(50);
    }
    sh_tm_stop();
    return 0;
}

/* A failed assertion must not leave the publisher running for the next test. */
static int stop_publisher(void **state)
{
    (void)state;
    sh_tm_stop();
    return 0;
}

int main(void)
{
    const char *demo = getenv("STAGEHAND_TM_DEMO");
    if (demo && *demo)
        return run_demo(atoi(demo));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_follow_seeds),
        cmocka_unit_test(test_counters_sum_threads_after_exit),
        cmocka_unit_test(test_counters_thread_churn),
        cmocka_unit_test(test_counters_read_while_adding),
        cmocka_unit_test(test_vram_peaks),
        cmocka_unit_test(test_phase_durations),
        cmocka_unit_test(test_hints_count_tightening_only),
        cmocka_unit_test(test_events_newest_in_order),
        cmocka_unit_test(test_events_concurrent_never_torn),
        cmocka_unit_test(test_jsonl_format_fields),
        cmocka_unit_test(test_jsonl_devices),
        cmocka_unit_test(test_jsonl_no_hits_is_null),
        cmocka_unit_test_teardown(test_jsonl_one_line_per_step, stop_publisher),
        cmocka_unit_test_teardown(test_jsonl_interval, stop_publisher),
        cmocka_unit_test_teardown(test_jsonl_path_expands_pid, stop_publisher),
        cmocka_unit_test_teardown(test_jsonl_unwritable_fails_cleanly, stop_publisher),
        cmocka_unit_test_teardown(test_jsonl_refuses_odd_files, stop_publisher),
        cmocka_unit_test(test_jsonl_survives_sigkill),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    remove_dirs();
    return failed;
}
