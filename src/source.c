/*
 * source.c - the retained source store: reads retained tensors into host
 * segment memory with pin_cpu_workers threads (io_uring + O_DIRECT where the
 * file system allows it, pread otherwise: the engines of os/read.c, driven
 * from here), registers the planned share in whole 64 MiB segments, and
 * serves byte ranges (retained memory, or the file re-read and
 * identity-checked) to the session's uploader.
 *
 * Layout: one allocation of whole 64 MiB segments. The tensors to register
 * come first (request order), then the other retained tensors; the segments
 * covering the registered tensors are registered (pageable tensors sharing
 * the last of them are then registered too). The store takes exactly
 * round_up(retained bytes, 64 MiB) and round_up(registered bytes, 64 MiB),
 * the planner's figures. Within the slack that rounding leaves, each tensor
 * is placed at an offset congruent to its file offset modulo 4 KiB, so the
 * aligned middle of its O_DIRECT reads lands in place; the partial first and
 * last 4 KiB blocks (and any tensor that got no slack) go through pread.
 */
#define _POSIX_C_SOURCE 200809L
#include "source.h"

#include "host_pins.h"
#include "source_codec.h"

#include "checkpoint.h"
#include "device/device.h"
#include "os/file.h"
#include "os/read.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IO_ALIGN       DDO__OS_DIRECT_ALIGN
#define IO_CHUNK       DDO__OS_READ_CHUNK      /* one read request */
#define IO_QUEUE_DEPTH DDO__OS_READ_DEPTH      /* requests in flight per ring */
#define DIRECT_MIN     ((uint64_t)1 * DDO_MIB) /* smaller file reads use pread */
/* Allocation alignment of the runs: huge-page friendly, a multiple of IO_ALIGN. */
#define RUN_ALIGN ((size_t)2 * DDO_MIB)

enum { RUN_NONE, RUN_STORE, RUN_HOST };

typedef struct entry {
    uint8_t run;
    uint64_t pos; /* offset inside its run */
    const uint8_t *ptr;
} entry;

struct ddo__source {
    const ddo_checkpoint *ck;
    ddo_device *dev;
    ddo__account *retained;
    ddo__account *registered;
    uint64_t retained_taken;
    uint64_t registered_taken;
    uint8_t *base;           /* the store: whole segments */
    uint64_t bytes;          /* allocated */
    size_t seg_count;        /* segments to register (the first ones) */
    uint8_t *seg_registered; /* per segment to register: did it succeed */
    entry *entries;          /* per checkpoint tensor */
    size_t tensor_count;
    size_t file_count;
    int *direct_fd;             /* per file; -1 when direct I/O is unavailable */
    atomic_bool *direct_broken; /* a direct read failed with EINVAL: use pread from now on */
    ddo__read_engine engine;
    bool use_uring;
    ddo__host_pins *host_pins; /* host-memory tensors registered in place */
    ddo__source_codec *codec;  /* weight_codec: the coded tensors' plans (source_codec.c) */
};

/* ---- small helpers ---- */

/* Fault injection for reads (tests): see source.h. */
static atomic_uint_fast64_t fault_nth, fault_reads;
static atomic_bool fault_persistent;

void ddo__source_fault_nth(uint64_t nth, bool persistent)
{
    atomic_store(&fault_nth, 0);
    atomic_store(&fault_reads, 0);
    atomic_store(&fault_persistent, persistent);
    atomic_store(&fault_nth, nth);
}

uint64_t ddo__source_fault_reads(void)
{
    return atomic_load(&fault_reads);
}

int ddo__source_fault_hit(void)
{
    uint64_t n = atomic_fetch_add(&fault_reads, 1) + 1;
    uint64_t nth = atomic_load(&fault_nth);
    if (nth != 0 && (n == nth || (n > nth && atomic_load(&fault_persistent))))
        return DDO_E_IO;
    return 0;
}

static uint64_t align_down(uint64_t v, uint64_t a)
{
    return v - v % a;
}

/* Copies the calling thread's last detail (another module's message) into buf. */
static const char *last_detail(char *buf, size_t len)
{
    snprintf(buf, len, "%s", ddo_last_error());
    return buf;
}

static const char *file_name(const ddo__source *src, uint32_t file)
{
    const char *n = ddo__checkpoint_file_name(src->ck, file);
    return n ? n : "(file)";
}

/* ---- layout ---- */

typedef struct layout {
    uint64_t registered_end; /* the registered tensors end here */
    uint64_t end;
} layout;

static int validate_requests(const ddo_checkpoint *ck, const ddo__source_request *req, size_t count,
                             uint8_t *seen, ddo__errbuf *eb)
{
    size_t n = ddo_checkpoint_tensor_count(ck);
    for (size_t i = 0; i < count; i++) {
        if (req[i].tensor >= n)
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "retained store: request %zu: tensor index %zu out of range (%zu "
                             "tensors)",
                             i, req[i].tensor, n);
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, req[i].tensor);
        if (seen[req[i].tensor])
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "retained store: tensor \"%s\": requested twice", t->name);
        seen[req[i].tensor] = 1;
        if (req[i].register_ && !req[i].retain)
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "retained store: tensor \"%s\": register_ without retain", t->name);
        if (req[i].retain && t->file_index == UINT32_MAX && t->host_data == NULL && t->nbytes > 0)
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "retained store: tensor \"%s\": host-memory tensor without data",
                             t->name);
    }
    return 0;
}

