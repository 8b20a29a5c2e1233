/*
 * autotune.cu — measures cuda.linear.skinny against cuBLAS on the current GPU and writes the
 * architecture's plan file (lua/k3/policy/sm<cc>.lua): for each weight shape (N, K) and
 * M = 1..16, the fastest instantiated skinny configuration, kept only where it beats cuBLAS
 * by the margin (5% by default). Standalone: it links cuBLAS and the kernel templates of
 * kernels/linear_skinny.cuh, not libk3. Built and run by scripts/autotune.
 *
 * Method: random non-zero bf16 data; weights rotated over enough copies that their bytes
 * exceed 4x the L2; each measurement is a CUDA graph of L back-to-back calls (one per copy)
 * replayed after warm-up, timed with events, median over the replays divided by L. Every
 * candidate's output (poisoned with NaN first) is checked against cuBLAS before it is timed.
 */
#include "../kernels/linear_skinny.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <unistd.h>

#define CK(call)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "\nautotune: %s failed: %s (%s:%d)\n", #call,                  \
                    cudaGetErrorString(e_), __FILE__, __LINE__);                           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#define CKB(call)                                                                          \
    do {                                                                                   \
        cublasStatus_t s_ = (call);                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            fprintf(stderr, "\nautotune: %s failed: cuBLAS status %d (%s:%d)\n", #call,    \
                    (int)s_, __FILE__, __LINE__);                                          \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static const double FLOOR_BW = 4.17e12; /* bytes/s, PEERS.md's measured D2D copy bandwidth */

struct Shape {
    int N, K;
};
/* DESIGN.md's Kimi-K3 TP8 local projection shapes. */
static const Shape KIMI[] = {{1536, 7168}, {3072, 7168},  {2112, 7168},  {2304, 1536},
                             {4608, 1536}, {3584, 7168},  {6288, 7168},  {12448, 7168},
                             {7168, 768},  {7168, 1536},  {7168, 3072},  {7168, 3584},
                             {7168, 4224}, {7168, 8448},  {8448, 7168},  {16896, 7168},
                             {7168, 14336}, {20480, 7168}};

/* kcta = CTAs along K: 1 = the classic kernel, >= 2 = split-K across CTAs (the plan's
 * split_k is then k3_skinny_split_k(threads, rows) * kcta). */
struct Config {
    int threads, rows, unroll, kcta;
};
static std::vector<Config> all_configs() {
    std::vector<Config> v;
#define K3_AT_ADD(T, R, U) v.push_back(Config{T, R, U, 1});
    K3_SKINNY_CONFIGS(K3_AT_ADD)
#undef K3_AT_ADD
    return v;
}
static std::vector<Config> split_templates() {
    std::vector<Config> v;
#define K3_AT_ADD(T, R, U) v.push_back(Config{T, R, U, 0});
    K3_SKINNY_SPLIT_CONFIGS(K3_AT_ADD)
#undef K3_AT_ADD
    return v;
}
/* The split-K candidates for one shape: for each split template, the smallest kcta >= 2
 * whose grid reaches 2x the SM count and the smallest larger one reaching 4x (so every SM
 * gets several CTAs and the block scheduler balances them), each CTA keeping at least
 * half a step (warps x unroll chunks of 32 k) of work. Shapes whose classic grid already
 * has >= 8 CTAs per SM get none (nothing to balance; keeps the run short). */
static std::vector<Config> split_configs(const Shape &s, int sms) {
    std::vector<Config> v;
    const int nchunk = (s.K / 8 + 3) / 4;
    for (Config c : split_templates()) {
        const long tiles = (s.N + c.rows - 1) / c.rows;
        const int kw = k3_skinny_split_k(c.threads, c.rows);
        if (tiles >= 8L * sms) continue;
        int picked = 0, last = 1;
        for (int target : {2, 4}) {
            for (int k = last + 1; k <= K3_SKINNY_MAX_KCTA; k++) {
                if (2L * nchunk < (long)k * kw * c.unroll) break; /* < half a step each */
                if (tiles * k >= (long)target * sms) {
                    Config d = c;
                    d.kcta = k;
                    v.push_back(d);
                    last = k;
                    picked++;
                    break;
                }
            }
        }
        (void)picked;
    }
    return v;
}

struct Result {
    Shape s;
    int M;
    double cublas_us, best_us;
    Config best;
    bool have_best, kept;
    int failed;
};

static float host_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Uniform in (-1, 1), never 0: (2k + 1 - 2^24) / 2^24 with k a 24-bit hash. */
__global__ void fill_random(uint16_t *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = i + seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float v = (float)(2.0 * (double)(z >> 40) + 1.0 - 16777216.0) / 16777216.0f;
        p[i] = k3sk_f32_to_bf16(v);
    }
}

