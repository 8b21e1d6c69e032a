/* test_config_trust.c — which configuration the library trusts: a ./stagehand.ini
 * another user owns or can write is refused with the reason; a symbolic link, a
 * directory or a FIFO is refused without blocking; in secure-execution mode the
 * environment is ignored and only a root-owned file is read; a misspelt section
 * in an environment name and a NUL byte in a value are errors.
 *
 * sh_config_secure() is replaced here (it is weak in the library) so that secure
 * mode can be tried without a setuid binary; the real getauxval() path is tried
 * by test_secure_probe, which runs this binary setuid when the tests run as root.
 * Every test works in its own temporary directory and changes back to the
 * repository root; no state is shared between tests except `fake_secure`.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "sh_err.h"

#define NOBODY 65534

static int fake_secure = -1; /* -1: the kernel's answer */

int sh_config_secure(void)
{
    return fake_secure < 0 ? getauxval(AT_SECURE) != 0 : fake_secure;
}

static char err[SH_CONFIG_ERR_MAX];
static char root[PATH_MAX];
static char tmp[64];

static int enter_tmp(void **state)
{
    (void)state;
    assert_non_null(getcwd(root, sizeof root));
    snprintf(tmp, sizeof tmp, "/tmp/sh_trust.XXXXXX");
    assert_non_null(mkdtemp(tmp));
    assert_int_equal(chdir(tmp), 0);
    fake_secure = 0;
    return 0;
}

