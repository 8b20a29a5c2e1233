/*
 * ops.c — the ops (k3.linear, k3.rms_norm, k3.silu_mul, k3.attn_res, and the tensor ops
 * k3.abs, k3.exp, k3.sqrt, k3.sum, k3.mean, k3.max, k3.min, also as tensor methods), k3.explain
 * and k3.trace, the state's dispatch data (its compiled policy, its counters: k3.stats), what
 * is registered and available (k3.kernels, k3.backends, ...), and the device: k3.synchronize,
 * k3.empty_cache, k3.cuda_time.
 */
#include "k3_lua.h"

#include <string.h>

/* ---- the state's dispatch data: its policy and its counters --------------------------------- */

/* The compiled policy of this Lua state: made when the module is opened (the built-in default
 * candidates, and the process default of batch-invariant mode), replaced by k3.set_policy,
 * its batch-invariant mode set by k3.set_batch_invariant. It lives in Lua's memory
 * (k3_policy_init): opening k3 makes no host allocation, so a host may still call
 * k3_set_allocator before its first tensor. */
k3_policy *k3l_new_policy(lua_State *L) {
    k3_policy *p = lua_newuserdatauv(L, k3_policy_size(), 0);
    k3_policy_init(p);
    luaL_setmetatable(L, K3L_POLICY_MT);
    return p;
}

void k3l_set_state_policy(lua_State *L) { lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY); }

k3_policy *k3l_state_policy(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY);
    k3_policy *p = luaL_testudata(L, -1, K3L_POLICY_MT);
    lua_pop(L, 1);
    return p;
}

/* This state's counters (k3.stats): every dispatch an op or method of the state ran is counted
 * here as well as in the process-wide totals (k3_stats). */
static k3_stats_sink *state_stats(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_STATS);
    k3_stats_sink *s = luaL_testudata(L, -1, K3L_STATS_MT);
    lua_pop(L, 1);
    return s;
}

static void push_dispatch(lua_State *L, const k3_dispatch *d) {
    lua_createtable(L, 0, 4);
    lua_pushstring(L, d->op);
    lua_setfield(L, -2, "op");
    if (d->chosen[0]) {
        lua_pushstring(L, d->chosen);
        lua_setfield(L, -2, "chosen");
        lua_pushstring(L, d->chosen);
        lua_setfield(L, -2, "kernel");
    }
    lua_createtable(L, d->ndeclined, 0);
    for (int i = 0; i < d->ndeclined && i < K3_MAX_DECLINES; i++) {
        lua_createtable(L, 0, 2);
        lua_pushstring(L, d->declined[i].kernel);
        lua_setfield(L, -2, "kernel");
        lua_pushstring(L, d->declined[i].reason);
        lua_setfield(L, -2, "reason");
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "declined");
    if (d->captured) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "captured");
    }
}

static void call_init(lua_State *L, k3l_call *c, const char *kernel, int explain) {
    memset(c, 0, sizeof *c);
    c->call.policy = k3l_state_policy(L);
    c->call.kernel = kernel;
    c->call.explain_only = explain;
    c->call.record = &c->rec;
}

/* After a successful op: append the decision to the active k3.trace, if any. */
static void trace_record(lua_State *L, const k3l_call *c) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_TRACE) == LUA_TTABLE) {
        push_dispatch(L, &c->rec);
        lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
    }
    lua_pop(L, 1);
}

/* push_dispatch for the binding's other files (k3.dist's collectives). */
void k3l_push_dispatch(lua_State *L, const k3_dispatch *d) { push_dispatch(L, d); }

/* Reads opts.kernel (a string) from the table at idx, or NULL. The string stays valid while
 * the table is on the stack. */
static const char *opt_kernel(lua_State *L, int idx, int argn) {
    if (idx == 0 || !lua_istable(L, idx)) return NULL;
    luaL_checkstack(L, 2, "k3: too many arguments");
    int ty = lua_getfield(L, idx, "kernel");
    if (ty == LUA_TSTRING) /* left on the stack: stays alive */
        return k3l_check_cstring(L, -1, argn, "field 'kernel'");
    if (ty != LUA_TNIL)
        k3l_arg_error(L, argn, "field 'kernel' must be a string; got %s", luaL_typename(L, -1));
    lua_pop(L, 1);
    return NULL;
}

