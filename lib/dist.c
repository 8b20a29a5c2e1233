/*
 * dist.c — tensor parallelism, the core side: process-group state from the launcher's
 * environment, the NCCL id exchanged through a file in the launcher's directory (bounded
 * waits), argument checks, and the cross-rank comparison of every collective's call, dtype and
 * shape before it runs, on a shared-memory board in the same directory (dist.h): host
 * metadata only, so the compute stream keeps its queue. The collectives themselves are the
 * CUDA backend's (kernels/dist.cu).
 */
#include "dist.h"
#include "k3_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
    k3_dist_board *board;  /* above world size 1: the agreement board (dist.h) */
    uint64_t check_calls;  /* checks since init or the last stats reset, and their host wait */
    double check_ms;
    char dead[1100];       /* the first bounded wait that failed; every later call fails */
} g_dist = {0, 0, 1, 0, 1, 1, 0, DIST_DEFAULT_TIMEOUT, "", "", NULL, 0, 0, ""};

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
                             "nccl.h)", what);
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
        char board_path[PATH_MAX + 32];
        snprintf(board_path, sizeof board_path, "%s/check.%d", dir, gen);
        unsigned char id[K3_DIST_ID_BYTES];
        k3_dist_board *board = NULL;
        if (r.rank == 0) {
            /* The board exists before the id does, so a rank that read the id finds it. */
            s = k3_dist_board_open(&board, board_path, 0, r.world_size);
            if (s == K3_OK) s = be->dist_unique_id(id, sizeof id);
            if (s == K3_OK) s = write_id(path, id);
        } else {
            s = read_id(path, g_dist.failed_file, r.rank, r.timeout_s, id);
            if (s == K3_OK) s = k3_dist_board_open(&board, board_path, r.rank, r.world_size);
        }
        if (s == K3_OK)
            s = be->dist_init(r.device, r.rank, r.world_size, id, sizeof id, r.timeout_s,
                              g_dist.failed_file, r.wait_each);
        if (s != K3_OK) {
            k3_dist_board_free(board);
            if (r.rank == 0 && board) unlink(board_path); /* a retry creates it afresh */
            goto out;
        }
        g_dist.board = board;
        g_dist.generation = gen;
    }
    g_dist.check_calls = 0;
    g_dist.check_ms = 0;
    g_dist.dead[0] = '\0';
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

/* ---- the agreement board (dist.h) -------------------------------------------------------- */

#define BOARD_MAGIC 0x6b33646973746231ULL /* "k3distb1" */
#define SIG_N (3 + K3_MAX_DIMS)          /* call, dtype + 1, ndim, sizes */

/* One rank's signature for one collective; `seq` (the rank's collective count) is stored
 * last with release order, so a reader that sees it also sees the signature. */
typedef struct {
    uint64_t seq;
    int64_t sig[SIG_N];
    char pad[128 - 8 - 8 * SIG_N];
} board_slot;

typedef struct {
    uint64_t magic;
    int64_t world;
    char host[256]; /* rank 0's host name: every rank must share it */
    char pad[128 - (8 + 8 + 256) % 128];
} board_head;

struct k3_dist_board {
    board_head *head;
    board_slot *slots; /* [2][world]: the parity of the collective count, then the rank */
    size_t bytes;
    int world, mapped;
    uint64_t *posted, *done; /* per rank: count of its last post and of its last verdict */
};

static size_t board_bytes(int world) {
    return sizeof(board_head) + 2 * (size_t)world * sizeof(board_slot);
}

static board_slot *slot_of(const k3_dist_board *b, int rank, uint64_t seq) {
    return &b->slots[(size_t)(seq & 1) * (size_t)b->world + (size_t)rank];
}

/* The per-rank counters and the struct around a mapping or an allocation of `bytes`. */
static k3_status board_wrap(k3_dist_board **out, void *mem, size_t bytes, int world, int mapped) {
    k3_dist_board *b = calloc(1, sizeof *b);
    uint64_t *counts = calloc(2 * (size_t)world, sizeof(uint64_t));
    if (!b || !counts) {
        free(b);
        free(counts);
        return k3_error(K3_ENOMEM, "k3.dist: out of host memory for the agreement board");
    }
    b->head = mem;
    b->slots = (board_slot *)((char *)mem + sizeof(board_head));
    b->bytes = bytes;
    b->world = world;
    b->mapped = mapped;
    b->posted = counts;
    b->done = counts + world;
    *out = b;
    return K3_OK;
}

