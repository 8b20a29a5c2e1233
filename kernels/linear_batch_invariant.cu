/*
 * linear_batch_invariant.cu — cuda.linear.batch_invariant: y = x w^T (+ bias) (+ residual)
 * with each output reduced in the one order that docs/DESIGN.md ("The batch-invariant
 * reduction order") fixes for CPU and GPU alike, so a row's bits depend neither on M nor on
 * the device: 32 lanes, lane j accumulates
 * fma(x[i,k], w[n,k], acc) for k = j, j+32, ... in increasing k, then the shfl_down tree
 * (16, 8, 4, 2, 1), then + bias, then + residual, rounded once. bf16, f16, f32 (f32
 * accumulation) and f64 (f64 accumulation, same order); any non-negative strides. The
 * silu_mul prologue (x [M, 2K]) computes each h = silu(gate) * up as cuda.silu_mul.generic
 * does (kernels/silu.cuh, rounded to the dtype) where it would load x, so the order above
 * sees exactly the h a separate silu_mul writes; the rms_norm prologue goes through a
 * temporary (k3c_prologue_temp), and the silu_mul epilogue writes y into one and
 * cuda.silu_mul.generic from it (k3c_epilogue_temp).
 */
#include "common.cuh"
#include "silu.cuh"

#include <stdio.h>

/* A warp serves one output column n for up to BI_ROWS rows i (w's row is read once for
 * them); each output keeps its own accumulator and its own fixed order. */
#define BI_ROWS 4
#define BI_THREADS 256

