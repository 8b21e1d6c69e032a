/* config.h — stagehand's settings: stagehand.ini, STAGEHAND_* overrides, built-in defaults.
 *
 * Every function works only on the struct sh_config and the buffers the caller
 * passes in; the module holds no state of its own, so all of it is reentrant.
 * Errors are returned as a negative SH_E* code with one line in `err`:
 *
 *     "path:line: key: what is wrong"      a value or combination from a file
 *     "env STAGEHAND_X: key: what is wrong" a value from the environment
 *     "defaults: key: what is wrong"        only the built-in values are involved
 *
 * config/schema.def lists every key once: its section, name, type, member, limits,
 * default and help. The members of struct sh_config below are generated from it,
 * and so is the key table the parsers walk; stagehand.ini at the repository root
 * documents every key.
 */
#ifndef SH_CONFIG_CONFIG_H
#define SH_CONFIG_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define SH_CONFIG_MAX_LIST  16  /* values in a list key */
#define SH_CONFIG_STR_MAX   256 /* string values and file names, with the NUL */
#define SH_CONFIG_MAX_KEYS  64  /* capacity of the per-key origin table */
#define SH_CONFIG_MAX_FILES 4   /* distinct files one struct can be loaded from */
#define SH_CONFIG_ERR_MAX   512 /* a good size for err buffers; longer text is cut */

enum sh_config_host_scope {
    SH_CONFIG_HOST_PROCESS = 0,
    SH_CONFIG_HOST_NODE = 1,
    SH_CONFIG_HOST_AUTO = 2
};
enum sh_config_drain { SH_CONFIG_DRAIN_DEVICE = 0, SH_CONFIG_DRAIN_TRACKED = 1 };
enum sh_config_devices { SH_CONFIG_DEVICES_ONE = 0, SH_CONFIG_DEVICES_ALL = 1 };
enum sh_config_eviction { SH_CONFIG_EVICT_LRU = 0, SH_CONFIG_EVICT_LEARNED = 1 };
enum sh_config_tracking {
    SH_CONFIG_TRACK_AUTO = 0,
    SH_CONFIG_TRACK_CUPTI = 1,
    SH_CONFIG_TRACK_HOOKS = 2
};

/* A size as written, then as resolved. */
struct sh_size_opt {
    uint64_t bytes; /* as written when !is_pct; after sh_config_resolve() always the bytes */
    double pct;     /* the percentage as written when is_pct (0..100) */
    int is_pct;
    int is_auto; /* "auto": the library decides at run time; bytes then hold the budget */
};

struct sh_config_list {
    uint32_t n;
    uint32_t v[SH_CONFIG_MAX_LIST];
};

/* Where a key got its value; read it through sh_config_origin(). */
struct sh_config_origin {
    int16_t src; /* -1 default, -2 environment, -3 an alias (line: which), >= 0 files_ */
    int32_t line;
};

/* The members each key's type gets (config/schema.def). */
#define SH_CONFIG_CTYPE_BOOL int
#define SH_CONFIG_CTYPE_INT  int
#define SH_CONFIG_CTYPE_ENUM int
#define SH_CONFIG_CTYPE_SIZE struct sh_size_opt
#define SH_CONFIG_CTYPE_LIST struct sh_config_list
#define SH_CONFIG_CTYPE_STR  char
#define SH_CONFIG_DIM_BOOL
#define SH_CONFIG_DIM_INT
#define SH_CONFIG_DIM_ENUM
#define SH_CONFIG_DIM_SIZE
#define SH_CONFIG_DIM_LIST
#define SH_CONFIG_DIM_STR [SH_CONFIG_STR_MAX] /* "" = none where the key says so */

/* One member struct per section, one member per key, in schema order: the key
 * [budget] vram_budget_mb is cfg->budget.vram_budget (the schema's field column).
 * Ints that may be auto hold -1 for it; enums hold the index of their word. */
struct sh_config {
#define SH_CONFIG_SECTION(sec) struct {
#define SH_CONFIG_END(sec)                                                                         \
    }                                                                                              \
    sec;
#define SH_CONFIG_KEY(sec, name, type, field, ...)                                                 \
    SH_CONFIG_CTYPE_##type field SH_CONFIG_DIM_##type;
