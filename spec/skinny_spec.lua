-- cuda.linear.skinny and cuda.linear.batch_invariant on a GPU: correctness against the fp64
-- reference (K not a multiple of 4096, N not a multiple of the rows per block, M = 1..17),
-- ones·ones = K, the residual variant, split-K across CTAs (re-launch, residual), the balanced
-- grid (every classic configuration; prologues and epilogues through a temporary), the PDL
-- launch with static weights (every entry of the plan file, views ending at their storage's
-- last element, a chain where kernels rewrite x), static storage refusing writes, every
-- decline reason driven with a real input whose result must equal cuBLAS's, and the
-- batch-invariant rows equal across M and to the CPU.
local k3 = require "k3"
local H = require "spec.helpers"

local function need_kernel(name)
  if not k3.has_kernel(name) then
    pending(name .. " is not registered in this build")
    return false
  end
  return true
end

local SKINNY, CUBLAS, BI = "cuda.linear.skinny", "cuda.linear.cublas", "cuda.linear.batch_invariant"

-- Every instantiated configuration (kernels/linear_skinny.cuh, K3_SKINNY_CONFIGS).
local CONFIGS = {
  {128, 8, 2}, {128, 8, 4}, {128, 8, 8}, {256, 8, 2}, {256, 8, 4}, {256, 8, 8}, {512, 8, 2},
  {512, 8, 4}, {512, 8, 8}, {128, 16, 4}, {256, 16, 2}, {256, 16, 4}, {256, 16, 8},
  {512, 16, 4}, {512, 16, 8}, {256, 32, 4}, {512, 32, 2}, {512, 32, 4}, {256, 64, 4},
  {512, 64, 4},
}
-- kernels/linear_skinny.cuh's K3_SKINNY_RPW16_CONFIGS: 16 rows of w per warp.
local CONFIGS16 = {
  {128, 16, 4}, {256, 16, 4}, {256, 16, 8}, {512, 16, 4}, {512, 16, 8}, {256, 32, 4},
  {512, 32, 2}, {512, 32, 4}, {256, 64, 4}, {512, 64, 4},
}
-- kernels/linear_skinny.cuh's K3_SKINNY_RPW32_CONFIGS: 32 rows of w per warp.
local CONFIGS32 = {
  {128, 32, 2}, {256, 32, 2}, {256, 64, 2}, {512, 64, 2}, {512, 128, 2}, {256, 32, 4},
}

-- A plan config for a classic triple {threads, rows, unroll} (rows_per_warp 8, 16 or 32) on the
-- balanced grid.
local function balanced_config(c, rows_per_warp)
  return {threads = c[1], rows = c[2], unroll = c[3], vec = 8, rows_per_warp = rows_per_warp, balanced = true}
end

local function bf16(shape, seed)
  return k3.randn(shape, {dtype = "bf16", seed = seed, device = "cuda"})
end

-- y (any device, dtype) against ref (an fp64 CPU tensor) within bf16 tolerance for K terms;
-- no NaN (the poisoned outputs were all written).
local function check_against(y, ref, K, what)
  local y64 = y:to("cpu"):to("f64")
  assert.is_false(H.has_nan(y64), what .. ": unwritten (NaN) outputs")
  assert.is_true(k3.allclose(y64, ref, {atol = 1e-2 * math.sqrt(K), rtol = 1e-2}),
    string.format("%s: max |y - ref| = %g", what, k3.max_abs_diff(y64, ref)))
end

-- The fp64 reference of x w^T (+ bias) (+ residual) on the CPU.
local function reference(x, w, residual, bias)
  local f = function(t) return t and t:to("cpu"):to("f64") or nil end
  return k3.linear(f(x), f(w), {bias = f(bias), residual = f(residual), kernel = "cpu.linear.reference"})
end

-- y (any device, dtype) against the fp64 reference of x w^T (+ bias) (+ residual) on the CPU.
local function check_ref(y, x, w, residual, what, bias)
  check_against(y, reference(x, w, residual, bias), x:size(2), what)
end

