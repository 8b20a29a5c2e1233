/*
 * safetensors.c — reads and writes the safetensors format (8-byte little-endian header
 * length, a JSON header, then the raw little-endian data), one file or a Hugging Face
 * checkpoint (a directory of shards with model.safetensors.index.json). Headers are parsed
 * with cJSON and every field is validated against the file size before a data byte is read;
 * data is read from a read-only mapping of each shard, only for the tensors asked for, and the
 * mapping is gone before the call returns (tensors own their storage).
 */
#include "k3_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation's cap: a header this large is an attack, not a model. The
 * index file of a sharded checkpoint gets the same cap. */
#define K3_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Integers in the header arrive as JSON numbers (doubles): beyond 2^53 they are not exact. */
#define K3_ST_MAX_INT ((double)(1LL << 53))
#define K3_ST_INDEX_NAME "model.safetensors.index.json"
#define K3_ST_SINGLE_NAME "model.safetensors"

/* The dtypes a header may name (the format's list), with their element size. k3 loads the
 * floating-point ones: its own four and the two FP8 formats, converted exactly. */
enum { ST_F8_NONE = 0, ST_F8_E4M3 = 1, ST_F8_E5M2 = 2 };
static const struct {
    const char *name;
    int size;
    int k3;  /* the k3_dtype it loads as, -1: none */
    int f8;  /* ST_F8_* */
} st_kinds[] = {
    {"BF16", 2, K3_DTYPE_BF16, 0}, {"F16", 2, K3_DTYPE_F16, 0}, {"F32", 4, K3_DTYPE_F32, 0},
    {"F64", 8, K3_DTYPE_F64, 0},   {"F8_E4M3", 1, -1, ST_F8_E4M3}, {"F8_E5M2", 1, -1, ST_F8_E5M2},
    {"BOOL", 1, -1, 0},            {"U8", 1, -1, 0},  {"I8", 1, -1, 0},   {"I16", 2, -1, 0},
    {"U16", 2, -1, 0},             {"I32", 4, -1, 0}, {"U32", 4, -1, 0},  {"I64", 8, -1, 0},
    {"U64", 8, -1, 0},             {"F8_E8M0", 1, -1, 0}};
#define ST_NKINDS ((int)(sizeof st_kinds / sizeof st_kinds[0]))
#define ST_LOADABLE "BF16, F16, F32, F64, F8_E4M3 and F8_E5M2"

typedef struct k3_st_entry {
    char *name;
    k3_tensor *tensor; /* NULL until read */
    int file;          /* index into files */
    int kind;          /* index into st_kinds */
    int ndim;
    int64_t shape[K3_MAX_DIMS];
    int64_t begin, end; /* in the data section */
} k3_st_entry;

typedef struct st_file {
    char *path; /* as opened (the directory joined with the shard's name) */
    char *rel;  /* as k3_safetensors_describe reports it: relative to the directory given */
    int64_t size, base; /* file size when the header was read; 8 + header length */
} st_file;

struct k3_safetensors {
    int count, capacity;
    k3_st_entry *entries;
    int *byname; /* entry indices sorted by name (count of them) */
    int nfiles, fcap;
    st_file *files;
    int nmeta, mcap;
    char **meta; /* key, value, key, value, ... */
};

/* ---- small helpers --------------------------------------------------------------------- */

static char *st_strndup(const char *s, size_t n) {
    char *p = k3_host_alloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}
static char *st_strdup(const char *s) { return st_strndup(s, strlen(s)); }
static void st_strfree(char *s) {
    if (s) k3_host_free(s, strlen(s) + 1);
}

/* Grows *p (an array of *cap elements of `elem` bytes) to hold at least need. */
static bool st_grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int ncap = *cap ? *cap : 8;
    while (ncap < need) ncap *= 2;
    void *q = k3_host_calloc((size_t)ncap, elem);
    if (!q) return false;
    if (*p) {
        memcpy(q, *p, (size_t)*cap * elem);
        k3_host_free(*p, (size_t)*cap * elem);
    }
    *p = q;
    *cap = ncap;
    return true;
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

/* -1 when s[0..n) is valid UTF-8 (shortest forms, no surrogates, at most U+10FFFF), else the
 * byte offset of the first invalid sequence. */
static long st_utf8_invalid_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return (long)i;
        if (i + len > n) return (long)i;
        if (s[i + 1] < lo || s[i + 1] > hi) return (long)i;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return (long)i;
        i += len;
    }
    return -1;
}

/* A name for a message: printable ASCII as it is, every other byte as \xNN, at most about
 * 120 bytes of it. Returns buf. */
static const char *st_escape(char *buf, size_t n, const char *s, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o > 120) {
            o += (size_t)snprintf(buf + o, n - o, "...");
            break;
        }
        if (c >= 0x20 && c < 0x7F) buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, n - o, "\\x%02X", c);
    }
    buf[o < n ? o : n - 1] = '\0';
    return buf;
}

/* A tensor name for save and load: non-empty, valid UTF-8 (a NUL is caught where the length
 * is known: by the JSON scan on load, by the binding on save). */
static k3_status st_check_name(const char *op, const char *path, const char *what, int index,
                               const char *name) {
    if (!name[0])
        return k3_error(K3_EFORMAT, "%s: %s: %s %d has an empty name", op, path, what, index);
    long bad = st_utf8_invalid_at((const unsigned char *)name, strlen(name));
    if (bad >= 0) {
        char e[160];
        return k3_error(K3_EFORMAT, "%s: %s: %s %d: name \"%s\" is not valid UTF-8 (byte %ld)",
                        op, path, what, index, st_escape(e, sizeof e, name, strlen(name)),
                        bad + 1);
    }
    return K3_OK;
}

/* Opens path for reading without ever blocking (O_NONBLOCK: a FIFO opens at once instead of
 * waiting for a writer) and refuses anything but a regular file. The type is read from the
 * descriptor itself (fstat), so there is no window between checking and opening. */
