/*
 * attn_res_generic.cu — cuda.attn_res.generic, the AttnRes read for every case of the op
 * (delta write-back, write_block, num_blocks 0..4095, output norm or none, any row strides,
 * any hidden size, bf16/f16/f32/f64 rows, weights of any dtype): the fallback behind the
 * decode and stream kernels, built to stay within a small factor of them at decode sizes.
 *
 * A token is a cluster of C CTAs (1..8; no cluster when 1) that split the hidden dim: thread
 * tid of CTA r owns the 16-byte vectors r * lv + k * NT + tid (tile k < tiles) of every row,
 * so it reads back exactly what it wrote. Sources are taken G at a time (G = 2, 5, 9 or 17 by
 * num_blocks; source 0 is p, source 1 + b block slot b): a group's vectors sit in registers,
 * every load of a group issued before any is used. When the slice is one tile and the sources
 * one group (hidden sizes up to 8 x 256 vectors at num_blocks <= 16, 8 x 512 at <= 8) the
 * rows are read once and stay in registers through the mix; otherwise each pass reads them
 * again (L1 / L2 hits). Rows whose start and stride are 16-byte aligned (decided per tensor on
 * the host) move as 16-byte vectors; others element by element into the same registers.
 * Per group one exchange gives every source's dot and sum of squares (warp shuffles, each
 * CTA's totals pushed into every CTA's shared memory, one cluster barrier); one more gives the
 * output norm. Launched with PDL: the weights (static_weights) and the slots below
 * static_blocks are loaded before the wait, everything else after it. The scale-safe norms
 * are the CPU reference's: a sum of squares that overflowed or underflowed is summed again
 * over the values scaled by 2^-e (e from their max magnitude), in the same loops as steps
 * that the common path only tests for. p and out are rounded once, as lib/cpu/attn_res.c
 * rounds them.
 */
#include "attn_res.cuh"

using namespace k3ar;

