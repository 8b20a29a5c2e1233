/*
 * k3_lua.h — what the files of the Lua binding (lib/lua/) share: the userdata and registry
 * names, the one way argument errors and core errors are raised, the argument readers, and
 * each file's registration function. The binding sees the core through k3.h and k3_embed.h
 * only, and is the only part of k3 that includes lua.h.
 */
#ifndef K3_LUA_H
#define K3_LUA_H

#include "k3.h"
#include "k3_embed.h"

#include <lauxlib.h>
#include <lua.h>

/* Metatables (luaL_newmetatable names, also the __name users see) and registry keys. */
#define K3L_TENSOR_MT "k3.Tensor"
#define K3L_METHOD_MT "k3.Method"
#define K3L_POLICY_MT "k3.Policy"
#define K3L_STATS_MT "k3.StatsSink"
#define K3L_SAFETENSORS_MT "k3.Safetensors"
#define K3L_REG_POLICY "k3.policy.compiled"
#define K3L_REG_TRACE "k3.trace"
#define K3L_REG_STATS "k3.stats.sink"
#define K3L_REG_TENSOR_METHODS "k3.Tensor.methods"
#define K3L_REG_COMPLETER "k3.repl.completer"

/* ---- errors (args.c) ------------------------------------------------------------------------ */

/* Raises "bad argument #arg to 'f' (msg)" through luaL_argerror, Lua's own wording and
 * naming (a method call does not count self). The one way the binding reports an argument
 * error: the luaL_check* readers end there too. */
int k3l_arg_error(lua_State *L, int arg, const char *fmt, ...);
/* Raises the thread's last k3 message as a Lua error. Callers free their temporaries first. */
int k3l_raise(lua_State *L);
/* The same under the name of the function the user called: the core names its own entry
 * point (k3.zeros runs k3_tensor_full, so "full: ..."; t:clone runs k3_tensor_to, so "to: ..."),
 * and a leading "<identifier>: " becomes "<fname>: ". A message without such a prefix ("tensor
 * has been freed", "CUDA error on cuda:0: ...") is raised as it is. */
int k3l_raise_as(lua_State *L, const char *fname);

/* Runs a core call with its messages numbered as Lua counts (from 1), restoring the thread's
 * numbering afterwards, so a C host on the same thread keeps its own (k3_embed.h). For the
 * call's duration the thread's device-pressure hook (k3_embed.h) is this state's full
 * collection (k3l_collect), so a device allocation that fails first frees what the collector
 * can; the previous hook is restored afterwards. Expands in functions with `L` in scope. */
#define K3L_RUN(s, expr)                                                                   \
    do {                                                                                   \
        int k3l_base_ = k3_set_message_base(1);                                            \
        void *k3l_pud_;                                                                    \
        k3_pressure_fn k3l_pfn_ = k3_set_pressure_hook(k3l_collect, L, &k3l_pud_);          \
        (s) = (expr);                                                                      \
        k3_set_pressure_hook(k3l_pfn_, k3l_pud_, NULL);                                    \
        k3_set_message_base(k3l_base_);                                                    \
    } while (0)
/* The pressure hook: lua_gc(L, LUA_GCCOLLECT) on the lua_State ud (tensor.c). */
void k3l_collect(void *ud);
/* K3L_RUN, then raise the core's message on failure (plain, or renamed as fname). */
#define CHECK_K3(L, expr)                                                                  \
    do {                                                                                   \
        k3_status k3l_s_;                                                                  \
        K3L_RUN(k3l_s_, expr);                                                             \
        if (k3l_s_ != K3_OK) return k3l_raise(L);                                          \
    } while (0)
#define CHECK_K3_AS(L, fname, expr)                                                        \
    do {                                                                                   \
        k3_status k3l_s_;                                                                  \
        K3L_RUN(k3l_s_, expr);                                                             \
        if (k3l_s_ != K3_OK) return k3l_raise_as(L, fname);                                \
    } while (0)

/* ---- argument readers (args.c) ---------------------------------------------------------------- */

/* Pushes user input as a message echoes it (k3_echo: at most K3_ECHO_MAX bytes, marked when
 * cut) and returns it; for messages raised right after, so the pushed string needs no
 * popping. */
const char *k3l_push_echo(lua_State *L, const char *s);
/* What an "integer" argument at idx got, for its error: the number as Lua prints it (NaN as
 * "nan"; the text is pushed on the stack) or the Lua type's name. */
