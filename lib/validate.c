/*
 * validate.c — each op's validation, whose messages name the op, the argument, what was
 * expected and what was given: the op's half of dispatch's prologue (lib/dispatch.c), which
 * runs it once per call, before any kernel is asked or run, and the shape, dtype and device of
 * the op's result. Everything is validated before anything is written.
 */
#include "k3_impl.h"

#include <stdio.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DIMS_LEN 160

/* "[2, 3]" of t's sizes / strides. */
static const char *shp(char *buf, const k3_tensor *t) {
    return k3_fmt_dims(buf, DIMS_LEN, t->ndim, t->size);
}
static const char *strd(char *buf, const k3_tensor *t) {
    return k3_fmt_dims(buf, DIMS_LEN, t->ndim, t->stride);
}

static k3_status need(const char *op, const char *what, const k3_tensor *t) {
    if (!t) return k3_error(K3_EINVAL, "%s: %s is required", op, what);
    k3_status s = k3_tensor_check(t, what);
    if (s != K3_OK) return k3_error_prefix(s, op);
    return K3_OK;
}

static k3_status need_opt(const char *op, const char *what, const k3_tensor *t) {
    return t ? need(op, what, t) : K3_OK;
}

/* "linear: x must be 2-D [M, K]; got 3-D [2, 3, 4]" */
static k3_status need_ndim(const char *op, const char *what, const k3_tensor *t, int nd,
                           const char *form) {
    if (t->ndim == nd) return K3_OK;
    char b[DIMS_LEN];
    return k3_error(K3_ESHAPE, "%s: %s must be %d-D %s; got %d-D %s", op, what, nd, form,
                    t->ndim, shp(b, t));
}

/* "linear: w dtype (f32) must match x dtype (bf16)" */
static k3_status same_dtype(const char *op, const char *what, const k3_tensor *t,
                            const char *refwhat, const k3_tensor *ref) {
    if (t->dtype == ref->dtype) return K3_OK;
    return k3_error(K3_EDTYPE, "%s: %s dtype (%s) must match %s dtype (%s)", op, what,
                    k3_dtype_name(t->dtype), refwhat, k3_dtype_name(ref->dtype));
}

static bool device_eq(k3_device a, k3_device b) {
    return a.type == b.type && (a.type == K3_DEVICE_CPU || a.index == b.index);
}

/* "linear: w device (cuda:0) must match x device (cpu)" */
static k3_status same_device(const char *op, const char *what, const k3_tensor *t,
                             const char *refwhat, const k3_tensor *ref) {
    k3_device a = k3_tensor_device(t), b = k3_tensor_device(ref);
    if (device_eq(a, b)) return K3_OK;
    char da[32], db[32];
    return k3_error(K3_EDEVICE, "%s: %s device (%s) must match %s device (%s)", op, what,
                    k3_device_name(a, da, sizeof da), refwhat, k3_device_name(b, db, sizeof db));
}

/* Kernels read rows as contiguous runs, so the last dim must have stride 1 (a last dim of
 * one element has no stride to speak of). */
static k3_status unit_last(const char *op, const char *what, const k3_tensor *t) {
    if (t->ndim == 0 || t->size[t->ndim - 1] <= 1 || t->stride[t->ndim - 1] == 1)
        return K3_OK;
    char b[DIMS_LEN];
    return k3_error(K3_ELAYOUT, "%s: %s must have unit stride in its last dim; got strides %s",
                    op, what, strd(b, t));
}

/* A tensor the op writes distinct values into: no two of its elements may share memory
 * (k3_tensor_self_overlaps; the rule every in-place writer follows, k3.h "In-place
 * writes"). */
static k3_status written(const char *op, const char *what, const k3_tensor *t) {
    K3_TRY(k3_tensor_writable(t, op, what));
    if (!k3_tensor_self_overlaps(t)) return K3_OK;
    char b[DIMS_LEN], c[DIMS_LEN];
    return k3_error(K3_ELAYOUT,
                    "%s: %s is written but its elements overlap (shape %s, strides %s)", op,
                    what, shp(b, t), strd(c, t));
}

static k3_status no_overlap(const char *op, const char *what, const k3_tensor *t,
                            const char *otherwhat, const k3_tensor *other) {
    if (!other || !k3_tensor_overlaps(t, other)) return K3_OK;
    return k3_error(K3_EINVAL, "%s: %s overlaps %s", op, what, otherwhat);
}

/* out must be exactly the result: shape, dtype and device. */
static k3_status check_out(const char *op, const k3_tensor *out, int nd, const int64_t *shape,
                           k3_dtype dtype, k3_device dev) {
    K3_TRY(need(op, "out", out));
    bool ok = out->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = out->size[d] == shape[d];
    if (!ok) {
        char b[DIMS_LEN], c[DIMS_LEN];
        return k3_error(K3_ESHAPE, "%s: out must be %s; got %s", op,
                        k3_fmt_dims(c, sizeof c, nd, shape), shp(b, out));
    }
    if (out->dtype != dtype)
        return k3_error(K3_EDTYPE, "%s: out dtype (%s) must be %s", op,
                        k3_dtype_name(out->dtype), k3_dtype_name(dtype));
    k3_device od = k3_tensor_device(out);
    if (!device_eq(od, dev)) {
        char a[32], b[32];
        return k3_error(K3_EDEVICE, "%s: out device (%s) must be %s", op,
                        k3_device_name(od, a, sizeof a), k3_device_name(dev, b, sizeof b));
    }
    return written(op, "out", out);
}

