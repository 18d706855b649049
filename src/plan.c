/*
 * plan.c - the planner: turns a tensor table, the resolved configuration and
 * what is known about the machine into a plan (ARCHITECTURE.md section 2):
 * the placement of every tensor, units in execution order, the resident
 * selection, the retained and registered selections, slot and staging
 * geometry, the cost model and the predicted peak of every budget. Pure: no
 * I/O, no device, deterministic.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "plan.h"

#include "host_pins.h"

#include "budget.h"

#include "config.h"
#include "config_priv.h" /* ddo__config_quote for the messages */

#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE SIZE_MAX

/* ---- regular expressions (Python re search semantics) ---- */

/* Backtracking limits of one match: a catastrophic pattern such as (a+)+$ against a long name
 * stops with an error naming the option and the pattern in milliseconds instead of running for
 * seconds and then counting as "no match". Real module patterns need a few hundred steps. */
#define RX_MATCH_LIMIT 1000000u
#define RX_DEPTH_LIMIT 100000u

typedef struct rxset {
    pcre2_code **codes;
    const char **pats; /* borrowed from the options, valid while the plan is built */
    size_t count;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    const char *option;
} rxset;

static void rxset_free(rxset *s)
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
        rxset_free(s);
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
            ddo__config_quote(pats[i], qp, sizeof(qp));
            rxset_free(s);
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
        ddo__config_quote(s->pats[i], qp, sizeof(qp));
        ddo__config_quote(subject, qm, sizeof(qm));
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "%s: pattern \"%s\" against module \"%s\" (%zu characters): %s "
                         "(limits: %u steps, depth %u); simplify the pattern (nested repeats "
                         "such as (a+)+ backtrack exponentially)",
                         s->option, qp, qm, len, (const char *)msg, RX_MATCH_LIMIT, RX_DEPTH_LIMIT);
    }
    return 0;
}

/* ---- a string -> index map (open addressing; keys borrowed) ---- */

typedef struct strmap {
    const char **keys;
    size_t *lens;
    size_t *vals;
    size_t cap; /* power of two */
} strmap;

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static bool strmap_init(strmap *m, size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2 + 1)
        cap *= 2;
    m->cap = cap;
    m->keys = ddo__calloc(cap, sizeof(*m->keys));
    m->lens = ddo__calloc(cap, sizeof(*m->lens));
    m->vals = ddo__calloc(cap, sizeof(*m->vals));
    return m->keys != NULL && m->lens != NULL && m->vals != NULL;
}

static void strmap_free(strmap *m)
{
    free(m->keys);
    free(m->lens);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

/* Finds key, or inserts it with value *val; *val receives the stored value. */
static void strmap_get_or_put(strmap *m, const char *key, size_t len, size_t *val)
{
    size_t i = (size_t)hash_bytes(key, len) & (m->cap - 1);
    while (m->keys[i] != NULL) {
        if (m->lens[i] == len && memcmp(m->keys[i], key, len) == 0) {
            *val = m->vals[i];
            return;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = key;
    m->lens[i] = len;
    m->vals[i] = *val;
}

/* ---- the build ---- */

typedef struct pmod {
    const char *name; /* borrowed from a tensor name */
    size_t len;
    size_t block; /* NONE when outside every block */
    bool skipped, always, vmm, matches, selected;
    size_t unit;
    size_t scope; /* its resident candidate, NONE if not one */
    uint64_t full_bytes;
} pmod;

typedef struct pblock {
    const char *name;
    size_t len;
    bool matches, selected;
    size_t unit;
    size_t scope;
    uint64_t full_bytes;
} pblock;

typedef struct pscope {
    bool is_block;
    size_t index; /* into blocks or mods */
    uint64_t full_bytes;
    double deficit;
} pscope;

typedef struct builder {
    const ddo_checkpoint *ck;
    const ddo__options *o;
    ddo_settings settings;
    ddo_plan_inputs in;
    ddo_plan *p;
    size_t n; /* tensors */
    const ddo_tensor_info **ti;
    size_t *tmod; /* tensor -> module */
    pmod *mods;
    size_t mod_count;
    pblock *blocks;
    size_t block_count;
    pscope *scopes;
    size_t scope_count;
    rxset skip, always, vmm, resident;
    bool leaf;
    bool clear_always;
    uint64_t threshold;
} builder;

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return ddo__mul_u64(a, b, &r) ? r : UINT64_MAX;
}

static uint64_t floor_to(uint64_t v, uint64_t unit)
{
    return v - v % unit;
}

static const char *fmt_gib(uint64_t bytes, char *buf, size_t len)
{
    snprintf(buf, len, "%.2f GiB", ddo__bytes_to_gb(bytes));
    return buf;
}

static bool ends_with(const char *s, const char *suffix)
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
static int build_modules(builder *b)
{
    strmap mm = { 0 }, bm = { 0 };
    int rc = 0;
    b->tmod = ddo__calloc(b->n ? b->n : 1, sizeof(*b->tmod));
    b->mods = ddo__calloc(b->n ? b->n : 1, sizeof(*b->mods));
    b->blocks = ddo__calloc(b->n ? b->n : 1, sizeof(*b->blocks));
    if (b->tmod == NULL || b->mods == NULL || b->blocks == NULL || !strmap_init(&mm, b->n) ||
        !strmap_init(&bm, b->n)) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b->n);
        goto out;
    }
    size_t groups = ddo_checkpoint_block_group_count(b->ck);
    for (size_t i = 0; i < b->n; i++) {
        const char *name = b->ti[i]->name;
        const char *dot = strrchr(name, '.');
        size_t mlen = dot != NULL ? (size_t)(dot - name) : 0;
        size_t idx = b->mod_count;
        strmap_get_or_put(&mm, name, mlen, &idx);
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
            size_t bidx = b->block_count;
            strmap_get_or_put(&bm, name, bl, &bidx);
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
out:
    strmap_free(&mm);
    strmap_free(&bm);
    return rc;
}

static int compile_patterns(builder *b)
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
static int resolve_resident_patterns(builder *b)
{
    const ddo__strlist *l = &b->o->resident_module_patterns;
    ddo_plan *p = b->p;
    size_t groups = ddo_checkpoint_block_group_count(b->ck);
    bool has_auto = false;
    p->resident_patterns = ddo__calloc(l->count + groups + 1, sizeof(char *));
    if (p->resident_patterns == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident patterns");
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

/* The resident candidates ("scopes") in traversal order and their full sizes. */
static int build_scopes(builder *b)
{
    for (size_t i = 0; i < b->n; i++) {
        pmod *m = &b->mods[b->tmod[i]];
        if (m->skipped)
            continue;
        m->full_bytes = sat_add(m->full_bytes, b->ti[i]->nbytes);
        if (m->block != NONE)
            b->blocks[m->block].full_bytes =
                sat_add(b->blocks[m->block].full_bytes, b->ti[i]->nbytes);
    }
    for (size_t i = 0; i < b->block_count; i++) {
        int rc =
            rxset_search(&b->resident, b->blocks[i].name, b->blocks[i].len, &b->blocks[i].matches);
        if (rc != 0)
            return rc;
    }
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
                    (pscope){ true, m->block, b->blocks[m->block].full_bytes, 0.0 };
            }
        } else if ((m->block == NONE || b->leaf) && m->len > 0) {
            int rc = rxset_search(&b->resident, m->name, m->len, &m->matches);
            if (rc != 0) {
                free(block_seen);
                return rc;
            }
            if (!m->matches)
                continue;
            m->scope = b->scope_count;
            b->scopes[b->scope_count++] = (pscope){ false, i, m->full_bytes, 0.0 };
        }
    }
    free(block_seen);
    return 0;
}

