/*
 * attn_res_decode.cu — cuda.attn_res.decode, the decode AttnRes read (T <= 64, or any T at
 * num_blocks <= 4, except T >= 256 at num_blocks 2..4 where the stream kernel takes the call:
 * decode_supports)
 * for every case
 * of the op the Kimi-K3 stream makes (delta or none, a fused block write or none, num_blocks
 * 0..16, output norm or none) on densely packed bf16/f16 rows: the first CUDA kernel of the
 * default policy. A token is a cluster of CTAs (4 at H 7168; 1..8) exchanging partial sums
 * through distributed shared memory; every 16-byte load of the token is in flight at once and
 * one exchange gives all the logits. Launched with PDL; what it may load before the wait is
 * the call's contract (k3.h).
 */
#include "attn_res.cuh"

#include <float.h>
#include <limits.h>
#include <type_traits>

using namespace k3ar;

namespace {

const int kMaxThreads = 512;
const int kMaxCtas = 8;
const int kMaxBlocks = 16;

struct decode_params : row_args {
    int wb;      /* slot written, or -1 */
    int wstatic; /* the three weights are loaded before the PDL wait (static_weights) */
    int nstatic; /* block slots < nstatic are loaded before the PDL wait (static_blocks) */
    int ctas;    /* CTAs per token (a cluster when > 1) */
    int pdl;
    int pf; /* the L2 prefetch before the wait (K3_PDL_L2_PREFETCH) */
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

/* Items from which a token reduction adds each item on its own thread (every warp's partial
 * loaded at once) rather than one warp per item: from 8, more items than the 7 warps of a CTA
 * at H 7168, where a warp per item would take two or more dependent rounds. */
const int kWideItems = 8;

/*
 * Sums (or maxima) of N values over the token: the warps of this CTA, then the CTAs of the
 * cluster. Each CTA pushes its partials into every CTA's recv[phase & 1][rank], each push an
 * st.async that completes 4 bytes of the receiving CTA's mbarrier bars[phase & 1], and each CTA
 * waits for its own C x N partials only: a one-way notification instead of a cluster barrier
 * (faster in the decode step, notes/PERF.md). Every CTA then adds the C partials in the same
 * order, so all hold bit-identical totals and take the same branches after. Alternating recv
 * buffers and barriers: a CTA writes buffer b again only after every CTA has read it (a CTA
 * sends its next partials only after the __syncthreads that follows its reads). The first
 * exchange completes the cluster barrier phase the kernel opened at entry (every CTA has
 * started, and has initialised its mbarriers, before any remote store). C = 1 (bars NULL):
 * shared memory and a __syncthreads.
 */
template <int N, bool MAX, int NP>
__device__ __forceinline__ void token_reduce(float (&v)[N], float (*reds)[kMaxThreads / 32][NP],
                                             float (*recv)[kMaxCtas][NP], int &phase, int C,
                                             uint32_t rank, uint64_t *bars) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    /* bars (C > 1; else NULL): barrier phase & 1 completes when the C CTAs' N partials have
     * landed here, in its (phase >> 1)-th use. */
    uint64_t *bar = bars ? &bars[phase & 1] : nullptr;
    if (bar && tid == 0) mbar_arrive_expect(bar, (uint32_t)(C * N * 4));
    /* The warps' partials alternate between two buffers too: a warp past this exchange's wait
     * may write the next one's while another still reads this one's (the reads end before the
     * stores that complete the barrier, but only a __syncthreads orders them for every tool). */
    float(*red)[NP] = reds[phase & 1];
    if (N > 1) {
        warp_totals<MAX>(v, red[warp], lane);
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = MAX ? k3c_warp_max(v[i]) : k3c_warp_sum(v[i]);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < N; i++) red[warp][i] = v[i];
    }
    __syncthreads();
    float(*buf)[NP] = recv[phase & 1];
    if (C > 1 && phase == 0) cluster_wait();
    if constexpr (N >= kWideItems) {
        /* Many items: thread i adds item i (and i + blockDim.x, …) over the warps in order, all
         * the warps' partials loaded at once, and pushes the total to every CTA of the cluster:
         * one round, where a warp per item would take ceil(N / nwarps) dependent rounds. */
        for (int i = tid; i < N; i += blockDim.x) {
            float r[kMaxThreads / 32];
#pragma unroll
            for (int q = 0; q < kMaxThreads / 32; q++) r[q] = q < nwarps ? red[q][i] : 0.0f;
            float s = r[0];
#pragma unroll
            for (int q = 1; q < kMaxThreads / 32; q++)
                if (q < nwarps) s = MAX ? fmaxf(s, r[q]) : s + r[q];
            if (bar) {
                for (int c = 0; c < C; c++) st_async(&buf[rank][i], bar, (uint32_t)c, s);
            } else {
                buf[0][i] = s;
            }
        }
    } else {
        /* Warp w adds item w, w + nwarps, …: lane q reads warp q's partial, five shuffles;
         * lanes 0..C-1 push the total to CTA `lane` (a latency of one shared load and one
         * warp reduction, not nwarps dependent loads). */
        for (int item = warp; item < N; item += nwarps) {
            float s = lane < nwarps ? red[lane][item] : 0.0f;
            s = MAX ? k3c_warp_max(s) : k3c_warp_sum(s);
            if (bar) {
                if (lane < C) st_async(&buf[rank][item], bar, (uint32_t)lane, s);
            } else if (lane == 0) {
                buf[0][item] = s;
            }
        }
    }
    if (bar) {
        mbar_wait(bar, (uint32_t)(phase >> 1) & 1u);
    } else {
        __syncthreads();
    }
    /* The C partials of every item, in rank order, 16 bytes per load (one short loop). */
    constexpr int N4 = (N + 3) / 4;
    float tot[4 * N4];
#pragma unroll
    for (int i = 0; i < 4 * N4; i++) tot[i] = 0.0f;
#pragma unroll 1
    for (int c = 0; c < C; c++) {
        const float4 *r4 = (const float4 *)buf[c];
#pragma unroll
        for (int q = 0; q < N4; q++) {
            float4 x = r4[q];
            tot[4 * q] = MAX ? fmaxf(tot[4 * q], x.x) : tot[4 * q] + x.x;
            tot[4 * q + 1] = MAX ? fmaxf(tot[4 * q + 1], x.y) : tot[4 * q + 1] + x.y;
            tot[4 * q + 2] = MAX ? fmaxf(tot[4 * q + 2], x.z) : tot[4 * q + 2] + x.z;
            tot[4 * q + 3] = MAX ? fmaxf(tot[4 * q + 3], x.w) : tot[4 * q + 3] + x.w;
        }
    }
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = tot[i];
    phase++;
}

