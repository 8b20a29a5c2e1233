/*
 * linear_cublas.cu — cuda.linear.cublas, the GPU default linear: y = x w^T (+ bias)
 * (+ residual) for bf16, f16, f32 (and f64), fp32 accumulation (fp64 for f64), rounded once.
 *
 * Operands: x and w are read in place when one of their strides is 1 and the other is a
 * leading dimension cuBLAS accepts (>= the unit-stride dim's size); that covers row-major,
 * transposed and row-padded views. Anything else (two non-unit strides, broadcast rows) is
 * first copied to a contiguous device temporary.
 * Fused path: cuBLASLt with the bias epilogue and the residual as C (beta = 1), when out and
 * residual have unit last stride, bias unit stride and 16-byte alignment; every pointer's real
 * alignment is given to the heuristic, so sliced (odd-offset) operands get algorithms that
 * can read them. Otherwise, or when cuBLASLt offers no algorithm: cublasGemmEx into an f32
 * (f64) temporary, then one epilogue kernel adds bias and residual through their real strides
 * and rounds once. f32 uses CUBLAS_COMPUTE_32F: no TF32.
 * A prologue goes through a temporary: cuda.silu_mul.generic's or cuda.rms_norm.generic's own
 * run writes h [M, K] into a contiguous device buffer (so h has that op's bits by
 * construction), then the GEMM above reads h as x. The silu_mul epilogue likewise: the GEMM
 * writes y [M, 2N] into a temporary and cuda.silu_mul.generic's run writes out from it
 * (k3c_epilogue_temp).
 */
#include "common.cuh"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unordered_map>

namespace {

const k3_kernel &self() { return k3_cuda_linear_cublas; }

/* How one operand is handed to cuBLAS (column-major view of a row-major [rows, cols]). */
struct operand {
    const void *ptr;
    cublasOperation_t op;
    int64_t ld;
};

/* A row-major [r, c] view with strides (s0, s1) as a cuBLAS operand whose column-major
 * matrix is its transpose [c, r]: ld s0 when s1 == 1, or ld s1 when s0 == 1 (the view is then
 * column-major). `row_major_is_T` says which cuBLAS flag a row-major view needs for this
 * operand (w: OP_T, x: OP_N). A dim of size 1 makes its stride irrelevant. False when
 * neither fits (two non-unit strides, or a leading dimension below the row length). */
bool as_operand(const k3_tensor *t, bool row_major_is_T, operand *o) {
    int64_t r = t->size[0], c = t->size[1], s0 = t->stride[0], s1 = t->stride[1];
    cublasOperation_t rm = row_major_is_T ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t cm = row_major_is_T ? CUBLAS_OP_N : CUBLAS_OP_T;
    o->ptr = k3_tensor_ptr(t);
    if ((s1 == 1 || c == 1) && (r == 1 || s0 >= c)) {
        o->op = rm;
        o->ld = r == 1 ? (c > 0 ? c : 1) : s0;
        return true;
    }
    if ((s0 == 1 || r == 1) && (c == 1 || s1 >= r)) {
        o->op = cm;
        o->ld = c == 1 ? (r > 0 ? r : 1) : s1;
        return true;
    }
    return false;
}

cudaDataType_t cuda_type(k3_dtype dt) {
    switch (dt) {
    case K3_DTYPE_BF16: return CUDA_R_16BF;
    case K3_DTYPE_F16: return CUDA_R_16F;
    case K3_DTYPE_F32: return CUDA_R_32F;
    default: return CUDA_R_64F;
    }
}

/* Largest power of two (<= 256) dividing the address and the leading dimension in bytes. */
uint32_t alignment(const void *p, int64_t ld, size_t es) {
    uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)ld * es | 256u;
    return (uint32_t)(v & (~v + 1));
}

/* ---- cuBLASLt plans, cached per thread ------------------------------------------------ */

