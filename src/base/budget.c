/*
 * budget.c - budget accounts: refuse before the system call, count peaks.
 */
#include "base/budget.h"

void ddo__account_init(ddo__account *a, const char *name, const char *option, uint64_t limit)
{
    a->name = name;
    a->option = option;
    a->limit = limit;
    a->used = 0;
    a->peak = 0;
    ddo__mutex_init(&a->lock);
}

void ddo__account_fini(ddo__account *a)
{
    ddo__mutex_destroy(&a->lock);
}

int ddo__account_take(ddo__account *a, uint64_t bytes, ddo__errbuf *eb)
{
    ddo__mutex_lock(&a->lock);
    uint64_t after;
    if (!ddo__add_u64(a->used, bytes, &after) || after > a->limit) {
        uint64_t used = a->used;
        ddo__mutex_unlock(&a->lock);
        char b1[32], b2[32], b3[32];
        return ddo__fail(eb, DDO_E_BUDGET, "%s: taking %s would use %s of %s (%s)", a->name,
                         ddo__format_bytes(bytes, b1, sizeof(b1)),
                         ddo__format_bytes(used + bytes, b2, sizeof(b2)),
                         ddo__format_bytes(a->limit, b3, sizeof(b3)), a->option);
    }
    a->used = after;
    if (after > a->peak)
        a->peak = after;
    ddo__mutex_unlock(&a->lock);
    return 0;
}

void ddo__account_give(ddo__account *a, uint64_t bytes)
{
    ddo__mutex_lock(&a->lock);
    DDO_ASSERT(bytes <= a->used);
    a->used = bytes <= a->used ? a->used - bytes : 0;
    ddo__mutex_unlock(&a->lock);
}

uint64_t ddo__account_used(ddo__account *a)
{
    ddo__mutex_lock(&a->lock);
    uint64_t v = a->used;
    ddo__mutex_unlock(&a->lock);
    return v;
}

uint64_t ddo__account_peak(ddo__account *a)
{
    ddo__mutex_lock(&a->lock);
    uint64_t v = a->peak;
    ddo__mutex_unlock(&a->lock);
    return v;
}
