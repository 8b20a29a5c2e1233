/*
 * read_limit.cu — `build/read-limit --bytes B1,B2,... [--json FILE] [--reps R] [--single]`: the
 * read limit of each byte count on the current GPU (tools/read_limit.cuh), for `scripts/bench
 * linear` and, with --single, `scripts/bench stack` (one read over a decode step's bytes).
 *
 * For each B (a positive multiple of 16): random non-zero data in copies of B bytes totalling
 * >= 4x the L2 (at least K3T_MIN_COPIES), a CUDA graph of L = max(20, copies) back-to-back reads (read j
 * streams copy j % copies), median of R replays / L, for every launch shape of
 * k3t_read_shapes(); the read limit is the best shape's time, plain, chained with PDL, and
 * chained with PDL through a data dependency (each read's write waits on a load of the
 * previous read's output: read_limit.cuh's dependent chain, the floor of a decode chain).
 * Writes one JSON object: {"machine": "...", "method": "...", "results": [{"bytes": B,
 * "read_us": t, "read_shape": "c2t512u8stride", "read_pdl_us": t, "read_pdl_shape": "...",
 * "read_dep_us": t, "read_dep_shape": "..."}, ...]} to FILE (default stdout); progress and
 * errors go to stderr.
 *
 * --single: for byte counts far above the L2 (a whole decode step's weights, tens of GB): one
 * buffer of B bytes (B >= 4x the L2, so no read finds the previous one's data in it), a graph
 * of 2 back-to-back plain reads of it, median of R replays / 2; the rest as above. No PDL
 * figure (read_pdl_us is null): chained with PDL the two reads of one buffer run together and
 * the second finds the first's lines in L2, which once timed 22.5 GB at 8.5 TB/s.
 */
#define K3_TOOL_NAME "read-limit"
#include "bench_common.cuh"
#include "read_limit.cuh"

#include <string>

int main(int argc, char **argv) {
    std::vector<long long> sizes;
    const char *json_path = nullptr;
    int reps = 15;
    bool single = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--bytes" && i + 1 < argc) {
            const char *s = argv[++i];
            while (*s) {
                long long b = 0;
                int used = 0;
                if (sscanf(s, "%lld%n", &b, &used) != 1 || b <= 0 || b % 16) {
                    fprintf(stderr, "read-limit: bad --bytes near '%s' (positive multiples of 16)\n", s);
                    return 2;
                }
                sizes.push_back(b);
                s += used;
                if (*s == ',') s++;
            }
        } else if (a == "--json" && i + 1 < argc) {
            json_path = argv[++i];
        } else if (a == "--single") {
            single = true;
        } else if (a == "--reps" && i + 1 < argc) {
            reps = std::max(3, atoi(argv[++i]));
        } else {
            fprintf(stderr, "usage: read-limit --bytes B1,B2,... [--json FILE] [--reps 15] [--single]\n");
            return 2;
        }
    }
    if (sizes.empty()) {
        fprintf(stderr, "read-limit: --bytes is required\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const size_t l2 = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : (size_t)60 << 20;
    k3t_timer t;
    k3t_timer_init(t, reps, 3);
    int rt = 0, drv = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    const std::vector<k3t_read_shape> shapes = k3t_read_shapes();
    int64_t words = 0;
    for (const auto &r : shapes) words = std::max(words, k3t_read_out_words(r, sms));
    unsigned *out = nullptr;
    CK(cudaMalloc(&out, 2 * words * sizeof(unsigned)));
    CK(cudaMemset(out, 0, 2 * words * sizeof(unsigned)));

    std::string res = "[";
    for (size_t si = 0; si < sizes.size(); si++) {
        const size_t bytes = (size_t)sizes[si];
        if (single && bytes < 4 * l2) {
            fprintf(stderr, "read-limit: --single needs byte counts >= 4x the L2 (%zu); got %zu\n",
                    4 * l2, bytes);
            return 2;
        }
        const int copies =
            single ? 1 : (int)std::max<size_t>(K3T_MIN_COPIES, (4 * l2 + bytes - 1) / bytes + 1);
        const int L = single ? 2 : std::max(20, copies);
        uint16_t *buf = nullptr;
        CK(cudaMalloc(&buf, bytes * copies));
        k3t_fill(buf, bytes / 2 * copies, 4242 + si, 1.0f, t.s);
        CK(cudaStreamSynchronize(t.s));
        double best[3] = {1e30, 0, 0};
        std::string best_name[3];
        for (int mode = 0; mode < (single ? 1 : 3); mode++) {
            k3t_read_shape r = {};
            best[mode] = k3t_read_limit(t, sms, buf, bytes, copies, L, out, mode != 0, &r,
                                        [](const k3t_read_shape &, double) {}, mode == 2,
                                        2 * words);
            best_name[mode] = k3t_read_shape_name(r);
        }
        CK(cudaFree(buf));
        if (best[0] > 1e29 || (!single && (best[1] > 1e29 || best[2] > 1e29))) {
            fprintf(stderr, "read-limit: no launch shape could be timed for %zu bytes\n", bytes);
            return 1;
        }
        char item[448];
        if (single) {
            fprintf(stderr, "read-limit: %zu bytes: %.2f us (%s), one plain read\n", bytes, best[0],
                    best_name[0].c_str());
            snprintf(item, sizeof item,
                     "%s{\"bytes\": %zu, \"read_us\": %.4f, \"read_shape\": \"%s\", "
                     "\"read_pdl_us\": null, \"read_pdl_shape\": null, \"read_dep_us\": null, "
                     "\"read_dep_shape\": null}",
                     si ? ", " : "", bytes, best[0], best_name[0].c_str());
        } else {
            fprintf(stderr,
                    "read-limit: %zu bytes: %.2f us (%s), chained with PDL %.2f us (%s), "
                    "dependent chain %.2f us (%s)\n",
                    bytes, best[0], best_name[0].c_str(), best[1], best_name[1].c_str(), best[2],
                    best_name[2].c_str());
            snprintf(item, sizeof item,
                     "%s{\"bytes\": %zu, \"read_us\": %.4f, \"read_shape\": \"%s\", "
                     "\"read_pdl_us\": %.4f, \"read_pdl_shape\": \"%s\", \"read_dep_us\": %.4f, "
                     "\"read_dep_shape\": \"%s\"}",
                     si ? ", " : "", bytes, best[0], best_name[0].c_str(), best[1],
                     best_name[1].c_str(), best[2], best_name[2].c_str());
        }
        res += item;
    }
    res += "]";
    char head[768];
    snprintf(head, sizeof head,
             "{\"machine\": \"%s, %d SMs, %.0f MB L2, CUDA runtime %d, driver %d\", \"method\": "
             "\"read-only 16-byte loads over exactly the bytes, best of %zu launch shapes, CUDA "
             "graph of %s, median of %d replays\", \"results\": ",
             prop.name, sms, l2 / 1e6, rt, drv, shapes.size(),
             single ? "2 back-to-back plain reads of one buffer (bytes >= 4x L2), no PDL"
                    : ">= 20 back-to-back reads over copies totalling >= 4x L2",
             reps);
    FILE *f = json_path ? fopen(json_path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "read-limit: cannot write %s\n", json_path);
        return 1;
    }
    fprintf(f, "%s%s}\n", head, res.c_str());
    if (json_path) fclose(f);
    return 0;
}
