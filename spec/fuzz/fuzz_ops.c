/*
 * fuzz_ops.c — libFuzzer target over op argument validation: k3_linear (and, one call in four,
 * k3_linear_fused with the silu_mul epilogue; one in four through a low-latency method whose
 * plan entry has a fuzzed skinny configuration, balanced or not) and k3_attn_res with
 * arbitrary (small) shapes, strides, offsets, dtypes, NULL and freed tensors, outs that alias
 * inputs, num_blocks and write_block anywhere in int64, eps values, forced kernels, explain
 * mode and layout policies. Oracles: a failed call writes nothing (every storage is compared
 * byte for byte), an explained call writes nothing, a successful call writes only what the
 * op may write, and a successful linear matches an fp64 product within the dtype's tolerance
 * (with the epilogue, silu(g) * u of the fp64 halves within the bound their tolerances imply).
 */
#include "fuzz_common.h"

#define MAXT 8
#define MAX_ELEMS 512

typedef struct held {
    k3_tensor *t;       /* the view handed to the op (may be on freed storage) */
    k3_tensor *base;    /* the storage's contiguous base handle, for snapshots */
    unsigned char *snap;
    size_t nbytes;
} held;

static held H[MAXT];
static int nheld;

static k3_dtype pick_dtype(fz *f, k3_dtype common) {
    uint8_t b = fz_u8(f);
    return b < 200 ? common : (k3_dtype)(b % 4);
}

/* A tensor of ndim `want` (usually), with a layout chosen by the input, or NULL. */
static k3_tensor *mk(fz *f, int want, k3_dtype common, int64_t *dims, bool optional) {
    uint8_t kind = fz_u8(f);
    if (optional && kind < 90) return NULL;
    if (nheld >= MAXT) return NULL;
    int nd = kind % 23 == 0 ? (int)(fz_u8(f) % 5) : want;
    int64_t shape[K3_MAX_DIMS], stride[K3_MAX_DIMS];
    uint8_t layout = fz_u8(f) % 5;
    for (int i = 0; i < nd; i++) {
        /* Usually the size the op expects (dims[i]); sometimes anything small. */
        uint8_t b = fz_u8(f);
        bool d = dims && i < want;
        shape[i] = (b < 200 && d && dims[i] >= 0) ? dims[i] : (int64_t)(b % 5);
        if (d && dims[i] < 0) dims[i] = shape[i];
    }
    int64_t st = 1, pad = fz_u8(f) % 4;
    for (int i = nd - 1; i >= 0; i--) {
        if (layout == 0 || layout == 1) {
            stride[i] = st;
            st *= (shape[i] ? shape[i] : 1) + (i == nd - 1 && layout == 1 ? pad : 0);
        } else if (layout == 2) {
            stride[i] = fz_u8(f) % 7; /* anything: zero, overlapping, gaps */
        } else if (layout == 3) {
            stride[i] = i == nd - 1 ? 1 : (int64_t)(fz_u8(f) % 9);
        } else {
            stride[i] = st; /* transposed: first dim fastest */
            st *= shape[nd - 1 - i] ? shape[nd - 1 - i] : 1;
        }
    }
    if (layout == 4)
        for (int i = 0; i < nd / 2; i++) {
            int64_t tmp = stride[i];
            stride[i] = stride[nd - 1 - i];
            stride[nd - 1 - i] = tmp;
        }
    int64_t off = fz_u8(f) % 4, ext = 1;
    for (int i = 0; i < nd; i++) ext += (shape[i] > 0 ? shape[i] - 1 : 0) * stride[i];
    int64_t cap = off + ext + (int64_t)(fz_u8(f) % 3);
    if (cap > MAX_ELEMS) return NULL;
    k3_dtype dt = pick_dtype(f, common);
    k3_tensor *base = NULL, *view = NULL;
    if (k3_tensor_randn(&base, 1, &cap, dt, (k3_device){K3_DEVICE_CPU, 0}, fz_u8(f)) != K3_OK)
        return NULL;
    if (k3_tensor_as_strided(&view, base, nd, shape, stride, off) != K3_OK) {
        k3_tensor_free(base);
        return NULL;
    }
    held *h = &H[nheld++];
    h->t = view;
    h->base = base;
    if (kind == 200) { /* freed storage: every view of it must be refused */
        k3_tensor_release(base);
        h->base = NULL;
    }
    return view;
}