namespace {

const int64_t kGenericMaxSources = 4096;
const int kGenericMaxCtas = 8;
const int kGenericPreferThreads = 256;
const int64_t kGenericMaxClusters = 1 << 20; /* grid-stride over tokens beyond this */

/* generic_params::vec bits: that tensor's rows move as 16-byte vectors. */
enum : int { kVecPrefix = 1, kVecDelta = 2, kVecBlocks = 4, kVecOut = 8 };

struct generic_params {
    void *prefix;
    const void *delta; /* NULL: none */
    void *blocks;
    void *out;
    const void *nw, *qw, *onw; /* onw NULL: no output norm */
    int nw_dt, qw_dt, onw_dt;
    int64_t T, H, sp, sd, sbt, sbs, so; /* row strides in elements */
    int nb, wb;                          /* num_blocks; the slot written, or -1 */
    double eps, oeps;
    int64_t hv, lv, tiles; /* 16-byte vectors per row, per CTA (tiles of blockDim.x) */
    int ctas;              /* CTAs per token (a cluster when > 1) */
    int vec;               /* kVec* bits */
    int wstatic, nstatic;  /* the static_weights / static_blocks contract (k3.h) */
    int pdl;
};

/* Threads per CTA at most for G sources a group: the 17-source instances hold twice the
 * registers. */
__host__ __device__ constexpr int generic_max_threads(int G) { return G > 9 ? 256 : 512; }

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

/* ---- one 16-byte vector of a row ------------------------------------------------------------ */

/* The V = 16 / sizeof(T) elements of a vector, as bits and as elements. */
template <class T> union vec_bits {
    uint4 u;
    T e[16 / sizeof(T)];
};

/* The elements of u widened to the accumulator type (exact). */
template <class T, class A, int V> __device__ __forceinline__ void unpack(uint4 u, A (&x)[V]) {
    if constexpr (sizeof(T) == 2) {
        vec8<T>::unpack(u, x);
    } else {
        vec_bits<T> b;
        b.u = u;
#pragma unroll
        for (int i = 0; i < V; i++) x[i] = b.e[i];
    }
}

/* x rounded to T element by element, as the CPU rounds (k3c_store_acc). */
template <class T, class A, int V> __device__ __forceinline__ uint4 pack_round(const A (&x)[V]) {
    vec_bits<T> b;
#pragma unroll
    for (int i = 0; i < V; i++) b.e[i] = k3c_store_acc<T>(x[i]);
    return b.u;
}

/* round(a + b) element by element: p = round(prefix + delta). */
template <class T> __device__ __forceinline__ uint4 add_round(uint4 a, uint4 b) {
    typedef typename k3c_acc<T>::type A;
    constexpr int V = 16 / sizeof(T);
    A x[V], y[V];
    unpack<T>(a, x);
    unpack<T>(b, y);
#pragma unroll
    for (int i = 0; i < V; i++) x[i] += y[i];
    return pack_round<T>(x);
}

/* The vector at q: one 16-byte load when vec, else element by element (elements at or past
 * n read as 0). A plain coherent load: prefix, delta and unsealed slots may have been written
 * by the kernel before, and prefix and slot wb by this thread. */
template <class T> __device__ __forceinline__ uint4 load_vec(const T *q, bool vec, int64_t n) {
    if (vec) return ld_plain(q);
    vec_bits<T> b;
#pragma unroll
    for (int i = 0; i < 16 / (int)sizeof(T); i++) b.e[i] = i < n ? q[i] : T{};
    return b.u;
}

/* Stores the vector u at q: one 16-byte store when vec, else its first n elements. */
template <class T> __device__ __forceinline__ void store_vec(T *q, uint4 u, bool vec, int64_t n) {
    if (vec) {
        *(uint4 *)q = u;
        return;
    }
    vec_bits<T> b;
    b.u = u;
#pragma unroll
    for (int i = 0; i < 16 / (int)sizeof(T); i++)
        if (i < n) q[i] = b.e[i];
}

/* V weights of storage type R at q widened by conv (those at or past n are 0): 16-byte loads
 * when the V fill whole vectors and q is 16-byte aligned. */
template <class A, int V, class R, class F>
__device__ __forceinline__ void weights_from(const R *q, int64_t n, A (&w)[V], F conv) {
    constexpr int B = V * (int)sizeof(R);
    if constexpr (B % 16 == 0) {
        if (n >= V && ((uintptr_t)q & 15u) == 0) {
            union {
                uint4 u[B / 16];
                R r[V];
            } x;
#pragma unroll
            for (int j = 0; j < B / 16; j++) x.u[j] = ld_plain((const uint4 *)q + j);
#pragma unroll
            for (int i = 0; i < V; i++) w[i] = conv(x.r[i]);
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < V; i++) w[i] = i < n ? conv(q[i]) : (A)0;
}

/* Elements e.. of the weight vector p of dtype dt as A (the conversions of k3c_load_any). */
template <class A, int V>
__device__ __forceinline__ void load_weights(const void *p, int dt, int64_t e, int64_t n,
                                             A (&w)[V]) {
    switch (dt) {
    case K3_DTYPE_BF16:
        weights_from<A, V>((const uint16_t *)p + e, n, w,
                           [](uint16_t b) { return (A)k3c_bf16_to_f32(b); });
        break;
    case K3_DTYPE_F16:
        weights_from<A, V>((const uint16_t *)p + e, n, w,
                           [](uint16_t b) { return (A)k3c_f16_to_f32(b); });
        break;
    case K3_DTYPE_F32:
        weights_from<A, V>((const float *)p + e, n, w, [](float v) { return (A)v; });
        break;
    default:
        weights_from<A, V>((const double *)p + e, n, w,
                           [](double v) { return k3c_conv<A>::from_f64(v); });
        break;
    }
}


/* nw * qw at the V elements e.. (n of them in the row). */
template <class A, int V>
__device__ __forceinline__ void key_weights(const generic_params &p, int64_t e, int64_t n,
                                            A (&w)[V]) {
    A y[V];
    load_weights<A, V>(p.nw, p.nw_dt, e, n, w);
    load_weights<A, V>(p.qw, p.qw_dt, e, n, y);
#pragma unroll
    for (int i = 0; i < V; i++) w[i] *= y[i];
}

/* Loads source s0 + j of token t into src[j] for every bit j of mask: the vector at element
 * e of its row (n elements left in the row). Source 0 is the prefix row as memory holds it
 * (p once written back), source 1 + b block slot b. */
template <class T, int G>
__device__ __forceinline__ void load_group(const generic_params &p, int64_t t, int s0,
                                           unsigned mask, int64_t e, int64_t n, uint4 (&src)[G]) {
    const T *prow = (const T *)p.prefix + t * p.sp + e;
    const T *brow = (const T *)p.blocks + t * p.sbt + e;
    const bool vp = p.vec & kVecPrefix, vb = p.vec & kVecBlocks;
#pragma unroll
    for (int j = 0; j < G; j++)
        if (mask >> j & 1u) {
            const int s = s0 + j;
            src[j] = s == 0 ? load_vec(prow, vp, n) : load_vec(brow + (int64_t)(s - 1) * p.sbs, vb, n);
        }
}

/* Stores v into the shared variable `local` of CTA `rank` of this cluster (an f64 as its two
 * 32-bit halves). */
__device__ __forceinline__ void push(float *local, uint32_t rank, float v) { st_cluster(local, rank, v); }
__device__ __forceinline__ void push(double *local, uint32_t rank, double v) {
    st_cluster((float *)local, rank, __int_as_float(__double2loint(v)));
    st_cluster((float *)local + 1, rank, __int_as_float(__double2hiint(v)));
}

/*
 * Sums (use_max: maxima) of each of the N values v over every thread of the token's C CTAs:
 * warp shuffles, the warps of the CTA, then each CTA's totals pushed into every CTA's recv
 * and one cluster barrier (a CTA barrier when C = 1). Returns the buffer holding CTA c's total
 * of item i at [c * NP + i]; total() adds them in rank order, so every CTA gets the same bits
 * and takes the same branches after. The two recv buffers alternate: a CTA writes buffer b
 * again only after every CTA has passed the barrier that follows its reads of b (callers read
 * a buffer before their next exchange). The first exchange completes the barrier phase the
 * kernel opened at entry, so no remote store reaches a CTA that has not started.
 */
template <class A, int N, int NP, int MW>
__device__ __forceinline__ const A *exchange(A (&v)[N], bool use_max, A (&red)[MW][NP],
                                             A (&recv)[2][kGenericMaxCtas][NP], int &phase,
                                             int C, uint32_t rank) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = use_max ? k3c_warp_max(v[i]) : k3c_warp_sum(v[i]);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < N; i++) red[warp][i] = v[i];
    __syncthreads();
    A(*buf)[NP] = recv[phase & 1];
    if (C > 1 && phase == 0) cluster_wait();
#pragma unroll 1
    for (int j = tid; j < N * C; j += blockDim.x) {
        const int i = j % N, c = j / N;
        A s = red[0][i];
        for (int q = 1; q < nwarps; q++) s = use_max ? fmax(s, red[q][i]) : s + red[q][i];
        if (C > 1)
            push(&buf[rank][i], (uint32_t)c, s);
        else
            buf[0][i] = s;
    }
    if (C > 1) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
    phase++;
    return &buf[0][0];
}
/* Item i of an exchange's buffer: the C CTAs' totals in rank order. */
template <class A, int NP>
__device__ __forceinline__ A total(const A *buf, int i, int C, bool use_max) {
    A s = buf[i];
    for (int c = 1; c < C; c++) s = use_max ? fmax(s, buf[c * NP + i]) : s + buf[c * NP + i];
    return s;
}

