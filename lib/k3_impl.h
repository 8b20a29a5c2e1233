/*
 * k3_impl.h — internal structures shared by the C core and the CUDA backend: the tensor and
 * storage layout, error helpers, op argument blocks, the kernel catalogue's records and the
 * backend function table. Not installed; not part of the public contract. The Lua binding sees
 * the core through k3.h and k3_embed.h only.
 */
#ifndef K3_IMPL_H
#define K3_IMPL_H

#include "k3.h"
#include "k3_embed.h"

#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

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
    int is_static; /* __atomic; 1 once k3_tensor_mark_static marked it: writes are refused */
    char static_owner[64]; /* who marked it (set before is_static) */
    int graph_holds; /* __atomic; captured CUDA graphs holding it (lib/graph.c): while > 0,
                      * k3_tensor_release marks it released but keeps its memory */
} k3_storage;

/* Frees s's memory now (once: data becomes NULL); the storage record stays with its
 * references. */
void k3_storage_release_memory(k3_storage *s);

/* k3_tensor_mark_static without the wait for queued device work (t checked by the caller; the
 * skinny kernel marks the weights of a static-weights plan with it). */
K3_API void k3_tensor_mark_static_nowait(k3_tensor *t, const char *owner);

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
/* k3_echo (k3_embed.h) shows user input in messages. */
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
/* The host half of k3_memory (lib/error.c): live bytes, peak, live allocations; and its reset. */
void k3_host_memory(uint64_t *bytes, uint64_t *peak, uint64_t *allocations);
void k3_host_memory_reset_peak(void);

/* ---- checked size arithmetic ----------------------------------------------------------- */

