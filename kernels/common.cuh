/*
 * common.cuh — what every .cu file of the CUDA backend shares: the per-thread device
 * context (stream, cuBLAS handles), device memory, dtype tags with the core's own conversions
 * (lib/k3_half.h), and strided index helpers for views of up to 8 dims.
 */
#ifndef K3_COMMON_CUH
#define K3_COMMON_CUH

#include "check.h"
#include "k3_half.h"
#include "warp.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <vector>

/* ---- backend internals (backend.cu, memory.cu) ----------------------------------------- */

/* One thread's working state on one device: its own stream (non-blocking, so two threads
 * or two hosts never serialise on each other) and cuBLAS / cuBLASLt handles bound to it. */
struct k3c_ctx {
    int dev;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt workspace, workspace_size bytes */
    size_t workspace_size;
};

/* Makes `dev` current on this thread and returns this thread's context for it (created on
 * first use). */
k3_status k3c_context(int dev, k3c_ctx **out);
/* This thread's stream on dev, creating the context if needed. */
k3_status k3c_stream(int dev, cudaStream_t *out);
/* Multiprocessor count of dev (cached at open). */
int k3c_sm_count(int dev);
/* Shared memory bytes of dev (cached at open; 0 for no such device): an SM's, and the most a
 * block may opt in to (cudaFuncAttributeMaxDynamicSharedMemorySize plus static). */
int k3c_smem_per_sm(int dev);
int k3c_smem_optin(int dev);

/* Device memory through the caching allocator (memory.cu). K3_ENOMEM is recoverable: the
 * cache is emptied and the allocation retried before it is reported. */
k3_status k3c_alloc(int dev, size_t bytes, void **ptr);
void k3c_free(int dev, void *ptr, size_t bytes);
/* A block freed on `stream` while it was being captured into a CUDA graph (size class cls). */
struct k3c_held_block {
    void *ptr;
    size_t cls;
    cudaStream_t stream;
};
/* When a capture of `stream` ends: moves the blocks freed during it into *out (the graph's
 * from then on). k3c_memory_give_back returns such blocks to the cache (the graph freed, or
 * the capture discarded), ordered after the work queued so far on each block's stream. */
void k3c_memory_capture_take(int dev, cudaStream_t stream, std::vector<k3c_held_block> *out);
void k3c_memory_give_back(int dev, const std::vector<k3c_held_block> &blocks);
k3_status k3c_empty_cache(void);
void k3c_memory_init(int device_count);
/* 1 while this thread's stream of dev is being captured into a CUDA graph (k3_backend.capturing). */
int k3c_capturing(int dev);

/* A scoped device temporary: freed (back to the cache) when it leaves scope. Reuse is safe
 * because blocks are handed out again only in stream order (see memory.cu). */
struct k3c_buffer {
    int dev = 0;
    void *ptr = nullptr;
    size_t bytes = 0;
    k3c_buffer() = default;
    k3c_buffer(const k3c_buffer &) = delete;
    k3c_buffer &operator=(const k3c_buffer &) = delete;
    ~k3c_buffer() { reset(); }
    k3_status alloc(int d, size_t n) {
        reset();
        k3_status s = k3c_alloc(d, n, &ptr);
        if (s == K3_OK) {
            dev = d;
            bytes = n;
        }
        return s;
    }
    void reset() {
        if (ptr) k3c_free(dev, ptr, bytes);
        ptr = nullptr;
        bytes = 0;
    }
};

/* A stack tensor over a backend temporary (not reference-counted: it must not escape). */
struct k3c_temp_tensor {
    k3_storage storage;
    k3_tensor t;
};
/* Fills tt as a contiguous [ndim, shape] tensor of dtype on cuda:dev over buf. */
void k3c_temp_init(k3c_temp_tensor *tt, void *buf, size_t bytes, int dev, k3_dtype dt, int ndim,
                   const int64_t *shape);

/* The kernels' records are declared by the catalogue (k3_impl.h, lib/k3_kernels.def); backend.cu
 * registers every CUDA line of it. */

/* Reads the AttnRes launch knobs (K3_ATTN_RES_PDL, K3_ATTN_RES_DECODE_CTAS, ...: attn_res.cuh)
 * once, when the backend opens (attn_res_decode.cu). */
void k3c_attn_res_knobs_init(void);
/* K3_PDL_L2_PREFETCH, read once when the backend loads: 0 turns off the L2 prefetch that
 * cuda.rms_norm.generic and cuda.attn_res.decode issue before their PDL wait (k3c_prefetch_l2);
 * on (1) otherwise. */
