/* test_engine.c — the engine's room decisions against a fake pool: the
 * watermarks, auto and set; the chain's order (freed regions, early
 * evictions under way, the policy's victims, moves in flight landed) and
 * where it stops; what it refuses; which of a launch's evicted regions come
 * back (sh_engine_resident); a capture putting eviction off; the
 * pressure counter around evictions; when launches start being recorded;
 * the Conductor's hints (watermarks and copy caps, only ever lower); a
 * decision point of the planner (sh_engine_plan) over a real policy, and
 * carried out (sh_engine_decide, sh_engine_start): the order of its moves.
 *
 * The fake is a card of `total` bytes of which `outside` are held outside
 * the pool, and a pool holding `dev`, with so many bytes each link of the
 * chain can release; every call is logged in order.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "policy/policy.h"
#include "sh_err.h"

#include <string.h>

#define MB ((size_t)1 << 20)

static struct fake {
    size_t total, outside, dev;
    int no_info, capturing;
    int infos;     /* mem_info calls */
    size_t can[3]; /* trim, commit_early, evict_chosen */
    size_t asked[3];
    char log[64];     /* the links called, in order: t c p, and l (land) */
    size_t in_flight; /* bytes of prefetches in flight: victims once landed */
    size_t grow;      /* device bytes the next eviction takes of its own */
    size_t np;        /* the protected addresses evict_chosen was given */
    size_t host[8];   /* region i's bytes on the host (0: on the device) */
    int landing;      /* the region whose prefetch a land commits, or 0 */
    size_t pressure_at;
    unsigned caps_set, caps[2]; /* set_caps calls; the last d2h, h2d */
    /* a decision point's moves (decide.c): logged in order, as r (ready
     * asked), C (commit evicted), R (read), L/U (policy lock, unlock), E/F
     * (evictions, fetches started), P (fetched committed), H (hints) */
    char moves[32];
    size_t ready;                /* evicted_ready's answer */
    struct sh_engine_plan_in in; /* read's */
    char fail;                   /* the move that fails, or 0 */
    int locked;                  /* the policy lock is held */
    size_t started_evict, started_fetch;
    int neared; /* near_limit calls */
} f;

/* Logs move m; nonzero when it is the one that fails. */
static int moved(char m)
{
    size_t n = strlen(f.moves);
    if (n + 1 < sizeof f.moves)
        f.moves[n] = m;
    return f.fail == m;
}

/* Logs link (or 'l', land), keeping the first calls when there are many. */
static void logged(char c)
{
    size_t n = strlen(f.log);
    if (n + 1 < sizeof f.log)
        f.log[n] = c;
}

static void called(int link, size_t asked)
{
    logged("tcp"[link]);
    f.asked[link] = asked;
}

/* Releases what the link can, at most what it was asked for (the commit
 * of early evictions is not asked: it lands what is under way). */
static size_t give(int link, size_t bytes)
{
    size_t r = f.can[link] < bytes ? f.can[link] : bytes;
    f.can[link] -= r;
    f.dev -= r;
    return r;
}

static size_t device_bytes(void *ctx)
{
    (void)ctx;
    return f.dev;
}

static int mem_info(void *ctx, size_t *free_b, size_t *total)
{
    (void)ctx;
    f.infos++;
    if (f.no_info)
        return -1;
    *total = f.total;
    *free_b = f.total - f.dev - f.outside;
    return 0;
}

static int capturing(void *ctx)
{
    (void)ctx;
    return f.capturing;
}

static size_t trim(void *ctx, size_t bytes)
{
    (void)ctx;
    called(0, bytes);
    return give(0, bytes);
}

static size_t commit_early(void *ctx)
{
    (void)ctx;
    called(1, 0);
    return give(1, SIZE_MAX);
}

static size_t evict_chosen(void *ctx, size_t bytes, const uintptr_t *protect, size_t np)
{
    (void)ctx;
    (void)protect;
    f.np = np;
    called(2, bytes);
    f.dev += f.grow;
    f.grow = 0;
    return give(2, bytes);
}

static int land(void *ctx)
{
    (void)ctx;
    logged('l');
    f.can[2] += f.in_flight;
    size_t landed = f.in_flight;
    f.in_flight = 0;
    if (f.landing) { /* its prefetch committed: on the device now */
        f.dev += f.host[f.landing];
        f.host[f.landing] = 0;
    }
    return landed > 0;
}

