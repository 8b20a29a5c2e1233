-- sm90_step.lua: cuda.linear.skinny plan entries measured inside the decode step,
-- written by scripts/tune-step; k3.plan_for lays them over sm90.lua (k3.plan_step).
-- step_us / base_step_us: the step's median time with the entry and with the one it
-- replaces, in the same run. Regenerate on the machine rather than editing by hand.
return {
  arch = "sm90",
  machine = "NVIDIA H200",
  date = "2026-12-02 06:55 UTC",
  commit = "3505887",
  method = "scripts/tune-step --m 1,16: kimi-k3-tp8, the step captured with k3.cuda_graph, median of 15 replays after 3, 2 passes alternating with the step as it stood; kept where >= 0.20% faster in every pass",
  plans = {
    ["2112x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16, balanced = true}, step_us = 7125.52, base_step_us = 7156.70},
    },
    ["7168x1536"] = {
      [16] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 4, rows_per_warp = 16, balanced = true}, step_us = 7952.70, base_step_us = 8013.82},
    },
    ["7168x4224"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4, balanced = true, l2_prefetch_mb = 16}, step_us = 7177.30, base_step_us = 7243.86},
      [16] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 4, rows_per_warp = 16, balanced = true}, step_us = 7769.02, base_step_us = 7870.88},
    },
  },
  silu_mul = {
    ["8448x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 32, unroll = 4, vec = 8, split_k = 4}, step_us = 7239.79, base_step_us = 7347.25},
      [16] = {kernel = "skinny", config = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 4}, step_us = 7867.86, base_step_us = 7911.36},
    },
  },
}
