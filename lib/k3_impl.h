/*
 * k3_impl.h — internal structures shared by the C core, the binding and the CUDA backend:
 * the tensor and storage layout, error helpers, op argument blocks, the kernel record and
 * the backend function table. Not installed; not part of the public contract.
 */
#ifndef K3_IMPL_H
#define K3_IMPL_H

#include "k3.h"

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- storage and tensors -------------------------------------------------------------- */

/* Reference-counted memory. Every tensor handle holds one reference. `data` is NULL after
 * k3_tensor_release (then `released` is set and every view reports "tensor has been freed").
 * Device storage's data is a device pointer owned by the backend's allocator. */
typedef struct k3_storage {
    int refcount; /* updated with __atomic builtins (shared by C and CUDA C++) */
    void *data;
    size_t nbytes;
    k3_device device;
    int released; /* __atomic; 1 once the memory is released */
} k3_storage;

struct k3_tensor {
    k3_storage *storage;
    k3_dtype dtype;
    int ndim;
    int64_t size[K3_MAX_DIMS];
    int64_t stride[K3_MAX_DIMS]; /* in elements, >= 0 */
    int64_t offset;              /* in elements */
};

/* ---- errors ---------------------------------------------------------------------------- */

/* Sets this thread's message (printf format) and returns s. The one way k3 reports errors. */
K3_API k3_status k3_error(k3_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with "<prefix>: " (used to add context; a prefix is echoed
 * as k3_echo shows it). Returns s. A message longer than the 1 KB buffer keeps its start and
 * its end (the reason), with " [... N bytes cut ...] " between them. */
K3_API k3_status k3_error_prefix(k3_status s, const char *prefix);
/* Echoed user input in a message (a dtype or device name, a kernel name, a key): at most
 * K3_ECHO_MAX bytes of it, cut back to a UTF-8 character boundary and marked
 * "... (cut at 200 of 10485760 bytes)" when longer. Writes into buf (n bytes; K3_ECHO_SIZE
 * holds any result) and returns buf. */
#define K3_ECHO_MAX 200
#define K3_ECHO_SIZE 256
K3_API const char *k3_echo(char *buf, size_t n, const char *s);
K3_API void k3_log(k3_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Propagates a non-OK status. */
#define K3_TRY(expr)                                                                       \
    do {                                                                                   \
        k3_status k3_try_s_ = (expr);                                                      \
        if (k3_try_s_ != K3_OK) return k3_try_s_;                                          \
    } while (0)

/* Debug-only internal invariant (compiled out with NDEBUG); turns into K3_EINTERNAL. */
#ifndef NDEBUG
#define K3_ASSERT(cond)                                                                    \
    do {                                                                                   \
        if (!(cond))                                                                       \
            return k3_error(K3_EINTERNAL, "internal error: %s (%s:%d)", #cond, __FILE__,  \
                            __LINE__);                                                     \
    } while (0)
#else
#define K3_ASSERT(cond) ((void)0)
#endif

/* ---- host memory through the pluggable allocator --------------------------------------- */

K3_API void *k3_host_alloc(size_t n);            /* NULL on failure (caller reports K3_ENOMEM) */
K3_API void *k3_host_calloc(size_t count, size_t size); /* overflow-checked, zeroed */
K3_API void k3_host_free(void *p, size_t n);     /* n is the size given at allocation */

/* ---- checked size arithmetic ----------------------------------------------------------- */

/* *out = a * b; false on overflow (a, b >= 0). */
static inline bool k3_mul_ok(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool k3_add_ok(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* ---- tensor helpers used across the core ------------------------------------------------ */

/* Element pointer for a CPU tensor at linear (row-major) index decomposition idx. */
static inline void *k3_tensor_ptr(const k3_tensor *t) {
    return (char *)t->storage->data + (size_t)t->offset * k3_dtype_size(t->dtype);
}
/* Largest element offset + 1 the view can touch (0 for an empty view). Overflow-checked by
 * the constructors, so plain arithmetic here is safe. */
K3_API int64_t k3_tensor_extent(const k3_tensor *t);
/* New handle with the same view as t (one more storage reference). */
K3_API k3_status k3_tensor_alias(k3_tensor **out, const k3_tensor *t);
/* Formats "[d1, d2, ...]" of sizes or strides into buf. Returns buf. */
K3_API const char *k3_fmt_dims(char *buf, size_t n, int ndim, const int64_t *v);
/* True when a and b share storage and their extents intersect. */
K3_API bool k3_tensor_overlaps(const k3_tensor *a, const k3_tensor *b);
/* True when two elements of t may share memory: the one test behind every in-place write
 * of distinct values (copy's destination, an op's out, attn_res's updated prefix and block).
 * With the dims of size > 1 sorted by stride, each stride must exceed the span of the
 * smaller ones; a stride 0 (a broadcast view) fails it. Exact for every view made by
 * narrow, select, transpose, view, expand and for dense or padded as_strided views;
 * conservative (it says "overlap") for views whose dims interleave without sharing an
 * element, e.g. shape [3, 2] with strides [2, 3]. */
K3_API bool k3_tensor_self_overlaps(const k3_tensor *t);
/* Formats a double for a message: "nan" (whatever its sign), "inf", "-inf", else %g.
 * Returns buf. */
K3_API const char *k3_fmt_double(char *buf, size_t n, double v);
/* v + base as the caller counts it: base 0 for the C API, 1 for the Lua binding. Computed
 * in unsigned arithmetic so that a 0-based INT64_MAX (a Lua index of math.mininteger after
 * the binding's - 1) prints back as the caller's own value. */
static inline long long k3_based(int64_t v, int base) {
    return (long long)((uint64_t)v + (uint64_t)(int64_t)base);
}

/* ---- message numbering: the C API and the Lua binding ----------------------------------- */
/* The C API counts dims, indices and blocks from 0, and so do its messages. The Lua binding
 * counts from 1 and calls these variants with base 1: the same check, in the same order,
 * then reports its arguments in the caller's own numbering ("narrow: start 1 and length 5
 * out of range for dim 2 of size 3" in Lua, "... start 0 ... dim 1 ..." in C). Each public
 * function is its variant with base 0. `op` (k3_tensor_new) names the caller in messages. */
K3_API k3_status k3_tensor_new(k3_tensor **out, int ndim, const int64_t *shape, k3_dtype dtype,
                               k3_device device, const char *op, int base);
K3_API k3_status k3_tensor_full_base(k3_tensor **out, int ndim, const int64_t *shape,
                                     k3_dtype dtype, k3_device device, double value, int base);
K3_API k3_status k3_tensor_randn_base(k3_tensor **out, int ndim, const int64_t *shape,
                                      k3_dtype dtype, k3_device device, uint64_t seed, int base);
K3_API k3_status k3_tensor_from_f64_base(k3_tensor **out, int ndim, const int64_t *shape,
                                         k3_dtype dtype, k3_device device,
                                         const double *values, int base);
K3_API k3_status k3_tensor_narrow_base(k3_tensor **out, const k3_tensor *t, int d,
                                       int64_t start, int64_t length, int base);
K3_API k3_status k3_tensor_select_base(k3_tensor **out, const k3_tensor *t, int d, int64_t i,
                                       int base);
K3_API k3_status k3_tensor_transpose_base(k3_tensor **out, const k3_tensor *t, int d1, int d2,
                                          int base);
K3_API k3_status k3_tensor_view_base(k3_tensor **out, const k3_tensor *t, int ndim,
                                     const int64_t *shape, int base);
K3_API k3_status k3_tensor_expand_base(k3_tensor **out, const k3_tensor *t, int ndim,
                                       const int64_t *shape, int base);
K3_API k3_status k3_tensor_as_strided_base(k3_tensor **out, const k3_tensor *t, int ndim,
                                           const int64_t *shape, const int64_t *stride,
                                           int64_t offset, int base);
K3_API k3_status k3_tensor_copy_base(k3_tensor *dst, const k3_tensor *src, int base);
K3_API k3_status k3_tensor_to_base(k3_tensor **out, const k3_tensor *t, k3_device device,
                                   k3_dtype dtype, int base);
K3_API k3_status k3_tensor_binary_base(k3_tensor **out, k3_binop op, const k3_tensor *a,
                                       const k3_tensor *b, double s, int scalar_first, int base);
K3_API k3_status k3_tensor_get_base(const k3_tensor *t, const int64_t *idx, double *out,
                                    int base);
K3_API k3_status k3_tensor_set_base(k3_tensor *t, const int64_t *idx, double value, int base);
/* The ops with their messages in the caller's numbering: the dims they name ("linear: x dim
 * 1 (7000) must match w dim 1 (7168)" in C, "... dim 2 ..." in Lua) and attn_res's
 * write_block, which base 1 words as Lua does ("write_block must be in 1..S (blocks dim 2)",
 * "must be nil") and base 0 as C does ("-1 (no write) or in 0..S-1"). The linear one is
 * k3_linear_ext (below), whose last argument is the base. */
K3_API k3_status k3_attn_res_base(k3_tensor **y, const k3_attn_res_args *a, k3_tensor *out,
                                  const k3_call *call, int base);
K3_API k3_status k3_rms_norm_base(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                                  double eps, k3_tensor *out, const k3_call *call, int base);
K3_API k3_status k3_silu_mul_base(k3_tensor **y, const k3_tensor *x, k3_tensor *out,
                                  const k3_call *call, int base);
K3_API k3_status k3_method_apply_base(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                                      const k3_tensor *w, const k3_tensor *bias,
                                      const k3_tensor *residual, k3_tensor *out,
                                      const k3_call *call, int base);
/* Loads element at flat storage index (element units) of dtype as double / float. */
K3_API double k3_load_f64(const void *base, k3_dtype dt, int64_t i);
K3_API float k3_load_f32(const void *base, k3_dtype dt, int64_t i);
K3_API void k3_store_f64(void *base, k3_dtype dt, int64_t i, double v);
K3_API void k3_store_f32(void *base, k3_dtype dt, int64_t i, float v);
/* Converts n contiguous elements to/from f32 (used to widen 16-bit data in blocks). */
K3_API void k3_convert_to_f32(float *dst, const void *src, k3_dtype dt, int64_t n);
K3_API void k3_convert_from_f32(void *dst, k3_dtype dt, const float *src, int64_t n);

/* ---- ops: argument blocks ---------------------------------------------------------------- */

typedef enum k3_op {
    K3_OP_LINEAR = 0,
    K3_OP_ATTN_RES,
    K3_OP_RMS_NORM,
    K3_OP_SILU_MUL,
    K3_OP_COUNT
} k3_op;

/* Kernel configuration of the skinny decode GEMM (cuda.linear.skinny). Zero = kernel's
 * default for that field. */
typedef struct k3_skinny_config {
    int threads;     /* threads per block */
    int rows;        /* output rows (N) per block */
    int unroll;      /* K unroll (16-byte vectors per thread per step) */
    int vec;         /* elements per load: 8 = 16 bytes of bf16 */
    int split_k;     /* 1 = no split */
} k3_skinny_config;

/* y[M,N] = x[M,K] w[N,K]^T (+ bias[N]) (+ residual[M,N]); out is [M,N], allocated by the
 * caller with x's dtype and device. */
typedef struct k3_linear_args {
    const k3_tensor *x, *w, *bias, *residual;
    k3_tensor *out;
    const k3_skinny_config *config; /* only cuda.linear.skinny reads it; may be NULL */
    bool batch_invariant;           /* reduce each row in one fixed order, independent of M */
    int base;                       /* dims in messages count from it ("message numbering") */
} k3_linear_args;

/* The public k3_attn_res_args (k3.h) plus the caller-allocated out [T,H], and the numbering
 * of dims and write_block in messages (0: C, 1: the Lua binding; see k3_attn_res_base). */
typedef struct k3_attn_res_kargs {
    k3_attn_res_args p;
    k3_tensor *out;
    int base;
} k3_attn_res_kargs;

/* y = round(x * rsqrt(mean(x^2) + eps) * w) over the last dim; x, out [M,H], w [H]. */
typedef struct k3_rms_norm_args {
    const k3_tensor *x, *w;
    double eps;
    k3_tensor *out;
    int base; /* dims in messages count from it ("message numbering") */
} k3_rms_norm_args;

/* x [M,2I] -> out [M,I] = silu(x[:, :I]) * x[:, I:]. */
typedef struct k3_silu_mul_args {
    const k3_tensor *x;
    k3_tensor *out;
    int base; /* dims in messages count from it ("message numbering") */
} k3_silu_mul_args;

typedef struct k3_op_args {
    k3_op op;
    union {
        k3_linear_args linear;
        k3_attn_res_kargs attn_res;
        k3_rms_norm_args rms_norm;
        k3_silu_mul_args silu_mul;
    } u;
} k3_op_args;

/* ---- kernels ------------------------------------------------------------------------------ */

/* A kernel registered as "<backend>.<op>.<variant>". supports() is pure: K3_OK, or a
 * status with a one-line reason written to `reason` (K3_ELAYOUT marks a layout the kernel
 * needs but did not get: policy "error" turns it into an error, "fallback" into a decline).
 * supports() runs only after the op's shared validation has passed. run() re-checks its
 * own hard preconditions (defence in depth) and returns the same error text a direct call
 * would get, then computes into the caller-allocated out. */
typedef struct k3_kernel {
    const char *name;
    k3_op op;
    k3_device_type device;
    k3_status (*supports)(const k3_op_args *a, char *reason, size_t n);
    k3_status (*run)(const k3_op_args *a);
} k3_kernel;

/* ---- the CUDA backend's table (libk3_cuda.so) ------------------------------------------------ */

#define K3_BACKEND_ABI 1

typedef struct k3_backend {
    int abi;              /* K3_BACKEND_ABI the backend was built with */
    const char *name;     /* "cuda" */
    int device_count;
    /* Device name, compute capability and multiprocessor count of device `dev`. */
    k3_status (*device_info)(int dev, char *name, size_t n, int *cc_major, int *cc_minor,
                             int *sm_count);
    /* Device memory through the caching allocator; K3_ENOMEM is recoverable. */
    k3_status (*alloc)(int dev, size_t bytes, void **ptr);
    void (*free)(int dev, void *ptr, size_t bytes);
    /* Returns cached blocks to the device. */
    k3_status (*empty_cache)(void);
    /* dst <- src, same shape, any strides and dtype pair; at least one side is CUDA. */
    k3_status (*copy)(k3_tensor *dst, const k3_tensor *src);
    k3_status (*fill)(k3_tensor *t, double value);
    /* out = a op b (b non-NULL) or a op s / s op a (b NULL); all on one CUDA device, out
     * contiguous and freshly allocated with a's shape and dtype. */
    k3_status (*binary)(k3_tensor *out, k3_binop op, const k3_tensor *a, const k3_tensor *b,
                        double s, int scalar_first);
    k3_status (*synchronize)(void);
    const k3_kernel *const *kernels;
    int nkernels;
    /* Timing for benchmarks: records an event on this thread's stream of `dev`; elapsed ms
     * between two such marks after synchronising. Handles are opaque. */
    k3_status (*event_record)(int dev, void **event);
    k3_status (*event_elapsed)(void *start, void *end, float *ms);
    void (*event_free)(void *event);
    /* CUDA graphs, for benchmarks that show launch overhead: capture the work this thread
     * queues on `dev` between begin and end into a graph, replay it n times, free it. The
     * captured work must not allocate or synchronise. */
    k3_status (*graph_begin)(int dev);
    k3_status (*graph_end)(int dev, void **graph);
    k3_status (*graph_replay)(void *graph, int n);
    void (*graph_free)(void *graph);
    /* Tensor parallelism (kernels/dist.cu, helper H; filled by k3c_dist_fill). NCCL is loaded
     * with dlopen on first use; NULL entries (an older backend) make k3_dist_init fail with a
     * reason. One communicator per process, on device `dev`; every wait is bounded by
     * timeout_s, and stops early when `abort_file` exists (the launcher's failed-rank
     * note; this rank writes it first when it times out). op: k3_dist_op, plus
     * K3_DIST_INTERNAL for the shape checks (counted apart). Tensors are contiguous on dev. */
    k3_status (*dist_unique_id)(void *id, size_t n);
    k3_status (*dist_init)(int dev, int rank, int world, const void *id, size_t n,
                           double timeout_s, const char *abort_file, int wait_each);
    k3_status (*dist_all_reduce)(k3_tensor *t, int op);
    k3_status (*dist_all_gather)(k3_tensor *out, const k3_tensor *t);
    k3_status (*dist_synchronize)(void);
    k3_status (*dist_destroy)(int abort);
    k3_status (*dist_stats)(k3_dist_stats *out, int reset);
} k3_backend;
#define K3_DIST_INTERNAL 0x100

/* Exported by libk3_cuda.so. Fills *out and returns K3_OK, or returns an error with a
 * one-line reason ("no CUDA device", "driver too old: …") in reason. */
typedef k3_status (*k3_backend_open_fn)(int core_abi, k3_backend *out, char *reason, size_t n);
#define K3_BACKEND_OPEN_SYMBOL "k3_cuda_backend_open"

/* The loaded CUDA backend, or NULL (then *reason says why). Loads on first use, once. */
const k3_backend *k3_cuda_backend(const char **reason);

/* ---- registry, dispatch and op internals (helper A: registry.c, dispatch.c, ops.c) -------- */
/* Exported (K3_API) because the binding and the CUDA backend are separate shared objects. */

/* The registered kernel called `name`, or NULL (unknown, disabled, or absent in this build). */
K3_API const k3_kernel *k3_kernel_find(const char *name);
/* True when K3_DISABLE_KERNELS lists `name` as one of its comma-separated entries
 * (whitespace around an entry is ignored). */
bool k3_kernel_disabled(const char *name);
/* Why the known kernel at catalogue index i is not registered, into buf (never empty):
 * "not registered in this build (disabled by K3_DISABLE_KERNELS)", "not registered: CUDA
 * backend unavailable (<k3.backends().cuda.reason>)" when the backend exists but did not open
 * (no driver, no device, ABI mismatch), or "not registered in this build" (not compiled in:
 * no libk3_cuda.so beside libk3.so, or a backend built without that kernel). */
void k3_known_absent_reason(int i, char *buf, size_t n);
/* True when the CUDA backend is missing from this build: no K3_CUDA_BACKEND was given and
 * no libk3_cuda.so lies beside libk3.so (lib/backend.c). */
bool k3_cuda_backend_absent(void);
/* The catalogue of known kernel names (registered or not): index of `name` (-1 unknown)
 * with its op and device type; the name and registered kernel (or NULL) at an index. */
int k3_known_lookup(const char *name, k3_op *op, k3_device_type *device);
const char *k3_known_name(int i);
const k3_kernel *k3_known_kernel_at(int i);
/* "linear", "attn_res", "rms_norm", "silu_mul". */
K3_API const char *k3_op_name(k3_op op);

/* The CPU kernels (lib/cpu_linear.c, lib/cpu_attn_res.c, lib/cpu_norm.c). */
extern const k3_kernel k3_cpu_linear_blas, k3_cpu_linear_reference,
    k3_cpu_linear_batch_invariant, k3_cpu_attn_res_reference, k3_cpu_rms_norm_reference,
    k3_cpu_silu_mul_reference;

/* The shared validation of each op (lib/ops.c): shapes, dtypes, devices, unit last
 * strides, ranges and out (which must be non-NULL here). Kernels call these at the start of
 * run() so a direct call gets the same message as the op. */
K3_API k3_status k3_linear_validate(const k3_linear_args *a);
K3_API k3_status k3_attn_res_validate(const k3_attn_res_kargs *a);
K3_API k3_status k3_rms_norm_validate(const k3_rms_norm_args *a);
K3_API k3_status k3_silu_mul_validate(const k3_silu_mul_args *a);
/* K3_EDEVICE "<op>: kernel <name> runs on <cpu|cuda>; tensors are on <dev>" unless t is on
 * the kernel's device type. */
K3_API k3_status k3_kernel_check_device(const k3_kernel *k, const k3_tensor *t);

/* A compiled policy (k3.h): candidates are catalogue indices, so the per-call cost is an
 * array lookup. batch_invariant is the policy's batch-invariant mode (k3.h,
 * k3_policy_set_batch_invariant); a lua_State's policy carries that state's mode. Defined
 * here because lib/method.c makes a per-call copy with the caller's mode. */
struct k3_policy {
    int n[K3_OP_COUNT];
    int cand[K3_OP_COUNT][K3_MAX_CANDIDATES];
    int layout_fallback;
    int batch_invariant;
};

/* Fills caller-owned memory with what k3_policy_new gives (the built-in default, the process
 * default batch-invariant mode); nothing to free. The binding keeps a state's policy in Lua
 * memory this way. */
K3_API void k3_policy_init(k3_policy *p);

/* Policy inspection (the binding builds k3.policy from these). */
K3_API int k3_policy_count(const k3_policy *p, const char *op);        /* -1: unknown op */
K3_API const char *k3_policy_candidate(const k3_policy *p, const char *op, int i);
K3_API int k3_policy_layout_fallback(const k3_policy *p);

/* Counters of one context (the binding keeps one per lua_State, so k3.stats() counts only
 * that state's calls): calls per kernel and declines per "kernel: reason", exactly as
 * k3_stats counts them process-wide, for each dispatch record given to k3_stats_sink_count.
 * The memory is the caller's (k3_stats_sink_size() bytes; after k3_stats_sink_reset it is
 * empty); nothing is allocated. Not locked: a sink belongs to one thread at a time. */
typedef struct k3_stats_sink k3_stats_sink;
K3_API size_t k3_stats_sink_size(void);
K3_API void k3_stats_sink_reset(k3_stats_sink *s);
/* Counts rec's chosen kernel (when it has one) and each of its declines. */
K3_API void k3_stats_sink_count(k3_stats_sink *s, const k3_dispatch *rec);
/* Calls fn like k3_stats: "kernel" entries in catalogue order, then "decline" entries. */
K3_API void k3_stats_sink_read(const k3_stats_sink *s, k3_stats_fn fn, void *ud);

/* Configuration warnings (K3_DISABLE_KERNELS naming an unknown kernel, K3_BATCH_INVARIANT
 * with a value that is not a boolean): each is sent once to the log hook (K3_LOG_WARN) and
 * kept. k3_config_warnings_take returns the kept lines ("...\n" each) the first time it is
 * called in the process, NULL afterwards or when there are none; the binding writes them to
 * stderr when no log hook is set, so a Lua user sees a typo once instead of nothing.
 * k3_log_hook_set tells whether a host installed a log hook. */
void k3_config_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
K3_API const char *k3_config_warnings_take(void);
K3_API int k3_log_hook_set(void);

/* Tracing: a thread-local hook called with the record of every dispatch that ran a kernel
 * on this thread (ops and methods; not explain_only). Returns the previous hook through
 * prev / prev_ud (may be NULL) so hooks nest. fn NULL switches tracing off. */
typedef void (*k3_trace_fn)(void *ud, const k3_dispatch *d);
K3_API void k3_trace_set(k3_trace_fn fn, void *ud, k3_trace_fn *prev, void **prev_ud);

/* Dispatch (lib/dispatch.c). Walks the candidates (first `pre` if non-NULL, then the
 * policy's list for a->op), records declines, runs the chosen kernel unless explain_only.
 * `dev` is the tensors' device. `rec` (non-NULL) may already hold declines (a method's);
 * they are kept and counted. */
typedef struct k3_dispatch_ext {
    const k3_kernel *pre;      /* tried before the policy's candidates (low-latency plan) */
    const k3_decline *declined; /* declines made before dispatch (the method's check) */
    int ndeclined;
} k3_dispatch_ext;
K3_API k3_status k3_dispatch_op(k3_op_args *a, k3_device dev, const k3_call *call,
                                const k3_dispatch_ext *ext);
/* k3_linear with a dispatch extension (lib/ops.c; used by lib/method.c) and the numbering
 * of its messages (base: 0 for C, 1 for the Lua binding). */
K3_API k3_status k3_linear_ext(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                               const k3_tensor *bias, const k3_tensor *residual, k3_tensor *out,
                               const k3_call *call, const k3_skinny_config *config,
                               const k3_dispatch_ext *ext, int base);

/* ---- core functions the CUDA backend calls (helper B) ----------------------------------- */
/* libk3_cuda.so links against libk3.so, which is built with -fvisibility=hidden: these
 * redeclarations export the internal helpers the backend uses (reporting errors, staging
 * host buffers through the pluggable allocator). */
K3_API k3_status k3_error(k3_status s, const char *fmt, ...);
K3_API k3_status k3_error_prefix(k3_status s, const char *prefix);
K3_API void k3_log(k3_log_level level, const char *fmt, ...);
K3_API void *k3_host_alloc(size_t n);
K3_API void k3_host_free(void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* K3_IMPL_H */
