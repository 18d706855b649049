/*
 * source_sidecar.c - the coded sidecar's file format (source_sidecar.h): its name from the
 * checkpoint file's identity, the validating reader of its header and table (a hostile file:
 * every length and offset is checked before use), and the atomic writer. What a setup does
 * with it: source_sidecar_use.c.
 */
#include "store/source_sidecar.h"

#include "codec/codec.h"
#include "os/fs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC          "DDOSIDE1"
#define VERSION        1u
#define CODEC_VERSION  1u
#define GOLDEN         0x9e3779b97f4a7c15ull
#define HEADER_HASHED  120
#define TABLE_HASH_AT  112
#define HEADER_HASH_AT 120

uint64_t ddo__sidecar_hash(const void *p, uint64_t n, uint64_t first_word)
{
    const uint8_t *b = p;
    uint64_t sum = 0, words = n / 8, i = 0;
    for (; i < words; i++) {
        uint64_t w;
        memcpy(&w, b + 8 * i, 8); /* little-endian hosts only (as the codec) */
        sum += ddo__codec_fmix64(w + (first_word + i) * GOLDEN);
    }
    if (n % 8 != 0) {
        uint64_t w = 0;
        memcpy(&w, b + 8 * words, (size_t)(n % 8));
        sum += ddo__codec_fmix64(w + (first_word + words) * GOLDEN);
    }
    return sum;
}

char *ddo__sidecar_path(const char *dir, const ddo__file_id *id)
{
    const uint64_t key[] = { id->dev,      id->ino, id->size,      id->mtime_ns,
                             id->ctime_ns, VERSION, CODEC_VERSION, DDO_CODEC_DEFAULT_BLOCK };
    uint64_t h1 = 0x243f6a8885a308d3ull, h2 = 0x13198a2e03707344ull;
    for (size_t i = 0; i < DDO_ARRAY_LEN(key); i++) {
        h1 = ddo__codec_fmix64(h1 ^ key[i]) + GOLDEN * (i + 1);
        h2 = ddo__codec_fmix64(h2 + key[i] * GOLDEN) ^ h1;
    }
    size_t len = strlen(dir) + 1 + 32 + 5 + 1;
    char *out = malloc(len);
    if (out != NULL)
        snprintf(out, len, "%s/%016llx%016llx.ddoc", dir, (unsigned long long)h1,
                 (unsigned long long)h2);
    return out;
}

static void header_write(uint8_t h[DDO__SIDECAR_HEADER], const ddo__file_id *id, uint32_t count,
                         uint64_t bytes, uint64_t data_off, uint64_t table_hash)
{
    memset(h, 0, DDO__SIDECAR_HEADER);
    memcpy(h, MAGIC, 8);
    ddo__codec_wr32(h + 8, VERSION);
    ddo__codec_wr32(h + 12, CODEC_VERSION);
    ddo__codec_wr32(h + 16, DDO_CODEC_DEFAULT_BLOCK);
    ddo__codec_wr32(h + 20, count);
    const uint64_t v[] = {
        id->dev, id->ino, id->size, id->mtime_ns, id->ctime_ns, bytes, data_off
    };
    for (size_t i = 0; i < DDO_ARRAY_LEN(v); i++)
        ddo__codec_wr64(h + 24 + 8 * i, v[i]);
    ddo__codec_wr64(h + TABLE_HASH_AT, table_hash);
    ddo__codec_wr64(h + HEADER_HASH_AT, ddo__sidecar_hash(h, HEADER_HASHED, 0));
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)ddo__codec_rd32(p) | (uint64_t)ddo__codec_rd32(p + 4) << 32;
}

#define WHY(...) (snprintf(why, why_len, __VA_ARGS__), EINVAL)

