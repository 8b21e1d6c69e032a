/* keys.c — the key table, generated from schema.def, and what is looked up in
 * it: sections and keys by name, the built-in defaults, and where each key got
 * its value (for messages and sh_config_origin()).
 *
 * The tables are read-only; every function works on the caller's struct and
 * buffers, so all of it is reentrant.
 */
#include "config/config_int.h"
#include "sh_err.h"
#include "sh_log.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

const char *const sh_cfg_sections[] = {
#define SH_CONFIG_SECTION(sec) #sec,
#include "config/schema.def"
};
const size_t sh_cfg_nsections = sizeof sh_cfg_sections / sizeof sh_cfg_sections[0];

/* choices_<id>: an enum key's words, NULL-terminated; choices_NONE for the rest. */
#define SH_CONFIG_CHOICES(id, ...) static const char *const choices_##id[] = {__VA_ARGS__, NULL};
#include "config/schema.def"
#define choices_NONE NULL

#define NWORDS(id) (sizeof choices_##id / sizeof choices_##id[0] - 1)
_Static_assert(NWORDS(log_level) == SH_LOG_DEBUG + 1, "log_level's words are the SH_LOG_* levels");
_Static_assert(NWORDS(drain_mode) == SH_CONFIG_DRAIN_TRACKED + 1, "enum sh_config_drain");
_Static_assert(NWORDS(eviction) == SH_CONFIG_EVICT_LEARNED + 1, "enum sh_config_eviction");
_Static_assert(NWORDS(mode) == SH_CONFIG_TRACK_HOOKS + 1, "enum sh_config_tracking");

/* The one redundancy in the schema, checked: a row's sec column names the
 * SH_CONFIG_SECTION block it sits in (the members follow the blocks, the table
 * the column). And a size that is a percentage of another key comes after it,
 * as sh_config_resolve() needs. */
#define SH_CONFIG_SECTION(sec) typedef struct {
#define SH_CONFIG_END(sec)                                                                         \
    }                                                                                              \
    in_##sec;
#define SH_CONFIG_KEY(sec, nm, ...) char sec##_##nm;
#include "config/schema.def"
#define SH_CONFIG_KEY(sec, nm, ty, fld, lo, hi, un, uname, base, ...)                              \
    _Static_assert(sizeof(((in_##sec *)0)->sec##_##nm) == 1, #nm " sits outside [" #sec "]");      \
    _Static_assert(                                                                                \
        (PCT_##base != PCT_BUDGET || KEY_##sec##_##nm > KEY_budget_vram_budget_mb) &&              \
            (PCT_##base != PCT_HOST_BUDGET || KEY_##sec##_##nm > KEY_budget_host_ram_budget_mb),   \
        #nm " comes before the key it is a percentage of");
#include "config/schema.def"

const struct key sh_cfg_keys[NKEYS] = {
#define SH_CONFIG_KEY(sec, nm, ty, fld, lo, hi, un, uname, base, fl, ch, d, lab, h)                \
    [KEY_##sec##_##nm] = {.section = #sec,                                                         \
                          .name = #nm,                                                             \
                          .type = T_##ty,                                                          \
                          .off = offsetof(struct sh_config, sec.fld),                              \
                          .min = lo,                                                               \
                          .max = hi,                                                               \
                          .unit = un,                                                              \
                          .unit_name = uname,                                                      \
                          .pct = PCT_##base,                                                       \
                          .flags = fl,                                                             \
                          .choices = choices_##ch,                                                 \
                          .def = d,                                                                \
                          .label = lab,                                                            \
                          .help = h},
#include "config/schema.def"
};

const struct alias sh_cfg_aliases[] = {
#define SH_CONFIG_ALIAS(sec, nm, variable) {#variable, KEY_##sec##_##nm},
#include "config/schema.def"
    {NULL, -1},
};

/* ---- lookup --------------------------------------------------------------- */

int sh_cfg_section(const char *s, size_t n)
{
    while (n && isspace((unsigned char)*s))
        s++, n--;
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    for (size_t i = 0; i < sh_cfg_nsections; i++)
        if (strlen(sh_cfg_sections[i]) == n && strncasecmp(sh_cfg_sections[i], s, n) == 0)
            return (int)i;
    return -1;
}

int sh_cfg_key(int sec, const char *name, size_t n)
{
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(sh_cfg_keys[i].section, sh_cfg_sections[sec]) == 0 &&
            strlen(sh_cfg_keys[i].name) == n && strncasecmp(sh_cfg_keys[i].name, name, n) == 0)
            return i;
    return -1;
}

/* ---- defaults ------------------------------------------------------------- */

void sh_config_defaults(struct sh_config *cfg)
{
    char msg[MSG_MAX];
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < NKEYS; i++) {
        sh_cfg_apply(cfg, i, sh_cfg_keys[i].def, msg, sizeof msg); /* the tests prove these parse */
        cfg->origin_[i] = (struct sh_config_origin){SRC_DEFAULT, 0};
    }
}

/* ---- origins -------------------------------------------------------------- */

void sh_cfg_env_name(int k, char *buf, size_t len)
{
    int n = snprintf(buf, len, "STAGEHAND_%s_%s", sh_cfg_keys[k].section, sh_cfg_keys[k].name);
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
        sh_cfg_env_name(k, name, sizeof name);
        snprintf(buf, len, "env %s", name);
    } else if (o->src == SRC_ALIAS) {
        snprintf(buf, len, "env %s", sh_cfg_aliases[o->line].name);
    } else {
        snprintf(buf, len, "defaults");
    }
}

int sh_cfg_blame(const struct sh_config *cfg, int k, char *err, size_t errlen, const char *fmt, ...)
{
    char where[SH_CONFIG_STR_MAX + 16], msg[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    origin_text(cfg, k, where, sizeof where);
    return sh_cfg_say(err, errlen, "%s: %s: %s", where, sh_cfg_keys[k].name, msg);
}

int sh_config_origin(const struct sh_config *cfg, const char *section, const char *key, char *buf,
                     size_t len)
{
    int sec = sh_cfg_section(section, strlen(section));
    int k = sec < 0 ? -1 : sh_cfg_key(sec, key, strlen(key));
    if (k < 0)
        return SH_ENOTFOUND;
    origin_text(cfg, k, buf, len);
    return 0;
}

int sh_config_key_at(size_t index, struct sh_config_key_info *out)
{
    if (index >= NKEYS)
        return SH_ENOTFOUND;
    const struct key *k = &sh_cfg_keys[index];
    *out = (struct sh_config_key_info){k->section, k->name, k->unit_name, k->def, k->help};
    return 0;
}
