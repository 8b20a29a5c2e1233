/*
 * copy.cu — element movement for device tensors: copies host<->device and device<->device
 * (same or different GPUs) with any strides (zero strides in the source included) and any
 * dtype pair, rounding exactly as lib/tensor.c does; fill; and the elementwise + - * /. Every
 * kernel here launches with programmatic dependent launch (common.cuh), and a copy on one
 * device is always a kernel (16-byte vectors when both sides are dense and aligned), never a
 * memcpy node, so a captured step stays one PDL chain through its copies.
 */
#include "common.cuh"

#include <new>
#include <type_traits>

namespace {

const int kThreads = 256;

/* Mirrors copy_row in lib/tensor.c: same dtype moves bits, otherwise through f64 with the
 * CPU's load/store rules (so results are bit-identical to a CPU copy). */
template <class S, class D> __device__ __forceinline__ D convert(S v) {
    return k3c_conv<D>::from_f64(k3c_to_f64(v));
}
template <> __device__ __forceinline__ k3c_bf16 convert<k3c_bf16, k3c_bf16>(k3c_bf16 v) { return v; }
template <> __device__ __forceinline__ k3c_f16 convert<k3c_f16, k3c_f16>(k3c_f16 v) { return v; }
template <> __device__ __forceinline__ float convert<float, float>(float v) { return v; }
template <> __device__ __forceinline__ double convert<double, double>(double v) { return v; }

template <class S, class D>
__global__ void copy_kernel(D *__restrict__ dst, const S *__restrict__ src, k3c_walk w,
                            int64_t n) {
    k3c_pdl_launch_dependents();
    k3c_pdl_wait();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        k3c_walk_offsets<2>(w, i, off);
        dst[off[0]] = convert<S, D>(src[off[1]]);
    }
}

/* Dense bytes, n 16-byte vectors (both sides 16-byte aligned). */
__global__ void copy_vec16_kernel(uint4 *__restrict__ dst, const uint4 *__restrict__ src, int64_t n) {
    k3c_pdl_launch_dependents();
    k3c_pdl_wait();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

template <class U> __global__ void fill_kernel(U *__restrict__ dst, U bits, k3c_walk w, int64_t n) {
    k3c_pdl_launch_dependents();
    k3c_pdl_wait();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[1];
        k3c_walk_offsets<1>(w, i, off);
        dst[off[0]] = bits;
    }
}

template <class A> __device__ __forceinline__ A apply(int op, A x, A y) {
    return op == K3_ADD ? x + y : op == K3_SUB ? x - y : op == K3_MUL ? x * y : x / y;
}

/* lib/tensor.c's apply_op_odd: x op y rounded to odd at double precision (the exact
 * result, or whichever double around it has an odd significand), so that one more rounding
 * to f32, f16 or bf16 is the exact result rounded once. The double result's error is exact
 * (TwoSum for + and -, fma for *). */
__device__ __forceinline__ double apply_odd(int op, double x, double y) {
    double r, e;
    if (op == K3_MUL) {
        r = __dmul_rn(x, y);
        e = fma(x, y, -r);
    } else if (op == K3_DIV) {
        /* The exact remainder's sign, times y's, says on which side of r the quotient lies
         * (lib/tensor.c). */
        r = __ddiv_rn(x, y);
        e = fma(-r, y, x);
        if (y < 0) e = -e;
        if (r == 0 || !isfinite(e)) e = 0;
    } else {
        double yy = op == K3_SUB ? -y : y;
        r = __dadd_rn(x, yy);
        double yv = __dsub_rn(r, x), xv = __dsub_rn(r, yv);
        e = __dadd_rn(__dsub_rn(x, xv), __dsub_rn(yy, yv));
    }
    if (e == 0 || !isfinite(r)) return r;
    if (__double_as_longlong(r) & 1) return r;
    return nextafter(r, e > 0 ? (double)INFINITY : -(double)INFINITY);
}

/* mode 0: a op b, in f32 (f64 for f64) as lib/tensor.c argues is exact; 1: a op s; 2: s op a,
 * in f64 (rounded to odd below f64), as the CPU does; each rounded once to the dtype. */
