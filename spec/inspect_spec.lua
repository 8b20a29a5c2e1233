-- k3.inspect (lua/k3/init.lua), the one-line rendering the REPL prints results with: what it
-- shows, and its bounds whatever a value claims about itself.
local k3 = require "k3"

describe("k3.inspect", function()
  it("k3.inspect renders its first argument and ignores the rest", function()
    assert.equal('{1, {a = 2}}', k3.inspect({1, {a = 2}}, "extra", 3))
    assert.equal("{1, {2, {3, {…}}}}", k3.inspect({1, {2, {3, {4}}}}))
  end)

  it("k3.inspect is bounded whatever a table claims: its __len, its __pairs, its strings", function()
    local liar = setmetatable({}, {__len = function() return 10000000 end})
    local s = k3.inspect(liar)
    assert.equal("{" .. ("nil, "):rep(100) .. "… (9999900 more)}", s)
    -- a length that is not an integer counts as none; an endless __pairs is read 10000 keys far
    assert.equal("{}", k3.inspect(setmetatable({}, {__len = function() return 1e300 end})))
    assert.equal("{}", k3.inspect(setmetatable({}, {__len = function() return -5 end})))
    local endless = setmetatable({}, {__pairs = function(t)
      local i = 0
      return function() i = i + 1 return "k" .. i, i end, t, nil
    end})
    s = k3.inspect(endless)
    assert.truthy(s:find(", … %(9900 more, and keys past the first 10000 not read%)}$"), s)
    -- a long string shows its first 200 bytes
    assert.equal('{"' .. ("ab"):rep(100) .. '"… (cut at 200 of 10000000 bytes)}', k3.inspect({("ab"):rep(5000000)}))
    -- a real table of a million keys, and 200 x 200 nested tables: bounded output
    local big = {}
    for i = 1, 1000000 do big["k" .. i] = i end
    assert.is_true(#k3.inspect(big) < 4000)
    local wide = {}
    for i = 1, 200 do wide[i] = {} for j = 1, 200 do wide[i][j] = {j} end end
    s = k3.inspect(wide)
    assert.is_true(#s < 10000, #s)
    assert.truthy(s:find("… %(195 more%)}$"), s:sub(-80))
  end)
end)
