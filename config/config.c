/* config.c — stagehand.ini, STAGEHAND_* overrides and the built-in defaults.
 *
 * One table, keys[], describes every key: section, name, type, where it lives in
 * struct sh_config, limits, default (as text, parsed like a user's value) and help.
 * Defaults, file parsing (inih, fed by a line-counting reader so every key knows its
 * line), environment overrides, the checks and the summary all walk that table.
 *
 * No shared state: the table is read-only and every function touches only the
 * caller's struct sh_config and buffers, so everything here is reentrant.
 */
#include "config/config.h"
#include "sh_err.h"

#include <ini.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define KB       (UINT64_C(1) << 10)
#define MB       (UINT64_C(1) << 20)
#define GB       (UINT64_C(1) << 30)
#define ANY_SIZE (UINT64_C(1) << 50) /* upper limit for sizes with no natural one */
#define MSG_MAX  SH_CONFIG_ERR_MAX
#define VAL_MAX  512 /* longest value accepted, after trimming */

enum type { T_BOOL, T_INT, T_ENUM, T_SIZE, T_LIST, T_STR };
enum pct_base { PCT_NONE, PCT_CARD, PCT_BUDGET, PCT_HOST, PCT_HOST_BUDGET };
/* F_AUTO: the value may be "auto" (an int: -1; a size: decided at run time) */
enum { F_POW2 = 1, F_INCREASING = 2, F_AUTO = 4 };
enum { SRC_DEFAULT = -1, SRC_ENV = -2 };

struct key {
    const char *section;
    const char *name;
    enum type type;
    size_t off;        /* offset of the field in struct sh_config */
    uint64_t min, max; /* value limits (sizes: bytes; lists: each item) */
    uint64_t unit;     /* sizes and lists: bytes per unit of a bare number */
    enum pct_base pct; /* sizes: what a percentage is of */
    unsigned flags;
    const char *const *choices; /* enums: names; the value is the index */
    const char *def;            /* default, as written in stagehand.ini */
    const char *label;          /* name in the summary; NULL = not shown */
    const char *unit_name;
    const char *help;
};

static const char *const sections[] = {"general", "budget",    "regions",  "pool",      "transfer",
                                       "policy",  "conductor", "tracking", "telemetry", "debug"};
#define NSECTIONS (sizeof sections / sizeof sections[0])

static const char *const log_levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const drain_modes[] = {"device", "tracked", NULL};
static const char *const evictions[] = {"lru", "learned", NULL};
static const char *const track_modes[] = {"auto", "cupti", "hooks", NULL};

#define AT(field) offsetof(struct sh_config, field)
#define BOOL(s, n, f, d, lab, h)                                                                   \
    {                                                                                              \
        .section = s, .name = n, .type = T_BOOL, .off = AT(f), .max = 1, .def = d, .label = lab,   \
        .unit_name = "bool", .help = h                                                             \
    }
#define INT(s, n, f, lo, hi, d, lab, u, h)                                                         \
    {                                                                                              \
        .section = s, .name = n, .type = T_INT, .off = AT(f), .min = lo, .max = hi, .unit = 1,     \
        .def = d, .label = lab, .unit_name = u, .help = h                                          \
    }
#define ENUM(s, n, f, ch, d, lab, h)                                                               \
    {                                                                                              \
        .section = s, .name = n, .type = T_ENUM, .off = AT(f), .choices = ch, .def = d,            \
        .label = lab, .unit_name = "choice", .help = h                                             \
    }
#define SIZE(s, n, f, un, base, lo, hi, fl, d, lab, h)                                             \
    {                                                                                              \
        .section = s, .name = n, .type = T_SIZE, .off = AT(f), .min = lo, .max = hi, .unit = un,   \
        .pct = base, .flags = fl, .def = d, .label = lab, .unit_name = (un) == MB ? "MB" : "KB",   \
        .help = h                                                                                  \
    }
#define LIST(s, n, f, un, lo, hi, fl, d, lab, u, h)                                                \
    {                                                                                              \
        .section = s, .name = n, .type = T_LIST, .off = AT(f), .min = lo, .max = hi, .unit = un,   \
        .flags = fl, .def = d, .label = lab, .unit_name = u, .help = h                             \
    }
#define STR(s, n, f, d, h)                                                                         \
    {                                                                                              \
        .section = s, .name = n, .type = T_STR, .off = AT(f), .def = d, .unit_name = "string",     \
        .help = h                                                                                  \
    }

/* Table order matters in one place: a size that is a percentage of another key
 * comes after that key (sh_config_resolve walks the table in order). */
