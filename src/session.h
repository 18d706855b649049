/*
 * session.h - the session runtime's internal state, shared by session.c
 * (create/destroy, lifecycle, metrics) and session_slots.c (slots, leases,
 * the loader thread, prefetch, reclaim). Internal; never installed.
 *
 * Threads: the host thread (one at a time per session) calls the public
 * functions; one loader thread issues the uploads. Both share the slot table
 * and the job queue under `mu`; `cv` signals job issue and loader idleness.
 * The loader performs device calls without holding `mu`, and no thread
 * blocks on the device (event/stream synchronize) while holding `mu`.
 */
#ifndef DDO_SESSION_H
#define DDO_SESSION_H

#include "budget.h"
#include "common.h"
#include "metrics.h"
#include "source.h"
#include "staging.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDO__NONE SIZE_MAX
/* The reclaim margin of the seed: free device memory below request + 256 MiB is pressure. */
#define DDO__RECLAIM_MARGIN_BYTES (256 * DDO_MIB)
/* Copies from registered memory are issued in pieces of this size (>= 8 MiB). */
#define DDO__COPY_PIECE_BYTES (64 * DDO_MIB)
/* The bounce buffer used for staged bytes when the plan has no staging ring. */
#define DDO__BOUNCE_BYTES (8 * DDO_MIB)

typedef enum ddo__slot_state {
    DDO__SLOT_FREE,
    DDO__SLOT_LOADING,
    DDO__SLOT_READY,
    DDO__SLOT_LEASED,
    DDO__SLOT_RETIRING
} ddo__slot_state;

typedef struct ddo__slot {
    ddo__slot_state state;
    size_t unit;        /* unit held (DDO__NONE: none) */
    size_t mapped_unit; /* VMM: unit whose range the handle is mapped into */
    bool backed;        /* holds a physical handle / device buffer (vmm_runtime: has a unit's
                           weights mapped, each with its own handle) */
    bool unsafe;        /* a release failed: never reused, never freed again */
    bool prefetched;    /* loaded ahead of its acquire, not acquired yet */
    bool issued;        /* LOADING: the loader has issued every copy (or failed) */
    bool upload_recorded;
    bool release_recorded;
    uint64_t handle; /* VMM physical handle */
    uint64_t ptr;    /* linear route: the device buffer */
    void *upload_event;
    void *release_event;
    uint64_t last_use;     /* LRU tick */
    uint64_t release_tick; /* when the release event was recorded */
    uint64_t ticket;       /* upload ticket (ordinal of the load) */
    uint64_t issue_ns;     /* when the loader started issuing (copy busy time; busy_mu) */
    size_t issue_unit;     /* the unit of that upload, and its bytes (for the trace) */
    uint64_t issue_bytes;
    int load_rc;
    ddo__errbuf load_err;
    struct ddo_session *owner;
} ddo__slot;

typedef struct ddo__unit_rt {
    size_t slot;           /* slot holding the unit (DDO__NONE: none) */
    bool leased;           /* between acquire and release */
    bool resident;         /* the whole unit is resident: no slot */
    bool has_va;           /* VMM: range(s) reserved */
    uint64_t va;           /* VMM: the unit's own virtual range (slot_bytes); unused per weight */
    uint64_t weight_bytes; /* vmm_runtime: its weights' handles (each rounded to the granularity) */
    const char *name;
} ddo__unit_rt;

typedef struct ddo__job {
    size_t slot;
    size_t unit;
    uint64_t ticket;
    void *wait_release; /* a release event to wait for before overwriting, or NULL */
    size_t prev_mapped; /* VMM: the range to unmap first (DDO__NONE: none) */
    bool prefetch;      /* queued by prefetch (vmm_runtime: may not displace a prefetched unit) */
    /* results, applied under mu by the loader */
    size_t mapped_after;
    bool unsafe_after;
} ddo__job;

/* Settings a session takes from the configuration. */
typedef struct ddo__session_settings {
    size_t workers;
    ddo__read_engine engine;
    bool allow_register_fallback;
    bool pressure_reclaim; /* vmm_execution_backing_reclaim on vmm_fast_runtime */
} ddo__session_settings;

