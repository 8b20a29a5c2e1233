-- Linear methods: the default method, and the low-latency method's fallback path driven with
-- real inputs (no mocks): the method looks M up in its plan, the planned kernel's own
-- supports() (or dispatch, for a kernel absent here or on another device) declines, and the
-- owned default serves the call. The skinny kernel's own reasons, one spec each, are in
-- skinny_spec.lua (they need a GPU).
local k3 = require "k3"
local H = require "spec.helpers"

local K, N, M = 64, 24, 3
local function bf16(shape, seed, device)
  return k3.randn(shape, {dtype = "bf16", seed = seed, device = device})
end

-- The first decline of a method's explain (the planned kernel's, or the plan lookup's).
local function first_decline(m, x, w, bias)
  local e = m:explain(x, w, bias)
  return e.declined[1], e
end

-- Why dispatch passes over the planned CUDA kernel for CPU tensors: it is not registered here,
-- or it runs on another device.
local function cpu_reason()
  return H.cuda_absent_reason() or "tensors are on cpu"
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
    assert.same({kernel = "cuda.linear.skinny", reason = "plan has no entry for M = 3"}, d)
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
    assert.equal("plan has no entry for M = 3", t[1].declined[1].reason)
  end)

  local plan = {[M] = {kernel = "skinny", config = {threads = 128}}}
  local cases = {
    {"a bias", function() return bf16({M, K}, 1), bf16({N, K}, 2), bf16({N}, 3) end},
    {"batch-invariant mode", function()
       k3.set_batch_invariant(true)
       return bf16({M, K}, 1), bf16({N, K}, 2)
     end, "batch-invariant mode is on"},
    {"a strided x", function() return H.padded(M, K, 7, {dtype = "bf16", seed = 1}), bf16({N, K}, 2) end},
    {"a strided w", function() return bf16({M, K}, 1), H.padded(N, K, 3, {dtype = "bf16", seed = 2}) end},
    {"a transposed x", function() return bf16({K, M}, 1):t(), bf16({N, K}, 2) end},
    {"an f32 x", function() return k3.randn({M, K}), k3.randn({N, K}) end},
    {"CPU tensors", function() return bf16({M, K}, 1), bf16({N, K}, 2) end},
  }
  for _, case in ipairs(cases) do
    it("a planned M with " .. case[1] .. ": the kernel is passed over and the owned default serves the call", function()
      local x, w, bias = case[2]()
      local ll = k3.method.low_latency(plan)
      local d, e = first_decline(ll, x, w, bias)
      -- batch-invariant mode passes over any plan (dispatch's rule); otherwise, on CPU tensors,
      -- the CUDA kernel is absent here or runs on another device
      assert.same({kernel = "cuda.linear.skinny", reason = case[3] or cpu_reason()}, d)
      local y = ll:apply(x, w, bias)
      assert.equal(0, k3.max_abs_diff(y, k3.linear(x, w, {bias = bias})))
      assert.equal(k3.explain("linear", x, w, {bias = bias}).chosen, e.chosen)
    end)
  end

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
    -- the plan has M: no decline of the method's own; dispatch's prologue refused the call
    -- before asking any kernel, so there are no others
    assert.same({}, e.declined)
    local ok, err = pcall(ll.apply, ll, x, w)
    assert.is_false(ok)
    assert.equal("linear: x dim 2 (7) must match w dim 2 (8)", e.error)
    assert.equal(err, e.error)
    -- the other refusals answer the same way; an M without a plan entry keeps that decline
    e = ll:explain(x, bf16({N, 7}, 2), bf16({N + 1}, 3))
    assert.same({}, e.declined)
    assert.equal("linear: bias must be [N] = [24] (w dim 1); got [25]", e.error)
    e = ll:explain(bf16({M + 1, 7}, 1), w)
    assert.same({{kernel = "cuda.linear.skinny", reason = "plan has no entry for M = 4"}}, e.declined)
    assert.equal("linear: x dim 2 (7) must match w dim 2 (8)", e.error)
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
    H.raises(function() k3.method.low_latency({[3] = {kernel = "skinny", config = {rows_per_warp = 12}}}) end,
      "method.low_latency: plan entry for M = 3 has rows_per_warp 12; expected 8, 16 or 32")
    -- 8, 16 and 32 are accepted (what a machine runs is the kernel's own decision)
    for _, rpw in ipairs({8, 16, 32}) do
      k3.method.low_latency({[1] = {kernel = "skinny", config = {rows = 16, rows_per_warp = rpw}}}):free()
    end
    H.raises(function() k3.method.low_latency({[5] = {kernel = "skinny", config = {balanced = 0}}}) end,
      "bad argument #1 to 'low_latency' (field 'balanced' must be a boolean; got number)")
    H.raises(function() k3.method.low_latency({[5] = {kernel = "skinny", config = {balanced = {}}}}) end,
      "field 'balanced' must be a boolean; got table")
    -- true and false are accepted, with either rows_per_warp (the kernel's supports() says
    -- which configurations it runs on that grid)
    for _, bal in ipairs({true, false}) do
      for _, rpw in ipairs({8, 16, 32}) do
        k3.method.low_latency({[1] = {kernel = "skinny", config = {rows = 16, rows_per_warp = rpw, balanced = bal}}}):free()
      end
    end
    -- the L2 prefetch budget: 0..40 MiB
    for _, mb in ipairs({0, 1, 40}) do
      k3.method.low_latency({[1] = {kernel = "skinny", config = {l2_prefetch_mb = mb}}}):free()
    end
    for _, bad in ipairs({41, -5}) do
      H.raises(function() k3.method.low_latency({[4] = {kernel = "skinny", config = {l2_prefetch_mb = bad}}}) end,
        "method.low_latency: plan entry for M = 4 has l2_prefetch_mb " .. bad .. "; expected 0..40")
    end
    -- a value no int holds, in any integer field, is reported as written (never cast to another)
    for _, f in ipairs({"threads", "rows", "unroll", "vec", "split_k", "rows_per_warp", "l2_prefetch_mb"}) do
      for _, big in ipairs({1 << 40, -(1 << 40), (1 << 32) + 256}) do
        H.raises(function() k3.method.low_latency({[4] = {kernel = "skinny", config = {[f] = big}}}) end,
          string.format("method.low_latency: plan entry for M = 4 has %s %d; expected an int", f, big))
      end
    end
    H.raises(function() k3.method.low_latency({[4] = {kernel = "skinny", config = {l2_prefetch_mb = 1.5}}}) end,
      "field 'l2_prefetch_mb' must be an integer")
  end)

  it("a freed method and freed inputs raise", function()
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({M, K}, 1), bf16({N, K}, 2)
    x:free()
    H.raises(function() ll:apply(x, w) end, "tensor has been freed")
    assert.truthy(tostring(ll):find("^k3%.Method: 0x%x+$"), tostring(ll))
    ll:free()
    ll:free() -- twice is harmless
    assert.equal("k3.Method (freed)", tostring(ll))
    H.raises(function() ll:apply(bf16({M, K}, 1), w) end,
      "calling 'apply' on bad self (method has been freed)")
  end)
end)

