/* resolve.c — percentages into bytes once the card's and the machine's memory
 * sizes are known, and the checks between keys (a watermark under the budget,
 * a chunk no larger than a slab, ...) and against the machine. A failed check
 * blames the key the user set, with the place that set it.
 *
 * No state: every function works on the caller's struct and buffers, so all of
 * it is reentrant.
 */
#include "config/config_int.h"
#include "node/node.h"
#include "sh_err.h"

#include <inttypes.h>
#include <stddef.h>

static uint64_t pct_base(const struct sh_config *cfg, enum pct_base b, uint64_t card, uint64_t host)
{
    switch (b) {
    case PCT_CARD:
        return card;
    case PCT_HOST:
        return host;
    case PCT_BUDGET:
        return cfg->budget.vram_budget.bytes;
    case PCT_HOST_BUDGET:
        return cfg->budget.host_ram_budget.bytes;
    default:
        return 0;
    }
}

static int resolve_size(struct sh_config *cfg, int k, uint64_t card, uint64_t host, char *err,
                        size_t errlen)
{
    static const char *const base_name[] = {"", "the card's memory size", "vram_budget_mb",
                                            "the machine's RAM size", "host_ram_budget_mb"};
    struct sh_size_opt *s = field_of(cfg, &sh_cfg_keys[k]);
    char msg[MSG_MAX];
    if (s->is_auto) { /* decided at run time, never above the budget */
        s->bytes = pct_base(cfg, sh_cfg_keys[k].pct, card, host);
        return 0;
    }
    if (s->is_pct) {
        uint64_t base = pct_base(cfg, sh_cfg_keys[k].pct, card, host);
        if (!base)
            return sh_cfg_blame(cfg, k, err, errlen, "a percentage needs %s, which is unknown",
                                base_name[sh_cfg_keys[k].pct]);
        s->bytes = (uint64_t)((double)base * s->pct / 100.0 + 0.5);
    }
    if (sh_cfg_check_range(&sh_cfg_keys[k], s->bytes, msg, sizeof msg) == 0)
        return 0;
    if (s->is_pct)
        return sh_cfg_blame(cfg, k, err, errlen, "%s, from %g%%", msg, s->pct);
    return sh_cfg_blame(cfg, k, err, errlen, "%s", msg);
}

/* Key value as a number: sizes in bytes, lists their largest item in bytes. */
static uint64_t key_number(const struct sh_config *cfg, int k, uint64_t *unit)
{
    const void *f = cfield_of(cfg, &sh_cfg_keys[k]);
    const struct sh_config_list *l = f;
    const int *i = f;
    uint64_t v = 0;
    *unit = sh_cfg_keys[k].type == T_INT ? 1 : sh_cfg_keys[k].unit;
    if (sh_cfg_keys[k].type == T_SIZE)
        return ((const struct sh_size_opt *)f)->bytes;
    if (sh_cfg_keys[k].type == T_INT)
        return (uint64_t)*i;
    for (uint32_t j = 0; j < l->n; j++)
        v = l->v[j] > v ? l->v[j] : v;
    return v * *unit;
}

/* Blames the explicit one of two keys: a unless only b was set by the user. */
static int blame_a(const struct sh_config *cfg, int a, int b)
{
    return !(cfg->origin_[a].src == SRC_DEFAULT && cfg->origin_[b].src != SRC_DEFAULT);
}

static int is_auto(const struct sh_config *cfg, int k)
{
    return sh_cfg_keys[k].type == T_SIZE &&
           ((const struct sh_size_opt *)cfield_of(cfg, &sh_cfg_keys[k]))->is_auto;
}

struct rel {
    int a, b; /* keys: a < b (strict) or a <= b */
    int strict;
};

static int check_rel(const struct sh_config *cfg, const struct rel *r, char *err, size_t errlen)
{
    int a = r->a, b = r->b;
    if (is_auto(cfg, a) || is_auto(cfg, b))
        return 0; /* an auto value keeps every relation by construction */
    uint64_t ua, ub, va = key_number(cfg, a, &ua), vb = key_number(cfg, b, &ub);
    char sa[40], sb[40];
    if (r->strict ? va < vb : va <= vb)
        return 0;
    sh_cfg_fmt_units(va, ua, sa, sizeof sa);
    sh_cfg_fmt_units(vb, ub, sb, sizeof sb);
    if (blame_a(cfg, a, b))
        return sh_cfg_blame(cfg, a, err, errlen, "must %s %s (%s %s %s)",
                            r->strict ? "be below" : "not exceed", sh_cfg_keys[b].name, sa,
                            r->strict ? ">=" : ">", sb);
    return sh_cfg_blame(cfg, b, err, errlen, "must %s %s (%s %s %s)",
                        r->strict ? "be above" : "be at least", sh_cfg_keys[a].name, sb,
                        r->strict ? "<=" : "<", sa);
}

static int check_machine(const struct sh_config *cfg, uint64_t card, uint64_t host, char *err,
                         size_t errlen)
{
    char a[40], b[40];
    uint64_t v = cfg->budget.vram_budget.bytes, h = cfg->budget.host_ram_budget.bytes;
    if (card && v > card) {
        sh_cfg_fmt_units(v, MB, a, sizeof a);
        sh_cfg_fmt_units(card, MB, b, sizeof b);
        return sh_cfg_blame(cfg, KEY_budget_vram_budget_mb, err, errlen,
                            "must not exceed the card's memory (%s > %s)", a, b);
    }
    if (host && h > host) {
        sh_cfg_fmt_units(h, MB, a, sizeof a);
        sh_cfg_fmt_units(host, MB, b, sizeof b);
        return sh_cfg_blame(cfg, KEY_budget_host_ram_budget_mb, err, errlen,
                            "must not exceed the machine's RAM (%s > %s)", a, b);
    }
    return 0;
}

