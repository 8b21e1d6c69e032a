/* test_sim_bound.c — stagehand-sim's lower bound is one: on tiny one-step
 * traces, a complete search over every schedule of the replay's model finds
 * none faster than the bound the tool prints. Runs the built tool
 * ($STAGEHAND_TEST_BUILD/stagehand-sim).
 *
 * The search's model is the replay's, with everything that only costs time
 * taken away (remap windows, in-flight caps, abandoned copies), so its best
 * is no slower than any policy's: launches run one at a time in trace
 * order, each with all its regions on the device; a copy moves one whole
 * region on its direction's link (or the one shared link), one copy at a
 * time, taking the device memory of a restore when it starts and giving
 * back that of an eviction when it ends; a launch keeps its regions while
 * it runs; at no instant are more than VRAM bytes on the device. Nothing
 * changes what may happen next except a launch ending, a copy ending or an
 * event being taken, so any schedule can be shifted, without getting
 * slower, to one where every copy starts at such a moment; the search tries
 * every choice at each of them (copies to start, the next event, or waiting
 * for the next ending), skips states already seen, and cuts a branch only
 * when the compute left cannot finish before the best found.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXR   5
#define MAXE   12
#define UNIT   268435456ull /* bytes of one region unit: 1 s at the link speed below */
#define SEC    1000000000ull
#define NONE   (-1)
#define ABS    0 /* region states: not allocated (or freed) */
#define DEV    1
#define HOST   2
#define TODEV  3
#define TOHOST 4

struct ev {
    char type;     /* 'a' alloc, 'f' free, 'l' launch */
    int id;        /* alloc, free */
    unsigned dur;  /* launch, in ms */
    int ids[MAXR]; /* launch: region ids, 0-terminated */
};

struct tiny {
    const char *name;
    int units[MAXR + 1]; /* per region id 1..: size in units */
    int vram;            /* units */
    int shared;          /* one link for both directions */
    struct ev ev[MAXE];
};

/* One moment of a schedule; no padding, so that memcmp compares states. */
struct st {
    uint64_t t, gpu_end;
    int ev, run; /* next event; launch running (event index) or NONE */
    int link[2]; /* region being copied (0: freed meanwhile), or NONE */
    uint64_t link_end[2];
    signed char dir[2]; /* what the link carries: TODEV or TOHOST */
    signed char res[MAXR + 1];
};
_Static_assert(sizeof(struct st) == 56, "struct st has padding");

struct search {
    const struct tiny *k;
    int nev, nreg;
    uint64_t best;
    struct st *seen; /* open addressing; t == UINT64_MAX is empty */
    size_t cap, nseen, nodes;
};

static uint64_t used(const struct search *s, const struct st *x)
{
    uint64_t u = 0;
    for (int g = 1; g <= s->nreg; g++)
        if (x->res[g] == DEV || x->res[g] == TODEV || x->res[g] == TOHOST)
            u += (uint64_t)s->k->units[g];
    return u;
}

static uint64_t compute_left(const struct search *s, const struct st *x)
{
    uint64_t c = x->run != NONE ? x->gpu_end - x->t : 0;
    for (int i = x->ev; i < s->nev; i++)
        if (s->k->ev[i].type == 'l')
            c += (uint64_t)s->k->ev[i].dur * 1000000u;
    return c;
}

static uint64_t hash(const struct st *x)
{
    const unsigned char *p = (const unsigned char *)x;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *x; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* 1 if x was seen before; else remembers it (while there is room). */
static int seen(struct search *s, const struct st *x)
{
    if (s->nseen * 2 >= s->cap)
        return 0;
    for (size_t i = hash(x) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->seen[i].t == UINT64_MAX) {
            s->seen[i] = *x;
            s->nseen++;
            return 0;
        }
        if (!memcmp(&s->seen[i], x, sizeof *x))
            return 1;
    }
}

static int protected(const struct search *s, const struct st *x, int g)
{
    if (x->run == NONE)
        return 0;
    for (const int *id = s->k->ev[x->run].ids; *id; id++)
        if (*id == g)
            return 1;
    return 0;
}

static void dfs(struct search *s, const struct st *x);

/* The next event, if it can be taken now. */
static void take_event(struct search *s, const struct st *x)
{
    if (x->run != NONE || x->ev >= s->nev)
        return;
    const struct ev *e = &s->k->ev[x->ev];
    struct st y = *x;
    y.ev++;
    if (e->type == 'a') {
        if (used(s, x) + (uint64_t)s->k->units[e->id] > (uint64_t)s->k->vram)
            return;
        y.res[e->id] = DEV;
    } else if (e->type == 'f') {
        for (int l = 0; l < 2; l++)
            if (y.link[l] == e->id)
                y.link[l] = 0; /* the link stays busy; the copy no longer matters */
        y.res[e->id] = ABS;
    } else {
        for (const int *id = e->ids; *id; id++)
            if (x->res[*id] != DEV)
                return;
        y.run = x->ev;
        y.gpu_end = x->t + (uint64_t)e->dur * 1000000u;
    }
    dfs(s, &y);
}

