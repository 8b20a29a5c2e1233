/*
 * k3.h — the whole public C contract of k3: tensors, ops, kernel queries, errors,
 * allocator and log hooks. Opaque handles; every call that can fail returns a k3_status
 * and leaves a message for k3_last_error(). The C API is 0-based (dims, indices, blocks),
 * and so are its messages: "narrow: start 3 and length 1 out of range for dim 1 of size 3"
 * speaks of the caller's own start 3 and dim 1, and "linear: x dim 1 (7000) must match w dim
 * 1 (7168)" of K, dim 1 of x [M, K]. (The Lua module counts from 1, in its arguments and in
 * its messages: there the same checks say "dim 2".)
 *
 * NULL: every pointer a function reads or writes must be non-NULL unless its comment says
 * otherwise; a NULL one is K3_EINVAL with "<function>: <argument> is NULL" (the function
 * without its k3_ / k3_tensor_ prefix: "narrow: out is NULL", "dtype_parse: name is NULL").
 * An array may be NULL where it holds no elements: shape with ndim 0, the values of an empty
 * tensor, to_f64's out for an empty tensor. k3_*_free(NULL) is a no-op.
 */
#ifndef K3_H
#define K3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define K3_VERSION_MAJOR 0
#define K3_VERSION_MINOR 1
#define K3_VERSION_PATCH 0
#define K3_VERSION_STRING "0.1.0"

#if defined(__GNUC__)
#define K3_API __attribute__((visibility("default")))
#else
#define K3_API
#endif

/* The largest number of dimensions a tensor may have. */
#define K3_MAX_DIMS 8

/* Result of every call that can fail. K3_OK is 0; the message of the last failure on the
 * calling thread is returned by k3_last_error(). */
typedef enum k3_status {
    K3_OK = 0,
    K3_EINVAL,      /* an argument is invalid (bad value, NULL where required) */
    K3_ESHAPE,      /* shapes disagree or a dimension is out of range */
    K3_ELAYOUT,     /* strides a kernel cannot read (e.g. padded rows for a packed kernel) */
    K3_EDTYPE,      /* wrong or mismatched dtype */
    K3_EDEVICE,     /* wrong or mismatched device, or the device is not available */
    K3_ENOMEM,      /* host or device out of memory; recoverable */
    K3_EOVERFLOW,   /* a size computation overflowed */
    K3_EFREED,      /* the tensor (or its storage) has been freed */
    K3_ENOKERNEL,   /* no registered kernel accepts the call, or a named kernel is absent */
    K3_ECUDA,       /* a CUDA or cuBLAS call failed */
    K3_EIO,         /* a file could not be read or written */
    K3_EFORMAT,     /* a file's contents are malformed */
    K3_EINTERNAL    /* an internal invariant failed (a bug in k3) */
} k3_status;

typedef enum k3_dtype {
    K3_DTYPE_BF16 = 0,
    K3_DTYPE_F16 = 1,
    K3_DTYPE_F32 = 2,
    K3_DTYPE_F64 = 3
} k3_dtype;

typedef enum k3_device_type { K3_DEVICE_CPU = 0, K3_DEVICE_CUDA = 1 } k3_device_type;

/* A device: {K3_DEVICE_CPU, 0} or {K3_DEVICE_CUDA, ordinal}. */
typedef struct k3_device {
    k3_device_type type;
    int index;
} k3_device;

/* An opaque tensor handle: a view (dtype, device, shape, strides in elements, storage
 * offset) on reference-counted storage. Each handle owns one reference to its storage. */
typedef struct k3_tensor k3_tensor;

/* ---- errors ------------------------------------------------------------------------ */

/* The message of the last failed call on this thread ("" if none). Valid until the next
 * k3 call on this thread. At most 1023 bytes: a longer message keeps its start and its end
 * (the reason) with " [... N bytes cut ...] " between them, and user input it echoes (a
 * dtype, device or kernel name) shows at most 200 bytes, marked "... (cut at 200 of N
 * bytes)". */
K3_API const char *k3_last_error(void);
/* The short name of a status ("K3_ELAYOUT"). Never NULL. */
K3_API const char *k3_status_name(k3_status s);

/* ---- hooks -------------------------------------------------------------------------- */

/* Host allocator: malloc/realloc/free semantics on `ud`. realloc(ud, p, old, 0) frees.
 * Set before any tensor exists; NULL restores the C library allocator. Returns K3_EINVAL
 * when live host allocations exist (they would be freed by the wrong allocator): "set_allocator:
 * 3 host allocations are live; set the allocator before creating tensors". */
typedef void *(*k3_alloc_fn)(void *ud, void *ptr, size_t old_size, size_t new_size);
K3_API k3_status k3_set_allocator(k3_alloc_fn fn, void *ud);

typedef enum k3_log_level { K3_LOG_DEBUG = 0, K3_LOG_INFO, K3_LOG_WARN, K3_LOG_ERROR } k3_log_level;
/* Log callback; k3 never prints. NULL (the default) drops messages. */
typedef void (*k3_log_fn)(void *ud, k3_log_level level, const char *message);
K3_API void k3_set_log(k3_log_fn fn, void *ud);

/* ---- devices and dtypes -------------------------------------------------------------- */

/* Parses "cpu", "cuda", "cuda:N" (N in 0..1023) into *out. Errors: K3_EDEVICE naming the
 * text when it is none of these; K3_EINVAL when text or out is NULL ("device_parse: text is
 * NULL", "device_parse: out is NULL"). */
K3_API k3_status k3_device_parse(const char *text, k3_device *out);
/* Writes "cpu" or "cuda:N" into buf (n bytes, at least 16 to hold any device) and returns
 * buf. A value that is no device is written as it is ("cpu:3", "device type 5"). buf NULL or
 * n 0: nothing is written and "" is returned. */
K3_API const char *k3_device_name(k3_device d, char *buf, size_t n);
/* Parses "bf16", "f16", "f32", "f64" into *out (also "float32" etc. are rejected: names are
 * fixed). Errors: K3_EDTYPE "unknown dtype '<name>' (...)"; K3_EINVAL when name or out is
 * NULL ("dtype_parse: name is NULL"). */
K3_API k3_status k3_dtype_parse(const char *name, k3_dtype *out);
K3_API const char *k3_dtype_name(k3_dtype d);
/* Element size in bytes (2, 2, 4, 8). */
K3_API size_t k3_dtype_size(k3_dtype d);

/* Round-to-nearest-even conversions; NaN stays NaN (quiet), infinities stay infinite. */
K3_API uint16_t k3_f32_to_bf16(float x);
K3_API float k3_bf16_to_f32(uint16_t x);
K3_API uint16_t k3_f32_to_f16(float x);
K3_API float k3_f16_to_f32(uint16_t x);
/* f64 -> f16/bf16 rounded once (not through f32: no double rounding). */
K3_API uint16_t k3_f64_to_bf16(double x);
K3_API uint16_t k3_f64_to_f16(double x);
/* An integer rounded once (to nearest, ties to even) to dtype dt, returned as the double that
 * holds exactly that value, so k3_tensor_full, k3_tensor_fill, k3_tensor_set and
 * k3_tensor_from_f64 store it unchanged. Converting an integer above 2^53 to double first
 * would round twice: 2^55 + 2^31 + 1 gives 2^55 + 2^31 as a double, then 2^55 in f32 (a tie
 * to even), where rounding once gives 2^55 + 2^32. Beyond f16's range the result is inf. */
K3_API double k3_int64_to_dtype(int64_t v, k3_dtype dt);
/* The exact value of an 8-bit float code, as the OCP 8-bit floating point specification (v1.0)
 * defines it. E4M3 (bias 7, 3 mantissa bits) has no infinities; 0x7F and 0xFF are NaN, 448 the
 * largest finite value. E5M2 (bias 15, 2 mantissa bits) follows IEEE-754: infinities at 0x7C
 * and 0xFC, NaN above them. Both are exact in bf16, f16, f32 and f64 (k3 has no FP8 tensors:
 * safetensors files holding F8_E4M3 or F8_E5M2 load through these). */
K3_API double k3_f8e4m3_to_f64(uint8_t v);
K3_API double k3_f8e5m2_to_f64(uint8_t v);

/* ---- tensors ------------------------------------------------------------------------- */

/* New tensor with uninitialised contents, contiguous row-major, on `device` with `dtype`.
 * ndim in 0..K3_MAX_DIMS (0 = scalar: shape may then be NULL), each shape[i] >= 0; device
 * is {K3_DEVICE_CPU, 0} or {K3_DEVICE_CUDA, ordinal >= 0}. Errors: K3_EINVAL (out NULL,
 * shape NULL with ndim > 0, a device that is no device: "empty: invalid device type 5 ...",
 * "empty: invalid device index 3 for cpu (must be 0)"), K3_EDTYPE (dtype not a k3_dtype),
 * K3_ESHAPE (ndim or a size out of range), K3_EOVERFLOW (numel or bytes overflow),
 * K3_ENOMEM, K3_EDEVICE (the CUDA device is not available or does not exist). *out owns one
 * reference; it is untouched on error. */
