/* test_tools_cli.c — the tools' edges. stagehand-sim's flags: a value out of range, a fraction
 * where a count is wanted and a run too long for the replay's nanosecond arithmetic are refused
 * with the flag and its range named; --write says why it cannot write; a configuration that does
 * not fit the card says where the card's size came from. stagehand-top -p PID says whether the
 * process exists. Runs the built tools ($STAGEHAND_TEST_BUILD/stagehand-sim, .../stagehand-top).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char out[8192];

/* Runs a tool with args (a shell word list); returns its exit status. */
static int tool(const char *name, const char *args)
{
    const char *build = getenv("STAGEHAND_TEST_BUILD");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/%s %s 2>&1", build ? build : "build", name, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static int sim(const char *args)
{
    return tool("stagehand-sim", args);
}

static void expect(const char *args, int code, const char *first_line)
{
    assert_int_equal(sim(args), code);
    size_t n = strlen(first_line);
    if (strncmp(out, first_line, n) != 0 || out[n] != '\n')
        fail_msg("%s: got \"%s\"", args, out);
}

static void test_ranges_named(void **state)
{
    (void)state;
    expect("--gen --vram-gb 0", 2,
           "stagehand-sim: --vram-gb: expected a number in [0.001, 1e+06], got \"0\"");
    expect("--gen --steps 1.5", 2,
           "stagehand-sim: --steps: expected a whole number in [1, 10000], got \"1.5\"");
    expect("--gen --pcie-gbps 1e-12", 2,
           "stagehand-sim: --pcie-gbps: expected a number in [0.001, 100000], got \"1e-12\"");
    expect("--gen --compute-ms 1e300", 2,
           "stagehand-sim: --compute-ms: expected a number in [0.001, 1e+06], got \"1e300\"");
    expect("--gen --hbm-gbps 0", 2,
           "stagehand-sim: --hbm-gbps: expected a number in [0.001, 1e+06], got \"0\"");
    expect("--gen --prefilter-gbps x", 2,
           "stagehand-sim: --prefilter-gbps: expected a number in [0.001, 1e+06], got \"x\"");
    expect("--gen --eval-every x", 2,
           "stagehand-sim: --eval-every: expected a whole number in [0, 10000], got \"x\"");
    expect("--gen --compute-ms 1000000 --blocks 1000 --steps 10000", 2,
           "stagehand-sim: --compute-ms 1e+06 x --blocks 1000 x --steps 10000: the run would "
           "last 3e+10 s, over the simulator's limit of 1e9 s");
}

static void test_edges_still_run(void **state)
{
    (void)state;
    /* the largest values a flag accepts give a result, not an overflow */
    assert_int_equal(sim("--gen --steps 1 --blocks 2 --compute-ms 1000000 --pcie-gbps 0.001 "
                         "--policy lru"),
                     0);
    assert_null(strstr(out, "nan"));
    assert_null(strstr(out, "-nan"));
}

static void test_write_says_why(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_sim_cli.XXXXXX", args[256];
    assert_non_null(mkdtemp(dir));
    snprintf(args, sizeof args, "%s/l", dir);
    assert_int_equal(symlink("/tmp/nowhere-at-all", args), 0);
    snprintf(args, sizeof args, "--gen --steps 1 --write %s/l", dir);
    char want[256];
    snprintf(want, sizeof want, "stagehand-sim: --write %s/l: is a symbolic link; not following it",
             dir);
    expect(args, 1, want);
    snprintf(args, sizeof args, "--gen --steps 1 --write %s", dir);
    snprintf(want, sizeof want, "stagehand-sim: --write %s: Is a directory", dir);
    expect(args, 1, want);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    assert_int_equal(system(args), 0);
}

/* A watermark that a percentage of the card makes too small names the card
 * (the shipped auto ones follow the card, and cannot be). */
static void test_config_blames_the_card(void **state)
{
    (void)state;
    assert_int_equal(
        sim("--gen --steps 1 --vram-gb 0.001 --config tests/unit/traces/sim_watermark_8060.ini"),
        1);
    assert_non_null(strstr(out, "the simulated card has 0.001 GB (--vram-gb)"));
}

/* The lower bound is one: no policy beats it, whatever the shape. With every
 * step an evaluation, the optimizer state is never used again and costs no
 * traffic; counting it made the bound exceed what the policies achieved. */
static void test_bound_holds_for_every_shape(void **state)
{
    (void)state;
    static const char *const shapes[] = {"--eval-every 1", "--eval-every 2",  "--eval-every 3",
                                         "--lora",         "--checkpointing", ""};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char args[128];
        snprintf(args, sizeof args, "--gen --steps 4 %s", shapes[i]);
        assert_int_equal(sim(args), 0);
        int lines = 0;
        for (const char *p = strstr(out, "ratio="); p; p = strstr(p + 1, "ratio=")) {
            double r = strtod(p + 6, NULL);
            if (r < 0.999)
                fail_msg("%s: ratio %.3f below 1 in\n%s", args, r, out);
            lines++;
        }
        assert_int_equal(lines, 4);
    }
}

static void test_top_says_whether_the_process_exists(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_top_cli.XXXXXX", args[128], want[256];
    assert_non_null(mkdtemp(dir));
    snprintf(args, sizeof args, "--dir %s -p %d --once", dir, (int)getpid());
    assert_int_equal(tool("stagehand-top", args), 1);
    snprintf(want, sizeof want,
             "stagehand-top: process %d exists but publishes no segment in %s: it does not use "
             "stagehand, or runs with [telemetry] shm_enabled = false\n",
             (int)getpid(), dir);
    assert_string_equal(out, want);
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    waitpid(gone, NULL, 0);
    snprintf(args, sizeof args, "--dir %s -p %d --once", dir, (int)gone);
    assert_int_equal(tool("stagehand-top", args), 1);
    snprintf(want, sizeof want, "stagehand-top: no process %d, and no segment %s/stagehand.%d\n",
             (int)gone, dir, (int)gone);
    assert_string_equal(out, want);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_named),
        cmocka_unit_test(test_edges_still_run),
        cmocka_unit_test(test_write_says_why),
        cmocka_unit_test(test_config_blames_the_card),
        cmocka_unit_test(test_top_says_whether_the_process_exists),
        cmocka_unit_test(test_bound_holds_for_every_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
