/*
 * method.c — linear methods. The default method dispatches over its policy's linear
 * candidates. The low-latency method runs cuda.linear.skinny per its plan (by M) and OWNS a
 * default method built by k3_method_default, which serves every call it declines: the
 * fallback is always a fully constructed method, never a half-initialised base.
 */
#include "k3_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct plan_slot {
    bool present;
    char kernel[64];
    k3_skinny_config config;
} plan_slot;

struct k3_method {
    bool low_latency;
    k3_policy *policy;  /* owned copy; NULL: the built-in default */
    k3_method *fallback; /* low-latency only: owned, made by k3_method_default */
    plan_slot plan[K3_PLAN_MAX_M + 1]; /* by M */
};

static k3_status policy_copy(k3_policy **out, const k3_policy *src) {
    *out = NULL;
    if (!src) return K3_OK;
    K3_TRY(k3_policy_new(out));
    /* Rebuild from the public getters so the copy does not depend on the struct layout. */
    static const char *const ops[] = {"linear", "attn_res", "rms_norm", "silu_mul"};
    for (int o = 0; o < 4; o++) {
        const char *names[K3_MAX_CANDIDATES];
        int n = k3_policy_count(src, ops[o]);
        for (int i = 0; i < n; i++) names[i] = k3_policy_candidate(src, ops[o], i);
        k3_status s = k3_policy_set_candidates(*out, ops[o], names, n);
        if (s != K3_OK) {
            k3_policy_free(*out);
            *out = NULL;
            return s;
        }
    }
    k3_policy_set_layout_fallback(*out, k3_policy_layout_fallback(src));
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
                                ? "cuda.linear.skinny"
                                : e->kernel;
        k3_op kop = K3_OP_COUNT;
        char echo[K3_ECHO_SIZE];
        if (k3_known_lookup(kname, &kop, NULL) < 0 || kop != K3_OP_LINEAR)
            return k3_error(K3_EINVAL,
                            "method.low_latency: plan entry for M = %d names '%s', not a known "
                            "linear kernel",
                            e->m, k3_echo(echo, sizeof echo, e->kernel));
        if (e->threads < 0 || e->rows < 0 || e->unroll < 0 || e->vec < 0 || e->split_k < 0)
            return k3_error(K3_EINVAL,
                            "method.low_latency: plan entry for M = %d has a negative config "
                            "value",
                            e->m);
        slots[e->m].present = true;
        snprintf(slots[e->m].kernel, sizeof slots[e->m].kernel, "%s", kname);
        slots[e->m].config = (k3_skinny_config){e->threads, e->rows, e->unroll, e->vec,
                                                e->split_k};
    }
    k3_method *m = k3_host_calloc(1, sizeof *m);
    if (!m) return k3_error(K3_ENOMEM, "method.low_latency: out of memory");
    m->low_latency = true;
    memcpy(m->plan, slots, sizeof slots);
    k3_status s = policy_copy(&m->policy, policy);
    if (s == K3_OK) s = k3_method_default(&m->fallback, policy);
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

/* The low-latency runtime check, in DESIGN.md's order. Returns true when the fast path
 * applies (then *slot is the plan entry); otherwise writes the decline reason. */
static bool fast_path(const k3_method *m, const k3_tensor *x, const k3_tensor *w,
                      const k3_tensor *bias, int batch_invariant, const plan_slot **slot,
                      char *why, size_t n, int base) {
    char a[160], b[160];
    if (bias) return snprintf(why, n, "bias is present"), false;
    if (batch_invariant) return snprintf(why, n, "batch-invariant mode is on"), false;
    if (x->ndim != 2) return snprintf(why, n, "x is not 2-D (%d-D)", x->ndim), false;
    if (w->ndim != 2) return snprintf(why, n, "w is not 2-D (%d-D)", w->ndim), false;
    if (x->dtype != K3_DTYPE_BF16)
        return snprintf(why, n, "x is not bf16 (%s)", k3_dtype_name(x->dtype)), false;
    if (w->dtype != K3_DTYPE_BF16)
        return snprintf(why, n, "w is not bf16 (%s)", k3_dtype_name(w->dtype)), false;
    /* Packed means the strides themselves are {K, 1}: is_contiguous would accept any stride
     * on a size-1 dim, which the skinny kernel does not. */
    const k3_tensor *tt[2] = {x, w};
    const char *tn[2] = {"x", "w"};
    for (int i = 0; i < 2; i++) {
        const k3_tensor *t = tt[i];
        if (t->stride[0] != t->size[1] || t->stride[1] != 1) {
            int64_t want[2] = {t->size[1], 1};
            return snprintf(why, n, "%s is not packed row-major: strides %s, expected %s",
                            tn[i], k3_fmt_dims(a, sizeof a, 2, t->stride),
                            k3_fmt_dims(b, sizeof b, 2, want)),
                   false;
        }
    }
    k3_device dx = k3_tensor_device(x), dw = k3_tensor_device(w);
    if (dx.type != dw.type || (dx.type == K3_DEVICE_CUDA && dx.index != dw.index))
        return snprintf(why, n, "x and w are on different devices (%s, %s)",
                        k3_device_name(dx, a, sizeof a), k3_device_name(dw, b, sizeof b)),
               false;
    if (dx.type != K3_DEVICE_CUDA)
        return snprintf(why, n, "x is on %s, not a CUDA device", k3_device_name(dx, a, sizeof a)),
               false;
    if (x->size[1] != w->size[1])
        return snprintf(why, n, "K mismatch: x dim %d (%lld), w dim %d (%lld)", 1 + base,
                        (long long)x->size[1], 1 + base, (long long)w->size[1]),
               false;
    int64_t M = x->size[0];
    if (M < 1 || M > K3_PLAN_MAX_M || !m->plan[M].present)
        return snprintf(why, n, "plan has no entry for M = %lld", (long long)M), false;
    if (!k3_has_kernel(m->plan[M].kernel))
        return snprintf(why, n, "kernel %s is not registered", m->plan[M].kernel), false;
    *slot = &m->plan[M];
    return true;
}

