/* test_config_docs.c — the documentation cannot drift from config/schema.def.
 *
 * stagehand.ini, which documents every key, sets each one in its section to
 * exactly the schema's default, under a comment that states what the schema
 * says: the type, the unit of a bare number, the limits of an int or a list,
 * the words of a choice, what a percentage is of, whether "auto" is allowed and
 * the key's other environment name; and it sets no key the schema lacks.
 * README.md and the pages in docs/ quote keys as `[section] key = value`, `key = value`
 * and STAGEHAND_SECTION_KEY=value: each must name a real key, and each value
 * must be one the library accepts.
 *
 * Runs with the repository root as the working directory. Reads files only;
 * the tests share the parsed stagehand.ini (built once, before them) and a
 * problem counter each resets.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/config_int.h"
#include "sh_err.h"

/* ---- reading ---------------------------------------------------------------- */

static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        print_error("cannot open %s\n", path);
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    assert_true(n >= 0);
    rewind(fp);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, fp), (size_t)n);
    text[n] = '\0';
    fclose(fp);
    return text;
}

/* One "key = value" line of stagehand.ini and the comment lines just above it,
 * joined with single spaces. */
struct entry {
    char section[32], name[64], value[256];
    char comment[2048];
    int line;
};

static struct entry ini[128];
static int nini;

static void trim(char *s)
{
    size_t n = strlen(s), skip = 0;
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    while (isspace((unsigned char)s[skip]))
        skip++;
    memmove(s, s + skip, n - skip + 1);
}

static void ini_line(char *l, int line, char *section, char *comment)
{
    trim(l);
    char *eq = strchr(l, '=');
    if (l[0] == ';' || l[0] == '#') {
        size_t n = strlen(comment);
        snprintf(comment + n, 2048 - n, "%s%s", n ? " " : "", l + 1 + (l[1] == ' '));
        return;
    }
    if (l[0] == '[') {
        snprintf(section, 32, "%.*s", (int)strcspn(l + 1, "]"), l + 1);
    } else if (eq) {
        assert_true(nini < (int)(sizeof ini / sizeof ini[0]));
        struct entry *e = &ini[nini++];
        *eq = '\0';
        snprintf(e->section, sizeof e->section, "%s", section);
        snprintf(e->name, sizeof e->name, "%s", l);
        snprintf(e->value, sizeof e->value, "%s", eq + 1);
        snprintf(e->comment, sizeof e->comment, "%s", comment);
        trim(e->name);
        trim(e->value);
        e->line = line;
    }
    comment[0] = '\0'; /* a blank line, a section or a key ends a comment */
}

static int read_ini(void **state)
{
    char *text = slurp("stagehand.ini"), section[32] = "", comment[2048] = "";
    int line = 0;
    (void)state;
    for (char *l = text, *next; l; l = next) {
        next = strchr(l, '\n');
        if (next)
            *next++ = '\0';
        ini_line(l, ++line, section, comment);
    }
    free(text);
    return 0;
}

/* ---- stagehand.ini against the schema ----------------------------------------- */

static int problems;
static int quiet; /* the test of the tests: its problems are expected */

__attribute__((format(printf, 2, 3))) static void problem(const struct entry *e, const char *fmt,
                                                          ...)
{
    va_list ap;
    char msg[512];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!quiet)
        print_error("stagehand.ini:%d: [%s] %s: %s\n", e ? e->line : 0, e ? e->section : "?",
                    e ? e->name : "?", msg);
    problems++;
}

static int lookup(const char *section, const char *name)
{
    int sec = sh_cfg_section(section, strlen(section));
    return sec < 0 ? -1 : sh_cfg_key(sec, name, strlen(name));
}

static void test_ini_has_no_unknown_key(void **state)
{
    (void)state;
    problems = 0;
    assert_true(nini > 0);
    for (int i = 0; i < nini; i++) {
        if (lookup(ini[i].section, ini[i].name) < 0)
            problem(&ini[i], "not a key of config/schema.def");
        for (int j = 0; j < i; j++)
            if (strcmp(ini[i].section, ini[j].section) == 0 &&
                strcmp(ini[i].name, ini[j].name) == 0)
                problem(&ini[i], "set twice (line %d too)", ini[j].line);
    }
    assert_int_equal(problems, 0);
}

