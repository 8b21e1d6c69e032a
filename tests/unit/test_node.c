/* test_node.c — the node-budget segment (node/): creating and joining it,
 * reserving and releasing, refusals over the budget, the shares of dead
 * processes coming back (gone, zombie, pid reused; never another PID
 * namespace's), a lock whose holder died or hangs, and segments planted by
 * someone else (another owner, a link, a FIFO, open modes, bad magic,
 * another version, a wrong size), each refused with a line naming the path
 * and what is wrong.
 *
 * Every test works in a fresh directory of its own. Other processes are
 * forked children, synchronised with pipes and waitpid.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "node/node_int.h"
#include "sh_err.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MB ((uint64_t)1 << 20)

static char dir[64], seg[128], err[512];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/shnode.XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(seg, sizeof seg, "%s/grp", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static struct sh_node *join(uint64_t budget)
{
    struct sh_node_params p = {.dir = dir, .name = "grp", .budget = budget, .lock_ms = 200};
    struct sh_node *n = NULL;
    err[0] = '\0';
    int rc = sh_node_open(&p, &n, err, sizeof err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, SH_OK);
    return n;
}

/* join() for a forked child: no cmocka assertion may run there, and it
 * must not outlive a parent whose test failed. */
static struct sh_node *child_join(uint64_t budget)
{
    alarm(30);
    struct sh_node_params p = {.dir = dir, .name = "grp", .budget = budget};
    struct sh_node *n = NULL;
    if (sh_node_open(&p, &n, err, sizeof err) != SH_OK)
        _exit(4);
    return n;
}

/* Opening must fail with rc, and err read "<seg>: <what>". */
static void refused(int rc, const char *what)
{
    struct sh_node_params p = {.dir = dir, .name = "grp", .budget = 100 * MB};
    struct sh_node *n = NULL;
    char want[512];
    err[0] = '\0';
    assert_int_equal(sh_node_open(&p, &n, err, sizeof err), rc);
    assert_null(n);
    snprintf(want, sizeof want, "%s: %s", seg, what);
    assert_string_equal(err, want);
}

static struct sh_node_stats stats(struct sh_node *n)
{
    struct sh_node_stats st;
    sh_node_stats(n, &st);
    return st;
}

/* ---- create, join, reserve, release ---------------------------------------- */

