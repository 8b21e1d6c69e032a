/* test_telemetry_shm.c — the live segment: the seqlock under a concurrent
 * writer (a million reads, none torn), the publisher and the reader end to
 * end, stale segments of killed processes, corrupt and truncated segments
 * (named cases plus a seeded fuzz), and clean-up on exit and on signals.
 *
 * Segments go to fresh directories under /tmp, never /dev/shm, so a failing
 * test leaves nothing a running stagehand-top would pick up. Tests that need
 * a second process fork; a child reports through its exit status.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sh_err.h"
#include "telemetry/tm_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (UINT64_C(1) << 20)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Fresh directories for this run's files; removed when the tests end. */
static char dirs[64][64];
static int ndirs;

static const char *temp_dir(void)
{
    assert_true(ndirs < 64);
    char *dir = dirs[ndirs++];
    snprintf(dir, sizeof dirs[0], "/tmp/sh_tm_shm_XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_dirs(void)
{
    for (int i = 0; i < ndirs; i++) {
        DIR *d = opendir(dirs[i]);
        for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
            char path[512];
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
                snprintf(path, sizeof path, "%s/%s", dirs[i], e->d_name) < (int)sizeof path)
                unlink(path);
        }
        if (d)
            closedir(d);
        rmdir(dirs[i]);
    }
}

static void seg_path(char *buf, size_t len, const char *dir, int pid)
{
    assert_int_equal(sh_tm_seg_path(buf, len, dir, pid), SH_OK);
}

static int exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* ---- the seqlock ------------------------------------------------------------------- */

#define WORDS 32
/* Under TSan every word read or written is instrumented, and a reader
 * that races a writer rewriting the block back to back rarely gets a whole
 * read between two writes: a million reads would take most of an hour.
 * TSan looks for the race, which a few thousand reads exercise. */
#if defined(__SANITIZE_THREAD__)
#define READS 20000
#else
#define READS 1000000
#endif

static uint64_t lock_word;
static uint64_t shared_words[WORDS];
static atomic_int writer_stop;

static void *pattern_writer(void *arg)
{
    (void)arg;
    uint64_t buf[WORDS];
    for (uint64_t k = 1; !atomic_load(&writer_stop); k++) {
        for (int i = 0; i < WORDS; i++)
            buf[i] = k * 1000 + (uint64_t)i; /* one generation per write */
        sh_tm_seq_write(&lock_word, shared_words, buf, sizeof buf);
    }
    return NULL;
}

static void test_seqlock_million_reads_never_torn(void **state)
{
    (void)state;
    pthread_t w;
    atomic_store(&writer_stop, 0);
    for (int i = 0; i < WORDS; i++)
        shared_words[i] = (uint64_t)i; /* generation 0 */
    assert_int_equal(pthread_create(&w, NULL, pattern_writer, NULL), 0);
    uint64_t out[WORDS], last = 0;
    long changes = 0;
    /* A million reads (READS), and on until the writer has really run during them
     * (on a loaded machine it may barely get the processor). A read that
     * gives up while the writer is descheduled mid-write (SH_EBUSY) is not
     * a torn one: it is read again. */
    for (long r = 0; r < READS || changes <= 10; r++) {
        int rc = sh_tm_seq_read(&lock_word, out, shared_words, sizeof out, 10000000);
        if (rc == SH_EBUSY)
            continue;
        assert_int_equal(rc, 0);
        uint64_t gen = out[0] / 1000;
        for (int i = 0; i < WORDS; i++)
            if (out[i] != gen * 1000 + (uint64_t)i)
                fail_msg("torn read %ld: word %d is %llu in generation %llu", r, i,
                         (unsigned long long)out[i], (unsigned long long)gen);
        assert_true(gen >= last); /* never back in time */
        changes += gen != last;
        last = gen;
    }
    atomic_store(&writer_stop, 1);
    pthread_join(w, NULL);
}

static void test_seqlock_busy_when_writer_died_mid_write(void **state)
{
    (void)state;
    uint64_t word = 7, src[4] = {1, 2, 3, 4}, dst[4];
    assert_int_equal(sh_tm_seq_read(&word, dst, src, sizeof dst, 20000), SH_EBUSY);
    word = 8;
    assert_int_equal(sh_tm_seq_read(&word, dst, src, sizeof dst, 20000), SH_OK);
    assert_memory_equal(dst, src, sizeof src);
}

