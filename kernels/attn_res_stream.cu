/*
 * attn_res_stream.cu — cuda.attn_res.stream, the prefill AttnRes read (T >= 64 tokens) on
 * densely packed bf16/f16 rows with delta and output norm, num_blocks 1..8, hidden sizes up
 * to 8192 (64..512 threads of two 16-byte vectors each: stream_threads). In the default
 * policy it follows cuda.attn_res.ring, which takes the same calls faster (notes/PERF.md,
 * 2026-12-07): it serves them where the ring is not registered, and by name.
 *
 * A persistent grid of one CTA per SM, grid-striding over tokens, one token per CTA at a time,
 * no clusters. Thread tid owns the vectors vi = k * NT + tid (k < 2) of every row.
 *
 * Staging. The token's rows (prefix, delta, the nb block rows) are copied by cp.async into
 * dynamic shared memory; each thread copies exactly the slots it later reads itself, so no
 * barrier guards the staging (cp.async.wait_group makes a thread's own copies visible to
 * it). After moving token t's slots into registers the thread at once issues the copies of
 * token t + grid into the same slots, so DRAM keeps streaming while token t is reduced,
 * mixed and written.
 *
 * Weights. Once per CTA each thread writes, as f32 after the stage, the product of the key
 * norm and query weights (nw * qw) and the output norm weight of its own vectors; only that
 * thread reads them (no barrier), so a token costs no weight load or conversion.
 *
 * Reductions: two per token, each one barrier. The logits: every source's dot with nw * qw
 * and sum of squares (2 (nb + 1) partials per thread) are reduced within the warp by
 * spread_step (about one shuffle per partial), stored per warp in red; after the barrier lane
 * s of every warp sums source s's pair over the warps in warp order, computes its logit, and
 * the softmax runs across the lanes. The output norm: the mix's sum of squares per warp in
 * red2, after the barrier lane q reads warp q's and one warp sum gives the total. Every warp
 * reads the same partials in the same order, so all threads hold the same bits and take the
 * same branches. A thread reads red before it reaches the output barrier and red2 before the
 * next token's logit barrier, so no write overtakes a read.
 *
 * Scale. The key and output norms hold at any scale: a sum of squares that overflowed or
 * underflowed is recomputed on values scaled by a power of two (the key norms by
 * stream_rescale_partials, out of line so the common path keeps its registers; the output
 * norm by block_max_sum).
 *
 * Instances: one per dtype pair for NB = 8 block slots (nb <= 8 at run time, idle slots and
 * idle vectors predicated off), and a full-token one where num_blocks is 8 and every thread's
 * two vectors are in the row (H = 16 * NT, e.g. 7168 at 448 threads), whose predicates are
 * compile-time facts.
 *
 * Registers: 128 per thread (__maxnreg__). An SM's 65536 registers are four partitions of
 * 16384, one per warp scheduler, and a CTA's warps are dealt over the four; a CTA of 13..16
 * warps (448 threads at H = 7168, up to 512) puts four warps on some partition, so
 * 4 x 32 x 128 = 16384 is the most a thread may hold. 65536 / 448 (144, rounded to 8) would
 * fit the SM but not a partition: such a CTA fails to launch (cudaErrorLaunchOutOfResources
 * on the H200). Shared memory and ptxas's figures: see stream_smem.
 */
#include "attn_res.cuh"

using namespace k3ar;

