-- The checkout's own scripts: scripts/run-specs (its last line "N passed, M failed" and its exit
-- status) and scripts/k3 (a script with arguments from any directory, a chunk, the REPL fed
-- through a pipe). Each runs the real script on temporary files in a mktemp directory.
local k3 = require "k3"
local H = require "spec.helpers"

local root = H.root()
local sh = H.sh

local function mktemp_dir()
  local out, code = sh("mktemp -d /tmp/k3-scripts-spec-XXXXXX")
  assert(code == 0, out)
  return (out:gsub("%s+$", ""))
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

-- A fresh mktemp directory for each test of the enclosing describe, removed after it; set(dir)
-- receives it before each test (and before the describe's own before_each hooks).
local function temp_dir_each(set)
  local d
  before_each(function()
    d = mktemp_dir()
    set(d)
  end)
  after_each(function()
    if d and d:match("^/tmp/k3%-scripts%-spec%-") then sh("rm -rf '" .. d .. "'") end
  end)
end

local function last_line(out)
  return out:gsub("%s+$", ""):match("([^\n]*)$")
end

describe("scripts/run-specs", function()
  local dir
  temp_dir_each(function(d) dir = d end)

  local function run_specs(name, text)
    write(dir .. "/" .. name, text)
    return sh(("%q %q"):format(root .. "/scripts/run-specs", dir .. "/" .. name))
  end

  it("ends with '1 passed, 1 failed' and exits non-zero when one of two specs fails", function()
    local out, code = run_specs("one_fails_spec.lua", [[
describe("t", function()
  it("passes", function() assert.equal(1, 1) end)
  it("fails", function() assert.equal(1, 2) end)
end)
]])
    assert.equal("1 passed, 1 failed", last_line(out), out)
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("\nnot ok 2 - t fails\n", 1, true), out) -- the TAP stream comes first
  end)

  it("ends with '2 passed, 0 failed' and exits 0 when every spec passes", function()
    local out, code = run_specs("all_pass_spec.lua", [[
describe("t", function()
  it("passes", function() assert.is_true(true) end)
  it("passes too", function() assert.equal("k3", "k3") end)
end)
]])
    assert.equal("2 passed, 0 failed", last_line(out), out)
    assert.equal(0, code, out)
  end)

  it("counts pending specs as skipped, and they do not fail the run", function()
    local out, code = run_specs("skips_spec.lua", [[
describe("t", function()
  it("passes", function() end)
  it("waits", function() pending("not here") end)
end)
]])
    assert.equal("1 passed, 0 failed, 1 skipped", last_line(out), out)
    assert.equal(0, code, out)
    -- the TAP skip line keeps the test's name, with the reason as the SKIP directive
    assert.truthy(out:find("\nok 2 - t waits # SKIP not here\n", 1, true), out)
  end)

  it("a pending describe (a GPU spec without a device) is named in its skip line", function()
    local out, code = run_specs("gpu_skip_spec.lua", [[
describe("cuda things #gpu", function()
  require("busted").pending("no CUDA device: none here")
end)
describe("cpu things", function() it("run", function() end) end)
]])
    assert.equal("1 passed, 0 failed, 1 skipped", last_line(out), out)
    assert.truthy(("\n" .. out):find("\nok 1 - cuda things #gpu # SKIP no CUDA device: none here\n", 1, true), out)
    assert.equal(0, code, out)
  end)

  it("a spec file that does not load counts as a failure and exits non-zero", function()
    local out, code = run_specs("broken_spec.lua", "describe('t', function()\n")
    assert.equal("0 passed, 1 failed", last_line(out), out)
    assert.are_not.equal(0, code, out)
  end)
end)