static k3_status st_open(const char *path, int *fd, int64_t *size) {
    *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (*fd < 0) return k3_error(K3_EIO, "safetensors: %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(*fd, &sb) != 0) {
        int e = errno;
        close(*fd);
        return k3_error(K3_EIO, "safetensors: %s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(*fd);
        const char *what = S_ISFIFO(sb.st_mode)  ? "a FIFO"
                           : S_ISDIR(sb.st_mode) ? "a directory"
                           : S_ISCHR(sb.st_mode) ? "a character device"
                           : S_ISBLK(sb.st_mode) ? "a block device"
                           : S_ISSOCK(sb.st_mode) ? "a socket"
                                                  : "not a regular file";
        return k3_error(K3_EIO, "safetensors: %s: not a regular file (%s)", path, what);
    }
    *size = (int64_t)sb.st_size;
    return K3_OK;
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

/* ---- the JSON text, before cJSON sees it -------------------------------------------------- */

/* One pass over the header text finds what cJSON would accept but the format forbids, and
 * counts what parsing will allocate: cJSON allocates through process-wide hooks, which k3
 * must not install (a host may use cJSON itself), so k3 charges an estimate of the parse to
 * its own allocator before parsing: a host that caps k3's memory refuses it there.
 *   - a string holding \u0000: cJSON's strings end at the first NUL, so "a\u0000b" would load
 *     as "a";
 *   - (headers only) a number with a fraction or exponent, or a leading zero: shapes and
 *     offsets are integers, and cJSON reads "8.0" as 8. */
typedef struct st_scan {
    uint64_t nodes, strings;
} st_scan;

static k3_status st_scan_json(const char *path, const char *text, size_t len, bool header,
                              st_scan *sc) {
    sc->nodes = 1;
    sc->strings = 0;
    int depth = 0;
    bool want_key = false;
    const char *key = NULL;
    size_t keylen = 0;
    char e[160];
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == '"') {
            size_t start = ++i;
            bool nul = false;
            while (i < len && text[i] != '"') {
                if (text[i] == '\\') {
                    if (i + 5 < len && text[i + 1] == 'u' && memcmp(text + i + 2, "0000", 4) == 0)
                        nul = true;
                    i += 2;
                } else {
                    i++;
                }
            }
            size_t slen = (i < len ? i : len) - start;
            sc->strings++;
            bool is_key = depth == 1 && want_key;
            if (is_key) {
                key = text + start;
                keylen = slen;
                want_key = false;
            }
            if (nul && is_key)
                return k3_error(K3_EFORMAT,
                                "safetensors: %s: header entry \"%s\": the name contains a NUL "
                                "character (\\u0000)",
                                path, st_escape(e, sizeof e, key, keylen));
            if (nul && key)
                return k3_error(K3_EFORMAT,
                                "safetensors: %s: header entry \"%s\": a string contains a NUL "
                                "character (\\u0000)",
                                path, st_escape(e, sizeof e, key, keylen));
            if (nul)
                return k3_error(K3_EFORMAT, "safetensors: %s: a string contains a NUL character (\\u0000)",
                                path);
            i++;
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
            sc->nodes++;
            if (c == '{' && depth == 1) want_key = true;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',') {
            sc->nodes++;
            if (depth == 1) want_key = true;
        } else if (header && (c == '-' || (c >= '0' && c <= '9'))) {
            size_t s = i;
            while (i < len && strchr("0123456789+-.eE", text[i]) && text[i]) i++;
            size_t digits = s < len && text[s] == '-' ? s + 1 : s;
            bool bad = false;
            for (size_t k = s; k < i; k++) bad |= text[k] == '.' || text[k] == 'e' || text[k] == 'E';
            bad |= i - digits > 1 && text[digits] == '0';
            if (bad && key)
                return k3_error(K3_EFORMAT,
                                "safetensors: %s: tensor \"%s\": %.*s is not an integer (shapes "
                                "and data_offsets are integers)",
                                path, st_escape(e, sizeof e, key, keylen), (int)(i - s > 40 ? 40 : i - s),
                                text + s);
            if (bad)
                return k3_error(K3_EFORMAT, "safetensors: %s: %.*s is not an integer", path,
                                (int)(i - s > 40 ? 40 : i - s), text + s);
            continue;
        }
        i++;
    }
    return K3_OK;
}

/* Parses text (len bytes, NUL-terminated) with cJSON: no byte-order mark, nothing but the
 * format's space padding after the object, the parse's memory charged to k3's allocator. */
static k3_status st_parse_json(const char *path, const char *what, const char *text, size_t len,
                               bool header, cJSON **root) {
    *root = NULL;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: %s starts with a UTF-8 byte-order mark (the format is plain JSON)",
                        path, what);
    st_scan sc;
    K3_TRY(st_scan_json(path, text, len, header, &sc));
    /* cJSON's nodes, its copies of every string, and the allocator's overhead on each. */
    uint64_t cost = sc.nodes * (sizeof(cJSON) + 16) + sc.strings * 32 + (uint64_t)len;
    void *charge = cost < SIZE_MAX ? k3_host_alloc((size_t)cost) : NULL;
    if (!charge)
        return k3_error(K3_ENOMEM,
                        "safetensors: %s: out of memory: parsing the %zu-byte %s takes about %llu bytes",
                        path, len, what, (unsigned long long)cost);
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    k3_host_free(charge, (size_t)cost);
    if (!r) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = (at && at >= text && at <= text + len) ? (size_t)(at - text) : 0;
        return k3_error(K3_EFORMAT, "safetensors: %s: %s is not valid JSON (error near byte %zu)",
                        path, what, pos);
    }
    /* The format pads the header with spaces; anything else after the object is garbage. */
    for (const char *p = end; p && p < text + len; p++)
        if (*p != ' ' && *p != '\0' && !(!header && (*p == '\n' || *p == '\r' || *p == '\t'))) {
            cJSON_Delete(r);
            return k3_error(K3_EFORMAT,
                            "safetensors: %s: %s has trailing bytes after the JSON object (at byte %zu)",
                            path, what, (size_t)(p - text));
        }
    if (!cJSON_IsObject(r)) {
        cJSON_Delete(r);
        return k3_error(K3_EFORMAT, "safetensors: %s: %s is not a JSON object", path, what);
    }
    *root = r;
    return K3_OK;
}