static const struct key keys[] = {
    BOOL("general", "enabled", general.enabled, "true", NULL,
         "false makes the library a pure pass-through"),
    ENUM("general", "log_level", general.log_level, log_levels, "warn", NULL,
         "messages above this level are dropped"),
    {.section = "general",
     .name = "device",
     .type = T_INT,
     .off = AT(general.device),
     .max = 255,
     .unit = 1,
     .flags = F_AUTO,
     .def = "auto",
     .unit_name = "index",
     .help = "CUDA device the library manages; auto: the one current at the first allocation"},

    SIZE("budget", "vram_budget_mb", budget.vram_budget, MB, PCT_CARD, MB, ANY_SIZE, 0, "100%",
         "budget", "device memory stagehand may use; % of the card"),
    SIZE("budget", "vram_high_watermark_mb", budget.vram_high_watermark, MB, PCT_BUDGET, MB,
         ANY_SIZE, F_AUTO, "auto", "high",
         "above this, evict; % of the budget, or auto: only what would not fit"),
    SIZE("budget", "vram_low_watermark_mb", budget.vram_low_watermark, MB, PCT_BUDGET, 0, ANY_SIZE,
         F_AUTO, "auto", "low", "evict until below this; % of the budget, or auto: no lower"),
    SIZE("budget", "host_ram_budget_mb", budget.host_ram_budget, MB, PCT_HOST, MB, ANY_SIZE, 0,
         "50%", "host", "pinned host memory for evicted data; % of the machine's RAM"),

    SIZE("regions", "min_region_kb", regions.min_region, KB, PCT_NONE, 0, 1024 * GB, 0, "1024",
         "min_region", "smaller allocations pass through untouched"),
    SIZE("regions", "max_chunk_mb", regions.max_chunk, MB, PCT_NONE, 2 * MB, 4 * GB, F_POW2, "64",
         "chunk", "largest chunk of a region; a power of two"),
    SIZE("regions", "va_cache_mb", regions.va_cache, MB, PCT_NONE, 0, ANY_SIZE, 0, "4096", NULL,
         "virtual address space kept reserved for reuse"),
    SIZE("regions", "device_cache_mb", regions.device_cache, MB, PCT_BUDGET, 0, ANY_SIZE, 0, "1024",
         NULL,
         "device memory kept for reuse, freed regions and spare chunks together; % of "
         "the budget"),
    SIZE("regions", "suballoc_max_kb", regions.suballoc_max, KB, PCT_NONE, 0, GB, 0, "1024", NULL,
         "async/pluggable sizes up to this come from the sub-allocator"),

    LIST("pool", "pinned_pool_classes_mb", pool.classes_mb, MB, 1, 65536, F_POW2 | F_INCREASING,
         "1,4,16,64,256", "classes", "MB", "pinned slab sizes; increasing powers of two"),
    LIST("pool", "slabs_per_class", pool.slabs_per_class, 1, 0, 65536, 0, "64,16,8,4,2", "slabs",
         "slabs", "slabs per class: one value for all, or one per class"),
    SIZE("pool", "prepin_mb", pool.prepin, MB, PCT_HOST_BUDGET, 0, ANY_SIZE, 0, "256", NULL,
         "pinned at start; % of host_ram_budget_mb"),
    BOOL("pool", "grow_in_background", pool.grow_in_background, "true", NULL,
         "pin more slabs on a helper thread before they run out"),

    INT("transfer", "max_inflight_d2h", transfer.max_inflight_d2h, 1, 64, "2", "d2h", "copies",
        "device-to-host copies in flight at once"),
    INT("transfer", "max_inflight_h2d", transfer.max_inflight_h2d, 1, 64, "2", "h2d", "copies",
        "host-to-device copies in flight at once"),
    ENUM("transfer", "drain_mode", transfer.drain_mode, drain_modes, "device", "drain",
         "remap window waits for the whole device, or only tracked last uses"),
    INT("transfer", "batch_max", transfer.batch_max, 1, 4096, "16", NULL, "copies",
        "copies committed in one remap window"),

    ENUM("policy", "eviction", policy.eviction, evictions, "learned", "eviction",
         "victim choice: least recently used, or farthest next use from the trace"),
    INT("policy", "prefetch_window", policy.prefetch_window, 1, 1000000, "64", "window", "launches",
        "prefetch regions needed within this many launches"),
    BOOL("policy", "prefetch_enabled", policy.prefetch_enabled, "true", "prefetch",
         "copy regions back ahead of use and out ahead of need while kernels run"),

    BOOL("conductor", "enabled", conductor.enabled, "true", "conductor",
         "per-phase rules (backward pressure, optimizer protection, back-off)"),
    INT("conductor", "backward_pressure_pct", conductor.backward_pressure_pct, 1, 100, "80", NULL,
        "%", "in BACKWARD, evict above this % of the high watermark"),
    INT("conductor", "backward_prefetch_window", conductor.backward_prefetch_window, 0, 1000000,
        "1", NULL, "launches", "prefetch window in BACKWARD"),
    INT("conductor", "optimizer_max_inflight_h2d", conductor.optimizer_max_inflight_h2d, 0, 64, "1",
        NULL, "copies", "host-to-device copies in flight during OPTIMIZER"),
    INT("conductor", "contention_checks", conductor.contention_checks, 1, 1000, "3", NULL, "steps",
        "steps of copy/compute contention before prefetch backs off"),

    ENUM("tracking", "mode", tracking.mode, track_modes, "auto", "tracking",
         "how launches are seen: CUPTI callbacks, launch hooks, or auto"),
    STR("tracking", "cupti_path", tracking.cupti_path, "auto",
        "CUPTI library to dlopen; auto: the one of the program's CUDA runtime (12 or 13)"),

    BOOL("telemetry", "telemetry_enabled", telemetry.telemetry_enabled, "true", "telemetry",
         "collect counters"),
    STR("telemetry", "telemetry_file", telemetry.telemetry_file, "",
        "per-step JSONL file; empty = none"),
    INT("telemetry", "telemetry_interval", telemetry.telemetry_interval, 1, 1000000, "1", NULL,
        "steps", "write a JSONL record every this many steps"),
    BOOL("telemetry", "shm_enabled", telemetry.shm_enabled, "true", NULL,
         "publish live state for stagehand-top"),

    BOOL("debug", "debug_checksums", debug.debug_checksums, "false", "checksums",
         "checksum evicted regions; report bytes changed with no work issued against them"),
    BOOL("debug", "debug_verify_moves", debug.debug_verify_moves, "false", NULL,
         "compare both sides of every committed prefetch and early eviction; report lost writes"),
    STR("debug", "trace_file", debug.trace_file, "", "record the access trace here; empty = none"),
};
#define NKEYS (sizeof keys / sizeof keys[0])
_Static_assert(NKEYS <= SH_CONFIG_MAX_KEYS, "raise SH_CONFIG_MAX_KEYS");

/* ---- small helpers ------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static int say(char *buf, size_t len, const char *fmt, ...)
{
    if (buf && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, len, fmt, ap);
        va_end(ap);
    }
    return SH_EINVAL;
}

static void copy_str(char *dst, size_t len, const char *src)
{
    if (dst && len)
        snprintf(dst, len, "%s", src);
}

static void *field_of(struct sh_config *cfg, const struct key *k)
{
    return (char *)cfg + k->off;
}

static const void *cfield_of(const struct sh_config *cfg, const struct key *k)
{
    return (const char *)cfg + k->off;
}

static int find_section(const char *s, size_t n)
{
    while (n && isspace((unsigned char)*s))
        s++, n--;
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    for (size_t i = 0; i < NSECTIONS; i++)
        if (strlen(sections[i]) == n && strncasecmp(sections[i], s, n) == 0)
            return (int)i;
    return -1;
}

static int find_key(int sec, const char *name, size_t n)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].section, sections[sec]) == 0 && strlen(keys[i].name) == n &&
            strncasecmp(keys[i].name, name, n) == 0)
            return (int)i;
    return -1;
}

static int key_at(size_t off)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (keys[i].off == off)
            return (int)i;
    return -1;
}

/* A value in the key's unit: "9000", or "7372.8" when it is not whole. */
static void fmt_units(uint64_t v, uint64_t unit, char *buf, size_t len)
{
    if (v % unit == 0) {
        snprintf(buf, len, "%" PRIu64, v / unit);
        return;
    }
    snprintf(buf, len, "%.2f", (double)v / (double)unit);
    char *end = buf + strlen(buf);
    while (end > buf && end[-1] == '0')
        *--end = '\0';
}

