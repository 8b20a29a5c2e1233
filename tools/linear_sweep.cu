/*
 * linear_sweep.cu — one GPU run that measures the design space of the decode linear
 * y[M,N] = x[M,K] w[N,K]^T (bf16, fp32 accumulation) on the current GPU, per weight shape
 * (N, K) and M: the read limit of the weight's bytes (tools/read_limit.cuh, plain and chained
 * with PDL), cuBLAS, the skinny kernel as the plan file configures it
 * (lua/k3/policy/sm<cc>.lua) and every instantiated classic configuration of the skinny
 * kernel (kernels/linear_skinny.cuh), each in three launch modes: plain, PDL, and PDL with the
 * weight declared static (the first step of w loaded before griddepcontrol.wait). Built and run by
 * scripts/linear-sweep.
 *
 * Method (tools/linear_bench.cuh): every measurement is a CUDA graph of L back-to-back calls
 * over rotated weights, each call reading as x what the previous one wrote, replayed after
 * warm-up, median of the replays / L; every candidate is checked against cuBLAS before it is
 * timed (NaN-poisoned output, twice, and a NaN-seeded chain for the PDL modes).
 */
#define K3_TOOL_NAME "linear-sweep"
#include "linear_bench.cuh"
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
    int rows_per_warp; /* 8, 16 or 32 */
    int balanced;      /* the balanced grid */
    int l2_prefetch_mb; /* MiB of w prefetched into L2 before the wait */
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
            const char *rw = strstr(line, "rows_per_warp = ");
            e.rows_per_warp = rw ? atoi(rw + strlen("rows_per_warp = ")) : 8;
            e.balanced = strstr(line, "balanced = true") != nullptr;
            const char *pf = strstr(line, "l2_prefetch_mb = ");
            e.l2_prefetch_mb = pf ? atoi(pf + strlen("l2_prefetch_mb = ")) : 0;
            plan[shape][m] = e;
        }
    }
    fclose(f);
    return plan;
}

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
    double plan_static_us;                           /* the same entry, PDL + static w */
    std::string plan_cfg;
    double best_us[3];
    std::string best_cfg[3];
};

