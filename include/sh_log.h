/* sh_log.h — the library's one voice on stderr.
 *
 * Every line starts with "stagehand: " so users can tell our messages from
 * their program's. sh_log_once() prints a given message id at most once per
 * process (for conditions that would otherwise repeat on every call).
 */
#ifndef SH_LOG_H
#define SH_LOG_H

enum sh_log_level { SH_LOG_ERROR = 0, SH_LOG_WARN = 1, SH_LOG_INFO = 2, SH_LOG_DEBUG = 3 };

/* Messages above this level are dropped. Default SH_LOG_WARN. */
void sh_log_set_level(int level);
int sh_log_get_level(void);

void sh_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logs only the first time *once is seen clear; thread-safe. */
void sh_log_once(int *once, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
