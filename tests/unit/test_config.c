/* test_config.c — config/: defaults, the shipped stagehand.ini, golden files
 * under tests/unit/config/ (good and bad, with exact messages), environment
 * overrides and the start-up search order.
 *
 * Runs with the repository root as the working directory. Each test owns its
 * own struct sh_config; nothing is shared between tests except the cwd, which
 * the one test that changes it restores.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "sh_err.h"
#include "sh_log.h"

#define MiB  (UINT64_C(1) << 20)
#define GiB  (UINT64_C(1) << 30)
#define CARD (16 * GiB)
#define HOST (64 * GiB)
#define DIR  "tests/unit/config/"

static char err[SH_CONFIG_ERR_MAX];

static void load_ok(struct sh_config *c, const char *path)
{
    err[0] = '\0';
    int rc = sh_config_load_file(c, path, err, sizeof err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
}

static void resolve_ok(struct sh_config *c)
{
    err[0] = '\0';
    int rc = sh_config_resolve(c, CARD, HOST, err, sizeof err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
}

static void assert_list(const struct sh_config_list *l, uint32_t n, const uint32_t *v)
{
    assert_int_equal(l->n, n);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(l->v[i], v[i]);
}

static void assert_origin(const struct sh_config *c, const char *sec, const char *key,
                          const char *want)
{
    char buf[SH_CONFIG_STR_MAX + 32];
    assert_int_equal(sh_config_origin(c, sec, key, buf, sizeof buf), 0);
    assert_string_equal(buf, want);
}

/* The documented defaults, resolved against a 16 GiB card and 64 GiB of RAM. */
static void assert_defaults(const struct sh_config *c)
{
    static const uint32_t classes[] = {1, 4, 16, 64, 256}, slabs[] = {64, 16, 8, 4, 2};
    assert_int_equal(c->resolved, 1);
    assert_int_equal(c->general.enabled, 1);
    assert_int_equal(c->general.log_level, SH_LOG_WARN);
    assert_int_equal(c->general.device, -1); /* auto */
    assert_int_equal(c->budget.vram_budget.bytes, CARD);
    assert_int_equal(c->budget.vram_budget.is_pct, 1);
    assert_true(c->budget.vram_budget.pct == 100.0);
    /* auto: decided at run time, the budget until then */
    assert_int_equal(c->budget.vram_high_watermark.is_auto, 1);
    assert_int_equal(c->budget.vram_low_watermark.is_auto, 1);
    assert_int_equal(c->budget.vram_high_watermark.bytes, CARD);
    assert_int_equal(c->budget.vram_low_watermark.bytes, CARD);
    assert_int_equal(c->budget.host_ram_budget.bytes, 32 * GiB);
    assert_int_equal(c->budget.host_ram_scope, SH_CONFIG_HOST_AUTO);
    assert_string_equal(c->budget.host_ram_segment, "auto");
    assert_int_equal(c->regions.min_region.bytes, 1024 * 1024);
    assert_int_equal(c->regions.max_chunk.bytes, 64 * MiB);
    assert_int_equal(c->regions.va_cache.bytes, 4096 * MiB);
    assert_int_equal(c->regions.device_cache.bytes, 1024 * MiB);
    assert_int_equal(c->regions.suballoc_max.bytes, 1024 * 1024);
    assert_list(&c->pool.classes_mb, 5, classes);
    assert_list(&c->pool.slabs_per_class, 5, slabs);
    assert_int_equal(c->pool.prepin.bytes, 0);
    assert_int_equal(c->pool.grow_in_background, 1);
    assert_int_equal(c->transfer.max_inflight_d2h, 2);
    assert_int_equal(c->transfer.max_inflight_h2d, 2);
    assert_int_equal(c->transfer.drain_mode, SH_CONFIG_DRAIN_DEVICE);
    assert_int_equal(c->general.devices, SH_CONFIG_DEVICES_ONE);
    assert_int_equal(c->transfer.batch_max, 16);
    assert_int_equal(c->policy.eviction, SH_CONFIG_EVICT_LEARNED);
    assert_int_equal(c->policy.prefetch_window, 64);
    assert_int_equal(c->policy.prefetch_enabled, 1);
    assert_int_equal(c->policy.record_above_pct, 50);
    assert_int_equal(c->conductor.enabled, 1);
    assert_int_equal(c->conductor.backward_pressure_pct, 80);
    assert_int_equal(c->conductor.backward_prefetch_window, 1);
    assert_int_equal(c->conductor.optimizer_max_inflight_h2d, 1);
    assert_int_equal(c->conductor.contention_checks, 3);
    assert_int_equal(c->tracking.mode, SH_CONFIG_TRACK_AUTO);
    assert_string_equal(c->tracking.cupti_path, "auto");
    assert_int_equal(c->telemetry.telemetry_enabled, 1);
    assert_string_equal(c->telemetry.telemetry_file, "");
    assert_int_equal(c->telemetry.telemetry_interval, 1);
    assert_int_equal(c->telemetry.shm_enabled, 1);
    assert_int_equal(c->debug.debug_checksums, 0);
    assert_int_equal(c->debug.debug_verify_moves, 0);
    assert_string_equal(c->debug.trace_file, "");
}

/* ---- good --------------------------------------------------------------- */

