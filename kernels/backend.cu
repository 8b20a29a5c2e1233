/*
 * backend.cu — the entry of libk3_cuda.so: k3_cuda_backend_open (ABI and device checks, the
 * kernels this build can run on the devices present), per-thread contexts (stream, cuBLAS
 * and cuBLASLt handles, workspace) per device, synchronisation, timing events, and the
 * failure reporting behind K3_CHECK.
 */
#include "common.cuh"

#include <mutex>
#include <new>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define K3C_MAX_DEVICES 64
/* cuBLASLt workspace per context; NVIDIA recommends 32 MiB on Hopper. */
#define K3C_WORKSPACE_BYTES ((size_t)32 << 20)

namespace {

struct device_props {
    char name[256];
    int major, minor, sms;
    int smem_per_sm, smem_optin; /* shared memory bytes: an SM's, a block's opt-in limit */
};

int g_ndev = 0;
device_props g_props[K3C_MAX_DEVICES];

/* Contexts of threads that have exited, per device, ready for the next thread: streams and
 * handles are never destroyed (no CUDA call runs from a thread-exit or process-exit path). */
struct ctx_pool {
    std::mutex mu;
    std::vector<k3c_ctx *> idle;
};
ctx_pool *g_ctx_pools = nullptr; /* never destroyed, see above */

struct thread_contexts {
    k3c_ctx *per_dev[K3C_MAX_DEVICES] = {};
    ~thread_contexts() {
        if (!g_ctx_pools) return;
        for (int d = 0; d < K3C_MAX_DEVICES; d++)
            if (per_dev[d]) {
                std::lock_guard<std::mutex> lock(g_ctx_pools[d].mu);
                g_ctx_pools[d].idle.push_back(per_dev[d]);
            }
    }
};
thread_local thread_contexts t_ctx;

__global__ void k3c_probe_kernel(int *p) {
    if (p) *p = 0;
}

k3_status create_context(int dev, k3c_ctx **out) {
    k3c_ctx *c = new (std::nothrow) k3c_ctx();
    if (!c) return k3_error(K3_ENOMEM, "cuda:%d: out of host memory for a stream context", dev);
    c->dev = dev;
    k3_status s = k3c_check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)",
                            __FILE__, __LINE__);
    if (s == K3_OK)
        s = k3c_check(cublasCreate(&c->blas), "cublasCreate(&c->blas)", __FILE__, __LINE__);
    if (s == K3_OK)
        s = k3c_check(cublasSetStream(c->blas, c->stream), "cublasSetStream(c->blas, c->stream)",
                      __FILE__, __LINE__);
    /* fp32 (or fp64) accumulation everywhere: no TF32, no reduced-precision split-K sums. */
    if (s == K3_OK)
        s = k3c_check(cublasSetMathMode(c->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                      "cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH | DISALLOW_REDUCED_PRECISION)",
                      __FILE__, __LINE__);
    if (s == K3_OK)
        s = k3c_check(cublasLtCreate(&c->lt), "cublasLtCreate(&c->lt)", __FILE__, __LINE__);
    /* Plain cudaMalloc, not the cache: the cache itself asks for this context first. */
    if (s == K3_OK) {
        cudaError_t e = cudaMalloc(&c->workspace, K3C_WORKSPACE_BYTES);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            c->workspace = nullptr;
            s = k3c_empty_cache();
            if (s == K3_OK) s = k3c_check(cudaSetDevice(dev), "cudaSetDevice(dev)", __FILE__, __LINE__);
            if (s == K3_OK) e = cudaMalloc(&c->workspace, K3C_WORKSPACE_BYTES);
        }
        if (s == K3_OK && e != cudaSuccess) {
            c->workspace = nullptr;
            s = k3c_check(e, "cudaMalloc(&c->workspace, K3C_WORKSPACE_BYTES)", __FILE__, __LINE__);
        }
        if (s == K3_OK) c->workspace_size = K3C_WORKSPACE_BYTES;
    }
    /* cuBLAS gets the same workspace: both handles work in order on the one stream, and a
     * user workspace keeps cuBLAS from allocating inside CUDA graph capture. */
    if (s == K3_OK)
        s = k3c_check(cublasSetWorkspace(c->blas, c->workspace, c->workspace_size),
                      "cublasSetWorkspace(c->blas, c->workspace, c->workspace_size)", __FILE__,
                      __LINE__);
    if (s != K3_OK) {
        /* Keep the first message; tear down quietly. */
        if (c->workspace) cudaFree(c->workspace);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->blas) cublasDestroy(c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        (void)cudaGetLastError();
        delete c;
        return s;
    }
    *out = c;
    return K3_OK;
}

} // namespace

