/*
 * cpu/linear.c — the CPU linear kernels: cpu.linear.blas (OpenBLAS; the CPU default),
 * cpu.linear.reference (naive, fp64 accumulate; the oracle) and cpu.linear.batch_invariant
 * (one fixed reduction order, defined at run_batch_invariant below and in docs/DESIGN.md,
 * "The batch-invariant reduction order"; the GPU kernel uses the same one).
 * All take any strides, including zero-stride broadcast views, and bf16/f16/f32/f64, and
 * apply the silu_mul prologue (k3.h) while they widen x: each element of the gate is computed
 * and rounded to x's dtype exactly as cpu.silu_mul.reference does (cpu/silu.h), so the fused
 * call gives the bits of silu_mul followed by the plain linear on the same kernel. The
 * rms_norm prologue runs cpu.rms_norm.reference into a temporary and the kernel on it (on the
 * CPU a fused row norm would save nothing; the temporary gives rms_norm's bits by
 * construction); the silu_mul epilogue runs the kernel into a temporary y [M, 2N] and
 * cpu.silu_mul.reference from it into out, for the same reason.
 */
#include "k3_impl.h"
#include "silu.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const void *cdata(const k3_tensor *t) { return k3_tensor_data(t); }

/* Dispatch's prologue validated the call and checked it runs on the CPU (these kernels
 * dereference host pointers): these kernels take every such linear call. */
static k3_status supports_any(const k3_op_args *a, char *reason, size_t n) { return K3_OK; }

/* ---- cpu.linear.blas ---------------------------------------------------------------------- */

/* A matrix operand for ?gemm: data, leading dimension, and whether it is used transposed. */
typedef struct operand {
    const void *p;
    int64_t ld;
    bool trans;
} operand;

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

/* x rows [rows, K] with strides (s0, s1): row-major (NoTrans, ld s0) or column-major
 * (Trans, ld s1) when the strides allow, as BLAS needs ld >= the row length. */
static bool pick_rowmajor(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int64_t *ld) {
    if ((cols <= 1 || s1 == 1) && (rows <= 1 || s0 >= max1(cols))) {
        *ld = rows <= 1 ? max1(cols) : s0;
        return *ld <= INT32_MAX;
    }
    return false;
}
static bool pick_colmajor(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int64_t *ld) {
    if ((rows <= 1 || s0 == 1) && (cols <= 1 || s1 >= max1(rows))) {
        *ld = cols <= 1 ? max1(rows) : s1;
        return *ld <= INT32_MAX;
    }
    return false;
}

/* Copies rows [r0, r0+rows) of a 2-D tensor into dst [rows, K] contiguous as float or
 * double (16-bit values widen exactly). */
static void widen_rows(void *dst, bool dbl, const k3_tensor *t, int64_t r0, int64_t rows) {
    const void *base = cdata(t);
    int64_t K = t->size[1], s0 = t->stride[0], s1 = t->stride[1];
    if (K == 0) return;
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = (r0 + r) * s0;
        if (dbl) {
            double *d = (double *)dst + r * K;
            for (int64_t k = 0; k < K; k++) d[k] = k3_load_f64(base, t->dtype, o + k * s1);
        } else if (s1 == 1 || K <= 1) {
            k3_convert_to_f32((float *)dst + r * K,
                              (const char *)base + (size_t)o * k3_dtype_size(t->dtype), t->dtype,
                              K);
        } else {
            float *d = (float *)dst + r * K;
            for (int64_t k = 0; k < K; k++) d[k] = k3_load_f32(base, t->dtype, o + k * s1);
        }
    }
}

/* The silu_mul prologue's h[i, k] = round(silu(x[i, k]) * x[i, K + k]) to x's dtype, with o
 * the offset of row i: in f32 for 16-bit and f32 x, in f64 for f64 x (cpu.silu_mul.reference's
 * arithmetic), widened back exactly. */
