/* gen.c — synthetic traces of transformer training: blocks of weights,
 * activations saved in forward and used again in backward (or recomputed
 * from checkpoints), gradients, and an optimizer step over every block.
 * Full fine-tune or LoRA. The shape is documented in docs/POLICY.md.
 *
 * No shared state.
 */
#include "tools/stagehand-sim/sim.h"

#include "policy/policy.h"
#include "policy/trace.h"
#include "sh_err.h"

#include <stdio.h>
#include <stdlib.h>

enum { K_FWD = 1, K_BWD, K_RECOMPUTE, K_LOSS, K_ADAM, K_EMBED };
#define STREAM 7

void gen_defaults(struct gen_params *g)
{
    g->blocks = 24;
    g->weight_mb = 200;
    g->act_mb = 150;
    g->grad_mb = 200;
    g->optim_mb = -1;
    g->lora_mb = -1;
    g->ckpt_mb = -1;
    g->compute_ms = 8;
    g->bwd_factor = 2;
    g->hbm_gbps = 2000;
    g->lora = 0;
    g->checkpointing = 0;
    g->steps = 3;
    g->marks = 0;
    g->eval_every = 0;
}

struct gen {
    struct sh_trace *t;
    uint64_t t_us;
    uint64_t next_id;
    int err;
};

static uint64_t mib(double mb)
{
    return (uint64_t)(mb * SIM_MIB + 0.5);
}

static void put(struct gen *g, struct sh_trace_event *e)
{
    e->t_us = g->t_us;
    if (!g->err)
        g->err = sh_trace_append(g->t, e);
}

static uint64_t g_alloc(struct gen *g, uint64_t bytes, int cls)
{
    uint64_t id = g->next_id++;
    struct sh_trace_event e = {
        .type = SH_TRACE_ALLOC, .id = id, .bytes = bytes, .stream = STREAM, .cls = cls};
    put(g, &e);
    return id;
}

static void g_free(struct gen *g, uint64_t id, int cls)
{
    struct sh_trace_event e = {.type = SH_TRACE_FREE, .id = id, .cls = cls};
    put(g, &e);
}

/* A launch of the regions ids[0..n), writing those whose bit is set in
 * `writes` (bit k: ids[k]) and only reading the others. */
static void g_launch(struct gen *g, uint64_t kernel, double us, const uint64_t *ids, size_t n,
                     unsigned writes)
{
    uint64_t dur = (uint64_t)(us + 0.5);
    if (dur == 0)
        dur = 1;
    uint8_t ro[8];
    for (size_t k = 0; k < n && k < sizeof ro; k++)
        ro[k] = !(writes >> k & 1);
    struct sh_trace_event e = {.type = SH_TRACE_LAUNCH,
                               .kernel = kernel,
                               .stream = STREAM,
                               .dur_us = dur,
                               .ids = ids,
                               .n = n,
                               .ro = ro};
    put(g, &e);
    g->t_us += dur;
}

static void g_mark(struct gen *g, int type, uint64_t step, int phase, int marked)
{
    struct sh_trace_event e = {.type = type, .step = step, .phase = phase, .marked = marked};
    put(g, &e);
}

/* Per-block regions that live for the whole run. */
struct block {
    uint64_t w, lora, state; /* weight; adapter (lora); optimizer state */
    uint64_t act, in_ckpt, grad;
};

struct shape {
    uint64_t w, act, grad, state, lora, ckpt;
    double fwd_us, bwd_us, opt_us;
};

/* Returns the last block's output. */
static uint64_t forward(struct gen *g, const struct gen_params *p, const struct shape *s,
                        struct block *b, uint64_t x)
{
    uint64_t in = x;
    for (int i = 0; i < p->blocks; i++) {
        uint64_t ids[5];
        size_t n = 0;
        ids[n++] = b[i].w;
        if (p->lora)
            ids[n++] = b[i].lora;
        ids[n++] = in;
        unsigned writes = 1u << n | 1u << (n + 1); /* the activations, the checkpoint */
        b[i].in_ckpt = in;
        b[i].act = g_alloc(g, s->act, SH_CLASS_TRANSIENT);
        ids[n++] = b[i].act;
        if (p->checkpointing) {
            uint64_t out = g_alloc(g, s->ckpt, SH_CLASS_TRANSIENT);
            ids[n++] = out;
            g_launch(g, K_FWD, s->fwd_us, ids, n, writes);
            g_free(g, b[i].act, SH_CLASS_TRANSIENT); /* recomputed in backward */
            b[i].act = 0;
            in = out;
        } else {
            g_launch(g, K_FWD, s->fwd_us, ids, n, writes);
            in = b[i].act;
        }
    }
    return in;
}

