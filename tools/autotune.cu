/*
 * autotune.cu — measures cuda.linear.skinny against cuBLAS on the current GPU and writes the
 * architecture's plan file (lua/k3/policy/sm<cc>.lua): for each weight shape (N, K) and
 * M = 1..16, the fastest skinny candidate, kept only where it beats cuBLAS by the margin (5%
 * by default) in two independent timing passes interleaved with cuBLAS. Standalone: it links
 * cuBLAS and the kernel templates of kernels/linear_skinny.cuh, not libk3. Built and run by
 * scripts/autotune.
 *
 * Method (tools/linear_bench.cuh): weights rotated over copies totalling >= 4x L2, each
 * measurement a CUDA graph of >= 20 back-to-back calls chained through x (call j reads what
 * call j - 1 wrote), median of the replays / calls. Per (shape, M): cuBLAS, then every
 * candidate (checked against cuBLAS before it is timed, a failure reported and skipped); the
 * fastest is then timed again in two passes, each a fresh graph of cuBLAS followed by a fresh
 * graph of the candidate, and is kept only when both passes give cuBLAS / candidate >= the
 * margin. Every candidate is timed as k3's layers launch it: PDL, weights static (the first
 * step of w loaded before griddepcontrol.wait). Kinds (--kinds): classic (8 rows per warp),
 * classic16 (16), classic32 (32), split (split-K across CTAs) and balanced (each classic
 * candidate again on the
 * balanced grid of kernels/linear_skinny.cuh, where that grid is not its row tiling; named with
 * classic, classic16 or classic32). Another name is an error.
 *
 * L2 prefetch (--l2-prefetch, MiB, default 8,16,32; 0 for none): the search's fastest candidate
 * is timed again with each budget (plan config l2_prefetch_mb: the kernel asks L2 for the head of
 * its rows of w before its wait), and the fastest of those goes to the two passes. In the chain
 * each call's prefetch runs under the previous call's tail, as a projection after another one
 * does in a decode step.
 *
 * --epilogue silu_mul measures the SwiGLU gate_up call instead (w [N, K] = gate rows | up
 * rows, the call writes h = silu(gate) * up [M, N/2]): the skinny classic candidates with the
 * epilogue in the kernel against cuBLAS followed by a separate silu_mul kernel (what k3 runs
 * without the skinny kernel), the same two passes and margin, into
 * lua/k3/policy/sm<cc>_silu_mul.lua (k3.plan_for(w, {epilogue = "silu_mul"})).
 */
#define K3_TOOL_NAME "autotune"
#include "linear_bench.cuh"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <string>

#include <unistd.h>

struct Shape {
    int N, K;
};
/* DESIGN.md's Kimi-K3 TP8 local projection shapes, and the square 7168x7168. */
static const Shape KIMI[] = {{1536, 7168}, {3072, 7168},  {2112, 7168},  {2304, 1536},
                             {4608, 1536}, {3584, 7168},  {6288, 7168},  {12448, 7168},
                             {7168, 768},  {7168, 1536},  {7168, 3072},  {7168, 3584},
                             {7168, 4224}, {7168, 8448},  {8448, 7168},  {16896, 7168},
                             {7168, 14336}, {20480, 7168}, {7168, 7168}};

/* The classic candidates: 8 rows per warp, (classic16) 16 and (classic32) 32 rows per warp. */
static std::vector<k3t_cand> classic_cands(bool eight, bool sixteen, bool thirtytwo) {
    std::vector<k3t_cand> v;
#define K3_AT_ADD(T, R, U) v.push_back(k3t_cand{K3T_CLASSIC, T, R, U, 1, K3T_PDL_STATIC, 0});
#define K3_AT_ADD16(T, R, U) v.push_back(k3t_cand{K3T_CLASSIC16, T, R, U, 1, K3T_PDL_STATIC, 0});
#define K3_AT_ADD32(T, R, U) v.push_back(k3t_cand{K3T_CLASSIC32, T, R, U, 1, K3T_PDL_STATIC, 0});
    if (eight) K3_SKINNY_CONFIGS(K3_AT_ADD)
    if (sixteen) K3_SKINNY_RPW16_CONFIGS(K3_AT_ADD16)
    if (thirtytwo) K3_SKINNY_RPW32_CONFIGS(K3_AT_ADD32)
#undef K3_AT_ADD
#undef K3_AT_ADD16
#undef K3_AT_ADD32
    return v;
}

