/*
 * dist.c — tensor parallelism for Lua: the core.dist_* functions lua/k3/dist.lua builds
 * k3.dist on (lib/dist.c holds the process group; kernels/dist.cu the NCCL calls), the
 * guard that leaves the group when the Lua state closes, and the agreement board
 * (lib/dist.h) that k3.dist.simulate's ranks check their calls on, the code the process
 * group runs.
 */
#include "k3_lua.h"

#include "dist.h"

#include <string.h>

#define DIST_GUARD_MT "k3.dist.guard"
#define DIST_BOARD_MT "k3.dist.Board"

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
    k3_dist_options o;
    k3_dist_options_default(&o);
    if (!lua_isnoneornil(L, 1)) {
        luaL_checktype(L, 1, LUA_TTABLE);
        o.rank = (int)k3l_int_field(L, 1, "rank", -1, 0, 1);
        o.world_size = (int)k3l_int_field(L, 1, "world_size", 0, 0, 1);
        o.device = (int)k3l_int_field(L, 1, "device", -1, 0, 1);
        o.timeout_s = k3l_number_field(L, 1, "timeout", 0, 1);
        int ty = lua_getfield(L, 1, "dir");
        if (ty == LUA_TSTRING) o.dir = lua_tostring(L, -1); /* anchored in the table */
        else if (ty != LUA_TNIL)
            return k3l_arg_error(L, 1, "field 'dir' must be a string; got %s", luaL_typename(L, -1));
        lua_pop(L, 1);
        if (lua_getfield(L, 1, "check_shapes") != LUA_TNIL) o.check_shapes = lua_toboolean(L, -1);
        lua_pop(L, 1);
        ty = lua_getfield(L, 1, "wait");
        if (ty != LUA_TNIL) {
            const char *w = lua_tostring(L, -1);
            if (ty != LUA_TSTRING || (strcmp(w, "each") != 0 && strcmp(w, "next") != 0))
                return k3l_arg_error(L, 1, "field 'wait' must be \"each\" or \"next\"");
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

/* Appends the decision for `collective` on t to the active k3.trace, if any: `world` 0 is
 * the process group's (k3_dist_explain), else a simulated world of that size. */
static void trace_collective(lua_State *L, const char *collective, const k3_tensor *t,
                             int world) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_TRACE) == LUA_TTABLE) {
        k3_dispatch rec;
        k3_status s = world ? k3_dist_decide(&rec, collective, t, world, 1)
                            : k3_dist_explain(&rec, collective, t);
        if (s == K3_OK) {
            k3l_push_dispatch(L, &rec);
            lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
        }
    }
    lua_pop(L, 1);
}

/* core.dist_explain(collective, t, simulated_world = nil) -> the record k3.explain would give:
 * which collective runs for t ("all_reduce" or "all_gather") and why the others decline. */
static int l_dist_explain(lua_State *L) {
    const char *collective = luaL_checkstring(L, 1);
    const k3_tensor *t = lua_isnoneornil(L, 2) ? NULL : k3l_check_tensor(L, 2);
    lua_Integer w = luaL_optinteger(L, 3, 0);
    if (w < 0 || w > 4096)
        return k3l_arg_error(L, 3, "world size must be in 1..4096; got %I", (LUA_INTEGER)w);
    k3_dispatch rec;
    CHECK_K3(L, w ? k3_dist_decide(&rec, collective, t, (int)w, 1)
                  : k3_dist_explain(&rec, collective, t));
    k3l_push_dispatch(L, &rec);
    return 1;
}

/* core.dist_trace(collective, t, simulated_world): a simulated rank's collective, recorded in
 * the active k3.trace as the process group's are. */
static int l_dist_trace(lua_State *L) {
    const char *collective = luaL_checkstring(L, 1);
    const k3_tensor *t = lua_isnoneornil(L, 2) ? NULL : k3l_check_tensor(L, 2);
    lua_Integer w = luaL_checkinteger(L, 3);
    if (w < 1 || w > 4096)
        return k3l_arg_error(L, 3, "world size must be in 1..4096; got %I", (LUA_INTEGER)w);
    trace_collective(L, collective, t, (int)w);
    return 0;
}

