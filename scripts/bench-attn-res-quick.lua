-- scripts/k3 scripts/bench-attn-res-quick.lua — one line per case: the AttnRes kernel dispatch
-- picks ($K3_BENCH_KERNEL when set) in a
-- CUDA graph at T = 1, 16, 256, 4096 x num_blocks = 1, 8 (H = 7168, S = 8, bf16, delta and
-- output norm), inputs rotated over enough sets to exceed L2, out = preallocated; µs per call
-- and % of the floor (bytes / 4.27 TB/s). An argument "1,16" times only those T.
local k3 = require "k3"
local H, S, BW = 7168, 8, 4.27e12
local K = os.getenv("K3_BENCH_KERNEL")
local function bytes(T, nb) return 2 * H * (T * (4 + nb) + 3) end
local TS = {1, 16, 256, 4096}
if arg[1] then
  TS = {}
  for t in arg[1]:gmatch("%d+") do TS[#TS + 1] = tonumber(t) end
end
for _, T in ipairs(TS) do
  local per = 2 * H * T * (4 + S)
  local n = math.max(2, math.min(512, math.ceil(200e6 / per)))
  local P = k3.randn({n * T, H}, {device = "cuda", dtype = "bf16", seed = 1})
  local D = k3.randn({n * T, H}, {device = "cuda", dtype = "bf16", seed = 2})
  local B = k3.randn({n * T, S, H}, {device = "cuda", dtype = "bf16", seed = 3})
  local O = k3.empty({n * T, H}, {device = "cuda", dtype = "bf16"})
  local NW = k3.ones({H}, {device = "cuda", dtype = "bf16"})
  local QW = (k3.randn({H}, {dtype = "bf16", seed = 4}) * 0.1):to("cuda")
  for _, nb in ipairs({1, 8}) do
    local args = {}
    for c = 1, n do
      local r = (c - 1) * T + 1
      args[c] = {prefix = P:narrow(1, r, T), delta = D:narrow(1, r, T), blocks = B:narrow(1, r, T),
                 num_blocks = nb, norm_weight = NW, qk_weight = QW, output_norm_weight = NW,
                 out = O:narrow(1, r, T), kernel = K}
    end
    local us = k3.cuda_time(function(i) k3.attn_res(args[(i - 1) % n + 1]) end,
                            {graph = true, calls = n, iters = 20})
    local floor = bytes(T, nb) / BW * 1e6
    print(string.format("%s T=%-5d nb=%d  %8.2f us  floor %7.2f us  %5.1f%% of floor  (%d sets)",
                        K or "dispatch", T, nb, us, floor, 100 * floor / us, n))
  end
  for _, t in ipairs({P, D, B, O, NW, QW}) do t:free() end
end