static int is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* ---- value parsers: 0, or SH_EINVAL with the problem in msg --------------- */

enum { NUM_OK, NUM_NONE, NUM_BIG };

static int digits(const char **p, uint64_t *out)
{
    uint64_t v = 0;
    const char *s = *p;
    if (!isdigit((unsigned char)*s))
        return NUM_NONE;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return NUM_BIG;
        v = v * 10 + d;
    }
    *p = s;
    *out = v;
    return NUM_OK;
}

static int start_of_number(const char *v, char *msg, size_t len)
{
    if (!*v)
        return say(msg, len, "empty value");
    if (v[0] == '-' && isdigit((unsigned char)v[1]))
        return say(msg, len, "must not be negative: \"%s\"", v);
    return 0;
}

static int parse_uint(const char *v, uint64_t *x, char *msg, size_t len)
{
    const char *p = v;
    if (start_of_number(v, msg, len))
        return SH_EINVAL;
    int rc = digits(&p, x);
    if (rc == NUM_NONE)
        return say(msg, len, "not an integer: \"%s\"", v);
    if (rc == NUM_BIG)
        return say(msg, len, "number too large: \"%s\"", v);
    if (*p)
        return say(msg, len, "trailing characters after the number: \"%s\"", v);
    return 0;
}

static int check_range(const struct key *k, uint64_t x, char *msg, size_t len)
{
    uint64_t unit = k->type == T_SIZE ? k->unit : 1;
    const char *sfx = k->type == T_SIZE ? k->unit_name : "";
    const char *sp = *sfx ? " " : "";
    char a[40], b[40];
    fmt_units(x, unit, b, sizeof b);
    if (x < k->min) {
        fmt_units(k->min, unit, a, sizeof a);
        return say(msg, len, "must be at least %s%s%s (got %s%s%s)", a, sp, sfx, b, sp, sfx);
    }
    if (x > k->max) {
        fmt_units(k->max, unit, a, sizeof a);
        return say(msg, len, "must be at most %s%s%s (got %s%s%s)", a, sp, sfx, b, sp, sfx);
    }
    if ((k->flags & F_POW2) && !is_pow2(x))
        return say(msg, len, "must be a power of two (got %s%s%s)", b, sp, sfx);
    return 0;
}

static int bool_word(const char *v)
{
    static const char *const words[] = {"false", "true", "0", "1", "no", "yes", "off", "on"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcasecmp(v, words[i]) == 0)
            return (int)(i & 1);
    return -1;
}

static int parse_bool(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    (void)k;
    int b = bool_word(v);
    if (b < 0)
        return say(msg, len, "not a boolean: \"%s\" (use true/false, yes/no, on/off or 1/0)", v);
    *(int *)field = b;
    return 0;
}

static int parse_int(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    uint64_t x;
    if ((k->flags & F_AUTO) && strcasecmp(v, "auto") == 0) {
        *(int *)field = -1;
        return 0;
    }
    if ((k->flags & F_AUTO) && (parse_uint(v, &x, msg, len) || x > k->max))
        return say(msg, len, "must be auto or an integer from 0 to %" PRIu64 " (got \"%s\")",
                   k->max, v);
    if (parse_uint(v, &x, msg, len) || check_range(k, x, msg, len))
        return SH_EINVAL;
    *(int *)field = (int)x;
    return 0;
}

static int parse_enum(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    char names[128] = "";
    for (int i = 0; k->choices[i]; i++) {
        if (strcasecmp(v, k->choices[i]) == 0) {
            *(int *)field = i;
            return 0;
        }
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", k->choices[i]);
    }
    return say(msg, len, "must be one of %s (got \"%s\")", names, v);
}

/* Bytes per unit for a size suffix; 0 if unknown. A bare number is in the key's unit. */
static uint64_t unit_of(const char *sfx, uint64_t bare)
{
    static const struct {
        const char *name;
        uint64_t mult;
    } units[] = {{"b", 1},       {"k", KB},       {"kb", KB},      {"kib", KB}, {"m", MB},
                 {"mb", MB},     {"mib", MB},     {"g", GB},       {"gb", GB},  {"gib", GB},
                 {"t", GB * KB}, {"tb", GB * KB}, {"tib", GB * KB}};
    if (!*sfx)
        return bare;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(sfx, units[i].name) == 0)
            return units[i].mult;
    return 0;
}

/* "12", "12.5", then optional blanks; the fraction keeps at most 6 digits. */
static int size_number(const char **p, uint64_t *ip, uint64_t *frac, uint64_t *scale)
{
    int rc = digits(p, ip);
    *frac = 0;
    *scale = 1;
    if (rc != NUM_OK || **p != '.')
        return rc;
    if (!isdigit((unsigned char)(*p)[1]))
        return NUM_NONE;
    for ((*p)++; isdigit((unsigned char)**p); (*p)++)
        if (*scale < 1000000)
            *frac = *frac * 10 + (uint64_t)(**p - '0'), *scale *= 10;
    return NUM_OK;
}

static int size_pct(const struct key *k, const char *v, const char *p, double pct,
                    struct sh_size_opt *s, char *msg, size_t len)
{
    if (p[1])
        return say(msg, len, "trailing characters after the percentage: \"%s\"", v);
    if (k->pct == PCT_NONE)
        return say(msg, len, "a percentage is not allowed here: \"%s\"", v);
    if (pct > 100.0)
        return say(msg, len, "percentage above 100%%: \"%s\"", v);
    s->is_pct = 1;
    s->pct = pct;
    return 0;
}

