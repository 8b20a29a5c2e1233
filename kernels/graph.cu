/*
 * graph.cu — CUDA graph capture and replay of this thread's stream, for the benchmarks
 * (scripts/bench): replaying a captured sequence of calls shows kernel time without the
 * per-launch host overhead, the way every figure in bench/ is taken (bench/README.md).
 */
#include "common.cuh"

#include <new>

namespace {
struct graph_handle {
    int dev;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStream_t stream;
};
} // namespace

k3_status k3c_graph_begin(int dev) {
    cudaStream_t s;
    K3_TRY(k3c_stream(dev, &s));
    /* Thread-local mode: other threads' unsafe calls do not invalidate this capture. */
    K3_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    return K3_OK;
}

k3_status k3c_graph_end(int dev, void **out) {
    *out = nullptr;
    cudaStream_t s;
    K3_TRY(k3c_stream(dev, &s));
    cudaGraph_t g = nullptr;
    K3_CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    if (e != cudaSuccess) {
        cudaGraphDestroy(g);
        return k3c_check(e, "cudaGraphInstantiate(&exec, g, 0)", __FILE__, __LINE__);
    }
    graph_handle *h = new (std::nothrow) graph_handle{dev, g, exec, s};
    if (!h) {
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
        return k3_error(K3_ENOMEM, "graph_end: out of host memory");
    }
    *out = h;
    return K3_OK;
}

k3_status k3c_graph_replay(void *graph, int n) {
    if (!graph) return k3_error(K3_EINVAL, "graph_replay: graph is NULL");
    graph_handle *h = (graph_handle *)graph;
    K3_CHECK(cudaSetDevice(h->dev));
    for (int i = 0; i < n; i++) K3_CHECK(cudaGraphLaunch(h->exec, h->stream));
    return K3_OK;
}

void k3c_graph_free(void *graph) {
    if (!graph) return;
    graph_handle *h = (graph_handle *)graph;
    if (cudaSetDevice(h->dev) != cudaSuccess) (void)cudaGetLastError();
    if (cudaGraphExecDestroy(h->exec) != cudaSuccess) (void)cudaGetLastError();
    if (cudaGraphDestroy(h->graph) != cudaSuccess) (void)cudaGetLastError();
    delete h;
}
