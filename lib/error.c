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

/* The length of the first n bytes of s cut back to a UTF-8 character boundary. */
static size_t utf8_head(const char *s, size_t n) {
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return n;
}

/* Stores text (len bytes) as this thread's message. A text longer than the buffer keeps its
 * start (the op and the argument) and its end (where the reason is), with the cut marked
 * between them, so a long echoed path never pushes the reason out. */
static void set_message(const char *text, size_t len) {
    const size_t room = sizeof last_message - 1;
    if (len <= room) {
        memmove(last_message, text, len);
        last_message[len] = '\0';
        return;
    }
    const size_t marker_room = 64; /* " [... 18446744073709551615 bytes cut ...] " fits */
    size_t head = utf8_head(text, (room - marker_room) / 2);
    size_t tail_start = len - (room - marker_room - (room - marker_room) / 2);
    while (tail_start < len && ((unsigned char)text[tail_start] & 0xC0) == 0x80) tail_start++;
    char marker[80];
    int m = snprintf(marker, sizeof marker, " [... %zu bytes cut ...] ", tail_start - head);
    char out[sizeof last_message];
    memcpy(out, text, head);
    memcpy(out + head, marker, (size_t)m);
    memcpy(out + head + (size_t)m, text + tail_start, len - tail_start);
    out[head + (size_t)m + len - tail_start] = '\0';
    memcpy(last_message, out, sizeof out);
}

k3_status k3_error(k3_status s, const char *fmt, ...) {
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof last_message) {
        /* Too long for the buffer: format it whole once (the C library's malloc, not the host
         * allocator, which may be what just failed) to keep its end. Without the memory the
         * start stays, marked as cut. */
        char *full = malloc((size_t)n + 1);
        if (full) {
            vsnprintf(full, (size_t)n + 1, fmt, again);
            set_message(full, (size_t)n);
            free(full);
        } else {
            memcpy(last_message + sizeof last_message - 8, " [...]", 7);
        }
    }
    va_end(again);
    return s;
}

k3_status k3_error_prefix(k3_status s, const char *prefix) {
    char tmp[K3_ECHO_SIZE + 2 + sizeof last_message];
    k3_echo(tmp, K3_ECHO_SIZE, prefix);
    size_t n = strlen(tmp);
    memcpy(tmp + n, ": ", 2);
    size_t rest = strlen(last_message);
    memcpy(tmp + n + 2, last_message, rest + 1);
    set_message(tmp, n + 2 + rest);
    return s;
}

/* How this thread's messages number dims, indices and blocks (k3_embed.h). */
static _Thread_local int message_base;

int k3_set_message_base(int base) {
    int prev = message_base;
    message_base = base != 0;
    return prev;
}

int k3_message_base(void) { return message_base; }

const char *k3_echo(char *buf, size_t n, const char *s) {
    size_t len = strlen(s);
    if (len <= K3_ECHO_MAX && len < n) {
        memcpy(buf, s, len + 1);
        return buf;
    }
    size_t keep = utf8_head(s, K3_ECHO_MAX < n ? K3_ECHO_MAX : n - 1);
    int m = snprintf(NULL, 0, "... (cut at %zu of %zu bytes)", keep, len);
    if (keep + (size_t)m >= n) keep = utf8_head(s, n > (size_t)m + 1 ? n - (size_t)m - 1 : 0);
    memcpy(buf, s, keep);
    snprintf(buf + keep, n - keep, "... (cut at %zu of %zu bytes)", keep, len);
    return buf;
}

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

/* k3_memory's host counters: bytes as callers asked for them (n, or 1 for n = 0). */
static uint64_t host_bytes, host_peak; /* __atomic */

void *k3_host_alloc(size_t n) {
    /* A zero-size request still returns a unique pointer so callers need no special case. */
    void *p = alloc_fn(alloc_ud, NULL, 0, n ? n : 1);
    if (p) {
        __atomic_add_fetch(&live_allocations, 1, __ATOMIC_ACQ_REL);
        uint64_t now = __atomic_add_fetch(&host_bytes, (uint64_t)(n ? n : 1), __ATOMIC_ACQ_REL);
        uint64_t peak = __atomic_load_n(&host_peak, __ATOMIC_ACQUIRE);
        while (now > peak &&
               !__atomic_compare_exchange_n(&host_peak, &peak, now, true, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
        }
    }
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
    __atomic_sub_fetch(&host_bytes, (uint64_t)(n ? n : 1), __ATOMIC_ACQ_REL);
}

void k3_host_memory(uint64_t *bytes, uint64_t *peak, uint64_t *allocations) {
    *bytes = __atomic_load_n(&host_bytes, __ATOMIC_ACQUIRE);
    *peak = __atomic_load_n(&host_peak, __ATOMIC_ACQUIRE);
    *allocations = (uint64_t)__atomic_load_n(&live_allocations, __ATOMIC_ACQUIRE);
}

void k3_host_memory_reset_peak(void) {
    __atomic_store_n(&host_peak, __atomic_load_n(&host_bytes, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
}
