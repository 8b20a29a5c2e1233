/*
 * attn_res.cu — the two CUDA AttnRes kernels. cuda.attn_res.generic handles every case of
 * the op (delta write-back, write_block, num_blocks 0..S, output norm or none, any row
 * strides, any hidden size and dtype). cuda.attn_res.packed is the fused decode fast path:
 * one token is split across a cluster of CTAs that read prefix, delta and the blocks once
 * with 16-byte loads held in registers and exchange their partial sums through distributed
 * shared memory, so a token costs one memory round trip plus two cluster barriers.
 */
#include "common.cuh"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

namespace {

/* ================================ generic kernel ====================================== */

const int kGenericThreads = 256;
const int kGenericChunk = 8;      /* sources reduced together */
const int64_t kGenericMaxSources = 4096;

template <class T> struct generic_params {
    T *prefix;
    const T *delta;
    T *blocks;
    T *out;
    const void *nw, *qw, *onw;
    int nw_dt, qw_dt, onw_dt;
    int64_t T_, H, sp, sd, sbt, sbs, so;
    int nb, wb;
    double eps, oeps;
};

template <class A> __device__ __forceinline__ A load_w(const void *p, int dt, int64_t i);
template <> __device__ __forceinline__ float load_w<float>(const void *p, int dt, int64_t i) {
    return k3c_load_any_f32(p, dt, i);
}
template <> __device__ __forceinline__ double load_w<double>(const void *p, int dt, int64_t i) {
    return k3c_load_any_f64(p, dt, i);
}
__device__ __forceinline__ float k3c_rsqrt(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double k3c_rsqrt(double x) { return 1.0 / sqrt(x); }
__device__ __forceinline__ float k3c_exp(float x) { return expf(x); }
__device__ __forceinline__ double k3c_exp(double x) { return exp(x); }

template <class A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sums N values over the block; every thread gets the totals. scratch holds
 * N * (blockDim.x / 32) values. Contains two barriers. */
template <class A, int N> __device__ void block_sum(A (&v)[N], A *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    /* Every warp is done with the shared values read before this sum (racecheck on the H200
     * reported the mix loop's reads against this function's scratch writes). */
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = warp_sum(v[i]);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < N; i++) scratch[warp * N + i] = v[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) {
        A s = 0;
        for (int w = 0; w < nw; w++) s += scratch[w * N + i];
        v[i] = s;
    }
    __syncthreads();
}

/* One CTA per token (grid-stride over tokens). Three passes over the token's rows: write p
 * (and the block slot), the logits, then the mix (recomputed for the output norm). Every
 * thread touches the same hidden positions in every pass, so its own writes are what it
 * reads back. */
template <class T>
__global__ void __launch_bounds__(kGenericThreads) attn_res_generic_kernel(generic_params<T> p) {
    typedef typename k3c_acc<T>::type A;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *prob = (A *)smem_raw;                           /* nsrc */
    int nsrc = p.nb + 1;
    A *scratch = prob + ((nsrc + 1) & ~1);             /* keep 8-byte alignment */
    const A invH = (A)1 / (A)p.H;
    for (int64_t t = blockIdx.x; t < p.T_; t += gridDim.x) {
        T *prow = p.prefix + t * p.sp;
        T *brow = p.blocks + t * p.sbt;
        /* p = round(prefix + delta), written back; the block slot. */
        for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
            T pv = prow[d];
            if (p.delta) {
                pv = k3c_store_acc<T>(k3c_load_acc<T>(pv) + k3c_load_acc<T>(p.delta[t * p.sd + d]));
                prow[d] = pv;
            }
            if (p.wb >= 0) brow[(int64_t)p.wb * p.sbs + d] = pv;
        }
        /* Logits, kGenericChunk sources at a time. Source nb is p (the prefix row). */
        for (int s0 = 0; s0 < nsrc; s0 += kGenericChunk) {
            A acc[2 * kGenericChunk];
#pragma unroll
            for (int j = 0; j < 2 * kGenericChunk; j++) acc[j] = 0;
            for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
                A w = load_w<A>(p.nw, p.nw_dt, d) * load_w<A>(p.qw, p.qw_dt, d);
#pragma unroll
                for (int j = 0; j < kGenericChunk; j++) {
                    int s = s0 + j;
                    if (s < nsrc) {
                        const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                        A v = k3c_load_acc<T>(row[d]);
                        acc[2 * j] += v * w;
                        acc[2 * j + 1] += v * v;
                    }
                }
            }
            block_sum<A, 2 * kGenericChunk>(acc, scratch);
            if (threadIdx.x == 0)
#pragma unroll
                for (int j = 0; j < kGenericChunk; j++)
                    if (s0 + j < nsrc)
                        prob[s0 + j] = acc[2 * j] * k3c_rsqrt(acc[2 * j + 1] * invH + (A)p.eps);
        }
        __syncthreads();
        /* Softmax over the sources (each thread reads all logits; nsrc is small). */
        A mx = -INFINITY, sum = 0;
        for (int s = 0; s < nsrc; s++) mx = fmax(mx, prob[s]);
        for (int s = 0; s < nsrc; s++) sum += k3c_exp(prob[s] - mx);
        __syncthreads();
        /* One source (num_blocks 0): the softmax is exactly one, even for a non-finite logit. */
        for (int s = threadIdx.x; s < nsrc; s += blockDim.x)
            prob[s] = nsrc == 1 ? (A)1 : k3c_exp(prob[s] - mx) / sum;
        __syncthreads();
        /* Mix; with an output norm, first its sum of squares, then the scaled write. */
        T *orow = p.out + t * p.so;
        A sq[1] = {0};
        for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
            A m = 0;
            for (int s = 0; s < nsrc; s++) {
                const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                m += prob[s] * k3c_load_acc<T>(row[d]);
            }
            if (p.onw)
                sq[0] += m * m;
            else
                orow[d] = k3c_store_acc<T>(m);
        }
        if (p.onw) {
            block_sum<A, 1>(sq, scratch);
            A r = k3c_rsqrt(sq[0] * invH + (A)p.oeps);
            for (int64_t d = threadIdx.x; d < p.H; d += blockDim.x) {
                A m = 0;
                for (int s = 0; s < nsrc; s++) {
                    const T *row = s < p.nb ? brow + (int64_t)s * p.sbs : prow;
                    m += prob[s] * k3c_load_acc<T>(row[d]);
                }
                orow[d] = k3c_store_acc<T>(m * r * load_w<A>(p.onw, p.onw_dt, d));
            }
        }
        __syncthreads(); /* prob and scratch are reused by the next token */
    }
}

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