/* When a call fails before dispatch wrote call->record (the owned default's validation
 * refused the arguments), the record still gets the method's decision so far: op "linear",
 * nothing chosen, the method's own declines. k3_method_apply_base clears op first, so an
 * empty op means dispatch never ran. */
static void record_undispatched(const k3_call *call, const k3_decline *d, int nd) {
    if (!call || !call->record || call->record->op[0]) return;
    k3_dispatch *r = call->record;
    snprintf(r->op, sizeof r->op, "linear");
    r->chosen[0] = '\0';
    r->ndeclined = nd < K3_MAX_DECLINES ? nd : K3_MAX_DECLINES;
    for (int i = 0; i < r->ndeclined; i++) r->declined[i] = d[i];
}

/* Applies m with `ext` (declines made before it) appended to its decision; base numbers the
 * dims in messages (k3_impl.h). */
static k3_status apply_ext(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                           const k3_tensor *w, const k3_tensor *bias, const k3_tensor *residual,
                           k3_tensor *out, const k3_call *call, const k3_dispatch_ext *ext,
                           int base) {
    /* The method's own policy copy supplies the candidates; without one, the caller's (or
     * the built-in). Batch-invariant mode is the caller's, at call time: it belongs to the
     * caller's policy (a lua_State's), not to the copy made when the method was built. */
    int bi = k3_policy_batch_invariant(call ? call->policy : NULL);
    k3_call c = call ? *call : (k3_call){0};
    k3_policy local;
    if (m->policy) {
        local = *m->policy;
        local.batch_invariant = bi;
        c.policy = &local;
    }
    if (!m->low_latency || c.kernel)
        return k3_linear_ext(y, x, w, bias, residual, out, &c, NULL, ext, base);

    /* NULL or freed tensors: the owned default's validation reports them. */
    if (!x || !w || k3_tensor_check(x, "x") != K3_OK || k3_tensor_check(w, "w") != K3_OK ||
        (bias && k3_tensor_check(bias, "bias") != K3_OK))
        return apply_ext(m->fallback, y, x, w, bias, residual, out, call, ext, base);

    const plan_slot *slot = NULL;
    k3_decline d;
    memset(&d, 0, sizeof d);
    if (fast_path(m, x, w, bias, bi, &slot, d.reason, sizeof d.reason, base)) {
        /* The skinny kernel is tried first; should its supports() decline, dispatch goes on
         * to the policy's linear candidates. */
        k3_dispatch_ext fast = {k3_kernel_find(slot->kernel), NULL, 0};
        return k3_linear_ext(y, x, w, bias, residual, out, &c, &slot->config, &fast, base);
    }
    int64_t M = x->ndim == 2 ? x->size[0] : 0;
    snprintf(d.kernel, sizeof d.kernel, "%s",
             M >= 1 && M <= K3_PLAN_MAX_M && m->plan[M].present ? m->plan[M].kernel
                                                                  : "cuda.linear.skinny");
    k3_dispatch_ext declined = {NULL, &d, 1};
    k3_status s = apply_ext(m->fallback, y, x, w, bias, residual, out, call, &declined, base);
    if (s != K3_OK) record_undispatched(call, &d, 1);
    return s;
}

k3_status k3_method_apply_base(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                               const k3_tensor *w, const k3_tensor *bias,
                               const k3_tensor *residual, k3_tensor *out, const k3_call *call,
                               int base) {
    if (!m) return k3_error(K3_EINVAL, "method_apply: m is NULL");
    if (call && call->record) {
        call->record->op[0] = '\0';
        call->record->chosen[0] = '\0';
        call->record->ndeclined = 0;
    }
    k3_status s = apply_ext(m, y, x, w, bias, residual, out, call, NULL, base);
    if (s != K3_OK) record_undispatched(call, NULL, 0);
    return s;
}

k3_status k3_method_apply(const k3_method *m, k3_tensor **y, const k3_tensor *x,
                          const k3_tensor *w, const k3_tensor *bias, const k3_tensor *residual,
                          k3_tensor *out, const k3_call *call) {
    return k3_method_apply_base(m, y, x, w, bias, residual, out, call, 0);
}
