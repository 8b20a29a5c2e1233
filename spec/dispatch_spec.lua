-- The kernel registry, dispatch and policy: what is registered, explain and trace agreeing
-- with what ran, K3_DISABLE_KERNELS (in a subprocess, as it is read once per process),
-- policies and their errors, counters, and batch-invariant mode.
local k3 = require "k3"
local H = require "spec.helpers"

-- Runs `chunk` in a fresh `scripts/k3 -e` with the environment prefix `env`; returns its
-- output lines and whether it succeeded. The chunk must not contain single quotes.
local function subprocess(env, chunk)
  assert(not chunk:find("'", 1, true))
  local p = io.popen(env .. " scripts/k3 -e '" .. chunk .. "' 2>&1; echo \"exit=$?\"")
  local text = p:read("a")
  p:close()
  return text
end

-- A plain copy of a table read through pairs (k3.policy is a view: assert.same compares raw
-- contents, which a view does not have).
local function plain(v)
  if type(v) ~= "table" then return v end
  local r = {}
  for k, x in pairs(v) do r[k] = plain(x) end
  return r
end

local CPU_KERNELS = {"cpu.linear.blas", "cpu.linear.reference", "cpu.linear.batch_invariant",
                     "cpu.attn_res.reference", "cpu.rms_norm.reference", "cpu.silu_mul.reference",
                     "cpu.abs.reference", "cpu.exp.reference", "cpu.sqrt.reference",
                     "cpu.sum.reference", "cpu.mean.reference", "cpu.max.reference",
                     "cpu.min.reference"}

describe("registry", function()
  it("registers every CPU kernel, first in registration order", function()
    local names = k3.kernels()
    for i, name in ipairs(CPU_KERNELS) do
      assert.equal(name, names[i])
      assert.is_true(k3.has_kernel(name))
    end
  end)

  it("knows kernels it has not registered, and not made-up ones", function()
    assert.is_true(k3.known_kernel("cuda.linear.skinny"))
    assert.is_false(k3.has_kernel("cpu.linear.nope"))
    assert.is_false(k3.known_kernel("cpu.linear.nope"))
  end)

  it("reports the CPU backend available and the CUDA backend's state in one line", function()
    local b = k3.backends()
    assert.is_true(b.cpu.available)
    if b.cuda.available then
      assert.is_true(k3.has_kernel("cuda.linear.cublas"))
    else
      assert.is_string(b.cuda.reason)
      assert.is_nil(b.cuda.reason:find("\n"))
      assert.is_false(k3.has_kernel("cuda.linear.cublas"))
      for _, name in ipairs(k3.kernels()) do assert.equal("cpu.", name:sub(1, 4)) end
    end
  end)

  it("cuda_arch without CUDA says CUDA is not available, and why", function()
    local c = k3.backends().cuda
    if c.available then
      pending("a CUDA device is available here")
      return
    end
    local err = H.raises(function() k3.cuda_arch(0) end, "cuda_arch: CUDA is not available: ")
    assert.truthy(err:find("cuda_arch: CUDA is not available: " .. c.reason, 1, true), err)
  end)

  it("K3_CUDA_BACKEND pointing nowhere says so", function()
    local out = subprocess("K3_CUDA_BACKEND=/nonexistent/libk3_cuda.so",
      [[print(k3.backends().cuda.reason); print(k3.has_kernel("cuda.linear.cublas"))]])
    assert.truthy(out:find("libk3_cuda.so not found at /nonexistent/libk3_cuda.so\nfalse\nexit=0", 1, true), out)
  end)
end)

