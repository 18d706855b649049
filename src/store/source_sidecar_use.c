/*
 * source_sidecar_use.c - the coded sidecars in a setup with weight_codec and
 * weight_codec_cache_dir (docs/codec.md "Sidecar"; the format: source_sidecar.c).
 *
 *   prepare  before the read: each checkpoint file's sidecar (named from the file's identity)
 *            is opened and validated; each stored tensor it holds is marked SIDE_CODED (its
 *            coded stream is read from the sidecar into its place, by the same parallel read
 *            as the raw bytes: source_read.c) or SIDE_RAW (read raw, not coded again).
 *   verify   after the read: every stream read is checked (its hash, then
 *            ddo__codec_plan_create). A sidecar with one bad stream or a failed read is
 *            ignored whole, with a note naming it: the store is laid out again with its
 *            tensors' raw sizes and read again (source.c), and they are coded, so a bad
 *            sidecar costs time, never weights.
 *   save     after coding: each file whose tensors were coded now gets its sidecar written
 *            atomically; a failure is a note, never an error. It holds the stored tensors
 *            and the file-streamed ones (vmm_source_cache_gb smaller than the model): those
 *            are read and coded one at a time while the sidecar is written (or copied from
 *            the old sidecar, checked), so the session streams their coded bytes from the
 *            first run on.
 */
#include "store/source_internal.h"

#include "checkpoint/checkpoint.h"
#include "codec/codec.h"
#include "os/file.h"
#include "os/fs.h"
#include "os/sys.h"
#include "store/source_sidecar.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ddo__source_note(ddo__source *src, const char *fmt, ...)
{
    size_t used = strlen(src->codec_note);
    if (used + 3 >= sizeof(src->codec_note))
        return;
    if (used > 0) {
        memcpy(src->codec_note + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(src->codec_note + used, sizeof(src->codec_note) - used, fmt, ap);
    va_end(ap);
}

const char *ddo__source_codec_origin(const ddo__source *src)
{
    if (src == NULL || src->codec == NULL)
        return "none";
    if (src->side_hits > 0)
        return src->encoded > 0 ? "sidecar+encoded" : "sidecar";
    return "encoded";
}

const char *ddo__source_codec_note(const ddo__source *src)
{
    return src != NULL ? src->codec_note : "";
}

static bool candidate(const ddo_tensor_info *t)
{
    return ddo__codec_codes_tensor(t->dtype, t->nbytes);
}

/* Opens file f's sidecar into src->sidecars[f] (a note when one exists but is unusable). */
static void open_one(ddo__source *src, const ddo__source_params *p, uint32_t f)
{
    ddo__file_id id;
    if (!ddo__checkpoint_file_identity(src->ck, f, &id))
        return;
    char *path = ddo__sidecar_path(p->codec_cache_dir, &id);
    if (path == NULL)
        return;
    char why[256];
    int e = ddo__sidecar_open(path, &id, src->tensor_count, &src->sidecars[f], why, sizeof(why));
    if (e != 0 && e != ENOENT) {
        ddo__source_note(src, "sidecar %s ignored: %s", path, why);
        ddo__metrics_add(p->metrics, DDO_M_codec_sidecar_ignored, 1);
    }
    free(path);
}

void ddo__source_sidecar_prepare(ddo__source *src, const ddo__source_params *p)
{
    if (!p->codec || p->codec_cache_dir == NULL || p->codec_cache_dir[0] == '\0')
        return;
    src->sidecars = ddo__calloc(src->file_count + 1, sizeof(*src->sidecars));
    src->side_failed = ddo__calloc(src->file_count + 1, sizeof(*src->side_failed));
    src->side_sums = ddo__calloc(src->tensor_count + 1, sizeof(*src->side_sums));
    if (src->sidecars == NULL || src->side_failed == NULL || src->side_sums == NULL) {
        ddo__source_sidecar_release(src);
        return;
    }
    for (uint32_t f = 0; f < src->file_count; f++) {
        atomic_init(&src->side_failed[f], false);
        open_one(src, p, f);
    }
    for (size_t t = 0; t < src->tensor_count; t++) {
        entry *e = &src->entries[t];
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, t);
        atomic_init(&src->side_sums[t], 0);
        if (e->run != RUN_STORE || ti->file_index >= src->file_count ||
            src->sidecars[ti->file_index] == NULL || !candidate(ti))
            continue;
        e->se = ddo__sidecar_find(src->sidecars[ti->file_index], ti->offset, ti->nbytes, ti->dtype);
        if (e->se != NULL)
            e->side = e->se->coded_bytes > 0 ? SIDE_CODED : SIDE_RAW;
    }
}

/* Why the stream of tensor t (SIDE_CODED) is unusable, or NULL. */
static const char *stream_bad(ddo__source *src, size_t t, char *why, size_t len)
{
    const entry *e = &src->entries[t];
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, t);
    if (atomic_load(&src->side_failed[ti->file_index]))
        return "a read failed";
    if (atomic_load(&src->side_sums[t]) != e->se->hash) {
        snprintf(why, len, "tensor `%s`: stream hash differs", ti->name);
        return why;
    }
    ddo__codec_plan *plan = NULL;
    ddo__errbuf eb = { 0 };
    if (ddo__codec_plan_create(e->ptr, e->se->coded_bytes, ti->name, &plan, &eb) != 0) {
        snprintf(why, len, "%s", eb.msg);
        return why;
    }
    ddo__codec_plan_destroy(plan);
    return NULL;
}

