-- k3.help() lists the whole Lua API (README promises it): every name the module exports
-- (k3.*, and k3.method.* / k3.dist.* inside it), every tensor method and operator, and the
-- methods of a linear method appear in its text.
local k3 = require "k3"

local function help_text()
  local parts = {}
  local write = io.write
  io.write = function(...) -- luacheck: ignore
    for _, v in ipairs({...}) do parts[#parts + 1] = tostring(v) end
  end
  local ok, err = pcall(k3.help)
  io.write = write
  assert(ok, err)
  return table.concat(parts)
end

-- True when `name` appears in text as a whole name (not inside a longer identifier).
local function listed(text, name)
  local pat = name:gsub("%p", "%%%0")
  return text:find("%f[%w_.:]" .. pat .. "%f[^%w_]") ~= nil
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

describe("k3.help()", function()
  local text = help_text()

  it("prints one line per entry", function()
    assert.truthy(#text > 0)
    assert.equal("\n", text:sub(-1))
  end)

  it("lists every export of the module, nested tables included", function()
    local missing = {}
    local names = sorted_keys(k3)
    names[#names + 1] = "policy" -- read through the module's metatable, not a raw field
    for _, name in ipairs(names) do
      if name:sub(1, 1) ~= "_" then
        local v = k3[name]
        if type(v) == "table" and name ~= "policy" then
          for _, sub in ipairs(sorted_keys(v)) do
            local full = "k3." .. name .. "." .. sub
            if not listed(text, full) then missing[#missing + 1] = full end
          end
        elseif not listed(text, "k3." .. name) then
          missing[#missing + 1] = "k3." .. name
        end
      end
    end
    assert.same({}, missing)
  end)

  it("lists every tensor method and operator", function()
    local mt = getmetatable(k3.empty({1}))
    local missing = {}
    for _, m in ipairs(sorted_keys(require("k3.core")._tensor_methods)) do
      if not listed(text, "t:" .. m) then missing[#missing + 1] = "t:" .. m end
    end
    -- metamethods: how each one is written in Lua
    local written = {__add = "t + u", __sub = "t - u", __mul = "t * u", __div = "t / u", __unm = "-t",
                     __tostring = "tostring(t)", __close = "<close>", __gc = false,
                     __len = "#t", __newindex = "t[i] = v",
                     __index = false, __name = false}
    for _, m in ipairs(sorted_keys(mt)) do
      local w = written[m]
      assert(w ~= nil, "metamethod " .. m .. " has no entry in this spec")
      if w and not text:find(w, 1, true) then missing[#missing + 1] = m .. " (" .. w .. ")" end
    end
    assert.same({}, missing)
  end)

  it("lists the methods of a linear method", function()
    local m = k3.method.default()
    local missing = {}
    for _, name in ipairs(sorted_keys(getmetatable(m).__index)) do
      if not listed(text, "m:" .. name) then missing[#missing + 1] = "m:" .. name end
    end
    assert.same({}, missing)
  end)

  it("names as_strided, k3.dist, k3.batch_invariant and k3.version (the reviewer's list)", function()
    for _, name in ipairs({"t:as_strided", "k3.dist.init", "k3.dist.all_reduce", "k3.dist.simulate",
                           "k3.batch_invariant", "k3.version"}) do
      assert.is_true(listed(text, name), name)
    end
    assert.truthy(text:find(k3.version, 1, true))
  end)
end)
