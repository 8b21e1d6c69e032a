/* test_e2e_limits.c — where eviction stops, and the debug checksums.
 *
 * Each scenario runs in a child: this program again, started with its own
 * environment (the library reads its configuration at load) and a mode
 * variable. The child reports figures on stdout as key=value lines and
 * marks each CUDA call of interest on stderr ("e2e: ..."), so the parent can
 * tell which call each "stagehand:" line belongs to.
 *
 *   exhausted  device and host budgets both spent: the next allocation gets
 *              cudaErrorMemoryAllocation and one stderr line saying why
 *   nohostvmm  the driver cannot map host memory for the device: eviction
 *              is off (said once), the budget is a hard limit
 *   checksums  debug checksums on an oversubscribed workload: clean while
 *              every launch is seen; a kernel that writes evicted regions
 *              through a pointer table that kernels wrote in device memory
 *              (which the library never reads pointers from; prefetch
 *              off, as a program keeping such pointers may set it) shows
 *              up as a mismatch naming the region, and the results stay
 *              exact
 *
 * The exhausted child runs again on a CUDA 12.0 driver, where the library
 * passes every call through and says why in one line.
 *
 * Under STAGEHAND_DISABLE=1 the same children run on the plain (simulated)
 * card; what only applies to the library is skipped.
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
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REGION_MB 16
#define REGION    ((size_t)REGION_MB << 20)
#define WORDS     (REGION / 4)
#define MAXREG    96

static int preloaded;
static char **saved_argv;
static const dim3 one = {1, 1, 1};

/* ---- kernels ------------------------------------------------------------------------ */

static uint32_t expect(uint32_t seed, size_t i, uint32_t bumps)
{
    return seed * 2654435761u + (uint32_t)i + bumps;
}

static void k_fill(void **a) /* (uint32_t *p, size_t n, uint32_t seed) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    uint32_t seed = *(uint32_t *)a[2];
    for (size_t i = 0; i < n; i++)
        p[i] = expect(seed, i, 0);
}

static void k_bump(void **a) /* (uint32_t *p, size_t n) */
{
    uint32_t *p = *(uint32_t **)a[0];
    size_t n = *(size_t *)a[1];
    for (size_t i = 0; i < n; i++)
        p[i] += 1;
}

/* (uint32_t **table, int count, size_t n): the launch sees only the table. */
static void k_table_bump(void **a)
{
    uint32_t **t = *(uint32_t ***)a[0];
    int count = *(int *)a[1];
    size_t n = *(size_t *)a[2];
    for (int r = 0; r < count; r++)
        for (size_t i = 0; i < n; i++)
            t[r][i] += 1;
}

static void k_table_store(void **a) /* (table, index, pointer) */
{
    void **t = *(void ***)a[0];
    t[*(int *)a[1]] = *(void **)a[2];
}

static int register_kernels(void)
{
    size_t fill_sizes[] = {sizeof(void *), sizeof(size_t), sizeof(uint32_t)};
    size_t store_sizes[] = {sizeof(void *), sizeof(int), sizeof(void *)};
    size_t bump_sizes[] = {sizeof(void *), sizeof(size_t)};
    size_t table_sizes[] = {sizeof(void *), sizeof(int), sizeof(size_t)};
    return simcuda_register_kernel(k_fill, "fill", 3, fill_sizes, 0) ||
           simcuda_register_kernel(k_bump, "bump", 2, bump_sizes, 0) ||
           simcuda_register_kernel(k_table_bump, "table_bump", 3, table_sizes, 0) ||
           simcuda_register_kernel(k_table_store, "table_store", 3, store_sizes, 0);
}

static cudaError_t fill(void *p, uint32_t seed)
{
    size_t n = WORDS;
    void *args[] = {&p, &n, &seed};
    return cudaLaunchKernel((const void *)k_fill, one, one, args, 0, NULL);
}

static cudaError_t bump(void *p)
{
    size_t n = WORDS;
    void *args[] = {&p, &n};
    return cudaLaunchKernel((const void *)k_bump, one, one, args, 0, NULL);
}

