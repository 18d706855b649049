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
 *
 * This file: layout and placement, create and destroy, serving bytes. The
 * read workers and the registration of segments: source_read.c; what the two
 * share: source_internal.h.
 */
#include "store/source_internal.h"

#include "checkpoint/checkpoint.h"
#include "device/device.h"
#include "os/file.h"
#include "os/sys.h"

#include "os/thread.h"
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ---- */

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

/* The bytes tensor t takes in the store as read: its coded stream when a sidecar gives it
 * (SIDE_CODED), else its raw bytes; *from: where they start in their file (the 4 KiB
 * congruence of the direct reads). */
static uint64_t stored_bytes(const entry *entries, size_t t, const ddo_tensor_info *ti,
                             uint64_t *from)
{
    const entry *e = entries != NULL ? &entries[t] : NULL;
    if (e != NULL && e->side == SIDE_CODED) {
        *from = e->se->coded_off;
        return e->se->coded_bytes;
    }
    *from = ti->offset;
    return ti->nbytes;
}

/* True when tensor t has a place in the store: a file tensor, or with code_host (its request's)
 * a caller's host-memory tensor the codec codes (coded from its memory into that place,
 * source_codec.c). */
static bool stored(const ddo_tensor_info *t, bool code_host)
{
    if (t->file_index != UINT32_MAX)
        return true;
    return code_host && t->host_data != NULL && ddo__codec_codes_tensor(t->dtype, t->nbytes);
}

/* Places every retained tensor (registered ones first) at the size it is read at
 * (stored_bytes); entries may be NULL (raw sizes only). */
