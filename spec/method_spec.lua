-- Linear methods: the default method, and the low-latency method's fallback path driven with
-- real inputs (no mocks): one spec per decline reason, each with an input that causes it.
local k3 = require "k3"
local H = require "spec.helpers"

local K, N, M = 64, 24, 3
local function bf16(shape, seed, device)
  return k3.randn(shape, {dtype = "bf16", seed = seed, device = device})
end

-- The first decline of a method's explain (the low-latency check's reason).
local function first_decline(m, x, w, bias)
  local e = m:explain(x, w, bias)
  return e.declined[1], e
end

describe("method.default", function()
  it("returns exactly what k3.linear returns, with the same decision", function()
    local x, w, bias = bf16({M, K}, 1), bf16({N, K}, 2), bf16({N}, 3)
    local m = k3.method.default()
    assert.equal(0, k3.max_abs_diff(m:apply(x, w, bias), k3.linear(x, w, {bias = bias})))
    assert.same(k3.explain("linear", x, w, {bias = bias}), m:explain(x, w, bias))
  end)

  it("takes residual and out in its options", function()
    local x, w, r = bf16({M, K}, 1), bf16({N, K}, 2), bf16({M, N}, 4)
    local out = H.poisoned({M, N}, {dtype = "bf16"})
    local m = k3.method.default()
    local y = m:apply(x, w, nil, {residual = r, out = out})
    assert.is_false(H.has_nan(out))
    assert.equal(0, k3.max_abs_diff(y, k3.linear(x, w, {residual = r})))
  end)
end)