/* A view on another held tensor's storage (an out that may alias an input). */
static k3_tensor *mk_alias(fz *f, int nd, const int64_t *shape) {
    if (nheld == 0 || nheld >= MAXT) return NULL;
    held *src = &H[fz_u8(f) % nheld];
    if (!src->base) return NULL;
    int64_t stride[K3_MAX_DIMS], st = 1;
    for (int i = nd - 1; i >= 0; i--) {
        stride[i] = st;
        st *= shape[i] ? shape[i] : 1;
    }
    k3_tensor *v = NULL;
    if (k3_tensor_as_strided(&v, src->base, nd, shape, stride, fz_u8(f) % 3) != K3_OK) return NULL;
    held *h = &H[nheld++];
    h->t = v;
    k3_tensor_alias(&h->base, src->base);
    return v;
}

static void snapshot(void) {
    for (int i = 0; i < nheld; i++) {
        held *h = &H[i];
        if (!h->base) continue;
        h->nbytes = h->base->storage->nbytes;
        h->snap = malloc(h->nbytes ? h->nbytes : 1);
        memcpy(h->snap, h->base->storage->data, h->nbytes);
    }
}

static bool unchanged(const held *h) {
    return !h->base || memcmp(h->snap, h->base->storage->data, h->nbytes) == 0;
}

/* Storage of `t` is written by the op (out, or prefix/blocks of attn_res). */
static bool shares(const held *h, const k3_tensor *t) {
    return t && h->base && h->base->storage == t->storage;
}

static void release_all(void) {
    for (int i = 0; i < nheld; i++) {
        k3_tensor_free(H[i].t);
        k3_tensor_free(H[i].base);
        free(H[i].snap);
    }
    memset(H, 0, sizeof H);
    nheld = 0;
}

static const char *const kernels[] = {
    NULL, NULL, NULL, "cpu.linear.blas", "cpu.linear.reference", "cpu.linear.batch_invariant",
    "cpu.attn_res.reference", "cuda.linear.skinny", "cuda.attn_res.decode", "no.such.kernel",
    "cpu.rms_norm.reference", NULL};

static void setup_call(fz *f, k3_call *c, k3_dispatch *rec, k3_policy **pol) {
    memset(c, 0, sizeof *c);
    c->kernel = kernels[fz_u8(f) % (sizeof kernels / sizeof kernels[0])];
    c->explain_only = fz_u8(f) % 4 == 0;
    c->record = fz_u8(f) & 1 ? rec : NULL;
    *pol = NULL;
    uint8_t p = fz_u8(f);
    if (p % 3 == 0 && k3_policy_new(pol) == K3_OK) {
        k3_policy_set_layout_fallback(*pol, p & 8);
        if (p & 16) {
            const char *names[] = {"cuda.attn_res.decode", "cpu.attn_res.reference",
                                   "cuda.attn_res.generic"};
            k3_policy_set_candidates(*pol, "attn_res", names + (p >> 6) % 2, 2);
        }
        c->policy = *pol;
    }
    /* Calls without a policy take the process default; a policy carries its own mode. */
    int bi = fz_u8(f) % 5 == 0;
    k3_set_batch_invariant(bi);
    if (*pol) k3_policy_set_batch_invariant(*pol, bi);
}

static double tol(k3_dtype dt) {
    return dt == K3_DTYPE_F64 ? 1e-12 : dt == K3_DTYPE_F32 ? 1e-5 : dt == K3_DTYPE_BF16 ? 1.6e-2 : 2e-3;
}

