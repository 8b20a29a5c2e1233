-- scripts/bench-silu-mul-prologue.lua — the SwiGLU down projection with the silu_mul prologue
-- (k3.linear(x, w, {prologue = "silu_mul"}), x [M, 2K] gate | up) against the separate
-- k3.silu_mul followed by the plain projection, on the GPU: the low-latency plan's kernel (what
-- k3.nn.SwiGLU runs) and cuBLAS, M = 1, 2, 4, 8, 16, for Kimi-K3's TP8 down shape 7168x4224.
-- Each figure is the median µs per call in a CUDA graph of 8 calls rotating 4 weight copies
-- (242 MB, above the 60 MB L2) and 4 inputs; the read floor is the weight's bytes over
-- 4.45 TB/s. Also checks that fused and unfused give the same bits. Writes
-- $OUT/silu_mul_prologue_max_m<K3_SKINNY_SILU_MAX_M or default>.csv when OUT is set.
--   scripts/k3 scripts/bench-silu-mul-prologue.lua [N K]
local k3 = require "k3"

if not k3.backends().cuda.available then
  print("bench-silu-mul-prologue: no CUDA device: " .. tostring(k3.backends().cuda.reason))
  os.exit(1)
end
local N, K = tonumber(arg[1]) or 7168, tonumber(arg[2]) or 4224
local COPIES, CALLS = 4, 8
local o = {dtype = "bf16", device = "cuda"}
local ws = {}
for i = 1, COPIES do
  local w = k3.randn({N, K}, {dtype = "bf16", device = "cuda", seed = 10 + i})
  ws[i] = w * (1 / math.sqrt(K))
  w:free()
end
local plan = k3.plan_for(ws[1])
local methods = {}
for i = 1, COPIES do
  methods[i] = plan and k3.method.low_latency(plan, {static_weights = true}) or k3.method.default()
end
local floor_us = N * K * 2 / 4.45e12 * 1e6

local rows = {}
local function time(fn)
  local us = k3.cuda_time(fn, {iters = 30, warmup = 3, graph = true, calls = CALLS})
  return us
end
print(string.format("silu_mul prologue, w %dx%d bf16 (%s), read floor %.2f µs, K3_SKINNY_SILU_MAX_M=%s",
                    N, K, plan and "plan of this GPU" or "no plan: default method", floor_us,
                    os.getenv("K3_SKINNY_SILU_MAX_M") or "(default)"))
print(string.format("%-4s %-24s %10s %10s %8s %6s", "M", "kernel", "unfused", "fused", "fused/", "bits"))
for _, M in ipairs({1, 2, 4, 8, 16}) do
  local xs, hs, ys = {}, {}, {}
  for i = 1, COPIES do
    local v = k3.randn({M, 2 * K}, {dtype = "bf16", device = "cuda", seed = 100 * M + i})
    local g = v:narrow(2, 1, K)
    g:copy(g * 3)
    xs[i] = v
    hs[i] = k3.empty({M, K}, o)
    ys[i] = k3.empty({M, N}, o)
  end
  local chosen = methods[1]:explain(xs[1], ws[1], nil, {prologue = "silu_mul"}).chosen
  local paths = {
    {chosen .. " (plan)", function(i)
      local c = (i - 1) % COPIES + 1
      k3.silu_mul(xs[c], {out = hs[c]})
      methods[c]:apply(hs[c], ws[c], nil, {out = ys[c]})
    end, function(i)
      local c = (i - 1) % COPIES + 1
      methods[c]:apply(xs[c], ws[c], nil, {prologue = "silu_mul", out = ys[c]})
    end, function()
      return methods[1]:apply(xs[1], ws[1], nil, {prologue = "silu_mul"}),
             methods[1]:apply(k3.silu_mul(xs[1]), ws[1])
    end},
    {"cuda.linear.cublas", function(i)
      local c = (i - 1) % COPIES + 1
      k3.silu_mul(xs[c], {out = hs[c]})
      k3.linear(hs[c], ws[c], {out = ys[c], kernel = "cuda.linear.cublas"})
    end, function(i)
      local c = (i - 1) % COPIES + 1
      k3.linear(xs[c], ws[c], {prologue = "silu_mul", out = ys[c], kernel = "cuda.linear.cublas"})
    end, function()
      return k3.linear(xs[1], ws[1], {prologue = "silu_mul", kernel = "cuda.linear.cublas"}),
             k3.linear(k3.silu_mul(xs[1]), ws[1], {kernel = "cuda.linear.cublas"})
    end},
  }
  for _, p in ipairs(paths) do
    local a, b = p[4]()
    local same = k3.max_abs_diff(a, b) == 0
    local ok_u, unfused = pcall(time, p[2])
    local ok_f, fused = pcall(time, p[3])
    unfused = ok_u and unfused or 0 / 0
    fused = ok_f and fused or 0 / 0
    if not ok_f then print("  fused timing failed: " .. tostring(fused)) end
    print(string.format("%-4d %-24s %10.2f %10.2f %8.3f %6s", M, p[1], unfused, fused,
                        fused / unfused, same and "same" or "DIFFER"))
    rows[#rows + 1] = string.format("%d,%d,%d,%s,%.3f,%.3f,%.3f,%s", N, K, M, p[1], unfused, fused,
                                    floor_us, same and "same" or "differ")
  end
  for i = 1, COPIES do xs[i]:free(); hs[i]:free(); ys[i]:free() end
end
local out = os.getenv("OUT")
if out and out ~= "" then
  local knob = os.getenv("K3_SKINNY_SILU_MAX_M")
  local f = assert(io.open(string.format("%s/silu_mul_prologue_max_m%s.csv", out,
                                         knob and knob ~= "" and knob or "default"), "w"))
  f:write("N,K,M,kernel,unfused_us,fused_us,read_floor_us,bits\n", table.concat(rows, "\n"), "\n")
  f:close()
end