static void test_builtin_defaults(void **state)
{
    struct sh_config c;
    (void)state;
    sh_config_defaults(&c);
    assert_int_equal(c.resolved, 0);
    resolve_ok(&c);
    assert_defaults(&c);
    assert_origin(&c, "budget", "vram_budget_mb", "defaults");
}

/* Every key in the table: its default parses, and stagehand.ini sets it, in the
 * right section, to exactly the documented default text. */
static void test_shipped_ini(void **state)
{
    struct sh_config c;
    struct sh_config_key_info ki;
    char text[32768], want[300], where[300];
    (void)state;
    FILE *fp = fopen("stagehand.ini", "r");
    assert_non_null(fp);
    size_t n = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[n] = '\0';

    sh_config_defaults(&c);
    load_ok(&c, "stagehand.ini");
    resolve_ok(&c);
    assert_defaults(&c);
    size_t i = 0;
    for (; sh_config_key_at(i, &ki) == 0; i++) {
        snprintf(want, sizeof want, "\n%s = %s\n", ki.name, ki.def);
        if (!*ki.def)
            snprintf(want, sizeof want, "\n%s =\n", ki.name);
        if (!strstr(text, want))
            print_error("stagehand.ini lacks \"%s = %s\"\n", ki.name, ki.def);
        assert_non_null(strstr(text, want));
        assert_int_equal(sh_config_origin(&c, ki.section, ki.name, where, sizeof where), 0);
        assert_memory_equal(where, "stagehand.ini:", 14);
        assert_non_null(ki.unit);
        assert_non_null(ki.help);
    }
    assert_int_equal(i, 43);
    assert_int_equal(sh_config_key_at(i, &ki), SH_ENOTFOUND);
    assert_origin(&c, "budget", "vram_budget_mb", "stagehand.ini:67");
}

static void test_good_percent(void **state)
{
    struct sh_config c;
    (void)state;
    sh_config_defaults(&c);
    load_ok(&c, DIR "good_percent.ini");
    assert_int_equal(c.budget.vram_low_watermark.is_pct, 1);
    assert_true(c.budget.vram_low_watermark.pct == 12.5);
    resolve_ok(&c);
    assert_int_equal(c.budget.vram_budget.bytes, 8 * GiB);
    assert_int_equal(c.budget.vram_high_watermark.bytes, UINT64_C(7730941133)); /* 7.2 GiB */
    assert_int_equal(c.budget.vram_low_watermark.bytes, 1 * GiB);
    assert_int_equal(c.budget.host_ram_budget.bytes, 16 * GiB);
    assert_int_equal(c.regions.device_cache.bytes, UINT64_C(858993459));
    assert_int_equal(c.pool.prepin.bytes, UINT64_C(257698038));
    /* Resolving again against another card recomputes only the percentages. */
    assert_int_equal(sh_config_resolve(&c, 4 * GiB, HOST, err, sizeof err), 0);
    assert_int_equal(c.budget.vram_budget.bytes, 2 * GiB);
    assert_int_equal(c.budget.vram_low_watermark.bytes, 256 * MiB);
    assert_int_equal(c.regions.max_chunk.bytes, 64 * MiB);
}

static void test_good_suffix(void **state)
{
    struct sh_config c;
    (void)state;
    sh_config_defaults(&c);
    load_ok(&c, DIR "good_suffix.ini");
    resolve_ok(&c);
    assert_int_equal(c.budget.vram_budget.bytes, 2 * GiB);
    assert_int_equal(c.budget.vram_budget.is_pct, 0);
    assert_int_equal(c.budget.vram_high_watermark.bytes, 1536 * MiB);
    assert_int_equal(c.budget.vram_low_watermark.bytes, 1280 * MiB);
    assert_int_equal(c.budget.host_ram_budget.bytes, 4 * GiB);
    assert_int_equal(c.regions.min_region.bytes, 2 * MiB);
    assert_int_equal(c.regions.max_chunk.bytes, 128 * MiB);
    assert_int_equal(c.regions.va_cache.bytes, 1024 * GiB);
    assert_int_equal(c.regions.device_cache.bytes, 256 * MiB);
    assert_int_equal(c.regions.suballoc_max.bytes, 512 * 1024);
    assert_int_equal(c.pool.prepin.bytes, 1 * MiB);
    assert_origin(&c, "regions", "va_cache_mb", DIR "good_suffix.ini:11");
}

static void test_good_lists(void **state)
{
    static const uint32_t classes[] = {2, 8, 32, 128}, slabs[] = {10, 10, 10, 10};
    static const uint32_t classes2[] = {4, 8}, slabs2[] = {3, 0};
    struct sh_config c;
    (void)state;
    sh_config_defaults(&c);
    load_ok(&c, DIR "good_lists.ini");
    assert_int_equal(c.pool.slabs_per_class.n, 1);
    resolve_ok(&c);
    assert_list(&c.pool.classes_mb, 4, classes);
    assert_list(&c.pool.slabs_per_class, 4, slabs);

    sh_config_defaults(&c);
    assert_int_equal(sh_config_load_string(&c, "s",
                                           "[pool]\npinned_pool_classes_mb=4,8\n"
                                           "slabs_per_class = 3 , 0\n[regions]\nmax_chunk_mb=8\n",
                                           err, sizeof err),
                     0);
    resolve_ok(&c);
    assert_list(&c.pool.classes_mb, 2, classes2);
    assert_list(&c.pool.slabs_per_class, 2, slabs2);
}

