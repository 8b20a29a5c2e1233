-- The README's k3.explain example runs as written on any machine: on the CPU it explains the
-- CPU decision (the low-latency method declines, the BLAS kernel serves), on a GPU the CUDA one.
local k3 = require "k3"
local H = require "spec.helpers"

local function readme()
  local f = assert(io.open(H.root() .. "/README.md"))
  local s = f:read("a")
  f:close()
  return s
end

describe("README examples", function()
  it("the k3.explain example runs on this machine and prints what its comments say", function()
    local code = readme():match("\n```lua\n(local device = [^\n]*\nlocal x = .-)\n```\n")
    assert.is_not_nil(code, "README's k3.explain example not found")
    local printed = {}
    local env = setmetatable({k3 = k3, print = function(s) printed[#printed + 1] = s end}, {__index = _G})
    assert(load(code, "=README", "t", env))()
    assert.are.equal(2, #printed)
    if k3.backends().cuda.available then
      -- the H200 (sm90) policy has a skinny plan for 1536x7168 at M = 1; other GPUs may not
      local want = k3.cuda_arch(0) == "sm90" and 'chosen = "cuda.linear.skinny", declined = {}' or 'chosen = "cuda.linear.'
      assert.truthy(printed[1]:find(want, 1, true), printed[1])
      assert.truthy(printed[2]:find('chosen = "cuda.linear.cublas", declined = {{kernel = "cuda.linear.skinny", ' ..
                                    'reason = "bias is present', 1, true), printed[2])
    else
      assert.truthy(printed[1]:find('{chosen = "cpu.linear.blas", declined = {{kernel = "cuda.linear.skinny", ' ..
                                    'reason = "plan has no entry for M = 1"}', 1, true), printed[1])
      assert.are.equal(printed[1], printed[2])
    end
  end)
end)

describe("packaging and the scripts' options", function()
  it("the pkg-config files carry no placeholder URL", function()
    for _, name in ipairs({"k3.pc.in", "k3-lua.pc.in"}) do
      local f = assert(io.open(H.root() .. "/" .. name))
      local s = f:read("a")
      f:close()
      assert.is_nil(s:find("example%.invalid"), name)
      local url = s:match("\nURL: ([^\n]*)")
      assert.is_true(url == nil or url:match("^https://[%w.-]+%.%w+/") ~= nil, name .. ": URL " .. tostring(url))
    end
  end)

  it("the package list is the Makefile's and says where luarocks comes from; a Lua host's pkg-config names lua5.4", function()
    local f = assert(io.open(H.root() .. "/Makefile"))
    local pkgs = f:read("a"):match("\nDEB_PKGS = ([^\n]*)")
    f:close()
    local text = readme()
    assert.truthy(text:find("packages `" .. pkgs .. "`", 1, true), pkgs)
    -- the rock's command needs luarocks, which make's dependency step does not install
    assert.truthy(text:find("luarocks --lua-version 5.4 make --local", 1, true))
    assert.is_nil(pkgs:find("luarocks", 1, true))
    assert.truthy(text:find("(`luarocks`, for installing k3 as a rock only, is optional: Debian package `luarocks`)", 1, true))
    -- k3-lua.pc brings no Lua headers: every command that compiles with it names lua5.4 as well
    local api = assert(io.open(H.root() .. "/docs/API.md"))
    for _, doc in ipairs({text, api:read("a")}) do
      for cmd in doc:gmatch("pkg%-config %-%-cflags %-%-libs k3%-lua[^)`]*") do
        assert.truthy(cmd:find(" lua5.4", 1, true), cmd)
      end
    end
    api:close()
    assert.truthy(text:find("$(pkg-config --cflags --libs k3-lua lua5.4)", 1, true))
  end)

  it("k3.cli's tokenizer passes what it does not know to the script, which the README gives as the reason not to use lua-cliargs", function()
    local seen = {}
    for key, value in require("k3.cli").options({"--tp=2", "--m", "1-16", "--bogus", "file.lua"}) do
      seen[#seen + 1] = (key == "--tp" or key == "--m") and (key .. " " .. value()) or key
    end
    assert.are.same({"--tp 2", "--m 1-16", "--bogus", "file.lua"}, seen)
    local ok = pcall(require, "cliargs")
    assert.is_true(ok, "lua-cliargs is installed with busted")
    assert.truthy(readme():find("rather than lua-cliargs (installed with busted), whose model does not fit", 1, true))
  end)
end)
