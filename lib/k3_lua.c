/*
 * k3_lua.c — the Lua 5.4 binding, and the only file of k3 that includes lua.h. Tensors are
 * full userdata ("k3.Tensor") holding one k3_tensor handle; methods, linear methods and the
 * compiled policy likewise. Every C call's temporaries are freed before a Lua error is raised.
 * Dims and indices are 1-based here and 0-based in the C API: the binding converts them and
 * calls the core's *_base variants with base 1, so the core's own checks report them as the
 * Lua caller counts (k3_impl.h, "message numbering").
 */
#include "k3_impl.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TENSOR_MT "k3.Tensor"
#define METHOD_MT "k3.Method"
#define POLICY_MT "k3.Policy"
#define REG_POLICY "k3.policy.compiled"
#define REG_TRACE "k3.trace"
#define REG_STATS "k3.stats.sink"
#define STATS_MT "k3.StatsSink"

typedef struct {
    k3_tensor *t; /* NULL once freed */
} tensor_ud;

/* Raises the thread's last k3 error as a Lua error. Callers free their temporaries first. */
static int raise_k3(lua_State *L) { return luaL_error(L, "%s", k3_last_error()); }

/* Raises the thread's last k3 error under the name of the function the user called: the core
 * names its own entry point (k3.zeros runs k3_tensor_full, so "full: ..."; t:clone runs
 * k3_tensor_to, so "to: ..."), and a leading "<identifier>: " is replaced by "<fname>: ".
 * A message without such a prefix ("tensor has been freed", "CUDA error on cuda:0: ...") is
 * raised as it is. */
static int raise_k3_as(lua_State *L, const char *fname) {
    const char *msg = k3_last_error();
    const char *p = msg;
    while (*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
           (p > msg && *p >= '0' && *p <= '9'))
        p++;
    if (p > msg && p[0] == ':' && p[1] == ' ') return luaL_error(L, "%s: %s", fname, p + 2);
    return luaL_error(L, "%s", msg);
}

/* CHECK_K3 for a call the user knows by another name (see raise_k3_as). */
#define CHECK_K3_AS(L, fname, expr)                                                        \
    do {                                                                                   \
        if ((expr) != K3_OK) return raise_k3_as(L, fname);                                 \
    } while (0)

#define CHECK_K3(L, expr)                                                                  \
    do {                                                                                   \
        if ((expr) != K3_OK) return raise_k3(L);                                           \
    } while (0)

/* Raises "bad argument #arg to 'fname' (msg)" like luaL_argerror: a method call does not
 * count self, and the called name is used when Lua knows it. */
static int arg_error(lua_State *L, int arg, const char *fname, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const char *msg = lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_Debug ar;
    if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar)) {
        if (ar.namewhat && strcmp(ar.namewhat, "method") == 0) arg--;
        if (ar.name) fname = ar.name;
    }
    return luaL_error(L, "bad argument #%d to '%s' (%s)", arg, fname, msg);
}

static double opt_number_field(lua_State *L, int idx, const char *field, double dflt, int argn,
                               const char *fname);

/* Pushes user input as a message echoes it (k3_echo: at most 200 bytes, marked when cut) and
 * returns it; for messages raised right after, so the pushed string needs no popping. */
static const char *push_echo(lua_State *L, const char *s) {
    char e[K3_ECHO_SIZE];
    return lua_pushstring(L, k3_echo(e, sizeof e, s));
}

/* ---- tensor userdata ------------------------------------------------------------------------ */

/* A new userdata in the closed (NULL) state, pushed before anything is allocated, so an
 * allocation error in Lua cannot leak a handle. */
static tensor_ud *push_tensor_slot(lua_State *L) {
    tensor_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->t = NULL;
    luaL_setmetatable(L, TENSOR_MT);
    return u;
}

static tensor_ud *check_tensor_ud(lua_State *L, int idx) {
    return luaL_checkudata(L, idx, TENSOR_MT);
}

/* The live tensor at idx; raises "tensor has been freed" for a freed handle or storage. */
static k3_tensor *check_tensor(lua_State *L, int idx) {
    tensor_ud *u = check_tensor_ud(L, idx);
    if (!u->t) luaL_error(L, "tensor has been freed");
    if (k3_tensor_check(u->t, NULL) != K3_OK) luaL_error(L, "%s", k3_last_error());
    return u->t;
}

/* An optional tensor field of the table at idx: nil -> NULL; otherwise it must be a tensor.
 * The tensor is LEFT ON THE STACK so it stays alive until the op returns: the table may be a
 * proxy whose __index makes a fresh tensor that nothing else references. */
static k3_tensor *opt_tensor_field(lua_State *L, int idx, const char *field, int argn,
                                   const char *fname) {
    luaL_checkstack(L, 2, "k3: too many arguments");
    if (lua_getfield(L, idx, field) == LUA_TNIL) {
        lua_pop(L, 1);
        return NULL;
    }
    if (!luaL_testudata(L, -1, TENSOR_MT))
        arg_error(L, argn, fname, "field '%s' must be a k3.Tensor; got %s", field,
                  luaL_typename(L, -1));
    return check_tensor(L, lua_gettop(L));
}

static int tensor_gc(lua_State *L) {
    tensor_ud *u = check_tensor_ud(L, 1);
    k3_tensor_free(u->t);
    u->t = NULL;
    return 0;
}

/* t:free(): releases the storage's memory now; this and every view sharing the storage then
 * raise "tensor has been freed". Safe to call twice. */
static int tensor_free(lua_State *L) {
    tensor_ud *u = check_tensor_ud(L, 1);
    k3_tensor_release(u->t);
    u->t = NULL;
    return 0;
}

/* ---- argument parsing -------------------------------------------------------------------------- */

static int64_t check_int_field(lua_State *L, int argn, const char *fname, int idx, int i) {
    lua_geti(L, idx, i);
    int isnum = 0;
    lua_Integer v = lua_tointegerx(L, -1, &isnum);
    if (!isnum) {
        const char *got = lua_type(L, -1) == LUA_TNUMBER ? "a non-integer number"
                                                          : luaL_typename(L, -1);
        arg_error(L, argn, fname, "shape[%d] must be an integer; got %s", i, got);
    }
    lua_pop(L, 1);
    return (int64_t)v;
}

/* Reads a shape table {d1, ..., dn} (1 <= n <= 8, each an integer; negative sizes are left
 * to the callee when allow_neg). Returns n. */
static int check_shape(lua_State *L, int idx, int64_t *shape, const char *fname, int allow_neg) {
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer n = luaL_len(L, idx);
    if (n < 1 || n > K3_MAX_DIMS)
        arg_error(L, idx, fname, "shape must have 1 to %d dims; got %d", K3_MAX_DIMS, (int)n);
    for (int i = 1; i <= n; i++) {
        shape[i - 1] = check_int_field(L, idx, fname, idx, i);
        if (!allow_neg && shape[i - 1] < 0)
            arg_error(L, idx, fname, "size of dim %d must be >= 0; got %I", i, (LUA_INTEGER)shape[i - 1]);
    }
    return (int)n;
}

typedef struct {
    k3_dtype dtype;
    k3_device device;
    uint64_t seed;
} create_opts;

static void check_dtype_str(lua_State *L, const char *s, int argn, const char *fname,
                            k3_dtype *out) {
    if (k3_dtype_parse(s, out) != K3_OK)
        arg_error(L, argn, fname, "unknown dtype '%s'; expected bf16, f16, f32 or f64",
                  push_echo(L, s));
}

static void check_device_str(lua_State *L, const char *s, int argn, const char *fname,
                             k3_device *out) {
    if (k3_device_parse(s, out) != K3_OK)
        arg_error(L, argn, fname, "unknown device '%s'; expected cpu, cuda or cuda:N",
                  push_echo(L, s));
}

/* Raises for a key of the options table at idx that is not in `allowed` (NULL-terminated):
 * a misspelt option ({dtyp = "f64"}) must not silently fall back to a default. */
static void check_option_keys(lua_State *L, int idx, const char *const *allowed, int argn,
                              const char *fname) {
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int ok = 0;
        if (lua_type(L, -1) == LUA_TSTRING)
            for (const char *const *a = allowed; *a && !ok; a++)
                ok = strcmp(lua_tostring(L, -1), *a) == 0;
        if (!ok) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            for (const char *const *a = allowed; *a; a++) {
                if (a != allowed) luaL_addstring(&b, a[1] ? ", " : " or ");
                luaL_addstring(&b, *a);
            }
            luaL_pushresult(&b);
            const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2)
                                                             : luaL_typename(L, -2);
            const char *expected = lua_tostring(L, -1);
            arg_error(L, argn, fname, "unknown option '%s' (expected %s)", push_echo(L, key),
                      expected);
        }
    }
}

static create_opts check_create_opts(lua_State *L, int idx, const char *fname) {
    static const char *const keys[] = {"dtype", "device", "seed", NULL};
    create_opts o = {K3_DTYPE_F32, {K3_DEVICE_CPU, 0}, 0};
    if (lua_isnoneornil(L, idx)) return o;
    luaL_checktype(L, idx, LUA_TTABLE);
    check_option_keys(L, idx, keys, idx, fname);
    if (lua_getfield(L, idx, "dtype") != LUA_TNIL) {
        if (lua_type(L, -1) != LUA_TSTRING)
            arg_error(L, idx, fname, "dtype must be a string; got %s", luaL_typename(L, -1));
        check_dtype_str(L, lua_tostring(L, -1), idx, fname, &o.dtype);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, idx, "device") != LUA_TNIL) {
        if (lua_type(L, -1) != LUA_TSTRING)
            arg_error(L, idx, fname, "device must be a string; got %s", luaL_typename(L, -1));
        check_device_str(L, lua_tostring(L, -1), idx, fname, &o.device);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, idx, "seed") != LUA_TNIL) {
        int isnum;
        lua_Integer s = lua_tointegerx(L, -1, &isnum);
        if (!isnum)
            arg_error(L, idx, fname, "seed must be an integer");
        o.seed = (uint64_t)s;
    }
    lua_pop(L, 1);
    return o;
}

