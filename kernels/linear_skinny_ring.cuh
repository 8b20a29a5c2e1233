/*
 * linear_skinny_ring.cuh — the ring mode of cuda.linear.skinny (plan config `stages` > 0):
 * y[M,N] = x[M,K] w[N,K]^T (+ residual), or the SwiGLU epilogue's h [M,N] from w [2N,K], with
 * w streamed through a ring of shared-memory stages filled by bulk copies. Included by
 * linear_skinny.cuh, whose helpers (loads of x, the MMA, bf16 rounding, the SwiGLU gate) it uses.
 *
 * What limits a decode linear is the bytes of w in flight per SM (Little's law: ~34 GB/s per
 * SM at the H200's 4.5 TB/s times ~1 µs of DRAM latency under load is ~34 KB) and, inside a
 * decode step, what can be in flight before the PDL wait: the register kernel has at most its
 * first step there (unroll x 16 bytes a thread, ~64 KB an SM), its later steps only after that
 * step's MMAs. Here one producer thread per CTA issues one cp.async.bulk per row and stage into a
 * ring of `stages` slots of ROWS rows x KS k (32 KB a stage; 6 stages ~200 KB an SM, 26 MB over
 * 132 SMs), each slot's arrival counted by an mbarrier's transaction bytes; 8 consumer warps
 * read their MMA fragments from the slot and release it (a second mbarrier) to the producer,
 * which refills it with the stage `stages` later. With static weights the producer starts
 * before griddepcontrol.wait (it reads only w), so a whole ring of w is in flight while the
 * previous kernel of the chain (an AttnRes read, a norm) still runs; the consumers wait, then
 * read x. Without the promise the producer waits first, like every other input.
 *
 * Grid: one CTA per SM (the ring's shared memory allows no second), CTA b taking rows
 * [N b / G, N (b + 1) / G) of w (columns of h with the epilogue, each with its gate and up row)
 * in tiles of ROWS rows (ROWS / 2 columns), the producer streaming tile after tile without a
 * break: every SM streams the same bytes and no wave ends early.
 *
 * Fragments and order: as the register kernel (linear_skinny.cuh, "How it works"): lane
 * 4g + t of a warp holds 16 bytes of w row g at k = 8t..8t+7 of a 32-k chunk and the same k of
 * tokens g and g + 8 of x; two mma.m16n8k16 a chunk. Warp (group, kw) of a tile's GROUPS = ROWS
 * / 8 row groups takes chunks [8 kw, 8 kw + 8) of every stage (KS = 256 KW k), accumulating in
 * fp32 over the tile's stages in order; the KW warps' sums are reduced in shared memory in warp
 * order, so results are deterministic (not the register kernel's bits: its k split differs).
 * Slot rows are KS * 2 + 64 bytes apart, so a quarter-warp's eight 16-byte reads (two rows, the
 * same 64 bytes of each) fall in distinct banks. Bytes past K in a stage and rows past the
 * CTA's last are never copied; the consumers read zeros for them instead of the slot.
 */
#ifndef K3_LINEAR_SKINNY_RING_CUH
#define K3_LINEAR_SKINNY_RING_CUH

/* Consumer threads of a ring CTA (8 warps); one more warp holds the producer thread. */
#define K3_SKINNY_RING_THREADS 256
/* Chunks of 32 k each consumer warp takes per stage (the ring's `unroll`). */
#define K3_SKINNY_RING_UNROLL 8
/* The most stages a launch may ask for (shared memory limits it further: k3_skinny_ring_smem). */
#define K3_SKINNY_MAX_STAGES 16
/* X(rows) for every compiled ring instance. */
#define K3_SKINNY_RING_ROWS(X) X(8) X(16) X(32) X(64)

static inline bool k3_skinny_ring_rows_ok(int rows) {
#define K3_SKR_MATCH(R)                                                                    \
    if (rows == (R)) return true;
    K3_SKINNY_RING_ROWS(K3_SKR_MATCH)
#undef K3_SKR_MATCH
    return false;
}
/* k per stage: 8 chunks of 32 k for each of the KW = 8 / (rows / 8) warps of a row group. */
static constexpr K3SK_HD int k3_skinny_ring_stage_k(int rows) {
    return 32 * K3_SKINNY_RING_UNROLL * (K3_SKINNY_RING_THREADS / 32 / (rows / 8));
}
/* Bytes between two rows of a slot: the stage's k in bf16, plus 64 (bank offset). */
static constexpr K3SK_HD int k3_skinny_ring_pitch(int rows) { return k3_skinny_ring_stage_k(rows) * 2 + 64; }
/* Dynamic shared memory of a ring launch: the slots, then a full and an empty mbarrier each. */
static inline size_t k3_skinny_ring_smem(int rows, int stages) {
    return (size_t)stages * (size_t)rows * (size_t)k3_skinny_ring_pitch(rows) + (size_t)stages * 16u;
}
/* Static shared memory of a ring CTA (the consumers' partial sums, 8 warps x 4 x 32 floats). */
#define K3_SKINNY_RING_STATIC_SMEM (K3_SKINNY_RING_THREADS / 32 * 4 * 32 * 4)