static size_t host_bytes(void *ctx, uintptr_t region)
{
    (void)ctx;
    return region < 8 ? f.host[region] : 0;
}

static void pressure(void *ctx, size_t dev)
{
    (void)ctx;
    f.pressure_at = dev;
}

static void set_caps(void *ctx, unsigned max_d2h, unsigned max_h2d)
{
    (void)ctx;
    f.caps_set++;
    f.caps[0] = max_d2h;
    f.caps[1] = max_h2d;
}

static size_t evicted_ready(void *ctx)
{
    (void)ctx;
    moved('r');
    return f.ready;
}

static int commit_evicted(void *ctx)
{
    (void)ctx;
    f.ready = 0;
    return moved('C');
}

static void read_in(void *ctx, struct sh_engine_plan_in *in)
{
    (void)ctx;
    assert_false(f.locked); /* the pool is read outside the policy's lock */
    moved('R');
    *in = f.in;
}

static void policy_lock(void *ctx)
{
    (void)ctx;
    assert_false(f.locked);
    f.locked = 1;
    moved('L');
}

static void policy_unlock(void *ctx)
{
    (void)ctx;
    assert_true(f.locked);
    f.locked = 0;
    moved('U');
}

static int start_evictions(void *ctx, const uint64_t *ids, size_t n)
{
    (void)ctx;
    (void)ids;
    assert_false(f.locked); /* copies start outside it */
    f.started_evict += n;
    return moved('E');
}

static int start_fetches(void *ctx, const uint64_t *ids, size_t n)
{
    (void)ctx;
    (void)ids;
    assert_false(f.locked);
    f.started_fetch += n;
    return moved('F');
}

static int commit_fetched(void *ctx)
{
    (void)ctx;
    return moved('P');
}

static void hints(void *ctx, const struct sh_policy_hints *h)
{
    (void)ctx;
    (void)h;
    moved('H');
}

static void near_limit(void *ctx)
{
    (void)ctx;
    f.neared++;
}

static const struct sh_engine_ops ops = {
    .near_limit = near_limit,
    .device_bytes = device_bytes,
    .mem_info = mem_info,
    .capturing = capturing,
    .trim = trim,
    .commit_early = commit_early,
    .evict_chosen = evict_chosen,
    .land = land,
    .host_bytes = host_bytes,
    .pressure = pressure,
    .set_caps = set_caps,
    .evicted_ready = evicted_ready,
    .commit_evicted = commit_evicted,
    .read = read_in,
    .policy_lock = policy_lock,
    .policy_unlock = policy_unlock,
    .start_evictions = start_evictions,
    .start_fetches = start_fetches,
    .commit_fetched = commit_fetched,
    .hints = hints,
};

static struct sh_engine e;
static int live; /* e is initialised */

/* A 100 MB budget on a 100 MB card, watermarks set (high, low in MB) or
 * auto (0), a 1 MB granule, recording from 50%, 2 copies in flight to the
 * host and 4 to the device. */
static void start(size_t high_mb, size_t low_mb)
{
    struct sh_engine_cfg cfg = {.card = 100 * MB,
                                .budget = 100 * MB,
                                .high = high_mb * MB,
                                .low = low_mb * MB,
                                .high_auto = high_mb == 0,
                                .low_auto = low_mb == 0,
                                .gran = MB,
                                .record_pct = 50,
                                .max_d2h = 2,
                                .max_h2d = 4};
    memset(&f, 0, sizeof f);
    f.total = 100 * MB;
    if (live)
        sh_engine_destroy(&e);
    sh_engine_init(&e, &cfg, &ops, NULL);
    live = 1;
}

static int make_room(size_t need_mb)
{
    sh_engine_lock(&e);
    int rc = sh_engine_make_room(&e, need_mb * MB, NULL, 0);
    sh_engine_unlock(&e);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    if (live)
        sh_engine_destroy(&e);
    live = 0;
    return 0;
}

/* Below the high watermark nothing is called and nothing counted. */
static void test_room_below_the_watermark(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 70 * MB;
    assert_int_equal(make_room(10), SH_OK);
    assert_string_equal(f.log, "");
    assert_int_equal(atomic_load(&e.pressure), 0);
}

