/*
 * attn_res_stream.cu — cuda.attn_res.stream, the prefill AttnRes read (T >= 64 tokens) on
 * densely packed bf16/f16 rows with delta and output norm, num_blocks 1..8: one CTA per SM
 * streams tokens through shared memory so that the next token's rows are in flight while
 * the current one is reduced and written.
 */
#include "attn_res.cuh"

using namespace k3ar;

namespace {

/* 8 weights at element offset e as f32. */
template <class T, class W>
__device__ __forceinline__ void wload(const void *p, int64_t e, float (&f)[8]) {
    wvec<T, W> w;
    w.load(p, e);
    w.get(f);
}

/*
 * A persistent grid of one CTA per SM, grid-striding over tokens, one token per CTA at a time,
 * no clusters. Thread tid owns the 16-byte vectors vi = k*NT + tid (k < 2) of every row. The
 * token's rows (prefix, delta, the nb block rows) are staged in dynamic shared memory by
 * cp.async; each thread copies exactly the slots it later reads itself, so no barrier guards
 * the staging (cp.async.wait_group makes a thread's own copies visible to it). After moving
 * token t's slots into registers the thread at once issues the copies of token t + grid
 * into the same slots, so DRAM keeps streaming while token t is reduced, mixed and written.
 * Two block reductions per token (logit sums, then the output sum of squares), each one
 * barrier, on two scratch arrays: a thread reads red[0] before it reaches reduction 2's
 * barrier and red[1] before the next token's reduction-1 barrier, so no write overtakes a
 * read. Weights are re-read per token through the read-only path (L1/L2 resident).
 * Registers: see the comment at stream_launch (nvcc -Xptxas -v).
 */
const int kStreamMaxThreads = 512;
const int kStreamV = 2;
const int64_t kStreamMinT = 64;

struct stream_params {
    void *prefix;
    const void *delta;
    const void *blocks;
    void *out;
    const void *nw, *qw, *onw;
    int64_t sbt, sbs, H, T;
    int vecs, nb, pdl;
    float eps, oeps, invH;
};

/* Issues the copies of token t's rows into this thread's slots: slot (r, k) of thread tid
 * is stage[(r * V + k) * NT + tid]; row 0 prefix, 1 delta, 2.. the block rows. */
template <int NB, int V>
__device__ __forceinline__ void stream_issue(const stream_params &p, uint4 *stage, int64_t t,
                                             const int (&vi)[V], const bool (&ok)[V]) {
    const int NT = blockDim.x, tid = threadIdx.x;
    const uint16_t *prefix = (const uint16_t *)p.prefix + t * p.H;
    const uint16_t *delta = (const uint16_t *)p.delta + t * p.H;
    const uint16_t *blocks = (const uint16_t *)p.blocks + t * p.sbt;
#pragma unroll
    for (int k = 0; k < V; k++)
        if (ok[k]) {
            cp_async16(&stage[(0 * V + k) * NT + tid], prefix + (int64_t)vi[k] * 8);
            cp_async16(&stage[(1 * V + k) * NT + tid], delta + (int64_t)vi[k] * 8);
        }
#pragma unroll
    for (int s = 0; s < NB; s++)
#pragma unroll
        for (int k = 0; k < V; k++)
            if (s < p.nb && ok[k])
                cp_async16(&stage[((2 + s) * V + k) * NT + tid],
                           blocks + s * p.sbs + (int64_t)vi[k] * 8);
    cp_async_commit();
}

template <class T, class W, int NB, int V>
__global__ void __launch_bounds__(kStreamMaxThreads, 1)
    attn_res_stream_kernel(const stream_params p) {
    constexpr int MAXS = NB + 1;
    constexpr int NV = 2 * MAXS;
    constexpr int NVP = (NV + 3) & ~3;
    extern __shared__ __align__(16) uint4 stage[];
    __shared__ __align__(16) float red[kStreamMaxThreads / 32][NVP];
    __shared__ float red2[kStreamMaxThreads / 32];

    const int NT = blockDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = NT >> 5;
    int vi[V];
    bool ok[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        vi[k] = k * NT + tid;
        ok[k] = vi[k] < p.vecs;
    }
    int64_t t = blockIdx.x;
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }
    if (t < p.T) stream_issue<NB, V>(p, stage, t, vi, ok);
    for (; t < p.T; t += gridDim.x) {
        cp_async_wait_all();
        uint4 pr[V], de[V], src[NB][V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            /* Slots never copied (idle vectors, s >= nb) are never read: zeros instead. */
            pr[k] = ok[k] ? stage[(0 * V + k) * NT + tid] : make_uint4(0, 0, 0, 0);
            de[k] = ok[k] ? stage[(1 * V + k) * NT + tid] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < NB; s++)
#pragma unroll
            for (int k = 0; k < V; k++)
                src[s][k] = (s < p.nb && ok[k]) ? stage[((2 + s) * V + k) * NT + tid]
                                                : make_uint4(0, 0, 0, 0);
        /* The next token into the same slots: this thread has read them all above. */
        const int64_t tn = t + gridDim.x;
        if (tn < p.T) stream_issue<NB, V>(p, stage, tn, vi, ok);

        T *prefix = (T *)p.prefix + t * p.H;
        float part[NV];
#pragma unroll
        for (int i = 0; i < NV; i++) part[i] = 0.0f;
        uint4 pb[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            float a[8], b[8], w[8];
            pb[k] = make_uint4(0, 0, 0, 0);
            if (!ok[k]) continue; /* idle slots add nothing to any sum */
            {
                float x[8], y[8];
                wload<T, W>(p.nw, (int64_t)vi[k] * 8, x);
                wload<T, W>(p.qw, (int64_t)vi[k] * 8, y);
#pragma unroll
                for (int e = 0; e < 8; e++) w[e] = x[e] * y[e];
            }
            vec8<T>::unpack(pr[k], a);
            vec8<T>::unpack(de[k], b);
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] += b[e];
            pb[k] = pack8<T>(a);
            *(uint4 *)(prefix + (int64_t)vi[k] * 8) = pb[k];
            vec8<T>::unpack(pb[k], a);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                part[2 * NB] = fmaf(a[e], w[e], part[2 * NB]);
                part[2 * NB + 1] = fmaf(a[e], a[e], part[2 * NB + 1]);
            }
#pragma unroll
            for (int s = 0; s < NB; s++) {
                float v[8];
                vec8<T>::unpack(src[s][k], v);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    part[2 * s] = fmaf(v[e], w[e], part[2 * s]);
                    part[2 * s + 1] = fmaf(v[e], v[e], part[2 * s + 1]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < NV; i++) part[i] = warp_sum(part[i]);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < NV; i++) red[warp][i] = part[i];
        __syncthreads();
        float tot[NVP];
#pragma unroll
        for (int i = 0; i < NVP; i++) tot[i] = 0.0f;
        for (int q = 0; q < nwarps; q++) {
            const float4 *r4 = (const float4 *)red[q];
#pragma unroll
            for (int j = 0; j < NVP / 4; j++) {
                float4 x = r4[j];
                tot[4 * j] += x.x;
                tot[4 * j + 1] += x.y;
                tot[4 * j + 2] += x.z;
                tot[4 * j + 3] += x.w;
            }
        }
        float logit[MAXS], mx = -INFINITY;
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            bool active = s == NB || s < p.nb;
            logit[s] = active ? tot[2 * s] * (1.0f / sqrtf(tot[2 * s + 1] * p.invH + p.eps)) : -INFINITY;
            mx = fmaxf(mx, logit[s]);
        }
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            bool active = s == NB || s < p.nb;
            logit[s] = active ? expf(logit[s] - mx) : 0.0f;
            sum += logit[s];
        }
        const float inv_sum = 1.0f / sum;
        float m[V][8];
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++) {
            float a[8];
            vec8<T>::unpack(pb[k], a);
            const float pr_p = logit[NB] * inv_sum;
#pragma unroll
            for (int e = 0; e < 8; e++) m[k][e] = pr_p * a[e];
#pragma unroll
            for (int s = 0; s < NB; s++) {
                float v[8];
                vec8<T>::unpack(src[s][k], v);
                const float pr_s = logit[s] * inv_sum;
#pragma unroll
                for (int e = 0; e < 8; e++) m[k][e] = fmaf(pr_s, v[e], m[k][e]);
            }
#pragma unroll
            for (int e = 0; e < 8; e++) sq = fmaf(m[k][e], m[k][e], sq);
        }
        sq = warp_sum(sq);
        if (lane == 0) red2[warp] = sq;
        __syncthreads();
        float total = 0.0f;
        for (int q = 0; q < nwarps; q++) total += red2[q];
        const float r = 1.0f / sqrtf(total * p.invH + p.oeps);
        T *out = (T *)p.out + t * p.H;
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (!ok[k]) continue;
            float on[8], o[8];
            wload<T, W>(p.onw, (int64_t)vi[k] * 8, on);
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = m[k][e] * r * on[e];
            *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(o);
        }
    }
    cp_async_wait_all(); /* nothing outstanding at exit */
}