/* Every copy the idle links could start now. */
static void start_copies(struct search *s, const struct st *x)
{
    for (int l = 0; l < (s->k->shared ? 1 : 2); l++) {
        if (x->link[l] != NONE)
            continue;
        for (int g = 1; g <= s->nreg; g++) {
            int to = 0;
            if ((s->k->shared || l == 0) && x->res[g] == HOST &&
                used(s, x) + (uint64_t)s->k->units[g] <= (uint64_t)s->k->vram)
                to = TODEV;
            if ((s->k->shared || l == 1) && x->res[g] == DEV && !protected(s, x, g))
                to = TOHOST;
            if (!to)
                continue;
            struct st y = *x;
            y.res[g] = (signed char)to;
            y.link[l] = g;
            y.dir[l] = (signed char)to;
            y.link_end[l] = x->t + (uint64_t)s->k->units[g] * SEC;
            dfs(s, &y);
        }
    }
}

/* Waits for the next launch or copy to end. */
static void wait_next(struct search *s, const struct st *x)
{
    uint64_t t = x->run != NONE ? x->gpu_end : UINT64_MAX;
    for (int l = 0; l < 2; l++)
        if (x->link[l] != NONE && x->link_end[l] < t)
            t = x->link_end[l];
    if (t == UINT64_MAX)
        return;
    struct st y = *x;
    y.t = t;
    if (y.run != NONE && y.gpu_end == t)
        y.run = NONE;
    for (int l = 0; l < 2; l++) {
        if (y.link[l] == NONE || y.link_end[l] != t)
            continue;
        int g = y.link[l];
        if (g)
            y.res[g] = y.dir[l] == TODEV ? DEV : HOST;
        y.link[l] = NONE;
        y.link_end[l] = 0;
        y.dir[l] = 0;
    }
    if (y.run == NONE)
        y.gpu_end = 0;
    dfs(s, &y);
}

static void dfs(struct search *s, const struct st *x)
{
    s->nodes++;
    if (x->ev == s->nev && x->run == NONE) {
        if (x->t < s->best)
            s->best = x->t;
        return;
    }
    if (x->t + compute_left(s, x) >= s->best || seen(s, x))
        return;
    take_event(s, x);
    start_copies(s, x);
    wait_next(s, x);
}

/* The fastest schedule of k, in ns. */
static uint64_t fastest(const struct tiny *k)
{
    struct search s = {.k = k, .cap = (size_t)1 << 20};
    while (s.nev < MAXE && k->ev[s.nev].type)
        s.nev++;
    for (int g = 1; g <= MAXR; g++)
        if (k->units[g])
            s.nreg = g;
    s.seen = malloc(s.cap * sizeof *s.seen);
    assert_non_null(s.seen);
    memset(s.seen, 0xff, s.cap * sizeof *s.seen);
    struct st x;
    memset(&x, 0, sizeof x);
    x.run = x.link[0] = x.link[1] = NONE;
    /* Some schedule takes at most this: before each event, every region out
     * and back. The search cuts at it, so a copy loop cannot run forever. */
    uint64_t units = 0;
    for (int g = 1; g <= s.nreg; g++)
        units += (uint64_t)k->units[g];
    uint64_t limit = compute_left(&s, &x) + (uint64_t)s.nev * 2 * units * SEC + 1;
    s.best = limit;
    dfs(&s, &x);
    assert_true(s.best < limit);
    free(s.seen);
    return s.best;
}

/* Writes k as a trace with one step mark before its first launch. */
static void write_trace(const struct tiny *k, const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "stagehand-trace 1\ns 0 0 api\n");
    for (int i = 0; i < MAXE && k->ev[i].type; i++) {
        const struct ev *e = &k->ev[i];
        if (e->type == 'a')
            fprintf(f, "a 0 %d %llu 7 u\n", e->id, (unsigned long long)k->units[e->id] * UNIT);
        else if (e->type == 'f')
            fprintf(f, "f 0 %d u\n", e->id);
        else {
            int n = 0;
            while (e->ids[n])
                n++;
            fprintf(f, "l 0 %u 7 1 %d", e->dur * 1000, n);
            for (int j = 0; j < n; j++)
                fprintf(f, " %d", e->ids[j]);
            fprintf(f, "\n");
        }
    }
    fclose(f);
}

static char out[16384];

/* Runs stagehand-sim on k's trace at 1 unit per second of link, on a card
 * where the library holds nothing beside the regions (as the search
 * models it); returns the bound it prints, and checks every policy ran no
 * faster than fastest. */
