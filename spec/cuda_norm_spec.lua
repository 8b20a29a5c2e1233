-- cuda.rms_norm.generic and cuda.silu_mul.generic (#gpu) against the fp64 CPU references
-- for every dtype, padded rows, hidden sizes 4096, 7000, 7168, 7176 (and odd ones), weights
-- of another dtype, poisoned outputs; and that dispatch picks them for device tensors.
local k3 = require "k3"
local H = require "spec.helpers"

local tol = {bf16 = {3e-2, 2e-2}, f16 = {5e-3, 5e-3}, f32 = {1e-5, 1e-5}, f64 = {1e-12, 1e-12}}

local function f64(t) return t:to("cpu"):to("f64") end

local function close(got, want, dt, what)
  local g = f64(got)
  assert.is_false(H.has_nan(g), what .. ": output has NaN (unwritten elements)")
  local t = tol[dt]
  if not k3.allclose(g, want, {atol = t[1], rtol = t[2]}) then
    error(string.format("%s: max abs diff %g vs the fp64 reference", what, k3.max_abs_diff(g, want)))
  end
end

describe("cuda.rms_norm.generic #gpu", function()
  if not H.require_gpu() then return end
  local K = "cuda.rms_norm.generic"

  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it(dt .. ": padded rows, hidden sizes around 7168", function()
      -- every row form of the kernel: 8 values a thread (H <= 2048), 32 (H <= 8192), the loop
      for _, hd in ipairs({4096, 7000, 7168, 7176, 33, 1, 1536, 2048, 2049, 8192, 8193, 9000}) do
        for _, M in ipairs({1, 5, 17}) do
          local x = H.padded(M, hd, 7, {device = "cuda", dtype = dt, seed = hd + M})
          local w = (k3.randn({hd}, {dtype = dt, seed = 3}) * 0.1 + 1):to("cuda")
          local out = H.padded(M, hd, 3, {device = "cuda", dtype = dt})
          out:fill(0 / 0)
          local want = k3.rms_norm(f64(x), f64(w), 1e-5, {kernel = "cpu.rms_norm.reference"})
          local y = k3.rms_norm(x, w, 1e-5, {out = out, kernel = K})
          close(y, want, dt, string.format("%s M=%d H=%d", dt, M, hd))
        end
      end
    end)
  end

  it("rows past the grid's 2^20 CTAs (each CTA strides on to later rows)", function()
    -- the first and last rows of M = 2^20 + 3 against the fp64 reference of those rows (H = 1
    -- and 33: the 8-values-a-thread form; larger rows would take minutes to generate here)
    local M = (1 << 20) + 3
    for _, hd in ipairs({1, 33}) do
      local x = k3.randn({M, hd}, {device = "cuda", dtype = "bf16", seed = 40 + hd})
      local w = (k3.randn({hd}, {dtype = "bf16", seed = 41}) * 0.1 + 1):to("cuda")
      local out = k3.empty({M, hd}, {device = "cuda", dtype = "bf16"})
      out:fill(0 / 0)
      local y = k3.rms_norm(x, w, 1e-5, {out = out, kernel = K})
      for _, first in ipairs({1, M - 7}) do
        local want = k3.rms_norm(f64(x:narrow(1, first, 8)), f64(w), 1e-5, {kernel = "cpu.rms_norm.reference"})
        close(y:narrow(1, first, 8), want, "bf16", string.format("H=%d rows %d..%d of %d", hd, first, first + 7, M))
      end
      x:free()
      out:free()
    end
  end)

  it("f32 weights with bf16 activations, a large eps, many rows", function()
    local x = k3.randn({3000, 256}, {device = "cuda", dtype = "bf16", seed = 5})
    local w = k3.randn({256}, {device = "cuda", seed = 6})
    local want = k3.rms_norm(f64(x), f64(w), 0.5, {kernel = "cpu.rms_norm.reference"})
    close(k3.rms_norm(x, w, 0.5, {kernel = K}), want, "bf16", "bf16 x, f32 w")
  end)

  it("is what dispatch picks for device tensors", function()
    local x = k3.randn({2, 64}, {device = "cuda"})
    local w = k3.ones({64}, {device = "cuda"})
    assert.equal(K, k3.explain("rms_norm", x, w, 1e-5).chosen)
  end)
end)

describe("cuda.silu_mul.generic #gpu", function()
  if not H.require_gpu() then return end
  local K = "cuda.silu_mul.generic"

  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it(dt .. ": padded rows and odd widths", function()
      for _, I in ipairs({1, 33, 7168, 7176}) do
        for _, M in ipairs({1, 5, 17}) do
          local x = H.padded(M, 2 * I, 5, {device = "cuda", dtype = dt, seed = I + M})
          local out = H.padded(M, I, 3, {device = "cuda", dtype = dt})
          out:fill(0 / 0)
          local want = k3.silu_mul(f64(x), {kernel = "cpu.silu_mul.reference"})
          local y = k3.silu_mul(x, {out = out, kernel = K})
          close(y, want, dt, string.format("%s M=%d I=%d", dt, M, I))
        end
      end
    end)
  end

  it("is what dispatch picks for device tensors", function()
    local x = k3.randn({2, 64}, {device = "cuda"})
    assert.equal(K, k3.explain("silu_mul", x).chosen)
  end)
end)
