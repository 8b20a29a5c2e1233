/*
 * linear_skinny_ring.cuh — the device code of cuda.linear.skinny_ring, shared by the kernel
 * record (kernels/linear_skinny_ring.cu) and the measurement tools (tools/linear_sweep.cu,
 * tools/autotune.cu): bf16 y[M,N] = x[M,K] w[N,K]^T (+ residual), M = 1..16, fp32
 * accumulation, the weight streamed through a shared-memory ring by bulk copies.
 *
 * How it works. The work is the (row tile, 32-k unit) pairs of w, tile-major: U = tiles x
 * K / 32 units, tiles of ROWS rows. A one-wave grid of P CTAs splits them evenly: CTA p owns
 * units [U p / P, U (p + 1) / P), i.e. a run of whole tiles with at most a partial tile at each
 * end. In each CTA one producer warp (warp 0) walks that range in chunks of at most KC k
 * (never across a tile's end) and, per chunk, issues one cp.async.bulk copy per row of the
 * tile (lane r: row r, and r + 32 for 64-row tiles; 2 KC bytes each) and one per token of x
 * (M rows) into a ring stage, tracked by the stage's "full" mbarrier (expect_tx of the chunk's bytes); it
 * reuses a stage once its "empty" mbarrier says every consumer warp is done with it. The
 * consumer warps only read shared memory and issue mma.m16n8k16 (bf16 in, fp32 accumulate)
 * with w as the A operand (16 rows) and x as B (8 tokens; M > 8 adds a second n8 tile that
 * reuses the same w fragment): consumer c covers row group c % (ROWS / 16) and every
 * (consumers / (ROWS / 16))-th 32-k unit of a chunk. A lane (g = lane / 4, t = lane % 4) loads
 * 16 bytes at k 8t..8t+7 of rows g and g + 8 and of token min(g, M - 1) (tokens >= M only
 * feed outputs that are never written); the MMA's k order is then a permutation of the unit's
 * 32 k, the same for both operands, so each dot product is an exact sum of the right products.
 * Shared rows are 2 KC + 64 bytes apart, so the 16-byte loads of a quarter warp (two rows x
 * 64 bytes) hit 32 distinct banks.
 *
 * Why KC is large: the bulk-copy unit of an SM completes about one copy per ~38 cycles
 * whatever its size below ~1 KB (measured: 512-byte copies ran the whole grid at 1.7 TB/s,
 * M = 16 slower in proportion to its extra x copies), so copies of 2-4 KB are what lets one SM
 * stream its ~18 bytes per cycle.
 *
 * At the end of each tile segment the consumers reduce their partials in shared memory in
 * warp order. A tile one CTA covers is written directly (+ residual, rounded once). A tile
 * split between CTAs pf..pl: each writes its fp32 partial [M][ROWS] to one of its two slots
 * in ws (slot 0: the CTA's first segment, slot 1: its last), fences and counts on
 * counters[tile]; the CTA that sees pl - pf earlier arrivals sums the slots in CTA order
 * pf..pl (fixed, whoever arrives last: deterministic), adds the residual, rounds once, writes y
 * and resets the counter to 0 — so the counters must be zero before the first launch, and
 * stay zero between launches (re-launchable, CUDA-graph safe).
 *
 * Launch (programmatic dependent launch, k3_skinny_problem.pdl): every thread runs
 * griddepcontrol.launch_dependents at entry; the consumers run griddepcontrol.wait before
 * they touch res, ws, counters or y; the producer before it copies x, and, with static_w (no
 * kernel in flight writes w), after it has issued the copies of w for the first STAGES
 * chunks, so the weight stream starts under the previous kernel's tail.
 *
 * Requirements (k3_ring_launch returns cudaErrorInvalidValue otherwise; the kernel record
 * names them first): K % 32 == 0, x and w packed row-major and 16-byte aligned, M in 1..16,
 * U x P < 2^32 (32-bit split arithmetic), ws >= k3_ring_ws_bytes(rows, P) bytes and
 * counters >= tiles zeroed unsigned (only when P > 1 may split a tile).
 *
 * Configurations: X(threads, rows, stages, kc) in K3_RING_CONFIGS, one kc per (threads, rows,
 * stages); threads = 32 x (1 + consumer warps), consumer warps a multiple of rows / 16. The
 * grid is ctas_per_sm x SMs CTAs (fewer when U is smaller, never more than can be resident at
 * once). In a plan file's config the fields read: threads, rows, unroll = stages, vec = 8,
 * split_k = ctas_per_sm.
 */
