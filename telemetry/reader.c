/* reader.c — opening, checking and reading a stagehand.<pid> segment.
 *
 * Every header field is checked before it is used, the segment is read with
 * pread() rather than through a mapping (a file that shrinks meanwhile gives a
 * short read, never SIGBUS), and the copied snapshot is clamped: a corrupt or
 * hostile segment yields an error or a sane snapshot, never a crash. A segment
 * another user owns than the process its name gives is refused as forged.
 *
 * A reader is used by one thread at a time; it holds no lock. The segment is
 * read under its seqlock (tm_internal.h).
 */
#include "telemetry/tm_internal.h"

#include "sh_err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct sh_tm_reader {
    int fd;
    struct sh_tm_shm_hdr hdr; /* a private copy: the header never changes but seq */
    char path[PATH_MAX];
};

/* Checks the header copy against the file size; 0 or SH_EINVAL/SH_ERANGE. */
static int check_header(const struct sh_tm_shm_hdr *h, uint64_t fsize, const char *path, char *err,
                        size_t errlen)
{
    if (memcmp(h->magic, SH_TM_MAGIC, 8) != 0) {
        for (int i = 0; i < 8; i++)
            if (h->magic[i])
                return sh_err_say(SH_EINVAL, err, errlen, "%s: not a stagehand segment (bad magic)",
                                  path);
        return sh_err_say(SH_EINVAL, err, errlen,
                          "%s: segment not initialised (still being created?)", path);
    }
    if (h->major != SH_TM_MAJOR)
        return sh_err_say(SH_ERANGE, err, errlen,
                          "%s: segment version %u.%u; this reader understands %d.x", path, h->major,
                          h->minor, SH_TM_MAJOR);
    if (h->total_size != fsize)
        return sh_err_say(SH_EINVAL, err, errlen,
                          "%s: truncated or corrupt: header says %llu bytes, file has %llu", path,
                          (unsigned long long)h->total_size, (unsigned long long)fsize);
    if (h->hdr_size < SH_TM_HDR_SIZE || h->hdr_size > h->total_size)
        return sh_err_say(SH_EINVAL, err, errlen, "%s: corrupt: header size %u", path, h->hdr_size);
    if (h->snap_offset < h->hdr_size || h->snap_offset % 8 || h->snap_size % 8 ||
        h->snap_size == 0 || h->snap_size > SH_TM_MAX_SNAP || h->snap_offset > h->total_size ||
        h->snap_size > h->total_size - h->snap_offset)
        return sh_err_say(SH_EINVAL, err, errlen,
                          "%s: corrupt: snapshot at %llu, %llu bytes, in %llu", path,
                          (unsigned long long)h->snap_offset, (unsigned long long)h->snap_size,
                          (unsigned long long)h->total_size);
    if (h->pid <= 0)
        return sh_err_say(SH_EINVAL, err, errlen, "%s: corrupt: pid %d", path, (int)h->pid);
    if (h->start_ticks == 0) /* a forger's way round the reused-pid check */
        return sh_err_say(SH_EINVAL, err, errlen, "%s: corrupt: start time 0", path);
    return SH_OK;
}

static int open_fd(const char *path, int *fd, uint64_t *fsize, char *err, size_t errlen)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO must not block */
    if (*fd < 0)
        return sh_err_say(errno == ENOENT ? SH_ENOTFOUND : SH_EINVAL, err, errlen, "%s: %s", path,
                          strerror(errno));
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        return sh_err_say(SH_EINVAL, err, errlen, "%s: not a regular file", path);
    }
    *fsize = (uint64_t)st.st_size;
    if (*fsize < SH_TM_HDR_SIZE) {
        close(*fd);
        return sh_err_say(SH_EINVAL, err, errlen,
                          "%s: truncated: %llu bytes, a segment header alone is %d", path,
                          (unsigned long long)*fsize, SH_TM_HDR_SIZE);
    }
    return SH_OK;
}

