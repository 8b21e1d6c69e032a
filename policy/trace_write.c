/* trace_write.c — the trace writer (docs/TRACE.md): records formatted into a
 * buffer without printf and written one fwrite per full buffer, the first
 * error kept; and sh_trace_save(), which writes a whole in-memory trace with it.
 *
 * No shared state: a writer or a trace belongs to one caller at a time.
 */
#include "policy/trace_int.h"

#include "policy/policy.h"
#include "sh_err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WBUF_SIZE    (256u * 1024u)
#define LINE_MAX_OUT 96 /* room for the longest fixed-size record */

static const char class_chars[] = {'u', 'p', 't'};

struct sh_trace_writer {
    FILE *f;
    char *buf;
    size_t len;
    int err;          /* first error, sticky */
    uint64_t seq;     /* launches written */
    uint64_t flushed; /* bytes handed to fwrite */
    pid_t owner;      /* the process that opened it */
};

static int w_flush(struct sh_trace_writer *w)
{
    if (w->err)
        return w->err;
    /* A fork child inherits the buffer; its exit() must not write the parent's
     * records (and header) a second time. */
    if (getpid() != w->owner) {
        w->len = 0;
        return 0;
    }
    if (w->len && fwrite(w->buf, 1, w->len, w->f) != w->len)
        w->err = SH_EINVAL;
    w->flushed += w->len;
    w->len = 0;
    return w->err;
}

/* Makes room for `need` more bytes; flushing is the only thing that can fail. */
static int w_room(struct sh_trace_writer *w, size_t need)
{
    if (w->err)
        return w->err;
    if (WBUF_SIZE - w->len < need)
        return w_flush(w);
    return 0;
}

static void w_char(struct sh_trace_writer *w, char c)
{
    w->buf[w->len++] = c;
}

static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233"
                            "34353637383940414243444546474849505152535455565758596061626364656667"
                            "6869707172737475767778798081828384858687888990919293949596979899";

/* Decimal without printf, two digits per division: this runs for every
 * field of every launch. The caller made room. */
static void w_u64(struct sh_trace_writer *w, uint64_t v)
{
    char tmp[20];
    int n = 20;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        tmp[--n] = pairs[2 * r + 1];
        tmp[--n] = pairs[2 * r];
    }
    if (v >= 10) {
        tmp[--n] = pairs[2 * v + 1];
        tmp[--n] = pairs[2 * v];
    } else {
        tmp[--n] = (char)('0' + v);
    }
    memcpy(w->buf + w->len, tmp + n, (size_t)(20 - n));
    w->len += (size_t)(20 - n);
}

static void w_sp_u64(struct sh_trace_writer *w, uint64_t v)
{
    w_char(w, ' ');
    w_u64(w, v);
}

static void w_str(struct sh_trace_writer *w, const char *s)
{
    while (*s)
        w_char(w, *s++);
}

static char class_char(int cls)
{
    return cls >= 0 && cls <= SH_CLASS_TRANSIENT ? class_chars[cls] : 'u';
}

static void set_why(char *why, size_t len, const char *path, const char *reason)
{
    if (why && len)
        snprintf(why, len, "%s: %s", path, reason);
}

/* Opens path for writing without following a final symbolic link or blocking on a
 * FIFO; refuses anything but a regular file this user owns, and only then
 * truncates it. A new file is readable by its owner only. */
static FILE *create_private(const char *path, char *why, size_t whylen)
{
    struct stat st;
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0) {
        set_why(why, whylen, path,
                errno == ELOOP   ? "is a symbolic link; not following it"
                : errno == ENXIO ? "is a FIFO or a device, not a regular file"
                                 : strerror(errno));
        return NULL;
    }
    const char *bad = fstat(fd, &st)                                   ? strerror(errno)
                      : !S_ISREG(st.st_mode)                           ? "not a regular file"
                      : st.st_uid != geteuid()                         ? "owned by another user"
                      : ftruncate(fd, 0) || fcntl(fd, F_SETFL, 0) != 0 ? strerror(errno)
                                                                       : NULL;
    FILE *f = bad ? NULL : fdopen(fd, "w");
    if (!f) {
        int e = !bad || !S_ISREG(st.st_mode) || st.st_uid == geteuid()
                    ? errno
                    : EPERM; /* errno says why to callers that have no `why` */
        if (bad && !S_ISREG(st.st_mode))
            e = S_ISDIR(st.st_mode) ? EISDIR : ENXIO;
        set_why(why, whylen, path, bad ? bad : strerror(errno));
        close(fd);
        errno = e;
        return NULL;
    }
    setvbuf(f, NULL, _IONBF, 0); /* the writer buffers; stdio must hold nothing back */
    return f;
}

