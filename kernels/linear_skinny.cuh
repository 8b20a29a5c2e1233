/*
 * linear_skinny.cuh — the device code of cuda.linear.skinny, shared by the kernel record
 * (kernels/linear_skinny.cu) and the autotuner (tools/autotune.cu): one templated kernel
 * family for bf16 y[M,N] = x[M,K] w[N,K]^T (+ residual), M = 1..16, fp32 accumulation.
 *
 * How it works. A warp owns 8 rows of w and a share of K. Per step ("chunk" of 32 k) each
 * lane loads 16 bytes of its w row (lane = 4*g + t: row g, k = 8t..8t+7) and the same
 * 16 bytes of tokens g and g+8 of x, and issues two mma.m16n8k16 (bf16 in, fp32
 * accumulate) with tokens as the MMA's M (16) and the 8 rows as its N. The MMA's k order
 * is a permutation of the chunk's 32 k, the same for x and w, so the dot products are
 * exact sums of the right products. Warps of a block that share a row group split K
 * (split_k of them, each on `unroll` consecutive chunks per step: unroll 16-byte loads of
 * w in flight per lane); their partial sums are reduced through shared memory in a fixed
 * order, so results are deterministic. Rows >= N, k >= K and tokens >= M are predicated
 * off inside the load instruction: nothing past the end of x or w is ever read.
 *
 * Prologues (k3_skinny_problem.prologue). SwiGLU (1): x is [M, 2K], gate | up; RMSNorm (2): x
 * is [M, K] with any 16-byte-aligned row stride. After the PDL wait the CTA's threads together
 * compute h for the M tokens over the CTA's own k range (all of K, or its split's slice) into
 * dynamic shared memory: silu(gate) * up in fp32 rounded to bf16 as cuda.silu_mul.generic
 * rounds (kernels/silu.cuh), or x * r * norm_weight with the row scale r of each token summed
 * over the whole row in cuda.rms_norm.generic's own order (256 strided partial sums, the warp
 * butterfly, the 8 warps in order, its rescaled second pass for rows whose sum overflows or
 * underflows: kernels/norm.cu), so h has the separate kernel's bits. The warps then read their
 * x fragments from there instead of from global memory. Every warp of the CTA needs the same h, so it is
 * computed once per CTA rather than once per warp row group (the SiLU's exp and division cost
 * ~20 instructions an element: per warp, in registers, they would outweigh the weight stream).
 * The product sees exactly the h a separate silu_mul writes. w's loads and the PDL/static_w
 * order are unchanged (the first step of w is in flight while h is computed). Rows of h are
 * padded to 4 (mod 8) 16-byte vectors so a quarter-warp's eight 16-byte reads (two tokens,
 * four k vectors) hit distinct banks.
 *
 * Epilogue (k3_skinny_problem.epilogue, classic tiles only, no in-kernel prologue): SwiGLU
 * (1): w is [2N, K], gate rows then up rows, and y is h [M, N]. CTA b's first ROWS/2 local rows
 * stream gate rows b*ROWS/2 + r and its last ROWS/2 the matching up rows N + b*ROWS/2 + r (only
 * each lane's row pointer changes: the same weight stream, ceil(N / (ROWS/2)) CTAs); after the
 * shared-memory reduction, in the plain kernel's order, each output pairs its gate and up sums,
 * rounds both to bf16 (the bits the plain kernel writes for y) and stores silu(g) * u rounded
 * as cuda.silu_mul.generic rounds it.
 *
 * Launch: with programmatic dependent launch (k3_skinny_problem.pdl) the kernel runs
 * griddepcontrol.launch_dependents at entry (the next PDL kernel's CTAs may become resident
 * while this one drains) and griddepcontrol.wait before it reads x or res or touches ws,
 * counters or y. With static_w (the caller promises no kernel in flight writes w) each
 * warp's first step of w is loaded before that wait, so the weight stream starts under the
 * previous kernel's tail. Without the launch attribute both instructions are no-ops.
 *
 * L2 prefetch (k3_skinny_problem.l2_prefetch, a plan entry's l2_prefetch_mb): before the wait,
 * one thread per row of the CTA issues cp.async.bulk.prefetch.L2 for the head of its row's
 * share of K, after the bytes of the warps' first steps where static weights already load those
 * before the wait (from the share's start otherwise), the launch's budget spread evenly over
 * the rows. Measured in the Kimi-K3 step (notes/PERF.md,
 * "L2 prefetch in the step"): after another projection, whose last wave leaves DRAM idle
 * while this kernel's CTAs already wait, it gains (the down projection after gate_up, ~0.7 µs
 * a call); behind a latency-bound kernel (AttnRes, RMSNorm) it loses, its fills queuing ahead
 * of that kernel's own loads. So it is a per-shape plan setting, off by default.
 *
 * Configurations: threads per block, rows per block (multiple of 8), unroll, vec = 8
 * (16-byte loads) and split_k = the number of K-slices per row group IN TOTAL:
 *   split_k = kw * kcta,  kw = threads / 32 / (rows / 8)  (warps of one CTA on a row group)
 * where kcta is the number of CTAs along K.
 *   kcta = 1 (split_k == kw, or 0 = default): the classic kernel, grid = ceil(N / rows)
 *     CTAs, the kw warps' partials reduced in shared memory; no workspace, no atomics.
 *     Only the triples of K3_SKINNY_CONFIGS are compiled.
 *   kcta >= 2 (split_k == kw * kcta): split-K ACROSS CTAs. grid = (ceil(N / rows), kcta);
 *     CTA (tile, s) streams chunks [nchunk * s / kcta, nchunk * (s + 1) / kcta) of its rows
 *     (equal slices, within one 32-k chunk), reduces its warps in shared memory as above and
 *     writes its fp32 partial [M][rows] to ws[(tile * kcta + s) * M * rows]. Then each
 *     thread __threadfence()s, thread 0 increments counters[tile]; the CTA that sees
 *     kcta - 1 (the last to arrive) sums the kcta partials in split order 0..kcta-1 (fixed,
 *     whoever arrives last: deterministic), adds the residual, rounds once, writes y and
 *     resets counters[tile] to 0 — so the counters must be zero before the first launch
 *     and stay zero between launches (re-launchable, CUDA-graph safe). Only the triples of
 *     K3_SKINNY_SPLIT_CONFIGS are compiled for this mode, kcta 2..K3_SKINNY_MAX_KCTA.
 * rows_per_warp (8, 16 or 32): with 16 (32) each warp owns two (four) 8-row groups, 8 rows
 * apart, and feeds every x fragment to the MMAs of all of them (half (a quarter of) the x
 * loads per byte of w, twice (four times) the w loads in flight per lane at the same unroll);
 * then kw = threads / 32 / (rows / rows_per_warp). Classic kernel only, no in-kernel
 * prologue; only the triples of K3_SKINNY_RPW16_CONFIGS (K3_SKINNY_RPW32_CONFIGS) are
 * compiled. spec/skinny_spec.lua uses some of them by value.
 *
 * Balanced grid (k3_skinny_problem.grid = G > 0; classic tiles without prologue or epilogue):
 * instead of ceil(N / rows) tiles of `rows` rows, G = sms * ceil(N / (sms * rows)) CTAs
 * (k3_skinny_balanced_grid) and CTA b takes rows [N * b / G, N * (b + 1) / G), at most `rows`,
 * its last row group partly predicated off. Every SM then streams the same bytes: with tiles,
 * 1536 rows of 16 fill 96 of 132 SMs, and 7168 rows of 32 put two CTAs on 92 SMs and one on 40,
 * and a decode linear whose weight is in flight at once ends when its busiest SM does.
 */
