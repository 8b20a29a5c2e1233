-- Two lua_States in one C host (spec/scripts/two_states.c, built here against this checkout's
-- libk3lua): batch-invariant mode, the policy and k3.stats() belong to each state, so one
-- state's k3.set_batch_invariant, k3.set_policy or k3.stats_reset never reaches the other;
-- C's k3_stats keeps the process-wide totals and k3_batch_invariant the process default.
local H = require "spec.helpers"

local root = H.root()
-- scripts/test-asan points K3_BUILD_DIR at the sanitizer build; link against the same one.
local build = os.getenv("K3_BUILD_DIR") or (root .. "/build")

local sh = H.sh
-- The Lua headers and extra library flags the Makefile takes (scripts/gpu-check exports its
-- own, for a machine whose Lua lives under .gpu/root).
local lua_inc = os.getenv("LUA_INC") or "/usr/include/lua5.4"
local deps_lib = os.getenv("DEPS_LIB") or ""

local exe
local function program()
  if exe then return exe end
  local _, has_cc = sh("command -v cc")
  if has_cc ~= 0 then
    pending("needs cc on PATH")
    return nil
  end
  local dir = (sh("mktemp -d /tmp/k3-states-XXXXXX")):gsub("%s+$", "")
  local path = dir .. "/two_states"
  local out, code = sh(string.format(
    "cc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -I%q -I%s %q -o %q " ..
    "-L%q %s -lk3lua -lk3 -llua5.4 -lm -Wl,-rpath,%q",
    root .. "/lib", lua_inc, root .. "/spec/scripts/two_states.c", path, build, deps_lib, build))
  assert(code == 0, out)
  exe = path
  return exe
end

-- Runs the program with the given steps ({"A:chunk", "B:chunk", "C:command", ...}) and the
-- environment prefix env; returns its output and exit code.
local function run(steps, env)
  local args = {}
  for i, s in ipairs(steps) do args[i] = string.format("%q", s):gsub("%$", "\\$") end
  return sh((env or "") .. " " .. program() .. " " .. table.concat(args, " "))
end

local X = "local x, w = k3.randn({2, 3}), k3.randn({4, 3}) "
local CHOSEN = X .. "return k3.batch_invariant(), k3.explain(\"linear\", x, w).chosen"

describe("two lua_States in one process", function()
  teardown(function()
    if exe and exe:match("^/tmp/k3%-states%-") then sh("rm -rf " .. exe:match("^(.*)/")) end
  end)

  it("k3.set_batch_invariant in one state leaves the other's dispatch alone", function()
    if not program() then return end
    local out, code = run({"B:" .. CHOSEN, "A:k3.set_batch_invariant(true)", "A:" .. CHOSEN,
                           "B:" .. CHOSEN, "C:bi", "C:linear",
                           "A:" .. X .. "return k3.method.low_latency({}):explain(x, w).chosen",
                           "B:" .. X .. "return k3.method.low_latency({}):explain(x, w).chosen"})
    assert.are.equal(0, code, out)
    assert.are.equal(table.concat({
      "B: false\tcpu.linear.blas",
      "A:",
      "A: true\tcpu.linear.batch_invariant",
      "B: false\tcpu.linear.blas",
      "C: 0",
      "C: cpu.linear.blas",
      "A: cpu.linear.batch_invariant",
      "B: cpu.linear.blas",
    }, "\n") .. "\n", out)
  end)

  it("K3_BATCH_INVARIANT=1 is every state's starting mode; each then changes its own", function()
    if not program() then return end
    local out, code = run({"A:k3.set_batch_invariant(false)", "A:" .. CHOSEN, "B:" .. CHOSEN, "C:bi"},
                          "K3_BATCH_INVARIANT=1")
    assert.are.equal(0, code, out)
    assert.are.equal("A:\nA: false\tcpu.linear.blas\nB: true\tcpu.linear.batch_invariant\nC: 1\n", out)
  end)

  it("k3.set_policy is per state and keeps the state's batch-invariant mode", function()
    if not program() then return end
    local out, code = run({
      "A:k3.set_policy{linear = {\"cpu.linear.reference\"}}",
      "A:" .. CHOSEN .. ", k3.policy.linear[1]",
      "B:" .. CHOSEN .. ", k3.policy.linear[1]",
      "B:k3.set_batch_invariant(true); k3.set_policy{on_layout_mismatch = \"fallback\"}; return k3.batch_invariant(), k3.policy.on_layout_mismatch",
      "A:return k3.batch_invariant(), k3.policy.on_layout_mismatch",
    })
    assert.are.equal(0, code, out)
    assert.are.equal(table.concat({
      "A:",
      "A: false\tcpu.linear.reference\tcpu.linear.reference",
      "B: false\tcpu.linear.blas\tcuda.linear.cublas",
      "B: true\tfallback",
      "A: false\terror",
    }, "\n") .. "\n", out)
  end)

  it("k3.stats counts and k3.stats_reset clears one state's calls; k3_stats has the totals", function()
    if not program() then return end
    local show = "local s = k3.stats() local r = {} " ..
      "for k, n in pairs(s.kernels) do r[#r + 1] = k .. \"=\" .. n end table.sort(r) " ..
      "return table.concat(r, \",\")"
    local out, code = run({
      "A:k3.stats_reset() " .. X .. "k3.linear(x, w) k3.linear(x, w)",
      "B:k3.stats_reset() k3.silu_mul(k3.ones({1, 4}))",
      "A:" .. show, "B:" .. show,
      "A:k3.stats_reset()",
      "A:" .. show, "B:" .. show,
      "C:stats",
    })
    assert.are.equal(0, code, out)
    assert.truthy(out:find(table.concat({
      "A:",
      "B:",
      "A: cpu.linear.blas=2",
      "B: cpu.silu_mul.reference=1",
      "A:",
      "A: ",
      "B: cpu.silu_mul.reference=1",
    }, "\n") .. "\n", 1, true), out)
    assert.truthy(out:find("\nC: kernel cpu.linear.blas 2\n", 1, true), out)
    assert.truthy(out:find("\nC: kernel cpu.silu_mul.reference 1\n", 1, true), out)
  end)
end)
