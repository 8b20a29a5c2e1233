-- scripts/k3 scripts/attn-res-launches.lua [T:nb ...] — a few eager launches of one AttnRes
-- kernel for a profiler (ncu -k regex:attn_res): for each T:nb (default 1:1 1:8 16:8), two
-- calls with H = 7168, 8 block slots, bf16, delta and output norm, out preallocated, each on
-- inputs of its own (cold in L2 unless the profiler keeps caches). The kernel is
-- $K3_BENCH_KERNEL (default cuda.attn_res.decode); the launch variables (K3_ATTN_RES_PDL,
-- K3_ATTN_RES_DECODE_CTAS) pick the shape.
local k3 = require "k3"
local H, S = 7168, 8
local K = os.getenv("K3_BENCH_KERNEL") or "cuda.attn_res.decode"
local cases = {}
for _, a in ipairs(arg) do
  local T, nb = a:match("^(%d+):(%d+)$")
  if not T then error("attn-res-launches: expected T:nb, got '" .. a .. "'") end
  cases[#cases + 1] = {tonumber(T), tonumber(nb)}
end
if #cases == 0 then cases = {{1, 1}, {1, 8}, {16, 8}} end
local o = {device = "cuda", dtype = "bf16"}
for i, c in ipairs(cases) do
  local T, nb = c[1], c[2]
  for rep = 1, 2 do
    local seed = 100 * i + 10 * rep
    local function rnd(shape, s) return k3.randn(shape, {device = "cuda", dtype = "bf16", seed = seed + s}) end
    local a = {prefix = rnd({T, H}, 1), delta = rnd({T, H}, 2), blocks = rnd({T, S, H}, 3),
               num_blocks = nb, norm_weight = rnd({H}, 4), qk_weight = rnd({H}, 5),
               output_norm_weight = rnd({H}, 6), eps = 1e-5, output_eps = 1e-5,
               out = k3.empty({T, H}, o), kernel = K}
    local e = k3.explain("attn_res", a)
    k3.attn_res(a)
    k3.synchronize()
    if rep == 1 then print(string.format("T=%d num_blocks=%d: %s", T, nb, e.chosen)) end
  end
end
