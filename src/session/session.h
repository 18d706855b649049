/*
 * session.h - the session runtime's internal state, shared by the files of the
 * session. Internal; never installed.
 *
 *   session.c           setup, teardown, unload/reload, the error boundary, metrics
 *   session_slot_state.c the slot state machine (one transition function)
 *   session_slots.c     slot backing and reclaim, the choice of a slot for a load
 *   session_lease.c     acquire and release
 *   session_prefetch.c  execution order (declared or learned) and prefetch
 *   session_loader.c    the loader thread: one job per load, in ticket order
 *   session_upload.c    the uploads of a unit and of the residents: the one table of
 *                       transports (session_transport.h) and a tensor's row in it
 *   session_transport.c how a tensor's bytes reach device memory: the plain transports,
 *                       the upload loops, the staging windows
 *   session_codec.c     the coded transport (weight_codec) and its decode area
 *   session_store.c     donor mode: the store device
 *   session_split.c     split mode: the other devices of the set, the split upload
 *   session_vmm.c       VMM ranges and mappings, the vmm_runtime layout it executes
 *   session_pool.c      vmm_runtime's per-weight handles: the pool, bind, evict (it unmaps
 *                       through session_vmm.c)
 *   session_views.c     addresses and DLPack views
 *   session_base.c      what they all use: failures with context, tensor names
 *
 * Threads: the host thread (one at a time per session) calls the public
 * functions; one loader thread issues the uploads. Both share the slot table
 * and the job queue under `mu`; `cv` signals job issue and loader idleness.
 * The loader performs device calls without holding `mu`, and no thread
 * blocks on the device (event/stream synchronize) while holding `mu`.
 */
#ifndef DDO_SESSION_H
#define DDO_SESSION_H

#include "base/budget.h"
#include "base/common.h"
#include "config/route.h"
#include "metrics/metrics.h"
#include "plan/plan.h"
#include "store/source.h"
#include "store/staging.h"

#include "os/thread.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDO__NONE SIZE_MAX
/* The reclaim margin: free device memory below request + 256 MiB is pressure. */
#define DDO__RECLAIM_MARGIN_BYTES (256 * DDO_MIB)
/* Copies from registered memory are issued in pieces of this size (>= 8 MiB). */
#define DDO__COPY_PIECE_BYTES (64 * DDO_MIB)
/* The bounce buffer used for staged bytes when the plan has no staging ring. */
#define DDO__BOUNCE_BYTES (8 * DDO_MIB)
/* Split mode: the most devices in a set (the communicator's limit). */
#define DDO__SPLIT_MAX 16

typedef enum ddo__slot_state {
    DDO__SLOT_FREE,
    DDO__SLOT_LOADING,
    DDO__SLOT_READY,
    DDO__SLOT_LEASED,
    DDO__SLOT_RETIRING
} ddo__slot_state;

/* A slot's state and unit change only through the transition functions of
 * session_slot_state.c (ddo__slot_enter, ddo__slot_load, ddo__slot_forget). */
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
    int load_rc;
    bool load_file; /* its last load read the file (or a sidecar) */
    ddo__errbuf load_err;
    struct ddo_session *owner;
} ddo__slot;

/* One upload as its completion callback sees it (copy busy time and the trace): notes are
 * taken in issue order from a ring (session_loader.c). */
typedef struct ddo__upload_note {
    struct ddo_session *owner;
    uint64_t issue_ns; /* when the loader started issuing */
    size_t unit;
    uint64_t bytes;
} ddo__upload_note;
#define DDO__UPLOAD_NOTES 64

typedef struct ddo__unit_rt {
    size_t slot;    /* slot holding the unit (DDO__NONE: none) */
    bool leased;    /* between acquire and release */
    bool resident;  /* the whole unit is resident: no slot */
    uint64_t bytes; /* its streamed bytes (the plan's) */
    bool has_va;    /* VMM: range(s) reserved */
    uint64_t va;    /* VMM: the unit's own virtual range (slot_bytes); unused per weight */
    /* vmm_fast_runtime: a slot whose handle this range still maps although the slot has moved
     * on to another unit (DDO__NONE: none). A mapping kept as a cache, never a sign that the
     * slot holds this unit's bytes: loading the unit into that slot again needs no remap.
     * Written under mu. */
    size_t alias_slot;
    uint64_t alias_epoch; /* the order's epoch when the alias was made */
    uint64_t loads;       /* loads started into a slot (ddo_session_tensor_loads); under mu */
    uint64_t pass;        /* order.pass at its last acquire (under mu) */
    const char *name;
    ddo_unit_waits waits; /* what its acquires waited for (written under mu) */
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
    bool read_file;   /* the upload read the file (or a sidecar) */
    uint64_t load_ns; /* the upload's issuing time */
} ddo__job;