/* L2 prefetch of the 128-byte line holding a thread's vector of `bytes` at p, issued by the
 * thread whose vector begins in that line (16-byte aligned vectors: one a line) or holds the
 * row's first element (`first`: the line may begin before the row), so each line of a row
 * is asked for once whatever the row's alignment. */
__device__ __forceinline__ void prefetch_line(const void *p, int bytes, bool first) {
    if (first || ((uintptr_t)p & 127) < (uintptr_t)bytes) k3c_prefetch_l2(p);
}

/* w = norm_weight * qk_weight for the thread's 8 elements. */
template <class T, class W>
__device__ __forceinline__ void wq_product(const wvec<T, W> &wn, const wvec<T, W> &wq, float (&w)[8]) {
    float x[8], y[8];
    wn.get(x);
    wq.get(y);
#pragma unroll
    for (int e = 0; e < 8; e++) w[e] = x[e] * y[e];
}

/* Per-source dot with w and sum of squares of one vector of 8 values. */
__device__ __forceinline__ void acc_source(const float (&v)[8], const float (&w)[8], float &dot,
                                           float &ss) {
#pragma unroll
    for (int e = 0; e < 8; e++) {
        dot = fmaf(v[e], w[e], dot);
        ss = fmaf(v[e], v[e], ss);
    }
}

