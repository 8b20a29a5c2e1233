/*
 * attn_res_decode.cu — cuda.attn_res.decode, the decode AttnRes read (T <= 64) for every case
 * of the op the Kimi-K3 stream makes (delta or none, a fused block write or none, num_blocks
 * 0..16, output norm or none) on densely packed bf16/f16 rows; the default policy puts it
 * after cuda.attn_res.packed, so it serves the reads packed declines (no delta, a fused seal,
 * num_blocks 0, no output norm). A token is a cluster of 2 CTAs (1..8) exchanging partial
 * sums through distributed shared memory; every 16-byte load of the token is in flight at
 * once, held in registers sized to num_blocks, and one reduction gives all the logits.
 * Launched with PDL; what it may load before the wait is the call's contract (k3.h).
 */
#include "attn_res.cuh"

#include <limits.h>
#include <type_traits>

using namespace k3ar;

namespace {

const int kMaxThreads = 512;
const int kMaxCtas = 8;
const int kMaxBlocks = 16;

struct decode_params {
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
template <int N, bool MAX, int NP>
__device__ __forceinline__ void token_reduce(float (&v)[N], float (*red)[NP],
                                             float (*recv)[kMaxCtas][NP], int &phase, int C,
                                             uint32_t rank) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    if (N > 1) {
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
    {
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
    }
    if (C > 1) {
        cluster_arrive();
        cluster_wait();
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
 *  3. softmax, the mix in registers, its sum of squares (a second reduction), the store.
 * The code is kept short on purpose: a decode launch runs each instruction once per warp, so
 * the instruction fetch of a long unrolled body is its critical path (notes/PERF.md). A sum of
 * squares that overflowed or underflowed is recomputed on the values scaled by a power of two
 * near their max magnitude (ss_needs_rescale), on a branch the common path never enters.
 */
template <class T, class W, int MAXS>
__global__ void __launch_bounds__(max_threads(MAXS)) attn_res_decode_kernel(const decode_params p) {
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
#pragma unroll
    for (int s = 0; s < NB; s++)
        if (s == p.wb) src[s] = pb;
    float w[8];
    {
        float x[8], y[8];
        wn.get(x);
        wq.get(y);
#pragma unroll
        for (int e = 0; e < 8; e++) w[e] = x[e] * y[e];
    }
    float part[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) part[i] = 0.0f;
    {
        float v[8];
        vec8<T>::unpack(pb, v);
        acc_source(v, w, part[2 * NB], part[2 * NB + 1]);
#pragma unroll
        for (int s = 0; s < NB; s++)
            if (s < p.nb) {
                vec8<T>::unpack(src[s], v);
                acc_source(v, w, part[2 * s], part[2 * s + 1]);
            }
    }
    /* Unread slots (s >= nb) and idle threads hold zeros, so the sums stay exact. */
    token_reduce<NV, false, NP>(part, red, recv, phase, C, rank);

    float epss[MAXS];
#pragma unroll
    for (int s = 0; s < MAXS; s++) epss[s] = p.eps;
    bool rescale = false;
#pragma unroll
    for (int s = 0; s < MAXS; s++)
        if (s == NB || s < p.nb) rescale = rescale || ss_needs_rescale(part[2 * s + 1]);
    if (rescale) {
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
        token_reduce<MAXS, true, NP>(amax, red, recv, phase, C, rank);
#pragma unroll
        for (int s = 0; s < MAXS; s++) {
            int e = (s == NB || s < p.nb) && ss_needs_rescale(part[2 * s + 1]) ? scale_exp(amax[s]) : 0;
            pow2_scale ps(e);
            epss[s] = ldexpf(p.eps, -2 * e);
            part[2 * s] = part[2 * s + 1] = 0.0f;
            float v[8];
            vec8<T>::unpack(s == NB ? pb : src[s < NB ? s : 0], v);
            acc_scaled(v, w, ps, part[2 * s], part[2 * s + 1]);
        }
        token_reduce<NV, false, NP>(part, red, recv, phase, C, rank);
    }

    /* Softmax over the nb block sources and p; with no block source p's weight is exactly 1. */
    float prob[MAXS], mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        bool active = s == NB || s < p.nb;
        prob[s] = active ? part[2 * s] * rsqrtf(part[2 * s + 1] * p.invH + epss[s]) : -INFINITY;
        mx = fmaxf(mx, prob[s]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        prob[s] = (s == NB || s < p.nb) ? __expf(prob[s] - mx) : 0.0f;
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
    token_reduce<1, false, NP>(sq, red, recv, phase, C, rank);
    float r;
    if (!ss_needs_rescale(sq[0])) {
        r = rsqrtf(sq[0] * p.invH + p.oeps);
    } else {
        /* Rare: the same on the mixed values scaled by 2^-e; out = m' * r' * w. */
        float mmax[1] = {0.0f};
#pragma unroll
        for (int e = 0; e < 8; e++) mmax[0] = fmaxf(mmax[0], fabsf(m[e]));
        token_reduce<1, true, NP>(mmax, red, recv, phase, C, rank);
        int e = scale_exp(mmax[0]);
        pow2_scale ps(e);
        float s2[1] = {0.0f};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            m[i] = ps(m[i]);
            s2[0] = fmaf(m[i], m[i], s2[0]);
        }
        token_reduce<1, false, NP>(s2, red, recv, phase, C, rank);
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

/* ---- the loop body ------------------------------------------------------------------------ */

const int kMaxSrc = kMaxBlocks + 1;
const int kItems = 2 * kMaxSrc + 2; /* two per source, padded to a multiple of 4 */

/* Warp sum of two values at once (the five exchanges of both interleaved). */
__device__ __forceinline__ void warp_sum2(float &a, float &b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

/*
 * The token-wide sum (MAX: max of non-negative values) of n items whose per-warp values lane
 * 0 of every warp has put in red[warp][i]: thread i (i < n, strided) adds item i over the warps and
 * push it into recv[phase & 1][rank][i] of every CTA of the cluster; one cluster barrier (a
 * CTA barrier when C = 1) publishes them. The caller then adds recv[..][c][i] over c in rank
 * order (every CTA the same bits). The first exchange also completes the barrier phase the
 * kernel opened at entry (every CTA has started before any remote store); alternating recv
 * buffers make a CTA write buffer b again only two barriers after every CTA last read it.
 */
using item_row = float[kItems];
template <bool MAX>
__device__ __forceinline__ item_row *exchange(int n, item_row *red, item_row (*recv)[kMaxCtas],
                                              int &phase, int C, uint32_t rank) {
    const int tid = threadIdx.x, nwarps = blockDim.x >> 5;
    __syncthreads();
    item_row *buf = recv[phase & 1];
    if (C > 1 && phase == 0) cluster_wait();
    for (int i = tid; i < n; i += blockDim.x) {
        float v = 0.0f;
#pragma unroll 1
        for (int q = 0; q < nwarps; q++) v = MAX ? fmaxf(v, red[q][i]) : v + red[q][i];
        if (C > 1)
#pragma unroll 1
            for (int c = 0; c < C; c++) st_cluster(&buf[rank][i], (uint32_t)c, v);
        else
            buf[0][i] = v;
    }
    if (C > 1) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
    phase++;
    return buf;
}

/*
 * The same read as the register body with every per-source step a loop, so that the code a
 * launch runs once per warp stays a few hundred instructions whatever num_blocks is (the
 * register body's straight-line code is fetched once per SM and paid ~0.25 µs per source on
 * the H200; notes/PERF.md). Thread `tid` of CTA `rank` owns the 16-byte vector vi = rank * NT
 * + tid of every row; the block rows it reads go to its own slots of dynamic shared memory
 * (stage[s * NT + tid], cp.async, so no barrier guards them), p stays in registers.
 *  1. before the PDL wait: the weights when static_weights, the copies of block slots <
 *     static_blocks; after it: prefix, delta, the other slots;
 *  2. p = round(prefix + delta), written back and into slot wb (stage slot wb holds p);
 *  3. per source a dot and sum of squares, warp-reduced in the loop; one exchange gives the
 *     token's sums; warp 0 (lane s: source s, lane nb: p) forms the logits and the softmax;
 *  4. the mix, its sum of squares (a second exchange), the store.
 * A sum of squares that overflowed or underflowed takes the rare branch: the maxima, then the
 * sums of the values scaled by 2^-e, each through an exchange of its own.
 */
template <class T, class W>
__global__ void __launch_bounds__(kMaxThreads) attn_res_decode_loop_kernel(const decode_params p) {
    extern __shared__ __align__(16) uint4 stage[];
    __shared__ __align__(16) float red[kMaxThreads / 32][kItems];
    __shared__ __align__(16) float recv[2][kMaxCtas][kItems];
    __shared__ float probs[kMaxSrc];
    __shared__ int sexp[kMaxSrc];
    __shared__ int rare;

    const int C = p.ctas, NT = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t rank = C > 1 ? cluster_rank() : 0;
    const int64_t t = blockIdx.x / C;
    int phase = 0;
    if (C > 1) cluster_arrive_relaxed();

    const int vi = (int)rank * NT + tid, nb = p.nb, wb = p.wb;
    const bool ok = vi < p.vecs;
    const int64_t e0 = (int64_t)vi * 8, sbs = p.sbs;
    T *prefix = (T *)p.prefix + t * p.H + e0;
    const T *delta = p.delta ? (const T *)p.delta + t * p.H + e0 : nullptr;
    T *brow = (T *)p.blocks + t * p.sbt + e0;
    uint4 *mine = stage + tid;
    const bool wstatic = p.wstatic != 0;

    wvec<T, W> wn, wq, wo;
    wn.zero(), wq.zero(), wo.zero();
    if (ok) {
        if (wstatic) {
            wn.load(p.nw, e0), wq.load(p.qw, e0);
            if (p.onw) wo.load(p.onw, e0);
        }
#pragma unroll 1
        for (int s = 0; s < p.nstatic; s++) cp_async16(mine + s * NT, brow + s * sbs);
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
#pragma unroll 1
        for (int s = p.nstatic; s < nb; s++)
            if (s != wb) cp_async16(mine + s * NT, brow + s * sbs);
    }
    cp_async_commit();

    if (delta) {
        float a[8], b[8];
        vec8<T>::unpack(pb, a);
        vec8<T>::unpack(de, b);
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] += b[e];
        pb = pack8<T>(a);
        if (ok) *(uint4 *)prefix = pb;
    }
    if (wb >= 0 && ok) *(uint4 *)(brow + wb * sbs) = pb;
    if (wb >= 0 && wb < nb) mine[wb * NT] = pb;
    float w[8];
    {
        float x[8], y[8];
        wn.get(x);
        wq.get(y);
#pragma unroll
        for (int e = 0; e < 8; e++) w[e] = x[e] * y[e];
    }
    cp_async_wait_all();

    /* Source s < nb: block slot s (this thread's stage slot); s = nb: p. Idle threads: 0. */
    auto src = [&](int s) { return !ok ? make_uint4(0, 0, 0, 0) : s < nb ? mine[s * NT] : pb; };
#pragma unroll 2
    for (int s = 0; s <= nb; s++) {
        float v[8], dot = 0.0f, ss = 0.0f;
        vec8<T>::unpack(src(s), v);
        acc_source(v, w, dot, ss);
        warp_sum2(dot, ss);
        if (lane == 0) red[warp][2 * s] = dot, red[warp][2 * s + 1] = ss;
    }
    item_row *buf = exchange<false>(2 * (nb + 1), red, recv, phase, C, rank);

    /* Warp 0, lane s <= nb: source s's totals, logit and weight. */
    bool need = false;
    float dot = 0.0f, ss = 0.0f;
    if (warp == 0) {
        if (lane <= nb)
#pragma unroll 1
            for (int c = 0; c < C; c++) dot += buf[c][2 * lane], ss += buf[c][2 * lane + 1];
        need = lane <= nb && ss_needs_rescale(ss);
        const bool any = __any_sync(0xffffffffu, need);
        if (lane == 0) rare = any;
        if (!any) {
            float lg = lane <= nb ? dot * rsqrtf(ss * p.invH + p.eps) : -INFINITY;
            float mx = warp_max(lg);
            float ex = lane <= nb ? __expf(lg - mx) : 0.0f;
            float sum = warp_sum(ex);
            if (lane <= nb) probs[lane] = nb == 0 ? 1.0f : ex * (1.0f / sum);
        }
    }
    __syncthreads();
    if (rare) {
        /* Rare: every source's sums again on its values scaled by 2^-e (e from its max
         * magnitude; e = 0 for a source whose sums were fine leaves them as they were). */
#pragma unroll 1
        for (int s = 0; s <= nb; s++) {
            float v[8], am = 0.0f;
            vec8<T>::unpack(src(s), v);
#pragma unroll
            for (int e = 0; e < 8; e++) am = fmaxf(am, fabsf(v[e]));
            am = warp_max(am);
            if (lane == 0) red[warp][s] = am;
        }
        buf = exchange<true>(nb + 1, red, recv, phase, C, rank);
        if (warp == 0 && lane <= nb) {
            float am = 0.0f;
            for (int c = 0; c < C; c++) am = fmaxf(am, buf[c][lane]);
            sexp[lane] = need ? scale_exp(am) : 0;
        }
        __syncthreads();
#pragma unroll 1
        for (int s = 0; s <= nb; s++) {
            float v[8], d2 = 0.0f, s2 = 0.0f;
            vec8<T>::unpack(src(s), v);
            acc_scaled(v, w, pow2_scale(sexp[s]), d2, s2);
            warp_sum2(d2, s2);
            if (lane == 0) red[warp][2 * s] = d2, red[warp][2 * s + 1] = s2;
        }
        buf = exchange<false>(2 * (nb + 1), red, recv, phase, C, rank);
        if (warp == 0) {
            dot = ss = 0.0f;
            if (lane <= nb)
#pragma unroll 1
                for (int c = 0; c < C; c++) dot += buf[c][2 * lane], ss += buf[c][2 * lane + 1];
            float lg = lane <= nb ? dot * rms_factor_scaled(ss, p.invH, p.eps, sexp[lane]) : -INFINITY;
            float mx = warp_max(lg);
            float ex = lane <= nb ? __expf(lg - mx) : 0.0f;
            float sum = warp_sum(ex);
            if (lane <= nb) probs[lane] = nb == 0 ? 1.0f : ex * (1.0f / sum);
        }
        __syncthreads();
    }

    float m[8], sq = 0.0f;
    {
        float v[8];
        vec8<T>::unpack(pb, v);
        const float pp = probs[nb];
#pragma unroll
        for (int e = 0; e < 8; e++) m[e] = pp * v[e];
#pragma unroll 2
        for (int s = 0; s < nb; s++) {
            vec8<T>::unpack(src(s), v);
            const float ps = probs[s];
#pragma unroll
            for (int e = 0; e < 8; e++) m[e] = fmaf(ps, v[e], m[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; e++) sq = fmaf(m[e], m[e], sq);
    }
    T *out = (T *)p.out + t * p.H + e0;
    if (!p.onw) {
        if (ok) *(uint4 *)out = pack8<T>(m);
        return;
    }
    sq = warp_sum(sq);
    if (lane == 0) red[warp][0] = sq;
    buf = exchange<false>(1, red, recv, phase, C, rank);
    float tot = 0.0f;
#pragma unroll 1
    for (int c = 0; c < C; c++) tot += buf[c][0];
    float r;
    if (!ss_needs_rescale(tot)) {
        r = rsqrtf(tot * p.invH + p.oeps);
    } else {
        /* Rare: the same on the mixed values scaled by 2^-e; out = m' * r' * w. */
        float mm = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) mm = fmaxf(mm, fabsf(m[e]));
        mm = warp_max(mm);
        if (lane == 0) red[warp][0] = mm;
        buf = exchange<true>(1, red, recv, phase, C, rank);
        mm = 0.0f;
        for (int c = 0; c < C; c++) mm = fmaxf(mm, buf[c][0]);
        const int e = scale_exp(mm);
        const pow2_scale ps(e);
        float s2 = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            m[i] = ps(m[i]);
            s2 = fmaf(m[i], m[i], s2);
        }
        s2 = warp_sum(s2);
        if (lane == 0) red[warp][0] = s2;
        buf = exchange<false>(1, red, recv, phase, C, rank);
        s2 = 0.0f;
        for (int c = 0; c < C; c++) s2 += buf[c][0];
        r = rms_factor_scaled(s2, p.invH, p.oeps, e);
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
    int maxt = get_knobs().decode_regs ? max_threads(nb <= 8 ? 9 : 17) : kMaxThreads;
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

k3_status decode_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    const char *K = k3_cuda_attn_res_decode_name;
    int64_t T = a->prefix->size[0];
    const int64_t kMaxTokens = get_knobs().decode_max_t;
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
    decode_shape sh;
    if (!decode_pick(a->prefix->size[1], a->num_blocks, &sh, reason, n))
        return K3_ESHAPE;
    return K3_OK;
}

template <class T, class W, int MAXS>
k3_status decode_launch_s(const decode_params &p, const decode_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    K3_TRY(launch(attn_res_decode_kernel<T, W, MAXS>, p, dim3((unsigned)(T_ * sh.ctas)),
                  dim3((unsigned)sh.threads), 0, sh.ctas, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_decode_kernel);
    return K3_OK;
}

/* The loop body (K3_ATTN_RES_DECODE_BODY unset), with num_blocks * threads 16-byte stage slots
 * of dynamic shared memory; else the register body, its arrays sized to num_blocks + 1
 * rounded up to 2, 5, 9 or 17 sources. */
template <class T, class W>
k3_status decode_launch_w(const decode_params &p, const decode_shape &sh, int64_t T_, int dev,
                          cudaStream_t stream) {
    if (!get_knobs().decode_regs) {
        static int raised[64];
        auto kern = attn_res_decode_loop_kernel<T, W>;
        size_t smem = (size_t)p.nb * (size_t)sh.threads * sizeof(uint4);
        K3_TRY(raise_smem(kern, dev, smem, raised));
        K3_TRY(launch(kern, p, dim3((unsigned)(T_ * sh.ctas)), dim3((unsigned)sh.threads), smem,
                      sh.ctas, p.pdl, stream));
        K3_CHECK_LAUNCH(attn_res_decode_loop_kernel);
        return K3_OK;
    }
    if (p.nb <= 1) return decode_launch_s<T, W, 2>(p, sh, T_, stream);
    if (p.nb <= 4) return decode_launch_s<T, W, 5>(p, sh, T_, stream);
    if (p.nb <= 8) return decode_launch_s<T, W, 9>(p, sh, T_, stream);
    return decode_launch_s<T, W, 17>(p, sh, T_, stream);
}

k3_status decode_run(const k3_op_args *oa) {
    char reason[256] = "";
    k3_status s = decode_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    int64_t T_ = a->prefix->size[0], H = a->prefix->size[1];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->prefix), &ctx));
    if (T_ == 0 || H == 0) return K3_OK;
    decode_shape sh;
    bool wf32 = a->norm_weight->dtype == K3_DTYPE_F32;
    if (!decode_pick(H, a->num_blocks, &sh, reason, sizeof reason))
        return k3_error(K3_ESHAPE, "attn_res: %s", reason);
    decode_params p;
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
    int dev = k3c_dev(a->prefix);
    if (a->prefix->dtype == K3_DTYPE_BF16)
        return wf32 ? decode_launch_w<k3c_bf16, float>(p, sh, T_, dev, ctx->stream)
                    : decode_launch_w<k3c_bf16, k3c_bf16>(p, sh, T_, dev, ctx->stream);
    return wf32 ? decode_launch_w<k3c_f16, float>(p, sh, T_, dev, ctx->stream)
                : decode_launch_w<k3c_f16, k3c_f16>(p, sh, T_, dev, ctx->stream);
}

} // namespace

/* True when the decode kernel has a loadable image for dev and dev can launch clusters. */
static bool k3c_attn_res_decode_loadable(int dev) {
    return cluster_loadable(dev, attn_res_decode_loop_kernel<k3c_bf16, k3c_bf16>) &&
           cluster_loadable(dev, attn_res_decode_kernel<k3c_bf16, k3c_bf16, 9>);
}

extern "C" const k3_kernel k3_cuda_attn_res_decode = K3_KERNEL_RECORD_USABLE(
    k3_cuda_attn_res_decode, decode_supports, decode_run, k3c_attn_res_decode_loadable);

void k3c_attn_res_knobs_init(void) { k3ar::read_knobs(); }
