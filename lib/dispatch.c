/*
 * dispatch.c — policies (ordered candidate kernels per op, what a layout mismatch does, and
 * the batch-invariant mode), the dispatcher that walks them and records every decline, the
 * process default of batch-invariant mode, the counters (process-wide totals and per-context
 * sinks) and the thread-local trace hook.
 */
#include "k3_impl.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const g_op_names[K3_OP_COUNT] = {"linear", "attn_res", "rms_norm",
                                                     "silu_mul"};

const char *k3_op_name(k3_op op) {
    return op >= 0 && op < K3_OP_COUNT ? g_op_names[op] : "?";
}

static int op_parse(const char *name) {
    for (int i = 0; name && i < K3_OP_COUNT; i++)
        if (strcmp(g_op_names[i], name) == 0) return i;
    return -1;
}

/* ---- policies ------------------------------------------------------------------------ */

/* struct k3_policy is in k3_impl.h (lib/method.c copies it per call). */

/* Must state what lua/k3/policy/default.lua states. cpu.linear.reference ends the linear
 * list so that K3_DISABLE_KERNELS=cpu.linear.blas leaves a CPU kernel that serves linear. */
static const char *const g_default_candidates[K3_OP_COUNT][4] = {
    {"cuda.linear.cublas", "cpu.linear.blas", "cpu.linear.reference", NULL},
    {"cuda.attn_res.packed", "cuda.attn_res.generic", "cpu.attn_res.reference", NULL},
    {"cuda.rms_norm.generic", "cpu.rms_norm.reference", NULL},
    {"cuda.silu_mul.generic", "cpu.silu_mul.reference", NULL},
};

static void policy_default_fill(k3_policy *p) {
    memset(p, 0, sizeof *p);
    for (int op = 0; op < K3_OP_COUNT; op++)
        for (int i = 0; g_default_candidates[op][i]; i++)
            p->cand[op][p->n[op]++] = k3_known_lookup(g_default_candidates[op][i], NULL, NULL);
}

static k3_policy g_default_policy;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;
static void default_init(void) { policy_default_fill(&g_default_policy); }
static const k3_policy *default_policy(void) {
    pthread_once(&g_default_once, default_init);
    return &g_default_policy;
}

void k3_policy_init(k3_policy *p) {
    *p = *default_policy();
    p->batch_invariant = k3_batch_invariant();
}

k3_status k3_policy_new(k3_policy **out) {
    if (!out) return k3_error(K3_EINVAL, "policy_new: out is NULL");
    k3_policy *p = k3_host_alloc(sizeof *p);
    if (!p) return k3_error(K3_ENOMEM, "policy: out of memory");
    k3_policy_init(p);
    *out = p;
    return K3_OK;
}

void k3_policy_free(k3_policy *p) {
    if (p) k3_host_free(p, sizeof *p);
}

