/* test_e2e_node.c — two processes sharing one node-wide host budget
 * ([budget] host_ram_scope = node) on the simulated GPU.
 *
 * Each rank is this program again, under the library, with a 64 MB device
 * budget on its own simulated card and the same 64 MB node host budget
 * (16 MB slabs, none pre-pinned). A rank fills regions until an allocation
 * fails, reports its figures (key=value lines on stdout), then waits for a
 * word on stdin; told to go on, it fills again, checks every byte of every
 * region and reports again.
 *
 *   1. rank A fills up: it pins the whole node budget;
 *   2. rank B fills up beside it: the node refuses it host memory, so the
 *      two never pin more than the budget together, and its failed
 *      allocation says why, naming the node;
 *   3. A is SIGKILLed and reaped; B goes on: A's share comes back to it,
 *      its evictions succeed again, and nothing it held was lost.
 *
 * With the default scope (auto) two ranks share the budget the same way
 * when a launcher's variable says the job runs several (LOCAL_WORLD_SIZE),
 * and two lone processes keep a budget each.
 *
 * The parent steps the ranks with pipes and waitpid. Under
 * STAGEHAND_DISABLE=1 there is no library and nothing to share: skipped.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "reexec.h"
#include "simcuda.h"
#include "stagehand.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define REGION_MB 16
#define REGION    ((size_t)REGION_MB << 20)
#define WORDS     (REGION / 4)
#define MAXREG    32
#define NODE_MB   64

static int preloaded;
static char **saved_argv;
static const dim3 one = {1, 1, 1};

/* ---- a rank ------------------------------------------------------------------------ */

static uint32_t expect(uint32_t seed, size_t i)
{
    return seed * 2654435761u + (uint32_t)i;
}

static void k_fill(void **a) /* (uint32_t *p, size_t n, uint32_t seed) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t seed = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = expect(seed, i);
}

static void *r[MAXREG];
static int nreg;

/* Allocates and fills regions until an allocation fails. */
static int fill_up(void)
{
    for (; nreg < MAXREG; nreg++) {
        if (cudaMalloc(&r[nreg], REGION) != cudaSuccess)
            break;
        size_t n = WORDS;
        uint32_t seed = (uint32_t)nreg + 1;
        void *args[] = {&r[nreg], &n, &seed};
        if (cudaLaunchKernel((const void *)k_fill, one, one, args, 0, NULL) != cudaSuccess)
            return -1;
    }
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

static size_t wrong_words(void)
{
    static uint32_t h[WORDS];
    size_t bad = 0;
    for (int k = 0; k < nreg; k++) {
        if (cudaMemcpy(h, r[k], REGION, cudaMemcpyDeviceToHost) != cudaSuccess)
            return SIZE_MAX;
        for (size_t i = 0; i < WORDS; i++)
            bad += h[i] != expect((uint32_t)k + 1, i);
    }
    return bad;
}

static void report(const char *phase)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    stagehand_stats_t st;
    memset(&st, 0, sizeof st);
    if (get)
        get(&st, sizeof st);
    printf("%s_allocated=%d\n%s_evictions=%llu\n%s_pinned_mb=%llu\n%s_node_budget_mb=%llu\n"
           "%s_node_used_mb=%llu\n%s_node_ranks=%llu\n",
           phase, nreg, phase, (unsigned long long)st.evictions, phase,
           (unsigned long long)(st.pinned_bytes >> 20), phase,
           (unsigned long long)(st.node_budget_bytes >> 20), phase,
           (unsigned long long)(st.node_used_bytes >> 20), phase,
           (unsigned long long)st.node_ranks);
}

static int rank_main(void)
{
    size_t sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    if (simcuda_register_kernel(k_fill, "fill", 3, sizes, 0) != 0 || fill_up() != 0)
        return 2;
    report("first");
    printf("ready\n");
    char c;
    if (read(STDIN_FILENO, &c, 1) != 1)
        return 0; /* the parent is done with this rank */
    if (fill_up() != 0)
        return 3;
    report("second");
    printf("bad=%zu\nready\n", wrong_words());
    return 0;
}

/* ---- the parent ---------------------------------------------------------------------- */

struct rank {
    pid_t pid;
    int in;    /* its stdin */
    FILE *out; /* its stdout */
    int errfd; /* its stderr */
    char text[8192];
};

static char segname[64];

/* Starts a rank with one more variable set: the scope, or a launcher's
 * rank count ("" for none). The launchers' variables the parent may have
 * are cleared, so that only this one decides an auto scope. */
