-- k3.nn layers: Linear, RMSNorm and SwiGLU against f64 references computed in Lua from
-- the same inputs, on contiguous and strided inputs; the default method choice and the
-- low-latency method's real fallback on a CPU input.
local k3 = require "k3"
local nn = require "k3.nn"
local H = require "spec.helpers"

local function matmul_t(x, w) -- x [M][K], w [N][K] -> [M][N], f64
  local y = {}
  for i = 1, #x do
    y[i] = {}
    for n = 1, #w do
      local s = 0
      for k = 1, #x[i] do s = s + x[i][k] * w[n][k] end
      y[i][n] = s
    end
  end
  return y
end

local function max_rel(a, b) -- max |a - b| / max(1, |b|) over nested [M][N] lists
  local m = 0
  for i = 1, #b do
    for j = 1, #b[i] do m = math.max(m, math.abs(a[i][j] - b[i][j]) / math.max(1, math.abs(b[i][j]))) end
  end
  return m
end

local tol = {bf16 = 1.6e-2, f32 = 1e-5, f64 = 1e-12}

-- Runs fn with k3.plan_for recording each lookup ({rows = w's N, epilogue = the option}) and
-- answering nil; returns the lookups and fn's pcall results. k3.plan_for is restored either way.
local function plan_lookups(fn)
  local asked, saved = {}, k3.plan_for
  k3.plan_for = function(w, opts)
    asked[#asked + 1] = {rows = w:size(1), epilogue = opts and opts.epilogue}
    return nil
  end
  local ok, err = pcall(fn)
  k3.plan_for = saved
  return asked, ok, err
end

describe("k3.nn", function()
  describe("Linear", function()
    it("an op's error inside a layer names the caller's line, not the layer's", function()
      local lin = nn.Linear(k3.randn({4, 8}))
      -- a caller's chunk of its own: line 2 calls the layer
      local call = assert(load("local lin, x = ...\nlocal y = lin(x)\nreturn y\n", "@caller.lua"))
      local ok, err = pcall(call, lin, k3.randn({2, 7}))
      assert.is_false(ok)
      assert.equal("caller.lua:2: linear: x dim 2 (7) must match w dim 2 (8)", err)
      -- a C caller (pcall itself) gives no position, as for the op called directly
      local _, direct = pcall(lin, k3.randn({2, 7}))
      assert.equal("linear: x dim 2 (7) must match w dim 2 (8)", direct)
      -- a constructor's refusals too, and its unknown options and mistyped ones
      local function at_caller(src, want)
        local ok2, e = pcall(assert(load("local nn, k3 = ...\nlocal l = " .. src .. "\nreturn l\n", "@caller.lua")), nn, k3)
        assert.is_false(ok2, src)
        assert.equal("caller.lua:2: " .. want, e, src)
      end
      at_caller("nn.RMSNorm(5)", "RMSNorm: weight must be a tensor (got number)")
      at_caller("nn.Linear(k3.ones({2, 2}), {bias = 5})", "Linear: bias must be a tensor (got number)")
      at_caller("nn.Linear(k3.ones({2, 2}), {bais = k3.ones({2})})", "Linear: unknown option 'bais' (expected bias or method)")
      at_caller("nn.Linear(k3.ones({2, 2}), {method = 5})",
                "Linear: method must be a k3 method (k3.method.default() or k3.method.low_latency(...)); got number")
      at_caller("nn.Linear(k3.ones({2, 2}, {dtype = 'bf16'}), {bias = k3.ones({2})})",
                "Linear: bias (f32 on cpu) must have the weight's dtype and device (bf16 on cpu)")
      at_caller("nn.SwiGLU(k3.ones({4, 2}), 5)", "SwiGLU: down must be a tensor or a k3.nn.Linear (got number)")
      at_caller("nn.SwiGLU(k3.ones({4, 2}), k3.ones({2, 2}), {fuse = false})",
                "SwiGLU: unknown option 'fuse' (expected gate_up_method, down_method or fused)")
      at_caller("nn.SwiGLU(k3.ones({4, 2}, {dtype = 'bf16'}), k3.ones({2, 2}))",
                "SwiGLU: gate_up (bf16 on cpu) and down (f32 on cpu) must share dtype and device")
      -- a freed input is named as the argument it is
      local xf = k3.randn({2, 8})
      xf:free()
      local _, ef = pcall(call, lin, xf)
      assert.equal("caller.lua:2: bad argument #1 to 'Linear' (tensor has been freed)", ef)
      -- the swiglu layer's ops too
      local mlp = nn.SwiGLU(k3.randn({8, 6}), k3.randn({6, 4}))
      local call2 = assert(load("local mlp, x = ...\nlocal y = mlp(x)\nreturn y\n", "@caller.lua"))
      local _, e2 = pcall(call2, mlp, k3.randn({3, 5}))
      assert.matches("^caller%.lua:2: linear: x dim 2 %(5%) must match w dim 2 %(6%)", e2)
    end)
    for _, dtype in ipairs({"bf16", "f32", "f64"}) do
      it("matches the f64 product in " .. dtype .. ", with and without bias, strided x", function()
        local w = k3.randn({33, 20}, {dtype = dtype, seed = 1})
        local b = k3.randn({33}, {dtype = dtype, seed = 2})
        local xbase = k3.randn({5, 27}, {dtype = dtype, seed = 3})
        for _, x in ipairs({xbase:narrow(2, 1, 20):contiguous(), xbase:narrow(2, 4, 20)}) do
          local ref = matmul_t(x:totable(), w:totable())
          local lin = nn.Linear(w)
          local y = lin(x)
          assert.are.same({5, 33}, y:size())
          assert.are.equal(dtype, y:dtype())
          assert.is_true(max_rel(y:totable(), ref) <= tol[dtype])
          local lb = nn.Linear(w, {bias = b})
          local yb, bt = lb(x):totable(), b:totable()
          for i = 1, 5 do for n = 1, 33 do ref[i][n] = ref[i][n] + bt[n] end end
          assert.is_true(max_rel(yb, ref) <= tol[dtype])
        end
      end)
    end

    it("is the same call as k3.linear, bit for bit", function()
      local w = k3.randn({64, 48}, {dtype = "bf16", seed = 4})
      local x = k3.randn({7, 48}, {dtype = "bf16", seed = 5})
      assert.are.equal(0, k3.max_abs_diff(nn.Linear(w)(x), k3.linear(x, w)))
    end)

    it("gets the default method when no plan covers the weight", function()
      local w = k3.randn({16, 8}, {dtype = "bf16", seed = 6})
      local lin = nn.Linear(w)
      assert.is_nil(k3.plan_for(w)) -- a CPU weight has no low-latency plan
      local x = k3.randn({2, 8}, {dtype = "bf16", seed = 7})
      assert.are.same(k3.method.default():explain(x, w).chosen, lin.method:explain(x, w).chosen)
      assert.are.equal("Linear(8 -> 16, bf16)", tostring(lin))
      assert.are.equal("16x8", lin:shape_key())
    end)

    it("prints as freed once its weights are freed", function()
      local lin = nn.Linear(k3.randn({16, 8}, {seed = 8}))
      lin:free()
      assert.are.equal("Linear(freed)", tostring(lin))
      local norm = nn.RMSNorm(k3.ones({8}))
      norm:free()
      assert.are.equal("RMSNorm(freed)", tostring(norm))
      local mlp = nn.SwiGLU(k3.randn({16, 8}, {seed = 9}), k3.randn({8, 8}, {seed = 10}))
      mlp:free()
      assert.are.equal("SwiGLU(freed)", tostring(mlp))
    end)

    it("takes the low-latency method when k3.plan_for has a plan, and its fallback serves a CPU input", function()
      local w = k3.randn({16, 8}, {dtype = "bf16", seed = 6})
      local x = k3.randn({2, 8}, {dtype = "bf16", seed = 7})
      local saved = k3.plan_for
      k3.plan_for = function() return {[2] = {kernel = "skinny"}} end
      local ok, lin = pcall(nn.Linear, w)
      k3.plan_for = saved
      assert.is_true(ok, tostring(lin))
      local e = lin.method:explain(x, w)
      assert.are.equal("cuda.linear.skinny", e.declined[1].kernel)
      assert.are.equal(k3.method.default():explain(x, w).chosen, e.chosen)
      -- the real fallback path runs and gives the default method's result
      assert.are.equal(0, k3.max_abs_diff(lin(x), k3.method.default():apply(x, w)))
    end)

    it("k3.plan_for takes {epilogue = \"silu_mul\"}, and refuses other options by name", function()
      local w = k3.randn({16, 8}, {dtype = "bf16", seed = 6})
      assert.is_nil(k3.plan_for(w, {epilogue = "silu_mul"})) -- no plan for a CPU weight
      assert.is_nil(k3.plan_for(w, {}))
      local function msg(...)
        local ok, err = pcall(k3.plan_for, ...)
        assert.is_false(ok)
        return tostring(err)
      end
      assert.matches("bad argument #2 to 'plan_for' (field 'epilogue' must be \"silu_mul\" or nil; got \"gelu\")",
                     msg(w, {epilogue = "gelu"}), 1, true)
      assert.matches("bad argument #2 to 'plan_for' (unknown option 'prologue' (expected epilogue))",
                     msg(w, {prologue = "silu_mul"}), 1, true)
      assert.matches("bad argument #2 to 'plan_for' (table or nil expected, got number)", msg(w, 5), 1, true)
    end)

    it("SwiGLU's gate_up asks for the plan of its fused call; fused = false for the plain one", function()
      local gu = k3.randn({16, 8}, {dtype = "bf16", seed = 6})
      local down = k3.randn({8, 8}, {dtype = "bf16", seed = 9})
      local asked, ok, err = plan_lookups(function()
        nn.SwiGLU(gu, down)
        nn.SwiGLU(gu, down, {fused = false})
      end)
      assert.is_true(ok, tostring(err))
      assert.are.same({{rows = 16, epilogue = "silu_mul"}, {rows = 8}, {rows = 16}, {rows = 8}}, asked)
      -- a bad fused option is refused before any method is built (no weight marked static)
      local ok2, err2 = pcall(nn.SwiGLU, gu, down, {fused = "yes"})
      assert.is_false(ok2)
      assert.matches("SwiGLU: fused must be a boolean (got string)", tostring(err2), 1, true)
    end)

    it("SwiGLU:to keeps asking for the fused call's plan for its gate_up", function()
      local mlp = nn.SwiGLU(k3.randn({16, 8}, {seed = 6}), k3.randn({8, 8}, {seed = 9}))
      local plain = nn.SwiGLU(k3.randn({16, 8}, {seed = 6}), k3.randn({8, 8}, {seed = 9}), {fused = false})
      local asked, ok, err = plan_lookups(function()
        mlp:to("bf16")
        plain:to("bf16")
      end)
      assert.is_true(ok, tostring(err))
      assert.are.same({{rows = 16, epilogue = "silu_mul"}, {rows = 8}, {rows = 16}, {rows = 8}}, asked)
    end)

    it("nn.default_method refuses an options value or name it does not know, naming its own argument", function()
      local w = k3.randn({16, 8}, {seed = 6})
      H.raises(function() nn.default_method(w, nil, {epilog = "silu_mul"}) end,
               "bad argument #3 to 'default_method' (unknown option 'epilog' (expected epilogue))")
      H.raises(function() nn.default_method(w, nil, "silu_mul") end,
               "bad argument #3 to 'default_method' (table or nil expected, got string)")
      H.raises(function() nn.default_method(w, nil, {epilogue = "gelu"}) end,
               "bad argument #3 to 'default_method' (field 'epilogue' must be \"silu_mul\" or nil; got \"gelu\")")
      assert.is_not_nil(nn.default_method(w, nil, {epilogue = "silu_mul"}))
      assert.is_not_nil(nn.default_method(w, nil, {}))
    end)

    it("an explicit method is used as given", function()
      local w = k3.randn({4, 4}, {seed = 8})
      local m = k3.method.default()
      assert.are.equal(m, nn.Linear(w, {method = m}).method)
    end)

    it("a call's argument errors name the layer and its own argument numbers, at the caller's line", function()
      local lin = nn.Linear(k3.randn({4, 8}))
      local x = k3.randn({2, 8})
      local function refused(xx, opts, want) assert.equal("caller.lua:2: " .. want, H.caller_error(lin, xx, opts)) end
      refused(nil, nil, "bad argument #1 to 'Linear' (k3.Tensor expected, got nil)")
      refused(5, nil, "bad argument #1 to 'Linear' (k3.Tensor expected, got number)")
      -- out is left as it was: every refusal comes before the method runs
      local out = H.poisoned({2, 4})
      refused(x, {outt = out},
              "bad argument #2 to 'Linear' (unknown option 'outt' (expected residual, prologue, norm_weight, eps, epilogue or out))")
      refused(x, {out = out, epilogue = "gelu"},
              "bad argument #2 to 'Linear' (field 'epilogue' must be \"silu_mul\" or nil; got \"gelu\")")
      refused(x, {out = out, prologue = "norm"},
              "bad argument #2 to 'Linear' (field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got \"norm\")")
      refused(x, {out = 1}, "bad argument #2 to 'Linear' (field 'out' must be a k3.Tensor; got number)")
      refused(x, {residual = {}}, "bad argument #2 to 'Linear' (field 'residual' must be a k3.Tensor; got table)")
      refused(x, 5, "bad argument #2 to 'Linear' (table or nil expected, got number)")
      for _, row in ipairs(out:totable()) do
        for _, v in ipairs(row) do assert.is_true(v ~= v, "out was written") end
      end
      -- a layer called by a model inside k3 is placed at the model's caller too
      local mlp = nn.SwiGLU(k3.randn({8, 8}), k3.randn({8, 4}))
      assert.equal("caller.lua:2: bad argument #1 to 'Linear' (k3.Tensor expected, got nil)", H.caller_error(mlp))
      -- a good call still runs
      assert.are.same({2, 4}, lin(x, {out = k3.empty({2, 4})}):size())
    end)

    it("refuses a freed weight, bias or layer tensor by name", function()
      local function freed(shape)
        local t = k3.ones(shape)
        t:free()
        return t
      end
      H.raises_exact(function() nn.Linear(freed({2, 2})) end, "Linear: weight is a freed tensor")
      H.raises_exact(function() nn.Linear(k3.ones({2, 2}), {bias = freed({2})}) end, "Linear: bias is a freed tensor")
      H.raises_exact(function() nn.RMSNorm(freed({2})) end, "RMSNorm: weight is a freed tensor")
      H.raises_exact(function() nn.SwiGLU(k3.ones({4, 2}), freed({2, 2})) end, "SwiGLU: down is a freed tensor")
      assert.equal("caller.lua:2: Linear: weight is a freed tensor", H.caller_error(nn.Linear, freed({2, 2})))
    end)

    it("rejects a weight that is not 2-D or not a tensor", function()
      H.raises(function() nn.Linear(k3.zeros({4})) end, "Linear: weight must be 2-D [N, K] (got 1 dims)")
      H.raises(function() nn.Linear("w") end, "Linear: weight must be a tensor (got string)")
      H.raises(function() nn.Linear(io.stdout) end, "Linear: weight must be a tensor (got userdata)")
    end)

    it("rejects a bias that is not a 1-D tensor of N elements when the layer is built", function()
      local w = k3.zeros({3, 2})
      H.raises(function() nn.Linear(w, {bias = k3.zeros({2})}) end,
               "Linear: bias must be 1-D [3] (got shape [2])")
      H.raises(function() nn.Linear(w, {bias = k3.zeros({1, 3})}) end,
               "Linear: bias must be 1-D [3] (got shape [1, 3])")
      H.raises(function() nn.Linear(w, {bias = 1}) end, "Linear: bias must be a tensor (got number)")
    end)

    it("converts to f64 exactly with :to", function()
      local w = k3.randn({8, 6}, {dtype = "bf16", seed = 9})
      local l64 = nn.Linear(w):to("f64")
      assert.are.equal("f64", l64.weight:dtype())
      assert.is_true(H.nested_equal(w:totable(), l64.weight:totable()))
    end)
  end)

  describe("RMSNorm", function()
    it("takes k3.rms_norm's options: out and kernel, and refuses others", function()
      local norm = nn.RMSNorm(k3.randn({4}, {seed = 12}), 1e-6)
      local x = k3.randn({2, 4}, {seed = 13})
      local out = H.poisoned({2, 4})
      assert.is_true(rawequal(norm(x, {out = out, kernel = "cpu.rms_norm.reference"}), out))
      assert.equal(0, k3.max_abs_diff(out, k3.rms_norm(x, norm.weight, 1e-6)))
      H.raises(function() norm(x, {bogus = 1}) end, "unknown option 'bogus' (expected out or kernel)")
    end)
    for _, dtype in ipairs({"bf16", "f32", "f64"}) do
      it("matches x * rsqrt(mean(x^2) + eps) * w in " .. dtype .. " on padded rows", function()
        local base = k3.randn({3, 40}, {dtype = dtype, seed = 10})
        local x = base:narrow(2, 2, 33)
        local w = k3.randn({33}, {dtype = dtype, seed = 11})
        local norm = nn.RMSNorm(w, 1e-5)
        local y = norm(x):totable()
        local xt, wt = x:totable(), w:totable()
        local ref = {}
        for i = 1, 3 do
          local ss = 0
          for d = 1, 33 do ss = ss + xt[i][d] ^ 2 end
          local r = 1 / math.sqrt(ss / 33 + 1e-5)
          ref[i] = {}
          for d = 1, 33 do ref[i][d] = xt[i][d] * r * wt[d] end
        end
        assert.is_true(max_rel(y, ref) <= tol[dtype])
      end)
    end

    it("defaults eps to 1e-5", function()
      assert.are.equal(1e-5, nn.RMSNorm(k3.ones({4})).eps)
    end)

    it("rejects a weight that is not 1-D and an eps that is not a finite number >= 0", function()
      H.raises(function() nn.RMSNorm(k3.ones({2, 4})) end, "RMSNorm: weight must be 1-D (got shape [2, 4])")
      H.raises(function() nn.RMSNorm({}) end, "RMSNorm: weight must be a tensor (got table)")
      H.raises(function() nn.RMSNorm(k3.ones({4}), -1) end, "RMSNorm: eps must be a finite number >= 0 (got -1)")
      H.raises(function() nn.RMSNorm(k3.ones({4}), 0 / 0) end, "RMSNorm: eps must be a finite number >= 0 (got")
      H.raises(function() nn.RMSNorm(k3.ones({4}), "1e-5") end, "RMSNorm: eps must be a finite number >= 0 (got 1e-5)")
    end)
  end)

  describe("SwiGLU", function()
    for _, dtype in ipairs({"bf16", "f32", "f64"}) do
      it("is down(silu(gate) * up) with gate and up from one gate_up in " .. dtype, function()
        local Hd, I = 24, 40
        local gu = k3.randn({2 * I, Hd}, {dtype = dtype, seed = 12}) * 0.2
        local down = k3.randn({Hd, I}, {dtype = dtype, seed = 13}) * 0.2
        local x = k3.randn({4, Hd}, {dtype = dtype, seed = 14})
        local mlp = nn.SwiGLU(gu, down)
        local y = mlp(x)
        assert.are.same({4, Hd}, y:size())
        -- reference from the same rounded intermediates the layer sees
        local h = matmul_t(x:totable(), gu:totable())
        local g = {}
        for i = 1, 4 do
          g[i] = {}
          for j = 1, I do
            local a, b = h[i][j], h[i][I + j]
            g[i][j] = a / (1 + math.exp(-a)) * b
          end
        end
        local ref = matmul_t(g, down:totable())
        assert.is_true(max_rel(y:totable(), ref) <= 2 * tol[dtype])
      end)
    end

    it("accepts Linear objects and checks that the shapes chain", function()
      local gu = nn.Linear(k3.randn({16, 8}, {seed = 1}))
      local down = nn.Linear(k3.randn({8, 8}, {seed = 2}))
      assert.are.equal("SwiGLU(8 -> 8 -> 8)", tostring(nn.SwiGLU(gu, down)))
      H.raises(function() nn.SwiGLU(k3.randn({16, 8}), k3.randn({8, 6})) end,
               "SwiGLU: gate_up has 16 output features, expected 2 * down's 6 input features = 12")
      H.raises(function() nn.SwiGLU(k3.randn({16, 8}), k3.randn({7, 8})) end,
               "SwiGLU: gate_up takes 8 features but down returns 7")
    end)

    it("runs gate_up with the gate as its epilogue and down, nothing else; fused = false adds silu_mul", function()
      local gu, down = k3.randn({16, 8}, {seed = 1}), k3.randn({8, 8}, {seed = 2})
      local x = k3.randn({3, 8}, {seed = 3})
      local function ops_of(mlp)
        local ops = {}
        for _, r in ipairs(k3.trace(function() mlp(x) end)) do ops[#ops + 1] = r.op end
        return ops
      end
      assert.are.same({"linear", "linear"}, ops_of(nn.SwiGLU(gu, down)))
      -- gate_up's call asks for the epilogue and writes h [M, I]; down runs plainly on it
      local calls = {}
      local gate_up, dn = nn.Linear(gu), nn.Linear(down)
      for _, lin in ipairs({gate_up, dn}) do
        local m = lin.method
        lin.method = setmetatable({}, {__index = {apply = function(_, xx, w, b, o)
          local y = m:apply(xx, w, b, o)
          calls[#calls + 1] = {epilogue = o and o.epilogue, prologue = o and o.prologue, size = y:size()}
          return y
        end}})
      end
      nn.SwiGLU(gate_up, dn)(x)
      assert.are.same({{epilogue = "silu_mul", size = {3, 8}}, {size = {3, 8}}}, calls)
      assert.are.same({"linear", "silu_mul", "linear"}, ops_of(nn.SwiGLU(gu, down, {fused = false})))
      H.raises(function() nn.SwiGLU(gu, down, {fused = "yes"}) end, "SwiGLU: fused must be a boolean (got string)")
    end)

    for _, dtype in ipairs({"bf16", "f16", "f32", "f64"}) do
      it("fused and unfused give the same bits in " .. dtype .. ", and after :to", function()
        local gu = k3.randn({48, 24}, {dtype = dtype, seed = 21}) * 0.3
        local down = k3.randn({24, 24}, {dtype = dtype, seed = 22}) * 0.3
        local x = k3.randn({5, 24}, {dtype = dtype, seed = 23})
        local fused, unfused = nn.SwiGLU(gu, down), nn.SwiGLU(gu, down, {fused = false})
        assert.equal(0, k3.max_abs_diff(fused(x), unfused(x)))
        local f64 = fused:to("f64")
        assert.is_true(f64.fused)
        assert.equal(0, k3.max_abs_diff(f64(x:to("f64")), unfused:to("f64")(x:to("f64"))))
      end)
    end
  end)
end)

describe("k3.nn printing", function()
  it("every layer prints through __tostring, also inside k3.inspect", function()
    local lin = nn.Linear(k3.zeros({8, 16}, {dtype = "bf16"}))
    assert.are.equal("Linear(16 -> 8, bf16)", tostring(lin))
    assert.are.equal("Linear(16 -> 8, f32, bias)", tostring(nn.Linear(k3.zeros(8, 16), {bias = k3.zeros(8)})))
    assert.are.equal("RMSNorm(7168, eps=1e-05, bf16)", tostring(nn.RMSNorm(k3.ones(7168, {dtype = "bf16"}))))
    assert.are.equal("RMSNorm(4, eps=1e-06, f32)", tostring(nn.RMSNorm(k3.ones(4), 1e-6)))
    assert.are.equal("SwiGLU(8 -> 4 -> 8)", tostring(nn.SwiGLU(k3.zeros(8, 8), k3.zeros(8, 4))))
    assert.are.equal("{Linear(16 -> 8, bf16), norm = RMSNorm(4, eps=1e-05, f32)}",
                     k3.inspect({lin, norm = nn.RMSNorm(k3.ones(4))}))
  end)

  it("tensor-parallel layers print their shard", function()
    local P = require "k3.nn.parallel"
    local w = k3.zeros(16, 8)
    assert.are.equal("ColumnParallelLinear(8 -> 16, shard 1/2: 8 rows, f32)",
                     tostring(P.ColumnParallelLinear(w, {rank = 1, world_size = 2})))
    assert.truthy(tostring(P.RowParallelLinear(w, {rank = 0, world_size = 2})):find("^RowParallelLinear%(8 %-> 16, shard 0/2"))
  end)

  it("k3.nn is the module require 'k3.nn' returns", function()
    assert.are.equal(nn, k3.nn)
  end)
end)
