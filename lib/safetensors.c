/*
 * safetensors.c — reads and writes the safetensors format (8-byte little-endian header
 * length, a JSON header, then the raw little-endian data). Every field of the header is
 * validated against the file size before a single data byte is read, so a truncated or
 * malicious file is an error naming the tensor and the problem, never an out-of-bounds read.
 */
#include "k3_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation's cap: a header this large is an attack, not a model. */
#define K3_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Integers in the header arrive as JSON numbers (doubles): beyond 2^53 they are not exact. */
#define K3_ST_MAX_INT ((double)(1LL << 53))

typedef struct k3_st_entry {
    char *name;
    k3_tensor *tensor;
    /* Filled while validating; kept so errors and the range check can name the tensor. */
    k3_dtype dtype;
    int ndim;
    int64_t shape[K3_MAX_DIMS];
    int64_t begin, end;
} k3_st_entry;

struct k3_safetensors {
    int count;
    int capacity; /* entries allocated (count may stop short on a failed header) */
    k3_st_entry *entries;
};

static const struct {
    const char *name;
    k3_dtype dtype;
} k3_st_dtypes[] = {
    {"BF16", K3_DTYPE_BF16}, {"F16", K3_DTYPE_F16}, {"F32", K3_DTYPE_F32}, {"F64", K3_DTYPE_F64}};

static char *st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = k3_host_alloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void st_strfree(char *s) {
    if (s) k3_host_free(s, strlen(s) + 1);
}

static bool st_little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Reverses each element's bytes in place (only on big-endian hosts: the format is LE). */
static void st_swap_bytes(void *data, int64_t numel, size_t esize) {
    unsigned char *p = data;
    for (int64_t i = 0; i < numel; i++, p += esize)
        for (size_t a = 0, b = esize - 1; a < b; a++, b--) {
            unsigned char c = p[a];
            p[a] = p[b];
            p[b] = c;
        }
}

void k3_safetensors_free(k3_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->count; i++) {
        st_strfree(st->entries[i].name);
        k3_tensor_free(st->entries[i].tensor);
    }
    if (st->entries) k3_host_free(st->entries, (size_t)st->capacity * sizeof(k3_st_entry));
    k3_host_free(st, sizeof *st);
}

int k3_safetensors_count(const k3_safetensors *st) { return st ? st->count : 0; }

const char *k3_safetensors_name(const k3_safetensors *st, int i) {
    if (!st || i < 0 || i >= st->count) return NULL;
    return st->entries[i].name;
}

k3_status k3_safetensors_tensor(const k3_safetensors *st, int i, k3_tensor **out) {
    if (!out) return k3_error(K3_EINVAL, "safetensors_tensor: out is NULL");
    *out = NULL;
    if (!st) return k3_error(K3_EINVAL, "safetensors_tensor: file handle is NULL");
    if (i < 0 || i >= st->count)
        return k3_error(K3_EINVAL, "safetensors_tensor: index %d out of range (file holds %d tensors)",
                        i, st->count);
    return k3_tensor_alias(out, st->entries[i].tensor);
}

/* An exact non-negative integer below 2^53, or false. */
static bool st_json_uint(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= K3_ST_MAX_INT || floor(d) != d) return false;
    *out = (int64_t)d;
    return true;
}

