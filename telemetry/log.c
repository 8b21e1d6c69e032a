/* log.c — stderr messages and result-code strings.
 *
 * Locking: the level is an atomic int; each message is formatted into a local
 * buffer and written with one write(2), so lines from threads never interleave.
 */
#include "sh_err.h"
#include "sh_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

static atomic_int log_level = SH_LOG_WARN;

void sh_log_set_level(int level)
{
    atomic_store(&log_level, level);
}

int sh_log_get_level(void)
{
    return atomic_load(&log_level);
}

static void vlog(int level, const char *fmt, va_list ap)
{
    static const char *const tags[] = {"error: ", "warning: ", "", "debug: "};
    char line[1024];
    int n = snprintf(line, sizeof line, "stagehand: %s", tags[level & 3]);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void sh_log(int level, const char *fmt, ...)
{
    if (level > atomic_load(&log_level))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

void sh_log_once(int *once, int level, const char *fmt, ...)
{
    if (level > atomic_load(&log_level) || __atomic_exchange_n(once, 1, __ATOMIC_RELAXED))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

int sh_err_say(int rc, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

const char *sh_strerror(int err)
{
    switch (err) {
    case SH_OK:
        return "success";
    case SH_ENOMEM:
        return "out of memory";
    case SH_EINVAL:
        return "invalid argument";
    case SH_EDRIVER:
        return "CUDA driver error";
    case SH_ESTATE:
        return "invalid state transition";
    case SH_ENOTFOUND:
        return "not found";
    case SH_EBUSY:
        return "busy";
    case SH_ERANGE:
        return "out of range";
    case SH_ELOST:
        return "mapping lost";
    default:
        return "unknown error";
    }
}