/* Softmax of prob[0..nsrc) in place, by one warp (every lane calls it). */
template <class A> __device__ __forceinline__ void softmax_warp(A *prob, int nsrc, int lane) {
    A mx = -INFINITY, sum = 0;
    for (int s = lane; s < nsrc; s += 32) mx = fmax(mx, prob[s]);
    mx = k3c_warp_max(mx);
    for (int s = lane; s < nsrc; s += 32) sum += k3c_exp(prob[s] - mx);
    sum = k3c_warp_sum(sum);
    for (int s = lane; s < nsrc; s += 32) prob[s] = k3c_exp(prob[s] - mx) / sum;
}

/*
 * One token per cluster of p.ctas CTAs, grid-striding over tokens. Per token:
 *  1. per group of G sources: load every source's vector of each tile (group 0 first forms
 *     p = round(prefix + delta), writes it back and into slot wb; a source equal to slot wb
 *     takes p), accumulate dot with nw * qw and sum of squares, one exchange; warp 0 turns
 *     the totals into logits. Steps 1 (max |v|) and 2 (the sums over v * 2^-e) run only for a
 *     group whose sum of squares needs the rescale; after the last group warp 0 takes the
 *     softmax;
 *  2. the mix of the sources, its sum of squares, one exchange (steps 1 and 2 again for the
 *     rare rescale), then out = round(mix * r * output_norm_weight), or round(mix).
 * `single` (one tile, one group): the vectors stay in registers from 1 to 2, and the weights
 * across tokens. Every barrier is reached by every thread of the cluster: idle threads (past
 * the slice) hold nothing and add nothing.
 */
