/*
 * attn_res_packed.cu — cuda.attn_res.packed, the decode AttnRes read (T <= 64): every case of
 * the op the Kimi-K3 stream makes (delta or none, a fused block write or none, num_blocks
 * 0..16, output norm or none) on densely packed bf16/f16 rows. One token is one CTA, or a
 * cluster of up to 8 CTAs exchanging partial sums through distributed shared memory; every
 * 16-byte load of the token is in flight at once, held in registers, and one reduction gives
 * all the logits.
 */
#include "attn_res.cuh"

#include <limits.h>
#include <type_traits>

using namespace k3ar;

namespace {

const int kMaxThreads = 512;
const int kMaxCtas = 8;
const int64_t kMaxTokens = 64;
const int kMaxBlocks = 16;

struct packed_params {
    void *prefix;
    const void *delta; /* NULL: no delta */
    void *blocks;
    void *out;
    const void *nw, *qw, *onw; /* onw NULL: no output norm */
    int64_t sbt, sbs;          /* blocks strides in elements (multiples of 8) */
    int64_t H;
    int vecs;    /* H / 8 */
    int nb;      /* 0..MAXS-1 */
    int wb;      /* slot written, or -1 */
    int wstatic; /* the three weights are loaded before the PDL wait (static_weights) */
    int nstatic; /* block slots < nstatic are loaded before the PDL wait (static_blocks) */
    int ctas;    /* CTAs per token (a cluster when > 1) */
    int pdl;
    float eps, oeps, invH;
};

/* Coherent 16-byte load that does not allocate in L1: for rows an earlier kernel of the
 * stream may have written (the read-only path is only valid for data no grid in flight
 * writes). */
__device__ __forceinline__ uint4 ld_coherent(const void *p) {
    uint4 r;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* Values a lane holds after spread_step<C, O> and the steps below O (halving per step). */
__host__ __device__ constexpr int spread_count(int c, int o) { return o == 0 ? c : spread_count(c / 2 + c % 2, o / 2); }

/*
 * Warp reduction of C values per lane in about C shuffles instead of 5 C: at lane offset O,
 * partners swap halves (lane & O keeps the upper half) and add, so each value is summed over
 * both lanes and each lane keeps half; an odd last value is added whole. After the step at
 * offset 1, value j of a lane is the warp's total of item id[j] (id follows the same swaps).
 */
template <int C, int O, bool MAX, int N>
__device__ __forceinline__ void spread_step(float (&v)[N], int (&id)[N], int lane) {
    if constexpr (O > 0) {
        constexpr int H = C / 2;
        const bool up = (lane & O) != 0;
#pragma unroll
        for (int j = 0; j < H; j++) {
            float send = up ? v[j] : v[j + H], keep = up ? v[j + H] : v[j];
            float r = __shfl_xor_sync(0xffffffffu, send, O);
            v[j] = MAX ? fmaxf(keep, r) : keep + r;
            id[j] = up ? id[j + H] : id[j];
        }
        if constexpr (C % 2 == 1) {
            float r = __shfl_xor_sync(0xffffffffu, v[C - 1], O);
            v[H] = MAX ? fmaxf(v[C - 1], r) : v[C - 1] + r;
            id[H] = id[C - 1];
        }
        spread_step<H + C % 2, O / 2, MAX>(v, id, lane);
    }
}

/*
 * Sums (or maxima) of N values over the token: the warps of this CTA, then the CTAs of the
 * cluster. Each CTA pushes its partials into every CTA's recv[phase & 1][rank] and one cluster
 * barrier publishes them; every CTA then adds the C partials in the same order, so all hold
 * bit-identical totals and take the same branches after. Alternating recv buffers: a CTA
 * writes buffer b again only two barriers after every CTA last read it. The first exchange
 * completes the barrier phase the kernel opened at entry (every CTA has started before any
 * remote store).
 */
template <int N, bool MAX, int NP, bool LEAN = false>
__device__ __forceinline__ void token_reduce(float (&v)[N], float (*red)[NP],
                                             float (*recv)[kMaxCtas][NP], int &phase, int C,
                                             uint32_t rank) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    if (LEAN && N > 1) {
        int id[N];
#pragma unroll
        for (int i = 0; i < N; i++) id[i] = i;
        spread_step<N, 16, MAX>(v, id, lane);
        /* Lanes holding the same item hold the same bits (a + b == b + a). */
#pragma unroll
        for (int j = 0; j < spread_count(N, 16); j++) red[warp][id[j]] = v[j];
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = MAX ? warp_max(v[i]) : warp_sum(v[i]);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < N; i++) red[warp][i] = v[i];
    }
    __syncthreads();
    float(*buf)[NP] = recv[phase & 1];
    if (C > 1 && phase == 0) cluster_wait();
    if (LEAN) {
        /* Warp w adds item w, w + nwarps, …: lane q reads warp q's partial, five shuffles;
         * lanes 0..C-1 push the total to CTA `lane` (a latency of one shared load and one
         * warp reduction, not nwarps dependent loads). */
        for (int item = warp; item < N; item += nwarps) {
            float s = lane < nwarps ? red[lane][item] : 0.0f;
            s = MAX ? warp_max(s) : warp_sum(s);
            if (C > 1) {
                if (lane < C) st_cluster(&buf[rank][item], (uint32_t)lane, s);
            } else if (lane == 0) {
                buf[0][item] = s;
            }
        }
    } else
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
    phase++;
}

