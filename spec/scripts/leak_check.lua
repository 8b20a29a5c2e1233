-- For `valgrind --leak-check=full` (`make leak-check`, run by scripts/leak-check; README:
-- "Reliability"): creates, views, copies, prints and frees tensors; runs every op (linear,
-- rms_norm, silu_mul, attn_res), the linear methods (default and low-latency: apply and
-- explain), k3.explain, k3.trace and k3.set_policy; and each of those again failing inside
-- pcall (bad shapes, bad options, a bad plan or policy, an error inside a trace), so a binding
-- that allocated temporaries and then raised shows up as a leak (m:explain answers instead of
-- raising: its refusal is checked as an answer), and the tensor ops (abs ... max, cat, stack,
-- arange, linspace, equal) with their refusals. Ends with a full collection so every handle
-- is gone.
local k3 = require "k3"

-- fails(fn, ...): fn(...) must raise (a case that stopped failing would stop guarding).
local function fails(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error")
  return err
end

for i = 1, 50 do
  local a = k3.randn({17, 33}, {seed = i, dtype = "bf16"})
  local v = a:narrow(2, 2, 30):t()
  local c = v:contiguous():to("f64")
  local d = k3.zeros({30, 17}, {dtype = "f16"}):copy(v)
  local e = (c + c) * 2 - c
  local s = tostring(e) .. tostring(d:select(1, 3))
  local t <close> = k3.ones({4, 4})
  local x = k3.tensor({{1, 2}, {3, 4}}):expand({3, 2, 2})
  assert(#s > 0 and x:numel() == 12 and t:numel() == 16)
  if i % 2 == 0 then a:free() end
  pcall(k3.empty, {-1})
  pcall(function() return a + k3.zeros({1}) end)
end

local default_policy = k3.policy
for i = 1, 10 do
  local dt = i % 2 == 0 and "bf16" or "f32"
  local x = k3.randn({3, 8}, {seed = i, dtype = dt})
  local w = k3.randn({5, 8}, {seed = i + 1, dtype = dt})
  local b = k3.randn({5}, {seed = i + 2, dtype = dt})
  local r = k3.randn({3, 5}, {seed = i + 3, dtype = dt})
  local out = k3.zeros({3, 5}, {dtype = dt})
  local hw = k3.ones({8}, {dtype = dt})

  -- ---- ops that succeed ----
  assert(k3.linear(x, w):numel() == 15)
  k3.linear(x, w, {bias = b, residual = r, out = out})
  k3.linear(x, w, {kernel = "cpu.linear.reference"})
  k3.rms_norm(x, hw, 1e-5)
  k3.rms_norm(x, hw, {eps = 1e-5, out = k3.empty({3, 8}, {dtype = dt})})
  k3.silu_mul(x)
  local ar = {prefix = k3.randn({2, 8}, {seed = i, dtype = "bf16"}),
              delta = k3.randn({2, 8}, {seed = i + 1, dtype = "bf16"}),
              blocks = k3.randn({2, 3, 8}, {seed = i + 2, dtype = "bf16"}), num_blocks = 2,
              write_block = 3, norm_weight = k3.ones({8}, {dtype = "bf16"}),
              qk_weight = k3.ones({8}, {dtype = "bf16"}),
              output_norm_weight = k3.ones({8}, {dtype = "bf16"})}
  k3.attn_res(ar)
  assert(k3.explain("attn_res", ar).chosen)
  assert(k3.explain("linear", x, w, {bias = b}).chosen)
  -- tensor ops, and their refusals (max's indices are made before dispatch refuses out)
  local tv, ti = x:max(2)
  assert(tv:numel() == 3 and ti:numel() == 3 and x:sum() == x:sum() and x:mean(1):numel() == 8)
  assert((x:abs():exp():sqrt() / 2):numel() == 24 and x:min() <= x:max())
  assert(k3.cat({x, x:float():to(dt)}, 1):numel() == 48 and k3.stack({x, x}, 3):numel() == 48)
  assert(k3.equal(k3.arange(0, 4), k3.linspace(0, 3, 4)))
  fails(k3.max, x, 2, {out = k3.empty({3, 8}, {dtype = dt})})
  fails(k3.sum, x, 3)
  fails(k3.cat, {x, w}, 2)
  fails(k3.arange, 0, 1, 0)

  -- ---- methods ----
  local dm = k3.method.default()
  dm:apply(x, w, b)
  assert(dm:explain(x, w, b).chosen)
  local ll = k3.method.low_latency({})
  ll:apply(x, w, nil, {residual = r})
  assert(#ll:explain(x, w).declined > 0)
  local ll2 = k3.method.low_latency({[1] = {kernel = "skinny", config = {threads = 128}},
                                     [3] = {kernel = "cpu.linear.reference"}})
  ll2:apply(x, w)
  ll2:explain(x, w)
  tostring(ll2)

  -- ---- trace and policy ----
  local tr = k3.trace(function()
    k3.linear(x, w)
    k3.silu_mul(x)
    k3.trace(function() k3.rms_norm(x, hw, 1e-5) end)
  end)
  assert(#tr == 3)
  k3.set_policy{linear = {"cpu.linear.reference", "cpu.linear.blas"}, on_layout_mismatch = "fallback"}
  k3.linear(x, w)
  k3.set_policy(default_policy)

  -- ---- the same, failing: the binding frees what it made, then raises ----
  local w_bad = k3.randn({5, 7}, {seed = i, dtype = dt})
  fails(k3.linear, x, w_bad)                                    -- K mismatch
  fails(k3.linear, x, w, {bias = k3.ones({4}, {dtype = dt})})   -- bias shape
  fails(k3.linear, x, w, {residual = k3.ones({3, 4}, {dtype = dt})})
  fails(k3.linear, x, w, {out = k3.zeros({3, 4}, {dtype = dt})})
  fails(k3.linear, x, w, {out = x})                             -- out of the wrong shape
  fails(k3.linear, x, w, {kernel = "nope"})
  fails(k3.linear, x, k3.randn({5, 8}, {dtype = dt == "f32" and "f64" or "f32"}))
  fails(k3.linear, x, w, "x")
  fails(k3.rms_norm, x, k3.ones({7}, {dtype = dt}), 1e-5)
  fails(k3.rms_norm, x, hw, -1)
  fails(k3.rms_norm, x, hw, {eps = 1e-5, out = x})
  fails(k3.silu_mul, k3.ones({2, 3}, {dtype = dt}))             -- odd width
  fails(k3.silu_mul, x, {out = x:narrow(2, 1, 4)})               -- out overlaps x
  local ar_bad = {}
  for key, val in pairs(ar) do ar_bad[key] = val end
  ar_bad.write_block = 4
  fails(k3.attn_res, ar_bad)
  ar_bad.write_block, ar_bad.qk_weight = nil, k3.ones({7}, {dtype = "bf16"})
  fails(k3.attn_res, ar_bad)
  ar_bad.qk_weight, ar_bad.delta = ar.qk_weight, k3.ones({2, 7}, {dtype = "bf16"})
  fails(k3.attn_res, ar_bad)
  ar_bad.delta, ar_bad.eps = nil, 0 / 0
  fails(k3.attn_res, ar_bad)
  fails(k3.explain, "linear", x, w_bad)
  fails(k3.explain, "attn_res", {prefix = ar.prefix})
  fails(k3.explain, "nope", x)
  fails(dm.apply, dm, x, w_bad)
  -- m:explain answers where apply raises: no kernel, apply's message (the refusal path still
  -- builds and drops the declines)
  local e = dm:explain(x, w_bad)
  assert(e.chosen == nil and e.error:find("must match", 1, true), "dm:explain of a K mismatch")
  fails(ll.apply, ll, x, w_bad)
  fails(ll2.apply, ll2, x, w_bad)
  e = ll2:explain(x, w_bad)
  assert(e.chosen == nil and e.error:find("must match", 1, true), "ll2:explain of a K mismatch")
  fails(ll.apply, ll, nil, w)
  fails(k3.method.low_latency, {[1] = {kernel = "skinny"}, [2] = {kernel = "nope"}})
  fails(k3.method.low_latency, {[1] = {kernel = "skinny"}, [17] = {kernel = "skinny"}})
  fails(k3.method.low_latency, {[1] = {kernel = "skinny", config = {split_k = 1.5}}})
  fails(k3.method.low_latency, {[1] = {kernel = "skinny"}, x = {kernel = "skinny"}})
  fails(k3.trace, function()
    k3.linear(x, w)
    k3.linear(x, w_bad)
  end)
  fails(k3.trace, function() k3.silu_mul(x); error("inside a trace") end)
  fails(k3.trace, "not a function")
  fails(k3.set_policy, {linear = {"cpu.linear.reference"}, rms_norm = {"nope"}})
  fails(k3.set_policy, {linear = {"cpu.attn_res.reference"}})
  fails(k3.set_policy, {on_layout_mismatch = "ignore"})
  local many = {}
  for j = 1, 17 do many[j] = "cpu.linear.blas" end
  fails(k3.set_policy, {linear = many})
  assert(k3.linear(x, w):numel() == 15) -- the policy in force still works
end
k3.set_policy(default_policy)

collectgarbage()
collectgarbage()
print("leak_check: done")
