/*
 * attn_res_ring.cu — cuda.attn_res.ring, the prefill AttnRes read (T >= 64 tokens) on densely
 * packed bf16/f16 rows with delta and output norm, num_blocks 0..16, hidden sizes up to 8192.
 *
 * A persistent grid of as many CTAs as stay resident, each striding over tokens. Every row a
 * CTA reads (a token's prefix, delta and block rows, token after token) is one bulk copy
 * (cp.async.bulk) into the next slot of a ring in shared memory, completing that slot's
 * mbarrier; thread 0 keeps every free slot filled, so rows stay in flight across token
 * boundaries while the CTA works. Source 0 is prefix + delta (rounded to the dtype and written
 * back), then the block rows; the softmax over the sources is online.
 *
 * Two bodies. The grouped body (the default; notes/PERF.md, 2026-12-04) reduces a group of
 * sources (a whole token up to 9 sources) with one CTA barrier: the logits of every source of
 * the group from one exchange, then the mix from the rows read again out of shared memory;
 * one CTA of 14 warps holds an SM at H = 7168 (16 slots). The per-source body
 * (K3_ATTN_RES_RING_PER_SOURCE=1) costs one barrier a source, the mix accumulated from
 * registers, with two CTAs an SM (8 slots each).
 *
 * Sums over the warps run in warp order or as one shuffle tree over the warps' totals: the
 * same bits in every thread. The product of the key norm and query weights (nw * qw) of a
 * thread's vectors stays in its registers as f32, the output norm weight is read at the output
 * (an L1 hit after the first token). Scale: a source's sum of squares that overflowed or
 * underflowed is recomputed on its values scaled by a power of two (ring_rescaled_logit), the
 * output norm's likewise (block_rms_factor).
 *
 * nvcc 13.0, sm_90a: grouped instances 118-124 registers, 1536 B of static shared memory, no
 * spills; per-source instances 128 registers, 384 B, at most 32 B of spills.
 */
#include "attn_res.cuh"

using namespace k3ar;

namespace {

const int64_t kRingMinT = 64;

/* 16-byte vectors of a row per thread, the most threads of a CTA (H <= 8 * 4 * 256 = 8192),
 * block slots per call, ring slots per CTA, and the shared memory (bytes) counted per CTA
 * beside the ring: the SM's reserve of 1 KB and the static arrays below. */
const int kRingV = 4;
const int kRingMaxThreads = 256;
const int kRingMaxBlocks = 16;
const int kRingMaxSlots = 16;
const int kRingMinSlots = 3;
static_assert(8 * kRingV * kRingMaxThreads == kRingMaxHidden, "the largest H fills the largest CTA");
/* num_blocks the stream kernel serves faster, where it takes the call */
const int kRingStreamFrom = 5, kRingStreamTo = 8;

struct ring_params : row_args {
    int64_t T;
    int pdl;
    int slots;
    int G; /* the grouped body's sources a group (1..kRingGroup) */
    uint32_t row_bytes;
};

/* The grouped body: sources a group at most (their logits stay in registers), rows the rule
 * keeps in flight beyond a group, and the most warps of a CTA (2 vectors a thread, 512
 * threads, when one CTA holds the SM). */
const int kRingGroup = 9;
const int kRingPrefetch = 3;
const int kRingGV = 2;
const int kRingGroupMaxWarps = 16;
static_assert(8 * kRingGV * kRingGroupMaxWarps * 32 == kRingMaxHidden, "the largest H fills the largest CTA");

/* One bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
 * this CTA's shared memory, completing that many bytes of barrier bar's phase (PTX ISA
 * "cp.async.bulk"). */
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst), b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d),
        "l"(src), "r"(bytes), "r"(b)
        : "memory");
}

/* The ring's two cursors. The consumer's (every thread's): the slot of the next row to read
 * and the parity of that slot's current phase. The producer's (thread 0's): the slot, token
 * and row within the token of the next row to issue. All advance by one row at a time, so no
 * division runs per row. */