/* Threads per CTA (two vectors each), or 0 when H / 8 vectors do not fit 64..512 of them. */
int stream_threads(int64_t H) {
    int64_t vecs = H / 8;
    int64_t nt = ((vecs + kStreamV - 1) / kStreamV + 31) / 32 * 32;
    if (nt < 64 || nt > kStreamMaxThreads) return 0;
    return (int)nt;
}

/* nvcc 13, sm_90a, -Xptxas -v: every instance (bf16/f16 x bf16/f16/f32 weights, NB = 8,
 * V = 2) uses 128 registers (the __launch_bounds__(512, 1) cap), 0 bytes stack, no spills;
 * 1344 B static + (2 + 8) * 2 * NT * 16 B dynamic shared memory (143 KB at H = 7168, NT =
 * 448), so one CTA of 448 threads per SM (57344 of 65536 registers). */
template <class T, class W>
k3_status stream_launch(const stream_params &p, int nt, int dev, cudaStream_t stream) {
    auto kern = attn_res_stream_kernel<T, W, 8, kStreamV>;
    size_t smem = (size_t)(2 + 8) * kStreamV * (size_t)nt * sizeof(uint4);
    /* Raise the dynamic limit once per device (up to 160 KB for H = 8192). */
    static int raised[64];
    if (dev < 0 || dev >= 64 || !raised[dev]) {
        K3_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
        if (dev >= 0 && dev < 64) raised[dev] = 1;
    }
    int sms = k3c_sm_count(dev);
    if (sms <= 0) sms = 132;
    int64_t grid = p.T < sms ? p.T : sms;
    K3_TRY(launch(kern, p, dim3((unsigned)grid), dim3((unsigned)nt), smem, 1, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_stream_kernel);
    return K3_OK;
}

k3_status stream_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    const char *K = "cuda.attn_res.stream";
    int64_t T = a->prefix->size[0], H = a->prefix->size[1];
    if (T < kStreamMinT) {
        snprintf(reason, n, "%s serves T >= %lld tokens; got T = %lld", K,
                 (long long)kStreamMinT, (long long)T);
        return K3_ESHAPE;
    }
    if (!a->delta) {
        snprintf(reason, n, "%s requires delta", K);
        return K3_EINVAL;
    }
    if (!a->output_norm_weight) {
        snprintf(reason, n, "%s requires output_norm_weight", K);
        return K3_EINVAL;
    }
    if (a->num_blocks < 1 || a->num_blocks > 8) {
        snprintf(reason, n, "%s requires num_blocks in 1..8; got %lld", K, (long long)a->num_blocks);
        return K3_EINVAL;
    }
    if (a->write_block >= 0) {
        snprintf(reason, n, "%s does not write blocks (write_block %lld)", K,
                 (long long)k3_based(a->write_block, 1));
        return K3_EINVAL;
    }
    K3_TRY(fast_path_checks(K, oa, reason, n));
    if (!stream_threads(H)) {
        snprintf(reason, n, "%s supports hidden sizes %d..%d; got %lld", K, 8 * 2 * 64,
                 8 * kStreamV * kStreamMaxThreads, (long long)H);
        return K3_ESHAPE;
    }
    return K3_OK;
}

