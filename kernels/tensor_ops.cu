/*
 * tensor_ops.cu — cuda.{abs,exp,sqrt}.generic (one grid-stride kernel, templated over dtype and
 * the function) and cuda.{sum,mean,max,min}.generic (one CTA per output, templated over dtype
 * and the reduction), for any strides, zero strides included. Arithmetic in fp32 (fp64 for
 * f64), in the order of lib/cpu/elementwise.c and lib/cpu/reduce.c (K3_REDUCE_LANES, k3.h),
 * so both backends give the same bits for abs, sqrt, sum, mean, max and min.
 */
#include "common.cuh"

namespace {

const int kThreads = 256;     /* the reduction's CTA: one thread per lane of K3_REDUCE_LANES */
const int kUnroll = 8;        /* loads in flight per thread of a reduction */
static_assert(kThreads == K3_REDUCE_LANES, "one thread per lane of the fixed summation order");

/* ---- elementwise ------------------------------------------------------------------------ */

__device__ __forceinline__ float abs_(float v) { return fabsf(v); }
__device__ __forceinline__ double abs_(double v) { return fabs(v); }
__device__ __forceinline__ float exp_(float v) { return expf(v); }
__device__ __forceinline__ double exp_(double v) { return exp(v); }
__device__ __forceinline__ float sqrt_(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_(double v) { return sqrt(v); }

struct abs_fn {
    template <class A> __device__ A operator()(A v) const { return abs_(v); }
};
struct exp_fn {
    template <class A> __device__ A operator()(A v) const { return exp_(v); }
};
struct sqrt_fn {
    template <class A> __device__ A operator()(A v) const { return sqrt_(v); }
};

template <class T, class F>
__global__ void unary_kernel(T *__restrict__ y, const T *__restrict__ x, F f, k3c_walk w,
                             int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        k3c_walk_offsets<2>(w, i, off);
        y[off[0]] = k3c_store_acc<T>(f(k3c_load_acc<T>(x[off[1]])));
    }
}

template <class F> k3_status launch_unary(const k3_unary_args *a, F f) {
    int64_t n = k3_tensor_numel(a->x);
    if (n == 0) return K3_OK;
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->x), &ctx));
    k3c_walk w;
    const int64_t *strides[2] = {a->out->stride, a->x->stride};
    k3c_walk_init(&w, a->x->ndim, a->x->size, 2, strides);
    unsigned blocks = k3c_blocks_for(n, kThreads);
    K3C_DISPATCH_DTYPE(a->x->dtype, T, {
        unary_kernel<T, F><<<blocks, kThreads, 0, ctx->stream>>>(
            (T *)k3_tensor_ptr(a->out), (const T *)k3_tensor_ptr(a->x), f, w, n);
        K3_CHECK_LAUNCH(unary_kernel);
    });
    return K3_OK;
}

k3_status supports(const k3_op_args *, char *, size_t) { return K3_OK; }

k3_status run_unary(const k3_op_args *oa) {
    const k3_unary_args *a = &oa->u.abs;
    switch (oa->op) {
    case K3_OP_ABS: return launch_unary(a, abs_fn());
    case K3_OP_EXP: return launch_unary(a, exp_fn());
    case K3_OP_SQRT: return launch_unary(a, sqrt_fn());
    default: return k3_error(K3_EINTERNAL, "tensor_ops: op %d is not elementwise", (int)oa->op);
    }
}

/* ---- reductions ----------------------------------------------------------------------------- */

/* Offsets of output o in x, out and indices (k3_reduce_plan's outer dims). */
__device__ __forceinline__ void outer_offsets(const k3_reduce_plan &p, int64_t o, int64_t *xo,
                                              int64_t *oo, int64_t *io) {
    *xo = *oo = *io = 0;
    for (int d = p.outer_ndim - 1; d >= 0; d--) {
        int64_t q = o / p.outer_size[d], r = o - q * p.outer_size[d];
        *xo += r * p.outer_xstride[d];
        *oo += r * p.outer_ostride[d];
        *io += r * p.outer_istride[d];
        o = q;
    }
}

/* Offset in x of the j-th reduced element (row-major over the inner dims). */
__device__ __forceinline__ int64_t inner_offset(const k3_reduce_plan &p, int64_t j) {
    if (p.inner_ndim <= 1) return p.inner_ndim ? j * p.inner_xstride[0] : 0;
    int64_t off = 0;
    for (int d = p.inner_ndim - 1; d >= 0; d--) {
        int64_t q = j / p.inner_size[d];
        off += (j - q * p.inner_size[d]) * p.inner_xstride[d];
        j = q;
    }
    return off;
}

/* Lane t (this thread) adds elements t, t + 256, ... in order; kUnroll loads are issued before
 * their adds, which keeps the order while keeping loads in flight. The lanes are then combined
 * by a butterfly in each warp and the warps' results in order (k3.h, K3_REDUCE_LANES). */