template <class T, int G>
__global__ void __launch_bounds__(generic_max_threads(G)) attn_res_generic_kernel(const generic_params p) {
    typedef typename k3c_acc<T>::type A;
    constexpr int V = 16 / sizeof(T);
    constexpr int N = 2 * G;
    constexpr int NP = (N + 3) & ~3;
    constexpr int MW = generic_max_threads(G) / 32;
    __shared__ __align__(16) A red[MW][NP];
    __shared__ __align__(16) A recv[2][kGenericMaxCtas][NP];
    __shared__ unsigned rescale_mask;
    extern __shared__ __align__(16) unsigned char prob_raw[];
    A *prob = (A *)prob_raw; /* the nb + 1 logits, then their softmax */

    const int NT = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int C = p.ctas;
    const uint32_t rank = C > 1 ? cluster_rank() : 0;
    int phase = 0;
    if (C > 1) cluster_arrive_relaxed();

    const int nsrc = p.nb + 1, ngroups = (nsrc + G - 1) / G;
    const bool single = p.tiles == 1 && ngroups == 1;
    /* The source that is the slot this call writes (it reads p), or -1. */
    const int alias = p.wb >= 0 && p.wb < p.nb ? 1 + p.wb : -1;
    const int64_t v_lo = (int64_t)rank * p.lv;
    const int64_t nvec = min(p.lv, p.hv - v_lo); /* >= 1: the host sizes C so */
    const int64_t e_lo = v_lo * V;
    const int64_t len = min(nvec * V, p.H - e_lo); /* elements of this CTA's slice */
    const A eps = (A)p.eps, oeps = (A)p.oeps, invH = (A)1 / (A)p.H;
    const int64_t nclusters = gridDim.x / C;
    int64_t t = blockIdx.x / C;

    uint4 src[G];
#pragma unroll
    for (int j = 0; j < G; j++) src[j] = make_uint4(0, 0, 0, 0);
    A w[V], on[V];
#pragma unroll
    for (int i = 0; i < V; i++) w[i] = on[i] = 0;
    const bool ok0 = tid < nvec;
    const int64_t e0 = e_lo + (int64_t)tid * V, n0 = len - (int64_t)tid * V;
    /* Before the wait only what the call's contract makes static (k3.h). */
    if (single && ok0 && p.wstatic) {
        key_weights<A, V>(p, e0, n0, w);
        if (p.onw) load_weights<A, V>(p.onw, p.onw_dt, e0, n0, on);
    }
    unsigned pre = 0; /* sources of the first token loaded before the wait */
    if (single && ok0 && t < p.T && p.nstatic > 0) {
        pre = ((2u << p.nstatic) - 1u) & ~1u; /* sources 1..nstatic: slots below static_blocks */
        load_group<T, G>(p, t, 0, pre, e0, n0, src);
    }
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }
    if (single && ok0 && !p.wstatic) {
        key_weights<A, V>(p, e0, n0, w);
        if (p.onw) load_weights<A, V>(p.onw, p.onw_dt, e0, n0, on);
    }