K3_API k3_status k3_dist_board_new(k3_dist_board **out, int world) {
    if (!out) return k3_error(K3_EINVAL, "dist_board_new: out is NULL");
    *out = NULL;
    if (world < 1 || world > DIST_MAX_WORLD)
        return k3_error(K3_EINVAL, "k3.dist: world size must be in 1..%d; got %d", DIST_MAX_WORLD,
                        world);
    size_t bytes = board_bytes(world);
    void *mem = calloc(1, bytes);
    if (!mem) return k3_error(K3_ENOMEM, "k3.dist: out of host memory for the agreement board");
    k3_status s = board_wrap(out, mem, bytes, world, 0);
    if (s != K3_OK) {
        free(mem);
        return s;
    }
    (*out)->head->magic = BOARD_MAGIC;
    (*out)->head->world = world;
    return K3_OK;
}

K3_API void k3_dist_board_free(k3_dist_board *b) {
    if (!b) return;
    if (b->mapped) munmap(b->head, b->bytes);
    else free(b->head);
    free(b->posted);
    free(b);
}

K3_API k3_status k3_dist_board_open(k3_dist_board **out, const char *path, int rank,
                                    int world) {
    if (!out || !path) return k3_error(K3_EINVAL, "dist_board_open: out or path is NULL");
    *out = NULL;
    if (world < 1 || world > DIST_MAX_WORLD || rank < 0 || rank >= world)
        return k3_error(K3_EINVAL, "k3.dist.init: rank %d of world size %d is not in 0..%d", rank,
                        world, world - 1);
    size_t bytes = board_bytes(world);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    int fd = rank == 0 ? open(path, O_RDWR | O_CREAT | O_EXCL, 0600) : open(path, O_RDWR);
    if (fd < 0)
        return k3_error(K3_EIO, "k3.dist.init: rank %d cannot %s the agreement board %s: %s",
                        rank, rank == 0 ? "create" : "open", path, strerror(errno));
    struct stat st;
    if (rank == 0 && ftruncate(fd, (off_t)bytes) != 0) {
        int err = errno;
        close(fd);
        return k3_error(K3_EIO, "k3.dist.init: rank 0 cannot size %s: %s", path, strerror(err));
    }
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return k3_error(K3_EIO, "k3.dist.init: cannot stat %s: %s", path, strerror(err));
    }
    if ((size_t)st.st_size != bytes) {
        close(fd);
        return k3_error(K3_EIO, "k3.dist.init: %s holds %lld bytes; a board for %d ranks is %zu",
                        path, (long long)st.st_size, world, bytes);
    }
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (mem == MAP_FAILED)
        return k3_error(K3_EIO, "k3.dist.init: rank %d cannot map %s: %s", rank, path,
                        strerror(err));
    board_head *h = mem;
    if (rank == 0) {
        h->world = world;
        snprintf(h->host, sizeof h->host, "%s", host);
        __atomic_store_n(&h->magic, BOARD_MAGIC, __ATOMIC_RELEASE);
    } else if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != BOARD_MAGIC || h->world != world) {
        munmap(mem, bytes);
        return k3_error(K3_EIO, "k3.dist.init: %s is not the agreement board of this %d-rank "
                                "world (did every rank get the same K3_DIST_DIR?)", path, world);
    } else if (strncmp(h->host, host, sizeof h->host) != 0) {
        char a[K3_ECHO_SIZE], b[K3_ECHO_SIZE];
        munmap(mem, bytes);
        return k3_error(K3_EINVAL, "k3.dist.init: rank %d runs on host '%s', rank 0 on '%s': "
                                   "k3.dist's agreement check and barrier use shared memory in "
                                   "K3_DIST_DIR, so every rank must run on one host",
                        rank, k3_echo(a, sizeof a, host), k3_echo(b, sizeof b, h->host));
    }
    k3_status s = board_wrap(out, mem, bytes, world, 1);
    if (s != K3_OK) munmap(mem, bytes);
    return s;
}

static k3_status board_rank(const k3_dist_board *b, int rank, const char *fn) {
    if (!b) return k3_error(K3_EINVAL, "%s: board is NULL", fn);
    if (rank < 0 || rank >= b->world)
        return k3_error(K3_EINVAL, "%s: rank %d is not in 0..%d", fn, rank, b->world - 1);
    return K3_OK;
}