/* Settings a session takes from the configuration. */
typedef struct ddo__session_settings {
    size_t workers;
    ddo__read_engine engine;
    bool allow_register_fallback;
    bool pressure_reclaim; /* vmm_execution_backing_reclaim on vmm_fast_runtime */
    /* Windows: the pressure policy also keeps these bytes of the DXGI local and shared budgets
     * free (vmm_dxgi_local_headroom_gb, vmm_dxgi_shared_headroom_gb). */
    uint64_t dxgi_local_headroom, dxgi_shared_headroom;
    const char *codec_cache_dir; /* weight_codec_cache_dir: the config's, borrowed during create */
} ddo__session_settings;

/* vmm_runtime's unbound handles, waiting for a weight of the same size (session_pool.c). */
typedef struct ddo__handle_pool {
    uint64_t *handle, *size;
    size_t count, cap; /* cap: the layout's handle_count, every handle that can be alive */
} ddo__handle_pool;

/* Execution order: declared, learned (first pass) or plan order (session_prefetch.c). */
typedef struct ddo__order {
    size_t *units;
    size_t count;
    bool known;
    bool declared;
    uint64_t epoch; /* counts the orders set: aliases made under an older one do not bind */
    size_t *pos;    /* unit -> position in units, DDO__NONE if absent */
    /* vmm_fast_runtime: unit -> the slot it loads into under this order (DDO__NONE: any).
     * Streamed units take slots round the ring so that a unit's range keeps mapping one
     * slot's handle; where their count is no multiple of the slots, the seam of the round
     * sits mid-order, away from the pass boundary (session_prefetch.c). */
    size_t *home;
    size_t *learn;
    size_t learn_count;
    bool *learn_seen;
    /* The host's passes (ddo_session_begin_pass), 0 while it marks none: a unit acquired again
     * in the pass of its last acquire moves no prefetch window. */
    uint64_t pass;
} ddo__order;

/* Each group names the file that writes it; every other file only reads it. */
struct ddo_session {
    /* What the session executes: written by setup (session.c, session_vmm.c), read-only
     * afterwards. The route, the slots' geometry and the vmm_runtime layout are the plan's. */
    const ddo_plan *plan;
    const ddo_checkpoint *ck;
    ddo_device *dev;
    ddo__session_settings set;
    ddo_session_options opts;
    ddo__route route;
    const char *route_name; /* the plan's label, for messages */
    ddo_plan_budgets b;
    size_t unit_count;
    size_t slot_count;
    uint64_t slot_bytes;
    uint64_t gran;                /* VMM: the device's mapping granularity */
    const ddo__weight_layout *wl; /* vmm_runtime: the plan's layout, or own_wl */
    ddo__weight_layout own_wl;    /* ... the plan's at the device's granularity, if it differs */
    size_t *resident;             /* resident tensors */
    size_t resident_count;
    ddo__errbuf err; /* the detail of the host's last failed call */
    /* Resident uploads done (ddo_session_tensor_loads); under mu. */
    uint64_t resident_loads;

    /* Units and slots: the state machine and leases (session_slots.c, session_lease.c) under
     * mu; mapped_unit/backed by the loader and session_vmm.c/session_pool.c under mu. */
    ddo__unit_rt *units;
    ddo__slot *slots;
    uint64_t tick, next_ticket;
    size_t unsafe_count;
    uint64_t retired_total;    /* upload tickets known complete (reap) */
    uint64_t retired_reported; /* ... of which collect_completed reported */
    bool unloaded;             /* session.c */

    /* Device memory and accounts (session.c; the device account also by session_slots.c and
     * session_pool.c). */
    uint64_t arena; /* resident arena (0: none) */
    bool arena_unsafe;
    ddo__account acc_device, acc_retained, acc_registered, acc_staging;
    bool accounts_ready;
    ddo__metrics_acc metrics; /* thread-safe accumulator, every file adds */
    bool metrics_ready;

    /* vmm_runtime: every streamed tensor has its own granularity-aligned range
     * (w_va, wl->range_bytes reserved bytes; session_vmm.c) and, while its unit is mapped,
     * its own physical handle w_handle of wl->handle_bytes mapped at offset 0 (cuMemMap takes
     * no other offset). Indexed by checkpoint tensor. Unbound handles wait in the pool for a
     * weight of the same size; every handle alive, mapped or pooled, is in the device weights
     * account (the mapped budget). Under mu (session_pool.c). */
    uint64_t *w_va, *w_handle;
    ddo__handle_pool pool;