/* core.dist_all_reduce(t, op = "sum"|"max"|"min") -> t (reduced in place). */
static int l_dist_all_reduce(lua_State *L) {
    static const char *const ops[] = {"sum", "max", "min", NULL};
    k3_tensor *t = k3l_check_tensor(L, 1);
    int op = k3l_check_name(L, 2, "sum", ops, "op");
    CHECK_K3(L, k3_dist_all_reduce(t, (k3_dist_op)op));
    lua_settop(L, 1);
    trace_collective(L, "all_reduce", t, 0);
    return 1;
}

/* core.dist_all_gather(t) -> new tensor [world * d1, d2, ...], ranks in order along dim 1. */
static int l_dist_all_gather(lua_State *L) {
    k3_tensor *t = k3l_check_tensor(L, 1);
    k3l_tensor_ud *u = k3l_push_tensor(L);
    CHECK_K3(L, k3_dist_all_gather(&u->t, t));
    trace_collective(L, "all_gather", t, 0);
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

/* core.dist_stats(reset) -> {all_reduce = {calls =, ms =, stream_waits =}, all_gather = {...},
 * check = {...}} */
static int l_dist_stats(lua_State *L) {
    static const char *const names[] = {"all_reduce", "all_gather", "check"};
    k3_dist_stats st;
    CHECK_K3(L, k3_dist_get_stats(&st, lua_toboolean(L, 1)));
    lua_createtable(L, 0, 3);
    for (int i = 0; i < 3; i++) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, (lua_Integer)st.calls[i]);
        lua_setfield(L, -2, "calls");
        lua_pushnumber(L, st.ms[i]);
        lua_setfield(L, -2, "ms");
        lua_pushinteger(L, (lua_Integer)st.stream_waits[i]);
        lua_setfield(L, -2, "stream_waits");
        lua_setfield(L, -2, names[i]);
    }
    return 1;
}

/* ---- the agreement board of a simulated world ------------------------------------------- */

typedef struct {
    k3_dist_board *b;
} board_ud;

static k3_dist_board *check_board(lua_State *L) {
    board_ud *u = luaL_checkudata(L, 1, DIST_BOARD_MT);
    if (!u->b) luaL_error(L, "k3.dist: the board was freed");
    return u->b;
}

/* Argument `arg` as a rank of board #1's world (its size is the userdata's user value). */
static int rank_arg(lua_State *L, int arg) {
    lua_getiuservalue(L, 1, 1);
    int world = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    lua_Integer r = luaL_checkinteger(L, arg);
    if (r < 0 || r >= world)
        return k3l_arg_error(L, arg, "rank must be in 0..%d; got %d", world - 1, (int)r);
    return (int)r;
}

/* board:post(rank, call, t): call is "all_reduce(sum)", "all_reduce(max)", "all_reduce(min)",
 * "all_gather" or "barrier" (t nil for a barrier). */
static int l_board_post(lua_State *L) {
    static const char *const calls[] = {"all_reduce(sum)", "all_reduce(max)", "all_reduce(min)",
                                        "all_gather", "barrier", NULL};
    k3_dist_board *b = check_board(L);
    int rank = rank_arg(L, 2);
    int call = k3l_check_name(L, 3, NULL, calls, "call") + K3_DIST_CALL_ALL_REDUCE_SUM;
    const k3_tensor *t = lua_isnoneornil(L, 4) ? NULL : k3l_check_tensor(L, 4);
    CHECK_K3(L, k3_dist_board_post(b, rank, call, t));
    return 0;
}

/* board:ready(rank) -> true | false, "ranks not there yet" */
static int l_board_ready(lua_State *L) {
    k3_dist_board *b = check_board(L);
    int rank = rank_arg(L, 2);
    char missing[256];
    int r = k3_dist_board_ready(b, rank, missing, sizeof missing);
    if (r < 0) return luaL_error(L, "k3.dist: rank %d has no call on the board", rank);
    lua_pushboolean(L, r);
    if (r) return 1;
    lua_pushstring(L, missing);
    return 2;
}