const char *k3l_not_integer(lua_State *L, int idx);
/* The integer at idx: a Lua number with an integer value (a numeric string is not one: an
 * options table, a shape or an index holds numbers, as number options do); *ok says whether
 * it is (0 is returned when not). */
lua_Integer k3l_to_integer(lua_State *L, int idx, int *ok);
/* A value for a tensor of dtype dt: a Lua integer rounded once to dt (k3_int64_to_dtype:
 * through a double it would round twice above 2^53), a float as it is (the core rounds it
 * once). Anything else is a bad argument. */
double k3l_check_value(lua_State *L, int idx, k3_dtype dt);

/* Raises for a value past argument `last` (the options table, or where it would be): a table
 * passed one place too late ({out =} after a nil) must not be dropped silently. nil is
 * accepted. */
void k3l_check_last_arg(lua_State *L, int last);
/* The string at idx, refused (bad argument argn) when it holds a NUL byte: a name that C would
 * read cut short ("f32\0x" as "f32"). what names the value in the message. */
const char *k3l_check_cstring(lua_State *L, int idx, int argn, const char *what);
/* Raises for a key of the options table at idx that is not in `allowed` (NULL-terminated): a
 * misspelt option ({dtyp = "f64"}) must not silently fall back to a default. argn is the
 * argument reported. allowed must be a static array: its names' set is made once per state
 * and kept in the registry under its address, so a call costs a hash lookup per key. */
void k3l_check_option_keys(lua_State *L, int idx, const char *const *allowed, int argn);
/* Field `field` of the table at idx as an integer: nil gives dflt (or raises when required). */
int64_t k3l_int_field(lua_State *L, int idx, const char *field, int64_t dflt, int required,
                      int argn);
/* Field `field` of the table at idx as a number; nil gives dflt. */
double k3l_number_field(lua_State *L, int idx, const char *field, double dflt, int argn);
/* Field `field` of the table at idx as a boolean (0 or 1); nil gives dflt. Anything else
 * raises: "off" or 0 would be true in Lua, the opposite of what they say. */
int k3l_bool_field(lua_State *L, int idx, const char *field, int dflt, int argn);
/* The index of the string argument arg in names (NULL-terminated); def (non-NULL) when the
 * argument is absent. Anything else raises "unknown <what> 'x'; expected a, b or c". */
int k3l_check_name(lua_State *L, int arg, const char *def, const char *const names[],
                   const char *what);
/* The linear prologue of the options table at idx (0: no table; lib/lua/ops.c): field
 * 'prologue' nil (none), "silu_mul" or "rms_norm" (then 'norm_weight', a tensor, and 'eps', a
 * number, default 1e-5); anything else raises "field 'prologue' must be \"silu_mul\",
 * \"rms_norm\" or nil; got ...", and 'eps' without "rms_norm" raises too. The norm_weight
 * tensor stays referenced by the table. */
k3_linear_prologue_args k3l_prologue_field(lua_State *L, int idx, int argn);
/* The linear epilogue of the options table at idx (0: no table; lib/lua/ops.c): field
 * 'epilogue' nil (none) or "silu_mul"; anything else raises "field 'epilogue' must be
 * \"silu_mul\" or nil; got ...". */
k3_linear_epilogue k3l_epilogue_field(lua_State *L, int idx, int argn);
/* A shape table {d1, ..., dn} at idx (1 <= n <= 8, integers; negative sizes raise unless
 * allow_neg, for view's -1). Returns n. */
int k3l_check_shape(lua_State *L, int idx, int64_t *shape, int allow_neg);

/* The options of k3.empty and friends ({dtype =, device =, seed =}); absent or nil at idx gives
 * f32 on the CPU with seed 0. */
typedef struct k3l_create_opts {
    k3_dtype dtype;
    k3_device device;
    uint64_t seed;
} k3l_create_opts;
k3l_create_opts k3l_check_create_opts(lua_State *L, int idx);
/* Fields "dtype" and "device" of the options table at idx into *out when present (returns 1;
 * 0 leaves *out alone); a non-string or unknown name is a bad argument argn. */
int k3l_dtype_field(lua_State *L, int idx, k3_dtype *out, int argn);
int k3l_device_field(lua_State *L, int idx, k3_device *out, int argn);

/* ---- tensors (tensor.c) ---------------------------------------------------------------------- */

typedef struct k3l_tensor_ud {
    k3_tensor *t; /* NULL once freed */
} k3l_tensor_ud;