#pragma unroll 1
    for (; t < p.T; t += nclusters, pre = 0) {
        T *prow = (T *)p.prefix + t * p.sp;
        const T *drow = p.delta ? (const T *)p.delta + t * p.sd : nullptr;
        T *brow = (T *)p.blocks + t * p.sbt;
        T *orow = (T *)p.out + t * p.so;

        /* 1. Logits, group by group. */
#pragma unroll 1
        for (int g = 0; g < ngroups; g++) {
            const int s0 = g * G, gn = min(G, nsrc - s0);
            const unsigned gmask = (1u << gn) - 1u; /* gn <= 17 */
            /* Group 0 never loads the slot that reads p. */
            const unsigned lmask = s0 == 0 && alias >= 0 && alias < G ? gmask & ~(1u << alias) : gmask;
            int esc[G]; /* step 2: the scale exponent of each source (0: unscaled) */
#pragma unroll
            for (int j = 0; j < G; j++) esc[j] = 0;
            unsigned need = 0;
#pragma unroll 1
            for (int step = 0;;) {
                A part[N];
#pragma unroll
                for (int i = 0; i < N; i++) part[i] = 0;
#pragma unroll 1
                for (int64_t k = 0; k < p.tiles; k++) {
                    const int64_t vi = k * NT + tid, e = e_lo + vi * V, n = len - vi * V;
                    if (vi >= nvec) continue;
                    if (!single || step == 0) {
                        load_group<T, G>(p, t, s0, lmask & ~pre, e, n, src);
                        if (s0 == 0 && step == 0) {
                            uint4 pv = src[0];
                            if (drow) {
                                pv = add_round<T>(pv, load_vec(drow + e, p.vec & kVecDelta, n));
                                store_vec(prow + e, pv, p.vec & kVecPrefix, n);
                            }
                            if (p.wb >= 0)
                                store_vec(brow + (int64_t)p.wb * p.sbs + e, pv, p.vec & kVecBlocks, n);
                            src[0] = pv;
                        }
                        if (s0 == 0)
#pragma unroll
                            for (int j = 1; j < G; j++)
                                if (j == alias) src[j] = src[0];
                    }
                    if (p.nb == 0) continue; /* one source: its weight is exactly 1 */
                    if (!single && step != 1) key_weights<A, V>(p, e, n, w);
#pragma unroll
                    for (int j = 0; j < G; j++) {
                        if (j >= gn) break;
                        A x[V];
                        unpack<T>(src[j], x);
                        if (step == 1) {
#pragma unroll
                            for (int i = 0; i < V; i++) part[2 * j] = fmax(part[2 * j], fabs(x[i]));
                        } else {
#pragma unroll
                            for (int i = 0; i < V; i++) {
                                const A v = esc[j] ? scale2(x[i], -esc[j]) : x[i];
                                part[2 * j] += v * w[i];
                                part[2 * j + 1] += v * v;
                            }
                        }
                    }
                }
                if (p.nb == 0) break;
                const A *buf = exchange<A, N, NP, MW>(part, step == 1, red, recv, phase, C, rank);
                if (step == 1) {
#pragma unroll
                    for (int j = 0; j < G; j++)
                        if (need >> j & 1u) esc[j] = exp_of(total<A, NP>(buf, 2 * j, C, true));
                    step = 2;
                    continue;
                }
                if (warp == 0) {
                    bool bad = false;
                    if (lane < gn) {
                        const A dot = total<A, NP>(buf, 2 * lane, C, false);
                        const A ss = total<A, NP>(buf, 2 * lane + 1, C, false);
                        int es = 0;
#pragma unroll
                        for (int j = 0; j < G; j++)
                            if (j == lane) es = esc[j];
                        /* eps * 2^-2e past the range: eps outweighs the squares, the
                         * reference's 1 / sqrt(eps) on the unscaled dot (lib/cpu/rms.h). */
                        const A te = es ? scale2(eps, -2 * es) : eps;
                        prob[s0 + lane] = isinf(te) ? scale2(dot, es) * k3c_rsqrt(eps)
                                                    : dot * k3c_rsqrt(ss * invH + te);
                        bad = step == 0 && needs_rescale(ss);
                    }
                    const unsigned m = __ballot_sync(0xffffffffu, bad);
                    if (!m && g == ngroups - 1) {
                        __syncwarp();
                        softmax_warp(prob, nsrc, lane);
                    }
                    if (lane == 0) rescale_mask = m;
                }
                __syncthreads();
                need = rescale_mask;
                if (!need) break;
                step = 1; /* rare: maxima, then the sums over the scaled values */
            }
        }

        /* 2. The mix; with an output norm, steps 0 (sum of squares), 1 and 2 (rare: maxima,
         * scaled sum of squares), then 3 (the store). */
        int eo = 0;
        A r = 1, m[V];
        bool have_m = false;
#pragma unroll 1
        for (int step = p.onw ? 0 : 3;;) {
            A acc[1] = {0};
#pragma unroll 1
            for (int64_t k = 0; k < p.tiles; k++) {
                const int64_t vi = k * NT + tid, e = e_lo + vi * V, n = len - vi * V;
                if (vi >= nvec) continue;
                if (!single || !have_m) {
#pragma unroll
                    for (int i = 0; i < V; i++) m[i] = 0;
#pragma unroll 1
                    for (int g = 0; g < ngroups; g++) {
                        const int s0 = g * G, gn = min(G, nsrc - s0);
                        if (!single) {
                            const unsigned gmask = (1u << gn) - 1u;
                            load_group<T, G>(p, t, s0,
                                             s0 == 0 && alias >= 0 && alias < G ? gmask & ~(1u << alias) : gmask,
                                             e, n, src);
                            if (s0 == 0)
#pragma unroll
                                for (int j = 1; j < G; j++)
                                    if (j == alias) src[j] = src[0];
                        }
#pragma unroll
                        for (int j = 0; j < G; j++) {
                            if (j >= gn) break;
                            const A pr = p.nb == 0 ? (A)1 : prob[s0 + j];
                            A x[V];
                            unpack<T>(src[j], x);
#pragma unroll
                            for (int i = 0; i < V; i++) m[i] += pr * x[i];
                        }
                    }
                    have_m = true;
                }
                if (step == 0) {
#pragma unroll
                    for (int i = 0; i < V; i++) acc[0] += m[i] * m[i];
                } else if (step == 1) {
#pragma unroll
                    for (int i = 0; i < V; i++) acc[0] = fmax(acc[0], fabs(m[i]));
                } else if (step == 2) {
#pragma unroll
                    for (int i = 0; i < V; i++) {
                        const A v = scale2(m[i], -eo);
                        acc[0] += v * v;
                    }
                } else {
                    A o[V];
                    if (p.onw) {
                        if (!single) load_weights<A, V>(p.onw, p.onw_dt, e, n, on);
#pragma unroll
                        for (int i = 0; i < V; i++) o[i] = (eo ? scale2(m[i], -eo) : m[i]) * r * on[i];
                    } else {
#pragma unroll
                        for (int i = 0; i < V; i++) o[i] = m[i];
                    }
                    store_vec(orow + e, pack_round<T>(o), p.vec & kVecOut, n);
                }
            }
            if (step == 3) break;
            const A *buf = exchange<A, 1, NP, MW>(acc, step == 1, red, recv, phase, C, rank);
            const A tot = total<A, NP>(buf, 0, C, step == 1);
            if (step == 0 && !needs_rescale(tot)) {
                r = k3c_rsqrt(tot * invH + oeps);
                step = 3;
            } else if (step == 0) {
                step = 1; /* rare, as in 1. */
            } else if (step == 1) {
                eo = exp_of(tot);
                step = 2;
            } else {
                const A te = scale2(oeps, -2 * eo); /* past the range: as for the logits */
                r = k3c_rsqrt(isinf(te) ? oeps : tot * invH + te);
                if (isinf(te)) eo = 0;
                step = 3;
            }
        }
    }
    /* No exchange ran (num_blocks 0 without an output norm): complete the entry's phase. */
    if (C > 1 && phase == 0) cluster_wait();
}