describe("method.low_latency fallback (CPU, real inputs)", function()
  after_each(function() k3.set_batch_invariant(false) end)

  it("an empty plan on CPU tensors returns exactly the default's and k3.linear's result", function()
    local x, w = bf16({M, K}, 1), bf16({N, K}, 2)
    local ll, dm = k3.method.low_latency({}), k3.method.default()
    local y = ll:apply(x, w)
    assert.equal(0, k3.max_abs_diff(y, dm:apply(x, w)))
    assert.equal(0, k3.max_abs_diff(y, k3.linear(x, w)))
    local d, e = first_decline(ll, x, w)
    assert.same({kernel = "cuda.linear.skinny", reason = "x is on cpu, not a CUDA device"}, d)
    assert.equal(k3.explain("linear", x, w).chosen, e.chosen)
    -- then the default's own decision, in order
    local de = k3.explain("linear", x, w)
    for i, dd in ipairs(de.declined) do assert.same(dd, e.declined[i + 1]) end
  end)

  it("trace records the decline and the default's kernel", function()
    local x, w = bf16({M, K}, 1), bf16({N, K}, 2)
    local ll = k3.method.low_latency({})
    local t = k3.trace(function() ll:apply(x, w) end)
    assert.equal(1, #t)
    assert.equal("linear", t[1].op)
    assert.equal("cpu.linear.blas", t[1].kernel)
    assert.equal("x is on cpu, not a CUDA device", t[1].declined[1].reason)
  end)

  local plan = {[M] = {kernel = "skinny", config = {threads = 128}}}
  local cases = {
    {"bias is present", function() return bf16({M, K}, 1), bf16({N, K}, 2), bf16({N}, 3) end,
     "bias is present"},
    {"batch-invariant mode is on", function()
       k3.set_batch_invariant(true)
       return bf16({M, K}, 1), bf16({N, K}, 2)
     end, "batch-invariant mode is on"},
    {"strided x", function() return H.padded(M, K, 7, {dtype = "bf16", seed = 1}), bf16({N, K}, 2) end,
     "x is not packed row-major: strides [71, 1], expected [64, 1]"},
    {"strided w", function() return bf16({M, K}, 1), H.padded(N, K, 3, {dtype = "bf16", seed = 2}) end,
     "w is not packed row-major: strides [67, 1], expected [64, 1]"},
    {"transposed x", function() return bf16({K, M}, 1):t(), bf16({N, K}, 2) end,
     "x is not packed row-major: strides [1, 3], expected [64, 1]"},
    {"f32 x", function() return k3.randn({M, K}), k3.randn({N, K}) end, "x is not bf16 (f32)"},
    {"CPU device", function() return bf16({M, K}, 1), bf16({N, K}, 2) end, "x is on cpu, not a CUDA device"},
  }
  for _, case in ipairs(cases) do
    it("declines: " .. case[1] .. ", and the owned default serves the call", function()
      local x, w, bias = case[2]()
      local ll = k3.method.low_latency(plan)
      local d, e = first_decline(ll, x, w, bias)
      assert.same({kernel = "cuda.linear.skinny", reason = case[3]}, d)
      local y = ll:apply(x, w, bias)
      assert.equal(0, k3.max_abs_diff(y, k3.linear(x, w, {bias = bias})))
      assert.equal(k3.explain("linear", x, w, {bias = bias}).chosen, e.chosen)
    end)
  end

  it("a 1-row x with a stride other than K is not packed (strides checked, not is_contiguous)", function()
    local x = H.padded(1, K, 5, {dtype = "bf16", seed = 1})
    assert.is_true(x:is_contiguous())
    local d = first_decline(k3.method.low_latency(plan), x, bf16({N, K}, 2))
    assert.equal("x is not packed row-major: strides [69, 1], expected [64, 1]", d.reason)
  end)

  it("K mismatch on CPU: the owned default raises linear's own error", function()
    local ll = k3.method.low_latency(plan)
    H.raises(function() ll:apply(bf16({M, 7}, 1), bf16({N, 8}, 2)) end,
      "linear: x dim 2 (7) must match w dim 2 (8)")
  end)

  it("K mismatch on CPU: explain answers (chosen nil, the declines, apply's error) instead of raising", function()
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({M, 7}, 1), bf16({N, 8}, 2)
    local e = ll:explain(x, w)
    assert.is_nil(e.chosen)
    assert.equal("linear", e.op)
    -- the low-latency check stops at the device (before K): the CPU reason is the decline;
    -- dispatch never ran, so there are no others
    assert.same({{kernel = "cuda.linear.skinny", reason = "x is on cpu, not a CUDA device"}}, e.declined)
    local ok, err = pcall(ll.apply, ll, x, w)
    assert.is_false(ok)
    assert.equal("linear: x dim 2 (7) must match w dim 2 (8)", e.error)
    assert.equal(err, e.error)
    -- the other refusals answer the same way, with the low-latency reason they hit first
    e = ll:explain(x, bf16({N, 7}, 2), bf16({N + 1}, 3))
    assert.same({{kernel = "cuda.linear.skinny", reason = "bias is present"}}, e.declined)
    assert.equal("linear: bias must be [N] = [24] (w dim 1); got [25]", e.error)
    -- a default method has no declines of its own; k3.explain still raises on invalid arguments
    e = k3.method.default():explain(x, w)
    assert.is_nil(e.chosen)
    assert.same({}, e.declined)
    assert.equal("linear: x dim 2 (7) must match w dim 2 (8)", e.error)
    H.raises(function() k3.explain("linear", x, w) end, "linear: x dim 2 (7) must match w dim 2 (8)")
    -- a failed apply records nothing in a trace (the trace holds dispatches that ran)
    local t = k3.trace(function() pcall(ll.apply, ll, x, w) end)
    assert.same({}, t)
  end)

  it("validates its plan", function()
    H.raises(function() k3.method.low_latency({[17] = {kernel = "skinny"}}) end,
      "method.low_latency: plan M must be in 1..16; got 17")
    H.raises(function() k3.method.low_latency({[2] = {kernel = "cpu.rms_norm.reference"}}) end,
      "method.low_latency: plan entry for M = 2 names 'cpu.rms_norm.reference', not a known linear kernel")
    H.raises(function() k3.method.low_latency({[2] = {kernel = "turbo"}}) end,
      "method.low_latency: plan entry for M = 2 names 'turbo', not a known linear kernel")
    H.raises(function() k3.method.low_latency({[2] = {kernel = "skinny", config = {threads = -1}}}) end,
      "method.low_latency: plan entry for M = 2 has a negative config value")
  end)

  it("a freed method and freed inputs raise", function()
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({M, K}, 1), bf16({N, K}, 2)
    x:free()
    H.raises(function() ll:apply(x, w) end, "tensor has been freed")
    ll:free()
    ll:free() -- twice is harmless
    H.raises(function() ll:apply(bf16({M, K}, 1), w) end, "method has been freed")
  end)
end)

describe("method.low_latency on a GPU #gpu", function()
  local plan = {[1] = {kernel = "skinny"}, [2] = {kernel = "skinny"}}

  it("declines: x and w on different devices", function()
    if not H.need_gpu(pending) then return end
    -- the method declines; its owned default then raises linear's own device error, and
    -- explain answers with the decline and that error
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({1, K}, 1, "cuda"), bf16({N, K}, 2)
    H.raises(function() ll:apply(x, w) end, "linear: w device (cpu) must match x device (cuda:0)")
    local e = ll:explain(x, w)
    assert.is_nil(e.chosen)
    assert.same({{kernel = "cuda.linear.skinny", reason = "x and w are on different devices (cuda:0, cpu)"}},
                e.declined)
    assert.equal("linear: w device (cpu) must match x device (cuda:0)", e.error)
  end)

  it("declines: K mismatch", function()
    if not H.need_gpu(pending) then return end
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({1, 7}, 1, "cuda"), bf16({N, 8}, 2, "cuda")
    -- the default then raises linear's own error, so no trace records the call; explain
    -- answers with the decline reason and that error instead of raising
    H.raises(function() ll:apply(x, w) end, "linear: x dim 2 (7) must match w dim 2 (8)")
    local e = ll:explain(x, w)
    assert.is_nil(e.chosen)
    assert.same({{kernel = "cuda.linear.skinny", reason = "K mismatch: x dim 2 (7), w dim 2 (8)"}}, e.declined)
    assert.equal("linear: x dim 2 (7) must match w dim 2 (8)", e.error)
  end)

  it("declines: plan has no entry for M", function()
    if not H.need_gpu(pending) then return end
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({3, K}, 1, "cuda"), bf16({N, K}, 2, "cuda")
    local d, e = first_decline(ll, x, w)
    assert.same({kernel = "cuda.linear.skinny", reason = "plan has no entry for M = 3"}, d)
    assert.equal(k3.explain("linear", x, w).chosen, e.chosen)
    assert.equal(0, k3.max_abs_diff(ll:apply(x, w), k3.linear(x, w)))
  end)

  it("runs the skinny kernel for a planned M", function()
    if not H.need_gpu(pending) then return end
    if not k3.has_kernel("cuda.linear.skinny") then
      pending("cuda.linear.skinny is not registered in this build")
      return
    end
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({2, K}, 1, "cuda"), bf16({N, K}, 2, "cuda")
    local e = ll:explain(x, w)
    assert.equal("cuda.linear.skinny", e.chosen)
    local ref = k3.linear(x:to("cpu"):to("f64"), w:to("cpu"):to("f64"), {kernel = "cpu.linear.reference"})
    assert.is_true(k3.allclose(ll:apply(x, w):to("cpu"):to("f64"), ref, {atol = 2e-2, rtol = 2e-2}))
  end)

  it("declines: kernel not registered (K3_DISABLE_KERNELS)", function()
    if not H.need_gpu(pending) then return end
    local p = io.popen([[K3_DISABLE_KERNELS=cuda.linear.skinny scripts/k3 -e '
      local ll = k3.method.low_latency({[1] = {kernel = "skinny"}})
      local x = k3.randn({1, 64}, {dtype = "bf16", device = "cuda"})
      local w = k3.randn({24, 64}, {dtype = "bf16", device = "cuda"})
      local e = ll:explain(x, w)
      print(e.declined[1].reason)
      print(e.chosen)' 2>&1]])
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("kernel cuda.linear.skinny is not registered\ncuda.linear.cublas", 1, true), out)
  end)
end)
