/*
 * dtype.c — dtype and device names, the bf16/f16 conversions (lib/k3_half.h: round to nearest
 * even, NaN kept, infinities kept) and element access. f64 inputs are rounded once
 * (round-to-odd into f32 first, which is exact for a second rounding to 16 bits), so no value
 * is double-rounded.
 */
#include "k3_half.h"
#include "k3_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[] = {"bf16", "f16", "f32", "f64"};
static const size_t dtype_sizes[] = {2, 2, 4, 8};

const char *k3_dtype_name(k3_dtype d) {
    return (unsigned)d < 4 ? dtype_names[d] : "?";
}

size_t k3_dtype_size(k3_dtype d) { return (unsigned)d < 4 ? dtype_sizes[d] : 0; }

k3_status k3_dtype_parse(const char *name, k3_dtype *out) {
    if (!name) return k3_error(K3_EINVAL, "dtype_parse: name is NULL");
    if (!out) return k3_error(K3_EINVAL, "dtype_parse: out is NULL");
    for (int i = 0; i < 4; i++)
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (k3_dtype)i;
            return K3_OK;
        }
    char e[K3_ECHO_SIZE];
    return k3_error(K3_EDTYPE, "unknown dtype '%s' (expected bf16, f16, f32 or f64)",
                    k3_echo(e, sizeof e, name));
}

k3_status k3_device_parse(const char *text, k3_device *out) {
    if (!text) return k3_error(K3_EINVAL, "device_parse: text is NULL");
    if (!out) return k3_error(K3_EINVAL, "device_parse: out is NULL");
    if (strcmp(text, "cpu") == 0) {
        *out = (k3_device){K3_DEVICE_CPU, 0};
        return K3_OK;
    }
    if (strcmp(text, "cuda") == 0) {
        *out = (k3_device){K3_DEVICE_CUDA, 0};
        return K3_OK;
    }
    if (strncmp(text, "cuda:", 5) == 0 && text[5] >= '0' && text[5] <= '9') {
        char *end;
        long v = strtol(text + 5, &end, 10);
        if (*end == '\0' && v >= 0 && v < 1024) {
            *out = (k3_device){K3_DEVICE_CUDA, (int)v};
            return K3_OK;
        }
    }
    char e[K3_ECHO_SIZE];
    return k3_error(K3_EDEVICE, "unknown device '%s' (expected cpu, cuda or cuda:N)",
                    k3_echo(e, sizeof e, text));
}

const char *k3_device_name(k3_device d, char *buf, size_t n) {
    if (!buf || n == 0) return "";
    if ((int)d.type == K3_DEVICE_CPU && d.index == 0)
        snprintf(buf, n, "cpu");
    else if ((int)d.type == K3_DEVICE_CPU)
        snprintf(buf, n, "cpu:%d", d.index);
    else if ((int)d.type == K3_DEVICE_CUDA)
        snprintf(buf, n, "cuda:%d", d.index);
    else
        snprintf(buf, n, "device type %d", (int)d.type);
    return buf;
}

/* ---- 16-bit conversions (lib/k3_half.h, shared with the CUDA backend) ---------------------- */

static inline uint32_t f32_bits(float f) { return k3h_f32_bits(f); }
static inline float bits_f32(uint32_t u) { return k3h_bits_f32(u); }

uint16_t k3_f32_to_bf16(float x) { return k3h_f32_to_bf16(x); }
float k3_bf16_to_f32(uint16_t x) { return k3h_bf16_to_f32(x); }
uint16_t k3_f32_to_f16(float x) { return k3h_f32_to_f16(x); }
float k3_f16_to_f32(uint16_t x) { return k3h_f16_to_f32(x); }

/* Rounds x to f32 with round-to-odd: truncate toward zero, then set the last bit when
 * inexact. A later round-to-nearest-even to fewer than 22 mantissa bits is then exact.
 * Branch-free on the bits (elementwise ops store through here): a result rounded away from
 * zero (an overflow to infinity included) steps one toward zero, since neighbouring floats
 * of one sign differ by one in their bit patterns. */
static float f64_to_f32_odd(double x) {
    if (isnan(x)) return (float)x;
    float f = (float)x;
    uint32_t u = f32_bits(f);
    u -= (uint32_t)(fabs((double)f) > fabs(x));
    u |= (uint32_t)((double)f != x);
    return bits_f32(u);
}

uint16_t k3_f64_to_bf16(double x) { return k3_f32_to_bf16(f64_to_f32_odd(x)); }
uint16_t k3_f64_to_f16(double x) { return k3_f32_to_f16(f64_to_f32_odd(x)); }

/* v as a double rounded to odd: exact below 2^53; above, the bits past the 53rd are dropped
 * and folded into the last kept bit (set when any was set), so a later round-to-nearest-even
 * to 24 or fewer bits gives what rounding v itself would. */