#ifndef K3_LINEAR_SKINNY_CUH
#define K3_LINEAR_SKINNY_CUH

#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#include "silu.cuh"
#include "warp.cuh"

/* X(threads, rows, unroll) for every instantiated configuration (vec is always 8). */
#define K3_SKINNY_CONFIGS(X)                                                              \
    X(128, 8, 2) X(128, 8, 4) X(128, 8, 8)                                                \
    X(256, 8, 2) X(256, 8, 4) X(256, 8, 8)                                                \
    X(512, 8, 2) X(512, 8, 4) X(512, 8, 8)                                                \
    X(128, 16, 4)                                                                         \
    X(256, 16, 2) X(256, 16, 4) X(256, 16, 8)                                             \
    X(512, 16, 4) X(512, 16, 8)                                                           \
    X(256, 32, 4) X(512, 32, 2) X(512, 32, 4)                                             \
    X(256, 64, 4) X(512, 64, 4)

/* X(threads, rows, unroll) instantiated with 16 rows per warp (rows_per_warp = 16: a warp
 * streams two 8-row groups and feeds each x fragment to both; classic kernel only, no
 * in-kernel prologue). */
#define K3_SKINNY_RPW16_CONFIGS(X)                                                        \
    X(128, 16, 4) X(256, 16, 4) X(256, 16, 8) X(512, 16, 4) X(512, 16, 8)                 \
    X(256, 32, 4) X(512, 32, 2) X(512, 32, 4) X(256, 64, 4) X(512, 64, 4)

/* X(threads, rows, unroll) instantiated with 32 rows per warp (rows_per_warp = 32: four
 * 8-row groups share each x fragment, a quarter of the x loads per byte of w of 8 rows per
 * warp; classic kernel only, no in-kernel prologue). Unroll 2 holds as many bytes of w in
 * flight per lane (4 x 2 x 16) as 8 rows per warp at unroll 8, with a quarter of x's
 * registers. */
#define K3_SKINNY_RPW32_CONFIGS(X)                                                        \
    X(128, 32, 2) X(256, 32, 2) X(256, 64, 2) X(512, 64, 2) X(512, 128, 2) X(256, 32, 4)

/* X(threads, rows, unroll) instantiated for split-K across CTAs (kcta >= 2). */
#define K3_SKINNY_SPLIT_CONFIGS(X)                                                        \
    X(128, 8, 8) X(256, 8, 4) X(256, 8, 8) X(512, 8, 2)

#define K3_SKINNY_VEC 8
#define K3_SKINNY_MAX_M 16
#define K3_SKINNY_MAX_KCTA 32

/* What one launch computes. x [M,K] and w [N,K] are packed row-major bf16 (row stride K),
 * 16-byte aligned; res (may be NULL) and y are bf16 with element strides (s0, s1). */
typedef struct k3_skinny_problem {
    const void *x, *w, *res;
    int64_t res_s0, res_s1;
    void *y;
    int64_t y_s0, y_s1;
    int M, N, K;
    /* pdl: launched with programmatic dependent launch (griddepcontrol.launch_dependents at
     * entry, griddepcontrol.wait before x, res, ws, counters and y are touched); static_w:
     * the first step's w loads are issued before that wait (the weight is not written by a
     * kernel in flight). */
    int pdl, static_w;
    /* prologue: 0 none; 1 silu_mul: x is [M, 2K] (row stride 2K) and the product takes
     * silu(x[:, :K]) * x[:, K:] rounded to bf16; 2 rms_norm: x is [M, K] with row stride
     * x_row 16-byte vectors and the product takes rms_norm(x, norm_weight (bf16 [K], 16-byte
     * aligned), eps) (the prologues above). With a prologue the launch uses
     * k3_skinny_silu_smem_bytes of dynamic shared memory, which the caller checks against the
     * device's limit. */
    int prologue;
    int64_t x_row;
    const void *norm_weight;
    double eps;
    /* epilogue: 0 none; 1 silu_mul (classic tiles, no prologue): w is [2N, K], gate rows then
     * up rows, N is h's columns, and y is h [M, N] = silu(g) * u of the product's gate and up
     * halves, each rounded to bf16 first (the epilogue above k3_skinny_epi_kernel). */
    int epilogue;
    /* grid: 0, the classic tiling; or G >= ceil(N / rows) CTAs, CTA b taking rows
     * [N * b / G, N * (b + 1) / G) ("Balanced grid" above; classic tiles, no prologue or
     * epilogue): G = k3_skinny_balanced_grid(N, rows, sms). */
    int grid;
    /* l2_prefetch: 0, or the bytes (a multiple of 16) of each row of w, from the start of the
     * CTA's share of K (after the warps' first steps under static_w), that the CTA asks L2 to
     * fetch before the PDL wait ("L2 prefetch" above): k3_skinny_l2_prefetch_row of the
     * launch's budget. */
    int l2_prefetch;
} k3_skinny_problem;

/* The largest L2 prefetch budget of one launch, in MiB: the H200's L2 holds 50 MB, and lines
 * prefetched beyond what it holds would evict each other before the kernel reads them. */
#define K3_SKINNY_MAX_L2_PREFETCH_MB 40

/* Bytes of each row slice of w to prefetch into L2 for a budget of `mb` MiB over the whole
 * launch: the budget spread evenly over the rows of w (rows_w: N, or 2N with the silu_mul
 * epilogue) and the kcta slices along K, at most a slice (row_bytes / kcta, rounded up to
 * the 64-byte chunks a slice is cut in), in multiples of 16 bytes (the bulk prefetch's
 * unit); 0 when mb is 0. */
static inline int k3_skinny_l2_prefetch_row(int mb, int64_t rows_w, int64_t row_bytes, int kcta) {
    if (mb <= 0 || rows_w <= 0 || row_bytes <= 0 || kcta < 1) return 0;
    int64_t per = ((int64_t)mb << 20) / (rows_w * kcta);
    const int64_t slice = (row_bytes / kcta + 63) / 64 * 64;
    if (per > slice) per = slice;
    if (per > INT_MAX) per = INT_MAX;
    return (int)(per / 16 * 16);
}

