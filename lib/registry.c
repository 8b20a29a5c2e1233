/*
 * registry.c — the kernel registry: the catalogue of every kernel k3 knows in any build
 * (lib/k3_kernels.def), and the kernels registered in this process (the CPU kernels always,
 * then the CUDA backend's when it loads), minus those named in K3_DISABLE_KERNELS. Built once,
 * then read-only, so lookups need no lock.
 */
#include "k3_impl.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every kernel k3 knows, registered or not (lib/k3_kernels.def); a policy may name only these. */
typedef struct known_kernel {
    const char *name;
    k3_op op;
    k3_device_type device;
    int rank[2]; /* default list, batch-invariant list; 0: in none */
} known_kernel;

static const known_kernel g_known[] = {
#define K3_KERNEL(symbol, name, OP, DEVICE, rank, invariant_rank)                          \
    {name, K3_OP_##OP, K3_DEVICE_##DEVICE, {rank, invariant_rank}},
#include "k3_kernels.def"
#undef K3_KERNEL
};
enum { K3_NKNOWN = (int)(sizeof g_known / sizeof g_known[0]) };

/* Registered kernels in registration order; g_slot[i] is the registered kernel of known name i
 * or NULL. */
static const k3_kernel *g_registered[K3_NKNOWN];
static int g_nregistered;
static const k3_kernel *g_slot[K3_NKNOWN];

/* g_disabled[i]: known name i is listed in K3_DISABLE_KERNELS (read once, at set-up, so a
 * decline reason costs no environment parse per call). */
static bool g_disabled[K3_NKNOWN];

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Calls fn(start, len, ud) for each entry of K3_DISABLE_KERNELS: comma-separated, with the
 * whitespace around each entry trimmed (" cpu.linear.blas" names cpu.linear.blas); empty
 * entries are skipped. Stops early when fn returns true, and returns that. */
static bool each_disabled_entry(bool (*fn)(const char *s, size_t len, void *ud), void *ud) {
    const char *env = getenv("K3_DISABLE_KERNELS");
    if (!env) return false;
    const char *p = env;
    while (*p) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        const char *start = p;
        while (*p && *p != ',') p++;
        const char *end = p;
        while (end > start && isspace((unsigned char)end[-1])) end--;
        if (end > start && fn(start, (size_t)(end - start), ud)) return true;
    }
    return false;
}

static bool entry_is(const char *s, size_t len, void *name) {
    return strlen(name) == len && memcmp(s, name, len) == 0;
}

/* True when `name` is listed in K3_DISABLE_KERNELS. */
bool k3_kernel_disabled(const char *name) { return each_disabled_entry(entry_is, (void *)name); }

static int known_index(const char *name) {
    for (int i = 0; i < K3_NKNOWN; i++)
        if (strcmp(g_known[i].name, name) == 0) return i;
    return -1;
}

/* Registers k unless K3_DISABLE_KERNELS names it. Only the catalogue's kernels are taken, and
 * only with the catalogue's op and device (a backend built from another tree could differ). */
static void add(const k3_kernel *k) {
    if (!k || !k->name || k3_kernel_disabled(k->name)) return;
    int i = known_index(k->name);
    if (i < 0) {
        k3_log(K3_LOG_WARN, "kernel %s is not in the catalogue: not registered", k->name);
        return;
    }
    if (g_slot[i]) return; /* first registration wins */
    if (g_known[i].op != k->op || g_known[i].device != k->device) {
        k3_log(K3_LOG_WARN, "kernel %s has the wrong op or device: not registered", k->name);
        return;
    }
    g_slot[i] = k;
    g_registered[g_nregistered++] = k;
}

/* A K3_DISABLE_KERNELS entry that names no known kernel disables nothing: say so once, so a
 * typo ("cpu.linear.blass") does not leave a kernel running that the user meant to switch
 * off. Known names include every build's kernels, so a CPU-only build does not warn about
 * disabled CUDA kernels. */
static bool warn_unknown(const char *s, size_t len, void *ud) {
    (void)ud;
    for (int i = 0; i < K3_NKNOWN; i++)
        if (strlen(g_known[i].name) == len && memcmp(g_known[i].name, s, len) == 0) return false;
    char known[1024];
    size_t used = 0;
    known[0] = '\0';
    for (int i = 0; i < K3_NKNOWN; i++) {
        int w = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                         g_known[i].name);
        if (w < 0 || (size_t)w >= sizeof known - used) break;
        used += (size_t)w;
    }
    k3_config_warn("K3_DISABLE_KERNELS: unknown kernel '%.*s' ignored (known kernels: %s)",
                   (int)(len > 200 ? 200 : len), s, known);
    return false;
}