#if defined(__CUDACC__)

static __device__ __forceinline__ uint32_t k3skr_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void k3skr_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(k3skr_smem(bar)), "r"(count)
                 : "memory");
}
static __device__ __forceinline__ void k3skr_mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(k3skr_smem(bar)),
                 "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void k3skr_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(k3skr_smem(bar)) : "memory");
}
/* Waits until the barrier's phase of this parity has completed. */
static __device__ __forceinline__ void k3skr_mbar_wait(uint64_t *bar, unsigned parity) {
    const uint32_t a = k3skr_smem(bar);
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
/* bytes (a multiple of 16) from global src to shared dst, counted on bar; w is read once, so
 * its lines are the first L2 evicts. */
static __device__ __forceinline__ void k3skr_bulk_copy(void *dst, const void *src, unsigned bytes,
                                                       uint64_t *bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(k3skr_smem(dst)),
                 "l"(src), "r"(bytes), "r"(k3skr_smem(bar)), "l"(policy)
                 : "memory");
}

/* Local row lr (0..ROWS-1) of tile `tile` of a CTA whose rows (or, EPI, h columns) are
 * [n0, n1): its row of w and whether it exists. EPI: the first ROWS/2 local rows are gate rows
 * n0 + tile ROWS/2 + lr, the others the matching up rows N + that column. */
template <int ROWS, bool EPI>
static __device__ __forceinline__ bool k3skr_row(int64_t n0, int64_t n1, int tile, int lr, int N,
                                                 int64_t *row) {
    if (EPI) {
        const int64_t c = n0 + (int64_t)tile * (ROWS / 2) + lr % (ROWS / 2);
        *row = lr < ROWS / 2 ? c : N + c;
        return c < n1;
    }
    *row = n0 + (int64_t)tile * ROWS + lr;
    return *row < n1;
}