static void test_syntax_details(void **state)
{
    struct sh_config c;
    (void)state;
    sh_config_defaults(&c);
    assert_int_equal(sh_config_load_string(&c, "s",
                                           "\xEF\xBB\xBF# comment\n"
                                           "  [ Policy ]\n"
                                           "    PREFETCH_WINDOW = 8 ; inline comment\n"
                                           "prefetch_window = 9\n" /* last one wins */
                                           "Eviction = LRU\n"
                                           "prefetch_enabled: Off\n"
                                           "[debug]\n"
                                           "trace_file = \"/tmp/a b.trace\"\n"
                                           "debug_checksums = YES\n"
                                           "[conductor]\n"
                                           "enabled = 0\n"
                                           "[general]\n"
                                           "log_level = debug\n",
                                           err, sizeof err),
                     0);
    assert_int_equal(c.policy.prefetch_window, 9);
    assert_int_equal(c.policy.eviction, SH_CONFIG_EVICT_LRU);
    assert_int_equal(c.policy.prefetch_enabled, 0);
    assert_string_equal(c.debug.trace_file, "/tmp/a b.trace");
    assert_int_equal(c.debug.debug_checksums, 1);
    assert_int_equal(c.conductor.enabled, 0);
    assert_int_equal(c.general.enabled, 1); /* same key name, other section */
    assert_int_equal(c.general.log_level, SH_LOG_DEBUG);
    assert_origin(&c, "policy", "prefetch_window", "s:4");
    assert_origin(&c, "conductor", "enabled", "s:11");
    assert_origin(&c, "general", "enabled", "defaults");
    assert_int_equal(sh_config_origin(&c, "policy", "nope", err, sizeof err), SH_ENOTFOUND);
    assert_int_equal(sh_config_origin(&c, "nope", "enabled", err, sizeof err), SH_ENOTFOUND);
}

static void test_summary(void **state)
{
    struct sh_config c;
    char buf[1024];
    (void)state;
    sh_config_defaults(&c);
    sh_config_summary(&c, buf, sizeof buf);
    assert_string_equal(buf, "budget=100% high=auto low=auto host=50% min_region=1024KB chunk=64MB "
                             "classes=1,4,16,64,256 slabs=64,16,8,4,2 d2h=2 h2d=2 drain=device "
                             "eviction=learned window=64 prefetch=on clean=on conductor=on "
                             "tracking=auto telemetry=on checksums=off");
    resolve_ok(&c);
    sh_config_summary(&c, buf, sizeof buf);
    assert_string_equal(buf, "budget=16384MB high=auto low=auto host=32768MB "
                             "min_region=1024KB chunk=64MB classes=1,4,16,64,256 "
                             "slabs=64,16,8,4,2 d2h=2 h2d=2 drain=device eviction=learned "
                             "window=64 prefetch=on clean=on conductor=on tracking=auto "
                             "telemetry=on checksums=off");
    sh_config_summary(&c, buf, 12);
    assert_string_equal(buf, "budget=1638");
}

/* ---- bad golden files ----------------------------------------------------- */

struct bad {
    const char *file;
    int at_resolve; /* the file loads; resolve() reports the error */
    const char *msg;
};

static const struct bad bads[] = {
    {"bad_unknown_key.ini", 0, "3: prefetch_windw: unknown key in [policy]"},
    {"bad_unknown_section.ini", 0, "3: [polcy]: unknown section"},
    {"bad_bool.ini", 0,
     "2: debug_checksums: not a boolean: \"maybe\" (use true/false, yes/no, on/off or 1/0)"},
    {"bad_int.ini", 0, "2: batch_max: not an integer: \"many\""},
    {"bad_negative.ini", 0, "2: device: must be auto or an integer from 0 to 255 (got \"-1\")"},
    {"bad_overflow.ini", 0, "2: prefetch_window: number too large: \"99999999999999999999999\""},
    {"bad_int_range.ini", 0, "2: prefetch_window: must be at most 1000000 (got 4294967296)"},
    {"bad_trailing.ini", 0, "2: max_inflight_d2h: trailing characters after the number: \"2x\""},
    {"bad_pct_over_100.ini", 0, "2: vram_budget_mb: percentage above 100%: \"150%\""},
    {"bad_unit.ini", 0,
     "2: vram_budget_mb: unknown unit \"parsecs\" in \"12 parsecs\" (use B, KB, MB, GB, TB or %)"},
    {"bad_pct_not_allowed.ini", 0, "2: max_chunk_mb: a percentage is not allowed here: \"50%\""},
    {"bad_chunk_pow2.ini", 0, "2: max_chunk_mb: must be a power of two (got 48 MB)"},
    {"bad_classes_order.ini", 0,
     "2: pinned_pool_classes_mb: values must be strictly increasing (4 after 16)"},
    {"bad_classes_pow2.ini", 0, "2: pinned_pool_classes_mb: must be a power of two (got 3)"},
    {"bad_enum.ini", 0, "2: eviction: must be one of lru, learned (got \"fifo\")"},
    {"bad_syntax.ini", 0, "3: syntax error: expected \"[section]\" or \"key = value\""},
    {"bad_key_outside.ini", 0, "1: device: key outside any [section]"},
    {"bad_long_line.ini", 0, "2: line: too long (at most 199 characters)"},
    {"bad_low_ge_high.ini", 1,
     "4: vram_low_watermark_mb: must be below vram_high_watermark_mb (9000 >= 8000)"},
    {"bad_high_over_budget.ini", 1,
     "3: vram_high_watermark_mb: must not exceed vram_budget_mb (9000 > 8000)"},
    {"bad_slabs_len.ini", 1,
     "3: slabs_per_class: has 2 values for 3 pinned_pool_classes_mb classes (give one value, or "
     "one per class)"},
    {"bad_chunk_over_class.ini", 1,
     "2: max_chunk_mb: must not exceed pinned_pool_classes_mb (512 > 256)"},
    {"bad_budget_over_card.ini", 1,
     "2: vram_budget_mb: must not exceed the card's memory (32768 > 16384)"},
    {"bad_no_pinning.ini", 1,
     "2: grow_in_background: is false and prepin_mb is 0: no host memory would ever be pinned, "
     "so nothing could be evicted (set prepin_mb, or leave it true)"},
};

