/*
 * plan_modules.c - the planner's view of the names (docs/plan.md): modules and
 * blocks from the tensor names, the skip / always-resident / vmm patterns matched against
 * them (Python re search semantics), the resolved resident patterns and the resident
 * candidates ("scopes") with their full sizes. Part of the build (plan_build.h).
 */
#include "plan/plan_build.h"

#include "base/strmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- regular expressions (Python re search semantics) ---- */

/* Backtracking limits of one match: a catastrophic pattern such as (a+)+$ against a long name
 * stops with an error naming the option and the pattern in milliseconds instead of running for
 * seconds and then counting as "no match". Real module patterns need a few hundred steps. */
#define RX_MATCH_LIMIT 1000000u
#define RX_DEPTH_LIMIT 100000u

void ddo__rxset_free(rxset *s)
{
    for (size_t i = 0; i < s->count; i++)
        pcre2_code_free(s->codes[i]);
    free(s->codes);
    free(s->pats);
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    memset(s, 0, sizeof(*s));
}

/* Compiles pats (empty entries skipped). DDO_E_CONFIG names the option and the pattern. */
static int rxset_compile(rxset *s, char *const *pats, size_t n, const char *option)
{
    memset(s, 0, sizeof(*s));
    s->option = option;
    s->codes = ddo__calloc(n ? n : 1, sizeof(*s->codes));
    s->pats = ddo__calloc(n ? n : 1, sizeof(*s->pats));
    s->md = pcre2_match_data_create(1, NULL);
    s->mc = pcre2_match_context_create(NULL);
    if (s->codes == NULL || s->pats == NULL || s->md == NULL || s->mc == NULL) {
        ddo__rxset_free(s);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: compiling %s", option);
    }
    pcre2_set_match_limit(s->mc, RX_MATCH_LIMIT);
    pcre2_set_depth_limit(s->mc, RX_DEPTH_LIMIT);
    for (size_t i = 0; i < n; i++) {
        if (pats[i] == NULL || pats[i][0] == '\0')
            continue;
        int errcode = 0;
        PCRE2_SIZE erroff = 0;
        pcre2_code *c =
            pcre2_compile((PCRE2_SPTR)pats[i], PCRE2_ZERO_TERMINATED, 0, &errcode, &erroff, NULL);
        if (c == NULL) {
            PCRE2_UCHAR msg[256];
            if (pcre2_get_error_message(errcode, msg, sizeof(msg)) < 0)
                strcpy((char *)msg, "invalid pattern");
            char qp[200];
            ddo__quote(pats[i], true, qp, sizeof(qp));
            ddo__rxset_free(s);
            return ddo__fail(NULL, DDO_E_CONFIG, "%s: pattern \"%s\": %s at offset %zu", option, qp,
                             (const char *)msg, (size_t)erroff);
        }
        s->pats[s->count] = pats[i];
        s->codes[s->count++] = c;
    }
    return 0;
}

/* Python re.search of any pattern in subject: *hit says whether one matched. A match that
 * hits the backtracking limits (or fails otherwise) is an error naming the option, the
 * pattern and the module, never a silent "no match". */
static int rxset_search(const rxset *s, const char *subject, size_t len, bool *hit)
{
    *hit = false;
    for (size_t i = 0; i < s->count; i++) {
        int rc = pcre2_match(s->codes[i], (PCRE2_SPTR)subject, len, 0, 0, s->md, s->mc);
        if (rc >= 0) {
            *hit = true;
            return 0;
        }
        if (rc == PCRE2_ERROR_NOMATCH)
            continue;
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(rc, msg, sizeof(msg)) < 0)
            strcpy((char *)msg, "match error");
        char qp[200], qm[100];
        ddo__quote(s->pats[i], true, qp, sizeof(qp));
        ddo__quote(subject, true, qm, sizeof(qm));
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "%s: pattern \"%s\" against module \"%s\" (%zu characters): %s "
                         "(limits: %u steps, depth %u); simplify the pattern (nested repeats "
                         "such as (a+)+ backtrack exponentially)",
                         s->option, qp, qm, len, (const char *)msg, RX_MATCH_LIMIT, RX_DEPTH_LIMIT);
    }
    return 0;
}

bool ddo__plan_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