/* Writes "a, b, c" of the known kernels of op into buf. */
static void known_for_op(char *buf, size_t n, k3_op op) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; k3_known_name(i); i++) {
        k3_op kop;
        k3_known_lookup(k3_known_name(i), &kop, NULL);
        if (kop != op) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", k3_known_name(i));
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

k3_status k3_policy_set_candidates(k3_policy *p, const char *op, const char *const *names,
                                   int n) {
    if (!p) return k3_error(K3_EINVAL, "policy_set_candidates: p is NULL");
    if (!op) return k3_error(K3_EINVAL, "policy_set_candidates: op is NULL");
    int o = op_parse(op);
    char e[K3_ECHO_SIZE];
    if (o < 0)
        return k3_error(K3_EINVAL,
                        "policy: unknown op '%s' (expected linear, attn_res, rms_norm or silu_mul)",
                        k3_echo(e, sizeof e, op));
    if (n < 0 || n > K3_MAX_CANDIDATES)
        return k3_error(K3_EINVAL, "policy: %s has %d candidates; expected 0..%d", op, n,
                        K3_MAX_CANDIDATES);
    if (n > 0 && !names) return k3_error(K3_EINVAL, "policy_set_candidates: names is NULL");
    int idx[K3_MAX_CANDIDATES];
    for (int i = 0; i < n; i++) {
        if (!names[i])
            return k3_error(K3_EINVAL, "policy_set_candidates: names[%d] is NULL", i);
        k3_op kop;
        int k = k3_known_lookup(names[i], &kop, NULL);
        if (k < 0 || kop != (k3_op)o) {
            char known[512];
            known_for_op(known, sizeof known, (k3_op)o);
            if (k >= 0)
                return k3_error(K3_EINVAL,
                                "policy: kernel '%s' is for op %s, not %s (known %s "
                                "kernels: %s)",
                                names[i], k3_op_name(kop), op, op, known);
            return k3_error(K3_EINVAL, "policy: unknown %s kernel '%s' (known: %s)", op,
                            k3_echo(e, sizeof e, names[i]), known);
        }
        idx[i] = k;
    }
    memcpy(p->cand[o], idx, sizeof(int) * (size_t)n);
    p->n[o] = n;
    return K3_OK;
}

k3_status k3_policy_set_layout_fallback(k3_policy *p, int fallback) {
    if (!p) return k3_error(K3_EINVAL, "policy_set_layout_fallback: p is NULL");
    if (fallback != 0 && fallback != 1)
        return k3_error(K3_EINVAL,
                        "policy_set_layout_fallback: fallback must be 0 (error) or 1 (fallback); "
                        "got %d",
                        fallback);
    p->layout_fallback = fallback;
    return K3_OK;
}

int k3_policy_count(const k3_policy *p, const char *op) {
    int o = op_parse(op);
    if (o < 0) return -1;
    if (!p) p = default_policy();
    return p->n[o];
}

const char *k3_policy_candidate(const k3_policy *p, const char *op, int i) {
    int o = op_parse(op);
    if (!p) p = default_policy();
    if (o < 0 || i < 0 || i >= p->n[o]) return NULL;
    return k3_known_name(p->cand[o][i]);
}

int k3_policy_layout_fallback(const k3_policy *p) {
    if (!p) p = default_policy();
    return p->layout_fallback;
}

k3_status k3_policy_set_batch_invariant(k3_policy *p, int on) {
    if (!p) return k3_error(K3_EINVAL, "policy_set_batch_invariant: p is NULL");
    p->batch_invariant = on != 0;
    return K3_OK;
}

int k3_policy_batch_invariant(const k3_policy *p) {
    return p ? p->batch_invariant : k3_batch_invariant();
}

/* ---- batch-invariant mode: the process default ---------------------------------------- */

static atomic_int g_batch_invariant = -1; /* -1: K3_BATCH_INVARIANT not read yet */
static pthread_once_t g_bi_env_once = PTHREAD_ONCE_INIT;
static int g_bi_env;

/* K3_BATCH_INVARIANT as a boolean: 1/true/yes/on and 0/false/no/off (any case, surrounding
 * whitespace ignored; empty is unset). Anything else leaves the mode off and is reported once
 * (k3_config_warn), so "=2" or "=enabled" is not silently ignored. */
static void read_bi_env(void) {
    const char *env = getenv("K3_BATCH_INVARIANT");
    if (!env) return;
    while (isspace((unsigned char)*env)) env++;
    size_t len = strlen(env);
    while (len > 0 && isspace((unsigned char)env[len - 1])) len--;
    if (len == 0) return;
    static const char *const on[] = {"1", "true", "yes", "on"};
    static const char *const off[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strlen(on[i]) == len && strncasecmp(env, on[i], len) == 0) {
            g_bi_env = 1;
            return;
        }
        if (strlen(off[i]) == len && strncasecmp(env, off[i], len) == 0) return;
    }
    k3_config_warn("K3_BATCH_INVARIANT: unrecognised value '%.*s' (expected 0, 1, true, false, "
                   "yes, no, on or off); batch-invariant mode stays off",
                   (int)(len > 100 ? 100 : len), env);
}

void k3_set_batch_invariant(int on) { atomic_store(&g_batch_invariant, on ? 1 : 0); }