/* Ignores file f's sidecar: its tensors are read raw again and coded. */
static void reject(ddo__source *src, const ddo__source_params *p, uint32_t f, const char *why)
{
    ddo__source_note(src, "sidecar %s ignored: %s", src->sidecars[f]->path, why);
    ddo__metrics_add(p->metrics, DDO_M_codec_sidecar_ignored, 1);
    for (size_t t = 0; t < src->tensor_count; t++) {
        entry *e = &src->entries[t];
        if (e->side == SIDE_NONE || ddo_checkpoint_tensor(src->ck, t)->file_index != f)
            continue;
        e->side = SIDE_NONE;
        e->se = NULL;
    }
    ddo__sidecar_close(src->sidecars[f]);
    src->sidecars[f] = NULL;
}

int ddo__source_sidecar_verify(ddo__source *src, const ddo__source_params *p, size_t *rejected)
{
    *rejected = 0;
    if (src->sidecars == NULL)
        return 0;
    char why[DDO_ERRBUF_BYTES];
    for (size_t t = 0; t < src->tensor_count; t++) {
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, t);
        if (src->entries[t].side != SIDE_CODED)
            continue;
        const char *bad = stream_bad(src, t, why, sizeof(why));
        if (bad != NULL) {
            reject(src, p, ti->file_index, bad);
            *rejected += 1;
        }
    }
    if (*rejected > 0) { /* the store is read again: the hashes start from zero */
        for (size_t t = 0; t < src->tensor_count; t++)
            atomic_store(&src->side_sums[t], 0);
        return 0;
    }
    uint64_t hits = 0, bytes = 0;
    for (size_t t = 0; t < src->tensor_count; t++) {
        const entry *e = &src->entries[t];
        hits += e->side != SIDE_NONE ? 1 : 0;
        bytes += e->side == SIDE_CODED ? e->se->coded_bytes : 0;
    }
    src->side_hits = (size_t)hits;
    ddo__metrics_add(p->metrics, DDO_M_codec_sidecar_hits, (double)hits);
    ddo__metrics_add(p->metrics, DDO_M_codec_sidecar_read_bytes, (double)bytes);
    return 0;
}

/* What codes the streams of the tensors the store does not hold (file streaming) while a
 * sidecar is written: one tensor at a time through a read window and an encoder buffer, taken
 * from the retained account (the plan counts them: plan_codec.c). */
typedef struct producer {
    ddo__source *src;
    const ddo__source_params *p;
    const ddo__sidecar *old; /* the file's sidecar as setup found it, or NULL */
    uint8_t *raw;
    size_t raw_cap;
    uint8_t *coded;
    uint64_t coded_cap;
    uint64_t done, total; /* raw bytes coded, for the progress callback */
} producer;