struct plan_key {
    int dev, dt, ta, tb, bias, res;
    int64_t M, N, K, lda, ldb, ldc, ldr;
    uint32_t aa, ab, ac, ad;
    bool operator==(const plan_key &o) const { return memcmp(this, &o, sizeof *this) == 0; }
};
struct plan_hash {
    size_t operator()(const plan_key &k) const {
        const unsigned char *p = (const unsigned char *)&k;
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 1099511628211ull;
        return (size_t)h;
    }
};
struct plan {
    bool ok = false; /* false: cuBLASLt has no algorithm, use the GemmEx path */
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
};
void plan_destroy(plan &p) {
    if (p.op) cublasLtMatmulDescDestroy(p.op);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    p = plan();
}
struct plan_cache {
    std::unordered_map<plan_key, plan, plan_hash> map;
    ~plan_cache() {
        /* Descriptors are host objects: destroying them needs no device. */
        for (auto &kv : map) plan_destroy(kv.second);
    }
};
thread_local plan_cache t_plans;

k3_status plan_build(k3c_ctx *ctx, const plan_key &k, plan *out) {
    plan p;
    cudaDataType_t ty = cuda_type((k3_dtype)k.dt);
    k3_status st = K3_OK;
#define PL(call)                                                                           \
    do {                                                                                   \
        if (st == K3_OK) st = k3c_check((call), #call, __FILE__, __LINE__);                \
    } while (0)
    PL(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = (cublasOperation_t)k.ta, tb = (cublasOperation_t)k.tb;
    PL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    PL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = k.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    PL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    /* Column-major: A = w^T-ish [N, K] via ta, B = x^T [K, M] via tb, C/D = y^T [N, M]. */
    uint64_t ar = ta == CUBLAS_OP_N ? k.N : k.K, ac = ta == CUBLAS_OP_N ? k.K : k.N;
    uint64_t br = tb == CUBLAS_OP_N ? k.K : k.M, bc = tb == CUBLAS_OP_N ? k.M : k.K;
    PL(cublasLtMatrixLayoutCreate(&p.a, ty, ar, ac, k.lda));
    PL(cublasLtMatrixLayoutCreate(&p.b, ty, br, bc, k.ldb));
    PL(cublasLtMatrixLayoutCreate(&p.c, ty, k.N, k.M, k.res ? k.ldr : k.ldc));
    PL(cublasLtMatrixLayoutCreate(&p.d, ty, k.N, k.M, k.ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    PL(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx->workspace_size;
    PL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws));
    uint32_t al[4] = {k.aa, k.ab, k.ac, k.ad};
    cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        PL(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]));
    /* Split-K partial sums only in the compute type: never rounded to 16 bits midway. */
    uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    PL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red,
                                            sizeof red));
#undef PL
    if (st == K3_OK) {
        cublasLtMatmulHeuristicResult_t r;
        int found = 0;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p.op, p.a, p.b, p.c, p.d,
                                                           pref, 1, &r, &found);
        if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
            p.algo = r.algo;
            p.ok = true;
        } else if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED) {
            st = k3c_check(hs, "cublasLtMatmulAlgoGetHeuristic(...)", __FILE__, __LINE__);
        }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st != K3_OK || !p.ok) {
        plan_destroy(p);
        p.ok = false;
    }
    *out = p;
    return st;
}

/* ---- the epilogue of the GemmEx path -------------------------------------------------- */

template <class T>
__global__ void epilogue_kernel(T *__restrict__ y, int64_t ys0, int64_t ys1,
                                const typename k3c_acc<T>::type *__restrict__ acc,
                                const T *__restrict__ bias, int64_t bs,
                                const T *__restrict__ res, int64_t rs0, int64_t rs1, int64_t M,
                                int64_t N, bool have_acc) {
    typedef typename k3c_acc<T>::type A;
    int64_t n_all = M * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = i / N, n = i - m * N;
        A v = have_acc ? acc[i] : (A)0;
        if (bias) v += k3c_load_acc<T>(bias[n * bs]);
        if (res) v += k3c_load_acc<T>(res[m * rs0 + n * rs1]);
        y[m * ys0 + n * ys1] = k3c_store_acc<T>(v);
    }
}

