/* shm.c — the seqlock, segment paths, process facts from /proc, and the
 * clamping that makes any snapshot safe to use.
 *
 * No shared state of its own: the seqlock word and the words it guards are
 * the caller's (see tm_internal.h for the protocol).
 */
#include "telemetry/tm_internal.h"

#include "sh_err.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void sh_tm_seq_write(uint64_t *seq, void *dst, const void *src, size_t n)
{
    uint64_t base = __atomic_load_n(seq, __ATOMIC_RELAXED) & ~(uint64_t)1;
    uint64_t *d = dst;
    const uint64_t *s = src;
    __atomic_store_n(seq, base + 1, __ATOMIC_RELAXED);
    for (size_t i = 0; i < n / 8; i++)
        __atomic_store_n(&d[i], s[i], __ATOMIC_RELEASE);
    __atomic_store_n(seq, base + 2, __ATOMIC_RELEASE);
}

static int seq_try(const uint64_t *seq, uint64_t *d, const uint64_t *s, size_t words)
{
    uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
    if (s1 & 1)
        return 0;
    for (size_t i = 0; i < words; i++)
        d[i] = __atomic_load_n(&s[i], __ATOMIC_ACQUIRE);
    return __atomic_load_n(seq, __ATOMIC_RELAXED) == s1;
}

int sh_tm_seq_read(const uint64_t *seq, void *dst, const void *src, size_t n, int timeout_us)
{
    uint64_t start = sh_tm_now_us();
    for (int t = 0;; t++) {
        if (seq_try(seq, dst, src, n / 8))
            return SH_OK;
        /* The writer holds it for microseconds: spin a little, then let it
         * run if it shares our CPU, then sleep between looks. */
        if (t < 16)
            continue;
        if ((t & 63) != 0) {
            sched_yield();
            continue;
        }
        if (sh_tm_now_us() - start >= (uint64_t)timeout_us)
            return SH_EBUSY;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

void sh_tm_strcpy(char *dst, size_t len, const char *src)
{
    if (!len)
        return;
    size_t n = src ? strnlen(src, len - 1) : 0;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

int sh_tm_seg_path(char *buf, size_t len, const char *dir, int pid)
{
    int n = snprintf(buf, len, "%s/%s%d", dir ? dir : SH_TM_SHM_DIR, SH_TM_SHM_PREFIX, pid);
    return n < 0 || (size_t)n >= len ? SH_ERANGE : SH_OK;
}

int sh_tm_open_own(const char *path, int flags, unsigned mode, struct stat *st, const char **why)
{
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, (mode_t)mode);
    if (fd < 0) {
        *why = errno == ELOOP   ? "is a symbolic link; not following it"
               : errno == ENXIO ? "is a FIFO or a device, not a regular file"
                                : strerror(errno);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    *why = fstat(fd, st)                                    ? strerror(errno)
           : !S_ISREG(st->st_mode)                          ? "not a regular file"
           : st->st_uid != geteuid()                        ? "owned by another user"
           : fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) ? strerror(errno)
                                                            : NULL;
    if (*why) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads a small /proc file into buf (NUL-terminated); the byte count or -1. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return n;
}

uint64_t sh_tm_proc_start_ticks(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return 0;
    /* The command name may hold spaces and parentheses: fields start after
     * the last ')'. That is field 2; starttime is field 22. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    unsigned long long v = 0;
    return sscanf(p, "%llu", &v) == 1 ? (uint64_t)v : 0;
}

/* The state letter of /proc/<pid>/stat (field 3), or 0 if unknown. */
static char proc_state(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

int sh_tm_proc_gone(int pid, uint64_t start_ticks)
{
    if (!sh_tm_pid_alive(pid, start_ticks))
        return 1;
    char s = proc_state(pid);
    return s == 'Z' || s == 'X'; /* exited, its memory freed, not yet reaped */
}

void sh_tm_self_cmdline(char *buf, size_t len)
{
    ssize_t n = read_small("/proc/self/cmdline", buf, len);
    if (n <= 0) {
        snprintf(buf, len, "?");
        return;
    }
    while (n > 0 && buf[n - 1] == '\0')
        n--;
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] == '\0' || buf[i] == '\n' || buf[i] == '\t')
            buf[i] = ' ';
    buf[n] = '\0';
}

static void terminate(char *s, size_t len)
{
    s[len - 1] = '\0';
}

static uint32_t clamp(uint32_t v, uint32_t max)
{
    return v > max ? max : v;
}

void sh_tm_sanitize(struct sh_tm_snapshot *s)
{
    s->n_counters = clamp(s->n_counters, SH_TM_MAX_COUNTERS);
    s->n_gauges = clamp(s->n_gauges, SH_TM_MAX_GAUGES);
    s->n_classes = clamp(s->n_classes, SH_TM_MAX_CLASSES);
    s->n_regions = clamp(s->n_regions, SH_TM_MAX_REGIONS);
    s->n_events = clamp(s->n_events, SH_TM_MAX_EVENTS);
    s->n_hist = clamp(s->n_hist, SH_TM_HIST);
    s->n_devices = clamp(s->n_devices, SH_TM_MAX_DEVICES);
    terminate(s->version, sizeof s->version);
    terminate(s->device_name, sizeof s->device_name);
    terminate(s->cmdline, sizeof s->cmdline);
    terminate(s->config, sizeof s->config);
    terminate(s->jsonl_path, sizeof s->jsonl_path);
    /* Counters a newer publisher has and we do not know stay in the array;
     * the ones an older publisher lacks read as zero. */
    for (uint32_t i = s->n_counters; i < SH_TM_MAX_COUNTERS; i++)
        s->counters[i] = 0;
    for (uint32_t i = s->n_gauges; i < SH_TM_MAX_GAUGES; i++)
        s->gauges[i] = 0;
}