/* Validates one header entry (everything except its place among the other ranges). */
static k3_status st_parse_entry(const char *path, const cJSON *item, int64_t data_size,
                                k3_st_entry *e) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\": header entry is not a JSON object",
                        path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt))
        return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\": missing or non-string \"dtype\"",
                        path, name);
    bool found = false;
    for (size_t k = 0; k < sizeof k3_st_dtypes / sizeof k3_st_dtypes[0]; k++)
        if (strcmp(dt->valuestring, k3_st_dtypes[k].name) == 0) {
            e->dtype = k3_st_dtypes[k].dtype;
            found = true;
        }
    if (!found)
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: tensor \"%s\": unsupported dtype \"%s\" (k3 reads BF16, F16, F32, F64)",
                        path, name, dt->valuestring);
    if (!cJSON_IsArray(shape))
        return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\": missing or non-array \"shape\"",
                        path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > K3_MAX_DIMS)
        return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\": shape has %d dims (at most %d)",
                        path, name, ndim, K3_MAX_DIMS);
    e->ndim = ndim;
    int64_t numel = 1;
    int d = 0;
    for (const cJSON *s = shape->child; s; s = s->next, d++) {
        if (!st_json_uint(s, &e->shape[d])) {
            if (cJSON_IsNumber(s) && s->valuedouble >= K3_ST_MAX_INT)
                return k3_error(K3_EFORMAT,
                                "safetensors: %s: tensor \"%s\": shape entry %d (%g) is too large "
                                "(sizes must be below 2^53)",
                                path, name, d + 1, s->valuedouble);
            return k3_error(K3_EFORMAT,
                            "safetensors: %s: tensor \"%s\": shape entry %d is not a non-negative integer",
                            path, name, d + 1);
        }
        if (!k3_mul_ok(numel, e->shape[d], &numel))
            return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\": shape element count overflows",
                            path, name);
    }
    int64_t nbytes;
    if (!k3_mul_ok(numel, (int64_t)k3_dtype_size(e->dtype), &nbytes))
        return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\": shape byte size overflows", path,
                        name);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !st_json_uint(offs->child, &e->begin) || !st_json_uint(offs->child->next, &e->end))
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: tensor \"%s\": \"data_offsets\" must be two non-negative integers [begin, end]",
                        path, name);
    if (e->begin > e->end)
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: tensor \"%s\": data_offsets [%lld, %lld] end before they begin",
                        path, name, (long long)e->begin, (long long)e->end);
    if (e->end > data_size)
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: tensor \"%s\": data_offsets [%lld, %lld] out of range: the data section holds %lld bytes",
                        path, name, (long long)e->begin, (long long)e->end, (long long)data_size);
    if (e->end - e->begin != nbytes) {
        char dims[160];
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: tensor \"%s\": shape %s of %s needs %lld bytes but data_offsets [%lld, %lld] hold %lld",
                        path, name, k3_fmt_dims(dims, sizeof dims, e->ndim, e->shape),
                        k3_dtype_name(e->dtype), (long long)nbytes, (long long)e->begin,
                        (long long)e->end, (long long)(e->end - e->begin));
    }
    return K3_OK;
}