static bool is_eligible(const builder *b, size_t i)
{
    const ddo_tensor_info *t = b->ti[i];
    const pmod *m = &b->mods[b->tmod[i]];
    return t->ndim == 2 && ends_with(t->name, ".weight") && m->vmm && !m->skipped;
}

/* Placement before the budget selection; streamed tensors get their unit. */
static int place_and_build_units(builder *b)
{
    ddo_plan *p = b->p;
    p->units = ddo__calloc(b->n ? b->n : 1, sizeof(*p->units));
    p->unit_tensors = ddo__calloc(b->n ? b->n : 1, sizeof(*p->unit_tensors));
    size_t *unit_of = ddo__calloc(b->n ? b->n : 1, sizeof(*unit_of));
    if (p->units == NULL || p->unit_tensors == NULL || unit_of == NULL) {
        free(unit_of);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b->n);
    }
    for (size_t i = 0; i < b->n; i++) {
        const ddo_tensor_info *t = b->ti[i];
        pmod *m = &b->mods[b->tmod[i]];
        ddo_tensor_location *loc = &p->tensors[i].loc;
        loc->unit = NONE;
        loc->nbytes = t->nbytes;
        p->tensors[i].eligible = is_eligible(b, i);
        unit_of[i] = NONE;
        if (m->skipped) {
            loc->placement = DDO_PLACEMENT_SKIPPED;
            loc->reason = DDO_REASON_SKIP_PATTERN;
            continue;
        }
        if (m->always && !b->clear_always) {
            loc->placement = DDO_PLACEMENT_RESIDENT;
            loc->reason = DDO_REASON_ALWAYS_RESIDENT;
            continue;
        }
        if (t->nbytes <= b->threshold) {
            loc->placement = DDO_PLACEMENT_RESIDENT;
            loc->reason = DDO_REASON_SMALL;
            continue;
        }
        loc->placement = DDO_PLACEMENT_STREAMED;
        loc->reason = DDO_REASON_NONE;
        bool by_block = !b->leaf && m->block != NONE;
        size_t *slot = by_block ? &b->blocks[m->block].unit : &m->unit;
        if (*slot == NONE) {
            ddo__plan_unit *u = &p->units[p->unit_count];
            const char *nm = by_block ? b->blocks[m->block].name : m->name;
            size_t nl = by_block ? b->blocks[m->block].len : m->len;
            u->name = ddo__strndup(nm, nl);
            if (u->name == NULL) {
                free(unit_of);
                return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: unit names");
            }
            u->full_bytes = by_block ? b->blocks[m->block].full_bytes : m->full_bytes;
            *slot = p->unit_count++;
        }
        unit_of[i] = *slot;
        ddo__plan_unit *u = &p->units[*slot];
        u->tensor_count++;
        u->bytes = sat_add(u->bytes, t->nbytes);
        if (t->ndim == 2 && ends_with(t->name, ".weight"))
            u->flops_per_token =
                sat_add(u->flops_per_token, sat_mul(2, sat_mul(t->shape[0], t->shape[1])));
    }
    /* Tensor ranges per unit, in checkpoint order. */
    size_t at = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        p->units[u].first_tensor = at;
        at += p->units[u].tensor_count;
        p->units[u].tensor_count = 0;
    }
    for (size_t i = 0; i < b->n; i++) {
        if (unit_of[i] == NONE)
            continue;
        ddo__plan_unit *u = &p->units[unit_of[i]];
        p->unit_tensors[u->first_tensor + u->tensor_count++] = i;
        p->tensors[i].loc.unit = unit_of[i];
    }
    free(unit_of);
    return 0;
}

/* Slot layout of every unit: tensors at DDO_TENSOR_ALIGN-aligned offsets. */
static void layout_units(builder *b)
{
    ddo_plan *p = b->p;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        uint64_t off = 0;
        for (size_t k = 0; k < un->tensor_count; k++) {
            size_t i = p->unit_tensors[un->first_tensor + k];
            off = ddo__round_up(off, DDO_TENSOR_ALIGN);
            p->tensors[i].loc.offset = off;
            off = sat_add(off, p->tensors[i].loc.nbytes);
        }
        un->span_bytes = off;
    }
}

/*
 * vmm_runtime: the device bytes unit u takes when every streamed weight has its
 * own physical handle of its size rounded up to the granularity (cuMemMap maps
 * a handle only at offset 0, so weights cannot share one).
 */
static uint64_t per_weight_bytes(const ddo_plan *p, size_t u, uint64_t gran)
{
    const ddo__plan_unit *un = &p->units[u];
    uint64_t sum = 0;
    for (size_t k = 0; k < un->tensor_count; k++) {
        const ddo_tensor_location *loc = &p->tensors[p->unit_tensors[un->first_tensor + k]].loc;
        if (loc->placement == DDO_PLACEMENT_STREAMED)
            sum = sat_add(sum, ddo__round_up(loc->nbytes, gran));
    }
    return sum;
}

/* Per-unit transfer and compute time and the deficit against the previous unit's compute. */
static void cost_model(builder *b, double *deficit)
{
    ddo_plan *p = b->p;
    p->tokens = b->in.tokens > 0 ? b->in.tokens : DDO_PLAN_DEFAULT_TOKENS;
    p->cost_enabled = b->in.bus_bytes_per_s > 0.0 && b->in.flops_per_s > 0.0;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        if (p->cost_enabled) {
            un->transfer_s = (double)un->bytes / b->in.bus_bytes_per_s;
            un->compute_s = (double)p->tokens * (double)un->flops_per_token / b->in.flops_per_s;
        }
    }
    for (size_t u = 0; u < p->unit_count; u++) {
        size_t prev = u > 0 ? u - 1 : p->unit_count - 1;
        double d = p->units[u].transfer_s - p->units[prev].compute_s;
        deficit[u] = p->cost_enabled && d > 0.0 ? d : 0.0;
    }
}

/* Predicted step time: copies serial on one engine, compute serial, a slot reused only after
 * the unit that held it has computed (prefetch depth slots - 1); the second of two simulated
 * steps is the steady state. */
static double simulate(const ddo_plan *p, size_t slots)
{
    if (!p->cost_enabled || p->unit_count == 0)
        return 0.0;
    double *ring = calloc(slots ? slots : 1, sizeof(double));
    if (ring == NULL)
        return 0.0;
    double copy_free = 0.0, compute_free = 0.0, step_end[2] = { 0.0, 0.0 };
    size_t j = 0;
    for (int step = 0; step < 2; step++) {
        for (size_t u = 0; u < p->unit_count; u++) {
            const ddo__plan_unit *un = &p->units[u];
            if (un->resident || slots == 0) {
                compute_free += un->compute_s;
                continue;
            }
            double slot_free = ring[j % slots];
            double cs = copy_free > slot_free ? copy_free : slot_free;
            double ce = cs + un->transfer_s;
            copy_free = ce;
            double start = compute_free > ce ? compute_free : ce;
            compute_free = start + un->compute_s;
            ring[j % slots] = compute_free;
            j++;
        }
        step_end[step] = compute_free;
    }
    free(ring);
    return step_end[1] - step_end[0];
}

