/*
 * args.c — reading the arguments of the binding's functions and raising its errors: every
 * argument error goes through k3l_arg_error (luaL_argerror's wording and naming), every core
 * error through k3l_raise / k3l_raise_as, after the caller has released what it holds.
 */
#include "k3_lua.h"

#include <stdarg.h>
#include <string.h>

static const char *k3_lua_dir(lua_State *L);
static void k3l_where(lua_State *L);

/* Whether the caller of the running C function is a chunk of k3's own Lua modules. */
static int k3l_called_inside(lua_State *L) {
    lua_Debug ar;
    if (!lua_getstack(L, 1, &ar) || !lua_getinfo(L, "S", &ar)) return 0;
    const char *dir = k3_lua_dir(L);
    const int inside = dir && strncmp(ar.source, dir, strlen(dir)) == 0;
    lua_pop(L, 1);
    return inside;
}

int k3l_arg_error(lua_State *L, int arg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const char *msg = lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    if (!k3l_called_inside(L)) return luaL_argerror(L, arg, msg);
    /* luaL_argerror's wording, placed at the first caller outside k3's Lua modules */
    lua_Debug ar;
    const char *name = "?";
    if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar)) {
        if (ar.namewhat && strcmp(ar.namewhat, "method") == 0 && --arg == 0) {
            k3l_where(L);
            lua_pushfstring(L, "calling '%s' on bad self (%s)", ar.name ? ar.name : "?", msg);
            lua_concat(L, 2);
            return lua_error(L);
        }
        if (ar.name) name = ar.name;
    }
    k3l_where(L);
    lua_pushfstring(L, "bad argument #%d to '%s' (%s)", arg, name, msg);
    lua_concat(L, 2);
    return lua_error(L);
}

/* Pushes the directory of k3's own Lua modules as their chunks name it ("@.../k3/"), where
 * package.searchpath finds k3's init.lua (asked once per state, kept in the registry), or nil
 * when it is not found; returns it as a string (NULL for nil). */
static const char *k3_lua_dir(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, "k3.lua_dir") == LUA_TSTRING) return lua_tostring(L, -1);
    lua_pop(L, 1);
    const int top = lua_gettop(L);
    if (lua_getglobal(L, "package") == LUA_TTABLE &&
        lua_getfield(L, top + 1, "searchpath") == LUA_TFUNCTION) {
        lua_pushliteral(L, "k3");
        lua_getfield(L, top + 1, "path");
        if (lua_pcall(L, 2, 1, 0) == LUA_OK && lua_type(L, -1) == LUA_TSTRING) {
            const char *file = lua_tostring(L, -1), *slash = strrchr(file, '/');
            if (slash) {
                lua_pushliteral(L, "@");
                lua_pushlstring(L, file, (size_t)(slash - file + 1));
                lua_concat(L, 2);
                lua_pushvalue(L, -1);
                lua_setfield(L, LUA_REGISTRYINDEX, "k3.lua_dir");
                lua_replace(L, top + 1);
                lua_settop(L, top + 1);
                return lua_tostring(L, -1);
            }
        }
    }
    lua_settop(L, top);
    lua_pushnil(L);
    return NULL;
}

/* Pushes "file:line: " of the first caller outside k3's own Lua modules (a k3.nn layer or a
 * model that called the op is skipped, so the message points at the caller's line), or "" when
 * that caller is a C function, as luaL_where(L, 1) does. */
static void k3l_where(lua_State *L) {
    const char *dir = k3_lua_dir(L);
    const size_t n = dir ? strlen(dir) : 0;
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) break;
        if (n && strncmp(ar.source, dir, n) == 0) continue;
        lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
        lua_remove(L, -2);
        return;
    }
    lua_pop(L, 1);
    lua_pushliteral(L, "");
}

/* luaL_error with k3l_where's position. */
static int k3l_error(lua_State *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    k3l_where(L);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_concat(L, 2);
    return lua_error(L);
}

int k3l_raise(lua_State *L) { return k3l_error(L, "%s", k3_last_error()); }

int k3l_raise_as(lua_State *L, const char *fname) {
    const char *msg = k3_last_error();
    const char *p = msg;
    while (*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
           (p > msg && *p >= '0' && *p <= '9'))
        p++;
    if (p > msg && p[0] == ':' && p[1] == ' ') return k3l_error(L, "%s: %s", fname, p + 2);
    return k3l_error(L, "%s", msg);
}

