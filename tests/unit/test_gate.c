/* test_gate.c — the remap gate: the read side nests per thread, a writer
 * holding the read side is refused instead of deadlocking, readers wait out
 * a window, no reader section ever overlaps a window, a continuous
 * stream of readers does not starve a writer, and gates taken as sets
 * hold back only their own windows, without deadlock. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sh_clock.h"
#include "sh_err.h"
#include "transfer/transfer.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static struct sh_gate *mk(void)
{
    struct sh_gate *g = NULL;
    assert_int_equal(sh_gate_create(&g), 0);
    assert_non_null(g);
    return g;
}

/* ---- a helper thread that tries one side of the gate ---- */

struct trier {
    struct sh_gate *g;
    struct sh_gate *set[2]; /* nset > 0: enters these as one set instead */
    unsigned nset;
    int write;          /* lock instead of enter */
    atomic_int inside;  /* 1 once through */
    atomic_int release; /* set by the test: leave/unlock now */
    int lock_rc, held_in;
    pthread_t t;
};

static void *trier_main(void *arg)
{
    struct trier *w = arg;
    if (w->write) {
        w->lock_rc = sh_gate_lock(w->g);
    } else if (w->nset) {
        sh_gate_enter_set(w->set, w->nset);
        w->held_in = sh_gate_held(w->set[0]) && sh_gate_held(w->set[w->nset - 1]);
    } else {
        sh_gate_enter(w->g);
        w->held_in = sh_gate_held(w->g);
    }
    atomic_store(&w->inside, 1);
    while (!atomic_load(&w->release))
        usleep(200);
    if (w->write)
        sh_gate_unlock(w->g);
    else if (w->nset)
        sh_gate_leave_set();
    else
        sh_gate_leave(w->g);
    return NULL;
}

static void trier_start(struct trier *w, struct sh_gate *g, int write)
{
    memset(w, 0, sizeof *w);
    w->g = g;
    w->write = write;
    assert_int_equal(pthread_create(&w->t, NULL, trier_main, w), 0);
}

/* A trier entering a and b as one set. */
static void trier_start_set(struct trier *w, struct sh_gate *a, struct sh_gate *b)
{
    memset(w, 0, sizeof *w);
    w->set[0] = a;
    w->set[1] = b;
    w->nset = 2;
    assert_int_equal(pthread_create(&w->t, NULL, trier_main, w), 0);
}

/* 1 if the trier got through within ms. */
static int trier_through(struct trier *w, double ms)
{
    double t0 = now_ms();
    while (!atomic_load(&w->inside) && now_ms() - t0 < ms)
        usleep(200);
    return atomic_load(&w->inside);
}

static void trier_finish(struct trier *w)
{
    atomic_store(&w->release, 1);
    pthread_join(w->t, NULL);
}

/* ---- tests ---------------------------------------------------------------------- */

static void test_nesting(void **state)
{
    (void)state;
    struct sh_gate *g = mk();
    assert_false(sh_gate_held(g));
    sh_gate_enter(g);
    assert_true(sh_gate_held(g));
    sh_gate_enter(g);
    sh_gate_enter(g);
    sh_gate_leave(g);
    sh_gate_leave(g);
    assert_true(sh_gate_held(g)); /* one level still held */
    /* A writer cannot get in while the outermost level is held. */
    struct trier w;
    trier_start(&w, g, 1);
    assert_false(trier_through(&w, 50));
    sh_gate_leave(g);
    assert_false(sh_gate_held(g));
    assert_true(trier_through(&w, 2000));
    assert_int_equal(w.lock_rc, 0);
    trier_finish(&w);
    assert_int_equal(sh_gate_windows(g), 1);
    /* An unmatched leave is harmless. */
    sh_gate_leave(g);
    assert_false(sh_gate_held(g));
    assert_int_equal(sh_gate_lock(g), 0);
    sh_gate_unlock(g);
    assert_int_equal(sh_gate_windows(g), 2);
    sh_gate_destroy(g);
    sh_gate_destroy(NULL);
}

/* A window's time open is counted from its lock to its unlock, and
 * windows add up (the figure behind window_us in the stats). */