static int size_text(const struct key *k, const char *v, struct sh_size_opt *s, char *msg,
                     size_t len)
{
    uint64_t ip, frac, scale;
    const char *p = v;
    if ((k->flags & F_AUTO) && strcmp(v, "auto") == 0) {
        s->is_auto = 1;
        return 0;
    }
    if (start_of_number(v, msg, len))
        return SH_EINVAL;
    int rc = size_number(&p, &ip, &frac, &scale);
    if (rc == NUM_NONE)
        return say(msg, len, "not a size: \"%s\"", v);
    if (rc == NUM_BIG)
        return say(msg, len, "number too large: \"%s\"", v);
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '%')
        return size_pct(k, v, p, (double)ip + (double)frac / (double)scale, s, msg, len);
    uint64_t mult = unit_of(p, k->unit);
    if (!mult)
        return say(msg, len, "unknown unit \"%s\" in \"%s\" (use B, KB, MB, GB, TB or %%)", p, v);
    if (ip > (UINT64_MAX - mult) / mult)
        return say(msg, len, "number too large: \"%s\"", v);
    s->bytes = ip * mult + frac * mult / scale;
    return 0;
}

static int parse_size(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    struct sh_size_opt s = {0, 0.0, 0, 0};
    if (size_text(k, v, &s, msg, len))
        return SH_EINVAL;
    if (!s.is_pct && !s.is_auto && check_range(k, s.bytes, msg, len))
        return SH_EINVAL;
    *(struct sh_size_opt *)field = s;
    return 0;
}

static int list_item(const struct key *k, const char *item, struct sh_config_list *l, char *msg,
                     size_t len)
{
    uint64_t x;
    if (l->n == SH_CONFIG_MAX_LIST)
        return say(msg, len, "too many values (at most %d)", SH_CONFIG_MAX_LIST);
    if (!*item)
        return say(msg, len, "empty value in the list");
    if (parse_uint(item, &x, msg, len) || check_range(k, x, msg, len))
        return SH_EINVAL;
    if ((k->flags & F_INCREASING) && l->n && x <= l->v[l->n - 1])
        return say(msg, len, "values must be strictly increasing (%" PRIu64 " after %" PRIu32 ")",
                   x, l->v[l->n - 1]);
    l->v[l->n++] = (uint32_t)x;
    return 0;
}

static int parse_list(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    struct sh_config_list l = {0, {0}};
    char item[VAL_MAX];
    if (!*v)
        return say(msg, len, "empty value");
    for (const char *p = v;; p++) {
        size_t n = strcspn(p, ",");
        const char *s = p, *e = p + n;
        while (s < e && isspace((unsigned char)*s))
            s++;
        while (e > s && isspace((unsigned char)e[-1]))
            e--;
        snprintf(item, sizeof item, "%.*s", (int)(e - s), s);
        if (list_item(k, item, &l, msg, len))
            return SH_EINVAL;
        p += n;
        if (!*p)
            break;
    }
    *(struct sh_config_list *)field = l;
    return 0;
}

static int parse_str(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    (void)k;
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"')
        v++, n -= 2;
    if (n >= SH_CONFIG_STR_MAX)
        return say(msg, len, "too long (at most %d characters)", SH_CONFIG_STR_MAX - 1);
    snprintf(field, SH_CONFIG_STR_MAX, "%.*s", (int)n, v);
    return 0;
}

typedef int (*parse_fn)(const struct key *k, const char *v, void *field, char *msg, size_t len);
static const parse_fn parsers[] = {
    [T_BOOL] = parse_bool, [T_INT] = parse_int,   [T_ENUM] = parse_enum,
    [T_SIZE] = parse_size, [T_LIST] = parse_list, [T_STR] = parse_str,
};

/* Sets key k from text (blanks around it ignored). */
static int apply(struct sh_config *cfg, int k, const char *value, char *msg, size_t len)
{
    char v[VAL_MAX];
    size_t n;
    while (isspace((unsigned char)*value))
        value++;
    n = strlen(value);
    while (n && isspace((unsigned char)value[n - 1]))
        n--;
    if (n >= sizeof v)
        return say(msg, len, "value too long (at most %zu characters)", sizeof v - 1);
    memcpy(v, value, n);
    v[n] = '\0';
    return parsers[keys[k].type](&keys[k], v, field_of(cfg, &keys[k]), msg, len);
}

/* ---- origins -------------------------------------------------------------- */

static void env_name(const struct key *k, char *buf, size_t len)
{
    int n = snprintf(buf, len, "STAGEHAND_%s_%s", k->section, k->name);
    for (int i = 0; i < n && (size_t)i < len; i++)
        buf[i] = (char)toupper((unsigned char)buf[i]);
}

static void origin_text(const struct sh_config *cfg, int k, char *buf, size_t len)
{
    const struct sh_config_origin *o = &cfg->origin_[k];
    char name[96];
    if (o->src >= 0 && o->src < SH_CONFIG_MAX_FILES) {
        snprintf(buf, len, "%s:%d", cfg->files_[o->src], (int)o->line);
    } else if (o->src == SRC_ENV) {
        env_name(&keys[k], name, sizeof name);
        snprintf(buf, len, "env %s", name);
    } else {
        snprintf(buf, len, "defaults");
    }
}

/* "where: key: problem" for key k, where being the place that set it. */
__attribute__((format(printf, 5, 6))) static int
blame(const struct sh_config *cfg, int k, char *err, size_t errlen, const char *fmt, ...)
{
    char where[SH_CONFIG_STR_MAX + 16], msg[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    origin_text(cfg, k, where, sizeof where);
    return say(err, errlen, "%s: %s: %s", where, keys[k].name, msg);
}

static int file_slot(struct sh_config *cfg, const char *name)
{
    for (int i = 0; i < SH_CONFIG_MAX_FILES; i++) {
        if (!cfg->files_[i][0])
            copy_str(cfg->files_[i], SH_CONFIG_STR_MAX, name);
        if (strncmp(cfg->files_[i], name, SH_CONFIG_STR_MAX - 1) == 0)
            return i;
    }
    return -1;
}

/* ---- defaults ------------------------------------------------------------- */

void sh_config_defaults(struct sh_config *cfg)
{
    char msg[MSG_MAX];
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < NKEYS; i++) {
        apply(cfg, (int)i, keys[i].def, msg, sizeof msg); /* the unit test proves these parse */
        cfg->origin_[i] = (struct sh_config_origin){SRC_DEFAULT, 0};
    }
}

/* ---- INI files ------------------------------------------------------------ */

