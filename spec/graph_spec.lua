-- k3.cuda_graph: on a machine without CUDA, the clear "needs a CUDA device" error and the
-- argument checks; on a GPU (#gpu), replay against the eager result bit for bit (a small k3.nn
-- stack and the kimi tiny config), replays with new inputs copied into the static input,
-- capture after an error, each refusal (the stream usable after it), freeing tensors the
-- graph uses, trace and stats records, the kernel count, and a long chain of dependent PDL
-- kernels between cuBLAS calls.
local k3 = require "k3"
local H = require "spec.helpers"

-- Bit-for-bit equality: every element's bits, read back through f64 (exact for every dtype).
local function same_bits(a, b, what)
  local x, y = a:to("cpu"):to("f64"):totable(), b:to("cpu"):to("f64"):totable()
  local function walk(p, q, path)
    if type(p) == "table" then
      assert.equal(#q, #p, what .. ": shape differs at " .. path)
      for i = 1, #p do walk(p[i], q[i], path .. "[" .. i .. "]") end
    elseif not (p == q or (p ~= p and q ~= q)) then
      error(string.format("%s: element %s differs: %.17g vs %.17g", what, path, p, q))
    end
  end
  walk(x, y, "")
end

describe("k3.cuda_graph without a CUDA device", function()
  it("raises the clear 'needs a CUDA device' error", function()
    if k3.backends().cuda.available then
      pending("a CUDA device is available here: the error is for machines without one")
      return
    end
    local err = H.raises(function() k3.cuda_graph(function() end) end,
                         "k3.cuda_graph: needs a CUDA device (CUDA is not available: ")
    assert.truthy(err:find(k3.backends().cuda.reason, 1, true), err)
  end)

  it("checks its arguments before anything else", function()
    H.raises(function() k3.cuda_graph(42) end, "bad argument #1 to 'cuda_graph' (function expected")
    H.raises(function() k3.cuda_graph(function() end, {warmpu = 1}) end, "warmpu")
    H.raises(function() k3.cuda_graph(function() end, {warmup = -1}) end, "warmup must be in 0..1000; got -1")
  end)

  it("records eager dispatches as not captured", function()
    local x, w = k3.randn({2, 8}), k3.ones({8})
    k3.stats_reset()
    local tr = k3.trace(function() k3.rms_norm(x, w, 1e-5) end)
    assert.equal(1, #tr)
    assert.is_nil(tr[1].captured)
    assert.same({}, k3.stats().captured)
    assert.equal(1, k3.stats().kernels["cpu.rms_norm.reference"])
  end)
end)

describe("k3.cuda_graph #gpu", function()
  if not H.require_gpu() then return end
  local nn = require "k3.nn"

  local function dev(t) return t:to("cuda") end

  -- A small stack: RMSNorm, then a SwiGLU MLP with its residual, twice.
  local function small_stack(hidden, inter)
    local layers = {}
    for l = 1, 2 do
      layers[l] = {
        norm = nn.RMSNorm(dev(k3.randn({hidden}, {dtype = "bf16", seed = 10 + l}) * 0.1 + 1)),
        mlp = nn.SwiGLU(dev(k3.randn({2 * inter, hidden}, {dtype = "bf16", seed = 20 + l}) * 0.05),
                        dev(k3.randn({hidden, inter}, {dtype = "bf16", seed = 30 + l}) * 0.05)),
      }
    end
    return function(x)
      local h = x
      for _, l in ipairs(layers) do
        local n = l.norm(h)
        local m = l.mlp(n)
        n:free()
        local r = h + m
        m:free()
        if h ~= x then h:free() end
        h = r
      end
      return h
    end
  end

  -- A graph whose step writes stack(x_static) into y_static.
  local function capture_step(step, x_static, y_static, opts)
    return k3.cuda_graph(function()
      local y = step(x_static)
      y_static:copy(y)
      y:free()
    end, opts)
  end

  it("replays a small k3.nn stack bit for bit as the eager step, with new inputs each time", function()
    local step = small_stack(256, 512)
    local x = k3.randn({4, 256}, {dtype = "bf16", device = "cuda", seed = 1})
    local y = k3.empty({4, 256}, {dtype = "bf16", device = "cuda"})
    local g <close> = capture_step(step, x, y)
    assert.truthy(tostring(g):find("^k3%.Graph%(cuda:0, %d+ kernels, %d+ tensors held%)$"), tostring(g))
    for i = 1, 4 do
      local xi = k3.randn({4, 256}, {dtype = "bf16", device = "cuda", seed = 100 + i})
      local want = step(xi)
      x:copy(xi)
      y:fill(0 / 0)
      g:replay()
      same_bits(y, want, "replay " .. i)
    end
    -- Repeated replays of the same input give the same bits again.
    local again = y:clone()
    g:replay(3)
    same_bits(y, again, "three more replays")
  end)

  it("replays the kimi tiny config bit for bit as the eager step", function()
    local kimi = require "k3.model.kimi_k3"
    local cfg = kimi.config("tiny")
    local weights = kimi.generate_weights(cfg, {seed = 7, dtype = "bf16", device = "cuda"})
    local stack = kimi.build(cfg, weights, {dtype = "bf16", device = "cuda"})
    for _, m in ipairs({1, 3}) do
      local x = kimi.embedding(cfg, m, {seed = 7, step = 0, dtype = "bf16", device = "cuda"})
      local y = k3.empty({m, cfg.hidden_size}, {dtype = "bf16", device = "cuda"})
      local g <close> = capture_step(function(t) return (stack:forward(t)) end, x, y)
      for s = 1, 3 do
        local xs = kimi.embedding(cfg, m, {seed = 7, step = s, dtype = "bf16", device = "cuda"})
        local want = stack:forward(xs)
        x:copy(xs)
        y:fill(0 / 0)
        g:replay()
        same_bits(y, want, string.format("M=%d step %d", m, s))
      end
    end
  end)

  it("re-raises fn's error unchanged, ends the capture, and the stream stays usable", function()
    local x = k3.randn({2, 64}, {device = "cuda", seed = 3})
    local w = k3.ones({64}, {device = "cuda"})
    -- The warmup call succeeds; the captured call raises after queueing an op.
    local calls = 0
    local ok, err = pcall(k3.cuda_graph, function()
      calls = calls + 1
      local y = k3.rms_norm(x, w, 1e-5)
      y:free()
      if calls == 2 then error({code = "boom"}) end
    end)
    assert.equal(2, calls)
    assert.is_false(ok)
    assert.same({code = "boom"}, err)
    -- Eager work runs, and a new capture works.
    local want = k3.rms_norm(x:to("cpu"), w:to("cpu"), 1e-5)
    local got = k3.rms_norm(x, w, 1e-5)
    k3.synchronize()
    assert.is_true(k3.allclose(got:to("cpu"), want, {atol = 1e-5, rtol = 1e-5}))
    local out = k3.empty({2, 64}, {device = "cuda"})
    local g <close> = k3.cuda_graph(function() k3.rms_norm(x, w, 1e-5, {out = out}) end)
    out:fill(0 / 0)
    g:replay()
    same_bits(out, got, "capture after an error")
  end)

  -- Each refusal: the message names it, and afterwards eager work and a new capture work.
  local cpu_x, cpu_w, cpu_a = k3.zeros({2, 64}), k3.ones({8}), k3.ones({2, 8})
  local refusals = {
    {"a host synchronisation", function() k3.synchronize() end,
     "synchronize: a host synchronisation cannot be captured into a CUDA graph"},
    {"a copy to the host", function(x) x:to("cpu") end,
     "a copy to or from the host (a host synchronisation) cannot be captured into a CUDA graph"},
    {"an element read", function(x) x:get(1, 1) end,
     "an element read (a host synchronisation) cannot be captured into a CUDA graph"},
    {"a copy from the host", function(x) x:copy(cpu_x) end,
     "a copy to or from the host (a host synchronisation) cannot be captured into a CUDA graph"},
    {"an op on CPU tensors", function() k3.rms_norm(cpu_a, cpu_w, 1e-5) end,
     "rms_norm: an op on CPU tensors cannot be captured into a CUDA graph"},
    {"arithmetic on CPU tensors", function() return cpu_a + cpu_a end,
     "arithmetic on CPU tensors cannot be captured into a CUDA graph"},
    {"a fill of a CPU tensor", function() cpu_a:fill(2) end,
     "a fill of a CPU tensor cannot be captured into a CUDA graph"},
    {"empty_cache", function() k3.empty_cache() end,
     "empty_cache: returning memory to the driver (a device synchronisation) cannot be captured"},
    {"an allocation the cache cannot serve", function()
       k3.empty({7777777, 3}, {device = "cuda", dtype = "f64"}) -- 187 MB, a size nothing here freed
     end, "while a CUDA graph is being captured: no block the allocator held before the capture serves it"},
    {"a nested capture", function() k3.cuda_graph(function() end) end,
     "k3.cuda_graph: a CUDA graph is already being captured on this thread"},
  }
  for _, r in ipairs(refusals) do
    it("refuses " .. r[1] .. " and leaves the stream usable", function()
      local x = k3.randn({2, 64}, {device = "cuda", seed = 5})
      local w = k3.ones({64}, {device = "cuda"})
      local pre = k3.empty({2, 64}, {device = "cuda"})
      -- No warmup (it would raise the refusal eagerly, or not at all): a captured op with its
      -- out given, then the refused call.
      H.raises(function()
        k3.cuda_graph(function()
          k3.rms_norm(x, w, 1e-5, {out = pre})
          r[2](x)
        end, {warmup = 0})
      end, r[3])
      local got = k3.rms_norm(x, w, 1e-5)
      k3.synchronize()
      local want = k3.rms_norm(x:to("cpu"), w:to("cpu"), 1e-5)
      assert.is_true(k3.allclose(got:to("cpu"), want, {atol = 1e-5, rtol = 1e-5}))
      local out = k3.empty({2, 64}, {device = "cuda"})
      local g <close> = k3.cuda_graph(function() k3.rms_norm(x, w, 1e-5, {out = out}) end)
      g:replay()
      same_bits(out, got, "capture after refusing " .. r[1])
    end)
  end

  it("keeps the storage of tensors the graph uses when they are freed", function()
    local x = k3.randn({3, 128}, {device = "cuda", seed = 8})
    local w = k3.randn({128}, {device = "cuda", seed = 9})
    local out = k3.empty({3, 128}, {device = "cuda"})
    local want = k3.rms_norm(x, w, 1e-5)
    local g = k3.cuda_graph(function()
      local tmp = k3.rms_norm(x, w, 1e-5)
      out:copy(tmp)
      tmp:free() -- released during the capture: its block serves only this graph
    end)
    -- Freed after the capture: the views report it, the graph still has the memory.
    w:free()
    H.raises(function() w:get(1) end, "freed")
    out:fill(0 / 0)
    g:replay()
    same_bits(out, want, "replay after freeing w")
    -- Other work allocating after the frees does not get the graph's memory.
    local junk = {}
    for i = 1, 8 do junk[i] = k3.full({3, 128}, 1e30, {device = "cuda"}) end
    out:fill(0 / 0)
    g:replay()
    same_bits(out, want, "replay after other allocations")
    g:free()
    assert.equal("k3.Graph(freed)", tostring(g))
    H.raises(function() g:replay() end, "replay: the graph has been freed")
    g:free() -- twice is a no-op
  end)

  it("frees the graph at the end of a <close> scope", function()
    local keep
    do
      local g <close> = k3.cuda_graph(function() k3.zeros({4}, {device = "cuda"}) end)
      keep = g
      assert.truthy(tostring(keep):find("^k3%.Graph%(cuda:0"))
    end
    assert.equal("k3.Graph(freed)", tostring(keep))
  end)

  it("k3.trace and k3.stats record the captured dispatches, and the graph counts its kernels", function()
    local x = k3.randn({2, 64}, {device = "cuda", seed = 4})
    local w = k3.ones({64}, {device = "cuda"})
    local xy = k3.randn({2, 128}, {device = "cuda", seed = 5})
    local n_out = k3.empty({2, 64}, {device = "cuda"})
    local s_out = k3.empty({2, 64}, {device = "cuda"})
    local g
    k3.stats_reset()
    local tr = k3.trace(function()
      g = k3.cuda_graph(function()
        k3.rms_norm(x, w, 1e-5, {out = n_out})
        k3.silu_mul(xy, {out = s_out})
      end, {warmup = 1})
    end)
    -- The warmup's two records, then the capture's two.
    assert.equal(4, #tr)
    assert.is_nil(tr[1].captured)
    assert.is_nil(tr[2].captured)
    assert.is_true(tr[3].captured)
    assert.is_true(tr[4].captured)
    assert.equal("rms_norm", tr[3].op)
    local st = k3.stats()
    assert.equal(2, st.kernels["cuda.rms_norm.generic"])
    assert.equal(1, st.captured["cuda.rms_norm.generic"])
    assert.equal(1, st.captured["cuda.silu_mul.generic"])
    assert.equal(2, g:kernels())
    assert.equal("cuda:0", g:device())
    assert.equal(5, g:tensors()) -- x, w, xy and the two outs
    -- Replays dispatch nothing.
    k3.stats_reset()
    g:replay()
    assert.same({}, k3.stats().kernels)
    g:free()
  end)

  it("a long chain of dependent PDL kernels between cuBLAS calls replays bit for bit", function()
    -- copy, rms_norm, silu_mul and elementwise kernels (all PDL) read what the kernel just
    -- before them wrote; cuBLAS linears (no PDL) sit between them.
    local Hd = 512
    local w = k3.randn({Hd}, {dtype = "bf16", device = "cuda", seed = 11}) * 0.1 + 1
    local wl = k3.randn({2 * Hd, Hd}, {dtype = "bf16", device = "cuda", seed = 12}) * 0.05
    local x = k3.randn({2, Hd}, {dtype = "bf16", device = "cuda", seed = 13})
    local a = k3.empty({2, Hd}, {dtype = "bf16", device = "cuda"})
    local b = k3.empty({2, Hd}, {dtype = "bf16", device = "cuda"})
    local gu = k3.empty({2, 2 * Hd}, {dtype = "bf16", device = "cuda"})
    local function chain()
      a:copy(x)
      for i = 1, 40 do
        k3.rms_norm(a, w, 1e-5, {out = b})
        if i % 4 == 0 then
          k3.linear(b, wl, {out = gu, kernel = "cuda.linear.cublas"})
          k3.silu_mul(gu, {out = a})
        else
          a:copy(b)
          local s = a * 1.25
          a:copy(s)
          s:free()
        end
      end
    end
    chain()
    local want = a:clone()
    local g <close> = k3.cuda_graph(chain)
    for _ = 1, 3 do
      a:fill(0 / 0)
      b:fill(0 / 0)
      g:replay()
      same_bits(a, want, "chain")
    end
  end)
end)