/* A stream the old sidecar holds, read and checked (hash and structure); false when unusable. */
static bool reuse_stream(producer *pr, const ddo_tensor_info *ti, const ddo__sidecar_entry *se)
{
    if (se->coded_bytes > pr->coded_cap ||
        ddo__os_pread_full(pr->old->fd, pr->coded, (size_t)se->coded_bytes, se->coded_off) != 0 ||
        ddo__sidecar_hash(pr->coded, se->coded_bytes, 0) != se->hash)
        return false;
    ddo__codec_plan *plan = NULL;
    ddo__errbuf eb = { 0 };
    bool ok = ddo__codec_plan_create(pr->coded, se->coded_bytes, ti->name, &plan, &eb) == 0;
    ddo__codec_plan_destroy(plan);
    return ok;
}

static int produce(void *user, const ddo__sidecar_item *it, const void **coded,
                   uint64_t *coded_bytes, char *why, size_t why_len)
{
    producer *pr = user;
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(pr->src->ck, it->tag);
    const ddo__sidecar_entry *se =
        pr->old != NULL ? ddo__sidecar_find(pr->old, ti->offset, ti->nbytes, ti->dtype) : NULL;
    *coded = NULL;
    *coded_bytes = 0;
    if (se != NULL && se->coded_bytes == 0)
        return 0; /* known not to shrink */
    if (se != NULL && reuse_stream(pr, ti, se)) {
        *coded = pr->coded;
        *coded_bytes = se->coded_bytes;
        return 0;
    }
    const void *data = NULL;
    ddo__errbuf eb = { 0 };
    ddo__codec_params cp = { 0, (unsigned)pr->p->workers };
    uint64_t len = 0;
    int rc = ddo__source_read_file(pr->src, it->tag, 0, (size_t)ti->nbytes, pr->raw, pr->raw_cap,
                                   &data, &eb);
    if (rc == 0 && ddo__source_codec_fault_hit())
        rc = ddo__fail(&eb, DDO_E_IO, "codec: tensor `%s`: encoding: injected fault", ti->name);
    if (rc == 0)
        rc = ddo__codec_encode(data, ti->nbytes, ti->dtype, &cp, pr->coded, pr->coded_cap, &len,
                               ti->name, &eb);
    if (rc != 0) {
        snprintf(why, why_len, "%s", eb.msg);
        return EIO;
    }
    if (len < ti->nbytes) {
        *coded = pr->coded;
        *coded_bytes = len;
    }
    ddo__metrics_add(pr->p->metrics, DDO_M_codec_sidecar_encoded_bytes, (double)ti->nbytes);
    pr->done += ti->nbytes;
    if (pr->p->progress != NULL)
        pr->p->progress(pr->p->progress_user, "sidecar", pr->done, pr->total);
    return 0;
}

/* The file-streamed candidates of file f as items to produce (after the k store items in out);
 * *fresh when one of them has no entry in the old sidecar; the largest raw and bound bytes. */
static size_t streamed_items(ddo__source *src, uint32_t f, const ddo__sidecar *old,
                             ddo__sidecar_item *out, size_t k, bool *fresh, producer *pr)
{
    for (size_t t = 0; t < src->tensor_count; t++) {
        const entry *e = &src->entries[t];
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, t);
        if (ti->file_index != f || !e->streamed || e->run != RUN_NONE || !candidate(ti))
            continue;
        if (old == NULL || ddo__sidecar_find(old, ti->offset, ti->nbytes, ti->dtype) == NULL) {
            *fresh = true;
            pr->total += ti->nbytes;
        }
        out[k++] = (ddo__sidecar_item){ ti->offset, ti->nbytes, ti->dtype, NULL, 0, true, t };
        uint64_t need = ddo__os_direct_window((size_t)ti->nbytes);
        uint64_t bound = ddo__round_up(ddo__codec_bound(ti->dtype, ti->nbytes, 0), 256);
        pr->raw_cap = need > pr->raw_cap ? (size_t)need : pr->raw_cap;
        pr->coded_cap = bound > pr->coded_cap ? bound : pr->coded_cap;
    }
    return k;
}

/* Writes the sidecar at path from out (k items, producing the file-streamed ones through pr,
 * whose buffers are taken from the retained account for the time of the write). */