static int st_cmp_begin(const void *a, const void *b) {
    const k3_st_entry *x = *(k3_st_entry *const *)a, *y = *(k3_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Like the reference implementation: sorted by offset, the ranges tile the data section
 * exactly — no overlap (two tensors aliasing bytes), no hole, nothing after the last. */
static k3_status st_check_ranges(const char *path, k3_st_entry *entries, int n, int64_t data_size) {
    k3_st_entry **order = k3_host_calloc(n > 0 ? (size_t)n : 1, sizeof *order);
    if (!order) return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    for (int i = 0; i < n; i++) order[i] = &entries[i];
    qsort(order, (size_t)n, sizeof *order, st_cmp_begin);
    k3_status s = K3_OK;
    int64_t pos = 0;
    const char *prev = "";
    for (int i = 0; i < n && s == K3_OK; i++) {
        const k3_st_entry *e = order[i];
        if (e->begin < pos)
            s = k3_error(K3_EFORMAT,
                         "safetensors: %s: tensor \"%s\": data_offsets [%lld, %lld] overlap tensor \"%s\" (which ends at %lld)",
                         path, e->name, (long long)e->begin, (long long)e->end, prev,
                         (long long)pos);
        else if (e->begin > pos)
            s = k3_error(K3_EFORMAT,
                         "safetensors: %s: tensor \"%s\": data_offsets [%lld, %lld] leave a gap: bytes [%lld, %lld) belong to no tensor",
                         path, e->name, (long long)e->begin, (long long)e->end, (long long)pos,
                         (long long)e->begin);
        pos = e->end;
        prev = e->name;
    }
    if (s == K3_OK && pos != data_size)
        s = k3_error(K3_EFORMAT,
                     "safetensors: %s: tensors cover %lld bytes of data but the data section holds %lld",
                     path, (long long)pos, (long long)data_size);
    k3_host_free(order, (n > 0 ? (size_t)n : 1) * sizeof *order);
    return s;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp((*(k3_st_entry *const *)a)->name, (*(k3_st_entry *const *)b)->name);
}

/* Reads exactly n bytes at offset off; the file may have shrunk since it was measured. */
static k3_status st_pread(int fd, const char *path, const char *what, void *buf, size_t n, int64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return k3_error(K3_EIO, "safetensors: %s: reading %s: %s", path, what, strerror(errno));
        if (r == 0)
            return k3_error(K3_EIO,
                            "safetensors: %s: reading %s: file ended after %zu of %zu bytes at offset %lld",
                            path, what, got, n, (long long)off);
        got += (size_t)r;
    }
    return K3_OK;
}

/* Parses and validates the header into st->entries (no tensor allocated yet). */
static k3_status st_parse_header(const char *path, const char *text, size_t len, int64_t data_size,
                                 k3_safetensors *st) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = (at && at >= text && at <= text + len) ? (size_t)(at - text) : 0;
        return k3_error(K3_EFORMAT, "safetensors: %s: header is not valid JSON (error near byte %zu)",
                        path, pos);
    }
    /* The format pads the header with spaces; anything else after the object is garbage. */
    for (const char *p = end; p && p < text + len; p++)
        if (*p != ' ' && *p != '\0') {
            cJSON_Delete(root);
            return k3_error(K3_EFORMAT,
                            "safetensors: %s: header has trailing bytes after the JSON object (at byte %zu)",
                            path, (size_t)(p - text));
        }
    k3_status s = K3_OK;
    if (!cJSON_IsObject(root)) {
        s = k3_error(K3_EFORMAT, "safetensors: %s: header is not a JSON object", path);
        goto done;
    }
    int n = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(it)) {
                s = k3_error(K3_EFORMAT, "safetensors: %s: \"__metadata__\" is not a JSON object", path);
                goto done;
            }
            for (const cJSON *m = it->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    s = k3_error(K3_EFORMAT,
                                 "safetensors: %s: \"__metadata__\" value \"%s\" is not a string", path,
                                 m->string);
                    goto done;
                }
            continue;
        }
        n++;
    }
    if (n > 0) {
        st->entries = k3_host_calloc((size_t)n, sizeof *st->entries);
        if (st->entries) st->capacity = n;
        if (!st->entries) {
            s = k3_error(K3_ENOMEM, "safetensors: %s: out of memory for %d header entries", path, n);
            goto done;
        }
    }
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        k3_st_entry *e = &st->entries[st->count];
        if (!(e->name = st_strdup(it->string))) {
            s = k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
            goto done;
        }
        st->count++;
        if ((s = st_parse_entry(path, it, data_size, e)) != K3_OK) goto done;
    }
    /* cJSON keeps duplicate keys; two tensors under one name is ambiguous, so reject it. */
    if (st->count > 1) {
        k3_st_entry **byname = k3_host_calloc((size_t)st->count, sizeof *byname);
        if (!byname) {
            s = k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
            goto done;
        }
        for (int i = 0; i < st->count; i++) byname[i] = &st->entries[i];
        qsort(byname, (size_t)st->count, sizeof *byname, st_cmp_name);
        for (int i = 1; i < st->count && s == K3_OK; i++)
            if (strcmp(byname[i - 1]->name, byname[i]->name) == 0)
                s = k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\" appears twice in the header",
                             path, byname[i]->name);
        k3_host_free(byname, (size_t)st->count * sizeof *byname);
        if (s != K3_OK) goto done;
    }
    s = st_check_ranges(path, st->entries, st->count, data_size);
done:
    cJSON_Delete(root);
    return s;
}