static double silu_mul_at(const void *base, k3_dtype dt, int64_t o, int64_t s1, int64_t k,
                          int64_t K) {
    uint64_t cell = 0; /* one element of dtype dt, at most 8 bytes */
    if (dt == K3_DTYPE_F64) {
        double g = k3_load_f64(base, dt, o + k * s1), u = k3_load_f64(base, dt, o + (K + k) * s1);
        return k3_silu_f64(g) * u;
    }
    float g = k3_load_f32(base, dt, o + k * s1), u = k3_load_f32(base, dt, o + (K + k) * s1);
    k3_store_f32(&cell, dt, 0, k3_silu_f32(g) * u);
    return k3_load_f64(&cell, dt, 0);
}

/* widen_rows for the silu_mul prologue: rows [r0, r0+rows) of h = silu_mul(x) into dst
 * [rows, K], K = w's dim 1 (x is [M, 2K]). */
static void silu_mul_rows(void *dst, bool dbl, const k3_tensor *x, int64_t K, int64_t r0,
                          int64_t rows) {
    const void *base = cdata(x);
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = (r0 + r) * x->stride[0];
        for (int64_t k = 0; k < K; k++) {
            double h = silu_mul_at(base, x->dtype, o, x->stride[1], k, K);
            if (dbl) ((double *)dst)[r * K + k] = h;
            else ((float *)dst)[r * K + k] = (float)h; /* exact: h is an f32, f16 or bf16 value */
        }
    }
}

/* The product's left operand, rows [r0, r0+rows) widened into dst [rows, K]: x itself, or h
 * under the silu_mul prologue. */
static void widen_lhs(void *dst, bool dbl, const k3_linear_args *a, int64_t r0, int64_t rows) {
    if (a->prologue == K3_LINEAR_PROLOGUE_SILU_MUL)
        silu_mul_rows(dst, dbl, a->x, a->w->size[1], r0, rows);
    else
        widen_rows(dst, dbl, a->x, r0, rows);
}

/* A temporary [rows, cols] of x's dtype on the host, its allocation errors naming the op. */
static k3_status linear_temp(k3_tensor **t, const k3_linear_args *a, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return k3_tensor_new(t, 2, shape, a->x->dtype, k3_tensor_device(a->x), "linear");
}

/* The silu_mul epilogue on the CPU: run(the call without it) writes y [M, 2N] into a
 * temporary of x's dtype (y's bits are the plain call's), then cpu.silu_mul.reference(y)
 * writes out [M, N]. Any prologue is left to run. */
static k3_status with_silu_mul_epilogue(const k3_op_args *oa,
                                        k3_status (*run)(const k3_op_args *)) {
    const k3_linear_args *a = &oa->u.linear;
    k3_tensor *y = NULL;
    K3_TRY(linear_temp(&y, a, a->x->size[0], a->w->size[0]));
    k3_op_args plain = *oa;
    plain.u.linear.out = y;
    plain.u.linear.epilogue = K3_LINEAR_EPILOGUE_NONE;
    k3_status s = run(&plain);
    if (s == K3_OK) {
        k3_op_args gate;
        memset(&gate, 0, sizeof gate);
        gate.op = K3_OP_SILU_MUL;
        gate.u.silu_mul = (k3_silu_mul_args){y, a->out, a->base};
        s = k3_cpu_silu_mul_reference.run(&gate);
    }
    k3_tensor_free(y);
    return s;
}

/* The rms_norm prologue on the CPU: h = cpu.rms_norm.reference(x, norm_weight, eps) into a
 * temporary [M, K] of x's dtype, then run(h) as a plain call. */
static k3_status with_rms_norm(const k3_op_args *oa, k3_status (*run)(const k3_op_args *)) {
    const k3_linear_args *a = &oa->u.linear;
    k3_tensor *h = NULL;
    K3_TRY(linear_temp(&h, a, a->x->size[0], a->x->size[1]));
    k3_op_args norm;
    memset(&norm, 0, sizeof norm);
    norm.op = K3_OP_RMS_NORM;
    norm.u.rms_norm = (k3_rms_norm_args){a->x, a->norm_weight, a->norm_eps, h, a->base};
    k3_status s = k3_cpu_rms_norm_reference.run(&norm);
    if (s == K3_OK) {
        k3_op_args plain = *oa;
        plain.u.linear.x = h;
        plain.u.linear.prologue = K3_LINEAR_PROLOGUE_NONE;
        plain.u.linear.norm_weight = NULL;
        s = run(&plain);
    }
    k3_tensor_free(h);
    return s;
}

