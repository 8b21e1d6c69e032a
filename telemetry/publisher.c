/* publisher.c — the live segment and the JSONL file, written by one
 * background thread.
 *
 * Locking: pub_mu (taken before the counters' slots_mu) guards `pub` (started/stopping flags, the
 * thread handle, the queue of captured step records) and is held only for short copies, never
 * across I/O or a library callback. The build buffers (snapshot, regions, history, the JSONL
 * baseline) belong to the publisher thread while it runs, and to start/stop (under pub_mu) while it
 * does not. The segment's words are written under its seqlock (tm_internal.h). The atomics
 * `live` and `want_lines` let sh_tm_publish_now and sh_tm_step skip the lock when off.
 */
#include "telemetry/tm_internal.h"

#include "sh_err.h"
#include "sh_log.h"
#include "stagehand.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PERIOD_MS 250

struct publisher {
    int started, stopping, wake, has_thread;
    int owner; /* the pid that started us: a fork child must not remove the segment */
    pthread_t thread;
    int period_ms, interval;
    sh_tm_regions_fn regions;
    sh_tm_sample_fn sample;
    sh_tm_devices_fn devices;
    void *ctx;
    int jsonl_fd;
    int seg_fd; /* open while published: it holds the segment's lock */
    char path[PATH_MAX];
    unsigned char *map;
    size_t map_size;
    struct sh_tm_shm_hdr *hdr;
    /* thread-owned while it runs */
    struct sh_tm_snapshot *snap;
    struct sh_tm_region *rbuf;
    int32_t rdev[SH_TM_MAX_REGIONS]; /* rbuf[i]'s device */
    struct sh_tm_sample hist[SH_TM_HIST];
    uint64_t hist_n;
    struct sh_tm_steprec last; /* the previous JSONL line's boundary */
    /* under pub_mu */
    struct sh_tm_steprec queue[SH_TM_STEP_RING];
    int q_head, q_len;
};

static pthread_mutex_t pub_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pub_cv;
static pthread_once_t pub_once = PTHREAD_ONCE_INIT;
static struct publisher pub = {.jsonl_fd = -1, .seg_fd = -1};
static atomic_int live;            /* started, for the lock-free fast path */
static atomic_int want_lines;      /* a JSONL file is open */
static atomic_int line_every;      /* the JSONL interval, in steps */
static atomic_int no_calls;        /* stopping: do not call into the library any more */
static _Atomic int64_t peak_accum; /* highest step peak since the last JSONL record */
static int atexit_done;

static void pub_lock(void)
{
    pthread_mutex_lock(&pub_mu);
}

static void pub_unlock(void)
{
    pthread_mutex_unlock(&pub_mu);
}

/* In a fork child the thread is gone and the segment is the parent's. */
static void after_fork_child(void)
{
    pub.started = 0;
    pub.has_thread = 0;
    pub.hdr = NULL;
    pub.map = NULL;
    pub.jsonl_fd = -1;
    atomic_store(&live, 0);
    atomic_store(&want_lines, 0);
    sh_tm_signals_disarm();
    pub_unlock(); /* taken by pub_lock before the fork */
}

static void init_once(void)
{
    sh_tm_counters_init(); /* its fork handlers first: see sh_tm_counters_init */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pub_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_atfork(pub_lock, pub_unlock, after_fork_child);
}

/* ---- the snapshot ------------------------------------------------------------ */

/* Positions in pub.rbuf, its largest regions first (the publisher's thread
 * alone sorts). */
static int by_size(const void *a, const void *b)
{
    const struct sh_tm_region *x = &pub.rbuf[*(const int *)a], *y = &pub.rbuf[*(const int *)b];
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    return (x->va > y->va) - (x->va < y->va);
}

/* After take_devices: with several devices the count is theirs together
 * (the gauges are the main device's). */
