-- Tensors: creation, metadata, views, copies, element access, arithmetic, comparisons,
-- dtype rounding, printing, freeing, and the error every misuse gets (API.md "tensors").
local k3 = require "k3"
local H = require "spec.helpers"

local function bf16(v) return k3.tensor({v}, {dtype = "bf16"}):get(1) end
local function f16(v) return k3.tensor({v}, {dtype = "f16"}):get(1) end

describe("creation", function()
  it("empty/zeros/ones/full take shape and opts", function()
    local t = k3.zeros({2, 3}, {dtype = "bf16"})
    assert.same({2, 3}, t:size())
    assert.equal("bf16", t:dtype())
    assert.equal("cpu", t:device())
    assert.same({{0, 0, 0}, {0, 0, 0}}, t:totable())
    assert.same({{1, 1}}, k3.ones({1, 2}):totable())
    assert.same({{7.5, 7.5}}, k3.full({1, 2}, 7.5, {dtype = "f64"}):totable())
    local e = k3.empty({3, 4, 5}, {dtype = "f16"})
    assert.same({3, 4, 5}, e:size())
    assert.same({20, 5, 1}, e:stride())
    assert.equal(60, e:numel())
    assert.equal(3, e:dim())
  end)

  it("k3.synchronize() returns nothing and raises nothing, with or without a device", function()
    k3.zeros({2}):fill(1)
    assert.equal(0, select("#", k3.synchronize()))
    k3.synchronize() -- twice in a row is fine too
  end)

  it("defaults to f32 on the cpu", function()
    local t = k3.empty({1})
    assert.equal("f32", t:dtype())
    assert.equal("cpu", t:device())
  end)

  it("supports 8 dims and zero-size dims", function()
    local t = k3.zeros({1, 2, 1, 2, 1, 2, 1, 2})
    assert.equal(8, t:dim())
    assert.equal(16, t:numel())
    local z = k3.zeros({3, 0, 2})
    assert.equal(0, z:numel())
    assert.same({{}, {}, {}}, z:totable())
    assert.equal(0, z:narrow(1, 2, 0):numel())
    assert.equal(0, (z + z):numel())
    z:fill(3)
    z:copy(k3.ones({3, 0, 2}))
  end)

  it("k3.tensor builds from nested tables and rounds to the dtype", function()
    local t = k3.tensor({{1, 2}, {3, 4}, {5, 6}}, {dtype = "f64"})
    assert.same({3, 2}, t:size())
    assert.equal(4, t:get(2, 2))
    assert.equal(1.0, k3.tensor({1.001}, {dtype = "bf16"}):get(1))
  end)

  it("randn is deterministic per seed, across dtypes, with standard moments", function()
    local a = k3.randn({1000}, {seed = 42, dtype = "f64"})
    local b = k3.randn({1000}, {seed = 42, dtype = "f64"})
    local c = k3.randn({1000}, {seed = 43, dtype = "f64"})
    assert.equal(0, k3.max_abs_diff(a, b))
    assert.is_true(k3.max_abs_diff(a, c) > 0.1)
    -- element i depends only on (seed, i): a prefix of a larger draw is the smaller draw
    local big = k3.randn({10, 100}, {seed = 42, dtype = "f64"}):view({1000})
    assert.equal(0, k3.max_abs_diff(a, big))
    -- the bf16 draw is the f64 draw rounded once
    local h = k3.randn({1000}, {seed = 42, dtype = "bf16"})
    assert.equal(0, k3.max_abs_diff(h, a:to("bf16")))
    local n = 200000
    local v = k3.randn({n}, {seed = 7, dtype = "f64"}):totable()
    local s, s2, s4 = 0, 0, 0
    for i = 1, n do s = s + v[i]; s2 = s2 + v[i] ^ 2; s4 = s4 + v[i] ^ 4 end
    local mean, var = s / n, s2 / n - (s / n) ^ 2
    assert.is_true(math.abs(mean) < 0.01, "mean " .. mean)
    assert.is_true(math.abs(var - 1) < 0.02, "variance " .. var)
    assert.is_true(math.abs(s4 / n - 3) < 0.1, "fourth moment " .. s4 / n)
  end)

  it("randn gives the same values on any number of host threads (K3_HOST_THREADS); a bad count is reported once", function()
    -- 2^21 + 3 elements: past the size from which the host threads share the work
    local chunk = [[local x = k3.randn({2097155}, {seed = 5, dtype = "f64"})
      print(string.format("%.17g %.17g %.17g", k3.sum(x), x[1], x[2097155]))]]
    local function run(env)
      local out, code = H.sh(env .. " " .. H.root() .. "/scripts/k3 -e '" .. chunk .. "'")
      assert.equal(0, code, out)
      return out
    end
    local one = run("K3_HOST_THREADS=1")
    assert.equal(one, run("K3_HOST_THREADS=3"))
    assert.equal(one, run("K3_HOST_THREADS=64"))
    local bad = run("K3_HOST_THREADS=many")
    assert.truthy(bad:find("^k3: warning: K3_HOST_THREADS: unrecognised value 'many' %(expected a whole number >= 1%)"), bad)
    assert.truthy(bad:find(one, 1, true), bad)
    local many = run("K3_HOST_THREADS=1000")
    assert.truthy(many:find("^k3: warning: K3_HOST_THREADS: 1000 is more than the 64 threads k3 runs; 64 are used"), many)
    assert.truthy(many:find(one, 1, true), many)
  end)
end)

describe("bf16 and f16 rounding", function()
  it("bf16 rounds to nearest, ties to even", function()
    assert.equal(1.0, bf16(1 + 2 ^ -8))                 -- tie, 1.0 is even
    assert.equal(1 + 2 ^ -6, bf16(1 + 3 * 2 ^ -8))      -- tie, rounds up to even
    assert.equal(1 + 2 ^ -7, bf16(1 + 2 ^ -8 + 2 ^ -30)) -- just above the tie: no double rounding
    assert.equal(-1.0, bf16(-1 - 2 ^ -8))
    assert.equal(3.140625, bf16(math.pi))
  end)

  it("bf16 keeps NaN and infinities and overflows like IEEE", function()
    local nan = bf16(0 / 0)
    assert.is_true(nan ~= nan)
    assert.equal(math.huge, bf16(math.huge))
    assert.equal(-math.huge, bf16(-math.huge))
    local max = 3.3895313892515355e38 -- 0x7f7f, the largest finite bf16
    assert.equal(max, bf16(max))
    assert.equal(max, bf16(2 ^ 128 - 2 ^ 119 - 2 ^ 100)) -- just below the midpoint to 2^128
    assert.equal(math.huge, bf16(2 ^ 128 - 2 ^ 119))     -- the midpoint rounds to infinity
    assert.equal(math.huge, bf16(1e39))
    assert.equal(1 / -math.huge, bf16(-0.0))
    assert.equal(-math.huge, 1 / bf16(-0.0))
  end)

  it("f16 rounds to nearest even with subnormals, NaN and infinities", function()
    assert.equal(65504, f16(65504))
    assert.equal(65504, f16(65519))
    assert.equal(math.huge, f16(65520))
    assert.equal(2 ^ -24, f16(2 ^ -24))
    assert.equal(0, f16(2 ^ -25))                    -- tie to even (zero)
    assert.equal(2 ^ -24, f16(1.5 * 2 ^ -25))
    assert.equal(2 ^ -23, f16(3 * 2 ^ -25))          -- tie to even (2 units)
    assert.equal(1.0, f16(1 + 2 ^ -11))              -- tie, even
    assert.equal(1 + 2 ^ -10, f16(1 + 2 ^ -11 + 2 ^ -40))
    local nan = f16(0 / 0)
    assert.is_true(nan ~= nan)
    assert.equal(-math.huge, f16(-math.huge))
  end)

  it("conversions between every dtype pair round once", function()
    local src = k3.tensor({1 + 2 ^ -8 + 2 ^ -30, -2.5, 1e-3}, {dtype = "f64"})
    for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
      local t = src:to(dt)
      for _, dt2 in ipairs({"bf16", "f16", "f32", "f64"}) do
        local u = k3.empty({3}, {dtype = dt2}):copy(t)
        assert.equal(0, k3.max_abs_diff(u, t:to(dt2)))
      end
    end
    assert.equal(1 + 2 ^ -7, src:to("bf16"):get(1))
  end)
end)