/* The same on the values scaled by ps (the rare path). */
__device__ __forceinline__ void acc_scaled(const float (&v)[8], const float (&w)[8],
                                           const pow2_scale &ps, float &dot, float &ss) {
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float x = ps(v[e]);
        dot = fmaf(x, w[e], dot);
        ss = fmaf(x, x, ss);
    }
}

/* Threads per CTA at most: 512 (128 registers each) up to 8 blocks, 256 (255 registers) for
 * the 17-source instances, whose source registers are twice as many. */
constexpr int max_threads(int maxs) { return maxs > 9 ? 256 : kMaxThreads; }

/* The 2- and 5-source instances with an output norm take the norm's sum of squares from the
 * sources' pairwise products (GRAM below: 1 and 10 more sums in the first reduction). At 9
 * sources the 36 products cost more than the second reduction they save (notes/PERF.md). */
constexpr int kGramMaxSources = 5;

/*
 * One token per cluster of C = p.ctas CTAs (C = 1: no cluster); thread `tid` of CTA `rank`
 * owns the 16-byte vector vi = rank * NT + tid of every row (one vector per thread: the
 * register arrays are one uint4 per source). Source slot MAXS - 1 is p, so every register
 * array is indexed by compile-time constants; MAXS is num_blocks + 1 rounded up to 2, 5, 9
 * or 17, and slots >= num_blocks are skipped by uniform branches.
 *  1. before the PDL wait: the weights when static_weights, block slots < static_blocks (the
 *     call's contract, k3.h); dependents may start only after the wait; after it: prefix,
 *     delta and the other slots, every load issued before any is used;
 *  2. p = round(prefix + delta), written back, and into slot wb (a source slot equal to wb
 *     reads p); per source dot and sum of squares, one token reduction for all logits;
 *  3. softmax, the mix in registers, its sum of squares (a second reduction; with GRAM from
 *     the first one's totals where that is accurate), the store.
 * The code is kept short on purpose: a decode launch runs each instruction once per warp, so
 * the instruction fetch of a long unrolled body is its critical path (notes/PERF.md). A sum of
 * squares that overflowed or underflowed is recomputed on the values scaled by a power of two
 * near their max magnitude (ss_needs_rescale), on a branch the common path never enters.
 */
