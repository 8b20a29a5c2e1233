/*
 * fuzz_safetensors.c — libFuzzer target over k3_safetensors_load: the input bytes are
 * written to a temporary file (the loader takes a path) and loaded. A rejected file must
 * give K3_EFORMAT/K3_EIO with a message naming the file; an accepted one must hand out
 * tensors whose every byte can be read, whose sizes tile the data section exactly, whose
 * names are valid UTF-8, and which survive a save and reload unchanged.
 */
#include "fuzz_common.h"

#include <fcntl.h>
#include <unistd.h>

static char in_path[64], out_path[64];

static void paths(void) {
    if (in_path[0]) return;
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(in_path, sizeof in_path, "%s/k3fuzz-st-%010d.in", dir, (int)getpid());
    snprintf(out_path, sizeof out_path, "%s/k3fuzz-st-%010d.out", dir, (int)getpid());
}

static void cleanup(void) {
    unlink(in_path);
    unlink(out_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    paths();
    static int registered;
    if (!registered) registered = !atexit(cleanup);
    FILE *fp = fopen(in_path, "wb");
    FZ_CHECK(fp);
    FZ_CHECK(fwrite(data, 1, size, fp) == size || size == 0);
    fclose(fp);

    k3_safetensors *st = (k3_safetensors *)1;
    k3_status s = k3_safetensors_load(in_path, &st);
    if (s != K3_OK) {
        FZ_CHECK_ERROR(s);
        FZ_CHECK(s == K3_EFORMAT || s == K3_EIO || s == K3_ENOMEM);
        FZ_CHECK(st == NULL);
        FZ_CHECK(strstr(k3_last_error(), in_path) != NULL);
        return 0;
    }
    int n = k3_safetensors_count(st);
    FZ_CHECK(n >= 0);
    int64_t total = 0;
    const char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    k3_tensor **ts = calloc((size_t)(n ? n : 1), sizeof *ts);
    for (int i = 0; i < n; i++) {
        names[i] = k3_safetensors_name(st, i);
        FZ_CHECK(names[i] != NULL);
        FZ_CHECK(k3_safetensors_tensor(st, i, &ts[i]) == K3_OK);
        int64_t numel = k3_tensor_numel(ts[i]);
        FZ_CHECK(k3_tensor_is_contiguous(ts[i]));
        /* Bytes in the file: FP8 entries load as bf16, twice their size. */
        k3_safetensors_entry e;
        FZ_CHECK(k3_safetensors_describe(st, i, &e) == K3_OK && e.loadable && e.ndim == k3_tensor_ndim(ts[i]));
        FZ_CHECK(strcmp(e.name, names[i]) == 0 && k3_safetensors_find(st, names[i]) == i);
        total += numel * (strncmp(e.dtype, "F8_", 3) == 0 ? 1 : (int64_t)k3_dtype_size(k3_tensor_dtype(ts[i])));
        double *v = malloc(sizeof(double) * (size_t)(numel ? numel : 1));
        FZ_CHECK(v && k3_tensor_to_f64(ts[i], v) == K3_OK);
        free(v);
    }
    FZ_CHECK(k3_safetensors_name(st, n) == NULL && k3_safetensors_name(st, -1) == NULL);
    k3_tensor *bad = NULL;
    FZ_CHECK(k3_safetensors_tensor(st, n, &bad) == K3_EINVAL && bad == NULL);
    /* The data section is exactly the tensors' bytes: file = 8 + header + data. */
    FZ_CHECK(total <= (int64_t)size - 8);

    /* Names that save accepts (non-empty; "__metadata__" is never a tensor name) round trip. */
    bool savable = true;
    for (int i = 0; i < n; i++) savable &= names[i][0] != '\0';
    if (savable && n > 0) {
        FZ_CHECK(k3_safetensors_save(out_path, n, names, (const k3_tensor *const *)ts) == K3_OK);
        k3_safetensors *again = NULL;
        FZ_CHECK(k3_safetensors_load(out_path, &again) == K3_OK);
        FZ_CHECK(k3_safetensors_count(again) == n);
        for (int j = 0; j < n; j++) {
            const char *nm = k3_safetensors_name(again, j);
            int i = 0;
            while (i < n && strcmp(names[i], nm) != 0) i++;
            FZ_CHECK(i < n);
            k3_tensor *u = NULL;
            FZ_CHECK(k3_safetensors_tensor(again, j, &u) == K3_OK);
            FZ_CHECK(k3_tensor_dtype(u) == k3_tensor_dtype(ts[i]) &&
                     k3_tensor_ndim(u) == k3_tensor_ndim(ts[i]));
            size_t nb = (size_t)k3_tensor_numel(u) * k3_dtype_size(k3_tensor_dtype(u));
            FZ_CHECK(nb == (size_t)k3_tensor_numel(ts[i]) * k3_dtype_size(k3_tensor_dtype(ts[i])));
            FZ_CHECK(nb == 0 || memcmp(k3_tensor_data(u), k3_tensor_data(ts[i]), nb) == 0);
            k3_tensor_free(u);
        }
        k3_safetensors_free(again);
    }
    k3_safetensors_free(st); /* the names go with it; tensors handed out stay valid */
    for (int i = 0; i < n; i++) FZ_CHECK(k3_tensor_check(ts[i], "t") == K3_OK && (k3_tensor_numel(ts[i]) == 0 || k3_tensor_data(ts[i])));
    for (int i = 0; i < n; i++) k3_tensor_free(ts[i]);
    free(ts);
    free(names);
    return 0;
}