static k3_status finite_eps(const char *op, const char *what, double eps) {
    if (isfinite(eps) && eps >= 0) return K3_OK;
    char b[32];
    return k3_error(K3_EINVAL, "%s: %s must be a finite number >= 0; got %s", op, what,
                    k3_fmt_double(b, sizeof b, eps));
}

/* ---- linear ---------------------------------------------------------------------------- */

static k3_status linear_inputs(const k3_linear_args *a) {
    const char *op = "linear";
    K3_TRY(need(op, "x", a->x));
    K3_TRY(need(op, "w", a->w));
    K3_TRY(need_opt(op, "bias", a->bias));
    K3_TRY(need_opt(op, "residual", a->residual));
    const k3_tensor *x = a->x, *w = a->w;
    if (a->prologue != K3_LINEAR_PROLOGUE_NONE && a->prologue != K3_LINEAR_PROLOGUE_SILU_MUL &&
        a->prologue != K3_LINEAR_PROLOGUE_RMS_NORM)
        return k3_error(K3_EINVAL,
                        "linear: prologue must be %d (none), %d (silu_mul) or %d (rms_norm); got %d",
                        (int)K3_LINEAR_PROLOGUE_NONE, (int)K3_LINEAR_PROLOGUE_SILU_MUL,
                        (int)K3_LINEAR_PROLOGUE_RMS_NORM, (int)a->prologue);
    if (a->epilogue != K3_LINEAR_EPILOGUE_NONE && a->epilogue != K3_LINEAR_EPILOGUE_SILU_MUL)
        return k3_error(K3_EINVAL, "linear: epilogue must be %d (none) or %d (silu_mul); got %d",
                        (int)K3_LINEAR_EPILOGUE_NONE, (int)K3_LINEAR_EPILOGUE_SILU_MUL,
                        (int)a->epilogue);
    bool silu = a->prologue == K3_LINEAR_PROLOGUE_SILU_MUL;
    bool rms = a->prologue == K3_LINEAR_PROLOGUE_RMS_NORM;
    bool epi = a->epilogue == K3_LINEAR_EPILOGUE_SILU_MUL;
    /* The residual would be added to y before the gate: no op of the library computes that. */
    if (epi && a->residual)
        return k3_error(K3_EINVAL,
                        "linear: residual cannot be combined with epilogue silu_mul (it would be "
                        "added before the gate); add it to the result instead");
    if (!rms && a->norm_weight)
        return k3_error(K3_EINVAL, "linear: norm_weight is given but the prologue is not rms_norm");
    if (rms) K3_TRY(need(op, "norm_weight", a->norm_weight));
    K3_TRY(need_ndim(op, "x", x, 2, silu ? "[M, 2K]" : "[M, K]"));
    K3_TRY(need_ndim(op, "w", w, 2, "[N, K]"));
    /* The silu_mul prologue reads gate x[:, :K] and up x[:, K:] as silu_mul does: rows of 2K
     * with unit last stride. */
    if (silu && (x->size[1] % 2 != 0 || x->size[1] / 2 != w->size[1])) {
        int64_t want;
        if (!k3_mul_ok(w->size[1], 2, &want)) want = INT64_MAX;
        return k3_error(K3_ESHAPE,
                        "linear: x dim %d (%lld) must be 2 * w dim %d (%lld) = %lld for prologue "
                        "silu_mul",
                        1 + a->base, (long long)x->size[1], 1 + a->base, (long long)w->size[1],
                        (long long)want);
    }
    if (silu || rms) K3_TRY(unit_last(op, "x", x));
    if (!silu && x->size[1] != w->size[1])
        return k3_error(K3_ESHAPE, "linear: x dim %d (%lld) must match w dim %d (%lld)",
                        1 + a->base, (long long)x->size[1], 1 + a->base, (long long)w->size[1]);
    K3_TRY(same_dtype(op, "w", w, "x", x));
    K3_TRY(same_device(op, "w", w, "x", x));
    if (rms) { /* as rms_norm's w and eps (any dtype) */
        const k3_tensor *nw = a->norm_weight;
        if (nw->ndim != 1 || nw->size[0] != w->size[1]) {
            char b[DIMS_LEN];
            return k3_error(K3_ESHAPE, "linear: norm_weight must be [K] = [%lld] (w dim %d); got %s",
                            (long long)w->size[1], 1 + a->base, shp(b, nw));
        }
        K3_TRY(same_device(op, "norm_weight", nw, "x", x));
        K3_TRY(unit_last(op, "norm_weight", nw));
        K3_TRY(finite_eps(op, "eps", a->norm_eps));
    }
    int64_t M = x->size[0], N = w->size[0];
    /* The silu_mul epilogue pairs gate row n with up row N/2 + n of w. */
    if (epi && N % 2 != 0)
        return k3_error(K3_ESHAPE, "linear: w dim %d (%lld) must be even for epilogue silu_mul",
                        0 + a->base, (long long)N);
    if (a->bias) {
        char b[DIMS_LEN];
        if (a->bias->ndim != 1 || a->bias->size[0] != N)
            return k3_error(K3_ESHAPE, "linear: bias must be [N] = [%lld] (w dim %d); got %s",
                            (long long)N, 0 + a->base, shp(b, a->bias));
        K3_TRY(same_dtype(op, "bias", a->bias, "x", x));
        K3_TRY(same_device(op, "bias", a->bias, "x", x));
    }
    if (a->residual) {
        char b[DIMS_LEN];
        if (a->residual->ndim != 2 || a->residual->size[0] != M || a->residual->size[1] != N)
            return k3_error(K3_ESHAPE, "linear: residual must be [M, N] = [%lld, %lld]; got %s",
                            (long long)M, (long long)N, shp(b, a->residual));
        K3_TRY(same_dtype(op, "residual", a->residual, "x", x));
        K3_TRY(same_device(op, "residual", a->residual, "x", x));
    }
    return K3_OK;
}