/* ---- the handle -------------------------------------------------------------------------- */

void k3_safetensors_free(k3_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->count; i++) {
        st_strfree(st->entries[i].name);
        k3_tensor_free(st->entries[i].tensor);
    }
    if (st->entries) k3_host_free(st->entries, (size_t)st->capacity * sizeof(k3_st_entry));
    if (st->byname) k3_host_free(st->byname, (size_t)(st->count ? st->count : 1) * sizeof(int));
    for (int i = 0; i < st->nfiles; i++) {
        st_strfree(st->files[i].path);
        st_strfree(st->files[i].rel);
    }
    if (st->files) k3_host_free(st->files, (size_t)st->fcap * sizeof(st_file));
    for (int i = 0; i < 2 * st->nmeta; i++) st_strfree(st->meta[i]);
    if (st->meta) k3_host_free(st->meta, (size_t)st->mcap * sizeof(char *));
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
    if (!st->entries[i].tensor)
        return k3_error(K3_EINVAL, "safetensors_tensor: tensor \"%s\" has not been read",
                        st->entries[i].name);
    return k3_tensor_alias(out, st->entries[i].tensor);
}

k3_status k3_safetensors_describe(const k3_safetensors *st, int i, k3_safetensors_entry *out) {
    if (!out) return k3_error(K3_EINVAL, "safetensors_describe: out is NULL");
    if (!st) return k3_error(K3_EINVAL, "safetensors_describe: file handle is NULL");
    if (i < 0 || i >= st->count)
        return k3_error(K3_EINVAL, "safetensors_describe: index %d out of range (%d tensors)", i,
                        st->count);
    const k3_st_entry *e = &st->entries[i];
    out->name = e->name;
    out->dtype = st_kinds[e->kind].name;
    out->ndim = e->ndim;
    for (int d = 0; d < K3_MAX_DIMS; d++) out->shape[d] = d < e->ndim ? e->shape[d] : 0;
    out->file = st->files[e->file].rel;
    out->loadable = st_kinds[e->kind].k3 >= 0 || st_kinds[e->kind].f8 != ST_F8_NONE;
    return K3_OK;
}

int k3_safetensors_metadata_count(const k3_safetensors *st) { return st ? st->nmeta : 0; }

k3_status k3_safetensors_metadata(const k3_safetensors *st, int i, const char **key,
                                  const char **value) {
    if (!st || !key || !value) return k3_error(K3_EINVAL, "safetensors_metadata: NULL argument");
    if (i < 0 || i >= st->nmeta)
        return k3_error(K3_EINVAL, "safetensors_metadata: index %d out of range (%d entries)", i,
                        st->nmeta);
    *key = st->meta[2 * i];
    *value = st->meta[2 * i + 1];
    return K3_OK;
}

static int st_cmp_name_r(const void *a, const void *b, void *ctx) {
    const k3_st_entry *e = ctx;
    return strcmp(e[*(const int *)a].name, e[*(const int *)b].name);
}

int k3_safetensors_find(const k3_safetensors *st, const char *name) {
    if (!st || !name || !st->byname) return -1;
    int lo = 0, hi = st->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->entries[st->byname[mid]].name, name);
        if (c == 0) return st->byname[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static k3_status st_add_meta(k3_safetensors *st, const char *path, const char *key, const char *value) {
    if (!st_grow((void **)&st->meta, &st->mcap, 2 * st->nmeta + 2, sizeof(char *)))
        return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    char *k = st_strdup(key), *v = st_strdup(value);
    if (!k || !v) {
        st_strfree(k);
        st_strfree(v);
        return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    }
    st->meta[2 * st->nmeta] = k;
    st->meta[2 * st->nmeta + 1] = v;
    st->nmeta++;
    return K3_OK;
}

static k3_status st_add_file(k3_safetensors *st, const char *path, const char *rel) {
    if (!st_grow((void **)&st->files, &st->fcap, st->nfiles + 1, sizeof(st_file)))
        return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    st_file *f = &st->files[st->nfiles];
    memset(f, 0, sizeof *f);
    f->path = st_strdup(path);
    f->rel = st_strdup(rel);
    if (!f->path || !f->rel) {
        st_strfree(f->path);
        st_strfree(f->rel);
        f->path = f->rel = NULL;
        return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    }
    st->nfiles++;
    return K3_OK;
}

/* ---- one file's header ------------------------------------------------------------------- */

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
    e->kind = -1;
    for (int k = 0; k < ST_NKINDS; k++)
        if (strcmp(dt->valuestring, st_kinds[k].name) == 0) e->kind = k;
    if (e->kind < 0) {
        char ec[K3_ECHO_SIZE];
        return k3_error(K3_EFORMAT,
                        "safetensors: %s: tensor \"%s\": unknown dtype \"%s\" (k3 reads " ST_LOADABLE ")",
                        path, name, k3_echo(ec, sizeof ec, dt->valuestring));
    }
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
    if (!k3_mul_ok(numel, (int64_t)st_kinds[e->kind].size, &nbytes))
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
                        st_kinds[e->kind].name, (long long)nbytes, (long long)e->begin,
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

/* Validates a parsed header into new entries of file fi (keep_meta: its __metadata__ becomes
 * the handle's metadata). */
static k3_status st_header_entries(k3_safetensors *st, int fi, const cJSON *root, int64_t data_size,
                                   bool keep_meta) {
    const char *path = st->files[fi].path;
    int first = st->count, n = 0, index = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") != 0) {
            n++;
            continue;
        }
        if (!cJSON_IsObject(it))
            return k3_error(K3_EFORMAT, "safetensors: %s: \"__metadata__\" is not a JSON object", path);
        for (const cJSON *m = it->child; m; m = m->next) {
            if (!cJSON_IsString(m))
                return k3_error(K3_EFORMAT,
                                "safetensors: %s: \"__metadata__\" value \"%s\" is not a string", path,
                                m->string);
            if (keep_meta) K3_TRY(st_add_meta(st, path, m->string, m->valuestring));
        }
    }
    if (!st_grow((void **)&st->entries, &st->capacity, st->count + n, sizeof(k3_st_entry)))
        return k3_error(K3_ENOMEM, "safetensors: %s: out of memory for %d header entries", path, n);
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        index++;
        K3_TRY(st_check_name("safetensors", path, "header entry", index, it->string));
        k3_st_entry *e = &st->entries[st->count];
        memset(e, 0, sizeof *e);
        if (!(e->name = st_strdup(it->string)))
            return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
        e->file = fi;
        st->count++;
        K3_TRY(st_parse_entry(path, it, data_size, e));
    }
    /* A header without tensors may leave entries unallocated: no pointer arithmetic on NULL. */
    return st_check_ranges(path, st->entries ? st->entries + first : NULL, st->count - first,
                           data_size);
}