-- Lua integers past 2^53 rounded once to the tensor's dtype by k3.tensor, full, fill and set
-- (through a double they would round twice). Each case: integer, dtype, the value once rounded.
local BIG_INTEGERS = {
  {(1 << 55) + (1 << 31) + 1, "f32", 2.0 ^ 55 + 2.0 ^ 32}, -- through a double: 2^55 (a tie, to even)
  {-((1 << 55) + (1 << 31) + 1), "f32", -(2.0 ^ 55 + 2.0 ^ 32)},
  {(1 << 60) + (1 << 52) + 1, "bf16", 2.0 ^ 60 + 2.0 ^ 53}, -- through a double: 2^60
  {(1 << 53) + 1, "f64", 2.0 ^ 53},                          -- one tie, to even
  {(1 << 53) + 3, "f64", 2.0 ^ 53 + 4},
  {math.maxinteger, "f32", 2.0 ^ 63},
  {math.mininteger, "bf16", -(2.0 ^ 63)},
  {65519, "f16", 65504},
  {65520, "f16", math.huge},
}
local function check_big_integers(device)
  for _, c in ipairs(BIG_INTEGERS) do
    local v, dt, want = c[1], c[2], c[3]
    local what = ("%d to %s on %s"):format(v, dt, device)
    local o = {dtype = dt, device = device}
    assert.are.equal(want, k3.tensor({v, 1}, o):get(1), "tensor: " .. what)
    assert.are.equal(want, k3.full({2}, v, o):get(2), "full: " .. what)
    assert.are.equal(want, k3.zeros({2}, o):fill(v):get(1), "fill: " .. what)
    assert.are.equal(want, k3.zeros({2, 2}, o):set(2, 1, v):get(2, 1), "set: " .. what)
  end
  -- floats keep their single rounding; small integers are exact
  assert.are.equal(0.5, k3.full({1}, 0.5, {device = device}):get(1))
  assert.are.equal(3, k3.tensor({3}, {dtype = "bf16", device = device}):get(1))
end

describe("integers above 2^53", function()
  it("are rounded once to the dtype by k3.tensor, full, fill and set", function()
    check_big_integers("cpu")
  end)
end)

describe("integers above 2^53 on a CUDA device #gpu", function()
  if not H.require_gpu() then return end
  it("are rounded once to the dtype by k3.tensor, full, fill and set", function()
    check_big_integers("cuda")
  end)
end)

describe("views", function()
  it("narrow, select and transpose share storage", function()
    local t = k3.tensor({{1, 2, 3}, {4, 5, 6}})
    local n = t:narrow(2, 2, 2)
    assert.same({{2, 3}, {5, 6}}, n:totable())
    assert.same({3, 1}, n:stride())
    assert.equal(1, n:offset())
    n:set(1, 1, 20)
    assert.equal(20, t:get(1, 2))
    local s = t:select(1, 2)
    assert.same({3}, s:size())
    assert.same({4, 5, 6}, s:totable())
    s:fill(0)
    assert.same({{1, 20, 3}, {0, 0, 0}}, t:totable())
    local tt = t:t()
    assert.same({2, 3}, t:size())
    assert.same({3, 2}, tt:size())
    assert.same({1, 3}, tt:stride())
    assert.is_false(tt:is_contiguous())
    tt:set(3, 1, 30)
    assert.equal(30, t:get(1, 3))
    assert.same(tt:totable(), t:transpose(1, 2):totable())
  end)

  it("stride(d) gives one dim's stride; a transposed view's are swapped", function()
    local t = k3.zeros({2, 3})
    assert.equal(3, t:stride(1))
    assert.equal(1, t:stride(2))
    local tt = t:transpose(1, 2)
    assert.equal(1, tt:stride(1))
    assert.equal(3, tt:stride(2))
    assert.equal(0, t:narrow(1, 1, 1):expand({4, 3}):stride(1))
    assert.equal(math.type(t:stride(1)), "integer")
    H.raises_exact(function() t:stride(3) end, "bad argument #1 to 'stride' (dim must be in 1..2; got 3)")
  end)

  it("a padded-row view reports its strides", function()
    local z = k3.zeros({4, 7175}):narrow(2, 1, 7168)
    assert.same({4, 7168}, z:size())
    assert.same({7175, 1}, z:stride())
    assert.is_false(z:is_contiguous())
    local c = z:contiguous()
    assert.same({7168, 1}, c:stride())
    assert.is_true(c:is_contiguous())
  end)

  it("view reshapes a contiguous tensor, infers -1, and rejects a non-contiguous one", function()
    local t = k3.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.same({{1, 2}, {3, 4}, {5, 6}}, t:view({3, 2}):totable())
    assert.same({6}, t:view({-1}):size())
    t:view({6}):set(6, 60)
    assert.equal(60, t:get(2, 3))
    H.raises(function() t:t():view({6}) end,
      "view: tensor is not contiguous (shape [3, 2], strides [1, 3]); call contiguous() first")
    H.raises(function() t:view({4, 2}) end, "view: shape [4, 2] has 8 elements; tensor has 6")
    H.raises(function() t:view({-1, -1}) end, "view: only one size may be -1")
    H.raises(function() t:view({4, -1}) end, "view: cannot infer dim 2")
  end)

  it("expand broadcasts size-1 dims with stride 0", function()
    local r = k3.tensor({{1, 2, 3}})
    local e = r:expand({4, 3})
    assert.same({4, 3}, e:size())
    assert.same({0, 1}, e:stride())
    assert.same({1, 2, 3}, e:select(1, 4):totable())
    assert.same({2, 4, 3}, r:expand({2, 4, 3}):size())
    H.raises(function() r:expand({4, 2}) end, "expand: dim 2 of size 3 cannot expand to 2")
    H.raises(function() e:fill(1) ; e:copy(k3.zeros({4, 3})) end,
      "copy: destination dim 1 has stride 0")
  end)

  it("contiguous, clone and to copy", function()
    local t = k3.tensor({{1, 2}, {3, 4}})
    local c = t:clone()
    c:set(1, 1, 9)
    assert.equal(1, t:get(1, 1))
    assert.equal(t, t:contiguous())
    local d = t:to("f64")
    assert.equal("f64", d:dtype())
    local e = t:to({dtype = "bf16"})
    assert.equal("bf16", e:dtype())
    assert.equal("cpu", t:to("cpu"):device())
    H.raises(function() t:to("float") end,
      "'float' is neither a dtype (bf16, f16, f32, f64) nor a device")
  end)

  it("copy handles any strides, dtype pairs and overlapping views", function()
    local src = k3.randn({5, 7}, {seed = 3, dtype = "f64"})
    local dst = k3.zeros({7, 5}, {dtype = "f32"}):t()
    dst:copy(src)
    assert.is_true(k3.max_abs_diff(dst, src) < 1e-6)
    local t = k3.tensor({1, 2, 3, 4, 5})
    t:narrow(1, 2, 4):copy(t:narrow(1, 1, 4)) -- overlapping shift
    assert.same({1, 1, 2, 3, 4}, t:totable())
    H.raises(function() k3.zeros({2, 3}):copy(k3.zeros({3, 2})) end,
      "copy: source shape [3, 2] must match destination shape [2, 3]")
  end)

  it("get, set and totable work on every dtype", function()
    for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
      local t = k3.zeros({2, 2}, {dtype = dt})
      t:set(2, 1, 1.5)
      assert.equal(1.5, t:get(2, 1))
      assert.same({{0, 0}, {1.5, 0}}, t:totable())
    end
    assert.equal(5, k3.tensor({5}):select(1, 1):totable())
  end)
end)