/* ---- host ------------------------------------------------------------------------------------ */

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

/* Sources a group: num_blocks + 1 rounded up to 2, 5, 9, then groups of 17. */
int generic_group(int64_t nsrc) { return nsrc <= 2 ? 2 : nsrc <= 5 ? 5 : nsrc <= 9 ? 9 : 17; }

/* Launch shape: CTAs per token, threads per CTA, vectors per CTA and tiles of them. */
struct generic_shape {
    int ctas, threads;
    int64_t lv, tiles;
};

/* The fewest CTAs (up to maxc) whose threads, one 16-byte vector of each row apiece, stay
 * within kGenericPreferThreads (so a token's rows spread over several SMs: 4 CTAs of 224
 * threads at H 7168 bf16), else within maxt; then fewer CTAs when the last would idle. Rows
 * longer than maxc * maxt vectors take several tiles of maxt vectors per CTA. */
generic_shape generic_pick(int64_t hv, int maxt, int maxc) {
    for (int pass = 0; pass < 2; pass++) {
        const int lim = pass == 0 && kGenericPreferThreads < maxt ? kGenericPreferThreads : maxt;
        for (int c = 1; c <= maxc; c++) {
            const int nt = threads_for(hv, c, 1, lim);
            if (!nt) continue;
            while (c > 1 && (int64_t)(c - 1) * nt >= hv) c--;
            return generic_shape{c, nt, nt, 1};
        }
    }
    generic_shape sh;
    sh.threads = maxt;
    sh.tiles = ((hv + maxc - 1) / maxc + maxt - 1) / maxt;
    sh.lv = sh.tiles * maxt;
    sh.ctas = (int)((hv + sh.lv - 1) / sh.lv);
    return sh;
}

