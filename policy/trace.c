/* trace.c — the trace format (docs/TRACE.md): buffered writer, in-memory
 * trace, and a reader that checks every field and every reference.
 *
 * No shared state: a writer or a trace belongs to one caller at a time.
 */
#include "policy/trace.h"

#include "policy/policy.h"
#include "sh_err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WBUF_SIZE    (256u * 1024u)
#define LINE_MAX_OUT 96 /* room for the longest fixed-size record */
#define NAME_MAX_LEN 4096

static const char *const phase_names[] = {"begin", "forward", "backward", "optimizer", "end"};
static const char class_chars[] = {'u', 'p', 't'};

const char *sh_trace_phase_name(int phase)
{
    if (phase < 0 || phase > SH_PHASE_STEP_END)
        return "?";
    return phase_names[phase];
}

/* ======================================================================
 * Writer
 * ====================================================================== */

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
    w_str(w, phase_names[phase]);
    w_str(w, marked ? " api\n" : " auto\n");
    return 0;
}

/* ======================================================================
 * A trace in memory
 * ====================================================================== */

struct kname {
    uint64_t kernel;
    char *name;
};

struct sh_trace {
    struct sh_trace_event *ev;
    size_t *ids_off; /* per event: offset of its ids in pool */
    size_t n, cap;
    uint64_t *pool;
    size_t npool, cappool;
    struct kname *names;
    size_t nnames, capnames;
    char *source;
};

int sh_trace_create(struct sh_trace **out)
{
    if (!out)
        return SH_EINVAL;
    *out = calloc(1, sizeof **out);
    return *out ? 0 : SH_ENOMEM;
}

void sh_trace_destroy(struct sh_trace *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nnames; i++)
        free(t->names[i].name);
    free(t->names);
    free(t->ev);
    free(t->ids_off);
    free(t->pool);
    free(t->source);
    free(t);
}

/* Grows an array to hold at least `need` elements (doubling). */
static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem)
            return SH_ENOMEM;
        c *= 2;
    }
    void *p = realloc(*arr, c * elem);
    if (!p)
        return SH_ENOMEM;
    *arr = p;
    *cap = c;
    return 0;
}

/* The pool moved: point every launch at its ids again. */
static void rebase_ids(struct sh_trace *t)
{
    for (size_t i = 0; i < t->n; i++)
        t->ev[i].ids = t->ev[i].n ? t->pool + t->ids_off[i] : NULL;
}

int sh_trace_append(struct sh_trace *t, const struct sh_trace_event *ev)
{
    if (!t || !ev || (ev->n && !ev->ids))
        return SH_EINVAL;
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 256;
        struct sh_trace_event *e = realloc(t->ev, c * sizeof *e);
        if (!e)
            return SH_ENOMEM;
        t->ev = e;
        size_t *o = realloc(t->ids_off, c * sizeof *o);
        if (!o)
            return SH_ENOMEM;
        t->ids_off = o;
        t->cap = c;
    }
    uint64_t *old = t->pool;
    if (ev->n > SIZE_MAX - t->npool ||
        grow((void **)&t->pool, &t->cappool, t->npool + ev->n, sizeof *t->pool))
        return SH_ENOMEM;
    struct sh_trace_event *e = &t->ev[t->n];
    *e = *ev;
    t->ids_off[t->n] = t->npool;
    if (ev->n)
        memcpy(t->pool + t->npool, ev->ids, ev->n * sizeof *ev->ids);
    t->npool += ev->n;
    e->ids = ev->n ? t->pool + t->ids_off[t->n] : NULL;
    t->n++;
    if (old != t->pool)
        rebase_ids(t);
    return 0;
}

