-- scripts/bench-silu-mul-prologue.lua — the SwiGLU down projection with the silu_mul prologue
-- (k3.linear(x, w, {prologue = "silu_mul"}), x [M, 2K] gate | up) against the separate
-- k3.silu_mul followed by the plain projection, on the GPU: the low-latency plan's kernel (what
-- k3.nn.SwiGLU runs) and cuBLAS, M = 1, 2, 4, 8, 16, for Kimi-K3's TP8 down shape 7168x4224.
-- Then the rms_norm prologue on the stack's q_b shape (2304x1536, x a narrow of [M, 2112]), and
-- the silu_mul epilogue on the gate_up shape 8448x7168 (k3.linear(x, w, {epilogue = "silu_mul"}):
-- gate_up writes h [M, 4224]) against the plain gate_up then k3.silu_mul, through the skinny
-- kernel's classic tiles (in the kernel: rows_per_warp 8 and 16), a split-K-across-CTAs
-- configuration (through a temporary) and cuBLAS (the stack's gate_up today: no plan entry).
-- Each figure is the median µs per call in a CUDA graph of 8 calls rotating 4 weight copies
-- (242 MB, above the 60 MB L2) and 4 inputs; the read floor is the weight's bytes over
-- 4.45 TB/s. Also checks that fused and unfused give the same bits. Writes
-- $OUT/silu_mul_prologue_max_m<K3_SKINNY_PROLOGUE_MAX_M or default>.csv when OUT is set.
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
print(string.format("silu_mul prologue, w %dx%d bf16 (%s), read floor %.2f µs, K3_SKINNY_PROLOGUE_MAX_M=%s",
                    N, K, plan and "plan of this GPU" or "no plan: default method", floor_us,
                    os.getenv("K3_SKINNY_PROLOGUE_MAX_M") or "(default)"))
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
-- The rms_norm prologue on the stack's q_b (2304x1536): x a narrow of the [M, 2112] qkv_a
-- output, q_a_layernorm fused (k3.linear {prologue = "rms_norm"}) against rms_norm then q_b.
do
  local QN, QK = 2304, 1536
  local qws, qms = {}, {}
  for i = 1, COPIES do
    local w = k3.randn({QN, QK}, {dtype = "bf16", device = "cuda", seed = 50 + i})
    qws[i] = w * (1 / math.sqrt(QK))
    w:free()
    local qplan = k3.plan_for(qws[i])
    qms[i] = qplan and k3.method.low_latency(qplan, {static_weights = true}) or k3.method.default()
  end
  local nw = (k3.randn({QK}, {device = "cuda", seed = 60}) * 0.1 + 1):to("bf16")
  print(string.format("rms_norm prologue, w %dx%d bf16, x a narrow of [M, 2112], read floor %.2f µs",
                      QN, QK, QN * QK * 2 / 4.45e12 * 1e6))
  print(string.format("%-4s %-24s %10s %10s %8s %6s", "M", "kernel", "unfused", "fused", "fused/", "bits"))
  for _, M in ipairs({1, 2, 4, 8, 16}) do
    local xs, hs, ys = {}, {}, {}
    for i = 1, COPIES do
      xs[i] = k3.randn({M, 2112}, {dtype = "bf16", device = "cuda", seed = 70 * M + i}):narrow(2, 1, QK)
      hs[i] = k3.empty({M, QK}, o)
      ys[i] = k3.empty({M, QN}, o)
    end
    local opts = {prologue = "rms_norm", norm_weight = nw, eps = 1e-5}
    local chosen = qms[1]:explain(xs[1], qws[1], nil, opts).chosen
    local a = qms[1]:apply(xs[1], qws[1], nil, opts)
    local b = qms[1]:apply(k3.rms_norm(xs[1], nw, 1e-5), qws[1])
    local same = k3.max_abs_diff(a, b) == 0
    local ok_u, unfused = pcall(time, function(i)
      local c = (i - 1) % COPIES + 1
      k3.rms_norm(xs[c], nw, 1e-5, {out = hs[c]})
      qms[c]:apply(hs[c], qws[c], nil, {out = ys[c]})
    end)
    local ok_f, fused = pcall(time, function(i)
      local c = (i - 1) % COPIES + 1
      qms[c]:apply(xs[c], qws[c], nil, {prologue = "rms_norm", norm_weight = nw, eps = 1e-5, out = ys[c]})
    end)
    unfused = ok_u and unfused or 0 / 0
    fused = ok_f and fused or 0 / 0
    if not ok_f then print("  fused timing failed: " .. tostring(fused)) end
    print(string.format("%-4d %-24s %10.2f %10.2f %8.3f %6s", M, chosen, unfused, fused, fused / unfused,
                        same and "same" or "DIFFER"))
    rows[#rows + 1] = string.format("%d,%d,%d,%s rms_norm,%.3f,%.3f,%.3f,%s", QN, QK, M, chosen, unfused,
                                    fused, QN * QK * 2 / 4.45e12 * 1e6, same and "same" or "differ")
  end
end

-- The silu_mul epilogue on gate_up (8448x7168 = [2I, H]): fused h = gate_up(x) with the gate
-- against y = gate_up(x) then silu_mul(y) into h, per kernel path.
do
  local GN, GK = 8448, 7168
  local gws = {}
  for i = 1, COPIES do
    local w = k3.randn({GN, GK}, {dtype = "bf16", device = "cuda", seed = 80 + i})
    gws[i] = w * (1 / math.sqrt(GK))
    w:free()
  end
  local configs = {
    {"skinny 512x32x4", {threads = 512, rows = 32, unroll = 4, vec = 8}},
    {"skinny 256x16x4", {threads = 256, rows = 16, unroll = 4, vec = 8}},
    {"skinny 512x16x8 rpw16", {threads = 512, rows = 16, unroll = 8, vec = 8, split_k = 16, rows_per_warp = 16}},
    {"skinny 256x8x4 kcta2", {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 16}},
  }
  local paths = {}
  for _, c in ipairs(configs) do
    local plan = {}
    for m = 1, 16 do plan[m] = {kernel = "skinny", config = c[2]} end
    local ms = {}
    for i = 1, COPIES do ms[i] = k3.method.low_latency(plan, {static_weights = true}) end
    paths[#paths + 1] = {c[1], function(c_, x, w, opts) return ms[c_]:apply(x, w, nil, opts) end, ms[1]}
  end
  paths[#paths + 1] = {"cuda.linear.cublas", function(_, x, w, opts)
    local o2 = {kernel = "cuda.linear.cublas"}
    for k, v in pairs(opts or {}) do o2[k] = v end
    return k3.linear(x, w, o2)
  end}
  local gfloor = GN * GK * 2 / 4.45e12 * 1e6
  print(string.format("silu_mul epilogue, w %dx%d bf16 (gate | up rows), h [M, %d], read floor %.2f µs",
                      GN, GK, GN // 2, gfloor))
  print(string.format("%-4s %-24s %10s %10s %8s %6s", "M", "kernel", "unfused", "fused", "fused/", "bits"))
  for _, M in ipairs({1, 2, 4, 8, 16}) do
    local xs, ys, hs = {}, {}, {}
    for i = 1, COPIES do
      xs[i] = k3.randn({M, GK}, {dtype = "bf16", device = "cuda", seed = 90 * M + i})
      ys[i] = k3.empty({M, GN}, o)
      hs[i] = k3.empty({M, GN // 2}, o)
    end
    for _, p in ipairs(paths) do
      local apply, label = p[2], p[1]
      if p[3] then -- the kernel the method runs (a declined plan falls back)
        local chosen = p[3]:explain(xs[1], gws[1], nil, {epilogue = "silu_mul"}).chosen
        if chosen ~= "cuda.linear.skinny" then label = label .. " -> " .. tostring(chosen) end
      end
      local a = apply(1, xs[1], gws[1], {epilogue = "silu_mul"})
      local b = k3.silu_mul(apply(1, xs[1], gws[1]))
      local same = k3.max_abs_diff(a, b) == 0
      local ok_u, unfused = pcall(time, function(i)
        local c = (i - 1) % COPIES + 1
        apply(c, xs[c], gws[c], {out = ys[c]})
        k3.silu_mul(ys[c], {out = hs[c]})
      end)
      local ok_f, fused = pcall(time, function(i)
        local c = (i - 1) % COPIES + 1
        apply(c, xs[c], gws[c], {epilogue = "silu_mul", out = hs[c]})
      end)
      unfused = ok_u and unfused or 0 / 0
      fused = ok_f and fused or 0 / 0
      if not ok_f then print("  fused timing failed: " .. tostring(fused)) end
      print(string.format("%-4d %-24s %10.2f %10.2f %8.3f %6s", M, label, unfused, fused,
                          fused / unfused, same and "same" or "DIFFER"))
      rows[#rows + 1] = string.format("%d,%d,%d,%s epilogue,%.3f,%.3f,%.3f,%s", GN, GK, M, label,
                                      unfused, fused, gfloor, same and "same" or "differ")
    end
    for i = 1, COPIES do xs[i]:free(); ys[i]:free(); hs[i]:free() end
  end
end

local out = os.getenv("OUT")
if out and out ~= "" then
  local knob = os.getenv("K3_SKINNY_PROLOGUE_MAX_M")
  local f = assert(io.open(string.format("%s/silu_mul_prologue_max_m%s.csv", out,
                                         knob and knob ~= "" and knob or "default"), "w"))
  f:write("N,K,M,kernel,unfused_us,fused_us,read_floor_us,bits\n", table.concat(rows, "\n"), "\n")
  f:close()
end
