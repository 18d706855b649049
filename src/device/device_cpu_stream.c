/*
 * device_cpu_stream.c - the cpu device's streams (see the model in
 * device_cpu.c): each a FIFO run in order by its worker thread (or inline on
 * a wrapped host stream), throttled copies, events and the waits on them,
 * host functions, and the codec decode run by the C reference decoder.
 */
#include "device/device_cpu.h"

#include "codec/codec.h"
#include "os/sys.h"

#include "os/thread.h"
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void ddo__cpu_event_unref(cpu_event *e)
{
    if (--e->refs == 0)
        free(e);
}

/* ---- streams ---- */

static void sleep_until(uint64_t t_ns)
{
    ddo__os_sleep_until_ns(t_ns);
}

static uint64_t later(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/*
 * Runs one copy. A throttled copy starts when the copy engine is free (the
 * end of the stream's previous throttled copy) or when it was queued,
 * whichever is later, and ends size / bandwidth + latency after that: the
 * worker's own wake-up delays never add up over back-to-back copies.
 */
static void run_copy(cpu_stream *s, const cpu_op *op, double bytes_per_s, uint64_t latency_ns)
{
    memcpy((void *)(uintptr_t)op->dst, op->src, op->size);
    if (!(bytes_per_s > 0.0 || latency_ns > 0))
        return;
    uint64_t start = later(s->clock_ns, op->queued_ns);
    uint64_t dur = latency_ns;
    if (bytes_per_s > 0.0) {
        /* Saturated before the cast: a tiny rate (1e-300 bytes/s) would overflow uint64_t. */
        double t = (double)op->size * 1e9 / bytes_per_s;
        uint64_t ns = t < 9.0e18 ? (uint64_t)t : UINT64_C(9000000000000000000);
        dur = ddo__sat_add_u64(dur, ns);
    }
    s->clock_ns = ddo__sat_add_u64(start, dur);
    sleep_until(s->clock_ns);
}

/* Runs one op of s (lock held; dropped around copies and host functions). */
static void run_op(cpu_dev *d, cpu_stream *s, cpu_op *op)
{
    s->current = op;
    switch (op->kind) {
    case OP_COPY: {
        double bps = op->peer ? d->peer_bytes_per_s : d->bytes_per_s;
        uint64_t lat = d->latency_ns;
        ddo__mutex_unlock(&d->lock);
        run_copy(s, op, bps, lat);
        ddo__mutex_lock(&d->lock);
        break;
    }
    case OP_READ: /* device -> host: the copy engine's other direction, not throttled */
        ddo__mutex_unlock(&d->lock);
        memcpy((void *)(uintptr_t)op->dst, op->src, op->size);
        ddo__mutex_lock(&d->lock);
        break;
    case OP_MARK:
        if (op->ev->done_gen < op->gen) {
            op->ev->done_gen = op->gen;
            op->ev->done_ns = ddo__now_ns();
        }
        ddo__cpu_event_unref(op->ev);
        break;
    case OP_WAIT:
        if (op->ev->done_gen < op->gen) {
            while (op->ev->done_gen < op->gen)
                ddo__cond_wait(&d->progress, &d->lock);
            /* Copies queued behind the wait start after it, not when they were queued. */
            s->clock_ns = later(s->clock_ns, ddo__now_ns());
        }
        ddo__cpu_event_unref(op->ev);
        break;
    case OP_FN:
        ddo__mutex_unlock(&d->lock);
        op->fn(op->user);
        ddo__mutex_lock(&d->lock);
        s->clock_ns = later(s->clock_ns, ddo__now_ns());
        break;
    }
    s->current = NULL;
    s->completed++;
    free(op);
    ddo__cond_broadcast(&d->progress);
}

static void *worker(void *arg)
{
    cpu_stream *s = arg;
    cpu_dev *d = s->d;
    ddo__mutex_lock(&d->lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            ddo__cond_wait(&s->work, &d->lock);
        if (s->head == NULL)
            break;
        cpu_op *op = s->head;
        s->head = op->next;
        if (s->head == NULL)
            s->tail = NULL;
        run_op(d, s, op);
    }
    ddo__mutex_unlock(&d->lock);
    return NULL;
}

static bool stream_known(cpu_dev *d, void *stream)
{
    return ddo__devtab_find(&d->streams, (uintptr_t)stream) != SIZE_MAX;
}

static bool event_known(cpu_dev *d, void *event)
{
    return ddo__devtab_find(&d->events, (uintptr_t)event) != SIZE_MAX;
}

/* Queues op on s (under the lock). On the calling thread's stream (ddo_stream_wrap) the op
 * runs at once, on the caller's thread: a wait blocks it, a record marks its event done. */
static void enqueue(cpu_stream *s, cpu_op *op)
{
    s->enqueued++;
    if (s->host_thread) {
        run_op(s->d, s, op);
        return;
    }
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    ddo__cond_signal(&s->work);
}

/* Waits until everything queued on s before this call has run (under the lock). */
static void drain(cpu_dev *d, cpu_stream *s)
{
    uint64_t target = s->enqueued;
    while (s->completed < target)
        ddo__cond_wait(&d->progress, &d->lock);
}

int ddo__cpu_stream_create(void *st, int priority, void **stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_stream *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_create: out of host memory");
    s->d = d;
    s->priority = priority;
    ddo__cond_init(&s->work);
    ddo__mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->streams, (uintptr_t)s, 0, s);
    if (rc != 0) {
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_create: out of host memory");
    } else {
        int e = ddo__thread_create(&s->thread, worker, s);
        if (e != 0) {
            ddo__devtab_remove_at(&d->streams, ddo__devtab_find(&d->streams, (uintptr_t)s));
            rc = ddo__fail(eb, DDO_E_DEVICE, "cpu: stream_create: starting the worker: %s",
                           strerror(e));
        }
    }
    ddo__mutex_unlock(&d->lock);
    if (rc != 0) {
        ddo__cond_destroy(&s->work);
        free(s);
        return rc;
    }
    *stream = s;
    return 0;
}