K3_API k3_status k3_tensor_empty(k3_tensor **out, int ndim, const int64_t *shape,
                                 k3_dtype dtype, k3_device device);
/* Like k3_tensor_empty (same arguments and errors, named "full:"), then every element set to
 * value (rounded once to dtype). */
K3_API k3_status k3_tensor_full(k3_tensor **out, int ndim, const int64_t *shape,
                                k3_dtype dtype, k3_device device, double value);
/* Standard normal values from a counter-based generator (Philox-4x32-10 + Box-Muller) on
 * the host: element i (row-major) depends only on (seed, i), so a seed gives the same
 * values on every device, for every dtype before rounding and for every host thread count
 * (a tensor of 2^20 elements or more is filled by k3_host_threads() threads, started and
 * joined within the call). Arguments and errors as k3_tensor_empty (named "randn:"). */
K3_API k3_status k3_tensor_randn(k3_tensor **out, int ndim, const int64_t *shape,
                                 k3_dtype dtype, k3_device device, uint64_t seed);
/* The host threads that fill a generated tensor of 2^20 elements or more (k3_tensor_randn,
 * k3_tensor_from_f64): initially K3_HOST_THREADS (a whole number >= 1; 1 keeps the work on
 * the calling thread), else the online CPUs, at most 64, read once (a malformed value is
 * reported once through the log hook and ignored). k3_set_host_threads(n) sets it for the
 * process: 1..64, else K3_EINVAL naming n, and the count is unchanged. Thread-safe. */
K3_API int k3_host_threads(void);
K3_API k3_status k3_set_host_threads(int n);
/* New tensor from `numel` row-major doubles, rounded once to dtype. Arguments and errors as
 * k3_tensor_empty (named "from_f64:"); values may be NULL only when numel is 0
 * ("from_f64: values is NULL" otherwise). */
K3_API k3_status k3_tensor_from_f64(k3_tensor **out, int ndim, const int64_t *shape,
                                    k3_dtype dtype, k3_device device, const double *values);

/* Drops this handle's reference; the storage is released with its last reference.
 * NULL is a no-op. */
K3_API void k3_tensor_free(k3_tensor *t);
/* Releases the storage's memory now, whatever other views exist: every handle on that
 * storage then fails with K3_EFREED ("tensor has been freed"). Also frees the handle. */
K3_API void k3_tensor_release(k3_tensor *t);
/* K3_OK when t is usable; K3_EFREED (with message) when its storage has been released;
 * K3_EINVAL when t is NULL. `what` names the argument in messages. */
K3_API k3_status k3_tensor_check(const k3_tensor *t, const char *what);
/* Marks t's storage static: from now on every write into it (k3_tensor_copy into it, fill,
 * set, an op's out) is refused with K3_EINVAL naming `owner` ("copy: the destination is
 * static (marked by k3.nn.Linear weight); its storage refuses writes"). A low-latency method
 * told static_weights marks each weight it runs the skinny kernel on (without waiting; that
 * first call then loads w after the wait); k3.nn layers mark their weights. The first mark of a
 * CUDA storage here waits for this thread's queued device work (k3_synchronize: not while a
 * stream is being captured), so no write queued before it is still in flight when a kernel
 * that loads the weight early starts. Marking again keeps the first owner. owner NULL: "the
 * caller".
 * Errors: K3_EINVAL (t NULL), K3_EFREED, and k3_synchronize's (the mark stays). */
K3_API k3_status k3_tensor_mark_static(k3_tensor *t, const char *owner);
/* 1 when t's storage is marked static, else 0 (also for NULL). */
K3_API int k3_tensor_is_static(const k3_tensor *t);
/* K3_OK when t may be written; K3_EINVAL "<op>: <what> is static (marked by <owner>); its
 * storage refuses writes" when its storage is marked static. */
K3_API k3_status k3_tensor_writable(const k3_tensor *t, const char *op, const char *what);

K3_API int k3_tensor_ndim(const k3_tensor *t);
/* Size / stride of dimension d (0-based); d out of range returns -1. */
K3_API int64_t k3_tensor_size(const k3_tensor *t, int d);
K3_API int64_t k3_tensor_stride(const k3_tensor *t, int d);
K3_API int64_t k3_tensor_offset(const k3_tensor *t);
K3_API int64_t k3_tensor_numel(const k3_tensor *t);
K3_API k3_dtype k3_tensor_dtype(const k3_tensor *t);
K3_API k3_device k3_tensor_device(const k3_tensor *t);
/* 1 when the strides are the row-major strides of the shape (size-1 dims ignored). */
K3_API int k3_tensor_is_contiguous(const k3_tensor *t);
/* Address of element 0 of the view (storage base + offset * element size). Device memory
 * for CUDA tensors. NULL for a freed tensor. */
K3_API void *k3_tensor_data(const k3_tensor *t);

/* Views: each returns in *out a new handle sharing t's storage (one more reference; the
 * caller frees it). out and t must be non-NULL (K3_EINVAL "<view>: out is NULL" / "t is
 * NULL"); a freed t is K3_EFREED. Dims are 0-based; a dim out of range is K3_ESHAPE
 * ("narrow: dim must be in 0..1 for a 2-dim tensor; got 2"). */
/* Dim d, elements [start, start+length). K3_ESHAPE when out of range, with the caller's own
 * values: "narrow: start 3 and length 1 out of range for dim 1 of size 3". */
K3_API k3_status k3_tensor_narrow(k3_tensor **out, const k3_tensor *t, int d, int64_t start,
                                  int64_t length);
/* Removes dim d, taking index i (0-based; K3_ESHAPE "select: index 2 out of range for dim 0
 * of size 2"). */
K3_API k3_status k3_tensor_select(k3_tensor **out, const k3_tensor *t, int d, int64_t i);
/* Dims d1 and d2 swapped. */
K3_API k3_status k3_tensor_transpose(k3_tensor **out, const k3_tensor *t, int d1, int d2);
/* Same elements, new shape; t must be contiguous (K3_ELAYOUT otherwise). One size may be
 * -1 (inferred). shape may be NULL only when ndim is 0. */
K3_API k3_status k3_tensor_view(k3_tensor **out, const k3_tensor *t, int ndim,
                                const int64_t *shape);
/* Reshape, permute, squeeze, unsqueeze (the Torch7/PyTorch forms; 0-based dims):
 *  - reshape: t's elements in row-major order in a new shape (one size may be -1); a view when
 *    t's strides allow one (PyTorch's view rule: dims may be split or merged only where they
 *    are contiguous with one another), else a contiguous copy (K3_ENOMEM/K3_EDEVICE as
 *    k3_tensor_empty, named "reshape:"). Element-count mismatch is K3_ESHAPE ("reshape: shape
 *    [4, 2] has 8 elements; tensor has 6").
 *  - permute: dims[i] is the dim of t that becomes dim i; a permutation of 0..ndim-1, else
 *    K3_ESHAPE ("permute: dim 2 appears twice (positions 1 and 2)").
 *  - squeeze: drops dim d when its size is 1 (a no-op for another size), or every size-1 dim
 *    when d is -1.
 *  - unsqueeze: a new size-1 dim at position d (0..ndim); K3_ESHAPE for a K3_MAX_DIMS-dim t.
 * Each but reshape's copy shares t's storage. */
K3_API k3_status k3_tensor_reshape(k3_tensor **out, const k3_tensor *t, int ndim,
                                   const int64_t *shape);
K3_API k3_status k3_tensor_permute(k3_tensor **out, const k3_tensor *t, int ndim,
                                   const int *dims);
K3_API k3_status k3_tensor_squeeze(k3_tensor **out, const k3_tensor *t, int d);
K3_API k3_status k3_tensor_unsqueeze(k3_tensor **out, const k3_tensor *t, int d);
/* Broadcast size-1 dims (and new leading dims) to shape with stride 0. shape may be NULL
 * only when ndim is 0. */
K3_API k3_status k3_tensor_expand(k3_tensor **out, const k3_tensor *t, int ndim,
                                  const int64_t *shape);
/* An arbitrary view: shape, strides and offset are checked against the storage bounds.
 * shape and stride may be NULL only when ndim is 0. Its elements may overlap (a stride 0,
 * or strides smaller than the span of the other dims): reading is fine; see "In-place
 * writes" for writing. */
K3_API k3_status k3_tensor_as_strided(k3_tensor **out, const k3_tensor *t, int ndim,
                                      const int64_t *shape, const int64_t *stride,
                                      int64_t offset);

/* New tensor in *out (the caller frees it), contiguous, on `device` with `dtype`, holding
 * t's values. Errors as k3_tensor_empty (named "to:"), K3_EFREED for a freed t. */
K3_API k3_status k3_tensor_to(k3_tensor **out, const k3_tensor *t, k3_device device,
                              k3_dtype dtype);

