/*
 * tensor.c — the tensor core: reference-counted storage, views (narrow, select, transpose,
 * view, reshape, permute, squeeze, unsqueeze, expand, as_strided), copies between any strides,
 * dtypes and devices, fill, element access, elementwise arithmetic and comparisons. Every size computation is overflow-checked;
 * device work is handed to the CUDA backend's table.
 */
#include "k3_impl.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

double k3_randn_at(uint64_t seed, uint64_t i); /* random.c */

/* ---- small helpers ------------------------------------------------------------------------ */

const char *k3_fmt_dims(char *buf, size_t n, int ndim, const int64_t *v) {
    size_t len = 0;
    len += (size_t)snprintf(buf + len, n - len, "[");
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, i ? ", %lld" : "%lld", (long long)v[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}

const char *k3_fmt_double(char *buf, size_t n, double v) {
    /* printf's "%g" writes a NaN's sign bit ("-nan" for 0/0 on x86): a NaN is just "nan". */
    if (isnan(v)) snprintf(buf, n, "nan");
    else if (isinf(v)) snprintf(buf, n, v > 0 ? "inf" : "-inf");
    else snprintf(buf, n, "%g", v);
    return buf;
}

/* "<op>: <what> is NULL": the one message for a NULL pointer argument. */
static k3_status null_arg(const char *op, const char *what) {
    return k3_error(K3_EINVAL, "%s: %s is NULL", op, what);
}

/* A tensor argument: non-NULL (named in the message) and not freed. */
static k3_status need_tensor(const char *op, const char *what, const k3_tensor *t) {
    if (!t) return null_arg(op, what);
    return k3_tensor_check(t, what);
}

/* A device value from the caller: a known type, index 0 for the CPU and a non-negative
 * ordinal for CUDA (whether that GPU exists is checked where memory is allocated). */
static k3_status check_device(const char *op, k3_device d) {
    if ((int)d.type != K3_DEVICE_CPU && (int)d.type != K3_DEVICE_CUDA)
        return k3_error(K3_EINVAL,
                        "%s: invalid device type %d (expected K3_DEVICE_CPU = 0 or "
                        "K3_DEVICE_CUDA = 1)",
                        op, (int)d.type);
    if ((int)d.type == K3_DEVICE_CPU && d.index != 0)
        return k3_error(K3_EINVAL, "%s: invalid device index %d for cpu (must be 0)", op,
                        d.index);
    if (d.index < 0)
        return k3_error(K3_EINVAL, "%s: invalid device index %d for cuda (must be >= 0)", op,
                        d.index);
    return K3_OK;
}

k3_status k3_tensor_check(const k3_tensor *t, const char *what) {
    if (!t) return k3_error(K3_EINVAL, "%s: tensor is NULL", what ? what : "tensor");
    if (__atomic_load_n(&t->storage->released, __ATOMIC_ACQUIRE))
        return k3_error(K3_EFREED, "tensor has been freed");
    return K3_OK;
}

void k3_tensor_mark_static_nowait(k3_tensor *t, const char *owner) {
    k3_storage *s = t->storage;
    if (__atomic_load_n(&s->is_static, __ATOMIC_ACQUIRE)) return;
    snprintf(s->static_owner, sizeof s->static_owner, "%s", owner ? owner : "the caller");
    __atomic_store_n(&s->is_static, 1, __ATOMIC_RELEASE);
}

k3_status k3_tensor_mark_static(k3_tensor *t, const char *owner) {
    K3_TRY(k3_tensor_check(t, "mark_static"));
    if (k3_tensor_is_static(t)) return K3_OK;
    k3_tensor_mark_static_nowait(t, owner);
    return t->storage->device.type == K3_DEVICE_CUDA ? k3_synchronize() : K3_OK;
}

int k3_tensor_is_static(const k3_tensor *t) {
    return t && t->storage && __atomic_load_n(&t->storage->is_static, __ATOMIC_ACQUIRE);
}

k3_status k3_tensor_writable(const k3_tensor *t, const char *op, const char *what) {
    if (!k3_tensor_is_static(t)) return K3_OK;
    return k3_error(K3_EINVAL, "%s: %s is static (marked by %s); its storage refuses writes", op,
                    what, t->storage->static_owner);
}

int k3_tensor_ndim(const k3_tensor *t) { return t ? t->ndim : 0; }
int64_t k3_tensor_size(const k3_tensor *t, int d) {
    return (t && d >= 0 && d < t->ndim) ? t->size[d] : -1;
}
int64_t k3_tensor_stride(const k3_tensor *t, int d) {
    return (t && d >= 0 && d < t->ndim) ? t->stride[d] : -1;
}
int64_t k3_tensor_offset(const k3_tensor *t) { return t ? t->offset : 0; }
k3_dtype k3_tensor_dtype(const k3_tensor *t) { return t ? t->dtype : K3_DTYPE_F32; }
k3_device k3_tensor_device(const k3_tensor *t) {
    return t ? t->storage->device : (k3_device){K3_DEVICE_CPU, 0};
}

int64_t k3_tensor_numel(const k3_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->size[i]; /* checked at construction */
    return n;
}

int k3_tensor_is_contiguous(const k3_tensor *t) {
    if (!t) return 0;
    if (k3_tensor_numel(t) == 0) return 1; /* before any product that could overflow */
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->size[i] != 1 && t->stride[i] != expect) return 0;
        expect *= t->size[i];
    }
    return 1;
}

void *k3_tensor_data(const k3_tensor *t) {
    if (!t || !t->storage->data) return NULL;
    return k3_tensor_ptr(t);
}

int64_t k3_tensor_extent(const k3_tensor *t) {
    if (k3_tensor_numel(t) == 0) return 0; /* before any (size-1)*stride: empty views' strides are unchecked */
    int64_t e = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->size[i] == 0) return 0;
        e += (t->size[i] - 1) * t->stride[i];
    }
    return e;
}

bool k3_tensor_overlaps(const k3_tensor *a, const k3_tensor *b) {
    if (a->storage != b->storage) return false;
    int64_t ea = k3_tensor_extent(a), eb = k3_tensor_extent(b);
    if (ea == 0 || eb == 0) return false;
    return a->offset < b->offset + eb && b->offset < a->offset + ea;
}

bool k3_tensor_self_overlaps(const k3_tensor *t) {
    int64_t st[K3_MAX_DIMS], sz[K3_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->size[d] == 0) return false; /* no elements at all */
        if (t->size[d] > 1) {
            st[n] = t->stride[d];
            sz[n++] = t->size[d];
        }
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
            int64_t a = st[j], b = sz[j];
            st[j] = st[j - 1], sz[j] = sz[j - 1];
            st[j - 1] = a, sz[j - 1] = b;
        }
    int64_t span = 0; /* the largest offset the smaller dims reach */
    for (int i = 0; i < n; i++) {
        if (st[i] <= span) return true;
        span += (sz[i] - 1) * st[i];
    }
    return false;
}

static bool same_view(const k3_tensor *a, const k3_tensor *b) {
    if (a->storage != b->storage || a->offset != b->offset || a->ndim != b->ndim ||
        a->dtype != b->dtype)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->size[i] != b->size[i] || a->stride[i] != b->stride[i]) return false;
    return true;
}

static const k3_backend *cuda_for(k3_device d, const char *op) {
    (void)op;
    const char *reason = NULL;
    const k3_backend *b = k3_cuda_backend(&reason);
    if (!b) {
        k3_error(K3_EDEVICE, "%s: device cuda:%d is not available: %s", op, d.index,
                 reason ? reason : "no CUDA backend");
        return NULL;
    }
    if (d.index >= b->device_count) {
        k3_error(K3_EDEVICE, "%s: device cuda:%d does not exist (%d CUDA device%s)", op,
                 d.index, b->device_count, b->device_count == 1 ? "" : "s");
        return NULL;
    }
    return b;
}

/* ---- storage and handles ---------------------------------------------------------------- */

/* k3_memory's device counters and the pressure report (k3_embed.h). */
static uint64_t device_bytes, device_peak, device_allocations; /* __atomic */
static _Thread_local uint64_t t_allocated;
static _Thread_local k3_pressure_fn t_pressure;
static _Thread_local void *t_pressure_ud;

uint64_t k3_take_allocated_bytes(uint64_t at_least) {
    uint64_t n = t_allocated;
    if (n < at_least || n == 0) return 0;
    t_allocated = 0;
    return n;
}

k3_pressure_fn k3_set_pressure_hook(k3_pressure_fn fn, void *ud, void **prev_ud) {
    k3_pressure_fn prev = t_pressure;
    if (prev_ud) *prev_ud = t_pressure_ud;
    t_pressure = fn;
    t_pressure_ud = fn ? ud : NULL;
    return prev;
}

