/* env.c — STAGEHAND_<SECTION>_<KEY>=value overrides over the file's values,
 * then the aliases (STAGEHAND_TRACE for [debug] trace_file), a name that looks
 * meant as a key but is none (an error, with the likely key),
 * STAGEHAND_DISABLE, and the launchers' rank counts host_ram_scope = auto
 * reads.
 *
 * No state: every function works on the caller's struct, environment array and
 * buffers, so all of it is reentrant.
 */
#include "config/config_int.h"
#include "sh_err.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
    for (int i = 0; i < NKEYS; i++)
        if (strlen(sh_cfg_keys[i].name) == n && strncasecmp(sh_cfg_keys[i].name, s, n) == 0)
            return i;
    return -1;
}

/* The alias entry[0..n) names, or -1. */
static int alias_named(const char *entry, size_t n)
{
    for (int a = 0; sh_cfg_aliases[a].name; a++)
        if (strlen(sh_cfg_aliases[a].name) == n && strncmp(sh_cfg_aliases[a].name, entry, n) == 0)
            return a;
    return -1;
}

/* STAGEHAND_NAME matched no section. It is an error, like an unknown key, when it
 * was meant as a key: the words after its first name a key
 * (STAGEHAND_BUDGT_VRAM_BUDGET_MB), the whole name does (STAGEHAND_LOG_LEVEL), or
 * its first word is a letter or two from a section's name. Other names
 * (STAGEHAND_CONFIG, an alias, a script's own) are left alone. */
static int misspelt(const char *entry, size_t len, char *err, size_t errlen)
{
    const char *name = entry + 10, *us = memchr(name, '_', len - 10);
    size_t n = len - 10, first = us ? (size_t)(us - name) : n;
    int k = us ? key_anywhere(us + 1, n - first - 1) : -1;
    if (k < 0)
        k = key_anywhere(name, n);
    if (k >= 0) {
        char want[96];
        sh_cfg_env_name(k, want, sizeof want);
        return sh_cfg_say(err, errlen, "env %.*s: not a key; did you mean %s?", (int)len, entry,
                          want);
    }
    for (size_t s = 0; s < sh_cfg_nsections; s++) {
        int d = distance(name, first, sh_cfg_sections[s]);
        if (d > 0 && d <= (strlen(sh_cfg_sections[s]) >= 6 ? 2 : 1))
            return sh_cfg_say(err, errlen, "env %.*s: unknown section \"%.*s\" (did you mean %s?)",
                              (int)len, entry, (int)first, name, sh_cfg_sections[s]);
    }
    return 0;
}

static int env_one(struct sh_config *cfg, const char *entry, char *err, size_t errlen)
{
    const char *eq = strchr(entry, '=');
    if (strncmp(entry, "STAGEHAND_", 10) != 0 || !eq)
        return 0;
    const char *name = entry + 10;
    for (size_t s = 0; s < sh_cfg_nsections; s++) {
        size_t sl = strlen(sh_cfg_sections[s]);
        if (strncasecmp(name, sh_cfg_sections[s], sl) != 0 || name[sl] != '_' || name + sl >= eq)
            continue;
        const char *key = name + sl + 1;
        int k = sh_cfg_key((int)s, key, (size_t)(eq - key));
        char msg[MSG_MAX], lower[64];
        int n = snprintf(lower, sizeof lower, "%.*s", (int)(eq - key), key);
        for (int i = 0; i < n && (size_t)i < sizeof lower; i++)
            lower[i] = (char)tolower((unsigned char)lower[i]);
        if (k < 0)
            return sh_cfg_say(err, errlen, "env %.*s: %s: unknown key in [%s]", (int)(eq - entry),
                              entry, lower, sh_cfg_sections[s]);
        if (sh_cfg_apply(cfg, k, eq + 1, msg, sizeof msg))
            return sh_cfg_say(err, errlen, "env %.*s: %s: %s", (int)(eq - entry), entry, lower,
                              msg);
        cfg->origin_[k] = (struct sh_config_origin){SRC_ENV, 0};
        return 0;
    }
    if (alias_named(entry, (size_t)(eq - entry)) >= 0)
        return 0; /* applied after every key's own name */
    return misspelt(entry, (size_t)(eq - entry), err, errlen);
}

/* An alias's non-empty value, over whatever the key's own name set. */
static int env_alias(struct sh_config *cfg, char *const *envp, int a, char *err, size_t errlen)
{
    const struct alias *al = &sh_cfg_aliases[a];
    const char *v = sh_cfg_env_get(envp, al->name);
    char msg[MSG_MAX];
    if (!v || !*v)
        return 0;
    if (sh_cfg_apply(cfg, al->key, v, msg, sizeof msg))
        return sh_cfg_say(err, errlen, "env %s: %s: %s", al->name, sh_cfg_keys[al->key].name, msg);
    cfg->origin_[al->key] = (struct sh_config_origin){SRC_ALIAS, a};
    return 0;
}

int sh_config_apply_env(struct sh_config *cfg, char *const *envp, char *err, size_t errlen)
{
    struct sh_config tmp = *cfg;
    for (char *const *e = envp; e && *e; e++)
        if (env_one(&tmp, *e, err, errlen))
            return SH_EINVAL;
    for (int a = 0; sh_cfg_aliases[a].name; a++)
        if (env_alias(&tmp, envp, a, err, errlen))
            return SH_EINVAL;
    *cfg = tmp;
    return 0;
}

const char *sh_cfg_env_get(char *const *envp, const char *name)
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
    const char *v = sh_cfg_env_get(envp, "STAGEHAND_DISABLE");
    return v && *v && sh_cfg_bool_word(v) != 0;
}

/* The variables launchers set to the number of ranks in the job (or on
 * this node): more than one means other ranks may pin host memory here. */
static const char *const rank_vars[] = {"LOCAL_WORLD_SIZE", "WORLD_SIZE",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                        "SLURM_NTASKS"};

/* A count of ranks: a decimal number, else 0 (not ours to judge). */
static long rank_count(const char *v)
{
    char *end;
    if (!v || !isdigit((unsigned char)*v))
        return 0;
    long n = strtol(v, &end, 10);
    return *end == '\0' ? n : 0;
}

int sh_config_host_scope(const struct sh_config *cfg, char *const *envp, char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = '\0';
    if (cfg->budget.host_ram_scope != SH_CONFIG_HOST_AUTO)
        return cfg->budget.host_ram_scope;
    for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
        const char *v = sh_cfg_env_get(envp, rank_vars[i]);
        if (rank_count(v) > 1) {
            if (why && whylen)
                snprintf(why, whylen, "%s=%s", rank_vars[i], v);
            return SH_CONFIG_HOST_NODE;
        }
    }
    return SH_CONFIG_HOST_PROCESS;
}
