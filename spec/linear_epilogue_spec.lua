-- The linear's silu_mul epilogue (k3.linear(x, w, {epilogue = "silu_mul"}), w [2N, K] gate rows
-- then up rows): on every kernel the result h [M, N] has exactly the bits of
-- k3.silu_mul(k3.linear(x, w, ...)) (y rounded to the dtype first), written into NaN-poisoned
-- outputs, across shapes (N = 1, odd N, N not a multiple of a CTA's half tile, K with a partial
-- last chunk), dtypes, strided views, with a bias and with a prologue; it matches the fp64
-- reference; every refused argument names itself. The GPU cases (#gpu) run the skinny kernel's
-- in-kernel epilogue through plans (rows_per_warp 8 and 16), its split-K-across-CTAs and
-- balanced-grid paths (through a temporary), cuBLAS and the batch-invariant kernel.
local k3 = require "k3"
local H = require "spec.helpers"

local CPU_KERNELS = {"cpu.linear.blas", "cpu.linear.reference", "cpu.linear.batch_invariant"}
local DTYPES = {"f32", "f64", "bf16", "f16"}
-- {M, N (h's columns: w has 2N rows), K}
local SHAPES = {{1, 1, 5}, {3, 7, 9}, {4, 13, 33}, {2, 1, 1}, {5, 20, 64}, {6, 3, 40}}

-- Bitwise equality of two tensors of one dtype: no NaN in the fused result (the poison was
-- overwritten) and no element differs.
local function same_bits(fused, unfused, what)
  assert.is_false(H.has_nan(fused), what .. ": unwritten (NaN) outputs")
  assert.are.same(unfused:size(), fused:size(), what .. ": shape")
  assert.equal(0, k3.max_abs_diff(fused, unfused), what .. ": fused differs from linear then silu_mul")
end

-- x [M, K] and w [2N, K], gate rows scaled so that silu sees both signs well away from 0.
local function operands(M, N, K, dtype, seed)
  local x = k3.randn({M, K}, {dtype = dtype, seed = seed}) * 0.5
  local w = k3.randn({2 * N, K}, {dtype = dtype, seed = seed + 1}) * 0.5
  return x, w
end

describe("linear epilogue silu_mul on the CPU kernels", function()
  for _, kernel in ipairs(CPU_KERNELS) do
    for _, dtype in ipairs(DTYPES) do
      it(kernel .. " " .. dtype .. ": the bits of silu_mul(linear(x, w)) across shapes, with and without bias", function()
        for i, s in ipairs(SHAPES) do
          local M, N, K = s[1], s[2], s[3]
          local x, w = operands(M, N, K, dtype, 10 * i)
          local b = k3.randn({2 * N}, {dtype = dtype, seed = 10 * i + 2})
          for _, bias in ipairs({false, b}) do
            local what = string.format("%s %s M=%d N=%d K=%d%s", kernel, dtype, M, N, K, bias and " bias" or "")
            local out = H.poisoned({M, N}, {dtype = dtype})
            local h = k3.linear(x, w, {bias = bias or nil, epilogue = "silu_mul", kernel = kernel, out = out})
            assert.is_true(rawequal(h, out) or k3.max_abs_diff(h, out) == 0, what .. ": result is out")
            local y = k3.linear(x, w, {bias = bias or nil, kernel = kernel})
            same_bits(out, k3.silu_mul(y), what)
          end
        end
      end)
    end
  end

  it("the default kernel and a new result tensor", function()
    local x, w = operands(3, 5, 16, "bf16", 70)
    local h = k3.linear(x, w, {epilogue = "silu_mul"})
    assert.are.same({3, 5}, h:size())
    assert.equal("bf16", h:dtype())
    same_bits(h, k3.silu_mul(k3.linear(x, w)), "default kernel")
  end)

  it("strided x and w views (transposed, padded rows, broadcast rows) as the plain linear takes them", function()
    for _, dtype in ipairs({"f32", "bf16", "f64"}) do
      local M, N, K = 4, 6, 24
      local cases = {
        {"x transposed", k3.randn({K, M}, {dtype = dtype, seed = 81}):t(), k3.randn({2 * N, K}, {dtype = dtype, seed = 82})},
        {"w transposed", k3.randn({M, K}, {dtype = dtype, seed = 83}), k3.randn({K, 2 * N}, {dtype = dtype, seed = 84}):t()},
        {"padded rows", H.padded(M, K, 5, {dtype = dtype, seed = 85}), H.padded(2 * N, K, 3, {dtype = dtype, seed = 86})},
        {"broadcast x row", k3.randn({1, K}, {dtype = dtype, seed = 87}):expand({M, K}), k3.randn({2 * N, K}, {dtype = dtype, seed = 88})},
      }
      for _, c in ipairs(cases) do
        local x, w = c[2], c[3]
        for _, kernel in ipairs(CPU_KERNELS) do
          local what = dtype .. " " .. c[1] .. " " .. kernel
          local out = H.poisoned({M, N}, {dtype = dtype})
          k3.linear(x, w, {epilogue = "silu_mul", kernel = kernel, out = out})
          same_bits(out, k3.silu_mul(k3.linear(x, w, {kernel = kernel})), what)
        end
      end
    end
  end)

  it("matches the fp64 reference (plain-Lua silu of the fp64 product) within the usual tolerance", function()
    local tol = {f32 = 1e-5, bf16 = 3e-2, f16 = 4e-3, f64 = 1e-12}
    for _, dtype in ipairs(DTYPES) do
      local M, N, K = 5, 11, 72
      local x, w = operands(M, N, K, dtype, 90)
      local h = k3.linear(x, w, {epilogue = "silu_mul"}):to("f64"):totable()
      local y64 = k3.linear(x:to("f64"), w:to("f64"), {kernel = "cpu.linear.reference"})
      local ref = H.silu_mul_f64(y64)
      local worst = 0
      for i = 1, M do
        for j = 1, N do
          local d = math.abs(h[i][j] - ref[i][j]) / (1 + math.abs(ref[i][j]))
          if d > worst then worst = d end
        end
      end
      assert.is_true(worst <= tol[dtype], string.format("%s: max relative error %g", dtype, worst))
    end
  end)

  it("with a prologue: the prologue's h, the product, then the epilogue (the bits of the three ops)", function()
    for _, kernel in ipairs(CPU_KERNELS) do
      for _, dtype in ipairs({"f32", "bf16"}) do
        local M, N, K = 3, 5, 16
        local xg = k3.randn({M, 2 * K}, {dtype = dtype, seed = 101})
        local w = k3.randn({2 * N, K}, {dtype = dtype, seed = 102})
        local what = kernel .. " " .. dtype
        local out = H.poisoned({M, N}, {dtype = dtype})
        k3.linear(xg, w, {prologue = "silu_mul", epilogue = "silu_mul", kernel = kernel, out = out})
        same_bits(out, k3.silu_mul(k3.linear(k3.silu_mul(xg), w, {kernel = kernel})), what .. " silu_mul prologue")
        local x = k3.randn({M, K}, {dtype = dtype, seed = 103})
        local nw = k3.randn({K}, {dtype = dtype, seed = 104})
        local out2 = H.poisoned({M, N}, {dtype = dtype})
        k3.linear(x, w, {prologue = "rms_norm", norm_weight = nw, eps = 1e-6, epilogue = "silu_mul",
                         kernel = kernel, out = out2})
        same_bits(out2, k3.silu_mul(k3.linear(k3.rms_norm(x, nw, 1e-6), w, {kernel = kernel})),
                  what .. " rms_norm prologue")
      end
    end
  end)

  it("through methods (m:apply, m:explain) and nn.Linear", function()
    local x, w = operands(4, 9, 32, "bf16", 110)
    local m = k3.method.default()
    local e = m:explain(x, w, nil, {epilogue = "silu_mul"})
    assert.equal("linear", e.op)
    assert.equal("cpu.linear.blas", e.chosen)
    local out = H.poisoned({4, 9}, {dtype = "bf16"})
    m:apply(x, w, nil, {epilogue = "silu_mul", out = out})
    same_bits(out, k3.silu_mul(m:apply(x, w)), "m:apply")
    local lin = k3.nn.Linear(w)
    same_bits(lin(x, {epilogue = "silu_mul"}), k3.silu_mul(lin(x)), "nn.Linear")
    -- a low-latency method on the CPU: no plan entry, the default candidates serve
    local ll = k3.method.low_latency({[4] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 4, vec = 8}}})
    same_bits(ll:apply(x, w, nil, {epilogue = "silu_mul"}), k3.silu_mul(k3.linear(x, w)), "low-latency method")
  end)

  it("M = 0 and K = 0 give the empty and the silu_mul(bias) results", function()
    local w = k3.randn({6, 0})
    local x = k3.zeros({2, 0})
    local b = k3.randn({6}, {seed = 120})
    local h = k3.linear(x, w, {bias = b, epilogue = "silu_mul"})
    same_bits(h, k3.silu_mul(k3.linear(x, w, {bias = b})), "K = 0")
    local e = k3.linear(k3.zeros({0, 4}), k3.randn({6, 4}), {epilogue = "silu_mul"})
    assert.are.same({0, 3}, e:size())
  end)

  it("refuses what it cannot compute, naming the argument, the expected and the actual values", function()
    local x, w = operands(3, 3, 5, "f32", 130)
    H.raises_exact(function() k3.linear(x, k3.randn({7, 5}), {epilogue = "silu_mul"}) end,
      "linear: w dim 1 (7) must be even for epilogue silu_mul")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "silu_mul", out = k3.zeros({3, 6})}) end,
      "linear: out must be [3, 3]; got [3, 6]")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "silu_mul", residual = k3.zeros({3, 6})}) end,
      "linear: residual cannot be combined with epilogue silu_mul (it would be added before the "
        .. "gate); add it to the result instead")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "silu_mul", residual = k3.zeros({3, 3})}) end,
      "linear: residual cannot be combined with epilogue silu_mul (it would be added before the "
        .. "gate); add it to the result instead")
    H.raises(function() k3.linear(x, w, {epilogue = "gelu"}) end,
      "(field 'epilogue' must be \"silu_mul\" or nil; got \"gelu\")")
    H.raises(function() k3.linear(x, w, {epilogue = 3}) end,
      "(field 'epilogue' must be \"silu_mul\" or nil; got number)")
    H.raises(function() k3.linear(x, w, {epilogue = "silu_mul", kernel = "cpu.linear.reference", out = k3.zeros({3, 3}):t()}) end,
      "linear: out must have unit stride in its last dim")
    local m = k3.method.default()
    H.raises(function() m:apply(x, w, nil, {epilogue = "silu"}) end,
      "(field 'epilogue' must be \"silu_mul\" or nil; got \"silu\")")
    H.raises_exact(function() m:apply(x, k3.randn({5, 5}), nil, {epilogue = "silu_mul"}) end,
      "linear: w dim 1 (5) must be even for epilogue silu_mul")
    -- explain does not raise on refused arguments: it reports the error
    local e = m:explain(x, k3.randn({5, 5}), nil, {epilogue = "silu_mul"})
    assert.is_nil(e.chosen)
    assert.equal("linear: w dim 1 (5) must be even for epilogue silu_mul", e.error)
    -- nothing was written into out on a refusal
    local out = H.poisoned({3, 3})
    H.raises(function() k3.linear(x, k3.randn({7, 5}), {epilogue = "silu_mul", out = out}) end, "must be even")
    assert.is_true(H.has_nan(out))
  end)
