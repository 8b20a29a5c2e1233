-- cuda.linear.cublas (#gpu) against the fp64 CPU reference (cpu.linear.reference on f64
-- copies) for every dtype, with bias and residual, transposed and row-padded x and w,
-- operands cuBLAS cannot express (copied), odd-offset (misaligned) bias and x, padded and
-- transposed out and residual, poisoned outputs; and that dispatch picks it on the device.
-- With the silu_mul prologue (x [M, 2K] gate | up, through a temporary): the bits of
-- cuda.silu_mul.generic then the plain call, and the fp64 reference, over the same layouts.
local k3 = require "k3"
local H = require "spec.helpers"

local K = "cuda.linear.cublas"
local tol = {bf16 = {3e-2, 2e-2}, f16 = {5e-3, 5e-3}, f32 = {1e-4, 1e-4}, f64 = {1e-10, 1e-10}}

local function f64(t) return t and t:to("cpu"):to("f64") end

local function reference(x, w, bias, res)
  return k3.linear(f64(x), f64(w), {bias = f64(bias), residual = f64(res), kernel = "cpu.linear.reference"})
end

-- A [r, c] device tensor of dtype dt in the named layout, values ~ scale * N(0, 1).
local function make(r, c, dt, layout, seed, scale)
  local o = {device = "cuda", dtype = dt, seed = seed}
  local t
  if layout == "transposed" then
    t = k3.randn({c, r}, o):t()
  elseif layout == "padded" then
    t = H.padded(r, c, 5, o)
  elseif layout == "strided" then -- both strides non-unit: cuBLAS cannot read it in place
    t = k3.randn({r, c, 2}, o):select(3, 2)
  elseif layout == "odd" then -- starts one element past an aligned address
    t = k3.randn({r * c + 1}, o):narrow(1, 2, r * c):view({r, c})
  else
    t = k3.randn({r, c}, o)
  end
  if scale then t = t * scale end
  return t
end

local function check(M, N, Kd, dt, o, what)
  o = o or {}
  local x = make(M, Kd, dt, o.x, 11, nil)
  local w = make(N, Kd, dt, o.w, 12, 1 / math.sqrt(math.max(Kd, 1)))
  -- `make` with a scale returns a new contiguous tensor: redo the layout for w
  if o.w and o.w ~= "contiguous" then
    local wl = make(N, Kd, dt, o.w, 12, nil)
    wl:copy(w)
    w = wl
  end
  local bias, res
  if o.bias then
    bias = o.bias == "odd" and k3.randn({N + 1}, {device = "cuda", dtype = dt, seed = 13}):narrow(1, 2, N)
      or k3.randn({N}, {device = "cuda", dtype = dt, seed = 13})
  end
  if o.res then res = make(M, N, dt, o.res, 14, nil) end
  local out = o.out == "padded" and H.padded(M, N, 3, {device = "cuda", dtype = dt})
    or o.out == "transposed" and k3.empty({N, M}, {device = "cuda", dtype = dt}):t()
    or k3.empty({M, N}, {device = "cuda", dtype = dt})
  out:fill(0 / 0)
  local want = reference(x, w, bias, res)
  local y = k3.linear(x, w, {bias = bias, residual = res, out = out, kernel = K})
  local got = f64(y)
  assert.is_false(H.has_nan(got), what .. ": output has NaN (unwritten elements)")
  local t = tol[dt]
  if not k3.allclose(got, want, {atol = t[1], rtol = t[2]}) then
    error(string.format("%s: max abs diff %g vs the fp64 reference", what, k3.max_abs_diff(got, want)))
  end
  assert.equal(0, k3.max_abs_diff(y, out), what .. ": result is not in out")
end