/* Checks the header against id and the file's length; *count and *data_off from it. */
static int header_check(const uint8_t *h, const ddo__file_id *id, uint64_t file_bytes,
                        uint64_t max_entries, uint64_t *count, uint64_t *data_off, char *why,
                        size_t why_len)
{
    if (memcmp(h, MAGIC, 8) != 0)
        return WHY("not a ddo sidecar (magic)");
    if (ddo__codec_rd32(h + 8) != VERSION || ddo__codec_rd32(h + 12) != CODEC_VERSION ||
        ddo__codec_rd32(h + 16) != DDO_CODEC_DEFAULT_BLOCK)
        return WHY("another version or codec setting");
    if (rd64(h + HEADER_HASH_AT) != ddo__sidecar_hash(h, HEADER_HASHED, 0))
        return WHY("header hash differs");
    const uint64_t v[] = { id->dev, id->ino, id->size, id->mtime_ns, id->ctime_ns };
    for (size_t i = 0; i < DDO_ARRAY_LEN(v); i++)
        if (rd64(h + 24 + 8 * i) != v[i])
            return WHY("made for another checkpoint file (identity differs)");
    if (rd64(h + 64) != file_bytes)
        return WHY("length %llu differs from the header's %llu", (unsigned long long)file_bytes,
                   (unsigned long long)rd64(h + 64));
    for (size_t i = 80; i < TABLE_HASH_AT; i++)
        if (h[i] != 0)
            return WHY("reserved header bytes not zero");
    *count = ddo__codec_rd32(h + 20);
    *data_off = rd64(h + 72);
    uint64_t table_end = DDO__SIDECAR_HEADER + *count * DDO__SIDECAR_ENTRY;
    if (*count > max_entries || *count > DDO__SIDECAR_MAX_ENTRIES)
        return WHY("%llu entries, more than the checkpoint's tensors", (unsigned long long)*count);
    if (*data_off != ddo__round_up(table_end, DDO__SIDECAR_ALIGN) || *data_off > file_bytes)
        return WHY("stream offset %llu invalid", (unsigned long long)*data_off);
    return 0;
}

/* Decodes and checks entry i of the table (prev: the one before, NULL for the first; *lo:
 * where the next stream may start, the end of the last stream before it, raw entries between
 * them or not). */
static int entry_check(const uint8_t *t, size_t i, const ddo__sidecar_entry *prev, uint64_t *lo,
                       uint64_t file_bytes, uint64_t ck_bytes, ddo__sidecar_entry *e, char *why,
                       size_t why_len)
{
    *e = (ddo__sidecar_entry){ rd64(t),      rd64(t + 8),  rd64(t + 16),
                               rd64(t + 24), rd64(t + 32), ddo__codec_rd32(t + 40) };
    uint64_t end = 0, cend = 0;
    if (!ddo__add_u64(e->offset, e->raw_bytes, &end) || end > ck_bytes || e->raw_bytes == 0 ||
        ddo__codec_rd32(t + 44) != 0 || !ddo__codec_codes_dtype((ddo_dtype)e->dtype))
        return WHY("entry %zu: tensor range or dtype invalid", i);
    if (prev != NULL && e->offset < prev->offset + prev->raw_bytes)
        return WHY("entry %zu: not after entry %zu", i, i - 1);
    if (e->coded_bytes == 0)
        return e->coded_off == 0 && e->hash == 0 ? 0 : WHY("entry %zu: raw entry not zero", i);
    if (e->coded_bytes >= e->raw_bytes || e->coded_off % DDO__SIDECAR_ALIGN != 0 ||
        e->coded_off < *lo || !ddo__add_u64(e->coded_off, e->coded_bytes, &cend) ||
        cend > file_bytes)
        return WHY("entry %zu: stream at %llu (%llu bytes) out of place", i,
                   (unsigned long long)e->coded_off, (unsigned long long)e->coded_bytes);
    *lo = cend;
    return 0;
}