static void test_bad_file(void **state)
{
    const struct bad *b = *state;
    struct sh_config c, before;
    char path[256], want[SH_CONFIG_ERR_MAX];
    snprintf(path, sizeof path, DIR "%s", b->file);
    snprintf(want, sizeof want, "%s:%s", path, b->msg);
    sh_config_defaults(&c);
    memcpy(&before, &c, sizeof c);
    err[0] = '\0';
    int rc = sh_config_load_file(&c, path, err, sizeof err);
    if (b->at_resolve) {
        assert_int_equal(rc, 0);
        memcpy(&before, &c, sizeof c);
        rc = sh_config_resolve(&c, CARD, HOST, err, sizeof err);
    }
    assert_int_equal(rc, SH_EINVAL);
    assert_string_equal(err, want);
    assert_memory_equal(&c, &before, sizeof c); /* a failed call changes nothing */
}

/* ---- more bad input, from strings ----------------------------------------- */

static void expect_string_error(const char *text, const char *want)
{
    struct sh_config c;
    sh_config_defaults(&c);
    err[0] = '\0';
    assert_int_equal(sh_config_load_string(&c, "x.ini", text, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, want);
}

/* [budget] host_ram_scope and host_ram_segment: a segment name is a file
 * name in /dev/shm, so one that could reach elsewhere stops the program. */
static void expect_segment_error(const char *name, const char *why)
{
    struct sh_config c;
    char text[256], want[512];
    sh_config_defaults(&c);
    snprintf(text, sizeof text, "[budget]\nhost_ram_segment = %s\n", name);
    assert_int_equal(sh_config_load_string(&c, "x.ini", text, err, sizeof err), 0);
    assert_int_equal(sh_config_resolve(&c, CARD, HOST, err, sizeof err), SH_EINVAL);
    snprintf(want, sizeof want, "x.ini:2: host_ram_segment: \"%s\" %s", name, why);
    assert_string_equal(err, want);
}

static void test_node_scope_keys(void **state)
{
    struct sh_config c;
    (void)state;
    sh_config_defaults(&c);
    assert_int_equal(sh_config_load_string(&c, "x.ini",
                                           "[budget]\nhost_ram_scope = node\n"
                                           "host_ram_segment = job-7.a_b\n",
                                           err, sizeof err),
                     0);
    resolve_ok(&c);
    assert_int_equal(c.budget.host_ram_scope, SH_CONFIG_HOST_NODE);
    assert_string_equal(c.budget.host_ram_segment, "job-7.a_b");
    expect_string_error("[budget]\nhost_ram_scope = host\n",
                        "x.ini:2: host_ram_scope: must be one of process, node, auto (got "
                        "\"host\")");
    expect_segment_error("x/../../etc/passwd", "may hold only letters, digits, '.', '_' and '-'");
    expect_segment_error("a/b", "may hold only letters, digits, '.', '_' and '-'");
    expect_segment_error("..", "must not start with '.'");
    /* Checked at load too, before the machine is known. */
    static char *const env[] = {"STAGEHAND_BUDGET_HOST_RAM_SEGMENT=x/y", NULL};
    sh_config_defaults(&c);
    assert_int_equal(sh_config_load(&c, env, NULL, 0, err, sizeof err), SH_EINVAL);
    assert_non_null(strstr(err, "host_ram_segment: \"x/y\" may hold only"));
}

static void test_device_values(void **state)
{
    struct sh_config c;
    char sum[64];
    (void)state;
    sh_config_defaults(&c);
    assert_int_equal(sh_config_load_string(&c, "x.ini", "[general]\ndevice = 3\n", err, sizeof err),
                     0);
    assert_int_equal(c.general.device, 3);
    assert_int_equal(
        sh_config_load_string(&c, "x.ini", "[general]\ndevice = AUTO\n", err, sizeof err), 0);
    assert_int_equal(c.general.device, -1);
    assert_int_equal(sh_config_origin(&c, "general", "device", sum, sizeof sum), 0);
    assert_string_equal(sum, "x.ini:2");
    /* which devices: one (the default) or all */
    assert_int_equal(c.general.devices, SH_CONFIG_DEVICES_ONE);
    assert_int_equal(
        sh_config_load_string(&c, "x.ini", "[general]\ndevices = all\n", err, sizeof err), 0);
    assert_int_equal(c.general.devices, SH_CONFIG_DEVICES_ALL);
    assert_int_not_equal(
        sh_config_load_string(&c, "x.ini", "[general]\ndevices = 2\n", err, sizeof err), 0);
    assert_string_equal(err, "x.ini:2: devices: must be one of one, all (got \"2\")");
    assert_int_equal(c.general.devices, SH_CONFIG_DEVICES_ALL); /* left as it was */
}

static void test_bad_strings(void **state)
{
    (void)state;
    /* The first error wins, whether it is a value or the syntax. */
    expect_string_error("[debug]\ndebug_checksums = 2\nbroken\n",
                        "x.ini:2: debug_checksums: not a boolean: \"2\" "
                        "(use true/false, yes/no, on/off or 1/0)");
    expect_string_error("[debug]\nbroken\ndebug_checksums = 2\n",
                        "x.ini:2: syntax error: expected \"[section]\" or \"key = value\"");
    expect_string_error("[policy]\nprefetch_window =\n", "x.ini:2: prefetch_window: empty value");
    expect_string_error(
        "[general]\ndevice = autox\n",
        "x.ini:2: device: must be auto or an integer from 0 to 255 (got \"autox\")");
    expect_string_error("[general]\ndevice = 256\n",
                        "x.ini:2: device: must be auto or an integer from 0 to 255 (got \"256\")");
    expect_string_error("[policy]\nprefetch_window = +3\n",
                        "x.ini:2: prefetch_window: not an integer: \"+3\"");
    expect_string_error("[policy]\nprefetch_window = 0\n",
                        "x.ini:2: prefetch_window: must be at least 1 (got 0)");
    expect_string_error("[budget]\nvram_budget_mb = 99999999999 TB\n",
                        "x.ini:2: vram_budget_mb: number too large: \"99999999999 TB\"");
    expect_string_error(
        "[budget]\nvram_budget_mb = 2048 TB\n",
        "x.ini:2: vram_budget_mb: must be at most 1073741824 MB (got 2147483648 MB)");
    expect_string_error("[budget]\nvram_budget_mb = -5%\n",
                        "x.ini:2: vram_budget_mb: must not be negative: \"-5%\"");
    expect_string_error("[budget]\nvram_budget_mb = 50%%\n",
                        "x.ini:2: vram_budget_mb: trailing characters after the percentage: "
                        "\"50%%\"");
    expect_string_error("[budget]\nvram_budget_mb = 1.GB\n",
                        "x.ini:2: vram_budget_mb: not a size: \"1.GB\"");
    expect_string_error("[pool]\nslabs_per_class = 1,,2\n",
                        "x.ini:2: slabs_per_class: empty value in the list");
    expect_string_error("[pool]\nslabs_per_class = 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17\n",
                        "x.ini:2: slabs_per_class: too many values (at most 16)");
    expect_string_error("[pool]\npinned_pool_classes_mb = 4,4\n",
                        "x.ini:2: pinned_pool_classes_mb: values must be strictly increasing "
                        "(4 after 4)");
    expect_string_error("[tracking]\nmode = kprobes\n",
                        "x.ini:2: mode: must be one of auto, cupti, hooks (got \"kprobes\")");
}

static void expect_resolve_error(const char *text, uint64_t card, const char *want)
{
    struct sh_config c;
    sh_config_defaults(&c);
    assert_int_equal(sh_config_load_string(&c, "x.ini", text, err, sizeof err), 0);
    err[0] = '\0';
    assert_int_equal(sh_config_resolve(&c, card, HOST, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, want);
}

static void test_bad_combinations(void **state)
{
    (void)state;
    /* Only the user's key is blamed when the other one is a default. */
    expect_resolve_error("[budget]\nvram_high_watermark_mb = 20GB\n", CARD,
                         "x.ini:2: vram_high_watermark_mb: must not exceed vram_budget_mb "
                         "(20480 > 16384)");
    /* Both set: the low one is blamed; an auto one is never in the way. */
    expect_resolve_error("[budget]\nvram_high_watermark_mb = 50%\nvram_low_watermark_mb = 60%\n",
                         CARD,
                         "x.ini:3: vram_low_watermark_mb: must be below vram_high_watermark_mb "
                         "(9830.4 >= 8192)");
    expect_resolve_error("[pool]\npinned_pool_classes_mb = 64,128\n", CARD,
                         "x.ini:2: pinned_pool_classes_mb: has 2 classes but slabs_per_class has "
                         "5 values (give one value, or one per class)");
    expect_resolve_error("[policy]\nprefetch_window = 1\n[conductor]\n"
                         "backward_prefetch_window = 2\n",
                         CARD,
                         "x.ini:4: backward_prefetch_window: must not exceed prefetch_window "
                         "(2 > 1)");
    expect_resolve_error("[transfer]\nmax_inflight_h2d = 1\n[conductor]\n"
                         "optimizer_max_inflight_h2d = 3\n",
                         CARD,
                         "x.ini:4: optimizer_max_inflight_h2d: must not exceed max_inflight_h2d "
                         "(3 > 1)");
    expect_resolve_error("[pool]\nprepin_mb = 64GB\n", CARD,
                         "x.ini:2: prepin_mb: must not exceed host_ram_budget_mb (65536 > 32768)");
    expect_resolve_error("[budget]\nvram_budget_mb = 0.001%\n", CARD,
                         "x.ini:2: vram_budget_mb: must be at least 1 MB (got 0.16 MB), from "
                         "0.001%");
    expect_resolve_error("[budget]\nhost_ram_budget_mb = 128GB\n", CARD,
                         "x.ini:2: host_ram_budget_mb: must not exceed the machine's RAM "
                         "(131072 > 65536)");
    /* Nothing but defaults, and the card's size unknown. */
    expect_resolve_error("", 0,
                         "defaults: vram_budget_mb: a percentage needs the card's memory size, "
                         "which is unknown");
}

/* "auto" is a value of the watermarks only; an explicit value replaces it
 * (file or environment) and "auto" from the environment restores it. */
static void test_auto_watermarks(void **state)
{
    struct sh_config c;
    char used[256];
    char *envp[] = {"STAGEHAND_CONFIG=" DIR "good_percent.ini",
                    "STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB=auto", NULL};
    (void)state;
    sh_config_defaults(&c);
    load_ok(&c, DIR "good_percent.ini");
    resolve_ok(&c);
    assert_int_equal(c.budget.vram_high_watermark.is_auto, 0);
    assert_int_equal(c.budget.vram_low_watermark.is_auto, 0);
    assert_int_equal(sh_config_init(&c, envp, CARD, HOST, used, sizeof used, err, sizeof err), 0);
    assert_int_equal(c.budget.vram_high_watermark.is_auto, 1);
    assert_int_equal(c.budget.vram_high_watermark.bytes, 8 * GiB); /* the file's budget */
    assert_int_equal(c.budget.vram_low_watermark.is_auto, 0);      /* still the file's 12.5% */
    assert_int_equal(c.budget.vram_low_watermark.bytes, 1 * GiB);
    expect_string_error("[budget]\nvram_budget_mb = auto\n",
                        "x.ini:2: vram_budget_mb: not a size: \"auto\"");
    expect_string_error("[budget]\nvram_high_watermark_mb = automatic\n",
                        "x.ini:2: vram_high_watermark_mb: not a size: \"automatic\"");
}

/* ---- environment and start-up --------------------------------------------- */

static void test_env_overrides_file(void **state)
{
    struct sh_config c;
    char used[256];
    char *envp[] = {"PATH=/bin",
                    "STAGEHAND_CONFIG=" DIR "good_env_base.ini",
                    "STAGEHAND_POLICY_PREFETCH_WINDOW=128",
                    "STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB=75%",
                    "STAGEHAND_TELEMETRY_TELEMETRY_FILE= /tmp/env.jsonl ",
                    "STAGEHAND_TRACE=/tmp/env.trace",
                    "STAGEHAND_DISABLE=0",
                    "STAGEHAND_SIM_WHATEVER=1",
                    "STAGEHAND_DEBUG=1",
                    "NOT_STAGEHAND_POLICY_EVICTION=bogus",
                    "STAGEHAND_DEBUG_TRACE_FILE=/tmp/key.trace", /* STAGEHAND_TRACE wins */
                    NULL};
    (void)state;
    err[0] = '\0';
    int rc = sh_config_init(&c, envp, CARD, HOST, used, sizeof used, err, sizeof err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_string_equal(used, DIR "good_env_base.ini");
    assert_int_equal(c.policy.prefetch_window, 128);
    assert_int_equal(c.budget.vram_high_watermark.bytes, 12 * GiB);
    assert_string_equal(c.telemetry.telemetry_file, "/tmp/env.jsonl");
    assert_int_equal(c.policy.eviction, SH_CONFIG_EVICT_LRU); /* from the file */
    assert_origin(&c, "policy", "prefetch_window", "env STAGEHAND_POLICY_PREFETCH_WINDOW");
    assert_origin(&c, "policy", "eviction", DIR "good_env_base.ini:4");
    assert_string_equal(c.debug.trace_file, "/tmp/env.trace");
    assert_origin(&c, "debug", "trace_file", "env STAGEHAND_TRACE");
    assert_int_equal(sh_config_disabled(envp), 0);
}

/* STAGEHAND_TRACE is [debug] trace_file by another name: a string value like
 * any other, over the file and over STAGEHAND_DEBUG_TRACE_FILE; empty, it is
 * as if unset. */
static void test_trace_alias(void **state)
{
    struct sh_config c, before;
    char longer[400];
    char *empty[] = {"STAGEHAND_TRACE=", "STAGEHAND_DEBUG_TRACE_FILE=/tmp/key.trace", NULL};
    char *blanks[] = {"STAGEHAND_TRACE= \"/tmp/a b.trace\" ", NULL};
    char *too_long[] = {longer, NULL};
    (void)state;
    sh_config_defaults(&c);
    assert_int_equal(sh_config_apply_env(&c, empty, err, sizeof err), 0);
    assert_string_equal(c.debug.trace_file, "/tmp/key.trace");
    assert_origin(&c, "debug", "trace_file", "env STAGEHAND_DEBUG_TRACE_FILE");

    sh_config_defaults(&c);
    assert_int_equal(
        sh_config_load_string(&c, "x.ini", "[debug]\ntrace_file = file.trace\n", err, sizeof err),
        0);
    assert_int_equal(sh_config_apply_env(&c, blanks, err, sizeof err), 0);
    assert_string_equal(c.debug.trace_file, "/tmp/a b.trace");
    assert_origin(&c, "debug", "trace_file", "env STAGEHAND_TRACE");

    snprintf(longer, sizeof longer, "STAGEHAND_TRACE=/tmp/%0300d", 0);
    memcpy(&before, &c, sizeof c);
    assert_int_equal(sh_config_apply_env(&c, too_long, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, "env STAGEHAND_TRACE: trace_file: too long (at most 255 characters)");
    assert_memory_equal(&c, &before, sizeof c);
}

static void expect_env_error(char **envp, int code, const char *want)
{
    struct sh_config c;
    char used[256] = "untouched";
    err[0] = '\0';
    assert_int_equal(sh_config_init(&c, envp, CARD, HOST, used, sizeof used, err, sizeof err),
                     code);
    assert_string_equal(err, want);
}

static void test_env_errors(void **state)
{
    char *bad_value[] = {"STAGEHAND_POLICY_PREFETCH_WINDOW=12x", NULL};
    char *bad_key[] = {"STAGEHAND_POLICY_PREFETCH_WINDW=3", NULL};
    char *bad_combo[] = {"STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB=80%",
                         "STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB=90%", NULL};
    char *bad_bool[] = {"STAGEHAND_DEBUG_DEBUG_CHECKSUMS=sometimes", NULL};
    char *missing[] = {"STAGEHAND_CONFIG=" DIR "no_such_file.ini", NULL};
    char *bad_file[] = {"STAGEHAND_CONFIG=" DIR "bad_enum.ini", NULL};
    (void)state;
    expect_env_error(bad_value, SH_EINVAL,
                     "env STAGEHAND_POLICY_PREFETCH_WINDOW: prefetch_window: trailing characters "
                     "after the number: \"12x\"");
    expect_env_error(bad_key, SH_EINVAL,
                     "env STAGEHAND_POLICY_PREFETCH_WINDW: prefetch_windw: unknown key in "
                     "[policy]");
    expect_env_error(bad_combo, SH_EINVAL,
                     "env STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB: vram_low_watermark_mb: must be "
                     "below vram_high_watermark_mb (14745.6 >= 13107.2)");
    expect_env_error(bad_bool, SH_EINVAL,
                     "env STAGEHAND_DEBUG_DEBUG_CHECKSUMS: debug_checksums: not a boolean: "
                     "\"sometimes\" (use true/false, yes/no, on/off or 1/0)");
    expect_env_error(missing, SH_ENOTFOUND,
                     "env STAGEHAND_CONFIG: cannot open " DIR
                     "no_such_file.ini: No such file or directory");
    expect_env_error(bad_file, SH_EINVAL,
                     DIR "bad_enum.ini:2: eviction: must be one of lru, learned (got \"fifo\")");
}

static void test_apply_env_atomic(void **state)
{
    struct sh_config c, before;
    char *envp[] = {"STAGEHAND_TRANSFER_BATCH_MAX=32", "STAGEHAND_TRANSFER_BATCH_MAX=0", NULL};
    char *later[] = {"STAGEHAND_TRANSFER_BATCH_MAX=32", "STAGEHAND_TRANSFER_BATCH_MAX=48", NULL};
    (void)state;
    sh_config_defaults(&c);
    memcpy(&before, &c, sizeof c);
    assert_int_equal(sh_config_apply_env(&c, envp, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, "env STAGEHAND_TRANSFER_BATCH_MAX: batch_max: must be at least 1 "
                             "(got 0)");
    assert_memory_equal(&c, &before, sizeof c);
    assert_int_equal(sh_config_apply_env(&c, later, err, sizeof err), 0);
    assert_int_equal(c.transfer.batch_max, 48);
    assert_int_equal(sh_config_apply_env(&c, NULL, err, sizeof err), 0);
    assert_int_equal(c.transfer.batch_max, 48);
}

static void test_init_search_order(void **state)
{
    struct sh_config c;
    char used[256], cwd[4096], tmp[] = "/tmp/sh_config_XXXXXX";
    char *none[] = {NULL};
    char *empty_config[] = {"STAGEHAND_CONFIG=", NULL};
    (void)state;
    /* The repository root has stagehand.ini. */
    assert_int_equal(sh_config_init(&c, none, CARD, HOST, used, sizeof used, err, sizeof err), 0);
    assert_string_equal(used, "stagehand.ini");
    assert_defaults(&c);
    assert_int_equal(
        sh_config_init(&c, empty_config, CARD, HOST, used, sizeof used, err, sizeof err), 0);
    assert_string_equal(used, "stagehand.ini");
    /* Elsewhere there is none: built-in defaults. */
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_non_null(mkdtemp(tmp));
    assert_int_equal(chdir(tmp), 0);
    int rc = sh_config_init(&c, NULL, CARD, HOST, used, sizeof used, err, sizeof err);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(rmdir(tmp), 0);
    assert_int_equal(rc, 0);
    assert_string_equal(used, "");
    assert_defaults(&c);
}

/* host_ram_scope = auto is node only when a launcher's variable names more
 * than one rank, and says which; set, node and process stand whatever the
 * environment says; without an environment (secure execution) auto is
 * process. */
static void test_host_scope(void **state)
{
    static const struct {
        const char *entry;
        int want;
        const char *why;
    } cases[] = {
        {"LOCAL_WORLD_SIZE=2", SH_CONFIG_HOST_NODE, "LOCAL_WORLD_SIZE=2"},
        {"WORLD_SIZE=16", SH_CONFIG_HOST_NODE, "WORLD_SIZE=16"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE=4", SH_CONFIG_HOST_NODE, "OMPI_COMM_WORLD_LOCAL_SIZE=4"},
        {"MPI_LOCALNRANKS=3", SH_CONFIG_HOST_NODE, "MPI_LOCALNRANKS=3"},
        {"SLURM_NTASKS=8", SH_CONFIG_HOST_NODE, "SLURM_NTASKS=8"},
        {"LOCAL_WORLD_SIZE=1", SH_CONFIG_HOST_PROCESS, ""},
        {"WORLD_SIZE=0", SH_CONFIG_HOST_PROCESS, ""},
        {"WORLD_SIZE=two", SH_CONFIG_HOST_PROCESS, ""},
        {"WORLD_SIZE=2x", SH_CONFIG_HOST_PROCESS, ""},
        {"WORLD_SIZE=-4", SH_CONFIG_HOST_PROCESS, ""},
        {"WORLD_SIZE=", SH_CONFIG_HOST_PROCESS, ""},
        {"LOCAL_RANK=3", SH_CONFIG_HOST_PROCESS, ""},
        {"XWORLD_SIZE=4", SH_CONFIG_HOST_PROCESS, ""},
    };
    struct sh_config c;
    char why[64];
    (void)state;
    sh_config_defaults(&c);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *envp[] = {"PATH=/bin", (char *)cases[i].entry, NULL};
        int got = sh_config_host_scope(&c, envp, why, sizeof why);
        if (got != cases[i].want)
            print_error("%s\n", cases[i].entry);
        assert_int_equal(got, cases[i].want);
        assert_string_equal(why, cases[i].why);
    }
    assert_int_equal(sh_config_host_scope(&c, NULL, why, sizeof why), SH_CONFIG_HOST_PROCESS);
    assert_int_equal(sh_config_host_scope(&c, NULL, NULL, 0), SH_CONFIG_HOST_PROCESS);
    char *several[] = {"LOCAL_WORLD_SIZE=2", NULL};
    c.budget.host_ram_scope = SH_CONFIG_HOST_PROCESS;
    assert_int_equal(sh_config_host_scope(&c, several, why, sizeof why), SH_CONFIG_HOST_PROCESS);
    c.budget.host_ram_scope = SH_CONFIG_HOST_NODE;
    assert_int_equal(sh_config_host_scope(&c, NULL, why, sizeof why), SH_CONFIG_HOST_NODE);
    assert_string_equal(why, "");
}

static void test_disabled(void **state)
{
    static const struct {
        const char *entry;
        int want;
    } cases[] = {
        {"STAGEHAND_DISABLE=1", 1},     {"STAGEHAND_DISABLE=yes", 1}, {"STAGEHAND_DISABLE=ON", 1},
        {"STAGEHAND_DISABLE=2", 1},     {"STAGEHAND_DISABLE=0", 0},   {"STAGEHAND_DISABLE=off", 0},
        {"STAGEHAND_DISABLE=", 0},      {"STAGEHAND_DISABLED=1", 0},  {"XSTAGEHAND_DISABLE=1", 0},
        {"STAGEHAND_DISABLE=false", 0},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *envp[] = {(char *)cases[i].entry, NULL};
        if (sh_config_disabled(envp) != cases[i].want)
            print_error("%s\n", cases[i].entry);
        assert_int_equal(sh_config_disabled(envp), cases[i].want);
    }
    assert_int_equal(sh_config_disabled(NULL), 0);
}

static void test_missing_file(void **state)
{
    struct sh_config c;
    (void)state;
    sh_config_defaults(&c);
    assert_int_equal(sh_config_load_file(&c, DIR "no_such_file.ini", err, sizeof err),
                     SH_ENOTFOUND);
    assert_string_equal(err, DIR "no_such_file.ini: cannot open: No such file or directory");
}

int main(void)
{
    struct CMUnitTest tests[64] = {
        cmocka_unit_test(test_builtin_defaults),   cmocka_unit_test(test_shipped_ini),
        cmocka_unit_test(test_auto_watermarks),    cmocka_unit_test(test_good_percent),
        cmocka_unit_test(test_good_suffix),        cmocka_unit_test(test_good_lists),
        cmocka_unit_test(test_syntax_details),     cmocka_unit_test(test_summary),
        cmocka_unit_test(test_bad_strings),        cmocka_unit_test(test_bad_combinations),
        cmocka_unit_test(test_env_overrides_file), cmocka_unit_test(test_env_errors),
        cmocka_unit_test(test_apply_env_atomic),   cmocka_unit_test(test_init_search_order),
        cmocka_unit_test(test_host_scope),         cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_missing_file),       cmocka_unit_test(test_node_scope_keys),
        cmocka_unit_test(test_device_values),      cmocka_unit_test(test_trace_alias),
    };
    size_t n = 0, nbad = sizeof bads / sizeof bads[0];
    while (tests[n].test_func) /* the named tests above, however many */
        n++;
    for (size_t i = 0; i < nbad; i++) {
        struct CMUnitTest t = cmocka_unit_test_prestate(test_bad_file, (void *)&bads[i]);
        t.name = bads[i].file;
        tests[n++] = t;
    }
    return _cmocka_run_group_tests("config", tests, n, NULL, NULL);
}
