/*
 * session_split.c - split mode (docs/multi-gpu.md): one session drives every device of the
 * set. The session's device (rank 0) keeps exactly the slots, arena, budgets and addresses of
 * one device; every other device k holds one buffer laid out as the arena followed by every
 * slot (split_base[k]), taken through its own account with the same limit. The one loader
 * issues every upload, so every rank sees the same units in the same order (the collective
 * matches calls by order) and holds the same resident set and slot contents:
 *
 *   a streamed tensor whose bytes lie in host memory (retained, or the caller's) is one split
 *   upload: rank r copies its 1/N share from host memory over its own link, every rank copies
 *   the few tail bytes past N shares, then an in-place all-gather completes the tensor on
 *   every rank; a small tensor (< N x 64 KiB) is copied whole by every rank
 *   anything else (a tensor re-read from the file) reaches rank 0 by its own transport and the
 *   other ranks by device->device copies from rank 0
 *
 * The loader waits for every other rank's copies of a unit before the unit is marked issued,
 * so an acquire that returns has the unit complete on every device. The residents reach the
 * other devices by device->device copies from rank 0's arena at create and reload. Unload
 * frees the other devices' buffers with rank 0's state; destroy frees their streams and the
 * communicator.
 */
#include "session/session_transport.h"

#include "device/collective.h"
#include "device/device.h"
#include "session/session_codec.h"

#include <string.h>

/* Below this many bytes per rank a tensor is copied whole by every rank. */
#define SPLIT_MIN_SHARE (64 * 1024)

bool ddo__session_split_used(const ddo_session *s)
{
    return s->split_n > 1;
}

/* The bytes each other device holds: the arena, then every slot. */
static uint64_t mirror_bytes(const ddo_session *s)
{
    return s->b.resident_bytes + (uint64_t)s->slot_count * s->slot_bytes;
}

/* The split devices against the plan and the session's route. */
static int check_devices(ddo_session *s, const ddo_plan_info *info)
{
    size_t n = s->opts.split_device_count;
    if (info->device_mode != DDO_DEVICE_MODE_SPLIT)
        return n == 0 ? 0
                      : ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                                  "ddo_session_create: split_devices need a split plan (devices "
                                  "with device_mode=split)");
    if (n + 1 != info->device_count || s->opts.split_devices == NULL)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: the plan splits over %zu devices (%s): pass the "
                         "%zu after the first as split_devices (%zu given)",
                         info->device_count, info->devices, info->device_count - 1, n);
    if (n + 1 > DDO__SPLIT_MAX)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: split mode takes at most %d devices", DDO__SPLIT_MAX);
    if (ddo__route_per_weight(s->route) || ddo__session_codec_wanted(s))
        return ddo__fail(&s->err, DDO_E_UNSUPPORTED,
                         "ddo_session_create: device_mode=split runs on linear_runtime and "
                         "vmm_fast_runtime without weight_codec (route %s)",
                         s->route_name);
    for (size_t k = 0; k < n; k++) {
        ddo_device *d = s->opts.split_devices[k];
        bool twice = d == s->dev;
        for (size_t j = 0; j < k; j++)
            twice = twice || s->opts.split_devices[j] == d;
        if (d == NULL || twice || ddo__device_ops_of(d) != ddo__device_ops_of(s->dev))
            return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                             "ddo_session_create: split device %zu is NULL, named twice or not "
                             "of the session device's kind (%s)",
                             k + 1, ddo__device_ops_of(s->dev)->name);
    }
    return 0;
}

int ddo__session_split_create(ddo_session *s)
{
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    if (ddo_plan_info_get(s->plan, &info) != 0)
        return ddo__fail_from_last(&s->err, DDO_E_INTERNAL);
    int rc = check_devices(s, &info);
    if (rc != 0 || info.device_mode != DDO_DEVICE_MODE_SPLIT)
        return rc;
    size_t n = info.device_count;
    uint64_t limit =
        s->b.device_weights_limit > 0 ? s->b.device_weights_limit : s->b.device_weights_peak;
    s->split_dev[0] = s->dev;
    s->split_stream[0] = s->copy_stream;
    for (size_t k = 1; k < n; k++) {
        s->split_dev[k] = s->opts.split_devices[k - 1];
        ddo__account_init(&s->split_acc[k], "split device weights", "vmm_resident_weight_budget_gb",
                          limit);
    }
    s->split_n = n; /* from here destroy gives everything back */
    for (size_t k = 1; k < n; k++) {
        rc = ddo__dev_stream_create(s->split_dev[k], 1, &s->split_stream[k]);
        if (rc != 0) {
            s->split_stream[k] = NULL;
            return ddo__session_fail_ctx(&s->err, rc, "split device %zu: stream", k);
        }
    }
    rc = ddo__comm_create(s->split_dev, n, NULL, &s->split_comm, &s->err);
    if (rc != 0)
        s->split_comm = NULL;
    ddo__session_split_rebind(s);
    return rc;
}

