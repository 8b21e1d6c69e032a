/* map.h — the project's one hash map: 64-bit keys to 32-bit values.
 *
 * Open addressing with linear probing, at most three quarters full. A
 * deletion moves the entries after it back into the hole (no tombstones),
 * so lookups stay short however many keys come and go. Every 64-bit key
 * is valid; SH_MAP_NONE is no value and cannot be stored. Lookups are
 * inline: the scheduler makes several on every launch.
 *
 * Not thread-safe: the caller serialises every call on one map. A map all
 * zero is empty and valid.
 */
#ifndef SH_MAP_H
#define SH_MAP_H

#include <stddef.h>
#include <stdint.h>

#define SH_MAP_NONE UINT32_MAX

struct sh_map {
    uint64_t *k;
    uint32_t *v; /* SH_MAP_NONE: an empty slot */
    size_t cap, n;
};

/* A 64-bit finaliser: keys that differ in any bit land apart. */
static inline uint64_t sh_map_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The value of key, or SH_MAP_NONE. */
static inline uint32_t sh_map_get(const struct sh_map *m, uint64_t key)
{
    if (!m->cap)
        return SH_MAP_NONE;
    size_t mask = m->cap - 1;
    for (size_t i = sh_map_mix(key) & mask;; i = (i + 1) & mask) {
        if (m->v[i] == SH_MAP_NONE)
            return SH_MAP_NONE;
        if (m->k[i] == key)
            return m->v[i];
    }
}

/* Inserts key -> v unless key is present; *out gets the value the map then
 * holds for key. 0, SH_EINVAL for v = SH_MAP_NONE, or SH_ENOMEM (the map
 * is unchanged). */
int sh_map_add(struct sh_map *m, uint64_t key, uint32_t v, uint32_t *out);
/* Inserts or replaces key -> v. 0, SH_EINVAL or SH_ENOMEM. */
int sh_map_set(struct sh_map *m, uint64_t key, uint32_t v);
/* Removes key; 1 when it was there, else 0. */
int sh_map_del(struct sh_map *m, uint64_t key);
/* Empties m, keeping its memory. */
void sh_map_clear(struct sh_map *m);
/* Empties m for about `want` keys: a map that one large burst grew gives
 * its memory back, so that clearing it does not cost that size every time. */
void sh_map_reset(struct sh_map *m, size_t want);
void sh_map_free(struct sh_map *m);

#endif