static k3_status st_load(const char *path, int fd, k3_safetensors *st) {
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return k3_error(K3_EIO, "safetensors: %s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return k3_error(K3_EIO, "safetensors: %s: not a regular file", path);
    int64_t fsize = (int64_t)sb.st_size;
    if (fsize < 8)
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: file is %lld bytes, too short for the 8-byte header length",
                        path, (long long)fsize);
    unsigned char lenbuf[8];
    K3_TRY(st_pread(fd, path, "the header length", lenbuf, 8, 0));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    if (hlen > (uint64_t)(fsize - 8))
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: header length %llu is longer than the file (%lld bytes after the 8-byte length)",
                        path, (unsigned long long)hlen, (long long)(fsize - 8));
    if (hlen > K3_ST_MAX_HEADER)
        return k3_error(K3_EFORMAT, "safetensors: %s: header length %llu exceeds the %llu-byte limit",
                        path, (unsigned long long)hlen, (unsigned long long)K3_ST_MAX_HEADER);
    if (hlen < 2)
        return k3_error(K3_EFORMAT, "safetensors: %s: header length %llu is too short for a JSON object",
                        path, (unsigned long long)hlen);
    char *text = k3_host_alloc((size_t)hlen + 1);
    if (!text) return k3_error(K3_ENOMEM, "safetensors: %s: out of memory for a %llu-byte header", path,
                               (unsigned long long)hlen);
    k3_status s = st_pread(fd, path, "the header", text, (size_t)hlen, 8);
    if (s == K3_OK) {
        text[hlen] = '\0';
        s = st_parse_header(path, text, (size_t)hlen, fsize - 8 - (int64_t)hlen, st);
    }
    k3_host_free(text, (size_t)hlen + 1);
    K3_TRY(s);
    /* Everything is validated: now allocate and read, one tensor at a time. */
    const int64_t base = 8 + (int64_t)hlen;
    const k3_device cpu = {K3_DEVICE_CPU, 0};
    for (int i = 0; i < st->count; i++) {
        k3_st_entry *e = &st->entries[i];
        s = k3_tensor_empty(&e->tensor, e->ndim, e->shape, e->dtype, cpu);
        if (s != K3_OK) {
            char what[512];
            snprintf(what, sizeof what, "safetensors: %s: tensor \"%s\"", path, e->name);
            return k3_error_prefix(s, what);
        }
        size_t nbytes = (size_t)(e->end - e->begin);
        if (nbytes == 0) continue;
        char what[300];
        snprintf(what, sizeof what, "tensor \"%s\"", e->name);
        K3_TRY(st_pread(fd, path, what, k3_tensor_data(e->tensor), nbytes, base + e->begin));
        if (!st_little_endian())
            st_swap_bytes(k3_tensor_data(e->tensor), k3_tensor_numel(e->tensor),
                          k3_dtype_size(e->dtype));
    }
    return K3_OK;
}

k3_status k3_safetensors_load(const char *path, k3_safetensors **out) {
    if (!out) return k3_error(K3_EINVAL, "safetensors_load: out is NULL");
    *out = NULL;
    if (!path) return k3_error(K3_EINVAL, "safetensors_load: path is NULL");
    k3_safetensors *st = k3_host_calloc(1, sizeof *st);
    if (!st) return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        k3_status s = k3_error(K3_EIO, "safetensors: %s: cannot open: %s", path, strerror(errno));
        k3_safetensors_free(st);
        return s;
    }
    k3_status s = st_load(path, fileno(f), st);
    fclose(f);
    if (s != K3_OK) {
        k3_safetensors_free(st);
        return s;
    }
    *out = st;
    return K3_OK;
}

/* ---- save ------------------------------------------------------------------------------ */

/* A growable byte buffer for the header text. */
typedef struct st_buf {
    char *p;
    size_t len, cap;
    bool oom;
} st_buf;

static void st_put(st_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = k3_host_alloc(cap);
        if (!p) {
            b->oom = true;
            return;
        }
        if (b->p) {
            memcpy(p, b->p, b->len);
            k3_host_free(b->p, b->cap);
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void st_puts(st_buf *b, const char *s) { st_put(b, s, strlen(s)); }

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void st_put_json_string(st_buf *b, const char *s) {
    st_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            st_put(b, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            st_put(b, esc, 6);
        } else {
            st_put(b, (const char *)p, 1);
        }
    }
    st_put(b, "\"", 1);
}

static const char *st_dtype_tag(k3_dtype d) {
    for (size_t k = 0; k < sizeof k3_st_dtypes / sizeof k3_st_dtypes[0]; k++)
        if (k3_st_dtypes[k].dtype == d) return k3_st_dtypes[k].name;
    return NULL;
}

static int st_cmp_index_name(const void *a, const void *b, void *names) {
    const char *const *nm = names;
    return strcmp(nm[*(const int *)a], nm[*(const int *)b]);
}

/* Writes n bytes, retrying short writes. path is the caller's, for the message. */
static k3_status st_write(FILE *f, const char *path, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, f) != n)
        return k3_error(K3_EIO, "safetensors_save: %s: write failed: %s", path, strerror(errno));
    return K3_OK;
}