/* The calling thread as a stream: ops queued on it run at once on the caller's thread. */
int ddo__cpu_stream_wrap(void *st, void *native, void **stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (native != NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: stream_wrap: the cpu device has no native streams (pass NULL for "
                         "the calling thread)");
    cpu_stream *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_wrap: out of host memory");
    s->d = d;
    s->host_thread = true;
    ddo__cond_init(&s->work);
    ddo__mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->streams, (uintptr_t)s, 0, s);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0) {
        ddo__cond_destroy(&s->work);
        free(s);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_wrap: out of host memory");
    }
    *stream = s;
    return 0;
}

/* A wrapped stream is the device's own object on cpu: destroyed as any stream. */

int ddo__cpu_stream_unwrap(void *st, void *stream, ddo__errbuf *eb)
{
    return ddo__cpu_stream_destroy(st, stream, eb);
}

int ddo__cpu_stream_destroy(void *st, void *stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_stream *s = stream;
    ddo__mutex_lock(&d->lock);
    if (!stream_known(d, stream)) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_destroy: unknown stream %p",
                         stream);
    }
    drain(d, s);
    size_t i = ddo__devtab_find(&d->streams, (uintptr_t)s);
    if (i != SIZE_MAX)
        ddo__devtab_remove_at(&d->streams, i);
    s->stop = true;
    ddo__cond_signal(&s->work);
    ddo__mutex_unlock(&d->lock);
    if (!s->host_thread)
        ddo__thread_join(s->thread);
    ddo__cond_destroy(&s->work);
    free(s);
    return 0;
}

int ddo__cpu_stream_synchronize(void *st, void *stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    if (!stream_known(d, stream)) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_synchronize: unknown stream %p",
                         stream);
    }
    drain(d, stream);
    ddo__mutex_unlock(&d->lock);
    return 0;
}

static cpu_op *new_op(op_kind kind)
{
    cpu_op *op = ddo__calloc(1, sizeof(*op));
    if (op != NULL)
        op->kind = kind;
    return op;
}

/* True when [a, a + size) starts inside a registered range and runs past its end (lock held). */
static bool spans_registration(cpu_dev *d, uint64_t a, size_t size)
{
    size_t i = ddo__devtab_floor(&d->regs, a);
    if (i == SIZE_MAX)
        return false;
    uint64_t b = d->regs.v[i].key, n = d->regs.v[i].size;
    return a < b + n && a + size > b + n;
}

int ddo__cpu_copy_h2d(void *st, uint64_t dst, const void *src, size_t size, void *stream,
                      ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_COPY);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: copy_h2d: out of host memory");
    op->dst = dst;
    op->src = src;
    op->size = size;
    op->queued_ns = ddo__now_ns();
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: copy_h2d: unknown stream %p", stream);
    else if (!ddo__cpu_device_bytes(d, dst, size))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: copy_h2d: destination 0x%" PRIx64 " + %zu is not mapped device "
                       "memory",
                       dst, size);
    else if (spans_registration(d, (uintptr_t)src, size))
        /* The CUDA driver rejects (CUDA_ERROR_INVALID_VALUE) a copy that starts in registered
         * memory and runs past the end of that registration; so does the reference device. */
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: copy_h2d: source %p + %zu runs past the end of its host "
                       "registration (as cuMemcpyHtoDAsync: CUDA_ERROR_INVALID_VALUE)",
                       src, size);
    else
        enqueue(stream, op);
    if (rc == 0)
        ddo__cpu_use_mapping_at(d, dst, size);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

