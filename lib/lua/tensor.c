/*
 * tensor.c — the k3.Tensor userdata: creation (empty, zeros, ones, full, randn, tensor),
 * metadata, views, copies, element access (t[i], t[i] = v, #t), arithmetic metamethods and
 * comparisons. Dims and indices are 1-based here and 0-based in the C API: arguments are
 * converted, and the core's messages are numbered from 1 (K3L_RUN).
 */
#include "k3_lua.h"

#include <stdint.h>
#include <string.h>

/* The collector and tensor memory. Lua 5.4 has no external-memory API, and a tensor
 * userdata is 8 bytes to the collector whatever its storage holds, so temporaries pile up far
 * past what the Lua heap would trigger a cycle for. Every tensor is pushed here before the
 * core allocates it: once this thread's tensor storage allocations reach GC_REPORT_BYTES
 * since the last report (k3_take_allocated_bytes), they are added to the collector's debt
 * (lua_gc LUA_GCSTEP, in KB), which runs the collection work that many bytes of Lua
 * allocations would have. A loop of temporary 4 MB tensors then stays at a few tensors live
 * instead of growing by gigabytes (spec/tensor_gc_spec.lua measures it). A stopped
 * collector (collectgarbage "stop") is left alone. */
#define GC_REPORT_BYTES ((uint64_t)1 << 20)

void k3l_collect(void *ud) { lua_gc((lua_State *)ud, LUA_GCCOLLECT); }

k3l_tensor_ud *k3l_push_tensor(lua_State *L) {
    /* An explicit step runs even in a stopped collector: collectgarbage("stop") is respected.
     * During a graph capture the bytes wait for the first tensor after it. */
    uint64_t grown = k3_graph_capturing() ? 0 : k3_take_allocated_bytes(GC_REPORT_BYTES);
    if (grown && lua_gc(L, LUA_GCISRUNNING))
        lua_gc(L, LUA_GCSTEP, (int)((grown >> 10) < INT32_MAX ? grown >> 10 : INT32_MAX));
    k3l_tensor_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->t = NULL;
    luaL_setmetatable(L, K3L_TENSOR_MT);
    return u;
}

static k3l_tensor_ud *check_tensor_ud(lua_State *L, int idx) {
    return luaL_checkudata(L, idx, K3L_TENSOR_MT);
}

/* How Lua code writes the operation of the metamethod named `name` ("index": "t[i]"), for an
 * error about its operand. */
static const char *metamethod_form(const char *name) {
    static const char *const forms[][2] = {
        {"index", "t[i]"}, {"newindex", "t[i] = v"}, {"len", "#t"},   {"add", "+"},
        {"sub", "-"},      {"mul", "*"},             {"div", "/"},    {"mod", "%"},
        {"pow", "^"},      {"unm", "unary -"},       {"idiv", "//"},  {"eq", "=="},
        {"lt", "<"},       {"le", "<="},             {"concat", ".."}, {"call", "a call"}};
    for (size_t i = 0; name && i < sizeof forms / sizeof forms[0]; i++)
        if (strcmp(name, forms[i][0]) == 0) return forms[i][1];
    return name ? name : "a metamethod";
}

k3_tensor *k3l_check_tensor(lua_State *L, int idx) {
    k3l_tensor_ud *u = check_tensor_ud(L, idx);
    if (!u->t) {
        /* an argument of a function or method: named ("bad argument #2 to 'linear' (tensor has
         * been freed)"); the operand of a metamethod (t[1], #t, a + b) as is */
        lua_Debug ar;
        const int known = lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar);
        if (known && ar.namewhat && strcmp(ar.namewhat, "metamethod") == 0)
            luaL_error(L, "tensor has been freed (the operand of %s)", metamethod_form(ar.name));
        if (idx > 0) k3l_arg_error(L, idx, "tensor has been freed");
        luaL_error(L, "tensor has been freed");
    }
    if (k3_tensor_check(u->t, NULL) != K3_OK) luaL_error(L, "%s", k3_last_error());
    return u->t;
}

k3_tensor *k3l_tensor_field(lua_State *L, int idx, const char *field, int required, int argn) {
    luaL_checkstack(L, 2, "k3: too many arguments");
    int ty = lua_getfield(L, idx, field);
    if (ty == LUA_TNIL && !required) {
        lua_pop(L, 1);
        return NULL;
    }
    k3l_tensor_ud *u = luaL_testudata(L, -1, K3L_TENSOR_MT);
    if (!u)
        k3l_arg_error(L, argn, "field '%s' must be a k3.Tensor; got %s", field,
                      luaL_typename(L, -1));
    if (!u->t) k3l_arg_error(L, argn, "field '%s': tensor has been freed", field);
    return k3l_check_tensor(L, lua_gettop(L));
}

