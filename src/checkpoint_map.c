/*
 * checkpoint_map.c - the name index of the checkpoint module: a string -> index hash table
 * (FNV-1a, open addressing, linear probing).
 */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* A string -> index hash table (open addressing); keys are borrowed.        */
/* ------------------------------------------------------------------------ */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603u;
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211u;
    }
    return h;
}

void ddo__checkpoint_map_free(ddo__checkpoint_map *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = 0;
    m->count = 0;
}

static bool strmap_grow(ddo__checkpoint_map *m)
{
    size_t cap = m->cap == 0 ? 16 : m->cap * 2;
    if (cap < m->cap)
        return false;
    ddo__checkpoint_map_slot *slots = ddo__calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == NULL)
            continue;
        size_t j = (size_t)hash_str(m->slots[i].key) & (cap - 1);
        while (slots[j].key != NULL)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

/* The value stored for key, or SIZE_MAX. */
size_t ddo__checkpoint_map_get(const ddo__checkpoint_map *m, const char *key)
{
    if (m->cap == 0)
        return SIZE_MAX;
    size_t j = (size_t)hash_str(key) & (m->cap - 1);
    while (m->slots[j].key != NULL) {
        if (strcmp(m->slots[j].key, key) == 0)
            return m->slots[j].value;
        j = (j + 1) & (m->cap - 1);
    }
    return SIZE_MAX;
}

/* Inserts key -> value unless present. Returns the value now stored
 * (the old one when present), or SIZE_MAX when out of memory. */
size_t ddo__checkpoint_map_put(ddo__checkpoint_map *m, const char *key, size_t value)
{
    if ((m->count + 1) * 2 > m->cap && !strmap_grow(m))
        return SIZE_MAX;
    size_t j = (size_t)hash_str(key) & (m->cap - 1);
    while (m->slots[j].key != NULL) {
        if (strcmp(m->slots[j].key, key) == 0)
            return m->slots[j].value;
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j].key = key;
    m->slots[j].value = value;
    m->count++;
    return value;
}
