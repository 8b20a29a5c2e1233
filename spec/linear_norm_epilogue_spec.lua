-- The linear's rms_norm epilogue (k3.linear(x, w, {epilogue = "rms_norm", norm_weight = nw,
-- eps = e}), nw [C], 1 <= C <= N): on every kernel the result is y [M, N] = the plain linear's
-- bits with its first C columns replaced by k3.rms_norm(y[:, :C], nw, e), written into
-- NaN-poisoned outputs, across shapes (C = 1, C = N, C not a multiple of 8), dtypes, strided
-- views, with a bias, a residual and a prologue; it matches the fp64 reference; every refused
-- argument names itself. The GPU cases (#gpu) run the skinny kernel's norm tail (the last CTA
-- of the normalised columns computes the norm in the same launch) through plans on classic
-- tiles and the balanced grid, rows_per_warp 8 and 16, repeated calls and a CUDA graph, and the
-- paths after the product (split-K across CTAs, C % 8 != 0, a padded out, an f32 norm weight,
-- cuBLAS, the batch-invariant kernel).
local k3 = require "k3"
local H = require "spec.helpers"

local CPU_KERNELS = {"cpu.linear.blas", "cpu.linear.reference", "cpu.linear.batch_invariant"}
local DTYPES = {"f32", "f64", "bf16", "f16"}
-- {M, N, K, C}
local SHAPES = {{1, 8, 16, 8}, {3, 12, 9, 1}, {4, 33, 40, 20}, {2, 5, 7, 5}, {5, 64, 64, 48}}

-- Bitwise equality of two tensors of one dtype: no NaN in the fused result (the poison was
-- overwritten) and no element differs.
local function same_bits(fused, unfused, what)
  assert.is_false(H.has_nan(fused), what .. ": unwritten (NaN) outputs")
  assert.are.same(unfused:size(), fused:size(), what .. ": shape")
  assert.equal(0, k3.max_abs_diff(fused, unfused), what .. ": fused differs from linear then rms_norm")
end

-- What the fused call must write: y with rms_norm over its first C columns (y is changed).
local function unfused(y, nw, eps)
  local C = nw:size(1)
  y:narrow(2, 1, C):copy(k3.rms_norm(y:narrow(2, 1, C), nw, eps))
  return y
end