#ifndef K3_LINEAR_SKINNY_RING_CUH
#define K3_LINEAR_SKINNY_RING_CUH

#include "linear_skinny.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

/* X(threads, rows, stages, kc) for every instantiated configuration (kc: k per stage). */
#define K3_RING_CONFIGS(X)                                                                 \
    X(160, 16, 3, 1024) X(160, 16, 2, 1024) X(160, 32, 2, 1024) X(288, 32, 2, 1024)         \
    X(160, 16, 4, 512) X(160, 32, 3, 512) X(96, 16, 2, 2048)

#define K3_RING_MAX_CPS 4 /* ctas_per_sm at most */

/* k per stage of an instantiated (threads, rows, stages); 0 when it is not instantiated. */
static inline int k3_ring_kc(int threads, int rows, int stages) {
#define K3_RG_MATCH(T, R, S, KC)                                                           \
    if (threads == (T) && rows == (R) && stages == (S)) return (KC);
    K3_RING_CONFIGS(K3_RG_MATCH)
#undef K3_RG_MATCH
    return 0;
}
static inline bool k3_ring_instantiated(int threads, int rows, int stages) {
    return k3_ring_kc(threads, rows, stages) > 0;
}

/* Bytes of the head of a CTA's dynamic shared memory before the ring: 2 x stages mbarriers,
 * the last-arrival flag and the consumers' partials [consumers][4 mt][32] fp32. */
static inline size_t k3_ring_head_bytes(int threads, int stages, int mt) {
    const size_t h = (size_t)stages * 16 + 16 + (size_t)(threads / 32 - 1) * 4 * mt * 32 * 4;
    return (h + 127) / 128 * 128;
}

/* Dynamic shared memory of one CTA at M tokens: the head and the ring (rows of w and M rows of
 * x per stage, 2 kc + 64 bytes each). 0 when the configuration is not instantiated. */
static inline size_t k3_ring_smem_bytes(int threads, int rows, int stages, int M) {
    const int kc = k3_ring_kc(threads, rows, stages);
    if (!kc) return 0;
    return k3_ring_head_bytes(threads, stages, M > 8 ? 2 : 1) +
           (size_t)stages * (size_t)(rows + M) * (size_t)(2 * kc + 64);
}

/* Bytes of fp32 partials in ws for a grid of P CTAs: two [16][rows] slots per CTA. */
static inline size_t k3_ring_ws_bytes(int rows, int P) {
    return (size_t)P * 2u * 16u * (size_t)rows * 4u;
}

#if defined(__CUDACC__)

static __device__ __forceinline__ uint32_t k3rg_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void k3rg_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(k3rg_smem_addr(bar)),
                 "r"(count)
                 : "memory");
}

/* One arrival that also expects `bytes` of bulk copies before the phase completes. */
static __device__ __forceinline__ void k3rg_mbar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                     k3rg_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void k3rg_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(k3rg_smem_addr(bar))
                 : "memory");
}

