/*
 * tensor_ops.cu — cuda.{abs,exp,sqrt}.generic (one grid-stride kernel, templated over dtype and
 * the function) and cuda.{sum,mean,max,min}.generic (one CTA per lane group of each output,
 * templated over dtype and the reduction), for any strides, zero strides included. Arithmetic
 * in fp32 (fp64 for f64), in the order of lib/cpu/elementwise.c and lib/cpu/reduce.c
 * (K3_REDUCE_LANES, k3.h), so both backends give the same bits for abs, sqrt, sum, mean, max
 * and min.
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
    K3_TRY(k3_op_recheck(oa, K3_DEVICE_CUDA, "generic"));
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

/* CTA b reduces lane group c = b mod chunks of output o = b / chunks. Lane l = 256 c + t
 * (this thread) adds elements l, l + 256 chunks, ... in order; kUnroll loads are issued before
 * their adds, which keeps the order while keeping loads in flight. The CTA's 256 lanes are then
 * combined by a butterfly in each warp and the warps' results in order (k3.h, K3_REDUCE_LANES);
 * with one group that is the output, else the group's result goes to partial[b] and
 * sum_finish_kernel adds the groups in order. */
template <class T, bool Mean>
__global__ void __launch_bounds__(kThreads)
    sum_kernel(const T *__restrict__ x, T *__restrict__ out,
               typename k3c_acc<T>::type *__restrict__ partial, k3_reduce_plan p) {
    typedef typename k3c_acc<T>::type A;
    __shared__ A part[kThreads / 32];
    const int64_t step = kThreads * p.chunks;
    for (int64_t b = blockIdx.x; b < p.outer_n * p.chunks; b += gridDim.x) {
        int64_t o = b / p.chunks, c = b - o * p.chunks;
        int64_t xo, oo, io;
        outer_offsets(p, o, &xo, &oo, &io);
        A v = 0;
        int64_t j = c * kThreads + threadIdx.x;
        for (; j + (kUnroll - 1) * step < p.inner_n; j += kUnroll * step) {
            A t[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
                t[u] = k3c_load_acc<T>(x[xo + inner_offset(p, j + u * step)]);
#pragma unroll
            for (int u = 0; u < kUnroll; u++) v += t[u];
        }
        for (; j < p.inner_n; j += step) v += k3c_load_acc<T>(x[xo + inner_offset(p, j)]);
        v = k3c_warp_sum(v);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
        __syncthreads();
        if (threadIdx.x == 0) {
            A tot = 0;
            for (int q = 0; q < kThreads / 32; q++) tot += part[q];
            if (p.chunks > 1) {
                partial[b] = tot;
            } else {
                /* The mean of no elements is the positive quiet NaN, as on the CPU. */
                A r = !Mean ? tot : p.inner_n ? tot / (A)p.inner_n : (A)NAN;
                out[oo] = k3c_store_acc<T>(r);
            }
        }
        __syncthreads(); /* part is reused by the next output */
    }
}

/* The groups' results of each output added in order, from 0 (one thread per output). */
template <class T, bool Mean>
__global__ void sum_finish_kernel(const typename k3c_acc<T>::type *__restrict__ partial,
                                  T *__restrict__ out, k3_reduce_plan p) {
    typedef typename k3c_acc<T>::type A;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < p.outer_n;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t xo, oo, io;
        outer_offsets(p, o, &xo, &oo, &io);
        A tot = 0;
        for (int64_t c = 0; c < p.chunks; c++) tot += partial[o * p.chunks + c];
        out[oo] = k3c_store_acc<T>(Mean ? tot / (A)p.inner_n : tot);
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

/* The result of output o (its offsets oo, io): the value, and the position plus index_base. */
template <class T, class A>
__device__ __forceinline__ void put_best(T *out, double *indices, double index_base, int64_t oo,
                                         int64_t io, best_t<A> r) {
    out[oo] = k3c_store_acc<T>(r.v);
    if (indices) indices[io] = (double)r.i + index_base;
}

/* The lane groups of sum_kernel, visited in any order (pick does not depend on it). */
template <class T, bool Max>
__global__ void __launch_bounds__(kThreads)
    max_min_kernel(const T *__restrict__ x, T *__restrict__ out, double *__restrict__ indices,
                   double index_base, best_t<typename k3c_acc<T>::type> *__restrict__ partial,
                   k3_reduce_plan p) {
    typedef typename k3c_acc<T>::type A;
    __shared__ A part_v[kThreads / 32];
    __shared__ int64_t part_i[kThreads / 32];
    const int64_t step = kThreads * p.chunks;
    for (int64_t b = blockIdx.x; b < p.outer_n * p.chunks; b += gridDim.x) {
        int64_t o = b / p.chunks, c = b - o * p.chunks;
        int64_t xo, oo, io;
        outer_offsets(p, o, &xo, &oo, &io);
        best_t<A> r = {0, -1};
        for (int64_t j = c * kThreads + threadIdx.x; j < p.inner_n; j += step)
            r = pick<A, Max>(r, best_t<A>{k3c_load_acc<T>(x[xo + inner_offset(p, j)]), j});
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) {
            best_t<A> q = {__shfl_xor_sync(0xffffffffu, r.v, s),
                           (int64_t)__shfl_xor_sync(0xffffffffu, (long long)r.i, s)};
            r = pick<A, Max>(r, q);
        }
        if ((threadIdx.x & 31) == 0) {
            part_v[threadIdx.x >> 5] = r.v;
            part_i[threadIdx.x >> 5] = r.i;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            best_t<A> t = {part_v[0], part_i[0]};
            for (int q = 1; q < kThreads / 32; q++)
                t = pick<A, Max>(t, best_t<A>{part_v[q], part_i[q]});
            if (p.chunks > 1) partial[b] = t;
            else put_best<T, A>(out, indices, index_base, oo, io, t);
        }
        __syncthreads();
    }
}

template <class T, bool Max>
__global__ void max_min_finish_kernel(const best_t<typename k3c_acc<T>::type> *__restrict__ partial,
                                      T *__restrict__ out, double *__restrict__ indices,
                                      double index_base, k3_reduce_plan p) {
    typedef typename k3c_acc<T>::type A;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < p.outer_n;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t xo, oo, io;
        outer_offsets(p, o, &xo, &oo, &io);
        best_t<A> r = partial[o * p.chunks];
        for (int64_t c = 1; c < p.chunks; c++) r = pick<A, Max>(r, partial[o * p.chunks + c]);
        put_best<T, A>(out, indices, index_base, oo, io, r);
    }
}

