/*
 * linear_bench.cuh — what tools/autotune.cu and tools/linear_sweep.cu share to measure the
 * decode linear y[M,N] = x[M,K] w[N,K]^T: the skinny candidates (kernels/linear_skinny.cuh)
 * and how each launches, one shape's buffers, the candidates' checks against cuBLAS and the
 * chained timing.
 *
 * Buffers of a shape: weights uniform in (-sqrt(3/K), sqrt(3/K)) (never zero) in copies
 * totalling >= 4x L2 (at least K3T_MIN_COPIES), L = max(20, copies) chain buffers of 16 x max(N, K) bf16
 * (uniform in (-1, 1)), x0 [16, K] and two output buffers. A timed graph has L calls; call j
 * reads w copy j % copies and, as x, the first M x K elements of chain buffer j - 1, writing
 * its y over the first M x N elements of chain buffer j: each call reads what the previous one
 * wrote, the data dependency of a decode step (the weight scale keeps the values near unit
 * size along the chain).
 *
 * Checks (k3t_check): the candidate's output on x0 and copy 0, poisoned with NaN first, against
 * cuBLAS's (k3t_mismatches), twice, bit-identical (deterministic; split and stream counters
 * reset); for a PDL launch mode also a 4-call chain whose y regions start as NaN, each link
 * against cuBLAS on the x that link was given: a link that read x before its predecessor wrote
 * it read NaN and fails.
 *
 * With the silu_mul epilogue (k3t_shape.epi; w is [N, K] = gate rows | up rows) a call writes
 * h = silu(gate) * up [M, N/2] instead of y: the skinny candidates in the kernel
 * (k3_skinny_problem.epilogue), cuBLAS as k3 serves the call without the skinny kernel, y
 * into a scratch buffer then a separate silu_mul kernel (k3t_silu_mul: the rounding of
 * cuda.silu_mul.generic, launched with PDL as k3 launches it); the checks compare h against
 * that pair's.
 */
#ifndef K3_TOOLS_LINEAR_BENCH_CUH
#define K3_TOOLS_LINEAR_BENCH_CUH

#include "../kernels/linear_skinny.cuh"
#include "bench_common.cuh"

#include <string>

/* A skinny candidate: classic (one CTA per row tile), classic with 16 or 32 rows per warp
 * (rows_per_warp = 16, 32) or split (split-K across kcta CTAs), in a launch mode: plain, PDL, or
 * PDL with static weights (the first step of w before the wait); a classic one may run on the
 * balanced grid (balanced: k3_skinny_problem.grid = k3_skinny_balanced_grid). */
enum k3t_kind { K3T_CLASSIC, K3T_SPLIT, K3T_CLASSIC16, K3T_CLASSIC32 };

/* Rows per warp of a candidate's kind. */
static inline int k3t_rows_per_warp(int kind) {
    return kind == K3T_CLASSIC32 ? 32 : kind == K3T_CLASSIC16 ? 16 : 8;
}
enum k3t_mode { K3T_PLAIN, K3T_PDL, K3T_PDL_STATIC };
static const char *const K3T_MODE_NAME[3] = {"plain", "pdl", "pdl-static"};

struct k3t_cand {
    int kind, threads, rows, unroll;
    int kcta; /* split: CTAs along K */
    int mode; /* k3t_mode */
    int balanced; /* classic kinds: the balanced grid instead of row tiles */
    int l2_prefetch_mb; /* MiB of w prefetched into L2 before the wait (plan l2_prefetch_mb) */
};

static inline std::string k3t_cand_name(const k3t_cand &c) {
    char b[112], pf[24] = "";
    if (c.l2_prefetch_mb > 0) snprintf(pf, sizeof pf, " pf%d", c.l2_prefetch_mb);
    if (c.kind == K3T_SPLIT)
        snprintf(b, sizeof b, "split t%dr%du%dk%d %s%s", c.threads, c.rows, c.unroll, c.kcta,
                 K3T_MODE_NAME[c.mode], pf);
    else
        snprintf(b, sizeof b, "%s%s t%dr%du%d %s%s",
                 c.kind == K3T_CLASSIC32   ? "classic32"
                 : c.kind == K3T_CLASSIC16 ? "classic16"
                                           : "classic",
                 c.balanced ? "b" : "",
                 c.threads, c.rows, c.unroll, K3T_MODE_NAME[c.mode], pf);
    return b;
}