const char *k3l_push_echo(lua_State *L, const char *s) {
    char e[K3_ECHO_SIZE];
    return lua_pushstring(L, k3_echo(e, sizeof e, s));
}

double k3l_check_value(lua_State *L, int idx, k3_dtype dt) {
    if (lua_isinteger(L, idx)) return k3_int64_to_dtype((int64_t)lua_tointeger(L, idx), dt);
    return luaL_checknumber(L, idx);
}

/* "an integer" readers name what they got: the float that is no integer (as Lua prints it;
 * NaN as "nan" whatever its sign bit), or the Lua type. A number's text is left on the stack
 * for the error that follows. */
const char *k3l_not_integer(lua_State *L, int idx) {
    if (lua_type(L, idx) != LUA_TNUMBER) return luaL_typename(L, idx);
    const lua_Number v = lua_tonumber(L, idx);
    return v != v ? "nan" : lua_pushfstring(L, "%f", v);
}

lua_Integer k3l_to_integer(lua_State *L, int idx, int *ok) {
    *ok = 0;
    if (lua_type(L, idx) != LUA_TNUMBER) return 0;
    return lua_tointegerx(L, idx, ok);
}

/* Pushes the set {name = true} of allowed's names, made once per state and array: the registry
 * holds it under the array's address, so allowed must be a static array. */
static void push_key_set(lua_State *L, const char *const *allowed) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, allowed) == LUA_TTABLE) return;
    lua_pop(L, 1);
    lua_newtable(L);
    for (const char *const *a = allowed; *a; a++) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, *a);
    }
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, allowed);
}

void k3l_check_last_arg(lua_State *L, int last) {
    for (int i = lua_gettop(L); i > last; i--)
        if (!lua_isnil(L, i))
            k3l_arg_error(L, i, "nothing expected here, past the last argument; got %s",
                          luaL_typename(L, i));
}

const char *k3l_check_cstring(lua_State *L, int idx, int argn, const char *what) {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    if (s && strlen(s) != len)
        k3l_arg_error(L, argn, "%s must not contain a NUL byte (one follows '%s')", what,
                      k3l_push_echo(L, s));
    return s;
}

void k3l_check_option_keys(lua_State *L, int idx, const char *const *allowed, int argn) {
    idx = lua_absindex(L, idx);
    luaL_checkstack(L, 4, "k3: too many arguments");
    push_key_set(L, allowed);
    const int set = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int ok = 0;
        if (lua_type(L, -1) == LUA_TSTRING) {
            lua_pushvalue(L, -1);
            ok = lua_rawget(L, set) != LUA_TNIL;
            lua_pop(L, 1);
        }
        if (!ok) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            for (const char *const *a = allowed; *a; a++) {
                if (a != allowed) luaL_addstring(&b, a[1] ? ", " : " or ");
                luaL_addstring(&b, *a);
            }
            luaL_pushresult(&b);
            const char *expected = lua_tostring(L, -1);
            if (lua_type(L, -2) != LUA_TSTRING) {
                const char *type = luaL_typename(L, -2);
                const char *key = luaL_tolstring(L, -2, NULL);
                k3l_arg_error(L, argn, "unknown option [%s] (a %s key; expected %s)", key, type,
                              expected);
            }
            k3l_arg_error(L, argn, "unknown option '%s' (expected %s)",
                          k3l_push_echo(L, lua_tostring(L, -2)), expected);
        }
    }
    lua_pop(L, 1); /* the set */
}

int64_t k3l_int_field(lua_State *L, int idx, const char *field, int64_t dflt, int required,
                      int argn) {
    int ty = lua_getfield(L, idx, field);
    int64_t v = dflt;
    if (ty == LUA_TNIL) {
        if (required) k3l_arg_error(L, argn, "field '%s' must be an integer; got nil", field);
    } else {
        int isnum;
        lua_Integer i = k3l_to_integer(L, -1, &isnum);
        if (!isnum)
            k3l_arg_error(L, argn, "field '%s' must be an integer; got %s", field,
                          k3l_not_integer(L, -1));
        v = (int64_t)i;
    }
    lua_pop(L, 1);
    return v;
}