template <class T, bool Mean>
__global__ void __launch_bounds__(kThreads)
    sum_kernel(const T *__restrict__ x, T *__restrict__ out, k3_reduce_plan p) {
    typedef typename k3c_acc<T>::type A;
    __shared__ A part[kThreads / 32];
    for (int64_t o = blockIdx.x; o < p.outer_n; o += gridDim.x) {
        int64_t xo, oo, io;
        outer_offsets(p, o, &xo, &oo, &io);
        A v = 0;
        int64_t j = threadIdx.x;
        for (; j + (kUnroll - 1) * kThreads < p.inner_n; j += kUnroll * kThreads) {
            A t[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
                t[u] = k3c_load_acc<T>(x[xo + inner_offset(p, j + u * kThreads)]);
#pragma unroll
            for (int u = 0; u < kUnroll; u++) v += t[u];
        }
        for (; j < p.inner_n; j += kThreads) v += k3c_load_acc<T>(x[xo + inner_offset(p, j)]);
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
        __syncthreads();
        if (threadIdx.x == 0) {
            A tot = 0;
            for (int q = 0; q < kThreads / 32; q++) tot += part[q];
            /* The mean of no elements is the positive quiet NaN, as on the CPU. */
            A r = !Mean ? tot : p.inner_n ? tot / (A)p.inner_n : (A)NAN;
            out[oo] = k3c_store_acc<T>(r);
        }
        __syncthreads(); /* part is reused by the next output */
    }
}

/* A candidate of max / min: a value and its position (-1: none yet). */
template <class A> struct best_t {
    A v;
    int64_t i;
};

/* The first NaN wins; else the larger (smaller) value; among equal values the first position.
 * Associative and commutative, so the result does not depend on the visiting order. */
template <class A, bool Max> __device__ __forceinline__ best_t<A> pick(best_t<A> a, best_t<A> b) {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    bool an = isnan(a.v), bn = isnan(b.v);
    if (an || bn) return an && bn ? (b.i < a.i ? b : a) : (an ? a : b);
    if (Max ? b.v > a.v : b.v < a.v) return b;
    return b.v == a.v && b.i < a.i ? b : a;
}

template <class T, bool Max>
__global__ void __launch_bounds__(kThreads)
    max_min_kernel(const T *__restrict__ x, T *__restrict__ out, double *__restrict__ indices,
                   double index_base, k3_reduce_plan p) {
    typedef typename k3c_acc<T>::type A;
    __shared__ A part_v[kThreads / 32];
    __shared__ int64_t part_i[kThreads / 32];
    for (int64_t o = blockIdx.x; o < p.outer_n; o += gridDim.x) {
        int64_t xo, oo, io;
        outer_offsets(p, o, &xo, &oo, &io);
        best_t<A> b = {0, -1};
        for (int64_t j = threadIdx.x; j < p.inner_n; j += kThreads)
            b = pick<A, Max>(b, best_t<A>{k3c_load_acc<T>(x[xo + inner_offset(p, j)]), j});
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) {
            best_t<A> c = {__shfl_xor_sync(0xffffffffu, b.v, s),
                           (int64_t)__shfl_xor_sync(0xffffffffu, (long long)b.i, s)};
            b = pick<A, Max>(b, c);
        }
        if ((threadIdx.x & 31) == 0) {
            part_v[threadIdx.x >> 5] = b.v;
            part_i[threadIdx.x >> 5] = b.i;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            best_t<A> r = {part_v[0], part_i[0]};
            for (int q = 1; q < kThreads / 32; q++)
                r = pick<A, Max>(r, best_t<A>{part_v[q], part_i[q]});
            out[oo] = k3c_store_acc<T>(r.v);
            if (indices) indices[io] = (double)r.i + index_base;
        }
        __syncthreads();
    }
}

k3_status run_reduce(const k3_op_args *oa) {
    const k3_reduce_args *a = &oa->u.sum;
    k3_reduce_plan p;
    k3_reduce_plan_init(&p, a);
    if (p.outer_n == 0) return K3_OK;
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->x), &ctx));
    unsigned grid = (unsigned)(p.outer_n < (1 << 20) ? p.outer_n : (1 << 20));
    double *ind = a->indices ? (double *)k3_tensor_ptr(a->indices) : nullptr;
    K3C_DISPATCH_DTYPE(a->x->dtype, T, {
        const T *x = (const T *)k3_tensor_ptr(a->x);
        T *out = (T *)k3_tensor_ptr(a->out);
        switch (oa->op) {
        case K3_OP_SUM: sum_kernel<T, false><<<grid, kThreads, 0, ctx->stream>>>(x, out, p); break;
        case K3_OP_MEAN: sum_kernel<T, true><<<grid, kThreads, 0, ctx->stream>>>(x, out, p); break;
        case K3_OP_MAX:
            max_min_kernel<T, true><<<grid, kThreads, 0, ctx->stream>>>(x, out, ind,
                                                                        a->index_base, p);
            break;
        case K3_OP_MIN:
            max_min_kernel<T, false><<<grid, kThreads, 0, ctx->stream>>>(x, out, ind,
                                                                         a->index_base, p);
            break;
        default: return k3_error(K3_EINTERNAL, "tensor_ops: op %d is no reduction", (int)oa->op);
        }
        K3_CHECK_LAUNCH(reduce_kernel);
    });
    return K3_OK;
}

} // namespace

extern "C" const k3_kernel k3_cuda_abs_generic = K3_KERNEL_RECORD(k3_cuda_abs_generic, supports, run_unary);
extern "C" const k3_kernel k3_cuda_exp_generic = K3_KERNEL_RECORD(k3_cuda_exp_generic, supports, run_unary);
extern "C" const k3_kernel k3_cuda_sqrt_generic =
    K3_KERNEL_RECORD(k3_cuda_sqrt_generic, supports, run_unary);
extern "C" const k3_kernel k3_cuda_sum_generic = K3_KERNEL_RECORD(k3_cuda_sum_generic, supports, run_reduce);
extern "C" const k3_kernel k3_cuda_mean_generic =
    K3_KERNEL_RECORD(k3_cuda_mean_generic, supports, run_reduce);
extern "C" const k3_kernel k3_cuda_max_generic = K3_KERNEL_RECORD(k3_cuda_max_generic, supports, run_reduce);
extern "C" const k3_kernel k3_cuda_min_generic = K3_KERNEL_RECORD(k3_cuda_min_generic, supports, run_reduce);