struct ring_cursor {
    int slot = 0;
    uint32_t parity = 0;
    __device__ __forceinline__ void next(int slots) {
        if (++slot == slots) slot = 0, parity ^= 1u;
    }
};
struct ring_producer {
    int slot = 0, q = 0; /* q: 0 prefix, 1 delta, 2 + s block s */
    int64_t t;
};

/* Issues the producer's next row into its slot and advances it: the CTA's tokens
 * blockIdx.x + i gridDim.x in order, each as R = 2 + num_blocks rows: prefix, delta, blocks
 * 0..nb-1. */
__device__ __forceinline__ void ring_issue(const ring_params &p, uint8_t *ring, uint64_t *full,
                                           ring_producer &w, int R) {
    const uint16_t *src = w.q == 0   ? (const uint16_t *)p.prefix + w.t * p.H
                          : w.q == 1 ? (const uint16_t *)p.delta + w.t * p.H
                                     : (const uint16_t *)p.blocks + w.t * p.sbt +
                                           (int64_t)(w.q - 2) * p.sbs;
    mbar_arrive_expect(&full[w.slot], p.row_bytes);
    bulk_g2s(ring + (size_t)w.slot * p.row_bytes, src, p.row_bytes, &full[w.slot]);
    if (++w.slot == p.slots) w.slot = 0;
    if (++w.q == R) w.q = 0, w.t += gridDim.x;
}

/* Waits for the consumer's next row, returns its address and advances the cursor. */
__device__ __forceinline__ const uint4 *ring_row(const ring_params &p, const uint8_t *ring,
                                                 uint64_t *full, ring_cursor &c) {
    mbar_wait(&full[c.slot], c.parity);
    const uint4 *row = (const uint4 *)(ring + (size_t)c.slot * p.row_bytes);
    c.next(p.slots);
    return row;
}

/* The rare path of one source's logit (its sum of squares overflowed or underflowed): the
 * dot and sum of squares again on the source's values scaled by 2^-e, e from its max
 * magnitude over the CTA; two barriers. Every thread has read the arrays since their last
 * write (a barrier of the main path lies between). */
template <class T, int V>
__device__ __forceinline__ float ring_rescaled_logit(const uint4 (&v4)[V], const float (&w)[V][8],
                                                     const ring_params &p, float *redm,
                                                     float2 *redx) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float am = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        float v[8];
        vec8<T>::unpack(v4[k], v); /* idle vectors hold zeros */
#pragma unroll
        for (int e = 0; e < 8; e++) am = fmaxf(am, fabsf(v[e]));
    }
    am = k3c_warp_max(am);
    if (lane == 0) redm[warp] = am;
    __syncthreads();
    float m = 0.0f;
    for (int q = 0; q < nwarps; q++) m = fmaxf(m, redm[q]);
    const int ex = scale_exp(m);
    const pow2_scale ps(ex);
    float dot = 0.0f, ss = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        float v[8];
        vec8<T>::unpack(v4[k], v);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float z = ps(v[e]);
            dot = fmaf(z, w[k][e], dot);
            ss = fmaf(z, z, ss);
        }
    }
    dot = k3c_warp_sum(dot);
    ss = k3c_warp_sum(ss);
    if (lane == 0) redx[warp] = make_float2(dot, ss);
    __syncthreads();
    float D = 0.0f, S = 0.0f;
    for (int q = 0; q < nwarps; q++) {
        const float2 x = redx[q];
        D += x.x;
        S += x.y;
    }
    return D * rms_factor_scaled(S, p.invH, p.eps, ex);
}

