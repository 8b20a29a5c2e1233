/*
 * dist.cu — tensor parallelism for libk3_cuda.so: one NCCL communicator per process, NCCL
 * loaded with dlopen (libnccl.so.2) on first use so the backend still loads where NCCL is
 * absent, and every wait bounded: a non-blocking communicator (ncclConfig_t.blocking = 0)
 * polled with ncclCommGetAsyncError, collectives followed by an event polled against a
 * deadline and against the launcher's failed-rank file, ncclCommAbort on timeout or error.
 */
#include "common.cuh"
#include "dist.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if __has_include(<nccl.h>)
#include <nccl.h>
#define K3C_HAVE_NCCL 1
#else
#define K3C_HAVE_NCCL 0
#endif

#if K3C_HAVE_NCCL

namespace {

/* The NCCL entry points k3 uses, resolved from the dlopen'ed library. */
struct nccl_api {
    void *handle;
    int version;
    decltype(&ncclGetVersion) GetVersion;
    decltype(&ncclGetUniqueId) GetUniqueId;
    decltype(&ncclCommInitRankConfig) CommInitRankConfig;
    decltype(&ncclCommGetAsyncError) CommGetAsyncError;
    decltype(&ncclCommAbort) CommAbort;
    decltype(&ncclCommFinalize) CommFinalize;
    decltype(&ncclCommDestroy) CommDestroy;
    decltype(&ncclAllReduce) AllReduce;
    decltype(&ncclAllGather) AllGather;
    decltype(&ncclGetErrorString) GetErrorString;
    decltype(&ncclGetLastError) GetLastError;
};

nccl_api g_nccl;
std::once_flag g_nccl_once;
char g_nccl_reason[512];

/* ncclCommInitRankConfig with a non-blocking config and ncclCommFinalize appeared in 2.14;
 * 2.19 is the oldest k3 accepts (what the GPU machines' 2.28 supersedes). */
#define K3C_NCCL_MIN_VERSION 21900

void load_nccl() {
    /* NVLink SHARP (multicast) stays off unless the environment says otherwise: on shared
     * hosts it can take the GPUs out of service. NCCL reads this when a communicator is made. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const char *env = getenv("K3_NCCL_LIBRARY");
    const char *names[] = {env && *env ? env : "libnccl.so.2", "libnccl.so"};
    void *h = nullptr;
    char first_err[256] = "";
    for (int i = 0; i < (env && *env ? 1 : 2) && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && !first_err[0]) {
            const char *e = dlerror();
            snprintf(first_err, sizeof first_err, "%s", e ? e : "unknown error");
        }
    }
    if (!h) {
        snprintf(g_nccl_reason, sizeof g_nccl_reason, "cannot load NCCL (%s): %s", names[0],
                 first_err);
        return;
    }
    nccl_api a;
    memset(&a, 0, sizeof a);
    a.handle = h;
#define K3C_SYM(field, name)                                                               \
    do {                                                                                   \
        *(void **)&a.field = dlsym(h, name);                                               \
        if (!a.field) {                                                                    \
            snprintf(g_nccl_reason, sizeof g_nccl_reason, "NCCL library %s lacks %s",       \
                     names[0], name);                                                      \
            return;                                                                        \
        }                                                                                  \
    } while (0)
    K3C_SYM(GetVersion, "ncclGetVersion");
    K3C_SYM(GetUniqueId, "ncclGetUniqueId");
    K3C_SYM(CommInitRankConfig, "ncclCommInitRankConfig");
    K3C_SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    K3C_SYM(CommAbort, "ncclCommAbort");
    K3C_SYM(CommFinalize, "ncclCommFinalize");
    K3C_SYM(CommDestroy, "ncclCommDestroy");
    K3C_SYM(AllReduce, "ncclAllReduce");
    K3C_SYM(AllGather, "ncclAllGather");
    K3C_SYM(GetErrorString, "ncclGetErrorString");
    K3C_SYM(GetLastError, "ncclGetLastError");
#undef K3C_SYM
    if (a.GetVersion(&a.version) != ncclSuccess || a.version < K3C_NCCL_MIN_VERSION) {
        snprintf(g_nccl_reason, sizeof g_nccl_reason,
                 "NCCL %d is too old: k3.dist needs %d or newer", a.version, K3C_NCCL_MIN_VERSION);
        return;
    }
    /* The library stays loaded for the life of the process (NCCL's threads run from it). */
    g_nccl = a;
}

k3_status nccl_loaded(const char *what) {
    std::call_once(g_nccl_once, load_nccl);
    if (!g_nccl.handle) return k3_error(K3_EDEVICE, "k3.dist.%s: %s", what, g_nccl_reason);
    return K3_OK;
}

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The communicator and what every call needs. Guarded by mu: collectives from several
 * threads of one process serialise (each still runs on its caller's stream). */
struct dist_state {
    std::mutex mu;
    ncclComm_t comm = nullptr;
    int dev = -1, rank = 0, world = 1, wait_each = 1;
    double timeout_s = 120;
    char abort_file[4096] = "";
    char dead[1100] = "";     /* the first failure once the communicator was aborted */
    cudaEvent_t ev[2][2] = {}; /* two [start, end] pairs: the pending collective and the next */
    cudaStream_t ev_stream[2] = {};
    int cur = 0, pending = -1, pending_kind = 0;
    k3_dist_stats stats = {};
    double last_file_check = 0;
};
dist_state g;

/* The launcher's (or a peer's) note in abort_file: true with its first line in buf. */
bool peer_failed(char *buf, size_t n) {
    if (!g.abort_file[0]) return false;
    int fd = open(g.abort_file, O_RDONLY);
    if (fd < 0) return false;
    ssize_t r = read(fd, buf, n - 1);
    close(fd);
    buf[r > 0 ? r : 0] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl) *nl = '\0';
    if (!buf[0]) snprintf(buf, n, "a rank failed");
    return true;
}

/* Tells the other ranks why this one gives up (k3_dist_note_failure: whole, first wins). */
void note_failure(const char *msg) { k3_dist_note_failure(g.abort_file, g.rank, msg); }

void destroy_events() {
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (g.ev[i][j]) {
                if (cudaEventDestroy(g.ev[i][j]) != cudaSuccess) (void)cudaGetLastError();
                g.ev[i][j] = nullptr;
            }
    g.pending = -1;
}

const char *nccl_msg(ncclResult_t r) {
    const char *last = g.comm ? g_nccl.GetLastError(g.comm) : nullptr;
    static thread_local char buf[640];
    snprintf(buf, sizeof buf, "%s%s%s", g_nccl.GetErrorString(r), last && *last ? ": " : "",
             last && *last ? last : "");
    return buf;
}

/* Aborts the communicator (in-flight NCCL kernels stop, so the stream drains), keeps the
 * message for every later call, tells the other ranks unless they told us, and reports it. */
k3_status fail(bool tell_peers, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
k3_status fail(bool tell_peers, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tell_peers && g.abort_file[0]) {
        /* A transport error is often a peer that died: give the launcher a moment to say
         * which, so every rank reports the cause rather than the symptom. */
        char note[512];
        for (int i = 0; i < 100 && !peer_failed(note, sizeof note); i++) {
            struct timespec ts = {0, 20000000L};
            nanosleep(&ts, nullptr);
        }
        if (peer_failed(note, sizeof note)) {
            char cause[1100];
            const char *colon = strchr(msg, ':');
            snprintf(cause, sizeof cause, "%.*s: rank %d stops: %.300s (%.500s)",
                     colon ? (int)(colon - msg) : 0, msg, g.rank, note, colon ? colon + 2 : msg);
            snprintf(msg, sizeof msg, "%.1000s", cause);
            tell_peers = false;
        }
    }
    if (tell_peers) note_failure(msg);
    if (g.comm) {
        g_nccl.CommAbort(g.comm);
        g.comm = nullptr;
    }
    g.pending = -1;
    snprintf(g.dead, sizeof g.dead, "%s; communicator aborted", msg);
    return k3_error(K3_ECUDA, "%s", g.dead);
}

/* Spin briefly (collectives at decode take microseconds), then sleep in growing steps. */
void backoff(int *spins) {
    int s = (*spins)++;
    if (s < 200) return;
    struct timespec ts = {0, s < 2000 ? 20000L : 500000L};
    nanosleep(&ts, nullptr);
}

/* Per poll: a peer's failure note (checked every few ms) and the deadline. */
k3_status poll_bounds(const char *what, double start, const char *waiting_for) {
    double t = now_s();
    if (t - g.last_file_check > 0.005) {
        g.last_file_check = t;
        char note[512];
        if (peer_failed(note, sizeof note))
            return fail(false, "k3.dist.%s: rank %d stops: %s", what, g.rank, note);
    }
    if (t - start > g.timeout_s) {
        char msg[1024];
        snprintf(msg, sizeof msg,
                 "k3.dist.%s: rank %d timed out after %g s waiting for %s (a rank may have "
                 "failed, or not made the same call)",
                 what, g.rank, g.timeout_s, waiting_for);
        note_failure(msg); /* the other ranks stop at once instead of timing out in turn */
        return fail(false, "%s", msg);
    }
    return K3_OK;
}

/* Waits until the communicator's state is no longer ncclInProgress (init, an enqueue). */
k3_status wait_ready(const char *what, const char *waiting_for) {
    double start = now_s();
    int spins = 0;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = g_nccl.CommGetAsyncError(g.comm, &st);
        if (r != ncclSuccess) return fail(true, "k3.dist.%s: NCCL: %s", what, nccl_msg(r));
        if (st == ncclSuccess) return K3_OK;
        if (st != ncclInProgress) return fail(true, "k3.dist.%s: NCCL: %s", what, nccl_msg(st));
        K3_TRY(poll_bounds(what, start, waiting_for));
        backoff(&spins);
    }
}

