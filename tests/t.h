/*
 * t.h - the tiny test harness: each test program is a set of functions run
 * from main with T_RUN, checks with T_CHECK / T_EQ_*, and ends with the line
 * "N passed, N failed, N skipped". A test function may call T_SKIP(reason).
 * Exit status: 0 all passed, 1 some failed, 77 every test skipped.
 */
#ifndef DDO_T_H
#define DDO_T_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_passed, t_failed, t_skipped;
static int t_cur_failed, t_cur_skipped;

#define T_CHECK(cond)                                                                  \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            t_cur_failed = 1;                                                          \
        }                                                                              \
    } while (0)

#define T_CHECK_MSG(cond, ...)                                                         \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            t_cur_failed = 1;                                                          \
        }                                                                              \
    } while (0)

/* Stops the current test function when a check fails (use before dereferencing). */
#define T_REQUIRE(cond)                                                                      \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "  %s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); \
            t_cur_failed = 1;                                                                \
            return;                                                                          \
        }                                                                                    \
    } while (0)

#define T_EQ_INT(a, b)                                                                          \
    do {                                                                                        \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                 \
        if (t_a_ != t_b_) {                                                                     \
            fprintf(stderr, "  %s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, \
                    #b, t_a_, t_b_);                                                            \
            t_cur_failed = 1;                                                                   \
        }                                                                                       \
    } while (0)

#define T_EQ_U64(a, b)                                                                          \
    do {                                                                                        \
        unsigned long long t_a_ = (unsigned long long)(a), t_b_ = (unsigned long long)(b);      \
        if (t_a_ != t_b_) {                                                                     \
            fprintf(stderr, "  %s:%d: %s == %s failed: %llu != %llu\n", __FILE__, __LINE__, #a, \
                    #b, t_a_, t_b_);                                                            \
            t_cur_failed = 1;                                                                   \
        }                                                                                       \
    } while (0)

#define T_EQ_STR(a, b)                                                                          \
    do {                                                                                        \
        const char *t_a_ = (a), *t_b_ = (b);                                                    \
        if (t_a_ == NULL || t_b_ == NULL || strcmp(t_a_, t_b_) != 0) {                          \
            fprintf(stderr, "  %s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, \
                    #a, #b, t_a_ ? t_a_ : "(null)", t_b_ ? t_b_ : "(null)");                    \
            t_cur_failed = 1;                                                                   \
        }                                                                                       \
    } while (0)

#define T_NEAR(a, b, tol)                                                                       \
    do {                                                                                        \
        double t_a_ = (double)(a), t_b_ = (double)(b);                                          \
        if (!(fabs(t_a_ - t_b_) <= (tol))) {                                                    \
            fprintf(stderr, "  %s:%d: %s ~= %s failed: %.9g vs %.9g\n", __FILE__, __LINE__, #a, \
                    #b, t_a_, t_b_);                                                            \
            t_cur_failed = 1;                                                                   \
        }                                                                                       \
    } while (0)

/* Checks that haystack contains needle. */
#define T_CONTAINS(haystack, needle)                                                         \
    do {                                                                                     \
        const char *t_h_ = (haystack), *t_n_ = (needle);                                     \
        if (t_h_ == NULL || strstr(t_h_, t_n_) == NULL) {                                    \
            fprintf(stderr, "  %s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
                    t_h_ ? t_h_ : "(null)", t_n_);                                           \
            t_cur_failed = 1;                                                                \
        }                                                                                    \
    } while (0)

#define T_SKIP(reason)                              \
    do {                                            \
        fprintf(stderr, "  skipped: %s\n", reason); \
        t_cur_skipped = 1;                          \
        return;                                     \
    } while (0)

#define T_RUN(fn)                                              \
    do {                                                       \
        t_cur_failed = 0;                                      \
        t_cur_skipped = 0;                                     \
        fprintf(stderr, "%s\n", #fn);                          \
        fn();                                                  \
        if (t_cur_failed)                                      \
            t_failed++, fprintf(stderr, "  FAILED %s\n", #fn); \
        else if (t_cur_skipped)                                \
            t_skipped++;                                       \
        else                                                   \
            t_passed++;                                        \
    } while (0)

static inline int t_done(void)
{
    printf("%d passed, %d failed, %d skipped\n", t_passed, t_failed, t_skipped);
    fflush(stdout);
    if (t_failed)
        return 1;
    if (t_passed == 0 && t_skipped > 0)
        return 77;
    return 0;
}

/* Path of a file under tests/data (DDO_TEST_DATA), in a static buffer per call site. */
static inline const char *t_data(char *buf, size_t len, const char *rel)
{
    const char *root = getenv("DDO_TEST_DATA");
    snprintf(buf, len, "%s/%s", root ? root : "tests/data", rel);
    return buf;
}

#endif /* DDO_T_H */