template <class T> k3_status generic_launch(const k3_attn_res_kargs *ka, cudaStream_t stream) {
    typedef typename k3c_acc<T>::type A;
    const k3_attn_res_args *a = &ka->p;
    generic_params<T> p;
    p.prefix = (T *)k3_tensor_ptr(a->prefix);
    p.delta = a->delta ? (const T *)k3_tensor_ptr(a->delta) : nullptr;
    p.blocks = (T *)k3_tensor_ptr(a->blocks);
    p.out = (T *)k3_tensor_ptr(ka->out);
    p.nw = k3_tensor_ptr(a->norm_weight);
    p.qw = k3_tensor_ptr(a->qk_weight);
    p.onw = a->output_norm_weight ? k3_tensor_ptr(a->output_norm_weight) : nullptr;
    p.nw_dt = a->norm_weight->dtype;
    p.qw_dt = a->qk_weight->dtype;
    p.onw_dt = a->output_norm_weight ? a->output_norm_weight->dtype : 0;
    p.T_ = a->prefix->size[0];
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
    int nsrc = p.nb + 1;
    size_t smem = (size_t)(((nsrc + 1) & ~1) + 2 * kGenericChunk * (kGenericThreads / 32)) * sizeof(A);
    unsigned grid = (unsigned)(p.T_ < (1 << 20) ? p.T_ : (1 << 20));
    attn_res_generic_kernel<T><<<grid, kGenericThreads, smem, stream>>>(p);
    K3_CHECK_LAUNCH(attn_res_generic_kernel);
    return K3_OK;
}