static void test_open_time(void **state)
{
    (void)state;
    struct sh_gate *g;
    assert_int_equal(sh_gate_create(&g), 0);
    assert_int_equal(sh_gate_open_us(g), 0);
    uint64_t spans[2];
    for (int i = 0; i < 2; i++) {
        uint64_t before = sh_clock_us();
        assert_int_equal(sh_gate_lock(g), 0);
        uint64_t opened = sh_clock_us();
        while (sh_clock_us() < opened + 2000) /* 2 ms of work in the window */
            ;
        sh_gate_unlock(g);
        spans[i] = sh_clock_us() - before; /* an upper bound of the window */
        /* Time outside a window counts for nothing. */
        while (sh_clock_us() < before + spans[i] + 2000)
            ;
    }
    uint64_t open = sh_gate_open_us(g);
    assert_true(open >= 2 * 2000 - 2); /* each at least 2 ms, less rounding */
    assert_true(open <= spans[0] + spans[1]);
    sh_gate_destroy(g);
}

static void test_held_is_per_thread_and_gate(void **state)
{
    (void)state;
    struct sh_gate *g = mk(), *h = mk();
    struct trier r;
    trier_start(&r, g, 0);
    assert_true(trier_through(&r, 2000));
    assert_true(r.held_in);
    assert_false(sh_gate_held(g)); /* another thread holds it, not this one */
    sh_gate_enter(g);              /* readers share the gate */
    assert_true(sh_gate_held(g));
    assert_false(sh_gate_held(h));
    sh_gate_leave(g);
    trier_finish(&r);
    sh_gate_destroy(g);
    sh_gate_destroy(h);
}

static void test_lock_while_reading_is_refused(void **state)
{
    (void)state;
    struct sh_gate *g = mk();
    sh_gate_enter(g);
    sh_gate_enter(g);
    double t0 = now_ms();
    assert_int_equal(sh_gate_lock(g), SH_EBUSY);
    assert_true(now_ms() - t0 < 500); /* refused, not deadlocked */
    assert_int_equal(sh_gate_windows(g), 0);
    sh_gate_leave(g);
    assert_int_equal(sh_gate_lock(g), SH_EBUSY);
    sh_gate_leave(g);
    assert_int_equal(sh_gate_lock(g), 0);
    assert_int_equal(sh_gate_windows(g), 1);
    sh_gate_unlock(g);
    sh_gate_destroy(g);
}

static void test_reader_waits_for_window(void **state)
{
    (void)state;
    struct sh_gate *g = mk();
    assert_int_equal(sh_gate_lock(g), 0);
    struct trier r[3];
    for (int i = 0; i < 3; i++)
        trier_start(&r[i], g, 0);
    usleep(50000);
    for (int i = 0; i < 3; i++)
        assert_false(atomic_load(&r[i].inside));
    sh_gate_unlock(g);
    for (int i = 0; i < 3; i++)
        assert_true(trier_through(&r[i], 2000));
    /* And a writer waits for the readers to leave. */
    struct trier w;
    trier_start(&w, g, 1);
    assert_false(trier_through(&w, 50));
    for (int i = 0; i < 3; i++)
        trier_finish(&r[i]);
    assert_true(trier_through(&w, 2000));
    trier_finish(&w);
    assert_int_equal(sh_gate_windows(g), 2);
    sh_gate_destroy(g);
}

/* A thread inside the read side enters again while a writer is queued:
 * the nested enter must not queue behind the writer (it would deadlock). */
struct nester {
    struct sh_gate *g;
    atomic_int stage;
    atomic_int go;
};

static void *nester_main(void *arg)
{
    struct nester *n = arg;
    sh_gate_enter(n->g);
    atomic_store(&n->stage, 1);
    while (!atomic_load(&n->go))
        usleep(200);
    sh_gate_enter(n->g); /* a writer is waiting now */
    atomic_store(&n->stage, 2);
    sh_gate_leave(n->g);
    sh_gate_leave(n->g);
    atomic_store(&n->stage, 3);
    return NULL;
}

static void test_nested_enter_with_writer_waiting(void **state)
{
    (void)state;
    struct sh_gate *g = mk();
    struct nester n = {.g = g};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, nester_main, &n), 0);
    while (atomic_load(&n.stage) < 1)
        usleep(200);
    struct trier w;
    trier_start(&w, g, 1);
    assert_false(trier_through(&w, 30)); /* queued behind the reader */
    atomic_store(&n.go, 1);
    double t0 = now_ms();
    while (atomic_load(&n.stage) < 3 && now_ms() - t0 < 2000)
        usleep(200);
    assert_int_equal(atomic_load(&n.stage), 3);
    assert_true(trier_through(&w, 2000));
    trier_finish(&w);
    pthread_join(t, NULL);
    sh_gate_destroy(g);
}

