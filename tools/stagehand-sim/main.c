/* main.c — stagehand-sim: replays an access trace (or a generated one)
 * through the policy against a model of VRAM and PCIe, and prints one line
 * per policy. `stagehand-sim --help` lists the options; docs/POLICY.md
 * explains the model and the output.
 *
 * No shared state.
 */
#include "tools/stagehand-sim/sim.h"

#include "clean/clean.h"
#include "config/config.h"
#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_clock.h"
#include "sh_err.h"

#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"reactive", "lru", "learned", "belady"};

static void usage(FILE *f)
{
    fputs("usage: stagehand-sim (--trace FILE | --gen [shape]) [model] [--policy P]\n"
          "\n"
          "  --trace FILE         replay a recorded trace (docs/TRACE.md)\n"
          "  --gen                generate a transformer training trace:\n"
          "    --blocks N (24)  --weight-mb X (200)  --act-mb X (150)  --grad-mb X (200)\n"
          "    --optim-mb X (2 x grad)  --compute-ms X (8, forward of a block; backward 2x)\n"
          "    --lora [--lora-mb X (weight/64)]  --checkpointing [--ckpt-mb X (act/8)]\n"
          "    --steps N (3)  --marks (the program marks steps and phases)\n"
          "    --eval-every N (0)  every N-th step evaluates: forward only\n"
          "  --write FILE         save the trace replayed\n"
          "model:\n"
          "  --vram-gb X | --oversub X   VRAM size, or footprint / X (default 2.0)\n"
          "  --pcie-gbps X (25)   per direction, GB/s (1e9 bytes)\n"
          "  --d2h-gbps X (the --pcie-gbps rate)  device to host alone\n"
          "  --duplex full|shared (full)   shared: both directions share one link\n"
          "  --remap-us X (20)    each remap window     --map-us X (20) per chunk committed\n"
          "  --default-us X (10)  launches with no duration in the trace\n"
          "  --hbm-gbps X (2000)  device memory bandwidth, GB/s: what a fingerprint of a\n"
          "                       region costs ([policy] clean_skip), and the generated\n"
          "                       optimizer's kernels\n"
          "  --prefilter-gbps X (the --hbm-gbps rate)  what the pointer prefilter reads\n"
          "                       each evicted region at, in its window\n"
          "  --own-kb X (64)      device memory the library itself holds from its first\n"
          "                       eviction (fingerprint and prefilter buffers)\n"
          "  --granule-mb X (2)   the card's allocation granule: with the watermarks auto,\n"
          "                       the room kept free beside the pool\n"
          "  --config FILE        stagehand.ini for [budget] [transfer] [policy] [conductor]\n"
          "  --ignore-marks       the policy finds the steps itself, as for a program that marks\n"
          "                       none (the trace's marks still delimit the steps measured)\n"
          "  --no-conductor       turn the Conductor rules off\n"
          "  --policy all|reactive|lru|learned|belady (all)\n"
          "  --header             print a '#' line describing the trace and the bound\n"
          "  --verbose            per-step figures on stderr; repeat for the policy's state,\n"
          "                       stalls and allocation waits, every copy, and consistency\n"
          "                       checks\n"
          "  --bench-writer N     time N launch records through the trace writer\n",
          f);
}

struct opts {
    const char *trace, *write, *config;
    int gen, header, verbose, no_conductor, ignore_marks;
    struct gen_params g;
    double vram_gb, oversub, pcie_gbps, d2h_gbps, remap_us, map_us, default_us;
    double prefilter_gbps; /* 0: hbm_gbps */
    double own_kb, granule_mb;
    int shared;
    int policy; /* -1 = all */
    long bench_writer;
};

enum {
    O_TRACE = 256,
    O_GEN,
    O_WRITE,
    O_BLOCKS,
    O_WEIGHT,
    O_ACT,
    O_GRAD,
    O_OPTIM,
    O_COMPUTE,
    O_LORA,
    O_LORA_MB,
    O_CKPT,
    O_CKPT_MB,
    O_STEPS,
    O_MARKS,
    O_VRAM,
    O_OVERSUB,
    O_PCIE,
    O_D2H,
    O_DUPLEX,
    O_REMAP,
    O_MAP,
    O_DEFAULT,
    O_CONFIG,
    O_NOCOND,
    O_POLICY,
    O_HEADER,
    O_VERBOSE,
    O_BENCHW,
    O_EVAL,
    O_NOMARKS,
    O_HBM,
    O_PREFILTER,
    O_OWN,
    O_GRANULE,
    O_HELP
};