K3_API k3_status k3_dist_board_post(k3_dist_board *b, int rank, int call, const k3_tensor *t) {
    K3_TRY(board_rank(b, rank, "dist_board_post"));
    if (call < K3_DIST_CALL_ALL_REDUCE_SUM || call > K3_DIST_CALL_BARRIER)
        return k3_error(K3_EINVAL, "dist_board_post: call must be in %d..%d; got %d",
                        K3_DIST_CALL_ALL_REDUCE_SUM, K3_DIST_CALL_BARRIER, call);
    if (b->posted[rank] != b->done[rank])
        return k3_error(K3_EINVAL, "dist_board_post: rank %d posts collective %llu before the "
                                   "verdict on collective %llu", rank,
                        (unsigned long long)b->posted[rank] + 1,
                        (unsigned long long)b->posted[rank]);
    uint64_t seq = b->posted[rank] + 1;
    board_slot *sl = slot_of(b, rank, seq);
    for (int i = 0; i < SIG_N; i++) sl->sig[i] = 0;
    sl->sig[0] = call;
    if (t) {
        sl->sig[1] = (int64_t)t->dtype + 1;
        sl->sig[2] = t->ndim;
        for (int d = 0; d < t->ndim; d++) sl->sig[3 + d] = t->size[d];
    }
    __atomic_store_n(&sl->seq, seq, __ATOMIC_RELEASE);
    b->posted[rank] = seq;
    return K3_OK;
}

K3_API int k3_dist_board_ready(const k3_dist_board *b, int rank, char *missing, size_t n) {
    if (missing && n) missing[0] = '\0';
    if (!b || rank < 0 || rank >= b->world || b->posted[rank] == b->done[rank]) return -1;
    uint64_t seq = b->posted[rank];
    int ready = 1;
    size_t len = 0;
    for (int q = 0; q < b->world; q++) {
        if (__atomic_load_n(&slot_of(b, q, seq)->seq, __ATOMIC_ACQUIRE) == seq) continue;
        ready = 0;
        if (!missing || len + 16 >= n) {
            if (!missing) break;
            continue;
        }
        len += (size_t)snprintf(missing + len, n - len, "%s%d", len ? ", " : "", q);
    }
    return ready;
}

static const char *call_name(int64_t c) {
    switch (c) {
    case K3_DIST_CALL_ALL_REDUCE_SUM: return "all_reduce(sum)";
    case K3_DIST_CALL_ALL_REDUCE_MAX: return "all_reduce(max)";
    case K3_DIST_CALL_ALL_REDUCE_MIN: return "all_reduce(min)";
    case K3_DIST_CALL_ALL_GATHER: return "all_gather";
    case K3_DIST_CALL_BARRIER: return "barrier";
    default: return "?";
    }
}

static void describe(char *buf, size_t n, const int64_t *sig) {
    if (sig[0] == K3_DIST_CALL_BARRIER || sig[1] < 1 || sig[1] > K3_DTYPE_F64 + 1) {
        snprintf(buf, n, "%s", call_name(sig[0]));
        return;
    }
    int nd = (int)sig[2];
    if (nd < 0 || nd > K3_MAX_DIMS) nd = 0;
    char dims[256];
    k3_fmt_dims(dims, sizeof dims, nd, sig + 3);
    snprintf(buf, n, "%s of %s %s", call_name(sig[0]), k3_dtype_name((k3_dtype)(sig[1] - 1)),
             dims);
}

K3_API k3_status k3_dist_board_verdict(k3_dist_board *b, int rank, const char *what) {
    K3_TRY(board_rank(b, rank, "dist_board_verdict"));
    if (k3_dist_board_ready(b, rank, NULL, 0) != 1)
        return k3_error(K3_EINVAL, "dist_board_verdict: rank %d's collective %llu is not on the "
                                   "board from every rank", rank,
                        (unsigned long long)b->posted[rank]);
    uint64_t seq = b->posted[rank];
    b->done[rank] = seq;
    const int64_t *mine = slot_of(b, rank, seq)->sig;
    bool same = true;
    for (int q = 0; q < b->world && same; q++)
        same = memcmp(slot_of(b, q, seq)->sig, mine, sizeof(int64_t) * SIG_N) == 0;
    if (same) return K3_OK;
    char msg[2048];
    int len = snprintf(msg, sizeof msg, "k3.dist.%s: the ranks' calls differ (every rank must make "
                                        "the same collective call with the same dtype and shape):",
                       what ? what : "?");
    for (int q = 0; q < b->world && len > 0 && (size_t)len < sizeof msg; q++) {
        if (q == 8 && b->world > 9) {
            snprintf(msg + len, sizeof msg - (size_t)len, " ... (%d ranks)", b->world);
            break;
        }
        char d[320];
        describe(d, sizeof d, slot_of(b, q, seq)->sig);
        len += snprintf(msg + len, sizeof msg - (size_t)len, "%s rank %d: %s", q ? ";" : "", q, d);
    }
    return k3_error(K3_ESHAPE, "%s", msg);
}

