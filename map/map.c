/* map.c — the hash map's updates (map.h).
 *
 * No shared state: each map is its caller's.
 */
#include "map/map.h"

#include "sh_err.h"

#include <stdlib.h>
#include <string.h>

void sh_map_clear(struct sh_map *m)
{
    for (size_t i = 0; i < m->cap; i++)
        m->v[i] = SH_MAP_NONE;
    m->n = 0;
}

void sh_map_free(struct sh_map *m)
{
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof *m);
}

void sh_map_reset(struct sh_map *m, size_t want)
{
    if (m->cap > 64 && m->cap > 8 * want)
        sh_map_free(m); /* the next insertion allocates again */
    else
        sh_map_clear(m);
}

/* The slot of key, or the empty slot where it would go. */
static size_t slot_of(const struct sh_map *m, uint64_t key)
{
    size_t mask = m->cap - 1, i = sh_map_mix(key) & mask;
    while (m->v[i] != SH_MAP_NONE && m->k[i] != key)
        i = (i + 1) & mask;
    return i;
}

static int rehash(struct sh_map *m, size_t cap)
{
    struct sh_map n = {.cap = cap};
    n.k = malloc(cap * sizeof *n.k);
    n.v = malloc(cap * sizeof *n.v);
    if (!n.k || !n.v) {
        sh_map_free(&n);
        return SH_ENOMEM;
    }
    sh_map_clear(&n);
    for (size_t i = 0; i < m->cap; i++)
        if (m->v[i] != SH_MAP_NONE) {
            size_t j = slot_of(&n, m->k[i]);
            n.k[j] = m->k[i];
            n.v[j] = m->v[i];
            n.n++;
        }
    sh_map_free(m);
    *m = n;
    return 0;
}

/* The slot for key, growing m first when one more key would pass 3/4. */
static int place(struct sh_map *m, uint64_t key, uint32_t v, size_t *at)
{
    if (v == SH_MAP_NONE)
        return SH_EINVAL;
    if ((m->n + 1) * 4 > m->cap * 3 && rehash(m, m->cap ? m->cap * 2 : 64))
        return SH_ENOMEM;
    *at = slot_of(m, key);
    return 0;
}

int sh_map_add(struct sh_map *m, uint64_t key, uint32_t v, uint32_t *out)
{
    size_t i;
    int rc = place(m, key, v, &i);
    if (rc)
        return rc;
    if (m->v[i] == SH_MAP_NONE) {
        m->k[i] = key;
        m->v[i] = v;
        m->n++;
    }
    *out = m->v[i];
    return 0;
}

int sh_map_set(struct sh_map *m, uint64_t key, uint32_t v)
{
    size_t i;
    int rc = place(m, key, v, &i);
    if (rc)
        return rc;
    m->n += m->v[i] == SH_MAP_NONE;
    m->k[i] = key;
    m->v[i] = v;
    return 0;
}

/* Backward-shift deletion: each entry after the hole that may move into it
 * (its home is not cyclically within (hole, its slot]) does, and leaves
 * its own slot as the next hole. */
int sh_map_del(struct sh_map *m, uint64_t key)
{
    if (!m->cap)
        return 0;
    size_t mask = m->cap - 1, hole = slot_of(m, key);
    if (m->v[hole] == SH_MAP_NONE)
        return 0;
    for (size_t i = (hole + 1) & mask; m->v[i] != SH_MAP_NONE; i = (i + 1) & mask) {
        size_t home = sh_map_mix(m->k[i]) & mask;
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            m->k[hole] = m->k[i];
            m->v[hole] = m->v[i];
            hole = i;
        }
    }
    m->v[hole] = SH_MAP_NONE;
    m->n--;
    return 1;
}
