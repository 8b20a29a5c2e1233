/*
 * kernel_trace.cpp — a CUPTI activity tracer that the CUDA driver loads into a program
 * (scripts/step-trace): every kernel the program runs, graph nodes included, with its start
 * and end on the GPU's clock, one CSV row per kernel.
 *
 *   CUDA_INJECTION64_PATH=build/libk3-kernel-trace.so K3_KERNEL_TRACE=out.csv program ...
 *
 * The driver calls InitializeInjection() during cuInit (the entry point CUPTI-based tools
 * use), so only processes that start CUDA load it, and CUPTI starts outside any library
 * constructor.
 *
 * Columns: graph_id, graph_node_id, correlation_id (one per launch: every node of one graph
 * replay shares its cudaGraphLaunch's), start_ns, end_ns, grid (x*y*z CTAs), block (threads),
 * cluster (CTAs), registers, static + dynamic shared memory (bytes), name (demangled, without
 * its parameter list; commas replaced by ';'). Kernels are recorded as
 * CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (CUPTI's mode that does not serialize kernels); how much
 * tracing changes the timing, scripts/step-trace measures (the same replays untraced).
 * Buffers are flushed every 100 ms, when a context is destroyed and at exit; the file is
 * created at the first kernel (a child process that runs none writes nothing). Without
 * K3_KERNEL_TRACE the library does nothing. Errors go to stderr prefixed "kernel-trace:"; a
 * failure to enable CUPTI leaves the program running untraced and writes no file.
 */
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

std::FILE *g_out = nullptr;
const char *g_path = nullptr; /* K3_KERNEL_TRACE; the file is created at the first kernel */
bool g_failed = false;
std::mutex g_mu;
unsigned long long g_rows = 0, g_dropped = 0;
const size_t kBufBytes = 8u << 20;

/* "void k3_skinny_kernel<512, 16, 8, 1, false, 2>(k3_skinny_params)" -> the part before the
 * parameter list, commas as ';' so the CSV stays one field. */
std::string short_name(const char *mangled) {
    if (!mangled) return "?";
    int st = 0;
    char *d = abi::__cxa_demangle(mangled, nullptr, nullptr, &st);
    std::string s = st == 0 && d ? d : mangled;
    std::free(d);
    /* the parameter list is the last top-level "(...)" */
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
        if (s[i] == ')') depth++;
        else if (s[i] == '(' && --depth == 0) { s.resize(i); break; }
    }
    if (s.rfind("void ", 0) == 0) s.erase(0, 5);
    for (char &c : s) if (c == ',') c = ';';
    return s;
}

void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = static_cast<uint8_t *>(std::aligned_alloc(8, kBufBytes));
    *size = *buf ? kBufBytes : 0;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(g_mu);
    CUpti_Activity *rec = nullptr;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(rec);
        if (!g_out && !g_failed) {
            g_out = std::fopen(g_path, "w");
            if (!g_out) {
                g_failed = true;
                std::fprintf(stderr, "kernel-trace: cannot write %s\n", g_path);
            } else {
                std::fprintf(g_out, "graph_id,graph_node_id,correlation_id,start_ns,end_ns,grid,"
                                    "block,cluster,registers,shared_bytes,name\n");
            }
        }
        if (g_out) {
            std::fprintf(g_out, "%u,%llu,%u,%llu,%llu,%lld,%d,%u,%u,%d,%s\n", k->graphId,
                         (unsigned long long)k->graphNodeId, k->correlationId,
                         (unsigned long long)k->start, (unsigned long long)k->end,
                         (long long)k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                         k->clusterX * k->clusterY * k->clusterZ, (unsigned)k->registersPerThread,
                         k->staticSharedMemory + k->dynamicSharedMemory, short_name(k->name).c_str());
            g_rows++;
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
    std::free(buf);
}

/* Flush before a context goes away: its records are lost after. */
void CUPTIAPI on_resource(void *, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void *) {
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

bool ok(CUptiResult r, const char *what) {
    if (r == CUPTI_SUCCESS) return true;
    const char *msg = "?";
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "kernel-trace: %s failed: %s\n", what, msg);
    return false;
}

void start() {
    const char *path = std::getenv("K3_KERNEL_TRACE");
    if (!path || !*path) return;
    if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
            "cuptiActivityRegisterCallbacks") ||
        !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
            "cuptiActivityEnable(CONCURRENT_KERNEL)"))
        return;
    CUpti_SubscriberHandle sub;
    if (ok(cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_resource, nullptr), "cuptiSubscribe"))
        ok(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                               CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING),
           "cuptiEnableCallback");
    /* a worker thread completes buffers every 100 ms, so a program that exits without
     * tearing its context down loses at most its last 100 ms (scripts/step-trace waits that
     * long before exiting) */
    ok(cuptiActivityFlushPeriod(100), "cuptiActivityFlushPeriod");
    g_path = path;
}

__attribute__((destructor)) void finish() {
    if (!g_path) return;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_out) return;
    std::fclose(g_out);
    g_out = nullptr;
    g_failed = true; /* a buffer CUPTI completes after this must not create the file again */
    std::fprintf(stderr, "kernel-trace: %llu kernels written to %s%s\n", g_rows,
                 g_path,
                 g_dropped ? " (some records dropped: CUPTI's buffers were full)" : "");
    if (g_dropped) std::fprintf(stderr, "kernel-trace: %llu records dropped\n", g_dropped);
}

} // namespace

/* Called by the CUDA driver in cuInit when CUDA_INJECTION64_PATH names this library. */
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
    start();
    return 1;
}