/* 1-based dimension argument -> 0-based, checked against ndim. */
static int check_dim_arg(lua_State *L, int argn, const k3_tensor *t, const char *fname) {
    lua_Integer d = luaL_checkinteger(L, argn);
    int nd = k3_tensor_ndim(t);
    if (nd == 0) /* a 0-dim tensor (select of a 1-dim one) has no dim to name */
        luaL_argerror(L, argn,
                      lua_pushfstring(L, "the tensor has 0 dims (one element: use get()); got "
                                         "dim %I", (LUA_INTEGER)d));
    if (d < 1 || d > nd)
        luaL_argerror(L, argn,
                      lua_pushfstring(L, "dim must be in 1..%d; got %I", nd, (LUA_INTEGER)d));
    (void)fname;
    return (int)d - 1;
}

/* ---- creation -------------------------------------------------------------------------------- */

/* A value for a tensor of dtype dt: a Lua integer is rounded once to dt
 * (k3_int64_to_dtype: through a double it would round twice above 2^53), a float is passed
 * as it is (the core rounds it once). */
static double check_value(lua_State *L, int idx, k3_dtype dt) {
    if (lua_isinteger(L, idx)) return k3_int64_to_dtype((int64_t)lua_tointeger(L, idx), dt);
    return luaL_checknumber(L, idx);
}

/* value_idx: the stack slot of k3.full's value (0 for the other constructors, which pass
 * `value`). */
static int create_filled(lua_State *L, const char *fname, int shape_idx, int opts_idx,
                         int kind, double value, int value_idx) {
    int64_t shape[K3_MAX_DIMS];
    int nd = check_shape(L, shape_idx, shape, fname, 0);
    create_opts o = check_create_opts(L, opts_idx, fname);
    if (value_idx) value = check_value(L, value_idx, o.dtype);
    tensor_ud *u = push_tensor_slot(L);
    k3_status s;
    if (kind == 0)
        s = k3_tensor_new(&u->t, nd, shape, o.dtype, o.device, "empty", 1);
    else if (kind == 1)
        s = k3_tensor_full_base(&u->t, nd, shape, o.dtype, o.device, value, 1);
    else
        s = k3_tensor_randn_base(&u->t, nd, shape, o.dtype, o.device, o.seed, 1);
    CHECK_K3_AS(L, fname, s);
    return 1;
}

/* k3.empty(shape, opts) -> uninitialised tensor (see API.md for opts). */
static int l_empty(lua_State *L) { return create_filled(L, "empty", 1, 2, 0, 0, 0); }
/* k3.zeros(shape, opts) */
static int l_zeros(lua_State *L) { return create_filled(L, "zeros", 1, 2, 1, 0, 0); }
/* k3.ones(shape, opts) */
static int l_ones(lua_State *L) { return create_filled(L, "ones", 1, 2, 1, 1, 0); }
/* k3.full(shape, value, opts) */
static int l_full(lua_State *L) {
    luaL_checknumber(L, 2); /* its type first, as before the shape */
    return create_filled(L, "full", 1, 3, 1, 0, 2);
}
/* k3.randn(shape, opts): standard normal, counter-based (opts.seed, default 0). */
static int l_randn(lua_State *L) { return create_filled(L, "randn", 1, 2, 2, 0, 0); }

/* A list of k3.tensor's nested table at idx: its raw length, after checking that its keys are
 * exactly 1..n (a hole or a named field would otherwise be dropped without a word). Raw
 * access throughout: metamethods cannot change the shape between the two walks. */
static lua_Integer nested_len(lua_State *L, int idx, int depth) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > n) {
            lua_pushvalue(L, -1);
            const char *k = luaL_tolstring(L, -1, NULL);
            luaL_error(L, "bad argument #1 to 'tensor' (a list at depth %d has key %s%s%s; "
                          "expected only the indices 1..%I: a list without holes or named "
                          "fields)",
                       depth + 1, lua_type(L, -3) == LUA_TSTRING ? "'" : "", k,
                       lua_type(L, -3) == LUA_TSTRING ? "'" : "", (LUA_INTEGER)n);
        }
    }
    return n;
}

/* luaL_checkoption with a message that lists the accepted names: "unknown op 'x'; expected
 * linear, attn_res, rms_norm or silu_mul" (what names the kind of value). */
static int check_name_in(lua_State *L, int arg, const char *def, const char *const names[],
                         const char *fname, const char *what) {
    const char *got = def ? luaL_optstring(L, arg, def) : luaL_checkstring(L, arg);
    int n = 0;
    for (; names[n]; n++)
        if (strcmp(names[n], got) == 0) return n;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; i < n; i++) {
        if (i) luaL_addstring(&b, i == n - 1 ? " or " : ", ");
        luaL_addstring(&b, names[i]);
    }
    luaL_pushresult(&b);
    const char *expected = lua_tostring(L, -1);
    return arg_error(L, arg, fname, "unknown %s '%s'; expected %s", what, push_echo(L, got),
                     expected);
}

/* Walks a nested table: discovers the shape from the first item at each depth. */
static void nested_shape(lua_State *L, int idx, int depth, int *nd, int64_t *shape) {
    if (depth >= K3_MAX_DIMS)
        luaL_error(L, "bad argument #1 to 'tensor' (more than %d levels of nesting)",
                   K3_MAX_DIMS);
    lua_Integer n = nested_len(L, idx, depth);
    shape[depth] = n;
    (*nd)++;
    if (n > 0) {
        lua_rawgeti(L, idx, 1);
        if (lua_istable(L, -1)) nested_shape(L, lua_gettop(L), depth + 1, nd, shape);
        lua_pop(L, 1);
    }
}

/* Fills out (numel values, row-major) and checks every list against the shape. */
static void nested_fill(lua_State *L, int idx, int depth, int nd, const int64_t *shape,
                        k3_dtype dt, double *out, int64_t *pos) {
    for (lua_Integer i = 1; i <= shape[depth]; i++) {
        lua_rawgeti(L, idx, i);
        if (depth == nd - 1) {
            if (lua_type(L, -1) != LUA_TNUMBER)
                luaL_error(L, "bad argument #1 to 'tensor' (expected a number at depth %d; got "
                           "%s)",
                           depth + 1, luaL_typename(L, -1));
            out[(*pos)++] = check_value(L, -1, dt);
        } else {
            if (!lua_istable(L, -1))
                luaL_error(L, "bad argument #1 to 'tensor' (expected a list at depth %d; got "
                           "%s)",
                           depth + 2, luaL_typename(L, -1));
            lua_Integer n = nested_len(L, lua_gettop(L), depth + 1);
            if (n != shape[depth + 1])
                luaL_error(L, "bad argument #1 to 'tensor' (ragged nesting: a list at depth %d "
                           "has %I items, expected %I)",
                           depth + 2, (LUA_INTEGER)n, (LUA_INTEGER)shape[depth + 1]);
            nested_fill(L, lua_gettop(L), depth + 1, nd, shape, dt, out, pos);
        }
        lua_pop(L, 1);
    }
}

/* k3.tensor(nested_table, opts): values from nested Lua lists (plain tables: keys 1..n, no
 * holes; metamethods are not consulted), rounded once to dtype. */
static int l_tensor(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    create_opts o = check_create_opts(L, 2, "tensor");
    int64_t shape[K3_MAX_DIMS];
    int nd = 0;
    nested_shape(L, 1, 0, &nd, shape);
    /* Lists can share sub-lists, so the element count can exceed memory or int64 (65536 items
     * nested 4 deep is 2^64): checked before the value buffer is sized from it. */
    int64_t numel = 1;
    for (int i = 0; i < nd; i++)
        if (!k3_mul_ok(numel, shape[i], &numel) || numel > (int64_t)(SIZE_MAX / sizeof(double)))
            luaL_error(L, "bad argument #1 to 'tensor' (the nested lists' shape has more "
                          "elements than memory can hold: sizes overflow at depth %d)",
                       i + 1);
    /* The value buffer is a userdata so a Lua error while filling cannot leak it. */
    double *vals = lua_newuserdatauv(L, (size_t)(numel ? numel : 1) * sizeof(double), 0);
    int64_t pos = 0;
    nested_fill(L, 1, 0, nd, shape, o.dtype, vals, &pos);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3_AS(L, "tensor",
                k3_tensor_from_f64_base(&u->t, nd, shape, o.dtype, o.device, vals, 1));
    return 1;
}

/* ---- metadata -------------------------------------------------------------------------------- */

static int push_dims(lua_State *L, int nd, const int64_t *v, int argn) {
    if (!lua_isnoneornil(L, argn)) {
        lua_Integer d = luaL_checkinteger(L, argn);
        if (nd == 0)
            return luaL_argerror(L, argn,
                                 lua_pushfstring(L, "the tensor has 0 dims; got dim %I",
                                                 (LUA_INTEGER)d));
        if (d < 1 || d > nd)
            return luaL_argerror(
                L, argn, lua_pushfstring(L, "dim must be in 1..%d; got %I", nd, (LUA_INTEGER)d));
        lua_pushinteger(L, (lua_Integer)v[d - 1]);
        return 1;
    }
    lua_createtable(L, nd, 0);
    for (int i = 0; i < nd; i++) {
        lua_pushinteger(L, (lua_Integer)v[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* t:size() -> {d1, ...}; t:size(d) -> integer */
static int m_size(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    return push_dims(L, t->ndim, t->size, 2);
}
/* t:stride() -> {s1, ...} in elements; t:stride(d) -> integer */
static int m_stride(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    return push_dims(L, t->ndim, t->stride, 2);
}
static int m_dim(lua_State *L) {
    lua_pushinteger(L, check_tensor(L, 1)->ndim);
    return 1;
}
static int m_numel(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)k3_tensor_numel(check_tensor(L, 1)));
    return 1;
}
/* t:offset() -> storage offset in elements */
static int m_offset(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)check_tensor(L, 1)->offset);
    return 1;
}
static int m_dtype(lua_State *L) {
    lua_pushstring(L, k3_dtype_name(check_tensor(L, 1)->dtype));
    return 1;
}
static int m_device(lua_State *L) {
    char buf[32];
    lua_pushstring(L, k3_device_name(k3_tensor_device(check_tensor(L, 1)), buf, sizeof buf));
    return 1;
}
static int m_is_contiguous(lua_State *L) {
    lua_pushboolean(L, k3_tensor_is_contiguous(check_tensor(L, 1)));
    return 1;
}