/* The candidate as a plan file's config table (lua/k3/policy/sm<cc>.lua). */
static inline std::string k3t_cand_config(const k3t_cand &c) {
    char b[256], bal[64];
    snprintf(bal, sizeof bal, "%s", c.balanced ? ", balanced = true" : "");
    if (c.l2_prefetch_mb > 0)
        snprintf(bal + strlen(bal), sizeof bal - strlen(bal), ", l2_prefetch_mb = %d",
                 c.l2_prefetch_mb);
    const int rpw = k3t_rows_per_warp(c.kind);
    if (rpw != 8)
        snprintf(b, sizeof b,
                 "{threads = %d, rows = %d, unroll = %d, vec = %d, split_k = %d, rows_per_warp = %d%s}",
                 c.threads, c.rows, c.unroll, K3_SKINNY_VEC, k3_skinny_split_k(c.threads, c.rows, rpw),
                 rpw, bal);
    else
        snprintf(b, sizeof b, "{threads = %d, rows = %d, unroll = %d, vec = %d, split_k = %d%s}",
                 c.threads, c.rows, c.unroll, K3_SKINNY_VEC,
                 k3_skinny_split_k(c.threads, c.rows) * (c.kind == K3T_SPLIT ? c.kcta : 1), bal);
    return b;
}

/* Scratch split-K needs: partials (the size of the backend's context workspace, 32 MiB) and
 * counters, which start (and stay) zero. */
struct k3t_scratch {
    float *split_ws;
    unsigned *split_counters;
    size_t split_ws_bytes;
    int n_counters;
    int sms; /* the device's multiprocessors (the balanced grid) */
};

static inline void k3t_scratch_init(k3t_scratch &s) {
    s.n_counters = 65536;
    s.split_ws_bytes = 32u << 20;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaMalloc(&s.split_ws, s.split_ws_bytes));
    CK(cudaMalloc(&s.split_counters, s.n_counters * sizeof(unsigned)));
    CK(cudaMemset(s.split_counters, 0, s.n_counters * sizeof(unsigned)));
}

/* Whether the candidate can run this problem at all (scratch sizes, tiles). */
static inline bool k3t_cand_fits(const k3t_cand &c, const k3t_scratch &s, int M, int N) {
    if (c.kind == K3T_SPLIT)
        return k3_skinny_split_ws_bytes(c.rows, c.kcta, M, N) <= s.split_ws_bytes &&
               k3_skinny_split_tiles(c.rows, N) <= s.n_counters;
    return true;
}

/* Enqueues one call of the candidate: y[M,N] (row stride N) = x[M,K] w[N,K]^T. */
static inline cudaError_t k3t_launch(const k3t_cand &c, const k3t_scratch &s, const uint16_t *x,
                                     const uint16_t *w, uint16_t *y, int M, int N, int K,
                                     cudaStream_t stream, bool epi = false) {
    k3_skinny_problem q = {};
    q.x = x;
    q.w = w;
    q.y = y;
    /* the epilogue writes h [M, N/2] from w's N = 2 * (N/2) rows */
    q.y_s0 = epi ? N / 2 : N;
    q.y_s1 = 1;
    q.M = M;
    q.N = epi ? N / 2 : N;
    q.K = K;
    q.epilogue = epi ? 1 : 0;
    q.pdl = c.mode != K3T_PLAIN;
    q.static_w = c.mode == K3T_PDL_STATIC;
    q.grid = c.balanced && c.kind != K3T_SPLIT ? k3_skinny_balanced_grid(q.N, c.rows, s.sms) : 0;
    /* the budget over w's N rows (2 x h's columns with the epilogue) and K-slices */
    q.l2_prefetch = k3_skinny_l2_prefetch_row(c.l2_prefetch_mb, N, 2 * (int64_t)K,
                                              c.kind == K3T_SPLIT ? c.kcta : 1);
    if (c.kind == K3T_SPLIT)
        return k3_skinny_launch_split(c.threads, c.rows, c.unroll, c.kcta, q, s.split_ws,
                                      s.split_counters, stream);
    return k3_skinny_launch(c.threads, c.rows, c.unroll, q, stream, k3t_rows_per_warp(c.kind));
}

/* One shape's buffers (see the file comment). */
struct k3t_shape {
    int N, K, copies, L;
    bool epi; /* the silu_mul epilogue: a call's output is h [M, No] */
    int No;   /* columns of a call's output: N, or N / 2 with the epilogue */
    size_t wn, bn;
    uint16_t *w, *chain, *x0, *y, *yref, *yfull; /* yfull: cuBLAS's y [16, N] before silu_mul */
    uint16_t *wcopy(int j) const { return w + (size_t)(j % copies) * wn; }
    uint16_t *cbuf(int j) const { return chain + (size_t)(((j % L) + L) % L) * bn; }
};