/* t's sizes or strides (which: 0 sizes, 1 strides) into v; returns ndim. */
static int dims_of(const k3_tensor *t, int which, int64_t *v) {
    int nd = k3_tensor_ndim(t);
    for (int d = 0; d < nd; d++) v[d] = which ? k3_tensor_stride(t, d) : k3_tensor_size(t, d);
    return nd;
}

static int tensor_gc(lua_State *L) {
    k3l_tensor_ud *u = check_tensor_ud(L, 1);
    k3_tensor_free(u->t);
    u->t = NULL;
    return 0;
}

/* t:free(): releases the storage's memory now; this and every view sharing the storage then
 * raise "tensor has been freed". Safe to call twice. */
static int tensor_free(lua_State *L) {
    k3l_tensor_ud *u = check_tensor_ud(L, 1);
    k3_tensor_release(u->t);
    u->t = NULL;
    return 0;
}

/* A 1-based dimension argument -> 0-based, checked against t's dims. */
static int check_dim_arg(lua_State *L, int argn, const k3_tensor *t) {
    lua_Integer d = luaL_checkinteger(L, argn);
    int nd = k3_tensor_ndim(t);
    if (nd == 0) /* a 0-dim tensor (select of a 1-dim one) has no dim to name */
        k3l_arg_error(L, argn, "the tensor has 0 dims (one element: use get()); got dim %I",
                      (LUA_INTEGER)d);
    if (d < 1 || d > nd) k3l_arg_error(L, argn, "dim must be in 1..%d; got %I", nd, (LUA_INTEGER)d);
    return (int)d - 1;
}

/* A 1-based Lua position -> 0-based, in unsigned arithmetic so that math.mininteger maps to a
 * value the core reports back as the caller wrote it. */
static int64_t zero_based(lua_Integer i) { return (int64_t)((uint64_t)i - 1); }

/* A shape given as a table at idx ({2, 3}) or as integer arguments from idx on (2, 3), as
 * Torch7 takes both; *next gets the first argument after it (where options may follow).
 * allow_neg lets sizes be negative (view's and reshape's -1, expand's -1). Returns ndim. */
static int check_shape_args(lua_State *L, int idx, int64_t *shape, int allow_neg, int *next) {
    if (lua_type(L, idx) == LUA_TTABLE) {
        *next = idx + 1;
        return k3l_check_shape(L, idx, shape, allow_neg);
    }
    if (lua_type(L, idx) != LUA_TNUMBER) return luaL_typeerror(L, idx, "shape table or sizes");
    int n = 0;
    for (; lua_type(L, idx + n) == LUA_TNUMBER; n++) {
        int arg = idx + n, isint;
        lua_Integer v = lua_tointegerx(L, arg, &isint);
        if (!isint) k3l_arg_error(L, arg, "size must be an integer; got %s", k3l_not_integer(L, arg));
        if (n == K3_MAX_DIMS) {
            int total = n;
            while (lua_type(L, idx + total) == LUA_TNUMBER) total++;
            k3l_arg_error(L, arg, "shape must have 1 to %d dims; got %d", K3_MAX_DIMS, total);
        }
        if (!allow_neg && v < 0)
            k3l_arg_error(L, arg, "size of dim %d must be >= 0; got %I", n + 1, (LUA_INTEGER)v);
        shape[n] = (int64_t)v;
    }
    *next = idx + n;
    return n;
}

/* ---- creation ------------------------------------------------------------------------------ */

enum { CREATE_EMPTY, CREATE_FULL, CREATE_RANDN };

/* value_idx: the stack slot of k3.full's value (0 for the other constructors, which pass
 * `value`), rounded once to the dtype the options give. opts_idx 0: the options follow the
 * shape (a table or sizes, check_shape_args). */
static int create(lua_State *L, const char *fname, int shape_idx, int opts_idx, int kind,
                  double value, int value_idx) {
    int64_t shape[K3_MAX_DIMS];
    int nd, next;
    if (opts_idx) nd = k3l_check_shape(L, shape_idx, shape, 0);
    else nd = check_shape_args(L, shape_idx, shape, 0, &next);
    k3l_create_opts o = k3l_check_create_opts(L, opts_idx ? opts_idx : next);
    if (value_idx) value = k3l_check_value(L, value_idx, o.dtype);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    if (kind == CREATE_EMPTY)
        CHECK_K3_AS(L, fname, k3_tensor_empty(&u->t, nd, shape, o.dtype, o.device));
    else if (kind == CREATE_FULL)
        CHECK_K3_AS(L, fname, k3_tensor_full(&u->t, nd, shape, o.dtype, o.device, value));
    else
        CHECK_K3_AS(L, fname, k3_tensor_randn(&u->t, nd, shape, o.dtype, o.device, o.seed));
    return 1;
}