/* ---- failure reporting (check.h) --------------------------------------------------------- */

k3_status k3c_fail_cuda(cudaError_t e, const char *stmt, const char *file, int line) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    /* Non-sticky errors are also kept as the runtime's "last error": clear it so that the
     * next launch check does not report this failure a second time. */
    (void)cudaGetLastError();
    k3_status s = e == cudaErrorMemoryAllocation ? K3_ENOMEM : K3_ECUDA;
    return k3_error(s, "CUDA error on cuda:%d: %s (%s) in `%s` at %s:%d", dev,
                    cudaGetErrorName(e), cudaGetErrorString(e), stmt, file, line);
}

k3_status k3c_fail_cublas(cublasStatus_t e, const char *stmt, const char *file, int line) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    (void)cudaGetLastError();
    k3_status s = e == CUBLAS_STATUS_ALLOC_FAILED ? K3_ENOMEM : K3_ECUDA;
    return k3_error(s, "cuBLAS error on cuda:%d: %s (%s) in `%s` at %s:%d", dev,
                    cublasGetStatusName(e), cublasGetStatusString(e), stmt, file, line);
}

/* ---- contexts ---------------------------------------------------------------------------- */

k3_status k3c_context(int dev, k3c_ctx **out) {
    if (dev < 0 || dev >= g_ndev)
        return k3_error(K3_EDEVICE, "cuda:%d: no such device (%d CUDA device%s)", dev, g_ndev,
                        g_ndev == 1 ? "" : "s");
    /* Every call, even when dev is already the current device: it also makes dev's primary
     * context current, which k3's streams belong to, whatever context a host left current. */
    K3_CHECK(cudaSetDevice(dev));
    k3c_ctx *c = t_ctx.per_dev[dev];
    if (!c) {
        {
            std::lock_guard<std::mutex> lock(g_ctx_pools[dev].mu);
            if (!g_ctx_pools[dev].idle.empty()) {
                c = g_ctx_pools[dev].idle.back();
                g_ctx_pools[dev].idle.pop_back();
            }
        }
        if (!c) K3_TRY(create_context(dev, &c));
        t_ctx.per_dev[dev] = c;
    }
    *out = c;
    return K3_OK;
}

k3_status k3c_stream(int dev, cudaStream_t *out) {
    k3c_ctx *c = nullptr;
    K3_TRY(k3c_context(dev, &c));
    *out = c->stream;
    return K3_OK;
}

int k3c_sm_count(int dev) { return dev >= 0 && dev < g_ndev ? g_props[dev].sms : 1; }
int k3c_smem_per_sm(int dev) { return dev >= 0 && dev < g_ndev ? g_props[dev].smem_per_sm : 0; }
int k3c_smem_optin(int dev) { return dev >= 0 && dev < g_ndev ? g_props[dev].smem_optin : 0; }

static int g_pdl_l2_prefetch = 1;
void k3c_pdl_l2_prefetch_init(void) {
    const char *e = getenv("K3_PDL_L2_PREFETCH");
    g_pdl_l2_prefetch = !(e && e[0] == '0' && !e[1]);
}
int k3c_pdl_l2_prefetch(void) { return g_pdl_l2_prefetch; }

void k3c_temp_init(k3c_temp_tensor *tt, void *buf, size_t bytes, int dev, k3_dtype dt, int ndim,
                   const int64_t *shape) {
    memset(tt, 0, sizeof *tt);
    tt->storage.refcount = 1;
    tt->storage.data = buf;
    tt->storage.nbytes = bytes;
    tt->storage.device = k3_device{K3_DEVICE_CUDA, dev};
    tt->t.storage = &tt->storage;
    tt->t.dtype = dt;
    tt->t.ndim = ndim;
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        tt->t.size[d] = shape[d];
        tt->t.stride[d] = st;
        st *= shape[d] > 0 ? shape[d] : 1;
    }
}

/* ---- table entries ------------------------------------------------------------------------ */

