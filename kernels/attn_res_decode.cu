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
const int64_t kMaxTokens = 64;
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

template <class T, class W, int MAXS, int V>
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
#pragma unroll
        for (int s = 0; s < NB; s++) {
            if (s >= p.nb) continue;
            vec8<T>::unpack(src[s][k], v);
            acc_source(v, w, 1.0f, 1.0f, part[2 * s], part[2 * s + 1]);
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
        /* Rare: recompute every source's sums on its values scaled by 2^-e (e from its max
         * magnitude; e = 0 leaves a source's sums bit for bit as they were). */
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
        token_reduce<MAXS, true, NP>(amax, red, recv, phase, C, rank);
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
        token_reduce<NV, false, NP>(part, red, recv, phase, C, rank);
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
        }
    }
    T *out = (T *)p.out + row;
    if (!p.onw) {
#pragma unroll
        for (int k = 0; k < V; k++)
            if (ok[k]) *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(m[k]);
        return;
    }
    token_reduce<1, false, NP>(sq, red, recv, phase, C, rank);
    float r;
    if (!ss_needs_rescale(sq[0])) {
        r = 1.0f / sqrtf(sq[0] * p.invH + p.oeps);
    } else {
        /* Rare: the same on the mixed values scaled by 2^-e; out = m' * r' * w. */
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) mmax[0] = fmaxf(mmax[0], fabsf(m[k][e]));
        token_reduce<1, true, NP>(mmax, red, recv, phase, C, rank);
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
        token_reduce<1, false, NP>(s2, red, recv, phase, C, rank);
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

/* Launch shape for a hidden size and num_blocks. */
struct decode_shape {
    int ctas, threads, v;
};

/* The shape: with K3_ATTN_RES_DECODE_CTAS = c, c CTAs per token; else two (a cluster of 2:
 * 3.64 µs against one CTA's 4.08 at T = 1, num_blocks 1, H 7168, and 8.09 against 9.29 at
 * num_blocks 8; H200, notes/PERF.md) or one when the second would idle, then the fewest that fit. Two vectors per thread only for num_blocks <= 8 and 16-bit
 * weights (ptxas -v, sm_90a: these stay within 128 registers; the others would spill). False
 * with a reason when no shape covers H. */
bool decode_pick(int64_t H, int64_t nb, bool wf32, decode_shape *out, char *reason, size_t n) {
    int64_t vecs = H / 8;
    int maxv = nb <= 8 && !wf32 ? 2 : 1;
    int maxt = nb <= 8 ? kMaxThreads : 256;
    int force = get_knobs().decode_ctas;
    int lo = force ? force : 2, hi = force ? force : kMaxCtas;
    for (int c = lo; c <= hi; c++)
        for (int v = 1; v <= maxv; v++) {
            int nt = threads_for(vecs, c, v, maxt);
            if (!nt) continue;
            /* Fewer CTAs than asked when the last would idle (small H). */
            int cc = c;
            while (cc > 1 && (int64_t)(cc - 1) * nt * v >= vecs) cc--;
            *out = decode_shape{cc, nt, v};
            return true;
        }
    if (force)
        snprintf(reason, n,
                 "cuda.attn_res.decode with K3_ATTN_RES_DECODE_CTAS=%d supports hidden sizes up "
                 "to %d at num_blocks %lld; got %lld",
                 force, 8 * force * maxt * maxv, (long long)nb, (long long)H);
    else
        snprintf(reason, n,
                 "cuda.attn_res.decode supports hidden sizes up to %d at num_blocks %lld; got %lld",
                 8 * kMaxCtas * maxt * maxv, (long long)nb, (long long)H);
    return false;
}

k3_status decode_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    const char *K = "cuda.attn_res.decode";
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
    decode_shape sh;
    if (!decode_pick(a->prefix->size[1], a->num_blocks, a->norm_weight->dtype == K3_DTYPE_F32, &sh,
                     reason, n))
        return K3_ESHAPE;
    return K3_OK;
}

template <class T, class W, int MAXS, int V>
k3_status decode_launch_t(const decode_params &p, const decode_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    K3_TRY(launch(attn_res_decode_kernel<T, W, MAXS, V>, p, dim3((unsigned)(T_ * sh.ctas)),
                  dim3((unsigned)sh.threads), 0, sh.ctas, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_decode_kernel);
    return K3_OK;
}

/* The instance of MAXS sources (num_blocks + 1 <= MAXS) for the shape's vectors per thread. */
template <class T, class W, int MAXS>
k3_status decode_launch_s(const decode_params &p, const decode_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    if (sh.v == 1) return decode_launch_t<T, W, MAXS, 1>(p, sh, T_, stream);
    /* decode_pick gives two vectors per thread only with 16-bit weights and num_blocks <= 8. */
    if constexpr (!std::is_same<W, float>::value && MAXS <= 9)
        return decode_launch_t<T, W, MAXS, 2>(p, sh, T_, stream);
    return k3_error(K3_EINTERNAL, "attn_res: cuda.attn_res.decode: no instance for num_blocks %d "
                                  "with %d vectors per thread",
                    p.nb, sh.v);
}

/* Register arrays sized to num_blocks rounded up to 1, 4, 8 or 16 sources. */
template <class T, class W>
k3_status decode_launch_w(const decode_params &p, const decode_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    if (p.nb <= 1) return decode_launch_s<T, W, 2>(p, sh, T_, stream);
    if (p.nb <= 4) return decode_launch_s<T, W, 5>(p, sh, T_, stream);
    if (p.nb <= 8) return decode_launch_s<T, W, 9>(p, sh, T_, stream);
    return decode_launch_s<T, W, 17>(p, sh, T_, stream);
}

k3_status decode_run(const k3_op_args *oa) {
    K3_TRY(check_args(&k3_cuda_attn_res_decode, oa));
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
    if (!decode_pick(H, a->num_blocks, wf32, &sh, reason, sizeof reason))
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
    if (a->prefix->dtype == K3_DTYPE_BF16)
        return wf32 ? decode_launch_w<k3c_bf16, float>(p, sh, T_, ctx->stream)
                    : decode_launch_w<k3c_bf16, k3c_bf16>(p, sh, T_, ctx->stream);
    return wf32 ? decode_launch_w<k3c_f16, float>(p, sh, T_, ctx->stream)
                : decode_launch_w<k3c_f16, k3c_f16>(p, sh, T_, ctx->stream);
}

} // namespace

bool k3c_attn_res_decode_loadable(int dev) {
    int cl = 0;
    if (cudaSetDevice(dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    cudaFuncAttributes fa;
    if (!cl || cudaFuncGetAttributes(&fa, attn_res_decode_kernel<k3c_bf16, k3c_bf16, 9, 1>) !=
                   cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

extern "C" const k3_kernel k3_cuda_attn_res_decode = {"cuda.attn_res.decode", K3_OP_ATTN_RES,
                                                      K3_DEVICE_CUDA, decode_supports, decode_run};

void k3c_attn_res_knobs_init(void) { k3ar::read_knobs(); }