template <class T>
__global__ void binary_kernel(T *__restrict__ out, const T *__restrict__ a, const T *__restrict__ b,
                              double s, int op, int mode, k3c_walk w, int64_t n) {
    typedef typename k3c_acc<T>::type A;
    k3c_pdl_launch_dependents();
    k3c_pdl_wait();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3];
        k3c_walk_offsets<3>(w, i, off);
        if (mode == 0) {
            A x = k3c_load_acc<T>(a[off[1]]);
            A y = k3c_load_acc<T>(b[off[2]]);
            out[off[0]] = k3c_store_acc<T>(apply<A>(op, x, y));
        } else {
            double x = k3c_to_f64(a[off[1]]);
            double l = mode == 2 ? s : x, r = mode == 2 ? x : s;
            double v = std::is_same<T, double>::value ? apply<double>(op, l, r) : apply_odd(op, l, r);
            out[off[0]] = k3c_conv<T>::from_f64(v);
        }
    }
}

template <class T> T *typed(const k3_tensor *t) { return (T *)k3_tensor_ptr(t); }

bool is_dense(const k3_tensor *t) { return k3_tensor_is_contiguous(t) != 0; }

/* dst <- src on one device (both already there). */
k3_status copy_on_device(k3_tensor *dst, const k3_tensor *src, cudaStream_t stream) {
    int64_t n = k3_tensor_numel(dst);
    if (n == 0) return K3_OK;
    size_t bytes = (size_t)n * k3_dtype_size(dst->dtype);
    void *dp = k3_tensor_ptr(dst);
    const void *sp = k3_tensor_ptr(src);
    if (dst->dtype == src->dtype && is_dense(dst) && is_dense(src) && bytes % 16 == 0 &&
        (uintptr_t)dp % 16 == 0 && (uintptr_t)sp % 16 == 0) {
        int64_t nv = (int64_t)(bytes / 16);
        return k3c_launch_pdl("launch of copy_vec16_kernel", copy_vec16_kernel,
                              dim3(k3c_blocks_for(nv, kThreads)), dim3(kThreads), 0, stream,
                              (uint4 *)dp, (const uint4 *)sp, nv);
    }
    k3c_walk w;
    const int64_t *strides[2] = {dst->stride, src->stride};
    k3c_walk_init(&w, dst->ndim, dst->size, 2, strides);
    unsigned blocks = k3c_blocks_for(n, kThreads);
    K3C_DISPATCH_DTYPE(src->dtype, S, K3C_DISPATCH_DTYPE(dst->dtype, D, {
        K3_TRY(k3c_launch_pdl("launch of copy_kernel", copy_kernel<S, D>, dim3(blocks),
                              dim3(kThreads), 0, stream, typed<D>(dst), typed<S>(src), w, n));
    }));
    return K3_OK;
}

/* Host side: copies between a strided view and a dense buffer of the same dtype. */
void host_strided(void *dense, const k3_tensor *t, bool to_dense) {
    size_t es = k3_dtype_size(t->dtype);
    char *base = (char *)k3_tensor_ptr(t);
    int64_t n = k3_tensor_numel(t);
    int64_t idx[K3_MAX_DIMS] = {0};
    int nd = t->ndim;
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++) off += idx[d] * t->stride[d];
        if (to_dense)
            memcpy((char *)dense + (size_t)i * es, base + (size_t)off * es, es);
        else
            memcpy(base + (size_t)off * es, (char *)dense + (size_t)i * es, es);
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < t->size[d]) break;
            idx[d] = 0;
        }
    }
}

/* A host buffer through the core's allocator, freed on scope exit. */
struct host_buffer {
    void *ptr = nullptr;
    size_t n = 0;
    ~host_buffer() {
        if (ptr) k3_host_free(ptr, n);
    }
    bool alloc(size_t bytes) {
        ptr = k3_host_alloc(bytes ? bytes : 1);
        n = bytes ? bytes : 1;
        return ptr != nullptr;
    }
};

