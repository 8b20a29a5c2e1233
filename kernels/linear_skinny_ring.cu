/*
 * linear_skinny_ring.cu — cuda.linear.skinny_ring: the decode GEMM with the weight streamed
 * through a shared-memory ring of bulk copies (bf16, M = 1..16, optional residual in the same
 * pass; device code and design in linear_skinny_ring.cuh). Not a default candidate: a
 * low-latency plan names it for the (shape, M) entries where it was measured to win.
 * supports() names every decline; run() repeats the check and raises the same text, so a call
 * forced onto it with a bad input fails loud.
 *
 * Scratch: the fp32 partials of tiles split between CTAs go to the context workspace
 * (stream-ordered, shared with cuBLAS); the per-tile arrival counters, which must stay zero
 * between launches, live in a per-thread, per-device buffer nothing else touches, allocated
 * and zeroed on the thread's first call (so that call must not be inside a CUDA graph
 * capture: supports() declines then, naming why).
 */
#include "common.cuh"
#include "linear_skinny_ring.cuh"

#include <limits.h>
#include <stdio.h>

#define K3RG_MAX_DEVICES 64
#define K3RG_COUNTERS 65536 /* row tiles: N <= 65536 x rows */

static thread_local unsigned *k3rg_counters[K3RG_MAX_DEVICES];

static bool k3rg_capturing(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
        (void)cudaGetLastError();
        return true; /* unknown: never allocate */
    }
    return st != cudaStreamCaptureStatusNone;
}

/* The resolved configuration: threads, rows, stages, ctas per SM. */
struct k3rg_config {
    int threads, rows, stages, cps;
};

static bool k3rg_on_cuda(const k3_tensor *t, int dev) {
    k3_device d = k3_tensor_device(t);
    return d.type == K3_DEVICE_CUDA && d.index == dev;
}

/* The eligibility check (DESIGN.md's order, as cuda.linear.skinny's). Writes the reason and
 * returns its status; K3_OK with *cfg resolved when the kernel takes the call. for_run: the
 * check at run() entry (batch-invariant mode is policy there; a misaligned base is a layout
 * error rather than a quiet decline). */