/* Words of a region that differ from expect(seed, i, bumps); SIZE_MAX if unreadable. */
static size_t wrong_words(const void *p, uint32_t seed, uint32_t bumps)
{
    static uint32_t h[WORDS];
    if (cudaMemcpy(h, p, REGION, cudaMemcpyDeviceToHost) != cudaSuccess)
        return SIZE_MAX;
    size_t bad = 0;
    for (size_t i = 0; i < WORDS; i++)
        bad += h[i] != expect(seed, i, bumps);
    return bad;
}

static void get_stats(stagehand_stats_t *st)
{
    int (*get)(stagehand_stats_t *, size_t) =
        (int (*)(stagehand_stats_t *, size_t))dlsym(RTLD_DEFAULT, "stagehand_get_stats");
    memset(st, 0, sizeof *st);
    if (get)
        get(st, sizeof *st);
}

/* ---- the children ------------------------------------------------------------------- */

/* Allocates and fills regions until an allocation fails; reports how many
 * and the error, checks every byte of what it got, then shows that memory
 * freed is memory usable again. */
static int child_fill_up(void)
{
    static void *r[MAXREG];
    int n = 0;
    cudaError_t e = cudaSuccess;
    for (; n < MAXREG; n++) {
        fprintf(stderr, "e2e: alloc %d\n", n);
        e = cudaMalloc(&r[n], REGION);
        fprintf(stderr, "e2e: alloc %d done: %d\n", n, (int)e);
        if (e != cudaSuccess)
            break;
        if (fill(r[n], (uint32_t)n + 1) != cudaSuccess)
            return 3;
    }
    printf("allocated=%d\nerror=%d\nfailed_call=%d\n", n, (int)e, n);
    size_t bad = 0;
    for (int i = 0; i < n; i++) {
        if (bump(r[i]) != cudaSuccess)
            return 4;
        bad += wrong_words(r[i], (uint32_t)i + 1, 1);
    }
    if (cudaDeviceSynchronize() != cudaSuccess)
        return 5;
    printf("bad=%zu\n", bad);
    stagehand_stats_t st;
    get_stats(&st);
    printf("active=%llu\nevictions=%llu\noom=%llu\npinned_mb=%llu\nhost_mb=%llu\n",
           (unsigned long long)st.active, (unsigned long long)st.evictions,
           (unsigned long long)st.oom, (unsigned long long)(st.pinned_bytes >> 20),
           (unsigned long long)(st.host_bytes >> 20));
    /* Room comes back with a free. */
    if (n > 1 && e != cudaSuccess) {
        if (cudaFree(r[0]) != cudaSuccess)
            return 6;
        fprintf(stderr, "e2e: realloc\n");
        void *p = NULL;
        cudaError_t again = cudaMalloc(&p, REGION);
        fprintf(stderr, "e2e: realloc done: %d\n", (int)again);
        printf("realloc=%d\n", (int)again);
        r[0] = again == cudaSuccess ? p : NULL;
    }
    for (int i = 0; i < n; i++)
        if (r[i])
            cudaFree(r[i]);
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    printf("faults=%llu\n", sim.faults);
    return 0;
}

