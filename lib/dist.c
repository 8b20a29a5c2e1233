/*
 * dist.c — tensor parallelism, the core side: process-group state from the launcher's
 * environment, the NCCL id exchanged through a file in the launcher's directory (bounded
 * waits), argument checks, and the cross-rank comparison of every collective's call, dtype and
 * shape before it runs. The collectives themselves are the CUDA backend's (kernels/dist.cu).
 */
#include "k3_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DIST_DEFAULT_TIMEOUT 120.0
#define DIST_MAX_WORLD 4096

/* One process group per process (one process per GPU); the mutex keeps init and destroy
 * from racing between threads. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int initialized, rank, world, device, check_shapes, wait_each, generation;
    double timeout_s;
    char dir[PATH_MAX];
    char failed_file[PATH_MAX + 16];
} g_dist = {0, 0, 1, 0, 1, 1, 0, DIST_DEFAULT_TIMEOUT, "", ""};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parses env `name` as an integer in [lo, hi]; *out keeps dflt when unset or empty. */
static k3_status env_int(const char *name, int lo, int hi, int dflt, int *out) {
    const char *v = getenv(name);
    *out = dflt;
    if (!v || !*v) return K3_OK;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    char e[K3_ECHO_SIZE];
    if (errno || end == v || *end || x < lo || x > hi)
        return k3_error(K3_EINVAL, "k3.dist.init: %s must be an integer in %d..%d; got '%s'", name,
                        lo, hi, k3_echo(e, sizeof e, v));
    *out = (int)x;
    return K3_OK;
}

K3_API void k3_dist_options_default(k3_dist_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->rank = -1;
    o->world_size = 0;
    o->device = -1;
    o->dir = NULL;
    o->timeout_s = 0;
    o->check_shapes = -1;
    o->wait_each = -1;
}

/* Resolves every "from the environment" field of o into r. */
static k3_status resolve_options(const k3_dist_options *o, k3_dist_options *r, char *dir,
                                 size_t dir_n) {
    k3_dist_options d;
    if (!o) {
        k3_dist_options_default(&d);
        o = &d;
    }
    *r = *o;
    if (r->world_size <= 0) K3_TRY(env_int("K3_WORLD_SIZE", 1, DIST_MAX_WORLD, 1, &r->world_size));
    if (r->world_size > DIST_MAX_WORLD)
        return k3_error(K3_EINVAL, "k3.dist.init: world size must be in 1..%d; got %d",
                        DIST_MAX_WORLD, r->world_size);
    if (r->rank < 0) K3_TRY(env_int("K3_RANK", 0, DIST_MAX_WORLD - 1, 0, &r->rank));
    if (r->rank >= r->world_size) {
        const char *v = getenv("K3_RANK");
        return k3_error(K3_EINVAL, "k3.dist.init: rank %d is not in 0..%d (world size %d%s%s)",
                        r->rank, r->world_size - 1, r->world_size, v ? ", K3_RANK=" : "",
                        v ? v : "");
    }
    if (r->device < 0) K3_TRY(env_int("K3_DIST_DEVICE", 0, 1 << 20, 0, &r->device));
    if (r->timeout_s <= 0) {
        const char *v = getenv("K3_DIST_TIMEOUT");
        r->timeout_s = DIST_DEFAULT_TIMEOUT;
        if (v && *v) {
            char *end = NULL;
            double t = strtod(v, &end);
            char e[K3_ECHO_SIZE];
            if (end == v || *end || !(t > 0) || t > 1e7)
                return k3_error(K3_EINVAL, "k3.dist.init: K3_DIST_TIMEOUT must be a number of "
                                           "seconds > 0; got '%s'", k3_echo(e, sizeof e, v));
            r->timeout_s = t;
        }
    }
    if (r->check_shapes < 0) K3_TRY(env_int("K3_DIST_CHECK", 0, 1, 1, &r->check_shapes));
    if (r->wait_each < 0) {
        const char *v = getenv("K3_DIST_WAIT");
        r->wait_each = 1;
        if (v && *v) {
            if (strcmp(v, "each") == 0) r->wait_each = 1;
            else if (strcmp(v, "next") == 0) r->wait_each = 0;
            else {
                char e[K3_ECHO_SIZE];
                return k3_error(K3_EINVAL, "k3.dist.init: K3_DIST_WAIT must be \"each\" or "
                                           "\"next\"; got '%s'", k3_echo(e, sizeof e, v));
            }
        }
    }
    const char *dv = r->dir ? r->dir : getenv("K3_DIST_DIR");
    dir[0] = '\0';
    if (dv && *dv) {
        if (strlen(dv) >= dir_n - 32)
            return k3_error(K3_EINVAL, "k3.dist.init: K3_DIST_DIR is too long (%zu bytes)",
                            strlen(dv));
        snprintf(dir, dir_n, "%s", dv);
    } else if (r->world_size > 1) {
        return k3_error(K3_EINVAL, "k3.dist.init: world size %d needs K3_DIST_DIR (the directory "
                                   "where rank 0 leaves the NCCL id); start the ranks with "
                                   "scripts/k3 --nproc %d", r->world_size, r->world_size);
    }
    r->dir = dir;
    return K3_OK;
}

