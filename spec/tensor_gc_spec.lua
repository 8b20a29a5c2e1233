-- The collector sees tensor memory: tensor storage allocations are reported to Lua's
-- collector (lib/lua/tensor.c), so loops of temporaries stay bounded, measured through k3's own
-- counters (k3.memory), not the process RSS that sanitizer builds inflate. On a GPU, a device
-- allocation that fails runs a full collection and retries once.
local k3 = require "k3"
local H = require "spec.helpers"

local MB = 1 << 20

-- Runs fn(i) n times after a full collection and returns the peak of k3's live host memory
-- above what was live before, in MB.
local function peak_mb(n, fn)
  collectgarbage()
  collectgarbage()
  local base = k3.memory().host_bytes
  k3.memory_reset_peak()
  for i = 1, n do fn(i) end
  return (k3.memory().host_peak - base) / MB
end

describe("tensor memory and the collector", function()
  after_each(function()
    collectgarbage("incremental")
    collectgarbage("restart")
  end)

  it("k3.memory counts live host tensor storage, and its peak", function()
    collectgarbage()
    local before = k3.memory()
    local t = k3.empty({1024, 256}) -- 1 MB of f32
    local during = k3.memory()
    assert.is_true(during.host_bytes - before.host_bytes >= MB)
    assert.is_true(during.host_allocations > before.host_allocations)
    assert.is_true(during.host_peak >= during.host_bytes)
    t:free()
    assert.is_true(k3.memory().host_bytes - before.host_bytes < 4096)
    for _, k in ipairs({"host_bytes", "host_peak", "host_allocations", "device_bytes", "device_peak",
                        "device_allocations"}) do
      assert.are.equal("integer", math.type(during[k]), k)
    end
  end)

  it("2,000 temporary 4 MB tensors keep live host memory well under 200 MB (incremental)", function()
    collectgarbage("incremental")
    local mb = peak_mb(2000, function() local t = k3.empty({1024, 1024}) end)
    assert.is_true(mb < 64, string.format("peak %.1f MB above the start", mb))
  end)

  it("the same in generational mode, and for op results", function()
    collectgarbage("generational")
    local mb = peak_mb(2000, function() local t = k3.empty({1024, 1024}) end)
    assert.is_true(mb < 64, string.format("peak %.1f MB above the start", mb))
    local x = k3.ones({512, 512}) -- 1 MB
    mb = peak_mb(400, function() local y = x + 1 end)
    assert.is_true(mb < 64, string.format("op results: peak %.1f MB above the start", mb))
  end)

  it("a stopped collector is left stopped: the loop then grows, and a collection frees it all", function()
    collectgarbage()
    collectgarbage("stop")
    local base = k3.memory().host_bytes
    for _ = 1, 20 do local t = k3.empty({1024, 1024}) end
    assert.is_true(k3.memory().host_bytes - base >= 20 * 4 * MB)
    collectgarbage("restart")
    collectgarbage()
    assert.is_true(k3.memory().host_bytes - base < MB)
  end)
end)

describe("device allocations and the collector #gpu", function()
  if not H.require_gpu() then return end
  after_each(function() collectgarbage("restart") end)

  it("an allocation that fails runs a full collection and retries: garbage never exhausts the GPU", function()
    collectgarbage()
    collectgarbage("stop") -- only the retry can free the garbage below
    local gb = 8
    local total = 0
    for _ = 1, 40 do -- 320 GB of unreferenced tensors on a GPU of at most 141 GB
      local t = k3.empty({gb * 1024, 1024 * 1024 / 4}, {device = "cuda"})
      total = total + gb
      t = nil
    end
    assert.are.equal(320, total)
    collectgarbage("restart")
    collectgarbage()
    assert.is_true(k3.memory().device_bytes < 1 << 30)
    k3.empty_cache() -- the freed 8 GB blocks go back to the driver for the specs after this one
  end)

  it("live tensors are not freed: a real out-of-memory still raises", function()
    local keep = {}
    local err = H.raises(function()
      for i = 1, 40 do keep[i] = k3.empty({8 * 1024, 1024 * 1024 / 4}, {device = "cuda"}) end
    end, "out of memory")
    assert.truthy(err:find("cuda:0", 1, true), err)
    keep = nil
    collectgarbage()
    k3.empty_cache()
  end)
end)