/* A copy from another cpu device's memory (or this one's): the source is checked under its
 * device's lock, then queued on this device's stream like copy_h2d, at the peer throttle. */
int ddo__cpu_copy_peer(void *st, uint64_t dst, void *src_st, uint64_t src, size_t size,
                       void *stream, ddo__errbuf *eb)
{
    cpu_dev *d = st, *from = src_st;
    ddo__mutex_lock(&from->lock);
    bool src_ok = ddo__cpu_device_bytes(from, src, size);
    ddo__mutex_unlock(&from->lock);
    if (!src_ok)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: copy_peer: source 0x%" PRIx64 " + %zu is not device memory of the "
                         "source device",
                         src, size);
    cpu_op *op = new_op(OP_COPY);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: copy_peer: out of host memory");
    op->dst = dst;
    op->src = (const void *)(uintptr_t)src;
    op->size = size;
    op->peer = true;
    op->queued_ns = ddo__now_ns();
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: copy_peer: unknown stream %p", stream);
    else if (!ddo__cpu_device_bytes(d, dst, size))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: copy_peer: destination 0x%" PRIx64 " + %zu is not mapped device "
                       "memory",
                       dst, size);
    else
        enqueue(stream, op);
    if (rc == 0)
        ddo__cpu_use_mapping_at(d, dst, size);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

int ddo__cpu_copy_d2h(void *st, void *dst, uint64_t src, size_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    bool ok = ddo__cpu_device_bytes(d, src, size);
    ddo__mutex_unlock(&d->lock);
    if (!ok)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: copy_d2h: source 0x%" PRIx64 " + %zu is not mapped device memory",
                         src, size);
    memcpy(dst, (const void *)(uintptr_t)src, size);
    return 0;
}

/* True when [p, p + size) lies inside one pinned (host_alloc) or registered range (lock
 * held). */
static bool host_pinned(cpu_dev *d, const void *p, size_t size)
{
    const ddo__devtab *tabs[2] = { &d->pinned, &d->regs };
    uint64_t a = (uintptr_t)p;
    for (int k = 0; k < 2; k++) {
        size_t i = ddo__devtab_floor(tabs[k], a);
        if (i != SIZE_MAX && a - tabs[k]->v[i].key <= tabs[k]->v[i].size &&
            size <= tabs[k]->v[i].size - (a - tabs[k]->v[i].key))
            return true;
    }
    return false;
}

int ddo__cpu_copy_d2h_async(void *st, void *dst, uint64_t src, size_t size, void *stream,
                            ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_READ);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: copy_d2h_async: out of host memory");
    op->dst = (uintptr_t)dst;
    op->src = (const void *)(uintptr_t)src;
    op->size = size;
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc =
            ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: copy_d2h_async: unknown stream %p", stream);
    else if (!ddo__cpu_device_bytes(d, src, size))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: copy_d2h_async: source 0x%" PRIx64 " + %zu is not mapped device "
                       "memory",
                       src, size);
    else if (!host_pinned(d, dst, size))
        /* cuMemcpyDtoHAsync into pageable memory is not asynchronous; ddo's callers pin. */
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: copy_d2h_async: destination %p + %zu is not pinned host memory "
                       "(host_alloc or host_register)",
                       dst, size);
    else
        enqueue(stream, op);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

/* ---- events ---- */

int ddo__cpu_event_create(void *st, void **event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_event *e = ddo__calloc(1, sizeof(*e));
    if (e == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: event_create: out of host memory");
    e->refs = 1;
    ddo__mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->events, (uintptr_t)e, 0, e);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0) {
        free(e);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: event_create: out of host memory");
    }
    *event = e;
    return 0;
}

int ddo__cpu_event_destroy(void *st, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->events, (uintptr_t)event);
    if (i == SIZE_MAX) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_destroy: unknown event %p", event);
    }
    ddo__devtab_remove_at(&d->events, i);
    ddo__cpu_event_unref(event); /* queued markers and waits keep it until they run */
    ddo__mutex_unlock(&d->lock);
    return 0;
}

int ddo__cpu_event_record(void *st, void *event, void *stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_MARK);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: event_record: out of host memory");
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!event_known(d, event)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_record: unknown event %p", event);
    } else if (!stream_known(d, stream)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_record: unknown stream %p", stream);
    } else {
        cpu_event *e = event;
        op->ev = e;
        op->gen = ++e->rec_gen;
        e->refs++;
        enqueue(stream, op);
    }
    ddo__mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