/* The first line of <dir>/failed when the launcher (or a rank) wrote it. */
static bool read_failed(const char *path, char *buf, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    ssize_t r = read(fd, buf, n - 1);
    close(fd);
    buf[r > 0 ? r : 0] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl) *nl = '\0';
    if (!buf[0]) snprintf(buf, n, "a rank failed");
    return true;
}

/* Rank 0: writes the id to a temporary name and renames it into place, so a reader never
 * sees a partial file. */
static k3_status write_id(const char *path, const unsigned char *id) {
    char tmp[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return k3_error(K3_EIO, "k3.dist.init: rank 0 cannot write %s: %s", tmp, strerror(errno));
    ssize_t w = write(fd, id, K3_DIST_ID_BYTES);
    int err = errno;
    if (close(fd) != 0 && w == K3_DIST_ID_BYTES) {
        err = errno;
        w = -1;
    }
    if (w != K3_DIST_ID_BYTES || rename(tmp, path) != 0) {
        if (w == K3_DIST_ID_BYTES) err = errno;
        unlink(tmp);
        return k3_error(K3_EIO, "k3.dist.init: rank 0 cannot write %s: %s", path, strerror(err));
    }
    return K3_OK;
}

/* Other ranks: wait (bounded; early out on a failure note) for rank 0's id. */
static k3_status read_id(const char *path, const char *failed, int rank, double timeout_s,
                         unsigned char *id) {
    double start = now_s();
    for (;;) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            ssize_t r = read(fd, id, K3_DIST_ID_BYTES);
            close(fd);
            if (r == K3_DIST_ID_BYTES) return K3_OK;
            return k3_error(K3_EIO, "k3.dist.init: %s holds %zd bytes; an NCCL id is %d", path,
                            r, K3_DIST_ID_BYTES);
        }
        char note[512];
        if (read_failed(failed, note, sizeof note))
            return k3_error(K3_ECUDA, "k3.dist.init: rank %d stops waiting for rank 0's NCCL id: "
                                      "%s", rank, note);
        if (now_s() - start > timeout_s)
            return k3_error(K3_ECUDA, "k3.dist.init: rank %d timed out after %g s waiting for "
                                      "rank 0's NCCL id in %s (did rank 0 call k3.dist.init()?)",
                            rank, timeout_s, path);
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
    }
}

static const k3_backend *dist_backend(const char *what) {
    const char *reason = NULL;
    const k3_backend *be = k3_cuda_backend(&reason);
    if (!be) {
        k3_error(K3_EDEVICE, "k3.dist.%s: world size %d needs the CUDA backend: %s", what,
                 g_dist.world, reason ? reason : "not loaded");
        return NULL;
    }
    if (!be->dist_init || !be->dist_unique_id || !be->dist_all_reduce || !be->dist_all_gather ||
        !be->dist_synchronize || !be->dist_destroy || !be->dist_stats) {
        k3_error(K3_EDEVICE, "k3.dist.%s: this libk3_cuda.so has no NCCL support (built without "
                             "nccl.h, or before kernels/dist.cu was added to its table)", what);
        return NULL;
    }
    return be;
}