template <class T, class W, int MAXS, bool GRAM = false>
__global__ void __launch_bounds__(max_threads(MAXS)) attn_res_decode_kernel(const decode_params p) {
    constexpr int NB = MAXS - 1;
    constexpr int NV = 2 * MAXS;
    constexpr int NX = GRAM ? MAXS * (MAXS - 1) / 2 : 0; /* <v_s, v_t>, s < t */
    constexpr int NP = (NV + NX + 3) & ~3;
    __shared__ __align__(16) float red[2][kMaxThreads / 32][NP];
    __shared__ __align__(16) float recv[2][kMaxCtas][NP];
    __shared__ __align__(8) uint64_t mbars[2];

    const int C = p.ctas, NT = blockDim.x, tid = threadIdx.x;
    const uint32_t rank = C > 1 ? cluster_rank() : 0;
    const int64_t t = blockIdx.x / C;
    int phase = 0;
    uint64_t *bars = exchange_init(mbars, C);

    const int vi = (int)rank * NT + tid;
    const bool ok = vi < p.vecs;
    const int64_t e0 = (int64_t)vi * 8, sbs = p.sbs;
    T *prefix = (T *)p.prefix + t * p.H + e0;
    const T *delta = p.delta ? (const T *)p.delta + t * p.H + e0 : nullptr;
    T *brow = (T *)p.blocks + t * p.sbt + e0;
    const bool wstatic = p.wstatic != 0;

    wvec<T, W> wn, wq, wo;
    wn.zero(), wq.zero(), wo.zero();
    uint4 src[NB];
#pragma unroll
    for (int s = 0; s < NB; s++) src[s] = make_uint4(0, 0, 0, 0);
    if (ok) {
        if (wstatic) {
            wn.load(p.nw, e0), wq.load(p.qw, e0);
            if (p.onw) wo.load(p.onw, e0);
        }
#pragma unroll
        for (int s = 0; s < NB; s++)
            if (s < p.nstatic) src[s] = ld_stream(brow + s * sbs);
    }
    /* What the chain after the wait loads but may not load yet (the prefix, blocks the call's
     * contract leaves after the wait, the weights without static_weights): asked of L2 now,
     * one request a 128-byte line of each row (prefetch_line), since the projections' weight
     * streams between two reads may have evicted it (k3c_prefetch_l2: safe whoever writes
     * it). The delta was just written: in L2. */
    if (p.pf && ok) {
        prefetch_line(prefix, 16, vi == 0);
#pragma unroll
        for (int s = 0; s < NB; s++)
            if (s >= p.nstatic && s < p.nb && s != p.wb) prefetch_line(brow + s * sbs, 16, vi == 0);
        if (!wstatic) {
            prefetch_line((const W *)p.nw + e0, 8 * (int)sizeof(W), vi == 0);
            prefetch_line((const W *)p.qw + e0, 8 * (int)sizeof(W), vi == 0);
            if (p.onw) prefetch_line((const W *)p.onw + e0, 8 * (int)sizeof(W), vi == 0);
        }
    }
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }
    uint4 pb = make_uint4(0, 0, 0, 0), de = pb;
    if (ok) {
        pb = ld_coherent(prefix);
        if (delta) de = ld_coherent(delta);
        if (!wstatic) {
            wn.load(p.nw, e0), wq.load(p.qw, e0);
            if (p.onw) wo.load(p.onw, e0);
        }
#pragma unroll
        for (int s = 0; s < NB; s++)
            if (s >= p.nstatic && s < p.nb && s != p.wb) src[s] = ld_coherent(brow + s * sbs);
    }

    /* p, rounded to T and written back; then slot wb; a source slot equal to wb reads p. */
    if (delta) {
        float a[8], b[8];
        vec8<T>::unpack(pb, a);
        vec8<T>::unpack(de, b);
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] += b[e];
        pb = pack8<T>(a);
        if (ok) *(uint4 *)prefix = pb;
    }
    if (p.wb >= 0 && ok) *(uint4 *)(brow + p.wb * sbs) = pb;
    /* (a select per slot: a conditional store would become src[wb], an array in local memory) */
#pragma unroll
    for (int s = 0; s < NB; s++) src[s] = s == p.wb ? pb : src[s];
    float w[8], part[NV], cross[NX > 0 ? NX : 1];
    wq_product(wn, wq, w);
#pragma unroll
    for (int i = 0; i < NV; i++) part[i] = 0.0f;
    if constexpr (GRAM) {
        /* Each source's dot and sum of squares as below (the same per-thread operations; the
         * many-item exchange adds the warps in order, so the last bits may differ), and the
         * products of every pair of sources, all in one reduction. Sources past nb hold zeros
         * or p; the softmax gives them weight 0 and the norm skips them. */
        float all[NV + NX];
#pragma unroll
        for (int i = 0; i < NV + NX; i++) all[i] = 0.0f;
        uint32_t wd[MAXS][4];
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            const uint4 u = s == NB ? pb : src[s < NB ? s : 0];
            wd[s][0] = u.x, wd[s][1] = u.y, wd[s][2] = u.z, wd[s][3] = u.w;
        }
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float x[MAXS];
#pragma unroll
            for (int s = 0; s < MAXS; s++) x[s] = vec8<T>::elem(wd[s][e >> 1], e & 1);
#pragma unroll
            for (int s = 0; s < MAXS; s++) {
                all[2 * s] = fmaf(x[s], w[e], all[2 * s]);
                all[2 * s + 1] = fmaf(x[s], x[s], all[2 * s + 1]);
            }
