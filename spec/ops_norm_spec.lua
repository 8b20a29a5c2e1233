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

describe("edge values", function()
  it("silu_mul(-inf) is 0, the limit, on cpu.silu_mul.reference", function()
    edge_silu_mul("cpu", "cpu.silu_mul.reference")
  end)
end)

describe("edge values on the CUDA kernels #gpu", function()
  if not H.require_gpu() then return end
  it("silu_mul(-inf) is 0, the limit, on cuda.silu_mul.generic", function()
    edge_silu_mul("cuda", "cuda.silu_mul.generic")
  end)
end)
