/*
 * session_transport.h - how a tensor's bytes get from where they are to device memory: the
 * one table of transports (session_upload.c) and what a transport may use. Each row names
 * the bytes counter it feeds and its upload function; the staged ones share one loop over
 * pinned windows and differ in how they fill a window. A new transport (a compressed one
 * decoded on the device, say) is one file with its upload function and one row in the table,
 * plus its case where ddo__transport_for chooses. The plain rows, the loops and the windows
 * are session_transport.c's, below the coded rows (session_codec.c) that stage through them;
 * the table is above both. Internal; never installed.
 *
 * Every upload issues its copies on the session's copy stream and returns without waiting
 * for them; the loader records the upload event after the unit's last tensor.
 */
#ifndef DDO_SESSION_TRANSPORT_H
#define DDO_SESSION_TRANSPORT_H

#include "session/session.h"

typedef enum ddo__transport_id {
    DDO__TRANSPORT_REGISTERED, /* the copy engine reads retained (or a caller's) registered
                                  memory directly */
    DDO__TRANSPORT_PAGEABLE,   /* retained pageable bytes: memcpy into a window, then copy */
    DDO__TRANSPORT_FILE,       /* re-read from the file into a window (identity-checked) */
    DDO__TRANSPORT_CHECKPOINT, /* ddo_checkpoint_read into a window (resident tensors) */
    DDO__TRANSPORT_RESIDENT_REGISTERED, /* a resident host tensor the copy engine reads
                                           directly (registered in place) */
    DDO__TRANSPORT_CODED,      /* coded retained bytes: uploaded into the decode area and decoded
                                  into place on the device (session_codec.c) */
    DDO__TRANSPORT_CODED_FILE, /* a file tensor's coded stream read from its sidecar into a
                                  window, then uploaded into the decode area and decoded */
    DDO__TRANSPORT_STORE,      /* donor mode: device->device copies from the store device
                                  (session_store.c) */
    DDO__TRANSPORT_COUNT
} ddo__transport_id;

/* One upload: nbytes of tensor to device address dst; host: where the bytes lie in host
 * memory (NULL for the file and checkpoint transports). */
typedef struct ddo__upload {
    size_t tensor;
    uint64_t dst;
    uint64_t nbytes;
    const unsigned char *host;
} ddo__upload;

/* A pinned window the copy engine reads: a staging ring window or the bounce buffer. */
typedef struct ddo__window {
    void *p;
    size_t cap;
    size_t index;
    bool ring; /* a staging ring window (else the bounce buffer) */
} ddo__window;

typedef struct ddo__transport ddo__transport;
struct ddo__transport {
    const char *name;
    ddo__metric_id metric; /* the bytes it moves (copy_bytes counts them too) */
    /* Issues the copies of up on the copy stream; eb receives the detail. */
    int (*upload)(ddo_session *s, const ddo__transport *t, const ddo__upload *up, ddo__errbuf *eb);
    /* Staged transports (upload = ddo__transport_staged): the largest piece a window of cap
     * bytes takes (NULL: cap), and filling the window w with len bytes at pos; *data is where
     * the copy engine reads them (within w). */
    size_t (*piece)(size_t cap);
    int (*fill)(ddo_session *s, const ddo__upload *up, uint64_t pos, size_t len,
                const ddo__window *w, const void **data, ddo__errbuf *eb);
};

/* The store transport's upload (session_store.c): up's bytes from its unit's buffer on the
 * store device. */
int ddo__transport_store(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                         ddo__errbuf *eb);

/* The plain rows (session_transport.c): the coded rows fall back to the file's. */
extern const ddo__transport ddo__transport_registered;
extern const ddo__transport ddo__transport_pageable;
extern const ddo__transport ddo__transport_file;
extern const ddo__transport ddo__transport_checkpoint;
extern const ddo__transport ddo__transport_resident_registered;

/* The table's row of id (session_upload.c). */
const ddo__transport *ddo__transport_get(ddo__transport_id id);
/* The transport of a streamed tensor: the store in donor mode, else registered, pageable (both
 * retained) or the file; *host receives where its retained bytes lie (NULL: not retained). */
ddo__transport_id ddo__transport_for(const ddo_session *s, size_t tensor,
                                     const unsigned char **host);

/* The upload loops the rows share: direct (pieces the copy engine reads where they lie,
 * never across a registration segment) and staged (through windows filled by t->fill). */
int ddo__transport_direct(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                          ddo__errbuf *eb);
int ddo__transport_staged(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                          ddo__errbuf *eb);

/* A window to fill (re-creating a trimmed staging ring), and handing it back after the copy
 * that reads it was queued on the copy stream. */
int ddo__window_get(ddo_session *s, ddo__window *w, ddo__errbuf *eb);
int ddo__window_put(ddo_session *s, ddo__window *w, ddo__errbuf *eb);

#endif /* DDO_SESSION_TRANSPORT_H */