/* In-place writes through views. Views can make several elements of a tensor share memory
 * (expand's stride 0, an as_strided view with shape [2, 2] and strides [1, 1]). One rule,
 * whatever makes them share it:
 *  - a write of distinct values into a destination whose elements overlap is refused with
 *    K3_ELAYOUT, before anything is written: k3_tensor_copy's dst ("copy: destination is
 *    written but its elements overlap (shape [2, 2], strides [1, 1])", or for a broadcast
 *    dim "copy: destination dim 0 has stride 0 (a broadcast view); it cannot be written"),
 *    and every op's out, and attn_res's updated prefix and written block ("linear: out is
 *    written but its elements overlap (shape [2, 4], strides [0, 1])");
 *  - k3_tensor_fill (one value) and k3_tensor_set (one element) are well defined through
 *    any view and write through overlapping ones: every element sharing the memory then
 *    reads the value written;
 *  - copying a view onto itself (same storage, offset, shape, strides and dtype) changes
 *    nothing and is allowed.
 * The overlap test sorts the dims of size > 1 by stride and asks each stride to exceed the
 * span of the smaller ones. It costs O(ndim^2) and is exact for every view made by narrow,
 * select, transpose, view and expand; it is conservative for as_strided views whose dims
 * interleave without sharing an element (shape [3, 2], strides [2, 3] touches 0, 3, 2, 5,
 * 4, 7: disjoint, but refused as a destination). */

/* Copies src into dst elementwise (same shape; any strides, dtypes and devices), each value
 * rounded once to dst's dtype. src may overlap dst (it is then read through a temporary).
 * Errors: K3_EINVAL (dst or src NULL), K3_EFREED, K3_ESHAPE (shapes differ), K3_ELAYOUT (dst's
 * elements overlap: "In-place writes" above), K3_EDEVICE, K3_ENOMEM. */
K3_API k3_status k3_tensor_copy(k3_tensor *dst, const k3_tensor *src);
/* Sets every element of t to value (rounded once to t's dtype), through any view, also an
 * overlapping one ("In-place writes"). Errors: K3_EINVAL (t NULL), K3_EFREED, K3_EDEVICE. */
K3_API k3_status k3_tensor_fill(k3_tensor *t, double value);
/* *out = the element at 0-based index idx[0..ndim-1] as double (synchronises for device
 * tensors). idx may be NULL for a 0-dim t. Errors: K3_EINVAL (t, idx or out NULL),
 * K3_EFREED, K3_ESHAPE ("get: index 2 out of range for dim 0 of size 2"). */
K3_API k3_status k3_tensor_get(const k3_tensor *t, const int64_t *idx, double *out);
/* Sets the element at 0-based index idx[0..ndim-1] to value (rounded once), through any view
 * ("In-place writes"). idx may be NULL for a 0-dim t. Errors as k3_tensor_get. */
K3_API k3_status k3_tensor_set(k3_tensor *t, const int64_t *idx, double value);
/* All elements, row-major, as doubles into out[numel] (out may be NULL when numel is 0).
 * Errors: K3_EINVAL (t or out NULL), K3_EFREED, K3_ENOMEM. */
K3_API k3_status k3_tensor_to_f64(const k3_tensor *t, double *out);

/* Elementwise ops into a new tensor of a's shape, dtype and device (*out; the caller frees
 * it). Each element is computed from the exact operands (a double scalar is not rounded to
 * the dtype first) and rounded once to the dtype (docs/DESIGN.md). */
/* K3_DIV is IEEE division (x / 0 is an infinity or NaN, never an error). */
typedef enum k3_binop { K3_ADD = 0, K3_SUB, K3_MUL, K3_DIV } k3_binop;
/* out = a (op) b; shapes must match exactly, dtypes and devices too. Errors: K3_EINVAL
 * (out, a or b NULL: "binary: b is NULL"; op not a k3_binop), K3_EFREED, K3_ESHAPE,
 * K3_EDTYPE, K3_EDEVICE, K3_ENOMEM. */
K3_API k3_status k3_tensor_binary(k3_tensor **out, k3_binop op, const k3_tensor *a,
                                  const k3_tensor *b);
/* out = a (op) s, or s (op) a when scalar_first. Errors as k3_tensor_binary (named
 * "binary_scalar:" for NULL arguments). */
K3_API k3_status k3_tensor_binary_scalar(k3_tensor **out, k3_binop op, const k3_tensor *a,
                                         double s, int scalar_first);
/* *out = max |a - b| over elements (NaN if any element is NaN); same shape. Errors: K3_EINVAL
 * (a, b or out NULL: "max_abs_diff: out is NULL"), K3_EFREED, K3_ESHAPE, K3_ENOMEM; the same
 * for k3_allclose and k3_cosine under their names. */
K3_API k3_status k3_max_abs_diff(const k3_tensor *a, const k3_tensor *b, double *out);
/* *out = 1 when |a-b| <= atol + rtol*|b| everywhere, else 0 (b is the reference, as in
 * NumPy). NaN is never close; an infinity is close only to the same infinity, in a or in b
 * (so allclose(0, inf) and allclose(-inf, inf) are 0 both ways round). Errors as
 * k3_max_abs_diff, and K3_EINVAL for a negative or NaN atol or rtol ("allclose: atol must be
 * a number >= 0; got -1"). */
K3_API k3_status k3_allclose(const k3_tensor *a, const k3_tensor *b, double atol, double rtol,
                             int *out);
/* *out = <a,b> / (|a| |b|), computed in f64 (scaled so that huge values do not overflow);
 * NaN when a or b is all zeros (both, and two empty tensors, included): a zero vector has no
 * direction, and NaN fails a check like cosine >= 0.999 where 1 would pass it. */
K3_API k3_status k3_cosine(const k3_tensor *a, const k3_tensor *b, double *out);


/* ---- kernels, policy and dispatch -------------------------------------------------------- */

/* Registered kernels ("cpu.linear.blas", "cuda.attn_res.decode", …), in registration order.
 * A kernel named in K3_DISABLE_KERNELS (comma-separated; whitespace around a name is ignored)
 * is never registered. The variable is read once, when the registry is set up; a name that is
 * no known kernel disables nothing and is reported once through the log hook (K3_LOG_WARN;
 * the Lua module writes it to stderr when no hook is set). */
K3_API int k3_kernel_count(void);
K3_API const char *k3_kernel_name(int i);            /* NULL when i is out of range */
K3_API int k3_has_kernel(const char *name);          /* 1 when registered now */
/* Whether `backend` ("cpu", "cuda") is available; *reason (may be NULL) gets a one-line
 * reason when it is not (static string, valid for the process). */
K3_API int k3_backend_available(const char *backend, const char **reason);
/* Number of CUDA devices the backend sees (0 without the backend). */
K3_API int k3_cuda_device_count(void);
/* "sm90" style architecture name of a CUDA device, for per-device policy plans. */
K3_API k3_status k3_cuda_arch(int device, char *buf, size_t n);
/* Releases cached device memory back to the driver (no-op without CUDA). */
K3_API k3_status k3_empty_cache(void);

/* ---- memory counters (lib/error.c, lib/tensor.c) ---------------------------------------- */

/* Process-wide counters of what k3 holds now. host_bytes: every live host allocation k3 made
 * through its allocator (tensor storage, handles, scratch, parsed headers), in the sizes it
 * asked for; host_peak: the most host_bytes reached since the process started or the last
 * k3_memory_reset_peak; device_bytes: live device tensor storage, as tensors requested it (the
 * backend's caching allocator rounds up and keeps freed blocks: the driver sees more).
 * host_allocations / device_allocations count live allocations. */
typedef struct k3_memory_stats {
    uint64_t host_bytes, host_peak, host_allocations;
    uint64_t device_bytes, device_peak, device_allocations;
} k3_memory_stats;
K3_API void k3_memory(k3_memory_stats *out); /* out NULL: no-op */
/* Sets host_peak and device_peak to the current host_bytes and device_bytes. */
K3_API void k3_memory_reset_peak(void);

/* A compiled policy: per op, the ordered candidate kernels, what a layout mismatch does,
 * and the batch-invariant mode of the calls made with it. k3_policy_new gives the built-in
 * default (see lua/k3/policy/default.lua) with batch-invariant mode set to the process
 * default (k3_batch_invariant()) at that moment; *out is owned by the caller
 * (k3_policy_free). Each lua_State owns one policy: its k3.set_policy and
 * k3.set_batch_invariant change that policy only. */
typedef struct k3_policy k3_policy;
/* *out = a new policy holding the built-in default; free with k3_policy_free. Errors:
 * K3_EINVAL ("policy_new: out is NULL"), K3_ENOMEM. */
