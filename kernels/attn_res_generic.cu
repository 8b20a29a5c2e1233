/*
 * attn_res_generic.cu — cuda.attn_res.generic, the AttnRes read for every case of the op
 * (delta write-back, write_block, num_blocks 0..S, output norm or none, any row strides, any
 * hidden size and dtype): the fallback behind the decode and stream kernels.
 */
#include "attn_res.cuh"

using namespace k3ar;

namespace {

const int kGenericThreads = 256;
const int kGenericChunk = 8;      /* sources reduced together */
const int64_t kGenericMaxSources = 4096;

template <class T> struct generic_params {
    T *prefix;
    const T *delta;
    T *blocks;
    T *out;
    const void *nw, *qw, *onw;
    int nw_dt, qw_dt, onw_dt;
    int64_t T_, H, sp, sd, sbt, sbs, so;
    int nb, wb;
    double eps, oeps;
};

template <class A> __device__ __forceinline__ A load_w(const void *p, int dt, int64_t i);
template <> __device__ __forceinline__ float load_w<float>(const void *p, int dt, int64_t i) {
    return k3c_load_any_f32(p, dt, i);
}
template <> __device__ __forceinline__ double load_w<double>(const void *p, int dt, int64_t i) {
    return k3c_load_any_f64(p, dt, i);
}
__device__ __forceinline__ float k3c_rsqrt(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double k3c_rsqrt(double x) { return 1.0 / sqrt(x); }
__device__ __forceinline__ float k3c_exp(float x) { return expf(x); }
__device__ __forceinline__ double k3c_exp(double x) { return exp(x); }

/* The scale-safe norms (attn_res.cuh's ss_needs_rescale, for f32 and f64 accumulators): a sum
 * of squares that overflowed or fell where squared elements may be denormal is recomputed on
 * the values scaled by 2^-e, e the binary exponent of their max magnitude. */
__device__ __forceinline__ bool needs_rescale(float ss) { return ss_needs_rescale(ss); }
__device__ __forceinline__ bool needs_rescale(double ss) { return !(ss <= 1e307) || ss < 0x1p-900; }
__device__ __forceinline__ int exp_of(float m) {
    int e = 0;
    if (m > 0.0f && !isinf(m)) frexpf(m, &e);
    return e;
}
__device__ __forceinline__ int exp_of(double m) {
    int e = 0;
    if (m > 0.0 && !isinf(m)) frexp(m, &e);
    return e;
}
__device__ __forceinline__ float scale2(float v, int e) { return ldexpf(v, e); }
__device__ __forceinline__ double scale2(double v, int e) { return ldexp(v, e); }

/* Sums (MAX: maxima of) N values over the block; every thread gets the totals. scratch holds
 * N * (blockDim.x / 32) values. Contains three barriers. */
template <class A, int N, bool MAX = false> __device__ void block_sum(A (&v)[N], A *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    /* Every warp is done with the shared values read before this sum (racecheck on the H200
     * reported the mix loop's reads against this function's scratch writes). */
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = MAX ? warp_max(v[i]) : warp_sum(v[i]);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < N; i++) scratch[warp * N + i] = v[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) {
        A s = 0;
        for (int w = 0; w < nw; w++) s = MAX ? fmax(s, scratch[w * N + i]) : s + scratch[w * N + i];
        v[i] = s;
    }
    __syncthreads();
}

/* One CTA per token (grid-stride over tokens). Three passes over the token's rows: write p
 * (and the block slot), the logits, then the mix (recomputed for the output norm). Every
 * thread touches the same hidden positions in every pass, so its own writes are what it
 * reads back. */
template <class T>
__global__ void __launch_bounds__(kGenericThreads) attn_res_generic_kernel(generic_params<T> p) {
    typedef typename k3c_acc<T>::type A;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *prob = (A *)smem_raw;                           /* nsrc */
    int nsrc = p.nb + 1;
    A *scratch = prob + ((nsrc + 1) & ~1);             /* keep 8-byte alignment */
    const A invH = (A)1 / (A)p.H;
    for (int64_t t = blockIdx.x; t < p.T_; t += gridDim.x) {
        T *prow = p.prefix + t * p.sp;
        T *brow = p.blocks + t * p.sbt;
        /* p = round(prefix + delta), written back; the block slot. */
        for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
            T pv = prow[d];
            if (p.delta) {
                pv = k3c_store_acc<T>(k3c_load_acc<T>(pv) + k3c_load_acc<T>(p.delta[t * p.sd + d]));
                prow[d] = pv;
            }
            if (p.wb >= 0) brow[(int64_t)p.wb * p.sbs + d] = pv;
        }
        /* Logits, kGenericChunk sources at a time. Source nb is p (the prefix row). One pass
         * gives each source's dot, sum of squares and max |v|; a sum that needs it is redone
         * on the scaled values (rare). */
        for (int s0 = 0; s0 < nsrc; s0 += kGenericChunk) {
            A acc[2 * kGenericChunk], amax[kGenericChunk];
#pragma unroll
            for (int j = 0; j < 2 * kGenericChunk; j++) acc[j] = 0;
#pragma unroll
            for (int j = 0; j < kGenericChunk; j++) amax[j] = 0;
            for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
                A w = load_w<A>(p.nw, p.nw_dt, d) * load_w<A>(p.qw, p.qw_dt, d);
#pragma unroll
                for (int j = 0; j < kGenericChunk; j++) {
                    int s = s0 + j;
                    if (s < nsrc) {
                        const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                        A v = k3c_load_acc<T>(row[d]);
                        acc[2 * j] += v * w;
                        acc[2 * j + 1] += v * v;
                        amax[j] = fmax(amax[j], fabs(v));
                    }
                }
            }
            block_sum<A, 2 * kGenericChunk>(acc, scratch);
            bool redo = false;
#pragma unroll
            for (int j = 0; j < kGenericChunk; j++)
                redo = redo || (s0 + j < nsrc && needs_rescale(acc[2 * j + 1]));
            A epss[kGenericChunk];
#pragma unroll
            for (int j = 0; j < kGenericChunk; j++) epss[j] = (A)p.eps;
            if (redo) { /* uniform: every thread holds the same totals */
                block_sum<A, kGenericChunk, true>(amax, scratch);
                int es[kGenericChunk];
#pragma unroll
                for (int j = 0; j < kGenericChunk; j++) {
                    es[j] = s0 + j < nsrc && needs_rescale(acc[2 * j + 1]) ? exp_of(amax[j]) : 0;
                    epss[j] = scale2((A)p.eps, -2 * es[j]);
                    acc[2 * j] = acc[2 * j + 1] = 0;
                }
                for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
                    A w = load_w<A>(p.nw, p.nw_dt, d) * load_w<A>(p.qw, p.qw_dt, d);
#pragma unroll
                    for (int j = 0; j < kGenericChunk; j++) {
                        int s = s0 + j;
                        if (s < nsrc) {
                            const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                            A v = scale2(k3c_load_acc<T>(row[d]), -es[j]);
                            acc[2 * j] += v * w;
                            acc[2 * j + 1] += v * v;
                        }
                    }
                }
                block_sum<A, 2 * kGenericChunk>(acc, scratch);
            }
            if (threadIdx.x == 0)
#pragma unroll
                for (int j = 0; j < kGenericChunk; j++)
                    if (s0 + j < nsrc)
                        prob[s0 + j] = acc[2 * j] * k3c_rsqrt(acc[2 * j + 1] * invH + epss[j]);
        }
        __syncthreads();
        /* Softmax over the sources (each thread reads all logits; nsrc is small). */
        A mx = -INFINITY, sum = 0;
        for (int s = 0; s < nsrc; s++) mx = fmax(mx, prob[s]);
        for (int s = 0; s < nsrc; s++) sum += k3c_exp(prob[s] - mx);
        __syncthreads();
        /* One source (num_blocks 0): the softmax is exactly one, even for a non-finite logit. */
        for (int s = threadIdx.x; s < nsrc; s += blockDim.x)
            prob[s] = nsrc == 1 ? (A)1 : k3c_exp(prob[s] - mx) / sum;
        __syncthreads();
        /* Mix; with an output norm, first its sum of squares, then the scaled write. */
        T *orow = p.out + t * p.so;
        A sq[1] = {0}, mmax[1] = {0};
        for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
            A m = 0;
            for (int s = 0; s < nsrc; s++) {
                const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                m += prob[s] * k3c_load_acc<T>(row[d]);
            }
            if (p.onw) {
                sq[0] += m * m;
                mmax[0] = fmax(mmax[0], fabs(m));
            } else {
                orow[d] = k3c_store_acc<T>(m);
            }
        }
        if (p.onw) {
            block_sum<A, 1>(sq, scratch);
            int e = 0;
            if (needs_rescale(sq[0])) { /* uniform, as above: the mix scaled by 2^-e */
                block_sum<A, 1, true>(mmax, scratch);
                e = exp_of(mmax[0]);
                sq[0] = 0;
                for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
                    A m = 0;
                    for (int s = 0; s < nsrc; s++) {
                        const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                        m += prob[s] * k3c_load_acc<T>(row[d]);
                    }
                    m = scale2(m, -e);
                    sq[0] += m * m;
                }
                block_sum<A, 1>(sq, scratch);
            }
            A r = k3c_rsqrt(sq[0] * invH + scale2((A)p.oeps, -2 * e));
            for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
                A m = 0;
                for (int s = 0; s < nsrc; s++) {
                    const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                    m += prob[s] * k3c_load_acc<T>(row[d]);
                }
                orow[d] = k3c_store_acc<T>(scale2(m, -e) * r * load_w<A>(p.onw, p.onw_dt, d));
            }
        }
        __syncthreads(); /* prob and scratch are reused by the next token */
    }
}