/* Whether the kernel has instances of this many rows of w per warp (8, 16 or 32). */
static inline bool k3_skinny_rows_per_warp_valid(int rows_per_warp) {
    return rows_per_warp == 8 || rows_per_warp == 16 || rows_per_warp == 32;
}

/* split_k of a configuration (K-slices per row group: the warps of a CTA that share a row
 * group, each warp covering rows_per_warp rows, 8, 16 or 32); 0 when the shape is malformed. */
static inline int k3_skinny_split_k(int threads, int rows, int rows_per_warp = 8) {
    if (threads < 32 || threads % 32 || rows < 8 || rows % 8) return 0;
    if (!k3_skinny_rows_per_warp_valid(rows_per_warp)) return 0;
    if (rows % rows_per_warp) return 0;
    int warps = threads / 32, groups = rows / rows_per_warp;
    return warps % groups ? 0 : warps / groups;
}

static inline bool k3_skinny_instantiated(int threads, int rows, int unroll,
                                          int rows_per_warp = 8) {
#define K3_SK_MATCH(T, R, U)                                                               \
    if (threads == (T) && rows == (R) && unroll == (U)) return true;
    if (rows_per_warp == 16) {
        K3_SKINNY_RPW16_CONFIGS(K3_SK_MATCH)
        return false;
    }
    if (rows_per_warp == 32) {
        K3_SKINNY_RPW32_CONFIGS(K3_SK_MATCH)
        return false;
    }
    K3_SKINNY_CONFIGS(K3_SK_MATCH)
#undef K3_SK_MATCH
    return false;
}

static inline bool k3_skinny_split_instantiated(int threads, int rows, int unroll) {
#define K3_SK_MATCH(T, R, U)                                                               \
    if (threads == (T) && rows == (R) && unroll == (U)) return true;
    K3_SKINNY_SPLIT_CONFIGS(K3_SK_MATCH)
#undef K3_SK_MATCH
    return false;
}

/* The balanced grid of N rows in CTAs of at most `rows` rows on `sms` multiprocessors: the
 * smallest multiple of sms with ceil(N / G) <= rows (0 when N <= 0 or an argument is bad). */
static inline int k3_skinny_balanced_grid(int64_t N, int rows, int sms) {
    if (N <= 0 || rows <= 0 || sms <= 0) return 0;
    const int64_t per_wave = (int64_t)sms * rows;
    const int64_t g = (int64_t)sms * ((N + per_wave - 1) / per_wave);
    return g > INT_MAX ? 0 : (int)g;
}

/* Dynamic shared memory of a SwiGLU-prologue launch: h [M][row] in 16-byte vectors, a row
 * holding the largest k range of one CTA (K, or one of kcta slices of 32-k chunks), padded to
 * 4 (mod 8) vectors. */
#if defined(__CUDACC__)
#define K3SK_HD __host__ __device__
#else
#define K3SK_HD
#endif
static inline K3SK_HD int k3_skinny_silu_row(int nvs) { return ((nvs + 7) & ~7) + 4; }
static inline size_t k3_skinny_silu_smem_bytes(int M, int K, int kcta) {
    const int nvec = K / 8, nchunk = (nvec + 3) / 4;
    const int chunks = kcta > 1 ? (nchunk + kcta - 1) / kcta : nchunk;
    const int nvs = chunks * 4 < nvec ? chunks * 4 : nvec;
    return (size_t)M * (size_t)k3_skinny_silu_row(nvs) * 16u;
}

/* Bytes of fp32 partials a split launch needs in ws (0 for kcta <= 1), and the number of
 * counters (row tiles) it uses. */
static inline size_t k3_skinny_split_ws_bytes(int rows, int kcta, int M, int N) {
    if (kcta <= 1 || rows <= 0 || N <= 0) return 0;
    return (size_t)((N + rows - 1) / rows) * (size_t)kcta * (size_t)M * (size_t)rows * 4u;
}
static inline int64_t k3_skinny_split_tiles(int rows, int N) {
    return rows > 0 && N > 0 ? ((int64_t)N + rows - 1) / rows : 0;
}

#if defined(__CUDACC__)