k3_status stream_run(const k3_op_args *oa) {
    K3_TRY(check_args(&k3_cuda_attn_res_stream, oa));
    char reason[256] = "";
    k3_status s = stream_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    int64_t T_ = a->prefix->size[0], H = a->prefix->size[1];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->prefix), &ctx));
    stream_params q;
    q.prefix = k3_tensor_ptr(a->prefix);
    q.delta = k3_tensor_ptr(a->delta);
    q.blocks = k3_tensor_ptr(a->blocks);
    q.out = k3_tensor_ptr(ka->out);
    q.nw = k3_tensor_ptr(a->norm_weight);
    q.qw = k3_tensor_ptr(a->qk_weight);
    q.onw = k3_tensor_ptr(a->output_norm_weight);
    q.sbt = a->blocks->stride[0];
    q.sbs = a->blocks->stride[1];
    q.H = H;
    q.T = T_;
    q.vecs = (int)(H / 8);
    q.nb = (int)a->num_blocks;
    q.pdl = get_knobs().pdl;
    q.eps = (float)a->eps;
    q.oeps = (float)a->output_eps;
    q.invH = 1.0f / (float)H;
    int dev = k3c_dev(a->prefix);
    int snt = stream_threads(H);
    bool wf32 = a->norm_weight->dtype == K3_DTYPE_F32;
    if (a->prefix->dtype == K3_DTYPE_BF16)
        return wf32 ? stream_launch<k3c_bf16, float>(q, snt, dev, ctx->stream)
                    : stream_launch<k3c_bf16, k3c_bf16>(q, snt, dev, ctx->stream);
    return wf32 ? stream_launch<k3c_f16, float>(q, snt, dev, ctx->stream)
                : stream_launch<k3c_f16, k3c_f16>(q, snt, dev, ctx->stream);
}

} // namespace

extern "C" const k3_kernel k3_cuda_attn_res_stream = {"cuda.attn_res.stream", K3_OP_ATTN_RES,
                                                      K3_DEVICE_CUDA, stream_supports, stream_run};