/* The result's columns: w's rows, half of them under the silu_mul epilogue. */
static int64_t linear_n(const k3_linear_args *a) {
    return a->epilogue == K3_LINEAR_EPILOGUE_SILU_MUL ? a->w->size[0] / 2 : a->w->size[0];
}

static k3_status linear_out(const k3_linear_args *a) {
    const char *op = "linear";
    int64_t shape[2] = {a->x->size[0], linear_n(a)};
    K3_TRY(check_out(op, a->out, 2, shape, a->x->dtype, k3_tensor_device(a->x)));
    /* The epilogue writes out as silu_mul writes its out. */
    if (a->epilogue == K3_LINEAR_EPILOGUE_SILU_MUL) K3_TRY(unit_last(op, "out", a->out));
    K3_TRY(no_overlap(op, "out", a->out, "x", a->x));
    K3_TRY(no_overlap(op, "out", a->out, "w", a->w));
    K3_TRY(no_overlap(op, "out", a->out, "bias", a->bias));
    K3_TRY(no_overlap(op, "out", a->out, "residual", a->residual));
    K3_TRY(no_overlap(op, "out", a->out, "norm_weight", a->norm_weight));
    return K3_OK;
}

/* ---- attn_res ---------------------------------------------------------------------------- */

static k3_status weight_h(const char *what, const k3_tensor *wt, const k3_tensor *prefix,
                          int base) {
    const char *op = "attn_res";
    K3_TRY(need(op, what, wt));
    int64_t H = prefix->size[1];
    if (wt->ndim != 1 || wt->size[0] != H) {
        char b[DIMS_LEN];
        return k3_error(K3_ESHAPE, "attn_res: %s must be [H] = [%lld] (prefix dim %d); got %s",
                        what, (long long)H, 1 + base, shp(b, wt));
    }
    K3_TRY(same_device(op, what, wt, "prefix", prefix));
    return unit_last(op, what, wt);
}

/* Whether attn_res's write slot, the rows blocks[t, wb, :] of every token t, shares an
 * element with a row the call reads from blocks, blocks[t', s, :] for s < nb, other than the
 * same row (a token reads its own written slot after writing it, DESIGN.md's order). A row
 * starts at t*s0 + s*s1 and holds H unit-stride elements, so two rows share one iff their
 * starts differ by less than H: some (u, v) != (0, 0) with u = t - t' in -(T-1)..T-1 and
 * v = wb - s must give |u*s0 + v*s1| < H. For each v the u nearest to -v*s1/s0 decides, so
 * the test is exact in O(nb). On a hit, token *tw's write slot overlaps token *tr's slot *sr
 * (0-based). */
static bool write_slot_hits_reads(const k3_tensor *blocks, int64_t wb, int64_t nb, int64_t *tw,
                                  int64_t *tr, int64_t *sr) {
    int64_t T = blocks->size[0], H = blocks->size[2];
    __int128 s0 = blocks->stride[0], s1 = blocks->stride[1];
    if (T == 0 || H == 0) return false;
    for (int64_t s = 0; s < nb; s++) {
        int64_t v = wb - s;
        __int128 c = (__int128)v * s1;
        int64_t cand[4];
        int nc = 0;
        if (v == 0) { /* the same slot: only another token's row counts */
            cand[nc++] = 1;
            cand[nc++] = -1;
        } else if (s0 == 0) {
            cand[nc++] = 0;
        } else {
            __int128 q = -c / s0; /* C rounds toward zero: q and q -/+ 1 bracket -c/s0 */
            for (int k = -1; k <= 1; k++) {
                __int128 u = q + k;
                if (u > T - 1) u = T - 1;
                if (u < -(T - 1)) u = -(T - 1);
                cand[nc++] = (int64_t)u;
            }
        }
        for (int i = 0; i < nc; i++) {
            int64_t u = cand[i];
            if (u > T - 1 || u < -(T - 1) || (u == 0 && v == 0)) continue;
            __int128 d = u * s0 + c;
            if (d < 0) d = -d;
            if (d < H) {
                *tw = u >= 0 ? u : 0;
                *tr = u >= 0 ? 0 : -u;
                *sr = s;
                return true;
            }
        }
    }
    return false;
}

