/*
 * module.c — the module entry: luaopen_k3_core (the C half, require "k3.core") assembles the
 * functions of the binding's files; luaopen_k3 (for hosts) also runs lua/k3/init.lua, which
 * builds the public `k3` table on it.
 */
#include "k3_lua.h"

#include <stdio.h>
#include <string.h>

/* Configuration typos (an unknown name in K3_DISABLE_KERNELS, a K3_BATCH_INVARIANT that is
 * not a boolean, a K3_HOST_THREADS that is not a count) were sent to the log hook when the
 * core read them; with no hook installed they would vanish, so the first state to open the
 * module writes them to stderr, once per process. Loading never fails over them. */
static void report_config_warnings(void) {
    (void)k3_kernel_count();    /* sets up the registry: reads K3_DISABLE_KERNELS */
    (void)k3_batch_invariant(); /* reads K3_BATCH_INVARIANT */
    (void)k3_host_threads();    /* reads K3_HOST_THREADS */
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
    lua_newtable(L);
    k3l_open_tensor(L);
    k3l_open_tensor_ops(L);
    k3l_open_ops(L);
    k3l_open_policy(L);
    k3l_open_files(L);
    k3l_open_dist(L);
    k3l_open_graph(L);
    k3l_open_repl(L);
    k3l_tensor_index(L); /* last: every file's tensor methods are in */
    lua_pushstring(L, K3_VERSION_STRING);
    lua_setfield(L, -2, "version");
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
