/*
 * policy.c — the state's dispatch policy (k3.set_policy compiles a table into it, k3.policy
 * reads it back), its batch-invariant mode, and the linear methods (k3.method.default,
 * k3.method.low_latency, m:apply, m:explain). Each lua_State owns its policy, so neither
 * setting reaches another state.
 */
#include "k3_lua.h"

#include <limits.h>
#include <string.h>

/* The compiled policy of this Lua state: made when the module is opened (the built-in default
 * candidates, and the process default of batch-invariant mode), replaced by k3.set_policy,
 * its batch-invariant mode set by k3.set_batch_invariant. It lives in Lua's memory
 * (k3_policy_init): opening k3 makes no host allocation, so a host may still call
 * k3_set_allocator before its first tensor. */
static k3_policy *new_policy(lua_State *L) {
    k3_policy *p = lua_newuserdatauv(L, k3_policy_size(), 0);
    k3_policy_init(p);
    luaL_setmetatable(L, K3L_POLICY_MT);
    return p;
}

k3_policy *k3l_state_policy(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY);
    k3_policy *p = luaL_testudata(L, -1, K3L_POLICY_MT);
    lua_pop(L, 1);
    return p;
}

/* k3.set_batch_invariant(on): on a boolean (anything else is a bad argument); batch-invariant
 * mode of this Lua state: linear's low-latency plans decline and linear runs its fixed-order
 * kernel, so a row's result does not depend on M. Other lua_States in the process keep their
 * own mode. A state starts with the process default (K3_BATCH_INVARIANT=1, or a C host's
 * k3_set_batch_invariant). */
static int l_set_batch_invariant(lua_State *L) {
    /* A boolean only: "off" or 0 would be true in Lua, the opposite of what they say. */
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    CHECK_K3(L, k3_policy_set_batch_invariant(k3l_state_policy(L), lua_toboolean(L, 1)));
    return 0;
}

/* k3.batch_invariant() -> boolean: this Lua state's batch-invariant mode. */
static int l_batch_invariant(lua_State *L) {
    lua_pushboolean(L, k3_policy_batch_invariant(k3l_state_policy(L)));
    return 1;
}

/* core.compile_policy(tbl): compiles a policy table (per op a list of kernel names,
 * on_layout_mismatch) and makes it this state's policy. Unknown kernel names and bad values
 * raise before anything changes. */
static int l_compile_policy(lua_State *L) {
    static const char *const ops[] = {"linear", "attn_res", "rms_norm", "silu_mul"};
    luaL_checktype(L, 1, LUA_TTABLE);
    k3_policy *p = new_policy(L); /* 2 */
    /* A new policy keeps the state's batch-invariant mode (k3.set_batch_invariant). */
    CHECK_K3_AS(L, "set_policy",
                k3_policy_set_batch_invariant(p, k3_policy_batch_invariant(k3l_state_policy(L))));
    int src = 1;
    if (lua_getfield(L, 1, "ops") == LUA_TTABLE) src = lua_gettop(L);
    else lua_pop(L, 1);
    for (int k = 0; k < 4; k++) {
        int ty = lua_getfield(L, src, ops[k]);
        if (ty == LUA_TNIL) {
            lua_pop(L, 1);
            continue;
        }
        if (ty != LUA_TTABLE)
            return luaL_error(L, "set_policy: %s must be a list of kernel names; got %s", ops[k],
                              luaL_typename(L, -1));
        const char *names[K3_MAX_CANDIDATES];
        lua_Integer n = luaL_len(L, -1);
        if (n > K3_MAX_CANDIDATES)
            return luaL_error(L, "set_policy: %s lists %d kernels; at most %d", ops[k], (int)n,
                              K3_MAX_CANDIDATES);
        for (lua_Integer i = 1; i <= n; i++) {
            if (lua_geti(L, -1 - (int)(i - 1), i) != LUA_TSTRING)
                return luaL_error(L, "set_policy: %s[%d] must be a kernel name string; got %s",
                                  ops[k], (int)i, luaL_typename(L, -1));
            names[i - 1] = lua_tostring(L, -1); /* stays on the stack until set */
        }
        CHECK_K3_AS(L, "set_policy", k3_policy_set_candidates(p, ops[k], names, (int)n));
        lua_pop(L, (int)n + 1);
    }
    int ty = lua_getfield(L, 1, "on_layout_mismatch");
    if (ty != LUA_TNIL) {
        const char *v = ty == LUA_TSTRING ? lua_tostring(L, -1) : NULL; /* no in-place number->string */
        if (ty != LUA_TSTRING || (strcmp(v, "error") != 0 && strcmp(v, "fallback") != 0))
            return luaL_error(L, "set_policy: on_layout_mismatch must be \"error\" or "
                                 "\"fallback\"; got %s",
                              ty == LUA_TSTRING ? v : luaL_typename(L, -1));
        CHECK_K3_AS(L, "set_policy", k3_policy_set_layout_fallback(p, strcmp(v, "fallback") == 0));
    }
    lua_pop(L, 1);
    lua_settop(L, 2);
    lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY);
    return 0;
}

