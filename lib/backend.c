/*
 * backend.c — loads the CUDA backend (libk3_cuda.so) at run time, once per process.
 * The core has no CUDA dependency: when the backend cannot be found, loaded, opened or has
 * no device, k3 runs on the CPU and the one-line reason is kept for k3.backends().
 */
#include "k3_impl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static k3_backend g_backend;
static const k3_backend *g_loaded;
static char g_reason[8400];
/* No K3_CUDA_BACKEND and no libk3_cuda.so beside libk3.so: a build without the backend. */
static bool g_absent;
/* The handle stays open for the life of the process: kernels and device memory hold
 * pointers into it. */
static void *g_handle;

/* Directory of the shared object that holds this function (libk3.so), without the final
 * slash, into buf. False when it cannot be found (a static link). */
static bool self_dir(char *buf, size_t n) {
    Dl_info info;
    if (!dladdr((void *)&self_dir, &info) || !info.dli_fname) return false;
    /* Resolve symlinks and "..": the module may be loaded through a relative rpath. */
    char *real = realpath(info.dli_fname, NULL);
    const char *fname = real ? real : info.dli_fname;
    const char *slash = strrchr(fname, '/');
    bool ok = true;
    if (!slash) {
        snprintf(buf, n, ".");
    } else {
        size_t len = (size_t)(slash - fname);
        ok = len + 1 <= n;
        if (ok) {
            memcpy(buf, fname, len);
            buf[len] = '\0';
        }
    }
    free(real);
    return ok;
}

static void load_backend(void) {
    char path[4096];
    const char *env = getenv("K3_CUDA_BACKEND");
    if (env && *env) {
        /* A name without a slash would make dlopen search the library path, not the file
         * the user named. */
        snprintf(path, sizeof path, "%s%s", strchr(env, '/') ? "" : "./", env);
    } else {
        char dir[4000];
        if (!self_dir(dir, sizeof dir)) {
            snprintf(g_reason, sizeof g_reason,
                     "libk3_cuda.so not found: cannot locate libk3.so (set K3_CUDA_BACKEND)");
            g_absent = true;
            return;
        }
        snprintf(path, sizeof path, "%s/libk3_cuda.so", dir);
    }
    if (access(path, F_OK) != 0) {
        snprintf(g_reason, sizeof g_reason, "libk3_cuda.so not found at %s", path);
        g_absent = !(env && *env);
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        /* dlerror usually repeats the path: keep the line short. */
        size_t pl = strlen(path);
        if (e && strncmp(e, path, pl) == 0 && strncmp(e + pl, ": ", 2) == 0) e += pl + 2;
        snprintf(g_reason, sizeof g_reason, "cannot load %s: %s", path, e ? e : "unknown error");
        return;
    }
    k3_backend_open_fn open = NULL;
    *(void **)&open = dlsym(h, K3_BACKEND_OPEN_SYMBOL);
    if (!open) {
        snprintf(g_reason, sizeof g_reason, "cannot load %s: no symbol %s", path,
                 K3_BACKEND_OPEN_SYMBOL);
        dlclose(h);
        return;
    }
    k3_backend b;
    memset(&b, 0, sizeof b);
    char why[256] = "";
    k3_status s = open(K3_BACKEND_ABI, &b, why, sizeof why);
    if (s != K3_OK) {
        snprintf(g_reason, sizeof g_reason, "%s", why[0] ? why : k3_status_name(s));
        /* Keep the library mapped: a failed open may have registered CUDA runtime state
         * whose teardown at unload is not safe to run early. */
        g_handle = h;
        return;
    }
    if (b.abi != K3_BACKEND_ABI) {
        snprintf(g_reason, sizeof g_reason,
                 "ABI mismatch: %s was built for backend ABI %d, this libk3 needs %d", path,
                 b.abi, K3_BACKEND_ABI);
        g_handle = h;
        return;
    }
    if (b.device_count <= 0) {
        snprintf(g_reason, sizeof g_reason, "no CUDA device");
        g_handle = h;
        return;
    }
    g_handle = h;
    g_backend = b;
    g_loaded = &g_backend;
}

/* Exported: the binding and libk3_cuda.so are separate shared objects. */
K3_API const k3_backend *k3_cuda_backend(const char **reason) {
    pthread_once(&g_once, load_backend);
    if (reason) *reason = g_loaded ? NULL : g_reason;
    return g_loaded;
}

bool k3_cuda_backend_absent(void) {
    pthread_once(&g_once, load_backend);
    return g_absent;
}