/* 16 bytes of w, streamed past L1 (read once); zero when !pred, and then nothing is read. */
static __device__ __forceinline__ uint4 k3sk_load_w(const uint4 *p, bool pred) {
    uint4 r;
    asm("{\n\t.reg .pred p;\n\t"
        "setp.ne.b32 p, %5, 0;\n\t"
        "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
        "@p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p), "r"((int)pred));
    return r;
}

/* 16 bytes of x, kept in L1 (every warp of the block reads the same x); zero when !pred. */
static __device__ __forceinline__ uint4 k3sk_load_x(const uint4 *p, bool pred) {
    uint4 r;
    asm("{\n\t.reg .pred p;\n\t"
        "setp.ne.b32 p, %5, 0;\n\t"
        "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
        "@p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p), "r"((int)pred));
    return r;
}

/* The same two loads as asm volatile: the compiler keeps them in program order ahead of
 * the (volatile) MMAs, so all UNROLL loads of a step are issued before the first MMA
 * (more bytes in flight; the split kernels use these). */
static __device__ __forceinline__ uint4 k3sk_load_w_v(const uint4 *p, bool pred) {
    uint4 r;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "setp.ne.b32 p, %5, 0;\n\t"
                 "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
                 "@p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "r"((int)pred));
    return r;
}
static __device__ __forceinline__ uint4 k3sk_load_x_v(const uint4 *p, bool pred) {
    uint4 r;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "setp.ne.b32 p, %5, 0;\n\t"
                 "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
                 "@p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "r"((int)pred));
    return r;
}

/* d += A(16x16, tokens x k) * B(16x8, k x rows), bf16 operands, fp32 accumulators. */
static __device__ __forceinline__ void k3sk_mma(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ float k3sk_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays a (quiet) NaN. */
static __device__ __forceinline__ uint16_t k3sk_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* h = silu(g) * u for the two bf16 of g and u (low half first), rounded to bf16 as
 * cuda.silu_mul.generic rounds (fp32 arithmetic, one rounding). */
static __device__ __forceinline__ uint16_t k3sk_silu_mul1(float g, float u) {
    return k3sk_f32_to_bf16(k3c_silu(g) * u);
}
static __device__ __forceinline__ uint32_t k3sk_silu_mul2(uint32_t g, uint32_t u) {
    const float g0 = k3sk_bf16_to_f32((uint16_t)(g & 0xffffu)), g1 = k3sk_bf16_to_f32((uint16_t)(g >> 16));
    const float u0 = k3sk_bf16_to_f32((uint16_t)(u & 0xffffu)), u1 = k3sk_bf16_to_f32((uint16_t)(u >> 16));
    const uint32_t h0 = k3sk_silu_mul1(g0, u0);
    const uint32_t h1 = k3sk_silu_mul1(g1, u1);
    return h0 | (h1 << 16);
}
static __device__ __forceinline__ uint4 k3sk_silu_mul(uint4 g, uint4 u) {
    return make_uint4(k3sk_silu_mul2(g.x, u.x), k3sk_silu_mul2(g.y, u.y),
                      k3sk_silu_mul2(g.z, u.z), k3sk_silu_mul2(g.w, u.w));
}


/* One virtual thread's partial sums in cuda.rms_norm.generic's order: elements d = vt,
 * vt + 256, ... of row xr (bf16, K of them), accumulated in increasing d; loads are issued
 * eight at a time ahead of the sums (the order of the sums is unchanged). SCALED: the sum of
 * (x 2^-k)^2 of the rescaled pass, without the max. */
template <bool SCALED>
static __device__ __forceinline__ void k3sk_rms_partial(const uint16_t *__restrict__ xr, int K,
                                                        int vt, int k, float *ss, float *mx) {
    float s = 0.f, m = 0.f;
    for (int d0 = vt; d0 < K; d0 += 8 * 256) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int d = d0 + j * 256;
            v[j] = d < K ? k3sk_bf16_to_f32(xr[d]) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (d0 + j * 256 >= K) break;
            if (SCALED) {
                const float z = ldexpf(v[j], -k);
                s += z * z;
            } else {
                s += v[j] * v[j];
                m = fmaxf(m, fabsf(v[j]));
            }
        }
    }
    *ss = s;
    *mx = m;
}

/* The RMSNorm row scales of the M rows of x (bf16 [M, K], rows xrow 16-byte vectors apart),
 * computed by the whole CTA in cuda.rms_norm.generic's order (kernels/norm.cu, a CTA of 256
 * threads per row): virtual thread vt (0..255) of a row sums x[vt], x[vt + 256], ... (squares,
 * and max |x|); each virtual warp's butterfly (its lane 0's value); the 8 warp partials in
 * order. Then that kernel's normal path, or, for a row whose max is finite and nonzero while
 * its sum is not finite or below the smallest normal, its second pass over x 2^-k. The
 * (row, virtual warp) tasks are spread over the CTA's warps. r[m], e[m] (the exponent x is
 * scaled by; 0 on the normal path) and part, part_max ([16][8] floats) and flag ([16] ints)
 * are shared memory. Contains __syncthreads(). */
template <int THREADS>
static __device__ void k3sk_rms_scales(const uint4 *__restrict__ x, int64_t xrow, int M, int K,
                                       double eps, float (*part)[8], float (*part_max)[8],
                                       int *flag, float *r, int *e) {
    constexpr int WARPS = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int task = warp; task < M * 8; task += WARPS) {
        const int m = task >> 3, vw = task & 7;
        float ss, mx;
        k3sk_rms_partial<false>((const uint16_t *)(x + m * xrow), K, vw * 32 + lane, 0, &ss, &mx);
        ss = k3c_warp_sum(ss);
        mx = k3c_warp_max(mx);
        if (lane == 0) {
            part[m][vw] = ss;
            part_max[m][vw] = mx;
        }
    }
    __syncthreads();
    if (threadIdx.x < M) {
        const int m = threadIdx.x;
        float tot = 0.f, mm = 0.f;
        for (int q = 0; q < 8; q++) {
            tot += part[m][q];
            mm = fmaxf(mm, part_max[m][q]);
        }
        e[m] = 0;
        flag[m] = 0;
        if (!(mm > 0 && isfinite(mm)) || (tot >= 0x1p-126f && isfinite(tot))) {
            r[m] = 1.0f / sqrtf(tot / (float)K + (float)eps);
        } else {
            int k;
            frexpf(mm, &k);
            flag[m] = k == 0 ? INT_MIN : k; /* the rescale exponent (k = 0 kept apart) */
        }
    }
    __syncthreads();
    for (int task = warp; task < M * 8; task += WARPS) {
        const int m = task >> 3, vw = task & 7;
        if (!flag[m]) continue; /* the same for the whole warp */
        const int k = flag[m] == INT_MIN ? 0 : flag[m];
        float sz, unused;
        k3sk_rms_partial<true>((const uint16_t *)(x + m * xrow), K, vw * 32 + lane, k, &sz, &unused);
        sz = k3c_warp_sum(sz);
        if (lane == 0) part[m][vw] = sz;
    }
    __syncthreads();
    if (threadIdx.x < M && flag[threadIdx.x]) {
        const int m = threadIdx.x, k = flag[m] == INT_MIN ? 0 : flag[m];
        float szt = 0.f;
        for (int q = 0; q < 8; q++) szt += part[m][q];
        const float te = ldexpf((float)eps, -2 * k);
        if (isfinite(te)) {
            e[m] = -k;
            r[m] = 1.0f / sqrtf(szt / (float)K + te);
        } else {
            r[m] = 1.0f / sqrtf((float)eps);
        }
    }
    __syncthreads();
}

/* h = round(((x 2^e) r) w) for 8 bf16 of x and of the norm weight, as cuda.rms_norm.generic
 * writes its output. */
static __device__ __forceinline__ uint32_t k3sk_rms2(uint32_t xv, uint32_t wv, float r, int e) {
    float x0 = k3sk_bf16_to_f32((uint16_t)(xv & 0xffffu)), x1 = k3sk_bf16_to_f32((uint16_t)(xv >> 16));
    if (e) {
        x0 = ldexpf(x0, e);
        x1 = ldexpf(x1, e);
    }
    const uint32_t h0 = k3sk_f32_to_bf16(x0 * r * k3sk_bf16_to_f32((uint16_t)(wv & 0xffffu)));
    const uint32_t h1 = k3sk_f32_to_bf16(x1 * r * k3sk_bf16_to_f32((uint16_t)(wv >> 16)));
    return h0 | (h1 << 16);
}
static __device__ __forceinline__ uint4 k3sk_rms(uint4 xv, uint4 wv, float r, int e) {
    return make_uint4(k3sk_rms2(xv.x, wv.x, r, e), k3sk_rms2(xv.y, wv.y, r, e),
                      k3sk_rms2(xv.z, wv.z, r, e), k3sk_rms2(xv.w, wv.w, r, e));
}

/* MT = token tiles of 8 (1 for M <= 8, 2 for M <= 16). */
/* SPLIT: split-K across CTAs (gridDim.y = kcta >= 2, ws and counters used); otherwise
 * gridDim.y = 1 and ws / counters are unused (may be NULL). PRO: the prologue (0 none,
 * 1 silu_mul: x rows of 2K, gate | up; 2 rms_norm: x rows xs vectors apart, norm weight nw,
 * eps). */