/* ---- publisher and reader end to end --------------------------------------------------- */

static atomic_uint_fast64_t region_calls;

/* 200 regions offered (the publisher keeps the largest 128), all stamped
 * with this call's number so a torn snapshot would show two stamps; each
 * region's device is its size's remainder by 3, to follow the sort. */
static int stamped_regions(void *ctx, struct sh_tm_region *out, int32_t *device, int max)
{
    (void)ctx;
    uint64_t call = atomic_fetch_add(&region_calls, 1) + 1;
    for (int i = 0; i < max; i++) {
        out[i] = (struct sh_tm_region){.va = 0x7f0000000000ull + (uint64_t)i * 64 * MiB,
                                       .size = (uint64_t)(i % 50 + 1) * MiB,
                                       .id = call,
                                       .evictions = (uint32_t)call,
                                       .state = i % 3,
                                       .cls = 1 + i % 2};
        device[i] = (int32_t)((i % 50 + 1) % 3);
    }
    sh_tm_set(SH_TM_G_regions_resident, 200);
    return max + 72; /* a buggy count: must be clamped */
}

static struct sh_tm_params shm_params(const char *dir, int period_ms)
{
    struct sh_tm_params p = {.shm_enabled = 1,
                             .period_ms = period_ms,
                             .device = 3,
                             .device_name = "Test GPU",
                             .budget = 1000 * MiB,
                             .high = 800 * MiB,
                             .low = 600 * MiB,
                             .config_summary = "budget=1000MB",
                             .tracking = SH_TM_TRACK_HOOKS,
                             .regions = stamped_regions,
                             .shm_dir = dir,
                             .flags = SH_TM_NO_SIGNALS | SH_TM_NO_ATEXIT};
    return p;
}

static void test_publish_and_read(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    struct sh_tm_params p = shm_params(dir, 5);
    sh_tm_host_class(0, 4 * MiB, 3, 8);
    sh_tm_host_classes(1);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    char path[256];
    seg_path(path, sizeof path, dir, getpid());
    assert_string_equal(sh_tm_shm_path(), path);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    sh_tm_add(SH_TM_C_restores, 5);
    sh_tm_event(SH_TM_EV_OOM, 9, 12345);
    sh_tm_publish_now();
    sleep_ms(50);
    char err[256];
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    assert_int_equal(sh_tm_read(r, s), SH_OK);
    int major, minor;
    sh_tm_reader_version(r, &major, &minor);
    assert_int_equal(major, SH_TM_MAJOR);
    assert_int_equal(s->pid, getpid());
    assert_int_equal(s->device, 3);
    assert_string_equal(s->device_name, "Test GPU");
    assert_non_null(strstr(s->cmdline, "test_telemetry_shm"));
    assert_int_equal(s->gauges[SH_TM_G_vram_high], 800 * MiB);
    assert_int_equal(s->gauges[SH_TM_G_tracking], SH_TM_TRACK_HOOKS);
    assert_int_equal(s->counters[SH_TM_C_restores], sh_tm_counter(SH_TM_C_restores));
    assert_int_equal(s->n_regions, SH_TM_MAX_REGIONS);
    for (uint32_t i = 1; i < s->n_regions; i++)
        assert_true(s->regions[i - 1].size >= s->regions[i].size); /* largest first */
    for (uint32_t i = 0; i < s->n_regions; i++) /* each with its own device, sorted with it */
        assert_int_equal(s->region_device[i], (int32_t)(s->regions[i].size / MiB % 3));
    assert_int_equal(s->n_classes, 1);
    assert_int_equal(s->classes[0].total, 8);
    assert_true(s->n_events >= 1);
    assert_int_equal(s->events[s->n_events - 1].kind, SH_TM_EV_OOM);
    assert_true(s->n_hist >= 2);
    assert_int_equal(sh_tm_reader_stale(r), 0);
    sh_tm_stop();
    assert_false(exists(path)); /* removed at stop */
    assert_string_equal(sh_tm_shm_path(), "");
    /* The open mapping stays readable after the unlink. */
    assert_int_equal(sh_tm_read(r, s), SH_OK);
    sh_tm_close(r);
    free(s);
}

