/* reexec.h — the end-to-end programs start themselves again to set the
 * environment the library reads as it loads. They exec their own path
 * (argv[0]) so that a tool wrapping them, valgrind say, follows them;
 * /proc/self/exe only when argv[0] names no directory.
 */
#ifndef SH_E2E_REEXEC_H
#define SH_E2E_REEXEC_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Returns only if the exec failed, having said why. */
static inline void e2e_reexec(char **argv)
{
    const char *self = argv[0] && strchr(argv[0], '/') ? argv[0] : "/proc/self/exe";
    execv(self, argv);
    perror("execv");
}

#endif