static int child_checksums(void)
{
    enum { N = 24 }; /* 384 MB against a 256 MB budget */
    static uint32_t *r[N];
    uint32_t **table;
    if (cudaMalloc((void **)&table, sizeof r) != cudaSuccess)
        return 3;
    for (int i = 0; i < N; i++) {
        void *sargs[] = {&table, &i, &r[i]};
        if (cudaMalloc((void **)&r[i], REGION) != cudaSuccess ||
            fill(r[i], (uint32_t)(100 + i)) != cudaSuccess ||
            cudaLaunchKernel((const void *)k_table_store, one, one, sargs, 0, NULL) != cudaSuccess)
            return 3;
    }
    /* Every launch seen: regions come back exactly as they left. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < N; i++)
            if (bump(r[i]) != cudaSuccess)
                return 4;
    size_t bad = 0;
    for (int i = 0; i < N; i++)
        bad += wrong_words(r[i], (uint32_t)(100 + i), 2);
    stagehand_stats_t st;
    get_stats(&st);
    printf("clean_bad=%zu\nclean_mismatches=%llu\nclean_evictions=%llu\nclean_restores=%llu\n", bad,
           (unsigned long long)st.checksum_mismatches, (unsigned long long)st.evictions,
           (unsigned long long)st.restores);
    fflush(stdout);
    /* The reads just done count as work issued against every region (a
     * copy's direction is not followed): one more pass, so that the ones
     * evicted when the table runs went after their last use. */
    for (int i = 0; i < N; i++)
        if (bump(r[i]) != cudaSuccess)
            return 4;
    fprintf(stderr, "e2e: table\n");
    /* A kernel reaches every region through a table that kernels wrote in
     * device memory: the evicted ones are written over their host mapping,
     * behind the library's back. (A table uploaded by a copy the library
     * sees, or kept in pinned host memory, makes the launch opaque: no
     * mismatch to report.) */
    int count = N;
    size_t n = WORDS;
    void *args[] = {&table, &count, &n};
    stagehand_stats_t before;
    get_stats(&before);
    if (cudaLaunchKernel((const void *)k_table_bump, one, one, args, 0, NULL) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        return 6;
    printf("host_at_table_mb=%llu\n", (unsigned long long)(before.host_bytes >> 20));
    /* The resident ones are checked and freed: room to bring the others
     * back before the launches that use them run (a launch that ran on the
     * host copy would write it legitimately, and hide the table's write). */
    int (*where)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "stagehand_residency");
    int kept[N];
    bad = 0;
    for (int i = 0; i < N; i++) {
        kept[i] = !where || where(r[i]) != 1;
        if (!kept[i]) {
            bad += wrong_words(r[i], (uint32_t)(100 + i), 4);
            cudaFree(r[i]);
        }
    }
    /* Seen launches bring them back: each one written is reported. */
    for (int i = 0; i < N; i++)
        if (kept[i] && bump(r[i]) != cudaSuccess)
            return 7;
    if (cudaDeviceSynchronize() != cudaSuccess)
        return 8;
    for (int i = 0; i < N; i++)
        bad += kept[i] ? wrong_words(r[i], (uint32_t)(100 + i), 5) : 0;
    get_stats(&st);
    printf("table_bad=%zu\ntable_mismatches=%llu\n", bad,
           (unsigned long long)st.checksum_mismatches);
    simcuda_stats_t sim;
    simcuda_get_stats(&sim);
    printf("faults=%llu\n", sim.faults);
    for (int i = 0; i < N; i++)
        if (kept[i])
            cudaFree(r[i]);
    cudaFree(table);
    return 0;
}

/* ---- the parent ---------------------------------------------------------------------- */

struct child {
    int status;
    char out[16384];
    char err[1 << 16];
};

/* Runs this program in `mode` with env (NAME=VALUE strings, NULL-ended)
 * added, collecting its stdout, its stderr and its status. */
static void run_child_any(const char *mode, const char *const *env, struct child *c)
{
    memset(c, 0, sizeof *c);
    int out[2], err[2];
    assert_int_equal(pipe(out), 0);
    assert_int_equal(pipe(err), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        close(out[0]);
        close(err[0]);
        close(out[1]);
        close(err[1]);
        for (const char *const *e = env; *e; e++)
            putenv((char *)*e);
        setenv("E2E_LIMITS_MODE", mode, 1);
        e2e_reexec(saved_argv);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    char *buf[2] = {c->out, c->err};
    size_t len[2] = {0, 0}, cap[2] = {sizeof c->out - 1, sizeof c->err - 1};
    int open_fds = 2;
    time_t t0 = time(NULL);
    while (open_fds > 0) {
        if (poll(fds, 2, 1000) < 0 && errno != EINTR)
            break;
        if (time(NULL) - t0 > 120) {
            kill(pid, SIGKILL);
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char tmp[4096];
            ssize_t got = read(fds[i].fd, tmp, sizeof tmp);
            if (got <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
                continue;
            }
            size_t keep = (size_t)got < cap[i] - len[i] ? (size_t)got : cap[i] - len[i];
            memcpy(buf[i] + len[i], tmp, keep);
            len[i] += keep;
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);
    assert_int_equal(waitpid(pid, &c->status, 0), pid);
}

/* The same, for a child that must succeed. */
static void run_child(const char *mode, const char *const *env, struct child *c)
{
    run_child_any(mode, env, c);
    if (!WIFEXITED(c->status) || WEXITSTATUS(c->status) != 0)
        fprintf(stderr, "child %s: status 0x%x\n--- stdout\n%s--- stderr\n%s", mode, c->status,
                c->out, c->err);
    assert_true(WIFEXITED(c->status));
    assert_int_equal(WEXITSTATUS(c->status), 0);
}

/* The value of "key=" on a line of the child's stdout; -1 if absent. */
static long value(const struct child *c, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = c->out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, key, kl) == 0 && p[kl] == '=')
            return strtol(p + kl + 1, NULL, 10);
    return -1;
}