static void test_reads_while_publishing_are_consistent(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    struct sh_tm_params p = shm_params(dir, 2);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    char err[256];
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    uint64_t last_pub = 0, distinct = 0, until = sh_tm_now_us() + 10000000;
    /* 3000 reads, and on a loaded machine as long as it takes (up to 10 s)
     * to see the publisher write a few times under our reads. */
    for (int i = 0; i < 3000 || (distinct <= 5 && sh_tm_now_us() < until); i++) {
        sh_tm_inc(SH_TM_C_launches);
        assert_int_equal(sh_tm_read(r, s), SH_OK);
        for (uint32_t k = 1; k < s->n_regions; k++)
            assert_int_equal(s->regions[k].id, s->regions[0].id); /* one publish only */
        for (uint32_t k = 1; k < s->n_hist; k++)
            assert_true(s->hist[k].t_us >= s->hist[k - 1].t_us);
        assert_true(s->publishes >= last_pub);
        distinct += s->publishes != last_pub;
        last_pub = s->publishes;
    }
    sh_tm_stop();
    sh_tm_close(r);
    free(s);
    assert_true(distinct > 3);
}

static void test_start_replaces_stale_file_with_our_pid(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    char path[256];
    seg_path(path, sizeof path, dir, getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("left behind by a dead process that had our pid", f);
    fclose(f);
    struct sh_tm_params p = shm_params(dir, 50);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    struct sh_tm_reader *r = NULL;
    char err[256];
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    sh_tm_close(r);
    sh_tm_stop();
    assert_false(exists(path));
}

/* ---- other processes: stale, signals, exit -------------------------------------------------- */

/* Forks a child that publishes into dir (flags as given) after running
 * `before`, tells us through a pipe that it is up, then runs `after`. */
static pid_t spawn(const char *dir, int flags, void (*before)(void), int (*after)(const char *))
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        if (before)
            before();
        struct sh_tm_params p = shm_params(dir, 20);
        p.flags = flags;
        if (sh_tm_start(&p) != SH_OK)
            _exit(90);
        char c = 'u';
        if (write(fds[1], &c, 1) != 1)
            _exit(91);
        exit(after ? after(dir) : (pause(), 0));
    }
    close(fds[1]);
    char c = 0;
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    return pid;
}

static void test_killed_process_is_stale(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    pid_t pid = spawn(dir, 0, NULL, NULL);
    struct sh_tm_seg_info segs[4];
    assert_int_equal(sh_tm_list(dir, segs, 4), 1);
    assert_int_equal(segs[0].pid, pid);
    assert_int_equal(segs[0].stale, 0);
    assert_int_equal(segs[0].corrupt, 0);
    assert_non_null(strstr(segs[0].cmdline, "test_telemetry_shm"));
    struct sh_tm_reader *r = NULL;
    char err[256];
    assert_int_equal(sh_tm_open(dir, pid, &r, err, sizeof err), SH_OK);
    assert_int_equal(sh_tm_reader_stale(r), 0);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    char path[256];
    seg_path(path, sizeof path, dir, pid);
    assert_true(exists(path));                  /* SIGKILL leaves it behind... */
    assert_int_equal(sh_tm_reader_stale(r), 1); /* ...and readers see it is stale */
    assert_int_equal(sh_tm_list(dir, segs, 4), 1);
    assert_int_equal(segs[0].stale, 1);
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    assert_int_equal(sh_tm_read(r, s), SH_OK); /* its last word is still readable */
    assert_int_equal(s->pid, pid);
    free(s);
    sh_tm_close(r);
    unlink(path);
}

static void test_sigterm_default_removes_and_dies(void **state)
{
    (void)state;
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        const char *dir = temp_dir();
        pid_t pid = spawn(dir, 0, NULL, NULL);
        char path[256];
        seg_path(path, sizeof path, dir, pid);
        assert_true(exists(path));
        kill(pid, sigs[i]);
        int status;
        waitpid(pid, &status, 0);
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), sigs[i]); /* died of the same signal */
        assert_false(exists(path));
    }
}