static double int64_to_f64_odd(int64_t v) {
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    if (u < (1ull << 53)) return (double)v;
    int shift = 64 - __builtin_clzll(u) - 53;
    uint64_t t = (u >> shift) | (uint64_t)((u & ((1ull << shift) - 1)) != 0);
    double d = ldexp((double)t, shift); /* t < 2^53: exact */
    return v < 0 ? -d : d;
}

double k3_int64_to_dtype(int64_t v, k3_dtype dt) {
    switch (dt) {
    case K3_DTYPE_F64: return (double)v; /* one rounding to nearest even */
    case K3_DTYPE_F32: return (float)int64_to_f64_odd(v);
    case K3_DTYPE_BF16: return k3_bf16_to_f32(k3_f64_to_bf16(int64_to_f64_odd(v)));
    case K3_DTYPE_F16: return k3_f16_to_f32(k3_f64_to_f16(int64_to_f64_odd(v)));
    }
    return (double)v;
}

/* ---- element access ------------------------------------------------------------------------ */

double k3_load_f64(const void *base, k3_dtype dt, int64_t i) {
    switch (dt) {
    case K3_DTYPE_BF16: return k3_bf16_to_f32(((const uint16_t *)base)[i]);
    case K3_DTYPE_F16: return k3_f16_to_f32(((const uint16_t *)base)[i]);
    case K3_DTYPE_F32: return ((const float *)base)[i];
    case K3_DTYPE_F64: return ((const double *)base)[i];
    }
    return NAN;
}

float k3_load_f32(const void *base, k3_dtype dt, int64_t i) {
    switch (dt) {
    case K3_DTYPE_BF16: return k3_bf16_to_f32(((const uint16_t *)base)[i]);
    case K3_DTYPE_F16: return k3_f16_to_f32(((const uint16_t *)base)[i]);
    case K3_DTYPE_F32: return ((const float *)base)[i];
    case K3_DTYPE_F64: return (float)((const double *)base)[i];
    }
    return NAN;
}

void k3_store_f64(void *base, k3_dtype dt, int64_t i, double v) {
    switch (dt) {
    case K3_DTYPE_BF16: ((uint16_t *)base)[i] = k3_f64_to_bf16(v); break;
    case K3_DTYPE_F16: ((uint16_t *)base)[i] = k3_f64_to_f16(v); break;
    case K3_DTYPE_F32: ((float *)base)[i] = (float)v; break;
    case K3_DTYPE_F64: ((double *)base)[i] = v; break;
    }
}

void k3_store_f32(void *base, k3_dtype dt, int64_t i, float v) {
    switch (dt) {
    case K3_DTYPE_BF16: ((uint16_t *)base)[i] = k3_f32_to_bf16(v); break;
    case K3_DTYPE_F16: ((uint16_t *)base)[i] = k3_f32_to_f16(v); break;
    case K3_DTYPE_F32: ((float *)base)[i] = v; break;
    case K3_DTYPE_F64: ((double *)base)[i] = v; break;
    }
}

/* bf16 -> f32 is a 16-bit shift. Blocks of 8 with a constant trip count let -O2's
 * straight-line (SLP) vectorizer turn each block into a few SIMD instructions: this loop
 * widens every 16-bit weight cpu.linear.blas streams, and a call per element cost 5 ns. */
static void bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint32_t u[8];
        for (int j = 0; j < 8; j++) u[j] = (uint32_t)src[i + j] << 16;
        memcpy(dst + i, u, sizeof u);
    }
    for (; i < n; i++) dst[i] = bits_f32((uint32_t)src[i] << 16);
}

void k3_convert_to_f32(float *dst, const void *src, k3_dtype dt, int64_t n) {
    switch (dt) {
    case K3_DTYPE_BF16: bf16_to_f32_n(dst, (const uint16_t *)src, n); break;
    case K3_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = k3_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case K3_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case K3_DTYPE_F64:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i];
        break;
    }
}

/* ---- FP8 (OCP 8-bit floating point, v1.0, 2023) -------------------------------------------- */

/* E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities: S.1111.111 (0x7F,
 * 0xFF) is the only NaN, so S.1111.000..110 are finite (the largest 448). Exponent 0 is
 * subnormal: m/8 * 2^-6. */
double k3_f8e4m3_to_f64(uint8_t v) {
    int e = (v >> 3) & 0xF, m = v & 0x7;
    double mag;
    if (e == 0xF && m == 0x7) mag = NAN;
    else if (e == 0) mag = ldexp((double)m, -9);
    else mag = ldexp((double)(8 + m), e - 10);
    return (v & 0x80) ? -mag : mag;
}

/* E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-754-like: exponent 31 is
 * infinity (m = 0) or NaN (m != 0); exponent 0 is subnormal: m/4 * 2^-14. */
double k3_f8e5m2_to_f64(uint8_t v) {
    int e = (v >> 2) & 0x1F, m = v & 0x3;
    double mag;
    if (e == 0x1F) mag = m ? NAN : INFINITY;
    else if (e == 0) mag = ldexp((double)m, -16);
    else mag = ldexp((double)(4 + m), e - 17);
    return (v & 0x80) ? -mag : mag;
}