/* Bytes of host scratch, overflow-checked by the caller's sizes (all < 2^31 elements). */
#define TILE_ELEMS ((int64_t)1 << 22)

static k3_status run_blas(const k3_op_args *oa) {
    const k3_linear_args *a = &oa->u.linear;
    if (a->epilogue == K3_LINEAR_EPILOGUE_SILU_MUL) return with_silu_mul_epilogue(oa, run_blas);
    if (a->prologue == K3_LINEAR_PROLOGUE_RMS_NORM) return with_rms_norm(oa, run_blas);
    const k3_tensor *x = a->x, *w = a->w;
    k3_tensor *out = a->out;
    int64_t M = x->size[0], K = w->size[1], N = w->size[0];
    if (M == 0 || N == 0) return K3_OK;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return k3_error(K3_EOVERFLOW, "linear: %s: a dimension exceeds 2^31-1",
                        k3_cpu_linear_blas_name);
    bool dbl = x->dtype == K3_DTYPE_F64;
    bool wide = x->dtype == K3_DTYPE_F32 || dbl; /* operands usable by ?gemm as they are */
    size_t es = dbl ? sizeof(double) : sizeof(float);

    /* x is used directly when its strides give a transpose flag (and no prologue computes h
     * from it); otherwise copied once per row block. w likewise; a 16-bit w is widened in
     * blocks of rows, never as a whole. */
    int64_t ldx = 0, ldw = 0;
    bool x_direct = false, x_trans = false, w_direct = false, w_colmajor = false;
    if (wide && a->prologue == K3_LINEAR_PROLOGUE_NONE) {
        if (pick_rowmajor(M, K, x->stride[0], x->stride[1], &ldx)) x_direct = true;
        else if (pick_colmajor(M, K, x->stride[0], x->stride[1], &ldx)) x_direct = x_trans = true;
    }
    if (wide) {
        if (pick_rowmajor(N, K, w->stride[0], w->stride[1], &ldw)) w_direct = true;
        else if (pick_colmajor(N, K, w->stride[0], w->stride[1], &ldw)) w_direct = w_colmajor = true;
    }
    int64_t MB = x_direct ? M : (M < 256 ? M : 256);
    int64_t NB = N;
    if (!w_direct && NB > TILE_ELEMS / max1(K)) NB = max1(TILE_ELEMS / max1(K));
    if (NB > TILE_ELEMS / MB) NB = max1(TILE_ELEMS / MB);

    size_t xbytes = x_direct ? 0 : (size_t)MB * (size_t)K * es;
    size_t wbytes = w_direct ? 0 : (size_t)NB * (size_t)K * es;
    size_t cbytes = (size_t)MB * (size_t)NB * es;
    void *xbuf = xbytes ? k3_host_alloc(xbytes) : NULL;
    void *wbuf = wbytes ? k3_host_alloc(wbytes) : NULL;
    void *cbuf = k3_host_alloc(cbytes);
    k3_status st = K3_OK;
    if ((xbytes && !xbuf) || (wbytes && !wbuf) || !cbuf) {
        st = k3_error(K3_ENOMEM, "linear: %s: out of memory (%zu bytes of scratch)",
                      k3_cpu_linear_blas_name, xbytes + wbytes + cbytes);
        goto done;
    }
    const void *bbase = a->bias ? cdata(a->bias) : NULL;
    const void *rbase = a->residual ? cdata(a->residual) : NULL;
    void *obase = k3_tensor_data(out);
    size_t xes = k3_dtype_size(x->dtype);
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
        int64_t mb = M - m0 < MB ? M - m0 : MB;
        operand A;
        if (x_direct) {
            A = (operand){(const char *)cdata(x) + (size_t)(m0 * x->stride[0]) * xes, ldx,
                          x_trans};
        } else {
            widen_lhs(xbuf, dbl, a, m0, mb);
            A = (operand){xbuf, max1(K), false};
        }
        for (int64_t n0 = 0; n0 < N; n0 += NB) {
            int64_t nb = N - n0 < NB ? N - n0 : NB;
            operand B; /* op(B) is [K, nb] */
            if (w_direct) {
                B = (operand){(const char *)cdata(w) + (size_t)(n0 * w->stride[0]) * xes, ldw,
                              !w_colmajor};
            } else {
                widen_rows(wbuf, dbl, w, n0, nb);
                B = (operand){wbuf, max1(K), true};
            }
            /* One row (decode at M = 1) is a matrix-vector product: ?gemv streams op(B)
             * once, where ?gemm would first pack it. x's elements are A.ld apart when x is
             * column-major. y_j = sum_k op(B)[k, j] x_k: NoTrans over B stored [nb, K]
             * (B.trans), Trans over B stored [K, nb]. */
            const int incx = A.trans ? (int)A.ld : 1;
            const CBLAS_TRANSPOSE bt = B.trans ? CblasNoTrans : CblasTrans;
            const int br = B.trans ? (int)nb : (int)K, bc = B.trans ? (int)K : (int)nb;
            if (K == 0) {
                memset(cbuf, 0, (size_t)mb * (size_t)nb * es);
            } else if (mb == 1 && dbl) {
                cblas_dgemv(CblasRowMajor, bt, br, bc, 1.0, B.p, (int)B.ld, A.p, incx, 0.0,
                            cbuf, 1);
            } else if (mb == 1) {
                cblas_sgemv(CblasRowMajor, bt, br, bc, 1.0f, B.p, (int)B.ld, A.p, incx, 0.0f,
                            cbuf, 1);
            } else if (dbl) {
                cblas_dgemm(CblasRowMajor, A.trans ? CblasTrans : CblasNoTrans,
                            B.trans ? CblasTrans : CblasNoTrans, (int)mb, (int)nb, (int)K, 1.0,
                            A.p, (int)A.ld, B.p, (int)B.ld, 0.0, cbuf, (int)max1(nb));
            } else {
                cblas_sgemm(CblasRowMajor, A.trans ? CblasTrans : CblasNoTrans,
                            B.trans ? CblasTrans : CblasNoTrans, (int)mb, (int)nb, (int)K, 1.0f,
                            A.p, (int)A.ld, B.p, (int)B.ld, 0.0f, cbuf, (int)max1(nb));
            }
            /* Epilogue in fp32 (fp64 for f64): + bias, + residual, one rounding. */
            for (int64_t i = 0; i < mb; i++) {
                int64_t gi = m0 + i;
                for (int64_t j = 0; j < nb; j++) {
                    int64_t gj = n0 + j;
                    int64_t oi = gi * out->stride[0] + gj * out->stride[1];
                    if (dbl) {
                        double v = ((double *)cbuf)[i * nb + j];
                        if (bbase) v += k3_load_f64(bbase, a->bias->dtype, gj * a->bias->stride[0]);
                        if (rbase)
                            v += k3_load_f64(rbase, a->residual->dtype,
                                             gi * a->residual->stride[0] + gj * a->residual->stride[1]);
                        k3_store_f64(obase, out->dtype, oi, v);
                    } else {
                        float v = ((float *)cbuf)[i * nb + j];
                        if (bbase) v += k3_load_f32(bbase, a->bias->dtype, gj * a->bias->stride[0]);
                        if (rbase)
                            v += k3_load_f32(rbase, a->residual->dtype,
                                             gi * a->residual->stride[0] + gj * a->residual->stride[1]);
                        k3_store_f32(obase, out->dtype, oi, v);
                    }
                }
            }
        }
    }