/* Per-source dot with w and sum of squares of one vector of 8 values, each scaled by a * b
 * (two exact power-of-two steps; 1, 1 in the common path). */
__device__ __forceinline__ void acc_source(const float (&v)[8], const float (&w)[8], float a,
                                           float b, float &dot, float &ss) {
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float x = (v[e] * a) * b;
        dot = fmaf(x, w[e], dot);
        ss = fmaf(x, x, ss);
    }
}

/*
 * Thread `tid` of CTA `rank` owns the 16-byte vectors vi = k*C*NT + rank*NT + tid (k < V) of
 * every row of token blockIdx.x / C. Source slot MAXS-1 is p, so every register array is
 * indexed by compile-time constants.
 *  1. before the PDL wait: the weights when static_weights, block slots < static_blocks (the
 *     call's contract, k3.h); dependents may start only after the wait;
 *     after it: prefix, delta and the other slots, all issued before any is used;
 *  2. p = round(prefix + delta), written back, and into slot wb; per source dot, sum of
 *     squares and max |v| (one pass), one token reduction for all logits;
 *  3. softmax, the mix in registers, its sum of squares (a second reduction), the store.
 * A sum of squares that overflowed or underflowed is recomputed on the values scaled by a
 * power of two near their max magnitude (ss_needs_rescale), so the norms hold at any scale.
 */
/* Threads per CTA at most: 512 (128 registers each) up to 8 blocks, 256 (255 registers) for
 * the 17-source instances, whose register arrays are twice as long. */
constexpr int max_threads(int maxs) { return maxs > 9 ? 256 : kMaxThreads; }

template <class T, class W, int MAXS, int V, bool LEAN>
__global__ void __launch_bounds__(max_threads(MAXS)) attn_res_packed_kernel(const packed_params p) {
    constexpr int NB = MAXS - 1;
    constexpr int NV = 2 * MAXS;
    constexpr int NP = (NV + 3) & ~3;
    __shared__ __align__(16) float red[kMaxThreads / 32][NP];
    __shared__ __align__(16) float recv[2][kMaxCtas][NP];

    const int C = p.ctas, NT = blockDim.x, tid = threadIdx.x;
    const uint32_t rank = C > 1 ? cluster_rank() : 0;
    const int64_t t = blockIdx.x / C;
    int phase = 0;
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
    const T *delta = p.delta ? (const T *)p.delta + row : nullptr;
    T *blocks = (T *)p.blocks + t * p.sbt;

    wvec<T, W> wn[V], wq[V], wo[V];
    uint4 src[NB][V];
    const bool wstatic = p.wstatic != 0;
    if (wstatic)
#pragma unroll
        for (int k = 0; k < V; k++) {
            wn[k].zero(), wq[k].zero(), wo[k].zero();
            if (ok[k]) {
                wn[k].load(p.nw, (int64_t)vi[k] * 8);
                wq[k].load(p.qw, (int64_t)vi[k] * 8);
                if (p.onw) wo[k].load(p.onw, (int64_t)vi[k] * 8);
            }
        }
#pragma unroll
    for (int s = 0; s < NB; s++)
#pragma unroll
        for (int k = 0; k < V; k++) {
            src[s][k] = make_uint4(0, 0, 0, 0);
            if (s < p.nstatic && s < p.nb && ok[k])
                src[s][k] = ld_stream(blocks + s * p.sbs + (int64_t)vi[k] * 8);
        }
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }
    if (!wstatic)
