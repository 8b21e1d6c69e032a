/* test_xfer.c — the copy engine over fake copy streams whose copies finish
 * when the test says so, when they are waited for, or on a "device" thread
 * that completes each direction's copies in order after a delay. The fake
 * counts copies in flight the way the device sees them: from issue until
 * they finish, whoever is waiting for them. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sh_err.h"
#include "transfer/transfer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXT 20000

enum mode {
    AUTO,   /* a wait finishes the copy (and those before it on its stream) */
    MANUAL, /* copies finish only through finish_upto(); a wait blocks */
    DEVICE  /* a device thread finishes them in order, delay_us each */
};

struct tok {
    int dir, finished, waited, forgotten, err;
    size_t n;
};

struct fake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    enum mode mode;
    unsigned delay_us;
    int stop;
    uint64_t next;
    struct tok t[MAXT];
    uint64_t issued[2][MAXT], finished[2][MAXT], waits[2][MAXT];
    unsigned nissued[2], nfinished[2], nwaits[2];
    unsigned inflight[2], peak[2];
    int fail_copy, err_next, drain_err;
    int drains, forgets, bad;
};

static struct fake fk, snap;
static pthread_t device;
static int device_running;

/* Finishes the copies of dir in issue order up to and including token; mu held. */
static void finish_upto(struct fake *f, int dir, uint64_t token)
{
    while (f->nfinished[dir] < f->nissued[dir]) {
        uint64_t t = f->issued[dir][f->nfinished[dir]];
        if (t > token)
            break;
        f->t[t].finished = 1;
        f->finished[dir][f->nfinished[dir]++] = t;
        f->inflight[dir]--;
    }
    pthread_cond_broadcast(&f->cv);
}

static int f_copy(void *ctx, int dir, uintptr_t dst, uintptr_t src, size_t n, uint64_t *token)
{
    struct fake *f = ctx;
    (void)dst;
    (void)src;
    pthread_mutex_lock(&f->mu);
    if (f->fail_copy || f->next + 1 >= MAXT) {
        pthread_mutex_unlock(&f->mu);
        return SH_EDRIVER;
    }
    uint64_t t = ++f->next;
    f->t[t] = (struct tok){.dir = dir, .n = n, .err = f->err_next};
    f->err_next = 0;
    f->issued[dir][f->nissued[dir]++] = t;
    if (++f->inflight[dir] > f->peak[dir])
        f->peak[dir] = f->inflight[dir];
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    *token = t;
    return 0;
}

static int f_done(void *ctx, uint64_t token)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    int d = token > 0 && token <= f->next && f->t[token].finished;
    pthread_mutex_unlock(&f->mu);
    return d;
}

static int f_wait(void *ctx, uint64_t token)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    if (token == 0 || token > f->next || f->t[token].forgotten || f->t[token].waited) {
        f->bad++;
        pthread_mutex_unlock(&f->mu);
        return SH_EINVAL;
    }
    struct tok *t = &f->t[token];
    f->waits[t->dir][f->nwaits[t->dir]++] = token;
    t->waited = 1;
    if (f->mode == AUTO)
        finish_upto(f, t->dir, token);
    while (!t->finished)
        pthread_cond_wait(&f->cv, &f->mu);
    int err = t->err;
    pthread_mutex_unlock(&f->mu);
    return err;
}

static void f_forget(void *ctx, uint64_t token)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    if (token == 0 || token > f->next || f->t[token].forgotten || !f->t[token].finished)
        f->bad++;
    else
        f->t[token].forgotten = 1;
    f->forgets++;
    pthread_mutex_unlock(&f->mu);
}

static int f_drain(void *ctx)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->drains++;
    for (int d = 0; d < 2; d++)
        if (f->mode == AUTO && f->nissued[d])
            finish_upto(f, d, f->issued[d][f->nissued[d] - 1]);
    while (f->nfinished[0] < f->nissued[0] || f->nfinished[1] < f->nissued[1])
        pthread_cond_wait(&f->cv, &f->mu);
    int err = f->drain_err;
    pthread_mutex_unlock(&f->mu);
    return err;
}

/* A copy of the books to assert on: a failed assertion must not leave the
 * fake's lock held. */
