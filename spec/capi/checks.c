/*
 * checks.c — the C API's contract at its edges, from C with no Lua: NULL arguments, 0-based
 * messages, invalid devices and flags, writes through overlapping views, op output names,
 * single rounding, messages that use the C function's name and the per-thread last error
 * (two pthreads, each failing in turn, each reading back its own message), and the log hook
 * (k3_set_log: a configuration warning reaches the callback with its level, text and userdata;
 * with the hook set back to NULL the next one goes nowhere, not even stderr). Each case prints
 * "name<TAB>STATUS<TAB>message" (message "" on K3_OK, or a value); spec/capi_spec.lua builds
 * this with pkg-config flags only and compares every line.
 * A crash (a NULL dereferenced) ends the run early, which the spec reports.
 */
#define _POSIX_C_SOURCE 200809L /* pthreads under -std=c11 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <k3.h>

/* A captured function that queues nothing (the graph cases check arguments only). */
static k3_status graph_noop(void *ud) {
    (void)ud;
    return K3_OK;
}

static void report(const char *name, k3_status s) {
    printf("%s\t%s\t%s\n", name, k3_status_name(s), s == K3_OK ? "" : k3_last_error());
    fflush(stdout); /* lines before a crash still reach the spec */
}

/* A value as exact hex float text, for cases that return one. Call it after the call that
 * sets v (not with the call as an argument: argument order is unspecified). */
static void report_value(const char *name, k3_status s, double v) {
    if (s != K3_OK) {
        report(name, s);
        return;
    }
    printf("%s\tK3_OK\t%a\n", name, v);
    fflush(stdout);
}

#define CASE(name, expr) report(name, (expr))

/* report() with every run of digits in the message shown as N, for a message that carries a
 * count the case does not control (how many allocations are live). */
static void report_counted(const char *name, k3_status s) {
    const char *m = s == K3_OK ? "" : k3_last_error();
    printf("%s\t%s\t", name, k3_status_name(s));
    for (; *m; m++) {
        if (*m >= '0' && *m <= '9') {
            while (m[1] >= '0' && m[1] <= '9') m++;
            putchar('N');
        } else {
            putchar(*m);
        }
    }
    putchar('\n');
    fflush(stdout);
}

/* ---- the last error is per thread ----
 * Thread A fails first; thread B then fails differently; only after that does A read
 * k3_last_error(), then B reads its own. Each must see its own message: a message shared
 * between threads would show B's text in A. The steps are ordered with a mutex and a
 * condition variable; the messages are copied out and printed by main after the join. */
static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_cv = PTHREAD_COND_INITIALIZER;
static int step;

static void step_wait(int want) {
    pthread_mutex_lock(&step_mu);
    while (step < want) pthread_cond_wait(&step_cv, &step_mu);
    pthread_mutex_unlock(&step_mu);
}

static void step_set(int to) {
    pthread_mutex_lock(&step_mu);
    step = to;
    pthread_cond_broadcast(&step_cv);
    pthread_mutex_unlock(&step_mu);
}

typedef struct {
    const k3_tensor *t; /* read only, shared */
    k3_status status;
    char msg[256];
} thread_case;

static void *thread_a(void *arg) {
    thread_case *c = arg;
    k3_tensor *v = NULL;
    c->status = k3_tensor_narrow(&v, NULL, 0, 0, 1); /* "narrow: t is NULL" */
    step_set(1);
    step_wait(2); /* B has failed with its own message */
    snprintf(c->msg, sizeof c->msg, "%s", k3_last_error());
    step_set(3);
    return NULL;
}

static void *thread_b(void *arg) {
    thread_case *c = arg;
    k3_tensor *v = NULL;
    step_wait(1); /* A has failed */
    c->status = k3_tensor_select(&v, c->t, 0, 2); /* index 2 out of range for dim 0 */
    step_set(2);
    step_wait(3); /* A has read its message */
    snprintf(c->msg, sizeof c->msg, "%s", k3_last_error());
    return NULL;
}

static void report_thread(const char *name, const thread_case *c) {
    printf("%s\t%s\t%s\n", name, k3_status_name(c->status), c->status == K3_OK ? "" : c->msg);
    fflush(stdout);
}

/* ---- the log hook ----
 * capture() keeps what k3 hands the hook. The two triggers are the configuration warnings k3
 * logs without Lua: an unknown name in K3_DISABLE_KERNELS (logged once, when the registry is
 * set up: k3_kernel_count) and an unrecognised K3_BATCH_INVARIANT (logged once, at the first
 * k3_batch_invariant). Both variables are set before any k3 call; neither changes the later
 * cases (an unknown name disables nothing; the mode stays off). */
typedef struct {
    int calls;
    k3_log_level level;
    void *ud;
    char text[1024];
} log_capture;