int sh_trace_writer_open(const char *path, const char *source, struct sh_trace_writer **out)
{
    return sh_trace_writer_create(path, source, out, NULL, 0);
}

int sh_trace_writer_create(const char *path, const char *source, struct sh_trace_writer **out,
                           char *why, size_t whylen)
{
    if (!path || !out)
        return SH_EINVAL;
    *out = NULL;
    struct sh_trace_writer *w = calloc(1, sizeof *w);
    if (!w)
        return SH_ENOMEM;
    w->buf = malloc(WBUF_SIZE);
    w->f = w->buf ? create_private(path, why, whylen) : NULL;
    if (!w->buf || !w->f) {
        int rc = w->buf ? SH_ENOTFOUND : SH_ENOMEM;
        free(w->buf);
        free(w);
        return rc;
    }
    w->owner = getpid();
    w_str(w, "stagehand-trace ");
    w_u64(w, SH_TRACE_VERSION);
    w_char(w, '\n');
    if (source && *source) {
        w_str(w, "i source ");
        for (const char *s = source; *s && w->len < NAME_MAX_LEN; s++)
            w_char(w, (*s == '\n' || *s == '\r') ? ' ' : *s);
        w_char(w, '\n');
    }
    *out = w;
    return 0;
}

int sh_trace_writer_flush(struct sh_trace_writer *w)
{
    if (!w)
        return SH_EINVAL;
    if (w_flush(w) == 0 && fflush(w->f) != 0)
        w->err = SH_EINVAL;
    return w->err;
}

int sh_trace_writer_close(struct sh_trace_writer *w)
{
    if (!w)
        return 0;
    int rc = sh_trace_writer_flush(w);
    if (fclose(w->f) != 0 && rc == 0)
        rc = SH_EINVAL;
    free(w->buf);
    free(w);
    return rc;
}

uint64_t sh_trace_writer_bytes(const struct sh_trace_writer *w)
{
    return w ? w->flushed + w->len : 0;
}

uint64_t sh_trace_writer_launches(const struct sh_trace_writer *w)
{
    return w ? w->seq : 0;
}

int sh_trace_write_kernel(struct sh_trace_writer *w, uint64_t kernel, const char *name)
{
    if (!w || !name)
        return SH_EINVAL;
    size_t n = strnlen(name, NAME_MAX_LEN);
    int rc = w_room(w, LINE_MAX_OUT + n);
    if (rc)
        return rc;
    w_char(w, 'k');
    w_sp_u64(w, kernel);
    w_char(w, ' ');
    for (size_t i = 0; i < n; i++)
        w_char(w, (name[i] == '\n' || name[i] == '\r') ? ' ' : name[i]);
    if (n == 0)
        w_char(w, '?');
    w_char(w, '\n');
    return 0;
}

int sh_trace_write_alloc(struct sh_trace_writer *w, uint64_t t_us, uint64_t id, uint64_t bytes,
                         uint64_t stream, int cls)
{
    if (!w)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_char(w, 'a');
    w_sp_u64(w, t_us);
    w_sp_u64(w, id);
    w_sp_u64(w, bytes);
    w_sp_u64(w, stream);
    w_char(w, ' ');
    w_char(w, class_char(cls));
    w_char(w, '\n');
    return 0;
}

int sh_trace_write_free(struct sh_trace_writer *w, uint64_t t_us, uint64_t id, int cls)
{
    if (!w)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_char(w, 'f');
    w_sp_u64(w, t_us);
    w_sp_u64(w, id);
    w_char(w, ' ');
    w_char(w, class_char(cls));
    w_char(w, '\n');
    return 0;
}

int sh_trace_write_launch(struct sh_trace_writer *w, uint64_t t_us, uint64_t dur_us,
                          uint64_t stream, uint64_t kernel, const uint64_t *ids, size_t n,
                          uint64_t *seq)
{
    if (!w || (n && !ids) || n > SH_TRACE_MAX_REFS)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_char(w, 'l');
    w_sp_u64(w, t_us);
    if (dur_us == SH_TRACE_NO_DUR) {
        w_str(w, " -");
    } else {
        w_sp_u64(w, dur_us);
    }
    w_sp_u64(w, stream);
    w_sp_u64(w, kernel);
    w_sp_u64(w, n);
    for (size_t i = 0; i < n; i++) {
        rc = w_room(w, 24); /* a long launch may span buffers */
        if (rc)
            return rc;
        w_sp_u64(w, ids[i]);
    }
    w_char(w, '\n');
    if (seq)
        *seq = w->seq;
    w->seq++;
    return 0;
}