/* Reads and checks the table of an open sidecar into s. */
static int table_read(ddo__sidecar *s, const uint8_t *h, const ddo__file_id *id,
                      uint64_t max_entries, char *why, size_t why_len)
{
    uint64_t count = 0, data_off = 0;
    int e = header_check(h, id, s->bytes, max_entries, &count, &data_off, why, why_len);
    if (e != 0)
        return e;
    size_t tb = (size_t)count * DDO__SIDECAR_ENTRY;
    uint8_t *t = malloc(tb > 0 ? tb : 1);
    s->entries = ddo__calloc(count > 0 ? (size_t)count : 1, sizeof(*s->entries));
    if (t == NULL || s->entries == NULL) {
        free(t);
        return WHY("out of memory");
    }
    e = ddo__os_pread_full(s->fd, t, tb, DDO__SIDECAR_HEADER);
    if (e != 0) {
        free(t);
        return WHY("reading the table: %s", e == DDO__OS_EOF ? "end of file" : strerror(e));
    }
    if (ddo__sidecar_hash(t, tb, 0) != rd64(h + TABLE_HASH_AT))
        e = WHY("table hash differs");
    uint64_t lo = data_off;
    for (size_t i = 0; e == 0 && i < count; i++)
        e = entry_check(t + i * DDO__SIDECAR_ENTRY, i, i > 0 ? &s->entries[i - 1] : NULL, &lo,
                        s->bytes, id->size, &s->entries[i], why, why_len);
    free(t);
    s->count = (size_t)count;
    return e;
}

int ddo__sidecar_open(const char *path, const ddo__file_id *id, uint64_t max_entries,
                      ddo__sidecar **out, char *why, size_t why_len)
{
    why[0] = '\0';
    ddo__sidecar *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return WHY("out of memory");
    s->fd = -1;
    s->direct_fd = -1;
    int e = ddo__os_file_open(path, &s->fd);
    if (e == ENOENT) {
        free(s);
        return ENOENT;
    }
    ddo__file_id st;
    uint8_t h[DDO__SIDECAR_HEADER];
    if (e != 0)
        e = WHY("cannot open: %s", ddo__os_file_strerror(e));
    else if ((e = ddo__os_file_identity(s->fd, &st)) != 0)
        e = WHY("stat: %s", strerror(e));
    else if (st.size < DDO__SIDECAR_HEADER)
        e = WHY("truncated (%llu bytes)", (unsigned long long)st.size);
    else if ((s->bytes = st.size, s->id = st, e = ddo__os_pread_full(s->fd, h, sizeof(h), 0)) != 0)
        e = WHY("reading the header: %s", strerror(e));
    else
        e = table_read(s, h, id, max_entries, why, why_len);
    if (e != 0) {
        ddo__sidecar_close(s);
        return e;
    }
    s->path = ddo__strdup(path);
    if (s->path == NULL) {
        ddo__sidecar_close(s);
        return WHY("out of memory");
    }
    *out = s;
    return 0;
}

const ddo__sidecar_entry *ddo__sidecar_find(const ddo__sidecar *s, uint64_t offset,
                                            uint64_t raw_bytes, ddo_dtype dtype)
{
    size_t lo = 0, hi = s != NULL ? s->count : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->entries[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (s == NULL || lo >= s->count)
        return NULL;
    const ddo__sidecar_entry *e = &s->entries[lo];
    return e->offset == offset && e->raw_bytes == raw_bytes && e->dtype == (uint32_t)dtype ? e
                                                                                           : NULL;
}

void ddo__sidecar_open_direct(ddo__sidecar *s)
{
    if (s == NULL || s->direct_fd >= 0 || s->path == NULL)
        return;
    int fd = -1;
    ddo__file_id a, b;
    if (ddo__os_file_open_direct(s->path, &fd) != 0)
        return;
    if (ddo__os_file_identity(s->fd, &a) != 0 || ddo__os_file_identity(fd, &b) != 0 ||
        !ddo__os_file_id_equal(&a, &b)) {
        ddo__os_file_close(fd); /* replaced since it was opened: the buffered descriptor stays */
        return;
    }
    s->direct_fd = fd;
}

void ddo__sidecar_close(ddo__sidecar *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0)
        ddo__os_file_close(s->fd);
    if (s->direct_fd >= 0)
        ddo__os_file_close(s->direct_fd);
    free(s->entries);
    free(s->path);
    free(s);
}