static const struct option longopts[] = {
    {"trace", required_argument, 0, O_TRACE},
    {"gen", no_argument, 0, O_GEN},
    {"write", required_argument, 0, O_WRITE},
    {"blocks", required_argument, 0, O_BLOCKS},
    {"weight-mb", required_argument, 0, O_WEIGHT},
    {"act-mb", required_argument, 0, O_ACT},
    {"grad-mb", required_argument, 0, O_GRAD},
    {"optim-mb", required_argument, 0, O_OPTIM},
    {"compute-ms", required_argument, 0, O_COMPUTE},
    {"lora", no_argument, 0, O_LORA},
    {"lora-mb", required_argument, 0, O_LORA_MB},
    {"checkpointing", no_argument, 0, O_CKPT},
    {"ckpt-mb", required_argument, 0, O_CKPT_MB},
    {"steps", required_argument, 0, O_STEPS},
    {"marks", no_argument, 0, O_MARKS},
    {"vram-gb", required_argument, 0, O_VRAM},
    {"oversub", required_argument, 0, O_OVERSUB},
    {"pcie-gbps", required_argument, 0, O_PCIE},
    {"d2h-gbps", required_argument, 0, O_D2H},
    {"duplex", required_argument, 0, O_DUPLEX},
    {"remap-us", required_argument, 0, O_REMAP},
    {"map-us", required_argument, 0, O_MAP},
    {"default-us", required_argument, 0, O_DEFAULT},
    {"config", required_argument, 0, O_CONFIG},
    {"no-conductor", no_argument, 0, O_NOCOND},
    {"policy", required_argument, 0, O_POLICY},
    {"header", no_argument, 0, O_HEADER},
    {"verbose", no_argument, 0, O_VERBOSE},
    {"bench-writer", required_argument, 0, O_BENCHW},
    {"eval-every", required_argument, 0, O_EVAL},
    {"ignore-marks", no_argument, 0, O_NOMARKS},
    {"hbm-gbps", required_argument, 0, O_HBM},
    {"prefilter-gbps", required_argument, 0, O_PREFILTER},
    {"own-kb", required_argument, 0, O_OWN},
    {"granule-mb", required_argument, 0, O_GRANULE},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

static int parse_policy(const char *s, int *out)
{
    if (strcmp(s, "all") == 0) {
        *out = -1;
        return 0;
    }
    for (int k = 0; k < 4; k++) {
        if (strcmp(s, kind_names[k]) == 0) {
            *out = k;
            return 0;
        }
    }
    fprintf(stderr, "stagehand-sim: --policy: expected all, reactive, lru, learned or belady\n");
    return -1;
}

/* Each numeric option: where it goes, its range, and whether it counts things.
 * The ranges keep every time the replay computes in nanoseconds within 64 bits. */
struct numopt {
    int c;
    double lo, hi;
    int whole;
    size_t off; /* offset of the double (or int, when whole) in struct opts */
};

#define OFF(f) offsetof(struct opts, f)
static const struct numopt numopts[] = {
    {O_BLOCKS, 1, 100000, 1, OFF(g.blocks)},
    {O_STEPS, 1, 10000, 1, OFF(g.steps)},
    {O_WEIGHT, 0.001, 1e7, 0, OFF(g.weight_mb)},
    {O_ACT, 0.001, 1e7, 0, OFF(g.act_mb)},
    {O_GRAD, 0.001, 1e7, 0, OFF(g.grad_mb)},
    {O_OPTIM, 0, 1e7, 0, OFF(g.optim_mb)},
    {O_COMPUTE, 0.001, 1e6, 0, OFF(g.compute_ms)},
    {O_LORA_MB, 0, 1e7, 0, OFF(g.lora_mb)},
    {O_CKPT_MB, 0, 1e7, 0, OFF(g.ckpt_mb)},
    {O_VRAM, 0.001, 1e6, 0, OFF(vram_gb)},
    {O_OVERSUB, 0.01, 1000, 0, OFF(oversub)},
    {O_PCIE, 0.001, 1e5, 0, OFF(pcie_gbps)},
    {O_D2H, 0.001, 1e5, 0, OFF(d2h_gbps)},
    {O_REMAP, 0, 1e6, 0, OFF(remap_us)},
    {O_MAP, 0, 1e6, 0, OFF(map_us)},
    {O_DEFAULT, 0, 1e6, 0, OFF(default_us)},
    {O_EVAL, 0, 10000, 1, OFF(g.eval_every)},
    {O_BENCHW, 1, 1e9, 1, OFF(bench_writer)},
    {O_HBM, 0.001, 1e6, 0, OFF(g.hbm_gbps)},
    {O_PREFILTER, 0.001, 1e6, 0, OFF(prefilter_gbps)},
    {O_OWN, 0, 1e9, 0, OFF(own_kb)},
    {O_GRANULE, 0, 1e6, 0, OFF(granule_mb)},
};

/* One option with a numeric argument into the right field; the message names
 * the option and its range. */
static int numeric(struct opts *o, int c, const char *a)
{
    const char *name = "?";
    for (const struct option *lo = longopts; lo->name; lo++)
        if (lo->val == c)
            name = lo->name;
    for (size_t i = 0; i < sizeof numopts / sizeof numopts[0]; i++) {
        const struct numopt *n = &numopts[i];
        if (n->c != c)
            continue;
        char *end;
        double v = strtod(a, &end);
        if (end == a || *end || !(v >= n->lo && v <= n->hi) || (n->whole && v != (long)v)) {
            fprintf(stderr, "stagehand-sim: --%s: expected %s in [%g, %g], got \"%s\"\n", name,
                    n->whole ? "a whole number" : "a number", n->lo, n->hi, a);
            return -1;
        }
        char *f = (char *)o + n->off;
        if (c == O_BENCHW)
            *(long *)(void *)f = (long)v;
        else if (n->whole)
            *(int *)(void *)f = (int)v;
        else
            *(double *)(void *)f = v;
        return 0;
    }
    return -1;
}

/* The generated run's length in nanoseconds must fit the replay's arithmetic. */
static int check_duration(const struct opts *o)
{
    double ns = (double)o->g.steps * o->g.blocks * 3.0 * o->g.compute_ms * 1e6;
    if (!o->gen || ns < 1e18)
        return 0;
    fprintf(stderr,
            "stagehand-sim: --compute-ms %g x --blocks %d x --steps %d: the run would last %.3g "
            "s, over the simulator's limit of 1e9 s\n",
            o->g.compute_ms, o->g.blocks, o->g.steps, ns / 1e9);
    return -1;
}

static int parse(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    gen_defaults(&o->g);
    o->oversub = 2.0;
    o->pcie_gbps = 25;
    o->remap_us = 20;
    o->map_us = 20;
    o->default_us = 10;
    o->own_kb = (double)(SH_CLEAN_DEVICE_BYTES >> 10);
    o->granule_mb = 2; /* the granule of CUDA's VMM on every GPU so far */
    o->policy = -1;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case O_TRACE:
            o->trace = optarg;
            break;
        case O_GEN:
            o->gen = 1;
            break;
        case O_WRITE:
            o->write = optarg;
            break;
        case O_CONFIG:
            o->config = optarg;
            break;
        case O_LORA:
            o->g.lora = 1;
            break;
        case O_CKPT:
            o->g.checkpointing = 1;
            break;
        case O_MARKS:
            o->g.marks = 1;
            break;
        case O_NOCOND:
            o->no_conductor = 1;
            break;
        case O_HEADER:
            o->header = 1;
            break;
        case O_NOMARKS:
            o->ignore_marks = 1;
            break;
        case O_VERBOSE:
            o->verbose++;
            break;
        case O_DUPLEX:
            o->shared = strcmp(optarg, "shared") == 0;
            rc = o->shared || strcmp(optarg, "full") == 0 ? 0 : -1;
            if (rc)
                fprintf(stderr, "stagehand-sim: --duplex: expected full or shared\n");
            break;
        case O_POLICY:
            rc = parse_policy(optarg, &o->policy);
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        case '?':
            return -1;
        default:
            rc = numeric(o, c, optarg);
            break;
        }
        if (rc)
            return -1;
    }
    if (optind != argc) {
        fprintf(stderr, "stagehand-sim: unexpected argument \"%s\"\n", argv[optind]);
        return -1;
    }
    if (check_duration(o))
        return -1;
    if (!o->bench_writer && !!o->trace == !!o->gen) {
        fprintf(stderr, "stagehand-sim: give --trace FILE or --gen\n");
        return -1;
    }
    return 0;
}