struct parse {
    struct sh_config *cfg;
    const char *name; /* the file's name in messages */
    int file;         /* its slot in cfg->files_ */
    FILE *fp;         /* the source: fp, or else text */
    const char *text;
    int line;     /* line being parsed, from 1 */
    int err_line; /* line of the first error, 0 = none yet */
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 3, 4))) static int fail(struct parse *p, const char *subject,
                                                      const char *fmt, ...)
{
    char msg[MSG_MAX];
    va_list ap;
    if (p->err_line)
        return 0;
    p->err_line = p->line;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    say(p->err, p->errlen, "%s:%d: %s: %s", p->name, p->line, subject, msg);
    return 0;
}

static int next_char(struct parse *p)
{
    if (p->fp)
        return getc(p->fp);
    if (!*p->text)
        return EOF;
    return (unsigned char)*p->text++;
}

/* inih treats an indented line as the continuation of the previous value; we do not
 * want that surprise, so indentation is dropped here and every line stands alone. */
static void tidy_line(struct parse *p, char *buf)
{
    size_t skip = 0;
    if (p->line == 1 && strncmp(buf, "\xEF\xBB\xBF", 3) == 0)
        skip = 3;
    while (isspace((unsigned char)buf[skip]))
        skip++;
    memmove(buf, buf + skip, strlen(buf + skip) + 1);
    if (buf[0] != '[')
        return;
    const char *end = strchr(buf, ']');
    char name[SH_CONFIG_STR_MAX];
    if (!end || find_section(buf + 1, (size_t)(end - buf - 1)) >= 0)
        return;
    snprintf(name, sizeof name, "%.*s", (int)(end - buf + 1), buf);
    fail(p, name, "unknown section");
}

/* inih's reader: one line per call, so our count matches inih's. */
static char *read_line(char *buf, int num, void *stream)
{
    struct parse *p = stream;
    int n = 0, c = EOF, nul = 0;
    while (n < num - 1) {
        c = next_char(p);
        if (c == EOF || c == '\n')
            break;
        if (c == '\0' && !nul)
            nul = n + 1;
        buf[n++] = (char)c;
    }
    if (n == 0 && c == EOF)
        return NULL;
    buf[n] = '\0';
    p->line++;
    /* A NUL would silently cut the value short: the line is refused instead. */
    if (nul) {
        fail(p, "line", "holds a NUL byte at column %d", nul);
        buf[0] = '\0';
    }
    if (n == num - 1 && c != EOF && c != '\n' && (c = next_char(p)) != '\n' && c != EOF) {
        while ((c = next_char(p)) != '\n' && c != EOF)
            ;
        fail(p, "line", "too long (at most %d characters)", num - 1);
        buf[0] = '\0';
    }
    tidy_line(p, buf);
    return buf;
}

static int on_pair(void *user, const char *section, const char *name, const char *value)
{
    struct parse *p = user;
    char msg[MSG_MAX];
    if (!name || !value)
        return 1;
    if (!*section)
        return fail(p, name, "key outside any [section]");
    int sec = find_section(section, strlen(section));
    if (sec < 0)
        return fail(p, name, "in unknown section [%s]", section);
    int k = find_key(sec, name, strlen(name));
    if (k < 0)
        return fail(p, name, "unknown key in [%s]", sections[sec]);
    if (apply(p->cfg, k, value, msg, sizeof msg))
        return fail(p, name, "%s", msg);
    p->cfg->origin_[k] = (struct sh_config_origin){(int16_t)p->file, p->line};
    return 1;
}

static int load(struct sh_config *cfg, const char *name, FILE *fp, const char *text, char *err,
                size_t errlen)
{
    struct sh_config tmp = *cfg;
    struct parse p = {&tmp, name, 0, fp, text, 0, 0, err, errlen};
    p.file = file_slot(&tmp, name);
    if (p.file < 0)
        return say(err, errlen, "%s: too many configuration files (at most %d)", name,
                   SH_CONFIG_MAX_FILES);
    int rc = ini_parse_stream(read_line, &p, on_pair, &p);
    if (rc > 0 && (!p.err_line || rc < p.err_line))
        return say(err, errlen, "%s:%d: syntax error: expected \"[section]\" or \"key = value\"",
                   name, rc);
    if (p.err_line)
        return SH_EINVAL;
    if (rc < 0) {
        say(err, errlen, "%s: out of memory while parsing", name);
        return SH_ENOMEM;
    }
    if (fp && ferror(fp))
        return say(err, errlen, "%s: read error", name);
    *cfg = tmp;
    return 0;
}

static int open_failed(const char *who, const char *path, char *err, size_t errlen)
{
    char buf[128];
    const char *why = errno == ELOOP ? "it is a symbolic link; name the file itself"
                                     : strerror_r(errno, buf, sizeof buf);
    if (who)
        say(err, errlen, "%s: cannot open %s: %s", who, path, why);
    else
        say(err, errlen, "%s: cannot open: %s", path, why);
    return SH_ENOTFOUND;
}

/* Secure execution (setuid, setgid, capabilities): the environment belongs to
 * a less trusted user. Weak so that a test can stand in for the kernel. */
__attribute__((weak)) int sh_config_secure(void)
{
    return getauxval(AT_SECURE) != 0;
}

/* Why a configuration file must not be trusted, or NULL when it may be: it can
 * name a library to load and files to truncate, so only its reader's own user or
 * root may own it, nobody else may write it, and under secure execution only
 * root may own it. */
static int null_device(const struct stat *st)
{
    return S_ISCHR(st->st_mode) && major(st->st_rdev) == 1 && minor(st->st_rdev) == 3;
}

static const char *distrust_type(const struct stat *st)
{
    if (S_ISREG(st->st_mode) || null_device(st)) /* /dev/null: no settings, the defaults */
        return NULL;
    return S_ISDIR(st->st_mode) ? "is a directory, not a configuration file" : "not a regular file";
}

static const char *distrust(const struct stat *st, int secure, char *buf, size_t len)
{
    uid_t me = geteuid();
    if (!S_ISREG(st->st_mode))
        return distrust_type(st); /* the null device is trusted: it says nothing */
    if (secure && st->st_uid != 0)
        snprintf(buf, len, "owned by uid %u, not root, in secure-execution mode",
                 (unsigned)st->st_uid);
    else if (st->st_uid != me && st->st_uid != 0)
        snprintf(buf, len, "owned by uid %u, neither you (uid %u) nor root", (unsigned)st->st_uid,
                 (unsigned)me);
    else if (st->st_mode & (S_IWGRP | S_IWOTH))
        snprintf(buf, len, "writable by %s (mode %04o); chmod go-w it",
                 st->st_mode & S_IWOTH ? "every user" : "its group",
                 (unsigned)(st->st_mode & 07777));
    else
        return NULL;
    return buf;
}

