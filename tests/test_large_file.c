/*
 * test_large_file.c - a checkpoint past 4 GiB (a sparse file: 4 GiB of zeros, then a small
 * tensor with known bytes) reads correctly through the os layer's positioned reads, the
 * checkpoint reader (pread and mmap) and a direct open: every offset is 64-bit on every
 * platform (mingw's off_t is 32 bits unless _FILE_OFFSET_BITS=64).
 *
 * ctest-labels: unit
 */
#include "ddo.h"
#include "os/file.h"
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#define PAD ((uint64_t)4 << 30) /* the first tensor: 4 GiB + 4096 bytes of zeros */

static char g_path[4096];

/* The file: header, "pad" (U8, PAD + 4096 bytes, never written: a hole), "tail" (U8, 64
 * bytes, i * 3 + 1). 0 or an errno value; EFBIG/ENOSPC where the file system cannot. */
static int make_file(uint64_t *tail_at)
{
    char header[512];
    int n = snprintf(header, sizeof(header),
                     "{\"pad\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]},"
                     "\"tail\":{\"dtype\":\"U8\",\"shape\":[64],\"data_offsets\":[%llu,%llu]}}",
                     (unsigned long long)(PAD + 4096), (unsigned long long)(PAD + 4096),
                     (unsigned long long)(PAD + 4096), (unsigned long long)(PAD + 4096 + 64));
    while (n % 8 != 0)
        header[n++] = ' ';
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)n >> (8 * i));
    unsigned char tail[64];
    for (int i = 0; i < 64; i++)
        tail[i] = (unsigned char)(i * 3 + 1);
    *tail_at = 8 + (uint64_t)n + PAD + 4096;
    int fd;
    int e = ddo__os_open_regular(g_path, O_RDWR | O_CREAT | O_TRUNC, 0644, &fd);
    if (e != 0)
        return e;
    if ((e = ddo__os_pwrite_full(fd, len8, 8, 0)) == 0 &&
        (e = ddo__os_pwrite_full(fd, header, (size_t)n, 8)) == 0 &&
        (e = ddo__os_set_length(fd, *tail_at)) == 0)
        e = ddo__os_pwrite_full(fd, tail, sizeof(tail), *tail_at);
    ddo__os_file_close(fd);
    return e;
}

static void check_tail(const unsigned char *got)
{
    for (int i = 0; i < 64; i++)
        T_CHECK_MSG(got[i] == (unsigned char)(i * 3 + 1), "byte %d: %u", i, got[i]);
}

static void test_past_4gib(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_path, sizeof(g_path), "%s/ddo_large_%ld.safetensors",
             tmp != NULL && *tmp ? tmp : "/tmp", (long)getpid());
    uint64_t tail_at = 0;
    int e = make_file(&tail_at);
    if (e == EFBIG || e == ENOSPC || e == EINVAL) {
        unlink(g_path);
        T_SKIP("the file system here cannot hold a sparse file past 4 GiB");
    }
    T_REQUIRE(e == 0);
    ddo__file_id id;
    T_EQ_INT(ddo__os_path_identity(g_path, &id), 0);
    T_EQ_U64(id.size, tail_at + 64);
    /* the os layer: a positioned read past 4 GiB */
    int fd;
    T_REQUIRE(ddo__os_file_open(g_path, &fd) == 0);
    unsigned char got[64], zero[16];
    T_EQ_INT(ddo__os_pread_full(fd, got, sizeof(got), tail_at), 0);
    check_tail(got);
    T_EQ_INT(ddo__os_pread_full(fd, zero, sizeof(zero), tail_at - 16), 0);
    for (int i = 0; i < 16; i++)
        T_CHECK(zero[i] == 0);
    T_EQ_INT(ddo__os_pread_full(fd, got, 2, tail_at + 63), DDO__OS_EOF);
    ddo__os_file_close(fd);
    /* the checkpoint reader, both ways */
    for (int mode = 0; mode < 2; mode++) {
        ddo_checkpoint *ck = NULL;
        int rc = ddo_checkpoint_create(g_path, mode ? DDO_READ_MMAP : DDO_READ_PREAD, &ck);
        T_EQ_INT(rc, 0);
        if (ck == NULL)
            continue;
        size_t i;
        T_EQ_INT(ddo_checkpoint_find(ck, "tail", &i), 0);
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        T_REQUIRE(t != NULL);
        T_EQ_U64(t->offset, tail_at);
        memset(got, 0, sizeof(got));
        T_EQ_INT(ddo_checkpoint_read(ck, i, 0, got, sizeof(got)), 0);
        check_tail(got);
        ddo_checkpoint_destroy(ck);
    }
    unlink(g_path);
}

int main(void)
{
    T_RUN(test_past_4gib);
    return t_done();
}
