/*
 * source_read.c - filling the retained store (source.c): parallel jobs of
 * pin_cpu_workers threads that read the retained tensors in pieces (io_uring
 * with O_DIRECT for the aligned middle, pread otherwise: the engines of
 * os/read.c), register the store's segments, and pin the host-memory tensors
 * in place; and the read fault injection of the tests.
 */
#include "store/source_internal.h"

#include "checkpoint/checkpoint.h"
#include "device/device.h"
#include "os/file.h"
#include "os/sys.h"
#include "store/source_sidecar.h"

#include "os/thread.h"
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Copies the calling thread's last detail (another module's message) into buf. */
static const char *last_detail(char *buf, size_t len)
{
    snprintf(buf, len, "%s", ddo_last_error());
    return buf;
}

/* ---- parallel jobs (reads, registration) ---- */

typedef struct job job;
typedef void (*job_worker)(job *j);

struct job {
    ddo__mutex lock;
    ddo__cond cond;
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
    ddo__mutex_lock(&j->lock);
    bool ok = !j->abort && j->next < j->count;
    if (ok)
        *idx = j->next++;
    ddo__mutex_unlock(&j->lock);
    return ok;
}

static void job_progress(job *j, uint64_t bytes)
{
    ddo__mutex_lock(&j->lock);
    j->done += bytes;
    ddo__cond_signal(&j->cond);
    ddo__mutex_unlock(&j->lock);
}

/* Records the first failure; abort stops the other workers taking items. */
static void job_error(job *j, int code, bool abort, const char *fmt, ...) DDO_PRINTF(4, 5);
static void job_error(job *j, int code, bool abort, const char *fmt, ...)
{
    ddo__mutex_lock(&j->lock);
    if (j->err == 0) {
        j->err = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
        va_end(ap);
    }
    if (abort)
        j->abort = true;
    ddo__mutex_unlock(&j->lock);
}

static void *job_thread(void *arg)
{
    job *j = arg;
    j->worker(j);
    ddo__mutex_lock(&j->lock);
    j->running--;
    ddo__cond_signal(&j->cond);
    ddo__mutex_unlock(&j->lock);
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
    ddo__thread *tids = ddo__calloc(threads, sizeof(*tids));
    size_t started = 0;
    ddo__mutex_lock(&j->lock);
    for (size_t i = 0; tids != NULL && i < threads; i++) {
        j->running++;
        if (ddo__thread_create(&tids[i], job_thread, j) != 0) {
            j->running--;
            break;
        }
        started++;
    }
    ddo__mutex_unlock(&j->lock);
    if (started == 0) {
        j->worker(j); /* no thread could be started: do the work here */
    } else {
        uint64_t reported = UINT64_MAX;
        ddo__mutex_lock(&j->lock);
        for (;;) {
            if (progress != NULL && j->done != reported) {
                reported = j->done;
                uint64_t total = j->total;
                ddo__mutex_unlock(&j->lock);
                progress(user, phase, reported, total);
                ddo__mutex_lock(&j->lock);
                continue;
            }
            if (j->running == 0)
                break;
            ddo__cond_wait(&j->cond, &j->lock);
        }
        ddo__mutex_unlock(&j->lock);
        for (size_t i = 0; i < started; i++)
            ddo__thread_join(tids[i]);
    }
    if (progress != NULL && started == 0)
        progress(user, phase, j->done, j->total);
    free(tids);
}

static int job_init(job *j, ddo__source *src, job_worker worker, void *arg, size_t count,
                    uint64_t total)
{
    memset(j, 0, sizeof(*j));
    if (ddo__mutex_init(&j->lock) != 0)
        return DDO_E_NO_MEMORY;
    if (ddo__cond_init(&j->cond) != 0) {
        ddo__mutex_destroy(&j->lock);
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
    ddo__cond_destroy(&j->cond);
    ddo__mutex_destroy(&j->lock);
}

/* ---- reading ---- */

/* One read request: part of one tensor, at most IO_CHUNK, split at file-aligned boundaries. */
typedef struct piece {
    uint32_t file;
    uint64_t off; /* absolute file offset */
    uint64_t len;
    uint8_t *dst;
    int side_fd;         /* >= 0: read from file's sidecar instead (its coded stream) */
    size_t tensor;       /* with side_fd: the tensor whose stream this is part of */
    uint64_t stream_off; /* with side_fd: where that stream starts in the sidecar */
} piece;

/* A piece of a coded stream from a sidecar: its hash is added to the tensor's, and a failed
 * read marks the sidecar (source_sidecar_use.c then ignores it); never a setup error. */
static void read_piece_sidecar(job *j, const piece *p)
{
    ddo__source *src = j->src;
    int e = ddo__os_pread_full(p->side_fd, p->dst, (size_t)p->len, p->off);
    if (e != 0)
        atomic_store(&src->side_failed[p->file], true);
    else
        atomic_fetch_add(&src->side_sums[p->tensor],
                         ddo__sidecar_hash(p->dst, p->len, (p->off - p->stream_off) / 8));
    job_progress(j, p->len);
}

static void read_piece_pread(job *j, const piece *p)
{
    if (p->side_fd >= 0) {
        read_piece_sidecar(j, p);
        return;
    }
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
    job_error(j, DDO_E_IO, true, "retained store: %s%s: read of %llu bytes at %llu: injected fault",
              p->side_fd >= 0 ? "the sidecar of " : "", ddo__source_file_name(j->src, p->file),
              (unsigned long long)p->len, (unsigned long long)p->off);
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
    uint64_t ms = ddo__round_up(s, IO_ALIGN), me = ddo__source_align_down(e, IO_ALIGN);
    uint8_t *mdst = p->dst + (ms - s);
    if (p->side_fd >= 0 || fd < 0 || atomic_load(&src->direct_broken[p->file]) || me <= ms ||
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
                  ddo__source_file_name(src, p->file), (unsigned long long)f->len,
                  (unsigned long long)f->off, res == 0 ? "unexpected end of file" : strerror(-res));
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
        if (en->run != RUN_STORE || en->host) /* a host tensor is coded from its memory */
            continue;
        const ddo_tensor_info *t = ddo_checkpoint_tensor(src->ck, req[i].tensor);
        uint64_t s = t->offset, e = t->offset + t->nbytes;
        int side_fd = -1;
        if (en->side == SIDE_CODED) { /* the coded stream, from the sidecar */
            side_fd = src->sidecars[t->file_index]->fd;
            s = en->se->coded_off;
            e = s + en->se->coded_bytes;
        }
        uint64_t stream_off = s;
        uint8_t *dst = src->base + en->pos;
        while (s < e) {
            uint64_t next = ddo__source_align_down(s, IO_ALIGN) + IO_CHUNK;
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
            pieces[n++] = (piece){ .file = t->file_index,
                                   .off = s,
                                   .len = end - s,
                                   .dst = dst,
                                   .side_fd = side_fd,
                                   .tensor = req[i].tensor,
                                   .stream_off = stream_off };
            dst += end - s;
            s = end;
        }
        bytes += side_fd >= 0 ? en->se->coded_bytes : t->nbytes;
    }
    *out = pieces;
    *n_out = n;
    *bytes_out = bytes;
    return 0;
}

