-- cuda.attn_res.generic, .decode and .stream (#gpu) against the fp64 CPU reference on fresh
-- random inputs with poisoned outputs: every case of the op on the generic kernel, every read
-- of the Kimi-K3 stream on the decode kernel (delta or none, a fused seal, num_blocks 0..16, hidden
-- 4096, 7000, 7168, 7176, 8192), its static_weights / static_blocks contract (seal then read
-- back to back), norms at extreme scales, the stream kernel's prefill shapes, the layout error
-- through every path, the fallback policy, and which kernel dispatch picks.
local k3 = require "k3"
local H = require "spec.helpers"

local function clone_args(a)
  local c = {}
  for k, v in pairs(a) do c[k] = v end
  return c
end

-- Inputs on the device. o: dtype, pad (row padding of prefix/delta/out), bpad (blocks row
-- padding), num_blocks, write_block, delta (false = none), onorm (false = none), wdtype.
local function inputs(T, S, Hd, o)
  o = o or {}
  local dt, pad, bpad = o.dtype or "bf16", o.pad or 0, o.bpad or 0
  local wdt = o.wdtype or dt
  local dev = {device = "cuda", dtype = dt}
  local seed = o.seed or 100
  local a = {
    prefix = H.padded(T, Hd, pad, {device = "cuda", dtype = dt, seed = seed + 1}),
    blocks = k3.randn({T, S, Hd + bpad}, {device = "cuda", dtype = dt, seed = seed + 2}):narrow(3, 1, Hd),
    num_blocks = o.num_blocks or S,
    write_block = o.write_block,
    norm_weight = (k3.randn({Hd}, {dtype = wdt, seed = seed + 4}) * 0.5 + 1):to("cuda"),
    qk_weight = (k3.randn({Hd}, {dtype = wdt, seed = seed + 5}) * 0.1):to("cuda"),
  }
  if o.delta ~= false then
    a.delta = H.padded(T, Hd, pad, {device = "cuda", dtype = dt, seed = seed + 3})
  end
  if o.onorm ~= false then
    a.output_norm_weight = (k3.randn({Hd}, {dtype = wdt, seed = seed + 6}) * 0.1 + 1):to("cuda")
  end
  a.out = H.padded(T, Hd, o.opad or pad, dev)
  a.out:fill(0 / 0)
  return a
end

-- The fp64 CPU reference on copies of the inputs as they are before the call. The prefix
-- the device will use is bf16(prefix + delta) (rounded to the dtype), so the reference gets
-- that rounded prefix and no delta. Returns out (f64), the expected prefix afterwards (the
-- dtype) and the expected blocks afterwards (the dtype).
local function reference(a)
  local dt = a.prefix:dtype()
  local prefix = a.prefix:to("cpu")
  if a.delta then prefix = (prefix:to("f64") + a.delta:to("cpu"):to("f64")):to(dt) end
  local blocks = a.blocks:to("cpu")
  if a.write_block then blocks:select(2, a.write_block):copy(prefix) end
  local r = {
    prefix = prefix:to("f64"),
    blocks = blocks:to("f64"),
    num_blocks = a.num_blocks,
    norm_weight = a.norm_weight:to("cpu"):to("f64"),
    qk_weight = a.qk_weight:to("cpu"):to("f64"),
    output_norm_weight = a.output_norm_weight and a.output_norm_weight:to("cpu"):to("f64"),
    eps = a.eps, output_eps = a.output_eps,
    kernel = "cpu.attn_res.reference",
  }
  return k3.attn_res(r), prefix, blocks
end

local tol = {bf16 = {8e-2, 3e-2}, f16 = {2e-2, 1e-2}, f32 = {2e-4, 1e-4}, f64 = {1e-9, 1e-9}}

local function check(a, kernel, what)
  local want, want_prefix, want_blocks = reference(a)
  local c = clone_args(a)
  c.kernel = kernel
  local y = k3.attn_res(c)
  local got = y:to("cpu"):to("f64")
  assert.is_false(H.has_nan(got), what .. ": output has NaN (unwritten elements)")
  local t = tol[a.prefix:dtype()]
  if not k3.allclose(got, want, {atol = t[1], rtol = t[2]}) then
    error(string.format("%s: max abs diff %g vs the fp64 reference", what, k3.max_abs_diff(got, want)))
  end
  assert.equal(0, k3.max_abs_diff(a.prefix, want_prefix), what .. ": prefix after the call")
  assert.equal(0, k3.max_abs_diff(a.blocks, want_blocks), what .. ": blocks after the call")
  return y
end

local function kernels_of(trace)
  local k = {}
  for _, r in ipairs(trace) do k[#k + 1] = r.kernel end
  return k
end

-- In a child process under environment `env`, T = 300 prefill reads at each of `nbs` blocks,
-- run by dispatch (kernel nil) or by name, against cuda.attn_res.generic: per read the kernel
-- that ran, whether out matches generic's and whether the written-back prefix is bitwise
-- equal ("<kernel> true true " each, then a newline).
local function child_vs_generic(env, kernel, nbs)
  local chunk = string.format([[
    local function r(shape, seed) return k3.randn(shape, {device = "cuda", dtype = "bf16", seed = seed}) end
    for _, nb in ipairs({%s}) do
      local a = {prefix = r({300, 7168}, 10 + nb), delta = r({300, 7168}, 20 + nb),
        blocks = r({300, 8, 7168}, 30 + nb), num_blocks = nb, norm_weight = r({7168}, 40),
        qk_weight = r({7168}, 41), output_norm_weight = r({7168}, 42), eps = 1e-5, output_eps = 1e-5}
      local b = {}
      for k, v in pairs(a) do b[k] = v end
      b.prefix = a.prefix:clone()
      a.kernel, b.kernel = %s, "cuda.attn_res.generic"
      local tr = k3.trace(function() a.out = k3.attn_res(a) end)
      b.out = k3.attn_res(b)
      local ok = k3.allclose(a.out:to("f64"), b.out:to("f64"), {atol = 8e-2, rtol = 3e-2})
      io.write(tr[1].kernel, " ", tostring(ok), " ", tostring(k3.max_abs_diff(a.prefix, b.prefix) == 0), " ")
    end
    print()]], table.concat(nbs, ", "), kernel and string.format("%q", kernel) or "nil")
  local f = assert(io.popen(env .. " scripts/k3 -e '" .. chunk .. "' 2>&1"))
  local out = f:read("a")
  f:close()
  return out
end

-- Whether kernel K is registered; where it is not (a device without cluster launch, or
-- K3_DISABLE_KERNELS), a direct call must name it in its error.
local function have_kernel(K)
  if k3.has_kernel(K) then return true end
  local a = inputs(1, 1, 64)
  a.kernel = K
  H.raises(function() k3.attn_res(a) end, K)
  return false
end

-- The decode shapes, against the fp64 reference: every T in 1..17
-- at hidden 7168, T = 1, 4, 16, 17 at hidden 4096, 7000 and 7176, with 1, 4 and 8 blocks; then 16
-- blocks, and 11 of 12 slots with padded block rows.
local function decode_shapes(K)
  for _, hd in ipairs({4096, 7000, 7168, 7176}) do
    local ts = hd == 7168 and {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17} or {1, 4, 16, 17}
    for _, T in ipairs(ts) do
      for _, nb in ipairs({1, 4, 8}) do
        check(inputs(T, 8, hd, {num_blocks = nb, seed = hd + T + nb}), K,
          string.format("bf16 H=%d T=%d nb=%d", hd, T, nb))
      end
    end
  end
  check(inputs(5, 16, 7168, {num_blocks = 16}), K, "16 blocks")
  check(inputs(3, 12, 7168, {num_blocks = 11, bpad = 8}), K, "11 of 12 blocks, padded block rows")
end

-- The static_weights / static_blocks contract on kernel K: seal then read back to back,
-- bitwise as with nothing static.
local function static_contract(K)
  -- The Kimi-K3 order, queued with no host wait: step i seals slot i (num_blocks i - 1),
  -- then the next read takes num_blocks i, its delta the seal's output. Under the contract,
  -- slots sealed before the previous call are static and the slot the previous call sealed
  -- is not. Run once with the contract and once without; every output, the prefix and the
  -- blocks must be bitwise equal (a slot or weight loaded before it was written would not be).
  local T, S, Hd = 16, 16, 7168
  local function run(static)
    local a = inputs(T, S, Hd, {seed = 900})
    k3.synchronize() -- the inputs are written before the first call: its weights are static
    local outs, delta = {}, a.delta
    for i = 1, S do
      local seal = {prefix = a.prefix, delta = delta, blocks = a.blocks, num_blocks = i - 1,
                    write_block = i, norm_weight = a.norm_weight, qk_weight = a.qk_weight,
                    output_norm_weight = a.output_norm_weight, kernel = K,
                    out = k3.empty({T, Hd}, {device = "cuda", dtype = "bf16"})}
      local read = {prefix = a.prefix, delta = seal.out, blocks = a.blocks, num_blocks = i,
                    norm_weight = a.norm_weight, qk_weight = a.qk_weight,
                    output_norm_weight = a.output_norm_weight, kernel = K,
                    out = k3.empty({T, Hd}, {device = "cuda", dtype = "bf16"})}
      if static then
        seal.static_weights, seal.static_blocks = true, i - 1
        read.static_weights, read.static_blocks = true, i - 1
      end
      k3.attn_res(seal)
      k3.attn_res(read)
      outs[#outs + 1], outs[#outs + 2] = seal.out, read.out
      delta = read.out
    end
    return outs, a.prefix:to("cpu"), a.blocks:to("cpu")
  end
  local o1, p1, b1 = run(true)
  local o0, p0, b0 = run(false)
  for i = 1, #o0 do
    assert.is_false(H.has_nan(o1[i]:to("cpu"):to("f64")), "call " .. i .. ": NaN")
    assert.equal(0, k3.max_abs_diff(o1[i], o0[i]), "call " .. i .. ": output")
  end
  assert.equal(0, k3.max_abs_diff(p1, p0), "prefix")
  assert.equal(0, k3.max_abs_diff(b1, b0), "blocks")
end

describe("cuda.attn_res.generic #gpu", function()
  if not H.require_gpu() then return end
  local K = "cuda.attn_res.generic"

  for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
    it(dt .. ": padded rows, write_block inside num_blocks, delta, output norm", function()
      check(inputs(17, 5, 132, {dtype = dt, pad = 7, bpad = 3, write_block = 2, num_blocks = 4}), K, dt)
      check(inputs(3, 4, 33, {dtype = dt, pad = 1, write_block = 4, num_blocks = 2, onorm = false}), K,
        dt .. " no output norm")
      check(inputs(5, 3, 260, {dtype = dt, delta = false, num_blocks = 3}), K, dt .. " no delta")
    end)
  end

  it("every num_blocks from 0 to S", function()
    for nb = 0, 6 do
      check(inputs(4, 6, 64, {num_blocks = nb, seed = 200 + nb}), K, "num_blocks " .. nb)
    end
    check(inputs(4, 6, 64, {num_blocks = 0, delta = false, onorm = false}), K, "num_blocks 0, plain")
  end)

  it("hidden sizes around the fast kernels' limits", function()
    for _, hd in ipairs({4096, 7000, 7168, 7176, 7}) do
      check(inputs(3, 8, hd, {num_blocks = 8, pad = 5, seed = hd}), K, "hidden " .. hd)
    end
  end)

  it("rows of several tiles, sources of several groups, f64 across a cluster", function()
    check(inputs(3, 2, 40000, {dtype = "f32", num_blocks = 1, seed = 210}), K, "f32 H=40000 (3 tiles)")
    check(inputs(2, 3, 40000, {dtype = "bf16", num_blocks = 3, write_block = 1, pad = 3, seed = 211}), K,
      "bf16 H=40000 padded, a seal")
    check(inputs(5, 21, 7168, {num_blocks = 20, seed = 212}), K, "num_blocks 20 (two groups)")
    check(inputs(3, 40, 1000, {num_blocks = 37, write_block = 37, dtype = "f16", seed = 213}), K,
      "num_blocks 37 (three groups), sealing the last")
    check(inputs(2, 8, 7168, {dtype = "f64", num_blocks = 8, seed = 214}), K, "f64 H=7168 (a cluster)")
    check(inputs(16, 4, 7168, {dtype = "f64", num_blocks = 1, delta = false, seed = 215}), K, "f64 H=7168 no delta")
  end)

  it("many tokens and one", function()
    check(inputs(1, 2, 96, {num_blocks = 2}), K, "T=1")
    check(inputs(1100, 3, 256, {num_blocks = 3, write_block = 3, pad = 8}), K, "T=1100")
  end)

  it("strided rows at T = 16 through the 16-byte and the element path of each tensor", function()
    -- A layout {pad, off}: rows pad elements longer than H, the view off elements in. {8, 0}:
    -- 16-byte aligned starts and strides; {8, 1}: aligned strides, unaligned starts; {7, 0}:
    -- unaligned strides; {0, 0}: dense. prefix, delta and out take one layout, blocks another;
    -- qk_weight ~ 0.5 / sqrt(H) gives logits of order one, so every source weighs in the mix and
    -- a wrong one moves the cosine against the reference.
    local T, S, Hd = 16, 10, 7168
    local function rows(dt, pad, off, seed)
      return k3.randn({T, Hd + pad}, {device = "cuda", dtype = dt, seed = seed}):narrow(2, 1 + off, Hd)
    end
    local n = 0
    for _, dt in ipairs({"bf16", "f32"}) do
      for i, rl in ipairs({{0, 0}, {8, 0}, {8, 1}, {7, 0}}) do
        for j, bl in ipairs({{0, 0}, {8, 3}, {5, 0}}) do
          if dt == "bf16" or i == j + 1 then
            local seed = 1000 + 100 * i + 10 * j + (dt == "f32" and 1 or 0)
            local a = {
              prefix = rows(dt, rl[1], rl[2], seed + 1),
              delta = (i + j) % 4 ~= 0 and rows(dt, rl[1], rl[2], seed + 2) or nil,
              blocks = k3.randn({T, S, Hd + bl[1]}, {device = "cuda", dtype = dt, seed = seed + 3})
                :narrow(3, 1 + bl[2], Hd),
              num_blocks = 8, write_block = ({nil, 10, 3})[j],
              norm_weight = (k3.randn({Hd}, {dtype = dt, seed = seed + 4}) * 0.5 + 1):to("cuda"),
              qk_weight = (k3.randn({Hd}, {dtype = dt, seed = seed + 5}) * (0.5 / math.sqrt(Hd))):to("cuda"),
              output_norm_weight = (k3.randn({Hd}, {dtype = dt, seed = seed + 6}) * 0.1 + 1):to("cuda"),
              out = rows(dt, rl[1], rl[2], seed + 7),
            }
            a.out:fill(0 / 0)
            local what = string.format("%s rows {%d, %d} blocks {%d, %d}", dt, rl[1], rl[2], bl[1], bl[2])
            local want = reference(a)
            local y = check(a, K, what)
            local cos = k3.cosine(y:to("cpu"):to("f64"), want)
            assert.is_true(cos > (dt == "bf16" and 1 - 2e-5 or 1 - 1e-9), what .. ": cosine " .. cos)
            n = n + 1
          end
        end
      end
    end
    assert.equal(15, n)
  end)

  it("static_weights / static_blocks: seal then read back to back, bitwise as with nothing static", function()
    static_contract(K)
  end)

  it("an empty token dim writes nothing and raises nothing", function()
    local a = inputs(0, 3, 64)
    a.kernel = K
    local y = k3.attn_res(a)
    assert.same({0, 64}, y:size())
  end)
end)

describe("cuda.attn_res.decode #gpu", function()
  if not H.require_gpu() then return end
  local K = "cuda.attn_res.decode"
  local default_policy = k3.policy
  after_each(function() k3.set_policy(default_policy) end)

  local function have_decode() return have_kernel(K) end

  it("decode shapes: T 1..17, 1/4/8/16 blocks, hidden 4096, 7000, 7168, 7176", function()
    if not have_decode() then return end
    decode_shapes(K)
  end)

  it("every read of the stream: delta or none, a fused seal or none, num_blocks 0..16, bf16 and f16", function()
    if not have_decode() then return end
    for _, dt in ipairs({"bf16", "f16"}) do
      for nb = 0, 16 do
        local T = ({1, 3, 16})[nb % 3 + 1]
        check(inputs(T, 17, 7168, {dtype = dt, num_blocks = nb, seed = 700 + nb}), K,
          string.format("%s nb=%d delta", dt, nb))
        check(inputs(T, 17, 7168, {dtype = dt, num_blocks = nb, delta = false, seed = 720 + nb}), K,
          string.format("%s nb=%d no delta", dt, nb))
        check(inputs(T, 17, 7168, {dtype = dt, num_blocks = nb, write_block = nb + 1, seed = 740 + nb}), K,
          string.format("%s nb=%d seal into slot %d", dt, nb, nb + 1))
      end
      check(inputs(2, 8, 7168, {dtype = dt, num_blocks = 6, onorm = false}), K, dt .. " no output norm")
      check(inputs(2, 8, 7168, {dtype = dt, num_blocks = 6, write_block = 3}), K,
        dt .. " a written slot inside num_blocks is read after the write")
    end
  end)

  it("static_weights / static_blocks: seal then read back to back, bitwise as with nothing static", function()
    if not have_decode() then return end
    static_contract(K)
  end)

  it("every block source static: against the reference, and bitwise as with nothing static", function()
    if not have_decode() then return end
    -- static_blocks = num_blocks with static_weights lets the kernel load every block source
    -- before its wait; the same inputs with nothing static must give the same bits. Hidden
    -- 7168 (a cluster of 4 CTAs a token) and 256 (one CTA), with and without output norm, delta
    -- and a fused seal, bf16 and f16, f32 weights.
    local n = 0
    for _, hd in ipairs({7168, 256}) do
      for nb = 1, 8 do
        for v = 1, 4 do
          local dt = v == 3 and "f16" or "bf16"
          local o = {dtype = dt, num_blocks = nb, seed = 1300 + 10 * nb + v + hd,
                     onorm = v ~= 2, delta = v ~= 4, write_block = v % 2 == 1 and nb + 1 or nil,
                     wdtype = v == 4 and "f32" or nil}
          local T = ({1, 3, 16})[(nb + v) % 3 + 1]
          local what = string.format("H=%d T=%d nb=%d %s%s%s%s", hd, T, nb, dt, o.onorm and "" or " no norm",
            o.delta and "" or " no delta", o.write_block and " seal" or "")
          local a1, a0 = inputs(T, 10, hd, o), inputs(T, 10, hd, o)
          a1.static_weights, a1.static_blocks = true, nb
          k3.synchronize() -- the inputs are written before the call: its weights and blocks are static
          local y1 = check(a1, K, what .. " static")
          a0.kernel = K
          local y0 = k3.attn_res(a0)
          assert.equal(0, k3.max_abs_diff(y1, y0), what .. ": output")
          assert.equal(0, k3.max_abs_diff(a1.prefix, a0.prefix), what .. ": prefix")
          assert.equal(0, k3.max_abs_diff(a1.blocks, a0.blocks), what .. ": blocks")
          n = n + 1
        end
      end
    end
    assert.equal(64, n)
  end)

  it("10 or 11 sources of 12 slots; T 1..17, 64; hidden 8192", function()
    if not have_decode() then return end
    for T = 1, 17 do
      check(inputs(T, 12, 7168, {num_blocks = 9 + T % 2, bpad = 8, seed = 800 + T}), K,
        string.format("T=%d %d of 12 blocks", T, 9 + T % 2))
    end
    check(inputs(64, 12, 7168, {num_blocks = 10, write_block = 11, seed = 820}), K, "T=64 seal")
    check(inputs(16, 8, 8192, {num_blocks = 8, seed = 821}), K, "H=8192")
  end)

  it("f16, f32 weights, small and large hidden sizes", function()
    if not have_decode() then return end
    check(inputs(16, 8, 7168, {dtype = "f16"}), K, "f16")
    check(inputs(16, 8, 7168, {wdtype = "f32"}), K, "bf16 with f32 weights")
    check(inputs(3, 16, 7168, {wdtype = "f32", num_blocks = 16, delta = false}), K, "f32 weights 16 blocks")
    check(inputs(2, 4, 64, {}), K, "hidden 64")
    check(inputs(2, 4, 8, {}), K, "hidden 8")
    check(inputs(2, 8, 16384, {}), K, "hidden 16384")
    check(inputs(2, 8, 32768, {}), K, "hidden 32768")
    check(inputs(64, 8, 7168, {num_blocks = 8}), K, "T=64 (the largest decode batch)")
  end)

  it("key and output norms hold for inputs near 1e20 and 1e-25 (eps = 0: scale-invariant)", function()
    if not have_decode() then return end
    for _, scale in ipairs({1e20, 1e-25, 3e36}) do
      for _, kern in ipairs({K, "cuda.attn_res.generic"}) do
        local a = inputs(3, 8, 7168, {num_blocks = 5, delta = false, seed = 900})
        a.prefix:copy(a.prefix * scale)
        a.blocks:copy(a.blocks * scale)
        a.eps, a.output_eps = 0, 0
        check(a, kern, string.format("%s scale %g", kern, scale))
      end
    end
  end)

  it("an all-zero source keeps logit 0 with a denormal eps (its key norm 1/sqrt(eps) stays finite)", function()
    -- The softmax's rsqrt flushes a denormal argument to 0 (then 0 * inf = NaN); an all-zero
    -- source is the one whose argument is eps alone, so its eps is raised to FLT_MIN (the
    -- reference: 0 * 1/sqrt(1e-40) = 0).
    if not have_decode() then return end
    for _, nb in ipairs({1, 4, 8}) do
      local a = inputs(3, 8, 7168, {num_blocks = nb, delta = false, seed = 980 + nb})
      a.blocks:select(2, nb):fill(0)
      a.eps = 1e-40
      check(a, K, string.format("nb=%d, slot %d all zero, eps 1e-40", nb, nb))
    end
  end)

  it("the output norm holds when the mixed sources nearly cancel (a mix ~1% of its sources)", function()
    -- qk_weight 0 gives every source the same logit, so the mix is the sources' mean; the
    -- blocks hold v and p holds -nb * v + 0.05 noise (above bf16's rounding of nb * v), so the
    -- mean is about the noise over nb + 1: a norm taken from the sources' pairwise products
    -- would lose its digits to cancellation.
    if not have_decode() then return end
    for _, nb in ipairs({1, 4, 8}) do
      local a = inputs(3, 8, 7168, {num_blocks = nb, delta = false, seed = 950 + nb})
      local v = k3.randn({3, 7168}, {device = "cuda", dtype = "bf16", seed = 960 + nb})
      for s = 1, nb do a.blocks:select(2, s):copy(v) end
      local noise = k3.randn({3, 7168}, {device = "cuda", dtype = "f32", seed = 970 + nb})
      a.prefix:copy(v:to("f32") * -nb + noise * 0.05)
      a.qk_weight:fill(0)
      check(a, K, string.format("nb=%d, sources cancelling", nb))
    end
  end)

  it("T > 64 at num_blocks 5..16 and T >= 256 at 1..4 where the ring kernel takes the call are declined by name; other T are served", function()
    if not have_decode() then return end
    local a = inputs(65, 8, 7168, {num_blocks = 5})
    a.kernel = K
    H.raises(function() k3.attn_res(a) end,
      "attn_res: cuda.attn_res.decode serves T <= 64 tokens at num_blocks 5..16 (at num_blocks <= 4 any T, below 256 where cuda.attn_res.ring takes the call); got T = 65 at num_blocks 5")
    a = inputs(256, 8, 7168, {num_blocks = 4})
    a.kernel = K
    H.raises(function() k3.attn_res(a) end,
      "attn_res: cuda.attn_res.decode leaves T >= 256 tokens at num_blocks 1..4 to cuda.attn_res.ring (faster there); got T = 256 at num_blocks 4")
    -- beside the ring kernel (no delta, no output norm, a block write, a hidden size it does
    -- not take) the decode kernel keeps every T up to num_blocks 4, and at num_blocks 0 always
    a = inputs(65, 8, 64, {num_blocks = 5, delta = false})
    a.kernel = K
    H.raises(function() k3.attn_res(a) end,
      "attn_res: cuda.attn_res.decode serves T <= 64 tokens at num_blocks 5..16 (at num_blocks <= 4 any T, below 256 where cuda.attn_res.ring takes the call); got T = 65 at num_blocks 5")
    for _, c in ipairs({{nb = 0, o = {}}, {nb = 4, o = {delta = false}}, {nb = 4, o = {onorm = false}},
                        {nb = 3, o = {write_block = 4}}, {nb = 4, o = {}, H = 16384},
                        {nb = 2, o = {}, T = 255}, {nb = 4, o = {}, T = 192}}) do
      c.o.num_blocks, c.o.seed = c.nb, 910 + c.nb
      a = inputs(c.T or 300, 8, c.H or 7168, c.o)
      a.kernel = K
      check(a, K, string.format("T = %d, num_blocks %d by name (H %d)", c.T or 300, c.nb, c.H or 7168))
    end
    a = inputs(2, 17, 7168, {num_blocks = 17})
    a.kernel = K
    H.raises(function() k3.attn_res(a) end,
      "attn_res: cuda.attn_res.decode requires num_blocks in 0..16; got 17")
  end)

  it("row-padded prefix and delta: direct call and default dispatch raise the layout error", function()
    if not have_decode() then return end
    local msg = "attn_res: cuda.attn_res.decode requires densely packed rows; got strides 7175, 7175, 7168 for hidden_size 7168"
    local a = inputs(17, 5, 7168, {pad = 7, opad = 0})
    assert.same({7175, 1}, a.prefix:stride())
    assert.same({7168, 1}, a.out:stride())
    local p0, b0 = a.prefix:clone(), a.blocks:clone()
    local c = clone_args(a)
    c.kernel = K
    H.raises(function() k3.attn_res(c) end, msg)
    -- default dispatch: the first fast kernel's message
    H.raises(function() k3.attn_res(clone_args(a)) end, msg)
    assert.equal(0, k3.max_abs_diff(a.prefix, p0)) -- nothing written
    assert.equal(0, k3.max_abs_diff(a.blocks, b0))
    assert.is_true(H.has_nan(a.out))
  end)

  it("with on_layout_mismatch = fallback the generic kernel answers", function()
    local a = inputs(17, 5, 7168, {pad = 7, opad = 0})
    local pol = {}
    for k, v in pairs(default_policy) do pol[k] = v end
    pol.on_layout_mismatch = "fallback"
    k3.set_policy(pol)
    local b0 = a.blocks:clone()
    local want, want_prefix = reference(a)
    local y
    local tr = k3.trace(function() y = k3.attn_res(clone_args(a)) end)
    assert.same({"cuda.attn_res.generic"}, kernels_of(tr))
    if k3.has_kernel(K) then
      assert.equal(K, tr[1].declined[1].kernel)
      assert.truthy(tr[1].declined[1].reason:find("densely packed rows", 1, true))
    end
    assert.is_false(H.has_nan(y))
    assert.is_true(k3.allclose(y:to("cpu"):to("f64"), want, {atol = 8e-2, rtol = 3e-2}))
    assert.equal(0, k3.max_abs_diff(a.prefix, want_prefix))
    assert.equal(0, k3.max_abs_diff(a.blocks, b0)) -- no write_block: every slot untouched
  end)

  it("dispatch: decode reads run decode, prefill runs the ring (the stream kernel where it is absent), the rest go to generic", function()
    local S, R = "cuda.attn_res.stream", "cuda.attn_res.ring"
    for _, case in ipairs({
      {T = 1, o = {num_blocks = 8}, k = K}, {T = 16, o = {num_blocks = 4}, k = K},
      {T = 64, o = {num_blocks = 16, S = 16}, k = K},
      {T = 2, o = {num_blocks = 0}, k = K}, {T = 2, o = {delta = false}, k = K},
      {T = 2, o = {onorm = false}, k = K}, {T = 2, o = {num_blocks = 1, write_block = 2}, k = K},
    }) do
      local tr = k3.trace(function() k3.attn_res(inputs(case.T, case.o.S or 8, 7168, case.o)) end)
      local want = k3.has_kernel(case.k) and case.k or k3.has_kernel(K) and K or "cuda.attn_res.generic"
      assert.same({want}, kernels_of(tr), string.format("T=%d %s", case.T, case.k))
    end
    local tr = k3.trace(function() k3.attn_res(inputs(300, 8, 7168, {num_blocks = 8})) end)
    assert.same({k3.has_kernel(R) and R or k3.has_kernel(S) and S or "cuda.attn_res.generic"},
      kernels_of(tr), "T=300")
    if k3.has_kernel(K) then
      assert.equal("cuda.attn_res.decode serves T <= 64 tokens at num_blocks 5..16 (at num_blocks " ..
        "<= 4 any T, below 256 where cuda.attn_res.ring takes the call); got T = 300 at " ..
        "num_blocks 8", tr[1].declined[1].reason)
    end
    -- prefill at num_blocks 1..4 runs the ring at T >= 256 (faster than decode and stream
    -- there) and decode below (T = 192), at 5..16 the ring from T = 65, at 0 decode
    local ring = k3.has_kernel(R) and R or nil
    tr = k3.trace(function() k3.attn_res(inputs(300, 8, 7168, {num_blocks = 4})) end)
    assert.same({ring or k3.has_kernel(S) and S or "cuda.attn_res.generic"}, kernels_of(tr), "T=300 num_blocks 4")
    tr = k3.trace(function() k3.attn_res(inputs(192, 8, 7168, {num_blocks = 4})) end)
    assert.same({k3.has_kernel(K) and K or k3.has_kernel(S) and S or "cuda.attn_res.generic"},
      kernels_of(tr), "T=192 num_blocks 4")
    tr = k3.trace(function() k3.attn_res(inputs(300, 8, 7168, {num_blocks = 1})) end)
    assert.same({ring or k3.has_kernel(S) and S or "cuda.attn_res.generic"}, kernels_of(tr), "T=300 num_blocks 1")
    for _, nb in ipairs({0, 5, 12, 16}) do
      tr = k3.trace(function() k3.attn_res(inputs(300, 16, 7168, {num_blocks = nb})) end)
      local want = nb == 0 and k3.has_kernel(K) and K or ring or "cuda.attn_res.generic"
      assert.same({want}, kernels_of(tr), "T=300 num_blocks " .. nb)
    end
    tr = k3.trace(function() k3.attn_res(inputs(300, 8, 7168, {num_blocks = 4, delta = false})) end)
    assert.same({k3.has_kernel(K) and K or "cuda.attn_res.generic"}, kernels_of(tr), "T=300 num_blocks 4 no delta")
    for _, case in ipairs({
      {T = 2, o = {dtype = "f32"}, why = "supports bf16 and f16"},
      {T = 300, o = {num_blocks = 17, S = 17}, why = "requires num_blocks in 0..16"},
      {T = 300, o = {num_blocks = 6, S = 8, write_block = 2}, why = "does not write blocks"},
    }) do
      local tr = k3.trace(function() k3.attn_res(inputs(case.T, case.o.S or 4, 64, case.o)) end)
      assert.same({"cuda.attn_res.generic"}, kernels_of(tr), case.why)
      local found = false
      for _, d in ipairs(tr[1].declined) do found = found or d.reason:find(case.why, 1, true) ~= nil end
      if k3.has_kernel(K) and k3.has_kernel(S) then assert.is_true(found, case.why) end
    end
  end)

  it("a policy without the decode kernel runs num_blocks 0, 4 and 8 on generic", function()
    k3.set_policy{attn_res = {"cuda.attn_res.generic", "cpu.attn_res.reference"}}
    for _, nb in ipairs({0, 4, 8}) do
      local a = inputs(4, 8, 7168, {num_blocks = nb, seed = 300 + nb})
      local tr = k3.trace(function() k3.attn_res(clone_args(a)) end)
      assert.same({"cuda.attn_res.generic"}, kernels_of(tr))
    end
  end)

  it("K3_DISABLE_KERNELS=cuda.attn_res.decode routes every decode read to generic", function()
    if os.getenv("K3_UNDER_SANITIZER") then return end -- a child process would share its log
    local chunk = [[
      assert(not k3.has_kernel("cuda.attn_res.decode"))
      for _, nb in ipairs({0, 4, 8}) do
        local a = {prefix = k3.randn({3, 7168}, {device = "cuda", dtype = "bf16"}),
          delta = k3.randn({3, 7168}, {device = "cuda", dtype = "bf16", seed = 1}),
          blocks = k3.randn({3, 8, 7168}, {device = "cuda", dtype = "bf16", seed = 2}),
          num_blocks = nb, norm_weight = k3.ones({7168}, {device = "cuda", dtype = "bf16"}),
          qk_weight = k3.ones({7168}, {device = "cuda", dtype = "bf16"}),
          output_norm_weight = k3.ones({7168}, {device = "cuda", dtype = "bf16"})}
        local tr = k3.trace(function() k3.attn_res(a) end)
        io.write(tr[1].kernel, " ")
      end
      print()]]
    local f = assert(io.popen("K3_DISABLE_KERNELS=cuda.attn_res.decode scripts/k3 -e '" .. chunk .. "' 2>&1"))
    local out = f:read("a")
    f:close()
    assert.equal("cuda.attn_res.generic cuda.attn_res.generic cuda.attn_res.generic \n", out)
  end)

  it("K3_ATTN_RES_DECODE_MAX_T=1000 lets the decode kernel serve T = 300 at num_blocks 5 and 8", function()
    if os.getenv("K3_UNDER_SANITIZER") then return end -- a child process would share its log
    assert.equal("cuda.attn_res.decode true true cuda.attn_res.decode true true \n",
      child_vs_generic("K3_ATTN_RES_DECODE_MAX_T=1000", "cuda.attn_res.decode", {5, 8}))
  end)
end)

-- The prefill kernels' scale cases: inputs near 1e20, 1e-25 and 3e36 with eps = 0, where every
-- sum of squares overflows or underflows f32 (the rare paths of the key norms and the output
-- norm); cases are {num_blocks, H, seed offset} over S block slots at T = 64.
local function check_scales(K, cases, S, seed)
  for _, scale in ipairs({1e20, 1e-25, 3e36}) do
    for _, c in ipairs(cases) do
      local a = inputs(64, S, c[2], {num_blocks = c[1], seed = seed + c[3]})
      a.prefix:copy(a.prefix * scale)
      a.delta:copy(a.delta * scale)
      a.blocks:copy(a.blocks * scale)
      a.eps, a.output_eps = 0, 0
      check(a, K, string.format("scale %g num_blocks %d H=%d", scale, c[1], c[2]))
    end
  end
end

-- Row-padded prefix and delta ([65, 7168] views of [65, 7175]) called by name: kernel K's layout
-- error.
local function raises_padded_rows(K, nb)
  local a = inputs(65, nb, 7168, {pad = 7, opad = 0})
  a.kernel = K
  H.raises(function() k3.attn_res(a) end,
    "attn_res: " .. K .. " requires densely packed rows; got strides 7175, 7175, 7168 for hidden_size 7168")
end

describe("cuda.attn_res.stream #gpu", function()
  if not H.require_gpu() then return end
  local K = "cuda.attn_res.stream"
  if not k3.has_kernel(K) then
    -- Not registered here (K3_DISABLE_KERNELS): the suite says so, and forcing it must raise.
    it("is not registered, and a call forced to it raises", function()
      assert.is_false(have_kernel(K))
    end)
    return
  end

  it("prefill shapes: T 64, 300, 4097; num_blocks 1, 4, 8; padded blocks; f16; f32 weights", function()
    for _, T in ipairs({64, 300}) do
      for _, nb in ipairs({1, 4, 8}) do
        check(inputs(T, nb, 7168, {num_blocks = nb, seed = 500 + T + nb}), K,
          string.format("bf16 H=7168 T=%d nb=%d", T, nb))
      end
    end
    check(inputs(300, 12, 7168, {num_blocks = 8, bpad = 8, seed = 601}), K, "T=300 8 of 12 blocks, padded block rows")
    check(inputs(300, 8, 7168, {num_blocks = 5, dtype = "f16", bpad = 16, seed = 602}), K, "f16 T=300 nb=5 padded")
    check(inputs(300, 8, 7168, {num_blocks = 8, wdtype = "f32", seed = 603}), K, "T=300 f32 weights")
    check(inputs(64, 8, 8192, {num_blocks = 8, seed = 604}), K, "T=64 H=8192 (512 threads)")
    check(inputs(300, 4, 7176, {num_blocks = 4, seed = 605}), K, "T=300 H=7176 (idle slots)")
    check(inputs(300, 3, 1000, {num_blocks = 3, seed = 606}), K, "T=300 H=1000")
    check(inputs(4097, 1, 7168, {num_blocks = 1, seed = 607}), K, "T=4097 nb=1")
    check(inputs(4097, 8, 1024, {num_blocks = 8, seed = 608}), K, "T=4097 H=1024 nb=8")
    check(inputs(4097, 8, 1024, {num_blocks = 8, dtype = "f16", bpad = 8, seed = 609}), K, "f16 T=4097 H=1024 nb=8 padded")
  end)

  it("key and output norms hold for inputs near 1e20, 1e-25 and 3e36 (eps = 0: scale-invariant)", function()
    -- both the full-token and the general shape
    check_scales(K, {{8, 7168, 1}, {5, 1000, 2}}, 8, 910)
  end)

  it("row-padded rows raise its own layout error by name", function() raises_padded_rows(K, 5) end)

  -- stream_threads: H / 8 vectors, two a thread, over 64..512 threads: H = 520 (65 vectors,
  -- 64 threads) is the least it takes, 8192 the most; the decode kernel leaves it T >= 256 at
  -- num_blocks 2..4 for every such H
  it("hidden sizes 520..8192: the ends served, 512 and 8200 declined by name", function()
    for _, hd in ipairs({520, 8192}) do
      check(inputs(300, 4, hd, {num_blocks = 3, seed = 700 + hd}), K, "T=300 nb=3 H=" .. hd)
    end
    for _, hd in ipairs({512, 8200}) do
      local a = inputs(300, 4, hd, {num_blocks = 3})
      a.kernel = K
      H.raises(function() k3.attn_res(a) end,
        "attn_res: cuda.attn_res.stream supports hidden sizes 520..8192; got " .. hd)
    end
    -- by dispatch the ring kernel takes it where it is registered (faster)
    local tr = k3.trace(function() k3.attn_res(inputs(300, 4, 520, {num_blocks = 3})) end)
    local R = "cuda.attn_res.ring"
    assert.same({k3.has_kernel(R) and R or K}, kernels_of(tr), "T=300 nb=3 H=520")
  end)

  it("K3_DISABLE_KERNELS=cuda.attn_res.ring: dispatch runs it at T = 300, num_blocks 4 and 8, with generic's results", function()
    if os.getenv("K3_UNDER_SANITIZER") then return end -- a child process would share its log
    assert.equal("cuda.attn_res.stream true true cuda.attn_res.stream true true \n",
      child_vs_generic("K3_DISABLE_KERNELS=cuda.attn_res.ring", nil, {4, 8}))
  end)
end)

describe("cuda.attn_res.ring #gpu", function()
  if not H.require_gpu() then return end
  local K = "cuda.attn_res.ring"
  if not k3.has_kernel(K) then
    it("is not registered, and a call forced to it raises", function()
      assert.is_false(have_kernel(K))
    end)
    return
  end

  it("prefill shapes: T 64, 300, 4097; num_blocks 0..16; padded blocks; f16; f32 weights", function()
    for _, T in ipairs({64, 300}) do
      for _, nb in ipairs({0, 1, 4, 5, 8, 9, 16}) do
        check(inputs(T, 16, 7168, {num_blocks = nb, seed = 800 + T + nb}), K,
          string.format("bf16 H=7168 T=%d nb=%d of 16 slots", T, nb))
      end
    end
    check(inputs(300, 12, 7168, {num_blocks = 11, bpad = 8, seed = 901}), K, "T=300 11 of 12 blocks, padded block rows")
    check(inputs(300, 8, 7168, {num_blocks = 3, dtype = "f16", bpad = 16, seed = 902}), K, "f16 T=300 nb=3 padded")
    check(inputs(300, 8, 7168, {num_blocks = 2, wdtype = "f32", seed = 903}), K, "T=300 f32 weights")
    check(inputs(300, 16, 4096, {num_blocks = 13, dtype = "f16", wdtype = "f32", seed = 904}), K,
      "f16 T=300 H=4096 nb=13, f32 weights")
    check(inputs(64, 4, 8192, {num_blocks = 4, seed = 905}), K, "T=64 H=8192 (256 threads)")
    check(inputs(300, 4, 7176, {num_blocks = 4, seed = 906}), K, "T=300 H=7176 (idle vectors)")
    check(inputs(4097, 1, 7168, {num_blocks = 1, seed = 907}), K, "T=4097 nb=1")
    check(inputs(4097, 8, 7168, {num_blocks = 8, seed = 910}), K, "T=4097 nb=8")
    check(inputs(4097, 16, 7168, {num_blocks = 16, seed = 908}), K, "T=4097 nb=16")
    check(inputs(4097, 12, 1024, {num_blocks = 10, dtype = "f16", bpad = 8, seed = 909}), K,
      "f16 T=4097 H=1024 nb=10 padded (more CTAs an SM)")
  end)

  it("key and output norms hold for inputs near 1e20, 1e-25 and 3e36 (eps = 0: scale-invariant)", function()
    check_scales(K, {{4, 7168, 1}, {12, 1000, 2}}, 12, 930)
  end)

  it("one source far out of scale: that logit alone takes the scaled path", function()
    for _, c in ipairs({{4, 3, 1e20}, {4, 0, 1e-25}, {12, 10, 3e36}}) do
      local a = inputs(64, 12, 7168, {num_blocks = c[1], seed = 960 + c[2]})
      local slot = a.blocks:select(2, c[2] + 1)
      slot:copy(slot * c[3])
      a.eps, a.output_eps = 0, 0
      check(a, K, string.format("num_blocks %d, slot %d scaled by %g", c[1], c[2] + 1, c[3]))
    end
  end)

  it("row-padded rows raise its own layout error by name", function() raises_padded_rows(K, 4) end)

  it("hidden sizes 8..8192 served, 8200 declined by name; num_blocks 5..8 taken from the stream kernel", function()
    for _, hd in ipairs({8, 64, 520, 8192}) do
      check(inputs(300, 4, hd, {num_blocks = 3, seed = 940 + hd}), K, "T=300 nb=3 H=" .. hd)
    end
    local a = inputs(300, 4, 8200, {num_blocks = 3})
    a.kernel = K
    H.raises(function() k3.attn_res(a) end, "attn_res: cuda.attn_res.ring supports hidden sizes up to 8192; got 8200")
    -- 5..8 at the stream kernel's hidden sizes (520..8192) and below them: the ring by dispatch
    for _, hd in ipairs({64, 7168}) do
      check(inputs(300, 8, hd, {num_blocks = 6, seed = 950 + hd}), K, "T=300 nb=6 H=" .. hd)
      local tr = k3.trace(function() k3.attn_res(inputs(300, 8, hd, {num_blocks = 8})) end)
      assert.same({K}, kernels_of(tr), "T=300 nb=8 H=" .. hd .. " goes to the ring")
    end
    a = inputs(63, 4, 7168, {num_blocks = 2})
    a.kernel = K
    H.raises(function() k3.attn_res(a) end, "attn_res: cuda.attn_res.ring serves T >= 64 tokens; got T = 63")
  end)

  it("its L2 prefetch ahead of the copies, before the PDL wait, and one CTA an SM: the generic kernel's results", function()
    if os.getenv("K3_UNDER_SANITIZER") then return end -- a child process would share its log
    local want = "cuda.attn_res.ring true true cuda.attn_res.ring true true \n"
    assert.equal(want, child_vs_generic("K3_ATTN_RES_RING_L2_AHEAD=-1 K3_ATTN_RES_RING_L2_EARLY=1",
                                        K, {4, 8}))
    assert.equal(want, child_vs_generic("K3_ATTN_RES_RING_CPS=1 K3_ATTN_RES_RING_L2_AHEAD=3", K, {4, 8}))
  end)
end)