/* Above it, down to the low watermark, the cheapest link first, stopping
 * as soon as enough is released. */
static void test_chain_order_and_stop(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 78 * MB;
    f.can[0] = 4 * MB;
    f.can[1] = 6 * MB;
    f.can[2] = 100 * MB;
    assert_int_equal(make_room(10), SH_OK); /* 88 MB wanted: 28 MB to release */
    assert_string_equal(f.log, "tcp");
    assert_int_equal(f.asked[0], 28 * MB);
    assert_int_equal(f.asked[2], 18 * MB); /* what trim and commits left */
    assert_int_equal(f.dev, 50 * MB);
    assert_int_equal(f.pressure_at, 78 * MB);
    assert_int_equal(atomic_load(&e.pressure), 2); /* before and after: not quiet */
    /* freed regions alone enough: nothing else is touched */
    start(80, 60);
    f.dev = 78 * MB;
    f.can[0] = 100 * MB;
    assert_int_equal(make_room(10), SH_OK);
    assert_string_equal(f.log, "t");
}

/* The policy's victims are the last link: what they cannot release is
 * found nowhere else. Under the budget the request still goes on; past it,
 * it fails: SH_ENOMEM. */
static void test_chosen_last_then_enomem(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 78 * MB;
    f.can[2] = 10 * MB;
    assert_int_equal(make_room(10), SH_OK); /* 68 + 10 of the 100 MB budget */
    assert_string_equal(f.log, "tcpp");     /* asked again for the rest: none */
    assert_int_equal(f.asked[2], 18 * MB);
    assert_int_equal(f.dev, 68 * MB);
    start(80, 60);
    f.dev = 95 * MB;
    f.can[2] = 2 * MB; /* 93 MB held: 10 more pass the 100 MB budget */
    assert_int_equal(make_room(10), SH_ENOMEM);
    assert_string_equal(f.log, "tcppl"); /* nothing in flight to land */
}

/* Room held by moves in flight (a prefetch's scratch memory) is taken
 * only when the request would fail without it: the moves land, and their
 * regions are the policy's victims like any other. */
static void test_land_only_when_short(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 95 * MB;
    f.in_flight = 30 * MB;
    assert_int_equal(make_room(10), SH_OK);
    assert_string_equal(f.log, "tcpltcpp");
    assert_int_equal(f.asked[2], 15 * MB); /* 45 MB to the low watermark, 30 of them landed */
    assert_int_equal(f.dev, 65 * MB);
    /* enough without them, though above the low watermark: left in flight */
    start(80, 60);
    f.dev = 78 * MB;
    f.can[2] = 10 * MB;
    f.in_flight = 30 * MB;
    assert_int_equal(make_room(10), SH_OK);
    assert_string_equal(f.log, "tcpp");
    assert_int_equal(f.in_flight, 30 * MB);
}

/* Each link is asked for what the device still holds above the goal, read
 * again after the one before: a move that takes device memory of its own
 * (the first fingerprint allocates the library's buffer) is made up for
 * by asking the policy once more. */
static void test_goal_read_again(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 78 * MB;
    f.can[2] = 100 * MB;
    f.grow = MB / 16; /* the first eviction allocates 64 KB */
    assert_int_equal(make_room(10), SH_OK);
    assert_string_equal(f.log, "tcpp");
    assert_int_equal(f.asked[2], MB / 16);
    assert_int_equal(f.dev, 50 * MB);
}

/* sh_engine_resident over regions 1..n of the fake, the launch protecting
 * them; the regions to restore, as digits in order. */
static int resident(size_t n, char *fit_out)
{
    uintptr_t regions[8], fit[8];
    size_t nfit = 99;
    for (size_t i = 0; i < n; i++)
        regions[i] = i + 1;
    sh_engine_lock(&e);
    int rc = sh_engine_resident(&e, regions, n, regions, n, fit, &nfit);
    sh_engine_unlock(&e);
    assert_true(nfit <= n);
    for (size_t i = 0; i < nfit; i++)
        fit_out[i] = (char)('0' + fit[i]);
    fit_out[nfit] = 0;
    return rc;
}

