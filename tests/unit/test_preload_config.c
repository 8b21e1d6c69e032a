/* test_preload_config.c — a bad stagehand.ini stops a preloaded program at
 * start, before its main() runs, with "path:line: key: what is wrong";
 * STAGEHAND_DISABLE=1 makes the library a pure pass-through that does not
 * even read the file.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct run {
    int status;
    char out[4096];
};

/* Runs `sh -c 'echo main-ran'` with the library preloaded and env added. */
static void run_preloaded(struct run *r, const char *const *env)
{
    const char *build = getenv("STAGEHAND_TEST_BUILD");
    char lib[PATH_MAX + 64], cwd[PATH_MAX / 2];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(lib, sizeof lib, "%s/%s/libstagehand.so", cwd, build ? build : "build");
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        setenv("LD_PRELOAD", lib, 1);
        unsetenv("STAGEHAND_DISABLE");
        for (int i = 0; env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        execl("/bin/sh", "sh", "-c", "echo main-ran", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t k;
    while ((k = read(fd[0], r->out + n, sizeof r->out - 1 - n)) > 0)
        n += (size_t)k;
    r->out[n] = '\0';
    close(fd[0]);
    assert_int_equal(waitpid(pid, &r->status, 0), pid);
}

static void test_bad_file_stops_at_start(void **state)
{
    (void)state;
    struct run r = {0};
    const char *env[] = {"STAGEHAND_CONFIG", "tests/unit/config/bad_unknown_key.ini", NULL};
    run_preloaded(&r, env);
    assert_true(WIFEXITED(r.status));
    assert_int_equal(WEXITSTATUS(r.status), 1);
    assert_string_equal(r.out, "stagehand: tests/unit/config/bad_unknown_key.ini:3: "
                               "prefetch_windw: unknown key in [policy]\n");
}

static void test_bad_combination_names_key(void **state)
{
    (void)state;
    struct run r = {0};
    const char *env[] = {"STAGEHAND_CONFIG", "tests/unit/config/bad_low_ge_high.ini", NULL};
    run_preloaded(&r, env);
    assert_int_equal(WEXITSTATUS(r.status), 1);
    assert_non_null(strstr(r.out, "tests/unit/config/bad_low_ge_high.ini:"));
    assert_non_null(strstr(r.out, "vram_low_watermark_mb"));
    assert_null(strstr(r.out, "main-ran"));
}

static void test_bad_env_stops_at_start(void **state)
{
    (void)state;
    struct run r = {0};
    const char *env[] = {"STAGEHAND_TRANSFER_MAX_INFLIGHT_D2H", "many", NULL};
    run_preloaded(&r, env);
    assert_int_equal(WEXITSTATUS(r.status), 1);
    assert_non_null(strstr(r.out, "env STAGEHAND_TRANSFER_MAX_INFLIGHT_D2H: max_inflight_d2h:"));
    assert_null(strstr(r.out, "main-ran"));
}

static void test_missing_config_file(void **state)
{
    (void)state;
    struct run r = {0};
    const char *env[] = {"STAGEHAND_CONFIG", "/nonexistent/stagehand.ini", NULL};
    run_preloaded(&r, env);
    assert_int_equal(WEXITSTATUS(r.status), 1);
    assert_non_null(strstr(r.out, "/nonexistent/stagehand.ini"));
}

static void test_disable_is_pass_through(void **state)
{
    (void)state;
    struct run r = {0};
    const char *env[] = {"STAGEHAND_CONFIG", "tests/unit/config/bad_unknown_key.ini",
                         "STAGEHAND_DISABLE", "1", NULL};
    run_preloaded(&r, env);
    assert_int_equal(WEXITSTATUS(r.status), 0);
    assert_string_equal(r.out, "main-ran\n");
}

static void test_good_file_runs(void **state)
{
    (void)state;
    struct run r = {0};
    const char *env[] = {"STAGEHAND_CONFIG", "stagehand.ini", NULL};
    run_preloaded(&r, env);
    assert_int_equal(WEXITSTATUS(r.status), 0);
    assert_string_equal(r.out, "main-ran\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_file_stops_at_start),
        cmocka_unit_test(test_bad_combination_names_key),
        cmocka_unit_test(test_bad_env_stops_at_start),
        cmocka_unit_test(test_missing_config_file),
        cmocka_unit_test(test_disable_is_pass_through),
        cmocka_unit_test(test_good_file_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