/* k3.empty(shape, opts) or k3.empty(d1, ..., dn, opts) -> uninitialised tensor; opts {dtype =,
 * device =}. */
static int l_empty(lua_State *L) { return create(L, "empty", 1, 0, CREATE_EMPTY, 0, 0); }
/* k3.zeros(shape, opts) or k3.zeros(d1, ..., dn, opts) */
static int l_zeros(lua_State *L) { return create(L, "zeros", 1, 0, CREATE_FULL, 0, 0); }
/* k3.ones(shape, opts) or k3.ones(d1, ..., dn, opts) */
static int l_ones(lua_State *L) { return create(L, "ones", 1, 0, CREATE_FULL, 1, 0); }
/* k3.full(shape, value, opts) */
static int l_full(lua_State *L) {
    luaL_checknumber(L, 2); /* its type first, as before the shape */
    return create(L, "full", 1, 3, CREATE_FULL, 0, 2);
}
/* k3.randn(shape, opts) or k3.randn(d1, ..., dn, opts): standard normal, counter-based
 * (opts.seed, default 0). */
static int l_randn(lua_State *L) { return create(L, "randn", 1, 0, CREATE_RANDN, 0, 0); }

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
            const char *q = lua_type(L, -3) == LUA_TSTRING ? "'" : "";
            k3l_arg_error(L, 1,
                          "a list at depth %d has key %s%s%s; expected only the indices 1..%I: "
                          "a list without holes or named fields",
                          depth + 1, q, k, q, (LUA_INTEGER)n);
        }
    }
    return n;
}

/* Walks a nested table: discovers the shape from the first item at each depth. */
static void nested_shape(lua_State *L, int idx, int depth, int *nd, int64_t *shape) {
    if (depth >= K3_MAX_DIMS) k3l_arg_error(L, 1, "more than %d levels of nesting", K3_MAX_DIMS);
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
                k3l_arg_error(L, 1, "expected a number at depth %d; got %s", depth + 1,
                              luaL_typename(L, -1));
            out[(*pos)++] = k3l_check_value(L, -1, dt);
        } else {
            if (!lua_istable(L, -1))
                k3l_arg_error(L, 1, "expected a list at depth %d; got %s", depth + 2,
                              luaL_typename(L, -1));
            lua_Integer n = nested_len(L, lua_gettop(L), depth + 1);
            if (n != shape[depth + 1])
                k3l_arg_error(L, 1, "ragged nesting: a list at depth %d has %I items, expected %I",
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
    k3l_create_opts o = k3l_check_create_opts(L, 2);
    int64_t shape[K3_MAX_DIMS];
    int nd = 0;
    nested_shape(L, 1, 0, &nd, shape);
    /* Lists can share sub-lists, so the element count can exceed memory or int64 (65536 items
     * nested 4 deep is 2^64): checked before the value buffer is sized from it. */
    int64_t numel = 1;
    for (int i = 0; i < nd; i++)
        if (__builtin_mul_overflow(numel, shape[i], &numel) ||
            numel > (int64_t)(SIZE_MAX / sizeof(double)))
            k3l_arg_error(L, 1, "the nested lists' shape has more elements than memory can hold: "
                                "sizes overflow at depth %d",
                          i + 1);
    /* The value buffer is a userdata so a Lua error while filling cannot leak it. */
    double *vals = lua_newuserdatauv(L, (size_t)(numel ? numel : 1) * sizeof(double), 0);
    int64_t pos = 0;
    nested_fill(L, 1, 0, nd, shape, o.dtype, vals, &pos);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3_AS(L, "tensor", k3_tensor_from_f64(&u->t, nd, shape, o.dtype, o.device, vals));
    return 1;
}

/* ---- metadata ------------------------------------------------------------------------------ */

/* Pushes v[0..nd-1] as a list, or v[d-1] when argument argn is a dim d. */
static int push_dims(lua_State *L, int nd, const int64_t *v, int argn) {
    if (!lua_isnoneornil(L, argn)) {
        lua_Integer d = luaL_checkinteger(L, argn);
        if (nd == 0) return k3l_arg_error(L, argn, "the tensor has 0 dims; got dim %I", (LUA_INTEGER)d);
        if (d < 1 || d > nd)
            return k3l_arg_error(L, argn, "dim must be in 1..%d; got %I", nd, (LUA_INTEGER)d);
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
    int64_t v[K3_MAX_DIMS];
    int nd = dims_of(k3l_check_tensor(L, 1), 0, v);
    return push_dims(L, nd, v, 2);
}
/* t:stride() -> {s1, ...} in elements; t:stride(d) -> integer */
static int m_stride(lua_State *L) {
    int64_t v[K3_MAX_DIMS];
    int nd = dims_of(k3l_check_tensor(L, 1), 1, v);
    return push_dims(L, nd, v, 2);
}
static int m_dim(lua_State *L) {
    lua_pushinteger(L, k3_tensor_ndim(k3l_check_tensor(L, 1)));
    return 1;
}
static int m_numel(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)k3_tensor_numel(k3l_check_tensor(L, 1)));
    return 1;
}
/* t:offset() -> storage offset in elements */
static int m_offset(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)k3_tensor_offset(k3l_check_tensor(L, 1)));
    return 1;
}
static int m_dtype(lua_State *L) {
    lua_pushstring(L, k3_dtype_name(k3_tensor_dtype(k3l_check_tensor(L, 1))));
    return 1;
}
static int m_device(lua_State *L) {
    char buf[32];
    lua_pushstring(L, k3_device_name(k3_tensor_device(k3l_check_tensor(L, 1)), buf, sizeof buf));
    return 1;
}
static int m_is_contiguous(lua_State *L) {
    lua_pushboolean(L, k3_tensor_is_contiguous(k3l_check_tensor(L, 1)));
    return 1;
}
/* t:mark_static([owner]) -> t: its storage refuses writes from now on (k3_tensor_mark_static);
 * t:is_static() -> boolean. */