/* Device->device copies of len bytes from src on rank 0 to dst on rank k (rank k's stream). */
static int copy_from_rank0(ddo_session *s, size_t k, uint64_t dst, uint64_t src, uint64_t len)
{
    for (uint64_t pos = 0; pos < len;) {
        uint64_t left = len - pos;
        size_t piece = (size_t)(left < DDO__COPY_PIECE_BYTES ? left : DDO__COPY_PIECE_BYTES);
        int rc = ddo__dev_copy_peer(s->split_dev[k], dst + pos, s->dev, src + pos, piece,
                                    s->split_stream[k]);
        if (rc != 0)
            return rc;
        pos += piece;
    }
    return 0;
}

int ddo__session_split_back(ddo_session *s)
{
    uint64_t bytes = mirror_bytes(s);
    for (size_t k = 1; k < s->split_n && bytes > 0; k++) {
        if (s->split_base[k] != 0)
            continue;
        int rc = ddo__account_take(&s->split_acc[k], bytes, &s->err);
        if (rc != 0)
            return rc;
        rc = ddo__dev_mem_alloc(s->split_dev[k], bytes, &s->split_base[k]);
        if (rc != 0) {
            s->split_base[k] = 0;
            ddo__account_give(&s->split_acc[k], bytes);
            return ddo__session_fail_ctx(&s->err, rc, "split device %zu: %llu bytes", k,
                                         (unsigned long long)bytes);
        }
        if (s->arena != 0)
            rc = copy_from_rank0(s, k, s->split_base[k], s->arena, s->b.resident_bytes);
        if (rc == 0)
            rc = ddo__dev_stream_synchronize(s->split_dev[k], s->split_stream[k]);
        if (rc != 0)
            return ddo__session_fail_ctx(&s->err, rc, "split device %zu: the residents", k);
    }
    ddo__session_split_rebind(s);
    return 0;
}

void ddo__session_split_rebind(ddo_session *s)
{
    /* cuda binds the device of each call: a host's runtime would otherwise find another
     * device's context current on its thread. */
    uint64_t f = 0, t = 0;
    if (s->split_n > 1)
        (void)ddo__dev_mem_info(s->dev, &f, &t);
}

int ddo__session_split_unback(ddo_session *s)
{
    int first = 0;
    for (size_t k = 1; k < s->split_n; k++) {
        if (s->split_base[k] == 0)
            continue;
        int rc = ddo__dev_mem_free(s->split_dev[k], s->split_base[k]);
        if (rc == 0)
            ddo__account_give(&s->split_acc[k], mirror_bytes(s));
        else if (first == 0)
            first = ddo__session_fail_ctx(&s->err, rc, "split device %zu: releasing", k);
        s->split_base[k] = 0; /* never freed twice; a failed free stays accounted */
    }
    ddo__session_split_rebind(s);
    return first;
}

void ddo__session_split_destroy(ddo_session *s)
{
    if (s->split_n == 0)
        return;
    (void)ddo__session_split_unback(s);
    ddo__comm_destroy(s->split_comm);
    s->split_comm = NULL;
    for (size_t k = 1; k < s->split_n; k++) {
        if (s->split_stream[k] != NULL)
            (void)ddo__dev_stream_destroy(s->split_dev[k], s->split_stream[k]);
        s->split_stream[k] = NULL;
        ddo__account_fini(&s->split_acc[k]);
    }
    s->split_n = 0;
}