/* Waits until the phase of parity `parity` of the barrier has completed. */
static __device__ __forceinline__ void k3rg_mbar_wait(uint64_t *bar, unsigned parity) {
    const uint32_t a = k3rg_smem_addr(bar);
    uint32_t done = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* bytes (a multiple of 16) from global src to shared dst, counted on bar; policy: L2 hint. */
static __device__ __forceinline__ void k3rg_bulk_copy(void *dst, const void *src,
                                                      unsigned bytes, uint64_t *bar,
                                                      uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_"
                 "hint [%0], [%1], %2, [%3], %4;" ::"r"(k3rg_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(k3rg_smem_addr(bar)), "l"(policy)
                 : "memory");
}

/* Walks a CTA's units in chunks: at most KC / 32 units, never across a tile's end. */
template <int KC>
struct k3rg_cursor {
    unsigned u, uend, n32;
    /* The next chunk, false when the range is done. last: the chunk ends its tile segment. */
    __device__ __forceinline__ bool next(unsigned &tile, unsigned &ku, unsigned &units,
                                         bool &last) {
        if (u >= uend) return false;
        tile = u / n32;
        const unsigned base = tile * n32;
        ku = u - base;
        const unsigned seg_end = min(uend, base + n32);
        units = min((unsigned)(KC / 32), seg_end - u);
        u += units;
        last = u == seg_end;
        return true;
    }
};

/* The CTA that owns unit u when U units are split over P CTAs. */
static __device__ __forceinline__ unsigned k3rg_owner(unsigned u, unsigned U, unsigned P) {
    return ((u + 1) * P - 1) / U;
}

/* MT = token tiles of 8 (1 for M <= 8, 2 for M <= 16). */
template <int THREADS, int ROWS, int STAGES, int KC, int MT>
__global__ void __launch_bounds__(THREADS)
    k3_ring_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                   const uint16_t *__restrict__ res, int64_t res_s0, int64_t res_s1,
                   uint16_t *__restrict__ y, int64_t y_s0, int64_t y_s1, int M, int N, int K,
                   float *__restrict__ ws, unsigned *__restrict__ counters, int pdl,
                   int static_w) {
    constexpr int CONSUMERS = THREADS / 32 - 1;
    constexpr int GROUPS = ROWS / 16;
    constexpr int KW = CONSUMERS / GROUPS;
    constexpr int PITCH = 2 * KC + 64; /* bytes between rows of a stage */
    constexpr int HEAD = ((STAGES * 16 + 16 + CONSUMERS * 4 * MT * 32 * 4) + 127) / 128 * 128;
    static_assert(THREADS % 32 == 0 && ROWS % 16 == 0 && ROWS <= 64, "bad ring configuration");
    static_assert(CONSUMERS % GROUPS == 0 && KW >= 1, "consumers must cover the row groups");
    static_assert(MT == 1 || MT == 2, "one or two token tiles");
    static_assert(KC % 32 == 0 && PITCH % 128 == 64, "rows must alternate bank halves");

    /* head (k3_ring_head_bytes): barriers, flag, partials; then the ring */
    extern __shared__ __align__(128) unsigned char k3rg_smem[];
    uint64_t *full = (uint64_t *)k3rg_smem;
    uint64_t *empty = full + STAGES;
    unsigned *is_last = (unsigned *)(empty + STAGES);
    float *partial = (float *)(k3rg_smem + STAGES * 16 + 16); /* [CONSUMERS][4 MT][32] */
    unsigned char *ring = k3rg_smem + HEAD;
    const int stage_bytes = (ROWS + M) * PITCH;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned n32 = (unsigned)K / 32u;
    const unsigned tiles = ((unsigned)N + ROWS - 1) / ROWS;
    const unsigned U = tiles * n32, P = gridDim.x, p = blockIdx.x;
    const unsigned ubeg = U * p / P, uend = U * (p + 1) / P;

    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            k3rg_mbar_init(&full[s], 1);
            k3rg_mbar_init(&empty[s], CONSUMERS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == 0) {
        /* The producer. */
        uint64_t policy;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        uint64_t keep;
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
        const int64_t kbytes = (int64_t)K * 2;
        auto issue_w = [&](int s, unsigned tile, unsigned ku, unsigned units) {
            const unsigned bytes = units * 64u;
            unsigned char *st = ring + s * stage_bytes;
            const unsigned row0 = tile * ROWS;
            const unsigned rows_ok = min((unsigned)ROWS, (unsigned)N - row0);
            if (lane == 0) k3rg_mbar_expect(&full[s], (rows_ok + (unsigned)M) * bytes);
            __syncwarp();
#pragma unroll
            for (int r = lane; r < ROWS; r += 32)
                if ((unsigned)r < rows_ok)
                    k3rg_bulk_copy(st + r * PITCH,
                                   (const unsigned char *)w + (int64_t)(row0 + r) * kbytes +
                                       ku * 64u,
                                   bytes, &full[s], policy);
        };
        auto issue_x = [&](int s, unsigned ku, unsigned units) {
            unsigned char *st = ring + s * stage_bytes + ROWS * PITCH;
            if (lane < M)
                k3rg_bulk_copy(st + lane * PITCH,
                               (const unsigned char *)x + (int64_t)lane * kbytes + ku * 64u,
                               units * 64u, &full[s], keep);
        };
        k3rg_cursor<KC> c = {ubeg, uend, n32};
        unsigned tile, ku, units;
        bool last;
        int n = 0; /* chunks issued */
        if (pdl && static_w) {
            k3rg_cursor<KC> c2 = c;
            for (; n < STAGES && c2.next(tile, ku, units, last); ++n) issue_w(n, tile, ku, units);
        }
        if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
        for (int i = 0; i < n; ++i) {
            c.next(tile, ku, units, last);
            issue_x(i, ku, units);
        }
        /* Chunk i goes to stage i % STAGES; its use i / STAGES >= 1 waits for the consumers
         * to release the previous use (empty phase (i / STAGES - 1) & 1). */
        for (int i = n; c.next(tile, ku, units, last); ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) k3rg_mbar_wait(&empty[s], (unsigned)(i / STAGES - 1) & 1u);
            issue_w(s, tile, ku, units);
            issue_x(s, ku, units);
        }
        return;
    }

    /* The consumers. */
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    const int cw = warp - 1, rg = cw % GROUPS, kw = cw / GROUPS;
    const int g = lane >> 2, t = lane & 3;
    const int ctid = threadIdx.x - 32;
    float acc[MT][4];
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    k3rg_cursor<KC> c = {ubeg, uend, n32};
    unsigned tile, ku, units;
    bool last;
    int s = 0;
    unsigned phase = 0;
    bool first_seg = true;
    const int wofs = (rg * 16 + g) * PITCH + t * 16;
    /* tokens >= M read token M - 1 (copied): their outputs are never written */
    const int xofs0 = (ROWS + min(g, M - 1)) * PITCH + t * 16;
    const int xofs1 = (ROWS + min(g + 8, M - 1)) * PITCH + t * 16;
    while (c.next(tile, ku, units, last)) {
        k3rg_mbar_wait(&full[s], phase);
        const unsigned char *st = ring + s * stage_bytes;
#pragma unroll 4
        for (unsigned j = kw; j < units; j += KW) {
            const uint4 a = *(const uint4 *)(st + wofs + j * 64);
            const uint4 b = *(const uint4 *)(st + wofs + 8 * PITCH + j * 64);
            const uint4 x0 = *(const uint4 *)(st + xofs0 + j * 64);
            /* k pairs (8t, 8t+1), (8t+2, 8t+3) form the first MMA's k, the rest the second. */
            k3sk_mma(acc[0], a.x, b.x, a.y, b.y, x0.x, x0.y);
            k3sk_mma(acc[0], a.z, b.z, a.w, b.w, x0.z, x0.w);
            if (MT == 2) {
                const uint4 x1 = *(const uint4 *)(st + xofs1 + j * 64);
                k3sk_mma(acc[MT - 1], a.x, b.x, a.y, b.y, x1.x, x1.y);
                k3sk_mma(acc[MT - 1], a.z, b.z, a.w, b.w, x1.z, x1.w);
            }
        }
        __syncwarp();
        if (lane == 0) k3rg_mbar_arrive(&empty[s]);
        if (++s == STAGES) {
            s = 0;
            phase ^= 1u;
        }
        if (!last) continue;

        /* End of a tile segment: reduce the consumers' partials in warp order. */
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                partial[(cw * 4 * MT + j * 4 + r) * 32 + lane] = acc[j][r];
                acc[j][r] = 0.f;
            }
        asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
        const unsigned tu0 = tile * n32;
        const unsigned pf = k3rg_owner(tu0, U, P), pl = k3rg_owner(tu0 + n32 - 1, U, P);
        const bool whole = pf == pl;
        const int slot = first_seg ? 0 : 1;
        first_seg = false;
        for (int i = ctid; i < M * ROWS; i += CONSUMERS * 32) {
            const int m = i / ROWS, r = i % ROWS;
            const int64_t nrow = (int64_t)tile * ROWS + r;
            if (nrow >= N) continue;
            /* C fragment: c0, c1 = (row g, tokens 2t, 2t+1), c2, c3 = (row g + 8, ...). */
            const int rr = r & 15, src = (rr & 7) * 4 + ((m & 7) >> 1);
            const int reg = (m >> 3) * 4 + (rr >> 3) * 2 + (m & 1);
            float v = 0.f;
#pragma unroll
            for (int j = 0; j < KW; ++j)
                v += partial[((j * GROUPS + (r >> 4)) * 4 * MT + reg) * 32 + src];
            if (whole) {
                if (res) v += k3sk_bf16_to_f32(res[m * res_s0 + nrow * res_s1]);
                y[m * y_s0 + nrow * y_s1] = k3sk_f32_to_bf16(v);
            } else {
                ws[((int64_t)p * 2 + slot) * 16 * ROWS + i] = v;
            }
        }
        if (!whole) {
            __threadfence();
            asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
            if (ctid == 0) *is_last = atomicAdd(&counters[tile], 1u) == pl - pf;
            asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
            if (*is_last) {
                __threadfence();
                /* pf's segment on this tile is its last unless pf starts exactly here. */
                const int slot_pf = U * pf / P == tu0 ? 0 : 1;
                for (int i = ctid; i < M * ROWS; i += CONSUMERS * 32) {
                    const int m = i / ROWS, r = i % ROWS;
                    const int64_t nrow = (int64_t)tile * ROWS + r;
                    if (nrow >= N) continue;
                    float v = 0.f;
                    for (unsigned q = pf; q <= pl; ++q)
                        v += __ldcg(ws + ((int64_t)q * 2 + (q == pf ? slot_pf : 0)) * 16 * ROWS + i);
                    if (res) v += k3sk_bf16_to_f32(res[m * res_s0 + nrow * res_s1]);
                    y[m * y_s0 + nrow * y_s1] = k3sk_f32_to_bf16(v);
                }
                if (ctid == 0) counters[tile] = 0u;
            }
        }
        /* partial and is_last are reused by the next segment */
        asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
    }
}

