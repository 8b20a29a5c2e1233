-- cuda.linear.skinny_ring on a GPU (the bulk-copy ring decode GEMM, plan-only): correctness
-- against the fp64 reference for every instantiated configuration at 1 and 2 CTAs per SM
-- (N not a multiple of the tile, K with a partial last chunk, tiles split between CTAs),
-- M = 1..16, outputs poisoned with NaN; ones·ones = K exactly; the residual with strided
-- residual and out; re-launch determinism; PDL with and without static weights in a chain
-- where a kernel rewrites x just before the projection; views ending at the last element of
-- their storage; and every decline reason, with the fallback's result equal to cuBLAS's.
local k3 = require "k3"
local H = require "spec.helpers"

local RING, CUBLAS = "cuda.linear.skinny_ring", "cuda.linear.cublas"

local function need_ring()
  if not H.need_gpu(pending) then return false end
  if not k3.has_kernel(RING) then
    pending(RING .. " is not registered in this build")
    return false
  end
  return true
end

-- Every instantiated configuration (kernels/linear_skinny_ring.cuh, K3_RING_CONFIGS):
-- {threads, rows, stages, k per stage}.
local CONFIGS = {{160, 16, 3, 1024}, {160, 16, 2, 1024}, {160, 32, 2, 1024}, {288, 32, 2, 1024},
  {160, 16, 4, 512}, {160, 32, 3, 512}, {96, 16, 2, 2048}}

-- Shared memory of one CTA at M tokens (k3_ring_smem_bytes) and whether it fits an sm90 SM
-- (227 KB per block, opt-in).
local function fits(c, M)
  local consumers = c[1] // 32 - 1
  local head = c[3] * 16 + 16 + consumers * 4 * (M > 8 and 2 or 1) * 32 * 4
  head = (head + 127) // 128 * 128
  return head + c[3] * (c[2] + M) * (2 * c[4] + 64) <= 227 * 1024
end

local function config(c, cps)
  return {threads = c[1], rows = c[2], unroll = c[3], vec = 8, split_k = cps}
end

local function all_plan(cfg)
  local plan = {}
  for m = 1, 16 do plan[m] = {kernel = RING, config = cfg} end
  return plan
end

local o = {dtype = "bf16", device = "cuda"}
local function bf16(shape, seed) return k3.randn(shape, {dtype = "bf16", seed = seed, device = "cuda"}) end
local function poisoned(M, N) return H.poisoned({M, N}, o) end

-- y against the fp64 reference of x w^T (+ residual) on the CPU, within bf16 tolerance.
local function check_ref(y, x, w, residual, what)
  local f = function(t) return t and t:to("cpu"):to("f64") or nil end
  local ref = k3.linear(f(x), f(w), {residual = f(residual), kernel = "cpu.linear.reference"})
  local K = x:size(2)
  local y64 = f(y)
  assert.is_false(H.has_nan(y64), what .. ": unwritten (NaN) outputs")
  assert.is_true(k3.allclose(y64, ref, {atol = 1e-2 * math.sqrt(K), rtol = 1e-2}),
    string.format("%s: max |y - ref| = %g", what, k3.max_abs_diff(y64, ref)))
end


local function ring_decline(e)
  for _, d in ipairs(e.declined) do
    if d.kernel == RING then return d.reason end
  end
  return nil
end

