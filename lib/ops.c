/*
 * ops.c — the public ops (linear, attn_res, rms_norm, silu_mul, abs, exp, sqrt, sum, mean, max,
 * min): each puts its arguments into the op's argument block and hands it to dispatch
 * (lib/dispatch.c), which validates the call (lib/validate.c), chooses the kernel and runs it.
 */
#include "k3_impl.h"

#include <string.h>

k3_status k3_linear_ext(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                        const k3_tensor *bias, const k3_tensor *residual,
                        const k3_linear_prologue_args *prologue, k3_linear_epilogue epilogue,
                        k3_tensor *out, const k3_call *call, const k3_skinny_config *config,
                        const k3_dispatch_ext *ext) {
    k3_op_args a;
    memset(&a, 0, sizeof a);
    a.op = K3_OP_LINEAR;
    a.u.linear = (k3_linear_args){x, w, bias, residual, out, config, false, k3_message_base(),
                                  prologue ? prologue->kind : K3_LINEAR_PROLOGUE_NONE,
                                  prologue ? prologue->norm_weight : NULL,
                                  prologue ? prologue->eps : 0.0, epilogue};
    return k3_dispatch_call(&a, y, call, ext);
}

k3_status k3_linear(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                    const k3_tensor *bias, const k3_tensor *residual, k3_tensor *out,
                    const k3_call *call) {
    return k3_linear_ext(y, x, w, bias, residual, NULL, K3_LINEAR_EPILOGUE_NONE, out, call,
                         NULL, NULL);
}

k3_status k3_linear_with_prologue(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                                  const k3_tensor *bias, const k3_tensor *residual,
                                  const k3_linear_prologue_args *prologue, k3_tensor *out,
                                  const k3_call *call) {
    return k3_linear_ext(y, x, w, bias, residual, prologue, K3_LINEAR_EPILOGUE_NONE, out, call,
                         NULL, NULL);
}

k3_status k3_linear_fused(k3_tensor **y, const k3_tensor *x, const k3_tensor *w,
                          const k3_tensor *bias, const k3_tensor *residual,
                          const k3_linear_prologue_args *prologue, k3_linear_epilogue epilogue,
                          k3_tensor *out, const k3_call *call) {
    return k3_linear_ext(y, x, w, bias, residual, prologue, epilogue, out, call, NULL, NULL);
}

k3_status k3_attn_res(k3_tensor **y, const k3_attn_res_args *p, k3_tensor *out,
                      const k3_call *call) {
    if (!p) return k3_error(K3_EINVAL, "attn_res: args is NULL");
    k3_op_args a;
    memset(&a, 0, sizeof a);
    a.op = K3_OP_ATTN_RES;
    a.u.attn_res = (k3_attn_res_kargs){*p, out, k3_message_base()};
    return k3_dispatch_call(&a, y, call, NULL);
}

k3_status k3_rms_norm(k3_tensor **y, const k3_tensor *x, const k3_tensor *w, double eps,
                      k3_tensor *out, const k3_call *call) {
    k3_op_args a;
    memset(&a, 0, sizeof a);
    a.op = K3_OP_RMS_NORM;
    a.u.rms_norm = (k3_rms_norm_args){x, w, eps, out, k3_message_base()};
    return k3_dispatch_call(&a, y, call, NULL);
}

k3_status k3_silu_mul(k3_tensor **y, const k3_tensor *x, k3_tensor *out, const k3_call *call) {
    k3_op_args a;
    memset(&a, 0, sizeof a);
    a.op = K3_OP_SILU_MUL;
    a.u.silu_mul = (k3_silu_mul_args){x, out, k3_message_base()};
    return k3_dispatch_call(&a, y, call, NULL);
}

/* abs, exp, sqrt: one argument block, the op tag says which. */
static k3_status unary(k3_op op, k3_tensor **y, const k3_tensor *x, k3_tensor *out,
                       const k3_call *call) {
    k3_op_args a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.u.abs = (k3_unary_args){x, out, k3_message_base()};
    return k3_dispatch_call(&a, y, call, NULL);
}

k3_status k3_abs(k3_tensor **y, const k3_tensor *x, k3_tensor *out, const k3_call *call) {
    return unary(K3_OP_ABS, y, x, out, call);
}
k3_status k3_exp(k3_tensor **y, const k3_tensor *x, k3_tensor *out, const k3_call *call) {
    return unary(K3_OP_EXP, y, x, out, call);
}
k3_status k3_sqrt(k3_tensor **y, const k3_tensor *x, k3_tensor *out, const k3_call *call) {
    return unary(K3_OP_SQRT, y, x, out, call);
}

/* sum, mean, max, min. With indices, the indices tensor is made here once the inputs have
 * passed (so its shape is known; when they fail, dispatch refuses the call and records it) and
 * handed back only when the call succeeds. */
static k3_status reduce(k3_op op, k3_tensor **y, k3_tensor **indices, const k3_tensor *x,
                        int dim, int index_base, k3_tensor *out, const k3_call *call) {
    k3_op_args a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.u.sum = (k3_reduce_args){x, dim, out, NULL, index_base, k3_message_base()};
    k3_tensor *idx = NULL;
    if (indices && !(call && call->explain_only)) {
        k3_op_result r;
        if (k3_op_check_inputs(&a, &r) == K3_OK) {
            K3_TRY(k3_tensor_new(&idx, r.ndim, r.shape, K3_DTYPE_F64, r.device, k3_op_name(op)));
            a.u.sum.indices = idx;
        }
    }
    k3_status s = k3_dispatch_call(&a, y, call, NULL);
    if (s != K3_OK) {
        k3_tensor_free(idx);
        return s;
    }
    if (indices) *indices = idx;
    return K3_OK;
}

k3_status k3_sum(k3_tensor **y, const k3_tensor *x, int dim, k3_tensor *out, const k3_call *call) {
    return reduce(K3_OP_SUM, y, NULL, x, dim, 0, out, call);
}
k3_status k3_mean(k3_tensor **y, const k3_tensor *x, int dim, k3_tensor *out, const k3_call *call) {
    return reduce(K3_OP_MEAN, y, NULL, x, dim, 0, out, call);
}
k3_status k3_max(k3_tensor **y, k3_tensor **indices, const k3_tensor *x, int dim, int index_base,
                 k3_tensor *out, const k3_call *call) {
    return reduce(K3_OP_MAX, y, indices, x, dim, index_base, out, call);
}
k3_status k3_min(k3_tensor **y, k3_tensor **indices, const k3_tensor *x, int dim, int index_base,
                 k3_tensor *out, const k3_call *call) {
    return reduce(K3_OP_MIN, y, indices, x, dim, index_base, out, call);
}
