/*
 * cpu/elementwise.c — cpu.{abs,exp,sqrt}.reference: y = f(x) elementwise over any strides
 * (zero strides included) and dtype, in fp32 (fp64 for f64), rounded once; the same functions
 * as kernels/tensor_ops.cu (abs and sqrt are exact roundings, so both give the same bits).
 */
#include "k3_impl.h"

#include <math.h>

static k3_status supports(const k3_op_args *a, char *reason, size_t n) { return K3_OK; }

typedef struct unary_ctx {
    k3_op op;
    const void *x;
    void *y;
    k3_dtype dt;
    int64_t xs, ys; /* last-dim strides */
} unary_ctx;

static inline double f64_of(k3_op op, double v) {
    return op == K3_OP_ABS ? fabs(v) : op == K3_OP_EXP ? exp(v) : sqrt(v);
}
static inline float f32_of(k3_op op, float v) {
    return op == K3_OP_ABS ? fabsf(v) : op == K3_OP_EXP ? expf(v) : sqrtf(v);
}

static void unary_row(void *c_, const int64_t *off, int64_t n) {
    const unary_ctx *c = c_;
    for (int64_t i = 0; i < n; i++) {
        int64_t io = off[0] + i * c->ys, ix = off[1] + i * c->xs;
        if (c->dt == K3_DTYPE_F64)
            k3_store_f64(c->y, c->dt, io, f64_of(c->op, k3_load_f64(c->x, c->dt, ix)));
        else
            k3_store_f32(c->y, c->dt, io, f32_of(c->op, k3_load_f32(c->x, c->dt, ix)));
    }
}

static k3_status run_unary(const k3_op_args *oa) {
    const k3_unary_args *a = &oa->u.abs;
    const k3_tensor *x = a->x;
    k3_tensor *y = a->out;
    int last = x->ndim - 1;
    unary_ctx c = {oa->op, x->storage->data, y->storage->data, x->dtype,
                   last >= 0 ? x->stride[last] : 1, last >= 0 ? y->stride[last] : 1};
    const int64_t *strides[2] = {y->stride, x->stride};
    int64_t base[2] = {y->offset, x->offset};
    k3_walk_rows(x->ndim, x->size, 2, strides, base, unary_row, &c);
    return K3_OK;
}

const k3_kernel k3_cpu_abs_reference = K3_KERNEL_RECORD(k3_cpu_abs_reference, supports, run_unary);
const k3_kernel k3_cpu_exp_reference = K3_KERNEL_RECORD(k3_cpu_exp_reference, supports, run_unary);
const k3_kernel k3_cpu_sqrt_reference = K3_KERNEL_RECORD(k3_cpu_sqrt_reference, supports, run_unary);
