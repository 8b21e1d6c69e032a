/* sh_err.h — result codes shared by every module.
 *
 * Functions return 0 on success or a negative SH_E* code; results travel
 * through out-parameters. CUDA's own result types appear only in interpose/.
 */
#ifndef SH_ERR_H
#define SH_ERR_H

#include <stddef.h>

enum {
    SH_OK = 0,
    SH_ENOMEM = -1,    /* out of memory (device, host or bookkeeping) */
    SH_EINVAL = -2,    /* bad argument or bad input */
    SH_EDRIVER = -3,   /* the CUDA driver refused; see the log line */
    SH_ESTATE = -4,    /* invalid state transition: a bug, reported loudly */
    SH_ENOTFOUND = -5, /* no such region, key or entry */
    SH_EBUSY = -6,     /* resource temporarily unavailable (caps, capture) */
    SH_ERANGE = -7,    /* value out of range */
    SH_ELOST = -8,     /* a range could not be mapped again: a kernel touching it faults */
};

/* A short, static description of an SH_E* code. */
const char *sh_strerror(int err);

/* Writes the message into err (when err and errlen are given) and returns
 * rc: for functions that explain a refusal in the caller's buffer. */
int sh_err_say(int rc, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