enum trust { NAMED, FOUND, FOUND_SECURE };

/* Opens a configuration file without blocking on a FIFO and refuses anything but a
 * regular file. One the library finds by itself (FOUND) is opened without following
 * a final symbolic link and refused when another user controls it; under secure
 * execution such a file is skipped instead, as the environment is. A file a tool
 * is told to read (NAMED) is only checked to be a file. *fp is NULL when there is
 * nothing to read. */
static int open_config(const char *who, const char *path, enum trust t, FILE **fp, char *err,
                       size_t errlen)
{
    struct stat st;
    char buf[128];
    *fp = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | (t == NAMED ? 0 : O_NOFOLLOW));
    if (fd < 0)
        return errno == ENOENT && t != NAMED && !who ? 0 : open_failed(who, path, err, errlen);
    const char *why = fstat(fd, &st) ? strerror_r(errno, buf, sizeof buf)
                      : t == NAMED   ? distrust_type(&st)
                                     : distrust(&st, t == FOUND_SECURE, buf, sizeof buf);
    if (!why && !(*fp = fdopen(fd, "r")))
        why = strerror_r(errno, buf, sizeof buf);
    if (!why)
        return 0;
    close(fd);
    if (t == FOUND_SECURE)
        return 0;
    if (who)
        return say(err, errlen, "%s: refused %s: %s", who, path, why);
    return say(err, errlen, "%s: refused: %s", path, why);
}

int sh_config_load_file(struct sh_config *cfg, const char *path, char *err, size_t errlen)
{
    FILE *fp;
    int rc = open_config(NULL, path, NAMED, &fp, err, errlen);
    if (rc)
        return rc;
    rc = load(cfg, path, fp, NULL, err, errlen);
    fclose(fp);
    return rc;
}

int sh_config_load_string(struct sh_config *cfg, const char *name, const char *text, char *err,
                          size_t errlen)
{
    return load(cfg, name ? name : "(string)", NULL, text ? text : "", err, errlen);
}

/* ---- environment ---------------------------------------------------------- */

/* Edit distance between a[0..n) (any case) and the lower-case word b; 9 if long. */
static int distance(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b);
    int d[17][17];
    if (n > 16 || m > 16)
        return 9;
    for (size_t i = 0; i <= n; i++)
        for (size_t j = 0; j <= m; j++) {
            if (!i || !j) {
                d[i][j] = (int)(i + j);
                continue;
            }
            int sub = d[i - 1][j - 1] + (tolower((unsigned char)a[i - 1]) != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[n][m];
}

/* Any section's key named s[0..n), or -1. */
static int key_anywhere(const char *s, size_t n)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strlen(keys[i].name) == n && strncasecmp(keys[i].name, s, n) == 0)
            return (int)i;
    return -1;
}

/* STAGEHAND_NAME matched no section. It is an error, like an unknown key, when it
 * was meant as a key: the words after its first name a key
 * (STAGEHAND_BUDGT_VRAM_BUDGET_MB), the whole name does (STAGEHAND_LOG_LEVEL), or
 * its first word is a letter or two from a section's name. Other names
 * (STAGEHAND_CONFIG, STAGEHAND_TRACE, a script's own) are left alone. */
static int misspelt(const char *entry, size_t len, char *err, size_t errlen)
{
    const char *name = entry + 10, *us = memchr(name, '_', len - 10);
    size_t n = len - 10, first = us ? (size_t)(us - name) : n;
    int k = us ? key_anywhere(us + 1, n - first - 1) : -1;
    if (k < 0)
        k = key_anywhere(name, n);
    if (k >= 0) {
        char want[96];
        int w = snprintf(want, sizeof want, "STAGEHAND_%s_%s", keys[k].section, keys[k].name);
        for (int i = 0; i < w && (size_t)i < sizeof want; i++)
            want[i] = (char)toupper((unsigned char)want[i]);
        return say(err, errlen, "env %.*s: not a key; did you mean %s?", (int)len, entry, want);
    }
    for (size_t s = 0; s < NSECTIONS; s++) {
        int d = distance(name, first, sections[s]);
        if (d > 0 && d <= (strlen(sections[s]) >= 6 ? 2 : 1))
            return say(err, errlen, "env %.*s: unknown section \"%.*s\" (did you mean %s?)",
                       (int)len, entry, (int)first, name, sections[s]);
    }
    return 0;
}

static int env_one(struct sh_config *cfg, const char *entry, char *err, size_t errlen)
{
    const char *eq = strchr(entry, '=');
    if (strncmp(entry, "STAGEHAND_", 10) != 0 || !eq)
        return 0;
    const char *name = entry + 10;
    for (size_t s = 0; s < NSECTIONS; s++) {
        size_t sl = strlen(sections[s]);
        if (strncasecmp(name, sections[s], sl) != 0 || name[sl] != '_' || name + sl >= eq)
            continue;
        const char *key = name + sl + 1;
        int k = find_key((int)s, key, (size_t)(eq - key));
        char msg[MSG_MAX], lower[64];
        int n = snprintf(lower, sizeof lower, "%.*s", (int)(eq - key), key);
        for (int i = 0; i < n && (size_t)i < sizeof lower; i++)
            lower[i] = (char)tolower((unsigned char)lower[i]);
        if (k < 0)
            return say(err, errlen, "env %.*s: %s: unknown key in [%s]", (int)(eq - entry), entry,
                       lower, sections[s]);
        if (apply(cfg, k, eq + 1, msg, sizeof msg))
            return say(err, errlen, "env %.*s: %s: %s", (int)(eq - entry), entry, lower, msg);
        cfg->origin_[k] = (struct sh_config_origin){SRC_ENV, 0};
        return 0;
    }
    return misspelt(entry, (size_t)(eq - entry), err, errlen);
}

int sh_config_apply_env(struct sh_config *cfg, char *const *envp, char *err, size_t errlen)
{
    struct sh_config tmp = *cfg;
    for (char *const *e = envp; e && *e; e++)
        if (env_one(&tmp, *e, err, errlen))
            return SH_EINVAL;
    *cfg = tmp;
    return 0;
}

static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            found = *e + n + 1;
    return found;
}