/* A launch's evicted regions: room for them all at once when it can be
 * made; the launch's own addresses protected; regions already on the
 * device left out. */
static void test_resident_all(void **state)
{
    (void)state;
    char fit[9];
    start(80, 60);
    f.dev = 70 * MB;
    f.host[1] = f.host[3] = 10 * MB;
    f.can[2] = 100 * MB;
    assert_int_equal(resident(3, fit), SH_OK);
    assert_string_equal(fit, "13");
    assert_string_equal(f.log, "tcp");     /* one request for the 20 MB */
    assert_int_equal(f.asked[2], 30 * MB); /* to the low watermark less 20 MB */
    assert_int_equal(f.np, 3);
    /* nothing on the host: nothing asked */
    start(80, 60);
    f.dev = 95 * MB;
    assert_int_equal(resident(3, fit), SH_OK);
    assert_string_equal(fit, "");
    assert_string_equal(f.log, "");
}

/* When they cannot all fit, as many as do, in the launch's order: one too
 * large for what is left does not stop a smaller one after it, and one
 * the budget could never hold is passed over. SH_ENOMEM: some stay on the
 * host. */
static void test_resident_those_that_fit(void **state)
{
    (void)state;
    char fit[9];
    start(80, 60);
    f.dev = 70 * MB; /* nothing evictable: 30 MB of the budget left */
    f.host[1] = 20 * MB;
    f.host[2] = 15 * MB;
    f.host[3] = 10 * MB;
    f.host[4] = 5 * MB;
    assert_int_equal(resident(4, fit), SH_ENOMEM);
    assert_string_equal(fit, "13");
    start(80, 60);
    f.dev = 10 * MB;
    f.host[1] = 120 * MB; /* more than the budget */
    f.host[2] = 5 * MB;
    assert_int_equal(resident(2, fit), SH_ENOMEM);
    assert_string_equal(fit, "2");
    /* room made for each one kept, beside those kept before it */
    start(80, 60);
    f.dev = 70 * MB;
    f.can[2] = 25 * MB; /* 55 MB could fit, of 60 */
    f.host[1] = 30 * MB;
    f.host[2] = 30 * MB;
    assert_int_equal(resident(2, fit), SH_ENOMEM);
    assert_string_equal(fit, "1");
    assert_int_equal(f.dev, 45 * MB);
}

/* Landing the moves in flight may bring one of the launch's regions back
 * itself: only those still on the host are restored. */
static void test_resident_after_landing(void **state)
{
    (void)state;
    char fit[9];
    start(80, 60);
    f.dev = 95 * MB;
    f.in_flight = 30 * MB;
    f.host[1] = f.host[2] = 10 * MB;
    f.landing = 2;
    assert_int_equal(resident(2, fit), SH_OK);
    assert_string_equal(fit, "1");
    assert_string_equal(f.log, "tcpltcpp");
}

/* A request the budget could never hold evicts nothing: SH_ERANGE. */
static void test_too_big_evicts_nothing(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 50 * MB;
    f.can[0] = f.can[2] = 100 * MB;
    assert_int_equal(make_room(101), SH_ERANGE);
    assert_string_equal(f.log, "");
    assert_int_equal(f.dev, 50 * MB);
    /* auto watermarks: never more than fits beside what is held outside */
    start(0, 0);
    f.outside = 20 * MB;
    f.can[2] = 100 * MB;
    assert_int_equal(make_room(80), SH_ERANGE); /* 100 - 20 - one granule = 79 */
    assert_string_equal(f.log, "");
}

/* Auto: the limit is what fits beside the memory outside the pool, less a
 * granule, and eviction makes room for the request only. */
static void test_auto_watermarks(void **state)
{
    (void)state;
    start(0, 0);
    f.outside = 10 * MB;
    f.dev = 80 * MB;
    assert_int_equal(sh_engine_limit(&e, f.dev), 89 * MB);
    assert_int_equal(sh_engine_reserve(&e, f.dev), 11 * MB);
    f.can[2] = 100 * MB;
    assert_int_equal(make_room(9), SH_OK); /* 89 MB: at the limit, no eviction */
    assert_string_equal(f.log, "");
    assert_int_equal(make_room(12), SH_OK); /* 92 MB: 3 MB over */
    assert_int_equal(f.dev, 77 * MB);
    /* without the driver's view, the budget */
    f.no_info = 1;
    assert_int_equal(sh_engine_limit(&e, f.dev), 100 * MB);
    /* set watermarks: no reserve */
    start(80, 60);
    assert_int_equal(sh_engine_reserve(&e, 0), 0);
    assert_int_equal(sh_engine_limit(&e, 0), 80 * MB);
}

