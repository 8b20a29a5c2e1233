/*
 * policy.c — policy tables (k3.set_policy compiles one into the state's policy, k3.policy
 * reads it back), the state's batch-invariant mode, and the linear methods (k3.method.default,
 * k3.method.low_latency, m:apply, m:explain). Each lua_State owns its policy (lib/lua/ops.c
 * keeps it with the state's counters), so neither setting reaches another state.
 */
#include "k3_lua.h"

#include <limits.h>
#include <string.h>

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

/* The op names of the catalogue (lib/k3_ops.def). */
static const char *const g_ops[] = {
#define K3_OP(ID, name, signature, summary) #name,
#include "k3_ops.def"
#undef K3_OP
};
enum { NOPS = (int)(sizeof g_ops / sizeof g_ops[0]) };

static int op_index(lua_State *L, int idx) {
    if (lua_type(L, idx) != LUA_TSTRING) return -1;
    for (int o = 0; o < NOPS; o++)
        if (strcmp(lua_tostring(L, idx), g_ops[o]) == 0) return o;
    return -1;
}

/* Pushes a plain copy of the table at idx, read through pairs (its __pairs metamethod when it
 * has one: a k3.policy view keeps its contents behind one), `depth` levels deep; values deeper
 * down, and values that are not tables, are kept as they are. */
static void push_plain(lua_State *L, int idx, int depth) {
    idx = lua_absindex(L, idx);
    if (depth == 0 || lua_type(L, idx) != LUA_TTABLE) {
        lua_pushvalue(L, idx);
        return;
    }
    luaL_checkstack(L, 8, "k3: policy nested too deep");
    lua_newtable(L);
    int copy = lua_gettop(L);
    if (luaL_getmetafield(L, idx, "__pairs") == LUA_TNIL) {
        lua_pushnil(L);
        while (lua_next(L, idx)) {
            lua_pushvalue(L, -2);
            push_plain(L, -2, depth - 1);
            lua_rawset(L, copy);
            lua_pop(L, 1);
        }
        return;
    }
    lua_pushvalue(L, idx);
    lua_call(L, 1, 3); /* iterator, state, first key */
    int iter = copy + 1;
    for (;;) {
        lua_pushvalue(L, iter);
        lua_pushvalue(L, iter + 1);
        lua_pushvalue(L, iter + 2);
        lua_call(L, 2, 2); /* key, value */
        if (lua_isnil(L, -2)) {
            lua_pop(L, 2);
            break;
        }
        lua_pushvalue(L, -2);
        lua_replace(L, iter + 2); /* the next call continues from this key */
        push_plain(L, -1, depth - 1);
        lua_replace(L, -2);
        lua_rawset(L, copy);
    }
    lua_settop(L, copy);
}

/* Pushes a key as set_policy's messages show it: a string quoted, anything else as tostring. */
static const char *push_key(lua_State *L, int idx) {
    if (lua_type(L, idx) == LUA_TSTRING) return lua_pushfstring(L, "\"%s\"", lua_tostring(L, idx));
    return luaL_tolstring(L, idx, NULL);
}

/* Pushes "linear, attn_res, rms_norm, silu_mul" followed by `tail`. */
static const char *push_op_list(lua_State *L, const char *tail) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int o = 0; o < NOPS; o++) {
        if (o) luaL_addstring(&b, ", ");
        luaL_addstring(&b, g_ops[o]);
    }
    luaL_addstring(&b, tail);
    luaL_pushresult(&b);
    return lua_tostring(L, -1);
}

/* The list of kernel names at idx for op (label: how messages name it), set as p's candidates
 * (invariant 0) or batch-invariant candidates (1): a list without holes, of at most
 * K3_MAX_CANDIDATES strings; the candidates need at least one. The core checks the names. */