static int m_mark_static(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    const char *owner = luaL_optstring(L, 2, NULL);
    CHECK_K3(L, k3_tensor_mark_static(t, owner));
    lua_settop(L, 1);
    return 1;
}
/* t:is_freed() -> boolean: whether t, or the storage it views, has been freed (t:free() on it
 * or on any view of its storage). Never raises for a k3.Tensor. */
static int m_is_freed(lua_State *L) {
    k3l_tensor_ud *u = check_tensor_ud(L, 1);
    lua_pushboolean(L, !u->t || k3_tensor_check(u->t, NULL) != K3_OK);
    return 1;
}

static int m_is_static(lua_State *L) {
    lua_pushboolean(L, k3_tensor_is_static(k3l_check_tensor(L, 1)));
    return 1;
}

/* ---- views --------------------------------------------------------------------------------- */

/* t:narrow(d, start, length): elements start..start+length-1 of dim d (1-based), a view. */
static int m_narrow(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int d = check_dim_arg(L, 2, t);
    lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_narrow(&u->t, t, d, zero_based(start), (int64_t)len));
    return 1;
}

/* t:select(d, i): the slice at index i of dim d, with dim d removed; a view. */
static int m_select(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int d = check_dim_arg(L, 2, t);
    lua_Integer i = luaL_checkinteger(L, 3);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_select(&u->t, t, d, zero_based(i)));
    return 1;
}

/* t:transpose(d1, d2): dims swapped; a view. */
static int m_transpose(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int d1 = check_dim_arg(L, 2, t), d2 = check_dim_arg(L, 3, t);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_transpose(&u->t, t, d1, d2));
    return 1;
}

/* t:t(): transpose of a 2-D tensor. */
static int m_t(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    if (k3_tensor_ndim(t) != 2)
        return luaL_error(L, "t: expected a 2-dim tensor; got %d dims (use transpose(d1, d2))",
                          k3_tensor_ndim(t));
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_transpose(&u->t, t, 0, 1));
    return 1;
}

typedef k3_status (*shape_view_fn)(k3_tensor **, const k3_tensor *, int, const int64_t *);

/* t:<fn>(shape) or t:<fn>(d1, ..., dn): a new tensor from t and a shape. */
static int shape_method(lua_State *L, shape_view_fn fn) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int64_t shape[K3_MAX_DIMS];
    int next, nd = check_shape_args(L, 2, shape, 1, &next);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, fn(&u->t, t, nd, shape));
    return 1;
}

/* t:view(shape) or t:view(d1, ..., dn): same storage, new shape; t must be contiguous; one
 * size may be -1. */
static int m_view(lua_State *L) { return shape_method(L, k3_tensor_view); }

/* t:reshape(shape) or t:reshape(d1, ..., dn): t's elements in a new shape (one size may be
 * -1): a view when t's strides allow (PyTorch's view rule), else a contiguous copy. */