int ddo__cpu_event_query(void *st, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!event_known(d, event)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_query: unknown event %p", event);
    } else {
        const cpu_event *e = event;
        rc = e->done_gen >= e->rec_gen ? 0 : DDO_E_BUSY;
    }
    ddo__mutex_unlock(&d->lock);
    return rc;
}

int ddo__cpu_event_elapsed(void *st, void *start, void *end, double *seconds, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!event_known(d, start) || !event_known(d, end)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_elapsed: unknown event %p",
                       event_known(d, start) ? end : start);
    } else {
        const cpu_event *a = start, *b = end;
        if (a->done_gen < a->rec_gen || b->done_gen < b->rec_gen)
            rc = DDO_E_BUSY;
        else if (a->rec_gen == 0 || b->rec_gen == 0)
            rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                           "cpu: event_elapsed: an event never "
                           "recorded");
        else
            *seconds = b->done_ns >= a->done_ns ? (double)(b->done_ns - a->done_ns) / 1e9 : 0.0;
    }
    ddo__mutex_unlock(&d->lock);
    return rc;
}

int ddo__cpu_event_synchronize(void *st, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    if (!event_known(d, event)) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_synchronize: unknown event %p",
                         event);
    }
    cpu_event *e = event;
    uint64_t target = e->rec_gen;
    e->refs++; /* a concurrent destroy must not free it under us */
    while (e->done_gen < target)
        ddo__cond_wait(&d->progress, &d->lock);
    ddo__cpu_event_unref(e);
    ddo__mutex_unlock(&d->lock);
    return 0;
}

int ddo__cpu_stream_wait_event(void *st, void *stream, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_WAIT);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_wait_event: out of host memory");
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    bool queued = false;
    if (!event_known(d, event)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_wait_event: unknown event %p",
                       event);
    } else if (!stream_known(d, stream)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_wait_event: unknown stream %p",
                       stream);
    } else {
        cpu_event *e = event;
        /* Waits for the latest record at the time of the call; nothing if already done. */
        if (e->done_gen < e->rec_gen) {
            op->ev = e;
            op->gen = e->rec_gen;
            e->refs++;
            enqueue(stream, op);
            queued = true;
        }
    }
    ddo__mutex_unlock(&d->lock);
    if (!queued)
        free(op);
    return rc;
}

int ddo__cpu_host_fn(void *st, void *stream, ddo__host_fn fn, void *user, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_FN);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_fn: out of host memory");
    op->fn = fn;
    op->user = user;
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: host_fn: unknown stream %p", stream);
    else
        enqueue(stream, op);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

/* A queued batch: the C reference decoder run on each tensor in order on the stream's
 * worker. */
typedef struct cpu_codec_job {
    size_t n;
    ddo__codec_desc d[DDO_CODEC_BATCH_MAX];
} cpu_codec_job;

static void run_codec_job(void *user)
{
    cpu_codec_job *j = user;
    for (size_t i = 0; i < j->n; i++) {
        const ddo__codec_desc *x = &j->d[i];
        ddo__codec_decode_status((const void *)(uintptr_t)x->src, x->src_bytes,
                                 (void *)(uintptr_t)x->dst, x->dst_bytes, &x->l,
                                 (uint64_t *)(uintptr_t)x->l.status_dev);
    }
    free(j);
}

/* True when every descriptor's source, destination and status area is device memory. */
static bool batch_in_device(cpu_dev *d, const ddo__codec_desc *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!ddo__cpu_device_bytes(d, x[i].src, x[i].src_bytes) ||
            !ddo__cpu_device_bytes(d, x[i].dst, x[i].dst_bytes) ||
            !ddo__cpu_device_bytes(d, x[i].l.status_dev, x[i].l.status_bytes))
            return false;
    return true;
}

int ddo__cpu_codec_decode(void *st, void *stream, const ddo__codec_desc *x, size_t n,
                          ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (n > DDO_CODEC_BATCH_MAX)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: codec_decode: %zu tensors", n);
    cpu_codec_job *j = ddo__calloc(1, sizeof(*j));
    cpu_op *op = new_op(OP_FN);
    if (j == NULL || op == NULL) {
        free(j);
        free(op);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: codec_decode: out of host memory");
    }
    j->n = n;
    memcpy(j->d, x, n * sizeof(*x));
    op->fn = run_codec_job;
    op->user = j;
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: codec_decode: unknown stream %p", stream);
    else if (!batch_in_device(d, x, n))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: codec_decode: source, destination or status area is not device "
                       "memory");
    else
        enqueue(stream, op);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0) {
        free(j);
        free(op);
    }
    return rc;
}