end)

-- ---- the GPU kernels ---------------------------------------------------------------------------

local SKINNY, CUBLAS, BI = "cuda.linear.skinny", "cuda.linear.cublas", "cuda.linear.batch_invariant"

local all_plan = H.skinny_plan

-- Classic configurations (the in-kernel epilogue: rows_per_warp 8 and 16), one split-K-across-
-- CTAs configuration (kcta = 2) and two on the balanced grid (both through a temporary y and
-- cuda.silu_mul.generic; with 2 rows of w, most CTAs of the balanced grid have none).
local GPU_CONFIGS = {
  {threads = 256, rows = 8, unroll = 4, vec = 8},
  {threads = 128, rows = 8, unroll = 2, vec = 8},
  {threads = 512, rows = 32, unroll = 4, vec = 8},
  {threads = 256, rows = 64, unroll = 4, vec = 8},
  {threads = 512, rows = 16, unroll = 8, vec = 8, split_k = 16, rows_per_warp = 16},
  {threads = 256, rows = 32, unroll = 4, vec = 8, rows_per_warp = 16},
  {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 16}, -- kcta = 2
  {threads = 256, rows = 16, unroll = 4, vec = 8, balanced = true},
  {threads = 512, rows = 16, unroll = 8, vec = 8, rows_per_warp = 16, balanced = true},
}

