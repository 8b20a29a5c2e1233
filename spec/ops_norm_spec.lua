-- rms_norm and silu_mul: the CPU kernels against plain-Lua fp64 formulas across dtypes,
-- padded rows and odd sizes, outputs poisoned with NaN; and the text of every error.
local k3 = require "k3"
local H = require "spec.helpers"

local TOL = {bf16 = 1e-2, f16 = 2e-3, f32 = 1e-5, f64 = 1e-12}

local function rms_oracle(x, w, eps) return k3.tensor(H.rms_norm_f64(x, w, eps), {dtype = "f64"}) end
local function silu_oracle(x) return k3.tensor(H.silu_mul_f64(x), {dtype = "f64"}) end

local function close(y, want, dt)
  return k3.allclose(y:to("f64"), want, {atol = TOL[dt], rtol = TOL[dt]})
end

describe("rms_norm", function()
  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it(dt .. " matches fp64 on contiguous and padded rows of 33, 132, 260", function()
      for _, Hd in ipairs({33, 132, 260}) do
        for _, pad in ipairs({0, 7}) do
          local x = H.padded(5, Hd, pad, {dtype = dt, seed = Hd})
          local w = k3.randn({Hd}, {dtype = dt, seed = 2}) * 0.2 + 1
          local out = H.padded(5, Hd, pad, {dtype = dt})
          out:fill(0 / 0)
          local y = k3.rms_norm(x, w, 1e-5, {out = out})
          assert.is_false(H.has_nan(y))
          assert.is_true(close(y, rms_oracle(x, w, 1e-5), dt), string.format("H=%d pad=%d", Hd, pad))
        end
      end
    end)
  end

  it("takes a zero-stride expanded x and an f32 weight for bf16 x", function()
    local x = k3.randn({1, 33}, {dtype = "bf16"}):expand({4, 33})
    local w = k3.randn({33}, {seed = 3})
    local y = k3.rms_norm(x, w, 1e-6)
    assert.equal("bf16", y:dtype())
    assert.is_true(close(y, rms_oracle(x, w, 1e-6), "bf16"))
  end)

  it("runs cpu.rms_norm.reference, also by name", function()
    local x, w = k3.randn({2, 8}), k3.ones({8})
    assert.equal("cpu.rms_norm.reference", k3.explain("rms_norm", x, w, 1e-5).chosen)
    assert.equal(0, k3.max_abs_diff(k3.rms_norm(x, w, 1e-5), k3.rms_norm(x, w, 1e-5, {kernel = "cpu.rms_norm.reference"})))
  end)

  describe("errors", function()
    local x, w = k3.randn({3, 8}), k3.ones({8})
    it("shapes", function()
      H.raises(function() k3.rms_norm(k3.randn({8}), w, 1e-5) end, "rms_norm: x must be 2-D [M, H]; got 1-D [8]")
      H.raises(function() k3.rms_norm(x, k3.ones({7}), 1e-5) end, "rms_norm: w must be [H] = [8] (x dim 2); got [7]")
      H.raises(function() k3.rms_norm(x, w, 1e-5, {out = k3.empty({3, 7})}) end, "rms_norm: out must be [3, 8]; got [3, 7]")
    end)
    it("layout, eps, dtype, overlap", function()
      H.raises(function() k3.rms_norm(k3.randn({8, 3}):t(), w, 1e-5) end,
        "rms_norm: x must have unit stride in its last dim; got strides [1, 3]")
      H.raises(function() k3.rms_norm(x, k3.randn({8, 2}):select(2, 1), 1e-5) end,
        "rms_norm: w must have unit stride in its last dim; got strides [2]")
      H.raises(function() k3.rms_norm(x, w, -1) end, "rms_norm: eps must be a finite number >= 0; got -1")
      H.raises(function() k3.rms_norm(x, w, 1e-5, {out = k3.empty({3, 8}, {dtype = "f16"})}) end,
        "rms_norm: out dtype (f16) must be f32")
      H.raises(function() k3.rms_norm(x, w, 1e-5, {out = x}) end, "rms_norm: out overlaps x")
    end)
  end)
end)