#pragma unroll
            for (int s = 0, k = NV; s < MAXS; s++)
#pragma unroll
                for (int t2 = s + 1; t2 < MAXS; t2++, k++) all[k] = fmaf(x[s], x[t2], all[k]);
        }
        token_reduce<NV + NX, false, NP>(all, red, recv, phase, C, rank, bars);
#pragma unroll
        for (int i = 0; i < NV; i++) part[i] = all[i];
#pragma unroll
        for (int i = 0; i < NX; i++) cross[i] = all[NV + i];
    } else {
        float v[8];
        vec8<T>::unpack(pb, v);
        acc_source(v, w, part[2 * NB], part[2 * NB + 1]);
#pragma unroll
        for (int s = 0; s < NB; s++)
            if (s < p.nb) {
                vec8<T>::unpack(src[s], v);
                acc_source(v, w, part[2 * s], part[2 * s + 1]);
            }
        /* Unread slots (s >= nb) and idle threads hold zeros, so the sums stay exact. */
        token_reduce<NV, false, NP>(part, red, recv, phase, C, rank, bars);
    }

    float epss[MAXS];
#pragma unroll
    for (int s = 0; s < MAXS; s++) epss[s] = p.eps;
    /* ss_needs_rescale over the read sources at once: a sum of squares is +0, positive or NaN,
     * whose bits order as unsigned integers (NaN and +inf above kSsMax's), so the test is on the
     * largest and smallest bits (no branch per source). */
    uint32_t ss_hi = 0u, ss_lo = ~0u;
#pragma unroll
    for (int s = 0; s < MAXS; s++)
        if (s == NB || s < p.nb) {
            const uint32_t b = __float_as_uint(part[2 * s + 1]);
            ss_hi = max(ss_hi, b);
            ss_lo = min(ss_lo, b);
        }
    const bool rescale = ss_hi > __float_as_uint(kSsMax) || ss_lo < __float_as_uint(kSsMin);
    if (__builtin_expect(rescale, 0)) {
        /* Rare: every source's sums again on its values scaled by 2^-e (e from its max
         * magnitude; e = 0 for a source whose sum was fine leaves it bit for bit). */
        float amax[MAXS];
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            float v[8];
            vec8<T>::unpack(s == NB ? pb : src[s < NB ? s : 0], v);
            amax[s] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) amax[s] = fmaxf(amax[s], fabsf(v[e]));
        }
        token_reduce<MAXS, true, NP>(amax, red, recv, phase, C, rank, bars);
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            int e = (s == NB || s < p.nb) && ss_needs_rescale(part[2 * s + 1]) ? scale_exp(amax[s]) : 0;
            pow2_scale ps(e);
            epss[s] = ldexpf(p.eps, -2 * e);
            /* An all-zero source's logit is 0 * r: r stays finite for eps > 0, also for a
             * denormal eps, which rsqrt_normal below would read as 0 (its argument is normal on
             * every other path: a sum of squares >= 2^-100 over H, or one of values scaled to a
             * max magnitude in [0.5, 1)). */
            if (amax[s] == 0.0f && epss[s] > 0.0f) epss[s] = fmaxf(epss[s], FLT_MIN);
            part[2 * s] = part[2 * s + 1] = 0.0f;
            float v[8];
            vec8<T>::unpack(s == NB ? pb : src[s < NB ? s : 0], v);
            acc_scaled(v, w, ps, part[2 * s], part[2 * s + 1]);
        }
        token_reduce<NV, false, NP>(part, red, recv, phase, C, rank, bars);
    }

    /* Softmax over the nb block sources and p; with no block source p's weight is exactly 1. */
    float prob[MAXS], mx = -INFINITY;
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        bool active = s == NB || s < p.nb;
        prob[s] = active ? part[2 * s] * rsqrt_normal(part[2 * s + 1] * p.invH + epss[s]) : -INFINITY;
        mx = fmaxf(mx, prob[s]);
    }
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        prob[s] = (s == NB || s < p.nb) ? exp_flush(prob[s] - mx) : 0.0f;
        sum += prob[s];
    }
    const float inv_sum = 1.0f / sum;