/* The memory an attn_res operand covers, as byte intervals: n rows of len bytes, row i at byte
 * base + i * stride of storage (a [T, H] view with unit last stride, an [H] weight, or one
 * slot blocks[:, s, :]). The overlap tests below are exact on these intervals, so two views
 * of one storage that interleave without sharing a byte (rows of one padded buffer, slots of
 * one blocks tensor) pass, and any shared byte is refused. */
typedef struct {
    const void *storage;
    int64_t base, n, stride, len;
} ar_rows;

static ar_rows ar_rows_of(const k3_tensor *t) {
    int64_t es = (int64_t)k3_dtype_size(t->dtype), H = t->size[t->ndim - 1];
    ar_rows r = {t->storage, t->offset * es, 1, 0, H * es};
    if (t->ndim == 2) r.n = t->size[0], r.stride = t->stride[0] * es;
    if (k3_tensor_numel(t) == 0) r.n = 0;
    return r;
}
static ar_rows ar_slot_rows(const k3_tensor *blocks, int64_t s) {
    int64_t es = (int64_t)k3_dtype_size(blocks->dtype);
    ar_rows r = {blocks->storage, (blocks->offset + s * blocks->stride[1]) * es, blocks->size[0],
                 blocks->stride[0] * es, blocks->size[2] * es};
    if (k3_tensor_numel(blocks) == 0) r.n = 0;
    return r;
}
static int64_t ar_floor_div(int64_t a, int64_t b) { /* b > 0 */
    int64_t q = a / b;
    return q * b > a ? q - 1 : q;
}
/* Whether some row of a shares a byte with some row of b: for each row of the smaller set,
 * the rows of b whose start lies in (x - b.len, x + a.len) form one run of indices. */
static bool ar_rows_overlap(ar_rows a, ar_rows b) {
    if (a.storage != b.storage || a.n == 0 || b.n == 0 || a.len == 0 || b.len == 0) return false;
    ar_rows *v[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        if (v[k]->n == 1) v[k]->stride = 0;
        if (v[k]->stride < 0) v[k]->base += (v[k]->n - 1) * v[k]->stride, v[k]->stride = -v[k]->stride;
    }
    if (a.base + (a.n - 1) * a.stride + a.len <= b.base || b.base + (b.n - 1) * b.stride + b.len <= a.base)
        return false;
    if (a.n > b.n) {
        ar_rows t = a;
        a = b, b = t;
    }
    for (int64_t i = 0; i < a.n; i++) {
        int64_t x = a.base + i * a.stride;
        int64_t lo = x - b.len - b.base, hi = x + a.len - b.base; /* j * b.stride in (lo, hi) */
        if (b.stride == 0) {
            if (lo < 0 && 0 < hi) return true;
            continue;
        }
        int64_t jmin = ar_floor_div(lo, b.stride) + 1, jmax = -ar_floor_div(-hi, b.stride) - 1;
        if (jmin < 0) jmin = 0;
        if (jmax > b.n - 1) jmax = b.n - 1;
        if (jmin <= jmax) return true;
    }
    return false;
}

/* "name (shape [..], strides [..])" (name up to its first space), or for one slot of blocks "blocks[:, s, :] (blocks shape
 * [..], strides [..])" (s in the caller's numbering). */
static const char *ar_desc(char *buf, size_t n, const char *name, const k3_tensor *t, int64_t slot,
                           int base) {
    char b[DIMS_LEN], c[DIMS_LEN];
    if (slot >= 0)
        snprintf(buf, n, "blocks[:, %lld, :] (blocks shape %s, strides %s)",
                 (long long)k3_based(slot, base), shp(b, t), strd(c, t));
    else
        snprintf(buf, n, "%.*s (shape %s, strides %s)", (int)strcspn(name, " "), name, shp(b, t),
                 strd(c, t));
    return buf;
}

/* The refusal when the rows of written tensor w (what; slot ws >= 0: only blocks[:, ws, :])
 * share a byte with the rows of o (owhat; slots 0..onb-1 of blocks and oslot when o is
 * blocks, onb < 0: all of o): "attn_res: <what> overlaps <owhat>: <w desc> and <o desc> share
 * memory". */