/* The planner's estimate asks the driver only when told to, or when it
 * never did; making room always asks, and the estimate takes that. */
static void test_reserve_recent(void **state)
{
    (void)state;
    start(0, 0);
    f.outside = 10 * MB;
    assert_int_equal(sh_engine_reserve_recent(&e, 0, 0), 11 * MB); /* never measured */
    assert_int_equal(f.infos, 1);
    f.outside = 20 * MB;
    assert_int_equal(sh_engine_reserve_recent(&e, 0, 0), 11 * MB); /* as last measured */
    assert_int_equal(f.infos, 1);
    assert_int_equal(sh_engine_reserve_recent(&e, 0, 1), 21 * MB);
    assert_int_equal(f.infos, 2);
    f.outside = 30 * MB;
    assert_int_equal(make_room(1), SH_OK); /* measures */
    assert_int_equal(f.infos, 3);
    assert_int_equal(sh_engine_reserve_recent(&e, 0, 0), 31 * MB);
    assert_int_equal(f.infos, 3);
    /* set watermarks: nothing to reserve, nothing asked */
    start(80, 60);
    assert_int_equal(sh_engine_reserve_recent(&e, 0, 1), 0);
    assert_int_equal(f.infos, 0);
}

/* A low watermark above the high one stops at the high one. */
static void test_low_above_high(void **state)
{
    (void)state;
    start(80, 90);
    f.dev = 80 * MB;
    f.can[2] = 100 * MB;
    assert_int_equal(make_room(5), SH_OK);
    assert_int_equal(f.asked[2], 5 * MB);
}

/* Eviction inside a stream capture would drain the device and break it:
 * it is put off and counted; the request goes on if the budget holds it. */
static void test_capture_defers(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 78 * MB;
    f.capturing = 1;
    f.can[0] = f.can[2] = 100 * MB;
    assert_int_equal(make_room(10), SH_OK); /* 88 of the 100 MB budget */
    assert_string_equal(f.log, "");
    assert_int_equal(atomic_load(&e.deferred), 1);
    assert_int_equal(make_room(30), SH_ENOMEM); /* 108: more than the budget */
    assert_int_equal(atomic_load(&e.deferred), 2);
    assert_int_equal(f.dev, 78 * MB);
}

/* Launches are recorded once the pool has held half its limit, and from
 * then on; with record_pct 0 from the start. The host side is told once,
 * at that moment (near_limit), and not by sh_engine_arm (a trace's). */
static void test_arming(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 30 * MB;
    assert_int_equal(make_room(9), SH_OK); /* 39 of 80 */
    assert_false(sh_engine_armed(&e));
    assert_int_equal(f.neared, 0);
    assert_int_equal(make_room(10), SH_OK); /* 40 of 80 */
    assert_true(sh_engine_armed(&e));
    assert_int_equal(f.neared, 1);
    f.dev = 0;
    assert_int_equal(make_room(1), SH_OK);
    f.dev = 70 * MB;
    assert_int_equal(make_room(1), SH_OK);
    assert_true(sh_engine_armed(&e)); /* for good */
    assert_int_equal(f.neared, 1);    /* once */
    struct sh_engine_cfg cfg = e.cfg;
    sh_engine_destroy(&e);
    cfg.record_pct = 0;
    sh_engine_init(&e, &cfg, &ops, NULL);
    assert_true(sh_engine_armed(&e));
    sh_engine_destroy(&e);
    cfg.record_pct = 50;
    sh_engine_init(&e, &cfg, &ops, NULL);
    assert_false(sh_engine_armed(&e));
    sh_engine_arm(&e);
    assert_true(sh_engine_armed(&e));
    f.neared = 0;
    f.dev = 10 * MB;
    assert_int_equal(make_room(1), SH_OK); /* armed by a trace, far below: not near */
    assert_int_equal(f.neared, 0);
    f.dev = 50 * MB;
    assert_int_equal(make_room(1), SH_OK);
    assert_int_equal(f.neared, 1);
}

