/*
 * devtab.c - the small sorted tables of the device files (device.h: ddo__devtab), at the
 * bottom of the device folder: the wrappers and the cpu device keep their objects in them.
 */
#include "device/device.h"

#include <stdlib.h>
#include <string.h>

static size_t lower_bound(const ddo__devtab *t, uint64_t key)
{
    size_t lo = 0, hi = t->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

size_t ddo__devtab_find(const ddo__devtab *t, uint64_t key)
{
    size_t i = lower_bound(t, key);
    return i < t->len && t->v[i].key == key ? i : SIZE_MAX;
}

size_t ddo__devtab_floor(const ddo__devtab *t, uint64_t key)
{
    size_t i = lower_bound(t, key);
    if (i < t->len && t->v[i].key == key)
        return i;
    return i == 0 ? SIZE_MAX : i - 1;
}

int ddo__devtab_insert(ddo__devtab *t, uint64_t key, uint64_t size, void *obj)
{
    size_t i = lower_bound(t, key);
    if (i < t->len && t->v[i].key == key)
        return DDO_E_INVALID_ARGUMENT;
    if (t->len == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        ddo__devtab_entry *v = ddo__reallocarray(t->v, cap, sizeof(*v));
        if (v == NULL)
            return DDO_E_NO_MEMORY;
        t->v = v;
        t->cap = cap;
    }
    memmove(&t->v[i + 1], &t->v[i], (t->len - i) * sizeof(*t->v));
    t->v[i].key = key;
    t->v[i].size = size;
    t->v[i].obj = obj;
    t->len++;
    return 0;
}

void ddo__devtab_remove_at(ddo__devtab *t, size_t i)
{
    if (i >= t->len)
        return;
    memmove(&t->v[i], &t->v[i + 1], (t->len - i - 1) * sizeof(*t->v));
    t->len--;
}

void ddo__devtab_free(ddo__devtab *t)
{
    free(t->v);
    t->v = NULL;
    t->len = t->cap = 0;
}