void k3_memory(k3_memory_stats *out) {
    if (!out) return;
    k3_host_memory(&out->host_bytes, &out->host_peak, &out->host_allocations);
    out->device_bytes = __atomic_load_n(&device_bytes, __ATOMIC_ACQUIRE);
    out->device_peak = __atomic_load_n(&device_peak, __ATOMIC_ACQUIRE);
    out->device_allocations = __atomic_load_n(&device_allocations, __ATOMIC_ACQUIRE);
}

void k3_memory_reset_peak(void) {
    k3_host_memory_reset_peak();
    __atomic_store_n(&device_peak, __atomic_load_n(&device_bytes, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
}

void k3_storage_release_memory(k3_storage *s) {
    void *data = __atomic_exchange_n(&s->data, NULL, __ATOMIC_ACQ_REL);
    if (!data) return;
    if (s->device.type == K3_DEVICE_CPU) {
        k3_host_free(data, s->nbytes);
    } else {
        const k3_backend *b = k3_cuda_backend(NULL);
        if (b) b->free(s->device.index, data, s->nbytes);
        __atomic_sub_fetch(&device_bytes, (uint64_t)s->nbytes, __ATOMIC_ACQ_REL);
        __atomic_sub_fetch(&device_allocations, 1, __ATOMIC_ACQ_REL);
    }
}

/* Device storage through the backend; a K3_ENOMEM outside a graph capture gives the thread's
 * pressure hook one chance to free unreachable tensors, then the allocation is retried once. */
static k3_status device_alloc(const k3_backend *b, k3_storage *s) {
    k3_status st = b->alloc(s->device.index, s->nbytes, &s->data);
    if (st == K3_ENOMEM && t_pressure && !k3_graph_capturing() &&
        !(b->capturing && b->capturing(s->device.index))) {
        t_pressure(t_pressure_ud);
        st = b->alloc(s->device.index, s->nbytes, &s->data);
    }
    if (st != K3_OK) return st;
    uint64_t now = __atomic_add_fetch(&device_bytes, (uint64_t)s->nbytes, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&device_allocations, 1, __ATOMIC_ACQ_REL);
    uint64_t peak = __atomic_load_n(&device_peak, __ATOMIC_ACQUIRE);
    while (now > peak && !__atomic_compare_exchange_n(&device_peak, &peak, now, true,
                                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return K3_OK;
}

static void storage_unref(k3_storage *s) {
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
        k3_storage_release_memory(s);
        k3_host_free(s, sizeof *s);
    }
}

static k3_status storage_new(k3_storage **out, size_t nbytes, k3_device device,
                             const char *op) {
    k3_storage *s = k3_host_calloc(1, sizeof *s);
    if (!s) return k3_error(K3_ENOMEM, "%s: out of host memory", op);
    s->refcount = 1;
    s->device = device;
    s->nbytes = nbytes;
    if (device.type == K3_DEVICE_CPU) {
        s->data = k3_host_alloc(nbytes);
        if (!s->data) {
            k3_host_free(s, sizeof *s);
            return k3_error(K3_ENOMEM, "%s: out of host memory allocating %zu bytes", op,
                            nbytes);
        }
    } else {
        const k3_backend *b = cuda_for(device, op);
        k3_status st = b ? device_alloc(b, s) : K3_EDEVICE;
        if (st != K3_OK) {
            k3_host_free(s, sizeof *s);
            return st;
        }
    }
    t_allocated += nbytes;
    *out = s;
    return K3_OK;
}

static k3_status handle_new(k3_tensor **out, k3_storage *s, const char *op) {
    k3_tensor *t = k3_host_calloc(1, sizeof *t);
    if (!t) return k3_error(K3_ENOMEM, "%s: out of host memory", op);
    t->storage = s;
    __atomic_add_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL);
    *out = t;
    return K3_OK;
}

void k3_tensor_free(k3_tensor *t) {
    if (!t) return;
    storage_unref(t->storage);
    k3_host_free(t, sizeof *t);
}

void k3_tensor_release(k3_tensor *t) {
    if (!t) return;
    __atomic_store_n(&t->storage->released, 1, __ATOMIC_RELEASE);
    /* A CUDA graph holding the storage keeps its memory for its replays: it is released when
     * the last such graph is freed (lib/graph.c). */
    if (__atomic_load_n(&t->storage->graph_holds, __ATOMIC_ACQUIRE) == 0)
        k3_storage_release_memory(t->storage);
    k3_tensor_free(t);
}

k3_status k3_tensor_alias(k3_tensor **out, const k3_tensor *t) {
    K3_TRY(handle_new(out, t->storage, "alias"));
    k3_storage *s = (*out)->storage;
    **out = *t;
    (*out)->storage = s;
    return K3_OK;
}

/* Validates a shape (dims numbered from base in messages); *numel gets the element count.
 * shape may be NULL only when ndim is 0. */
static k3_status check_shape(const char *op, int ndim, const int64_t *shape, int64_t *numel,
                             int base) {
    if (ndim < 0 || ndim > K3_MAX_DIMS)
        return k3_error(K3_ESHAPE, "%s: a tensor has 0 to %d dimensions; got %d", op,
                        K3_MAX_DIMS, ndim);
    if (ndim > 0 && !shape) return null_arg(op, "shape");
    int64_t n = 1, span = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return k3_error(K3_ESHAPE, "%s: size of dim %d must be >= 0; got %lld", op,
                            i + base, (long long)shape[i]);
        if (!k3_mul_ok(n, shape[i], &n))
            return k3_error(K3_EOVERFLOW, "%s: element count overflows at dim %d (size %lld)",
                            op, i + base, (long long)shape[i]);
        /* The row-major strides multiply the nonzero sizes; an empty tensor must not make
         * them overflow either. */
        if (!k3_mul_ok(span, shape[i] ? shape[i] : 1, &span))
            return k3_error(K3_EOVERFLOW, "%s: stride computation overflows at dim %d (size %lld)", op,
                            i + base, (long long)shape[i]);
    }
    *numel = n;
    return K3_OK;
}

k3_status k3_tensor_new(k3_tensor **out, int ndim, const int64_t *shape, k3_dtype dtype,
                        k3_device device, const char *op) {
    int base = k3_message_base();
    if (!out) return null_arg(op, "out");
    if ((unsigned)dtype > K3_DTYPE_F64)
        return k3_error(K3_EDTYPE, "%s: invalid dtype %d", op, (int)dtype);
    int64_t numel, nbytes;
    K3_TRY(check_shape(op, ndim, shape, &numel, base));
    K3_TRY(check_device(op, device));
    if (!k3_mul_ok(numel, (int64_t)k3_dtype_size(dtype), &nbytes))
        return k3_error(K3_EOVERFLOW, "%s: byte size of %lld %s elements overflows", op,
                        (long long)numel, k3_dtype_name(dtype));
    k3_storage *s = NULL;
    K3_TRY(storage_new(&s, (size_t)nbytes, device, op));
    k3_tensor *t = k3_host_calloc(1, sizeof *t);
    if (!t) {
        storage_unref(s);
        return k3_error(K3_ENOMEM, "%s: out of host memory", op);
    }
    t->storage = s; /* takes the storage's initial reference */
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t st = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->size[i] = shape[i];
        t->stride[i] = st;
        st *= shape[i] ? shape[i] : 1;
    }
    *out = t;
    return K3_OK;
}

k3_status k3_tensor_empty(k3_tensor **out, int ndim, const int64_t *shape, k3_dtype dtype,
                          k3_device device) {
    return k3_tensor_new(out, ndim, shape, dtype, device, "empty");
}

/* ---- strided row walking (CPU) -------------------------------------------------------------- */

/* k3_walk_rows (k3_impl.h): fn once per innermost row of `shape`, with the element offset of
 * that row's first element in each of the nt views' strides. */
void k3_walk_rows(int ndim, const int64_t *shape, int nt, const int64_t *const *strides,
                  const int64_t *base, k3_row_fn fn, void *ctx) {
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (numel == 0) return;
    int64_t off[4], idx[K3_MAX_DIMS] = {0};
    int64_t n = ndim ? shape[ndim - 1] : 1;
    int outer = ndim - 1;
    for (;;) {
        for (int k = 0; k < nt; k++) {
            off[k] = base[k];
            for (int d = 0; d < outer; d++) off[k] += idx[d] * strides[k][d];
        }
        fn(ctx, off, n);
        int d = outer - 1;
        while (d >= 0) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
            d--;
        }
        if (d < 0) break;
    }
}

typedef struct {
    void *dst;
    const void *src;
    k3_dtype dt, st;
    int64_t dstride, sstride;
} copy_ctx;

static void copy_row(void *c_, const int64_t *off, int64_t n) {
    copy_ctx *c = c_;
    if (c->dt == c->st && c->dstride == 1 && c->sstride == 1) {
        size_t es = k3_dtype_size(c->dt);
        memcpy((char *)c->dst + off[0] * es, (const char *)c->src + off[1] * es, (size_t)n * es);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = k3_load_f64(c->src, c->st, off[1] + i * c->sstride);
        k3_store_f64(c->dst, c->dt, off[0] + i * c->dstride, v);
    }
}