done:
    if (xbuf) k3_host_free(xbuf, xbytes);
    if (wbuf) k3_host_free(wbuf, wbytes);
    if (cbuf) k3_host_free(cbuf, cbytes);
    return st;
}

/* ?gemm takes int sizes: a call with M, N or K above 2^31-1 goes to the next candidate
 * (cpu.linear.reference in the default policy) instead of failing in run, so explain names
 * the kernel that really runs. Leading dimensions above 2^31-1 are handled in run by copying
 * the operand. */
static k3_status supports_blas(const k3_op_args *oa, char *reason, size_t n) {
    const k3_linear_args *a = &oa->u.linear;
    int64_t M = a->x->size[0], K = a->w->size[1], N = a->w->size[0];
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) {
        snprintf(reason, n,
                 "%s supports M, N and K up to 2^31-1 (BLAS takes int); got M %lld, N %lld, "
                 "K %lld",
                 k3_cpu_linear_blas_name, (long long)M, (long long)N, (long long)K);
        return K3_EINVAL;
    }
    return K3_OK;
}

const k3_kernel k3_cpu_linear_blas = K3_KERNEL_RECORD(k3_cpu_linear_blas, supports_blas, run_blas);

/* ---- cpu.linear.reference ------------------------------------------------------------------ */

/* The oracle: every product and sum in fp64, one rounding to the output dtype (under the
 * silu_mul prologue, of products with h, itself rounded as silu_mul rounds it). */