static inline void k3t_shape_alloc(k3t_shape &b, int N, int K, size_t l2, cudaStream_t s,
                                   bool epi = false) {
    b.N = N;
    b.K = K;
    b.epi = epi;
    b.No = epi ? N / 2 : N;
    b.wn = (size_t)N * K;
    const size_t wbytes = b.wn * 2;
    b.copies = (int)std::max<size_t>(K3T_MIN_COPIES, (4 * l2 + wbytes - 1) / wbytes + 1);
    b.L = std::max(20, b.copies);
    b.bn = (size_t)K3_SKINNY_MAX_M * std::max(N, K);
    CK(cudaMalloc(&b.w, wbytes * b.copies));
    CK(cudaMalloc(&b.chain, b.bn * 2 * b.L));
    CK(cudaMalloc(&b.x0, (size_t)K3_SKINNY_MAX_M * K * 2));
    CK(cudaMalloc(&b.y, b.bn * 2));
    CK(cudaMalloc(&b.yref, b.bn * 2));
    CK(cudaMalloc(&b.yfull, b.bn * 2));
    k3t_fill(b.w, b.wn * b.copies, 1000 + N * 7 + K, std::sqrt(3.0f / K), s);
    k3t_fill(b.chain, b.bn * b.L, 77 + N, 1.0f, s);
    k3t_fill(b.x0, (size_t)K3_SKINNY_MAX_M * K, 7 + K, 1.0f, s);
    CK(cudaStreamSynchronize(s));
}

static inline void k3t_shape_free(k3t_shape &b) {
    CK(cudaFree(b.w));
    CK(cudaFree(b.chain));
    CK(cudaFree(b.x0));
    CK(cudaFree(b.y));
    CK(cudaFree(b.yref));
    CK(cudaFree(b.yfull));
}

/* h[m, n] = silu(y[m, n]) * y[m, n + No] rounded to bf16, y [M, 2 No] and h [M, No] densely
 * packed: cuda.silu_mul.generic's arithmetic (k3sk_silu_mul1, fp32, one rounding), launched
 * with PDL as k3 launches its kernels (the wait before y is read). */
static __global__ void k3t_silu_mul_kernel(const uint16_t *__restrict__ y, uint16_t *__restrict__ h,
                                           int M, int No) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const int64_t n = (int64_t)M * No;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / No, c = i % No;
        h[i] = k3sk_silu_mul1(k3sk_bf16_to_f32(y[m * 2 * No + c]),
                              k3sk_bf16_to_f32(y[m * 2 * No + No + c]));
    }
}
static inline cudaError_t k3t_silu_mul(const uint16_t *y, uint16_t *h, int M, int No,
                                       cudaStream_t stream) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    const int64_t n = (int64_t)M * No;
    lc.gridDim = dim3((unsigned)std::min<int64_t>((n + 255) / 256, 1024));
    lc.blockDim = dim3(256);
    lc.stream = stream;
    lc.attrs = attr;
    lc.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&lc, k3t_silu_mul_kernel, y, h, M, No);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* What k3 runs for the call without the skinny kernel: cuBLAS's y[M, N] = x w^T, then (with
 * the epilogue) silu_mul from the scratch y into out. */
static inline bool k3t_cublas_call(cublasHandle_t h, const k3t_shape &b, const uint16_t *x,
                                   const uint16_t *w, uint16_t *out, int M, cudaStream_t s) {
    if (!b.epi) return k3t_cublas_linear(h, x, w, out, M, b.N, b.K);
    return k3t_cublas_linear(h, x, w, b.yfull, M, b.N, b.K) &&
           k3t_silu_mul(b.yfull, out, M, b.No, s) == cudaSuccess;
}