static k3_status copy_cpu(k3_tensor *dst, const k3_tensor *src) {
    copy_ctx c = {dst->storage->data, src->storage->data, dst->dtype, src->dtype,
                  dst->ndim ? dst->stride[dst->ndim - 1] : 1,
                  src->ndim ? src->stride[src->ndim - 1] : 1};
    const int64_t *strides[2] = {dst->stride, src->stride};
    int64_t base[2] = {dst->offset, src->offset};
    k3_walk_rows(dst->ndim, dst->size, 2, strides, base, copy_row, &c);
    return K3_OK;
}

static k3_status check_same_shape(const char *op, const char *an, const k3_tensor *a,
                                  const char *bn, const k3_tensor *b) {
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = a->size[i] == b->size[i];
    if (same) return K3_OK;
    char sa[160], sb[160];
    return k3_error(K3_ESHAPE, "%s: %s shape %s must match %s shape %s", op, bn,
                    k3_fmt_dims(sb, sizeof sb, b->ndim, b->size), an,
                    k3_fmt_dims(sa, sizeof sa, a->ndim, a->size));
}

k3_status k3_tensor_copy(k3_tensor *dst, const k3_tensor *src) {
    int base = k3_message_base();
    K3_TRY(need_tensor("copy", "dst", dst));
    K3_TRY(need_tensor("copy", "src", src));
    K3_TRY(k3_tensor_writable(dst, "copy", "the destination"));
    K3_TRY(check_same_shape("copy", "destination", dst, "source", src));
    /* A view copied onto itself writes each element's own value: nothing changes, whatever
     * its strides. */
    if (k3_tensor_numel(dst) == 0 || same_view(dst, src)) return K3_OK;
    /* Distinct values written to elements that share memory: which one survives would
     * depend on the walk order, so the write is refused (k3.h, "In-place writes"). A
     * broadcast dim keeps its own, more precise message. */
    for (int i = 0; i < dst->ndim; i++)
        if (dst->stride[i] == 0 && dst->size[i] > 1)
            return k3_error(K3_ELAYOUT,
                            "copy: destination dim %d has stride 0 (a broadcast view); "
                            "it cannot be written",
                            i + base);
    if (k3_tensor_self_overlaps(dst)) {
        char b1[160], b2[160];
        return k3_error(K3_ELAYOUT,
                        "copy: destination is written but its elements overlap (shape %s, "
                        "strides %s)",
                        k3_fmt_dims(b1, sizeof b1, dst->ndim, dst->size),
                        k3_fmt_dims(b2, sizeof b2, dst->ndim, dst->stride));
    }
    if (k3_tensor_overlaps(dst, src)) {
        /* Partially overlapping views: go through a temporary so no element is read after
         * it has been overwritten. */
        k3_tensor *tmp;
        K3_TRY(k3_tensor_to(&tmp, src, src->storage->device, src->dtype));
        k3_status s = k3_tensor_copy(dst, tmp);
        k3_tensor_free(tmp);
        return s;
    }
    k3_device dd = dst->storage->device, sd = src->storage->device;
    if (k3_graph_capturing()) {
        if (dd.type == K3_DEVICE_CPU && sd.type == K3_DEVICE_CPU)
            return k3_graph_refuse("copy", "a copy between CPU tensors");
        if (dd.type == K3_DEVICE_CPU || sd.type == K3_DEVICE_CPU)
            return k3_graph_refuse("copy", "a copy to or from the host (a host synchronisation)");
        if (dd.index != sd.index) return k3_graph_refuse("copy", "a copy between two devices");
        K3_TRY(k3_graph_note(dst));
        K3_TRY(k3_graph_note(src));
    }
    if (dd.type == K3_DEVICE_CPU && sd.type == K3_DEVICE_CPU) return copy_cpu(dst, src);
    const k3_backend *b = cuda_for(dd.type == K3_DEVICE_CUDA ? dd : sd, "copy");
    if (!b) return K3_EDEVICE;
    if (dd.type == K3_DEVICE_CUDA && sd.type == K3_DEVICE_CUDA && dd.index >= b->device_count)
        return k3_error(K3_EDEVICE, "copy: device cuda:%d does not exist", dd.index);
    return b->copy(dst, src);
}

k3_status k3_tensor_to(k3_tensor **out, const k3_tensor *t, k3_device device, k3_dtype dtype) {
    if (!out) return null_arg("to", "out");
    K3_TRY(need_tensor("to", "t", t));
    k3_tensor *r;
    K3_TRY(k3_tensor_new(&r, t->ndim, t->size, dtype, device, "to"));
    k3_status s = k3_tensor_copy(r, t);
    if (s != K3_OK) {
        k3_tensor_free(r);
        return s;
    }
    *out = r;
    return K3_OK;
}

/* ---- fill and creation ------------------------------------------------------------------------ */

typedef struct {
    void *data;
    k3_dtype dt;
    int64_t stride;
    double v;
} fill_ctx;

static void fill_row(void *c_, const int64_t *off, int64_t n) {
    fill_ctx *c = c_;
    for (int64_t i = 0; i < n; i++) k3_store_f64(c->data, c->dt, off[0] + i * c->stride, c->v);
}

k3_status k3_tensor_fill(k3_tensor *t_in, double value) {
    K3_TRY(need_tensor("fill", "t", t_in));
    K3_TRY(k3_tensor_writable(t_in, "fill", "the tensor"));
    if (k3_tensor_numel(t_in) == 0) return K3_OK;
    /* A broadcast dim (stride 0) writes the same elements again for each of its indices:
     * filled once, so k3.ones({1}):expand({2^40}):fill(1) costs one store, not 2^40. */
    k3_tensor view = *t_in, *t = &view;
    for (int d = 0; d < t->ndim; d++)
        if (t->stride[d] == 0) t->size[d] = 1;
    if (k3_graph_capturing()) {
        if (t->storage->device.type == K3_DEVICE_CPU)
            return k3_graph_refuse("fill", "a fill of a CPU tensor");
        K3_TRY(k3_graph_note(t));
    }
    if (t->storage->device.type == K3_DEVICE_CUDA) {
        const k3_backend *b = cuda_for(t->storage->device, "fill");
        return b ? b->fill(t, value) : K3_EDEVICE;
    }
    fill_ctx c = {t->storage->data, t->dtype, t->ndim ? t->stride[t->ndim - 1] : 1, value};
    const int64_t *strides[1] = {t->stride};
    int64_t base[1] = {t->offset};
    k3_walk_rows(t->ndim, t->size, 1, strides, base, fill_row, &c);
    return K3_OK;
}

k3_status k3_tensor_full(k3_tensor **out, int ndim, const int64_t *shape, k3_dtype dtype,
                         k3_device device, double value) {
    if (!out) return null_arg("full", "out");
    k3_tensor *t;
    K3_TRY(k3_tensor_new(&t, ndim, shape, dtype, device, "full"));
    k3_status s = k3_tensor_fill(t, value);
    if (s != K3_OK) {
        k3_tensor_free(t);
        return s;
    }
    *out = t;
    return K3_OK;
}

/* ---- generated values on the host, in parallel ------------------------------------------ */

/* Host threads that fill a generated tensor (randn, from_f64) of at least kGenParallelMin
 * elements: K3_HOST_THREADS (a whole number >= 1; 1 keeps the work on the calling thread),
 * else the online CPUs; at most kGenMaxThreads. Read once; another value is reported once
 * (k3_config_warn) and the online CPUs are used. Element i's value depends only on i, so the
 * result does not depend on the count. */
enum { kGenParallelMin = 1 << 20, kGenMaxThreads = 64 };
static pthread_once_t g_gen_once = PTHREAD_ONCE_INIT;
static atomic_int g_gen_threads; /* 0 until read or set */

static void read_gen_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("K3_HOST_THREADS");
    if (env) {
        while (isspace((unsigned char)*env)) env++;
        if (*env) {
            char *end;
            long v = strtol(env, &end, 10);
            while (isspace((unsigned char)*end)) end++;
            if (*end == '\0' && v >= 1 && v <= kGenMaxThreads)
                n = v;
            else if (*end == '\0' && v > kGenMaxThreads) {
                k3_config_warn("K3_HOST_THREADS: %ld is more than the %d threads k3 runs; %d are "
                               "used",
                               v, kGenMaxThreads, kGenMaxThreads);
                n = kGenMaxThreads;
            } else
                k3_config_warn("K3_HOST_THREADS: unrecognised value '%.100s' (expected a whole "
                               "number >= 1); the online CPUs (%ld) are used",
                               env, n);
        }
    }
    int expected = 0;
    atomic_compare_exchange_strong(&g_gen_threads, &expected,
                                   n < 1 ? 1 : n > kGenMaxThreads ? kGenMaxThreads : (int)n);
}

int k3_host_threads(void) {
    pthread_once(&g_gen_once, read_gen_threads);
    return atomic_load(&g_gen_threads);
}