int ddo__source_read_all(ddo__source *src, const ddo__source_params *p,
                         const ddo__source_request *req, size_t count, ddo__errbuf *eb)
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

int ddo__source_register_all(ddo__source *src, const ddo__source_params *p, ddo__errbuf *eb)
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
int ddo__source_pin_host_tensors(ddo__source *src, const ddo__source_params *p,
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

static int read_file(ddo__source *src, size_t tensor, uint64_t offset, size_t len, void *dst,
                     size_t dst_cap, const void **data, ddo__errbuf *eb);

int ddo__source_read_direct(const ddo__source *src, int fd, atomic_bool *broken, uint64_t off,
                            size_t len, void *dst, const void **at)
{
    uint64_t a0 = ddo__source_align_down(off, IO_ALIGN), a1 = ddo__round_up(off + len, IO_ALIGN);
    int64_t got = ddo__os_read_direct(fd, a0, a1 - a0, dst, src->use_uring);
    if (got >= 0 && (uint64_t)got >= off + len - a0) {
        *at = (const uint8_t *)dst + (off - a0);
        return 1;
    }
    if (got == -EINVAL || got == -EOPNOTSUPP)
        atomic_store(broken, true);
    return got < 0 && got != -EINVAL && got != -EOPNOTSUPP ? (int)got : 0;
}

int ddo__source_read_file(ddo__source *src, size_t tensor, uint64_t offset, size_t len, void *dst,
                          size_t dst_cap, const void **data, ddo__errbuf *eb)
{
    uint64_t t0 = ddo__now_ns();
    int rc = read_file(src, tensor, offset, len, dst, dst_cap, data, eb);
    if (rc == 0 && src->test_read_rate > 0.0 &&
        ddo_checkpoint_tensor(src->ck, tensor)->file_index != UINT32_MAX)
        ddo__os_sleep_until_ns(t0 + (uint64_t)((double)len / src->test_read_rate * 1e9));
    return rc;
}

static int read_file(ddo__source *src, size_t tensor, uint64_t offset, size_t len, void *dst,
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
                         ddo__source_file_name(src, file), t->name, len, (unsigned long long)abs);
    int fd = file < src->file_count ? src->direct_fd[file] : -1;
    if (file < src->file_count && ddo__source_direct_takes(fd, &src->direct_broken[file], abs, len,
                                                           DIRECT_MIN, dst, dst_cap)) {
        if (ddo__checkpoint_check_file(src->ck, file) != 0)
            return ddo__fail_from_last(eb, DDO_E_FILE_CHANGED);
        int got = ddo__source_read_direct(src, fd, &src->direct_broken[file], abs, len, dst, data);
        if (got > 0) {
            /* Checked after the read too: bytes written while it ran are never used. */
            if (ddo__checkpoint_check_file(src->ck, file) != 0)
                return ddo__fail_from_last(eb, DDO_E_FILE_CHANGED);
            return 0;
        }
        if (got < 0)
            return ddo__fail(eb, DDO_E_IO, "%s: direct read of %zu bytes at %llu: %s",
                             ddo__source_file_name(src, file), len, (unsigned long long)abs,
                             strerror(-got));
        /* refused or short: the page cache path below decides */
    }
    int rc = ddo__checkpoint_read_range(src->ck, file, abs, dst, len);
    if (rc != 0)
        return ddo__fail_from_last(eb, rc);
    *data = dst;
    return 0;
}