double k3l_number_field(lua_State *L, int idx, const char *field, double dflt, int argn) {
    double v = dflt;
    int ty = lua_getfield(L, idx, field);
    if (ty == LUA_TNUMBER)
        v = lua_tonumber(L, -1);
    else if (ty != LUA_TNIL)
        k3l_arg_error(L, argn, "field '%s' must be a number; got %s", field, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

int k3l_bool_field(lua_State *L, int idx, const char *field, int dflt, int argn) {
    int v = dflt;
    int ty = lua_getfield(L, idx, field);
    if (ty == LUA_TBOOLEAN)
        v = lua_toboolean(L, -1);
    else if (ty != LUA_TNIL)
        k3l_arg_error(L, argn, "field '%s' must be a boolean; got %s", field, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

int k3l_check_name(lua_State *L, int arg, const char *def, const char *const names[],
                   const char *what) {
    const char *got = def ? luaL_optstring(L, arg, def) : luaL_checkstring(L, arg);
    if (got != def) k3l_check_cstring(L, arg, arg, what);
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
    return k3l_arg_error(L, arg, "unknown %s '%s'; expected %s", what, k3l_push_echo(L, got),
                         expected);
}

int k3l_check_shape(lua_State *L, int idx, int64_t *shape, int allow_neg) {
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer n = luaL_len(L, idx);
    if (n < 1 || n > K3_MAX_DIMS)
        k3l_arg_error(L, idx, "shape must have 1 to %d dims; got %d", K3_MAX_DIMS, (int)n);
    for (int i = 1; i <= n; i++) {
        lua_geti(L, idx, i);
        int isnum = 0;
        lua_Integer v = k3l_to_integer(L, -1, &isnum);
        if (!isnum)
            k3l_arg_error(L, idx, "shape[%d] must be an integer; got %s", i, k3l_not_integer(L, -1));
        lua_pop(L, 1);
        shape[i - 1] = (int64_t)v;
        if (!allow_neg && v < 0)
            k3l_arg_error(L, idx, "size of dim %d must be >= 0; got %I", i, (LUA_INTEGER)v);
    }
    return (int)n;
}

int k3l_dtype_field(lua_State *L, int idx, k3_dtype *out, int argn) {
    int present = lua_getfield(L, idx, "dtype") != LUA_TNIL;
    if (present) {
        if (lua_type(L, -1) != LUA_TSTRING)
            k3l_arg_error(L, argn, "dtype must be a string; got %s", luaL_typename(L, -1));
        if (k3_dtype_parse(k3l_check_cstring(L, -1, argn, "dtype"), out) != K3_OK)
            k3l_arg_error(L, argn, "unknown dtype '%s'; expected bf16, f16, f32 or f64",
                          k3l_push_echo(L, lua_tostring(L, -1)));
    }
    lua_pop(L, 1);
    return present;
}

int k3l_device_field(lua_State *L, int idx, k3_device *out, int argn) {
    int present = lua_getfield(L, idx, "device") != LUA_TNIL;
    if (present) {
        if (lua_type(L, -1) != LUA_TSTRING)
            k3l_arg_error(L, argn, "device must be a string; got %s", luaL_typename(L, -1));
        if (k3_device_parse(k3l_check_cstring(L, -1, argn, "device"), out) != K3_OK)
            k3l_arg_error(L, argn, "unknown device '%s'; expected cpu, cuda or cuda:N",
                          k3l_push_echo(L, lua_tostring(L, -1)));
    }
    lua_pop(L, 1);
    return present;
}

k3l_create_opts k3l_check_create_opts(lua_State *L, int idx) {
    static const char *const keys[] = {"dtype", "device", "seed", NULL};
    k3l_create_opts o = {K3_DTYPE_F32, {K3_DEVICE_CPU, 0}, 0};
    if (lua_isnoneornil(L, idx)) return o;
    luaL_checktype(L, idx, LUA_TTABLE);
    k3l_check_option_keys(L, idx, keys, idx);
    k3l_dtype_field(L, idx, &o.dtype, idx);
    k3l_device_field(L, idx, &o.device, idx);
    if (lua_getfield(L, idx, "seed") != LUA_TNIL) {
        int isnum;
        lua_Integer s = k3l_to_integer(L, -1, &isnum);
        if (!isnum) k3l_arg_error(L, idx, "seed must be an integer; got %s", k3l_not_integer(L, -1));
        o.seed = (uint64_t)s;
    }
    lua_pop(L, 1);
    return o;
}
