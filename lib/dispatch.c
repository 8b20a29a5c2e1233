/*
 * dispatch.c — policies (ordered candidate kernels per op, what a layout mismatch does, and
 * the batch-invariant mode), the dispatcher that walks them and records every decline, the
 * process default of batch-invariant mode, and the counters (process-wide totals and
 * per-context sinks).
 */
#include "k3_impl.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const g_op_names[K3_OP_COUNT] = {
#define K3_OP(ID, name, signature, summary) #name,
#include "k3_ops.def"
#undef K3_OP
};

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

/* The built-in default: per op, the catalogue's kernels of that op with a rank, lowest rank
 * first (lib/k3_kernels.def), for each of the two lists. */
static void policy_default_fill(k3_policy *p) {
    memset(p, 0, sizeof *p);
    for (int list = 0; list < 2; list++)
        for (int op = 0; op < K3_OP_COUNT; op++) {
            int *cand = p->cand[list][op], n = 0;
            for (int i = 0; i < k3_known_count(); i++) {
                int r = k3_known_rank(i, list);
                if (!r || k3_known_op(i) != (k3_op)op || n == K3_MAX_CANDIDATES) continue;
                int j = n++;
                for (; j > 0 && k3_known_rank(cand[j - 1], list) > r; j--) cand[j] = cand[j - 1];
                cand[j] = i;
            }
            p->n[list][op] = n;
        }
}

static k3_policy g_default_policy;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;
static void default_init(void) { policy_default_fill(&g_default_policy); }
static const k3_policy *default_policy(void) {
    pthread_once(&g_default_once, default_init);
    return &g_default_policy;
}