static void test_create_join_share(void **state)
{
    (void)state;
    struct sh_node *a = join(100 * MB), *b = join(100 * MB);
    struct stat st;
    assert_int_equal(lstat(seg, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, SH_NODE_HDR_SIZE + SH_NODE_SLOTS * SH_NODE_SLOT_SIZE);
    assert_string_equal(sh_node_path(a), seg);
    assert_int_equal(stats(b).ranks, 2);
    assert_int_not_equal(stats(a).slot, stats(b).slot);
    /* Together they never hold more than the budget. */
    assert_int_equal(sh_node_reserve(a, 60 * MB), SH_OK);
    assert_int_equal(sh_node_reserve(b, 50 * MB), SH_ENOMEM);
    assert_int_equal(sh_node_reserve(b, 40 * MB), SH_OK);
    assert_int_equal(sh_node_reserve(a, 1), SH_ENOMEM);
    struct sh_node_stats sa = stats(a), sb = stats(b);
    assert_int_equal(sa.used, 100 * MB);
    assert_int_equal(sa.share, 60 * MB);
    assert_int_equal(sb.share, 40 * MB);
    assert_int_equal(sa.budget, 100 * MB);
    assert_int_equal(sb.refused, 1);
    assert_int_equal(sa.refused, 1);
    /* What one gives back, the other can take. */
    sh_node_release(a, 60 * MB);
    assert_int_equal(sh_node_reserve(b, 50 * MB), SH_OK);
    assert_int_equal(stats(a).used, 90 * MB);
    /* A process leaving takes its share out of the sum. */
    sh_node_close(b);
    assert_int_equal(stats(a).used, 0);
    assert_int_equal(stats(a).ranks, 1);
    sh_node_close(a);
}

/* The group's first process sets the budget; later ones join it, and the
 * next group's first sets it again. */
static void test_budget_set_by_first(void **state)
{
    (void)state;
    struct sh_node *a = join(100 * MB), *b = join(30 * MB);
    assert_int_equal(stats(b).budget, 100 * MB);
    assert_int_equal(sh_node_reserve(b, 80 * MB), SH_OK);
    sh_node_close(a);
    sh_node_close(b);
    struct sh_node *c = join(30 * MB);
    assert_int_equal(stats(c).budget, 30 * MB);
    assert_int_equal(stats(c).ranks, 1);
    assert_int_equal(sh_node_reserve(c, 31 * MB), SH_ENOMEM);
    sh_node_close(c);
}

static void test_slots_run_out(void **state)
{
    (void)state;
    static struct sh_node *n[SH_NODE_SLOTS];
    for (int i = 0; i < SH_NODE_SLOTS; i++)
        n[i] = join(100 * MB);
    char what[128];
    snprintf(what, sizeof what, "all %d slots are held by live processes", SH_NODE_SLOTS);
    refused(SH_EBUSY, what);
    sh_node_close(n[7]);
    struct sh_node *again = join(100 * MB);
    assert_int_equal(stats(again).slot, 7);
    sh_node_close(again);
    for (int i = 0; i < SH_NODE_SLOTS; i++)
        if (i != 7)
            sh_node_close(n[i]);
}

static void test_names(void **state)
{
    (void)state;
    char buf[SH_NODE_NAME_MAX + 1], want[64], longname[SH_NODE_NAME_MAX + 2];
    const char *why = NULL;
    snprintf(want, sizeof want, "stagehand-node.%u", (unsigned)geteuid());
    assert_int_equal(sh_node_name("auto", buf, sizeof buf, &why), SH_OK);
    assert_string_equal(buf, want);
    assert_int_equal(sh_node_name(NULL, buf, sizeof buf, &why), SH_OK);
    assert_string_equal(buf, want);
    assert_int_equal(sh_node_name("job_7-b.x", buf, sizeof buf, &why), SH_OK);
    assert_string_equal(buf, "job_7-b.x");
    assert_int_equal(sh_node_name("../x", buf, sizeof buf, &why), SH_EINVAL);
    assert_string_equal(why, "must not start with '.'");
    assert_int_equal(sh_node_name("a/b", buf, sizeof buf, &why), SH_EINVAL);
    assert_string_equal(why, "may hold only letters, digits, '.', '_' and '-'");
    memset(longname, 'x', SH_NODE_NAME_MAX + 1);
    longname[SH_NODE_NAME_MAX + 1] = '\0';
    assert_int_equal(sh_node_name(longname, buf, sizeof buf, &why), SH_EINVAL);
    assert_string_equal(why, "too long (at most 200 characters)");
    struct sh_node_params p = {.dir = dir, .name = "a/b", .budget = MB};
    struct sh_node *n = NULL;
    assert_int_equal(sh_node_open(&p, &n, err, sizeof err), SH_EINVAL);
    assert_string_equal(err, "node-budget segment name \"a/b\": may hold only letters, digits, "
                             "'.', '_' and '-'");
}

/* ---- other processes --------------------------------------------------------- */

/* A child that joins, reserves `bytes`, reports on `up` and then waits on
 * `hold` (forever, if never written) or exits when told. */
static pid_t child_holding(uint64_t bytes, int up[2], int hold[2])
{
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(hold), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(hold[1]); /* the parent's end: its exit ends the wait */
        struct sh_node *n = child_join(100 * MB);
        char ok = sh_node_reserve(n, bytes) == SH_OK;
        char c;
        if (write(up[1], &ok, 1) != 1 || read(hold[0], &c, 1) < 0)
            _exit(2);
        _exit(0); /* without giving anything back */
    }
    char ok = 0;
    assert_int_equal(read(up[0], &ok, 1), 1);
    assert_int_equal(ok, 1);
    return pid;
}

static void close_pipes(int a[2], int b[2])
{
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(b[1]);
}

/* SIGKILLed, not yet reaped (a zombie), then reaped: its share comes back
 * to the others as soon as it has exited. */
static void test_killed_share_comes_back(void **state)
{
    (void)state;
    struct sh_node *a = join(100 * MB);
    int up[2], hold[2];
    pid_t pid = child_holding(80 * MB, up, hold);
    assert_int_equal(stats(a).used, 80 * MB);
    assert_int_equal(stats(a).ranks, 2);
    assert_int_equal(sh_node_reserve(a, 30 * MB), SH_ENOMEM); /* it is alive */
    assert_int_equal(kill(pid, SIGKILL), 0);
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0); /* a zombie now */
    assert_int_equal(sh_node_reserve(a, 30 * MB), SH_OK);
    assert_int_equal(stats(a).ranks, 1);
    assert_int_equal(stats(a).used, 30 * MB);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    close_pipes(up, hold);
    sh_node_close(a);
}