struct ddo_session {
    const ddo_plan *plan;
    const ddo_checkpoint *ck;
    ddo_device *dev;
    ddo__errbuf err;
    ddo__session_settings set;
    ddo_session_options opts;
    const char *route;
    bool vmm;
    /* vmm_runtime: every streamed tensor has its own granularity-aligned range
     * (w_va, w_size reserved bytes) and, while its unit is mapped, its own
     * physical handle w_handle of w_map bytes mapped at offset 0 (cuMemMap takes
     * no other offset). Indexed by checkpoint tensor. Unbound handles wait in the
     * pool for a weight of the same size; every handle alive, mapped or pooled,
     * is in the device weights account (the mapped budget). Under mu. */
    bool per_weight;
    uint64_t *w_va, *w_size, *w_map, *w_handle;
    uint64_t *pool_handle, *pool_size;
    size_t pool_count, pool_cap;
    uint64_t gran;
    ddo_plan_budgets b;

    size_t unit_count;
    ddo__unit_rt *units;
    size_t slot_count;
    ddo__slot *slots;
    uint64_t slot_bytes;

    uint64_t arena; /* resident arena (0: none) */
    bool arena_unsafe;
    size_t *resident; /* resident tensors */
    size_t resident_count;

    ddo__account acc_device, acc_retained, acc_registered, acc_staging;
    bool accounts_ready;
    ddo__metrics_acc metrics;
    bool metrics_ready;

    ddo__source *source;
    /* The staging ring (use_staging) or the bounce buffer; either may be NULL
     * after ddo_session_trim_host_cache and is re-created on the next upload. */
    bool use_staging;
    ddo__staging *staging;
    void *bounce;
    void *copy_stream;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool sync_ready;
    pthread_t loader;
    bool loader_started;
    bool quit;
    bool loader_busy;
    ddo__job *jobs; /* ring of slot_count jobs */
    size_t job_head, job_count;

    uint64_t tick, next_ticket;
    size_t unsafe_count;
    uint64_t retired_total;    /* upload tickets known complete (reap) */
    uint64_t retired_reported; /* ... of which collect_completed reported */
    bool unloaded;

    /* execution order: declared, learned (first pass) or plan order */
    size_t *order;
    size_t order_count;
    bool order_known;
    bool order_declared;
    size_t *order_pos; /* unit -> position in order, DDO__NONE if absent */
    size_t *learn;
    size_t learn_count;
    bool *learn_seen;

    pthread_mutex_t busy_mu; /* copy-engine busy time, updated from the device's thread */
    uint64_t busy_last_done;

    /* 1 for the host's handle + 1 per live DLPack view (session_views.c): the last one gone
     * destroys the session, so a view never outlives the memory it shows. */
    atomic_size_t refs;
    int view_device_id; /* the DLPack device_id of views (-1: not known yet) */
};

/* ---- session_slots.c ---- */
int ddo__session_loader_start(ddo_session *s);
void ddo__session_loader_stop(ddo_session *s);
/* Waits (host thread) until the job queue is empty and the loader idle. */
void ddo__session_wait_idle(ddo_session *s);
/* Creates / releases one slot's backing (takes / gives the device account). */
int ddo__session_slot_back(ddo_session *s, ddo__slot *slot, bool allow_pressure);
int ddo__session_slot_unback(ddo_session *s, ddo__slot *slot);
/* vmm_runtime: releases every pooled handle (mu held or loader idle); *bytes released.
 * A handle whose release fails is dropped and its bytes stay accounted. First error. */
int ddo__session_pool_release(ddo_session *s, uint64_t *bytes);
/* Uploads every resident tensor into the arena (synchronously). */
int ddo__session_upload_residents(ddo_session *s);
/* Queries events: finished uploads become READY, completed releases READY.
 * Returns the number of upload tickets retired. Called with mu held. */
size_t ddo__session_reap(ddo_session *s);

/* Frees everything now (ddo_session_destroy once no view holds the session). */
void ddo__session_destroy_now(ddo_session *s);

/* ---- tests ---- */
/* Account usage: [0] device weights, [1] retained, [2] registered, [3] staging. */
void ddo__session_accounts(ddo_session *s, uint64_t used[4]);
/* Releases everything safe to release (as destroy does) and returns the bytes
 * still accounted afterwards (only unsafe slots' bytes). The session can only
 * be destroyed afterwards. */
uint64_t ddo__session_release_all(ddo_session *s);
/* The state of the slot holding unit (-1 when none), and the slot index. */
int ddo__session_unit_state(ddo_session *s, size_t unit, size_t *slot);
int ddo__session_slot_state(ddo_session *s, size_t slot, size_t *unit, bool *backed, bool *unsafe,
                            bool *prefetched);

/* Calls the session's trace hook (ddo_session_options.trace), if any. */
void ddo__session_trace(const struct ddo_session *s, const char *kind, size_t unit,
                        uint64_t begin_ns, uint64_t end_ns, uint64_t bytes);

#endif /* DDO_SESSION_H */
