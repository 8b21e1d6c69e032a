/* test_trace.c — the trace format: writer and reader agree on every record,
 * the regions a launch only reads (`i ro`, and `i unchanged` spans)
 * included, long launches cross
 * the writer's buffer, every kind of bad input is reported as "path:line:
 * what", and no input at all makes the reader crash (truncations and
 * random damage of a good trace). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_err.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#define DIR "tests/unit/traces/"

static char tmp_path[64];

static const char *tmp_file(void)
{
    snprintf(tmp_path, sizeof tmp_path, "/tmp/test_trace_%d.trace", (int)getpid());
    return tmp_path;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(1 << 20);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static const struct sh_trace_event *at(const struct sh_trace *t, size_t i)
{
    const struct sh_trace_event *e = sh_trace_at(t, i);
    assert_non_null(e);
    return e;
}

/* ---- reading ---- */

/* Writes len bytes of buf to path, gzip-compressed. */
static void write_gz(const char *path, const char *buf, size_t len)
{
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, buf, (unsigned)len), (int)len);
    assert_int_equal(gzclose(g), Z_OK);
}

/* Writes the first len bytes of buf to path as they are. */
static void write_raw(const char *path, const char *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void test_read_good(void **state)
{
    (void)state;
    struct sh_trace *t = NULL;
    char err[256];
    assert_int_equal(sh_trace_read(DIR "good_small.trace", &t, err, sizeof err), 0);
    assert_string_equal(err, "");
    assert_int_equal(sh_trace_count(t), 12);
    assert_string_equal(sh_trace_source(t), "hand-written example");
    assert_string_equal(sh_trace_kernel_name(t, 11), "block_forward");
    assert_string_equal(sh_trace_kernel_name(t, 12), "void block_backward<float>(float*, int)");
    assert_null(sh_trace_kernel_name(t, 13));
    const struct sh_trace_event *e = at(t, 0);
    assert_int_equal(e->type, SH_TRACE_ALLOC);
    assert_int_equal(e->id, 1);
    assert_int_equal(e->bytes, 1048576);
    assert_int_equal(e->stream, 7);
    assert_int_equal(e->cls, SH_CLASS_PERSISTENT);
    assert_int_equal(e->line, 7);
    e = at(t, 2);
    assert_int_equal(e->type, SH_TRACE_STEP);
    assert_int_equal(e->step, 0);
    assert_int_equal(e->marked, 1);
    e = at(t, 3);
    assert_int_equal(e->type, SH_TRACE_PHASE);
    assert_int_equal(e->phase, SH_PHASE_FORWARD);
    e = at(t, 5); /* its duration came later, from the 'd' record */
    assert_int_equal(e->type, SH_TRACE_LAUNCH);
    assert_int_equal(e->t_us, 5);
    assert_int_equal(e->dur_us, 125);
    assert_int_equal(e->kernel, 11);
    assert_int_equal(e->n, 2);
    assert_int_equal(e->ids[0], 1);
    assert_int_equal(e->ids[1], 100);
    assert_int_equal(at(t, 6)->dur_us, 120);
    e = at(t, 7);
    assert_int_equal(e->phase, SH_PHASE_BACKWARD);
    assert_int_equal(e->marked, 0);
    assert_int_equal(at(t, 9)->dur_us, 0x1f0);
    e = at(t, 10);
    assert_int_equal(e->type, SH_TRACE_FREE);
    assert_int_equal(e->cls, SH_CLASS_TRANSIENT);
    assert_int_equal(at(t, 11)->phase, SH_PHASE_STEP_END);
    assert_null(sh_trace_at(t, 12));
    sh_trace_destroy(t);
}

/* A gzip-compressed trace reads as the plain one (the recorder writes its
 * fixtures that way); a truncated or damaged one is an error naming the
 * file, never a partial trace. */
static void test_read_gzip(void **state)
{
    (void)state;
    size_t len;
    char *text = slurp(DIR "good_small.trace", &len);
    const char *path = tmp_file();
    write_gz(path, text, len);
    struct sh_trace *plain = NULL, *t = NULL;
    char err[256];
    assert_int_equal(sh_trace_read(DIR "good_small.trace", &plain, err, sizeof err), 0);
    assert_int_equal(sh_trace_read(path, &t, err, sizeof err), 0);
    assert_string_equal(err, "");
    assert_int_equal(sh_trace_count(t), sh_trace_count(plain));
    assert_string_equal(sh_trace_source(t), sh_trace_source(plain));
    for (size_t i = 0; i < sh_trace_count(t); i++) {
        const struct sh_trace_event *a = at(t, i), *b = at(plain, i);
        assert_int_equal(a->type, b->type);
        assert_int_equal(a->t_us, b->t_us);
        assert_int_equal(a->id, b->id);
        assert_int_equal(a->dur_us, b->dur_us);
        assert_int_equal(a->line, b->line);
        assert_int_equal(a->n, b->n);
    }
    sh_trace_destroy(t);
    sh_trace_destroy(plain);

    size_t glen;
    char *gz = slurp(path, &glen);
    char want[256];
    write_raw(path, gz, glen / 2);
    t = (struct sh_trace *)&t;
    assert_int_equal(sh_trace_read(path, &t, err, sizeof err), SH_EINVAL);
    assert_null(t);
    snprintf(want, sizeof want, "%s: truncated gzip data", path);
    assert_string_equal(err, want);

    gz[glen - 5] ^= 0x55; /* the stored CRC: the data no longer checks */
    write_raw(path, gz, glen);
    assert_int_equal(sh_trace_read(path, &t, err, sizeof err), SH_EINVAL);
    assert_null(t);
    snprintf(want, sizeof want, "%s: corrupt gzip data", path);
    assert_string_equal(err, want);

    /* A bad record inside is reported by its line, as in a plain file. */
    static const char bad[] = "stagehand-trace 1\nf 0 7 t\n";
    write_gz(path, bad, sizeof bad - 1);
    assert_int_equal(sh_trace_read(path, &t, err, sizeof err), SH_EINVAL);
    snprintf(want, sizeof want, "%s:2: free of region 7, which is not live", path);
    assert_string_equal(err, want);
    free(gz);
    free(text);
    unlink(path);
}

static void test_read_line_endings(void **state)
{
    (void)state;
    struct sh_trace *t = NULL;
    char err[256];
    assert_int_equal(sh_trace_read(DIR "good_crlf.trace", &t, err, sizeof err), 0);
    assert_int_equal(sh_trace_count(t), 3);
    assert_int_equal(at(t, 2)->cls, SH_CLASS_PERSISTENT);
    sh_trace_destroy(t);
    assert_int_equal(sh_trace_read(DIR "good_no_newline.trace", &t, err, sizeof err), 0);
    assert_int_equal(sh_trace_count(t), 2);
    assert_int_equal(at(t, 1)->ids[0], 1);
    sh_trace_destroy(t);
}

struct bad {
    const char *file, *msg;
};

static void test_read_bad_files(void **state)
{
    (void)state;
    static const struct bad cases[] = {
        {"bad_empty", "1: empty file (the first line must be \"stagehand-trace 1\")"},
        {"bad_version", "1: version 2 is not supported (this reader knows version 1)"},
        {"bad_magic", "1: not a stagehand trace (the first line must be \"stagehand-trace 1\")"},
        {"bad_record", "3: unknown record \"x\""},
        {"bad_number", "2: bytes: not a number: \"40z6\""},
        {"bad_overflow", "2: bytes: not a number: \"18446744073709551616\""},
        {"bad_time", "3: time goes backwards (9 after 10)"},
        {"bad_double_alloc", "3: region 1 allocated while live"},
        {"bad_free_unknown", "3: free of region 2, which is not live"},
        {"bad_launch_freed", "4: launch references region 1, which is not live"},
        {"bad_launch_count", "3: missing region 2 of 2"},
        {"bad_trailing", "3: unexpected \"1\" at the end of the line"},
        {"bad_duration_seq", "4: duration for launch 1, but only 1 launches came before"},
        {"bad_phase", "2: phase: unknown value \"warmup\""},
        {"bad_zero_bytes", "2: region 1 has 0 bytes"},
        {"bad_class", "2: class: unknown value \"q\""},
        {"bad_mark", "2: mark: unknown value \"manual\""},
        {"bad_launch_limit", "2: region count 2000000 is over the limit of 1048576"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[128], want[256], err[256];
        snprintf(path, sizeof path, DIR "%s.trace", cases[i].file);
        snprintf(want, sizeof want, "%s:%s", path, cases[i].msg);
        struct sh_trace *t = (struct sh_trace *)&t;
        assert_int_equal(sh_trace_read(path, &t, err, sizeof err), SH_EINVAL);
        assert_null(t);
        assert_string_equal(err, want);
    }
}

static void test_read_missing_file(void **state)
{
    (void)state;
    struct sh_trace *t = NULL;
    char err[256];
    assert_int_equal(sh_trace_read(DIR "no_such.trace", &t, err, sizeof err), SH_ENOTFOUND);
    assert_string_equal(err, DIR "no_such.trace: cannot open: No such file or directory");
}

static void test_parse_odd_bytes(void **state)
{
    (void)state;
    struct sh_trace *t = NULL;
    char err[256];
    static const char nul[] = "stagehand-trace 1\na 0 1 4\0 7 u\n";
    assert_int_equal(sh_trace_parse("mem", nul, sizeof nul - 1, &t, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, "mem:2: NUL byte at column 8");
    static const char ctl[] = "stagehand-trace 1\n\x01\xff\n";
    assert_int_equal(sh_trace_parse("mem", ctl, sizeof ctl - 1, &t, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, "mem:2: unknown record \"\\x01\\xff\"");
    /* a long token is cut in the message */
    static const char lng[] = "stagehand-trace 1\na 0 1 1234567890123456789012345678901234 7 u\n";
    assert_int_equal(sh_trace_parse("mem", lng, sizeof lng - 1, &t, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, "mem:2: bytes: not a number: \"123456789012345678901234...\"");
    /* messages fit any buffer */
    char tiny[8];
    assert_int_equal(sh_trace_parse("mem", lng, sizeof lng - 1, &t, tiny, sizeof tiny), SH_EINVAL);
    assert_string_equal(tiny, "mem:2: ");
    assert_int_equal(sh_trace_parse("mem", lng, sizeof lng - 1, &t, NULL, 0), SH_EINVAL);
    assert_null(t);
}

/* A record after one region and one launch that touches it, and the error
 * it must give. */
struct bad_record {
    const char *rec, *want;
};

static void expect_bad_records(const struct bad_record *bad, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char text[256], err[256];
        struct sh_trace *t = NULL;
        int len = snprintf(text, sizeof text, "stagehand-trace 1\na 0 1 4 7 u\nl 1 2 7 9 1 1\n%s\n",
                           bad[i].rec);
        assert_int_equal(sh_trace_parse("mem", text, (size_t)len, &t, err, sizeof err), SH_EINVAL);
        assert_null(t);
        assert_string_equal(err, bad[i].want);
    }
}

/* `i ro` records: the regions a launch only reads; a trace without them
 * (every one before them) writes everything it touches. */
static void test_read_only_records(void **state)
{
    (void)state;
    struct sh_trace *t = NULL;
    char err[256];
    static const char old[] = "stagehand-trace 1\na 0 1 4 7 u\nl 1 2 7 9 1 1\n";
    assert_int_equal(sh_trace_parse("mem", old, sizeof old - 1, &t, err, sizeof err), 0);
    assert_null(at(t, 1)->ro);
    assert_true(sh_trace_writes(at(t, 1), 0));
    sh_trace_destroy(t);
    static const char ro[] = "stagehand-trace 1\na 0 1 4 7 u\na 0 2 4 7 u\n"
                             "l 1 2 7 9 2 1 2\ni ro 0 1 2\ni other key skipped\nl 3 2 7 9 1 2\n";
    assert_int_equal(sh_trace_parse("mem", ro, sizeof ro - 1, &t, err, sizeof err), 0);
    const struct sh_trace_event *l0 = at(t, 2), *l1 = at(t, 3);
    assert_true(sh_trace_writes(l0, 0));
    assert_false(sh_trace_writes(l0, 1));
    assert_true(sh_trace_writes(l1, 0)); /* no record: written */
    /* Written back and read again: the same. */
    assert_int_equal(sh_trace_save(t, tmp_file(), "round trip"), 0);
    sh_trace_destroy(t);
    assert_int_equal(sh_trace_read(tmp_file(), &t, err, sizeof err), 0);
    assert_false(sh_trace_writes(at(t, 2), 1));
    assert_true(sh_trace_writes(at(t, 2), 0));
    assert_true(sh_trace_writes(at(t, 3), 0));
    /* Misuse of the builder. */
    assert_int_equal(sh_trace_set_read_only(t, 0, 1), SH_EINVAL);    /* an allocation */
    assert_int_equal(sh_trace_set_read_only(t, 99, 1), SH_EINVAL);   /* no such event */
    assert_int_equal(sh_trace_set_read_only(t, 3, 1), SH_ENOTFOUND); /* not its region */
    assert_int_equal(sh_trace_set_read_only(t, 3, 2), 0);
    assert_false(sh_trace_writes(at(t, 3), 0));
    sh_trace_destroy(t);
    unlink(tmp_file());
    static const struct bad_record bad[] = {
        {"i ro 5 1 1", "mem:4: read-only regions of launch 5, but only 1 launches came before"},
        {"i ro 0 1 3", "mem:4: launch 0 does not touch region 3"},
        {"i ro 0 3 1 1 1", "mem:4: 3 read-only regions, but launch 0 touches 1"},
        {"i ro 0 1", "mem:4: missing region id"},
        {"i ro 0 1 1 1", "mem:4: unexpected \"1\" at the end of the line"},
        {"i ro x", "mem:4: launch number: not a number: \"x\""},
    };
    expect_bad_records(bad, sizeof bad / sizeof bad[0]);
}

/* `i unchanged ID FIRST LAST`: the launches of that span that touch the
 * region only read it; those outside it, and the other regions, are
 * written. Spans of one region may overlap (their union counts) and come
 * in any order. The writer's record reads back the same, and a span that
 * names launches not yet written is refused on both sides. */
static void test_unchanged_records(void **state)
{
    (void)state;
    struct sh_trace *t = NULL;
    char err[256];
    static const char text[] = "stagehand-trace 1\na 0 1 4 7 u\na 0 2 4 7 u\n"
                               "l 1 2 7 9 2 1 2\n"   /* launch 0 */
                               "l 2 2 7 9 1 1\n"     /* launch 1 */
                               "l 3 2 7 9 2 2 1\n"   /* launch 2 */
                               "l 4 2 7 9 1 1\n"     /* launch 3 */
                               "l 5 2 7 9 1 1\n"     /* launch 4 */
                               "i unchanged 1 3 3\n" /* after the earlier one: order is free */
                               "i unchanged 1 1 2\n"
                               "i unchanged 2 0 0\n"
                               "i unchanged 1 2 2\n"; /* inside 1..2 */
    assert_int_equal(sh_trace_parse("mem", text, sizeof text - 1, &t, err, sizeof err), 0);
    const struct sh_trace_event *l0 = at(t, 2), *l2 = at(t, 4);
    assert_true(sh_trace_writes(l0, 0));  /* region 1 at launch 0: before its span */
    assert_false(sh_trace_writes(l0, 1)); /* region 2 at launch 0 */
    assert_false(sh_trace_writes(at(t, 3), 0));
    assert_true(sh_trace_writes(l2, 0)); /* region 2 at launch 2: outside its span */
    assert_false(sh_trace_writes(l2, 1));
    assert_false(sh_trace_writes(at(t, 5), 0));
    assert_true(sh_trace_writes(at(t, 6), 0)); /* launch 4: past every span */
    sh_trace_destroy(t);
    /* The writer's record, read back. */
    struct sh_trace_writer *w = NULL;
    const uint64_t ids[] = {5};
    uint64_t seq;
    assert_int_equal(sh_trace_writer_open(tmp_file(), "unchanged", &w), 0);
    assert_int_equal(sh_trace_write_alloc(w, 0, 5, 64, 0, SH_CLASS_UNKNOWN), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(sh_trace_write_launch(w, 1, 2, 0, 9, ids, 1, &seq), 0);
    assert_int_equal(sh_trace_writer_launches(w), 3);
    assert_int_equal(sh_trace_write_unchanged(w, 5, 1, 3), SH_EINVAL); /* launch 3: not yet */
    assert_int_equal(sh_trace_write_unchanged(w, 5, 2, 1), SH_EINVAL);
    assert_int_equal(sh_trace_write_unchanged(w, 5, 1, 2), 0);
    assert_int_equal(sh_trace_writer_close(w), 0);
    assert_int_equal(sh_trace_read(tmp_file(), &t, err, sizeof err), 0);
    assert_true(sh_trace_writes(at(t, 1), 0));
    assert_false(sh_trace_writes(at(t, 2), 0));
    assert_false(sh_trace_writes(at(t, 3), 0));
    sh_trace_destroy(t);
    unlink(tmp_file());
    static const struct bad_record bad[] = {
        {"i unchanged 1 0 1", "mem:4: unchanged up to launch 1, but only 1 launches came before"},
        {"i unchanged 1 1 0",
         "mem:4: unchanged from launch 1 to launch 0: the first comes after the last"},
        {"i unchanged 1 0", "mem:4: missing last launch"},
        {"i unchanged 1 0 0 0", "mem:4: unexpected \"0\" at the end of the line"},
        {"i unchanged x 0 0", "mem:4: region id: not a number: \"x\""},
    };
    expect_bad_records(bad, sizeof bad / sizeof bad[0]);
}

/* ---- writing ---- */

static void test_write_read_round_trip(void **state)
{
    (void)state;
    struct sh_trace_writer *w = NULL;
    assert_int_equal(sh_trace_writer_open(tmp_file(), "unit test\nline two", &w), 0);
    assert_int_equal(sh_trace_write_kernel(w, 0xdeadbeef, "gemm\nkernel"), 0);
    assert_int_equal(sh_trace_write_alloc(w, 1, UINT64_MAX, 1ull << 40, 3, SH_CLASS_UNKNOWN), 0);
    assert_int_equal(sh_trace_write_alloc(w, 2, 0, 1, 0, SH_CLASS_TRANSIENT), 0);
    assert_int_equal(sh_trace_write_step(w, 3, 0, 0), 0);
    assert_int_equal(sh_trace_write_phase(w, 3, SH_PHASE_OPTIMIZER, 1), 0);
    assert_int_equal(sh_trace_write_phase(w, 3, 9, 1), SH_EINVAL);
    uint64_t ids[] = {UINT64_MAX, 0}, seq = 7;
    assert_int_equal(sh_trace_write_launch(w, 4, SH_TRACE_NO_DUR, 3, 0xdeadbeef, ids, 2, &seq), 0);
    assert_int_equal(seq, 0);
    assert_int_equal(sh_trace_write_launch(w, 5, 6, 3, 1, NULL, 0, &seq), 0);
    assert_int_equal(seq, 1);
    assert_int_equal(sh_trace_write_duration(w, 0, 42), 0);
    assert_int_equal(sh_trace_write_duration(w, 2, 42), SH_EINVAL); /* no such launch */
    assert_int_equal(sh_trace_write_free(w, 9, 0, SH_CLASS_TRANSIENT), 0);
    assert_true(sh_trace_writer_bytes(w) > 0);
    assert_int_equal(sh_trace_writer_close(w), 0);

    size_t len;
    char *text = slurp(tmp_file(), &len);
    static const char want[] = "stagehand-trace 1\n"
                               "i source unit test line two\n"
                               "k 3735928559 gemm kernel\n"
                               "a 1 18446744073709551615 1099511627776 3 u\n"
                               "a 2 0 1 0 t\n"
                               "s 3 0 auto\n"
                               "p 3 optimizer api\n"
                               "l 4 - 3 3735928559 2 18446744073709551615 0\n"
                               "l 5 6 3 1 0\n"
                               "d 0 42\n"
                               "f 9 0 t\n";
    assert_int_equal(len, sizeof want - 1);
    assert_memory_equal(text, want, len);
    free(text);

    struct sh_trace *t = NULL;
    char err[256];
    assert_int_equal(sh_trace_read(tmp_file(), &t, err, sizeof err), 0);
    assert_int_equal(sh_trace_count(t), 7);
    assert_string_equal(sh_trace_kernel_name(t, 0xdeadbeef), "gemm kernel");
    const struct sh_trace_event *e = at(t, 4);
    assert_int_equal(e->dur_us, 42);
    assert_true(e->ids[0] == UINT64_MAX);
    assert_int_equal(at(t, 5)->n, 0);
    assert_int_equal(at(t, 5)->dur_us, 6);
    assert_int_equal(at(t, 1)->cls, SH_CLASS_TRANSIENT);
    sh_trace_destroy(t);
    unlink(tmp_file());
}

/* A launch with more regions than the buffer holds, and many launches. */
static void test_write_large(void **state)
{
    (void)state;
    struct sh_trace *t = NULL;
    assert_int_equal(sh_trace_create(&t), 0);
    enum { N = 100000 };
    uint64_t *ids = malloc(N * sizeof *ids);
    assert_non_null(ids);
    for (uint64_t i = 0; i < N; i++) {
        struct sh_trace_event a = {.type = SH_TRACE_ALLOC, .id = 1000000 + i, .bytes = i + 1};
        assert_int_equal(sh_trace_append(t, &a), 0);
        ids[i] = 1000000 + i;
    }
    struct sh_trace_event l = {.type = SH_TRACE_LAUNCH, .t_us = 1, .dur_us = 2, .ids = ids, .n = N};
    for (int k = 0; k < 3; k++)
        assert_int_equal(sh_trace_append(t, &l), 0);
    assert_int_equal(sh_trace_set_kernel_name(t, 0, "k0"), 0);
    assert_int_equal(sh_trace_set_kernel_name(t, 0, "k0 again"), 0);
    assert_int_equal(sh_trace_save(t, tmp_file(), "big"), 0);
    sh_trace_destroy(t);
    char err[256];
    assert_int_equal(sh_trace_read(tmp_file(), &t, err, sizeof err), 0);
    assert_int_equal(sh_trace_count(t), N + 3);
    const struct sh_trace_event *e = at(t, N + 2);
    assert_int_equal(e->n, N);
    assert_int_equal(e->ids[N - 1], 1000000 + N - 1);
    assert_int_equal(at(t, N - 1)->bytes, N);
    assert_string_equal(sh_trace_kernel_name(t, 0), "k0 again");
    assert_string_equal(sh_trace_source(t), "big");
    sh_trace_destroy(t);
    free(ids);
    unlink(tmp_file());
}

static void test_write_errors(void **state)
{
    (void)state;
    struct sh_trace_writer *w = NULL;
    assert_int_equal(sh_trace_writer_open("/nonexistent-dir/x.trace", NULL, &w), SH_ENOTFOUND);
    assert_null(w);
    /* A full disk, in a child: a file size limit makes the writes fail. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit lim = {64 * 1024, 64 * 1024};
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &lim) || sh_trace_writer_open(tmp_file(), NULL, &w))
            _exit(2);
        uint64_t id = 1;
        int rc = 0;
        for (int i = 0; i < 100000 && rc == 0; i++)
            rc = sh_trace_write_launch(w, 0, 1, 0, 0, &id, 1, NULL);
        /* reported, and sticky */
        int ok = rc == SH_EINVAL && sh_trace_write_alloc(w, 0, 2, 3, 0, 0) == SH_EINVAL &&
                 sh_trace_writer_close(w) == SH_EINVAL;
        _exit(ok ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    unlink(tmp_file());
    assert_int_equal(sh_trace_writer_close(NULL), 0);
    assert_int_equal(sh_trace_write_alloc(NULL, 0, 1, 1, 0, 0), SH_EINVAL);
}

static int count_headers(const char *path)
{
    size_t len;
    char *text = slurp(path, &len);
    int n = 0;
    for (size_t i = 0; i + 15 <= len; i++)
        n += (i == 0 || text[i - 1] == '\n') && memcmp(text + i, "stagehand-trace", 15) == 0;
    free(text);
    return n;
}

/* A planted link, FIFO, directory or someone else's file is refused, and what it
 * points to is left alone; a new file is private. */
static void test_write_refuses_odd_files(void **state)
{
    (void)state;
    struct sh_trace_writer *w = NULL;
    char dir[] = "/tmp/test_trace_odd.XXXXXX", link[64], target[64], why[160];
    assert_non_null(mkdtemp(dir));
    snprintf(target, sizeof target, "%s/victim", dir);
    snprintf(link, sizeof link, "%s/t.trace", dir);
    FILE *f = fopen(target, "w");
    fputs("precious\n", f);
    fclose(f);
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(sh_trace_writer_create(link, NULL, &w, why, sizeof why), SH_ENOTFOUND);
    assert_null(w);
    assert_non_null(strstr(why, "t.trace: is a symbolic link; not following it"));
    size_t len;
    char *text = slurp(target, &len);
    assert_int_equal(len, 9); /* not truncated */
    free(text);
    unlink(link);
    assert_int_equal(mkfifo(link, 0600), 0);
    alarm(10); /* a plain open would block here for ever */
    assert_int_equal(sh_trace_writer_create(link, NULL, &w, why, sizeof why), SH_ENOTFOUND);
    alarm(0);
    assert_non_null(strstr(why, "t.trace: is a FIFO or a device, not a regular file"));
    unlink(link);
    assert_int_equal(sh_trace_writer_create(dir, NULL, &w, why, sizeof why), SH_ENOTFOUND);
    if (geteuid() == 0) {
        assert_int_equal(chown(target, 65534, 65534), 0);
        assert_int_equal(sh_trace_writer_create(target, NULL, &w, why, sizeof why), SH_ENOTFOUND);
        assert_non_null(strstr(why, "victim: owned by another user"));
        text = slurp(target, &len);
        assert_int_equal(len, 9);
        free(text);
    }
    mode_t old = umask(0);
    assert_int_equal(sh_trace_writer_open(link, NULL, &w), 0);
    umask(old);
    assert_int_equal(sh_trace_writer_close(w), 0);
    struct stat st;
    assert_int_equal(stat(link, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    unlink(link);
    unlink(target);
    rmdir(dir);
}

/* A fork child that exits (running its atexit handlers, which close the writer)
 * must not write the parent's buffered records: one header, and the trace reads. */
static void test_fork_child_writes_nothing(void **state)
{
    (void)state;
    struct sh_trace_writer *w = NULL;
    uint64_t id = 7;
    assert_int_equal(sh_trace_writer_open(tmp_file(), "parent", &w), 0);
    assert_int_equal(sh_trace_write_alloc(w, 1, id, 4096, 0, 0), 0);
    assert_int_equal(sh_trace_write_launch(w, 2, 1, 0, 0, &id, 1, NULL), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int rc = sh_trace_write_launch(w, 3, 1, 0, 0, &id, 1, NULL);
        rc |= sh_trace_writer_close(w);
        _exit(rc ? 1 : 0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(sh_trace_write_free(w, 4, id, 0), 0);
    assert_int_equal(sh_trace_writer_close(w), 0);
    assert_int_equal(count_headers(tmp_file()), 1);
    struct sh_trace *t = NULL;
    char err[256];
    assert_int_equal(sh_trace_read(tmp_file(), &t, err, sizeof err), 0);
    sh_trace_destroy(t);
    unlink(tmp_file());
}

/* ---- robustness ---- */

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void parse_any(const char *text, size_t len)
{
    struct sh_trace *t = NULL;
    char err[256];
    int rc = sh_trace_parse("fuzz", text, len, &t, err, sizeof err);
    if (rc == 0) {
        assert_non_null(t);
        for (size_t i = 0; i < sh_trace_count(t); i++)
            (void)at(t, i)->n;
        sh_trace_destroy(t);
    } else {
        assert_int_equal(rc, SH_EINVAL);
        assert_null(t);
        assert_memory_equal(err, "fuzz:", 5);
    }
}

/* Every prefix of a good trace, and thousands of damaged copies. */
static void test_never_crashes(void **state)
{
    (void)state;
    size_t len;
    char *good = slurp(DIR "good_small.trace", &len);
    for (size_t n = 0; n <= len; n++)
        parse_any(good, n);
    char *bad = malloc(len + 64);
    assert_non_null(bad);
    static const char alphabet[] = " \n\r\t-0x19afz#aflpsdki\xff";
    for (int round = 0; round < 20000; round++) {
        size_t n = len;
        memcpy(bad, good, len);
        int edits = 1 + (int)(rnd() % 4);
        for (int k = 0; k < edits; k++) {
            size_t pos = (size_t)(rnd() % n);
            switch (rnd() % 3) {
            case 0:
                bad[pos] = alphabet[rnd() % (sizeof alphabet - 1)];
                break;
            case 1:
                bad[pos] = (char)(rnd() & 0xff);
                break;
            default:
                memmove(bad + pos, bad + pos + 1, n - pos - 1);
                n--;
                break;
            }
        }
        parse_any(bad, n);
    }
    free(bad);
    free(good);
}

static void test_phase_names(void **state)
{
    (void)state;
    assert_string_equal(sh_trace_phase_name(SH_PHASE_STEP_BEGIN), "begin");
    assert_string_equal(sh_trace_phase_name(SH_PHASE_OPTIMIZER), "optimizer");
    assert_string_equal(sh_trace_phase_name(-1), "?");
    assert_string_equal(sh_trace_phase_name(5), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_good),
        cmocka_unit_test(test_read_gzip),
        cmocka_unit_test(test_read_line_endings),
        cmocka_unit_test(test_read_bad_files),
        cmocka_unit_test(test_read_only_records),
        cmocka_unit_test(test_unchanged_records),
        cmocka_unit_test(test_read_missing_file),
        cmocka_unit_test(test_parse_odd_bytes),
        cmocka_unit_test(test_write_read_round_trip),
        cmocka_unit_test(test_write_large),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_write_refuses_odd_files),
        cmocka_unit_test(test_fork_child_writes_nothing),
        cmocka_unit_test(test_never_crashes),
        cmocka_unit_test(test_phase_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
