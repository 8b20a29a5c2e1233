/*
 * attn_res.cuh — device and host code shared by the four CUDA AttnRes kernels
 * (attn_res_generic.cu, attn_res_decode.cu, attn_res_stream.cu, attn_res_ring.cu): 16-byte
 * vectors of bf16/f16 to and from f32, weight loads, warp and cluster primitives, programmatic
 * dependent launch, the scale-safe RMS factor, the launch knobs read once at backend load, and
 * the host side of the fast kernels (their checks, parameters, dtype instances and launch).
 */
#ifndef K3_ATTN_RES_CUH
#define K3_ATTN_RES_CUH

#include "common.cuh"

#include <stdio.h>
#include <stdlib.h>

namespace k3ar {

/* ---- launch knobs (read once when the backend loads: k3c_attn_res_knobs_init) ----------- */

/* K3_ATTN_RES_PDL: "0" launches the decode, ring, stream and generic kernels without programmatic
 * dependent launch; anything else (or unset) launches them with it. K3_ATTN_RES_DECODE_CTAS:
 * CTAs per token (a cluster when > 1) of cuda.attn_res.decode, 1..8; unset or 0: the kernel's
 * rule. K3_ATTN_RES_DECODE_MAX_T: the most tokens cuda.attn_res.decode serves at num_blocks
 * above 4 and, from 256 on, at 1..4 where cuda.attn_res.ring takes the call (1..2^30; unset
 * or out of range: 64), so one benchmark run can time it beside the ring and stream kernels
 * at prefill sizes. cuda.attn_res.ring's measurement switches: K3_ATTN_RES_RING_L2_AHEAD, rows
 * its L2 prefetch runs ahead of its copies (0..64, -1: its slots; default 0: none);
 * K3_ATTN_RES_RING_L2_EARLY "1": the first window's block rows before the PDL wait;
 * K3_ATTN_RES_RING_CPS: its CTAs an SM, 1..4 (unset or 0: its own choice). */
struct knobs {
    int pdl;
    int decode_ctas;
    int64_t decode_max_t;
    int ring_l2_ahead, ring_l2_early, ring_cps;
};
inline knobs g_knobs = {1, 0, 64, 0, 0, 0};
inline const knobs &get_knobs() { return g_knobs; }
/* The CTAs per token in variable `name`: 1..8, else 0 (unset or out of range). */
inline int read_ctas(const char *name) {
    const char *e = getenv(name);
    int c = e && *e ? atoi(e) : 0;
    return c >= 1 && c <= 8 ? c : 0;
}
/* Reads the variables into g_knobs; a value out of range leaves the default. */
inline void read_knobs() {
    const char *e = getenv("K3_ATTN_RES_PDL");
    g_knobs.pdl = !(e && e[0] == '0' && !e[1]);
    g_knobs.decode_ctas = read_ctas("K3_ATTN_RES_DECODE_CTAS");
    const char *mt = getenv("K3_ATTN_RES_DECODE_MAX_T");
    const long long v = mt && *mt ? atoll(mt) : 0;
    g_knobs.decode_max_t = v >= 1 && v <= (1LL << 30) ? (int64_t)v : 64;
    const char *a = getenv("K3_ATTN_RES_RING_L2_AHEAD");
    const int ahead = a && *a ? atoi(a) : 0;
    g_knobs.ring_l2_ahead = ahead >= -1 && ahead <= 64 ? ahead : 0;
    const char *ea = getenv("K3_ATTN_RES_RING_L2_EARLY");
    g_knobs.ring_l2_early = ea && ea[0] == '1' && !ea[1];
    const char *c = getenv("K3_ATTN_RES_RING_CPS");
    const int cps = c && *c ? atoi(c) : 0;
    g_knobs.ring_cps = cps >= 1 && cps <= 4 ? cps : 0;
}

/* Threads per CTA (a multiple of 32) for `ctas` CTAs of v 16-byte vectors per thread to cover
 * vecs vectors, or 0 when that is more than maxt. */
inline int threads_for(int64_t vecs, int ctas, int v, int maxt) {
    int64_t per = (vecs + (int64_t)ctas * v - 1) / ((int64_t)ctas * v);
    int64_t nt = (per + 31) / 32 * 32;
    if (nt < 32) nt = 32;
    return nt > maxt ? 0 : (int)nt;
}

/* ---- 16-bit vectors ------------------------------------------------------------------------ */

/* 8 elements of a 16-bit type in a uint4, to and from f32. */
template <class T> struct vec8;
template <> struct vec8<k3c_bf16> {
    static __device__ __forceinline__ void unpack(uint4 u, float (&f)[8]) {
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    /* element 2i + hi of a vector whose word i is w (as unpack) */
    static __device__ __forceinline__ float elem(uint32_t w, int hi) {
        return __uint_as_float(hi ? w & 0xffff0000u : w << 16);
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <> struct vec8<k3c_f16> {
    static __device__ __forceinline__ void unpack(uint4 u, float (&f)[8]) {
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *reinterpret_cast<__half2 *>(&w[i]);
            float2 v = __half22float2(h);
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
    static __device__ __forceinline__ float elem(uint32_t w, int hi) {
        return __half2float(__ushort_as_half((unsigned short)(hi ? w >> 16 : w & 0xffffu)));
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <class T> __device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
    return make_uint4(vec8<T>::pack2(f[0], f[1]), vec8<T>::pack2(f[2], f[3]),
                      vec8<T>::pack2(f[4], f[5]), vec8<T>::pack2(f[6], f[7]));
}

/* Read-once data (delta, blocks): not kept in L1. */
__device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
/* Data another kernel of the stream may have written (prefix, delta): a plain coherent load. */
__device__ __forceinline__ uint4 ld_plain(const void *p) { return *(const uint4 *)p; }

/* 8 weights at element offset e, kept raw until used: W is the activation type (one uint4)
 * or float (two). */
template <class T, class W> struct wvec;
template <class T> struct wvec<T, T> {
    uint4 a;
    __device__ __forceinline__ void load(const void *p, int64_t e) {
        a = __ldg((const uint4 *)((const uint16_t *)p + e));
    }
    __device__ __forceinline__ void zero() { a = make_uint4(0, 0, 0, 0); }
    __device__ __forceinline__ void get(float (&f)[8]) const { vec8<T>::unpack(a, f); }
};
template <class T> struct wvec<T, float> {
    float4 a, b;
    __device__ __forceinline__ void load(const void *p, int64_t e) {
        const float4 *q = (const float4 *)((const float *)p + e);
        a = __ldg(q);
        b = __ldg(q + 1);
    }
    __device__ __forceinline__ void zero() { a = b = make_float4(0, 0, 0, 0); }
    __device__ __forceinline__ void get(float (&f)[8]) const {
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    }
};

/* 8 weights at element offset e as f32. */
template <class T, class W>
__device__ __forceinline__ void wload(const void *p, int64_t e, float (&f)[8]) {
    wvec<T, W> w;
    w.load(p, e);
    w.get(f);
}

/* The block reduction of one value per warp (lane 0's v) of a rare path: a barrier first (every
 * thread has read buf since its last write), then the sum or max over the warps, the same bits
 * in every thread. */
__device__ __forceinline__ float block_max_sum(float v, float *buf, bool max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    float r = 0.0f;
    for (int q = 0; q < nwarps; q++) r = max ? fmaxf(r, buf[q]) : r + buf[q];
    return r;
}

/* ---- warps, clusters, programmatic dependent launch ----------------------------------------- */


__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* ---- mbarrier exchange (PTX ISA "mbarrier", "st.async") ------------------------------------ */

/* One arrival (this thread's) and `bytes` of asynchronous stores complete the barrier's
 * current phase. */
__device__ __forceinline__ void mbar_init(uint64_t *bar) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory");
}
/* Makes the initialised barriers visible to the cluster's other CTAs (before the cluster
 * barrier that precedes their first remote use). */
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/* Opens the barrier's current phase to `bytes` of asynchronous stores (or bulk copies), with
 * this thread's one arrival. Relaxed: the arrival publishes nothing (the data that completes
 * the phase carries its own release, st.async's and cp.async.bulk's complete_tx), so it needs
 * no fence; a release here compiles to a MEMBAR.GPU ahead of it (ptxas, sm_90a), which waits
 * for every earlier store of the thread to reach L2 and held each token reduction of the decode
 * kernel, and each row issue of the ring kernel, ~0.3-1 µs (notes/PERF.md, 2026-12-04). */
__device__ __forceinline__ void mbar_arrive_expect(uint64_t *bar, uint32_t bytes) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.expect_tx.relaxed.cluster.shared::cta.b64 _, [%0], %1;" ::"r"(a),
                 "r"(bytes)
                 : "memory");
}
/* Returns once the phase of `parity` has completed; what the stores that completed it wrote
 * is then visible to this thread. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(bar), done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
/* The two phases' mbarriers of a cluster exchange (mbars: this CTA's pair), initialised by
 * thread 0 and made visible to the cluster, then this CTA's relaxed arrival at the cluster
 * barrier whose wait precedes the first remote store; before the PDL wait, off the chain.
 * Returns mbars when the token spans C > 1 CTAs, else NULL (no exchange). Every thread calls it. */
__device__ __forceinline__ uint64_t *exchange_init(uint64_t (&mbars)[2], int C) {
    if (C <= 1) return nullptr;
    if (threadIdx.x == 0) {
        mbar_init(&mbars[0]);
        mbar_init(&mbars[1]);
        mbar_init_fence();
    }
    __syncthreads();
    cluster_arrive_relaxed();
    return mbars;
}
/* The address in CTA `rank` of this cluster of the shared variable at `local` in this CTA. */
__device__ __forceinline__ uint32_t cluster_addr(const void *local, uint32_t rank) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(local), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
/* Stores v into the shared variable `local` of CTA `rank` and completes sizeof(v) bytes of that
 * CTA's barrier `bar` (the same variable's address in every CTA); f32 and f64. */
__device__ __forceinline__ void st_async(float *local, uint64_t *bar, uint32_t rank, float v) {
    const uint32_t ra = cluster_addr(local, rank), rb = cluster_addr(bar, rank);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(ra),
                 "f"(v), "r"(rb)
                 : "memory");
}
__device__ __forceinline__ void st_async(double *local, uint64_t *bar, uint32_t rank, double v) {
    const uint32_t ra = cluster_addr(local, rank), rb = cluster_addr(bar, rank);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f64 [%0], %1, [%2];" ::"r"(ra),
                 "d"(v), "r"(rb)
                 : "memory");
}

/* Stores v into the shared variable `local` of CTA `rank` of this cluster. */
__device__ __forceinline__ void st_cluster(float *local, uint32_t rank, float v) {
    const uint32_t r = cluster_addr(local, rank);
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(r), "f"(v) : "memory");
}