/* Lines of text that start with prefix and contain every string of has
 * (NULL-ended); the first such line is copied to first. */
static int count_lines(const char *text, const char *prefix, const char *const *has, char *first,
                       size_t flen)
{
    int n = 0;
    for (const char *p = text; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char line[1024];
        size_t l = len < sizeof line - 1 ? len : sizeof line - 1;
        memcpy(line, p, l);
        line[l] = 0;
        int ok = strncmp(line, prefix, strlen(prefix)) == 0;
        for (const char *const *h = has; ok && h && *h; h++)
            ok = strstr(line, *h) != NULL;
        if (ok && n++ == 0 && first)
            snprintf(first, flen, "%s", line);
        p = end ? end + 1 : NULL;
    }
    return n;
}

/* The stderr text between the marker lines "e2e: <from>" and "e2e: <to>". */
static void between(const struct child *c, const char *from, const char *to, char *out, size_t len)
{
    char a[128], b[128];
    snprintf(a, sizeof a, "e2e: %s\n", from);
    snprintf(b, sizeof b, "e2e: %s", to);
    const char *s = strstr(c->err, a);
    assert_non_null(s);
    s += strlen(a);
    const char *e = strstr(s, b);
    assert_non_null(e);
    size_t n = (size_t)(e - s) < len - 1 ? (size_t)(e - s) : len - 1;
    memcpy(out, s, n);
    out[n] = 0;
}

static void test_host_side_exhausted(void **state)
{
    (void)state;
    /* Watermarks set: the pool may then fill the whole budget (auto ones
     * keep what the process holds outside the pool free). */
    static const char *const env[] = {"SIMCUDA_VRAM_MB=256",
                                      "STAGEHAND_BUDGET_HOST_RAM_BUDGET_MB=128",
                                      "STAGEHAND_POOL_PREPIN_MB=128",
                                      "STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB=80%",
                                      "STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB=60%",
                                      NULL};
    static struct child c;
    run_child("exhausted", env, &c);
    long n = value(&c, "allocated");
    assert_int_equal(value(&c, "error"), cudaErrorMemoryAllocation);
    assert_int_equal(value(&c, "bad"), 0);
    assert_int_equal(value(&c, "faults"), 0);
    assert_int_equal(value(&c, "realloc"), cudaSuccess);
    if (!preloaded) {
        /* The card alone: it fills up and says nothing of ours. */
        assert_true(n > 0 && n * REGION_MB <= 256);
        assert_int_equal(count_lines(c.err, "stagehand:", NULL, NULL, 0), 0);
        return;
    }
    /* The device budget and then the host budget were used up first. Once
     * it evicts, the library's own kernels hold 64 KB of the device budget
     * (their key and result slots): one region's room. */
    assert_true(n * REGION_MB >= 256 + 128 - REGION_MB);
    assert_true(value(&c, "evictions") > 0);
    assert_int_equal(value(&c, "oom"), 1);
    assert_int_equal(value(&c, "host_mb"), 128);
    assert_true(value(&c, "pinned_mb") <= 128);
    /* One line, for the call that failed, saying why. */
    char line[1024] = "";
    static const char *const why[] = {"out of memory", NULL};
    assert_int_equal(count_lines(c.err, "stagehand:", NULL, line, sizeof line), 1);
    assert_int_equal(count_lines(c.err, "stagehand:", why, NULL, 0), 1);
    char call[128], in_call[4096], from[32], to[32];
    snprintf(call, sizeof call, "cudaMalloc(%zu bytes)", REGION);
    assert_non_null(strstr(line, call));
    snprintf(from, sizeof from, "alloc %ld", n);
    snprintf(to, sizeof to, "alloc %ld done", n);
    between(&c, from, to, in_call, sizeof in_call);
    assert_int_equal(count_lines(in_call, "stagehand:", why, NULL, 0), 1);
}

