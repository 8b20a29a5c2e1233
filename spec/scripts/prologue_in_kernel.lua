-- spec/scripts/prologue_in_kernel.lua — run by spec/skinny_spec.lua in a child process with
-- K3_SKINNY_PROLOGUE_MAX_M=16, so cuda.linear.skinny applies its prologues in the kernel
-- (the setting is read once per process): for the silu_mul and rms_norm prologues, over
-- classic and split configurations and M = 1..16, the fused call must give the bits of the
-- separate op followed by the same plan, into a NaN-poisoned out. Prints one line per failure
-- and a last line "in-kernel prologues: N cases, F differ"; exits 1 on any failure.
local k3 = require "k3"

local function bf16(shape, seed, scale)
  local t = k3.randn(shape, {dtype = "f32", seed = seed, device = "cuda"})
  if scale then t = t * scale end
  local b = t:to("bf16")
  t:free()
  return b
end
local function poisoned(M, N)
  local t = k3.empty({M, N}, {dtype = "bf16", device = "cuda"})
  t:fill(0 / 0)
  return t
end
local function plan(config)
  local p = {}
  for m = 1, 16 do p[m] = {kernel = "skinny", config = config} end
  return p
end
local configs = {
  {threads = 512, rows = 32, unroll = 4, vec = 8},             -- the down plan's
  {threads = 256, rows = 8, unroll = 4, vec = 8},              -- the kernel's default
  {threads = 128, rows = 8, unroll = 8, vec = 8},
  {threads = 512, rows = 64, unroll = 4, vec = 8},
  {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 16}, -- split-K across 2 CTAs
  {threads = 512, rows = 8, unroll = 2, vec = 8, split_k = 48}, -- ... 3 CTAs
}
local cases, bad = 0, 0
local function check(fused, unfused, what)
  cases = cases + 1
  local f, u = fused:to("cpu"), unfused:to("cpu")
  local nan = false
  for _, row in ipairs(f:totable()) do
    for _, v in ipairs(row) do nan = nan or v ~= v end
  end
  local d = k3.max_abs_diff(f, u)
  if nan or d ~= 0 then
    bad = bad + 1
    print(string.format("DIFFER %s: max |fused - unfused| = %g%s", what, d, nan and " (NaN left)" or ""))
  end
end

for ci, config in ipairs(configs) do
  local ll = k3.method.low_latency(plan(config), {static_weights = true})
  -- silu_mul: the down projection's K (4224) and a partial last chunk (4104)
  for si, s in ipairs({{264, 4224}, {200, 4104}}) do
    local N, K = s[1], s[2]
    local w = bf16({N, K}, 100 * ci + si, 1 / math.sqrt(K))
    -- M = 5 at K = 4224: h (42.6 KB) is under 48 KB but not with the kernel's static
    -- partials, so the launch needs the shared-memory opt-in all the same
    for _, M in ipairs({1, 2, 5, 8, 9, 16}) do
      local x = bf16({M, 2 * K}, 1000 * ci + 10 * si + M)
      local g = x:narrow(2, 1, K)
      g:copy(g * 3)
      local what = string.format("silu_mul %dx%d config %d M=%d", N, K, ci, M)
      local fused = ll:apply(x, w, nil, {prologue = "silu_mul", out = poisoned(M, N)})
      check(fused, ll:apply(k3.silu_mul(x), w, nil, {out = poisoned(M, N)}), what)
    end
  end
  -- rms_norm: the q_b shape with x a narrow of [M, 2112], and rows that take the rescaled pass
  local N, K = 2304, 1536
  local w = bf16({N, K}, 500 + ci, 1 / math.sqrt(K))
  local nw = bf16({K}, 600 + ci, 0.1)
  nw:copy(nw + 1)
  for _, M in ipairs({1, 3, 8, 12, 16}) do
    for _, scale in ipairs({1, 1e30, 1e-30}) do
      local eps = scale == 1e-30 and 0 or 1e-5
      local x = bf16({M, 2112}, 2000 * ci + M, scale):narrow(2, 1, K)
      local what = string.format("rms_norm %dx%d config %d M=%d scale %g", N, K, ci, M, scale)
      local fused = ll:apply(x, w, nil, {prologue = "rms_norm", norm_weight = nw, eps = eps, out = poisoned(M, N)})
      check(fused, ll:apply(k3.rms_norm(x, nw, eps), w, nil, {out = poisoned(M, N)}), what)
    end
  end
  -- rms_norm past H = 2048 (cuda.rms_norm.generic holds 32 values a thread) and past 8192 (its
  -- loop form), rescaled passes included: the same bits as the kernel's own prologue
  for _, s in ipairs({{200, 4104, {1, 16}}, {64, 8200, {1, 4}}}) do
    local N2, K2 = s[1], s[2]
    local w2 = bf16({N2, K2}, 700 + ci, 1 / math.sqrt(K2))
    local nw2 = bf16({K2}, 800 + ci, 0.1)
    nw2:copy(nw2 + 1)
    for _, M in ipairs(s[3]) do
      for _, scale in ipairs({1, 1e30, 1e-30}) do
        local eps = scale == 1e-30 and 0 or 1e-5
        local x = bf16({M, K2 + 8}, 3000 * ci + M, scale):narrow(2, 1, K2)
        local what = string.format("rms_norm %dx%d config %d M=%d scale %g", N2, K2, ci, M, scale)
        local fused = ll:apply(x, w2, nil, {prologue = "rms_norm", norm_weight = nw2, eps = eps, out = poisoned(M, N2)})
        check(fused, ll:apply(k3.rms_norm(x, nw2, eps), w2, nil, {out = poisoned(M, N2)}), what)
      end
    end
  end
end
print(string.format("in-kernel prologues: %d cases, %d differ", cases, bad))
os.exit(bad == 0 and 0 or 1)