static void take_regions(struct sh_tm_snapshot *s)
{
    int n = 0, order[SH_TM_MAX_REGIONS] = {0};
    if (pub.regions && !atomic_load(&no_calls))
        n = pub.regions(pub.ctx, pub.rbuf, pub.rdev, SH_TM_MAX_REGIONS);
    n = n < 0 ? 0 : n > SH_TM_MAX_REGIONS ? SH_TM_MAX_REGIONS : n;
    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort(order, (size_t)n, sizeof order[0], by_size);
    for (int i = 0; i < n; i++) {
        s->regions[i] = pub.rbuf[order[i]];
        s->region_device[i] = pub.rdev[order[i]];
    }
    s->n_regions = (uint32_t)n;
    const int64_t *g = s->gauges;
    int64_t all = g[SH_TM_G_regions_resident] + g[SH_TM_G_regions_evicting] +
                  g[SH_TM_G_regions_host] + g[SH_TM_G_regions_restoring];
    if (s->n_devices) {
        all = 0;
        for (uint32_t i = 0; i < s->n_devices; i++)
            all += s->devices[i].regions;
    }
    s->regions_total = all > n ? (uint64_t)all : (uint64_t)n;
}

static void take_devices(struct sh_tm_snapshot *s)
{
    int n = 0;
    if (pub.devices && !atomic_load(&no_calls))
        n = pub.devices(pub.ctx, s->devices, SH_TM_MAX_DEVICES);
    s->n_devices = (uint32_t)(n < 0 ? 0 : n > SH_TM_MAX_DEVICES ? SH_TM_MAX_DEVICES : n);
}

/* Appends this moment to the rate history and lays it out oldest first. */
static void take_history(struct sh_tm_snapshot *s)
{
    const uint64_t *c = s->counters;
    struct sh_tm_sample *h = &pub.hist[pub.hist_n++ % SH_TM_HIST];
    *h = (struct sh_tm_sample){.t_us = s->now_us,
                               .h2d_bytes = c[SH_TM_C_h2d_bytes],
                               .d2h_bytes = c[SH_TM_C_d2h_bytes],
                               .stall_time_us = c[SH_TM_C_stall_time_us],
                               .stall_count = c[SH_TM_C_stall_count],
                               .prefetch_hits = c[SH_TM_C_prefetch_hits],
                               .prefetch_misses = c[SH_TM_C_prefetch_misses],
                               .evictions = c[SH_TM_C_evictions],
                               .restores = c[SH_TM_C_restores],
                               .spill_bytes = c[SH_TM_C_spill_bytes],
                               .restore_bytes = c[SH_TM_C_restore_bytes],
                               .vram_used = s->gauges[SH_TM_G_vram_used],
                               .step = s->gauges[SH_TM_G_step]};
    uint64_t n = pub.hist_n < SH_TM_HIST ? pub.hist_n : SH_TM_HIST;
    for (uint64_t i = 0; i < n; i++)
        s->hist[i] = pub.hist[(pub.hist_n - n + i) % SH_TM_HIST];
    s->n_hist = (uint32_t)n;
}

static uint64_t unix_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Builds the snapshot privately, then copies it into the segment under the
 * seqlock: readers wait microseconds, never for a callback. */
static void publish(int callbacks)
{
    struct sh_tm_snapshot *s = pub.snap;
    if (callbacks && pub.sample && !atomic_load(&no_calls))
        pub.sample(pub.ctx);
    s->now_us = sh_tm_now_us();
    s->now_unix_us = unix_us();
    s->publishes++;
    uint64_t c[SH_TM_NCOUNTERS];
    int64_t g[SH_TM_NGAUGES];
    sh_tm_counters(c);
    sh_tm_gauges(g);
    memcpy(s->counters, c, sizeof c);
    memcpy(s->gauges, g, sizeof g);
    sh_tm_host_snapshot(s->classes, &s->n_classes);
    s->n_events = (uint32_t)sh_tm_events_copy(s->events, SH_TM_MAX_EVENTS, &s->events_total);
    if (callbacks) {
        take_devices(s);
        take_regions(s);
    }
    take_history(s);
    if (pub.hdr)
        sh_tm_seq_write(&pub.hdr->seq, pub.map + pub.hdr->snap_offset, s, sizeof *s);
}