/* The split-K candidates for one shape: for each split template, the smallest kcta >= 2
 * whose grid reaches 2x the SM count and the smallest larger one reaching 4x, each CTA
 * keeping at least half a step (warps x unroll chunks of 32 k) of work. Shapes whose classic
 * grid already has >= 8 CTAs per SM get none. */
static std::vector<k3t_cand> split_cands(const Shape &s, int sms) {
    std::vector<k3t_cand> v;
    const int nchunk = (s.K / 8 + 3) / 4;
#define K3_AT_SPLIT(T, R, U)                                                               \
    {                                                                                      \
        const long tiles = (s.N + (R) - 1) / (R);                                          \
        const int kw = k3_skinny_split_k(T, R);                                            \
        int last = 1;                                                                      \
        if (tiles < 8L * sms)                                                              \
            for (int target : {2, 4})                                                      \
                for (int k = last + 1; k <= K3_SKINNY_MAX_KCTA; k++) {                     \
                    if (2L * nchunk < (long)k * kw * (U)) break;                           \
                    if (tiles * k >= (long)target * sms) {                                 \
                        v.push_back(k3t_cand{K3T_SPLIT, T, R, U, k, K3T_PDL_STATIC, 0});   \
                        last = k;                                                          \
                        break;                                                             \
                    }                                                                      \
                }                                                                          \
    }
    K3_SKINNY_SPLIT_CONFIGS(K3_AT_SPLIT)
#undef K3_AT_SPLIT
    return v;
}

struct Result {
    Shape s;
    int M;
    double cublas_us, best_us;   /* search pass */
    double pass_cublas[2], pass_us[2];
    k3t_cand best;
    bool have_best, kept;
    int failed;
};

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

/* "8,16,32" -> {8, 16, 32}: budgets in MiB, comma-separated, each an integer in
 * 0..K3_SKINNY_MAX_L2_PREFETCH_MB, none twice; 0 (the searched configuration itself) is dropped,
 * so "0" means no prefetch variants. Anything else exits 2 naming the item. */
static std::vector<int> parse_prefetch(const char *s) {
    std::vector<int> v;
    const char *p = s;
    while (*p) {
        char *end = nullptr;
        const long mb = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || mb < 0 || mb > K3_SKINNY_MAX_L2_PREFETCH_MB ||
            (mb > 0 && std::find(v.begin(), v.end(), (int)mb) != v.end())) {
            fprintf(stderr, "autotune: --l2-prefetch: bad budget near '%s' (want distinct MiB in "
                            "0..%d, comma-separated; got '%s')\n", p, K3_SKINNY_MAX_L2_PREFETCH_MB, s);
            exit(2);
        }
        if (mb > 0) v.push_back((int)mb);
        p = *end ? end + 1 : end;
    }
    return v;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: autotune [--shapes NxK,...] [--m 1-16] [--out FILE.lua] [--table FILE]\n"
            "                [--csv FILE] [--device N] [--reps R] [--min-speedup 1.05]\n"
            "                [--kinds classic,classic16,classic32,split,balanced] [--epilogue silu_mul]\n"
            "                [--all-m]\n"
            "                [--l2-prefetch 8,16,32] [--dry-run]\n"
            "Defaults: the Kimi-K3 TP8 shapes of DESIGN.md and 7168x7168, M = 1..16, every kind,\n"
            "--out lua/k3/policy/sm<cc>.lua, --table build/autotune.txt, --csv build/autotune.csv,\n"
            "--l2-prefetch 8,16,32 (MiB of w prefetched into L2, tried on each fastest configuration;\n"
            "0 for none).\n");
}

