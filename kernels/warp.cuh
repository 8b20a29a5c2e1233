/*
 * warp.cuh — sum and max over the 32 lanes of a warp, for f32 or f64: the xor butterfly
 * (offsets 16, 8, 4, 2, 1), so every lane ends with the same value, summed in the same order on
 * every call. The order is part of several kernels' contracts (cuda.rms_norm.generic's sums,
 * which the linear's rms_norm prologue reproduces bit for bit), so every kernel uses these two.
 */
#ifndef K3_WARP_CUH
#define K3_WARP_CUH

template <class A> __device__ __forceinline__ A k3c_warp_sum(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* fmax returns the other operand for a NaN, so a NaN never becomes the max. */
template <class A> __device__ __forceinline__ A k3c_warp_max(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif /* K3_WARP_CUH */
