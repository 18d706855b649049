/*
 * common.h - what every module of libddo shares: error details, checked
 * allocation, clocks and small string helpers. Internal; never installed.
 */
#ifndef DDO_COMMON_H
#define DDO_COMMON_H

#include "base/support.h"
#include "ddo.h"
#include "ddo_compat.h"
#include "ddo_host.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DDO_GIB ((uint64_t)1 << 30)
#define DDO_MIB ((uint64_t)1 << 20)
#define DDO_KIB ((uint64_t)1 << 10)
/* Registration segments of the retained store (whole 64 MiB segments). */
#define DDO_SEGMENT_BYTES (64 * DDO_MIB)

#define DDO_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#if defined(DDO_DEBUG_ASSERTS)
#    include <stdio.h>
#    include <stdlib.h>
#    define DDO_ASSERT(cond)                                                                 \
        do {                                                                                 \
            if (!(cond)) {                                                                   \
                fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond); \
                abort();                                                                     \
            }                                                                                \
        } while (0)
#else
#    define DDO_ASSERT(cond) ((void)0)
#endif

#if defined(__MINGW32__)
/* mingw-w64 with C11 uses its own C99 printf (%zu, %llu): gnu_printf, not MS printf. */
#    define DDO_PRINTF(f, a) __attribute__((format(gnu_printf, f, a)))
#elif defined(__GNUC__)
#    define DDO_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#    define DDO_PRINTF(f, a)
#endif

/* The detail of the last failure on one handle. */
#define DDO_ERRBUF_BYTES 1024
typedef struct ddo__errbuf {
    int code;
    char msg[DDO_ERRBUF_BYTES];
} ddo__errbuf;

/*
 * Records a failure: formats the one-line detail into eb (may be NULL) and
 * into the calling thread's last-error buffer. Returns code, so callers write
 * `return ddo__fail(&h->err, DDO_E_IO, "%s: read: %s", path, strerror(e));`.
 */
int ddo__fail(ddo__errbuf *eb, int code, const char *fmt, ...) DDO_PRINTF(3, 4);
int ddo__vfail(ddo__errbuf *eb, int code, const char *fmt, va_list ap);
/* Copies the thread's last detail into eb (after a failing call into another module). */
int ddo__fail_from_last(ddo__errbuf *eb, int code);
/* Clears eb (a handle's detail is readable until its next failing call). */
void ddo__errbuf_clear(ddo__errbuf *eb);

/*
 * The ABI rule of the structs that grow (ddo.h, abi.c). ddo__abi_in copies the caller's
 * struct src, whose first member is its size, into dst of this library's size full: the
 * caller's fields, zero past them, dst's size set to full. ddo__abi_out checks the caller's
 * struct dst and writes the fields of src (full bytes) that lie within its size, keeping
 * it. Both refuse a size below sizeof(size_t), above full or not aligned like a size_t with
 * DDO_E_INVALID_ARGUMENT naming the struct (name) and writing nothing.
 */
int ddo__abi_in(const char *name, const void *src, size_t full, void *dst);
int ddo__abi_out(const char *name, const void *src, size_t full, void *dst);
#define DDO__ABI_IN(type, src, dst)  ddo__abi_in(#type, (src), sizeof(type), (dst))
#define DDO__ABI_OUT(type, src, dst) ddo__abi_out(#type, (src), sizeof(type), (dst))

/* Allocation; NULL on failure or on size overflow. Memory is freed with free(). */
void *ddo__malloc(size_t size);
void *ddo__calloc(size_t count, size_t size);
void *ddo__reallocarray(void *p, size_t count, size_t size);
char *ddo__strdup(const char *s);
char *ddo__strndup(const char *s, size_t n);
/* printf into a new string; NULL on failure. */
char *ddo__asprintf(const char *fmt, ...) DDO_PRINTF(1, 2);

/* Overflow-checked arithmetic: false on overflow (*out is then not written). */
bool ddo__mul_u64(uint64_t a, uint64_t b, uint64_t *out);
bool ddo__add_u64(uint64_t a, uint64_t b, uint64_t *out);
/* Saturating arithmetic: UINT64_MAX on overflow (sizes and sums that only get compared). */
uint64_t ddo__sat_add_u64(uint64_t a, uint64_t b);
uint64_t ddo__sat_mul_u64(uint64_t a, uint64_t b);
/* Rounds v up to a multiple of align (align > 0); UINT64_MAX on overflow. */
uint64_t ddo__round_up(uint64_t v, uint64_t align);

/* Monotonic clock, nanoseconds. */
uint64_t ddo__now_ns(void);

/* GiB <-> bytes as upstream: int(max(0, x) * 2^30). */
uint64_t ddo__gb_to_bytes(double gb);
double ddo__bytes_to_gb(uint64_t bytes);

/* A growable text buffer (JSON and tables). On allocation failure it records
 * the failure and further appends are ignored; check ok at the end. */
typedef struct ddo__sbuf {
    char *data;
    size_t len;
    size_t cap;
    bool ok;
} ddo__sbuf;
void ddo__sbuf_init(ddo__sbuf *b);
void ddo__sbuf_printf(ddo__sbuf *b, const char *fmt, ...) DDO_PRINTF(2, 3);
void ddo__sbuf_append(ddo__sbuf *b, const char *s, size_t n);
void ddo__sbuf_free(ddo__sbuf *b);
/* Hands the text to the caller (free with ddo_free/free); NULL if allocation failed. */
char *ddo__sbuf_take(ddo__sbuf *b);

#endif /* DDO_COMMON_H */