static const struct fake *snapshot(void)
{
    pthread_mutex_lock(&fk.mu);
    memcpy(&snap, &fk, sizeof snap);
    pthread_mutex_unlock(&fk.mu);
    return &snap;
}

static const struct sh_copy_ops ops = {&fk, f_copy, f_done, f_wait, f_forget, f_drain};

/* The device: finishes the oldest copy of each direction, delay_us apiece. */
static void *device_main(void *arg)
{
    struct fake *f = arg;
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        int any = 0;
        for (int d = 0; d < 2; d++) {
            if (f->nfinished[d] == f->nissued[d])
                continue;
            any = 1;
            uint64_t t = f->issued[d][f->nfinished[d]];
            pthread_mutex_unlock(&f->mu);
            usleep(f->delay_us);
            pthread_mutex_lock(&f->mu);
            finish_upto(f, d, t);
        }
        if (!any)
            pthread_cond_wait(&f->cv, &f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static void start_device(unsigned delay_us)
{
    fk.mode = DEVICE;
    fk.delay_us = delay_us;
    assert_int_equal(pthread_create(&device, NULL, device_main, &fk), 0);
    device_running = 1;
}

static int setup(void **state)
{
    (void)state;
    memset(&fk, 0, sizeof fk);
    pthread_mutex_init(&fk.mu, NULL);
    pthread_cond_init(&fk.cv, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (device_running) {
        pthread_mutex_lock(&fk.mu);
        fk.stop = 1;
        pthread_cond_broadcast(&fk.cv);
        pthread_mutex_unlock(&fk.mu);
        pthread_join(device, NULL);
        device_running = 0;
    }
    pthread_cond_destroy(&fk.cv);
    pthread_mutex_destroy(&fk.mu);
    return 0;
}

static struct sh_xfer *mk(unsigned d2h, unsigned h2d)
{
    struct sh_xfer *x = NULL;
    assert_int_equal(sh_xfer_create(&ops, d2h, h2d, &x), 0);
    assert_non_null(x);
    return x;
}

static struct sh_xfer_stats xstats(struct sh_xfer *x)
{
    struct sh_xfer_stats st;
    sh_xfer_stats(x, &st);
    return st;
}

static void copy(struct sh_xfer *x, int dir, size_t n)
{
    assert_int_equal(sh_xfer_copy(x, dir, 0x1000, 0x2000, n), 0);
}

/* Every copy issued was waited for or polled, and forgotten exactly once. */
static void all_settled(void)
{
    const struct fake *f = snapshot();
    assert_int_equal(f->bad, 0);
    for (uint64_t t = 1; t <= f->next; t++) {
        assert_true(f->t[t].finished);
        assert_true(f->t[t].forgotten);
    }
    assert_int_equal(f->forgets, (int)f->next);
    assert_int_equal(f->inflight[0] + f->inflight[1], 0);
}

/* ---- tests ------------------------------------------------------------------------ */

static void test_bad_args(void **state)
{
    (void)state;
    struct sh_xfer *x = NULL;
    assert_int_equal(sh_xfer_create(NULL, 1, 1, &x), SH_EINVAL);
    assert_int_equal(sh_xfer_create(&ops, 1, 1, NULL), SH_EINVAL);
    assert_null(x);
    x = mk(2, 2);
    assert_int_equal(sh_xfer_copy(x, 2, 0, 0, 1), SH_EINVAL);
    assert_int_equal(sh_xfer_copy(x, -1, 0, 0, 1), SH_EINVAL);
    assert_int_equal(fk.next, 0);
    sh_xfer_destroy(x);
    sh_xfer_destroy(NULL);
}

static void test_cap_and_inline_finalize(void **state)
{
    (void)state;
    fk.mode = AUTO;
    struct sh_xfer *x = mk(3, 2);
    for (int i = 0; i < 3; i++)
        copy(x, SH_D2H, 100);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 3);
    assert_int_equal(fk.nwaits[SH_D2H], 0);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 0);
    /* Full: the fourth waits for the oldest instead of failing. */
    copy(x, SH_D2H, 100);
    assert_int_equal(fk.nwaits[SH_D2H], 1);
    assert_int_equal(fk.waits[SH_D2H][0], 1);
    assert_true(fk.t[1].forgotten);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 3);
    for (int i = 0; i < 10; i++)
        copy(x, SH_D2H, 100);
    struct sh_xfer_stats st = xstats(x);
    assert_int_equal(st.inline_finalized[SH_D2H], 11);
    assert_int_equal(st.copies[SH_D2H], 14);
    assert_int_equal(st.bytes[SH_D2H], 1400);
    assert_int_equal(st.max_inflight_seen[SH_D2H], 3);
    assert_int_equal(fk.peak[SH_D2H], 3);
    /* Finalized oldest first. */
    for (unsigned i = 0; i < fk.nwaits[SH_D2H]; i++)
        assert_int_equal(fk.waits[SH_D2H][i], fk.issued[SH_D2H][i]);
    /* The other direction has its own cap. */
    copy(x, SH_H2D, 7);
    copy(x, SH_H2D, 7);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 2);
    assert_int_equal(xstats(x).inline_finalized[SH_H2D], 0);
    copy(x, SH_H2D, 7);
    st = xstats(x);
    assert_int_equal(st.inline_finalized[SH_H2D], 1);
    assert_int_equal(st.inline_finalized[SH_D2H], 11);
    assert_int_equal(fk.peak[SH_H2D], 2);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 3);
    assert_int_equal(st.drains, 0);
    sh_xfer_destroy(x);
    all_settled();
}