static int place(const ddo_checkpoint *ck, const ddo__source_request *req, size_t count,
                 entry *entries, layout *out, ddo__errbuf *eb)
{
    /* Pass 1: tight sizes, and the slack that rounding to whole segments leaves. */
    uint64_t reg = 0, total = 0;
    for (size_t i = 0; i < count; i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, req[i].tensor);
        if (!req[i].retain || !stored(t, req[i].code_host))
            continue;
        uint64_t from, nb = stored_bytes(entries, req[i].tensor, t, &from);
        if (!ddo__add_u64(total, nb, &total) ||
            (req[i].register_ && !ddo__add_u64(reg, nb, &reg)) ||
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
            bool host = t->file_index == UINT32_MAX;
            if (host && !stored(t, req[i].code_host)) {
                if (entries != NULL) {
                    entries[req[i].tensor].run = RUN_HOST;
                    entries[req[i].tensor].ptr = t->host_data;
                }
                continue;
            }
            uint64_t from, nb = stored_bytes(entries, req[i].tensor, t, &from);
            from = host ? pos : from; /* no direct read: no congruence pad */
            uint64_t pad = (from % IO_ALIGN + IO_ALIGN - pos % IO_ALIGN) % IO_ALIGN;
            if (pads + pad <= total_slack && (!registered || reg_pads + pad <= reg_slack)) {
                pos += pad;
                pads += pad;
                reg_pads += registered ? pad : 0;
            }
            if (entries != NULL) {
                entries[req[i].tensor].run = RUN_STORE;
                entries[req[i].tensor].host = host;
                entries[req[i].tensor].pos = pos;
            }
            pos += nb;
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
    return ddo__os_direct_window(len);
}

ddo__read_engine ddo__source_engine(const ddo__source *src)
{
    return src->engine;
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
        void *mem = ddo__os_aligned_alloc(RUN_ALIGN, (size_t)all_bytes);
        if (mem == NULL) {
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

/* Undoes take_store (nothing registered yet): for a second layout after a rejected sidecar. */
static void give_store(ddo__source *src)
{
    ddo__os_aligned_free(src->base);
    free(src->seg_registered);
    src->base = NULL;
    src->bytes = 0;
    src->seg_registered = NULL;
    src->seg_count = 0;
    ddo__account_give(src->registered, src->registered_taken);
    ddo__account_give(src->retained, src->retained_taken);
    src->registered_taken = 0;
    src->retained_taken = 0;
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
        const entry *e = &src->entries[t];
        items[n] = (ddo__codec_item){ t, e->host ? DDO__CODEC_FROM_HOST : DDO__CODEC_FROM_RAW_READ,
                                      e->pos, ddo_checkpoint_tensor(src->ck, t)->nbytes };
        if (e->side == SIDE_CODED) /* its coded stream, from the sidecar */
            items[n] = (ddo__codec_item){ t, DDO__CODEC_FROM_CODED, e->pos, e->se->coded_bytes };
        else if (e->side == SIDE_RAW)
            items[n].from = DDO__CODEC_FROM_KEEP_RAW;
        split += items[n].pos < l->registered_end ? 1 : 0;
        n++;
    }
    qsort(items, n, sizeof(*items), by_pos);
    uint64_t reg_end = 0, end = 0;
    int rc = ddo__source_codec_pack(src->ck, src->base, items, n, split, (unsigned)p->workers,
                                    src->retained, p->metrics, &src->codec, &reg_end, &end, eb);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        entry *e = &src->entries[items[i].tensor];
        e->pos = items[i].pos;
        e->ptr = src->base + items[i].pos;
    }
    if (rc == 0)
        ddo__source_sidecar_save(src, p, items, n);
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

/* Tests only: DDOTEST_SLOW_FILE_READ_BYTES_PER_S (bytes/s) makes every per-use read from the
 * file take at least its bytes at that rate, a disk slower than planned (docs/io.md). Not for
 * users; 0 or unset: off. */
static double test_read_rate(void)
{
    const char *t = getenv("DDOTEST_SLOW_FILE_READ_BYTES_PER_S");
    double v = t != NULL && t[0] != '\0' ? strtod(t, NULL) : 0.0;
    return v > 0.0 && v < 1e15 ? v : 0.0;
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
    src->workers = (unsigned)p->workers;
    src->file_count = ddo_checkpoint_file_count(p->ck);
    src->test_read_rate = test_read_rate();
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
    for (size_t i = 0; rc == 0 && i < count; i++)
        src->entries[req[i].tensor].streamed = !req[i].retain;
    if (rc == 0)
        rc = place(p->ck, req, count, src->entries, &l, eb);
    if (rc != 0)
        goto fail;

    choose_engine(src, p);

    /* With sidecars the store is laid out at the coded sizes, so their streams are read into
     * their final places (no move, and the retained account never holds the raw bytes); a
     * rejected sidecar gives its file's tensors their raw sizes again, and the store is laid
     * out and read again. */
    ddo__source_sidecar_prepare(src, p);
    for (;;) {
        rc = place(p->ck, req, count, src->entries, &l, eb);
        if (rc == 0)
            rc = take_store(src, &l, eb);
        if (rc == 0)
            rc = ddo__source_read_all(src, p, req, count, eb);
        size_t rejected = 0;
        if (rc == 0 && p->codec)
            rc = ddo__source_sidecar_verify(src, p, &rejected);
        if (rc != 0 || rejected == 0)
            break;
        give_store(src);
    }
    if (rc == 0 && p->codec)
        rc = code_store(src, p, &l, eb);
    ddo__source_sidecar_keep(src);
    if (rc == 0)
        rc = ddo__source_register_all(src, p, eb);
    if (rc == 0)
        rc = ddo__source_pin_host_tensors(src, p, req, count, eb);
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
        ddo__os_aligned_free(src->base);
    ddo__host_pins_destroy(src->host_pins);
    ddo__source_codec_destroy(src->codec);
    ddo__source_sidecar_release(src);
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

bool ddo__source_owns_host_tensor(const ddo__source *src, size_t tensor)
{
    return src != NULL && tensor < src->tensor_count && src->entries[tensor].run == RUN_STORE &&
           src->entries[tensor].host;
}

int ddo__source_copy_out(const ddo__source *src, size_t tensor, void *dst, uint64_t dst_bytes,
                         ddo__errbuf *eb)
{
    if (src == NULL || dst == NULL || tensor >= src->tensor_count)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "retained store: invalid argument");
    const ddo_tensor_info *t = ddo_checkpoint_tensor(src->ck, tensor);
    const entry *e = &src->entries[tensor];
    /* A caller's tensor the store does not hold (resident, or in place): its own bytes. */
    const uint8_t *at = e->run != RUN_NONE ? e->ptr : (const uint8_t *)t->host_data;
    if (at == NULL && t->nbytes > 0)
        return ddo__fail(eb, DDO_E_NOT_FOUND,
                         "retained store: tensor \"%s\": no host copy of it is kept", t->name);
    if (dst_bytes < t->nbytes)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "retained store: tensor \"%s\": %llu bytes do not fit %llu", t->name,
                         (unsigned long long)t->nbytes, (unsigned long long)dst_bytes);
    const ddo__codec_plan *cp = ddo__source_codec_plan(src->codec, tensor);
    if (cp != NULL)
        return ddo__codec_decode_threads(at, cp->coded_bytes, dst, dst_bytes, t->name, src->workers,
                                         eb);
    if (t->nbytes > 0)
        memcpy(dst, at, (size_t)t->nbytes);
    return 0;
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