namespace {

k3_status be_device_info(int dev, char *name, size_t n, int *major, int *minor, int *sms) {
    if (dev < 0 || dev >= g_ndev)
        return k3_error(K3_EDEVICE, "cuda:%d: no such device (%d CUDA devices)", dev, g_ndev);
    if (name && n) snprintf(name, n, "%s", g_props[dev].name);
    if (major) *major = g_props[dev].major;
    if (minor) *minor = g_props[dev].minor;
    if (sms) *sms = g_props[dev].sms;
    return K3_OK;
}

k3_status be_alloc(int dev, size_t bytes, void **ptr) { return k3c_alloc(dev, bytes, ptr); }
void be_free(int dev, void *ptr, size_t bytes) { k3c_free(dev, ptr, bytes); }
k3_status be_empty_cache(void) { return k3c_empty_cache(); }

k3_status be_synchronize(void) {
    for (int d = 0; d < g_ndev && d < K3C_MAX_DEVICES; d++) {
        k3c_ctx *c = t_ctx.per_dev[d];
        if (!c) continue;
        K3_CHECK(cudaSetDevice(d));
        K3_CHECK(cudaStreamSynchronize(c->stream));
    }
    return K3_OK;
}

struct timing_event {
    cudaEvent_t ev;
    int dev;
};

k3_status be_event_record(int dev, void **event) {
    *event = nullptr;
    k3c_ctx *c = nullptr;
    K3_TRY(k3c_context(dev, &c));
    timing_event *t = new (std::nothrow) timing_event{nullptr, dev};
    if (!t) return k3_error(K3_ENOMEM, "event_record: out of host memory");
    cudaError_t e = cudaEventCreate(&t->ev);
    if (e != cudaSuccess) {
        delete t;
        return k3c_check(e, "cudaEventCreate(&t->ev)", __FILE__, __LINE__);
    }
    e = cudaEventRecord(t->ev, c->stream);
    if (e != cudaSuccess) {
        k3_status s = k3c_check(e, "cudaEventRecord(t->ev, c->stream)", __FILE__, __LINE__);
        cudaEventDestroy(t->ev);
        delete t;
        return s;
    }
    *event = t;
    return K3_OK;
}

k3_status be_event_elapsed(void *start, void *end, float *ms) {
    if (!start || !end || !ms) return k3_error(K3_EINVAL, "event_elapsed: NULL argument");
    timing_event *a = (timing_event *)start, *b = (timing_event *)end;
    K3_CHECK(cudaSetDevice(b->dev));
    K3_CHECK(cudaEventSynchronize(b->ev));
    K3_CHECK(cudaEventElapsedTime(ms, a->ev, b->ev));
    return K3_OK;
}

void be_event_free(void *event) {
    if (!event) return;
    timing_event *t = (timing_event *)event;
    if (cudaSetDevice(t->dev) != cudaSuccess || cudaEventDestroy(t->ev) != cudaSuccess)
        (void)cudaGetLastError();
    delete t;
}

/* Defined in copy.cu. */
} // namespace
k3_status k3c_backend_copy(k3_tensor *dst, const k3_tensor *src);
k3_status k3c_backend_fill(k3_tensor *t, double value);
k3_status k3c_backend_binary(k3_tensor *out, k3_binop op, const k3_tensor *a, const k3_tensor *b,
                             double s, int scalar_first);
/* Defined in graph.cu. */
k3_status k3c_graph_begin(int dev);
k3_status k3c_graph_end(int dev, void **graph);
k3_status k3c_graph_replay(void *graph, int n);
void k3c_graph_free(void *graph);
void k3c_graph_abandon(int dev);
int k3c_graph_kernels(void *graph);
void k3c_dist_fill(k3_backend *out); /* dist.cu: NCCL entries of the table */

