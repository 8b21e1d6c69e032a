/* trace_read.c — the trace reader (docs/TRACE.md): parses any bytes at all
 * into an in-memory trace, checking every field and every reference (a region
 * is allocated only when not live, freed only when live, launched only while
 * live), and names the file and line of the first error. Files may be
 * gzip-compressed (zlib reads plain ones as they are).
 *
 * No shared state: a writer or a trace belongs to one caller at a time.
 */
#include "map/map.h"
#include "policy/trace_int.h"

#include "sh_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* The live region ids (values unused), for reference checks: ps->live. */

struct parser {
    const char *name;
    char *err;
    size_t errlen;
    uint32_t line;
    const char *cur, *end; /* the rest of the current line */
    struct sh_trace *t;
    struct sh_map live;
    uint64_t last_t;
    size_t *launch_ev; /* event index of each launch, for 'd' */
    size_t nlaunch, caplaunch;
    uint64_t *ids;
    size_t capids;
    struct span {
        uint64_t id, first, last; /* `i unchanged` records, applied at the end */
    } * spans;
    size_t nspans, capspans;
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
    if (sh_map_get(&ps->live, ev.id) != SH_MAP_NONE)
        return fail(ps, "region %llu allocated while live", (unsigned long long)ev.id);
    if (sh_map_set(&ps->live, ev.id, 1))
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
    if (sh_map_get(&ps->live, ev.id) == SH_MAP_NONE)
        return fail(ps, "free of region %llu, which is not live", (unsigned long long)ev.id);
    sh_map_del(&ps->live, ev.id);
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
    if (sh_trace_grow((void **)&ps->ids, &ps->capids, (size_t)n, sizeof *ps->ids))
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
        if (sh_map_get(&ps->live, ps->ids[i]) == SH_MAP_NONE)
            return fail(ps, "launch references region %llu, which is not live",
                        (unsigned long long)ps->ids[i]);
    }
    if ((rc = line_done(ps)))
        return rc;
    ev.ids = ps->ids;
    ev.n = (size_t)n;
    if (sh_trace_grow((void **)&ps->launch_ev, &ps->caplaunch, ps->nlaunch + 1,
                      sizeof *ps->launch_ev))
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
        (rc = field_word(ps, "phase", sh_trace_phases, 5, &ev.phase)) ||
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
/* `i ro SEQ N ID...`: launch SEQ only reads those of its regions. */
static int rec_read_only(struct parser *ps)
{
    uint64_t seq, n;
    int rc;
    if ((rc = field_u64(ps, "launch number", &seq)) || (rc = field_u64(ps, "region count", &n)))
        return rc;
    if (seq >= ps->nlaunch)
        return fail(ps, "read-only regions of launch %llu, but only %zu launches came before",
                    (unsigned long long)seq, ps->nlaunch);
    size_t ev = ps->launch_ev[seq];
    if (n > ps->t->ev[ev].n)
        return fail(ps, "%llu read-only regions, but launch %llu touches %zu",
                    (unsigned long long)n, (unsigned long long)seq, ps->t->ev[ev].n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t id;
        if ((rc = field_u64(ps, "region id", &id)))
            return rc;
        rc = sh_trace_set_read_only(ps->t, ev, id);
        if (rc == SH_ENOTFOUND)
            return fail(ps, "launch %llu does not touch region %llu", (unsigned long long)seq,
                        (unsigned long long)id);
        if (rc)
            return fail(ps, "out of memory");
    }
    return line_done(ps);
}

/* `i unchanged ID FIRST LAST`: launches FIRST..LAST only read region ID,
 * those of them that touch it. Kept, and applied once the file is read
 * (apply_unchanged), in one pass whatever the spans' lengths. */
static int rec_unchanged(struct parser *ps)
{
    uint64_t id, first, last;
    int rc;
    if ((rc = field_u64(ps, "region id", &id)) || (rc = field_u64(ps, "first launch", &first)) ||
        (rc = field_u64(ps, "last launch", &last)))
        return rc;
    if (first > last)
        return fail(ps, "unchanged from launch %llu to launch %llu: the first comes after the last",
                    (unsigned long long)first, (unsigned long long)last);
    if (last >= ps->nlaunch)
        return fail(ps, "unchanged up to launch %llu, but only %zu launches came before",
                    (unsigned long long)last, ps->nlaunch);
    if (last >= SH_MAP_NONE)
        return fail(ps, "unchanged up to launch %llu: too far into the trace",
                    (unsigned long long)last);
    if (sh_trace_grow((void **)&ps->spans, &ps->capspans, ps->nspans + 1, sizeof *ps->spans))
        return fail(ps, "out of memory");
    ps->spans[ps->nspans++] = (struct span){id, first, last};
    return line_done(ps);
}