/* Places every retained tensor (registered ones first); entries may be NULL (sizes only). */
static int place(const ddo_checkpoint *ck, const ddo__source_request *req, size_t count,
                 entry *entries, layout *out, ddo__errbuf *eb)
{
    /* Pass 1: tight sizes, and the slack that rounding to whole segments leaves. */
    uint64_t reg = 0, total = 0;
    for (size_t i = 0; i < count; i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, req[i].tensor);
        if (!req[i].retain || t->file_index == UINT32_MAX)
            continue;
        if (!ddo__add_u64(total, t->nbytes, &total) ||
            (req[i].register_ && !ddo__add_u64(reg, t->nbytes, &reg)) ||
            ddo__round_up(total, DDO_SEGMENT_BYTES) > (uint64_t)SIZE_MAX / 2)
            return ddo__fail(eb, DDO_E_OVERFLOW, "retained store: tensor \"%s\": size overflow",
                             t->name);
    }
    uint64_t reg_slack = ddo__round_up(reg, DDO_SEGMENT_BYTES) - reg;
    uint64_t total_slack = ddo__round_up(total, DDO_SEGMENT_BYTES) - total;
    /* Pass 2: positions; a pad for 4 KiB congruence only while the slack lasts, so the
     * rounded sizes stay those of the tight layout. */
    uint64_t pos = 0, pads = 0, reg_pads = 0, reg_end = 0;
    for (int pass = 0; pass < 2; pass++) {
        bool registered = pass == 0;
        for (size_t i = 0; i < count; i++) {
            if (!req[i].retain || req[i].register_ != registered)
                continue;
            const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, req[i].tensor);
            if (t->file_index == UINT32_MAX) {
                if (entries != NULL) {
                    entries[req[i].tensor].run = RUN_HOST;
                    entries[req[i].tensor].ptr = t->host_data;
                }
                continue;
            }
            uint64_t pad = (t->offset % IO_ALIGN + IO_ALIGN - pos % IO_ALIGN) % IO_ALIGN;
            if (pads + pad <= total_slack && (!registered || reg_pads + pad <= reg_slack)) {
                pos += pad;
                pads += pad;
                reg_pads += registered ? pad : 0;
            }
            if (entries != NULL) {
                entries[req[i].tensor].run = RUN_STORE;
                entries[req[i].tensor].pos = pos;
            }
            pos += t->nbytes;
            if (registered)
                reg_end = pos;
        }
    }
    out->registered_end = reg_end;
    out->end = pos;
    return 0;
}

static uint64_t store_bytes(const layout *l)
{
    return ddo__round_up(l->end, DDO_SEGMENT_BYTES);
}

static uint64_t registered_bytes(const layout *l)
{
    return ddo__round_up(l->registered_end, DDO_SEGMENT_BYTES);
}