#define K3SK_PARAMS                                                                        \
    const uint4 *__restrict__ x, const uint4 *__restrict__ w, const uint16_t *__restrict__ res, \
        int64_t res_s0, int64_t res_s1, uint16_t *__restrict__ y, int64_t y_s0, int64_t y_s1,  \
        int M, int N, int K, float *__restrict__ ws, unsigned *__restrict__ counters, int pdl, \
        int static_w, int64_t xs, const uint4 *__restrict__ nw, double eps, int bal, int pf
#define K3SK_ARGS x, w, res, res_s0, res_s1, y, y_s0, y_s1, M, N, K, ws, counters, pdl, static_w, xs, nw, eps, bal, pf
/* The silu_mul epilogue's rows (EPI): local row lr of CTA b (0..ROWS-1) streams gate row
 * b * ROWS/2 + lr for lr < ROWS/2 and up row N + b * ROWS/2 + lr - ROWS/2 otherwise, N being
 * h's columns (w has 2N rows); the pair exists while b * ROWS/2 + lr % (ROWS/2) < N. */
template <int ROWS>
static __device__ __forceinline__ int k3sk_epi_col(int lr) {
    return (int)blockIdx.x * (ROWS / 2) + lr % (ROWS / 2);
}
template <int ROWS>
static __device__ __forceinline__ int k3sk_epi_row(int lr, int N) {
    return lr < ROWS / 2 ? k3sk_epi_col<ROWS>(lr) : N + k3sk_epi_col<ROWS>(lr);
}

/* The kernel's body; k3_skinny_kernel (no prologue), k3_skinny_pro_kernel and
 * k3_skinny_epi_kernel (EPI: the silu_mul epilogue, classic tiles, no prologue) wrap it. */
template <int THREADS, int ROWS, int UNROLL, int MT, bool SPLIT, int PRO, int RW, bool EPI = false>
static __device__ __forceinline__ void k3_skinny_body(K3SK_PARAMS) {
    constexpr int WARPS = THREADS / 32;
    constexpr int GROUPS = ROWS / 8;
    /* RW 8-row groups per warp (rows_per_warp / 8) */
    static_assert(RW == 1 || ((RW == 2 || RW == 4) && GROUPS % RW == 0 && !SPLIT && PRO == 0),
                  "16 or 32 rows per warp: whole warps' rows per CTA, classic, no prologue");
    constexpr int KW = WARPS / (GROUPS / RW);
    static_assert(THREADS % 32 == 0 && ROWS % 8 == 0, "bad skinny configuration");
    static_assert(WARPS % (GROUPS / RW) == 0 && KW >= 1, "warps must cover the row groups");
    static_assert(MT == 1 || MT == 2, "one or two token tiles");
    static_assert(!EPI || (!SPLIT && PRO == 0), "the silu_mul epilogue: classic tiles, no prologue");

    /* [warp][accumulator][lane]: lanes consecutive, so stores and loads are conflict-free. */
    __shared__ float partial[WARPS][4 * RW][32];
    extern __shared__ uint4 k3sk_h[]; /* PRO: h [M][hrow] of this CTA's k range */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / KW, kw = warp % KW;
    const int g = lane >> 2, t = lane & 3;
    const int nvec = K / 8;            /* 16-byte vectors per row (K % 8 == 0) */
    const int nchunk = (nvec + 3) / 4; /* chunks of 32 k */

    /* This CTA's rows [n0, n1): a tile of ROWS, or its share of a balanced grid (bal). */
    const bool balanced = !EPI && !SPLIT && PRO == 0 && bal;
    const int64_t n0 = balanced ? (int64_t)N * blockIdx.x / gridDim.x : (int64_t)blockIdx.x * ROWS;
    const int64_t n1 = balanced ? (int64_t)N * (blockIdx.x + 1) / gridDim.x
                                : (n0 + ROWS < N ? n0 + ROWS : (int64_t)N);
    /* EPI: the local row's gate or up row of w (k3sk_epi_row), N is h's columns. */
    /* The warp's RW row groups: group j is local row lrow + 8 j (row 0 of the group is
     * lane 4 g's row g). */
    const int lrow = group * RW * 8 + g;
    const uint4 *wr[RW];
    bool row_ok[RW];
#pragma unroll
    for (int j = 0; j < RW; ++j) {
        const int64_t r = EPI ? k3sk_epi_row<ROWS>(lrow + 8 * j, N) : n0 + lrow + 8 * j;
        row_ok[j] = EPI ? k3sk_epi_col<ROWS>(lrow + 8 * j) < N : r < n1;
        wr[j] = w + (row_ok[j] ? r : 0) * (int64_t)nvec;
    }
    const bool x0_ok = g < M;
    const bool x1_ok = MT == 2 && g + 8 < M;
    /* x's row in vectors */
    const int64_t xrow = PRO == 1 ? 2 * (int64_t)nvec : PRO == 2 ? xs : (int64_t)nvec;
    const uint4 *x0 = x + (x0_ok ? g : 0) * xrow;
    const uint4 *x1 = x + (x1_ok ? g + 8 : 0) * xrow;

    /* This CTA's chunks: all of them, or split s of kcta (equal slices, fixed bounds). */
    int cbeg = 0, cend = nchunk;
    if (SPLIT) {
        cbeg = (int)((int64_t)nchunk * blockIdx.y / gridDim.y);
        cend = (int)((int64_t)nchunk * (blockIdx.y + 1) / gridDim.y);
    }

    /* PDL: dependents may launch now; with a static weight this warp's first step of w is
     * loaded before the wait for the previous kernel, everything else after it. */
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int cfirst = cbeg + kw * UNROLL;
    uint4 wv[RW][UNROLL];
    if (static_w && cfirst < cend) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = (cfirst + u) * 4 + t;
            const bool kin = v < nvec && (!SPLIT || cfirst + u < cend);
#pragma unroll
            for (int j = 0; j < RW; ++j)
                wv[j][u] = k3sk_load_w_v(wr[j] + (kin ? v : 0), row_ok[j] && kin);
        }
    }
    /* L2 prefetch (pf > 0): local row lr's thread asks L2 for pf bytes of that row's share of
     * K, from after the warps' first steps under static weights, from its start otherwise. It
     * is an asynchronous bulk prefetch and L2 is coherent, so this is correct whoever writes
     * w. Under PDL this runs while the previous kernel still drains. */
    if (pf > 0) {
        for (int lr = threadIdx.x; lr < ROWS; lr += THREADS) {
            const int64_t r = EPI ? k3sk_epi_row<ROWS>(lr, N) : n0 + lr;
            const bool ok = EPI ? k3sk_epi_col<ROWS>(lr) < N : r < n1;
            /* with static weights the KW warps' first steps (chunks [cbeg, cbeg + KW * UNROLL))
             * are already being loaded: the prefetch starts after them */
            const int vhi = cend * 4 < nvec ? cend * 4 : nvec;
            const int vlo = min(vhi, (cbeg + (static_w ? KW * UNROLL : 0)) * 4);
            const int bytes = min(pf, (vhi - vlo) * 16);
            if (ok && bytes > 0)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + r * nvec + vlo),
                             "r"(bytes)
                             : "memory");
        }
    }
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");

    /* PRO: h for vectors [vbeg, vend) of the M tokens, computed once by the whole CTA; loads
     * are issued four items at a time so their latencies overlap. */
    const int vbeg = cbeg * 4, vend = cend * 4 < nvec ? cend * 4 : nvec;
    const int nvs = vend > vbeg ? vend - vbeg : 0, hrow = k3_skinny_silu_row(nvs);
    __shared__ float rms_r[PRO == 2 ? K3_SKINNY_MAX_M : 1];
    __shared__ int rms_e[PRO == 2 ? K3_SKINNY_MAX_M : 1];
    if (PRO == 2) {
        __shared__ float rms_part[K3_SKINNY_MAX_M][8], rms_part_max[K3_SKINNY_MAX_M][8];
        __shared__ int rms_flag[K3_SKINNY_MAX_M];
        k3sk_rms_scales<THREADS>(x, xrow, M, K, eps, rms_part, rms_part_max, rms_flag, rms_r, rms_e);
    }
    if (PRO != 0) {
        const int items = M * nvs;
        for (int i0 = threadIdx.x; i0 < items; i0 += 4 * THREADS) {
            uint4 gv[4], uv[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = i0 + j * THREADS;
                const bool in = i < items;
                const int m = in ? i / nvs : 0, q = in ? i - m * nvs : 0;
                const uint4 *xr = x + m * xrow + vbeg + q;
                gv[j] = k3sk_load_x(xr, in);
                /* the up half, or the norm weight's 8 values */
                uv[j] = k3sk_load_x(PRO == 1 ? xr + nvec : nw + vbeg + q, in);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = i0 + j * THREADS;
                if (i < items) {
                    const int m = i / nvs, q = i - m * nvs;
                    k3sk_h[m * hrow + q] = PRO == 1 ? k3sk_silu_mul(gv[j], uv[j])
                                                    : k3sk_rms(gv[j], uv[j], rms_r[m], rms_e[m]);
                }
            }
        }
        __syncthreads();
    }

    float acc[RW][4];
