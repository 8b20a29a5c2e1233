/*
 * method.c — linear methods. The default method dispatches over its policy's linear
 * candidates. The low-latency method looks the call's M up in its plan and OWNS a default
 * method built by k3_method_default, which serves every call, with the planned kernel
 * (cuda.linear.skinny) tried first: whatever that kernel's supports() declines goes to a fully
 * constructed method, never a half-initialised base. Whether the kernel takes a call is for
 * its supports() alone to say.
 */
#include "k3_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct plan_slot {
    bool present;
    int kernel; /* catalogue index */
    k3_skinny_config config;
} plan_slot;

struct k3_method {
    bool low_latency;
    k3_policy *policy;   /* the default method's own copy; NULL: the built-in default */
    k3_method *fallback; /* low-latency only: owned, made by k3_method_default */
    plan_slot plan[K3_PLAN_MAX_M + 1]; /* by M */
};

static k3_status policy_copy(k3_policy **out, const k3_policy *src) {
    *out = NULL;
    if (!src) return K3_OK;
    K3_TRY(k3_policy_new(out));
    **out = *src;
    return K3_OK;
}

k3_status k3_method_default(k3_method **out, const k3_policy *policy) {
    if (!out) return k3_error(K3_EINVAL, "method_default: out is NULL");
    *out = NULL;
    k3_method *m = k3_host_calloc(1, sizeof *m);
    if (!m) return k3_error(K3_ENOMEM, "method.default: out of memory");
    k3_status s = policy_copy(&m->policy, policy);
    if (s != K3_OK) {
        k3_host_free(m, sizeof *m);
        return s;
    }
    *out = m;
    return K3_OK;
}

k3_status k3_method_low_latency(k3_method **out, const k3_plan_entry *plan, int n,
                                const k3_policy *policy) {
    /* out, plan and n come only from C callers (the binding builds them), so these use the
     * C name; the entries' checks keep "method.low_latency", the name Lua users know. */
    if (!out) return k3_error(K3_EINVAL, "method_low_latency: out is NULL");
    *out = NULL;
    if (n < 0) return k3_error(K3_EINVAL, "method_low_latency: n must be >= 0; got %d", n);
    if (n > 0 && !plan)
        return k3_error(K3_EINVAL, "method_low_latency: plan is NULL but n is %d", n);
    plan_slot slots[K3_PLAN_MAX_M + 1];
    memset(slots, 0, sizeof slots);
    for (int i = 0; i < n; i++) {
        const k3_plan_entry *e = &plan[i];
        if (e->m < 1 || e->m > K3_PLAN_MAX_M)
            return k3_error(K3_EINVAL, "method.low_latency: plan M must be in 1..%d; got %d",
                            K3_PLAN_MAX_M, e->m);
        if (slots[e->m].present)
            return k3_error(K3_EINVAL, "method.low_latency: plan has two entries for M = %d",
                            e->m);
        const char *kname = !e->kernel || strcmp(e->kernel, "skinny") == 0
                                ? k3_cuda_linear_skinny_name
                                : e->kernel;
        k3_op kop = K3_OP_COUNT;
        char echo[K3_ECHO_SIZE];
        int kidx = k3_known_lookup(kname, &kop, NULL);
        if (kidx < 0 || kop != K3_OP_LINEAR)
            return k3_error(K3_EINVAL,
                            "method.low_latency: plan entry for M = %d names '%s', not a known "
                            "linear kernel",
                            e->m, k3_echo(echo, sizeof echo, e->kernel));
        if (e->threads < 0 || e->rows < 0 || e->unroll < 0 || e->vec < 0 || e->split_k < 0)
            return k3_error(K3_EINVAL,
                            "method.low_latency: plan entry for M = %d has a negative config "
                            "value",
                            e->m);
        if (e->rows_per_warp != 0 && e->rows_per_warp != 8 && e->rows_per_warp != 16 &&
            e->rows_per_warp != 32)
            return k3_error(K3_EINVAL,
                            "method.low_latency: plan entry for M = %d has rows_per_warp %d; "
                            "expected 8, 16 or 32",
                            e->m, e->rows_per_warp);
        if (e->balanced != 0 && e->balanced != 1)
            return k3_error(K3_EINVAL,
                            "method.low_latency: plan entry for M = %d has balanced %d; "
                            "expected 0 or 1",
                            e->m, e->balanced);
        if (e->l2_prefetch_mb < 0 || e->l2_prefetch_mb > K3_PLAN_MAX_L2_PREFETCH_MB)
            return k3_error(K3_EINVAL,
                            "method.low_latency: plan entry for M = %d has l2_prefetch_mb %d; "
                            "expected 0..%d",
                            e->m, e->l2_prefetch_mb, K3_PLAN_MAX_L2_PREFETCH_MB);
        slots[e->m].present = true;
        slots[e->m].kernel = kidx;
        slots[e->m].config = (k3_skinny_config){e->threads, e->rows, e->unroll, e->vec,
                                                e->split_k, e->static_weights ? 1 : 0,
                                                e->rows_per_warp, e->balanced,
                                                e->l2_prefetch_mb};
    }
    k3_method *m = k3_host_calloc(1, sizeof *m);
    if (!m) return k3_error(K3_ENOMEM, "method.low_latency: out of memory");
    m->low_latency = true;
    memcpy(m->plan, slots, sizeof slots);
    k3_status s = k3_method_default(&m->fallback, policy);
    if (s != K3_OK) {
        k3_method_free(m);
        return s;
    }
    *out = m;
    return K3_OK;
}