int sh_tm_open_path(const char *path, struct sh_tm_reader **out, char *err, size_t errlen)
{
    int fd = -1;
    uint64_t fsize = 0;
    struct sh_tm_shm_hdr h;
    if (!path || !out || strlen(path) >= PATH_MAX)
        return sh_err_say(SH_EINVAL, err, errlen, "bad segment path");
    int rc = open_fd(path, &fd, &fsize, err, errlen);
    if (rc)
        return rc;
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
        close(fd);
        return sh_err_say(SH_EINVAL, err, errlen, "%s: cannot read the header", path);
    }
    if ((rc = check_header(&h, fsize, path, err, errlen)) != SH_OK) {
        close(fd);
        return rc;
    }
    struct sh_tm_reader *r = calloc(1, sizeof *r);
    if (!r) {
        close(fd);
        return sh_err_say(SH_ENOMEM, err, errlen, "%s: out of memory", path);
    }
    *r = (struct sh_tm_reader){.fd = fd, .hdr = h};
    sh_tm_strcpy(r->path, sizeof r->path, path);
    *out = r;
    return SH_OK;
}

/* The segment of a live process belongs to that process's user: one owned by
 * someone else was planted under its pid. */
static int check_owner(const struct sh_tm_reader *r, int pid, char *err, size_t errlen)
{
    struct stat seg, proc;
    char p[32];
    snprintf(p, sizeof p, "/proc/%d", pid);
    if (fstat(r->fd, &seg) != 0 || stat(p, &proc) != 0 || seg.st_uid == proc.st_uid)
        return SH_OK;
    return sh_err_say(SH_EINVAL, err, errlen,
                      "%s: owned by uid %u, but process %d runs as uid %u: not its segment",
                      r->path, (unsigned)seg.st_uid, pid, (unsigned)proc.st_uid);
}

int sh_tm_open(const char *dir, int pid, struct sh_tm_reader **out, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (pid <= 0 || sh_tm_seg_path(path, sizeof path, dir, pid) != SH_OK)
        return sh_err_say(SH_EINVAL, err, errlen, "bad pid %d", pid);
    int rc = sh_tm_open_path(path, out, err, errlen);
    if (rc == SH_OK && (*out)->hdr.pid != pid) {
        int hp = (*out)->hdr.pid;
        sh_tm_close(*out);
        *out = NULL;
        return sh_err_say(SH_EINVAL, err, errlen, "%s: corrupt: written by pid %d", path, hp);
    }
    if (rc == SH_OK && (rc = check_owner(*out, pid, err, errlen)) != SH_OK) {
        sh_tm_close(*out);
        *out = NULL;
    }
    return rc;
}

void sh_tm_close(struct sh_tm_reader *r)
{
    if (!r)
        return;
    close(r->fd);
    free(r);
}