static int write_sidecar(ddo__source *src, const char *path, const ddo__file_id *id,
                         ddo__sidecar_item *out, size_t k, producer *pr, uint64_t *written,
                         char *why, size_t why_len)
{
    uint64_t take = pr->raw_cap > 0 ? pr->raw_cap + pr->coded_cap : 0;
    ddo__errbuf eb = { 0 };
    if (take > 0 && ddo__account_take(src->retained, take, &eb) != 0) {
        snprintf(why, why_len, "%s", eb.msg);
        return ENOMEM;
    }
    void *raw = NULL;
    if (take > 0 && ((raw = ddo__os_aligned_alloc(4096, pr->raw_cap)) == NULL ||
                     (pr->coded = malloc((size_t)pr->coded_cap)) == NULL)) {
        ddo__os_aligned_free(raw);
        ddo__account_give(src->retained, take);
        snprintf(why, why_len, "out of memory");
        return ENOMEM;
    }
    pr->raw = raw;
    int e = ddo__sidecar_write_produced(path, id, out, k, produce, pr, written, why, why_len);
    ddo__os_aligned_free(pr->raw);
    free(pr->coded);
    pr->raw = pr->coded = NULL;
    if (take > 0)
        ddo__account_give(src->retained, take);
    return e;
}

/* Writes file f's sidecar: the stored tensors from the packed store (items), the file-streamed
 * ones coded now (or copied from the old sidecar), when any of them was coded now. The new
 * sidecar replaces the old one for the session's file streaming (ddo__source_sidecar_keep). */
static void save_one(ddo__source *src, const ddo__source_params *p, const ddo__codec_item *items,
                     size_t n, uint32_t f, ddo__sidecar_item *out)
{
    ddo__file_id id;
    size_t k = 0;
    bool fresh = false;
    for (size_t i = 0; i < n; i++) {
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, items[i].tensor);
        if (ti->file_index != f || !candidate(ti))
            continue;
        const ddo__codec_plan *cp = ddo__source_codec_plan(src->codec, items[i].tensor);
        out[k++] = (ddo__sidecar_item){ ti->offset,
                                        ti->nbytes,
                                        ti->dtype,
                                        cp != NULL ? src->base + items[i].pos : NULL,
                                        cp != NULL ? items[i].nbytes : 0,
                                        false,
                                        0 };
        fresh = fresh || items[i].from == DDO__CODEC_FROM_RAW_READ;
    }
    ddo__sidecar *old = src->sidecars != NULL ? src->sidecars[f] : NULL;
    producer pr = { src, p, old, NULL, 0, NULL, 0, 0, 0 };
    k = streamed_items(src, f, old, out, k, &fresh, &pr);
    if (!fresh || k == 0 || !ddo__checkpoint_file_identity(src->ck, f, &id))
        return;
    char *path = ddo__sidecar_path(p->codec_cache_dir, &id);
    char why[DDO_ERRBUF_BYTES];
    uint64_t written = 0;
    int e = ddo__os_make_dirs(p->codec_cache_dir);
    if (e != 0)
        snprintf(why, sizeof(why), "%s", ddo__os_fs_strerror(e));
    else if (path == NULL)
        snprintf(why, sizeof(why), "out of memory"), e = ENOMEM;
    else
        e = write_sidecar(src, path, &id, out, k, &pr, &written, why, sizeof(why));
    if (e != 0) {
        ddo__source_note(src, "sidecar %s not written: %s",
                         path != NULL ? path : p->codec_cache_dir, why);
    } else {
        ddo__metrics_add(p->metrics, DDO_M_codec_sidecar_written_bytes, (double)written);
        ddo__sidecar *now = NULL;
        if (src->sidecars != NULL &&
            ddo__sidecar_open(path, &id, src->tensor_count, &now, why, sizeof(why)) == 0) {
            ddo__sidecar_close(old);
            src->sidecars[f] = now;
        }
    }
    free(path);
}

void ddo__source_sidecar_save(ddo__source *src, const ddo__source_params *p,
                              const ddo__codec_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++)
        src->encoded += items[i].from == DDO__CODEC_FROM_RAW_READ &&
                                ddo__source_codec_plan(src->codec, items[i].tensor) != NULL
                            ? 1
                            : 0;
    if (!p->codec || p->codec_cache_dir == NULL || p->codec_cache_dir[0] == '\0')
        return;
    ddo__sidecar_item *out = ddo__calloc(src->tensor_count + 1, sizeof(*out));
    if (out == NULL) {
        ddo__source_note(src, "sidecars not written: out of memory");
        return;
    }
    for (uint32_t f = 0; f < src->file_count; f++)
        save_one(src, p, items, n, f, out);
    free(out);
}