/* ---- JSONL --------------------------------------------------------------------- */

static void write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            static int once;
            sh_log_once(&once, SH_LOG_WARN, "telemetry file: %s; lines are being lost",
                        w < 0 ? strerror(errno) : "short write");
            return;
        }
        buf += w;
        n -= (size_t)w;
    }
}

static void write_line(const struct sh_tm_steprec *r)
{
    char buf[SH_TM_JSONL_LINE];
    if (r->step <= pub.last.step) {
        pub.last = *r; /* a boundary at or before the baseline (step 0): no steps ended */
        return;
    }
    size_t n = sh_tm_jsonl_format(buf, sizeof buf, pub.owner, &pub.last, r);
    if (n > 0 && pub.jsonl_fd >= 0)
        write_all(pub.jsonl_fd, buf, n); /* one write(2): the line is whole or absent */
    pub.last = *r;
}

/* ---- the thread ------------------------------------------------------------------ */

static void deadline(struct timespec *ts, uint64_t at_us)
{
    ts->tv_sec = (time_t)(at_us / 1000000u);
    ts->tv_nsec = (long)(at_us % 1000000u) * 1000;
}

/* Writes queued lines with the lock dropped. Called with pub_mu held. */
static void drain(void)
{
    static struct sh_tm_steprec r; /* only the publisher thread (or stop) gets here */
    while (pub.q_len > 0) {
        r = pub.queue[pub.q_head];
        pub.q_head = (pub.q_head + 1) % SH_TM_STEP_RING;
        pub.q_len--;
        pub_unlock();
        write_line(&r);
        pub_lock();
    }
}

static void *pub_main(void *arg)
{
    (void)arg;
    pub_lock();
    /* start published once already: a point microseconds later would be a
     * rate sample of noise. */
    uint64_t next = sh_tm_now_us() + (uint64_t)pub.period_ms * 1000u;
    for (;;) {
        while (!pub.stopping && !pub.q_len && !pub.wake && sh_tm_now_us() < next) {
            struct timespec ts;
            deadline(&ts, next);
            pthread_cond_timedwait(&pub_cv, &pub_mu, &ts);
        }
        drain();
        if (pub.stopping)
            break;
        if (pub.wake || sh_tm_now_us() >= next) {
            pub.wake = 0;
            pub_unlock();
            publish(1);
            pub_lock();
            next = sh_tm_now_us() + (uint64_t)pub.period_ms * 1000u;
        }
    }
    pub_unlock();
    return NULL;
}

static int start_thread(void)
{
    /* The thread takes no asynchronous signal: they stay with the program's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&pub.thread, NULL, pub_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return SH_ENOMEM;
    pub.has_thread = 1;
    return SH_OK;
}

/* ---- the segment and the file ----------------------------------------------------- */

/* May an existing segment with our pid in its name be replaced? Only one of ours
 * whose publisher is gone: another user's was planted (and is not ours to
 * remove), and one whose lock is held is live, written by a process with the
 * same pid in another PID namespace sharing this directory. */
static int replaceable(const char *path)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), ok = 0;
    if (fd < 0)
        return errno == ENOENT;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
        sh_log(SH_LOG_WARN, "%s exists and is not a segment of this user's; not replacing it",
               path);
    else if (flock(fd, LOCK_SH | LOCK_NB) != 0)
        sh_log(SH_LOG_WARN,
               "%s is live (a process with this pid in another PID namespace?); "
               "not replacing it",
               path);
    else
        ok = 1;
    close(fd);
    return ok;
}