describe("cuda.linear.cublas #gpu", function()
  if not H.require_gpu() then return end

  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it(dt .. ": shapes, bias and residual", function()
      for _, s in ipairs({{1, 33, 260}, {5, 132, 7}, {16, 260, 132}, {17, 64, 33}, {3, 1, 8}, {1, 1, 1}}) do
        local M, N, Kd = s[1], s[2], s[3]
        local name = string.format("%s M=%d N=%d K=%d", dt, M, N, Kd)
        check(M, N, Kd, dt, {}, name)
        check(M, N, Kd, dt, {bias = true}, name .. " bias")
        check(M, N, Kd, dt, {res = "contiguous"}, name .. " residual")
        check(M, N, Kd, dt, {bias = true, res = "contiguous"}, name .. " bias+residual")
      end
    end)

    it(dt .. ": transposed, padded and uncopyable layouts of x, w, out and residual", function()
      for _, lx in ipairs({"contiguous", "transposed", "padded", "strided"}) do
        for _, lw in ipairs({"contiguous", "transposed", "padded", "strided"}) do
          check(7, 40, 33, dt, {x = lx, w = lw, bias = true, res = "padded"},
            string.format("%s x %s, w %s", dt, lx, lw))
        end
      end
      check(4, 24, 16, dt, {out = "padded", res = "transposed", bias = true}, dt .. " padded out")
      check(4, 24, 16, dt, {out = "transposed", bias = true}, dt .. " transposed out")
    end)

    it(dt .. ": bias and x sliced at an odd element offset (misaligned)", function()
      check(5, 64, 48, dt, {bias = "odd"}, dt .. " odd bias")
      check(5, 64, 48, dt, {x = "odd", bias = "odd", res = "contiguous"}, dt .. " odd x and bias")
      check(1, 64, 48, dt, {x = "odd", w = "odd"}, dt .. " odd x and w")
    end)
  end

  it("M = 1..16 on a Kimi-K3 projection shape", function()
    for M = 1, 16 do check(M, 1536, 7168, "bf16", {}, "bf16 1536x7168 M=" .. M) end
  end)

  -- The silu_mul prologue: x [M, 2K] (unit last stride: contiguous, padded rows, odd offset).
  local function check_silu_mul(M, N, Kd, dt, o, what)
    local x = make(M, 2 * Kd, dt, o.x, 21, nil)
    local g = x:narrow(2, 1, Kd)
    g:copy(g * 3) -- gates over silu's both regimes
    local w = make(N, Kd, dt, nil, 22, 1 / math.sqrt(math.max(Kd, 1)))
    local bias = o.bias and k3.randn({N}, {device = "cuda", dtype = dt, seed = 23}) or nil
    local res = o.res and make(M, N, dt, o.res, 24, nil) or nil
    local out = o.out == "padded" and H.padded(M, N, 3, {device = "cuda", dtype = dt})
      or k3.empty({M, N}, {device = "cuda", dtype = dt})
    out:fill(0 / 0)
    local y = k3.linear(x, w, {bias = bias, residual = res, prologue = "silu_mul", out = out, kernel = K})
    assert.is_false(H.has_nan(f64(y)), what .. ": output has NaN (unwritten elements)")
    local unfused = k3.linear(k3.silu_mul(x), w, {bias = bias, residual = res, kernel = K})
    assert.equal(0, k3.max_abs_diff(y, unfused), what .. ": fused differs from silu_mul then cuBLAS")
    -- fp64: h = silu_mul(x) and the product in fp64 (h's rounding to dt is inside the tolerance)
    local want = k3.linear(k3.silu_mul(f64(x)), f64(w), {bias = f64(bias), residual = f64(res),
                                                         kernel = "cpu.linear.blas"})
    local t = tol[dt]
    if not k3.allclose(f64(y), want, {atol = 4 * t[1] * math.sqrt(math.max(Kd, 1)), rtol = t[2]}) then
      error(string.format("%s: max abs diff %g vs the fp64 reference", what, k3.max_abs_diff(f64(y), want)))
    end
  end

  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it(dt .. ": prologue silu_mul through a temporary, the bits of silu_mul then cuBLAS", function()
      for _, s in ipairs({{1, 33, 260}, {5, 132, 7}, {16, 520, 4224}, {17, 64, 33}, {1, 1, 1}}) do
        local M, N, Kd = s[1], s[2], s[3]
        local name = string.format("%s M=%d N=%d K=%d", dt, M, N, Kd)
        check_silu_mul(M, N, Kd, dt, {}, name)
        check_silu_mul(M, N, Kd, dt, {bias = true, res = "contiguous"}, name .. " bias+residual")
      end
      for _, lx in ipairs({"padded", "odd"}) do
        check_silu_mul(7, 40, 33, dt, {x = lx, bias = true, res = "padded", out = "padded"},
          string.format("%s x %s", dt, lx))
      end
    end)
  end

  it("is what dispatch picks for device tensors", function()
    local x = k3.randn({4, 64}, {device = "cuda", dtype = "bf16"})
    local w = k3.randn({32, 64}, {device = "cuda", dtype = "bf16", seed = 1})
    local b = k3.randn({32}, {device = "cuda", dtype = "bf16", seed = 2})
    assert.equal(K, k3.explain("linear", x, w, {bias = b}).chosen)
    local y = k3.linear(x, w, {bias = b})
    assert.equal("cuda:0", y:device())
    assert.same({4, 32}, y:size())
  end)
end)
