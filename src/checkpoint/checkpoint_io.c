/*
 * checkpoint_io.c - identity checks and reads: every read re-checks the file's identity
 * (descriptor and path; device, inode, size, modification and change times) before and after
 * it copies with pread or from the mapping.
 */
#include "checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#define Q ddo__checkpoint_quote

/* ------------------------------------------------------------------------ */
/* Identity and reads                                                        */
/* ------------------------------------------------------------------------ */

/* Says what differs between the identity at open and now. */
static int changed(const ddo__checkpoint_file *f, const ddo__file_id *now, const char *how)
{
    const ddo__file_id *was = &f->id;
    if (was->dev != now->dev || was->ino != now->ino)
        return ddo__fail(NULL, DDO_E_FILE_CHANGED,
                         "%s: file changed after it was opened (%s: another file now has its "
                         "name)",
                         f->label, how);
    if (was->size != now->size)
        return ddo__fail(NULL, DDO_E_FILE_CHANGED,
                         "%s: file changed after it was opened (%s: size %" PRIu64 " -> %" PRIu64
                         " bytes)",
                         f->label, how, was->size, now->size);
    if (was->mtime_ns != now->mtime_ns)
        return ddo__fail(NULL, DDO_E_FILE_CHANGED,
                         "%s: file changed after it was opened (%s: modification time %" PRIu64
                         " -> %" PRIu64 " ns)",
                         f->label, how, was->mtime_ns, now->mtime_ns);
    return ddo__fail(NULL, DDO_E_FILE_CHANGED,
                     "%s: file changed after it was opened (%s: change time %" PRIu64 " -> %" PRIu64
                     " ns: written, truncated or touched, even if the modification time was "
                     "restored)",
                     f->label, how, was->ctime_ns, now->ctime_ns);
}

int ddo__checkpoint_check_file(const ddo_checkpoint *ck, uint32_t file)
{
    if (ck == NULL || file >= ck->file_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "checkpoint file %u out of range",
                         (unsigned)file);
    const ddo__checkpoint_file *f = &ck->files[file];
    if (f->fd < 0)
        return 0; /* a memory image */
    /* The path first: renaming or unlinking the file also moves its change time, and the
     * message should say the name now leads elsewhere. */
    ddo__file_id now, at_path;
    int e = ddo__os_path_identity(f->real_path, &at_path);
    if (e == ENOENT)
        return ddo__fail(NULL, DDO_E_FILE_CHANGED,
                         "%s: file changed after it was opened (removed or renamed)", f->label);
    if (e != 0)
        return ddo__checkpoint_os_failure(f->info.path, "cannot stat", e);
    if (at_path.dev != f->id.dev || at_path.ino != f->id.ino)
        return changed(f, &at_path, "replaced");
    e = ddo__os_file_identity(f->fd, &now);
    if (e != 0)
        return ddo__checkpoint_os_failure(f->info.path, "cannot stat", e);
    if (!ddo__os_file_id_equal(&f->id, &now))
        return changed(f, &now, "modified in place");
    if (!ddo__os_file_id_equal(&f->id, &at_path))
        return changed(f, &at_path, "replaced");
    return 0;
}

int ddo__checkpoint_read_range(const ddo_checkpoint *ck, uint32_t file, uint64_t offset, void *dst,
                               size_t len)
{
    if (ck == NULL || file >= ck->file_count || (dst == NULL && len > 0))
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "checkpoint read: bad file %u or buffer",
                         (unsigned)file);
    const ddo__checkpoint_file *f = &ck->files[file];
    uint64_t end;
    if (!ddo__add_u64(offset, len, &end) || end > f->info.size)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "%s: read of %zu bytes at offset %" PRIu64 " runs past the end (%" PRIu64
                         " bytes)",
                         f->label, len, offset, f->info.size);
    int rc = ddo__checkpoint_check_file(ck, file);
    if (rc != 0)
        return rc;
    if (len == 0)
        return 0;
    if (f->data != NULL) {
        memcpy(dst, f->data + offset, len);
    } else {
        int e = ddo__os_pread_full(f->fd, dst, len, offset);
        if (e != 0)
            return ddo__checkpoint_os_failure(f->info.path, "read", e);
        /* The bytes now live in the caller's memory (a retained store, a staging window):
         * the page cache is not left holding a second copy of them. */
        ddo__os_drop_cached(f->fd, offset, len);
    }
    /* Again after the read: a write during it changed the change time, so bytes that a writer
     * replaced while we copied them are never handed out either. */
    return ddo__checkpoint_check_file(ck, file);
}