void ddo__session_split_metrics(ddo_session *s, ddo__metrics_acc *m)
{
    if (ddo__session_share_used(s))
        ddo__metrics_set(m, DDO_M_share_count, (double)s->opts.share_count);
    if (s->split_n < 2)
        return;
    ddo__metrics_set(m, DDO_M_split_device_bytes, (double)ddo__account_used(&s->split_acc[1]));
    ddo__metrics_max(m, DDO_M_split_device_peak_bytes, (double)ddo__account_peak(&s->split_acc[1]));
    ddo__metrics_set(m, DDO_M_split_devices, (double)s->split_n);
}

int ddo__session_split_address(const ddo_session *s, size_t device, size_t slot,
                               const ddo_tensor_location *loc, uint64_t *addr)
{
    if (device == 0 || device >= s->split_n || s->split_base[device] == 0)
        return DDO_E_INVALID_ARGUMENT;
    uint64_t base = s->split_base[device];
    if (loc->placement == DDO_PLACEMENT_RESIDENT)
        *addr = base + loc->offset;
    else
        *addr = base + s->b.resident_bytes + (uint64_t)slot * s->slot_bytes + loc->offset;
    return 0;
}

/* The copy of len bytes of tensor, from byte pos of it, from src to dst on dev's stream, in
 * pieces that never cross a registration segment (see ddo__source_segment_left) nor exceed the
 * copy piece. */
static int h2d_range(ddo_session *s, ddo_device *dev, void *stream, size_t tensor,
                     const unsigned char *src, uint64_t dst, uint64_t pos, uint64_t len)
{
    for (uint64_t done = 0; done < len;) {
        uint64_t piece = len - done < DDO__COPY_PIECE_BYTES ? len - done : DDO__COPY_PIECE_BYTES;
        uint64_t seg = ddo__source_segment_left(s->source, tensor, pos + done);
        if (seg < piece)
            piece = seg;
        int rc = ddo__dev_copy_h2d(dev, dst + done, src + done, (size_t)piece, stream);
        if (rc != 0)
            return rc;
        done += piece;
    }
    return 0;
}

/* The bytes [lo, hi) of tensor (hi clipped to its nbytes) from its host bytes to dst (the
 * tensor's device address) on dev's stream: from each piece of a host tensor registered in
 * place (kind registered; ddo__source_host_pieces), else from host. Adds the bytes to *copied. */
static int h2d_part(ddo_session *s, ddo_device *dev, void *stream, size_t tensor,
                    ddo__transport_id kind, const unsigned char *host, uint64_t nbytes,
                    uint64_t dst, uint64_t lo, uint64_t hi, uint64_t *copied)
{
    ddo__host_piece pieces[3];
    size_t np =
        kind == DDO__TRANSPORT_REGISTERED ? ddo__source_host_pieces(s->source, tensor, pieces) : 0;
    if (np == 0) {
        pieces[0] = (ddo__host_piece){ .offset = 0, .len = nbytes, .src = host };
        np = 1;
    }
    hi = hi < nbytes ? hi : nbytes;
    for (size_t i = 0; i < np; i++) {
        uint64_t a = pieces[i].offset > lo ? pieces[i].offset : lo;
        uint64_t b = pieces[i].offset + pieces[i].len < hi ? pieces[i].offset + pieces[i].len : hi;
        if (a >= b)
            continue;
        const unsigned char *src = (const unsigned char *)pieces[i].src + (a - pieces[i].offset);
        int rc = h2d_range(s, dev, stream, tensor, src, dst + a, a, b - a);
        if (rc != 0)
            return rc;
        ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
        *copied += b - a;
    }
    return 0;
}

/* The split upload of tensor's nbytes at host: dst[r] on every rank (see the file's comment). */
static int split_bytes(ddo_session *s, size_t tensor, ddo__transport_id kind,
                       const unsigned char *host, uint64_t nbytes, const uint64_t *dst,
                       ddo__errbuf *eb)
{
    size_t n = s->split_n;
    uint64_t share = nbytes / n;
    if (share < SPLIT_MIN_SHARE)
        share = 0; /* whole, by every rank */
    uint64_t send[DDO__SPLIT_MAX], copied = 0;
    for (size_t r = 0; r < n; r++) {
        ddo_device *d = s->split_dev[r];
        void *st = s->split_stream[r];
        int rc = h2d_part(s, d, st, tensor, kind, host, nbytes, dst[r], r * share, (r + 1) * share,
                          &copied);
        if (rc == 0)
            rc = h2d_part(s, d, st, tensor, kind, host, nbytes, dst[r], share * n, nbytes, &copied);
        if (rc != 0)
            return ddo__session_fail_ctx(eb, rc, "split device %zu: upload", r);
        send[r] = dst[r] + r * share;
    }
    if (share == 0)
        return 0;
    return ddo__comm_all_gather(s->split_comm, send, dst, share, s->split_stream, eb);
}