k3_status k3_set_host_threads(int n) {
    if (n < 1 || n > kGenMaxThreads)
        return k3_error(K3_EINVAL, "set_host_threads: n must be 1..%d; got %d", kGenMaxThreads, n);
    pthread_once(&g_gen_once, read_gen_threads);
    atomic_store(&g_gen_threads, n);
    return K3_OK;
}

typedef struct gen_job {
    void *data;
    k3_dtype dtype;
    int64_t begin, end;
    double (*gen)(const void *ud, int64_t i);
    const void *ud;
} gen_job;

static void gen_range(const gen_job *j) {
    for (int64_t i = j->begin; i < j->end; i++) k3_store_f64(j->data, j->dtype, i, j->gen(j->ud, i));
}
static void *gen_thread(void *arg) {
    gen_range((const gen_job *)arg);
    return NULL;
}

/* Elements 0..numel-1 of data = gen(ud, i) in dtype: on the calling thread below
 * kGenParallelMin elements or with one host thread, else in equal ranges over the host
 * threads (a range whose thread cannot start runs on the calling thread). Never fails. */
static void generate_values(void *data, k3_dtype dtype, int64_t numel,
                            double (*gen)(const void *ud, int64_t i), const void *ud) {
    int nt = k3_host_threads();
    if (numel < kGenParallelMin || nt <= 1) {
        gen_job j = {data, dtype, 0, numel, gen, ud};
        gen_range(&j);
        return;
    }
    if ((int64_t)nt > numel / (kGenParallelMin / 4)) nt = (int)(numel / (kGenParallelMin / 4));
    gen_job jobs[kGenMaxThreads];
    pthread_t tids[kGenMaxThreads];
    int started[kGenMaxThreads];
    for (int t = 0; t < nt; t++) {
        const int64_t q = numel / nt, r = numel % nt;
        const int64_t b = t * q + (t < r ? t : r);
        jobs[t] = (gen_job){data, dtype, b, b + q + (t < r ? 1 : 0), gen, ud};
        started[t] = t > 0 && pthread_create(&tids[t], NULL, gen_thread, &jobs[t]) == 0;
    }
    gen_range(&jobs[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(tids[t], NULL);
        else
            gen_range(&jobs[t]);
    }
}

/* Makes the result on its device, fills a CPU tensor with gen(i) for each row-major i and
 * copies it there. `ud_name` (non-NULL) names ud, which must then be non-NULL unless the
 * tensor is empty. Every argument error is reported under op's name before anything is
 * generated. */
static k3_status tensor_generate(k3_tensor **out, int ndim, const int64_t *shape,
                                 k3_dtype dtype, k3_device device, const char *op,
                                 double (*gen)(const void *ud, int64_t i), const void *ud,
                                 const char *ud_name) {
    if (!out) return null_arg(op, "out");
    /* k3_tensor_new's order (out, dtype, shape, device), with the values after the shape. */
    if ((unsigned)dtype > K3_DTYPE_F64)
        return k3_error(K3_EDTYPE, "%s: invalid dtype %d", op, (int)dtype);
    int64_t numel;
    K3_TRY(check_shape(op, ndim, shape, &numel, k3_message_base()));
    if (ud_name && !ud && numel > 0) return null_arg(op, ud_name);
    k3_tensor *r, *h;
    K3_TRY(k3_tensor_new(&r, ndim, shape, dtype, device, op));
    if (device.type == K3_DEVICE_CPU) {
        h = r;
    } else {
        k3_status s = k3_tensor_new(&h, ndim, shape, dtype, (k3_device){K3_DEVICE_CPU, 0}, op);
        if (s != K3_OK) {
            k3_tensor_free(r);
            return s;
        }
    }
    generate_values(h->storage->data, dtype, numel, gen, ud);
    if (h != r) {
        k3_status s = k3_tensor_copy(r, h);
        k3_tensor_free(h);
        if (s != K3_OK) {
            k3_tensor_free(r);
            return s;
        }
    }
    *out = r;
    return K3_OK;
}

static double gen_randn(const void *ud, int64_t i) {
    return k3_randn_at(*(const uint64_t *)ud, (uint64_t)i);
}
static double gen_values(const void *ud, int64_t i) { return ((const double *)ud)[i]; }

k3_status k3_tensor_randn(k3_tensor **out, int ndim, const int64_t *shape, k3_dtype dtype,
                          k3_device device, uint64_t seed) {
    return tensor_generate(out, ndim, shape, dtype, device, "randn", gen_randn, &seed, NULL);
}

k3_status k3_tensor_from_f64(k3_tensor **out, int ndim, const int64_t *shape, k3_dtype dtype,
                             k3_device device, const double *values) {
    return tensor_generate(out, ndim, shape, dtype, device, "from_f64", gen_values, values,
                           "values");
}

/* ---- views ------------------------------------------------------------------------------------ */

/* A dim argument d of t, numbered from base in the message. */
static k3_status check_dim(const char *op, const k3_tensor *t, int d, const char *arg,
                           int base) {
    if (d >= 0 && d < t->ndim) return K3_OK;
    if (t->ndim == 0)
        return k3_error(K3_ESHAPE, "%s: %s %lld is out of range: the tensor has 0 dims", op,
                        arg, (long long)d + base);
    return k3_error(K3_ESHAPE, "%s: %s must be in %d..%d for a %d-dim tensor; got %lld", op, arg,
                    base, t->ndim - 1 + base, t->ndim, (long long)d + base);
}

k3_status k3_tensor_narrow(k3_tensor **out, const k3_tensor *t, int d, int64_t start,
                                int64_t length) {
    int base = k3_message_base();
    if (!out) return null_arg("narrow", "out");
    K3_TRY(need_tensor("narrow", "t", t));
    K3_TRY(check_dim("narrow", t, d, "dim", base));
    int64_t end;
    if (start < 0 || length < 0 || !k3_add_ok(start, length, &end) || end > t->size[d])
        return k3_error(K3_ESHAPE,
                        "narrow: start %lld and length %lld out of range for dim %d of size "
                        "%lld",
                        k3_based(start, base), (long long)length, d + base,
                        (long long)t->size[d]);
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    r->size[d] = length;
    if (k3_tensor_numel(r) > 0) r->offset += start * t->stride[d]; /* empty views' strides are unchecked */
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_select(k3_tensor **out, const k3_tensor *t, int d, int64_t i) {
    int base = k3_message_base();
    if (!out) return null_arg("select", "out");
    K3_TRY(need_tensor("select", "t", t));
    K3_TRY(check_dim("select", t, d, "dim", base));
    if (i < 0 || i >= t->size[d])
        return k3_error(K3_ESHAPE, "select: index %lld out of range for dim %d of size %lld",
                        k3_based(i, base), d + base, (long long)t->size[d]);
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    if (k3_tensor_numel(t) > 0) r->offset += i * t->stride[d]; /* empty views' strides are unchecked */
    for (int k = d; k < t->ndim - 1; k++) {
        r->size[k] = t->size[k + 1];
        r->stride[k] = t->stride[k + 1];
    }
    r->ndim = t->ndim - 1;
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_transpose(k3_tensor **out, const k3_tensor *t, int d1, int d2) {
    int base = k3_message_base();
    if (!out) return null_arg("transpose", "out");
    K3_TRY(need_tensor("transpose", "t", t));
    K3_TRY(check_dim("transpose", t, d1, "d1", base));
    K3_TRY(check_dim("transpose", t, d2, "d2", base));
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    r->size[d1] = t->size[d2];
    r->size[d2] = t->size[d1];
    r->stride[d1] = t->stride[d2];
    r->stride[d2] = t->stride[d1];
    *out = r;
    return K3_OK;
}

/* A target shape for view or reshape: at most one size -1 (inferred from t's element count),
 * the others >= 0, the same element count as t; sh gets the shape with -1 resolved. */
static k3_status resolve_shape(const char *op, const k3_tensor *t, int ndim, const int64_t *shape,
                               int64_t *sh, int base) {
    if (ndim < 0 || ndim > K3_MAX_DIMS)
        return k3_error(K3_ESHAPE, "%s: a tensor has 0 to %d dimensions; got %d", op, K3_MAX_DIMS,
                        ndim);
    if (ndim > 0 && !shape) return null_arg(op, "shape");
    int64_t known = 1, numel = k3_tensor_numel(t);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0)
                return k3_error(K3_ESHAPE, "%s: only one size may be -1 (dims %d and %d)", op,
                                infer + base, i + base);
            infer = i;
        } else if (shape[i] < 0) {
            return k3_error(K3_ESHAPE, "%s: size of dim %d must be >= 0 or -1; got %lld", op,
                            i + base, (long long)shape[i]);
        } else if (!k3_mul_ok(known, shape[i], &known)) {
            return k3_error(K3_EOVERFLOW, "%s: element count overflows at dim %d", op, i + base);
        }
    }
    char b1[160];
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return k3_error(K3_ESHAPE, "%s: cannot infer dim %d: %lld elements over %lld", op,
                            infer + base, (long long)numel, (long long)known);
        sh[infer] = numel / known;
        known = numel;
    }
    if (known != numel)
        return k3_error(K3_ESHAPE, "%s: shape %s has %lld elements; tensor has %lld", op,
                        k3_fmt_dims(b1, sizeof b1, ndim, sh), (long long)known,
                        (long long)numel);
    int64_t checked;
    return check_shape(op, ndim, sh, &checked, base);
}

