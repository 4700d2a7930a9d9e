/* ptr_map_impl.h: an open-addressing hash map from pointers to pointers (linear probing,
 * backward-shift deletion, no tombstones), for the allocators' "which block is this pointer"
 * lookups. Header-only, so the CUDA plugin's allocator uses the same code as the core's.
 * Not thread-safe: the owner locks. */
#ifndef CACCEL_PTR_MAP_IMPL_H
#define CACCEL_PTR_MAP_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct ca_ptr_map_slot {
    const void *key;              /* NULL: empty */
    void *val;
} ca_ptr_map_slot;

typedef struct ca_ptr_map {
    ca_ptr_map_slot *slots;       /* a power of two of them, at most half used */
    size_t nslots, nused;
} ca_ptr_map;

static inline size_t ca_ptr_map_hash(const void *p, size_t nslots) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (nslots - 1);
}

/* The slot holding key, or the empty slot where it would go. */
static inline size_t ca_ptr_map_probe(const ca_ptr_map *m, const void *key) {
    size_t i = ca_ptr_map_hash(key, m->nslots);
    while (m->slots[i].key && m->slots[i].key != key) i = (i + 1) & (m->nslots - 1);
    return i;
}

/* The value stored for key, or NULL. */
static inline void *ca_ptr_map_get(const ca_ptr_map *m, const void *key) {
    return m->nslots ? m->slots[ca_ptr_map_probe(m, key)].val : NULL;
}

static inline bool ca_ptr_map_grow(ca_ptr_map *m) {
    size_t n = m->nslots ? m->nslots * 2 : 256;
    ca_ptr_map_slot *s = (ca_ptr_map_slot *)calloc(n, sizeof *s);
    if (!s) return false;
    ca_ptr_map old = *m;
    m->slots = s;
    m->nslots = n;
    for (size_t i = 0; i < old.nslots; i++)
        if (old.slots[i].key) m->slots[ca_ptr_map_probe(m, old.slots[i].key)] = old.slots[i];
    free(old.slots);
    return true;
}

/* Stores val (not NULL) for key (not NULL, not yet present). false: out of host memory. */
static inline bool ca_ptr_map_put(ca_ptr_map *m, const void *key, void *val) {
    if ((m->nused + 1) * 2 > m->nslots && !ca_ptr_map_grow(m)) return false;
    ca_ptr_map_slot *s = &m->slots[ca_ptr_map_probe(m, key)];
    s->key = key;
    s->val = val;
    m->nused++;
    return true;
}

/* Removes key and returns its value (NULL if absent). Backward-shift deletion keeps every probe
 * chain intact. */
static inline void *ca_ptr_map_take(ca_ptr_map *m, const void *key) {
    if (!m->nslots) return NULL;
    size_t i = ca_ptr_map_probe(m, key), mask = m->nslots - 1;
    void *found = m->slots[i].val;
    if (!m->slots[i].key) return NULL;
    m->slots[i].key = NULL;
    m->slots[i].val = NULL;
    m->nused--;
    for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
        size_t h = ca_ptr_map_hash(m->slots[j].key, m->nslots);
        bool movable = (j > i) ? (h <= i || h > j) : (h <= i && h > j);
        if (movable) {
            m->slots[i] = m->slots[j];
            m->slots[j].key = NULL;
            m->slots[j].val = NULL;
            i = j;
        }
    }
    return found;
}

static inline void ca_ptr_map_free(ca_ptr_map *m) {
    free(m->slots);
    m->slots = NULL;
    m->nslots = m->nused = 0;
}

#endif
