/*
 * attn_res_packed.cu — cuda.attn_res.packed, the decode AttnRes read (T <= 64) with delta and
 * the output norm, num_blocks 1..16 and no block write, on densely packed bf16/f16 rows: one
 * token is a cluster of up to 8 CTAs (7 at H = 7168) that read prefix, delta and the blocks
 * once, all loads in flight at once, and exchange partial sums through distributed shared
 * memory; a token costs one memory round trip plus two cluster barriers. No PDL. The reads it
 * declines (no delta, a fused seal, num_blocks 0, no output norm) go to cuda.attn_res.decode.
 * Measured against that kernel in one run on the H200 (2026-12-01, notes/PERF.md): 5.17 µs at
 * T = 1, num_blocks 1 and 5.96 at num_blocks 8 (decode: 3.64, 8.09).
 */
#include "attn_res.cuh"

#include <limits.h>

using namespace k3ar;

namespace {

const int kMaxThreads = 512;
const int64_t kMaxTokens = 64;

struct packed_params : row_args {
    int ctas; /* CTAs per token */
};

/*
 * The rare path's exchange (a sum of squares that overflowed or underflowed): sums (MAX:
 * maxima of non-negative values) of N values over the token, the warps of this CTA and then
 * the C CTAs through buf, which no exchange before has written; ends with a cluster barrier
 * (C > 1) or a block barrier. Every thread gets the totals, added in rank order, so every
 * CTA holds the same bits and takes the same branches. red's last readers have passed a
 * barrier (every exchange ends with one).
 */
template <int N, bool MAX, int NP>
__device__ __forceinline__ void rare_exchange(float (&v)[N], float (*red)[NP], float (*buf)[NP],
                                              int C, uint32_t rank) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = MAX ? warp_max(v[i]) : warp_sum(v[i]);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < N; i++) red[warp][i] = v[i];
    __syncthreads();
    for (int k = tid; k < N * C; k += blockDim.x) {
        int item = k % N, dest = k / N;
        float s = 0.0f;
        for (int q = 0; q < nwarps; q++) s = MAX ? fmaxf(s, red[q][item]) : s + red[q][item];
        if (C > 1)
            st_cluster(&buf[rank][item], (uint32_t)dest, s);
        else
            buf[0][item] = s;
    }
    if (C > 1) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < N; i++) {
        float s = 0.0f;
        for (int c = 0; c < C; c++) s = MAX ? fmaxf(s, buf[c][i]) : s + buf[c][i];
        v[i] = s;
    }
}

/*
 * One token per cluster of p.ctas CTAs (C = 1 runs without a cluster); thread `tid` of CTA
 * `rank` owns the 16-byte vectors vi = k*C*NT + rank*NT + tid (k < V) of every row.
 *  1. issue every load: prefix, delta, the nb block rows, the weights;
 *  2. p = round(prefix + delta), written back; per-source partial dot and sum of squares;
 *  3. CTA sums, pushed into every CTA of the cluster (DSM), cluster barrier;
 *  4. logits and softmax (every thread, redundantly), the mix in registers, its partial
 *     sum of squares exchanged the same way, then the normed output stored.
 * A sum of squares that overflowed or underflowed (a key's or the output's) is recomputed on
 * the values scaled by a power of two near their max magnitude, through exchanges of its own
 * (rare_exchange), so the norms hold at any scale; the common path pays only the test.
 * Source slot MAXS-1 is p, so every register array is indexed by compile-time constants.
 */