int ddo__checkpoint_open_direct(const ddo_checkpoint *ck, uint32_t file, int *fd)
{
    if (ck == NULL || fd == NULL || file >= ck->file_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "checkpoint file %u out of range",
                         (unsigned)file);
    *fd = -1;
    const ddo__checkpoint_file *f = &ck->files[file];
    if (f->real_path == NULL)
        return ddo__fail(NULL, DDO_E_UNSUPPORTED, "%s: held in memory, no direct I/O", f->label);
    int rc = ddo__checkpoint_check_file(ck, file);
    if (rc != 0)
        return rc;
    int nfd;
    int e = ddo__os_file_open_direct(f->real_path, &nfd);
    if (e == EINVAL || e == EOPNOTSUPP || e == ENOTSUP)
        return ddo__fail(NULL, DDO_E_UNSUPPORTED, "%s: the file system refuses direct I/O (%s)",
                         f->label, strerror(e));
    if (e != 0)
        return ddo__checkpoint_os_failure(f->info.path, "cannot open for direct I/O", e);
    ddo__file_id now;
    e = ddo__os_file_identity(nfd, &now);
    if (e != 0 || !ddo__os_file_id_equal(&f->id, &now)) {
        ddo__os_file_close(nfd);
        if (e != 0)
            return ddo__checkpoint_os_failure(f->info.path, "cannot stat", e);
        return changed(f, &now, "replaced");
    }
    *fd = nfd;
    return 0;
}

int ddo_checkpoint_check(const ddo_checkpoint *ck)
{
    if (ck == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_checkpoint_check: NULL checkpoint");
    for (uint32_t i = 0; i < ck->file_count; i++) {
        int rc = ddo__checkpoint_check_file(ck, i);
        if (rc != 0)
            return ddo__checkpoint_record(ck, rc);
    }
    return 0;
}

int ddo_checkpoint_read(const ddo_checkpoint *ck, size_t i, uint64_t offset, void *dst, size_t len)
{
    if (ck == NULL || (dst == NULL && len > 0))
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_checkpoint_read: NULL argument");
    if (i >= ck->tensor_count)
        return ddo__checkpoint_fail(ck, DDO_E_INVALID_ARGUMENT,
                                    "tensor %zu out of range (the checkpoint has %zu)", i,
                                    ck->tensor_count);
    const ddo_tensor_info *t = &ck->tensors[i];
    uint64_t end;
    if (!ddo__add_u64(offset, len, &end) || end > t->nbytes)
        return ddo__checkpoint_fail(ck, DDO_E_INVALID_ARGUMENT,
                                    "tensor \"%s\": read of %zu bytes at byte %" PRIu64
                                    " runs past its %" PRIu64 " bytes",
                                    Q(t->name), len, offset, t->nbytes);
    if (t->file_index == UINT32_MAX) {
        if (len == 0)
            return 0;
        if (t->host_data == NULL)
            return ddo__checkpoint_fail(ck, DDO_E_INVALID_ARGUMENT,
                                        "tensor \"%s\": no host data (described for planning only)",
                                        Q(t->name));
        memcpy(dst, (const uint8_t *)t->host_data + offset, len);
        return 0;
    }
    int rc = ddo__checkpoint_read_range(ck, t->file_index, t->offset + offset, dst, len);
    if (rc != 0)
        return ddo__checkpoint_record(ck, rc);
    return 0;
}