/*
 * The grouped body (the default): a token's sources are taken G at a time (G = p.G, every
 * source of the token in one group up to kRingGroup sources), and a group costs one CTA
 * barrier for all of its logits instead of one a source. Pass 1 waits for each row of the
 * group in turn and reduces its dot with nw * qw and its sum of squares per warp (the warp's
 * totals to red[warp][j]); after the barrier every warp sums red over the warps (lane q holds
 * warp q's, five shuffles: the same bits in every thread), and the group's logits update the
 * online softmax once. Pass 2 reads the group's rows again from shared memory (each thread
 * only its own vectors, so no barrier lies between the passes) and mixes them; source 0,
 * prefix + delta rounded to T, stays in registers from pass 1. A group's slots take new rows
 * only after a barrier that every thread reaches past its pass 2: the output norm's for a
 * token's last group, one more for the others (tokens of more than G sources).
 *
 * 2 vectors a thread (up to 512 threads, 14 warps at H = 7168, where one CTA holds the SM's
 * shared memory and registers), at most 128 registers a thread.
 */
template <class T, class W, bool FULL>
__global__ void __launch_bounds__(kRingGroupMaxWarps * 32, 1)
    attn_res_ring_grouped_kernel(const ring_params p) {
    constexpr int V = kRingGV;
    extern __shared__ __align__(128) uint8_t ring[];
    __shared__ uint64_t full[kRingMaxSlots];
    __shared__ float2 red[kRingGroupMaxWarps][kRingGroup];
    __shared__ float red2[kRingGroupMaxWarps];
    __shared__ float redm[kRingGroupMaxWarps];
    __shared__ float2 redx[kRingGroupMaxWarps];

    const int NT = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5,
              nwarps = NT >> 5;
    const int nb = p.nb, R = 2 + nb, S = nb + 1, G = p.G;
    const int64_t ntok =
        p.T > (int64_t)blockIdx.x ? (p.T - 1 - (int64_t)blockIdx.x) / gridDim.x + 1 : 0;
    const int64_t rows = ntok * R;
    int vi[V];
    bool ok[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        vi[k] = k * NT + tid;
        ok[k] = FULL || vi[k] < p.vecs; /* FULL: the host checked H == 8 * V * NT */
    }
    if (tid == 0) {
        for (int s = 0; s < p.slots; s++) mbar_init(&full[s]);
        mbar_init_fence();
    }
    __syncthreads();
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }
    int64_t issued = 0; /* thread 0's count of rows issued */
    ring_producer prod;
    prod.t = blockIdx.x;
    if (tid == 0)
        for (; issued < rows && issued < p.slots; issued++) ring_issue(p, ring, full, prod, R);
    float w[V][8]; /* nw * qw of this thread's vectors */
