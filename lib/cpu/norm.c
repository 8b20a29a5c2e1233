/*
 * cpu/norm.c — cpu.rms_norm.reference and cpu.silu_mul.reference: row-wise kernels for any
 * row strides with unit last stride, bf16/f16/f32/f64. fp32 arithmetic, fp64 for f64.
 */
#include "k3_impl.h"
#include "rms.h"
#include "silu.h"

#include <math.h>

/* Dispatch's prologue validated the call and checked it runs on the CPU: every such call is
 * taken. */
static k3_status supports(const k3_op_args *a, char *reason, size_t n) { return K3_OK; }

/* y = round(x * rsqrt(mean(x^2) + eps) * w); the same expression order as the AttnRes
 * output norm, so attn_res with num_blocks = 0 equals rms_norm bit for bit. The row scale
 * comes from rms.h, which keeps it right for rows whose sum of squares overflows or
 * underflows (RMSNorm is scale-invariant); each row is widened once into a scratch row. */
static k3_status run_rms_norm(const k3_op_args *oa) {
    const k3_rms_norm_args *a = &oa->u.rms_norm;
    const k3_tensor *x = a->x, *w = a->w;
    k3_tensor *o = a->out;
    int64_t M = x->size[0], H = x->size[1];
    if (M == 0 || H == 0) return K3_OK;
    const void *xb = k3_tensor_data(x), *wb = k3_tensor_data(w);
    void *ob = k3_tensor_data(o);
    bool dbl = x->dtype == K3_DTYPE_F64;
    size_t bytes = (size_t)H * sizeof(double); /* H fits: x's storage holds H elements */
    void *row = k3_host_alloc(bytes);
    if (!row)
        return k3_error(K3_ENOMEM, "rms_norm: cpu.rms_norm.reference: out of memory (%zu bytes)",
                        bytes);
    for (int64_t i = 0; i < M; i++) {
        int64_t xr = i * x->stride[0], orow = i * o->stride[0];
        int e;
        if (dbl) {
            double *v = row;
            for (int64_t d = 0; d < H; d++) v[d] = k3_load_f64(xb, x->dtype, xr + d);
            double r = k3_rms_scale_f64(v, H, a->eps, &e);
            for (int64_t d = 0; d < H; d++)
                k3_store_f64(ob, o->dtype, orow + d,
                             (e ? ldexp(v[d], e) : v[d]) * r *
                                 k3_load_f64(wb, w->dtype, d * w->stride[0]));
        } else {
            float *v = row;
            for (int64_t d = 0; d < H; d++) v[d] = k3_load_f32(xb, x->dtype, xr + d);
            float r = k3_rms_scale_f32(v, H, (float)a->eps, &e);
            for (int64_t d = 0; d < H; d++)
                k3_store_f32(ob, o->dtype, orow + d,
                             (e ? ldexpf(v[d], e) : v[d]) * r *
                                 k3_load_f32(wb, w->dtype, d * w->stride[0]));
        }
    }
    k3_host_free(row, bytes);
    return K3_OK;
}

const k3_kernel k3_cpu_rms_norm_reference =
    K3_KERNEL_RECORD(k3_cpu_rms_norm_reference, supports, run_rms_norm);

/* y[i, j] = round(silu(x[i, j]) * x[i, j + I]), silu(a) = a / (1 + exp(-a)) (0 at -inf). */
static k3_status run_silu_mul(const k3_op_args *oa) {
    const k3_silu_mul_args *a = &oa->u.silu_mul;
    const k3_tensor *x = a->x;
    k3_tensor *o = a->out;
    int64_t M = x->size[0], I = x->size[1] / 2;
    const void *xb = k3_tensor_data(x);
    void *ob = k3_tensor_data(o);
    bool dbl = x->dtype == K3_DTYPE_F64;
    for (int64_t i = 0; i < M; i++) {
        int64_t xr = i * x->stride[0], orow = i * o->stride[0];
        for (int64_t j = 0; j < I; j++) {
            if (dbl) {
                double g = k3_load_f64(xb, x->dtype, xr + j);
                double u = k3_load_f64(xb, x->dtype, xr + I + j);
                k3_store_f64(ob, o->dtype, orow + j, k3_silu_f64(g) * u);
            } else {
                float g = k3_load_f32(xb, x->dtype, xr + j);
                float u = k3_load_f32(xb, x->dtype, xr + I + j);
                k3_store_f32(ob, o->dtype, orow + j, k3_silu_f32(g) * u);
            }
        }
    }
    return K3_OK;
}

const k3_kernel k3_cpu_silu_mul_reference =
    K3_KERNEL_RECORD(k3_cpu_silu_mul_reference, supports, run_silu_mul);
