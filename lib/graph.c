/*
 * graph.c — k3_graph_capture / k3_graph_replay / k3_graph_free (k3.h "CUDA graphs"): the work
 * a function queues on this thread's stream of one CUDA device, captured once through the
 * backend (kernels/graph.cu) and replayed. While a capture runs, the core refuses what cannot
 * be captured (k3_graph_refuse: host synchronisations, host copies, CPU ops) before it reaches
 * CUDA, and every storage the captured work touches is held by the graph (k3_graph_note), so
 * freeing a tensor the graph uses never frees memory a replay reads or writes.
 *
 * Holding, in two phases. During the capture each touched storage gets one reference from the
 * graph, and a tensor released then (k3_tensor_release) gives its memory back at once: the
 * allocator keeps such blocks for later work of the same capture only, whose stream order
 * protects them, and hands them to the graph at the end (kernels/memory.cu). When the capture
 * succeeds, every held storage still alive is counted in its graph_holds, and from then on a
 * release keeps its memory until the graph is freed.
 */
#include "k3_impl.h"

#include <stdio.h>
#include <string.h>

struct k3_graph {
    const k3_backend *be;
    int device;
    void *exec; /* the backend's graph, NULL until the capture succeeded */
    int kernels;
    k3_tensor **held; /* one handle per storage the captured work touched */
    int nheld, cap;
    int counted; /* the held storages' graph_holds include this graph */
};

/* The graph whose capture runs on this thread, and graphs freed while it ran (destroyed when
 * it ends: CUDA graph calls are not made on a capturing thread). */
static _Thread_local k3_graph *g_capture;
static _Thread_local k3_graph **g_deferred;
static _Thread_local int g_ndeferred, g_deferred_cap;

int k3_graph_capturing(void) { return g_capture != NULL; }

k3_status k3_graph_refuse(const char *op, const char *what) {
    if (!g_capture) return K3_OK;
    return k3_error(K3_EINVAL,
                    "%s: %s cannot be captured into a CUDA graph (a capture of cuda:%d is "
                    "running on this thread; the graph would not repeat it on replay)",
                    op, what, g_capture->device);
}

k3_status k3_graph_note(const k3_tensor *t) {
    k3_graph *g = g_capture;
    if (!g || !t) return K3_OK;
    /* Work on another device would run on that device's stream, eagerly, not in the graph. */
    k3_device d = t->storage->device;
    if (d.type == K3_DEVICE_CUDA && d.index != g->device) {
        char what[64];
        snprintf(what, sizeof what, "work on cuda:%d (the capture is of cuda:%d)", d.index,
                 g->device);
        return k3_graph_refuse("graph_capture", what);
    }
    /* Newest first: an op's tensors are usually the ones the previous op touched. */
    for (int i = g->nheld; i-- > 0;)
        if (g->held[i]->storage == t->storage) return K3_OK;
    if (g->nheld == g->cap) {
        int nc = g->cap ? 2 * g->cap : 64;
        k3_tensor **n = k3_host_alloc(sizeof *n * (size_t)nc);
        if (!n) return k3_error(K3_ENOMEM, "graph_capture: out of host memory");
        if (g->nheld) memcpy(n, g->held, sizeof *n * (size_t)g->nheld);
        k3_host_free(g->held, sizeof *n * (size_t)g->cap);
        g->held = n;
        g->cap = nc;
    }
    k3_tensor *h;
    K3_TRY(k3_tensor_alias(&h, t));
    g->held[g->nheld++] = h;
    return K3_OK;
}

k3_status k3_graph_note_op(const k3_op_args *a, k3_device device) {
    if (!g_capture) return K3_OK;
    const char *op = k3_op_name(a->op);
    if (device.type != K3_DEVICE_CUDA) return k3_graph_refuse(op, "an op on CPU tensors");
    const k3_tensor *ts[8] = {NULL};
    switch (a->op) {
    case K3_OP_LINEAR: {
        const k3_linear_args *l = &a->u.linear;
        ts[0] = l->x, ts[1] = l->w, ts[2] = l->bias, ts[3] = l->residual, ts[4] = l->out;
        ts[5] = l->norm_weight; /* the rms_norm prologue's */
        break;
    }
    case K3_OP_ATTN_RES: {
        const k3_attn_res_kargs *r = &a->u.attn_res;
        ts[0] = r->p.prefix, ts[1] = r->p.delta, ts[2] = r->p.blocks, ts[3] = r->p.norm_weight;
        ts[4] = r->p.qk_weight, ts[5] = r->p.output_norm_weight, ts[6] = r->out;
        break;
    }
    case K3_OP_RMS_NORM:
        ts[0] = a->u.rms_norm.x, ts[1] = a->u.rms_norm.w, ts[2] = a->u.rms_norm.out;
        break;
    case K3_OP_SILU_MUL:
        ts[0] = a->u.silu_mul.x, ts[1] = a->u.silu_mul.out;
        break;
    default: break;
    }
    for (int i = 0; i < 8; i++) K3_TRY(k3_graph_note(ts[i]));
    return K3_OK;
}

/* The capture succeeded: storages whose memory was released during it are dropped (that
 * memory is already the graph's, through the allocator), the others counted as held by this
 * graph (a storage released during the capture whose memory an earlier graph keeps included). */