static void want_in(const struct entry *e, const char *what)
{
    if (!strstr(e->comment, what))
        problem(e, "its comment should say \"%s\"", what);
}

static void want_start(const struct entry *e, const char *what)
{
    if (strncmp(e->comment, what, strlen(what)) != 0)
        problem(e, "its comment should start \"%s\"", what);
}

/* "error, warn, info, debug" */
static void words(const struct key *k, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; k->choices[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "", k->choices[i]);
}

static const char *pct_text(enum pct_base b)
{
    switch (b) {
    case PCT_CARD:
        return "a percentage is of the card's total memory";
    case PCT_BUDGET:
        return "a percentage is of vram_budget_mb";
    case PCT_HOST:
        return "a percentage is of the machine's RAM";
    case PCT_HOST_BUDGET:
        return "a percentage is of host_ram_budget_mb";
    default:
        return NULL;
    }
}

/* What the type line of the comment must say, and whatever follows from the
 * type: the unit of a bare number, limits, words, percentages. */
static void check_type(const struct key *k, const struct entry *e)
{
    char buf[256];
    static const char *const type_word[] = {
        [T_BOOL] = "bool.",  [T_INT] = "int, ",     [T_ENUM] = "choice: ",
        [T_SIZE] = "size, ", [T_LIST] = "list of ", [T_STR] = "string"};
    want_start(e, type_word[k->type]);
    if (k->type == T_ENUM) {
        snprintf(buf, sizeof buf, "%s", type_word[T_ENUM]);
        words(k, buf + strlen(buf), sizeof buf - strlen(buf));
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), ".");
        want_start(e, buf);
    }
    if (k->type == T_SIZE || (k->type == T_LIST && k->unit > 1)) {
        snprintf(buf, sizeof buf, "%s%s", type_word[k->type], k->unit_name);
        want_start(e, buf);
    }
    if (k->type == T_INT || k->type == T_LIST) {
        snprintf(buf, sizeof buf, "%" PRIu64 "..%" PRIu64, k->min, k->max);
        want_in(e, buf);
    }
    if (k->type == T_SIZE && pct_text(k->pct))
        want_in(e, pct_text(k->pct));
    if (k->type == T_SIZE && !pct_text(k->pct) && strstr(e->comment, "percentage"))
        problem(e, "its comment allows a percentage, the schema does not");
}

static void check_key(int k)
{
    const struct key *key = &sh_cfg_keys[k];
    const struct entry *e = NULL;
    for (int i = 0; i < nini && !e; i++)
        if (strcmp(ini[i].section, key->section) == 0 && strcmp(ini[i].name, key->name) == 0)
            e = &ini[i];
    if (!e) {
        print_error("stagehand.ini lacks [%s] %s\n", key->section, key->name);
        problems++;
        return;
    }
    if (strcmp(e->value, key->def) != 0)
        problem(e, "set to \"%s\", but the default is \"%s\"", e->value, key->def);
    check_type(key, e);
    if ((key->flags & F_AUTO) && !strstr(e->comment, "or auto"))
        problem(e, "may be auto: its comment should say \"or auto\"");
    if (!(key->flags & F_AUTO) && strstr(e->comment, "or auto"))
        problem(e, "its comment allows auto, the schema does not");
    if ((key->flags & F_POW2) && !strstr(e->comment, "power"))
        problem(e, "must be a power of two: its comment should say so");
    for (int a = 0; sh_cfg_aliases[a].name; a++)
        if (sh_cfg_aliases[a].key == k)
            want_in(e, sh_cfg_aliases[a].name);
}

static void test_ini_documents_every_key(void **state)
{
    (void)state;
    problems = 0;
    for (int k = 0; k < NKEYS; k++)
        check_key(k);
    assert_int_equal(problems, 0);
}

/* Every default parses as a user's value would, and the help is there. */
static void test_defaults_parse(void **state)
{
    char text[512], err[SH_CONFIG_ERR_MAX];
    (void)state;
    for (int k = 0; k < NKEYS; k++) {
        struct sh_config c;
        const struct key *key = &sh_cfg_keys[k];
        sh_config_defaults(&c);
        snprintf(text, sizeof text, "[%s]\n%s = %s\n", key->section, key->name, key->def);
        int rc = sh_config_load_string(&c, "schema", text, err, sizeof err);
        if (rc)
            print_error("%s\n", err);
        assert_int_equal(rc, 0);
        assert_true(key->help && *key->help && key->unit_name && *key->unit_name);
        assert_true(key->type != T_ENUM || key->choices);
    }
}