static int span_before(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* Each launch's regions inside one of their spans are only read: launches
 * in order, a span made current for its region at its first launch. */
static int apply_unchanged(struct parser *ps)
{
    if (ps->nspans == 0)
        return 0;
    qsort(ps->spans, ps->nspans, sizeof *ps->spans, span_before);
    struct sh_map until = {0}; /* region -> the last launch of its current span */
    int rc = 0;
    size_t next = 0;
    for (size_t s = 0; s < ps->nlaunch && rc == 0; s++) {
        for (; next < ps->nspans && ps->spans[next].first == s && rc == 0; next++) {
            const struct span *sp = &ps->spans[next];
            uint32_t cur = sh_map_get(&until, sp->id); /* spans that overlap: their union */
            if (cur == SH_MAP_NONE || cur < s || cur < sp->last)
                rc = sh_map_set(&until, sp->id, (uint32_t)sp->last);
        }
        const struct sh_trace_event *e = &ps->t->ev[ps->launch_ev[s]];
        for (size_t k = 0; k < e->n && rc == 0; k++) {
            uint32_t last = sh_map_get(&until, e->ids[k]);
            if (last != SH_MAP_NONE && s <= last)
                rc = sh_trace_ro_at(ps->t, ps->launch_ev[s], k);
        }
    }
    sh_map_free(&until);
    return rc ? SH_ENOMEM : 0;
}

static int rec_info(struct parser *ps)
{
    const char *tok;
    size_t len;
    if (!token(ps, &tok, &len))
        return fail(ps, "missing info key");
    if (len == 2 && memcmp(tok, "ro", 2) == 0)
        return rec_read_only(ps);
    if (len == 9 && memcmp(tok, "unchanged", 9) == 0)
        return rec_unchanged(ps);
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
    if (rc == 0 && (rc = apply_unchanged(&ps)) != 0 && err && errlen)
        snprintf(err, errlen, "%s: out of memory", ps.name);
    sh_map_free(&ps.live);
    free(ps.launch_ev);
    free(ps.ids);
    free(ps.spans);
    if (rc) {
        sh_trace_destroy(ps.t);
        return rc;
    }
    *out = ps.t;
    return 0;
}

/* The whole file, decompressed if it is gzip; 0, or an error in err. */
static int read_all(const char *path, char **out, size_t *outlen, char *err, size_t errlen)
{
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
        return SH_ENOTFOUND;
    }
    gzbuffer(f, 1 << 17);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (sh_trace_grow((void **)&buf, &cap, len + 65536, 1)) {
            rc = SH_ENOMEM;
            break;
        }
        size_t room = cap - len < (1u << 30) ? cap - len : (1u << 30);
        int got = gzread(f, buf + len, (unsigned)room);
        if (got <= 0) {
            rc = got < 0 ? SH_EINVAL : 0;
            break;
        }
        len += (size_t)got;
    }
    int zerr = Z_OK;
    const char *zmsg = gzerror(f, &zerr);
    if (!rc && zerr == Z_BUF_ERROR) /* the input ended inside a gzip stream */
        rc = SH_EINVAL;
    if (err && errlen && rc)
        snprintf(err, errlen, "%s: %s", path,
                 rc == SH_ENOMEM        ? "out of memory"
                 : zerr == Z_BUF_ERROR  ? "truncated gzip data"
                 : zerr == Z_DATA_ERROR ? "corrupt gzip data"
                 : zerr == Z_ERRNO      ? strerror(errno)
                 : zmsg && *zmsg        ? zmsg
                                        : "read error");
    gzclose_r(f);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *outlen = len;
    return 0;
}

int sh_trace_read(const char *path, struct sh_trace **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!path || !out)
        return SH_EINVAL;
    *out = NULL;
    char *buf;
    size_t len;
    int rc = read_all(path, &buf, &len, err, errlen);
    if (rc)
        return rc;
    rc = sh_trace_parse(path, buf, len, out, err, errlen);
    free(buf);
    return rc;
}