static void set_list(lua_State *L, int idx, k3_policy *p, int invariant, const char *op,
                     const char *label) {
    if (lua_type(L, idx) != LUA_TTABLE)
        luaL_error(L, "set_policy: %s must be a list of kernel names; got %s", label,
                   luaL_typename(L, idx));
    lua_Integer entries = 0, n = 0; /* n: the largest index */
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1) {
            const char *key = push_key(L, -1);
            luaL_error(L, "set_policy: %s must be a list of kernel names (indices 1..n); got key %s",
                       label, key);
        }
        if (lua_tointeger(L, -1) > n) n = lua_tointeger(L, -1);
        entries++;
    }
    if (entries == 0 && !invariant)
        luaL_error(L, "set_policy: %s lists no kernels; every op needs at least one", label);
    if (entries != n)
        luaL_error(L, "set_policy: %s must be a list without holes (1..n); got %d entries for "
                      "length %d",
                   label, (int)entries, (int)n);
    if (n > K3_MAX_CANDIDATES)
        luaL_error(L, "set_policy: %s lists %d kernels; at most %d", label, (int)n,
                   K3_MAX_CANDIDATES);
    const char *names[K3_MAX_CANDIDATES];
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, idx, i) != LUA_TSTRING)
            luaL_error(L, "set_policy: %s[%d] must be a kernel name string; got %s", label, (int)i,
                       luaL_typename(L, -1));
        names[i - 1] = k3l_check_cstring(L, -1, 1, "a kernel name");
        lua_pop(L, 1); /* the string stays alive in the list */
    }
    k3_status s;
    K3L_RUN(s, invariant ? k3_policy_set_invariant_candidates(p, op, names, (int)n)
                         : k3_policy_set_candidates(p, op, names, (int)n));
    if (s != K3_OK) k3l_raise_as(L, "set_policy");
}

/* k3.set_policy(tbl): compiles a policy table into this state's policy, keeping the state's
 * batch-invariant mode. The one place a policy table is checked: its keys (linear, attn_res,
 * rms_norm, silu_mul, batch_invariant = {<op> = list}, on_layout_mismatch), each list, and
 * on_layout_mismatch ("error" or "fallback"); the core checks each name against the catalogue.
 * Lists the table leaves out keep the built-in default's. tbl may be a plain table or a
 * k3.policy view (read through pairs). Nothing changes when anything is refused. */
static int l_set_policy(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    push_plain(L, 1, 3);
    lua_replace(L, 1);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        lua_pop(L, 1);
        int known = op_index(L, -1) >= 0;
        if (!known && lua_type(L, -1) == LUA_TSTRING) {
            const char *k = lua_tostring(L, -1);
            known = strcmp(k, "batch_invariant") == 0 || strcmp(k, "on_layout_mismatch") == 0 ||
                    strcmp(k, "ops") == 0;
        }
        if (!known) {
            const char *key = push_key(L, -1);
            const char *expected = push_op_list(L, ", batch_invariant or on_layout_mismatch");
            luaL_error(L, "set_policy: unknown key %s (expected %s)", key, expected);
        }
    }
    k3_policy *p = k3l_new_policy(L); /* 2 */
    CHECK_K3_AS(L, "set_policy",
                k3_policy_set_batch_invariant(p, k3_policy_batch_invariant(k3l_state_policy(L))));
    int src = 1;
    lua_pushstring(L, "ops");
    if (lua_rawget(L, 1) == LUA_TTABLE) src = lua_gettop(L);
    else lua_pop(L, 1);
    for (int o = 0; o < NOPS; o++) {
        lua_pushstring(L, g_ops[o]);
        if (lua_rawget(L, src) != LUA_TNIL) set_list(L, lua_gettop(L), p, 0, g_ops[o], g_ops[o]);
        lua_pop(L, 1);
    }
    lua_pushstring(L, "batch_invariant");
    int ty = lua_rawget(L, 1);
    if (ty != LUA_TNIL) {
        int bi = lua_gettop(L);
        if (ty != LUA_TTABLE)
            return luaL_error(L, "set_policy: batch_invariant must be a table of kernel lists by "
                                 "op; got %s",
                              luaL_typename(L, bi));
        lua_pushnil(L);
        while (lua_next(L, bi)) {
            int o = op_index(L, -2);
            if (o < 0) {
                const char *key = push_key(L, -2);
                const char *expected = push_op_list(L, "");
                return luaL_error(L, "set_policy: batch_invariant has unknown key %s (expected %s)",
                                  key, expected);
            }
            lua_pushfstring(L, "batch_invariant.%s", g_ops[o]);
            set_list(L, lua_gettop(L) - 1, p, 1, g_ops[o], lua_tostring(L, -1));
            lua_pop(L, 2);
        }
    }
    lua_pop(L, 1);
    lua_pushstring(L, "on_layout_mismatch");
    ty = lua_rawget(L, 1);
    if (ty != LUA_TNIL) {
        const char *v = ty == LUA_TSTRING ? lua_tostring(L, -1) : NULL; /* no in-place number->string */
        if (ty != LUA_TSTRING || (strcmp(v, "error") != 0 && strcmp(v, "fallback") != 0))
            return luaL_error(L, "set_policy: on_layout_mismatch must be \"error\" or "
                                 "\"fallback\"; got %s",
                              ty == LUA_TSTRING ? v : luaL_typename(L, -1));
        CHECK_K3_AS(L, "set_policy", k3_policy_set_layout_fallback(p, strcmp(v, "fallback") == 0));
    }
    lua_settop(L, 2);
    k3l_set_state_policy(L);
    return 0;
}