int ddo__source_bytes(const ddo_checkpoint *ck, const ddo__source_request *req, size_t count,
                      uint64_t *retained, uint64_t *registered, ddo__errbuf *eb)
{
    if (ck == NULL || (req == NULL && count > 0) || retained == NULL || registered == NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "retained store: invalid argument");
    uint8_t *seen = ddo__calloc(ddo_checkpoint_tensor_count(ck), 1);
    if (seen == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    layout l;
    int rc = validate_requests(ck, req, count, seen, eb);
    if (rc == 0)
        rc = place(ck, req, count, NULL, &l, eb);
    free(seen);
    if (rc != 0)
        return rc;
    *registered = registered_bytes(&l);
    *retained = store_bytes(&l);
    return 0;
}

size_t ddo__source_window_need(size_t len)
{
    return len + 2 * (size_t)IO_ALIGN;
}

ddo__read_engine ddo__source_engine(const ddo__source *src)
{
    return src->engine;
}

/* ---- parallel jobs (reads, registration) ---- */

typedef struct job job;
typedef void (*job_worker)(job *j);

struct job {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t next;
    size_t count;
    uint64_t done;
    uint64_t total;
    size_t running;
    bool abort;
    int err;
    char msg[DDO_ERRBUF_BYTES];
    job_worker worker;
    ddo__source *src;
    void *arg;
};

/* Takes the next item; false when none is left or the job was aborted. */
static bool job_next(job *j, size_t *idx)
{
    pthread_mutex_lock(&j->lock);
    bool ok = !j->abort && j->next < j->count;
    if (ok)
        *idx = j->next++;
    pthread_mutex_unlock(&j->lock);
    return ok;
}

static void job_progress(job *j, uint64_t bytes)
{
    pthread_mutex_lock(&j->lock);
    j->done += bytes;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
}

/* Records the first failure; abort stops the other workers taking items. */
static void job_error(job *j, int code, bool abort, const char *fmt, ...) DDO_PRINTF(4, 5);
static void job_error(job *j, int code, bool abort, const char *fmt, ...)
{
    pthread_mutex_lock(&j->lock);
    if (j->err == 0) {
        j->err = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
        va_end(ap);
    }
    if (abort)
        j->abort = true;
    pthread_mutex_unlock(&j->lock);
}

static void *job_thread(void *arg)
{
    job *j = arg;
    j->worker(j);
    pthread_mutex_lock(&j->lock);
    j->running--;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

/*
 * Runs j->worker on `threads` threads (at least the calling thread's share
 * when no thread can be started) and reports progress from the calling thread
 * only, so a host's callback never runs on a worker.
 */
static void job_run(job *j, size_t threads, const char *phase, ddo_progress_fn progress, void *user)
{
    if (threads > j->count)
        threads = j->count;
    if (threads == 0)
        threads = 1;
    pthread_t *tids = ddo__calloc(threads, sizeof(*tids));
    size_t started = 0;
    pthread_mutex_lock(&j->lock);
    for (size_t i = 0; tids != NULL && i < threads; i++) {
        j->running++;
        if (pthread_create(&tids[i], NULL, job_thread, j) != 0) {
            j->running--;
            break;
        }
        started++;
    }
    pthread_mutex_unlock(&j->lock);
    if (started == 0) {
        j->worker(j); /* no thread could be started: do the work here */
    } else {
        uint64_t reported = UINT64_MAX;
        pthread_mutex_lock(&j->lock);
        for (;;) {
            if (progress != NULL && j->done != reported) {
                reported = j->done;
                uint64_t total = j->total;
                pthread_mutex_unlock(&j->lock);
                progress(user, phase, reported, total);
                pthread_mutex_lock(&j->lock);
                continue;
            }
            if (j->running == 0)
                break;
            pthread_cond_wait(&j->cond, &j->lock);
        }
        pthread_mutex_unlock(&j->lock);
        for (size_t i = 0; i < started; i++)
            pthread_join(tids[i], NULL);
    }
    if (progress != NULL && started == 0)
        progress(user, phase, j->done, j->total);
    free(tids);
}

static int job_init(job *j, ddo__source *src, job_worker worker, void *arg, size_t count,
                    uint64_t total)
{
    memset(j, 0, sizeof(*j));
    if (pthread_mutex_init(&j->lock, NULL) != 0)
        return DDO_E_NO_MEMORY;
    if (pthread_cond_init(&j->cond, NULL) != 0) {
        pthread_mutex_destroy(&j->lock);
        return DDO_E_NO_MEMORY;
    }
    j->src = src;
    j->worker = worker;
    j->arg = arg;
    j->count = count;
    j->total = total;
    return 0;
}

static void job_fini(job *j)
{
    pthread_cond_destroy(&j->cond);
    pthread_mutex_destroy(&j->lock);
}

/* ---- reading ---- */

/* One read request: part of one tensor, at most IO_CHUNK, split at file-aligned boundaries. */
typedef struct piece {
    uint32_t file;
    uint64_t off; /* absolute file offset */
    uint64_t len;
    uint8_t *dst;
} piece;

static void read_piece_pread(job *j, const piece *p)
{
    int rc = ddo__checkpoint_read_range(j->src->ck, p->file, p->off, p->dst, p->len);
    if (rc != 0) {
        char why[DDO_ERRBUF_BYTES];
        job_error(j, rc, true, "retained store: %s", last_detail(why, sizeof(why)));
        return;
    }
    job_progress(j, p->len);
}

/* An injected read fault (tests) for piece p: recorded on the job, true when it hit. */
static bool piece_fault(job *j, const piece *p)
{
    if (ddo__source_fault_hit() == 0)
        return false;
    job_error(j, DDO_E_IO, true, "retained store: %s: read of %llu bytes at %llu: injected fault",
              file_name(j->src, p->file), (unsigned long long)p->len, (unsigned long long)p->off);
    return true;
}

static void pread_worker(job *j)
{
    const piece *pieces = j->arg;
    size_t i;
    while (job_next(j, &i))
        if (!piece_fault(j, &pieces[i]))
            read_piece_pread(j, &pieces[i]);
}

typedef struct inflight {
    const piece *p;
    uint64_t off; /* the aligned middle still to read */
    uint64_t len;
    uint8_t *dst;
    bool used;
} inflight;

static bool queue_read(ddo__os_ring *ring, int fd, const inflight *f, size_t slot)
{
    return ddo__os_ring_queue_read(ring, fd, f->dst, f->len, f->off, slot);
}

/*
 * Starts piece p: the partial 4 KiB blocks at its ends are read with pread
 * through the page cache now; the aligned middle is queued on the ring.
 * Returns true when a request was queued into f.
 */
static bool start_piece(job *j, ddo__os_ring *ring, const piece *p, inflight *f, size_t slot)
{
    ddo__source *src = j->src;
    int fd = src->direct_fd[p->file];
    uint64_t s = p->off, e = p->off + p->len;
    uint64_t ms = ddo__round_up(s, IO_ALIGN), me = align_down(e, IO_ALIGN);
    uint8_t *mdst = p->dst + (ms - s);
    if (fd < 0 || atomic_load(&src->direct_broken[p->file]) || me <= ms ||
        (uintptr_t)mdst % IO_ALIGN != 0) {
        read_piece_pread(j, p);
        return false;
    }
    if (ms > s) {
        int rc = ddo__checkpoint_read_range(src->ck, p->file, s, p->dst, (size_t)(ms - s));
        if (rc != 0) {
            char why[DDO_ERRBUF_BYTES];
            job_error(j, rc, true, "retained store: %s", last_detail(why, sizeof(why)));
            return false;
        }
    }
    if (e > me) {
        int rc =
            ddo__checkpoint_read_range(src->ck, p->file, me, p->dst + (me - s), (size_t)(e - me));
        if (rc != 0) {
            char why[DDO_ERRBUF_BYTES];
            job_error(j, rc, true, "retained store: %s", last_detail(why, sizeof(why)));
            return false;
        }
    }
    *f = (inflight){ .p = p, .off = ms, .len = me - ms, .dst = mdst, .used = true };
    if (!queue_read(ring, fd, f, slot)) {
        f->used = false;
        read_piece_pread(j, p);
        return false;
    }
    return true;
}

/* Handles one completion; true when the slot is free again. */
static bool complete(job *j, ddo__os_ring *ring, inflight *f, size_t slot, int res)
{
    ddo__source *src = j->src;
    const piece *p = f->p;
    if (res == -EINTR || res == -EAGAIN) {
        if (queue_read(ring, src->direct_fd[p->file], f, slot))
            return false;
        res = -EINVAL; /* finish it with pread below */
    }
    if (res == -EINVAL || res == -EOPNOTSUPP) {
        /* The file system accepted O_DIRECT at open but refuses this read. */
        atomic_store(&src->direct_broken[p->file], true);
        int rc = ddo__checkpoint_read_range(src->ck, p->file, f->off, f->dst, (size_t)f->len);
        if (rc != 0) {
            char why[DDO_ERRBUF_BYTES];
            job_error(j, rc, true, "retained store: %s", last_detail(why, sizeof(why)));
        } else {
            job_progress(j, p->len);
        }
        f->used = false;
        return true;
    }
    if (res <= 0) {
        job_error(j, DDO_E_IO, true, "retained store: %s: io_uring read of %llu bytes at %llu: %s",
                  file_name(src, p->file), (unsigned long long)f->len, (unsigned long long)f->off,
                  res == 0 ? "unexpected end of file" : strerror(-res));
        f->used = false;
        return true;
    }
    uint64_t got = (uint64_t)res;
    if (got < f->len) {
        f->off += got;
        f->dst += got;
        f->len -= got;
        if (got % IO_ALIGN == 0 && queue_read(ring, src->direct_fd[p->file], f, slot))
            return false;
        /* an unaligned short read: finish through the page cache */
        int rc = ddo__checkpoint_read_range(src->ck, p->file, f->off, f->dst, (size_t)f->len);
        if (rc != 0) {
            char why[DDO_ERRBUF_BYTES];
            job_error(j, rc, true, "retained store: %s", last_detail(why, sizeof(why)));
            f->used = false;
            return true;
        }
    }
    job_progress(j, p->len);
    f->used = false;
    return true;
}

static void uring_worker(job *j)
{
    const piece *pieces = j->arg;
    ddo__os_ring *ring = NULL;
    if (ddo__os_ring_create(IO_QUEUE_DEPTH * 2, &ring) != 0) {
        pread_worker(j);
        return;
    }
    inflight slots[IO_QUEUE_DEPTH];
    memset(slots, 0, sizeof(slots));
    size_t busy = 0;
    bool more = true;
    for (;;) {
        while (more && busy < IO_QUEUE_DEPTH) {
            size_t i;
            if (!job_next(j, &i)) {
                more = false;
                break;
            }
            size_t slot = 0;
            while (slots[slot].used)
                slot++;
            if (piece_fault(j, &pieces[i]))
                continue;
            if (start_piece(j, ring, &pieces[i], &slots[slot], slot))
                busy++;
        }
        if (busy == 0)
            break;
        int rc = ddo__os_ring_submit_wait(ring);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            job_error(j, DDO_E_IO, true, "retained store: io_uring submit: %s", strerror(-rc));
            /* Requests already queued may still complete into memory we own; wait for them. */
        }
        uint64_t tag;
        int res;
        while (ddo__os_ring_take(ring, &tag, &res)) {
            size_t slot = (size_t)tag;
            if (tag < IO_QUEUE_DEPTH && slots[slot].used &&
                complete(j, ring, &slots[slot], slot, res))
                busy--;
        }
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            ddo__os_ring_drain(ring, &busy);
            break;
        }
    }
    ddo__os_ring_destroy(ring);
}