/* *out = a * b; false on overflow (a, b >= 0). */
static inline bool k3_mul_ok(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool k3_add_ok(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* ---- strings ------------------------------------------------------------------------------ */

/* Copies src into dst[n] (n >= 1), cut to n - 1 bytes and always terminated: snprintf's "%s"
 * without its format parser, for names copied on every dispatch and free. */
static inline void k3_copy_str(char *dst, size_t n, const char *src) {
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
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

/* ---- message numbering (k3_embed.h) ------------------------------------------------------ */
/* The numbering of this thread's messages, 0 or 1 (k3_set_message_base): every check that
 * names a dim, an index or a block adds it, so the same check reads "dim 1" in C and "dim 2" in
 * Lua. */
int k3_message_base(void);
/* k3_tensor_empty with `op` naming the caller in messages ("to: ...", "rms_norm: out of host
 * memory allocating ..."). */
K3_API k3_status k3_tensor_new(k3_tensor **out, int ndim, const int64_t *shape, k3_dtype dtype,
                               k3_device device, const char *op);
/* Calls fn(ctx, off, n) for every row (last dim) of the shape [ndim, shape], off[k] being the
 * row's first element in view k of nt (at most 4; strides[k], starting at base[k]); n is the
 * last dim's size (1 for ndim 0). Nothing is called for an empty shape. */
typedef void (*k3_row_fn)(void *ctx, const int64_t *off, int64_t n);
void k3_walk_rows(int ndim, const int64_t *shape, int nt, const int64_t *const *strides,
                  const int64_t *base, k3_row_fn fn, void *ctx);
/* Loads element at flat storage index (element units) of dtype as double / float. */
K3_API double k3_load_f64(const void *base, k3_dtype dt, int64_t i);
K3_API float k3_load_f32(const void *base, k3_dtype dt, int64_t i);
K3_API void k3_store_f64(void *base, k3_dtype dt, int64_t i, double v);
K3_API void k3_store_f32(void *base, k3_dtype dt, int64_t i, float v);
/* Converts n contiguous elements to f32 (used to widen 16-bit data in blocks). */
K3_API void k3_convert_to_f32(float *dst, const void *src, k3_dtype dt, int64_t n);

/* ---- ops: argument blocks ---------------------------------------------------------------- */

/* The ops, in the order of their catalogue (lib/k3_ops.def). */
typedef enum k3_op {
#define K3_OP(ID, name, signature, summary) K3_OP_##ID,
#include "k3_ops.def"
#undef K3_OP
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
    int static_w;    /* k3_plan_entry.static_weights: w may be loaded before the PDL wait */
    int rows_per_warp; /* k3_plan_entry.rows_per_warp: 8 or 16; 0 = 8 */
    int balanced;      /* k3_plan_entry.balanced: 1 = the balanced grid, 0 = tiles of rows */
    int l2_prefetch_mb; /* k3_plan_entry.l2_prefetch_mb: MiB of w prefetched into L2 first */
} k3_skinny_config;

/* y[M,N] = x[M,K] w[N,K]^T (+ bias[N]) (+ residual[M,N]); out is [M,N], allocated by the
 * caller with x's dtype and device. */
typedef struct k3_linear_args {
    const k3_tensor *x, *w, *bias, *residual;
    k3_tensor *out;
    const k3_skinny_config *config; /* only cuda.linear.skinny reads it; may be NULL */
    bool batch_invariant;           /* reduce each row in one fixed order, independent of M */
    int base;                       /* dims in messages count from it ("message numbering") */
    /* The prologue (k3.h, k3_linear_prologue): NONE, SILU_MUL (x is [M, 2K], the product
     * takes silu(x[:, :K]) * x[:, K:]) or RMS_NORM (the product takes rms_norm(x, norm_weight,
     * norm_eps)), h rounded to x's dtype as the separate op rounds it; every linear kernel
     * applies it or declines. K is always w's dim 1. */
    k3_linear_prologue prologue;
    const k3_tensor *norm_weight;
    double norm_eps;
    /* The epilogue (k3.h, k3_linear_epilogue): NONE, or SILU_MUL (w is [2N, K], out is
     * [M, N] = silu_mul(y) of the product y [M, 2N] rounded to x's dtype); every linear kernel
     * applies it, in the kernel or through a temporary y (lib/cpu/linear.c, k3c_epilogue_temp). */
    k3_linear_epilogue epilogue;
} k3_linear_args;

/* The public k3_attn_res_args (k3.h) plus the caller-allocated out [T,H], and the numbering
 * of dims and write_block in messages (0: C, 1: the Lua binding; k3_set_message_base). */
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

/* Elementwise abs, exp, sqrt: out = f(x), x any shape, strides (zero strides included) and
 * dtype; out has x's shape and dtype. fp32 arithmetic (fp64 for f64), rounded once. */
typedef struct k3_unary_args {
    const k3_tensor *x;
    k3_tensor *out;
    int base; /* dims in messages count from it ("message numbering") */
} k3_unary_args;

/* sum, mean, max, min over dim `dim` (0-based, kept with size 1 in out) or over every element
 * (dim = -1: out is 0-dim). indices (max and min; may be NULL) is an f64 tensor of out's shape
 * that receives the position along dim (the row-major position when dim = -1) plus
 * index_base. The order of summation is fixed (K3_REDUCE_LANES, k3.h), so every kernel gives
 * the same bits. */
typedef struct k3_reduce_args {
    const k3_tensor *x;
    int dim;
    k3_tensor *out;
    k3_tensor *indices;
    int index_base;
    int base; /* dims in messages count from it ("message numbering") */
} k3_reduce_args;

typedef struct k3_op_args {
    k3_op op;
    union {
        k3_linear_args linear;
        k3_attn_res_kargs attn_res;
        k3_rms_norm_args rms_norm;
        k3_silu_mul_args silu_mul;
        k3_unary_args abs, exp, sqrt;
        k3_reduce_args sum, mean, max, min;
    } u;
} k3_op_args;

/* The reduction's walk (lib/cpu/reduce.c, kernels/tensor_ops.cu): x seen as [outer, inner],
 * the reduced dims last. outer_* are the kept dims (x's and out's strides), inner_* the
 * reduced dims (x's strides), both row-major; dims of size 1 dropped, reduced dims that
 * continue each other in x merged. */
typedef struct k3_reduce_plan {
    int outer_ndim, inner_ndim;
    int64_t outer_size[K3_MAX_DIMS], outer_xstride[K3_MAX_DIMS], outer_ostride[K3_MAX_DIMS];
    int64_t outer_istride[K3_MAX_DIMS]; /* indices' strides (0 when there are none) */
    int64_t inner_size[K3_MAX_DIMS], inner_xstride[K3_MAX_DIMS];
    int64_t outer_n, inner_n; /* how many outputs, how many elements each reduces */
    int64_t chunks;           /* lane groups per output (K3_REDUCE_CHUNK, k3.h) */
} k3_reduce_plan;
K3_API void k3_reduce_plan_init(k3_reduce_plan *p, const k3_reduce_args *a);

/* ---- kernels ------------------------------------------------------------------------------ */

/* A kernel of the catalogue (lib/k3_kernels.def), registered as "<backend>.<op>.<variant>".
 * supports() is pure: K3_OK, or a status with a one-line reason written to `reason`
 * (K3_ELAYOUT marks a layout the kernel needs but did not get: policy "error" turns it into an
 * error, "fallback" into a decline). usable(device), when set, is asked once per device when
 * the backend opens; a kernel it refuses on any device is not registered. Dispatch runs the
 * op's validation and the device check before supports() and run() (k3_dispatch_call); run()
 * checks only the kernel's own hard limits, with the same text a direct call gets, then
 * computes into the caller-allocated out. */
typedef struct k3_kernel {
    const char *name;
    k3_op op;
    k3_device_type device;
    k3_status (*supports)(const k3_op_args *a, char *reason, size_t n);
    k3_status (*run)(const k3_op_args *a);
    bool (*usable)(int device);
} k3_kernel;

/* The catalogue's own facts about each kernel, as constants of the kernel's symbol:
 * <symbol>_name (the name string), <symbol>_op and <symbol>_device. */
#define K3_KERNEL(symbol, name, OP, DEVICE, rank, invariant_rank)                          \
    static const char symbol##_name[] __attribute__((unused)) = name;                      \
    enum { symbol##_op = K3_OP_##OP, symbol##_device = K3_DEVICE_##DEVICE };               \
    extern const k3_kernel symbol;
#include "k3_kernels.def"
#undef K3_KERNEL

/* The record of catalogued kernel `symbol`, defined in the kernel's own file:
 *     const k3_kernel k3_cpu_rms_norm_reference =
 *         K3_KERNEL_RECORD(k3_cpu_rms_norm_reference, supports, run);
 * (extern "C" in CUDA files), or K3_KERNEL_RECORD_USABLE with a usable(device) check. */
#define K3_KERNEL_RECORD(symbol, supports, run) K3_KERNEL_RECORD_USABLE(symbol, supports, run, NULL)
#define K3_KERNEL_RECORD_USABLE(symbol, supports, run, usable)                             \
    {symbol##_name, (k3_op)symbol##_op, (k3_device_type)symbol##_device, supports, run, usable}

/* K3_ON_<DEVICE>(x): x for the catalogue lines of that device, nothing for the others:
 *     #define K3_KERNEL(symbol, name, OP, DEVICE, rank, invariant_rank) K3_ON_CUDA_##DEVICE(&symbol,) */
#define K3_ON_CPU_CPU(...) __VA_ARGS__
#define K3_ON_CPU_CUDA(...)
#define K3_ON_CUDA_CPU(...)
#define K3_ON_CUDA_CUDA(...) __VA_ARGS__

/* ---- the CUDA backend's table (libk3_cuda.so) ------------------------------------------------ */

#define K3_BACKEND_ABI 3

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
    /* Timing (k3_cuda_time, lib/timing.c): records an event on this thread's stream of
     * `dev`; elapsed ms between two such marks after synchronising. Handles are opaque. */
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
    /* Ends this thread's capture on `dev` and discards it, whatever state CUDA left it in
     * (every error path of a capture; the stream is usable after it). */
    void (*graph_abandon)(int dev);
    /* Kernel nodes of a graph made by graph_end. */
    int (*graph_kernels)(void *graph);
    /* Tensor parallelism (kernels/dist.cu; filled by k3c_dist_fill). NCCL is loaded with
     * dlopen on first use; NULL entries (a backend built without nccl.h) make k3_dist_init
     * fail with a reason. One communicator per process, on device `dev`; every wait is bounded by
     * timeout_s, and stops early when `abort_file` exists (the launcher's failed-rank
     * note; this rank writes it first when it times out). op: k3_dist_op. The agreement
     * checks are the core's (lib/dist.c), on the host. Tensors are contiguous on dev. */
    k3_status (*dist_unique_id)(void *id, size_t n);
    k3_status (*dist_init)(int dev, int rank, int world, const void *id, size_t n,
                           double timeout_s, const char *abort_file, int wait_each);
    k3_status (*dist_all_reduce)(k3_tensor *t, int op);
    k3_status (*dist_all_gather)(k3_tensor *out, const k3_tensor *t);
    k3_status (*dist_synchronize)(void);
    k3_status (*dist_destroy)(int abort);
    k3_status (*dist_stats)(k3_dist_stats *out, int reset);
    /* 1 while this thread's stream of `dev` is being captured into a CUDA graph (nothing may be
     * freed to make room then), else 0. */
    int (*capturing)(int dev);
} k3_backend;

/* Exported by libk3_cuda.so. Fills *out and returns K3_OK, or returns an error with a
 * one-line reason ("no CUDA device", "driver too old: …") in reason. */
typedef k3_status (*k3_backend_open_fn)(int core_abi, k3_backend *out, char *reason, size_t n);
#define K3_BACKEND_OPEN_SYMBOL "k3_cuda_backend_open"

/* The loaded CUDA backend, or NULL (then *reason says why). Loads on first use, once. */
const k3_backend *k3_cuda_backend(const char **reason);

/* ---- registry, dispatch and op internals (registry.c, dispatch.c, ops.c) ------------------ */
/* Exported (K3_API) where the CUDA backend, a separate shared object, calls them. */

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
/* The catalogue of known kernels (lib/k3_kernels.def, registered or not): index of `name` (-1
 * unknown) with its op and device type; how many there are; the name, op (K3_OP_COUNT out of
 * range), rank in its op's default list (invariant 0) or batch-invariant list (invariant 1;
 * 0: in neither) and the registered kernel (or NULL) at an index. */
int k3_known_lookup(const char *name, k3_op *op, k3_device_type *device);
int k3_known_count(void);
const char *k3_known_name(int i);
k3_op k3_known_op(int i);
int k3_known_rank(int i, int invariant);
const k3_kernel *k3_known_kernel_at(int i);
/* "linear", "attn_res", "rms_norm", "silu_mul". */
K3_API const char *k3_op_name(k3_op op);

/* Each op's half of dispatch's prologue (lib/validate.c), for a valid op tag in a->op:
 * k3_op_check_inputs checks everything but out (required tensors present and live, shapes,
 * dtypes, devices, unit last strides, ranges, what it writes) and then gives the result's
 * shape, dtype and device; k3_op_check_out checks a given out against that (and its overlaps);
 * k3_op_out is the address of the op's out slot in a. */
typedef struct k3_op_result {
    int ndim;
    int64_t shape[K3_MAX_DIMS];
    k3_dtype dtype;
    k3_device device;
} k3_op_result;
k3_status k3_op_check_inputs(const k3_op_args *a, k3_op_result *r);
k3_status k3_op_check_out(const k3_op_args *a);
k3_tensor **k3_op_out(k3_op_args *a);
/* Both checks again, with out required, and the call's device against the kernel's: the entry
 * check of kernels that take every valid call (the tensor ops' kernels, named
 * "<device>.<op>.<variant>"), so a kernel called with arguments dispatch never saw still
 * refuses them in the op's words instead of reading or writing out of bounds. */
K3_API k3_status k3_op_recheck(const k3_op_args *a, k3_device_type device, const char *variant);

/* A compiled policy (k3.h): candidates are catalogue indices, so the per-call cost is an
 * array lookup. batch_invariant is the policy's batch-invariant mode (k3.h,
 * k3_policy_set_batch_invariant); a lua_State's policy carries that state's mode. Defined
 * here because lib/method.c makes a per-call copy with the caller's mode. */
struct k3_policy {
    int n[2][K3_OP_COUNT]; /* [0]: the candidates, [1]: the batch-invariant candidates */
    int cand[2][K3_OP_COUNT][K3_MAX_CANDIDATES];
    int layout_fallback;
    int batch_invariant;
};

/* Configuration warnings (k3_embed.h): sent once to the log hook and kept for
 * k3_config_warnings_take. */
void k3_config_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Dispatch (lib/dispatch.c), the one way a kernel runs: every op and method call, a kernel
 * forced by name included. Its prologue runs once, before any kernel is asked or run: the op
 * tag, the op's validation (k3_op_check_inputs, then out: checked when given, else a new tensor,
 * or a stand-in without memory under explain_only) and the device the call runs on; the kernel
 * chosen must run on that device. Then the forced kernel, or the first of the candidates (`pre`
 * first, then the policy's list, or its batch-invariant list in that mode) whose supports()
 * accepts, runs, unless explain_only. call->record gets the decision, also when the prologue
 * refuses the call (op, nothing chosen, ext's declines). *y (may be NULL when out is given)
 * receives a new handle on the result. */
typedef struct k3_dispatch_ext {
    int pre;                    /* catalogue index of a kernel tried before the policy's
                                 * candidates (a low-latency plan's), -1 for none; its declines
                                 * never raise, whatever the policy's on_layout_mismatch */
    const k3_decline *declined; /* declines made before dispatch (the method's plan lookup) */
    int ndeclined;
} k3_dispatch_ext;
K3_API k3_status k3_dispatch_call(k3_op_args *a, k3_tensor **y, const k3_call *call,
                                  const k3_dispatch_ext *ext);
/* k3_linear with a dispatch extension (lib/ops.c; used by lib/method.c). */
K3_API k3_status k3_linear_ext(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                               const k3_tensor *bias, const k3_tensor *residual,
                               const k3_linear_prologue_args *prologue,
                               k3_linear_epilogue epilogue, k3_tensor *out,
                               const k3_call *call, const k3_skinny_config *config,
                               const k3_dispatch_ext *ext);

/* ---- CUDA graph capture (lib/graph.c) ------------------------------------------------------ */
/* While this thread captures (k3_graph_capturing()), what cannot be captured is refused here
 * before it reaches CUDA, and what the captured work touches is held by the graph. Each is
 * K3_OK and does nothing outside a capture. k3_graph_refuse: K3_EINVAL "<op>: <what> cannot be
 * captured into a CUDA graph ..."; k3_graph_note: the graph holds t's storage (K3_ENOMEM);
 * k3_graph_note_op: refuses a CPU op (device) and notes every tensor of a. */
k3_status k3_graph_refuse(const char *op, const char *what);
k3_status k3_graph_note(const k3_tensor *t);
k3_status k3_graph_note_op(const k3_op_args *a, k3_device device);

/* ---- core functions the CUDA backend calls ---------------------------------------------- */
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