static void test_no_host_vmm(void **state)
{
    (void)state;
    static const char *const env[] = {"SIMCUDA_VRAM_MB=512",
                                      "SIMCUDA_NO_HOST_VMM=1",
                                      "STAGEHAND_BUDGET_VRAM_BUDGET_MB=256",
                                      "STAGEHAND_BUDGET_VRAM_HIGH_WATERMARK_MB=80%",
                                      "STAGEHAND_BUDGET_VRAM_LOW_WATERMARK_MB=60%",
                                      NULL};
    static struct child c;
    run_child("nohostvmm", env, &c);
    long n = value(&c, "allocated");
    assert_int_equal(value(&c, "error"), cudaErrorMemoryAllocation);
    assert_int_equal(value(&c, "bad"), 0);
    assert_int_equal(value(&c, "faults"), 0);
    assert_int_equal(value(&c, "realloc"), cudaSuccess);
    static const char *const off[] = {"eviction is off", NULL};
    if (!preloaded) {
        assert_true(n * REGION_MB > 256 && n * REGION_MB <= 512);
        assert_int_equal(count_lines(c.err, "stagehand:", NULL, NULL, 0), 0);
        return;
    }
    /* Up to the budget, and not one region more. */
    assert_int_equal(n * REGION_MB, 256);
    assert_int_equal(value(&c, "evictions"), 0);
    assert_int_equal(value(&c, "pinned_mb"), 0);
    /* Said once, however many calls followed. */
    char line[1024] = "";
    assert_int_equal(count_lines(c.err, "stagehand:", off, line, sizeof line), 1);
    assert_non_null(strstr(line, "host memory"));
    /* The failing call gets its own line; nothing else is said. */
    char in_call[4096], from[32], to[32];
    static const char *const why[] = {"out of memory", NULL};
    snprintf(from, sizeof from, "alloc %ld", n);
    snprintf(to, sizeof to, "alloc %ld done", n);
    between(&c, from, to, in_call, sizeof in_call);
    assert_int_equal(count_lines(in_call, "stagehand:", why, NULL, 0), 1);
    assert_int_equal(count_lines(c.err, "stagehand:", NULL, NULL, 0), 2);
}

/* A CUDA 12.0 driver cannot map host memory for the device, so nothing
 * could ever be evicted: the library passes every call through, the budget
 * does not apply, and one line says why. */
static void test_cuda_12_0_passes_through(void **state)
{
    (void)state;
    static const char *const env[] = {"SIMCUDA_VRAM_MB=512", "SIMCUDA_DRIVER_VERSION=12000",
                                      "STAGEHAND_BUDGET_VRAM_BUDGET_MB=256", NULL};
    static struct child c;
    run_child("exhausted", env, &c);
    long n = value(&c, "allocated");
    assert_int_equal(value(&c, "error"), cudaErrorMemoryAllocation);
    assert_int_equal(value(&c, "bad"), 0);
    assert_int_equal(value(&c, "realloc"), cudaSuccess);
    assert_true(n * REGION_MB > 256 && n * REGION_MB <= 512); /* the card, not the budget */
    assert_int_equal(value(&c, "active"), 0);
    assert_int_equal(value(&c, "evictions"), 0);
    static const char *const why[] = {"12.0", "host-located", "12.2", "passing through", NULL};
    assert_int_equal(count_lines(c.err, "stagehand:", NULL, NULL, 0), preloaded ? 1 : 0);
    assert_int_equal(count_lines(c.err, "stagehand:", why, NULL, 0), preloaded ? 1 : 0);
}

