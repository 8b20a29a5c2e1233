/*
 * host.c — a game-engine-style C host embedding k3: a lua_State with a counting, capped
 * allocator, k3 loaded with luaL_requiref, and a script's on_frame(dt) called every frame
 * under an instruction budget. A bad frame is reported and the next one runs; the host never
 * aborts. --threads N runs N independent states at once and checks their results against a
 * single-threaded run, bit for bit. The exit status says whether every frame went as the
 * script expected: a script that fails frames on purpose lists them in `expected_failures`.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "k3.h" /* also declares luaopen_k3 (defined in libk3lua) */



/* ---- options ---------------------------------------------------------------------------- */

typedef struct host_opts {
    const char *script;
    const char *lua_root; /* a checkout (lua/, build/lua/) or an install prefix (share/lua/5.4) */
    long frames;
    long budget;        /* Lua VM instructions per frame; 0 = unlimited */
    long setup_budget;  /* for running the script's main chunk */
    size_t mem_cap;     /* live Lua heap per state, bytes; 0 = unlimited */
    size_t tensor_cap;  /* k3 host memory (tensor storage, scratch) per state; 0 = unlimited */
    double dt;
    int threads;        /* 0: one state on the main thread; N >= 1: reference run + N threads */
} host_opts;

static const char *usage_text =
    "usage: k3-host [options]   (--key value or --key=value)\n"
    "  --script FILE       the frame script (defines on_frame(dt)); default: clean.lua\n"
    "  --frames N          frames to run (default 10)\n"
    "  --budget N          Lua instructions per frame, 0 = unlimited (default 5000000)\n"
    "  --setup-budget N    Lua instructions for the script's main chunk (default 500000000)\n"
    "  --mem-cap BYTES     live Lua memory per state, 0 = unlimited (default 64M; K/M/G ok)\n"
    "  --tensor-cap BYTES  k3 host memory per state (tensor storage and k3's records for\n"
    "                      each tensor), 0 = unlimited (default 1G)\n"
    "  --dt SECONDS        the dt passed to on_frame (default 1/60)\n"
    "  --threads N         run N states on N threads at once and compare them with a\n"
    "                      single-threaded run, bit for bit\n"
    "  --lua-root DIR      where lua/k3 (a checkout) or share/lua/5.4/k3 (a prefix) is;\n"
    "                      default: found from the executable's location\n"
    "A script that fails frames on purpose (a demo of the budget or the caps) declares them in\n"
    "a global table expected_failures = {[frame] = \"error\" | \"budget\" | \"memory\"}.\n"
    "exit status:\n"
    "  0  every frame ran, or failed exactly as expected_failures says\n"
    "  1  a bad option, or the setup (loading k3 or the script) failed\n"
    "  2  --threads: a state's results differ from the single-threaded run\n"
    "  3  a frame failed unexpectedly, or a frame in expected_failures did not fail that way\n"
    "     (also when it never ran: --frames stops before it)\n";

/* Parses a count with an optional K/M/G suffix (powers of 1024). */
static int parse_size(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0) return 0;
    long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1LL << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1LL << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1LL << 30, end++;
    if (*end != '\0' || v > LLONG_MAX / mul) return 0;
    *out = v * mul;
    return 1;
}

/* ---- output (one mutex so lines of concurrent states never interleave) --------------------- */

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *prefix, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&out_lock);
    fputs(prefix, stdout);
    vfprintf(stdout, fmt, ap);
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
    va_end(ap);
}

/* ---- one Lua state and its accounting ------------------------------------------------------- */

typedef enum { FAIL_NONE = 0, FAIL_ERROR, FAIL_BUDGET, FAIL_MEMORY } fail_kind;
static const char *const fail_names[] = {"ok", "error", "budget", "memory"};

/* A frame the script fails on purpose, from its global expected_failures. */
typedef struct {
    long frame;
    fail_kind kind;
} expected_failure;