int sh_trace_set_kernel_name(struct sh_trace *t, uint64_t kernel, const char *name)
{
    if (!t || !name)
        return SH_EINVAL;
    char *copy = strdup(name);
    if (!copy)
        return SH_ENOMEM;
    for (size_t i = 0; i < t->nnames; i++) {
        if (t->names[i].kernel == kernel) {
            free(t->names[i].name);
            t->names[i].name = copy;
            return 0;
        }
    }
    if (grow((void **)&t->names, &t->capnames, t->nnames + 1, sizeof *t->names)) {
        free(copy);
        return SH_ENOMEM;
    }
    t->names[t->nnames].kernel = kernel;
    t->names[t->nnames].name = copy;
    t->nnames++;
    return 0;
}

size_t sh_trace_count(const struct sh_trace *t)
{
    return t ? t->n : 0;
}

const struct sh_trace_event *sh_trace_at(const struct sh_trace *t, size_t i)
{
    return t && i < t->n ? &t->ev[i] : NULL;
}

const char *sh_trace_kernel_name(const struct sh_trace *t, uint64_t kernel)
{
    if (!t)
        return NULL;
    for (size_t i = 0; i < t->nnames; i++)
        if (t->names[i].kernel == kernel)
            return t->names[i].name;
    return NULL;
}

const char *sh_trace_source(const struct sh_trace *t)
{
    return t && t->source ? t->source : "";
}

/* ======================================================================
 * Reader
 * ====================================================================== */

