/*
 * cpu_attn_res.c — cpu.attn_res.reference: the whole AttnRes read of DESIGN.md (fused
 * delta add rounded to the dtype and written back, write_block, num_blocks 0..S, output
 * norm or none) for any row strides with unit last stride. fp32 arithmetic, fp64 for f64.
 */
#include "k3_impl.h"
#include "cpu_rms.h"

#include <math.h>
#include <string.h>

static k3_status supports(const k3_op_args *a, char *reason, size_t n) { return K3_OK; }

/* One token row, written once per accumulator type T. `src` holds (num_blocks + 1) * H
 * values of T, `mixed` H, `nw`/`qk`/`onw` the weights widened to T. The key norms and the
 * output norm take their row scale from cpu_rms.h, so a source or mixed row whose sum of
 * squares overflows or underflows still gets its scale-invariant value: the key logit
 * dot(v, nw * qk) / sqrt(mean(v^2) + eps) is computed on the rescaled row when it must be. */
#define DEFINE_ROW(NAME, T, LOAD, STORE, EXP, RMS_SCALE, LDEXP)                             \
    static void NAME(const k3_attn_res_kargs *ka, int64_t t, T *src, T *mixed, const T *nw,  \
                     const T *qk, const T *onw, T *logit) {                                  \
        const k3_attn_res_args *a = &ka->p;                                                  \
        const k3_tensor *pf = a->prefix, *bl = a->blocks, *dl = a->delta;                    \
        k3_dtype dt = pf->dtype;                                                             \
        int64_t H = pf->size[1], n = a->num_blocks;                                          \
        void *pb = k3_tensor_data(pf);                                                       \
        void *bb = k3_tensor_data(bl);                                                       \
        T *p = src + n * H;                                                                  \
        for (int64_t d = 0; d < H; d++) p[d] = LOAD(pb, dt, t * pf->stride[0] + d);          \
        if (dl) {                                                                            \
            const void *db = k3_tensor_data(dl);                                             \
            for (int64_t d = 0; d < H; d++) {                                                \
                int64_t i = t * pf->stride[0] + d;                                           \
                STORE(pb, dt, i, p[d] + LOAD(db, dt, t * dl->stride[0] + d));                \
                p[d] = LOAD(pb, dt, i); /* the rounded value is what every reader sees */    \
            }                                                                                \
        }                                                                                    \
        if (a->write_block >= 0)                                                             \
            for (int64_t d = 0; d < H; d++)                                                  \
                STORE(bb, dt, t * bl->stride[0] + a->write_block * bl->stride[1] + d, p[d]); \
        for (int64_t s = 0; s < n; s++)                                                      \
            for (int64_t d = 0; d < H; d++)                                                  \
                src[s * H + d] = LOAD(bb, dt, t * bl->stride[0] + s * bl->stride[1] + d);    \
        T mx = -INFINITY;                                                                    \
        for (int64_t s = 0; s <= n; s++) {                                                   \
            const T *v = src + s * H;                                                        \
            int e;                                                                           \
            T r = RMS_SCALE(v, H, (T)a->eps, &e), dot = 0;                                   \
            for (int64_t d = 0; d < H; d++) dot += (e ? LDEXP(v[d], e) : v[d]) * nw[d] * qk[d]; \
            logit[s] = dot * r;                                                              \
            if (logit[s] > mx) mx = logit[s];                                                \
        }                                                                                    \
        T sum = 0;                                                                           \
        for (int64_t s = 0; s <= n; s++) {                                                   \
            logit[s] = EXP(logit[s] - mx);                                                   \
            sum += logit[s];                                                                 \
        }                                                                                    \
        for (int64_t s = 0; s <= n; s++) logit[s] = logit[s] / sum;                          \
        if (n == 0) logit[0] = 1; /* one source: exactly one, even for a non-finite logit */ \
        for (int64_t d = 0; d < H; d++) mixed[d] = 0;                                        \
        for (int64_t s = 0; s <= n; s++)                                                     \
            for (int64_t d = 0; d < H; d++) mixed[d] += logit[s] * src[s * H + d];           \
        k3_tensor *o = ka->out;                                                              \
        void *ob = k3_tensor_data(o);                                                        \
        if (onw) {                                                                           \
            int e;                                                                           \
            T r = RMS_SCALE(mixed, H, (T)a->output_eps, &e);                                 \
            for (int64_t d = 0; d < H; d++)                                                  \
                STORE(ob, o->dtype, t * o->stride[0] + d,                                    \
                      (e ? LDEXP(mixed[d], e) : mixed[d]) * r * onw[d]);                     \
        } else {                                                                             \
            for (int64_t d = 0; d < H; d++) STORE(ob, o->dtype, t * o->stride[0] + d, mixed[d]); \
        }                                                                                    \
    }