namespace {

/* The CUDA kernels of the catalogue (lib/k3_kernels.def), and those of them this build can run
 * on every device present (each kernel's usable check). */
const k3_kernel *const g_catalogue[] = {
#define K3_KERNEL(symbol, name, OP, DEVICE, rank, invariant_rank) K3_ON_CUDA_##DEVICE(&symbol,)
#include "k3_kernels.def"
#undef K3_KERNEL
};
const int kCatalogue = (int)(sizeof g_catalogue / sizeof g_catalogue[0]);
const k3_kernel *g_kernels[sizeof g_catalogue / sizeof g_catalogue[0]];

void set_reason(char *reason, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void set_reason(char *reason, size_t n, const char *fmt, ...) {
    if (!reason || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, n, fmt, ap);
    va_end(ap);
}

} // namespace

extern "C" __attribute__((visibility("default"))) k3_status
k3_cuda_backend_open(int core_abi, k3_backend *out, char *reason, size_t n) {
    if (reason && n) reason[0] = '\0';
    if (core_abi != K3_BACKEND_ABI) {
        set_reason(reason, n, "ABI mismatch: libk3 uses backend ABI %d, libk3_cuda.so was built for %d",
                   core_abi, K3_BACKEND_ABI);
        return K3_EDEVICE;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorNoDevice) {
            set_reason(reason, n, "no CUDA device");
        } else if (e == cudaErrorInsufficientDriver) {
            int drv = 0, rt = 0;
            cudaDriverGetVersion(&drv);
            cudaRuntimeGetVersion(&rt);
            (void)cudaGetLastError();
            if (drv == 0)
                set_reason(reason, n, "no CUDA driver (libcuda.so.1 not found): no CUDA device");
            else
                set_reason(reason, n,
                           "CUDA driver too old: it supports CUDA %d.%d, the backend needs %d.%d",
                           drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        } else {
            set_reason(reason, n, "CUDA initialisation failed: %s (%s)", cudaGetErrorName(e),
                       cudaGetErrorString(e));
        }
        return K3_EDEVICE;
    }
    if (count <= 0) {
        set_reason(reason, n, "no CUDA device");
        return K3_EDEVICE;
    }
    if (count > K3C_MAX_DEVICES) count = K3C_MAX_DEVICES;
    for (int d = 0; d < count; d++) {
        cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, d);
        if (e == cudaSuccess) e = cudaSetDevice(d);
        cudaFuncAttributes fa;
        if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, k3c_probe_kernel);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
                e == cudaErrorUnsupportedPtxVersion)
                set_reason(reason, n,
                           "cuda:%d (%s, sm_%d%d) cannot run this build's kernels (built for "
                           "sm_90a and compute_90 PTX): %s",
                           d, p.name, p.major, p.minor, cudaGetErrorName(e));
            else
                set_reason(reason, n, "cuda:%d: %s (%s)", d, cudaGetErrorName(e),
                           cudaGetErrorString(e));
            return K3_EDEVICE;
        }
        snprintf(g_props[d].name, sizeof g_props[d].name, "%s", p.name);
        g_props[d].major = p.major;
        g_props[d].minor = p.minor;
        g_props[d].sms = p.multiProcessorCount;
        g_props[d].smem_per_sm = (int)p.sharedMemPerMultiprocessor;
        g_props[d].smem_optin = (int)p.sharedMemPerBlockOptin;
    }
    g_ndev = count;
    g_ctx_pools = new (std::nothrow) ctx_pool[count];
    k3c_memory_init(count);
    if (!g_ctx_pools) {
        set_reason(reason, n, "out of host memory");
        return K3_ENOMEM;
    }
    k3c_attn_res_knobs_init();
    k3c_pdl_l2_prefetch_init();
    int nk = 0;
    for (int i = 0; i < kCatalogue; i++) {
        bool usable = true;
        for (int d = 0; usable && d < count && g_catalogue[i]->usable; d++)
            usable = g_catalogue[i]->usable(d);
        if (usable) g_kernels[nk++] = g_catalogue[i];
    }
    cudaSetDevice(0);
    (void)cudaGetLastError();

    memset(out, 0, sizeof *out);
    out->abi = K3_BACKEND_ABI;
    out->name = "cuda";
    out->device_count = count;
    out->device_info = be_device_info;
    out->alloc = be_alloc;
    out->free = be_free;
    out->empty_cache = be_empty_cache;
    out->copy = k3c_backend_copy;
    out->fill = k3c_backend_fill;
    out->binary = k3c_backend_binary;
    out->synchronize = be_synchronize;
    out->kernels = g_kernels;
    out->nkernels = nk;
    out->event_record = be_event_record;
    out->event_elapsed = be_event_elapsed;
    out->event_free = be_event_free;
    out->graph_begin = k3c_graph_begin;
    out->graph_end = k3c_graph_end;
    out->graph_replay = k3c_graph_replay;
    out->graph_free = k3c_graph_free;
    out->graph_abandon = k3c_graph_abandon;
    out->graph_kernels = k3c_graph_kernels;
    out->capturing = k3c_capturing;
    k3c_dist_fill(out);
    return K3_OK;
}