template <class T, class W, int MAXS, int V>
__global__ void __launch_bounds__(kMaxThreads) attn_res_packed_kernel(const packed_params p) {
    constexpr int NB = MAXS - 1;
    constexpr int NV = 2 * MAXS;
    constexpr int NVP = (NV + 3) & ~3;
    __shared__ __align__(16) float red[kMaxThreads / 32][NVP];
    __shared__ __align__(16) float recv[8][NVP];
    __shared__ float red2[kMaxThreads / 32];
    __shared__ float recv2[8];
    /* The rare exchanges: key max |v|, key sums, output max |v|, output sum of squares. */
    __shared__ __align__(16) float recv_r[4][8][NVP];

    const int C = p.ctas;
    const int NT = blockDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = NT >> 5;
    const uint32_t rank = C > 1 ? cluster_rank() : 0;
    const int64_t t = blockIdx.x / C;
    /* Phase 1 of the cluster barrier: every CTA has started before any DSM store. */
    if (C > 1) cluster_arrive_relaxed();

    int vi[V];
    bool ok[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        vi[k] = k * C * NT + (int)rank * NT + tid;
        ok[k] = vi[k] < p.vecs;
    }
    const int64_t row = t * p.H;
    T *prefix = (T *)p.prefix + row;
    const T *delta = (const T *)p.delta + row;
    const T *blocks = (const T *)p.blocks + t * p.sbt;
    (void)lane;

    uint4 pr[V], de[V], src[NB > 0 ? NB : 1][V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        pr[k] = de[k] = make_uint4(0, 0, 0, 0);
        if (ok[k]) {
            pr[k] = *(const uint4 *)(prefix + (int64_t)vi[k] * 8);
            de[k] = ld_stream(delta + (int64_t)vi[k] * 8);
        }
    }
#pragma unroll
    for (int s = 0; s < NB; s++)
#pragma unroll
        for (int k = 0; k < V; k++) {
            src[s][k] = make_uint4(0, 0, 0, 0);
            if (s < p.nb && ok[k]) src[s][k] = ld_stream(blocks + s * p.sbs + (int64_t)vi[k] * 8);
        }
    float w[V][8], on[V][8];
#pragma unroll
    for (int k = 0; k < V; k++) {
#pragma unroll
        for (int e = 0; e < 8; e++) w[k][e] = on[k][e] = 0.0f;
        if (ok[k]) {
            float a[8], b[8];
            wvec<T, W> x, y, z;
            x.load(p.nw, (int64_t)vi[k] * 8);
            y.load(p.qw, (int64_t)vi[k] * 8);
            z.load(p.onw, (int64_t)vi[k] * 8);
            x.get(a);
            y.get(b);
            z.get(on[k]);
#pragma unroll
            for (int e = 0; e < 8; e++) w[k][e] = a[e] * b[e];
        }
    }

    /* p, rounded to T and written back; its rounded value is source slot NB. */
    float pv[V][8];
    float part[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) part[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        float a[8], b[8];
        vec8<T>::unpack(pr[k], a);
        vec8<T>::unpack(de[k], b);
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] += b[e];
        uint4 pb = pack8<T>(a);
        vec8<T>::unpack(pb, pv[k]);
        if (ok[k]) *(uint4 *)(prefix + (int64_t)vi[k] * 8) = pb;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            part[2 * NB] = fmaf(pv[k][e], w[k][e], part[2 * NB]);
            part[2 * NB + 1] = fmaf(pv[k][e], pv[k][e], part[2 * NB + 1]);
        }
#pragma unroll
        for (int s = 0; s < NB; s++) {
            float v[8];
            vec8<T>::unpack(src[s][k], v);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                part[2 * s] = fmaf(v[e], w[k][e], part[2 * s]);
                part[2 * s + 1] = fmaf(v[e], v[e], part[2 * s + 1]);
            }
        }
    }
    /* Unread slots (s >= nb) and idle threads hold zeros, so the sums stay exact. */
#pragma unroll
    for (int i = 0; i < NV; i++) part[i] = warp_sum(part[i]);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < NV; i++) red[warp][i] = part[i];
    __syncthreads();
    if (C > 1) cluster_wait();
    for (int k = tid; k < NV * C; k += NT) {
        int item = k % NV, dest = k / NV;
        float s = 0.0f;
        for (int q = 0; q < nwarps; q++) s += red[q][item];
        if (C > 1)
            st_cluster(&recv[rank][item], (uint32_t)dest, s);
        else
            recv[0][item] = s;
    }
    if (C > 1) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
    float tot[NVP];
#pragma unroll
    for (int i = 0; i < NVP; i++) tot[i] = 0.0f;
    for (int c = 0; c < C; c++) {
        const float4 *r4 = (const float4 *)recv[c];
#pragma unroll
        for (int q = 0; q < NVP / 4; q++) {
            float4 x = r4[q];
            tot[4 * q] += x.x;
            tot[4 * q + 1] += x.y;
            tot[4 * q + 2] += x.z;
            tot[4 * q + 3] += x.w;
        }
    }

    float epss[MAXS];
#pragma unroll
    for (int s = 0; s < MAXS; s++) epss[s] = p.eps;
    bool rescale = false;