/* ---- no launch inside a remap window ------------------------------------------------ */

#define LAUNCHERS   3
#define SECTIONS    3000 /* per launcher */
#define WINDOWS     300
#define MAX_RECORDS (LAUNCHERS * SECTIONS)

struct interval {
    uint64_t a, b;
};

static struct {
    struct sh_gate *g;
    atomic_ullong seq;    /* one clock for every event */
    atomic_int in_window; /* a writer is between lock and unlock */
    atomic_int launching; /* readers between enter and leave */
    atomic_int seen_window, seen_launch;
    atomic_int stop;
    atomic_ullong max_start;                 /* latest start of a finished section */
    atomic_int windows_done, launchers_done; /* so windows fall between sections */
    struct interval sections[LAUNCHERS][SECTIONS];
    struct interval windows[WINDOWS];
    int nsections[LAUNCHERS];
} ov;

static void *launcher_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    unsigned rng = 99u + (unsigned)id;
    for (int i = 0; i < SECTIONS; i++) {
        while (i == SECTIONS / 2 && atomic_load(&ov.windows_done) == 0)
            sched_yield(); /* the second half comes after a window, however threads run */
        sh_gate_enter(ov.g);
        if (i % 5 == 0)
            sh_gate_enter(ov.g); /* a hooked call inside a hooked call */
        uint64_t a = atomic_fetch_add(&ov.seq, 1);
        atomic_fetch_add(&ov.launching, 1);
        if (atomic_load(&ov.in_window))
            atomic_fetch_add(&ov.seen_window, 1);
        rng = rng * 1103515245u + 12345u;
        for (volatile unsigned k = 0; k < ((rng >> 16) & 255); k++)
            ; /* issuing the launch */
        if (atomic_load(&ov.in_window))
            atomic_fetch_add(&ov.seen_window, 1);
        atomic_fetch_sub(&ov.launching, 1);
        uint64_t b = atomic_fetch_add(&ov.seq, 1);
        if (i % 5 == 0)
            sh_gate_leave(ov.g);
        sh_gate_leave(ov.g);
        ov.sections[id][i] = (struct interval){a, b};
        ov.nsections[id] = i + 1;
        for (uint64_t m = atomic_load(&ov.max_start);
             m < a && !atomic_compare_exchange_weak(&ov.max_start, &m, a);)
            ;
        if ((rng >> 8) % 4 == 0)
            sched_yield();
    }
    atomic_fetch_add(&ov.launchers_done, 1);
    return NULL;
}

static void *remapper_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < WINDOWS; i++) {
        /* A window after the first waits for a section that started after
         * the last one to finish (it lies between the two), unless none will. */
        while (i > 0 && atomic_load(&ov.max_start) < ov.windows[i - 1].b &&
               atomic_load(&ov.launchers_done) < LAUNCHERS)
            sched_yield();
        if (sh_gate_lock(ov.g) != 0)
            continue;
        atomic_store(&ov.in_window, 1);
        uint64_t a = atomic_fetch_add(&ov.seq, 1);
        for (int k = 0; k < 50; k++) /* drain, unmap, map, set access */
            if (atomic_load(&ov.launching))
                atomic_fetch_add(&ov.seen_launch, 1);
        uint64_t b = atomic_fetch_add(&ov.seq, 1);
        atomic_store(&ov.in_window, 0);
        sh_gate_unlock(ov.g);
        ov.windows[i] = (struct interval){a, b};
        atomic_fetch_add(&ov.windows_done, 1);
        usleep(100);
    }
    return NULL;
}

