/*
 * files.c — files and the host: k3.load_safetensors and k3.save_safetensors (lib/safetensors.c
 * checks every header field before reading data), k3.isatty for progress output, and k3.clock.
 */
#include "k3_lua.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    k3_safetensors *st;
} safetensors_ud;

static int safetensors_gc(lua_State *L) {
    safetensors_ud *u = luaL_checkudata(L, 1, K3L_SAFETENSORS_MT);
    k3_safetensors_free(u->st);
    u->st = NULL;
    return 0;
}

/* k3.load_safetensors(path) -> {name = tensor}: contiguous CPU tensors. Every offset, length,
 * dtype and shape is checked against the file before any data is read. */
static int l_load_safetensors(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    /* The loaded file lives in a userdata so that a Lua error below cannot leak it. */
    safetensors_ud *f = lua_newuserdatauv(L, sizeof *f, 0);
    f->st = NULL;
    luaL_setmetatable(L, K3L_SAFETENSORS_MT);
    CHECK_K3_AS(L, "load_safetensors", k3_safetensors_load(path, &f->st));
    int n = k3_safetensors_count(f->st);
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        k3l_tensor_ud *u = k3l_push_tensor(L);
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
            return k3l_arg_error(L, 2, "keys must be tensor names; got %s", luaL_typename(L, -2));
        if (!luaL_testudata(L, -1, K3L_TENSOR_MT)) {
            const char *got = luaL_typename(L, -1);
            return k3l_arg_error(L, 2, "field '%s' must be a k3.Tensor; got %s",
                                 k3l_push_echo(L, lua_tostring(L, -2)), got);
        }
        k3l_check_tensor(L, lua_gettop(L));
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
        ts[i] = ((k3l_tensor_ud *)lua_touserdata(L, -1))->t;
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
    if (p->closef == NULL) return k3l_arg_error(L, 1, "file is closed");
    lua_pushboolean(L, isatty(fileno(p->f)) == 1);
    return 1;
}

static const luaL_Reg files_funcs[] = {
    {"load_safetensors", l_load_safetensors},
    {"save_safetensors", l_save_safetensors},
    {"clock", l_clock},
    {"isatty", l_isatty},
    {NULL, NULL}};

void k3l_open_files(lua_State *L) {
    if (luaL_newmetatable(L, K3L_SAFETENSORS_MT)) {
        lua_pushcfunction(L, safetensors_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    luaL_setfuncs(L, files_funcs, 0);
}