static void start_rank(struct rank *k, const char *scope)
{
    int in[2], out[2], er[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    assert_int_equal(pipe(er), 0);
    fflush(stdout);
    fflush(stderr);
    k->pid = fork();
    assert_true(k->pid >= 0);
    if (k->pid == 0) {
        dup2(in[0], STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        dup2(er[1], STDERR_FILENO);
        for (int fd = 3; fd < 64; fd++)
            close(fd);
        char seg[128];
        snprintf(seg, sizeof seg, "STAGEHAND_BUDGET_HOST_RAM_SEGMENT=%s", segname);
        static const char *const env[] = {"SIMCUDA_VRAM_MB=128",
                                          "STAGEHAND_BUDGET_VRAM_BUDGET_MB=64",
                                          "STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB=80%",
                                          "STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB=60%",
                                          "STAGEHAND_BUDGET_HOST_RAM_BUDGET_MB=64",
                                          "STAGEHAND_POOL_PINNED_POOL_CLASSES_MB=16",
                                          "STAGEHAND_POOL_SLABS_PER_CLASS=1",
                                          "STAGEHAND_POOL_PREPIN_MB=0",
                                          "STAGEHAND_REGIONS_MAX_CHUNK_MB=16",
                                          "STAGEHAND_TELEMETRY_SHM_ENABLED=false",
                                          "E2E_NODE_RANK=1",
                                          NULL};
        static const char *const launchers[] = {
            "STAGEHAND_BUDGET_HOST_RAM_SCOPE", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE",      "MPI_LOCALNRANKS",  "SLURM_NTASKS"};
        for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++)
            unsetenv(launchers[i]);
        for (const char *const *e = env; *e; e++)
            putenv((char *)*e);
        putenv(seg);
        if (*scope)
            putenv((char *)scope);
        e2e_reexec(saved_argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(er[1]);
    k->in = in[1];
    k->out = fdopen(out[0], "r");
    k->errfd = er[0];
    assert_non_null(k->out);
    k->text[0] = '\0';
}

/* Reads the rank's stdout up to its next "ready" line, keeping what it said. */
static void wait_ready(struct rank *k)
{
    char line[256];
    while (fgets(line, sizeof line, k->out)) {
        if (strcmp(line, "ready\n") == 0)
            return;
        strncat(k->text, line, sizeof k->text - strlen(k->text) - 1);
    }
    fail_msg("rank %d ended before it was ready; it said:\n%s", (int)k->pid, k->text);
}

static long value(const struct rank *k, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = k->text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, key, kl) == 0 && p[kl] == '=')
            return strtol(p + kl + 1, NULL, 10);
    return -1;
}

/* Everything left on the rank's stderr (it has exited). */
static void read_err(const struct rank *k, char *buf, size_t len)
{
    size_t n = 0;
    ssize_t got;
    while (n < len - 1 && (got = read(k->errfd, buf + n, len - 1 - n)) > 0)
        n += (size_t)got;
    buf[n] = '\0';
}

static void end_rank(struct rank *k)
{
    close(k->in);
    fclose(k->out);
    close(k->errfd);
}

static void test_two_ranks_share_node_budget(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    snprintf(segname, sizeof segname, "stagehand-e2e-node.%d", (int)getpid());
    static struct rank a, b;
    start_rank(&a, "STAGEHAND_BUDGET_HOST_RAM_SCOPE=node");
    wait_ready(&a);
    /* Alone, A pins the whole node budget before its allocations fail. */
    assert_int_equal(value(&a, "first_node_budget_mb"), NODE_MB);
    assert_int_equal(value(&a, "first_pinned_mb"), NODE_MB);
    assert_int_equal(value(&a, "first_node_ranks"), 1);
    assert_true(value(&a, "first_evictions") > 0);
    start_rank(&b, "STAGEHAND_BUDGET_HOST_RAM_SCOPE=node");
    wait_ready(&b);
    /* Beside it, B is refused host memory: together they stay within it. */
    long pa = value(&a, "first_pinned_mb"), pb = value(&b, "first_pinned_mb");
    assert_true(pa >= 0 && pb >= 0);
    assert_true(pa + pb <= NODE_MB);
    assert_int_equal(pb, 0);
    assert_int_equal(value(&b, "first_node_ranks"), 2);
    assert_int_equal(value(&b, "first_node_used_mb"), NODE_MB);
    long nb = value(&b, "first_allocated");
    assert_true(nb * REGION_MB <= 64); /* its device budget, no more */
    /* A dies without a word; once it is reaped, B goes on. */
    int status;
    assert_int_equal(kill(a.pid, SIGKILL), 0);
    assert_int_equal(waitpid(a.pid, &status, 0), a.pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(write(b.in, "g", 1), 1);
    wait_ready(&b);
    close(b.in);
    b.in = -1;
    assert_int_equal(waitpid(b.pid, &status, 0), b.pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* A's share came back to B: it evicted into it, and lost nothing. */
    assert_int_equal(value(&b, "second_pinned_mb"), NODE_MB);
    assert_int_equal(value(&b, "second_node_ranks"), 1);
    assert_int_equal(value(&b, "second_node_used_mb"), NODE_MB);
    /* less one region: its first eviction allocated the fingerprints'
     * 64 KB, which count against its device budget */
    assert_true(value(&b, "second_allocated") >= nb + NODE_MB / REGION_MB - 1);
    assert_true(value(&b, "second_evictions") > 0);
    assert_int_equal(value(&b, "bad"), 0);
    /* B's first failed allocation said why, naming the node's budget. */
    static char berr[1 << 16];
    read_err(&b, berr, sizeof berr);
    const char *oom = strstr(berr, "out of memory");
    assert_non_null(oom);
    assert_non_null(strstr(oom, "node: 64 MB of a 64 MB budget pinned by 2 process(es)"));
    end_rank(&a);
    close(b.errfd);
    fclose(b.out);
}

/* Ends both ranks: A killed, B told to stop (it exits at once). */
static void end_both(struct rank *a, struct rank *b)
{
    int status;
    assert_int_equal(kill(a->pid, SIGKILL), 0);
    assert_int_equal(waitpid(a->pid, &status, 0), a->pid);
    close(b->in);
    assert_int_equal(waitpid(b->pid, &status, 0), b->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    a->in = -1;
    end_rank(a);
    close(b->errfd);
    fclose(b->out);
}

/* The default scope, auto, in a job whose launcher says it runs two ranks
 * (torchrun sets LOCAL_WORLD_SIZE): the ranks share the node budget as if
 * host_ram_scope = node were set. */
static void test_launched_ranks_share_by_default(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    snprintf(segname, sizeof segname, "stagehand-e2e-node.%d", (int)getpid());
    static struct rank a, b;
    start_rank(&a, "LOCAL_WORLD_SIZE=2");
    wait_ready(&a);
    assert_int_equal(value(&a, "first_node_budget_mb"), NODE_MB);
    assert_int_equal(value(&a, "first_pinned_mb"), NODE_MB);
    start_rank(&b, "LOCAL_WORLD_SIZE=2");
    wait_ready(&b);
    assert_int_equal(value(&b, "first_pinned_mb"), 0);
    assert_int_equal(value(&b, "first_node_ranks"), 2);
    assert_int_equal(value(&b, "first_node_used_mb"), NODE_MB);
    end_both(&a, &b);
}

/* The default scope with no launcher's word: each process keeps a budget
 * of its own, and two of them side by side each pin all of it. */
static void test_lone_processes_keep_their_own(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    snprintf(segname, sizeof segname, "stagehand-e2e-node.%d", (int)getpid());
    static struct rank a, b;
    start_rank(&a, "");
    wait_ready(&a);
    start_rank(&b, "LOCAL_WORLD_SIZE=1");
    wait_ready(&b);
    for (int i = 0; i < 2; i++) {
        const struct rank *k = i ? &b : &a;
        assert_int_equal(value(k, "first_node_budget_mb"), 0);
        assert_int_equal(value(k, "first_node_ranks"), 0);
        assert_int_equal(value(k, "first_pinned_mb"), NODE_MB);
    }
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%s", segname);
    assert_int_equal(access(path, F_OK), -1); /* no segment was made */
    end_both(&a, &b);
}

/* The segment goes, whether the test passed or not. */
static int remove_segment(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%s", segname);
    if (segname[0])
        unlink(path);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    if (getenv("E2E_NODE_RANK")) {
        alarm(100); /* a hang ends as a failure, not as a stuck run */
        setvbuf(stdout, NULL, _IOLBF, 0);
        return rank_main();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_two_ranks_share_node_budget, remove_segment),
        cmocka_unit_test_teardown(test_launched_ranks_share_by_default, remove_segment),
        cmocka_unit_test_teardown(test_lone_processes_keep_their_own, remove_segment),
    };
    return cmocka_run_group_tests_name(preloaded ? "e2e_node (preloaded)" : "e2e_node (disabled)",
                                       tests, NULL, NULL);
}
