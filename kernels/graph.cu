/*
 * graph.cu — CUDA graph capture and replay of this thread's stream: what k3_graph_capture
 * (lib/graph.c) and the benchmarks' timing (lib/timing.c, k3_cuda_time with graph) build on.
 * A capture that fails anywhere is ended and discarded (k3c_graph_abandon), so the stream is
 * usable afterwards; the blocks the allocator handed to a capture (memory.cu) belong to its
 * graph and go back to the cache when it is destroyed.
 */
#include "common.cuh"

#include <new>

namespace {
struct graph_handle {
    int dev;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStream_t stream; /* the captured stream: replays run on it */
    std::vector<k3c_held_block> blocks;
    int kernels;
};

/* Kernel nodes of g (0 when it cannot be read). */
int count_kernels(cudaGraph_t g) {
    size_t n = 0;
    if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    std::vector<cudaGraphNode_t> nodes(n);
    if (n && cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess) {
            if (t == cudaGraphNodeTypeKernel) k++;
        } else {
            (void)cudaGetLastError();
        }
    }
    return k;
}
} // namespace

k3_status k3c_graph_begin(int dev) {
    cudaStream_t s;
    K3_TRY(k3c_stream(dev, &s));
    /* Thread-local mode: other threads' unsafe calls do not invalidate this capture. */
    K3_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    return K3_OK;
}

void k3c_graph_abandon(int dev) {
    cudaStream_t s;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", k3_last_error());
    if (k3c_stream(dev, &s) != K3_OK) {
        k3_error(K3_OK, "%s", saved);
        return;
    }
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = nullptr;
        /* An invalidated capture ends with an error and no graph: both are expected here. */
        if (cudaStreamEndCapture(s, &g) != cudaSuccess) (void)cudaGetLastError();
        if (g && cudaGraphDestroy(g) != cudaSuccess) (void)cudaGetLastError();
    }
    (void)cudaGetLastError();
    std::vector<k3c_held_block> blocks;
    k3c_memory_capture_take(dev, s, &blocks);
    k3c_memory_give_back(dev, blocks); /* nothing captured will run */
    k3_error(K3_OK, "%s", saved);
}

k3_status k3c_graph_end(int dev, void **out) {
    *out = nullptr;
    cudaStream_t s;
    K3_TRY(k3c_stream(dev, &s));
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    std::vector<k3c_held_block> blocks;
    k3c_memory_capture_take(dev, s, &blocks);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        k3c_memory_give_back(dev, blocks);
        return k3c_check(e, "cudaStreamEndCapture(s, &g) (the capture was invalidated)",
                         __FILE__, __LINE__);
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, g, 0);
    if (e == cudaSuccess) e = cudaGraphUpload(exec, s); /* the first replay pays no upload */
    if (e != cudaSuccess) {
        if (exec) cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
        k3c_memory_give_back(dev, blocks);
        return k3c_check(e, "cudaGraphInstantiate(&exec, g, 0) / cudaGraphUpload(exec, s)",
                         __FILE__, __LINE__);
    }
    graph_handle *h = new (std::nothrow) graph_handle{dev, g, exec, s, {}, count_kernels(g)};
    if (!h) {
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
        k3c_memory_give_back(dev, blocks);
        return k3_error(K3_ENOMEM, "graph_end: out of host memory");
    }
    h->blocks.swap(blocks);
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

int k3c_graph_kernels(void *graph) { return graph ? ((graph_handle *)graph)->kernels : 0; }

void k3c_graph_free(void *graph) {
    if (!graph) return;
    graph_handle *h = (graph_handle *)graph;
    if (cudaSetDevice(h->dev) != cudaSuccess) (void)cudaGetLastError();
    /* Replays still queued finish before the graph's blocks (and, in lib/graph.c, the
     * storages it holds) can serve other work on any stream. */
    if (cudaStreamSynchronize(h->stream) != cudaSuccess) (void)cudaGetLastError();
    if (cudaGraphExecDestroy(h->exec) != cudaSuccess) (void)cudaGetLastError();
    if (cudaGraphDestroy(h->graph) != cudaSuccess) (void)cudaGetLastError();
    k3c_memory_give_back(h->dev, h->blocks);
    delete h;
}