describe("cuda.linear.skinny_ring #gpu", function()
  it("every configuration at 1 and 2 CTAs per SM matches the fp64 reference (M = 1, 8, 9, 16)", function()
    if not need_ring() then return end
    -- 131 rows: partial last tile for every tile height; K = 4128 = 16 chunks of 256 + 32;
    -- 2304x1536 and 7168x768 are Kimi-K3 shapes (many small CTAs, tiles split between them)
    for si, s in ipairs({{131, 4128}, {2304, 1536}, {7168, 768}}) do
      local N, K = s[1], s[2]
      local w = bf16({N, K}, 100 + si)
      for _, c in ipairs(CONFIGS) do
        for _, cps in ipairs({1, 2}) do
          local ll = k3.method.low_latency(all_plan(config(c, cps)))
          for _, M in ipairs({1, 8, 9, 16}) do
            local x = bf16({M, K}, 200 + M)
            local what = string.format("%dx%d threads=%d rows=%d stages=%d cps=%d M=%d", N, K,
              c[1], c[2], c[3], cps, M)
            local e = ll:explain(x, w)
            if fits(c, M) then
              assert.equal(RING, e.chosen, what)
            else -- declined, named, and served by the fallback
              assert.equal(CUBLAS, e.chosen, what)
              assert.truthy(tostring(ring_decline(e)):find("bytes of shared memory per CTA at M = " .. M, 1, true),
                tostring(ring_decline(e)))
            end
            check_ref(ll:apply(x, w, nil, {out = poisoned(M, N)}), x, w, nil, what)
          end
        end
      end
      w:free()
    end
  end)

  it("matches the fp64 reference at M = 1..16 for three shapes (the default configuration)", function()
    if not need_ring() then return end
    for i, s in ipairs({{1536, 7168}, {264, 5120}, {7168, 3072}}) do
      local N, K = s[1], s[2]
      local w = bf16({N, K}, 300 + i)
      for M = 1, 16 do
        local x = bf16({M, K}, 400 + M)
        check_ref(k3.linear(x, w, {kernel = RING, out = poisoned(M, N)}), x, w, nil,
          string.format("%dx%d M=%d", N, K, M))
      end
      w:free()
    end
  end)

  it("ones · ones = K exactly (K = 5120, 7168), with tiles summed across CTAs", function()
    if not need_ring() then return end
    for _, K in ipairs({5120, 7168}) do
      local want = k3.full({1}, K, {dtype = "bf16"}):get(1)
      for _, c in ipairs({CONFIGS[1], CONFIGS[6]}) do
        local ll = k3.method.low_latency(all_plan(config(c, 2)))
        for _, M in ipairs({1, 16}) do
          local x = k3.ones({M, K}, o)
          local w = k3.ones({40, K}, o)
          local y = ll:apply(x, w, nil, {out = poisoned(M, 40)}):to("cpu")
          for i = 1, M do
            for n = 1, 40 do
              assert.equal(want, y:get(i, n), string.format("K=%d rows=%d M=%d [%d,%d]", K, c[2], M, i, n))
            end
          end
        end
      end
    end
  end)

  it("residual in the same pass; strided residual and out; nothing written outside out", function()
    if not need_ring() then return end
    local N, K = 136, 5120
    local w = bf16({N, K}, 700)
    for _, M in ipairs({1, 7, 16}) do
      local x = bf16({M, K}, 710 + M)
      local r = bf16({M, N}, 720 + M)
      check_ref(k3.linear(x, w, {kernel = RING, residual = r, out = poisoned(M, N)}), x, w, r,
        string.format("residual M=%d", M))
      local rp = H.padded(M, N, 8, {dtype = "bf16", device = "cuda", seed = 730 + M})
      local base = H.poisoned({M, N + 8}, o)
      local out = base:narrow(2, 1, N)
      k3.linear(x, w, {kernel = RING, residual = rp, out = out})
      check_ref(out, x, w, rp, string.format("padded residual/out M=%d", M))
      for _, row in ipairs(base:narrow(2, N + 1, 8):to("cpu"):totable()) do
        for _, v in ipairs(row) do assert.is_true(v ~= v, "the padding of out was written") end
      end
    end
  end)

  it("re-launched three times gives identical results (counters reset)", function()
    if not need_ring() then return end
    local N, K = 1536, 7168
    local w = bf16({N, K}, 900)
    for _, M in ipairs({1, 9}) do
      local x, r = bf16({M, K}, 910 + M), bf16({M, N}, 920 + M)
      for _, c in ipairs({CONFIGS[1], CONFIGS[3], CONFIGS[6]}) do
        local ll = k3.method.low_latency(all_plan(config(c, 2)))
        local y1 = ll:apply(x, w, nil, {residual = r, out = poisoned(M, N)})
        local y2 = ll:apply(x, w, nil, {residual = r, out = poisoned(M, N)})
        local y3 = ll:apply(x, w, nil, {residual = r, out = poisoned(M, N)})
        local what = string.format("threads=%d rows=%d M=%d", c[1], c[2], M)
        assert.equal(0, k3.max_abs_diff(y1, y2), what .. ": second launch differs")
        assert.equal(0, k3.max_abs_diff(y1, y3), what .. ": third launch differs")
        check_ref(y3, x, w, r, what)
      end
    end
  end)
end)