/* ---- README.md and docs/ ---------------------------------------------------- */

/* Any section's key with this name, or -1. */
static int key_named(const char *name)
{
    for (int k = 0; k < NKEYS; k++)
        if (strcmp(sh_cfg_keys[k].name, name) == 0)
            return k;
    return -1;
}

static int value_ok(int k, const char *value, char *err, size_t len)
{
    struct sh_config c;
    char text[512];
    sh_config_defaults(&c);
    snprintf(text, sizeof text, "[%s]\n%s = %s\n", sh_cfg_keys[k].section, sh_cfg_keys[k].name,
             value);
    return sh_config_load_string(&c, "quoted", text, err, len) == 0;
}

static void doc_problem(const char *file, const char *quote, const char *why)
{
    if (!quiet)
        print_error("%s: `%s`: %s\n", file, quote, why);
    problems++;
}

/* `[section]`, `[section] key`, `[section] key = value`, `key = value` and
 * `a = b = value`: a quoted key must exist and its value must parse. Other
 * code (`make test`, `x = 1`) is none of this test's business. */
static void check_span(const char *file, const char *span)
{
    char buf[512], sec[32] = "", err[SH_CONFIG_ERR_MAX], *part[8] = {NULL}, *p = buf;
    int n = 0;
    snprintf(buf, sizeof buf, "%s", span);
    size_t sl = *p == '[' ? strspn(p + 1, "abcdefghijklmnopqrstuvwxyz") : 0;
    if (sl && p[1 + sl] == ']') { /* not `[{...}]`, a JSON array */
        snprintf(sec, sizeof sec, "%.*s", (int)sl, p + 1);
        if (sh_cfg_section(sec, strlen(sec)) < 0) {
            doc_problem(file, span, "no such section");
            return;
        }
        p += strlen(sec) + 2 + (p[strlen(sec) + 2] == ' ');
        if (!*p)
            return;
    }
    for (char *eq; n < 8; p = eq + 3) { /* name = name = ... = value */
        part[n++] = p;
        if (!(eq = strstr(p, " = ")))
            break;
        *eq = '\0';
    }
    if (n == 1 && !*sec)
        return; /* a bare word: a key's name, or anything else */
    const char *value = n > 1 ? part[n - 1] : NULL;
    for (int i = 0; i < (n > 1 ? n - 1 : 1); i++) {
        int k = *sec ? lookup(sec, part[i]) : key_named(part[i]);
        if (k < 0 && *sec) {
            doc_problem(file, span, "no such key in that section");
            return;
        }
        if (k < 0)
            return; /* not meant as a key */
        if (value && !value_ok(k, value, err, sizeof err)) {
            doc_problem(file, span, err);
            return;
        }
    }
}

/* Inline code outside fenced blocks, its blanks and line breaks made one space. */
static void check_spans(const char *file, const char *text)
{
    char *t = strdup(text), span[512];
    int fenced = 0;
    assert_non_null(t);
    for (char *l = t; *l;) {
        size_t n = strcspn(l, "\n");
        int fence = strncmp(l + strspn(l, " "), "```", 3) == 0;
        fenced ^= fence;
        if (fence || fenced)
            memset(l, ' ', n);
        l += n + (l[n] != '\0');
    }
    for (char *b = strchr(t, '`'), *e; b && (e = strchr(b + 1, '`')); b = strchr(e + 1, '`')) {
        size_t n = 0;
        for (const char *c = b + 1; c < e && n < sizeof span - 1; c++)
            if (!isspace((unsigned char)*c))
                span[n++] = *c;
            else if (n && span[n - 1] != ' ')
                span[n++] = ' ';
        span[n - (n && span[n - 1] == ' ')] = '\0';
        check_span(file, span);
    }
    free(t);
}

/* STAGEHAND_<SECTION>_<KEY> names a key of that section; STAGEHAND_<ALIAS>
 * too; a value given with = is one the environment layer takes. Other names
 * (STAGEHAND_CONFIG, STAGEHAND_DISABLE, a test's own) are left alone. */
