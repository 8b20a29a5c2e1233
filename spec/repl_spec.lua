-- The REPL (scripts/k3 with no arguments, lua/k3/repl.lua): Tab completion of globals, fields
-- and methods (the candidates, and through a real terminal on the interpreter's readline), no
-- hook where there is no readline, objects printing through __tostring, and the README's REPL
-- session run as written ("…" in it stands for any text, "…reason…" too).
local k3 = require "k3"
local H = require "spec.helpers"
local repl = require "k3.repl"

local root = H.root()
local k3sh = root .. "/scripts/k3"

local function have(cmd) return select(2, H.sh("command -v " .. cmd .. " >/dev/null")) == 0 end

-- Runs `lines` through the REPL with stdin a pipe; returns the transcript (stdout and stderr
-- merged, in order: lua.c flushes both) without terminal control sequences and \r.
local function session(lines)
  local dir = os.tmpname()
  local f = assert(io.open(dir, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  local out, code = H.sh(string.format("cd / && %q < %q", k3sh, dir))
  os.remove(dir)
  return (out:gsub("\27%[[%d;?]*%a", ""):gsub("\r", "")), code
end

describe("repl.complete", function()
  -- The REPL's globals: scripts/k3 makes k3 one.
  local saved
  setup(function() saved = rawget(_G, "k3"); _G.k3 = k3 end)
  teardown(function() _G.k3 = saved end)

  it("completes globals and keywords for a bare word", function()
    assert.same({"print"}, repl.complete("prin"))
    assert.same({"k3"}, repl.complete("k3"))
    assert.same({"repeat", "require", "return"}, repl.complete("re"))
    assert.same({"function"}, repl.complete("functio"))
  end)

  it("completes the fields of a dotted path, k3's read-through policy included", function()
    assert.same({"k3.zeros"}, repl.complete("k3.ze"))
    assert.same({"k3.policy"}, repl.complete("k3.pol"))
    assert.same({"k3.nn.Linear"}, repl.complete("k3.nn.Li"))
    assert.same({"k3.method.default", "k3.method.low_latency"}, repl.complete("k3.method."))
    local all = repl.complete("k3.")
    assert.truthy(#all > 30)
    for _, c in ipairs(all) do assert.truthy(c:match("^k3%.[%a][%w_]*$"), c) end
  end)

  it("completes a tensor's methods after ':' and a layer's through its class", function()
    _G.repl_spec_t = k3.zeros(2, 3)
    local got, methods = repl.complete("repl_spec_t:s"), require("k3.core")._tensor_methods
    local want = {}
    for name in pairs(methods) do
      if name:sub(1, 1) == "s" then want[#want + 1] = "repl_spec_t:" .. name end
    end
    table.sort(want)
    assert.same(want, got) -- every method starting with "s", and nothing else
    for _, m in ipairs({"select", "set", "size", "squeeze", "stride"}) do
      assert.truthy(methods[m], m)
    end
    assert.same({"repl_spec_t:reshape"}, repl.complete("repl_spec_t:resh"))
    assert.same({"repl_spec_t:unsqueeze"}, repl.complete("repl_spec_t:uns"))
    _G.repl_spec_t = k3.nn.Linear(k3.zeros(8, 16))
    assert.same({"repl_spec_t:in_features"}, repl.complete("repl_spec_t:in"))
    assert.same({"repl_spec_t.weight"}, repl.complete("repl_spec_t.we"))
    _G.repl_spec_t = nil
  end)

  it("hides names starting with '_' unless the word asks for them", function()
    for _, c in ipairs(repl.complete("k3.")) do assert.falsy(c:find("k3%._")) end
    assert.same({"_G._VERSION"}, repl.complete("_G._V"))
  end)

  it("offers nothing for unknown paths, odd words and values that raise on indexing", function()
    assert.same({}, repl.complete("no_such_global."))
    assert.same({}, repl.complete("k3..ze"))
    assert.same({}, repl.complete("3.1"))
    assert.same({}, repl.complete(".x"))
    _G.repl_spec_t = setmetatable({}, {__index = function() error("boom") end,
                                       __pairs = function() error("boom") end})
    assert.same({}, repl.complete("repl_spec_t.x."))
    assert.same({}, repl.complete("repl_spec_t."))
    _G.repl_spec_t = nil
  end)
end)

describe("Tab in scripts/k3", function()
  it("completes on the interpreter's readline in a terminal", function()
    if not have("script") then return pending("needs script (util-linux) for a terminal") end
    -- Tab after "k3.ze" completes to k3.zeros, after "t:nu" to t:numel; each line then runs.
    local cmd = string.format("cd / && (printf 'k3.ze\\t(2, 3):numel()\\nt = k3.zeros(4)\\nt:nu\\t()\\n'; " ..
                              "sleep 2) | script -qec %q /dev/null", k3sh)
    local out = H.sh(cmd):gsub("\27%[[%d;?]*%a", ""):gsub("\r", "")
    assert.truthy(out:find("> k3.zeros(2, 3):numel()\n6\n", 1, true), out)
    assert.truthy(out:find("> t:numel()\n4\n", 1, true), out)
  end)

  it("is refused, and nothing changes, where the interpreter has no readline", function()
    if not have("cc") then return pending("needs cc") end
    local inc = os.getenv("LUA_INC") or "/usr/include/lua5.4"
    local dir = os.tmpname()
    os.remove(dir)
    assert(select(2, H.sh("mkdir -p " .. dir)) == 0)
    local f = assert(io.open(dir .. "/host.c", "w"))
    -- A host embedding Lua through liblua5.4 alone: no readline in the process.
    f:write([[
#include <lauxlib.h>
#include <lualib.h>
int main(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  int rc = luaL_dostring(L, "print(require('k3.core')._repl_complete(print))");
  if (rc) puts(lua_tostring(L, -1));
  lua_close(L);
  return rc;
}
]])
    f:close()
    local out, code = H.sh(string.format("cc -I%s %s/host.c -o %s/host %s -llua5.4", inc, dir, dir,
                                         os.getenv("DEPS_LIB") or ""))
    if code ~= 0 then
      H.sh("rm -rf " .. dir)
      return pending("cannot build a Lua host here: " .. out:sub(1, 200))
    end
    out, code = H.sh(string.format("LUA_CPATH=%q %s/host", root .. "/build/lua/?.so", dir))
    H.sh("rm -rf " .. dir)
    assert.equal(0, code, out)
    assert.equal("false\n", out)
  end)

end)

describe("printing in the REPL", function()
  it("shows layers, models and tensors through __tostring, tables through k3.inspect", function()
    local out, code = session({
      "k3.nn.Linear(k3.zeros(8, 16, {dtype = 'bf16'}))",
      "k3.nn.RMSNorm(k3.ones(7168))",
      "k3.nn.SwiGLU(k3.zeros(16, 8), k3.zeros(8, 8))",
      "{k3.nn.Linear(k3.zeros(4, 2)), n = 1}",
      "kimi = require 'k3.model.kimi_k3'",
      "cfg = kimi.config('tiny')",
      "s = kimi.build(cfg, kimi.generate_weights(cfg))",
      "s",
      "s.layers[2]",
      "s:stream(1)",
    })
    assert.equal(0, code, out)
    local want = {
      "> k3.nn.Linear(k3.zeros(8, 16, {dtype = 'bf16'}))\nLinear(16 -> 8, bf16)\n",
      "\nRMSNorm(7168, eps=1e-05, f32)\n",
      "\nSwiGLU(8 -> 8 -> 8)\n",
      "\n{Linear(2 -> 4, f32), n = 1}\n",
      "\nKimiK3(tiny): 16 layers, hidden_size 256, AttnRes block_size 4 (4 sealed blocks), bf16 on cpu\n" ..
      "  each layer: AttnRes read, Attention, AttnRes read, SwiGLU\n" ..
      "    attn.qkv_a   Linear(256 -> 112, bf16)\n" ..
      "    attn.q_b     Linear(64 -> 192, bf16)\n" ..
      "    attn.o_proj  Linear(128 -> 256, bf16)\n" ..
      "    mlp          SwiGLU(256 -> 512 -> 256)\n" ..
      "  final: AttnRes read, RMSNorm(256)\n",
      "\nLayer 1: attn Attention(qkv_a Linear(256 -> 112, bf16), q_b Linear(64 -> 192, bf16), " ..
      "o_proj Linear(128 -> 256, bf16)), mlp SwiGLU(256 -> 512 -> 256)\n",
      "\nAttnResStream(1 token, hidden_size 256, 16 layers, block_size 4, 4 slots, bf16 on cpu)\n",
    }
    for _, w in ipairs(want) do assert.truthy(out:find(w, 1, true), w .. "\nin\n" .. out) end
  end)
end)

-- The README's "A REPL session" block: its "> " lines are fed to scripts/k3 and the
-- transcript must read as the block does. In the block, "…" stands for any text on its line
-- (a "stack traceback: …" also for the traceback's tab-indented lines), the interpreter's
-- own banner line is matched by its "Lua 5.4" start, and k3's banner by its form (CUDA
-- available or not).
describe("the README's REPL session", function()
  local function readme_session()
    local f = assert(io.open(root .. "/README.md"))
    local text = f:read("a")
    f:close()
    local section = text:match("\n## A REPL session\n(.-)\n## ")
    assert(section, "README.md has no '## A REPL session' section")
    local block = section:match("```\n%$ scripts/k3\n(.-)\n```")
    assert(block, "the REPL section has no ``` block starting with '$ scripts/k3'")
    local lines = {}
    for line in (block .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
    return lines
  end

  local function matches(want, got)
    if want:match("^Lua 5%.4") then return got:match("^Lua 5%.4") ~= nil end
    -- k3's banner says whether CUDA is available: either reading fits
    if want:match("^k3 %S+: cuda ") then return got:match("^k3 %S+: cuda .*k3%.help%(%) lists the API%.$") ~= nil end
    local pat = want:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"):gsub("…%w*…", ".*"):gsub(" ?…", ".*")
    pat = "^" .. pat .. "$"
    return got:match(pat) ~= nil
  end

  it("runs as written", function()
    local want = readme_session()
    local inputs = {}
    for _, l in ipairs(want) do
      if l:sub(1, 2) == "> " then inputs[#inputs + 1] = l:sub(3) end
    end
    assert.truthy(#inputs >= 8, "the session has " .. #inputs .. " input lines")
    -- Every k3.<name> and tensor method the session calls must exist in this build.
    local missing, methods = {}, require("k3.core")._tensor_methods
    for _, l in ipairs(inputs) do
      for name in l:gmatch("k3%.([%a_][%w_]*)") do
        if k3[name] == nil then missing[#missing + 1] = "k3." .. name end
      end
      for name in l:gmatch(":([%a_][%w_]*)%(") do
        if methods[name] == nil then missing[#missing + 1] = "t:" .. name end
      end
    end
    assert.same({}, missing)
    local out, code = session(inputs)
    assert.equal(0, code, out)
    local got = {}
    for line in out:gmatch("(.-)\n") do
      if line:sub(1, 1) ~= "\t" then got[#got + 1] = line end -- a traceback's frames
    end
    while got[#got] == ">" or got[#got] == "> " or got[#got] == "" do got[#got] = nil end
    for i = 1, math.max(#want, #got) do
      assert(want[i] and got[i] and matches(want[i], got[i]),
             string.format("line %d: README has\n  %s\nthe REPL printed\n  %s\n(whole transcript:\n%s)",
                           i, tostring(want[i]), tostring(got[i]), out))
    end
  end)
end)