    /* Where bytes come from and how they travel (session_transport.c; created by session.c).
     * The staging ring (use_staging) or the bounce buffer; either may be NULL after
     * ddo_session_trim_host_cache and is re-created on the next upload. */
    ddo__source *source;
    bool use_staging;
    ddo__staging *staging;
    void *bounce;
    void *copy_stream;
    struct ddo__session_codec *codec; /* weight_codec: the decode area (session_codec.c) */
    /* Donor mode (session_store.c): the store device (NULL: none) and each unit's buffer on
     * it (store_ptr[u], 0: none; store_span[u] bytes), through the store account. */
    ddo_device *store_dev;
    uint64_t *store_ptr, *store_span;
    ddo__account acc_store;
    /* Split mode (session_split.c): split_n devices in all (0: none); split_dev[0] and
     * split_stream[0] are the session's device and copy stream; every other device k holds
     * split_base[k] (the arena, then every slot) through split_acc[k], written on
     * split_stream[k]; split_comm spans them all. Written at create, back/unback (loader idle)
     * and destroy. */
    size_t split_n;
    ddo_device *split_dev[DDO__SPLIT_MAX];
    void *split_stream[DDO__SPLIT_MAX];
    uint64_t split_base[DDO__SPLIT_MAX];
    ddo__account split_acc[DDO__SPLIT_MAX];
    struct ddo__comm *split_comm;

    /* The loader thread and its job ring (session_loader.c; jobs queued by session_slots.c). */
    ddo__mutex mu;
    ddo__cond cv;
    bool sync_ready;
    ddo__thread loader;
    bool loader_started;
    bool quit;
    bool loader_busy;
    ddo__job *jobs; /* ring of slot_count jobs */
    size_t job_head, job_count;
    ddo__mutex busy_mu; /* copy-engine busy time, updated from the device's thread */
    uint64_t busy_last_done;
    /* Upload completions are noted by host functions on this stream, each after its upload's
     * event, never on the copy stream: a host function there would hold the next copies until
     * the driver's callback thread ran it. */
    void *notify_stream;
    ddo__upload_note notes[DDO__UPLOAD_NOTES]; /* busy_mu */
    uint64_t note_seq;

    ddo__order order; /* session_prefetch.c, under mu */

    /* 1 for the host's handle + 1 per live DLPack view (session_views.c): the last one gone
     * destroys the session, so a view never outlives the memory it shows. */
    atomic_size_t refs;
    atomic_size_t *tensor_views; /* live views per checkpoint tensor (made with the first) */
    atomic_size_t *unit_views;   /* live unit-wide views per unit (made with the first) */
    int view_device_id;          /* the DLPack device_id of views (-1: not known yet) */
};

/* True when v is one of the n entries of list. */
static inline bool ddo__session_in_list(const size_t *list, size_t n, size_t v)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] == v)
            return true;
    return false;
}

/* ---- session_base.c ---- */

/* Records "<context>: <the thread's last detail>" with code rc; returns rc. */
int DDO_PRINTF(3, 4) ddo__session_fail_ctx(ddo__errbuf *eb, int rc, const char *fmt, ...);
/* The checks a public call on one unit shares: a session and the call's other required
 * arguments (given; the message names them all as `required`, "session and ..."), then a unit
 * of the plan. 0, or DDO_E_INVALID_ARGUMENT recorded for fn. */
int ddo__session_check_unit(ddo_session *s, bool given, size_t unit, const char *fn,
                            const char *required);
/* The checkpoint's name of tensor ("?" when it has none). */
const char *ddo__session_tensor_name(const ddo_session *s, size_t tensor);
/* Calls the session's trace hook (ddo_session_options.trace), if any. */
void ddo__session_trace(const struct ddo_session *s, const char *kind, size_t unit,
                        uint64_t begin_ns, uint64_t end_ns, uint64_t bytes);

/* ---- session.c ---- */

/* Frees everything now (ddo_session_destroy once no view holds the session). */
void ddo__session_destroy_now(ddo_session *s);

/* ---- session_slot_state.c: the slot state machine ---- */

/*
 * The transitions (mu held, or the loader idle): every change of a slot's state
 * and of the unit it holds goes through these. FREE holds no unit; LOADING holds
 * the unit the loader fills (prefetch: queued ahead of its acquire); READY, LEASED
 * and RETIRING hold the unit loaded. Debug builds assert the transition is one of
 * the machine's and the slot's invariants afterwards.
 */