static void test_cap_clamped(void **state)
{
    (void)state;
    fk.mode = AUTO;
    struct sh_xfer *x = mk(0, 1000); /* 0 means 1; above 64 means 64 */
    copy(x, SH_D2H, 1);
    copy(x, SH_D2H, 1);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 1);
    for (int i = 0; i < 70; i++)
        copy(x, SH_H2D, 1);
    struct sh_xfer_stats st = xstats(x);
    assert_int_equal(st.inline_finalized[SH_H2D], 6);
    assert_int_equal(st.max_inflight_seen[SH_H2D], 64);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 64);
    sh_xfer_destroy(x);
    all_settled();
}

static void test_flush_waits_for_all(void **state)
{
    (void)state;
    start_device(2000);
    struct sh_xfer *x = mk(4, 4);
    for (int i = 0; i < 4; i++)
        copy(x, SH_D2H, 10);
    for (int i = 0; i < 3; i++)
        copy(x, SH_H2D, 10);
    assert_int_equal(sh_xfer_flush(x, SH_D2H), 0);
    const struct fake *f = snapshot();
    assert_int_equal(f->nfinished[SH_D2H], 4);
    assert_int_equal(f->inflight[SH_D2H], 0);
    assert_int_equal(f->nwaits[SH_D2H], 4);
    assert_int_equal(f->nwaits[SH_H2D], 0); /* the other direction is left alone */
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 0);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 3);
    assert_int_equal(sh_xfer_flush(x, SH_H2D), 0);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 0);
    assert_int_equal(sh_xfer_flush(x, SH_H2D), 0); /* nothing left: returns at once */
    assert_int_equal(xstats(x).inline_finalized[SH_D2H] + xstats(x).inline_finalized[SH_H2D], 0);
    all_settled();
    sh_xfer_destroy(x);
}

static void test_order_within_direction(void **state)
{
    (void)state;
    start_device(300);
    struct sh_xfer *x = mk(3, 2);
    for (int i = 0; i < 60; i++)
        copy(x, (i % 3 == 0) ? SH_H2D : SH_D2H, (size_t)i + 1);
    assert_int_equal(sh_xfer_flush(x, SH_D2H), 0);
    assert_int_equal(sh_xfer_flush(x, SH_H2D), 0);
    const struct fake *f = snapshot();
    assert_int_equal(f->nissued[SH_D2H], 40);
    assert_int_equal(f->nissued[SH_H2D], 20);
    for (int d = 0; d < 2; d++) {
        /* Waited for, and finished, in the order issued. */
        assert_int_equal(f->nwaits[d], f->nissued[d]);
        for (unsigned i = 0; i < f->nissued[d]; i++) {
            assert_int_equal(f->waits[d][i], f->issued[d][i]);
            assert_int_equal(f->finished[d][i], f->issued[d][i]);
            if (i)
                assert_true(f->issued[d][i] > f->issued[d][i - 1]);
        }
    }
    assert_int_equal(f->peak[SH_D2H], 3);
    assert_int_equal(f->peak[SH_H2D], 2);
    all_settled();
    sh_xfer_destroy(x);
}

