/*
 * linear_sweep.cu — one GPU run that measures the design space of the decode linear
 * y[M,N] = x[M,K] w[N,K]^T (bf16, fp32 accumulation) on the current GPU, per weight shape
 * (N, K) and M: the read limit of the weight's bytes (tools/read_limit.cuh, plain and chained
 * with PDL), cuBLAS, the skinny kernel as the plan file configures it
 * (lua/k3/policy/sm<cc>.lua) and every instantiated configuration of the skinny stream
 * kernel (kernels/linear_skinny.cuh) in three launch modes: plain, PDL, and PDL with the
 * weight declared static (w loads issued before griddepcontrol.wait). Built and run by
 * scripts/linear-sweep.
 *
 * Method: weights uniform in (-sqrt(3/K), sqrt(3/K)) and activations in (-1, 1), never zero,
 * weights rotated over copies totalling >= 4x L2; every measurement is a CUDA graph of L
 * back-to-back calls in which call j reads w copy j % copies and the x that call j - 1 wrote
 * (each call's y buffer is the next call's x buffer, the decode chain's data dependency; the
 * weight scale keeps the chain's values near unit size), replayed after warm-up, median of
 * the replays / L. Every candidate is checked before it is timed: its output, poisoned with
 * NaN first, against cuBLAS on the same input, twice (bit-identical: deterministic, counters
 * reset); each PDL mode also runs a 4-call chain whose y buffers start as NaN, and each
 * link must match cuBLAS on the x it was given (a link that read x before its predecessor
 * wrote it reads NaN and fails).
 */
#define K3_TOOL_NAME "linear-sweep"
#include "../kernels/linear_skinny.cuh"
#include "bench_common.cuh"
#include "read_limit.cuh"

#include <cmath>
#include <ctime>
#include <map>
#include <string>

struct Shape {
    int N, K;
};
/* DESIGN.md's Kimi-K3 TP8 local projection shapes, and the square 7168x7168. */
static const Shape SHAPES[] = {{1536, 7168}, {3072, 7168},  {2112, 7168},  {2304, 1536},
                               {4608, 1536}, {3584, 7168},  {6288, 7168},  {12448, 7168},
                               {7168, 768},  {7168, 1536},  {7168, 3072},  {7168, 3584},
                               {7168, 4224}, {7168, 8448},  {8448, 7168},  {16896, 7168},
                               {7168, 14336}, {20480, 7168}, {7168, 7168}};

struct PlanEntry {
    int threads, rows, unroll, vec, split_k;
};
/* The skinny entries of a plan file written by scripts/autotune, by "NxK" and M. */
static std::map<std::string, std::map<int, PlanEntry>> parse_plan(const char *path) {
    std::map<std::string, std::map<int, PlanEntry>> plan;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "linear-sweep: no plan file %s (the plan column will be empty)\n", path);
        return plan;
    }
    char line[1024], shape[64] = "";
    while (fgets(line, sizeof line, f)) {
        int m;
        PlanEntry e;
        char s[64];
        if (sscanf(line, " [\"%63[0-9x]\"] = {", s) == 1) {
            snprintf(shape, sizeof shape, "%s", s);
        } else if (shape[0] &&
                   sscanf(line,
                          " [%d] = {kernel = \"skinny\", config = {threads = %d, rows = %d, "
                          "unroll = %d, vec = %d, split_k = %d}",
                          &m, &e.threads, &e.rows, &e.unroll, &e.vec, &e.split_k) == 6) {
            plan[shape][m] = e;
        }
    }
    fclose(f);
    return plan;
}

struct StreamCfg {
    int threads, rg, unroll, minb, ctas_per_sm;
};
static std::string cfg_name(const StreamCfg &c) {
    char b[64];
    snprintf(b, sizeof b, "t%dr%du%db%dc%d", c.threads, 8 * c.rg, c.unroll, c.minb, c.ctas_per_sm);
    return b;
}
static const char *MODE_NAME[3] = {"plain", "pdl", "pdl-static"};