void ddo__slot_enter(ddo_session *s, ddo__slot *slot, ddo__slot_state to);
void ddo__slot_load(ddo_session *s, ddo__slot *slot, size_t unit, bool prefetch);
/* An unsafe slot lets its unit go and keeps its state (it is never reused). */
void ddo__slot_forget(ddo_session *s, ddo__slot *slot);
/* Marks slot unsafe (never reused, never freed again) and counts it. */
void ddo__slot_mark_unsafe(ddo_session *s, ddo__slot *slot);
/* Marks slot unsafe and frees it of its unit. */
void ddo__slot_set_unsafe(ddo_session *s, ddo__slot *slot);
/* Queries events: finished uploads become READY, completed releases READY.
 * Returns the number of upload tickets retired. Called with mu held. */
size_t ddo__session_reap(ddo_session *s);

/* ---- session_slots.c: the choice of a slot, backing and reclaim ---- */

/* DDO__PICK_SKIP: a prefetch of this unit should wait for its own slot (vmm_fast_runtime). */
enum ddo__pick { DDO__PICK_FOUND, DDO__PICK_WAIT, DDO__PICK_NONE, DDO__PICK_SKIP };
/* Chooses the slot for a new load of unit (mu held); see session_slots.c. */
enum ddo__pick ddo__session_pick_slot(ddo_session *s, size_t unit, bool prefetch,
                                      const size_t *keep, size_t keep_count, size_t *out);
/* Assigns slot i to unit and queues its upload (mu held). */
int ddo__session_start_load(ddo_session *s, size_t i, size_t unit, bool prefetch);
/* Creates / releases one slot's backing (takes / gives the device account). */
int ddo__session_slot_back(ddo_session *s, ddo__slot *slot, bool allow_pressure);
int ddo__session_slot_unback(ddo_session *s, ddo__slot *slot);

/* ---- session_prefetch.c ---- */

/* Learns the execution order from the first pass of acquires (mu held). */
void ddo__session_learn(ddo_session *s, size_t unit);
/* Keeps the units after unit loading in the other slots (mu held). */
void ddo__session_prefetch(ddo_session *s, size_t unit);
/* With the order known and nothing leased: the order's first streamed unit and the window
 * after it start loading (mu held; declare_order, reload). */
void ddo__session_prefetch_head(ddo_session *s);

/* ---- session_loader.c ---- */

int ddo__session_loader_start(ddo_session *s);
void ddo__session_loader_stop(ddo_session *s);
/* Waits (host thread) until the job queue is empty and the loader idle. */
void ddo__session_wait_idle(ddo_session *s);
/* Queues job for the loader (mu held); the ring has room for one job per slot. */
void ddo__session_queue_job(ddo_session *s, const ddo__job *job);

/* ---- session_upload.c ---- */

/* Issues the copies of every streamed tensor of job->unit to its place at dst (or its own
 * range, per weight); adds the bytes to *ubytes and sets *reread when one came from the
 * file. The loader, without mu. */
int ddo__session_upload_unit(ddo_session *s, const ddo__job *job, uint64_t dst, uint64_t *ubytes,
                             bool *reread, ddo__errbuf *eb);
/* The streamed tensors with bytes of unit in the plan's order: from *i (start at 0) the next
 * one's index and location, *i advanced past it; false after the last. */
bool ddo__session_unit_next(const ddo_session *s, size_t unit, size_t *i, size_t *tensor,
                            ddo_tensor_location *loc);
/* The end of unit's streamed bytes in its slot (the largest offset + nbytes of its streamed
 * tensors; 0: none) and, when first is not NULL and there is one, its first streamed tensor. */
uint64_t ddo__session_unit_end(const ddo_session *s, size_t unit, size_t *first);
/* Uploads every resident tensor into the arena (synchronously). */
int ddo__session_upload_residents(ddo_session *s);

/* ---- session_transport.c ---- */

/* The staging windows when the plan has them, else the bounce buffer. */
int ddo__session_create_buffers(ddo_session *s);

/* ---- session_store.c (donor mode) ---- */

/* Checks the store device against the plan and fills it (nothing without one). */
int ddo__session_store_create(ddo_session *s, ddo_device *store);
/* Frees the store (teardown, after the loader stopped). */
void ddo__session_store_destroy(ddo_session *s);
/* True in donor mode once the store exists: uploads take the store transport. */
bool ddo__session_store_used(const ddo_session *s);
/* The store account's figures into a metrics snapshot. */
void ddo__session_store_metrics(ddo_session *s, ddo__metrics_acc *m);

