/*
 * k3_half.h — the bf16 and f16 conversions, one definition for the core (cc: lib/dtype.c) and
 * the CUDA backend (nvcc: kernels/common.cuh, host and device code), so the device rounds and
 * treats NaN exactly as the CPU does: round to nearest even, NaN kept (quietened), infinities
 * kept, overflow to infinity as IEEE 754 prescribes. Internal (not installed).
 */
#ifndef K3_HALF_H
#define K3_HALF_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define K3H_FN static __host__ __device__ __forceinline__
#else
#define K3H_FN static inline
#endif

/* The bits of a float and back. */
K3H_FN uint32_t k3h_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
K3H_FN float k3h_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

K3H_FN uint16_t k3h_f32_to_bf16(float x) {
    uint32_t u = k3h_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

K3H_FN float k3h_bf16_to_f32(uint16_t x) { return k3h_bits_f32((uint32_t)x << 16); }

K3H_FN uint16_t k3h_f32_to_f16(float x) {
    uint32_t u = k3h_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to infinity */
    if (a < 0x38800000u) {                       /* below 2^-14: f16 subnormal or zero */
        int e = (int)(a >> 23);
        if (e < 102) return sign; /* < 2^-25: rounds to zero */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - e;
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

K3H_FN float k3h_f16_to_f32(uint16_t x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
    if (e == 0x1f) return k3h_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return k3h_bits_f32(sign);
        float v = (float)m * 0x1p-24f; /* exact */
        return sign ? -v : v;
    }
    return k3h_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif /* K3_HALF_H */
