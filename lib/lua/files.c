/*
 * files.c — files and the host: k3.load_safetensors, k3.safetensors_info and
 * k3.save_safetensors (lib/safetensors.c checks every header field before reading data),
 * k3.memory, k3.isatty for progress output, and k3.clock.
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

/* The checkpoint at path, opened (headers only) into a userdata at the top of the stack, so
 * that a Lua error below cannot leak it. */
static k3_safetensors *open_checkpoint(lua_State *L, const char *fname, const char *path) {
    safetensors_ud *f = lua_newuserdatauv(L, sizeof *f, 0);
    f->st = NULL;
    luaL_setmetatable(L, K3L_SAFETENSORS_MT);
    k3_status s;
    K3L_RUN(s, k3_safetensors_open(path, &f->st));
    if (s != K3_OK) k3l_raise_as(L, fname);
    return f->st;
}

/* string.find, from the string metatable (present even when the global `string` is not). */
static void push_string_find(lua_State *L) {
    lua_pushliteral(L, "");
    if (luaL_getmetafield(L, -1, "__index") != LUA_TTABLE ||
        lua_getfield(L, -1, "find") != LUA_TFUNCTION)
        luaL_error(L, "load_safetensors: opts.match needs the string library");
    lua_replace(L, -3);
    lua_pop(L, 1);
}

/* k3.load_safetensors(path [, opts]) -> {name = tensor}. path: a .safetensors file, a
 * directory of shards with model.safetensors.index.json (or one model.safetensors), or the
 * index file. opts (all optional): names = {"a", ...} (each must exist) or match = a Lua
 * pattern (string.find on each name) picks the tensors, else all are read; device = "cpu" |
 * "cuda" | "cuda:N" puts them there (default cpu); dtype = "bf16" | "f16" | "f32" | "f64"
 * converts them (default: the file's; F8_E4M3 and F8_E5M2 load as bf16, exact, unscaled).
 * Only the picked tensors' bytes are read, from a mapping released before the call returns.
 * Unknown options raise. */
static int l_load_safetensors(lua_State *L) {
    static const char *const keys[] = {"names", "match", "device", "dtype", NULL};
    const char *path = luaL_checkstring(L, 1);
    k3_safetensors_read_opts o = {{K3_DEVICE_CPU, 0}, 0, K3_DTYPE_BF16};
    int has_names = 0, has_match = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        k3l_check_option_keys(L, 2, keys, 2);
        k3l_device_field(L, 2, &o.device, 2);
        o.convert = k3l_dtype_field(L, 2, &o.dtype, 2);
        has_names = lua_getfield(L, 2, "names") != LUA_TNIL;
        if (has_names && !lua_istable(L, -1))
            return k3l_arg_error(L, 2, "names must be a list of tensor names; got %s",
                                 luaL_typename(L, -1));
        has_match = lua_getfield(L, 2, "match") != LUA_TNIL;
        if (has_match && lua_type(L, -1) != LUA_TSTRING)
            return k3l_arg_error(L, 2, "match must be a Lua pattern (a string); got %s",
                                 luaL_typename(L, -1));
        if (has_names && has_match)
            return k3l_arg_error(L, 2, "give names or match, not both");
    }
    lua_settop(L, 2);
    k3_safetensors *st = open_checkpoint(L, "load_safetensors", path); /* at 3 */
    int count = k3_safetensors_count(st);
    int *which = lua_newuserdatauv(L, (size_t)(count ? count : 1) * sizeof *which, 0); /* at 4 */
    int n = 0;
    if (has_names) {
        unsigned char *seen = lua_newuserdatauv(L, (size_t)(count ? count : 1), 0);
        memset(seen, 0, (size_t)(count ? count : 1)); /* at 5, kept there until the call returns */
        lua_getfield(L, 2, "names");
        lua_Integer len = luaL_len(L, -1);
        for (lua_Integer j = 1; j <= len; j++) {
            if (lua_geti(L, -1, j) != LUA_TSTRING)
                return k3l_arg_error(L, 2, "names[%d] must be a string; got %s", (int)j,
                                     luaL_typename(L, -1));
            int i = k3_safetensors_find(st, lua_tostring(L, -1));
            if (i < 0)
                return luaL_error(L, "load_safetensors: %s: no tensor \"%s\" (the checkpoint holds %d)",
                                  path, k3l_push_echo(L, lua_tostring(L, -1)), count);
            lua_pop(L, 1);
            if (!seen[i]) which[n++] = i;
            seen[i] = 1;
        }
        lua_pop(L, 1);
    } else if (has_match) {
        push_string_find(L); /* at 5 */
        for (int i = 0; i < count; i++) {
            lua_pushvalue(L, 5);
            lua_pushstring(L, k3_safetensors_name(st, i));
            lua_getfield(L, 2, "match");
            if (lua_pcall(L, 2, 1, 0) != LUA_OK) { /* a malformed pattern names itself */
                const char *why = lua_tostring(L, -1);
                lua_getfield(L, 2, "match");
                const char *pat = k3l_push_echo(L, lua_tostring(L, -1));
                return k3l_arg_error(L, 2, "match is not a valid Lua pattern (%s): \"%s\"",
                                     why ? why : "error", pat);
            }
            if (lua_toboolean(L, -1)) which[n++] = i;
            lua_pop(L, 1);
        }
    } else {
        for (int i = 0; i < count; i++) which[n++] = i;
    }
    CHECK_K3_AS(L, "load_safetensors", k3_safetensors_read(st, n, which, &o));
    lua_createtable(L, 0, n);
    for (int j = 0; j < n; j++) {
        k3l_tensor_ud *u = k3l_push_tensor(L);
        CHECK_K3_AS(L, "load_safetensors", k3_safetensors_tensor(st, which[j], &u->t));
        lua_setfield(L, -2, k3_safetensors_name(st, which[j]));
    }
    safetensors_ud *f = lua_touserdata(L, 3);
    k3_safetensors_free(f->st);
    f->st = NULL;
    return 1;
}