K3_API k3_status k3_dist_init(const k3_dist_options *o) {
    k3_dist_options r;
    char dir[PATH_MAX];
    K3_TRY(resolve_options(o, &r, dir, sizeof dir));
    pthread_mutex_lock(&g_mu);
    k3_status s = K3_OK;
    if (g_dist.initialized) {
        s = k3_error(K3_EINVAL, "k3.dist.init: already initialised as rank %d of %d (call "
                                "k3.dist.destroy() first)", g_dist.rank, g_dist.world);
        goto out;
    }
    g_dist.rank = r.rank;
    g_dist.world = r.world_size;
    g_dist.device = r.device;
    g_dist.timeout_s = r.timeout_s;
    g_dist.check_shapes = r.check_shapes;
    g_dist.wait_each = r.wait_each;
    snprintf(g_dist.dir, sizeof g_dist.dir, "%s", dir);
    if (dir[0]) snprintf(g_dist.failed_file, sizeof g_dist.failed_file, "%s/failed", dir);
    else g_dist.failed_file[0] = '\0';
    if (r.world_size > 1) {
        const k3_backend *be = dist_backend("init");
        if (!be) {
            s = K3_EDEVICE;
            goto out;
        }
        if (r.device >= be->device_count) {
            s = k3_error(K3_EDEVICE, "k3.dist.init: rank %d wants cuda:%d but this process sees "
                                     "%d CUDA device%s (CUDA_VISIBLE_DEVICES=%s)",
                         r.rank, r.device, be->device_count, be->device_count == 1 ? "" : "s",
                         getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES")
                                                        : "unset");
            goto out;
        }
        /* Every rank counts its inits the same way, so a second init after destroy reads a
         * fresh id file, never the stale one. */
        int gen = g_dist.generation + 1;
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/nccl_id.%d", dir, gen);
        unsigned char id[K3_DIST_ID_BYTES];
        if (r.rank == 0) {
            s = be->dist_unique_id(id, sizeof id);
            if (s == K3_OK) s = write_id(path, id);
        } else {
            s = read_id(path, g_dist.failed_file, r.rank, r.timeout_s, id);
        }
        if (s == K3_OK)
            s = be->dist_init(r.device, r.rank, r.world_size, id, sizeof id, r.timeout_s,
                              g_dist.failed_file, r.wait_each);
        if (s != K3_OK) goto out;
        g_dist.generation = gen;
    }
    g_dist.initialized = 1;
out:
    if (s != K3_OK && !g_dist.initialized) {
        g_dist.rank = 0;
        g_dist.world = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return s;
}

K3_API int k3_dist_initialized(void) { return g_dist.initialized; }
K3_API int k3_dist_rank(void) { return g_dist.initialized ? g_dist.rank : 0; }
K3_API int k3_dist_world_size(void) { return g_dist.initialized ? g_dist.world : 1; }
K3_API int k3_dist_device(void) { return g_dist.device; }

/* ---- the cross-rank check ------------------------------------------------------------- */

enum { CALL_ALL_REDUCE_SUM = 1, CALL_ALL_REDUCE_MAX, CALL_ALL_REDUCE_MIN, CALL_ALL_GATHER,
       CALL_BARRIER };
#define SIG_N (3 + K3_MAX_DIMS) /* call, dtype, ndim, sizes */

static const char *call_name(int c) {
    switch (c) {
    case CALL_ALL_REDUCE_SUM: return "all_reduce(sum)";
    case CALL_ALL_REDUCE_MAX: return "all_reduce(max)";
    case CALL_ALL_REDUCE_MIN: return "all_reduce(min)";
    case CALL_ALL_GATHER: return "all_gather";
    case CALL_BARRIER: return "barrier";
    default: return "?";
    }
}

static void sig_of(double *sig, int call, const k3_tensor *t) {
    for (int i = 0; i < SIG_N; i++) sig[i] = 0;
    sig[0] = call;
    if (!t) return;
    sig[1] = (double)t->dtype + 1;
    sig[2] = t->ndim;
    for (int d = 0; d < t->ndim; d++) sig[3 + d] = (double)t->size[d];
}

static void describe(char *buf, size_t n, const double *sig) {
    int call = (int)sig[0];
    if (call == CALL_BARRIER || sig[1] < 1) {
        snprintf(buf, n, "%s", call_name(call));
        return;
    }
    int64_t sz[K3_MAX_DIMS];
    int nd = (int)sig[2];
    if (nd < 0 || nd > K3_MAX_DIMS) nd = 0;
    for (int d = 0; d < nd; d++) sz[d] = (int64_t)sig[3 + d];
    char dims[256];
    k3_fmt_dims(dims, sizeof dims, nd, sz);
    snprintf(buf, n, "%s of %s %s", call_name(call), k3_dtype_name((k3_dtype)((int)sig[1] - 1)),
             dims);
}

/* Every rank contributes (sig, -sig) to one max-all-reduce: equal everywhere iff max == -min.
 * On a difference every rank sees the same result, so all of them gather the signatures
 * (the communicator stays usable) and raise one message naming each rank's call. */
static k3_status check_across_ranks(const k3_backend *be, const char *what, int call,
                                    const k3_tensor *t) {
    double v[2 * SIG_N];
    sig_of(v, call, t);
    for (int i = 0; i < SIG_N; i++) v[SIG_N + i] = -v[i];
    int64_t shape[1] = {2 * SIG_N};
    k3_device dev = {K3_DEVICE_CUDA, g_dist.device};
    k3_tensor *st = NULL;
    K3_TRY(k3_tensor_from_f64(&st, 1, shape, K3_DTYPE_F64, dev, v));
    double mine[SIG_N];
    memcpy(mine, v, sizeof mine);
    k3_status s = be->dist_all_reduce(st, K3_DIST_MAX | K3_DIST_INTERNAL);
    if (s == K3_OK) s = k3_tensor_to_f64(st, v);
    k3_tensor_free(st);
    if (s != K3_OK) {
        /* The backend names its internal call; the user made `what`. */
        static const char internal[] = "k3.dist.shape check";
        const char *m = k3_last_error();
        if (strncmp(m, internal, sizeof internal - 1) == 0) {
            char copy[1200];
            snprintf(copy, sizeof copy, "%s", m + sizeof internal - 1);
            return k3_error(s, "k3.dist.%s%s", what, copy);
        }
        return s;
    }
    bool same = true;
    for (int i = 0; i < SIG_N; i++) same = same && v[i] == -v[SIG_N + i];
    if (same) return K3_OK;

    int W = g_dist.world;
    k3_tensor *one = NULL, *all = NULL;
    int64_t s1[1] = {SIG_N}, sw[1] = {(int64_t)SIG_N * W};
    double *sigs = k3_host_alloc(sizeof(double) * SIG_N * (size_t)W);
    if (!sigs) return k3_error(K3_ENOMEM, "k3.dist.%s: out of host memory", what);
    s = k3_tensor_from_f64(&one, 1, s1, K3_DTYPE_F64, dev, mine);
    if (s == K3_OK) s = k3_tensor_empty(&all, 1, sw, K3_DTYPE_F64, dev);
    if (s == K3_OK) s = be->dist_all_gather(all, one);
    if (s == K3_OK) s = k3_tensor_to_f64(all, sigs);
    k3_tensor_free(one);
    k3_tensor_free(all);
    if (s != K3_OK) {
        k3_host_free(sigs, sizeof(double) * SIG_N * (size_t)W);
        return s;
    }
    char msg[2048];
    int len = snprintf(msg, sizeof msg, "k3.dist.%s: the ranks' calls differ (every rank must make "
                                        "the same collective call with the same dtype and shape):",
                       what);
    for (int r = 0; r < W && len > 0 && (size_t)len < sizeof msg; r++) {
        if (r == 8 && W > 9) {
            snprintf(msg + len, sizeof msg - (size_t)len, " ... (%d ranks)", W);
            break;
        }
        char d[320];
        describe(d, sizeof d, sigs + (size_t)r * SIG_N);
        len += snprintf(msg + len, sizeof msg - (size_t)len, "%s rank %d: %s", r ? ";" : "", r, d);
    }
    k3_host_free(sigs, sizeof(double) * SIG_N * (size_t)W);
    return k3_error(K3_ESHAPE, "%s", msg);
}

/* Shared entry checks; *be is NULL at world size 1 (no backend needed). */
static k3_status collective_prologue(const char *what, const k3_tensor *t, const char *arg,
                                     const k3_backend **be) {
    *be = NULL;
    if (!g_dist.initialized)
        return k3_error(K3_EINVAL, "k3.dist.%s: call k3.dist.init() first", what);
    if (t) {
        K3_TRY(k3_tensor_check(t, arg));
        if (!k3_tensor_is_contiguous(t)) {
            char sz[160], st[160];
            return k3_error(K3_ELAYOUT, "k3.dist.%s: %s must be contiguous (NCCL reads packed "
                                        "memory); got shape %s strides %s",
                            what, arg, k3_fmt_dims(sz, sizeof sz, t->ndim, t->size),
                            k3_fmt_dims(st, sizeof st, t->ndim, t->stride));
        }
    }
    if (g_dist.world == 1) return K3_OK;
    if (t) {
        k3_device d = k3_tensor_device(t);
        if (d.type != K3_DEVICE_CUDA || d.index != g_dist.device) {
            char buf[32];
            return k3_error(K3_EDEVICE, "k3.dist.%s: %s is on %s; rank %d's device is cuda:%d",
                            what, arg, k3_device_name(d, buf, sizeof buf), g_dist.rank,
                            g_dist.device);
        }
    }
    *be = dist_backend(what);
    return *be ? K3_OK : K3_EDEVICE;
}

K3_API k3_status k3_dist_all_reduce(k3_tensor *t, k3_dist_op op) {
    const k3_backend *be;
    /* Only a C caller can pass these (the binding checks the tensor and the op's name), so
     * they are named as C calls them; the checks below are shared with Lua and keep the
     * "k3.dist.<name>" its users know. */
    if (!t) return k3_error(K3_EINVAL, "dist_all_reduce: t is NULL");
    if (op != K3_DIST_SUM && op != K3_DIST_MAX && op != K3_DIST_MIN)
        return k3_error(K3_EINVAL,
                        "dist_all_reduce: op must be K3_DIST_SUM (0), K3_DIST_MAX (1) or "
                        "K3_DIST_MIN (2); got %d",
                        (int)op);
    K3_TRY(collective_prologue("all_reduce", t, "tensor", &be));
    if (!be) return K3_OK;
    if (g_dist.check_shapes)
        K3_TRY(check_across_ranks(be, "all_reduce", CALL_ALL_REDUCE_SUM + (int)op, t));
    return be->dist_all_reduce(t, (int)op);
}

K3_API k3_status k3_dist_all_gather(k3_tensor **out, const k3_tensor *t) {
    const k3_backend *be;
    if (!out) return k3_error(K3_EINVAL, "dist_all_gather: out is NULL");
    if (!t) return k3_error(K3_EINVAL, "dist_all_gather: t is NULL");
    *out = NULL;
    K3_TRY(collective_prologue("all_gather", t, "tensor", &be));
    int64_t shape[K3_MAX_DIMS];
    int nd = t->ndim ? t->ndim : 1;
    if (t->ndim) memcpy(shape, t->size, sizeof(int64_t) * (size_t)t->ndim);
    else shape[0] = 1;
    int64_t rows;
    if (!k3_mul_ok(shape[0], g_dist.world, &rows))
        return k3_error(K3_EOVERFLOW, "k3.dist.all_gather: %d x %lld rows overflow", g_dist.world,
                        (long long)shape[0]);
    shape[0] = rows;
    if (be && g_dist.check_shapes) K3_TRY(check_across_ranks(be, "all_gather", CALL_ALL_GATHER, t));
    k3_tensor *o = NULL;
    K3_TRY(k3_tensor_empty(&o, nd, shape, t->dtype, k3_tensor_device(t)));
    k3_status s;
    if (!be) {
        /* World size 1: the gather is a copy. */
        if (t->ndim) {
            s = k3_tensor_copy(o, t);
        } else {
            k3_tensor *v = NULL;
            int64_t one[1] = {1};
            s = k3_tensor_view(&v, t, 1, one);
            if (s == K3_OK) s = k3_tensor_copy(o, v);
            k3_tensor_free(v);
        }
    } else {
        s = be->dist_all_gather(o, t);
    }
    if (s != K3_OK) {
        k3_tensor_free(o);
        return s;
    }
    *out = o;
    return K3_OK;
}

K3_API k3_status k3_dist_barrier(void) {
    const k3_backend *be;
    K3_TRY(collective_prologue("barrier", NULL, NULL, &be));
    if (!be) return K3_OK;
    /* The check is itself a synchronous all-reduce, so it is the barrier. */
    return check_across_ranks(be, "barrier", CALL_BARRIER, NULL);
}

K3_API k3_status k3_dist_synchronize(void) {
    if (!g_dist.initialized || g_dist.world == 1) return K3_OK;
    const k3_backend *be = dist_backend("synchronize");
    return be ? be->dist_synchronize() : K3_EDEVICE;
}

K3_API k3_status k3_dist_destroy(int abort) {
    pthread_mutex_lock(&g_mu);
    k3_status s = K3_OK;
    if (g_dist.initialized && g_dist.world > 1) {
        const k3_backend *be = dist_backend("destroy");
        s = be ? be->dist_destroy(abort) : K3_EDEVICE;
    }
    g_dist.initialized = 0;
    g_dist.rank = 0;
    g_dist.world = 1;
    pthread_mutex_unlock(&g_mu);
    return s;
}

K3_API k3_status k3_dist_get_stats(k3_dist_stats *out, int reset) {
    if (!out) return k3_error(K3_EINVAL, "dist_get_stats: out is NULL");
    memset(out, 0, sizeof *out);
    if (!g_dist.initialized || g_dist.world == 1) return K3_OK;
    const k3_backend *be = dist_backend("stats");
    return be ? be->dist_stats(out, reset) : K3_EDEVICE;
}
