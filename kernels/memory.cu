/*
 * memory.cu — the backend's caching allocator over plain cudaMalloc: one pool per device,
 * freed blocks kept by size class and handed out again in stream order, empty_cache()
 * returning them to the driver, and out-of-memory reported as a recoverable K3_ENOMEM
 * after the cache has been emptied and the allocation retried. While a stream is being
 * captured into a CUDA graph, allocations are served from the cache only (never cudaMalloc),
 * and blocks freed during the capture are reused only inside that capture, then belong to
 * the graph until it is freed (k3c_memory_capture_take / k3c_memory_give_back).
 */
#include "common.cuh"

#include <mutex>
#include <new>
#include <stdio.h>
#include <unordered_map>
#include <vector>

namespace {

/* A freed block. It may be handed out again on `stream` at once (stream order protects it)
 * and on another stream once `event` (recorded at free time on the freeing thread's
 * stream) has completed. While one stream is all a pool has seen, frees record no event
 * (a cudaEventRecord on every free is a driver call per op for nothing): such a block is
 * reused only on its own stream, or returned to the driver by release_cached. */
struct cached_block {
    void *ptr;
    cudaStream_t stream;
    cudaEvent_t event; /* nullptr: no event (reusable only on `stream`) */
};

struct device_pool {
    std::mutex mu;
    std::unordered_map<size_t, std::vector<cached_block>> free_blocks; /* by size class */
    std::vector<cudaEvent_t> spare_events;
    /* Blocks freed while their stream was being captured into a CUDA graph: the graph may use
     * them on every replay, so they are reused only by later work of the same capture (stream
     * order inside the graph protects them) and handed to the graph when the capture ends. */
    std::vector<k3c_held_block> captured;
    /* Every stream that has allocated or freed through this pool (one per thread context);
     * while there is one, frees record no event. */
    std::vector<cudaStream_t> streams;
    size_t cached_bytes = 0;
    size_t live_bytes = 0;
};

/* Heap-allocated and never destroyed: frees may arrive from thread exits and static
 * destructors after this file's statics would be gone. */
device_pool *g_pools = nullptr;
int g_ndev = 0;

void cache_insert(device_pool &p, void *ptr, size_t cls, cudaStream_t stream);

/* Adds `stream` to p.streams when it is new. Caller holds p.mu. */
void note_stream(device_pool &p, cudaStream_t stream) {
    for (cudaStream_t s : p.streams)
        if (s == stream) return;
    p.streams.push_back(stream);
}

/* Size classes: 512-byte granules up to 4 KiB, then eight classes per power of two (at most
 * 12.5% waste). */
size_t size_class(size_t n) {
    if (n <= 512) return 512;
    size_t p = 1;
    while (p < n) p <<= 1;
    size_t step = p / 16;
    if (step < 512) step = 512;
    return (n + step - 1) / step * step;
}

void fmt_bytes(char *buf, size_t n, size_t b) {
    if (b >= (size_t)1 << 30)
        snprintf(buf, n, "%.2f GiB", (double)b / (double)((size_t)1 << 30));
    else if (b >= (size_t)1 << 20)
        snprintf(buf, n, "%.2f MiB", (double)b / (double)((size_t)1 << 20));
    else
        snprintf(buf, n, "%zu bytes", b);
}

/* Returns every cached block of pool `dev` to the driver. Caller holds the pool's lock and
 * has made dev current. Waits for pending uses first. */
k3_status release_cached(int dev, device_pool &p) {
    if (p.free_blocks.empty()) return K3_OK;
    K3_CHECK(cudaDeviceSynchronize());
    k3_status st = K3_OK;
    for (auto &kv : p.free_blocks) {
        for (cached_block &b : kv.second) {
            if (b.event) p.spare_events.push_back(b.event);
            cudaError_t e = cudaFree(b.ptr);
            if (e != cudaSuccess && st == K3_OK) st = k3c_check(e, "cudaFree(b.ptr)", __FILE__, __LINE__);
            p.cached_bytes -= kv.first;
        }
    }
    p.free_blocks.clear();
    (void)dev;
    return st;
}

} // namespace

void k3c_memory_init(int device_count) {
    g_ndev = device_count;
    g_pools = new (std::nothrow) device_pool[device_count > 0 ? device_count : 1];
}