k3_status generic_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    if (a->num_blocks + 1 > kGenericMaxSources) {
        snprintf(reason, n, "%s supports num_blocks up to %lld; got %lld",
                 k3_cuda_attn_res_generic_name, (long long)(kGenericMaxSources - 1),
                 (long long)a->num_blocks);
        return K3_EINVAL;
    }
    return K3_OK;
}

template <class T> k3_status generic_launch(const k3_attn_res_kargs *ka, cudaStream_t stream) {
    typedef typename k3c_acc<T>::type A;
    const k3_attn_res_args *a = &ka->p;
    generic_params<T> p;
    p.prefix = (T *)k3_tensor_ptr(a->prefix);
    p.delta = a->delta ? (const T *)k3_tensor_ptr(a->delta) : nullptr;
    p.blocks = (T *)k3_tensor_ptr(a->blocks);
    p.out = (T *)k3_tensor_ptr(ka->out);
    p.nw = k3_tensor_ptr(a->norm_weight);
    p.qw = k3_tensor_ptr(a->qk_weight);
    p.onw = a->output_norm_weight ? k3_tensor_ptr(a->output_norm_weight) : nullptr;
    p.nw_dt = a->norm_weight->dtype;
    p.qw_dt = a->qk_weight->dtype;
    p.onw_dt = a->output_norm_weight ? a->output_norm_weight->dtype : 0;
    p.T_ = a->prefix->size[0];
    p.H = a->prefix->size[1];
    p.sp = a->prefix->stride[0];
    p.sd = a->delta ? a->delta->stride[0] : 0;
    p.sbt = a->blocks->stride[0];
    p.sbs = a->blocks->stride[1];
    p.so = ka->out->stride[0];
    p.nb = (int)a->num_blocks;
    p.wb = (int)a->write_block;
    p.eps = a->eps;
    p.oeps = a->output_eps;
    int nsrc = p.nb + 1;
    size_t smem = (size_t)(((nsrc + 1) & ~1) + 2 * kGenericChunk * (kGenericThreads / 32)) * sizeof(A);
    unsigned grid = (unsigned)(p.T_ < (1 << 20) ? p.T_ : (1 << 20));
    attn_res_generic_kernel<T><<<grid, kGenericThreads, smem, stream>>>(p);
    K3_CHECK_LAUNCH(attn_res_generic_kernel);
    return K3_OK;
}

k3_status generic_run(const k3_op_args *oa) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    char reason[256] = "";
    k3_status s = generic_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    int64_t T = ka->p.prefix->size[0], H = ka->p.prefix->size[1];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(ka->p.prefix), &ctx));
    if (T == 0) return K3_OK;
    if (H == 0) return K3_OK; /* nothing to read or write: every row is empty */
    K3C_DISPATCH_DTYPE(ka->p.prefix->dtype, TT, K3_TRY(generic_launch<TT>(ka, ctx->stream)));
    return K3_OK;
}

} // namespace

extern "C" const k3_kernel k3_cuda_attn_res_generic =
    K3_KERNEL_RECORD(k3_cuda_attn_res_generic, generic_supports, generic_run);