#pragma unroll
    for (int j = 0; j < RW; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int c0 = cfirst; c0 < cend; c0 += KW * UNROLL) {
        uint4 xa[UNROLL], xb[UNROLL];
        const bool have_w = static_w && c0 == cfirst;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = (c0 + u) * 4 + t;
            /* v < nvec implies c0 + u < nchunk; a split also stops at its own end. */
            const bool kin = v < nvec && (!SPLIT || c0 + u < cend);
            const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
            if (PRO != 0) {
                /* kin puts v in [vbeg, vend): h's own row; tokens >= M read zeros. */
                if (!have_w) {
                    if (SPLIT) wv[0][u] = k3sk_load_w_v(wr[0] + (kin ? v : 0), row_ok[0] && kin);
                    else wv[0][u] = k3sk_load_w(wr[0] + (kin ? v : 0), row_ok[0] && kin);
                }
                xa[u] = x0_ok && kin ? k3sk_h[g * hrow + (v - vbeg)] : zero;
                xb[u] = MT == 2 && x1_ok && kin ? k3sk_h[(g + 8) * hrow + (v - vbeg)] : zero;
            } else if (SPLIT) {
                if (!have_w) wv[0][u] = k3sk_load_w_v(wr[0] + (kin ? v : 0), row_ok[0] && kin);
                xa[u] = k3sk_load_x_v(x0 + (kin ? v : 0), x0_ok && kin);
                if (MT == 2)
                    xb[u] = k3sk_load_x_v(x1 + (kin ? v : 0), x1_ok && kin);
                else
                    xb[u] = zero;
            } else {
                /* RW > 1: classic tiles, no prologue (the static_assert above) */
                if (!have_w)
#pragma unroll
                    for (int j = 0; j < RW; ++j)
                        wv[j][u] = k3sk_load_w(wr[j] + (kin ? v : 0), row_ok[j] && kin);
                xa[u] = k3sk_load_x(x0 + (kin ? v : 0), x0_ok && kin);
                if (MT == 2)
                    xb[u] = k3sk_load_x(x1 + (kin ? v : 0), x1_ok && kin);
                else
                    xb[u] = zero;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            /* k pairs (8t, 8t+1), (8t+2, 8t+3) form the first MMA's k, the rest the second. */
#pragma unroll
            for (int j = 0; j < RW; ++j) {
                k3sk_mma(acc[j], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[j][u].x, wv[j][u].y);
                k3sk_mma(acc[j], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[j][u].z, wv[j][u].w);
            }
        }
    }