describe("scripts/k3", function()
  local dir
  temp_dir_each(function(d) dir = d end)
  local k3sh = root .. "/scripts/k3"

  it("--help and -h print k3's usage, not the interpreter's", function()
    for _, flag in ipairs({"--help", "-h"}) do
      local out, code = sh(("cd / && %q %s"):format(k3sh, flag))
      assert.equal(0, code, out)
      assert.truthy(out:find("^usage: scripts/k3 %[file%.lua"), out)
      assert.truthy(out:find("--nproc N file.lua args", 1, true), out)
      assert.is_nil(out:find("lua5.4: ", 1, true), out)
    end
  end)

  it("runs a script from any directory with its arguments in arg and ...", function()
    write(dir .. "/args.lua", [[io.write(arg[1], " ", arg[2], " ", select("#", ...), "\n")]])
    local out, code = sh(("cd / && %q %q a b"):format(k3sh, dir .. "/args.lua"))
    assert.equal(0, code, out)
    assert.equal("a b 2\n", out)
  end)

  it("makes k3 a global in a script, also when called through a symlink", function()
    write(dir .. "/global.lua", [[print(k3.version, k3.zeros({2}):numel())]])
    assert(select(2, sh(("ln -s %q %q"):format(k3sh, dir .. "/k3-link"))) == 0)
    local out, code = sh(("cd / && %q %q"):format(dir .. "/k3-link", dir .. "/global.lua"))
    assert.equal(0, code, out)
    assert.equal(k3.version .. "\t2\n", out)
  end)

  it("runs a chunk with -e", function()
    local out, code = sh(("cd / && %q -e 'print(k3.ones({3}):numel())'"):format(k3sh))
    assert.equal(0, code, out)
    assert.equal("3\n", out)
  end)

  -- With stdin a pipe, lua5.4 -i still runs its REPL: it prints its banner and k3's, then a
  -- "> " prompt per line (readline echoing the line it read), each result, and a last prompt
  -- at end of input; it exits 0, also after a line that raised (reported on stderr).
  -- A result is a line of its own, or follows a prompt where the line read is not echoed.
  local function has_line(out, want)
    for line in out:gmatch("[^\n]*") do
      if line == want or line == "> " .. want then return true end
    end
    return false
  end

  it("the REPL reads stdin when it is not a terminal; statements and expressions print", function()
    local out, code = sh(("cd / && printf 'print(k3.zeros({2}):numel())\\nk3.ones({5}):numel()\\n' | %q")
                           :format(k3sh))
    assert.equal(0, code, out)
    assert.truthy(out:find("\nk3 " .. k3.version .. ": ", 1, true), out) -- k3's banner line
    assert.is_true(has_line(out, "2"), out)
    assert.is_true(has_line(out, "5"), out)
  end)

  it("the REPL goes on after a line that raises and still exits 0", function()
    local out, code = sh(("printf 'error(\"boom\")\\nprint(40 + 2)\\n' | %q"):format(k3sh))
    assert.equal(0, code, out)
    assert.truthy(out:find("stdin:1: boom", 1, true), out)
    assert.is_true(has_line(out, "42"), out)
  end)
end)