/* Reads and validates the header of file fi. */
static k3_status st_read_header(k3_safetensors *st, int fi, bool keep_meta) {
    st_file *f = &st->files[fi];
    const char *path = f->path;
    int fd;
    int64_t fsize;
    K3_TRY(st_open(path, &fd, &fsize));
    k3_status s = K3_OK;
    char *text = NULL;
    uint64_t hlen = 0;
    unsigned char lenbuf[8];
    if (fsize < 8) {
        s = k3_error(K3_EFORMAT,
                     "safetensors: %s: file is %lld bytes, too short for the 8-byte header length",
                     path, (long long)fsize);
        goto done;
    }
    if ((s = st_pread(fd, path, "the header length", lenbuf, 8, 0)) != K3_OK) goto done;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    if (hlen > (uint64_t)(fsize - 8))
        s = k3_error(K3_EFORMAT,
                     "safetensors: %s: header length %llu is longer than the file (%lld bytes after the 8-byte length)",
                     path, (unsigned long long)hlen, (long long)(fsize - 8));
    else if (hlen > K3_ST_MAX_HEADER)
        s = k3_error(K3_EFORMAT, "safetensors: %s: header length %llu exceeds the %llu-byte limit",
                     path, (unsigned long long)hlen, (unsigned long long)K3_ST_MAX_HEADER);
    else if (hlen < 2)
        s = k3_error(K3_EFORMAT, "safetensors: %s: header length %llu is too short for a JSON object",
                     path, (unsigned long long)hlen);
    else if (!(text = k3_host_alloc((size_t)hlen + 1)))
        s = k3_error(K3_ENOMEM, "safetensors: %s: out of memory for a %llu-byte header", path,
                     (unsigned long long)hlen);
    else if ((s = st_pread(fd, path, "the header", text, (size_t)hlen, 8)) == K3_OK) {
        text[hlen] = '\0';
        cJSON *root = NULL;
        s = st_parse_json(path, "header", text, (size_t)hlen, true, &root);
        if (s == K3_OK) s = st_header_entries(st, fi, root, fsize - 8 - (int64_t)hlen, keep_meta);
        cJSON_Delete(root);
    }
done:
    if (text) k3_host_free(text, (size_t)hlen + 1);
    close(fd);
    f->size = fsize;
    /* hlen is bounded by the file only once the header was accepted (a rejected length may be
     * up to 2^64 - 1): no offset from it otherwise. */
    f->base = s == K3_OK ? 8 + (int64_t)hlen : 0;
    return s;
}

/* ---- checkpoints: a file, a directory, an index ------------------------------------------- */

/* "dir/name" in k3 memory. */
static char *st_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = k3_host_alloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static const char *st_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* A shard's name from the index: a relative path inside the index's directory. */
static bool st_safe_shard(const char *s) {
    if (!s[0] || s[0] == '/') return false;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 0 || (n == 2 && p[0] == '.' && p[1] == '.') || (n == 1 && p[0] == '.')) return false;
        p += n + (q ? 1 : 0);
    }
    return true;
}

static int st_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static k3_status st_index_names(k3_safetensors *st, const char *path);

/* The index of a sharded checkpoint: {"metadata": {...}, "weight_map": {tensor: shard}}. Every
 * shard's header is read; the tensors are exactly the weight_map's, each in the shard it
 * names. The index's metadata (strings and numbers) becomes the handle's metadata. */