K3_API k3_status k3_policy_new(k3_policy **out);
/* NULL is a no-op. */
K3_API void k3_policy_free(k3_policy *p);
/* Sets the candidates of op ("linear", "attn_res", "rms_norm", "silu_mul") to names[0..n-1].
 * Every name must be a kernel k3 knows for that op (registered or not in this build):
 * K3_EINVAL names the first unknown one. At most K3_MAX_CANDIDATES. K3_EINVAL also for p or
 * op NULL, names NULL with n > 0, or a NULL names[i] ("policy_set_candidates: names[1] is
 * NULL"). */
#define K3_MAX_CANDIDATES 16
K3_API k3_status k3_policy_set_candidates(k3_policy *p, const char *op, const char *const *names,
                                          int n);
/* The candidates of op in batch-invariant mode, which dispatch walks instead of op's own list
 * while the mode is on (k3_policy_set_batch_invariant); n 0 leaves op's own list to serve that
 * mode too. The built-in default lists cuda.linear.batch_invariant, cpu.linear.batch_invariant
 * for linear, none for the row-wise ops. Names and errors as k3_policy_set_candidates
 * ("policy_set_invariant_candidates: p is NULL"). */
K3_API k3_status k3_policy_set_invariant_candidates(k3_policy *p, const char *op,
                                                    const char *const *names, int n);
/* fallback 0: "error" (the default: a kernel's layout error is raised), 1: "fallback" (it
 * becomes a decline and dispatch goes on). Any other value, or p NULL, is K3_EINVAL
 * ("policy_set_layout_fallback: fallback must be 0 (error) or 1 (fallback); got 7"). */
K3_API k3_status k3_policy_set_layout_fallback(k3_policy *p, int fallback);
/* Batch-invariant mode of the calls made with p (k3_call.policy = p, or a method applied with
 * such a call): low-latency plans decline and linear runs its fixed-order reduction, so a
 * row's result does not depend on M. K3_EINVAL when p is NULL ("policy_set_batch_invariant:
 * p is NULL"). */
K3_API k3_status k3_policy_set_batch_invariant(k3_policy *p, int on);
/* p's batch-invariant mode (1 or 0); p NULL: the process default, k3_batch_invariant(). */
K3_API int k3_policy_batch_invariant(const k3_policy *p);
/* Kernel names k3 knows, registered or not ("cuda.linear.skinny" on a CPU-only build). */
K3_API int k3_known_kernel(const char *name);
/* Reading a policy back (p NULL: the built-in default): the number of candidates of op (-1 for
 * an op k3 does not know, or op NULL), candidate i (0-based; NULL out of range), the same for
 * the batch-invariant list, and the layout mode (0 "error", 1 "fallback"). */
K3_API int k3_policy_count(const k3_policy *p, const char *op);
K3_API const char *k3_policy_candidate(const k3_policy *p, const char *op, int i);
K3_API int k3_policy_invariant_count(const k3_policy *p, const char *op);
K3_API const char *k3_policy_invariant_candidate(const k3_policy *p, const char *op, int i);
K3_API int k3_policy_layout_fallback(const k3_policy *p);

/* What one dispatch decided. */
#define K3_MAX_DECLINES 16
typedef struct k3_decline {
    char kernel[64];
    char reason[256];
} k3_decline;
typedef struct k3_dispatch {
    char op[16];
    char chosen[64]; /* "" when nothing was chosen */
    int ndeclined;
    k3_decline declined[K3_MAX_DECLINES];
    int captured; /* 1: made while a CUDA graph was being captured (k3_graph_capture) */
} k3_dispatch;

/* Per-call options of every op; a NULL k3_call means all defaults. */
typedef struct k3_call {
    const k3_policy *policy; /* NULL: the built-in default policy with the process default
                              * batch-invariant mode (k3_batch_invariant()) */
    const char *kernel;      /* non-NULL: run exactly this kernel (after the op's validation),
                              * skipping the candidates */
    int explain_only;        /* decide only; nothing runs and nothing is written */
    k3_dispatch *record;     /* when non-NULL, filled with the decision */
} k3_call;

/* The process default of batch-invariant mode (see k3_policy_set_batch_invariant): the mode
 * of calls made without a policy (call NULL or call->policy NULL), and the initial mode of
 * every policy made afterwards by k3_policy_new, hence of every lua_State opened afterwards.
 * It does not change existing policies or open lua_States: each state has its own mode
 * (k3.set_batch_invariant). Initially K3_BATCH_INVARIANT, read once: 1/true/yes/on or
 * 0/false/no/off (any case); any other value leaves it off and is reported once through the
 * log hook. Thread-safe. */
K3_API void k3_set_batch_invariant(int on);
K3_API int k3_batch_invariant(void);

/* ---- ops (docs/DESIGN.md "Ops: exact semantics") ------------------------------------------ */
/* Each op validates its arguments once (errors name op, argument, expected and actual), before
 * any kernel is asked or run, call->kernel or not, then dispatches. Results go to `out` when given (it must have the result's shape, dtype and
 * device, must not overlap an input, and its own elements must not overlap: "In-place
 * writes"), else to a new tensor, whose allocation errors name the op ("rms_norm: out of
 * host memory allocating 17592186044416 bytes"). *y (may be NULL when out is given)
 * receives a new handle on the result. With call->explain_only nothing is computed and *y
 * is untouched. A required tensor that is NULL is K3_EINVAL ("linear: x is required"), as
 * are y and out both NULL outside explain_only. */

/* y[M,N] = x[M,K] w[N,K]^T (+ bias[N]) (+ residual[M,N]); fp32 accumulate, rounded once.
 * x, w, bias, residual share dtype and device. */
K3_API k3_status k3_linear(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                           const k3_tensor *bias, const k3_tensor *residual, k3_tensor *out,
                           const k3_call *call);

/* What a linear computes from x before the product (k3_linear_with_prologue): the product's
 * left operand is h instead of x, each element of h computed and rounded to x's dtype exactly
 * as the separate op computes it, so the fused call gives the bits of that op followed by
 * k3_linear on every kernel.
 * K3_LINEAR_PROLOGUE_SILU_MUL: x is [M, 2K], gate | up halves as k3_silu_mul takes it, and
 *   h[M, K] = silu(x[:, :K]) * x[:, K:] (the SwiGLU MLP's down projection).
 * K3_LINEAR_PROLOGUE_RMS_NORM: x is [M, K] and h = k3_rms_norm(x, norm_weight, eps)
 *   (an RMSNorm right before a projection). */
typedef enum k3_linear_prologue {
    K3_LINEAR_PROLOGUE_NONE = 0,
    K3_LINEAR_PROLOGUE_SILU_MUL = 1,
    K3_LINEAR_PROLOGUE_RMS_NORM = 2,
} k3_linear_prologue;
typedef struct k3_linear_prologue_args {
    k3_linear_prologue kind;
    const k3_tensor *norm_weight; /* RMS_NORM: [K], on x's device, any dtype (as rms_norm's w) */
    double eps;                   /* RMS_NORM: finite, >= 0 */
} k3_linear_prologue_args;
/* k3_linear with a prologue (NULL: none): y[M,N] = h w[N,K]^T (+ bias) (+ residual), h as
 * above. SILU_MUL: x must be [M, 2K] against w [N, K] (K3_ESHAPE "linear: x dim 2 (10) must
 * be 2 * w dim 2 (4) = 8 for prologue silu_mul", dims counted as the caller counts them).
 * RMS_NORM: norm_weight must be [K] (K3_ESHAPE "linear: norm_weight must be [K] = [4] (w dim
 * 2); got [3]") on x's device, eps finite and >= 0 (K3_EINVAL). Both: x has unit stride in its
 * last dim (K3_ELAYOUT); a kind out of range, or a norm_weight with another kind, is
 * K3_EINVAL. A kernel that cannot apply a prologue declines with a reason and dispatch goes
 * on to the next. */
K3_API k3_status k3_linear_with_prologue(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                                         const k3_tensor *bias, const k3_tensor *residual,
                                         const k3_linear_prologue_args *prologue,
                                         k3_tensor *out, const k3_call *call);

/* What a linear computes from its product before it writes (k3_linear_fused): the product y
 * is rounded to x's dtype first, exactly as k3_linear writes it, then the separate op runs on
 * it with its own arithmetic and rounding, so the fused call gives the bits of k3_linear
 * followed by that op on every kernel.
 * K3_LINEAR_EPILOGUE_SILU_MUL: w is [2N, K], gate rows 0..N-1 then up rows N..2N-1 (the SwiGLU
 *   MLP's gate_up weight), bias (if any) [2N], and the result is h[M, N] = silu(y[:, :N]) *
 *   y[:, N:] as k3_silu_mul computes it from y = x w^T (+ bias). */