/* A contiguous device copy of t (same dtype) in buf, as a tensor view in tt. */
k3_status contiguous_copy(const k3_tensor *t, k3c_buffer &buf, k3c_temp_tensor &tt) {
    int dev = k3c_dev(t);
    size_t bytes = (size_t)k3_tensor_numel(t) * k3_dtype_size(t->dtype);
    K3_TRY(buf.alloc(dev, bytes));
    k3c_temp_init(&tt, buf.ptr, bytes, dev, t->dtype, t->ndim, t->size);
    return k3c_copy(&tt.t, t);
}

k3_status supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_linear_args *a = &oa->u.linear;
    if (a->batch_invariant) {
        snprintf(reason, n, "%s picks its algorithm per M; batch-invariant mode is on",
                 self().name);
        return K3_EINVAL;
    }
    return K3_OK;
}

template <class T>
k3_status gemmex_path(k3c_ctx *ctx, const k3_linear_args *a, const operand &A, const operand &B,
                      int64_t M, int64_t N, int64_t K) {
    typedef typename k3c_acc<T>::type Acc;
    const k3_tensor *y = a->out;
    k3c_buffer accbuf;
    bool have_acc = K > 0;
    if (have_acc) {
        K3_TRY(accbuf.alloc(ctx->dev, (size_t)M * (size_t)N * sizeof(Acc)));
        k3_dtype dt = a->x->dtype;
        cudaDataType_t ty = cuda_type(dt);
        if (dt == K3_DTYPE_F64) {
            double one = 1.0, zero = 0.0;
            K3_CHECK(cublasGemmEx(ctx->blas, A.op, B.op, (int)N, (int)M, (int)K, &one, A.ptr, ty,
                                  (int)A.ld, B.ptr, ty, (int)B.ld, &zero, accbuf.ptr, CUDA_R_64F,
                                  (int)N, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT));
        } else {
            float one = 1.0f, zero = 0.0f;
            K3_CHECK(cublasGemmEx(ctx->blas, A.op, B.op, (int)N, (int)M, (int)K, &one, A.ptr, ty,
                                  (int)A.ld, B.ptr, ty, (int)B.ld, &zero, accbuf.ptr, CUDA_R_32F,
                                  (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
    const k3_tensor *bias = a->bias, *res = a->residual;
    unsigned blocks = k3c_blocks_for(M * N, 256);
    epilogue_kernel<T><<<blocks, 256, 0, ctx->stream>>>(
        (T *)k3_tensor_ptr(y), y->stride[0], y->stride[1], (const Acc *)accbuf.ptr,
        bias ? (const T *)k3_tensor_ptr(bias) : nullptr, bias ? bias->stride[0] : 0,
        res ? (const T *)k3_tensor_ptr(res) : nullptr, res ? res->stride[0] : 0,
        res ? res->stride[1] : 0, M, N, have_acc);
    K3_CHECK_LAUNCH(epilogue_kernel);
    return K3_OK;
}

/* The fused cuBLASLt call; *done is false when cuBLASLt cannot take this case. */
k3_status lt_path(k3c_ctx *ctx, const k3_linear_args *a, const operand &A, const operand &B,
                  int64_t M, int64_t N, int64_t K, bool *done) {
    *done = false;
    k3_dtype dt = a->x->dtype;
    if (dt == K3_DTYPE_F64 || K == 0) return K3_OK;
    const k3_tensor *y = a->out, *bias = a->bias, *res = a->residual;
    size_t es = k3_dtype_size(dt);
    if (!(y->stride[1] == 1 || N == 1) || (M > 1 && y->stride[0] < N)) return K3_OK;
    if (res && (!(res->stride[1] == 1 || N == 1) || (M > 1 && res->stride[0] < N))) return K3_OK;
    if (bias && ((bias->stride[0] != 1 && N > 1) || ((uintptr_t)k3_tensor_ptr(bias) & 15u)))
        return K3_OK;
    plan_key k;
    memset(&k, 0, sizeof k);
    k.dev = ctx->dev;
    k.dt = dt;
    k.ta = A.op;
    k.tb = B.op;
    k.bias = bias != nullptr;
    k.res = res != nullptr;
    k.M = M;
    k.N = N;
    k.K = K;
    k.lda = A.ld;
    k.ldb = B.ld;
    k.ldc = M == 1 ? N : y->stride[0];
    k.ldr = res ? (M == 1 ? N : res->stride[0]) : 0;
    k.aa = alignment(A.ptr, A.ld, es);
    k.ab = alignment(B.ptr, B.ld, es);
    k.ad = alignment(k3_tensor_ptr(y), k.ldc, es);
    k.ac = res ? alignment(k3_tensor_ptr(res), k.ldr, es) : k.ad;
    auto it = t_plans.map.find(k);
    if (it == t_plans.map.end()) {
        if (t_plans.map.size() >= 512) {
            for (auto &kv : t_plans.map) plan_destroy(kv.second);
            t_plans.map.clear();
        }
        plan p;
        K3_TRY(plan_build(ctx, k, &p));
        it = t_plans.map.emplace(k, p).first;
    }
    plan &p = it->second;
    if (!p.ok) return K3_OK;
    if (bias) {
        const void *bp = k3_tensor_ptr(bias);
        K3_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp,
                                                sizeof bp));
    }
    float one = 1.0f, beta = res ? 1.0f : 0.0f;
    const void *cptr = res ? k3_tensor_ptr(res) : k3_tensor_ptr(y);
    cublasStatus_t s = cublasLtMatmul(ctx->lt, p.op, &one, A.ptr, p.a, B.ptr, p.b, &beta, cptr,
                                      p.c, k3_tensor_ptr(y), p.d, &p.algo, ctx->workspace,
                                      ctx->workspace_size, ctx->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
        p.ok = false; /* remember: this shape goes the GemmEx way from now on */
        return K3_OK;
    }
    K3_CHECK(s);
    *done = true;
    return K3_OK;
}

k3_status run_plain(const k3_op_args *oa);

/* A prologue: h [M, K] into a temporary (k3c_prologue_temp; freed stream-ordered after the
 * GEMM is queued on the same stream), then the plain call on h. */
k3_status run_prologue(const k3_op_args *oa) {
    k3c_buffer hbuf;
    k3c_temp_tensor ht;
    K3_TRY(k3c_prologue_temp(&oa->u.linear, hbuf, ht));
    k3_op_args plain = *oa;
    plain.u.linear.x = &ht.t;
    plain.u.linear.prologue = K3_LINEAR_PROLOGUE_NONE;
    plain.u.linear.norm_weight = nullptr;
    return run_plain(&plain);
}

/* The call without an epilogue: with its prologue, or plain. */
k3_status run_product(const k3_op_args *oa) {
    if (oa->u.linear.prologue != K3_LINEAR_PROLOGUE_NONE) return run_prologue(oa);
    return run_plain(oa);
}

k3_status run(const k3_op_args *oa) {
    const k3_linear_args *a = &oa->u.linear;
    char reason[256] = "";
    k3_status st = supports(oa, reason, sizeof reason);
    if (st != K3_OK) return k3_error(st, "linear: %s", reason);
    if (a->epilogue != K3_LINEAR_EPILOGUE_NONE) return k3c_epilogue_temp(oa, run_product);
    return run_product(oa);
}

k3_status run_plain(const k3_op_args *oa) {
    const k3_linear_args *a = &oa->u.linear;
    int64_t M = a->x->size[0], K = a->x->size[1], N = a->w->size[0];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->x), &ctx));
    if (M == 0 || N == 0) return K3_OK;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return k3_error(K3_ESHAPE, "linear: %s supports dims up to %d; got M %lld, N %lld, K %lld",
                        self().name, INT_MAX, (long long)M, (long long)N, (long long)K);
    /* w [N,K] as cuBLAS A (column-major [N,K] after op): row-major w is OP_T. */
    operand A = {nullptr, CUBLAS_OP_N, 1}, B = {nullptr, CUBLAS_OP_N, 1};
    k3c_buffer wbuf, xbuf;
    k3c_temp_tensor wt, xt;
    const k3_tensor *w = a->w, *x = a->x;
    if (K > 0 && !as_operand(w, true, &A)) {
        K3_TRY(contiguous_copy(w, wbuf, wt));
        as_operand(&wt.t, true, &A);
    }
    if (K > 0 && !as_operand(x, false, &B)) {
        K3_TRY(contiguous_copy(x, xbuf, xt));
        as_operand(&xt.t, false, &B);
    }
    if (K > 0 && (A.ld > INT_MAX || B.ld > INT_MAX))
        return k3_error(K3_ESHAPE, "linear: %s: leading dimension above %d", self().name, INT_MAX);
    bool done = false;
    K3_TRY(lt_path(ctx, a, A, B, M, N, K, &done));
    if (done) return K3_OK;
    K3C_DISPATCH_DTYPE(x->dtype, T, K3_TRY(gemmex_path<T>(ctx, a, A, B, M, N, K)));
    return K3_OK;
}

} // namespace