static void test_set_caps(void **state)
{
    (void)state;
    fk.mode = AUTO;
    struct sh_xfer *x = mk(4, 4);
    for (int i = 0; i < 4; i++)
        copy(x, SH_D2H, 1);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 0);
    /* Lowered to 1: the next copy first finalizes all four. */
    sh_xfer_set_caps(x, 1, 4);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 4); /* on the next copy, not before */
    copy(x, SH_D2H, 1);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 4);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 1);
    copy(x, SH_D2H, 1);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 5);
    /* Raised to 8: seven more fit without waiting. */
    sh_xfer_set_caps(x, 8, 4);
    for (int i = 0; i < 7; i++)
        copy(x, SH_D2H, 1);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 5);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 8);
    copy(x, SH_D2H, 1);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 6);
    /* Clamped like at create. */
    sh_xfer_set_caps(x, 0, 500);
    copy(x, SH_D2H, 1);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 1);
    for (int i = 0; i < 65; i++)
        copy(x, SH_H2D, 1);
    assert_int_equal(xstats(x).inline_finalized[SH_H2D], 1);
    assert_int_equal(fk.peak[SH_H2D], 64);
    assert_int_equal(fk.peak[SH_D2H], 8);
    sh_xfer_destroy(x);
    all_settled();
}

static void test_errors(void **state)
{
    (void)state;
    fk.mode = AUTO;
    struct sh_xfer *x = mk(1, 4);
    /* A failed wait reaches the caller whose copy finalized it... */
    fk.err_next = SH_EDRIVER;
    copy(x, SH_D2H, 1);
    assert_int_equal(sh_xfer_copy(x, SH_D2H, 0, 0, 1), SH_EDRIVER);
    /* ...and the copy it was making room for was queued all the same. */
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 1);
    assert_int_equal(xstats(x).copies[SH_D2H], 2);
    assert_int_equal(sh_xfer_flush(x, SH_D2H), 0);
    /* Flush reports the first error and still waits for every copy. */
    fk.err_next = SH_EDRIVER;
    copy(x, SH_H2D, 1);
    copy(x, SH_H2D, 1);
    fk.err_next = SH_ENOMEM;
    copy(x, SH_H2D, 1);
    copy(x, SH_H2D, 1);
    assert_int_equal(sh_xfer_flush(x, SH_H2D), SH_EDRIVER);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 0);
    assert_int_equal(fk.nwaits[SH_H2D], 4);
    assert_int_equal(sh_xfer_flush(x, SH_H2D), 0); /* reported once */
    /* A copy the stream refuses is not queued. */
    fk.fail_copy = 1;
    assert_int_equal(sh_xfer_copy(x, SH_H2D, 0, 0, 1), SH_EDRIVER);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 0);
    assert_int_equal(xstats(x).copies[SH_H2D], 4);
    fk.fail_copy = 0;
    /* Drain passes the device's answer through and is counted. */
    assert_int_equal(sh_xfer_drain(x), 0);
    fk.drain_err = SH_EDRIVER;
    assert_int_equal(sh_xfer_drain(x), SH_EDRIVER);
    assert_int_equal(fk.drains, 2);
    assert_int_equal(xstats(x).drains, 2);
    sh_xfer_destroy(x);
    all_settled();
}

static void test_poll(void **state)
{
    (void)state;
    fk.mode = MANUAL;
    struct sh_xfer *x = mk(4, 4);
    for (int i = 0; i < 3; i++)
        copy(x, SH_D2H, 1);
    copy(x, SH_H2D, 1); /* token 4 */
    sh_xfer_poll(x);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 3);
    pthread_mutex_lock(&fk.mu);
    finish_upto(&fk, SH_D2H, 2);
    pthread_mutex_unlock(&fk.mu);
    sh_xfer_poll(x);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 1);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 1);
    assert_true(fk.t[1].forgotten && fk.t[2].forgotten);
    assert_false(fk.t[3].forgotten);
    pthread_mutex_lock(&fk.mu);
    finish_upto(&fk, SH_D2H, 3);
    finish_upto(&fk, SH_H2D, 4);
    pthread_mutex_unlock(&fk.mu);
    sh_xfer_poll(x);
    assert_int_equal(sh_xfer_inflight(x, SH_D2H), 0);
    assert_int_equal(sh_xfer_inflight(x, SH_H2D), 0);
    assert_int_equal(fk.nwaits[0] + fk.nwaits[1], 0); /* polling never waits */
    all_settled();
    sh_xfer_destroy(x);
}