void k3c_pdl_l2_prefetch_init(void);
int k3c_pdl_l2_prefetch(void);

/* A linear's prologue through a temporary (linear_cublas.cu; also the other CUDA linear
 * kernels' path where their own prologue does not pay or does not fit): h [M, K] written by
 * the separate op's own kernel, cuda.silu_mul.generic (h = silu(x[:, :K]) * x[:, K:]) or
 * cuda.rms_norm.generic (h = rms_norm(x, norm_weight, eps)), into buf on x's device
 * (stream-ordered scratch); ht is h as a contiguous tensor. K is w's dim 1. */
k3_status k3c_prologue_temp(const k3_linear_args *a, k3c_buffer &buf, k3c_temp_tensor &ht);
/* A linear's silu_mul epilogue through a temporary (linear_cublas.cu; every CUDA linear
 * kernel's path where it has no epilogue of its own): run(the call without the epilogue, out =
 * y [M, 2N] contiguous in stream-ordered scratch on x's device) writes y with the plain call's
 * bits, then cuda.silu_mul.generic writes out = silu_mul(y) [M, N]. Any prologue is left to run. */
k3_status k3c_epilogue_temp(const k3_op_args *oa, k3_status (*run)(const k3_op_args *));

/* copy.cu helpers used by other files. dst <- src on one device, any strides and dtypes. */
k3_status k3c_copy(k3_tensor *dst, const k3_tensor *src);

/* ---- programmatic dependent launch ---------------------------------------------------------- */

/* PTX ISA "griddepcontrol". launch_dependents: the next kernel of the stream, when it was
 * launched with the programmatic-stream-serialization attribute, may become resident before
 * this one completes (its prologue overlaps this kernel's tail). wait: returns once every
 * prerequisite grid has completed and its memory is visible. Both are no-ops in a launch
 * without the attribute, so a kernel after cuBLAS or a memcpy stays correct. The row-wise and
 * element kernels (norm.cu, copy.cu) call launch_dependents then wait at entry in every CTA,
 * before their first load or store: nothing of theirs runs ahead of the previous kernel, and
 * their completion still implies the completion of everything before them. */
__device__ __forceinline__ void k3c_pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void k3c_pdl_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

/* PTX ISA "prefetch.global.L2": asks L2 for the 128-byte line holding p. L2 is the point of
 * coherence, so this is correct before griddepcontrol.wait whoever writes the line (a write
 * after it updates L2, and the load after the wait sees it; L1 is not filled). The kernels
 * behind a projection use it on rows the projection's weight stream has likely evicted, so
 * their chain after the wait loads from L2 rather than DRAM. */
__device__ __forceinline__ void k3c_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* kern<<<grid, block, smem, stream>>>(args...) launched with programmatic dependent launch
 * (cudaLaunchKernelEx, cudaLaunchAttributeProgrammaticStreamSerialization). A launch error is
 * reported naming `name`. */
template <class... P, class... A>
k3_status k3c_launch_pdl(const char *name, void (*kern)(P...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, A... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, ((P)args)...);
    if (e == cudaSuccess) e = cudaGetLastError();
    return k3c_check(e, name, __FILE__, __LINE__);
}

/* ---- dtype tags and conversions ----------------------------------------------------------- */

/* Storage types: 16-bit formats are kept as raw bits so every conversion is explicit. */
struct k3c_bf16 {
    uint16_t bits;
};
struct k3c_f16 {
    uint16_t bits;
};

#ifdef __CUDA_ARCH__
#define K3C_HD __host__ __device__ __forceinline__
#else
#define K3C_HD inline
#endif

/* lib/k3_half.h's conversions, the ones lib/dtype.c uses, so the device rounds (and treats
 * NaN) exactly as the CPU does. */
K3C_HD uint32_t k3c_f32_bits(float f) { return k3h_f32_bits(f); }
K3C_HD float k3c_bits_f32(uint32_t u) { return k3h_bits_f32(u); }
K3C_HD uint64_t k3c_f64_bits(double f) {
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(f);
#else
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
#endif
}
K3C_HD double k3c_bits_f64(uint64_t u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double f;
    memcpy(&f, &u, 8);
    return f;
#endif
}
K3C_HD uint16_t k3c_f32_to_bf16(float x) { return k3h_f32_to_bf16(x); }
K3C_HD float k3c_bf16_to_f32(uint16_t x) { return k3h_bf16_to_f32(x); }
K3C_HD uint16_t k3c_f32_to_f16(float x) { return k3h_f32_to_f16(x); }
K3C_HD float k3c_f16_to_f32(uint16_t x) { return k3h_f16_to_f32(x); }

