/*
 * tensor_ops.c — the binding's tensor functions that make new tensors from others: t / u,
 * dtype conversions (t:float(), t:double(), t:bf16(), t:half()), k3.cat, k3.stack, k3.arange,
 * k3.linspace and k3.equal; and the registration of every tensor-op method and metamethod
 * (with the catalogue's elementwise and reduction ops of ops.c).
 */
#include "k3_lua.h"

#include <math.h>

/* ---- dtype conversions: k3_tensor_to on the tensor's own device ----------------------------- */

static int convert(lua_State *L, k3_dtype dt, const char *fname) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3_AS(L, fname, k3_tensor_to(&u->t, t, k3_tensor_device(t), dt));
    return 1;
}
/* t:float() / t:double() / t:bf16() / t:half() -> a new tensor of dtype f32 / f64 / bf16 / f16
 * (each element rounded once, NaN and infinities kept), on t's device. */
static int m_float(lua_State *L) { return convert(L, K3_DTYPE_F32, "float"); }
static int m_double(lua_State *L) { return convert(L, K3_DTYPE_F64, "double"); }
static int m_bf16(lua_State *L) { return convert(L, K3_DTYPE_BF16, "bf16"); }
static int m_half(lua_State *L) { return convert(L, K3_DTYPE_F16, "half"); }

/* ---- cat and stack --------------------------------------------------------------------------- */

/* The list of tensors at argument 1 into a Lua-owned array (pushed); returns the count. */
static int check_list(lua_State *L, const k3_tensor ***ts) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
    if (n < 1) return k3l_arg_error(L, 1, "expected a non-empty list of tensors");
    if (n > 1 << 20)
        return k3l_arg_error(L, 1, "at most %d tensors; got %I", 1 << 20, (LUA_INTEGER)n);
    /* a list only: a named field ({a, dim = 2}) would otherwise be dropped silently */
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > n) {
            const char *type = luaL_typename(L, -1);
            return k3l_arg_error(L, 1, "expected a list of tensors; got key [%s] (a %s)",
                                 luaL_tolstring(L, -1, NULL), type);
        }
    }
    *ts = lua_newuserdatauv(L, (size_t)n * sizeof **ts, 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 1, i);
        k3l_tensor_ud *u = luaL_testudata(L, -1, K3L_TENSOR_MT);
        if (!u)
            k3l_arg_error(L, 1, "element %I must be a k3.Tensor; got %s", (LUA_INTEGER)i,
                          luaL_typename(L, -1));
        if (!u->t) k3l_arg_error(L, 1, "element %I: tensor has been freed", (LUA_INTEGER)i);
        (*ts)[i - 1] = k3l_check_tensor(L, -1);
        lua_pop(L, 1); /* the list keeps it alive */
    }
    return (int)n;
}

/* The 1-based dim at argument 2 (default 1) in 1..hi, returned 0-based. */
static int check_dim(lua_State *L, int hi) {
    lua_Integer d = luaL_optinteger(L, 2, 1);
    if (d < 1 || d > hi)
        k3l_arg_error(L, 2, "dim %I is out of range (expected 1..%d)", (LUA_INTEGER)d, hi);
    return (int)(d - 1);
}

/* k3.cat(list, d = 1) -> the tensors joined along dim d (same dtype, device and sizes but d). */
static int l_cat(lua_State *L) {
    k3l_check_last_arg(L, 2);
    lua_settop(L, 2); /* the list's array goes above the arguments */
    const k3_tensor **ts;
    int n = check_list(L, &ts);
    int d = check_dim(L, k3_tensor_ndim(ts[0]) > 0 ? k3_tensor_ndim(ts[0]) : 1);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_cat(&u->t, ts, n, d));
    return 1;
}

/* k3.stack(list, d = 1) -> the tensors (of one shape) along a new dim d, 1..ndim + 1. */
static int l_stack(lua_State *L) {
    k3l_check_last_arg(L, 2);
    lua_settop(L, 2);
    const k3_tensor **ts;
    int n = check_list(L, &ts);
    int d = check_dim(L, k3_tensor_ndim(ts[0]) + 1);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_stack(&u->t, ts, n, d));
    return 1;
}

/* ---- ranges ---------------------------------------------------------------------------------- */

/* The options table after the numbers (the first table argument from idx on), or 0. */
static int trailing_opts(lua_State *L, int from) {
    int top = lua_gettop(L);
    return top >= from && lua_istable(L, top) ? top : 0;
}

/* Pushes arange's n integers a + i * step, each rounded once to dt (k3_int64_to_dtype) where a
 * double cannot hold them (beyond 2^53): made on the host, then moved to the device. */
static int arange_integers(lua_State *L, lua_Integer a, lua_Integer step, int64_t n,
                           k3l_create_opts o) {
    k3l_tensor_ud *u = k3l_push_tensor(L);
    k3_tensor *h;
    CHECK_K3_AS(L, "arange", k3_tensor_empty(&h, 1, &n, o.dtype, (k3_device){K3_DEVICE_CPU, 0}));
    k3_status s = K3_OK;
    for (int64_t i = 0; i < n && s == K3_OK; i++)
        s = k3_tensor_set(h, &i, k3_int64_to_dtype((int64_t)(a + (lua_Integer)i * step), o.dtype));
    if (s == K3_OK && o.device.type == K3_DEVICE_CPU) {
        u->t = h;
        return 1;
    }
    if (s == K3_OK) K3L_RUN(s, k3_tensor_to(&u->t, h, o.device, o.dtype));
    k3_tensor_free(h);
    if (s != K3_OK) return k3l_raise_as(L, "arange");
    return 1;
}