static k3_status run_reference(const k3_op_args *oa) {
    const k3_linear_args *a = &oa->u.linear;
    if (a->epilogue == K3_LINEAR_EPILOGUE_SILU_MUL) return with_silu_mul_epilogue(oa, run_reference);
    if (a->prologue == K3_LINEAR_PROLOGUE_RMS_NORM) return with_rms_norm(oa, run_reference);
    const k3_tensor *x = a->x, *w = a->w;
    k3_tensor *out = a->out;
    int64_t M = x->size[0], K = w->size[1], N = w->size[0];
    bool silu = a->prologue == K3_LINEAR_PROLOGUE_SILU_MUL;
    const void *xb = cdata(x), *wb = cdata(w);
    const void *bb = a->bias ? cdata(a->bias) : NULL;
    const void *rb = a->residual ? cdata(a->residual) : NULL;
    void *ob = k3_tensor_data(out);
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (silu ? silu_mul_at(xb, x->dtype, i * x->stride[0], x->stride[1], k, K)
                             : k3_load_f64(xb, x->dtype, i * x->stride[0] + k * x->stride[1])) *
                       k3_load_f64(wb, w->dtype, n * w->stride[0] + k * w->stride[1]);
            if (bb) acc += k3_load_f64(bb, a->bias->dtype, n * a->bias->stride[0]);
            if (rb)
                acc += k3_load_f64(rb, a->residual->dtype,
                                   i * a->residual->stride[0] + n * a->residual->stride[1]);
            k3_store_f64(ob, out->dtype, i * out->stride[0] + n * out->stride[1], acc);
        }
    return K3_OK;
}

const k3_kernel k3_cpu_linear_reference =
    K3_KERNEL_RECORD(k3_cpu_linear_reference, supports_any, run_reference);

/* ---- cpu.linear.batch_invariant ---------------------------------------------------------- */

/* The batch-invariant order (docs/DESIGN.md, "The batch-invariant reduction order"), the
 * same as cuda.linear.batch_invariant's: for output (i, n), operands widened exactly to f32;
 * 32 lanes, each starting at +0, lane j accumulating acc_j = fma(x[i,k], w[n,k], acc_j) for
 * k = j, j+32, j+64, ... < K in increasing k; then for off = 16, 8, 4, 2, 1 every j < off
 * takes acc_j + acc_{j+off} (the GPU's __shfl_down_sync tree); the result is acc_0, then
 * + bias[n], then + residual[i,n], each one rounded f32 addition, and one rounding to the
 * output dtype. f64 tensors use the same order in fp64. */
#define BI_LANES 32