/* f64 <-> f32 as the host's C casts do them (round to nearest even; a NaN keeps its sign
 * and the top of its payload and becomes quiet, as x86 SSE conversions do). The device's
 * own conversion instructions return a canonical NaN instead, hence the explicit cases. */
K3C_HD float k3c_f64_to_f32(double x) {
    uint64_t u = k3c_f64_bits(x);
    if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
        return k3c_bits_f32((uint32_t)(u >> 32 & 0x80000000u) | 0x7fc00000u |
                            (uint32_t)((u >> 29) & 0x7fffffu));
#ifdef __CUDA_ARCH__
    return __double2float_rn(x);
#else
    return (float)x;
#endif
}
K3C_HD double k3c_f32_to_f64(float x) {
    uint32_t u = k3c_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return k3c_bits_f64((uint64_t)(u & 0x80000000u) << 32 | 0x7ff8000000000000ull |
                            (uint64_t)(u & 0x7fffffu) << 29);
    return (double)x;
}
/* lib/dtype.c's round-to-odd step: exact for a second rounding to 16 bits. */
K3C_HD float k3c_f64_to_f32_odd(double x) {
    if (isnan(x) || isinf(x)) return k3c_f64_to_f32(x);
    float f = k3c_f64_to_f32(x);
    if ((double)f == x) return f;
    if (isinf(f) || fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f);
    return k3c_bits_f32(k3c_f32_bits(f) | 1u);
}

/* Per-tag loads into f32 / f64 and stores from them, each rounded once. */
K3C_HD float k3c_to_f32(k3c_bf16 v) { return k3c_bf16_to_f32(v.bits); }
K3C_HD float k3c_to_f32(k3c_f16 v) { return k3c_f16_to_f32(v.bits); }
K3C_HD float k3c_to_f32(float v) { return v; }
K3C_HD float k3c_to_f32(double v) { return k3c_f64_to_f32(v); }
K3C_HD double k3c_to_f64(k3c_bf16 v) { return k3c_f32_to_f64(k3c_bf16_to_f32(v.bits)); }
K3C_HD double k3c_to_f64(k3c_f16 v) { return k3c_f32_to_f64(k3c_f16_to_f32(v.bits)); }
K3C_HD double k3c_to_f64(float v) { return k3c_f32_to_f64(v); }
K3C_HD double k3c_to_f64(double v) { return v; }

template <class T> struct k3c_conv;
template <> struct k3c_conv<k3c_bf16> {
    static K3C_HD k3c_bf16 from_f32(float v) { return {k3c_f32_to_bf16(v)}; }
    static K3C_HD k3c_bf16 from_f64(double v) { return {k3c_f32_to_bf16(k3c_f64_to_f32_odd(v))}; }
};
template <> struct k3c_conv<k3c_f16> {
    static K3C_HD k3c_f16 from_f32(float v) { return {k3c_f32_to_f16(v)}; }
    static K3C_HD k3c_f16 from_f64(double v) { return {k3c_f32_to_f16(k3c_f64_to_f32_odd(v))}; }
};
template <> struct k3c_conv<float> {
    static K3C_HD float from_f32(float v) { return v; }
    static K3C_HD float from_f64(double v) { return k3c_f64_to_f32(v); }
};
template <> struct k3c_conv<double> {
    static K3C_HD double from_f32(float v) { return k3c_f32_to_f64(v); }
    static K3C_HD double from_f64(double v) { return v; }
};

/* The accumulation type of a storage type: f64 for f64, f32 for everything else. */
template <class T> struct k3c_acc {
    typedef float type;
};
template <> struct k3c_acc<double> {
    typedef double type;
};
template <class T> K3C_HD typename k3c_acc<T>::type k3c_load_acc(T v);
template <> K3C_HD float k3c_load_acc<k3c_bf16>(k3c_bf16 v) { return k3c_to_f32(v); }
template <> K3C_HD float k3c_load_acc<k3c_f16>(k3c_f16 v) { return k3c_to_f32(v); }
template <> K3C_HD float k3c_load_acc<float>(float v) { return v; }
template <> K3C_HD double k3c_load_acc<double>(double v) { return v; }
template <class T> K3C_HD T k3c_store_acc(typename k3c_acc<T>::type v);
template <> K3C_HD k3c_bf16 k3c_store_acc<k3c_bf16>(float v) { return {k3c_f32_to_bf16(v)}; }
template <> K3C_HD k3c_f16 k3c_store_acc<k3c_f16>(float v) { return {k3c_f32_to_f16(v)}; }
template <> K3C_HD float k3c_store_acc<float>(float v) { return v; }
template <> K3C_HD double k3c_store_acc<double>(double v) { return v; }