static void capture(void *ud, k3_log_level level, const char *message) {
    log_capture *c = ud;
    c->calls++;
    c->level = level;
    c->ud = ud;
    snprintf(c->text, sizeof c->text, "%s", message);
}

static const char *level_name(k3_log_level l) {
    switch (l) {
    case K3_LOG_DEBUG: return "K3_LOG_DEBUG";
    case K3_LOG_INFO: return "K3_LOG_INFO";
    case K3_LOG_WARN: return "K3_LOG_WARN";
    case K3_LOG_ERROR: return "K3_LOG_ERROR";
    }
    return "level ?";
}

static void log_hook_cases(void) {
    static log_capture cap;
    setenv("K3_DISABLE_KERNELS", "cpu.linear.nosuch", 1);
    setenv("K3_BATCH_INVARIANT", "maybe", 1);
    /* stderr goes to a temporary file while k3 logs, so the cases can say whether k3 wrote
     * anything there itself. */
    FILE *err = tmpfile();
    int saved = dup(2);
    if (!err || saved < 0 || dup2(fileno(err), 2) < 0) {
        printf("log hook setup\tK3_EINTERNAL\tcannot redirect stderr\n");
        return;
    }
    k3_set_log(capture, &cap);
    (void)k3_kernel_count(); /* sets up the registry: logs the unknown name */
    int calls_with_hook = cap.calls;
    k3_set_log(NULL, NULL);
    (void)k3_batch_invariant(); /* logs the unrecognised value: to no hook */
    int calls_after_null = cap.calls - calls_with_hook;
    fflush(stderr);
    long err_bytes = fseek(err, 0, SEEK_END) == 0 ? ftell(err) : -1;
    dup2(saved, 2);
    close(saved);
    fclose(err);
    /* The known-kernel list after the name depends on the build (CUDA kernels or not): the
     * text is shown up to it, and whether it lists cpu.linear.blas. */
    char *known = strstr(cap.text, " (known kernels: ");
    int lists_blas = known && strstr(known, "cpu.linear.blas") != NULL;
    if (known) *known = '\0';
    printf("log hook calls\tK3_OK\t%d\n", calls_with_hook);
    printf("log hook level\tK3_OK\t%s\n", level_name(cap.level));
    printf("log hook text\tK3_OK\t%s\n", cap.text);
    printf("log hook text lists known kernels\tK3_OK\t%s\n", lists_blas ? "yes" : "no");
    printf("log hook userdata\tK3_OK\t%s\n", cap.ud == &cap ? "passed" : "lost");
    printf("log hook NULL calls\tK3_OK\t%d\n", calls_after_null);
    printf("log hook stderr bytes\tK3_OK\t%ld\n", err_bytes);
    fflush(stdout);
}