/* Statuses by which an op refuses its arguments (validation), as opposed to a failure of the
 * machine (memory, CUDA, an internal error). */
static int refuses_args(k3_status s) {
    return s == K3_EINVAL || s == K3_ESHAPE || s == K3_ELAYOUT || s == K3_EDTYPE ||
           s == K3_EDEVICE || s == K3_EOVERFLOW;
}

int k3l_op_finish(lua_State *L, k3_status s, k3l_call *c, int explain) {
    /* explain answers for the dispatch itself: when no candidate accepts, or a fast kernel's
     * layout error would be raised (policy "error"), the record is the decision: no chosen
     * kernel, every decline, and the error the call would raise. k3.explain still raises on
     * invalid arguments (nothing was dispatched); a method's explain answers for them too,
     * since the method decided something first (k3_method_apply writes its declines to the
     * record before the owned default refuses). */
    if (explain && c->rec.op[0] && !c->rec.chosen[0] &&
        (s == K3_ENOKERNEL || (s == K3_ELAYOUT && c->rec.ndeclined > 0) ||
         (explain == K3L_EXPLAIN_METHOD && refuses_args(s)))) {
        push_dispatch(L, &c->rec);
        lua_pushstring(L, k3_last_error());
        lua_setfield(L, -2, "error");
        return 1;
    }
    if (s != K3_OK) return k3l_raise(L);
    if (explain) {
        push_dispatch(L, &c->rec);
        return 1;
    }
    k3_stats_sink_count(state_stats(L), &c->rec);
    trace_record(L, c);
    return 1;
}

/* The stack index of opts.out (left on the stack), or 0. */
static int opt_out(lua_State *L, int opts, int argn) {
    if (!opts || !lua_istable(L, opts)) return 0;
    /* a tensor leaves the value on the stack: its index is returned */
    return k3l_tensor_field(L, opts, "out", 0, argn) ? lua_gettop(L) : 0;
}

void k3l_op_prepare(lua_State *L, int opts, int argn, int explain, k3l_call *c, k3_tensor **out,
                    k3_tensor ***y) {
    int out_idx = opt_out(L, opts, argn);
    *out = out_idx ? k3l_check_tensor(L, out_idx) : NULL;
    call_init(L, c, opt_kernel(L, opts, argn), explain);
    *y = NULL;
    if (explain) return;
    if (out_idx) lua_pushvalue(L, out_idx);
    else *y = &k3l_push_tensor(L)->t;
}

/* The options table at idx (checked against keys), or 0 when it is absent. */
static int opt_table(lua_State *L, int idx, const char *const *keys) {
    k3l_check_last_arg(L, idx);
    if (lua_isnoneornil(L, idx)) return 0;
    luaL_checktype(L, idx, LUA_TTABLE);
    k3l_check_option_keys(L, idx, keys, idx);
    return idx;
}

/* ---- the ops --------------------------------------------------------------------------------- */

k3_linear_prologue_args k3l_prologue_field(lua_State *L, int idx, int argn) {
    k3_linear_prologue_args p = {K3_LINEAR_PROLOGUE_NONE, NULL, 1e-5};
    if (!idx) return p;
    int ty = lua_getfield(L, idx, "prologue");
    const char *name = ty == LUA_TSTRING ? k3l_check_cstring(L, -1, argn, "field 'prologue'") : NULL;
    if (name && strcmp(name, "silu_mul") == 0)
        p.kind = K3_LINEAR_PROLOGUE_SILU_MUL;
    else if (name && strcmp(name, "rms_norm") == 0)
        p.kind = K3_LINEAR_PROLOGUE_RMS_NORM;
    else if (name)
        k3l_arg_error(L, argn,
                      "field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got \"%s\"",
                      k3l_push_echo(L, name));
    else if (ty != LUA_TNIL)
        k3l_arg_error(L, argn, "field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got %s",
                      luaL_typename(L, -1));
    lua_pop(L, 1);
    p.norm_weight = k3l_tensor_field(L, idx, "norm_weight", 0, argn);
    if (p.kind != K3_LINEAR_PROLOGUE_RMS_NORM) {
        if (lua_getfield(L, idx, "eps") != LUA_TNIL)
            k3l_arg_error(L, argn, "field 'eps' is for prologue \"rms_norm\" only");
        lua_pop(L, 1);
    }
    p.eps = k3l_number_field(L, idx, "eps", 1e-5, argn);
    return p;
}