static int leave_tmp(void **state)
{
    (void)state;
    char cmd[128];
    assert_int_equal(chdir(root), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

static int load(struct sh_config *c, char **envp)
{
    char used[256];
    err[0] = '\0';
    return sh_config_load(c, envp, used, sizeof used, err, sizeof err);
}

static const char *evil = "[tracking]\ncupti_path = /their/lib.so\n";

static void test_own_file_is_read(void **state)
{
    struct sh_config c;
    (void)state;
    write_file("stagehand.ini", evil, 0644);
    assert_int_equal(load(&c, NULL), 0);
    assert_string_equal(c.tracking.cupti_path, "/their/lib.so");
}

static void test_writable_by_others_refused(void **state)
{
    struct sh_config c;
    (void)state;
    write_file("stagehand.ini", evil, 0666);
    assert_int_equal(load(&c, NULL), SH_EINVAL);
    assert_string_equal(err, "stagehand.ini: refused: writable by every user (mode 0666); "
                             "chmod go-w it");
    write_file("stagehand.ini", evil, 0660);
    assert_int_equal(load(&c, NULL), SH_EINVAL);
    assert_string_equal(err, "stagehand.ini: refused: writable by its group (mode 0660); "
                             "chmod go-w it");
}

static void test_other_owner_refused(void **state)
{
    struct sh_config c;
    char want[160];
    (void)state;
    if (geteuid() != 0)
        skip(); /* only root can give a file away */
    write_file("stagehand.ini", evil, 0644);
    assert_int_equal(chown("stagehand.ini", NOBODY, NOBODY), 0);
    assert_int_equal(load(&c, NULL), SH_EINVAL);
    snprintf(want, sizeof want,
             "stagehand.ini: refused: owned by uid %d, neither you (uid 0) nor root", NOBODY);
    assert_string_equal(err, want);
    /* Named through the environment, the same file is refused as well. */
    char *envp[] = {"STAGEHAND_CONFIG=stagehand.ini", NULL};
    assert_int_equal(load(&c, envp), SH_EINVAL);
    assert_non_null(strstr(err, "env STAGEHAND_CONFIG: refused stagehand.ini: owned by uid"));
}

static void test_symlink_dir_fifo_refused(void **state)
{
    struct sh_config c;
    (void)state;
    write_file("real.ini", evil, 0644);
    assert_int_equal(symlink("real.ini", "stagehand.ini"), 0);
    assert_int_equal(load(&c, NULL), SH_ENOTFOUND);
    assert_string_equal(err, "stagehand.ini: cannot open: it is a symbolic link; name the "
                             "file itself");
    unlink("stagehand.ini");
    assert_int_equal(mkdir("stagehand.ini", 0755), 0);
    assert_int_equal(load(&c, NULL), SH_EINVAL);
    assert_string_equal(err, "stagehand.ini: refused: is a directory, not a configuration file");
    char *envp[] = {"STAGEHAND_CONFIG=.", NULL};
    assert_int_equal(load(&c, envp), SH_EINVAL);
    assert_string_equal(err, "env STAGEHAND_CONFIG: refused .: is a directory, not a "
                             "configuration file");
    rmdir("stagehand.ini");
    /* A FIFO with no writer would block a plain open() forever. */
    assert_int_equal(mkfifo("stagehand.ini", 0644), 0);
    alarm(10);
    assert_int_equal(load(&c, NULL), SH_EINVAL);
    alarm(0);
    assert_string_equal(err, "stagehand.ini: refused: not a regular file");
    /* The null device is the usual way to say "no file, the built-in defaults". */
    char *null_env[] = {"STAGEHAND_CONFIG=/dev/null", NULL};
    assert_int_equal(load(&c, null_env), 0);
    assert_string_equal(c.tracking.cupti_path, "auto");
    /* A tool's explicit file is not an ownership question, but a FIFO still is refused. */
    assert_int_equal(sh_config_load_file(&c, "stagehand.ini", err, sizeof err), SH_EINVAL);
    assert_string_equal(err, "stagehand.ini: refused: not a regular file");
}

static void test_secure_ignores_env(void **state)
{
    struct sh_config c;
    (void)state;
    write_file("other.ini", evil, 0644);
    char *envp[] = {"STAGEHAND_CONFIG=other.ini", "STAGEHAND_TRACKING_CUPTI_PATH=/x/evil.so",
                    "STAGEHAND_DEBUG_TRACE_FILE=/etc/passwd", NULL};
    fake_secure = 1;
    assert_int_equal(load(&c, envp), 0);
    assert_string_equal(c.tracking.cupti_path, "auto");
    assert_string_equal(c.debug.trace_file, "");
    fake_secure = 0;
    assert_int_equal(load(&c, envp), 0); /* the same environment counts when not secure */
    assert_string_equal(c.tracking.cupti_path, "/x/evil.so");
    assert_string_equal(c.debug.trace_file, "/etc/passwd");
    /* STAGEHAND_TRACE, [debug] trace_file's other name, is ignored in the same way. */
    char *trace[] = {"STAGEHAND_TRACE=/etc/shadow", NULL};
    fake_secure = 1;
    assert_int_equal(load(&c, trace), 0);
    assert_string_equal(c.debug.trace_file, "");
    fake_secure = 0;
    assert_int_equal(load(&c, trace), 0);
    assert_string_equal(c.debug.trace_file, "/etc/shadow");
}

static void test_secure_reads_only_root_files(void **state)
{
    struct sh_config c;
    (void)state;
    if (geteuid() != 0)
        skip();
    write_file("stagehand.ini", evil, 0644);
    fake_secure = 1;
    assert_int_equal(load(&c, NULL), 0); /* root's own file */
    assert_string_equal(c.tracking.cupti_path, "/their/lib.so");
    assert_int_equal(chown("stagehand.ini", NOBODY, NOBODY), 0);
    assert_int_equal(load(&c, NULL), 0); /* skipped, not an error: like the environment */
    assert_string_equal(c.tracking.cupti_path, "auto");
}

static void test_misspelt_section(void **state)
{
    struct sh_config c;
    (void)state;
    char *typo[] = {"STAGEHAND_BUDGT_VRAM_BUDGET_MB=1024", NULL};
    assert_int_equal(load(&c, typo), SH_EINVAL);
    assert_string_equal(err, "env STAGEHAND_BUDGT_VRAM_BUDGET_MB: not a key; did you mean "
                             "STAGEHAND_BUDGET_VRAM_BUDGET_MB?");
    char *nosec[] = {"STAGEHAND_LOG_LEVEL=debug", NULL};
    assert_int_equal(load(&c, nosec), SH_EINVAL);
    assert_string_equal(err, "env STAGEHAND_LOG_LEVEL: not a key; did you mean "
                             "STAGEHAND_GENERAL_LOG_LEVEL?");
    char *close_sec[] = {"STAGEHAND_POOOL_SOMETHING=1", NULL};
    assert_int_equal(load(&c, close_sec), SH_EINVAL);
    assert_string_equal(err, "env STAGEHAND_POOOL_SOMETHING: unknown section \"POOOL\" (did you "
                             "mean pool?)");
    /* Names that were never meant as keys stay free for scripts. */
    char *others[] = {"STAGEHAND_CONFIG=",          "STAGEHAND_TRACE=",    "STAGEHAND_LIB=/x",
                      "STAGEHAND_TEST_BUILD=build", "STAGEHAND_TM_DEMO=1", NULL};
    assert_int_equal(load(&c, others), 0);
}

static void test_nul_in_value(void **state)
{
    struct sh_config c;
    (void)state;
    static const char text[] = "[policy]\nprefetch_window = 12\0 34\n";
    int fd = open("stagehand.ini", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)sizeof text - 1);
    close(fd);
    assert_int_equal(load(&c, NULL), SH_EINVAL);
    assert_string_equal(err, "stagehand.ini:2: line: holds a NUL byte at column 21");
}

/* The real getauxval(AT_SECURE) path: this binary, copied and made setuid to
 * nobody, runs with AT_SECURE set; it prints what sh_config_secure() says. */
static void test_secure_probe(void **state)
{
    char exe[PATH_MAX], copy[PATH_MAX], out[64] = "";
    int fd[2], status;
    (void)state;
    fake_secure = -1;
    assert_int_equal(sh_config_secure(), 0); /* an ordinary run */
    if (geteuid() != 0)
        skip();
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    snprintf(copy, sizeof copy, "%s/probe", tmp);
    char cmd[2 * PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", exe, copy);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(chmod(tmp, 0755), 0);
    assert_int_equal(chown(copy, NOBODY, NOBODY), 0);
    assert_int_equal(chmod(copy, 04755), 0);
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        execl(copy, copy, "--secure-probe", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    n = read(fd[0], out, sizeof out - 1);
    close(fd[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    out[n > 0 ? n : 0] = '\0';
    assert_string_equal(out, "secure=1\n");
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--secure-probe") == 0) {
        printf("secure=%d\n", sh_config_secure());
        fflush(stdout);
        _exit(0); /* no exit handlers: LeakSanitizer cannot run in a setuid process */
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_own_file_is_read, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_writable_by_others_refused, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_other_owner_refused, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_symlink_dir_fifo_refused, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_secure_ignores_env, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_secure_reads_only_root_files, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_misspelt_section, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_nul_in_value, enter_tmp, leave_tmp),
        cmocka_unit_test_setup_teardown(test_secure_probe, enter_tmp, leave_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