describe("silu_mul", function()
  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it(dt .. " matches fp64 on contiguous and padded rows (I = 33, 132, 260)", function()
      for _, I in ipairs({33, 132, 260}) do
        for _, pad in ipairs({0, 5}) do
          local x = H.padded(3, 2 * I, pad, {dtype = dt, seed = I})
          local out = H.padded(3, I, pad, {dtype = dt})
          out:fill(0 / 0)
          local y = k3.silu_mul(x, {out = out})
          assert.is_false(H.has_nan(y))
          assert.is_true(close(y, silu_oracle(x), dt), string.format("I=%d pad=%d", I, pad))
        end
      end
    end)
  end

  it("takes a zero-stride expanded x (one row broadcast to M rows)", function()
    for _, dt in ipairs({"bf16", "f32"}) do
      for _, I in ipairs({33, 132}) do
        local M = 5
        local x = k3.randn({1, 2 * I}, {dtype = dt, seed = I}):expand({M, 2 * I})
        assert.same({0, 1}, x:stride())
        local out = H.poisoned({M, I}, {dtype = dt})
        local y = k3.silu_mul(x, {out = out})
        assert.is_false(H.has_nan(y))
        assert.is_true(close(y, silu_oracle(x), dt), string.format("%s I=%d", dt, I))
      end
    end
  end)

  it("returns [M, I] and runs cpu.silu_mul.reference", function()
    local x = k3.randn({4, 10})
    assert.same({4, 5}, k3.silu_mul(x):size())
    assert.equal("cpu.silu_mul.reference", k3.explain("silu_mul", x).chosen)
  end)

  describe("errors", function()
    it("odd last dim, rank, layout, out", function()
      H.raises(function() k3.silu_mul(k3.randn({2, 7})) end, "silu_mul: x dim 2 (7) must be even ([M, 2I])")
      H.raises(function() k3.silu_mul(k3.randn({2, 2, 4})) end, "silu_mul: x must be 2-D [M, 2I]; got 3-D [2, 2, 4]")
      H.raises(function() k3.silu_mul(k3.randn({8, 2}):t()) end,
        "silu_mul: x must have unit stride in its last dim; got strides [1, 2]")
      H.raises(function() k3.silu_mul(k3.randn({2, 8}), {out = k3.empty({2, 8})}) end, "silu_mul: out must be [2, 4]; got [2, 8]")
    end)
  end)
end)

-- Edge values, the same cases on every rms_norm and silu_mul kernel: the CPU ones here, the
-- CUDA ones in the #gpu block below.
local function edge_silu_mul(device, kernel)
  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    -- gates: -inf (the limit 0), very negative, +inf, NaN; the up halves finite
    local x = k3.tensor({{-math.huge, -1e4, math.huge, 0 / 0, -math.huge, 1, 2, 3, -4, 5}},
                        {dtype = dt}):to(device)
    local y = k3.silu_mul(x, {kernel = kernel}):to("cpu"):to("f64")
    local v = y:totable()[1]
    local what = dt .. " " .. kernel
    assert.are.equal(0, v[1], what)          -- silu(-inf) * 1 = 0 * 1
    assert.are.equal(0, v[2], what)          -- silu(-1e4) underflows to -0
    assert.are.equal(math.huge, v[3], what)  -- silu(inf) * 3 = inf
    assert.is_true(v[4] ~= v[4], what)       -- NaN stays NaN
    assert.are.equal(0, v[5], what)          -- silu(-inf) * 5 = 0
    local want = H.silu_mul_f64(x)[1]         -- the fp64 oracle agrees, its limit included
    for _, j in ipairs({1, 2, 3, 5}) do assert.are.equal(want[j], v[j], what .. " column " .. j) end
  end
end