k3_status copy_h2d(k3_tensor *dst, const k3_tensor *src) {
    int dev = k3c_dev(dst);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx));
    int64_t n = k3_tensor_numel(dst);
    size_t sbytes = (size_t)n * k3_dtype_size(src->dtype);
    host_buffer hb;
    const void *host = k3_tensor_ptr(src);
    if (!is_dense(src)) {
        if (!hb.alloc(sbytes))
            return k3_error(K3_ENOMEM, "copy: out of host memory staging %zu bytes", sbytes);
        host_strided(hb.ptr, src, true);
        host = hb.ptr;
    }
    if (src->dtype == dst->dtype && is_dense(dst)) {
        K3_CHECK(cudaMemcpyAsync(k3_tensor_ptr(dst), host, sbytes, cudaMemcpyHostToDevice,
                                 ctx->stream));
    } else {
        k3c_buffer tmp;
        K3_TRY(tmp.alloc(dev, sbytes));
        K3_CHECK(cudaMemcpyAsync(tmp.ptr, host, sbytes, cudaMemcpyHostToDevice, ctx->stream));
        k3c_temp_tensor tt;
        k3c_temp_init(&tt, tmp.ptr, sbytes, dev, src->dtype, dst->ndim, dst->size);
        K3_TRY(copy_on_device(dst, &tt.t, ctx->stream));
    }
    /* The source may be pinned memory the caller reuses at once: finish before returning. */
    K3_CHECK(cudaStreamSynchronize(ctx->stream));
    return K3_OK;
}

k3_status copy_d2h(k3_tensor *dst, const k3_tensor *src) {
    int dev = k3c_dev(src);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx));
    int64_t n = k3_tensor_numel(dst);
    size_t dbytes = (size_t)n * k3_dtype_size(dst->dtype);
    k3c_buffer tmp;
    const void *dsrc = k3_tensor_ptr(src);
    if (!(src->dtype == dst->dtype && is_dense(src))) {
        /* Gather and convert on the device into a dense buffer of dst's dtype. */
        K3_TRY(tmp.alloc(dev, dbytes));
        k3c_temp_tensor tt;
        k3c_temp_init(&tt, tmp.ptr, dbytes, dev, dst->dtype, dst->ndim, dst->size);
        K3_TRY(copy_on_device(&tt.t, src, ctx->stream));
        dsrc = tmp.ptr;
    }
    if (is_dense(dst)) {
        K3_CHECK(cudaMemcpyAsync(k3_tensor_ptr(dst), dsrc, dbytes, cudaMemcpyDeviceToHost,
                                 ctx->stream));
        K3_CHECK(cudaStreamSynchronize(ctx->stream));
        return K3_OK;
    }
    host_buffer hb;
    if (!hb.alloc(dbytes))
        return k3_error(K3_ENOMEM, "copy: out of host memory staging %zu bytes", dbytes);
    K3_CHECK(cudaMemcpyAsync(hb.ptr, dsrc, dbytes, cudaMemcpyDeviceToHost, ctx->stream));
    K3_CHECK(cudaStreamSynchronize(ctx->stream));
    host_strided(hb.ptr, dst, false);
    return K3_OK;
}

k3_status copy_peer(k3_tensor *dst, const k3_tensor *src) {
    int sdev = k3c_dev(src), ddev = k3c_dev(dst);
    k3c_ctx *sc = nullptr, *dc = nullptr;
    K3_TRY(k3c_context(ddev, &dc));
    K3_TRY(k3c_context(sdev, &sc));
    int64_t n = k3_tensor_numel(dst);
    size_t dbytes = (size_t)n * k3_dtype_size(dst->dtype);
    /* Pending work on dst's stream must finish before another device's stream writes it. */
    K3_CHECK(cudaSetDevice(ddev));
    K3_CHECK(cudaStreamSynchronize(dc->stream));
    K3_CHECK(cudaSetDevice(sdev));
    k3c_buffer stmp, dtmp;
    const void *from = k3_tensor_ptr(src);
    if (!(src->dtype == dst->dtype && is_dense(src))) {
        K3_TRY(stmp.alloc(sdev, dbytes));
        k3c_temp_tensor tt;
        k3c_temp_init(&tt, stmp.ptr, dbytes, sdev, dst->dtype, dst->ndim, dst->size);
        K3_TRY(copy_on_device(&tt.t, src, sc->stream));
        from = stmp.ptr;
    }
    void *to = k3_tensor_ptr(dst);
    if (!is_dense(dst)) {
        K3_TRY(dtmp.alloc(ddev, dbytes));
        to = dtmp.ptr;
    }
    K3_CHECK(cudaSetDevice(sdev));
    K3_CHECK(cudaMemcpyPeerAsync(to, ddev, from, sdev, dbytes, sc->stream));
    K3_CHECK(cudaStreamSynchronize(sc->stream));
    if (dtmp.ptr) {
        K3_CHECK(cudaSetDevice(ddev));
        k3c_temp_tensor tt;
        k3c_temp_init(&tt, dtmp.ptr, dbytes, ddev, dst->dtype, dst->ndim, dst->size);
        K3_TRY(copy_on_device(dst, &tt.t, dc->stream));
    }
    return K3_OK;
}

} // namespace