/* The hints as the policy gives them, watermarks in MB. */
static void hint(size_t high_mb, size_t low_mb, int d2h, int h2d)
{
    struct sh_policy_hints h = {.high_watermark = high_mb * MB,
                                .low_watermark = low_mb * MB,
                                .max_inflight_d2h = d2h,
                                .max_inflight_h2d = h2d};
    sh_engine_hints(&e, &h);
}

/* The Conductor's backward pressure lowers both watermarks: eviction starts
 * at the hinted high one and goes down to the hinted low one; what may be
 * held (the budget) is unchanged. */
static void test_hinted_watermarks(void **state)
{
    (void)state;
    start(80, 60);
    f.dev = 70 * MB;
    f.can[2] = 100 * MB;
    assert_int_equal(make_room(5), SH_OK); /* 75 of 80: nothing */
    assert_string_equal(f.log, "");
    hint(70, 50, 2, 4);
    assert_int_equal(make_room(5), SH_OK); /* 75 over 70: down to 50 */
    assert_string_equal(f.log, "tcp");
    assert_int_equal(f.asked[0], 25 * MB);
    assert_int_equal(f.dev, 45 * MB);
    /* the hints as configured (no rule fired) change nothing */
    start(80, 60);
    hint(80, 60, 2, 4);
    f.dev = 78 * MB;
    f.can[2] = 100 * MB;
    assert_int_equal(make_room(10), SH_OK);
    assert_int_equal(f.asked[0], 28 * MB);
}

/* Hints never raise what the configuration sets. */
static void test_hints_never_raise(void **state)
{
    (void)state;
    start(80, 60);
    hint(95, 90, 8, 8);
    f.dev = 78 * MB;
    f.can[2] = 100 * MB;
    assert_int_equal(make_room(10), SH_OK); /* 88 over 80: down to 60 */
    assert_int_equal(f.asked[0], 28 * MB);
    unsigned d2h = 0, h2d = 0;
    sh_engine_caps(&e, &d2h, &h2d);
    assert_int_equal(d2h, 2);
    assert_int_equal(h2d, 4);
    assert_int_equal(f.caps_set, 0); /* nothing changed */
}

/* The copy caps in force: the configured ones until a hint lowers one
 * (optimizer protection), told to the ops once per change, back when the
 * hint goes (a new step). */
static void test_hinted_caps(void **state)
{
    (void)state;
    start(80, 60);
    unsigned d2h = 0, h2d = 0;
    sh_engine_caps(&e, &d2h, &h2d);
    assert_int_equal(d2h, 2);
    assert_int_equal(h2d, 4);
    hint(80, 60, 2, 1);
    sh_engine_caps(&e, &d2h, &h2d);
    assert_int_equal(h2d, 1);
    assert_int_equal(f.caps_set, 1);
    assert_int_equal(f.caps[0], 2);
    assert_int_equal(f.caps[1], 1);
    hint(80, 60, 2, 1);
    assert_int_equal(f.caps_set, 1); /* unchanged: not told again */
    hint(80, 60, 2, 4);
    assert_int_equal(f.caps_set, 2);
    assert_int_equal(f.caps[1], 4);
    hint(80, 60, 0, 0); /* no cap given: the configured ones */
    sh_engine_caps(&e, &d2h, &h2d);
    assert_int_equal(d2h, 2);
    assert_int_equal(h2d, 4);
    assert_int_equal(f.caps_set, 2);
}

/* ---- a decision point (plan.c), over a real policy ---- */

static struct sh_policy *policy_with_caps(int h2d, int d2h)
{
    struct sh_policy_params q = {.kind = SH_POLICY_LRU,
                                 .budget_bytes = 100 * MB,
                                 .high_watermark = 80 * MB,
                                 .low_watermark = 60 * MB,
                                 .prefetch_window = 4,
                                 .prefetch_enabled = 1,
                                 .max_inflight_h2d = h2d,
                                 .max_inflight_d2h = d2h,
                                 .batch_max = 4};
    struct sh_policy *p = NULL;
    assert_int_equal(sh_policy_create(&q, &p), 0);
    return p;
}