/* ---- views ------------------------------------------------------------------------------------ */

/* t:narrow(d, start, length): elements start..start+length-1 of dim d (1-based), a view. */
static int m_narrow(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int d = check_dim_arg(L, 2, t, "narrow");
    lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_narrow_base(&u->t, t, d, (int64_t)((uint64_t)start - 1),
                                      (int64_t)len, 1));
    return 1;
}

/* t:select(d, i): the slice at index i of dim d, with dim d removed; a view. */
static int m_select(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int d = check_dim_arg(L, 2, t, "select");
    lua_Integer i = luaL_checkinteger(L, 3);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_select_base(&u->t, t, d, (int64_t)((uint64_t)i - 1), 1));
    return 1;
}

/* t:transpose(d1, d2): dims swapped; a view. */
static int m_transpose(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int d1 = check_dim_arg(L, 2, t, "transpose"), d2 = check_dim_arg(L, 3, t, "transpose");
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_transpose_base(&u->t, t, d1, d2, 1));
    return 1;
}

/* t:t(): transpose of a 2-D tensor. */
static int m_t(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    if (t->ndim != 2)
        return luaL_error(L, "t: expected a 2-dim tensor; got %d dims (use transpose(d1, d2))",
                          t->ndim);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_transpose(&u->t, t, 0, 1));
    return 1;
}

/* t:view(shape): same storage, new shape; t must be contiguous; one size may be -1. */
static int m_view(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int64_t shape[K3_MAX_DIMS];
    int nd = check_shape(L, 2, shape, "view", 1);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_view_base(&u->t, t, nd, shape, 1));
    return 1;
}

/* t:expand(shape): size-1 dims broadcast with stride 0 (-1 keeps a size); a view. */
static int m_expand(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int64_t shape[K3_MAX_DIMS];
    int nd = check_shape(L, 2, shape, "expand", 1);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_expand_base(&u->t, t, nd, shape, 1));
    return 1;
}

/* t:as_strided(shape, stride, offset): an arbitrary view, checked against the storage. */
static int m_as_strided(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int64_t shape[K3_MAX_DIMS], stride[K3_MAX_DIMS];
    int nd = check_shape(L, 2, shape, "as_strided", 1);
    int ns = check_shape(L, 3, stride, "as_strided", 1);
    if (ns != nd)
        return luaL_error(L, "as_strided: shape has %d dims but stride has %d", nd, ns);
    lua_Integer off = luaL_optinteger(L, 4, (lua_Integer)t->offset);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_as_strided_base(&u->t, t, nd, shape, stride, (int64_t)off, 1));
    return 1;
}

/* t:contiguous(): t itself when contiguous, else a contiguous copy. */
static int m_contiguous(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    if (k3_tensor_is_contiguous(t)) {
        lua_settop(L, 1);
        return 1;
    }
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3_AS(L, "contiguous", k3_tensor_to_base(&u->t, t, k3_tensor_device(t), t->dtype, 1));
    return 1;
}

/* t:clone(): a contiguous copy with the same dtype and device. */
static int m_clone(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3_AS(L, "clone", k3_tensor_to_base(&u->t, t, k3_tensor_device(t), t->dtype, 1));
    return 1;
}

/* t:to(device_or_dtype) or t:to{device =, dtype =}: a contiguous copy (always a new tensor). */
static int m_to(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    k3_device dev = k3_tensor_device(t);
    k3_dtype dt = t->dtype;
    if (lua_type(L, 2) == LUA_TSTRING) {
        const char *s = lua_tostring(L, 2);
        if (k3_dtype_parse(s, &dt) != K3_OK && k3_device_parse(s, &dev) != K3_OK)
            return luaL_argerror(
                L, 2,
                lua_pushfstring(L, "'%s' is neither a dtype (bf16, f16, f32, f64) nor a device "
                                   "(cpu, cuda, cuda:N)",
                                push_echo(L, s)));
    } else if (lua_type(L, 2) == LUA_TTABLE) {
        create_opts o = check_create_opts(L, 2, "to");
        lua_getfield(L, 2, "dtype");
        if (!lua_isnil(L, -1)) dt = o.dtype;
        lua_getfield(L, 2, "device");
        if (!lua_isnil(L, -1)) dev = o.device;
        lua_pop(L, 2);
    } else {
        return luaL_typeerror(L, 2, "string or table");
    }
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_to_base(&u->t, t, dev, dt, 1));
    return 1;
}

/* t:copy(src): copies src's values (any strides, dtype, device; same shape); returns t. */
static int m_copy(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    k3_tensor *src = check_tensor(L, 2);
    CHECK_K3(L, k3_tensor_copy_base(t, src, 1));
    lua_settop(L, 1);
    return 1;
}

/* t:fill(value): every element set to value (rounded to dtype); returns t. */
static int m_fill(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    double v = check_value(L, 2, t->dtype);
    CHECK_K3_AS(L, "fill", k3_tensor_fill(t, v));
    lua_settop(L, 1);
    return 1;
}

/* Reads ndim 1-based indices starting at argument `first`; returns 0-based in idx. */
static void check_indices(lua_State *L, const k3_tensor *t, int first, int count,
                          const char *fname, int64_t *idx) {
    if (count != t->ndim)
        luaL_error(L, "%s: expected %d ind%s for a %d-dim tensor; got %d", fname, t->ndim,
                   t->ndim == 1 ? "ex" : "ices", t->ndim, count);
    for (int i = 0; i < count; i++) idx[i] = (int64_t)((uint64_t)luaL_checkinteger(L, first + i) - 1);
}

/* t:get(i1, ..., in) -> number (synchronises for device tensors). */
static int m_get(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int64_t idx[K3_MAX_DIMS];
    check_indices(L, t, 2, lua_gettop(L) - 1, "get", idx);
    double v;
    CHECK_K3_AS(L, "get", k3_tensor_get_base(t, idx, &v, 1));
    lua_pushnumber(L, v);
    return 1;
}

/* t:set(i1, ..., in, value); returns t. */
static int m_set(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int top = lua_gettop(L);
    int64_t idx[K3_MAX_DIMS];
    double v = check_value(L, top, t->dtype);
    check_indices(L, t, 2, top - 2, "set", idx);
    CHECK_K3_AS(L, "set", k3_tensor_set_base(t, idx, v, 1));
    lua_settop(L, 1);
    return 1;
}

static void push_nested(lua_State *L, const k3_tensor *t, const double *v, int d, int64_t *pos) {
    if (d == t->ndim) {
        lua_pushnumber(L, v[(*pos)++]);
        return;
    }
    lua_createtable(L, (int)t->size[d], 0);
    for (int64_t i = 0; i < t->size[d]; i++) {
        push_nested(L, t, v, d + 1, pos);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

/* t:totable() -> nested Lua lists of numbers (a number for a 0-dim tensor). */
static int m_totable(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    int64_t n = k3_tensor_numel(t);
    double *v = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof(double), 0);
    CHECK_K3_AS(L, "totable", k3_tensor_to_f64(t, v));
    int64_t pos = 0;
    push_nested(L, t, v, 0, &pos);
    return 1;
}

/* ---- arithmetic ---------------------------------------------------------------------------------- */

static int arith(lua_State *L, k3_binop op, const char *name) {
    tensor_ud *ua = luaL_testudata(L, 1, TENSOR_MT), *ub = luaL_testudata(L, 2, TENSOR_MT);
    if (ua && ub) {
        k3_tensor *a = check_tensor(L, 1), *b = check_tensor(L, 2);
        tensor_ud *u = push_tensor_slot(L);
        CHECK_K3(L, k3_tensor_binary_base(&u->t, op, a, b, 0, 0, 1));
        return 1;
    }
    int ti = ua ? 1 : 2, si = ua ? 2 : 1;
    k3_tensor *a = check_tensor(L, ti);
    if (lua_type(L, si) != LUA_TNUMBER)
        return luaL_error(L, "attempt to %s a k3.Tensor and a %s value", name,
                          luaL_typename(L, si));
    double s = lua_tonumber(L, si);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_tensor_binary_base(&u->t, op, a, NULL, s, ti == 2, 1));
    return 1;
}
static int t_add(lua_State *L) { return arith(L, K3_ADD, "add"); }
static int t_sub(lua_State *L) { return arith(L, K3_SUB, "subtract"); }
static int t_mul(lua_State *L) { return arith(L, K3_MUL, "multiply"); }
static int t_unm(lua_State *L) {
    k3_tensor *a = check_tensor(L, 1);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3_AS(L, "unm", k3_tensor_binary_base(&u->t, K3_MUL, a, NULL, -1.0, 0, 1));
    return 1;
}

/* k3.max_abs_diff(a, b) -> number (any dtypes and devices; same shape). */
static int l_max_abs_diff(lua_State *L) {
    double v;
    CHECK_K3(L, k3_max_abs_diff(check_tensor(L, 1), check_tensor(L, 2), &v));
    lua_pushnumber(L, v);
    return 1;
}

/* k3.allclose(a, b, {atol = 1e-8, rtol = 1e-5}) -> boolean: |a-b| <= atol + rtol*|b|; NaN is
 * never close, an infinity only to the same infinity; a negative or NaN tolerance is an
 * error. */
