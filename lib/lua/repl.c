/*
 * repl.c — Tab completion for the REPL (scripts/k3) on the interpreter's own readline: lua5.4
 * reads its lines with GNU readline when it was built with it (Debian's is), so the binding
 * finds readline's hooks in the running process (dlsym) and asks a Lua function for the
 * candidates. Nothing links against readline: where the interpreter has none, installing the
 * hook reports so and the REPL keeps its plain line input.
 */
#include "k3_lua.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* readline's types and variables, as its header declares them (readline/readline.h). */
typedef char *rl_compentry_func(const char *text, int state);
typedef char **rl_completion_func(const char *text, int start, int end);

static struct {
    rl_completion_func **attempted; /* rl_attempted_completion_function */
    char **(*matches)(const char *, rl_compentry_func *); /* rl_completion_matches */
    char **line_buffer;              /* rl_line_buffer */
    const char **word_breaks;        /* rl_completer_word_break_characters */
    int *append_character;           /* rl_completion_append_character */
    int *attempted_over;             /* rl_attempted_completion_over */
} rl;

/* readline is one per process, so the state it completes for is too: the last state that
 * installed the hook (the REPL's one state). */
static lua_State *repl_state;

/* The candidates of the current completion (malloc'd: readline frees what the generator
 * returns) and the next one to hand out. */
static char **cands;
static int ncands, next_cand;

static void clear_cands(void) {
    for (int i = next_cand; i < ncands; i++) free(cands[i]);
    free(cands);
    cands = NULL;
    ncands = next_cand = 0;
}

static char *generator(const char *text, int state) {
    (void)text;
    (void)state;
    return next_cand < ncands ? cands[next_cand++] : NULL;
}

/* Calls the Lua completer (registry K3L_REG_COMPLETER) with the word and the whole line;
 * copies the strings of the list it returns. A completer that raises completes nothing: an
 * error must not end the REPL in the middle of a line. */
static char **attempt(const char *text, int start, int end) {
    (void)start;
    (void)end;
    *rl.attempted_over = 1; /* no file-name completion when ours finds nothing */
    *rl.append_character = '\0';
    clear_cands();
    lua_State *L = repl_state;
    int top = lua_gettop(L);
    lua_getfield(L, LUA_REGISTRYINDEX, K3L_REG_COMPLETER);
    lua_pushstring(L, text);
    lua_pushstring(L, *rl.line_buffer ? *rl.line_buffer : "");
    if (lua_pcall(L, 2, 1, 0) == LUA_OK && lua_istable(L, -1)) {
        lua_Integer n = luaL_len(L, -1);
        cands = n > 0 ? calloc((size_t)n, sizeof *cands) : NULL;
        for (lua_Integer i = 1; cands && i <= n; i++) {
            lua_geti(L, -1, i);
            const char *s = lua_tostring(L, -1);
            if (s && (cands[ncands] = strdup(s))) ncands++;
            lua_pop(L, 1);
        }
    }
    lua_settop(L, top);
    return ncands ? rl.matches(text, generator) : NULL;
}

/* k3.core._repl_complete(fn) -> true when the interpreter reads lines with readline and Tab
 * now completes through fn(word, line) -> {candidate, ...} (each a whole replacement for word);
 * false (and nothing changes) when it has no readline. */
static int l_repl_complete(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    rl.attempted = dlsym(RTLD_DEFAULT, "rl_attempted_completion_function");
    *(void **)&rl.matches = dlsym(RTLD_DEFAULT, "rl_completion_matches");
    rl.line_buffer = dlsym(RTLD_DEFAULT, "rl_line_buffer");
    rl.word_breaks = dlsym(RTLD_DEFAULT, "rl_completer_word_break_characters");
    rl.append_character = dlsym(RTLD_DEFAULT, "rl_completion_append_character");
    rl.attempted_over = dlsym(RTLD_DEFAULT, "rl_attempted_completion_over");
    if (!rl.attempted || !rl.matches || !rl.line_buffer || !rl.word_breaks ||
        !rl.append_character || !rl.attempted_over) {
        lua_pushboolean(L, 0);
        return 1;
    }
    lua_pushvalue(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, K3L_REG_COMPLETER);
    repl_state = L;
    /* A word is an expression path (k3.nn.Linear, t:size): '.' and ':' do not break it. */
    *rl.word_breaks = " \t\n\"'`@$><=;|&{}()[],+-*/%^~#";
    *rl.attempted = attempt;
    lua_pushboolean(L, 1);
    return 1;
}

static const luaL_Reg repl_funcs[] = {{"_repl_complete", l_repl_complete}, {NULL, NULL}};

void k3l_open_repl(lua_State *L) { luaL_setfuncs(L, repl_funcs, 0); }