static void init_registry(void) {
#define K3_KERNEL(symbol, name, OP, DEVICE, rank, invariant_rank) K3_ON_CPU_##DEVICE(add(&symbol);)
#include "k3_kernels.def"
#undef K3_KERNEL
    const k3_backend *b = k3_cuda_backend(NULL);
    if (b)
        for (int i = 0; i < b->nkernels; i++) add(b->kernels[i]);
    each_disabled_entry(warn_unknown, NULL);
    for (int i = 0; i < K3_NKNOWN; i++) g_disabled[i] = k3_kernel_disabled(g_known[i].name);
}

static void ensure(void) { pthread_once(&g_once, init_registry); }

/* The registered kernel called `name`, or NULL (unknown, disabled, or absent in this build). */
static const k3_kernel *kernel_find(const char *name) {
    if (!name) return NULL;
    ensure();
    int i = known_index(name);
    return i >= 0 ? g_slot[i] : NULL;
}

int k3_kernel_count(void) {
    ensure();
    return g_nregistered;
}

const char *k3_kernel_name(int i) {
    ensure();
    return i >= 0 && i < g_nregistered ? g_registered[i]->name : NULL;
}

int k3_has_kernel(const char *name) { return kernel_find(name) != NULL; }

int k3_known_kernel(const char *name) {
    if (!name) return 0;
    ensure();
    return known_index(name) >= 0;
}

int k3_known_lookup(const char *name, k3_op *op, k3_device_type *device) {
    if (!name) return -1;
    ensure();
    int i = known_index(name);
    if (i >= 0) {
        if (op) *op = g_known[i].op;
        if (device) *device = g_known[i].device;
    }
    return i;
}
int k3_known_count(void) { return K3_NKNOWN; }
const char *k3_known_name(int i) { return i >= 0 && i < K3_NKNOWN ? g_known[i].name : NULL; }
k3_op k3_known_op(int i) { return i >= 0 && i < K3_NKNOWN ? g_known[i].op : K3_OP_COUNT; }
int k3_known_rank(int i, int invariant) {
    return i >= 0 && i < K3_NKNOWN ? g_known[i].rank[invariant != 0] : 0;
}
const k3_kernel *k3_known_kernel_at(int i) {
    ensure();
    return i >= 0 && i < K3_NKNOWN ? g_slot[i] : NULL;
}

void k3_known_absent_reason(int i, char *buf, size_t n) {
    const char *name = k3_known_name(i);
    if (name && g_disabled[i]) {
        snprintf(buf, n, "not registered in this build (disabled by K3_DISABLE_KERNELS)");
        return;
    }
    const char *why = NULL;
    if (name && g_known[i].device == K3_DEVICE_CUDA && !k3_cuda_backend(&why) &&
        !k3_cuda_backend_absent()) {
        snprintf(buf, n, "not registered: CUDA backend unavailable (%s)", why ? why : "unknown");
        return;
    }
    snprintf(buf, n, "not registered in this build");
}

int k3_backend_available(const char *backend, const char **reason) {
    if (reason) *reason = NULL;
    if (backend && strcmp(backend, "cpu") == 0) return 1;
    if (backend && strcmp(backend, "cuda") == 0) {
        const char *why = NULL;
        const k3_backend *b = k3_cuda_backend(&why);
        if (!b && reason) *reason = why;
        return b != NULL;
    }
    if (reason) *reason = "unknown backend (expected \"cpu\" or \"cuda\")";
    return 0;
}

int k3_cuda_device_count(void) {
    const k3_backend *b = k3_cuda_backend(NULL);
    return b ? b->device_count : 0;
}

k3_status k3_cuda_arch(int device, char *buf, size_t n) {
    const char *why = NULL;
    const k3_backend *b = k3_cuda_backend(&why);
    if (!b) return k3_error(K3_EDEVICE, "cuda_arch: CUDA is not available: %s", why);
    if (!buf || n == 0) return k3_error(K3_EINVAL, "cuda_arch: buf is NULL");
    if (device < 0 || device >= b->device_count)
        return k3_error(K3_EDEVICE, "cuda_arch: device %d out of range 0..%d", device,
                        b->device_count - 1);
    char name[256];
    int major = 0, minor = 0, sms = 0;
    K3_TRY(b->device_info(device, name, sizeof name, &major, &minor, &sms));
    snprintf(buf, n, "sm%d%d", major, minor);
    return K3_OK;
}

k3_status k3_empty_cache(void) {
    K3_TRY(k3_graph_refuse("empty_cache", "returning memory to the driver (a device synchronisation)"));
    const k3_backend *b = k3_cuda_backend(NULL);
    if (!b) return K3_OK;
    return b->empty_cache();
}