static k3_status ar_no_overlap(const char *what, const k3_tensor *w, int64_t ws, const char *owhat,
                               const k3_tensor *o, int64_t onb, int64_t oslot, int base) {
    if (!o) return K3_OK;
    ar_rows rw = ws >= 0 ? ar_slot_rows(w, ws) : ar_rows_of(w);
    int64_t hit = -2; /* -1: o as a whole; else the slot of o that shares memory */
    if (onb < 0) {
        if (ar_rows_overlap(rw, ar_rows_of(o))) hit = -1;
    } else {
        for (int64_t s = 0; s < onb && hit == -2; s++)
            if (ar_rows_overlap(rw, ar_slot_rows(o, s))) hit = s;
        if (hit == -2 && oslot >= 0 && ar_rows_overlap(rw, ar_slot_rows(o, oslot))) hit = oslot;
    }
    if (hit == -2) return K3_OK;
    char a[2 * DIMS_LEN + 64], b[2 * DIMS_LEN + 64];
    return k3_error(K3_EINVAL, "attn_res: %s overlaps %s: %s and %s share memory", what, owhat,
                    ar_desc(a, sizeof a, what, w, ws, base),
                    ar_desc(b, sizeof b, owhat, o, hit, base));
}

/* a->base: how the caller counts dims and write_block in messages (k3_set_message_base). */
static k3_status attn_res_inputs(const k3_attn_res_kargs *a) {
    const char *op = "attn_res";
    const k3_attn_res_args *p = &a->p;
    int base = a->base;
    K3_TRY(need(op, "prefix", p->prefix));
    K3_TRY(need_opt(op, "delta", p->delta));
    K3_TRY(need(op, "blocks", p->blocks));
    const k3_tensor *prefix = p->prefix, *blocks = p->blocks, *delta = p->delta;
    K3_TRY(need_ndim(op, "prefix", prefix, 2, "[T, H]"));
    K3_TRY(need_ndim(op, "blocks", blocks, 3, "[T, S, H]"));
    int64_t T = prefix->size[0], H = prefix->size[1], S = blocks->size[1];
    if (blocks->size[0] != T)
        return k3_error(K3_ESHAPE, "attn_res: blocks dim %d (%lld) must match prefix dim %d (%lld)",
                        0 + base, (long long)blocks->size[0], 0 + base, (long long)T);
    if (blocks->size[2] != H)
        return k3_error(K3_ESHAPE, "attn_res: blocks dim %d (%lld) must match prefix dim %d (%lld)",
                        2 + base, (long long)blocks->size[2], 1 + base, (long long)H);
    if (delta && (delta->ndim != 2 || delta->size[0] != T || delta->size[1] != H)) {
        char b[DIMS_LEN], c[DIMS_LEN];
        return k3_error(K3_ESHAPE, "attn_res: delta must be [T, H] = %s (prefix); got %s",
                        shp(c, prefix), shp(b, delta));
    }
    K3_TRY(weight_h("norm_weight", p->norm_weight, prefix, base));
    K3_TRY(weight_h("qk_weight", p->qk_weight, prefix, base));
    if (p->output_norm_weight)
        K3_TRY(weight_h("output_norm_weight", p->output_norm_weight, prefix, base));
    if (p->num_blocks < 0 || p->num_blocks > S)
        return k3_error(K3_ESHAPE, "attn_res: num_blocks must be in 0..%lld (blocks dim %d); got %lld",
                        (long long)S, 1 + base, (long long)p->num_blocks);
    /* The value is 0-based with -1 for none; messages say it as the caller does: C's -1 and
     * 0..S-1, or (base 1, the Lua binding) nil and 1..S. */
    if (p->write_block < -1 || p->write_block >= S) {
        if (base == 1 && S == 0)
            return k3_error(K3_ESHAPE,
                            "attn_res: write_block must be nil: blocks dim 2 is 0; got %lld",
                            k3_based(p->write_block, 1));
        if (base == 1)
            return k3_error(K3_ESHAPE,
                            "attn_res: write_block must be in 1..%lld (blocks dim 2); got %lld",
                            (long long)S, k3_based(p->write_block, 1));
        if (S == 0)
            return k3_error(K3_ESHAPE,
                            "attn_res: write_block must be -1 (no write): blocks has S = 0 "
                            "slots; got %lld",
                            (long long)p->write_block);
        return k3_error(K3_ESHAPE,
                        "attn_res: write_block must be -1 (no write) or in 0..%lld (blocks has "
                        "S = %lld slots); got %lld",
                        (long long)S - 1, (long long)S, (long long)p->write_block);
    }
    if (p->static_blocks < 0 || p->static_blocks > p->num_blocks)
        return k3_error(K3_ESHAPE, "attn_res: static_blocks must be in 0..%lld (num_blocks); got %lld",
                        (long long)p->num_blocks, (long long)p->static_blocks);
    if (p->write_block >= 0 && p->static_blocks > p->write_block)
        return k3_error(K3_EINVAL,
                        "attn_res: static_blocks (%lld) covers write_block %lld: the slot this call "
                        "writes cannot be loaded before the wait",
                        (long long)p->static_blocks, k3_based(p->write_block, base));
    if (delta) K3_TRY(same_dtype(op, "delta", delta, "prefix", prefix));
    K3_TRY(same_dtype(op, "blocks", blocks, "prefix", prefix));
    if (delta) K3_TRY(same_device(op, "delta", delta, "prefix", prefix));
    K3_TRY(same_device(op, "blocks", blocks, "prefix", prefix));
    K3_TRY(unit_last(op, "prefix", prefix));
    if (delta) K3_TRY(unit_last(op, "delta", delta));
    K3_TRY(unit_last(op, "blocks", blocks));
    K3_TRY(finite_eps(op, "eps", p->eps));
    K3_TRY(finite_eps(op, "output_eps", p->output_eps));

    const k3_tensor *ro[] = {p->norm_weight, p->qk_weight, p->output_norm_weight};
    const char *ron[] = {"norm_weight", "qk_weight", "output_norm_weight"};
    if (delta) {
        K3_TRY(written(op, "prefix", prefix));
        const char *pw = "prefix (updated by delta)";
        K3_TRY(ar_no_overlap(pw, prefix, -1, "delta", delta, -1, -1, base));
        K3_TRY(ar_no_overlap(pw, prefix, -1, "blocks", blocks, p->num_blocks, p->write_block, base));
        for (int i = 0; i < 3; i++) K3_TRY(ar_no_overlap(pw, prefix, -1, ron[i], ro[i], -1, -1, base));
    }
    if (p->write_block >= 0) {
        k3_tensor slot = *blocks; /* blocks[:, write_block, :] */
        slot.ndim = 2;
        slot.size[1] = H;
        slot.stride[1] = blocks->stride[2];
        K3_TRY(written(op, "blocks (write_block)", &slot));
        int64_t tw, tr, sr;
        if (write_slot_hits_reads(blocks, p->write_block, p->num_blocks, &tw, &tr, &sr)) {
            char b[DIMS_LEN];
            return k3_error(K3_ELAYOUT,
                            "attn_res: write_block %lld would overwrite memory the call reads: "
                            "blocks[%lld, %lld, :] shares elements with blocks[%lld, %lld, :] "
                            "(blocks strides %s, hidden_size %lld)",
                            k3_based(p->write_block, base), k3_based(tw, base),
                            k3_based(p->write_block, base), k3_based(tr, base),
                            k3_based(sr, base), strd(b, blocks), (long long)H);
        }
        const char *bw = "blocks (write_block)";
        int64_t wb = p->write_block;
        K3_TRY(ar_no_overlap(bw, blocks, wb, "prefix", prefix, -1, -1, base));
        K3_TRY(ar_no_overlap(bw, blocks, wb, "delta", delta, -1, -1, base));
        for (int i = 0; i < 3; i++) K3_TRY(ar_no_overlap(bw, blocks, wb, ron[i], ro[i], -1, -1, base));
    }
    return K3_OK;
}