int k3_batch_invariant(void) {
    int v = atomic_load(&g_batch_invariant);
    if (v < 0) {
        pthread_once(&g_bi_env_once, read_bi_env);
        int expected = -1;
        atomic_compare_exchange_strong(&g_batch_invariant, &expected, g_bi_env);
        v = atomic_load(&g_batch_invariant);
    }
    return v;
}

/* ---- counters -------------------------------------------------------------------------- */

/* The process-wide totals (k3_stats) and the per-context sinks (k3_stats_sink, one per
 * lua_State) count the same way: calls per catalogue index, declines per "kernel: reason". */
#define K3_MAX_STAT_KERNELS 64
#define K3_MAX_STAT_DECLINES 256
typedef struct decline_stat {
    char key[sizeof(((k3_decline *)0)->kernel) + sizeof(((k3_decline *)0)->reason) + 2];
    uint64_t count;
} decline_stat;

/* Adds rec's declines to tab (*n entries in use, K3_MAX_STAT_DECLINES at most). */
static void declines_add(decline_stat *tab, int *n, const k3_dispatch *rec) {
    for (int d = 0; d < rec->ndeclined; d++) {
        char key[sizeof tab[0].key];
        snprintf(key, sizeof key, "%s: %s", rec->declined[d].kernel, rec->declined[d].reason);
        int i;
        for (i = 0; i < *n; i++)
            if (strcmp(tab[i].key, key) == 0) break;
        if (i == *n) {
            /* Reasons carry shapes, so distinct keys are bounded by a cap, not by design. */
            /* The last slot is reserved for "(other declines)" once the others are taken. */
            if (*n >= K3_MAX_STAT_DECLINES - 1) {
                i = K3_MAX_STAT_DECLINES - 1;
                if (*n == K3_MAX_STAT_DECLINES - 1) {
                    snprintf(tab[i].key, sizeof tab[i].key, "(other declines)");
                    tab[i].count = 0;
                    (*n)++;
                }
            } else {
                memcpy(tab[i].key, key, sizeof key);
                tab[i].count = 0;
                (*n)++;
            }
        }
        tab[i].count++;
    }
}

static atomic_uint_fast64_t g_kernel_calls[K3_MAX_STAT_KERNELS];
static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static decline_stat g_declines[K3_MAX_STAT_DECLINES];
static int g_ndeclines;

static void count_declines(const k3_dispatch *rec) {
    if (rec->ndeclined == 0) return;
    pthread_mutex_lock(&g_stats_lock);
    declines_add(g_declines, &g_ndeclines, rec);
    pthread_mutex_unlock(&g_stats_lock);
}

void k3_stats(k3_stats_fn fn, void *ud) {
    if (!fn) return;
    for (int i = 0; i < K3_MAX_STAT_KERNELS && k3_known_name(i); i++) {
        uint64_t c = atomic_load(&g_kernel_calls[i]);
        if (c) fn(ud, "kernel", k3_known_name(i), c);
    }
    /* Copy under the lock, call fn outside it: fn may call back into k3. */
    pthread_mutex_lock(&g_stats_lock);
    int n = g_ndeclines;
    decline_stat *copy = n ? k3_host_alloc(sizeof(decline_stat) * (size_t)n) : NULL;
    if (copy) memcpy(copy, g_declines, sizeof(decline_stat) * (size_t)n);
    pthread_mutex_unlock(&g_stats_lock);
    if (!copy) return;
    for (int i = 0; i < n; i++) fn(ud, "decline", copy[i].key, copy[i].count);
    k3_host_free(copy, sizeof(decline_stat) * (size_t)n);
}

void k3_stats_reset(void) {
    for (int i = 0; i < K3_MAX_STAT_KERNELS; i++) atomic_store(&g_kernel_calls[i], 0);
    pthread_mutex_lock(&g_stats_lock);
    g_ndeclines = 0;
    pthread_mutex_unlock(&g_stats_lock);
}

struct k3_stats_sink {
    uint64_t kernel_calls[K3_MAX_STAT_KERNELS];
    int ndeclines;
    decline_stat declines[K3_MAX_STAT_DECLINES];
};