describe("method.low_latency on a GPU #gpu", function()
  local plan = {[1] = {kernel = "skinny"}, [2] = {kernel = "skinny"}}

  it("x and w on different devices: refused before any kernel is asked", function()
    if not H.need_gpu(pending) then return end
    -- dispatch's prologue raises linear's own device error; explain answers with it and no
    -- declines (no kernel was asked)
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({1, K}, 1, "cuda"), bf16({N, K}, 2)
    H.raises(function() ll:apply(x, w) end, "linear: w device (cpu) must match x device (cuda:0)")
    local e = ll:explain(x, w)
    assert.is_nil(e.chosen)
    assert.same({}, e.declined)
    assert.equal("linear: w device (cpu) must match x device (cuda:0)", e.error)
  end)

  it("K mismatch: refused before any kernel is asked", function()
    if not H.need_gpu(pending) then return end
    local ll = k3.method.low_latency(plan)
    local x, w = bf16({1, 7}, 1, "cuda"), bf16({N, 8}, 2, "cuda")
    -- the call raises linear's own error, so no trace records it; explain answers with that
    -- error instead of raising
    H.raises(function() ll:apply(x, w) end, "linear: x dim 2 (7) must match w dim 2 (8)")
    local e = ll:explain(x, w)
    assert.is_nil(e.chosen)
    assert.same({}, e.declined)
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
    assert.truthy(out:find("not registered in this build (disabled by K3_DISABLE_KERNELS)\ncuda.linear.cublas", 1, true), out)
  end)
end)

describe("method.low_latency plans", function()
  it("a plan entry made by a proxy table's __index stays alive through the method's construction", function()
    local entry = setmetatable({}, {__index = function(_, k)
      if k == "kernel" then return ("skin" .. "ny") end
    end})
    local m = k3.method.low_latency({[1] = entry})
    collectgarbage()
    assert.same({{4, 4}}, m:apply(k3.ones({1, 4}), k3.ones({2, 4})):totable())
  end)
end)