static int plan_once(struct sh_policy *p, const struct sh_engine_plan_in *in, size_t room,
                     struct sh_policy_plan *plan, int *changed)
{
    static uint64_t fetch[8], evict[8];
    *plan = (struct sh_policy_plan){
        .fetch = fetch, .fetch_max = room, .evict = evict, .evict_max = room};
    struct sh_policy_hints h;
    int due = sh_engine_plan(&e, p, in, NULL, 0, plan, &h, changed);
    if (due >= 0) {
        assert_int_equal(h.max_inflight_h2d, 3);
        assert_int_equal(h.max_inflight_d2h, 2);
    }
    return due;
}

/* The plan may start no more copies than the hints leave slots for, nor
 * more than its arrays hold; the hints reach the engine (its caps) once,
 * when they change. */
static void test_plan_slots_and_hints(void **state)
{
    (void)state;
    start(80, 60);
    struct sh_policy *p = policy_with_caps(3, 2);
    struct sh_policy_plan plan;
    int changed = -1;
    struct sh_engine_plan_in in = {.dev = 10 * MB, .fetching = 1, .evicting = 0};
    assert_true(plan_once(p, &in, 8, &plan, &changed) >= 0);
    assert_int_equal(changed, 1);
    assert_int_equal(plan.fetch_max, 2); /* 3 allowed, 1 busy */
    assert_int_equal(plan.evict_max, 2);
    unsigned d2h = 0, h2d = 0;
    sh_engine_caps(&e, &d2h, &h2d);
    assert_int_equal(h2d, 3); /* the policy's, below the configured 4 */
    assert_int_equal(d2h, 2);
    assert_int_equal(f.caps_set, 1);
    in = (struct sh_engine_plan_in){.dev = 11 * MB, .fetching = 3, .evicting = 5};
    assert_true(plan_once(p, &in, 8, &plan, &changed) >= 0);
    assert_int_equal(changed, 0);
    assert_int_equal(plan.fetch_max, 0); /* all busy, or more */
    assert_int_equal(plan.evict_max, 0);
    assert_int_equal(f.caps_set, 1);
    in = (struct sh_engine_plan_in){.dev = 12 * MB};
    assert_true(plan_once(p, &in, 1, &plan, &changed) >= 0);
    assert_int_equal(plan.fetch_max, 1); /* the arrays' room */
    assert_int_equal(plan.evict_max, 1);
    sh_policy_destroy(p);
}

/* A decision point whose inputs are those of one that found nothing is
 * skipped; one that reads anything new is not. */
static void test_plan_idle_skipped(void **state)
{
    (void)state;
    start(80, 60);
    struct sh_policy *p = policy_with_caps(3, 2);
    struct sh_policy_plan plan;
    int changed;
    const struct sh_engine_plan_in in = {.dev = 10 * MB};
    assert_int_equal(plan_once(p, &in, 8, &plan, &changed), 0); /* nothing planned, none due */
    assert_int_equal(plan.nfetch + plan.nevict, 0);
    assert_int_equal(plan_once(p, &in, 8, &plan, &changed), SH_EBUSY);
    assert_int_equal(plan_once(p, &in, 8, &plan, &changed), SH_EBUSY);
    const struct sh_engine_plan_in more = {.dev = 20 * MB};
    assert_true(plan_once(p, &more, 8, &plan, &changed) >= 0);
    const struct sh_engine_plan_in fetched = {.dev = 20 * MB, .fetching = 1, .fetched = 1};
    assert_true(plan_once(p, &fetched, 8, &plan, &changed) >= 0);
    sh_policy_destroy(p);
}

/* ---- a decision point carried out (decide.c) ---- */

/* What a plan chose starts evictions first, then fetches, then the commit
 * when due; a move that fails stops the rest. */