/* tensor's upload to `to` on the session's device and to its place in slot on the others. */
static int split_tensor(ddo_session *s, size_t slot, size_t tensor, const ddo_tensor_location *loc,
                        uint64_t to, ddo__errbuf *eb)
{
    uint64_t dst[DDO__SPLIT_MAX];
    dst[0] = to;
    for (size_t k = 1; k < s->split_n; k++)
        (void)ddo__session_split_address(s, k, slot, loc, &dst[k]);
    const unsigned char *host = NULL;
    ddo__transport_id kind = ddo__transport_for(s, tensor, &host);
    const char *name = ddo__session_tensor_name(s, tensor);
    if (kind == DDO__TRANSPORT_REGISTERED || kind == DDO__TRANSPORT_PAGEABLE) {
        int rc = split_bytes(s, tensor, kind, host, loc->nbytes, dst, eb);
        if (rc != 0)
            return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": split upload", name);
        ddo__metrics_add(&s->metrics, DDO_M_bytes_split_uploaded, (double)loc->nbytes);
        ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)loc->nbytes);
        return 0;
    }
    /* Rank 0 by the tensor's own transport, then the others from rank 0. */
    const ddo__transport *t = ddo__transport_get(kind);
    ddo__upload up = { tensor, to, loc->nbytes, host };
    int rc = t->upload(s, t, &up, eb);
    if (rc != 0)
        return rc;
    rc = ddo__dev_stream_synchronize(s->dev, s->copy_stream);
    for (size_t k = 1; k < s->split_n && rc == 0; k++)
        rc = copy_from_rank0(s, k, dst[k], to, loc->nbytes);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": copy to the split devices", name);
    ddo__metrics_add(&s->metrics, DDO_M_bytes_split_copied, (double)loc->nbytes);
    return 0;
}

/* Waits for the other devices' copies (failed or not: nothing of the unit stays queued). */
static int split_finish(ddo_session *s, ddo__errbuf *eb)
{
    int first = 0;
    for (size_t k = 1; k < s->split_n; k++) {
        int rc = ddo__dev_stream_synchronize(s->split_dev[k], s->split_stream[k]);
        if (rc != 0 && first == 0)
            first = ddo__session_fail_ctx(eb, rc, "split device %zu: upload", k);
    }
    return first;
}

int ddo__session_split_upload_unit(ddo_session *s, const ddo__job *job, uint64_t dst,
                                   uint64_t *ubytes, bool *reread, ddo__errbuf *eb)
{
    int rc = 0;
    size_t t = 0;
    ddo_tensor_location loc;
    for (size_t i = 0; rc == 0 && ddo__session_unit_next(s, job->unit, &i, &t, &loc);) {
        const unsigned char *host = NULL;
        ddo__transport_id kind = ddo__transport_for(s, t, &host);
        *reread = *reread || kind == DDO__TRANSPORT_FILE;
        rc = split_tensor(s, job->slot, t, &loc, dst + loc.offset, eb);
        *ubytes += loc.nbytes;
    }
    int frc = split_finish(s, rc == 0 ? eb : NULL);
    return rc != 0 ? rc : frc;
}

/* ---- share mode: one session per process and device, the host's all-gather ---- */

/* A share's alignment: every share starts on it. */
#define SHARE_ALIGN 4096

bool ddo__session_share_used(const ddo_session *s)
{
    return s->opts.share_count > 1;
}

