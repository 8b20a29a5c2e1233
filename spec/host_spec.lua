-- The game-loop host (examples/host/host.c) driven as a subprocess: a clean run; an error in
-- frame 3; an endless loop stopped by the instruction budget; allocations past the Lua and
-- tensor caps; two states on two threads matching a single-threaded run bit for bit; the exit
-- status (0 when every frame went as the script's expected_failures says, 3 otherwise, also
-- when --frames stops before a frame the script expects to fail).
-- The host is built by `make host` (part of EMBED_TARGETS); without it every spec is pending.
local H = require "spec.helpers"
local root = H.root()
-- scripts/test-asan points K3_BUILD_DIR at the sanitizer build, which has its own host.
local HOST = (os.getenv("K3_BUILD_DIR") or (root .. "/build")) .. "/examples/host/k3-host"
local SCRIPTS = root .. "/examples/host/scripts/"

local function have_host()
  local f = io.open(HOST, "rb")
  if f then f:close() return true end
  pending("host binary " .. HOST .. " is missing: run `make host` (EMBED_TARGETS) first")
  return false
end

-- Runs the host with `args` under a wall-clock limit (default 120 s), so a host that hangs
-- fails the spec instead of stalling the suite; returns its output (stdout and stderr) and
-- exit code (124 when the limit stopped it).
local function run(args, seconds)
  return H.sh(("timeout -k 5 %d %s %s"):format(seconds or 120, HOST, args))
end