static void test_no_launch_inside_window(void **state)
{
    (void)state;
    memset(&ov, 0, sizeof ov);
    ov.g = mk();
    pthread_t l[LAUNCHERS], w;
    for (int i = 0; i < LAUNCHERS; i++)
        assert_int_equal(pthread_create(&l[i], NULL, launcher_main, (void *)(intptr_t)i), 0);
    assert_int_equal(pthread_create(&w, NULL, remapper_main, NULL), 0);
    for (int i = 0; i < LAUNCHERS; i++)
        pthread_join(l[i], NULL);
    pthread_join(w, NULL);
    assert_int_equal(atomic_load(&ov.seen_window), 0);
    assert_int_equal(atomic_load(&ov.seen_launch), 0);
    assert_int_equal(sh_gate_windows(ov.g), WINDOWS);
    /* On the common clock no section overlaps a window: each lies wholly
     * before or wholly after every window. Windows are in clock order. */
    int interleaved = 0;
    for (int i = 0; i < LAUNCHERS; i++) {
        assert_int_equal(ov.nsections[i], SECTIONS);
        for (int s = 0; s < SECTIONS; s++) {
            struct interval x = ov.sections[i][s];
            assert_true(x.a < x.b);
            int lo = 0, hi = WINDOWS; /* first window that ends after x starts */
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (ov.windows[mid].b < x.a)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo < WINDOWS)
                assert_true(x.b < ov.windows[lo].a);
            interleaved += lo > 0 && lo < WINDOWS;
        }
    }
    for (int i = 1; i < WINDOWS; i++)
        assert_true(ov.windows[i - 1].b < ov.windows[i].a);
    assert_true(interleaved > 0); /* windows really did fall between launches */
    sh_gate_destroy(ov.g);
}

/* ---- gates taken as a set (work that may touch several devices) ---------------------- */

/* A set is held as one: each of its gates until the outermost leave, a
 * nested enter taking nothing more. Holding it refuses every window of
 * this thread's; another thread's window on a gate outside the set goes
 * ahead, one on a gate inside waits for the set to be left. */
static void test_set_held_as_one(void **state)
{
    (void)state;
    struct sh_gate *g = mk(), *h = mk(), *k = mk();
    struct sh_gate *set[] = {g, h};
    assert_false(sh_gate_held_any());
    sh_gate_enter_set(set, 2);
    assert_true(sh_gate_held(g) && sh_gate_held(h) && sh_gate_held_any());
    assert_false(sh_gate_held(k));
    sh_gate_enter(k); /* nested: the outermost enter's set stays the one held */
    assert_false(sh_gate_held(k));
    assert_int_equal(sh_gate_lock(k), SH_EBUSY); /* a window under any read side would deadlock */
    sh_gate_leave(k);
    assert_true(sh_gate_held(g) && sh_gate_held(h));
    struct trier other, inside;
    trier_start(&other, k, 1);
    assert_true(trier_through(&other, 2000));
    assert_int_equal(other.lock_rc, 0);
    trier_finish(&other);
    trier_start(&inside, h, 1);
    assert_false(trier_through(&inside, 50));
    sh_gate_leave_set();
    assert_false(sh_gate_held_any());
    assert_true(trier_through(&inside, 2000));
    assert_int_equal(inside.lock_rc, 0);
    trier_finish(&inside);
    sh_gate_enter_set(set, 0); /* an empty set: counts, holds nothing */
    assert_true(sh_gate_held_any());
    assert_false(sh_gate_held(g));
    sh_gate_leave_set();
    assert_false(sh_gate_held_any());
    sh_gate_destroy(g);
    sh_gate_destroy(h);
    sh_gate_destroy(k);
}

/* A window on one gate holds back the readers of sets that hold it, and
 * only those. */
static void test_window_holds_back_its_sets(void **state)
{
    (void)state;
    struct sh_gate *g = mk(), *h = mk();
    assert_int_equal(sh_gate_lock(g), 0);
    struct trier alone, both;
    trier_start(&alone, h, 0);
    trier_start_set(&both, g, h);
    assert_true(trier_through(&alone, 2000));
    assert_false(trier_through(&both, 50));
    sh_gate_unlock(g);
    assert_true(trier_through(&both, 2000));
    assert_true(both.held_in);
    trier_finish(&alone);
    trier_finish(&both);
    sh_gate_destroy(g);
    sh_gate_destroy(h);
}

/* Readers take random sets of three gates (in one order, nesting a single
 * gate under them) while writers lock random gates: every thread finishes.
 * A cycle of waits would hang it, which the deadline catches. */
#define SET_GATES 3
static struct {
    struct sh_gate *g[SET_GATES];
    atomic_int finished;
} mix;