void ddo__source_sidecar_keep(ddo__source *src)
{
    if (src->sidecars == NULL)
        return;
    free(src->side_failed);
    free(src->side_sums);
    src->side_failed = NULL;
    src->side_sums = NULL;
    bool *used = ddo__calloc(src->file_count + 1, sizeof(*used));
    src->stream_ok = ddo__calloc(src->tensor_count + 1, sizeof(*src->stream_ok));
    for (size_t t = 0; src->stream_ok != NULL && t < src->tensor_count; t++)
        atomic_init(&src->stream_ok[t], false);
    for (size_t t = 0; t < src->tensor_count; t++) {
        entry *e = &src->entries[t];
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, t);
        e->se = NULL;
        if (used == NULL || e->run != RUN_NONE || ti->file_index >= src->file_count ||
            src->sidecars[ti->file_index] == NULL || !candidate(ti))
            continue;
        const ddo__sidecar_entry *se =
            ddo__sidecar_find(src->sidecars[ti->file_index], ti->offset, ti->nbytes, ti->dtype);
        if (se != NULL && se->coded_bytes > 0) {
            e->stream = se;
            used[ti->file_index] = true;
        }
    }
    for (size_t f = 0; f < src->file_count; f++) {
        if (used == NULL || !used[f]) {
            ddo__sidecar_close(src->sidecars[f]);
            src->sidecars[f] = NULL;
        } else if (src->engine != DDO__READ_ENGINE_PREAD) {
            ddo__sidecar_open_direct(src->sidecars[f]); /* streams read at the disk's rate */
        }
    }
    free(used);
}

bool ddo__source_has_stream(const ddo__source *src, size_t tensor, uint64_t *coded_bytes)
{
    const entry *e = src != NULL && tensor < src->tensor_count ? &src->entries[tensor] : NULL;
    if (coded_bytes != NULL)
        *coded_bytes = e != NULL && e->stream != NULL ? e->stream->coded_bytes : 0;
    return e != NULL && e->stream != NULL;
}

int ddo__source_read_coded(ddo__source *src, size_t tensor, void *dst, size_t dst_cap,
                           const void **data, ddo__codec_plan **plan, ddo__errbuf *eb)
{
    if (src == NULL || dst == NULL || data == NULL || plan == NULL || tensor >= src->tensor_count)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "coded read: invalid argument");
    *plan = NULL;
    const entry *e = &src->entries[tensor];
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, tensor);
    if (e->stream == NULL)
        return ddo__fail(eb, DDO_E_NOT_FOUND, "tensor `%s`: no stream in a sidecar", ti->name);
    const ddo__sidecar *s = src->sidecars[ti->file_index];
    uint64_t len = e->stream->coded_bytes;
    if (len > dst_cap)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "coded read: tensor `%s`: its stream (%llu bytes) does not fit the "
                         "window (%zu bytes)",
                         ti->name, (unsigned long long)len, dst_cap);
    uint64_t hash = 0;
    const void *at = NULL;
    int rc = ddo__source_read_stream(src, tensor, 0, (size_t)len, dst, dst_cap, &at, &hash, eb);
    if (rc != 0)
        return rc;
    if (!ddo__source_stream_hash_ok(src, tensor, hash))
        return ddo__fail(eb, DDO_E_FORMAT, "sidecar %s: tensor `%s`: stream hash differs", s->path,
                         ti->name);
    rc = ddo__codec_plan_create(at, len, ti->name, plan, eb);
    if (rc != 0)
        return rc;
    *data = at;
    return 0;
}

static _Atomic uint64_t direct_min_test;   /* 0: DIRECT_MIN */
static _Atomic uint64_t direct_reads_test; /* direct stream reads since the process began */
static _Atomic uint64_t hashed_test;       /* stream bytes hashed since the process began */

uint64_t ddo__source_test_stream_hashed_bytes(void)
{
    return atomic_load(&hashed_test);
}

void ddo__source_test_stream_direct_min(uint64_t bytes)
{
    atomic_store(&direct_min_test, bytes);
}

uint64_t ddo__source_test_stream_direct_reads(void)
{
    return atomic_load(&direct_reads_test);
}