k3_status generic_run(const k3_op_args *oa) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    char reason[256] = "";
    k3_status s = generic_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    int64_t T = ka->p.prefix->size[0], H = ka->p.prefix->size[1];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(ka->p.prefix), &ctx));
    if (T == 0) return K3_OK;
    if (H == 0) return K3_OK; /* nothing to read or write: every row is empty */
    K3C_DISPATCH_DTYPE(ka->p.prefix->dtype, TT, K3_TRY(generic_launch<TT>(ka, ctx->stream)));
    return K3_OK;
}

/* ================================ packed kernel ======================================= */

const int kPackedMaxThreads = 256;

struct packed_params {
    void *prefix;
    const void *delta;
    const void *blocks;
    void *out;
    const void *nw, *qw, *onw;
    int64_t sbt, sbs; /* blocks strides in elements (multiples of 8) */
    int64_t H;
    int vecs;    /* H / 8 */
    int nb;      /* 1..MAXS-1 */
    int cluster; /* CTAs per token */
    float eps, oeps, invH;
};

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
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

/* 8 weights at element offset e, as f32: W is the activation type or float. */
template <class T, class W> struct wload;
template <class T> struct wload<T, T> {
    static __device__ __forceinline__ void load(const void *p, int64_t e, float (&f)[8]) {
        vec8<T>::unpack(__ldg((const uint4 *)((const uint16_t *)p + e)), f);
    }
};
template <class T> struct wload<T, float> {
    static __device__ __forceinline__ void load(const void *p, int64_t e, float (&f)[8]) {
        const float4 *q = (const float4 *)((const float *)p + e);
        float4 a = __ldg(q), b = __ldg(q + 1);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    }
};

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
/* Stores v into the shared variable `local` of CTA `rank` of this cluster. */
__device__ __forceinline__ void st_cluster(float *local, uint32_t rank, float v) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(local), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(r), "f"(v) : "memory");
}

/*
 * One token per cluster of p.cluster CTAs (C = 1 runs without a cluster). Thread `tid` of
 * CTA `rank` owns the 16-byte vectors vi = k*C*NT + rank*NT + tid (k < V) of every row.
 *  1. issue every load: prefix, delta, the nb block rows, the weights;
 *  2. p = round(prefix + delta), written back; per-source partial dot and sum of squares;
 *  3. CTA sums, pushed into every CTA of the cluster (DSM), cluster barrier;
 *  4. logits and softmax (every thread, redundantly), the mix in registers, its partial
 *     sum of squares exchanged the same way, then the normed output stored.
 * Source slot MAXS-1 is p, so every register array is indexed by compile-time constants.
 */
template <class T, class W, int MAXS, int V>
__global__ void __launch_bounds__(kPackedMaxThreads)
    attn_res_packed_kernel(const packed_params p) {
    constexpr int NB = MAXS - 1;
    constexpr int NV = 2 * MAXS;
    constexpr int NVP = (NV + 3) & ~3;
    __shared__ __align__(16) float red[kPackedMaxThreads / 32][NVP];
    __shared__ __align__(16) float recv[8][NVP];
    __shared__ float red2[kPackedMaxThreads / 32];
    __shared__ float recv2[8];

    const int C = p.cluster;
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
            wload<T, W>::load(p.nw, (int64_t)vi[k] * 8, a);
            wload<T, W>::load(p.qw, (int64_t)vi[k] * 8, b);
#pragma unroll
            for (int e = 0; e < 8; e++) w[k][e] = a[e] * b[e];
            wload<T, W>::load(p.onw, (int64_t)vi[k] * 8, on[k]);
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


/*
 * The large-T path of cuda.attn_res.packed (run() picks it for T >= kStreamMinT when H/8
 * vectors fit 2 per thread in one CTA of at most 512 threads and num_blocks <= 8): a
 * persistent grid of one CTA per SM, grid-striding over tokens, one token per CTA at a time,
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

struct stream_params {
    void *prefix;
    const void *delta;
    const void *blocks;
    void *out;
    const void *nw, *qw, *onw;
    int64_t sbt, sbs, H, T;
    int vecs, nb;
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
                wload<T, W>::load(p.nw, (int64_t)vi[k] * 8, x);
                wload<T, W>::load(p.qw, (int64_t)vi[k] * 8, y);
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
            wload<T, W>::load(p.onw, (int64_t)vi[k] * 8, on);
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = m[k][e] * r * on[e];
            *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(o);
        }
    }
    cp_async_wait_all(); /* nothing outstanding at exit */
}

