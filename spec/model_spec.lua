-- The AttnRes stream and the Kimi-K3 stack: the 93-layer bookkeeping against a plain walk
-- of the schedule, the fused stream against an unfused plain-Lua AttnRes in f64, depth
-- fidelity of the tiny stack in bf16 against its fp64 twin (per-layer prefix cosines
-- reported), weight-table, option, configuration and input errors, and safetensors save/load
-- reproducing the demo bit for bit.
local k3 = require "k3"
local H = require "spec.helpers"
local Stream = require "k3.model.attn_res_stream"
local kimi = require "k3.model.kimi_k3"

-- A stack with Kimi-K3's schedule (93 layers, block 12) but toy widths, for bookkeeping.
local function k3_schedule_config()
  return kimi.config("kimi-k3-tp8", {
    hidden_size = 16, q_lora_rank = 8, kv_lora_rank = 4, qk_rope_head_dim = 2, num_heads = 2,
    qk_nope_head_dim = 4, v_head_dim = 4, intermediate_size = 8, weight_sets = false,
  })
end

local function small_config(over)
  local c = kimi.config("tiny", {
    name = "small", hidden_size = 16, num_layers = 9, block_size = 4, q_lora_rank = 8,
    kv_lora_rank = 4, qk_rope_head_dim = 2, num_heads = 2, qk_nope_head_dim = 4, v_head_dim = 4,
    intermediate_size = 24,
  })
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

-- TAP comment lines, so run-specs' summary ignores them.
local function note(fmt, ...) io.write("# ", string.format(fmt, ...), "\n") end