#include "config/schema.def"

    int resolved; /* set by sh_config_resolve() */
    struct sh_config_origin origin_[SH_CONFIG_MAX_KEYS];
    char files_[SH_CONFIG_MAX_FILES][SH_CONFIG_STR_MAX];
};

/* One key, for help screens and tests. Strings are static. */
struct sh_config_key_info {
    const char *section;
    const char *name;
    const char *unit; /* "MB", "KB", "bool", "launches", ... */
    const char *def;  /* the default exactly as stagehand.ini writes it */
    const char *help;
};

/* Sets every key to its built-in default (not yet resolved). */
void sh_config_defaults(struct sh_config *cfg);

/* Parses one INI file over the current values; cfg is left untouched on error.
 * SH_ENOTFOUND if it cannot be opened, SH_EINVAL for a bad file. */
int sh_config_load_file(struct sh_config *cfg, const char *path, char *err, size_t errlen);

/* The same from a string; `name` stands for the path in messages. */
int sh_config_load_string(struct sh_config *cfg, const char *name, const char *text, char *err,
                          size_t errlen);

/* Applies STAGEHAND_<SECTION>_<KEY>=value entries of envp (NULL-terminated, or NULL),
 * then the aliases schema.def gives (STAGEHAND_TRACE for [debug] trace_file), which
 * win. An unknown key in a known section, or a name plainly meant as a key
 * (STAGEHAND_LOG_LEVEL, a misspelt section), is an error; other names are ignored.
 * cfg is left untouched on error. */
int sh_config_apply_env(struct sh_config *cfg, char *const *envp, char *err, size_t errlen);

/* Turns percentages into bytes (card_bytes or host_ram_bytes 0 = unknown, and then a
 * percentage of it is an error) and checks the combinations. cfg is left untouched
 * on error; resolving again (say with another card size) is allowed. */
int sh_config_resolve(struct sh_config *cfg, uint64_t card_bytes, uint64_t host_ram_bytes,
                      char *err, size_t errlen);

/* Defaults, then the file found by the search order, then the environment,
 * without resolving: what the library runs at load time, before the card's
 * size is known, so that a bad file stops the program before it starts. */
int sh_config_load(struct sh_config *cfg, char *const *envp, char *used_path, size_t pathlen,
                   char *err, size_t errlen);

/* Start-up: defaults, then $STAGEHAND_CONFIG (must exist) or else ./stagehand.ini
 * (if present), then the environment, then resolve. *used_path gets the file read,
 * "" for none. */
int sh_config_init(struct sh_config *cfg, char *const *envp, uint64_t card_bytes,
                   uint64_t host_ram_bytes, char *used_path, size_t pathlen, char *err,
                   size_t errlen);

/* 1 in secure-execution mode (getauxval(AT_SECURE): setuid, setgid, file
 * capabilities). sh_config_load then reads no STAGEHAND_* variable and only a
 * root-owned ./stagehand.ini. Weak, so a test may replace it. */
int sh_config_secure(void);

/* [budget] host_ram_scope as it applies to this process (SH_CONFIG_HOST_NODE
 * or SH_CONFIG_HOST_PROCESS): auto is node when envp (NULL-terminated, or
 * NULL) has a launcher's variable naming more than one rank (torch.
 * distributed's LOCAL_WORLD_SIZE and WORLD_SIZE, Open MPI's
 * OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS, Slurm's
 * SLURM_NTASKS), else process. why (may be NULL) gets the variable that
 * decided it ("LOCAL_WORLD_SIZE=2"), or "". */
int sh_config_host_scope(const struct sh_config *cfg, char *const *envp, char *why, size_t whylen);

/* 1 when envp has STAGEHAND_DISABLE set to anything but "", 0, false, no or off. */
int sh_config_disabled(char *const *envp);

/* "budget=81920MB high=65536MB low=49152MB ..." (percentages as written until resolved). */
void sh_config_summary(const struct sh_config *cfg, char *buf, size_t len);

/* Where section.key got its value: "defaults", "path:line" or "env STAGEHAND_...".
 * SH_ENOTFOUND for an unknown key. */
int sh_config_origin(const struct sh_config *cfg, const char *section, const char *key, char *buf,
                     size_t len);

/* The index-th key in table order; SH_ENOTFOUND past the last one. */
int sh_config_key_at(size_t index, struct sh_config_key_info *out);

#endif