/* ---- session_split.c (split mode) ---- */
/* Checks the split devices against the plan; their streams and communicator (none without). */
int ddo__session_split_create(ddo_session *s);
/* Frees everything of split mode (teardown, after the loader stopped). */
void ddo__session_split_destroy(ddo_session *s);
/* True once split mode drives more than one device. */
bool ddo__session_split_used(const ddo_session *s);
/* Every other device's buffer, with the arena copied from the session's device (make) / freed
 * (drop); the loader idle. */
int ddo__session_split_back(ddo_session *s);
int ddo__session_split_unback(ddo_session *s);
/* Makes the session's device current again on the calling thread after calls on the others. */
void ddo__session_split_rebind(ddo_session *s);
/* The address on device (1..split_n) of a tensor at loc in slot (resident: the arena's copy). */
int ddo__session_split_address(const ddo_session *s, size_t device, size_t slot,
                               const ddo_tensor_location *loc, uint64_t *addr);
/* The loader, in split mode instead of ddo__session_upload_unit (same contract): every
 * streamed tensor of job->unit to dst on the session's device and to job->slot on every other
 * device; returns once the other devices' copies are done. */
int ddo__session_split_upload_unit(ddo_session *s, const ddo__job *job, uint64_t dst,
                                   uint64_t *ubytes, bool *reread, ddo__errbuf *eb);
/* Share mode (ddo_session_options.share_count > 1): the options against the plan and route. */
int ddo__session_share_create(ddo_session *s);
bool ddo__session_share_used(const ddo_session *s);
/* Each rank's share of unit (ddo_session_unit_share; 0: uploaded whole). */
uint64_t ddo__session_share_bytes(const ddo_session *s, size_t unit);
/* The loader, in share mode instead of ddo__session_upload_unit (same contract): this rank's
 * share of a unit with one, the whole unit otherwise. */
int ddo__session_share_upload_unit(ddo_session *s, const ddo__job *job, uint64_t dst,
                                   uint64_t *ubytes, bool *reread, ddo__errbuf *eb);
/* The split devices' figures into a metrics snapshot. */
void ddo__session_split_metrics(ddo_session *s, ddo__metrics_acc *m);
/* ---- session_vmm.c ---- */

/* Reads the device granularity; adopts the vmm_runtime layout (the caller then sizes the
 * handle pool, ddo__session_pool_init) or checks the slot size. */
int ddo__session_check_granularity(ddo_session *s);
/* Reserves one stable address range per streamed weight (vmm_runtime) or per streamed unit. */
int ddo__session_reserve_ranges(ddo_session *s);
/* Releases every reserved range no unsafe slot still maps (teardown). */
void ddo__session_release_ranges(ddo_session *s);
/* Maps a slot's handle (or, per weight, every weight's bound handle) into unit's range(s);
 * *unsafe when a failed map could not be undone. The error names unit, slot and tensor. */
int ddo__session_map_unit(ddo_session *s, uint64_t handle, size_t unit, size_t slot, bool *unsafe,
                          ddo__errbuf *eb);
/* Unmaps unit's range(s); the device's code at the first failure. */
int ddo__session_unmap_unit(ddo_session *s, size_t unit);
/* vmm_fast_runtime: unmaps unit's range from the slot it still maps as an alias (after that
 * slot's last upload and release passed); 0 when it maps none (mu held). */
int ddo__session_drop_alias(ddo_session *s, size_t unit, ddo__errbuf *eb);
/* Unmaps every alias of slot's handle (before the handle is released; mu held). */
int ddo__session_drop_aliases(ddo_session *s, size_t slot);

/* ---- session_pool.c (vmm_runtime) ---- */

/* Sizes the pool for every handle the layout can have alive (setup, after the layout is
 * adopted by ddo__session_check_granularity). */
int ddo__session_pool_init(ddo_session *s);
/* Releases every pooled handle (mu held or loader idle); *bytes released.
 * A handle whose release fails is dropped and its bytes stay accounted. First error. */
int ddo__session_pool_release(ddo_session *s, uint64_t *bytes);
/* Loader: binds a handle to every weight of the job's unit (takes mu). */
int ddo__session_bind_unit(ddo_session *s, const ddo__job *job, ddo__errbuf *eb);
/* Moves unit's bound handles into the pool: its ranges are unmapped (mu held). */
void ddo__session_unbind_unit(ddo_session *s, size_t unit);
/* Releases unit's bound handles: its ranges are unmapped (mu held). First error. */
int ddo__session_release_unit_handles(ddo_session *s, size_t unit);

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

#endif /* DDO_SESSION_H */