template <class T, bool Mean>
k3_status launch_sum(const k3_reduce_args *a, const k3_reduce_plan &p, unsigned grid,
                     k3c_ctx *ctx) {
    typedef typename k3c_acc<T>::type A;
    const T *x = (const T *)k3_tensor_ptr(a->x);
    T *out = (T *)k3_tensor_ptr(a->out);
    k3c_buffer partial;
    if (p.chunks > 1)
        K3_TRY(partial.alloc(ctx->dev, (size_t)(p.outer_n * p.chunks) * sizeof(A)));
    sum_kernel<T, Mean><<<grid, kThreads, 0, ctx->stream>>>(x, out, (A *)partial.ptr, p);
    K3_CHECK_LAUNCH(sum_kernel);
    if (p.chunks > 1) {
        sum_finish_kernel<T, Mean><<<k3c_blocks_for(p.outer_n, kThreads), kThreads, 0,
                                     ctx->stream>>>((const A *)partial.ptr, out, p);
        K3_CHECK_LAUNCH(sum_finish_kernel);
    }
    return K3_OK;
}

template <class T, bool Max>
k3_status launch_max_min(const k3_reduce_args *a, const k3_reduce_plan &p, unsigned grid,
                         k3c_ctx *ctx) {
    typedef best_t<typename k3c_acc<T>::type> B;
    const T *x = (const T *)k3_tensor_ptr(a->x);
    T *out = (T *)k3_tensor_ptr(a->out);
    double *ind = a->indices ? (double *)k3_tensor_ptr(a->indices) : nullptr;
    k3c_buffer partial;
    if (p.chunks > 1)
        K3_TRY(partial.alloc(ctx->dev, (size_t)(p.outer_n * p.chunks) * sizeof(B)));
    max_min_kernel<T, Max><<<grid, kThreads, 0, ctx->stream>>>(x, out, ind, a->index_base,
                                                               (B *)partial.ptr, p);
    K3_CHECK_LAUNCH(max_min_kernel);
    if (p.chunks > 1) {
        max_min_finish_kernel<T, Max><<<k3c_blocks_for(p.outer_n, kThreads), kThreads, 0,
                                        ctx->stream>>>((const B *)partial.ptr, out, ind,
                                                       a->index_base, p);
        K3_CHECK_LAUNCH(max_min_finish_kernel);
    }
    return K3_OK;
}

k3_status run_reduce(const k3_op_args *oa) {
    const k3_reduce_args *a = &oa->u.sum;
    K3_TRY(k3_op_recheck(oa, K3_DEVICE_CUDA, "generic"));
    k3_reduce_plan p;
    k3_reduce_plan_init(&p, a);
    if (p.outer_n == 0) return K3_OK;
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->x), &ctx));
    int64_t ctas = p.outer_n * p.chunks;
    unsigned grid = (unsigned)(ctas < (1 << 20) ? ctas : (1 << 20));
    K3C_DISPATCH_DTYPE(a->x->dtype, T, {
        switch (oa->op) {
        case K3_OP_SUM: return launch_sum<T, false>(a, p, grid, ctx);
        case K3_OP_MEAN: return launch_sum<T, true>(a, p, grid, ctx);
        case K3_OP_MAX: return launch_max_min<T, true>(a, p, grid, ctx);
        case K3_OP_MIN: return launch_max_min<T, false>(a, p, grid, ctx);
        default: break;
        }
    });
    return k3_error(K3_EINTERNAL, "tensor_ops: op %d is no reduction", (int)oa->op);
}

} // namespace

extern "C" const k3_kernel k3_cuda_abs_generic =
    K3_KERNEL_RECORD(k3_cuda_abs_generic, supports, run_unary);
extern "C" const k3_kernel k3_cuda_exp_generic =
    K3_KERNEL_RECORD(k3_cuda_exp_generic, supports, run_unary);
extern "C" const k3_kernel k3_cuda_sqrt_generic =
    K3_KERNEL_RECORD(k3_cuda_sqrt_generic, supports, run_unary);
extern "C" const k3_kernel k3_cuda_sum_generic =
    K3_KERNEL_RECORD(k3_cuda_sum_generic, supports, run_reduce);
extern "C" const k3_kernel k3_cuda_mean_generic =
    K3_KERNEL_RECORD(k3_cuda_mean_generic, supports, run_reduce);
extern "C" const k3_kernel k3_cuda_max_generic =
    K3_KERNEL_RECORD(k3_cuda_max_generic, supports, run_reduce);
extern "C" const k3_kernel k3_cuda_min_generic =
    K3_KERNEL_RECORD(k3_cuda_min_generic, supports, run_reduce);