typedef enum k3_linear_epilogue {
    K3_LINEAR_EPILOGUE_NONE = 0,
    K3_LINEAR_EPILOGUE_SILU_MUL = 1,
} k3_linear_epilogue;
/* k3_linear with a prologue (NULL: none) and an epilogue: out = epilogue(k3_linear_with_prologue
 * (x, w, bias, prologue)). SILU_MUL: w's dim 0 must be even (K3_ESHAPE "linear: w dim 0 (7) must
 * be even for epilogue silu_mul"), out [M, N] = [M, w dim 0 / 2] (K3_ESHAPE "linear: out must be
 * [2, 3]; got [2, 6]"), residual NULL (K3_EINVAL: the residual would be added before the gate;
 * add it to the result instead). A prologue and the epilogue together compute the prologue's h,
 * the product, then the epilogue: the bits of the three ops in that order. An epilogue out of
 * range is K3_EINVAL. Every linear kernel applies it, in the kernel or through a temporary y
 * [M, 2N] and the device's silu_mul kernel. */
K3_API k3_status k3_linear_fused(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                                 const k3_tensor *bias, const k3_tensor *residual,
                                 const k3_linear_prologue_args *prologue,
                                 k3_linear_epilogue epilogue, k3_tensor *out, const k3_call *call);

/* The AttnRes read (docs/DESIGN.md). 0-based write_block, -1 for none; out of range is K3_ESHAPE
 * in the same terms: "attn_res: write_block must be -1 (no write) or in 0..2 (blocks has
 * S = 3 slots); got 3", or with S = 0 "attn_res: write_block must be -1 (no write): blocks
 * has S = 0 slots; got 0". A non-finite or negative eps or output_eps is K3_EINVAL naming
 * it ("attn_res: output_eps must be a finite number >= 0; got nan"). a NULL: K3_EINVAL.
 * A write_block whose rows blocks[t, write_block, :] share an element with a row the call
 * reads from blocks (another slot, another token's slot: a view whose rows overlap) is
 * K3_ELAYOUT naming one such pair and the strides ("attn_res: write_block 1 would overwrite
 * memory the call reads: blocks[0, 1, :] shares elements with blocks[1, 0, :] (blocks strides
 * [4, 4, 1], hidden_size 4)"); the test is exact. blocks with a write_block, and prefix with a
 * delta, must not overlap any other argument at all (a test on their extents). */
typedef struct k3_attn_res_args {
    k3_tensor *prefix;                /* [T,H]; updated in place when delta is given */
    const k3_tensor *delta;           /* [T,H] or NULL */
    k3_tensor *blocks;                /* [T,S,H] */
    int64_t num_blocks;               /* 0..S */
    int64_t write_block;              /* -1, or 0..S-1 */
    const k3_tensor *norm_weight;     /* [H] */
    const k3_tensor *qk_weight;       /* [H] */
    const k3_tensor *output_norm_weight; /* [H] or NULL */
    double eps, output_eps;           /* 1e-5 each by default */
    /* What a kernel launched with programmatic dependent launch may load before it waits for
     * the previous kernel of its stream (DESIGN.md "attn_res"): the three weights when
     * static_weights is nonzero, block slots 0..static_blocks-1. The caller promises they
     * were last written before the previous attn_res call on this stream (or before the
     * stream was last synchronised): a slot sealed by the previous call (its write_block) is
     * not static yet. Why that suffices: every attn_res kernel lets the next kernels start
     * only after its own wait (or runs without PDL), so when this call's kernel starts,
     * everything enqueued before the previous attn_res call is complete. 0 and 0 (the
     * default): everything after the wait. static_blocks outside 0..num_blocks is K3_ESHAPE,
     * static_blocks > write_block when write_block >= 0 is K3_EINVAL. */
    int static_weights;
    int64_t static_blocks;
} k3_attn_res_args;
K3_API k3_status k3_attn_res(k3_tensor **y, const k3_attn_res_args *a, k3_tensor *out,
                             const k3_call *call);
/* y = round(x * rsqrt(mean(x^2) + eps) * w) over the last dim. x [M,H], w [H]. */
K3_API k3_status k3_rms_norm(k3_tensor **y, const k3_tensor *x, const k3_tensor *w, double eps,
                             k3_tensor *out, const k3_call *call);
/* x [M,2I] -> y [M,I] = silu(x[:, :I]) * x[:, I:] (SwiGLU gate). */
K3_API k3_status k3_silu_mul(k3_tensor **y, const k3_tensor *x, k3_tensor *out,
                             const k3_call *call);

/* ---- tensor ops: elementwise functions, reductions, joins and ranges ------------------------ */

/* y = |x|, e^x or sqrt(x) elementwise (sqrt of a negative number is NaN); x any shape,
 * strides (zero strides included) and dtype; y has x's shape and dtype (out, when given,
 * must match and must not overlap x). fp32 arithmetic (fp64 for f64), rounded once: abs and
 * sqrt are exact roundings on every kernel; exp is the math library's expf / exp (within
 * 2 units in the last place of f32, 1 of f64). Errors: K3_EINVAL, K3_EFREED, K3_ESHAPE,
 * K3_EDTYPE, K3_EDEVICE (out), K3_ENOMEM. */
K3_API k3_status k3_abs(k3_tensor **y, const k3_tensor *x, k3_tensor *out, const k3_call *call);
K3_API k3_status k3_exp(k3_tensor **y, const k3_tensor *x, k3_tensor *out, const k3_call *call);
K3_API k3_status k3_sqrt(k3_tensor **y, const k3_tensor *x, k3_tensor *out, const k3_call *call);

/* The fixed order of every sum (sum, mean), a function of the reduced count n alone: the n
 * elements, taken in row-major order as j = 0..n-1, are spread over C = n / K3_REDUCE_CHUNK
 * (at least 1, at most K3_REDUCE_MAX_CHUNKS) groups of K3_REDUCE_LANES lanes: element j goes
 * to lane l = j mod (256 C), which is lane l mod 256 of group l / 256. Each lane adds its
 * elements in order of j into an fp32 accumulator (fp64 for f64 x); each group combines its
 * 256 lanes as a CUDA CTA's warps do (within each 32 lanes a butterfly, v[i] += v[i ^ o] for
 * o = 16, 8, 4, 2, 1, then the 8 results added in order, from 0); the C group results are
 * added in order, from 0. CPU and CUDA kernels follow it to the bit. Its error is at most
 * (n / 250 + 13) * 2^-24 * sum |x| (2^-53 for f64), before the one rounding to the dtype. */
#define K3_REDUCE_LANES 256
#define K3_REDUCE_CHUNK 16384
#define K3_REDUCE_MAX_CHUNKS 512
/* y = the sum (mean: sum / n, in the accumulator, then rounded once) of x over dim `dim`
 * (0-based; y has x's shape with that dim of size 1), or over every element (dim = -1: y is
 * 0-dim). The sum of no elements is 0 and their mean NaN. Any strides and dtype; out, when
 * given, must be exactly y's shape, dtype and device. Errors: K3_EINVAL (x NULL, dim out of
 * range: "sum: dim 3 is out of range for a 2-dim tensor (expected 0..1 or -1 for all)"),
 * K3_EFREED, K3_ESHAPE, K3_EDTYPE, K3_EDEVICE (out), K3_ENOMEM. */
K3_API k3_status k3_sum(k3_tensor **y, const k3_tensor *x, int dim, k3_tensor *out,
                        const k3_call *call);
K3_API k3_status k3_mean(k3_tensor **y, const k3_tensor *x, int dim, k3_tensor *out,
                         const k3_call *call);
/* y = the largest (smallest) element of x over dim `dim` (0-based; kept with size 1) or over
 * every element (dim = -1: 0-dim). A NaN wins: the result is the first NaN. *indices (when
 * indices is not NULL; a new f64 tensor of y's shape on y's device) receives the position of
 * the result along dim (the row-major position when dim = -1) counted from index_base (0 in
 * C, 1 in Lua): the first position among equal values. The result does not depend on the
 * order elements are visited in. Errors as k3_sum, and K3_ESHAPE when the reduced dims
 * have no element ("max: cannot reduce an empty dim 2 (size 0)"). */
K3_API k3_status k3_max(k3_tensor **y, k3_tensor **indices, const k3_tensor *x, int dim,
                        int index_base, k3_tensor *out, const k3_call *call);
K3_API k3_status k3_min(k3_tensor **y, k3_tensor **indices, const k3_tensor *x, int dim,
                        int index_base, k3_tensor *out, const k3_call *call);

/* *out = a new tensor joining the n tensors ts along dim (0-based): every one must have the
 * same ndim, dtype and device and the same size in every other dim (cat), or exactly the same
 * shape (stack, which adds a new dim `dim` of size n, 0 <= dim <= ndim). Copies run on the
 * tensors' device through k3_tensor_copy. Errors: K3_EINVAL (n < 1, a NULL entry, dim out of
 * range), K3_EFREED, K3_ESHAPE, K3_EDTYPE, K3_EDEVICE, K3_ENOMEM, and names the entry
 * ("cat: tensor 2 dim 1 (3) must match tensor 1 (4)"). */