typedef struct host_state {
    const host_opts *o;
    lua_State *L;
    int id;             /* 0: the single-threaded run; 1..N: threads */
    char prefix[32];    /* "" or "[state i] " */
    /* Lua heap */
    size_t used, peak, cap, headroom;
    int deny_pending;   /* the last growth was refused; Lua collects and retries once */
    int over_cap;       /* granted from the headroom: the frame stops at its next instruction */
    int in_frame;       /* a phase (setup or a frame) is running: the hook enforces its limits */
    /* k3 host memory charged to this state (tensor storage and kernel scratch) */
    size_t t_used, t_peak;
    size_t t_allocs;      /* k3 host allocations live */
    size_t t_refused;     /* the size of the allocation the cap refused */
    int tensor_refused; /* this frame asked k3 for more than the tensor cap */
    /* this frame */
    fail_kind fail;
    long budget_now;    /* this phase's instruction budget; 0 = unlimited */
    long spent;         /* instructions charged to this phase, over every Lua thread */
    /* the script's expected_failures (malloc'd; freed by state_close) */
    expected_failure *expected;
    size_t nexpected;
    /* results */
    long frames_run, frames_failed, frames_failed_expected;
    long unexpected; /* frames that failed unexpectedly or did not fail as expected (or never ran) */
    uint64_t digest;
    int setup_ok;
} host_state;

static host_state *state_of(lua_State *L) {
    void *ud;
    lua_getallocf(L, &ud);
    return ud;
}

static void count_hook(lua_State *L, lua_Debug *ar);

/* The Lua allocator. A growth past the cap is refused once (Lua then runs an emergency full
 * collection and retries), so the cap bounds live memory, not garbage. If the retry still
 * does not fit, it is granted from a small headroom and the frame is stopped at its next
 * instruction by the hook, which raises an ordinary error: the report gets a traceback.
 * Past cap + headroom the request fails and Lua raises its own "not enough memory". Lua
 * requires shrinking and freeing never to fail, so only growth is checked. */
static void *lua_alloc_capped(void *ud, void *ptr, size_t osize, size_t nsize) {
    host_state *h = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        h->used -= old;
        return NULL;
    }
    if (nsize > old && h->cap) {
        size_t want = h->used - old + nsize;
        if (want > h->cap) {
            if (!h->deny_pending && !h->over_cap) {
                h->deny_pending = 1;
                return NULL;
            }
            if (want > h->cap + h->headroom) return NULL;
            if (!h->over_cap) {
                h->over_cap = 1;
                /* lua_sethook may be called at any point (lua.c calls it from a signal
                 * handler), so arming it from inside an allocation is safe. */
                if (h->in_frame && h->L) lua_sethook(h->L, count_hook, LUA_MASKCOUNT, 1);
            }
        }
    }
    void *p = realloc(ptr, nsize);
    if (!p) return NULL;
    h->deny_pending = 0;
    h->used = h->used - old + nsize;
    if (h->used > h->peak) h->peak = h->used;
    return p;
}

/* k3's allocator is process-wide; each thread charges the state it is running. */
static _Thread_local host_state *t_current;

static void *k3_alloc_counted(void *ud, void *ptr, size_t old_size, size_t new_size) {
    (void)ud;
    host_state *h = t_current;
    size_t old = ptr ? old_size : 0;
    if (new_size == 0) {
        free(ptr);
        if (h) h->t_used -= old;
        if (h && ptr) h->t_allocs--;
        return NULL;
    }
    if (h && h->o->tensor_cap && new_size > old && h->t_used - old + new_size > h->o->tensor_cap) {
        h->tensor_refused = 1;
        h->t_refused = new_size;
        return NULL; /* k3 turns this into K3_ENOMEM, a Lua error the frame reports */
    }
    void *p = realloc(ptr, new_size);
    if (p && h) {
        if (!ptr) h->t_allocs++;
        h->t_used = h->t_used - old + new_size;
        if (h->t_used > h->t_peak) h->t_peak = h->t_used;
    }
    return p;
}

/* Instructions a thread runs between two calls of its hook, at most. Every Lua thread carries
 * the hook from the state's creation on (lua_newthread copies the creating thread's hook, so
 * every coroutine has it too), and each call charges the instructions the thread ran since
 * the last one to the running phase: the budget covers every thread that runs during a frame,
 * coroutines made in the main chunk included. A coroutine that ends between two calls goes
 * uncharged for fewer than HOOK_QUANTUM instructions, and what a thread ran in one phase
 * before its next call is charged to the next phase: the budget holds to within this many
 * instructions per coroutine. */
#define HOOK_QUANTUM 1000

/* Arms L's count hook for its next stretch: the rest of the phase's budget, at most
 * HOOK_QUANTUM instructions. lua_sethook may be called on any thread at any point (lua.c
 * calls it from a signal handler). */
