/*
 * attn_res_generic.cu — cuda.attn_res.generic, the AttnRes read for every case of the op
 * (delta write-back, write_block, num_blocks 0..4095, output norm or none, any row strides,
 * any hidden size, bf16/f16/f32/f64 rows, weights of any dtype): the fallback behind the
 * decode and stream kernels, built to stay within a small factor of them at decode sizes.
 *
 * A token is a cluster of C CTAs (1..8; no cluster when 1) that split the hidden dim: thread
 * tid of CTA r owns the 16-byte vectors r * lv + k * NT + tid (tile k < tiles) of every row,
 * so it reads back exactly what it wrote. Sources are taken G at a time (G = 2, 5, 9 or 17 by
 * num_blocks; source 0 is p, source 1 + b block slot b). Rows whose start and stride are
 * 16-byte aligned (decided per tensor on the host) move as 16-byte vectors; others element
 * by element into the same registers. Two kernels share that layout:
 *  - the one-tile kernel (one tile and one group: hidden sizes up to 8 x 256 vectors at
 *    num_blocks <= 16, 8 x 512 at <= 8, so every shape the decode kernel serves): a
 *    straight-line body with the token's vectors in registers from the loads to the store.
 *    One exchange gives every source's dot and sum of squares, every warp turns them into
 *    the softmax, one more gives the output norm; each exchange is the decode kernel's
 *    one-way notification (st.async into every CTA, each CTA waiting on its own mbarrier).
 *    What the common path does not need (the scale-safe recomputations, the element paths)
 *    sits in uniform branches of whole blocks, so its instruction stream stays short: a
 *    decode launch runs each instruction once per warp, fetched cold (notes/PERF.md);
 *  - the general kernel (longer rows, num_blocks >= 17): runtime tile, group and step loops,
 *    a group's vectors in registers, every load of a group issued before any is used, and
 *    the rows read again per pass (L1 / L2 hits); per group one exchange (each CTA's totals
 *    pushed into every CTA's shared memory, one cluster barrier), one more for the output
 *    norm.
 * Both take the same operations in the same order for every item (the xor butterfly over a
 * warp's lanes, the warps in order, the CTAs in rank order), so their bits agree. Launched
 * with PDL: the one-tile kernel loads the weights (static_weights) and the slots below
 * static_blocks before the wait, the general one everything after it. The scale-safe norms
 * are the CPU reference's: a sum of squares that overflowed or underflowed is summed again
 * over the values scaled by 2^-e (e from their max magnitude). p and out are rounded once,
 * as lib/cpu/attn_res.c rounds them.
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
 * registers. Both kernels declare one CTA per SM as their minimum (__launch_bounds__), so
 * ptxas gives them the registers their rows need (up to 65536 / threads) instead of
 * spilling to fit two. */
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

/* The rare paths' tests below carry __builtin_expect, so the compiler lays their code out of
 * the common path's instruction stream (a decode launch fetches that stream cold). */

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

/* x rounded to T element by element, as the CPU rounds (k3c_store_acc). For bf16 and f16
 * the conversion instructions round to nearest even with subnormals and overflow to infinity,
 * the CPU's bits for every value but NaN (they return a canonical NaN, the CPU keeps the
 * payload's top): a vector holding a NaN takes the CPU's conversion. */
template <class T, class A, int V> __device__ __forceinline__ uint4 pack_round(const A (&x)[V]) {
    if constexpr (sizeof(T) == 2) {
        bool nan = false;
#pragma unroll
        for (int i = 0; i < V; i++) nan = nan || x[i] != x[i];
        if (__builtin_expect(!nan, 1)) return pack8<T>(x);
    }
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
    if (__builtin_expect(vec, 1)) return ld_plain(q);
    vec_bits<T> b;
#pragma unroll
    for (int i = 0; i < 16 / (int)sizeof(T); i++) b.e[i] = i < n ? q[i] : T{};
    return b.u;
}

