/*
 * checkpoint_blocks.c - block groups: the outermost numbered groups prefix.N of the tensor
 * names with at least two blocks holding bytes (what the planner streams).
 */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Block groups                                                              */
/* ------------------------------------------------------------------------ */

typedef struct bg_block {
    size_t group;
    uint64_t bytes;
} bg_block;

typedef struct bg_group {
    char *prefix;
    size_t members;      /* distinct blocks */
    size_t members_full; /* blocks holding bytes */
    size_t first_use;    /* first tensor assigned to it (SIZE_MAX: none) */
} bg_group;

typedef struct bg_state {
    ddo__checkpoint_map groups_by_prefix;
    ddo__checkpoint_map blocks_by_key;
    bg_group *groups;
    size_t group_count, group_cap;
    bg_block *blocks;
    char **block_keys;
    size_t block_count, block_cap;
} bg_state;

static void bg_free(bg_state *s)
{
    ddo__checkpoint_map_free(&s->groups_by_prefix);
    ddo__checkpoint_map_free(&s->blocks_by_key);
    for (size_t i = 0; i < s->group_count; i++)
        free(s->groups[i].prefix);
    free(s->groups);
    for (size_t i = 0; i < s->block_count; i++)
        free(s->block_keys[i]);
    free(s->block_keys);
    free(s->blocks);
}

/* The position of the dot ending a numbered component whose prefix is
 * name[0..pos) (non-empty) and which is not the last component; searching
 * from `from`. Returns the length of "prefix.N" or 0 when there is none. */
static size_t next_block(const char *name, size_t from, size_t *prefix_len)
{
    size_t i = from;
    while (name[i] != '\0') {
        const char *dot = strchr(name + i, '.');
        if (dot == NULL)
            return 0;
        size_t comp = (size_t)(dot - name) + 1; /* start of the next component */
        size_t j = comp;
        while (name[j] >= '0' && name[j] <= '9')
            j++;
        if (j > comp && name[j] == '.' && comp > 1) {
            *prefix_len = comp - 1;
            return j;
        }
        i = comp;
    }
    return 0;
}

/* Finds or adds the group of prefix and the block prefix.N; SIZE_MAX on OOM. */
static size_t bg_block_of(bg_state *s, const char *name, size_t prefix_len, size_t block_len)
{
    char *key = ddo__strndup(name, block_len);
    if (key == NULL)
        return SIZE_MAX;
    size_t b = ddo__checkpoint_map_get(&s->blocks_by_key, key);
    if (b != SIZE_MAX) {
        free(key);
        return b;
    }
    key[prefix_len] = '\0';
    size_t g = ddo__checkpoint_map_get(&s->groups_by_prefix, key);
    if (g == SIZE_MAX) {
        if (s->group_count == s->group_cap) {
            size_t cap = s->group_cap == 0 ? 8 : s->group_cap * 2;
            bg_group *ng = ddo__reallocarray(s->groups, cap, sizeof(*ng));
            if (ng == NULL) {
                free(key);
                return SIZE_MAX;
            }
            s->groups = ng;
            s->group_cap = cap;
        }
        char *prefix = ddo__strndup(name, prefix_len);
        if (prefix == NULL) {
            free(key);
            return SIZE_MAX;
        }
        g = s->group_count;
        if (ddo__checkpoint_map_put(&s->groups_by_prefix, prefix, g) == SIZE_MAX) {
            free(prefix);
            free(key);
            return SIZE_MAX;
        }
        s->groups[g] = (bg_group){ prefix, 0, 0, SIZE_MAX };
        s->group_count++;
    }
    key[prefix_len] = '.';
    if (s->block_count == s->block_cap) {
        size_t cap = s->block_cap == 0 ? 16 : s->block_cap * 2;
        bg_block *nb = ddo__reallocarray(s->blocks, cap, sizeof(*nb));
        if (nb == NULL) {
            free(key);
            return SIZE_MAX;
        }
        s->blocks = nb;
        char **nk = ddo__reallocarray(s->block_keys, cap, sizeof(*nk));
        if (nk == NULL) {
            free(key);
            return SIZE_MAX;
        }
        s->block_keys = nk;
        s->block_cap = cap;
    }
    b = s->block_count;
    if (ddo__checkpoint_map_put(&s->blocks_by_key, key, b) == SIZE_MAX) {
        free(key);
        return SIZE_MAX;
    }
    s->blocks[b] = (bg_block){ g, 0 };
    s->block_keys[b] = key;
    s->block_count++;
    s->groups[g].members++;
    return b;
}