k3_linear_epilogue k3l_epilogue_field(lua_State *L, int idx, int argn) {
    if (!idx) return K3_LINEAR_EPILOGUE_NONE;
    k3_linear_epilogue e = K3_LINEAR_EPILOGUE_NONE;
    int ty = lua_getfield(L, idx, "epilogue");
    const char *name = ty == LUA_TSTRING ? k3l_check_cstring(L, -1, argn, "field 'epilogue'") : NULL;
    if (name && strcmp(name, "silu_mul") == 0)
        e = K3_LINEAR_EPILOGUE_SILU_MUL;
    else if (name)
        k3l_arg_error(L, argn, "field 'epilogue' must be \"silu_mul\" or nil; got \"%s\"",
                      k3l_push_echo(L, name));
    else if (ty != LUA_TNIL)
        k3l_arg_error(L, argn, "field 'epilogue' must be \"silu_mul\" or nil; got %s",
                      luaL_typename(L, -1));
    lua_pop(L, 1);
    return e;
}

/* k3.linear(x, w, {bias =, residual =, prologue =, norm_weight =, eps =, epilogue =, out =,
 * kernel =})
 * -> y[M,N] = x[M,K] w[N,K]^T (+bias) (+residual); prologue = "silu_mul": x is [M, 2K] and the
 * product takes silu(x[:, 1..K]) * x[:, K+1..2K] rounded to x's dtype, the bits of k3.silu_mul;
 * "rms_norm": the product takes k3.rms_norm(x, norm_weight, eps) (k3.h,
 * k3_linear_with_prologue); epilogue = "silu_mul": w is [2N, K] (gate rows, then up rows) and
 * the result is k3.silu_mul(y) [M, N] of the product y rounded to x's dtype (k3_linear_fused).
 * base: the stack index of x (2 under k3.explain). */
static int linear_impl(lua_State *L, int base, int explain) {
    static const char *const keys[] = {"bias", "residual", "prologue", "norm_weight", "eps",
                                       "epilogue", "out", "kernel", NULL};
    k3_tensor *x = k3l_check_tensor(L, base), *w = k3l_check_tensor(L, base + 1);
    int opts = opt_table(L, base + 2, keys);
    k3_tensor *bias = opts ? k3l_tensor_field(L, opts, "bias", 0, opts) : NULL;
    k3_tensor *res = opts ? k3l_tensor_field(L, opts, "residual", 0, opts) : NULL;
    k3_linear_prologue_args pro = k3l_prologue_field(L, opts, opts);
    k3_linear_epilogue epi = k3l_epilogue_field(L, opts, opts);
    k3l_call c;
    k3_tensor *out, **y;
    k3l_op_prepare(L, opts, opts, explain, &c, &out, &y);
    k3_status s;
    K3L_RUN(s, k3_linear_fused(y, x, w, bias, res, &pro, epi, out, &c.call));
    return k3l_op_finish(L, s, &c, explain);
}

/* k3.rms_norm(x, w, eps) or k3.rms_norm(x, w, {eps =, out =, kernel =}) or
 * k3.rms_norm(x, w, eps, {out =, kernel =}); eps nil: the default 1e-5 (then the options may
 * name eps). */
static int rms_norm_impl(lua_State *L, int base, int explain) {
    static const char *const keys[] = {"eps", "out", "kernel", NULL};
    k3_tensor *x = k3l_check_tensor(L, base), *w = k3l_check_tensor(L, base + 1);
    double eps = 1e-5;
    int opts = 0;
    if (lua_type(L, base + 2) == LUA_TNUMBER) {
        eps = lua_tonumber(L, base + 2);
        opts = opt_table(L, base + 3, keys + 1);
    } else if (lua_isnil(L, base + 2)) {
        opts = opt_table(L, base + 3, keys);
        if (opts) eps = k3l_number_field(L, opts, "eps", eps, opts);
    } else if (!lua_isnone(L, base + 2)) {
        if (!lua_istable(L, base + 2))
            return k3l_arg_error(L, base + 2, "eps (a number) or an options table expected; got %s",
                                 luaL_typename(L, base + 2));
        opts = opt_table(L, base + 2, keys);
        eps = k3l_number_field(L, opts, "eps", eps, opts);
    }
    k3l_call c;
    k3_tensor *out, **y;
    k3l_op_prepare(L, opts, opts, explain, &c, &out, &y);
    k3_status s;
    K3L_RUN(s, k3_rms_norm(y, x, w, eps, out, &c.call));
    return k3l_op_finish(L, s, &c, explain);
}