template <int ROWS, int MT, bool EPI>
__global__ void __launch_bounds__(K3_SKINNY_RING_THREADS + 32, 1)
    k3_skinny_ring_kernel(const uint4 *__restrict__ x, const uint4 *__restrict__ w,
                          const uint16_t *__restrict__ res, int64_t res_s0, int64_t res_s1,
                          uint16_t *__restrict__ y, int64_t y_s0, int64_t y_s1, int M, int N,
                          int K, int pdl, int static_w, int stages) {
    constexpr int CW = K3_SKINNY_RING_THREADS / 32; /* consumer warps */
    constexpr int GROUPS = ROWS / 8, KW = CW / GROUPS, U = K3_SKINNY_RING_UNROLL;
    constexpr int KS = 32 * U * KW;          /* k per stage */
    constexpr int PV = (KS * 2 + 64) / 16;   /* 16-byte vectors between slot rows */
    constexpr int COLS = EPI ? ROWS / 2 : ROWS; /* outputs (per token) of a tile */
    static_assert(CW % GROUPS == 0 && KW >= 1, "the consumer warps must cover the row groups");
    static_assert(PV * 16 == k3_skinny_ring_pitch(ROWS), "slot pitch");
    static_assert(MT == 1 || MT == 2, "one or two token tiles");

    extern __shared__ __align__(128) uint4 k3skr_ring[]; /* [stages][ROWS][PV], then barriers */
    __shared__ float partial[CW][4][32];
    uint64_t *full = (uint64_t *)(k3skr_ring + (size_t)stages * ROWS * PV);
    uint64_t *empty = full + stages;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nvec = K / 8;
    const int kst = (K + KS - 1) / KS; /* stages per tile */
    const int64_t n0 = (int64_t)N * blockIdx.x / gridDim.x;
    const int64_t n1 = (int64_t)N * (blockIdx.x + 1) / gridDim.x;
    const int tiles = (int)((n1 - n0 + COLS - 1) / COLS);
    const int total = tiles * kst;

    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            k3skr_mbar_init(&full[s], 1);
            k3skr_mbar_init(&empty[s], CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* PDL: dependents may launch now. */
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

    if (warp == CW) {
        /* The producer warp: stage q of the CTA is k range [KS (q % kst), ...) of tile q / kst;
         * lane 0 counts the stage's bytes on its barrier, then the lanes copy a row each. */
        if (pdl && !static_w) asm volatile("griddepcontrol.wait;" ::: "memory");
        uint64_t policy;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        for (int q = 0; q < total; ++q) {
            const int s = q % stages;
            if (q >= stages) k3skr_mbar_wait(&empty[s], (unsigned)((q / stages - 1) & 1));
            const int tile = q / kst, k0 = (q % kst) * KS;
            const unsigned kb = (unsigned)((K - k0 < KS ? K - k0 : KS) * 2);
            /* the tile's outputs (rows, or h columns with a gate and an up row each) */
            const int64_t left = n1 - n0 - (int64_t)tile * COLS;
            const int outs = left < COLS ? (int)left : COLS;
            if (lane == 0) k3skr_mbar_expect_tx(&full[s], (unsigned)(EPI ? 2 * outs : outs) * kb);
            __syncwarp();
            for (int lr = lane; lr < ROWS; lr += 32) {
                int64_t r;
                if (k3skr_row<ROWS, EPI>(n0, n1, tile, lr, N, &r))
                    k3skr_bulk_copy(k3skr_ring + ((size_t)s * ROWS + lr) * PV,
                                    w + r * nvec + k0 / 8, kb, &full[s], policy);
            }
        }
        return;
    }

    /* The consumers read x (and res, y) only after the previous kernel has finished. */
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    const int group = warp / KW, kw = warp % KW;
    const int g = lane >> 2, t = lane & 3;
    const int lrow = group * 8 + g;
    const bool x0_ok = g < M, x1_ok = MT == 2 && g + 8 < M;
    const uint4 *x0 = x + (x0_ok ? g : 0) * (int64_t)nvec;
    const uint4 *x1 = x + (x1_ok ? g + 8 : 0) * (int64_t)nvec;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int q = 0; q < total; ++q) {
        const int s = q % stages, tile = q / kst, ks = q % kst;
        int64_t r;
        const bool row_ok = k3skr_row<ROWS, EPI>(n0, n1, tile, lrow, N, &r);
        const uint4 *slot = k3skr_ring + ((size_t)s * ROWS + lrow) * PV;
        const int vk = ks * (KS / 8); /* the stage's first vector of a row */
        uint4 wv[U], xa[U], xb[U];
        /* x first (volatile loads: they stay after the PDL wait), which needs no stage */
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int v = vk + (kw * U + u) * 4 + t;
            const bool kin = v < nvec;
            xa[u] = k3sk_load_x_v(x0 + (kin ? v : 0), x0_ok && kin);
            xb[u] = MT == 2 ? k3sk_load_x_v(x1 + (kin ? v : 0), x1_ok && kin) : zero;
        }
        k3skr_mbar_wait(&full[s], (unsigned)((q / stages) & 1));
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = (kw * U + u) * 4 + t;
            wv[u] = row_ok && vk + c < nvec ? slot[c] : zero;
        }
        __syncwarp();
        if (lane == 0) k3skr_mbar_arrive(&empty[s]);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            k3sk_mma(acc, xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u].x, wv[u].y);
            k3sk_mma(acc, xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u].z, wv[u].w);
        }
        if (ks != kst - 1) continue;

        /* The tile's last stage: its sums, reduced over the KW warps of each row group in warp
         * order. Output (token m, row rr of a group): acc[2 (m / 8) + rr % 2] of lane
         * 4 (m % 8) + rr / 2, as in the register kernel. */
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp][i][lane] = acc[i];
        asm volatile("bar.sync 1, %0;" ::"n"(K3_SKINNY_RING_THREADS) : "memory");
        const auto row_sum = [&](int m, int lr) {
            const int grp = lr >> 3, rr = lr & 7;
            const int src = (m & 7) * 4 + (rr >> 1), reg = ((m >> 3) << 1) | (rr & 1);
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < KW; ++j) sum += partial[grp * KW + j][reg][src];
            return sum;
        };
        for (int i = threadIdx.x; i < 16 * COLS; i += K3_SKINNY_RING_THREADS) {
            const int m = i / COLS, o = i % COLS;
            if (m >= M) continue;
            if (EPI) {
                const int64_t n = n0 + (int64_t)tile * COLS + o;
                if (n >= n1) continue;
                /* gate and up rounded to bf16 (the plain product's bits), then the gate */
                const float gs = k3sk_bf16_to_f32(k3sk_f32_to_bf16(row_sum(m, o)));
                const float us = k3sk_bf16_to_f32(k3sk_f32_to_bf16(row_sum(m, COLS + o)));
                y[m * y_s0 + n * y_s1] = k3sk_silu_mul1(gs, us);
            } else {
                const int64_t n = n0 + (int64_t)tile * ROWS + o;
                if (n >= n1) continue;
                float sum = row_sum(m, o);
                if (res) sum += k3sk_bf16_to_f32(res[m * res_s0 + n * res_s1]);
                y[m * y_s0 + n * y_s1] = k3sk_f32_to_bf16(sum);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = 0.f;
        /* partial is read by every consumer before the next tile writes it */
        asm volatile("bar.sync 1, %0;" ::"n"(K3_SKINNY_RING_THREADS) : "memory");
    }
}