/* Marks scope's modules (and so their units) budget-resident. */
static void select_scope(builder *b, const pscope *s)
{
    if (s->is_block)
        b->blocks[s->index].selected = true;
    else
        b->mods[s->index].selected = true;
}

/* Streamed tensors of selected scopes become budget-resident; their units are resident. */
static void make_budget_resident(builder *b)
{
    ddo_plan *p = b->p;
    for (size_t i = 0; i < b->n; i++) {
        ddo_tensor_location *loc = &p->tensors[i].loc;
        const pmod *m = &b->mods[b->tmod[i]];
        bool sel = m->selected || (m->block != NONE && b->blocks[m->block].selected);
        if (!sel || loc->placement != DDO_PLACEMENT_STREAMED)
            continue;
        p->units[loc->unit].resident = true;
        loc->placement = DDO_PLACEMENT_RESIDENT;
        loc->reason = DDO_REASON_BUDGET;
        loc->unit = NONE;
    }
}

static int resident_selection(builder *b, uint64_t budget, const double *unit_deficit)
{
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    ddo_selection how = DDO_SELECTION_SPREAD;
    if (!ddo__selection_from_name(b->o->resident_module_selection, &how))
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "resident_module_selection: \"%s\" is not one of first, spread, "
                         "largest, cost",
                         b->o->resident_module_selection ? b->o->resident_module_selection : "");
    if (how == DDO_SELECTION_COST && !p->cost_enabled) {
        how = DDO_SELECTION_SPREAD;
        ddo__decisions_set_str(d, "resident_module_selection_fallback", "spread");
    }
    ddo__decisions_set_str(d, "resident_module_selection", ddo__selection_name(how));
    if (budget == 0 || b->scope_count == 0) {
        ddo__decisions_set_gb(d, "selected_resident_module_gb", 0);
        return 0;
    }
    uint64_t *sizes = ddo__calloc(b->scope_count, sizeof(*sizes));
    size_t *order = ddo__calloc(b->scope_count, sizeof(*order));
    size_t *chosen = ddo__calloc(b->scope_count, sizeof(*chosen));
    double *deficits = ddo__calloc(b->scope_count, sizeof(*deficits));
    int rc = 0;
    if (sizes == NULL || order == NULL || chosen == NULL || deficits == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident selection");
        goto out;
    }
    for (size_t s = 0; s < b->scope_count; s++)
        sizes[s] = b->scopes[s].full_bytes;
    size_t n;
    uint64_t taken = 0;
    if (how == DDO_SELECTION_COST) {
        /* A scope's deficit is the sum of its units' deficits (a unit lies in one scope). */
        for (size_t u = 0; u < p->unit_count; u++) {
            size_t first = p->unit_tensors[p->units[u].first_tensor];
            const pmod *m = &b->mods[b->tmod[first]];
            size_t s = m->block != NONE && b->blocks[m->block].matches ? b->blocks[m->block].scope
                                                                       : m->scope;
            if (s != NONE)
                deficits[s] += unit_deficit[u];
        }
        n = ddo__select_by_cost(sizes, deficits, b->scope_count, budget, chosen, &taken);
    } else {
        ddo__select_order(sizes, b->scope_count, budget, how, order);
        n = ddo__select_greedy(sizes, order, b->scope_count, budget, chosen, &taken);
    }
    p->selected_resident = ddo__calloc(n ? n : 1, sizeof(char *));
    if (p->selected_resident == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident selection");
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        const pscope *sc = &b->scopes[chosen[k]];
        select_scope(b, sc);
        const char *nm = sc->is_block ? b->blocks[sc->index].name : b->mods[sc->index].name;
        size_t nl = sc->is_block ? b->blocks[sc->index].len : b->mods[sc->index].len;
        char *c = ddo__strndup(nm, nl);
        if (c == NULL) {
            rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident selection");
            goto out;
        }
        p->selected_resident[p->selected_resident_count++] = c;
    }
    ddo__decisions_set_gb(d, "selected_resident_module_gb", taken);
    make_budget_resident(b);
out:
    free(sizes);
    free(order);
    free(chosen);
    free(deficits);
    return rc;
}

/* Chooses whole units (indices into list) under budget with `how`; marks them in flags. */
static int choose_units(const ddo_plan *p, const size_t *list, size_t count, uint64_t budget,
                        ddo_selection how, bool *flags, uint64_t *taken)
{
    uint64_t *sizes = ddo__calloc(count ? count : 1, sizeof(*sizes));
    size_t *order = ddo__calloc(count ? count : 1, sizeof(*order));
    size_t *chosen = ddo__calloc(count ? count : 1, sizeof(*chosen));
    if (sizes == NULL || order == NULL || chosen == NULL) {
        free(sizes);
        free(order);
        free(chosen);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: unit selection");
    }
    for (size_t k = 0; k < count; k++)
        sizes[k] = p->units[list[k]].bytes;
    ddo__select_order(sizes, count, budget, how, order);
    size_t n = ddo__select_greedy(sizes, order, count, budget, chosen, taken);
    for (size_t k = 0; k < n; k++)
        flags[list[chosen[k]]] = true;
    free(sizes);
    free(order);
    free(chosen);
    return 0;
}

static uint64_t bytes_of(const ddo_plan *p, bool retained_only, bool registered_only)
{
    uint64_t s = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        if (un->resident || (retained_only && !un->retained) ||
            (registered_only && !un->registered))
            continue;
        s = sat_add(s, un->bytes);
    }
    return s;
}

/* Host-memory tensors of registered units are registered in place (host_pins.h; the retained
 * store never copies them). Sums, over the streamed host tensors of the registered units (all
 * streamed units with all_units), their bytes and what the registered account takes for them
 * (their inner pages plus the pinned arena of their end fragments). */
static void host_registered(const builder *b, bool all_units, bool residents, uint64_t *bytes,
                            uint64_t *pinned)
{
    const ddo_plan *p = b->p;
    *bytes = 0;
    *pinned = 0;
    ddo__host_range *r = ddo__calloc(b->n > 0 ? b->n : 1, sizeof(*r));
    size_t n = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        if (un->resident || !(un->registered || all_units))
            continue;
        for (size_t k = 0; k < un->tensor_count; k++) {
            size_t t = p->unit_tensors[un->first_tensor + k];
            const ddo_tensor_info *ti = b->ti[t];
            if (ti->file_index != UINT32_MAX || ti->host_data == NULL || ti->nbytes == 0 ||
                p->tensors[t].loc.placement != DDO_PLACEMENT_STREAMED)
                continue;
            *bytes = sat_add(*bytes, ti->nbytes);
            if (r != NULL)
                r[n++] = (ddo__host_range){ ti->host_data, ti->nbytes };
        }
    }
    for (size_t t = 0; residents && t < b->n; t++) {
        const ddo_tensor_info *ti = b->ti[t];
        if (p->tensors[t].loc.placement != DDO_PLACEMENT_RESIDENT || ti->host_data == NULL ||
            ti->nbytes == 0)
            continue;
        *bytes = sat_add(*bytes, ti->nbytes);
        if (r != NULL)
            r[n++] = (ddo__host_range){ ti->host_data, ti->nbytes };
    }
    /* Without the table (no memory), an upper bound: one more page per tensor. */
    *pinned = r != NULL ? ddo__host_pins_bytes(r, n) : sat_add(*bytes, (uint64_t)b->n * 65536u);
    free(r);
}

