/*
 * fs_impl.h - inside the fs module: what fs_common.c (compiled on every platform) shares with
 * fs.c and fs_win.c, and the system calls each of those provides to it.
 */
#ifndef DDO_OS_FS_IMPL_H
#define DDO_OS_FS_IMPL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Per platform: up to len bytes of fd at offset into dst; the count, 0 at the end of the file,
 * or a negated errno value. */
int64_t ddo__os_fs_read_at(int fd, void *dst, size_t len, uint64_t offset);
/* Per platform: 64 bits that differ between processes and calls, for temporary names. */
uint64_t ddo__os_fs_random_tag(void);

/* "<path>.<16 hex>.tmp" into buf; ENAMETOOLONG when it does not fit. Inline: the platform files
 * use it below fs_common.c, which uses them. */
static inline int ddo__os_fs_temp_name(const char *path, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s.%016llx.tmp", path, (unsigned long long)ddo__os_fs_random_tag());
    return n < 0 || (size_t)n >= len ? ENAMETOOLONG : 0;
}

#endif /* DDO_OS_FS_IMPL_H */
