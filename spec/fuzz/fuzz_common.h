/*
 * fuzz_common.h — shared by the libFuzzer targets in spec/fuzz/: a reader that turns the
 * fuzzer's bytes into small integers, extreme int64 values and doubles (running out of bytes
 * reads zeros), and the oracle macro that aborts with the failed condition and k3's message.
 */
#ifndef K3_FUZZ_COMMON_H
#define K3_FUZZ_COMMON_H

#include "k3_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint8_t fz_u8(fz *f) {
    if (!f->n) return 0;
    f->n--;
    return *f->p++;
}

static inline uint32_t fz_u32(fz *f) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | fz_u8(f);
    return v;
}

/* Values where size and offset arithmetic breaks if it is going to. */
static const int64_t fz_extremes[] = {
    0, 1, -1, 2, -2, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, INT32_MAX,
    (int64_t)INT32_MAX + 1, INT32_MIN, (int64_t)1 << 32, (int64_t)1 << 40, (int64_t)1 << 62,
    (int64_t)1 << 61, ((int64_t)1 << 62) + 1, 4096, 65536, (int64_t)1 << 31};
#define FZ_NEXTREMES (int)(sizeof fz_extremes / sizeof fz_extremes[0])

/* Mostly 0..max; one byte value in 16 picks an extreme (negative and huge included). */
static inline int64_t fz_int(fz *f, int max) {
    uint8_t b = fz_u8(f);
    if (b >= 240) return fz_extremes[(b - 240 + fz_u8(f)) % FZ_NEXTREMES];
    return (int64_t)(b % (unsigned)(max + 1));
}

/* Mostly small signed values around 0. */
static inline int64_t fz_sint(fz *f, int max) {
    uint8_t b = fz_u8(f);
    if (b >= 240) return fz_extremes[(b - 240 + fz_u8(f)) % FZ_NEXTREMES];
    return (int64_t)(b % (unsigned)(2 * max + 1)) - max;
}

/* Small exact values mostly; sometimes NaN, infinities, huge, tiny. */
static inline double fz_double(fz *f) {
    static const double special[] = {NAN, INFINITY, -INFINITY, 1e300, -1e300, 5e-324, 65504.0,
                                      65520.0, 3.4e38, 1e-8, -0.0, 0.1};
    uint8_t b = fz_u8(f);
    if (b >= 244) return special[(b - 244) % (sizeof special / sizeof special[0])];
    return ((double)b - 120.0) * 0.125;
}

#define FZ_CHECK(cond)                                                                     \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "oracle failed: %s (%s:%d); last k3 error: %s\n", #cond,       \
                    __FILE__, __LINE__, k3_last_error());                                  \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* An error status must come with a non-empty message that names something. */
#define FZ_CHECK_ERROR(st)                                                                 \
    do {                                                                                   \
        FZ_CHECK((st) > K3_OK && (st) <= K3_EINTERNAL);                                    \
        FZ_CHECK((st) != K3_EINTERNAL);                                                    \
        FZ_CHECK(k3_last_error()[0] != '\0');                                              \
    } while (0)

#endif