/* An op of one tensor and options {out =, kernel =}: k3.silu_mul, k3.abs, k3.exp, k3.sqrt. */
static int unary_impl(lua_State *L, int base, int explain,
                      k3_status (*fn)(k3_tensor **, const k3_tensor *, k3_tensor *,
                                      const k3_call *)) {
    static const char *const keys[] = {"out", "kernel", NULL};
    k3_tensor *x = k3l_check_tensor(L, base);
    int opts = opt_table(L, base + 1, keys);
    k3l_call c;
    k3_tensor *out, **y;
    k3l_op_prepare(L, opts, opts, explain, &c, &out, &y);
    k3_status s;
    K3L_RUN(s, fn(y, x, out, &c.call));
    return k3l_op_finish(L, s, &c, explain);
}

/* k3.silu_mul(x, {out =, kernel =}) -> y[M,I] = silu(x[:, 1..I]) * x[:, I+1..2I]. */
static int silu_mul_impl(lua_State *L, int base, int explain) {
    return unary_impl(L, base, explain, k3_silu_mul);
}

/* k3.attn_res{prefix =, delta =, blocks =, num_blocks =, write_block =, norm_weight =,
 * qk_weight =, output_norm_weight =, eps = 1e-5, output_eps = 1e-5, static_weights = false,
 * static_blocks = 0, out =, kernel =} -> out. write_block is 1-based (nil: no write).
 * static_weights / static_blocks: what may be loaded before the PDL wait (k3.h). DESIGN.md
 * "attn_res" gives the formula. */
static int attn_res_impl(lua_State *L, int base, int explain) {
    static const char *const keys[] = {"prefix", "delta", "blocks", "num_blocks", "write_block",
                                       "norm_weight", "qk_weight", "output_norm_weight", "eps",
                                       "output_eps", "static_weights", "static_blocks", "out",
                                       "kernel", NULL};
    luaL_checktype(L, base, LUA_TTABLE);
    k3l_check_last_arg(L, base);
    k3l_check_option_keys(L, base, keys, base);
    k3_attn_res_args a;
    memset(&a, 0, sizeof a);
    a.prefix = k3l_tensor_field(L, base, "prefix", 1, base);
    a.delta = k3l_tensor_field(L, base, "delta", 0, base);
    a.blocks = k3l_tensor_field(L, base, "blocks", 1, base);
    a.norm_weight = k3l_tensor_field(L, base, "norm_weight", 1, base);
    a.qk_weight = k3l_tensor_field(L, base, "qk_weight", 1, base);
    a.output_norm_weight = k3l_tensor_field(L, base, "output_norm_weight", 0, base);
    a.num_blocks = k3l_int_field(L, base, "num_blocks", 0, 1, base);
    int64_t wb = k3l_int_field(L, base, "write_block", 0, 0, base);
    a.write_block = (int64_t)((uint64_t)wb - 1); /* nil (0) -> -1: no write; 1-based -> 0-based */
    /* 0 would read as "no write" once 0-based: it is refused here, in the core's words. */
    if (lua_getfield(L, base, "write_block") != LUA_TNIL && wb < 1) {
        int64_t S = k3_tensor_ndim(a.blocks) == 3 ? k3_tensor_size(a.blocks, 1) : 0;
        luaL_error(L, "attn_res: write_block must be in 1..%I (blocks dim 2); got %I",
                   (LUA_INTEGER)S, (LUA_INTEGER)wb);
    }
    lua_pop(L, 1);
    a.eps = k3l_number_field(L, base, "eps", 1e-5, base);
    a.output_eps = k3l_number_field(L, base, "output_eps", 1e-5, base);
    a.static_blocks = k3l_int_field(L, base, "static_blocks", 0, 0, base);
    a.static_weights = k3l_bool_field(L, base, "static_weights", 0, base);
    k3l_call c;
    k3_tensor *out, **y;
    k3l_op_prepare(L, base, base, explain, &c, &out, &y);
    k3_status s;
    K3L_RUN(s, k3_attn_res(y, &a, out, &c.call));
    return k3l_op_finish(L, s, &c, explain);
}