static k3_status attn_res_out(const k3_attn_res_kargs *a) {
    const char *op = "attn_res";
    const k3_attn_res_args *p = &a->p;
    K3_TRY(check_out(op, a->out, 2, p->prefix->size, p->prefix->dtype,
                     k3_tensor_device(p->prefix)));
    K3_TRY(unit_last(op, "out", a->out));
    int base = a->base;
    K3_TRY(ar_no_overlap("out", a->out, -1, "prefix", p->prefix, -1, -1, base));
    K3_TRY(ar_no_overlap("out", a->out, -1, "delta", p->delta, -1, -1, base));
    K3_TRY(ar_no_overlap("out", a->out, -1, "blocks", p->blocks, p->num_blocks, p->write_block, base));
    K3_TRY(ar_no_overlap("out", a->out, -1, "norm_weight", p->norm_weight, -1, -1, base));
    K3_TRY(ar_no_overlap("out", a->out, -1, "qk_weight", p->qk_weight, -1, -1, base));
    K3_TRY(ar_no_overlap("out", a->out, -1, "output_norm_weight", p->output_norm_weight, -1, -1, base));
    return K3_OK;
}

/* ---- rms_norm and silu_mul ---------------------------------------------------------------- */

static k3_status rms_norm_inputs(const k3_rms_norm_args *a) {
    const char *op = "rms_norm";
    K3_TRY(need(op, "x", a->x));
    K3_TRY(need(op, "w", a->w));
    K3_TRY(need_ndim(op, "x", a->x, 2, "[M, H]"));
    int64_t H = a->x->size[1];
    if (a->w->ndim != 1 || a->w->size[0] != H) {
        char b[DIMS_LEN];
        return k3_error(K3_ESHAPE, "rms_norm: w must be [H] = [%lld] (x dim %d); got %s",
                        (long long)H, 1 + a->base, shp(b, a->w));
    }
    K3_TRY(same_device(op, "w", a->w, "x", a->x));
    K3_TRY(unit_last(op, "x", a->x));
    K3_TRY(unit_last(op, "w", a->w));
    return finite_eps(op, "eps", a->eps);
}

