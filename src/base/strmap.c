/*
 * strmap.c - the string -> index hash table of strmap.h.
 */
#include "base/strmap.h"

#include "base/common.h"

#include <stdlib.h>
#include <string.h>

uint64_t ddo__fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= DDO__FNV_PRIME;
    }
    return h;
}

static size_t home(const char *key, size_t len, size_t cap)
{
    return (size_t)ddo__fnv1a(DDO__FNV_BASIS, key, len) & (cap - 1);
}

void ddo__strmap_free(ddo__strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = 0;
    m->count = 0;
}

static bool grow(ddo__strmap *m)
{
    size_t cap = m->cap == 0 ? 16 : m->cap * 2;
    if (cap < m->cap)
        return false;
    ddo__strmap_slot *slots = ddo__calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == NULL)
            continue;
        size_t j = home(m->slots[i].key, m->slots[i].len, cap);
        while (slots[j].key != NULL)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

/* The slot of key, or the empty slot where it would go (cap > 0). */
static ddo__strmap_slot *find(const ddo__strmap *m, const char *key, size_t len)
{
    size_t j = home(key, len, m->cap);
    while (m->slots[j].key != NULL) {
        if (m->slots[j].len == len && memcmp(m->slots[j].key, key, len) == 0)
            break;
        j = (j + 1) & (m->cap - 1);
    }
    return &m->slots[j];
}

size_t ddo__strmap_get(const ddo__strmap *m, const char *key, size_t len)
{
    if (m->cap == 0)
        return SIZE_MAX;
    const ddo__strmap_slot *s = find(m, key, len);
    return s->key != NULL ? s->value : SIZE_MAX;
}

size_t ddo__strmap_put(ddo__strmap *m, const char *key, size_t len, size_t value)
{
    if ((m->count + 1) * 2 > m->cap && !grow(m))
        return SIZE_MAX;
    ddo__strmap_slot *s = find(m, key, len);
    if (s->key != NULL)
        return s->value;
    *s = (ddo__strmap_slot){ key, len, value };
    m->count++;
    return value;
}
