/* summary.c — the one-line summary the library logs at start: every key with a
 * label in schema.def, as written until resolved and in its unit after.
 *
 * No state: it reads the caller's struct and writes the caller's buffer, so it
 * is reentrant.
 */
#include "config/config_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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
        sh_cfg_fmt_units(s->bytes, k->unit, buf, len);
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
    for (int i = 0; i < NKEYS && n < len; i++) {
        const struct key *k = &sh_cfg_keys[i];
        if (!k->label)
            continue;
        fmt_value(cfg, k, v, sizeof v);
        n += (size_t)snprintf(buf + n, len - n, "%s%s=%s", n ? " " : "", k->label, v);
    }
}
