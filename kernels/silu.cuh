/*
 * silu.cuh — SiLU on the device for the SwiGLU gate: cuda.silu_mul.generic (kernels/norm.cu)
 * and the linear kernels' silu_mul prologue (cuda.linear.skinny, cuda.linear.batch_invariant)
 * share this one definition, the expression and evaluation order of lib/cpu/silu.h, so a fused
 * gate rounds to the bits the separate silu_mul kernel writes. Needs only the CUDA math library.
 */
#ifndef K3_SILU_CUH
#define K3_SILU_CUH

#include <math.h>

/* silu(g) = g / (1 + exp(-g)); at g = -inf that is -inf / inf, NaN, where the limit is 0
 * (reached from below: -0). IEEE division and the accurate expf / exp (no fast-math). */
static __device__ __forceinline__ float k3c_silu(float g) {
    return g == -INFINITY ? -0.0f : g / (1.0f + expf(-g));
}
static __device__ __forceinline__ double k3c_silu(double g) {
    return g == -INFINITY ? -0.0 : g / (1.0 + exp(-g));
}

#endif /* K3_SILU_CUH */
