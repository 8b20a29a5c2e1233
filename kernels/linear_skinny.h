/*
 * linear_skinny.h — the two decode-time linear kernels of helper C: cuda.linear.skinny
 * (bf16 weight-streaming GEMM for M = 1..16, kernels/linear_skinny.cu) and
 * cuda.linear.batch_invariant (one fixed reduction order per output, kernels/
 * linear_batch_invariant.cu).
 *
 * For the backend (kernels/backend.cu): list both records in the k3_backend kernels array,
 *     &k3_cuda_linear_skinny, &k3_cuda_linear_batch_invariant
 * (the names kernels/common.cuh already declares, in the style of the backend's other
 * records). Both kernels launch on this thread's stream from
 * k3c_context() (kernels/common.cuh), which also makes the tensors' device current.
 */
#ifndef K3_LINEAR_SKINNY_H
#define K3_LINEAR_SKINNY_H

#include "k3_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const k3_kernel k3_cuda_linear_skinny;
extern const k3_kernel k3_cuda_linear_batch_invariant;

#ifdef __cplusplus
}
#endif
#endif /* K3_LINEAR_SKINNY_H */