static k3_status st_open_index(k3_safetensors *st, const char *index_path, const char *dir) {
    int fd;
    int64_t fsize;
    K3_TRY(st_open(index_path, &fd, &fsize));
    if ((uint64_t)fsize > K3_ST_MAX_HEADER) {
        close(fd);
        return k3_error(K3_EFORMAT, "safetensors: %s: index is %lld bytes, over the %llu-byte limit",
                        index_path, (long long)fsize, (unsigned long long)K3_ST_MAX_HEADER);
    }
    char *text = k3_host_alloc((size_t)fsize + 1);
    if (!text) {
        close(fd);
        return k3_error(K3_ENOMEM, "safetensors: %s: out of memory for the index", index_path);
    }
    k3_status s = st_pread(fd, index_path, "the index", text, (size_t)fsize, 0);
    close(fd);
    cJSON *root = NULL;
    if (s == K3_OK) {
        text[fsize] = '\0';
        s = st_parse_json(index_path, "index", text, (size_t)fsize, false, &root);
    }
    k3_host_free(text, (size_t)fsize + 1);
    K3_TRY(s);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    char ec[160];
    const char **shards = NULL;
    int nshards = 0, nmap = 0;
    if (!cJSON_IsObject(map)) {
        s = k3_error(K3_EFORMAT, "safetensors: %s: index has no \"weight_map\" object", index_path);
        goto done;
    }
    if (meta && !cJSON_IsObject(meta)) {
        s = k3_error(K3_EFORMAT, "safetensors: %s: index \"metadata\" is not a JSON object", index_path);
        goto done;
    }
    for (const cJSON *m = meta ? meta->child : NULL; m && s == K3_OK; m = m->next) {
        char num[64];
        if (cJSON_IsString(m)) s = st_add_meta(st, index_path, m->string, m->valuestring);
        else if (cJSON_IsNumber(m)) {
            if (floor(m->valuedouble) == m->valuedouble && fabs(m->valuedouble) < K3_ST_MAX_INT)
                snprintf(num, sizeof num, "%lld", (long long)m->valuedouble);
            else
                snprintf(num, sizeof num, "%.17g", m->valuedouble);
            s = st_add_meta(st, index_path, m->string, num);
        }
    }
    if (s != K3_OK) goto done;
    for (const cJSON *m = map->child; m; m = m->next) nmap++;
    shards = k3_host_calloc((size_t)(nmap ? nmap : 1), sizeof *shards);
    if (!shards) {
        s = k3_error(K3_ENOMEM, "safetensors: %s: out of memory", index_path);
        goto done;
    }
    int idx = 0;
    for (const cJSON *m = map->child; m; m = m->next) {
        idx++;
        if ((s = st_check_name("safetensors", index_path, "weight_map entry", idx, m->string)) != K3_OK)
            goto done;
        if (!cJSON_IsString(m) || !st_safe_shard(m->valuestring)) {
            s = k3_error(K3_EFORMAT,
                         "safetensors: %s: weight_map \"%s\": the shard must be a file name inside "
                         "the index's directory",
                         index_path, st_escape(ec, sizeof ec, m->string, strlen(m->string)));
            goto done;
        }
        shards[nshards++] = m->valuestring;
    }
    qsort(shards, (size_t)nshards, sizeof *shards, st_cmp_str);
    int distinct = 0;
    for (int i = 0; i < nshards; i++)
        if (i == 0 || strcmp(shards[i], shards[i - 1]) != 0) shards[distinct++] = shards[i];
    for (int i = 0; i < distinct && s == K3_OK; i++) {
        char *full = st_join(dir, shards[i]);
        if (!full) {
            s = k3_error(K3_ENOMEM, "safetensors: %s: out of memory", index_path);
            break;
        }
        s = st_add_file(st, full, shards[i]);
        k3_host_free(full, strlen(full) + 1);
        if (s == K3_OK) s = st_read_header(st, st->nfiles - 1, false);
    }
    if (s != K3_OK) goto done;
    /* No tensor in two shards; every tensor in the shard the map names; every shard tensor in
     * the map. */
    if ((s = st_index_names(st, index_path)) != K3_OK) goto done;
    for (const cJSON *m = map->child; m && s == K3_OK; m = m->next) {
        int found = k3_safetensors_find(st, m->string);
        if (found < 0 || strcmp(st->files[st->entries[found].file].rel, m->valuestring) != 0)
            s = k3_error(K3_EFORMAT,
                         "safetensors: %s: weight_map puts tensor \"%s\" in %s, whose header has no such tensor",
                         index_path, st_escape(ec, sizeof ec, m->string, strlen(m->string)),
                         m->valuestring);
    }
    if (s == K3_OK && st->count > nmap) {
        /* More tensors than map entries: name one the map does not list. */
        for (int i = 0; i < st->count && s == K3_OK; i++) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(map, st->entries[i].name);
            if (!m || strcmp(m->valuestring, st->files[st->entries[i].file].rel) != 0)
                s = k3_error(K3_EFORMAT,
                             "safetensors: %s: tensor \"%s\" of %s is not in the index's weight_map",
                             index_path, st->entries[i].name, st->files[st->entries[i].file].rel);
        }
    }
done:
    if (shards) k3_host_free(shards, (size_t)(nmap ? nmap : 1) * sizeof *shards);
    cJSON_Delete(root);
    return s;
}

/* Sorts the names into st->byname and refuses a name given twice (cJSON keeps duplicate keys,
 * and shards may repeat a tensor: either is ambiguous). */
static k3_status st_index_names(k3_safetensors *st, const char *path) {
    st->byname = k3_host_calloc((size_t)(st->count ? st->count : 1), sizeof(int));
    if (!st->byname) return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    for (int i = 0; i < st->count; i++) st->byname[i] = i;
    qsort_r(st->byname, (size_t)st->count, sizeof(int), st_cmp_name_r, st->entries);
    for (int i = 1; i < st->count; i++) {
        const k3_st_entry *a = &st->entries[st->byname[i - 1]], *b = &st->entries[st->byname[i]];
        if (strcmp(a->name, b->name) != 0) continue;
        if (a->file == b->file)
            return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\" appears twice in the header",
                            st->files[a->file].path, b->name);
        return k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\" appears in %s and in %s", path,
                        b->name, st->files[a->file].rel, st->files[b->file].rel);
    }
    return K3_OK;
}

static bool st_ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