/* One that exits without leaving: freed when a newcomer looks for a slot. */
static void test_exited_share_freed_on_join(void **state)
{
    (void)state;
    int up[2], hold[2], status;
    pid_t pid = child_holding(100 * MB, up, hold);
    assert_int_equal(write(hold[1], "x", 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct sh_node *a = join(100 * MB);
    assert_int_equal(stats(a).ranks, 1);
    assert_int_equal(stats(a).used, 0);
    assert_int_equal(sh_node_reserve(a, 100 * MB), SH_OK);
    close_pipes(up, hold);
    sh_node_close(a);
}

/* A slot whose pid now belongs to a later process (here: this one) is
 * reclaimed; one from another PID namespace never is, its pid meaning
 * nothing here. */
static void test_reused_pid_and_other_namespace(void **state)
{
    (void)state;
    struct sh_node *a = join(100 * MB);
    struct sh_node_slot *s = &a->slots[40];
    *s = (struct sh_node_slot){
        .pid = getpid(), .start_ticks = 1, .pidns = a->pidns, .bytes = 70 * MB};
    struct sh_node_slot *o = &a->slots[41];
    *o = (struct sh_node_slot){
        .pid = 999999999, .start_ticks = 5, .pidns = a->pidns + 1, .bytes = 20 * MB};
    assert_int_equal(stats(a).ranks, 3);
    assert_int_equal(sh_node_reserve(a, 50 * MB), SH_OK); /* after freeing slot 40 */
    assert_int_equal(s->pid, 0);
    assert_int_equal(o->pid, 999999999);
    assert_int_equal(stats(a).used, 70 * MB);
    assert_int_equal(sh_node_reserve(a, 31 * MB), SH_ENOMEM);
    assert_int_equal(sh_node_reclaim(a), 0);
    /* Unknown namespaces are judged by pid: a pid that is gone is freed. */
    o->pidns = 0;
    assert_int_equal(sh_node_reclaim(a), 1);
    assert_int_equal(sh_node_reserve(a, 31 * MB), SH_OK);
    sh_node_close(a);
}

/* Many processes reserving at once never take more than the budget
 * together, and take all of it. Each holds its share until all have
 * reported (one that exits gives it to the others). */
static void test_racing_processes(void **state)
{
    (void)state;
    enum { KIDS = 4, UNITS = 200 };
    struct sh_node *a = join(UNITS * MB);
    int go[2], res[2], done[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(res), 0);
    assert_int_equal(pipe(done), 0);
    pid_t kids[KIDS];
    for (int k = 0; k < KIDS; k++) {
        kids[k] = fork();
        assert_true(kids[k] >= 0);
        if (kids[k] == 0) {
            close(go[1]);
            close(done[1]);
            struct sh_node *n = child_join(UNITS * MB);
            char c;
            int got = 0;
            if (read(go[0], &c, 1) != 1)
                _exit(2);
            for (int i = 0; i < UNITS; i++)
                got += sh_node_reserve(n, MB) == SH_OK;
            if (write(res[1], &got, sizeof got) != sizeof got || read(done[0], &c, 1) != 1)
                _exit(3);
            _exit(0);
        }
    }
    char start[KIDS];
    memset(start, 'g', sizeof start);
    assert_int_equal(write(go[1], start, sizeof start), KIDS);
    int total = 0;
    for (int k = 0; k < KIDS; k++) {
        int got = 0;
        assert_int_equal(read(res[0], &got, sizeof got), sizeof got);
        total += got;
    }
    assert_int_equal(stats(a).used, UNITS * MB);
    assert_int_equal(write(done[1], start, sizeof start), KIDS);
    for (int k = 0; k < KIDS; k++) {
        int status;
        assert_int_equal(waitpid(kids[k], &status, 0), kids[k]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    assert_int_equal(total, UNITS);
    close_pipes(go, res);
    close(done[0]);
    close(done[1]);
    sh_node_close(a);
}

/* ---- the lock ----------------------------------------------------------------- */

/* A child takes the segment's lock, reports, and then dies (holding it) or
 * waits for the word to let go. */
static pid_t child_locking(int die, int up[2], int hold[2])
{
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(hold), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(hold[1]);
        struct sh_node *n = child_join(100 * MB);
        char c = pthread_mutex_lock(&n->hdr->lock.mu) == 0;
        if (write(up[1], &c, 1) != 1)
            _exit(2);
        if (die)
            _exit(0);
        if (read(hold[0], &c, 1) < 0)
            _exit(2);
        pthread_mutex_unlock(&n->hdr->lock.mu);
        _exit(0);
    }
    char ok = 0;
    assert_int_equal(read(up[0], &ok, 1), 1);
    assert_int_equal(ok, 1);
    return pid;
}

static void test_lock_holder_died(void **state)
{
    (void)state;
    struct sh_node *a = join(100 * MB);
    int up[2], hold[2], status;
    pid_t pid = child_locking(1, up, hold);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(sh_node_reserve(a, 10 * MB), SH_OK); /* EOWNERDEAD, made consistent */
    assert_int_equal(sh_node_reserve(a, 10 * MB), SH_OK);
    assert_int_equal(stats(a).used, 20 * MB);
    close_pipes(up, hold);
    sh_node_close(a);
}

static void test_lock_held_too_long(void **state)
{
    (void)state;
    struct sh_node *a = join(100 * MB); /* lock_ms 200 */
    int up[2], hold[2], status;
    pid_t pid = child_locking(0, up, hold);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(sh_node_reserve(a, MB), SH_EBUSY);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(ms >= 150 && ms < 5000);
    assert_int_equal(stats(a).used, 0);
    /* Released is never blocked: it needs no lock. */
    assert_int_equal(write(hold[1], "x", 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(sh_node_reserve(a, MB), SH_OK);
    close_pipes(up, hold);
    sh_node_close(a);
}

/* ---- planted and broken segments ------------------------------------------------ */

static void make_valid(void)
{
    sh_node_close(join(100 * MB));
}

static void test_refuses_symlink(void **state)
{
    (void)state;
    char target[160];
    snprintf(target, sizeof target, "%s/elsewhere", dir);
    assert_int_equal(symlink(target, seg), 0);
    refused(SH_EINVAL, "is a symbolic link; not following it");
    struct stat st;
    assert_int_equal(stat(target, &st), -1); /* nothing was created through it */
    /* Even to a good segment. */
    assert_int_equal(unlink(seg), 0);
    make_valid();
    assert_int_equal(rename(seg, target), 0);
    assert_int_equal(symlink(target, seg), 0);
    refused(SH_EINVAL, "is a symbolic link; not following it");
}

static void test_refuses_fifo(void **state)
{
    (void)state;
    assert_int_equal(mkfifo(seg, 0600), 0);
    refused(SH_EINVAL, "not a regular file"); /* and did not block */
}

static void test_refuses_open_mode(void **state)
{
    (void)state;
    make_valid();
    assert_int_equal(chmod(seg, 0620), 0);
    refused(SH_EINVAL, "writable by group or others (mode 0620)");
    assert_int_equal(chmod(seg, 0602), 0);
    refused(SH_EINVAL, "writable by group or others (mode 0602)");
    assert_int_equal(chmod(seg, 0640), 0); /* readable is fine */
    sh_node_close(join(100 * MB));
}

static void test_refuses_other_owner(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* only root can give a file away */
    make_valid();
    assert_int_equal(chown(seg, 65534, 65534), 0);
    char what[128];
    snprintf(what, sizeof what, "owned by uid 65534, not this user (uid %u)", (unsigned)geteuid());
    refused(SH_EINVAL, what);
}

static void poke(off_t off, const void *v, size_t n)
{
    int fd = open(seg, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, v, n, off), (ssize_t)n);
    close(fd);
}

static void test_refuses_bad_contents(void **state)
{
    (void)state;
    make_valid();
    poke(0, "NOTASEG!", 8);
    refused(SH_EINVAL, "not a stagehand node-budget segment (bad magic)");
    poke(0, SH_NODE_MAGIC, 8);
    uint16_t v[2] = {2, 5};
    poke(offsetof(struct sh_node_hdr, major), v, sizeof v);
    refused(SH_EINVAL, "segment version 2.5; this library uses 1.x");
    v[0] = SH_NODE_MAJOR;
    poke(offsetof(struct sh_node_hdr, major), v, sizeof v);
    uint32_t big = 5000;
    poke(offsetof(struct sh_node_hdr, nslots), &big, sizeof big);
    refused(SH_EINVAL, "truncated or corrupt: 5000 slots, header says 4352 bytes, file has 4352");
    big = SH_NODE_SLOTS;
    poke(offsetof(struct sh_node_hdr, nslots), &big, sizeof big);
    uint64_t zero = 0;
    poke(offsetof(struct sh_node_hdr, budget), &zero, sizeof zero);
    refused(SH_EINVAL, "corrupt: a node budget of 0");
    assert_int_equal(truncate(seg, 1000), 0);
    refused(SH_EINVAL, "truncated or corrupt: 64 slots, header says 4352 bytes, file has 1000");
    assert_int_equal(truncate(seg, 100), 0);
    refused(SH_EINVAL, "truncated: 100 bytes, a header alone is 256");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_join_share, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_set_by_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slots_run_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_share_comes_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exited_share_freed_on_join, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reused_pid_and_other_namespace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_racing_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_holder_died, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_held_too_long, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_symlink, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_open_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_other_owner, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_bad_contents, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