/* Writes the file to f (the temporary file); path is the one the caller passed, which every
 * message names. */
static k3_status st_save_to(FILE *f, const char *path, int n, const char *const *names,
                            const k3_tensor *const *tensors, const int *order) {
    st_buf h = {0};
    st_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t pos = 0;
    for (int j = 0; j < n; j++) {
        int i = order[j];
        const k3_tensor *t = tensors[i];
        char num[64];
        st_puts(&h, ",");
        st_put_json_string(&h, names[i]);
        st_puts(&h, ":{\"dtype\":\"");
        st_puts(&h, st_dtype_tag(k3_tensor_dtype(t)));
        st_puts(&h, "\",\"shape\":[");
        for (int d = 0; d < k3_tensor_ndim(t); d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)k3_tensor_size(t, d));
            st_puts(&h, num);
        }
        int64_t nbytes = k3_tensor_numel(t) * (int64_t)k3_dtype_size(k3_tensor_dtype(t));
        snprintf(num, sizeof num, "],\"data_offsets\":[%lld,%lld]}", (long long)pos,
                 (long long)(pos + nbytes));
        st_puts(&h, num);
        pos += nbytes;
    }
    st_puts(&h, "}");
    /* Pad with spaces so the data section starts 8-byte aligned, as other writers do. */
    while (!h.oom && (h.len % 8) != 0) st_puts(&h, " ");
    if (h.oom) {
        if (h.p) k3_host_free(h.p, h.cap);
        return k3_error(K3_ENOMEM, "safetensors_save: %s: out of memory for the header", path);
    }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    k3_status s = st_write(f, path, lenbuf, 8);
    if (s == K3_OK) s = st_write(f, path, h.p, h.len);
    k3_host_free(h.p, h.cap);
    const k3_device cpu = {K3_DEVICE_CPU, 0};
    for (int j = 0; j < n && s == K3_OK; j++) {
        const k3_tensor *t = tensors[order[j]];
        if (k3_tensor_numel(t) == 0) continue;
        k3_tensor *tmp = NULL;
        const k3_tensor *src = t;
        /* Views, broadcasts and device tensors go through one contiguous host copy. */
        if (k3_tensor_device(t).type != K3_DEVICE_CPU || !k3_tensor_is_contiguous(t) ||
            !st_little_endian()) {
            s = k3_tensor_to(&tmp, t, cpu, k3_tensor_dtype(t));
            if (s != K3_OK) {
                char what[512];
                snprintf(what, sizeof what, "safetensors_save: %s: tensor \"%s\"", path,
                         names[order[j]]);
                return k3_error_prefix(s, what);
            }
            if (!st_little_endian())
                st_swap_bytes(k3_tensor_data(tmp), k3_tensor_numel(tmp),
                              k3_dtype_size(k3_tensor_dtype(tmp)));
            src = tmp;
        }
        s = st_write(f, path, k3_tensor_data(src),
                     (size_t)k3_tensor_numel(src) * k3_dtype_size(k3_tensor_dtype(src)));
        k3_tensor_free(tmp);
    }
    return s;
}