/* Splits every retained file tensor into pieces; *out NULL when there is nothing to read. */
static int make_pieces(ddo__source *src, const ddo__source_request *req, size_t count, piece **out,
                       size_t *n_out, uint64_t *bytes_out, ddo__errbuf *eb)
{
    size_t n = 0, cap = 0;
    piece *pieces = NULL;
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; i++) {
        const entry *en = &src->entries[req[i].tensor];
        if (en->run != RUN_STORE)
            continue;
        const ddo_tensor_info *t = ddo_checkpoint_tensor(src->ck, req[i].tensor);
        uint64_t s = t->offset, e = t->offset + t->nbytes;
        uint8_t *dst = src->base + en->pos;
        while (s < e) {
            uint64_t next = align_down(s, IO_ALIGN) + IO_CHUNK;
            uint64_t end = next < e ? next : e;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                piece *np = ddo__reallocarray(pieces, cap, sizeof(*np));
                if (np == NULL) {
                    free(pieces);
                    return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
                }
                pieces = np;
            }
            pieces[n++] = (piece){ .file = t->file_index, .off = s, .len = end - s, .dst = dst };
            dst += end - s;
            s = end;
        }
        bytes += t->nbytes;
    }
    *out = pieces;
    *n_out = n;
    *bytes_out = bytes;
    return 0;
}