void k3_method_free(k3_method *m) {
    if (!m) return;
    k3_method_free(m->fallback);
    k3_policy_free(m->policy);
    k3_host_free(m, sizeof *m);
}

/* The default method's call: dispatch over its own policy copy's candidates, with ext (a
 * low-latency plan's kernel and declines) first. Batch-invariant mode is the caller's, at call
 * time: it belongs to the caller's policy (a lua_State's), not to the copy made when the
 * method was built. */
static k3_status apply_default(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                               const k3_tensor *w, const k3_tensor *bias,
                               const k3_tensor *residual, const k3_linear_prologue_args *prologue,
                               k3_linear_epilogue epilogue, k3_tensor *out, const k3_call *call,
                               const k3_skinny_config *config, const k3_dispatch_ext *ext) {
    k3_call c = call ? *call : (k3_call){0};
    k3_policy local;
    if (m->policy) {
        local = *m->policy;
        local.batch_invariant = k3_policy_batch_invariant(call ? call->policy : NULL);
        c.policy = &local;
    }
    return k3_linear_ext(y, x, w, bias, residual, prologue, epilogue, out, &c, config, ext);
}

k3_status k3_method_apply_fused(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                                const k3_tensor *w, const k3_tensor *bias,
                                const k3_tensor *residual, const k3_linear_prologue_args *prologue,
                                k3_linear_epilogue epilogue, k3_tensor *out, const k3_call *call) {
    if (!m) return k3_error(K3_EINVAL, "method_apply: m is NULL");
    if (!m->low_latency)
        return apply_default(m, y, x, w, bias, residual, prologue, epilogue, out, call, NULL,
                             NULL);
    if (call && call->kernel) /* forced: the plan has nothing to say */
        return apply_default(m->fallback, y, x, w, bias, residual, prologue, epilogue, out, call,
                             NULL, NULL);
    /* The plan lookup, for a live 2-D x (dispatch's prologue reports any other). */
    k3_dispatch_ext ext = {-1, NULL, 0};
    k3_decline d;
    const k3_skinny_config *config = NULL;
    if (x && k3_tensor_check(x, "x") == K3_OK && x->ndim == 2) {
        int64_t M = x->size[0];
        const plan_slot *slot = M >= 1 && M <= K3_PLAN_MAX_M ? &m->plan[M] : NULL;
        if (slot && slot->present) {
            ext.pre = slot->kernel;
            config = &slot->config;
        } else {
            memset(&d, 0, sizeof d);
            snprintf(d.kernel, sizeof d.kernel, "%s", k3_cuda_linear_skinny_name);
            snprintf(d.reason, sizeof d.reason, "plan has no entry for M = %lld", (long long)M);
            ext.declined = &d;
            ext.ndeclined = 1;
        }
    }
    return apply_default(m->fallback, y, x, w, bias, residual, prologue, epilogue, out, call,
                         config, &ext);
}

k3_status k3_method_apply_with_prologue(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                                        const k3_tensor *w, const k3_tensor *bias,
                                        const k3_tensor *residual,
                                        const k3_linear_prologue_args *prologue, k3_tensor *out,
                                        const k3_call *call) {
    return k3_method_apply_fused(m, y, x, w, bias, residual, prologue, K3_LINEAR_EPILOGUE_NONE,
                                 out, call);
}

k3_status k3_method_apply(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                          const k3_tensor *w, const k3_tensor *bias, const k3_tensor *residual,
                          k3_tensor *out, const k3_call *call) {
    return k3_method_apply_with_prologue(m, y, x, w, bias, residual, NULL, out, call);
}