/* True for a checkpoint of a caller's host tensors (one built for planning only, without
 * data, plans as the files it stands for). */
static bool holds_host_data(const builder *b)
{
    if (ddo_checkpoint_file_count(b->ck) > 0)
        return false;
    for (size_t t = 0; t < b->n; t++)
        if (b->ti[t]->host_data != NULL)
            return true;
    return false;
}

/* What the three steps of host_side share: the streamed units (list), a scratch flag per
 * unit, the selection rule and the route. */
typedef struct host_ctx {
    size_t *list;
    bool *flags;
    size_t streamed;
    ddo_selection how;
    bool vmm_fast, vmm_nvme;
} host_ctx;

/* The retained store: which streamed units keep their bytes in host RAM. */
static int retained_store(builder *b, host_ctx *h, uint64_t available)
{
    ddo_plan *p = b->p;
    const ddo__options *o = b->o;
    ddo__decisions *d = &p->decisions;
    uint64_t retain_limit = 0; /* 0: no limit */
    bool retain = true;
    if (h->vmm_nvme) {
        retain = false;
        ddo__decisions_set_str(d, "retained_store", "none_vmm_runtime");
    } else if (h->vmm_fast) {
        retain_limit = floor_to(ddo__gb_to_bytes(o->vmm_source_cache_gb), DDO_SEGMENT_BYTES);
        if (retain_limit == 0) {
            retain = false;
            ddo__decisions_set_str(d, "retained_store", "disabled");
        }
    } else if (available > 0) {
        uint64_t hr = ddo__gb_to_bytes(o->system_ram_headroom_gb);
        retain_limit = floor_to(available > hr ? available - hr : 0, DDO_SEGMENT_BYTES);
        if (retain_limit == 0) {
            retain = false;
            ddo__decisions_set_str(d, "retained_store", "insufficient_ram");
        }
    }
    bool host_memory = holds_host_data(b);
    if (host_memory) {
        /* The caller's tensors are already in host RAM: nothing to retain, nothing to take. */
        for (size_t k = 0; k < h->streamed; k++)
            p->units[h->list[k]].retained = true;
        ddo__decisions_set_str(d, "retained_store", "host_memory");
    } else if (retain) {
        uint64_t total = bytes_of(p, false, false);
        if (retain_limit == 0 || ddo__round_up(total, DDO_SEGMENT_BYTES) <= retain_limit) {
            for (size_t k = 0; k < h->streamed; k++)
                p->units[h->list[k]].retained = true;
            ddo__decisions_set_str(d, "retained_store", "all");
        } else {
            int rc = choose_units(p, h->list, h->streamed, retain_limit, h->how, h->flags, NULL);
            if (rc != 0)
                return rc;
            for (size_t k = 0; k < h->streamed; k++)
                p->units[h->list[k]].retained = h->flags[h->list[k]];
            ddo__decisions_set_str(d, "retained_store", "partial");
        }
    }
    p->budgets.retained_limit = retain_limit;
    p->budgets.retained_peak =
        host_memory ? 0 : ddo__round_up(bytes_of(p, true, false), DDO_SEGMENT_BYTES);
    return 0;
}

/* Registration within the retained store. */
static int registration(builder *b, host_ctx *h, const ddo__pin_resolution *pin, bool pin_skipped)
{
    ddo_plan *p = b->p;
    ddo_plan_budgets *bg = &p->budgets;
    bool wsl_blocked = b->settings.running_on_wsl && b->settings.disable_pin_on_wsl;
    const char *reg = NULL;
    uint64_t reg_limit = 0;
    bool partial = false;
    if (h->vmm_nvme)
        reg = "none_vmm_runtime";
    else if (h->vmm_fast) {
        if (wsl_blocked)
            reg = "pin_disabled_on_wsl";
        else {
            reg_limit =
                floor_to(ddo__gb_to_bytes(b->o->vmm_source_registered_gb), DDO_SEGMENT_BYTES);
            partial = reg_limit > 0;
        }
    } else {
        if (!b->settings.requested_pin_cpu_memory)
            reg = "pin_cpu_memory_off";
        else if (!b->settings.effective_pin_cpu_memory)
            reg = "pin_disabled_on_wsl";
        else if (pin_skipped)
            reg = "skip_insufficient_ram";
        else if (pin->mode == DDO_PIN_MODE_LIMITED) {
            reg_limit = floor_to(pin->budget, DDO_SEGMENT_BYTES);
            partial = true;
        }
    }
    if (reg == NULL) {
        size_t rn = 0;
        for (size_t k = 0; k < h->streamed; k++)
            if (p->units[h->list[k]].retained)
                h->list[rn++] = h->list[k];
        /* Host tensors take their arena's rounding on top of their bytes: keep room for it. */
        uint64_t hb = 0, hp = 0;
        host_registered(b, true, false, &hb, &hp);
        uint64_t fringe = hp > hb ? hp - hb : 0;
        if (partial && sat_add(ddo__round_up(bytes_of(p, true, false), DDO_SEGMENT_BYTES), fringe) >
                           reg_limit) {
            memset(h->flags, 0, p->unit_count * sizeof(*h->flags));
            int rc = choose_units(p, h->list, rn, reg_limit > fringe ? reg_limit - fringe : 0,
                                  h->how, h->flags, NULL);
            if (rc != 0)
                return rc;
            for (size_t k = 0; k < rn; k++)
                p->units[h->list[k]].registered = h->flags[h->list[k]];
            reg = "partial";
        } else {
            for (size_t k = 0; k < rn; k++)
                p->units[h->list[k]].registered = true;
            reg = rn > 0 ? "all_retained" : "nothing_retained";
        }
    }
    ddo__decisions_set_str(&p->decisions, "registration", reg);
    bg->registered_limit = reg_limit;
    uint64_t host_bytes = 0, host_pages = 0; /* pages: what registering them in place takes */
    host_registered(b, false, false, &host_bytes, &host_pages);
    /* A caller's resident tensors are registered in place too when every streamed byte is and
     * the limit allows (their setup upload and every reload then read them directly); else
     * they are uploaded through the bounce buffer. */
    uint64_t rb = 0, rp = 0;
    bool residents = holds_host_data(b) &&
                     (strcmp(reg, "all_retained") == 0 || strcmp(reg, "nothing_retained") == 0);
    if (residents) {
        host_registered(b, false, true, &rb, &rp);
        residents = reg_limit == 0 || rp <= reg_limit;
    }
    if (holds_host_data(b))
        ddo__decisions_set_str(&p->decisions, "host_residents",
                               residents ? "registered_in_place" : "bounce_buffer");
    bg->registered_peak = ddo__round_up(bytes_of(p, false, true) - host_bytes, DDO_SEGMENT_BYTES);
    if (bg->registered_peak > bg->retained_peak)
        bg->registered_peak = bg->retained_peak;
    bg->registered_peak = sat_add(bg->registered_peak, residents ? rp : host_pages);
    return 0;
}