const char *kind_name(int kind) { return kind == 0 ? "all_reduce" : "all_gather"; }

/* Waits for the pending collective's end event (bounded), then adds its device time. Each
 * call that finds one pending is a host wait on the compute stream (stats.stream_waits). */
k3_status wait_pending() {
    if (g.pending < 0) return K3_OK;
    int p = g.pending, kind = g.pending_kind;
    g.stats.stream_waits[kind]++;
    const char *what = kind_name(kind);
    double start = now_s();
    int spins = 0;
    for (;;) {
        cudaError_t e = cudaEventQuery(g.ev[p][1]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            (void)cudaGetLastError();
            return fail(true, "k3.dist.%s: CUDA error on cuda:%d while waiting: %s (%s)", what,
                        g.dev, cudaGetErrorName(e), cudaGetErrorString(e));
        }
        ncclResult_t st = ncclSuccess;
        if (g_nccl.CommGetAsyncError(g.comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress)
            return fail(true, "k3.dist.%s: NCCL: %s", what, nccl_msg(st));
        K3_TRY(poll_bounds(what, start, "the other ranks to join the collective"));
        backoff(&spins);
    }
    g.pending = -1;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, g.ev[p][0], g.ev[p][1]) == cudaSuccess) {
        g.stats.calls[kind]++;
        g.stats.ms[kind] += ms;
    } else {
        (void)cudaGetLastError();
    }
    return K3_OK;
}