namespace {

/* u, as a value the compiler cannot prove equal to u: the mix unpacks the staged words again
 * instead of keeping the logit pass's 16 floats per row alive across the reductions (which
 * spills the bf16 instances). */
__device__ __forceinline__ uint4 opaque(uint4 u) {
    asm("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w));
    return u;
}

const int kStreamNB = 8; /* block slots of every instance (num_blocks <= 8) */
const int64_t kStreamMinT = 64;

struct stream_params : row_args {
    int64_t T;
    int pdl;
};

/* Issues the copies of token t's rows into this thread's slots: slot (r, k) of thread tid
 * is stage[(r * V + k) * NT + tid]; row 0 prefix, 1 delta, 2.. the block rows. */
template <int NB, int V>
__device__ __forceinline__ void stream_issue(const stream_params &p, uint4 *stage, int64_t t,
                                             const int (&vi)[V], const bool (&ok)[V], int nb) {
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
            if (s < nb && ok[k])
                cp_async16(&stage[((2 + s) * V + k) * NT + tid],
                           blocks + s * p.sbs + (int64_t)vi[k] * 8);
    cp_async_commit();
}

/*
 * The rare path of the logits (some source's sum of squares overflowed or underflowed, bits
 * of `needs`): every source's dot and sum of squares again on its values scaled by 2^-e, e
 * from the source's max magnitude (0 for a source whose sums were fine, which leaves them
 * as they were). Not inlined, and working from the token's rows in global memory (p as this
 * thread wrote it back, the block rows; both L1/L2 resident) one source at a time, so the
 * common path keeps its 128 registers and no array of it is passed by address. On return,
 * red[w][2s], red[w][2s + 1] hold warp w's scaled dot and sum of squares of source s (slot
 * nb is p) and redm[w][s] its max magnitude, behind a barrier. Every thread has read red
 * before the call.
 */
template <class T, class W>
__device__ __noinline__ void stream_rescale_partials(const T *prow, const T *brow, int64_t sbs,
                                                     const void *nw, const void *qw, int vecs,
                                                     int nb, uint32_t needs, float *red, int ldr,
                                                     float *redm, int ldm) {
    const int NT = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5,
              nwarps = NT >> 5;
    __syncthreads();
    for (int s = 0; s <= nb; s++) {
        const T *row = s == nb ? prow : brow + s * sbs;
        float am = 0.0f;
        for (int k = 0; k < kStreamV; k++) {
            int vi = k * NT + tid;
            if (vi >= vecs) continue;
            float v[8];
            vec8<T>::unpack(*(const uint4 *)(row + (int64_t)vi * 8), v);
#pragma unroll
            for (int e = 0; e < 8; e++) am = fmaxf(am, fabsf(v[e]));
        }
        am = k3c_warp_max(am);
        if (lane == 0) redm[warp * ldm + s] = am;
    }
    __syncthreads();
    for (int s = 0; s <= nb; s++) {
        const T *row = s == nb ? prow : brow + s * sbs;
        float am = 0.0f;
        for (int q = 0; q < nwarps; q++) am = fmaxf(am, redm[q * ldm + s]);
        const pow2_scale ps((needs >> (s == nb ? kStreamNB : s)) & 1u ? scale_exp(am) : 0);
        float dot = 0.0f, ss = 0.0f;
        for (int k = 0; k < kStreamV; k++) {
            int vi = k * NT + tid;
            if (vi >= vecs) continue;
            float v[8], x[8], y[8];
            wload<T, W>(nw, (int64_t)vi * 8, x);
            wload<T, W>(qw, (int64_t)vi * 8, y);
            vec8<T>::unpack(*(const uint4 *)(row + (int64_t)vi * 8), v);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float z = ps(v[e]);
                dot = fmaf(z, x[e] * y[e], dot);
                ss = fmaf(z, z, ss);
            }
        }
        dot = k3c_warp_sum(dot);
        ss = k3c_warp_sum(ss);
        if (lane == 0) red[warp * ldr + 2 * s] = dot, red[warp * ldr + 2 * s + 1] = ss;
    }
    __syncthreads();
}

/* The kernel's registers per thread: see the file's header. */
const int kStreamRegs = 128;
static_assert((kStreamMaxThreads / 32 + 3) / 4 * 32 * kStreamRegs <= 16384,
              "a register partition holds the warps the largest CTA puts on it");

template <class T, class W, int NB, int V, bool FULL>
__global__ void __maxnreg__(kStreamRegs) attn_res_stream_kernel(const stream_params p) {
    constexpr int MAXS = NB + 1;
    constexpr int NV = 2 * MAXS;
    constexpr int NVP = (NV + 3) & ~3;
    static_assert(NB == kStreamNB, "stream_rescale_partials numbers p's bit as kStreamNB");
    static_assert(MAXS <= 32, "the softmax gives each source a lane");
    extern __shared__ __align__(16) uint4 stage[];
    /* The weights, f32, slot (j, h) of thread tid at wsm[(j * 2 + h) * NT + tid]: j < V the
     * product nw * qw of vector j, j >= V the output norm weight of vector j - V. */
    float4 *wsm = (float4 *)(stage + (2 + NB) * V * blockDim.x);
    __shared__ __align__(16) float red[kStreamMaxThreads / 32][NVP];
    __shared__ float red2[kStreamMaxThreads / 32];
    __shared__ float redm[kStreamMaxThreads / 32][MAXS]; /* the rare path's maxima */

    const int NT = blockDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = NT >> 5;
    int vi[V];
    bool ok[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        vi[k] = k * NT + tid;
        ok[k] = FULL || vi[k] < p.vecs;
    }
    /* FULL: the host checked num_blocks == NB and H == 8 * V * NT (every slot used). */
    const int nb = FULL ? NB : p.nb;
    int64_t t = blockIdx.x;
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }
    if (t < p.T) stream_issue<NB, V>(p, stage, t, vi, ok, nb);
    /* This thread's weight slots, once per CTA; only this thread reads them (no barrier). */
#pragma unroll
    for (int k = 0; k < V; k++)
        if (ok[k]) {
            float x[8], y[8];
            wload<T, W>(p.nw, (int64_t)vi[k] * 8, x);
            wload<T, W>(p.qw, (int64_t)vi[k] * 8, y);
#pragma unroll
            for (int e = 0; e < 8; e++) x[e] *= y[e];
            wsm[(2 * k) * NT + tid] = make_float4(x[0], x[1], x[2], x[3]);
            wsm[(2 * k + 1) * NT + tid] = make_float4(x[4], x[5], x[6], x[7]);
            wload<T, W>(p.onw, (int64_t)vi[k] * 8, y);
            wsm[(2 * (V + k)) * NT + tid] = make_float4(y[0], y[1], y[2], y[3]);
            wsm[(2 * (V + k) + 1) * NT + tid] = make_float4(y[4], y[5], y[6], y[7]);
        }
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
                src[s][k] = (s < nb && ok[k]) ? stage[((2 + s) * V + k) * NT + tid]
                                                : make_uint4(0, 0, 0, 0);
        /* The next token into the same slots: this thread has read them all above. */
        const int64_t tn = t + gridDim.x;
        if (tn < p.T) stream_issue<NB, V>(p, stage, tn, vi, ok, nb);