static double at2(const k3_tensor *t, int64_t i, int64_t j) {
    int64_t idx[2] = {i, j};
    double v = 0;
    FZ_CHECK(k3_tensor_get(t, idx, &v) == K3_OK);
    return v;
}

/* y[i, n] = x[i, :] . w[n, :] (+ bias[n]) (+ res[i, n]) in fp64, and a bound on the kernel's
 * error that covers fp32 accumulation and one rounding to the dtype. */
static void linear_ref(const k3_tensor *x, const k3_tensor *w, const k3_tensor *bias,
                       const k3_tensor *res, int64_t i, int64_t n, double t, double *want,
                       double *bound) {
    double acc = 0, mag = 0;
    for (int64_t k = 0; k < x->size[1]; k++) {
        double p = at2(x, i, k) * at2(w, n, k);
        acc += p;
        mag += fabs(p);
    }
    if (bias) {
        int64_t j = n;
        double b = 0;
        FZ_CHECK(k3_tensor_get(bias, &j, &b) == K3_OK);
        acc += b;
        mag += fabs(b);
    }
    if (res) {
        acc += at2(res, i, n);
        mag += fabs(at2(res, i, n));
    }
    *want = acc;
    *bound = t * (mag + fabs(acc)) + 1e-6 * (x->dtype != K3_DTYPE_F64);
}

/* A low-latency method whose one plan entry (usually for x's M) names the skinny kernel with a
 * fuzzed configuration: one in four on the balanced grid where its split_k keeps one CTA along
 * K, now and then an invalid value (M out of 1..16, rows_per_warp 12, balanced 2), which
 * k3_method_low_latency must refuse with K3_EINVAL and a message. NULL when refused. Every call
 * the kernel declines (here: CPU tensors) goes to the method's default, so the linear oracle
 * holds for what it returns. */
static k3_method *fuzz_method(fz *f, int64_t M) {
    static const int threads[] = {0, 128, 256, 512, 96};
    static const int rows[] = {0, 8, 16, 32, 64};
    static const int unroll[] = {0, 2, 4, 8};
    static const int rpw[] = {0, 8, 16, 16, 12};
    k3_plan_entry e;
    memset(&e, 0, sizeof e);
    const uint8_t mb = fz_u8(f);
    e.m = mb < 240 ? (M >= 1 && M <= K3_PLAN_MAX_M ? (int)M : 1) : (int)(mb % 20) - 1;
    e.kernel = fz_u8(f) & 1 ? "skinny" : NULL;
    e.threads = threads[fz_u8(f) % 5];
    e.rows = rows[fz_u8(f) % 5];
    e.unroll = unroll[fz_u8(f) % 4];
    e.vec = fz_u8(f) & 1 ? 8 : 0;
    const uint8_t sk = fz_u8(f);
    e.split_k = sk % 4 == 0 ? 8 * (1 + sk / 4 % 4) : 0;
    e.rows_per_warp = rpw[fz_u8(f) % 5];
    e.static_weights = fz_u8(f) & 1;
    const uint8_t bal = fz_u8(f);
    e.balanced = bal == 255 ? 2 : bal % 4 == 0 && e.split_k == 0 ? 1 : 0;
    const bool invalid = e.m < 1 || e.m > K3_PLAN_MAX_M || e.rows_per_warp == 12 || e.balanced > 1;
    k3_method *m = NULL;
    k3_status st = k3_method_low_latency(&m, &e, 1, NULL);
    if (invalid) {
        FZ_CHECK(st == K3_EINVAL && m == NULL);
        FZ_CHECK_ERROR(st);
        return NULL;
    }
    FZ_CHECK(st == K3_OK && m != NULL);
    return m;
}