describe("arithmetic and comparisons", function()
  it("+ - * and unary minus, with scalars on either side", function()
    local a = k3.tensor({1, 2, 3})
    local b = k3.tensor({10, 20, 30})
    assert.same({11, 22, 33}, (a + b):totable())
    assert.same({9, 18, 27}, (b - a):totable())
    assert.same({10, 40, 90}, (a * b):totable())
    assert.same({-1, -2, -3}, (-a):totable())
    assert.same({2, 4, 6}, (a * 2):totable())
    assert.same({2, 4, 6}, (2 * a):totable())
    assert.same({2, 3, 4}, (a + 1):totable())
    assert.same({0, -1, -2}, (1 - a):totable())
    local t = k3.tensor({{1, 2}, {3, 4}})
    assert.same({{2, 5}, {5, 8}}, (t + t:t()):totable())
  end)

  it("rounds fp32 arithmetic once to bf16", function()
    local a = k3.tensor({1}, {dtype = "bf16"})
    local b = k3.tensor({2 ^ -8}, {dtype = "bf16"})
    assert.equal(1.0, (a + b):get(1))
  end)

  it("rejects mismatched shapes, dtypes and non-tensors", function()
    local a = k3.zeros({2, 3})
    H.raises(function() return a + k3.zeros({3, 2}) end,
      "add: right operand shape [3, 2] must match left operand shape [2, 3]")
    H.raises(function() return a + k3.zeros({2, 3}, {dtype = "f64"}) end,
      "add: dtypes differ (f32 and f64)")
    H.raises(function() return a + "x" end, "attempt to add a k3.Tensor and a string value")
  end)

  it("max_abs_diff, allclose and cosine compare in f64", function()
    local a = k3.tensor({1, 2, 3}, {dtype = "f64"})
    local b = k3.tensor({1, 2.5, 3}, {dtype = "bf16"})
    assert.equal(0.5, k3.max_abs_diff(a, b))
    assert.is_true(k3.allclose(a, a))
    assert.is_false(k3.allclose(a, b))
    assert.is_true(k3.allclose(a, b, {atol = 0.5}))
    assert.is_true(k3.allclose(a, b, {rtol = 0.2}))
    assert.is_true(math.abs(k3.cosine(a, a) - 1) < 1e-15)
    assert.equal(0, k3.cosine(k3.tensor({1, 0}), k3.tensor({0, 1})))
    local nan = k3.tensor({0 / 0})
    local d = k3.max_abs_diff(nan, k3.tensor({1}))
    assert.is_true(d ~= d)
    assert.is_false(k3.allclose(nan, nan))
    assert.equal(0, k3.max_abs_diff(k3.tensor({math.huge}), k3.tensor({math.huge})))
  end)

  it("cosine of a zero vector is NaN, with a zero vector too: it has no direction", function()
    local z = k3.zeros({3}, {dtype = "f64"})
    for _, pair in ipairs({{z, z}, {z, k3.tensor({1, 2, 3})}, {k3.tensor({1, 2, 3}), z},
                           {k3.zeros({0}), k3.zeros({0})}}) do
      local c = k3.cosine(pair[1], pair[2])
      assert.is_true(c ~= c, tostring(c))
    end
    assert.is_true(math.abs(k3.cosine(k3.tensor({1e-300, 0}, {dtype = "f64"}), k3.tensor({1, 0})) - 1) < 1e-15)
  end)

  it("allclose: an infinity is close only to the same infinity, in either argument", function()
    local inf = math.huge
    local function close(a, b, opts)
      return k3.allclose(k3.tensor({a}, {dtype = "f64"}), k3.tensor({b}, {dtype = "f64"}), opts)
    end
    for _, v in ipairs({0, 1, -1, 1e308, -1e308, -inf, 0 / 0}) do
      for _, opts in ipairs({{}, {rtol = 1}, {atol = 1e300, rtol = 10}}) do
        assert.is_false(close(v, inf, opts), tostring(v) .. " vs inf")
        assert.is_false(close(inf, v, opts), "inf vs " .. tostring(v))
        assert.is_false(close(-v, -inf, opts), tostring(-v) .. " vs -inf")
        assert.is_false(close(-inf, -v, opts), "-inf vs " .. tostring(-v))
      end
    end
    assert.is_true(close(inf, inf))
    assert.is_true(close(-inf, -inf))
    -- a kernel that writes inf everywhere does not pass a spec that uses allclose
    local want = k3.randn({4, 8}, {dtype = "f64"})
    local got = k3.full({4, 8}, inf, {dtype = "f64"})
    assert.is_false(k3.allclose(got, want, {rtol = 1}))
    assert.is_false(k3.allclose(want, got, {rtol = 1}))
  end)
end)

