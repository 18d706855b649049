/*
 * strmap.h - the library's one string -> index hash table (FNV-1a, open addressing, linear
 * probing): the checkpoint's tensor and metadata names, shard checks. Keys are byte strings
 * of a given length (a name, or a prefix of one), borrowed: they must outlive the table.
 * A zeroed table is empty and valid. Not thread-safe for writers; readers may share a table
 * nobody writes.
 */
#ifndef DDO_STRMAP_H
#define DDO_STRMAP_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a, 64 bits: the offset basis, and h continued over n bytes of p. */
#define DDO__FNV_BASIS UINT64_C(14695981039346656037)
#define DDO__FNV_PRIME UINT64_C(1099511628211)
uint64_t ddo__fnv1a(uint64_t h, const void *p, size_t n);

typedef struct ddo__strmap_slot {
    const char *key; /* NULL: empty */
    size_t len;
    size_t value;
} ddo__strmap_slot;

typedef struct ddo__strmap {
    ddo__strmap_slot *slots;
    size_t cap; /* power of two, or 0 */
    size_t count;
} ddo__strmap;

/* The value stored for the len bytes at key, or SIZE_MAX. */
size_t ddo__strmap_get(const ddo__strmap *m, const char *key, size_t len);
/* Inserts key -> value unless key is present. Returns the value now stored (the earlier one
 * when present), or SIZE_MAX when out of memory. */
size_t ddo__strmap_put(ddo__strmap *m, const char *key, size_t len, size_t value);
/* Frees the slots; the table is empty (and valid) again. */
void ddo__strmap_free(ddo__strmap *m);

#endif /* DDO_STRMAP_H */