static k3_status rms_norm_out(const k3_rms_norm_args *a) {
    const char *op = "rms_norm";
    K3_TRY(check_out(op, a->out, 2, a->x->size, a->x->dtype, k3_tensor_device(a->x)));
    K3_TRY(unit_last(op, "out", a->out));
    K3_TRY(no_overlap(op, "out", a->out, "x", a->x));
    return no_overlap(op, "out", a->out, "w", a->w);
}

static k3_status silu_mul_inputs(const k3_silu_mul_args *a) {
    const char *op = "silu_mul";
    K3_TRY(need(op, "x", a->x));
    K3_TRY(need_ndim(op, "x", a->x, 2, "[M, 2I]"));
    if (a->x->size[1] % 2 != 0)
        return k3_error(K3_ESHAPE, "silu_mul: x dim %d (%lld) must be even ([M, 2I])",
                        1 + a->base, (long long)a->x->size[1]);
    return unit_last(op, "x", a->x);
}

static k3_status silu_mul_out(const k3_silu_mul_args *a) {
    const char *op = "silu_mul";
    int64_t shape[2] = {a->x->size[0], a->x->size[1] / 2};
    K3_TRY(check_out(op, a->out, 2, shape, a->x->dtype, k3_tensor_device(a->x)));
    K3_TRY(unit_last(op, "out", a->out));
    return no_overlap(op, "out", a->out, "x", a->x);
}

/* ---- abs, exp, sqrt ---------------------------------------------------------------------- */

static k3_status unary_inputs(const char *op, const k3_unary_args *a) {
    return need(op, "x", a->x);
}

static k3_status unary_out(const char *op, const k3_unary_args *a) {
    K3_TRY(check_out(op, a->out, a->x->ndim, a->x->size, a->x->dtype, k3_tensor_device(a->x)));
    return no_overlap(op, "out", a->out, "x", a->x);
}

#define K3_UNARY_CHECKS(name)                                                              \
    static k3_status name##_inputs(const k3_unary_args *a) { return unary_inputs(#name, a); } \
    static k3_status name##_out(const k3_unary_args *a) { return unary_out(#name, a); }
K3_UNARY_CHECKS(abs)
K3_UNARY_CHECKS(exp)
K3_UNARY_CHECKS(sqrt)
#undef K3_UNARY_CHECKS

/* ---- sum, mean, max, min -------------------------------------------------------------------- */

/* The result's shape: x's with dim of size 1, or 0-dim for dim = -1. */
static int reduce_shape(const k3_reduce_args *a, int64_t *shape) {
    if (a->dim < 0) return 0;
    for (int d = 0; d < a->x->ndim; d++) shape[d] = d == a->dim ? 1 : a->x->size[d];
    return a->x->ndim;
}

static k3_status reduce_inputs(const char *op, const k3_reduce_args *a, bool needs_element) {
    K3_TRY(need(op, "x", a->x));
    int nd = a->x->ndim;
    if (a->dim < -1 || a->dim >= nd) {
        if (a->base == 0)
            return k3_error(K3_EINVAL,
                            "%s: dim %d is out of range for a %d-dim tensor (expected 0..%d or "
                            "-1 for all)",
                            op, a->dim, nd, nd - 1);
        return k3_error(K3_EINVAL,
                        "%s: dim %lld is out of range for a %d-dim tensor (expected 1..%d)", op,
                        k3_based(a->dim, a->base), nd, nd);
    }
    if (!needs_element) return K3_OK;
    if (a->dim >= 0 && a->x->size[a->dim] == 0)
        return k3_error(K3_ESHAPE, "%s: cannot reduce an empty dim %d (size 0)", op,
                        a->dim + a->base);
    if (a->dim < 0 && k3_tensor_numel(a->x) == 0) {
        char b[DIMS_LEN];
        return k3_error(K3_ESHAPE, "%s: cannot reduce an empty tensor (shape %s)", op,
                        shp(b, a->x));
    }
    return K3_OK;
}

static k3_status reduce_out(const char *op, const k3_reduce_args *a) {
    int64_t shape[K3_MAX_DIMS];
    int nd = reduce_shape(a, shape);
    K3_TRY(check_out(op, a->out, nd, shape, a->x->dtype, k3_tensor_device(a->x)));
    K3_TRY(no_overlap(op, "out", a->out, "x", a->x));
    if (!a->indices) return K3_OK;
    K3_TRY(need(op, "indices", a->indices));
    bool ok = a->indices->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = a->indices->size[d] == shape[d];
    if (!ok) {
        char b[DIMS_LEN], c[DIMS_LEN];
        return k3_error(K3_ESHAPE, "%s: indices must be %s; got %s", op,
                        k3_fmt_dims(c, sizeof c, nd, shape), shp(b, a->indices));
    }
    if (a->indices->dtype != K3_DTYPE_F64)
        return k3_error(K3_EDTYPE, "%s: indices dtype (%s) must be f64", op,
                        k3_dtype_name(a->indices->dtype));
    K3_TRY(same_device(op, "indices", a->indices, "x", a->x));
    K3_TRY(written(op, "indices", a->indices));
    K3_TRY(no_overlap(op, "indices", a->indices, "x", a->x));
    return no_overlap(op, "indices", a->indices, "out", a->out);
}