-- scripts/fuzz-smoke with stand-in fuzz binaries that record the arguments they get (the real
-- libFuzzer targets need clang's build; `make fuzz-smoke` runs them): the CI run must be
-- deterministic, the explore run must not be.
describe("scripts/fuzz-smoke", function()
  local dir
  temp_dir_each(function(d) dir = d end)
  before_each(function()
    for _, t in ipairs({"tensor", "ops", "safetensors"}) do
      write(dir .. "/fuzz_" .. t, "#!/bin/sh\necho \"$@\" >> '" .. dir .. "/args." .. t ..
        "'\necho 'stat::number_of_executed_units: 7' >&2\nexit ${FAKE_FUZZ_RC:-0}\n")
      sh("chmod +x '" .. dir .. "/fuzz_" .. t .. "'")
    end
  end)

  local function args(t)
    local f = assert(io.open(dir .. "/args." .. t))
    local s = f:read("a")
    f:close()
    return s
  end

  local function fuzz(env, flags)
    return sh(("FUZZ_BUILD=%q FUZZ_ARTIFACTS=%q %s %q %s"):format(dir, dir .. "/art", env or "",
      root .. "/scripts/fuzz-smoke", flags or ""))
  end

  it("by default gives every target a fixed seed, a fixed input count and no reload or time limit", function()
    local out, code = fuzz()
    assert.equal(0, code, out)
    assert.equal("3 passed, 0 failed", last_line(out))
    local want = {tensor = 30000, ops = 200000, safetensors = 300000}
    for t, runs in pairs(want) do
      local a = args(t)
      assert.truthy(a:find("-seed=1 -runs=" .. runs .. " -reload=0", 1, true), a)
      assert.falsy(a:find("max_total_time", 1, true), a)
      assert.truthy(a:find("spec/fuzz/corpus/" .. t, 1, true), a)
    end
    assert.truthy(out:find("fuzz ops: ok (7 inputs, seed 1)", 1, true), out)
  end)

  it("FUZZ_SEED and FUZZ_RUNS replace the fixed values; the same values give the same arguments", function()
    fuzz("FUZZ_SEED=9 FUZZ_RUNS=5", "ops")
    fuzz("FUZZ_SEED=9 FUZZ_RUNS=5", "ops")
    local lines = {}
    for l in args("ops"):gmatch("[^\n]+") do lines[#lines + 1] = l:gsub("/tmp/tmp%.%w+/", "") end
    assert.equal(2, #lines)
    assert.truthy(lines[1]:find("-seed=9 -runs=5 -reload=0", 1, true), lines[1])
    assert.equal(lines[1], lines[2])
  end)

  it("--explore runs for FUZZ_TIME seconds with libFuzzer's own seed and keeps its inputs", function()
    local out, code = fuzz("FUZZ_TIME=3", "--explore tensor")
    assert.equal(0, code, out)
    local a = args("tensor")
    assert.truthy(a:find("-max_total_time=3", 1, true), a)
    assert.falsy(a:find("-seed=", 1, true), a)
    assert.truthy(a:find(dir .. "/explore/tensor", 1, true), a)
  end)

  it("a target that reports a finding fails the run and is counted", function()
    local out, code = fuzz("FAKE_FUZZ_RC=77", "ops tensor")
    assert.are_not.equal(0, code)
    assert.equal("0 passed, 2 failed", last_line(out))
    assert.truthy(out:find("fuzz ops: FAILED (exit 77, seed 1)", 1, true), out)
  end)
end)

describe("scripts/demo.lua", function()
  it("scripts/demo.lua checks --device with the other options, before generating any weight", function()
    for dev, msg in pairs({tpu = "demo: --device: unknown device 'tpu'; expected cpu, cuda or cuda:N\n",
                           ["cuda:x"] = "demo: --device: unknown device 'cuda:x'; expected cpu, cuda or cuda:N\n"}) do
      local out, code = sh(string.format("cd %q && env K3_PROGRESS=plain scripts/k3 scripts/demo.lua --device %s 2>&1",
                                         root, dev))
      assert.equal(2, code, out)
      assert.equal(msg, out:sub(1, #msg), out)
      assert.truthy(out:find("\nusage: scripts/k3 scripts/demo.lua", 1, true), out)
      assert.is_nil(out:find("generating weights", 1, true), out)
    end
    if not k3.backends().cuda.available then
      local out, code = sh(string.format("cd %q && scripts/k3 scripts/demo.lua --device cuda:1 2>&1", root))
      assert.equal(2, code, out)
      assert.truthy(out:find("^demo: %-%-device: device cuda:1 is not available: "), out)
    end
  end)

  it("scripts/demo.lua logs plain progress lines to a file, and none with K3_PROGRESS=0", function()
    local err = os.tmpname()
    -- K3_PROGRESS is set for the script only (unset: chosen from the stream).
    local function demo(setting)
      local _, code = sh(string.format("(cd %q && %s scripts/k3 scripts/demo.lua --m 1,2 --steps 2 2>%s >/dev/null)",
                                       root, setting and "env K3_PROGRESS=" .. setting or "env -u K3_PROGRESS", err))
      assert.equal(0, code)
      local f = io.open(err)
      local text = f:read("a")
      f:close()
      return text
    end
    local text = demo(nil)
    assert.is_nil(text:find("[\r\27]"), text)
    assert.truthy(text:find("^generating weights "), text)
    -- On a CUDA device the demo also runs the step as a graph, after the eager steps.
    assert.truthy(text:find(k3.backends().cuda.available and "\nM=2  graph step 2/2\n$"
                            or "\nM=2  step 2/2\n$"), text)
    assert.equal("", demo("0"))
    assert.truthy(demo("1"):find("\r\27[K", 1, true))
    os.remove(err)
  end)

  -- Runs demo.lua with args: it must exit with `code` and print `text`; returns its output.
  local function demo_refuses(args, code, text)
    local out, got = H.sh(string.format("%q %q ", root .. "/scripts/k3", root .. "/scripts/demo.lua") .. args)
    assert.equal(code, got, out)
    assert.truthy(out:find(text, 1, true), out)
    return out
  end

  it("demo.lua: an empty --m item and a backwards range are named", function()
    demo_refuses("--m 1,,2", 2, "demo: --m: empty item in '1,,2'")
    demo_refuses("--m 3-1", 2, "demo: --m: range '3-1' runs backwards (write 1-3)")
    demo_refuses("--help", 0, "--tp N")
  end)

  it("demo.lua: an M outside the README's 1..16 is refused at once, also as a range end and with --tp", function()
    local t0 = os.time()
    demo_refuses("--m 17", 2, "demo: --m: batch sizes must be in 1..16; got 17 in '17'")
    demo_refuses("--m 100000", 2, "demo: --m: batch sizes must be in 1..16; got 100000 in '100000'")
    demo_refuses("--m 1-100000", 2, "demo: --m: batch sizes must be in 1..16; got 100000 in '1-100000'")
    demo_refuses("--m 4,99999999999999999999", 2,
                 "demo: --m: batch sizes must be in 1..16; got 99999999999999999999 in '4,99999999999999999999'")
    local out = demo_refuses("--tp 2 --m 1,17", 2, "demo: --m: batch sizes must be in 1..16; got 17 in '1,17'")
    assert.truthy(out:find("usage: scripts/k3 scripts/demo.lua --tp N", 1, true), out)
    assert.is_nil(out:find("generating weights", 1, true), out)
    assert.is_true(os.time() - t0 < 60, "the refusals took " .. (os.time() - t0) .. " s")
  end)

  it("demo.lua: a bad --m, --steps, --seed or --weights value is echoed in its message", function()
    demo_refuses("--m 2,0", 2, "demo: --m: batch sizes must be in 1..16; got 0 in '2,0'")
    demo_refuses("--steps abc", 2, "demo: --steps must be a positive integer; got 'abc'")
    demo_refuses("--seed 1.5", 2, "demo: --seed must be an integer; got '1.5'")
    -- the tensor-parallel demo's options, checked before it looks for GPUs
    demo_refuses("--tp x", 2, "demo: --tp needs a positive integer; got 'x'")
    demo_refuses("--tp 2 --steps 0", 2, "demo: --steps must be a positive integer; got '0'")
    demo_refuses("--tp 2 --timeout -1", 2, "demo: --timeout must be a number of seconds > 0; got '-1'")
    demo_refuses("--tp 2 --weight-sets 1.5", 2, "demo: --weight-sets must be a positive integer; got '1.5'")
    local missing = os.tmpname()
    os.remove(missing)
    local out = demo_refuses(string.format("--weights %q", missing), 1, missing)
    assert.truthy(out:find("^demo: %-%-weights: "), out)
    assert.is_nil(out:find("%.lua:%d+:"), out)
  end)

  it("demo.lua --tp N without N CUDA devices says so in one line before starting any rank", function()
    -- The backend as scripts/k3 sees it (under make test-asan this process loads another build).
    local k3sh = string.format("%q ", root .. "/scripts/k3")
    local info = H.sh(k3sh .. [[-e 'local c = k3.backends().cuda; io.write(tostring(c.available), "\t", tostring(c.devices or 0), "\t", tostring(c.reason))']])
    local avail, devices, reason = info:match("^(%a+)\t(%d+)\t(.*)$")
    local cuda = {available = avail == "true", devices = tonumber(devices), reason = reason}
    local n = math.max(2, (cuda.available and cuda.devices or 0) + 1)
    local out, code = H.sh(string.format("%s%q --tp %d", k3sh, root .. "/scripts/demo.lua", n))
    assert.equal(1, code, out)
    local want = cuda.available
      and string.format("demo: --tp %d needs %d CUDA devices; this machine has %d\n", n, n, n - 1)
      or string.format("demo: --tp %d needs %d CUDA devices; the CUDA backend is not available: %s\n",
                       n, n, tostring(cuda.reason))
    assert.equal(want, out)
  end)
end)

describe("scripts/tune-linear", function()
  it("refuses a step it does not know by name, exiting non-zero before it runs or writes anything", function()
    local dir = mktemp_dir()
    local out, code = sh(("OUT=%q %q epilog"):format(dir .. "/out", root .. "/scripts/tune-linear"))
    local made = io.open(dir .. "/out", "r")
    if made then made:close() end
    sh("rm -rf '" .. dir .. "'")
    assert.are.equal(2, code, out)
    assert.are.equal("tune-linear: unknown step 'epilog' (expected autotune, epilogue, bench or all)\n", out)
    assert.is_nil(made, "the step's output directory was made")
  end)
end)

-- scripts/step-trace.lua's report on a trace written here: one graph launched five times (the
-- first three dropped as warm-up), each launch a chain of four kernels whose times are chosen so
-- every figure of the report is known; and the errors of both halves, which stop before any GPU
-- work.
describe("scripts/step-trace.lua", function()
  local dir = mktemp_dir()
  -- the tracer's CSV header (tools/kernel_trace.cpp)
  local HEADER = "graph_id,graph_node_id,correlation_id,start_ns,end_ns,grid,block,cluster,registers,shared_bytes,name"
  local function report(...)
    local args = table.concat({...}, " ")
    return sh("cd '" .. root .. "' && scripts/k3 scripts/step-trace.lua report " .. args)
  end
  -- kernel i of launch c: starts 1 µs before the previous one ends (PDL), lasts dur[i] µs
  local names = {"k3_skinny_kernel<512; 16; 4; 1; false; 2>", "(anonymous namespace)::rms_norm_kernel<k3c_bf16; 8>",
                 "k3_skinny_kernel<512; 16; 4; 1; false; 2>", "(anonymous namespace)::copy_kernel<k3c_bf16; k3c_bf16>"}
  local dur = {10, 3, 10, 2}
  local function trace(path, launches, drop_last)
    local lines = {HEADER,
                   "0,0,1,100,900,4,256,0,32,0,(anonymous namespace)::fill_kernel<float>"}
    local t = 10000
    for c = 1, launches do
      for i = 1, #names do
        if not (drop_last and c == launches and i == #names) then
          local s = t - 1000
          local e = s + dur[i] * 1000
          lines[#lines + 1] = string.format("7,%d,%d,%d,%d,%d,256,1,64,1024,%s", i, 40 + c, s, e,
                                            i == 2 and 1 or 132, names[i])
          t = e
        end
      end
      t = t + 5000
    end
    write(path, table.concat(lines, "\n") .. "\n")
  end
  local run_json = dir .. "/run.json"
  write(run_json, '{"config":"kimi-k3-tp8","M":1,"kernels":4,"step_us":23.5,"replays":2,"warmup":3,' ..
                  '"layers":2,"layer_linear_calls":["2112x7168 cuda.linear.skinny"]}\n')
  write(dir .. "/untraced.json", '{"step_us":23.0}\n')

  it("report: per launch kind its calls, duration, start against the previous end and how far it moves the end", function()
    trace(dir .. "/k.csv", 5)
    local out, code = report(dir .. "/k.csv", run_json, dir .. "/untraced.json")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("4 kernels a step, 2 replays traced (first 3 dropped)", 1, true), out)
    -- span: 10 + 3 + 10 + 2 µs less three 1 µs overlaps
    assert.truthy(out:find("median: 22.0 µs", 1, true), out)
    assert.truthy(out:find("23.0 µs (the trace adds 2.2%)", 1, true), out)
    -- the two skinny launches share a kind: 2 calls, 10 µs; the second starts 1 µs early (the
    -- first, the step's first kernel, has no previous one); they move the end 10 and 9 µs
    assert.truthy(out:find("2     10.00           -1.00       9.50      19.0  86.4%", 1, true), out)
    assert.truthy(out:find("1      3.00           -1.00       2.00       2.0   9.1%", 1, true), out)
    assert.truthy(out:find("rms_norm_kernel<k3c_bf16; 8> [1 x 256]", 1, true), out)
    assert.falsy(out:find("fill_kernel", 1, true), "a kernel outside the graph is not reported")
    assert.truthy(out:find("a layer's linear calls in order: 2112x7168 cuda.linear.skinny", 1, true), out)
    assert.truthy(out:find("kernels 1..4 of the last replay", 1, true), out)
  end)

  -- A graph that is not a chain: per launch a head kernel (its kind only the step's first kernel,
  -- so no start against a previous end), then two kernels on parallel branches whose names agree
  -- in their first 60 characters; the one that starts last ends first, so the step's span is
  -- the latest end less the first start (14 µs), which the kernels' moves of the end add up to.
  it("report: parallel branches, names alike in their first characters, a kind only the first kernel has", function()
    local long = "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8_"
    local rows = {HEADER}
    for c = 1, 5 do
      local t = c * 100000
      for _, k in ipairs({{1, 0, 4, "head_kernel"}, {2, 4, 14, long .. "splitk"}, {3, 5, 9, long .. "streamk"}}) do
        rows[#rows + 1] = string.format("9,%d,%d,%d,%d,132,256,1,64,0,%s", k[1], 60 + c, t + k[2] * 1000,
                                        t + k[3] * 1000, k[4])
      end
    end
    write(dir .. "/par.csv", table.concat(rows, "\n") .. "\n")
    local out, code = report(dir .. "/par.csv", run_json)
    assert.are.equal(0, code, out)
    assert.truthy(out:find("3 kernels a step, 2 replays traced (first 3 dropped)", 1, true), out)
    assert.truthy(out:find("median: 14.0 µs", 1, true), out)
    assert.is_nil(out:find("nan", 1, true), out)
    assert.truthy(out:find("1      4.00               -       4.00       4.0  28.6%", 1, true), out)
    assert.truthy(out:find("1     10.00            0.00      10.00      10.0  71.4%", 1, true), out)
    assert.truthy(out:find("1      4.00           -9.00       0.00       0.0   0.0%", 1, true), out)
    assert.truthy(out:find(long .. "splitk [132 x 256]", 1, true), out)
    assert.truthy(out:find(long .. "streamk [132 x 256]", 1, true), out)
  end)

  it("report: a replay with another kernel count, a missing or foreign file are errors that say so", function()
    trace(dir .. "/short.csv", 5, true)
    local out, code = report(dir .. "/short.csv", run_json)
    assert.are.equal(2, code, out)
    assert.truthy(out:find("step-trace: launch 5 of the step's graph has 3 kernels, launch 4 has 4", 1, true), out)
    out, code = report(dir .. "/none.csv", run_json)
    assert.are.equal(2, code, out)
    assert.truthy(out:find("step-trace: no trace " .. dir .. "/none.csv", 1, true), out)
    write(dir .. "/foreign.csv", "a,b\n1,2\n")
    out, code = report(dir .. "/foreign.csv", run_json)
    assert.are.equal(2, code, out)
    assert.truthy(out:find("foreign.csv: not a kernel-trace CSV", 1, true), out)
    write(dir .. "/nograph.csv", HEADER .. "\n" ..
                                 "0,0,1,100,900,4,256,0,32,0,k\n")
    out, code = report(dir .. "/nograph.csv", run_json)
    assert.are.equal(2, code, out)
    assert.truthy(out:find("nograph.csv: no graph kernels recorded", 1, true), out)
  end)

  it("run: options are checked before any GPU work; an unknown mode names the usage", function()
    local cases = {
      {"run --m 0", "step-trace: --m must be 1..64; got 0"},
      {"run --m x", "step-trace: --m takes a token count"},
      {"run --replays 0", "step-trace: --replays must be >= 1; got 0"},
      {"run --tokens 4", "step-trace: unknown option --tokens"},
      {"trace", "step-trace: usage: step-trace.lua run|report ... (scripts/step-trace runs both)"},
      {"report only-one.csv", "step-trace: usage: step-trace.lua report TRACE.csv RUN.json [UNTRACED.json]"},
    }
    for _, c in ipairs(cases) do
      local out, code = sh("cd '" .. root .. "' && scripts/k3 scripts/step-trace.lua " .. c[1])
      assert.are.equal(2, code, c[1] .. ": " .. out)
      assert.are.equal(c[2] .. "\n", out, c[1])
    end
  end)
end)

-- scripts/gpu-env, sourced in a stand-in checkout: a .gpu/root with an executable lua5.4 (what
-- scripts/gpu-check unpacks) and, or not, a .gpu/commit.
describe("scripts/gpu-env", function()
  local dir
  temp_dir_each(function(d) dir = d end)
  before_each(function() sh("mkdir -p '" .. dir .. "/.gpu/root/usr/bin'") end)

  local function source(env, after)
    return sh(("cd %q && %s bash -c '. %q && %s' 2>&1"):format(dir, env or "",
      root .. "/scripts/gpu-env", after))
  end

  it("refuses, naming scripts/gpu-check, where .gpu/root is not unpacked", function()
    local out, code = source("", "echo sourced")
    assert.are_not.equal(0, code)
    assert.truthy(out:find("run scripts/gpu-check first", 1, true), out)
    assert.falsy(out:find("sourced", 1, true), out)
  end)

  it("exports the build's environment from .gpu/root and K3_COMMIT from .gpu/commit", function()
    write(dir .. "/.gpu/root/usr/bin/lua5.4", "#!/bin/sh\n")
    sh("chmod +x '" .. dir .. "/.gpu/root/usr/bin/lua5.4'")
    write(dir .. "/.gpu/commit", "abc1234\n")
    local out, code = source("K3_COMMIT=", 'echo "$K3_LUA|$K3_COMMIT|$OPT|${_k3g_root:-unset}"')
    assert.equal(0, code, out)
    local real = (sh("cd '" .. dir .. "' && pwd -P")):gsub("%s+$", "")
    local lua, commit, opt, tmp = out:gsub("%s+$", ""):match("^([^|]*)|([^|]*)|([^|]*)|([^|]*)$")
    assert.truthy(lua == dir .. "/.gpu/root/usr/bin/lua5.4" or lua == real .. "/.gpu/root/usr/bin/lua5.4", out)
    assert.equal("abc1234", commit)
    assert.equal("-O2 -Wno-error", opt)
    assert.equal("unset", tmp)
    -- an exported K3_COMMIT is left as it is
    out, code = source("K3_COMMIT=feed123", 'echo "$K3_COMMIT"')
    assert.equal(0, code, out)
    assert.equal("feed123", (out:gsub("%s+$", "")))
  end)
end)

-- scripts/ncu-stalls on a CSV in the shape `ncu --import R --csv --page source --print-source
-- sass` writes: a "Kernel Name" line, the column header, one row per SASS instruction; each
-- launch's page printed twice in a row, as ncu does.
describe("scripts/ncu-stalls", function()
  local dir
  temp_dir_each(function(d) dir = d end)
  local have_python = select(2, sh("command -v python3")) == 0

  local hdr = '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",' ..
    '"Instructions Executed","stall_barrier","stall_wait","stall_no_inst","stall_wait (Not Issued)"\n'
  local function page(kernel, rows)
    local t = {'"Kernel Name","' .. kernel .. '",\n', hdr}
    for _, r in ipairs(rows) do
      t[#t + 1] = string.format('"0x7f00%04x","      %s","%d","%d","%d","%d","%d","%d","0"\n',
        r[1], r[2], r[3], r[3], r[4], r[5], r[6], r[7])
    end
    return table.concat(t)
  end
  -- {address, SASS, samples, executions, barrier, wait, no_inst}
  local first = page("void k<9>(p)", {{0x10, "LDC R1, c[0x0][0x28]", 5, 28, 0, 0, 5},
                                      {0x20, "BAR.SYNC 0x0", 9, 28, 9, 0, 0},
                                      {0x30, "FFMA R2, R3, R4, R2", 2, 56, 0, 2, 0},
                                      {0x40, "@P0 BRA 0x7f000010", 0, 0, 0, 0, 0}})
  local second = page("void k<9>(p)", {{0x10, "LDC R1, c[0x0][0x28]", 1, 28, 0, 0, 1},
                                       {0x30, "FFMA R2, R3, R4, R2", 7, 56, 0, 7, 0}})
  local other = page("void other(q)", {{0x10, "EXIT", 3, 4, 0, 3, 0}})

  local function run(flags)
    local csv = dir .. "/src.csv"
    write(csv, first .. first .. other .. other .. second .. second)
    return sh(root .. "/scripts/ncu-stalls --csv '" .. csv .. "' " .. flags)
  end

  it("reports a launch's samples by reason and its instructions by samples, each launch once", function()
    if not have_python then pending("python3 not found"); return end
    local out, code = run("--kernel 'k<' --top 2")
    assert.equal(0, code, out)
    assert.truthy(out:find("kernel: void k<9>(p) (launch 1 of 2 matching)", 1, true), out)
    assert.truthy(out:find("executed: 3 SASS instructions, 112 warp-instructions; 16 stall samples", 1, true), out)
    assert.truthy(out:find("samples by reason: barrier 9 (56%), no_inst 5 (31%), wait 2 (12%)", 1, true), out)
    local top = out:match("SASS%):\n(.-)\n*$")
    assert.truthy(top:find("^%s*000020%s+28%s+9%s+barrier:9%s+BAR.SYNC 0x0\n%s*000010%s+28%s+5%s+no_inst:5%s+LDC R1"), top)
    out, code = run("--kernel 'k<' --launch 2 --windows 1")
    assert.equal(0, code, out)
    assert.truthy(out:find("(launch 2 of 2 matching)", 1, true), out)
    assert.truthy(out:find("8 stall samples", 1, true), out)
    assert.truthy(out:find("000030     7      8  FFMA:1", 1, true), out)
  end)

  it("refuses a launch that is not there and a report it cannot read, naming them", function()
    if not have_python then pending("python3 not found"); return end
    local out, code = run("--kernel 'k<' --launch 3")
    assert.equal(2, code, out)
    assert.truthy(out:find("--launch 3: the report has 2 matching launch(es)", 1, true), out)
    out, code = run("--kernel nosuch")
    assert.equal(2, code, out)
    assert.truthy(out:find("no launch's kernel matches 'nosuch' (kernels: void k<9>(p), void other(q))", 1, true), out)
    out, code = sh(root .. "/scripts/ncu-stalls --csv '" .. dir .. "/absent.csv'")
    assert.equal(2, code, out)
    assert.truthy(out:find("cannot read " .. dir .. "/absent.csv", 1, true), out)
  end)
end)