-- Rows scaled far past where the fp32 (fp64 for f64) sum of squares overflows or underflows
-- (H.EDGE_SCALES), with eps 0 and 1e-5: every output finite and equal to the fp64 formula
-- (H.rms_norm_f64 cannot overflow itself); with eps = 0 the result is the unscaled row's
-- (RMSNorm is scale-invariant).
local function edge_rms_norm(device, kernel, tol, sizes)
  for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
    for _, Hd in ipairs(sizes or {33, 260}) do
      local base = k3.randn({3, Hd}, {dtype = dt, seed = Hd})
      local w = (k3.randn({Hd}, {dtype = dt, seed = 5}) * 0.2 + 1)
      local plain = k3.rms_norm(base, w, 0, {kernel = "cpu.rms_norm.reference"}):to("f64")
      for _, sc in ipairs(H.EDGE_SCALES[dt]) do
        for _, eps in ipairs({0, 1e-5}) do
          local x = base * sc
          local what = ("%s %s H=%d scale 2^%d eps %g"):format(kernel, dt, Hd, math.floor(math.log(sc, 2) + 0.5), eps)
          local y = k3.rms_norm(x:to(device), w:to(device), eps, {kernel = kernel}):to("cpu"):to("f64")
          local m = k3.max_abs_diff(y, y) -- NaN when any element is NaN or infinite
          assert(m == 0, what .. ": output not finite")
          local want = rms_oracle(x, w, eps)
          assert(k3.allclose(y, want, {atol = tol[dt], rtol = tol[dt]}),
            what .. ": max abs diff " .. k3.max_abs_diff(y, want))
          -- where the scaled row is exact, eps = 0 gives the row's own result
          if eps == 0 and H.scales_exactly(base, sc) then
            assert(k3.allclose(y, plain, {atol = tol[dt], rtol = tol[dt]}), what .. ": not scale-invariant")
          end
        end
      end
    end
  end
  -- one huge element among ordinary ones, NaN rows stay NaN, zeros with eps > 0 stay zeros
  local x = k3.tensor({{3e38, 1, -2, 0.5}, {0 / 0, 1, 2, 3}, {0, 0, 0, 0}}):to(device)
  local y = k3.rms_norm(x, k3.ones({4}):to(device), 1e-5, {kernel = kernel}):to("cpu"):totable()
  assert.is_true(math.abs(y[1][1] - 2) < 1e-5 and math.abs(y[1][2]) < 1e-30, kernel)
  for d = 1, 4 do assert.is_true(y[2][d] ~= y[2][d], kernel) end
  assert.same({0, 0, 0, 0}, y[3])
end

local NORM_TOL = {f32 = 1e-5, bf16 = 1e-2, f16 = 2e-3, f64 = 1e-12}

describe("edge values", function()
  it("rms_norm is scale-invariant past the sum of squares' overflow and underflow on cpu.rms_norm.reference", function()
    edge_rms_norm("cpu", "cpu.rms_norm.reference", NORM_TOL)
  end)
  it("silu_mul(-inf) is 0, the limit, on cpu.silu_mul.reference", function()
    edge_silu_mul("cpu", "cpu.silu_mul.reference")
  end)
end)

describe("edge values on the CUDA kernels #gpu", function()
  if not H.require_gpu() then return end
  it("rms_norm is scale-invariant past the sum of squares' overflow and underflow on cuda.rms_norm.generic", function()
    -- the kernel's three row forms: 8 values a thread (H <= 2048), 32 (H <= 8192), the loop
    edge_rms_norm("cuda", "cuda.rms_norm.generic", {f32 = 1e-5, bf16 = 3e-2, f16 = 5e-3, f64 = 1e-12},
                  {33, 260, 2100, 8200})
  end)
  it("silu_mul(-inf) is 0, the limit, on cuda.silu_mul.generic", function()
    edge_silu_mul("cuda", "cuda.silu_mul.generic")
  end)
end)

describe("rms_norm messages", function()
  it("a non-finite eps prints as -inf", function()
    H.raises(function() k3.rms_norm(k3.ones({1, 4}), k3.ones({4}), -math.huge) end,
      "rms_norm: eps must be a finite number >= 0; got -inf")
  end)
end)