-- Writes `text` to a fresh temporary script; returns its path (the caller removes it).
local function temp_script(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

local function field(out, name, prefix)
  local v = out:match("\n" .. (prefix or "") .. name:gsub("%p", "%%%0") .. ": (%d+)")
  return tonumber(v)
end

local function count(s, pattern)
  return select(2, s:gsub(pattern, ""))
end

describe("k3-host", function()
  it("runs a clean script: every frame, no failures, peak memory and kernel counters", function()
    if not have_host() then return end
    local out, code = run("--frames 6 --script " .. SCRIPTS .. "clean.lua")
    assert.are.equal(0, code, out)
    assert.are.equal(6, field(out, "frames run"), out)
    assert.are.equal(0, field(out, "frames failed"), out)
    assert.are.equal(0, field(out, "unexpected frame results"), out)
    assert.is_true(field(out, "peak Lua memory") > 0, out)
    assert.is_true(field(out, "peak tensor memory") > 0, out)
    assert.truthy(out:find("k3 kernel cpu.linear.[%w_]+: %d+"), out)
    assert.truthy(out:find("k3 kernel cpu.attn_res.reference: %d+"), out)
    assert.falsy(out:find("failed %("), out)
  end)

  it("reports an error in frame 3 with a traceback and runs every frame", function()
    if not have_host() then return end
    local out, code = run("--frames 6 --script " .. SCRIPTS .. "error_in_frame3.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("frame 3 failed %(error%): [^\n]*error_in_frame3.lua:%d+: frame 3 went wrong on purpose\nstack traceback:\n"), out)
    assert.truthy(out:find("in upvalue 'check_frame'", 1, true), out)
    assert.truthy(out:find("in function 'on_frame'", 1, true), out)
    assert.are.equal(1, count(out, "failed %("), out)
    assert.are.equal(6, field(out, "frames run"), out)
    assert.are.equal(1, field(out, "frames failed"), out)
    assert.are.equal(1, field(out, "frames failed as expected"), out)
    assert.are.equal(0, field(out, "unexpected frame results"), out)
  end)

  it("stops an endless loop at the frame's instruction budget, even one under pcall", function()
    if not have_host() then return end
    local out, code = run("--frames 6 --budget 200000 --script " .. SCRIPTS .. "endless_loop.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("frame 2 failed %(budget%): [^\n]*endless_loop.lua:%d+: instruction budget of 200000 exceeded\nstack traceback:\n[^\n]*in upvalue 'spin'"), out)
    assert.truthy(out:find("frame 4 failed %(budget%): [^\n]*instruction budget of 200000 exceeded"), out)
    assert.are.equal(2, count(out, "failed %("), out)
    assert.are.equal(6, field(out, "frames run"), out)
    assert.are.equal(2, field(out, "frames failed"), out)
    assert.are.equal(2, field(out, "frames failed as expected"), out)
  end)

  it("fails only the frames that allocate past the Lua or tensor cap", function()
    if not have_host() then return end
    local out, code = run("--frames 6 --mem-cap 4M --tensor-cap 64M --script " .. SCRIPTS ..
                          "alloc_past_cap.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("frame 2 failed %(memory%): [^\n]*Lua memory cap of 4194304 bytes exceeded %(%d+ bytes live%)\nstack traceback:\n[^\n]*in upvalue 'hoard'"), out)
    assert.truthy(out:find("frame 4 failed %(memory%): tensor cap of 67108864 bytes exceeded %(%d+ bytes in use in %d+ allocations, 67108868 more asked for; the cap counts all of k3's host memory: each tensor's storage plus its handle and storage record, parsed headers, scratch%): [^\n]*empty: out of host memory allocating 67108868 bytes\nstack traceback:\n"), out)
    assert.are.equal(2, count(out, "failed %("), out)
    assert.are.equal(6, field(out, "frames run"), out)
    assert.are.equal(2, field(out, "frames failed"), out)
    assert.are.equal(2, field(out, "frames failed as expected"), out)
    -- The cap bounds live memory: the peak stays within the cap plus the report's headroom.
    assert.is_true(field(out, "peak Lua memory") <= 4 * 2 ^ 20 * 9 / 8 + 256 * 1024, out)
  end)

  it("keeps alloc_past_cap.lua's contract under every cap option: no Lua cap, a large one, no tensor cap, no budget", function()
    if not have_host() then return end
    local S = " --frames 5 --script " .. SCRIPTS .. "alloc_past_cap.lua"
    for _, c in ipairs({
      -- No Lua cap: frame 2 asks string.rep for more than Lua allows, a plain Lua error (and
      -- never hoards until the budget, or with no budget either, the machine runs out).
      {"--mem-cap 0", "frame 2 failed %(error%): [^\n]*alloc_past_cap.lua:%d+: resulting string too large\nstack traceback:\n"},
      {"--mem-cap 0 --budget 0", "frame 2 failed %(error%): [^\n]*alloc_past_cap.lua:%d+: resulting string too large\n"},
      -- A cap the hoard reaches well within the default instruction budget.
      {"--mem-cap 256M", "frame 2 failed %(memory%): [^\n]*Lua memory cap of 268435456 bytes exceeded %(%d+ bytes live%)\n"},
      {"--mem-cap 4M --budget 0", "frame 2 failed %(memory%): [^\n]*Lua memory cap of 4194304 bytes exceeded %(%d+ bytes live%)\n"},
      {"--mem-cap 4M --tensor-cap 0", "frame 4 failed %(error%): [^\n]*empty: out of host memory allocating %d+ bytes\n"},
    }) do
      local out, code = run(c[1] .. S)
      assert.are.equal(0, code, c[1] .. "\n" .. out)
      assert.truthy(out:find(c[2]), c[1] .. "\n" .. out)
      assert.are.equal(2, field(out, "frames failed"), out)
      assert.are.equal(2, field(out, "frames failed as expected"), out)
      assert.are.equal(0, field(out, "unexpected frame results"), out)
      assert.falsy(out:find("memory cap of 0 bytes", 1, true), out)
    end
  end)

  it("runs two states on two threads at once, matching a single-threaded run bit for bit", function()
    if not have_host() then return end
    local out, code = run("--frames 5 --threads 2 --script " .. SCRIPTS .. "clean.lua")
    assert.are.equal(0, code, out)
    assert.are.equal(5, field(out, "frames run", "%[state 1%] "), out)
    assert.are.equal(5, field(out, "frames run", "%[state 2%] "), out)
    assert.truthy(out:find("threads: state 1 matches the single-threaded run", 1, true), out)
    assert.truthy(out:find("threads: state 2 matches the single-threaded run", 1, true), out)
    assert.truthy(out:find("threads: all states match the single-threaded run bit for bit", 1, true), out)
    local digests = {}
    for d in out:gmatch("digest: (%x+)") do digests[#digests + 1] = d end
    assert.are.equal(3, #digests, out)
    assert.are.equal(digests[1], digests[2])
    assert.are.equal(digests[1], digests[3])
  end)

  it("exits 3 when frames fail that the script does not expect, on one state or on threads", function()
    if not have_host() then return end
    local out, code = run("--frames 3 --budget 1000 --script " .. SCRIPTS .. "clean.lua")
    assert.are.equal(3, code, out)
    assert.are.equal(3, field(out, "frames failed"), out)
    assert.are.equal(0, field(out, "frames failed as expected"), out)
    assert.are.equal(3, field(out, "unexpected frame results"), out)
    out, code = run("--frames 2 --threads 2 --budget 1000 --script " .. SCRIPTS .. "clean.lua")
    assert.are.equal(3, code, out)
    assert.truthy(out:find("threads: all states match the single-threaded run bit for bit", 1, true), out)
  end)

  it("exits 3 when a frame in expected_failures succeeds or fails another way; a malformed table fails the setup", function()
    if not have_host() then return end
    local path = os.tmpname()
    local function script(text)
      local f = assert(io.open(path, "w"))
      f:write(text)
      f:close()
    end
    script('expected_failures = {[2] = "budget", [3] = "error", [4] = "memory", [9] = "error"}\n' ..
           'local n = 0\nfunction on_frame() n = n + 1; if n >= 3 then error("on purpose") end end\n')
    local out, code = run("--frames 4 --script " .. path)
    assert.are.equal(3, code, out)
    assert.truthy(out:find("\nframe 2 was expected to fail (budget) but succeeded\n", 1, true), out)
    assert.truthy(out:find("\nframe 4 was expected to fail (memory) but failed (error)\n", 1, true), out)
    assert.truthy(out:find("\nframe 9 was expected to fail (error) but never ran (--frames 4)\n", 1, true), out)
    assert.are.equal(2, field(out, "frames failed"), out)
    assert.are.equal(1, field(out, "frames failed as expected"), out)
    assert.are.equal(3, field(out, "unexpected frame results"), out)
    for _, c in ipairs({
      {'expected_failures = {[0] = "error"}', "expected_failures: keys must be frame numbers >= 1; got 0"},
      {'expected_failures = {[1] = "oops"}', 'expected_failures[1] must be "error", "budget" or "memory"; got oops'},
      {'expected_failures = "3"', 'expected_failures must be a table {[frame] = "error"|"budget"|"memory"}; got a string value'},
    }) do
      script(c[1] .. "\nfunction on_frame() end\n")
      out, code = run("--frames 1 --script " .. path)
      assert.are.equal(1, code, out)
      assert.truthy(out:find("setup (reading expected_failures) failed (error): " .. c[2], 1, true), out)
    end
    os.remove(path)
  end)

  it("exits 3 when a frame in expected_failures never ran (--frames stops before it), on one state or on threads", function()
    if not have_host() then return end
    local out, code = run("--frames 2 --script " .. SCRIPTS .. "error_in_frame3.lua")
    assert.are.equal(3, code, out)
    assert.are.equal(2, field(out, "frames run"), out)
    assert.are.equal(0, field(out, "frames failed"), out)
    assert.are.equal(0, field(out, "frames failed as expected"), out)
    assert.are.equal(1, field(out, "unexpected frame results"), out)
    assert.truthy(out:find("\nframe 3 was expected to fail (error) but never ran (--frames 2)\n", 1, true), out)
    -- Every frame that never ran is named, in frame order, with the failure it was to have.
    out, code = run("--frames 1 --script " .. SCRIPTS .. "alloc_past_cap.lua")
    assert.are.equal(3, code, out)
    assert.truthy(out:find("\nframe 2 was expected to fail (memory) but never ran (--frames 1)\n" ..
                           "frame 4 was expected to fail (memory) but never ran (--frames 1)\n", 1, true), out)
    assert.are.equal(2, field(out, "unexpected frame results"), out)
    out, code = run("--frames 2 --threads 2 --script " .. SCRIPTS .. "error_in_frame3.lua")
    assert.are.equal(3, code, out)
    assert.truthy(out:find("\n[state 2] frame 3 was expected to fail (error) but never ran (--frames 2)\n", 1, true), out)
    assert.truthy(out:find("threads: all states match the single-threaded run bit for bit", 1, true), out)
    -- Enough frames: the same script exits 0.
    out, code = run("--frames 3 --script " .. SCRIPTS .. "error_in_frame3.lua")
    assert.are.equal(0, code, out)
  end)

  it("turns an error object into text under the frame's budget: a __tostring that loops, fails or hoards is stopped and reported", function()
    if not have_host() then return end
    local path = temp_script([[
expected_failures = {[1] = "budget", [2] = "error", [3] = "error", [4] = "error", [5] = "memory", [6] = "memory"}
local frame = 0
local function raise(tostring_fn) error(setmetatable({}, {__tostring = tostring_fn})) end
function on_frame()
  frame = frame + 1
  if frame == 1 then raise(function() while true do end end) end
  if frame == 2 then raise(function() error("no text for this one") end) end
  if frame == 3 then raise(function() return 42 end) end
  if frame == 4 then raise(function() return "a readable error object" end) end
  if frame == 5 then raise(function() local c = "x" for _ = 1, 16 do c = c .. c end local t = {} for i = 1, math.maxinteger do t[i] = c .. i end end) end
  if frame == 6 then raise(function() local t = {} for i = 1, math.maxinteger do t[i] = ("x"):rep(4096) .. i end end) end
end
]])
    local out, code = run("--frames 7 --budget 100000 --mem-cap 4M --script " .. path, 30)
    os.remove(path)
    assert.are.equal(0, code, out)
    local where = path:gsub("%p", "%%%0")
    assert.truthy(out:find("\nframe 1 failed %(budget%): %(error object is a table value; its __tostring failed: " .. where .. ":6: instruction budget of 100000 exceeded%)\nstack traceback:\n"), out)
    assert.truthy(out:find("\nframe 2 failed %(error%): %(error object is a table value; its __tostring failed: " .. where .. ":7: no text for this one%)\nstack traceback:\n"), out)
    assert.truthy(out:find("\nframe 3 failed (error): (error object is a table value; its __tostring returned a number value)\nstack traceback:\n", 1, true), out)
    assert.truthy(out:find("\nframe 4 failed (error): a readable error object\n", 1, true), out)
    assert.truthy(out:find("\nframe 5 failed %(memory%): %(error object is a table value; its __tostring failed: " .. where .. ":10: Lua memory cap of 4194304 bytes exceeded %(%d+ bytes live%)%)\nstack traceback:\n"), out)
    -- Hoarding through string.rep ends in Lua's own "not enough memory" rather than the cap's
    -- message: still a memory failure of the frame, whoever raised it.
    assert.truthy(out:find("\nframe 6 failed %(memory%): Lua memory cap of 4194304 bytes exceeded %(%d+ bytes live%): %(error object is a table value; its __tostring failed: not enough memory%)\nstack traceback:\n"), out)
    assert.are.equal(7, field(out, "frames run"), out)
    assert.are.equal(6, field(out, "frames failed as expected"), out)
    assert.are.equal(0, field(out, "unexpected frame results"), out)
  end)

  it("holds every Lua thread that runs in a frame to that frame's budget: coroutines made in the main chunk or in the frame, under pcall, many small ones", function()
    if not have_host() then return end
    local path = temp_script([[
expected_failures = {[2] = "budget", [3] = "budget", [4] = "budget", [5] = "budget"}
local frame = 0
local function spin() while true do end end
-- Made by the main chunk, so created under the setup phase's hook.
local from_setup = coroutine.wrap(spin)
local stubborn = coroutine.create(function() while true do pcall(spin) end end)
local generator = coroutine.wrap(function() while true do coroutine.yield(1) end end)
function on_frame()
  frame = frame + 1
  if frame == 2 then from_setup() end
  if frame == 3 then coroutine.resume(stubborn) spin() end
  if frame == 4 then local co = coroutine.wrap(function() while true do pcall(spin) end end) while true do pcall(co) end end
  if frame == 5 then for _ = 1, math.maxinteger do coroutine.wrap(function() for _ = 1, 100 do end end)() end end
  local sum = 0
  for _ = 1, 100 do sum = sum + generator() end
  return sum
end
]])
    for _, setup in ipairs({"", " --setup-budget 0"}) do
      local out, code = run("--frames 6 --budget 200000" .. setup .. " --script " .. path, 30)
      local where = path:gsub("%p", "%%%0")
      assert.are.equal(0, code, setup .. "\n" .. out)
      assert.truthy(out:find("\nframe 2 failed %(budget%): " .. where .. ":10: " .. where .. ":3: instruction budget of 200000 exceeded\nstack traceback:\n"), out)
      for f = 3, 5 do
        assert.truthy(out:find("\nframe " .. f .. " failed %(budget%): " .. where .. ":" .. (8 + f) .. ": instruction budget of 200000 exceeded\nstack traceback:\n"), out)
      end
      assert.are.equal(6, field(out, "frames run"), out)
      assert.are.equal(4, field(out, "frames failed as expected"), out)
      assert.are.equal(0, field(out, "unexpected frame results"), out)
    end
    os.remove(path)
  end)

  it("rejects bad options with a usage message and a non-zero exit, never a crash", function()
    if not have_host() then return end
    local out, code = run("--frames many")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("bad option --frames many (expected an integer >= 0, optionally with a K, M or G suffix)", 1, true), out)
    out, code = run("--threads 65")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("bad option --threads 65 (expected an integer in 1..64)", 1, true), out)
    -- A script path without --script, and a dt that is not a finite number of seconds.
    out, code = run(SCRIPTS .. "clean.lua")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("unexpected argument '" .. SCRIPTS .. "clean.lua' (options only; a script is given as --script FILE)", 1, true), out)
    for _, dt in ipairs{"abc", "nan", "inf", "-1", "0.5x"} do
      out, code = run("--dt " .. dt)
      assert.are.equal(1, code, out)
      assert.truthy(out:find("bad option --dt " .. dt .. " (expected a finite number of seconds >= 0)", 1, true), out)
    end
    -- getopt_long: an unknown option is named, --key=value is taken, a missing value is named
    out, code = run("--bogus")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("k3-host: unknown option --bogus\nusage: k3-host", 1, true), out)
    out, code = run("--bogus=3")
    assert.truthy(out:find("k3-host: unknown option --bogus\n", 1, true), out)
    out, code = run("--frames")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("k3-host: --frames needs a value", 1, true), out)
    out, code = run("--frames=many")
    assert.truthy(out:find("bad option --frames many", 1, true), out)
    out, code = run("--frames=2 --script=" .. SCRIPTS .. "clean.lua")
    assert.are.equal(0, code, out)
    assert.are.equal(2, field(out, "frames run"), out)
    out, code = run("--script /nonexistent/script.lua")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("setup (loading the script) failed (error): cannot open /nonexistent/script.lua", 1, true), out)
  end)
end)

describe("k3-host --tensor-cap and safetensors headers", function()
  it("a 16 MB header is refused under a 40 MB cap before cJSON parses it (no process-wide hooks)", function()
    if not have_host() then return end
    local out, code = run("--frames 2 --budget 0 --setup-budget 0 --mem-cap 0 --tensor-cap 40M --script " ..
                          SCRIPTS .. "big_header.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("frame 1 failed %(memory%): tensor cap of 41943040 bytes exceeded [^\n]*" ..
                           "safetensors_info: [^\n]*: out of memory: parsing the %d+%-byte header takes about %d+ bytes"), out)
    assert.are.equal(1, field(out, "frames failed"), out)
    local hwm = tonumber(out:match("peak resident memory: (%d+) kB"))
    assert.is_not_nil(hwm, out)
    assert.is_true(hwm < 300 * 1024, out) -- the parse was never attempted
  end)
end)
