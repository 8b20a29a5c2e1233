/*
 * timing.c — k3_cuda_time: device time per call of a caller's function, from CUDA events
 * around each call or around each replay of a CUDA graph of several calls, as the median of
 * many samples after a warm-up (the benchmarks' method). Events and graphs are the backend's.
 */
#include "k3_impl.h"

#include <stdio.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The state of one timing: every event recorded so far and the graph, released together. */
typedef struct timing {
    const k3_backend *be;
    void **ev;
    int nev;
    void *graph;
} timing;

static k3_status release(timing *t, k3_status s) {
    for (int i = 0; i < t->nev; i++) t->be->event_free(t->ev[i]);
    t->nev = 0;
    if (t->graph) t->be->graph_free(t->graph);
    t->graph = NULL;
    return s;
}

static k3_status record(timing *t, int dev) {
    K3_TRY(t->be->event_record(dev, &t->ev[t->nev]));
    t->nev++;
    return K3_OK;
}

/* Captures calls 1..calls of fn into t->graph and replays it once (so the first timed replay
 * does not pay for its upload). A failed capture is ended and dropped. */
static k3_status capture(timing *t, const k3_time_options *o, k3_time_fn fn, void *ud) {
    K3_TRY(t->be->graph_begin(o->device));
    for (int i = 1; i <= o->calls; i++) {
        k3_status s = fn(ud, i);
        if (s != K3_OK) {
            void *partial = NULL;
            char keep[1024];
            snprintf(keep, sizeof keep, "%s", k3_last_error());
            if (t->be->graph_end(o->device, &partial) == K3_OK) t->be->graph_free(partial);
            return k3_error(s, "%s", keep);
        }
    }
    K3_TRY(t->be->graph_end(o->device, &t->graph));
    K3_TRY(t->be->graph_replay(t->graph, 1));
    return k3_synchronize();
}

k3_status k3_cuda_time(k3_time_fn fn, void *ud, const k3_time_options *o, k3_time_result *out) {
    static const k3_time_options dflt = {50, 5, 0, 1, 0};
    if (!fn) return k3_error(K3_EINVAL, "cuda_time: fn is NULL");
    if (!out) return k3_error(K3_EINVAL, "cuda_time: out is NULL");
    if (!o) o = &dflt;
    if (o->iters < 1 || o->iters > 100000 || o->warmup < 0 || o->calls < 1 || o->calls > 100000)
        return k3_error(K3_EINVAL,
                        "cuda_time: iters must be in 1..100000 and calls in 1..100000; got iters "
                        "%d, calls %d",
                        o->iters, o->calls);
    const char *reason = NULL;
    const k3_backend *be = k3_cuda_backend(&reason);
    if (!be) return k3_error(K3_EDEVICE, "cuda_time: CUDA is not available: %s", reason);
    size_t evbytes = sizeof(void *) * 2 * (size_t)o->iters;
    size_t msbytes = sizeof(double) * (size_t)o->iters;
    timing t = {be, k3_host_alloc(evbytes), 0, NULL};
    double *us = k3_host_alloc(msbytes);
    k3_status s = t.ev && us ? K3_OK : k3_error(K3_ENOMEM, "cuda_time: out of host memory");
    for (int i = 1; s == K3_OK && i <= o->warmup; i++) s = fn(ud, i);
    if (s == K3_OK) s = k3_synchronize();
    if (s == K3_OK && o->graph) s = capture(&t, o, fn, ud);
    for (int i = 1; s == K3_OK && i <= o->iters; i++) {
        s = record(&t, o->device);
        if (s == K3_OK) s = o->graph ? be->graph_replay(t.graph, 1) : fn(ud, i);
        if (s == K3_OK) s = record(&t, o->device);
    }
    for (int i = 0; s == K3_OK && i < o->iters; i++) {
        float ms = 0;
        s = be->event_elapsed(t.ev[2 * i], t.ev[2 * i + 1], &ms);
        us[i] = (double)ms * 1000.0 / (o->graph ? o->calls : 1);
    }
    if (s == K3_OK) {
        qsort(us, (size_t)o->iters, sizeof(double), cmp_double);
        int p90 = (o->iters * 9) / 10;
        *out = (k3_time_result){us[o->iters / 2], us[0], us[p90 < o->iters ? p90 : o->iters - 1],
                                o->iters};
    }
    release(&t, s);
    k3_host_free(us, msbytes);
    k3_host_free(t.ev, evbytes);
    return s;
}
