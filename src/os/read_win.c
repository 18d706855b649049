/*
 * read_win.c - the read engines on Windows. The "ring" is overlapped ReadFile: each queued
 * request gets its own OVERLAPPED and event, is issued at the next submit, and completes on
 * its own; several are in flight on one handle (read-only handles are opened with
 * FILE_FLAG_OVERLAPPED, file_win.c). Direct reads go through handles opened with
 * FILE_FLAG_NO_BUFFERING (sector-aligned offsets, lengths and buffers: the callers already
 * align to DDO__OS_DIRECT_ALIGN). Windows 11's IoRing is not used: Wine cannot run it, so
 * nothing here could test it.
 */
#if defined(_WIN32)
#    include "os/read.h"
#    include "os/win.h"

#    include <errno.h>
#    include <stdlib.h>
#    include <string.h>

#    define RING_MAX 64

typedef struct ring_req {
    OVERLAPPED ov;
    HANDLE file;
    void *dst;
    DWORD len;
    uint64_t tag;
    int state; /* 0 free, 1 queued, 2 in flight, 3 done */
    int res;
} ring_req;

struct ddo__os_ring {
    unsigned n;
    ring_req req[RING_MAX];
};

bool ddo__os_ring_available(void)
{
    return true;
}

int ddo__os_ring_create(unsigned entries, ddo__os_ring **out)
{
    if (entries == 0 || entries > RING_MAX)
        entries = RING_MAX;
    ddo__os_ring *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return ENOMEM;
    r->n = entries;
    for (unsigned i = 0; i < entries; i++) {
        r->req[i].ov.hEvent = CreateEventW(NULL, TRUE, FALSE, NULL);
        if (r->req[i].ov.hEvent == NULL) {
            r->n = i;
            ddo__os_ring_destroy(r);
            return ENOMEM;
        }
    }
    *out = r;
    return 0;
}

void ddo__os_ring_destroy(ddo__os_ring *r)
{
    if (r == NULL)
        return;
    for (unsigned i = 0; i < r->n; i++) {
        if (r->req[i].state == 2) { /* never leave a read writing into freed memory */
            DWORD got;
            CancelIoEx(r->req[i].file, &r->req[i].ov);
            GetOverlappedResult(r->req[i].file, &r->req[i].ov, &got, TRUE);
        }
        CloseHandle(r->req[i].ov.hEvent);
    }
    free(r);
}

bool ddo__os_ring_queue_read(ddo__os_ring *r, int fd, void *dst, uint64_t len, uint64_t off,
                             uint64_t tag)
{
    for (unsigned i = 0; i < r->n; i++) {
        ring_req *q = &r->req[i];
        if (q->state != 0)
            continue;
        HANDLE ev = q->ov.hEvent;
        memset(&q->ov, 0, sizeof(q->ov));
        q->ov.hEvent = ev;
        q->ov.Offset = (DWORD)off;
        q->ov.OffsetHigh = (DWORD)(off >> 32);
        q->file = ddo__win_handle(fd);
        q->dst = dst;
        q->len = (DWORD)len;
        q->tag = tag;
        q->state = 1;
        return true;
    }
    return false;
}

/* Whether request q has completed; records its result. */
static bool poll_req(ring_req *q, bool wait)
{
    DWORD got = 0;
    if (GetOverlappedResult(q->file, &q->ov, &got, wait)) {
        q->res = (int)got;
    } else {
        DWORD err = GetLastError();
        if (err == ERROR_IO_INCOMPLETE)
            return false;
        q->res = err == ERROR_HANDLE_EOF ? 0 : -ddo__win_errno(err);
    }
    q->state = 3;
    return true;
}

int ddo__os_ring_submit_wait(ddo__os_ring *r)
{
    int submitted = 0;
    for (unsigned i = 0; i < r->n; i++) {
        ring_req *q = &r->req[i];
        if (q->state != 1)
            continue;
        ResetEvent(q->ov.hEvent);
        if (ReadFile(q->file, q->dst, q->len, NULL, &q->ov) || GetLastError() == ERROR_IO_PENDING) {
            q->state = 2;
        } else {
            DWORD err = GetLastError();
            q->res = err == ERROR_HANDLE_EOF ? 0 : -ddo__win_errno(err);
            q->state = 3;
        }
        submitted++;
    }
    HANDLE evs[RING_MAX];
    DWORD k = 0;
    for (unsigned i = 0; i < r->n; i++) {
        if (r->req[i].state == 3)
            return submitted; /* one is complete already */
        if (r->req[i].state == 2)
            evs[k++] = r->req[i].ov.hEvent;
    }
    if (k > 0 && WaitForMultipleObjects(k, evs, FALSE, INFINITE) == WAIT_FAILED)
        return -ddo__win_errno(GetLastError());
    return submitted;
}

bool ddo__os_ring_take(ddo__os_ring *r, uint64_t *tag, int *res)
{
    for (unsigned i = 0; i < r->n; i++) {
        ring_req *q = &r->req[i];
        if (q->state == 2)
            (void)poll_req(q, false);
        if (q->state == 3) {
            *tag = q->tag;
            *res = q->res;
            q->state = 0;
            return true;
        }
    }
    return false;
}

void ddo__os_ring_drain(ddo__os_ring *r, size_t *busy)
{
    for (unsigned i = 0; i < r->n; i++) {
        ring_req *q = &r->req[i];
        if (q->state == 2)
            (void)poll_req(q, true);
        if (q->state == 3 && *busy > 0)
            (*busy)--;
        q->state = 0;
    }
}

int64_t ddo__os_read_direct(int fd, uint64_t off, uint64_t len, void *dst, bool use_ring)
{
    (void)use_ring; /* each read below is overlapped already; one in flight is enough here */
    unsigned char *d = dst;
    uint64_t done = 0;
    while (done < len) {
        uint64_t n = len - done < DDO__OS_READ_CHUNK ? len - done : DDO__OS_READ_CHUNK;
        int64_t r = ddo__win_pread(fd, d + done, (size_t)n, off + done);
        if (r < 0)
            return r;
        if (r == 0)
            break; /* end of file: the caller checks it got enough */
        done += (uint64_t)r;
        if ((uint64_t)r % DDO__OS_DIRECT_ALIGN != 0)
            break; /* a short read ends the file */
    }
    return (int64_t)done;
}

#endif /* _WIN32 */