DEFINE_ROW(row_f32, float, k3_load_f32, k3_store_f32, expf, k3_rms_scale_f32, ldexpf)
DEFINE_ROW(row_f64, double, k3_load_f64, k3_store_f64, exp, k3_rms_scale_f64, ldexp)

static k3_status run(const k3_op_args *oa) {
    const k3_kernel *k = &k3_cpu_attn_res_reference;
    if (!oa || oa->op != K3_OP_ATTN_RES)
        return k3_error(K3_EINVAL, "attn_res: kernel %s called with %s arguments", k->name,
                        oa ? k3_op_name(oa->op) : "NULL");
    const k3_attn_res_kargs *ka = &oa->u.attn_res;
    K3_TRY(k3_attn_res_validate(ka));
    K3_TRY(k3_kernel_check_device(k, ka->p.prefix));
    K3_TRY(k3_kernel_check_device(k, ka->out));
    const k3_attn_res_args *a = &ka->p;
    int64_t T = a->prefix->size[0], H = a->prefix->size[1], n = a->num_blocks;
    if (T == 0) return K3_OK;
    bool dbl = a->prefix->dtype == K3_DTYPE_F64;
    size_t es = dbl ? sizeof(double) : sizeof(float);
    /* src (n+1)*H, mixed H, three weights H, logits n+1. */
    size_t elems, bytes;
    if (__builtin_mul_overflow((size_t)(n + 1), (size_t)H + 1, &elems) ||
        __builtin_add_overflow(elems, 4 * (size_t)H, &elems) ||
        __builtin_mul_overflow(elems, es, &bytes))
        return k3_error(K3_EOVERFLOW,
                        "attn_res: cpu.attn_res.reference: scratch size overflows for "
                        "num_blocks %lld and hidden_size %lld",
                        (long long)n, (long long)H);
    char *buf = k3_host_alloc(bytes);
    if (!buf) return k3_error(K3_ENOMEM, "attn_res: cpu.attn_res.reference: out of memory (%zu bytes)", bytes);
    char *src = buf, *mixed = src + (size_t)(n + 1) * H * es, *nw = mixed + H * es,
         *qk = nw + H * es, *onw = qk + H * es, *logit = onw + H * es;
    const k3_tensor *ws[3] = {a->norm_weight, a->qk_weight, a->output_norm_weight};
    char *wd[3] = {nw, qk, onw};
    for (int i = 0; i < 3; i++) {
        if (!ws[i]) continue;
        const void *b = k3_tensor_data(ws[i]);
        for (int64_t d = 0; d < H; d++) {
            if (dbl) ((double *)wd[i])[d] = k3_load_f64(b, ws[i]->dtype, d * ws[i]->stride[0]);
            else ((float *)wd[i])[d] = k3_load_f32(b, ws[i]->dtype, d * ws[i]->stride[0]);
        }
    }
    bool has_onw = a->output_norm_weight != NULL;
    for (int64_t t = 0; t < T; t++) {
        if (dbl)
            row_f64(ka, t, (double *)src, (double *)mixed, (double *)nw, (double *)qk,
                    has_onw ? (double *)onw : NULL, (double *)logit);
        else
            row_f32(ka, t, (float *)src, (float *)mixed, (float *)nw, (float *)qk,
                    has_onw ? (float *)onw : NULL, (float *)logit);
    }
    k3_host_free(buf, bytes);
    return K3_OK;
}

const k3_kernel k3_cpu_attn_res_reference = {"cpu.attn_res.reference", K3_OP_ATTN_RES,
                                             K3_DEVICE_CPU, supports, run};
