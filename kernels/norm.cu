/*
 * norm.cu — cuda.rms_norm.generic and cuda.silu_mul.generic: row-wise kernels for any row
 * strides with unit last stride, bf16/f16/f32/f64 (weights of any dtype), fp32 arithmetic
 * (fp64 for f64) in the expression order of lib/cpu/norm.c (the row scale of lib/cpu/rms.h),
 * rounded once. Both launch with programmatic dependent launch (common.cuh).
 */
#include "common.cuh"
#include "silu.cuh"

#include <stdio.h>

namespace {

const int kThreads = 256;

template <class A> __device__ __forceinline__ A min_normal();
template <> __device__ __forceinline__ float min_normal<float>() { return 0x1p-126f; }
template <> __device__ __forceinline__ double min_normal<double>() { return 0x1p-1022; }
template <class A> __device__ __forceinline__ A load_w(const void *p, int dt, int64_t i);
template <> __device__ __forceinline__ float load_w<float>(const void *p, int dt, int64_t i) {
    return k3c_load_any_f32(p, dt, i);
}
template <> __device__ __forceinline__ double load_w<double>(const void *p, int dt, int64_t i) {
    return k3c_load_any_f64(p, dt, i);
}
__device__ __forceinline__ float rsqrt_exact(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double rsqrt_exact(double x) { return 1.0 / sqrt(x); }

/* One CTA per row (grid-stride over rows). The row scale follows lib/cpu/rms.h: the sum of
 * squares and max |x| are reduced together; a row whose sum is not finite or below the
 * smallest normal while max |x| = m is finite and > 0 is summed again scaled by 2^-k
 * (m = f * 2^k, exact), r = 1 / sqrt(sum / H + eps 2^-2k) and y = (x 2^-k) * r * w, so
 * RMSNorm stays scale-invariant for |x| above ~1e19 and for tiny x with eps = 0; when
 * eps 2^-2k overflows, r = 1 / sqrt(eps). The test is the same for every thread of the CTA.
 *
 * Thread t sums elements t, t + 256, t + 512, ... in that order, then the warp butterfly, then
 * the warps in order (the order the linear's in-kernel prologue reproduces, linear_skinny.cuh).
 * C > 0 (H <= 256 C): each thread's C elements of x and of w are loaded into registers at once
 * after the PDL wait and the row is read from there, so the kernel's chain after the wait is one
 * load latency, the reduction and the store, where the loop form (C = 0, any H) waits on each
 * element's load in turn and reads x twice: in a decode step's graph that chain cost ~5 µs a
 * call at H = 1536 (scripts/step-trace, notes/PERF.md). Same sums in the same order either way:
 * the same bits. */
template <class T, int C>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const T *__restrict__ x, int64_t xs, const void *__restrict__ w, int wdt,
                    T *__restrict__ y, int64_t ys, int64_t M, int64_t H, double eps,
                    int64_t wbytes) {
    typedef typename k3c_acc<T>::type A;
    constexpr int CR = C > 0 ? C : 1;
    __shared__ A part[kThreads / 32], part_max[kThreads / 32];
    const int nwarps = (int)(blockDim.x >> 5);
    k3c_pdl_launch_dependents();
    /* wbytes (w's size, 0 without K3_PDL_L2_PREFETCH): w into L2 while the previous kernel
     * drains (a weight read once a step is likely in DRAM by now; x was just written and is in
     * L2), its 128-byte lines spread over the grid's threads, each asked for once */
    const uintptr_t wline = (uintptr_t)w & ~(uintptr_t)127;
    const int64_t nlines = ((int64_t)((uintptr_t)w - wline) + wbytes + 127) / 128;
    for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; wbytes > 0 && l < nlines;
         l += (int64_t)gridDim.x * blockDim.x)
        k3c_prefetch_l2(l == 0 ? w : (const void *)(wline + (uintptr_t)l * 128)); /* in w */
    k3c_pdl_wait();
    for (int64_t i = blockIdx.x; i < M; i += gridDim.x) {
        const T *xr = x + i * xs;
        A ss = 0, mx = 0;
        A v[CR], wv[CR];
        if constexpr (C > 0) {
#pragma unroll
            for (int j = 0; j < C; j++) {
                const int64_t d = threadIdx.x + (int64_t)j * blockDim.x;
                v[j] = d < H ? k3c_load_acc<T>(xr[d]) : (A)0;
                wv[j] = d < H ? load_w<A>(w, wdt, d) : (A)0;
            }
#pragma unroll
            for (int j = 0; j < C; j++) {
                if (threadIdx.x + (int64_t)j * blockDim.x < H) {
                    ss += v[j] * v[j];
                    mx = fmax(mx, fabs(v[j]));
                }
            }
        } else {
            for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
                A u = k3c_load_acc<T>(xr[d]);
                ss += u * u;
                mx = fmax(mx, fabs(u));
            }
        }
        ss = k3c_warp_sum(ss);
        mx = k3c_warp_max(mx);
        if ((threadIdx.x & 31) == 0) {
            part[threadIdx.x >> 5] = ss;
            part_max[threadIdx.x >> 5] = mx;
        }
        __syncthreads();
        A tot = 0, m = 0;
        for (int q = 0; q < nwarps; q++) {
            tot += part[q];
            m = fmax(m, part_max[q]);
        }
        int e = 0;
        A r;
        if (!(m > 0 && isfinite(m)) || (tot >= min_normal<A>() && isfinite(tot))) {
            r = rsqrt_exact(tot / (A)H + (A)eps);
        } else {
            int k;
            frexp(m, &k);
            __syncthreads(); /* every thread has read part */
            A sz = 0;
            if constexpr (C > 0) {
#pragma unroll
                for (int j = 0; j < C; j++) {
                    if (threadIdx.x + (int64_t)j * blockDim.x < H) {
                        A z = ldexp(v[j], -k);
                        sz += z * z;
                    }
                }
            } else {
                for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
                    A z = ldexp(k3c_load_acc<T>(xr[d]), -k);
                    sz += z * z;
                }
            }
            sz = k3c_warp_sum(sz);
            if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = sz;
            __syncthreads();
            A szt = 0;
            for (int q = 0; q < nwarps; q++) szt += part[q];
            A te = ldexp((A)eps, -2 * k);
            if (isfinite(te)) {
                e = -k;
                r = rsqrt_exact(szt / (A)H + te);
            } else {
                r = rsqrt_exact((A)eps);
            }
        }
        T *yr = y + i * ys;
        if constexpr (C > 0) {
#pragma unroll
            for (int j = 0; j < C; j++) {
                const int64_t d = threadIdx.x + (int64_t)j * blockDim.x;
                if (d < H) {
                    A u = v[j];
                    if (e) u = ldexp(u, e);
                    yr[d] = k3c_store_acc<T>(u * r * wv[j]);
                }
            }
        } else {
            for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
                A u = k3c_load_acc<T>(xr[d]);
                if (e) u = ldexp(u, e);
                yr[d] = k3c_store_acc<T>(u * r * load_w<A>(w, wdt, d));
            }
        }
        __syncthreads(); /* part is reused by the next row */
    }
}