static int m_reshape(lua_State *L) { return shape_method(L, k3_tensor_reshape); }

/* t:expand(shape) or t:expand(d1, ..., dn): size-1 dims broadcast with stride 0 (-1 keeps a
 * size); a view. */
static int m_expand(lua_State *L) { return shape_method(L, k3_tensor_expand); }

/* t:permute(d1, ..., dn) or t:permute{d1, ..., dn}: dim i of the result is dim di of t (a
 * permutation of 1..t:dim()); a view. */
static int m_permute(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int64_t d64[K3_MAX_DIMS];
    int dims[K3_MAX_DIMS];
    int next, nd = check_shape_args(L, 2, d64, 1, &next);
    for (int i = 0; i < nd; i++) { /* checked here: a dim past int's range cannot reach C */
        if (d64[i] < 1 || d64[i] > k3_tensor_ndim(t))
            k3l_arg_error(L, lua_istable(L, 2) ? 2 : 2 + i,
                          "dim %I at position %d is out of range 1..%d", (LUA_INTEGER)d64[i],
                          i + 1, k3_tensor_ndim(t));
        dims[i] = (int)d64[i] - 1;
    }
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_permute(&u->t, t, nd, dims));
    return 1;
}

/* t:squeeze([d]): without d, every size-1 dim removed; with d, dim d removed when its size
 * is 1 (else t's shape is kept); a view. */
static int m_squeeze(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int d = lua_isnoneornil(L, 2) ? -1 : check_dim_arg(L, 2, t);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_squeeze(&u->t, t, d));
    return 1;
}

/* t:unsqueeze(d): a size-1 dim inserted at position d (1..t:dim()+1); a view. */
static int m_unsqueeze(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    lua_Integer d = luaL_checkinteger(L, 2);
    int nd = k3_tensor_ndim(t);
    if (d < 1 || d > nd + 1)
        return k3l_arg_error(L, 2, "dim must be in 1..%d; got %I", nd + 1, (LUA_INTEGER)d);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_unsqueeze(&u->t, t, (int)d - 1));
    return 1;
}

/* t:as_strided(shape, stride, offset): an arbitrary view, checked against the storage. */
static int m_as_strided(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int64_t shape[K3_MAX_DIMS], stride[K3_MAX_DIMS];
    int nd = k3l_check_shape(L, 2, shape, 1);
    int ns = k3l_check_shape(L, 3, stride, 1);
    if (ns != nd) return luaL_error(L, "as_strided: shape has %d dims but stride has %d", nd, ns);
    lua_Integer off = luaL_optinteger(L, 4, (lua_Integer)k3_tensor_offset(t));
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_as_strided(&u->t, t, nd, shape, stride, (int64_t)off));
    return 1;
}

/* ---- copies -------------------------------------------------------------------------------- */

/* t:contiguous(): t itself when contiguous, else a contiguous copy. */
static int m_contiguous(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    if (k3_tensor_is_contiguous(t)) {
        lua_settop(L, 1);
        return 1;
    }
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3_AS(L, "contiguous",
                k3_tensor_to(&u->t, t, k3_tensor_device(t), k3_tensor_dtype(t)));
    return 1;
}

/* t:clone(): a contiguous copy with the same dtype and device. */
static int m_clone(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3_AS(L, "clone", k3_tensor_to(&u->t, t, k3_tensor_device(t), k3_tensor_dtype(t)));
    return 1;
}

/* t:to(device_or_dtype) or t:to{device =, dtype =}: a contiguous copy (always a new tensor). */
static int m_to(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    k3_device dev = k3_tensor_device(t);
    k3_dtype dt = k3_tensor_dtype(t);
    if (lua_type(L, 2) == LUA_TSTRING) {
        const char *s = k3l_check_cstring(L, 2, 2, "a dtype or device");
        if (k3_dtype_parse(s, &dt) != K3_OK && k3_device_parse(s, &dev) != K3_OK)
            return k3l_arg_error(L, 2,
                                 "'%s' is neither a dtype (bf16, f16, f32, f64) nor a device "
                                 "(cpu, cuda, cuda:N)",
                                 k3l_push_echo(L, s));
    } else if (lua_type(L, 2) == LUA_TTABLE) {
        static const char *const keys[] = {"dtype", "device", NULL};
        k3l_check_option_keys(L, 2, keys, 2);
        k3l_create_opts o = k3l_check_create_opts(L, 2);
        lua_getfield(L, 2, "dtype");
        if (!lua_isnil(L, -1)) dt = o.dtype;
        lua_getfield(L, 2, "device");
        if (!lua_isnil(L, -1)) dev = o.device;
        lua_pop(L, 2);
    } else {
        return luaL_typeerror(L, 2, "string or table");
    }
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_to(&u->t, t, dev, dt));
    return 1;
}

