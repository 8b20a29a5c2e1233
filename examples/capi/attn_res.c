/*
 * attn_res.c — k3 from C with no Lua: builds seeded bf16 inputs, runs one AttnRes read
 * (fused delta add and block write) through k3_attn_res, and prints the result as exact hex
 * floats so a caller (spec/capi_spec.lua) can compare it with the same read made from Lua.
 * Usage: attn_res [T S H num_blocks write_block seed]   (0-based write_block, -1 for none)
 */
#include <stdio.h>
#include <stdlib.h>

#include <k3.h>

/* Prints the failed call and the thread's message, and makes main return 1. */
#define CHECK(call)                                                                          \
    do {                                                                                     \
        k3_status s_ = (call);                                                               \
        if (s_ != K3_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s: %s\n", #call, k3_status_name(s_), k3_last_error()); \
            rc = 1;                                                                          \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

static int print_tensor(const char *name, const k3_tensor *t) {
    int64_t n = k3_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!v || k3_tensor_to_f64(t, v) != K3_OK) {
        free(v);
        return 0;
    }
    printf("%s", name);
    for (int64_t i = 0; i < n; i++) printf(" %a", v[i]);
    printf("\n");
    free(v);
    return 1;
}

int main(int argc, char **argv) {
    int64_t T = 3, S = 4, H = 96, num_blocks = 3, write_block = 3;
    uint64_t seed = 7;
    if (argc == 7) {
        T = atoll(argv[1]), S = atoll(argv[2]), H = atoll(argv[3]);
        num_blocks = atoll(argv[4]), write_block = atoll(argv[5]), seed = strtoull(argv[6], NULL, 10);
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [T S H num_blocks write_block seed]\n", argv[0]);
        return 2;
    }
    int rc = 0;
    const k3_device cpu = {K3_DEVICE_CPU, 0};
    const k3_dtype bf16 = K3_DTYPE_BF16;
    k3_tensor *prefix = NULL, *delta = NULL, *blocks = NULL, *norm = NULL, *query = NULL,
              *onorm = NULL, *out = NULL, *bad = NULL;
    int64_t th[2] = {T, H}, tsh[3] = {T, S, H}, h[1] = {H};

    printf("k3 %s (header %d.%d.%d)\n", K3_VERSION_STRING, K3_VERSION_MAJOR, K3_VERSION_MINOR,
           K3_VERSION_PATCH);
    /* The same seeds as the Lua side: k3.randn(shape, {dtype = "bf16", seed = seed + i}). */
    CHECK(k3_tensor_randn(&prefix, 2, th, bf16, cpu, seed + 0));
    CHECK(k3_tensor_randn(&delta, 2, th, bf16, cpu, seed + 1));
    CHECK(k3_tensor_randn(&blocks, 3, tsh, bf16, cpu, seed + 2));
    CHECK(k3_tensor_randn(&norm, 1, h, bf16, cpu, seed + 3));
    CHECK(k3_tensor_randn(&query, 1, h, bf16, cpu, seed + 4));
    CHECK(k3_tensor_full(&onorm, 1, h, bf16, cpu, 1.5));

    k3_attn_res_args a = {.prefix = prefix, .delta = delta, .blocks = blocks,
                          .num_blocks = num_blocks, .write_block = write_block,
                          .norm_weight = norm, .qk_weight = query, .output_norm_weight = onorm,
                          .eps = 1e-5, .output_eps = 1e-5};
    k3_dispatch record;
    k3_call call = {.record = &record};
    CHECK(k3_attn_res(&out, &a, NULL, &call));
    printf("chosen %s\n", record.chosen);
    if (!print_tensor("out", out) || !print_tensor("prefix", prefix) ||
        !print_tensor("blocks", blocks)) {
        fprintf(stderr, "k3_tensor_to_f64: %s\n", k3_last_error());
        rc = 1;
        goto done;
    }

    /* A caller error is a status and a message, never a crash: H mismatch in qk_weight. */
    int64_t h1[1] = {H + 1};
    CHECK(k3_tensor_randn(&bad, 1, h1, bf16, cpu, 1));
    a.qk_weight = bad;
    k3_tensor *unused = NULL;
    k3_status s = k3_attn_res(&unused, &a, NULL, NULL);
    printf("bad call: %s: %s\n", k3_status_name(s), k3_last_error());
    k3_tensor_free(unused);

done:
    k3_tensor_free(prefix);
    k3_tensor_free(delta);
    k3_tensor_free(blocks);
    k3_tensor_free(norm);
    k3_tensor_free(query);
    k3_tensor_free(onorm);
    k3_tensor_free(out);
    k3_tensor_free(bad);
    k3_tensor_free(NULL); /* a no-op, as every k3_*_free */
    return rc;
}
