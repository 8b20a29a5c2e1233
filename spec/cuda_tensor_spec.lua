-- CUDA device tensors (#gpu): copies host->device, device->host and device->device with any
-- strides (broadcast sources, 8 dims) and every dtype pair, bit-identical to the CPU's
-- conversions; fill; elementwise ops; get/set/totable; out-of-memory as a recoverable error;
-- empty_cache; freed tensors.
local k3 = require "k3"
local H = require "spec.helpers"

-- Exact equality of two tensors' values (NaN equal to NaN), on any devices.
local function same_values(a, b)
  return H.nested_equal(a:to("cpu"):to("f64"):totable(), b:to("cpu"):to("f64"):totable())
end

-- Values that stress rounding: ties, subnormals of f16 and bf16, overflow thresholds,
-- infinities, NaN, signed zero, and random values over many magnitudes.
local function special_values()
  local v = {0.0, -0.0, 1.0, -1.0, 1 / 3, -2 / 3, 65504.0, 65519.99, 65520.0, -65520.0, 1e5,
    2 ^ -14, 2 ^ -24, 2 ^ -25, 3 * 2 ^ -26, 2 ^ -26, 1e-8, 6e-8, 2 ^ -126, 2 ^ -133, 2 ^ -149,
    1e-45, 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, 1 + 2 ^ -9, 1 + 2 ^ -24, 1 + 2 ^ -11, 1 + 3 * 2 ^ -11,
    3.3895313892515355e38, 3.4e38, 3.5e38, 1e300, -1e300, 1e-300, math.huge, -math.huge, 0 / 0}
  local r = k3.randn({64}, {dtype = "f64", seed = 77}):totable()
  for i, x in ipairs(r) do v[#v + 1] = x * 10 ^ ((i % 13) - 6) end
  return v
end

describe("cuda tensors #gpu", function()
  if not H.require_gpu() then return end
  local dtypes = {"bf16", "f16", "f32", "f64"}

  it("live on cuda:0 and round-trip exactly", function()
    local x = k3.randn({5, 7}, {seed = 1})
    local g = x:to("cuda")
    assert.equal("cuda:0", g:device())
    assert.equal("f32", g:dtype())
    assert.same({5, 7}, g:size())
    assert.is_true(same_values(g, x))
    local h = k3.randn({5, 7}, {device = "cuda", seed = 1})
    assert.equal("cuda:0", h:device())
    assert.is_true(same_values(h, x)) -- the counter-based generator gives the same values
    assert.is_true(same_values(k3.zeros({3}, {device = "cuda"}), k3.zeros({3})))
    assert.is_true(same_values(k3.ones({2, 2}, {device = "cuda:0", dtype = "bf16"}), k3.ones({2, 2})))
  end)

  it("copies host to device with any source strides", function()
    local x = k3.randn({6, 9}, {seed = 2})
    assert.is_true(same_values(x:t():to("cuda"), x:t():contiguous()))
    assert.is_true(same_values(x:narrow(2, 3, 4):to("cuda"), x:narrow(2, 3, 4):contiguous()))
    local row = k3.randn({1, 9}, {seed = 3})
    assert.is_true(same_values(row:expand({5, 9}):to("cuda"), row:expand({5, 9}):contiguous()))
    -- into a strided device destination, with a dtype change
    local base = H.poisoned({9, 8}, {device = "cuda", dtype = "bf16"})
    local dst = base:narrow(2, 2, 6):t() -- [6, 9], strides {1, 8}
    dst:copy(x)
    assert.is_true(same_values(dst, x:to("bf16")))
    assert.is_true(H.has_nan(base:narrow(2, 1, 1))) -- the column outside the view is untouched
  end)

  it("copies device to host into any destination strides", function()
    local x = k3.randn({4, 6}, {seed = 4})
    local g = x:to("cuda")
    local dst = k3.zeros({6, 4}):t()
    dst:copy(g)
    assert.is_true(same_values(dst, x))
    local dst16 = k3.zeros({4, 10}, {dtype = "f16"}):narrow(2, 3, 6)
    dst16:copy(g:t():t())
    assert.is_true(same_values(dst16, x:to("f16")))
    assert.is_true(same_values(g:t():to("cpu"), x:t():contiguous()))
  end)

  it("copies device to device with any strides, zero strides and 8 dims", function()
    local x = k3.randn({2, 1, 3, 1, 2, 2, 1, 3}, {seed = 5})
    local g = x:to("cuda")
    assert.is_true(same_values(g:transpose(1, 8):contiguous(), x:transpose(1, 8):contiguous()))
    assert.is_true(same_values(g:transpose(3, 6):clone(), x:transpose(3, 6):clone()))
    local r = k3.randn({1, 5}, {seed = 6}):to("cuda")
    assert.is_true(same_values(r:expand({4, 5}):contiguous(), k3.randn({1, 5}, {seed = 6}):expand({4, 5})))
    local d = H.poisoned({5, 4}, {device = "cuda", dtype = "f64"}):t()
    d:copy(r:expand({4, 5}))
    assert.is_true(same_values(d, k3.randn({1, 5}, {seed = 6}):expand({4, 5})))
  end)

  it("converts every dtype pair bit-identically to the CPU (ties, subnormals, inf, NaN)", function()
    local x = k3.tensor(special_values(), {dtype = "f64"})
    for _, s in ipairs(dtypes) do
      local xs = x:to(s)
      local gs = xs:to("cuda")
      for _, d in ipairs(dtypes) do
        local want = xs:to(d)
        local got = gs:to(d)
        assert.equal(d, got:dtype())
        assert.is_true(same_values(got, want), s .. " -> " .. d .. " differs from the CPU")
        -- strided (the kernel path, not a plain memcpy)
        local x2 = xs:view({1, -1}):expand({2, #special_values()}):t()
        assert.is_true(same_values(x2:to("cuda"):to(d), x2:to(d)), s .. " -> " .. d .. " strided")
      end
    end
  end)

  it("fill rounds like the CPU, on whole tensors and strided views", function()
    for _, dt in ipairs(dtypes) do
      for _, v in ipairs({1 / 3, -65520, 1e-7, 0 / 0, math.huge}) do
        local g = k3.empty({3, 5}, {device = "cuda", dtype = dt})
        g:fill(v)
        assert.is_true(same_values(g, k3.full({3, 5}, v, {dtype = dt})), dt .. " fill " .. v)
      end
      local g = k3.zeros({4, 6}, {device = "cuda", dtype = dt})
      g:narrow(2, 2, 3):fill(7)
      local c = k3.zeros({4, 6}, {dtype = dt})
      c:narrow(2, 2, 3):fill(7)
      assert.is_true(same_values(g, c))
    end
  end)

  it("elementwise + - * with tensors and scalars match the CPU exactly", function()
    for _, dt in ipairs(dtypes) do
      local a = k3.randn({5, 6}, {dtype = dt, seed = 7})
      local b = k3.randn({6, 5}, {dtype = dt, seed = 8}):t()
      local ga, gb = a:to("cuda"), b:to("cuda")
      assert.is_true(same_values(ga + gb, a + b), dt .. " +")
      assert.is_true(same_values(ga - gb, a - b), dt .. " -")
      assert.is_true(same_values(ga * gb, a * b), dt .. " *")
      assert.is_true(same_values(ga * 0.1, a * 0.1), dt .. " * scalar")
      assert.is_true(same_values(3 * ga, 3 * a), dt .. " scalar *")
      assert.is_true(same_values(ga + 1, a + 1), dt .. " + scalar")
      assert.is_true(same_values(1 - ga, 1 - a), dt .. " scalar -")
      assert.is_true(same_values(-ga, -a), dt .. " unary -")
      assert.equal("cuda:0", (ga + gb):device())
    end
  end)

  it("get, set, totable and tostring synchronise and read device values", function()
    local x = k3.randn({3, 4}, {seed = 9})
    local g = x:to("cuda")
    assert.equal(x:get(2, 3), g:get(2, 3))
    g:set(1, 1, 5.5)
    assert.equal(5.5, g:get(1, 1))
    x:set(1, 1, 5.5)
    assert.is_true(H.nested_equal(g:totable(), x:totable()))
    assert.truthy(tostring(g):find("cuda:0", 1, true))
    k3.synchronize()
  end)

  it("out of memory is an error the caller recovers from", function()
    local err = H.raises(function() k3.empty({2 ^ 40}, {device = "cuda", dtype = "f32"}) end,
      "out of memory")
    assert.truthy(err:find("cuda:0", 1, true))
    local g = k3.ones({1024}, {device = "cuda"}) -- the device still works
    assert.equal(1, g:get(1024))
  end)

  it("empty_cache returns cached blocks and later allocations still work", function()
    for i = 1, 4 do
      local t = k3.randn({256, 256}, {device = "cuda", seed = i})
      t:free()
    end
    k3.empty_cache()
    local g = k3.randn({256, 256}, {device = "cuda", seed = 1})
    assert.is_true(same_values(g, k3.randn({256, 256}, {seed = 1})))
  end)

  it("a freed device tensor raises instead of touching memory", function()
    local g = k3.zeros({4}, {device = "cuda"})
    local v = g:narrow(1, 1, 2)
    g:free()
    H.raises(function() v:get(1) end, "tensor has been freed")
    H.raises(function() g:to("cpu") end, "tensor has been freed")
  end)

  it("copies between two devices when there are two", function()
    if (k3.backends().cuda.devices or 1) < 2 then return end
    local x = k3.randn({7, 5}, {seed = 10})
    local g1 = x:to("cuda:1")
    assert.equal("cuda:1", g1:device())
    local d = H.poisoned({5, 7}, {device = "cuda:0", dtype = "bf16"}):t()
    d:copy(g1)
    assert.is_true(same_values(d, x:to("bf16")))
    assert.is_true(same_values(x:to("cuda:0"):t():to("cuda:1"), x:t():contiguous()))
  end)
end)