#pragma unroll
    for (int k = 0; k < V; k++) {
        float x[8], y[8];
        if (ok[k]) {
            wload<T, W>(p.nw, (int64_t)vi[k] * 8, x);
            wload<T, W>(p.qw, (int64_t)vi[k] * 8, y);
        }
#pragma unroll
        for (int e = 0; e < 8; e++) w[k][e] = ok[k] ? x[e] * y[e] : 0.0f;
    }
    int64_t r = 0; /* rows consumed */
    ring_cursor cur;
    for (int64_t i = 0; i < ntok; i++) {
        const int64_t t = blockIdx.x + i * gridDim.x;
        float acc[V][8];
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[k][e] = 0.0f;
        float mx = -INFINITY, l = 0.0f;
        uint4 p4[V]; /* source 0: prefix + delta, rounded to T */
        for (int s0 = 0; s0 < S; s0 += G) {
            const int g = S - s0 < G ? S - s0 : G;
            /* the slot of the group's first row; source j's row lies j slots on (j + 1 in
             * group 0, whose source 0 is two rows: prefix and delta) */
            const int first = cur.slot, skip = s0 == 0 ? 1 : 0;
            /* pass 1: each source's dot and sum of squares, per warp */
#pragma unroll
            for (int j = 0; j < kRingGroup; j++) {
                if (j >= g) break;
                uint4 v4[V];
                if (s0 + j == 0) {
                    const uint4 *a = ring_row(p, ring, full, cur);
                    const uint4 *b = ring_row(p, ring, full, cur);
                    T *prefix = (T *)p.prefix + t * p.H;
#pragma unroll
                    for (int k = 0; k < V; k++) {
                        p4[k] = make_uint4(0, 0, 0, 0);
                        if (!ok[k]) continue;
                        float x[8], y[8];
                        vec8<T>::unpack(a[vi[k]], x);
                        vec8<T>::unpack(b[vi[k]], y);
#pragma unroll
                        for (int e = 0; e < 8; e++) x[e] += y[e];
                        p4[k] = pack8<T>(x);
                        *(uint4 *)(prefix + (int64_t)vi[k] * 8) = p4[k];
                    }
#pragma unroll
                    for (int k = 0; k < V; k++) v4[k] = p4[k];
                    r += 2;
                } else {
                    const uint4 *a = ring_row(p, ring, full, cur);
#pragma unroll
                    for (int k = 0; k < V; k++) v4[k] = ok[k] ? a[vi[k]] : make_uint4(0, 0, 0, 0);
                    r += 1;
                }
                float part[2] = {0.0f, 0.0f};
#pragma unroll
                for (int k = 0; k < V; k++) {
                    float v[8];
                    vec8<T>::unpack(v4[k], v);
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        part[0] = fmaf(v[e], w[k][e], part[0]);
                        part[1] = fmaf(v[e], v[e], part[1]);
                    }
                }
                /* lane 0 ends with the warp's dot, lane 16 with its sum of squares */
                int id[2] = {0, 1};
                spread_step<2, 16, false>(part, id, lane);
                if (lane == 0) red[warp][j].x = part[0];
                if (lane == 16) red[warp][j].y = part[0];
            }
            __syncthreads();
            /* the group's logits: lane q sums warp q's totals; one online-softmax update */
            float z[kRingGroup];
            unsigned rare = 0; /* sources whose sum of squares needs the scaled recomputation */
#pragma unroll
            for (int j = 0; j < kRingGroup; j++) {
                if (j >= g) break;
                const float2 x = lane < nwarps ? red[lane][j] : make_float2(0.0f, 0.0f);
                const float D = k3c_warp_sum(x.x), Ssq = k3c_warp_sum(x.y);
                z[j] = D * rsqrtf(Ssq * p.invH + p.eps);
                if (ss_needs_rescale(Ssq)) rare |= 1u << j;
            }
            /* rare (the same in every thread): those logits again, two barriers each */
            for (int j = 0; rare >> j; j++) {
                if (!(rare >> j & 1u)) continue;
                uint4 v4[V];
                int sl = first + j + skip;
                if (sl >= p.slots) sl -= p.slots;
                const uint4 *a = (const uint4 *)(ring + (size_t)sl * p.row_bytes);
#pragma unroll
                for (int k = 0; k < V; k++)
                    v4[k] = s0 + j == 0 ? p4[k] : ok[k] ? a[vi[k]] : make_uint4(0, 0, 0, 0);
                const float zj = ring_rescaled_logit<T, V>(v4, w, p, redm, redx);
#pragma unroll
                for (int q = 0; q < kRingGroup; q++)
                    if (q == j) z[q] = zj;
            }
            float gm = -INFINITY;
#pragma unroll
            for (int j = 0; j < kRingGroup; j++)
                if (j < g) gm = fmaxf(gm, z[j]);
            if (gm > mx) {
                const float c = __expf(mx - gm);
                l *= c;
#pragma unroll
                for (int k = 0; k < V; k++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[k][e] *= c;
                mx = gm;
            }
            /* pass 2: the mix, the group's rows read again (this thread's vectors only) */
#pragma unroll
            for (int j = 0; j < kRingGroup; j++) {
                if (j >= g) break;
                const float ez = __expf(z[j] - mx);
                l += ez;
                int sl = first + j + skip;
                if (sl >= p.slots) sl -= p.slots;
                const uint4 *a = (const uint4 *)(ring + (size_t)sl * p.row_bytes);
#pragma unroll
                for (int k = 0; k < V; k++) {
                    float v[8];
                    vec8<T>::unpack(s0 + j == 0 ? p4[k] : ok[k] ? a[vi[k]] : make_uint4(0, 0, 0, 0), v);
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[k][e] = fmaf(ez, v[e], acc[k][e]);
                }
            }
            if (s0 + G < S) {
                /* every thread is past this group's rows: their slots take the next rows */
                __syncthreads();
                if (tid == 0)
                    for (; issued < rows && issued < r + p.slots; issued++)
                        ring_issue(p, ring, full, prod, R);
            }
        }
        /* the mix and its RMS norm */
        const float il = 1.0f / l;
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                acc[k][e] *= il;
                sq = fmaf(acc[k][e], acc[k][e], sq);
            }
        const float rf = block_rms_factor<V>(acc, sq, red2, p.invH, p.oeps);
        /* past block_rms_factor's barrier every thread is past the token's rows */
        if (tid == 0)
            for (; issued < rows && issued < r + p.slots; issued++) ring_issue(p, ring, full, prod, R);
        T *out = (T *)p.out + t * p.H;
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (!ok[k]) continue;
            float on[8], o[8];
            wload<T, W>(p.onw, (int64_t)vi[k] * 8, on);
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = acc[k][e] * rf * on[e];
            *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(o);
        }
    }
}