static void check_env_name(const char *file, const char *at)
{
    char name[96], entry[512], err[SH_CONFIG_ERR_MAX];
    size_t n = strspn(at, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
    snprintf(name, sizeof name, "%.*s", (int)n, at);
    int known = 0;
    for (int a = 0; sh_cfg_aliases[a].name; a++)
        known |= strcmp(sh_cfg_aliases[a].name, name) == 0;
    for (size_t s = 0; s < sh_cfg_nsections && !known; s++) {
        size_t sl = strlen(sh_cfg_sections[s]);
        if (strncasecmp(name + 10, sh_cfg_sections[s], sl) != 0 || name[10 + sl] != '_')
            continue;
        for (int k = 0; k < NKEYS && !known; k++)
            known = strcmp(sh_cfg_keys[k].section, sh_cfg_sections[s]) == 0 &&
                    strcasecmp(sh_cfg_keys[k].name, name + 11 + sl) == 0;
        if (!known) {
            doc_problem(file, name, "no such key in that section");
            return;
        }
    }
    if (!known || at[n] != '=')
        return;
    snprintf(entry, sizeof entry, "%s=%.*s", name, (int)strcspn(at + n + 1, " \t\n`|)"),
             at + n + 1);
    char *envp[] = {entry, NULL};
    struct sh_config c;
    sh_config_defaults(&c);
    if (sh_config_apply_env(&c, envp, err, sizeof err) != 0)
        doc_problem(file, entry, err);
}

static void check_doc(const char *file)
{
    char *text = slurp(file);
    if (strcmp(file, "stagehand.ini") != 0)
        check_spans(file, text);
    for (const char *p = strstr(text, "STAGEHAND_"); p; p = strstr(p + 10, "STAGEHAND_"))
        check_env_name(file, p);
    free(text);
}

static void test_docs_quote_real_keys(void **state)
{
    glob_t g;
    (void)state;
    problems = 0;
    check_doc("README.md");
    check_doc("stagehand.ini");
    assert_int_equal(glob("docs/*.md", 0, NULL, &g), 0);
    assert_true(g.gl_pathc > 0);
    for (size_t i = 0; i < g.gl_pathc; i++)
        check_doc(g.gl_pathv[i]);
    globfree(&g);
    assert_int_equal(problems, 0);
}

/* The checks above catch what they should: a doctored copy of each mistake. */
static void test_checks_catch_drift(void **state)
{
    int i = 0;
    (void)state;
    while (i < nini && strcmp(ini[i].name, "enabled") != 0) /* [general] comes first */
        i++;
    assert_true(i < nini);
    struct entry saved = ini[i];
    quiet = 1;
    problems = 0;
    check_span("x.md", "[policy] prefetch_windw = 3");
    check_span("x.md", "[polcy] eviction");
    check_span("x.md", "drain_mode = sideways");
    check_span("x.md", "max_inflight_d2h = max_inflight_h2d = 0");
    check_env_name("x.md", "STAGEHAND_BUDGET_VRAM_BUDGT_MB=1GB");
    check_env_name("x.md",
                   "STAGEHAND_TRACE=" /* over 255 characters: too long */
                   "/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    assert_int_equal(problems, 6);
    problems = 0;
    check_span("x.md", "[policy] eviction = lru");
    check_span("x.md", "max_inflight_d2h = max_inflight_h2d = 8");
    check_span("x.md", "cudaMalloc");
    check_env_name("x.md", "STAGEHAND_CONFIG=/etc/x.ini");
    assert_int_equal(problems, 0);
    snprintf(ini[i].value, sizeof ini[i].value, "false");
    snprintf(ini[i].comment, sizeof ini[i].comment, "int, 0..1");
    check_key(KEY_general_enabled);
    assert_int_equal(problems, 2);
    ini[i] = saved;
    quiet = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ini_has_no_unknown_key),
        cmocka_unit_test(test_ini_documents_every_key),
        cmocka_unit_test(test_defaults_parse),
        cmocka_unit_test(test_docs_quote_real_keys),
        cmocka_unit_test(test_checks_catch_drift),
    };
    return cmocka_run_group_tests_name("config_docs", tests, read_ini, NULL);
}
