/*
 * read_limit.cuh — the read limit: k3's read-only streaming kernel, the floor the decode
 * linear benchmarks measure themselves against (tools/linear_sweep.cu, tools/read_limit.cu
 * behind `scripts/bench linear`). It is a measuring instrument, not a registered op.
 *
 * It reads exactly `bytes` bytes (a multiple of 16) once, with 16-byte loads that bypass L1
 * (ld.global.nc.L1::no_allocate.L2::256B, as the skinny kernel loads w), UNROLL of them in
 * flight per thread before any is used, folds them into an XOR (so no load is dead) and
 * writes one word per warp. Two layouts: grid-stride (call j of a thread reads vectors
 * i + j * gridDim.x * THREADS) and CTA-contiguous (CTA b streams its own 1/gridDim.x of the
 * buffer, THREADS vectors apart). The read limit of a byte count is the best of a sweep of
 * launch shapes (k3t_read_shapes: CTAs, threads, loads in flight, layout).
 *
 * With pdl the kernel runs griddepcontrol.launch_dependents at entry, issues ALL its loads,
 * and waits for its predecessor (griddepcontrol.wait) only before its one write: chained
 * calls launched with the programmatic-stream-serialization attribute overlap each one's
 * ramp with the previous one's tail, which is the best a weight-streaming kernel that may
 * read its weights before the wait can do.
 *
 * The dependent chain (dep != NULL, with pdl): after the wait every thread also loads 16
 * bytes of `dep`, the buffer the previous call writes its words into (an L2 round trip that
 * cannot start before the previous grid has completed, as a decode projection's x loads; most
 * lanes read words written earlier, which changes nothing: the load waits for the wait), folds
 * them in, and the CTA meets at a barrier (a partial-sum reduction's) before the write. That
 * is the floor of a weight-streaming kernel whose input is the output of the kernel before it.
 */
#ifndef K3_TOOLS_READ_LIMIT_CUH
#define K3_TOOLS_READ_LIMIT_CUH

#include "bench_common.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

#include <string>
#include <vector>