describe("K3_DISABLE_KERNELS", function()
  it("leaves a kernel unregistered; dispatch picks the next candidate", function()
    local out = subprocess("K3_DISABLE_KERNELS=cpu.linear.blas,cuda.attn_res.decode", [[
      print(k3.has_kernel("cpu.linear.blas"), k3.has_kernel("cpu.linear.reference"))
      k3.set_policy{linear = {"cpu.linear.blas", "cpu.linear.reference"}}
      local x, w = k3.randn({2, 3}), k3.randn({4, 3})
      local e = k3.explain("linear", x, w)
      print(e.chosen, e.declined[1].kernel, e.declined[1].reason)
      local t = k3.trace(function() k3.linear(x, w) end)
      print(t[1].kernel)
      local ok, err = pcall(k3.linear, x, w, {kernel = "cpu.linear.blas"})
      print(err)
    ]])
    assert.truthy(out:find("false\ttrue\n", 1, true), out)
    assert.truthy(out:find("cpu.linear.reference\tcpu.linear.blas\tnot registered in this build (disabled by K3_DISABLE_KERNELS)\n", 1, true), out)
    assert.truthy(out:find("\ncpu.linear.reference\n", 1, true), out)
    assert.truthy(out:find("linear: kernel 'cpu.linear.blas' is not registered in this build (disabled by K3_DISABLE_KERNELS)", 1, true), out)
    assert.truthy(out:find("exit=0", 1, true), out)
  end)

  it("trims whitespace around names; an unknown name is reported once on stderr, not fatal", function()
    local out = subprocess("K3_DISABLE_KERNELS=\"  cpu.linear.blas ,cpu.linear.blass,\tcuda.linear.cublass, \"", [[
      print(k3.has_kernel("cpu.linear.blas"), k3.explain("linear", k3.ones({1, 2}), k3.ones({1, 2})).chosen)
      package.loaded.k3 = nil; package.loaded["k3.core"] = nil
      require "k3"
      print("reloaded")
    ]])
    local known = "(known kernels: cpu.linear.blas, cpu.linear.reference, cpu.linear.batch_invariant, " ..
      "cpu.attn_res.reference, cpu.rms_norm.reference, cpu.silu_mul.reference, cuda.linear.cublas, "
    assert.truthy(out:find("k3: warning: K3_DISABLE_KERNELS: unknown kernel 'cpu.linear.blass' ignored " ..
      known, 1, true), out)
    assert.truthy(out:find("k3: warning: K3_DISABLE_KERNELS: unknown kernel 'cuda.linear.cublass' ignored " ..
      known, 1, true), out)
    local _, warnings = out:gsub("k3: warning:", "")
    assert.equal(2, warnings, out)
    assert.truthy(out:find("false\tcpu.linear.reference\nreloaded\nexit=0", 1, true), out)
    -- known names, CUDA ones included on a CPU-only machine, are not reported
    out = subprocess("K3_DISABLE_KERNELS=cuda.linear.skinny,cpu.linear.blas", [[print("ok")]])
    assert.equal("ok\nexit=0\n", out)
  end)

  it("a kernel not compiled in says 'not registered in this build' (no libk3_cuda.so beside libk3.so)", function()
    local build = os.getenv("K3_BUILD_DIR") or "build"
    local p = io.popen("mktemp -d /tmp/k3-nocuda-XXXXXX")
    local dir = p:read("l")
    p:close()
    local cmd = string.format("mkdir -p %s/lua/k3 && cp %s/libk3.so %s/libk3lua.so %s/ && " ..
      "ln -s ../../libk3lua.so %s/lua/k3/core.so && LUA_CPATH='%s/lua/?.so' %s -e '%s' 2>&1; " ..
      "echo \"exit=$?\"; rm -rf %s", dir, build, build, dir, dir, dir, os.getenv("K3_LUA") or "lua5.4",
      [[local k3 = require "k3"
        print(k3.backends().cuda.reason)
        print(k3.explain("linear", k3.ones({1, 2}), k3.ones({1, 2})).declined[1].reason)
        print(select(2, pcall(k3.linear, k3.ones({1, 2}), k3.ones({1, 2}), {kernel = "cuda.linear.cublas"})))]],
      dir)
    p = io.popen(cmd)
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("libk3_cuda.so not found at " .. dir .. "/libk3_cuda.so\nnot registered in this build\n" ..
      "linear: kernel 'cuda.linear.cublas' is not registered in this build\nexit=0", 1, true), out)
  end)

  it("with every candidate gone, the error lists each decline", function()
    local out = subprocess("K3_DISABLE_KERNELS=cpu.rms_norm.reference", [[
      local ok, err = pcall(k3.rms_norm, k3.randn({2, 4}), k3.ones({4}), 1e-5)
      print(err)
    ]])
    assert.truthy(out:find("rms_norm: no registered kernel accepts the call (", 1, true), out)
    assert.truthy(out:find("cpu.rms_norm.reference: not registered in this build (disabled by K3_DISABLE_KERNELS))", 1, true), out)
  end)