/* k3.arange(a, b [, step], opts) or k3.arange(b, opts) -> the 1-dim tensor a, a + step, ...
 * below b (above b for step < 0), half-open as PyTorch: ceil((b - a) / step) elements (exact
 * for integer arguments), element i = a + i * step rounded once; opts {dtype, device}. */
static int l_arange(lua_State *L) {
    int opts = trailing_opts(L, 2);
    int nnum = opts ? opts - 1 : lua_gettop(L);
    if (nnum < 1 || nnum > 3)
        return luaL_error(L,
                          "arange: expected arange(a, b [, step] [, opts]) or arange(b [, opts]); "
                          "got %d numbers", nnum);
    for (int i = 1; i <= nnum; i++) luaL_checknumber(L, i);
    int ints = 1;
    for (int i = 1; i <= nnum; i++) ints = ints && lua_isinteger(L, i);
    double a = nnum >= 2 ? lua_tonumber(L, 1) : 0, b = lua_tonumber(L, nnum >= 2 ? 2 : 1);
    double step = nnum == 3 ? lua_tonumber(L, 3) : 1;
    if (!isfinite(a) || !isfinite(b) || !isfinite(step))
        return luaL_error(L, "arange: start, end and step must be finite");
    if (step == 0) return k3l_arg_error(L, 3, "step must not be zero");
    double count;
    lua_Integer ia = 0, is = 1;
    if (ints) {
        ia = nnum >= 2 ? lua_tointeger(L, 1) : 0;
        lua_Integer ib = lua_tointeger(L, nnum >= 2 ? 2 : 1);
        is = nnum == 3 ? lua_tointeger(L, 3) : 1;
        /* ceil((b - a) / step) in integers; the difference in double only when it would
         * overflow (beyond 2^63 the count cannot be allocated anyway). */
        lua_Integer diff;
        if (__builtin_sub_overflow(ib, ia, &diff)) {
            count = ceil(((double)ib - (double)ia) / (double)is);
        } else {
            lua_Integer q = diff / is, r = diff % is;
            if (r != 0 && ((r > 0) == (is > 0))) q++;
            count = (double)q;
        }
    } else {
        count = ceil((b - a) / step);
    }
    if (count < 0)
        return luaL_error(L, "arange: end %f is on the wrong side of start %f for step %f",
                          b, a, step);
    if (!(count < 9.2e18)) return luaL_error(L, "arange: too many elements (%f)", count);
    k3l_create_opts o = k3l_check_create_opts(L, opts ? opts : lua_gettop(L) + 1);
    if (ints && count > 0 && count < 0x1p53) {
        /* The last element lies between a and b, so a + (n - 1) step does not overflow. */
        lua_Integer last = ia + (lua_Integer)(count - 1) * is, big = (lua_Integer)1 << 53;
        if (ia > big || ia < -big || last > big || last < -big)
            return arange_integers(L, ia, is, (int64_t)count, o);
    }
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_arange(&u->t, a, step, (int64_t)count, o.dtype, o.device));
    return 1;
}

/* k3.linspace(a, b, n, opts) -> n points from a to b inclusive (PyTorch's formula: both ends
 * exact), each rounded once; opts {dtype, device}. */
static int l_linspace(lua_State *L) {
    double a = luaL_checknumber(L, 1), b = luaL_checknumber(L, 2);
    lua_Integer n = luaL_checkinteger(L, 3);
    if (n < 0) return k3l_arg_error(L, 3, "n must be >= 0; got %I", (LUA_INTEGER)n);
    k3l_create_opts o = k3l_check_create_opts(L, 4);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_linspace(&u->t, a, b, (int64_t)n, o.dtype, o.device));
    return 1;
}

/* k3.equal(a, b) -> true when a and b have the same shape and equal values (NaN equals
 * nothing, as torch.equal); any dtypes and devices. */
static int l_equal(lua_State *L) {
    k3_tensor *a = k3l_check_tensor(L, 1), *b = k3l_check_tensor(L, 2);
    int eq;
    CHECK_K3(L, k3_tensor_equal(a, b, &eq));
    lua_pushboolean(L, eq);
    return 1;
}

/* ---- registration ---------------------------------------------------------------------------- */

/* t / u, t / s, s / t: elementwise division, each quotient rounded once (k3_tensor_binary). */
static int t_div(lua_State *L) { return k3l_tensor_arith(L, K3_DIV, "divide"); }

void k3l_add_tensor_op_methods(lua_State *L) {
    static const luaL_Reg methods[] = {{"float", m_float}, {"double", m_double}, {"bf16", m_bf16},
                                       {"half", m_half},   {NULL, NULL}};
    luaL_setfuncs(L, methods, 0);
    k3l_add_op_methods(L);
    lua_pushcfunction(L, t_div);
    lua_setfield(L, -3, "__div"); /* the metatable, below the methods table */
}

void k3l_open_tensor_ops(lua_State *L) {
    static const luaL_Reg funcs[] = {{"cat", l_cat},           {"stack", l_stack},
                                     {"arange", l_arange},     {"linspace", l_linspace},
                                     {"equal", l_equal},       {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
}
