/*
 * two_states.c — a C host with two lua_States, A and B, in one process (spec/host_spec.lua
 * builds and runs it). Each argument is "A:chunk" or "B:chunk", run in that state in order
 * (its results are printed as "A: r1\tr2"), or "C:bi" (the process default of batch-invariant
 * mode, k3_batch_invariant()), "C:linear" (the kernel a C k3_linear call without a policy
 * picks) or "C:stats" (the process-wide counters of k3_stats, one "C: kernel name count" line
 * each). Exits 1 when a chunk raises (after printing "A: error: message").
 */
#include <k3.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdio.h>
#include <string.h>

static int open_k3(lua_State *L) {
    luaL_requiref(L, "k3", luaopen_k3, 1);
    return 0;
}

static lua_State *new_state(const char *name) {
    lua_State *L = luaL_newstate();
    if (!L) return NULL;
    luaL_openlibs(L);
    lua_pushcfunction(L, open_k3);
    if (lua_pcall(L, 0, 0, 0) != LUA_OK) {
        printf("%s: error: %s\n", name, lua_tostring(L, -1));
        lua_close(L);
        return NULL;
    }
    return L;
}

static int run_chunk(lua_State *L, const char *name, const char *chunk) {
    int base = lua_gettop(L);
    if (luaL_loadbuffer(L, chunk, strlen(chunk), name) != LUA_OK ||
        lua_pcall(L, 0, LUA_MULTRET, 0) != LUA_OK) {
        printf("%s: error: %s\n", name, lua_tostring(L, -1));
        lua_settop(L, base);
        return 0;
    }
    printf("%s:", name);
    for (int i = base + 1; i <= lua_gettop(L); i++)
        printf("%s%s", i == base + 1 ? " " : "\t", luaL_tolstring(L, i, NULL)), lua_pop(L, 1);
    printf("\n");
    lua_settop(L, base);
    return 1;
}

static void print_stat(void *ud, const char *kind, const char *name, uint64_t count) {
    (void)ud;
    printf("C: %s %s %llu\n", kind, name, (unsigned long long)count);
}

static int c_command(const char *cmd) {
    if (strcmp(cmd, "bi") == 0) {
        printf("C: %d\n", k3_batch_invariant());
    } else if (strcmp(cmd, "stats") == 0) {
        k3_stats(print_stat, NULL);
    } else if (strcmp(cmd, "linear") == 0) {
        int64_t xs[2] = {2, 3}, ws[2] = {4, 3};
        k3_tensor *x = NULL, *w = NULL, *y = NULL;
        k3_dispatch rec;
        k3_call call = {NULL, NULL, 0, &rec};
        k3_status s = k3_tensor_full(&x, 2, xs, K3_DTYPE_F32, (k3_device){K3_DEVICE_CPU, 0}, 1);
        if (s == K3_OK)
            s = k3_tensor_full(&w, 2, ws, K3_DTYPE_F32, (k3_device){K3_DEVICE_CPU, 0}, 1);
        if (s == K3_OK) s = k3_linear(&y, x, w, NULL, NULL, NULL, &call);
        if (s == K3_OK) printf("C: %s\n", rec.chosen);
        else printf("C: error: %s\n", k3_last_error());
        k3_tensor_free(y);
        k3_tensor_free(w);
        k3_tensor_free(x);
        return s == K3_OK;
    } else {
        printf("C: error: unknown command %s\n", cmd);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    lua_State *a = new_state("A"), *b = new_state("B");
    int ok = a && b;
    for (int i = 1; ok && i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "A:", 2) == 0) ok = run_chunk(a, "A", arg + 2);
        else if (strncmp(arg, "B:", 2) == 0) ok = run_chunk(b, "B", arg + 2);
        else if (strncmp(arg, "C:", 2) == 0) ok = c_command(arg + 2);
        else {
            printf("error: argument %s is not A:chunk, B:chunk or C:command\n", arg);
            ok = 0;
        }
    }
    if (a) lua_close(a);
    if (b) lua_close(b);
    return ok ? 0 : 1;
}
