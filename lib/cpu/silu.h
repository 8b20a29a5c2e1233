/*
 * cpu/silu.h — SiLU for the CPU kernels that compute the SwiGLU gate: cpu.silu_mul.reference
 * and the linear kernels' silu_mul prologue, one definition so that the fused and the separate
 * gate give the same bits.
 */
#ifndef K3_CPU_SILU_H
#define K3_CPU_SILU_H

#include <math.h>

/* silu(g) = g / (1 + exp(-g)). At g = -inf that expression is -inf / inf, NaN, while the
 * limit is 0 (reached from below: -0). */
static inline double k3_silu_f64(double g) { return g == -INFINITY ? -0.0 : g / (1.0 + exp(-g)); }
static inline float k3_silu_f32(float g) { return g == -INFINITY ? -0.0f : g / (1.0f + expf(-g)); }

#endif /* K3_CPU_SILU_H */