k3_status k3_safetensors_save(const char *path, int n, const char *const *names,
                              const k3_tensor *const *tensors) {
    if (!path) return k3_error(K3_EINVAL, "safetensors_save: path is NULL");
    if (n < 0) return k3_error(K3_EINVAL, "safetensors_save: n is %d (must be >= 0)", n);
    if (n > 0 && !names) return k3_error(K3_EINVAL, "safetensors_save: names is NULL");
    if (n > 0 && !tensors) return k3_error(K3_EINVAL, "safetensors_save: tensors is NULL");
    for (int i = 0; i < n; i++) {
        if (!names[i]) return k3_error(K3_EINVAL, "safetensors_save: names[%d] is NULL", i);
        if (!names[i][0])
            return k3_error(K3_EINVAL, "safetensors_save: %s: names[%d] is empty", path, i);
        if (!tensors[i])
            return k3_error(K3_EINVAL, "safetensors_save: tensors[%d] (\"%s\") is NULL", i,
                            names[i]);
        if (strcmp(names[i], "__metadata__") == 0)
            return k3_error(K3_EINVAL, "safetensors_save: %s: \"__metadata__\" is reserved, not a tensor name",
                            path);
        char what[300];
        snprintf(what, sizeof what, "safetensors_save: tensor \"%s\"", names[i]);
        K3_TRY(k3_tensor_check(tensors[i], what));
        if (!st_dtype_tag(k3_tensor_dtype(tensors[i])))
            return k3_error(K3_EDTYPE, "safetensors_save: tensor \"%s\": dtype not storable", names[i]);
    }
    /* Name order, so the file does not depend on the order a Lua table hands them over. */
    int *order = k3_host_calloc(n > 0 ? (size_t)n : 1, sizeof *order);
    if (!order) return k3_error(K3_ENOMEM, "safetensors_save: out of memory");
    for (int i = 0; i < n; i++) order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, st_cmp_index_name, (void *)names);
    k3_status s = K3_OK;
    for (int j = 1; j < n && s == K3_OK; j++)
        if (strcmp(names[order[j - 1]], names[order[j]]) == 0)
            s = k3_error(K3_EINVAL, "safetensors_save: tensor name \"%s\" given twice", names[order[j]]);
    if (s != K3_OK) {
        k3_host_free(order, (n > 0 ? (size_t)n : 1) * sizeof *order);
        return s;
    }
    /* Written beside the target and renamed, so a failed save never leaves half a file. The
     * rename would replace whatever is at the path, so only a regular file (or nothing) may be
     * there; a symbolic link is followed to the file it names. */
    char *resolved = NULL;
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        if (S_ISLNK(sb.st_mode)) {
            resolved = realpath(path, NULL);
            if (!resolved || stat(resolved, &sb) != 0) {
                s = k3_error(K3_EIO, "safetensors_save: %s: cannot follow the symbolic link: %s",
                             path, strerror(errno));
            }
        }
        if (s == K3_OK && !S_ISREG(sb.st_mode))
            s = k3_error(K3_EIO, "safetensors_save: %s exists and is not a regular file", path);
    }
    if (s != K3_OK) {
        free(resolved); /* realpath's allocation comes from the C library */
        k3_host_free(order, (n > 0 ? (size_t)n : 1) * sizeof *order);
        return s;
    }
    /* Messages name the path the caller passed: the temporary file (and a link's target) is
     * k3's business, and the caller must recognise the file in the error. */
    const char *given = path;
    if (resolved) path = resolved;
    size_t plen = strlen(path) + 16;
    char *tmp_path = k3_host_alloc(plen);
    if (!tmp_path) {
        k3_host_free(order, (n > 0 ? (size_t)n : 1) * sizeof *order);
        return k3_error(K3_ENOMEM, "safetensors_save: out of memory");
    }
    snprintf(tmp_path, plen, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp_path, "wb");
    if (!f) {
        s = k3_error(K3_EIO, "safetensors_save: %s: cannot open for writing: %s", given,
                     strerror(errno));
    } else {
        s = st_save_to(f, given, n, names, tensors, order);
        if (fclose(f) != 0 && s == K3_OK)
            s = k3_error(K3_EIO, "safetensors_save: %s: write failed: %s", given, strerror(errno));
        if (s == K3_OK && rename(tmp_path, path) != 0)
            s = k3_error(K3_EIO, "safetensors_save: %s: cannot move the temporary file %s into "
                                 "place: %s",
                         given, tmp_path, strerror(errno));
        if (s != K3_OK) remove(tmp_path);
    }
    k3_host_free(tmp_path, plen);
    free(resolved);
    k3_host_free(order, (n > 0 ? (size_t)n : 1) * sizeof *order);
    return s;
}