int sh_config_disabled(char *const *envp)
{
    const char *v = env_get(envp, "STAGEHAND_DISABLE");
    return v && *v && bool_word(v) != 0;
}

/* ---- resolve and combinations --------------------------------------------- */

static uint64_t pct_base(const struct sh_config *cfg, enum pct_base b, uint64_t card, uint64_t host)
{
    switch (b) {
    case PCT_CARD:
        return card;
    case PCT_HOST:
        return host;
    case PCT_BUDGET:
        return cfg->budget.vram_budget.bytes;
    case PCT_HOST_BUDGET:
        return cfg->budget.host_ram_budget.bytes;
    default:
        return 0;
    }
}

static int resolve_size(struct sh_config *cfg, int k, uint64_t card, uint64_t host, char *err,
                        size_t errlen)
{
    static const char *const base_name[] = {"", "the card's memory size", "vram_budget_mb",
                                            "the machine's RAM size", "host_ram_budget_mb"};
    struct sh_size_opt *s = field_of(cfg, &keys[k]);
    char msg[MSG_MAX];
    if (s->is_auto) { /* decided at run time, never above the budget */
        s->bytes = pct_base(cfg, keys[k].pct, card, host);
        return 0;
    }
    if (s->is_pct) {
        uint64_t base = pct_base(cfg, keys[k].pct, card, host);
        if (!base)
            return blame(cfg, k, err, errlen, "a percentage needs %s, which is unknown",
                         base_name[keys[k].pct]);
        s->bytes = (uint64_t)((double)base * s->pct / 100.0 + 0.5);
    }
    if (check_range(&keys[k], s->bytes, msg, sizeof msg) == 0)
        return 0;
    if (s->is_pct)
        return blame(cfg, k, err, errlen, "%s, from %g%%", msg, s->pct);
    return blame(cfg, k, err, errlen, "%s", msg);
}

/* Key value as a number: sizes in bytes, lists their largest item in bytes. */
static uint64_t key_number(const struct sh_config *cfg, int k, uint64_t *unit)
{
    const void *f = cfield_of(cfg, &keys[k]);
    const struct sh_config_list *l = f;
    const int *i = f;
    uint64_t v = 0;
    *unit = keys[k].type == T_INT ? 1 : keys[k].unit;
    if (keys[k].type == T_SIZE)
        return ((const struct sh_size_opt *)f)->bytes;
    if (keys[k].type == T_INT)
        return (uint64_t)*i;
    for (uint32_t j = 0; j < l->n; j++)
        v = l->v[j] > v ? l->v[j] : v;
    return v * *unit;
}

/* Blames the explicit one of two keys: a unless only b was set by the user. */
static int blame_a(const struct sh_config *cfg, int a, int b)
{
    return !(cfg->origin_[a].src == SRC_DEFAULT && cfg->origin_[b].src != SRC_DEFAULT);
}

static int is_auto(const struct sh_config *cfg, int k)
{
    return keys[k].type == T_SIZE &&
           ((const struct sh_size_opt *)cfield_of(cfg, &keys[k]))->is_auto;
}

struct rel {
    size_t a, b; /* offsets of the keys: a < b (strict) or a <= b */
    int strict;
};

static int check_rel(const struct sh_config *cfg, const struct rel *r, char *err, size_t errlen)
{
    int a = key_at(r->a), b = key_at(r->b);
    if (is_auto(cfg, a) || is_auto(cfg, b))
        return 0; /* an auto value keeps every relation by construction */
    uint64_t ua, ub, va = key_number(cfg, a, &ua), vb = key_number(cfg, b, &ub);
    char sa[40], sb[40];
    if (r->strict ? va < vb : va <= vb)
        return 0;
    fmt_units(va, ua, sa, sizeof sa);
    fmt_units(vb, ub, sb, sizeof sb);
    if (blame_a(cfg, a, b))
        return blame(cfg, a, err, errlen, "must %s %s (%s %s %s)",
                     r->strict ? "be below" : "not exceed", keys[b].name, sa,
                     r->strict ? ">=" : ">", sb);
    return blame(cfg, b, err, errlen, "must %s %s (%s %s %s)",
                 r->strict ? "be above" : "be at least", keys[a].name, sb, r->strict ? "<=" : "<",
                 sa);
}

static int check_machine(const struct sh_config *cfg, uint64_t card, uint64_t host, char *err,
                         size_t errlen)
{
    char a[40], b[40];
    uint64_t v = cfg->budget.vram_budget.bytes, h = cfg->budget.host_ram_budget.bytes;
    if (card && v > card) {
        fmt_units(v, MB, a, sizeof a);
        fmt_units(card, MB, b, sizeof b);
        return blame(cfg, key_at(AT(budget.vram_budget)), err, errlen,
                     "must not exceed the card's memory (%s > %s)", a, b);
    }
    if (host && h > host) {
        fmt_units(h, MB, a, sizeof a);
        fmt_units(host, MB, b, sizeof b);
        return blame(cfg, key_at(AT(budget.host_ram_budget)), err, errlen,
                     "must not exceed the machine's RAM (%s > %s)", a, b);
    }
    return 0;
}

static int check_slabs(struct sh_config *cfg, char *err, size_t errlen)
{
    int c = key_at(AT(pool.classes_mb)), s = key_at(AT(pool.slabs_per_class));
    struct sh_config_list *sl = &cfg->pool.slabs_per_class;
    uint32_t nc = cfg->pool.classes_mb.n, ns = sl->n;
    if (ns == 1) {
        for (uint32_t i = 1; i < nc; i++)
            sl->v[i] = sl->v[0];
        sl->n = nc;
        return 0;
    }
    if (ns == nc)
        return 0;
    if (blame_a(cfg, s, c))
        return blame(cfg, s, err, errlen,
                     "has %" PRIu32 " values for %" PRIu32 " pinned_pool_classes_mb classes "
                     "(give one value, or one per class)",
                     ns, nc);
    return blame(cfg, c, err, errlen,
                 "has %" PRIu32 " classes but slabs_per_class has %" PRIu32
                 " values (give one value, or one per class)",
                 nc, ns);
}

