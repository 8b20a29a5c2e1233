/*
 * linear_skinny.cu — cuda.linear.skinny: the low-latency decode GEMM (bf16, M = 1..16,
 * optional residual in the same pass, optional SwiGLU prologue: x [M, 2K] gate | up, optional
 * SwiGLU epilogue: w [2N, K] gate | up rows, out h [M, N]). supports() is DESIGN.md's runtime check with a named
 * reason per failure; run() repeats it and raises the same text as an error, so a strided
 * x passed directly fails loud instead of being read with the wrong stride. The device
 * code is in linear_skinny.cuh (shared with tools/autotune.cu).
 */
#include "common.cuh"
#include "linear_skinny.cuh"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

static_assert(K3_SKINNY_MAX_L2_PREFETCH_MB == K3_PLAN_MAX_L2_PREFETCH_MB,
              "the kernel's L2 prefetch limit is the plan entry's");

/* Split-K across CTAs (kcta >= 2, see linear_skinny.cuh) needs, per launch:
 *  - fp32 partials: the context's workspace (k3c_ctx::workspace, shared with cuBLAS(Lt),
 *    stream-ordered scratch on this thread's stream: nothing else runs on it meanwhile);
 *  - arrival counters that are zero before the launch. The kernel leaves them zero, so they
 *    live in a small per-thread, per-device buffer that nothing else touches (the workspace
 *    would not do: cuBLAS scribbles on it between our calls). It is allocated and zeroed on
 *    the first split call of a thread, which therefore must not be inside a CUDA graph
 *    capture (supports() declines with a named reason then; the buffer is never freed:
 *    256 KiB per thread and device). */
#define K3SK_MAX_DEVICES 64
#define K3SK_COUNTERS 65536 /* row tiles: N <= 65536 * rows */
/* This thread's arrival counters on one device (split-K across CTAs leaves them zero). */
struct k3sk_scratch {
    unsigned *counters;
};
static thread_local k3sk_scratch k3sk_scr[K3SK_MAX_DEVICES];

static bool k3sk_capturing(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
        (void)cudaGetLastError();
        return true; /* unknown: behave as if capturing (never allocate) */
    }
    return st != cudaStreamCaptureStatusNone;
}

/* This thread's counters on ctx's device, allocating and zeroing them on first use. */
static k3_status k3sk_get_scratch(k3c_ctx *ctx, k3sk_scratch **out) {
    k3sk_scratch &c = k3sk_scr[ctx->dev];
    if (!c.counters) {
        const size_t bytes = K3SK_COUNTERS * sizeof(unsigned);
        void *p = NULL;
        K3_TRY(k3c_alloc(ctx->dev, bytes, &p));
        cudaError_t e = cudaMemsetAsync(p, 0, bytes, ctx->stream);
        if (e != cudaSuccess) {
            k3c_free(ctx->dev, p, bytes);
            K3_CHECK(e);
        }
        c.counters = (unsigned *)p;
    }
    *out = &c;
    return K3_OK;
}

/* A prologue runs in the kernel (h computed once per CTA into shared memory,
 * linear_skinny.cuh) for M up to this, and through a temporary otherwise (the separate op's
 * kernel into scratch, then the plain kernel: the same bits either way). Every CTA recomputes
 * the whole h of its k range before its first MMA, while the separate kernel costs ~0.8 µs in a
 * graph with PDL: measured on an H200 (notes/PERF.md, "silu_mul prologue"), the in-kernel
 * silu_mul lost at every M, so the default is 0: the temporary. K3_SKINNY_PROLOGUE_MAX_M
 * (0..16, read once) overrides it, to measure or use the in-kernel path. */
#define K3SK_PROLOGUE_MAX_M_DEFAULT 0
static int k3sk_prologue_max_m(void) {
    static const int v = [] {
        const char *e = getenv("K3_SKINNY_PROLOGUE_MAX_M");
        char *end = NULL;
        long n = e && *e ? strtol(e, &end, 10) : -1;
        return e && *e && end && *end == '\0' && n >= 0 && n <= K3_SKINNY_MAX_M
                   ? (int)n
                   : K3SK_PROLOGUE_MAX_M_DEFAULT;
    }();
    return v;
}

/* Whether this launch's h fits the device's shared memory per block beside the kernel's own
 * partial sums (at most 16 warps x 512 bytes, and the split flag). */
