/*
 * cpu/reduce.c — cpu.{sum,mean,max,min}.reference over any strides and dtype, in the fixed
 * order of K3_REDUCE_LANES (k3.h) that kernels/tensor_ops.cu follows too, so both give the same
 * bits; and the reduction's walk (k3_reduce_plan), shared with the CUDA kernels.
 */
#include "k3_impl.h"

#include <math.h>
#include <string.h>

/* Appends dim d of x (size > 1) to the outer or the inner dims of p. */
static void plan_add(k3_reduce_plan *p, const k3_reduce_args *a, int d, int od, bool inner) {
    const k3_tensor *x = a->x;
    if (x->size[d] == 1) return;
    if (inner) {
        p->inner_size[p->inner_ndim] = x->size[d];
        p->inner_xstride[p->inner_ndim++] = x->stride[d];
        return;
    }
    int k = p->outer_ndim++;
    p->outer_size[k] = x->size[d];
    p->outer_xstride[k] = x->stride[d];
    p->outer_ostride[k] = a->out->stride[od];
    p->outer_istride[k] = a->indices ? a->indices->stride[od] : 0;
}

void k3_reduce_plan_init(k3_reduce_plan *p, const k3_reduce_args *a) {
    memset(p, 0, sizeof *p);
    int nd = a->x->ndim;
    for (int d = 0; d < nd; d++) plan_add(p, a, d, d, a->dim < 0 || d == a->dim);
    p->outer_n = 1;
    for (int k = 0; k < p->outer_ndim; k++) p->outer_n *= p->outer_size[k];
    p->inner_n = 1;
    for (int k = 0; k < p->inner_ndim; k++) p->inner_n *= p->inner_size[k];
    /* An empty x gives no outputs (an empty kept dim: outer_n = 0) or outputs over nothing
     * (inner_n = 0; the walk over the inner dims is then never started). */
}

/* The row-major offsets of a walk over `nd` dims, advanced one element at a time. */
typedef struct odometer {
    int nd;
    const int64_t *size, *stride;
    int64_t idx[K3_MAX_DIMS];
    int64_t off;
} odometer;

static void odo_start(odometer *o, int nd, const int64_t *size, const int64_t *stride, int64_t i) {
    o->nd = nd;
    o->size = size;
    o->stride = stride;
    o->off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        o->idx[d] = i % size[d];
        o->off += o->idx[d] * stride[d];
        i /= size[d];
    }
}

static void odo_next(odometer *o) {
    for (int d = o->nd - 1; d >= 0; d--) {
        o->off += o->stride[d];
        if (++o->idx[d] < o->size[d]) return;
        o->off -= o->idx[d] * o->stride[d];
        o->idx[d] = 0;
    }
}

/* Offsets of output o in x, out and indices. */
static void outer_offsets(const k3_reduce_plan *p, int64_t o, int64_t *xo, int64_t *oo,
                          int64_t *io) {
    *xo = *oo = *io = 0;
    for (int d = p->outer_ndim - 1; d >= 0; d--) {
        int64_t r = o % p->outer_size[d];
        o /= p->outer_size[d];
        *xo += r * p->outer_xstride[d];
        *oo += r * p->outer_ostride[d];
        *io += r * p->outer_istride[d];
    }
}

/* The lanes combined as the CUDA kernel's warps do (k3.h, K3_REDUCE_LANES). */
#define LANES K3_REDUCE_LANES
#define COMBINE_LANES(T, v, total)                                                         \
    do {                                                                                   \
        T w_[32];                                                                          \
        total = 0;                                                                         \
        for (int g_ = 0; g_ < LANES / 32; g_++) {                                          \
            T *l_ = v + 32 * g_;                                                           \
            for (int o_ = 16; o_ > 0; o_ >>= 1) {                                          \
                for (int i_ = 0; i_ < 32; i_++) w_[i_] = l_[i_] + l_[i_ ^ o_];             \
                memcpy(l_, w_, sizeof w_);                                                 \
            }                                                                              \
            total += l_[0];                                                                \
        }                                                                                  \
    } while (0)