static std::vector<int> parse_ms(const char *s) {
    std::vector<int> v;
    while (*s) {
        int a, used = 0;
        if (sscanf(s, "%d%n", &a, &used) != 1 || a < 1 || a > K3_SKINNY_MAX_M) {
            fprintf(stderr, "linear-sweep: bad M list near '%s' (1..%d, comma-separated)\n", s,
                    K3_SKINNY_MAX_M);
            exit(2);
        }
        v.push_back(a);
        s += used;
        if (*s == ',') s++;
    }
    return v;
}

static std::vector<Shape> parse_shapes(const char *s) {
    std::vector<Shape> v;
    while (*s) {
        int n, k, used = 0;
        if (sscanf(s, "%dx%d%n", &n, &k, &used) != 2 || n < 1 || k < 8 || k % 8) {
            fprintf(stderr, "linear-sweep: bad shape list near '%s' (NxK,... with K %% 8 == 0)\n", s);
            exit(2);
        }
        v.push_back(Shape{n, k});
        s += used;
        if (*s == ',') s++;
    }
    return v;
}

struct Row {
    Shape s;
    int M;
    double read_us, read_pdl_us, cublas_us, plan_us; /* plan_us < 0: no skinny entry */
    std::string plan_cfg;
    double best_us[3];
    std::string best_cfg[3];
};

static double geomean(const std::vector<double> &v) {
    if (v.empty()) return 0;
    double s = 0;
    for (double x : v) s += std::log(x);
    return std::exp(s / v.size());
}

int main(int argc, char **argv) {
    std::vector<Shape> shapes(SHAPES, SHAPES + sizeof SHAPES / sizeof SHAPES[0]);
    std::vector<int> ms = parse_ms("1,2,4,8,16");
    const char *outdir_env = getenv("OUT");
    std::string outdir = outdir_env && *outdir_env ? outdir_env : "build/sweep";
    std::string plan_path;
    int reps = 15;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                fprintf(stderr, "linear-sweep: %s needs a value\n", a.c_str());
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--shapes") shapes = parse_shapes(val());
        else if (a == "--m") ms = parse_ms(val());
        else if (a == "--out") outdir = val();
        else if (a == "--plan") plan_path = val();
        else if (a == "--reps") reps = std::max(3, atoi(val()));
        else {
            fprintf(stderr,
                    "usage: linear-sweep [--shapes NxK,...] [--m 1,2,4,8,16] [--out DIR ($OUT)]\n"
                    "                    [--plan lua/k3/policy/sm<cc>.lua] [--reps 15]\n");
            return 2;
        }
    }

    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    char arch[16];
    snprintf(arch, sizeof arch, "sm%d%d", prop.major, prop.minor);
    if (plan_path.empty()) plan_path = std::string("lua/k3/policy/") + arch + ".lua";
    auto plan = parse_plan(plan_path.c_str());
    k3t_timer t;
    k3t_timer_init(t, reps, 3);
    int blas_ver = 0, rt = 0, drv = 0;
    cublasHandle_t h = k3t_cublas(t.s, &blas_ver);
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    const double copy_tbs = k3t_copy_tbs(t);
    const size_t l2 = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : (size_t)60 << 20;
    char machine[512];
    snprintf(machine, sizeof machine,
             "%s, %d SMs, %.0f MB L2, CUDA runtime %d, driver %d, cuBLAS %d, copy %.2f TB/s",
             prop.name, sms, l2 / 1e6, rt, drv, blas_ver, copy_tbs);
    printf("%s\n", machine);
    if (system(("mkdir -p '" + outdir + "'").c_str()) != 0) {
        fprintf(stderr, "linear-sweep: cannot create %s\n", outdir.c_str());
        return 1;
    }
    FILE *csv = fopen((outdir + "/sweep.csv").c_str(), "w");
    if (!csv) {
        fprintf(stderr, "linear-sweep: cannot write %s/sweep.csv\n", outdir.c_str());
        return 1;
    }
    fprintf(csv, "N,K,M,kernel,config,mode,us,status\n");

    /* The stream configurations and their grids: 1 and 2 CTAs per SM where that many fit. */
    std::vector<StreamCfg> cfgs;