/* Values a lane holds after spread_step<C, O> and the steps below O (halving per step). */
__host__ __device__ constexpr int spread_count(int c, int o) { return o == 0 ? c : spread_count(c / 2 + c % 2, o / 2); }

/*
 * Warp reduction of C values per lane in about C shuffles instead of 5 C: at lane offset O,
 * partners swap halves (lane & O keeps the upper half) and add, so each value is summed over
 * both lanes and each lane keeps half; an odd last value is added whole. After the step at
 * offset 1, value j of a lane is the warp's total of item id[j] (id follows the same swaps).
 * Each item is summed over the same lane pairs in the same order as k3c_warp_sum / k3c_warp_max
 * (offsets 16, 8, 4, 2, 1; a + b == b + a), so it gives their bits. A: f32 or f64.
 */
template <int C, int O, bool MAX, class A, int N>
__device__ __forceinline__ void spread_step(A (&v)[N], int (&id)[N], int lane) {
    if constexpr (O > 0) {
        constexpr int H = C / 2;
        const bool up = (lane & O) != 0;
#pragma unroll
        for (int j = 0; j < H; j++) {
            const A send = up ? v[j] : v[j + H], keep = up ? v[j + H] : v[j];
            const A r = __shfl_xor_sync(0xffffffffu, send, O);
            v[j] = MAX ? fmax(keep, r) : keep + r;
            id[j] = up ? id[j + H] : id[j];
        }
        if constexpr (C % 2 == 1) {
            const A r = __shfl_xor_sync(0xffffffffu, v[C - 1], O);
            v[H] = MAX ? fmax(v[C - 1], r) : v[C - 1] + r;
            id[H] = id[C - 1];
        }
        spread_step<H + C % 2, O / 2, MAX>(v, id, lane);
    }
}

