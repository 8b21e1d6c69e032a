/* values.c — text to values: the parsers of bool, int, enum, size, list and
 * string keys, each value checked against its key's limits, and the number
 * formatting every message uses. A parser writes its key's member only when the
 * whole value is good.
 *
 * No state: every function works on the caller's struct and buffers, so all of
 * it is reentrant.
 */
#include "config/config_int.h"
#include "sh_err.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

void sh_cfg_copy(char *dst, size_t len, const char *src)
{
    if (dst && len)
        snprintf(dst, len, "%s", src);
}

/* A value in the key's unit: "9000", or "7372.8" when it is not whole. */
void sh_cfg_fmt_units(uint64_t v, uint64_t unit, char *buf, size_t len)
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
        return sh_cfg_say(msg, len, "empty value");
    if (v[0] == '-' && isdigit((unsigned char)v[1]))
        return sh_cfg_say(msg, len, "must not be negative: \"%s\"", v);
    return 0;
}

static int parse_uint(const char *v, uint64_t *x, char *msg, size_t len)
{
    const char *p = v;
    if (start_of_number(v, msg, len))
        return SH_EINVAL;
    int rc = digits(&p, x);
    if (rc == NUM_NONE)
        return sh_cfg_say(msg, len, "not an integer: \"%s\"", v);
    if (rc == NUM_BIG)
        return sh_cfg_say(msg, len, "number too large: \"%s\"", v);
    if (*p)
        return sh_cfg_say(msg, len, "trailing characters after the number: \"%s\"", v);
    return 0;
}

int sh_cfg_check_range(const struct key *k, uint64_t x, char *msg, size_t len)
{
    uint64_t unit = k->type == T_SIZE ? k->unit : 1;
    const char *sfx = k->type == T_SIZE ? k->unit_name : "";
    const char *sp = *sfx ? " " : "";
    char a[40], b[40];
    sh_cfg_fmt_units(x, unit, b, sizeof b);
    if (x < k->min) {
        sh_cfg_fmt_units(k->min, unit, a, sizeof a);
        return sh_cfg_say(msg, len, "must be at least %s%s%s (got %s%s%s)", a, sp, sfx, b, sp, sfx);
    }
    if (x > k->max) {
        sh_cfg_fmt_units(k->max, unit, a, sizeof a);
        return sh_cfg_say(msg, len, "must be at most %s%s%s (got %s%s%s)", a, sp, sfx, b, sp, sfx);
    }
    if ((k->flags & F_POW2) && !is_pow2(x))
        return sh_cfg_say(msg, len, "must be a power of two (got %s%s%s)", b, sp, sfx);
    return 0;
}

int sh_cfg_bool_word(const char *v)
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
    int b = sh_cfg_bool_word(v);
    if (b < 0)
        return sh_cfg_say(msg, len, "not a boolean: \"%s\" (use true/false, yes/no, on/off or 1/0)",
                          v);
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
        return sh_cfg_say(msg, len, "must be auto or an integer from 0 to %" PRIu64 " (got \"%s\")",
                          k->max, v);
    if (parse_uint(v, &x, msg, len) || sh_cfg_check_range(k, x, msg, len))
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
    return sh_cfg_say(msg, len, "must be one of %s (got \"%s\")", names, v);
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
        return sh_cfg_say(msg, len, "trailing characters after the percentage: \"%s\"", v);
    if (k->pct == PCT_NONE)
        return sh_cfg_say(msg, len, "a percentage is not allowed here: \"%s\"", v);
    if (pct > 100.0)
        return sh_cfg_say(msg, len, "percentage above 100%%: \"%s\"", v);
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
        return sh_cfg_say(msg, len, "not a size: \"%s\"", v);
    if (rc == NUM_BIG)
        return sh_cfg_say(msg, len, "number too large: \"%s\"", v);
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '%')
        return size_pct(k, v, p, (double)ip + (double)frac / (double)scale, s, msg, len);
    uint64_t mult = unit_of(p, k->unit);
    if (!mult)
        return sh_cfg_say(msg, len, "unknown unit \"%s\" in \"%s\" (use B, KB, MB, GB, TB or %%)",
                          p, v);
    if (ip > (UINT64_MAX - mult) / mult)
        return sh_cfg_say(msg, len, "number too large: \"%s\"", v);
    s->bytes = ip * mult + frac * mult / scale;
    return 0;
}

static int parse_size(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    struct sh_size_opt s = {0, 0.0, 0, 0};
    if (size_text(k, v, &s, msg, len))
        return SH_EINVAL;
    if (!s.is_pct && !s.is_auto && sh_cfg_check_range(k, s.bytes, msg, len))
        return SH_EINVAL;
    *(struct sh_size_opt *)field = s;
    return 0;
}

static int list_item(const struct key *k, const char *item, struct sh_config_list *l, char *msg,
                     size_t len)
{
    uint64_t x;
    if (l->n == SH_CONFIG_MAX_LIST)
        return sh_cfg_say(msg, len, "too many values (at most %d)", SH_CONFIG_MAX_LIST);
    if (!*item)
        return sh_cfg_say(msg, len, "empty value in the list");
    if (parse_uint(item, &x, msg, len) || sh_cfg_check_range(k, x, msg, len))
        return SH_EINVAL;
    if ((k->flags & F_INCREASING) && l->n && x <= l->v[l->n - 1])
        return sh_cfg_say(msg, len,
                          "values must be strictly increasing (%" PRIu64 " after %" PRIu32 ")", x,
                          l->v[l->n - 1]);
    l->v[l->n++] = (uint32_t)x;
    return 0;
}

static int parse_list(const struct key *k, const char *v, void *field, char *msg, size_t len)
{
    struct sh_config_list l = {0, {0}};
    char item[VAL_MAX];
    if (!*v)
        return sh_cfg_say(msg, len, "empty value");
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
        return sh_cfg_say(msg, len, "too long (at most %d characters)", SH_CONFIG_STR_MAX - 1);
    snprintf(field, SH_CONFIG_STR_MAX, "%.*s", (int)n, v);
    return 0;
}

typedef int (*parse_fn)(const struct key *k, const char *v, void *field, char *msg, size_t len);
static const parse_fn parsers[] = {
    [T_BOOL] = parse_bool, [T_INT] = parse_int,   [T_ENUM] = parse_enum,
    [T_SIZE] = parse_size, [T_LIST] = parse_list, [T_STR] = parse_str,
};

int sh_cfg_apply(struct sh_config *cfg, int k, const char *value, char *msg, size_t len)
{
    char v[VAL_MAX];
    size_t n;
    while (isspace((unsigned char)*value))
        value++;
    n = strlen(value);
    while (n && isspace((unsigned char)value[n - 1]))
        n--;
    if (n >= sizeof v)
        return sh_cfg_say(msg, len, "value too long (at most %zu characters)", sizeof v - 1);
    memcpy(v, value, n);
    v[n] = '\0';
    const struct key *key = &sh_cfg_keys[k];
    return parsers[key->type](key, v, field_of(cfg, key), msg, len);
}