describe("printing", function()
  it("shows shape, dtype, device and values", function()
    local s = tostring(k3.tensor({{1, 2}, {3, 4}}, {dtype = "bf16"}))
    assert.equal("k3.Tensor [2, 2] bf16 cpu\n[[1, 2],\n [3, 4]]", s)
    local f = tostring(k3.tensor({0.5, -1.25}))
    assert.equal("k3.Tensor [2] f32 cpu\n[ 0.5000, -1.2500]", f)
  end)

  it("shows strides of a non-contiguous view", function()
    local s = tostring(k3.zeros({4, 7175}):narrow(2, 1, 7168))
    assert.truthy(s:find("k3.Tensor [4, 7168] f32 cpu strides [7175, 1]\n", 1, true), s)
  end)

  it("shows strides only when not contiguous, and the storage offset apart when it is not 0", function()
    local n = k3.zeros({4, 3}):narrow(1, 2, 2)
    assert.is_true(n:is_contiguous())
    assert.equal("k3.Tensor [2, 3] f32 cpu offset 3", (tostring(n):match("^[^\n]*")))
    local s = k3.tensor({{1, 2}, {3, 4}}):select(1, 1):select(1, 2)
    assert.equal("k3.Tensor [] f32 cpu offset 1\n2", tostring(s))
    local t = k3.zeros({2, 3}):t()
    assert.equal("k3.Tensor [3, 2] f32 cpu strides [1, 3]", (tostring(t):match("^[^\n]*")))
    local c = k3.zeros({2, 3}):narrow(2, 2, 2)
    assert.equal("k3.Tensor [2, 2] f32 cpu strides [3, 1] offset 1", (tostring(c):match("^[^\n]*")))
    assert.equal("k3.Tensor [2, 3] f32 cpu", (tostring(k3.zeros({2, 3})):match("^[^\n]*")))
  end)

  it("summarises a 7168x7168 tensor to a few rows", function()
    local t = k3.zeros({7168, 7168}, {dtype = "bf16"})
    local s = tostring(t)
    local lines = select(2, s:gsub("\n", "\n")) + 1
    assert.is_true(lines <= 10, "printed " .. lines .. " lines")
    assert.truthy(s:find("...", 1, true))
    assert.is_true(#s < 1000)
  end)

  it("wraps rows at 80 columns as PyTorch does, and summarises only above 1000 elements", function()
    local function lines_of(str)
      local out = {}
      for line in (str .. "\n"):gmatch("(.-)\n") do out[#out + 1] = line end
      return out
    end
    -- 1000 elements: every value shown, 8 per line ("-0.4715, " is 9 columns)
    local t = k3.randn({1000}, {seed = 44})
    local ls = lines_of(tostring(t))
    assert.equal(1 + 125, #ls)
    for i = 2, #ls do assert.is_true(#ls[i] <= 80, "line " .. i .. ": " .. ls[i]) end
    local count = 0
    for _ in tostring(t):gmatch("%-?%d%.%d%d%d%d") do count = count + 1 end
    assert.equal(1000, count)
    assert.falsy(tostring(t):find("...", 1, true))
    -- continuation lines start under the first value, one column in per open bracket
    assert.equal("k3.Tensor [12] f32 cpu\n" ..
                 "[-0.4715,  0.7479, -1.5871, -0.3702, -1.1692,  0.2059,  0.8244,  0.5118,\n" ..
                 "  0.5142,  1.1634, -0.0674, -0.5261]", tostring(k3.randn(12)))
    local m = lines_of(tostring(k3.zeros(2, 30)))
    assert.same({"[[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,",
                 "  0, 0, 0, 0],", " [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,",
                 "  0, 0, 0, 0]]"}, {m[2], m[3], m[4], m[5]})
    -- 1001 elements: 3 at each end of every dim
    local s = tostring(k3.randn({1001}, {seed = 44}))
    assert.equal(2, #lines_of(s))
    assert.truthy(s:find("^k3%.Tensor %[1001%] f32 cpu\n%[[^\n,]+,[^\n,]+,[^\n,]+, %.%.%.,[^\n,]+,[^\n,]+,[^\n,]+%]$"), s)
    local n = lines_of(tostring(k3.zeros(20, 60)))
    assert.same({"k3.Tensor [20, 60] f32 cpu", "[[0, 0, 0, ..., 0, 0, 0],", " [0, 0, 0, ..., 0, 0, 0],",
                 " [0, 0, 0, ..., 0, 0, 0],", " ...,", " [0, 0, 0, ..., 0, 0, 0],",
                 " [0, 0, 0, ..., 0, 0, 0],", " [0, 0, 0, ..., 0, 0, 0]]"}, n)
    -- a 0-dim tensor and an empty one are not wrapped
    assert.equal("k3.Tensor [0, 3] f32 cpu\n[]", tostring(k3.zeros(0, 3)))
  end)

  it("has the __name k3.Tensor", function()
    assert.equal("k3.Tensor", getmetatable(k3.empty({1})).__name)
    assert.is_true(k3.is_tensor(k3.empty({1})))
    assert.is_false(k3.is_tensor({}))
  end)
end)

describe("freeing", function()
  it("is_freed tells a freed tensor or view from a live one, and never raises", function()
    local t = k3.zeros({4, 4})
    local v, other = t:narrow(1, 1, 2), k3.zeros({2})
    assert.same({false, false}, {t:is_freed(), v:is_freed()})
    v:free() -- a view frees the storage it shares
    assert.same({true, true, false}, {t:is_freed(), v:is_freed(), other:is_freed()})
  end)

  it("free releases the storage; any later use raises", function()
    local t = k3.zeros({4, 4})
    local v = t:narrow(1, 1, 2)
    t:free()
    H.raises(function() t:size() end, "tensor has been freed")
    H.raises(function() v:get(1, 1) end, "tensor has been freed")
    H.raises(function() return v + v end, "tensor has been freed")
    H.raises(function() k3.zeros({2, 4}):copy(v) end, "tensor has been freed")
    t:free() -- twice is harmless
    assert.equal("k3.Tensor (freed)", tostring(t))
    assert.equal("k3.Tensor (freed)", tostring(v))
  end)

  it("__close frees the handle at scope end and __gc is safe afterwards", function()
    local escaped
    do
      local t <close> = k3.zeros({2})
      escaped = t
    end
    H.raises(function() escaped:numel() end, "tensor has been freed")
    escaped = nil
    collectgarbage()
    collectgarbage()
  end)

  it("a view outlives a closed base handle (storage is reference-counted)", function()
    local v
    do
      local t <close> = k3.tensor({1, 2, 3})
      v = t:narrow(1, 2, 2)
    end
    assert.same({2, 3}, v:totable())
  end)

  it("re-requiring the module works", function()
    package.loaded["k3"] = nil
    package.loaded["k3.core"] = nil
    local again = require "k3"
    assert.same({1}, again.ones({1}):totable())
  end)
end)

describe("errors", function()
  it("bad shapes", function()
    H.raises(function() k3.empty({}) end,
      "bad argument #1 to 'empty' (shape must have 1 to 8 dims; got 0)")
    H.raises(function() k3.empty({1, 2, 3, 4, 5, 6, 7, 8, 9}) end,
      "bad argument #1 to 'empty' (shape must have 1 to 8 dims; got 9)")
    H.raises(function() k3.zeros({2, -1}) end,
      "bad argument #1 to 'zeros' (size of dim 2 must be >= 0; got -1)")
    H.raises(function() k3.empty({1.5}) end,
      "bad argument #1 to 'empty' (shape[1] must be an integer; got 1.5)")
    H.raises(function() k3.empty({"a"}) end,
      "bad argument #1 to 'empty' (shape[1] must be an integer; got string)")
    H.raises(function() k3.empty("x") end, "bad argument #1 to 'empty' (shape table or sizes expected, got string)")
  end)

  it("huge sizes overflow or run out of memory without crashing", function()
    H.raises(function() k3.empty({2 ^ 40, 2 ^ 40}) end, "empty: element count overflows at dim 2")
    H.raises(function() k3.empty({2 ^ 31, 2 ^ 31}, {dtype = "f64"}) end,
      "empty: byte size of 4611686018427387904 f64 elements overflows")
    H.raises(function() k3.empty({2 ^ 30, 2 ^ 30}) end, "empty: out of host memory")
  end)

  it("unknown dtype and device", function()
    H.raises(function() k3.empty({1}, {dtype = "float32"}) end,
      "bad argument #2 to 'empty' (unknown dtype 'float32'; expected bf16, f16, f32 or f64)")
    H.raises(function() k3.empty({1}, {device = "gpu"}) end,
      "bad argument #2 to 'empty' (unknown device 'gpu'; expected cpu, cuda or cuda:N)")
    H.raises(function() k3.empty({1}, {dtype = 16}) end,
      "bad argument #2 to 'empty' (dtype must be a string; got number)")
  end)

  it("out-of-range indices and dims", function()
    local t = k3.zeros({2, 3})
    H.raises(function() t:get(3, 1) end, "get: index 3 out of range for dim 1 of size 2")
    H.raises(function() t:get(0, 1) end, "get: index 0 out of range for dim 1 of size 2")
    H.raises(function() t:set(1, 4, 0) end, "set: index 4 out of range for dim 2 of size 3")
    H.raises(function() t:get(1) end, "get: expected 2 indices for a 2-dim tensor; got 1")
    H.raises(function() t:get(1.5, 1) end, "number has no integer representation")
    H.raises(function() t:get(0 / 0, 1) end, "number has no integer representation")
    H.raises(function() t:get(math.huge, 1) end, "number has no integer representation")
    H.raises(function() t:narrow(3, 1, 1) end, "bad argument #1 to 'narrow' (dim must be in 1..2; got 3)")
    H.raises(function() t:narrow(2, 3, 2) end,
      "narrow: start 3 and length 2 out of range for dim 2 of size 3")
    H.raises(function() t:narrow(2, 0, 1) end,
      "narrow: start 0 and length 1 out of range for dim 2 of size 3")
    H.raises(function() t:select(1, 3) end, "select: index 3 out of range for dim 1 of size 2")
    H.raises(function() t:size(3) end, "dim must be in 1..2; got 3")
    H.raises(function() k3.zeros({2, 2, 2}):t() end, "t: expected a 2-dim tensor; got 3 dims")
  end)

  it("wrong Lua types get the standard message", function()
    H.raises(function() k3.zeros({2}):fill("x") end,
      "bad argument #1 to 'fill' (number expected, got string)")
    H.raises(function() k3.zeros({2}).copy({}, k3.zeros({2})) end,
      "bad argument #1 to 'copy' (k3.Tensor expected, got table)")
    H.raises(function() k3.max_abs_diff(k3.zeros({2}), nil) end,
      "bad argument #2 to 'max_abs_diff' (k3.Tensor expected, got nil)")
  end)

  it("k3.tensor rejects ragged or non-numeric nesting", function()
    H.raises_exact(function() k3.tensor({{1, 2}, {3}}) end,
      "bad argument #1 to 'tensor' (ragged nesting: a list at depth 2 has 1 items, expected 2)")
    H.raises(function() k3.tensor({{1, "a"}}) end, "expected a number at depth 2; got string")
  end)
end)

describe("arguments and messages", function()
  it("messages stay 1-based in Lua while the C core counts from 0", function()
    local t = k3.zeros({2, 3})
    H.raises(function() t:narrow(2, 3, 2) end, "narrow: start 3 and length 2 out of range for dim 2 of size 3")
    H.raises(function() t:select(1, 3) end, "select: index 3 out of range for dim 1 of size 2")
    H.raises(function() t:get(1, 4) end, "get: index 4 out of range for dim 2 of size 3")
    H.raises(function() t:set(3, 1, 0) end, "set: index 3 out of range for dim 1 of size 2")
    H.raises(function() t:view({-1, -1}) end, "view: only one size may be -1 (dims 1 and 2)")
    H.raises(function() t:expand({3, 3}) end, "expand: dim 1 of size 2 cannot expand to 3")
    H.raises(function() t:as_strided({2, 3}, {3, -1}) end, "as_strided: stride of dim 2 must be >= 0; got -1")
    H.raises(function() k3.zeros({2 ^ 31, 2 ^ 31, 4}) end, "zeros: element count overflows at dim 3")
    H.raises(function() k3.zeros({1, 3}):expand({2, 3}):copy(t) end,
      "copy: destination dim 1 has stride 0 (a broadcast view); it cannot be written")
  end)

  it("allclose names its options argument", function()
    H.raises(function() k3.allclose(k3.ones({2}), k3.ones({2}), {atol = "x"}) end,
      "bad argument #3 to 'allclose' (field 'atol' must be a number; got string)")
  end)

  it("k3.tensor refuses lists with holes or named fields instead of dropping values", function()
    H.raises(function() k3.tensor({[1] = 1, [3] = 3}) end,
             "bad argument #1 to 'tensor' (a list at depth 1 has key 3; expected only the indices 1..1")
    H.raises(function() k3.tensor({1, x = 2}) end, "a list at depth 1 has key 'x'")
    H.raises(function() k3.tensor({{1, 2}, {3, 4, n = 1}}) end, "a list at depth 2 has key 'n'")
    H.raises(function() k3.tensor({[1.5] = 1}) end, "a list at depth 1 has key 1.5")
    H.raises(function() k3.tensor({{1, 2}, 3}) end, "expected a list at depth 2; got number")
    H.raises(function() k3.tensor({{1, 2}, {3}}) end,
             "ragged nesting: a list at depth 2 has 1 items, expected 2")
    -- Metamethods are not consulted: the shape is what the table holds.
    local proxy = setmetatable({}, {__len = function() return 3 end, __index = function() return 7 end})
    assert.same({0}, k3.tensor(proxy):size())
    assert.same({{1, 2}, {3, 4}}, k3.tensor({{1, 2}, {3, 4}}):totable())
  end)

  it("k3.tensor over shared sub-lists whose element count overflows is refused, not a heap overflow", function()
    -- 65536 items nested 4 deep (each level the same list) is 2^64 elements: the count wraps to 0.
    local t = {}
    for i = 1, 65536 do t[i] = 0 end
    for _ = 2, 4 do
      local u = {}
      for i = 1, 65536 do u[i] = t end
      t = u
    end
    H.raises(function() k3.tensor(t) end,
             "bad argument #1 to 'tensor' (the nested lists' shape has more elements than memory can hold: sizes overflow at depth 4)")
  end)
end)

describe("writes through views", function()
  it("a copy into a destination whose elements overlap is refused, whatever makes them overlap", function()
    local base = k3.tensor({1, 2, 3, 4})
    local ov = base:as_strided({2, 2}, {1, 1}, 0) -- elements at offsets 0, 1, 1, 2
    H.raises(function() ov:copy(k3.tensor({{5, 6}, {7, 8}})) end,
      "copy: destination is written but its elements overlap (shape [2, 2], strides [1, 1])")
    assert.same({1, 2, 3, 4}, base:totable()) -- nothing was written
    -- The same rule as the ops' out.
    H.raises(function() k3.rms_norm(k3.ones({2, 2}), k3.ones({2}), 1e-5, {out = ov}) end,
      "rms_norm: out is written but its elements overlap (shape [2, 2], strides [1, 1])")
    H.raises(function() k3.silu_mul(k3.ones({2, 4}), {out = ov}) end,
      "silu_mul: out is written but its elements overlap (shape [2, 2], strides [1, 1])")
    -- The test is conservative for interleaved views: offsets 0, 3, 2, 5, 4, 7 share nothing,
    -- but the dims interleave, so the view is refused as a destination (k3.h documents it).
    local il = k3.zeros({8}):as_strided({3, 2}, {2, 3}, 0)
    H.raises(function() il:copy(k3.ones({3, 2})) end,
      "copy: destination is written but its elements overlap (shape [3, 2], strides [2, 3])")
    -- Disjoint strided destinations are still written.
    local pad = k3.zeros({2, 5})
    pad:as_strided({2, 2}, {5, 2}, 1):copy(k3.tensor({{1, 2}, {3, 4}}))
    assert.same({{0, 1, 0, 2, 0}, {0, 3, 0, 4, 0}}, pad:totable())
  end)

  it("fill and set write through overlapping views; a view copied onto itself is a no-op", function()
    local base = k3.tensor({1, 2, 3, 4})
    local ov = base:as_strided({2, 2}, {1, 1}, 0)
    ov:fill(7)
    assert.same({7, 7, 7, 4}, base:totable())
    ov:set(2, 1, 9) -- offset 1, shared with ov[1][2]
    assert.equal(9, ov:get(1, 2))
    assert.same({7, 9, 7, 4}, base:totable())
    ov:copy(ov)
    assert.same({7, 9, 7, 4}, base:totable())
    local b = k3.zeros({1, 3}):expand({2, 3})
    b:fill(2)
    assert.same({{2, 2, 2}, {2, 2, 2}}, b:totable())
  end)

  it("fill of a broadcast view stores each distinct element once", function()
    local base = k3.zeros({3, 1})
    local huge = base:expand({3, 1 << 40}) -- 3 x 2^40 elements, 3 in memory
    huge:fill(5)
    assert.same({{5}, {5}, {5}}, base:totable())
    assert.equal(5, huge:get(2, (1 << 40) - 7))
  end)

  it("get/set on an empty view with huge strides report the index, with no overflow", function()
    -- An empty view's strides are never needed, so they may be anything; element access must
    -- reject the out-of-range index before it multiplies an index by a stride (found by
    -- fuzz_tensor under UBSan; make test-asan runs this).
    local t = k3.zeros({4})
    local v = t:as_strided({2, 0}, {2^61, 1}, 0)
    H.raises(function() return v:get(2, 1) end, "get: index 1 out of range for dim 2 of size 0")
    H.raises(function() v:set(2, 1, 5) end, "set: index 1 out of range for dim 2 of size 0")
    assert.same({0, 0, 0, 0}, t:totable())
  end)
end)

describe("scalar arithmetic", function()
  it("scalar arithmetic rounds each element once, for every dtype and operand order", function()
    -- The review's case: 1 * (1 + 2^-8 + 2^-40) lies just above bf16's tie 1 + 2^-8, so it
    -- rounds up; the scalar rounded to f32 first (1 + 2^-8) would tie to even, 1.
    assert.equal(1 + 2 ^ -7, (k3.full({1}, 1, {dtype = "bf16"}) * (1 + 2 ^ -8 + 2 ^ -40)):get(1))
    -- Each dtype: operands whose exact result a double holds (so rounding that double once,
    -- as k3.full does, is the oracle), straddling the dtype's ties by 2^-40 and less.
    local ulp = {bf16 = 2 ^ -7, f16 = 2 ^ -10, f32 = 2 ^ -23, f64 = 2 ^ -52}
    for dt, u in pairs(ulp) do
      local tiny = dt == "f64" and 0 or 2 ^ -40
      local xs = {1, -1.5, 3, 0.75, 2 ^ 10 + 2 ^ 3, -(2 ^ -3)}
      local ss = {1 + u / 2 + tiny, 1 + u / 2 - tiny, 1 + 3 * u / 2 + tiny, -(1 + u / 2 + tiny),
                  u / 2 + tiny, u / 2 - tiny, -(u / 2) - tiny, 3 * u / 2 + tiny, 0.1, 1 / 3}
      local x = k3.tensor(xs, {dtype = dt})
      local xv = x:to("f64"):totable()
      -- A strided view too: every element of x, read with stride 2.
      local strided = k3.zeros({#xs, 2}, {dtype = dt}):select(2, 1)
      strided:copy(x)
      for _, s in ipairs(ss) do
        for _, case in ipairs{
          {"x*s", function(t) return t * s end, function(a) return a * s end},
          {"s*x", function(t) return s * t end, function(a) return s * a end},
          {"x+s", function(t) return t + s end, function(a) return a + s end},
          {"s+x", function(t) return s + t end, function(a) return s + a end},
          {"x-s", function(t) return t - s end, function(a) return a - s end},
          {"s-x", function(t) return s - t end, function(a) return s - a end},
        } do
          local want = {}
          for i, a in ipairs(xv) do
            local exact = case[3](a)
            -- 0.1 and 1/3 have 53 bits: their products need more, so skip those oracles.
            if (s == 0.1 or s == 1 / 3) and case[1]:find("*", 1, true) then exact = nil end
            want[i] = exact and k3.full({1}, exact, {dtype = dt}):get(1)
          end
          for _, t in ipairs{x, strided} do
            local got = case[2](t):totable()
            for i = 1, #xs do
              if want[i] and got[i] ~= want[i] then
                error(string.format("%s %s with x = %a, s = %a: got %a, want %a", dt, case[1],
                                    xv[i], s, got[i], want[i]))
              end
            end
          end
        end
      end
    end
  end)
end)

describe("0-dim tensors", function()
  it("a 0-dim tensor prints as a scalar", function()
    local s = k3.tensor({{1, 2}, {3, 4}}):select(1, 2):select(1, 1)
    assert.equal("k3.Tensor [] f32 cpu offset 2\n3", tostring(s))
    assert.equal("{k3.Tensor [] f32 cpu offset 2}", k3.inspect({s}))
  end)
end)

-- Findings of the libFuzzer targets (spec/fuzz/), reproduced through the Lua API.
describe("fuzzer findings", function()
  -- 8bcf977: k3_tensor_extent multiplied (size - 1) * stride for the dims before a zero size, so an
  -- empty view with huge strides there overflowed int64 (undefined behaviour; UBSan under
  -- `make test-asan`). An empty view reaches no element: its extent is 0.
  it("an empty view with huge strides before its zero dim (8bcf977: k3_tensor_extent)", function()
    local base = k3.zeros({4})
    for _, l in ipairs({{{3, 0}, {2 ^ 62, 1}}, {{3, 0, 5}, {2 ^ 62, 1, 2 ^ 61}}, {{2, 2, 0}, {2 ^ 62, 2 ^ 62, 1}}}) do
      local v = base:as_strided(l[1], l[2], 1)
      assert.same(l[1], v:size())
      assert.same(l[2], v:stride())
      assert.equal(0, v:numel())
      assert.same(l[1], v:clone():size())
      assert.equal("f64", v:to("f64"):dtype())
      assert.same(l[1], (v + v):size())
      assert.same(l[1], (-v):size())
      v:copy(k3.zeros(l[1]))
      v:fill(1)
      assert.equal(0, k3.max_abs_diff(v, v))
    end
    -- an op's overlap check measures the extents of an out and an input of one storage
    local out = base:as_strided({3, 0}, {2 ^ 62, 1}, 0)
    local y = k3.linear(base:as_strided({3, 1}, {1, 1}, 0), k3.zeros({0, 1}), {out = out})
    assert.same({3, 0}, y:size())
    local v = base:as_strided({3, 0}, {2 ^ 62, 1}, 0)
    v:copy(base:as_strided({3, 0}, {1, 2 ^ 62}, 0))
    -- nothing was written: base is as it was
    assert.same({0, 0, 0, 0}, base:totable())
    -- and the 1-based index messages of the same change at the INT64 extremes (wrapping)
    local t = k3.zeros({2, 3})
    H.raises_exact(function() t:select(1, math.mininteger) end,
      "select: index -9223372036854775808 out of range for dim 1 of size 2")
    H.raises_exact(function() t:narrow(2, math.maxinteger, 1) end,
      "narrow: start 9223372036854775807 and length 1 out of range for dim 2 of size 3")
  end)

  -- An expand of an empty tensor can make an empty view whose row-major strides would overflow
  -- ([0, 2^62, 4]: 2^62 * 4); k3.empty refuses that shape, so a new tensor of it must be refused
  -- too (K3_EOVERFLOW), not allocated with wrapped strides. From Lua the dim is counted from
  -- 1, as in k3.empty's message for the same shape.
  local function overflowing_empty_view()
    local e = k3.zeros({1}):expand({0, 2 ^ 62, 4})
    assert.same({0, 2 ^ 62, 4}, e:size())
    assert.equal(0, e:numel())
    return e
  end
  local function refused(fn, name)
    H.raises(fn, name .. ": stride computation overflows at dim 3 (size 4)")
  end

  it("to / clone of an empty view whose row-major strides overflow is refused (5e8f823)", function()
    H.raises_exact(function() k3.empty({0, 2 ^ 62, 4}) end, "empty: stride computation overflows at dim 3 (size 4)")
    local e = overflowing_empty_view()
    refused(function() return e:to("f64") end, "to")
    refused(function() return e:to({dtype = "f16"}) end, "to")
    refused(function() return e:clone() end, "clone")
    -- the view itself is unharmed and usable
    assert.same({0, 2 ^ 62, 4}, e:size())
    assert.same({0, 0, 0}, e:stride())
    assert.same({0, 2, 4}, e:narrow(2, 1, 2):clone():size())
    assert.equal(0, k3.max_abs_diff(e, e))
  end)

  it("binary ops on an empty view whose row-major strides overflow are refused (f2f014c)", function()
    local e = overflowing_empty_view()
    refused(function() return e + e end, "add")
    refused(function() return e - e end, "sub")
    refused(function() return e * e end, "mul")
    refused(function() return e * 2 end, "mul")
    refused(function() return 2 - e end, "sub")
    refused(function() return -e end, "unm")
    assert.same({0, 2 ^ 62, 4}, e:size())
    local small = e:narrow(2, 1, 3)
    assert.same({0, 3, 4}, (small + small):size())
  end)
end)

-- ---- Torch forms: t[i], #t, reshape, permute, squeeze, unsqueeze, varargs shapes -------------

-- The values of t in row-major order, as a flat Lua list (the fp64 oracle of reshape).
local function flat(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for _, x in ipairs(v) do walk(x) end else out[#out + 1] = v end
  end
  walk(t:to("cpu"):to("f64"):totable())
  return out
end

-- The same tensor in several layouts: contiguous, transposed, padded rows, expanded.
local function layouts()
  local c = k3.randn({4, 6}, {dtype = "f64", seed = 91})
  return {
    contiguous = c,
    transposed = k3.randn({6, 4}, {dtype = "f64", seed = 92}):t(),
    padded = H.padded(4, 6, 3, {dtype = "f64", seed = 93}),
    expanded = k3.randn({4, 1}, {dtype = "f64", seed = 94}):expand(4, 6),
  }
end

describe("t[i], t[i] = v and #t", function()
  it("t[i] is t:select(1, i): a view for 2+ dims, a number for 1 dim", function()
    local t = k3.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.same({3}, t[2]:size())
    assert.same({4, 5, 6}, t[2]:totable())
    assert.equal(6, t[2][3])
    assert.equal("number", type(k3.tensor({7, 8})[2]))
    t[1]:fill(9) -- a view: the write shows in the base
    assert.same({{9, 9, 9}, {4, 5, 6}}, t:totable())
    local cube = k3.randn({2, 3, 4}, {dtype = "f64", seed = 95})
    assert.equal(cube:get(2, 3, 4), cube[2][3][4])
    assert.equal(0, k3.max_abs_diff(cube[2], cube:select(1, 2)))
  end)

  it("t[i] follows strided and expanded views", function()
    for name, t in pairs(layouts()) do
      for i = 1, #t do
        assert.equal(0, k3.max_abs_diff(t[i], t:select(1, i)), name)
        assert.same(t:select(1, i):stride(), t[i]:stride(), name)
        assert.equal(t:get(i, 2), t[i][2], name)
      end
    end
  end)

  it("t[i] = number fills the slice, t[i] = tensor copies into it (any dtype and strides)", function()
    local t = k3.zeros(3, 4)
    t[2] = 5
    assert.same({{0, 0, 0, 0}, {5, 5, 5, 5}, {0, 0, 0, 0}}, t:totable())
    t[3] = k3.tensor({1, 2, 3, 4}, {dtype = "bf16"})
    assert.same({1, 2, 3, 4}, t[3]:totable())
    t[1] = k3.tensor({{1, 2}, {3, 4}, {5, 6}, {7, 8}}):t()[2] -- a strided source: {2, 4, 6, 8}
    assert.same({2, 4, 6, 8}, t[1]:totable())
    local v = k3.zeros(3)
    v[2] = 7.5
    assert.same({0, 7.5, 0}, v:totable())
    local bf = k3.zeros({2}, {dtype = "bf16"})
    bf[1] = 1 + 2 ^ -9 -- rounded once to bf16, as set does
    assert.equal(1, bf[1])
    -- through a view of a view: the base shows every write
    local base = k3.zeros(2, 3, 2)
    base[2][3] = k3.tensor({4, 5})
    base[1][1][2] = 6
    assert.same({{{0, 6}, {0, 0}, {0, 0}}, {{0, 0}, {0, 0}, {4, 5}}}, base:totable())
    -- a transposed base: t[i] = v writes its column
    local m = k3.zeros(2, 3)
    m:t()[3] = 1
    assert.same({{0, 0, 1}, {0, 0, 1}}, m:totable())
  end)

  it("#t is t:size(1), also for empty and expanded tensors", function()
    assert.equal(3, #k3.zeros(3, 5))
    assert.equal(0, #k3.zeros(0, 5))
    assert.equal(7, #k3.zeros(1, 2):expand(7, 2))
    assert.equal(5, #k3.zeros(3, 5):t())
  end)

  it("methods are still found by name, and a missing one is nil", function()
    local t = k3.zeros(2)
    assert.equal("function", type(t.size))
    assert.is_nil(t.no_such_method)
    assert.equal(k3.zeros(1).numel, t.numel)
  end)

  it("errors name the index and the size", function()
    local t = k3.zeros(2, 3)
    H.raises_exact(function() return t[3] end,
      "bad argument #2 to 'index' (index 3 out of range for dim 1 of size 2)")
    H.raises_exact(function() return t[0] end,
      "bad argument #2 to 'index' (index 0 out of range for dim 1 of size 2)")
    H.raises_exact(function() return t[-1] end,
      "bad argument #2 to 'index' (index -1 out of range for dim 1 of size 2)")
    H.raises_exact(function() return t[1][4] end,
      "bad argument #2 to 'index' (index 4 out of range for dim 1 of size 3)")
    H.raises_exact(function() return k3.zeros(0, 3)[1] end,
      "bad argument #2 to 'index' (index 1 out of range for dim 1 of size 0)")
    H.raises_exact(function() return t[1.5] end,
      "bad argument #2 to 'index' (a tensor is indexed by an integer or a method name; got 1.5)")
    H.raises_exact(function() return t[true] end,
      "bad argument #2 to 'index' (a tensor is indexed by an integer or a method name; got boolean)")
    H.raises_exact(function() t[3] = 1 end,
      "bad argument #2 to 'newindex' (index 3 out of range for dim 1 of size 2)")
    H.raises_exact(function() t[1] = "x" end,
      "bad argument #3 to 'newindex' (number or k3.Tensor expected, got string)")
    H.raises_exact(function() t.size = 1 end,
      "cannot assign field 'size' of a k3.Tensor (a tensor has methods, no fields; t[i] = v writes a slice)")
    H.raises_exact(function() t[1] = k3.zeros(2) end, "copy: source shape [2] must match destination shape [3]")
    H.raises_exact(function() k3.zeros(3, 1):expand(3, 4)[1] = k3.zeros(4) end,
      "copy: destination dim 1 has stride 0 (a broadcast view); it cannot be written")
    local s = k3.zeros(2):select(1, 1)
    H.raises_exact(function() return s[1] end,
      "bad argument #2 to 'index' (index 1 into a 0-dim tensor (one element: use get()))")
    H.raises_exact(function() return #s end, "bad argument #1 to 'len' (#t of a 0-dim tensor (it has no dim 1))")
    local f = k3.zeros(2, 2)
    f:free()
    H.raises_exact(function() return f[1] end, "tensor has been freed (the operand of t[i])")
    H.raises_exact(function() f[1] = 0 end, "tensor has been freed (the operand of t[i] = v)")
    H.raises_exact(function() return #f end, "tensor has been freed (the operand of #t)")
  end)

  it("a write into a static tensor is refused", function()
    local w = k3.zeros(2, 2)
    w:mark_static("a weight")
    H.raises(function() w[1] = 1 end, "a weight")
    H.raises(function() w[1][1] = 1 end, "a weight")
    H.raises(function() w[1] = k3.ones(2) end, "a weight")
    assert.same({{0, 0}, {0, 0}}, w:totable())
  end)
end)

describe("reshape, permute, squeeze, unsqueeze", function()
  -- Whether a and b share memory: a write into b shows in a.
  local function shares(a, b)
    local before = a:clone()
    b:fill(12345)
    local changed = k3.max_abs_diff(a, before) > 0
    a:copy(before)
    return changed
  end

  it("reshape keeps the row-major order on every layout; a view exactly when the strides allow", function()
    local cases = {
      {"contiguous", {24}, true}, {"contiguous", {2, 3, 4}, true}, {"contiguous", {3, -1}, true},
      {"padded", {4, 2, 3}, true}, {"padded", {4, 6, 1}, true}, {"padded", {24}, false},
      {"padded", {2, 12}, false}, {"transposed", {4, 6}, true}, {"transposed", {4, 3, 2}, true}, {"transposed", {8, 3}, false}, {"transposed", {24}, false},
      {"transposed", {1, 4, 1, 6}, true}, {"expanded", {4, 6, 1}, true}, {"expanded", {4, 2, 3}, true},
      {"expanded", {24}, false}, {"expanded", {2, 12}, false},
    }
    for _, c in ipairs(cases) do
      local name, shape, is_view = c[1], c[2], c[3]
      local t = layouts()[name]
      local r = t:reshape(shape)
      local label = name .. " -> " .. table.concat(shape, "x")
      assert.same(flat(t), flat(r), label)
      local want = {}
      for i, d in ipairs(shape) do want[i] = d == -1 and 8 or d end
      assert.same(want, r:size(), label)
      if name ~= "expanded" then -- an expanded view's elements share memory: it cannot be written
        assert.equal(is_view, shares(t, r), label)
      end
      if not is_view then assert.is_true(r:is_contiguous(), label) end
    end
    -- the expanded base keeps its zero strides where the view is possible
    assert.same({1, 0, 0}, layouts().expanded:reshape(4, 2, 3):stride())
  end)

  -- The oracle of view-ness: t's storage offsets in row-major order; shape sh is a view of t
  -- exactly when some strides reproduce them, and those strides are fixed by the offsets of
  -- the unit steps (a size-1 dim's stride reaches no element).
  local function offsets_of(size, stride, offset)
    local out, idx, n = {}, {}, 1
    for d = 1, #size do idx[d] = 1; n = n * size[d] end
    for _ = 1, n do
      local o = offset
      for d = 1, #size do o = o + (idx[d] - 1) * stride[d] end
      out[#out + 1] = o
      for d = #size, 1, -1 do
        idx[d] = idx[d] + 1
        if idx[d] <= size[d] then break end
        idx[d] = 1
      end
    end
    return out
  end
  local function oracle_strides(offs, sh)
    local st, unit = {}, 1
    for d = #sh, 1, -1 do
      st[d] = sh[d] > 1 and offs[unit + 1] - offs[1] or nil
      unit = unit * sh[d]
    end
    local full = {}
    for d = 1, #sh do full[d] = st[d] or 0 end
    local again = offsets_of(sh, full, offs[1])
    for i = 1, #offs do if again[i] ~= offs[i] then return nil end end
    return st
  end

  it("reshape is a view exactly when some strides give t's elements in order (random layouts)", function()
    local rng = 12345
    local function rand(n) rng = (rng * 1103515245 + 12345) % 2147483648; return rng % n + 1 end
    local factorizations = {[24] = {{24}, {2, 12}, {12, 2}, {4, 6}, {6, 4}, {2, 3, 4}, {4, 3, 2},
                                     {2, 2, 6}, {3, 8}, {1, 24, 1}, {2, 1, 3, 1, 4}}}
    for trial = 1, 300 do
      -- a [2, 3, 4] tensor made through a random chain of views over a larger base
      local base = k3.randn({4, 5, 6}, {dtype = "f64", seed = trial})
      local t = base:narrow(1, rand(3), 2):narrow(2, rand(3), 3):narrow(3, rand(3), 4)
      local perm = ({{1, 2, 3}, {1, 3, 2}, {2, 1, 3}, {2, 3, 1}, {3, 1, 2}, {3, 2, 1}})[rand(6)]
      t = t:permute(perm):contiguous():view(2, 3, 4) -- fresh contiguous data...
      local kind = rand(4)
      if kind == 1 then t = t:permute(perm) -- ...then a permuted,
      elseif kind == 2 then t = base:narrow(3, 1, 4):narrow(2, 1, 3):narrow(1, 1, 2) -- strided,
      elseif kind == 3 then t = t:narrow(3, 1, 1):expand(2, 3, 4) end -- or expanded view
      local n = t:numel()
      local shapes = factorizations[n]
      local sh = shapes[rand(#shapes)]
      local offs = offsets_of(t:size(), t:stride(), t:offset())
      local want = oracle_strides(offs, sh)
      local r = t:reshape(sh)
      local label = string.format("trial %d: [%s] strides [%s] -> [%s]", trial, table.concat(t:size(), ", "),
                                  table.concat(t:stride(), ", "), table.concat(sh, ", "))
      assert.same(flat(t), flat(r), label)
      if want then
        assert.equal(t:offset(), r:offset(), label)
        for d = 1, #sh do
          if sh[d] > 1 then assert.equal(want[d], r:stride(d), label) end
        end
        if kind ~= 3 then assert.is_true(shares(t, r), label) end
      else
        assert.is_true(r:is_contiguous(), label)
        if kind ~= 3 then assert.is_false(shares(t, r), label) end
      end
    end
  end)

  it("reshape of a view shares the base's storage; of a copy does not", function()
    local base = k3.zeros(2, 6)
    base:reshape(3, 4)[3] = 1
    assert.same({0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}, flat(base))
    local tb = k3.zeros(3, 2)
    local r = tb:t():reshape(6)
    r:fill(1)
    assert.same({0, 0, 0, 0, 0, 0}, flat(tb))
  end)

  it("reshape of empty and 0-dim tensors", function()
    assert.same({3, 0}, k3.zeros(0, 3):reshape(3, 0):size())
    assert.same({0}, k3.zeros(2, 0, 3):transpose(1, 3):reshape(0):size())
    assert.same({0}, k3.zeros(0, 3):reshape(-1):size())
    local s = k3.tensor({5, 6}):select(1, 2)
    assert.same({1, 1}, s:reshape(1, 1):size())
    assert.equal(6, s:reshape(1, 1):get(1, 1))
  end)

  it("reshape errors", function()
    local t = k3.zeros(2, 3)
    H.raises_exact(function() t:reshape(4, 2) end, "reshape: shape [4, 2] has 8 elements; tensor has 6")
    H.raises_exact(function() t:reshape(-1, -1) end, "reshape: only one size may be -1 (dims 1 and 2)")
    H.raises_exact(function() t:reshape(4, -1) end, "reshape: cannot infer dim 2: 6 elements over 4")
    H.raises_exact(function() t:reshape(-2, 3) end, "reshape: size of dim 1 must be >= 0 or -1; got -2")
    H.raises_exact(function() k3.zeros(0, 3):reshape(-1, 0) end, "reshape: cannot infer dim 1: 0 elements over 0")
    H.raises_exact(function() t:reshape("x") end,
      "bad argument #1 to 'reshape' (shape table or sizes expected, got string)")
    H.raises_exact(function() t:reshape({}) end, "bad argument #1 to 'reshape' (shape must have 1 to 8 dims; got 0)")
  end)

  it("permute reorders dims as a view, against the fp64 oracle", function()
    local t = k3.randn({2, 3, 4}, {dtype = "f64", seed = 96})
    local p = t:permute(3, 1, 2)
    assert.same({4, 2, 3}, p:size())
    assert.same({1, 12, 4}, p:stride())
    for i = 1, 2 do for j = 1, 3 do for k = 1, 4 do
      assert.equal(t:get(i, j, k), p:get(k, i, j))
    end end end
    assert.equal(0, k3.max_abs_diff(t:permute({2, 1, 3}), t:transpose(1, 2)))
    p[1] = 0 -- a view: t[.][.][1] is now 0
    for i = 1, 2 do for j = 1, 3 do assert.equal(0, t:get(i, j, 1)) end end
    -- strided and expanded inputs keep their strides, permuted
    local e = k3.zeros(3, 1):expand(3, 5)
    assert.same({0, 1}, e:permute(2, 1):stride())
    assert.same({2, 0}, k3.zeros(0, 2):permute(2, 1):size())
  end)

  it("permute errors", function()
    local t = k3.zeros(2, 3)
    H.raises_exact(function() t:permute(1) end, "permute: expected 2 dims for a 2-dim tensor; got 1")
    H.raises_exact(function() t:permute(1, 1) end, "permute: dim 1 appears twice (positions 1 and 2)")
    H.raises_exact(function() t:permute(1, 3) end, "bad argument #2 to 'permute' (dim 3 at position 2 is out of range 1..2)")
    H.raises_exact(function() t:permute(0, 1) end, "bad argument #1 to 'permute' (dim 0 at position 1 is out of range 1..2)")
    H.raises_exact(function() t:permute({2, 2 ^ 40}) end,
      "bad argument #1 to 'permute' (dim 1099511627776 at position 2 is out of range 1..2)")
  end)

  it("squeeze and unsqueeze add and remove size-1 dims as views", function()
    local t = k3.randn({1, 3, 1, 2}, {seed = 97})
    assert.same({3, 2}, t:squeeze():size())
    assert.same({3, 1, 2}, t:squeeze(1):size())
    assert.same({1, 3, 1, 2}, t:squeeze(2):size()) -- size 3: kept, as Torch does
    assert.same({1, 3, 2}, t:squeeze(3):size())
    assert.equal(0, k3.max_abs_diff(t:squeeze():unsqueeze(1):unsqueeze(3), t))
    local v = k3.tensor({1, 2, 3})
    assert.same({1, 3}, v:unsqueeze(1):size())
    assert.same({3, 1}, v:unsqueeze(2):size())
    assert.same({3, 1}, v:unsqueeze(1):stride())
    assert.same({1, 1}, v:unsqueeze(2):stride())
    v:unsqueeze(2)[2] = 20
    assert.same({1, 20, 3}, v:totable())
    -- a strided view: the new dim steps over the dim after it
    local col = k3.zeros(4, 5):select(2, 2)
    assert.same({20, 5}, col:unsqueeze(1):stride())
    assert.same({0, 3}, k3.zeros(0, 1, 3):squeeze(2):size())
    assert.same({0, 3}, k3.zeros(0, 1, 3):squeeze():size())
    assert.same({}, k3.zeros(1):squeeze():size()) -- a 0-dim tensor, one element
    assert.same({1}, k3.zeros(1):squeeze():unsqueeze(1):size())
  end)

  it("squeeze and unsqueeze errors", function()
    local t = k3.zeros(2, 1)
    H.raises_exact(function() t:squeeze(3) end, "bad argument #1 to 'squeeze' (dim must be in 1..2; got 3)")
    H.raises_exact(function() t:unsqueeze(4) end, "bad argument #1 to 'unsqueeze' (dim must be in 1..3; got 4)")
    H.raises_exact(function() t:unsqueeze(0) end, "bad argument #1 to 'unsqueeze' (dim must be in 1..3; got 0)")
    H.raises_exact(function() k3.zeros({1, 1, 1, 1, 1, 1, 1, 1}):unsqueeze(1) end,
      "unsqueeze: the tensor has 8 dims already (the most a tensor has)")
  end)
end)

describe("shapes as varargs", function()
  it("k3.empty, zeros, ones and randn take d1, ..., dn with options last", function()
    assert.same({2, 3}, k3.empty(2, 3):size())
    assert.same({{0, 0, 0}, {0, 0, 0}}, k3.zeros(2, 3):totable())
    assert.same({1, 1}, k3.ones(2, {dtype = "f64"}):totable())
    assert.equal("bf16", k3.zeros(2, 3, {dtype = "bf16"}):dtype())
    assert.equal(0, k3.max_abs_diff(k3.randn(3, 4, {seed = 5}), k3.randn({3, 4}, {seed = 5})))
    assert.same({0, 4}, k3.zeros(0, 4):size())
    assert.same({1, 1, 1, 1, 1, 1, 1, 1}, k3.zeros(1, 1, 1, 1, 1, 1, 1, 1):size())
  end)

  it("view, expand and reshape take d1, ..., dn", function()
    local t = k3.tensor({1, 2, 3, 4, 5, 6})
    assert.same({{1, 2}, {3, 4}, {5, 6}}, t:view(3, 2):totable())
    assert.same({{1, 2, 3}, {4, 5, 6}}, t:reshape(2, -1):totable())
    assert.same({4, 3}, k3.zeros(1, 3):expand(4, 3):size())
    assert.same({4, 3}, k3.zeros(1, 3):expand(4, -1):size())
  end)

  it("k3.full keeps its table shape", function()
    assert.same({7, 7}, k3.full({2}, 7):totable())
    H.raises_exact(function() k3.full(2, 7) end, "bad argument #1 to 'full' (table expected, got number)")
  end)

  it("errors name the argument", function()
    H.raises_exact(function() k3.zeros(2, 1.5) end,
      "bad argument #2 to 'zeros' (size must be an integer; got 1.5)")
    H.raises_exact(function() k3.zeros(2, -1) end, "bad argument #2 to 'zeros' (size of dim 2 must be >= 0; got -1)")
    H.raises_exact(function() k3.ones(1, 1, 1, 1, 1, 1, 1, 1, 1) end,
      "bad argument #9 to 'ones' (shape must have 1 to 8 dims; got 9)")
    H.raises_exact(function() k3.zeros(2, "f32") end, "bad argument #2 to 'zeros' (table expected, got string)")
    H.raises_exact(function() k3.zeros(2, 3, {dtyp = "f64"}) end,
      "bad argument #3 to 'zeros' (unknown option 'dtyp' (expected dtype, device or seed))")
    H.raises_exact(function() k3.zeros(2):view(1.5) end,
      "bad argument #1 to 'view' (size must be an integer; got 1.5)")
  end)
end)

describe("Torch forms on a CUDA device #gpu", function()
  if not H.require_gpu() then return end

  it("t[i], t[i] = v and #t on device tensors", function()
    local h = k3.randn({3, 4}, {dtype = "f32", seed = 98})
    local g = h:to("cuda")
    assert.equal(3, #g)
    assert.equal("cuda:0", g[2]:device())
    assert.equal(0, k3.max_abs_diff(g[2], h[2]))
    assert.equal(h[2][3], g[2][3])
    g[1] = 2
    g[3] = k3.tensor({1, 2, 3, 4}) -- a host source copied into a device slice
    g[2][2] = -1
    h[1] = 2
    h[3] = k3.tensor({1, 2, 3, 4})
    h[2][2] = -1
    assert.equal(0, k3.max_abs_diff(g, h))
    g:t()[4] = k3.tensor({7, 8, 9}, {device = "cuda"}) -- a strided device destination
    h:t()[4] = k3.tensor({7, 8, 9})
    assert.equal(0, k3.max_abs_diff(g, h))
    H.raises_exact(function() return g[4] end, "bad argument #2 to 'index' (index 4 out of range for dim 1 of size 3)")
  end)

  it("a device tensor prints as its host copy does, wrapped and summarised alike", function()
    for _, shape in ipairs({{12}, {3, 40}, {2, 1000}}) do
      local h = k3.randn(shape, {seed = 100})
      local g = h:to("cuda")
      assert.equal(tostring(h), (tostring(g):gsub(" cuda:0\n", " cpu\n", 1)))
    end
  end)

  it("reshape, permute, squeeze and unsqueeze of device tensors match the host", function()
    for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
      local h = k3.randn({4, 6}, {dtype = dt, seed = 99})
      local g = h:to("cuda")
      local views = {
        function(t) return t:reshape(2, 12) end,
        function(t) return t:t():reshape(24) end, -- a copy on the device
        function(t) return t:narrow(2, 1, 4):reshape(16) end, -- a copy of padded rows
        function(t) return t:narrow(2, 1, 4):reshape(4, 2, 2) end, -- a view of padded rows
        function(t) return t:unsqueeze(1):permute(3, 1, 2):contiguous() end,
        function(t) return t:narrow(1, 2, 1):squeeze() end,
        function(t) return t:narrow(1, 1, 1):expand(3, 6):reshape(18) end,
      }
      for i, f in ipairs(views) do
        local rg, rh = f(g), f(h)
        assert.equal("cuda:0", rg:device(), dt .. " case " .. i)
        assert.same(rh:size(), rg:size(), dt .. " case " .. i)
        assert.equal(0, k3.max_abs_diff(rg, rh), dt .. " case " .. i)
      end
    end
  end)
end)