K3_API k3_status k3_tensor_cat(k3_tensor **out, const k3_tensor *const *ts, int n, int dim);
K3_API k3_status k3_tensor_stack(k3_tensor **out, const k3_tensor *const *ts, int n, int dim);
/* *out = the 1-dim tensor [start, start + step, ...) of n elements, each computed as
 * start + i * step in f64 and rounded once to dtype (the caller gives n; for PyTorch's
 * arange(a, b, step) it is ceil((b - a) / step)). Errors: K3_EINVAL (n < 0, start or step
 * not finite), K3_EDTYPE, K3_EDEVICE, K3_ENOMEM. */
K3_API k3_status k3_tensor_arange(k3_tensor **out, double start, double step, int64_t n,
                                  k3_dtype dtype, k3_device device);
/* *out = n points from a to b inclusive (PyTorch's linspace: step = (b - a) / (n - 1);
 * element i is a + i * step for i < n / 2, else b - (n - 1 - i) * step, so both ends are
 * exact), each rounded once to dtype. n = 1 gives {a}. Errors as k3_tensor_arange. */
K3_API k3_status k3_tensor_linspace(k3_tensor **out, double a, double b, int64_t n,
                                    k3_dtype dtype, k3_device device);
/* *out = 1 when a and b have the same shape and equal values (compared in f64 on the host,
 * any dtypes and devices; NaN equals nothing, -0 equals 0, as torch.equal), else 0.
 * Errors: K3_EINVAL (NULL), K3_EFREED, K3_ENOMEM. */
K3_API k3_status k3_tensor_equal(const k3_tensor *a, const k3_tensor *b, int *out);

/* ---- linear methods ------------------------------------------------------------------------ */

/* A linear method: the default (dispatch over the policy's linear candidates) or a
 * low-latency method that runs cuda.linear.skinny per its plan and owns a default method
 * (made by k3_method_default) for every call it declines. */
typedef struct k3_method k3_method;
/* The largest token count M a low-latency plan may name. */
#define K3_PLAN_MAX_M 16
/* The largest k3_plan_entry.l2_prefetch_mb. */
#define K3_PLAN_MAX_L2_PREFETCH_MB 40
typedef struct k3_plan_entry {
    int m;              /* token count 1..K3_PLAN_MAX_M */
    const char *kernel; /* "skinny" or a full kernel name */
    int threads, rows, unroll, vec, split_k; /* 0 = kernel default */
    /* 1: the caller promises that no kernel still in flight when this method's kernel starts
     * writes w (weights loaded once, never rewritten during a decode step), so the skinny
     * kernel may load w before it waits for the previous kernel (programmatic dependent
     * launch); 0: w is read only after that wait, like every other input. */
    int static_weights;
    /* Rows of w each warp streams: 8 (0 = 8), 16 or 32 (two or four 8-row groups sharing
     * each x load; kernels/linear_skinny.cuh lists the configurations compiled that way). */
    int rows_per_warp;
    /* 1: the balanced grid (a multiple of the device's multiprocessor count of CTAs, each
     * taking an equal share of at most `rows` rows of w, so every SM streams the same bytes;
     * one CTA along K, a prologue or epilogue through a temporary); 0: tiles of `rows` rows.
     * Any other value is K3_EINVAL. */
    int balanced;
    /* MiB of w (0..40, 0 = none) the skinny kernel asks L2 to prefetch before it waits for
     * the previous kernel, spread evenly over w's rows (the head of each row's share of K).
     * Measured in the Kimi-K3 step: a gain where the kernel before is a projection draining
     * its last wave, a loss behind a latency-bound kernel (AttnRes, RMSNorm), so the tuners
     * set it per shape (kernels/linear_skinny.cuh, "L2 prefetch"). Correct whoever
     * writes w; other kernels ignore it; outside 0..40 is K3_EINVAL. */
    int l2_prefetch_mb;
} k3_plan_entry;
/* *out = a new method (free with k3_method_free). policy may be NULL (built-in default);
 * the method keeps a copy of what it needs. Errors: K3_EINVAL ("method_default: out is
 * NULL"), K3_ENOMEM. */
K3_API k3_status k3_method_default(k3_method **out, const k3_policy *policy);
/* plan[0..n-1] (plan may be NULL when n is 0; an entry's kernel NULL means "skinny"); each M
 * in 1..16 at most once. Errors: K3_EINVAL (out NULL, n < 0 ("method_low_latency: n must be
 * >= 0; got -1"), plan NULL with n > 0 ("method_low_latency: plan is NULL but n is 2"), a bad
 * entry, named by its M: "method.low_latency: plan M must be in 1..16; got 17", the name Lua
 * users know), K3_ENOMEM. */
K3_API k3_status k3_method_low_latency(k3_method **out, const k3_plan_entry *plan, int n,
                                       const k3_policy *policy);
/* NULL is a no-op. */
K3_API void k3_method_free(k3_method *m);
/* Like k3_linear through the method; call->record gets the decision. A low-latency method
 * looks M up in its plan: a planned kernel is tried before the candidates (its declines,
 * whatever their status, go on to them: it never raises), an M without an entry is recorded as
 * the decline "plan has no entry for M = 3"; batch-invariant mode passes over any plan. The
 * candidates come from the method's policy copy; the batch-invariant mode from the call's
 * policy at call time (k3_policy_batch_invariant(call->policy)). m NULL is K3_EINVAL
 * ("method_apply: m is NULL"); the tensors are checked as k3_linear checks them. When the
 * call fails, call->record still holds the decision so far: where the arguments were refused
 * (a K mismatch, say: before any kernel is asked), op "linear", chosen "" and the plan
 * lookup's decline if it made one; where no kernel took the call (K3_ENOKERNEL, a layout
 * error), every decline. */
K3_API k3_status k3_method_apply(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                                 const k3_tensor *w, const k3_tensor *bias,
                                 const k3_tensor *residual, k3_tensor *out, const k3_call *call);
/* k3_method_apply with a prologue (k3_linear_with_prologue): the plan is looked up by x's M,
 * and the planned kernel and the owned default method's candidates all get the prologue. */
K3_API k3_status k3_method_apply_with_prologue(const k3_method *m, k3_tensor **y,
                                               const k3_tensor *x, const k3_tensor *w,
                                               const k3_tensor *bias, const k3_tensor *residual,
                                               const k3_linear_prologue_args *prologue,
                                               k3_tensor *out, const k3_call *call);

/* k3_method_apply with a prologue (NULL: none) and an epilogue (k3_linear_fused): the plan is
 * looked up by x's M, and the planned kernel and the owned default method's candidates all get
 * both. */
K3_API k3_status k3_method_apply_fused(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                                       const k3_tensor *w, const k3_tensor *bias,
                                       const k3_tensor *residual,
                                       const k3_linear_prologue_args *prologue,
                                       k3_linear_epilogue epilogue, k3_tensor *out,
                                       const k3_call *call);

/* ---- counters ------------------------------------------------------------------------------ */

/* Process-wide totals: calls each kernel served and declines each (kernel, reason) caused, by
 * every caller in the process (C calls and every lua_State), since load or the last
 * k3_stats_reset. fn is called once per entry: kind "kernel" (name, count), "captured" (the
 * calls of that kernel that were captured into a CUDA graph, also counted under "kernel") or
 * "decline" (name = "kernel: reason", count). Thread-safe. A lua_State's k3.stats() and
 * k3.stats_reset() see and clear only that state's own counters, never these totals. */
typedef void (*k3_stats_fn)(void *ud, const char *kind, const char *name, uint64_t count);
K3_API void k3_stats(k3_stats_fn fn, void *ud); /* fn NULL: nothing is called */
K3_API void k3_stats_reset(void);

/* Waits for all queued device work on this thread's streams. */
K3_API k3_status k3_synchronize(void);

/* ---- device timing (benchmarks) ------------------------------------------------------------ */

/* One timed call: fn(ud, i) for i = 1, 2, ... (so it can rotate its inputs). A status other
 * than K3_OK stops the timing; k3_cuda_time returns that status with fn's message. */
typedef k3_status (*k3_time_fn)(void *ud, int64_t i);
typedef struct k3_time_options {
    int iters;  /* samples, 1..100000 */
    int warmup; /* untimed calls before the first sample, >= 0 */
    int graph;  /* 0: each sample is one call, launch overhead included; 1: `calls` calls are
                 * captured into one CUDA graph and each sample is one replay / calls */
    int calls;  /* calls per graph, 1..100000 (1 without graph) */
    int device; /* the CUDA device whose stream is timed */
} k3_time_options;
typedef struct k3_time_result {
    double median_us, min_us, p90_us; /* per call */
    int samples;
} k3_time_result;
/* Times fn on this thread's stream of o->device with CUDA events, after o->warmup untimed
 * calls and a synchronize (o NULL: iters 50, warmup 5, no graph, calls 1, device 0). With
 * graph, the captured work must not allocate or synchronise (give every op its out). Every
 * event and graph is released before returning, on every path. Errors: K3_EINVAL (fn or out
 * NULL: "cuda_time: fn is NULL"; iters or calls out of range: "cuda_time: iters must be in
 * 1..100000 and calls in 1..100000; got iters 0, calls 1"), K3_EDEVICE ("cuda_time: CUDA is
 * not available: <reason>"), K3_ECUDA, and fn's own status. */