int main(void) {
    const k3_device cpu = {K3_DEVICE_CPU, 0};
    const k3_dtype f32 = K3_DTYPE_F32;
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s14[2] = {1, 4}, idx[2] = {0, 0};
    k3_tensor *a = NULL, *v = NULL, *w = NULL, *x = NULL, *big = NULL;
    k3_graph *graph = NULL;
    double d = 0;
    log_hook_cases(); /* first: before any k3 call reads the environment */
    if (k3_tensor_full(&a, 2, s23, f32, cpu, 1) != K3_OK) return 1;
    if (k3_tensor_full(&w, 1, s4, f32, cpu, 1) != K3_OK) return 1;

    /* ---- 1. NULL pointers: K3_EINVAL "<function>: <argument> is NULL" ---- */
    CASE("empty out", k3_tensor_empty(NULL, 2, s23, f32, cpu));
    CASE("empty shape", k3_tensor_empty(&v, 2, NULL, f32, cpu));
    CASE("full out", k3_tensor_full(NULL, 2, s23, f32, cpu, 0));
    CASE("full shape", k3_tensor_full(&v, 1, NULL, f32, cpu, 0));
    CASE("randn out", k3_tensor_randn(NULL, 2, s23, f32, cpu, 1));
    CASE("randn shape", k3_tensor_randn(&v, 2, NULL, f32, cpu, 1));
    CASE("from_f64 out", k3_tensor_from_f64(NULL, 1, s4, f32, cpu, (double[4]){0}));
    CASE("from_f64 values", k3_tensor_from_f64(&v, 2, s23, f32, cpu, NULL));
    CASE("narrow out", k3_tensor_narrow(NULL, a, 0, 0, 1));
    CASE("narrow t", k3_tensor_narrow(&v, NULL, 0, 0, 1));
    CASE("select out", k3_tensor_select(NULL, a, 0, 0));
    CASE("transpose out", k3_tensor_transpose(NULL, a, 0, 1));
    CASE("view out", k3_tensor_view(NULL, a, 1, (int64_t[1]){6}));
    CASE("view shape", k3_tensor_view(&v, a, 1, NULL));
    CASE("expand out", k3_tensor_expand(NULL, a, 2, s23));
    CASE("expand shape", k3_tensor_expand(&v, a, 2, NULL));
    CASE("reshape out", k3_tensor_reshape(NULL, a, 1, (int64_t[1]){6}));
    CASE("reshape shape", k3_tensor_reshape(&v, a, 1, NULL));
    CASE("permute out", k3_tensor_permute(NULL, a, 2, (int[2]){1, 0}));
    CASE("permute dims", k3_tensor_permute(&v, a, 2, NULL));
    CASE("squeeze t", k3_tensor_squeeze(&v, NULL, -1));
    CASE("unsqueeze out", k3_tensor_unsqueeze(NULL, a, 0));
    CASE("as_strided out", k3_tensor_as_strided(NULL, a, 1, s4, (int64_t[1]){1}, 0));
    CASE("as_strided shape", k3_tensor_as_strided(&v, a, 1, NULL, (int64_t[1]){1}, 0));
    CASE("as_strided stride", k3_tensor_as_strided(&v, a, 1, s4, NULL, 0));
    CASE("to out", k3_tensor_to(NULL, a, cpu, f32));
    CASE("to t", k3_tensor_to(&v, NULL, cpu, f32));
    CASE("copy dst", k3_tensor_copy(NULL, a));
    CASE("copy src", k3_tensor_copy(a, NULL));
    CASE("fill t", k3_tensor_fill(NULL, 1));
    CASE("get t", k3_tensor_get(NULL, idx, &d));
    CASE("get idx", k3_tensor_get(a, NULL, &d));
    CASE("get out", k3_tensor_get(a, idx, NULL));
    CASE("set idx", k3_tensor_set(a, NULL, 1));
    CASE("to_f64 out", k3_tensor_to_f64(a, NULL));
    CASE("binary out", k3_tensor_binary(NULL, K3_ADD, a, a));
    CASE("binary a", k3_tensor_binary(&v, K3_ADD, NULL, a));
    CASE("binary b", k3_tensor_binary(&v, K3_ADD, a, NULL));
    CASE("binary_scalar out", k3_tensor_binary_scalar(NULL, K3_MUL, a, 2, 0));
    CASE("binary_scalar a", k3_tensor_binary_scalar(&v, K3_MUL, NULL, 2, 0));
    CASE("max_abs_diff out", k3_max_abs_diff(a, a, NULL));
    CASE("max_abs_diff b", k3_max_abs_diff(a, NULL, &d));
    CASE("allclose out", k3_allclose(a, a, 0, 0, NULL));
    CASE("cosine a", k3_cosine(NULL, a, &d));
    CASE("device_parse out", k3_device_parse("cuda:2", NULL));
    CASE("device_parse text", k3_device_parse(NULL, &(k3_device){0}));
    CASE("dtype_parse name", k3_dtype_parse(NULL, &(k3_dtype){0}));
    CASE("dtype_parse out", k3_dtype_parse("bf16", NULL));
    CASE("policy_new out", k3_policy_new(NULL));
    k3_policy *pol = NULL;
    if (k3_policy_new(&pol) != K3_OK) return 1;
    CASE("policy_set_candidates op", k3_policy_set_candidates(pol, NULL, NULL, 0));
    CASE("policy_set_candidates names[1]",
         k3_policy_set_candidates(pol, "linear", (const char *[]){"cpu.linear.blas", NULL}, 2));
    CASE("safetensors_save names[0]",
         k3_safetensors_save("/nonexistent/x.st", 1, (const char *[]){NULL},
                             (const k3_tensor *[]){a}));
    CASE("safetensors_save tensors[0]",
         k3_safetensors_save("/nonexistent/x.st", 1, (const char *[]){"w"},
                             (const k3_tensor *[]){NULL}));
    CASE("safetensors_save unwritable",
         k3_safetensors_save("/nonexistent/x.st", 1, (const char *[]){"w"},
                             (const k3_tensor *[]){a}));
    CASE("method_default out", k3_method_default(NULL, NULL));
    CASE("linear x", k3_linear(&v, NULL, a, NULL, NULL, NULL, NULL));
    CASE("graph_capture out", k3_graph_capture(NULL, graph_noop, NULL, NULL));
    CASE("graph_capture fn", k3_graph_capture(&graph, NULL, NULL, NULL));
    CASE("graph_capture warmup",
         k3_graph_capture(&graph, graph_noop, NULL, &(k3_graph_options){0, -1}));
    CASE("graph_replay g", k3_graph_replay(NULL));
    /* Where nothing would be read or written, NULL is fine. */
    CASE("empty 0-dim shape NULL", k3_tensor_empty(&v, 0, NULL, f32, cpu));
    CASE("get 0-dim idx NULL", k3_tensor_get(v, NULL, &d));
    k3_tensor_free(v);
    v = NULL;
    CASE("from_f64 empty values NULL", k3_tensor_from_f64(&v, 1, (int64_t[1]){0}, f32, cpu, NULL));
    CASE("to_f64 empty out NULL", k3_tensor_to_f64(v, NULL));
    k3_tensor_free(v);
    v = NULL;
    k3_tensor_free(NULL);
    k3_tensor_release(NULL);
    k3_policy_free(NULL);
    k3_method_free(NULL);
    k3_safetensors_free(NULL);
    printf("free NULL\tK3_OK\t\n");

    /* ---- 2. messages count from 0, as the caller does ---- */
    CASE("narrow dim", k3_tensor_narrow(&v, a, 2, 0, 1));
    CASE("narrow start", k3_tensor_narrow(&v, a, 1, 3, 1));
    CASE("narrow length", k3_tensor_narrow(&v, a, 1, 1, 5));
    CASE("select index", k3_tensor_select(&v, a, 0, 2));
    CASE("select mininteger", k3_tensor_select(&v, a, 1, INT64_MIN));
    CASE("transpose d2", k3_tensor_transpose(&v, a, 0, 2));
    CASE("get index", k3_tensor_get(a, (int64_t[2]){2, 0}, &d));
    CASE("set index", k3_tensor_set(a, (int64_t[2]){1, 3}, 0));
    CASE("view two -1", k3_tensor_view(&v, a, 2, (int64_t[2]){-1, -1}));
    CASE("view infer", k3_tensor_view(&v, a, 2, (int64_t[2]){-1, 4}));
    CASE("expand", k3_tensor_expand(&v, a, 2, (int64_t[2]){3, 3}));
    CASE("reshape count", k3_tensor_reshape(&v, a, 2, (int64_t[2]){4, 2}));
    CASE("reshape two -1", k3_tensor_reshape(&v, a, 2, (int64_t[2]){-1, -1}));
    CASE("permute range", k3_tensor_permute(&v, a, 2, (int[2]){0, 2}));
    CASE("permute twice", k3_tensor_permute(&v, a, 2, (int[2]){1, 1}));
    CASE("squeeze dim", k3_tensor_squeeze(&v, a, 2));
    CASE("unsqueeze dim", k3_tensor_unsqueeze(&v, a, 3));
    CASE("as_strided negative stride", k3_tensor_as_strided(&v, a, 2, s23, (int64_t[2]){3, -1}, 0));
    CASE("empty size", k3_tensor_empty(&v, 2, (int64_t[2]){2, -1}, f32, cpu));
    CASE("empty overflow", k3_tensor_empty(&v, 2, (int64_t[2]){1LL << 62, 1LL << 62}, f32, cpu));
    k3_tensor *w14 = NULL;
    if (k3_tensor_full(&w14, 2, s14, f32, cpu, 1) != K3_OK) return 1;
    CASE("linear K mismatch", k3_linear(&v, a, w14, NULL, NULL, NULL, NULL));
    k3_tensor_free(w14);
    CASE("linear bias", k3_linear(&v, a, a, w, NULL, NULL, NULL));
    {
        k3_linear_prologue_args silu = {K3_LINEAR_PROLOGUE_SILU_MUL, NULL, 0};
        k3_linear_prologue_args bad = {(k3_linear_prologue)7, NULL, 0};
        k3_linear_prologue_args rms = {K3_LINEAR_PROLOGUE_RMS_NORM, w, 1e-5};
        CASE("linear prologue silu_mul K", k3_linear_with_prologue(&v, a, a, NULL, NULL, &silu, NULL, NULL));
        CASE("linear prologue value", k3_linear_with_prologue(&v, a, a, NULL, NULL, &bad, NULL, NULL));
        CASE("linear prologue rms_norm weight", k3_linear_with_prologue(&v, a, a, NULL, NULL, &rms, NULL, NULL));
        k3_tensor *w53 = NULL;
        if (k3_tensor_full(&w53, 2, (int64_t[2]){5, 3}, f32, cpu, 1) != K3_OK) return 1;
        CASE("linear epilogue odd w", k3_linear_fused(&v, a, w53, NULL, NULL, NULL, K3_LINEAR_EPILOGUE_SILU_MUL, NULL, NULL));
        k3_tensor_free(w53);
        CASE("linear epilogue value", k3_linear_fused(&v, a, a, NULL, NULL, NULL, (k3_linear_epilogue)5, NULL, NULL));
        CASE("linear epilogue residual", k3_linear_fused(&v, a, a, NULL, a, NULL, K3_LINEAR_EPILOGUE_SILU_MUL, NULL, NULL));
        CASE("linear epilogue out", k3_linear_fused(NULL, a, a, NULL, NULL, NULL, K3_LINEAR_EPILOGUE_SILU_MUL, a, NULL));
        CASE("method_apply_fused m", k3_method_apply_fused(NULL, &v, a, a, NULL, NULL, NULL, K3_LINEAR_EPILOGUE_SILU_MUL, NULL, NULL));
    }
    CASE("rms_norm w", k3_rms_norm(&v, a, w, 1e-5, NULL, NULL));
    CASE("silu_mul odd", k3_silu_mul(&v, a, NULL, NULL));
    if (k3_tensor_empty(&x, 0, NULL, f32, cpu) != K3_OK) return 1;
    CASE("narrow 0-dim", k3_tensor_narrow(&v, x, 0, 0, 1));
    k3_tensor_free(x);
    x = NULL;
    {
        int64_t th[2] = {1, 4}, tsh[3] = {1, 3, 4}, t0h[3] = {1, 0, 4};
        k3_tensor *prefix = NULL, *blocks = NULL, *blocks0 = NULL, *out = NULL;
        if (k3_tensor_full(&prefix, 2, th, f32, cpu, 1) != K3_OK ||
            k3_tensor_full(&blocks, 3, tsh, f32, cpu, 1) != K3_OK ||
            k3_tensor_full(&blocks0, 3, t0h, f32, cpu, 1) != K3_OK)
            return 1;
        k3_attn_res_args ar = {.prefix = prefix, .blocks = blocks, .num_blocks = 3,
                               .write_block = 3, .norm_weight = w, .qk_weight = w,
                               .eps = 1e-5, .output_eps = 1e-5};
        CASE("attn_res write_block 3", k3_attn_res(&out, &ar, NULL, NULL));
        ar.num_blocks = 4;
        CASE("attn_res num_blocks 4", k3_attn_res(&out, &ar, NULL, NULL));
        ar.num_blocks = 3;
        ar.qk_weight = a;
        CASE("attn_res qk_weight", k3_attn_res(&out, &ar, NULL, NULL));
        ar.qk_weight = w;
        ar.write_block = -2;
        CASE("attn_res write_block -2", k3_attn_res(&out, &ar, NULL, NULL));
        ar.write_block = 0;
        ar.num_blocks = 0;
        ar.blocks = blocks0;
        CASE("attn_res write_block S=0", k3_attn_res(&out, &ar, NULL, NULL));
        ar.write_block = -1;
        ar.output_eps = NAN;
        CASE("attn_res output_eps nan", k3_attn_res(&out, &ar, NULL, NULL));
        ar.output_eps = -NAN;
        CASE("attn_res output_eps -nan", k3_attn_res(&out, &ar, NULL, NULL));
        ar.output_eps = 1e-5;
        ar.eps = -INFINITY;
        CASE("attn_res eps -inf", k3_attn_res(&out, &ar, NULL, NULL));
        /* ---- 5. an op's output allocation is named after the op (2^46 rows: more bytes
         * than any address space holds, so the allocation fails whatever the overcommit) */
        ar.eps = 1e-5;
        ar.blocks = blocks;
        ar.num_blocks = 1;
        k3_tensor *hp = NULL, *hb = NULL;
        if (k3_tensor_expand(&hp, prefix, 2, (int64_t[2]){1LL << 46, 4}) != K3_OK ||
            k3_tensor_expand(&hb, blocks, 3, (int64_t[3]){1LL << 46, 3, 4}) != K3_OK)
            return 1;
        ar.prefix = hp;
        ar.blocks = hb;
        CASE("attn_res out of memory", k3_attn_res(&out, &ar, NULL, NULL));
        k3_tensor_free(hp);
        k3_tensor_free(hb);
        k3_tensor_free(prefix);
        k3_tensor_free(blocks);
        k3_tensor_free(blocks0);
        k3_tensor_free(out);
    }
    if (k3_tensor_full(&x, 2, s14, f32, cpu, 1) != K3_OK ||
        k3_tensor_expand(&big, x, 2, (int64_t[2]){1LL << 46, 4}) != K3_OK)
        return 1;
    CASE("rms_norm out of memory", k3_rms_norm(&v, big, w, 1e-5, NULL, NULL));
    CASE("silu_mul out of memory", k3_silu_mul(&v, big, NULL, NULL));
    CASE("linear out of memory", k3_linear(&v, big, x, NULL, NULL, NULL, NULL));
    CASE("rms_norm eps nan", k3_rms_norm(&v, x, w, NAN, NULL, NULL));
    CASE("set_host_threads 0", k3_set_host_threads(0));
    CASE("set_host_threads 65", k3_set_host_threads(65));
    {
        /* A tensor past the parallel threshold (2^20 elements) filled by 1 and by 5 host
         * threads: the same values, and the count reads back. */
        int64_t n[1] = {(1 << 21) + 3};
        k3_tensor *one = NULL, *five = NULL;
        double diff = -1;
        k3_status s = k3_set_host_threads(1);
        int got1 = k3_host_threads();
        if (s == K3_OK) s = k3_tensor_randn(&one, 1, n, K3_DTYPE_F64, cpu, 99);
        if (s == K3_OK) s = k3_set_host_threads(5);
        int got5 = k3_host_threads();
        if (s == K3_OK) s = k3_tensor_randn(&five, 1, n, K3_DTYPE_F64, cpu, 99);
        if (s == K3_OK) s = k3_max_abs_diff(one, five, &diff);
        printf("randn on 1 and 5 host threads\t%s\t%d %d %g\n", k3_status_name(s), got1, got5,
               diff);
        fflush(stdout);
        k3_tensor_free(one);
        k3_tensor_free(five);
    }

    /* ---- 3. writes through overlapping views ---- */
    {
        k3_tensor *b2 = NULL, *ov = NULL, *src = NULL, *z24 = NULL;
        if (k3_tensor_expand(&b2, x, 2, (int64_t[2]){2, 4}) != K3_OK ||
            k3_tensor_full(&z24, 2, (int64_t[2]){2, 4}, f32, cpu, 0) != K3_OK ||
            k3_tensor_from_f64(&src, 2, (int64_t[2]){2, 2}, f32, cpu,
                               (double[4]){1, 2, 3, 4}) != K3_OK ||
            k3_tensor_as_strided(&ov, a, 2, (int64_t[2]){2, 2}, (int64_t[2]){1, 1}, 0) != K3_OK)
            return 1;
        CASE("copy into stride 0", k3_tensor_copy(b2, z24));
        CASE("copy into as_strided overlap", k3_tensor_copy(ov, src));
        CASE("copy view onto itself", k3_tensor_copy(ov, ov));
        CASE("fill through overlap", k3_tensor_fill(ov, 7));
        k3_status st = k3_tensor_get(a, (int64_t[2]){0, 2}, &d);
        report_value("get after fill", st, d);
        CASE("set through overlap", k3_tensor_set(ov, (int64_t[2]){1, 0}, 9));
        st = k3_tensor_get(ov, (int64_t[2]){0, 1}, &d);
        report_value("get after set", st, d);
        k3_tensor *w2 = NULL;
        if (k3_tensor_full(&w2, 1, (int64_t[1]){2}, f32, cpu, 1) != K3_OK) return 1;
        CASE("rms_norm out overlap", k3_rms_norm(NULL, src, w2, 1e-5, ov, NULL));
        k3_tensor_free(w2);
        k3_tensor_free(b2);
        k3_tensor_free(z24);
        k3_tensor_free(ov);
        k3_tensor_free(src);
    }

    /* ---- 4. invalid values ---- */
    CASE("empty cpu index 3", k3_tensor_empty(&v, 1, s4, f32, (k3_device){K3_DEVICE_CPU, 3}));
    CASE("empty device type 5", k3_tensor_empty(&v, 1, s4, f32, (k3_device){(k3_device_type)5, 0}));
    CASE("full cuda index -1", k3_tensor_full(&v, 1, s4, f32, (k3_device){K3_DEVICE_CUDA, -1}, 0));
    CASE("randn device type 5", k3_tensor_randn(&v, 1, s4, f32, (k3_device){(k3_device_type)5, 0}, 1));
    CASE("to cpu index 1", k3_tensor_to(&v, a, (k3_device){K3_DEVICE_CPU, 1}, f32));
    CASE("layout_fallback 7", k3_policy_set_layout_fallback(pol, 7));
    CASE("layout_fallback 1", k3_policy_set_layout_fallback(pol, 1));
    {
        char buf[32];
        printf("device_name type 5\tK3_OK\t%s\n",
               k3_device_name((k3_device){(k3_device_type)5, 0}, buf, sizeof buf));
        printf("device_name NULL buf\tK3_OK\t[%s]\n", k3_device_name(cpu, NULL, 16));
    }

    /* ---- 7. C names: "<function>: <argument> ...", the function without its k3_ prefix ---- */
    {
        k3_method *m = NULL;
        CASE("dist_all_reduce t", k3_dist_all_reduce(NULL, K3_DIST_SUM));
        CASE("dist_all_reduce op", k3_dist_all_reduce(a, (k3_dist_op)7));
        CASE("dist_all_gather out", k3_dist_all_gather(NULL, a));
        CASE("dist_all_gather t", k3_dist_all_gather(&v, NULL));
        CASE("dist_get_stats out", k3_dist_get_stats(NULL, 0));
        report_counted("set_allocator live", k3_set_allocator(NULL, NULL));
        CASE("method_low_latency out", k3_method_low_latency(NULL, NULL, 0, NULL));
        CASE("method_low_latency plan", k3_method_low_latency(&m, NULL, 1, NULL));
        CASE("method_low_latency n", k3_method_low_latency(&m, NULL, -1, NULL));
        CASE("method_apply m", k3_method_apply(NULL, &v, a, a, NULL, NULL, NULL, NULL));
        CASE("policy_set_batch_invariant p", k3_policy_set_batch_invariant(NULL, 1));
        k3_method_free(m);
    }

    /* ---- 8. more refusals a C caller can reach: each names the function and the value ---- */
    {
        k3_method *m = NULL;
        const k3_plan_entry twice[2] = {{.m = 3, .kernel = "skinny"}, {.m = 3, .kernel = NULL}};
        CASE("method_low_latency M twice", k3_method_low_latency(&m, twice, 2, NULL));
        printf("method_low_latency M twice out\tK3_OK\t%s\n", m ? "set" : "NULL");
        const k3_plan_entry balanced[1] = {{.m = 2, .kernel = "skinny", .rows = 16, .balanced = 2}};
        CASE("method_low_latency balanced 2", k3_method_low_latency(&m, balanced, 1, NULL));
        const k3_plan_entry prefetch[1] = {{.m = 5, .kernel = "skinny", .l2_prefetch_mb = 41}};
        CASE("method_low_latency l2_prefetch_mb 41", k3_method_low_latency(&m, prefetch, 1, NULL));
        const char *one[1] = {"cpu.linear.blas"};
        CASE("policy_set_candidates unknown op", k3_policy_set_candidates(pol, "matmul", one, 1));
        const char *many[17];
        for (int i = 0; i < 17; i++) many[i] = "cpu.linear.blas";
        CASE("policy_set_candidates 17", k3_policy_set_candidates(pol, "linear", many, 17));
        CASE("linear y and out NULL", k3_linear(NULL, a, a, NULL, NULL, NULL, NULL));
        CASE("attn_res args NULL", k3_attn_res(&v, NULL, NULL, NULL));
        int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        CASE("empty 9 dims", k3_tensor_empty(&v, 9, s9, f32, cpu));
        CASE("empty dtype 7", k3_tensor_empty(&v, 1, s4, (k3_dtype)7, cpu));
        CASE("binary op 9", k3_tensor_binary(&v, (k3_binop)9, a, a));
        /* A method's record when dispatch's prologue refuses the arguments: op "linear",
         * nothing chosen, the method's own decline, its plan lookup's (C numbers dims from 0). */
        k3_tensor *xb = NULL, *wb = NULL;
        k3_dispatch rec;
        memset(&rec, 0x55, sizeof rec); /* whatever was there before */
        k3_call call = {.explain_only = 1, .record = &rec};
        if (k3_method_low_latency(&m, NULL, 0, NULL) != K3_OK ||
            k3_tensor_full(&xb, 2, (int64_t[2]){1, 7}, K3_DTYPE_BF16, cpu, 1) != K3_OK ||
            k3_tensor_full(&wb, 2, (int64_t[2]){2, 8}, K3_DTYPE_BF16, cpu, 1) != K3_OK)
            return 1;
        CASE("method_apply K mismatch", k3_method_apply(m, NULL, xb, wb, NULL, NULL, NULL, &call));
        printf("method_apply K mismatch record\tK3_OK\top=%s chosen=[%s] n=%d %s: %s\n", rec.op,
               rec.chosen, rec.ndeclined, rec.ndeclined > 0 ? rec.declined[0].kernel : "",
               rec.ndeclined > 0 ? rec.declined[0].reason : "");
        k3_tensor_free(xb);
        k3_tensor_free(wb);
        k3_method_free(m);
    }

    /* ---- 6. scalar arithmetic rounds once ---- */
    {
        k3_tensor *one = NULL, *r = NULL;
        int64_t s1[1] = {1};
        const k3_dtype dts[4] = {K3_DTYPE_BF16, K3_DTYPE_F16, K3_DTYPE_F32, K3_DTYPE_F64};
        /* 1 * (1 + 2^-8 + 2^-40) in bf16: exactly above the tie 1 + 2^-8, so 1 + 2^-7; the
         * scalar rounded to f32 first (1 + 2^-8) would tie to even, 1. Likewise one ulp
         * above each narrower format's tie. */
        const double sc[4] = {1 + 0x1p-8 + 0x1p-40, 1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-24 + 0x1p-50,
                              1 + 0x1p-52};
        for (int i = 0; i < 4; i++) {
            char name[64];
            if (k3_tensor_full(&one, 1, s1, dts[i], cpu, 1) != K3_OK) return 1;
            snprintf(name, sizeof name, "mul scalar %s", k3_dtype_name(dts[i]));
            k3_status s = k3_tensor_binary_scalar(&r, K3_MUL, one, sc[i], 0);
            if (s == K3_OK) s = k3_tensor_get(r, (int64_t[1]){0}, &d);
            report_value(name, s, d);
            k3_tensor_free(r);
            snprintf(name, sizeof name, "add scalar first %s", k3_dtype_name(dts[i]));
            s = k3_tensor_binary_scalar(&r, K3_ADD, one, sc[i] - 1, 1);
            if (s == K3_OK) s = k3_tensor_get(r, (int64_t[1]){0}, &d);
            report_value(name, s, d);
            k3_tensor_free(r);
            k3_tensor_free(one);
            r = one = NULL;
        }
    }
    /* ---- 9. long input: an echoed name shows its first 200 bytes, marked as cut; a message
     * longer than the 1 KB buffer keeps its start and its end (the reason) ---- */
    {
        size_t n = 10u << 20;
        char *huge = malloc(n + 1);
        if (!huge) return 1;
        memset(huge, 'x', n);
        huge[n] = '\0';
        k3_dtype dt;
        k3_device dev;
        CASE("dtype_parse 10 MB name", k3_dtype_parse(huge, &dt));
        CASE("device_parse 10 MB text", k3_device_parse(huge, &dev));
        const char *names[1] = {huge};
        CASE("policy_set_candidates 10 MB kernel", k3_policy_set_candidates(pol, "linear", names, 1));
        free(huge);
        char path[1200] = "/nonexistent";
        for (int i = 0; i < 11; i++) strcat(path, "/ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd");
        strcat(path, "/k3.safetensors");
        k3_safetensors *st = NULL;
        CASE("safetensors_load 1,100-byte path", k3_safetensors_load(path, &st));
    }
    /* k3_int64_to_dtype rounds an integer past 2^53 once (a double first would round twice) */
    printf("int64_to_dtype f32\tK3_OK\t%a\n",
           k3_int64_to_dtype(((int64_t)1 << 55) + ((int64_t)1 << 31) + 1, K3_DTYPE_F32));
    printf("int64_to_dtype bf16\tK3_OK\t%a\n",
           k3_int64_to_dtype(((int64_t)1 << 60) + ((int64_t)1 << 52) + 1, K3_DTYPE_BF16));
    /* ---- 10. tensor ops in C terms: 0-based dims, dim -1 for all, indices from index_base ---- */
    {
        k3_tensor *t = NULL, *r = NULL, *ix = NULL;
        CASE("sum dim 2 of 2 dims", k3_sum(&v, a, 2, NULL, NULL));
        CASE("max dim -2", k3_max(&v, NULL, a, -2, 0, NULL, NULL));
        if (k3_tensor_empty(&t, 2, (int64_t[2]){0, 3}, f32, cpu) != K3_OK) return 1;
        CASE("max of an empty dim 0", k3_max(&v, NULL, t, 0, 0, NULL, NULL));
        k3_tensor_free(t);
        if (k3_tensor_arange(&t, 5, -1, 6, f32, cpu) != K3_OK) return 1; /* 5 4 3 2 1 0 */
        k3_status s = k3_min(&r, &ix, t, -1, 0, NULL, NULL);
        if (s == K3_OK) s = k3_tensor_get(ix, NULL, &d);
        report_value("min index over all, base 0", s, d);
        k3_tensor_free(r);
        k3_tensor_free(ix);
        s = k3_sum(&r, t, 0, NULL, NULL);
        if (s == K3_OK) s = k3_tensor_get(r, (int64_t[1]){0}, &d);
        report_value("sum over dim 0", s, d);
        k3_tensor_free(r);
        const k3_tensor *two[2] = {t, a};
        CASE("cat of 1-dim and 2-dim", k3_tensor_cat(&r, two, 2, 0));
        CASE("cat of none", k3_tensor_cat(&r, two, 0, 0));
        k3_tensor_free(t);
    }
    /* ---- 8. the last error is per thread (see thread_a/thread_b) ---- */
    {
        thread_case ca = {a, K3_OK, ""}, cb = {a, K3_OK, ""};
        pthread_t ta, tb;
        k3_status s = k3_tensor_empty(&v, 1, (int64_t[1]){-1}, f32, cpu); /* main's own */
        if (pthread_create(&ta, NULL, thread_a, &ca) != 0 ||
            pthread_create(&tb, NULL, thread_b, &cb) != 0)
            return 1;
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        report_thread("thread A reads its own after B fails", &ca);
        report_thread("thread B reads its own after A fails", &cb);
        report("main thread keeps its own", s);
    }

    k3_policy_free(pol);
    k3_tensor_free(a);
    k3_tensor_free(w);
    k3_tensor_free(x);
    k3_tensor_free(big);
    printf("done\n");
    return 0;
}