static int read_all(ddo__source *src, const ddo__source_params *p, const ddo__source_request *req,
                    size_t count, ddo__errbuf *eb)
{
    piece *pieces = NULL;
    size_t n = 0;
    uint64_t bytes = 0;
    int rc = make_pieces(src, req, count, &pieces, &n, &bytes, eb);
    if (rc != 0 || n == 0)
        return rc;
    uint64_t t0 = ddo__now_ns();
    job j;
    job_worker worker = src->use_uring ? uring_worker : pread_worker;
    if (job_init(&j, src, worker, pieces, n, bytes) != 0) {
        free(pieces);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    }
    job_run(&j, p->workers, "read", p->progress, p->progress_user);
    rc = j.err;
    if (rc != 0)
        ddo__fail(eb, rc, "%s", j.msg);
    job_fini(&j);
    free(pieces);
    /* Direct reads bypass the per-read identity check: re-check every file once now. */
    for (uint32_t f = 0; rc == 0 && f < src->file_count; f++) {
        if (src->direct_fd[f] >= 0 && ddo__checkpoint_check_file(src->ck, f) != 0)
            rc = ddo__fail_from_last(eb, DDO_E_FILE_CHANGED);
    }
    if (rc == 0) {
        ddo__metrics_add(p->metrics, DDO_M_setup_read_ns, (double)(ddo__now_ns() - t0));
        ddo__metrics_add(p->metrics, DDO_M_setup_read_bytes, (double)bytes);
    }
    return rc;
}

/* ---- registration ---- */

static void register_worker(job *j)
{
    ddo__source *src = j->src;
    bool fallback = *(const bool *)j->arg;
    uint8_t *base = src->base;
    size_t i;
    while (job_next(j, &i)) {
        int rc = ddo__dev_host_register(src->dev, base + i * DDO_SEGMENT_BYTES,
                                        (size_t)DDO_SEGMENT_BYTES);
        if (rc == 0) {
            src->seg_registered[i] = 1;
        } else {
            char why[DDO_ERRBUF_BYTES];
            job_error(j, rc, !fallback,
                      "retained store: registering segment %zu of %zu (64.00 MiB): %s", i + 1,
                      src->seg_count, last_detail(why, sizeof(why)));
        }
        job_progress(j, DDO_SEGMENT_BYTES);
    }
}

static int register_all(ddo__source *src, const ddo__source_params *p, ddo__errbuf *eb)
{
    if (src->seg_count == 0)
        return 0;
    uint64_t t0 = ddo__now_ns();
    bool fallback = p->allow_register_fallback;
    job j;
    if (job_init(&j, src, register_worker, &fallback, src->seg_count,
                 (uint64_t)src->seg_count * DDO_SEGMENT_BYTES) != 0)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    job_run(&j, p->workers, "register", p->progress, p->progress_user);
    int rc = 0;
    if (j.err != 0 && !fallback) {
        rc =
            ddo__fail(eb, j.err, "%s (allow_pin_memory_fallback keeps such bytes pageable)", j.msg);
    } else if (j.err != 0) {
        size_t failed = 0;
        for (size_t i = 0; i < src->seg_count; i++)
            failed += src->seg_registered[i] ? 0 : 1;
        uint64_t bytes = (uint64_t)failed * DDO_SEGMENT_BYTES;
        ddo__account_give(src->registered, bytes);
        src->registered_taken -= bytes;
        ddo__metrics_add(p->metrics, DDO_M_registration_fallback_bytes, (double)bytes);
    }
    job_fini(&j);
    ddo__metrics_add(p->metrics, DDO_M_setup_register_ns, (double)(ddo__now_ns() - t0));
    return rc;
}

/* Registers in place the host-memory tensors the plan registers (no copy: the copy engine
 * reads the caller's pages). */
