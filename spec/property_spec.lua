-- Properties over random tiny shapes and stride layouts (seeded; K3_PROPERTY_SEED overrides
-- the base seed, and a failure names the seed of its layout): for linear, attn_res, rms_norm and
-- silu_mul, every registered kernel forced onto the call either runs and matches the fp64
-- reference (cpu.linear.reference / cpu.attn_res.reference on f64 copies; plain-Lua fp64
-- formulas for rms_norm and silu_mul) or refuses with an error;
-- dispatch's own choice (k3.explain) is the kernel that runs (k3.trace), and its result
-- matches the reference too. Outputs are poisoned with NaN first, so unwritten elements show.
local k3 = require "k3"
local H = require "spec.helpers"

local BASE = tonumber(os.getenv("K3_PROPERTY_SEED") or "") or 20260
local LAYOUTS = 2000
local DTYPES = {"f32", "f64", "bf16", "f16"}
local TOL = {f64 = 1e-12, f32 = 2e-5, bf16 = 2e-2, f16 = 4e-3}

local function kernels_for(op)
  local r = {}
  for _, name in ipairs(k3.kernels()) do
    if name:match("^%w+%." .. op .. "%.") then r[#r + 1] = name end
  end
  return r
end

-- A [r, c] tensor of dtype dt in one of several layouts, with random values; every layout has
-- a unit last stride except "strided" (which kernels must handle or refuse).
local function layout2(r, c, dt, allow_bcast)
  local kinds = {"contiguous", "transposed", "padded", "offset", "strided"}
  if allow_bcast then kinds[#kinds + 1] = "broadcast" end
  local kind = kinds[math.random(#kinds)]
  local seed = math.random(1, 1 << 30)
  local opts = {dtype = dt, seed = seed}
  if kind == "transposed" then return k3.randn({c, r}, opts):t(), kind end
  if kind == "padded" then return k3.randn({r, c + math.random(1, 3)}, opts):narrow(2, 1, c), kind end
  if kind == "offset" then
    return k3.randn({r + 1, c + 1}, opts):narrow(1, 2, r):narrow(2, 2, c), kind
  end
  if kind == "strided" then
    local base = k3.randn({r * c * 2 + 2}, opts)
    return base:as_strided({r, c}, {2 * c, 2}, 1), kind
  end
  if kind == "broadcast" then return k3.randn({1, c}, opts):expand({r, c}), kind end
  return k3.randn({r, c}, opts), kind
end

local function f64(t) return t and t:to("f64") or nil end

local function close(got, want, dt, scale)
  local d = k3.max_abs_diff(got:to("f64"), want)
  return d <= TOL[dt] * scale, d
end

describe("properties: linear", function()
  it(string.format("%d random layouts: forced kernels and dispatch match the fp64 reference", LAYOUTS), function()
    local names = kernels_for("linear")
    local ran, refused = 0, 0
    for i = 1, LAYOUTS do
      local seed = BASE + i
      math.randomseed(seed)
      local dt = DTYPES[math.random(#DTYPES)]
      local M, K, N = math.random(0, 4), math.random(0, 5), math.random(0, 4)
      local x = layout2(M, K, dt, true)
      local w = layout2(N, K, dt, true)
      local bias = math.random() < 0.3 and k3.randn({N}, {dtype = dt, seed = seed}) or nil
      local res = math.random() < 0.3 and layout2(M, N, dt, true) or nil
      local ref = k3.linear(f64(x), f64(w), {bias = f64(bias), residual = f64(res), kernel = "cpu.linear.reference"})
      local scale = (K + 2) * 16
      local function check(y, who)
        local ok, d = close(y, ref, dt, scale)
        assert(ok, string.format("seed %d: %s on %s [%d,%d]x[%d,%d]^T differs from the reference by %g",
          seed, who, dt, M, K, N, K, d))
        assert(not H.has_nan(y), string.format("seed %d: %s left NaN in out", seed, who))
      end
      for _, name in ipairs(names) do
        local out = H.poisoned({M, N}, {dtype = dt})
        local ok, err = pcall(k3.linear, x, w, {bias = bias, residual = res, out = out, kernel = name})
        if ok then
          ran = ran + 1
          check(out, name)
        else
          refused = refused + 1
          assert(type(err) == "string" and err:find("linear", 1, true),
            string.format("seed %d: %s failed without a linear message: %s", seed, name, tostring(err)))
        end
      end
      local e = k3.explain("linear", x, w, {bias = bias, residual = res})
      assert(e.chosen, string.format("seed %d: dispatch chose nothing", seed))
      local y
      local tr = k3.trace(function() y = k3.linear(x, w, {bias = bias, residual = res}) end)
      assert.equal(e.chosen, tr[#tr].kernel)
      check(y, "dispatch (" .. e.chosen .. ")")
    end
    assert.is_true(ran > LAYOUTS)
  end)
end)

-- [T, S, H] blocks in one of several layouts (unit last stride always).
local function blocks_layout(T, S, Hd, dt)
  local kind = math.random(4)
  local opts = {dtype = dt, seed = math.random(1, 1 << 30)}
  if kind == 1 then return k3.randn({T, S, Hd}, opts) end
  if kind == 2 then return k3.randn({S, T, Hd}, opts):transpose(1, 2) end
  if kind == 3 then return k3.randn({T, S + 1, Hd + 2}, opts):narrow(2, 1, S):narrow(3, 2, Hd) end
  return k3.randn({T, S, Hd + 3}, opts):narrow(3, 1, Hd)
end

local function rows_layout(T, Hd, dt)
  if math.random() < 0.5 then return k3.randn({T, Hd}, {dtype = dt, seed = math.random(1, 1 << 30)}) end
  return H.padded(T, Hd, math.random(1, 3), {dtype = dt, seed = math.random(1, 1 << 30)})
end

describe("properties: attn_res", function()
  it(string.format("%d random layouts: forced kernels and dispatch match the fp64 reference", LAYOUTS), function()
    local names = kernels_for("attn_res")
    local ran = 0
    for i = 1, LAYOUTS do
      local seed = BASE + 100000 + i
      math.randomseed(seed)
      local dt = DTYPES[math.random(#DTYPES)]
      local T, Hd, S = math.random(0, 3), math.random(1, 5), math.random(0, 3)
      local args = {
        prefix = rows_layout(T, Hd, dt),
        delta = math.random() < 0.4 and rows_layout(T, Hd, dt) or nil,
        blocks = blocks_layout(T, S, Hd, dt),
        num_blocks = math.random(0, S),
        write_block = (S > 0 and math.random() < 0.4) and math.random(1, S) or nil,
        norm_weight = k3.randn({Hd}, {dtype = dt, seed = seed}),
        qk_weight = k3.randn({Hd}, {dtype = dt, seed = seed + 1}),
        output_norm_weight = math.random() < 0.5 and k3.randn({Hd}, {dtype = dt, seed = seed + 2}) or nil,
      }
      local function copy_args(conv)
        local a = {}
        for key, v in pairs(args) do
          if k3.is_tensor(v) then a[key] = conv(v) else a[key] = v end
        end
        return a
      end
      -- The reference: f64 copies (prefix and blocks are updated in place by delta/write_block).
      local ra = copy_args(function(t) return t:to("f64") end)
      ra.kernel = "cpu.attn_res.reference"
      local ref = k3.attn_res(ra)
      local function check(a, out, who)
        local scale = 8 * (S + 2)
        local ok, d = close(out, ref, dt, scale)
        assert(ok, string.format("seed %d: %s on %s T=%d H=%d S=%d n=%d differs from the reference by %g",
          seed, who, dt, T, Hd, S, args.num_blocks, d))
        assert(not H.has_nan(out), string.format("seed %d: %s left NaN in out", seed, who))
        local okp, dp = close(a.prefix, ra.prefix, dt, 4)
        assert(okp, string.format("seed %d: %s: prefix after the delta add differs by %g", seed, who, dp))
        local okb, db = close(a.blocks, ra.blocks, dt, 4)
        assert(okb, string.format("seed %d: %s: blocks after write_block differ by %g", seed, who, db))
      end
      -- Each forced kernel on its own copies (a copy keeps the layout's strides only when
      -- cloned through copy(), so the copies go into same-layout tensors).
      local function same_layout_copies()
        local a = {}
        for key, v in pairs(args) do
          if k3.is_tensor(v) then
            local c = v:clone()
            -- keep padded / permuted strides: copy into a fresh tensor of the same view shape
            if not v:is_contiguous() then
              local base = k3.empty({v:numel() * 4 + 8}, {dtype = dt})
              local ok, view = pcall(base.as_strided, base, v:size(), v:stride(), 0)
              if ok then view:copy(v); c = view end
            end
            a[key] = c
          else
            a[key] = v
          end
        end
        return a
      end
      for _, name in ipairs(names) do
        local a = same_layout_copies()
        a.kernel = name
        a.out = H.poisoned({T, Hd}, {dtype = dt})
        local ok, err = pcall(k3.attn_res, a)
        if ok then
          ran = ran + 1
          check(a, a.out, name)
        else
          assert(type(err) == "string" and err:find("attn_res", 1, true),
            string.format("seed %d: %s failed without an attn_res message: %s", seed, name, tostring(err)))
        end
      end
      local a = same_layout_copies()
      local e = k3.explain("attn_res", a)
      assert(e.chosen, string.format("seed %d: dispatch chose nothing", seed))
      local out
      local tr = k3.trace(function() out = k3.attn_res(a) end)
      assert.equal(e.chosen, tr[#tr].kernel)
      check(a, out, "dispatch (" .. e.chosen .. ")")
    end
    assert.is_true(ran >= LAYOUTS)
  end)
end)

-- Rows for rms_norm / silu_mul: unit last stride, and rows contiguous, padded, offset into a
-- larger tensor, or one row broadcast (row stride 0).
local function rows_in(r, c, dt)
  local kinds = {"contiguous", "padded", "offset", "broadcast"}
  local kind = kinds[math.random(#kinds)]
  local opts = {dtype = dt, seed = math.random(1, 1 << 30)}
  if kind == "padded" then return k3.randn({r, c + math.random(1, 3)}, opts):narrow(2, 1, c), kind end
  if kind == "offset" then return k3.randn({r + 1, c + 2}, opts):narrow(1, 2, r):narrow(2, 2, c), kind end
  if kind == "broadcast" then return k3.randn({1, c}, opts):expand({r, c}), kind end
  return k3.randn({r, c}, opts), kind
end

-- A NaN-poisoned [r, c] out of dtype dt: contiguous or with padded rows.
local function poisoned_out(r, c, dt)
  if math.random() < 0.5 then return H.poisoned({r, c}, {dtype = dt}) end
  local o = k3.empty({r, c + math.random(1, 3)}, {dtype = dt}):narrow(2, 1, c)
  o:fill(0 / 0)
  return o
end

local rms_oracle, silu_oracle = H.rms_norm_f64, H.silu_mul_f64

-- The oracle's rows as an f64 tensor of shape [r, c] (k3.tensor cannot build a [r, 0] one).
local function as_f64(rows, r, c)
  if r == 0 or c == 0 then return k3.zeros({r, c}, {dtype = "f64"}) end
  return k3.tensor(rows, {dtype = "f64"})
end

-- Runs every forced kernel and dispatch's choice for op on one layout: call(kernel, out) makes
-- the call (kernel nil: dispatch), explain() asks dispatch; each result must match want.
local function check_all(op, seed, what, dt, r, c, want, scale, call, explain)
  local ran = 0
  local function check(y, who)
    local ok, d = close(y, want, dt, scale)
    assert(ok, string.format("seed %d: %s on %s %s differs from the fp64 oracle by %g", seed, who, dt, what, d))
    assert(not H.has_nan(y), string.format("seed %d: %s left NaN in out", seed, who))
  end
  for _, name in ipairs(kernels_for(op)) do
    local out = poisoned_out(r, c, dt)
    local ok, err = pcall(call, name, out)
    if ok then
      ran = ran + 1
      check(out, name)
    else
      assert(type(err) == "string" and err:find(op, 1, true),
        string.format("seed %d: %s failed without a %s message: %s", seed, name, op, tostring(err)))
    end
  end
  local e = explain()
  assert(e.chosen, string.format("seed %d: dispatch chose nothing", seed))
  local y
  local tr = k3.trace(function() y = call(nil, nil) end)
  assert.equal(e.chosen, tr[#tr].kernel)
  check(y, "dispatch (" .. e.chosen .. ")")
  -- dispatch into a poisoned out as well
  local out = poisoned_out(r, c, dt)
  call(nil, out)
  check(out, "dispatch into out")
  return ran
end

describe("properties: rms_norm", function()
  it(string.format("%d random layouts: forced kernels and dispatch match the fp64 oracle", LAYOUTS), function()
    local ran = 0
    local EPS = {1e-5, 1e-6, 0.1, 1}
    for i = 1, LAYOUTS do
      local seed = BASE + 200000 + i
      math.randomseed(seed)
      local dt = DTYPES[math.random(#DTYPES)]
      local M, Hd = math.random(0, 4), math.random(1, 9)
      local x, kind = rows_in(M, Hd, dt)
      -- the weight in x's dtype, or another (f32 weights with bf16 x, say)
      local wdt = math.random() < 0.6 and dt or DTYPES[math.random(#DTYPES)]
      local w = k3.randn({Hd}, {dtype = wdt, seed = seed}) * 0.5 + 1
      local eps = EPS[math.random(#EPS)]
      local want = as_f64(rms_oracle(x, w, eps), M, Hd)
      -- bf16 / f16 weights round w itself; the oracle read the rounded values, so one rounding
      -- of the output (|y| up to ~sqrt(H) * |w|) and f32 accumulation remain
      ran = ran + check_all("rms_norm", seed,
        string.format("%s x [%d,%d] (w %s, eps %g)", kind, M, Hd, wdt, eps), dt, M, Hd, want, 8,
        function(kernel, out) return k3.rms_norm(x, w, eps, {out = out, kernel = kernel}) end,
        function() return k3.explain("rms_norm", x, w, eps) end)
    end
    assert.is_true(ran >= LAYOUTS)
  end)
end)

describe("properties: silu_mul", function()
  it(string.format("%d random layouts: forced kernels and dispatch match the fp64 oracle", LAYOUTS), function()
    local ran = 0
    for i = 1, LAYOUTS do
      local seed = BASE + 300000 + i
      math.randomseed(seed)
      local dt = DTYPES[math.random(#DTYPES)]
      local M, I = math.random(0, 4), math.random(0, 6)
      local x, kind = rows_in(M, 2 * I, dt)
      local want = as_f64(silu_oracle(x, I), M, I)
      ran = ran + check_all("silu_mul", seed, string.format("%s x [%d,%d]", kind, M, 2 * I), dt, M, I,
        want, 8,
        function(kernel, out) return k3.silu_mul(x, {out = out, kernel = kernel}) end,
        function() return k3.explain("silu_mul", x) end)
    end
    assert.is_true(ran >= LAYOUTS)
  end)
end)