#pragma unroll
    for (int j = 0; j < RW; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) partial[warp][4 * j + r][lane] = acc[j][r];
    __syncthreads();

    /* Output (token m, row r of group): acc[2*(m/8) + r%2] of lane 4*(m%8) + r/2. */
    if constexpr (EPI) {
        /* Each output (token m, column n = b * ROWS/2 + o) sums its gate row o and its up row
         * ROWS/2 + o in the plain kernel's order, rounds both to bf16 as the plain kernel
         * writes y, and stores round(silu(gate) * up) as cuda.silu_mul.generic does. */
        constexpr int HALF = ROWS / 2;
        /* the sum of token m's local row lr: that of the plain kernel's loop below */
        const auto row_sum = [&](int m, int lr) {
            const int grp = lr >> 3, r = lr & 7;
            const int src = (m & 7) * 4 + (r >> 1), reg = ((m >> 3) << 1) | (r & 1);
            float s = 0.f;
#pragma unroll
            for (int j = 0; j < KW; ++j) s += partial[(grp / RW) * KW + j][(grp % RW) * 4 + reg][src];
            return s;
        };
        for (int i = threadIdx.x; i < 16 * HALF; i += THREADS) {
            const int m = i / HALF, o = i % HALF;
            const int n = k3sk_epi_col<ROWS>(o);
            if (m >= M || n >= N) continue;
            /* gate and up rounded to bf16 (y's bits), then widened exactly */
            const float g = k3sk_bf16_to_f32(k3sk_f32_to_bf16(row_sum(m, o)));
            const float u = k3sk_bf16_to_f32(k3sk_f32_to_bf16(row_sum(m, HALF + o)));
            y[m * y_s0 + n * y_s1] = k3sk_silu_mul1(g, u);
        }
    }
    /* (no iteration under EPI, whose outputs the loop above wrote) */
    for (int i = threadIdx.x; !EPI && i < GROUPS * 128; i += THREADS) {
        const int grp = i >> 7, m = (i >> 3) & 15, r = i & 7;
        const int64_t n = n0 + grp * 8 + r;
        if (m >= M || n >= n1) continue;
        const int src = (m & 7) * 4 + (r >> 1);
        const int reg = ((m >> 3) << 1) | (r & 1);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < KW; ++j) s += partial[(grp / RW) * KW + j][(grp % RW) * 4 + reg][src];
        if (SPLIT) {
            /* partial of split blockIdx.y: [M][ROWS] fp32, rows of the tile consecutive */
            ws[((int64_t)blockIdx.x * gridDim.y + blockIdx.y) * M * ROWS + m * ROWS + grp * 8 +
               r] = s;
            continue;
        }
        if (res) s += k3sk_bf16_to_f32(res[m * res_s0 + n * res_s1]);
        y[m * y_s0 + n * y_s1] = k3sk_f32_to_bf16(s);
    }
    if (!SPLIT) return;

    /* Last-arriving CTA of this row tile: release (fence, then count), acquire (fence after
     * seeing the count), sum the kcta partials in split order, round once, reset. */
    __shared__ unsigned is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned prev = atomicAdd(&counters[blockIdx.x], 1u);
        is_last = prev == gridDim.y - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const int kcta = (int)gridDim.y;
    const int64_t slot = (int64_t)M * ROWS;
    const float *tp = ws + (int64_t)blockIdx.x * kcta * slot;
    for (int i = threadIdx.x; i < M * ROWS; i += THREADS) {
        const int m = i / ROWS, rr = i % ROWS;
        const int64_t n = (int64_t)blockIdx.x * ROWS + rr;
        if (n >= N) continue;
        float s = 0.f;
        for (int j = 0; j < kcta; ++j) s += __ldcg(tp + j * slot + i);
        if (res) s += k3sk_bf16_to_f32(res[m * res_s0 + n * res_s1]);
        y[m * y_s0 + n * y_s1] = k3sk_f32_to_bf16(s);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0u;
}

template <int THREADS, int ROWS, int UNROLL, int MT, bool SPLIT, int RW>
__global__ void __launch_bounds__(THREADS) k3_skinny_kernel(K3SK_PARAMS) {
    k3_skinny_body<THREADS, ROWS, UNROLL, MT, SPLIT, 0, RW>(K3SK_ARGS);
}
/* With a prologue the kernel holds more live values (the fill's loads, the row scales): its
 * registers are capped at 64 (1024 threads' worth per SM), so as many CTAs stay resident as
 * for the plain kernel (~58 registers); uncapped it took 87, one CTA of 512 threads per SM
 * where the plain kernel has two, and the grid ran in two waves. */
template <int THREADS, int ROWS, int UNROLL, int MT, bool SPLIT, int PRO>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS) k3_skinny_pro_kernel(K3SK_PARAMS) {
    k3_skinny_body<THREADS, ROWS, UNROLL, MT, SPLIT, PRO, 1>(K3SK_ARGS);
}
/* The silu_mul epilogue (classic tiles, rows_per_warp 8, 16 or 32): the plain kernel's live set
 * during the stream and its launch bounds, except where ptxas then spilled (it gave the
 * epilogue fewer registers than the plain kernel takes): with 512 threads, 16 tokens, 8 rows per
 * warp and unroll <= 4 (the plain kernel: 64 registers, two CTAs per SM) k3_skinny_epi_mb_kernel
 * asks for two CTAs per SM outright (64 registers, no spill); with 256 threads, 8 tokens and
 * unroll 8 (the plain kernel: 90 registers, two CTAs per SM) for one, which leaves it the
 * registers it needs (two CTAs still fit). k3sk_epi_min_blocks says which instances take it. */
template <int THREADS, int UNROLL, int MT, int RW>
constexpr int k3sk_epi_min_blocks() {
    return THREADS == 512 && UNROLL <= 4 && MT == 2 && RW == 1   ? 2
           : THREADS == 256 && UNROLL == 8 && MT == 1 && RW == 1 ? 1
                                                                 : 0;
}
template <int THREADS, int ROWS, int UNROLL, int MT, int RW>
__global__ void __launch_bounds__(THREADS) k3_skinny_epi_kernel(K3SK_PARAMS) {
    k3_skinny_body<THREADS, ROWS, UNROLL, MT, false, 0, RW, true>(K3SK_ARGS);
}
template <int THREADS, int ROWS, int UNROLL, int MT, int RW, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) k3_skinny_epi_mb_kernel(K3SK_PARAMS) {
    k3_skinny_body<THREADS, ROWS, UNROLL, MT, false, 0, RW, true>(K3SK_ARGS);
}
#undef K3SK_PARAMS
#undef K3SK_ARGS

/* The epilogue kernel of one instance (k3sk_epi_min_blocks). */
template <int THREADS, int ROWS, int UNROLL, int MT, int RW>
static constexpr auto k3sk_epi_instance() {
    constexpr int mb = k3sk_epi_min_blocks<THREADS, UNROLL, MT, RW>();
    if constexpr (mb > 0) return k3_skinny_epi_mb_kernel<THREADS, ROWS, UNROLL, MT, RW, mb>;
    else return k3_skinny_epi_kernel<THREADS, ROWS, UNROLL, MT, RW>;
}