/* core.policy_table() -> {linear = {...}, attn_res = {...}, rms_norm = {...},
 * silu_mul = {...}, on_layout_mismatch = "error"|"fallback"}: a plain copy of the policy
 * this state dispatches with, read back from the compiled policy (init.lua shows it as the
 * read-only k3.policy). */
static int l_policy_table(lua_State *L) {
    static const char *const ops[] = {"linear", "attn_res", "rms_norm", "silu_mul"};
    const k3_policy *p = k3l_state_policy(L);
    lua_createtable(L, 0, 5);
    for (int k = 0; k < 4; k++) {
        int n = k3_policy_count(p, ops[k]);
        lua_createtable(L, n, 0);
        for (int i = 0; i < n; i++) {
            lua_pushstring(L, k3_policy_candidate(p, ops[k], i));
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, ops[k]);
    }
    lua_pushstring(L, k3_policy_layout_fallback(p) ? "fallback" : "error");
    lua_setfield(L, -2, "on_layout_mismatch");
    return 1;
}

/* ---- linear methods -------------------------------------------------------------------------- */

typedef struct {
    k3_method *m;
} method_ud;

static k3_method *check_method(lua_State *L, int idx) {
    method_ud *u = luaL_checkudata(L, idx, K3L_METHOD_MT);
    if (!u->m) luaL_error(L, "method has been freed");
    return u->m;
}

static int method_gc(lua_State *L) {
    method_ud *u = luaL_checkudata(L, 1, K3L_METHOD_MT);
    k3_method_free(u->m);
    u->m = NULL;
    return 0;
}

static method_ud *push_method(lua_State *L) {
    method_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->m = NULL;
    luaL_setmetatable(L, K3L_METHOD_MT);
    return u;
}

/* k3.method.default() -> the default linear method (dispatch over the policy's candidates). */
static int l_method_default(lua_State *L) {
    method_ud *u = push_method(L);
    CHECK_K3(L, k3_method_default(&u->m, k3l_state_policy(L)));
    return 1;
}

#define MAX_PLAN 64
/* k3.method.low_latency(plan): plan = {[M] = {kernel = "skinny", config = {threads =, rows =,
 * unroll =, vec =, split_k =}}, ...}. Declined calls run the owned default method. */
static int l_method_low_latency(lua_State *L) {
    static const char *const entry_keys[] = {"kernel", "config", "us", "cublas_us", NULL};
    static const char *const cfg_keys[] = {"threads", "rows", "unroll", "vec", "split_k", NULL};
    k3_plan_entry e[MAX_PLAN];
    int n = 0;
    if (!lua_isnoneornil(L, 1)) {
        luaL_checktype(L, 1, LUA_TTABLE);
        lua_settop(L, 1);
        lua_newtable(L); /* 2: anchors the kernel name strings until the method is built */
        lua_pushnil(L);
        while (lua_next(L, 1)) {
            int isnum;
            lua_Integer m = lua_tointegerx(L, -2, &isnum);
            if (!isnum)
                return k3l_arg_error(L, 1, "plan keys must be integer token counts M; got %s",
                                     luaL_typename(L, -2));
            /* A key no int holds is out of range; report it as the caller wrote it (the C
             * check below only sees the int, which would show another number). */
            if (m < INT_MIN || m > INT_MAX)
                return luaL_error(L, "method.low_latency: plan M must be in 1..%d; got %I",
                                  K3_PLAN_MAX_M, m);
            if (!lua_istable(L, -1))
                return k3l_arg_error(L, 1, "plan[%I] must be a table; got %s", m,
                                     luaL_typename(L, -1));
            if (n >= MAX_PLAN) return k3l_arg_error(L, 1, "at most %d plan entries", MAX_PLAN);
            memset(&e[n], 0, sizeof e[n]);
            e[n].m = (int)m;
            int entry = lua_gettop(L);
            k3l_check_option_keys(L, entry, entry_keys, 1);
            if (lua_getfield(L, entry, "kernel") != LUA_TSTRING)
                return k3l_arg_error(L, 1, "plan[%I].kernel must be a string; got %s", m,
                                     luaL_typename(L, -1));
            e[n].kernel = lua_tostring(L, -1);
            lua_rawseti(L, 2, n + 1); /* anchored: the entry may be a proxy */
            if (lua_getfield(L, entry, "config") == LUA_TTABLE) {
                int cfg = lua_gettop(L);
                k3l_check_option_keys(L, cfg, cfg_keys, 1);
                e[n].threads = (int)k3l_int_field(L, cfg, "threads", 0, 0, 1);
                e[n].rows = (int)k3l_int_field(L, cfg, "rows", 0, 0, 1);
                e[n].unroll = (int)k3l_int_field(L, cfg, "unroll", 0, 0, 1);
                e[n].vec = (int)k3l_int_field(L, cfg, "vec", 0, 0, 1);
                e[n].split_k = (int)k3l_int_field(L, cfg, "split_k", 0, 0, 1);
            } else if (!lua_isnil(L, -1)) {
                return k3l_arg_error(L, 1, "plan[%I].config must be a table; got %s", m,
                                     luaL_typename(L, -1));
            }
            lua_pop(L, 2);
            n++;
        }
    }
    method_ud *u = push_method(L);
    CHECK_K3(L, k3_method_low_latency(&u->m, e, n, k3l_state_policy(L)));
    return 1;
}