-- y against the fp64 reference on three blocks of 16 rows of w (first, middle, last): the
-- check for weights whose full CPU reference would take too long.
local function check_rows(y, x, w, residual, what)
  local N = w:size(1)
  for _, a in ipairs({1, math.max(1, N // 2 - 7), math.max(1, N - 15)}) do
    local len = math.min(16, N - a + 1)
    local r = residual and residual:narrow(2, a, len):contiguous() or nil
    check_ref(y:narrow(2, a, len):contiguous(), x, w:narrow(1, a, len):contiguous(), r,
      string.format("%s rows %d..%d", what, a, a + len - 1))
  end
end

-- The skinny kernel called directly into a NaN-poisoned out.
local function skinny(x, w, residual)
  local out = H.poisoned({x:size(1), w:size(1)}, {dtype = "bf16", device = "cuda"})
  return k3.linear(x, w, {kernel = SKINNY, residual = residual, out = out})
end

local all_plan = H.skinny_plan

-- The decline a method recorded for the skinny kernel, and the whole decision.
local function skinny_decline(e)
  for _, d in ipairs(e.declined) do
    if d.kernel == SKINNY then return d.reason end
  end
  return nil
end

describe("cuda.linear.skinny #gpu", function()
  it("matches the fp64 reference for K = 4096, 4104, 5120, 6144, 7168, 8192, 14336", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N = 264 -- 33 groups of 8 rows: the last block of a 16/32/64-row config is partial
    for i, K in ipairs({4096, 4104, 5120, 6144, 7168, 8192, 14336}) do
      local w = bf16({N, K}, 100 + i)
      for _, M in ipairs({1, 5, 9, 16}) do
        local x = bf16({M, K}, 200 + M)
        check_ref(skinny(x, w), x, w, nil, string.format("K=%d M=%d", K, M))
      end
    end
  end)

  it("matches the fp64 reference at M = 1..17 for three shapes (17 on the fallback)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local ll = k3.method.low_latency(all_plan(), {static_weights = true})
    for i, s in ipairs({{131, 4104}, {1536, 7168}, {7168, 768}}) do
      local N, K = s[1], s[2]
      local w = bf16({N, K}, 300 + i)
      for M = 1, 17 do
        local x = bf16({M, K}, 400 + M)
        local what = string.format("%dx%d M=%d", N, K, M)
        local e = ll:explain(x, w)
        if M <= 16 then
          assert.equal(SKINNY, e.chosen, what)
          check_ref(skinny(x, w), x, w, nil, what .. " direct")
        else
          assert.equal(CUBLAS, e.chosen, what)
          assert.equal("plan has no entry for M = 17", skinny_decline(e), what)
          H.raises(function() skinny(x, w) end, "M = 17 is outside 1..16")
        end
        check_ref(ll:apply(x, w, nil, {out = H.poisoned({M, N}, {dtype = "bf16", device = "cuda"})}),
          x, w, nil, what .. " method")
      end
    end
  end)

  it("every instantiated configuration matches the reference (through plans)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 200, 4104
    local w = bf16({N, K}, 500)
    for _, c in ipairs(CONFIGS) do
      local config = {threads = c[1], rows = c[2], unroll = c[3], vec = 8}
      local ll = k3.method.low_latency(all_plan(config))
      for _, M in ipairs({1, 8, 9, 16}) do
        local x = bf16({M, K}, 600 + M)
        local what = string.format("threads=%d rows=%d unroll=%d M=%d", c[1], c[2], c[3], M)
        assert.equal(SKINNY, ll:explain(x, w).chosen, what)
        check_ref(ll:apply(x, w), x, w, nil, what)
      end
    end
  end)

  it("every 16- and 32-rows-per-warp configuration matches the reference (through plans)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    -- N = 200 ends inside a warp's second 8-row group for rows 16 and 32 (N % 16 = 8), and
    -- inside a 32-row warp's second group (N % 32 = 8); N = 7168 + 24 inside its fourth
    for _, shape in ipairs({{200, 4104}, {7168, 1536}, {7192, 520}}) do
      local N, K = shape[1], shape[2]
      local w = bf16({N, K}, 510 + N)
      local configs = {}
      for _, c in ipairs(CONFIGS16) do configs[#configs + 1] = {c, 16} end
      for _, c in ipairs(CONFIGS32) do configs[#configs + 1] = {c, 32} end
      for _, cr in ipairs(configs) do
        local c, rpw = cr[1], cr[2]
        local config = {threads = c[1], rows = c[2], unroll = c[3], vec = 8, rows_per_warp = rpw}
        local ll = k3.method.low_latency(all_plan(config))
        for _, M in ipairs({1, 8, 9, 16}) do
          local x = bf16({M, K}, 610 + M)
          local what = string.format("N=%d threads=%d rows=%d unroll=%d rows_per_warp=%d M=%d",
            N, c[1], c[2], c[3], rpw, M)
          assert.equal(SKINNY, ll:explain(x, w).chosen, what)
          check_ref(ll:apply(x, w, nil, {out = H.poisoned({M, N}, {dtype = "bf16", device = "cuda"})}),
            x, w, nil, what)
        end
      end
    end
  end)

  it("rows_per_warp = 16 and 32: a configuration not compiled that way is declined by name; a prologue call runs", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local K = 1536
    local w = bf16({64, K}, 520)
    local x = bf16({4, K}, 521)
    local ll = k3.method.low_latency(all_plan({threads = 256, rows = 16, unroll = 2, vec = 8,
                                               rows_per_warp = 16}))
    local e = ll:explain(x, w)
    assert.equal(CUBLAS, e.chosen)
    assert.equal("config {threads = 256, rows = 16, unroll = 2, vec = 8, split_k = 8, " ..
      "rows_per_warp = 16} is not instantiated", skinny_decline(e))
    local ll32 = k3.method.low_latency(all_plan({threads = 256, rows = 32, unroll = 8, vec = 8,
                                                 rows_per_warp = 32}))
    e = ll32:explain(x, w)
    assert.equal(CUBLAS, e.chosen)
    assert.equal("config {threads = 256, rows = 32, unroll = 8, vec = 8, split_k = 8, " ..
      "rows_per_warp = 32} is not instantiated", skinny_decline(e))
    -- SwiGLU prologue: h through the temporary, then the 16-rows-per-warp kernel
    local ll16 = k3.method.low_latency(all_plan({threads = 512, rows = 16, unroll = 8, vec = 8,
                                                 rows_per_warp = 16}))
    local xg = bf16({4, 2 * K}, 522)
    local y = ll16:apply(xg, w, nil, {prologue = "silu_mul"})
    local h = k3.silu_mul(xg)
    check_ref(y, h, w, nil, "silu_mul prologue, rows_per_warp = 16")
  end)

  it("every classic configuration on the balanced grid matches the reference (through plans, with a residual)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    -- The grid is a multiple of the SM count (132 on an H200) with at most `rows` rows a CTA:
    -- N = 200 is below sms x rows for every tile (each CTA takes 1 or 2 rows, most of its row
    -- groups predicated off); N = 9004 is above it for rows 8..64 (up to 8448 on an H200), so
    -- CTAs take ceil or floor of N / G rows, not a multiple of 8; K = 4104 and 520 end in a
    -- partial chunk of 32 k.
    local configs = {}
    for _, c in ipairs(CONFIGS) do configs[#configs + 1] = balanced_config(c) end
    for _, c in ipairs(CONFIGS16) do configs[#configs + 1] = balanced_config(c, 16) end
    for _, c in ipairs(CONFIGS32) do configs[#configs + 1] = balanced_config(c, 32) end
    for si, shape in ipairs({{200, 4104}, {9004, 520}}) do
      local N, K = shape[1], shape[2]
      local w = bf16({N, K}, 530 + si)
      local xs, rs, refs = {}, {}, {}
      for _, M in ipairs({1, 4, 8, 9, 16}) do
        xs[M], rs[M] = bf16({M, K}, 540 + M), bf16({M, N}, 560 + M)
        refs[M] = {reference(xs[M], w), reference(xs[M], w, rs[M])}
      end
      for _, config in ipairs(configs) do
        local ll = k3.method.low_latency(all_plan(config), {static_weights = true})
        for _, M in ipairs({1, 4, 8, 9, 16}) do
          local what = string.format("%dx%d threads=%d rows=%d unroll=%d rows_per_warp=%s balanced M=%d",
            N, K, config.threads, config.rows, config.unroll, tostring(config.rows_per_warp or 8), M)
          assert.equal(SKINNY, ll:explain(xs[M], w).chosen, what)
          check_against(ll:apply(xs[M], w, nil, {out = H.poisoned({M, N}, {dtype = "bf16", device = "cuda"})}),
            refs[M][1], K, what)
          check_against(ll:apply(xs[M], w, nil, {residual = rs[M],
            out = H.poisoned({M, N}, {dtype = "bf16", device = "cuda"})}), refs[M][2], K, what .. " residual")
        end
      end
      w:free()
    end
  end)

  it("balanced grid on the Kimi-K3 shapes 1536x7168 and 7168x4224: the tiled launch's results, M = 1, 9, 16", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    -- 1536 rows of 16 are 96 tiles on 132 SMs; 7168 rows of 32 are 224 tiles: the balanced grid
    -- gives each SM the same rows instead. Per row the sums run in the same order either way.
    for si, shape in ipairs({{1536, 7168}, {7168, 4224}}) do
      local N, K = shape[1], shape[2]
      local w = bf16({N, K}, 580 + si)
      for _, c in ipairs({{{512, 16, 8}, 16}, {{256, 32, 4}, 8}}) do
        local tiled = k3.method.low_latency(all_plan({threads = c[1][1], rows = c[1][2], unroll = c[1][3],
                                                      vec = 8, rows_per_warp = c[2]}), {static_weights = true})
        local bal = k3.method.low_latency(all_plan(balanced_config(c[1], c[2])), {static_weights = true})
        for _, M in ipairs({1, 9, 16}) do
          local x = bf16({M, K}, 590 + M)
          local what = string.format("%dx%d threads=%d rows=%d balanced M=%d", N, K, c[1][1], c[1][2], M)
          local y = bal:apply(x, w, nil, {out = H.poisoned({M, N}, {dtype = "bf16", device = "cuda"})})
          assert.equal(0, k3.max_abs_diff(y, tiled:apply(x, w)), what .. ": differs from the tiled launch")
          check_rows(y, x, w, nil, what)
        end
      end
      w:free()
    end
  end)

  it("balanced grid: prologue and epilogue calls run (through a temporary, then the balanced launch)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 200, 1536
    local w = bf16({N, K}, 600)
    local nw = (k3.randn({K}, {seed = 601, device = "cuda"}) * 0.1 + 1):to("bf16")
    local o = {dtype = "bf16", device = "cuda"}
    for _, c in ipairs({{{256, 8, 4}}, {{512, 16, 8}, 16}}) do
      local ll = k3.method.low_latency(all_plan(balanced_config(c[1], c[2])), {static_weights = true})
      for _, M in ipairs({1, 9, 16}) do
        local what = string.format("threads=%d rows=%d balanced M=%d", c[1][1], c[1][2], M)
        -- SwiGLU prologue: x [M, 2K]
        local xg = bf16({M, 2 * K}, 602 + M)
        assert.equal(SKINNY, ll:explain(xg, w, nil, {prologue = "silu_mul"}).chosen, what)
        local y = ll:apply(xg, w, nil, {prologue = "silu_mul", out = H.poisoned({M, N}, o)})
        local h = k3.silu_mul(xg)
        assert.equal(0, k3.max_abs_diff(y, ll:apply(h, w)), what .. ": silu_mul prologue differs from silu_mul then linear")
        check_ref(y, h, w, nil, what .. " silu_mul prologue")
        -- RMSNorm prologue
        local x = bf16({M, K}, 620 + M)
        local opts = {prologue = "rms_norm", norm_weight = nw, eps = 1e-5}
        assert.equal(SKINNY, ll:explain(x, w, nil, opts).chosen, what)
        opts.out = H.poisoned({M, N}, o)
        local yr = ll:apply(x, w, nil, opts)
        local hr = k3.rms_norm(x, nw, 1e-5)
        assert.equal(0, k3.max_abs_diff(yr, ll:apply(hr, w)), what .. ": rms_norm prologue differs from rms_norm then linear")
        check_ref(yr, hr, w, nil, what .. " rms_norm prologue")
        -- silu_mul epilogue: w [2N', K] gate | up rows, h [M, N'] = silu(gate) * up
        assert.equal(SKINNY, ll:explain(x, w, nil, {epilogue = "silu_mul"}).chosen, what)
        local he = ll:apply(x, w, nil, {epilogue = "silu_mul", out = H.poisoned({M, N // 2}, o)})
        local ye = ll:apply(x, w)
        assert.is_false(H.has_nan(he:to("cpu")), what .. " epilogue: unwritten (NaN) outputs")
        assert.equal(0, k3.max_abs_diff(he, k3.silu_mul(ye)), what .. ": silu_mul epilogue differs from linear then silu_mul")
      end
    end
  end)

  it("ones · ones = K exactly (rounded once to bf16)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    for _, K in ipairs({4096, 4104, 5120, 7168, 14336}) do
      local want = k3.full({1}, K, {dtype = "bf16"}):get(1) -- 4104 is not a bf16: 4096
      for _, M in ipairs({1, 16}) do
        local x = k3.ones({M, K}, {dtype = "bf16", device = "cuda"})
        local w = k3.ones({40, K}, {dtype = "bf16", device = "cuda"})
        local y = skinny(x, w):to("cpu")
        for i = 1, M do
          for n = 1, 40 do
            assert.equal(want, y:get(i, n), string.format("K=%d M=%d [%d,%d]", K, M, i, n))
          end
        end
      end
    end
  end)

  it("residual variant: residual + x·wᵀ in one pass, strided residual and out", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 136, 5120
    local w = bf16({N, K}, 700)
    for _, M in ipairs({1, 7, 16}) do
      local x = bf16({M, K}, 710 + M)
      local r = bf16({M, N}, 720 + M)
      check_ref(skinny(x, w, r), x, w, r, string.format("residual M=%d", M))
      -- a padded residual and a padded out: the kernel honours their row strides and writes
      -- nothing outside the out view
      local rp = H.padded(M, N, 8, {dtype = "bf16", device = "cuda", seed = 730 + M})
      local base = H.poisoned({M, N + 8}, {dtype = "bf16", device = "cuda"})
      local out = base:narrow(2, 1, N)
      k3.linear(x, w, {kernel = SKINNY, residual = rp, out = out})
      check_ref(out, x, w, rp, string.format("padded residual/out M=%d", M))
      for _, row in ipairs(base:narrow(2, N + 1, 8):to("cpu"):totable()) do
        for _, v in ipairs(row) do assert.is_true(v ~= v, "the padding of out was written") end
      end
    end
  end)
end)

-- Split-K across CTAs (kernels/linear_skinny.cuh, K3_SKINNY_SPLIT_CONFIGS): split_k = kw x kcta
-- with kw = threads / 32 / (rows / 8) and kcta (CTAs along K) >= 2.
local SPLIT_CONFIGS = { -- {threads, rows, unroll, kcta}
  {256, 8, 4, 2}, {256, 8, 4, 3}, {128, 8, 8, 4}, {256, 8, 8, 2}, {512, 8, 2, 3}, {512, 8, 2, 8},
}
local function split_config(c)
  local kw = c[1] // 32 // (c[2] // 8)
  return {threads = c[1], rows = c[2], unroll = c[3], vec = 8, split_k = kw * c[4]}
end

describe("cuda.linear.skinny, split-K across CTAs #gpu", function()
  it("matches the fp64 reference through plans (several shapes, M = 1, 7, 16, residual)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    -- N not a multiple of 8 (partial last tile), K with a partial last chunk (4104) and
    -- chunk counts not divisible by kcta; 1536x7168 and 2304x1536 are Kimi-K3 shapes
    local shapes = {{1536, 7168}, {2304, 1536}, {131, 4104}, {264, 5120}}
    for si, s in ipairs(shapes) do
      local N, K = s[1], s[2]
      local w = bf16({N, K}, 800 + si)
      for ci, c in ipairs(SPLIT_CONFIGS) do
        local config = split_config(c)
        local ll = k3.method.low_latency(all_plan(config))
        for _, M in ipairs({1, 7, 16}) do
          local x = bf16({M, K}, 810 + M)
          local what = string.format("%dx%d threads=%d rows=%d unroll=%d kcta=%d M=%d", N, K,
            c[1], c[2], c[3], c[4], M)
          assert.equal(SKINNY, ll:explain(x, w).chosen, what)
          check_ref(ll:apply(x, w, nil, {out = H.poisoned({M, N}, {dtype = "bf16", device = "cuda"})}),
            x, w, nil, what)
          if ci <= 2 or si == 1 then
            local r = bf16({M, N}, 820 + M)
            check_ref(ll:apply(x, w, nil, {residual = r,
              out = H.poisoned({M, N}, {dtype = "bf16", device = "cuda"})}), x, w, r, what .. " residual")
          end
        end
      end
    end
  end)

  it("re-launched twice in a row gives identical results (counters reset), equal to the other kcta", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 1536, 7168
    local w = bf16({N, K}, 900)
    for _, M in ipairs({1, 7, 16}) do
      local x = bf16({M, K}, 910 + M)
      local r = bf16({M, N}, 920 + M)
      for _, c in ipairs(SPLIT_CONFIGS) do
        local ll = k3.method.low_latency(all_plan(split_config(c)))
        local what = string.format("threads=%d rows=%d unroll=%d kcta=%d M=%d", c[1], c[2], c[3], c[4], M)
        local o = {dtype = "bf16", device = "cuda"}
        local y1 = ll:apply(x, w, nil, {residual = r, out = H.poisoned({M, N}, o)})
        local y2 = ll:apply(x, w, nil, {residual = r, out = H.poisoned({M, N}, o)})
        local y3 = ll:apply(x, w, nil, {residual = r, out = H.poisoned({M, N}, o)})
        assert.equal(0, k3.max_abs_diff(y1, y2), what .. ": second launch differs")
        assert.equal(0, k3.max_abs_diff(y1, y3), what .. ": third launch differs")
        check_ref(y3, x, w, r, what)
      end
    end
  end)

  it("ones · ones = K exactly with the K slices summed across CTAs", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    for _, K in ipairs({4096, 7168, 14336}) do
      local want = k3.full({1}, K, {dtype = "bf16"}):get(1)
      for _, c in ipairs({SPLIT_CONFIGS[1], SPLIT_CONFIGS[6]}) do
        local ll = k3.method.low_latency(all_plan(split_config(c)))
        for _, M in ipairs({1, 16}) do
          local x = k3.ones({M, K}, {dtype = "bf16", device = "cuda"})
          local w = k3.ones({40, K}, {dtype = "bf16", device = "cuda"})
          local y = ll:apply(x, w):to("cpu")
          for i = 1, M do
            for n = 1, 40 do
              assert.equal(want, y:get(i, n), string.format("K=%d kcta=%d M=%d [%d,%d]", K, c[4], M, i, n))
            end
          end
        end
      end
    end
  end)

  it("declines split configurations it cannot run, with named reasons, and the fallback serves", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local x, w = bf16({3, 1024}, 1), bf16({96, 1024}, 2)
    local cases = {
      -- 256 threads, rows 8: kw = 8; 12 is not a multiple
      {{threads = 256, rows = 8, unroll = 4, split_k = 12},
        "config {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 12} is not instantiated"},
      {{threads = 256, rows = 8, unroll = 4, split_k = 8 * 33},
        "asks for 33 CTAs along K (split_k / 8); at most 32"},
      -- (256, 8, 2) is a classic configuration only
      {{threads = 256, rows = 8, unroll = 2, split_k = 16},
        "config {threads = 256, rows = 8, unroll = 2, vec = 8, split_k = 16} is not instantiated for split-K across CTAs"},
    }
    for _, case in ipairs(cases) do
      local ll = k3.method.low_latency({[3] = {kernel = "skinny", config = case[1]}})
      local e = ll:explain(x, w)
      assert.equal(CUBLAS, e.chosen)
      local reason = skinny_decline(e)
      assert.truthy(reason and reason:find(case[2], 1, true), tostring(reason))
      assert.equal(0, k3.max_abs_diff(ll:apply(x, w), k3.linear(x, w, {kernel = CUBLAS})))
    end
  end)
end)

-- The decline reasons, each with a real input, answered by the method's fully built default.
describe("cuda.linear.skinny declines, and the fallback serves #gpu", function()
  local N, K = 96, 128
  after_each(function() k3.set_batch_invariant(false) end)

  -- Runs a method (plan config: the kernel's default when nil) on (x, w, bias), checks the
  -- decline text and that the result equals cuBLAS's.
  local function declines(x, w, bias, text, chosen, config)
    local ll = k3.method.low_latency(all_plan(config), {static_weights = true})
    local e = ll:explain(x, w, bias)
    local reason = skinny_decline(e)
    assert.truthy(reason, "no decline recorded for " .. SKINNY)
    assert.truthy(reason:find(text, 1, true), string.format("%q does not contain %q", reason, text))
    assert.equal(chosen or CUBLAS, e.chosen)
    local y = ll:apply(x, w, bias)
    local want = k3.linear(x, w, {bias = bias, kernel = chosen or CUBLAS})
    assert.equal(0, k3.max_abs_diff(y, want))
    return y
  end

  it("bias", function()
    if not H.need_gpu(pending) then return end
    local x, w, b = bf16({2, K}, 1), bf16({N, K}, 2), bf16({N}, 3)
    declines(x, w, b, "bias is present")
  end)

  it("batch-invariant mode", function()
    if not H.need_gpu(pending) or not need_kernel(BI) then return end
    local x, w = bf16({2, K}, 1), bf16({N, K}, 2)
    k3.set_batch_invariant(true)
    declines(x, w, nil, "batch-invariant mode is on", BI)
  end)

  it("f32", function()
    if not H.need_gpu(pending) then return end
    local x = k3.randn({2, K}, {device = "cuda", seed = 1})
    local w = k3.randn({N, K}, {device = "cuda", seed = 2})
    declines(x, w, nil, "x is not bf16 (f32)")
  end)

  for _, M in ipairs({1, 4}) do
    it("strided x: [" .. M .. ",128], the last 128 elements of rows with stride 6288 (M=" .. M .. ")", function()
      if not H.need_gpu(pending) then return end
      local base = bf16({M, 6288}, 10 + M)
      local x = base:narrow(2, 6288 - 128 + 1, 128)
      assert.same({6288, 1}, x:stride())
      assert.equal(M == 1, x:is_contiguous()) -- is_contiguous ignores a size-1 dim's stride
      local w = bf16({N, 128}, 20)
      local y = declines(x, w, nil, "x is not packed row-major")
      check_ref(y, x, w, nil, "strided x fallback")
      -- called directly, the kernel fails loud and names the strides
      H.raises(function() k3.linear(x, w, {kernel = SKINNY}) end,
        string.format("x is not packed row-major: strides [6288, 1] for shape [%d, 128], needs [128, 1]", M))
    end)
  end

  it("strided w", function()
    if not H.need_gpu(pending) then return end
    local x = bf16({2, K}, 1)
    local w = H.padded(N, K, 8, {dtype = "bf16", device = "cuda", seed = 2})
    declines(x, w, nil, "w is not packed row-major")
    H.raises(function() k3.linear(x, w, {kernel = SKINNY}) end,
      string.format("w is not packed row-major: strides [%d, 1] for shape [%d, %d], needs [%d, 1]",
        K + 8, N, K, K))
  end)

  it("x not 16-byte aligned (packed strides, storage offset 1)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local flat = bf16({2 * K + 1}, 5)
    local x = flat:narrow(1, 2, 2 * K):view({2, K})
    assert.same({K, 1}, x:stride())
    local w = bf16({N, K}, 6)
    local y = declines(x, w, nil, "x is not 16-byte aligned")
    check_ref(y, x, w, nil, "misaligned x fallback")
    H.raises(function() k3.linear(x, w, {kernel = SKINNY}) end, "x is not 16-byte aligned")
  end)

  it("K mismatch", function()
    if not H.need_gpu(pending) then return end
    local ll = k3.method.low_latency(all_plan())
    local x, w = bf16({1, 7000}, 1), bf16({N, 7168}, 2)
    H.raises(function() ll:apply(x, w) end, "linear: x dim 2 (7000) must match w dim 2 (7168)")
    H.raises(function() k3.linear(x, w, {kernel = SKINNY}) end, "x dim 2 (7000) must match w dim 2 (7168)")
  end)

  it("M = 17", function()
    if not H.need_gpu(pending) then return end
    local x, w = bf16({17, K}, 1), bf16({N, K}, 2)
    declines(x, w, nil, "plan has no entry for M = 17")
  end)

  it("a configuration that is not instantiated", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local ll = k3.method.low_latency({[1] = {kernel = "skinny", config = {threads = 96}}})
    local x, w = bf16({1, K}, 1), bf16({N, K}, 2)
    local e = ll:explain(x, w)
    assert.equal(CUBLAS, e.chosen)
    assert.equal("config {threads = 96, rows = 8, unroll = 4, vec = 8, split_k = 3} is not instantiated",
      skinny_decline(e))
    assert.equal(0, k3.max_abs_diff(ll:apply(x, w), k3.linear(x, w, {kernel = CUBLAS})))
  end)

  it("the balanced grid with split-K across CTAs", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local x, w = bf16({2, K}, 1), bf16({N, K}, 2)
    declines(x, w, nil, "config {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 16, balanced = true} splits K " ..
      "across 2 CTAs; the balanced grid needs split_k = 8 (one CTA along K)", nil,
      {threads = 256, rows = 8, unroll = 4, split_k = 16, balanced = true})
    declines(x, w, nil, "config {threads = 512, rows = 16, unroll = 8, vec = 8, split_k = 48, rows_per_warp = 16, " ..
      "balanced = true} splits K " ..
      "across 3 CTAs; the balanced grid needs split_k = 16 (one CTA along K)", nil,
      {threads = 512, rows = 16, unroll = 8, split_k = 48, rows_per_warp = 16, balanced = true})
  end)

  it("the balanced grid on a configuration that is not instantiated", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local x, w = bf16({4, K}, 1), bf16({N, K}, 2)
    declines(x, w, nil, "config {threads = 96, rows = 8, unroll = 4, vec = 8, split_k = 3, balanced = true} is not instantiated",
      nil, {threads = 96, balanced = true})
    declines(x, w, nil, "config {threads = 256, rows = 16, unroll = 2, vec = 8, split_k = 8, rows_per_warp = 16, " ..
      "balanced = true} is not instantiated", nil, {threads = 256, rows = 16, unroll = 2, rows_per_warp = 16, balanced = true})
  end)

  it("kernel disabled (K3_DISABLE_KERNELS): the fallback result equals cuBLAS's", function()
    if not H.need_gpu(pending) then return end
    local p = io.popen([[K3_DISABLE_KERNELS=cuda.linear.skinny scripts/k3 -e '
      local ll = k3.method.low_latency({[1] = {kernel = "skinny"}})
      local x = k3.randn({1, 128}, {dtype = "bf16", device = "cuda", seed = 1})
      local w = k3.randn({96, 128}, {dtype = "bf16", device = "cuda", seed = 2})
      local e = ll:explain(x, w)
      print(e.declined[1].reason)
      print(e.chosen)
      print(k3.max_abs_diff(ll:apply(x, w), k3.linear(x, w, {kernel = "cuda.linear.cublas"})))
      print(tostring(k3.has_kernel("cuda.linear.skinny")))' 2>&1]])
    local out = p:read("a")
    p:close()
    local absent = "not registered in this build (disabled by K3_DISABLE_KERNELS)\ncuda.linear.cublas\n"
    assert.truthy(out:find(absent .. "0.0\nfalse", 1, true) or out:find(absent .. "0\nfalse", 1, true), out)
  end)
end)

local function poisoned_out(M, N) return H.poisoned({M, N}, {dtype = "bf16", device = "cuda"}) end

-- The kernel launches with programmatic dependent launch; with static weights its first step of
-- w is loaded before it waits for the previous kernel (x, the residual and every write after).
-- Classic, split-K and balanced-grid configurations, static and not.
local PDL_CONFIGS = {
  {threads = 512, rows = 8, unroll = 2, vec = 8}, {threads = 256, rows = 8, unroll = 4, vec = 8},
  split_config({512, 8, 2, 3}), split_config({256, 8, 4, 2}),
  balanced_config({256, 16, 4}), balanced_config({512, 16, 8}, 16),
}

describe("cuda.linear.skinny with PDL and static weights #gpu", function()
  it("every (shape, M) entry of this GPU's plan file matches the fp64 reference", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local ok, policy = pcall(require, "k3.policy." .. tostring(k3.cuda_arch and k3.cuda_arch(0)))
    if not ok or type(policy) ~= "table" or not policy.plans then
      pending("no plan file for this GPU's architecture")
      return
    end
    local n = 0
    for shape, plan in pairs(policy.plans) do
      local N, K = shape:match("^(%d+)x(%d+)$")
      N, K = tonumber(N), tonumber(K)
      local w = bf16({N, K}, N + K)
      local ll = k3.method.low_latency(k3.plan_for(w), {static_weights = true})
      for M in pairs(plan) do
        local x = bf16({M, K}, 1200 + M)
        local what = string.format("plan %s M=%d", shape, M)
        assert.equal(SKINNY, ll:explain(x, w).chosen, what)
        check_rows(ll:apply(x, w, nil, {out = poisoned_out(M, N)}), x, w, nil, what)
        n = n + 1
      end
      w:free()
    end
    assert.is_true(n > 0, "the plan file has no entry")
  end)

  -- Nothing past the end of x or w is read: views that end at the last element of their
  -- storage (compute-sanitizer memcheck, scripts/gpu-check, reports any read beyond).
  for _, M in ipairs({1, 4}) do
    it("x and w views ending at the last element of their storage (M = " .. M .. ")", function()
      if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
      local N, K = 136, 4104
      local xs = bf16({8 + M * K}, 1400 + M)
      local x = xs:narrow(1, 9, M * K):view({M, K})
      local ws = bf16({8 + N * K}, 1410)
      local w = ws:narrow(1, 9, N * K):view({N, K})
      for i, cfg in ipairs(PDL_CONFIGS) do
        for _, static in ipairs({true, false}) do
          local ll = k3.method.low_latency(all_plan(cfg), {static_weights = static})
          local what = string.format("M=%d config %d static=%s", M, i, tostring(static))
          assert.equal(SKINNY, ll:explain(x, w).chosen, what)
          check_ref(ll:apply(x, w, nil, {out = poisoned_out(M, N)}), x, w, nil, what)
        end
      end
    end)
  end

  -- Every projection reads what the kernel just before it wrote: the previous projection's y,
  -- or an x that a conversion kernel (f32 -> bf16) rewrites just before the projection.
  it("projections chained through x, x rewritten by a kernel just before each", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local o = {dtype = "bf16", device = "cuda"}
    local w1, w2 = bf16({1536, 7168}, 1500), bf16({7168, 1536}, 1501)
    for i, cfg in ipairs(PDL_CONFIGS) do
      for _, static in ipairs({true, false}) do
        local ll = k3.method.low_latency(all_plan(cfg), {static_weights = static})
        for _, M in ipairs({1, 5, 16}) do
          local what = string.format("config %d static=%s M=%d", i, tostring(static), M)
          local src = k3.randn({M, 7168}, {dtype = "f32", device = "cuda", seed = 1510 + M})
          local x = k3.empty({M, 7168}, o)
          x:fill(0 / 0)
          x:copy(src) -- a conversion kernel writes x, then the projection reads it
          local y1 = ll:apply(x, w1, nil, {out = poisoned_out(M, 1536)})
          local y2 = ll:apply(y1, w2, nil, {residual = x, out = poisoned_out(M, 7168)})
          local src2 = k3.randn({M, 7168}, {dtype = "f32", device = "cuda", seed = 1520 + M})
          x:copy(src2)
          local y3 = ll:apply(x, w1, nil, {out = poisoned_out(M, 1536)})
          -- references from what each projection was given, read back afterwards
          check_rows(y1, src:to("bf16"), w1, nil, what .. " y1")
          check_rows(y2, y1, w2, src:to("bf16"), what .. " y2")
          check_rows(y3, src2:to("bf16"), w1, nil, what .. " y3")
        end
      end
    end
  end)

  -- The L2 prefetch (l2_prefetch_mb) only fills L2: every configuration kind gives the bits it
  -- gives without it, at budgets that cover a sliver of w and all of it (the per-row bytes
  -- capped at the CTA's share of K), and a w rewritten by a kernel just before the call (no
  -- static promise) is read as rewritten.
  it("l2_prefetch_mb: the bits of the same configuration without it, on every kind, w rewritten just before", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local o = {dtype = "bf16", device = "cuda"}
    local kinds = {}
    for _, c in ipairs(PDL_CONFIGS) do kinds[#kinds + 1] = c end
    kinds[#kinds + 1] = {threads = 512, rows = 16, unroll = 8, vec = 8, rows_per_warp = 16}
    for _, shape in ipairs({{1536, 7168}, {200, 4104}, {7168, 1536}}) do
      local N, K = shape[1], shape[2]
      local w = bf16({N, K}, 1600 + N)
      for i, cfg in ipairs(kinds) do
        local plain = k3.method.low_latency(all_plan(cfg), {static_weights = true})
        for _, mb in ipairs({1, 40}) do
          local c = {}
          for k, v in pairs(cfg) do c[k] = v end
          c.l2_prefetch_mb = mb
          local pf = k3.method.low_latency(all_plan(c), {static_weights = true})
          for _, M in ipairs({1, 9, 16}) do
            local what = string.format("%dx%d config %d l2_prefetch_mb=%d M=%d", N, K, i, mb, M)
            local x = bf16({M, K}, 1610 + M)
            assert.equal(SKINNY, pf:explain(x, w).chosen, what)
            local y = pf:apply(x, w, nil, {out = poisoned_out(M, N)})
            assert.equal(0, k3.max_abs_diff(y, plain:apply(x, w)), what .. ": differs without the prefetch")
            check_rows(y, x, w, nil, what)
          end
        end
      end
      w:free()
    end
    -- the silu_mul epilogue (gate | up rows of w, classic tiles; 1054 columns of h leave the
    -- last CTA's gate/up pairs partly past N)
    local cfg = {threads = 256, rows = 8, unroll = 4, vec = 8}
    local plain = k3.method.low_latency(all_plan(cfg), {static_weights = true})
    local pf = k3.method.low_latency(all_plan({threads = 256, rows = 8, unroll = 4, vec = 8, l2_prefetch_mb = 24}),
                                     {static_weights = true})
    for _, Nh in ipairs({1056, 1054}) do
      local we = bf16({2 * Nh, 7168}, 1650 + Nh)
      for _, M in ipairs({1, 16}) do
        local x = bf16({M, 7168}, 1660 + M)
        local h = pf:apply(x, we, nil, {epilogue = "silu_mul", out = poisoned_out(M, Nh)})
        assert.is_false(H.has_nan(h:to("cpu")), "epilogue: unwritten (NaN) outputs")
        assert.equal(0, k3.max_abs_diff(h, plain:apply(x, we, nil, {epilogue = "silu_mul"})),
                     "epilogue N=" .. Nh .. " M=" .. M .. ": differs without the prefetch")
      end
      we:free()
    end
    -- w rewritten by a conversion kernel just before each call, no static promise
    local ll = k3.method.low_latency(all_plan({threads = 256, rows = 8, unroll = 4, vec = 8, l2_prefetch_mb = 40}))
    local w = k3.empty({1536, 7168}, o)
    for round = 1, 2 do
      local src = k3.randn({1536, 7168}, {dtype = "f32", device = "cuda", seed = 1670 + round})
      w:copy(src)
      local x = bf16({4, 7168}, 1680 + round)
      check_rows(ll:apply(x, w, nil, {out = poisoned_out(4, 1536)}), x, src:to("bf16"), nil,
                 "w rewritten, round " .. round)
      src:free()
    end
    w:free()
  end)
end)

-- Static storage: the weights a low-latency method with static_weights (or a k3.nn layer) may
-- load before the previous kernel ends. Marked, a storage refuses every write, naming who
-- marked it, so the contract cannot be broken silently.
describe("static storage", function()
  it("refuses copy, fill, set and an op's out into any view of it, naming who marked it", function()
    local w = k3.randn({4, 8}, {dtype = "bf16", seed = 1})
    local before = w:totable()
    assert.is_false(w:is_static())
    assert.equal(w, w:mark_static("spec weights"))
    assert.is_true(w:is_static())
    local view = w:narrow(1, 2, 2)
    assert.is_true(view:is_static())
    local why = "is static (marked by spec weights); its storage refuses writes"
    H.raises(function() w:fill(0) end, "fill: the tensor " .. why)
    H.raises(function() view:set(1, 1, 3) end, "set: the tensor " .. why)
    H.raises(function() view:copy(k3.zeros({2, 8}, {dtype = "bf16"})) end, "copy: the destination " .. why)
    local x = k3.randn({2, 8}, {dtype = "bf16", seed = 2})
    H.raises(function() k3.linear(x, k3.randn({4, 8}, {dtype = "bf16"}), {out = w:narrow(2, 1, 4):narrow(1, 1, 2)}) end,
      "linear: out " .. why)
    assert.same(before, w:totable()) -- nothing was written
    -- reading it, and copying from it, still work; a copy is not static
    local c = w:clone()
    assert.is_false(c:is_static())
    c:fill(1)
    assert.equal(4, k3.linear(x, w):size(2))
    w:mark_static("someone else") -- marking again keeps the first owner
    H.raises(function() w:fill(0) end, "marked by spec weights")
    assert.equal(k3.randn({1}):mark_static():is_static(), true)
    H.raises(function() k3.zeros({1}):mark_static():fill(2) end, "fill: the tensor is static (marked by the caller)")
  end)

  it("a low-latency method with static_weights marks the weights it runs on; k3.nn.Linear marks its own #gpu", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local cfg = {threads = 256, rows = 8, unroll = 4, vec = 8}
    local w = bf16({264, 1024}, 1600)
    local x = bf16({2, 1024}, 1601)
    k3.method.low_latency(all_plan(cfg)):apply(x, w)
    assert.is_false(w:is_static()) -- no promise, no mark
    k3.method.low_latency(all_plan(cfg), {static_weights = true}):apply(x, w)
    assert.is_true(w:is_static())
    H.raises(function() w:copy(bf16({264, 1024}, 1602)) end,
      "copy: the destination is static (marked by method.low_latency {static_weights = true})")
    local w2 = bf16({1536, 7168}, 1603)
    local layer = require("k3.nn").Linear(w2)
    if k3.plan_for(w2) then
      assert.is_true(w2:is_static())
      H.raises(function() w2:fill(0) end, "marked by k3.nn.Linear weight")
    end
    check_rows(layer(bf16({1, 7168}, 1604)), bf16({1, 7168}, 1604), w2, nil, "k3.nn.Linear")
  end)
end)

describe("cuda.linear.batch_invariant #gpu", function()
  after_each(function() k3.set_batch_invariant(false) end)

  for _, dt in ipairs({"bf16", "f16", "f32"}) do
    it(dt .. ": rows equal across M = 1..16 and equal to cpu.linear.batch_invariant bit for bit", function()
      if not H.need_gpu(pending) or not need_kernel(BI) then return end
      if not k3.has_kernel("cpu.linear.batch_invariant") then
        pending("cpu.linear.batch_invariant is not registered")
        return
      end
      for _, s in ipairs({{37, 300}, {70, 4104}}) do
        local N, K = s[1], s[2]
        local o = {dtype = dt, device = "cuda"}
        -- x with padded rows (row stride K + 3): the kernel takes any row stride
        local x = H.padded(16, K, 3, {dtype = dt, device = "cuda", seed = 31})
        local w = k3.randn({N, K}, {dtype = dt, device = "cuda", seed = 32})
        local b = k3.randn({N}, {dtype = dt, device = "cuda", seed = 33})
        local r = k3.randn({16, N}, {dtype = dt, device = "cuda", seed = 34})
        local full = k3.linear(x, w, {bias = b, residual = r, kernel = BI, out = H.poisoned({16, N}, o)})
        local cpu = k3.linear(x:to("cpu"), w:to("cpu"), {bias = b:to("cpu"), residual = r:to("cpu"),
          kernel = "cpu.linear.batch_invariant"})
        assert.equal(0, k3.max_abs_diff(full:to("cpu"), cpu), string.format("%dx%d vs CPU", N, K))
        check_ref(full, x, w, r, string.format("%dx%d vs fp64", N, K), b)
        for M = 1, 16 do
          local y = k3.linear(x:narrow(1, 1, M), w, {bias = b, residual = r:narrow(1, 1, M), kernel = BI,
            out = H.poisoned({M, N}, o)})
          assert.equal(0, k3.max_abs_diff(y, full:narrow(1, 1, M)), string.format("%dx%d M=%d", N, K, M))
        end
      end
    end)
  end

  it("batch-invariant mode dispatches to it on a CUDA device", function()
    if not H.need_gpu(pending) or not need_kernel(BI) then return end
    local x, w = bf16({3, 64}, 1), bf16({24, 64}, 2)
    k3.set_batch_invariant(true)
    assert.equal(BI, k3.explain("linear", x, w).chosen)
    assert.equal(0, k3.max_abs_diff(k3.linear(x, w), k3.linear(x, w, {kernel = BI})))
  end)
end)

-- The silu_mul prologue (x [M, 2K] gate | up) on the GPU kernels: the skinny kernel computes
-- h = silu(gate) * up while it loads x, in every classic and split configuration, through
-- plans with static weights; the batch-invariant kernel where it loads x. Each must give the
-- bits of cuda.silu_mul.generic followed by the same kernel on h, match the fp64 reference,
-- and leave no poisoned output unwritten; what the skinny kernel cannot read it declines,
-- and the fallback (cuBLAS through a temporary, spec/cuda_linear_spec.lua) serves with the
-- same bits as silu_mul then cuBLAS.
describe("linear with prologue silu_mul on the GPU kernels #gpu", function()
  -- [M, 2K] bf16 gate | up on the device: gates ~ 3 N(0, 1), ups ~ N(0, 1).
  local function gate_up(M, K, seed, dt)
    local v = k3.randn({M, 2 * K}, {dtype = dt or "bf16", seed = seed, device = "cuda"})
    local g = v:narrow(2, 1, K)
    g:copy(g * 3)
    return v
  end
  -- The fp64 reference of the fused call: h = silu_mul(x) and the product in fp64 on the CPU
  -- (dgemm: the Kimi-K3 shapes at M = 16 are 500 M products).
  local function reference(x, w, bias, residual)
    local f = function(t) return t and t:to("cpu"):to("f64") or nil end
    return k3.linear(k3.silu_mul(f(x)), f(w), {bias = f(bias), residual = f(residual), kernel = "cpu.linear.blas"})
  end
  -- The fused call against silu_mul then the same call, bit for bit, and the fp64 reference
  -- (the h rounding to bf16 is inside the tolerance: |h| <~ 10).
  local function check_fused(fused, unfused, x, w, residual, what)
    assert.is_false(H.has_nan(fused:to("cpu")), what .. ": unwritten (NaN) outputs")
    assert.equal(0, k3.max_abs_diff(fused, unfused), what .. ": fused differs from silu_mul then linear")
    local f = function(t) return t and t:to("cpu"):to("f64") or nil end
    local ref = reference(x, w, nil, residual)
    local K = w:size(2)
    assert.is_true(k3.allclose(f(fused), ref, {atol = 4e-2 * math.sqrt(K), rtol = 2e-2}),
      string.format("%s: max |y - ref| = %g", what, k3.max_abs_diff(f(fused), ref)))
  end
  local function poisoned(M, N) return H.poisoned({M, N}, {dtype = "bf16", device = "cuda"}) end

  it("skinny, every classic configuration through plans with static weights, M = 1, 8, 9, 16", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 200, 4104 -- a partial last block of rows and a partial last chunk of k
    local w = bf16({N, K}, 1500)
    for _, c in ipairs(CONFIGS) do
      local config = {threads = c[1], rows = c[2], unroll = c[3], vec = 8}
      local ll = k3.method.low_latency(all_plan(config), {static_weights = true})
      for _, M in ipairs({1, 8, 9, 16}) do
        local x = gate_up(M, K, 1600 + M)
        local what = string.format("threads=%d rows=%d unroll=%d M=%d", c[1], c[2], c[3], M)
        assert.equal(SKINNY, ll:explain(x, w, nil, {prologue = "silu_mul"}).chosen, what)
        local fused = ll:apply(x, w, nil, {prologue = "silu_mul", out = poisoned(M, N)})
        local unfused = ll:apply(k3.silu_mul(x), w, nil, {out = poisoned(M, N)})
        check_fused(fused, unfused, x, w, nil, what)
      end
    end
  end)

  it("skinny at M = 1..16 on the down projection 7168x4224, with and without residual", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 7168, 4224
    local w = bf16({N, K}, 1700)
    for M = 1, 16 do
      local x = gate_up(M, K, 1710 + M)
      local r = bf16({M, N}, 1730 + M)
      local what = "7168x4224 M=" .. M
      local fused = k3.linear(x, w, {prologue = "silu_mul", kernel = SKINNY, out = poisoned(M, N)})
      check_fused(fused, k3.linear(k3.silu_mul(x), w, {kernel = SKINNY}), x, w, nil, what)
      local fr = k3.linear(x, w, {residual = r, prologue = "silu_mul", kernel = SKINNY, out = poisoned(M, N)})
      check_fused(fr, k3.linear(k3.silu_mul(x), w, {residual = r, kernel = SKINNY}), x, w, r, what .. " residual")
    end
  end)

  it("skinny, split-K across CTAs: every split configuration, M = 1, 7, 16, residual", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    for si, s in ipairs({{7168, 4224}, {131, 4104}}) do
      local N, K = s[1], s[2]
      local w = bf16({N, K}, 1800 + si)
      for _, c in ipairs(SPLIT_CONFIGS) do
        local ll = k3.method.low_latency(all_plan(split_config(c)), {static_weights = true})
        for _, M in ipairs({1, 7, 16}) do
          local x = gate_up(M, K, 1810 + M)
          local r = bf16({M, N}, 1820 + M)
          local what = string.format("%dx%d threads=%d rows=%d unroll=%d kcta=%d M=%d", N, K,
            c[1], c[2], c[3], c[4], M)
          assert.equal(SKINNY, ll:explain(x, w, nil, {prologue = "silu_mul"}).chosen, what)
          local fused = ll:apply(x, w, nil, {residual = r, prologue = "silu_mul", out = poisoned(M, N)})
          local unfused = ll:apply(k3.silu_mul(x), w, nil, {residual = r, out = poisoned(M, N)})
          check_fused(fused, unfused, x, w, r, what)
        end
      end
    end
  end)

  -- By default the skinny kernel takes a prologue's h from a temporary (the in-kernel path lost
  -- on the H200: notes/PERF.md); K3_SKINNY_PROLOGUE_MAX_M, read once per process, switches the
  -- in-kernel path on, so a child process checks its bits.
  it("the in-kernel prologues (K3_SKINNY_PROLOGUE_MAX_M=16, a child process): the bits of the separate ops", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    if os.getenv("K3_UNDER_SANITIZER") then return end -- a child process would share its log
    local out, code = H.sh("cd '" .. H.root() .. "' && K3_SKINNY_PROLOGUE_MAX_M=16 scripts/k3 spec/scripts/prologue_in_kernel.lua")
    assert.equal(0, code, out)
    assert.truthy(out:find("in%-kernel prologues: %d+ cases, 0 differ"), out)
  end)

  it("skinny with h above 48 KB of shared memory, and past the device's limit (through a temporary)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    -- K = 14336: h is 28.7 KB per token, so M = 4 opts in to 115 KB and M = 16 (459 KB) goes
    -- through cuda.silu_mul.generic into a temporary; the bits are the same every way.
    local N, K = 72, 14336
    local w = bf16({N, K}, 1950)
    for _, M in ipairs({1, 2, 4, 7, 16}) do
      local x = gate_up(M, K, 1960 + M)
      local what = "K=14336 M=" .. M
      local fused = k3.linear(x, w, {prologue = "silu_mul", kernel = SKINNY, out = poisoned(M, N)})
      check_fused(fused, k3.linear(k3.silu_mul(x), w, {kernel = SKINNY}), x, w, nil, what)
    end
  end)

  it("the gate's special values: silu(-inf) = 0, inf and NaN as cuda.silu_mul.generic writes them", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    -- Token t has gate g[t] at k = 1 (up 2) and gate 0 elsewhere (h = 0), K = 8; w's rows are
    -- e_1, so y[t, n] = h[t, 1] exactly (no inf * 0 in the sums).
    local K = 8
    local g = {-math.huge, math.huge, 0 / 0, -1e30, -90, 0, 1, 88}
    local rows = {}
    for t = 1, #g do
      rows[t] = {}
      for k = 1, K do rows[t][k] = k == 1 and g[t] or 0; rows[t][K + k] = k == 1 and 2 or 1 end
    end
    local x = k3.tensor(rows, {dtype = "bf16"}):to("cuda")
    local e1 = {}
    for n = 1, 4 do
      e1[n] = {}
      for k = 1, K do e1[n][k] = k == 1 and 1 or 0 end
    end
    local w = k3.tensor(e1, {dtype = "bf16"}):to("cuda")
    local h = k3.silu_mul(x):to("cpu")
    assert.equal(0, h:get(1, 1))
    assert.equal(math.huge, h:get(2, 1))
    for _, kernel in ipairs({SKINNY, BI, CUBLAS}) do
      if k3.has_kernel(kernel) then
        local y = k3.linear(x, w, {prologue = "silu_mul", kernel = kernel}):to("cpu")
        for t = 1, #g do
          for n = 1, 4 do
            local a, b = y:get(t, n), h:get(t, 1)
            if b ~= b then
              assert.is_true(a ~= a, string.format("%s t=%d n=%d", kernel, t, n))
            else
              assert.equal(b, a, string.format("%s t=%d n=%d", kernel, t, n))
            end
          end
        end
      end
    end
  end)

  it("skinny declines what it cannot read, and the fallback gives silu_mul then cuBLAS's bits", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 96, 128
    local w = bf16({N, K}, 1900)
    local ll = k3.method.low_latency(all_plan(), {static_weights = true})
    local padded = H.padded(3, 2 * K, 8, {dtype = "bf16", device = "cuda"})
    padded:copy(gate_up(3, K, 1901))
    local odd = bf16({3 * 2 * K + 1}, 1902):narrow(1, 2, 3 * 2 * K):view({3, 2 * K})
    local cases = {
      {padded, string.format("x is not packed row-major: strides [%d, 1] for shape [3, %d], needs [%d, 1]",
        2 * K + 8, 2 * K, 2 * K)},
      {odd, "x is not 16-byte aligned"},
      {gate_up(17, K, 1903), "plan has no entry for M = 17"},
    }
    for _, case in ipairs(cases) do
      local x = case[1]
      local e = ll:explain(x, w, nil, {prologue = "silu_mul"})
      assert.equal(CUBLAS, e.chosen, case[2])
      local reason = skinny_decline(e)
      assert.truthy(reason and reason:find(case[2], 1, true), tostring(reason))
      local M = x:size(1)
      local fused = ll:apply(x, w, nil, {prologue = "silu_mul", out = poisoned(M, N)})
      check_fused(fused, k3.linear(k3.silu_mul(x), w, {kernel = CUBLAS}), x, w, nil, case[2])
    end
    -- called directly, the kernel fails loud and names the strides
    H.raises(function() k3.linear(padded, w, {prologue = "silu_mul", kernel = SKINNY}) end,
      string.format("x is not packed row-major: strides [%d, 1]", 2 * K + 8))
  end)

  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it("cuda.linear.batch_invariant " .. dt .. ": fused equals silu_mul then the kernel; rows equal across M", function()
      if not H.need_gpu(pending) or not need_kernel(BI) then return end
      local o = {dtype = dt, device = "cuda"}
      for _, s in ipairs({{37, 300}, {70, 4104}}) do
        local N, K = s[1], s[2]
        -- x with padded rows (row stride 2K + 3): the kernel takes any row stride
        local x = H.padded(16, 2 * K, 3, o)
        x:copy(gate_up(16, K, 2100 + K, dt))
        local w = k3.randn({N, K}, {dtype = dt, device = "cuda", seed = 2101})
        local b = k3.randn({N}, {dtype = dt, device = "cuda", seed = 2102})
        local full = k3.linear(x, w, {bias = b, prologue = "silu_mul", kernel = BI, out = H.poisoned({16, N}, o)})
        assert.is_false(H.has_nan(full:to("cpu")))
        assert.equal(0, k3.max_abs_diff(full, k3.linear(k3.silu_mul(x), w, {bias = b, kernel = BI})),
          string.format("%dx%d fused vs silu_mul then the kernel", N, K))
        for _, M in ipairs({1, 2, 7, 16}) do
          local y = k3.linear(x:narrow(1, 1, M), w, {bias = b, prologue = "silu_mul", kernel = BI,
            out = H.poisoned({M, N}, o)})
          assert.equal(0, k3.max_abs_diff(y, full:narrow(1, 1, M)), string.format("%dx%d M=%d", N, K, M))
        end
      end
    end)
  end
end)

-- The rms_norm prologue on the GPU kernels: the skinny kernel computes each token's row scale in
-- cuda.rms_norm.generic's reduction order and h = x r norm_weight into shared memory, reading x
-- through its row stride (the stack's q_b reads a narrow of the qkv_a output, stride 2112);
-- rows whose sum of squares overflows or underflows take rms_norm's rescaled pass. Each must give
-- the bits of cuda.rms_norm.generic then the same kernel; what the kernel cannot load 16 bytes
-- at a time (a misaligned x, an f32 norm weight) goes through a temporary with the same bits.
describe("linear with prologue rms_norm on the GPU kernels #gpu", function()
  -- [M, K] bf16 rows of a wider [M, K + pad] tensor, values ~ scale N(0, 1).
  local function rows(M, K, pad, seed, scale)
    local base = k3.randn({M, K + pad}, {dtype = "f32", seed = seed, device = "cuda"})
    if scale then base = base * scale end
    return base:to("bf16"):narrow(2, 1, K)
  end
  local function norm_weight(K, seed, dt)
    return (k3.randn({K}, {seed = seed, device = "cuda"}) * 0.1 + 1):to(dt or "bf16")
  end
  local function poisoned(M, N) return H.poisoned({M, N}, {dtype = "bf16", device = "cuda"}) end
  local function check(fused, unfused, x, nw, eps, w, what)
    assert.is_false(H.has_nan(fused:to("cpu")), what .. ": unwritten (NaN) outputs")
    assert.equal(0, k3.max_abs_diff(fused, unfused), what .. ": fused differs from rms_norm then linear")
    local f = function(t) return t:to("cpu"):to("f64") end
    local ref = k3.linear(k3.rms_norm(f(x), f(nw), eps), f(w), {kernel = "cpu.linear.blas"})
    local K = w:size(2)
    assert.is_true(k3.allclose(f(fused), ref, {atol = 4e-2 * math.sqrt(K), rtol = 2e-2}),
      string.format("%s: max |y - ref| = %g", what, k3.max_abs_diff(f(fused), ref)))
  end

  it("skinny on the q_b shape 2304x1536, x a narrow of [M, 2112], M = 1..16, plain and static-weight plans", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 2304, 1536
    local w = bf16({N, K}, 2200)
    local nw = norm_weight(K, 2201)
    local ll = k3.method.low_latency(all_plan(), {static_weights = true})
    for M = 1, 16 do
      local x = rows(M, K, 2112 - K, 2210 + M)
      assert.same({2112, 1}, x:stride())
      local what = "2304x1536 M=" .. M
      local opts = {prologue = "rms_norm", norm_weight = nw, eps = 1e-5}
      assert.equal(SKINNY, ll:explain(x, w, nil, opts).chosen, what)
      local unfused = k3.linear(k3.rms_norm(x, nw, 1e-5), w, {kernel = SKINNY})
      check(ll:apply(x, w, nil, {prologue = "rms_norm", norm_weight = nw, eps = 1e-5, out = poisoned(M, N)}),
        unfused, x, nw, 1e-5, w, what)
      check(k3.linear(x, w, {prologue = "rms_norm", norm_weight = nw, eps = 1e-5, kernel = SKINNY,
        out = poisoned(M, N)}), unfused, x, nw, 1e-5, w, what .. " direct")
    end
  end)

  it("skinny, every classic and split configuration and two on the balanced grid, K = 1536 and 4104", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    for _, K in ipairs({1536, 4104}) do
      local N = 200
      local w = bf16({N, K}, 2300 + K)
      local nw = norm_weight(K, 2301)
      local configs = {}
      for _, c in ipairs(CONFIGS) do configs[#configs + 1] = {threads = c[1], rows = c[2], unroll = c[3], vec = 8} end
      for _, c in ipairs(SPLIT_CONFIGS) do configs[#configs + 1] = split_config(c) end
      -- the balanced grid: h through a temporary
      configs[#configs + 1] = balanced_config({256, 8, 4})
      configs[#configs + 1] = balanced_config({512, 16, 8}, 16)
      for _, config in ipairs(configs) do
        local ll = k3.method.low_latency(all_plan(config), {static_weights = true})
        for _, M in ipairs({1, 9, 16}) do
          local x = rows(M, K, 8, 2310 + M)
          local what = string.format("K=%d threads=%d rows=%d unroll=%d split_k=%s balanced=%s M=%d", K,
            config.threads, config.rows, config.unroll, tostring(config.split_k), tostring(config.balanced), M)
          local fused = ll:apply(x, w, nil, {prologue = "rms_norm", norm_weight = nw, eps = 1e-5, out = poisoned(M, N)})
          check(fused, ll:apply(k3.rms_norm(x, nw, 1e-5), w), x, nw, 1e-5, w, what)
        end
      end
    end
  end)

  it("rows whose sum of squares overflows (|x| ~ 1e30) or underflows (|x| ~ 1e-30, eps = 0)", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 64, 1536
    local w = bf16({N, K}, 2400)
    local nw = norm_weight(K, 2401)
    for _, case in ipairs({{1e30, 1e-5}, {1e-30, 0}, {1e-30, 1e-5}, {1, 0}}) do
      for _, M in ipairs({1, 3, 16}) do
        local x = rows(M, K, 576, 2410 + M, case[1])
        local what = string.format("scale %g eps %g M=%d", case[1], case[2], M)
        local fused = k3.linear(x, w, {prologue = "rms_norm", norm_weight = nw, eps = case[2], kernel = SKINNY,
          out = poisoned(M, N)})
        check(fused, k3.linear(k3.rms_norm(x, nw, case[2]), w, {kernel = SKINNY}), x, nw, case[2], w, what)
      end
    end
  end)

  it("through a temporary: x misaligned, an f32 norm weight; cuBLAS and the batch-invariant kernel", function()
    if not H.need_gpu(pending) or not need_kernel(SKINNY) then return end
    local N, K = 96, 256
    local w = bf16({N, K}, 2500)
    local nw, nw32 = norm_weight(K, 2501), norm_weight(K, 2502, "f32")
    local M = 5
    local odd = rows(M, K + 1, 7, 2503):narrow(2, 2, K) -- offset 1: not 16-byte aligned
    local x = rows(M, K, 0, 2504)
    local cases = {{odd, nw, SKINNY}, {x, nw32, SKINNY}, {x, nw, CUBLAS}, {odd, nw32, CUBLAS}, {x, nw, BI}, {odd, nw32, BI}}
    for i, c in ipairs(cases) do
      if k3.has_kernel(c[3]) then
        local what = string.format("case %d %s", i, c[3])
        local fused = k3.linear(c[1], w, {prologue = "rms_norm", norm_weight = c[2], eps = 1e-5, kernel = c[3],
          out = poisoned(M, N)})
        check(fused, k3.linear(k3.rms_norm(c[1], c[2], 1e-5), w, {kernel = c[3]}), c[1], c[2], 1e-5, w, what)
      end
    end
  end)
end)