ncclDataType_t nccl_type(k3_dtype d) {
    switch (d) {
    case K3_DTYPE_BF16: return ncclBfloat16;
    case K3_DTYPE_F16: return ncclFloat16;
    case K3_DTYPE_F32: return ncclFloat32;
    default: return ncclFloat64;
    }
}

/* Entry checks every collective repeats (the core checked them first: defence in depth). */
k3_status check_live(const char *what) {
    if (g.dead[0]) return k3_error(K3_ECUDA, "k3.dist.%s: %s", what, g.dead);
    if (!g.comm) return k3_error(K3_EINVAL, "k3.dist.%s: call k3.dist.init() first", what);
    return K3_OK;
}

k3_status check_tensor(const char *what, const char *arg, const k3_tensor *t) {
    if (t->storage->device.type != K3_DEVICE_CUDA || k3c_dev(t) != g.dev)
        return k3_error(K3_EDEVICE, "k3.dist.%s: %s must be on cuda:%d (rank %d's device)", what,
                        arg, g.dev, g.rank);
    if (!k3_tensor_is_contiguous(t))
        return k3_error(K3_ELAYOUT, "k3.dist.%s: %s must be contiguous", what, arg);
    return K3_OK;
}

/* Runs one collective: waits for the one before, records [start, end] events around the
 * NCCL call on this thread's stream, and (wait_each) waits for it. */