static volatile sig_atomic_t got_term;

static void program_handler(int sig)
{
    (void)sig;
    got_term = 1;
}

static void install_program_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = program_handler;
    sigaction(SIGTERM, &sa, NULL);
}

/* The program's handler ran and the process lives on: the segment must
 * still be there until the program exits normally. */
static int wait_for_term(const char *dir)
{
    /* SIGTERM blocked between the test of got_term and the wait: with
     * pause(), a signal landing in that gap was waited for forever. */
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &old);
    while (!got_term)
        sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    char path[256];
    sh_tm_seg_path(path, sizeof path, dir, getpid());
    return exists(path) ? 0 : 7;
}

static void test_sigterm_chains_to_program_handler(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    pid_t pid = spawn(dir, 0, install_program_handler, wait_for_term);
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char path[256];
    seg_path(path, sizeof path, dir, pid);
    assert_false(exists(path)); /* the atexit hook removed it */
}

static void ignore_hup(void)
{
    signal(SIGHUP, SIG_IGN);
}

static void test_ignored_signal_stays_ignored(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    pid_t pid = spawn(dir, 0, ignore_hup, NULL);
    kill(pid, SIGHUP);
    sleep_ms(100);
    int status;
    assert_int_equal(waitpid(pid, &status, WNOHANG), 0); /* still running */
    char path[256];
    seg_path(path, sizeof path, dir, pid);
    assert_true(exists(path));
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    assert_false(exists(path));
}

/* A fork child (a data-loader worker) exits: the parent's segment stays. */
static int fork_child_exits(const char *dir)
{
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0)
        exit(0); /* runs the inherited atexit hook */
    int status;
    waitpid(kid, &status, 0);
    char path[256];
    sh_tm_seg_path(path, sizeof path, dir, getpid());
    return exists(path) ? 0 : 8;
}

static void test_fork_child_exit_keeps_parent_segment(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    pid_t pid = spawn(dir, 0, NULL, fork_child_exits);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char path[256];
    seg_path(path, sizeof path, dir, pid);
    assert_false(exists(path)); /* and the parent's own exit removed it */
}

/* ---- corrupt and truncated segments ---------------------------------------------------------- */

static unsigned char *image;
static size_t image_len;

/* A real segment's bytes, taken from a short-lived publisher. Its period is
 * long, so nothing is being written (seq is even) while we copy. */
static int take_image(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    struct sh_tm_params p = shm_params(dir, 60000);
    if (sh_tm_start(&p) != SH_OK)
        return -1;
    char path[256];
    sh_tm_seg_path(path, sizeof path, dir, getpid());
    FILE *f = fopen(path, "rb");
    image_len = 0;
    if (f) {
        image = malloc(1 << 20);
        image_len = fread(image, 1, 1 << 20, f);
        fclose(f);
    }
    sh_tm_stop();
    return image_len > SH_TM_HDR_SIZE ? 0 : -1;
}

static int drop_image(void **state)
{
    (void)state;
    free(image);
    return 0;
}

static struct sh_tm_shm_hdr *hdr_of(unsigned char *buf)
{
    return (struct sh_tm_shm_hdr *)(void *)buf;
}

static void write_file(const char *path, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, len), (ssize_t)len);
    close(fd);
}

/* Writes buf as the segment of our pid in dir, opens it, and checks the
 * result code and that the message names the problem. */
static void expect_open(const char *dir, const void *buf, size_t len, int want, const char *msg)
{
    char path[256], err[512] = "";
    seg_path(path, sizeof path, dir, getpid());
    write_file(path, buf, len);
    struct sh_tm_reader *r = NULL;
    int rc = sh_tm_open(dir, getpid(), &r, err, sizeof err);
    if (rc != want || (msg && !strstr(err, msg)))
        fail_msg("want %d \"%s\", got %d \"%s\"", want, msg ? msg : "", rc, err);
    if (rc == SH_OK)
        sh_tm_close(r);
    else
        assert_null(r);
}