/* Entries of an array at `off` (each `size` bytes) inside the first n bytes. */
static uint32_t fit(size_t n, size_t off, size_t size)
{
    return n > off ? (uint32_t)((n - off) / size) : 0;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* A snapshot shorter than ours (an older minor version) holds fewer array
 * entries than its counts may claim: keep only those it really has. */
static void clamp_to_size(struct sh_tm_snapshot *s, size_t n)
{
    typedef struct sh_tm_snapshot S;
    s->n_counters = min_u32(s->n_counters, fit(n, offsetof(S, counters), sizeof s->counters[0]));
    s->n_gauges = min_u32(s->n_gauges, fit(n, offsetof(S, gauges), sizeof s->gauges[0]));
    s->n_classes = min_u32(s->n_classes, fit(n, offsetof(S, classes), sizeof s->classes[0]));
    s->n_hist = min_u32(s->n_hist, fit(n, offsetof(S, hist), sizeof s->hist[0]));
    s->n_regions = min_u32(s->n_regions, fit(n, offsetof(S, regions), sizeof s->regions[0]));
    s->n_events = min_u32(s->n_events, fit(n, offsetof(S, events), sizeof s->events[0]));
    s->n_devices = min_u32(s->n_devices, fit(n, offsetof(S, devices), sizeof s->devices[0]));
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    return pread(fd, buf, n, (off_t)off) == (ssize_t)n ? 0 : -1;
}

/* The seqlock protocol (tm_internal.h) over pread: the sequence word, the
 * snapshot, the word again; equal and even means a stable copy. */
static int read_stable(const struct sh_tm_reader *r, void *out, size_t n)
{
    const uint64_t seq_off = offsetof(struct sh_tm_shm_hdr, seq);
    uint64_t start = sh_tm_now_us();
    for (int t = 0;; t++) {
        uint64_t s1, s2;
        if (pread_all(r->fd, &s1, sizeof s1, seq_off) ||
            pread_all(r->fd, out, n, r->hdr.snap_offset) ||
            pread_all(r->fd, &s2, sizeof s2, seq_off))
            return SH_EINVAL; /* it shrank */
        if (!(s1 & 1) && s1 == s2)
            return SH_OK;
        if (sh_tm_now_us() - start >= (uint64_t)SH_TM_READ_WAIT)
            return SH_EBUSY;
        if (t >= 4) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

int sh_tm_read(struct sh_tm_reader *r, struct sh_tm_snapshot *out)
{
    if (!r || !out)
        return SH_EINVAL;
    size_t n = r->hdr.snap_size < sizeof *out ? (size_t)r->hdr.snap_size : sizeof *out;
    memset(out, 0, sizeof *out);
    int rc = read_stable(r, out, n);
    if (rc == SH_EINVAL)
        memset(out, 0, sizeof *out);
    sh_tm_sanitize(out);
    clamp_to_size(out, n);
    return rc;
}

int sh_tm_reader_pid(const struct sh_tm_reader *r)
{
    return r ? r->hdr.pid : -1;
}

void sh_tm_reader_version(const struct sh_tm_reader *r, int *major, int *minor)
{
    *major = r ? r->hdr.major : 0;
    *minor = r ? r->hdr.minor : 0;
}

int sh_tm_pid_alive(int pid, uint64_t start_ticks)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    if (start_ticks) {
        uint64_t now = sh_tm_proc_start_ticks(pid);
        if (now && now != start_ticks)
            return 0; /* the pid was reused by a later process */
    }
    return 1;
}

/* 1 while the publisher holds its lock on the segment: it is alive, even in
 * another PID namespace where its pid means nothing here. */
static int lock_held(int fd)
{
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
        flock(fd, LOCK_UN);
        return 0;
    }
    return errno == EWOULDBLOCK;
}

int sh_tm_reader_stale(const struct sh_tm_reader *r)
{
    if (!r)
        return 1;
    return !lock_held(r->fd) && !sh_tm_pid_alive(r->hdr.pid, r->hdr.start_ticks);
}

/* ---- listing ---------------------------------------------------------------- */

/* The pid in "stagehand.<digits>", or 0 for any other name. */
static int name_pid(const char *name)
{
    size_t plen = strlen(SH_TM_SHM_PREFIX);
    if (strncmp(name, SH_TM_SHM_PREFIX, plen) != 0 || !name[plen])
        return 0;
    long v = 0;
    for (const char *p = name + plen; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT_MAX / 10)
            return 0;
        v = v * 10 + (*p - '0');
    }
    return v > 0 && v <= INT_MAX ? (int)v : 0;
}

static void describe(const char *dir, int pid, struct sh_tm_seg_info *info)
{
    struct sh_tm_reader *r = NULL;
    memset(info, 0, sizeof *info);
    info->pid = pid;
    if (sh_tm_open(dir, pid, &r, NULL, 0) != SH_OK) {
        info->corrupt = 1;
        info->stale = !sh_tm_pid_alive(pid, 0);
        return;
    }
    info->stale = sh_tm_reader_stale(r);
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    if (s && sh_tm_read(r, s) == SH_OK)
        sh_tm_strcpy(info->cmdline, sizeof info->cmdline, s->cmdline);
    free(s);
    sh_tm_close(r);
}

static int by_pid(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int sh_tm_list(const char *dir, struct sh_tm_seg_info *out, int max)
{
    DIR *d = opendir(dir ? dir : SH_TM_SHM_DIR);
    if (!d)
        return errno == ENOENT ? SH_ENOTFOUND : SH_EINVAL;
    int *pids = NULL, n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int pid = name_pid(e->d_name);
        if (!pid)
            continue;
        if (n == cap) {
            int *np = realloc(pids, (size_t)(cap = cap ? cap * 2 : 16) * sizeof *np);
            if (!np)
                break;
            pids = np;
        }
        pids[n++] = pid;
    }
    closedir(d);
    if (n > 1)
        qsort(pids, (size_t)n, sizeof *pids, by_pid);
    for (int i = 0; i < n && i < max; i++)
        describe(dir, pids[i], &out[i]);
    free(pids);
    return n;
}