k3_status k3c_copy(k3_tensor *dst, const k3_tensor *src) {
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(dst), &ctx));
    return copy_on_device(dst, src, ctx->stream);
}

k3_status k3c_backend_copy(k3_tensor *dst, const k3_tensor *src) {
    if (k3_tensor_numel(dst) == 0) return K3_OK;
    bool dcuda = dst->storage->device.type == K3_DEVICE_CUDA;
    bool scuda = src->storage->device.type == K3_DEVICE_CUDA;
    if (dcuda && scuda) {
        if (k3c_dev(dst) == k3c_dev(src)) return k3c_copy(dst, src);
        return copy_peer(dst, src);
    }
    if (dcuda) return copy_h2d(dst, src);
    if (scuda) return copy_d2h(dst, src);
    return k3_error(K3_EINTERNAL, "copy: the CUDA backend was asked to copy CPU to CPU");
}

k3_status k3c_backend_fill(k3_tensor *t, double value) {
    int64_t n = k3_tensor_numel(t);
    if (n == 0) return K3_OK;
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(t), &ctx));
    k3c_walk w;
    const int64_t *strides[1] = {t->stride};
    k3c_walk_init(&w, t->ndim, t->size, 1, strides);
    unsigned blocks = k3c_blocks_for(n, kThreads);
    /* The value is rounded on the host by the core's own conversions. */
    const char *name = "launch of fill_kernel";
    dim3 g(blocks), b(kThreads);
    switch (t->dtype) {
    case K3_DTYPE_BF16:
        return k3c_launch_pdl(name, fill_kernel<uint16_t>, g, b, 0, ctx->stream,
                              (uint16_t *)k3_tensor_ptr(t), k3_f64_to_bf16(value), w, n);
    case K3_DTYPE_F16:
        return k3c_launch_pdl(name, fill_kernel<uint16_t>, g, b, 0, ctx->stream,
                              (uint16_t *)k3_tensor_ptr(t), k3_f64_to_f16(value), w, n);
    case K3_DTYPE_F32:
        return k3c_launch_pdl(name, fill_kernel<float>, g, b, 0, ctx->stream,
                              (float *)k3_tensor_ptr(t), (float)value, w, n);
    case K3_DTYPE_F64:
        return k3c_launch_pdl(name, fill_kernel<double>, g, b, 0, ctx->stream,
                              (double *)k3_tensor_ptr(t), value, w, n);
    }
    return k3_error(K3_EINTERNAL, "fill: unknown dtype %d", (int)t->dtype);
}

k3_status k3c_backend_binary(k3_tensor *out, k3_binop op, const k3_tensor *a, const k3_tensor *b,
                             double s, int scalar_first) {
    int64_t n = k3_tensor_numel(out);
    if (n == 0) return K3_OK;
    if ((unsigned)op > K3_DIV) return k3_error(K3_EINVAL, "binary: invalid op %d", (int)op);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(k3c_dev(a), &ctx));
    k3c_walk w;
    const int64_t *strides[3] = {out->stride, a->stride, b ? b->stride : a->stride};
    k3c_walk_init(&w, out->ndim, out->size, 3, strides);
    int mode = b ? 0 : scalar_first ? 2 : 1;
    unsigned blocks = k3c_blocks_for(n, kThreads);
    K3C_DISPATCH_DTYPE(a->dtype, T, {
        /* The scalar stays a double: rounding it first would round twice (DESIGN.md). */
        K3_TRY(k3c_launch_pdl("launch of binary_kernel", binary_kernel<T>, dim3(blocks),
                              dim3(kThreads), 0, ctx->stream, typed<T>(out), (const T *)typed<T>(a),
                              (const T *)(b ? typed<T>(b) : typed<T>(a)), s, (int)op, mode, w, n));
    });
    return K3_OK;
}