static int l_allclose(lua_State *L) {
    k3_tensor *a = check_tensor(L, 1), *b = check_tensor(L, 2);
    double atol = 1e-8, rtol = 1e-5;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        static const char *const keys[] = {"atol", "rtol", NULL};
        check_option_keys(L, 3, keys, 3, "allclose");
        atol = opt_number_field(L, 3, "atol", atol, 3, "allclose");
        rtol = opt_number_field(L, 3, "rtol", rtol, 3, "allclose");
    }
    int ok;
    CHECK_K3(L, k3_allclose(a, b, atol, rtol, &ok));
    lua_pushboolean(L, ok);
    return 1;
}

/* k3.cosine(a, b) -> cosine similarity computed in f64; NaN when a or b is all zeros. */
static int l_cosine(lua_State *L) {
    double v;
    CHECK_K3(L, k3_cosine(check_tensor(L, 1), check_tensor(L, 2), &v));
    lua_pushnumber(L, v);
    return 1;
}

static int l_synchronize(lua_State *L) {
    CHECK_K3(L, k3_synchronize());
    return 0;
}

/* ---- registration ------------------------------------------------------------------------------------- */

static const luaL_Reg tensor_methods[] = {
    {"size", m_size},         {"stride", m_stride},       {"dim", m_dim},
    {"numel", m_numel},       {"offset", m_offset},       {"dtype", m_dtype},
    {"device", m_device},     {"is_contiguous", m_is_contiguous},
    {"narrow", m_narrow},     {"select", m_select},       {"transpose", m_transpose},
    {"t", m_t},               {"view", m_view},           {"expand", m_expand},
    {"as_strided", m_as_strided},
    {"contiguous", m_contiguous}, {"clone", m_clone},     {"to", m_to},
    {"copy", m_copy},         {"fill", m_fill},           {"get", m_get},
    {"set", m_set},           {"totable", m_totable},     {"free", tensor_free},
    {NULL, NULL}};

static const luaL_Reg tensor_meta[] = {
    {"__gc", tensor_gc}, {"__close", tensor_gc}, {"__add", t_add}, {"__sub", t_sub},
    {"__mul", t_mul},    {"__unm", t_unm},       {NULL, NULL}};

/* K3_OPS_BINDINGS: ops, dispatch, policy and methods live in the second half of the file. */
static void register_ops(lua_State *L);

static const luaL_Reg core_funcs[] = {
    {"empty", l_empty},   {"zeros", l_zeros},         {"ones", l_ones},
    {"full", l_full},     {"randn", l_randn},         {"tensor", l_tensor},
    {"max_abs_diff", l_max_abs_diff}, {"allclose", l_allclose}, {"cosine", l_cosine},
    {"synchronize", l_synchronize},   {NULL, NULL}};

static int core_is_tensor(lua_State *L) {
    lua_pushboolean(L, luaL_testudata(L, 1, TENSOR_MT) != NULL);
    return 1;
}

/* Configuration typos (an unknown name in K3_DISABLE_KERNELS, a K3_BATCH_INVARIANT that is
 * not a boolean) were sent to the log hook when the core read them; with no hook installed
 * they would vanish, so the first state to open the module writes them to stderr, once per
 * process. Loading never fails over them. */
static void report_config_warnings(void) {
    (void)k3_kernel_count();    /* sets up the registry: reads K3_DISABLE_KERNELS */
    (void)k3_batch_invariant(); /* reads K3_BATCH_INVARIANT */
    const char *w = k3_config_warnings_take();
    if (!w || k3_log_hook_set()) return;
    while (*w) {
        const char *nl = strchr(w, '\n');
        size_t len = nl ? (size_t)(nl - w) : strlen(w);
        fprintf(stderr, "k3: warning: %.*s\n", (int)len, w);
        w += len + (nl ? 1 : 0);
    }
    fflush(stderr);
}

/* luaopen_k3_core: the C half of the module (require "k3.core"); lua/k3/init.lua builds the
 * public `k3` table on it. Safe to call again in the same state (busted insulation). */
K3_API int luaopen_k3_core(lua_State *L) {
    report_config_warnings();
    if (luaL_newmetatable(L, TENSOR_MT)) {
        luaL_setfuncs(L, tensor_meta, 0);
        luaL_newlib(L, tensor_methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    luaL_newlib(L, core_funcs);
    luaL_getmetatable(L, TENSOR_MT);
    lua_setfield(L, -2, "_tensor_mt");
    lua_pushcfunction(L, core_is_tensor);
    lua_setfield(L, -2, "is_tensor");
    lua_pushstring(L, K3_VERSION_STRING);
    lua_setfield(L, -2, "version");
    register_ops(L);
    return 1;
}

/* luaopen_k3: the whole module for hosts that luaL_requiref it: loads "k3.core", then runs
 * lua/k3/init.lua found on package.path, and returns the `k3` table. */
K3_API int luaopen_k3(lua_State *L) {
    luaL_requiref(L, "k3.core", luaopen_k3_core, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "searchpath");
    lua_pushstring(L, "k3");
    lua_getfield(L, -3, "path");
    lua_call(L, 2, 2);
    if (lua_isnil(L, -2))
        return luaL_error(L, "luaopen_k3: lua/k3/init.lua not found on package.path:%s",
                          lua_tostring(L, -1));
    const char *file = lua_tostring(L, -2);
    if (luaL_loadfile(L, file) != LUA_OK) return lua_error(L);
    lua_pushstring(L, "k3");
    lua_pushstring(L, file);
    lua_call(L, 2, 1);
    return 1;
}

/* ==== ops, dispatch, policy and methods ================================================================= */

/* The compiled policy of this Lua state: made when the module is opened (the built-in
 * default candidates, and the process default of batch-invariant mode), replaced by
 * k3.set_policy, its batch-invariant mode set by k3.set_batch_invariant. Every op of the
 * state dispatches with it, so neither setting reaches another lua_State. */
typedef struct {
    k3_policy *p;      /* &storage once initialised */
    k3_policy storage; /* in Lua's memory: opening k3 makes no host allocation, so a host may
                        * still call k3_set_allocator before its first tensor */
} policy_ud;

static k3_policy *state_policy(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, REG_POLICY);
    policy_ud *u = luaL_testudata(L, -1, POLICY_MT);
    lua_pop(L, 1);
    return u ? u->p : NULL;
}

/* This state's counters (k3.stats): every dispatch an op or method of the state ran is
 * counted here as well as in the process-wide totals (k3_stats). */
static k3_stats_sink *state_stats(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, REG_STATS);
    k3_stats_sink *s = luaL_testudata(L, -1, STATS_MT);
    lua_pop(L, 1);
    return s;
}

static int policy_gc(lua_State *L) {
    policy_ud *u = luaL_checkudata(L, 1, POLICY_MT);
    u->p = NULL;
    return 0;
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
}

/* One op call's options: policy, forced kernel, explain mode and its dispatch record. */
typedef struct {
    k3_call call;
    k3_dispatch rec;
} call_ctx;

static void call_init(lua_State *L, call_ctx *c, const char *kernel, int explain) {
    memset(c, 0, sizeof *c);
    c->call.policy = state_policy(L);
    c->call.kernel = kernel;
    c->call.explain_only = explain;
    c->call.record = &c->rec;
}

/* After a successful op: append the decision to the active k3.trace, if any. */
static void trace_record(lua_State *L, const call_ctx *c) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, REG_TRACE) == LUA_TTABLE) {
        push_dispatch(L, &c->rec);
        lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
    }
    lua_pop(L, 1);
}

/* Reads opts.kernel (a string) from the table at idx, or NULL. The string stays valid while
 * the table is on the stack. */
static const char *opt_kernel(lua_State *L, int idx, int argn, const char *fname) {
    if (idx == 0 || !lua_istable(L, idx)) return NULL;
    luaL_checkstack(L, 2, "k3: too many arguments");
    int ty = lua_getfield(L, idx, "kernel");
    if (ty == LUA_TSTRING) return lua_tostring(L, -1); /* left on the stack: stays alive */
    if (ty != LUA_TNIL)
        arg_error(L, argn, fname, "field 'kernel' must be a string; got %s", luaL_typename(L, -1));
    lua_pop(L, 1);
    return NULL;
}