/* board:verdict(rank, what) -> nil when the ranks agree, else the message every rank raises. */
static int l_board_verdict(lua_State *L) {
    k3_dist_board *b = check_board(L);
    int rank = rank_arg(L, 2);
    const char *what = luaL_checkstring(L, 3);
    k3_status s = k3_dist_board_verdict(b, rank, what);
    if (s == K3_OK) return 0;
    if (s != K3_ESHAPE) return k3l_raise(L);
    lua_pushstring(L, k3_last_error());
    return 1;
}

/* board:checks(rank) -> collectives rank has checked on the board. */
static int l_board_checks(lua_State *L) {
    k3_dist_board *b = check_board(L);
    lua_pushinteger(L, (lua_Integer)k3_dist_board_checks(b, rank_arg(L, 2)));
    return 1;
}

static int l_board_gc(lua_State *L) {
    board_ud *u = luaL_checkudata(L, 1, DIST_BOARD_MT);
    k3_dist_board_free(u->b);
    u->b = NULL;
    return 0;
}

/* board:wait(rank, what, timeout_s, failed_file = nil): k3_dist_board_wait (host only,
 * bounded); raises its message. */
static int l_board_wait(lua_State *L) {
    k3_dist_board *b = check_board(L);
    int rank = rank_arg(L, 2);
    const char *what = luaL_checkstring(L, 3);
    double timeout = luaL_checknumber(L, 4);
    const char *failed = luaL_optstring(L, 5, NULL);
    if (!(timeout > 0)) return k3l_arg_error(L, 4, "timeout must be > 0 seconds; got %f", timeout);
    CHECK_K3(L, k3_dist_board_wait(b, rank, what, timeout, failed));
    return 0;
}

/* A new board userdata for `world` ranks on the stack, its pointer still NULL. */
static board_ud *push_board(lua_State *L, lua_Integer world) {
    board_ud *u = lua_newuserdatauv(L, sizeof *u, 1);
    u->b = NULL;
    if (luaL_newmetatable(L, DIST_BOARD_MT)) {
        static const luaL_Reg methods[] = {{"post", l_board_post},       {"ready", l_board_ready},
                                           {"wait", l_board_wait},       {"verdict", l_board_verdict},
                                           {"checks", l_board_checks},   {NULL, NULL}};
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_board_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    lua_pushinteger(L, world);
    lua_setiuservalue(L, -2, 1);
    return u;
}

static lua_Integer world_arg(lua_State *L, int arg) {
    lua_Integer w = luaL_checkinteger(L, arg);
    if (w < 1 || w > 4096)
        return k3l_arg_error(L, arg, "world size must be in 1..4096; got %I", (LUA_INTEGER)w);
    return w;
}

/* core.dist_board(world_size) -> a board for a simulated world's ranks (in this process). */
static int l_dist_board(lua_State *L) {
    lua_Integer w = world_arg(L, 1);
    board_ud *u = push_board(L, w);
    CHECK_K3(L, k3_dist_board_new(&u->b, (int)w));
    return 1;
}

/* core.dist_board_open(path, rank, world_size) -> the board file a world of processes shares
 * (rank 0 creates it; the process group's own, k3_dist_board_open). */
static int l_dist_board_open(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    lua_Integer w = world_arg(L, 3);
    lua_Integer r = luaL_checkinteger(L, 2);
    if (r < 0 || r >= w)
        return k3l_arg_error(L, 2, "rank must be in 0..%d; got %I", (int)w - 1, (LUA_INTEGER)r);
    board_ud *u = push_board(L, w);
    CHECK_K3(L, k3_dist_board_open(&u->b, path, (int)r, (int)w));
    return 1;
}

static const luaL_Reg dist_funcs[] = {
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
    {"dist_explain", l_dist_explain},
    {"dist_trace", l_dist_trace},
    {"dist_board", l_dist_board},
    {"dist_board_open", l_dist_board_open},
    {NULL, NULL}};

void k3l_open_dist(lua_State *L) { luaL_setfuncs(L, dist_funcs, 0); }