static void test_checksums(void **state)
{
    (void)state;
    /* A table kernels wrote on the device is a pointer the library never
     * sees: the program turns the overlapped moves off. */
    static const char *const env[] = {"SIMCUDA_VRAM_MB=512", "STAGEHAND_BUDGET_VRAM_BUDGET_MB=256",
                                      "STAGEHAND_DEBUG_DEBUG_CHECKSUMS=1",
                                      "STAGEHAND_POLICY_PREFETCH_ENABLED=false", NULL};
    static struct child c;
    run_child("checksums", env, &c);
    assert_int_equal(value(&c, "clean_bad"), 0);
    assert_int_equal(value(&c, "table_bad"), 0); /* the table's writes were the program's */
    assert_int_equal(value(&c, "faults"), 0);
    static const char *const mismatch[] = {"checksum mismatch", NULL};
    if (!preloaded) {
        assert_int_equal(count_lines(c.err, "stagehand:", NULL, NULL, 0), 0);
        return;
    }
    assert_int_equal(value(&c, "clean_mismatches"), 0);
    assert_true(value(&c, "clean_evictions") > 0);
    assert_true(value(&c, "clean_restores") > 0);
    /* Nothing said while every launch was seen. */
    const char *table = strstr(c.err, "e2e: table\n");
    assert_non_null(table);
    char head[1 << 12];
    size_t hl =
        (size_t)(table - c.err) < sizeof head - 1 ? (size_t)(table - c.err) : sizeof head - 1;
    memcpy(head, c.err, hl);
    head[hl] = 0;
    assert_int_equal(count_lines(head, "stagehand:", NULL, NULL, 0), 0);
    /* After the table: one line per changed chunk, each naming its region. */
    long host_mb = value(&c, "host_at_table_mb");
    long found = value(&c, "table_mismatches");
    assert_true(host_mb >= REGION_MB);
    assert_int_equal(found, host_mb / REGION_MB); /* every region the table wrote while evicted */
    char line[1024] = "";
    assert_int_equal(count_lines(table, "stagehand:", mismatch, line, sizeof line), found);
    assert_int_equal(count_lines(table, "stagehand:", NULL, NULL, 0), found);
    const char *id = strstr(line, "region ");
    assert_non_null(id);
    assert_true(strtol(id + 7, NULL, 10) > 0);
}

/* [general] device names the device the library manages: one the machine lacks
 * stops the program at its first allocation, saying which. */
static void test_device_key(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    static const char *const env[] = {"SIMCUDA_VRAM_MB=256", "STAGEHAND_GENERAL_DEVICE=7", NULL};
    static struct child c;
    run_child_any("exhausted", env, &c);
    assert_true(WIFEXITED(c.status));
    assert_int_equal(WEXITSTATUS(c.status), 1);
    assert_non_null(strstr(c.err, "stagehand: [general] device = 7: no such CUDA device here\n"));
    static const char *const dev0[] = {"SIMCUDA_VRAM_MB=256", "STAGEHAND_GENERAL_DEVICE=0",
                                       "STAGEHAND_BUDGET_HOST_RAM_BUDGET_MB=128",
                                       "STAGEHAND_POOL_PREPIN_MB=128", NULL};
    run_child("exhausted", dev0, &c);
    assert_true(value(&c, "evictions") > 0); /* device 0 is the one managed */
}

/* A CUPTI that cannot be loaded is named, with the loader's reason. */
static void test_cupti_path_reason(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    static const char *const env[] = {"SIMCUDA_VRAM_MB=256",
                                      "STAGEHAND_TRACKING_MODE=cupti",
                                      "STAGEHAND_TRACKING_CUPTI_PATH=/nonexistent/libcupti-test.so",
                                      "STAGEHAND_BUDGET_HOST_RAM_BUDGET_MB=128",
                                      "STAGEHAND_POOL_PREPIN_MB=128",
                                      NULL};
    static struct child c;
    run_child("exhausted", env, &c);
    assert_non_null(strstr(c.err, "tracking mode cupti requested, but [tracking] cupti_path "
                                  "/nonexistent/libcupti-test.so could not be loaded: "));
    assert_non_null(strstr(c.err, "No such file or directory"));
}

/* A child that makes the library start with one allocation; with
 * `runtime12`, after loading libcudart.so.12 first, as a CUDA 12 program
 * has. */
static int child_one_alloc(int runtime12)
{
    if (runtime12 && !dlopen("libcudart.so.12", RTLD_NOW | RTLD_GLOBAL))
        return 2;
    void *p = NULL;
    return cudaMalloc(&p, REGION) == cudaSuccess && cudaFree(p) == cudaSuccess ? 0 : 3;
}