#pragma unroll
    for (int s = 0; s < MAXS; s++)
        if (s == NB || s < p.nb) rescale = rescale || ss_needs_rescale(tot[2 * s + 1]);
    if (rescale) {
        /* Rare: every source's sums again on its values scaled by 2^-e (e from its max
         * magnitude; 0 for a source whose sum was fine, which leaves its value as it was). */
        float amax[MAXS];
#pragma unroll
        for (int s = 0; s < MAXS; s++) amax[s] = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++) {
#pragma unroll
            for (int e = 0; e < 8; e++) amax[NB] = fmaxf(amax[NB], fabsf(pv[k][e]));
#pragma unroll
            for (int s = 0; s < NB; s++) {
                float v[8];
                vec8<T>::unpack(src[s][k], v);
#pragma unroll
                for (int e = 0; e < 8; e++) amax[s] = fmaxf(amax[s], fabsf(v[e]));
            }
        }
        rare_exchange<MAXS, true, NVP>(amax, red, recv_r[0], C, rank);
        float sa[MAXS], sb[MAXS], part2[NV];
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            bool active = s == NB || s < p.nb;
            int e = active && ss_needs_rescale(tot[2 * s + 1]) ? scale_exp(amax[s]) : 0;
            pow2_scale ps(e);
            sa[s] = ps.a;
            sb[s] = ps.b;
            epss[s] = ldexpf(p.eps, -2 * e);
            part2[2 * s] = part2[2 * s + 1] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int s = 0; s < MAXS; s++) {
                float v[8];
                if (s == NB) {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = pv[k][e];
                } else {
                    vec8<T>::unpack(src[s < NB ? s : 0][k], v);
                }
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float x = (v[e] * sa[s]) * sb[s];
                    part2[2 * s] = fmaf(x, w[k][e], part2[2 * s]);
                    part2[2 * s + 1] = fmaf(x, x, part2[2 * s + 1]);
                }
            }
        rare_exchange<NV, false, NVP>(part2, red, recv_r[1], C, rank);
#pragma unroll
        for (int i = 0; i < NV; i++) tot[i] = part2[i];
    }

    /* Softmax over the nb block sources and p. */
    float logit[MAXS], mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        bool active = s == NB || s < p.nb;
        logit[s] = active ? tot[2 * s] * (1.0f / sqrtf(tot[2 * s + 1] * p.invH + epss[s])) : -INFINITY;
        mx = fmaxf(mx, logit[s]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        bool active = s == NB || s < p.nb;
        logit[s] = active ? expf(logit[s] - mx) : 0.0f;
        sum += logit[s];
    }
    float inv_sum = 1.0f / sum;

    float m[V][8];
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++) {
#pragma unroll
        for (int e = 0; e < 8; e++) m[k][e] = 0.0f;
#pragma unroll
        for (int s = 0; s < NB; s++) {
            float v[8];
            vec8<T>::unpack(src[s][k], v);
            float pr_s = logit[s] * inv_sum;
#pragma unroll
            for (int e = 0; e < 8; e++) m[k][e] = fmaf(pr_s, v[e], m[k][e]);
        }
        float pr_p = logit[NB] * inv_sum;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            m[k][e] = fmaf(pr_p, pv[k][e], m[k][e]);
            sq = fmaf(m[k][e], m[k][e], sq);
        }
    }
    sq = warp_sum(sq);
    if (lane == 0) red2[warp] = sq;
    __syncthreads();
    if (tid < C) {
        float s = 0.0f;
        for (int q = 0; q < nwarps; q++) s += red2[q];
        if (C > 1)
            st_cluster(&recv2[rank], (uint32_t)tid, s);
        else
            recv2[0] = s;
    }
    if (C > 1) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
    float total = 0.0f;
    for (int c = 0; c < C; c++) total += recv2[c];
    float r;
    if (!ss_needs_rescale(total)) {
        r = 1.0f / sqrtf(total * p.invH + p.oeps);
    } else {
        /* Rare: the same on the mix scaled by 2^-e; out = m' * r' * w. */
        float mm[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) mm[0] = fmaxf(mm[0], fabsf(m[k][e]));
        rare_exchange<1, true, NVP>(mm, red, recv_r[2], C, rank);
        int eo = scale_exp(mm[0]);
        pow2_scale ps(eo);
        float s2[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                m[k][e] = ps(m[k][e]);
                s2[0] = fmaf(m[k][e], m[k][e], s2[0]);
            }
        rare_exchange<1, false, NVP>(s2, red, recv_r[3], C, rank);
        r = rms_factor_scaled(s2[0], p.invH, p.oeps, eo);
    }
    T *out = (T *)p.out + row;
#pragma unroll
    for (int k = 0; k < V; k++) {
        if (!ok[k]) continue;
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = m[k][e] * r * on[k][e];
        *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(o);
    }
}