/* The warp's totals of the N values every lane holds (spread_step), item i stored at row[i]:
 * lanes holding the same item hold the same bits (a + b == b + a), so any of them may store it. */
template <bool MAX, class A, int N>
__device__ __forceinline__ void warp_totals(A (&v)[N], A *row, int lane) {
    int id[N];
#pragma unroll
    for (int i = 0; i < N; i++) id[i] = i;
    spread_step<N, 16, MAX>(v, id, lane);
#pragma unroll
    for (int j = 0; j < spread_count(N, 16); j++) row[id[j]] = v[j];
}

/* Programmatic dependent launch (PTX ISA "griddepcontrol"): both are no-ops in a launch
 * without the programmatic-serialization attribute. wait returns once every prerequisite
 * grid has completed and its memory is visible. The kernels here signal their dependents
 * only after their own wait, so when one of them starts, every kernel before the one just
 * ahead of it has completed (the contract of static_blocks rests on this). */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ---- the RMS factor, safe at any scale -------------------------------------------------------- */

/* 1 / sqrt(x) for a normal float x, by rsqrt.approx.ftz: the bits rsqrtf gives for it, without
 * the denormal test and rescaling rsqrtf compiles to around the same MUFU.RSQ (nvcc without
 * -ftz). For an argument the callers keep normal: a sum of squares that passed
 * ss_needs_rescale, divided by H, plus eps. */