describe("linear epilogue silu_mul on the GPU kernels #gpu", function()
  local function dev(shape, seed, dtype)
    return k3.randn(shape, {dtype = dtype or "bf16", seed = seed, device = "cuda"})
  end
  local function poisoned(M, N, dtype) return H.poisoned({M, N}, {dtype = dtype or "bf16", device = "cuda"}) end
  -- The fp64 reference: silu of the fp64 product, on the CPU.
  local function check_ref(h, x, w, what)
    local f = function(t) return t:to("cpu"):to("f64") end
    local ref = k3.silu_mul(k3.linear(f(x), f(w), {kernel = "cpu.linear.blas"}))
    local K = x:size(2)
    assert.is_true(k3.allclose(f(h), ref, {atol = 2e-2 * math.sqrt(K), rtol = 2e-2}),
      string.format("%s: max |h - ref| = %g", what, k3.max_abs_diff(f(h), ref)))
  end

  it("skinny through plans with static weights: classic (rows_per_warp 8, 16), split and balanced configurations, M = 1, 2, 8, 9, 16", function()
    if not H.need_gpu(pending) or not k3.has_kernel(SKINNY) then return end
    -- h columns N: 1, odd, not a multiple of any half tile (4, 8, 16, 32); K = 4104 has a
    -- partial last chunk of 32 k.
    for si, s in ipairs({{1, 4104}, {13, 4104}, {101, 4104}, {200, 1024}}) do
      local N, K = s[1], s[2]
      local w = dev({2 * N, K}, 2000 + si)
      for _, config in ipairs(GPU_CONFIGS) do
        local ll = k3.method.low_latency(all_plan(config), {static_weights = true})
        for _, M in ipairs({1, 2, 8, 9, 16}) do
          local x = dev({M, K}, 2100 + M)
          local what = string.format("N=%d K=%d threads=%d rows=%d unroll=%d split_k=%s rpw=%s balanced=%s M=%d",
            N, K, config.threads, config.rows, config.unroll, tostring(config.split_k),
            tostring(config.rows_per_warp), tostring(config.balanced), M)
          assert.equal(SKINNY, ll:explain(x, w, nil, {epilogue = "silu_mul"}).chosen, what)
          local h = ll:apply(x, w, nil, {epilogue = "silu_mul", out = poisoned(M, N)})
          local y = ll:apply(x, w, nil, {out = poisoned(M, 2 * N)})
          same_bits(h:to("cpu"), k3.silu_mul(y):to("cpu"), what)
          if M == 1 or M == 16 then check_ref(h, x, w, what) end
        end
      end
    end
  end)

  it("skinny on the kimi-k3-tp8 gate_up 8448x7168, M = 1, 8, 16, and with a prologue (through its temporary)", function()
    if not H.need_gpu(pending) or not k3.has_kernel(SKINNY) then return end
    local N, K = 4224, 7168
    local w = dev({2 * N, K}, 2200)
    for _, config in ipairs({GPU_CONFIGS[1], GPU_CONFIGS[5], GPU_CONFIGS[7], GPU_CONFIGS[9]}) do
      local ll = k3.method.low_latency(all_plan(config), {static_weights = true})
      for _, M in ipairs({1, 8, 16}) do
        local x = dev({M, K}, 2210 + M)
        local what = string.format("8448x7168 threads=%d rows=%d balanced=%s M=%d", config.threads, config.rows,
          tostring(config.balanced), M)
        local h = ll:apply(x, w, nil, {epilogue = "silu_mul", out = poisoned(M, N)})
        same_bits(h:to("cpu"), k3.silu_mul(ll:apply(x, w)):to("cpu"), what)
      end
    end
    -- prologue silu_mul and the epilogue: x [M, 2K]
    local M = 3
    local xg = dev({M, 2 * K}, 2230)
    local h = k3.linear(xg, w, {prologue = "silu_mul", epilogue = "silu_mul", kernel = SKINNY, out = poisoned(M, N)})
    same_bits(h:to("cpu"), k3.silu_mul(k3.linear(k3.silu_mul(xg), w, {kernel = SKINNY})):to("cpu"), "prologue and epilogue")
    -- a balanced-grid plan: h into a temporary, the balanced launch into a temporary y, then silu_mul
    local bal = k3.method.low_latency(all_plan(GPU_CONFIGS[9]), {static_weights = true})
    assert.equal(SKINNY, bal:explain(xg, w, nil, {prologue = "silu_mul", epilogue = "silu_mul"}).chosen)
    local hb = bal:apply(xg, w, nil, {prologue = "silu_mul", epilogue = "silu_mul", out = poisoned(M, N)})
    same_bits(hb:to("cpu"), k3.silu_mul(bal:apply(k3.silu_mul(xg), w)):to("cpu"), "balanced, prologue and epilogue")
  end)

  it("cuBLAS (k3.linear without a method), with a bias, bf16 and f32, M = 1, 2, 8, 9, 16", function()
    if not H.need_gpu(pending) then return end
    for _, dtype in ipairs({"bf16", "f32"}) do
      local N, K = 37, 264
      local w = dev({2 * N, K}, 2300, dtype)
      local b = dev({2 * N}, 2301, dtype)
      for _, M in ipairs({1, 2, 8, 9, 16}) do
        local x = dev({M, K}, 2310 + M, dtype)
        local what = string.format("cuBLAS %s M=%d", dtype, M)
        assert.equal(CUBLAS, k3.trace(function() k3.linear(x, w, {epilogue = "silu_mul"}) end)[1].chosen, what)
        local h = k3.linear(x, w, {epilogue = "silu_mul", out = poisoned(M, N, dtype)})
        same_bits(h:to("cpu"), k3.silu_mul(k3.linear(x, w)):to("cpu"), what)
        local hb = k3.linear(x, w, {bias = b, epilogue = "silu_mul", out = poisoned(M, N, dtype)})
        same_bits(hb:to("cpu"), k3.silu_mul(k3.linear(x, w, {bias = b})):to("cpu"), what .. " bias")
        check_ref(h, x, w, what)
      end
    end
  end)

  it("the batch-invariant kernel, and the skinny kernel called directly (default configuration)", function()
    if not H.need_gpu(pending) then return end
    local N, K = 21, 520
    local w = dev({2 * N, K}, 2400)
    for _, M in ipairs({1, 2, 8, 9, 16}) do
      local x = dev({M, K}, 2410 + M)
      for _, kernel in ipairs({BI, SKINNY}) do
        if k3.has_kernel(kernel) then
          local what = kernel .. " M=" .. M
          local h = k3.linear(x, w, {epilogue = "silu_mul", kernel = kernel, out = poisoned(M, N)})
          same_bits(h:to("cpu"), k3.silu_mul(k3.linear(x, w, {kernel = kernel})):to("cpu"), what)
        end
      end
    end
  end)
end)