/* Row-major strides of shape into st. */
static void contiguous_strides(int ndim, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i] ? shape[i] : 1;
    }
}

/* Strides that show t's elements, in row-major order, in shape sh (same element count), or
 * false when t's strides allow none. The rule is the one PyTorch's view applies: t's dims are
 * cut into chunks of dims that are contiguous with one another (stride[d] == size[d+1] *
 * stride[d+1], size-1 dims ignored); the new shape must split or merge dims only inside a
 * chunk, and each new dim inside a chunk gets the chunk's innermost stride times the sizes to
 * its right. No product overflows: each is at most the stride of a dim of the non-empty view,
 * whose extent was checked when it was made. */
static bool view_strides(const k3_tensor *t, int ndim, const int64_t *sh, int64_t *st) {
    if (k3_tensor_numel(t) == 0 || t->ndim == 0) {
        contiguous_strides(ndim, sh, st);
        return true;
    }
    int v = ndim - 1;
    int64_t base_stride = t->stride[t->ndim - 1], chunk = 1, seen = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        chunk *= t->size[d];
        bool chunk_ends = d == 0 || (t->size[d - 1] != 1 &&
                                     t->stride[d - 1] != chunk * base_stride);
        if (!chunk_ends) continue;
        while (v >= 0 && (seen < chunk || sh[v] == 1)) {
            st[v] = seen * base_stride;
            seen *= sh[v];
            v--;
        }
        if (seen != chunk) return false;
        if (d > 0) {
            base_stride = t->stride[d - 1];
            chunk = seen = 1;
        }
    }
    return v == -1;
}

