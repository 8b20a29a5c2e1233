/*
 * cpu_rms.h — the RMS scale of one row, 1 / sqrt(mean(v^2) + eps), for the CPU kernels that
 * normalise rows (rms_norm, attn_res's key and output norms), kept scale-invariant where the
 * plain sum of squares overflows or underflows.
 */
#ifndef K3_CPU_RMS_H
#define K3_CPU_RMS_H

#include <float.h>
#include <math.h>
#include <stdint.h>

/* NAME(v, n, eps, &e) -> r, for a row v[0..n): the caller normalises v[d] as
 * ldexp(v[d], e) * r (e is 0, and r = 1 / sqrt(sum(v^2) / n + eps) exactly as written, on
 * every ordinary row). One pass accumulates the sum of squares and max |v| together; only
 * when the sum is not finite (|v| above ~1e19 in f32) or falls below the smallest normal
 * (tiny v, where eps = 0 gave inf) while max |v| is a finite m > 0 does a second pass sum the
 * row scaled by 2^-k, m = f * 2^k (frexp: exact, |v| * 2^-k < 1), and
 * r = 1 / sqrt(sum((v 2^-k)^2) / n + eps 2^-2k) with e = -k, since RMSNorm
 * v / sqrt(mean(v^2) + eps) equals z / sqrt(mean(z^2) + eps / s^2) for z = v / s. When
 * eps 2^-2k overflows, eps outweighs the row's squares entirely and r = 1 / sqrt(eps), e = 0.
 * A NaN in v keeps the sum NaN (max |v| skips it), so the row stays NaN; an infinite v is not
 * rescaled (inf / inf has no value to keep). fp32 arithmetic for float, fp64 for double. */
#define K3_DEFINE_RMS_SCALE(NAME, T, SQRT, FREXP, LDEXP, FABS, MIN_NORMAL)                 \
    static inline T NAME(const T *v, int64_t n, T eps, int *e) {                           \
        T ss = 0, m = 0;                                                                   \
        for (int64_t d = 0; d < n; d++) {                                                  \
            ss += v[d] * v[d];                                                             \
            T a = FABS(v[d]);                                                              \
            if (a > m) m = a;                                                              \
        }                                                                                  \
        *e = 0;                                                                            \
        if (!(m > 0 && isfinite(m)) || (ss >= MIN_NORMAL && isfinite(ss)))                 \
            return (T)1 / SQRT(ss / (T)n + eps);                                           \
        int k;                                                                             \
        FREXP(m, &k);                                                                      \
        T sz = 0;                                                                          \
        for (int64_t d = 0; d < n; d++) {                                                  \
            T z = LDEXP(v[d], -k);                                                         \
            sz += z * z;                                                                   \
        }                                                                                  \
        T te = LDEXP(eps, -2 * k);                                                         \
        if (!isfinite(te)) return (T)1 / SQRT(eps);                                        \
        *e = -k;                                                                           \
        return (T)1 / SQRT(sz / (T)n + te);                                                \
    }

K3_DEFINE_RMS_SCALE(k3_rms_scale_f32, float, sqrtf, frexpf, ldexpf, fabsf, FLT_MIN)
K3_DEFINE_RMS_SCALE(k3_rms_scale_f64, double, sqrt, frexp, ldexp, fabs, DBL_MIN)

#endif /* K3_CPU_RMS_H */