size_t k3_policy_size(void) { return sizeof(k3_policy); }

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
    for (int i = 0; i < k3_known_count(); i++) {
        if (k3_known_op(i) != op) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", k3_known_name(i));
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

/* Writes "a, b, c or d" of the op names into buf. */
static void op_names(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int o = 0; o < K3_OP_COUNT; o++) {
        const char *sep = o == 0 ? "" : o == K3_OP_COUNT - 1 ? " or " : ", ";
        int w = snprintf(buf + used, n - used, "%s%s", sep, g_op_names[o]);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

/* Sets one of op's two lists (list 0: the candidates, 1: the batch-invariant ones); fname is
 * the public function, for NULL arguments. Every name must be a catalogued kernel of op. */
static k3_status set_list(k3_policy *p, int list, const char *fname, const char *op,
                          const char *const *names, int n) {
    if (!p) return k3_error(K3_EINVAL, "%s: p is NULL", fname);
    if (!op) return k3_error(K3_EINVAL, "%s: op is NULL", fname);
    int o = op_parse(op);
    char e[K3_ECHO_SIZE];
    if (o < 0) {
        char ops[128];
        op_names(ops, sizeof ops);
        return k3_error(K3_EINVAL, "policy: unknown op '%s' (expected %s)", k3_echo(e, sizeof e, op),
                        ops);
    }
    if (n < 0 || n > K3_MAX_CANDIDATES)
        return k3_error(K3_EINVAL, "policy: %s has %d candidates; expected 0..%d", op, n,
                        K3_MAX_CANDIDATES);
    if (n > 0 && !names) return k3_error(K3_EINVAL, "%s: names is NULL", fname);
    int idx[K3_MAX_CANDIDATES];
    for (int i = 0; i < n; i++) {
        if (!names[i]) return k3_error(K3_EINVAL, "%s: names[%d] is NULL", fname, i);
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
    memcpy(p->cand[list][o], idx, sizeof(int) * (size_t)n);
    p->n[list][o] = n;
    return K3_OK;
}

k3_status k3_policy_set_candidates(k3_policy *p, const char *op, const char *const *names,
                                   int n) {
    return set_list(p, 0, "policy_set_candidates", op, names, n);
}

k3_status k3_policy_set_invariant_candidates(k3_policy *p, const char *op,
                                             const char *const *names, int n) {
    return set_list(p, 1, "policy_set_invariant_candidates", op, names, n);
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

static int list_count(const k3_policy *p, int list, const char *op) {
    int o = op_parse(op);
    if (o < 0) return -1;
    if (!p) p = default_policy();
    return p->n[list][o];
}

static const char *list_candidate(const k3_policy *p, int list, const char *op, int i) {
    int o = op_parse(op);
    if (!p) p = default_policy();
    if (o < 0 || i < 0 || i >= p->n[list][o]) return NULL;
    return k3_known_name(p->cand[list][o][i]);
}

int k3_policy_count(const k3_policy *p, const char *op) { return list_count(p, 0, op); }
const char *k3_policy_candidate(const k3_policy *p, const char *op, int i) {
    return list_candidate(p, 0, op, i);
}
int k3_policy_invariant_count(const k3_policy *p, const char *op) {
    return list_count(p, 1, op);
}
const char *k3_policy_invariant_candidate(const k3_policy *p, const char *op, int i) {
    return list_candidate(p, 1, op, i);
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

/* Whether key is "kernel: reason". */
static bool key_is(const char *key, const char *kernel, const char *reason) {
    size_t kl = strlen(kernel);
    return strncmp(key, kernel, kl) == 0 && key[kl] == ':' && key[kl + 1] == ' ' &&
           strcmp(key + kl + 2, reason) == 0;
}

/* Adds rec's declines to tab (*n entries in use, K3_MAX_STAT_DECLINES at most), keyed
 * "kernel: reason"; a key is built only when it is new. *hint: the entry after the last one
 * counted, tried first (calls repeat their declines in order, so it is usually the match). */
static void declines_add(decline_stat *tab, int *n, int *hint, const k3_dispatch *rec) {
    for (int d = 0; d < rec->ndeclined; d++) {
        const char *kernel = rec->declined[d].kernel, *reason = rec->declined[d].reason;
        int i = *hint;
        if (i >= *n || !key_is(tab[i].key, kernel, reason))
            for (i = 0; i < *n; i++)
                if (key_is(tab[i].key, kernel, reason)) break;
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
                /* both parts fit: the key's size is theirs plus ": " */
                size_t kl = strnlen(kernel, sizeof rec->declined[d].kernel - 1);
                memcpy(tab[i].key, kernel, kl);
                memcpy(tab[i].key + kl, ": ", 2);
                k3_copy_str(tab[i].key + kl + 2, sizeof tab[i].key - kl - 2, reason);
                tab[i].count = 0;
                (*n)++;
            }
        }
        tab[i].count++;
        *hint = i + 1;
    }
}

static atomic_uint_fast64_t g_kernel_calls[K3_MAX_STAT_KERNELS];
static atomic_uint_fast64_t g_captured_calls[K3_MAX_STAT_KERNELS]; /* kind "captured" */
static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static decline_stat g_declines[K3_MAX_STAT_DECLINES];
static int g_ndeclines, g_decline_hint;

static void count_declines(const k3_dispatch *rec) {
    if (rec->ndeclined == 0) return;
    pthread_mutex_lock(&g_stats_lock);
    declines_add(g_declines, &g_ndeclines, &g_decline_hint, rec);
    pthread_mutex_unlock(&g_stats_lock);
}

void k3_stats(k3_stats_fn fn, void *ud) {
    if (!fn) return;
    for (int i = 0; i < K3_MAX_STAT_KERNELS && k3_known_name(i); i++) {
        uint64_t c = atomic_load(&g_kernel_calls[i]);
        if (c) fn(ud, "kernel", k3_known_name(i), c);
        c = atomic_load(&g_captured_calls[i]);
        if (c) fn(ud, "captured", k3_known_name(i), c);
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
    for (int i = 0; i < K3_MAX_STAT_KERNELS; i++) {
        atomic_store(&g_kernel_calls[i], 0);
        atomic_store(&g_captured_calls[i], 0);
    }
    pthread_mutex_lock(&g_stats_lock);
    g_ndeclines = 0;
    g_decline_hint = 0;
    pthread_mutex_unlock(&g_stats_lock);
}

struct k3_stats_sink {
    uint64_t kernel_calls[K3_MAX_STAT_KERNELS];
    uint64_t captured_calls[K3_MAX_STAT_KERNELS];
    int ndeclines, decline_hint;
    decline_stat declines[K3_MAX_STAT_DECLINES];
};

size_t k3_stats_sink_size(void) { return sizeof(k3_stats_sink); }

void k3_stats_sink_reset(k3_stats_sink *s) {
    if (!s) return;
    memset(s->kernel_calls, 0, sizeof s->kernel_calls);
    memset(s->captured_calls, 0, sizeof s->captured_calls);
    s->ndeclines = 0;
    s->decline_hint = 0;
}

void k3_stats_sink_count(k3_stats_sink *s, const k3_dispatch *rec) {
    if (!s || !rec) return;
    if (rec->chosen[0]) {
        int idx = k3_known_lookup(rec->chosen, NULL, NULL);
        if (idx >= 0 && idx < K3_MAX_STAT_KERNELS) {
            s->kernel_calls[idx]++;
            if (rec->captured) s->captured_calls[idx]++;
        }
    }
    declines_add(s->declines, &s->ndeclines, &s->decline_hint, rec);
}

void k3_stats_sink_read(const k3_stats_sink *s, k3_stats_fn fn, void *ud) {
    if (!s || !fn) return;
    for (int i = 0; i < K3_MAX_STAT_KERNELS && k3_known_name(i); i++) {
        if (s->kernel_calls[i]) fn(ud, "kernel", k3_known_name(i), s->kernel_calls[i]);
        if (s->captured_calls[i]) fn(ud, "captured", k3_known_name(i), s->captured_calls[i]);
    }
    for (int i = 0; i < s->ndeclines; i++) fn(ud, "decline", s->declines[i].key, s->declines[i].count);
}

/* ---- dispatch ---------------------------------------------------------------------------- */

static const char *device_type_name(k3_device_type t) {
    return t == K3_DEVICE_CPU ? "cpu" : "cuda";
}

static void add_decline(k3_dispatch *rec, const char *kernel, const char *reason) {
    if (rec->ndeclined >= K3_MAX_DECLINES) return;
    k3_decline *d = &rec->declined[rec->ndeclined++];
    k3_copy_str(d->kernel, sizeof d->kernel, kernel);
    k3_copy_str(d->reason, sizeof d->reason, reason);
}

static void finish_record(const k3_call *call, const k3_dispatch *rec) {
    if (call && call->record) *call->record = *rec;
}

/* A stand-in out for explain_only: the right shape, dtype, device and contiguous strides, no
 * memory (supports() reads layout, never data). */
typedef struct fake_out {
    k3_storage storage;
    k3_tensor t;
} fake_out;

static void fake_init(fake_out *f, const k3_op_result *r) {
    memset(f, 0, sizeof *f);
    f->storage.refcount = 1;
    f->storage.device = r->device;
    f->t.storage = &f->storage;
    f->t.dtype = r->dtype;
    f->t.ndim = r->ndim;
    int64_t st = 1;
    for (int d = r->ndim - 1; d >= 0; d--) {
        f->t.size[d] = r->shape[d];
        f->t.stride[d] = st;
        st *= r->shape[d] > 1 ? r->shape[d] : 1;
    }
}

/* What the prologue leaves for the rest of the call: the device it runs on, and the result's
 * handles (a new out, or y's own handle on the caller's out) to hand over or free. */
typedef struct prepared {
    k3_device device;
    k3_tensor *fresh, *handle;
    fake_out fake;
} prepared;

/* The kernel prologue: once per call, before any kernel is asked (supports) or run, whatever
 * the entry (an op, a method, a kernel forced by name). The op tag, the op's validation
 * (lib/validate.c: inputs, then out) and the out the kernel writes: the caller's, checked; a new
 * tensor; or, under explain_only, a stand-in without memory. p->device is the device the
 * call runs on, which the chosen kernel must run on (runs_on). */
static k3_status prologue(k3_op_args *a, k3_tensor **y, const k3_call *call, prepared *p) {
    if ((unsigned)a->op >= K3_OP_COUNT)
        return k3_error(K3_EINTERNAL, "dispatch: invalid op %d", (int)a->op);
    const char *op = k3_op_name(a->op);
    bool explain = call && call->explain_only;
    k3_tensor **out = k3_op_out(a);
    if (!y && !*out && !explain)
        return k3_error(K3_EINVAL, "%s: y and out are both NULL (the result would be lost)", op);
    k3_op_result r;
    K3_TRY(k3_op_check_inputs(a, &r));
    if (*out) K3_TRY(k3_op_check_out(a));
    p->device = r.device;
    if (explain) {
        if (!*out) {
            fake_init(&p->fake, &r);
            *out = &p->fake.t;
        }
        return K3_OK;
    }
    if (!*out) {
        /* The result is the op's own allocation: its errors name the op ("rms_norm: out of
         * host memory allocating ..."). */
        K3_TRY(k3_tensor_new(&p->fresh, r.ndim, r.shape, r.dtype, r.device, op));
        *out = p->fresh;
    } else if (y) {
        k3_status s = k3_tensor_alias(&p->handle, *out);
        if (s != K3_OK) return k3_error_prefix(s, op);
    }
    return K3_OK;
}

/* Whether kernel k runs on the call's device; the decline reason when it does not. */
static bool runs_on(const k3_kernel *k, k3_device dev, char *why, size_t n) {
    if (k->device == dev.type) return true;
    char dn[32];
    snprintf(why, n, "tensors are on %s", k3_device_name(dev, dn, sizeof dn));
    return false;
}

/* The kernel a prologued call runs: call->kernel when forced (it must be known, of this op,
 * registered and run on the call's device), else the first candidate whose supports() takes
 * the call, every other one recorded as a decline in rec. */
static k3_status choose(k3_op_args *a, k3_device dev, const k3_call *call,
                        const k3_dispatch_ext *ext, k3_dispatch *rec, const k3_kernel **out,
                        int *out_idx) {
    const k3_policy *pol = call && call->policy ? call->policy : default_policy();
    const char *opn = k3_op_name(a->op);
    char dn[32];
    k3_device_name(dev, dn, sizeof dn);
    if (call && call->kernel) {
        k3_op kop;
        k3_device_type kdev;
        int idx = k3_known_lookup(call->kernel, &kop, &kdev);
        char e[K3_ECHO_SIZE];
        if (idx < 0) {
            char known[512]; /* the op's kernels, registered in this build or not */
            known_for_op(known, sizeof known, a->op);
            return k3_error(K3_EINVAL, "%s: unknown kernel '%s' (known for %s: %s)", opn,
                            k3_echo(e, sizeof e, call->kernel), opn, known);
        }
        if (kop != a->op)
            return k3_error(K3_EINVAL, "%s: kernel '%s' is for op %s, not %s", opn,
                            call->kernel, k3_op_name(kop), opn);
        const k3_kernel *k = k3_known_kernel_at(idx);
        if (!k) {
            char why[400];
            k3_known_absent_reason(idx, why, sizeof why);
            return k3_error(K3_ENOKERNEL, "%s: kernel '%s' is %s", opn, call->kernel, why);
        }
        char why[64];
        if (!runs_on(k, dev, why, sizeof why))
            return k3_error(K3_EDEVICE, "%s: kernel %s runs on %s tensors; got tensors on %s",
                            opn, k->name, device_type_name(kdev), dn);
        *out = k;
        *out_idx = idx;
        return K3_OK;
    }
    /* Batch-invariant mode walks the op's batch-invariant list instead, when the policy has
     * one: any other kernel would make a row depend on M, a plan's kernel too. */
    int invariant = k3_policy_batch_invariant(call ? call->policy : NULL) != 0;
    int which = invariant && pol->n[1][a->op] > 0;
    int list[K3_MAX_CANDIDATES + 1], n = 0, pre = ext ? ext->pre : -1;
    if (pre >= 0) list[n++] = pre;
    for (int i = 0; i < pol->n[which][a->op]; i++) list[n++] = pol->cand[which][a->op][i];
    for (int i = 0; i < n; i++) {
        const k3_kernel *k = k3_known_kernel_at(list[i]);
        const char *name = k3_known_name(list[i]);
        bool is_pre = i == 0 && pre >= 0;
        char reason[256] = "";
        if (is_pre && which) {
            add_decline(rec, name, "batch-invariant mode is on");
            continue;
        }
        if (!k) {
            k3_known_absent_reason(list[i], reason, sizeof reason);
            add_decline(rec, name, reason);
            continue;
        }
        if (!runs_on(k, dev, reason, sizeof reason)) {
            add_decline(rec, name, reason);
            continue;
        }
        k3_status s = k->supports(a, reason, sizeof reason);
        if (s == K3_OK) {
            *out = k;
            *out_idx = list[i];
            return K3_OK;
        }
        if (!reason[0]) snprintf(reason, sizeof reason, "%s", k3_status_name(s));
        add_decline(rec, name, reason);
        if (s == K3_ELAYOUT && !pol->layout_fallback && !is_pre)
            return k3_error(K3_ELAYOUT, "%s: %s", opn, reason);
    }
    char declines[1024];
    size_t used = 0;
    declines[0] = '\0';
    for (int d = 0; d < rec->ndeclined; d++) {
        int w = snprintf(declines + used, sizeof declines - used, "%s%s: %s", d ? "; " : "",
                         rec->declined[d].kernel, rec->declined[d].reason);
        if (w < 0 || (size_t)w >= sizeof declines - used) break;
        used += (size_t)w;
    }
    return k3_error(K3_ENOKERNEL, "%s: no registered kernel accepts the call (%s)", opn,
                    rec->ndeclined ? declines : "no candidates");
}

k3_status k3_dispatch_call(k3_op_args *a, k3_tensor **y, const k3_call *call,
                           const k3_dispatch_ext *ext) {
    k3_dispatch rec;
    rec.ndeclined = 0;
    rec.chosen[0] = '\0';
    rec.captured = k3_graph_capturing();
    k3_copy_str(rec.op, sizeof rec.op, k3_op_name(a->op));
    if (ext)
        for (int i = 0; i < ext->ndeclined; i++)
            add_decline(&rec, ext->declined[i].kernel, ext->declined[i].reason);
    /* The caller's policy carries its mode (a lua_State's own); no policy: the process
     * default. linear's kernels read it from their arguments. */
    if (a->op == K3_OP_LINEAR)
        a->u.linear.batch_invariant = k3_policy_batch_invariant(call ? call->policy : NULL) != 0;

    prepared p;
    p.fresh = p.handle = NULL;
    const k3_kernel *k = NULL;
    int idx = -1; /* k's catalogue index */
    k3_status s = prologue(a, y, call, &p);
    bool forced_refused = false;
    if (s == K3_OK) {
        s = choose(a, p.device, call, ext, &rec, &k, &idx);
        forced_refused = s != K3_OK && call && call->kernel;
    }
    if (k) k3_copy_str(rec.chosen, sizeof rec.chosen, k->name);
    /* A forced kernel that cannot run is the caller's error, not a decision: no record. */
    if (!forced_refused) finish_record(call, &rec);
    if (s == K3_OK && !(call && call->explain_only)) s = k3_graph_note_op(a, p.device);
    if (s == K3_OK && !(call && call->explain_only)) s = k->run(a);
    if (s != K3_OK) {
        k3_tensor_free(p.fresh);
        k3_tensor_free(p.handle);
        return s;
    }
    if (call && call->explain_only) return K3_OK;
    if (idx >= 0 && idx < K3_MAX_STAT_KERNELS) {
        atomic_fetch_add(&g_kernel_calls[idx], 1);
        if (rec.captured) atomic_fetch_add(&g_captured_calls[idx], 1);
    }
    count_declines(&rec);
    if (y) *y = p.fresh ? p.fresh : p.handle;
    else k3_tensor_free(p.fresh);
    return K3_OK;
}