#pragma unroll
    for (int s = 0; s < MAXS; s++) prob[s] = p.nb == 0 ? (s == NB ? 1.0f : 0.0f) : prob[s] * inv_sum;

    float m[8], sq[1] = {0.0f};
    {
        float v[8];
        vec8<T>::unpack(pb, v);
#pragma unroll
        for (int e = 0; e < 8; e++) m[e] = prob[NB] * v[e];
#pragma unroll
        for (int s = 0; s < NB; s++)
            if (s < p.nb) {
                vec8<T>::unpack(src[s], v);
#pragma unroll
                for (int e = 0; e < 8; e++) m[e] = fmaf(prob[s], v[e], m[e]);
            }
#pragma unroll
        for (int e = 0; e < 8; e++) sq[0] = fmaf(m[e], m[e], sq[0]);
    }
    T *out = (T *)p.out + t * p.H + e0;
    if (!p.onw) {
        if (ok) *(uint4 *)out = pack8<T>(m);
        return;
    }
    /* GRAM: ||m||^2 = sum_s sum_t p_s p_t <v_s, v_t> from the first reduction's totals (the
     * same on every CTA of the token, so every CTA takes the same branch). Its rounding error
     * is a few ulp of sum_s p_s ||v_s||^2 (>= (sum_s p_s ||v_s||)^2 >= sum_st p_s p_t
     * |<v_s, v_t>|, as sum_s p_s = 1), so it is used only when ||m||^2 is at least 1/64 of
     * that and nothing needed rescaling; otherwise (mixed sources that nearly cancel) the sum
     * of squares of m is reduced over the token as without GRAM. */
    bool have_sq = false;
    if constexpr (GRAM) {
        float q = 0.0f, bound = 0.0f;
#pragma unroll
        for (int s = 0; s < MAXS; s++)
            if (s == NB || s < p.nb) {
                q = fmaf(prob[s] * prob[s], part[2 * s + 1], q);
                bound = fmaf(prob[s], part[2 * s + 1], bound);
            }
#pragma unroll
        for (int s = 0, k = 0; s < MAXS; s++)
#pragma unroll
            for (int t2 = s + 1; t2 < MAXS; t2++, k++)
                if ((s == NB || s < p.nb) && (t2 == NB || t2 < p.nb))
                    q = fmaf(2.0f * prob[s] * prob[t2], cross[k], q);
        if (!rescale && q >= 0.015625f * bound && !ss_needs_rescale(q)) {
            sq[0] = q;
            have_sq = true;
        }
    }
    if (!have_sq) token_reduce<1, false, NP>(sq, red, recv, phase, C, rank, bars);
    float r;
    if (__builtin_expect(!ss_needs_rescale(sq[0]), 1)) {
        r = rsqrtf(sq[0] * p.invH + p.oeps);
    } else {
        /* Rare: the same on the mixed values scaled by 2^-e; out = m' * r' * w. */
        float mmax[1] = {0.0f};
#pragma unroll
        for (int e = 0; e < 8; e++) mmax[0] = fmaxf(mmax[0], fabsf(m[e]));
        token_reduce<1, true, NP>(mmax, red, recv, phase, C, rank, bars);
        int e = scale_exp(mmax[0]);
        pow2_scale ps(e);
        float s2[1] = {0.0f};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            m[i] = ps(m[i]);
            s2[0] = fmaf(m[i], m[i], s2[0]);
        }
        token_reduce<1, false, NP>(s2, red, recv, phase, C, rank, bars);
        r = rms_factor_scaled(s2[0], p.invH, p.oeps, e);
    }
    if (ok) {
        float on[8], o[8];
        wo.get(on);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = m[e] * r * on[e];
        *(uint4 *)out = pack8<T>(o);
    }
}