        /* prefix += delta, written back; then every source's dot and sum of squares. */
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
            const float4 lo = wsm[(2 * k) * NT + tid], hi = wsm[(2 * k + 1) * NT + tid];
            w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w;
            w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
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
        /* The 2 MAXS partials of each warp in ~NV shuffles (spread_step), then lane s of
         * every warp adds source s's dot and sum of squares over the warps, computes its
         * logit, and the softmax runs across those lanes. */
        warp_totals<false>(part, red[warp], lane);
        __syncthreads();
        float prob[MAXS];
        {
            const int s = lane < MAXS ? lane : 0; /* lanes past the sources mirror source 0 */
            const bool active = lane < MAXS && (lane == NB || lane < nb);
            float dot = 0.0f, ss = 0.0f;
            for (int q = 0; q < nwarps; q++) {
                const float2 x = *(const float2 *)&red[q][2 * s];
                dot += x.x;
                ss += x.y;
            }
            /* Bit s: source s's sum of squares overflowed or underflowed (p is bit NB). */
            const uint32_t needs = __ballot_sync(0xffffffffu, active && ss_needs_rescale(ss));
            float logit;
            if (!needs) {
                logit = active ? dot * rsqrt_normal(ss * p.invH + p.eps) : -INFINITY;
            } else {
                /* Rare: the partials again on scaled values; source s's sums sit at slot s of
                 * the helper's numbering, p's at nb. */
                stream_rescale_partials<T, W>(prefix, (const T *)p.blocks + t * p.sbt, p.sbs,
                                              p.nw, p.qw, p.vecs, nb, needs, &red[0][0], NVP,
                                              &redm[0][0], MAXS);
                const int q = s == NB ? nb : s;
                float d2 = 0.0f, s2 = 0.0f, am = 0.0f;
                for (int w = 0; w < nwarps; w++) {
                    d2 += red[w][2 * q];
                    s2 += red[w][2 * q + 1];
                    am = fmaxf(am, redm[w][q]);
                }
                const int e = (needs >> lane) & 1u ? scale_exp(am) : 0;
                logit = active ? d2 * rms_factor_scaled(s2, p.invH, p.eps, e) : -INFINITY;
            }
            const float mx = k3c_warp_max(logit);
            const float ex = active ? __expf(logit - mx) : 0.0f;
            const float pl = ex * (1.0f / k3c_warp_sum(ex));
#pragma unroll
            for (int q = 0; q < MAXS; q++) prob[q] = __shfl_sync(0xffffffffu, pl, q);
        }
        /* The mix, from fresh unpacks of the staged words (opaque). */
        float m[V][8];
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++) {
            float a[8];
            vec8<T>::unpack(opaque(pb[k]), a);
            const float pr_p = prob[NB];
#pragma unroll
            for (int e = 0; e < 8; e++) m[k][e] = pr_p * a[e];
#pragma unroll
            for (int s = 0; s < NB; s++) {
                float v[8];
                vec8<T>::unpack(opaque(src[s][k]), v);
                const float pr_s = prob[s];
#pragma unroll
                for (int e = 0; e < 8; e++) m[k][e] = fmaf(pr_s, v[e], m[k][e]);
            }
#pragma unroll
            for (int e = 0; e < 8; e++) sq = fmaf(m[k][e], m[k][e], sq);
        }
        const float r = block_rms_factor<V>(m, sq, red2, p.invH, p.oeps);
        T *out = (T *)p.out + t * p.H;
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (!ok[k]) continue;
            const float4 lo = wsm[(2 * (V + k)) * NT + tid], hi = wsm[(2 * (V + k) + 1) * NT + tid];
            const float on[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            float o[8];
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = m[k][e] * r * on[e];
            *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(o);
        }
    }
    cp_async_wait_all(); /* nothing outstanding at exit */
}