/* k3.abs / exp / sqrt(x, {out =, kernel =}) -> y elementwise, also t:abs() ... */
static int abs_impl(lua_State *L, int base, int explain) {
    return unary_impl(L, base, explain, k3_abs);
}
static int exp_impl(lua_State *L, int base, int explain) {
    return unary_impl(L, base, explain, k3_exp);
}
static int sqrt_impl(lua_State *L, int base, int explain) {
    return unary_impl(L, base, explain, k3_sqrt);
}

/* k3.sum / mean / max / min(x, [d], {out =, kernel =}), also t:sum([d]) ...: without d a Lua
 * number (the 0-dim result read back, which waits for the device); with d (1-based) a tensor
 * of x's shape with dim d of size 1, and for max / min a second tensor, the 1-based f64
 * positions along d. */
enum reduction { REDUCE_SUM, REDUCE_MEAN, REDUCE_MAX, REDUCE_MIN };
static int reduce_impl(lua_State *L, int base, int explain, enum reduction op) {
    static const char *const keys[] = {"out", "kernel", NULL};
    k3_tensor *x = k3l_check_tensor(L, base);
    int dim = -1, opts_at = base + 1;
    if (lua_type(L, base + 1) == LUA_TNUMBER) {
        int isint;
        lua_Integer d = lua_tointegerx(L, base + 1, &isint);
        int nd = k3_tensor_ndim(x);
        if (!isint) return k3l_arg_error(L, base + 1, "dim must be an integer; got %f",
                                         (double)lua_tonumber(L, base + 1));
        if (d < 1 || d > nd)
            return k3l_arg_error(L, base + 1,
                                 "dim %I is out of range for a %d-dim tensor (expected 1..%d)",
                                 (LUA_INTEGER)d, nd, nd);
        dim = (int)(d - 1);
        opts_at = base + 2;
    } else if (!lua_isnoneornil(L, base + 1) && !lua_istable(L, base + 1)) {
        return k3l_arg_error(L, base + 1, "dim (an integer) or an options table expected; got %s",
                             luaL_typename(L, base + 1));
    } else if (lua_isnil(L, base + 1)) {
        opts_at = base + 2;
    }
    int opts = opt_table(L, opts_at, keys);
    int with_idx = !explain && dim >= 0 && (op == REDUCE_MAX || op == REDUCE_MIN);
    int idx_at = 0;
    k3_tensor **indices = NULL;
    if (with_idx) {
        indices = &k3l_push_tensor(L)->t; /* closed until the core fills it */
        idx_at = lua_gettop(L);
    }
    k3l_call c;
    k3_tensor *out, **y;
    k3l_op_prepare(L, opts, opts, explain, &c, &out, &y);
    k3_status s;
    switch (op) {
    case REDUCE_SUM: K3L_RUN(s, k3_sum(y, x, dim, out, &c.call)); break;
    case REDUCE_MEAN: K3L_RUN(s, k3_mean(y, x, dim, out, &c.call)); break;
    case REDUCE_MAX: K3L_RUN(s, k3_max(y, indices, x, dim, 1, out, &c.call)); break;
    default: K3L_RUN(s, k3_min(y, indices, x, dim, 1, out, &c.call)); break;
    }
    int n = k3l_op_finish(L, s, &c, explain);
    if (explain) return n;
    if (dim < 0) {
        double v;
        CHECK_K3(L, k3_tensor_get(k3l_check_tensor(L, -1), NULL, &v));
        lua_pushnumber(L, v);
        return 1;
    }
    if (!with_idx) return 1;
    lua_pushvalue(L, idx_at);
    return 2;
}
static int sum_impl(lua_State *L, int base, int explain) {
    return reduce_impl(L, base, explain, REDUCE_SUM);
}
static int mean_impl(lua_State *L, int base, int explain) {
    return reduce_impl(L, base, explain, REDUCE_MEAN);
}
static int max_impl(lua_State *L, int base, int explain) {
    return reduce_impl(L, base, explain, REDUCE_MAX);
}
static int min_impl(lua_State *L, int base, int explain) {
    return reduce_impl(L, base, explain, REDUCE_MIN);
}

/* The ops of the catalogue (lib/k3_ops.def): each line's name##_impl(L, base, explain) reads the
 * op's arguments from stack index base; l_<name> is k3.<name>. */
