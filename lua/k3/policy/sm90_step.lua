-- sm90_step.lua: plan entries (cuda.linear.skinny configurations, or cuBLAS) measured
-- inside the decode step, written by scripts/tune-step; k3.plan_for lays `plans` over
-- sm90.lua and `silu_mul` over sm90_silu_mul.lua (k3.plan_step).
-- step_us / base_step_us: the step's median time with the entry and with the one it
-- replaces, in the same run; `earlier`: the runs whose entries the file may still carry.
-- Regenerate on the machine rather than editing by hand.
return {
  arch = "sm90",
  machine = "NVIDIA H200",
  date = "2026-12-02 12:25 UTC",
  commit = "dd42f09",
  method = "scripts/tune-step --m 2,4,8 --l2-prefetch 0,8,16,32 --max-candidates 5: kimi-k3-tp8, the step captured with k3.cuda_graph, median of 15 replays after 3, 2 passes alternating with the step as it stood; kept where >= 0.20% faster in every pass",
  earlier = {
    "2026-12-02 12:18 UTC 75bbe5d: scripts/tune-step --m 1,16 --l2-prefetch 0,8,16,32 --max-candidates 5: kimi-k3-tp8, the step captured with k3.cuda_graph, median of 15 replays after 3, 2 passes alternating with the step as it stood; kept where >= 0.20% faster in every pass",
    "2026-12-02 07:05 UTC b4d816c: scripts/tune-step --m 1,2,4,8,16 --l2-prefetch 8,16,32 --max-candidates 12: kimi-k3-tp8, the step captured with k3.cuda_graph, median of 15 replays after 3, 2 passes alternating with the step as it stood; kept where >= 0.20% faster in every pass",
    "2026-12-02 06:55 UTC 3505887: scripts/tune-step --m 1,16: kimi-k3-tp8, the step captured with k3.cuda_graph, median of 15 replays after 3, 2 passes alternating with the step as it stood; kept where >= 0.20% faster in every pass",
    "2026-12-02 01:03 UTC 213a74d: scripts/tune-step --m 1,16: kimi-k3-tp8, the step captured with k3.cuda_graph, median of 15 replays after 3, 2 passes alternating with the step as it stood; kept where >= 0.20% faster in every pass",
  },
  plans = {
    ["2112x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16, balanced = true}, step_us = 7125.52, base_step_us = 7156.70},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16}, step_us = 7244.83, base_step_us = 7393.97},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16}, step_us = 7449.65, base_step_us = 7580.43},
      [16] = {kernel = "skinny", config = {threads = 512, rows = 16, unroll = 4, vec = 8, split_k = 16, rows_per_warp = 16}, step_us = 7788.85, base_step_us = 7872.70},
    },
    ["2304x1536"] = {
      [2] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 8, vec = 8, split_k = 8, rows_per_warp = 16, l2_prefetch_mb = 32}, step_us = 7227.14, base_step_us = 7249.44},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 16, unroll = 4, vec = 8, split_k = 8, l2_prefetch_mb = 32}, step_us = 7317.22, base_step_us = 7351.54},
      [16] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 8, rows_per_warp = 16, l2_prefetch_mb = 32}, step_us = 7769.86, base_step_us = 7798.05},
    },
    ["7168x1536"] = {
      [2] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true, l2_prefetch_mb = 8}, step_us = 7202.64, base_step_us = 7222.43},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true}, step_us = 7367.07, base_step_us = 7450.53},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true}, step_us = 7487.18, base_step_us = 7580.77},
      [16] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 4, rows_per_warp = 16, balanced = true}, step_us = 7952.70, base_step_us = 8013.82},
    },
    ["7168x4224"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true, l2_prefetch_mb = 8}, step_us = 7193.95, base_step_us = 7255.84},
      [2] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true, l2_prefetch_mb = 8}, step_us = 7188.16, base_step_us = 7228.46},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true, l2_prefetch_mb = 8}, step_us = 7219.02, base_step_us = 7257.34},
      [16] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true}, step_us = 7711.36, base_step_us = 7785.02},
    },
  },
  silu_mul = {
    ["8448x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4}, step_us = 7239.79, base_step_us = 7347.25},
      [4] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4}, step_us = 7241.28, base_step_us = 7365.52},
      [8] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4}, step_us = 7342.32, base_step_us = 7486.82},
      [16] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 4}, step_us = 7867.86, base_step_us = 7911.36},
    },
  },
}