K3_API k3_status k3_cuda_time(k3_time_fn fn, void *ud, const k3_time_options *o,
                              k3_time_result *out);

/* ---- CUDA graphs (lib/graph.c, kernels/graph.cu) --------------------------------------------- */

/* A captured sequence of device work: everything fn dispatches on this thread's stream of one
 * CUDA device, recorded once into a CUDA graph and replayed any number of times. Tensors used
 * inside are static: the graph reads and writes the same memory on every replay, so a caller
 * fills the inputs (k3_tensor_copy into them) before k3_graph_replay and reads the outputs
 * after it. What cannot be captured is refused while capturing, with K3_EINVAL naming it, and
 * never reaches CUDA: a host synchronisation (k3_synchronize, k3_empty_cache, a copy to or from
 * the host, an element read, k3_tensor_mark_static's first mark), work on another device or a
 * copy between two devices,
 * an op, copy, fill or arithmetic on CPU tensors, and a device allocation that the caching
 * allocator cannot serve from blocks it held before the capture (it never calls cudaMalloc
 * while capturing: "cuda:0: allocating 28.00 KiB while a CUDA graph is being captured: ...").
 * The warmup calls fill that cache: blocks fn allocated and freed there serve the capture.
 * Every storage a captured op, copy, fill or arithmetic touches is held by the graph until
 * k3_graph_free: after the capture, freeing its tensors (k3_tensor_free, k3_tensor_release)
 * keeps that memory for the replays (k3_tensor_release still marks the views freed). A tensor
 * released during the capture (an intermediate fn frees once consumed) gives its memory to
 * later work of the same capture only, as do the kernels' temporaries: such blocks are the
 * graph's until it is freed, never handed to other work. Dispatch records made while capturing have k3_dispatch.captured set and are counted
 * under the kind "captured" as well (k3_stats). Replays of one graph must not overlap (replay
 * it from one thread); the kernels launch with programmatic dependent launch, so a replay
 * runs them back to back. */
typedef struct k3_graph k3_graph;
/* The captured function: returns K3_OK, or a status (with k3_error's message) that ends the
 * capture and is returned by k3_graph_capture unchanged. */
typedef k3_status (*k3_graph_fn)(void *ud);
typedef struct k3_graph_options {
    int device; /* the CUDA device whose stream is captured (default 0) */
    int warmup; /* eager calls of fn before the capture, then k3_synchronize (default 0) */
} k3_graph_options;
/* Captures fn into *out (o NULL: device 0, no warmup). On any error *out is NULL, the capture
 * is ended and discarded (the stream is usable: eager work runs), and the status is fn's
 * own, a refusal's, or K3_ECUDA when CUDA invalidated the capture. Errors: K3_EINVAL (out or
 * fn NULL: "graph_capture: fn is NULL"; a capture already in progress on this thread:
 * "graph_capture: a CUDA graph is already being captured on this thread"; warmup < 0),
 * K3_EDEVICE ("graph_capture: needs a CUDA device: <reason>", or no such device), K3_ENOMEM,
 * K3_ECUDA. */
K3_API k3_status k3_graph_capture(k3_graph **out, k3_graph_fn fn, void *ud,
                                  const k3_graph_options *o);
/* Launches the graph once on this thread's stream of its device (asynchronous, like the ops).
 * Errors: K3_EINVAL (g NULL, or called while this thread is capturing), K3_ECUDA. */
K3_API k3_status k3_graph_replay(k3_graph *g);
/* Destroys the graph and drops its hold on every storage (memory whose tensors were freed is
 * released then). A replay still running completes first (stream order). NULL: no-op. Called
 * while this thread captures another graph, the destruction waits until that capture ends. */
K3_API void k3_graph_free(k3_graph *g);
/* The graph's kernel nodes (cuBLAS's kernels included), storages held, and device. */
K3_API int k3_graph_kernels(const k3_graph *g);
K3_API int k3_graph_tensors(const k3_graph *g);
K3_API int k3_graph_device(const k3_graph *g);
/* 1 while this thread is inside k3_graph_capture's capture (not its warmup), else 0. */
K3_API int k3_graph_capturing(void);

/* ---- safetensors files (lib/safetensors.c) -------------------------------------------------- */

/* A safetensors checkpoint: one file, or a Hugging Face sharded checkpoint (a directory with
 * model.safetensors.index.json, or that index file). Headers are parsed with cJSON and
 * validated before any data is read: header length (8-byte little-endian, at most the file
 * size - 8 and 100 MB, refused before it is parsed), plain JSON (no byte-order mark, no
 * trailing bytes but the format's space padding), dtype (one the format names; BF16, F16, F32,
 * F64, F8_E4M3 and F8_E5M2 load), shape (<= K3_MAX_DIMS dims, integers: "8.0" is refused),
 * data_offsets within the data section and equal to the shape's byte size, ranges tiling the
 * data section without overlap or gap, names non-empty valid UTF-8 without NUL and unique
 * across shards; "__metadata__" must be an object of strings. The memory cJSON will allocate
 * is estimated from the text and charged to k3's allocator (k3_set_allocator) for the parse,
 * so a host that caps k3's memory refuses a header it cannot afford (K3_ENOMEM); k3 installs
 * no cJSON hooks. Files open with O_NONBLOCK and must be regular (a FIFO is refused, never
 * waited on). Data is copied from a read-only mapping (mmap) of each shard, made for the call
 * that reads it and released before that call returns. */
typedef struct k3_safetensors k3_safetensors;

/* Opens `path` (a file; a directory holding model.safetensors.index.json or model.safetensors;
 * or a path ending in ".json", an index) and reads every header; no data. For an index the
 * tensors are exactly its weight_map's, each in the shard it names (shard names are relative
 * paths inside the index's directory). *out (free with k3_safetensors_free) is NULL on error.
 * Errors: K3_EINVAL (NULL arguments), K3_EIO (cannot open or read, not a regular file),
 * K3_EFORMAT (any malformed field; the message names the file, the tensor and the problem,
 * e.g. `safetensors: w.st: tensor "a": data_offsets [0, 64] out of range: the data section
 * holds 32 bytes`), K3_ENOMEM. */
K3_API k3_status k3_safetensors_open(const char *path, k3_safetensors **out);

/* How k3_safetensors_read makes tensors: on `device` (default CPU), and in `dtype` when
 * `convert` is set, else in the file's dtype (F8_E4M3 / F8_E5M2: bf16). FP8 codes become their
 * exact values (k3_f8e4m3_to_f64), unscaled. */
typedef struct k3_safetensors_read_opts {
    k3_device device;
    int convert;
    k3_dtype dtype;
} k3_safetensors_read_opts;
/* Reads tensors which[0..n) (entry indices; n < 0: every tensor) into st (k3_safetensors_tensor
 * hands them out; a tensor read again replaces the earlier one). opts NULL: CPU, file dtypes.
 * A picked tensor whose dtype k3 cannot hold (I64, BOOL, ...) is refused before any data is
 * read: "safetensors: m.st: tensor "ids": dtype I64 is not loadable (...)" (K3_EFORMAT). A file
 * whose size changed since open is K3_EIO. */
K3_API k3_status k3_safetensors_read(k3_safetensors *st, int n, const int *which,
                                     const k3_safetensors_read_opts *opts);
/* k3_safetensors_open, then every tensor read to the CPU in its file's dtype. */
K3_API k3_status k3_safetensors_load(const char *path, k3_safetensors **out);
/* Number of tensors (0 for NULL). */
K3_API int k3_safetensors_count(const k3_safetensors *st);
/* Name of tensor i (0-based), owned by st; NULL when i is out of range. */
K3_API const char *k3_safetensors_name(const k3_safetensors *st, int i);
/* Index of the tensor called name, or -1. */
K3_API int k3_safetensors_find(const k3_safetensors *st, const char *name);
/* What the header says of tensor i (strings owned by st): dtype as the file names it ("BF16",
 * "F8_E4M3"), shape, the file holding it relative to the directory given (the shard's name in
 * the index; for a single file, its base name), and whether k3 can load that dtype. */
typedef struct k3_safetensors_entry {
    const char *name, *dtype, *file;
    int ndim;
    int64_t shape[K3_MAX_DIMS];
    int loadable;
} k3_safetensors_entry;
K3_API k3_status k3_safetensors_describe(const k3_safetensors *st, int i, k3_safetensors_entry *out);
/* The metadata: a file's "__metadata__", or an index's "metadata" (its numbers written as
 * decimal text). Strings owned by st. */
K3_API int k3_safetensors_metadata_count(const k3_safetensors *st);
K3_API k3_status k3_safetensors_metadata(const k3_safetensors *st, int i, const char **key,
                                         const char **value);