/* A new tensor userdata in the closed (NULL) state, pushed before anything is allocated, so an
 * error cannot leak a handle. */
k3l_tensor_ud *k3l_push_tensor(lua_State *L);
/* The live tensor at idx; raises "tensor has been freed" for a freed handle or storage. */
k3_tensor *k3l_check_tensor(lua_State *L, int idx);
/* Field `field` of the table at idx as a tensor: nil gives NULL (or raises when required). The
 * tensor is LEFT ON THE STACK so it stays alive until the call returns: the table may be a
 * proxy whose __index makes a fresh tensor that nothing else references. */
k3_tensor *k3l_tensor_field(lua_State *L, int idx, const char *field, int required, int argn);

/* Makes the tensor metatable's __index the function that serves t[i] as well as methods,
 * looking methods up in the table the binding's files filled while the module opened (the
 * metatable's __index until then; kept in the registry and as k3.core._tensor_methods, the
 * one place to add a method later). Called once the module's files are open, with the module
 * table on top; safe to call again. */
void k3l_tensor_index(lua_State *L);

/* The REPL's Tab completion on the interpreter's readline (repl.c): k3.core._repl_complete. */
void k3l_open_repl(lua_State *L);

/* ---- the state's policy (ops.c) -------------------------------------------------------------- */

/* The compiled policy this state's ops dispatch with (k3.set_policy, k3.set_batch_invariant);
 * a new one, the built-in default, pushed (in Lua memory); the one on top of the stack made
 * the state's (popped). */
k3_policy *k3l_state_policy(lua_State *L);
k3_policy *k3l_new_policy(lua_State *L);
void k3l_set_state_policy(lua_State *L);

/* ---- one op call (ops.c; also the methods of policy.c) ------------------------------------------ */

/* One call's options: the state's policy, a forced kernel, explain mode and the record. */
typedef struct k3l_call {
    k3_call call;
    k3_dispatch rec;
} k3l_call;
/* explain's mode: k3.explain (an op's) or m:explain (a method's). */
enum { K3L_EXPLAIN_OP = 1, K3L_EXPLAIN_METHOD = 2 };
/* The common tail of an op's arguments, from the options table at opts (0: none; argn is the
 * argument reported): opts.out (checked, left on the stack) into *out, opts.kernel and the
 * state's policy into c, and the result slot pushed: the out userdata when given, else a fresh
 * tensor, none in explain mode. *y is the slot's handle for the core to fill (NULL when out
 * is given or in explain mode). */
void k3l_op_prepare(lua_State *L, int opts, int argn, int explain, k3l_call *c, k3_tensor **out,
                    k3_tensor ***y);
/* Ends an op or method call: raises on failure, pushes the explain record, or counts the call
 * in the state's counters and the active trace. Returns the number of results. */
int k3l_op_finish(lua_State *L, k3_status s, k3l_call *c, int explain);
/* Pushes a decision as k3.explain and k3.trace show it: {op =, chosen =, kernel =, declined =
 * {{kernel =, reason =}, ...}, captured = true|nil}. */
void k3l_push_dispatch(lua_State *L, const k3_dispatch *d);

/* ---- registration: each adds its functions to the table on top of the stack ---------------------- */

void k3l_open_tensor(lua_State *L);
/* Tensor ops (tensor_ops.c, ops.c): k3.cat, k3.stack, k3.arange, k3.linspace, k3.equal; and,
 * with the tensor methods table on top of the stack and the tensor metatable below it, t / u
 * (__div), t:float() ... and the catalogue's t:abs(), t:sum(d) ... (k3l_add_op_methods,
 * ops.c). */
void k3l_open_tensor_ops(lua_State *L);
void k3l_add_tensor_op_methods(lua_State *L);
void k3l_add_op_methods(lua_State *L);
/* The tensor metamethods' arithmetic (tensor.c): t op u, t op s or s op t at arguments 1 and 2
 * into a new tensor; name is the verb of the error for a non-number ("divide"). */
int k3l_tensor_arith(lua_State *L, k3_binop op, const char *name);
void k3l_open_ops(lua_State *L);
void k3l_open_policy(lua_State *L);
void k3l_open_files(lua_State *L);
void k3l_open_dist(lua_State *L);
void k3l_open_graph(lua_State *L); /* k3.cuda_graph and k3.Graph (graph.c) */

#endif /* K3_LUA_H */