/* Loads element i of a weight vector of any dtype as f32 (weights may differ in dtype
 * from the activations). */
__device__ __forceinline__ float k3c_load_any_f32(const void *p, int dt, int64_t i) {
    switch (dt) {
    case K3_DTYPE_BF16: return k3c_bf16_to_f32(((const uint16_t *)p)[i]);
    case K3_DTYPE_F16: return k3c_f16_to_f32(((const uint16_t *)p)[i]);
    case K3_DTYPE_F32: return ((const float *)p)[i];
    default: return k3c_f64_to_f32(((const double *)p)[i]);
    }
}
__device__ __forceinline__ double k3c_load_any_f64(const void *p, int dt, int64_t i) {
    switch (dt) {
    case K3_DTYPE_BF16: return (double)k3c_bf16_to_f32(((const uint16_t *)p)[i]);
    case K3_DTYPE_F16: return (double)k3c_f16_to_f32(((const uint16_t *)p)[i]);
    case K3_DTYPE_F32: return (double)((const float *)p)[i];
    default: return ((const double *)p)[i];
    }
}

/* Calls f.template operator()<Tag>() with the storage tag of dt. */
#define K3C_DISPATCH_DTYPE(dt, T, ...)                                                     \
    switch (dt) {                                                                          \
    case K3_DTYPE_BF16: {                                                                  \
        typedef k3c_bf16 T;                                                                \
        __VA_ARGS__;                                                                       \
        break;                                                                             \
    }                                                                                      \
    case K3_DTYPE_F16: {                                                                   \
        typedef k3c_f16 T;                                                                 \
        __VA_ARGS__;                                                                       \
        break;                                                                             \
    }                                                                                      \
    case K3_DTYPE_F32: {                                                                   \
        typedef float T;                                                                   \
        __VA_ARGS__;                                                                       \
        break;                                                                             \
    }                                                                                      \
    case K3_DTYPE_F64: {                                                                   \
        typedef double T;                                                                  \
        __VA_ARGS__;                                                                       \
        break;                                                                             \
    }                                                                                      \
    }

/* ---- strided index helpers ----------------------------------------------------------------- */

/* Up to 3 views (e.g. out, a, b) walked together over one shape. Dims of size 1 are dropped
 * and adjacent dims merged where every view allows it, so most copies run as 1-D or 2-D. */
struct k3c_walk {
    int ndim;  /* 0 means a single element */
    int nview;
    int64_t size[K3_MAX_DIMS];
    int64_t stride[3][K3_MAX_DIMS];
};

/* Builds a walk over `ndim, size` for nview stride arrays. */
static inline void k3c_walk_init(k3c_walk *w, int ndim, const int64_t *size, int nview,
                                 const int64_t *const *strides) {
    w->nview = nview;
    w->ndim = 0;
    for (int d = 0; d < ndim; d++) {
        if (size[d] == 1) continue;
        int k = w->ndim;
        bool merge = k > 0;
        for (int v = 0; v < nview && merge; v++)
            merge = w->stride[v][k - 1] == strides[v][d] * size[d];
        if (merge) {
            w->size[k - 1] *= size[d];
            for (int v = 0; v < nview; v++) w->stride[v][k - 1] = strides[v][d];
        } else {
            w->size[k] = size[d];
            for (int v = 0; v < nview; v++) w->stride[v][k] = strides[v][d];
            w->ndim++;
        }
    }
}

/* Element offsets (in elements) of linear row-major index i in every view. */
template <int NV>
__device__ __forceinline__ void k3c_walk_offsets(const k3c_walk &w, int64_t i, int64_t *off) {
#pragma unroll
    for (int v = 0; v < NV; v++) off[v] = 0;
    for (int d = w.ndim - 1; d >= 0; d--) {
        int64_t s = w.size[d];
        int64_t q = i / s, r = i - q * s;
#pragma unroll
        for (int v = 0; v < NV; v++) off[v] += r * w.stride[v][d];
        i = q;
    }
}

/* Grid size for a grid-stride loop over n items with `threads` per block. */
static inline unsigned k3c_blocks_for(int64_t n, int threads, int cap = 65535 * 8) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return (unsigned)b;
}

/* Device of a CUDA tensor. */
static inline int k3c_dev(const k3_tensor *t) { return t->storage->device.index; }

#endif /* K3_COMMON_CUH */