/* A set of live region ids (open addressing), for reference checks. */
struct idset {
    uint64_t *keys; /* 0 = empty, 1 = deleted; ids are stored + 2 */
    size_t cap, used;
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Ids are stored shifted by 2 so that 0 and 1 can mark empty and deleted;
 * the two ids that would wrap are kept aside. */
struct live {
    struct idset s;
    int top[2]; /* ids UINT64_MAX-1 and UINT64_MAX */
};

static size_t idset_find(const struct idset *s, uint64_t k, int *found)
{
    size_t mask = s->cap - 1, i = mix(k) & mask, tomb = SIZE_MAX;
    for (;;) {
        uint64_t v = s->keys[i];
        if (v == 0) {
            *found = 0;
            return tomb != SIZE_MAX ? tomb : i;
        }
        if (v == 1) {
            if (tomb == SIZE_MAX)
                tomb = i;
        } else if (v == k) {
            *found = 1;
            return i;
        }
        i = (i + 1) & mask;
    }
}

static int idset_rehash(struct idset *s, size_t cap)
{
    uint64_t *old = s->keys;
    size_t oldcap = s->cap;
    s->keys = calloc(cap, sizeof *s->keys);
    if (!s->keys) {
        s->keys = old;
        return SH_ENOMEM;
    }
    s->cap = cap;
    s->used = 0;
    for (size_t i = 0; i < oldcap; i++) {
        if (old[i] > 1) {
            int f;
            s->keys[idset_find(s, old[i], &f)] = old[i];
            s->used++;
        }
    }
    free(old);
    return 0;
}

static int live_has(const struct live *l, uint64_t id)
{
    if (id >= UINT64_MAX - 1)
        return l->top[id - (UINT64_MAX - 1)];
    if (!l->s.cap)
        return 0;
    int f;
    idset_find(&l->s, id + 2, &f);
    return f;
}

static int live_add(struct live *l, uint64_t id)
{
    if (id >= UINT64_MAX - 1) {
        l->top[id - (UINT64_MAX - 1)] = 1;
        return 0;
    }
    /* used counts tombstones too, so probing always finds an empty slot */
    if ((l->s.used + 1) * 4 >= l->s.cap * 3 && idset_rehash(&l->s, l->s.cap ? l->s.cap * 2 : 64))
        return SH_ENOMEM;
    int f;
    size_t i = idset_find(&l->s, id + 2, &f);
    if (l->s.keys[i] == 0)
        l->s.used++;
    l->s.keys[i] = id + 2;
    return 0;
}

static void live_del(struct live *l, uint64_t id)
{
    if (id >= UINT64_MAX - 1) {
        l->top[id - (UINT64_MAX - 1)] = 0;
        return;
    }
    int f;
    size_t i = idset_find(&l->s, id + 2, &f);
    if (f)
        l->s.keys[i] = 1;
}

struct parser {
    const char *name;
    char *err;
    size_t errlen;
    uint32_t line;
    const char *cur, *end; /* the rest of the current line */
    struct sh_trace *t;
    struct live live;
    uint64_t last_t;
    size_t *launch_ev; /* event index of each launch, for 'd' */
    size_t nlaunch, caplaunch;
    uint64_t *ids;
    size_t capids;
};

__attribute__((format(printf, 2, 3))) static int fail(struct parser *ps, const char *fmt, ...)
{
    if (ps->err && ps->errlen) {
        int n = snprintf(ps->err, ps->errlen, "%s:%u: ", ps->name, (unsigned)ps->line);
        if (n >= 0 && (size_t)n < ps->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return SH_EINVAL;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* The next whitespace-separated token of the line; 0 when none is left. */
static int token(struct parser *ps, const char **tok, size_t *len)
{
    while (ps->cur < ps->end && is_space(*ps->cur))
        ps->cur++;
    if (ps->cur == ps->end)
        return 0;
    *tok = ps->cur;
    while (ps->cur < ps->end && !is_space(*ps->cur))
        ps->cur++;
    *len = (size_t)(ps->cur - *tok);
    return 1;
}

/* A token shown in a message: printable, and short. */
static void shown(const char *tok, size_t len, char *out, size_t outlen)
{
    size_t j = 0;
    for (size_t i = 0; i < len && j + 5 < outlen; i++) {
        unsigned char c = (unsigned char)tok[i];
        if (i == 24) {
            memcpy(out + j, "...", 3);
            j += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f) {
            out[j++] = (char)c;
        } else {
            j += (size_t)snprintf(out + j, outlen - j, "\\x%02x", c);
        }
    }
    out[j] = 0;
}

/* Decimal, or hexadecimal after 0x; no sign, no overflow. */
static int parse_u64(const char *tok, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    int base = 10;
    if (len > 2 && tok[0] == '0' && (tok[1] == 'x' || tok[1] == 'X')) {
        base = 16;
        i = 2;
    }
    if (i == len)
        return -1;
    for (; i < len; i++) {
        char c = tok[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (base == 16 && c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (base == 16 && c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return -1;
        if (v > (UINT64_MAX - d) / (uint64_t)base)
            return -1;
        v = v * (uint64_t)base + d;
    }
    *out = v;
    return 0;
}

static int field_u64(struct parser *ps, const char *what, uint64_t *out)
{
    const char *tok;
    size_t len;
    if (!token(ps, &tok, &len))
        return fail(ps, "missing %s", what);
    if (parse_u64(tok, len, out)) {
        char s[128];
        shown(tok, len, s, sizeof s);
        return fail(ps, "%s: not a number: \"%s\"", what, s);
    }
    return 0;
}

static int field_word(struct parser *ps, const char *what, const char *const *words, int nwords,
                      int *out)
{
    const char *tok;
    size_t len;
    if (!token(ps, &tok, &len))
        return fail(ps, "missing %s", what);
    for (int i = 0; i < nwords; i++) {
        if (strlen(words[i]) == len && memcmp(words[i], tok, len) == 0) {
            *out = i;
            return 0;
        }
    }
    char s[128];
    shown(tok, len, s, sizeof s);
    return fail(ps, "%s: unknown value \"%s\"", what, s);
}

static int line_done(struct parser *ps)
{
    const char *tok;
    size_t len;
    if (token(ps, &tok, &len)) {
        char s[128];
        shown(tok, len, s, sizeof s);
        return fail(ps, "unexpected \"%s\" at the end of the line", s);
    }
    return 0;
}

static int field_time(struct parser *ps, uint64_t *t)
{
    int rc = field_u64(ps, "time", t);
    if (rc)
        return rc;
    if (*t < ps->last_t)
        return fail(ps, "time goes backwards (%llu after %llu)", (unsigned long long)*t,
                    (unsigned long long)ps->last_t);
    ps->last_t = *t;
    return 0;
}

static const char *const class_words[] = {"u", "p", "t"};
static const char *const mark_words[] = {"auto", "api"};

static int append(struct parser *ps, struct sh_trace_event *ev)
{
    ev->line = ps->line;
    if (sh_trace_append(ps->t, ev))
        return fail(ps, "out of memory");
    return 0;
}

static int rec_alloc(struct parser *ps)
{
    struct sh_trace_event ev = {.type = SH_TRACE_ALLOC};
    int rc;
    if ((rc = field_time(ps, &ev.t_us)) || (rc = field_u64(ps, "region id", &ev.id)) ||
        (rc = field_u64(ps, "bytes", &ev.bytes)) || (rc = field_u64(ps, "stream", &ev.stream)) ||
        (rc = field_word(ps, "class", class_words, 3, &ev.cls)) || (rc = line_done(ps)))
        return rc;
    if (ev.bytes == 0)
        return fail(ps, "region %llu has 0 bytes", (unsigned long long)ev.id);
    if (live_has(&ps->live, ev.id))
        return fail(ps, "region %llu allocated while live", (unsigned long long)ev.id);
    if (live_add(&ps->live, ev.id))
        return fail(ps, "out of memory");
    return append(ps, &ev);
}

static int rec_free(struct parser *ps)
{
    struct sh_trace_event ev = {.type = SH_TRACE_FREE};
    int rc;
    if ((rc = field_time(ps, &ev.t_us)) || (rc = field_u64(ps, "region id", &ev.id)) ||
        (rc = field_word(ps, "class", class_words, 3, &ev.cls)) || (rc = line_done(ps)))
        return rc;
    if (!live_has(&ps->live, ev.id))
        return fail(ps, "free of region %llu, which is not live", (unsigned long long)ev.id);
    live_del(&ps->live, ev.id);
    return append(ps, &ev);
}

static int rec_launch(struct parser *ps)
{
    struct sh_trace_event ev = {.type = SH_TRACE_LAUNCH};
    int rc;
    if ((rc = field_time(ps, &ev.t_us)))
        return rc;
    const char *tok;
    size_t len;
    if (!token(ps, &tok, &len))
        return fail(ps, "missing duration");
    if (len == 1 && tok[0] == '-') {
        ev.dur_us = SH_TRACE_NO_DUR;
    } else if (parse_u64(tok, len, &ev.dur_us) || ev.dur_us == SH_TRACE_NO_DUR) {
        char s[128];
        shown(tok, len, s, sizeof s);
        return fail(ps, "duration: not a number: \"%s\"", s);
    }
    uint64_t n;
    if ((rc = field_u64(ps, "stream", &ev.stream)) || (rc = field_u64(ps, "kernel", &ev.kernel)) ||
        (rc = field_u64(ps, "region count", &n)))
        return rc;
    if (n > SH_TRACE_MAX_REFS)
        return fail(ps, "region count %llu is over the limit of %u", (unsigned long long)n,
                    SH_TRACE_MAX_REFS);
    if (grow((void **)&ps->ids, &ps->capids, (size_t)n, sizeof *ps->ids))
        return fail(ps, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!token(ps, &tok, &len))
            return fail(ps, "missing region %zu of %llu", i + 1, (unsigned long long)n);
        if (parse_u64(tok, len, &ps->ids[i])) {
            char s[128];
            shown(tok, len, s, sizeof s);
            return fail(ps, "region %zu of %llu: not a number: \"%s\"", i + 1,
                        (unsigned long long)n, s);
        }
        if (!live_has(&ps->live, ps->ids[i]))
            return fail(ps, "launch references region %llu, which is not live",
                        (unsigned long long)ps->ids[i]);
    }
    if ((rc = line_done(ps)))
        return rc;
    ev.ids = ps->ids;
    ev.n = (size_t)n;
    if (grow((void **)&ps->launch_ev, &ps->caplaunch, ps->nlaunch + 1, sizeof *ps->launch_ev))
        return fail(ps, "out of memory");
    ps->launch_ev[ps->nlaunch++] = ps->t->n;
    return append(ps, &ev);
}

static int rec_duration(struct parser *ps)
{
    uint64_t seq, dur;
    int rc;
    if ((rc = field_u64(ps, "launch number", &seq)) || (rc = field_u64(ps, "duration", &dur)) ||
        (rc = line_done(ps)))
        return rc;
    if (seq >= ps->nlaunch)
        return fail(ps, "duration for launch %llu, but only %zu launches came before",
                    (unsigned long long)seq, ps->nlaunch);
    if (dur == SH_TRACE_NO_DUR)
        return fail(ps, "duration: out of range");
    ps->t->ev[ps->launch_ev[seq]].dur_us = dur;
    return 0;
}

static int rec_step(struct parser *ps)
{
    struct sh_trace_event ev = {.type = SH_TRACE_STEP};
    int rc;
    if ((rc = field_time(ps, &ev.t_us)) || (rc = field_u64(ps, "step", &ev.step)) ||
        (rc = field_word(ps, "mark", mark_words, 2, &ev.marked)) || (rc = line_done(ps)))
        return rc;
    return append(ps, &ev);
}

static int rec_phase(struct parser *ps)
{
    struct sh_trace_event ev = {.type = SH_TRACE_PHASE};
    int rc;
    if ((rc = field_time(ps, &ev.t_us)) ||
        (rc = field_word(ps, "phase", phase_names, 5, &ev.phase)) ||
        (rc = field_word(ps, "mark", mark_words, 2, &ev.marked)) || (rc = line_done(ps)))
        return rc;
    return append(ps, &ev);
}

/* The rest of the line, trimmed, as a new string; NULL when out of memory. */
static char *rest_of_line(struct parser *ps)
{
    while (ps->cur < ps->end && is_space(*ps->cur))
        ps->cur++;
    const char *e = ps->end;
    while (e > ps->cur && is_space(e[-1]))
        e--;
    size_t n = (size_t)(e - ps->cur);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, ps->cur, n);
        s[n] = 0;
    }
    return s;
}

static int rec_kernel(struct parser *ps)
{
    uint64_t k;
    int rc = field_u64(ps, "kernel", &k);
    if (rc)
        return rc;
    if ((size_t)(ps->end - ps->cur) > NAME_MAX_LEN)
        return fail(ps, "kernel name longer than %d bytes", NAME_MAX_LEN);
    char *name = rest_of_line(ps);
    if (!name)
        return fail(ps, "out of memory");
    if (!*name) {
        free(name);
        return fail(ps, "missing kernel name");
    }
    rc = sh_trace_set_kernel_name(ps->t, k, name);
    free(name);
    return rc ? fail(ps, "out of memory") : 0;
}

/* "i KEY VALUE...": only "source" is known; other keys are for later versions. */
static int rec_info(struct parser *ps)
{
    const char *tok;
    size_t len;
    if (!token(ps, &tok, &len))
        return fail(ps, "missing info key");
    if (len != 6 || memcmp(tok, "source", 6) != 0)
        return 0;
    if ((size_t)(ps->end - ps->cur) > NAME_MAX_LEN)
        return fail(ps, "source longer than %d bytes", NAME_MAX_LEN);
    char *s = rest_of_line(ps);
    if (!s)
        return fail(ps, "out of memory");
    free(ps->t->source);
    ps->t->source = s;
    return 0;
}

static int header(struct parser *ps)
{
    static const char magic[] = "stagehand-trace";
    const char *tok;
    size_t len;
    if (!token(ps, &tok, &len) || len != sizeof magic - 1 || memcmp(tok, magic, len) != 0)
        return fail(ps, "not a stagehand trace (the first line must be \"stagehand-trace %d\")",
                    SH_TRACE_VERSION);
    uint64_t v;
    int rc = field_u64(ps, "version", &v);
    if (rc)
        return rc;
    if (v != SH_TRACE_VERSION)
        return fail(ps, "version %llu is not supported (this reader knows version %d)",
                    (unsigned long long)v, SH_TRACE_VERSION);
    return line_done(ps);
}

static int record(struct parser *ps)
{
    const char *tok;
    size_t len;
    if (!token(ps, &tok, &len) || tok[0] == '#')
        return 0; /* blank or comment */
    if (len == 1) {
        switch (tok[0]) {
        case 'a':
            return rec_alloc(ps);
        case 'f':
            return rec_free(ps);
        case 'l':
            return rec_launch(ps);
        case 'd':
            return rec_duration(ps);
        case 's':
            return rec_step(ps);
        case 'p':
            return rec_phase(ps);
        case 'k':
            return rec_kernel(ps);
        case 'i':
            return rec_info(ps);
        default:
            break;
        }
    }
    char s[128];
    shown(tok, len, s, sizeof s);
    return fail(ps, "unknown record \"%s\"", s);
}

static int parse_all(struct parser *ps, const char *text, size_t len)
{
    const char *p = text, *end = text + len;
    if (len == 0) {
        ps->line = 1;
        return fail(ps, "empty file (the first line must be \"stagehand-trace %d\")",
                    SH_TRACE_VERSION);
    }
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        ps->line++;
        ps->cur = p;
        ps->end = le;
        if (ps->end > ps->cur && ps->end[-1] == '\r')
            ps->end--;
        const char *nul = memchr(ps->cur, 0, (size_t)(ps->end - ps->cur));
        if (nul)
            return fail(ps, "NUL byte at column %zu", (size_t)(nul - p) + 1);
        int rc = ps->line == 1 ? header(ps) : record(ps);
        if (rc)
            return rc;
        p = nl ? nl + 1 : end;
    }
    return 0;
}

int sh_trace_parse(const char *name, const char *text, size_t len, struct sh_trace **out, char *err,
                   size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out || (len && !text))
        return SH_EINVAL;
    *out = NULL;
    struct parser ps = {.name = name ? name : "trace", .err = err, .errlen = errlen};
    int rc = sh_trace_create(&ps.t);
    if (rc)
        return rc;
    rc = parse_all(&ps, text, len);
    free(ps.live.s.keys);
    free(ps.launch_ev);
    free(ps.ids);
    if (rc) {
        sh_trace_destroy(ps.t);
        return rc;
    }
    *out = ps.t;
    return 0;
}

int sh_trace_read(const char *path, struct sh_trace **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!path || !out)
        return SH_EINVAL;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return SH_ENOTFOUND;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (grow((void **)&buf, &cap, len + 65536, 1)) {
            rc = SH_ENOMEM;
            break;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (!rc && ferror(f))
        rc = SH_EINVAL;
    fclose(f);
    if (rc) {
        if (err && errlen)
            snprintf(err, errlen, "%s: %s", path, rc == SH_ENOMEM ? "out of memory" : "read error");
        free(buf);
        return rc;
    }
    rc = sh_trace_parse(path, buf, len, out, err, errlen);
    free(buf);
    return rc;
}

static int save_event(struct sh_trace_writer *w, const struct sh_trace_event *e)
{
    switch (e->type) {
    case SH_TRACE_ALLOC:
        return sh_trace_write_alloc(w, e->t_us, e->id, e->bytes, e->stream, e->cls);
    case SH_TRACE_FREE:
        return sh_trace_write_free(w, e->t_us, e->id, e->cls);
    case SH_TRACE_LAUNCH:
        return sh_trace_write_launch(w, e->t_us, e->dur_us, e->stream, e->kernel, e->ids, e->n,
                                     NULL);
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