__device__ __forceinline__ float rsqrt_normal(float x) {
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
/* e^x by ex2.approx.ftz of x log2(e): __expf's bits wherever they are normal, 0 where __expf
 * gives a denormal (x below about -87.3), which a softmax weight beside the weight 1 of its
 * largest logit may take. Saves __expf's denormal guard (a compare and two multiplies). */
__device__ __forceinline__ float exp_flush(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
    return r;
}

/* A sum of squares needs the scaled recomputation when it overflowed (or is NaN) or when it
 * is so small that squared elements may have fallen below FLT_MIN: below 2^-100 the largest
 * square can be denormal; above it every element whose square is denormal contributes less
 * than 2^-36 of the sum. The caller then checks that max |v| > 0 (an all-zero row is exact). */
constexpr float kSsMax = 3.0e38f, kSsMin = 0x1p-100f;
__device__ __forceinline__ bool ss_needs_rescale(float ss) { return !(ss <= kSsMax) || ss < kSsMin; }
/* 2^k as a float for -126 <= k <= 127, from its exponent bits (exact). */
__device__ __forceinline__ float pow2i(int k) { return __int_as_float((k + 127) << 23); }
/* The binary exponent e with max|v| = f * 2^e, 0.5 <= f < 1, as frexpf gives it, from the
 * bits (0 for 0, inf or NaN: the recomputation then leaves the values as they are). */
__device__ __forceinline__ int scale_exp(float amax) {
    if (!(amax > 0.0f) || isinf(amax)) return 0;
    uint32_t b = __float_as_uint(amax);
    int E = (int)(b >> 23);
    return E ? E - 126 : (31 - __clz((int)(b & 0x7fffffu))) - 148;
}
/* v * 2^-e in two exact steps (2^-e alone can overflow for denormal inputs); e in
 * [-148, 128] (scale_exp's range), so each step is a normal power of two. */
struct pow2_scale {
    float a, b;
    __device__ __forceinline__ explicit pow2_scale(int e) {
        int h = -e / 2;
        a = pow2i(h);
        b = pow2i(-e - h);
    }
    __device__ __forceinline__ float operator()(float v) const { return (v * a) * b; }
};
/* rsqrt(ss / H + eps) for the values scaled by 2^-e: rsqrt(ss'/H + eps * 2^-2e). */
__device__ __forceinline__ float rms_factor_scaled(float ss_scaled, float invH, float eps, int e) {
    return 1.0f / sqrtf(ss_scaled * invH + ldexpf(eps, -2 * e));
}

/* The output norm's factor for the mix m (V vectors of 8 a thread, idle ones zero), given
 * this thread's sum of squares sq of m: rsqrt(total / H + oeps), total over the CTA. One
 * barrier (buf: one float a warp, read by every thread since its last write); lane q reads
 * warp q's sum, one load and five shuffles, the same bits in every lane of every warp. Rare (the
 * total overflowed or underflowed): m is scaled in place by 2^-e and the factor returned is the
 * scaled values' (out = m' * r' * w). */
template <int V>
__device__ __forceinline__ float block_rms_factor(float (&m)[V][8], float sq, float *buf,
                                                  float invH, float oeps) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    sq = k3c_warp_sum(sq);
    if (lane == 0) buf[warp] = sq;
    __syncthreads();
    const float total = k3c_warp_sum(lane < nwarps ? buf[lane] : 0.0f);
    if (!ss_needs_rescale(total)) return rsqrtf(total * invH + oeps);
    float mm = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++)