-- A norm weight near 1 (as a layernorm's), C of them.
local function norm_weight(C, dtype, seed, device)
  local r = k3.randn({C}, {seed = seed})
  local t = (r * 0.1 + 1):to(dtype)
  return device and t:to(device) or t
end

describe("linear epilogue rms_norm on the CPU kernels", function()
  for _, kernel in ipairs(CPU_KERNELS) do
    for _, dtype in ipairs(DTYPES) do
      it(kernel .. " " .. dtype .. ": the bits of linear then rms_norm over the first C columns, with and without bias and residual", function()
        for i, s in ipairs(SHAPES) do
          local M, N, K, C = s[1], s[2], s[3], s[4]
          local x = k3.randn({M, K}, {dtype = dtype, seed = 10 * i})
          local w = k3.randn({N, K}, {dtype = dtype, seed = 10 * i + 1})
          local nw = norm_weight(C, dtype, 10 * i + 2)
          local b = k3.randn({N}, {dtype = dtype, seed = 10 * i + 3})
          local r = k3.randn({M, N}, {dtype = dtype, seed = 10 * i + 4})
          for _, extra in ipairs({{}, {bias = b}, {residual = r}, {bias = b, residual = r}}) do
            local what = string.format("%s %s M=%d N=%d K=%d C=%d%s%s", kernel, dtype, M, N, K, C,
              extra.bias and " bias" or "", extra.residual and " residual" or "")
            local out = H.poisoned({M, N}, {dtype = dtype})
            local y = k3.linear(x, w, {bias = extra.bias, residual = extra.residual, epilogue = "rms_norm",
                                       norm_weight = nw, eps = 1e-6, kernel = kernel, out = out})
            assert.is_true(rawequal(y, out), what .. ": the result is out")
            local plain = k3.linear(x, w, {bias = extra.bias, residual = extra.residual, kernel = kernel})
            same_bits(out, unfused(plain, nw, 1e-6), what)
          end
        end
      end)
    end
  end

  it("the default kernel, a new result tensor and the default eps (1e-5)", function()
    local x, w = k3.randn({3, 16}, {dtype = "bf16", seed = 50}), k3.randn({24, 16}, {dtype = "bf16", seed = 51})
    local nw = norm_weight(16, "bf16", 52)
    local y = k3.linear(x, w, {epilogue = "rms_norm", norm_weight = nw})
    assert.are.same({3, 24}, y:size())
    assert.equal("bf16", y:dtype())
    same_bits(y, unfused(k3.linear(x, w), nw, 1e-5), "default kernel")
  end)

  it("a norm weight of another dtype, strided x and w views, a strided out", function()
    local M, N, K, C = 4, 20, 24, 12
    for _, dtype in ipairs({"f32", "bf16"}) do
      local nw32 = norm_weight(C, "f32", 60)
      local cases = {
        {"x transposed", k3.randn({K, M}, {dtype = dtype, seed = 61}):t(), k3.randn({N, K}, {dtype = dtype, seed = 62})},
        {"w transposed", k3.randn({M, K}, {dtype = dtype, seed = 63}), k3.randn({K, N}, {dtype = dtype, seed = 64}):t()},
        {"padded rows", H.padded(M, K, 5, {dtype = dtype, seed = 65}), H.padded(N, K, 3, {dtype = dtype, seed = 66})},
      }
      for _, c in ipairs(cases) do
        for _, kernel in ipairs(CPU_KERNELS) do
          local what = dtype .. " " .. c[1] .. " " .. kernel
          local out = H.poisoned({M, N + 7}, {dtype = dtype}):narrow(2, 1, N) -- rows N + 7 apart
          k3.linear(c[2], c[3], {epilogue = "rms_norm", norm_weight = nw32, eps = 1e-6, kernel = kernel, out = out})
          same_bits(out, unfused(k3.linear(c[2], c[3], {kernel = kernel}), nw32, 1e-6), what)
        end
      end
    end
  end)

  it("matches the fp64 reference (plain-Lua RMSNorm of the fp64 product) within the usual tolerance", function()
    local tol = {f32 = 1e-5, bf16 = 3e-2, f16 = 4e-3, f64 = 1e-12}
    for _, dtype in ipairs(DTYPES) do
      local M, N, K, C = 5, 30, 72, 24
      local x, w = k3.randn({M, K}, {dtype = dtype, seed = 70}), k3.randn({N, K}, {dtype = dtype, seed = 71})
      local nw = norm_weight(C, dtype, 72)
      local y = k3.linear(x, w, {epilogue = "rms_norm", norm_weight = nw, eps = 1e-5}):to("f64"):totable()
      local y64t = k3.linear(x:to("f64"), w:to("f64"), {kernel = "cpu.linear.reference"})
      local y64, normed = y64t:totable(), H.rms_norm_f64(y64t:narrow(2, 1, C), nw, 1e-5)
      local worst = 0
      for i = 1, M do
        for j = 1, N do
          local want = j <= C and normed[i][j] or y64[i][j]
          local d = math.abs(y[i][j] - want) / (1 + math.abs(want))
          if d > worst then worst = d end
        end
      end
      assert.is_true(worst <= tol[dtype], string.format("%s: max relative error %g", dtype, worst))
    end
  end)

  it("with a prologue: the prologue's h, the product, then the norm (the bits of the three ops)", function()
    for _, kernel in ipairs(CPU_KERNELS) do
      local M, N, K, C = 3, 10, 16, 8
      local xg = k3.randn({M, 2 * K}, {dtype = "bf16", seed = 80})
      local w = k3.randn({N, K}, {dtype = "bf16", seed = 81})
      local nw = norm_weight(C, "bf16", 82)
      local out = H.poisoned({M, N}, {dtype = "bf16"})
      k3.linear(xg, w, {prologue = "silu_mul", epilogue = "rms_norm", norm_weight = nw, kernel = kernel, out = out})
      same_bits(out, unfused(k3.linear(k3.silu_mul(xg), w, {kernel = kernel}), nw, 1e-5), kernel .. " silu_mul prologue")
    end
  end)

  it("through methods (m:apply, m:explain) and nn.Linear", function()
    local x, w = k3.randn({4, 32}, {dtype = "bf16", seed = 90}), k3.randn({40, 32}, {dtype = "bf16", seed = 91})
    local nw = norm_weight(24, "bf16", 92)
    local opts = {epilogue = "rms_norm", norm_weight = nw, eps = 1e-6}
    local m = k3.method.default()
    local e = m:explain(x, w, nil, opts)
    assert.equal("cpu.linear.blas", e.chosen)
    local out = H.poisoned({4, 40}, {dtype = "bf16"})
    m:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw, eps = 1e-6, out = out})
    same_bits(out, unfused(m:apply(x, w), nw, 1e-6), "m:apply")
    local lin = k3.nn.Linear(w)
    same_bits(lin(x, opts), unfused(lin(x), nw, 1e-6), "nn.Linear")
  end)

  it("the kimi-k3 attention stand-in normalises q_a in qkv_a's epilogue: the bits of the separate norm", function()
    local kimi = require "k3.model.kimi_k3"
    local cfg = kimi.config("tiny")
    local weights = kimi.generate_weights(cfg, {seed = 5})
    local stack = kimi.build(cfg, weights)
    local attn = stack.layers[1].attn
    local h = kimi.embedding(cfg, 3, {seed = 5})
    local a = attn.qkv_a(h)
    local qa = k3.rms_norm(a:narrow(2, 1, cfg.q_lora_rank), attn.q_a_norm, cfg.eps)
    local qb = attn.q_b(qa)
    local hd = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    local v = qb:view({3, cfg.num_heads, hd}):narrow(3, 1, cfg.v_head_dim):contiguous():view({3, -1})
    same_bits(attn(h), attn.o_proj(v), "Attention")
    local calls = k3.trace(function() attn(h) end)
    local ops = {}
    for _, c in ipairs(calls) do ops[#ops + 1] = c.op end
    assert.are.same({"linear", "linear", "linear"}, ops)
  end)

  it("refuses what it cannot compute, naming the argument, the expected and the actual values", function()
    local x, w = k3.randn({3, 5}), k3.randn({6, 5})
    local nw = k3.ones({4})
    H.raises_exact(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = k3.ones({7})}) end,
      "linear: norm_weight must be [C] with 1 <= C <= N = 6 (w dim 1) for epilogue rms_norm; got [7]")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = k3.ones({0})}) end,
      "linear: norm_weight must be [C] with 1 <= C <= N = 6 (w dim 1) for epilogue rms_norm; got [0]")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = k3.ones({2, 2})}) end,
      "linear: norm_weight must be [C] with 1 <= C <= N = 6 (w dim 1) for epilogue rms_norm; got [2, 2]")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "rms_norm"}) end, "linear: norm_weight is required")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = nw, eps = -1}) end,
      "linear: eps must be a finite number >= 0; got -1")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = nw, eps = 0 / 0}) end,
      "linear: eps must be a finite number >= 0; got nan")
    H.raises_exact(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = nw, out = k3.zeros({3, 4})}) end,
      "linear: out must be [3, 6]; got [3, 4]")
    H.raises(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = nw, out = k3.zeros({6, 3}):t()}) end,
      "linear: out must have unit stride in its last dim")
    H.raises(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = k3.ones({4, 2}):narrow(2, 1, 1):squeeze(2)}) end,
      "linear: norm_weight must have unit stride in its last dim")
    H.raises(function() k3.linear(x, w, {prologue = "rms_norm", epilogue = "rms_norm", norm_weight = k3.ones({5})}) end,
      "(prologue \"rms_norm\" and epilogue \"rms_norm\" in one call would share field 'norm_weight'; run one of the norms as k3.rms_norm)")
    H.raises(function() k3.linear(x, w, {epilogue = "layernorm"}) end,
      "(field 'epilogue' must be \"silu_mul\", \"rms_norm\" or nil; got \"layernorm\")")
    -- the out of the call is out itself when given: it may not overlap the norm weight
    local buf = k3.zeros({3, 6})
    H.raises(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = buf:view({18}):narrow(1, 1, 4), out = buf}) end,
      "linear: out overlaps norm_weight")
    -- nothing was written into out on a refusal
    local out = H.poisoned({3, 6})
    H.raises(function() k3.linear(x, w, {epilogue = "rms_norm", norm_weight = k3.ones({9}), out = out}) end, "1 <= C <= N")
    assert.is_true(H.has_nan(out))
  end)
