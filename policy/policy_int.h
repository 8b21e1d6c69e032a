/* policy_int.h — the scheduler's insides (struct sh_policy and all it
 * holds), shared by the files that implement it (rules.c and the trace
 * files do without it). Nothing outside policy/ includes this. Functions
 * shared between the files carry the pol_ prefix (they are in the archive
 * tests and tools link, beside everyone else's names).
 *
 *   policy.c   creation, the events it is told (a launch: record.c), what it knows
 *   table.c    the u64 map, growing arrays, the region table and its counters
 *   predict.c  which region plays which recorded key; when it is used next
 *   record.c   recording steps, finding their boundaries, matching recordings,
 *              each launch (sh_policy_launch)
 *   plan.c     victims, prefetch and exchange planning
 *   future.c   the exact future, for belady
 *
 * Not thread-safe: the caller serialises every call (the library's lock).
 */
#ifndef SH_POLICY_INT_H
#define SH_POLICY_INT_H

#include "map/map.h"
#include "policy/policy.h"

#include <stddef.h>
#include <stdint.h>

#define NONE32         UINT32_MAX
#define FAR            UINT64_MAX
#define DEAD           (UINT64_MAX - 1) /* freed with no use left: no next use */
#define MAX_RECORDINGS 4
#define POS_LIMIT      ((int64_t)1 << 39) /* positional identities are |relpos| below this */
#define RIDX_LIMIT     ((uint32_t)1 << 23)
#define RECENT_BITS    8

typedef unsigned __int128 u128;

/* ---------------------------------------------------------------------- */
/* u64 -> u32 map without deletion (recordings, future), cleared per build */

/* ---------------------------------------------------------------------- */
/* regions */

struct region {
    uint64_t id;
    uint64_t bytes;
    uint64_t gpos;                    /* launches seen (all steps) when it was allocated */
    uint64_t aseq;                    /* allocation number (all steps) */
    uint64_t last_use;                /* launches seen at its last reference: LRU order */
    uint64_t seen;                    /* 1 + number of the launch that last referenced it */
    uint64_t mark;                    /* plan/victim stamp: needed or chosen in this pass */
    uint64_t vmark;                   /* plan stamp: chosen as a victim in this pass */
    uint64_t prot;                    /* protect stamp */
    int64_t alloc_step;               /* step that allocated it */
    int64_t use_step;                 /* step that `uses` counts */
    uint32_t uses;                    /* references in use_step */
    uint32_t ridx;                    /* allocations after it at its position; NONE32 until known */
    uint32_t key[MAX_RECORDINGS];     /* its key in each recording, */
    uint32_t key_gen[MAX_RECORDINGS]; /* valid while this is p->key_gen */
    uint32_t fut_off, fut_n, fut_cur; /* belady: its future uses */
    uint32_t fut_inc;                 /* belady: its incarnation; NONE32 when not in it */
    uint32_t dpos;                    /* 1 + its place in dset; 0 when not there */
    uint8_t state;                    /* table slot: 0 empty, 1 live, 2 deleted */
    uint8_t res;
    uint8_t cls;
    uint8_t freed;
    uint8_t kept;   /* keeps a host copy (sh_policy_kept) */
    uint8_t pinned; /* never moves again (sh_policy_pinned) */
    uint64_t wlast; /* the last position the plan's walk needs it at (with mark) */
    uint64_t dmark; /* plan stamp: counted as room a later plan makes (defer_room) */
};

/* An identity as recorded: id, allocation number, allocation position,
 * reverse index. The allocation number tells apart the regions that had
 * one id in turn (the pool gives a freed region's address to the next
 * allocation of its size, and the library's ids are addresses). */
struct ident {
    uint64_t id;
    uint64_t aseq;
    uint64_t gpos;
    uint32_t ridx;
};

/* ---------------------------------------------------------------------- */
/* recordings */