/* t:copy(src): copies src's values (any strides, dtype, device; same shape); returns t. */
static int m_copy(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    k3_tensor *src = k3l_check_tensor(L, 2);
    CHECK_K3(L, k3_tensor_copy(t, src));
    lua_settop(L, 1);
    return 1;
}

/* t:fill(value): every element set to value (rounded to dtype); returns t. */
static int m_fill(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    double v = k3l_check_value(L, 2, k3_tensor_dtype(t));
    CHECK_K3_AS(L, "fill", k3_tensor_fill(t, v));
    lua_settop(L, 1);
    return 1;
}

/* ---- element access ------------------------------------------------------------------------ */

/* Reads ndim 1-based indices starting at argument `first`; returns them 0-based in idx. */
static void check_indices(lua_State *L, const k3_tensor *t, int first, int count,
                          const char *fname, int64_t *idx) {
    int nd = k3_tensor_ndim(t);
    if (count != nd)
        luaL_error(L, "%s: expected %d ind%s for a %d-dim tensor; got %d", fname, nd,
                   nd == 1 ? "ex" : "ices", nd, count);
    for (int i = 0; i < count; i++) idx[i] = zero_based(luaL_checkinteger(L, first + i));
}

/* t:get(i1, ..., in) -> number (synchronises for device tensors). */
static int m_get(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int64_t idx[K3_MAX_DIMS];
    check_indices(L, t, 2, lua_gettop(L) - 1, "get", idx);
    double v;
    CHECK_K3_AS(L, "get", k3_tensor_get(t, idx, &v));
    lua_pushnumber(L, v);
    return 1;
}

/* t:set(i1, ..., in, value); returns t. */
static int m_set(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int top = lua_gettop(L);
    int64_t idx[K3_MAX_DIMS];
    double v = k3l_check_value(L, top, k3_tensor_dtype(t));
    check_indices(L, t, 2, top - 2, "set", idx);
    CHECK_K3_AS(L, "set", k3_tensor_set(t, idx, v));
    lua_settop(L, 1);
    return 1;
}

/* t[i]'s index (key at idx) as a 0-based index into dim 1 of t, checked: an integer (a float
 * with an integral value counts) in 1..t:size(1). Errors name Lua's metamethod ('index',
 * 'newindex'), the index and the size. */
static int64_t check_row_key(lua_State *L, int idx, const k3_tensor *t) {
    int isint = 0;
    lua_Integer i = k3l_to_integer(L, idx, &isint);
    if (!isint)
        k3l_arg_error(L, idx, "a tensor is indexed by an integer or a method name; got %s",
                      k3l_not_integer(L, idx));
    if (k3_tensor_ndim(t) == 0)
        k3l_arg_error(L, idx, "index %I into a 0-dim tensor (one element: use get())",
                      (LUA_INTEGER)i);
    int64_t n = k3_tensor_size(t, 0);
    if (i < 1 || i > n)
        k3l_arg_error(L, idx, "index %I out of range for dim 1 of size %I", (LUA_INTEGER)i,
                      (LUA_INTEGER)n);
    return (int64_t)i - 1;
}

/* __index: a string key looks up the methods (upvalue 1: the methods table); t[i] is
 * t:select(1, i), and for a 1-dim t the element's value as a number. */
static int t_index(lua_State *L) {
    if (lua_type(L, 2) == LUA_TSTRING) { /* the common case: a method call */
        lua_settop(L, 2);
        lua_rawget(L, lua_upvalueindex(1));
        return 1;
    }
    k3_tensor *t = k3l_check_tensor(L, 1);
    int64_t i = check_row_key(L, 2, t);
    if (k3_tensor_ndim(t) == 1) {
        double v;
        CHECK_K3_AS(L, "get", k3_tensor_get(t, &i, &v));
        lua_pushnumber(L, v);
        return 1;
    }
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_select(&u->t, t, 0, i));
    return 1;
}

/* __newindex: t[i] = v writes through t:select(1, i): a number fills it (sets the element of
 * a 1-dim t), a tensor is copied into it (same shape as the slice; any dtype, device and
 * strides). A tensor has no fields to assign. */
