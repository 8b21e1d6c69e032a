/* capture.h — what a test's code under test writes to stderr, captured
 * through a pipe (for the simulator's "names itself on stderr" contracts).
 * Include after cmocka.h and unistd.h. Keep what is written meanwhile under
 * the pipe's capacity (64 KiB): nothing reads it until capture_end. */
#ifndef SH_TESTS_CAPTURE_H
#define SH_TESTS_CAPTURE_H

struct capture {
    int saved, fds[2];
};

static void capture_begin(struct capture *c)
{
    fflush(stderr);
    assert_int_equal(pipe(c->fds), 0);
    c->saved = dup(STDERR_FILENO);
    assert_true(c->saved >= 0);
    assert_true(dup2(c->fds[1], STDERR_FILENO) >= 0);
}

/* Restores stderr and returns, NUL-terminated, what was written meanwhile. */
static void capture_end(struct capture *c, char *buf, size_t cap)
{
    fflush(stderr);
    dup2(c->saved, STDERR_FILENO);
    close(c->saved);
    close(c->fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(c->fds[0], buf + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    buf[n] = '\0';
    close(c->fds[0]);
}

#endif