/* The grid of one launch at M tokens: ctas_per_sm x SMs CTAs, capped by what can be resident
 * at once and by the number of units; 0 when the configuration cannot run (then *err is set:
 * cudaErrorInvalidConfiguration when one CTA does not fit an SM). */
template <int THREADS, int ROWS, int STAGES, int KC, int MT>
static unsigned k3_ring_grid(int sms, int cps, int M, unsigned U, cudaError_t *err) {
    const size_t smem = k3_ring_smem_bytes(THREADS, ROWS, STAGES, M);
    const size_t smem_max = k3_ring_smem_bytes(THREADS, ROWS, STAGES, MT == 1 ? 8 : 16);
    /* Once per device and instantiation: the shared-memory opt-in (for this token tile's
     * largest M, when it fits); once per device and M: the residency. */
    static int ready[64];
    static int fit[64][17];
    int dev = 0;
    *err = cudaGetDevice(&dev);
    if (*err != cudaSuccess) return 0;
    if (dev < 0 || dev >= 64 || M < 1 || M > 16) {
        *err = cudaErrorInvalidValue;
        return 0;
    }
    int optin = 0;
    if (!__atomic_load_n(&ready[dev], __ATOMIC_ACQUIRE)) {
        *err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (*err != cudaSuccess) return 0;
        *err = cudaFuncSetAttribute(k3_ring_kernel<THREADS, ROWS, STAGES, KC, MT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)(smem_max < (size_t)optin ? smem_max : (size_t)optin));
        if (*err != cudaSuccess) return 0;
        __atomic_store_n(&ready[dev], 1, __ATOMIC_RELEASE);
    }
    int nb = __atomic_load_n(&fit[dev][M], __ATOMIC_ACQUIRE);
    if (!nb) {
        *err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &nb, k3_ring_kernel<THREADS, ROWS, STAGES, KC, MT>, THREADS, smem);
        if (*err != cudaSuccess) return 0;
        __atomic_store_n(&fit[dev][M], nb > 0 ? nb : -1, __ATOMIC_RELEASE);
    }
    if (nb < 1) {
        *err = cudaErrorInvalidConfiguration;
        return 0;
    }
    uint64_t P = (uint64_t)sms * (uint64_t)(cps < nb ? cps : nb);
    if (P > U) P = U;
    return (unsigned)P;
}