static int t_newindex(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    if (lua_type(L, 2) == LUA_TSTRING)
        return luaL_error(L, "cannot assign field '%s' of a k3.Tensor (a tensor has methods, "
                             "no fields; t[i] = v writes a slice)",
                          k3l_push_echo(L, lua_tostring(L, 2)));
    int64_t i = check_row_key(L, 2, t);
    int is_tensor = luaL_testudata(L, 3, K3L_TENSOR_MT) != NULL;
    if (!is_tensor && lua_type(L, 3) != LUA_TNUMBER)
        return luaL_typeerror(L, 3, "number or k3.Tensor");
    if (!is_tensor && k3_tensor_ndim(t) == 1) {
        double v = k3l_check_value(L, 3, k3_tensor_dtype(t));
        CHECK_K3_AS(L, "set", k3_tensor_set(t, &i, v));
        return 0;
    }
    k3_tensor *src = is_tensor ? k3l_check_tensor(L, 3) : NULL;
    k3l_tensor_ud *u = k3l_push_tensor(L); /* the slice: collected if a write raises */
    CHECK_K3(L, k3_tensor_select(&u->t, t, 0, i));
    if (is_tensor) CHECK_K3(L, k3_tensor_copy(u->t, src));
    else CHECK_K3_AS(L, "fill", k3_tensor_fill(u->t, k3l_check_value(L, 3, k3_tensor_dtype(t))));
    return 0;
}

/* #t is t:size(1). */
static int t_len(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    if (k3_tensor_ndim(t) == 0)
        return k3l_arg_error(L, 1, "#t of a 0-dim tensor (it has no dim 1)");
    lua_pushinteger(L, (lua_Integer)k3_tensor_size(t, 0));
    return 1;
}

static void push_nested(lua_State *L, const int64_t *size, int nd, const double *v, int d,
                        int64_t *pos) {
    if (d == nd) {
        lua_pushnumber(L, v[(*pos)++]);
        return;
    }
    lua_createtable(L, (int)size[d], 0);
    for (int64_t i = 0; i < size[d]; i++) {
        push_nested(L, size, nd, v, d + 1, pos);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

/* t:totable() -> nested Lua lists of numbers (a number for a 0-dim tensor). */
static int m_totable(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    int64_t n = k3_tensor_numel(t);
    double *v = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof(double), 0);
    CHECK_K3_AS(L, "totable", k3_tensor_to_f64(t, v));
    int64_t size[K3_MAX_DIMS], pos = 0;
    int nd = dims_of(t, 0, size);
    push_nested(L, size, nd, v, 0, &pos);
    return 1;
}

/* ---- arithmetic ---------------------------------------------------------------------------- */

int k3l_tensor_arith(lua_State *L, k3_binop op, const char *name) {
    k3l_tensor_ud *ua = luaL_testudata(L, 1, K3L_TENSOR_MT), *ub = luaL_testudata(L, 2, K3L_TENSOR_MT);
    if (ua && ub) {
        k3_tensor *a = k3l_check_tensor(L, 1), *b = k3l_check_tensor(L, 2);
        k3l_tensor_ud *u = k3l_push_tensor(L);
        CHECK_K3(L, k3_tensor_binary(&u->t, op, a, b));
        return 1;
    }
    int ti = ua ? 1 : 2, si = ua ? 2 : 1;
    k3_tensor *a = k3l_check_tensor(L, ti);
    if (lua_type(L, si) != LUA_TNUMBER)
        return luaL_error(L, "attempt to %s a k3.Tensor and a %s value", name,
                          luaL_typename(L, si));
    /* A Lua integer beyond 2^53 has no double: it is rounded once to the tensor's dtype
     * (k3l_check_value) instead of to a double and then again. */
    lua_Integer iv = lua_isinteger(L, si) ? lua_tointeger(L, si) : 0;
    double s = (iv > (1LL << 53) || iv < -(1LL << 53)) ? k3l_check_value(L, si, k3_tensor_dtype(a))
                                                       : lua_tonumber(L, si);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_tensor_binary_scalar(&u->t, op, a, s, ti == 2));
    return 1;
}
static int t_add(lua_State *L) { return k3l_tensor_arith(L, K3_ADD, "add"); }
static int t_sub(lua_State *L) { return k3l_tensor_arith(L, K3_SUB, "subtract"); }
static int t_mul(lua_State *L) { return k3l_tensor_arith(L, K3_MUL, "multiply"); }
static int t_unm(lua_State *L) {
    k3_tensor *a = k3l_check_tensor(L, 1);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3_AS(L, "unm", k3_tensor_binary_scalar(&u->t, K3_MUL, a, -1.0, 0));
    return 1;
}

/* ---- comparisons --------------------------------------------------------------------------- */