/* Whether dev can launch clusters (asked once per device). */
bool generic_clusters(int dev) {
    static int known[64]; /* 0 not asked, 1 yes, 2 no */
    if (dev >= 0 && dev < 64 && known[dev]) return known[dev] == 1;
    int cl = 0;
    if (cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        cl = 0;
    }
    if (dev >= 0 && dev < 64) known[dev] = cl ? 1 : 2;
    return cl != 0;
}

template <class T, int G>
k3_status generic_launch_g(const generic_params &p, const generic_shape &sh, cudaStream_t stream) {
    typedef typename k3c_acc<T>::type A;
    const size_t smem = (size_t)(p.nb + 1) * sizeof(A); /* <= 32 KB: no opt-in needed */
    const int64_t clusters = p.T < kGenericMaxClusters ? p.T : kGenericMaxClusters;
    K3_TRY(launch(attn_res_generic_kernel<T, G>, p, dim3((unsigned)(clusters * sh.ctas)),
                  dim3((unsigned)sh.threads), smem, sh.ctas, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_generic_kernel);
    return K3_OK;
}

/* Whether the rows of a tensor at ptr with row strides s1 (rows apart, counted when there is
 * more than one row) and s2 (elements) start on 16-byte boundaries and hold whole vectors. */
template <class T> bool rows16(const void *ptr, int64_t H, bool many, int64_t s1, int64_t s2) {
    const int64_t es = (int64_t)sizeof(T);
    return H % (16 / es) == 0 && aligned16(ptr) && (!many || (s1 * es) % 16 == 0) &&
           (s2 * es) % 16 == 0;
}

template <class T> k3_status generic_launch(const k3_attn_res_kargs *ka, int dev, cudaStream_t stream) {
    const k3_attn_res_args *a = &ka->p;
    generic_params p;
    p.prefix = k3_tensor_ptr(a->prefix);
    p.delta = a->delta ? k3_tensor_ptr(a->delta) : nullptr;
    p.blocks = k3_tensor_ptr(a->blocks);
    p.out = k3_tensor_ptr(ka->out);
    p.nw = k3_tensor_ptr(a->norm_weight);
    p.qw = k3_tensor_ptr(a->qk_weight);
    p.onw = a->output_norm_weight ? k3_tensor_ptr(a->output_norm_weight) : nullptr;
    p.nw_dt = a->norm_weight->dtype;
    p.qw_dt = a->qk_weight->dtype;
    p.onw_dt = a->output_norm_weight ? a->output_norm_weight->dtype : 0;
    p.T = a->prefix->size[0];
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
    const bool many = p.T > 1;
    p.vec = (rows16<T>(p.prefix, p.H, many, p.sp, 0) ? kVecPrefix : 0) |
            (p.delta && rows16<T>(p.delta, p.H, many, p.sd, 0) ? kVecDelta : 0) |
            (rows16<T>(p.blocks, p.H, many, p.sbt, p.sbs) ? kVecBlocks : 0) |
            (rows16<T>(p.out, p.H, many, p.so, 0) ? kVecOut : 0);
    p.wstatic = a->static_weights != 0;
    p.nstatic = (int)a->static_blocks;
    p.pdl = get_knobs().pdl;
    const int G = generic_group(p.nb + 1);
    p.hv = (p.H + (16 / (int)sizeof(T)) - 1) / (16 / (int)sizeof(T));
    const generic_shape sh =
        generic_pick(p.hv, generic_max_threads(G), generic_clusters(dev) ? kGenericMaxCtas : 1);
    p.lv = sh.lv;
    p.tiles = sh.tiles;
    p.ctas = sh.ctas;
    switch (G) {
    case 2: return generic_launch_g<T, 2>(p, sh, stream);
    case 5: return generic_launch_g<T, 5>(p, sh, stream);
    case 9: return generic_launch_g<T, 9>(p, sh, stream);
    default: return generic_launch_g<T, 17>(p, sh, stream);
    }
}

k3_status generic_run(const k3_op_args *oa) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    char reason[256] = "";
    k3_status s = generic_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    int64_t T = ka->p.prefix->size[0], H = ka->p.prefix->size[1];
    const int dev = k3c_dev(ka->p.prefix);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx));
    if (T == 0) return K3_OK;
    if (H == 0) return K3_OK; /* nothing to read or write: every row is empty */
    K3C_DISPATCH_DTYPE(ka->p.prefix->dtype, TT, K3_TRY(generic_launch<TT>(ka, dev, ctx->stream)));
    return K3_OK;
}

} // namespace

extern "C" const k3_kernel k3_cuda_attn_res_generic =
    K3_KERNEL_RECORD(k3_cuda_attn_res_generic, generic_supports, generic_run);