template <class F> k3_status run_collective(int kind, F enqueue) {
    const char *what = kind_name(kind);
    cudaStream_t s;
    K3_TRY(k3c_stream(g.dev, &s));
    K3_TRY(wait_pending());
    int slot = g.cur;
    g.cur ^= 1;
    K3_CHECK(cudaEventRecord(g.ev[slot][0], s));
    ncclResult_t r = enqueue(s);
    if (r != ncclSuccess && r != ncclInProgress)
        return fail(true, "k3.dist.%s: NCCL: %s", what, nccl_msg(r));
    K3_TRY(wait_ready(what, "NCCL to queue the collective"));
    K3_CHECK(cudaEventRecord(g.ev[slot][1], s));
    g.pending = slot;
    g.pending_kind = kind;
    if (g.wait_each) K3_TRY(wait_pending());
    return K3_OK;
}

// ---- table entries ------------------------------------------------------------------------

k3_status be_unique_id(void *id, size_t n) {
    K3_TRY(nccl_loaded("init"));
    if (!id || n != sizeof(ncclUniqueId))
        return k3_error(K3_EINVAL, "k3.dist.init: the NCCL id buffer must be %zu bytes; got %zu",
                        sizeof(ncclUniqueId), n);
    ncclUniqueId u;
    ncclResult_t r = g_nccl.GetUniqueId(&u);
    if (r != ncclSuccess)
        return k3_error(K3_ECUDA, "k3.dist.init: ncclGetUniqueId failed: %s",
                        g_nccl.GetErrorString(r));
    memcpy(id, &u, sizeof u);
    return K3_OK;
}

k3_status be_init(int dev, int rank, int world, const void *id, size_t n, double timeout_s,
                  const char *abort_file, int wait_each) {
    K3_TRY(nccl_loaded("init"));
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.comm)
        return k3_error(K3_EINVAL, "k3.dist.init: already initialised (call k3.dist.destroy() "
                                   "first)");
    if (!id || n != sizeof(ncclUniqueId))
        return k3_error(K3_EINVAL, "k3.dist.init: the NCCL id must be %zu bytes; got %zu",
                        sizeof(ncclUniqueId), n);
    if (world < 1 || rank < 0 || rank >= world)
        return k3_error(K3_EINVAL, "k3.dist.init: rank %d is not in 0..%d", rank, world - 1);
    k3c_ctx *ctx = nullptr;
    K3_TRY(k3c_context(dev, &ctx)); /* also makes dev current for NCCL */
    g.dead[0] = '\0';
    g.dev = dev;
    g.rank = rank;
    g.world = world;
    g.wait_each = wait_each;
    g.timeout_s = timeout_s > 0 ? timeout_s : 120;
    snprintf(g.abort_file, sizeof g.abort_file, "%s", abort_file ? abort_file : "");
    g.stats = k3_dist_stats{};
    g.cur = 0;
    g.pending = -1;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            cudaError_t e = cudaEventCreate(&g.ev[i][j]);
            if (e != cudaSuccess) {
                destroy_events();
                return k3c_check(e, "cudaEventCreate(&g.ev[i][j])", __FILE__, __LINE__);
            }
        }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every NCCL call returns at once; k3 polls with a deadline */
    ncclComm_t comm = nullptr;
    ncclResult_t r = g_nccl.CommInitRankConfig(&comm, world, u, rank, &cfg);
    g.comm = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
        k3_status s = fail(true, "k3.dist.init: rank %d of %d: ncclCommInitRankConfig: %s", rank,
                           world, nccl_msg(r));
        destroy_events();
        return s;
    }
    k3_status s = wait_ready("init", "every rank to join the communicator");
    if (s != K3_OK) destroy_events();
    return s;
}