typedef int (*op_impl)(lua_State *L, int base, int explain);
#define K3_OP(ID, name, signature, summary)                                                \
    static int l_##name(lua_State *L) { return name##_impl(L, 1, 0); }
#include "k3_ops.def"
#undef K3_OP
static const char *const g_op_names[] = {
#define K3_OP(ID, name, signature, summary) #name,
#include "k3_ops.def"
#undef K3_OP
    NULL};
static const op_impl g_op_impls[] = {
#define K3_OP(ID, name, signature, summary) name##_impl,
#include "k3_ops.def"
#undef K3_OP
};

/* k3.explain(op, ...) -> {op =, chosen =, declined = {{kernel =, reason =}, ...}}: the
 * decision the op would make for these arguments; nothing runs. When the call would fail in
 * dispatch (no candidate accepts, or a kernel's layout error under on_layout_mismatch =
 * "error"), chosen is nil and error holds the message the call would raise; invalid
 * arguments raise as the op itself does. */
static int l_explain(lua_State *L) {
    int op = k3l_check_name(L, 1, NULL, g_op_names, "op");
    return g_op_impls[op](L, 2, K3L_EXPLAIN_OP);
}

/* core._ops: the catalogue for init.lua: {{name =, signature =, summary =, kernels = {...}},
 * ...} in catalogue order, each op's kernels (registered or not) in theirs. */
static void push_catalogue(lua_State *L) {
    static const struct {
        const char *id, *name, *signature, *summary;
    } ops[] = {
#define K3_OP(ID, name, signature, summary) {#ID, #name, signature, summary},
#include "k3_ops.def"
#undef K3_OP
    };
    static const struct {
        const char *name, *op;
    } kernels[] = {
#define K3_KERNEL(symbol, name, OP, DEVICE, rank, invariant_rank) {name, #OP},
#include "k3_kernels.def"
#undef K3_KERNEL
    };
    int nops = (int)(sizeof ops / sizeof ops[0]), nk = (int)(sizeof kernels / sizeof kernels[0]);
    lua_createtable(L, nops, 0);
    for (int o = 0; o < nops; o++) {
        lua_createtable(L, 0, 4);
        lua_pushstring(L, ops[o].name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, ops[o].signature);
        lua_setfield(L, -2, "signature");
        lua_pushstring(L, ops[o].summary);
        lua_setfield(L, -2, "summary");
        lua_newtable(L);
        for (int k = 0, n = 0; k < nk; k++)
            if (strcmp(kernels[k].op, ops[o].id) == 0) {
                lua_pushstring(L, kernels[k].name);
                lua_rawseti(L, -2, ++n);
            }
        lua_setfield(L, -2, "kernels");
        lua_rawseti(L, -2, o + 1);
    }
}

/* k3.trace(fn) -> {{op =, kernel =, declined = {...}, captured = true|nil}, ...}: every
 * dispatch made while fn runs (captured: made while a CUDA graph was being captured). Traces nest: an enclosing trace also gets every record of an inner one. When fn
 * raises, the enclosing trace (if any) is restored and still gets the records of the
 * dispatches that ran before the error, then the error propagates unchanged. fn runs under
 * lua_pcall and cannot yield: a coroutine that yields inside k3.trace (a rank of
 * k3.dist.simulate waiting in a collective, say) raises "attempt to yield across a C-call
 * boundary". That is deliberate: the trace being recorded is one per lua_State, so letting
 * another coroutine run in the middle would file its dispatches under this trace. Trace
 * around the whole k3.dist.simulate call instead, or inside a rank between collectives. */
static int l_trace(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_TRACE); /* 2: the enclosing trace, if any */
    lua_newtable(L);                                   /* 3: this trace */
    lua_pushvalue(L, 3);
    lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_TRACE);
    lua_pushvalue(L, 1);
    int st = lua_pcall(L, 0, 0, 0); /* on error, 4: the error object */
    lua_pushvalue(L, 2);
    lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_TRACE);
    /* The dispatches ran whether or not fn finished: the enclosing trace gets them either way
     * (a pcall around an inner trace must not hide them). Raw access: plain tables. */
    if (lua_istable(L, 2)) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, 3), m = (lua_Integer)lua_rawlen(L, 2);
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, 3, i);
            lua_rawseti(L, 2, m + i);
        }
    }
    if (st != LUA_OK) return lua_error(L);
    lua_settop(L, 3);
    return 1;
}

