/*
 * fuzz_sidecar.c - libFuzzer target for the coded sidecar reader (source_sidecar.h) on
 * hostile files: the input's first byte chooses which of the fields a fuzzer cannot guess the
 * harness sets right (bit 0: the checkpoint's identity, bit 1: the sidecar's own length, bit
 * 2: the table's and the header's hashes), so the table's checks are reached too; the rest
 * is the sidecar, written to a file. ddo__sidecar_open must refuse it with a reason or accept
 * only what its contract promises: entries sorted and disjoint inside the checkpoint, coded
 * dtypes, streams aligned, inside the sidecar, shorter than their tensors and disjoint, raw
 * entries all zero; ddo__sidecar_find finds each entry. An accepted sidecar is written again
 * from its streams (ddo__sidecar_write) and must read back the same. Never a crash, a hang or a
 * leak. The corpus (tests/fuzz/corpus/sidecar/) is replayed by every build.
 */
#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "os/file.h"
#include "store/source_sidecar.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)1 << 20)
#define CK_BYTES  ((uint64_t)1 << 24) /* the checkpoint file the sidecar claims to be for */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const ddo__file_id fuzz_id = { 7, 11, CK_BYTES, 1000, 2000, true };

static void fix_up(uint8_t *b, size_t n, unsigned mode)
{
    if (n < DDO__SIDECAR_HEADER)
        return;
    if (mode & 1u) {
        const uint64_t v[] = { fuzz_id.dev, fuzz_id.ino, fuzz_id.size, fuzz_id.mtime_ns,
                               fuzz_id.ctime_ns };
        for (size_t i = 0; i < 5; i++)
            ddo__codec_wr64(b + 24 + 8 * i, v[i]);
    }
    if (mode & 2u)
        ddo__codec_wr64(b + 64, (uint64_t)n);
    if (mode & 4u) {
        uint64_t tb = (uint64_t)ddo__codec_rd32(b + 20) * DDO__SIDECAR_ENTRY;
        if (tb <= n - DDO__SIDECAR_HEADER)
            ddo__codec_wr64(b + 112, ddo__sidecar_hash(b + DDO__SIDECAR_HEADER, tb, 0));
        ddo__codec_wr64(b + 120, ddo__sidecar_hash(b, 120, 0));
    }
}

/* The contract of an accepted sidecar (bytes: its length). */
static void check_contract(const ddo__sidecar *s, uint64_t bytes)
{
    uint64_t tensor_end = 0, stream_end = 0;
    for (size_t i = 0; i < s->count; i++) {
        const ddo__sidecar_entry *e = &s->entries[i];
        if (e->raw_bytes == 0 || e->offset < tensor_end || e->offset + e->raw_bytes > CK_BYTES ||
            !ddo__codec_codes_dtype((ddo_dtype)e->dtype))
            abort();
        tensor_end = e->offset + e->raw_bytes;
        if (e->coded_bytes == 0) {
            if (e->coded_off != 0 || e->hash != 0)
                abort();
        } else if (e->coded_off % DDO__SIDECAR_ALIGN != 0 || e->coded_off < stream_end ||
                   e->coded_bytes >= e->raw_bytes || e->coded_off + e->coded_bytes > bytes ||
                   e->coded_off < DDO__SIDECAR_HEADER + s->count * DDO__SIDECAR_ENTRY) {
            abort();
        }
        if (e->coded_bytes > 0)
            stream_end = e->coded_off + e->coded_bytes;
        if (ddo__sidecar_find(s, e->offset, e->raw_bytes, (ddo_dtype)e->dtype) != e)
            abort();
    }
}

/* Writes s again from its streams at path2 and checks that it reads back the same. */
static void round_trip(const ddo__sidecar *s, const char *path2)
{
    ddo__sidecar_item *items = calloc(s->count + 1, sizeof(*items));
    uint8_t **streams = calloc(s->count + 1, sizeof(*streams));
    bool ok = items != NULL && streams != NULL;
    for (size_t i = 0; ok && i < s->count; i++) {
        const ddo__sidecar_entry *e = &s->entries[i];
        items[i] =
            (ddo__sidecar_item){ e->offset, e->raw_bytes, (ddo_dtype)e->dtype, NULL, 0, false, 0 };
        if (e->coded_bytes == 0)
            continue;
        streams[i] = malloc((size_t)e->coded_bytes);
        ok = streams[i] != NULL &&
             ddo__os_pread_full(s->fd, streams[i], (size_t)e->coded_bytes, e->coded_off) == 0;
        items[i].coded = streams[i];
        items[i].coded_bytes = e->coded_bytes;
    }
    char why[256];
    uint64_t written = 0;
    ddo__sidecar *back = NULL;
    if (ok &&
        ddo__sidecar_write(path2, &fuzz_id, items, s->count, &written, why, sizeof(why)) == 0) {
        if (ddo__sidecar_open(path2, &fuzz_id, 4096, &back, why, sizeof(why)) != 0)
            abort(); /* what the writer writes, the reader takes */
        if (back->count != s->count)
            abort();
        for (size_t i = 0; i < s->count; i++) { /* (the reader checks a stream's hash only
                                                     when it reads the stream: the writer
                                                     hashes the bytes it writes) */
            const ddo__sidecar_entry *a = &s->entries[i], *b = &back->entries[i];
            uint64_t h = streams[i] != NULL ? ddo__sidecar_hash(streams[i], a->coded_bytes, 0) : 0;
            if (a->offset != b->offset || a->raw_bytes != b->raw_bytes ||
                a->coded_bytes != b->coded_bytes || b->hash != h || a->dtype != b->dtype)
                abort();
        }
        ddo__sidecar_close(back);
    }
    for (size_t i = 0; streams != NULL && i < s->count; i++)
        free(streams[i]);
    free(streams);
    free(items);
}

static char path[64], path2[64];

static bool make_paths(void)
{
    if (path[0] != '\0')
        return true;
    snprintf(path, sizeof(path), "/tmp/ddo_fuzz_sidecar_%ld", (long)getpid());
    snprintf(path2, sizeof(path2), "/tmp/ddo_fuzz_sidecar_%ld.2", (long)getpid());
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size - 1 > MAX_BYTES || !make_paths())
        return 0;
    size_t n = size - 1;
    uint8_t *b = malloc(n > 0 ? n : 1);
    if (b == NULL)
        return 0;
    memcpy(b, data + 1, n);
    fix_up(b, n, data[0]);
    FILE *f = fopen(path, "wb");
    bool written = f != NULL && fwrite(b, 1, n, f) == n;
    if (f != NULL && fclose(f) != 0)
        written = false;
    free(b);
    if (!written)
        return 0;
    ddo__sidecar *s = NULL;
    char why[256];
    int e = ddo__sidecar_open(path, &fuzz_id, 4096, &s, why, sizeof(why));
    if (e == 0) {
        check_contract(s, (uint64_t)n);
        round_trip(s, path2);
        ddo__sidecar_close(s);
    } else if (why[0] == '\0') {
        abort(); /* every refusal says why */
    }
    unlink(path);
    unlink(path2);
    return 0;
}