/* Threads for the stream path, or 0 when it does not apply. */
int stream_threads(int64_t T, int64_t H, int64_t nb) {
    int64_t minT = kStreamMinT;
    const char *env = getenv("K3_ATTN_RES_STREAM_MIN_T");
    if (env && *env) minT = atoll(env);
    if (minT <= 0 || T < minT || nb > 8 || H % 8 != 0) return 0;
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
    kern<<<(unsigned)grid, (unsigned)nt, smem, stream>>>(p);
    K3_CHECK_LAUNCH(attn_res_stream_kernel);
    return K3_OK;
}

/* Launch shape for a token count and hidden size. */
struct packed_shape {
    int cluster, threads, v;
};

/* False (with a reason) when no shape of this kernel covers H. */
bool packed_pick(int64_t T, int64_t H, packed_shape *out, char *reason, size_t n) {
    int64_t vecs = H / 8;
    int pref = T <= 64 ? 8 : 4;
    const char *env = getenv("K3_ATTN_RES_PACKED_CLUSTER");
    if (env && *env) {
        int c = atoi(env);
        if (c >= 1 && c <= 8) pref = c;
    }
    for (int v = 1; v <= 2; v++) {
        int best_c = 0, best_nt = 0;
        int64_t best_idle = INT64_MAX;
        for (int c = pref; c >= 1 && c >= pref / 2; c--) {
            int64_t per = (vecs + (int64_t)c * v - 1) / ((int64_t)c * v);
            int64_t nt = (per + 31) / 32 * 32;
            if (nt < 32) nt = 32;
            if (nt > kPackedMaxThreads) continue;
            int64_t idle = (int64_t)c * nt * v - vecs;
            if (idle < best_idle) {
                best_idle = idle;
                best_c = c;
                best_nt = (int)nt;
            }
        }
        /* Small H: fewer CTAs, each with at least one full warp of work. */
        while (best_c > 1 && (int64_t)(best_c - 1) * best_nt * v >= vecs) best_c--;
        if (best_c) {
            *out = packed_shape{best_c, best_nt, v};
            return true;
        }
    }
    snprintf(reason, n, "%s supports hidden sizes up to %d; got %lld",
             k3_cuda_attn_res_packed_name, 8 * 8 * kPackedMaxThreads * 2, (long long)H);
    return false;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

k3_status packed_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    const char *K = k3_cuda_attn_res_packed_name;
    k3_dtype dt = a->prefix->dtype;
    if (dt != K3_DTYPE_BF16 && dt != K3_DTYPE_F16) {
        snprintf(reason, n, "%s supports bf16 and f16; got %s", K, k3_dtype_name(dt));
        return K3_EDTYPE;
    }
    if (!a->delta) {
        snprintf(reason, n, "%s requires delta", K);
        return K3_EINVAL;
    }
    if (!a->output_norm_weight) {
        snprintf(reason, n, "%s requires output_norm_weight", K);
        return K3_EINVAL;
    }
    if (a->num_blocks < 1 || a->num_blocks > 16) {
        snprintf(reason, n, "%s requires num_blocks in 1..16; got %lld", K,
                 (long long)a->num_blocks);
        return K3_EINVAL;
    }
    if (a->write_block >= 0) {
        snprintf(reason, n, "%s does not write blocks (write_block %lld)", K,
                 (long long)a->write_block + 1);
        return K3_EINVAL;
    }
    int64_t H = a->prefix->size[1];
    if (H % 8 != 0 || H == 0) {
        snprintf(reason, n, "%s requires hidden_size divisible by 8; got %lld", K, (long long)H);
        return K3_ESHAPE;
    }
    packed_shape sh;
    if (!packed_pick(a->prefix->size[0], H, &sh, reason, n)) return K3_ESHAPE;
    if (sh.v == 2 && a->num_blocks > 8) {
        snprintf(reason, n, "%s supports num_blocks up to 8 at hidden_size %lld; got %lld", K,
                 (long long)H, (long long)a->num_blocks);
        return K3_ESHAPE;
    }
    const k3_tensor *ws[3] = {a->norm_weight, a->qk_weight, a->output_norm_weight};
    for (int i = 0; i < 3; i++)
        if (ws[i]->dtype != dt && ws[i]->dtype != K3_DTYPE_F32) {
            snprintf(reason, n, "%s requires weights in %s or f32; got %s", K, k3_dtype_name(dt),
                     k3_dtype_name(ws[i]->dtype));
            return K3_EDTYPE;
        }
    if (a->norm_weight->dtype != a->qk_weight->dtype ||
        a->norm_weight->dtype != a->output_norm_weight->dtype) {
        snprintf(reason, n, "%s requires the three weights in one dtype", K);
        return K3_EDTYPE;
    }
    int64_t sp = a->prefix->stride[0], sd = a->delta->stride[0], so = ka->out->stride[0];
    if (sp != H || sd != H || so != H) {
        snprintf(reason, n,
                 "%s requires densely packed rows; got strides %lld, %lld, %lld for hidden_size %lld",
                 K, (long long)sp, (long long)sd, (long long)so, (long long)H);
        return K3_ELAYOUT;
    }
    int64_t sbt = a->blocks->stride[0], sbs = a->blocks->stride[1];
    bool al = aligned16(k3_tensor_ptr(a->prefix)) && aligned16(k3_tensor_ptr(a->delta)) &&
              aligned16(k3_tensor_ptr(ka->out)) && aligned16(k3_tensor_ptr(a->blocks)) &&
              sbt % 8 == 0 && sbs % 8 == 0;
    for (int i = 0; i < 3; i++) al = al && aligned16(k3_tensor_ptr(ws[i]));
    if (!al) {
        snprintf(reason, n,
                 "%s requires 16-byte aligned rows (tensor offsets and blocks strides %lld, %lld "
                 "multiples of 8 elements)",
                 K, (long long)sbt, (long long)sbs);
        return K3_EINVAL;
    }
    return K3_OK;
}