static __device__ __forceinline__ float k3bi_fma(float a, float b, float c) {
    return __fmaf_rn(a, b, c);
}
static __device__ __forceinline__ double k3bi_fma(double a, double b, double c) {
    return __fma_rn(a, b, c);
}
static __device__ __forceinline__ float k3bi_add(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ double k3bi_add(double a, double b) { return __dadd_rn(a, b); }

/* x[i, k], or under SILU h[i, k] = round(silu(x[i, k]) * x[i, K + k]) widened back. */
template <class T, bool SILU>
static __device__ __forceinline__ typename k3c_acc<T>::type
    k3bi_lhs(const T *__restrict__ x, int64_t i, int64_t k, int64_t xs0, int64_t xs1, int64_t K) {
    if (!SILU) return k3c_load_acc<T>(x[i * xs0 + k * xs1]);
    const typename k3c_acc<T>::type g = k3c_load_acc<T>(x[i * xs0 + k * xs1]);
    const typename k3c_acc<T>::type u = k3c_load_acc<T>(x[i * xs0 + (K + k) * xs1]);
    return k3c_load_acc<T>(k3c_store_acc<T>(k3c_silu(g) * u));
}

template <class T, bool SILU>
__global__ void __launch_bounds__(BI_THREADS)
    k3_bi_kernel(const T *__restrict__ x, int64_t xs0, int64_t xs1, const T *__restrict__ w,
                 int64_t ws0, int64_t ws1, const T *__restrict__ bias, int64_t bs0,
                 const T *__restrict__ res, int64_t rs0, int64_t rs1, T *__restrict__ y,
                 int64_t ys0, int64_t ys1, int64_t M, int64_t N, int64_t K) {
    typedef typename k3c_acc<T>::type A;
    const int lane = threadIdx.x & 31;
    const int64_t row_blocks = (M + BI_ROWS - 1) / BI_ROWS;
    const int64_t tasks = row_blocks * N;
    const int64_t warps = (int64_t)gridDim.x * (BI_THREADS / 32);
    /* The task index is the same for the whole warp, so shuffles see all 32 lanes. */
    for (int64_t task = (int64_t)blockIdx.x * (BI_THREADS / 32) + (threadIdx.x >> 5);
         task < tasks; task += warps) {
        const int64_t rb = task / N, n = task - rb * N;
        const int64_t i0 = rb * BI_ROWS;
        const int rows = (int)(M - i0 < BI_ROWS ? M - i0 : BI_ROWS);
        const T *wr = w + n * ws0;
        A acc[BI_ROWS];
#pragma unroll
        for (int r = 0; r < BI_ROWS; r++) acc[r] = (A)0;
        for (int64_t k = lane; k < K; k += 32) {
            const A wv = k3c_load_acc<T>(wr[k * ws1]);
#pragma unroll
            for (int r = 0; r < BI_ROWS; r++)
                if (r < rows)
                    acc[r] = k3bi_fma(k3bi_lhs<T, SILU>(x, i0 + r, k, xs0, xs1, K), wv, acc[r]);
        }
#pragma unroll
        for (int r = 0; r < BI_ROWS; r++)
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                acc[r] = k3bi_add(acc[r], __shfl_down_sync(0xffffffffu, acc[r], off));
        if (lane == 0) {
            const A b = bias ? k3c_load_acc<T>(bias[n * bs0]) : (A)0;
#pragma unroll
            for (int r = 0; r < BI_ROWS; r++) {
                if (r >= rows) continue;
                const int64_t i = i0 + r;
                A v = acc[r];
                if (bias) v = k3bi_add(v, b);
                if (res) v = k3bi_add(v, k3c_load_acc<T>(res[i * rs0 + n * rs1]));
                y[i * ys0 + n * ys1] = k3c_store_acc<T>(v);
            }
        }
    }
}

static k3_status k3bi_check(const k3_linear_args *l, char *why, size_t n) {
    char a[32], b[32];
    const k3_tensor *x = l->x;
    if (x->ndim != 2 || l->w->ndim != 2)
        return snprintf(why, n, "x and w must be 2-D (%d-D, %d-D)", x->ndim, l->w->ndim),
               K3_ESHAPE;
    k3_device dx = k3_tensor_device(x);
    if (dx.type != K3_DEVICE_CUDA)
        return snprintf(why, n, "x is on %s, not a CUDA device", k3_device_name(dx, a, sizeof a)),
               K3_EDEVICE;
    const k3_tensor *ts[4] = {l->w, l->bias, l->residual, l->out};
    const char *tn[4] = {"w", "bias", "residual", "out"};
    for (int i = 0; i < 4; i++) {
        if (!ts[i]) continue;
        if (ts[i]->dtype != x->dtype)
            return snprintf(why, n, "%s dtype (%s) differs from x dtype (%s)", tn[i],
                            k3_dtype_name(ts[i]->dtype), k3_dtype_name(x->dtype)),
                   K3_EDTYPE;
        k3_device d = k3_tensor_device(ts[i]);
        if (d.type != K3_DEVICE_CUDA || d.index != dx.index)
            return snprintf(why, n, "%s is on %s, x on %s", tn[i], k3_device_name(d, a, sizeof a),
                            k3_device_name(dx, b, sizeof b)),
                   K3_EDEVICE;
    }
    return K3_OK;
}

static k3_status k3bi_supports(const k3_op_args *a, char *reason, size_t n) {
    return k3bi_check(&a->u.linear, reason, n);
}

template <class T>
static k3_status k3bi_launch(const k3_linear_args *l, cudaStream_t stream) {
    const k3_tensor *x = l->x, *w = l->w, *bias = l->bias, *res = l->residual;
    k3_tensor *out = l->out;
    const int64_t M = x->size[0], K = w->size[1], N = w->size[0];
    const int64_t tasks = (M + BI_ROWS - 1) / BI_ROWS * N;
    const unsigned blocks = k3c_blocks_for(tasks, BI_THREADS / 32, 1 << 20);
    auto kernel = l->prologue == K3_LINEAR_PROLOGUE_SILU_MUL ? k3_bi_kernel<T, true>
                                                              : k3_bi_kernel<T, false>;
    kernel<<<blocks, BI_THREADS, 0, stream>>>(
        (const T *)k3_tensor_data(x), x->stride[0], x->stride[1], (const T *)k3_tensor_data(w),
        w->stride[0], w->stride[1], bias ? (const T *)k3_tensor_data(bias) : nullptr,
        bias ? bias->stride[0] : 0, res ? (const T *)k3_tensor_data(res) : nullptr,
        res ? res->stride[0] : 0, res ? res->stride[1] : 0, (T *)k3_tensor_data(out),
        out->stride[0], out->stride[1], M, N, K);
    K3_CHECK_LAUNCH(k3_bi_kernel);
    return K3_OK;
}

static k3_status k3bi_run(const k3_op_args *a) {
    const k3_linear_args *l = &a->u.linear;
    char why[256];
    k3_status s = k3bi_check(l, why, sizeof why);
    if (s != K3_OK) return k3_error(s, "linear: %s: %s", k3_cuda_linear_batch_invariant_name, why);
    if (l->x->size[0] == 0 || l->w->size[0] == 0) return K3_OK;
    /* The silu_mul epilogue: y [M, 2N] through a temporary, then cuda.silu_mul.generic. */
    if (l->epilogue != K3_LINEAR_EPILOGUE_NONE) return k3c_epilogue_temp(a, k3bi_run);
    /* Dispatch's prologue has rejected freed tensors; only K = 0 leaves x and w unread. */
    const k3_tensor *ts[5] = {l->x, l->w, l->bias, l->residual, l->out};
    for (int i = 0; i < 5; i++)
        if (ts[i] && k3_tensor_numel(ts[i]) > 0 && !k3_tensor_data(ts[i]))
            return k3_error(K3_EINTERNAL,
                            "linear: %s: NULL data for a non-empty tensor",
                            k3_cuda_linear_batch_invariant_name);

    k3c_ctx *ctx = NULL;
    K3_TRY(k3c_context(k3_tensor_device(l->x).index, &ctx));
    /* The rms_norm prologue's row scale spans the whole row: h comes from a temporary that
     * cuda.rms_norm.generic writes, then the plain kernel runs on it. */
    k3_linear_args plain = *l;
    k3c_buffer hbuf;
    k3c_temp_tensor ht;
    if (l->prologue == K3_LINEAR_PROLOGUE_RMS_NORM) {
        K3_TRY(k3c_prologue_temp(l, hbuf, ht));
        plain.x = &ht.t;
        plain.prologue = K3_LINEAR_PROLOGUE_NONE;
        plain.norm_weight = nullptr;
    }
    K3C_DISPATCH_DTYPE(l->x->dtype, T, return k3bi_launch<T>(&plain, ctx->stream));
    return k3_error(K3_EDTYPE, "linear: %s: unknown dtype %d", k3_cuda_linear_batch_invariant_name,
                    (int)l->x->dtype);
}

extern "C" const k3_kernel k3_cuda_linear_batch_invariant =
    K3_KERNEL_RECORD(k3_cuda_linear_batch_invariant, k3bi_supports, k3bi_run);