/* Length of the block name ("prefix.N") that module name m belongs to under prefix, or 0. */
static size_t block_len(const char *m, size_t mlen, const char *prefix)
{
    size_t plen = strlen(prefix), at = 0;
    if (plen > 0) {
        if (mlen <= plen || memcmp(m, prefix, plen) != 0 || m[plen] != '.')
            return 0;
        at = plen + 1;
    }
    size_t d = at;
    while (d < mlen && m[d] >= '0' && m[d] <= '9')
        d++;
    if (d == at || (d < mlen && m[d] != '.'))
        return 0;
    return d;
}

/* Modules and blocks from the tensor names, in checkpoint order. */
int ddo__plan_build_modules(builder *b)
{
    ddo__strmap mm = { NULL, 0, 0 }, bm = { NULL, 0, 0 };
    int rc = 0;
    b->tmod = ddo__calloc(b->n ? b->n : 1, sizeof(*b->tmod));
    b->mods = ddo__calloc(b->n ? b->n : 1, sizeof(*b->mods));
    b->blocks = ddo__calloc(b->n ? b->n : 1, sizeof(*b->blocks));
    if (b->tmod == NULL || b->mods == NULL || b->blocks == NULL)
        goto oom;
    size_t groups = ddo_checkpoint_block_group_count(b->ck);
    for (size_t i = 0; i < b->n; i++) {
        const char *name = b->ti[i]->name;
        const char *dot = strrchr(name, '.');
        size_t mlen = dot != NULL ? (size_t)(dot - name) : 0;
        size_t idx = ddo__strmap_put(&mm, name, mlen, b->mod_count);
        if (idx == SIZE_MAX)
            goto oom;
        b->tmod[i] = idx;
        if (idx < b->mod_count)
            continue;
        pmod *m = &b->mods[b->mod_count++];
        m->name = name;
        m->len = mlen;
        m->block = NONE;
        m->unit = NONE;
        m->scope = NONE;
        for (size_t g = 0; g < groups; g++) {
            const ddo_block_group *bg = ddo_checkpoint_block_group(b->ck, g);
            size_t bl = bg != NULL ? block_len(name, mlen, bg->prefix) : 0;
            if (bl == 0)
                continue;
            size_t bidx = ddo__strmap_put(&bm, name, bl, b->block_count);
            if (bidx == SIZE_MAX)
                goto oom;
            if (bidx == b->block_count) {
                b->blocks[bidx].name = name;
                b->blocks[bidx].len = bl;
                b->blocks[bidx].unit = NONE;
                b->blocks[bidx].scope = NONE;
                b->block_count++;
            }
            m->block = bidx;
            break;
        }
    }
    goto out;
oom:
    rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b->n);
out:
    ddo__strmap_free(&mm);
    ddo__strmap_free(&bm);
    return rc;
}

int ddo__plan_compile_patterns(builder *b)
{
    const ddo__options *o = b->o;
    int rc = rxset_compile(&b->skip, o->skip_modules_pattern.items, o->skip_modules_pattern.count,
                           "skip_modules_pattern");
    if (rc == 0)
        rc = rxset_compile(&b->always, o->always_resident_modules_pattern.items,
                           o->always_resident_modules_pattern.count,
                           "always_resident_modules_pattern");
    if (rc == 0) {
        char *v = o->vmm_module_pattern != NULL ? o->vmm_module_pattern : (char *)"";
        rc = rxset_compile(&b->vmm, &v, 1, "vmm_module_pattern");
    }
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < b->mod_count; i++) {
        pmod *m = &b->mods[i];
        if ((rc = rxset_search(&b->skip, m->name, m->len, &m->skipped)) != 0 ||
            (rc = rxset_search(&b->always, m->name, m->len, &m->always)) != 0 ||
            (rc = rxset_search(&b->vmm, m->name, m->len, &m->vmm)) != 0)
            return rc;
        /* An empty vmm_module_pattern matches everything, like ".*". */
        m->vmm = m->vmm || b->vmm.count == 0;
    }
    return 0;
}