size_t k3_stats_sink_size(void) { return sizeof(k3_stats_sink); }

void k3_stats_sink_reset(k3_stats_sink *s) {
    if (!s) return;
    memset(s->kernel_calls, 0, sizeof s->kernel_calls);
    s->ndeclines = 0;
}

void k3_stats_sink_count(k3_stats_sink *s, const k3_dispatch *rec) {
    if (!s || !rec) return;
    if (rec->chosen[0]) {
        int idx = k3_known_lookup(rec->chosen, NULL, NULL);
        if (idx >= 0 && idx < K3_MAX_STAT_KERNELS) s->kernel_calls[idx]++;
    }
    declines_add(s->declines, &s->ndeclines, rec);
}

void k3_stats_sink_read(const k3_stats_sink *s, k3_stats_fn fn, void *ud) {
    if (!s || !fn) return;
    for (int i = 0; i < K3_MAX_STAT_KERNELS && k3_known_name(i); i++)
        if (s->kernel_calls[i]) fn(ud, "kernel", k3_known_name(i), s->kernel_calls[i]);
    for (int i = 0; i < s->ndeclines; i++) fn(ud, "decline", s->declines[i].key, s->declines[i].count);
}

/* ---- tracing --------------------------------------------------------------------------- */

static _Thread_local k3_trace_fn t_trace;
static _Thread_local void *t_trace_ud;

