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
 *
 * cuda.linear.skinny's k3_skinny_config (lib/k3_impl.h): threads, rows (multiple of 8),
 * unroll, vec (8) and split_k = the number of K-slices per row group IN TOTAL:
 *     split_k = kw * kcta,   kw = threads / 32 / (rows / 8),   kcta = CTAs along K.
 *   split_k == kw (or 0): the classic kernel, one CTA per row tile, its kw warps' partials
 *     reduced in shared memory (the meaning every plan written before split-K had).
 *   split_k == kw * kcta, 2 <= kcta <= 32: split-K ACROSS CTAs, grid (row tiles, kcta); the
 *     fp32 partials go to this thread's context workspace (declined, with the byte counts,
 *     when it is too small), the last-arriving CTA of each tile (per-thread arrival counters,
 *     reset by that CTA: re-launchable and CUDA-graph safe) sums them in split order 0..kcta-1
 *     (deterministic), adds the residual and rounds once. The counters are allocated on the
 *     thread's first split call; if that first call is made inside a CUDA graph capture the
 *     kernel declines (named reason) and the default method serves it.
 * Any other split_k, or a triple not instantiated for the mode, is declined as
 * "config {...} is not instantiated" (see K3_SKINNY_CONFIGS / K3_SKINNY_SPLIT_CONFIGS in
 * linear_skinny.cuh).
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