static bool k3sk_silu_fits(int dev, size_t bytes) {
    const int optin = k3c_smem_optin(dev);
    return optin > 0 && bytes + 16u * 512u + 64u <= (size_t)optin;
}

static const char *k3sk_dims(char *buf, size_t n, const int64_t *v) {
    snprintf(buf, n, "[%lld, %lld]", (long long)v[0], (long long)v[1]);
    return buf;
}

static bool k3sk_same_cuda(const k3_tensor *t, int dev) {
    k3_device d = k3_tensor_device(t);
    return d.type == K3_DEVICE_CUDA && d.index == dev;
}

/* The kernel's eligibility check, in DESIGN.md's order. Writes the reason and returns its
 * status (K3_OK when the kernel takes the call; *cfg is then the resolved configuration).
 * for_run: the check made at run() entry, where the batch-invariant flag is policy, not a
 * precondition, and a misaligned base is a layout error rather than a quiet decline. */
static k3_status k3sk_check(const k3_linear_args *l, bool for_run, k3_skinny_config *cfg,
                            char *why, size_t n) {
    char a[64], b[64], c[64];
    const k3_tensor *x = l->x, *w = l->w;
    if (l->bias)
        return snprintf(why, n, "bias is present (the skinny kernel has no bias epilogue)"),
               K3_EINVAL;
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
    /* Packed row-major is checked on the strides themselves: is_contiguous ignores the
     * stride of a size-1 dim, and the kernel reads row m at m * K whatever M is. The rms_norm
     * prologue reads x's rows through its stride (or a temporary does): x is exempt. */
    const k3_tensor *packed[2] = {x, w};
    const int first = l->prologue == K3_LINEAR_PROLOGUE_RMS_NORM ? 1 : 0;
    for (int i = first; i < 2; i++) {
        const k3_tensor *t = packed[i];
        if (t->stride[0] != t->size[1] || t->stride[1] != 1) {
            int64_t want[2] = {t->size[1], 1};
            return snprintf(why, n, "%s is not packed row-major: strides %s for shape %s, needs %s",
                            tname[i], k3sk_dims(a, sizeof a, t->stride),
                            k3sk_dims(b, sizeof b, t->size), k3sk_dims(c, sizeof c, want)),
                   K3_ELAYOUT;
        }
    }
    k3_device dx = k3_tensor_device(x);
    if (dx.type != K3_DEVICE_CUDA)
        return snprintf(why, n, "x is on %s, not a CUDA device", k3_device_name(dx, a, sizeof a)),
               K3_EDEVICE;
    for (int i = 1; i < 4; i++)
        if (typed[i] && !k3sk_same_cuda(typed[i], dx.index))
            return snprintf(why, n, "%s is on %s, x on %s", tname[i],
                            k3_device_name(k3_tensor_device(typed[i]), a, sizeof a),
                            k3_device_name(dx, b, sizeof b)),
                   K3_EDEVICE;
    /* K is w's dim 1; the silu_mul prologue's x holds gate | up, 2K per row. */
    const bool silu = l->prologue == K3_LINEAR_PROLOGUE_SILU_MUL;
    const int64_t M = x->size[0], K = w->size[1], N = w->size[0];
    if (x->size[1] != (silu ? 2 * K : K))
        return snprintf(why, n, "K mismatch: x dim %d (%lld), w dim %d (%lld)%s", 1 + l->base,
                        (long long)x->size[1], 1 + l->base, (long long)K,
                        silu ? " (prologue silu_mul needs x dim = 2 * w dim)" : ""),
               K3_ESHAPE;
    if (K == 0) return snprintf(why, n, "K = 0 (nothing to stream)"), K3_ESHAPE;
    if (M < 1 || M > K3_SKINNY_MAX_M)
        return snprintf(why, n, "M = %lld is outside 1..%d", (long long)M, K3_SKINNY_MAX_M),
               K3_ESHAPE;
    if (N > INT_MAX || K > INT_MAX)
        return snprintf(why, n, "N = %lld or K = %lld exceeds %d", (long long)N, (long long)K,
                        INT_MAX),
               K3_ESHAPE;

    k3_skinny_config r = l->config ? *l->config : k3_skinny_config{};
    if (r.threads < 0 || r.rows < 0 || r.unroll < 0 || r.vec < 0 || r.split_k < 0)
        return snprintf(why, n, "config has a negative field"), K3_EINVAL;
    if (r.balanced != 0 && r.balanced != 1)
        return snprintf(why, n, "config balanced = %d; expected 0 or 1", r.balanced), K3_EINVAL;
    if (r.l2_prefetch_mb < 0 || r.l2_prefetch_mb > K3_SKINNY_MAX_L2_PREFETCH_MB)
        return snprintf(why, n, "config l2_prefetch_mb = %d; expected 0..%d", r.l2_prefetch_mb,
                        K3_SKINNY_MAX_L2_PREFETCH_MB),
               K3_EINVAL;
    if (!r.threads) r.threads = 256;
    if (!r.rows) r.rows = 8;
    if (!r.unroll) r.unroll = 4;
    if (!r.vec) r.vec = K3_SKINNY_VEC;
    if (!r.rows_per_warp) r.rows_per_warp = 8;
    if (!k3_skinny_rows_per_warp_valid(r.rows_per_warp))
        return snprintf(why, n, "config rows_per_warp = %d; expected 8, 16 or 32",
                        r.rows_per_warp),
               K3_EINVAL;
    /* 16 or 32 rows per warp: classic tiles only (no split-K across CTAs) */
    const bool wide = r.rows_per_warp != 8;
    char rpw[32] = "";
    if (wide) snprintf(rpw, sizeof rpw, ", rows_per_warp = %d", r.rows_per_warp);
    int sk = k3_skinny_split_k(r.threads, r.rows, r.rows_per_warp);
    if (!r.split_k) r.split_k = sk;
    /* split_k = K-slices per row group in total = sk (warps per row group of a CTA) x kcta
     * (CTAs along K); kcta = 1 is the classic kernel, kcta >= 2 the split-K-across-CTAs one. */
    const int kcta = sk && r.split_k % sk == 0 ? r.split_k / sk : 0;
    /* The balanced grid spreads rows over CTAs of the classic kernel: one CTA along K. */
    if (r.balanced && kcta > 1)
        return snprintf(why, n,
                        "config {threads = %d, rows = %d, unroll = %d, vec = %d, split_k = %d%s, "
                        "balanced = true} splits K across %d CTAs; the balanced grid needs "
                        "split_k = %d (one CTA along K)",
                        r.threads, r.rows, r.unroll, r.vec, r.split_k, rpw, kcta, sk),
               K3_EINVAL;
    if (kcta > K3_SKINNY_MAX_KCTA && !wide)
        return snprintf(why, n,
                        "config {threads = %d, rows = %d, unroll = %d, vec = %d, split_k = %d} "
                        "asks for %d CTAs along K (split_k / %d); at most %d",
                        r.threads, r.rows, r.unroll, r.vec, r.split_k, kcta, sk,
                        K3_SKINNY_MAX_KCTA),
               K3_EINVAL;
    if (r.vec != K3_SKINNY_VEC || !sk || !kcta || (wide && kcta > 1) ||
        (kcta == 1 && !k3_skinny_instantiated(r.threads, r.rows, r.unroll, r.rows_per_warp)) ||
        (kcta > 1 && !k3_skinny_split_instantiated(r.threads, r.rows, r.unroll)))
        return snprintf(why, n,
                        "config {threads = %d, rows = %d, unroll = %d, vec = %d, split_k = %d%s%s} "
                        "is not instantiated%s",
                        r.threads, r.rows, r.unroll, r.vec, r.split_k, rpw,
                        r.balanced ? ", balanced = true" : "",
                        kcta > 1 ? " for split-K across CTAs" : ""),
               K3_EINVAL;
    if (K % r.vec)
        return snprintf(why, n, "K = %lld is not divisible by the vector width %d",
                        (long long)K, r.vec),
               K3_ESHAPE;
    /* 16-byte loads need 16-byte aligned rows: with K % 8 == 0 that is the base address. */
    for (int i = first; i < 2; i++)
        if ((uintptr_t)k3_tensor_data(packed[i]) % 16)
            return snprintf(why, n,
                            "%s is not 16-byte aligned (storage offset %lld elements); the "
                            "kernel loads 16 bytes at a time",
                            tname[i], (long long)packed[i]->offset),
                   for_run ? K3_ELAYOUT : K3_ENOKERNEL;
    /* The balanced grid: a multiple of the device's SM count (backend.cu's device properties,
     * read once) of CTAs. */
    if (r.balanced) {
        const int sms = k3c_sm_count(dx.index);
        if (N > 0 && k3_skinny_balanced_grid(N, r.rows, sms) <= 0)
            return snprintf(why, n,
                            "balanced grid: N = %lld rows in CTAs of %d on %d SMs needs more "
                            "than %d CTAs",
                            (long long)N, r.rows, sms, INT_MAX),
                   K3_ESHAPE;
    }
    if (kcta > 1) {
        const int64_t tiles = k3_skinny_split_tiles(r.rows, (int)N);
        if (tiles > K3SK_COUNTERS)
            return snprintf(why, n,
                            "split-K across CTAs: %lld row tiles of %d exceed the %d arrival "
                            "counters",
                            (long long)tiles, r.rows, K3SK_COUNTERS),
                   K3_ESHAPE;
        if (dx.index < 0 || dx.index >= K3SK_MAX_DEVICES)
            return snprintf(why, n, "split-K across CTAs: device index %d is >= %d", dx.index,
                            K3SK_MAX_DEVICES),
                   K3_EDEVICE;
        k3c_ctx *ctx = NULL;
        k3_status cs = k3c_context(dx.index, &ctx);
        if (cs != K3_OK || !ctx)
            return snprintf(why, n, "split-K across CTAs: no CUDA context for cuda:%d",
                            dx.index),
                   cs != K3_OK ? cs : K3_EINTERNAL;
        const size_t need = k3_skinny_split_ws_bytes(r.rows, kcta, (int)M, (int)N);
        if (!ctx->workspace || need > ctx->workspace_size)
            return snprintf(why, n,
                            "split-K across CTAs: %zu bytes of fp32 partials (%lld tiles x %d "
                            "CTAs x M %lld x rows %d) exceed the context workspace (%zu bytes)",
                            need, (long long)tiles, kcta, (long long)M, r.rows,
                            ctx->workspace ? ctx->workspace_size : (size_t)0),
                   K3_ENOMEM;
        if (!k3sk_scr[dx.index].counters && k3sk_capturing(ctx->stream))
            return snprintf(why, n,
                            "split-K across CTAs: this thread's arrival counters on cuda:%d are "
                            "not allocated yet and its stream is being captured (run one split "
                            "call outside the capture first)",
                            dx.index),
                   K3_ENOKERNEL;
    }
    *cfg = r;
    return K3_OK;
}