static k3_status k3rg_check(const k3_linear_args *l, bool for_run, k3rg_config *cfg, char *why,
                            size_t n) {
    const k3_tensor *x = l->x, *w = l->w;
    if (l->bias) return snprintf(why, n, "bias is present (no bias epilogue)"), K3_EINVAL;
    if (!for_run && l->batch_invariant)
        return snprintf(why, n, "batch-invariant mode is on"), K3_ENOKERNEL;
    if (x->ndim != 2) return snprintf(why, n, "x is not 2-D (%d-D)", x->ndim), K3_ESHAPE;
    if (w->ndim != 2) return snprintf(why, n, "w is not 2-D (%d-D)", w->ndim), K3_ESHAPE;
    const k3_tensor *typed[4] = {x, w, l->residual, l->out};
    const char *tname[4] = {"x", "w", "residual", "out"};
    for (int i = 0; i < 4; i++)
        if (typed[i] && typed[i]->dtype != K3_DTYPE_BF16)
            return snprintf(why, n, "%s is not bf16 (%s)", tname[i],
                            k3_dtype_name(typed[i]->dtype)),
                   K3_EDTYPE;
    for (int i = 0; i < 2; i++) {
        const k3_tensor *t = typed[i];
        if (t->stride[0] != t->size[1] || t->stride[1] != 1)
            return snprintf(why, n,
                            "%s is not packed row-major: strides [%lld, %lld] for shape "
                            "[%lld, %lld], needs [%lld, 1]",
                            tname[i], (long long)t->stride[0], (long long)t->stride[1],
                            (long long)t->size[0], (long long)t->size[1],
                            (long long)t->size[1]),
                   K3_ELAYOUT;
    }
    char a[64], b[64];
    k3_device dx = k3_tensor_device(x);
    if (dx.type != K3_DEVICE_CUDA)
        return snprintf(why, n, "x is on %s, not a CUDA device", k3_device_name(dx, a, sizeof a)),
               K3_EDEVICE;
    for (int i = 1; i < 4; i++)
        if (typed[i] && !k3rg_on_cuda(typed[i], dx.index))
            return snprintf(why, n, "%s is on %s, x on %s", tname[i],
                            k3_device_name(k3_tensor_device(typed[i]), a, sizeof a),
                            k3_device_name(dx, b, sizeof b)),
                   K3_EDEVICE;
    const int64_t M = x->size[0], K = x->size[1], N = w->size[0];
    if (w->size[1] != K)
        return snprintf(why, n, "K mismatch: x dim %d (%lld), w dim %d (%lld)", 1 + l->base,
                        (long long)K, 1 + l->base, (long long)w->size[1]),
               K3_ESHAPE;
    if (M < 1 || M > K3_SKINNY_MAX_M)
        return snprintf(why, n, "M = %lld is outside 1..%d", (long long)M, K3_SKINNY_MAX_M),
               K3_ESHAPE;
    if (K < 32 || K % 32)
        return snprintf(why, n, "K = %lld is not a positive multiple of 32 (the MMA k-step)",
                        (long long)K),
               K3_ESHAPE;
    if (N > INT_MAX || K > INT_MAX)
        return snprintf(why, n, "N = %lld or K = %lld exceeds %d", (long long)N, (long long)K,
                        INT_MAX),
               K3_ESHAPE;

    const k3_skinny_config *c = l->config;
    k3rg_config r = {c ? c->threads : 0, c ? c->rows : 0, c ? c->unroll : 0,
                     c ? c->split_k : 0};
    const int vec = c ? c->vec : 0;
    if (r.threads < 0 || r.rows < 0 || r.stages < 0 || r.cps < 0 || vec < 0)
        return snprintf(why, n, "config has a negative field"), K3_EINVAL;
    if (!r.threads) r.threads = 160;
    if (!r.rows) r.rows = 16;
    if (!r.stages) r.stages = 3;
    if (!r.cps) r.cps = 2;
    if ((vec && vec != 8) || !k3_ring_instantiated(r.threads, r.rows, r.stages) ||
        r.cps > K3_RING_MAX_CPS)
        return snprintf(why, n,
                        "config {threads = %d, rows = %d, unroll (stages) = %d, vec = %d, "
                        "split_k (CTAs per SM) = %d} is not instantiated (CTAs per SM 1..%d, "
                        "vec 8)",
                        r.threads, r.rows, r.stages, vec, r.cps, K3_RING_MAX_CPS),
               K3_EINVAL;
    for (int i = 0; i < 2; i++)
        if ((uintptr_t)k3_tensor_data(typed[i]) % 16)
            return snprintf(why, n,
                            "%s is not 16-byte aligned (storage offset %lld elements); bulk "
                            "copies move 16-byte multiples",
                            tname[i], (long long)typed[i]->offset),
                   for_run ? K3_ELAYOUT : K3_ENOKERNEL;
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dx.index) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return snprintf(why, n, "cannot read cuda:%d's shared memory per block", dx.index),
               K3_EDEVICE;
    }
    const size_t smem = k3_ring_smem_bytes(r.threads, r.rows, r.stages, (int)M);
    if (smem > (size_t)optin)
        return snprintf(why, n,
                        "config {threads = %d, rows = %d, unroll (stages) = %d} needs %zu bytes "
                        "of shared memory per CTA at M = %lld; cuda:%d allows %d",
                        r.threads, r.rows, r.stages, smem, (long long)M, dx.index, optin),
               K3_ENOKERNEL;
    const int64_t tiles = (N + r.rows - 1) / r.rows;
    const int sms = k3c_sm_count(dx.index);
    const int64_t P = (int64_t)sms * r.cps;
    if (tiles > K3RG_COUNTERS || (uint64_t)tiles * (uint64_t)(K / 32) * (uint64_t)P >= (1ull << 32))
        return snprintf(why, n,
                        "%lld row tiles of %d x %lld k-steps over %lld CTAs exceed the 32-bit "
                        "split (or the %d arrival counters)",
                        (long long)tiles, r.rows, (long long)(K / 32), (long long)P,
                        K3RG_COUNTERS),
               K3_ESHAPE;
    if (dx.index < 0 || dx.index >= K3RG_MAX_DEVICES)
        return snprintf(why, n, "device index %d is >= %d", dx.index, K3RG_MAX_DEVICES),
               K3_EDEVICE;
    k3c_ctx *ctx = NULL;
    k3_status cs = k3c_context(dx.index, &ctx);
    if (cs != K3_OK || !ctx)
        return snprintf(why, n, "no CUDA context for cuda:%d", dx.index),
               cs != K3_OK ? cs : K3_EINTERNAL;
    const size_t need = k3_ring_ws_bytes(r.rows, (int)P);
    if (!ctx->workspace || need > ctx->workspace_size)
        return snprintf(why, n,
                        "%zu bytes of fp32 partials exceed the context workspace (%zu bytes)",
                        need, ctx->workspace ? ctx->workspace_size : (size_t)0),
               K3_ENOMEM;
    if (!k3rg_counters[dx.index] && k3rg_capturing(ctx->stream))
        return snprintf(why, n,
                        "this thread's arrival counters on cuda:%d are not allocated yet and "
                        "its stream is being captured (run one call outside the capture first)",
                        dx.index),
               K3_ENOKERNEL;
    *cfg = r;
    return K3_OK;
}

