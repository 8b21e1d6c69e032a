/* child.h — runs this test program again in a fresh process, for what
 * must not touch the parent (a sticky fault, a configuration read once):
 * argv[1] names the scenario, the environment is the parent's with some
 * variables set, and the child's stderr comes back as a string. Include
 * after cmocka.h, stdbool.h, string.h, sys/wait.h and unistd.h.
 */
#ifndef SH_TESTS_CHILD_H
#define SH_TESTS_CHILD_H

extern char **environ;

/* This process's environment with the NAME=VALUE strings of add (NULL
 * ended) in place of the variables they name, in envp[cap]. */
static void child_env(const char *const *add, char **envp, size_t cap)
{
    size_t n = 0;
    for (char **e = environ; *e; e++) {
        bool replaced = false;
        for (size_t i = 0; add && add[i]; i++) {
            size_t k = (size_t)(strchr(add[i], '=') - add[i]) + 1;
            replaced |= strncmp(*e, add[i], k) == 0;
        }
        if (!replaced && n + 1 < cap)
            envp[n++] = *e;
    }
    for (size_t i = 0; add && add[i] && n + 1 < cap; i++)
        envp[n++] = (char *)(uintptr_t)add[i];
    envp[n] = NULL;
}

/* Runs scenario in a fresh process with env (NAME=VALUE strings, NULL
 * ended) added; returns its exit status, its stderr in err. */
static int run_child(const char *scenario, const char *const *env, char *err, size_t cap)
{
    static char *envp[512];
    child_env(env, envp, sizeof envp / sizeof *envp);
    char *argv[] = {"child", (char *)(uintptr_t)scenario, NULL};
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* only async-signal-safe calls: the parent has threads */
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fds[0], err + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    err[n] = '\0';
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc != 0)
        print_error("scenario %s exited %d; its stderr:\n%s\n", scenario, rc, err);
    return rc;
}

#endif