/* Pushes p (NULL: the built-in default) as a plain table: {linear = {...}, attn_res = {...},
 * rms_norm = {...}, silu_mul = {...}, batch_invariant = {linear = {...}}, on_layout_mismatch =
 * "error"|"fallback"}; batch_invariant holds the ops whose batch-invariant list is not empty. */
static int push_policy(lua_State *L, const k3_policy *p) {
    lua_createtable(L, 0, NOPS + 2);
    lua_newtable(L); /* batch_invariant */
    for (int o = 0; o < NOPS; o++) {
        int n = k3_policy_count(p, g_ops[o]);
        lua_createtable(L, n, 0);
        for (int i = 0; i < n; i++) {
            lua_pushstring(L, k3_policy_candidate(p, g_ops[o], i));
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -3, g_ops[o]);
        n = k3_policy_invariant_count(p, g_ops[o]);
        if (n == 0) continue;
        lua_createtable(L, n, 0);
        for (int i = 0; i < n; i++) {
            lua_pushstring(L, k3_policy_invariant_candidate(p, g_ops[o], i));
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, g_ops[o]);
    }
    lua_setfield(L, -2, "batch_invariant");
    lua_pushstring(L, k3_policy_layout_fallback(p) ? "fallback" : "error");
    lua_setfield(L, -2, "on_layout_mismatch");
    return 1;
}

/* core.policy_table() -> the policy this state dispatches with, as push_policy shows it
 * (init.lua shows it as the read-only k3.policy). */
static int l_policy_table(lua_State *L) { return push_policy(L, k3l_state_policy(L)); }

/* core.policy_id() -> the compiled policy itself (an opaque userdata): a new one whenever
 * k3.set_policy replaces this state's policy (init.lua rebuilds its k3.policy view then; holding
 * the old one keeps its identity from being reused). */
static int l_policy_id(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_POLICY);
    return 1;
}

/* core.default_policy() -> the built-in default policy (lib/k3_kernels.def's ranks), the same
 * way: what lua/k3/policy/default.lua hands out. */
static int l_default_policy(lua_State *L) { return push_policy(L, NULL); }

/* ---- linear methods -------------------------------------------------------------------------- */

typedef struct {
    k3_method *m;
} method_ud;

