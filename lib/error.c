/*
 * error.c — status codes, the thread-local message of the last failure and how it numbers
 * dims, the log hook, the configuration warnings and the pluggable host allocator. The core never prints, aborts or
 * exits: it reports here.
 */
#include "k3_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_message[1024];

const char *k3_last_error(void) { return last_message; }

k3_status k3_error(k3_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return s;
}

k3_status k3_error_prefix(k3_status s, const char *prefix) {
    char tmp[sizeof last_message];
    size_t n = strlen(prefix);
    if (n > 200) n = 200;
    memcpy(tmp, prefix, n);
    memcpy(tmp + n, ": ", 2);
    size_t rest = strnlen(last_message, sizeof tmp - n - 3);
    memcpy(tmp + n + 2, last_message, rest);
    tmp[n + 2 + rest] = '\0';
    memcpy(last_message, tmp, sizeof tmp);
    return s;
}

/* How this thread's messages number dims, indices and blocks (k3_embed.h). */
static _Thread_local int message_base;

int k3_set_message_base(int base) {
    int prev = message_base;
    message_base = base == 1;
    return prev;
}

int k3_message_base(void) { return message_base; }

const char *k3_status_name(k3_status s) {
    static const char *const names[] = {
        "K3_OK",     "K3_EINVAL",    "K3_ESHAPE", "K3_ELAYOUT", "K3_EDTYPE",
        "K3_EDEVICE", "K3_ENOMEM",   "K3_EOVERFLOW", "K3_EFREED", "K3_ENOKERNEL",
        "K3_ECUDA",  "K3_EIO",       "K3_EFORMAT", "K3_EINTERNAL"};
    if ((unsigned)s < sizeof names / sizeof names[0]) return names[s];
    return "K3_UNKNOWN";
}

/* ---- log hook ---------------------------------------------------------------------------- */

/* The callback and its userdata change together, so a concurrent k3_log never pairs one
 * host's callback with another's userdata. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static k3_log_fn log_fn;
static void *log_ud;

void k3_set_log(k3_log_fn fn, void *ud) {
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_ud = ud;
    pthread_mutex_unlock(&log_lock);
}

void k3_log(k3_log_level level, const char *fmt, ...) {
    pthread_mutex_lock(&log_lock);
    k3_log_fn fn = log_fn;
    void *ud = log_ud;
    pthread_mutex_unlock(&log_lock);
    if (!fn) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fn(ud, level, buf);
}

int k3_log_hook_set(void) {
    pthread_mutex_lock(&log_lock);
    int set = log_fn != NULL;
    pthread_mutex_unlock(&log_lock);
    return set;
}

/* ---- configuration warnings ---------------------------------------------------------------- */

/* Kept so the binding can show them on stderr when no hook is set: they are written once, at
 * registry set-up and at the first read of K3_BATCH_INVARIANT, often before any host could
 * install a hook. */
static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static char config_text[4096];
static size_t config_len;
static int config_taken;

void k3_config_warn(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    k3_log(K3_LOG_WARN, "%s", msg);
    pthread_mutex_lock(&config_lock);
    /* Once taken, the text is someone's to read: later warnings only go to the hook. */
    if (!config_taken) {
        size_t room = sizeof config_text - config_len;
        int w = snprintf(config_text + config_len, room, "%s\n", msg);
        if (w > 0) config_len += (size_t)w < room ? (size_t)w : room - 1;
    }
    pthread_mutex_unlock(&config_lock);
}

const char *k3_config_warnings_take(void) {
    pthread_mutex_lock(&config_lock);
    const char *r = !config_taken && config_len ? config_text : NULL;
    if (r) config_taken = 1;
    pthread_mutex_unlock(&config_lock);
    return r;
}

/* ---- host allocator ------------------------------------------------------------------------ */

static void *default_alloc(void *ud, void *ptr, size_t old_size, size_t new_size) {
    (void)ud;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

static k3_alloc_fn alloc_fn = default_alloc;
static void *alloc_ud;
static long live_allocations; /* __atomic; guards allocator swaps */

k3_status k3_set_allocator(k3_alloc_fn fn, void *ud) {
    if (__atomic_load_n(&live_allocations, __ATOMIC_ACQUIRE) != 0)
        return k3_error(K3_EINVAL,
                        "set_allocator: %ld host allocations are live; set the allocator "
                        "before creating tensors",
                        __atomic_load_n(&live_allocations, __ATOMIC_ACQUIRE));
    alloc_ud = fn ? ud : NULL;
    alloc_fn = fn ? fn : default_alloc;
    return K3_OK;
}

void *k3_host_alloc(size_t n) {
    /* A zero-size request still returns a unique pointer so callers need no special case. */
    void *p = alloc_fn(alloc_ud, NULL, 0, n ? n : 1);
    if (p) __atomic_add_fetch(&live_allocations, 1, __ATOMIC_ACQ_REL);
    return p;
}

void *k3_host_calloc(size_t count, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(count, size, &n)) return NULL;
    void *p = k3_host_alloc(n);
    if (p) memset(p, 0, n);
    return p;
}

void k3_host_free(void *p, size_t n) {
    if (!p) return;
    alloc_fn(alloc_ud, p, n ? n : 1, 0);
    __atomic_sub_fetch(&live_allocations, 1, __ATOMIC_ACQ_REL);
}