/* Times the writer on synthetic launches: the cost recording adds. */
static int bench_writer(long n, const char *path)
{
    char tmp[] = "/tmp/stagehand-sim-writer-XXXXXX";
    if (!path) {
        int fd = mkstemp(tmp);
        if (fd < 0)
            return 1;
        fclose(fdopen(fd, "w"));
        path = tmp;
    }
    struct sh_trace_writer *w;
    if (sh_trace_writer_open(path, "stagehand-sim --bench-writer", &w))
        return 1;
    uint64_t ids[4];
    uint64_t a = sh_clock_ns();
    int rc = 0;
    for (long i = 0; i < n && !rc; i++) {
        for (int j = 0; j < 4; j++)
            ids[j] = 1000 + (uint64_t)((i * 7 + j * 13) % 5000);
        rc = sh_trace_write_launch(w, (uint64_t)i * 37, 12 + (uint64_t)(i % 100), 7,
                                   0x7f00aa00u + (uint64_t)(i % 50), ids, 4, NULL);
    }
    uint64_t bytes = sh_trace_writer_bytes(w);
    rc |= sh_trace_writer_close(w);
    double ns = (double)(sh_clock_ns() - a);
    printf("writer: %ld launches (4 regions each), %.1f ns per launch, %.1f bytes per launch\n", n,
           ns / (double)n, (double)bytes / (double)n);
    if (path == tmp)
        remove(tmp);
    return rc ? 1 : 0;
}