#define K3_SW_ADD(T_, R_, U_, B_)                                                          \
    for (int c = 1; c <= 2; c++) {                                                         \
        const int r1 = k3_skinny_stream_resident(T_, R_, U_, B_, 1);                       \
        const int r2 = k3_skinny_stream_resident(T_, R_, U_, B_, 2);                       \
        if (std::min(r1, r2) >= c) cfgs.push_back(StreamCfg{T_, R_, U_, B_, c});           \
        else fprintf(stderr, "linear-sweep: t%d r%d u%d: %d CTA(s)/SM resident (M<=8), %d (M<=16); no c%d\n", \
                     T_, 8 * R_, U_, r1, r2, c);                                           \
    }
    K3_SKINNY_STREAM_CONFIGS(K3_SW_ADD)
#undef K3_SW_ADD

    /* Scratch: stream partials and counters, split-K partials and counters for the plan. */
    const int n_counters = 65536;
    unsigned *counters = nullptr, *plan_counters = nullptr;
    float *ws = nullptr, *plan_ws = nullptr;
    const size_t ws_bytes = k3_skinny_stream_ws_bytes(4, 2 * sms), plan_ws_bytes = 32u << 20;
    CK(cudaMalloc(&counters, n_counters * sizeof(unsigned)));
    CK(cudaMalloc(&plan_counters, n_counters * sizeof(unsigned)));
    CK(cudaMemset(counters, 0, n_counters * sizeof(unsigned)));
    CK(cudaMemset(plan_counters, 0, n_counters * sizeof(unsigned)));
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMalloc(&plan_ws, plan_ws_bytes));
    const std::vector<k3t_read_shape> rshapes = k3t_read_shapes();
    int64_t out_words = 0;
    for (const auto &r : rshapes) out_words = std::max(out_words, k3t_read_out_words(r, sms));
    unsigned *rl_out = nullptr;
    CK(cudaMalloc(&rl_out, out_words * sizeof(unsigned)));

    std::map<size_t, std::pair<double, double>> read_cache;
    std::map<std::string, std::vector<double>> by_cfg; /* "cfg mode M" -> cuBLAS/us per shape */
    std::map<std::string, std::vector<double>> frac_cfg;
    std::vector<Row> rows;
    int failures = 0;
    const time_t t0 = time(nullptr);

    for (const Shape &s : shapes) {
        const size_t wn = (size_t)s.N * s.K, wbytes = wn * 2;
        const int copies = (int)std::max<size_t>(3, (4 * l2 + wbytes - 1) / wbytes + 1);
        const int L = std::max(20, copies);
        const size_t bn = (size_t)K3_SKINNY_MAX_M * std::max(s.N, s.K); /* chain buffer */
        uint16_t *w = nullptr, *chain = nullptr, *x0 = nullptr, *y = nullptr, *yref = nullptr;
        CK(cudaMalloc(&w, wbytes * copies));
        CK(cudaMalloc(&chain, bn * 2 * L));
        CK(cudaMalloc(&x0, (size_t)K3_SKINNY_MAX_M * s.K * 2));
        CK(cudaMalloc(&y, bn * 2));
        CK(cudaMalloc(&yref, bn * 2));
        k3t_fill(w, wn * copies, 1000 + s.N * 7 + s.K, std::sqrt(3.0f / s.K), t.s);
        k3t_fill(chain, bn * L, 77 + s.N, 1.0f, t.s);
        k3t_fill(x0, (size_t)K3_SKINNY_MAX_M * s.K, 7 + s.K, 1.0f, t.s);
        CK(cudaStreamSynchronize(t.s));
        auto wcopy = [&](int j) { return w + (size_t)(j % copies) * wn; };
        auto cbuf = [&](int j) { return chain + (size_t)(((j % L) + L) % L) * bn; };

        /* The read limit of these bytes: best of the sweep, plain and chained with PDL. */
        if (!read_cache.count(wbytes)) {
            double best[2] = {1e30, 1e30};
            for (int pdl = 0; pdl < 2; pdl++)
                for (const auto &r : rshapes) {
                    const double us = k3t_time_calls(t, L, [&](int j) {
                        return k3t_read_launch(r, sms, wcopy(j), wbytes, rl_out, pdl != 0, t.s) ==
                               cudaSuccess;
                    });
                    fprintf(csv, "%d,%d,0,read,c%dt%du%d%s,%s,%.3f,%s\n", s.N, s.K, r.ctas_per_sm,
                            r.threads, r.unroll, r.contig ? "contig" : "stride",
                            pdl ? "pdl" : "plain", us, us > 0 ? "ok" : "failed");
                    if (us > 0) best[pdl] = std::min(best[pdl], us);
                }
            read_cache[wbytes] = {best[0], best[1]};
        }
        const double read_us = read_cache[wbytes].first, read_pdl_us = read_cache[wbytes].second;
        char shape_key[32];
        snprintf(shape_key, sizeof shape_key, "%dx%d", s.N, s.K);

        std::vector<uint16_t> href(bn), hy(bn), hprev(bn);
        for (int M : ms) {
            const size_t ny = (size_t)M * s.N;
            Row row;
            row.s = s;
            row.M = M;
            row.read_us = read_us;
            row.read_pdl_us = read_pdl_us;
            row.plan_us = -1;
            for (int k = 0; k < 3; k++) row.best_us[k] = -1;
            /* reference: cuBLAS on x0 and copy 0 */
            CK(cudaMemsetAsync(yref, 0xff, ny * 2, t.s));
            if (!k3t_cublas_linear(h, x0, w, yref, M, s.N, s.K)) {
                fprintf(stderr, "linear-sweep: cuBLAS failed on %s M=%d\n", shape_key, M);
                return 1;
            }
            CK(cudaMemcpyAsync(href.data(), yref, ny * 2, cudaMemcpyDeviceToHost, t.s));
            CK(cudaStreamSynchronize(t.s));
            row.cublas_us = k3t_time_calls(t, L, [&](int j) {
                return k3t_cublas_linear(h, cbuf(j - 1), wcopy(j), cbuf(j), M, s.N, s.K);
            });
            fprintf(csv, "%d,%d,%d,cublas,-,plain,%.3f,ok\n", s.N, s.K, M, row.cublas_us);

            /* One candidate: check (twice, bit-identical), chain check for PDL, then time.
             * launch(x, w, y, mode) enqueues one call. */
            auto run_candidate = [&](const char *kernel, const std::string &cname, int mode,
                                     auto launch) -> double {
                const char *status = "ok";
                for (int pass = 0; pass < 2 && !strcmp(status, "ok"); pass++) {
                    CK(cudaMemsetAsync(y, 0xff, ny * 2, t.s));
                    if (launch(x0, w, y, mode) != cudaSuccess) {
                        (void)cudaGetLastError();
                        status = "launch-failed";
                        break;
                    }
                    cudaError_t se = cudaStreamSynchronize(t.s);
                    if (se != cudaSuccess) {
                        fprintf(stderr, "linear-sweep: %s %s crashed on %s M=%d: %s\n", kernel,
                                cname.c_str(), shape_key, M, cudaGetErrorString(se));
                        exit(1);
                    }
                    if (pass) hprev = hy;
                    CK(cudaMemcpy(hy.data(), y, ny * 2, cudaMemcpyDeviceToHost));
                    size_t first = 0, bad = k3t_mismatches(hy, href, ny, &first);
                    if (bad) {
                        status = "wrong";
                        fprintf(stderr,
                                "linear-sweep: WRONG %s %s %s on %s M=%d: %zu of %zu differ from "
                                "cuBLAS (first [%zu, %zu]: %g vs %g)\n",
                                kernel, cname.c_str(), MODE_NAME[mode], shape_key, M, bad, ny,
                                first / s.N, first % s.N, k3t_bf16_to_f32(hy[first]),
                                k3t_bf16_to_f32(href[first]));
                    } else if (pass && memcmp(hprev.data(), hy.data(), ny * 2)) {
                        status = "not-deterministic";
                        fprintf(stderr, "linear-sweep: %s %s on %s M=%d: two calls differ\n",
                                kernel, cname.c_str(), shape_key, M);
                    }
                }
                if (!strcmp(status, "ok") && mode > 0) {
                    /* 4 chained calls, y buffers NaN where the previous link writes them */
                    uint16_t *links[5] = {x0, cbuf(0), cbuf(1), cbuf(2), cbuf(3)};
                    for (int k = 1; k <= 4; k++) {
                        k3t_fill(links[k], bn, 900 + k, 1.0f, t.s);
                        CK(cudaMemsetAsync(links[k], 0xff, ny * 2, t.s));
                    }
                    bool ok = true;
                    for (int k = 0; k < 4 && ok; k++)
                        ok = launch(links[k], wcopy(k + 1), links[k + 1], mode) == cudaSuccess;
                    CK(cudaStreamSynchronize(t.s));
                    for (int k = 0; k < 4 && ok; k++) {
                        CK(cudaMemsetAsync(yref, 0xff, ny * 2, t.s));
                        if (!k3t_cublas_linear(h, links[k], wcopy(k + 1), yref, M, s.N, s.K))
                            ok = false;
                        std::vector<uint16_t> r(ny);
                        CK(cudaMemcpyAsync(r.data(), yref, ny * 2, cudaMemcpyDeviceToHost, t.s));
                        CK(cudaMemcpyAsync(hy.data(), links[k + 1], ny * 2,
                                           cudaMemcpyDeviceToHost, t.s));
                        CK(cudaStreamSynchronize(t.s));
                        size_t first = 0, bad = k3t_mismatches(hy, r, ny, &first);
                        if (bad) {
                            ok = false;
                            fprintf(stderr,
                                    "linear-sweep: WRONG in a chain: %s %s %s on %s M=%d, link %d: "
                                    "%zu of %zu differ (first %g vs %g)\n",
                                    kernel, cname.c_str(), MODE_NAME[mode], shape_key, M, k + 1,
                                    bad, ny, k3t_bf16_to_f32(hy[first]),
                                    k3t_bf16_to_f32(r[first]));
                        }
                    }
                    /* the timing chain starts from fresh data */
                    k3t_fill(chain, bn * L, 77 + s.N, 1.0f, t.s);
                    if (!ok) status = "wrong-in-chain";
                }
                double us = -1;
                if (!strcmp(status, "ok")) {
                    us = k3t_time_calls(t, L, [&](int j) {
                        return launch(cbuf(j - 1), wcopy(j), cbuf(j), mode) == cudaSuccess;
                    });
                    if (us < 0) status = "capture-failed";
                }
                if (strcmp(status, "ok")) failures++;
                fprintf(csv, "%d,%d,%d,%s,%s,%s,%.3f,%s\n", s.N, s.K, M, kernel, cname.c_str(),
                        MODE_NAME[mode], us, status);
                return us;
            };

            /* The plan's skinny entry, as the library launches it today (no PDL). */
            auto pe = plan.find(shape_key);
            if (pe != plan.end() && pe->second.count(M)) {
                const PlanEntry e = pe->second[M];
                const int kw = k3_skinny_split_k(e.threads, e.rows);
                const int kcta = kw ? e.split_k / kw : 0;
                char b[64];
                snprintf(b, sizeof b, "t%dr%du%ds%d", e.threads, e.rows, e.unroll, e.split_k);
                row.plan_cfg = b;
                row.plan_us = run_candidate(
                    "plan", row.plan_cfg, 0,
                    [&](const uint16_t *xx, const uint16_t *ww, uint16_t *yy, int) {
                        k3_skinny_problem q = {};
                        q.x = xx;
                        q.w = ww;
                        q.y = yy;
                        q.y_s0 = s.N;
                        q.y_s1 = 1;
                        q.M = M;
                        q.N = s.N;
                        q.K = s.K;
                        return kcta > 1 ? k3_skinny_launch_split(e.threads, e.rows, e.unroll,
                                                                 kcta, q, plan_ws, plan_counters,
                                                                 t.s)
                                        : k3_skinny_launch(e.threads, e.rows, e.unroll, q, t.s);
                    });
            }

            for (const StreamCfg &c : cfgs) {
                const std::string cn = cfg_name(c);
                const int grid = c.ctas_per_sm * sms;
                for (int mode = 0; mode < 3; mode++) {
                    const double us = run_candidate(
                        "stream", cn, mode,
                        [&](const uint16_t *xx, const uint16_t *ww, uint16_t *yy, int md) {
                            k3_skinny_stream_args a = {};
                            a.x = (const uint4 *)xx;
                            a.w = (const uint4 *)ww;
                            a.y = yy;
                            a.y_s0 = s.N;
                            a.y_s1 = 1;
                            a.M = M;
                            a.N = s.N;
                            a.K = s.K;
                            a.ws = ws;
                            a.counters = counters;
                            a.pdl = md > 0;
                            a.static_w = md == 2;
                            return k3_skinny_stream_launch(c.threads, c.rg, c.unroll, c.minb, grid, a,
                                                           t.s);
                        });
                    if (us <= 0) continue;
                    if (row.best_us[mode] < 0 || us < row.best_us[mode]) {
                        row.best_us[mode] = us;
                        row.best_cfg[mode] = cn;
                    }
                    char key[96];
                    snprintf(key, sizeof key, "%s %s M=%d", cn.c_str(), MODE_NAME[mode], M);
                    by_cfg[key].push_back(row.cublas_us / us);
                    frac_cfg[key].push_back((mode == 2 ? read_pdl_us : read_us) / us);
                }
            }
            rows.push_back(row);
            fflush(csv);
            fprintf(stderr, "[%4lds] %-12s M=%-2d read %6.2f/%6.2f cuBLAS %6.2f plan %6.2f stream %6.2f %6.2f %6.2f\n",
                    (long)(time(nullptr) - t0), shape_key, M, read_us, read_pdl_us,
                    row.cublas_us, row.plan_us, row.best_us[0], row.best_us[1], row.best_us[2]);
        }
        CK(cudaFree(w));
        CK(cudaFree(chain));
        CK(cudaFree(x0));
        CK(cudaFree(y));
        CK(cudaFree(yref));
    }
    fclose(csv);

    /* The table: every row to sweep.txt; M = 1 and 16 to stdout. */
    FILE *tf = fopen((outdir + "/sweep.txt").c_str(), "w");
    char date[64];
    const time_t now = time(nullptr);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    const char *hdr =
        "shape        M  read rd-pdl  cuBLAS    plan | plain  cfg          | pdl-st cfg         "
        "  | %read %rdpdl  xcuBLAS(plain/pdl-st)\n";
    printf("%s  %s\nµs per call (CUDA graph of back-to-back calls, chained through x); %%read = read limit / time "
           "(plain vs read, pdl-static vs read chained with PDL)\n%s",
           date, outdir.c_str(), hdr);
    if (tf) fprintf(tf, "%s\n%s\n%s", machine, date, hdr);
    std::vector<double> g_plan[2], g_best[3][2], fr[2][2];
    for (const Row &r : rows) {
        char line[320];
        const double plan_us = r.plan_us > 0 ? r.plan_us : r.cublas_us;
        snprintf(line, sizeof line,
                 "%5dx%-6d %2d %5.2f %6.2f %7.2f %6.2f%s| %6.2f %-12s | %6.2f %-12s | %4.0f%% %5.0f%%  "
                 "%5.2f %5.2f\n",
                 r.s.N, r.s.K, r.M, r.read_us, r.read_pdl_us, r.cublas_us, plan_us,
                 r.plan_us > 0 ? "s " : "c ", r.best_us[0], r.best_cfg[0].c_str(), r.best_us[2],
                 r.best_cfg[2].c_str(), 100 * r.read_us / r.best_us[0],
                 100 * r.read_pdl_us / r.best_us[2], r.cublas_us / r.best_us[0],
                 r.cublas_us / r.best_us[2]);
        if (tf) fputs(line, tf);
        if (r.M == 1 || r.M == 16) fputs(line, stdout);
        const int mi = r.M == 1 ? 0 : r.M == 16 ? 1 : -1;
        if (mi < 0) continue;
        g_plan[mi].push_back(r.cublas_us / plan_us);
        for (int k = 0; k < 3; k++)
            if (r.best_us[k] > 0) g_best[k][mi].push_back(r.cublas_us / r.best_us[k]);
        if (r.best_us[0] > 0) fr[0][mi].push_back(r.read_us / r.best_us[0]);
        if (r.best_us[2] > 0) fr[1][mi].push_back(r.read_pdl_us / r.best_us[2]);
    }
    auto vmin = [](const std::vector<double> &v) {
        return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
    };
    char sum[1024];
    snprintf(sum, sizeof sum,
             "geomean over cuBLAS  M=1 / M=16: plan file %.3f / %.3f; best stream plain %.3f / "
             "%.3f, pdl %.3f / %.3f, pdl-static %.3f / %.3f\n"
             "read-limit fraction, min over shapes, M=1 / M=16: stream plain %.0f%% / %.0f%%, "
             "pdl-static (vs read+PDL) %.0f%% / %.0f%%\n",
             geomean(g_plan[0]), geomean(g_plan[1]), geomean(g_best[0][0]),
             geomean(g_best[0][1]), geomean(g_best[1][0]), geomean(g_best[1][1]),
             geomean(g_best[2][0]), geomean(g_best[2][1]), 100 * vmin(fr[0][0]),
             100 * vmin(fr[0][1]), 100 * vmin(fr[1][0]), 100 * vmin(fr[1][1]));
    printf("\nper configuration (all shapes): geomean cuBLAS/us, min read-limit fraction\n");
    if (tf) fprintf(tf, "\nper configuration (all shapes): geomean cuBLAS/us, min read-limit fraction\n");
    for (const StreamCfg &c : cfgs)
        for (int mode = 0; mode < 3; mode++) {
            std::string line = cfg_name(c) + " " + MODE_NAME[mode] + ":";
            for (int M : ms) {
                char key[96], b[96];
                snprintf(key, sizeof key, "%s %s M=%d", cfg_name(c).c_str(), MODE_NAME[mode], M);
                snprintf(b, sizeof b, "  M=%d %.2fx %.0f%%", M, geomean(by_cfg[key]),
                         100 * vmin(frac_cfg[key]));
                line += b;
            }
            line += "\n";
            if (tf) fputs(line.c_str(), tf);
            if (mode != 1) fputs(line.c_str(), stdout);
        }
    printf("\n%s%d candidate failures (see stderr); full table %s/sweep.txt, every timing %s/sweep.csv\n",
           sum, failures, outdir.c_str(), outdir.c_str());
    if (tf) {
        fputs(sum, tf);
        fclose(tf);
    }
    cublasDestroy(h);
    return failures ? 3 : 0;
}