k3_status k3c_alloc(int dev, size_t bytes, void **ptr) {
    *ptr = nullptr;
    if (!g_pools || dev < 0 || dev >= g_ndev)
        return k3_error(K3_EDEVICE, "cuda:%d: no such device (%d CUDA devices)", dev, g_ndev);
    if (bytes > ((size_t)1 << 50)) {
        char want[32];
        fmt_bytes(want, sizeof want, bytes);
        return k3_error(K3_ENOMEM, "cuda:%d: out of memory: %s requested", dev, want);
    }
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx));
    size_t cls = size_class(bytes);
    device_pool &p = g_pools[dev];
    std::lock_guard<std::mutex> lock(p.mu);
    note_stream(p, ctx->stream);

    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    K3_CHECK(cudaStreamIsCapturing(ctx->stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) {
        for (size_t i = p.captured.size(); i-- > 0;) {
            k3c_held_block &b = p.captured[i];
            if (b.cls != cls || b.stream != ctx->stream) continue;
            *ptr = b.ptr;
            p.captured.erase(p.captured.begin() + (ptrdiff_t)i);
            p.live_bytes += cls;
            return K3_OK;
        }
    }
    auto it = p.free_blocks.find(cls);
    if (it != p.free_blocks.end()) {
        std::vector<cached_block> &v = it->second;
        for (size_t i = v.size(); i-- > 0;) {
            cached_block &b = v[i];
            bool ok = b.stream == ctx->stream;
            /* Querying events is not allowed while this stream is being captured. */
            if (!ok && b.event && cap == cudaStreamCaptureStatusNone)
                ok = cudaEventQuery(b.event) == cudaSuccess;
            if (!ok) continue;
            *ptr = b.ptr;
            if (b.event) p.spare_events.push_back(b.event);
            v.erase(v.begin() + (ptrdiff_t)i);
            p.cached_bytes -= cls;
            p.live_bytes += cls;
            return K3_OK;
        }
    }
    if (cap != cudaStreamCaptureStatusNone) {
        char want[32];
        fmt_bytes(want, sizeof want, bytes);
        return k3_error(K3_EINVAL,
                        "cuda:%d: allocating %s while a CUDA graph is being captured: no block "
                        "the allocator held before the capture serves it (it does not call "
                        "cudaMalloc during a capture); run the captured function once before "
                        "capturing (the warmup) or give its ops preallocated outs",
                        dev, want);
    }
    cudaError_t e = cudaMalloc(ptr, cls);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it so later checks do not see it */
        K3_TRY(release_cached(dev, p));
        e = cudaMalloc(ptr, cls);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *ptr = nullptr;
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        char want[32], fr[32], tot[32], live[32];
        fmt_bytes(want, sizeof want, bytes);
        fmt_bytes(fr, sizeof fr, free_b);
        fmt_bytes(tot, sizeof tot, total_b);
        fmt_bytes(live, sizeof live, p.live_bytes);
        return k3_error(K3_ENOMEM,
                        "cuda:%d: out of memory allocating %s (%s free of %s; k3 tensors hold "
                        "%s); free tensors and retry",
                        dev, want, fr, tot, live);
    }
    if (e != cudaSuccess) {
        *ptr = nullptr;
        return k3c_check(e, "cudaMalloc(ptr, cls)", __FILE__, __LINE__);
    }
    p.live_bytes += cls;
    return K3_OK;
}

int k3c_capturing(int dev) {
    if (!g_pools || dev < 0 || dev >= g_ndev) return 0;
    k3c_ctx *ctx = nullptr;
    if (k3c_context(dev, &ctx) != K3_OK) return 0;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx->stream, &cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1; /* unknown: assume the worst, nothing is freed to make room */
    }
    return cap != cudaStreamCaptureStatusNone;
}

void k3c_free(int dev, void *ptr, size_t bytes) {
    if (!ptr || !g_pools || dev < 0 || dev >= g_ndev) return;
    size_t cls = size_class(bytes);
    device_pool &p = g_pools[dev];
    k3c_ctx *ctx = nullptr;
    /* free cannot report errors: on any failure the block is dropped from the cache (the
     * memory stays with the process) and the thread's message is left as it was. */
    char saved[1024];
    k3_copy_str(saved, sizeof saved, k3_last_error());
    if (k3c_context(dev, &ctx) != K3_OK) {
        k3_error(K3_OK, "%s", saved);
        return;
    }
    std::lock_guard<std::mutex> lock(p.mu);
    note_stream(p, ctx->stream);
    p.live_bytes -= cls < p.live_bytes ? cls : p.live_bytes;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx->stream, &cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (cap != cudaStreamCaptureStatusNone) {
        p.captured.push_back(k3c_held_block{ptr, cls, ctx->stream});
        return;
    }
    cache_insert(p, ptr, cls, ctx->stream);
}

void k3c_memory_capture_take(int dev, cudaStream_t stream, std::vector<k3c_held_block> *out) {
    if (!g_pools || dev < 0 || dev >= g_ndev) return;
    device_pool &p = g_pools[dev];
    std::lock_guard<std::mutex> lock(p.mu);
    for (size_t i = 0; i < p.captured.size();) {
        if (p.captured[i].stream == stream) {
            out->push_back(p.captured[i]);
            p.captured.erase(p.captured.begin() + (ptrdiff_t)i);
        } else {
            i++;
        }
    }
}

void k3c_memory_give_back(int dev, const std::vector<k3c_held_block> &blocks) {
    if (!g_pools || dev < 0 || dev >= g_ndev || blocks.empty()) return;
    device_pool &p = g_pools[dev];
    std::lock_guard<std::mutex> lock(p.mu);
    for (const k3c_held_block &b : blocks) cache_insert(p, b.ptr, b.cls, b.stream);
}

namespace {
/* Puts a freed block in the cache with an event recorded on `stream` now (its last use was
 * queued there), or none while `stream` is the only one the pool has seen. Caller holds
 * p.mu. */
void cache_insert(device_pool &p, void *ptr, size_t cls, cudaStream_t stream) {
    cudaEvent_t ev = nullptr;
    if (p.streams.size() <= 1) {
        /* no other stream could take it yet */
    } else if (!p.spare_events.empty()) {
        ev = p.spare_events.back();
        p.spare_events.pop_back();
    } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        ev = nullptr;
    }
    if (ev && cudaEventRecord(ev, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        p.spare_events.push_back(ev);
        ev = nullptr;
    }
    p.free_blocks[cls].push_back(cached_block{ptr, stream, ev});
    p.cached_bytes += cls;
}
} // namespace

k3_status k3c_empty_cache(void) {
    if (!g_pools) return K3_OK;
    k3_status st = K3_OK;
    for (int d = 0; d < g_ndev; d++) {
        device_pool &p = g_pools[d];
        std::lock_guard<std::mutex> lock(p.mu);
        if (p.free_blocks.empty()) continue;
        k3_status s = k3c_check(cudaSetDevice(d), "cudaSetDevice(d)", __FILE__, __LINE__);
        if (s == K3_OK) s = release_cached(d, p);
        if (s != K3_OK && st == K3_OK) st = s;
    }
    return st;
}