/* Launch shape for a hidden size and num_blocks. */
struct packed_shape {
    int ctas, threads, v;
};

/* The shape: V = 1, else 2 vectors per thread;
 * 4..8 CTAs (K3_ATTN_RES_PACKED_CTAS when set) with the fewest idle threads; fewer when the
 * last CTAs would idle. False when none covers H (or V = 2 at num_blocks > 8). */
bool packed_pick(int64_t H, int64_t nb, packed_shape *out) {
    int64_t vecs = H / 8;
    int force = get_knobs().packed_ctas;
    int pref = force ? force : 8;
    for (int v = 1; v <= 2; v++) {
        int best_c = 0, best_nt = 0;
        int64_t best_idle = INT64_MAX;
        for (int c = pref; c >= 1 && c >= (force ? pref : pref / 2); c--) {
            int nt = threads_for(vecs, c, v, kMaxThreads);
            if (!nt) continue;
            int64_t idle = (int64_t)c * nt * v - vecs;
            if (idle < best_idle) best_idle = idle, best_c = c, best_nt = nt;
        }
        while (best_c > 1 && (int64_t)(best_c - 1) * best_nt * v >= vecs) best_c--;
        if (best_c && (v == 1 || nb <= 8)) {
            *out = packed_shape{best_c, best_nt, v};
            return true;
        }
    }
    return false;
}

template <class T, class W>
k3_status packed_launch(const packed_params &p, const packed_shape &sh, int64_t T_,
                         cudaStream_t stream) {
    if (p.nb <= 8 && sh.v == 2) {
        K3_TRY(launch(attn_res_packed_kernel<T, W, 9, 2>, p, dim3((unsigned)(T_ * sh.ctas)),
                      dim3((unsigned)sh.threads), 0, sh.ctas, 0, stream));
    } else if (p.nb <= 8) {
        K3_TRY(launch(attn_res_packed_kernel<T, W, 9, 1>, p, dim3((unsigned)(T_ * sh.ctas)),
                      dim3((unsigned)sh.threads), 0, sh.ctas, 0, stream));
    } else {
        K3_TRY(launch(attn_res_packed_kernel<T, W, 17, 1>, p, dim3((unsigned)(T_ * sh.ctas)),
                      dim3((unsigned)sh.threads), 0, sh.ctas, 0, stream));
    }
    K3_CHECK_LAUNCH(attn_res_packed_kernel);
    return K3_OK;
}

k3_status packed_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    const char *K = k3_cuda_attn_res_packed_name;
    K3_TRY(check_rules(K, oa, call_rules{0, kMaxTokens, true, 1, 16}, reason, n));
    packed_shape sh;
    if (!packed_pick(a->prefix->size[1], a->num_blocks, &sh)) {
        snprintf(reason, n, "%s supports hidden sizes up to %d at num_blocks %lld; got %lld", K,
                 8 * 8 * kMaxThreads * (a->num_blocks <= 8 ? 2 : 1), (long long)a->num_blocks,
                 (long long)a->prefix->size[1]);
        return K3_ESHAPE;
    }
    return K3_OK;
}

k3_status packed_run(const k3_op_args *oa) {
    char reason[256] = "";
    k3_status s = packed_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    int64_t T_ = a->prefix->size[0], H = a->prefix->size[1];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->prefix), &ctx));
    if (T_ == 0) return K3_OK;
    packed_shape sh;
    if (!packed_pick(H, a->num_blocks, &sh))
        return k3_error(K3_EINTERNAL, "attn_res: %s: no shape for hidden_size %lld",
                        k3_cuda_attn_res_packed_name, (long long)H);
    packed_params p;
    fill_row_args(p, oa);
    p.ctas = sh.ctas;
    return by_types(a, [&](auto t, auto w) {
        return packed_launch<typename decltype(t)::type, typename decltype(w)::type>(p, sh, T_,
                                                                                     ctx->stream);
    });
}

} // namespace

/* True when the packed kernel has a loadable image for dev and dev can launch clusters. */
static bool k3c_attn_res_packed_loadable(int dev) {
    return cluster_loadable(dev, attn_res_packed_kernel<k3c_bf16, k3c_bf16, 9, 1>);
}

extern "C" const k3_kernel k3_cuda_attn_res_packed = K3_KERNEL_RECORD_USABLE(
    k3_cuda_attn_res_packed, packed_supports, packed_run, k3c_attn_res_packed_loadable);