/* Launch shape for a hidden size and num_blocks: CTAs per token and threads per CTA. */
struct decode_shape {
    int ctas, threads;
};

/* The shape: K3_ATTN_RES_DECODE_CTAS = c gives c CTAs per token; else the fewest CTAs whose
 * threads (one 16-byte vector of each row per thread) stay within kPreferThreads, so that a
 * token's rows are spread over several SMs (at H 7168: 4 CTAs of 224 threads); then fewer
 * when the last CTA would idle. The 17-source instances take at most 256 threads (their
 * register arrays are twice as long). False with a reason when no shape covers H. */
const int kPreferThreads = 256;
bool decode_pick(int64_t H, int64_t nb, decode_shape *out, char *reason, size_t n) {
    int64_t vecs = H / 8;
    int maxt = max_threads(nb <= 8 ? 9 : 17);
    int force = get_knobs().decode_ctas;
    for (int pass = 0; pass < 2; pass++) {
        int lim = pass == 0 && !force ? (kPreferThreads < maxt ? kPreferThreads : maxt) : maxt;
        for (int c = force ? force : 1; c <= (force ? force : kMaxCtas); c++) {
            int nt = threads_for(vecs, c, 1, lim);
            if (!nt) continue;
            int cc = c;
            while (cc > 1 && (int64_t)(cc - 1) * nt >= vecs) cc--;
            *out = decode_shape{cc, nt};
            return true;
        }
    }
    if (force)
        snprintf(reason, n,
                 "%s with K3_ATTN_RES_DECODE_CTAS=%d supports hidden sizes up to %d at num_blocks "
                 "%lld; got %lld",
                 k3_cuda_attn_res_decode_name, force, 8 * force * maxt, (long long)nb, (long long)H);
    else
        snprintf(reason, n, "%s supports hidden sizes up to %d at num_blocks %lld; got %lld",
                 k3_cuda_attn_res_decode_name, 8 * kMaxCtas * maxt, (long long)nb, (long long)H);
    return false;
}

/* Token counts. num_blocks 0: any T. num_blocks 1..kPrefillBlocksFrom - 1: any T, except
 * that T >= kPrefillFromT goes to cuda.attn_res.ring where it takes the call (a delta, the
 * output norm, no block write, H <= 8192): at H = 7168 it is 5-20% faster there at T = 256,
 * 4096 and 16384 (notes/PERF.md, 2026-12-03 night). From kPrefillBlocksFrom on, T <=
 * decode_max_t (64 unless K3_ATTN_RES_DECODE_MAX_T says otherwise); the ring or the stream
 * kernel takes the rest. */
const int kAnyTBlocks = 0;
const int kPrefillBlocksFrom = 5;
const int64_t kPrefillFromT = 256;
k3_status decode_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    const int64_t T_ = a->prefix->size[0], maxt = get_knobs().decode_max_t, nb = a->num_blocks;
    const bool ring_takes = a->delta && a->output_norm_weight && a->write_block < 0 &&
                            a->prefix->size[1] <= kRingMaxHidden;
    /* the least T left to the ring at 1..4: kPrefillFromT, or past a larger decode_max_t */
    const int64_t from = maxt >= kPrefillFromT ? maxt + 1 : kPrefillFromT;
    if (nb > kAnyTBlocks && nb < kPrefillBlocksFrom && ring_takes && T_ >= from) {
        snprintf(reason, n,
                 "%s leaves T >= %lld tokens at num_blocks %d..%d to %s (faster there); got T = "
                 "%lld at num_blocks %lld",
                 k3_cuda_attn_res_decode_name, (long long)from, kAnyTBlocks + 1,
                 kPrefillBlocksFrom - 1, k3_cuda_attn_res_ring_name, (long long)T_,
                 (long long)nb);
        return K3_ESHAPE;
    }
    if (nb >= kPrefillBlocksFrom && nb <= kMaxBlocks && T_ > maxt) {
        snprintf(reason, n,
                 "%s serves T <= %lld tokens at num_blocks %d..%d (at num_blocks <= %d any T, "
                 "below %lld where %s takes the call); got T = %lld at num_blocks %lld",
                 k3_cuda_attn_res_decode_name, (long long)maxt, kPrefillBlocksFrom, kMaxBlocks,
                 kPrefillBlocksFrom - 1, (long long)from, k3_cuda_attn_res_ring_name,
                 (long long)T_, (long long)nb);
        return K3_ESHAPE;
    }
    K3_TRY(check_rules(k3_cuda_attn_res_decode_name, oa, call_rules{0, 0, false, 0, kMaxBlocks},
                       reason, n));
    decode_shape sh;
    if (!decode_pick(a->prefix->size[1], a->num_blocks, &sh, reason, n)) return K3_ESHAPE;
    if (T_ > (int64_t)INT_MAX / sh.ctas) {
        snprintf(reason, n, "%s launches T x %d CTAs, at most %d; got T = %lld",
                 k3_cuda_attn_res_decode_name, sh.ctas, INT_MAX, (long long)T_);
        return K3_ESHAPE;
    }
    return K3_OK;
}