static const struct rel rels[] = {
    {AT(budget.vram_high_watermark), AT(budget.vram_budget), 0},
    {AT(budget.vram_low_watermark), AT(budget.vram_high_watermark), 1},
    {AT(pool.prepin), AT(budget.host_ram_budget), 0},
    {AT(regions.max_chunk), AT(pool.classes_mb), 0},
    {AT(conductor.backward_prefetch_window), AT(policy.prefetch_window), 0},
    {AT(conductor.optimizer_max_inflight_h2d), AT(transfer.max_inflight_h2d), 0},
};

/* A key whose value is known before the machine is: not a percentage. */
static int absolute(const struct sh_config *cfg, int k)
{
    return keys[k].type != T_SIZE ||
           !((const struct sh_size_opt *)cfield_of(cfg, &keys[k]))->is_pct;
}

/* The relations between keys that are both known at load time, so that a
 * contradiction written in the file stops the program before it starts. */
static int check_static(const struct sh_config *cfg, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof rels / sizeof rels[0]; i++)
        if (absolute(cfg, key_at(rels[i].a)) && absolute(cfg, key_at(rels[i].b)) &&
            check_rel(cfg, &rels[i], err, errlen))
            return SH_EINVAL;
    return 0;
}

int sh_config_resolve(struct sh_config *cfg, uint64_t card_bytes, uint64_t host_ram_bytes,
                      char *err, size_t errlen)
{
    struct sh_config tmp = *cfg;
    for (size_t i = 0; i < NKEYS; i++)
        if (keys[i].type == T_SIZE &&
            resolve_size(&tmp, (int)i, card_bytes, host_ram_bytes, err, errlen))
            return SH_EINVAL;
    if (check_machine(&tmp, card_bytes, host_ram_bytes, err, errlen))
        return SH_EINVAL;
    for (size_t i = 0; i < sizeof rels / sizeof rels[0]; i++)
        if (check_rel(&tmp, &rels[i], err, errlen))
            return SH_EINVAL;
    if (check_slabs(&tmp, err, errlen))
        return SH_EINVAL;
    tmp.resolved = 1;
    *cfg = tmp;
    return 0;
}

/* ---- start-up ------------------------------------------------------------- */

static int load_search(struct sh_config *cfg, char *const *envp, int secure, char *used,
                       size_t usedlen, char *err, size_t errlen)
{
    const char *path = env_get(envp, "STAGEHAND_CONFIG");
    const char *who = "env STAGEHAND_CONFIG";
    FILE *fp;
    if (!path || !*path) {
        path = "stagehand.ini";
        who = NULL;
    }
    int rc = open_config(who, path, secure ? FOUND_SECURE : FOUND, &fp, err, errlen);
    if (rc || !fp)
        return rc;
    rc = load(cfg, path, fp, NULL, err, errlen);
    fclose(fp);
    if (!rc)
        copy_str(used, usedlen, path);
    return rc;
}

int sh_config_load(struct sh_config *cfg, char *const *envp, char *used_path, size_t pathlen,
                   char *err, size_t errlen)
{
    int rc, secure = sh_config_secure();
    sh_config_defaults(cfg);
    copy_str(used_path, pathlen, "");
    if (secure)
        envp = NULL; /* another user wrote it: not one STAGEHAND_* name is read */
    if ((rc = load_search(cfg, envp, secure, used_path, pathlen, err, errlen)) != 0)
        return rc;
    if ((rc = sh_config_apply_env(cfg, envp, err, errlen)) != 0)
        return rc;
    return check_static(cfg, err, errlen);
}

int sh_config_init(struct sh_config *cfg, char *const *envp, uint64_t card_bytes,
                   uint64_t host_ram_bytes, char *used_path, size_t pathlen, char *err,
                   size_t errlen)
{
    int rc = sh_config_load(cfg, envp, used_path, pathlen, err, errlen);
    if (rc != 0)
        return rc;
    return sh_config_resolve(cfg, card_bytes, host_ram_bytes, err, errlen);
}

/* ---- reporting ------------------------------------------------------------ */

static void fmt_list(const struct sh_config_list *l, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < l->n && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRIu32, i ? "," : "", l->v[i]);
}

static void fmt_value(const struct sh_config *cfg, const struct key *k, char *buf, size_t len)
{
    const void *f = cfield_of(cfg, k);
    const struct sh_size_opt *s = f;
    switch (k->type) {
    case T_BOOL:
        snprintf(buf, len, "%s", *(const int *)f ? "on" : "off");
        break;
    case T_INT:
        if (*(const int *)f < 0)
            snprintf(buf, len, "auto");
        else
            snprintf(buf, len, "%d", *(const int *)f);
        break;
    case T_ENUM:
        snprintf(buf, len, "%s", k->choices[*(const int *)f]);
        break;
    case T_SIZE:
        if (s->is_auto) {
            snprintf(buf, len, "auto");
            break;
        }
        if (s->is_pct && !cfg->resolved) {
            snprintf(buf, len, "%g%%", s->pct);
            break;
        }
        fmt_units(s->bytes, k->unit, buf, len);
        snprintf(buf + strlen(buf), len - strlen(buf), "%s", k->unit_name);
        break;
    case T_LIST:
        fmt_list(f, buf, len);
        break;
    case T_STR:
        snprintf(buf, len, "%s", *(const char *)f ? (const char *)f : "-");
        break;
    }
}

void sh_config_summary(const struct sh_config *cfg, char *buf, size_t len)
{
    size_t n = 0;
    char v[SH_CONFIG_STR_MAX];
    if (!buf || !len)
        return;
    buf[0] = '\0';
    for (size_t i = 0; i < NKEYS && n < len; i++) {
        if (!keys[i].label)
            continue;
        fmt_value(cfg, &keys[i], v, sizeof v);
        n += (size_t)snprintf(buf + n, len - n, "%s%s=%s", n ? " " : "", keys[i].label, v);
    }
}

int sh_config_origin(const struct sh_config *cfg, const char *section, const char *key, char *buf,
                     size_t len)
{
    int sec = find_section(section, strlen(section));
    int k = sec < 0 ? -1 : find_key(sec, key, strlen(key));
    if (k < 0)
        return SH_ENOTFOUND;
    origin_text(cfg, k, buf, len);
    return 0;
}

int sh_config_key_at(size_t index, struct sh_config_key_info *out)
{
    if (index >= NKEYS)
        return SH_ENOTFOUND;
    *out = (struct sh_config_key_info){keys[index].section, keys[index].name, keys[index].unit_name,
                                       keys[index].def, keys[index].help};
    return 0;
}
