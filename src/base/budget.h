/*
 * budget.h - budget accounts. Every pinned, registered, retained and device
 * byte a session takes goes through an account that refuses BEFORE the
 * system call, and every account returns to zero at destroy.
 */
#ifndef DDO_BUDGET_H
#define DDO_BUDGET_H

#include "base/common.h"

#include "os/thread.h"
#include <stdint.h>

typedef struct ddo__account {
    const char *name;   /* "device weights", "retained host", ... */
    const char *option; /* the option that sets the limit, for messages */
    uint64_t limit;     /* UINT64_MAX = unlimited */
    uint64_t used;
    uint64_t peak;
    ddo__mutex lock;
} ddo__account;

void ddo__account_init(ddo__account *a, const char *name, const char *option, uint64_t limit);
void ddo__account_fini(ddo__account *a);
/*
 * Takes bytes or refuses with DDO_E_BUDGET: "retained host: taking 64.00 MiB
 * would use 8.06 GiB of 8.00 GiB (vmm_source_cache_gb)". Thread-safe.
 */
int ddo__account_take(ddo__account *a, uint64_t bytes, ddo__errbuf *eb);
void ddo__account_give(ddo__account *a, uint64_t bytes);
uint64_t ddo__account_used(ddo__account *a);
uint64_t ddo__account_peak(ddo__account *a);

#endif /* DDO_BUDGET_H */