static int open_segment(const char *dir, int pid)
{
    int fd = -1;
    if (sh_tm_seg_path(pub.path, sizeof pub.path, dir, pid) != SH_OK)
        return SH_ERANGE;
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        fd = open(pub.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        /* Our pid in the name: whoever made it is gone, unless it is elsewhere. */
        if (fd < 0 && errno == EEXIST && attempt == 0) {
            if (!replaceable(pub.path))
                return SH_EBUSY;
            sh_log(SH_LOG_INFO, "replacing stale %s", pub.path);
            unlink(pub.path);
        }
    }
    if (fd < 0) {
        sh_log(SH_LOG_WARN, "cannot create %s: %s; stagehand-top will not see this process",
               pub.path, strerror(errno));
        return SH_ENOTFOUND;
    }
    /* Held for the process's life (the kernel drops it at exit): tells a live
     * segment from a stale one where the pid cannot. */
    flock(fd, LOCK_EX | LOCK_NB);
    long page = sysconf(_SC_PAGESIZE);
    size_t need = SH_TM_HDR_SIZE + sizeof(struct sh_tm_snapshot);
    pub.map_size = (need + (size_t)page - 1) / (size_t)page * (size_t)page;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)pub.map_size) == 0)
        m = mmap(NULL, pub.map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        sh_log(SH_LOG_WARN, "cannot map %s: %s", pub.path, strerror(errno));
        unlink(pub.path);
        close(fd);
        return SH_ENOMEM;
    }
    pub.seg_fd = fd;
    pub.map = m;
    pub.hdr = m;
    *pub.hdr = (struct sh_tm_shm_hdr){.major = SH_TM_MAJOR,
                                      .minor = SH_TM_MINOR,
                                      .hdr_size = SH_TM_HDR_SIZE,
                                      .total_size = pub.map_size,
                                      .snap_offset = SH_TM_HDR_SIZE,
                                      .snap_size = sizeof(struct sh_tm_snapshot),
                                      .pid = pid,
                                      .start_ticks = sh_tm_proc_start_ticks(pid)};
    return SH_OK;
}

/* The magic goes in last, with release order: a reader that sees it sees
 * the whole header and a first snapshot. */
static void seal_segment(void)
{
    uint64_t magic;
    memcpy(&magic, SH_TM_MAGIC, 8);
    __atomic_store_n((uint64_t *)(void *)pub.hdr->magic, magic, __ATOMIC_RELEASE);
}

static void close_segment(void)
{
    if (!pub.map)
        return;
    sh_tm_signals_disarm();
    unlink(pub.path);
    munmap(pub.map, pub.map_size);
    close(pub.seg_fd);
    pub.seg_fd = -1;
    pub.map = NULL;
    pub.hdr = NULL;
}

/* "%p" becomes the pid (one file per rank under DDP), "%%" a percent sign. */
static int expand_path(char *out, size_t len, const char *in, int pid)
{
    size_t o = 0;
    for (const char *p = in; *p; p++) {
        char num[16];
        const char *add = num;
        if (p[0] == '%' && p[1] == 'p')
            snprintf(num, sizeof num, "%d", pid), p++;
        else if (p[0] == '%' && p[1] == '%')
            num[0] = '%', num[1] = '\0', p++;
        else
            num[0] = *p, num[1] = '\0';
        size_t n = strlen(add);
        if (o + n >= len)
            return SH_ERANGE;
        memcpy(out + o, add, n);
        o += n;
    }
    out[o] = '\0';
    return SH_OK;
}

/* Opens the JSONL file for appending: sh_tm_open_own's checks, a new file
 * readable by its owner only. */
static int open_private(const char *path, const char **why)
{
    struct stat st;
    return sh_tm_open_own(path, O_WRONLY | O_CREAT | O_APPEND, 0600, &st, why);
}

static int open_jsonl(const char *path, int pid)
{
    char full[PATH_MAX];
    if (expand_path(full, sizeof full, path, pid) != SH_OK) {
        sh_log(SH_LOG_WARN, "telemetry_file: path too long");
        return SH_ERANGE;
    }
    const char *why = NULL;
    pub.jsonl_fd = open_private(full, &why);
    if (pub.jsonl_fd < 0) {
        sh_log(SH_LOG_WARN, "telemetry_file %s: %s; no per-step records", full, why);
        return SH_ENOTFOUND;
    }
    sh_tm_strcpy(pub.snap->jsonl_path, sizeof pub.snap->jsonl_path, full);
    return SH_OK;
}

