/*
 * bench_common.cuh — what the standalone GPU measurement tools (tools/autotune.cu,
 * tools/linear_sweep.cu) share: fail-loud CUDA/cuBLAS checks, random non-zero bf16 data,
 * and the timing of a CUDA graph of back-to-back calls.
 *
 * Timing method (notes/PERF.md, bench/README.md): L launches captured in one graph,
 * replayed `warm` times, then `reps` timed replays (CUDA events around each); the median
 * replay divided by L is the time per call, in µs. Callers rotate their inputs over enough
 * copies that the L2 cannot serve a repeated call.
 */
#ifndef K3_TOOLS_BENCH_COMMON_CUH
#define K3_TOOLS_BENCH_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef K3_TOOL_NAME
#define K3_TOOL_NAME "k3 tool"
#endif

#define CK(call)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "\n%s: %s failed: %s (%s:%d)\n", K3_TOOL_NAME, #call,          \
                    cudaGetErrorString(e_), __FILE__, __LINE__);                           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#define CKB(call)                                                                          \
    do {                                                                                   \
        cublasStatus_t s_ = (call);                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            fprintf(stderr, "\n%s: %s failed: cuBLAS status %d (%s:%d)\n", K3_TOOL_NAME,   \
                    #call, (int)s_, __FILE__, __LINE__);                                   \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static inline float k3t_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Uniform in (-scale, scale), never 0: scale * (2k + 1 - 2^24) / 2^24 with k a 24-bit hash of
 * (i, seed), rounded to bf16 (round to nearest even). */
__global__ void k3t_fill_random(uint16_t *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = i + seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float v = scale * (float)(2.0 * (double)(z >> 40) + 1.0 - 16777216.0) / 16777216.0f;
        uint32_t u = __float_as_uint(v);
        u += 0x7fffu + ((u >> 16) & 1u);
        p[i] = (uint16_t)(u >> 16);
    }
}

static inline void k3t_fill(uint16_t *p, size_t n, uint64_t seed, float scale, cudaStream_t s) {
    k3t_fill_random<<<4096, 256, 0, s>>>(p, n, seed, scale);
    CK(cudaGetLastError());
}

/* Rotated inputs come in at least this many copies: chained with PDL, several calls are in
 * flight at once, and no two of them may read the same copy (the second would hit L2). */
#define K3T_MIN_COPIES 8

struct k3t_timer {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    int reps, warm;
};

static inline void k3t_timer_init(k3t_timer &t, int reps, int warm) {
    CK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&t.e0));
    CK(cudaEventCreate(&t.e1));
    t.reps = reps;
    t.warm = warm;
}

/* Median µs per call of L launches captured in one graph (launch(j) enqueues call j and
 * returns false on failure); -1 when a launch or the capture fails. */
template <class F> static double k3t_time_calls(k3t_timer &t, int L, F launch) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    CK(cudaStreamBeginCapture(t.s, cudaStreamCaptureModeThreadLocal));
    bool ok = true;
    for (int j = 0; j < L && ok; j++) ok = launch(j);
    cudaError_t ce = cudaStreamEndCapture(t.s, &g);
    if (!ok || ce != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return -1;
    }
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return -1;
    }
    for (int r = 0; r < t.warm; r++) CK(cudaGraphLaunch(ge, t.s));
    CK(cudaStreamSynchronize(t.s));
    std::vector<float> ms(t.reps);
    for (int r = 0; r < t.reps; r++) {
        CK(cudaEventRecord(t.e0, t.s));
        CK(cudaGraphLaunch(ge, t.s));
        CK(cudaEventRecord(t.e1, t.s));
        CK(cudaEventSynchronize(t.e1));
        CK(cudaEventElapsedTime(&ms[r], t.e0, t.e1));
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    std::sort(ms.begin(), ms.end());
    return ms[t.reps / 2] * 1000.0 / L;
}

/* Device-to-device copy bandwidth of this card (bytes read + written, TB/s): a 1 GiB copy,
 * median of 5 after 2 warm-up. */
static inline double k3t_copy_tbs(k3t_timer &t) {
    const size_t bytes = (size_t)1 << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, t.s));
    std::vector<float> v;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(t.e0, t.s));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, t.s));
        CK(cudaEventRecord(t.e1, t.s));
        CK(cudaEventSynchronize(t.e1));
        float msv;
        CK(cudaEventElapsedTime(&msv, t.e0, t.e1));
        if (r >= 2) v.push_back(msv);
    }
    std::sort(v.begin(), v.end());
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * bytes / (v[v.size() / 2] * 1e-3) / 1e12;
}

/* cuBLAS as cuda.linear.cublas sets it up: fp32 accumulation, no reduced-precision
 * reductions, a 32 MiB user workspace (which also keeps it from allocating during capture). */
static inline cublasHandle_t k3t_cublas(cudaStream_t s, int *version) {
    cublasHandle_t h;
    CKB(cublasCreate(&h));
    CKB(cublasGetVersion(h, version));
    CKB(cublasSetStream(h, s));
    CKB(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                            CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    const size_t ws_bytes = 32u << 20;
    void *ws = nullptr;
    CK(cudaMalloc(&ws, ws_bytes));
    CKB(cublasSetWorkspace(h, ws, ws_bytes));
    return h;
}

/* y[M,N] = x[M,K] w[N,K]^T, bf16 in and out, fp32 compute (row-major x, w, y). */
static inline bool k3t_cublas_linear(cublasHandle_t h, const uint16_t *x, const uint16_t *w,
                                     uint16_t *y, int M, int N, int K) {
    const float alpha = 1.f, beta = 0.f;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w, CUDA_R_16BF, K, x,
                        CUDA_R_16BF, K, &beta, y, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
}

/* Elements of got that differ from ref by more than rel of |ref| + 0.2% of ref's RMS (rel 1%:
 * bf16 outputs of two fp32-accumulated sums in different orders; 3% for silu(g) * u of two
 * such bf16 sums, where each factor may be an ulp (0.8%) off and the product is rounded
 * again); *first = the first one. A NaN (an unwritten, poisoned element) always differs. */
static inline size_t k3t_mismatches(const std::vector<uint16_t> &got,
                                    const std::vector<uint16_t> &ref, size_t n, size_t *first,
                                    double rel = 0.01) {
    double rms = 0;
    for (size_t i = 0; i < n; i++) {
        const double v = k3t_bf16_to_f32(ref[i]);
        rms += v * v;
    }
    rms = n ? std::sqrt(rms / n) : 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float a = k3t_bf16_to_f32(got[i]), b = k3t_bf16_to_f32(ref[i]);
        if (!(std::fabs(a - b) <= rel * std::fabs(b) + 0.002 * rms)) {
            if (!bad && first) *first = i;
            bad++;
        }
    }
    return bad;
}

#endif /* K3_TOOLS_BENCH_COMMON_CUH */