#pragma unroll
        for (int e = 0; e < 8; e++) mm = fmaxf(mm, fabsf(m[k][e]));
    mm = block_max_sum(k3c_warp_max(mm), buf, true);
    const int eo = scale_exp(mm);
    const pow2_scale ps(eo);
    float s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            m[k][e] = ps(m[k][e]);
            s2 = fmaf(m[k][e], m[k][e], s2);
        }
    s2 = block_max_sum(k3c_warp_sum(s2), buf, false);
    return rms_factor_scaled(s2, invH, oeps, eo);
}

/* ---- host ------------------------------------------------------------------------------------ */

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The checks the decode and stream kernels share, in this order, each a decline reason
 * naming the kernel K: bf16 or f16; H % 8 == 0; the three weights of one dtype, that of the
 * activations or f32; prefix, delta and out densely packed (K3_ELAYOUT); 16-byte alignment
 * of every row and blocks strides that are multiples of 8 elements. */
static inline k3_status fast_path_checks(const char *K, const k3_op_args *oa, char *reason,
                                         size_t n) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    k3_dtype dt = a->prefix->dtype;
    if (dt != K3_DTYPE_BF16 && dt != K3_DTYPE_F16) {
        snprintf(reason, n, "%s supports bf16 and f16; got %s", K, k3_dtype_name(dt));
        return K3_EDTYPE;
    }
    int64_t H = a->prefix->size[1];
    if (H % 8 != 0 || H == 0) {
        snprintf(reason, n, "%s requires hidden_size divisible by 8; got %lld", K, (long long)H);
        return K3_ESHAPE;
    }
    const k3_tensor *ws[3] = {a->norm_weight, a->qk_weight, a->output_norm_weight};
    int nw = a->output_norm_weight ? 3 : 2;
    for (int i = 0; i < nw; i++)
        if (ws[i]->dtype != dt && ws[i]->dtype != K3_DTYPE_F32) {
            snprintf(reason, n, "%s requires weights in %s or f32; got %s", K, k3_dtype_name(dt),
                     k3_dtype_name(ws[i]->dtype));
            return K3_EDTYPE;
        }
    if (a->norm_weight->dtype != a->qk_weight->dtype ||
        (a->output_norm_weight && a->norm_weight->dtype != a->output_norm_weight->dtype)) {
        snprintf(reason, n, "%s requires the %s weights in one dtype", K, nw == 3 ? "three" : "two");
        return K3_EDTYPE;
    }
    /* The layout check names three strides as DESIGN.md's message does; with no delta its
     * place is prefix's own (nothing else is read at that stride). */
    int64_t sp = a->prefix->stride[0], so = ka->out->stride[0];
    int64_t sd = a->delta ? a->delta->stride[0] : sp;
    if (sp != H || sd != H || so != H) {
        snprintf(reason, n,
                 "%s requires densely packed rows; got strides %lld, %lld, %lld for hidden_size %lld",
                 K, (long long)sp, (long long)sd, (long long)so, (long long)H);
        return K3_ELAYOUT;
    }
    int64_t sbt = a->blocks->stride[0], sbs = a->blocks->stride[1];
    bool al = aligned16(k3_tensor_ptr(a->prefix)) && aligned16(k3_tensor_ptr(ka->out)) &&
              aligned16(k3_tensor_ptr(a->blocks)) && sbt % 8 == 0 && sbs % 8 == 0 &&
              (!a->delta || aligned16(k3_tensor_ptr(a->delta)));
    for (int i = 0; i < nw; i++) al = al && aligned16(k3_tensor_ptr(ws[i]));
    if (!al) {
        snprintf(reason, n,
                 "%s requires 16-byte aligned rows (tensor offsets and blocks strides %lld, %lld "
                 "multiples of 8 elements)",
                 K, (long long)sbt, (long long)sbs);
        return K3_EINVAL;
    }
    return K3_OK;
}