#pragma unroll
        for (int k = 0; k < V; k++) {
            wn[k].zero(), wq[k].zero(), wo[k].zero();
            if (ok[k]) {
                wn[k].load(p.nw, (int64_t)vi[k] * 8);
                wq[k].load(p.qw, (int64_t)vi[k] * 8);
                if (p.onw) wo[k].load(p.onw, (int64_t)vi[k] * 8);
            }
        }
    uint4 pb[V];
    uint4 de[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        pb[k] = de[k] = make_uint4(0, 0, 0, 0);
        if (ok[k]) {
            pb[k] = ld_coherent(prefix + (int64_t)vi[k] * 8);
            if (delta) de[k] = ld_coherent(delta + (int64_t)vi[k] * 8);
        }
    }
#pragma unroll
    for (int s = 0; s < NB; s++)
#pragma unroll
        for (int k = 0; k < V; k++)
            if (s >= p.nstatic && s < p.nb && ok[k])
                src[s][k] = ld_coherent(blocks + s * p.sbs + (int64_t)vi[k] * 8);

    /* p, rounded to T and written back; then slot wb; a source slot equal to wb reads p. */
    float part[NV], amax[MAXS];
#pragma unroll
    for (int i = 0; i < NV; i++) part[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < MAXS; s++) amax[s] = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        if (delta) {
            float a[8], b[8];
            vec8<T>::unpack(pb[k], a);
            vec8<T>::unpack(de[k], b);
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] += b[e];
            pb[k] = pack8<T>(a);
            if (ok[k]) *(uint4 *)(prefix + (int64_t)vi[k] * 8) = pb[k];
        }
        if (p.wb >= 0 && ok[k]) *(uint4 *)(blocks + p.wb * p.sbs + (int64_t)vi[k] * 8) = pb[k];
#pragma unroll
        for (int s = 0; s < NB; s++)
            if (s == p.wb) src[s][k] = pb[k];
        float w[8];
        {
            float x[8], y[8];
            wn[k].get(x);
            wq[k].get(y);
#pragma unroll
            for (int e = 0; e < 8; e++) w[e] = x[e] * y[e];
        }
        float v[8];
        vec8<T>::unpack(pb[k], v);
        acc_source(v, w, 1.0f, 1.0f, part[2 * NB], part[2 * NB + 1]);
        if (!LEAN)
#pragma unroll
            for (int e = 0; e < 8; e++) amax[NB] = fmaxf(amax[NB], fabsf(v[e]));
#pragma unroll
        for (int s = 0; s < NB; s++) {
            if (LEAN && s >= p.nb) continue;
            vec8<T>::unpack(src[s][k], v);
            acc_source(v, w, 1.0f, 1.0f, part[2 * s], part[2 * s + 1]);
            if (!LEAN)
#pragma unroll
                for (int e = 0; e < 8; e++) amax[s] = fmaxf(amax[s], fabsf(v[e]));
        }
    }
    /* Unread slots (s >= nb) and idle threads hold zeros, so the sums stay exact. */
    token_reduce<NV, false, NP, LEAN>(part, red, recv, phase, C, rank);

    float epss[MAXS];
#pragma unroll
    for (int s = 0; s < MAXS; s++) epss[s] = p.eps;
    bool rescale = false;