/* Staging: whatever streams and is not registered travels through pinned windows. A retained
 * store the machine cannot hold is refused (the linear route sizes itself). */
static int staging(builder *b, const host_ctx *h, uint64_t available)
{
    ddo_plan *p = b->p;
    ddo_plan_budgets *bg = &p->budgets;
    uint64_t staging_bytes =
        floor_to(ddo__gb_to_bytes(b->o->vmm_staging_buffer_gb), DDO_STAGING_WINDOW_BYTES);
    size_t windows = (size_t)(staging_bytes / DDO_STAGING_WINDOW_BYTES);
    bool staging_needed = false;
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident && !p->units[u].registered)
            staging_needed = true;
    bg->staging_window_bytes = DDO_STAGING_WINDOW_BYTES;
    if (h->vmm_nvme && h->streamed > 0) {
        if (windows < 1)
            windows = 1;
        bg->staging_windows = 2 * windows;
    } else if (staging_needed) {
        bg->staging_windows = windows < 2 ? 2 : windows;
    }
    bg->staging_peak = (uint64_t)bg->staging_windows * DDO_STAGING_WINDOW_BYTES;
    if (h->vmm_fast && available > 0 && sat_add(bg->retained_peak, bg->staging_peak) > available) {
        char b1[32], b2[32], b3[32], b4[32];
        return ddo__fail(NULL, DDO_E_BUDGET,
                         "retained host needs %s (retained %s + staging %s) but %s of RAM are "
                         "available; lower vmm_source_cache_gb",
                         fmt_gib(sat_add(bg->retained_peak, bg->staging_peak), b1, sizeof(b1)),
                         fmt_gib(bg->retained_peak, b2, sizeof(b2)),
                         fmt_gib(bg->staging_peak, b3, sizeof(b3)),
                         fmt_gib(available, b4, sizeof(b4)));
    }
    return 0;
}

/* Retained store, registration and staging for the route. */
static int host_side(builder *b, uint64_t available, const ddo__pin_resolution *pin,
                     bool pin_skipped)
{
    ddo_plan *p = b->p;
    const ddo__options *o = b->o;
    const char *mode = o->execution_mode != NULL ? o->execution_mode : "";
    host_ctx h;
    memset(&h, 0, sizeof(h));
    h.vmm_fast = strcmp(mode, "vmm_fast_runtime") == 0;
    h.vmm_nvme = strcmp(mode, "vmm_runtime") == 0;
    h.how = DDO_SELECTION_SPREAD;
    if (!ddo__selection_from_name(o->pin_weight_selection, &h.how) || h.how == DDO_SELECTION_COST)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "pin_weight_selection: \"%s\" is not one of first, spread, largest",
                         o->pin_weight_selection ? o->pin_weight_selection : "");
    h.list = ddo__calloc(p->unit_count ? p->unit_count : 1, sizeof(*h.list));
    h.flags = ddo__calloc(p->unit_count ? p->unit_count : 1, sizeof(*h.flags));
    int rc = 0;
    if (h.list == NULL || h.flags == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: retained store");
        goto out;
    }
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident)
            h.list[h.streamed++] = u;
    if ((rc = retained_store(b, &h, available)) == 0 &&
        (rc = registration(b, &h, pin, pin_skipped)) == 0)
        rc = staging(b, &h, available);
out:
    free(h.list);
    free(h.flags);
    return rc;
}

/* The execution-slot page: vmm_page_mb in bytes (0 = the granularity gran), a whole multiple
 * of gran. Range-checked before the cast, beside the catalog's own check. */
static int slot_page(double mb, uint64_t gran, uint64_t *page)
{
    if (!(mb > 0.0))
        return 0;
    *page = isfinite(mb) && mb <= 1048576.0 ? (uint64_t)(mb * (double)DDO_MIB) : 0;
    if (*page != 0 && *page % gran == 0)
        return 0;
    char q[64], g[64];
    ddo__format_bytes(gran, g, sizeof(g));
    if (isfinite(mb))
        ddo__config_fmt_double(mb, q, sizeof(q));
    else
        snprintf(q, sizeof(q), "%s", isnan(mb) ? "nan" : "inf");
    return ddo__fail(NULL, DDO_E_CONFIG,
                     "vmm_page_mb=%s: the execution-slot page must be a whole multiple of the "
                     "device granularity (%s) and at most 1048576 MiB",
                     q, g);
}

/* DDO_E_BUDGET: the device weights of plan p exceed limit; the advice names what to change. */
static int refuse_device_weights(const ddo_plan *p, int64_t want, uint64_t limit,
                                 const char *limit_source)
{
    const ddo_plan_budgets *bg = &p->budgets;
    char a[32], r[32], s[32], l[32];
    bool chosen = false;
    for (size_t u = 0; u < p->unit_count; u++)
        chosen = chosen || p->units[u].resident;
    const char *advice = chosen && want > 2 ? ", lower resident_module_budget_gb or lower "
                                              "execution_slots"
                         : chosen           ? " or lower resident_module_budget_gb"
                         : want > 2         ? " or lower execution_slots"
                                            : " or set unit_granularity=leaf (smaller slots)";
    return ddo__fail(NULL, DDO_E_BUDGET,
                     "device weights need %s (resident %s + %zu slots × %s) but the limit "
                     "is %s (%s); raise vmm_resident_weight_budget_gb%s",
                     fmt_gib(bg->device_weights_peak, a, sizeof(a)),
                     fmt_gib(bg->resident_bytes, r, sizeof(r)), bg->slot_count,
                     fmt_gib(bg->slot_bytes, s, sizeof(s)), fmt_gib(limit, l, sizeof(l)),
                     limit_source, advice);
}