/* ---- start and stop ------------------------------------------------------------------ */

static void describe_process(const struct sh_tm_params *p, int pid)
{
    struct sh_tm_snapshot *s = pub.snap;
    memset(s, 0, sizeof *s);
    s->pid = pid;
    s->device = p->device;
    s->start_unix_us = unix_us();
    s->period_ms = (uint32_t)pub.period_ms;
    s->jsonl_interval = (uint32_t)pub.interval;
    s->n_counters = SH_TM_NCOUNTERS;
    s->n_gauges = SH_TM_NGAUGES;
    snprintf(s->version, sizeof s->version, "%d.%d.%d", STAGEHAND_VERSION_MAJOR,
             STAGEHAND_VERSION_MINOR, STAGEHAND_VERSION_PATCH);
    sh_tm_strcpy(s->device_name, sizeof s->device_name, p->device_name);
    sh_tm_strcpy(s->config, sizeof s->config, p->config_summary);
    sh_tm_self_cmdline(s->cmdline, sizeof s->cmdline);
    sh_tm_set(SH_TM_G_vram_budget, (int64_t)p->budget);
    sh_tm_set(SH_TM_G_vram_high, (int64_t)p->high);
    sh_tm_set(SH_TM_G_vram_low, (int64_t)p->low);
    sh_tm_set(SH_TM_G_tracking, p->tracking);
}

static void release_all(void)
{
    close_segment();
    if (pub.jsonl_fd >= 0)
        close(pub.jsonl_fd);
    pub.jsonl_fd = -1;
    free(pub.snap);
    free(pub.rbuf);
    pub.snap = NULL;
    pub.rbuf = NULL;
}

static void at_exit(void)
{
    sh_tm_stop();
}

/* Opens what was asked for; fails only when nothing could be opened. */
static int open_outputs(const struct sh_tm_params *p, int pid)
{
    int want_j = p->jsonl_path && p->jsonl_path[0];
    int rc_s = p->shm_enabled ? open_segment(p->shm_dir, pid) : SH_OK;
    int rc_j = want_j ? open_jsonl(p->jsonl_path, pid) : SH_OK;
    if ((p->shm_enabled || want_j) && (!p->shm_enabled || rc_s) && (!want_j || rc_j))
        return rc_s ? rc_s : rc_j;
    return SH_OK;
}

static int start_locked(const struct sh_tm_params *p)
{
    int pid = (int)getpid();
    pub.period_ms = p->period_ms > 0 ? p->period_ms : DEFAULT_PERIOD_MS;
    pub.interval = p->interval_steps > 0 ? p->interval_steps : 1;
    pub.regions = p->regions;
    pub.sample = p->sample;
    pub.devices = p->devices;
    pub.ctx = p->ctx;
    pub.owner = pid;
    pub.stopping = pub.wake = pub.q_len = pub.q_head = 0;
    pub.hist_n = 0;
    pub.snap = calloc(1, sizeof *pub.snap);
    pub.rbuf = calloc(SH_TM_MAX_REGIONS, sizeof *pub.rbuf);
    if (!pub.snap || !pub.rbuf) {
        release_all();
        return SH_ENOMEM;
    }
    describe_process(p, pid);
    int rc = open_outputs(p, pid);
    if (rc != SH_OK) {
        release_all();
        return rc;
    }
    sh_tm_capture(&pub.last);
    pub.last.step = sh_tm_get(SH_TM_G_step);
    atomic_store(&no_calls, 0);
    atomic_store(&peak_accum, 0);
    publish(0); /* no callback here: the caller may hold the library's locks */
    if (pub.map) {
        seal_segment();
        if (!(p->flags & SH_TM_NO_SIGNALS)) {
            sh_tm_signals_arm(pub.path, pid);
            sh_tm_signals_install();
        }
    }
    if ((pub.map || pub.jsonl_fd >= 0) && (rc = start_thread()) != SH_OK) {
        release_all();
        return rc;
    }
    return SH_OK;
}