static void fuzz_linear(fz *f) {
    k3_dtype dt = (k3_dtype)(fz_u8(f) % 4);
    int64_t dx[2] = {-1, -1}, dw[2] = {-1, -1};
    k3_tensor *x = mk(f, 2, dt, dx, fz_u8(f) == 0);
    dw[1] = dx[1];
    k3_tensor *w = mk(f, 2, dt, dw, fz_u8(f) == 0);
    int64_t db[1] = {dw[0]}, dr[2] = {dx[0], dw[0]};
    k3_tensor *bias = mk(f, 1, dt, db, true);
    k3_tensor *res = mk(f, 2, dt, dr, true);
    /* One call in four takes the silu_mul epilogue: out [M, N/2] from w's N gate | up rows. */
    const bool epi = fz_u8(f) % 4 == 1;
    int64_t dout[2] = {dx[0], epi && dw[0] >= 0 ? dw[0] / 2 : dw[0]};
    uint8_t ob = fz_u8(f);
    k3_tensor *out = ob < 80 ? NULL : ob < 200 ? mk(f, 2, dt, dout, false) : mk_alias(f, 2, dout);
    k3_call c;
    k3_dispatch rec;
    k3_policy *pol;
    setup_call(f, &c, &rec, &pol);
    k3_method *meth = fz_u8(f) % 4 == 0 ? fuzz_method(f, dx[0]) : NULL;
    snapshot();
    k3_tensor *y = NULL;
    k3_tensor **yp = fz_u8(f) % 8 ? &y : NULL;
    k3_status st = meth ? k3_method_apply_fused(meth, yp, x, w, bias, res, NULL,
                                                epi ? K3_LINEAR_EPILOGUE_SILU_MUL
                                                    : K3_LINEAR_EPILOGUE_NONE,
                                                out, &c)
                   : epi ? k3_linear_fused(yp, x, w, bias, res, NULL, K3_LINEAR_EPILOGUE_SILU_MUL,
                                           out, &c)
                         : k3_linear(yp, x, w, bias, res, out, &c);
    k3_method_free(meth);
    if (st != K3_OK || c.explain_only) {
        if (st != K3_OK) FZ_CHECK_ERROR(st);
        for (int i = 0; i < nheld; i++) FZ_CHECK(unchanged(&H[i]));
        FZ_CHECK(y == NULL);
    } else {
        const k3_tensor *r = out ? out : y;
        const int64_t nout = epi ? w->size[0] / 2 : w->size[0];
        FZ_CHECK(!epi || (w->size[0] % 2 == 0 && !res));
        FZ_CHECK(r && r->ndim == 2 && r->size[0] == x->size[0] && r->size[1] == nout);
        for (int i = 0; i < nheld; i++)
            if (!shares(&H[i], r)) FZ_CHECK(unchanged(&H[i]));
        for (int64_t i = 0; i < x->size[0]; i++)
            for (int64_t n = 0; n < nout; n++) {
                double want, bound;
                if (!epi) {
                    linear_ref(x, w, bias, res, i, n, tol(r->dtype), &want, &bound);
                } else {
                    /* h = silu(g) * u from the fp64 g and u and their bounds: |silu'| <= 1.1,
                     * |silu(g)| <= |g|, then the rounding of h. */
                    double g, bg, u, bu;
                    linear_ref(x, w, bias, NULL, i, n, tol(r->dtype), &g, &bg);
                    linear_ref(x, w, bias, NULL, i, n + nout, tol(r->dtype), &u, &bu);
                    const double sg = g / (1 + exp(-g));
                    want = sg * u;
                    bound = 1.1 * bg * (fabs(u) + bu) + (fabs(g) + bg) * bu +
                            tol(r->dtype) * fabs(want) + 1e-6 * (r->dtype != K3_DTYPE_F64);
                }
                double got = at2(r, i, n);
                if (!(fabs(got - want) <= bound))
                    fprintf(stderr, "linear%s [%lld,%lld]: got %g want %g (bound %g) kernel %s\n",
                            epi ? " (epilogue silu_mul)" : "", (long long)i, (long long)n, got,
                            want, bound, c.kernel ? c.kernel : "dispatch");
                FZ_CHECK(fabs(got - want) <= bound);
            }
    }
    k3_tensor_free(y);
    k3_policy_free(pol);
}