struct rkey {
    uint64_t id, aseq; /* the region that played it, for a role kept across steps */
    int64_t relpos;    /* allocation position relative to the step's start */
    uint32_t ridx;
    uint32_t positional; /* allocated in this step or the one before */
    uint64_t bytes;
    uint32_t use_off, nuse;
    uint32_t free_pos; /* NONE32: not freed within the step */
    uint32_t seen;     /* scratch while building */
    uint64_t walked;   /* a plan's walk allocated it: 2 * stamp + the step (0, 1) */
    /* The table slot of the region that plays it in this step ([0]) and the
     * next ([1]), as of a version and key generation: a plan's walk asks
     * for the same keys launch after launch while nothing changes. */
    struct {
        uint64_t version;
        uint32_t key_gen, slot;
    } memo[2];
};

struct recording {
    int used;
    uint64_t hits;   /* complete steps that followed it */
    uint32_t agreed; /* launches from its start that the step before ran too */
    uint64_t stamp;  /* larger = used more recently */
    uint64_t built;  /* p->rec_builds when it was built: which recording this is */
    uint32_t nl;     /* launches */
    uint64_t *kernel;
    uint32_t *loff, *lkey; /* launch i references lkey[loff[i]..loff[i+1]) */
    struct rkey *keys;
    uint32_t nkeys;
    uint32_t *uses;                /* by key: launch positions, ascending */
    uint32_t *aoff, *akey;         /* allocations at position q (before launch q), q = 0..nl */
    uint32_t *arec;                /* of those, how many (first) are freed within the step */
    uint32_t *foff, *fkey;         /* frees at position q */
    uint32_t bwd_start, opt_start; /* detected phases: launch positions */
    struct sh_map ids, pos;        /* allocation number -> key; pos_key() -> key */
    size_t cap_kernel, cap_loff, cap_lkey, cap_keys, cap_uses, cap_aoff, cap_akey, cap_arec,
        cap_foff, cap_fkey;
};

/* The step being recorded. */
struct rec_alloc {
    struct ident who;
    uint64_t bytes;
    uint32_t pos;
};
struct rec_free {
    struct ident who;
    uint32_t pos;
};
struct rec {
    uint64_t *kernel;
    uint32_t *loff;
    struct ident *lref;
    struct rec_alloc *allocs;
    struct rec_free *frees;
    size_t nl, nr, na, nf;
    size_t cap_kernel, cap_loff, cap_lref, cap_allocs, cap_frees;
    size_t open_from; /* allocs[open_from..na) still wait for their ridx */
};

/* Allocation positions of the current and previous step, to find the region
 * playing a recorded role. */
struct posent {
    uint64_t gpos;
    uint32_t ridx;
    uint64_t id, aseq;
};

/* ---------------------------------------------------------------------- */
/* the future (belady) */

/* Regions are named by incarnation: allocation number a of the future is
 * incarnation a, and a region that existed before it comes after them
 * all. An id the pool gives again to a later allocation is a new one. */
struct future {
    int set;
    uint64_t nl;
    uint64_t *loff;            /* launch refs (deduplicated) at linc[loff[q]..loff[q+1]) */
    uint32_t *linc;            /* incarnations */
    uint64_t *aoff, *abytes;   /* allocation bytes before launch q */
    uint64_t *foff;            /* frees before launch q: finc[foff[q]..foff[q+1]) */
    uint32_t *finc;            /* incarnations */
    uint64_t *inc_id;          /* the id of each incarnation */
    uint32_t ninc, nalloc;     /* incarnations; of them, allocations */
    uint32_t allocs_seen;      /* allocations the policy was told since */
    struct sh_map pre;         /* id -> incarnation of a region that existed before */
    uint64_t *use_pos;         /* launch positions, grouped by incarnation */
    uint32_t *use_off, *use_n; /* per incarnation */
};

/* ---------------------------------------------------------------------- */

struct victim {
    uint32_t slot;
    uint32_t group; /* 0 freed, 1 outside the window, 2 inside it */
    u128 score;     /* larger goes first */
};

struct sh_policy {
    struct sh_policy_params prm;
    struct sh_policy_rules *rules;

    struct region *tab;
    size_t cap, live, used; /* used counts deleted slots too */
    struct region *spare;   /* the last table, reused when the size stays */
    size_t spare_cap;
    uint32_t *dset; /* slots of the live regions on the device: the victims to consider */
    size_t ndset;   /* room for cap (cap_vic) */