int sh_tm_start(const struct sh_tm_params *p)
{
    if (!p)
        return SH_EINVAL;
    pthread_once(&pub_once, init_once);
    pub_lock();
    if (pub.started) {
        pub_unlock();
        return SH_EBUSY;
    }
    int rc = start_locked(p);
    if (rc == SH_OK) {
        pub.started = 1;
        atomic_store(&line_every, pub.interval);
        atomic_store(&want_lines, pub.jsonl_fd >= 0);
        atomic_store(&live, 1);
        if (!(p->flags & SH_TM_NO_ATEXIT) && !atexit_done)
            atexit_done = atexit(at_exit) == 0;
    }
    pub_unlock();
    return rc;
}

void sh_tm_stop(void)
{
    pthread_once(&pub_once, init_once);
    pub_lock();
    if (!pub.started || pub.owner != (int)getpid()) {
        pub_unlock();
        return;
    }
    pub.stopping = 1;
    atomic_store(&no_calls, 1);
    atomic_store(&live, 0);
    pthread_cond_broadcast(&pub_cv);
    int join = pub.has_thread && !pthread_equal(pub.thread, pthread_self());
    pub_unlock();
    if (join)
        pthread_join(pub.thread, NULL);
    pub_lock();
    pub.has_thread = 0;
    drain(); /* anything queued after the thread's last look */
    release_all();
    pub.started = 0;
    atomic_store(&want_lines, 0);
    pub_unlock();
}

/* Queues r; when the queue is full the newest record is replaced, so the
 * next line simply covers more steps (the sums are cumulative). */
static void enqueue(const struct sh_tm_steprec *r)
{
    int at;
    if (pub.q_len == SH_TM_STEP_RING) {
        at = (pub.q_head + pub.q_len - 1) % SH_TM_STEP_RING;
        int64_t keep = pub.queue[at].step_peak;
        pub.queue[at] = *r;
        if (keep > r->step_peak)
            pub.queue[at].step_peak = keep;
        return;
    }
    at = (pub.q_head + pub.q_len++) % SH_TM_STEP_RING;
    pub.queue[at] = *r;
}

static void raise_accum(int64_t v)
{
    int64_t cur = atomic_load(&peak_accum);
    while (v > cur && !atomic_compare_exchange_weak(&peak_accum, &cur, v))
        ;
}

void sh_tm_step(int64_t step)
{
    sh_tm_phase(STAGEHAND_PHASE_STEP_BEGIN);
    sh_tm_set(SH_TM_G_step, step);
    sh_tm_event(SH_TM_EV_STEP, (uint64_t)step, 0);
    raise_accum(sh_tm_step_peak_reset());
    if (!atomic_load_explicit(&want_lines, memory_order_relaxed))
        return;
    int interval = atomic_load_explicit(&line_every, memory_order_relaxed);
    if (interval <= 0 || step % interval != 0)
        return;
    struct sh_tm_steprec r;
    sh_tm_capture(&r);
    r.n_devices = 0;
    if (pub.devices && !atomic_load(&no_calls)) { /* as the monitor reads the pools at a mark */
        int n = pub.devices(pub.ctx, r.devices, SH_TM_MAX_DEVICES);
        r.n_devices = n < 0 ? 0 : n > SH_TM_MAX_DEVICES ? SH_TM_MAX_DEVICES : n;
    }
    r.step = step;
    r.step_peak = atomic_exchange(&peak_accum, 0);
    pub_lock();
    if (pub.started && !pub.stopping) {
        enqueue(&r);
        pthread_cond_signal(&pub_cv);
    }
    pub_unlock();
}

void sh_tm_publish_now(void)
{
    if (!atomic_load(&live))
        return;
    pub_lock();
    pub.wake = 1;
    pthread_cond_signal(&pub_cv);
    pub_unlock();
}

const char *sh_tm_shm_path(void)
{
    static char copy[PATH_MAX];
    pthread_once(&pub_once, init_once);
    pub_lock();
    sh_tm_strcpy(copy, sizeof copy, pub.started && pub.map ? pub.path : "");
    pub_unlock();
    return copy;
}