static k3_status k3rg_supports(const k3_op_args *a, char *reason, size_t n) {
    k3rg_config cfg;
    return k3rg_check(&a->u.linear, false, &cfg, reason, n);
}

static k3_status k3rg_run(const k3_op_args *a) {
    const k3_linear_args *l = &a->u.linear;
    k3rg_config cfg;
    char why[320];
    k3_status s = k3rg_check(l, true, &cfg, why, sizeof why);
    if (s != K3_OK) return k3_error(s, "linear: %s: %s", k3_cuda_linear_skinny_ring_name, why);
    /* static_weights (a low-latency plan): as cuda.linear.skinny, w's storage is marked static
     * (writes refused from now on); a write queued before the mark may still be in flight, so
     * this first call copies w after the wait, every later call before it. */
    int static_w = l->config && l->config->static_w;
    if (static_w && !k3_tensor_is_static(l->w)) {
        k3_tensor_mark_static_nowait((k3_tensor *)l->w,
                                     "method.low_latency {static_weights = true}");
        static_w = 0;
    }
    k3_skinny_problem p = {};
    p.pdl = 1;
    p.static_w = static_w;
    p.x = k3_tensor_data(l->x);
    p.w = k3_tensor_data(l->w);
    p.res = l->residual ? k3_tensor_data(l->residual) : NULL;
    p.res_s0 = l->residual ? l->residual->stride[0] : 0;
    p.res_s1 = l->residual ? l->residual->stride[1] : 0;
    p.y = k3_tensor_data(l->out);
    p.y_s0 = l->out->stride[0];
    p.y_s1 = l->out->stride[1];
    p.M = (int)l->x->size[0];
    p.N = (int)l->w->size[0];
    p.K = (int)l->x->size[1];
    if (p.N == 0) return K3_OK;
    if (!p.x || !p.w || !p.y || (l->residual && !p.res))
        return k3_error(K3_EINTERNAL, "linear: %s: NULL data for a non-empty tensor",
                        k3_cuda_linear_skinny_ring_name);
    const int dev = k3_tensor_device(l->x).index;
    k3c_ctx *ctx = NULL;
    K3_TRY(k3c_context(dev, &ctx));
    if (!k3rg_counters[dev]) {
        const size_t bytes = K3RG_COUNTERS * sizeof(unsigned);
        void *c = NULL;
        K3_TRY(k3c_alloc(dev, bytes, &c));
        cudaError_t e = cudaMemsetAsync(c, 0, bytes, ctx->stream);
        if (e != cudaSuccess) {
            k3c_free(dev, c, bytes);
            K3_CHECK(e);
        }
        k3rg_counters[dev] = (unsigned *)c;
    }
    K3_CHECK(k3_ring_launch(cfg.threads, cfg.rows, cfg.stages, cfg.cps, p, k3c_sm_count(dev),
                            (float *)ctx->workspace, ctx->workspace_size, k3rg_counters[dev],
                            K3RG_COUNTERS, ctx->stream));
    return K3_OK;
}

extern "C" const k3_kernel k3_cuda_linear_skinny_ring =
    K3_KERNEL_RECORD(k3_cuda_linear_skinny_ring, k3rg_supports, k3rg_run);