/* Resident arena offsets, slot size and count, and the device-weights check. */
static int device_side(builder *b, uint64_t limit, const char *limit_source)
{
    ddo_plan *p = b->p;
    ddo_plan_budgets *bg = &p->budgets;
    ddo__decisions *d = &p->decisions;
    uint64_t gran = b->in.device_granularity > 0 ? b->in.device_granularity : 2 * DDO_MIB;
    uint64_t page = gran;
    int rc = slot_page(b->o->vmm_page_mb, gran, &page);
    if (rc != 0)
        return rc;
    uint64_t arena = 0;
    for (size_t i = 0; i < b->n; i++) {
        ddo_tensor_location *loc = &p->tensors[i].loc;
        if (loc->placement != DDO_PLACEMENT_RESIDENT)
            continue;
        arena = ddo__round_up(arena, DDO_TENSOR_ALIGN);
        loc->offset = arena;
        arena = sat_add(arena, loc->nbytes);
    }
    bg->resident_bytes = arena;
    /* vmm_runtime: a slot holds the largest unit's weights, each in its own handle. */
    bool per_weight =
        b->o->execution_mode != NULL && strcmp(b->o->execution_mode, "vmm_runtime") == 0;
    uint64_t largest = 0;
    size_t largest_unit = 0;
    bool streaming = false;
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident) {
            uint64_t bytes = per_weight ? per_weight_bytes(p, u, gran) : p->units[u].span_bytes;
            if (!streaming || bytes > largest) {
                largest = bytes;
                largest_unit = u;
            }
            streaming = true;
        }
    if (per_weight)
        bg->slot_bytes = streaming ? (largest > gran ? largest : gran) : 0;
    else
        bg->slot_bytes = streaming ? ddo__round_up(largest, page) : 0;
    int64_t want = b->o->execution_slots;
    size_t slots = 0;
    const char *how = "none_streamed";
    if (streaming && want > 0) {
        slots = want < 2 ? 2 : (size_t)want;
        how = want < 2 ? "raised_to_two" : "explicit";
    } else if (streaming) {
        slots = 3;
        how = "auto_three";
        if (limit > 0 && sat_add(arena, sat_mul(3, bg->slot_bytes)) > limit) {
            slots = 2;
            how = "auto_two";
        }
    }
    if (per_weight && streaming && limit > 0 && sat_add(arena, bg->slot_bytes) > limit) {
        /* vmm_runtime: not even the largest unit's weights fit; the session refuses the same. */
        char g1[32], s1[32], r1[32], n1[32], l1[32];
        return ddo__fail(NULL, DDO_E_BUDGET,
                         "device weights: vmm_runtime maps every weight into its own %s-aligned "
                         "range, so unit \"%s\" needs %s (+ resident %s = %s) but the mapped "
                         "budget is %s (%s); raise it or set unit_granularity=leaf",
                         ddo__format_bytes(gran, g1, sizeof(g1)), p->units[largest_unit].name,
                         ddo__format_bytes(bg->slot_bytes, s1, sizeof(s1)),
                         ddo__format_bytes(arena, r1, sizeof(r1)),
                         ddo__format_bytes(sat_add(arena, bg->slot_bytes), n1, sizeof(n1)),
                         ddo__format_bytes(limit, l1, sizeof(l1)), limit_source);
    }
    bg->slot_count = slots;
    ddo__decisions_set_str(d, "slot_count_decision", how);
    bg->device_weights_peak = sat_add(arena, sat_mul(slots, bg->slot_bytes));
    bg->device_weights_limit = limit;
    if (limit > 0 && bg->device_weights_peak > limit)
        return refuse_device_weights(p, want, limit, limit_source);
    return 0;
}

/* The budgets build() carries from the policy to placement, pinning and the device side. */
typedef struct budgets_in {
    uint64_t A, V, M; /* available RAM, device memory, candidate resident bytes */
    bool balanced;
    uint64_t resident_budget, pin_budget;
    double pin_ratio;
    bool force_full, skip_pin, auto_resident;
} budgets_in;

/* Names, totals, modules, patterns and scopes: everything placement needs. */
static int build_tables(builder *b)
{
    const ddo__options *o = b->o;
    ddo_plan *p = b->p;
    b->leaf = o->unit_granularity != NULL && strcmp(o->unit_granularity, "leaf") == 0;
    b->threshold =
        o->small_tensor_threshold_bytes > 0 ? (uint64_t)o->small_tensor_threshold_bytes : 0;
    p->unit_granularity = ddo__strdup(b->leaf ? "leaf" : "block");
    p->route = ddo__strdup(b->settings.route != NULL   ? b->settings.route
                           : o->execution_mode != NULL ? o->execution_mode
                                                       : "");
    p->tensors = ddo__calloc(b->n ? b->n : 1, sizeof(*p->tensors));
    if (p->unit_granularity == NULL || p->route == NULL || p->tensors == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b->n);
    p->tensor_count = b->n;
    for (size_t i = 0; i < b->n; i++) {
        p->tensors[i].name = ddo__strdup(b->ti[i]->name);
        if (p->tensors[i].name == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: tensor names");
        p->total_bytes = sat_add(p->total_bytes, b->ti[i]->nbytes);
    }
    int rc;
    if ((rc = build_modules(b)) != 0 || (rc = compile_patterns(b)) != 0 ||
        (rc = resolve_resident_patterns(b)) != 0 || (rc = build_scopes(b)) != 0)
        return rc;
    ddo__decisions_set_str(&p->decisions, "route", p->route);
    ddo__decisions_set_str(&p->decisions, "unit_granularity", p->unit_granularity);
    return 0;
}

/* The explicit budgets, then the balanced policy over them (section 3.7) when it is on. */
static void budget_policy(builder *b, budgets_in *bi)
{
    const ddo__options *o = b->o;
    ddo__decisions *d = &b->p->decisions;
    uint64_t W = 0, M = 0; /* the balanced policy's inputs */
    for (size_t i = 0; i < b->n; i++) {
        const pmod *m = &b->mods[b->tmod[i]];
        if (is_eligible(b, i) && !m->always && b->ti[i]->nbytes > b->threshold)
            W = sat_add(W, b->ti[i]->nbytes);
    }
    for (size_t s = 0; s < b->scope_count; s++)
        M = sat_add(M, b->scopes[s].full_bytes);
    memset(bi, 0, sizeof(*bi));
    bi->M = M;
    bi->A = o->available_system_ram_gb > 0.0 ? ddo__gb_to_bytes(o->available_system_ram_gb)
                                             : b->in.host_available_bytes;
    bi->V = b->in.device_total_bytes;
    bi->balanced = o->auto_budget_policy != NULL && strcmp(o->auto_budget_policy, "balanced") == 0;
    bi->resident_budget = ddo__gb_to_bytes(o->resident_module_budget_gb);
    bi->pin_budget = ddo__gb_to_bytes(o->pin_weight_budget_gb);
    bi->pin_ratio = o->pin_weight_budget_ratio > 1.0   ? 1.0
                    : o->pin_weight_budget_ratio > 0.0 ? o->pin_weight_budget_ratio
                                                       : 0.0;
    if (!bi->balanced) {
        ddo__decisions_set_str(d, "auto_budget_policy", "off");
        return;
    }
    ddo__balanced_in in = {
        .resident_budget = bi->resident_budget,
        .pin_budget = bi->pin_budget,
        .pin_ratio = bi->pin_ratio,
        .max_resident = ddo__gb_to_bytes(o->max_resident_module_budget_gb),
        .max_pin = ddo__gb_to_bytes(o->max_pin_weight_budget_gb),
        .available_ram = bi->A,
        .ram_headroom = ddo__gb_to_bytes(o->system_ram_headroom_gb),
        .total_vram = bi->V,
        .vram_headroom_option = ddo__gb_to_bytes(o->auto_vram_headroom_gb),
        .full_pin_min_ratio = o->auto_full_pin_min_model_to_vram_ratio,
        .profile_resident = ddo__gb_to_bytes(o->profile_resident_module_budget_gb),
        .profile_applied = o->profile_resident_module_budget_gb > 0.0,
        .pin_requested = o->pin_cpu_memory,
        .candidate_weight = W,
        .candidate_resident = M,
    };
    ddo__balanced_out bo;
    ddo__balanced_policy(&in, &bo, d);
    bi->auto_resident = bi->resident_budget == 0 && bo.resident_budget > 0;
    bi->resident_budget = bo.resident_budget;
    if (bo.pin_decided) {
        bi->pin_budget = bo.pin_budget;
        bi->pin_ratio = bo.pin_ratio;
    }
    bi->force_full = bo.force_full_pin;
    bi->skip_pin = bo.skip_pin;
}

/* Calibration and full pinning clear the always-resident set. */
static void calibration_and_full_pin(builder *b, budgets_in *bi)
{
    ddo__decisions *d = &b->p->decisions;
    bool any_always = false;
    for (size_t m = 0; m < b->mod_count; m++)
        any_always = any_always || (b->mods[m].always && !b->mods[m].skipped);
    if (b->o->build_profile) {
        bi->resident_budget = 0;
        bi->auto_resident = false;
        b->clear_always = true;
        ddo__decisions_set_gb(d, "auto_resident_module_budget_gb", 0);
        ddo__decisions_set_str(d, "auto_resident_module_decision", "profile_calibration");
    }
    if (bi->force_full) {
        b->clear_always = true;
        if (any_always)
            ddo__decisions_set_str(d, "auto_always_resident_decision", "offload_for_zero_resident");
    }
}

/* The device weights limit and where it comes from (source, len bytes). */
static int device_limit(builder *b, const budgets_in *bi, uint64_t *limit, char *source, size_t len)
{
    const ddo__options *o = b->o;
    const char *mode = o->execution_mode != NULL ? o->execution_mode : "";
    uint64_t V = bi->V;
    *limit = 0;
    snprintf(source, len, "none");
    uint64_t explicit_limit = ddo__gb_to_bytes(o->vmm_resident_weight_budget_gb);
    if (strcmp(mode, "vmm_runtime") == 0 && explicit_limit == 0)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "vmm_resident_weight_budget_gb: the vmm_runtime route needs a positive "
                         "mapped budget");
    if (explicit_limit > 0) {
        *limit = explicit_limit;
        snprintf(source, len, "vmm_resident_weight_budget_gb");
    } else if (V > 0) {
        char v1[32], v2[32];
        if (bi->balanced) {
            double ratio = (double)bi->M / (double)V;
            uint64_t h = o->auto_vram_headroom_gb > 0.0 ? ddo__gb_to_bytes(o->auto_vram_headroom_gb)
                                                        : ddo__vram_headroom_default(V, ratio);
            /* As the resident target: never below 1 GiB (nor above the card). */
            *limit = V > h && V - h > DDO_GIB ? V - h : (V < DDO_GIB ? V : DDO_GIB);
            snprintf(source, len, "device memory %s minus %s auto VRAM headroom%s",
                     fmt_gib(V, v1, sizeof(v1)), fmt_gib(h, v2, sizeof(v2)),
                     *limit == V - h ? "" : ", at least 1 GiB");
        } else {
            *limit = V;
            snprintf(source, len, "device memory %s", fmt_gib(V, v1, sizeof(v1)));
        }
    }
    b->p->device_limit_source = ddo__strdup(source);
    ddo__decisions_set_str(&b->p->decisions, "device_weights_limit_source",
                           *limit > 0 ? source : "none");
    return 0;
}

