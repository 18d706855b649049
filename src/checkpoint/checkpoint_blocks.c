/*
 * checkpoint_blocks.c - block groups: the outermost numbered groups prefix.N of the tensor
 * names with at least two blocks holding bytes (what the planner streams).
 *
 * Discovery is linear in the total length of the names: a block prefix.N is identified by
 * the block before it in the same name (or the root) and the bytes between them, so no prefix
 * is ever copied or compared as a whole (the names form a trie of their numbered components).
 */
#include "checkpoint/checkpoint_internal.h"

#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

/* A group (prefix) or a block (prefix.N): its parent (the enclosing block for a group, the
 * group for a block) and the name bytes [seg, seg + seg_len) of tensor `tensor` after it. */
typedef struct bg_node {
    uint32_t parent;
    uint32_t tensor;
    uint32_t seg; /* offset in the tensor's name */
    uint32_t seg_len;
    uint32_t group;        /* blocks: their group */
    uint32_t members;      /* groups: distinct blocks */
    uint32_t members_full; /* groups: blocks holding bytes */
    uint32_t first_use;    /* groups: first tensor assigned (NONE: none) */
    uint64_t bytes;        /* blocks: their tensors' bytes; groups: the largest block */
    uint64_t total;        /* groups: all their blocks' bytes */
    bool is_block;
} bg_node;

typedef struct bg_state {
    const ddo_checkpoint *ck;
    bg_node *nodes;
    size_t count, cap;
    uint32_t *table; /* node indices, NONE when empty; power-of-two size */
    size_t table_cap;
} bg_state;

static const char *seg_of(const bg_state *s, const bg_node *n)
{
    return s->ck->tensors[n->tensor].name + n->seg;
}

/* FNV-1a (strmap.h) over (parent, is_block) and the segment's bytes. */
static size_t hash_key(uint32_t parent, bool is_block, const char *seg, size_t len)
{
    uint64_t h = (DDO__FNV_BASIS ^ ((uint64_t)parent << 1 | (is_block ? 1u : 0u))) * DDO__FNV_PRIME;
    h = ddo__fnv1a(h, seg, len);
    return (size_t)(h ^ (h >> 29));
}

static bool table_grow(bg_state *s)
{
    size_t cap = s->table_cap == 0 ? 64 : s->table_cap * 2;
    uint32_t *t = ddo__reallocarray(NULL, cap, sizeof(*t));
    if (t == NULL)
        return false;
    memset(t, 0xff, cap * sizeof(*t));
    for (size_t i = 0; i < s->count; i++) {
        const bg_node *n = &s->nodes[i];
        size_t j = hash_key(n->parent, n->is_block, seg_of(s, n), n->seg_len) & (cap - 1);
        while (t[j] != NONE)
            j = (j + 1) & (cap - 1);
        t[j] = (uint32_t)i;
    }
    free(s->table);
    s->table = t;
    s->table_cap = cap;
    return true;
}

/* The node (parent, is_block, name[seg, seg+len)) of tensor; added when add is true. NONE when
 * absent (or out of memory: *oom). */
static uint32_t node_at(bg_state *s, uint32_t parent, bool is_block, uint32_t tensor, size_t seg,
                        size_t len, bool add, bool *oom)
{
    const char *text = s->ck->tensors[tensor].name + seg;
    if (s->table_cap > 0) {
        size_t j = hash_key(parent, is_block, text, len) & (s->table_cap - 1);
        for (uint32_t k; (k = s->table[j]) != NONE; j = (j + 1) & (s->table_cap - 1)) {
            const bg_node *n = &s->nodes[k];
            if (n->parent == parent && n->is_block == is_block && n->seg_len == len &&
                memcmp(seg_of(s, n), text, len) == 0)
                return k;
        }
    }
    if (!add)
        return NONE;
    if (s->count >= DDO__CHECKPOINT_MAX_BLOCK_PREFIXES) {
        *oom = false;
        return NONE;
    }
    if ((s->count + 1) * 2 > s->table_cap && !table_grow(s))
        goto oom;
    if (s->count == s->cap) {
        size_t cap = s->cap == 0 ? 64 : s->cap * 2;
        bg_node *nn = ddo__reallocarray(s->nodes, cap, sizeof(*nn));
        if (nn == NULL)
            goto oom;
        s->nodes = nn;
        s->cap = cap;
    }
    uint32_t k = (uint32_t)s->count++;
    s->nodes[k] =
        (bg_node){ parent, tensor, (uint32_t)seg, (uint32_t)len, NONE, 0, 0, NONE, 0, 0, is_block };
    size_t j = hash_key(parent, is_block, text, len) & (s->table_cap - 1);
    while (s->table[j] != NONE)
        j = (j + 1) & (s->table_cap - 1);
    s->table[j] = k;
    return k;
oom:
    *oom = true;
    return NONE;
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

/* Walks tensor i's blocks, adding them (and their bytes) to the trie. */
static int add_blocks(bg_state *s, uint32_t i, const char *what)
{
    const char *name = s->ck->tensors[i].name;
    size_t from = 0, pend = 0, plen, blen;
    uint32_t parent = NONE;
    bool oom = false;
    while ((blen = next_block(name, from, &plen)) != 0) {
        uint32_t g = node_at(s, parent, false, i, pend, plen - pend, true, &oom);
        uint32_t b = g == NONE ? NONE : node_at(s, g, true, i, plen, blen - plen, true, &oom);
        if (b == NONE) {
            if (oom)
                return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory computing block groups",
                                 what);
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: the tensor names hold more than %d distinct numbered prefixes "
                             "(ddo's block discovery limit; see docs/inspect.md)",
                             what, DDO__CHECKPOINT_MAX_BLOCK_PREFIXES);
        }
        if (s->nodes[b].group == NONE) {
            s->nodes[b].group = g;
            s->nodes[g].members++;
        }
        s->nodes[b].bytes += s->ck->tensors[i].nbytes;
        parent = b;
        pend = from = blen;
    }
    return 0;
}