struct finisher {
    unsigned after_us;
};

static void *finish_later(void *arg)
{
    struct finisher *w = arg;
    usleep(w->after_us);
    pthread_mutex_lock(&fk.mu);
    for (int d = 0; d < 2; d++)
        if (fk.nissued[d])
            finish_upto(&fk, d, fk.issued[d][fk.nissued[d] - 1]);
    pthread_mutex_unlock(&fk.mu);
    return NULL;
}

/* A full direction blocks the caller until the oldest copy finishes. */
static void test_inline_finalize_blocks(void **state)
{
    (void)state;
    fk.mode = MANUAL;
    struct sh_xfer *x = mk(2, 2);
    copy(x, SH_D2H, 1);
    copy(x, SH_D2H, 1);
    pthread_t t;
    struct finisher w = {50000};
    assert_int_equal(pthread_create(&t, NULL, finish_later, &w), 0);
    copy(x, SH_D2H, 1); /* returns once the finisher ran */
    const struct fake *f = snapshot();
    assert_int_equal(f->nfinished[SH_D2H], 2);
    assert_int_equal(f->inflight[SH_D2H], 1);
    pthread_join(t, NULL);
    assert_int_equal(xstats(x).inline_finalized[SH_D2H], 1);
    w.after_us = 1000;
    assert_int_equal(pthread_create(&t, NULL, finish_later, &w), 0);
    sh_xfer_destroy(x); /* waits for the copy still in flight */
    pthread_join(t, NULL);
    all_settled();
}

/* ---- many submitters ---------------------------------------------------------------- */

struct submitter {
    struct sh_xfer *x;
    int id, errors;
};

static void *submit_main(void *arg)
{
    struct submitter *s = arg;
    for (int i = 0; i < 400; i++) {
        int dir = (i + s->id) % 3 == 0 ? SH_H2D : SH_D2H;
        s->errors += sh_xfer_copy(s->x, dir, 0x1000, 0x2000, 64) != 0;
        if (i % 50 == 49)
            s->errors += sh_xfer_flush(s->x, dir) != 0;
        if (i % 7 == 0)
            sh_xfer_poll(s->x);
    }
    return NULL;
}

static void test_threads_never_exceed_cap(void **state)
{
    (void)state;
    start_device(20);
    struct sh_xfer *x = mk(3, 2);
    pthread_t t[4];
    struct submitter s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (struct submitter){.x = x, .id = i};
        assert_int_equal(pthread_create(&t[i], NULL, submit_main, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(s[i].errors, 0);
    }
    assert_int_equal(sh_xfer_flush(x, SH_D2H), 0);
    assert_int_equal(sh_xfer_flush(x, SH_H2D), 0);
    struct sh_xfer_stats st = xstats(x);
    assert_int_equal(st.copies[SH_D2H] + st.copies[SH_H2D], 1600);
    assert_int_equal(st.max_inflight_seen[SH_D2H], 3);
    assert_int_equal(st.max_inflight_seen[SH_H2D], 2);
    const struct fake *f = snapshot();
    assert_int_equal(f->peak[SH_D2H], 3);
    assert_int_equal(f->peak[SH_H2D], 2);
    for (int d = 0; d < 2; d++)
        for (unsigned i = 0; i < f->nfinished[d]; i++)
            assert_int_equal(f->finished[d][i], f->issued[d][i]);
    all_settled();
    sh_xfer_destroy(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap_and_inline_finalize, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap_clamped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flush_waits_for_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_within_direction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_poll, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inline_finalize_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_never_exceed_cap, setup, teardown),
    };
    return cmocka_run_group_tests_name("xfer", tests, NULL, NULL);
}