/* k3.safetensors_info(path) -> {tensors = {[name] = {dtype =, shape =, file =}}, metadata =
 * {[key] = value}}: the headers only, no data read. dtype as the file names it ("BF16",
 * "F8_E4M3", "I64"), shape a list of integers, file the shard holding the tensor relative to
 * the directory given (a single file: its base name); metadata is a file's "__metadata__" or
 * an index's "metadata". path as for k3.load_safetensors. */
static int l_safetensors_info(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    k3_safetensors *st = open_checkpoint(L, "safetensors_info", path);
    int count = k3_safetensors_count(st);
    lua_createtable(L, 0, 2);
    lua_createtable(L, 0, count);
    for (int i = 0; i < count; i++) {
        k3_safetensors_entry e;
        CHECK_K3_AS(L, "safetensors_info", k3_safetensors_describe(st, i, &e));
        lua_createtable(L, 0, 3);
        lua_pushstring(L, e.dtype);
        lua_setfield(L, -2, "dtype");
        lua_createtable(L, e.ndim, 0);
        for (int d = 0; d < e.ndim; d++) {
            lua_pushinteger(L, (lua_Integer)e.shape[d]);
            lua_rawseti(L, -2, d + 1);
        }
        lua_setfield(L, -2, "shape");
        lua_pushstring(L, e.file);
        lua_setfield(L, -2, "file");
        lua_setfield(L, -2, e.name);
    }
    lua_setfield(L, -2, "tensors");
    int nmeta = k3_safetensors_metadata_count(st);
    lua_createtable(L, 0, nmeta);
    for (int i = 0; i < nmeta; i++) {
        const char *k, *v;
        CHECK_K3_AS(L, "safetensors_info", k3_safetensors_metadata(st, i, &k, &v));
        lua_pushstring(L, v);
        lua_setfield(L, -2, k);
    }
    lua_setfield(L, -2, "metadata");
    return 1;
}

/* A string key or value of save_safetensors' tables: C strings end at a NUL, so a name holding
 * one would be cut short; refused instead. */
static const char *check_c_string(lua_State *L, int idx, const char *path, const char *what) {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    if (strlen(s) != len)
        luaL_error(L, "save_safetensors: %s: %s \"%s\" contains a NUL byte at byte %d", path, what,
                   s, (int)strlen(s) + 1);
    return s;
}

/* k3.save_safetensors(path, {name = tensor} [, {metadata = {key = "value"}}]): writes every
 * tensor (any strides, dtype or device) little-endian, sorted by name, through a temporary
 * file renamed into place; metadata (string keys and values) goes into "__metadata__" beside
 * "format": "pt". Names and metadata must be valid UTF-8 without NUL bytes. */