/*
 * Block groups: every tensor counts towards every numbered block prefix.N
 * that its name passes through; a group is valid with >= 2 blocks holding
 * bytes. A tensor belongs to its outermost valid group (so groups nested in a
 * block of another group are not reported).
 */
int ddo__checkpoint_block_groups(ddo_checkpoint *ck)
{
    bg_state s;
    memset(&s, 0, sizeof(s));
    int rc = DDO_E_NO_MEMORY;
    for (size_t i = 0; i < ck->tensor_count; i++) {
        const char *name = ck->tensors[i].name;
        size_t from = 0, plen, blen;
        while ((blen = next_block(name, from, &plen)) != 0) {
            size_t b = bg_block_of(&s, name, plen, blen);
            if (b == SIZE_MAX)
                goto out;
            s.blocks[b].bytes += ck->tensors[i].nbytes;
            from = blen;
        }
    }
    for (size_t b = 0; b < s.block_count; b++)
        if (s.blocks[b].bytes > 0)
            s.groups[s.blocks[b].group].members_full++;
    /* Per group: the largest block and the total. */
    uint64_t *largest = ddo__calloc(s.group_count, sizeof(*largest));
    uint64_t *total = ddo__calloc(s.group_count, sizeof(*total));
    size_t *order = ddo__calloc(s.group_count, sizeof(*order));
    size_t used = 0;
    if (largest == NULL || total == NULL || order == NULL)
        goto out_arrays;
    for (size_t b = 0; b < s.block_count; b++) {
        size_t g = s.blocks[b].group;
        total[g] += s.blocks[b].bytes;
        if (s.blocks[b].bytes > largest[g])
            largest[g] = s.blocks[b].bytes;
    }
    /* Each tensor belongs to its outermost valid group; groups in order of first use. */
    for (size_t i = 0; i < ck->tensor_count; i++) {
        const char *name = ck->tensors[i].name;
        size_t from = 0, plen, blen;
        while ((blen = next_block(name, from, &plen)) != 0) {
            char *key = ddo__strndup(name, blen);
            if (key == NULL)
                goto out_arrays;
            size_t b = ddo__checkpoint_map_get(&s.blocks_by_key, key);
            free(key);
            size_t g = s.blocks[b].group;
            if (s.groups[g].members_full >= 2) {
                if (s.groups[g].first_use == SIZE_MAX) {
                    s.groups[g].first_use = i;
                    order[used++] = g;
                }
                break;
            }
            from = blen;
        }
    }
    ck->groups = ddo__calloc(used, sizeof(*ck->groups));
    if (ck->groups == NULL)
        goto out_arrays;
    for (size_t k = 0; k < used; k++) {
        size_t g = order[k];
        ck->groups[k].prefix = s.groups[g].prefix;
        s.groups[g].prefix = NULL; /* moved */
        ck->groups[k].count = s.groups[g].members;
        ck->groups[k].bytes_per_block = largest[g];
        ck->groups[k].total_bytes = total[g];
    }
    ck->group_count = used;
    rc = 0;
out_arrays:
    free(largest);
    free(total);
    free(order);
out:
    bg_free(&s); /* prefixes moved into ck->groups are NULL here */
    return rc;
}