template <int THREADS, int ROWS, int UNROLL, bool SPLIT, int RW = 1>
static cudaError_t k3_skinny_launch_t(const k3_skinny_problem &p, int kcta, float *ws,
                                      unsigned *counters, cudaStream_t stream) {
    const uint4 *x = (const uint4 *)p.x, *w = (const uint4 *)p.w;
    const uint16_t *res = (const uint16_t *)p.res;
    uint16_t *y = (uint16_t *)p.y;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    /* The epilogue's CTA writes ROWS/2 columns of h from ROWS rows of w. */
    const int cols = p.epilogue ? ROWS / 2 : ROWS;
    const bool bal = p.grid > 0;
    /* a balanced grid: classic tiles without prologue or epilogue, at most ROWS rows a CTA */
    if (bal && (SPLIT || p.prologue || p.epilogue || (int64_t)p.grid * ROWS < p.N))
        return cudaErrorInvalidValue;
    lc.gridDim = dim3(bal ? (unsigned)p.grid : (unsigned)((p.N + cols - 1) / cols),
                      SPLIT ? (unsigned)kcta : 1u);
    lc.blockDim = dim3(THREADS);
    lc.dynamicSmemBytes = p.prologue ? k3_skinny_silu_smem_bytes(p.M, p.K, SPLIT ? kcta : 1) : 0;
    lc.stream = stream;
    lc.attrs = p.pdl ? attr : nullptr;
    lc.numAttrs = p.pdl ? 1 : 0;
    const int pdl = p.pdl ? 1 : 0, st = p.static_w ? 1 : 0;
    cudaError_t e;
    /* A launch may use 48 KB of shared memory, static and dynamic together, unless the kernel
     * opts in to more: the prologue's h (its only dynamic shared memory) opts in whenever it
     * is used, since from 48 KB less the kernel's static partials (8-9 KB) a launch without the
     * attribute fails. */
    const uint4 *nw = (const uint4 *)p.norm_weight;
#define K3_SK_EX(KERNEL)                                                                   \
    ((lc.dynamicSmemBytes > 0 &&                                                           \
      (e = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize,         \
                                (int)lc.dynamicSmemBytes)) != cudaSuccess)                 \
         ? e                                                                               \
         : cudaLaunchKernelEx(&lc, KERNEL, x, w, res, p.res_s0, p.res_s1, y, p.y_s0, p.y_s1,    \
                              p.M, p.N, p.K, ws, counters, pdl, st, p.x_row, nw, p.eps, bal ? 1 : 0, \
                              p.l2_prefetch > 0 ? p.l2_prefetch / 16 * 16 : 0))
    if (RW != 1 && p.prologue) return cudaErrorInvalidValue; /* no prologue instances */
    if (p.epilogue && (SPLIT || p.prologue)) return cudaErrorInvalidValue; /* none either */
    /* (compile-time branches: an instance of 16 or 32 rows per warp instantiates no kernel of
     * 8 rows per warp, and a split one no epilogue) */
    if (p.epilogue) {
        if constexpr (SPLIT) return cudaErrorInvalidValue;
        else if (p.M <= 8)
            e = K3_SK_EX((k3sk_epi_instance<THREADS, ROWS, UNROLL, 1, RW>()));
        else
            e = K3_SK_EX((k3sk_epi_instance<THREADS, ROWS, UNROLL, 2, RW>()));
    } else if constexpr (RW != 1)
        e = p.M <= 8 ? K3_SK_EX((k3_skinny_kernel<THREADS, ROWS, UNROLL, 1, false, RW>))
                     : K3_SK_EX((k3_skinny_kernel<THREADS, ROWS, UNROLL, 2, false, RW>));
    else if (p.prologue == 1)
        e = p.M <= 8 ? K3_SK_EX((k3_skinny_pro_kernel<THREADS, ROWS, UNROLL, 1, SPLIT, 1>))
                     : K3_SK_EX((k3_skinny_pro_kernel<THREADS, ROWS, UNROLL, 2, SPLIT, 1>));
    else if (p.prologue == 2)
        e = p.M <= 8 ? K3_SK_EX((k3_skinny_pro_kernel<THREADS, ROWS, UNROLL, 1, SPLIT, 2>))
                     : K3_SK_EX((k3_skinny_pro_kernel<THREADS, ROWS, UNROLL, 2, SPLIT, 2>));
    else
        e = p.M <= 8 ? K3_SK_EX((k3_skinny_kernel<THREADS, ROWS, UNROLL, 1, SPLIT, 1>))
                     : K3_SK_EX((k3_skinny_kernel<THREADS, ROWS, UNROLL, 2, SPLIT, 1>));
#undef K3_SK_EX
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* Launches one instantiated configuration on `stream` (rows_per_warp 8, or 16 and 32 for
 * the K3_SKINNY_RPW16_CONFIGS and K3_SKINNY_RPW32_CONFIGS, which take no prologue).
 * cudaErrorInvalidValue when the configuration is not instantiated or the problem is out of range (M 1..16, K % 8, sizes
 * non-negative, x and w 16-byte aligned); the caller checks these first and names them. */
static cudaError_t k3_skinny_launch(int threads, int rows, int unroll,
                                    const k3_skinny_problem &p, cudaStream_t stream,
                                    int rows_per_warp = 8) {
    if (p.M < 1 || p.M > K3_SKINNY_MAX_M || p.N < 0 || p.K < 0 || p.K % K3_SKINNY_VEC ||
        ((uintptr_t)p.x & 15) || ((uintptr_t)p.w & 15) || !p.y)
        return cudaErrorInvalidValue;
    if (p.N == 0) return cudaSuccess;
    /* RW: 8-row groups per warp (rows_per_warp / 8) of the configuration list searched */
#define K3_SK_LAUNCH(T, R, U)                                                              \
    if (threads == (T) && rows == (R) && unroll == (U))                                    \
        return k3_skinny_launch_t<T, R, U, false, RW>(p, 1, nullptr, nullptr, stream);
    if (rows_per_warp == 16) {
        constexpr int RW = 2;
        K3_SKINNY_RPW16_CONFIGS(K3_SK_LAUNCH)
    } else if (rows_per_warp == 32) {
        constexpr int RW = 4;
        K3_SKINNY_RPW32_CONFIGS(K3_SK_LAUNCH)
    } else if (rows_per_warp == 8) {
        constexpr int RW = 1;
        K3_SKINNY_CONFIGS(K3_SK_LAUNCH)
    }
#undef K3_SK_LAUNCH
    return cudaErrorInvalidValue;
}

/* Launches one split-K-across-CTAs configuration (kcta CTAs along K, 2..K3_SKINNY_MAX_KCTA).
 * ws: >= k3_skinny_split_ws_bytes(rows, kcta, M, N) bytes, 16-byte aligned, scratch (stream
 * ordered); counters: >= k3_skinny_split_tiles(rows, N) unsigned, all ZERO, owned by this
 * stream (the kernel leaves them zero). cudaErrorInvalidValue as k3_skinny_launch, and when
 * the triple is not in K3_SKINNY_SPLIT_CONFIGS, kcta is out of range or ws/counters are NULL. */
static cudaError_t k3_skinny_launch_split(int threads, int rows, int unroll, int kcta,
                                          const k3_skinny_problem &p, float *ws,
                                          unsigned *counters, cudaStream_t stream) {
    if (p.M < 1 || p.M > K3_SKINNY_MAX_M || p.N < 0 || p.K < 0 || p.K % K3_SKINNY_VEC ||
        ((uintptr_t)p.x & 15) || ((uintptr_t)p.w & 15) || !p.y || kcta < 2 ||
        kcta > K3_SKINNY_MAX_KCTA || !ws || !counters)
        return cudaErrorInvalidValue;
    if (p.N == 0) return cudaSuccess;
#define K3_SK_LAUNCH(T, R, U)                                                              \
    if (threads == (T) && rows == (R) && unroll == (U))                                    \
        return k3_skinny_launch_t<T, R, U, true>(p, kcta, ws, counters, stream);
    K3_SKINNY_SPLIT_CONFIGS(K3_SK_LAUNCH)
#undef K3_SK_LAUNCH
    return cudaErrorInvalidValue;
}

#endif /* __CUDACC__ */

#endif /* K3_LINEAR_SKINNY_CUH */