/* cuBLAS's y for x0 and copy 0 at this M, on the host (the reference of k3t_check). */
static inline void k3t_reference(cublasHandle_t h, const k3t_shape &b, int M, cudaStream_t s,
                                 std::vector<uint16_t> &href) {
    const size_t ny = (size_t)M * b.No;
    href.resize(ny);
    CK(cudaMemsetAsync(b.yref, 0xff, ny * 2, s));
    if (!k3t_cublas_call(h, b, b.x0, b.w, b.yref, M, s)) {
        fprintf(stderr, "\n%s: cuBLAS failed on %dx%d M=%d\n", K3_TOOL_NAME, b.N, b.K, M);
        exit(1);
    }
    CK(cudaMemcpyAsync(href.data(), b.yref, ny * 2, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
}

/* Checks a launch (see the file comment); "ok", or what failed (also reported on stderr).
 * launch(x, w, y) enqueues one call; pdl: the chain check runs too. A crash exits. */
template <class F>
static const char *k3t_check(cublasHandle_t h, const k3t_shape &b, int M, cudaStream_t s,
                             const std::vector<uint16_t> &href, const std::string &name, bool pdl,
                             F launch) {
    const size_t ny = (size_t)M * b.No;
    std::vector<uint16_t> hy(ny), hprev(ny), r(ny);
    for (int pass = 0; pass < 2; pass++) {
        CK(cudaMemsetAsync(b.y, 0xff, ny * 2, s));
        if (launch(b.x0, b.w, b.y) != cudaSuccess) {
            (void)cudaGetLastError();
            return "launch-failed";
        }
        const cudaError_t se = cudaStreamSynchronize(s);
        if (se != cudaSuccess) {
            fprintf(stderr, "\n%s: %s crashed on %dx%d M=%d: %s\n", K3_TOOL_NAME, name.c_str(),
                    b.N, b.K, M, cudaGetErrorString(se));
            exit(1);
        }
        if (pass) hprev = hy;
        CK(cudaMemcpy(hy.data(), b.y, ny * 2, cudaMemcpyDeviceToHost));
        size_t first = 0;
        const size_t bad = k3t_mismatches(hy, href, ny, &first, b.epi ? 0.03 : 0.01);
        if (bad) {
            fprintf(stderr,
                    "\n%s: WRONG %s on %dx%d M=%d (call %d): %zu of %zu differ from cuBLAS "
                    "(first [%zu, %zu]: %g vs %g)\n",
                    K3_TOOL_NAME, name.c_str(), b.N, b.K, M, pass + 1, bad, ny, first / b.No,
                    first % b.No, k3t_bf16_to_f32(hy[first]), k3t_bf16_to_f32(href[first]));
            return "wrong";
        }
        if (pass && memcmp(hprev.data(), hy.data(), ny * 2)) {
            fprintf(stderr, "\n%s: %s on %dx%d M=%d: two calls differ\n", K3_TOOL_NAME,
                    name.c_str(), b.N, b.K, M);
            return "not-deterministic";
        }
    }
    if (!pdl) return "ok";
    uint16_t *links[5] = {b.x0, b.cbuf(0), b.cbuf(1), b.cbuf(2), b.cbuf(3)};
    for (int k = 1; k <= 4; k++) {
        k3t_fill(links[k], b.bn, 900 + k, 1.0f, s);
        CK(cudaMemsetAsync(links[k], 0xff, ny * 2, s));
    }
    const char *status = "ok";
    for (int k = 0; k < 4; k++)
        if (launch(links[k], b.wcopy(k + 1), links[k + 1]) != cudaSuccess) status = "launch-failed";
    CK(cudaStreamSynchronize(s));
    for (int k = 0; k < 4 && !strcmp(status, "ok"); k++) {
        CK(cudaMemsetAsync(b.yref, 0xff, ny * 2, s));
        if (!k3t_cublas_call(h, b, links[k], b.wcopy(k + 1), b.yref, M, s)) {
            status = "cublas-failed";
            break;
        }
        CK(cudaMemcpyAsync(r.data(), b.yref, ny * 2, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(hy.data(), links[k + 1], ny * 2, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        size_t first = 0;
        const size_t bad = k3t_mismatches(hy, r, ny, &first, b.epi ? 0.03 : 0.01);
        if (bad) {
            fprintf(stderr,
                    "\n%s: WRONG in a chain: %s on %dx%d M=%d, link %d: %zu of %zu differ "
                    "(first %g vs %g)\n",
                    K3_TOOL_NAME, name.c_str(), b.N, b.K, M, k + 1, bad, ny,
                    k3t_bf16_to_f32(hy[first]), k3t_bf16_to_f32(r[first]));
            status = "wrong-in-chain";
        }
    }
    k3t_fill(b.chain, b.bn * b.L, 77 + b.N, 1.0f, s); /* the timing chain starts afresh */
    CK(cudaStreamSynchronize(s));
    return status;
}

/* Median µs per call of the shape's chained graph of L calls of launch(x, w, y); -1 when a
 * launch or the capture fails. */
template <class F>
static double k3t_time_chain(k3t_timer &t, const k3t_shape &b, F launch) {
    return k3t_time_calls(t, b.L, [&](int j) {
        return launch(b.cbuf(j - 1), b.wcopy(j), b.cbuf(j)) == cudaSuccess;
    });
}

#endif /* K3_TOOLS_LINEAR_BENCH_CUH */