describe("cuda.linear.skinny_ring with PDL and static weights #gpu", function()
  -- Nothing past the end of x or w is read (compute-sanitizer memcheck reports any read beyond).
  for _, M in ipairs({1, 4}) do
    it("x and w views ending at the last element of their storage (M = " .. M .. ")", function()
      if not need_ring() then return end
      local N, K = 136, 4128
      local x = bf16({8 + M * K}, 1400 + M):narrow(1, 9, M * K):view({M, K})
      local w = bf16({8 + N * K}, 1410):narrow(1, 9, N * K):view({N, K})
      for _, c in ipairs({CONFIGS[1], CONFIGS[6]}) do
        for _, static in ipairs({true, false}) do
          local ll = k3.method.low_latency(all_plan(config(c, 2)), {static_weights = static})
          for _ = 1, 2 do -- the first static call marks w and waits; the second copies early
            check_ref(ll:apply(x, w, nil, {out = poisoned(M, N)}), x, w, nil,
              string.format("M=%d rows=%d static=%s", M, c[2], tostring(static)))
          end
        end
      end
    end)
  end

  it("projections chained through x, x rewritten by a kernel just before each", function()
    if not need_ring() then return end
    local w1, w2 = bf16({1536, 7168}, 1500), bf16({7168, 1536}, 1501)
    for _, c in ipairs({CONFIGS[4], CONFIGS[6]}) do
      for _, static in ipairs({true, false}) do
        local ll = k3.method.low_latency(all_plan(config(c, 2)), {static_weights = static})
        for _, M in ipairs({1, 5, 16}) do
          local what = string.format("rows=%d static=%s M=%d", c[2], tostring(static), M)
          local src = k3.randn({M, 7168}, {dtype = "f32", device = "cuda", seed = 1510 + M})
          local x = k3.empty({M, 7168}, o)
          x:fill(0 / 0)
          x:copy(src) -- a conversion kernel writes x, then the projection reads it
          local y1 = ll:apply(x, w1, nil, {out = poisoned(M, 1536)})
          local y2 = ll:apply(y1, w2, nil, {residual = x, out = poisoned(M, 7168)})
          local src2 = k3.randn({M, 7168}, {dtype = "f32", device = "cuda", seed = 1520 + M})
          x:copy(src2)
          local y3 = ll:apply(x, w1, nil, {out = poisoned(M, 1536)})
          check_ref(y1, src:to("bf16"), w1, nil, what .. " y1")
          check_ref(y2, y1, w2, src:to("bf16"), what .. " y2")
          check_ref(y3, src2:to("bf16"), w1, nil, what .. " y3")
        end
      end
    end
  end)
end)