#pragma unroll
    for (int s = 0; s < MAXS; s++)
        if (s == NB || s < p.nb) rescale = rescale || ss_needs_rescale(part[2 * s + 1]);
    if (rescale) {
        /* Rare: recompute every source's sums on its values scaled by 2^-e (e from its max
         * magnitude; e = 0 leaves a source's sums bit for bit as they were). */
        if (LEAN)
            /* The max magnitudes from the registers, on this rare path only. */
#pragma unroll
            for (int k = 0; k < V; k++) {
                float v[8];
#pragma unroll
                for (int s = 0; s < MAXS; s++) {
                    vec8<T>::unpack(s == NB ? pb[k] : src[s < NB ? s : 0][k], v);
#pragma unroll
                    for (int e = 0; e < 8; e++) amax[s] = fmaxf(amax[s], fabsf(v[e]));
                }
            }
        token_reduce<MAXS, true, NP, LEAN>(amax, red, recv, phase, C, rank);
        float sa[MAXS], sb[MAXS];
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            int e = (s == NB || s < p.nb) && ss_needs_rescale(part[2 * s + 1]) ? scale_exp(amax[s]) : 0;
            pow2_scale ps(e);
            sa[s] = ps.a;
            sb[s] = ps.b;
            epss[s] = ldexpf(p.eps, -2 * e);
            part[2 * s] = part[2 * s + 1] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            float w[8], v[8];
            {
                /* Reloaded (L1/L2-resident by now) so the common path need not keep them. */
                wvec<T, W> a, b;
                a.zero(), b.zero();
                if (ok[k]) {
                    a.load(p.nw, (int64_t)vi[k] * 8);
                    b.load(p.qw, (int64_t)vi[k] * 8);
                }
                float x[8], y[8];
                a.get(x);
                b.get(y);
#pragma unroll
                for (int e = 0; e < 8; e++) w[e] = x[e] * y[e];
            }
#pragma unroll
            for (int s = 0; s < MAXS; s++) {
                vec8<T>::unpack(s == NB ? pb[k] : src[s < NB ? s : 0][k], v);
                acc_source(v, w, sa[s], sb[s], part[2 * s], part[2 * s + 1]);
            }
        }
        token_reduce<NV, false, NP, LEAN>(part, red, recv, phase, C, rank);
    }

    /* Softmax over the nb block sources and p; one source is exactly one. */
    float logit[MAXS], mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        bool active = s == NB || s < p.nb;
        logit[s] = active ? part[2 * s] * (1.0f / sqrtf(part[2 * s + 1] * p.invH + epss[s])) : -INFINITY;
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
    float prob[MAXS];
#pragma unroll
    for (int s = 0; s < MAXS; s++) prob[s] = p.nb == 0 ? (s == NB ? 1.0f : 0.0f) : logit[s] * inv_sum;

    float m[V][8];
    float sq[1] = {0.0f}, mmax[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < V; k++) {
        float v[8];
        vec8<T>::unpack(pb[k], v);
#pragma unroll
        for (int e = 0; e < 8; e++) m[k][e] = prob[NB] * v[e];
#pragma unroll
        for (int s = 0; s < NB; s++) {
            if (s >= p.nb) continue;
            vec8<T>::unpack(src[s][k], v);
#pragma unroll
            for (int e = 0; e < 8; e++) m[k][e] = fmaf(prob[s], v[e], m[k][e]);
        }
#pragma unroll
        for (int e = 0; e < 8; e++) {
            sq[0] = fmaf(m[k][e], m[k][e], sq[0]);
            if (!LEAN) mmax[0] = fmaxf(mmax[0], fabsf(m[k][e]));
        }
    }
    T *out = (T *)p.out + row;
    if (!p.onw) {
#pragma unroll
        for (int k = 0; k < V; k++)
            if (ok[k]) *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(m[k]);
        return;
    }
    token_reduce<1, false, NP, LEAN>(sq, red, recv, phase, C, rank);
    float r;
    if (!ss_needs_rescale(sq[0])) {
        r = 1.0f / sqrtf(sq[0] * p.invH + p.oeps);
    } else {
        /* Rare: the same on the mixed values scaled by 2^-e; out = m' * r' * w. */
        if (LEAN)
#pragma unroll
            for (int k = 0; k < V; k++)
#pragma unroll
                for (int e = 0; e < 8; e++) mmax[0] = fmaxf(mmax[0], fabsf(m[k][e]));
        token_reduce<1, true, NP, LEAN>(mmax, red, recv, phase, C, rank);
        int e = scale_exp(mmax[0]);
        pow2_scale ps(e);
        float s2[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                m[k][i] = ps(m[k][i]);
                s2[0] = fmaf(m[k][i], m[k][i], s2[0]);
            }
        token_reduce<1, false, NP, LEAN>(s2, red, recv, phase, C, rank);
        r = rms_factor_scaled(s2[0], p.invH, p.oeps, e);
    }