static void test_corrupt_segments_named(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    unsigned char *b = malloc(image_len);
    struct sh_tm_shm_hdr *h = hdr_of(b);
#define MUTATE(stmt, len, want, msg)                                                               \
    do {                                                                                           \
        memcpy(b, image, image_len);                                                               \
        stmt;                                                                                      \
        expect_open(dir, b, len, want, msg);                                                       \
    } while (0)
    MUTATE((void)0, image_len, SH_OK, NULL);
    MUTATE((void)0, 0, SH_EINVAL, "truncated");
    MUTATE((void)0, 100, SH_EINVAL, "truncated");
    MUTATE((void)0, image_len / 2, SH_EINVAL, "truncated or corrupt");
    MUTATE(memcpy(h->magic, "NOTOURS!", 8), image_len, SH_EINVAL, "bad magic");
    MUTATE(memset(h->magic, 0, 8), image_len, SH_EINVAL, "not initialised");
    MUTATE(h->major = 2, image_len, SH_ERANGE, "version 2.");
    MUTATE(h->total_size += 4096, image_len, SH_EINVAL, "truncated or corrupt");
    MUTATE(h->hdr_size = 16, image_len, SH_EINVAL, "header size");
    MUTATE(h->snap_offset = h->total_size, image_len, SH_EINVAL, "snapshot at");
    MUTATE(h->snap_offset = 132, image_len, SH_EINVAL, "snapshot at");
    MUTATE(h->snap_size = UINT64_C(1) << 40, image_len, SH_EINVAL, "snapshot at");
    MUTATE(h->snap_size = 0, image_len, SH_EINVAL, "snapshot at");
    MUTATE(h->snap_offset = UINT64_MAX - 7, image_len, SH_EINVAL, "snapshot at");
    MUTATE(h->pid = 0, image_len, SH_EINVAL, "pid 0");
    MUTATE(h->pid = getpid() + 1, image_len, SH_EINVAL, "written by pid");
    MUTATE(h->minor = 9, image_len, SH_OK, NULL); /* a newer minor is readable */
#undef MUTATE
    free(b);
    struct sh_tm_reader *r = NULL;
    char err[256];
    assert_int_equal(sh_tm_open(dir, 999999999, &r, err, sizeof err), SH_ENOTFOUND);
    assert_int_equal(sh_tm_open(dir, 0, &r, err, sizeof err), SH_EINVAL);
    char path[256];
    seg_path(path, sizeof path, dir, getpid());
    unlink(path);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_EINVAL);
    assert_non_null(strstr(err, "not a regular file"));
    rmdir(path);
    assert_int_equal(symlink("/etc/passwd", path), 0);
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_EINVAL);
    unlink(path);
}

static void test_older_minor_reads_zeros(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    unsigned char *b = malloc(image_len);
    memcpy(b, image, image_len);
    hdr_of(b)->snap_size = 1024; /* an older, shorter snapshot */
    char path[256], err[256];
    seg_path(path, sizeof path, dir, getpid());
    write_file(path, b, image_len);
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    memset(s, 0xab, sizeof *s);
    assert_int_equal(sh_tm_read(r, s), SH_OK);
    assert_int_equal(s->pid, getpid());
    assert_int_equal(s->n_regions, 0); /* beyond 1024 bytes: zero, not garbage */
    assert_int_equal(s->regions[0].size, 0);
    sh_tm_close(r);
    free(s);
    free(b);
}

static void test_shrunk_segment_is_an_error_not_a_crash(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    char path[256], err[256];
    seg_path(path, sizeof path, dir, getpid());
    write_file(path, image, image_len);
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    assert_int_equal(truncate(path, 64), 0); /* touching the mapping now would be SIGBUS */
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    assert_int_equal(sh_tm_read(r, s), SH_EINVAL);
    free(s);
    sh_tm_close(r);
}

/* A FIFO named like a segment (any local user can make one) must neither hang
 * the open nor the listing. */
