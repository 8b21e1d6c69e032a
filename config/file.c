/* file.c — stagehand.ini: the INI reader (inih, fed one line at a time so that
 * every key knows its line), the trust checks a file must pass before it is read
 * (no symbolic link, FIFO or directory; owned by you or root and writable by no
 * one else; only root's under secure execution), and the search order
 * ($STAGEHAND_CONFIG, then ./stagehand.ini).
 *
 * No state: every function works on the caller's struct and buffers (a parse's
 * own state lives on its stack), so all of it is reentrant.
 */
#include "config/config_int.h"
#include "sh_err.h"

#include <ini.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* ---- INI files ------------------------------------------------------------ */

static int file_slot(struct sh_config *cfg, const char *name)
{
    for (int i = 0; i < SH_CONFIG_MAX_FILES; i++) {
        if (!cfg->files_[i][0])
            sh_cfg_copy(cfg->files_[i], SH_CONFIG_STR_MAX, name);
        if (strncmp(cfg->files_[i], name, SH_CONFIG_STR_MAX - 1) == 0)
            return i;
    }
    return -1;
}

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
    sh_cfg_say(p->err, p->errlen, "%s:%d: %s: %s", p->name, p->line, subject, msg);
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
    if (!end || sh_cfg_section(buf + 1, (size_t)(end - buf - 1)) >= 0)
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
    int sec = sh_cfg_section(section, strlen(section));
    if (sec < 0)
        return fail(p, name, "in unknown section [%s]", section);
    int k = sh_cfg_key(sec, name, strlen(name));
    if (k < 0)
        return fail(p, name, "unknown key in [%s]", sh_cfg_sections[sec]);
    if (sh_cfg_apply(p->cfg, k, value, msg, sizeof msg))
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
        return sh_cfg_say(err, errlen, "%s: too many configuration files (at most %d)", name,
                          SH_CONFIG_MAX_FILES);
    int rc = ini_parse_stream(read_line, &p, on_pair, &p);
    if (rc > 0 && (!p.err_line || rc < p.err_line))
        return sh_cfg_say(err, errlen,
                          "%s:%d: syntax error: expected \"[section]\" or \"key = value\"", name,
                          rc);
    if (p.err_line)
        return SH_EINVAL;
    if (rc < 0) {
        sh_cfg_say(err, errlen, "%s: out of memory while parsing", name);
        return SH_ENOMEM;
    }
    if (fp && ferror(fp))
        return sh_cfg_say(err, errlen, "%s: read error", name);
    *cfg = tmp;
    return 0;
}

static int open_failed(const char *who, const char *path, char *err, size_t errlen)
{
    char buf[128];
    const char *why = errno == ELOOP ? "it is a symbolic link; name the file itself"
                                     : strerror_r(errno, buf, sizeof buf);
    if (who)
        sh_cfg_say(err, errlen, "%s: cannot open %s: %s", who, path, why);
    else
        sh_cfg_say(err, errlen, "%s: cannot open: %s", path, why);
    return SH_ENOTFOUND;
}

/* Secure execution (setuid, setgid, capabilities): the environment belongs to
 * a less trusted user. Weak so that a test can stand in for the kernel. */
__attribute__((weak)) int sh_config_secure(void)
{
    return getauxval(AT_SECURE) != 0;
}

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

/* Why a configuration file must not be trusted, or NULL when it may be: it can
 * name a library to load and files to truncate, so only its reader's own user or
 * root may own it, nobody else may write it, and under secure execution only
 * root may own it. */
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
        return sh_cfg_say(err, errlen, "%s: refused %s: %s", who, path, why);
    return sh_cfg_say(err, errlen, "%s: refused: %s", path, why);
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

/* ---- the search order ------------------------------------------------------ */

int sh_cfg_load_found(struct sh_config *cfg, char *const *envp, int secure, char *used,
                      size_t usedlen, char *err, size_t errlen)
{
    const char *path = sh_cfg_env_get(envp, "STAGEHAND_CONFIG");
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
        sh_cfg_copy(used, usedlen, path);
    return rc;
}