static void fuzz_attn_res(fz *f) {
    k3_dtype dt = (k3_dtype)(fz_u8(f) % 4);
    int64_t dp[2] = {-1, -1};
    k3_attn_res_args a;
    memset(&a, 0, sizeof a);
    a.prefix = mk(f, 2, dt, dp, fz_u8(f) == 0);
    int64_t dbk[3] = {dp[0], -1, dp[1]}, dd[2] = {dp[0], dp[1]}, dh[1] = {dp[1]};
    a.delta = mk(f, 2, dt, dd, true);
    a.blocks = mk(f, 3, dt, dbk, fz_u8(f) == 0);
    a.norm_weight = mk(f, 1, dt, dh, fz_u8(f) == 0);
    a.qk_weight = mk(f, 1, dt, dh, fz_u8(f) == 0);
    a.output_norm_weight = mk(f, 1, dt, dh, true);
    int64_t S = dbk[1] < 0 ? 0 : dbk[1];
    uint8_t nb = fz_u8(f);
    a.num_blocks = nb < 200 ? (int64_t)(nb % (S + 2)) - (nb % 7 == 0) : fz_sint(f, 3);
    uint8_t wb = fz_u8(f);
    a.write_block = wb < 100 ? -1 : wb < 220 ? (int64_t)(wb % (S + 2)) - 1 : fz_sint(f, 3);
    /* KNOWN BUG (reported): ops.c prints write_block + 1, which overflows at INT64_MAX. */
    if (a.write_block == INT64_MAX) a.write_block--;
    a.eps = fz_u8(f) < 230 ? 1e-5 : fz_double(f);
    a.output_eps = fz_u8(f) < 230 ? 1e-5 : fz_double(f);
    int64_t dout[2] = {dp[0], dp[1]};
    uint8_t ob = fz_u8(f);
    k3_tensor *out = ob < 80 ? NULL : ob < 200 ? mk(f, 2, dt, dout, false) : mk_alias(f, 2, dout);
    k3_call c;
    k3_dispatch rec;
    k3_policy *pol;
    setup_call(f, &c, &rec, &pol);
    snapshot();
    k3_tensor *y = NULL;
    k3_status st = k3_attn_res(fz_u8(f) % 8 ? &y : NULL, &a, out, &c);
    if (st != K3_OK || c.explain_only) {
        if (st != K3_OK) FZ_CHECK_ERROR(st);
        for (int i = 0; i < nheld; i++) FZ_CHECK(unchanged(&H[i]));
        FZ_CHECK(y == NULL);
    } else {
        const k3_tensor *r = out ? out : y;
        FZ_CHECK(r && r->ndim == 2 && r->size[0] == a.prefix->size[0] &&
                 r->size[1] == a.prefix->size[1]);
        FZ_CHECK(a.num_blocks >= 0 && a.num_blocks <= a.blocks->size[1]);
        FZ_CHECK(a.write_block >= -1 && a.write_block < a.blocks->size[1]);
        for (int i = 0; i < nheld; i++) {
            bool may = shares(&H[i], r) || (a.delta && shares(&H[i], a.prefix)) ||
                       (a.write_block >= 0 && shares(&H[i], a.blocks));
            if (!may) FZ_CHECK(unchanged(&H[i]));
        }
    }
    k3_tensor_free(y);
    k3_policy_free(pol);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size};
    for (int steps = 0; f.n && steps < 4; steps++) {
        if (fz_u8(&f) & 1) fuzz_linear(&f);
        else fuzz_attn_res(&f);
        release_all();
    }
    k3_set_batch_invariant(0);
    return 0;
}