K3_API uint64_t k3_dist_board_checks(const k3_dist_board *b, int rank) {
    return b && rank >= 0 && rank < b->world ? b->done[rank] : 0;
}

K3_API void k3_dist_note_failure(const char *failed_file, int rank, const char *msg) {
    if (!failed_file || !failed_file[0]) return;
    char tmp[PATH_MAX + 64];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d.%d", failed_file, rank, (int)getpid()) >= (int)sizeof tmp)
        return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    char line[1200];
    int len = snprintf(line, sizeof line, "rank %d: %s\n", rank, msg ? msg : "?");
    const size_t n = len <= 0 ? 0 : (size_t)len < sizeof line ? (size_t)len : sizeof line - 1;
    bool ok = n > 0 && write(fd, line, n) == (ssize_t)n;
    ok = close(fd) == 0 && ok;
    /* link() fails when a note is there already: the first one stays, whole. Where the file
     * system has no hard links, the note is written in place (O_EXCL: still the first wins). */
    if (ok && link(tmp, failed_file) != 0 && errno != EEXIST) {
        int fd2 = open(failed_file, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd2 >= 0) {
            ssize_t w = write(fd2, line, n);
            (void)w;
            close(fd2);
        }
    }
    unlink(tmp);
}

K3_API k3_status k3_dist_board_wait(k3_dist_board *b, int rank, const char *what,
                                    double timeout_s, const char *failed_file) {
    K3_TRY(board_rank(b, rank, "dist_board_wait"));
    if (!what) what = "?";
    double start = now_s(), last_file = start;
    int spins = 0;
    char missing[256];
    for (;;) {
        int ready = k3_dist_board_ready(b, rank, missing, sizeof missing);
        if (ready == 1) return K3_OK;
        if (ready < 0)
            return k3_error(K3_EINVAL, "dist_board_wait: rank %d has no call on the board", rank);
        double tn = now_s();
        if (tn - last_file > 0.005) {
            last_file = tn;
            char note[512];
            if (failed_file && failed_file[0] && read_failed(failed_file, note, sizeof note))
                return k3_error(K3_ECUDA, "k3.dist.%s: rank %d stops: %s", what, rank, note);
        }
        if (tn - start > timeout_s) {
            char msg[1100];
            snprintf(msg, sizeof msg, "k3.dist.%s: rank %d timed out after %g s waiting for the "
                                      "other ranks to make the same call (not there: rank%s %s; "
                                      "a rank may have failed, or not made the call)",
                     what, rank, timeout_s, strchr(missing, ',') ? "s" : "", missing);
            k3_dist_note_failure(failed_file, rank, msg); /* the others stop now, not in turn */
            return k3_error(K3_ECUDA, "%s", msg);
        }
        /* Spin briefly (the ranks' hosts reach a call microseconds apart), then sleep. */
        int sp = spins++;
        if (sp >= 200) {
            struct timespec ts = {0, sp < 2000 ? 20000L : 500000L};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- the check before each collective ------------------------------------------------------ */

/* A bounded wait ended without the peers: abort the communicator (its in-flight kernels
 * stop, so the stream drains) and fail this and every later call with the message. */
static k3_status stop(const k3_backend *be, const char *msg) {
    snprintf(g_dist.dead, sizeof g_dist.dead, "%.1000s; communicator aborted", msg);
    if (be) (void)be->dist_destroy(1);
    return k3_error(K3_ECUDA, "%s", g_dist.dead);
}

/* Posts this rank's call to the board and waits (on the host only, bounded by the timeout
 * and the launcher's failure note) until every rank has posted its own; then every rank
 * compares the same signatures and a difference is the same K3_ESHAPE on each. Nothing is
 * queued on a stream and no stream is waited for. */
static k3_status check_across_ranks(const k3_backend *be, const char *what, int call,
                                    const k3_tensor *t) {
    k3_dist_board *b = g_dist.board;
    int r = g_dist.rank;
    K3_TRY(k3_dist_board_post(b, r, call, t));
    double start = now_s();
    if (k3_dist_board_wait(b, r, what, g_dist.timeout_s, g_dist.failed_file) != K3_OK) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s", k3_last_error());
        return stop(be, msg);
    }
    g_dist.check_calls++;
    g_dist.check_ms += (now_s() - start) * 1e3;
    return k3_dist_board_verdict(b, r, what);
}

/* ---- which collective runs (k3_dist_explain) ------------------------------------------------ */

/* The message size up to which a one-shot all-reduce (each rank reads every peer's buffer
 * through peer mappings and sums) beats NCCL's ring on NVLink; above it NCCL's bandwidth
 * wins. 512 KiB is the split planned for two ranks on NVLink (an estimate, not a
 * measurement here): to be measured once the kernel exists. */
#define ONE_SHOT_MAX_BYTES (512 * 1024)

static void decline(k3_dispatch *rec, const char *kernel, const char *reason) {
    if (rec->ndeclined >= K3_MAX_DECLINES) return;
    k3_decline *d = &rec->declined[rec->ndeclined++];
    snprintf(d->kernel, sizeof d->kernel, "%s", kernel);
    snprintf(d->reason, sizeof d->reason, "%s", reason);
}

K3_API k3_status k3_dist_decide(k3_dispatch *rec, const char *collective, const k3_tensor *t,
                                int world, int simulated) {
    if (!rec) return k3_error(K3_EINVAL, "dist_explain: rec is NULL");
    bool reduce = collective && strcmp(collective, "all_reduce") == 0;
    if (!reduce && !(collective && strcmp(collective, "all_gather") == 0)) {
        char e[K3_ECHO_SIZE];
        return k3_error(K3_EINVAL, "k3.dist.explain: collective must be \"all_reduce\" or "
                                   "\"all_gather\"; got '%s'",
                        collective ? k3_echo(e, sizeof e, collective) : "(null)");
    }
    memset(rec, 0, sizeof *rec);
    snprintf(rec->op, sizeof rec->op, "%s", collective);
    static const char alone[] = "world size 1: no other rank to exchange with";
    if (reduce) {
        char why[256];
        int64_t bytes = t ? k3_tensor_numel(t) * (int64_t)k3_dtype_size(t->dtype) : 0;
        if (world == 1) snprintf(why, sizeof why, "%s", alone);
        else if (bytes > ONE_SHOT_MAX_BYTES)
            snprintf(why, sizeof why, "the message is %lld bytes, over the one-shot limit of %d",
                     (long long)bytes, ONE_SHOT_MAX_BYTES);
        else if (simulated) snprintf(why, sizeof why, "a simulated world has no device buffers "
                                                      "to map between ranks");
        else snprintf(why, sizeof why, "not in this build: no peer-mapped buffers yet (NCCL "
                                       "serves every size)");
        decline(rec, "cuda.all_reduce.one_shot", why);
    }
    const char *nccl = reduce ? "nccl.all_reduce" : "nccl.all_gather";
    if (world == 1) decline(rec, nccl, alone);
    else if (simulated) decline(rec, nccl, "a simulated world has no communicator");
    const char *chosen = world == 1 ? (reduce ? "local.all_reduce" : "local.all_gather")
                         : simulated ? (reduce ? "simulate.all_reduce" : "simulate.all_gather")
                                     : nccl;
    snprintf(rec->chosen, sizeof rec->chosen, "%s", chosen);
    return K3_OK;
}

K3_API k3_status k3_dist_explain(k3_dispatch *rec, const char *collective, const k3_tensor *t) {
    return k3_dist_decide(rec, collective, t, k3_dist_world_size(), 0);
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
    if (g_dist.dead[0]) return k3_error(K3_ECUDA, "k3.dist.%s: %s", what, g_dist.dead);
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
        K3_TRY(check_across_ranks(be, "all_reduce", K3_DIST_CALL_ALL_REDUCE_SUM + (int)op, t));
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
    if (be && g_dist.check_shapes)
        K3_TRY(check_across_ranks(be, "all_gather", K3_DIST_CALL_ALL_GATHER, t));
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
    /* The check waits for every rank's post, so it is the barrier (of the hosts: work
     * already queued on the streams is not waited for; k3.synchronize does that). */
    return check_across_ranks(be, "barrier", K3_DIST_CALL_BARRIER, NULL);
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
        s = be ? be->dist_destroy(abort || g_dist.dead[0]) : K3_EDEVICE;
    }
    k3_dist_board_free(g_dist.board);
    g_dist.board = NULL;
    g_dist.dead[0] = '\0';
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
    K3_TRY(be ? be->dist_stats(out, reset) : K3_EDEVICE);
    /* The checks are the core's: host time waiting for the peers' posts, no stream waits. */
    out->calls[2] = g_dist.check_calls;
    out->ms[2] = g_dist.check_ms;
    out->stream_waits[2] = 0;
    if (reset) {
        g_dist.check_calls = 0;
        g_dist.check_ms = 0;
    }
    return K3_OK;
}