int ddo__session_share_create(ddo_session *s)
{
    size_t n = s->opts.share_count;
    if (n < 2)
        return 0;
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    if (ddo_plan_info_get(s->plan, &info) != 0)
        return ddo__fail_from_last(&s->err, DDO_E_INTERNAL);
    if (s->opts.share_rank >= n)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: share_rank %zu out of range (share_count %zu)",
                         s->opts.share_rank, n);
    if (info.device_mode != DDO_DEVICE_MODE_SINGLE)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: share mode takes a one-device plan (this one has "
                         "devices %s): each process plans its own device",
                         info.devices);
    if (ddo__route_per_weight(s->route) || ddo__session_codec_wanted(s))
        return ddo__fail(&s->err, DDO_E_UNSUPPORTED,
                         "ddo_session_create: share mode runs on linear_runtime and "
                         "vmm_fast_runtime without weight_codec (route %s)",
                         s->route_name);
    return 0;
}

uint64_t ddo__session_share_bytes(const ddo_session *s, size_t unit)
{
    size_t n = s->opts.share_count;
    if (n < 2 || s->units[unit].resident)
        return 0;
    uint64_t share = ddo__session_unit_end(s, unit, NULL) / n / SHARE_ALIGN * SHARE_ALIGN;
    return share < SPLIT_MIN_SHARE ? 0 : share;
}

int ddo_session_unit_share(const ddo_session *s, size_t unit, uint64_t *share_bytes)
{
    if (s == NULL || share_bytes == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_unit_share: session and share_bytes are required");
    if (unit >= s->unit_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_unit_share: unit %zu out of range (the plan has %zu units)",
                         unit, s->unit_count);
    *share_bytes = ddo__session_share_bytes(s, unit);
    return 0;
}

/* This rank's parts of tensor at loc (its host bytes; the unit at dst): where the tensor covers
 * them, its share [r x share, (r + 1) x share) of the unit and the tail past count shares. */
static int share_tensor(ddo_session *s, size_t tensor, ddo__transport_id kind,
                        const unsigned char *host, const ddo_tensor_location *loc, uint64_t dst,
                        uint64_t share, uint64_t *copied, ddo__errbuf *eb)
{
    uint64_t r = s->opts.share_rank, n = s->opts.share_count, off = loc->offset;
    const uint64_t parts[2][2] = { { r * share, (r + 1) * share }, { n * share, UINT64_MAX } };
    for (size_t k = 0; k < 2; k++) { /* the part in the tensor's own bytes */
        uint64_t lo = parts[k][0] > off ? parts[k][0] - off : 0;
        uint64_t hi = parts[k][1] > off ? parts[k][1] - off : 0;
        int rc = lo < hi ? h2d_part(s, s->dev, s->copy_stream, tensor, kind, host, loc->nbytes,
                                    dst + off, lo, hi, copied)
                         : 0;
        if (rc != 0)
            return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": share upload",
                                         ddo__session_tensor_name(s, tensor));
    }
    return 0;
}

int ddo__session_share_upload_unit(ddo_session *s, const ddo__job *job, uint64_t dst,
                                   uint64_t *ubytes, bool *reread, ddo__errbuf *eb)
{
    uint64_t share = ddo__session_share_bytes(s, job->unit);
    if (share == 0)
        return ddo__session_upload_unit(s, job, dst, ubytes, reread, eb);
    size_t t = 0;
    ddo_tensor_location loc;
    for (size_t i = 0; ddo__session_unit_next(s, job->unit, &i, &t, &loc);) {
        const unsigned char *host = NULL;
        ddo__transport_id kind = ddo__transport_for(s, t, &host);
        int rc = 0;
        if (kind == DDO__TRANSPORT_REGISTERED || kind == DDO__TRANSPORT_PAGEABLE) {
            uint64_t copied = 0;
            rc = share_tensor(s, t, kind, host, &loc, dst, share, &copied, eb);
            ddo__metrics_add(&s->metrics, DDO_M_bytes_share_uploaded, (double)copied);
            ddo__metrics_add(&s->metrics, DDO_M_bytes_share_left, (double)(loc.nbytes - copied));
            ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)copied);
            *ubytes += copied;
        } else { /* no host bytes to share (re-read from the file): whole, by its transport */
            const ddo__transport *tr = ddo__transport_get(kind);
            ddo__upload up = { t, dst + loc.offset, loc.nbytes, host };
            *reread = *reread || kind == DDO__TRANSPORT_FILE;
            rc = tr->upload(s, tr, &up, eb);
            *ubytes += loc.nbytes;
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}