void k3_trace_set(k3_trace_fn fn, void *ud, k3_trace_fn *prev, void **prev_ud) {
    if (prev) *prev = t_trace;
    if (prev_ud) *prev_ud = t_trace_ud;
    t_trace = fn;
    t_trace_ud = fn ? ud : NULL;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

static const char *device_type_name(k3_device_type t) {
    return t == K3_DEVICE_CPU ? "cpu" : "cuda";
}

k3_status k3_kernel_check_device(const k3_kernel *k, const k3_tensor *t) {
    k3_device d = k3_tensor_device(t);
    if (d.type == k->device) return K3_OK;
    char dn[32];
    return k3_error(K3_EDEVICE, "%s: kernel %s runs on %s tensors; got tensors on %s",
                    k3_op_name(k->op), k->name, device_type_name(k->device),
                    k3_device_name(d, dn, sizeof dn));
}

static void add_decline(k3_dispatch *rec, const char *kernel, const char *reason) {
    if (rec->ndeclined >= K3_MAX_DECLINES) return;
    k3_decline *d = &rec->declined[rec->ndeclined++];
    snprintf(d->kernel, sizeof d->kernel, "%s", kernel);
    snprintf(d->reason, sizeof d->reason, "%s", reason);
}

static void finish_record(const k3_call *call, const k3_dispatch *rec) {
    if (call && call->record) *call->record = *rec;
}

k3_status k3_dispatch_op(k3_op_args *a, k3_device dev, const k3_call *call,
                         const k3_dispatch_ext *ext) {
    const k3_policy *pol = call && call->policy ? call->policy : default_policy();
    const char *opn = k3_op_name(a->op);
    k3_dispatch rec;
    rec.ndeclined = 0;
    rec.chosen[0] = '\0';
    snprintf(rec.op, sizeof rec.op, "%s", opn);
    if (ext)
        for (int i = 0; i < ext->ndeclined; i++)
            add_decline(&rec, ext->declined[i].kernel, ext->declined[i].reason);

    /* The caller's policy carries its mode (a lua_State's own); no policy: the process
     * default. */
    if (a->op == K3_OP_LINEAR)
        a->u.linear.batch_invariant = k3_policy_batch_invariant(call ? call->policy : NULL) != 0;

    const k3_kernel *chosen = NULL;
    char dn[32];
    k3_device_name(dev, dn, sizeof dn);
    if (call && call->kernel) {
        k3_op kop;
        k3_device_type kdev;
        int idx = k3_known_lookup(call->kernel, &kop, &kdev);
        char e[K3_ECHO_SIZE];
        if (idx < 0)
            return k3_error(K3_EINVAL, "%s: unknown kernel '%s'", opn,
                            k3_echo(e, sizeof e, call->kernel));
        if (kop != a->op)
            return k3_error(K3_EINVAL, "%s: kernel '%s' is for op %s, not %s", opn,
                            call->kernel, k3_op_name(kop), opn);
        chosen = k3_known_kernel_at(idx);
        if (!chosen) {
            char why[400];
            k3_known_absent_reason(idx, why, sizeof why);
            return k3_error(K3_ENOKERNEL, "%s: kernel '%s' is %s", opn, call->kernel, why);
        }
        if (kdev != dev.type)
            return k3_error(K3_EDEVICE, "%s: kernel %s runs on %s tensors; got tensors on %s",
                            opn, chosen->name, device_type_name(kdev), dn);
    } else {
        /* Batch-invariant mode replaces the linear candidates with the one fixed-order
         * kernel of the device: any other kernel would make a row depend on M. */
        struct {
            const k3_kernel *k;
            const char *name;
            int idx; /* catalogue index, for the not-registered reason */
        } list[K3_MAX_CANDIDATES + 1];
        int n = 0;
        if (a->op == K3_OP_LINEAR && a->u.linear.batch_invariant) {
            const char *bname = dev.type == K3_DEVICE_CPU ? "cpu.linear.batch_invariant"
                                                          : "cuda.linear.batch_invariant";
            list[n].k = k3_kernel_find(bname);
            list[n].idx = k3_known_lookup(bname, NULL, NULL);
            list[n++].name = bname;
        } else {
            if (ext && ext->pre) {
                list[n].k = ext->pre;
                list[n].idx = -1;
                list[n++].name = ext->pre->name;
            }
            for (int i = 0; i < pol->n[a->op]; i++) {
                list[n].k = k3_known_kernel_at(pol->cand[a->op][i]);
                list[n].idx = pol->cand[a->op][i];
                list[n++].name = k3_known_name(pol->cand[a->op][i]);
            }
        }
        for (int i = 0; i < n && !chosen; i++) {
            const k3_kernel *k = list[i].k;
            const char *name = list[i].name;
            if (!k) {
                char why[256];
                k3_known_absent_reason(list[i].idx, why, sizeof why);
                add_decline(&rec, name, why);
                continue;
            }
            if (k->device != dev.type) {
                char why[64];
                snprintf(why, sizeof why, "tensors are on %s", dn);
                add_decline(&rec, name, why);
                continue;
            }
            char reason[256] = "";
            k3_status s = k->supports(a, reason, sizeof reason);
            if (s == K3_OK) {
                chosen = k;
                break;
            }
            if (!reason[0]) snprintf(reason, sizeof reason, "%s", k3_status_name(s));
            add_decline(&rec, name, reason);
            if (s == K3_ELAYOUT && !pol->layout_fallback) {
                finish_record(call, &rec);
                return k3_error(K3_ELAYOUT, "%s: %s", opn, reason);
            }
        }
        if (!chosen) {
            char list[1024];
            size_t used = 0;
            list[0] = '\0';
            for (int d = 0; d < rec.ndeclined; d++) {
                int w = snprintf(list + used, sizeof list - used, "%s%s: %s", d ? "; " : "",
                                 rec.declined[d].kernel, rec.declined[d].reason);
                if (w < 0 || (size_t)w >= sizeof list - used) break;
                used += (size_t)w;
            }
            finish_record(call, &rec);
            return k3_error(K3_ENOKERNEL, "%s: no registered kernel accepts the call (%s)", opn,
                            rec.ndeclined ? list : "no candidates");
        }
    }
    snprintf(rec.chosen, sizeof rec.chosen, "%s", chosen->name);
    finish_record(call, &rec);
    if (call && call->explain_only) return K3_OK;

    K3_TRY(chosen->run(a));

    int idx = k3_known_lookup(chosen->name, NULL, NULL);
    if (idx >= 0 && idx < K3_MAX_STAT_KERNELS) atomic_fetch_add(&g_kernel_calls[idx], 1);
    count_declines(&rec);
    if (t_trace) t_trace(t_trace_ud, &rec);
    return K3_OK;
}