static void count_holds(k3_graph *g) {
    int n = 0;
    for (int i = 0; i < g->nheld; i++) {
        k3_tensor *h = g->held[i];
        if (__atomic_load_n(&h->storage->data, __ATOMIC_ACQUIRE) == NULL) {
            k3_tensor_free(h);
            continue;
        }
        __atomic_add_fetch(&h->storage->graph_holds, 1, __ATOMIC_ACQ_REL);
        g->held[n++] = h;
    }
    g->nheld = n;
    g->counted = 1;
}

/* Drops every hold; a storage whose tensors were released while the graph held it gives its
 * memory back when the last graph holding it lets go. */
static void drop_holds(k3_graph *g) {
    for (int i = 0; i < g->nheld; i++) {
        k3_tensor *h = g->held[i];
        if (g->counted && __atomic_sub_fetch(&h->storage->graph_holds, 1, __ATOMIC_ACQ_REL) == 0 &&
            __atomic_load_n(&h->storage->released, __ATOMIC_ACQUIRE))
            k3_storage_release_memory(h->storage);
        k3_tensor_free(h);
    }
    k3_host_free(g->held, sizeof *g->held * (size_t)g->cap);
    g->held = NULL;
    g->nheld = g->cap = 0;
}

static void destroy(k3_graph *g) {
    if (g->exec) g->be->graph_free(g->exec);
    drop_holds(g);
    k3_host_free(g, sizeof *g);
}

/* Destroys the graphs freed while this thread was capturing. */
static void run_deferred(void) {
    for (int i = 0; i < g_ndeferred; i++) destroy(g_deferred[i]);
    k3_host_free(g_deferred, sizeof *g_deferred * (size_t)g_deferred_cap);
    g_deferred = NULL;
    g_ndeferred = g_deferred_cap = 0;
}

/* Ends a failed capture: discarded by the backend, holds dropped, status s with the message
 * that was current (the backend's cleanup may report its own). */
static k3_status abandon(k3_graph *g, k3_status s) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", k3_last_error());
    g_capture = NULL;
    g->be->graph_abandon(g->device);
    run_deferred();
    destroy(g);
    return k3_error(s, "%s", keep);
}

k3_status k3_graph_capture(k3_graph **out, k3_graph_fn fn, void *ud, const k3_graph_options *o) {
    static const k3_graph_options dflt = {0, 0};
    if (!out) return k3_error(K3_EINVAL, "graph_capture: out is NULL");
    *out = NULL;
    if (!fn) return k3_error(K3_EINVAL, "graph_capture: fn is NULL");
    if (!o) o = &dflt;
    if (g_capture)
        return k3_error(K3_EINVAL,
                        "graph_capture: a CUDA graph is already being captured on this thread");
    if (o->warmup < 0)
        return k3_error(K3_EINVAL, "graph_capture: warmup must be >= 0; got %d", o->warmup);
    const char *reason = NULL;
    const k3_backend *be = k3_cuda_backend(&reason);
    if (!be) return k3_error(K3_EDEVICE, "graph_capture: needs a CUDA device: %s", reason);
    if (o->device < 0 || o->device >= be->device_count)
        return k3_error(K3_EDEVICE,
                        "graph_capture: device cuda:%d does not exist (%d CUDA device%s)",
                        o->device, be->device_count, be->device_count == 1 ? "" : "s");
    for (int i = 0; i < o->warmup; i++) K3_TRY(fn(ud));
    K3_TRY(k3_synchronize());
    k3_graph *g = k3_host_calloc(1, sizeof *g);
    if (!g) return k3_error(K3_ENOMEM, "graph_capture: out of host memory");
    g->be = be;
    g->device = o->device;
    k3_status s = be->graph_begin(o->device);
    if (s != K3_OK) {
        k3_host_free(g, sizeof *g);
        return s;
    }
    g_capture = g;
    s = fn(ud);
    if (s != K3_OK) return abandon(g, s);
    g_capture = NULL;
    s = be->graph_end(o->device, &g->exec);
    run_deferred();
    if (s != K3_OK) {
        g->exec = NULL;
        destroy(g);
        return k3_error_prefix(s, "graph_capture");
    }
    g->kernels = be->graph_kernels(g->exec);
    count_holds(g);
    *out = g;
    return K3_OK;
}

k3_status k3_graph_replay(k3_graph *g) {
    if (!g) return k3_error(K3_EINVAL, "graph_replay: g is NULL");
    K3_TRY(k3_graph_refuse("graph_replay", "a graph replay"));
    return g->be->graph_replay(g->exec, 1);
}

void k3_graph_free(k3_graph *g) {
    if (!g) return;
    if (!g_capture) {
        destroy(g);
        return;
    }
    if (g_ndeferred == g_deferred_cap) {
        int nc = g_deferred_cap ? 2 * g_deferred_cap : 8;
        k3_graph **n = k3_host_alloc(sizeof *n * (size_t)nc);
        if (!n) return; /* cannot report: the graph stays allocated (a leak, never a crash) */
        if (g_ndeferred) memcpy(n, g_deferred, sizeof *n * (size_t)g_ndeferred);
        k3_host_free(g_deferred, sizeof *n * (size_t)g_deferred_cap);
        g_deferred = n;
        g_deferred_cap = nc;
    }
    g_deferred[g_ndeferred++] = g;
}

int k3_graph_kernels(const k3_graph *g) { return g ? g->kernels : 0; }
int k3_graph_tensors(const k3_graph *g) { return g ? g->nheld : 0; }
int k3_graph_device(const k3_graph *g) { return g ? g->device : -1; }