static void test_start_order(void **state)
{
    (void)state;
    start(80, 60);
    uint64_t ev[2] = {1, 2}, fe[1] = {3};
    struct sh_policy_plan plan = {.evict = ev, .nevict = 2, .fetch = fe, .nfetch = 1};
    assert_int_equal(sh_engine_start(&e, &plan, 1), 0);
    assert_string_equal(f.moves, "EFP");
    assert_int_equal(f.started_evict, 2);
    assert_int_equal(f.started_fetch, 1);
    memset(f.moves, 0, sizeof f.moves);
    assert_int_equal(sh_engine_start(&e, &plan, 0), 0);
    assert_string_equal(f.moves, "EF"); /* not due: no commit */
    memset(f.moves, 0, sizeof f.moves);
    struct sh_policy_plan none = {0};
    assert_int_equal(sh_engine_start(&e, &none, 1), 0);
    assert_string_equal(f.moves, "P"); /* nothing chosen, a commit due */
    memset(f.moves, 0, sizeof f.moves);
    f.fail = 'E';
    assert_true(sh_engine_start(&e, &plan, 1) != 0);
    assert_string_equal(f.moves, "E");
}

static int decide(struct sh_policy *p)
{
    static uint64_t fetch[8], evict[8];
    struct sh_policy_plan plan = {.fetch = fetch, .fetch_max = 8, .evict = evict, .evict_max = 8};
    memset(f.moves, 0, sizeof f.moves);
    return sh_engine_decide(&e, p, NULL, 0, &plan);
}

/* Finished early evictions are committed before the pool is read, so the
 * room they free is the plan's; the policy is locked around the plan
 * only; the hints go on when they change; an idle plan starts nothing. */
static void test_decide_commits_first(void **state)
{
    (void)state;
    start(80, 60);
    struct sh_policy *p = policy_with_caps(3, 2);
    f.in = (struct sh_engine_plan_in){.dev = 10 * MB};
    f.ready = 2;
    assert_int_equal(decide(p), 0);
    assert_string_equal(f.moves, "rCRLUH"); /* first plan: the hints are new */
    assert_int_equal(decide(p), 0);
    assert_string_equal(f.moves, "rRLU"); /* idle: nothing started */
    f.ready = 1;
    f.fail = 'C';
    assert_int_equal(decide(p), SH_EINVAL);
    assert_string_equal(f.moves, "rC"); /* a failed commit stops it */
    sh_policy_destroy(p);
}

/* A batch of finished fetches is committed when the plan says it is due
 * ([transfer] batch_max, 4 here), not before. */
static void test_decide_commits_a_batch(void **state)
{
    (void)state;
    start(80, 60);
    struct sh_policy *p = policy_with_caps(3, 2);
    f.in = (struct sh_engine_plan_in){.dev = 10 * MB, .fetching = 3, .fetched = 3};
    assert_int_equal(decide(p), 0);
    assert_null(strchr(f.moves, 'P'));
    f.in.fetched = 4;
    assert_int_equal(decide(p), 0);
    assert_int_equal(f.moves[strlen(f.moves) - 1], 'P');
    sh_policy_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_room_below_the_watermark, teardown),
        cmocka_unit_test_teardown(test_chain_order_and_stop, teardown),
        cmocka_unit_test_teardown(test_chosen_last_then_enomem, teardown),
        cmocka_unit_test_teardown(test_land_only_when_short, teardown),
        cmocka_unit_test_teardown(test_goal_read_again, teardown),
        cmocka_unit_test_teardown(test_resident_all, teardown),
        cmocka_unit_test_teardown(test_resident_those_that_fit, teardown),
        cmocka_unit_test_teardown(test_resident_after_landing, teardown),
        cmocka_unit_test_teardown(test_too_big_evicts_nothing, teardown),
        cmocka_unit_test_teardown(test_auto_watermarks, teardown),
        cmocka_unit_test_teardown(test_reserve_recent, teardown),
        cmocka_unit_test_teardown(test_low_above_high, teardown),
        cmocka_unit_test_teardown(test_capture_defers, teardown),
        cmocka_unit_test_teardown(test_arming, teardown),
        cmocka_unit_test_teardown(test_hinted_watermarks, teardown),
        cmocka_unit_test_teardown(test_hints_never_raise, teardown),
        cmocka_unit_test_teardown(test_hinted_caps, teardown),
        cmocka_unit_test_teardown(test_plan_slots_and_hints, teardown),
        cmocka_unit_test_teardown(test_plan_idle_skipped, teardown),
        cmocka_unit_test_teardown(test_start_order, teardown),
        cmocka_unit_test_teardown(test_decide_commits_first, teardown),
        cmocka_unit_test_teardown(test_decide_commits_a_batch, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