int main(int argc, char **argv) {
    std::vector<Shape> shapes(KIMI, KIMI + sizeof KIMI / sizeof KIMI[0]);
    std::vector<int> ms = parse_ms("1-16");
    std::vector<int> prefetch = parse_prefetch("8,16,32");
    std::string out_path, table_path = "build/autotune.txt", csv_path = "build/autotune.csv";
    std::string kinds = "classic,classic16,classic32,split,balanced";
    std::string epilogue; /* "" or "silu_mul" */
    int device = 0, reps = 15;
    double min_speedup = 1.05;
    bool all_m = false, dry = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&](void) -> const char * {
            if (i + 1 >= argc) {
                usage(stderr);
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            usage(stdout);
            return 0;
        }
        if (a == "--shapes") shapes = parse_shapes(val());
        else if (a == "--m") ms = parse_ms(val());
        else if (a == "--out") out_path = val();
        else if (a == "--table") table_path = val();
        else if (a == "--csv") csv_path = val();
        else if (a == "--device") device = atoi(val());
        else if (a == "--reps") reps = std::max(3, atoi(val()));
        else if (a == "--min-speedup") min_speedup = atof(val());
        else if (a == "--kinds") kinds = val();
        else if (a == "--epilogue") epilogue = val();
        else if (a == "--l2-prefetch") prefetch = parse_prefetch(val());
        else if (a == "--all-m") all_m = true;
        else if (a == "--dry-run") dry = true;
        else {
            usage(stderr);
            return 2;
        }
    }
    const std::string kl = "," + kinds + ",";
    /* every kind named is one of the five; balanced re-runs the classic kinds' candidates, so
     * it needs one of them (alone it would measure nothing and write a plan without skinny
     * entries over the policy file) */
    for (size_t a = 0; a < kinds.size();) {
        size_t e = kinds.find(',', a);
        if (e == std::string::npos) e = kinds.size();
        const std::string k = kinds.substr(a, e - a);
        if (k != "classic" && k != "classic16" && k != "classic32" && k != "split" &&
            k != "balanced") {
            fprintf(stderr, "autotune: --kinds: unknown kind '%s' (expected classic, classic16, classic32, "
                            "split or balanced)\n", k.c_str());
            return 2;
        }
        a = e + 1;
    }
    const bool use_classic = kl.find(",classic,") != std::string::npos;
    const bool use_classic16 = kl.find(",classic16,") != std::string::npos;
    const bool use_classic32 = kl.find(",classic32,") != std::string::npos;
    if (kl.find(",balanced,") != std::string::npos && !use_classic && !use_classic16 &&
        !use_classic32) {
        fprintf(stderr, "autotune: --kinds balanced runs the classic candidates on the balanced "
                        "grid: name classic, classic16 or classic32 with it (got '%s')\n",
                kinds.c_str());
        return 2;
    }
    /* the balanced grid carries no epilogue */
    const bool use_balanced = kl.find(",balanced,") != std::string::npos && epilogue.empty();
    const bool epi = epilogue == "silu_mul";
    if (!epilogue.empty() && !epi) {
        fprintf(stderr, "autotune: --epilogue must be silu_mul (got '%s')\n", epilogue.c_str());
        return 2;
    }
    /* The epilogue runs in the kernel on classic tiles only (split-K goes through a temporary). */
    const bool use_split = !epi && kl.find(",split,") != std::string::npos;
    for (const Shape &s : shapes)
        if (epi && s.N % 2) {
            fprintf(stderr, "autotune: --epilogue silu_mul needs an even N (gate | up rows); got %dx%d\n",
                    s.N, s.K);
            return 2;
        }

    CK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    const int sms = prop.multiProcessorCount;
    char arch[16];
    snprintf(arch, sizeof arch, "sm%d%d", prop.major, prop.minor);
    if (out_path.empty())
        out_path = std::string("lua/k3/policy/") + arch + (epi ? "_silu_mul" : "") + ".lua";
    int rt = 0, drv = 0, blas_ver = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));

    k3t_timer t;
    k3t_timer_init(t, reps, 3);
    cublasHandle_t h = k3t_cublas(t.s, &blas_ver);
    const double copy_tbs = k3t_copy_tbs(t);
    const size_t l2 = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : (size_t)60 << 20;

    char machine[512];
    snprintf(machine, sizeof machine,
             "%s, %d SMs, %.0f MB L2, CUDA runtime %d, driver %d, cuBLAS %d, copy %.2f TB/s",
             prop.name, sms, l2 / 1e6, rt, drv, blas_ver, copy_tbs);
    fprintf(stderr, "autotune: %s\n", machine);
    k3t_scratch scr;
    k3t_scratch_init(scr);
    const std::vector<k3t_cand> classic = classic_cands(use_classic, use_classic16, use_classic32);

    std::vector<Result> results;
    FILE *csv = fopen(csv_path.c_str(), "w");
    if (csv) fprintf(csv, "N,K,M,pass,candidate,us,status\n");
    const int total = (int)(shapes.size() * ms.size());
    int done = 0;
    const time_t t_start = time(nullptr);
    const bool tty = isatty(2) != 0;

    for (const Shape &s : shapes) {
        k3t_shape b;
        k3t_shape_alloc(b, s.N, s.K, l2, t.s, epi);
        std::vector<k3t_cand> cands = classic;
        /* each classic candidate on the balanced grid, where that grid is not its tiling */
        if (use_balanced)
            for (const k3t_cand &c : classic)
                if (k3_skinny_balanced_grid(s.N, c.rows, sms) != (s.N + c.rows - 1) / c.rows) {
                    k3t_cand b = c;
                    b.balanced = 1;
                    cands.push_back(b);
                }
        if (use_split)
            for (const k3t_cand &c : split_cands(s, sms)) cands.push_back(c);
        std::vector<uint16_t> href;
        for (int M : ms) {
            auto cublas = [&](const uint16_t *x, const uint16_t *w, uint16_t *y) {
                return k3t_cublas_call(h, b, x, w, y, M, t.s) ? cudaSuccess : cudaErrorUnknown;
            };
            auto launcher = [&](const k3t_cand &c) {
                return [&, c](const uint16_t *x, const uint16_t *w, uint16_t *y) {
                    return k3t_launch(c, scr, x, w, y, M, s.N, s.K, t.s, epi);
                };
            };
            k3t_reference(h, b, M, t.s, href);
            Result r = {};
            r.s = s;
            r.M = M;
            r.cublas_us = k3t_time_chain(t, b, cublas);
            if (r.cublas_us < 0) {
                fprintf(stderr, "\nautotune: cuBLAS could not be captured for %dx%d M=%d\n", s.N,
                        s.K, M);
                return 1;
            }
            if (csv) fprintf(csv, "%d,%d,%d,search,cublas,%.3f,ok\n", s.N, s.K, M, r.cublas_us);
            /* Checks the candidate against cuBLAS, times it when it passes, records it (csv
             * column "pass" = stage) and makes it the best when it is the fastest so far. The
             * chain check (PDL ordering) runs at the M extremes only: it covers both token-tile
             * instantiations and keeps the run short. */
            auto try_cand = [&](const k3t_cand &c, const char *stage) {
                const std::string name = k3t_cand_name(c);
                const char *status = k3t_check(h, b, M, t.s, href, name,
                                               c.mode != K3T_PLAIN && (M == 1 || M == 16),
                                               launcher(c));
                double us = -1;
                if (!strcmp(status, "ok")) {
                    us = k3t_time_chain(t, b, launcher(c));
                    if (us < 0) status = "capture-failed";
                }
                if (strcmp(status, "ok")) r.failed++;
                if (csv)
                    fprintf(csv, "%d,%d,%d,%s,%s,%.3f,%s\n", s.N, s.K, M, stage, name.c_str(), us,
                            status);
                if (us > 0 && (!r.have_best || us < r.best_us)) {
                    r.have_best = true;
                    r.best_us = us;
                    r.best = c;
                }
            };
            for (const k3t_cand &c : cands)
                if (k3t_cand_fits(c, scr, M, s.N)) try_cand(c, "search");
            /* The search's fastest again with each L2 prefetch budget. */
            if (r.have_best) {
                const k3t_cand searched = r.best;
                for (int mb : prefetch) {
                    k3t_cand c = searched;
                    c.l2_prefetch_mb = mb;
                    try_cand(c, "prefetch");
                }
            }
            /* The two confirmation passes: cuBLAS, then the best candidate, fresh graphs. */
            r.kept = r.have_best;
            for (int pass = 0; pass < 2 && r.have_best; pass++) {
                r.pass_cublas[pass] = k3t_time_chain(t, b, cublas);
                r.pass_us[pass] = k3t_time_chain(t, b, launcher(r.best));
                if (csv)
                    fprintf(csv, "%d,%d,%d,%d,cublas,%.3f,ok\n%d,%d,%d,%d,%s,%.3f,ok\n", s.N, s.K,
                            M, pass + 1, r.pass_cublas[pass], s.N, s.K, M, pass + 1,
                            k3t_cand_name(r.best).c_str(), r.pass_us[pass]);
                if (!(r.pass_us[pass] > 0 && r.pass_cublas[pass] >= min_speedup * r.pass_us[pass]))
                    r.kept = false;
            }
            results.push_back(r);
            done++;
            fprintf(stderr,
                    "%s[%3d/%3d %4lds] %5dx%-5d M=%-2d best %7.2f us (%s) cuBLAS %7.2f; passes "
                    "%.2fx %.2fx%s%s",
                    tty ? "\r" : "", done, total, (long)(time(nullptr) - t_start), s.N, s.K, M,
                    r.best_us, r.have_best ? k3t_cand_name(r.best).c_str() : "-", r.cublas_us,
                    r.have_best ? r.pass_cublas[0] / r.pass_us[0] : 0.0,
                    r.have_best ? r.pass_cublas[1] / r.pass_us[1] : 0.0, r.kept ? " kept" : "",
                    tty ? "   " : "\n");
            fflush(stderr);
        }
        k3t_shape_free(b);
    }
    if (tty) fprintf(stderr, "\n");
    if (csv) fclose(csv);

    char date[64];
    const time_t now = time(nullptr);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    std::string prefetch_list;
    for (int mb : prefetch) prefetch_list += (prefetch_list.empty() ? "" : ",") + std::to_string(mb);
    prefetch_list = prefetch_list.empty() ? "none" : prefetch_list + " MiB";
    char method[1024];
    snprintf(method, sizeof method,
             "scripts/autotune: CUDA graph of >= 20 back-to-back calls chained through x (each "
             "reads the previous y), weights rotated over copies totalling >= 4x L2, median of "
             "%d replays after %d warm-up, random non-zero bf16 data, every candidate checked "
             "against cuBLAS (cublasGemmEx bf16, fp32 compute) before timing; the fastest kept "
             "where cuBLAS/skinny >= %.2f in two more passes, each cuBLAS then the candidate; "
             "skinny launch: PDL, static weights; kinds %s; L2 prefetch budgets tried on the "
             "fastest: %s%s",
             t.reps, t.warm, min_speedup, kinds.c_str(), prefetch_list.c_str(),
             epi ? "; epilogue silu_mul: each call writes h = silu(gate) * up in the kernel, "
                   "against cuBLAS then a separate silu_mul kernel"
                 : "");

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
                "-- An entry exists only where the skinny kernel beat cuBLAS by >= %.0f%% in two\n"
                "-- timing passes interleaved with cuBLAS (us and cublas_us: the slower pass of the\n"
                "-- kernel, the faster of cuBLAS), launched with PDL and static weights as k3.nn runs\n"
                "-- it. config.split_k = K-slices per row group = kw * kcta (kw = threads / 32 /\n"
                "-- (rows / rows_per_warp) warps of a CTA, kcta CTAs along K; kcta >= 2: split-K\n"
                "-- across CTAs); rows_per_warp = 16 or 32: each warp streams two or four 8-row\n"
                "-- groups;\n"
                "-- balanced = true: the grid is a multiple of the SM count, each CTA taking an\n"
                "-- equal share of at most `rows` rows (kernels/linear_skinny.cuh).\n%s",
                epi ? (std::string(arch) + "_silu_mul").c_str() : arch, arch,
                (min_speedup - 1) * 100,
                epi ? "-- These plans are for the SwiGLU gate_up call with {epilogue = \"silu_mul\"}\n"
                      "-- (w = gate rows | up rows, the call writes silu(gate) * up): the kernel\n"
                      "-- applies the epilogue itself, cuBLAS is followed by a silu_mul kernel;\n"
                      "-- k3.plan_for(w, {epilogue = \"silu_mul\"}) reads them.\n"
                    : "");
        fprintf(f, "return {\n  arch = \"%s\",\n  machine = \"%s\",\n  date = \"%s\",\n",
                arch, machine, date);
        fprintf(f, "  method = \"%s\",\n  plans = {\n", method);
        for (const Shape &s : shapes) {
            bool any = false;
            for (const Result &r : results)
                if (r.s.N == s.N && r.s.K == s.K && r.kept) any = true;
            if (!any) {
                /* An epilogue plan keeps the measured shape as an empty table: k3.plan_for then
                 * answers nil (cuBLAS) instead of falling back to the plain plan's entries. */
                if (epi)
                    fprintf(f, "    [\"%dx%d\"] = {}, -- cuBLAS wins at every M measured\n", s.N, s.K);
                else
                    fprintf(f, "    -- %dx%d: cuBLAS wins at every M measured\n", s.N, s.K);
                continue;
            }
            fprintf(f, "    [\"%dx%d\"] = {\n", s.N, s.K);
            for (const Result &r : results) {
                if (r.s.N != s.N || r.s.K != s.K || !r.kept) continue;
                fprintf(f,
                        "      [%d] = {kernel = \"skinny\", config = %s, us = %.2f, cublas_us = "
                        "%.2f},\n",
                        r.M, k3t_cand_config(r.best).c_str(), std::max(r.pass_us[0], r.pass_us[1]),
                        std::min(r.pass_cublas[0], r.pass_cublas[1]));
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
    const char *hdr = "shape          M  best_us  cublas_us  ratio  pass1  pass2  plan    candidate\n";
    printf("%s\n%s", machine, hdr);
    if (tf) fprintf(tf, "%s\n%s  %s\n%s", machine, date, method, hdr);
    double lg1 = 0, lg16 = 0, pl1 = 0, pl16 = 0;
    int n1 = 0, n16 = 0, kept = 0;
    for (const Result &r : results) {
        const double ratio = r.have_best ? r.cublas_us / r.best_us : 0;
        const double p1 = r.have_best ? r.pass_cublas[0] / r.pass_us[0] : 0;
        const double p2 = r.have_best ? r.pass_cublas[1] / r.pass_us[1] : 0;
        char line[320];
        snprintf(line, sizeof line, "%5dx%-6d %3d  %7.2f  %9.2f  %5.2f  %5.2f  %5.2f  %-6s  %s\n",
                 r.s.N, r.s.K, r.M, r.best_us, r.cublas_us, ratio, p1, p2,
                 r.kept ? "skinny" : "cublas", r.have_best ? k3t_cand_name(r.best).c_str() : "-");
        if (tf) fputs(line, tf);
        if (all_m || r.M == 1 || r.M == 2 || r.M == 4 || r.M == 8 || r.M == 16) fputs(line, stdout);
        kept += r.kept;
        const double plan_ratio = r.kept ? std::min(p1, p2) : 1.0;
        if (r.M == 1 && r.have_best) lg1 += std::log(ratio), pl1 += std::log(plan_ratio), n1++;
        if (r.M == 16 && r.have_best) lg16 += std::log(ratio), pl16 += std::log(plan_ratio), n16++;
    }
    char sum[512];
    snprintf(sum, sizeof sum,
             "geomean cuBLAS/best: M=1 %.3fx (plan %.3fx) over %d shapes; M=16 %.3fx (plan "
             "%.3fx) over %d shapes; %d of %zu entries kept; %d candidate failures; plan file "
             "%s%s\n",
             n1 ? std::exp(lg1 / n1) : 0.0, n1 ? std::exp(pl1 / n1) : 0.0, n1,
             n16 ? std::exp(lg16 / n16) : 0.0, n16 ? std::exp(pl16 / n16) : 0.0, n16, kept,
             results.size(), failures, out_path.c_str(), dry ? " (dry run: not written)" : "");
    fputs(sum, stdout);
    if (tf) {
        fputs(sum, tf);
        fclose(tf);
    }
    cublasDestroy(h);
    return failures ? 3 : 0;
}