/* ddo: an automatic resident budget leaves room for two slots and the fixed residents. */
static void cap_auto_resident(builder *b, budgets_in *bi, uint64_t limit)
{
    ddo_plan *p = b->p;
    if (!bi->auto_resident || limit == 0)
        return;
    uint64_t largest = 0, fixed = 0;
    uint64_t gran = b->in.device_granularity > 0 ? b->in.device_granularity : 2 * DDO_MIB;
    bool per_weight =
        b->o->execution_mode != NULL && strcmp(b->o->execution_mode, "vmm_runtime") == 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        uint64_t bytes = per_weight ? per_weight_bytes(p, u, gran) : p->units[u].span_bytes;
        if (bytes > largest)
            largest = bytes;
    }
    for (size_t i = 0; i < b->n; i++)
        if (p->tensors[i].loc.placement == DDO_PLACEMENT_RESIDENT)
            fixed = sat_add(fixed, ddo__round_up(p->tensors[i].loc.nbytes, DDO_TENSOR_ALIGN));
    uint64_t reserve = sat_add(fixed, sat_mul(2, ddo__round_up(largest, gran)));
    uint64_t room = limit > reserve ? limit - reserve : 0;
    if (bi->resident_budget > room) {
        bi->resident_budget = room;
        ddo__decisions_set_gb(&p->decisions, "auto_resident_module_budget_slot_cap_gb", room);
    }
}

/* Placement, units and the cost model, then the resident selection under the budget. */
static int place_and_select(builder *b, budgets_in *bi, uint64_t *limit, char *source, size_t len)
{
    ddo_plan *p = b->p;
    int rc;
    if ((rc = place_and_build_units(b)) != 0)
        return rc;
    layout_units(b);
    double *deficit = ddo__calloc(p->unit_count ? p->unit_count : 1, sizeof(double));
    if (deficit == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: cost model");
    cost_model(b, deficit);
    p->cost_reason = ddo__strdup(p->cost_enabled ? ""
                                 : !(b->in.bus_bytes_per_s > 0.0)
                                     ? "no bus bandwidth (inputs.bus_bytes_per_s is 0)"
                                     : "no compute rate (inputs.flops_per_s is 0)");
    if ((rc = device_limit(b, bi, limit, source, len)) != 0) {
        free(deficit);
        return rc;
    }
    cap_auto_resident(b, bi, *limit);
    ddo__decisions_set_gb(&p->decisions, "resident_module_budget_gb", bi->resident_budget);
    rc = resident_selection(b, bi->resident_budget, deficit);
    free(deficit);
    if (rc != 0)
        return rc;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        size_t prev = u > 0 ? u - 1 : p->unit_count - 1;
        if (un->resident)
            un->transfer_s = 0.0;
        un->hidden = un->resident || un->transfer_s <= p->units[prev].compute_s;
    }
    return 0;
}