/* The per-source body (K3_ATTN_RES_RING_PER_SOURCE=1): one barrier a source. FULL: every
 * thread's 4 vectors are in the row (H == 32 * NT), so the idle-vector predicates are
 * compile-time facts. */
template <class T, class W, bool FULL>
__global__ void __launch_bounds__(kRingMaxThreads, 2) attn_res_ring_kernel(const ring_params p) {
    constexpr int V = kRingV;
    extern __shared__ __align__(128) uint8_t ring[];
    __shared__ uint64_t full[kRingMaxSlots];
    __shared__ float2 red[2][kRingMaxThreads / 32];
    __shared__ float red2[kRingMaxThreads / 32];
    __shared__ float redm[kRingMaxThreads / 32];
    __shared__ float2 redx[kRingMaxThreads / 32];

    const int NT = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5,
              nwarps = NT >> 5;
    const int nb = p.nb, R = 2 + nb;
    const int64_t ntok =
        p.T > (int64_t)blockIdx.x ? (p.T - 1 - (int64_t)blockIdx.x) / gridDim.x + 1 : 0;
    const int64_t rows = ntok * R;
    int vi[V];
    bool ok[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        vi[k] = k * NT + tid;
        ok[k] = FULL || vi[k] < p.vecs; /* FULL: the host checked H == 8 * V * NT */
    }
    if (tid == 0) {
        for (int s = 0; s < p.slots; s++) mbar_init(&full[s]);
        mbar_init_fence();
    }
    __syncthreads();
    if (p.pdl) {
        pdl_wait();
        pdl_launch_dependents();
    }
    int64_t issued = 0; /* thread 0's count of rows issued */
    ring_producer prod;
    prod.t = blockIdx.x;
    if (tid == 0)
        for (; issued < rows && issued < p.slots; issued++) ring_issue(p, ring, full, prod, R);
    float w[V][8]; /* nw * qw of this thread's vectors */
#pragma unroll
    for (int k = 0; k < V; k++) {
        float x[8], y[8];
        if (ok[k]) {
            wload<T, W>(p.nw, (int64_t)vi[k] * 8, x);
            wload<T, W>(p.qw, (int64_t)vi[k] * 8, y);
        }
#pragma unroll
        for (int e = 0; e < 8; e++) w[k][e] = ok[k] ? x[e] * y[e] : 0.0f;
    }
    int64_t r = 0; /* rows consumed */
    ring_cursor cur;
    int buf = 0;
    for (int64_t i = 0; i < ntok; i++) {
        const int64_t t = blockIdx.x + i * gridDim.x;
        float acc[V][8];
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[k][e] = 0.0f;
        float mx = -INFINITY, l = 0.0f;
        for (int j = 0; j <= nb; j++) {
            uint4 v4[V];
            if (j == 0) {
                /* prefix += delta, rounded to T and written back: source 0 */
                const uint4 *a = ring_row(p, ring, full, cur);
                const uint4 *b = ring_row(p, ring, full, cur);
                T *prefix = (T *)p.prefix + t * p.H;
#pragma unroll
                for (int k = 0; k < V; k++) {
                    v4[k] = make_uint4(0, 0, 0, 0);
                    if (!ok[k]) continue;
                    float x[8], y[8];
                    vec8<T>::unpack(a[vi[k]], x);
                    vec8<T>::unpack(b[vi[k]], y);
#pragma unroll
                    for (int e = 0; e < 8; e++) x[e] += y[e];
                    v4[k] = pack8<T>(x);
                    *(uint4 *)(prefix + (int64_t)vi[k] * 8) = v4[k];
                }
                r += 2;
            } else {
                const uint4 *a = ring_row(p, ring, full, cur);
#pragma unroll
                for (int k = 0; k < V; k++) v4[k] = ok[k] ? a[vi[k]] : make_uint4(0, 0, 0, 0);
                r += 1;
            }
            float part[2] = {0.0f, 0.0f};
#pragma unroll
            for (int k = 0; k < V; k++) {
                float v[8];
                vec8<T>::unpack(v4[k], v);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    part[0] = fmaf(v[e], w[k][e], part[0]);
                    part[1] = fmaf(v[e], v[e], part[1]);
                }
            }
            /* lane 0 ends with the warp's dot, lane 16 with its sum of squares */
            int id[2] = {0, 1};
            spread_step<2, 16, false>(part, id, lane);
            if (lane == 0) red[buf][warp].x = part[0];
            if (lane == 16) red[buf][warp].y = part[0];
            __syncthreads();
            float D = 0.0f, S = 0.0f;
            for (int q = 0; q < nwarps; q++) {
                const float2 x = red[buf][q];
                D += x.x;
                S += x.y;
            }
            buf ^= 1;
            const float z = !ss_needs_rescale(S) ? D * rsqrtf(S * p.invH + p.eps)
                                                 : ring_rescaled_logit<T, V>(v4, w, p, redm, redx);
            /* Every thread is past the reads of rows < r: their slots take the next rows. */
            if (tid == 0)
                for (; issued < rows && issued < r + p.slots; issued++)
                    ring_issue(p, ring, full, prod, R);
            /* online softmax: acc and l are scaled to the running max */
            if (z > mx) {
                const float c = __expf(mx - z);
                l *= c;
#pragma unroll
                for (int k = 0; k < V; k++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[k][e] *= c;
                mx = z;
            }
            const float ez = __expf(z - mx);
            l += ez;
#pragma unroll
            for (int k = 0; k < V; k++) {
                float v[8];
                vec8<T>::unpack(v4[k], v);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[k][e] = fmaf(ez, v[e], acc[k][e]);
            }
        }
        /* the mix and its RMS norm */
        const float il = 1.0f / l;
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                acc[k][e] *= il;
                sq = fmaf(acc[k][e], acc[k][e], sq);
            }
        const float rf = block_rms_factor<V>(acc, sq, red2, p.invH, p.oeps);
        T *out = (T *)p.out + t * p.H;
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (!ok[k]) continue;
            float on[8], o[8];
            wload<T, W>(p.onw, (int64_t)vi[k] * 8, on);
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = acc[k][e] * rf * on[e];
            *(uint4 *)(out + (int64_t)vi[k] * 8) = pack8<T>(o);
        }
    }
}

