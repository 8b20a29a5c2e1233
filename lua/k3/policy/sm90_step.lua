-- sm90_step.lua: cuda.linear.skinny plan entries measured inside the decode step,
-- written by scripts/tune-step; k3.plan_for lays them over sm90.lua (k3.plan_step).
-- step_us / base_step_us: the step's median time with the entry and with the one it
-- replaces, in the same run. Regenerate on the machine rather than editing by hand.
return {
  arch = "sm90",
  machine = "NVIDIA H200",
  date = "2026-12-02 01:03 UTC",
  commit = "213a74d",
  method = "scripts/tune-step --m 1,16: kimi-k3-tp8, the step captured with k3.cuda_graph, median of 15 replays after 3, 2 passes alternating with the step as it stood; kept where >= 0.20% faster in every pass",
  plans = {
    ["2112x7168"] = {
      [1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16, balanced = true}, step_us = 7125.52, base_step_us = 7156.70},
    },
    ["7168x1536"] = {
      [16] = {kernel = "skinny", config = {threads = 256, rows = 32, unroll = 4, vec = 8, split_k = 4, rows_per_warp = 16, balanced = true}, step_us = 7952.70, base_step_us = 8013.82},
    },
  },
  silu_mul = {
  },
}