static int build(builder *b)
{
    const ddo__options *o = b->o;
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    int rc;
    if ((rc = build_tables(b)) != 0)
        return rc;
    budgets_in bi;
    budget_policy(b, &bi);
    calibration_and_full_pin(b, &bi);
    uint64_t limit = 0;
    char source[160];
    if ((rc = place_and_select(b, &bi, &limit, source, sizeof(source))) != 0)
        return rc;

    /* Pin resolution on the linear routes (section 3.8). */
    const char *mode = o->execution_mode != NULL ? o->execution_mode : "";
    ddo__pin_resolution pin = { DDO_PIN_MODE_UNLIMITED_FULL_PIN, 0, false };
    if (strcmp(mode, "vmm_fast_runtime") != 0 && strcmp(mode, "vmm_runtime") != 0) {
        uint64_t C = 0;
        for (size_t i = 0; i < b->n; i++)
            if (p->tensors[i].eligible && p->tensors[i].loc.placement == DDO_PLACEMENT_STREAMED)
                C = sat_add(C, p->tensors[i].loc.nbytes);
        ddo__pin_resolve(C, bi.pin_budget, bi.pin_ratio,
                         ddo__gb_to_bytes(o->max_pin_weight_budget_gb), bi.force_full, &pin, d);
    }
    if ((rc = host_side(b, bi.A, &pin, bi.skip_pin)) != 0)
        return rc;
    if ((rc = device_side(b, limit, source)) != 0)
        return rc;
    p->budgets.predicted_step_s = simulate(p, p->budgets.slot_count);
    for (size_t i = 0; i < b->n; i++) {
        const ddo_tensor_location *loc = &p->tensors[i].loc;
        p->bytes_by_placement[loc->placement] =
            sat_add(p->bytes_by_placement[loc->placement], loc->nbytes);
        p->bytes_by_reason[loc->reason] = sat_add(p->bytes_by_reason[loc->reason], loc->nbytes);
    }
    if (d->failed || p->cost_reason == NULL || p->device_limit_source == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: decisions");
    return 0;
}

ddo_plan *ddo__plan_alloc(void)
{
    return ddo__calloc(1, sizeof(ddo_plan));
}

int ddo_plan_build(const ddo_checkpoint *ck, const ddo_config *cfg, const ddo_plan_inputs *inputs,
                   ddo_plan **out)
{
    if (ck == NULL || cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_plan_build: checkpoint, config and out are required");
    const ddo__options *o = ddo__config_options(cfg);
    if (o == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_build: config has no options");
    int rc = ddo__config_check_ranges(cfg);
    if (rc != 0)
        return rc;
    builder b;
    memset(&b, 0, sizeof(b));
    b.ck = ck;
    b.o = o;
    if (inputs != NULL && (rc = DDO__ABI_IN(ddo_plan_inputs, inputs, &b.in)) != 0)
        return rc;
    if (ddo_config_settings(cfg, &b.settings) != 0) {
        memset(&b.settings, 0, sizeof(b.settings));
        b.settings.requested_pin_cpu_memory = o->pin_cpu_memory;
        b.settings.effective_pin_cpu_memory = o->pin_cpu_memory;
        b.settings.disable_pin_on_wsl = o->disable_pin_on_wsl;
    }
    b.n = ddo_checkpoint_tensor_count(ck);
    b.p = ddo__plan_alloc();
    b.ti = ddo__calloc(b.n ? b.n : 1, sizeof(*b.ti));
    if (b.p == NULL || b.ti == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b.n);
        goto out;
    }
    b.p->inputs = b.in;
    for (size_t i = 0; i < b.n; i++) {
        b.ti[i] = ddo_checkpoint_tensor(ck, i);
        if (b.ti[i] == NULL || b.ti[i]->name == NULL) {
            rc = ddo__fail(NULL, DDO_E_INTERNAL, "plan: tensor %zu missing", i);
            goto out;
        }
    }
    rc = build(&b);
out:
    rxset_free(&b.skip);
    rxset_free(&b.always);
    rxset_free(&b.vmm);
    rxset_free(&b.resident);
    free(b.ti);
    free(b.tmod);
    free(b.mods);
    free(b.blocks);
    free(b.scopes);
    if (rc != 0) {
        ddo_plan_destroy(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}

void ddo_plan_destroy(ddo_plan *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->tensor_count && p->tensors != NULL; i++)
        free(p->tensors[i].name);
    free(p->tensors);
    for (size_t u = 0; u < p->unit_count && p->units != NULL; u++)
        free(p->units[u].name);
    free(p->units);
    free(p->unit_tensors);
    for (size_t i = 0; i < p->resident_pattern_count; i++)
        free(p->resident_patterns[i]);
    free(p->resident_patterns);
    for (size_t i = 0; i < p->selected_resident_count; i++)
        free(p->selected_resident[i]);
    free(p->selected_resident);
    free(p->route);
    free(p->unit_granularity);
    free(p->device_limit_source);
    free(p->cost_reason);
    ddo__decisions_free(&p->decisions);
    free(p);
}

/* ---- accessors ---- */

size_t ddo_plan_unit_count(const ddo_plan *p)
{
    return p != NULL ? p->unit_count : 0;
}

int ddo_plan_unit(const ddo_plan *p, size_t unit, ddo_unit_info *out)
{
    if (p == NULL || out == NULL || unit >= p->unit_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_unit: unit %zu out of range",
                         unit);
    const ddo__plan_unit *u = &p->units[unit];
    ddo_unit_info info = {
        .name = u->name,
        .first_tensor = u->first_tensor,
        .tensor_count = u->tensor_count,
        .bytes = u->bytes,
        .flops_per_token = u->flops_per_token,
        .resident = u->resident,
        .retained = u->retained,
        .registered = u->registered,
        .transfer_s = u->transfer_s,
        .compute_s = u->compute_s,
        .hidden = u->hidden,
    };
    *out = info;
    return 0;
}

const size_t *ddo_plan_unit_tensors(const ddo_plan *p, size_t unit, size_t *count)
{
    if (p == NULL || unit >= p->unit_count) {
        if (count != NULL)
            *count = 0;
        return NULL;
    }
    if (count != NULL)
        *count = p->units[unit].tensor_count;
    return p->unit_tensors + p->units[unit].first_tensor;
}

ddo_placement ddo_plan_tensor_placement(const ddo_plan *p, size_t tensor, ddo_reason *reason)
{
    if (p == NULL || tensor >= p->tensor_count) {
        if (reason != NULL)
            *reason = DDO_REASON_NONE;
        return DDO_PLACEMENT_SKIPPED;
    }
    if (reason != NULL)
        *reason = p->tensors[tensor].loc.reason;
    return p->tensors[tensor].loc.placement;
}

size_t ddo_plan_tensor_unit(const ddo_plan *p, size_t tensor)
{
    if (p == NULL || tensor >= p->tensor_count)
        return SIZE_MAX;
    return p->tensors[tensor].loc.unit;
}

int ddo_plan_tensor_location(const ddo_plan *p, size_t tensor, ddo_tensor_location *out)
{
    if (p == NULL || out == NULL || tensor >= p->tensor_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_plan_tensor_location: tensor %zu out of range", tensor);
    *out = p->tensors[tensor].loc;
    return 0;
}

int ddo_plan_budgets_get(const ddo_plan *p, ddo_plan_budgets *out)
{
    if (p == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_budgets_get: plan and out");
    *out = p->budgets;
    return 0;
}

size_t ddo_plan_decision_count(const ddo_plan *p)
{
    return p != NULL ? p->decisions.count : 0;
}

int ddo_plan_decision(const ddo_plan *p, size_t i, const char **key, const char **value)
{
    if (p == NULL || i >= p->decisions.count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_decision: %zu out of range", i);
    if (key != NULL)
        *key = p->decisions.items[i].key;
    if (value != NULL)
        *value = p->decisions.items[i].value;
    return 0;
}

const char *ddo_plan_route(const ddo_plan *p)
{
    return p != NULL && p->route != NULL ? p->route : "";
}

const char *ddo_plan_error(const ddo_plan *p)
{
    return p != NULL ? p->err.msg : "";
}

size_t ddo_plan_tensor_count(const ddo_plan *p)
{
    return p != NULL ? p->tensor_count : 0;
}

const char *ddo_plan_decision_get(const ddo_plan *p, const char *key)
{
    if (p == NULL || key == NULL)
        return NULL;
    return ddo__decisions_get(&p->decisions, key);
}