k3_status k3c_prologue_temp(const k3_linear_args *a, k3c_buffer &buf, k3c_temp_tensor &ht) {
    const int64_t M = a->x->size[0], K = a->w->size[1];
    int64_t shape[2] = {M, K};
    const size_t bytes = (size_t)M * (size_t)K * k3_dtype_size(a->x->dtype);
    if (bytes > 0) K3_TRY(buf.alloc(k3c_dev(a->x), bytes));
    k3c_temp_init(&ht, buf.ptr, bytes, k3c_dev(a->x), a->x->dtype, 2, shape);
    if (bytes == 0) return K3_OK;
    k3_op_args op;
    memset(&op, 0, sizeof op);
    if (a->prologue == K3_LINEAR_PROLOGUE_RMS_NORM) {
        op.op = K3_OP_RMS_NORM;
        op.u.rms_norm = (k3_rms_norm_args){a->x, a->norm_weight, a->norm_eps, &ht.t, a->base};
        return k3_cuda_rms_norm_generic.run(&op);
    }
    op.op = K3_OP_SILU_MUL;
    op.u.silu_mul = (k3_silu_mul_args){a->x, &ht.t, a->base};
    return k3_cuda_silu_mul_generic.run(&op);
}

k3_status k3c_epilogue_temp(const k3_op_args *oa, k3_status (*run)(const k3_op_args *)) {
    const k3_linear_args *a = &oa->u.linear;
    const int64_t M = a->x->size[0], N2 = a->w->size[0];
    int64_t shape[2] = {M, N2};
    const size_t bytes = (size_t)M * (size_t)N2 * k3_dtype_size(a->x->dtype);
    k3c_buffer ybuf;
    k3c_temp_tensor yt;
    if (bytes > 0) K3_TRY(ybuf.alloc(k3c_dev(a->x), bytes));
    k3c_temp_init(&yt, ybuf.ptr, bytes, k3c_dev(a->x), a->x->dtype, 2, shape);
    if (bytes == 0) return K3_OK;
    k3_op_args plain = *oa;
    plain.u.linear.out = &yt.t;
    plain.u.linear.epilogue = K3_LINEAR_EPILOGUE_NONE;
    K3_TRY(run(&plain));
    k3_op_args op;
    memset(&op, 0, sizeof op);
    op.op = K3_OP_SILU_MUL;
    op.u.silu_mul = (k3_silu_mul_args){&yt.t, a->out, a->base};
    return k3_cuda_silu_mul_generic.run(&op);
}

extern "C" const k3_kernel k3_cuda_linear_cublas =
    K3_KERNEL_RECORD(k3_cuda_linear_cublas, supports, run);