/* The arguments every fast kernel's parameter block starts with (each kernel's params derive
 * from it): the tensors' data, the blocks strides in elements (multiples of 8), H, H / 8,
 * num_blocks, both eps and 1 / H. delta and onw are NULL when absent. */
struct row_args {
    void *prefix;
    const void *delta;
    void *blocks;
    void *out;
    const void *nw, *qw, *onw;
    int64_t sbt, sbs, H;
    int vecs, nb;
    float eps, oeps, invH;
};
/* Fills r from the call. */
static inline void fill_row_args(row_args &r, const k3_op_args *oa) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    r.prefix = k3_tensor_ptr(a->prefix);
    r.delta = a->delta ? k3_tensor_ptr(a->delta) : nullptr;
    r.blocks = k3_tensor_ptr(a->blocks);
    r.out = k3_tensor_ptr(ka->out);
    r.nw = k3_tensor_ptr(a->norm_weight);
    r.qw = k3_tensor_ptr(a->qk_weight);
    r.onw = a->output_norm_weight ? k3_tensor_ptr(a->output_norm_weight) : nullptr;
    r.sbt = a->blocks->stride[0];
    r.sbs = a->blocks->stride[1];
    r.H = a->prefix->size[1];
    r.vecs = (int)(r.H / 8);
    r.nb = (int)a->num_blocks;
    r.eps = (float)a->eps;
    r.oeps = (float)a->output_eps;
    r.invH = 1.0f / (float)r.H;
}

template <class X> struct type_tag {
    using type = X;
};
/* f(type_tag<T>, type_tag<W>) for the call's activation type T (bf16 or f16: the fast kernels'
 * checks hold) and weight type W (T or f32), so one launch line serves the four instances:
 * by_types(a, [&](auto t, auto w) { return go<typename decltype(t)::type,
 * typename decltype(w)::type>(...); }). */
template <class F> k3_status by_types(const k3_attn_res_args *a, F &&f) {
    const bool wf32 = a->norm_weight->dtype == K3_DTYPE_F32;
    if (a->prefix->dtype == K3_DTYPE_BF16)
        return wf32 ? f(type_tag<k3c_bf16>{}, type_tag<float>{})
                    : f(type_tag<k3c_bf16>{}, type_tag<k3c_bf16>{});
    return wf32 ? f(type_tag<k3c_f16>{}, type_tag<float>{}) : f(type_tag<k3c_f16>{}, type_tag<k3c_f16>{});
}

/* Which calls a fast kernel takes, beyond fast_path_checks: T in tmin..tmax (0: no bound);
 * with `full`, delta and output_norm_weight present and no block write; num_blocks in
 * nb_lo..nb_hi. */
struct call_rules {
    int64_t tmin, tmax;
    bool full;
    int64_t nb_lo, nb_hi;
};
/* The checks of rules r for kernel K, in the order above, then fast_path_checks: each a
 * decline reason naming K (K3_ESHAPE for T, else K3_EINVAL). */
