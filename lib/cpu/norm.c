/*
 * cpu/norm.c — cpu.rms_norm.reference and cpu.silu_mul.reference: row-wise kernels for any
 * row strides with unit last stride, bf16/f16/f32/f64. fp32 arithmetic, fp64 for f64.
 */
#include "k3_impl.h"

#include <math.h>

/* Dispatch's prologue validated the call and checked it runs on the CPU: every such call is
 * taken. */
static k3_status supports(const k3_op_args *a, char *reason, size_t n) { return K3_OK; }

/* y = round(x * rsqrt(mean(x^2) + eps) * w); the same expression order as the AttnRes
 * output norm, so attn_res with num_blocks = 0 equals rms_norm bit for bit. */
static k3_status run_rms_norm(const k3_op_args *oa) {
    const k3_rms_norm_args *a = &oa->u.rms_norm;
    const k3_tensor *x = a->x, *w = a->w;
    k3_tensor *o = a->out;
    int64_t M = x->size[0], H = x->size[1];
    const void *xb = k3_tensor_data(x), *wb = k3_tensor_data(w);
    void *ob = k3_tensor_data(o);
    bool dbl = x->dtype == K3_DTYPE_F64;
    for (int64_t i = 0; i < M; i++) {
        int64_t xr = i * x->stride[0], orow = i * o->stride[0];
        if (dbl) {
            double ss = 0;
            for (int64_t d = 0; d < H; d++) {
                double v = k3_load_f64(xb, x->dtype, xr + d);
                ss += v * v;
            }
            double r = 1.0 / sqrt(ss / (double)H + a->eps);
            for (int64_t d = 0; d < H; d++)
                k3_store_f64(ob, o->dtype, orow + d,
                             k3_load_f64(xb, x->dtype, xr + d) * r *
                                 k3_load_f64(wb, w->dtype, d * w->stride[0]));
        } else {
            float ss = 0;
            for (int64_t d = 0; d < H; d++) {
                float v = k3_load_f32(xb, x->dtype, xr + d);
                ss += v * v;
            }
            float r = 1.0f / sqrtf(ss / (float)H + (float)a->eps);
            for (int64_t d = 0; d < H; d++)
                k3_store_f32(ob, o->dtype, orow + d,
                             k3_load_f32(xb, x->dtype, xr + d) * r *
                                 k3_load_f32(wb, w->dtype, d * w->stride[0]));
        }
    }
    return K3_OK;
}

const k3_kernel k3_cpu_rms_norm_reference =
    K3_KERNEL_RECORD(k3_cpu_rms_norm_reference, supports, run_rms_norm);

/* y[i, j] = round(silu(x[i, j]) * x[i, j + I]), silu(a) = a / (1 + exp(-a)). */
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
                k3_store_f64(ob, o->dtype, orow + j, g / (1.0 + exp(-g)) * u);
            } else {
                float g = k3_load_f32(xb, x->dtype, xr + j);
                float u = k3_load_f32(xb, x->dtype, xr + I + j);
                k3_store_f32(ob, o->dtype, orow + j, g / (1.0f + expf(-g)) * u);
            }
        }
    }
    return K3_OK;
}

const k3_kernel k3_cpu_silu_mul_reference =
    K3_KERNEL_RECORD(k3_cpu_silu_mul_reference, supports, run_silu_mul);