int ddo__source_read_stream(ddo__source *src, size_t tensor, uint64_t pos, size_t len, void *dst,
                            size_t dst_cap, const void **at, uint64_t *hash_part, ddo__errbuf *eb)
{
    const entry *e = src != NULL && tensor < src->tensor_count ? &src->entries[tensor] : NULL;
    if (e == NULL || dst == NULL || at == NULL || hash_part == NULL || len > dst_cap)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "coded read: invalid argument");
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(src->ck, tensor);
    if (e->stream == NULL)
        return ddo__fail(eb, DDO_E_NOT_FOUND, "tensor `%s`: no stream in a sidecar", ti->name);
    ddo__sidecar *s = src->sidecars[ti->file_index];
    uint64_t total = e->stream->coded_bytes;
    if (pos % 8 != 0 || pos > total || len > total - pos)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "coded read: tensor `%s`: bytes %llu+%zu outside its stream of %llu",
                         ti->name, (unsigned long long)pos, len, (unsigned long long)total);
    /* The sidecar is named from the checkpoint's identity: a changed checkpoint is refused
     * before and after, as in ddo__source_read_file. */
    if (ddo__checkpoint_check_file(src->ck, ti->file_index) != 0)
        return ddo__fail_from_last(eb, DDO_E_FILE_CHANGED);
    uint64_t off = e->stream->coded_off + pos;
    uint64_t min = atomic_load(&direct_min_test);
    /* A failed direct read is read again buffered: that read decides. */
    if (ddo__source_direct_takes(s->direct_fd, &s->direct_broken, off, len,
                                 min > 0 ? min : DIRECT_MIN, dst, dst_cap) &&
        ddo__source_read_direct(src, s->direct_fd, &s->direct_broken, off, len, dst, at) > 0) {
        atomic_fetch_add(&direct_reads_test, 1);
    } else {
        int rc = ddo__os_pread_full(s->fd, dst, len, off);
        ddo__os_drop_cached(s->fd, off, len); /* no second copy in the cache */
        if (rc != 0)
            return ddo__fail(eb, DDO_E_IO, "sidecar %s: tensor `%s`: read of %zu bytes: %s",
                             s->path, ti->name, len, ddo__os_file_strerror(rc));
        *at = dst;
    }
    if (ddo__checkpoint_check_file(src->ck, ti->file_index) != 0)
        return ddo__fail_from_last(eb, DDO_E_FILE_CHANGED);
    /* A stream's hash is checked at its first read; after that the sidecar must still be the
     * file whose bytes passed it (hashing every load ran at about 2 GB/s on one core, in
     * series with the disk). */
    if (src->stream_ok != NULL && atomic_load(&src->stream_ok[tensor])) {
        ddo__file_id now;
        if (ddo__os_file_identity(s->fd, &now) != 0 || !ddo__os_file_id_equal(&now, &s->id))
            return ddo__fail(eb, DDO_E_FORMAT, "sidecar %s: changed since it was opened", s->path);
        *hash_part = 0;
        return 0;
    }
    *hash_part = ddo__sidecar_hash(*at, len, pos / 8);
    atomic_fetch_add(&hashed_test, len);
    return 0;
}

bool ddo__source_stream_hash_ok(const ddo__source *src, size_t tensor, uint64_t hash)
{
    const entry *e = src != NULL && tensor < src->tensor_count ? &src->entries[tensor] : NULL;
    if (e == NULL || e->stream == NULL)
        return false;
    if (src->stream_ok != NULL && atomic_load(&src->stream_ok[tensor]))
        return true; /* checked at its first read: later reads check the file's identity */
    if (e->stream->hash != hash)
        return false;
    if (src->stream_ok != NULL)
        atomic_store(&src->stream_ok[tensor], true);
    return true;
}

void ddo__source_sidecar_release(ddo__source *src)
{
    for (size_t f = 0; src->sidecars != NULL && f < src->file_count; f++)
        ddo__sidecar_close(src->sidecars[f]);
    free(src->sidecars);
    free(src->side_failed);
    free(src->side_sums);
    free(src->stream_ok);
    src->sidecars = NULL;
    src->side_failed = NULL;
    src->side_sums = NULL;
    src->stream_ok = NULL;
    for (size_t t = 0; src->entries != NULL && t < src->tensor_count; t++)
        src->entries[t].se = NULL;
}