#define K3_REDUCE_CHECKS(name, needs_element)                                              \
    static k3_status name##_inputs(const k3_reduce_args *a) {                              \
        return reduce_inputs(#name, a, needs_element);                                     \
    }                                                                                      \
    static k3_status name##_out(const k3_reduce_args *a) { return reduce_out(#name, a); }
K3_REDUCE_CHECKS(sum, false)
K3_REDUCE_CHECKS(mean, false)
K3_REDUCE_CHECKS(max, true)
K3_REDUCE_CHECKS(min, true)
#undef K3_REDUCE_CHECKS

/* ---- results ------------------------------------------------------------------------------- */

/* The result of each op, once its inputs have passed: shape, dtype and device. */
static void set_result(k3_op_result *r, int nd, const int64_t *shape, const k3_tensor *like) {
    r->ndim = nd;
    for (int d = 0; d < nd; d++) r->shape[d] = shape[d];
    r->dtype = like->dtype;
    r->device = k3_tensor_device(like);
}
static void linear_result(const k3_linear_args *a, k3_op_result *r) {
    int64_t shape[2] = {a->x->size[0], linear_n(a)};
    set_result(r, 2, shape, a->x);
}
static void attn_res_result(const k3_attn_res_kargs *a, k3_op_result *r) {
    set_result(r, 2, a->p.prefix->size, a->p.prefix);
}
static void rms_norm_result(const k3_rms_norm_args *a, k3_op_result *r) {
    set_result(r, 2, a->x->size, a->x);
}
static void silu_mul_result(const k3_silu_mul_args *a, k3_op_result *r) {
    int64_t shape[2] = {a->x->size[0], a->x->size[1] / 2};
    set_result(r, 2, shape, a->x);
}

static void unary_result(const k3_unary_args *a, k3_op_result *r) {
    set_result(r, a->x->ndim, a->x->size, a->x);
}
static void reduce_result(const k3_reduce_args *a, k3_op_result *r) {
    int64_t shape[K3_MAX_DIMS];
    set_result(r, reduce_shape(a, shape), shape, a->x);
}
#define abs_result unary_result
#define exp_result unary_result
#define sqrt_result unary_result
#define sum_result reduce_result
#define mean_result reduce_result
#define max_result reduce_result
#define min_result reduce_result

/* ---- the ops' table: what dispatch's prologue asks of each op -------------------------------- */

#define K3_OP(ID, name, signature, summary)                                                \
    static k3_status name##_check_inputs(const k3_op_args *a, k3_op_result *r) {            \
        K3_TRY(name##_inputs(&a->u.name));                                                 \
        name##_result(&a->u.name, r);                                                      \
        return K3_OK;                                                                      \
    }                                                                                      \
    static k3_status name##_check_out(const k3_op_args *a) { return name##_out(&a->u.name); }
#include "k3_ops.def"
#undef K3_OP

static const struct {
    k3_status (*inputs)(const k3_op_args *a, k3_op_result *r);
    k3_status (*out)(const k3_op_args *a);
    size_t out_offset; /* of the op's out slot in k3_op_args */
} g_ops[K3_OP_COUNT] = {
#define K3_OP(ID, name, signature, summary)                                                \
    {name##_check_inputs, name##_check_out, offsetof(k3_op_args, u.name.out)},
#include "k3_ops.def"
#undef K3_OP
};

k3_status k3_op_check_inputs(const k3_op_args *a, k3_op_result *r) {
    return g_ops[a->op].inputs(a, r);
}

k3_status k3_op_check_out(const k3_op_args *a) { return g_ops[a->op].out(a); }

k3_status k3_op_recheck(const k3_op_args *a, k3_device_type device, const char *variant) {
    if ((unsigned)a->op >= K3_OP_COUNT)
        return k3_error(K3_EINTERNAL, "kernel entry: invalid op %d", (int)a->op);
    const char *op = k3_op_name(a->op);
    k3_op_result r;
    K3_TRY(k3_op_check_inputs(a, &r));
    if (!*k3_op_out((k3_op_args *)a))
        return k3_error(K3_EINVAL, "%s: out is required at kernel entry", op);
    K3_TRY(k3_op_check_out(a));
    if (r.device.type == device) return K3_OK;
    const char *dn = device == K3_DEVICE_CUDA ? "cuda" : "cpu";
    char got[32];
    return k3_error(K3_EDEVICE, "%s: kernel %s.%s.%s runs on %s tensors; got tensors on %s", op,
                    dn, op, variant, dn, k3_device_name(r.device, got, sizeof got));
}

k3_tensor **k3_op_out(k3_op_args *a) { return (k3_tensor **)((char *)a + g_ops[a->op].out_offset); }