static int by_offset(const void *a, const void *b)
{
    const ddo__sidecar_item *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The sidecar being written (ddo__os_write_atomic_with): the streams go at increasing
 * aligned offsets after the table's room as they are produced, then the table and the header
 * (which hash what precedes them) at the start. */
typedef struct writer {
    const ddo__file_id *id;
    ddo__sidecar_item *items;
    size_t n;
    ddo__sidecar_produce_fn produce;
    void *user;
    uint64_t written;
    char *why;
    size_t why_len;
} writer;

static int write_all_streams(void *user, int fd)
{
    writer *w = user;
    char *why = w->why;
    size_t why_len = w->why_len;
    size_t tb = w->n * DDO__SIDECAR_ENTRY;
    uint8_t *t = ddo__calloc(tb > 0 ? tb : 1, 1);
    if (t == NULL)
        return WHY("out of memory");
    uint64_t data_off = ddo__round_up(DDO__SIDECAR_HEADER + tb, DDO__SIDECAR_ALIGN), pos = data_off;
    int e = 0;
    for (size_t i = 0; i < w->n && e == 0; i++) {
        const ddo__sidecar_item *it = &w->items[i];
        const void *coded = it->coded;
        uint64_t len = it->coded_bytes;
        if (it->produce && (e = w->produce(w->user, it, &coded, &len, why, why_len)) != 0)
            break;
        bool keep = coded != NULL && len > 0;
        uint64_t at = keep ? ddo__round_up(pos, DDO__SIDECAR_ALIGN) : 0;
        if (keep && (e = ddo__os_pwrite_full(fd, coded, (size_t)len, at)) != 0)
            e = WHY("%s", ddo__os_fs_strerror(e));
        pos = keep ? at + len : pos;
        /* Out of the page cache as soon as written back (a hint: starts the writeback of this
         * stream, drops what is clean), so writing a sidecar of tens of GB leaves no copy of
         * it charged to the process's memory cgroup. */
        if (keep && e == 0)
            ddo__os_drop_cached(fd, data_off, pos - data_off);
        const uint64_t v[] = { it->offset, it->raw_bytes, at, keep ? len : 0,
                               keep ? ddo__sidecar_hash(coded, len, 0) : 0 };
        uint8_t *en = t + i * DDO__SIDECAR_ENTRY;
        for (size_t k = 0; k < DDO_ARRAY_LEN(v); k++)
            ddo__codec_wr64(en + 8 * k, v[k]);
        ddo__codec_wr32(en + 40, (uint32_t)it->dtype);
    }
    uint8_t h[DDO__SIDECAR_HEADER];
    header_write(h, w->id, (uint32_t)w->n, pos, data_off, ddo__sidecar_hash(t, tb, 0));
    if (e == 0 && ((e = ddo__os_set_length(fd, pos)) != 0 ||
                   (e = ddo__os_pwrite_full(fd, t, tb, DDO__SIDECAR_HEADER)) != 0 ||
                   (e = ddo__os_pwrite_full(fd, h, sizeof(h), 0)) != 0))
        e = WHY("%s", ddo__os_fs_strerror(e));
    free(t);
    w->written = pos;
    return e;
}

int ddo__sidecar_write_produced(const char *path, const ddo__file_id *id, ddo__sidecar_item *items,
                                size_t n, ddo__sidecar_produce_fn produce, void *user,
                                uint64_t *written, char *why, size_t why_len)
{
    if (n > DDO__SIDECAR_MAX_ENTRIES)
        return WHY("%zu entries: more than a sidecar holds", n);
    qsort(items, n, sizeof(*items), by_offset);
    why[0] = '\0';
    writer w = { id, items, n, produce, user, 0, why, why_len };
    int e = ddo__os_write_atomic_with(path, write_all_streams, &w, false);
    if (e != 0 && why[0] == '\0')
        return WHY("%s", ddo__os_fs_strerror(e));
    if (e != 0)
        return e;
    *written = w.written;
    return 0;
}

int ddo__sidecar_write(const char *path, const ddo__file_id *id, ddo__sidecar_item *items, size_t n,
                       uint64_t *written, char *why, size_t why_len)
{
    return ddo__sidecar_write_produced(path, id, items, n, NULL, NULL, written, why, why_len);
}