static inline k3_status check_rules(const char *K, const k3_op_args *oa, const call_rules &r,
                                    char *reason, size_t n) {
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    int64_t T = a->prefix->size[0];
    if (r.tmax && T > r.tmax) {
        snprintf(reason, n, "%s serves decode batches of T <= %lld tokens; got T = %lld", K,
                 (long long)r.tmax, (long long)T);
        return K3_ESHAPE;
    }
    if (r.tmin && T < r.tmin) {
        snprintf(reason, n, "%s serves T >= %lld tokens; got T = %lld", K, (long long)r.tmin,
                 (long long)T);
        return K3_ESHAPE;
    }
    if (r.full && !a->delta) {
        snprintf(reason, n, "%s requires delta", K);
        return K3_EINVAL;
    }
    if (r.full && !a->output_norm_weight) {
        snprintf(reason, n, "%s requires output_norm_weight", K);
        return K3_EINVAL;
    }
    if (a->num_blocks < r.nb_lo || a->num_blocks > r.nb_hi) {
        snprintf(reason, n, "%s requires num_blocks in %lld..%lld; got %lld", K, (long long)r.nb_lo,
                 (long long)r.nb_hi, (long long)a->num_blocks);
        return K3_EINVAL;
    }
    if (r.full && a->write_block >= 0) {
        snprintf(reason, n, "%s does not write blocks (write_block %lld)", K,
                 (long long)k3_based(a->write_block, 1));
        return K3_EINVAL;
    }
    return fast_path_checks(K, oa, reason, n);
}

/* Launches kern with the PDL attribute when pdl != 0 and a cluster of `cluster` CTAs when
 * cluster > 1 (cudaLaunchKernelEx). */
template <class P>
k3_status launch(void (*kern)(P), const P &p, dim3 grid, dim3 block, size_t smem, int cluster,
                 int pdl, cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    int na = 0;
    if (cluster > 1) {
        attr[na].id = cudaLaunchAttributeClusterDimension;
        attr[na].val.clusterDim.x = (unsigned)cluster;
        attr[na].val.clusterDim.y = 1;
        attr[na].val.clusterDim.z = 1;
        na++;
    }
    if (pdl) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.attrs = na ? attr : nullptr;
    cfg.numAttrs = (unsigned)na;
    K3_CHECK(cudaLaunchKernelEx(&cfg, kern, p));
    return K3_OK;
}

/* Raises kern's dynamic shared memory limit on device dev to `bytes` when it is more than
 * what was set before (cudaFuncSetAttribute; `set` holds the limit set per device, an array the
 * caller keeps per kern instance). Any non-zero request is raised: without the attribute a
 * launch gets 48 KB less kern's static shared memory, not 48 KB. The caller keeps bytes within
 * the device's opt-in limit less kern's static shared memory. */
template <class P>
k3_status raise_smem(void (*kern)(P), int dev, size_t bytes, size_t (&set)[64]) {
    if (bytes == 0) return K3_OK;
    if (dev >= 0 && dev < 64 && set[dev] >= bytes) return K3_OK;
    K3_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (dev >= 0 && dev < 64) set[dev] = bytes;
    return K3_OK;
}

/* cuda.attn_res.stream's CTA: kStreamV 16-byte vectors of a row per thread, at most
 * kStreamMaxThreads threads. stream_threads: its threads for hidden size H (a multiple of 32),
 * or 0 when H / 8 vectors do not fit 64..512 of them; the decode kernel's dispatch rule asks it
 * too (attn_res_decode.cu). */
/* The largest hidden size cuda.attn_res.ring serves (4 vectors a thread, 256 threads); the
 * decode kernel's dispatch rule asks it too. */
const int64_t kRingMaxHidden = 8192;
const int kStreamMaxThreads = 512;
const int kStreamV = 2;
inline int stream_threads(int64_t H) {
    int64_t vecs = H / 8;
    int64_t nt = ((vecs + kStreamV - 1) / kStreamV + 31) / 32 * 32;
    if (nt < 64 || nt > kStreamMaxThreads) return 0;
    return (int)nt;
}

/* The usable() check of a kernel that launches clusters: dev can launch clusters and kern (one
 * instance of the kernel) has a loadable image for dev. */
template <class P> bool cluster_loadable(int dev, void (*kern)(P)) {
    int cl = 0;
    cudaFuncAttributes fa;
    if (cudaSetDevice(dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess || !cl ||
        cudaFuncGetAttributes(&fa, kern) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

} // namespace k3ar

#endif