k3_status k3_tensor_view(k3_tensor **out, const k3_tensor *t, int ndim,
                              const int64_t *shape) {
    int base = k3_message_base();
    if (!out) return null_arg("view", "out");
    K3_TRY(need_tensor("view", "t", t));
    if (ndim < 0 || ndim > K3_MAX_DIMS)
        return k3_error(K3_ESHAPE, "view: a tensor has 0 to %d dimensions; got %d", K3_MAX_DIMS,
                        ndim);
    char b1[160], b2[160];
    if (!k3_tensor_is_contiguous(t))
        return k3_error(K3_ELAYOUT,
                        "view: tensor is not contiguous (shape %s, strides %s); call "
                        "contiguous() first",
                        k3_fmt_dims(b1, sizeof b1, t->ndim, t->size),
                        k3_fmt_dims(b2, sizeof b2, t->ndim, t->stride));
    int64_t sh[K3_MAX_DIMS];
    K3_TRY(resolve_shape("view", t, ndim, shape, sh, base));
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    r->ndim = ndim;
    memcpy(r->size, sh, sizeof(int64_t) * (size_t)ndim);
    contiguous_strides(ndim, sh, r->stride);
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_reshape(k3_tensor **out, const k3_tensor *t, int ndim, const int64_t *shape) {
    int base = k3_message_base();
    if (!out) return null_arg("reshape", "out");
    K3_TRY(need_tensor("reshape", "t", t));
    int64_t sh[K3_MAX_DIMS], st[K3_MAX_DIMS];
    K3_TRY(resolve_shape("reshape", t, ndim, shape, sh, base));
    k3_tensor *r;
    if (view_strides(t, ndim, sh, st)) {
        K3_TRY(k3_tensor_alias(&r, t));
    } else {
        /* A contiguous copy in t's own shape (copy needs equal shapes), then given the new
         * shape: a fresh handle nothing else sees yet. */
        K3_TRY(k3_tensor_new(&r, t->ndim, t->size, t->dtype, t->storage->device, "reshape"));
        k3_status s = k3_tensor_copy(r, t);
        if (s != K3_OK) {
            k3_tensor_free(r);
            return s;
        }
        contiguous_strides(ndim, sh, st);
    }
    r->ndim = ndim;
    memcpy(r->size, sh, sizeof(int64_t) * (size_t)ndim);
    memcpy(r->stride, st, sizeof(int64_t) * (size_t)ndim);
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_permute(k3_tensor **out, const k3_tensor *t, int ndim, const int *dims) {
    int base = k3_message_base();
    if (!out) return null_arg("permute", "out");
    K3_TRY(need_tensor("permute", "t", t));
    if (ndim != t->ndim)
        return k3_error(K3_ESHAPE, "permute: expected %d dims for a %d-dim tensor; got %d",
                        t->ndim, t->ndim, ndim);
    if (ndim > 0 && !dims) return null_arg("permute", "dims");
    int used[K3_MAX_DIMS] = {0};
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 0 || dims[i] >= ndim)
            return k3_error(K3_ESHAPE, "permute: dim %lld at position %d is out of range %d..%d",
                            (long long)dims[i] + base, i + base, base, ndim - 1 + base);
        if (used[dims[i]])
            return k3_error(K3_ESHAPE, "permute: dim %d appears twice (positions %d and %d)",
                            dims[i] + base, used[dims[i]] - 1 + base, i + base);
        used[dims[i]] = i + 1;
    }
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    for (int i = 0; i < ndim; i++) {
        r->size[i] = t->size[dims[i]];
        r->stride[i] = t->stride[dims[i]];
    }
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_squeeze(k3_tensor **out, const k3_tensor *t, int d) {
    int base = k3_message_base();
    if (!out) return null_arg("squeeze", "out");
    K3_TRY(need_tensor("squeeze", "t", t));
    if (d != -1) K3_TRY(check_dim("squeeze", t, d, "dim", base));
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->size[i] == 1 && (d == -1 || d == i)) continue;
        r->size[n] = t->size[i];
        r->stride[n] = t->stride[i];
        n++;
    }
    r->ndim = n;
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_unsqueeze(k3_tensor **out, const k3_tensor *t, int d) {
    int base = k3_message_base();
    if (!out) return null_arg("unsqueeze", "out");
    K3_TRY(need_tensor("unsqueeze", "t", t));
    if (t->ndim == K3_MAX_DIMS)
        return k3_error(K3_ESHAPE, "unsqueeze: the tensor has %d dims already (the most a "
                        "tensor has)", K3_MAX_DIMS);
    if (d < 0 || d > t->ndim)
        return k3_error(K3_ESHAPE, "unsqueeze: dim must be in %d..%d for a %d-dim tensor; got %lld",
                        base, t->ndim + base, t->ndim, (long long)d + base);
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    for (int i = t->ndim; i > d; i--) {
        r->size[i] = t->size[i - 1];
        r->stride[i] = t->stride[i - 1];
    }
    /* The new dim steps over the dims after it, as a contiguous tensor's would (PyTorch's
     * choice); with size 1 its stride is never used to reach an element. */
    int64_t st = 1;
    if (d < t->ndim && !k3_mul_ok(t->size[d], t->stride[d], &st)) st = 1; /* an empty view's */
    r->size[d] = 1;
    r->stride[d] = st;
    r->ndim = t->ndim + 1;
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_expand(k3_tensor **out, const k3_tensor *t, int ndim,
                                const int64_t *shape) {
    int base = k3_message_base();
    if (!out) return null_arg("expand", "out");
    K3_TRY(need_tensor("expand", "t", t));
    if (ndim > 0 && !shape) return null_arg("expand", "shape");
    char b1[160], b2[160];
    if (ndim < t->ndim || ndim > K3_MAX_DIMS)
        return k3_error(K3_ESHAPE, "expand: shape %s has fewer dims than the tensor (%d) or "
                        "more than %d",
                        k3_fmt_dims(b1, sizeof b1, ndim, shape), t->ndim, K3_MAX_DIMS);
    int64_t sh[K3_MAX_DIMS], st[K3_MAX_DIMS], numel = 1;
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t want = shape[i];
        if (j < 0) {
            if (want < 0)
                return k3_error(K3_ESHAPE, "expand: size of new dim %d must be >= 0; got %lld",
                                i + base, (long long)want);
            sh[i] = want;
            st[i] = 0;
        } else if (want == -1 || want == t->size[j]) {
            sh[i] = t->size[j];
            st[i] = t->stride[j];
        } else if (t->size[j] == 1 && want >= 0) {
            sh[i] = want;
            st[i] = 0;
        } else {
            return k3_error(K3_ESHAPE,
                            "expand: dim %d of size %lld cannot expand to %lld (tensor shape "
                            "%s, target %s)",
                            j + base, (long long)t->size[j], (long long)want,
                            k3_fmt_dims(b1, sizeof b1, t->ndim, t->size),
                            k3_fmt_dims(b2, sizeof b2, ndim, shape));
        }
        if (!k3_mul_ok(numel, sh[i], &numel))
            return k3_error(K3_EOVERFLOW, "expand: element count overflows at dim %d", i + base);
    }
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    r->ndim = ndim;
    memcpy(r->size, sh, sizeof(int64_t) * (size_t)ndim);
    memcpy(r->stride, st, sizeof(int64_t) * (size_t)ndim);
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_as_strided(k3_tensor **out, const k3_tensor *t, int ndim,
                                    const int64_t *shape, const int64_t *stride, int64_t offset) {
    int base = k3_message_base();
    if (!out) return null_arg("as_strided", "out");
    K3_TRY(need_tensor("as_strided", "t", t));
    int64_t numel;
    K3_TRY(check_shape("as_strided", ndim, shape, &numel, base));
    if (ndim > 0 && !stride) return null_arg("as_strided", "stride");
    if (offset < 0)
        return k3_error(K3_ESHAPE, "as_strided: offset must be >= 0; got %lld", (long long)offset);
    int64_t last = offset, cap = (int64_t)(t->storage->nbytes / k3_dtype_size(t->dtype));
    for (int i = 0; i < ndim; i++) {
        int64_t step;
        if (stride[i] < 0)
            return k3_error(K3_ELAYOUT, "as_strided: stride of dim %d must be >= 0; got %lld",
                            i + base, (long long)stride[i]);
        if (numel == 0) continue;
        if (!k3_mul_ok(shape[i] - 1, stride[i], &step) || !k3_add_ok(last, step, &last))
            return k3_error(K3_EOVERFLOW, "as_strided: extent overflows at dim %d", i + base);
    }
    if (numel > 0 && last >= cap)
        return k3_error(K3_ESHAPE,
                        "as_strided: view reaches element %lld but the storage holds %lld",
                        (long long)last, (long long)cap);
    k3_tensor *r;
    K3_TRY(k3_tensor_alias(&r, t));
    r->ndim = ndim;
    if (ndim > 0) {
        memcpy(r->size, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(r->stride, stride, sizeof(int64_t) * (size_t)ndim);
    }
    r->offset = offset;
    *out = r;
    return K3_OK;
}

/* ---- element access ----------------------------------------------------------------------------- */

static k3_status element_offset(const char *op, const k3_tensor *t, const int64_t *idx,
                                int64_t *off, int base) {
    if (t->ndim > 0 && !idx) return null_arg(op, "idx");
    /* Every index is checked before any product is formed: an empty view may carry strides
     * whose products overflow (its extent was never needed), and an in-range index implies a
     * non-empty view, whose extent was checked to fit its storage when it was made. */
    for (int d = 0; d < t->ndim; d++)
        if (idx[d] < 0 || idx[d] >= t->size[d])
            return k3_error(K3_ESHAPE, "%s: index %lld out of range for dim %d of size %lld", op,
                            k3_based(idx[d], base), d + base, (long long)t->size[d]);
    int64_t o = t->offset;
    for (int d = 0; d < t->ndim; d++) o += idx[d] * t->stride[d];
    *off = o;
    return K3_OK;
}

/* A one-element view of t at storage offset off (for device element access). */
static k3_status element_view(k3_tensor **out, const k3_tensor *t, int64_t off) {
    K3_TRY(k3_tensor_alias(out, t));
    (*out)->ndim = 0;
    (*out)->offset = off;
    return K3_OK;
}

k3_status k3_tensor_get(const k3_tensor *t, const int64_t *idx, double *out) {
    int base = k3_message_base();
    K3_TRY(need_tensor("get", "t", t));
    int64_t off;
    K3_TRY(element_offset("get", t, idx, &off, base));
    if (!out) return null_arg("get", "out");
    if (t->storage->device.type == K3_DEVICE_CPU) {
        *out = k3_load_f64(t->storage->data, t->dtype, off);
        return K3_OK;
    }
    K3_TRY(k3_graph_refuse("get", "an element read (a host synchronisation)"));
    k3_tensor *v, *h;
    K3_TRY(element_view(&v, t, off));
    k3_status s = k3_tensor_to(&h, v, (k3_device){K3_DEVICE_CPU, 0}, K3_DTYPE_F64);
    k3_tensor_free(v);
    if (s != K3_OK) return s;
    *out = *(double *)h->storage->data;
    k3_tensor_free(h);
    return K3_OK;
}

k3_status k3_tensor_set(k3_tensor *t, const int64_t *idx, double value) {
    int base = k3_message_base();
    K3_TRY(need_tensor("set", "t", t));
    K3_TRY(k3_tensor_writable(t, "set", "the tensor"));
    int64_t off;
    K3_TRY(element_offset("set", t, idx, &off, base));
    if (t->storage->device.type == K3_DEVICE_CPU) {
        k3_store_f64(t->storage->data, t->dtype, off, value);
        return K3_OK;
    }
    k3_tensor *v;
    K3_TRY(element_view(&v, t, off));
    k3_status s = k3_tensor_fill(v, value);
    k3_tensor_free(v);
    return s;
}

/* Row-major f64 copy of any tensor (any device) into out[numel]. */
k3_status k3_tensor_to_f64(const k3_tensor *t, double *out) {
    K3_TRY(need_tensor("to_f64", "t", t));
    int64_t n = k3_tensor_numel(t);
    if (n == 0) return K3_OK;
    if (!out) return null_arg("to_f64", "out");
    K3_TRY(k3_graph_refuse("to_f64", "a read back to the host (a host synchronisation)"));
    k3_tensor *h;
    K3_TRY(k3_tensor_to(&h, t, (k3_device){K3_DEVICE_CPU, 0}, K3_DTYPE_F64));
    memcpy(out, h->storage->data, (size_t)n * sizeof(double));
    k3_tensor_free(h);
    return K3_OK;
}

/* ---- elementwise arithmetic ------------------------------------------------------------------------ */

typedef struct {
    void *o;
    const void *a, *b;
    k3_dtype dt;
    int64_t as, bs;
    k3_binop op;
    double s;
    int mode; /* 0: a op b, 1: a op s, 2: s op a */
} bin_ctx;

static inline double apply_op(k3_binop op, double x, double y) {
    return op == K3_ADD ? x + y : op == K3_SUB ? x - y : op == K3_MUL ? x * y : x / y;
}
static inline float apply_opf(k3_binop op, float x, float y) {
    return op == K3_ADD ? x + y : op == K3_SUB ? x - y : op == K3_MUL ? x * y : x / y;
}

/* x op y rounded to odd at double precision: the exact result if a double holds it, else
 * whichever of the two doubles around it has an odd significand. Rounding that once more to
 * f32, f16 or bf16 (at most 24 bits, well under 53 - 2) gives the exact result rounded once
 * to nearest even, which rounding the nearest double could not (it may land on a tie of the
 * narrower format). The error of the double result is exact: TwoSum for + and -, an fma
 * for *. Below 2^-969 the product's error is not exact, but such results round to zero in
 * every narrower dtype whichever double is kept. kernels/copy.cu does the same on the GPU. */
static double apply_op_odd(k3_binop op, double x, double y) {
    double r, e;
    if (op == K3_MUL) {
        r = x * y;
        e = fma(x, y, -r);
    } else if (op == K3_DIV) {
        /* The remainder x - r y is exact (fma); the exact quotient lies on its side of r
         * when y > 0. A quotient that underflows to 0 or below 2^-1022 has no exact remainder,
         * but rounds to zero in every narrower dtype either way. */
        r = x / y;
        e = fma(-r, y, x);
        if (y < 0) e = -e;
        if (r == 0 || !isfinite(e)) e = 0;
    } else {
        double yy = op == K3_SUB ? -y : y;
        r = x + yy;
        double yv = r - x, xv = r - yv;
        e = (x - xv) + (yy - yv);
    }
    /* Neighbouring doubles of one sign differ by one in their bit patterns (sign-magnitude),
     * so when r is even and inexact, the other double around the exact result, one step
     * toward e, has the odd significand. It is finite: the largest double is odd, so it is
     * never stepped from; and an inexact r is never 0 (a sum that rounds to 0 is exact, and
     * a product that underflows to 0 gives e = 0 too). Branch-free: half the elements take
     * the step, at random. */
    uint64_t u;
    memcpy(&u, &r, sizeof u);
    uint64_t step = (uint64_t)(e != 0 && isfinite(r)) & ~u & 1;
    uint64_t away = (uint64_t)((e > 0) == (r > 0)); /* 1: away from zero, 0: toward it */
    u += step * (away * 2 - 1);
    memcpy(&r, &u, sizeof r);
    return r;
}

static void bin_row(void *c_, const int64_t *off, int64_t n) {
    bin_ctx *c = c_;
    for (int64_t i = 0; i < n; i++) {
        int64_t ia = off[1] + i * c->as, ib = off[2] + i * c->bs, io = off[0] + i;
        if (c->mode != 0) {
            /* A scalar is a double: computed in double (f64) or rounded to odd (narrower
             * dtypes), then rounded once to the dtype (DESIGN.md). Rounding the scalar to
             * f32 first would round twice. */
            double x = k3_load_f64(c->a, c->dt, ia);
            double l = c->mode == 2 ? c->s : x, r = c->mode == 2 ? x : c->s;
            k3_store_f64(c->o, c->dt, io,
                         c->dt == K3_DTYPE_F64 ? apply_op(c->op, l, r)
                                               : apply_op_odd(c->op, l, r));
        } else if (c->dt == K3_DTYPE_F64) {
            double x = k3_load_f64(c->a, c->dt, ia);
            double y = k3_load_f64(c->b, c->dt, ib);
            k3_store_f64(c->o, c->dt, io, apply_op(c->op, x, y));
        } else {
            /* Two operands of at most p = 11 bits (bf16, f16) or 24 (f32): their sum,
             * difference, product or quotient rounded to f32 (24 >= 2p + 2 bits) and then to
             * the dtype equals the exact result rounded once (Figueroa, "When is double
             * rounding innocuous?", 1995), so fp32 arithmetic is exact here. */
            float x = k3_load_f32(c->a, c->dt, ia);
            float y = k3_load_f32(c->b, c->dt, ib);
            k3_store_f32(c->o, c->dt, io, apply_opf(c->op, x, y));
        }
    }
}

/* fname: the public function ("binary", "binary_scalar") for NULL arguments; the op's own
 * name ("add", ...) for everything about the values. */
static k3_status binary_impl(const char *fname, k3_tensor **out, k3_binop op,
                             const k3_tensor *a, const k3_tensor *b, double s,
                             int scalar_first) {
    static const char *const names[] = {"add", "sub", "mul", "div"};
    if (!out) return null_arg(fname, "out");
    if ((unsigned)op > K3_DIV)
        return k3_error(K3_EINVAL, "%s: invalid op %d", fname, (int)op);
    const char *name = names[op];
    K3_TRY(need_tensor(fname, "a", a));
    if (b) {
        K3_TRY(k3_tensor_check(b, "b"));
        K3_TRY(check_same_shape(name, "left operand", a, "right operand", b));
        if (a->dtype != b->dtype)
            return k3_error(K3_EDTYPE, "%s: dtypes differ (%s and %s); convert with to()", name,
                            k3_dtype_name(a->dtype), k3_dtype_name(b->dtype));
        k3_device da = a->storage->device, db = b->storage->device;
        if (da.type != db.type || da.index != db.index) {
            char x[16], y[16];
            return k3_error(K3_EDEVICE, "%s: devices differ (%s and %s)", name,
                            k3_device_name(da, x, sizeof x), k3_device_name(db, y, sizeof y));
        }
    }
    if (k3_graph_capturing() && a->storage->device.type == K3_DEVICE_CPU)
        return k3_graph_refuse(name, "arithmetic on CPU tensors");
    k3_tensor *r;
    K3_TRY(k3_tensor_new(&r, a->ndim, a->size, a->dtype, a->storage->device, name));
    k3_status st = k3_graph_note(a);
    if (st == K3_OK) st = k3_graph_note(b);
    if (st == K3_OK) st = k3_graph_note(r);
    if (st == K3_OK && k3_tensor_numel(r) > 0) {
        if (a->storage->device.type == K3_DEVICE_CUDA) {
            const k3_backend *be = cuda_for(a->storage->device, name);
            st = be ? be->binary(r, op, a, b, s, scalar_first) : K3_EDEVICE;
        } else {
            int last = a->ndim - 1;
            bin_ctx c = {r->storage->data, a->storage->data, b ? b->storage->data : NULL,
                         a->dtype, last >= 0 ? a->stride[last] : 1,
                         (b && last >= 0) ? b->stride[last] : 1, op, s,
                         b ? 0 : (scalar_first ? 2 : 1)};
            const int64_t *strides[3] = {r->stride, a->stride, b ? b->stride : a->stride};
            int64_t base[3] = {0, a->offset, b ? b->offset : 0};
            k3_walk_rows(a->ndim, a->size, 3, strides, base, bin_row, &c);
        }
    }
    if (st != K3_OK) {
        k3_tensor_free(r);
        return st;
    }
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_binary(k3_tensor **out, k3_binop op, const k3_tensor *a, const k3_tensor *b) {
    if (out && a && !b) return null_arg("binary", "b");
    return binary_impl("binary", out, op, a, b, 0, 0);
}

k3_status k3_tensor_binary_scalar(k3_tensor **out, k3_binop op, const k3_tensor *a, double s,
                                  int scalar_first) {
    return binary_impl("binary_scalar", out, op, a, NULL, s, scalar_first);
}

/* ---- comparisons (f64, on the host) ------------------------------------------------------------------ */

/* Loads a and b as f64 arrays on the host; caller frees with k3_host_free(p, n * 8). */
static k3_status load_pair(const char *op, const k3_tensor *a, const k3_tensor *b, double **pa,
                           double **pb, int64_t *n, const void *out) {
    K3_TRY(need_tensor(op, "a", a));
    K3_TRY(need_tensor(op, "b", b));
    if (!out) return null_arg(op, "out");
    K3_TRY(check_same_shape(op, "a", a, "b", b));
    *n = k3_tensor_numel(a);
    size_t bytes = (size_t)(*n ? *n : 1) * sizeof(double);
    *pa = k3_host_alloc(bytes);
    *pb = k3_host_alloc(bytes);
    k3_status s = (*pa && *pb) ? K3_OK : k3_error(K3_ENOMEM, "%s: out of host memory", op);
    if (s == K3_OK) s = k3_tensor_to_f64(a, *pa);
    if (s == K3_OK) s = k3_tensor_to_f64(b, *pb);
    if (s != K3_OK) {
        k3_host_free(*pa, bytes);
        k3_host_free(*pb, bytes);
    }
    return s;
}

static void free_pair(double *a, double *b, int64_t n) {
    size_t bytes = (size_t)(n ? n : 1) * sizeof(double);
    k3_host_free(a, bytes);
    k3_host_free(b, bytes);
}

k3_status k3_max_abs_diff(const k3_tensor *a, const k3_tensor *b, double *out) {
    double *x, *y;
    int64_t n;
    K3_TRY(load_pair("max_abs_diff", a, b, &x, &y, &n, out));
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(x[i] - y[i]);
        if (isnan(d)) {
            /* Equal infinities compare as 0 difference; anything else NaN is NaN. */
            if (x[i] == y[i]) continue;
            m = NAN;
            break;
        }
        if (d > m) m = d;
    }
    free_pair(x, y, n);
    *out = m;
    return K3_OK;
}

/* An allclose tolerance must be >= 0 (+inf allowed): a negative one makes nothing close, a
 * NaN one makes every comparison false, so either would turn a check into noise. */
static k3_status allclose_tolerance(const char *what, double v) {
    if (v >= 0) return K3_OK; /* false for NaN */
    char b[32];
    return k3_error(K3_EINVAL, "allclose: %s must be a number >= 0; got %s", what,
                    k3_fmt_double(b, sizeof b, v));
}

k3_status k3_allclose(const k3_tensor *a, const k3_tensor *b, double atol, double rtol, int *out) {
    double *x, *y;
    int64_t n;
    K3_TRY(allclose_tolerance("atol", atol));
    K3_TRY(allclose_tolerance("rtol", rtol));
    K3_TRY(load_pair("allclose", a, b, &x, &y, &n, out));
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        if (x[i] == y[i]) continue; /* equal infinities included */
        /* An infinity is close only to itself, whichever side it is on: rtol * |inf| would
         * call every value close to an infinity in b, and a kernel writing inf pass. */
        if (isinf(x[i]) || isinf(y[i]) || !(fabs(x[i] - y[i]) <= atol + rtol * fabs(y[i])))
            ok = 0;
    }
    free_pair(x, y, n);
    *out = ok;
    return K3_OK;
}

k3_status k3_cosine(const k3_tensor *a, const k3_tensor *b, double *out) {
    double *x, *y;
    int64_t n;
    K3_TRY(load_pair("cosine", a, b, &x, &y, &n, out));
    /* Scaled by the largest magnitudes so huge values (1e200) do not overflow the sums. */
    double mx = 0, my = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(x[i]) > mx) mx = fabs(x[i]);
        if (fabs(y[i]) > my) my = fabs(y[i]);
    }
    double sx = (mx > 0 && isfinite(mx)) ? 1 / mx : 1, sy = (my > 0 && isfinite(my)) ? 1 / my : 1;
    double dot = 0, nx = 0, ny = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = x[i] * sx, b = y[i] * sy;
        dot += a * b;
        nx += a * a;
        ny += b * b;
    }
    free_pair(x, y, n);
    /* A zero vector has no direction: its cosine with anything, itself and another zero
     * vector included (and two empty tensors), is undefined, NaN, which fails any check
     * such as cosine >= 0.999 instead of passing it as a 1 would. */
    if (nx == 0 || ny == 0)
        *out = NAN;
    else
        *out = dot / (sqrt(nx) * sqrt(ny));
    return K3_OK;
}