int sh_trace_write_duration(struct sh_trace_writer *w, uint64_t seq, uint64_t dur_us)
{
    if (!w || seq >= w->seq || dur_us == SH_TRACE_NO_DUR)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_char(w, 'd');
    w_sp_u64(w, seq);
    w_sp_u64(w, dur_us);
    w_char(w, '\n');
    return 0;
}

int sh_trace_write_read_only(struct sh_trace_writer *w, uint64_t seq, const uint64_t *ids, size_t n)
{
    if (!w || seq >= w->seq || (n && !ids) || n > SH_TRACE_MAX_REFS)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_str(w, "i ro");
    w_sp_u64(w, seq);
    w_sp_u64(w, n);
    for (size_t i = 0; i < n; i++) {
        rc = w_room(w, 24);
        if (rc)
            return rc;
        w_sp_u64(w, ids[i]);
    }
    w_char(w, '\n');
    return 0;
}

int sh_trace_write_unchanged(struct sh_trace_writer *w, uint64_t id, uint64_t first, uint64_t last)
{
    if (!w || first > last || last >= w->seq)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_str(w, "i unchanged");
    w_sp_u64(w, id);
    w_sp_u64(w, first);
    w_sp_u64(w, last);
    w_char(w, '\n');
    return 0;
}

/* The `i ro` record of a launch just written, if it reads some region only. */
static int save_read_only(struct sh_trace_writer *w, const struct sh_trace_event *e)
{
    size_t m = 0;
    for (size_t k = 0; e->ro && k < e->n; k++)
        m += e->ro[k];
    if (m == 0)
        return 0;
    uint64_t *ids = malloc(m * sizeof *ids);
    if (!ids)
        return SH_ENOMEM;
    m = 0;
    for (size_t k = 0; k < e->n; k++)
        if (e->ro[k])
            ids[m++] = e->ids[k];
    int rc = sh_trace_write_read_only(w, w->seq - 1, ids, m);
    free(ids);
    return rc;
}

int sh_trace_write_step(struct sh_trace_writer *w, uint64_t t_us, uint64_t step, int marked)
{
    if (!w)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_char(w, 's');
    w_sp_u64(w, t_us);
    w_sp_u64(w, step);
    w_str(w, marked ? " api\n" : " auto\n");
    return 0;
}

int sh_trace_write_phase(struct sh_trace_writer *w, uint64_t t_us, int phase, int marked)
{
    if (!w || phase < 0 || phase > SH_PHASE_STEP_END)
        return SH_EINVAL;
    int rc = w_room(w, LINE_MAX_OUT);
    if (rc)
        return rc;
    w_char(w, 'p');
    w_sp_u64(w, t_us);
    w_char(w, ' ');
    w_str(w, sh_trace_phases[phase]);
    w_str(w, marked ? " api\n" : " auto\n");
    return 0;
}

static int save_event(struct sh_trace_writer *w, const struct sh_trace_event *e)
{
    switch (e->type) {
    case SH_TRACE_ALLOC:
        return sh_trace_write_alloc(w, e->t_us, e->id, e->bytes, e->stream, e->cls);
    case SH_TRACE_FREE:
        return sh_trace_write_free(w, e->t_us, e->id, e->cls);
    case SH_TRACE_LAUNCH: {
        int rc =
            sh_trace_write_launch(w, e->t_us, e->dur_us, e->stream, e->kernel, e->ids, e->n, NULL);
        return rc ? rc : save_read_only(w, e);
    }
    case SH_TRACE_STEP:
        return sh_trace_write_step(w, e->t_us, e->step, e->marked);
    case SH_TRACE_PHASE:
        return sh_trace_write_phase(w, e->t_us, e->phase, e->marked);
    default:
        return SH_EINVAL;
    }
}

int sh_trace_save(const struct sh_trace *t, const char *path, const char *source)
{
    if (!t)
        return SH_EINVAL;
    struct sh_trace_writer *w;
    int rc = sh_trace_writer_open(path, source, &w);
    if (rc)
        return rc;
    for (size_t i = 0; !rc && i < t->nnames; i++)
        rc = sh_trace_write_kernel(w, t->names[i].kernel, t->names[i].name);
    for (size_t i = 0; !rc && i < t->n; i++)
        rc = save_event(w, &t->ev[i]);
    int rc2 = sh_trace_writer_close(w);
    return rc ? rc : rc2;
}