/* resident_module_patterns with `auto` expanded to one anchored pattern per block group. */
int ddo__plan_resolve_resident_patterns(builder *b)
{
    const ddo__strlist *l = &b->o->resident_module_patterns;
    ddo_plan *p = b->p;
    size_t groups = ddo_checkpoint_block_group_count(b->ck);
    bool has_auto = false;
    p->resident_patterns = ddo__calloc(l->count + groups + 1, sizeof(char *));
    if (p->resident_patterns == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident patterns");
    if (b->fill) {
        /* Filling the budget: every block, and every module outside a block, is a candidate. */
        if ((p->resident_patterns[0] = ddo__strdup(".*")) == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident patterns");
        p->resident_pattern_count = 1;
        return rxset_compile(&b->resident, p->resident_patterns, 1, "resident_module_patterns");
    }
    for (size_t i = 0; i < l->count; i++) {
        const char *s = l->items[i];
        while (*s == ' ' || *s == '\t')
            s++;
        size_t n = strlen(s);
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
            n--;
        if (n == 0)
            continue;
        if (n == 4 && (s[0] | 32) == 'a' && (s[1] | 32) == 'u' && (s[2] | 32) == 't' &&
            (s[3] | 32) == 'o') {
            has_auto = true;
            continue;
        }
        char *c = ddo__strndup(s, n);
        if (c == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident patterns");
        p->resident_patterns[p->resident_pattern_count++] = c;
    }
    for (size_t g = 0; has_auto && g < groups; g++) {
        const ddo_block_group *bg = ddo_checkpoint_block_group(b->ck, g);
        if (bg == NULL)
            continue;
        ddo__sbuf sb;
        ddo__sbuf_init(&sb);
        ddo__sbuf_append(&sb, "^", 1);
        for (const char *c = bg->prefix; *c != '\0'; c++) {
            if (strchr("\\^$.|?*+()[]{}-#&~ ", *c) != NULL)
                ddo__sbuf_append(&sb, "\\", 1);
            ddo__sbuf_append(&sb, c, 1);
        }
        ddo__sbuf_printf(&sb, "%s\\d+$", bg->prefix[0] != '\0' ? "\\." : "");
        char *pat = ddo__sbuf_take(&sb);
        if (pat == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident patterns");
        p->resident_patterns[p->resident_pattern_count++] = pat;
    }
    return rxset_compile(&b->resident, p->resident_patterns, p->resident_pattern_count,
                         "resident_module_patterns");
}

/*
 * Block granularity: the modules outside every block (embedders, final norms and projections)
 * become one block named "" (the root), so their streamed tensors load as one unit and are one
 * resident candidate, when there are at least two of them, their bytes are at most half the
 * largest block's (the slot does not grow, and a unit used at a step's start and end is cheap
 * to hold) and the resident patterns take all of them or none. As units of their own each would
 * take a whole slot while loaded: zero-resident, Flux's ten small leaves sit between a step's
 * last block and the next step's first, and the prefetch window never reaches past them
 * (docs/plan.md, "Units"). Runs after the blocks' sizes and matches are known.
 */
static int gather_outside_blocks(builder *b)
{
    if (b->leaf || b->block_count == 0)
        return 0;
    uint64_t outside = 0, largest = 0;
    size_t count = 0, matching = 0;
    for (size_t k = 0; k < b->block_count; k++)
        largest = b->blocks[k].full_bytes > largest ? b->blocks[k].full_bytes : largest;
    for (size_t i = 0; i < b->mod_count; i++) {
        const pmod *m = &b->mods[i];
        if (m->skipped || m->block != NONE)
            continue;
        bool hit = b->fill;
        if (m->len > 0) {
            int rc = rxset_search(&b->resident, m->name, m->len, &hit);
            if (rc != 0)
                return rc;
        }
        outside = ddo__sat_add_u64(outside, m->full_bytes);
        count++;
        matching += hit ? 1 : 0;
    }
    if (count < 2 || outside > largest / 2 || (matching != 0 && matching != count))
        return 0;
    pblock *g = &b->blocks[b->block_count]; /* room: count >= 2 modules are not blocks */
    *g = (pblock){ "", 0, matching == count, false, NONE, NONE, outside, NULL };
    for (size_t i = 0; i < b->mod_count; i++)
        if (!b->mods[i].skipped && b->mods[i].block == NONE)
            b->mods[i].block = b->block_count;
    b->block_count++;
    ddo__decisions_set_str(&b->p->decisions, "outside_blocks", "one_unit");
    return 0;
}

/* Block k's list ("prefix" of "prefix.N": the length before the last dot, 0 without one) and
 * its number N. */
static size_t block_list_len(const pblock *k)
{
    size_t d = k->len;
    while (d > 0 && k->name[d - 1] != '.')
        d--;
    return d > 0 ? d - 1 : 0;
}

static uint64_t block_number(const pblock *k)
{
    size_t at = block_list_len(k);
    uint64_t v = 0;
    for (size_t i = at + (at > 0 ? 1 : 0); i < k->len; i++)
        v = v * 10 + (uint64_t)(k->name[i] - '0');
    return v;
}

/* Whether block x comes before block y: by list, then by number. */
static bool block_before(const pblock *x, const pblock *y)
{
    size_t lx = block_list_len(x), ly = block_list_len(y);
    int c = memcmp(x->name, y->name, lx < ly ? lx : ly);
    if (c != 0 || lx != ly)
        return c != 0 ? c < 0 : lx < ly;
    return block_number(x) < block_number(y);
}

/* The end of the group of consecutive blocks (by ord, from i) that fit beside the largest
 * block's bytes in one unit: blocks i..end-1 of one list, numbered one after another, matched
 * alike by the resident patterns; *sum gets their bytes. */
static size_t group_end(const builder *b, const size_t *ord, size_t i, uint64_t largest,
                        uint64_t *sum)
{
    const pblock *h = &b->blocks[ord[i]];
    size_t pl = block_list_len(h), j = i + 1;
    *sum = h->full_bytes;
    for (; j < b->block_count; j++) {
        const pblock *x = &b->blocks[ord[j]], *prev = &b->blocks[ord[j - 1]];
        if (block_list_len(x) != pl || memcmp(x->name, h->name, pl) != 0 ||
            block_number(x) != block_number(prev) + 1 || x->matches != h->matches ||
            x->full_bytes > largest - *sum)
            break;
        *sum += x->full_bytes;
    }
    return j;
}

/* Makes blocks ord[i..j) one block named "prefix.A-B" at the first of them in checkpoint
 * order (into[] records it); 1 when packed, 0 when the name is too long to print (the blocks
 * stay apart), negative on failure. */
static int pack_group(builder *b, const size_t *ord, size_t i, size_t j, uint64_t sum, size_t *into)
{
    const pblock *h = &b->blocks[ord[i]];
    size_t pl = block_list_len(h), head = ord[i];
    for (size_t g = i; g < j; g++)
        head = ord[g] < head ? ord[g] : head;
    char name[512];
    int w = snprintf(name, sizeof name, "%.*s%s%llu-%llu", (int)pl, h->name, pl > 0 ? "." : "",
                     (unsigned long long)block_number(h),
                     (unsigned long long)block_number(&b->blocks[ord[j - 1]]));
    if (w <= 0 || (size_t)w >= sizeof name)
        return 0;
    char *owned = ddo__strdup(name);
    if (owned == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: unit names");
    for (size_t g = i; g < j; g++)
        into[ord[g]] = head;
    b->blocks[head].owned = owned;
    b->blocks[head].name = owned;
    b->blocks[head].len = (size_t)w;
    b->blocks[head].full_bytes = sum;
    return 1;
}

/* Drops the blocks packed into another (into[k] != k), keeping the order of the rest, and
 * points every module at its block's new index (map: scratch of block_count entries). */
static void compact_packed(builder *b, const size_t *into, size_t *map)
{
    size_t kept = 0;
    for (size_t k = 0; k < b->block_count; k++) {
        if (into[k] != k)
            continue;
        b->blocks[kept] = b->blocks[k];
        map[k] = kept++;
    }
    for (size_t k = 0; k < b->block_count; k++)
        map[k] = map[into[k]]; /* a head's entry is set above and not changed here */
    for (size_t i = 0; i < b->mod_count; i++)
        if (b->mods[i].block != NONE)
            b->mods[i].block = map[b->mods[i].block];
    b->block_count = kept;
}

/*
 * unit_pack_blocks (block granularity): consecutive blocks of one list (prefix.N, prefix.N+1,
 * ...) that are small beside the largest block share one unit, packed greedily up to the
 * largest block's bytes where at least two fit and the resident patterns take all of them or
 * none. A slot holds one unit: a block a fraction of the largest leaves the rest of its slot
 * empty, and the prefetch window (slots - 1 units) reaches fewer bytes ahead (docs/plan.md,
 * "Units"). The unit is named by its list and its first and last number ("prefix.A-B"); the
 * Python binding hooks it on each of its blocks. Runs once the blocks' sizes and matches are
 * known, before the modules outside the blocks are gathered.
 */
static int pack_small_blocks(builder *b)
{
    size_t n = b->block_count;
    if (!b->pack || n < 2)
        return 0;
    uint64_t largest = 0;
    for (size_t k = 0; k < n; k++)
        largest = b->blocks[k].full_bytes > largest ? b->blocks[k].full_bytes : largest;
    size_t *ord = ddo__calloc(n, sizeof(*ord)), *into = ddo__calloc(n, sizeof(*into));
    if (ord == NULL || into == NULL) {
        free(ord);
        free(into);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu blocks", n);
    }
    for (size_t k = 0; k < n; k++) { /* insertion sort: a model has tens to hundreds of blocks */
        size_t j = k;
        while (j > 0 && block_before(&b->blocks[k], &b->blocks[ord[j - 1]])) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = k;
        into[k] = k;
    }
    size_t packed = 0, units = 0;
    int rc = 0;
    for (size_t i = 0, j; i < n && rc >= 0; i = j) {
        uint64_t sum = 0;
        j = group_end(b, ord, i, largest, &sum);
        rc = j - i >= 2 ? pack_group(b, ord, i, j, sum, into) : 0;
        packed += rc > 0 ? j - i : 0;
        units += rc > 0 ? 1 : 0;
    }
    if (rc >= 0 && packed > 0) {
        compact_packed(b, into, ord);
        char text[96];
        snprintf(text, sizeof text, "%zu blocks in %zu unit%s", packed, units,
                 units == 1 ? "" : "s");
        ddo__decisions_set_str(&b->p->decisions, "packed_blocks", text);
    }
    free(ord);
    free(into);
    return rc < 0 ? rc : 0;
}

/* The resident candidates ("scopes") in traversal order and their full sizes. */
int ddo__plan_build_scopes(builder *b)
{
    for (size_t i = 0; i < b->n; i++) {
        pmod *m = &b->mods[b->tmod[i]];
        if (m->skipped)
            continue;
        m->full_bytes = ddo__sat_add_u64(m->full_bytes, b->ti[i]->nbytes);
        if (m->block != NONE)
            b->blocks[m->block].full_bytes =
                ddo__sat_add_u64(b->blocks[m->block].full_bytes, b->ti[i]->nbytes);
    }
    for (size_t i = 0; i < b->block_count; i++) {
        int rc =
            rxset_search(&b->resident, b->blocks[i].name, b->blocks[i].len, &b->blocks[i].matches);
        if (rc != 0)
            return rc;
    }
    int grc = pack_small_blocks(b);
    if (grc == 0)
        grc = gather_outside_blocks(b);
    if (grc != 0)
        return grc;
    b->scopes = ddo__calloc(b->mod_count ? b->mod_count : 1, sizeof(*b->scopes));
    bool *block_seen = ddo__calloc(b->block_count ? b->block_count : 1, sizeof(bool));
    if (b->scopes == NULL || block_seen == NULL) {
        free(block_seen);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu modules", b->mod_count);
    }
    for (size_t i = 0; i < b->mod_count; i++) {
        pmod *m = &b->mods[i];
        if (m->skipped)
            continue;
        if (m->block != NONE && b->blocks[m->block].matches) {
            if (!block_seen[m->block]) {
                block_seen[m->block] = true;
                b->blocks[m->block].scope = b->scope_count;
                b->scopes[b->scope_count++] =
                    (pscope){ true, m->block, b->blocks[m->block].full_bytes };
            }
        } else if ((m->block == NONE || b->leaf) && (m->len > 0 || b->fill)) {
            int rc = rxset_search(&b->resident, m->name, m->len, &m->matches);
            if (rc != 0) {
                free(block_seen);
                return rc;
            }
            if (!m->matches)
                continue;
            m->scope = b->scope_count;
            b->scopes[b->scope_count++] = (pscope){ false, i, m->full_bytes };
        }
    }
    free(block_seen);
    return 0;
}

bool ddo__plan_is_eligible(const builder *b, size_t i)
{
    const ddo_tensor_info *t = b->ti[i];
    const pmod *m = &b->mods[b->tmod[i]];
    return t->ndim == 2 && ddo__plan_ends_with(t->name, ".weight") && m->vmm && !m->skipped;
}
