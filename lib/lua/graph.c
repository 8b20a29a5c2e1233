/*
 * graph.c — k3.cuda_graph(fn, opts): a CUDA graph of everything fn dispatches on this thread's
 * stream (k3_graph_capture, k3.h "CUDA graphs"), as a k3.Graph object with g:replay(),
 * g:free(), <close> and __gc.
 */
#include "k3_lua.h"

#include <string.h>

#define K3L_GRAPH_MT "k3.Graph"

typedef struct graph_ud {
    k3_graph *g; /* NULL once freed */
} graph_ud;

/* The captured call of fn under lua_pcall: a Lua error never jumps over the core's capture;
 * the error object waits in its stack slot and is raised once the capture is ended. */
typedef struct captured_fn {
    lua_State *L;
    int fn, err; /* stack indices: the function, the error slot */
    int failed;
} captured_fn;

static k3_status call_fn(void *ud) {
    captured_fn *c = ud;
    lua_pushvalue(c->L, c->fn);
    if (lua_pcall(c->L, 0, 0, 0) == LUA_OK) return K3_OK;
    lua_replace(c->L, c->err);
    c->failed = 1;
    return K3_EINVAL; /* the message is the Lua error's, raised by l_cuda_graph */
}

/* k3.cuda_graph(fn, {device = 0, warmup = 1}) -> a k3.Graph
 * Runs fn `warmup` times eagerly with the collector stopped, collects garbage (the tensors fn
 * allocated go back to the allocator's cache, where the capture's allocations find them), then
 * captures one call of fn into a CUDA graph, the collector still stopped. Tensors fn uses are static: fill the inputs before g:replay(), read the
 * outputs after it. A refusal (k3.h "CUDA graphs": a host synchronisation, a CPU tensor op, an
 * allocation the cache cannot serve) or any error fn raises ends the capture and is raised
 * unchanged; the stream stays usable. Without a CUDA device: "k3.cuda_graph: needs a CUDA
 * device (CUDA is not available: <reason>)". */
static int l_cuda_graph(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    k3_graph_options o = {0, 1};
    if (!lua_isnoneornil(L, 2)) {
        static const char *const keys[] = {"device", "warmup", NULL};
        luaL_checktype(L, 2, LUA_TTABLE);
        k3l_check_option_keys(L, 2, keys, 2);
        int64_t d = k3l_int_field(L, 2, "device", 0, 0, 2);
        int64_t w = k3l_int_field(L, 2, "warmup", 1, 0, 2);
        if (d < 0 || d > 1024) k3l_arg_error(L, 2, "device must be a CUDA device index in 0..1024; got %d", (int)d);
        if (w < 0 || w > 1000) k3l_arg_error(L, 2, "warmup must be in 0..1000; got %d", (int)w);
        o.device = (int)d;
        o.warmup = (int)w;
    }
    const char *reason = NULL;
    if (!k3_backend_available("cuda", &reason))
        return luaL_error(L, "k3.cuda_graph: needs a CUDA device (CUDA is not available: %s)",
                          reason ? reason : "no CUDA backend");
    if (k3_graph_capturing())
        return luaL_error(L, "k3.cuda_graph: a CUDA graph is already being captured on this "
                             "thread (captures do not nest)");
    lua_settop(L, 2);
    lua_pushnil(L); /* 3: the error slot */
    graph_ud *u = lua_newuserdatauv(L, sizeof *u, 0); /* 4 */
    u->g = NULL;
    luaL_setmetatable(L, K3L_GRAPH_MT);
    /* The collector stays stopped through the warmup and the capture, so both make the same
     * allocations: what the warmup's garbage returns to the cache is what the capture takes
     * (tensors fn frees explicitly are reused the same way in both). */
    int gc_was_running = lua_gc(L, LUA_GCISRUNNING);
    lua_gc(L, LUA_GCSTOP);
    captured_fn c = {L, 1, 3, 0};
    for (int i = 0; i < o.warmup && !c.failed; i++) (void)call_fn(&c);
    lua_gc(L, LUA_GCCOLLECT);
    k3_graph *g = NULL;
    k3_status s = K3_EINVAL;
    if (!c.failed) {
        k3_graph_options co = {o.device, 0};
        K3L_RUN(s, k3_graph_capture(&g, call_fn, &c, &co));
    }
    if (gc_was_running) lua_gc(L, LUA_GCRESTART);
    if (s != K3_OK) {
        if (c.failed) {
            lua_pushvalue(L, 3);
            return lua_error(L);
        }
        return k3l_raise_as(L, "k3.cuda_graph");
    }
    lua_settop(L, 4);
    u->g = g;
    return 1;
}

static graph_ud *check_graph(lua_State *L, const char *fname) {
    graph_ud *u = luaL_checkudata(L, 1, K3L_GRAPH_MT);
    if (!u->g) luaL_error(L, "%s: the graph has been freed", fname);
    return u;
}

/* g:replay([n]): launches the graph n times (default 1) on its stream, asynchronously like the
 * ops (k3.synchronize() waits). */
static int g_replay(lua_State *L) {
    graph_ud *u = check_graph(L, "replay");
    lua_Integer n = luaL_optinteger(L, 2, 1);
    if (n < 0) k3l_arg_error(L, 2, "n must be >= 0; got %d", (int)n);
    for (lua_Integer i = 0; i < n; i++) CHECK_K3_AS(L, "replay", k3_graph_replay(u->g));
    return 0;
}

/* g:free(), <close>, __gc: destroys the graph and drops its hold on the tensors' storage. */
static int g_free(lua_State *L) {
    graph_ud *u = luaL_checkudata(L, 1, K3L_GRAPH_MT);
    k3_graph_free(u->g);
    u->g = NULL;
    return 0;
}

/* g:kernels(): kernel nodes of one replay; g:tensors(): storages it holds; g:device(). */
static int g_kernels(lua_State *L) {
    lua_pushinteger(L, k3_graph_kernels(check_graph(L, "kernels")->g));
    return 1;
}
static int g_tensors(lua_State *L) {
    lua_pushinteger(L, k3_graph_tensors(check_graph(L, "tensors")->g));
    return 1;
}
static int g_device(lua_State *L) {
    lua_pushfstring(L, "cuda:%d", k3_graph_device(check_graph(L, "device")->g));
    return 1;
}

static int g_tostring(lua_State *L) {
    graph_ud *u = luaL_checkudata(L, 1, K3L_GRAPH_MT);
    if (!u->g) {
        lua_pushstring(L, "k3.Graph(freed)");
        return 1;
    }
    lua_pushfstring(L, "k3.Graph(cuda:%d, %d kernels, %d tensors held)", k3_graph_device(u->g),
                    k3_graph_kernels(u->g), k3_graph_tensors(u->g));
    return 1;
}

static const luaL_Reg graph_methods[] = {{"replay", g_replay}, {"free", g_free},
                                         {"kernels", g_kernels}, {"tensors", g_tensors},
                                         {"device", g_device}, {NULL, NULL}};

void k3l_open_graph(lua_State *L) {
    if (luaL_newmetatable(L, K3L_GRAPH_MT)) {
        lua_newtable(L);
        luaL_setfuncs(L, graph_methods, 0);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, g_free);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, g_free);
        lua_setfield(L, -2, "__close");
        lua_pushcfunction(L, g_tostring);
        lua_setfield(L, -2, "__tostring");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, l_cuda_graph);
    lua_setfield(L, -2, "cuda_graph");
}