template <class T, class W, int MAXS, int V>
k3_status packed_launch_t(const packed_params &p, const packed_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(T_ * sh.cluster), 1, 1);
    cfg.blockDim = dim3((unsigned)sh.threads, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    if (sh.cluster > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)sh.cluster;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    K3_CHECK(cudaLaunchKernelEx(&cfg, attn_res_packed_kernel<T, W, MAXS, V>, p));
    K3_CHECK_LAUNCH(attn_res_packed_kernel);
    return K3_OK;
}

template <class T, class W>
k3_status packed_launch_w(const packed_params &p, const packed_shape &sh, int64_t T_,
                          cudaStream_t stream) {
    if (p.nb <= 8) {
        if (sh.v == 1) return packed_launch_t<T, W, 9, 1>(p, sh, T_, stream);
        return packed_launch_t<T, W, 9, 2>(p, sh, T_, stream);
    }
    if (sh.v == 1) return packed_launch_t<T, W, 17, 1>(p, sh, T_, stream);
    return k3_error(K3_EINTERNAL, "attn_res: %s: no instance for num_blocks %d at hidden_size %lld",
                    k3_cuda_attn_res_packed_name, p.nb, (long long)p.H);
}

k3_status packed_run(const k3_op_args *oa) {
    char reason[256] = "";
    k3_status s = packed_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    const k3_attn_res_args *a = &ka->p;
    int64_t T_ = a->prefix->size[0], H = a->prefix->size[1];
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a->prefix), &ctx));
    if (T_ == 0) return K3_OK;
    packed_shape sh;
    if (!packed_pick(T_, H, &sh, reason, sizeof reason))
        return k3_error(K3_ESHAPE, "attn_res: %s", reason);
    if (T_ * sh.cluster > INT_MAX)
        return k3_error(K3_ESHAPE, "attn_res: %s: %lld tokens is too many for one launch",
                        k3_cuda_attn_res_packed_name, (long long)T_);
    bool wf32 = a->norm_weight->dtype == K3_DTYPE_F32;
    int snt = stream_threads(T_, H, a->num_blocks);
    if (snt > 0) {
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
        q.eps = (float)a->eps;
        q.oeps = (float)a->output_eps;
        q.invH = 1.0f / (float)H;
        int dev = k3c_dev(a->prefix);
        if (a->prefix->dtype == K3_DTYPE_BF16)
            return wf32 ? stream_launch<k3c_bf16, float>(q, snt, dev, ctx->stream)
                        : stream_launch<k3c_bf16, k3c_bf16>(q, snt, dev, ctx->stream);
        return wf32 ? stream_launch<k3c_f16, float>(q, snt, dev, ctx->stream)
                    : stream_launch<k3c_f16, k3c_f16>(q, snt, dev, ctx->stream);
    }
    packed_params p;
    p.prefix = k3_tensor_ptr(a->prefix);
    p.delta = k3_tensor_ptr(a->delta);
    p.blocks = k3_tensor_ptr(a->blocks);
    p.out = k3_tensor_ptr(ka->out);
    p.nw = k3_tensor_ptr(a->norm_weight);
    p.qw = k3_tensor_ptr(a->qk_weight);
    p.onw = k3_tensor_ptr(a->output_norm_weight);
    p.sbt = a->blocks->stride[0];
    p.sbs = a->blocks->stride[1];
    p.H = H;
    p.vecs = (int)(H / 8);
    p.nb = (int)a->num_blocks;
    p.cluster = sh.cluster;
    p.eps = (float)a->eps;
    p.oeps = (float)a->output_eps;
    p.invH = 1.0f / (float)H;
    if (a->prefix->dtype == K3_DTYPE_BF16)
        return wf32 ? packed_launch_w<k3c_bf16, float>(p, sh, T_, ctx->stream)
                    : packed_launch_w<k3c_bf16, k3c_bf16>(p, sh, T_, ctx->stream);
    return wf32 ? packed_launch_w<k3c_f16, float>(p, sh, T_, ctx->stream)
                : packed_launch_w<k3c_f16, k3c_f16>(p, sh, T_, ctx->stream);
}

} // namespace

/* True when the packed kernel has a loadable image for dev and dev can launch clusters. */
static bool k3c_attn_res_packed_loadable(int dev) {
    int cl = 0;
    if (cudaSetDevice(dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    cudaFuncAttributes fa;
    if (!cl || cudaFuncGetAttributes(&fa, attn_res_packed_kernel<k3c_bf16, k3c_bf16, 9, 1>) !=
                   cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

extern "C" const k3_kernel k3_cuda_attn_res_packed = K3_KERNEL_RECORD_USABLE(
    k3_cuda_attn_res_packed, packed_supports, packed_run, k3c_attn_res_packed_loadable);

extern "C" const k3_kernel k3_cuda_attn_res_generic =
    K3_KERNEL_RECORD(k3_cuda_attn_res_generic, generic_supports, generic_run);