k3_status be_all_reduce(k3_tensor *t, int op) {
    std::lock_guard<std::mutex> lock(g.mu);
    K3_TRY(check_live("all_reduce"));
    K3_TRY(check_tensor("all_reduce", "tensor", t));
    ncclRedOp_t rop = op == K3_DIST_MAX ? ncclMax : op == K3_DIST_MIN ? ncclMin : ncclSum;
    void *p = k3_tensor_data(t);
    size_t count = (size_t)k3_tensor_numel(t);
    if (count == 0) return K3_OK;
    ncclDataType_t ty = nccl_type(t->dtype);
    return run_collective(0, [&](cudaStream_t s) {
        return g_nccl.AllReduce(p, p, count, ty, rop, g.comm, s);
    });
}

k3_status be_all_gather(k3_tensor *out, const k3_tensor *t) {
    std::lock_guard<std::mutex> lock(g.mu);
    K3_TRY(check_live("all_gather"));
    K3_TRY(check_tensor("all_gather", "tensor", t));
    K3_TRY(check_tensor("all_gather", "out", out));
    size_t count = (size_t)k3_tensor_numel(t);
    if ((size_t)k3_tensor_numel(out) != count * (size_t)g.world || out->dtype != t->dtype)
        return k3_error(K3_ESHAPE, "k3.dist.all_gather: out must hold world size (%d) x %zu "
                                   "elements of %s",
                        g.world, count, k3_dtype_name(t->dtype));
    if (count == 0) return K3_OK;
    const void *src = k3_tensor_data(t);
    void *dst = k3_tensor_data(out);
    ncclDataType_t ty = nccl_type(t->dtype);
    return run_collective(1, [&](cudaStream_t s) {
        return g_nccl.AllGather(src, dst, count, ty, g.comm, s);
    });
}

k3_status be_synchronize(void) {
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.dead[0]) return k3_error(K3_ECUDA, "k3.dist.synchronize: %s", g.dead);
    if (!g.comm) return K3_OK;
    return wait_pending();
}

k3_status be_destroy(int abort) {
    std::lock_guard<std::mutex> lock(g.mu);
    k3_status s = K3_OK;
    if (g.comm && !abort) {
        K3_CHECK(cudaSetDevice(g.dev));
        s = wait_pending();
        if (s == K3_OK && g.comm) {
            ncclResult_t r = g_nccl.CommFinalize(g.comm);
            if (r != ncclSuccess && r != ncclInProgress)
                s = fail(false, "k3.dist.destroy: ncclCommFinalize: %s", nccl_msg(r));
            else
                s = wait_ready("destroy", "NCCL to finish the communicator's work");
        }
        if (s == K3_OK && g.comm) {
            ncclResult_t r = g_nccl.CommDestroy(g.comm);
            g.comm = nullptr;
            if (r != ncclSuccess)
                s = k3_error(K3_ECUDA, "k3.dist.destroy: ncclCommDestroy: %s",
                             g_nccl.GetErrorString(r));
        }
    }
    if (g.comm) {
        if (cudaSetDevice(g.dev) != cudaSuccess) (void)cudaGetLastError();
        g_nccl.CommAbort(g.comm);
        g.comm = nullptr;
    }
    destroy_events();
    g.dead[0] = '\0';
    g.abort_file[0] = '\0';
    return s;
}

k3_status be_stats(k3_dist_stats *out, int reset) {
    std::lock_guard<std::mutex> lock(g.mu);
    if (out) *out = g.stats;
    if (reset) g.stats = k3_dist_stats{};
    return K3_OK;
}

} // namespace

/* Called by k3_cuda_backend_open (backend.cu): the k3.dist entries of the table. */
void k3c_dist_fill(k3_backend *out) {
    out->dist_unique_id = be_unique_id;
    out->dist_init = be_init;
    out->dist_all_reduce = be_all_reduce;
    out->dist_all_gather = be_all_gather;
    out->dist_synchronize = be_synchronize;
    out->dist_destroy = be_destroy;
    out->dist_stats = be_stats;
}

#else /* no nccl.h at build time: the entries stay NULL and k3_dist_init says why */

void k3c_dist_fill(k3_backend *out) { (void)out; }

#endif
