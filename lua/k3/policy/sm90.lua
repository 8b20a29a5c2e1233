-- sm90.lua: measured cuda.linear.skinny plans for sm90, written by scripts/autotune
-- (tools/autotune.cu); regenerate on the machine rather than editing by hand.
-- An entry exists only where the skinny kernel beat cuBLAS by >= 5%.
return {
  arch = "sm90",
  machine = "NVIDIA H200, 132 SMs, 63 MB L2, CUDA runtime 13000, driver 13000, cuBLAS 130100, copy 4.23 TB/s",
  date = "2026-11-29 23:27 UTC",
  method = "scripts/autotune: CUDA graph of >= 20 back-to-back calls, weights rotated over copies totalling >= 4x L2, median of 15 replays after 3 warm-up, random non-zero bf16 data, every candidate checked against cuBLAS (cublasGemmEx bf16, fp32 compute) before timing; kept where cuBLAS/skinny >= 1.05",
  plans = {
    ["1536x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.00, cublas_us = 9.97},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.00, cublas_us = 9.97},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.03, cublas_us = 9.90},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.10, cublas_us = 9.93},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.11, cublas_us = 9.91},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.22, cublas_us = 9.86},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.24, cublas_us = 9.88},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 9.39, cublas_us = 9.86},
    },
    ["3072x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.31, cublas_us = 15.98},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.41, cublas_us = 16.05},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.43, cublas_us = 15.92},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.47, cublas_us = 15.90},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.52, cublas_us = 15.73},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.62, cublas_us = 15.68},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.66, cublas_us = 15.55},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 13.71, cublas_us = 15.57},
      [9] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.87, cublas_us = 15.91},
      [10] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.92, cublas_us = 16.02},
      [11] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.92, cublas_us = 16.02},
      [12] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 14.97, cublas_us = 16.03},
    },
    ["2112x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.53, cublas_us = 12.79},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.56, cublas_us = 12.80},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.60, cublas_us = 12.78},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.60, cublas_us = 12.77},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.65, cublas_us = 12.78},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.72, cublas_us = 12.86},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.77, cublas_us = 12.71},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 10.87, cublas_us = 12.77},
      [9] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.29, cublas_us = 12.92},
      [10] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 11.24, cublas_us = 12.97},
      [11] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16}, us = 11.58, cublas_us = 12.95},
      [12] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16}, us = 11.66, cublas_us = 12.95},
      [13] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16}, us = 11.76, cublas_us = 12.91},
      [14] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 11.76, cublas_us = 12.92},
      [15] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 11.88, cublas_us = 12.88},
      [16] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 12.16, cublas_us = 12.92},
    },
    ["2304x1536"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.27, cublas_us = 5.12},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.29, cublas_us = 5.11},
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.30, cublas_us = 5.11},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.29, cublas_us = 5.12},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.33, cublas_us = 5.11},
      [6] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.35, cublas_us = 5.10},
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.38, cublas_us = 5.12},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 16}, us = 4.42, cublas_us = 5.11},
      [9] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.73, cublas_us = 5.13},
      [10] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.74, cublas_us = 5.15},
      [11] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.76, cublas_us = 5.16},
      [12] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.76, cublas_us = 5.13},
      [13] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.80, cublas_us = 5.14},
      [14] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.83, cublas_us = 5.14},
      [15] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.85, cublas_us = 5.15},
      [16] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 8}, us = 4.85, cublas_us = 5.13},
    },
    -- 4608x1536: cuBLAS wins at every M measured
    ["3584x7168"] = {
      [7] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 16.39, cublas_us = 17.22},
    },
    ["6288x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 8}, us = 24.70, cublas_us = 26.09},
    },
    ["12448x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 8}, us = 45.78, cublas_us = 49.93},
      [2] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 2, vec = 8, split_k = 4}, us = 45.80, cublas_us = 49.98},
      [3] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 2, vec = 8, split_k = 4}, us = 45.91, cublas_us = 49.47},
      [4] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 2, vec = 8, split_k = 4}, us = 45.87, cublas_us = 49.54},
      [5] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 2, vec = 8, split_k = 4}, us = 45.95, cublas_us = 49.75},
      [6] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 4, vec = 8, split_k = 4}, us = 45.71, cublas_us = 50.04},
      [7] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 2, vec = 8, split_k = 4}, us = 45.82, cublas_us = 49.41},
      [8] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 4, vec = 8, split_k = 4}, us = 45.71, cublas_us = 49.54},
      [9] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 8, vec = 8, split_k = 4}, us = 46.52, cublas_us = 48.93},
      [10] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 8, vec = 8, split_k = 4}, us = 46.58, cublas_us = 48.94},
    },
    -- 7168x768: cuBLAS wins at every M measured
    -- 7168x1536: cuBLAS wins at every M measured
    ["7168x3072"] = {
      [5] = {kernel = "skinny", config = {threads = 128, rows = 8, unroll = 4, vec = 8, split_k = 4}, us = 14.70, cublas_us = 15.46},
    },
    -- 7168x3584: cuBLAS wins at every M measured
    -- 7168x4224: cuBLAS wins at every M measured
    -- 7168x8448: cuBLAS wins at every M measured
    -- 8448x7168: cuBLAS wins at every M measured
    -- 16896x7168: cuBLAS wins at every M measured
    ["7168x14336"] = {
      [3] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 54.46, cublas_us = 57.20},
      [5] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 8, vec = 8, split_k = 16}, us = 54.64, cublas_us = 57.53},
    },
    ["20480x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 128, rows = 16, unroll = 4, vec = 8, split_k = 2}, us = 73.82, cublas_us = 78.04},
      [2] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 2}, us = 73.51, cublas_us = 77.92},
      [3] = {kernel = "skinny", config = {threads = 128, rows = 16, unroll = 4, vec = 8, split_k = 2}, us = 73.63, cublas_us = 77.72},
      [5] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 2}, us = 74.03, cublas_us = 78.76},
      [6] = {kernel = "skinny", config = {threads = 128, rows = 16, unroll = 4, vec = 8, split_k = 2}, us = 73.84, cublas_us = 78.01},
      [7] = {kernel = "skinny", config = {threads = 128, rows = 16, unroll = 4, vec = 8, split_k = 2}, us = 74.17, cublas_us = 77.94},
      [8] = {kernel = "skinny", config = {threads = 128, rows = 16, unroll = 4, vec = 8, split_k = 2}, us = 73.88, cublas_us = 79.86},
    },
  },
}