/* A copy, not a link: the loader takes a file it has loaded under one
 * name for the same library under any other. */
static int copy_file(const char *from, const char *to)
{
    static char buf[1 << 16];
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    size_t n = 0;
    int rc = in && out ? 0 : -1;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, in)) > 0)
        rc = fwrite(buf, 1, n, out) == n ? 0 : -1;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        rc = -1;
    return rc;
}

/* Which CUPTI the library subscribed with, from its info line. */
static void cupti_used(const char *mode, const char *libdir, char *out, size_t len)
{
    static char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "LD_LIBRARY_PATH=%s:%s", libdir, getenv("LD_LIBRARY_PATH"));
    const char *const env[] = {"STAGEHAND_GENERAL_LOG_LEVEL=info", "STAGEHAND_TRACKING_MODE=cupti",
                               path, NULL};
    static struct child c;
    run_child(mode, env, &c);
    const char *at = strstr(c.err, "launch tracking: CUPTI callbacks (");
    assert_non_null(at);
    at += strlen("launch tracking: CUPTI callbacks (");
    snprintf(out, len, "%.*s", (int)strcspn(at, ")"), at);
}

/* cupti_path = auto: the CUPTI of the runtime the program loaded (12 or
 * 13), the other one if that is missing. Copies of the simulated runtime
 * and CUPTI stand in for the CUDA 12 ones under their names. */
static void test_cupti_follows_the_runtime(void **state)
{
    (void)state;
    if (!preloaded)
        skip();
    char dir[] = "/tmp/e2e_limits_rt12_XXXXXX", link[PATH_MAX], cwd[PATH_MAX], used[128];
    static char target[2 * PATH_MAX];
    assert_non_null(mkdtemp(dir));
    assert_non_null(getcwd(cwd, sizeof cwd));
    const char *build = getenv("STAGEHAND_TEST_BUILD") ? getenv("STAGEHAND_TEST_BUILD") : "build";
    static const char *const libs[][2] = {{"libcudart.so.12", "libcudart.so.13"},
                                          {"libcupti.so.12", "libcupti.so.13"}};
    for (int i = 0; i < 2; i++) {
        snprintf(link, sizeof link, "%s/%s", dir, libs[i][0]);
        snprintf(target, sizeof target, "%s/%s/sim/%s", cwd, build, libs[i][1]);
        assert_int_equal(copy_file(target, link), 0);
    }
    cupti_used("runtime13", dir, used, sizeof used); /* a CUDA 13 program */
    assert_string_equal(used, "libcupti.so.13");
    cupti_used("runtime12", dir, used, sizeof used);
    assert_string_equal(used, "libcupti.so.12");
    snprintf(link, sizeof link, "%s/libcupti.so.12", dir);
    unlink(link);
    cupti_used("runtime12", dir, used, sizeof used); /* no CUPTI 12: the other */
    assert_string_equal(used, "libcupti.so.13");
    snprintf(link, sizeof link, "%s/libcudart.so.12", dir);
    unlink(link);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    (void)argc;
    saved_argv = argv;
    preloaded = dlsym(RTLD_DEFAULT, "stagehand_get_stats") && !getenv("STAGEHAND_DISABLE");
    const char *mode = getenv("E2E_LIMITS_MODE");
    if (mode) {
        alarm(100); /* a hang ends as a failure, not as a stuck run */
        setvbuf(stdout, NULL, _IOLBF, 0);
        if (register_kernels() != 0)
            return 2;
        if (strcmp(mode, "checksums") == 0)
            return child_checksums();
        if (strncmp(mode, "runtime1", 8) == 0)
            return child_one_alloc(strcmp(mode, "runtime12") == 0);
        return child_fill_up();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_side_exhausted),
        cmocka_unit_test(test_no_host_vmm),
        cmocka_unit_test(test_cuda_12_0_passes_through),
        cmocka_unit_test(test_checksums),
        cmocka_unit_test(test_device_key),
        cmocka_unit_test(test_cupti_path_reason),
        cmocka_unit_test(test_cupti_follows_the_runtime),
    };
    return cmocka_run_group_tests_name(
        preloaded ? "e2e_limits (preloaded)" : "e2e_limits (disabled)", tests, NULL, NULL);
}