end)

describe("dispatch", function()
  local x, w = k3.randn({3, 8}), k3.randn({5, 8}, {seed = 1})

  it("explain returns the decision without running anything", function()
    k3.stats_reset()
    local e = k3.explain("linear", x, w)
    assert.equal("cpu.linear.blas", e.chosen)
    if not k3.backends().cuda.available then
      assert.same({{kernel = "cuda.linear.cublas", reason = H.cuda_absent_reason()}}, e.declined)
    end
    assert.same({}, k3.stats().kernels)
  end)

  it("trace records every dispatch and agrees with explain", function()
    local a = {
      prefix = k3.randn({2, 8}), blocks = k3.randn({2, 3, 8}), num_blocks = 3,
      norm_weight = k3.ones({8}), qk_weight = k3.ones({8}),
    }
    local t = k3.trace(function()
      k3.linear(x, w)
      k3.attn_res(a)
      k3.rms_norm(x, k3.ones({8}), 1e-5)
      k3.silu_mul(x)
    end)
    assert.equal(4, #t)
    local ex = {k3.explain("linear", x, w), k3.explain("attn_res", a),
                k3.explain("rms_norm", x, k3.ones({8}), 1e-5), k3.explain("silu_mul", x)}
    for i, op in ipairs({"linear", "attn_res", "rms_norm", "silu_mul"}) do
      assert.equal(op, t[i].op)
      assert.equal(ex[i].chosen, t[i].kernel)
      assert.same(ex[i].declined, t[i].declined)
    end
  end)

  it("an enclosing trace keeps the dispatches of an inner trace that raised", function()
    local inner_err
    local r = k3.trace(function()
      k3.silu_mul(k3.ones({1, 2}))
      local ok, err = pcall(k3.trace, function()
        k3.silu_mul(k3.ones({1, 2}))
        k3.rms_norm(k3.ones({1, 2}), k3.ones({2}), 1e-5)
        error("inner failed", 0)
      end)
      assert.is_false(ok)
      inner_err = err
      k3.linear(x, w)
    end)
    assert.equal("inner failed", inner_err)
    assert.equal(4, #r)
    local ops = {}
    for i, rec in ipairs(r) do ops[i] = rec.op end
    assert.same({"silu_mul", "silu_mul", "rms_norm", "linear"}, ops)
    -- the trace state is restored: nothing traces after the outer trace returned
    local after = k3.trace(function() end)
    assert.same({}, after)
  end)

  it("the reviewer's one-liner counts the dispatch that ran before the inner error", function()
    local r = k3.trace(function()
      pcall(k3.trace, function() k3.silu_mul(k3.ones({1, 2})); error("x") end)
    end)
    assert.equal(1, #r)
    assert.equal("cpu.silu_mul.reference", r[1].kernel)
  end)

  it("kernel = runs exactly that kernel and skips dispatch", function()
    local t = k3.trace(function() k3.linear(x, w, {kernel = "cpu.linear.reference"}) end)
    assert.equal("cpu.linear.reference", t[1].kernel)
    assert.same({}, t[1].declined)
    assert.equal("cpu.linear.reference", k3.explain("linear", x, w, {kernel = "cpu.linear.reference"}).chosen)
  end)

  it("a kernel forced by name gets the op's validation first, whichever kernel it is", function()
    -- dispatch's prologue runs before any kernel: every registered kernel of each op, forced,
    -- refuses invalid arguments with the op's own message and writes nothing
    local out = H.poisoned({2, 4})
    local calls = {
      linear = {function(k) k3.linear(k3.ones({2, 3}), k3.ones({4, 5}), {kernel = k, out = out}) end,
                "linear: x dim 2 (3) must match w dim 2 (5)"},
      rms_norm = {function(k) k3.rms_norm(k3.ones({2, 4}), k3.ones({3}), {kernel = k, out = out}) end,
                  "rms_norm: w must be [H] = [4] (x dim 2); got [3]"},
      silu_mul = {function(k) k3.silu_mul(k3.ones({2, 3}), {kernel = k}) end,
                  "silu_mul: x dim 2 (3) must be even ([M, 2I])"},
      attn_res = {function(k)
        k3.attn_res{prefix = k3.ones({2, 4}), blocks = k3.ones({2, 3, 4}), num_blocks = 4,
                    norm_weight = k3.ones({4}), qk_weight = k3.ones({4}), out = out, kernel = k}
      end, "attn_res: num_blocks must be in 0..3 (blocks dim 2); got 4"},
    }
    for _, op in ipairs({"abs", "exp", "sqrt"}) do
      calls[op] = {function(k) k3[op](k3.ones({2, 3}), {kernel = k, out = out}) end,
                   op .. ": out must be [2, 3]; got [2, 4]"}
    end
    for _, op in ipairs({"sum", "mean", "max", "min"}) do
      calls[op] = {function(k) k3[op](k3.ones({2, 3}), 1, {kernel = k, out = out}) end,
                   op .. ": out must be [1, 3]; got [2, 4]"}
    end
    local forced = 0
    for _, name in ipairs(k3.kernels()) do
      local op = name:match("^%a+%.([%w_]+)%.")
      if name:sub(1, 4) == "cpu." then
        H.raises_exact(function() calls[op][1](name) end, calls[op][2])
        forced = forced + 1
      end
    end
    assert.equal(#CPU_KERNELS, forced)
    for _, row in ipairs(out:totable()) do
      for _, v in ipairs(row) do assert.is_true(v ~= v, "out was written") end
    end
  end)

  it("counts kernel calls and declines", function()
    k3.stats_reset()
    k3.linear(x, w)
    k3.linear(x, w)
    local s = k3.stats()
    assert.equal(2, s.kernels["cpu.linear.blas"])
    if not k3.backends().cuda.available then
      assert.equal(2, s.declines["cuda.linear.cublas: " .. H.cuda_absent_reason()])
    end
    k3.stats_reset()
    assert.same({}, k3.stats().kernels)
  end)

  it("a CUDA kernel's decline says the backend is unavailable, and why, when it was built", function()
    local c = k3.backends().cuda
    if c.available then return end
    local e = k3.explain("silu_mul", x)
    assert.same({{kernel = "cuda.silu_mul.generic", reason = H.cuda_absent_reason()}}, e.declined)
    if not c.reason:find("^libk3_cuda%.so not found") then
      assert.equal("not registered: CUDA backend unavailable (" .. c.reason .. ")", e.declined[1].reason)
      H.raises(function() k3.silu_mul(x, {kernel = "cuda.silu_mul.generic"}) end,
        "silu_mul: kernel 'cuda.silu_mul.generic' is not registered: CUDA backend unavailable (" .. c.reason .. ")")
    end
    -- a backend that is not there at all (K3_CUDA_BACKEND names a missing file) says so too
    local out = subprocess("K3_CUDA_BACKEND=/nonexistent/libk3_cuda.so",
      [[print(k3.explain("silu_mul", k3.ones({1, 2})).declined[1].reason)]])
    assert.truthy(out:find("not registered: CUDA backend unavailable (libk3_cuda.so not found at /nonexistent/libk3_cuda.so)\nexit=0", 1, true), out)
  end)

  it("a GPU kernel forced on CPU tensors is a device error", function()
    if not k3.has_kernel("cuda.linear.cublas") then return end
    H.raises(function() k3.linear(x, w, {kernel = "cuda.linear.cublas"}) end,
      "linear: kernel cuda.linear.cublas runs on cuda tensors; got tensors on cpu")
  end)
end)

describe("policy", function()
  local default = k3.policy
  after_each(function() k3.set_policy(default) end)

  it("the default policy is lua/k3/policy/default.lua", function()
    local file = dofile("lua/k3/policy/default.lua")
    assert.same(file, plain(k3.policy))
    assert.equal("error", k3.policy.on_layout_mismatch)
    assert.same({"cuda.attn_res.decode", "cuda.attn_res.ring", "cuda.attn_res.stream",
                 "cuda.attn_res.generic", "cpu.attn_res.reference"}, k3.policy.attn_res)
  end)

  it("every default list ends in a CPU kernel; linear falls back to cpu.linear.reference", function()
    for _, op in ipairs({"linear", "attn_res", "rms_norm", "silu_mul"}) do
      local list = k3.policy[op]
      assert.equal("cpu.", list[#list]:sub(1, 4), op)
    end
    assert.same({"cuda.linear.cublas", "cpu.linear.blas", "cpu.linear.reference"}, plain(k3.policy.linear))
    local out = subprocess("K3_DISABLE_KERNELS=cpu.linear.blas", [[
      local x, w = k3.randn({2, 3}), k3.randn({4, 3}, {seed = 1})
      local e = k3.explain("linear", x, w)
      print(e.chosen, e.declined[#e.declined].reason)
      print(k3.max_abs_diff(k3.linear(x, w), k3.linear(x, w, {kernel = "cpu.linear.reference"})))
    ]])
    assert.truthy(out:find("cpu.linear.reference\tnot registered in this build (disabled by K3_DISABLE_KERNELS)\n0.0\nexit=0", 1, true), out)
  end)

  it("k3.policy is a read-only view: writes raise and point to k3.set_policy; dispatch is unchanged", function()
    local x, w = k3.randn({2, 4}), k3.randn({3, 4})
    local hint = "k3.policy is a read-only view of the active policy; change the policy with k3.set_policy(tbl)"
    local err = H.raises(function() k3.policy.linear = {"cpu.linear.reference"} end,
      "cannot assign k3.policy.linear: " .. hint)
    assert.truthy(err:find("dispatch_spec.lua:%d+: "), err) -- at the caller's line
    H.raises(function() k3.policy.on_layout_mismatch = "fallback" end,
      "cannot assign k3.policy.on_layout_mismatch: " .. hint)
    H.raises(function() k3.policy.linear[1] = "cpu.linear.reference" end,
      "cannot assign k3.policy.linear[1]: " .. hint)
    H.raises(function() table.insert(k3.policy.rms_norm, 1, "cpu.rms_norm.reference") end,
      "cannot assign k3.policy.rms_norm[3]: " .. hint)
    H.raises(function() k3.policy.bogus = 1 end, "cannot assign k3.policy.bogus: " .. hint)
    H.raises(function() k3.policy = {linear = {"cpu.linear.reference"}} end, "cannot assign k3.policy: " .. hint)
    H.raises(function() setmetatable(k3.policy, nil) end, "cannot change a protected metatable")
    assert.same(dofile("lua/k3/policy/default.lua"), plain(k3.policy))
    assert.equal("cpu.linear.blas", k3.explain("linear", x, w).chosen)
  end)

  it("k3.policy reads like a table: index, #, pairs, ipairs and k3.inspect", function()
    k3.set_policy{linear = {"cpu.linear.reference", "cpu.linear.blas"}, on_layout_mismatch = "fallback"}
    assert.equal("fallback", k3.policy.on_layout_mismatch)
    assert.equal(2, #k3.policy.linear)
    assert.equal("cpu.linear.blas", k3.policy.linear[2])
    local seen = {}
    for i, name in ipairs(k3.policy.linear) do seen[i] = name end
    assert.same({"cpu.linear.reference", "cpu.linear.blas"}, seen)
    local keys = {}
    for k in pairs(k3.policy) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.same({"abs", "attn_res", "batch_invariant", "exp", "linear", "max", "mean", "min",
                 "on_layout_mismatch", "rms_norm", "silu_mul", "sqrt", "sum"}, keys)
    local function pair(op) return op .. ' = {"cuda.' .. op .. '.generic", "cpu.' .. op .. '.reference"}' end
    assert.equal('{' .. pair("abs") .. ', attn_res = {"cuda.attn_res.decode", "cuda.attn_res.ring", ' ..
      '"cuda.attn_res.stream", "cuda.attn_res.generic", "cpu.attn_res.reference"}, ' ..
      'batch_invariant = {linear = {"cuda.linear.batch_invariant", "cpu.linear.batch_invariant"}}, ' ..
      pair("exp") .. ', linear = {"cpu.linear.reference", "cpu.linear.blas"}, ' ..
      pair("max") .. ', ' .. pair("mean") .. ', ' .. pair("min") .. ', on_layout_mismatch = "fallback", ' ..
      pair("rms_norm") .. ', ' .. pair("silu_mul") .. ', ' .. pair("sqrt") .. ', ' .. pair("sum") .. '}',
      k3.inspect(k3.policy))
  end)

  it("a saved k3.policy keeps showing its policy and restores it through set_policy", function()
    local saved = k3.policy
    k3.set_policy{linear = {"cpu.linear.reference"}}
    assert.same({"cpu.linear.reference"}, plain(k3.policy.linear))
    assert.same({"cuda.linear.cublas", "cpu.linear.blas", "cpu.linear.reference"}, plain(saved.linear))
    k3.set_policy(saved)
    assert.same(plain(saved), plain(k3.policy))
    assert.equal("cpu.linear.blas", k3.explain("linear", k3.randn({2, 4}), k3.randn({3, 4})).chosen)
  end)

  it("set_policy reorders candidates", function()
    k3.set_policy{linear = {"cpu.linear.reference", "cpu.linear.blas"}, on_layout_mismatch = "fallback"}
    local x, w = k3.randn({2, 4}), k3.randn({3, 4})
    assert.equal("cpu.linear.reference", k3.explain("linear", x, w).chosen)
    assert.equal("cpu.linear.reference", k3.trace(function() k3.linear(x, w) end)[1].kernel)
  end)

  it("a policy naming only GPU kernels cannot serve CPU tensors, and says why", function()
    k3.set_policy{linear = {"cuda.linear.cublas", "cuda.linear.skinny"}}
    local x, w = k3.randn({2, 4}), k3.randn({3, 4})
    local text = k3.backends().cuda.available
      and "linear: no registered kernel accepts the call (cuda.linear.cublas: tensors are on cpu"
      or ("linear: no registered kernel accepts the call (cuda.linear.cublas: " .. H.cuda_absent_reason() ..
          "; cuda.linear.skinny: " .. H.cuda_absent_reason() .. ")")
    H.raises(function() k3.linear(x, w) end, text)
  end)

  it("rejects unknown kernels and another op's kernels, changing nothing", function()
    H.raises(function() k3.set_policy{linear = {"cpu.linear.blas", "cpu.linear.fast"}} end,
      "set_policy: unknown linear kernel 'cpu.linear.fast' (known: cpu.linear.blas, cpu.linear.reference, cpu.linear.batch_invariant, cuda.linear.cublas, cuda.linear.skinny, cuda.linear.batch_invariant")
    H.raises(function() k3.set_policy{rms_norm = {"cpu.silu_mul.reference"}} end,
      "set_policy: kernel 'cpu.silu_mul.reference' is for op silu_mul, not rms_norm")
    assert.same(plain(default), plain(k3.policy))
    assert.equal("cpu.linear.blas", k3.explain("linear", k3.randn({1, 2}), k3.randn({1, 2})).chosen)
  end)

  it("rejects a bad on_layout_mismatch", function()
    H.raises(function() k3.set_policy{on_layout_mismatch = "ignore"} end,
      "set_policy: on_layout_mismatch must be \"error\" or \"fallback\"; got ignore")
  end)
end)

describe("batch-invariant mode", function()
  after_each(function() k3.set_batch_invariant(false) end)

  it("sends linear to cpu.linear.batch_invariant; rows do not depend on M (1..16)", function()
    k3.set_batch_invariant(true)
    local K, N = 260, 33
    local w = k3.randn({N, K}, {dtype = "bf16", seed = 41})
    local x = k3.randn({16, K}, {dtype = "bf16", seed = 42})
    assert.equal("cpu.linear.batch_invariant", k3.explain("linear", x, w).chosen)
    local alone = {}
    for i = 1, 16 do alone[i] = k3.linear(x:narrow(1, i, 1), w) end
    for M = 1, 16 do
      local y = k3.linear(x:narrow(1, 1, M), w)
      for i = 1, M do assert.equal(0, k3.max_abs_diff(y:narrow(1, i, 1), alone[i])) end
    end
  end)

  it("is a policy list: batch_invariant's list serves linear in that mode, an empty one leaves the op's own", function()
    local saved = k3.policy
    local x, w = k3.randn({2, 3}), k3.randn({4, 3})
    k3.set_policy{batch_invariant = {linear = {"cpu.linear.reference"}}}
    assert.same({linear = {"cpu.linear.reference"}}, plain(k3.policy.batch_invariant))
    assert.equal("cpu.linear.blas", k3.explain("linear", x, w).chosen)
    k3.set_batch_invariant(true)
    local e = k3.explain("linear", x, w)
    assert.equal("cpu.linear.reference", e.chosen)
    assert.same({}, e.declined)
    -- a low-latency plan is passed over in this mode, whatever its kernel
    local d = k3.method.low_latency({[2] = {kernel = "skinny"}}):explain(x, w)
    assert.same({kernel = "cuda.linear.skinny", reason = "batch-invariant mode is on"}, d.declined[1])
    assert.equal("cpu.linear.reference", d.chosen)
    k3.set_policy{batch_invariant = {linear = {}}}
    assert.same({}, plain(k3.policy.batch_invariant))
    assert.equal("cpu.linear.blas", k3.explain("linear", x, w).chosen)
    H.raises(function() k3.set_policy{batch_invariant = {linear = {"cpu.rms_norm.reference"}}} end,
      "set_policy: kernel 'cpu.rms_norm.reference' is for op rms_norm, not linear")
    H.raises(function() k3.set_policy{batch_invariant = {matmul = {}}} end,
      "set_policy: batch_invariant has unknown key \"matmul\" (expected linear, attn_res, rms_norm, silu_mul, abs, exp, sqrt, sum, mean, max, min)")
    k3.set_policy(saved)
    assert.equal("cpu.linear.batch_invariant", k3.explain("linear", x, w).chosen)
  end)

  it("K3_BATCH_INVARIANT accepts 0/1/true/false/yes/no/on/off; anything else is reported once", function()
    for value, on in pairs({["1"] = true, ["yes"] = true, ["ON"] = true, [" true "] = true,
                            ["0"] = false, ["no"] = false, ["Off"] = false, ["false"] = false, [""] = false}) do
      local out = subprocess("K3_BATCH_INVARIANT=\"" .. value .. "\"", [[print(k3.batch_invariant())]])
      assert.equal(tostring(on) .. "\nexit=0\n", out, "K3_BATCH_INVARIANT=" .. value)
    end
    local out = subprocess("K3_BATCH_INVARIANT=enabled", [[
      print(k3.batch_invariant(), k3.explain("linear", k3.randn({2, 3}), k3.randn({4, 3})).chosen)]])
    assert.equal("k3: warning: K3_BATCH_INVARIANT: unrecognised value 'enabled' (expected 0, 1, true, " ..
      "false, yes, no, on or off); batch-invariant mode stays off\nfalse\tcpu.linear.blas\nexit=0\n", out)
  end)

  it("is read from K3_BATCH_INVARIANT=1", function()
    local out = subprocess("K3_BATCH_INVARIANT=1", [[
      print(k3.batch_invariant(), k3.explain("linear", k3.randn({2, 3}), k3.randn({4, 3})).chosen)
    ]])
    assert.truthy(out:find("true\tcpu.linear.batch_invariant\n", 1, true), out)
  end)
end)

describe("explain when dispatch would fail", function()
  after_each(function() k3.set_policy(require "k3.policy.default") end)

  it("returns the declines and the error instead of raising; the op itself raises it", function()
    k3.set_policy({linear = {"cuda.linear.cublas"}})
    local x, w = k3.ones({1, 4}), k3.ones({2, 4})
    local e = k3.explain("linear", x, w)
    assert.is_nil(e.chosen)
    assert.are.equal("linear", e.op)
    assert.are.equal(1, #e.declined)
    assert.are.equal("cuda.linear.cublas", e.declined[1].kernel)
    assert.truthy(e.error:find("linear: no registered kernel accepts the call (cuda.linear.cublas: ", 1, true), e.error)
    local ok, err = pcall(k3.linear, x, w)
    assert.is_false(ok)
    assert.are.equal(e.error, err)
    -- a method's explain answers the same way
    local m = k3.method.default()
    assert.is_nil(m:explain(x, w).chosen)
    -- invalid arguments still raise: nothing was dispatched
    H.raises(function() k3.explain("linear", x, k3.ones({2, 5})) end, "linear: x dim 2 (4) must match w dim 2 (5)")
  end)
end)

describe("dispatch at the edges", function()
  it("K3_DISABLE_KERNELS is matched by whole entries in the not-registered detail", function()
    local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/[^/]*$") or "."
    local cmd = string.format("cd %q && K3_DISABLE_KERNELS=xx-cpu.linear.blas-xx scripts/k3 -e %q 2>/dev/null",
      root, 'print(select(2, pcall(k3.linear, k3.ones({1,2}), k3.ones({1,2}), {kernel = "cpu.linear.blas"})))')
    local f = io.popen(cmd)
    local out = f:read("a")
    f:close()
    assert.equal("k3.Tensor [1, 1] f32 cpu\n[[2]]\n", out)
  end)

  it("set_policy rejects unknown keys, holes and empty lists at the caller's line", function()
    local before = k3.inspect(k3.policy)
    H.raises(function() k3.set_policy({bogus = {}}) end, "set_policy: unknown key \"bogus\"")
    H.raises(function() k3.set_policy({linear = {}}) end, "set_policy: linear lists no kernels")
    local err = H.raises(function() k3.set_policy({linear = {"nope"}}) end,
      "set_policy: unknown linear kernel 'nope'")
    assert.is_nil(err:find("init.lua", 1, true))
    assert.equal(before, k3.inspect(k3.policy))
    k3.set_policy({linear = {"cpu.linear.reference"}})
    assert.same({"cpu.linear.reference"}, k3.policy.linear)
    assert.same({"cuda.rms_norm.generic", "cpu.rms_norm.reference"}, k3.policy.rms_norm)
    k3.set_policy(require "k3.policy.default")
  end)

  it("set_batch_invariant takes a boolean only: 'off' and 0 are refused, the mode unchanged", function()
    local before = k3.batch_invariant()
    for _, v in ipairs{"off", 0, "false"} do
      H.raises(function() k3.set_batch_invariant(v) end,
               "set_batch_invariant' (boolean expected, got " .. type(v) .. ")")
      assert.equal(before, k3.batch_invariant())
    end
    H.raises(function() k3.set_batch_invariant() end, "(boolean expected, got no value)")
    k3.set_batch_invariant(not before)
    assert.equal(not before, k3.batch_invariant())
    k3.set_batch_invariant(before)
  end)

  it("an op's output allocation failure names the op", function()
    -- 2^46 rows: more bytes than any address space, so the allocation fails on any machine.
    local rows = 2 ^ 46
    local x = k3.zeros({1, 4}):expand({rows, 4})
    H.raises(function() k3.rms_norm(x, k3.ones({4}), 1e-5) end,
      "rms_norm: out of host memory allocating " .. math.tointeger(rows * 16) .. " bytes")
    H.raises(function() k3.silu_mul(x) end,
      "silu_mul: out of host memory allocating " .. math.tointeger(rows * 8) .. " bytes")
    H.raises(function() k3.linear(x, k3.ones({1, 4})) end,
      "linear: out of host memory allocating " .. math.tointeger(rows * 4) .. " bytes")
    H.raises(function() k3.method.default():apply(x, k3.ones({1, 4})) end,
      "linear: out of host memory allocating ")
    local w = k3.ones({4})
    H.raises(function()
      k3.attn_res{prefix = x, blocks = k3.zeros({1, 1, 4}):expand({rows, 1, 4}), num_blocks = 1,
                  norm_weight = w, qk_weight = w}
    end, "attn_res: out of host memory allocating " .. math.tointeger(rows * 16) .. " bytes")
  end)
end)