static void test_fifo_segment_does_not_hang(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    char path[256], err[256] = "";
    seg_path(path, sizeof path, dir, getpid());
    assert_int_equal(mkfifo(path, 0666), 0);
    struct sh_tm_reader *r = NULL;
    alarm(10);
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_EINVAL);
    assert_non_null(strstr(err, "not a regular file"));
    struct sh_tm_seg_info info[4];
    assert_int_equal(sh_tm_list(dir, info, 4), 1);
    assert_int_equal(info[0].corrupt, 1);
    alarm(0);
    unlink(path);
}

/* A segment that shrinks and grows back while it is read, over and over: every
 * read is a snapshot or an error, never SIGBUS. */
static void test_segment_shrinking_during_reads(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    char path[256], err[256];
    seg_path(path, sizeof path, dir, getpid());
    write_file(path, image, image_len);
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (;;) {
            if (truncate(path, 64) || truncate(path, (off_t)image_len))
                _exit(1);
        }
    }
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    int ok = 0, refused = 0;
    for (int i = 0; i < 3000; i++) {
        int rc = sh_tm_read(r, s);
        ok += rc == SH_OK;
        refused += rc != SH_OK;
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(ok + refused, 3000);
    free(s);
    sh_tm_close(r);
}

static void test_start_time_zero_refused(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    unsigned char *b = malloc(image_len);
    memcpy(b, image, image_len);
    hdr_of(b)->start_ticks = 0; /* would turn the reused-pid check off */
    expect_open(dir, b, image_len, SH_EINVAL, "corrupt: start time 0");
    free(b);
}

/* Another user planted a segment under a live process's pid: refused as forged. */
static void test_other_owner_is_forged(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* only root can give a file away */
    const char *dir = temp_dir();
    char path[256], err[256] = "";
    seg_path(path, sizeof path, dir, getpid());
    write_file(path, image, image_len);
    assert_int_equal(chown(path, 65534, 65534), 0);
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_EINVAL);
    assert_null(r);
    assert_non_null(strstr(err, "owned by uid 65534, but process"));
    /* and the publisher neither removes it nor writes into it */
    struct sh_tm_params p = shm_params(dir, 50);
    assert_int_equal(sh_tm_start(&p), SH_EBUSY);
    sh_tm_stop();
    assert_true(exists(path));
}

/* A live segment with our pid, locked by its publisher (a process in another PID
 * namespace that shares the directory): not unlinked as stale, and read as live
 * although no process here has that pid and start time. */