/* A classic candidate's configuration without its launch mode: "k512r8u2". */
static std::string cfg_name(const k3t_cand &c) {
    char b[64];
    snprintf(b, sizeof b, "k%dr%du%d%s%s", c.threads, c.rows, c.unroll,
             c.kind == K3T_CLASSIC32   ? "w32"
             : c.kind == K3T_CLASSIC16 ? "w16"
                                       : "",
             c.balanced ? "b" : "");
    return b;
}

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
    std::string plan_path, profile;
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
        else if (a == "--profile") profile = val();
        else {
            fprintf(stderr,
                    "usage: linear-sweep [--shapes NxK,...] [--m 1,2,4,8,16] [--out DIR ($OUT)]\n"
                    "                    [--plan lua/k3/policy/sm<cc>.lua] [--reps 15]\n"
                    "                    [--profile CFG,CFG,...]  (one eager launch of each named\n"
                    "                    candidate, e.g. k512r8u2,s256r8u8c2, and of the read kernel\n"
                    "                    c2t512u8stride, per shape and M: for ncu)\n");
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
    fprintf(csv, "N,K,M,candidate,mode,us,status\n");

    /* every classic configuration in the three launch modes */
    std::vector<k3t_cand> cands;
#define K3_SW_ADD(T_, R_, U_)                                                              \
    for (int b = 0; b < 2; b++)                                                            \
        for (int m = 0; m < 3; m++) cands.push_back(k3t_cand{K3T_CLASSIC, T_, R_, U_, 1, m, b});
#define K3_SW_ADD16(T_, R_, U_)                                                            \
    for (int b = 0; b < 2; b++)                                                            \
        for (int m = 0; m < 3; m++) cands.push_back(k3t_cand{K3T_CLASSIC16, T_, R_, U_, 1, m, b});
#define K3_SW_ADD32(T_, R_, U_)                                                            \
    for (int b = 0; b < 2; b++)                                                            \
        for (int m = 0; m < 3; m++) cands.push_back(k3t_cand{K3T_CLASSIC32, T_, R_, U_, 1, m, b});
    K3_SKINNY_CONFIGS(K3_SW_ADD)
    K3_SKINNY_RPW16_CONFIGS(K3_SW_ADD16)
    K3_SKINNY_RPW32_CONFIGS(K3_SW_ADD32)
#undef K3_SW_ADD
#undef K3_SW_ADD16
#undef K3_SW_ADD32
    k3t_scratch scr;
    k3t_scratch_init(scr);
    int64_t out_words = 0;
    for (const auto &r : k3t_read_shapes()) out_words = std::max(out_words, k3t_read_out_words(r, sms));
    unsigned *rl_out = nullptr;
    CK(cudaMalloc(&rl_out, out_words * sizeof(unsigned)));

    if (!profile.empty()) {
        /* One eager launch of each named candidate (plain launch) per shape and M, after the
         * buffers are filled: what `ncu -k regex:k3_` profiles (cold L2 under ncu's default
         * cache control). */
        for (const Shape &s : shapes) {
            k3t_shape b;
            k3t_shape_alloc(b, s.N, s.K, l2, t.s);
            for (const k3t_read_shape &r : k3t_read_shapes())
                if (("," + profile + ",").find("," + k3t_read_shape_name(r) + ",") != std::string::npos)
                    CK(k3t_read_launch(r, sms, b.w, b.wn * 2, rl_out, false, t.s));
            for (int M : ms)
                for (const k3t_cand &c : cands) {
                    if (c.mode != K3T_PLAIN ||
                        ("," + profile + ",").find("," + cfg_name(c) + ",") == std::string::npos)
                        continue;
                    CK(k3t_launch(c, scr, b.x0, b.w, b.y, M, s.N, s.K, t.s));
                    CK(cudaStreamSynchronize(t.s));
                    printf("profiled %s on %dx%d M=%d\n", cfg_name(c).c_str(), s.N, s.K, M);
                }
            CK(cudaStreamSynchronize(t.s));
            k3t_shape_free(b);
        }
        return 0;
    }

    std::map<size_t, std::pair<double, double>> read_cache;
    std::map<std::string, std::vector<double>> by_cfg; /* "cfg mode M" -> cuBLAS/us per shape */
    std::map<std::string, std::vector<double>> frac_cfg;
    std::vector<Row> rows;
    int failures = 0;
    const time_t t0 = time(nullptr);

    for (const Shape &s : shapes) {
        k3t_shape b;
        k3t_shape_alloc(b, s.N, s.K, l2, t.s);
        const size_t wbytes = b.wn * 2;
        const int L = b.L;
        /* The read limit of these bytes: best of the sweep, plain and chained with PDL. */
        if (!read_cache.count(wbytes)) {
            double best[2];
            for (int pdl = 0; pdl < 2; pdl++)
                best[pdl] = k3t_read_limit(
                    t, sms, b.w, wbytes, b.copies, L, rl_out, pdl != 0, nullptr,
                    [&](const k3t_read_shape &r, double us) {
                        fprintf(csv, "%d,%d,0,read %s,%s,%.3f,%s\n", s.N, s.K,
                                k3t_read_shape_name(r).c_str(), pdl ? "pdl" : "plain", us,
                                us > 0 ? "ok" : "failed");
                    });
            read_cache[wbytes] = {best[0], best[1]};
        }
        const double read_us = read_cache[wbytes].first, read_pdl_us = read_cache[wbytes].second;
        char shape_key[32];
        snprintf(shape_key, sizeof shape_key, "%dx%d", s.N, s.K);

        std::vector<uint16_t> href;
        for (int M : ms) {
            Row row;
            row.s = s;
            row.M = M;
            row.read_us = read_us;
            row.read_pdl_us = read_pdl_us;
            row.plan_us = row.plan_static_us = -1;
            for (int k = 0; k < 3; k++) row.best_us[k] = -1;
            k3t_reference(h, b, M, t.s, href);
            row.cublas_us = k3t_time_chain(t, b, [&](const uint16_t *x, const uint16_t *w, uint16_t *y) {
                return k3t_cublas_linear(h, x, w, y, M, s.N, s.K) ? cudaSuccess : cudaErrorUnknown;
            });
            fprintf(csv, "%d,%d,%d,cublas,plain,%.3f,ok\n", s.N, s.K, M, row.cublas_us);

            /* One candidate: checked, then timed over the chain; -1 when it failed. */
            auto measure = [&](const k3t_cand &c, const std::string &label, int mode) -> double {
                auto launch = [&](const uint16_t *x, const uint16_t *w, uint16_t *y) {
                    return k3t_launch(c, scr, x, w, y, M, s.N, s.K, t.s);
                };
                const char *status = k3t_check(h, b, M, t.s, href, label, mode != K3T_PLAIN, launch);
                double us = -1;
                if (!strcmp(status, "ok")) {
                    us = k3t_time_chain(t, b, launch);
                    if (us < 0) status = "capture-failed";
                }
                if (strcmp(status, "ok")) failures++;
                fprintf(csv, "%d,%d,%d,%s,%s,%.3f,%s\n", s.N, s.K, M, label.c_str(),
                        K3T_MODE_NAME[mode], us, status);
                return us;
            };

            /* The plan's skinny entry (classic or split-K), launched plain as the library does
             * today, and with PDL (w after the wait, then the first step before it). */
            auto pe = plan.find(shape_key);
            if (pe != plan.end() && pe->second.count(M)) {
                const PlanEntry e = pe->second[M];
                const int kw = k3_skinny_split_k(e.threads, e.rows, e.rows_per_warp);
                const int kcta = kw ? e.split_k / kw : 0;
                for (int mode = 0; mode < 3; mode++) {
                    const k3t_cand c = {e.rows_per_warp == 32   ? K3T_CLASSIC32
                                        : e.rows_per_warp == 16 ? K3T_CLASSIC16
                                        : kcta > 1              ? K3T_SPLIT
                                                                : K3T_CLASSIC,
                                        e.threads, e.rows, e.unroll, kcta, mode, e.balanced,
                                        e.l2_prefetch_mb};
                    if (!k3t_cand_fits(c, scr, M, s.N)) continue;
                    const double us = measure(c, "plan " + k3t_cand_name(c), mode);
                    if (mode == K3T_PLAIN) {
                        row.plan_us = us;
                        row.plan_cfg = k3t_cand_name(c);
                    } else if (mode == K3T_PDL_STATIC) {
                        row.plan_static_us = us;
                    }
                }
            }

            for (const k3t_cand &c : cands) {
                if (!k3t_cand_fits(c, scr, M, s.N)) continue;
                const std::string cn = cfg_name(c);
                const double us = measure(c, cn, c.mode);
                if (us <= 0) continue;
                if (row.best_us[c.mode] < 0 || us < row.best_us[c.mode]) {
                    row.best_us[c.mode] = us;
                    row.best_cfg[c.mode] = cn;
                }
                char key[96];
                snprintf(key, sizeof key, "%s %s M=%d", cn.c_str(), K3T_MODE_NAME[c.mode], M);
                by_cfg[key].push_back(row.cublas_us / us);
                frac_cfg[key].push_back((c.mode == K3T_PDL_STATIC ? read_pdl_us : read_us) / us);
            }
            rows.push_back(row);
            fflush(csv);
            fprintf(stderr, "[%4lds] %-12s M=%-2d read %6.2f/%6.2f cuBLAS %6.2f plan %6.2f best %6.2f %6.2f %6.2f\n",
                    (long)(time(nullptr) - t0), shape_key, M, read_us, read_pdl_us,
                    row.cublas_us, row.plan_us, row.best_us[0], row.best_us[1], row.best_us[2]);
        }
        k3t_shape_free(b);
    }
    fclose(csv);

    /* The table: every row to sweep.txt; M = 1 and 16 to stdout. */
    FILE *tf = fopen((outdir + "/sweep.txt").c_str(), "w");
    char date[64];
    const time_t now = time(nullptr);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    const char *hdr =
        "shape        M  read rd-pdl  cuBLAS   plan  pl-st | plain  cfg          | pdl-st cfg         "
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
                 "%5dx%-6d %2d %5.2f %6.2f %7.2f %6.2f%s%6.2f | %6.2f %-12s | %6.2f %-12s | %4.0f%% %5.0f%%  "
                 "%5.2f %5.2f\n",
                 r.s.N, r.s.K, r.M, r.read_us, r.read_pdl_us, r.cublas_us, plan_us,
                 r.plan_us > 0 ? "s" : "c", r.plan_static_us, r.best_us[0], r.best_cfg[0].c_str(), r.best_us[2],
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
             "geomean over cuBLAS  M=1 / M=16: plan file %.3f / %.3f; best candidate plain %.3f / "
             "%.3f, pdl %.3f / %.3f, pdl-static %.3f / %.3f\n"
             "read-limit fraction, min over shapes, M=1 / M=16: best plain %.0f%% / %.0f%%, "
             "pdl-static (vs read+PDL) %.0f%% / %.0f%%\n",
             geomean(g_plan[0]), geomean(g_plan[1]), geomean(g_best[0][0]),
             geomean(g_best[0][1]), geomean(g_best[1][0]), geomean(g_best[1][1]),
             geomean(g_best[2][0]), geomean(g_best[2][1]), 100 * vmin(fr[0][0]),
             100 * vmin(fr[0][1]), 100 * vmin(fr[1][0]), 100 * vmin(fr[1][1]));
    printf("\nper configuration (all shapes): geomean cuBLAS/us, min read-limit fraction\n");
    if (tf) fprintf(tf, "\nper configuration (all shapes): geomean cuBLAS/us, min read-limit fraction\n");
    std::vector<std::string> names;
    for (const k3t_cand &c : cands)
        if (c.mode == K3T_PLAIN) names.push_back(cfg_name(c));
    for (const std::string &cn : names)
        for (int mode = 0; mode < 3; mode++) {
            std::string line = cn + " " + K3T_MODE_NAME[mode] + ":";
            for (int M : ms) {
                char key[96], bb[96];
                snprintf(key, sizeof key, "%s %s M=%d", cn.c_str(), K3T_MODE_NAME[mode], M);
                snprintf(bb, sizeof bb, "  M=%d %.2fx %.0f%%", M, geomean(by_cfg[key]),
                         100 * vmin(frac_cfg[key]));
                line += bb;
            }
            line += "\n";
            if (tf) fputs(line.c_str(), tf);
            if (mode != K3T_PDL) fputs(line.c_str(), stdout);
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