static double opt_number_field(lua_State *L, int idx, const char *field, double dflt, int argn,
                               const char *fname) {
    double v = dflt;
    int ty = lua_getfield(L, idx, field);
    if (ty == LUA_TNUMBER)
        v = lua_tonumber(L, -1);
    else if (ty != LUA_TNIL)
        arg_error(L, argn, fname, "field '%s' must be a number; got %s", field, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

/* Pushes the op's result: the `out` userdata at out_idx (when given) or a fresh slot. */
static tensor_ud *result_slot(lua_State *L, int out_idx, int explain) {
    if (explain) return NULL;
    if (out_idx) {
        lua_pushvalue(L, out_idx);
        return NULL;
    }
    return push_tensor_slot(L);
}

/* explain's mode: k3.explain (an op's) or m:explain (a method's). */
enum { EXPLAIN_OP = 1, EXPLAIN_METHOD = 2 };

/* Statuses by which an op refuses its arguments (validation), as opposed to a failure of
 * the machine (memory, CUDA, an internal error). */
static bool refuses_args(k3_status s) {
    return s == K3_EINVAL || s == K3_ESHAPE || s == K3_ELAYOUT || s == K3_EDTYPE ||
           s == K3_EDEVICE || s == K3_EOVERFLOW;
}

/* Finishes an op: raise on error, push the explain record, or count the call in this
 * state's counters and record the trace. */
static int op_finish(lua_State *L, k3_status s, call_ctx *c, int explain) {
    /* explain answers for the dispatch itself: when no candidate accepts, or a fast kernel's
     * layout error would be raised (policy "error"), the record is the decision: no chosen
     * kernel, every decline, and the error the call would raise. k3.explain still raises
     * on invalid arguments (nothing was dispatched); a method's explain answers for them
     * too, since the method decided something first (k3_method_apply writes its declines,
     * the low-latency one included, to the record before the owned default refuses). */
    if (explain && c->rec.op[0] && !c->rec.chosen[0] &&
        (s == K3_ENOKERNEL || (s == K3_ELAYOUT && c->rec.ndeclined > 0) ||
         (explain == EXPLAIN_METHOD && refuses_args(s)))) {
        push_dispatch(L, &c->rec);
        lua_pushstring(L, k3_last_error());
        lua_setfield(L, -2, "error");
        return 1;
    }
    if (s != K3_OK) return raise_k3(L);
    if (explain) {
        push_dispatch(L, &c->rec);
        return 1;
    }
    k3_stats_sink_count(state_stats(L), &c->rec);
    trace_record(L, c);
    return 1;
}

/* Index of opts.out on the stack (pushed), or 0. */
static int opt_out(lua_State *L, int opts, int argn, const char *fname) {
    if (!opts || !lua_istable(L, opts)) return 0;
    if (lua_getfield(L, opts, "out") == LUA_TNIL) {
        lua_pop(L, 1);
        return 0;
    }
    if (!luaL_testudata(L, -1, TENSOR_MT))
        arg_error(L, argn, fname, "field 'out' must be a k3.Tensor; got %s", luaL_typename(L, -1));
    check_tensor(L, lua_gettop(L));
    return lua_gettop(L);
}

/* k3.linear(x, w, {bias =, residual =, out =, kernel =}) -> y[M,N] = x[M,K] w[N,K]^T (+bias)
 * (+residual). */
static int linear_impl(lua_State *L, int base, int explain) {
    const char *fname = "linear";
    k3_tensor *x = check_tensor(L, base), *w = check_tensor(L, base + 1);
    static const char *const keys[] = {"bias", "residual", "out", "kernel", NULL};
    int opts = base + 2;
    if (!lua_isnoneornil(L, opts)) {
        luaL_checktype(L, opts, LUA_TTABLE);
        check_option_keys(L, opts, keys, opts, fname);
    } else {
        opts = 0;
    }
    k3_tensor *bias = opts ? opt_tensor_field(L, opts, "bias", opts, fname) : NULL;
    k3_tensor *res = opts ? opt_tensor_field(L, opts, "residual", opts, fname) : NULL;
    int out_idx = opt_out(L, opts, opts, fname);
    k3_tensor *out = out_idx ? check_tensor(L, out_idx) : NULL;
    call_ctx c;
    call_init(L, &c, opt_kernel(L, opts, opts, fname), explain);
    tensor_ud *u = result_slot(L, out_idx, explain);
    k3_status s = k3_linear_ext(u ? &u->t : NULL, x, w, bias, res, out, &c.call, NULL, NULL, 1);
    return op_finish(L, s, &c, explain);
}
static int l_linear(lua_State *L) { return linear_impl(L, 1, 0); }

/* k3.rms_norm(x, w, eps) or k3.rms_norm(x, w, {eps =, out =, kernel =}) or
 * k3.rms_norm(x, w, eps, {out =, kernel =}). */
static int rms_norm_impl(lua_State *L, int base, int explain) {
    const char *fname = "rms_norm";
    k3_tensor *x = check_tensor(L, base), *w = check_tensor(L, base + 1);
    static const char *const keys[] = {"eps", "out", "kernel", NULL};
    double eps = 1e-5;
    int opts = 0;
    if (lua_type(L, base + 2) == LUA_TNUMBER) {
        eps = lua_tonumber(L, base + 2);
        if (!lua_isnoneornil(L, base + 3)) {
            luaL_checktype(L, base + 3, LUA_TTABLE);
            opts = base + 3;
            check_option_keys(L, opts, keys + 1, opts, fname);
        }
    } else if (!lua_isnoneornil(L, base + 2)) {
        if (!lua_istable(L, base + 2))
            return arg_error(L, base + 2, fname, "eps (a number) or an options table expected; "
                             "got %s", luaL_typename(L, base + 2));
        opts = base + 2;
        check_option_keys(L, opts, keys, opts, fname);
        eps = opt_number_field(L, opts, "eps", eps, opts, fname);
    }
    int out_idx = opt_out(L, opts, opts, fname);
    k3_tensor *out = out_idx ? check_tensor(L, out_idx) : NULL;
    call_ctx c;
    call_init(L, &c, opt_kernel(L, opts, opts, fname), explain);
    tensor_ud *u = result_slot(L, out_idx, explain);
    k3_status s = k3_rms_norm_base(u ? &u->t : NULL, x, w, eps, out, &c.call, 1);
    return op_finish(L, s, &c, explain);
}
static int l_rms_norm(lua_State *L) { return rms_norm_impl(L, 1, 0); }

/* k3.silu_mul(x, {out =, kernel =}) -> y[M,I] = silu(x[:, 1..I]) * x[:, I+1..2I]. */
static int silu_mul_impl(lua_State *L, int base, int explain) {
    const char *fname = "silu_mul";
    k3_tensor *x = check_tensor(L, base);
    int opts = 0;
    if (!lua_isnoneornil(L, base + 1)) {
        static const char *const keys[] = {"out", "kernel", NULL};
        luaL_checktype(L, base + 1, LUA_TTABLE);
        opts = base + 1;
        check_option_keys(L, opts, keys, opts, fname);
    }
    int out_idx = opt_out(L, opts, opts, fname);
    k3_tensor *out = out_idx ? check_tensor(L, out_idx) : NULL;
    call_ctx c;
    call_init(L, &c, opt_kernel(L, opts, opts, fname), explain);
    tensor_ud *u = result_slot(L, out_idx, explain);
    k3_status s = k3_silu_mul_base(u ? &u->t : NULL, x, out, &c.call, 1);
    return op_finish(L, s, &c, explain);
}
static int l_silu_mul(lua_State *L) { return silu_mul_impl(L, 1, 0); }

static k3_tensor *req_tensor_field(lua_State *L, int idx, const char *field, int argn,
                                   const char *fname) {
    luaL_checkstack(L, 2, "k3: too many arguments");
    if (lua_getfield(L, idx, field) == LUA_TNIL || !luaL_testudata(L, -1, TENSOR_MT))
        arg_error(L, argn, fname, "field '%s' must be a k3.Tensor; got %s", field, luaL_typename(L, -1));
    return check_tensor(L, lua_gettop(L)); /* left on the stack, as in opt_tensor_field */
}

static int64_t int_field(lua_State *L, int idx, const char *field, int64_t dflt, int required,
                         int argn, const char *fname) {
    int ty = lua_getfield(L, idx, field);
    int64_t v = dflt;
    if (ty == LUA_TNIL) {
        if (required)
            arg_error(L, argn, fname, "field '%s' must be an integer; got nil", field);
    } else {
        int isnum;
        lua_Integer i = lua_tointegerx(L, -1, &isnum);
        if (!isnum)
            arg_error(L, argn, fname, "field '%s' must be an integer; got %s", field, ty == LUA_TNUMBER ? "a non-integer number" : luaL_typename(L, -1));
        v = (int64_t)i;
    }
    lua_pop(L, 1);
    return v;
}

/* k3.attn_res{prefix =, delta =, blocks =, num_blocks =, write_block =, norm_weight =,
 * qk_weight =, output_norm_weight =, eps = 1e-5, output_eps = 1e-5, out =, kernel =} -> out.
 * write_block is 1-based (nil: no write). DESIGN.md "attn_res" gives the formula. */
static int attn_res_impl(lua_State *L, int base, int explain) {
    const char *fname = "attn_res";
    static const char *const keys[] = {"prefix", "delta", "blocks", "num_blocks", "write_block",
                                       "norm_weight", "qk_weight", "output_norm_weight", "eps",
                                       "output_eps", "out", "kernel", NULL};
    luaL_checktype(L, base, LUA_TTABLE);
    check_option_keys(L, base, keys, base, fname);
    k3_attn_res_args a;
    memset(&a, 0, sizeof a);
    a.prefix = req_tensor_field(L, base, "prefix", base, fname);
    a.delta = opt_tensor_field(L, base, "delta", base, fname);
    a.blocks = req_tensor_field(L, base, "blocks", base, fname);
    a.norm_weight = req_tensor_field(L, base, "norm_weight", base, fname);
    a.qk_weight = req_tensor_field(L, base, "qk_weight", base, fname);
    a.output_norm_weight = opt_tensor_field(L, base, "output_norm_weight", base, fname);
    a.num_blocks = int_field(L, base, "num_blocks", 0, 1, base, fname);
    int64_t wb = int_field(L, base, "write_block", 0, 0, base, fname);
    a.write_block = (int64_t)((uint64_t)wb - 1); /* nil (0) -> -1: no write; 1-based -> 0-based */
    if (lua_getfield(L, base, "write_block") != LUA_TNIL && wb < 1) {
        int64_t S = k3_tensor_ndim(a.blocks) == 3 ? k3_tensor_size(a.blocks, 1) : 0;
        luaL_error(L, "attn_res: write_block must be in 1..%I (blocks dim 2); got %I",
                   (LUA_INTEGER)S, (LUA_INTEGER)wb);
    }
    lua_pop(L, 1);
    a.eps = opt_number_field(L, base, "eps", 1e-5, base, fname);
    a.output_eps = opt_number_field(L, base, "output_eps", 1e-5, base, fname);
    int out_idx = opt_out(L, base, base, fname);
    k3_tensor *out = out_idx ? check_tensor(L, out_idx) : NULL;
    call_ctx c;
    call_init(L, &c, opt_kernel(L, base, base, fname), explain);
    tensor_ud *u = result_slot(L, out_idx, explain);
    k3_status s = k3_attn_res_base(u ? &u->t : NULL, &a, out, &c.call, 1);
    return op_finish(L, s, &c, explain);
}
static int l_attn_res(lua_State *L) { return attn_res_impl(L, 1, 0); }

/* k3.explain(op, ...) -> {op =, chosen =, declined = {{kernel =, reason =}, ...}}: the
 * decision the op would make for these arguments; nothing runs. When the call would fail in
 * dispatch (no candidate accepts, or a kernel's layout error under on_layout_mismatch =
 * "error"), chosen is nil and error holds the message the call would raise; invalid
 * arguments raise as the op itself does. */
static int l_explain(lua_State *L) {
    static const char *const ops[] = {"linear", "attn_res", "rms_norm", "silu_mul", NULL};
    int op = check_name_in(L, 1, NULL, ops, "explain", "op");
    switch (op) {
    case 0: return linear_impl(L, 2, 1);
    case 1: return attn_res_impl(L, 2, 1);
    case 2: return rms_norm_impl(L, 2, 1);
    default: return silu_mul_impl(L, 2, 1);
    }
}

/* k3.trace(fn) -> {{op =, kernel =, declined = {...}}, ...}: every dispatch made while fn
 * runs. Traces nest: an enclosing trace also gets every record of an inner one. When fn
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
    lua_getfield(L, LUA_REGISTRYINDEX, REG_TRACE); /* 2: the enclosing trace, if any */
    lua_newtable(L);                               /* 3: this trace */
    lua_pushvalue(L, 3);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_TRACE);
    lua_pushvalue(L, 1);
    int st = lua_pcall(L, 0, 0, 0); /* on error, 4: the error object */
    lua_pushvalue(L, 2);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_TRACE);
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

