-- The decode work every host script shares: the `tiny` Kimi-K3 stack when k3.model.kimi_k3
-- is there, otherwise a few real ops shaped like one decode step (linear, attn_res,
-- rms_norm). step(frame) runs one decode step and returns its output as exact hex floats.
local k3 = require "k3"

local M = {}

local ok, kimi = pcall(require, "k3.model.kimi_k3")

-- Exact text of a tensor's values: equal strings mean equal results, bit for bit.
local function exact(t)
  local parts = {}
  for _, row in ipairs(t:to("f64"):totable()) do
    for _, v in ipairs(row) do parts[#parts + 1] = string.format("%a", v) end
  end
  return table.concat(parts, " ")
end

if ok then
  M.kind = "tiny"
  local cfg = kimi.config("tiny")
  local stack = kimi.build(cfg, kimi.generate_weights(cfg, {seed = 1234, dtype = "bf16"}))
  -- Decode batches cycle through M = 1..4 tokens.
  function M.step(frame)
    local T = (frame - 1) % 4 + 1
    local x <close> = kimi.embedding(cfg, T, {step = frame, dtype = "bf16"})
    local y <close> = stack:forward(x)
    return exact(y)
  end
else
  M.kind = "ops"
  local H, S = 256, 4
  local opts = {dtype = "bf16"}
  local w_in = k3.randn({4 * H, H}, {dtype = "bf16", seed = 1}) * (1 / 16)
  local w_out = k3.randn({H, 4 * H}, {dtype = "bf16", seed = 2}) * (1 / 32)
  local norm = k3.ones({H}, opts)
  local query = k3.randn({H}, {dtype = "bf16", seed = 3}) * (1 / 16)
  local blocks = {}
  function M.step(frame)
    local T = (frame - 1) % 4 + 1
    if not blocks[T] then blocks[T] = k3.randn({T, S, H}, {dtype = "bf16", seed = 10 + T}) end
    local prefix <close> = k3.randn({T, H}, {dtype = "bf16", seed = 100 + frame})
    local h <close> = k3.attn_res{prefix = prefix, blocks = blocks[T], num_blocks = S - 1,
                                  norm_weight = norm, qk_weight = query, output_norm_weight = norm}
    local up <close> = k3.linear(h, w_in)
    local down <close> = k3.linear(up, w_out, {residual = prefix})
    local y <close> = k3.rms_norm(down, norm, 1e-5)
    return exact(y)
  end
end

return M