static k3_status supports(const k3_op_args *a, char *reason, size_t n) { return K3_OK; }

/* The mean of no elements is NaN, the positive quiet one on every backend (0 / 0 gives a
 * negative one on x86). */
static double mean_of(double total, int64_t n) { return n ? total / (double)n : (double)NAN; }
static float mean_of_f32(float total, int64_t n) { return n ? total / (float)n : NAN; }

/* sum and mean (mean divides in the accumulator, then rounds once). */
static k3_status run_sum_mean(const k3_op_args *oa) {
    const k3_reduce_args *a = &oa->u.sum;
    bool mean = oa->op == K3_OP_MEAN;
    k3_reduce_plan p;
    k3_reduce_plan_init(&p, a);
    const void *xb = k3_tensor_data(a->x);
    void *ob = k3_tensor_data(a->out);
    k3_dtype dt = a->x->dtype;
    for (int64_t o = 0; o < p.outer_n; o++) {
        int64_t xo, oo, io;
        outer_offsets(&p, o, &xo, &oo, &io);
        odometer it;
        if (p.inner_n > 0) odo_start(&it, p.inner_ndim, p.inner_size, p.inner_xstride, 0);
        if (dt == K3_DTYPE_F64) {
            double v[LANES] = {0}, total;
            for (int64_t j = 0; j < p.inner_n; j++, odo_next(&it))
                v[j % LANES] += k3_load_f64(xb, dt, xo + it.off);
            COMBINE_LANES(double, v, total);
            k3_store_f64(ob, dt, oo, mean ? mean_of(total, p.inner_n) : total);
        } else {
            float v[LANES] = {0}, total;
            for (int64_t j = 0; j < p.inner_n; j++, odo_next(&it))
                v[j % LANES] += k3_load_f32(xb, dt, xo + it.off);
            COMBINE_LANES(float, v, total);
            k3_store_f32(ob, dt, oo, mean ? mean_of_f32(total, p.inner_n) : total);
        }
    }
    return K3_OK;
}

/* max and min: the first NaN, else the first of the extreme values. Loaded as f64 (exact for
 * every dtype) and stored back unchanged. */
static k3_status run_max_min(const k3_op_args *oa) {
    const k3_reduce_args *a = &oa->u.max;
    bool is_max = oa->op == K3_OP_MAX;
    k3_reduce_plan p;
    k3_reduce_plan_init(&p, a);
    const void *xb = k3_tensor_data(a->x);
    void *ob = k3_tensor_data(a->out);
    void *ib = a->indices ? k3_tensor_data(a->indices) : NULL;
    k3_dtype dt = a->x->dtype;
    for (int64_t o = 0; o < p.outer_n; o++) {
        int64_t xo, oo, io;
        outer_offsets(&p, o, &xo, &oo, &io);
        odometer it;
        odo_start(&it, p.inner_ndim, p.inner_size, p.inner_xstride, 0);
        double best = k3_load_f64(xb, dt, xo + it.off);
        int64_t at = 0;
        odo_next(&it);
        for (int64_t j = 1; j < p.inner_n && !isnan(best); j++, odo_next(&it)) {
            double v = k3_load_f64(xb, dt, xo + it.off);
            if (isnan(v) || (is_max ? v > best : v < best)) {
                best = v;
                at = j;
            }
        }
        k3_store_f64(ob, dt, oo, best);
        if (ib) k3_store_f64(ib, K3_DTYPE_F64, io, (double)at + a->index_base);
    }
    return K3_OK;
}

const k3_kernel k3_cpu_sum_reference = K3_KERNEL_RECORD(k3_cpu_sum_reference, supports, run_sum_mean);
const k3_kernel k3_cpu_mean_reference =
    K3_KERNEL_RECORD(k3_cpu_mean_reference, supports, run_sum_mean);
const k3_kernel k3_cpu_max_reference = K3_KERNEL_RECORD(k3_cpu_max_reference, supports, run_max_min);
const k3_kernel k3_cpu_min_reference = K3_KERNEL_RECORD(k3_cpu_min_reference, supports, run_max_min);