template <class T>
__global__ void silu_mul_kernel(const T *__restrict__ x, int64_t xs, T *__restrict__ y, int64_t ys,
                                int64_t M, int64_t I) {
    typedef typename k3c_acc<T>::type A;
    int64_t n = M * I;
    k3c_pdl_launch_dependents();
    k3c_pdl_wait();
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = k / I, j = k - i * I;
        A g = k3c_load_acc<T>(x[i * xs + j]);
        A u = k3c_load_acc<T>(x[i * xs + I + j]);
        y[i * ys + j] = k3c_store_acc<T>(k3c_silu(g) * u);
    }
}

k3_status supports(const k3_op_args *, char *, size_t) { return K3_OK; }

k3_status run_rms_norm(const k3_op_args *oa) {
    const k3_rms_norm_args *a = &oa->u.rms_norm;
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->x), &ctx));
    int64_t M = a->x->size[0], H = a->x->size[1];
    if (M == 0 || H == 0) return K3_OK;
    unsigned grid = (unsigned)(M < (1 << 20) ? M : (1 << 20));
    /* the row in registers (C values a thread) up to H = 8192, the loop form above */
    const int C = H <= 8 * kThreads ? 8 : H <= 32 * kThreads ? 32 : 0;
    K3C_DISPATCH_DTYPE(a->x->dtype, T, {
        void (*kern)(const T *, int64_t, const void *, int, T *, int64_t, int64_t, int64_t,
                     double, int64_t) = C == 8    ? rms_norm_kernel<T, 8>
                               : C == 32 ? rms_norm_kernel<T, 32>
                                         : rms_norm_kernel<T, 0>;
        K3_TRY(k3c_launch_pdl("launch of rms_norm_kernel", kern, dim3(grid), dim3(kThreads), 0,
                              ctx->stream, (const T *)k3_tensor_ptr(a->x), a->x->stride[0],
                              (const void *)k3_tensor_ptr(a->w), (int)a->w->dtype,
                              (T *)k3_tensor_ptr(a->out), a->out->stride[0], M, H, a->eps,
                              k3c_pdl_l2_prefetch() ? H * (int64_t)k3_dtype_size(a->w->dtype) : 0));
    });
    return K3_OK;
}

k3_status run_silu_mul(const k3_op_args *oa) {
    const k3_silu_mul_args *a = &oa->u.silu_mul;
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->x), &ctx));
    int64_t M = a->x->size[0], I = a->x->size[1] / 2;
    if (M == 0 || I == 0) return K3_OK;
    unsigned grid = k3c_blocks_for(M * I, kThreads);
    K3C_DISPATCH_DTYPE(a->x->dtype, T, {
        K3_TRY(k3c_launch_pdl("launch of silu_mul_kernel", silu_mul_kernel<T>, dim3(grid),
                              dim3(kThreads), 0, ctx->stream, (const T *)k3_tensor_ptr(a->x),
                              a->x->stride[0], (T *)k3_tensor_ptr(a->out), a->out->stride[0], M,
                              I));
    });
    return K3_OK;
}

} // namespace

extern "C" const k3_kernel k3_cuda_rms_norm_generic =
    K3_KERNEL_RECORD(k3_cuda_rms_norm_generic, supports, run_rms_norm);
extern "C" const k3_kernel k3_cuda_silu_mul_generic =
    K3_KERNEL_RECORD(k3_cuda_silu_mul_generic, supports, run_silu_mul);
