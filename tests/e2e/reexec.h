/* reexec.h — the end-to-end programs start themselves again to set the
 * environment the library reads as it loads. They exec their own path
 * (argv[0]) so that a tool wrapping them, valgrind say, follows them;
 * /proc/self/exe only when argv[0] names no directory. Some also run a
 * variant of themselves in a child (another drain or tracking mode).
 */
#ifndef SH_E2E_REEXEC_H
#define SH_E2E_REEXEC_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Returns only if the exec failed, having said why. */
static inline void e2e_reexec(char **argv)
{
    const char *self = argv[0] && strchr(argv[0], '/') ? argv[0] : "/proc/self/exe";
    execv(self, argv);
    perror("execv");
}

/* Runs the program again in a child with env[] ("NAME=value", NULL
 * terminated) added, and waits: the child's exit status, -1 if it did not
 * exit normally. */
static inline int e2e_rerun(char **argv, const char *const *env)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        for (const char *const *e = env; *e; e++)
            putenv((char *)*e);
        e2e_reexec(argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

#endif
