/* config_int.h — what the files of config/ share: the key table generated from
 * schema.def, and the helpers that cross files. Nothing outside config/ includes
 * it but its tests.
 *
 *   keys.c     the table, key lookup, defaults, where each key got its value
 *   values.c   text to values: bool, int, enum, size, list, string
 *   file.c     stagehand.ini: reading, trust checks, the search order
 *   env.c      STAGEHAND_* overrides, misspelt names, STAGEHAND_DISABLE
 *   resolve.c  percentages to bytes, the checks between keys and the machine
 *   summary.c  the one-line summary
 *   config.c   start-up: defaults, file, environment, checks
 *
 * No shared mutable state: the tables are read-only and every function works on
 * the caller's struct sh_config and buffers, so all of config/ is reentrant.
 */
#ifndef SH_CONFIG_CONFIG_INT_H
#define SH_CONFIG_CONFIG_INT_H

#include "config/config.h"
#include "sh_err.h"

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
enum { SRC_DEFAULT = -1, SRC_ENV = -2, SRC_ALIAS = -3 }; /* origin_[].src; else a file */

/* Every key's index in the table: KEY_<section>_<name>. */
enum key_id {
#define SH_CONFIG_KEY(sec, name, ...) KEY_##sec##_##name,
#include "config/schema.def"
    NKEYS
};
_Static_assert(NKEYS <= SH_CONFIG_MAX_KEYS, "raise SH_CONFIG_MAX_KEYS");

/* One row of schema.def; the columns are described there. */
struct key {
    const char *section;
    const char *name;
    enum type type;
    size_t off; /* offset of the member in struct sh_config */
    uint64_t min, max;
    uint64_t unit;
    const char *unit_name;
    enum pct_base pct;
    unsigned flags;
    const char *const *choices; /* enums: the words, NULL-terminated */
    const char *def;
    const char *label;
    const char *help;
};

/* An SH_CONFIG_ALIAS row: another environment name for a key. */
struct alias {
    const char *name; /* the variable, STAGEHAND_TRACE */
    int key;
};

extern const struct key sh_cfg_keys[NKEYS];
extern const struct alias sh_cfg_aliases[]; /* ends with a NULL name */
extern const char *const sh_cfg_sections[];
extern const size_t sh_cfg_nsections;

static inline void *field_of(struct sh_config *cfg, const struct key *k)
{
    return (char *)cfg + k->off;
}

static inline const void *cfield_of(const struct sh_config *cfg, const struct key *k)
{
    return (const char *)cfg + k->off;
}

/* keys.c */
int sh_cfg_section(const char *s, size_t n);         /* index, or -1 */
int sh_cfg_key(int sec, const char *name, size_t n); /* index, or -1 */
void sh_cfg_env_name(int k, char *buf, size_t len);  /* STAGEHAND_SECTION_KEY */
/* "where: key: problem" for key k, where being the place that set it. */
__attribute__((format(printf, 5, 6))) int
sh_cfg_blame(const struct sh_config *cfg, int k, char *err, size_t errlen, const char *fmt, ...);

/* values.c */
/* Formats a message into buf and returns SH_EINVAL. */
#define sh_cfg_say(buf, len, ...) sh_err_say(SH_EINVAL, (buf), (len), __VA_ARGS__)
void sh_cfg_copy(char *dst, size_t len, const char *src);
/* Sets key k from text (blanks around it ignored); 0, or SH_EINVAL with msg. */
int sh_cfg_apply(struct sh_config *cfg, int k, const char *value, char *msg, size_t len);
int sh_cfg_check_range(const struct key *k, uint64_t x, char *msg, size_t len);
void sh_cfg_fmt_units(uint64_t v, uint64_t unit, char *buf, size_t len);
int sh_cfg_bool_word(const char *v); /* 1, 0, or -1 for no boolean */

/* file.c: $STAGEHAND_CONFIG, else ./stagehand.ini if there is one, over cfg;
 * *used gets the file read, untouched for none */
int sh_cfg_load_found(struct sh_config *cfg, char *const *envp, int secure, char *used,
                      size_t usedlen, char *err, size_t errlen);

/* env.c: the last value of a variable in envp, or NULL */
const char *sh_cfg_env_get(char *const *envp, const char *name);

/* resolve.c: the relations known before the machine is */
int sh_cfg_check_static(const struct sh_config *cfg, char *err, size_t errlen);

#endif