static double sim_bound(const struct tiny *k, uint64_t fastest_ns)
{
    char path[] = "/tmp/test_sim_bound.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_trace(k, path);
    const char *build = getenv("STAGEHAND_TEST_BUILD");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s/stagehand-sim --trace %s --vram-gb %g --pcie-gbps %.9f --duplex %s "
             "--remap-us 0 --map-us 0 --own-kb 0 --granule-mb 0 2>&1",
             build ? build : "build", path, k->vram / 4.0, (double)UNIT / 1e9,
             k->shared ? "shared" : "full");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    remove(path);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: %s", k->name, out);
    double bound = -1;
    int lines = 0;
    for (const char *l = strstr(out, "policy="); l; l = strstr(l + 1, "policy=")) {
        double step = strtod(strstr(l, "step_s=") + 7, NULL);
        bound = strtod(strstr(l, "lower_bound_s=") + 14, NULL);
        if (step + 1e-3 < (double)fastest_ns / 1e9)
            fail_msg("%s: a policy beat the search (%.4f s < %.4f s), which must model less than "
                     "the replay:\n%s",
                     k->name, step, (double)fastest_ns / 1e9, out);
        lines++;
    }
    assert_int_equal(lines, 4);
    return bound;
}

#define A(id)                                                                                      \
    {                                                                                              \
        'a', id, 0,                                                                                \
        {                                                                                          \
            0                                                                                      \
        }                                                                                          \
    }
#define F(id)                                                                                      \
    {                                                                                              \
        'f', id, 0,                                                                                \
        {                                                                                          \
            0                                                                                      \
        }                                                                                          \
    }
#define L(ms, ...)                                                                                 \
    {                                                                                              \
        'l', 0, ms,                                                                                \
        {                                                                                          \
            __VA_ARGS__, 0                                                                         \
        }                                                                                          \
    }

static const struct tiny cases[] = {
    /* two regions take turns on a card that holds one */
    {"swap", {0, 1, 1}, 1, 0, {A(1), L(500, 1), A(2), L(500, 2), L(500, 1), L(500, 2)}},
    {"swap, shared link",
     {0, 1, 1},
     1,
     1,
     {A(1), L(500, 1), A(2), L(500, 2), L(500, 1), L(500, 2)}},
    /* evictions that must happen though nothing comes back, and never more
     * than two regions live */
    {"write-out",
     {0, 1, 1, 1},
     1,
     0,
     {A(1), L(200, 1), A(2), L(200, 2), F(1), A(3), L(200, 3), F(2)}},
    {"write-out, shared link",
     {0, 1, 1, 1},
     1,
     1,
     {A(1), L(200, 1), A(2), L(200, 2), F(1), A(3), L(200, 3), F(2)}},
    /* one eviction, nothing back: on a shared link it crosses once, not twice */
    {"evict once, shared link", {0, 1, 1}, 1, 1, {A(1), L(200, 1), A(2), L(200, 2)}},
    /* forward and backward: activations kept, weights read twice */
    {"fwd-bwd",
     {0, 1, 1, 1, 1},
     2,
     0,
     {A(1), A(2), A(3), L(700, 1, 3), A(4), L(700, 2, 4), L(1400, 2, 4), F(4), L(1400, 1, 3),
      F(3)}},
    /* sizes that differ, a free that makes room, long compute to hide copies */
    {"mixed",
     {0, 2, 1, 1},
     3,
     0,
     {A(1), A(2), L(1500, 1, 2), A(3), L(300, 3), F(2), L(2500, 1, 3), L(400, 1)}},
    {"mixed, shared link",
     {0, 2, 1, 1},
     3,
     1,
     {A(1), A(2), L(1500, 1, 2), A(3), L(300, 3), F(2), L(2500, 1, 3), L(400, 1)}},
    /* an optimizer pass: every region read once, more than the card */
    {"optimizer",
     {0, 1, 1, 1, 1},
     2,
     0,
     {A(1), A(2), A(3), A(4), L(100, 1, 2), L(100, 3, 4), L(100, 1, 2), L(100, 3, 4)}},
};

static void test_no_schedule_beats_the_bound(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct tiny *k = &cases[i];
        uint64_t best = fastest(k);
        double bound = sim_bound(k, best);
        print_message("%-24s fastest %.4f s, bound %.4f s\n", k->name, (double)best / 1e9, bound);
        /* the bound is printed to 0.1 ms */
        if (bound > (double)best / 1e9 + 1e-4)
            fail_msg("%s: bound %.4f s, but a schedule takes %.4f s\n%s", k->name, bound,
                     (double)best / 1e9, out);
    }
}

/* The bound counts what must be written out: each allocation on a card that
 * holds one region evicts the live one, 1 s each, though at most two are
 * live at once and none comes back. */
static void test_bound_counts_evictions(void **state)
{
    (void)state;
    const struct tiny *k = &cases[2];
    double bound = sim_bound(k, fastest(k));
    assert_true(bound >= 2.0 - 1e-3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_schedule_beats_the_bound),
        cmocka_unit_test(test_bound_counts_evictions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