template <int THREADS, int ROWS, int STAGES, int KC, int MT>
static cudaError_t k3_ring_launch_t(const k3_skinny_problem &p, int sms, int cps, float *ws,
                                    size_t ws_bytes, unsigned *counters, int64_t n_counters,
                                    cudaStream_t stream) {
    const unsigned tiles = (unsigned)((p.N + ROWS - 1) / ROWS);
    const uint64_t U64 = (uint64_t)tiles * (uint64_t)(p.K / 32);
    if (U64 == 0 || U64 >= (1ull << 31)) return cudaErrorInvalidValue;
    cudaError_t e = cudaSuccess;
    const unsigned P =
        k3_ring_grid<THREADS, ROWS, STAGES, KC, MT>(sms, cps, p.M, (unsigned)U64, &e);
    if (!P) return e;
    if ((uint64_t)P * U64 >= (1ull << 32)) return cudaErrorInvalidValue;
    if (P > 1 && (!ws || !counters || ws_bytes < k3_ring_ws_bytes(ROWS, (int)P) ||
                  n_counters < (int64_t)tiles))
        return cudaErrorInvalidValue;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(P);
    lc.blockDim = dim3(THREADS);
    lc.dynamicSmemBytes = k3_ring_smem_bytes(THREADS, ROWS, STAGES, p.M);
    lc.stream = stream;
    lc.attrs = p.pdl ? attr : nullptr;
    lc.numAttrs = p.pdl ? 1 : 0;
    e = cudaLaunchKernelEx(&lc, k3_ring_kernel<THREADS, ROWS, STAGES, KC, MT>,
                           (const uint16_t *)p.x, (const uint16_t *)p.w,
                           (const uint16_t *)p.res, p.res_s0, p.res_s1, (uint16_t *)p.y, p.y_s0,
                           p.y_s1, p.M, p.N, p.K, ws, counters, p.pdl ? 1 : 0,
                           p.static_w ? 1 : 0);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* Launches one instantiated configuration on `stream` over a grid of up to cps x sms CTAs.
 * ws: >= k3_ring_ws_bytes(rows, cps x sms) bytes of stream-ordered scratch; counters:
 * >= ceil(N / rows) unsigned, all ZERO, owned by this stream (the kernel leaves them zero).
 * cudaErrorInvalidValue when the configuration is not instantiated or the problem is out of
 * range (M 1..16, K % 32, x and w 16-byte aligned, cps 1..K3_RING_MAX_CPS, scratch too small),
 * cudaErrorInvalidConfiguration when one CTA's shared memory does not fit an SM at this M;
 * the caller checks these first and names them. */
static cudaError_t k3_ring_launch(int threads, int rows, int stages, int cps,
                                  const k3_skinny_problem &p, int sms, float *ws,
                                  size_t ws_bytes, unsigned *counters, int64_t n_counters,
                                  cudaStream_t stream) {
    if (p.M < 1 || p.M > K3_SKINNY_MAX_M || p.N < 0 || p.K < 32 || p.K % 32 ||
        ((uintptr_t)p.x & 15) || ((uintptr_t)p.w & 15) || !p.y || cps < 1 ||
        cps > K3_RING_MAX_CPS || sms < 1)
        return cudaErrorInvalidValue;
    if (p.N == 0) return cudaSuccess;
#define K3_RG_LAUNCH(T, R, S, KC)                                                          \
    if (threads == (T) && rows == (R) && stages == (S))                                    \
        return p.M <= 8 ? k3_ring_launch_t<T, R, S, KC, 1>(p, sms, cps, ws, ws_bytes, counters, \
                                                           n_counters, stream)             \
                        : k3_ring_launch_t<T, R, S, KC, 2>(p, sms, cps, ws, ws_bytes, counters, \
                                                           n_counters, stream);
    K3_RING_CONFIGS(K3_RG_LAUNCH)
#undef K3_RG_LAUNCH
    return cudaErrorInvalidValue;
}

#endif /* __CUDACC__ */

#endif /* K3_LINEAR_SKINNY_RING_CUH */
