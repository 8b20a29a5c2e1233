-- Tensor ops (API.md "tensor ops"): abs, exp, sqrt, sum, mean, max, min, t / u, the dtype
-- conversions, cat, stack, arange, linspace, equal, and integer scalars beyond 2^53. Each is
-- checked against a plain-Lua fp64 oracle over contiguous, transposed, narrowed, expanded
-- (zero-stride) and empty inputs in every dtype, with outputs poisoned with NaN; the #gpu
-- part runs the same checks on the CUDA kernels and compares them with the CPU kernels bit
-- for bit where k3.h promises it (all but exp).
local k3 = require "k3"
local H = require "spec.helpers"

local DTYPES = {"bf16", "f16", "f32", "f64"}
-- Unit roundoff of each dtype's significand (p bits: 2^-p) and of its accumulator.
local ULP = {bf16 = 2 ^ -8, f16 = 2 ^ -11, f32 = 2 ^ -24, f64 = 2 ^ -53}
local ACC = {bf16 = 2 ^ -24, f16 = 2 ^ -24, f32 = 2 ^ -24, f64 = 2 ^ -53}

-- Row-major values of t as a flat list of f64 numbers (any view, any device).
local function flat(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then
      for _, e in ipairs(v) do walk(e) end
    else
      out[#out + 1] = v
    end
  end
  walk(t:to("cpu"):to("f64"):totable())
  return out
end

-- A list of numbers rounded once to dt (k3.tensor rounds each f64 value once).
local function rounded(list, dt)
  if #list == 0 then return {} end
  return flat(k3.tensor(list, {dtype = dt}))
end

local function same_bits(got, want, what)
  assert.equal(#want, #got, what .. ": element count")
  for i = 1, #want do
    local g, w = got[i], want[i]
    if not (g == w or (g ~= g and w ~= w)) then
      error(string.format("%s: element %d is %.17g, expected %.17g", what, i, g, w))
    end
  end
end

-- The views every op is checked on: contiguous, transposed, narrowed (padded rows), expanded
-- (zero strides), a permuted 3-dim view, rows longer than the 256 summation lanes, and empty.
local function inputs(dt, device, seed)
  local o = {dtype = dt, device = device}
  local function randn(shape, s)
    return k3.randn(shape, {dtype = dt, device = device, seed = seed + s})
  end
  return {
    {"contiguous [5, 7]", randn({5, 7}, 1)},
    {"transposed [7, 5]", randn({5, 7}, 2):t()},
    {"narrowed [6, 5] of [6, 9]", randn({6, 9}, 3):narrow(2, 3, 5)},
    {"expanded [4, 7] of [1, 7]", randn({1, 7}, 4):expand({4, 7})},
    {"expanded [3, 6] of [3, 1]", randn({3, 1}, 5):expand({3, 6})},
    {"3-dim [5, 4, 3] transposed", randn({3, 4, 5}, 6):transpose(1, 3)},
    {"long rows [3, 1000]", randn({3, 1000}, 7)},
    {"1-dim [2051]", randn({2051}, 8)},
    {"empty [0, 3]", k3.empty({0, 3}, o)},
    {"empty [3, 0]", k3.empty({3, 0}, o)},
  }
end

-- ---- elementwise --------------------------------------------------------------------------------

local UNARY = {
  abs = math.abs,
  exp = math.exp,
  sqrt = function(v) return v < 0 and 0 / 0 or math.sqrt(v) end,
}

-- abs and sqrt are exact roundings (sqrt in f32 then rounded to 16 bits equals the exact root
-- rounded once: 24 >= 2p + 2), so they must match the oracle to the bit; exp is the math
-- library's, within 2 units of f32's last place (1 of f64's), plus the output's rounding.
local function check_unary(name, x, dt, what)
  local want = {}
  for i, v in ipairs(flat(x)) do want[i] = UNARY[name](v) end
  local out = H.poisoned(x:size(), {dtype = dt, device = x:device()})
  local y = k3[name](x, {out = out})
  assert.equal(out, y)
  assert.same(x:size(), y:size())
  local got = flat(y)
  if name ~= "exp" then return same_bits(got, rounded(want, dt), what) end
  for i, w in ipairs(want) do
    local tol = (dt == "f64" and 2 ^ -52 or 2 ^ -22) * math.abs(w) + ULP[dt] * math.abs(w)
    assert(math.abs(got[i] - w) <= tol,
      string.format("%s: exp element %d is %.17g, expected %.17g", what, i, got[i], w))
  end
end

-- t / u, t / s and s / t: an operand of at most 24 bits divided by another and rounded in f64
-- and then to the dtype is the exact quotient rounded once (53 >= 2 * 24 + 2), so the oracle
-- is exact; so is division by the small scalars used here.
local function check_div(x, dt, what)
  local u = x * 0.5 + 3 -- no zeros
  local xs, us = flat(x), flat(u)
  local tt, ts, st = {}, {}, {}
  for i = 1, #xs do
    tt[i] = xs[i] / us[i]
    ts[i] = xs[i] / 3
    st[i] = 7 / us[i]
  end
  same_bits(flat(x / u), rounded(tt, dt), what .. ": t / u")
  same_bits(flat(x / 3), rounded(ts, dt), what .. ": t / 3")
  same_bits(flat(7 / u), rounded(st, dt), what .. ": 7 / t")
end

-- ---- reductions ---------------------------------------------------------------------------------

-- The oracle of a reduction over dim d (nil: every element) of the flat row-major values of
-- a tensor of shape `size`: per output, the fp64 sum, sum of |x|, count, and for max/min
-- the first NaN or the first extreme value with its 1-based position.
local function reduce_f64(vals, size, d)
  local nd = #size
  local out, outsize = {}, {}
  for k = 1, nd do outsize[k] = (d == k) and 1 or size[k] end
  local function index_of(idx, sz)
    local i = 0
    for k = 1, nd do i = i * sz[k] + (idx[k] - 1) end
    return i + 1
  end
  local idx = {}
  for k = 1, nd do idx[k] = 1 end
  for n = 1, #vals do
    local v = vals[n]
    local o, pos
    if d then
      local oi = {}
      for k = 1, nd do oi[k] = (k == d) and 1 or idx[k] end
      o, pos = index_of(oi, outsize), idx[d]
    else
      o, pos = 1, n
    end
    local r = out[o] or {sum = 0, abs = 0, n = 0}
    out[o] = r
    r.sum, r.abs, r.n = r.sum + v, r.abs + math.abs(v), r.n + 1
    local function better(cmp)
      return r[cmp] == nil or (v ~= v and r[cmp] == r[cmp]) or
             (r[cmp] == r[cmp] and (cmp == "max" and v > r[cmp] or cmp == "min" and v < r[cmp]))
    end
    if better("max") then r.max, r.imax = v, pos end
    if better("min") then r.min, r.imin = v, pos end
    for k = nd, 1, -1 do
      idx[k] = idx[k] + 1
      if idx[k] <= size[k] then break end
      idx[k] = 1
    end
  end
  return out, outsize
end

local function numel(size)
  local n = 1
  for _, s in ipairs(size) do n = n * s end
  return n
end

-- Checks sum, mean, max and min of x over dim d (nil: all) against the oracle: sums within
-- the bound of the fixed order (k3.h: (n / 256 + 8) units of the accumulator times sum |x|),
-- plus the output's rounding; max and min exact, with their first positions.
local function check_reduce(x, dt, d, what)
  local size = x:size()
  local want, outsize = reduce_f64(flat(x), size, d)
  local nout = d and numel(outsize) or 1
  local reduced = d and size[d] or numel(size)
  local function sum_ok(got, name)
    for o = 1, nout do
      local r = want[o] or {sum = 0, abs = 0, n = 0}
      local w = name == "sum" and r.sum or (r.n > 0 and r.sum / r.n or 0 / 0)
      local scale = name == "sum" and 1 or 1 / math.max(r.n, 1)
      local tol = (math.ceil(reduced / 256) + 8) * ACC[dt] * r.abs * scale + ULP[dt] * math.abs(w)
      local g = got[o]
      assert(g == w or (g ~= g and w ~= w) or math.abs(g - w) <= tol,
        string.format("%s: %s output %d is %.17g, expected %.17g (tolerance %g)", what, name, o,
                      g, w, tol))
    end
  end
  for _, name in ipairs({"sum", "mean"}) do
    if d then
      local out = H.poisoned(outsize, {dtype = dt, device = x:device()})
      local y = x[name](x, d, {out = out})
      assert.equal(out, y)
      assert.same(outsize, y:size())
      sum_ok(flat(y), name)
    else
      local v = x[name](x)
      assert.equal("number", type(v))
      sum_ok({v}, name)
    end
  end
  if reduced == 0 then
    for _, name in ipairs({"max", "min"}) do
      local dim = d and (" dim " .. d) or " tensor"
      H.raises(function() local _ = x[name](x, d) end, name .. ": cannot reduce an empty" .. dim)
    end
    return
  end
  for _, name in ipairs({"max", "min"}) do
    local wv, wi = {}, {}
    for o = 1, nout do
      wv[o] = want[o] and want[o][name]
      wi[o] = want[o] and want[o]["i" .. name]
    end
    if d then
      local out = H.poisoned(outsize, {dtype = dt, device = x:device()})
      local v, i = x[name](x, d, {out = out})
      assert.equal(out, v)
      assert.same(outsize, i:size())
      assert.equal("f64", i:dtype())
      assert.equal(x:device(), i:device())
      if nout > 0 then
        same_bits(flat(v), wv, what .. ": " .. name .. " values")
        same_bits(flat(i), wi, what .. ": " .. name .. " indices")
      end
    else
      same_bits({x[name](x)}, {wv[1]}, what .. ": " .. name)
    end
  end
end

local function check_all(device)
  for _, dt in ipairs(DTYPES) do
    it(dt .. ": abs, exp, sqrt over every view", function()
      for _, c in ipairs(inputs(dt, device, 10)) do
        for _, name in ipairs({"abs", "exp", "sqrt"}) do check_unary(name, c[2], dt, dt .. " " .. c[1]) end
        -- sqrt of negative numbers is NaN, of -0 is -0
        check_unary("sqrt", c[2]:abs() * -1, dt, dt .. " negated " .. c[1])
      end
    end)

    it(dt .. ": t / u, t / s and s / t over every view", function()
      for _, c in ipairs(inputs(dt, device, 20)) do check_div(c[2], dt, dt .. " " .. c[1]) end
    end)

    it(dt .. ": sum, mean, max, min over every dim and over all elements", function()
      for _, c in ipairs(inputs(dt, device, 30)) do
        local x = c[2]
        check_reduce(x, dt, nil, dt .. " " .. c[1])
        for d = 1, x:dim() do check_reduce(x, dt, d, string.format("%s %s dim %d", dt, c[1], d)) end
      end
    end)

    it(dt .. ": NaN wins max and min, at its first position", function()
      local x = k3.tensor({{1, 0 / 0, 5, 0 / 0}, {2, 3, 4, 9}}, {dtype = dt, device = device})
      local v, i = x:max(2)
      same_bits(flat(v), {0 / 0, 9}, "max values")
      same_bits(flat(i), {2, 4}, "max indices")
      v, i = x:min(2)
      same_bits(flat(v), {0 / 0, 2}, "min values")
      same_bits(flat(i), {2, 1}, "min indices")
      local m = x:max()
      assert.is_true(m ~= m)
      assert.is_true(x:sum() ~= x:sum())
      v, i = x:max(1)
      same_bits(flat(i), {2, 1, 1, 1}, "max indices over dim 1")
    end)

    it(dt .. ": ties give the first position; -0 equals 0", function()
      local x = k3.tensor({{-0.0, 0.0, 0.0}, {3, 3, -3}}, {dtype = dt, device = device})
      local _, i = x:max(2)
      same_bits(flat(i), {1, 1}, "max indices")
      _, i = x:min(2)
      same_bits(flat(i), {1, 3}, "min indices")
    end)

    it(dt .. ": conversions round once and keep NaN and infinities", function()
      local x = k3.tensor({1 / 3, 0 / 0, 1 / 0, -1 / 0, 65520, 1e-9}, {dtype = "f64", device = device})
      local src = x:to(dt)
      for m, want in pairs({float = "f32", double = "f64", bf16 = "bf16", half = "f16"}) do
        local y = src[m](src)
        assert.equal(want, y:dtype())
        assert.equal(src:device(), y:device())
        same_bits(flat(y), flat(src:to(want)), dt .. ":" .. m .. "()")
      end
    end)

    it(dt .. ": cat and stack over views", function()
      local a = k3.randn({2, 3}, {dtype = dt, device = device, seed = 41})
      local b = k3.randn({3, 4}, {dtype = dt, device = device, seed = 42}):t():narrow(2, 2, 2) -- [4, 2]
      local c = k3.randn({1, 3}, {dtype = dt, device = device, seed = 43}):expand({4, 3})
      local r = k3.cat({a, c, a:narrow(1, 1, 0)}, 1)
      assert.same({6, 3}, r:size())
      assert.equal(dt, r:dtype())
      local want = flat(a)
      for _, v in ipairs(flat(c)) do want[#want + 1] = v end
      same_bits(flat(r), want, "cat dim 1")
      r = k3.cat({b, c}, 2)
      assert.same({4, 5}, r:size())
      same_bits(flat(r:narrow(2, 1, 2)), flat(b), "cat dim 2, first part")
      same_bits(flat(r:narrow(2, 3, 3)), flat(c), "cat dim 2, second part")
      local s = k3.stack({a, a * 2, a:t():t()}, 2)
      assert.same({2, 3, 3}, s:size())
      for i = 1, 3 do
        same_bits(flat(s:select(2, i)), flat(({a, a * 2, a})[i]), "stack dim 2 entry " .. i)
      end
      assert.same({2, 3, 1}, k3.stack({a}, 3):size())
      assert.same({1, 2, 3}, k3.stack({a}):size())
    end)

    it(dt .. ": arange and linspace", function()
      local o = {dtype = dt, device = device}
      same_bits(flat(k3.arange(0, 5, o)), {0, 1, 2, 3, 4}, "arange(0, 5)")
      same_bits(flat(k3.arange(4, o)), {0, 1, 2, 3}, "arange(4)")
      same_bits(flat(k3.arange(5, 0, -2, o)), {5, 3, 1}, "arange(5, 0, -2)")
      -- the count as PyTorch computes it: ceil((b - a) / step)
      assert.equal(4, k3.arange(0, 1, 0.3, o):numel())
      assert.equal(10, k3.arange(0, 1, 0.1, o):numel())
      same_bits(flat(k3.arange(0, 1, 0.25, o)), {0, 0.25, 0.5, 0.75}, "arange(0, 1, 0.25)")
      same_bits(flat(k3.arange(-1.5, 1, 0.5, o)), {-1.5, -1, -0.5, 0, 0.5}, "arange(-1.5, 1, 0.5)")
      assert.equal(0, k3.arange(3, 3, o):numel())
      assert.equal(dt, k3.arange(3, o):dtype())
      local l = flat(k3.linspace(-1, 1, 5, o))
      same_bits(l, {-1, -0.5, 0, 0.5, 1}, "linspace(-1, 1, 5)")
      l = flat(k3.linspace(0, 1, 7, o))
      local want = {}
      for i = 0, 6 do want[i + 1] = i < 3 and i * (1 / 6) or 1 - (6 - i) * (1 / 6) end
      same_bits(l, rounded(want, dt), "linspace(0, 1, 7): PyTorch's formula")
      same_bits(flat(k3.linspace(2, 5, 1, o)), {2}, "linspace n = 1")
      assert.equal(0, k3.linspace(2, 5, 0, o):numel())
    end)

    it(dt .. ": equal is shape and values, NaN equals nothing", function()
      local a = k3.randn({3, 4}, {dtype = dt, device = device, seed = 51})
      assert.is_true(k3.equal(a, a:clone()))
      assert.is_true(k3.equal(a:t(), a:t():contiguous()))
      assert.is_false(k3.equal(a, a:view({4, 3})))
      assert.is_false(k3.equal(a, a + 1))
      local n = k3.tensor({1, 0 / 0}, {dtype = dt, device = device})
      assert.is_false(k3.equal(n, n))
      assert.is_true(k3.equal(k3.tensor({-0.0}, {dtype = dt, device = device}), k3.zeros({1}, {dtype = dt})))
      assert.is_true(k3.equal(k3.empty({0, 2}, {dtype = dt, device = device}), k3.empty({0, 2})))
    end)
  end

  it("integer scalars beyond 2^53 are rounded once to the dtype", function()
    local s = (1 << 55) + (1 << 31) + 1
    local x = k3.tensor({1}, {device = device})
    -- through a double, s would be 2^55 + 2^31, a tie that rounds to 2^55 in f32
    assert.equal(2.0 ^ 55 + 2.0 ^ 32, (x * s):get(1))
    assert.equal(2.0 ^ 55 + 2.0 ^ 32, (s * x):get(1))
    assert.equal(2.0 ^ 55 + 2.0 ^ 32, (k3.zeros({1}, {device = device}) + s):get(1))
    assert.equal(2.0 ^ 55 + 2.0 ^ 32, (x / 1 * s / 1):get(1))
    local b = k3.tensor({1}, {dtype = "bf16", device = device})
    assert.equal(2.0 ^ 55 + 2.0 ^ 48, (b * ((1 << 55) + (1 << 47) + 1)):get(1))
    -- below 2^53 an integer is an exact double and keeps the one rounding of the result
    assert.equal(2.0 ^ 24 + 2, (x * (1 << 24) + 1.5):get(1))
    assert.equal(16777218.0, (k3.tensor({0.5}, {device = device}) + 16777217):get(1))
  end)

  it("division by zero gives infinities and NaN", function()
    for _, dt in ipairs(DTYPES) do
      local x = k3.tensor({1, -1, 0}, {dtype = dt, device = device})
      same_bits(flat(x / 0), {1 / 0, -1 / 0, 0 / 0}, dt .. " x / 0")
      same_bits(flat(x / k3.zeros({3}, {dtype = dt, device = device})), {1 / 0, -1 / 0, 0 / 0},
        dt .. " x / zeros")
      same_bits(flat(1 / x), {1, -1, 1 / 0}, dt .. " 1 / x")
    end
  end)
end

describe("tensor ops on the CPU", function()
  check_all("cpu")

  it("run through dispatch, each on its CPU kernel", function()
    local x = k3.randn({2, 3})
    for _, op in ipairs({"abs", "exp", "sqrt", "sum", "mean", "max", "min"}) do
      assert.equal("cpu." .. op .. ".reference", k3.explain(op, x).chosen)
      local tr = k3.trace(function() local _ = x[op](x) end)
      assert.equal("cpu." .. op .. ".reference", tr[1].kernel)
    end
    assert.equal("cpu.sum.reference", k3.explain("sum", x, 2).chosen)
  end)

  it("a sum follows the fixed order of k3.h", function()
    -- 1, then 511 times 2^-24: lane 0 holds 1 + 2^-24, which ties to 1; every other lane
    -- holds 2^-23, and the lanes combine exactly to 1 + 255 * 2^-23. A sequential fp32 sum
    -- would lose every 2^-24 and stay 1.
    local vals = {1}
    for _ = 2, 512 do vals[#vals + 1] = 2 ^ -24 end
    local x = k3.tensor(vals)
    local want = 1 + 511 * 2 ^ -24
    assert.is_true(math.abs(x:sum() - want) <= 2 ^ -22)
    assert.is_true(x:sum() > 1 + 400 * 2 ^ -24)
  end)

  it("argument errors", function()
    local x = k3.randn({2, 3})
    H.raises_exact(function() local _ = x:sum(3) end,
      "bad argument #1 to 'sum' (dim 3 is out of range for a 2-dim tensor (expected 1..2))")
    H.raises_exact(function() local _ = x:max(0) end,
      "bad argument #1 to 'max' (dim 0 is out of range for a 2-dim tensor (expected 1..2))")
    H.raises_exact(function() local _ = x:mean(1.5) end,
      "bad argument #1 to 'mean' (dim must be an integer; got 1.5)")
    H.raises_exact(function() local _ = x:min("a") end,
      "bad argument #1 to 'min' (dim (an integer) or an options table expected; got string)")
    H.raises_exact(function() local _ = x:abs({outt = x}) end,
      "bad argument #1 to 'abs' (unknown option 'outt' (expected out or kernel))")
    H.raises_exact(function() local _ = x:sum(1, {out = k3.empty({2, 3})}) end,
      "sum: out must be [1, 3]; got [2, 3]")
    H.raises_exact(function() local _ = x:sum(1, {out = k3.empty({1, 3}, {dtype = "f64"})}) end,
      "sum: out dtype (f64) must be f32")
    H.raises_exact(function() local _ = x:exp({out = x}) end, "exp: out overlaps x")
    H.raises_exact(function() local _ = k3.sqrt(x, {out = k3.empty({3, 2})}) end,
      "sqrt: out must be [2, 3]; got [3, 2]")
    H.raises_exact(function() local _ = x:abs({kernel = "cpu.exp.reference"}) end,
      "abs: kernel 'cpu.exp.reference' is for op exp, not abs")
    H.raises_exact(function() local _ = k3.max(k3.empty({0, 2}), 1) end,
      "max: cannot reduce an empty dim 1 (size 0)")
    H.raises_exact(function() local _ = k3.min(k3.empty({2, 0})) end,
      "min: cannot reduce an empty tensor (shape [2, 0])")
    H.raises_exact(function() local _ = x / k3.randn({2, 3}, {dtype = "f64"}) end,
      "div: dtypes differ (f32 and f64); convert with to()")
    H.raises_exact(function() local _ = x / k3.randn({3, 2}) end,
      "div: right operand shape [3, 2] must match left operand shape [2, 3]")
    H.raises(function() local _ = x / "a" end, "attempt to divide a k3.Tensor and a string value")
  end)

  it("join and range errors", function()
    local a, b = k3.randn({2, 3}), k3.randn({3, 2})
    H.raises_exact(function() local _ = k3.cat({a, b}, 1) end,
      "cat: tensor 2 dim 2 (2) must match tensor 1 (3)")
    H.raises_exact(function() local _ = k3.cat({a, a:to("f64")}, 1) end,
      "cat: tensor 2 dtype (f64) must match tensor 1 (f32)")
    H.raises_exact(function() local _ = k3.cat({a, k3.randn({2, 3, 1})}, 1) end,
      "cat: tensor 2 has 3 dims; tensor 1 has 2")
    H.raises_exact(function() local _ = k3.cat({a}, 3) end,
      "bad argument #2 to 'cat' (dim 3 is out of range (expected 1..2))")
    H.raises_exact(function() local _ = k3.cat({}, 1) end,
      "bad argument #1 to 'cat' (expected a non-empty list of tensors)")
    H.raises_exact(function() local _ = k3.cat({a, 5}, 1) end,
      "bad argument #1 to 'cat' (element 2 must be a k3.Tensor; got number)")
    H.raises_exact(function() local _ = k3.stack({a, b}) end,
      "stack: tensor 2 dim 1 (3) must match tensor 1 (2)")
    H.raises_exact(function() local _ = k3.stack({a}, 4) end,
      "bad argument #2 to 'stack' (dim 4 is out of range (expected 1..3))")
    H.raises_exact(function() local _ = k3.arange(0, 1, 0) end,
      "bad argument #3 to 'arange' (step must not be zero)")
    H.raises_exact(function() local _ = k3.arange(0, 1, -1) end,
      "arange: end 1.0 is on the wrong side of start 0.0 for step -1.0")
    H.raises_exact(function() local _ = k3.arange(0, 1 / 0) end,
      "arange: start, end and step must be finite")
    H.raises_exact(function() local _ = k3.arange(0, 3, {dtype = "f8"}) end,
      "bad argument #3 to 'arange' (unknown dtype 'f8'; expected bf16, f16, f32 or f64)")
    H.raises_exact(function() local _ = k3.linspace(0, 1, -1) end,
      "bad argument #3 to 'linspace' (n must be >= 0; got -1)")
    H.raises(function() local _ = k3.equal(a, 1) end, "bad argument #2 to 'equal'")
  end)

  it("k3.help() lists the ops", function()
    local parts, write = {}, io.write
    io.write = function(...) for _, v in ipairs({...}) do parts[#parts + 1] = tostring(v) end end -- luacheck: ignore
    local ok, err = pcall(k3.help)
    io.write = write -- luacheck: ignore
    assert(ok, err)
    local text = table.concat(parts)
    for _, name in ipairs({"k3.abs", "k3.sum", "t:max", "k3.cat", "k3.stack", "k3.arange",
                           "k3.linspace", "k3.equal", "t:float", "t / u"}) do
      assert.truthy(text:find(name, 1, true), name .. " is not in k3.help()")
    end
  end)
end)

describe("tensor ops on CUDA #gpu", function()
  if not H.require_gpu() then return end

  check_all("cuda")

  it("run on the CUDA kernels, which match the CPU kernels to the bit (exp within its bound)", function()
    for _, dt in ipairs(DTYPES) do
      for _, c in ipairs(inputs(dt, "cuda", 60)) do
        local x = c[2]
        local xc = x:to("cpu")
        local what = dt .. " " .. c[1]
        for _, op in ipairs({"abs", "sqrt"}) do
          local y = k3[op](x, {kernel = "cuda." .. op .. ".generic"})
          same_bits(flat(y), flat(k3[op](xc)), what .. " " .. op)
        end
        same_bits(flat(x / (x * 0.5 + 3)), flat(xc / (xc * 0.5 + 3)), what .. " t / u")
        same_bits(flat(x / 3), flat(xc / 3), what .. " t / 3")
        same_bits(flat(7 / (x * 0.5 + 3)), flat(7 / (xc * 0.5 + 3)), what .. " 7 / t")
        for _, op in ipairs({"sum", "mean"}) do
          same_bits({x[op](x)}, {xc[op](xc)}, what .. " " .. op)
          for d = 1, x:dim() do
            same_bits(flat(x[op](x, d)), flat(xc[op](xc, d)), string.format("%s %s dim %d", what, op, d))
          end
        end
        if x:numel() > 0 then
          for _, op in ipairs({"max", "min"}) do
            same_bits({x[op](x)}, {xc[op](xc)}, what .. " " .. op)
            for d = 1, x:dim() do
              if x:size(d) > 0 then
                local v, i = x[op](x, d)
                local vc, ic = xc[op](xc, d)
                same_bits(flat(v), flat(vc), string.format("%s %s dim %d values", what, op, d))
                same_bits(flat(i), flat(ic), string.format("%s %s dim %d indices", what, op, d))
              end
            end
          end
        end
      end
    end
  end)

  it("are what dispatch picks for device tensors", function()
    local x = k3.randn({2, 3}, {device = "cuda"})
    for _, op in ipairs({"abs", "exp", "sqrt", "sum", "mean", "max", "min"}) do
      assert.equal("cuda." .. op .. ".generic", k3.explain(op, x).chosen)
    end
    local _, i = x:max(1)
    assert.equal("cuda:0", i:device())
  end)

  it("a large reduction: many lanes, every block of the grid", function()
    local x = k3.randn({3000, 700}, {device = "cuda", dtype = "bf16", seed = 71})
    local xc = x:to("cpu")
    same_bits({x:sum()}, {xc:sum()}, "sum of 2.1M bf16")
    same_bits(flat(x:sum(1)), flat(xc:sum(1)), "sum over dim 1")
    same_bits(flat(x:mean(2)), flat(xc:mean(2)), "mean over dim 2")
    local v, i = x:max(1)
    local vc, ic = xc:max(1)
    same_bits(flat(v), flat(vc), "max over dim 1")
    same_bits(flat(i), flat(ic), "argmax over dim 1")
  end)

  it("cat and stack across devices are refused", function()
    local a = k3.randn({2, 3})
    H.raises_exact(function() local _ = k3.cat({a, a:to("cuda")}, 1) end,
      "cat: tensor 2 device (cuda:0) must match tensor 1 (cpu)")
  end)
end)