static int load_params(const struct opts *o, uint64_t vram, struct sh_policy_params *pp,
                       struct sim_params *sp)
{
    struct sh_config cfg;
    char err[SH_CONFIG_ERR_MAX];
    sh_config_defaults(&cfg);
    if (o->config && sh_config_load_file(&cfg, o->config, err, sizeof err)) {
        fprintf(stderr, "stagehand-sim: %s\n", err);
        return -1;
    }
    /* Auto watermarks as the library runs them (engine/room.c): eviction
     * only when the next allocation or restore would not fit, and only as
     * much as it needs; the policy plans up to the budget. */
    sp->high_auto = cfg.budget.vram_high_watermark.is_auto;
    sp->low_auto = cfg.budget.vram_low_watermark.is_auto;
    if (sh_config_resolve(&cfg, vram, (uint64_t)1 << 40, err, sizeof err) ||
        sh_policy_params_from_config(&cfg, pp)) {
        /* The card's size comes from a flag or the trace: say so, or the key
         * named would look like the culprit. */
        fprintf(stderr, "stagehand-sim: %s; the simulated card has %.3f GB (%s)\n", err,
                (double)vram / 1e9, o->vram_gb > 0 ? "--vram-gb" : "footprint / --oversub");
        return -1;
    }
    if (o->no_conductor)
        pp->conductor_enabled = 0;
    sp->drain_copies = cfg.transfer.drain_mode == SH_CONFIG_DRAIN_DEVICE;
    sp->clean_skip = cfg.policy.clean_skip;
    return 0;
}

static int get_trace(const struct opts *o, struct sh_trace **t, char *desc, size_t desclen)
{
    if (o->gen) {
        int rc = gen_trace(&o->g, t, desc, desclen);
        if (rc)
            fprintf(stderr, "stagehand-sim: --gen: the shape is out of range\n");
        return rc;
    }
    char err[512];
    int rc = sh_trace_read(o->trace, t, err, sizeof err);
    if (rc)
        fprintf(stderr, "stagehand-sim: %s\n", err);
    snprintf(desc, desclen, "trace=%s", o->trace);
    return rc;
}