static int l_has_kernel(lua_State *L) {
    lua_pushboolean(L, k3_has_kernel(luaL_checkstring(L, 1)));
    return 1;
}

static int l_known_kernel(lua_State *L) {
    lua_pushboolean(L, k3_known_kernel(luaL_checkstring(L, 1)));
    return 1;
}

/* k3.set_batch_invariant(on): on a boolean (anything else is a bad argument); batch-invariant mode of this Lua state (DESIGN.md): linear's
 * low-latency plans decline and linear runs its fixed-order kernel, so a row's result does
 * not depend on M. Other lua_States in the process keep their own mode. A state starts with
 * the process default (K3_BATCH_INVARIANT=1, or a C host's k3_set_batch_invariant). */
static int l_set_batch_invariant(lua_State *L) {
    /* A boolean only: "off" or 0 would be true in Lua, the opposite of what they say. */
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    CHECK_K3(L, k3_policy_set_batch_invariant(state_policy(L), lua_toboolean(L, 1)));
    return 0;
}
/* k3.batch_invariant() -> boolean: this Lua state's batch-invariant mode. */
static int l_batch_invariant(lua_State *L) {
    lua_pushboolean(L, k3_policy_batch_invariant(state_policy(L)));
    return 1;
}

static void stats_cb(void *ud, const char *kind, const char *name, uint64_t count) {
    lua_State *L = ud;
    lua_getfield(L, -1, strcmp(kind, "kernel") == 0 ? "kernels" : "declines");
    lua_pushinteger(L, (lua_Integer)count);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
}

/* k3.stats() -> {kernels = {[name] = calls}, declines = {["kernel: reason"] = count}}: the
 * calls this Lua state's ops and methods made since the module was opened or the state's
 * last k3.stats_reset(); other lua_States and C callers are not counted here (C's k3_stats
 * has the process-wide totals). */
static int l_stats(lua_State *L) {
    lua_createtable(L, 0, 2);
    lua_newtable(L);
    lua_setfield(L, -2, "kernels");
    lua_newtable(L);
    lua_setfield(L, -2, "declines");
    k3_stats_sink_read(state_stats(L), stats_cb, L);
    return 1;
}
/* k3.stats_reset(): clears this Lua state's counters only. */
static int l_stats_reset(lua_State *L) {
    k3_stats_sink_reset(state_stats(L));
    return 0;
}

static int l_empty_cache(lua_State *L) {
    CHECK_K3(L, k3_empty_cache());
    return 0;
}

/* core.cuda_arch(device_index) -> "sm90" (0-based index, as in "cuda:N"). */
static int l_cuda_arch(lua_State *L) {
    char buf[32];
    CHECK_K3(L, k3_cuda_arch((int)luaL_optinteger(L, 1, 0), buf, sizeof buf));
    lua_pushstring(L, buf);
    return 1;
}

/* core.compile_policy(tbl): compiles a policy table (lua/k3/policy/default.lua's form) and
 * makes it this state's policy. Unknown kernel names and bad values raise before anything
 * changes. */
static int l_compile_policy(lua_State *L) {
    static const char *const ops[] = {"linear", "attn_res", "rms_norm", "silu_mul"};
    luaL_checktype(L, 1, LUA_TTABLE);
    policy_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->p = NULL;
    luaL_setmetatable(L, POLICY_MT);
    k3_policy_init(&u->storage);
    u->p = &u->storage;
    /* A new policy keeps the state's batch-invariant mode (k3.set_batch_invariant). */
    CHECK_K3_AS(L, "set_policy", k3_policy_set_batch_invariant(
                                     u->p, k3_policy_batch_invariant(state_policy(L))));
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
        CHECK_K3_AS(L, "set_policy", k3_policy_set_candidates(u->p, ops[k], names, (int)n));
        lua_pop(L, (int)n + 1);
    }
    int ty = lua_getfield(L, 1, "on_layout_mismatch");
    if (ty != LUA_TNIL) {
        const char *v = ty == LUA_TSTRING ? lua_tostring(L, -1) : NULL; /* no in-place number->string */
        if (ty != LUA_TSTRING || (strcmp(v, "error") != 0 && strcmp(v, "fallback") != 0))
            return luaL_error(L, "set_policy: on_layout_mismatch must be \"error\" or "
                                 "\"fallback\"; got %s",
                              ty == LUA_TSTRING ? v : luaL_typename(L, -1));
        CHECK_K3_AS(L, "set_policy", k3_policy_set_layout_fallback(u->p, strcmp(v, "fallback") == 0));
    }
    lua_pop(L, 1);
    lua_settop(L, 2);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_POLICY);
    return 0;
}

/* core.policy_table() -> {linear = {...}, attn_res = {...}, rms_norm = {...},
 * silu_mul = {...}, on_layout_mismatch = "error"|"fallback"}: a plain copy of the policy
 * this state dispatches with, read back from the compiled policy (init.lua shows it as the
 * read-only k3.policy). */
static int l_policy_table(lua_State *L) {
    static const char *const ops[] = {"linear", "attn_res", "rms_norm", "silu_mul"};
    const k3_policy *p = state_policy(L);
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

/* ---- linear methods ---------------------------------------------------------------------------------- */

typedef struct {
    k3_method *m;
} method_ud;

static k3_method *check_method(lua_State *L, int idx) {
    method_ud *u = luaL_checkudata(L, idx, METHOD_MT);
    if (!u->m) luaL_error(L, "method has been freed");
    return u->m;
}

static int method_gc(lua_State *L) {
    method_ud *u = luaL_checkudata(L, 1, METHOD_MT);
    k3_method_free(u->m);
    u->m = NULL;
    return 0;
}

static method_ud *push_method_slot(lua_State *L) {
    method_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->m = NULL;
    luaL_setmetatable(L, METHOD_MT);
    return u;
}

/* k3.method.default() -> the default linear method (dispatch over the policy's candidates). */
static int l_method_default(lua_State *L) {
    method_ud *u = push_method_slot(L);
    CHECK_K3(L, k3_method_default(&u->m, state_policy(L)));
    return 1;
}

#define MAX_PLAN 64
/* k3.method.low_latency(plan): plan = {[M] = {kernel = "skinny", config = {threads =, rows =,
 * unroll =, vec =, split_k =}}, ...}. Declined calls run the owned default method. */
static int l_method_low_latency(lua_State *L) {
    const char *fname = "low_latency";
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
                return luaL_error(L, "bad argument #1 to '%s' (plan keys must be integer token "
                                     "counts M; got %s)",
                                  fname, luaL_typename(L, -2));
            /* A key no int holds is out of range; report it as the caller wrote it (the C
             * check below only sees the int, which would show another number). */
            if (m < INT_MIN || m > INT_MAX)
                return luaL_error(L, "method.low_latency: plan M must be in 1..%d; got %I",
                                  K3_PLAN_MAX_M, m);
            if (!lua_istable(L, -1))
                return luaL_error(L, "bad argument #1 to '%s' (plan[%I] must be a table; got %s)",
                                  fname, m, luaL_typename(L, -1));
            if (n >= MAX_PLAN)
                return luaL_error(L, "bad argument #1 to '%s' (at most %d plan entries)", fname,
                                  MAX_PLAN);
            memset(&e[n], 0, sizeof e[n]);
            e[n].m = (int)m;
            int entry = lua_gettop(L);
            static const char *const entry_keys[] = {"kernel", "config", "us", "cublas_us", NULL};
            check_option_keys(L, entry, entry_keys, 1, fname);
            if (lua_getfield(L, entry, "kernel") != LUA_TSTRING)
                return luaL_error(L, "bad argument #1 to '%s' (plan[%I].kernel must be a string; "
                                     "got %s)",
                                  fname, m, luaL_typename(L, -1));
            e[n].kernel = lua_tostring(L, -1);
            lua_rawseti(L, 2, n + 1); /* anchored: the entry may be a proxy */
            if (lua_getfield(L, entry, "config") == LUA_TTABLE) {
                int cfg = lua_gettop(L);
                static const char *const cfg_keys[] = {"threads", "rows", "unroll", "vec",
                                                       "split_k", NULL};
                check_option_keys(L, cfg, cfg_keys, 1, fname);
                e[n].threads = (int)int_field(L, cfg, "threads", 0, 0, 1, fname);
                e[n].rows = (int)int_field(L, cfg, "rows", 0, 0, 1, fname);
                e[n].unroll = (int)int_field(L, cfg, "unroll", 0, 0, 1, fname);
                e[n].vec = (int)int_field(L, cfg, "vec", 0, 0, 1, fname);
                e[n].split_k = (int)int_field(L, cfg, "split_k", 0, 0, 1, fname);
            } else if (!lua_isnil(L, -1)) {
                return luaL_error(L, "bad argument #1 to '%s' (plan[%I].config must be a table; "
                                     "got %s)",
                                  fname, m, luaL_typename(L, -1));
            }
            lua_pop(L, 2);
            n++;
        }
    }
    method_ud *u = push_method_slot(L);
    CHECK_K3(L, k3_method_low_latency(&u->m, e, n, state_policy(L)));
    return 1;
}

