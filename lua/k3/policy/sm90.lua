-- sm90.lua: measured cuda.linear.skinny plans for sm90, written by scripts/autotune
-- (tools/autotune.cu); regenerate on the machine rather than editing by hand.
-- An entry exists only where the skinny kernel beat cuBLAS by >= 5%.
-- config.split_k = K-slices per row group in total = kw * kcta, where kw =
-- threads / 32 / (rows / 8) (warps of a CTA on one row group, reduced in shared
-- memory) and kcta = CTAs along K: split_k == kw is the classic one-CTA-per-tile
-- kernel; split_k == kw * kcta (kcta >= 2) is split-K across CTAs (fp32 partials
-- in the context workspace, summed in fixed order by the last CTA of each tile).
return {
  arch = "sm90",
  machine = "NVIDIA H200, 132 SMs, 63 MB L2, CUDA runtime 13000, driver 13000, cuBLAS 130100, copy 4.20 TB/s",
  date = "2026-11-29 23:51 UTC",
  method = "scripts/autotune: CUDA graph of >= 20 back-to-back calls, weights rotated over copies totalling >= 4x L2, median of 15 replays after 3 warm-up, random non-zero bf16 data, every candidate checked against cuBLAS (cublasGemmEx bf16, fp32 compute) before timing; kept where cuBLAS/skinny >= 1.05",
  plans = {
    ["1536x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.03, cublas_us = 9.80},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.06, cublas_us = 9.80},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.12, cublas_us = 9.86},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.16, cublas_us = 9.83},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.20, cublas_us = 9.91},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.26, cublas_us = 9.88},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.26, cublas_us = 9.93},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.38, cublas_us = 9.88},
    },
    ["3072x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.44, cublas_us = 15.27},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.45, cublas_us = 15.28},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.47, cublas_us = 15.22},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.50, cublas_us = 15.32},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.56, cublas_us = 15.40},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.53, cublas_us = 15.38},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.59, cublas_us = 15.44},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.66, cublas_us = 15.47},
      [10] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.75, cublas_us = 15.61},
      [11] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.82, cublas_us = 15.65},
      [12] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.78, cublas_us = 15.62},
      [13] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.95, cublas_us = 15.80},
    },
    ["2112x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.60, cublas_us = 12.67},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.59, cublas_us = 12.69},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.62, cublas_us = 12.57},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.68, cublas_us = 12.63},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.70, cublas_us = 12.73},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.75, cublas_us = 12.65},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.80, cublas_us = 12.70},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.85, cublas_us = 12.60},
      [9] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.15, cublas_us = 12.75},
      [10] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.25, cublas_us = 12.85},
      [11] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.32, cublas_us = 12.77},
      [12] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.45, cublas_us = 12.79},
      [13] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.58, cublas_us = 12.91},
      [14] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.64, cublas_us = 12.81},
      [15] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16}, us = 11.75, cublas_us = 12.74},
      [16] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16}, us = 11.94, cublas_us = 12.87},
    },
    ["2304x1536"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.31, cublas_us = 5.15},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.30, cublas_us = 5.16},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.32, cublas_us = 5.17},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.31, cublas_us = 5.17},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.36, cublas_us = 5.16},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.38, cublas_us = 5.17},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.41, cublas_us = 5.16},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.44, cublas_us = 5.17},
      [9] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.78, cublas_us = 5.14},
      [10] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.79, cublas_us = 5.16},
      [11] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.81, cublas_us = 5.16},
      [12] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.81, cublas_us = 5.18},
      [13] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.83, cublas_us = 5.16},
      [14] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.85, cublas_us = 5.17},
      [15] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.86, cublas_us = 5.16},
      [16] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.91, cublas_us = 5.19},
    },
    -- 4608x1536: cuBLAS wins at every M measured
    -- 3584x7168: cuBLAS wins at every M measured
    -- 6288x7168: cuBLAS wins at every M measured
    ["12448x7168"] = {
      [5] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 2, vec = 8, split_k = 4}, us = 46.19, cublas_us = 48.65},
      [7] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 2, vec = 8, split_k = 4}, us = 46.16, cublas_us = 49.01},
    },
    -- 7168x768: cuBLAS wins at every M measured
    -- 7168x1536: cuBLAS wins at every M measured
    -- 7168x3072: cuBLAS wins at every M measured
    -- 7168x3584: cuBLAS wins at every M measured
    -- 7168x4224: cuBLAS wins at every M measured
    -- 7168x8448: cuBLAS wins at every M measured
    -- 8448x7168: cuBLAS wins at every M measured
    -- 16896x7168: cuBLAS wins at every M measured
    -- 7168x14336: cuBLAS wins at every M measured
    ["20480x7168"] = {
      [5] = {kernel = "skinny", config = {threads = 128, rows = 16, unroll = 4, vec = 8, split_k = 2}, us = 73.76, cublas_us = 77.91},
      [6] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 2}, us = 74.00, cublas_us = 77.80},
      [7] = {kernel = "skinny", config = {threads = 128, rows = 16, unroll = 4, vec = 8, split_k = 2}, us = 74.11, cublas_us = 77.89},
      [8] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 2}, us = 73.99, cublas_us = 78.58},
    },
  },
}