/* m:apply(x, w, bias, {residual =, out =}) -> y; m:explain(x, w, bias) -> decision
 * {op =, chosen =, declined = {{kernel =, reason =}, ...}}; nothing runs. Where apply would
 * raise because the arguments are refused (a K mismatch, tensors on different devices, ...)
 * or no kernel accepts the call, explain does not raise: chosen is nil, declined holds the
 * method's declines and then dispatch's, if it got that far, and error is the message apply
 * raises. Lua argument errors (not a tensor, a freed tensor or method) still raise. */
static int method_call(lua_State *L, int explain) {
    static const char *const keys[] = {"residual", "out", NULL};
    k3_method *m = check_method(L, 1);
    k3_tensor *x = k3l_check_tensor(L, 2), *w = k3l_check_tensor(L, 3);
    k3_tensor *bias = lua_isnoneornil(L, 4) ? NULL : k3l_check_tensor(L, 4);
    int opts = 0;
    if (!lua_isnoneornil(L, 5)) {
        luaL_checktype(L, 5, LUA_TTABLE);
        opts = 5;
        k3l_check_option_keys(L, opts, keys, opts);
    }
    k3_tensor *res = opts ? k3l_tensor_field(L, opts, "residual", 0, 5) : NULL;
    int out_idx = k3l_opt_out(L, opts, 5);
    k3_tensor *out = out_idx ? k3l_check_tensor(L, out_idx) : NULL;
    k3l_call c;
    k3l_call_init(L, &c, NULL, explain);
    k3l_tensor_ud *u = k3l_result_slot(L, out_idx, explain);
    k3_status s;
    K3L_RUN(s, k3_method_apply(m, u ? &u->t : NULL, x, w, bias, res, out, &c.call));
    return k3l_op_finish(L, s, &c, explain ? K3L_EXPLAIN_METHOD : 0);
}
static int method_apply(lua_State *L) { return method_call(L, 0); }
static int method_explain(lua_State *L) { return method_call(L, 1); }

static const luaL_Reg method_methods[] = {
    {"apply", method_apply}, {"explain", method_explain}, {"free", method_gc}, {NULL, NULL}};

static const luaL_Reg policy_funcs[] = {
    {"set_batch_invariant", l_set_batch_invariant},
    {"batch_invariant", l_batch_invariant},
    {"compile_policy", l_compile_policy},
    {"policy_table", l_policy_table},
    {"method_default", l_method_default},
    {"method_low_latency", l_method_low_latency},
    {NULL, NULL}};

void k3l_open_policy(lua_State *L) {
    luaL_newmetatable(L, K3L_POLICY_MT); /* Lua memory: nothing to free */
    lua_pop(L, 1);
    /* This state's policy, made once: luaopen_k3_core may run again in the same state (busted
     * insulation), which must not reset it. */
    if (lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY) == LUA_TNIL) {
        new_policy(L);
        lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY);
    }
    lua_pop(L, 1);
    if (luaL_newmetatable(L, K3L_METHOD_MT)) {
        lua_pushcfunction(L, method_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, method_gc);
        lua_setfield(L, -2, "__close");
        luaL_newlib(L, method_methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    luaL_setfuncs(L, policy_funcs, 0);
}