static k3_method *check_method(lua_State *L, int idx) {
    method_ud *u = luaL_checkudata(L, idx, K3L_METHOD_MT);
    if (!u->m) k3l_arg_error(L, idx, "method has been freed");
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

/* config field `field` of plan entry M (0 when absent) as an int; a value no int holds raises,
 * reported as the caller wrote it (a cast would hand the C checks another number). */
static int plan_int_field(lua_State *L, int cfg, const char *field, lua_Integer m) {
    int64_t v = k3l_int_field(L, cfg, field, 0, 0, 1);
    if (v < INT_MIN || v > INT_MAX)
        return luaL_error(L, "method.low_latency: plan entry for M = %I has %s %I; expected an int",
                          m, field, (lua_Integer)v);
    return (int)v;
}

/* k3.method.low_latency(plan[, opts]): plan = {[M] = {kernel = "skinny", config = {threads =,
 * rows =, unroll =, vec =, split_k =, rows_per_warp = 8 | 16 | 32, balanced = true | false,
 * l2_prefetch_mb = 0..40}}, ...};
 * opts.static_weights = true promises that no kernel in flight writes the weights
 * (k3_plan_entry.static_weights). Declined calls run the owned default method. */
static int l_method_low_latency(lua_State *L) {
    static const char *const entry_keys[] = {"kernel",  "config",       "us",
                                             "cublas_us", "step_us", "base_step_us", NULL};
    static const char *const cfg_keys[] = {"threads",       "rows",     "unroll", "vec", "split_k",
                                           "rows_per_warp", "balanced", "l2_prefetch_mb",
                                           NULL};
    static const char *const opt_keys[] = {"static_weights", NULL};
    k3_plan_entry e[MAX_PLAN];
    int n = 0, static_weights = 0;
    if (!lua_isnoneornil(L, 2)) { /* read before the plan walk sets the stack to the plan */
        luaL_checktype(L, 2, LUA_TTABLE);
        k3l_check_option_keys(L, 2, opt_keys, 2);
        static_weights = k3l_bool_field(L, 2, "static_weights", 0, 2);
    }
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
            e[n].static_weights = static_weights;
            int entry = lua_gettop(L);
            k3l_check_option_keys(L, entry, entry_keys, 1);
            if (lua_getfield(L, entry, "kernel") != LUA_TSTRING)
                return k3l_arg_error(L, 1, "plan[%I].kernel must be a string; got %s", m,
                                     luaL_typename(L, -1));
            e[n].kernel = k3l_check_cstring(L, -1, 1, "a plan's kernel name");
            lua_rawseti(L, 2, n + 1); /* anchored: the entry may be a proxy */
            if (lua_getfield(L, entry, "config") == LUA_TTABLE) {
                int cfg = lua_gettop(L);
                k3l_check_option_keys(L, cfg, cfg_keys, 1);
                e[n].threads = plan_int_field(L, cfg, "threads", m);
                e[n].rows = plan_int_field(L, cfg, "rows", m);
                e[n].unroll = plan_int_field(L, cfg, "unroll", m);
                e[n].vec = plan_int_field(L, cfg, "vec", m);
                e[n].split_k = plan_int_field(L, cfg, "split_k", m);
                e[n].rows_per_warp = plan_int_field(L, cfg, "rows_per_warp", m);
                e[n].balanced = k3l_bool_field(L, cfg, "balanced", 0, 1);
                e[n].l2_prefetch_mb = plan_int_field(L, cfg, "l2_prefetch_mb", m);
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

/* m:apply(x, w, bias, {residual =, prologue =, norm_weight =, eps =, epilogue =, out =}) -> y
 * (the prologue and epilogue as in k3.linear); m:explain(x, w, bias, opts) -> decision
 * {op =, chosen =, declined = {{kernel =, reason =}, ...}}; nothing runs. Where apply would
 * raise because the arguments are refused (a K mismatch, tensors on different devices, ...)
 * or no kernel accepts the call, explain does not raise: chosen is nil, declined holds the
 * method's declines and then dispatch's, if it got that far, and error is the message apply
 * raises. Lua argument errors (not a tensor, a freed tensor or method) still raise. */
static int method_call(lua_State *L, int explain) {
    static const char *const keys[] = {"residual", "prologue", "norm_weight", "eps", "epilogue",
                                       "out", NULL};
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
    k3_linear_prologue_args pro = k3l_prologue_field(L, opts, 5);
    k3_linear_epilogue epi = k3l_epilogue_field(L, opts, 5);
    k3l_call c;
    k3_tensor *out, **y;
    k3l_op_prepare(L, opts, 5, explain, &c, &out, &y); /* opts has no kernel: its keys say so */
    k3_status s;
    K3L_RUN(s, k3_method_apply_fused(m, y, x, w, bias, res, &pro, epi, out, &c.call));
    return k3l_op_finish(L, s, &c, explain ? K3L_EXPLAIN_METHOD : 0);
}
static int method_apply(lua_State *L) { return method_call(L, 0); }
static int method_explain(lua_State *L) { return method_call(L, 1); }

/* tostring(m): "k3.Method: 0x…" (its address, as Lua names a userdata), "k3.Method (freed)"
 * after m:free(). */
static int method_tostring(lua_State *L) {
    method_ud *u = luaL_checkudata(L, 1, K3L_METHOD_MT);
    if (u->m)
        lua_pushfstring(L, "k3.Method: %p", (void *)u);
    else
        lua_pushstring(L, "k3.Method (freed)");
    return 1;
}

static const luaL_Reg method_methods[] = {
    {"apply", method_apply}, {"explain", method_explain}, {"free", method_gc}, {NULL, NULL}};

static const luaL_Reg policy_funcs[] = {
    {"set_batch_invariant", l_set_batch_invariant},
    {"batch_invariant", l_batch_invariant},
    {"set_policy", l_set_policy},
    {"policy_table", l_policy_table},
    {"default_policy", l_default_policy},
    {"policy_id", l_policy_id},
    {"method_default", l_method_default},
    {"method_low_latency", l_method_low_latency},
    {NULL, NULL}};

void k3l_open_policy(lua_State *L) {
    if (luaL_newmetatable(L, K3L_METHOD_MT)) {
        lua_pushcfunction(L, method_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, method_gc);
        lua_setfield(L, -2, "__close");
        lua_pushcfunction(L, method_tostring);
        lua_setfield(L, -2, "__tostring");
        luaL_newlib(L, method_methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    luaL_setfuncs(L, policy_funcs, 0);
}
