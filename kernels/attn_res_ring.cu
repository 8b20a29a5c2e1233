/*
 * attn_res_ring.cu — cuda.attn_res.ring, the prefill AttnRes read (T >= 64 tokens) on densely
 * packed bf16/f16 rows with delta and output norm, num_blocks 0..16, hidden sizes up to 8192.
 *
 * A persistent grid of a few CTAs per SM, each striding over tokens. Every row a CTA reads (a
 * token's prefix, delta and block rows, token after token) is one bulk copy (cp.async.bulk)
 * into the next slot of a ring in shared memory, completing that slot's mbarrier; thread 0
 * keeps every free slot filled, so up to `slots` rows, across token boundaries, are in flight
 * while the CTA works. A token is reduced one source at a time with an online softmax: source
 * 0 is prefix + delta (rounded to the dtype and written back), then the block rows; each
 * source costs one CTA barrier (its dot with nw * qw and its sum of squares, reduced per warp,
 * then summed over the warps in warp order by every thread: the same bits everywhere), after
 * which its slot takes the next row and the mix accumulates it. The output norm is one more
 * barrier. No array is sized by the source count, so one instance serves every num_blocks, and
 * a token's work grows with its sources. Since its mbarrier arrivals were relaxed it is faster
 * than the stream kernel's register stages at every num_blocks from T = 4096 on (at 8 blocks
 * 246 against 279 us at T = 4096 on an H100) and within 2% at T = 256 (notes/PERF.md,
 * 2026-12-07), so it takes every prefill read the decode kernel leaves.
 *
 * Thread tid owns the 16-byte vectors k * NT + tid (k < 4) of every row; the product of the
 * key norm and query weights (nw * qw) of its vectors stays in its registers as f32, the output
 * norm weight is read at the output (an L1 hit after the first token). Scale: a source's sum of
 * squares that overflowed or underflowed is recomputed on its values scaled by a power of two
 * (ring_rescaled_logit), the output norm's likewise (block_max_sum).
 *
 * Measurement switches (K3_ATTN_RES_RING_L2_AHEAD, _L2_EARLY, _CPS, read at load; off by default):
 * thread 0 also asks L2 for the rows `ahead` past its copies (cp.async.bulk.prefetch.L2), so a
 * row whose slot frees late is an L2 hit; the first window's block rows may be asked for before
 * the PDL wait; and the CTAs an SM may be fixed. None changes a result bit.
 *
 * Registers: at most 128 a thread (__launch_bounds__(256, 2)), so two CTAs of up to 8 warps
 * share an SM's register file and each partition holds its warps (4 x 32 x 128 = 16384).
 * nvcc 13.0, sm_90a: every instance 128 registers, 384 B of static shared memory, no spills but
 * two instances' 16 B (thread 0's prefetch cursor).
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
const int kRingSideSmem = 1024 + 512;
static_assert(8 * kRingV * kRingMaxThreads == kRingMaxHidden, "the largest H fills the largest CTA");

struct ring_params : row_args {
    int64_t T;
    int pdl;
    int slots;
    int ahead; /* rows the producer's L2 prefetch runs ahead of its copies (0: none) */
    int early; /* the first window's block rows prefetched into L2 before the PDL wait */
    uint32_t row_bytes;
};

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

/* Asks L2 for `bytes` (a multiple of 16) from src (16-byte aligned) and does not wait (PTX ISA
 * "cp.async.bulk.prefetch.L2"): a hint, correct whoever writes the lines later, since L2 is the
 * point of coherence and a later load sees the write. */