k3_status k3_safetensors_open(const char *path, k3_safetensors **out) {
    if (!out) return k3_error(K3_EINVAL, "safetensors_open: out is NULL");
    *out = NULL;
    if (!path) return k3_error(K3_EINVAL, "safetensors_open: path is NULL");
    k3_safetensors *st = k3_host_calloc(1, sizeof *st);
    if (!st) return k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
    k3_status s;
    struct stat sb; /* stat never opens the file, so it cannot block on a FIFO */
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char *index = st_join(path, K3_ST_INDEX_NAME), *single = st_join(path, K3_ST_SINGLE_NAME);
        if (!index || !single)
            s = k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
        else if (stat(index, &sb) == 0)
            s = st_open_index(st, index, path);
        else if (stat(single, &sb) == 0) {
            s = st_add_file(st, single, K3_ST_SINGLE_NAME);
            if (s == K3_OK) s = st_read_header(st, 0, true);
        } else
            s = k3_error(K3_EIO,
                         "safetensors: %s: the directory holds neither " K3_ST_INDEX_NAME " nor " K3_ST_SINGLE_NAME,
                         path);
        if (index) k3_host_free(index, strlen(index) + 1);
        if (single) k3_host_free(single, strlen(single) + 1);
    } else if (st_ends_with(path, ".json")) {
        const char *slash = strrchr(path, '/');
        char *dir = slash ? st_strndup(path, (size_t)(slash - path)) : st_strdup(".");
        if (slash && slash == path) {
            st_strfree(dir);
            dir = st_strdup("/");
        }
        s = dir ? st_open_index(st, path, dir) : k3_error(K3_ENOMEM, "safetensors: %s: out of memory", path);
        st_strfree(dir);
    } else {
        s = st_add_file(st, path, st_basename(path));
        if (s == K3_OK) s = st_read_header(st, 0, true);
    }
    if (s == K3_OK && !st->byname) s = st_index_names(st, path);
    if (s != K3_OK) {
        k3_safetensors_free(st);
        return s;
    }
    *out = st;
    return K3_OK;
}

/* ---- reading data ------------------------------------------------------------------------- */

/* Tensor e from its bytes (src, mapped), as dtype on device. F8 codes are decoded exactly
 * (k3_f8e4m3_to_f64 / k3_f8e5m2_to_f64) into dtype, which holds them exactly. */
static k3_status st_materialize(k3_st_entry *e, const unsigned char *src, k3_device device,
                                int dtype, const char *path) {
    const k3_device cpu = {K3_DEVICE_CPU, 0};
    int k3dt = st_kinds[e->kind].k3;
    k3_dtype want = dtype >= 0 ? (k3_dtype)dtype : k3dt >= 0 ? (k3_dtype)k3dt : K3_DTYPE_BF16;
    k3_tensor *t = NULL;
    k3_status s = k3_tensor_empty(&t, e->ndim, e->shape, k3dt >= 0 ? (k3_dtype)k3dt : want, cpu);
    if (s == K3_OK) {
        int64_t n = k3_tensor_numel(t);
        void *dst = k3_tensor_data(t);
        if (k3dt >= 0) {
            if (n) memcpy(dst, src, (size_t)(e->end - e->begin));
            if (!st_little_endian()) st_swap_bytes(dst, n, k3_dtype_size((k3_dtype)k3dt));
        } else {
            bool e4 = st_kinds[e->kind].f8 == ST_F8_E4M3;
            for (int64_t i = 0; i < n; i++)
                k3_store_f64(dst, want, i, e4 ? k3_f8e4m3_to_f64(src[i]) : k3_f8e5m2_to_f64(src[i]));
        }
        if (k3_tensor_dtype(t) != want || device.type != K3_DEVICE_CPU) {
            k3_tensor *u = NULL;
            s = k3_tensor_to(&u, t, device, want);
            k3_tensor_free(t);
            t = u;
        }
    }
    if (s != K3_OK) {
        k3_tensor_free(t);
        char what[512];
        snprintf(what, sizeof what, "safetensors: %s: tensor \"%s\"", path, e->name);
        return k3_error_prefix(s, what);
    }
    k3_tensor_free(e->tensor);
    e->tensor = t;
    return K3_OK;
}

/* Reads the picked entries of file fi from a read-only mapping, released before returning.
 * The file must still have the size its header was validated against. A file truncated by
 * another process between that check and the copy would fault (SIGBUS) as with any mapped
 * reader: the check narrows the window, it cannot close it. */
static k3_status st_read_file(k3_safetensors *st, int fi, const unsigned char *picked,
                              const k3_safetensors_read_opts *o) {
    st_file *f = &st->files[fi];
    int fd;
    int64_t size;
    K3_TRY(st_open(f->path, &fd, &size));
    if (size != f->size) {
        close(fd);
        return k3_error(K3_EIO, "safetensors: %s: the file changed since its header was read (%lld bytes, now %lld)",
                        f->path, (long long)f->size, (long long)size);
    }
    const unsigned char *map = NULL;
    if (size > f->base) {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return k3_error(K3_EIO, "safetensors: %s: cannot map: %s", f->path, strerror(e));
        }
        map = m;
    }
    close(fd); /* the mapping keeps the file open */
    k3_status s = K3_OK;
    static const unsigned char none[1];
    for (int i = 0; i < st->count && s == K3_OK; i++) {
        k3_st_entry *e = &st->entries[i];
        if (e->file != fi || !picked[i]) continue;
        const unsigned char *src = map ? map + f->base + e->begin : none;
        s = st_materialize(e, src, o->device, o->convert ? (int)o->dtype : -1, f->path);
    }
    if (map) munmap((void *)map, (size_t)size);
    return s;
}