static __device__ __forceinline__ uint4 k3rl_load(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

template <int THREADS, int UNROLL, bool CONTIG>
__global__ void __launch_bounds__(THREADS)
    k3_read_limit_kernel(const uint4 *__restrict__ p, int64_t n16, unsigned *__restrict__ out,
                         int pdl, const unsigned *__restrict__ dep, int64_t dep_words) {
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    uint32_t acc = 0;
    int64_t i, end, stride;
    if (CONTIG) {
        const int64_t b = blockIdx.x, nb = gridDim.x;
        i = b * n16 / nb + threadIdx.x;
        end = (b + 1) * n16 / nb;
        stride = THREADS;
    } else {
        i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
        end = n16;
        stride = (int64_t)gridDim.x * THREADS;
    }
    for (; i + (UNROLL - 1) * stride < end; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = k3rl_load(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < end; i += stride) {
        const uint4 v = k3rl_load(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    const int64_t wi = ((int64_t)blockIdx.x * THREADS + threadIdx.x) >> 5;
    if (dep) {
        /* 16 bytes per lane, wrapped into the buffer */
        const int64_t q = (wi * 32 + (threadIdx.x & 31)) * 4 % (dep_words & ~(int64_t)3);
        const uint4 d = __ldcg((const uint4 *)(dep + q)); /* L2: the previous call wrote it */
        acc ^= d.x ^ d.y ^ d.z ^ d.w;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if (dep) __syncthreads();
    if ((threadIdx.x & 31) == 0) out[wi] = acc;
}

/* One launch shape of the read-limit sweep. */
struct k3t_read_shape {
    int ctas_per_sm, threads, unroll, contig;
};

/* The sweep: 1, 2, 4, 8 CTAs per SM x 256, 512, 1024 threads x 4, 8 loads in flight x both
 * layouts (48 shapes; some of them run in more than one wave, which the sweep is there to
 * show). */
static inline std::vector<k3t_read_shape> k3t_read_shapes() {
    std::vector<k3t_read_shape> v;
    for (int contig = 0; contig < 2; contig++)
        for (int c : {1, 2, 4, 8})
            for (int t : {256, 512, 1024})
                for (int u : {4, 8}) v.push_back(k3t_read_shape{c, t, u, contig});
    return v;
}

/* Words of `out` a launch writes (one per warp). */
static inline int64_t k3t_read_out_words(const k3t_read_shape &s, int sms) {
    return (int64_t)s.ctas_per_sm * sms * s.threads / 32;
}

/* Enqueues one read of bytes (a multiple of 16) at p on stream; out holds
 * k3t_read_out_words words. dep (with pdl; else NULL): the dependent chain's input, dep_words
 * >= 4 words (16-byte aligned) the previous call wrote. */
static inline cudaError_t k3t_read_launch(const k3t_read_shape &s, int sms, const void *p,
                                          size_t bytes, unsigned *out, bool pdl,
                                          cudaStream_t stream, const unsigned *dep = nullptr,
                                          int64_t dep_words = 0) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)(s.ctas_per_sm * sms));
    lc.blockDim = dim3((unsigned)s.threads);
    lc.stream = stream;
    lc.attrs = pdl ? attr : nullptr;
    lc.numAttrs = pdl ? 1 : 0;
    const uint4 *q = (const uint4 *)p;
    const int64_t n16 = (int64_t)(bytes / 16);
    const int f = pdl ? 1 : 0;
    cudaError_t e = cudaErrorInvalidValue;
#define K3RL_CASE(T_, U_)                                                                  \
    if (s.threads == (T_) && s.unroll == (U_))                                             \
        e = s.contig ? cudaLaunchKernelEx(&lc, k3_read_limit_kernel<T_, U_, true>, q, n16, out, f, \
                                          dep, dep_words)                                  \
                     : cudaLaunchKernelEx(&lc, k3_read_limit_kernel<T_, U_, false>, q, n16, out, f, \
                                          dep, dep_words);
    K3RL_CASE(256, 4) K3RL_CASE(256, 8) K3RL_CASE(512, 4) K3RL_CASE(512, 8)
    K3RL_CASE(1024, 4) K3RL_CASE(1024, 8)
#undef K3RL_CASE
    return e != cudaSuccess ? e : cudaGetLastError();
}

static inline std::string k3t_read_shape_name(const k3t_read_shape &r) {
    char b[64];
    snprintf(b, sizeof b, "c%dt%du%d%s", r.ctas_per_sm, r.threads, r.unroll,
             r.contig ? "contig" : "stride");
    return b;
}

/* The read limit of `bytes`: the best (smallest) median µs per read over k3t_read_shapes(),
 * each timed as a graph of L reads, read j streaming copy j % copies of base (copies of
 * `bytes` bytes each, back to back); chained with PDL when pdl. dep (with pdl): the dependent
 * chain, read j writing half j % 2 of out and reading the other half (out then holds
 * out_words words: twice the largest shape's k3t_read_out_words). *best = the winning shape;
 * each(shape, us) sees every timing (us < 0: it failed). 1e30 when none could be timed. */
template <class F>
static double k3t_read_limit(k3t_timer &t, int sms, const void *base, size_t bytes, int copies,
                             int L, unsigned *out, bool pdl, k3t_read_shape *best, F each,
                             bool dep = false, int64_t out_words = 0) {
    double best_us = 1e30;
    const int64_t half = (out_words / 2) & ~(int64_t)3;
    for (const auto &r : k3t_read_shapes()) {
        const double us = k3t_time_calls(t, L, [&](int j) {
            unsigned *o = dep ? out + (j % 2) * half : out;
            const unsigned *d = dep ? out + ((j + 1) % 2) * half : nullptr;
            return k3t_read_launch(r, sms, (const char *)base + (size_t)(j % copies) * bytes,
                                   bytes, o, pdl, t.s, d, dep ? half : 0) == cudaSuccess;
        });
        each(r, us);
        if (us > 0 && us < best_us) {
            best_us = us;
            if (best) *best = r;
        }
    }
    return best_us;
}

#endif /* K3_TOOLS_READ_LIMIT_CUH */