template <class T, class W, int MAXS>
k3_status decode_launch_s(const decode_params &p, const decode_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    auto kern = attn_res_decode_kernel<T, W, MAXS>;
    if constexpr (MAXS <= kGramMaxSources)
        if (p.onw) kern = attn_res_decode_kernel<T, W, MAXS, true>;
    K3_TRY(launch(kern, p, dim3((unsigned)(T_ * sh.ctas)),
                  dim3((unsigned)sh.threads), 0, sh.ctas, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_decode_kernel);
    return K3_OK;
}

/* Register arrays sized to num_blocks + 1 rounded up to 2, 5, 9 or 17 sources. */
template <class T, class W>
k3_status decode_launch_w(const decode_params &p, const decode_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    if (p.nb <= 1) return decode_launch_s<T, W, 2>(p, sh, T_, stream);
    if (p.nb <= 4) return decode_launch_s<T, W, 5>(p, sh, T_, stream);
    if (p.nb <= 8) return decode_launch_s<T, W, 9>(p, sh, T_, stream);
    return decode_launch_s<T, W, 17>(p, sh, T_, stream);
}

k3_status decode_run(const k3_op_args *oa) {
    char reason[256] = "";
    k3_status s = decode_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    int64_t T_ = a->prefix->size[0], H = a->prefix->size[1];
    int dev = k3c_dev(a->prefix);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx));
    if (T_ == 0 || H == 0) return K3_OK;
    decode_shape sh;
    if (!decode_pick(H, a->num_blocks, &sh, reason, sizeof reason))
        return k3_error(K3_ESHAPE, "attn_res: %s", reason);
    decode_params p;
    fill_row_args(p, oa);
    p.wb = (int)a->write_block;
    p.wstatic = a->static_weights != 0;
    p.nstatic = (int)a->static_blocks;
    p.ctas = sh.ctas;
    p.pdl = get_knobs().pdl;
    p.pf = k3c_pdl_l2_prefetch();
    return by_types(a, [&](auto t, auto w) {
        return decode_launch_w<typename decltype(t)::type, typename decltype(w)::type>(p, sh, T_,
                                                                                      ctx->stream);
    });
}

} // namespace

/* True when the decode kernel has a loadable image for dev and dev can launch clusters. */
static bool k3c_attn_res_decode_loadable(int dev) {
    return cluster_loadable(dev, attn_res_decode_kernel<k3c_bf16, k3c_bf16, 9>);
}

extern "C" const k3_kernel k3_cuda_attn_res_decode = K3_KERNEL_RECORD_USABLE(
    k3_cuda_attn_res_decode, decode_supports, decode_run, k3c_attn_res_decode_loadable);

void k3c_attn_res_knobs_init(void) { k3ar::read_knobs(); }