/* m:apply(x, w, bias, {residual =, out =}) -> y; m:explain(x, w, bias) -> decision
 * {op =, chosen =, declined = {{kernel =, reason =}, ...}}; nothing runs. Where apply would
 * raise because the arguments are refused (a K mismatch, tensors on different devices, ...)
 * or no kernel accepts the call, explain does not raise: chosen is nil, declined holds the
 * method's declines (the low-latency path's reason first) and then dispatch's, if it got
 * that far, and error is the message apply raises. Lua argument errors (not a tensor, a
 * freed tensor or method) still raise. */
static int method_call(lua_State *L, int explain) {
    const char *fname = explain ? "explain" : "apply";
    k3_method *m = check_method(L, 1);
    k3_tensor *x = check_tensor(L, 2), *w = check_tensor(L, 3);
    k3_tensor *bias = lua_isnoneornil(L, 4) ? NULL : check_tensor(L, 4);
    int opts = 0;
    if (!lua_isnoneornil(L, 5)) {
        static const char *const keys[] = {"residual", "out", NULL};
        luaL_checktype(L, 5, LUA_TTABLE);
        opts = 5;
        check_option_keys(L, opts, keys, opts, fname);
    }
    k3_tensor *res = opts ? opt_tensor_field(L, opts, "residual", 5, fname) : NULL;
    int out_idx = opt_out(L, opts, 5, fname);
    k3_tensor *out = out_idx ? check_tensor(L, out_idx) : NULL;
    call_ctx c;
    call_init(L, &c, NULL, explain);
    tensor_ud *u = result_slot(L, out_idx, explain);
    k3_status s = k3_method_apply_base(m, u ? &u->t : NULL, x, w, bias, res, out, &c.call, 1);
    return op_finish(L, s, &c, explain ? EXPLAIN_METHOD : 0);
}
static int method_apply(lua_State *L) { return method_call(L, 0); }
static int method_explain(lua_State *L) { return method_call(L, 1); }

static const luaL_Reg method_methods[] = {
    {"apply", method_apply}, {"explain", method_explain}, {"free", method_gc}, {NULL, NULL}};

/* ---- safetensors ------------------------------------------------------------------------------------ */

#define SAFETENSORS_MT "k3.Safetensors"

typedef struct {
    k3_safetensors *st;
} safetensors_ud;

static int safetensors_gc(lua_State *L) {
    safetensors_ud *u = luaL_checkudata(L, 1, SAFETENSORS_MT);
    k3_safetensors_free(u->st);
    u->st = NULL;
    return 0;
}

/* k3.load_safetensors(path) -> {name = tensor}: contiguous CPU tensors. Every offset, length,
 * dtype and shape is checked against the file before any data is read (lib/safetensors.c). */
static int l_load_safetensors(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    /* The loaded file lives in a userdata so that a Lua error below cannot leak it. */
    safetensors_ud *f = lua_newuserdatauv(L, sizeof *f, 0);
    f->st = NULL;
    luaL_setmetatable(L, SAFETENSORS_MT);
    CHECK_K3_AS(L, "load_safetensors", k3_safetensors_load(path, &f->st));
    int n = k3_safetensors_count(f->st);
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        tensor_ud *u = push_tensor_slot(L);
        CHECK_K3_AS(L, "load_safetensors", k3_safetensors_tensor(f->st, i, &u->t));
        lua_setfield(L, -2, k3_safetensors_name(f->st, i));
    }
    k3_safetensors_free(f->st);
    f->st = NULL;
    return 1;
}

/* k3.save_safetensors(path, {name = tensor}): writes every tensor (any strides, dtype or
 * device) little-endian, sorted by name, through a temporary file renamed into place. */
static int l_save_safetensors(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            return luaL_error(L, "bad argument #2 to 'save_safetensors' (keys must be tensor "
                                 "names; got %s)",
                              luaL_typename(L, -2));
        if (!luaL_testudata(L, -1, TENSOR_MT)) {
            const char *got = luaL_typename(L, -1);
            return luaL_error(L, "bad argument #2 to 'save_safetensors' (field '%s' must be a "
                                 "k3.Tensor; got %s)",
                              push_echo(L, lua_tostring(L, -2)), got);
        }
        check_tensor(L, lua_gettop(L));
        n++;
        size_t len;
        const char *name = lua_tolstring(L, -2, &len);
        if (len == 0)
            return luaL_error(L, "save_safetensors: %s: tensor %d has an empty name", path, n);
        if (strlen(name) != len) /* C strings end at a NUL: the name would be cut short */
            return luaL_error(L, "save_safetensors: %s: tensor name \"%s\" contains a NUL byte "
                                 "at byte %d",
                              path, name, (int)strlen(name) + 1);
        lua_pop(L, 1);
    }
    /* Arrays as userdata: collected even if an error is raised. */
    const char **names = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *names, 0);
    const k3_tensor **ts = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *ts, 0);
    int i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        names[i] = lua_tostring(L, -2); /* anchored as a key of the table */
        ts[i] = ((tensor_ud *)lua_touserdata(L, -1))->t;
        i++;
        lua_pop(L, 1);
    }
    CHECK_K3_AS(L, "save_safetensors", k3_safetensors_save(path, n, names, ts));
    return 0;
}

/* k3.clock() -> monotonic wall-clock seconds (for host-side timing; device work is
 * asynchronous: call k3.synchronize() first). */
static int l_clock(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
    return 1;
}

/* k3.isatty(file) -> boolean: whether a Lua file handle (io.stdout, io.stderr, one from
 * io.open or io.popen) is a terminal, from isatty(fileno(f)). Scripts print a live progress
 * line ("\r" and erase) only on a terminal, plain lines in a log. Raises "bad argument #1 to
 * 'isatty' (FILE* expected, got …)" for anything else and "(file is closed)" for a closed
 * handle. */
static int l_isatty(lua_State *L) {
    luaL_Stream *p = luaL_checkudata(L, 1, LUA_FILEHANDLE);
    if (p->closef == NULL) return arg_error(L, 1, "isatty", "file is closed");
    lua_pushboolean(L, isatty(fileno(p->f)) == 1);
    return 1;
}

/* ---- device timing (benchmarks) -------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Events recorded around timed calls; freed on every exit path before any error is raised. */
typedef struct {
    const k3_backend *be;
    void **ev;
    int n;
} event_set;

static void events_free(event_set *s) {
    for (int i = 0; i < s->n; i++) s->be->event_free(s->ev[i]);
    s->n = 0;
}

/* Calls fn(i); on a Lua error frees the events, then re-raises. */
static void timed_call(lua_State *L, event_set *es, lua_Integer i) {
    lua_pushvalue(L, 1);
    lua_pushinteger(L, i);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        events_free(es);
        lua_error(L);
    }
}

static void record(lua_State *L, event_set *es, int dev, void *graph) {
    if (es->be->event_record(dev, &es->ev[es->n]) != K3_OK) {
        events_free(es);
        if (graph) es->be->graph_free(graph);
        raise_k3(L);
    }
    es->n++;
}

/* k3.cuda_time(fn, {iters = 50, warmup = 5, graph = false, calls = 1, device = 0})
 *   -> median µs per call, {median =, min =, p90 =, samples =}
 * Times fn(i) (i = 1, 2, …, so fn can rotate inputs) on the device with CUDA events, after
 * `warmup` untimed calls. Without graph each sample is one call, launch overhead included.
 * With graph = true, `calls` calls are captured into one CUDA graph and each sample is one
 * replay divided by `calls`: the captured work must not allocate or synchronise (pass
 * out = tensors). METHOD.md: medians of many runs, after a warm-up. */
static int l_cuda_time(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    int iters = 50, warmup = 5, calls = 1, graph = 0, dev = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        iters = (int)int_field(L, 2, "iters", 50, 0, 2, "cuda_time");
        warmup = (int)int_field(L, 2, "warmup", 5, 0, 2, "cuda_time");
        calls = (int)int_field(L, 2, "calls", 1, 0, 2, "cuda_time");
        dev = (int)int_field(L, 2, "device", 0, 0, 2, "cuda_time");
        lua_getfield(L, 2, "graph");
        graph = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    if (iters < 1 || iters > 100000 || warmup < 0 || calls < 1 || calls > 100000)
        return luaL_error(L, "cuda_time: iters must be in 1..100000 and calls in 1..100000; got "
                             "iters %d, calls %d", iters, calls);
    const char *reason = NULL;
    const k3_backend *be = k3_cuda_backend(&reason);
    if (!be) return luaL_error(L, "cuda_time: CUDA is not available: %s", reason);
    if (graph && !be->graph_begin)
        return luaL_error(L, "cuda_time: this CUDA backend cannot capture graphs");
    lua_settop(L, 2);
    event_set es = {be, lua_newuserdatauv(L, sizeof(void *) * 2 * (size_t)iters, 0), 0};
    double *ms = lua_newuserdatauv(L, sizeof(double) * (size_t)iters, 0);
    for (int i = 1; i <= warmup; i++) timed_call(L, &es, i);
    CHECK_K3(L, k3_synchronize());
    void *g = NULL;
    if (graph) {
        CHECK_K3(L, be->graph_begin(dev));
        for (int i = 1; i <= calls; i++) {
            lua_pushvalue(L, 1);
            lua_pushinteger(L, i);
            if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
                void *partial = NULL;
                if (be->graph_end(dev, &partial) == K3_OK) be->graph_free(partial);
                return lua_error(L);
            }
        }
        CHECK_K3(L, be->graph_end(dev, &g));
        if (be->graph_replay(g, 1) != K3_OK || k3_synchronize() != K3_OK) {
            be->graph_free(g);
            return raise_k3(L);
        }
    }
    for (int i = 1; i <= iters; i++) {
        record(L, &es, dev, g);
        if (graph) {
            if (be->graph_replay(g, 1) != K3_OK) {
                be->graph_free(g);
                events_free(&es);
                return raise_k3(L);
            }
        } else {
            timed_call(L, &es, i);
        }
        record(L, &es, dev, g);
    }
    k3_status st = K3_OK;
    for (int i = 0; i < iters && st == K3_OK; i++) {
        float e = 0;
        st = be->event_elapsed(es.ev[2 * i], es.ev[2 * i + 1], &e);
        ms[i] = (double)e * 1000.0 / (graph ? calls : 1); /* µs per call */
    }
    events_free(&es);
    if (g) be->graph_free(g);
    if (st != K3_OK) return raise_k3(L);
    qsort(ms, (size_t)iters, sizeof(double), cmp_double);
    double median = ms[iters / 2];
    lua_pushnumber(L, median);
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, median);
    lua_setfield(L, -2, "median");
    lua_pushnumber(L, ms[0]);
    lua_setfield(L, -2, "min");
    lua_pushnumber(L, ms[(iters * 9) / 10 < iters ? (iters * 9) / 10 : iters - 1]);
    lua_setfield(L, -2, "p90");
    lua_pushinteger(L, iters);
    lua_setfield(L, -2, "samples");
    return 2;
}