static int check_slabs(struct sh_config *cfg, char *err, size_t errlen)
{
    int c = KEY_pool_pinned_pool_classes_mb, s = KEY_pool_slabs_per_class;
    struct sh_config_list *sl = &cfg->pool.slabs_per_class;
    uint32_t nc = cfg->pool.classes_mb.n, ns = sl->n;
    if (ns == 1) {
        for (uint32_t i = 1; i < nc; i++)
            sl->v[i] = sl->v[0];
        sl->n = nc;
        return 0;
    }
    if (ns == nc)
        return 0;
    if (blame_a(cfg, s, c))
        return sh_cfg_blame(cfg, s, err, errlen,
                            "has %" PRIu32 " values for %" PRIu32 " pinned_pool_classes_mb classes "
                            "(give one value, or one per class)",
                            ns, nc);
    return sh_cfg_blame(cfg, c, err, errlen,
                        "has %" PRIu32 " classes but slabs_per_class has %" PRIu32
                        " values (give one value, or one per class)",
                        nc, ns);
}

static const struct rel rels[] = {
    {KEY_budget_vram_high_watermark_mb, KEY_budget_vram_budget_mb, 0},
    {KEY_budget_vram_low_watermark_mb, KEY_budget_vram_high_watermark_mb, 1},
    {KEY_pool_prepin_mb, KEY_budget_host_ram_budget_mb, 0},
    {KEY_regions_max_chunk_mb, KEY_pool_pinned_pool_classes_mb, 0},
    {KEY_conductor_backward_prefetch_window, KEY_policy_prefetch_window, 0},
    {KEY_conductor_optimizer_max_inflight_h2d, KEY_transfer_max_inflight_h2d, 0},
};

/* [budget] host_ram_segment names a file in /dev/shm: a name that could
 * reach elsewhere stops the program at start. */
static int check_segment(const struct sh_config *cfg, char *err, size_t errlen)
{
    char buf[SH_NODE_NAME_MAX + 1];
    const char *why = NULL;
    if (sh_node_name(cfg->budget.host_ram_segment, buf, sizeof buf, &why) == 0)
        return 0;
    return sh_cfg_blame(cfg, KEY_budget_host_ram_segment, err, errlen, "\"%s\" %s",
                        cfg->budget.host_ram_segment, why);
}

/* A key whose value is known before the machine is: not a percentage. */
static int absolute(const struct sh_config *cfg, int k)
{
    return sh_cfg_keys[k].type != T_SIZE ||
           !((const struct sh_size_opt *)cfield_of(cfg, &sh_cfg_keys[k]))->is_pct;
}

/* Without the helper thread only prepin_mb is ever pinned: with none,
 * nothing could be evicted. A percentage is known once resolved. */
static int check_pinning(const struct sh_config *cfg, int resolved, char *err, size_t errlen)
{
    if (cfg->pool.grow_in_background || (!resolved && !absolute(cfg, KEY_pool_prepin_mb)) ||
        cfg->pool.prepin.bytes > 0)
        return 0;
    return sh_cfg_blame(cfg, KEY_pool_grow_in_background, err, errlen,
                        "is false and prepin_mb is 0: no host memory would ever be pinned, so "
                        "nothing could be evicted (set prepin_mb, or leave it true)");
}

/* The relations between keys that are both known at load time, so that a
 * contradiction written in the file stops the program before it starts. */
int sh_cfg_check_static(const struct sh_config *cfg, char *err, size_t errlen)
{
    if (check_segment(cfg, err, errlen) || check_pinning(cfg, 0, err, errlen))
        return SH_EINVAL;
    for (size_t i = 0; i < sizeof rels / sizeof rels[0]; i++)
        if (absolute(cfg, rels[i].a) && absolute(cfg, rels[i].b) &&
            check_rel(cfg, &rels[i], err, errlen))
            return SH_EINVAL;
    return 0;
}

int sh_config_resolve(struct sh_config *cfg, uint64_t card_bytes, uint64_t host_ram_bytes,
                      char *err, size_t errlen)
{
    struct sh_config tmp = *cfg;
    for (int i = 0; i < NKEYS; i++)
        if (sh_cfg_keys[i].type == T_SIZE &&
            resolve_size(&tmp, i, card_bytes, host_ram_bytes, err, errlen))
            return SH_EINVAL;
    if (check_machine(&tmp, card_bytes, host_ram_bytes, err, errlen))
        return SH_EINVAL;
    for (size_t i = 0; i < sizeof rels / sizeof rels[0]; i++)
        if (check_rel(&tmp, &rels[i], err, errlen))
            return SH_EINVAL;
    if (check_slabs(&tmp, err, errlen) || check_segment(&tmp, err, errlen) ||
        check_pinning(&tmp, 1, err, errlen))
        return SH_EINVAL;
    tmp.resolved = 1;
    *cfg = tmp;
    return 0;
}