static k3_status k3sk_supports(const k3_op_args *a, char *reason, size_t n) {
    k3_skinny_config cfg;
    return k3sk_check(&a->u.linear, false, &cfg, reason, n);
}

static k3_status k3sk_run(const k3_op_args *a) {
    const k3_linear_args *l = &a->u.linear;
    k3_skinny_config cfg;
    char why[256];
    k3_status s = k3sk_check(l, true, &cfg, why, sizeof why);
    if (s != K3_OK) return k3_error(s, "linear: %s: %s", k3_cuda_linear_skinny_name, why);
    /* The silu_mul epilogue runs in the classic kernel (k3_skinny_epi_kernel); split-K across
     * CTAs and the balanced grid write y [M, 2N] into a temporary and cuda.silu_mul.generic
     * writes out from it. */
    const int kcta = cfg.split_k / k3_skinny_split_k(cfg.threads, cfg.rows, cfg.rows_per_warp);
    if (l->epilogue != K3_LINEAR_EPILOGUE_NONE && (kcta > 1 || cfg.balanced))
        return k3c_epilogue_temp(a, k3sk_run);
    /* static_weights (a low-latency method's plan): w's storage is marked static, so writes
     * into it are refused from now on. A write queued before this mark may still be in
     * flight, so this first call loads w after the wait like any input; every later call
     * (whose predecessors started after this one) loads it early. The mark does not wait for
     * the device: it may happen while a stream is being captured. */
    if (cfg.static_w && !k3_tensor_is_static(l->w)) {
        k3_tensor_mark_static_nowait((k3_tensor *)l->w,
                                     "method.low_latency {static_weights = true}");
        cfg.static_w = 0;
    }

    k3_skinny_problem p = {};
    /* PDL is how the kernel launches (notes/PERF.md, linear v4): the next kernel's CTAs may
     * start while this one drains; with static weights the first step of w is loaded before
     * the wait for the previous kernel. */
    p.pdl = 1;
    p.static_w = cfg.static_w ? 1 : 0;
    p.x = k3_tensor_data(l->x);
    p.w = k3_tensor_data(l->w);
    p.res = l->residual ? k3_tensor_data(l->residual) : NULL;
    p.res_s0 = l->residual ? l->residual->stride[0] : 0;
    p.res_s1 = l->residual ? l->residual->stride[1] : 0;
    p.y = k3_tensor_data(l->out);
    p.y_s0 = l->out->stride[0];
    p.y_s1 = l->out->stride[1];
    p.M = (int)l->x->size[0];
    p.epilogue = l->epilogue == K3_LINEAR_EPILOGUE_SILU_MUL ? 1 : 0;
    p.N = (int)l->w->size[0] / (p.epilogue ? 2 : 1); /* the epilogue's N: h's columns */
    p.K = (int)l->w->size[1];
    p.prologue = l->prologue == K3_LINEAR_PROLOGUE_SILU_MUL  ? 1
                 : l->prologue == K3_LINEAR_PROLOGUE_RMS_NORM ? 2
                                                              : 0;
    p.x_row = l->x->stride[0] / 8;
    p.norm_weight = l->norm_weight ? k3_tensor_data(l->norm_weight) : NULL;
    p.eps = l->norm_eps;
    if (p.N == 0) return K3_OK;
    /* Dispatch's prologue has rejected freed tensors; non-empty views have storage. */
    if (!p.x || !p.w || !p.y || (l->residual && !p.res))
        return k3_error(K3_EINTERNAL, "linear: %s: NULL data for a non-empty tensor",
                        k3_cuda_linear_skinny_name);

    k3c_ctx *ctx = NULL;
    K3_TRY(k3c_context(k3_tensor_device(l->x).index, &ctx));
    /* The prologue in the kernel, or h through a temporary and the plain kernel on it. */
    k3c_buffer hbuf;
    k3c_temp_tensor ht;
    /* In the kernel, up to K3_SKINNY_PROLOGUE_MAX_M tokens and where h fits in shared
     * memory; the rms_norm prologue also needs x's rows and a bf16 norm weight that allow
     * 16-byte loads. */
    const bool fits = k3sk_silu_fits(ctx->dev,
                                     k3_skinny_silu_smem_bytes(p.M, p.K, kcta > 1 ? kcta : 1));
    bool temp = false;
    if (p.prologue == 1) temp = p.M > k3sk_prologue_max_m() || !fits;
    if (p.prologue == 2)
        temp = p.M > k3sk_prologue_max_m() || !fits || l->x->stride[0] % 8 != 0 || (uintptr_t)p.x % 16 != 0 ||
               l->norm_weight->dtype != K3_DTYPE_BF16 ||
               (l->norm_weight->size[0] > 1 && l->norm_weight->stride[0] != 1) ||
               (uintptr_t)p.norm_weight % 16 != 0;
    /* The 16- and 32-rows-per-warp and the epilogue instances, and the balanced grid, have no
     * in-kernel prologue. */
    if (p.prologue && (cfg.rows_per_warp != 8 || p.epilogue || cfg.balanced)) temp = true;
    if (temp) {
        K3_TRY(k3c_prologue_temp(l, hbuf, ht));
        p.x = k3_tensor_data(&ht.t);
        p.prologue = 0;
    }
    /* The balanced grid: G CTAs of at most cfg.rows rows each. */
    if (cfg.balanced) p.grid = k3_skinny_balanced_grid(p.N, cfg.rows, k3c_sm_count(ctx->dev));
    /* The L2 prefetch budget over w's rows (2N with the epilogue) and K-slices. */
    p.l2_prefetch = k3_skinny_l2_prefetch_row(cfg.l2_prefetch_mb, l->w->size[0],
                                              2 * (int64_t)p.K, kcta > 1 ? kcta : 1);
    if (kcta <= 1) {
        K3_CHECK(k3_skinny_launch(cfg.threads, cfg.rows, cfg.unroll, p, ctx->stream,
                                  cfg.rows_per_warp));
        return K3_OK;
    }
    k3sk_scratch *scr = NULL;
    K3_TRY(k3sk_get_scratch(ctx, &scr));
    K3_CHECK(k3_skinny_launch_split(cfg.threads, cfg.rows, cfg.unroll, kcta, p,
                                    (float *)ctx->workspace, scr->counters, ctx->stream));
    return K3_OK;
}

extern "C" const k3_kernel k3_cuda_linear_skinny =
    K3_KERNEL_RECORD(k3_cuda_linear_skinny, k3sk_supports, k3sk_run);