/* One output's dot product in that order, written once per accumulator type T. */
#define DEFINE_BI_ROW(NAME, T, FMA)                                                          \
    static T NAME(const T *xr, const T *wr, int64_t K) {                                     \
        T acc[BI_LANES];                                                                     \
        for (int j = 0; j < BI_LANES; j++) {                                                 \
            T s = 0;                                                                         \
            for (int64_t k = j; k < K; k += BI_LANES) s = FMA(xr[k], wr[k], s);              \
            acc[j] = s;                                                                      \
        }                                                                                    \
        for (int off = BI_LANES / 2; off >= 1; off /= 2)                                     \
            for (int j = 0; j < off; j++) acc[j] = acc[j] + acc[j + off];                    \
        return acc[0];                                                                       \
    }

DEFINE_BI_ROW(bi_row_f32, float, fmaf)
DEFINE_BI_ROW(bi_row_f64, double, fma)

static k3_status run_batch_invariant(const k3_op_args *oa) {
    const k3_linear_args *a = &oa->u.linear;
    if (a->epilogue == K3_LINEAR_EPILOGUE_SILU_MUL) return with_silu_mul_epilogue(oa, run_batch_invariant);
    if (a->prologue == K3_LINEAR_PROLOGUE_RMS_NORM) return with_rms_norm(oa, run_batch_invariant);
    const k3_tensor *x = a->x, *w = a->w;
    k3_tensor *out = a->out;
    int64_t M = x->size[0], K = w->size[1], N = w->size[0];
    if (M == 0 || N == 0) return K3_OK;
    bool dbl = x->dtype == K3_DTYPE_F64;
    size_t es = dbl ? sizeof(double) : sizeof(float);
    /* x (or h, under the prologue) is widened whole (it is the activation); w one row at a time. */
    size_t xbytes, wbytes = (size_t)max1(K) * es;
    if (__builtin_mul_overflow((size_t)M, wbytes, &xbytes))
        return k3_error(K3_EOVERFLOW, "linear: %s: scratch size overflows for M %lld, K %lld",
                        k3_cpu_linear_batch_invariant_name, (long long)M, (long long)K);
    void *xbuf = k3_host_alloc(xbytes), *wbuf = k3_host_alloc(wbytes);
    if (!xbuf || !wbuf) {
        if (xbuf) k3_host_free(xbuf, xbytes);
        if (wbuf) k3_host_free(wbuf, wbytes);
        return k3_error(K3_ENOMEM, "linear: %s: out of memory (%zu bytes of scratch)",
                        k3_cpu_linear_batch_invariant_name, xbytes + wbytes);
    }
    widen_lhs(xbuf, dbl, a, 0, M);
    const void *bb = a->bias ? cdata(a->bias) : NULL;
    const void *rb = a->residual ? cdata(a->residual) : NULL;
    void *ob = k3_tensor_data(out);
    for (int64_t n = 0; n < N; n++) {
        widen_rows(wbuf, dbl, w, n, 1);
        for (int64_t i = 0; i < M; i++) {
            int64_t ri = i * (a->residual ? a->residual->stride[0] : 0) +
                         n * (a->residual ? a->residual->stride[1] : 0);
            int64_t oi = i * out->stride[0] + n * out->stride[1];
            if (dbl) {
                double r = bi_row_f64((const double *)xbuf + i * K, wbuf, K);
                if (bb) r = r + k3_load_f64(bb, a->bias->dtype, n * a->bias->stride[0]);
                if (rb) r = r + k3_load_f64(rb, a->residual->dtype, ri);
                k3_store_f64(ob, out->dtype, oi, r);
            } else {
                float r = bi_row_f32((const float *)xbuf + i * K, wbuf, K);
                if (bb) r = r + k3_load_f32(bb, a->bias->dtype, n * a->bias->stride[0]);
                if (rb) r = r + k3_load_f32(rb, a->residual->dtype, ri);
                k3_store_f32(ob, out->dtype, oi, r);
            }
        }
    }
    k3_host_free(xbuf, xbytes);
    k3_host_free(wbuf, wbytes);
    return K3_OK;
}

const k3_kernel k3_cpu_linear_batch_invariant =
    K3_KERNEL_RECORD(k3_cpu_linear_batch_invariant, supports_any, run_batch_invariant);