/* Stores the vector u at q: one 16-byte store when vec, else its first n elements. */
template <class T> __device__ __forceinline__ void store_vec(T *q, uint4 u, bool vec, int64_t n) {
    if (__builtin_expect(vec, 1)) {
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
        if (__builtin_expect(n >= V && ((uintptr_t)q & 15u) == 0, 1)) {
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
/* total() with the C loads issued at once (the one-tile kernel: on its chain, and registers
 * to spare). */
template <class A, int NP>
__device__ __forceinline__ A total_at_once(const A *buf, int i, int C, bool use_max) {
    A r[kGenericMaxCtas];
#pragma unroll
    for (int c = 0; c < kGenericMaxCtas; c++) r[c] = buf[c * NP + i]; /* past C: unused */
    A s = r[0];
#pragma unroll
    for (int c = 1; c < kGenericMaxCtas; c++)
        if (c < C) s = use_max ? fmax(s, r[c]) : s + r[c];
    return s;
}

/* A source's logit from its dot with nw * qw and its sum of squares over the token, both
 * taken over the values scaled by 2^-es (es = 0: unscaled). eps * 2^-2es past the range: eps
 * outweighs the squares, the reference's 1 / sqrt(eps) on the unscaled dot (lib/cpu/rms.h). */
template <class A> __device__ __forceinline__ A logit(A dot, A ss, int es, A eps, A invH) {
    const A te = es ? scale2(eps, -2 * es) : eps;
    const bool past = isinf(te);
    return (past && es ? scale2(dot, es) : dot) * k3c_rsqrt(past ? eps : ss * invH + te);
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

/* CTA `rank`'s slice of every row: nvec 16-byte vectors of V elements (>= 1: the host sizes C
 * so) from element e_lo, len elements (the row's last vector may be partial). */
struct cta_slice {
    int64_t nvec, e_lo, len;
    __device__ __forceinline__ cta_slice(const generic_params &p, uint32_t rank, int V) {
        const int64_t v_lo = (int64_t)rank * p.lv;
        nvec = min(p.lv, p.hv - v_lo);
        e_lo = v_lo * V;
        len = min(nvec * V, p.H - e_lo);
    }
};

/*
 * The general kernel (several tiles or several groups; one of each takes the one-tile kernel
 * below). One token per cluster of p.ctas CTAs, grid-striding over tokens, everything loaded
 * after the PDL wait. Per token:
 *  1. per group of G sources: load every source's vector of each tile (group 0 first forms
 *     p = round(prefix + delta), writes it back and into slot wb; a source equal to slot wb
 *     takes p), accumulate dot with nw * qw and sum of squares, one exchange; warp 0 turns
 *     the totals into logits. Steps 1 (max |v|) and 2 (the sums over v * 2^-e) run only for a
 *     group whose sum of squares needs the rescale; after the last group warp 0 takes the
 *     softmax;
 *  2. the mix of the sources (their rows read again, group by group), its sum of squares, one
 *     exchange (steps 1 and 2 again for the rare rescale), then out = round(mix * r *
 *     output_norm_weight), or round(mix).
 * Every barrier is reached by every thread of the cluster: idle threads (past the slice) hold
 * nothing and add nothing.
 */
template <class T, int G>
__global__ void __launch_bounds__(generic_max_threads(G), 1)
    attn_res_generic_kernel(const generic_params p) {
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
    /* The source that is the slot this call writes (it reads p), or -1. */
    const int alias = p.wb >= 0 && p.wb < p.nb ? 1 + p.wb : -1;
    const cta_slice sl(p, rank, V);
    const int64_t nvec = sl.nvec, e_lo = sl.e_lo, len = sl.len;
    const A eps = (A)p.eps, oeps = (A)p.oeps, invH = (A)1 / (A)p.H;
    const int64_t nclusters = gridDim.x / C;
    int64_t t = blockIdx.x / C;

    uint4 src[G];
#pragma unroll
    for (int j = 0; j < G; j++) src[j] = make_uint4(0, 0, 0, 0);
    A w[V], on[V];
#pragma unroll
    for (int i = 0; i < V; i++) w[i] = on[i] = 0;
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }

#pragma unroll 1
    for (; t < p.T; t += nclusters) {
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
                    load_group<T, G>(p, t, s0, lmask, e, n, src);
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
                    if (p.nb == 0) continue; /* one source: its weight is exactly 1 */
                    if (step != 1) key_weights<A, V>(p, e, n, w);
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
                        prob[s0 + lane] = logit(dot, ss, es, eps, invH);
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
#pragma unroll 1
        for (int step = p.onw ? 0 : 3;;) {
            A acc[1] = {0};
#pragma unroll 1
            for (int64_t k = 0; k < p.tiles; k++) {
                const int64_t vi = k * NT + tid, e = e_lo + vi * V, n = len - vi * V;
                if (vi >= nvec) continue;
#pragma unroll
                for (int i = 0; i < V; i++) m[i] = 0;
#pragma unroll 1
                for (int g = 0; g < ngroups; g++) {
                    const int s0 = g * G, gn = min(G, nsrc - s0);
                    const unsigned gmask = (1u << gn) - 1u;
                    load_group<T, G>(p, t, s0,
                                     s0 == 0 && alias >= 0 && alias < G ? gmask & ~(1u << alias) : gmask,
                                     e, n, src);
                    if (s0 == 0)
#pragma unroll
                        for (int j = 1; j < G; j++)
                            if (j == alias) src[j] = src[0];
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
                        load_weights<A, V>(p.onw, p.onw_dt, e, n, on);
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

/* ---- the one-tile kernel --------------------------------------------------------------------- */

/*
 * The one-tile kernel's exchange: the sums (MAX: maxima) of the N values v over every thread
 * of the token's C CTAs, in exchange()'s order (so its bits): the xor butterfly over a warp's
 * lanes (spread_step), the warps in order, then total_at_once() adds the CTAs in rank order. Each
 * CTA's totals reach every CTA of the cluster by st.async, each store completing sizeof(A)
 * bytes of the receiver's mbarrier bars[phase & 1], and each CTA waits on its own barrier for
 * its C x N totals: a one-way notification instead of a cluster barrier, as in the decode
 * kernel. Warp partials, receive buffers and barriers alternate: a CTA writes buffer b again
 * only after every CTA has read it (a CTA sends its next totals only after the __syncthreads
 * that follows its reads; callers read a buffer before their next exchange). The first
 * exchange completes the cluster barrier phase the kernel opened at entry, so no remote store
 * reaches a CTA that has not started and initialised its barriers. C = 1 (bars NULL): shared
 * memory and a __syncthreads. Returns the buffer holding CTA c's total of item i at
 * [c * NP + i].
 */
template <bool MAX, class A, int N, int NP, int MW>
__device__ __forceinline__ const A *exchange_one(A (&v)[N], A (&reds)[2][MW][NP],
                                                 A (&recv)[2][kGenericMaxCtas][NP], uint64_t *bars,
                                                 int &phase, int C, uint32_t rank) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    uint64_t *bar = bars ? &bars[phase & 1] : nullptr;
    if (bar && tid == 0) mbar_arrive_expect(bar, (uint32_t)(C * N * sizeof(A)));
    A(*red)[NP] = reds[phase & 1];
    warp_totals<MAX>(v, red[warp], lane);
    __syncthreads();
    A(*buf)[NP] = recv[phase & 1];
    if (bar && phase == 0) cluster_wait();
    /* Thread j adds item j % N over the warps and sends it to CTA j / N. */
    for (int j = tid; j < N * C; j += blockDim.x) {
        const int i = j % N, c = j / N;
        /* Every warp's slot loaded at once (those past nwarps unused), then added in order. */
        A r[MW];
#pragma unroll
        for (int q = 0; q < MW; q++) r[q] = red[q][i];
        A s = r[0];
#pragma unroll
        for (int q = 1; q < MW; q++)
            if (q < nwarps) s = MAX ? fmax(s, r[q]) : s + r[q];
        if (bar)
            st_async(&buf[rank][i], bar, (uint32_t)c, s);
        else
            buf[0][i] = s;
    }
    if (bar)
        mbar_wait(bar, (uint32_t)(phase >> 1) & 1u);
    else
        __syncthreads();
    phase++;
    return &buf[0][0];
}

/* Loads block source j (slot j - 1; brow: slot 0 at this thread's element) into src[j] for
 * every bit j of mask: one branch for the tensor's 16-byte or element path. */
template <class T, int G>
__device__ __forceinline__ void load_blocks(const T *brow, int64_t sbs, bool vec, unsigned mask,
                                            int64_t n, uint4 (&src)[G]) {
    if (__builtin_expect(vec, 1)) {
#pragma unroll
        for (int j = 1; j < G; j++)
            if (mask >> j & 1u) src[j] = ld_plain(brow + (int64_t)(j - 1) * sbs);
    } else {
#pragma unroll
        for (int j = 1; j < G; j++)
            if (mask >> j & 1u) src[j] = load_vec(brow + (int64_t)(j - 1) * sbs, false, n);
    }
}

/*
 * One tile, one group (p.tiles == 1, num_blocks + 1 <= G): thread tid of CTA `rank` owns the
 * vector at element e = (rank * lv + tid) * V of every row, one token per cluster, grid-striding
 * over tokens (the weights stay in registers across them). Per token the arithmetic is the
 * general kernel's, operation for operation, so both give the same bits:
 *  1. before the PDL wait, what the call's contract makes static (k3.h): the weights
 *     (static_weights), the first token's slots below static_blocks; after it, the prefix,
 *     delta, the other slots (and the weights), every load issued before any is used;
 *  2. p = round(prefix + delta), written back and into slot wb (a source equal to slot wb
 *     takes p); every source's dot with nw * qw and sum of squares, one exchange;
 *  3. every warp turns the totals into the logits (lane s: source s) and the softmax, and
 *     passes the probabilities to its lanes by shuffles (no shared memory, no barrier);
 *  4. the mix, its sum of squares, one exchange, out = round(mix * r * output_norm_weight), or
 *     round(mix).
 * The rare steps (a sum of squares that needs the rescale: maxima, an exchange, the sums over
 * the scaled values, another) run in uniform branches: every CTA holds the same totals and
 * takes the same ones. Idle threads (past the slice) load and store nothing and add zeros.
 */
template <class T, int G>
__global__ void __launch_bounds__(generic_max_threads(G), 1)
    attn_res_generic_one_kernel(const generic_params p) {
    typedef typename k3c_acc<T>::type A;
    constexpr int V = 16 / sizeof(T);
    constexpr int N = 2 * G;
    constexpr int NP = (N + 3) & ~3;
    constexpr int MW = generic_max_threads(G) / 32;
    __shared__ __align__(16) A red[2][MW][NP];
    __shared__ __align__(16) A recv[2][kGenericMaxCtas][NP];
    __shared__ __align__(8) uint64_t mbars[2];

    const int tid = threadIdx.x, lane = tid & 31;
    const int C = p.ctas;
    const uint32_t rank = C > 1 ? cluster_rank() : 0;
    int phase = 0;
    uint64_t *bars = exchange_init(mbars, C);

    const int nsrc = p.nb + 1; /* <= G */
    /* The source that is the slot this call writes (it reads p), or -1; the block sources
     * loaded: all but that one. */
    const int alias = p.wb >= 0 && p.wb < p.nb ? 1 + p.wb : -1;
    const unsigned bmask = ((1u << nsrc) - 2u) & ~(alias >= 0 ? 1u << alias : 0u);
    const cta_slice sl(p, rank, V);
    const int64_t nvec = sl.nvec, e_lo = sl.e_lo, len = sl.len;
    const bool ok = tid < nvec;
    const int64_t e = e_lo + (int64_t)tid * V, n = len - (int64_t)tid * V;
    const bool vp = p.vec & kVecPrefix, vd = p.vec & kVecDelta, vb = p.vec & kVecBlocks,
               vo = p.vec & kVecOut;
    const A eps = (A)p.eps, oeps = (A)p.oeps, invH = (A)1 / (A)p.H;
    const int64_t nclusters = gridDim.x / C;
    int64_t t = blockIdx.x / C;

    uint4 src[G];
#pragma unroll
    for (int j = 0; j < G; j++) src[j] = make_uint4(0, 0, 0, 0);
    A w[V], on[V];
#pragma unroll
    for (int i = 0; i < V; i++) w[i] = on[i] = 0;
    /* 1. Side 0, before the PDL wait: only what the call's contract makes static; side 1,
     * after it: the weights otherwise (one copy of their loads for both sides). */
    unsigned pre = 0; /* sources of the first token loaded before the wait */
#pragma unroll 1
    for (int side = 0; side < 2; side++) {
        if (side == 1 && p.pdl) {
            pdl_wait();
            pdl_launch_dependents();
        }
        if (ok && side == (p.wstatic ? 0 : 1)) {
            key_weights<A, V>(p, e, n, w);
            if (p.onw) load_weights<A, V>(p.onw, p.onw_dt, e, n, on);
        }
        if (side == 0 && ok && t < p.T && p.nstatic > 0) {
            pre = ((2u << p.nstatic) - 1u) & ~1u; /* sources 1..nstatic: slots below static_blocks */
            load_blocks<T, G>((const T *)p.blocks + t * p.sbt + e, p.sbs, vb, pre, n, src);
        }
    }

#pragma unroll 1
    for (; t < p.T; t += nclusters, pre = 0) {
        T *prow = (T *)p.prefix + t * p.sp + e;
        T *brow = (T *)p.blocks + t * p.sbt + e;
        uint4 pv = make_uint4(0, 0, 0, 0);
        if (ok) {
            pv = load_vec(prow, vp, n);
            uint4 dv = pv;
            if (p.delta) dv = load_vec((const T *)p.delta + t * p.sd + e, vd, n);
            load_blocks<T, G>(brow, p.sbs, vb, bmask & ~pre, n, src);
            /* 2. p, rounded once, written back; then slot wb. */
            if (p.delta) {
                pv = add_round<T>(pv, dv);
                store_vec(prow, pv, vp, n);
            }
            if (p.wb >= 0) store_vec(brow + (int64_t)p.wb * p.sbs, pv, vb, n);
        }
        src[0] = pv;
#pragma unroll
        for (int j = 1; j < G; j++)
            if (j == alias) src[j] = pv;

        /* 2-3. The logits and their softmax; with one source its weight is exactly 1. */
        A prob[G];
#pragma unroll
        for (int j = 0; j < G; j++) prob[j] = 1;
        if (p.nb > 0) {
            A part[N];
#pragma unroll
            for (int i = 0; i < N; i++) part[i] = 0;
            if (ok)
#pragma unroll
                for (int j = 0; j < G; j++)
                    if (j < nsrc) {
                        A x[V];
                        unpack<T>(src[j], x);
#pragma unroll
                        for (int i = 0; i < V; i++) {
                            part[2 * j] += x[i] * w[i];
                            part[2 * j + 1] += x[i] * x[i];
                        }
                    }
            const A *buf = exchange_one<false>(part, red, recv, bars, phase, C, rank);
            A dot = 0, ss = 0;
            if (lane < nsrc) {
                dot = total_at_once<A, NP>(buf, 2 * lane, C, false);
                ss = total_at_once<A, NP>(buf, 2 * lane + 1, C, false);
            }
            A lg = logit(dot, ss, 0, eps, invH);
            const unsigned need = __ballot_sync(0xffffffffu, lane < nsrc && needs_rescale(ss));
            if (__builtin_expect(need != 0, 0)) {
                /* Rare: every source's max magnitude over the token; then the sums again over
                 * its values scaled by 2^-e (e = 0, the same sums, where they were fine). */
                A mx[G];
#pragma unroll
                for (int j = 0; j < G; j++) mx[j] = 0;
                if (ok)
#pragma unroll
                    for (int j = 0; j < G; j++)
                        if (j < nsrc) {
                            A x[V];
                            unpack<T>(src[j], x);
#pragma unroll
                            for (int i = 0; i < V; i++) mx[j] = fmax(mx[j], fabs(x[i]));
                        }
                const A *bm = exchange_one<true>(mx, red, recv, bars, phase, C, rank);
                int esc[G];
#pragma unroll
                for (int j = 0; j < G; j++)
                    esc[j] = need >> j & 1u ? exp_of(total_at_once<A, NP>(bm, j, C, true)) : 0;
#pragma unroll
                for (int i = 0; i < N; i++) part[i] = 0;
                if (ok)
#pragma unroll
                    for (int j = 0; j < G; j++)
                        if (j < nsrc) {
                            A x[V];
                            unpack<T>(src[j], x);
#pragma unroll
                            for (int i = 0; i < V; i++) {
                                const A v = esc[j] ? scale2(x[i], -esc[j]) : x[i];
                                part[2 * j] += v * w[i];
                                part[2 * j + 1] += v * v;
                            }
                        }
                const A *b2 = exchange_one<false>(part, red, recv, bars, phase, C, rank);
                int es = 0;
#pragma unroll
                for (int j = 0; j < G; j++)
                    if (j == lane) es = esc[j];
                if (lane < nsrc) {
                    dot = total_at_once<A, NP>(b2, 2 * lane, C, false);
                    ss = total_at_once<A, NP>(b2, 2 * lane + 1, C, false);
                }
                lg = logit(dot, ss, es, eps, invH);
            }
            /* softmax_warp's operations with lane s holding source s (nsrc <= 17). */
            A mxl = -INFINITY, sum = 0, ex = 0;
            if (lane < nsrc) mxl = fmax(mxl, lg);
            mxl = k3c_warp_max(mxl);
            if (lane < nsrc) {
                ex = k3c_exp(lg - mxl);
                sum += ex;
            }
            sum = k3c_warp_sum(sum);
            const A pl = ex / sum;
#pragma unroll
            for (int j = 0; j < G; j++) prob[j] = __shfl_sync(0xffffffffu, pl, j);
        }

        /* 4. The mix, the output norm and the store. */
        A m[V];
#pragma unroll
        for (int i = 0; i < V; i++) m[i] = 0;
        if (ok)
#pragma unroll
            for (int j = 0; j < G; j++)
                if (j < nsrc) {
                    const A pr = prob[j];
                    A x[V];
                    unpack<T>(src[j], x);
#pragma unroll
                    for (int i = 0; i < V; i++) m[i] += pr * x[i];
                }
        A o[V];
        if (p.onw) {
            A acc[1] = {0};
            if (ok)
#pragma unroll
                for (int i = 0; i < V; i++) acc[0] += m[i] * m[i];
            const A *bo = exchange_one<false>(acc, red, recv, bars, phase, C, rank);
            const A tot = total_at_once<A, NP>(bo, 0, C, false);
            A r;
            int eo = 0;
            if (__builtin_expect(!needs_rescale(tot), 1)) {
                r = k3c_rsqrt(tot * invH + oeps);
            } else {
                /* Rare: the max magnitude of the mix over the token, then its sum of squares
                 * over the values scaled by 2^-eo (past the range: as for the logits). */
                A mm[1] = {0};
                if (ok)
#pragma unroll
                    for (int i = 0; i < V; i++) mm[0] = fmax(mm[0], fabs(m[i]));
                const A *bm = exchange_one<true>(mm, red, recv, bars, phase, C, rank);
                eo = exp_of(total_at_once<A, NP>(bm, 0, C, true));
                A s2[1] = {0};
                if (ok)
#pragma unroll
                    for (int i = 0; i < V; i++) {
                        const A v = scale2(m[i], -eo);
                        s2[0] += v * v;
                    }
                const A *b2 = exchange_one<false>(s2, red, recv, bars, phase, C, rank);
                const A tot2 = total_at_once<A, NP>(b2, 0, C, false);
                const A te = scale2(oeps, -2 * eo);
                r = k3c_rsqrt(isinf(te) ? oeps : tot2 * invH + te);
                if (isinf(te)) eo = 0;
                if (eo)
#pragma unroll
                    for (int i = 0; i < V; i++) m[i] = scale2(m[i], -eo);
            }
#pragma unroll
            for (int i = 0; i < V; i++) o[i] = m[i] * r * on[i];
        } else {
#pragma unroll
            for (int i = 0; i < V; i++) o[i] = m[i];
        }
        if (ok) store_vec((T *)p.out + t * p.so + e, pack_round<T>(o), vo, n);
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

/* One tile and one group (every source's vector of a thread in registers at once): the
 * one-tile kernel; otherwise the general one. */
template <class T, int G>
k3_status generic_launch_g(const generic_params &p, const generic_shape &sh, cudaStream_t stream) {
    typedef typename k3c_acc<T>::type A;
    const int64_t clusters = p.T < kGenericMaxClusters ? p.T : kGenericMaxClusters;
    const dim3 grid((unsigned)(clusters * sh.ctas)), block((unsigned)sh.threads);
    if (p.tiles == 1 && p.nb + 1 <= G) {
        K3_TRY(launch(attn_res_generic_one_kernel<T, G>, p, grid, block, 0, sh.ctas, p.pdl, stream));
        K3_CHECK_LAUNCH(attn_res_generic_one_kernel);
        return K3_OK;
    }
    const size_t smem = (size_t)(p.nb + 1) * sizeof(A); /* <= 32 KB: no opt-in needed */
    K3_TRY(launch(attn_res_generic_kernel<T, G>, p, grid, block, smem, sh.ctas, p.pdl, stream));
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