static void backward(struct gen *g, const struct gen_params *p, const struct shape *s,
                     struct block *b, uint64_t dy)
{
    for (int i = p->blocks - 1; i >= 0; i--) {
        uint64_t ids[7];
        size_t n = 0;
        if (p->checkpointing) {
            b[i].act = g_alloc(g, s->act, SH_CLASS_TRANSIENT);
            uint64_t rid[4] = {b[i].w, b[i].in_ckpt, b[i].act, p->lora ? b[i].lora : 0};
            g_launch(g, K_RECOMPUTE, s->fwd_us, rid, p->lora ? 4 : 3, 1u << 2);
        }
        b[i].grad = g_alloc(g, p->lora ? s->lora : s->grad, SH_CLASS_TRANSIENT);
        ids[n++] = b[i].w;
        if (p->lora)
            ids[n++] = b[i].lora;
        ids[n++] = b[i].act;
        ids[n++] = b[i].in_ckpt;
        unsigned writes = 1u << n; /* the gradient */
        ids[n++] = b[i].grad;
        ids[n++] = dy;
        g_launch(g, K_BWD, s->bwd_us, ids, n, writes);
        g_free(g, b[i].act, SH_CLASS_TRANSIENT);
        b[i].act = 0;
        /* the block's input is the previous block's output: free it with
         * the previous block, except the batch and checkpoints, freed here */
        if (p->checkpointing && i > 0)
            g_free(g, b[i].in_ckpt, SH_CLASS_TRANSIENT);
    }
}

static void optimizer(struct gen *g, const struct gen_params *p, const struct shape *s,
                      struct block *b)
{
    for (int i = 0; i < p->blocks; i++) {
        /* writes the weights (the adapter) and the state, reads the gradient */
        uint64_t ids[3] = {p->lora ? b[i].lora : b[i].w, b[i].grad, b[i].state};
        g_launch(g, K_ADAM, s->opt_us, ids, 3, 1u << 0 | 1u << 2);
    }
    for (int i = 0; i < p->blocks; i++)
        g_free(g, b[i].grad, SH_CLASS_TRANSIENT); /* zero_grad(set_to_none) */
}

/* Evaluation: forward only, each activation freed once the next block has
 * read it (no_grad keeps nothing for backward). */
static void eval_step(struct gen *g, const struct gen_params *p, const struct shape *s,
                      struct block *b, int step)
{
    g_mark(g, SH_TRACE_STEP, (uint64_t)step, 0, p->marks);
    uint64_t x = g_alloc(g, s->ckpt, SH_CLASS_TRANSIENT), in = x;
    for (int i = 0; i < p->blocks; i++) {
        uint64_t ids[5];
        size_t n = 0;
        ids[n++] = b[i].w;
        if (p->lora)
            ids[n++] = b[i].lora;
        ids[n++] = in;
        uint64_t out = g_alloc(g, s->act, SH_CLASS_TRANSIENT);
        ids[n++] = out;
        g_launch(g, K_FWD, s->fwd_us, ids, n, 1u << (n - 1));
        g_free(g, in, SH_CLASS_TRANSIENT);
        in = out;
    }
    g_free(g, in, SH_CLASS_TRANSIENT);
}