-- The decline reasons, each with a real input, answered by the method's fully built default.
describe("cuda.linear.skinny_ring declines, and the fallback serves #gpu", function()
  local N, K = 96, 256
  after_each(function() k3.set_batch_invariant(false) end)

  local function declines(x, w, bias, text, plan, chosen)
    local ll = k3.method.low_latency(plan or all_plan(), {static_weights = true})
    local e = ll:explain(x, w, bias)
    local reason = ring_decline(e)
    assert.truthy(reason, "no decline recorded for " .. RING)
    assert.truthy(reason:find(text, 1, true), string.format("%q does not contain %q", reason, text))
    assert.equal(chosen or CUBLAS, e.chosen)
    local y = ll:apply(x, w, bias)
    assert.equal(0, k3.max_abs_diff(y, k3.linear(x, w, {bias = bias, kernel = chosen or CUBLAS})))
  end

  it("bias", function()
    if not need_ring() then return end
    declines(bf16({2, K}, 1), bf16({N, K}, 2), bf16({N}, 3), "bias is present")
  end)

  it("batch-invariant mode", function()
    if not need_ring() or not k3.has_kernel("cuda.linear.batch_invariant") then return end
    k3.set_batch_invariant(true)
    declines(bf16({2, K}, 1), bf16({N, K}, 2), nil, "batch-invariant mode is on", nil,
      "cuda.linear.batch_invariant")
  end)

  it("f32", function()
    if not need_ring() then return end
    declines(k3.randn({2, K}, {device = "cuda", seed = 1}), k3.randn({N, K}, {device = "cuda", seed = 2}),
      nil, "x is not bf16 (f32)")
  end)

  it("strided x and strided w", function()
    if not need_ring() then return end
    local x = bf16({2, K + 32}, 4):narrow(2, 1, K)
    declines(x, bf16({N, K}, 5), nil, "x is not packed row-major: strides [288, 1]")
    local w = bf16({N, K + 32}, 6):narrow(2, 1, K)
    declines(bf16({2, K}, 7), w, nil, "w is not packed row-major: strides [288, 1]")
  end)

  it("K not a multiple of 32, and a K mismatch", function()
    if not need_ring() then return end
    declines(bf16({3, 4104}, 8), bf16({N, 4104}, 9), nil,
      "K = 4104 is not a positive multiple of 32 (the MMA k-step)")
    H.raises(function() k3.linear(bf16({3, 4104}, 8), bf16({N, 4104}, 9), {kernel = RING}) end,
      "K = 4104 is not a positive multiple of 32")
    local ll = k3.method.low_latency(all_plan())
    local x, w = bf16({1, 7000}, 10), bf16({N, 7168}, 11)
    H.raises(function() ll:apply(x, w) end, "linear: x dim 2 (7000) must match w dim 2 (7168)")
    H.raises(function() k3.linear(x, w, {kernel = RING}) end, "x dim 2 (7000) must match w dim 2 (7168)")
  end)

  it("M = 17 (the plan has no entry; direct calls raise)", function()
    if not need_ring() then return end
    local x, w = bf16({17, K}, 12), bf16({N, K}, 13)
    local ll = k3.method.low_latency(all_plan())
    local e = ll:explain(x, w)
    assert.equal(CUBLAS, e.chosen)
    assert.equal(0, k3.max_abs_diff(ll:apply(x, w), k3.linear(x, w, {kernel = CUBLAS})))
    H.raises(function() k3.linear(x, w, {kernel = RING}) end, "M = 17 is outside 1..16")
  end)

  it("a configuration that is not instantiated", function()
    if not need_ring() then return end
    local x, w = bf16({2, K}, 14), bf16({N, K}, 15)
    declines(x, w, nil, "config {threads = 160, rows = 8, unroll (stages) = 4, vec = 8, split_k (CTAs per SM) = 1} is not instantiated",
      all_plan({threads = 160, rows = 8, unroll = 4, vec = 8, split_k = 1}))
    declines(x, w, nil, "split_k (CTAs per SM) = 5} is not instantiated",
      all_plan({threads = 160, rows = 16, unroll = 3, vec = 8, split_k = 5}))
  end)

  it("kernel disabled (K3_DISABLE_KERNELS): the fallback result equals cuBLAS's", function()
    if not H.need_gpu(pending) then return end
    local out = H.sh([[K3_DISABLE_KERNELS=cuda.linear.skinny_ring scripts/k3 -e '
      local ll = k3.method.low_latency({[1] = {kernel = "cuda.linear.skinny_ring"}})
      local x = k3.randn({1, 256}, {dtype = "bf16", device = "cuda", seed = 1})
      local w = k3.randn({96, 256}, {dtype = "bf16", device = "cuda", seed = 2})
      local e = ll:explain(x, w)
      print(e.declined[1].reason)
      print(e.chosen)
      print(k3.max_abs_diff(ll:apply(x, w), k3.linear(x, w, {kernel = "cuda.linear.cublas"})))
      print(tostring(k3.has_kernel("cuda.linear.skinny_ring")))']])
    local absent = "not registered in this build (disabled by K3_DISABLE_KERNELS)\ncuda.linear.cublas\n"
    assert.truthy(out:find(absent .. "0.0\nfalse", 1, true) or out:find(absent .. "0\nfalse", 1, true), out)
  end)
end)