static int pin_host_tensors(ddo__source *src, const ddo__source_params *p,
                            const ddo__source_request *req, size_t count, ddo__errbuf *eb)
{
    ddo__host_range *ranges = ddo__calloc(count > 0 ? count : 1, sizeof(*ranges));
    if (ranges == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(src->ck, req[i].tensor);
        if (req[i].register_ && src->entries[req[i].tensor].run == RUN_HOST) {
            ranges[n] = (ddo__host_range){ t->host_data, t->nbytes, req[i].group, req[i].dst };
            n++;
        }
    }
    int rc = 0;
    if (n > 0)
        rc = ddo__host_pins_create(src->dev, ranges, n, src->registered, p->allow_register_fallback,
                                   p->metrics, &src->host_pins, eb);
    free(ranges);
    return rc;
}

/* ---- create / destroy ---- */

static void open_direct_fds(ddo__source *src)
{
    bool any = false;
    for (uint32_t f = 0; f < src->file_count; f++) {
        int fd = -1;
        if (src->engine != DDO__READ_ENGINE_PREAD &&
            ddo__checkpoint_open_direct(src->ck, f, &fd) != 0)
            fd = -1;
        src->direct_fd[f] = fd;
        any = any || fd >= 0;
    }
    if (!any)
        src->use_uring = false;
}

/* True when at least half of the checkpoint's file bytes are in the page cache. */
static bool mostly_cached(const ddo_checkpoint *ck)
{
    uint64_t total = 0, cached = 0;
    for (size_t f = 0; f < ddo_checkpoint_file_count(ck); f++) {
        const ddo_file_info *fi = ddo_checkpoint_file(ck, f);
        int64_t c = ddo__os_cached_bytes(fi->path, fi->size);
        if (c < 0)
            return false;
        total += fi->size;
        cached += (uint64_t)c;
    }
    return total > 0 && cached * 2 >= total;
}

/* Chooses the read engine (src->engine, src->use_uring) and opens the O_DIRECT descriptors. */
static void choose_engine(ddo__source *src, const ddo__source_params *p)
{
    /* Engine: io_uring needs liburing, a working ring, and a file that takes O_DIRECT. The
     * automatic choice also looks at the page cache: O_DIRECT bypasses it, so a checkpoint
     * that is mostly cached is read faster by buffered reads (measured on the H200 machine:
     * 8 GB/s from the cache against 1.2-2 GB/s from the disk). */
    src->engine =
        p->engine == DDO__READ_ENGINE_PREAD ? DDO__READ_ENGINE_PREAD : DDO__READ_ENGINE_IO_URING;
    if (p->engine == DDO__READ_ENGINE_AUTO && mostly_cached(p->ck))
        src->engine = DDO__READ_ENGINE_PREAD;
    if (src->engine == DDO__READ_ENGINE_IO_URING && ddo__os_ring_available())
        src->use_uring = true;
    if (!src->use_uring)
        src->engine = DDO__READ_ENGINE_PREAD;
    open_direct_fds(src);
    if (!src->use_uring)
        src->engine = DDO__READ_ENGINE_PREAD;
}

/*
 * Takes the retained and registered bytes of layout l from their accounts, allocates the
 * store and points every stored entry at its place in it.
 */
static int take_store(ddo__source *src, const layout *l, ddo__errbuf *eb)
{
    int rc;
    /* Accounts refuse before any byte is allocated. */
    uint64_t reg_bytes = registered_bytes(l);
    uint64_t all_bytes = store_bytes(l);
    rc = ddo__account_take(src->retained, all_bytes, eb);
    if (rc != 0)
        return rc;
    src->retained_taken = all_bytes;
    rc = ddo__account_take(src->registered, reg_bytes, eb);
    if (rc != 0)
        return rc;
    src->registered_taken = reg_bytes;
    if (all_bytes > 0) {
        void *mem = NULL;
        if (posix_memalign(&mem, RUN_ALIGN, (size_t)all_bytes) != 0) {
            char sz[32];
            return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: allocating %s of host memory",
                             ddo__format_bytes(all_bytes, sz, sizeof(sz)));
        }
        ddo__os_advise_huge(mem, (size_t)all_bytes);
        src->base = mem;
        src->bytes = all_bytes;
    }
    src->seg_count = (size_t)(reg_bytes / DDO_SEGMENT_BYTES);
    if (src->seg_count > 0) {
        src->seg_registered = ddo__calloc(src->seg_count, 1);
        if (src->seg_registered == NULL)
            return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    }
    for (size_t t = 0; t < src->tensor_count; t++) {
        entry *e = &src->entries[t];
        if (e->run == RUN_STORE)
            e->ptr = src->base + e->pos;
    }
    return 0;
}

