-- k3.dist, the launcher (scripts/k3 --nproc), k3.nn.parallel and the Kimi-K3 TP stack.
-- CPU parts run everywhere: world size 1, the launcher with plain Lua ranks, and the sharding
-- arithmetic through k3.dist.simulate (ranks as coroutines with NCCL's semantics). The
-- `#multigpu` parts launch real ranks on two GPUs and skip with a reason elsewhere.
local k3 = require "k3"
local H = require "spec.helpers"
local P = require "k3.nn.parallel"

local root = (debug.getinfo(1, "S").source:gsub("^@", ""):match("^(.*)/spec/[^/]*$")) or "."
if root:sub(1, 1) ~= "/" then root = os.getenv("PWD") .. "/" .. root end

-- Writes `src` to a temporary Lua file; returns its path.
local function script(src)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(src)
  f:close()
  return path
end

-- Runs `scripts/k3 <args>` with stderr merged; returns output, exit code, seconds taken.
local function launch(args, env)
  local t0 = os.time()
  local out, code = H.sh(string.format("%s '%s/scripts/k3' %s", env or "", root, args))
  return out, code, os.time() - t0
end

local function ints(shape, seed, dtype, device)
  -- Integer-valued data (exact in bf16 up to 256): (i * 7 + seed) % 19 - 9.
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local flat = {}
  for i = 1, n do flat[i] = (i * 7 + seed) % 19 - 9 end
  return k3.tensor(flat, {dtype = dtype or "f32"}):view(shape):to(device or "cpu")
end

describe("k3.dist at world size 1", function()
  after_each(function() k3.dist.destroy() end)

  it("is rank 0 of 1 before and after init; collectives are checked no-ops", function()
    assert.are.equal(0, k3.dist.rank())
    assert.are.equal(1, k3.dist.world_size())
    assert.is_false(k3.dist.initialized())
    k3.dist.init{world_size = 1}
    assert.is_true(k3.dist.initialized())
    local t = ints({3, 4}, 1)
    local before = t:totable()
    assert.are.equal(t, k3.dist.all_reduce(t))
    assert.are.same(before, t:totable())
    local g = k3.dist.all_gather(t, 2)
    assert.are.same({3, 4}, g:size())
    assert.are.same(before, g:totable())
    k3.dist.barrier()
    assert.are.equal(0, k3.dist.stats().all_reduce.calls)
  end)

  it("names the problem: collectives before init, strided tensors, a second init, bad ranks", function()
    H.raises(function() k3.dist.all_reduce(k3.zeros({2})) end,
             "k3.dist.all_reduce: call k3.dist.init() first")
    k3.dist.init{world_size = 1}
    H.raises(function() k3.dist.all_reduce(k3.zeros({4, 6}):t()) end,
             "k3.dist.all_reduce: tensor must be contiguous (NCCL reads packed memory); got shape [6, 4] strides [1, 6]")
    H.raises(function() k3.dist.all_gather(k3.zeros({2, 2}), 3) end, "dim must be in 1..2; got 3")
    H.raises(function() k3.dist.all_reduce(k3.zeros({2}), "avg") end,
             "bad argument #2 to 'all_reduce' (unknown op 'avg'; expected sum, max or min)")
    H.raises(function() k3.dist.init() end, "k3.dist.init: already initialised as rank 0 of 1")
    k3.dist.destroy()
    H.raises(function() k3.dist.init{rank = 2, world_size = 2, dir = "/tmp"} end,
             "k3.dist.init: rank 2 is not in 0..1")
    H.raises(function() k3.dist.init{rank = 0, world_size = 2, dir = false} end, "field 'dir' must be a string")
    assert.is_false(k3.dist.initialized())
  end)

  it("needs the launcher's directory above world size 1", function()
    if os.getenv("K3_DIST_DIR") then return end
    H.raises(function() k3.dist.init{rank = 0, world_size = 2} end,
             "k3.dist.init: world size 2 needs K3_DIST_DIR (the directory where rank 0 leaves the NCCL id); start the ranks with scripts/k3 --nproc 2")
  end)
end)

describe("k3.dist.simulate", function()
  it("all-reduces and all-gathers integer data exactly, along any dim", function()
    for _, W in ipairs{2, 3, 4} do
      local res = k3.dist.simulate(W, function(r, d)
        local t = ints({2, 3}, r, "bf16")
        d.all_reduce(t)
        local m = ints({2, 3}, r)
        d.all_reduce(m, "max")
        return {t:totable(), d.all_gather(ints({2, 3}, r), 1):totable(),
                d.all_gather(ints({2, 3}, r), 2):totable(), m:totable()}
      end)
      for r = 1, W do
        local sum, mx = {}, {}
        for i = 1, 2 do
          sum[i], mx[i] = {}, {}
          for j = 1, 3 do
            sum[i][j], mx[i][j] = 0, -math.huge
            for q = 0, W - 1 do
              local v = ints({2, 3}, q):get(i, j)
              sum[i][j] = sum[i][j] + v
              mx[i][j] = math.max(mx[i][j], v)
            end
          end
        end
        assert.are.same(sum, res[r][1])
        assert.are.same(mx, res[r][4])
        for q = 0, W - 1 do
          local src = ints({2, 3}, q):totable()
          for i = 1, 2 do
            assert.are.same(src[i], res[r][2][q * 2 + i])
            for j = 1, 3 do assert.are.equal(src[i][j], res[r][3][i][q * 3 + j]) end
          end
        end
      end
    end
  end)

  it("fails every rank with each rank's call when shapes differ", function()
    local _, errs = k3.dist.simulate(2, function(r, d) d.all_reduce(k3.zeros({r + 1, 3})) end,
                                     {errors = "return"})
    local want = "k3.dist.all_reduce: the ranks' calls differ (every rank must make the same collective call with the same dtype and shape): rank 0: all_reduce(sum) of f32 [1, 3]; rank 1: all_reduce(sum) of f32 [2, 3]"
    assert.are.equal("rank 0: " .. want, errs[1])
    assert.are.equal("rank 1: " .. want, errs[2])
  end)

  it("a call, dtype or shape that differs on one rank of three fails all three alike", function()
    local cases = {
      {function(d) d.all_reduce(k3.zeros({2, 3})) end, function(d) d.all_reduce(k3.zeros({2, 3}), "max") end,
       "rank 0: all_reduce(sum) of f32 [2, 3]; rank 1: all_reduce(max) of f32 [2, 3]; rank 2: all_reduce(sum) of f32 [2, 3]"},
      {function(d) d.all_reduce(k3.zeros({4})) end, function(d) d.all_reduce(k3.zeros({4}, {dtype = "bf16"})) end,
       "rank 0: all_reduce(sum) of f32 [4]; rank 1: all_reduce(sum) of bf16 [4]; rank 2: all_reduce(sum) of f32 [4]"},
      {function(d) d.barrier() end, function(d) d.all_gather(k3.zeros({1, 2})) end,
       "rank 0: barrier; rank 1: all_gather of f32 [1, 2]; rank 2: barrier"},
    }
    for _, c in ipairs(cases) do
      local _, errs = k3.dist.simulate(3, function(r, d)
        if r == 1 then c[2](d) else c[1](d) end
      end, {errors = "return"})
      local tail = ": the ranks' calls differ (every rank must make the same collective call with the same dtype and shape): " .. c[3]
      for r = 0, 2 do
        local op = r == 1 and c[3]:match("rank 1: ([%w_]+)") or c[3]:match("rank 0: ([%w_]+)")
        -- (all_gather raises at its caller, so its message starts with the caller's position)
        local got = errs[r + 1]:gsub("^(rank %d+: )[^:]*:%d+: ", "%1")
        assert.are.equal(string.format("rank %d: k3.dist.%s%s", r, op, tail), got)
      end
    end
  end)

  it("checks every collective on the host board and never waits for a stream", function()
    local res = k3.dist.simulate(2, function(r, d)
      local t = k3.ones({2, 4})
      for _ = 1, 5 do d.all_reduce(t) end
      d.all_gather(t, 2)
      d.barrier()
      local st = d.stats{reset = true}
      local after = d.stats()
      return {st, after, t:get(1, 1)}
    end)
    for r = 1, 2 do
      local st, after = res[r][1], res[r][2]
      assert.are.equal(5, st.all_reduce.calls)
      assert.are.equal(1, st.all_gather.calls)
      assert.are.equal(7, st.check.calls) -- 5 all-reduces, the gather and the barrier
      assert.are.equal(0, st.check.stream_waits)
      assert.are.equal(0, after.check.calls + after.all_reduce.calls)
      assert.are.equal(32, res[r][3]) -- 2^5: the checks let every all-reduce through
    end
  end)

  it("fails the other ranks when one raises, and every later call of theirs alike", function()
    local _, errs = k3.dist.simulate(2, function(r, d)
      if r == 1 then error("boom", 0) end
      d.barrier()
    end, {errors = "return"})
    assert.are.equal("rank 1: boom", errs[2])
    assert.are.equal("rank 0: k3.dist.barrier: rank 0 waits for ranks that will not join (rank 1 failed)", errs[1])
    local res = k3.dist.simulate(2, function(r, d)
      if r == 1 then return "gone" end
      local first = select(2, pcall(d.barrier))
      return {first, select(2, pcall(d.all_reduce, k3.ones({2})))}
    end)
    local want = "k3.dist.barrier: rank 0 waits for ranks that will not join (rank 1 finished)"
    assert.are.same({want, want}, res[1])
  end)
end)

describe("k3.nn.parallel", function()
  -- Kimi-K3 shapes (DESIGN.md, TP8 locals) as whole weights split W ways, on the CPU.
  local shapes = {{1536, 7168}, {7168, 1536}, {2304, 1536}, {8448, 7168}}

  it("column- and row-parallel linear equal the unsharded linear (bf16 tolerance)", function()
    for si, s in ipairs(shapes) do
      local N, K = s[1], s[2]
      local w = k3.randn({N, K}, {seed = si, dtype = "bf16"}) * (1 / math.sqrt(K))
      local x = k3.randn({2, K}, {seed = 100 + si, dtype = "bf16"})
      local ref = k3.linear(x, w)
      local scale = k3.max_abs_diff(ref, k3.zeros({2, N}, {dtype = "bf16"}))
      for _, W in ipairs{2, 4} do
        local res = k3.dist.simulate(W, function(r, d)
          local col = P.ColumnParallelLinear(w, {dist = d, gather = true})
          local row = P.RowParallelLinear(w, {dist = d, input_is_parallel = false})
          local yc, yr = col(x), row(x)
          col:free(); row:free()
          return {yc, yr}
        end)
        -- Column shards compute whole rows of the same dot products: identical bits.
        assert.are.equal(0, k3.max_abs_diff(res[1][1], ref))
        -- Row shards round W partial sums once each before the sum: a few bf16 ulps.
        assert.is_true(k3.max_abs_diff(res[1][2], ref) <= 4 * 2 ^ -8 * scale,
                       string.format("row-parallel %dx%d W=%d differs by %g (scale %g)", N, K, W,
                                     k3.max_abs_diff(res[1][2], ref), scale))
        for r = 2, W do assert.are.equal(0, k3.max_abs_diff(res[1][2], res[r][2])) end
      end
    end
  end)

  it("shards fused gate_up by parts, keeps outputs sharded by default, loads from tables", function()
    local w = k3.randn({16, 8}, {seed = 3})
    local x = k3.randn({2, 8}, {seed = 4})
    local gate, up = k3.linear(x, w:narrow(1, 1, 8)), k3.linear(x, w:narrow(1, 9, 8))
    local l = P.ColumnParallelLinear({["g.weight"] = w}, {name = "g.weight", parts = {8, 8}, rank = 1, world_size = 2})
    local y = l(x) -- [gate rows 5..8; up rows 13..16]
    assert.are.same({2, 8}, y:size())
    assert.are.equal(0, k3.max_abs_diff(y:narrow(2, 1, 4), gate:narrow(2, 5, 4)))
    assert.are.equal(0, k3.max_abs_diff(y:narrow(2, 5, 4), up:narrow(2, 5, 4)))
    H.raises(function() P.ColumnParallelLinear(k3.zeros({6, 4}), {rank = 0, world_size = 4}) end,
             "ColumnParallelLinear: 6 features do not split evenly over world size 4")
    H.raises(function() P.RowParallelLinear({a = w}, {name = "b"}) end,
             "RowParallelLinear: the weight table has no tensor 'b'")
    H.raises(function() P.RowParallelLinear(w, {rank = 2, world_size = 2}) end, "parallel: rank 2 is not in 0..1")
    -- from a safetensors path only the named tensor is read (a name with pattern characters)
    local path = os.tmpname()
    k3.save_safetensors(path, {["g.weight"] = w, ["g+weight"] = k3.zeros({2, 2})})
    local lp = P.ColumnParallelLinear(path, {name = "g.weight", parts = {8, 8}, rank = 1, world_size = 2})
    assert.are.equal(0, k3.max_abs_diff(lp(x), y))
    H.raises(function() P.RowParallelLinear(path, {name = "g"}) end, "RowParallelLinear: the weight table has no tensor 'g'")
    os.remove(path)
  end)

  it("the Kimi-K3 TP stack (tiny) matches TP=1 at W = 2 and 4, every rank the same", function()
    local tp = require "k3.model.kimi_k3_tp"
    local compare = require("k3.model.decode_demo_tp").compare
    local kimi = require "k3.model.kimi_k3"
    local cfg = tp.config("tiny")
    local w = kimi.generate_weights(cfg, {seed = 7})
    local x = kimi.embedding(cfg, 4, {seed = 7, step = 1})
    local whole = kimi.build(cfg, w)
    local y1 = whole:forward(x)
    for _, W in ipairs{1, 2, 4} do
      local res = k3.dist.simulate(W, function(r, d)
        local st = tp.build(cfg, w, {dist = d})
        local y, stream = st:forward(x)
        return {y, stream.reduce_calls}
      end)
      local rel, cos = compare(res[1][1], y1)
      if W == 1 then assert.are.equal(0, rel) else
        assert.is_true(rel < 3e-2 and cos > 0.9995, string.format("W=%d rel %g cos %g", W, rel, cos))
      end
      assert.are.equal(W == 1 and 0 or 2 * cfg.num_layers, res[1][2])
      for r = 2, W do assert.are.equal(0, k3.max_abs_diff(res[1][1], res[r][1])) end
    end
  end)
end)


describe("k3.nn.parallel call options (nn.Linear's, on a shard)", function()
  -- gate_up [2I, H] and down [H, I] of a small SwiGLU, bf16, and x [M, H].
  local I, Hd, M = 32, 24, 3
  local gu = k3.randn({2 * I, Hd}, {seed = 31, dtype = "bf16"}) * 0.3
  local down = k3.randn({Hd, I}, {seed = 32, dtype = "bf16"}) * 0.3
  local x = k3.randn({M, Hd}, {seed = 33, dtype = "bf16"})
  local function row_tol(ref) return 4 * 2 ^ -8 * k3.max_abs_diff(ref, k3.zeros(ref:size(), {dtype = ref:dtype()})) end

  it("a gate_up column shard with the silu_mul epilogue: h [M, I/W] of its own gate and up rows, the unfused bits", function()
    local ref = k3.linear(x, gu, {epilogue = "silu_mul"}) -- h [M, I] on one device
    local b = k3.randn({2 * I}, {seed = 34, dtype = "bf16"})
    local refb = k3.linear(x, gu, {bias = b, epilogue = "silu_mul"})
    for _, W in ipairs{1, 2, 4} do
      local res = k3.dist.simulate(W, function(r, d)
        local col = P.ColumnParallelLinear(gu, {dist = d, parts = {I, I}, epilogue = "silu_mul"})
        local colb = P.ColumnParallelLinear(gu, {dist = d, parts = {I, I}, bias = b})
        local h = col(x, {epilogue = "silu_mul"})
        local plain = col(x)            -- [M, 2I/W]: this rank's gate shard | up shard
        local unfused = k3.silu_mul(plain)
        local gathered = col(x, {epilogue = "silu_mul", gather = true})
        local hb = colb(x, {epilogue = "silu_mul", gather = true})
        return {h:size(), k3.max_abs_diff(h, unfused), k3.max_abs_diff(h, ref:narrow(2, r * I // W + 1, I // W)),
                gathered, hb}
      end)
      for r = 1, W do
        assert.are.same({M, I // W}, res[r][1])
        assert.are.equal(0, res[r][2], "fused and unfused shard differ")
        assert.are.equal(0, res[r][3], "the shard is not its slice of the single-device h")
        -- column shards compute whole rows of the same dot products: the single-device bits
        assert.are.equal(0, k3.max_abs_diff(res[r][4], ref))
        assert.are.equal(0, k3.max_abs_diff(res[r][5], refb))
      end
    end
  end)

  it("the column layer forwards the prologues, residual and out on its shard", function()
    local xg = k3.randn({M, 2 * Hd}, {seed = 35, dtype = "bf16"})
    local nw = k3.randn({Hd}, {seed = 36, dtype = "bf16"})
    local refs = k3.linear(xg, gu, {prologue = "silu_mul"})
    local refn = k3.linear(x, gu, {prologue = "rms_norm", norm_weight = nw, eps = 1e-6})
    local res_full = k3.randn({M, 2 * I}, {seed = 37, dtype = "bf16"})
    local res = k3.dist.simulate(2, function(r, d)
      local col = P.ColumnParallelLinear(gu, {dist = d, gather = true})
      local ys = col(xg, {prologue = "silu_mul"})
      local yn = col(x, {prologue = "rms_norm", norm_weight = nw, eps = 1e-6})
      local mine = res_full:narrow(2, r * I + 1, I):contiguous()
      local out = k3.full({M, I}, 0 / 0, {dtype = "bf16"}) -- poisoned
      local yr = col(x, {gather = false, residual = mine, out = out})
      local want = k3.linear(x, gu:narrow(1, r * I + 1, I), {residual = mine})
      return {ys, yn, yr == out, k3.max_abs_diff(out, want)}
    end)
    for r = 1, 2 do
      assert.are.equal(0, k3.max_abs_diff(res[r][1], refs))
      assert.are.equal(0, k3.max_abs_diff(res[r][2], refn))
      assert.is_true(res[r][3], "out is the result")
      assert.are.equal(0, res[r][4])
    end
  end)

  it("a row shard takes the silu_mul prologue from the column shard's gate | up, and residual once", function()
    local gup = k3.linear(x, gu)                    -- [M, 2I]
    local ref = k3.linear(gup, down, {prologue = "silu_mul"})
    local resid = k3.randn({M, Hd}, {seed = 38, dtype = "bf16"})
    local wr = k3.randn({Hd, Hd}, {seed = 39, dtype = "bf16"}) * 0.3
    local refr = k3.linear(x, wr, {residual = resid})
    for _, W in ipairs{1, 2, 4} do
      local res = k3.dist.simulate(W, function(r, d)
        local col = P.ColumnParallelLinear(gu, {dist = d, parts = {I, I}})
        local row = P.RowParallelLinear(down, {dist = d})
        local whole_in = P.RowParallelLinear(down, {dist = d, input_is_parallel = false})
        local xl = col(x)
        local y = row(xl, {prologue = "silu_mul"})
        local h = k3.silu_mul(xl)
        local y2 = row(h)                               -- the unfused shard
        local y3 = whole_in(gup, {prologue = "silu_mul"})
        local rr = P.RowParallelLinear(wr, {dist = d, input_is_parallel = false})
        local out = k3.full({M, Hd}, 0 / 0, {dtype = "bf16"})
        local yr = rr(x, {residual = resid, out = out})
        return {y, y2, y3, yr == out, out}
      end)
      for r = 1, W do
        assert.are.equal(0, k3.max_abs_diff(res[r][1], res[r][2]), "fused and unfused row shards differ")
        assert.are.equal(0, k3.max_abs_diff(res[r][1], res[r][3]))
        assert.is_true(k3.max_abs_diff(res[r][1], ref) <= row_tol(ref))
        assert.is_true(res[r][4], "out is the result")
        if W == 1 then assert.are.equal(0, k3.max_abs_diff(res[r][5], refr))
        else assert.is_true(k3.max_abs_diff(res[r][5], refr) <= row_tol(refr)) end
        assert.are.equal(0, k3.max_abs_diff(res[r][5], res[1][5]))
      end
    end
  end)

  it("names every refused option", function()
    local res = k3.dist.simulate(2, function(r, d)
      local msgs = {}
      local function try(fn, ...) msgs[#msgs + 1] = H.error_of(fn, ...) end
      local gate_up = P.ColumnParallelLinear(gu, {dist = d, parts = {I, I}})
      local plain = P.ColumnParallelLinear(gu, {dist = d})
      local row = P.RowParallelLinear(down, {dist = d})
      local whole_in = P.RowParallelLinear(down, {dist = d, input_is_parallel = false})
      try(gate_up, x, {epilogue = "gelu"})
      try(gate_up, x, {epilogue = 1})
      try(gate_up, x, {prologue = "gelu"})
      try(gate_up, x, {bias = gu})
      try(gate_up, x, {reduce = true})
      try(gate_up, x, 5)
      try(plain, x, {epilogue = "silu_mul"})
      try(gate_up, x, {gather = true, residual = k3.zeros({M, 2 * I // 2}, {dtype = "bf16"})})
      try(gate_up, x, {gather = true, out = k3.zeros({M, I // 2}, {dtype = "bf16"})})
      try(gate_up, x, {residual = k3.zeros({M, I // 2}, {dtype = "bf16"}), epilogue = "silu_mul"})
      try(P.ColumnParallelLinear, gu, {dist = d, epilogue = "silu_mul"})
      try(P.ColumnParallelLinear, gu, {dist = d, parts = {40, 24}, epilogue = "silu_mul"})
      try(P.ColumnParallelLinear, gu, {dist = d, parts = {I, I}, epilogue = "gelu"})
      try(row, k3.zeros({M, I // 2}, {dtype = "bf16"}), {epilogue = "silu_mul"})
      try(row, k3.zeros({M, I // 2}, {dtype = "bf16"}), {prologue = "rms_norm", norm_weight = k3.ones({I // 2}, {dtype = "bf16"})})
      try(row, k3.zeros({M, I // 2}, {dtype = "bf16"}), {gather = true})
      try(whole_in, k3.zeros({M, I}, {dtype = "bf16"}), {prologue = "silu_mul"})
      try(row, k3.zeros({M, I // 2}, {dtype = "bf16"}), {prologue = "silu_mul"})
      return msgs
    end)
    assert.are.same(res[1], res[2])
    assert.are.same({
      "bad argument #2 to 'ColumnParallelLinear' (field 'epilogue' must be \"silu_mul\" or nil; got \"gelu\")",
      "bad argument #2 to 'ColumnParallelLinear' (field 'epilogue' must be \"silu_mul\" or nil; got number)",
      "bad argument #2 to 'ColumnParallelLinear' (field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got \"gelu\")",
      "bad argument #2 to 'ColumnParallelLinear' (unknown option 'bias' (expected gather, residual, prologue, norm_weight, eps, epilogue or out))",
      "bad argument #2 to 'ColumnParallelLinear' (unknown option 'reduce' (expected gather, residual, prologue, norm_weight, eps, epilogue or out))",
      "bad argument #2 to 'ColumnParallelLinear' (table or nil expected, got number)",
      "ColumnParallelLinear: epilogue \"silu_mul\" needs a gate_up layer built with parts = {I, I} (this layer's parts are {64})",
      "ColumnParallelLinear: residual is this rank's [M, n] output and cannot be combined with gather (world size 2); call without gather",
      "ColumnParallelLinear: out is this rank's [M, n] output and cannot be combined with gather (world size 2); call without gather",
      "linear: residual cannot be combined with epilogue silu_mul (it would be added before the gate); add it to the result instead",
      "ColumnParallelLinear: epilogue \"silu_mul\" needs a gate_up weight sharded with parts = {I, I} (got parts {64})",
      "ColumnParallelLinear: epilogue \"silu_mul\" needs a gate_up weight sharded with parts = {I, I} (got parts {40, 24})",
      "bad argument #2 to 'ColumnParallelLinear' (field 'epilogue' must be \"silu_mul\" or nil; got \"gelu\")",
      "RowParallelLinear: epilogue \"silu_mul\" would gate this rank's partial sum (world size 2), and the gate of a partial sum is not the gate of the sum",
      "RowParallelLinear: prologue \"rms_norm\" needs the whole row of x and this rank holds 16 of its 32 columns; normalize x before the layer",
      "bad argument #2 to 'RowParallelLinear' (unknown option 'gather' (expected reduce, residual, prologue, norm_weight, eps, epilogue or out))",
      "RowParallelLinear: x must be [M, 2K] = [M, 64] (gate | up) for prologue silu_mul with input_is_parallel = false; got [3, 32]",
      "linear: x dim 2 (16) must be 2 * w dim 2 (16) = 32 for prologue silu_mul",
    }, res[1])
  end)

  it("refuses a gather or reduce that is not a boolean, naming the layer and the field", function()
    local res = k3.dist.simulate(2, function(r, d)
      local msgs = {}
      local col = P.ColumnParallelLinear(gu, {dist = d, parts = {I, I}})
      local row = P.RowParallelLinear(down, {dist = d})
      local xl = k3.zeros({M, I // 2}, {dtype = "bf16"})
      for _, call in ipairs({{col, x, {gather = 1}}, {col, x, {gather = "yes"}}, {row, xl, {reduce = 0}}}) do
        msgs[#msgs + 1] = H.error_of(call[1], call[2], call[3])
      end
      return msgs
    end)
    assert.are.same(res[1], res[2])
    assert.are.same({
      "bad argument #2 to 'ColumnParallelLinear' (field 'gather' must be a boolean or nil; got number)",
      "bad argument #2 to 'ColumnParallelLinear' (field 'gather' must be a boolean or nil; got string)",
      "bad argument #2 to 'RowParallelLinear' (field 'reduce' must be a boolean or nil; got number)",
    }, res[1])
    -- the constructors' settings alike
    for _, c in ipairs({{P.ColumnParallelLinear, gu, {gather = 1}, "ColumnParallelLinear", "gather"},
                        {P.RowParallelLinear, down, {reduce = "no"}, "RowParallelLinear", "reduce"},
                        {P.RowParallelLinear, down, {input_is_parallel = 0}, "RowParallelLinear", "input_is_parallel"}}) do
      c[3].rank, c[3].world_size = 0, 2
      local ok, err = pcall(c[1], c[2], c[3])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(string.format("bad argument #2 to '%s' (field '%s' must be a boolean or nil; got ", c[4], c[5]), 1, true), tostring(err))
    end
  end)

  it("the constructors refuse an unknown key, naming the layer, the key and the keys they take", function()
    local before = k3.memory().host_allocations
    for _, c in ipairs({
      {P.ColumnParallelLinear, gu, {epilouge = "silu_mul"},
       "bad argument #2 to 'ColumnParallelLinear' (unknown option 'epilouge' (expected gather, parts, epilogue, bias, dtype, device, method, dist, rank, world_size or name))"},
      {P.RowParallelLinear, down, {input_is_paralel = false},
       "bad argument #2 to 'RowParallelLinear' (unknown option 'input_is_paralel' (expected input_is_parallel, reduce, bias, dtype, device, method, dist, rank, world_size or name))"},
      {P.RowParallelLinear, down, {gather = true},
       "bad argument #2 to 'RowParallelLinear' (unknown option 'gather' (expected input_is_parallel, reduce, bias, dtype, device, method, dist, rank, world_size or name))"},
      {P.ColumnParallelLinear, gu, 5, "bad argument #2 to 'ColumnParallelLinear' (table or nil expected, got number)"},
    }) do
      assert.equal("caller.lua:2: " .. c[4], H.caller_error(c[1], c[2], c[3]))
    end
    -- refused before any shard is made
    assert.equal(before, k3.memory().host_allocations)
  end)

  it("a call option's error points at the caller's line, not into the layer", function()
    k3.dist.simulate(2, function(_, d)
      local col = P.ColumnParallelLinear(gu, {dist = d, parts = {I, I}})
      local row = P.RowParallelLinear(down, {dist = d})
      local line = debug.getinfo(1, "l").currentline
      local ok1, e1 = pcall(function() local y = col(x, {epilogue = "gelu"}); return y end)
      local ok2, e2 = pcall(function() local y = row(k3.zeros({M, I // 2}, {dtype = "bf16"}), {prologue = 1}); return y end)
      assert.is_false(ok1)
      assert.is_false(ok2)
      assert.truthy(tostring(e1):find("dist_spec.lua:" .. (line + 1) .. ": bad argument #2 to 'ColumnParallelLinear'", 1, true), tostring(e1))
      assert.truthy(tostring(e2):find("dist_spec.lua:" .. (line + 2) .. ": bad argument #2 to 'RowParallelLinear'", 1, true), tostring(e2))
    end)
  end)

  it("a row layer checks residual on every rank: a bad one fails all ranks alike, none waits", function()
    local xl = k3.randn({M, I // 2}, {seed = 40, dtype = "bf16"})
    for _, bad in ipairs({k3.zeros({M, Hd + 1}, {dtype = "bf16"}), k3.zeros({M, Hd}, {dtype = "f32"})}) do
      local res, errs = k3.dist.simulate(2, function(_, d)
        local row = P.RowParallelLinear(down, {dist = d})
        return row(xl, {residual = bad})
      end, {errors = "return"})
      assert.is_nil(res[1])
      assert.is_nil(res[2])
      local why = {}
      for r = 1, 2 do
        assert.truthy(errs[r], "rank " .. (r - 1) .. " did not fail")
        why[r] = H.unplaced(errs[r]:gsub("^rank %d: ", ""))
        assert.truthy(why[r]:find("^linear: residual"), errs[r])
      end
      assert.are.equal(why[1], why[2])
    end
  end)

  it("a row layer refuses a non-contiguous out before writing it (the all-reduce sums in place)", function()
    local xl = k3.randn({M, I // 2}, {seed = 41, dtype = "bf16"})
    for _, W in ipairs({1, 2}) do
      local res = k3.dist.simulate(W, function(_, d)
        local row = P.RowParallelLinear(down, {dist = d})
        local xin = W == 1 and k3.randn({M, I}, {seed = 41, dtype = "bf16"}) or xl
        local store = k3.full({Hd, M}, 7, {dtype = "bf16"})
        local ok, err = pcall(row, xin, {out = store:transpose(1, 2)})
        return {ok, H.unplaced(err), k3.equal(store, k3.full({Hd, M}, 7, {dtype = "bf16"}))}
      end)
      for r = 1, W do
        assert.is_false(res[r][1])
        assert.are.equal(string.format("RowParallelLinear: out must be contiguous (the all-reduce sums it in place); got shape [%d, %d] strides [1, %d]", M, Hd, M), res[r][2])
        assert.is_true(res[r][3], "out was written before the error")
      end
    end
  end)

  it("a row layer with input_is_parallel = false checks x's width on every rank before taking its columns", function()
    local res = k3.dist.simulate(2, function(_, d)
      local whole_in = P.RowParallelLinear(down, {dist = d, input_is_parallel = false})
      local msgs = {}
      -- K = 32: [M, 40] would give both ranks columns, the wrong ones; [M, 24] only rank 0
      for _, xin in ipairs({k3.zeros({M, I + 8}, {dtype = "bf16"}), k3.zeros({M, I - 8}, {dtype = "bf16"}),
                            k3.zeros({I}, {dtype = "bf16"}), 5}) do
        msgs[#msgs + 1] = H.error_of(whole_in, xin)
      end
      msgs[#msgs + 1] = H.error_of(whole_in, 5, {prologue = "silu_mul"})
      return msgs
    end)
    assert.are.same(res[1], res[2])
    assert.are.same({
      "RowParallelLinear: x must be [M, K] = [M, 32] with input_is_parallel = false; got [3, 40]",
      "RowParallelLinear: x must be [M, K] = [M, 32] with input_is_parallel = false; got [3, 24]",
      "RowParallelLinear: x must be [M, K] = [M, 32] with input_is_parallel = false; got [32]",
      "bad argument #1 to 'RowParallelLinear' (k3.Tensor expected, got number)",
      "bad argument #1 to 'RowParallelLinear' (k3.Tensor expected, got number)",
    }, res[1])
  end)

  it("a row layer with a bias at world size 1 takes the silu_mul epilogue as k3.linear does (the bias before the gate)", function()
    local b = k3.randn({2 * I}, {seed = 42, dtype = "bf16"})
    local w2 = k3.randn({2 * I, Hd}, {seed = 43, dtype = "bf16"}) * 0.3
    local ref = k3.linear(x, w2, {bias = b, epilogue = "silu_mul"})
    local res = k3.dist.simulate(1, function(_, d)
      local row = P.RowParallelLinear(w2, {dist = d, bias = b})
      local out = k3.full({M, I}, 0 / 0, {dtype = "bf16"})
      local y = row(x, {epilogue = "silu_mul", out = out})
      return {rawequal(y, out), k3.max_abs_diff(out, ref)}
    end)
    assert.is_true(res[1][1], "out is the result")
    assert.are.equal(0, res[1][2])
  end)

  it("the gate_up layer built for the epilogue asks for the fused call's plan of its local shape", function()
    local asked, saved = {}, k3.plan_for
    k3.plan_for = function(w, opts)
      asked[#asked + 1] = {rows = w:size(1), epilogue = opts and opts.epilogue}
      return nil
    end
    local ok, err = pcall(function()
      P.ColumnParallelLinear(gu, {parts = {I, I}, epilogue = "silu_mul", rank = 1, world_size = 2})
      P.ColumnParallelLinear(gu, {parts = {I, I}, rank = 1, world_size = 2})
      P.RowParallelLinear(down, {rank = 0, world_size = 2})
    end)
    k3.plan_for = saved
    assert.is_true(ok, tostring(err))
    assert.are.same({{rows = I, epilogue = "silu_mul"}, {rows = I}, {rows = Hd}}, asked)
  end)
end)

describe("the Kimi-K3 TP stack's fused MLP", function()
  it("gives the unfused TP step's bits and makes the single-GPU step's calls per layer", function()
    local tp = require "k3.model.kimi_k3_tp"
    local compare = require("k3.model.decode_demo_tp").compare
    local kimi = require "k3.model.kimi_k3"
    local cfg = tp.config("tiny")
    local w = kimi.generate_weights(cfg, {seed = 7})
    local x = kimi.embedding(cfg, 4, {seed = 7, step = 1})
    local whole = kimi.build(cfg, w)
    local function count(fn)
      local ops = {}
      for _, r in ipairs(k3.trace(fn)) do ops[r.op] = (ops[r.op] or 0) + 1 end
      return ops
    end
    local y1
    local one = count(function() y1 = whole:forward(x) end)
    local L = cfg.num_layers
    assert.are.same({linear = 5 * L, attn_res = 2 * L, rms_norm = 1}, one)
    for _, W in ipairs{1, 2, 4} do
      -- (building a stack dispatches no traced op: the counts below are the steps' own)
      local ops, out = {}, {}
      for i, fused in ipairs{true, false} do
        ops[i] = count(function()
          out[i] = k3.dist.simulate(W, function(_, d)
            local st = tp.build(cfg, w, {dist = d, fused = fused})
            local y = st:forward(x)
            for _, layer in ipairs(st.layers) do assert(layer.mlp.fused == fused, "mlp.fused") end
            local keep = y:clone()
            st:free()
            return keep
          end)
        end)
      end
      for r = 1, W do
        assert.are.equal(0, k3.max_abs_diff(out[1][r], out[2][r]), "fused and unfused TP steps differ")
        assert.are.equal(0, k3.max_abs_diff(out[1][r], out[1][1]), "ranks differ")
      end
      local rel, cos = compare(out[1][1], y1)
      if W == 1 then assert.are.equal(0, rel) else
        assert.is_true(rel < 3e-2 and cos > 0.9995, string.format("W=%d rel %g cos %g", W, rel, cos))
      end
      -- every rank: the single-GPU step's calls, plus two all-reduces per layer above W = 1
      local want = {linear = 5 * L * W, attn_res = 2 * L * W, rms_norm = W,
                    all_reduce = W > 1 and 2 * L * W or nil}
      assert.are.same(want, ops[1])
      want.silu_mul = L * W
      assert.are.same(want, ops[2])
    end
    H.raises(function() tp.build(cfg, w, {fused = "yes"}) end, "kimi_k3_tp: fused must be a boolean (got string)")
    H.raises_exact(function() tp.build(cfg, w, {fuse = false}) end,
                   "bad argument #3 to 'kimi_k3_tp.build' (unknown option 'fuse' (expected device, dtype, dist, rank, world_size or fused))")
    H.raises_exact(function() tp.build({hidden_size = 16}, w) end,
                   "kimi_k3_tp.build: config field 'num_layers' must be a positive integer; got nil")
  end)
end)

describe("k3.trace and k3.dist.simulate", function()
  it("a trace around simulate records every rank; a trace that would yield says so", function()
    local r = k3.trace(function()
      k3.dist.simulate(2, function(_, d)
        local t = k3.ones({1, 2})
        k3.silu_mul(t)
        d.all_reduce(t)
      end)
    end)
    assert.are.equal(4, #r)
    assert.are.equal("silu_mul", r[1].op)
    assert.are.equal("silu_mul", r[2].op)
    for i = 3, 4 do
      assert.are.equal("all_reduce", r[i].op)
      assert.are.equal("simulate.all_reduce", r[i].kernel)
      assert.are.same({{kernel = "cuda.all_reduce.one_shot", reason = "a simulated world has no device buffers to map between ranks"},
                       {kernel = "nccl.all_reduce", reason = "a simulated world has no communicator"}}, r[i].declined)
    end
    local ok, err = pcall(k3.dist.simulate, 2, function(_, d)
      local t = k3.ones({2})
      return #k3.trace(function() d.all_reduce(t) end)
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("attempt to yield across a C-call boundary", 1, true), err)
  end)
end)

describe("which collective runs (k3.dist.explain, k3.trace)", function()
  after_each(function() k3.dist.destroy() end)

  it("names the local collective at world size 1 and why NCCL and one-shot decline", function()
    local alone = "world size 1: no other rank to exchange with"
    local t = k3.zeros({1, 7168}, {dtype = "bf16"})
    assert.are.same({op = "all_reduce", chosen = "local.all_reduce", kernel = "local.all_reduce",
                     declined = {{kernel = "cuda.all_reduce.one_shot", reason = alone},
                                 {kernel = "nccl.all_reduce", reason = alone}}},
                    k3.dist.explain("all_reduce", t))
    k3.dist.init{world_size = 1}
    local r = k3.trace(function()
      k3.dist.all_reduce(t)
      k3.dist.all_gather(t, 2):free()
      k3.dist.barrier()
    end)
    assert.are.equal(2, #r)
    assert.are.same({"all_reduce", "local.all_reduce"}, {r[1].op, r[1].kernel})
    assert.are.same({"all_gather", "local.all_gather"}, {r[2].op, r[2].kernel})
    assert.are.same({{kernel = "nccl.all_gather", reason = alone}}, r[2].declined)
    H.raises(function() k3.dist.explain("reduce_scatter", t) end,
             "k3.dist.explain: collective must be \"all_reduce\" or \"all_gather\"; got 'reduce_scatter'")
    H.raises(function() k3.dist.explain("all_reduce", 3) end,
             "bad argument #2 to 'explain' (k3.Tensor expected, got number)")
  end)

  it("in a simulated world: the size decides whether one-shot would be in reach", function()
    local res = k3.dist.simulate(2, function(_, d)
      return {d.explain("all_reduce", k3.zeros({16, 7168}, {dtype = "bf16"})),
              d.explain("all_reduce", k3.zeros({64, 7168}, {dtype = "bf16"}))}
    end)
    assert.are.equal("simulate.all_reduce", res[1][1].kernel)
    assert.are.equal("a simulated world has no device buffers to map between ranks", res[1][1].declined[1].reason)
    assert.are.equal("simulate.all_reduce", res[2][2].kernel)
    assert.are.equal("the message is 917504 bytes, over the one-shot limit of 524288", res[2][2].declined[1].reason)
  end)
end)

describe("the --tp demo's table", function()
  it("times TP=1 beside the TP rows and the all-reduce alone, at world size 1 on any device", function()
    local tp = require "k3.model.decode_demo_tp"
    local res = tp.run{tp = 1, config = "tiny", steps = 2, m = {1, 3}, quiet = true, device = "cpu"}
    assert.are.equal(2, #res.rows)
    for _, r in ipairs(res.rows) do
      assert.is_true(r.ms > 0 and r.tp1_ms > 0, "step times")
      assert.is_true(r.ar_alone_wall_us >= 0)
      assert.is_nil(r.ar_alone_dev_us) -- no collective runs at world size 1
      assert.is_true(r.pass)
      assert.are.equal(0, r.rel_err) -- TP=1 is the same computation
      assert.are.equal(0, r.waits) -- nothing to wait for at world size 1
    end
    local text = tp.format(res)
    for _, col in ipairs({"TP1 ms", "speed-up", "AR alone µs", "(wall µs)", "AR ms/step", "waits/step", "check ms"}) do
      assert.truthy(text:find(col, 1, true), col)
    end
    assert.truthy(text:find("NCCL's own all-reduce of one [M, 256] bf16 tensor", 1, true), text)
    for _, r in ipairs(res.rows) do r.output:free() end
    res.stack:free()
  end)
end)

describe("scripts/k3 --nproc (launcher)", function()
  it("starts N ranks with their environment and passes the arguments", function()
    local s = script([[print(string.format("rank %s/%s dev %s cvd %s nvls %s dir %s args %s",
      os.getenv("K3_RANK"), os.getenv("K3_WORLD_SIZE"), os.getenv("K3_DIST_DEVICE"),
      os.getenv("CUDA_VISIBLE_DEVICES"), os.getenv("NCCL_NVLS_ENABLE"),
      os.getenv("K3_DIST_DIR") and "yes" or "no", table.concat({...}, ",")))]])
    local out, code = launch("--nproc 3 " .. s .. " a b", "env -u CUDA_VISIBLE_DEVICES -u NCCL_NVLS_ENABLE")
    assert.are.equal(0, code, out)
    for r = 0, 2 do
      assert.truthy(out:find(string.format("rank %d/3 dev 0 cvd %d nvls 0 dir yes args a,b", r, r), 1, true), out)
    end
    out, code = launch("--nproc 2 --all-devices " .. s, "CUDA_VISIBLE_DEVICES=5,6")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 1/2 dev 1 cvd 5,6", 1, true), out)
    os.remove(s)
  end)

  it("names the failed rank, tells the others through K3_DIST_DIR/failed, exits non-zero", function()
    local s = script([[
      if os.getenv("K3_RANK") == "1" then error("rank one raises", 0) end
      local path = os.getenv("K3_DIST_DIR") .. "/failed"
      for _ = 1, 400 do
        local f = io.open(path)
        -- one write(2): stderr is unbuffered, and the launcher writes to the same pipe
        if f then io.stderr:write("rank 0 saw: " .. f:read("l") .. "\n") os.exit(3) end
        os.execute("sleep 0.05")
      end]])
    local out, code, secs = launch("--nproc 2 " .. s)
    assert.are.equal(1, code, out)
    assert.truthy(out:find("k3-launch: rank 1 exited with status 1; stopping the other ranks", 1, true), out)
    assert.truthy(out:find("rank 0 saw: rank 1 exited with status 1", 1, true), out)
    assert.truthy(out:find("k3-launch: rank 1 failed (exited with status 1); rank 0 exited with status 3", 1, true), out)
    assert.is_true(secs <= 10)
    os.remove(s)
  end)

  it("stops ranks that outlive a failure after --grace seconds", function()
    local s = script([[if os.getenv("K3_RANK") == "0" then os.exit(5) end os.execute("exec sleep 60")]])
    local out, code, secs = launch("--nproc 2 --grace 1 " .. s)
    assert.are.equal(5, code, out)
    assert.truthy(out:find("rank 1 was killed by signal SIGTERM", 1, true), out)
    assert.is_true(secs <= 10, "took " .. secs .. " s")
    os.remove(s)
  end)

  it("rejects bad arguments with a message", function()
    local out, code = launch("--nproc 0 x.lua")
    assert.are.equal(2, code)
    assert.truthy(out:find("k3-launch: --nproc must be an integer in 1..4096; got '0'", 1, true), out)
    out, code = launch("--nproc 2")
    assert.are.equal(2, code)
    assert.truthy(out:find("k3-launch: needs a script to run", 1, true), out)
    out, code = launch("--nproc 3 x.lua", "CUDA_VISIBLE_DEVICES=0,1")
    assert.are.equal(2, code)
    assert.truthy(out:find("--nproc 3 but CUDA_VISIBLE_DEVICES=0,1 lists 2 device(s)", 1, true), out)
  end)
end)

describe("the agreement board between processes (scripts/k3 --nproc, CPU)", function()
  -- Every rank maps K3_DIST_DIR/check.test as the process group does (rank 0 creates it and
  -- leaves a marker once it is whole; the group orders it before the NCCL id instead), then
  -- runs `body` with `board`, `rank` and `post(call, shape, dtype)` (post + wait + verdict;
  -- returns the verdict's message or nil).
  local function board_ranks(body, args)
    local s = script([[
      local k3 = require "k3"
      local core = require "k3.core"
      local rank = tonumber(os.getenv("K3_RANK"))
      local dir = os.getenv("K3_DIST_DIR")
      local path = dir .. "/check.test"
      if rank ~= 0 then
        for _ = 1, 400 do
          if io.open(dir .. "/board.made") then break end
          os.execute("sleep 0.01")
        end
      end
      local board = core.dist_board_open(path, rank, 2)
      if rank == 0 then io.open(dir .. "/board.made", "w"):close() end
      local function post(call, shape, dtype, timeout)
        board:post(rank, call, shape and k3.zeros(shape, {dtype = dtype or "f32"}) or nil)
        local what = call:match("^[%w_]+")
        local ok, err = pcall(board.wait, board, rank, what, timeout or 20, dir .. "/failed")
        if not ok then error((tostring(err):gsub("^[^:]*:%d+: ", "")), 0) end
        return board:verdict(rank, what)
      end
    ]] .. body)
    local out, code, secs = launch("--nproc 2 " .. (args or "") .. " " .. s)
    os.remove(s)
    return out, code, secs
  end

  it("agrees over thousands of calls, names a difference alike on both ranks, stays usable", function()
    local out, code = board_ranks([[
      for i = 1, 3000 do
        local call = ({"all_reduce(sum)", "all_gather", "barrier"})[i % 3 + 1]
        local msg = post(call, call ~= "barrier" and {i % 5 + 1, 7} or nil, "bf16")
        assert(msg == nil, msg)
      end
      print("rank " .. rank .. ": " .. tostring(post("all_reduce(sum)", {2, 8 * (rank + 1)}, "bf16")))
      assert(post("barrier") == nil)
      print("rank " .. rank .. " checks " .. board:checks(rank))]])
    assert.are.equal(0, code, out)
    local want = "k3.dist.all_reduce: the ranks' calls differ (every rank must make the same collective call with the same dtype and shape): rank 0: all_reduce(sum) of bf16 [2, 8]; rank 1: all_reduce(sum) of bf16 [2, 16]"
    for r = 0, 1 do
      assert.truthy(out:find(string.format("rank %d: %s\n", r, want), 1, true), out)
      assert.truthy(out:find(string.format("rank %d checks 3002", r), 1, true), out)
    end
  end)

  it("a rank that exits makes the other stop with the launcher's note, within the bound", function()
    local out, code, secs = board_ranks([[
      assert(post("barrier") == nil)
      if rank == 1 then os.exit(3) end
      local ok, err = pcall(post, "all_reduce(sum)", {16, 7168}, "bf16", 30)
      io.stderr:write("rank 0 got: " .. tostring(err) .. "\n")
      os.exit(ok and 0 or 7)]], "--grace 30")
    assert.are.equal(3, code, out)
    assert.truthy(out:find("rank 0 got: k3.dist.all_reduce: rank 0 stops: rank 1 exited with status 3", 1, true), out)
    assert.is_true(secs < 20, "took " .. secs .. " s")
  end)

  it("a rank that never posts makes the other time out naming it, and tells the others", function()
    local out, code, secs = board_ranks([[
      if rank == 1 then
        for _ = 1, 400 do
          local f = io.open(os.getenv("K3_DIST_DIR") .. "/failed")
          if f then io.stderr:write("rank 1 saw: " .. f:read("l") .. "\n") os.exit(0) end
          os.execute("sleep 0.02")
        end
        os.exit(9)
      end
      local ok, err = pcall(post, "all_gather", {1, 4}, "f32", 1)
      io.stderr:write("rank 0 got: " .. tostring(err) .. "\n")
      os.exit(ok and 0 or 7)]])
    assert.are.equal(7, code, out)
    local want = "k3.dist.all_gather: rank 0 timed out after 1 s waiting for the other ranks to make the same call (not there: rank 1; a rank may have failed, or not made the call)"
    assert.truthy(out:find("rank 0 got: " .. want, 1, true), out)
    assert.truthy(out:find("rank 1 saw: rank 0: " .. want, 1, true), out)
    assert.is_true(secs < 20, "took " .. secs .. " s")
  end)

  it("refuses a board of another world and bad arguments", function()
    local core = require "k3.core"
    local path = os.tmpname()
    os.remove(path)
    local b0 = core.dist_board_open(path, 0, 2)
    H.raises(function() core.dist_board_open(path, 1, 3) end, "k3.dist.init: " .. path .. " holds")
    local b1 = core.dist_board_open(path, 1, 2)
    H.raises(function() core.dist_board_open(path, 0, 2) end, "k3.dist.init: rank 0 cannot create the agreement board " .. path)
    H.raises(function() b0:post(2, "barrier") end, "rank must be in 0..1; got 2")
    H.raises(function() b0:post(0, "reduce") end, "unknown call 'reduce'")
    H.raises(function() b0:ready(0) end, "k3.dist: rank 0 has no call on the board")
    b0:post(0, "barrier")
    H.raises(function() b0:post(0, "barrier") end, "dist_board_post: rank 0 posts collective 2 before the verdict on collective 1")
    local ready, missing = b0:ready(0)
    assert.is_false(ready)
    assert.are.equal("1", missing)
    H.raises(function() b0:verdict(0, "barrier") end, "dist_board_verdict: rank 0's collective 1 is not on the board from every rank")
    b1:post(1, "barrier")
    assert.is_true(b0:ready(0))
    assert.is_nil(b0:verdict(0, "barrier"))
    H.raises(function() core.dist_board(0) end, "world size must be in 1..4096; got 0")
    os.remove(path)
  end)
end)

describe("k3.dist on two GPUs #multigpu", function()
  local function two_gpus()
    local c = k3.backends().cuda
    if not c.available or (c.devices or 0) < 2 then
      pending(string.format("needs 2 CUDA devices; this machine has %s (%s)",
        tostring(c.devices or 0), tostring(c.reason or "available")))
      return false
    end
    return true
  end

  -- Runs `body` on 2 ranks (k3 and k3.dist initialised); returns output, exit code, seconds.
  local function ranks(body, timeout, grace)
    local s = script("local k3 = require 'k3'\nk3.dist.init()\nlocal rank = k3.dist.rank()\n" .. body ..
                     "\nk3.dist.destroy()\n")
    local out, code, secs = launch(string.format("--nproc 2 --timeout %d --grace %d %s", timeout or 60,
                                                 grace or 30, s))
    os.remove(s)
    return out, code, secs
  end

  it("all-reduce and all-gather are exact for integer-valued data", function()
    if not two_gpus() then return end
    local out, code = ranks([[
      local function ints(shape, seed, dtype)
        local n = 1
        for _, s in ipairs(shape) do n = n * s end
        local flat = {}
        for i = 1, n do flat[i] = (i * 7 + seed) % 19 - 9 end
        return k3.tensor(flat, {dtype = dtype}):view(shape):to("cuda")
      end
      for _, dt in ipairs{"bf16", "f16", "f32", "f64"} do
        for _, shape in ipairs{{1, 7168}, {16, 7168}, {3, 5}} do
          local t = ints(shape, rank, dt)
          k3.dist.all_reduce(t)
          local want = ints(shape, 0, "f64") + ints(shape, 1, "f64")
          assert(k3.max_abs_diff(t, want) == 0, "all_reduce " .. dt)
          local g = k3.dist.all_gather(ints(shape, rank, dt), 2)
          assert(k3.max_abs_diff(g:narrow(2, 1, shape[2]), ints(shape, 0, "f64")) == 0, "gather 0 " .. dt)
          assert(k3.max_abs_diff(g:narrow(2, shape[2] + 1, shape[2]), ints(shape, 1, "f64")) == 0, "gather 1 " .. dt)
          local m = ints(shape, rank, dt)
          k3.dist.all_reduce(m, "max")
        end
      end
      local st = k3.dist.stats()
      assert(st.all_reduce.calls == 24 and st.all_gather.calls == 12, "stats")
      print("rank " .. rank .. " exact")]])
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 exact", 1, true) and out:find("rank 1 exact", 1, true), out)
  end)

  it("column- and row-parallel linear equal the unsharded linear for Kimi-K3 shapes", function()
    if not two_gpus() then return end
    local out, code = ranks([[
      local P = require "k3.nn.parallel"
      for si, s in ipairs{{3072, 7168}, {7168, 3072}, {16896, 7168}, {7168, 8448}, {4608, 1536}} do
        local N, K = s[1], s[2]
        local w = (k3.randn({N, K}, {seed = si}) * (1 / math.sqrt(K))):to("bf16")
        for _, M in ipairs{1, 16} do
          local x = k3.randn({M, K}, {seed = 50 + si, dtype = "bf16"}):to("cuda")
          local ref = k3.linear(x, w:to("cuda"))
          local scale = k3.max_abs_diff(ref, k3.zeros({M, N}, {dtype = "bf16", device = "cuda"}))
          local col = P.ColumnParallelLinear(w, {device = "cuda", gather = true})
          local row = P.RowParallelLinear(w, {device = "cuda", input_is_parallel = false})
          local dc, dr = k3.max_abs_diff(col(x), ref), k3.max_abs_diff(row(x), ref)
          assert(dc <= 2 * 2 ^ -8 * scale, string.format("column %dx%d M=%d: %g", N, K, M, dc))
          assert(dr <= 4 * 2 ^ -8 * scale, string.format("row %dx%d M=%d: %g", N, K, M, dr))
          col:free(); row:free()
        end
      end
      print("rank " .. rank .. " parallel ok")]], 120)
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 parallel ok", 1, true) and out:find("rank 1 parallel ok", 1, true), out)
  end)

  it("the TP MLP's fused gate_up gives the unfused bits at Kimi-K3 TP2 shapes, without silu_mul", function()
    if not two_gpus() then return end
    local out, code = ranks([[
      local nn = require "k3.nn"
      local P = require "k3.nn.parallel"
      local H, I = 7168, 33792 -- Kimi-K3's MLP whole; each rank keeps gate_up [16896 + 16896, H]
      local gu = (k3.randn({2 * I, H}, {seed = 1, device = "cuda"}) * (1 / math.sqrt(H))):to("bf16")
      local dn = (k3.randn({H, I}, {seed = 2, device = "cuda"}) * (1 / math.sqrt(I))):to("bf16")
      local mlp = setmetatable({gate_up = P.ColumnParallelLinear(gu, {parts = {I, I}, epilogue = "silu_mul"}),
                                down = P.RowParallelLinear(dn, {}), fused = true}, nn.SwiGLU)
      local whole = nn.SwiGLU(gu, dn)
      for _, M in ipairs{1, 16} do
        local x = k3.randn({M, H}, {seed = 3 + M, dtype = "bf16", device = "cuda"})
        local fused
        local tr = k3.trace(function() fused = mlp(x) end)
        local ops, kernels = {}, {}
        for _, r in ipairs(tr) do ops[#ops + 1] = r.op; kernels[#kernels + 1] = tostring(r.kernel) end
        local want = k3.dist.world_size() > 1 and "linear,linear,all_reduce" or "linear,linear"
        assert(table.concat(ops, ",") == want, "fused ops " .. table.concat(ops, ","))
        mlp.fused = false
        local unfused = mlp(x)
        mlp.fused = true
        local d = k3.max_abs_diff(fused, unfused)
        assert(d == 0, string.format("M=%d fused and unfused differ by %g", M, d))
        local ref = whole(x)
        local scale = k3.max_abs_diff(ref, k3.zeros(ref:size(), {dtype = "bf16", device = "cuda"}))
        local dr = k3.max_abs_diff(fused, ref)
        assert(dr <= 6 * 2 ^ -8 * scale, string.format("M=%d TP2 vs one GPU: %g (scale %g)", M, dr, scale))
        print(string.format("rank %d M=%d kernels %s; vs one GPU %g (scale %g)", rank, M,
                            table.concat(kernels, " "), dr, scale))
      end
      print("rank " .. rank .. " fused mlp ok")]], 120)
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 fused mlp ok", 1, true) and out:find("rank 1 fused mlp ok", 1, true), out)
  end)

  it("the agreement check waits for no stream: stream waits are the all-reduces' own", function()
    if not two_gpus() then return end
    for _, wait in ipairs{"each", "next"} do
      local out, code = ranks(string.format([[
        k3.dist.destroy()
        k3.dist.init{wait = %q}
        local t = k3.ones({1, 7168}, {dtype = "bf16", device = "cuda"})
        k3.dist.stats{reset = true}
        for _ = 1, 20 do k3.dist.all_reduce(t) end
        k3.synchronize()
        k3.dist.synchronize()
        local st = k3.dist.stats()
        assert(t:get(1, 1) == 2 ^ 20, "sum " .. t:get(1, 1))
        assert(st.check.calls == 20 and st.check.stream_waits == 0, "check " .. st.check.calls)
        assert(st.all_reduce.calls == 20 and st.all_reduce.stream_waits == 20,
               "waits " .. st.all_reduce.stream_waits)
        print("rank " .. rank .. " waits ok")]], wait), 60)
      assert.are.equal(0, code, out)
      assert.truthy(out:find("rank 0 waits ok", 1, true) and out:find("rank 1 waits ok", 1, true), out)
    end
  end)

  it("a shape that differs across ranks is an error on both ranks, naming each shape", function()
    if not two_gpus() then return end
    local out, code = ranks([[
      local ok, err = pcall(k3.dist.all_reduce, k3.zeros({2, 8 * (rank + 1)}, {dtype = "bf16", device = "cuda"}))
      print("rank " .. rank .. ": " .. tostring(err))
      local t = k3.ones({4}, {device = "cuda"})
      k3.dist.all_reduce(t) -- the communicator is still usable
      assert(t:get(1) == 2)]], 30)
    assert.are.equal(0, code, out)
    local want = "k3.dist.all_reduce: the ranks' calls differ (every rank must make the same collective call with the same dtype and shape): rank 0: all_reduce(sum) of bf16 [2, 8]; rank 1: all_reduce(sum) of bf16 [2, 16]"
    assert.truthy(out:find("rank 0: " .. want, 1, true), out)
    assert.truthy(out:find("rank 1: " .. want, 1, true), out)
  end)

  it("a rank that raises makes the other fail with a clear message within bounded time", function()
    if not two_gpus() then return end
    local out, code, secs = ranks([[
      k3.dist.barrier()
      if rank == 1 then error("rank 1 gives up", 0) end
      local ok, err = pcall(k3.dist.all_reduce, k3.ones({16, 7168}, {dtype = "bf16", device = "cuda"}))
      io.stderr:write("rank 0 got: " .. tostring(err) .. "\n")
      os.exit(ok and 0 or 7)]], 60, 30)
    assert.are.equal(1, code, out)
    assert.truthy(out:find("rank 0 got: k3.dist.all_reduce: rank 0 stops: rank 1 exited with status 1; communicator aborted", 1, true), out)
    assert.truthy(out:find("k3-launch: rank 1 failed (exited with status 1); rank 0 exited with status 7", 1, true), out)
    assert.is_true(secs < 30, "took " .. secs .. " s")
  end)

  it("a rank that never joins makes the other time out with a message", function()
    if not two_gpus() then return end
    local out, code, secs = ranks([[
      if rank == 1 then os.execute("sleep 8") os.exit(0) end
      local ok, err = pcall(k3.dist.all_reduce, k3.ones({4}, {device = "cuda"}))
      io.stderr:write("rank 0 got: " .. tostring(err) .. "\n")
      os.exit(ok and 0 or 7)]], 3, 30)
    assert.are.equal(7, code, out)
    assert.truthy(out:find("rank 0 got: k3.dist.all_reduce: rank 0 timed out after 3 s waiting for", 1, true), out)
    assert.is_true(secs < 20, "took " .. secs .. " s")
  end)
end)
