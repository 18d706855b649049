/*
 * fuzz_codec.c - libFuzzer target for the codec's decoders on hostile input:
 * the input is a coded stream. The reference decoder must either refuse it
 * with DDO_E_FORMAT and a detail, or (for a valid stream) decode it without
 * writing outside its output; for a stream whose plan validates, the device
 * decoder in C (what the cpu device runs) is also run on a copy with one byte
 * changed (chosen by the input) and must stay inside its output and report
 * the change through the status words. Must never crash, hang or leak. The
 * corpus (tests/fuzz/corpus/codec/) is replayed by every build.
 */
#include "codec/codec.h"
#include "ddo.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD     64
#define MAX_BYTES ((uint64_t)8 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *guarded(uint64_t n)
{
    uint8_t *p = malloc(n + 2 * GUARD);
    if (p != NULL)
        memset(p, 0xA5, n + 2 * GUARD);
    return p;
}

static void check_guard(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < GUARD; i++)
        if (p[i] != 0xA5 || p[GUARD + n + i] != 0xA5)
            abort(); /* a write outside the output */
}

/* The device path: a validated plan, then src with one byte changed. */
static void device_path(const uint8_t *data, size_t size, const ddo__codec_plan *p)
{
    uint8_t *src = malloc(size), *dst = guarded(p->decoded_bytes);
    uint64_t *st = calloc(2 * (size_t)p->launch.n_blocks + 1, sizeof(uint64_t));
    if (src == NULL || dst == NULL || st == NULL)
        abort();
    memcpy(src, data, size);
    size_t at = (size_t)(((uint64_t)data[size - 1] * 2654435761u) % size);
    src[at] ^= (uint8_t)(data[size / 2] | 1);
    ddo__codec_decode_status(src, size, dst + GUARD, p->decoded_bytes, &p->launch, st);
    check_guard(dst, p->decoded_bytes);
    ddo__errbuf eb = { 0, "" };
    int rc = ddo__codec_status_check(p, st, &eb);
    if (rc != 0 && (rc != DDO_E_FORMAT || strstr(eb.msg, "corrupted") == NULL))
        abort();
    free(st);
    free(dst);
    free(src);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ddo__errbuf eb = { 0, "" };
    ddo__codec_plan *p = NULL;
    int rc = ddo__codec_plan_create(data, size, "fuzz.weight", &p, &eb);
    if (rc != 0) {
        if (p != NULL || rc != DDO_E_FORMAT || strstr(eb.msg, "fuzz.weight") == NULL)
            abort(); /* failures leave *out alone and always name the tensor */
        return 0;
    }
    if (p->decoded_bytes <= MAX_BYTES) {
        uint8_t *dst = guarded(p->decoded_bytes);
        if (dst == NULL)
            abort();
        rc = ddo__codec_decode(data, size, dst + GUARD, p->decoded_bytes, "fuzz.weight", &eb);
        if (rc != 0 && rc != DDO_E_FORMAT)
            abort();
        check_guard(dst, p->decoded_bytes);
        free(dst);
        if (size > 0)
            device_path(data, size, p);
    }
    ddo__codec_plan_destroy(p);
    return 0;
}