struct Timer {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    int reps, warm;
};

/* Median µs per call of L launches captured in one graph; -1 when a launch fails. */
template <class F> static double time_calls(Timer &t, int L, F launch) {
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
    CK(cudaGraphInstantiate(&ge, g, 0));
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

static std::vector<Shape> parse_shapes(const char *s) {
    std::vector<Shape> v;
    while (*s) {
        int n, k, used = 0;
        if (sscanf(s, "%dx%d%n", &n, &k, &used) != 2 || n < 1 || k < 8 || k % 8) {
            fprintf(stderr, "autotune: bad shape list near '%s' (want NxK,NxK,... with K %% 8 == 0)\n", s);
            exit(2);
        }
        v.push_back(Shape{n, k});
        s += used;
        if (*s == ',') s++;
    }
    return v;
}

static std::vector<int> parse_ms(const char *s) {
    std::vector<int> v;
    while (*s) {
        int a, b, used = 0;
        if (sscanf(s, "%d-%d%n", &a, &b, &used) == 2) {
        } else if (sscanf(s, "%d%n", &a, &used) == 1) {
            b = a;
        } else {
            fprintf(stderr, "autotune: bad M list near '%s'\n", s);
            exit(2);
        }
        if (a < 1 || b > K3_SKINNY_MAX_M || a > b) {
            fprintf(stderr, "autotune: M must be in 1..%d\n", K3_SKINNY_MAX_M);
            exit(2);
        }
        for (int m = a; m <= b; m++) v.push_back(m);
        s += used;
        if (*s == ',') s++;
    }
    return v;
}

static void usage(void) {
    fprintf(stderr,
            "usage: autotune [--shapes NxK,...] [--m 1-16] [--out FILE.lua] [--table FILE]\n"
            "                [--csv FILE] [--device N] [--reps R] [--min-speedup 1.05]\n"
            "                [--all-m] [--dry-run]\n"
            "Defaults: the Kimi-K3 TP8 shapes of DESIGN.md, M = 1..16, --out\n"
            "lua/k3/policy/sm<cc>.lua, --table build/autotune.txt, --csv build/autotune.csv.\n");
}

int main(int argc, char **argv) {
    std::vector<Shape> shapes(KIMI, KIMI + sizeof KIMI / sizeof KIMI[0]);
    std::vector<int> ms = parse_ms("1-16");
    std::string out_path, table_path = "build/autotune.txt", csv_path = "build/autotune.csv";
    int device = 0, reps = 15;
    double min_speedup = 1.05;
    bool all_m = false, dry = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&](void) -> const char * {
            if (i + 1 >= argc) {
                usage();
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--shapes") shapes = parse_shapes(val());
        else if (a == "--m") ms = parse_ms(val());
        else if (a == "--out") out_path = val();
        else if (a == "--table") table_path = val();
        else if (a == "--csv") csv_path = val();
        else if (a == "--device") device = atoi(val());
        else if (a == "--reps") reps = std::max(3, atoi(val()));
        else if (a == "--min-speedup") min_speedup = atof(val());
        else if (a == "--all-m") all_m = true;
        else if (a == "--dry-run") dry = true;
        else {
            usage();
            return 2;
        }
    }

    CK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    char arch[16];
    snprintf(arch, sizeof arch, "sm%d%d", prop.major, prop.minor);
    if (out_path.empty()) out_path = std::string("lua/k3/policy/") + arch + ".lua";
    int rt = 0, drv = 0, blas_ver = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));

    Timer t;
    CK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&t.e0));
    CK(cudaEventCreate(&t.e1));
    t.reps = reps;
    t.warm = 3;

    /* cuBLAS as cuda.linear.cublas sets it up: fp32 accumulation, no reduced-precision
     * reductions, a user workspace (which also keeps it from allocating during capture). */
    cublasHandle_t h;
    CKB(cublasCreate(&h));
    CKB(cublasGetVersion(h, &blas_ver));
    CKB(cublasSetStream(h, t.s));
    CKB(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                            CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    const size_t ws_bytes = 32u << 20;
    void *ws = nullptr;
    CK(cudaMalloc(&ws, ws_bytes));
    CKB(cublasSetWorkspace(h, ws, ws_bytes));

    /* The copy bandwidth of this card (bytes read + written), for the record. */
    double copy_tbs = 0;
    {
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
        copy_tbs = 2.0 * bytes / (v[v.size() / 2] * 1e-3) / 1e12;
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    char machine[512];
    snprintf(machine, sizeof machine,
             "%s, %d SMs, %.0f MB L2, CUDA runtime %d, driver %d, cuBLAS %d, copy %.2f TB/s",
             prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, rt, drv, blas_ver,
             copy_tbs);
    fprintf(stderr, "autotune: %s\n", machine);
    size_t nsplit = 0;
    for (const Shape &s : shapes) nsplit += split_configs(s, prop.multiProcessorCount).size();
    fprintf(stderr,
            "autotune: %zu shapes x %zu M values x (%zu classic configs + %zu split-K ones over "
            "all shapes)\n",
            shapes.size(), ms.size(), all_configs().size(), nsplit);

    /* Split-K across CTAs: fp32 partials in a workspace the size of the backend's context
     * workspace (kernels/backend.cu, 32 MiB) and zeroed arrival counters, as the kernel
     * record uses them; candidates that need more workspace are skipped, as supports()
     * declines them. */
    const size_t split_ws_bytes = 32u << 20;
    const int n_counters = 65536;
    float *split_ws = nullptr;
    unsigned *counters = nullptr;
    CK(cudaMalloc(&split_ws, split_ws_bytes));
    CK(cudaMalloc(&counters, n_counters * sizeof(unsigned)));
    CK(cudaMemset(counters, 0, n_counters * sizeof(unsigned)));
    std::vector<unsigned> hcounters(n_counters);
    std::vector<Result> results;
    FILE *csv = fopen(csv_path.c_str(), "w");
    if (csv) fprintf(csv, "N,K,M,kernel,threads,rows,unroll,kcta,us,status\n");
    const size_t l2 = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : (size_t)60 << 20;
    const int total = (int)(shapes.size() * ms.size());
    int done = 0;
    time_t t_start = time(nullptr);
    const bool tty = isatty(2) != 0;

    for (const Shape &s : shapes) {
        const size_t wn = (size_t)s.N * s.K, wbytes = wn * 2;
        const int copies = (int)std::max<size_t>(2, (4 * l2 + wbytes - 1) / wbytes + 1);
        const int L = std::max(20, copies);
        uint16_t *w = nullptr, *x = nullptr, *y = nullptr, *yref = nullptr;
        CK(cudaMalloc(&w, wbytes * copies));
        CK(cudaMalloc(&x, (size_t)K3_SKINNY_MAX_M * s.K * 2));
        CK(cudaMalloc(&y, (size_t)K3_SKINNY_MAX_M * s.N * 2));
        CK(cudaMalloc(&yref, (size_t)K3_SKINNY_MAX_M * s.N * 2));
        fill_random<<<4096, 256, 0, t.s>>>(w, wn * copies, 1000 + s.N * 7 + s.K);
        CK(cudaGetLastError());
        fill_random<<<256, 256, 0, t.s>>>(x, (size_t)K3_SKINNY_MAX_M * s.K, 7 + s.K);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(t.s));
        std::vector<uint16_t> href((size_t)K3_SKINNY_MAX_M * s.N), hy(href.size());
        std::vector<Config> cfgs = all_configs();
        for (const Config &c : split_configs(s, prop.multiProcessorCount)) cfgs.push_back(c);

        for (int M : ms) {
            const float alpha = 1.f, beta = 0.f;
            auto cublas_call = [&](int copy, uint16_t *out) {
                return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, M, s.K, &alpha,
                                    w + (size_t)copy * wn, CUDA_R_16BF, s.K, x, CUDA_R_16BF, s.K,
                                    &beta, out, CUDA_R_16BF, s.N, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
            };
            /* Reference: cuBLAS on copy 0. */
            CK(cudaMemsetAsync(yref, 0xff, (size_t)M * s.N * 2, t.s));
            if (!cublas_call(0, yref)) {
                fprintf(stderr, "\nautotune: cublasGemmEx failed for %dx%d M=%d\n", s.N, s.K, M);
                return 1;
            }
            CK(cudaMemcpyAsync(href.data(), yref, (size_t)M * s.N * 2, cudaMemcpyDeviceToHost, t.s));
            CK(cudaStreamSynchronize(t.s));
            double rms = 0;
            for (size_t i = 0; i < (size_t)M * s.N; i++) {
                float v = host_bf16_to_f32(href[i]);
                rms += (double)v * v;
            }
            rms = std::sqrt(rms / ((double)M * s.N));

            Result r;
            r.s = s;
            r.M = M;
            r.have_best = false;
            r.kept = false;
            r.failed = 0;
            r.best_us = 0;
            r.cublas_us = time_calls(t, L, [&](int j) { return cublas_call(j % copies, y); });
            if (r.cublas_us < 0) {
                fprintf(stderr, "\nautotune: cuBLAS could not be captured for %dx%d M=%d\n", s.N,
                        s.K, M);
                return 1;
            }
            if (csv) fprintf(csv, "%d,%d,%d,cublas,0,0,0,0,%.3f,ok\n", s.N, s.K, M, r.cublas_us);

            for (const Config &c : cfgs) {
                if (c.kcta > 1 &&
                    (k3_skinny_split_ws_bytes(c.rows, c.kcta, M, s.N) > split_ws_bytes ||
                     k3_skinny_split_tiles(c.rows, s.N) > n_counters))
                    continue;
                auto launch = [&](const k3_skinny_problem &q) {
                    return c.kcta > 1 ? k3_skinny_launch_split(c.threads, c.rows, c.unroll,
                                                               c.kcta, q, split_ws, counters, t.s)
                                      : k3_skinny_launch(c.threads, c.rows, c.unroll, q, t.s);
                };
                k3_skinny_problem p = {};
                k3_skinny_knobs(&p.pdl, &p.prefetch_bytes);
                p.x = x;
                p.res = nullptr;
                p.res_s0 = p.res_s1 = 0;
                p.y = y;
                p.y_s0 = s.N;
                p.y_s1 = 1;
                p.M = M;
                p.N = s.N;
                p.K = s.K;
                /* Correctness first, on copy 0, into a NaN-poisoned output. */
                p.w = w;
                const char *status = "ok";
                /* Split candidates run twice in a row (the second relies on the first having
                 * reset its counters) and both results must be right and bit-identical. */
                const int passes = c.kcta > 1 ? 2 : 1;
                for (int pass = 0; pass < passes && !strcmp(status, "ok"); pass++) {
                    CK(cudaMemsetAsync(y, 0xff, (size_t)M * s.N * 2, t.s));
                    cudaError_t le = launch(p);
                    if (le != cudaSuccess) {
                        status = "launch-failed";
                        break;
                    }
                    cudaError_t se = cudaStreamSynchronize(t.s);
                    if (se != cudaSuccess) {
                        fprintf(stderr,
                                "\nautotune: config threads=%d rows=%d unroll=%d kcta=%d crashed "
                                "on %dx%d M=%d: %s\n",
                                c.threads, c.rows, c.unroll, c.kcta, s.N, s.K, M,
                                cudaGetErrorString(se));
                        return 1;
                    }
                    std::vector<uint16_t> prev;
                    if (pass) prev = hy;
                    CK(cudaMemcpy(hy.data(), y, (size_t)M * s.N * 2, cudaMemcpyDeviceToHost));
                    size_t bad = 0, first = 0;
                    for (size_t i = 0; i < (size_t)M * s.N; i++) {
                        float a = host_bf16_to_f32(hy[i]), b = host_bf16_to_f32(href[i]);
                        if (!(std::fabs(a - b) <= 0.01 * std::fabs(b) + 0.002 * rms)) {
                            if (!bad) first = i;
                            bad++;
                        }
                    }
                    if (bad) {
                        status = "wrong";
                        fprintf(stderr,
                                "\nautotune: WRONG result: threads=%d rows=%d unroll=%d kcta=%d "
                                "on %dx%d M=%d (pass %d): %zu elements differ from cuBLAS (first "
                                "[%zu, %zu]: %g vs %g)\n",
                                c.threads, c.rows, c.unroll, c.kcta, s.N, s.K, M, pass + 1, bad,
                                first / s.N, first % s.N, host_bf16_to_f32(hy[first]),
                                host_bf16_to_f32(href[first]));
                    } else if (pass &&
                               memcmp(prev.data(), hy.data(), (size_t)M * s.N * 2) != 0) {
                        status = "not-deterministic";
                        fprintf(stderr,
                                "\nautotune: threads=%d rows=%d unroll=%d kcta=%d on %dx%d M=%d: "
                                "a second launch differs from the first\n",
                                c.threads, c.rows, c.unroll, c.kcta, s.N, s.K, M);
                    }
                }
                if (c.kcta > 1 && !strcmp(status, "ok")) {
                    /* the counters must be back to zero */
                    const size_t nt = (size_t)k3_skinny_split_tiles(c.rows, s.N);
                    CK(cudaMemcpy(hcounters.data(), counters, nt * sizeof(unsigned),
                                  cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < nt; i++)
                        if (hcounters[i]) {
                            status = "counters-not-reset";
                            fprintf(stderr,
                                    "\nautotune: threads=%d rows=%d unroll=%d kcta=%d on %dx%d "
                                    "M=%d: counter %zu is %u after the launch\n",
                                    c.threads, c.rows, c.unroll, c.kcta, s.N, s.K, M, i,
                                    hcounters[i]);
                            return 1; /* every later split measurement would be wrong */
                        }
                }
                double us = -1;
                if (!strcmp(status, "ok")) {
                    us = time_calls(t, L, [&](int j) {
                        k3_skinny_problem q = p;
                        q.w = w + (size_t)(j % copies) * wn;
                        return launch(q) == cudaSuccess;
                    });
                    if (us < 0) status = "capture-failed";
                }
                if (strcmp(status, "ok")) r.failed++;
                if (csv)
                    fprintf(csv, "%d,%d,%d,skinny,%d,%d,%d,%d,%.3f,%s\n", s.N, s.K, M, c.threads,
                            c.rows, c.unroll, c.kcta, us, status);
                if (us > 0 && (!r.have_best || us < r.best_us)) {
                    r.have_best = true;
                    r.best_us = us;
                    r.best = c;
                }
            }
            r.kept = r.have_best && r.cublas_us >= min_speedup * r.best_us;
            results.push_back(r);
            done++;
            /* Progress: a live line on a terminal; in a log, one plain line per (shape, M). */
            fprintf(stderr,
                    "%s[%3d/%3d %4lds] %5dx%-5d M=%-2d skinny %7.2f us  cuBLAS %7.2f us  %5.2fx%s%s",
                    tty ? "\r" : "", done, total, (long)(time(nullptr) - t_start), s.N, s.K, M,
                    r.best_us, r.cublas_us, r.have_best ? r.cublas_us / r.best_us : 0.0,
                    r.kept ? " kept" : "", tty ? "   " : "\n");
            fflush(stderr);
        }
        CK(cudaFree(w));
        CK(cudaFree(x));
        CK(cudaFree(y));
        CK(cudaFree(yref));
    }
    if (tty) fprintf(stderr, "\n");
    if (csv) fclose(csv);

    char date[64];
    time_t now = time(nullptr);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    char method[640];
    int knob_pdl;
    int64_t knob_pref;
    k3_skinny_knobs(&knob_pdl, &knob_pref);
    snprintf(method, sizeof method,
             "scripts/autotune: CUDA graph of >= 20 back-to-back calls, weights rotated over "
             "copies totalling >= 4x L2, median of %d replays after %d warm-up, random "
             "non-zero bf16 data, every candidate checked against cuBLAS (cublasGemmEx bf16, "
             "fp32 compute) before timing; kept where cuBLAS/skinny >= %.2f; skinny launch: "
             "PDL %s, L2 prefetch %.0f MB (K3_SKINNY_PDL, K3_SKINNY_PREFETCH_MB)",
             t.reps, t.warm, min_speedup, knob_pdl ? "on" : "off", knob_pref / 1048576.0);

    /* The plan file. */
    int failures = 0;
    for (const Result &r : results) failures += r.failed;
    if (!dry) {
        std::string tmp = out_path + ".tmp";
        FILE *f = fopen(tmp.c_str(), "w");
        if (!f) {
            fprintf(stderr, "autotune: cannot write %s\n", tmp.c_str());
            return 1;
        }
        fprintf(f,
                "-- %s.lua: measured cuda.linear.skinny plans for %s, written by scripts/autotune\n"
                "-- (tools/autotune.cu); regenerate on the machine rather than editing by hand.\n"
                "-- An entry exists only where the skinny kernel beat cuBLAS by >= %.0f%%.\n"
                "-- config.split_k = K-slices per row group in total = kw * kcta, where kw =\n"
                "-- threads / 32 / (rows / 8) (warps of a CTA on one row group, reduced in shared\n"
                "-- memory) and kcta = CTAs along K: split_k == kw is the classic one-CTA-per-tile\n"
                "-- kernel; split_k == kw * kcta (kcta >= 2) is split-K across CTAs (fp32 partials\n"
                "-- in the context workspace, summed in fixed order by the last CTA of each tile).\n",
                arch, arch, (min_speedup - 1) * 100);
        fprintf(f, "return {\n  arch = \"%s\",\n  machine = \"%s\",\n  date = \"%s\",\n",
                arch, machine, date);
        fprintf(f, "  method = \"%s\",\n  plans = {\n", method);
        for (const Shape &s : shapes) {
            bool any = false;
            for (const Result &r : results)
                if (r.s.N == s.N && r.s.K == s.K && r.kept) any = true;
            if (!any) {
                fprintf(f, "    -- %dx%d: cuBLAS wins at every M measured\n", s.N, s.K);
                continue;
            }
            fprintf(f, "    [\"%dx%d\"] = {\n", s.N, s.K);
            for (const Result &r : results) {
                if (r.s.N != s.N || r.s.K != s.K || !r.kept) continue;
                const Config &c = r.best;
                fprintf(f,
                        "      [%d] = {kernel = \"skinny\", config = {threads = %d, rows = %d, "
                        "unroll = %d, vec = %d, split_k = %d}, us = %.2f, cublas_us = %.2f},\n",
                        r.M, c.threads, c.rows, c.unroll, K3_SKINNY_VEC,
                        k3_skinny_split_k(c.threads, c.rows) * c.kcta, r.best_us, r.cublas_us);
            }
            fprintf(f, "    },\n");
        }
        fprintf(f, "  },\n}\n");
        if (fclose(f) != 0 || rename(tmp.c_str(), out_path.c_str()) != 0) {
            fprintf(stderr, "autotune: cannot write %s\n", out_path.c_str());
            return 1;
        }
    }

    /* The summary table: every M to the table file, M = 1, 2, 4, 8, 16 (or all) to stdout. */
    FILE *tf = fopen(table_path.c_str(), "w");
    const char *hdr = "shape          M  skinny_us  cublas_us  ratio    GB/s  floor_us  of_floor  plan\n";
    printf("%s\n%s", machine, hdr);
    if (tf) fprintf(tf, "%s\n%s  %s\n%s", machine, date, method, hdr);
    double lg1 = 0, lg16 = 0, pl1 = 0, pl16 = 0;
    int n1 = 0, n16 = 0;
    for (const Result &r : results) {
        const double bytes = 2.0 * ((double)r.s.N * r.s.K + (double)r.M * r.s.K + (double)r.M * r.s.N);
        const double floor_us = bytes / FLOOR_BW * 1e6;
        const double ratio = r.have_best ? r.cublas_us / r.best_us : 0;
        char line[256];
        snprintf(line, sizeof line, "%5dx%-6d %3d  %9.2f  %9.2f  %5.2f  %6.0f  %8.2f  %7.1f%%  %s\n",
                 r.s.N, r.s.K, r.M, r.best_us, r.cublas_us, ratio,
                 r.have_best ? bytes / (r.best_us * 1e-6) / 1e9 : 0.0, floor_us,
                 r.have_best ? 100.0 * floor_us / r.best_us : 0.0,
                 r.kept ? "skinny" : "cublas");
        if (tf) fputs(line, tf);
        if (all_m || r.M == 1 || r.M == 2 || r.M == 4 || r.M == 8 || r.M == 16) fputs(line, stdout);
        const double plan_ratio = r.kept ? ratio : 1.0;
        if (r.M == 1 && r.have_best) lg1 += std::log(ratio), pl1 += std::log(plan_ratio), n1++;
        if (r.M == 16 && r.have_best) lg16 += std::log(ratio), pl16 += std::log(plan_ratio), n16++;
    }
    char sum[512];
    snprintf(sum, sizeof sum,
             "geomean cuBLAS/skinny: M=1 %.3fx (plan %.3fx) over %d shapes; M=16 %.3fx (plan "
             "%.3fx) over %d shapes; %d candidate failures; plan file %s%s\n",
             n1 ? std::exp(lg1 / n1) : 0.0, n1 ? std::exp(pl1 / n1) : 0.0, n1,
             n16 ? std::exp(lg16 / n16) : 0.0, n16 ? std::exp(pl16 / n16) : 0.0, n16, failures,
             out_path.c_str(), dry ? " (dry run: not written)" : "");
    fputs(sum, stdout);
    if (tf) {
        fputs(sum, tf);
        fclose(tf);
    }
    cublasDestroy(h);
    cudaFree(ws);
    cudaFree(split_ws);
    cudaFree(counters);
    return failures ? 3 : 0;
}