static void arm_hook(host_state *h, lua_State *L) {
    long n = HOOK_QUANTUM;
    if (h->in_frame && h->budget_now > 0 && h->budget_now - h->spent < n)
        n = h->budget_now - h->spent;
    lua_sethook(L, count_hook, LUA_MASKCOUNT, n < 1 ? 1 : (int)n);
}

/* The budget and memory-cap hook. Once a phase is over budget or over the cap, the hook
 * fires on every instruction of this thread and of the main thread (where a coroutine's error
 * lands: coroutine.resume catches it), so a script that catches the error with pcall is
 * stopped again at once. */
static void count_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    host_state *h = state_of(L);
    h->spent += lua_gethookcount(L);
    int over_budget = h->budget_now > 0 && h->spent >= h->budget_now;
    if (!h->in_frame || (!h->over_cap && !over_budget)) {
        arm_hook(h, L);
        return;
    }
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
    if (L != h->L) lua_sethook(h->L, count_hook, LUA_MASKCOUNT, 1);
    luaL_where(L, 0);
    if (h->over_cap) {
        h->fail = FAIL_MEMORY;
        lua_pushfstring(L, "Lua memory cap of %I bytes exceeded (%I bytes live)",
                        (lua_Integer)h->cap, (lua_Integer)h->used);
    } else {
        h->fail = FAIL_BUDGET;
        lua_pushfstring(L, "instruction budget of %I exceeded", (lua_Integer)h->budget_now);
    }
    lua_concat(L, 2);
    lua_error(L);
}

/* lua.c's message handler: the error message (or its __tostring) plus a traceback. The hook
 * stays armed: turning the error into text runs under the failing phase's budget and cap, so
 * a __tostring that loops or hoards is stopped like any other code (building the traceback
 * itself runs no Lua instructions). A __tostring that fails is reported with its reason. */
static int msghandler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_getmetafield(L, 1, "__tostring") != LUA_TNIL) {
            lua_pushvalue(L, 1);
            int rc = lua_pcall(L, 1, 1, 0);
            if (rc == LUA_OK && lua_type(L, -1) == LUA_TSTRING) return 1;
            /* The frame's pcall sees this handler's result as an ordinary error: keep the
             * kind of a memory failure (the hook has already set a budget or cap stop). */
            if (rc == LUA_ERRMEM && state_of(L)->fail == FAIL_NONE) state_of(L)->fail = FAIL_MEMORY;
            if (rc == LUA_OK)
                msg = lua_pushfstring(L, "(error object is a %s value; its __tostring returned a %s value)",
                                      luaL_typename(L, 1), luaL_typename(L, -1));
            else if (lua_type(L, -1) == LUA_TSTRING)
                msg = lua_pushfstring(L, "(error object is a %s value; its __tostring failed: %s)",
                                      luaL_typename(L, 1), lua_tostring(L, -1));
            else
                msg = lua_pushfstring(L, "(error object is a %s value; its __tostring failed with a %s value)",
                                      luaL_typename(L, 1), luaL_typename(L, -1));
        } else {
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
        }
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* ---- paths ------------------------------------------------------------------------------- */

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Finds lua/k3/init.lua: under --lua-root, or relative to the executable (build/examples/host
 * in a checkout, PREFIX/bin after an install). Fills path/cpath; 0 when nothing was found. */
static int find_lua_paths(const char *root_opt, char *root_out, size_t rn, char *path,
                          char *cpath, size_t n) {
    char exe[PATH_MAX], buf[2 * PATH_MAX];
    const char *roots[5];
    int nroots = 0;
    char r[4][PATH_MAX + 16], build[PATH_MAX + 16] = "";
    if (root_opt) roots[nroots++] = root_opt;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        /* In a checkout the host is <build>/examples/host/k3-host, where <build> is build/ or a
         * directory under it (build/asan): its Lua C module is <build>/lua, and the checkout
         * is the first parent of <build> holding lua/k3/init.lua. */
        snprintf(build, sizeof build, "%s/../..", exe);
        snprintf(r[0], sizeof r[0], "%s/../../..", exe);
        snprintf(r[1], sizeof r[1], "%s/../../../..", exe);
        snprintf(r[2], sizeof r[2], "%s/../../../../..", exe);
        snprintf(r[3], sizeof r[3], "%s/..", exe); /* <prefix>/bin */
        if (!root_opt)
            for (int i = 0; i < 4; i++) roots[nroots++] = r[i];
    }
    for (int i = 0; i < nroots; i++) {
        char canon[PATH_MAX];
        if (!realpath(roots[i], canon)) continue;
        roots[i] = canon;
        snprintf(buf, sizeof buf, "%s/lua/k3/init.lua", roots[i]);
        if (is_file(buf)) {
            char bcanon[PATH_MAX];
            snprintf(buf, sizeof buf, "%s/lua/k3/core.so", build);
            const char *b = build[0] && is_file(buf) && realpath(build, bcanon) ? bcanon : NULL;
            snprintf(path, n, "%s/lua/?.lua;%s/lua/?/init.lua", roots[i], roots[i]);
            if (b) snprintf(cpath, n, "%s/lua/?.so", b);
            else snprintf(cpath, n, "%s/build/lua/?.so", roots[i]);
            snprintf(root_out, rn, "%s", roots[i]);
            return 1;
        }
        snprintf(buf, sizeof buf, "%s/share/lua/5.4/k3/init.lua", roots[i]);
        if (is_file(buf)) {
            snprintf(path, n, "%s/share/lua/5.4/?.lua;%s/share/lua/5.4/?/init.lua", roots[i],
                     roots[i]);
            snprintf(cpath, n, "%s/lib/lua/5.4/?.so", roots[i]);
            snprintf(root_out, rn, "%s", roots[i]);
            return 1;
        }
    }
    return 0;
}