k3_status k3_safetensors_read(k3_safetensors *st, int n, const int *which,
                              const k3_safetensors_read_opts *opts) {
    if (!st) return k3_error(K3_EINVAL, "safetensors_read: file handle is NULL");
    if (n > 0 && !which) return k3_error(K3_EINVAL, "safetensors_read: which is NULL");
    k3_safetensors_read_opts o = {{K3_DEVICE_CPU, 0}, 0, K3_DTYPE_BF16};
    if (opts) o = *opts;
    if (o.convert && k3_dtype_size(o.dtype) == 0)
        return k3_error(K3_EDTYPE, "safetensors_read: dtype %d is not a k3 dtype", (int)o.dtype);
    if (o.device.type == K3_DEVICE_CUDA) { /* before any data is read */
        const char *why = NULL;
        if (!k3_backend_available("cuda", &why))
            return k3_error(K3_EDEVICE, "safetensors_read: device cuda:%d is not available: %s",
                            o.device.index, why ? why : "no CUDA backend");
        if (o.device.index >= k3_cuda_device_count())
            return k3_error(K3_EDEVICE, "safetensors_read: device cuda:%d does not exist (%d CUDA devices)",
                            o.device.index, k3_cuda_device_count());
    } else if (o.device.type != K3_DEVICE_CPU || o.device.index != 0) {
        char dn[32];
        return k3_error(K3_EDEVICE, "safetensors_read: unknown device %s",
                        k3_device_name(o.device, dn, sizeof dn));
    }
    unsigned char *picked = k3_host_calloc((size_t)(st->count ? st->count : 1), 1);
    if (!picked) return k3_error(K3_ENOMEM, "safetensors_read: out of memory");
    k3_status s = K3_OK;
    if (n < 0) memset(picked, 1, (size_t)st->count);
    for (int j = 0; j < n && s == K3_OK; j++) {
        if (which[j] < 0 || which[j] >= st->count)
            s = k3_error(K3_EINVAL, "safetensors_read: which[%d] = %d out of range (%d tensors)", j,
                         which[j], st->count);
        else
            picked[which[j]] = 1;
    }
    /* Every picked dtype is checked before any data is read. */
    for (int i = 0; i < st->count && s == K3_OK; i++) {
        const k3_st_entry *e = &st->entries[i];
        if (picked[i] && st_kinds[e->kind].k3 < 0 && st_kinds[e->kind].f8 == ST_F8_NONE)
            s = k3_error(K3_EFORMAT, "safetensors: %s: tensor \"%s\": dtype %s is not loadable (k3 loads " ST_LOADABLE ")",
                         st->files[e->file].path, e->name, st_kinds[e->kind].name);
    }
    for (int fi = 0; fi < st->nfiles && s == K3_OK; fi++) {
        bool any = false;
        for (int i = 0; i < st->count && !any; i++) any = picked[i] && st->entries[i].file == fi;
        if (any) s = st_read_file(st, fi, picked, &o);
    }
    k3_host_free(picked, (size_t)(st->count ? st->count : 1));
    return s;
}

k3_status k3_safetensors_load(const char *path, k3_safetensors **out) {
    if (!out) return k3_error(K3_EINVAL, "safetensors_load: out is NULL");
    *out = NULL;
    if (!path) return k3_error(K3_EINVAL, "safetensors_load: path is NULL");
    k3_safetensors *st = NULL;
    K3_TRY(k3_safetensors_open(path, &st));
    k3_status s = k3_safetensors_read(st, -1, NULL, NULL);
    if (s != K3_OK) {
        k3_safetensors_free(st);
        return s;
    }
    *out = st;
    return K3_OK;
}

/* ---- save ------------------------------------------------------------------------------ */

static const char *st_dtype_tag(k3_dtype d) {
    for (int k = 0; k < ST_NKINDS; k++)
        if (st_kinds[k].k3 == (int)d) return st_kinds[k].name;
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

/* A JSON integer as cJSON stores it verbatim (cJSON prints numbers through double and int,
 * which would cut offsets past 2^31). */
static bool st_add_int(cJSON *arr, int64_t v) {
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)v);
    cJSON *r = cJSON_CreateRaw(num);
    return r && cJSON_AddItemToArray(arr, r);
}

/* The header text (cJSON, unformatted): {"__metadata__": {...}, name: {dtype, shape,
 * data_offsets}, ...} in name order, padded with spaces to a multiple of 8 bytes. *text is
 * k3 memory of *cap bytes (the caller frees it); *len excludes the terminating NUL. */
static k3_status st_header_text(const char *path, int n, const char *const *names,
                                const k3_tensor *const *tensors, const int *order, int nmeta,
                                const char *const *keys, const char *const *values,
                                const int *morder, char **text, size_t *len, size_t *cap) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = root ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    bool ok = meta != NULL;
    bool user_format = false;
    for (int j = 0; j < nmeta; j++) user_format |= strcmp(keys[j], "format") == 0;
    if (ok && !user_format) ok = cJSON_AddStringToObject(meta, "format", "pt") != NULL;
    for (int j = 0; j < nmeta && ok; j++)
        ok = cJSON_AddStringToObject(meta, keys[morder[j]], values[morder[j]]) != NULL;
    int64_t pos = 0;
    for (int j = 0; j < n && ok; j++) {
        const k3_tensor *t = tensors[order[j]];
        cJSON *e = cJSON_AddObjectToObject(root, names[order[j]]);
        cJSON *shape = e ? (cJSON_AddStringToObject(e, "dtype", st_dtype_tag(k3_tensor_dtype(t)))
                                ? cJSON_AddArrayToObject(e, "shape")
                                : NULL)
                         : NULL;
        cJSON *offs = shape ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        ok = offs != NULL;
        for (int d = 0; d < k3_tensor_ndim(t) && ok; d++) ok = st_add_int(shape, k3_tensor_size(t, d));
        int64_t nbytes = k3_tensor_numel(t) * (int64_t)k3_dtype_size(k3_tensor_dtype(t));
        ok = ok && st_add_int(offs, pos) && st_add_int(offs, pos + nbytes);
        pos += nbytes;
    }
    char *printed = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!printed) return k3_error(K3_ENOMEM, "safetensors_save: %s: out of memory for the header", path);
    size_t plen = strlen(printed);
    /* Padded with spaces so the data section starts 8-byte aligned, as other writers do. */
    size_t padded = (plen + 7) / 8 * 8;
    *text = k3_host_alloc(padded + 1);
    if (!*text) {
        cJSON_free(printed);
        return k3_error(K3_ENOMEM, "safetensors_save: %s: out of memory for the header", path);
    }
    memcpy(*text, printed, plen);
    memset(*text + plen, ' ', padded - plen);
    (*text)[padded] = '\0';
    cJSON_free(printed);
    *len = padded;
    *cap = padded + 1;
    return K3_OK;
}

/* Writes the file to f (the temporary file); path is the one the caller passed, which every
 * message names. */