static int by_pos(const void *a, const void *b)
{
    const ddo__codec_item *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* weight_codec: codes the read store in place (source_codec.c); the pages and account bytes
 * it saved go back before the (now smaller) registered part is registered. */
static int code_store(ddo__source *src, const ddo__source_params *p, layout *l, ddo__errbuf *eb)
{
    ddo__codec_item *items = ddo__calloc(src->tensor_count + 1, sizeof(*items));
    if (items == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    size_t n = 0, split = 0;
    for (size_t t = 0; t < src->tensor_count; t++) {
        if (src->entries[t].run != RUN_STORE)
            continue;
        items[n] =
            (ddo__codec_item){ t, src->entries[t].pos, ddo_checkpoint_tensor(src->ck, t)->nbytes };
        split += items[n].pos < l->registered_end ? 1 : 0;
        n++;
    }
    qsort(items, n, sizeof(*items), by_pos);
    uint64_t reg_end = 0, end = 0;
    int rc = ddo__source_codec_pack(src->ck, src->base, items, n, split, (unsigned)p->workers,
                                    src->retained, p->metrics, &src->codec, &reg_end, &end, eb);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        src->entries[items[i].tensor].pos = items[i].pos;
        src->entries[items[i].tensor].ptr = src->base + items[i].pos;
    }
    free(items);
    if (rc != 0)
        return rc;
    *l = (layout){ split > 0 ? reg_end : 0, end };
    uint64_t all = store_bytes(l), reg = registered_bytes(l);
    if (src->bytes > all)
        ddo__source_codec_release_pages(src->base + all, (size_t)(src->bytes - all));
    ddo__account_give(src->retained, src->retained_taken - all);
    src->retained_taken = all;
    ddo__account_give(src->registered, src->registered_taken - reg);
    src->registered_taken = reg;
    src->seg_count = (size_t)(reg / DDO_SEGMENT_BYTES);
    return 0;
}

const ddo__codec_plan *ddo__source_coded(const ddo__source *src, size_t tensor)
{
    return src != NULL ? ddo__source_codec_plan(src->codec, tensor) : NULL;
}

int ddo__source_create(const ddo__source_params *p, const ddo__source_request *req, size_t count,
                       ddo__source **out, ddo__errbuf *eb)
{
    if (p == NULL || p->ck == NULL || p->dev == NULL || p->retained == NULL ||
        p->registered == NULL || out == NULL || (req == NULL && count > 0) || p->workers == 0)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "retained store: invalid argument");
    ddo__source *src = ddo__calloc(1, sizeof(*src));
    if (src == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    src->ck = p->ck;
    src->dev = p->dev;
    src->retained = p->retained;
    src->registered = p->registered;
    src->tensor_count = ddo_checkpoint_tensor_count(p->ck);
    src->file_count = ddo_checkpoint_file_count(p->ck);
    int rc = 0;
    uint8_t *seen = ddo__calloc(src->tensor_count, 1);
    src->entries = ddo__calloc(src->tensor_count, sizeof(*src->entries));
    src->direct_fd = ddo__calloc(src->file_count, sizeof(*src->direct_fd));
    src->direct_broken = ddo__calloc(src->file_count, sizeof(*src->direct_broken));
    if (seen == NULL || src->entries == NULL || src->direct_fd == NULL ||
        src->direct_broken == NULL) {
        free(seen);
        src->file_count = 0; /* no descriptor was opened */
        ddo__source_destroy(src);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "retained store: out of host memory");
    }
    for (uint32_t f = 0; f < src->file_count; f++) {
        src->direct_fd[f] = -1;
        atomic_init(&src->direct_broken[f], false);
    }
    layout l;
    rc = validate_requests(p->ck, req, count, seen, eb);
    free(seen);
    if (rc == 0)
        rc = place(p->ck, req, count, src->entries, &l, eb);
    if (rc != 0)
        goto fail;

    choose_engine(src, p);

    rc = take_store(src, &l, eb);
    if (rc != 0)
        goto fail;

    rc = read_all(src, p, req, count, eb);
    if (rc == 0 && p->codec)
        rc = code_store(src, p, &l, eb);
    if (rc == 0)
        rc = register_all(src, p, eb);
    if (rc == 0)
        rc = pin_host_tensors(src, p, req, count, eb);
    if (rc != 0)
        goto fail;
    *out = src;
    return 0;
fail:
    ddo__source_destroy(src);
    return rc;
}

void ddo__source_destroy(ddo__source *src)
{
    if (src == NULL)
        return;
    bool leak_registered = false;
    for (size_t i = 0; i < src->seg_count; i++) {
        if (src->seg_registered != NULL && src->seg_registered[i] &&
            ddo__dev_host_unregister(src->dev, src->base + i * DDO_SEGMENT_BYTES) != 0)
            leak_registered = true; /* the driver may still use the pages: never free them */
    }
    if (!leak_registered)
        free(src->base);
    ddo__host_pins_destroy(src->host_pins);
    ddo__source_codec_destroy(src->codec);
    for (size_t f = 0; src->direct_fd != NULL && f < src->file_count; f++)
        ddo__os_file_close(src->direct_fd[f]);
    if (src->registered_taken > 0)
        ddo__account_give(src->registered, src->registered_taken);
    if (src->retained_taken > 0)
        ddo__account_give(src->retained, src->retained_taken);
    free(src->seg_registered);
    free(src->entries);
    free(src->direct_fd);
    free(src->direct_broken);
    free(src);
}

/* ---- serving bytes ---- */