/* A comparison of tensors 1 and 2 into a number. */
static int compare(lua_State *L, k3_status (*fn)(const k3_tensor *, const k3_tensor *, double *)) {
    double v;
    k3_tensor *a = k3l_check_tensor(L, 1), *b = k3l_check_tensor(L, 2);
    CHECK_K3(L, fn(a, b, &v));
    lua_pushnumber(L, v);
    return 1;
}

/* k3.max_abs_diff(a, b) -> number (any dtypes and devices; same shape). */
static int l_max_abs_diff(lua_State *L) { return compare(L, k3_max_abs_diff); }

/* k3.allclose(a, b, {atol = 1e-8, rtol = 1e-5}) -> boolean: |a-b| <= atol + rtol*|b|; NaN is
 * never close, an infinity only to the same infinity; a negative or NaN tolerance is an
 * error. */
static int l_allclose(lua_State *L) {
    k3_tensor *a = k3l_check_tensor(L, 1), *b = k3l_check_tensor(L, 2);
    double atol = 1e-8, rtol = 1e-5;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        static const char *const keys[] = {"atol", "rtol", NULL};
        k3l_check_option_keys(L, 3, keys, 3);
        atol = k3l_number_field(L, 3, "atol", atol, 3);
        rtol = k3l_number_field(L, 3, "rtol", rtol, 3);
    }
    int ok;
    CHECK_K3(L, k3_allclose(a, b, atol, rtol, &ok));
    lua_pushboolean(L, ok);
    return 1;
}

/* k3.cosine(a, b) -> cosine similarity computed in f64; NaN when a or b is all zeros. */
static int l_cosine(lua_State *L) { return compare(L, k3_cosine); }

static int l_is_tensor(lua_State *L) {
    lua_pushboolean(L, luaL_testudata(L, 1, K3L_TENSOR_MT) != NULL);
    return 1;
}

/* ---- registration -------------------------------------------------------------------------- */

static const luaL_Reg tensor_methods[] = {
    {"size", m_size},         {"stride", m_stride},       {"dim", m_dim},
    {"numel", m_numel},       {"offset", m_offset},       {"dtype", m_dtype},
    {"device", m_device},     {"is_contiguous", m_is_contiguous},
    {"mark_static", m_mark_static}, {"is_static", m_is_static},
    {"is_freed", m_is_freed},
    {"narrow", m_narrow},     {"select", m_select},       {"transpose", m_transpose},
    {"t", m_t},               {"view", m_view},           {"expand", m_expand},
    {"reshape", m_reshape},   {"permute", m_permute},     {"squeeze", m_squeeze},
    {"unsqueeze", m_unsqueeze},
    {"as_strided", m_as_strided},
    {"contiguous", m_contiguous}, {"clone", m_clone},     {"to", m_to},
    {"copy", m_copy},         {"fill", m_fill},           {"get", m_get},
    {"set", m_set},           {"totable", m_totable},     {"free", tensor_free},
    {NULL, NULL}};

static const luaL_Reg tensor_meta[] = {
    {"__gc", tensor_gc}, {"__close", tensor_gc}, {"__add", t_add}, {"__sub", t_sub},
    {"__mul", t_mul},    {"__unm", t_unm},
    {"__newindex", t_newindex}, {"__len", t_len}, {NULL, NULL}};

static const luaL_Reg tensor_funcs[] = {
    {"empty", l_empty},   {"zeros", l_zeros},   {"ones", l_ones},
    {"full", l_full},     {"randn", l_randn},   {"tensor", l_tensor},
    {"max_abs_diff", l_max_abs_diff}, {"allclose", l_allclose}, {"cosine", l_cosine},
    {"is_tensor", l_is_tensor}, {NULL, NULL}};

void k3l_open_tensor(lua_State *L) {
    if (luaL_newmetatable(L, K3L_TENSOR_MT)) {
        luaL_setfuncs(L, tensor_meta, 0);
        luaL_newlib(L, tensor_methods);
        k3l_add_tensor_op_methods(L);
        lua_setfield(L, -2, "__index");
    }
    lua_setfield(L, -2, "_tensor_mt");
    luaL_setfuncs(L, tensor_funcs, 0);
}

void k3l_tensor_index(lua_State *L) {
    luaL_getmetatable(L, K3L_TENSOR_MT);
    if (lua_getfield(L, -1, "__index") == LUA_TTABLE) {
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_TENSOR_METHODS);
        lua_pushcclosure(L, t_index, 1);
        lua_setfield(L, -2, "__index");
    } else {
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_TENSOR_METHODS);
    lua_setfield(L, -2, "_tensor_methods");
}