/* The shared memory of one SM and a CTA's opt-in limit on device dev (bytes; asked once per
 * device, the H200's figures when the query fails). */
struct smem_limits {
    int sm, optin;
};
smem_limits ring_smem(int dev) {
    static smem_limits known[64];
    if (dev >= 0 && dev < 64 && known[dev].sm) return known[dev];
    smem_limits L = {0, 0};
    if (cudaDeviceGetAttribute(&L.sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
            cudaSuccess ||
        L.sm <= 0) {
        (void)cudaGetLastError();
        L.sm = 228 * 1024;
    }
    if (cudaDeviceGetAttribute(&L.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess ||
        L.optin <= 0) {
        (void)cudaGetLastError();
        L.optin = 227 * 1024;
    }
    if (dev >= 0 && dev < 64) known[dev] = L;
    return L;
}

/* Ring slots of `row` bytes for cps CTAs an SM, each with `side` bytes of static shared
 * memory beside the ring (the SM's reserve of 1 KB counted too), at most kRingMaxSlots. */
int64_t ring_slots(const smem_limits &L, int cps, int64_t row, int side) {
    int64_t per = L.sm / cps - 1024 - side;
    if (per > L.optin - side) per = L.optin - side;
    const int64_t slots = per / row;
    return slots > kRingMaxSlots ? kRingMaxSlots : slots;
}

/* A launch shape: threads, CTAs an SM, ring slots, vectors a thread and sources a group. */
struct ring_shape {
    int nt, cps, slots, v, G;
};

/* The per-source body's shape for hidden size H: threads (H / 8 vectors, 4 a thread), CTAs
 * per SM (about 512 threads an SM, at least 2, so one CTA's barriers overlap another's work)
 * and slots (as many rows as the SM's shared memory holds for that many CTAs, at most
 * kRingMaxSlots; fewer CTAs when fewer than kRingMinSlots would fit). False when H needs more
 * than kRingMaxThreads threads. */
bool ring_pick_source(int64_t H, int dev, ring_shape *sh) {
    const int nt = threads_for(H / 8, 1, kRingV, kRingMaxThreads);
    if (!nt) return false;
    const smem_limits L = ring_smem(dev);
    for (int cps = 512 / nt < 2 ? 2 : 512 / nt;; cps--) {
        const int64_t slots = ring_slots(L, cps, H * 2, 512);
        if (slots >= kRingMinSlots || cps == 1) {
            if (slots < 2) return false;
            *sh = ring_shape{nt, cps, (int)slots, kRingV, 1};
            return true;
        }
    }
}

/* The grouped body's shape for hidden size H and num_blocks nb: threads (H / 8 vectors, 2 a
 * thread), and the most CTAs an SM (as many as its registers hold at 128 a thread, at most
 * 2048 threads) whose slots hold a whole group of the token's sources (all of them up to
 * kRingGroup) and kRingPrefetch rows more, else one. Sources a group: as many as leave
 * kRingPrefetch slots free, at most kRingGroup, balanced over the groups a token needs. False
 * when H needs more than 512 threads or one CTA holds fewer than kRingMinSlots rows. */
const int kRingGroupSide = 2048; /* the grouped body's static shared memory, rounded up */
bool ring_pick_grouped(int64_t H, int64_t nb, int dev, ring_shape *sh) {
    const int nt = threads_for(H / 8, 1, kRingGV, kRingGroupMaxWarps * 32);
    if (!nt) return false;
    const smem_limits L = ring_smem(dev);
    const int64_t S = nb + 1, row = H * 2;
    const int64_t want = (S < kRingGroup ? S : kRingGroup) + 1 + kRingPrefetch;
    int top = 65536 / (nt * 128);
    if (top * nt > 2048) top = 2048 / nt;
    for (int cps = top < 1 ? 1 : top; cps >= 1; cps--) {
        const int64_t slots = ring_slots(L, cps, row, kRingGroupSide);
        if (cps > 1 && slots < want) continue;
        if (slots < kRingMinSlots) return false;
        int64_t cap = slots - 1 - kRingPrefetch;
        if (cap > kRingGroup) cap = kRingGroup;
        if (cap < 1) cap = 1;
        const int64_t groups = (S + cap - 1) / cap;
        *sh = ring_shape{nt, cps, (int)slots, kRingGV, (int)((S + groups - 1) / groups)};
        return true;
    }
    return false;
}

/* Launches kern (one instance) with sh's grid: cps CTAs on every SM, or one a token when
 * fewer. raised: the dynamic shared memory limit set per device for this instance. */
k3_status ring_go(void (*kern)(ring_params), const ring_params &p, const ring_shape &sh, int dev,
                  size_t (&raised)[64], cudaStream_t stream) {
    const size_t smem = (size_t)sh.slots * p.row_bytes;
    if (raised[dev < 64 ? dev : 0] == 0)
        /* all of the SM's unified data cache as shared memory, so sh.cps CTAs fit */
        K3_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
    K3_TRY(raise_smem(kern, dev, smem, raised));
    int sms = k3c_sm_count(dev);
    if (sms <= 0) sms = 132;
    const int64_t most = (int64_t)sms * sh.cps;
    const int64_t grid = p.T < most ? p.T : most;
    K3_TRY(launch(kern, p, dim3((unsigned)grid), dim3((unsigned)sh.nt), smem, 1, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_ring_kernel);
    return K3_OK;
}

template <class T, class W>
k3_status ring_launch(const ring_params &p, const ring_shape &sh, int dev, cudaStream_t stream) {
    static size_t raised[4][64];
    const bool full = p.vecs == sh.v * sh.nt;
    if (get_knobs().ring_per_source)
        return ring_go(full ? attn_res_ring_kernel<T, W, true> : attn_res_ring_kernel<T, W, false>,
                       p, sh, dev, raised[full ? 0 : 1], stream);
    return ring_go(full ? attn_res_ring_grouped_kernel<T, W, true>
                        : attn_res_ring_grouped_kernel<T, W, false>,
                   p, sh, dev, raised[full ? 2 : 3], stream);
}

k3_status ring_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    const char *K = k3_cuda_attn_res_ring_name;
    K3_TRY(check_rules(K, oa, call_rules{kRingMinT, 0, true, 0, kRingMaxBlocks}, reason, n));
    const int64_t H = a->prefix->size[1], nb = a->num_blocks;
    if (H > kRingMaxHidden) {
        snprintf(reason, n, "%s supports hidden sizes up to %lld; got %lld", K,
                 (long long)kRingMaxHidden, (long long)H);
        return K3_ESHAPE;
    }
    if (get_knobs().ring_per_source && nb >= kRingStreamFrom && nb <= kRingStreamTo &&
        stream_threads(H)) {
        snprintf(reason, n,
                 "%s leaves num_blocks %d..%d to %s (faster there) at hidden sizes %d..%d; got "
                 "num_blocks %lld",
                 K, kRingStreamFrom, kRingStreamTo, k3_cuda_attn_res_stream_name,
                 8 * (kStreamV * 32 + 1), 8 * kStreamV * kStreamMaxThreads, (long long)nb);
        return K3_EINVAL;
    }
    return K3_OK;
}

k3_status ring_run(const k3_op_args *oa) {
    char reason[256] = "";
    k3_status s = ring_supports(oa, reason, sizeof reason);
    if (s != K3_OK) return k3_error(s, "attn_res: %s", reason);
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    int dev = k3c_dev(a->prefix);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx));
    ring_params q;
    fill_row_args(q, oa);
    q.T = a->prefix->size[0];
    q.pdl = get_knobs().pdl;
    q.row_bytes = (uint32_t)(q.H * 2);
    ring_shape sh;
    const bool picked = get_knobs().ring_per_source ? ring_pick_source(q.H, dev, &sh)
                                                    : ring_pick_grouped(q.H, q.nb, dev, &sh);
    if (!picked)
        return k3_error(K3_ESHAPE, "attn_res: %s finds no shared memory for %d ring slots of %lld bytes",
                        k3_cuda_attn_res_ring_name, kRingMinSlots, (long long)(q.H * 2));
    q.slots = sh.slots;
    q.G = sh.G;
    return by_types(a, [&](auto t, auto w) {
        return ring_launch<typename decltype(t)::type, typename decltype(w)::type>(q, sh, dev,
                                                                                  ctx->stream);
    });
}

} // namespace

extern "C" const k3_kernel k3_cuda_attn_res_ring =
    K3_KERNEL_RECORD(k3_cuda_attn_res_ring, ring_supports, ring_run);