const void *ddo__source_host_ptr(const ddo__source *src, size_t tensor, bool *registered)
{
    if (registered != NULL)
        *registered = false;
    if (src == NULL || tensor >= src->tensor_count)
        return NULL;
    const entry *e = &src->entries[tensor];
    if (e->run == RUN_NONE)
        return NULL;
    if (e->run == RUN_HOST && registered != NULL) {
        ddo__host_piece pieces[3];
        *registered = ddo__source_host_pieces(src, tensor, pieces) > 0;
    }
    if (e->run == RUN_STORE && registered != NULL) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(src->ck, tensor);
        const ddo__codec_plan *cp = ddo__source_codec_plan(src->codec, tensor);
        uint64_t len = cp != NULL ? cp->coded_bytes : t->nbytes; /* the bytes stored */
        uint64_t first = e->pos / DDO_SEGMENT_BYTES;
        uint64_t last = len > 0 ? (e->pos + len - 1) / DDO_SEGMENT_BYTES : first;
        bool all = true;
        for (uint64_t s = first; s <= last && all; s++)
            all = s < src->seg_count && src->seg_registered[s];
        *registered = all;
    }
    return e->ptr;
}

size_t ddo__source_host_pieces(const ddo__source *src, size_t tensor, ddo__host_piece out[3])
{
    if (src == NULL || tensor >= src->tensor_count || src->entries[tensor].run != RUN_HOST)
        return 0;
    const ddo_tensor_info *t = ddo_checkpoint_tensor(src->ck, tensor);
    return ddo__host_pins_pieces(src->host_pins, src->entries[tensor].ptr, t->nbytes, out);
}

bool ddo__source_one_region(const ddo__source *src, const void *p, uint64_t len)
{
    return src != NULL && ddo__host_pins_one_region(src->host_pins, p, len);
}

uint64_t ddo__source_segment_left(const ddo__source *src, size_t tensor, uint64_t offset)
{
    if (src == NULL || tensor >= src->tensor_count)
        return UINT64_MAX;
    const entry *e = &src->entries[tensor];
    if (e->run != RUN_STORE)
        return UINT64_MAX;
    uint64_t at = e->pos + offset;
    return DDO_SEGMENT_BYTES - at % DDO_SEGMENT_BYTES;
}

int ddo__source_read_file(ddo__source *src, size_t tensor, uint64_t offset, size_t len, void *dst,
                          size_t dst_cap, const void **data, ddo__errbuf *eb)
{
    if (src == NULL || dst == NULL || data == NULL || tensor >= src->tensor_count)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "read: invalid argument");
    const ddo_tensor_info *t = ddo_checkpoint_tensor(src->ck, tensor);
    if (offset > t->nbytes || len > t->nbytes - offset || len > dst_cap)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "read: tensor \"%s\": %zu bytes at %llu do not fit the tensor (%llu "
                         "bytes) or the window (%zu bytes)",
                         t->name, len, (unsigned long long)offset, (unsigned long long)t->nbytes,
                         dst_cap);
    if (t->file_index == UINT32_MAX) {
        if (t->host_data == NULL && len > 0)
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "read: tensor \"%s\": host-memory tensor without data", t->name);
        if (len > 0)
            memcpy(dst, (const uint8_t *)t->host_data + offset, len);
        *data = dst;
        return 0;
    }
    uint32_t file = t->file_index;
    uint64_t abs = t->offset + offset;
    if (ddo__source_fault_hit() != 0)
        return ddo__fail(eb, DDO_E_IO,
                         "%s: tensor \"%s\": read of %zu bytes at %llu: injected fault",
                         file_name(src, file), t->name, len, (unsigned long long)abs);
    uint64_t a0 = align_down(abs, IO_ALIGN);
    uint64_t a1 = ddo__round_up(abs + len, IO_ALIGN);
    int fd = file < src->file_count ? src->direct_fd[file] : -1;
    if (fd >= 0 && len >= DIRECT_MIN && !atomic_load(&src->direct_broken[file]) &&
        (uintptr_t)dst % IO_ALIGN == 0 && a1 - a0 <= dst_cap) {
        if (ddo__checkpoint_check_file(src->ck, file) != 0)
            return ddo__fail_from_last(eb, DDO_E_FILE_CHANGED);
        int64_t got = ddo__os_read_direct(fd, a0, a1 - a0, dst, src->use_uring);
        if (got >= 0 && (uint64_t)got >= abs + len - a0) {
            /* Checked after the read too: bytes written while it ran are never used. */
            if (ddo__checkpoint_check_file(src->ck, file) != 0)
                return ddo__fail_from_last(eb, DDO_E_FILE_CHANGED);
            *data = (const uint8_t *)dst + (abs - a0);
            return 0;
        }
        if (got < 0 && got != -EINVAL && got != -EOPNOTSUPP)
            return ddo__fail(eb, DDO_E_IO, "%s: direct read of %zu bytes at %llu: %s",
                             file_name(src, file), len, (unsigned long long)abs,
                             strerror((int)-got));
        if (got < 0)
            atomic_store(&src->direct_broken[file], true);
        /* EINVAL or a short direct read: the page cache path below decides */
    }
    int rc = ddo__checkpoint_read_range(src->ck, file, abs, dst, len);
    if (rc != 0)
        return ddo__fail_from_last(eb, rc);
    *data = dst;
    return 0;
}