/* *out = a new handle (one more storage reference, the caller frees it) on tensor i.
 * K3_EINVAL when i is out of range, the tensor was not read, or st or out is NULL. The tensor
 * outlives st. */
K3_API k3_status k3_safetensors_tensor(const k3_safetensors *st, int i, k3_tensor **out);
/* Frees the handle and its references; tensors handed out stay valid. NULL: no-op. */
K3_API void k3_safetensors_free(k3_safetensors *st);
/* Writes n tensors (any dtype, device, strides: non-contiguous and device tensors are copied
 * through k3_tensor_to) as contiguous little-endian data, sorted by name, with a cJSON header
 * whose "__metadata__" is {"format": "pt"} plus the nmeta keys[i] = values[i] (sorted; a key
 * "format" replaces the default). The file is written beside `path` and renamed into place, so
 * a failure leaves no partial file. Names must be non-empty valid UTF-8, unique and not
 * "__metadata__"; metadata keys likewise, values valid UTF-8 (K3_EINVAL); path NULL, names or
 * tensors NULL with n > 0, or a NULL names[i] or tensors[i] is K3_EINVAL
 * ("safetensors_save: tensors[2] ("w") is NULL"); a freed tensor is K3_EFREED; write failures
 * K3_EIO, naming `path` as passed (never the temporary file alone): "safetensors_save:
 * /no/dir/x.st: cannot open for writing: No such file or directory". */
K3_API k3_status k3_safetensors_save_metadata(const char *path, int n, const char *const *names,
                                              const k3_tensor *const *tensors, int nmeta,
                                              const char *const *keys, const char *const *values);
/* k3_safetensors_save_metadata without metadata of the caller's. */
K3_API k3_status k3_safetensors_save(const char *path, int n, const char *const *names,
                                     const k3_tensor *const *tensors);

/* ---- tensor parallelism (lib/dist.c, kernels/dist.cu) -------------------------------------- */

/* One communicator per process (one process per GPU, started by `scripts/k3 --nproc N`).
 * At world size 1 nothing is loaded and the collectives are checked no-ops on any device;
 * above 1 they run on NCCL, which the CUDA backend loads with dlopen (libnccl.so.2; override
 * with K3_NCCL_LIBRARY), so the core and a machine without NCCL are unaffected. Every wait is
 * bounded (timeout_s): a failed peer, a timeout or a call whose shape, dtype or kind differs
 * across ranks is an error on every rank, never a hang. After a timeout or a failed peer the
 * communicator is aborted and every later call fails with the first message. */
typedef enum k3_dist_op { K3_DIST_SUM = 0, K3_DIST_MAX = 1, K3_DIST_MIN = 2 } k3_dist_op;
#define K3_DIST_ID_BYTES 128 /* an NCCL unique id */

typedef struct k3_dist_options {
    int rank;          /* -1: K3_RANK (0 when unset) */
    int world_size;    /* 0: K3_WORLD_SIZE (1 when unset) */
    int device;        /* -1: K3_DIST_DEVICE (0 when unset): this rank's CUDA device */
    const char *dir;   /* NULL: K3_DIST_DIR, the launcher's directory for the NCCL id file */
    double timeout_s;  /* <= 0: K3_DIST_TIMEOUT (default 120): bound of every wait */
    int check_shapes;  /* -1: K3_DIST_CHECK (default 1): compare call, dtype and shape
                        * across ranks before each collective, on the host (a shared-memory
                        * board in dir: every rank on one host) */
    int wait_each;     /* -1: K3_DIST_WAIT ("each", the default, = 1; "next" = 0): wait for
                        * each collective before returning, or only before the next one */
} k3_dist_options;
/* Fills *o with the "from the environment" values above. */
K3_API void k3_dist_options_default(k3_dist_options *o);
/* Joins the process group. Rank 0 writes the NCCL id to <dir>/nccl_id.<n> (n counts inits in
 * this process); the other ranks wait for it (bounded, and they stop early when the launcher
 * reports a failed rank in <dir>/failed). Errors: K3_EINVAL (bad rank, world size, missing
 * dir; the message names the variable), K3_EDEVICE (no CUDA backend, no NCCL, no such
 * device), K3_ECUDA (NCCL failure or timeout). Calling it twice without k3_dist_destroy is
 * K3_EINVAL. o NULL: every field from the environment. */
K3_API k3_status k3_dist_init(const k3_dist_options *o);
K3_API int k3_dist_initialized(void);
K3_API int k3_dist_rank(void);       /* 0 before init */
K3_API int k3_dist_world_size(void); /* 1 before init */
K3_API int k3_dist_device(void);     /* this rank's CUDA device index */
/* t <- op over ranks of t, in place. t must be contiguous (K3_ELAYOUT names the strides) and,
 * above world size 1, on this rank's CUDA device (K3_EDEVICE). t NULL or op not a k3_dist_op
 * is K3_EINVAL ("dist_all_reduce: t is NULL"). The messages of the checks shared with Lua
 * name the call as Lua users know it ("k3.dist.all_reduce: call k3.dist.init() first"). */
K3_API k3_status k3_dist_all_reduce(k3_tensor *t, k3_dist_op op);
/* *out = a new contiguous tensor [world * d1, d2, ...]: every rank's t stacked along dim 0 in
 * rank order (a 0-dim t gives [world]). Same checks as all_reduce; out or t NULL is K3_EINVAL
 * ("dist_all_gather: out is NULL"). The caller owns *out. */
K3_API k3_status k3_dist_all_gather(k3_tensor **out, const k3_tensor *t);
/* Returns when every rank's host has called it (bounded like every wait); work queued on
 * the streams is not waited for (k3_synchronize first for that). */
K3_API k3_status k3_dist_barrier(void);
/* Waits (bounded) for the last collective this process queued (wait_each = 0 mode). */
K3_API k3_status k3_dist_synchronize(void);
/* Leaves the group: graceful (finalize, bounded) unless abort is set or the communicator has
 * failed, then aborted. No-op when not initialised. */
K3_API k3_status k3_dist_destroy(int abort);
/* The collectives since init or the last reset. Index 0 all_reduce, 1 all_gather: calls,
 * device time from CUDA events around each NCCL call (it includes waiting for the slowest
 * rank), and stream_waits, the host's bounded waits for a collective on the compute stream
 * (one per call with K3_DIST_WAIT=each, at most one per call with "next"). Index 2 the
 * agreement checks: calls, ms = host time waiting for the other ranks' posts, and
 * stream_waits, always 0 (the check reads host metadata only). reset: zero them after
 * reading. out NULL is K3_EINVAL ("dist_get_stats: out is NULL"). */
typedef struct k3_dist_stats {
    uint64_t calls[3];
    double ms[3];
    uint64_t stream_waits[3];
} k3_dist_stats;
K3_API k3_status k3_dist_get_stats(k3_dist_stats *out, int reset);
/* The collective k3_dist_all_reduce ("all_reduce") or k3_dist_all_gather ("all_gather") runs
 * for t in this process group, as a dispatch record: chosen "nccl.all_reduce" above world
 * size 1, "local.all_reduce" at 1 (the tensor is already the result; a gather copies), and
 * each other candidate declined with its reason ("cuda.all_reduce.one_shot": peer-mapped
 * buffers for messages <= 512 KiB, not in this build). Nothing runs. rec NULL or another
 * collective name is K3_EINVAL. */
K3_API k3_status k3_dist_explain(k3_dispatch *rec, const char *collective, const k3_tensor *t);

/* ---- Lua embedding (libk3lua) --------------------------------------------------------------- */

/* Defined in libk3lua.so (link -lk3lua -lk3, or `pkg-config --libs k3-lua`), not in libk3;
 * lua.h is not needed to declare them. A host that owns a lua_State loads the module with
 *   luaL_requiref(L, "k3", luaopen_k3, 1);
 * which opens "k3.core" and runs lua/k3/init.lua found on package.path (set package.path
 * first: a checkout's lua/, or PREFIX/share/lua/5.4 after `make install`), and pushes the `k3`
 * table. When init.lua is not found it raises a Lua error: call luaL_requiref inside a
 * protected call (lua_pcall of a small C function, as examples/host/host.c does), since an
 * error outside one ends in Lua's panic handler. Each lua_State gets its own tensors, policy
 * (k3.policy, k3.set_policy), batch-invariant mode (k3.set_batch_invariant; it starts as the
 * process default, k3_batch_invariant()) and counters (k3.stats, k3.stats_reset; the process
 * totals stay with k3_stats); states on different threads may use k3 at the same time. */
struct lua_State;
K3_API int luaopen_k3(struct lua_State *L);
/* The C half alone (what `require "k3.core"` loads); init.lua builds `k3` on it. */
K3_API int luaopen_k3_core(struct lua_State *L);

#ifdef __cplusplus
}
#endif
#endif /* K3_H */