static int l_save_safetensors(lua_State *L) {
    static const char *const keys[] = {"metadata", NULL};
    const char *path = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    int nmeta = 0;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        k3l_check_option_keys(L, 3, keys, 3);
    }
    lua_settop(L, 3);
    if (lua_istable(L, 3) && lua_getfield(L, 3, "metadata") != LUA_TNIL) {
        if (!lua_istable(L, -1))
            return k3l_arg_error(L, 3, "metadata must be a table of strings; got %s",
                                 luaL_typename(L, -1));
        lua_pushnil(L);
        while (lua_next(L, 4)) {
            if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
                return k3l_arg_error(L, 3, "metadata keys and values must be strings; got %s = %s",
                                     luaL_typename(L, -2), luaL_typename(L, -1));
            check_c_string(L, -2, path, "metadata key");
            check_c_string(L, -1, path, "metadata value");
            nmeta++;
            lua_pop(L, 1);
        }
    } else {
        lua_settop(L, 3);
        lua_newtable(L);
    }
    /* The metadata table is at 4 from here on. */
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            return k3l_arg_error(L, 2, "keys must be tensor names; got %s", luaL_typename(L, -2));
        const k3l_tensor_ud *u = luaL_testudata(L, -1, K3L_TENSOR_MT);
        if (!u) {
            const char *got = luaL_typename(L, -1);
            return k3l_arg_error(L, 2, "field '%s' must be a k3.Tensor; got %s",
                                 k3l_push_echo(L, lua_tostring(L, -2)), got);
        }
        if (!u->t)
            return k3l_arg_error(L, 2, "field '%s': tensor has been freed",
                                 k3l_push_echo(L, lua_tostring(L, -2)));
        k3l_check_tensor(L, lua_gettop(L));
        n++;
        size_t len;
        lua_tolstring(L, -2, &len);
        if (len == 0)
            return luaL_error(L, "save_safetensors: %s: tensor %d has an empty name", path, n);
        check_c_string(L, -2, path, "tensor name");
        lua_pop(L, 1);
    }
    /* Arrays as userdata: collected even if an error is raised. */
    const char **names = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *names, 0);
    const k3_tensor **ts = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *ts, 0);
    const char **mk = lua_newuserdatauv(L, (size_t)(nmeta ? nmeta : 1) * sizeof *mk, 0);
    const char **mv = lua_newuserdatauv(L, (size_t)(nmeta ? nmeta : 1) * sizeof *mv, 0);
    int i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        names[i] = lua_tostring(L, -2); /* anchored as a key of the table */
        ts[i] = ((k3l_tensor_ud *)lua_touserdata(L, -1))->t;
        i++;
        lua_pop(L, 1);
    }
    i = 0;
    lua_pushnil(L);
    while (lua_next(L, 4)) {
        mk[i] = lua_tostring(L, -2);
        mv[i] = lua_tostring(L, -1); /* anchored as a value of the table */
        i++;
        lua_pop(L, 1);
    }
    CHECK_K3_AS(L, "save_safetensors",
                k3_safetensors_save_metadata(path, n, names, ts, nmeta, mk, mv));
    return 0;
}

/* k3.memory() -> {host_bytes, host_peak, host_allocations, device_bytes, device_peak,
 * device_allocations}: what k3 holds now, process-wide (k3_memory in lib/k3.h: host bytes as
 * k3's allocator was asked for them, device bytes as tensors requested them), in bytes.
 * k3.memory_reset_peak() sets both peaks to the current values. */
static int l_memory(lua_State *L) {
    k3_memory_stats m;
    k3_memory(&m);
    lua_createtable(L, 0, 6);
    const struct {
        const char *k;
        uint64_t v;
    } f[] = {{"host_bytes", m.host_bytes},     {"host_peak", m.host_peak},
             {"host_allocations", m.host_allocations}, {"device_bytes", m.device_bytes},
             {"device_peak", m.device_peak},   {"device_allocations", m.device_allocations}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        lua_pushinteger(L, (lua_Integer)f[i].v);
        lua_setfield(L, -2, f[i].k);
    }
    return 1;
}

static int l_memory_reset_peak(lua_State *L) {
    (void)L;
    k3_memory_reset_peak();
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
    {"safetensors_info", l_safetensors_info},
    {"memory", l_memory},
    {"memory_reset_peak", l_memory_reset_peak},
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