/* ---- tensor parallelism (issue 10, helper H: lib/dist.c; lua/k3/dist.lua builds k3.dist) ---- */

#define DIST_GUARD_MT "k3.dist.guard"

/* Closing the Lua state leaves the process group, so a script that ends without
 * k3.dist.destroy() (or dies of an error) does not run NCCL's threads into process exit.
 * It aborts: a graceful finalize could wait on peers, and a rank that raised must exit at
 * once so the launcher can tell the others. */
static int dist_guard_gc(lua_State *L) {
    (void)L;
    if (k3_dist_initialized()) (void)k3_dist_destroy(1);
    return 0;
}

/* core.dist_init({rank =, world_size =, device =, dir =, timeout =, check_shapes =,
 * wait = "each"|"next"}): every field defaults to the launcher's environment. */
static int l_dist_init(lua_State *L) {
    const char *fname = "init";
    k3_dist_options o;
    k3_dist_options_default(&o);
    if (!lua_isnoneornil(L, 1)) {
        luaL_checktype(L, 1, LUA_TTABLE);
        o.rank = (int)int_field(L, 1, "rank", -1, 0, 1, fname);
        o.world_size = (int)int_field(L, 1, "world_size", 0, 0, 1, fname);
        o.device = (int)int_field(L, 1, "device", -1, 0, 1, fname);
        o.timeout_s = opt_number_field(L, 1, "timeout", 0, 1, fname);
        int ty = lua_getfield(L, 1, "dir");
        if (ty == LUA_TSTRING) o.dir = lua_tostring(L, -1); /* anchored in the table */
        else if (ty != LUA_TNIL)
            return luaL_error(L, "bad argument #1 to 'init' (field 'dir' must be a string; got "
                                 "%s)", luaL_typename(L, -1));
        lua_pop(L, 1);
        if (lua_getfield(L, 1, "check_shapes") != LUA_TNIL) o.check_shapes = lua_toboolean(L, -1);
        lua_pop(L, 1);
        ty = lua_getfield(L, 1, "wait");
        if (ty != LUA_TNIL) {
            const char *w = lua_tostring(L, -1);
            if (ty != LUA_TSTRING || (strcmp(w, "each") != 0 && strcmp(w, "next") != 0))
                return luaL_error(L, "bad argument #1 to 'init' (field 'wait' must be \"each\" "
                                     "or \"next\")");
            o.wait_each = strcmp(w, "each") == 0;
        }
        lua_pop(L, 1);
    }
    CHECK_K3(L, k3_dist_init(&o));
    if (lua_getfield(L, LUA_REGISTRYINDEX, DIST_GUARD_MT) == LUA_TNIL) {
        lua_newuserdatauv(L, 1, 0);
        if (luaL_newmetatable(L, DIST_GUARD_MT "_mt")) {
            lua_pushcfunction(L, dist_guard_gc);
            lua_setfield(L, -2, "__gc");
        }
        lua_setmetatable(L, -2);
        lua_setfield(L, LUA_REGISTRYINDEX, DIST_GUARD_MT);
    }
    lua_pop(L, 1);
    return 0;
}

static int l_dist_initialized(lua_State *L) {
    lua_pushboolean(L, k3_dist_initialized());
    return 1;
}
static int l_dist_rank(lua_State *L) {
    lua_pushinteger(L, k3_dist_rank());
    return 1;
}
static int l_dist_world_size(lua_State *L) {
    lua_pushinteger(L, k3_dist_world_size());
    return 1;
}
static int l_dist_device(lua_State *L) {
    lua_pushinteger(L, k3_dist_device());
    return 1;
}

/* core.dist_all_reduce(t, op = "sum"|"max"|"min") -> t (reduced in place). */
static int l_dist_all_reduce(lua_State *L) {
    static const char *const ops[] = {"sum", "max", "min", NULL};
    k3_tensor *t = check_tensor(L, 1);
    int op = check_name_in(L, 2, "sum", ops, "all_reduce", "op");
    CHECK_K3(L, k3_dist_all_reduce(t, (k3_dist_op)op));
    lua_settop(L, 1);
    return 1;
}

/* core.dist_all_gather(t) -> new tensor [world * d1, d2, ...], ranks in order along dim 1. */
static int l_dist_all_gather(lua_State *L) {
    k3_tensor *t = check_tensor(L, 1);
    tensor_ud *u = push_tensor_slot(L);
    CHECK_K3(L, k3_dist_all_gather(&u->t, t));
    return 1;
}

static int l_dist_barrier(lua_State *L) {
    CHECK_K3(L, k3_dist_barrier());
    return 0;
}
static int l_dist_synchronize(lua_State *L) {
    CHECK_K3(L, k3_dist_synchronize());
    return 0;
}
/* core.dist_destroy(abort): leaves the group (graceful unless abort). */
static int l_dist_destroy(lua_State *L) {
    CHECK_K3(L, k3_dist_destroy(lua_toboolean(L, 1)));
    return 0;
}

/* core.dist_stats(reset) -> {all_reduce = {calls =, ms =}, all_gather = {...}, check = {...}} */
static int l_dist_stats(lua_State *L) {
    static const char *const names[] = {"all_reduce", "all_gather", "check"};
    k3_dist_stats st;
    CHECK_K3(L, k3_dist_get_stats(&st, lua_toboolean(L, 1)));
    lua_createtable(L, 0, 3);
    for (int i = 0; i < 3; i++) {
        lua_createtable(L, 0, 2);
        lua_pushinteger(L, (lua_Integer)st.calls[i]);
        lua_setfield(L, -2, "calls");
        lua_pushnumber(L, st.ms[i]);
        lua_setfield(L, -2, "ms");
        lua_setfield(L, -2, names[i]);
    }
    return 1;
}

static const luaL_Reg ops_funcs[] = {
    {"linear", l_linear},
    {"rms_norm", l_rms_norm},
    {"silu_mul", l_silu_mul},
    {"attn_res", l_attn_res},
    {"explain", l_explain},
    {"trace", l_trace},
    {"backends", l_backends},
    {"kernels", l_kernels},
    {"has_kernel", l_has_kernel},
    {"known_kernel", l_known_kernel},
    {"set_batch_invariant", l_set_batch_invariant},
    {"batch_invariant", l_batch_invariant},
    {"stats", l_stats},
    {"stats_reset", l_stats_reset},
    {"empty_cache", l_empty_cache},
    {"cuda_arch", l_cuda_arch},
    {"compile_policy", l_compile_policy},
    {"policy_table", l_policy_table},
    {"cuda_time", l_cuda_time},
    {"load_safetensors", l_load_safetensors},
    {"save_safetensors", l_save_safetensors},
    {"clock", l_clock},
    {"isatty", l_isatty},
    {"method_default", l_method_default},
    {"method_low_latency", l_method_low_latency},
    {"dist_init", l_dist_init},
    {"dist_initialized", l_dist_initialized},
    {"dist_rank", l_dist_rank},
    {"dist_world_size", l_dist_world_size},
    {"dist_device", l_dist_device},
    {"dist_all_reduce", l_dist_all_reduce},
    {"dist_all_gather", l_dist_all_gather},
    {"dist_barrier", l_dist_barrier},
    {"dist_synchronize", l_dist_synchronize},
    {"dist_destroy", l_dist_destroy},
    {"dist_stats", l_dist_stats},
    {NULL, NULL}};

static void register_ops(lua_State *L) {
    if (luaL_newmetatable(L, SAFETENSORS_MT)) {
        lua_pushcfunction(L, safetensors_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    if (luaL_newmetatable(L, POLICY_MT)) {
        lua_pushcfunction(L, policy_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    /* This state's policy and counters, made once: luaopen_k3_core may run again in the same
     * state (busted insulation), which must not reset them. */
    if (lua_getfield(L, LUA_REGISTRYINDEX, REG_POLICY) == LUA_TNIL) {
        policy_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
        u->p = NULL;
        luaL_setmetatable(L, POLICY_MT);
        k3_policy_init(&u->storage);
        u->p = &u->storage;
        lua_setfield(L, LUA_REGISTRYINDEX, REG_POLICY);
    }
    lua_pop(L, 1);
    luaL_newmetatable(L, STATS_MT); /* plain memory: nothing to free */
    lua_pop(L, 1);
    if (lua_getfield(L, LUA_REGISTRYINDEX, REG_STATS) == LUA_TNIL) {
        k3_stats_sink *sink = lua_newuserdatauv(L, k3_stats_sink_size(), 0);
        k3_stats_sink_reset(sink);
        luaL_setmetatable(L, STATS_MT);
        lua_setfield(L, LUA_REGISTRYINDEX, REG_STATS);
    }
    lua_pop(L, 1);
    if (luaL_newmetatable(L, METHOD_MT)) {
        lua_pushcfunction(L, method_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, method_gc);
        lua_setfield(L, -2, "__close");
        luaL_newlib(L, method_methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    luaL_setfuncs(L, ops_funcs, 0);
}