__device__ __forceinline__ void bulk_prefetch_l2(const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
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
__device__ __forceinline__ const uint16_t *ring_src(const ring_params &p, const ring_producer &w) {
    return w.q == 0   ? (const uint16_t *)p.prefix + w.t * p.H
           : w.q == 1 ? (const uint16_t *)p.delta + w.t * p.H
                      : (const uint16_t *)p.blocks + w.t * p.sbt + (int64_t)(w.q - 2) * p.sbs;
}
__device__ __forceinline__ void ring_advance(const ring_params &p, ring_producer &w, int R) {
    if (++w.slot == p.slots) w.slot = 0;
    if (++w.q == R) w.q = 0, w.t += gridDim.x;
}
__device__ __forceinline__ void ring_issue(const ring_params &p, uint8_t *ring, uint64_t *full,
                                           ring_producer &w, int R) {
    mbar_arrive_expect(&full[w.slot], p.row_bytes);
    bulk_g2s(ring + (size_t)w.slot * p.row_bytes, ring_src(p, w), p.row_bytes, &full[w.slot]);
    ring_advance(p, w, R);
}
/* Thread 0's L2 prefetch cursor: rows up to `ahead` past the copies issued, each prefetched
 * once (*done counts them). */
__device__ __forceinline__ void ring_prefetch(const ring_params &p, ring_producer &w,
                                              int64_t &done, int64_t issued, int64_t rows, int R) {
    for (; done < rows && done < issued + p.ahead; done++) {
        bulk_prefetch_l2(ring_src(p, w), p.row_bytes);
        ring_advance(p, w, R);
    }
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

/* The kernel (the file's header says how it works). FULL: every thread's 4 vectors are in the
 * row (H == 32 * NT), so the idle-vector predicates are compile-time facts. */
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
        if (p.early && tid == 0) {
            /* block rows are read, never written, by this call: ask for the first window's
             * while the kernel before drains */
            ring_producer e;
            e.t = blockIdx.x;
            for (int64_t j = 0; j < rows && j < p.slots + p.ahead; j++) {
                if (e.q >= 2) bulk_prefetch_l2(ring_src(p, e), p.row_bytes);
                ring_advance(p, e, R);
            }
        }
        pdl_wait();
        pdl_launch_dependents();
    }
    int64_t issued = 0; /* thread 0's count of rows issued */
    ring_producer prod;
    prod.t = blockIdx.x;
    if (tid == 0)
        for (; issued < rows && issued < p.slots; issued++) ring_issue(p, ring, full, prod, R);
    ring_producer pf = prod; /* thread 0's: the row after the last prefetched */
    int64_t pfd = issued;
    if (tid == 0 && p.ahead > 0) ring_prefetch(p, pf, pfd, issued, rows, R);
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
            const float z = !ss_needs_rescale(S) ? D * rsqrt_normal(S * p.invH + p.eps)
                                                 : ring_rescaled_logit<T, V>(v4, w, p, redm, redx);
            /* Every thread is past the reads of rows < r: their slots take the next rows. */
            if (tid == 0) {
                for (; issued < rows && issued < r + p.slots; issued++)
                    ring_issue(p, ring, full, prod, R);
                if (p.ahead > 0) ring_prefetch(p, pf, pfd, issued, rows, R);
            }
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

/* The ring's launch shape for hidden size H on device dev: threads (H / 8 vectors, 4 a
 * thread), CTAs per SM (about 512 threads an SM, at least 2, so one CTA's barriers overlap
 * another's work) and slots (as many rows as the SM's shared memory holds for that many CTAs,
 * at most kRingMaxSlots; fewer CTAs when fewer than kRingMinSlots would fit). False when H
 * needs more than kRingMaxThreads threads. */
struct ring_shape {
    int nt, cps, slots;
};

bool ring_pick(int64_t H, int dev, ring_shape *sh) {
    const int nt = threads_for(H / 8, 1, kRingV, kRingMaxThreads);
    if (!nt) return false;
    const int smem = k3c_smem_per_sm(dev) > 0 ? k3c_smem_per_sm(dev) : 228 * 1024;
    const int optin = k3c_smem_optin(dev) > 0 ? k3c_smem_optin(dev) : 227 * 1024;
    const int64_t row = H * 2;
    int cps = 512 / nt < 2 ? 2 : 512 / nt;
    if (get_knobs().ring_cps) cps = get_knobs().ring_cps;
    for (;; cps--) {
        int64_t per = smem / cps - kRingSideSmem;
        if (per > optin - 512) per = optin - 512;
        int64_t slots = per / row;
        if (slots > kRingMaxSlots) slots = kRingMaxSlots;
        if (slots >= kRingMinSlots || cps == 1) {
            if (slots < 2) return false;
            *sh = ring_shape{nt, cps, (int)slots};
            return true;
        }
    }
}

template <class T, class W>
k3_status ring_launch(const ring_params &p, const ring_shape &sh, int dev, cudaStream_t stream) {
    static size_t raised[2][64];
    const bool full = p.vecs == kRingV * sh.nt;
    auto kern = full ? attn_res_ring_kernel<T, W, true> : attn_res_ring_kernel<T, W, false>;
    const size_t smem = (size_t)sh.slots * p.row_bytes;
    if (raised[full ? 0 : 1][dev < 64 ? dev : 0] == 0)
        /* all of the SM's unified data cache as shared memory, so sh.cps CTAs fit */
        K3_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
    K3_TRY(raise_smem(kern, dev, smem, raised[full ? 0 : 1]));
    int sms = k3c_sm_count(dev);
    if (sms <= 0) sms = 132;
    const int64_t most = (int64_t)sms * sh.cps;
    const int64_t grid = p.T < most ? p.T : most;
    K3_TRY(launch(kern, p, dim3((unsigned)grid), dim3((unsigned)sh.nt), smem, 1, p.pdl, stream));
    K3_CHECK_LAUNCH(attn_res_ring_kernel);
    return K3_OK;
}


k3_status ring_supports(const k3_op_args *oa, char *reason, size_t n) {
    const k3_attn_res_args *a = &oa->u.attn_res.p;
    const char *K = k3_cuda_attn_res_ring_name;
    K3_TRY(check_rules(K, oa, call_rules{kRingMinT, 0, true, 0, kRingMaxBlocks}, reason, n));
    const int64_t H = a->prefix->size[1];
    if (H > kRingMaxHidden) {
        snprintf(reason, n, "%s supports hidden sizes up to %lld; got %lld", K,
                 (long long)kRingMaxHidden, (long long)H);
        return K3_ESHAPE;
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
    if (!ring_pick(q.H, dev, &sh))
        return k3_error(K3_ESHAPE, "attn_res: %s finds no shared memory for %d ring slots of %lld bytes",
                        k3_cuda_attn_res_ring_name, kRingMinSlots, (long long)(q.H * 2));
    q.slots = sh.slots;
    q.ahead = get_knobs().ring_l2_ahead < 0 ? sh.slots : get_knobs().ring_l2_ahead;
    q.early = get_knobs().ring_l2_early;
    return by_types(a, [&](auto t, auto w) {
        return ring_launch<typename decltype(t)::type, typename decltype(w)::type>(q, sh, dev,
                                                                                  ctx->stream);
    });
}

} // namespace

extern "C" const k3_kernel k3_cuda_attn_res_ring =
    K3_KERNEL_RECORD(k3_cuda_attn_res_ring, ring_supports, ring_run);