static void one_step(struct gen *g, const struct gen_params *p, const struct shape *s,
                     struct block *b, int step)
{
    if (p->eval_every > 0 && step % p->eval_every == p->eval_every - 1) {
        eval_step(g, p, s, b, step);
        return;
    }
    g_mark(g, SH_TRACE_STEP, (uint64_t)step, 0, p->marks);
    if (p->marks)
        g_mark(g, SH_TRACE_PHASE, 0, SH_PHASE_FORWARD, 1);
    uint64_t x = g_alloc(g, s->ckpt, SH_CLASS_TRANSIENT); /* the batch */
    uint64_t last = forward(g, p, s, b, x);
    uint64_t dy = g_alloc(g, s->ckpt, SH_CLASS_TRANSIENT);
    uint64_t lid[2] = {last, dy};
    g_launch(g, K_LOSS, s->fwd_us / 8, lid, 2, 1u << 1);
    if (p->checkpointing)
        g_free(g, last, SH_CLASS_TRANSIENT);
    if (p->marks)
        g_mark(g, SH_TRACE_PHASE, 0, SH_PHASE_BACKWARD, 1);
    backward(g, p, s, b, dy);
    g_free(g, dy, SH_CLASS_TRANSIENT);
    g_free(g, x, SH_CLASS_TRANSIENT);
    if (p->marks)
        g_mark(g, SH_TRACE_PHASE, 0, SH_PHASE_OPTIMIZER, 1);
    optimizer(g, p, s, b);
    if (p->marks)
        g_mark(g, SH_TRACE_PHASE, 0, SH_PHASE_STEP_END, 1);
}

static int check(const struct gen_params *p)
{
    if (p->blocks < 1 || p->blocks > 100000 || p->steps < 1 || p->steps > 10000)
        return SH_ERANGE;
    if (p->weight_mb <= 0 || p->act_mb <= 0 || p->grad_mb <= 0 || p->compute_ms <= 0 ||
        p->bwd_factor <= 0 || p->hbm_gbps <= 0)
        return SH_ERANGE;
    return 0;
}

int gen_trace(const struct gen_params *p, struct sh_trace **out, char *desc, size_t desclen)
{
    int rc = check(p);
    if (rc)
        return rc;
    struct shape s = {.w = mib(p->weight_mb), .act = mib(p->act_mb), .grad = mib(p->grad_mb)};
    s.lora = mib(p->lora_mb >= 0 ? p->lora_mb : p->weight_mb / 64);
    s.ckpt = mib(p->ckpt_mb >= 0 ? p->ckpt_mb : p->act_mb / 8);
    double trained = p->lora ? (double)s.lora : (double)s.grad;
    s.state = p->optim_mb >= 0 ? mib(p->optim_mb) : (uint64_t)(2 * trained);
    if (!s.lora || !s.ckpt || !s.state)
        return SH_ERANGE;
    s.fwd_us = p->compute_ms * 1000;
    s.bwd_us = s.fwd_us * p->bwd_factor;
    double touched = (p->lora ? 2.0 * (double)s.lora : (double)(s.w + s.grad)) + (double)s.state;
    s.opt_us = touched * 2 / (p->hbm_gbps * 1e9) * 1e6; /* read and write */
    struct block *b = calloc((size_t)p->blocks, sizeof *b);
    struct gen g = {.next_id = 1};
    if (!b || sh_trace_create(&g.t)) {
        free(b);
        return SH_ENOMEM;
    }
    static const char *const names[] = {
        "", "block_forward", "block_backward", "block_recompute", "loss", "adam_step"};
    for (int k = K_FWD; k <= K_ADAM; k++)
        if (!g.err)
            g.err = sh_trace_set_kernel_name(g.t, (uint64_t)k, names[k]);
    for (int i = 0; i < p->blocks; i++) {
        b[i].w = g_alloc(&g, s.w, SH_CLASS_PERSISTENT);
        if (p->lora)
            b[i].lora = g_alloc(&g, s.lora, SH_CLASS_PERSISTENT);
        b[i].state = g_alloc(&g, s.state, SH_CLASS_PERSISTENT);
    }
    for (int st = 0; st < p->steps; st++)
        one_step(&g, p, &s, b, st);
    free(b);
    if (g.err) {
        sh_trace_destroy(g.t);
        return g.err;
    }
    if (desc && desclen)
        snprintf(desc, desclen,
                 "blocks=%d weight_mb=%g act_mb=%g grad_mb=%g optim_mb=%.4g compute_ms=%g %s%s "
                 "steps=%d%s",
                 p->blocks, p->weight_mb, p->act_mb,
                 p->lora ? (double)s.lora / SIM_MIB : p->grad_mb, (double)s.state / SIM_MIB,
                 p->compute_ms, p->lora ? "lora" : "full", p->checkpointing ? " checkpointing" : "",
                 p->steps, p->eval_every ? " eval" : "");
    *out = g.t;
    return 0;
}