k3_status k3_synchronize(void) {
    K3_TRY(k3_graph_refuse("synchronize", "a host synchronisation"));
    const k3_backend *b = k3_cuda_backend(NULL);
    return b ? b->synchronize() : K3_OK;
}

/* ---- joins, ranges and equality (k3.cat, k3.stack, k3.arange, k3.linspace, k3.equal) --------- */

/* The n tensors of a join: present, live, of ts[0]'s ndim, dtype and device, each size equal
 * to ts[0]'s except in dim `skip` (-1: none). Entries are numbered from the message base. */
static k3_status check_join(const char *op, const k3_tensor *const *ts, int n, int skip) {
    int base = k3_message_base();
    if (!ts) return null_arg(op, "ts");
    if (n < 1) return k3_error(K3_EINVAL, "%s: expected at least one tensor; got %d", op, n);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "tensor %d", i + base);
        K3_TRY(need_tensor(op, what, ts[i]));
        const k3_tensor *t = ts[i], *r = ts[0];
        if (t->ndim != r->ndim)
            return k3_error(K3_ESHAPE, "%s: tensor %d has %d dims; tensor %d has %d", op,
                            i + base, t->ndim, base, r->ndim);
        for (int d = 0; d < t->ndim; d++)
            if (d != skip && t->size[d] != r->size[d])
                return k3_error(K3_ESHAPE,
                                "%s: tensor %d dim %d (%lld) must match tensor %d (%lld)", op,
                                i + base, d + base, (long long)t->size[d], base,
                                (long long)r->size[d]);
        if (t->dtype != r->dtype)
            return k3_error(K3_EDTYPE, "%s: tensor %d dtype (%s) must match tensor %d (%s)", op,
                            i + base, k3_dtype_name(t->dtype), base, k3_dtype_name(r->dtype));
        k3_device dt = t->storage->device, dr = r->storage->device;
        if (dt.type != dr.type || dt.index != dr.index) {
            char x[16], y[16];
            return k3_error(K3_EDEVICE, "%s: tensor %d device (%s) must match tensor %d (%s)",
                            op, i + base, k3_device_name(dt, x, sizeof x), base,
                            k3_device_name(dr, y, sizeof y));
        }
    }
    return K3_OK;
}