static void *mix_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg, writer = seed & 1;
    for (int i = 0; i < 2000; i++) {
        unsigned pick = (unsigned)rand_r(&seed);
        if (writer) {
            struct sh_gate *g = mix.g[pick % SET_GATES];
            assert_int_equal(sh_gate_lock(g), 0);
            sh_gate_unlock(g);
            continue;
        }
        struct sh_gate *set[SET_GATES];
        unsigned n = 0;
        for (unsigned k = 0; k < SET_GATES; k++)
            if (pick >> k & 1)
                set[n++] = mix.g[k];
        sh_gate_enter_set(set, n);
        sh_gate_enter(mix.g[pick % SET_GATES]);
        sh_gate_leave(mix.g[pick % SET_GATES]);
        sh_gate_leave_set();
    }
    atomic_fetch_add(&mix.finished, 1);
    return NULL;
}

static void test_sets_never_deadlock(void **state)
{
    (void)state;
    memset(&mix, 0, sizeof mix);
    for (int k = 0; k < SET_GATES; k++)
        mix.g[k] = mk();
    pthread_t t[6];
    for (uintptr_t i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&t[i], NULL, mix_thread, (void *)(i + 1)), 0);
    double t0 = now_ms();
    while (atomic_load(&mix.finished) < 6 && now_ms() - t0 < 60000)
        usleep(1000);
    assert_int_equal(atomic_load(&mix.finished), 6); /* else a thread is stuck: do not join */
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    for (int k = 0; k < SET_GATES; k++)
        sh_gate_destroy(mix.g[k]);
}

/* ---- writers are not starved ----------------------------------------------------------- */

static struct {
    struct sh_gate *g;
    atomic_int stop, writer_done;
    atomic_ullong sections;
    double worst;
    int windows;
} st;

static void *busy_reader(void *arg)
{
    (void)arg;
    while (!atomic_load(&st.stop)) {
        sh_gate_enter(st.g);
        usleep(300); /* readers overlap: the read side is never free on its own */
        sh_gate_leave(st.g);
        atomic_fetch_add(&st.sections, 1);
    }
    return NULL;
}

static void *writer_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < 40; i++) {
        double t0 = now_ms();
        if (sh_gate_lock(st.g) != 0)
            break;
        double took = now_ms() - t0;
        sh_gate_unlock(st.g);
        st.windows++;
        if (took > st.worst)
            st.worst = took;
        usleep(2000);
    }
    atomic_store(&st.writer_done, 1);
    return NULL;
}

static void test_writer_not_starved(void **state)
{
    (void)state;
    memset(&st, 0, sizeof st);
    st.g = mk();
    pthread_t r[4], w;
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&r[i], NULL, busy_reader, NULL), 0);
    while (atomic_load(&st.sections) < 20)
        usleep(500);
    assert_int_equal(pthread_create(&w, NULL, writer_main, NULL), 0);
    double t0 = now_ms();
    while (!atomic_load(&st.writer_done) && now_ms() - t0 < 5000)
        usleep(1000);
    uint64_t before = atomic_load(&st.sections);
    usleep(20000);
    uint64_t after = atomic_load(&st.sections);
    /* Stopping the readers frees a starved writer, so the test ends either way. */
    atomic_store(&st.stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(r[i], NULL);
    pthread_join(w, NULL);
    assert_true(after > before); /* readers went on, too */
    assert_int_equal(st.windows, 40);
    /* A reader section is 0.3 ms: a writer waits for those in progress only. */
    assert_true(st.worst < 250);
    assert_true(now_ms() - t0 < 5000);
    assert_int_equal(sh_gate_windows(st.g), 40);
    sh_gate_destroy(st.g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nesting),
        cmocka_unit_test(test_open_time),
        cmocka_unit_test(test_held_is_per_thread_and_gate),
        cmocka_unit_test(test_lock_while_reading_is_refused),
        cmocka_unit_test(test_reader_waits_for_window),
        cmocka_unit_test(test_nested_enter_with_writer_waiting),
        cmocka_unit_test(test_no_launch_inside_window),
        cmocka_unit_test(test_writer_not_starved),
        cmocka_unit_test(test_set_held_as_one),
        cmocka_unit_test(test_window_holds_back_its_sets),
        cmocka_unit_test(test_sets_never_deadlock),
    };
    return cmocka_run_group_tests_name("gate", tests, NULL, NULL);
}