    /* clocks */
    uint64_t glaunches; /* launches seen */
    uint64_t gallocs;
    uint64_t stamp;
    int64_t step;
    uint64_t step_start, prev_start; /* glaunches at this step's and the last one's start */
    uint32_t pos;                    /* launches in this step */
    int phase, marked_steps, marked_phases;
    uint32_t key_gen;

    /* step detection */
    int have_anchor;
    uint64_t anchor_kernel;
    uint64_t *anchor_ids, *anchor_bytes;
    uint64_t anchor_allocs; /* allocations made before the first launch */
    size_t anchor_n;
    struct {
        uint64_t sig; /* 0: empty */
        uint32_t pos;
    } * seen; /* step 0's launches by signature, and the last place of each, until its end is found
               */
    int step_mixed; /* this step ran another kernel than the anchor's, or used a
                       region older than the anchor: more than an init loop */
    int found_loop; /* a boundary has been detected */

    /* recording and matching */
    struct rec rec;
    struct recording recs[MAX_RECORDINGS];
    int cand[MAX_RECORDINGS];
    int ncand;
    int active;          /* recording followed, -1 for none */
    uint32_t agreed;     /* launches from this step's start that agreed with a recording */
    int align_rec;       /* the recording departed from, still run in order; -1: none */
    uint32_t align_q;    /* its next launch */
    uint32_t align_from; /* where the step departed from it */
    int align_skipped;   /* a block of it was skipped */
    int any_recording;
    uint64_t rec_stamp;
    uint64_t rec_builds;

    struct posent *cur_pos, *prev_pos;
    size_t ncur_pos, nprev_pos, cap_cur_pos, cap_prev_pos;
    struct sh_map posidx; /* pos_key(gpos, ridx) -> index: bit 31 = previous list */

    struct future fut;

    /* a plan that found nothing to do, and what it saw (sh_policy_plan) */
    uint64_t version; /* bumped by every event that can change a plan */
    uint64_t idle_until;
    struct plan_sig {
        uint64_t version, device_bytes;
        uint32_t key_gen;
        int active;
        uint64_t built; /* the active recording's */
        size_t fetch_max, evict_max;
        struct sh_policy_hints h;
    } idle_sig;
    int idle_h2d, idle_d2h; /* the busy slots told when it was found idle, */
    uint64_t idle_hgen;     /* and the hints' generation */
    /* the rules' inputs as last told (sh_policy_pressure, _slots) */
    uint64_t told_bytes;
    int told_h2d, told_d2h, told; /* told: both have been */

    /* accounting */
    uint64_t pending_d2h; /* bytes of regions whose eviction is in flight */
    struct sh_policy_stats st;

    /* table slots of ids launches named lately, by a hash of the id: checked
     * against the table, so never wrong, only missed */
    uint32_t recent[1 << RECENT_BITS];

    /* scratch */
    struct victim *vic;
    size_t cap_vic;
    uint64_t *dedup;
    size_t cap_dedup;
    struct region **dreg; /* the regions of dedup */
    size_t cap_dreg;
    uint32_t *scratch; /* building a recording */
    size_t cap_scratch;
    uint32_t *wanted; /* slots of the regions a plan's walk needs, on the device then */
    size_t nwanted, cap_wanted;
};

/* ---------------------------------------------------------------------- */
/* table.c */

int pol_reserve(void **arr, size_t *cap, size_t need, size_t elem);
/* The test inline: every launch reserves, and almost never grows. */
#define RESERVE(arr, cap, need)                                                                    \
    ((need) <= (cap) ? 0 : pol_reserve((void **)&(arr), &(cap), (need), sizeof *(arr)))

int pol_table_resize(struct sh_policy *p, size_t cap);
struct region *pol_table_insert(struct sh_policy *p, uint64_t id);
void pol_table_delete(struct sh_policy *p, struct region *r);
/* Sets r's residency, keeping dset. */
void pol_set_res(struct sh_policy *p, struct region *r, int res);
void pol_account_class(struct sh_policy *p, const struct region *r, int sign);

