-- attn_res: cpu.attn_res.reference against a plain-Lua fp64 transcription of DESIGN.md, the
-- fused delta write-back, write_block, num_blocks 0..S, output norm or none, padded rows,
-- dtypes, and the text of every error a caller can hit.
local k3 = require "k3"
local H = require "spec.helpers"

-- DESIGN.md's formula in fp64 on Lua tables (1-based; write_block nil = no write). Returns
-- out. The key and output norms go through H.rms_f64, so the oracle itself cannot overflow
-- or underflow: a key logit is dot(v / s, nw qk) * r for (s, r) = H.rms_f64(v, eps).
local function oracle(a)
  local function f64(t) return t and t:to("cpu"):to("f64"):totable() end
  local prefix, blocks, delta = f64(a.prefix), f64(a.blocks), f64(a.delta)
  local nw, qk, onw = f64(a.norm_weight), f64(a.qk_weight), f64(a.output_norm_weight)
  local eps, oeps = a.eps or 1e-5, a.output_eps or 1e-5
  local T, Hd = #prefix, #prefix[1]
  local out = {}
  for t = 1, T do
    local p = prefix[t]
    if delta then
      -- the sum rounded to the tensor dtype: done by the caller's check, here via k3
      local row = {}
      for d = 1, Hd do row[d] = p[d] + delta[t][d] end
      p = k3.tensor({row}, {dtype = a.prefix:dtype()}):to("f64"):totable()[1]
      prefix[t] = p
    end
    if a.write_block then blocks[t][a.write_block] = p end
    local src = {}
    for s = 1, a.num_blocks do src[s] = blocks[t][s] end
    src[#src + 1] = p
    local logits, mx = {}, -math.huge
    for s, v in ipairs(src) do
      local sc, r = H.rms_f64(v, eps)
      local dot = 0
      for d = 1, Hd do dot = dot + v[d] / sc * nw[d] * qk[d] end
      logits[s] = dot * r
      mx = math.max(mx, logits[s])
    end
    local sum = 0
    for s = 1, #src do logits[s] = math.exp(logits[s] - mx); sum = sum + logits[s] end
    local mixed = {}
    for d = 1, Hd do
      local m = 0
      for s, v in ipairs(src) do m = m + logits[s] / sum * v[d] end
      mixed[d] = m
    end
    if onw then
      local sc, r = H.rms_f64(mixed, oeps)
      for d = 1, Hd do mixed[d] = mixed[d] / sc * r * onw[d] end
    end
    out[t] = mixed
  end
  return k3.tensor(out, {dtype = "f64"})
end

-- Inputs: prefix/delta/out rows padded by `pad`, blocks [T, S, H] with padded rows too.
local function inputs(T, S, Hd, o)
  o = o or {}
  local dt, pad = o.dtype or "f32", o.pad or 0
  local blocks_base = k3.randn({T, S, Hd + pad}, {dtype = dt, seed = 31})
  local a = {
    prefix = H.padded(T, Hd, pad, {dtype = dt, seed = 32}),
    delta = o.delta ~= false and H.padded(T, Hd, pad, {dtype = dt, seed = 33}) or nil,
    blocks = blocks_base:narrow(3, 1, Hd),
    num_blocks = o.num_blocks or S,
    write_block = o.write_block,
    norm_weight = k3.randn({Hd}, {dtype = dt, seed = 34}) * 0.5 + 1,
    qk_weight = k3.randn({Hd}, {dtype = dt, seed = 35}) * 0.1,
    output_norm_weight = o.no_output_norm and nil or (k3.randn({Hd}, {dtype = dt, seed = 36}) * 0.1 + 1),
  }
  if o.out ~= false then
    a.out = H.padded(T, Hd, pad, {dtype = dt, seed = 37})
    a.out:fill(0 / 0)
  end
  return a
end

local function copy_args(a)
  local c = {}
  for k, v in pairs(a) do c[k] = v end
  return c
end

describe("attn_res", function()
  it("the C reference equals the Lua fp64 transcription (f64 tensors)", function()
    for _, case in ipairs({
      {T = 3, S = 4, H = 33, num_blocks = 4, write_block = 2},
      {T = 2, S = 3, H = 5, num_blocks = 0},
      {T = 4, S = 5, H = 17, num_blocks = 3, write_block = 5, no_output_norm = true, delta = false},
    }) do
      local a = inputs(case.T, case.S, case.H, {dtype = "f64", pad = 3, num_blocks = case.num_blocks,
        write_block = case.write_block, no_output_norm = case.no_output_norm, delta = case.delta})
      local want = oracle(copy_args(a))
      local y = k3.attn_res(a)
      assert.is_false(H.has_nan(y))
      assert.is_true(k3.max_abs_diff(y, want) < 1e-12)
    end
  end)

  for _, dt in ipairs({"bf16", "f16", "f32"}) do
    it(dt .. ": T=17, 5 blocks, rows padded by 7 match the reference and fp64", function()
      local a = inputs(17, 5, 132, {dtype = dt, pad = 7, write_block = 3})
      local a64 = {}
      for k, v in pairs(a) do a64[k] = k3.is_tensor(v) and v:to("f64") or v end
      a64.out = nil
      local want = oracle(copy_args(a)) -- on the inputs before the call updates them
      local y = k3.attn_res(a)
      assert.is_false(H.has_nan(y))
      local ref64 = k3.attn_res(a64) -- the same kernel in fp64
      assert.is_true(k3.allclose(y:to("f64"), ref64, {atol = 8e-2, rtol = 3e-2}))
      local tight = dt == "f32" and 1e-4 or dt == "f16" and 1e-2 or 4e-2
      assert.is_true(k3.max_abs_diff(y:to("f64"), want) < tight)
    end)
  end

  -- Zero-stride broadcast inputs (read only): a delta of one row expanded to T rows, and
  -- blocks of one token expanded to T tokens (read with write_block nil; written, they are
  -- refused: see "errors").
  for _, dt in ipairs({"bf16", "f32", "f64"}) do
    it(dt .. ": an expanded delta and expanded blocks match the reference on fp64 and the Lua fp64 oracle", function()
      local T, S, Hd = 6, 4, 33
      for _, which in ipairs({"delta", "blocks", "both"}) do
        local a = inputs(T, S, Hd, {dtype = dt, pad = 3, num_blocks = 3})
        if which ~= "blocks" then
          a.delta = k3.randn({1, Hd}, {dtype = dt, seed = 38}):expand({T, Hd})
          assert.same({0, 1}, a.delta:stride())
        end
        if which ~= "delta" then
          a.blocks = k3.randn({1, S, Hd}, {dtype = dt, seed = 39}):expand({T, S, Hd})
          assert.same({0, Hd, 1}, a.blocks:stride())
        end
        local a64 = {}
        for k, v in pairs(a) do a64[k] = k3.is_tensor(v) and v:to("f64") or v end
        a64.out = nil
        local want = oracle(copy_args(a)) -- on the inputs before the call updates prefix
        local ref64 = k3.attn_res(a64)    -- cpu.attn_res.reference on fp64 copies
        local blocks_before = a.blocks:clone()
        local y = k3.attn_res(a)
        assert.is_false(H.has_nan(y))
        local what = dt .. " expanded " .. which
        if dt == "f64" then
          assert.is_true(k3.max_abs_diff(y, want) < 1e-12, what)
          assert.is_true(k3.max_abs_diff(y, ref64) < 1e-12, what)
        else
          assert.is_true(k3.allclose(y:to("f64"), ref64, {atol = 8e-2, rtol = 3e-2}), what)
          local tight = dt == "f32" and 1e-4 or 4e-2
          assert.is_true(k3.max_abs_diff(y:to("f64"), want) < tight, what)
        end
        assert.equal(0, k3.max_abs_diff(a.blocks, blocks_before), what) -- blocks only read
      end
    end)
  end

  it("writes prefix back exactly as bf16(prefix + delta)", function()
    local a = inputs(5, 3, 33, {dtype = "bf16", pad = 7})
    local want = (a.prefix:to("f64") + a.delta:to("f64")):to("bf16")
    k3.attn_res(a)
    assert.equal(0, k3.max_abs_diff(a.prefix, want))
  end)

  it("writes the block slot exactly and leaves every other slot untouched", function()
    local a = inputs(4, 5, 33, {dtype = "bf16", pad = 2, write_block = 4, num_blocks = 2})
    local before = a.blocks:clone()
    k3.attn_res(a)
    for s = 1, 5 do
      local got, old = a.blocks:select(2, s), before:select(2, s)
      if s == 4 then
        assert.equal(0, k3.max_abs_diff(got, a.prefix)) -- the updated prefix
      else
        assert.equal(0, k3.max_abs_diff(got, old))
      end
    end
  end)

  it("a written block within num_blocks is read after the write", function()
    local a = inputs(3, 4, 17, {dtype = "f64", write_block = 1, num_blocks = 2})
    local want = oracle(copy_args(a))
    assert.is_true(k3.max_abs_diff(k3.attn_res(a), want) < 1e-12)
  end)

  it("num_blocks = 0 equals rms_norm(prefix), or the prefix without an output norm", function()
    for _, dt in ipairs({"bf16", "f32"}) do
      local a = inputs(6, 3, 132, {dtype = dt, pad = 7, num_blocks = 0, delta = false})
      local y = k3.attn_res(a)
      assert.is_false(H.has_nan(y))
      local want = k3.rms_norm(a.prefix, a.output_norm_weight, 1e-5)
      assert.equal(0, k3.max_abs_diff(y, want))
      a.output_norm_weight = nil
      a.out:fill(0 / 0)
      assert.equal(0, k3.max_abs_diff(k3.attn_res(a), a.prefix))
    end
  end)

  it("static_weights and static_blocks (what a PDL launch may load early) leave the result as it is", function()
    local a = inputs(3, 6, 16, {write_block = 4})
    local c = copy_args(a)
    c.prefix, c.blocks, c.out = a.prefix:clone(), a.blocks:clone(), nil
    local want = k3.attn_res(c)
    a.static_weights, a.static_blocks = true, 3
    local got = k3.attn_res(a)
    assert.equal(0, k3.max_abs_diff(got, want))
    assert.equal(0, k3.max_abs_diff(a.prefix, c.prefix))
    assert.equal(0, k3.max_abs_diff(a.blocks, c.blocks))
  end)

  it("allocates out when none is given", function()
    local a = inputs(2, 2, 8, {out = false})
    local y = k3.attn_res(a)
    assert.same({2, 8}, y:size())
    assert.equal("f32", y:dtype())
  end)

  it("dispatch picks cpu.attn_res.reference on the CPU and says why the others declined", function()
    local a = inputs(2, 2, 8)
    local e = k3.explain("attn_res", a)
    assert.equal("cpu.attn_res.reference", e.chosen)
    if not k3.backends().cuda.available then
      assert.same({{kernel = "cuda.attn_res.decode", reason = H.cuda_absent_reason()},
                   {kernel = "cuda.attn_res.ring", reason = H.cuda_absent_reason()},
                   {kernel = "cuda.attn_res.stream", reason = H.cuda_absent_reason()},
                   {kernel = "cuda.attn_res.generic", reason = H.cuda_absent_reason()}}, e.declined)
    end
  end)

  it("explain writes nothing (prefix, blocks and out untouched)", function()
    local a = inputs(3, 3, 8, {write_block = 1})
    local p, b = a.prefix:clone(), a.blocks:clone()
    k3.explain("attn_res", a)
    assert.equal(0, k3.max_abs_diff(p, a.prefix))
    assert.equal(0, k3.max_abs_diff(b, a.blocks))
    assert.is_true(H.has_nan(a.out))
  end)

  describe("errors", function()
    -- change(a) breaks one argument; the call must raise `text` and modify nothing.
    local function bad(change, text)
      local a = inputs(4, 5, 8)
      local prefix, blocks = a.prefix, a.blocks
      local p, b = prefix:clone(), blocks:clone()
      change(a)
      H.raises(function() k3.attn_res(a) end, text)
      assert.equal(0, k3.max_abs_diff(p, prefix))
      assert.equal(0, k3.max_abs_diff(b, blocks))
    end

    it("num_blocks outside 0..S", function()
      bad(function(a) a.num_blocks = 6 end, "attn_res: num_blocks must be in 0..5 (blocks dim 2); got 6")
      bad(function(a) a.num_blocks = -1 end, "attn_res: num_blocks must be in 0..5 (blocks dim 2); got -1")
    end)
    it("write_block outside 1..S", function()
      bad(function(a) a.write_block = 6 end, "attn_res: write_block must be in 1..5 (blocks dim 2); got 6")
      bad(function(a) a.write_block = 0 end, "attn_res: write_block must be in 1..5 (blocks dim 2); got 0")
    end)
    it("wrong ranks", function()
      bad(function(a) a.prefix = k3.randn({4, 8, 1}) end, "attn_res: prefix must be 2-D [T, H]; got 3-D [4, 8, 1]")
      bad(function(a) a.blocks = k3.randn({4, 8}) end, "attn_res: blocks must be 3-D [T, S, H]; got 2-D [4, 8]")
    end)
    it("mismatched T and H", function()
      bad(function(a) a.blocks = k3.randn({3, 5, 8}) end, "attn_res: blocks dim 1 (3) must match prefix dim 1 (4)")
      bad(function(a) a.blocks = k3.randn({4, 5, 9}) end, "attn_res: blocks dim 3 (9) must match prefix dim 2 (8)")
      bad(function(a) a.delta = k3.randn({4, 9}) end, "attn_res: delta must be [T, H] = [4, 8] (prefix); got [4, 9]")
    end)
    it("weights of the wrong length", function()
      bad(function(a) a.norm_weight = k3.randn({7}) end, "attn_res: norm_weight must be [H] = [8] (prefix dim 2); got [7]")
      bad(function(a) a.qk_weight = k3.randn({8, 1}) end, "attn_res: qk_weight must be [H] = [8] (prefix dim 2); got [8, 1]")
      bad(function(a) a.output_norm_weight = k3.randn({9}) end,
        "attn_res: output_norm_weight must be [H] = [8] (prefix dim 2); got [9]")
    end)
    it("dtype mismatch", function()
      bad(function(a) a.delta = k3.randn({4, 8}, {dtype = "bf16"}) end,
        "attn_res: delta dtype (bf16) must match prefix dtype (f32)")
      bad(function(a) a.blocks = k3.randn({4, 5, 8}, {dtype = "f64"}) end,
        "attn_res: blocks dtype (f64) must match prefix dtype (f32)")
      bad(function(a) a.out = k3.empty({4, 8}, {dtype = "bf16"}) end, "attn_res: out dtype (bf16) must be f32")
    end)
    it("non-unit last stride", function()
      bad(function(a) a.delta = k3.randn({8, 4}):t() end,
        "attn_res: delta must have unit stride in its last dim; got strides [1, 4]")
      bad(function(a) a.blocks = k3.randn({4, 8, 5}):transpose(2, 3) end,
        "attn_res: blocks must have unit stride in its last dim; got strides [40, 1, 5]")
    end)
    it("out shape and overlap", function()
      bad(function(a) a.out = k3.empty({4, 9}) end, "attn_res: out must be [4, 8]; got [4, 9]")
      bad(function(a) a.out = a.prefix end, "attn_res: out overlaps prefix")
      bad(function(a) a.prefix = a.blocks:select(2, 1) end, "attn_res: prefix (updated by delta) overlaps blocks")
      bad(function(a) a.write_block = 2; a.norm_weight = a.blocks:select(1, 1):select(1, 2) end,
        "attn_res: blocks (write_block) overlaps norm_weight")
    end)
    it("written tensors whose elements overlap (broadcast views)", function()
      bad(function(a) a.prefix = k3.randn({1, 8}):expand({4, 8}) end,
        "attn_res: prefix is written but its elements overlap (shape [4, 8], strides [0, 1])")
      bad(function(a) a.write_block = 1; a.blocks = k3.randn({1, 5, 8}):expand({4, 5, 8}) end,
        "attn_res: blocks (write_block) is written but its elements overlap (shape [4, 8], strides [0, 1])")
      bad(function(a) a.out = k3.empty({8, 4}):t() end,
        "attn_res: out must have unit stride in its last dim; got strides [1, 4]")
    end)
    it("write_block with no blocks at all", function()
      bad(function(a) a.blocks = k3.empty({4, 0, 8}); a.num_blocks = 0; a.write_block = 1 end,
        "attn_res: write_block must be nil: blocks dim 2 is 0; got 1")
    end)
    it("static_blocks outside 0..num_blocks, covering write_block; static_weights not a boolean", function()
      bad(function(a) a.num_blocks = 4; a.static_blocks = 5 end,
        "attn_res: static_blocks must be in 0..4 (num_blocks); got 5")
      bad(function(a) a.static_blocks = -1 end, "attn_res: static_blocks must be in 0..5 (num_blocks); got -1")
      bad(function(a) a.write_block = 2; a.static_blocks = 2 end,
        "attn_res: static_blocks (2) covers write_block 2: the slot this call writes cannot be loaded before the wait")
      bad(function(a) a.static_weights = 1 end,
        "bad argument #1 to 'attn_res' (field 'static_weights' must be a boolean; got number)")
    end)
    it("eps", function()
      bad(function(a) a.eps = -1 end, "attn_res: eps must be a finite number >= 0; got -1")
      bad(function(a) a.output_eps = 0 / 0 end, "attn_res: output_eps must be a finite number >= 0")
    end)
    it("a missing required field (Lua argument error)", function()
      local a = inputs(2, 2, 8)
      a.qk_weight = nil
      H.raises(function() k3.attn_res(a) end, "bad argument #1 to 'attn_res' (field 'qk_weight' must be a k3.Tensor; got nil)")
    end)
  end)
end)

-- write_block into blocks whose rows share memory (as_strided views): the written slot may not
-- touch any row the call reads (another slot, another token's slot), or the result would
-- depend on the order tokens run in; a layout where it does not is accepted and gives
-- DESIGN.md's answer.
describe("attn_res write_block aliasing", function()
  -- blocks [T, S, H] with strides {s0, s1, 1} over one storage of f64 values; the rest fresh.
  local function aliased(T, S, Hd, s0, s1, nb, wb)
    local storage = k3.randn({(T - 1) * s0 + (S - 1) * s1 + Hd}, {dtype = "f64", seed = 41})
    local a = {
      prefix = k3.randn({T, Hd}, {dtype = "f64", seed = 42}),
      blocks = storage:as_strided({T, S, Hd}, {s0, s1, 1}, 0),
      num_blocks = nb, write_block = wb,
      norm_weight = k3.randn({Hd}, {dtype = "f64", seed = 43}) * 0.5 + 1,
      qk_weight = k3.randn({Hd}, {dtype = "f64", seed = 44}),
    }
    return a, storage
  end

  it("refuses the two layouts where token order changed the result, naming the strides", function()
    local a, storage = aliased(1, 3, 4, 12, 0, 2, 2)
    local before = storage:clone()
    H.raises_exact(function() k3.attn_res(a) end,
      "attn_res: write_block 2 would overwrite memory the call reads: blocks[1, 2, :] shares " ..
      "elements with blocks[1, 1, :] (blocks strides [12, 0, 1], hidden_size 4)")
    assert.equal(0, k3.max_abs_diff(before, storage))
    a, storage = aliased(2, 3, 4, 4, 4, 1, 2)
    H.raises_exact(function() k3.attn_res(a) end,
      "attn_res: write_block 2 would overwrite memory the call reads: blocks[1, 2, :] shares " ..
      "elements with blocks[2, 1, :] (blocks strides [4, 4, 1], hidden_size 4)")
    -- k3.explain validates the same way before it asks any kernel
    H.raises_exact(function() k3.explain("attn_res", a) end,
      "attn_res: write_block 2 would overwrite memory the call reads: blocks[1, 2, :] shares " ..
      "elements with blocks[2, 1, :] (blocks strides [4, 4, 1], hidden_size 4)")
  end)

  -- Brute force over element addresses (0-based t, slot, d) of blocks [T, S, Hd] with strides
  -- {s0, s1, 1}: whether two tokens' written elements share memory, and whether a written
  -- element shares memory with a read element (slot < nb) other than itself.
  local function brute_force(T, Hd, s0, s1, nb, wb)
    local function addr(t, sl, d) return t * s0 + sl * s1 + d end
    local written_twice, hit, seen, read = false, false, {}, {}
    for t = 0, T - 1 do
      for sl = 0, nb - 1 do
        for d = 0, Hd - 1 do
          local x = addr(t, sl, d)
          read[x] = (read[x] or 0) + 1
        end
      end
    end
    for t = 0, T - 1 do
      for d = 0, Hd - 1 do
        local x = addr(t, wb - 1, d)
        written_twice = written_twice or seen[x] ~= nil
        seen[x] = true
        -- read elsewhere: more reads of x than the one of this very element (when slot wb is read)
        hit = hit or (read[x] or 0) > (wb - 1 < nb and 1 or 0)
      end
    end
    return written_twice, hit, addr
  end

  -- One layout: the call is refused with the written-overlap error, refused naming a real
  -- overlapping pair and the strides, or accepted with DESIGN.md's answer. Returns the outcome.
  local function check_layout(T, S, Hd, s0, s1, nb, wb)
    local written_twice, hit, addr = brute_force(T, Hd, s0, s1, nb, wb)
    local a = aliased(T, S, Hd, s0, s1, nb, wb)
    local what = ("T=%d S=%d H=%d strides {%d, %d, 1} nb=%d wb=%d"):format(T, S, Hd, s0, s1, nb, wb)
    local want = not written_twice and not hit and oracle(copy_args(a)) or nil
    local ok, y = pcall(k3.attn_res, a)
    if written_twice then
      assert(not ok and tostring(y):find("is written but its elements overlap", 1, true), what .. ": " .. tostring(y))
      return "written twice"
    elseif hit then
      assert(not ok, what .. ": accepted")
      local w1, w2, r1, r2 = tostring(y):match(
        "would overwrite memory the call reads: blocks%[(%d+), (%d+), :%] shares elements with blocks%[(%d+), (%d+), :%]")
      assert(w1, what .. ": " .. tostring(y))
      w1, w2, r1, r2 = tonumber(w1) - 1, tonumber(w2) - 1, tonumber(r1) - 1, tonumber(r2) - 1
      -- the named witness is real: a read row other than the written one, sharing an element
      assert(w2 == wb - 1 and r2 < nb and (r1 ~= w1 or r2 ~= w2), what)
      assert(math.abs(addr(w1, w2, 0) - addr(r1, r2, 0)) < Hd, what)
      assert(tostring(y):find(("(blocks strides [%d, %d, 1], hidden_size %d)"):format(s0, s1, Hd), 1, true), what)
      return "refused"
    end
    assert(ok, what .. ": " .. tostring(y))
    assert(k3.max_abs_diff(y, want) < 1e-12, what)
    return "accepted"
  end

  it("is exact on every small layout: refused iff the written slot meets a read row (brute force); accepted ones match the fp64 formula", function()
    local count = {}
    for T = 1, 3 do
      for S = 1, 3 do
        for Hd = 1, 3 do
          for _, s0 in ipairs({0, 1, 2, 3, 5, 9}) do
            for _, s1 in ipairs({0, 1, 2, 3, 4, 7}) do
              for nb = 0, S do
                for wb = 1, S do
                  local outcome = check_layout(T, S, Hd, s0, s1, nb, wb)
                  count[outcome] = (count[outcome] or 0) + 1
                end
              end
            end
          end
        end
      end
    end
    assert.is_true((count.refused or 0) > 100 and (count.accepted or 0) > 100,
      ("%d refused, %d accepted"):format(count.refused or 0, count.accepted or 0))
  end)
end)

-- out, prefix and blocks as strided views of one storage: a written operand is refused iff it
-- shares an element with another operand's rows the call uses (brute force over element
-- addresses), and an accepted layout gives DESIGN.md's answer.
describe("attn_res overlap of strided operands in one storage", function()
  local function elems(off, rows, stride, Hd, into)
    for t = 0, rows - 1 do
      for d = 0, Hd - 1 do into[off + t * stride + d] = true end
    end
    return into
  end
  it("out and prefix, out and blocks: refused iff an element is shared; accepted ones match the fp64 formula", function()
    local count = {}
    local T, S, Hd, nb = 2, 3, 3, 2
    for _, ps in ipairs({3, 4, 7}) do
      for _, os_ in ipairs({3, 4, 7}) do
        for off = 0, 12 do
          -- out at `off` with row stride os_ against prefix at 0 with row stride ps
          local storage = k3.randn({40}, {dtype = "f64", seed = 51})
          local a = {prefix = storage:as_strided({T, Hd}, {ps, 1}, 0),
                     blocks = k3.randn({T, S, Hd}, {dtype = "f64", seed = 52}), num_blocks = nb,
                     norm_weight = k3.randn({Hd}, {dtype = "f64", seed = 53}) * 0.5 + 1,
                     qk_weight = k3.randn({Hd}, {dtype = "f64", seed = 54}),
                     out = storage:as_strided({T, Hd}, {os_, 1}, off)}
          local pe, oe, shared = elems(0, T, ps, Hd, {}), elems(off, T, os_, Hd, {}), false
          for x in pairs(oe) do shared = shared or pe[x] == true end
          local c = copy_args(a)
          c.prefix, c.out = a.prefix:clone(), nil
          local want = not shared and oracle(c) or nil
          local ok, y = pcall(k3.attn_res, a)
          local what = ("prefix stride %d, out stride %d offset %d"):format(ps, os_, off)
          if shared then
            assert(not ok, what .. ": accepted")
            assert.equal(("attn_res: out overlaps prefix: out (shape [2, 3], strides [%d, 1]) and " ..
              "prefix (shape [2, 3], strides [%d, 1]) share memory"):format(os_, ps),
              (tostring(y):gsub("^[^\n]-%.lua:%d+: ", "", 1)))
          else
            assert(ok, what .. ": " .. tostring(y))
            assert(k3.max_abs_diff(y, want) < 1e-12, what)
          end
          count[shared and "refused" or "accepted"] = (count[shared and "refused" or "accepted"] or 0) + 1
        end
      end
    end
    assert.is_true(count.refused > 20 and count.accepted > 20, ("%d refused, %d accepted"):format(count.refused, count.accepted))
    -- out in a slot the call neither reads nor writes is accepted; in a read slot it is not
    local blocks = k3.randn({T, S, Hd}, {dtype = "f64", seed = 55})
    local a = {prefix = k3.randn({T, Hd}, {dtype = "f64", seed = 56}), blocks = blocks, num_blocks = 2,
               norm_weight = k3.randn({Hd}, {dtype = "f64", seed = 53}) + 2,
               qk_weight = k3.randn({Hd}, {dtype = "f64", seed = 54}), out = blocks:select(2, 3)}
    local c = copy_args(a)
    c.blocks, c.out = blocks:clone(), nil
    local want = oracle(c)
    assert(k3.max_abs_diff(k3.attn_res(a), want) < 1e-12)
    a.num_blocks = 3
    H.raises_exact(function() k3.attn_res(a) end,
      "attn_res: out overlaps blocks: out (shape [2, 3], strides [9, 1]) and blocks[:, 3, :] " ..
      "(blocks shape [2, 3, 3], strides [9, 3, 1]) share memory")
  end)
end)

-- Edge values: prefix, delta and blocks scaled far past where the fp32 (fp64 for f64) sums
-- of squares of the key norms and the output norm overflow or underflow (H.EDGE_SCALES); the
-- oracle's norms cannot overflow themselves.
local AR_TOL = {f32 = {1e-4, 1e-4}, bf16 = {8e-2, 3e-2}, f16 = {2e-2, 1e-2}, f64 = {1e-10, 1e-10}}

-- attn_res on `kernel` (tensors moved to `device`) for every scale of dtypes `dts`, eps 0 and
-- 1e-5: finite, equal to the oracle, and with eps 0 (every norm scale-invariant) equal to
-- the unscaled inputs' result wherever the scaled inputs are exact.
local function edge_attn_res(device, kernel, dts, o)
  o = o or {}
  for _, dt in ipairs(dts) do
    local T, S, Hd, nb = o.T or 3, 4, o.H or 64, 3
    local base = {
      prefix = k3.randn({T, Hd}, {dtype = dt, seed = 51}),
      delta = k3.randn({T, Hd}, {dtype = dt, seed = 52}),
      blocks = k3.randn({T, S, Hd}, {dtype = dt, seed = 53}),
    }
    local weights = {
      norm_weight = k3.randn({Hd}, {dtype = dt, seed = 54}) * 0.5 + 1,
      qk_weight = k3.randn({Hd}, {dtype = dt, seed = 55}) * 0.3,
      output_norm_weight = k3.randn({Hd}, {dtype = dt, seed = 56}) * 0.1 + 1,
    }
    local function args(sc, eps)
      local a = {num_blocks = nb, eps = eps, output_eps = eps, kernel = kernel,
                 write_block = o.write_block}
      for k, v in pairs(base) do a[k] = (v * sc):to(device) end
      for k, v in pairs(weights) do a[k] = v:to(device) end
      return a
    end
    local plain = k3.attn_res(args(1, 0)):to("cpu"):to("f64")
    for _, sc in ipairs(H.EDGE_SCALES[dt]) do
      for _, eps in ipairs({0, 1e-5}) do
        local a = args(sc, eps)
        local what = ("%s %s scale 2^%d eps %g"):format(kernel, dt, math.floor(math.log(sc, 2) + 0.5), eps)
        local want = oracle(a) -- on the inputs before the call updates prefix (and blocks)
        local y = k3.attn_res(a):to("cpu"):to("f64")
        assert(k3.max_abs_diff(y, y) == 0, what .. ": output not finite")
        local t = AR_TOL[dt]
        assert(k3.allclose(y, want, {atol = t[1], rtol = t[2]}), what .. ": max abs diff " .. k3.max_abs_diff(y, want))
        local exact = true
        for _, v in pairs(base) do exact = exact and H.scales_exactly(v, sc) end
        if eps == 0 and exact then
          assert(k3.allclose(y, plain, {atol = t[1], rtol = t[2]}), what .. ": not scale-invariant")
        end
      end
    end
  end
end

describe("attn_res edge values", function()
  it("key and output norms stay scale-invariant past the sums of squares' overflow and underflow on cpu.attn_res.reference", function()
    edge_attn_res("cpu", "cpu.attn_res.reference", {"f32", "bf16", "f64"})
    edge_attn_res("cpu", "cpu.attn_res.reference", {"f32"}, {write_block = 2})
  end)
end)

describe("attn_res edge values on the CUDA kernels #gpu", function()
  if not H.require_gpu() then return end
  it("cuda.attn_res.generic: the same cases", function()
    edge_attn_res("cuda", "cuda.attn_res.generic", {"f32", "bf16", "f64"})
    edge_attn_res("cuda", "cuda.attn_res.generic", {"f32"}, {write_block = 2})
  end)
  it("cuda.attn_res.decode, ring and stream: the same cases in bf16 and f16", function()
    for _, kern in ipairs({"cuda.attn_res.decode", "cuda.attn_res.ring", "cuda.attn_res.stream"}) do
      if not k3.has_kernel(kern) then
        pending(kern .. " is not registered in this build")
        return
      end
    end
    edge_attn_res("cuda", "cuda.attn_res.decode", {"bf16", "f16"})
    edge_attn_res("cuda", "cuda.attn_res.decode", {"bf16"}, {write_block = 4})
    -- the stream kernel's smallest prefill shape: T 64, H 1024
    edge_attn_res("cuda", "cuda.attn_res.stream", {"bf16", "f16"}, {T = 64, H = 1024})
    edge_attn_res("cuda", "cuda.attn_res.ring", {"bf16", "f16"}, {T = 64, H = 64})
  end)
end)

describe("attn_res decode kernel #gpu", function()
  it("raises its layout error on padded rows under policy 'error', falls back under 'fallback'", function()
    if not H.need_gpu(pending) then return end
    if not k3.has_kernel("cuda.attn_res.decode") then
      pending("cuda.attn_res.decode is not registered in this build")
      return
    end
    local Hd = 7168
    local a = inputs(3, 2, Hd, {dtype = "bf16", pad = 7, out = false})
    local g = {}
    for k, v in pairs(a) do g[k] = k3.is_tensor(v) and v:to("cuda") or v end
    g.prefix = H.padded(3, Hd, 7, {dtype = "bf16", device = "cuda", seed = 32})
    g.delta = H.padded(3, Hd, 7, {dtype = "bf16", device = "cuda", seed = 33})
    g.out = H.padded(3, Hd, 0, {dtype = "bf16", device = "cuda", seed = 34})
    H.raises(function() k3.attn_res(g) end,
      "attn_res: cuda.attn_res.decode requires densely packed rows; got strides 7175, 7175, 7168 for hidden_size 7168")
    local saved = k3.policy
    local p = {}
    for k, v in pairs(saved) do p[k] = v end
    p.on_layout_mismatch = "fallback"
    k3.set_policy(p)
    local ok, e = pcall(k3.explain, "attn_res", g)
    k3.set_policy(saved)
    assert.is_true(ok, tostring(e))
    assert.equal("cuda.attn_res.generic", e.chosen)
    assert.equal("cuda.attn_res.decode", e.declined[1].kernel)
  end)
end)

describe("attn_res arguments at the edges", function()
  it("tensors made by a proxy table's __index stay alive through the op", function()
    local mk = {
      prefix = function() return k3.ones({2, 4}) end,
      blocks = function() return k3.ones({2, 1, 4}) end,
      norm_weight = function() return k3.ones({4}) end,
      qk_weight = function() return k3.ones({4}) end,
      num_blocks = function() return 0 end,
    }
    local proxy = setmetatable({}, {__index = function(_, k)
      if k == "kernel" then collectgarbage(); collectgarbage(); return nil end
      return mk[k] and mk[k]()
    end})
    assert.same({{1, 1, 1, 1}, {1, 1, 1, 1}}, k3.attn_res(proxy):totable())
  end)

  it("a CPU attn_res whose scratch size overflows is refused, not written out of bounds", function()
    local Hd, S = (1 << 22) - 1, 1 << 40
    local b = k3.zeros({1, 1, Hd}, {dtype = "bf16"}):expand({1, S, Hd})
    local p = k3.ones({1, Hd}, {dtype = "bf16"})
    local w = k3.ones({Hd}, {dtype = "bf16"})
    H.raises(function()
      k3.attn_res{prefix = p, blocks = b, num_blocks = S - 1, norm_weight = w, qk_weight = w}
    end, "attn_res: cpu.attn_res.reference: scratch size overflows for num_blocks 1099511627775")
  end)

  it("num_blocks = 0 returns the prefix even when its logit is not finite", function()
    local out = k3.attn_res{prefix = k3.tensor({{3e38, 3e38, 1}}), blocks = k3.zeros({1, 1, 3}),
                            num_blocks = 0, norm_weight = k3.ones({3}), qk_weight = k3.ones({3})}
    assert.same(k3.tensor({{3e38, 3e38, 1}}):totable(), out:totable())
  end)

  it("write_block messages count from 1, as Lua does (the C core counts from 0)", function()
    local w = k3.ones({4})
    local args = {prefix = k3.ones({1, 4}), blocks = k3.ones({1, 3, 4}), num_blocks = 0,
                  norm_weight = w, qk_weight = w}
    args.write_block = 4
    H.raises(function() k3.attn_res(args) end, "attn_res: write_block must be in 1..3 (blocks dim 2); got 4")
    args.blocks, args.write_block = k3.ones({1, 0, 4}), 1
    H.raises(function() k3.attn_res(args) end, "attn_res: write_block must be nil: blocks dim 2 is 0; got 1")
  end)

  it("a NaN in a message prints as nan, whatever its sign bit", function()
    local w = k3.ones({4})
    local args = {prefix = k3.ones({1, 4}), blocks = k3.ones({1, 1, 4}), num_blocks = 1,
                  norm_weight = w, qk_weight = w}
    args.output_eps = 0 / 0
    local err = H.raises(function() k3.attn_res(args) end,
      "attn_res: output_eps must be a finite number >= 0; got nan")
    assert.is_nil(err:find("-nan", 1, true))
    args.output_eps, args.eps = nil, -(0 / 0)
    H.raises(function() k3.attn_res(args) end, "attn_res: eps must be a finite number >= 0; got nan")
  end)
end)