/* ---- counters -------------------------------------------------------------------------------- */

static void stats_cb(void *ud, const char *kind, const char *name, uint64_t count) {
    lua_State *L = ud;
    lua_getfield(L, -1, strcmp(kind, "kernel") == 0     ? "kernels"
                        : strcmp(kind, "captured") == 0 ? "captured"
                                                        : "declines");
    lua_pushinteger(L, (lua_Integer)count);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
}

/* k3.stats() -> {kernels = {[name] = calls}, captured = {[name] = calls captured into a CUDA
 * graph, also counted in kernels}, declines = {["kernel: reason"] = count}}: the
 * calls this Lua state's ops and methods made since the module was opened or the state's
 * last k3.stats_reset(); other lua_States and C callers are not counted here (C's k3_stats
 * has the process-wide totals). */
static int l_stats(lua_State *L) {
    lua_createtable(L, 0, 2);
    lua_newtable(L);
    lua_setfield(L, -2, "kernels");
    lua_newtable(L);
    lua_setfield(L, -2, "declines");
    lua_newtable(L);
    lua_setfield(L, -2, "captured");
    k3_stats_sink_read(state_stats(L), stats_cb, L);
    return 1;
}
/* k3.stats_reset(): clears this Lua state's counters only. */
static int l_stats_reset(lua_State *L) {
    k3_stats_sink_reset(state_stats(L));
    return 0;
}

/* ---- kernels and backends -------------------------------------------------------------------- */

/* k3.backends() -> {cpu = {available = true}, cuda = {available =, reason =, devices =}} */
static int l_backends(lua_State *L) {
    lua_createtable(L, 0, 2);
    lua_createtable(L, 0, 1);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "available");
    lua_setfield(L, -2, "cpu");
    const char *reason = NULL;
    int ok = k3_backend_available("cuda", &reason);
    lua_createtable(L, 0, 3);
    lua_pushboolean(L, ok);
    lua_setfield(L, -2, "available");
    if (!ok) {
        lua_pushstring(L, reason ? reason : "unknown");
        lua_setfield(L, -2, "reason");
    }
    lua_pushinteger(L, k3_cuda_device_count());
    lua_setfield(L, -2, "devices");
    lua_setfield(L, -2, "cuda");
    return 1;
}

/* k3.kernels() -> names of the kernels registered now. */
static int l_kernels(lua_State *L) {
    int n = k3_kernel_count();
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, k3_kernel_name(i));
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* k3.has_kernel(name) -> whether it is registered now. */
static int l_has_kernel(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_pushboolean(L, k3_has_kernel(k3l_check_cstring(L, 1, 1, "kernel name")));
    return 1;
}

/* k3.known_kernel(name) -> whether k3 knows it (registered or not in this build). */
static int l_known_kernel(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_pushboolean(L, k3_known_kernel(k3l_check_cstring(L, 1, 1, "kernel name")));
    return 1;
}

/* ---- the device ------------------------------------------------------------------------------ */

static int l_synchronize(lua_State *L) {
    CHECK_K3(L, k3_synchronize());
    return 0;
}

static int l_empty_cache(lua_State *L) {
    CHECK_K3(L, k3_empty_cache());
    return 0;
}

/* k3.cuda_arch(device_index) -> "sm90" (0-based index, as in "cuda:N"). */
static int l_cuda_arch(lua_State *L) {
    char buf[32];
    int dev = (int)luaL_optinteger(L, 1, 0);
    CHECK_K3(L, k3_cuda_arch(dev, buf, sizeof buf));
    lua_pushstring(L, buf);
    return 1;
}

/* The timed function's call from k3_cuda_time: fn(i) under lua_pcall, so a Lua error never
 * jumps over the core's events and graphs; the error object waits in its stack slot and is
 * raised once k3_cuda_time has released them. */
typedef struct timed {
    lua_State *L;
    int fn, err; /* stack indices: the function, the error slot */
    int failed;
} timed;

static k3_status timed_call(void *ud, int64_t i) {
    timed *t = ud;
    lua_pushvalue(t->L, t->fn);
    lua_pushinteger(t->L, (lua_Integer)i);
    if (lua_pcall(t->L, 1, 0, 0) == LUA_OK) return K3_OK;
    lua_replace(t->L, t->err);
    t->failed = 1;
    return K3_EINVAL; /* the message is the Lua error's, raised by l_cuda_time */
}

