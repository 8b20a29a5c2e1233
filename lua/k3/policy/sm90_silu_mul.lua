-- sm90_silu_mul.lua: measured cuda.linear.skinny plans for sm90, written by scripts/autotune
-- (tools/autotune.cu); regenerate on the machine rather than editing by hand.
-- An entry exists only where the skinny kernel beat cuBLAS by >= 5% in two
-- timing passes interleaved with cuBLAS (us and cublas_us: the slower pass of the
-- kernel, the faster of cuBLAS), launched with PDL and static weights as k3.nn runs
-- it. config.split_k = K-slices per row group = kw * kcta (kw = threads / 32 /
-- (rows / rows_per_warp) warps of a CTA, kcta CTAs along K; kcta >= 2: split-K
-- across CTAs); rows_per_warp = 16: each warp streams two 8-row groups.
-- These plans are for the SwiGLU gate_up call with {epilogue = "silu_mul"}
-- (w = gate rows | up rows, the call writes silu(gate) * up): the kernel
-- applies the epilogue itself, cuBLAS is followed by a silu_mul kernel;
-- k3.plan_for(w, {epilogue = "silu_mul"}) reads them.
return {
  arch = "sm90",
  machine = "NVIDIA H200, 132 SMs, 63 MB L2, CUDA runtime 13000, driver 13000, cuBLAS 130100, copy 4.23 TB/s",
  date = "2026-12-01 17:43 UTC",
  method = "scripts/autotune: CUDA graph of >= 20 back-to-back calls chained through x (each reads the previous y), weights rotated over copies totalling >= 4x L2, median of 15 replays after 3 warm-up, random non-zero bf16 data, every candidate checked against cuBLAS (cublasGemmEx bf16, fp32 compute) before timing; the fastest kept where cuBLAS/skinny >= 1.05 in two more passes, each cuBLAS then the candidate; skinny launch: PDL, static weights; kinds classic,classic16,split; epilogue silu_mul: each call writes h = silu(gate) * up in the kernel, against cuBLAS then a separate silu_mul kernel",
  plans = {
    ["8448x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 8}, us = 30.46, cublas_us = 32.45},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4}, us = 30.35, cublas_us = 32.07},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4}, us = 30.41, cublas_us = 32.19},
      [4] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 4}, us = 30.27, cublas_us = 32.28},
      [5] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 4}, us = 30.12, cublas_us = 31.92},
      [6] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 4}, us = 30.05, cublas_us = 31.98},
      [7] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 4}, us = 30.10, cublas_us = 32.11},
      [8] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 4}, us = 30.07, cublas_us = 32.12},
    },
  },
}