/* The outermost valid group of tensor i (NONE: none); *plen_out its prefix's length. */
static uint32_t outer_group(bg_state *s, uint32_t i, size_t *plen_out)
{
    const char *name = s->ck->tensors[i].name;
    size_t from = 0, pend = 0, plen, blen;
    uint32_t parent = NONE;
    bool oom = false;
    while ((blen = next_block(name, from, &plen)) != 0) {
        uint32_t g = node_at(s, parent, false, i, pend, plen - pend, false, &oom);
        uint32_t b = node_at(s, g, true, i, plen, blen - plen, false, &oom);
        if (g == NONE || b == NONE)
            return NONE; /* cannot happen: the first pass added every node */
        if (s->nodes[g].members_full >= 2) {
            *plen_out = plen;
            return g;
        }
        parent = b;
        pend = from = blen;
    }
    return NONE;
}

/* The groups in order of first use, with their prefixes copied from the first tensor. */
static int report(ddo_checkpoint *ck, bg_state *s, const char *what)
{
    uint32_t *order = ddo__calloc(s->count > 0 ? s->count : 1, sizeof(*order));
    size_t *plens = ddo__calloc(s->count > 0 ? s->count : 1, sizeof(*plens));
    size_t used = 0;
    int rc = DDO_E_NO_MEMORY;
    if (order == NULL || plens == NULL)
        goto out;
    for (uint32_t i = 0; i < (uint32_t)ck->tensor_count; i++) {
        size_t plen = 0;
        uint32_t g = outer_group(s, i, &plen);
        if (g != NONE && s->nodes[g].first_use == NONE) {
            s->nodes[g].first_use = i;
            plens[used] = plen;
            order[used++] = g;
        }
    }
    ck->groups = ddo__calloc(used > 0 ? used : 1, sizeof(*ck->groups));
    if (ck->groups == NULL)
        goto out;
    for (size_t k = 0; k < used; k++) {
        const bg_node *g = &s->nodes[order[k]];
        char *prefix = ddo__strndup(ck->tensors[g->first_use].name, plens[k]);
        if (prefix == NULL)
            goto out; /* ck->groups[0..group_count) are freed by destroy */
        ck->groups[k] = (ddo_block_group){ prefix, g->members, g->bytes, g->total };
        ck->group_count = k + 1;
    }
    rc = 0;
out:
    free(order);
    free(plens);
    if (rc != 0)
        return ddo__fail(NULL, rc, "%s: out of memory computing block groups", what);
    return 0;
}

/*
 * Block groups: every tensor counts towards every numbered block prefix.N
 * that its name passes through; a group is valid with >= 2 blocks holding
 * bytes. A tensor belongs to its outermost valid group (so groups nested in a
 * block of another group are not reported).
 */
int ddo__checkpoint_block_groups(ddo_checkpoint *ck, const char *what)
{
    bg_state s;
    memset(&s, 0, sizeof(s));
    s.ck = ck;
    int rc = 0;
    for (size_t i = 0; i < ck->tensor_count && rc == 0; i++)
        rc = add_blocks(&s, (uint32_t)i, what);
    if (rc == 0) {
        for (size_t k = 0; k < s.count; k++) {
            const bg_node *b = &s.nodes[k];
            if (!b->is_block)
                continue;
            bg_node *g = &s.nodes[b->group];
            if (b->bytes > 0)
                g->members_full++;
            g->total += b->bytes;
            if (b->bytes > g->bytes)
                g->bytes = b->bytes;
        }
        rc = report(ck, &s, what);
    }
    free(s.nodes);
    free(s.table);
    return rc;
}