/* ---------------------------------------------------------------------- */
/* predict.c */

uint32_t pol_key_in(const struct sh_policy *p, const struct recording *rc, const struct region *r);
struct region *pol_region_for(const struct sh_policy *p, const struct recording *rc, uint32_t k,
                              uint64_t shift);
const uint32_t *pol_key_uses(const struct recording *rc, uint32_t k);
uint64_t pol_distance(struct sh_policy *p, struct region *r);
/* Launches until the recording frees the region's role; FAR: not this step. */
uint64_t pol_free_distance(struct sh_policy *p, struct region *r);

/* ---------------------------------------------------------------------- */
/* record.c */

void pol_set_phase(struct sh_policy *p, int phase);
int pol_boundary(struct sh_policy *p);

/* ---------------------------------------------------------------------- */
/* future.c */

void pol_future_free(struct future *f);
/* Belady: r, just allocated, takes its place in the future. */
void pol_future_alloc(struct sh_policy *p, struct region *r);
/* The live region that is incarnation inc, if it is now. */
struct region *pol_future_region(const struct sh_policy *p, uint32_t inc);

/* ---------------------------------------------------------------------- */
/* small helpers used across the files, inline: they sit on the paths
 * that every launch and every plan take */

/* The lookups every launch makes, inline in each file that makes them. */
static inline struct region *find(const struct sh_policy *p, uint64_t id)
{
    if (!p->cap)
        return NULL;
    size_t mask = p->cap - 1;
    for (size_t i = sh_map_mix(id) & mask;; i = (i + 1) & mask) {
        const struct region *r = &p->tab[i];
        if (r->state == 0)
            return NULL;
        if (r->state == 1 && r->id == id)
            return (struct region *)r;
    }
}

static inline uint64_t pos_key(int64_t relpos, uint32_t ridx)
{
    return ((uint64_t)(relpos + POS_LIMIT) << 23) | ridx;
}

static inline struct region *live_region(const struct sh_policy *p, uint64_t id)
{
    struct region *r = find(p, id);
    return r && !r->freed ? r : NULL;
}

/* The live region that is the allocation number aseq of id, if it still is. */
static inline struct region *live_incarnation(const struct sh_policy *p, uint64_t id, uint64_t aseq)
{
    struct region *r = live_region(p, id);
    return r && r->aseq == aseq ? r : NULL;
}

static inline uint32_t uses_now(const struct sh_policy *p, const struct region *r)
{
    return r->use_step == p->step ? r->uses : 0;
}

static inline int kind_is(const struct sh_policy *p, int kind)
{
    return p->prm.kind == kind;
}

static inline int following(const struct sh_policy *p)
{
    return p->active >= 0;
}

/* Whether next uses are known now (a matching recording, or the future). */
static inline int predicting(const struct sh_policy *p)
{
    if (kind_is(p, SH_POLICY_BELADY))
        return p->fut.set;
    if (kind_is(p, SH_POLICY_REACTIVE))
        return 0;
    return following(p);
}

/* pol_key_in() for recording number rec, cached per region until the key
 * generation moves on (every boundary, which is when recordings are built
 * and positions shift, and every change of the recording followed) or r's
 * identity changes: a launch's regions are matched against every
 * candidate, launch after launch. */
static inline uint32_t pol_key_in_rec(struct sh_policy *p, int rec, struct region *r)
{
    if (r->key_gen[rec] != p->key_gen) {
        r->key[rec] = pol_key_in(p, &p->recs[rec], r);
        r->key_gen[rec] = p->key_gen;
    }
    return r->key[rec];
}

static inline void pol_ident_of(const struct region *r, struct ident *w)
{
    w->id = r->id;
    w->aseq = r->aseq;
    w->gpos = r->gpos;
    w->ridx = r->ridx;
}

/* Forgets r's cached keys: its identity changed. */
static inline void pol_keys_stale(const struct sh_policy *p, struct region *r)
{
    for (int i = 0; i < MAX_RECORDINGS; i++)
        r->key_gen[i] = p->key_gen - 1;
}

#endif