static k3_status dim_in(const char *op, int dim, int hi) {
    if (dim >= 0 && dim <= hi) return K3_OK;
    int base = k3_message_base();
    return k3_error(K3_EINVAL, "%s: dim %d is out of range (expected %d..%d)", op, dim + base,
                    base, hi + base);
}

/* Copies ts[i] into the part of r that `part` (narrow along dim, or select for stack) gives;
 * frees r on failure. */
static k3_status join_copy(const char *op, k3_tensor *r, const k3_tensor *const *ts, int n,
                           int dim, bool stack) {
    int64_t pos = 0;
    for (int i = 0; i < n; i++) {
        int64_t len = stack ? 1 : ts[i]->size[dim];
        k3_tensor *v = NULL;
        k3_status s = len == 0 ? K3_OK
                      : stack  ? k3_tensor_select(&v, r, dim, i)
                               : k3_tensor_narrow(&v, r, dim, pos, len);
        if (s == K3_OK && v) s = k3_tensor_copy(v, ts[i]);
        k3_tensor_free(v);
        if (s != K3_OK) {
            k3_tensor_free(r);
            return k3_error_prefix(s, op);
        }
        pos += len;
    }
    return K3_OK;
}

k3_status k3_tensor_cat(k3_tensor **out, const k3_tensor *const *ts, int n, int dim) {
    if (!out) return null_arg("cat", "out");
    K3_TRY(check_join("cat", ts, n, dim));
    int nd = ts[0]->ndim;
    if (nd == 0) return k3_error(K3_ESHAPE, "cat: cannot join 0-dim tensors (use stack)");
    K3_TRY(dim_in("cat", dim, nd - 1));
    int64_t shape[K3_MAX_DIMS];
    memcpy(shape, ts[0]->size, sizeof shape);
    shape[dim] = 0;
    for (int i = 0; i < n; i++)
        if (!k3_add_ok(shape[dim], ts[i]->size[dim], &shape[dim]))
            return k3_error(K3_EOVERFLOW, "cat: the size of dim %d overflows",
                            dim + k3_message_base());
    k3_tensor *r;
    K3_TRY(k3_tensor_new(&r, nd, shape, ts[0]->dtype, ts[0]->storage->device, "cat"));
    K3_TRY(join_copy("cat", r, ts, n, dim, false));
    *out = r;
    return K3_OK;
}

k3_status k3_tensor_stack(k3_tensor **out, const k3_tensor *const *ts, int n, int dim) {
    if (!out) return null_arg("stack", "out");
    K3_TRY(check_join("stack", ts, n, -1));
    int nd = ts[0]->ndim;
    if (nd >= K3_MAX_DIMS)
        return k3_error(K3_ESHAPE, "stack: the result would have %d dims (at most %d)", nd + 1,
                        K3_MAX_DIMS);
    K3_TRY(dim_in("stack", dim, nd));
    int64_t shape[K3_MAX_DIMS];
    for (int d = 0, k = 0; d <= nd; d++) shape[d] = d == dim ? n : ts[0]->size[k++];
    k3_tensor *r;
    K3_TRY(k3_tensor_new(&r, nd + 1, shape, ts[0]->dtype, ts[0]->storage->device, "stack"));
    K3_TRY(join_copy("stack", r, ts, n, dim, true));
    *out = r;
    return K3_OK;
}

/* A 1-dim tensor of n values value(i, ctx), made on the host in dtype (each value rounded
 * once) and moved to device. */
static k3_status range_tensor(const char *op, k3_tensor **out, int64_t n, k3_dtype dtype,
                              k3_device device, double (*value)(int64_t, const double *),
                              const double *ctx) {
    if (!out) return null_arg(op, "out");
    if (n < 0) return k3_error(K3_EINVAL, "%s: the number of elements must be >= 0; got %lld", op,
                               (long long)n);
    K3_TRY(check_device(op, device));
    k3_tensor *h;
    K3_TRY(k3_tensor_new(&h, 1, &n, dtype, (k3_device){K3_DEVICE_CPU, 0}, op));
    for (int64_t i = 0; i < n; i++) k3_store_f64(h->storage->data, dtype, i, value(i, ctx));
    if (device.type == K3_DEVICE_CPU) {
        *out = h;
        return K3_OK;
    }
    k3_status s = k3_tensor_to(out, h, device, dtype);
    k3_tensor_free(h);
    return s == K3_OK ? K3_OK : k3_error_prefix(s, op);
}

static double arange_at(int64_t i, const double *c) { return c[0] + (double)i * c[1]; }
/* c: start, end, step, n / 2 (integer division, as PyTorch's halfway), n. */
static double linspace_at(int64_t i, const double *c) {
    return (double)i < c[3] ? c[0] + (double)i * c[2] : c[1] - (c[4] - 1 - (double)i) * c[2];
}

static k3_status finite_arg(const char *op, const char *what, double v) {
    if (isfinite(v)) return K3_OK;
    char b[32];
    return k3_error(K3_EINVAL, "%s: %s must be finite; got %s", op, what,
                    k3_fmt_double(b, sizeof b, v));
}

k3_status k3_tensor_arange(k3_tensor **out, double start, double step, int64_t n, k3_dtype dtype,
                           k3_device device) {
    K3_TRY(finite_arg("arange", "start", start));
    K3_TRY(finite_arg("arange", "step", step));
    double c[2] = {start, step};
    return range_tensor("arange", out, n, dtype, device, arange_at, c);
}

k3_status k3_tensor_linspace(k3_tensor **out, double a, double b, int64_t n, k3_dtype dtype,
                             k3_device device) {
    K3_TRY(finite_arg("linspace", "start", a));
    K3_TRY(finite_arg("linspace", "end", b));
    /* n = 1 gives {a}: its one element counts as the first half. */
    double c[5] = {a, b, n > 1 ? (b - a) / (double)(n - 1) : 0, n > 1 ? (double)(n / 2) : 1,
                   (double)n};
    return range_tensor("linspace", out, n, dtype, device, linspace_at, c);
}

k3_status k3_tensor_equal(const k3_tensor *a, const k3_tensor *b, int *out) {
    K3_TRY(need_tensor("equal", "a", a));
    K3_TRY(need_tensor("equal", "b", b));
    if (!out) return null_arg("equal", "out");
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = a->size[i] == b->size[i];
    if (!same) {
        *out = 0;
        return K3_OK;
    }
    double *x, *y;
    int64_t n;
    K3_TRY(load_pair("equal", a, b, &x, &y, &n, out));
    int eq = 1;
    for (int64_t i = 0; i < n && eq; i++) eq = x[i] == y[i];
    free_pair(x, y, n);
    *out = eq;
    return K3_OK;
}
