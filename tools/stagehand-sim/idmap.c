/* idmap.c — region id -> dense index, for the simulator's arrays.
 *
 * No shared state: one map per caller.
 */
#include "tools/stagehand-sim/sim.h"

#include "sh_err.h"

#include <stdlib.h>

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int idmap_grow(struct idmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *k = malloc(cap * sizeof *k);
    size_t *v = malloc(cap * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return SH_ENOMEM;
    }
    for (size_t i = 0; i < cap; i++)
        v[i] = SIZE_MAX;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->v[i] == SIZE_MAX)
            continue;
        size_t j = mix(m->k[i]) & (cap - 1);
        while (v[j] != SIZE_MAX)
            j = (j + 1) & (cap - 1);
        k[j] = m->k[i];
        v[j] = m->v[i];
    }
    free(m->k);
    free(m->v);
    m->k = k;
    m->v = v;
    m->cap = cap;
    return 0;
}

int idmap_put(struct idmap *m, uint64_t id, size_t v)
{
    if ((m->n + 1) * 2 > m->cap && idmap_grow(m))
        return SH_ENOMEM;
    size_t mask = m->cap - 1, i = mix(id) & mask;
    while (m->v[i] != SIZE_MAX && m->k[i] != id)
        i = (i + 1) & mask;
    if (m->v[i] == SIZE_MAX)
        m->n++;
    m->k[i] = id;
    m->v[i] = v;
    return 0;
}

size_t idmap_get(const struct idmap *m, uint64_t id)
{
    if (!m->cap)
        return SIZE_MAX;
    size_t mask = m->cap - 1;
    for (size_t i = mix(id) & mask;; i = (i + 1) & mask) {
        if (m->v[i] == SIZE_MAX)
            return SIZE_MAX;
        if (m->k[i] == id)
            return m->v[i];
    }
}

void idmap_free(struct idmap *m)
{
    free(m->k);
    free(m->v);
    m->k = NULL;
    m->v = NULL;
    m->cap = m->n = 0;
}