/* Launches the ring mode (rows in K3_SKINNY_RING_ROWS, stages 1..K3_SKINNY_MAX_STAGES) on
 * `grid` CTAs (the SM count) of K3_SKINNY_RING_THREADS + 32 threads with
 * k3_skinny_ring_smem(rows, stages) bytes of dynamic shared memory, which the caller checks
 * against the device's opt-in limit. p.prologue must be 0 and p.grid, p.l2_prefetch are
 * ignored; cudaErrorInvalidValue when the instance does not exist or the problem is out of
 * range (as k3_skinny_launch). */
static cudaError_t k3_skinny_launch_ring(int rows, int stages, int grid,
                                         const k3_skinny_problem &p, cudaStream_t stream) {
    if (p.M < 1 || p.M > K3_SKINNY_MAX_M || p.N < 0 || p.K < 0 || p.K % K3_SKINNY_VEC ||
        ((uintptr_t)p.x & 15) || ((uintptr_t)p.w & 15) || !p.y || p.prologue || stages < 1 ||
        stages > K3_SKINNY_MAX_STAGES || grid < 1 || !k3_skinny_ring_rows_ok(rows))
        return cudaErrorInvalidValue;
    if (p.N == 0) return cudaSuccess;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)grid);
    lc.blockDim = dim3(K3_SKINNY_RING_THREADS + 32);
    lc.dynamicSmemBytes = k3_skinny_ring_smem(rows, stages);
    lc.stream = stream;
    lc.attrs = p.pdl ? attr : nullptr;
    lc.numAttrs = p.pdl ? 1 : 0;
    const uint4 *x = (const uint4 *)p.x, *w = (const uint4 *)p.w;
    const uint16_t *res = (const uint16_t *)p.res;
    uint16_t *y = (uint16_t *)p.y;
    const int pdl = p.pdl ? 1 : 0, st = p.static_w ? 1 : 0;
    cudaError_t e = cudaErrorInvalidValue;
#define K3_SKR_EX(KERNEL)                                                                  \
    ((e = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize,         \
                               (int)lc.dynamicSmemBytes)) != cudaSuccess                   \
         ? e                                                                               \
         : cudaLaunchKernelEx(&lc, KERNEL, x, w, p.epilogue ? nullptr : res, p.res_s0,      \
                              p.res_s1, y, p.y_s0, p.y_s1, p.M, p.N, p.K, pdl, st, stages))
#define K3_SKR_CASE(R)                                                                     \
    if (rows == (R)) {                                                                     \
        if (p.epilogue)                                                                    \
            e = p.M <= 8 ? K3_SKR_EX((k3_skinny_ring_kernel<R, 1, true>))                  \
                         : K3_SKR_EX((k3_skinny_ring_kernel<R, 2, true>));                 \
        else                                                                               \
            e = p.M <= 8 ? K3_SKR_EX((k3_skinny_ring_kernel<R, 1, false>))                 \
                         : K3_SKR_EX((k3_skinny_ring_kernel<R, 2, false>));                \
    }
    K3_SKINNY_RING_ROWS(K3_SKR_CASE)
#undef K3_SKR_CASE
#undef K3_SKR_EX
    return e != cudaSuccess ? e : cudaGetLastError();
}

#endif /* __CUDACC__ */

#endif /* K3_LINEAR_SKINNY_RING_CUH */