describe("AttnRes stream", function()
  it("a plain walk of the Kimi-K3 schedule: 8 seals, 185 layer reads + 1 final = 186 reads", function()
    local c = Stream.expected_counts(93, 12)
    assert.are.equal(8, c.seals)
    assert.are.same({0, 12, 24, 36, 48, 60, 72, 84}, c.seal_layers)
    assert.are.equal(185, c.layer_reads)
    assert.are.equal(1, c.final_reads)
    assert.are.equal(186, c.reads)
    assert.are.equal(1, c.skipped_reads)  -- layer 0's pre-attention read: nothing sealed yet
    assert.are.equal(7, c.fused_seals)    -- every seal but the embedding's rides on a read
    assert.are.equal(8, Stream.num_seals(93, 12))
  end)

  it("the 93-layer stack's stream does exactly the plain walk's bookkeeping", function()
    local cfg = k3_schedule_config()
    local stack = kimi.build(cfg, kimi.generate_weights(cfg, {dtype = "f32"}))
    local x = kimi.embedding(cfg, 2, {dtype = "f32"})
    local out, stream
    local trace = k3.trace(function() out, stream = stack:forward(x) end)
    local want = Stream.expected_counts(93, 12)
    for _, k in ipairs({"reads", "layer_reads", "final_reads", "skipped_reads", "seals", "fused_seals"}) do
      assert.are.equal(want[k], stream.counts[k], k)
    end
    -- every read carries a delta (186: 185 layer reads + the final one); it is fused into
    -- the read except for the first read after each seal, where the empty block takes a copy
    assert.are.equal(186 - 8, stream.counts.fused_deltas)
    assert.are.equal(8, stream.counts.copied_deltas)
    -- each block written once, by the layer the schedule says
    assert.are.same({[1] = 0, [2] = 12, [3] = 24, [4] = 36, [5] = 48, [6] = 60, [7] = 72, [8] = 84},
                    stream.written)
    assert.are.equal(8, stream.num_sealed)
    local ops = {}
    for _, r in ipairs(trace) do ops[r.op] = (ops[r.op] or 0) + 1 end
    assert.are.equal(186, ops.attn_res)
    assert.are.equal(93 * 5, ops.linear)   -- qkv_a, q_b, o_proj, gate_up, down
    assert.is_nil(ops.silu_mul)           -- the SwiGLU gate is gate_up's epilogue
    assert.are.equal(1, ops.rms_norm)      -- layer 0's skipped read (q_a_layernorm is q_b's prologue)
    assert.are.same({2, 16}, out:size())
    assert.is_false(H.has_nan(out))
  end)

  it("blocks are write-once", function()
    local s = Stream.new{tokens = 1, hidden_size = 4, num_layers = 8, block_size = 4, dtype = "f32"}
    s:begin(k3.ones({1, 4}))
    s:seal(0)
    s.num_sealed = 0 -- pretend the seal was forgotten
    H.raises(function() s:seal(4) end,
             "AttnResStream: block 1 already sealed at layer 0 (write-once), sealing again at layer 4")
  end)

  it("refuses more seals than slots and reads after the final read", function()
    local s = Stream.new{tokens = 1, hidden_size = 4, num_layers = 4, block_size = 4, dtype = "f32"}
    s:begin(k3.ones({1, 4}))
    s:seal(0)
    H.raises(function() s:seal(4) end, "AttnResStream: seal at layer 4 needs block 2 but the stream has 1 slots")
    local q = {norm_weight = k3.ones({4}), qk_weight = k3.ones({4})}
    s:final(q, k3.ones({1, 4}))
    H.raises(function() s:final(q, k3.ones({1, 4})) end, "AttnResStream: read after the final read")
  end)

  -- The unfused semantics in plain Lua (DESIGN.md's formula, lists of blocks, the reference
  -- pseudo-code's order), with the stack's own f64 modules for attention and MLP.
  it("the fused stream equals an unfused plain-Lua AttnRes walk in f64", function()
    local cfg = small_config()
    local weights = kimi.generate_weights(cfg, {dtype = "f64", seed = 5})
    local stack = kimi.build(cfg, weights)
    local T, Hd = 3, cfg.hidden_size
    local x = kimi.embedding(cfg, T, {dtype = "f64", seed = 5})
    local got = stack:forward(x):totable()

    local function vec(name) return weights[name]:totable() end
    local function read(blocks, partial, nw, qk, onw)
      local out = {}
      for t = 1, T do
        local src = {}
        for _, b in ipairs(blocks) do src[#src + 1] = b[t] end
        src[#src + 1] = partial[t]
        local logits, mx = {}, -math.huge
        for s, v in ipairs(src) do
          local dot, ss = 0, 0
          for d = 1, Hd do dot, ss = dot + v[d] * nw[d] * qk[d], ss + v[d] * v[d] end
          logits[s] = dot / math.sqrt(ss / Hd + 1e-5)
          mx = math.max(mx, logits[s])
        end
        local z = 0
        for s = 1, #src do logits[s] = math.exp(logits[s] - mx); z = z + logits[s] end
        local mixed, ss = {}, 0
        for d = 1, Hd do
          local m = 0
          for s, v in ipairs(src) do m = m + logits[s] / z * v[d] end
          mixed[d], ss = m, ss + m * m
        end
        local r = 1 / math.sqrt(ss / Hd + 1e-5)
        out[t] = {}
        for d = 1, Hd do out[t][d] = mixed[d] * r * onw[d] end
      end
      return out
    end
    local function rms(v, w)
      local out = {}
      for t = 1, T do
        local ss = 0
        for d = 1, Hd do ss = ss + v[t][d] ^ 2 end
        local r = 1 / math.sqrt(ss / Hd + 1e-5)
        out[t] = {}
        for d = 1, Hd do out[t][d] = v[t][d] * r * w[d] end
      end
      return out
    end
    local function add(a, b)
      local out = {}
      for t = 1, T do
        out[t] = {}
        for d = 1, Hd do out[t][d] = a[t][d] + b[t][d] end
      end
      return out
    end
    local function run(module, v) return module(k3.tensor(v, {dtype = "f64"})):totable() end

    local blocks, partial = {}, x:totable()
    for l = 0, cfg.num_layers - 1 do
      local p = "model.layers." .. l .. "."
      local layer = stack.layers[l + 1]
      local h
      if #blocks == 0 then
        h = rms(partial, vec(p .. "input_layernorm.weight"))
      else
        h = read(blocks, partial, vec(p .. "attn_res.norm.weight"), vec(p .. "attn_res.proj.weight"),
                 vec(p .. "input_layernorm.weight"))
      end
      if l % cfg.block_size == 0 then
        blocks[#blocks + 1] = partial
        partial = nil
      end
      local a = run(layer.attn, h)
      partial = partial and add(partial, a) or a
      h = read(blocks, partial, vec(p .. "mlp_res.norm.weight"), vec(p .. "mlp_res.proj.weight"),
               vec(p .. "post_attention_layernorm.weight"))
      partial = add(partial, run(layer.mlp, h))
    end
    assert.are.equal(3, #blocks) -- layers 0, 4, 8
    local want = read(blocks, partial, vec "model.final_res.norm.weight",
                      vec "model.final_res.proj.weight", vec "model.norm.weight")
    local worst = 0
    for t = 1, T do
      for d = 1, Hd do worst = math.max(worst, math.abs(got[t][d] - want[t][d])) end
    end
    assert.is_true(worst < 1e-12, "max |fused - plain| = " .. worst)
  end)
end)

describe("Kimi-K3 stack", function()
  it("depth fidelity: tiny in bf16 against its fp64 twin", function()
    local cfg = kimi.config("tiny")
    local stack = kimi.build(cfg, kimi.generate_weights(cfg, {seed = 1234}))
    local x = kimi.embedding(cfg, 8, {seed = 1234, step = 1})
    local prefixes = {}
    local y = stack:forward(x, {on_layer = function(i, s) prefixes[i] = s:current_prefix():to("f64") end})
    local cosines = {}
    local ref = stack:reference_forward(x, {on_layer = function(i, s)
      cosines[i] = k3.cosine(prefixes[i], s:current_prefix())
    end})
    local line = {}
    for i = 0, cfg.num_layers - 1 do line[#line + 1] = string.format("%d:%.6f", i, cosines[i]) end
    note("tiny bf16 vs f64, prefix cosine after each layer's post-attention read: %s", table.concat(line, " "))
    local y64 = y:to("f64")
    assert.is_false(H.has_nan(y64))
    assert.is_true(k3.max_abs_diff(y64, y64) == 0, "non-finite values in the bf16 output")
    local demo = require "k3.model.decode_demo"
    local rel, ratio = demo.compare(y, ref)
    local cos = k3.cosine(y64, ref)
    note("final hidden state: cosine %.7f, relative error %.3e, norm ratio %.5f", cos, rel, ratio)
    assert.is_true(demo.finite(y))
    assert.is_true(math.abs(ratio - 1) <= 0.02, "norm ratio " .. ratio)
    -- measured 0.99996 on this stack; the bound leaves room for kernel changes
    assert.is_true(cos >= 0.9998, "cosine " .. cos)
    for i = 0, cfg.num_layers - 1 do assert.is_true(cosines[i] >= 0.999, "layer " .. i) end
  end)

  it("the step's bits are the same with the SwiGLU gate as gate_up's epilogue and as a separate silu_mul", function()
    for _, dtype in ipairs({"bf16", "f32", "f64"}) do
      local cfg = small_config()
      local stack = kimi.build(cfg, kimi.generate_weights(cfg, {seed = 4321, dtype = dtype}))
      local x = kimi.embedding(cfg, 3, {seed = 4321, step = 1, dtype = dtype})
      for _, layer in ipairs(stack.layers) do assert.is_true(layer.mlp.fused, dtype) end
      local fused = stack:forward(x)
      for _, layer in ipairs(stack.layers) do layer.mlp.fused = false end
      local unfused = stack:forward(x)
      assert.is_false(H.has_nan(fused), dtype)
      assert.equal(dtype, fused:dtype())
      assert.equal(0, k3.max_abs_diff(fused, unfused), dtype .. ": fused and unfused steps differ")
    end
  end)

  it("weights: a missing tensor and a wrong shape are named", function()
    local cfg = small_config()
    local w = kimi.generate_weights(cfg, {dtype = "f32"})
    local saved = w["model.layers.3.mlp.down_proj.weight"]
    w["model.layers.3.mlp.down_proj.weight"] = nil
    H.raises(function() kimi.build(cfg, w) end, "kimi_k3: weights: missing 'model.layers.3.mlp.down_proj.weight'")
    w["model.layers.3.mlp.down_proj.weight"] = saved:t()
    H.raises(function() kimi.build(cfg, w) end,
             "kimi_k3: weights: 'model.layers.3.mlp.down_proj.weight' has shape [24, 16], the config needs [16, 24]")
    H.raises(function() kimi.config("huge") end, "kimi_k3: unknown config 'huge' (known: kimi-k3-tp8, tiny)")
  end)

  it("generate_weights, embedding and build refuse an unknown option, naming it and the ones they take", function()
    local cfg = small_config()
    local w = kimi.generate_weights(cfg, {seed = 3})
    local before = k3.memory().host_allocations
    local function refused(want, ...) assert.equal("caller.lua:2: " .. want, H.caller_error(...)) end
    refused("bad argument #2 to 'kimi_k3.generate_weights' (unknown option 'sed' (expected seed, dtype, device or progress))",
            kimi.generate_weights, cfg, {sed = 99})
    refused("bad argument #2 to 'kimi_k3.generate_weights' (unknown option 'dtyp' (expected seed, dtype, device or progress))",
            kimi.generate_weights, cfg, {dtyp = "f32"})
    refused("bad argument #3 to 'kimi_k3.embedding' (unknown option 'devce' (expected seed, step, dtype or device))",
            kimi.embedding, cfg, 1, {devce = "cpu"})
    refused("bad argument #2 to 'kimi_k3.embedding' (tokens must be a positive integer; got 0)", kimi.embedding, cfg, 0)
    refused("bad argument #3 to 'kimi_k3.build' (unknown option 'devce' (expected dtype or device))",
            kimi.build, cfg, w, {devce = "cpu"})
    refused("bad argument #2 to 'kimi_k3.build' (a {name = tensor} table of weights expected, got nil)", kimi.build, cfg)
    assert.equal(before, k3.memory().host_allocations) -- nothing was generated or converted
  end)

  it("a configuration is checked: every size a positive integer, no unknown field", function()
    local w = kimi.generate_weights(small_config(), {seed = 3})
    H.raises_exact(function() kimi.build({hidden_size = 3}, w) end,
                   "kimi_k3.build: config field 'num_layers' must be a positive integer; got nil")
    H.raises_exact(function() kimi.build(small_config({q_lora_rank = 0}), w) end,
                   "kimi_k3.build: config field 'q_lora_rank' must be a positive integer; got 0")
    H.raises_exact(function() kimi.build(small_config({num_heads = 2.5}), w) end,
                   "kimi_k3.build: config field 'num_heads' must be a positive integer; got 2.5")
    H.raises_exact(function() kimi.build(small_config({eps = -1}), w) end,
                   "kimi_k3.build: config field 'eps' must be a finite number > 0 or nil; got -1")
    H.raises_exact(function() kimi.build(small_config({weight_sets = 0}), w) end,
                   "kimi_k3.build: config field 'weight_sets' must be a positive integer, false or nil; got 0")
    H.raises_exact(function() kimi.config("tiny", {num_layer = 2}) end,
                   "kimi_k3.config: unknown config field 'num_layer' (expected name, hidden_size, num_layers, " ..
                   "block_size, q_lora_rank, kv_lora_rank, qk_rope_head_dim, num_heads, qk_nope_head_dim, " ..
                   "v_head_dim, intermediate_size, eps or weight_sets)")
    H.raises_exact(function() kimi.generate_weights({hidden_size = 3}) end,
                   "kimi_k3.generate_weights: config field 'num_layers' must be a positive integer; got nil")
    H.raises_exact(function() kimi.embedding({}, 1) end,
                   "kimi_k3.embedding: config field 'hidden_size' must be a positive integer; got nil")
    -- the built-in configurations are left as they were
    assert.equal(256, kimi.configs.tiny.hidden_size)
    assert.is_nil(kimi.configs.tiny.num_layer)
  end)

  it("Stack:forward names its argument, the shape and dtype it takes and what it got, at the caller's line", function()
    local cfg = small_config()
    local stack = kimi.build(cfg, kimi.generate_weights(cfg, {seed = 3}))
    local want = "caller.lua:2: Stack:forward: x must be [M, hidden_size] = [M, 16] bf16 on cpu (M >= 1 tokens); got "
    local freed = k3.zeros({1, 16}, {dtype = "bf16"})
    freed:free()
    for _, c in ipairs({
      {k3.zeros({1, 15}, {dtype = "bf16"}), "[1, 15] bf16 on cpu"},
      {k3.zeros({16}, {dtype = "bf16"}), "[16] bf16 on cpu"},
      {k3.zeros({0, 16}, {dtype = "bf16"}), "[0, 16] bf16 on cpu"},
      {k3.zeros({2, 17}, {dtype = "f32"}), "[2, 17] f32 on cpu"},
      {nil, "nil"},
      {freed, "a freed tensor"},
    }) do
      assert.equal(want .. c[2], H.caller_error(stack.forward, stack, c[1]))
    end
    local x = kimi.embedding(cfg, 2, {seed = 3})
    assert.equal("caller.lua:2: bad argument #2 to 'Stack:forward' (unknown option 'on_layr' (expected on_layer))",
                 H.caller_error(stack.forward, stack, x, {on_layr = print}))
    H.raises_exact(function() stack:reference_forward(k3.zeros({1, 15}, {dtype = "bf16"})) end,
                   "Stack:reference_forward: x must be [M, hidden_size] = [M, 16] bf16 on cpu (M >= 1 tokens); got [1, 15] bf16 on cpu")
    -- nothing ran: no stream was made, and the stack still runs
    assert.is_nil(next(stack.streams))
    assert.are.same({2, 16}, stack:forward(x):size())
  end)

  it("weights follow model.layers.<i>.<module>.weight; generation is reproducible", function()
    local cfg = small_config()
    local names = kimi.weight_names(cfg)
    assert.are.equal(9 * 12 + 3, #names)
    for _, n in ipairs(names) do
      assert.truthy(n:match("^model%.layers%.%d+%.[%w_.]+%.weight$") or n:match("^model%.[%w_.]+%.weight$"), n)
    end
    local a = kimi.generate_weights(cfg, {seed = 9})
    local b = kimi.generate_weights(cfg, {seed = 9})
    for _, n in ipairs(names) do assert.are.equal(0, k3.max_abs_diff(a[n], b[n]), n) end
  end)

  it("the kimi-k3-tp8 config has DESIGN.md's TP8 projection shapes", function()
    local specs = kimi.weight_specs(kimi.config("kimi-k3-tp8"))
    local p = "model.layers.92."
    assert.are.same({2112, 7168}, specs[p .. "self_attn.qkv_a_proj.weight"].shape)
    assert.are.same({2304, 1536}, specs[p .. "self_attn.q_b_proj.weight"].shape)
    assert.are.same({7168, 1536}, specs[p .. "self_attn.o_proj.weight"].shape)
    assert.are.same({8448, 7168}, specs[p .. "mlp.gate_up_proj.weight"].shape)
    assert.are.same({7168, 4224}, specs[p .. "mlp.down_proj.weight"].shape)
    assert.is_nil(specs["model.layers.93.mlp.down_proj.weight"])
  end)

  it("weights are scaled like a real stack: out projections 1/sqrt(fan_in * L), the stream bounded over depth", function()
    local cfg = kimi.config("tiny")
    local specs = kimi.weight_specs(cfg)
    local w = kimi.generate_weights(cfg, {seed = 7, dtype = "f32"})
    local L = cfg.num_layers
    local function std(t) -- root mean square of a 2-D weight (mean ~0), summed in Lua
      local ss, n = 0, t:numel()
      for _, row in ipairs(t:totable()) do
        for _, x in ipairs(row) do ss = ss + x * x end
      end
      return math.sqrt(ss / n)
    end
    local function max_abs(t) return k3.max_abs_diff(t, t * 0) end
    for _, name in ipairs{"model.layers.0.self_attn.o_proj.weight", "model.layers.5.mlp.down_proj.weight",
                          "model.layers.3.mlp.gate_up_proj.weight"} do
      local sp = specs[name]
      local want = sp.kind == "out" and 1 / math.sqrt(sp.fan_in * L) or 1 / math.sqrt(sp.fan_in)
      local got = std(w[name])
      -- thousands of samples: the std is within 5% of its target
      assert.is_true(math.abs(got / want - 1) < 0.05, string.format("%s: std %.4g, want %.4g", name, got, want))
    end
    -- Each module adds ~1/sqrt(L) of the stream's scale, so the prefix norm grows slowly:
    -- after all L layers it stays within a small factor of the embedding's.
    local stack = kimi.build(cfg, w)
    local x = kimi.embedding(cfg, 4, {seed = 7, step = 1})
    local x64 = x:to("f64")
    local first, last
    stack:forward(x, {on_layer = function(i, st)
      local p = st:current_prefix():to("f64")
      local r = max_abs(p)
      if i == 0 then first = r end
      last = r
      assert.is_true(r == r and r < math.huge, "layer " .. i .. " not finite")
    end})
    local x_max = max_abs(x64)
    note("tiny: max |x| %.3g, max |prefix| after layer 0 %.3g, after layer %d %.3g", x_max, first, L - 1, last)
    assert.is_true(last < 8 * x_max, string.format("prefix grew to %.3g from %.3g", last, x_max))
  end)

  it("the demo's CLI: --save-weights then --weights prints the same table but the times", function()
    local root = H.root()
    local path = os.tmpname()
    local cmd = string.format("%q %q --config tiny --m 1,3 --steps 1 --quiet ", root .. "/scripts/k3",
                              root .. "/scripts/demo.lua")
    local a, ca = H.sh(cmd .. "--save-weights " .. path)
    local b, cb = H.sh(cmd .. "--weights " .. path)
    os.remove(path)
    assert.are.equal(0, ca, a)
    assert.are.equal(0, cb, b)
    -- The header names where the weights came from; the ms/step column is a time (on a CUDA
    -- device two: the graph step's and the eager step's).
    local function norm(out)
      return (out:gsub("weights [^\n]*\n", "weights …\n")
                 :gsub("\n(%s*%d+)%s+[%d.]+%s+[%d.]+(%s)", "\n%1 ms ms%2")
                 :gsub("\n(%s*%d+)%s+[%d.]+(%s)", "\n%1 ms%2"))
    end
    local header = k3.backends().cuda.available
      and "\n  M    graph ms    eager ms   nodes   bits      rel err      cosine  kernels (calls per step)\n"
      or "\n  M     ms/step      rel err      cosine  kernels (calls per step)\n"
    assert.truthy(a:find(header, 1, true), a)
    assert.truthy(a:find("\ndispatch summary over all timed and traced steps:\n", 1, true), a)
    assert.truthy(a:find("weights generated, seed 1234", 1, true), a)
    assert.truthy(b:find("weights from " .. path, 1, true), b)
    assert.are.equal(norm(a), norm(b))
  end)

  it("saving the generated weights and loading them back reproduces the demo bit for bit", function()
    local demo = require "k3.model.decode_demo"
    local path = os.tmpname()
    local opts = {config = "tiny", device = "cpu", steps = 2, m = {1, 3, 16}, quiet = true}
    local a = demo.run(setmetatable({save_weights = path}, {__index = opts}))
    local loaded = k3.load_safetensors(path)
    os.remove(path)
    local n = 0
    for _ in pairs(loaded) do n = n + 1 end
    assert.are.equal(#kimi.weight_names(kimi.config("tiny")), n)
    local b = demo.run(setmetatable({weights = loaded}, {__index = opts}))
    assert.are.equal(0, k3.max_abs_diff(a.reference, b.reference))
    for i, ra in ipairs(a.rows) do
      local rb = b.rows[i]
      assert.are.equal(ra.m, rb.m)
      assert.are.equal(0, k3.max_abs_diff(ra.output, rb.output))
      assert.are.equal(ra.rel_err, rb.rel_err)
      assert.are.equal(ra.cosine, rb.cosine)
      assert.are.same(ra.kernels, rb.kernels)
    end
  end)
end)

describe("AttnRes stream and errors", function()
  it("the AttnRes stream is unchanged by a read that raises", function()
    local Stream = require "k3.model.attn_res_stream"
    local Hd = 4
    local st = Stream.new{tokens = 1, hidden_size = Hd, num_layers = 4, block_size = 2,
                          dtype = "f32"}
    st:begin(k3.ones({1, Hd}))
    local good = {norm_weight = k3.ones({Hd}), qk_weight = k3.ones({Hd})}
    local bad = {norm_weight = k3.ones({Hd + 1}), qk_weight = k3.ones({Hd})}
    st:pre_attention(0, good)
    st:post_attention(0, good, k3.ones({1, Hd}))
    st:pre_attention(1, good, k3.ones({1, Hd}))
    st:post_attention(1, good, k3.ones({1, Hd}))
    local before = st.num_sealed
    -- layer 2 seals: the bad query raises, and the seal must not be recorded
    H.raises(function() st:pre_attention(2, bad, k3.ones({1, Hd})) end, "norm_weight")
    assert.equal(before, st.num_sealed)
    local out = st:pre_attention(2, good, k3.ones({1, Hd}))
    assert.same({1, Hd}, out:size())
    assert.equal(before + 1, st.num_sealed)
  end)
end)
