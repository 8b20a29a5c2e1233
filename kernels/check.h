/*
 * check.h — the one macro through which every CUDA runtime, cuBLAS and cuBLASLt call and
 * every kernel launch of the backend is checked. A failure becomes a k3_status (K3_ENOMEM
 * for out-of-memory, K3_ECUDA otherwise) with a message naming the statement, file, line
 * and device; nothing aborts, exits or prints.
 */
#ifndef K3_CHECK_H
#define K3_CHECK_H

#include "k3_impl.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

/* Records the failure of `stmt` (message with file, line and the current device) and returns
 * the status to propagate. Defined in backend.cu. */
k3_status k3c_fail_cuda(cudaError_t e, const char *stmt, const char *file, int line);
k3_status k3c_fail_cublas(cublasStatus_t e, const char *stmt, const char *file, int line);

static inline k3_status k3c_check(cudaError_t e, const char *stmt, const char *file, int line) {
    return e == cudaSuccess ? K3_OK : k3c_fail_cuda(e, stmt, file, line);
}
static inline k3_status k3c_check(cublasStatus_t e, const char *stmt, const char *file,
                                  int line) {
    return e == CUBLAS_STATUS_SUCCESS ? K3_OK : k3c_fail_cublas(e, stmt, file, line);
}

/* K3_CHECK(call): evaluates a CUDA or cuBLAS(Lt) call; on failure sets the message and
 * returns the status from the enclosing function (which must return k3_status). */
#define K3_CHECK(call)                                                                     \
    do {                                                                                   \
        k3_status k3c_s_ = k3c_check((call), #call, __FILE__, __LINE__);                   \
        if (k3c_s_ != K3_OK) return k3c_s_;                                               \
    } while (0)

/* After every kernel launch: launch-configuration errors surface here, not later. */
#define K3_CHECK_LAUNCH(name)                                                              \
    do {                                                                                   \
        k3_status k3c_s_ = k3c_check(cudaGetLastError(), "launch of " #name, __FILE__,      \
                                     __LINE__);                                            \
        if (k3c_s_ != K3_OK) return k3c_s_;                                               \
    } while (0)

#endif /* K3_CHECK_H */