#pragma unroll
    for (int k = 0; k < V; k++) {
        if (!ok[k]) continue;
        float on[8], o[8];
        wo[k].get(on);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = m[k][e] * r * on[e];
        *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(o);
    }
}

/*
 * The cluster kernel of 2026-11-30, kept for same-run timing (K3_ATTN_RES_PACKED_VARIANT =
 * cluster): one token per cluster of p.ctas CTAs; thread `tid` of CTA `rank` owns the 16-byte
 * vectors vi = k*C*NT + rank*NT + tid (k < V) of every row.
 *  1. issue every load: prefix, delta, the nb block rows, the weights;
 *  2. p = round(prefix + delta), written back; per-source partial dot and sum of squares;
 *  3. CTA sums, pushed into every CTA of the cluster (DSM), cluster barrier;
 *  4. logits and softmax (every thread, redundantly), the mix in registers, its partial
 *     sum of squares exchanged the same way, then the normed output stored.
 * It needs delta and the output norm, num_blocks >= 1 and no block write; no PDL.
 */
template <class T, class W, int MAXS, int V>
__global__ void __launch_bounds__(kMaxThreads) attn_res_cluster_kernel(const packed_params p) {
    constexpr int NB = MAXS - 1;
    constexpr int NV = 2 * MAXS;
    constexpr int NVP = (NV + 3) & ~3;
    __shared__ __align__(16) float red[kMaxThreads / 32][NVP];
    __shared__ __align__(16) float recv[8][NVP];
    __shared__ float red2[kMaxThreads / 32];
    __shared__ float recv2[8];

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

    /* Softmax over the nb block sources and p. */
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
    float r = 1.0f / sqrtf(total * p.invH + p.oeps);
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

/* Threads for `ctas` CTAs of v vectors per thread, or 0 when more than maxt. */
int threads_for(int64_t vecs, int ctas, int v, int maxt) {
    int64_t per = (vecs + (int64_t)ctas * v - 1) / ((int64_t)ctas * v);
    int64_t nt = (per + 31) / 32 * 32;
    if (nt < 32) nt = 32;
    return nt > maxt ? 0 : (int)nt;
}

/* The shape: with K3_ATTN_RES_PACKED_CTAS = c, c CTAs per token; else one CTA while it fits,
 * then the fewest CTAs that fit. Two vectors per thread only for num_blocks <= 8 and 16-bit
 * weights (ptxas -v, sm_90a: these stay within 128 registers; the others would spill). False
 * with a reason when no shape covers H. */
bool packed_pick(int64_t H, int64_t nb, bool wf32, packed_shape *out, char *reason, size_t n) {
    int64_t vecs = H / 8;
    int maxv = nb <= 8 && !wf32 ? 2 : 1;
    int maxt = nb <= 8 ? kMaxThreads : 256;
    int force = get_knobs().packed_ctas;
    int lo = force ? force : 1, hi = force ? force : kMaxCtas;
    for (int c = lo; c <= hi; c++)
        for (int v = 1; v <= maxv; v++) {
            int nt = threads_for(vecs, c, v, maxt);
            if (!nt) continue;
            /* Fewer CTAs than asked when the last would idle (small H). */
            int cc = c;
            while (cc > 1 && (int64_t)(cc - 1) * nt * v >= vecs) cc--;
            *out = packed_shape{cc, nt, v};
            return true;
        }
    if (force)
        snprintf(reason, n,
                 "cuda.attn_res.packed with K3_ATTN_RES_PACKED_CTAS=%d supports hidden sizes up "
                 "to %d at num_blocks %lld; got %lld",
                 force, 8 * force * maxt * maxv, (long long)nb, (long long)H);
    else
        snprintf(reason, n,
                 "cuda.attn_res.packed supports hidden sizes up to %d at num_blocks %lld; got %lld",
                 8 * kMaxCtas * maxt * maxv, (long long)nb, (long long)H);
    return false;
}

k3_status packed_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    const char *K = "cuda.attn_res.packed";
    int64_t T = a->prefix->size[0];
    if (T > kMaxTokens) {
        snprintf(reason, n, "%s serves decode batches of T <= %lld tokens; got T = %lld", K,
                 (long long)kMaxTokens, (long long)T);
        return K3_ESHAPE;
    }
    if (a->num_blocks > kMaxBlocks) {
        snprintf(reason, n, "%s supports num_blocks up to %d; got %lld", K, kMaxBlocks,
                 (long long)a->num_blocks);
        return K3_EINVAL;
    }
    K3_TRY(fast_path_checks(K, oa, reason, n));
    packed_shape sh;
    if (!packed_pick(a->prefix->size[1], a->num_blocks, a->norm_weight->dtype == K3_DTYPE_F32, &sh,
                     reason, n))
        return K3_ESHAPE;
    return K3_OK;
}