static char g_path[4 * PATH_MAX], g_cpath[4 * PATH_MAX], g_root[PATH_MAX + 16];

/* Prepends `value` to package[field]. */
static void prepend_package(lua_State *L, const char *field, const char *value) {
    lua_getglobal(L, "package");
    lua_getfield(L, -1, field);
    lua_pushfstring(L, "%s;%s", value, lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
    lua_setfield(L, -3, field);
    lua_pop(L, 2);
}

/* ---- running a state ---------------------------------------------------------------------- */

/* FNV-1a over bytes: the digest of a state's frames, compared across threads. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* Folds a frame's status and returned value (string bytes, exact hex float, type name). */
static void fold_result(host_state *h, long frame, int idx) {
    char buf[64];
    int k = snprintf(buf, sizeof buf, "%ld:%s:", frame, fail_names[h->fail]);
    h->digest = fnv(h->digest, buf, (size_t)k);
    if (h->fail != FAIL_NONE) return;
    size_t n;
    const char *s;
    switch (lua_type(h->L, idx)) {
    case LUA_TSTRING:
        s = lua_tolstring(h->L, idx, &n);
        h->digest = fnv(h->digest, s, n);
        break;
    case LUA_TNUMBER:
        k = lua_isinteger(h->L, idx)
                ? snprintf(buf, sizeof buf, "%lld", (long long)lua_tointeger(h->L, idx))
                : snprintf(buf, sizeof buf, "%a", (double)lua_tonumber(h->L, idx));
        h->digest = fnv(h->digest, buf, (size_t)k);
        break;
    default:
        s = luaL_typename(h->L, idx);
        h->digest = fnv(h->digest, s, strlen(s));
    }
}

/* Runs the function below the argument count on the stack under `budget`, with the message
 * handler. Returns the lua_pcall status; sets h->fail. Leaves one result (or the error). */
static int protected_run(host_state *h, int nargs, long budget) {
    lua_State *L = h->L;
    int base = lua_gettop(L) - nargs; /* the function's slot */
    lua_pushcfunction(L, msghandler);
    lua_insert(L, base);
    h->fail = FAIL_NONE;
    h->over_cap = 0;
    h->deny_pending = 0;
    h->tensor_refused = 0;
    h->budget_now = budget;
    h->spent = 0;
    h->in_frame = 1;
    arm_hook(h, L);
    int rc = lua_pcall(L, nargs, 1, base);
    h->in_frame = 0;
    h->budget_now = 0;
    arm_hook(h, L);
    lua_remove(L, base);
    if (rc != LUA_OK && h->fail == FAIL_NONE)
        h->fail = rc == LUA_ERRMEM || h->tensor_refused ? FAIL_MEMORY : FAIL_ERROR;
    return rc;
}

static void report_failure(host_state *h, const char *what) {
    /* Only a string is read: converting a number would allocate, outside any protection. */
    const char *msg = lua_type(h->L, -1) == LUA_TSTRING ? lua_tostring(h->L, -1) : NULL;
    if (h->fail == FAIL_MEMORY && h->tensor_refused)
        say(h->prefix,
            "%s failed (memory): tensor cap of %zu bytes exceeded (%zu bytes in use in %zu "
            "allocations, %zu more asked for; the cap counts all of k3's host memory: each "
            "tensor's storage plus its handle and storage record, parsed headers, scratch): %s\n",
            what, h->o->tensor_cap, h->t_used, h->t_allocs, h->t_refused, msg ? msg : "(no message)");
    else if (h->fail == FAIL_MEMORY && h->cap && !strstr(msg ? msg : "", "memory cap"))
        say(h->prefix, "%s failed (memory): Lua memory cap of %zu bytes exceeded (%zu bytes live): %s\n",
            what, h->cap, h->used, msg ? msg : "(no message)");
    else if (h->fail == FAIL_MEMORY && !h->cap) /* no cap: the system allocator refused */
        say(h->prefix, "%s failed (memory): out of memory with no Lua cap (%zu bytes live): %s\n",
            what, h->used, msg ? msg : "(no message)");
    else
        say(h->prefix, "%s failed (%s): %s\n", what, fail_names[h->fail],
            msg ? msg : "(error object is not a string)");
}

/* The frame, as a C function run protected: looks up on_frame (the globals table may have
 * metamethods that raise) and calls it with dt, returning its first result. */
static int frame_call(lua_State *L) {
    lua_getglobal(L, "on_frame");
    if (!lua_isfunction(L, -1))
        return luaL_error(L, "on_frame is not a function (it is a %s value)", luaL_typename(L, -1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* Whether the script defined a global function on_frame (run protected). */
static int has_on_frame(lua_State *L) {
    lua_getglobal(L, "on_frame");
    lua_pushboolean(L, lua_isfunction(L, -1));
    return 1;
}

static int by_frame(const void *a, const void *b) {
    long fa = ((const expected_failure *)a)->frame, fb = ((const expected_failure *)b)->frame;
    return (fa > fb) - (fa < fb);
}

/* Reads the script's global expected_failures = {[frame] = "error"|"budget"|"memory"} into
 * h->expected (run protected: the globals may have metamethods). nil means none. */
static int read_expected(lua_State *L) {
    static const char *const kinds[] = {"error", "budget", "memory", NULL};
    host_state *h = lua_touserdata(L, 1);
    int ty = lua_getglobal(L, "expected_failures");
    if (ty == LUA_TNIL) return 0;
    if (ty != LUA_TTABLE)
        return luaL_error(L, "expected_failures must be a table {[frame] = \"error\"|\"budget\"|"
                             "\"memory\"}; got a %s value", luaL_typename(L, -1));
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        n++;
        lua_pop(L, 1);
    }
    h->expected = calloc(n ? n : 1, sizeof *h->expected);
    if (!h->expected) return luaL_error(L, "expected_failures: out of memory");
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        int isint;
        lua_Integer f = lua_tointegerx(L, -2, &isint);
        if (lua_type(L, -2) != LUA_TNUMBER || !isint || f < 1)
            return luaL_error(L, "expected_failures: keys must be frame numbers >= 1; got %s",
                              luaL_tolstring(L, -2, NULL));
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
        int kind = 0;
        while (kinds[kind] && strcmp(kinds[kind], k) != 0) kind++;
        if (!kinds[kind])
            return luaL_error(L, "expected_failures[%I] must be \"error\", \"budget\" or "
                                 "\"memory\"; got %s",
                              f, luaL_tolstring(L, -1, NULL));
        h->expected[h->nexpected].frame = (long)f;
        h->expected[h->nexpected].kind = (fail_kind)(kind + 1);
        h->nexpected++;
        lua_pop(L, 1);
    }
    /* By frame number: lua_next's order is the table's, and reports should not depend on it. */
    qsort(h->expected, h->nexpected, sizeof *h->expected, by_frame);
    return 0;
}

/* The failure the script expects in frame f (FAIL_NONE: none). */
static fail_kind expected_kind(const host_state *h, long f) {
    for (size_t i = 0; i < h->nexpected; i++)
        if (h->expected[i].frame == f) return h->expected[i].kind;
    return FAIL_NONE;
}

/* Opens the standard libraries, points package.path/cpath at k3's Lua files, sets the
 * `host` global and loads k3 with luaL_requiref (global `k3`). Runs protected. */
static int setup_libs(lua_State *L) {
    host_state *h = lua_touserdata(L, 1);
    const host_opts *o = h->o;
    luaL_openlibs(L);
    prepend_package(L, "path", g_path);
    prepend_package(L, "cpath", g_cpath);
    lua_createtable(L, 0, 6); /* what the script may want to know about its host */
    lua_pushinteger(L, h->id);
    lua_setfield(L, -2, "state");
    lua_pushinteger(L, o->frames);
    lua_setfield(L, -2, "frames");
    lua_pushinteger(L, o->budget);
    lua_setfield(L, -2, "budget");
    lua_pushinteger(L, (lua_Integer)o->mem_cap);
    lua_setfield(L, -2, "mem_cap");
    lua_pushinteger(L, (lua_Integer)o->tensor_cap);
    lua_setfield(L, -2, "tensor_cap");
    lua_pushstring(L, g_root);
    lua_setfield(L, -2, "root");
    lua_setglobal(L, "host");
    luaL_requiref(L, "k3", luaopen_k3, 1);
    return 1;
}

/* Creates the state, loads k3 and runs the script's main chunk. 0 on failure (reported). */
static int state_open(host_state *h, const host_opts *o, int id) {
    memset(h, 0, sizeof *h);
    h->o = o;
    h->id = id;
    h->cap = o->mem_cap;
    h->headroom = o->mem_cap / 8 + (256 << 10); /* room to build the error report */
    h->digest = 0xcbf29ce484222325ULL;
    if (id > 0) snprintf(h->prefix, sizeof h->prefix, "[state %d] ", id);
    t_current = h;
    h->L = lua_newstate(lua_alloc_capped, h);
    if (!h->L) {
        say(h->prefix, "setup failed: lua_newstate: not enough memory\n");
        return 0;
    }
    lua_State *L = h->L;
    arm_hook(h, L); /* before any thread exists: every coroutine inherits it */
    lua_gc(L, LUA_GCGEN, 0, 0); /* short frames make lots of young garbage */
    /* Libraries, paths and k3 are set up inside a protected call: any of them can raise. */
    lua_pushcfunction(L, setup_libs);
    lua_pushlightuserdata(L, h);
    if (protected_run(h, 1, o->setup_budget) != LUA_OK) {
        report_failure(h, "setup (loading k3)");
        return 0;
    }
    lua_pop(L, 1);

    int rc = luaL_loadfile(L, o->script);
    if (rc != LUA_OK) {
        h->fail = rc == LUA_ERRMEM ? FAIL_MEMORY : FAIL_ERROR;
        report_failure(h, "setup (loading the script)");
        return 0;
    }
    if (protected_run(h, 0, o->setup_budget) != LUA_OK) {
        report_failure(h, "setup (running the script)");
        return 0;
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, has_on_frame);
    int ok = protected_run(h, 0, o->setup_budget) == LUA_OK && lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (!ok) {
        say(h->prefix, "setup failed: %s does not define a global function on_frame(dt)\n",
            o->script);
        return 0;
    }
    lua_pushcfunction(L, read_expected);
    lua_pushlightuserdata(L, h);
    if (protected_run(h, 1, o->setup_budget) != LUA_OK) {
        report_failure(h, "setup (reading expected_failures)");
        return 0;
    }
    lua_pop(L, 1);
    h->setup_ok = 1;
    return 1;
}

static void state_frames(host_state *h) {
    lua_State *L = h->L;
    t_current = h;
    for (long f = 1; f <= h->o->frames; f++) {
        int top = lua_gettop(L);
        lua_pushcfunction(L, frame_call);
        lua_pushnumber(L, h->o->dt);
        int rc = protected_run(h, 1, h->o->budget);
        h->frames_run++;
        fold_result(h, f, -1);
        if (rc != LUA_OK) {
            char what[48];
            snprintf(what, sizeof what, "frame %ld", f);
            h->frames_failed++;
            report_failure(h, what);
        }
        fail_kind want = expected_kind(h, f);
        if (want != FAIL_NONE && h->fail == want) {
            h->frames_failed_expected++;
        } else if (want != FAIL_NONE) {
            h->unexpected++;
            say(h->prefix, "frame %ld was expected to fail (%s) but %s%s%s\n", f, fail_names[want],
                h->fail == FAIL_NONE ? "succeeded" : "failed (",
                h->fail == FAIL_NONE ? "" : fail_names[h->fail], h->fail == FAIL_NONE ? "" : ")");
        } else if (h->fail != FAIL_NONE) {
            h->unexpected++;
        }
        lua_settop(L, top);
        /* A failed frame's garbage may hold tensors and most of the cap: release it now. */
        if (rc != LUA_OK) lua_gc(L, LUA_GCCOLLECT);
    }
    /* A frame past --frames never ran, so the failure expected there did not happen either:
     * a run too short for the demo must not pass as one that went as the script says. */
    for (size_t i = 0; i < h->nexpected; i++) {
        if (h->expected[i].frame <= h->frames_run) continue;
        h->unexpected++;
        say(h->prefix, "frame %ld was expected to fail (%s) but never ran (--frames %ld)\n",
            h->expected[i].frame, fail_names[h->expected[i].kind], h->o->frames);
    }
}

static void state_close(host_state *h) {
    t_current = h;
    if (h->L) lua_close(h->L);
    h->L = NULL;
    t_current = NULL;
    free(h->expected);
    h->expected = NULL;
    h->nexpected = 0;
}

static void print_summary(const host_state *h) {
    say(h->prefix, "frames run: %ld\n", h->frames_run);
    say(h->prefix, "frames failed: %ld\n", h->frames_failed);
    say(h->prefix, "frames failed as expected: %ld\n", h->frames_failed_expected);
    say(h->prefix, "unexpected frame results: %ld\n", h->unexpected);
    say(h->prefix, "peak Lua memory: %zu bytes\n", h->peak);
    say(h->prefix, "peak tensor memory: %zu bytes\n", h->t_peak);
    say(h->prefix, "digest: %016" PRIx64 "\n", h->digest);
}

static void print_stat(void *ud, const char *kind, const char *name, uint64_t count) {
    (void)ud;
    say("", "k3 %s %s: %" PRIu64 "\n", kind, name, count);
}

/* ---- threads ------------------------------------------------------------------------------ */

typedef struct thread_job {
    host_state h;
    const host_opts *o;
    int id;
    pthread_barrier_t *barrier;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    int ok = state_open(&j->h, j->o, j->id);
    /* Every state starts its frames together, so the frames really run at the same time. */
    pthread_barrier_wait(j->barrier);
    if (ok) state_frames(&j->h);
    if (j->h.L) {
        state_close(&j->h);
    }
    return NULL;
}

static int run_threads(const host_opts *o) {
    host_state ref;
    say("", "threads: single-threaded reference run\n");
    int ok = state_open(&ref, o, 0);
    if (ok) state_frames(&ref);
    state_close(&ref);
    if (!ok) return 1;
    print_summary(&ref);
    int unexpected = ref.unexpected > 0;

    int n = o->threads;
    thread_job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    pthread_barrier_t barrier;
    if (!jobs || !tids || pthread_barrier_init(&barrier, NULL, (unsigned)n) != 0) {
        say("", "threads: out of memory\n");
        free(jobs);
        free(tids);
        return 1;
    }
    say("", "threads: %d states on %d threads at once\n", n, n);
    int started = 0;
    for (int i = 0; i < n; i++) {
        jobs[i].o = o;
        jobs[i].id = i + 1;
        jobs[i].barrier = &barrier;
        if (pthread_create(&tids[i], NULL, thread_main, &jobs[i]) != 0) break;
        started++;
    }
    if (started < n) {
        /* The barrier would never open: report and wait for nothing further. */
        say("", "threads: could not start thread %d\n", started + 1);
        for (int i = started; i < n; i++) pthread_barrier_wait(&barrier);
    }
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    pthread_barrier_destroy(&barrier);
    int mismatch = started < n;
    for (int i = 0; i < started; i++) {
        print_summary(&jobs[i].h);
        int same = jobs[i].h.setup_ok && jobs[i].h.digest == ref.digest &&
                   jobs[i].h.frames_failed == ref.frames_failed;
        if (!same) mismatch = 1;
        if (jobs[i].h.unexpected > 0) unexpected = 1;
        say("", "threads: state %d %s the single-threaded run (%016" PRIx64 " vs %016" PRIx64
                ")\n", i + 1, same ? "matches" : "DIFFERS FROM", jobs[i].h.digest, ref.digest);
    }
    say("", "threads: %s\n", mismatch ? "MISMATCH" : "all states match the single-threaded run bit for bit");
    free(jobs);
    free(tids);
    return mismatch ? 2 : unexpected ? 3 : 0;
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    host_opts o = {.script = NULL,
                   .lua_root = NULL,
                   .frames = 10,
                   .budget = 5000000,
                   .setup_budget = 500000000,
                   .mem_cap = 64u << 20,
                   .tensor_cap = 1u << 30,
                   .dt = 1.0 / 60.0,
                   .threads = 0};
    /* getopt_long: "--key value" and "--key=value"; '+' stops at the first non-option (a
     * script path given without --script is then reported), ':' reports a missing value. */
    static const struct option longopts[] = {
        {"script", required_argument, NULL, 's'},   {"lua-root", required_argument, NULL, 'r'},
        {"frames", required_argument, NULL, 'f'},   {"budget", required_argument, NULL, 'b'},
        {"setup-budget", required_argument, NULL, 'u'}, {"mem-cap", required_argument, NULL, 'm'},
        {"tensor-cap", required_argument, NULL, 't'}, {"dt", required_argument, NULL, 'd'},
        {"threads", required_argument, NULL, 'n'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    opterr = 0;
    int c, idx = -1;
    while ((c = getopt_long(argc, argv, "+:h", longopts, &idx)) != -1) {
        const char *a = argv[optind - 1], *v = optarg;
        char name[64]; /* the option as given (without "=value"), or its long name */
        if (c != '?' && c != ':' && idx >= 0) snprintf(name, sizeof name, "--%s", longopts[idx].name);
        else snprintf(name, sizeof name, "%.*s", (int)strcspn(a, "="), a);
        idx = -1;
        if (c == 'h') {
            fputs(usage_text, stdout);
            return 0;
        }
        if (c == '?') {
            fprintf(stderr, "k3-host: unknown option %s\n%s", optopt ? (char[]){'-', (char)optopt, 0} : name,
                    usage_text);
            return 1;
        }
        if (c == ':') {
            fprintf(stderr, "k3-host: %s needs a value\n%s", name, usage_text);
            return 1;
        }
        long long n = 0;
        int ok = 1;
        char *end = NULL;
        if (c == 's') o.script = v;
        else if (c == 'r') o.lua_root = v;
        else if (c == 'd') {
            o.dt = strtod(v, &end); /* seconds: a finite number >= 0 */
            ok = end != v && !*end && isfinite(o.dt) && o.dt >= 0;
        }
        else if (!parse_size(v, &n)) ok = 0;
        else if (c == 'f') o.frames = (long)n;
        else if (c == 'b') o.budget = (long)n;
        else if (c == 'u') o.setup_budget = (long)n;
        else if (c == 'm') o.mem_cap = (size_t)n;
        else if (c == 't') o.tensor_cap = (size_t)n;
        else if (c == 'n' && n >= 1 && n <= 64) o.threads = (int)n;
        else ok = 0;
        if (!ok) {
            const char *want = c == 'd'   ? "a finite number of seconds >= 0"
                               : c == 'n' ? "an integer in 1..64"
                                          : "an integer >= 0, optionally with a K, M or G suffix";
            fprintf(stderr, "k3-host: bad option %s %s (expected %s)\n%s", name, v, want, usage_text);
            return 1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "k3-host: unexpected argument '%s' (options only; a script is "
                        "given as --script FILE)\n%s", argv[optind], usage_text);
        return 1;
    }
    if (!find_lua_paths(o.lua_root, g_root, sizeof g_root, g_path, g_cpath, sizeof g_cpath)) {
        fprintf(stderr, "k3-host: lua/k3/init.lua not found (from %s); pass --lua-root DIR\n",
                o.lua_root ? o.lua_root : "the executable's location");
        return 1;
    }
    static char default_script[PATH_MAX + 64];
    if (!o.script) {
        snprintf(default_script, sizeof default_script, "%s/examples/host/scripts/clean.lua", g_root);
        o.script = default_script;
    }
    /* Before any tensor exists: count k3's host memory per state. */
    if (k3_set_allocator(k3_alloc_counted, NULL) != K3_OK) {
        fprintf(stderr, "k3-host: %s\n", k3_last_error());
        return 1;
    }
    k3_stats_reset();
    say("", "k3-host: k3 %s, script %s, %ld frames, budget %ld instructions/frame, "
            "Lua memory cap %zu bytes, tensor cap %zu bytes\n",
        K3_VERSION_STRING, o.script, o.frames, o.budget, o.mem_cap, o.tensor_cap);

    int rc;
    if (o.threads > 0) {
        rc = run_threads(&o);
    } else {
        host_state h;
        int ok = state_open(&h, &o, 0);
        if (ok) state_frames(&h);
        state_close(&h);
        if (ok) print_summary(&h);
        rc = !ok ? 1 : h.unexpected > 0 ? 3 : 0;
    }
    k3_stats(print_stat, NULL);
    return rc;
}