/* Dynamic shared memory: the stage, 2 + NB rows of V vectors per thread, and the weights, 4 V
 * float4 per thread: (2 + 8 + 4) * 2 * NT * 16 B, 196 KB at H = 7168 (NT = 448), 224 KB at
 * H = 8192 (NT = 512), plus 1920 B static, under the 227 KB a CTA may hold: one CTA per SM.
 * nvcc 13.0, sm_90a, -Xptxas -v: every instance 128 registers, 1920 B static shared memory,
 * 24-64 B of spills (the full-token ones 24-48 B). */
size_t stream_smem(int nt) {
    return ((size_t)(2 + kStreamNB) + 4) * kStreamV * (size_t)nt * sizeof(uint4);
}

k3_status stream_go(void (*kern)(stream_params), const stream_params &p, int nt, int dev,
                    size_t (&raised)[64], cudaStream_t stream) {
    const size_t smem = stream_smem(nt);
    K3_TRY(raise_smem(kern, dev, smem, raised));
    int sms = k3c_sm_count(dev);
    if (sms <= 0) sms = 132;
    int64_t grid = p.T < sms ? p.T : sms;
    K3_TRY(launch(kern, p, dim3((unsigned)grid), dim3((unsigned)nt), smem, 1, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_stream_kernel);
    return K3_OK;
}

/* The full-token instance when num_blocks is NB and every thread's V vectors are in the row,
 * else the general one. Each instance's dynamic limit is raised once per device. */
template <class T, class W>
k3_status stream_launch(const stream_params &p, int nt, int dev, cudaStream_t stream) {
    static size_t raised[2][64];
    if (p.nb == kStreamNB && p.vecs == kStreamV * nt)
        return stream_go(attn_res_stream_kernel<T, W, kStreamNB, kStreamV, true>, p, nt, dev,
                         raised[0], stream);
    return stream_go(attn_res_stream_kernel<T, W, kStreamNB, kStreamV, false>, p, nt, dev,
                     raised[1], stream);
}

k3_status stream_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    const char *K = k3_cuda_attn_res_stream_name;
    K3_TRY(check_rules(K, oa, call_rules{kStreamMinT, 0, true, 1, kStreamNB}, reason, n));
    if (!stream_threads(a->prefix->size[1])) {
        /* the least H: H / 8 vectors over more than 32 threads, rounded up to 64 of them */
        snprintf(reason, n, "%s supports hidden sizes %d..%d; got %lld", K, 8 * (kStreamV * 32 + 1),
                 8 * kStreamV * kStreamMaxThreads, (long long)a->prefix->size[1]);
        return K3_ESHAPE;
    }
    return K3_OK;
}

k3_status stream_run(const k3_op_args *oa) {
    char reason[256] = "";
    k3_status s = stream_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    int dev = k3c_dev(a->prefix);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx));
    stream_params q;
    fill_row_args(q, oa);
    q.T = a->prefix->size[0];
    q.pdl = get_knobs().pdl;
    int snt = stream_threads(q.H);
    return by_types(a, [&](auto t, auto w) {
        return stream_launch<typename decltype(t)::type, typename decltype(w)::type>(q, snt, dev,
                                                                                     ctx->stream);
    });
}

} // namespace

extern "C" const k3_kernel k3_cuda_attn_res_stream =
    K3_KERNEL_RECORD(k3_cuda_attn_res_stream, stream_supports, stream_run);