template <class T, class W, int MAXS, int V, bool LEAN>
k3_status packed_launch_t(const packed_params &p, const packed_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    K3_TRY(launch(attn_res_packed_kernel<T, W, MAXS, V, LEAN>, p, dim3((unsigned)(T_ * sh.ctas)),
                  dim3((unsigned)sh.threads), 0, sh.ctas, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_packed_kernel);
    return K3_OK;
}

/* The instance of MAXS sources (num_blocks + 1 <= MAXS) for the shape's vectors per thread. */
template <class T, class W, int MAXS, bool LEAN>
k3_status packed_launch_s(const packed_params &p, const packed_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    if (sh.v == 1) return packed_launch_t<T, W, MAXS, 1, LEAN>(p, sh, T_, stream);
    /* packed_pick gives two vectors per thread only with 16-bit weights and num_blocks <= 8. */
    if constexpr (!std::is_same<W, float>::value && MAXS <= 9)
        return packed_launch_t<T, W, MAXS, 2, LEAN>(p, sh, T_, stream);
    return k3_error(K3_EINTERNAL, "attn_res: cuda.attn_res.packed: no instance for num_blocks %d "
                                  "with %d vectors per thread",
                    p.nb, sh.v);
}

template <class T, class W>
k3_status packed_launch_w(const packed_params &p, const packed_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    if (get_knobs().packed_variant == PACKED_LEAN) {
        if (p.nb <= 1) return packed_launch_s<T, W, 2, true>(p, sh, T_, stream);
        if (p.nb <= 4) return packed_launch_s<T, W, 5, true>(p, sh, T_, stream);
        if (p.nb <= 8) return packed_launch_s<T, W, 9, true>(p, sh, T_, stream);
        return packed_launch_s<T, W, 17, true>(p, sh, T_, stream);
    }
    if (p.nb <= 8) {
        if (sh.v == 1) return packed_launch_t<T, W, 9, 1, false>(p, sh, T_, stream);
        if constexpr (!std::is_same<W, float>::value)
            return packed_launch_t<T, W, 9, 2, false>(p, sh, T_, stream);
    }
    if (sh.v == 1) return packed_launch_t<T, W, 17, 1, false>(p, sh, T_, stream);
    return k3_error(K3_EINTERNAL, "attn_res: cuda.attn_res.packed: no instance for num_blocks %d "
                                  "with %d vectors per thread",
                    p.nb, sh.v);
}

/* The cluster kernel's shape (its own rule of 2026-11-30): V = 1, else 2 vectors per thread;
 * 4..8 CTAs (K3_ATTN_RES_PACKED_CTAS when set) with the fewest idle threads; fewer when the
 * last CTAs would idle. False when none covers H (or V = 2 at num_blocks > 8). */
bool cluster_pick(int64_t H, int64_t nb, packed_shape *out) {
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
k3_status cluster_launch(const packed_params &p, const packed_shape &sh, int64_t T_,
                         cudaStream_t stream) {
    if (p.nb <= 8 && sh.v == 2) {
        K3_TRY(launch(attn_res_cluster_kernel<T, W, 9, 2>, p, dim3((unsigned)(T_ * sh.ctas)),
                      dim3((unsigned)sh.threads), 0, sh.ctas, 0, stream));
    } else if (p.nb <= 8) {
        K3_TRY(launch(attn_res_cluster_kernel<T, W, 9, 1>, p, dim3((unsigned)(T_ * sh.ctas)),
                      dim3((unsigned)sh.threads), 0, sh.ctas, 0, stream));
    } else {
        K3_TRY(launch(attn_res_cluster_kernel<T, W, 17, 1>, p, dim3((unsigned)(T_ * sh.ctas)),
                      dim3((unsigned)sh.threads), 0, sh.ctas, 0, stream));
    }
    K3_CHECK_LAUNCH(attn_res_cluster_kernel);
    return K3_OK;
}

k3_status packed_run(const k3_op_args *oa) {
    K3_TRY(check_args(&k3_cuda_attn_res_packed, oa));
    char reason[256] = "";
    k3_status s = packed_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    int64_t T_ = a->prefix->size[0], H = a->prefix->size[1];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->prefix), &ctx));
    if (T_ == 0 || H == 0) return K3_OK;
    packed_shape sh;
    bool wf32 = a->norm_weight->dtype == K3_DTYPE_F32;
    if (!packed_pick(H, a->num_blocks, wf32, &sh, reason, sizeof reason))
        return k3_error(K3_ESHAPE, "attn_res: %s", reason);
    packed_params p;
    p.prefix = k3_tensor_ptr(a->prefix);
    p.delta = a->delta ? k3_tensor_ptr(a->delta) : nullptr;
    p.blocks = k3_tensor_ptr(a->blocks);
    p.out = k3_tensor_ptr(ka->out);
    p.nw = k3_tensor_ptr(a->norm_weight);
    p.qw = k3_tensor_ptr(a->qk_weight);
    p.onw = a->output_norm_weight ? k3_tensor_ptr(a->output_norm_weight) : nullptr;
    p.sbt = a->blocks->stride[0];
    p.sbs = a->blocks->stride[1];
    p.H = H;
    p.vecs = (int)(H / 8);
    p.nb = (int)a->num_blocks;
    p.wb = (int)a->write_block;
    p.wstatic = a->static_weights != 0;
    p.nstatic = (int)a->static_blocks;
    p.ctas = sh.ctas;
    p.pdl = get_knobs().pdl;
    p.eps = (float)a->eps;
    p.oeps = (float)a->output_eps;
    p.invH = 1.0f / (float)H;
    packed_shape cs;
    if (get_knobs().packed_variant == PACKED_CLUSTER && p.delta && p.onw && p.nb >= 1 &&
        p.wb < 0 && cluster_pick(H, p.nb, &cs)) {
        p.ctas = cs.ctas;
        p.pdl = 0;
        if (a->prefix->dtype == K3_DTYPE_BF16)
            return wf32 ? cluster_launch<k3c_bf16, float>(p, cs, T_, ctx->stream)
                        : cluster_launch<k3c_bf16, k3c_bf16>(p, cs, T_, ctx->stream);
        return wf32 ? cluster_launch<k3c_f16, float>(p, cs, T_, ctx->stream)
                    : cluster_launch<k3c_f16, k3c_f16>(p, cs, T_, ctx->stream);
    }
    if (a->prefix->dtype == K3_DTYPE_BF16)
        return wf32 ? packed_launch_w<k3c_bf16, float>(p, sh, T_, ctx->stream)
                    : packed_launch_w<k3c_bf16, k3c_bf16>(p, sh, T_, ctx->stream);
    return wf32 ? packed_launch_w<k3c_f16, float>(p, sh, T_, ctx->stream)
                : packed_launch_w<k3c_f16, k3c_f16>(p, sh, T_, ctx->stream);
}

} // namespace

bool k3c_attn_res_packed_loadable(int dev) {
    int cl = 0;
    if (cudaSetDevice(dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    cudaFuncAttributes fa;
    if (!cl || cudaFuncGetAttributes(&fa, attn_res_packed_kernel<k3c_bf16, k3c_bf16, 9, 1, false>) !=
                   cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

extern "C" const k3_kernel k3_cuda_attn_res_packed = {"cuda.attn_res.packed", K3_OP_ATTN_RES,
                                                      K3_DEVICE_CUDA, packed_supports, packed_run};

void k3c_attn_res_knobs_init(void) { k3ar::read_knobs(); }