static k3_status st_save_to(FILE *f, const char *path, int n, const char *const *names,
                            const k3_tensor *const *tensors, const int *order, int nmeta,
                            const char *const *keys, const char *const *values, const int *morder) {
    char *text = NULL;
    size_t len = 0, cap = 0;
    K3_TRY(st_header_text(path, n, names, tensors, order, nmeta, keys, values, morder, &text, &len,
                          &cap));
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)len >> (8 * i));
    k3_status s = st_write(f, path, lenbuf, 8);
    if (s == K3_OK) s = st_write(f, path, text, len);
    k3_host_free(text, cap);
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

/* Sorted positions of n strings, and whether one repeats (its position in *dup, else -1). */
static int *st_sorted(int n, const char *const *strs, int *dup) {
    int *order = k3_host_calloc(n > 0 ? (size_t)n : 1, sizeof *order);
    *dup = -1;
    if (!order) return NULL;
    for (int i = 0; i < n; i++) order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, st_cmp_index_name, (void *)strs);
    for (int j = 1; j < n && *dup < 0; j++)
        if (strcmp(strs[order[j - 1]], strs[order[j]]) == 0) *dup = order[j];
    return order;
}

k3_status k3_safetensors_save_metadata(const char *path, int n, const char *const *names,
                                       const k3_tensor *const *tensors, int nmeta,
                                       const char *const *keys, const char *const *values) {
    if (!path) return k3_error(K3_EINVAL, "safetensors_save: path is NULL");
    if (n < 0) return k3_error(K3_EINVAL, "safetensors_save: n is %d (must be >= 0)", n);
    if (nmeta < 0) return k3_error(K3_EINVAL, "safetensors_save: nmeta is %d (must be >= 0)", nmeta);
    if (n > 0 && !names) return k3_error(K3_EINVAL, "safetensors_save: names is NULL");
    if (n > 0 && !tensors) return k3_error(K3_EINVAL, "safetensors_save: tensors is NULL");
    if (nmeta > 0 && (!keys || !values))
        return k3_error(K3_EINVAL, "safetensors_save: metadata keys or values is NULL");
    for (int i = 0; i < n; i++) {
        if (!names[i]) return k3_error(K3_EINVAL, "safetensors_save: names[%d] is NULL", i);
        if (!names[i][0])
            return k3_error(K3_EINVAL, "safetensors_save: %s: names[%d] is empty", path, i);
        if (st_check_name("safetensors_save", path, "tensor", i + 1, names[i]) != K3_OK)
            return K3_EINVAL;
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
    for (int i = 0; i < nmeta; i++) {
        if (!keys[i] || !values[i])
            return k3_error(K3_EINVAL, "safetensors_save: metadata entry %d is NULL", i);
        if (st_check_name("safetensors_save", path, "metadata key", i + 1, keys[i]) != K3_OK)
            return K3_EINVAL;
        long bad = st_utf8_invalid_at((const unsigned char *)values[i], strlen(values[i]));
        if (bad >= 0)
            return k3_error(K3_EINVAL, "safetensors_save: %s: metadata \"%s\": the value is not valid UTF-8 (byte %ld)",
                            path, keys[i], bad + 1);
    }
    /* Name order, so the file does not depend on the order a Lua table hands them over. */
    int dup, mdup;
    int *order = st_sorted(n, names, &dup);
    int *morder = st_sorted(nmeta, keys, &mdup);
    k3_status s = K3_OK;
    if (!order || !morder) s = k3_error(K3_ENOMEM, "safetensors_save: out of memory");
    else if (dup >= 0)
        s = k3_error(K3_EINVAL, "safetensors_save: tensor name \"%s\" given twice", names[dup]);
    else if (mdup >= 0)
        s = k3_error(K3_EINVAL, "safetensors_save: metadata key \"%s\" given twice", keys[mdup]);
    /* Written beside the target and renamed, so a failed save never leaves half a file. The
     * rename would replace whatever is at the path, so only a regular file (or nothing) may be
     * there; a symbolic link is followed to the file it names. */
    char *resolved = NULL;
    struct stat sb;
    if (s == K3_OK && lstat(path, &sb) == 0) {
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
    /* Messages name the path the caller passed: the temporary file (and a link's target) is
     * k3's business, and the caller must recognise the file in the error. */
    const char *given = path;
    if (resolved) path = resolved;
    size_t plen = strlen(path) + 16;
    char *tmp_path = s == K3_OK ? k3_host_alloc(plen) : NULL;
    if (s == K3_OK && !tmp_path) s = k3_error(K3_ENOMEM, "safetensors_save: out of memory");
    if (s == K3_OK) {
        snprintf(tmp_path, plen, "%s.tmp%d", path, (int)getpid());
        FILE *f = fopen(tmp_path, "wb");
        if (!f) {
            s = k3_error(K3_EIO, "safetensors_save: %s: cannot open for writing: %s", given,
                         strerror(errno));
        } else {
            s = st_save_to(f, given, n, names, tensors, order, nmeta, keys, values, morder);
            if (fclose(f) != 0 && s == K3_OK)
                s = k3_error(K3_EIO, "safetensors_save: %s: write failed: %s", given, strerror(errno));
            if (s == K3_OK && rename(tmp_path, path) != 0)
                s = k3_error(K3_EIO, "safetensors_save: %s: cannot move the temporary file %s into "
                                     "place: %s",
                             given, tmp_path, strerror(errno));
            if (s != K3_OK) remove(tmp_path);
        }
    }
    if (tmp_path) k3_host_free(tmp_path, plen);
    free(resolved); /* realpath's allocation comes from the C library */
    if (order) k3_host_free(order, (n > 0 ? (size_t)n : 1) * sizeof *order);
    if (morder) k3_host_free(morder, (nmeta > 0 ? (size_t)nmeta : 1) * sizeof *morder);
    return s;
}

k3_status k3_safetensors_save(const char *path, int n, const char *const *names,
                              const k3_tensor *const *tensors) {
    return k3_safetensors_save_metadata(path, n, names, tensors, 0, NULL, NULL);
}