/* k3.cuda_time(fn, {iters = 50, warmup = 5, graph = false, calls = 1, device = 0})
 *   -> median µs per call, {median =, min =, p90 =, samples =}
 * Times fn(i) (i = 1, 2, ..., so fn can rotate inputs) on the device with CUDA events, after
 * `warmup` untimed calls (k3_cuda_time, lib/timing.c). Without graph each sample is one call,
 * launch overhead included; with graph = true, `calls` calls are captured into one CUDA graph
 * and each sample is one replay divided by `calls`: the captured work must not allocate or
 * synchronise (pass out = tensors). */
static int l_cuda_time(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    k3_time_options o = {50, 5, 0, 1, 0};
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        o.iters = (int)k3l_int_field(L, 2, "iters", 50, 0, 2);
        o.warmup = (int)k3l_int_field(L, 2, "warmup", 5, 0, 2);
        o.calls = (int)k3l_int_field(L, 2, "calls", 1, 0, 2);
        o.device = (int)k3l_int_field(L, 2, "device", 0, 0, 2);
        lua_getfield(L, 2, "graph");
        o.graph = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    lua_settop(L, 2);
    lua_pushnil(L); /* 3: the error slot */
    timed t = {L, 1, 3, 0};
    k3_time_result r;
    k3_status s;
    K3L_RUN(s, k3_cuda_time(timed_call, &t, &o, &r));
    if (t.failed) {
        lua_settop(L, 3);
        return lua_error(L);
    }
    if (s != K3_OK) return k3l_raise(L);
    lua_pushnumber(L, r.median_us);
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, r.median_us);
    lua_setfield(L, -2, "median");
    lua_pushnumber(L, r.min_us);
    lua_setfield(L, -2, "min");
    lua_pushnumber(L, r.p90_us);
    lua_setfield(L, -2, "p90");
    lua_pushinteger(L, r.samples);
    lua_setfield(L, -2, "samples");
    return 2;
}

static const luaL_Reg ops_funcs[] = {
#define K3_OP(ID, name, signature, summary) {#name, l_##name},
#include "k3_ops.def"
#undef K3_OP
    {"explain", l_explain},
    {"trace", l_trace},
    {"stats", l_stats},
    {"stats_reset", l_stats_reset},
    {"backends", l_backends},
    {"kernels", l_kernels},
    {"has_kernel", l_has_kernel},
    {"known_kernel", l_known_kernel},
    {"synchronize", l_synchronize},
    {"empty_cache", l_empty_cache},
    {"cuda_arch", l_cuda_arch},
    {"cuda_time", l_cuda_time},
    {NULL, NULL}};

/* The elementwise and reduction ops of the catalogue as tensor methods (t:abs(), t:sum(2),
 * ...): the same functions as k3.abs, k3.sum, with the tensor as argument 1. */
void k3l_add_op_methods(lua_State *L) {
    static const luaL_Reg methods[] = {{"abs", l_abs}, {"exp", l_exp},   {"sqrt", l_sqrt},
                                       {"sum", l_sum}, {"mean", l_mean}, {"max", l_max},
                                       {"min", l_min}, {NULL, NULL}};
    luaL_setfuncs(L, methods, 0);
}

void k3l_open_ops(lua_State *L) {
    luaL_newmetatable(L, K3L_POLICY_MT); /* Lua memory: nothing to free */
    lua_pop(L, 1);
    luaL_newmetatable(L, K3L_STATS_MT);
    lua_pop(L, 1);
    /* Made once: luaopen_k3_core may run again in the same state (busted insulation), which
     * must not reset the policy or the counters. */
    if (lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY) == LUA_TNIL) {
        k3l_new_policy(L);
        k3l_set_state_policy(L);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_STATS) == LUA_TNIL) {
        k3_stats_sink *sink = lua_newuserdatauv(L, k3_stats_sink_size(), 0);
        k3_stats_sink_reset(sink);
        luaL_setmetatable(L, K3L_STATS_MT);
        lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_STATS);
    }
    lua_pop(L, 1);
    luaL_setfuncs(L, ops_funcs, 0);
    push_catalogue(L);
    lua_setfield(L, -2, "_ops");
}