static int run_policies(const struct opts *o, const struct sh_trace *t, const char *desc)
{
    struct sim_shape shape;
    if (sim_shape_of(t, (uint64_t)(o->default_us * 1000), &shape)) {
        fprintf(stderr, "stagehand-sim: cannot measure the trace\n");
        return 1;
    }
    struct sim_params sp = {
        .pcie_bytes_per_s = o->pcie_gbps * 1e9,
        .d2h_bytes_per_s = (o->d2h_gbps > 0 ? o->d2h_gbps : o->pcie_gbps) * 1e9,
        .shared_link = o->shared,
        .remap_base_ns = (uint64_t)(o->remap_us * 1000),
        .map_ns = (uint64_t)(o->map_us * 1000),
        .default_ns = (uint64_t)(o->default_us * 1000),
        .hbm_bytes_per_s = o->g.hbm_gbps * 1e9,
        .prefilter_bytes_per_s = (o->prefilter_gbps > 0 ? o->prefilter_gbps : o->g.hbm_gbps) * 1e9,
        .verbose = o->verbose,
        .ignore_marks = o->ignore_marks,
    };
    sp.vram_bytes = o->vram_gb > 0 ? (uint64_t)(o->vram_gb * SIM_GIB)
                                   : (uint64_t)((double)shape.footprint / o->oversub);
    struct sh_policy_params pp;
    if (load_params(o, sp.vram_bytes, &pp, &sp))
        return 1;
    sp.chunk_bytes = 64ull << 20;
    sp.own_bytes = (uint64_t)(o->own_kb * 1024);
    sp.gran_bytes = (uint64_t)(o->granule_mb * (1 << 20));
    uint64_t unavoidable;
    double step_lb = sim_lower_bound(&shape, &sp, &unavoidable), seg_lb = 0;
    if (sim_segment_bound(t, &sp, &seg_lb)) {
        fprintf(stderr, "stagehand-sim: cannot bound the trace\n");
        return 1;
    }
    double lb = seg_lb > step_lb ? seg_lb : step_lb;
    if (o->header)
        printf("# %s footprint_gb=%.2f vram_gb=%.2f oversub=%.2f pcie_gbps=%g duplex=%s "
               "compute_s=%.4f unavoidable_bytes=%llu step_bound_s=%.4f segment_bound_s=%.4f\n",
               desc, (double)shape.footprint / SIM_GIB, (double)sp.vram_bytes / SIM_GIB,
               (double)shape.footprint / (double)sp.vram_bytes, o->pcie_gbps,
               o->shared ? "shared" : "full", shape.compute_s, (unsigned long long)unavoidable,
               step_lb, seg_lb);
    int failed = 0;
    for (int k = 0; k < 4; k++) {
        if (o->policy >= 0 && o->policy != k)
            continue;
        pp.kind = k;
        struct sim_result res;
        if (o->verbose)
            fprintf(stderr, "%s:\n", kind_names[k]);
        if (sim_run(t, &sp, &pp, &res)) {
            fprintf(stderr, "stagehand-sim: policy %s: %s\n", kind_names[k], res.error);
            failed = 1;
            continue;
        }
        printf("policy=%s step_s=%.4f lower_bound_s=%.4f ratio=%.3f h2d_bytes=%llu "
               "d2h_bytes=%llu stalls=%llu clean_evictions=%llu host_launches=%llu\n",
               kind_names[k], res.step_s, lb, res.step_s / lb, (unsigned long long)res.h2d_bytes,
               (unsigned long long)res.d2h_bytes, (unsigned long long)res.stalls,
               (unsigned long long)res.clean, (unsigned long long)res.host_launches);
        if (o->verbose)
            fprintf(stderr,
                    "  steady step: compute %.4f s, stall %.4f s, alloc waits %llu, windows "
                    "%llu, peak %.2f GiB, policy: %.0f ns per launch event, %.0f ns of "
                    "decisions per launch\n",
                    res.compute_s, res.stall_s, (unsigned long long)res.alloc_waits,
                    (unsigned long long)res.windows, (double)res.peak_bytes / SIM_GIB,
                    res.launch_ns_per_launch, res.policy_ns_per_launch);
    }
    return failed;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    if (o.bench_writer)
        return bench_writer(o.bench_writer, o.write);
    struct sh_trace *t;
    char desc[512];
    if (get_trace(&o, &t, desc, sizeof desc))
        return 1;
    if (o.write && sh_trace_save(t, o.write, desc)) {
        fprintf(stderr, "stagehand-sim: --write %s: %s\n", o.write,
                errno == ELOOP   ? "is a symbolic link; not following it"
                : errno == ENXIO ? "not a regular file"
                : errno == EPERM ? "owned by another user"
                                 : strerror(errno));
        sh_trace_destroy(t);
        return 1;
    }
    int rc = run_policies(&o, t, desc);
    sh_trace_destroy(t);
    return rc;
}