static void test_live_segment_elsewhere_is_kept(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    char path[256], err[256];
    seg_path(path, sizeof path, dir, getpid());
    unsigned char *b = malloc(image_len);
    memcpy(b, image, image_len);
    hdr_of(b)->start_ticks += 7; /* not our start time */
    write_file(path, b, image_len);
    free(b);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the other namespace's publisher: holds the lock until killed */
        int fd = open(path, O_RDWR);
        char c = fd >= 0 && flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
        if (write(fds[1], &c, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(fds[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    assert_int_equal(sh_tm_reader_stale(r), 0);
    struct sh_tm_params p = shm_params(dir, 50);
    assert_int_equal(sh_tm_start(&p), SH_EBUSY);
    sh_tm_stop();
    assert_true(exists(path));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    /* its publisher gone, the same file is stale and is replaced */
    assert_int_equal(sh_tm_reader_stale(r), 1);
    sh_tm_close(r);
    assert_int_equal(sh_tm_start(&p), SH_OK);
    sh_tm_stop();
    close(fds[0]);
    close(fds[1]);
}

static void test_pid_reuse_is_stale(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    unsigned char *b = malloc(image_len);
    memcpy(b, image, image_len);
    assert_true(hdr_of(b)->start_ticks != 0);
    hdr_of(b)->start_ticks += 1; /* "our" pid, but a process started at another time */
    char path[256], err[256];
    seg_path(path, sizeof path, dir, getpid());
    write_file(path, b, image_len);
    struct sh_tm_reader *r = NULL;
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    assert_int_equal(sh_tm_reader_stale(r), 1);
    sh_tm_close(r);
    write_file(path, image, image_len);
    assert_int_equal(sh_tm_open(dir, getpid(), &r, err, sizeof err), SH_OK);
    assert_int_equal(sh_tm_reader_stale(r), 0);
    sh_tm_close(r);
    free(b);
    assert_int_equal(sh_tm_pid_alive(getpid(), 0), 1);
    assert_int_equal(sh_tm_pid_alive(0, 0), 0);
}

static uint32_t rng = 12345;

static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* Random damage, mostly to the header and the counts: every open either
 * fails with a message or gives a snapshot whose counts and strings hold. */
static void test_fuzzed_segments(void **state)
{
    (void)state;
    const char *dir = temp_dir();
    unsigned char *b = malloc(image_len);
    struct sh_tm_snapshot *s = malloc(sizeof *s);
    int opened = 0, refused = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(b, image, image_len);
        size_t len = image_len;
        int flips = 1 + (int)(next_rand() % 8);
        for (int k = 0; k < flips; k++) {
            size_t at =
                next_rand() % 2 ? next_rand() % SH_TM_HDR_SIZE : SH_TM_HDR_SIZE + next_rand() % 512;
            if (at != offsetof(struct sh_tm_shm_hdr, seq))
                b[at] = (unsigned char)next_rand();
        }
        if (next_rand() % 10 == 0)
            len = next_rand() % image_len;
        char path[256], err[512];
        seg_path(path, sizeof path, dir, getpid());
        write_file(path, b, len);
        struct sh_tm_reader *r = NULL;
        if (sh_tm_open(dir, getpid(), &r, err, sizeof err) != SH_OK) {
            assert_true(strlen(err) > 0);
            refused++;
            continue;
        }
        opened++;
        if (sh_tm_read(r, s) == SH_OK) {
            assert_true(s->n_regions <= SH_TM_MAX_REGIONS && s->n_events <= SH_TM_MAX_EVENTS);
            assert_true(s->n_hist <= SH_TM_HIST && s->n_classes <= SH_TM_MAX_CLASSES);
            assert_true(strlen(s->cmdline) < sizeof s->cmdline);
            assert_true(strlen(s->device_name) < sizeof s->device_name);
            assert_true(strlen(s->config) < sizeof s->config);
        }
        sh_tm_reader_stale(r);
        sh_tm_close(r);
    }
    free(b);
    free(s);
    assert_true(opened > 100 && refused > 100); /* both paths were exercised */
}

/* A failed assertion must not leave the publisher running for the next test. */
static int stop_publisher(void **state)
{
    (void)state;
    sh_tm_stop();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seqlock_million_reads_never_torn),
        cmocka_unit_test(test_seqlock_busy_when_writer_died_mid_write),
        cmocka_unit_test_teardown(test_publish_and_read, stop_publisher),
        cmocka_unit_test_teardown(test_reads_while_publishing_are_consistent, stop_publisher),
        cmocka_unit_test_teardown(test_start_replaces_stale_file_with_our_pid, stop_publisher),
        cmocka_unit_test(test_killed_process_is_stale),
        cmocka_unit_test(test_sigterm_default_removes_and_dies),
        cmocka_unit_test(test_sigterm_chains_to_program_handler),
        cmocka_unit_test(test_ignored_signal_stays_ignored),
        cmocka_unit_test(test_fork_child_exit_keeps_parent_segment),
        cmocka_unit_test_setup_teardown(test_corrupt_segments_named, take_image, drop_image),
        cmocka_unit_test_setup_teardown(test_older_minor_reads_zeros, take_image, drop_image),
        cmocka_unit_test_setup_teardown(test_shrunk_segment_is_an_error_not_a_crash, take_image,
                                        drop_image),
        cmocka_unit_test_setup_teardown(test_pid_reuse_is_stale, take_image, drop_image),
        cmocka_unit_test(test_fifo_segment_does_not_hang),
        cmocka_unit_test_setup_teardown(test_segment_shrinking_during_reads, take_image,
                                        drop_image),
        cmocka_unit_test_setup_teardown(test_start_time_zero_refused, take_image, drop_image),
        cmocka_unit_test_setup_teardown(test_other_owner_is_forged, take_image, drop_image),
        cmocka_unit_test_setup_teardown(test_live_segment_elsewhere_is_kept, take_image,
                                        drop_image),
        cmocka_unit_test_setup_teardown(test_fuzzed_segments, take_image, drop_image),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    remove_dirs();
    return failed;
}
