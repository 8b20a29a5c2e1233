/*
 * k3_embed.h — what a language front end needs of the core beyond k3.h: messages numbered
 * the way the language counts, user input echoed in messages at a bounded length, a policy
 * held in the front end's own memory, counters per interpreter state, and the configuration
 * warnings to show when no log hook is set.
 * Internal (not installed): the Lua binding (lib/lua/) is built on k3.h and this header.
 */
#ifndef K3_EMBED_H
#define K3_EMBED_H

#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- message numbering --------------------------------------------------------------------- */

/* How the messages of this thread's calls number dims, indices and blocks: from 0, as the C
 * API counts them (the default), or from 1, as Lua does. The arguments are always 0-based; only
 * the text changes: "narrow: start 3 and length 1 out of range for dim 1 of size 3" with base
 * 0 is "... start 4 ... dim 2 ..." with base 1, and attn_res's write_block is worded as Lua
 * writes it (nil for none, 1..S). base is 0 or 1 (any other value means 1). Per thread, so a C
 * host and a Lua state on one thread each get their own numbering as long as the front end
 * restores the previous value after its call: returns the previous value. */
K3_API int k3_set_message_base(int base);

/* ---- user input in messages ------------------------------------------------------------- */

/* Echoed user input in a message (a dtype or device name, a kernel name, a key): at most
 * K3_ECHO_MAX bytes of it, cut back to a UTF-8 character boundary and marked
 * "... (cut at 200 of 10485760 bytes)" when longer. Writes into buf (n bytes; K3_ECHO_SIZE
 * holds any result) and returns buf. The core's own messages echo through it too. */
#define K3_ECHO_MAX 200
#define K3_ECHO_SIZE 256
K3_API const char *k3_echo(char *buf, size_t n, const char *s);

/* ---- a policy in the caller's memory ------------------------------------------------------- */

/* Bytes of a k3_policy, and the built-in default (with the process default batch-invariant
 * mode) written into caller memory of that size, suitably aligned (malloc or Lua userdata
 * alignment). Nothing to free: the binding keeps each state's policy in Lua memory, so opening
 * the module makes no host allocation and a host may still call k3_set_allocator. */
K3_API size_t k3_policy_size(void);
K3_API void k3_policy_init(k3_policy *p);

/* ---- counters of one interpreter state ------------------------------------------------------ */

/* Calls per kernel and declines per "kernel: reason", counted as k3_stats counts them
 * process-wide, for each dispatch record given to k3_stats_sink_count. The memory is the
 * caller's (k3_stats_sink_size() bytes, aligned as for k3_policy_init; empty after
 * k3_stats_sink_reset); nothing is allocated. Not locked: a sink belongs to one thread at a
 * time. */
typedef struct k3_stats_sink k3_stats_sink;
K3_API size_t k3_stats_sink_size(void);
K3_API void k3_stats_sink_reset(k3_stats_sink *s);
/* Counts rec's chosen kernel (when it has one) and each of its declines. */
K3_API void k3_stats_sink_count(k3_stats_sink *s, const k3_dispatch *rec);
/* Calls fn like k3_stats: "kernel" entries in catalogue order, then "decline" entries. */
K3_API void k3_stats_sink_read(const k3_stats_sink *s, k3_stats_fn fn, void *ud);

/* ---- configuration warnings ----------------------------------------------------------------- */

/* K3_DISABLE_KERNELS naming an unknown kernel, a K3_BATCH_INVARIANT that is not a boolean and
 * a K3_HOST_THREADS that is not a count are each sent once to the log hook (K3_LOG_WARN) and
 * kept. k3_config_warnings_take returns the kept lines ("...\n" each) the first time it is
 * called in the process, NULL afterwards or when there are none; a front end writes them to
 * stderr when no log hook is set (k3_log_hook_set() is 0), so a user sees a typo once instead
 * of nothing. */
K3_API const char *k3_config_warnings_take(void);
K3_API int k3_log_hook_set(void);

/* ---- memory pressure (lib/tensor.c) -------------------------------------------------------- */

/* Bytes of tensor storage (host and device) this thread has allocated since they were last
 * taken, when they reach at_least (the count then restarts from 0), else 0 (the count is kept).
 * A front end with a garbage collector reports them to it, so that a loop of temporary tensors
 * is collected at the pace it allocates (the Lua binding: lua_gc LUA_GCSTEP). */
K3_API uint64_t k3_take_allocated_bytes(uint64_t at_least);
/* This thread's device-pressure hook: when a device storage allocation fails with K3_ENOMEM and
 * the device's stream is not being captured into a CUDA graph, k3 calls fn(ud) once (the Lua
 * binding runs a full collection, whose finalizers free unreachable tensors) and retries the
 * allocation once. fn must not raise or longjmp. Returns the previous hook (and *prev_ud its
 * ud) so a caller can restore it; fn NULL removes the hook. */
typedef void (*k3_pressure_fn)(void *ud);
K3_API k3_pressure_fn k3_set_pressure_hook(k3_pressure_fn fn, void *ud, void **prev_ud);

#ifdef __cplusplus
}
#endif
#endif /* K3_EMBED_H */