end)

-- ---- the GPU kernels ---------------------------------------------------------------------------

local SKINNY, CUBLAS, BI = "cuda.linear.skinny", "cuda.linear.cublas", "cuda.linear.batch_invariant"

-- Classic tiles and the balanced grid (the norm tail in the kernel), rows_per_warp 8 and 16,
-- and one split-K-across-CTAs configuration (kcta = 2: after the product).
local GPU_CONFIGS = {
  {threads = 256, rows = 8, unroll = 4, vec = 8},
  {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16, balanced = true},
  {threads = 512, rows = 32, unroll = 4, vec = 8},
  {threads = 512, rows = 16, unroll = 4, vec = 8, split_k = 16, rows_per_warp = 16},
  {threads = 256, rows = 32, unroll = 4, vec = 8, rows_per_warp = 16, balanced = true},
  {threads = 256, rows = 8, unroll = 4, vec = 8, split_k = 16}, -- kcta = 2
}

describe("linear epilogue rms_norm on the GPU kernels #gpu", function()
  local function dev(shape, seed, dtype)
    return k3.randn(shape, {dtype = dtype or "bf16", seed = seed, device = "cuda"})
  end
  local function poisoned(M, N, dtype) return H.poisoned({M, N}, {dtype = dtype or "bf16", device = "cuda"}) end
  local function cpu_unfused(y, nw, eps)
    return unfused(y:to("cpu"), nw:to("cpu"), eps)
  end

  it("skinny through plans with static weights: the norm tail on classic tiles and the balanced grid (rows_per_warp 8, 16), split-K after the product; M = 1, 2, 8, 9, 16", function()
    if not H.need_gpu(pending) or not k3.has_kernel(SKINNY) then return end
    -- {N, K, C}: the stack's qkv_a (q_a 1536 of 2112), C = N, C = 8 (one CTA's rows), a C
    -- that ends inside a CTA's rows, K with a partial last chunk
    for si, s in ipairs({{2112, 7168, 1536}, {264, 4104, 264}, {200, 1024, 8}, {300, 520, 136}}) do
      local N, K, C = s[1], s[2], s[3]
      local w = dev({N, K}, 3000 + si)
      local nw = norm_weight(C, "bf16", 3010 + si, "cuda")
      for _, config in ipairs(GPU_CONFIGS) do
        local ll = k3.method.low_latency(H.skinny_plan(config), {static_weights = true})
        for _, M in ipairs({1, 2, 8, 9, 16}) do
          local x = dev({M, K}, 3100 + M)
          local what = string.format("N=%d K=%d C=%d threads=%d rows=%d split_k=%s rpw=%s balanced=%s M=%d",
            N, K, C, config.threads, config.rows, tostring(config.split_k), tostring(config.rows_per_warp),
            tostring(config.balanced), M)
          local opts = {epilogue = "rms_norm", norm_weight = nw, eps = 1e-5}
          assert.equal(SKINNY, ll:explain(x, w, nil, opts).chosen, what)
          local y = ll:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw, eps = 1e-5, out = poisoned(M, N)})
          same_bits(y:to("cpu"), cpu_unfused(ll:apply(x, w), nw, 1e-5), what)
        end
      end
    end
  end)

  it("repeated calls, split-K calls between them and a CUDA graph: the tail's counter is left at zero", function()
    if not H.need_gpu(pending) or not k3.has_kernel(SKINNY) then return end
    local N, K, C = 2112, 7168, 1536
    local w = dev({N, K}, 3200)
    local nw = norm_weight(C, "bf16", 3201, "cuda")
    local tail = k3.method.low_latency(H.skinny_plan(GPU_CONFIGS[2]), {static_weights = true})
    local split = k3.method.low_latency(H.skinny_plan(GPU_CONFIGS[6]), {static_weights = true})
    local opts = {epilogue = "rms_norm", norm_weight = nw, eps = 1e-5}
    for rep = 1, 4 do
      local x = dev({1, K}, 3210 + rep)
      local y = tail:apply(x, w, nil, opts)
      same_bits(y:to("cpu"), cpu_unfused(tail:apply(x, w), nw, 1e-5), "repeat " .. rep)
      split:apply(x, w) -- uses the split tiles' counters
    end
    local x = dev({1, K}, 3220)
    local out = poisoned(1, N)
    tail:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw, eps = 1e-5, out = out}) -- counter allocated
    local g = k3.cuda_graph(function()
      tail:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw, eps = 1e-5, out = out})
      tail:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw, eps = 1e-5, out = out})
    end)
    for rep = 1, 3 do
      x:copy(dev({1, K}, 3230 + rep))
      out:fill(0 / 0)
      g:replay()
      same_bits(out:to("cpu"), cpu_unfused(tail:apply(x, w), nw, 1e-5), "graph replay " .. rep)
    end
    g:free()
  end)

  it("after the product where the tail does not apply: C % 8 != 0, a padded out, an f32 norm weight", function()
    if not H.need_gpu(pending) or not k3.has_kernel(SKINNY) then return end
    local N, K = 264, 1024
    local w = dev({N, K}, 3300)
    local ll = k3.method.low_latency(H.skinny_plan(GPU_CONFIGS[1]), {static_weights = true})
    for _, M in ipairs({1, 9}) do
      local x = dev({M, K}, 3310 + M)
      local plain = ll:apply(x, w)
      local nw5 = norm_weight(5, "bf16", 3320, "cuda")
      local y = ll:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw5, out = poisoned(M, N)})
      same_bits(y:to("cpu"), cpu_unfused(plain, nw5, 1e-5), "C = 5, M = " .. M)
      local nw = norm_weight(64, "bf16", 3321, "cuda")
      local padded = H.poisoned({M, N + 3}, {dtype = "bf16", device = "cuda"}):narrow(2, 1, N)
      ll:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw, out = padded})
      same_bits(padded:to("cpu"), cpu_unfused(plain, nw, 1e-5), "padded out, M = " .. M)
      local nw32 = norm_weight(64, "f32", 3322, "cuda")
      local y32 = ll:apply(x, w, nil, {epilogue = "rms_norm", norm_weight = nw32, out = poisoned(M, N)})
      same_bits(y32:to("cpu"), cpu_unfused(plain, nw32, 1e-5), "f32 norm weight, M = " .. M)
    end
  end)

  it("q_b reads the normalised columns in place: x rows 2112 apart on the skinny kernel", function()
    if not H.need_gpu(pending) or not k3.has_kernel(SKINNY) then return end
    local wa, wb = dev({2112, 7168}, 3400), dev({2304, 1536}, 3401)
    local nw = norm_weight(1536, "bf16", 3402, "cuda")
    local lla = k3.method.low_latency(H.skinny_plan(GPU_CONFIGS[2]), {static_weights = true})
    for _, config in ipairs({GPU_CONFIGS[1], GPU_CONFIGS[4], GPU_CONFIGS[6]}) do
      local llb = k3.method.low_latency(H.skinny_plan(config), {static_weights = true})
      for _, M in ipairs({1, 2, 16}) do
        local a = lla:apply(dev({M, 7168}, 3410 + M), wa, nil, {epilogue = "rms_norm", norm_weight = nw})
        local qa = a:narrow(2, 1, 1536)
        local what = string.format("q_b threads=%d rows=%d M=%d", config.threads, config.rows, M)
        assert.equal(SKINNY, llb:explain(qa, wb).chosen, what)
        same_bits(llb:apply(qa, wb, nil, {out = poisoned(M, 2304)}):to("cpu"), llb:apply(qa:contiguous(), wb):to("cpu"), what)
      end
    end
    -- a row stride that is not a whole number of 16-byte vectors is the skinny kernel's layout error
    local x = H.poisoned({2, 1539}, {dtype = "bf16", device = "cuda"}):narrow(2, 1, 1536)
    H.raises(function() k3.linear(x, wb, {kernel = SKINNY}) end,
      "x's row stride must be a multiple of 8 elements (16-byte rows) with unit stride along K: strides [1539, 1] for shape [2, 1536]")
  end)

  it("cuBLAS and the batch-invariant kernel: the product, then the norm over out's first C columns", function()
    if not H.need_gpu(pending) then return end
    for _, dtype in ipairs({"bf16", "f32"}) do
      local N, K, C = 37, 264, 20
      local w = dev({N, K}, 3500, dtype)
      local b = dev({N}, 3501, dtype)
      local nw = norm_weight(C, dtype, 3502, "cuda")
      for _, M in ipairs({1, 9, 16}) do
        local x = dev({M, K}, 3510 + M, dtype)
        for _, kernel in ipairs({CUBLAS, BI}) do
          if k3.has_kernel(kernel) then
            local what = string.format("%s %s M=%d", kernel, dtype, M)
            local y = k3.linear(x, w, {bias = kernel == CUBLAS and b or nil, epilogue = "rms_norm", norm_weight = nw,
                                       kernel = kernel, out = poisoned(M, N, dtype)})
            local plain = k3.linear(x, w, {bias = kernel == CUBLAS and b or nil, kernel = kernel})
            same_bits(y:to("cpu"), cpu_unfused(plain, nw, 1e-5), what)
          end
        end
      end
    end
  end)
end)
