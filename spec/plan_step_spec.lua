-- k3.plan_step (plan entries measured inside the decode step) and k3.plan_for's use of a step
-- file; scripts/tune-step's options.
local k3 = require "k3"
local H = require "spec.helpers"
local plan_step = require "k3.plan_step"

local A = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16, balanced = true}
local B = {threads = 256, rows = 16, unroll = 4, vec = 8, split_k = 8, rows_per_warp = 16}
local C = {threads = 128, rows = 8, unroll = 4, vec = 8, split_k = 4}

-- A scratch directory on package.path holding k3/policy/<name>.lua with `text`; returns the
-- directory and a function that takes it off package.path and out of package.loaded.
local function scratch_module(name, text)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p '" .. dir .. "/k3/policy'"))
  local f = assert(io.open(dir .. "/k3/policy/" .. name .. ".lua", "w"))
  f:write(text)
  f:close()
  local saved = package.path
  package.path = dir .. "/?.lua;" .. package.path
  return dir, function()
    package.path = saved
    package.loaded["k3.policy." .. name] = nil
    os.execute("rm -rf '" .. dir .. "'")
  end
end

describe("k3.plan_step", function()
  it("overlay: the step's entries replace the plan's at their M, the rest stay, inputs untouched", function()
    local base = {[1] = {kernel = "skinny", config = A, us = 7.1}, [16] = {kernel = "skinny", config = C}}
    local step = {[1] = {kernel = "skinny", config = B, step_us = 7100.5, base_step_us = 7200.25}}
    local out = plan_step.overlay(base, step)
    assert.equal(B, out[1].config)
    assert.equal(7100.5, out[1].step_us)
    assert.equal(C, out[16].config)
    assert.equal(A, base[1].config) -- base unchanged
    assert.is_nil(base[2])
    assert.same({[1] = step[1]}, plan_step.overlay(nil, step))
    assert.equal(base, plan_step.overlay(base, nil))
    assert.is_nil(plan_step.overlay(nil, nil))
  end)

  it("overlay: a cuBLAS entry replaces the plan's skinny entry at its M", function()
    local base = {[1] = {kernel = "skinny", config = A}, [2] = {kernel = "skinny", config = B}}
    local out = plan_step.overlay(base, {[2] = {kernel = plan_step.CUBLAS, step_us = 1, base_step_us = 2}})
    assert.equal(A, out[1].config)
    assert.equal("cuda.linear.cublas", out[2].kernel)
    assert.is_nil(out[2].config)
    assert.is_true(plan_step.is_entry({kernel = "cuda.linear.cublas"}))
    assert.is_false(plan_step.is_entry({kernel = "cuda.linear.cublas", config = A})) -- cuBLAS takes no config
    assert.is_false(plan_step.is_entry({kernel = "skinny"}))
    -- low_latency takes the overlaid plan: the named kernel serves that M
    k3.method.low_latency(out, {static_weights = true}):free()
  end)

  it("overlay refuses an entry that is not a skinny config or cuBLAS, naming its M", function()
    H.raises(function() plan_step.overlay({}, {[4] = {kernel = "cublas"}}) end,
             "plan_step.overlay: entry [4] must be {kernel = \"skinny\", config = {...}} or {kernel = \"cuda.linear.cublas\"}")
    H.raises(function() plan_step.overlay({}, {["4"] = {kernel = "skinny", config = A}}) end,
             "plan_step.overlay: entry [4] must be")
    H.raises(function() plan_step.overlay({}, "x") end, "plan_step.overlay: step entries must be a table; got string")
  end)

  it("compose: each step section serves its own call; the epilogue falls back to the plain file", function()
    local plain = {[1] = {kernel = "skinny", config = A}, [16] = {kernel = "skinny", config = C}}
    local step_plain = {[1] = {kernel = "skinny", config = B, step_us = 1, base_step_us = 2}}
    local step_fused = {[16] = {kernel = "skinny", config = B, step_us = 1, base_step_us = 2}}
    -- a plain call: the step's plain entries over the plain file
    local p = plan_step.compose(plain, nil, step_plain, nil)
    assert.equal(B, p[1].config)
    assert.equal(C, p[16].config)
    -- an epilogue call on a shape the epilogue file did not measure: the plain file's entries,
    -- not the step entries measured for the plain call
    assert.equal(plain, plan_step.compose(plain, nil, nil, "silu_mul"))
    local e = plan_step.compose(plain, nil, step_fused, "silu_mul")
    assert.equal(A, e[1].config)
    assert.equal(B, e[16].config)
    -- the epilogue file measured the shape: its entries, the step's epilogue entries over them
    local fused = {[2] = {kernel = "skinny", config = C}}
    assert.equal(fused, plan_step.compose(plain, fused, nil, "silu_mul"))
    assert.same({[2] = fused[2], [16] = step_fused[16]}, plan_step.compose(plain, fused, step_fused, "silu_mul"))
    -- cuBLAS won at every M there: nil, unless the step kept an entry
    assert.is_nil(plan_step.compose(plain, {}, nil, "silu_mul"))
    assert.same(step_fused, plan_step.compose(plain, {}, step_fused, "silu_mul"))
    assert.is_nil(plan_step.compose(nil, nil, nil, "silu_mul"))
    assert.is_nil(plan_step.compose(nil, nil, nil, nil))
  end)

  it("candidates: the shape's configs by M, then other shapes' at that M, each once, without the current", function()
    local plans = {
      ["2112x7168"] = {[1] = {kernel = "skinny", config = A}, [2] = {kernel = "skinny", config = B},
                       [3] = {kernel = "skinny", config = A}},
      ["1536x7168"] = {[1] = {kernel = "skinny", config = C}},
      ["7168x768"] = {[1] = {kernel = "skinny", config = {threads = 512, rows = 8, unroll = 4, vec = 8, split_k = 16, balanced = true}}},
      ["9x9"] = {[2] = {kernel = "skinny", config = {threads = 64, rows = 8, unroll = 2}}},
    }
    local c = plan_step.candidates(plans, "2112x7168", 1, A)
    assert.same({B, C}, c) -- A is current (and 7168x768's copy of it is the same config)
    assert.same({A, B, C}, plan_step.candidates(plans, "2112x7168", 1, nil))
    assert.same({C, A}, plan_step.candidates(plans, "4096x4096", 1, nil)) -- no entries of its own
    -- further plan tables after the first (an epilogue's file, then the plain one): theirs next,
    -- without repeats
    local fused = {["2112x7168"] = {[1] = {kernel = "skinny", config = C}}}
    assert.same({C, B}, plan_step.candidates(fused, "2112x7168", 1, A, plans))
    assert.equal(plan_step.config_key(A), plan_step.config_key({balanced = true, split_k = 16, vec = 8, unroll = 4, rows = 8, threads = 512}))
  end)

  it("prefetch_variants: the config with each L2 prefetch budget, or without it, skipping its own and repeats", function()
    local v = plan_step.prefetch_variants(A, {8, 0, 16, 8})
    assert.equal(2, #v) -- A has no prefetch: 0 is its own
    assert.equal(8, v[1].l2_prefetch_mb)
    assert.equal(16, v[2].l2_prefetch_mb)
    v[1].l2_prefetch_mb = nil
    assert.same(A, v[1]) -- otherwise A's fields, and A itself untouched
    assert.is_nil(A.l2_prefetch_mb)
    local own = {threads = 256, rows = 8, unroll = 4, vec = 8, l2_prefetch_mb = 16}
    assert.same({{threads = 256, rows = 8, unroll = 4, vec = 8, l2_prefetch_mb = 8}},
                plan_step.prefetch_variants(own, {16, 8}))
    -- 0: the same configuration with the prefetch off
    assert.same({{threads = 256, rows = 8, unroll = 4, vec = 8}, {threads = 256, rows = 8, unroll = 4, vec = 8, l2_prefetch_mb = 32}},
                plan_step.prefetch_variants(own, {0, 32}))
    assert.same({}, plan_step.prefetch_variants(nil, {8})) -- a shape not on the skinny kernel
    H.raises(function() plan_step.prefetch_variants(A, {1.5}) end,
             "plan_step.prefetch_variants: mbs[1] must be an integer in 0..40 (MiB); got float 1.5")
    H.raises(function() plan_step.prefetch_variants(A, {8, 41}) end,
             "plan_step.prefetch_variants: mbs[2] must be an integer in 0..40 (MiB); got integer 41")
    H.raises(function() plan_step.prefetch_variants(nil, {"8"}) end, -- checked whatever cfg is
             "plan_step.prefetch_variants: mbs[1] must be an integer in 0..40 (MiB); got string 8")
    H.raises(function() plan_step.prefetch_variants(A, 8) end,
             "plan_step.prefetch_variants: mbs must be a list of MiB; got number")
    H.raises(function() plan_step.prefetch_variants("t256", {8}) end,
             "plan_step.prefetch_variants: cfg must be a table or nil; got string")
    -- the rendered text puts the budget last, and low_latency takes it
    local text = plan_step.render({arch = "sm90", plans = {["64x64"] = {[1] = {kernel = "skinny", config = own}}}})
    assert.truthy(text:find("vec = 8, l2_prefetch_mb = 16}", 1, true), text)
    k3.method.low_latency(assert(load(text))().plans["64x64"]):free()
  end)

  it("short and parse_short: the benchmarks' short form and back, every config of the plan files", function()
    assert.equal("t512 r8 u4 v8 s16 bal", plan_step.short(A))
    assert.equal("t256 r16 u4 v8 s8 w16", plan_step.short(B))
    assert.equal("t256 r8 u4 v8 s- pf16", plan_step.short({threads = 256, rows = 8, unroll = 4, vec = 8, l2_prefetch_mb = 16}))
    for _, c in ipairs({A, B, C}) do assert.same(c, plan_step.parse_short(plan_step.short(c))) end
    local n = 0
    for _, mod in ipairs({"k3.policy.sm90", "k3.policy.sm90_silu_mul", "k3.policy.sm90_step"}) do
      local file = require(mod)
      for _, section in ipairs({"plans", "silu_mul"}) do
        for key, by_m in pairs(file[section] or {}) do
          for m, e in pairs(by_m) do
            if e.kernel == "skinny" then
              n = n + 1
              local text = plan_step.short(e.config)
              assert.same(e.config, plan_step.parse_short(text), string.format("%s %s M=%d: %s", mod, key, m, text))
            end
          end
        end
      end
    end
    assert.is_true(n > 50, "plan file entries read: " .. n)
    -- any subset in any order; "-", a left-out field and pf0 are the kernel's default
    assert.same({threads = 512, rows = 32, unroll = 4, split_k = 8, rows_per_warp = 16, balanced = true},
                plan_step.parse_short("bal w16 s8 u4 r32 t512"))
    assert.same({threads = 128}, plan_step.parse_short("  t128 v- pf0 w8 "))
    local UNKNOWN = "(expected tN rN uN vN sN wN bal pfN)"
    for _, c in ipairs({
      {"", "expected a config such as 't512 r8 u4 v8 s16'; got ''"},
      {nil, "expected a config such as 't512 r8 u4 v8 s16'; got nil"},
      {"t512 x4", "unknown token 'x4' in 't512 x4' " .. UNKNOWN},
      {"t512 bal2", "unknown token 'bal2' in 't512 bal2' " .. UNKNOWN},
      {"t512 t256", "'t256' repeats threads in 't512 t256'"},
      {"t0", "'t0' in 't0' needs a positive integer"},
      {"r8 u1.5", "'u1.5' in 'r8 u1.5' needs a positive integer"},
      {"t0x200", "'t0x200' in 't0x200' needs a positive integer"},
      {"t1e3", "'t1e3' in 't1e3' needs a positive integer"},
      {"t+5", "'t+5' in 't+5' needs a positive integer"},
      {"s-1", "'s-1' in 's-1' needs a positive integer"},
      {"t", "'t' in 't' needs a positive integer"},
      {"pf8.0", "'pf8.0' in 'pf8.0' needs MiB 0..40"},
      {"t512 pf41", "'pf41' in 't512 pf41' needs MiB 0..40"},
    }) do
      H.raises(function() plan_step.parse_short(c[1]) end, "plan_step.parse_short: " .. c[2])
    end
  end)

  it("decide: kept only when faster by min_gain in every pass; gain is the worst pass's", function()
    local keep, gain = plan_step.decide({{base = 1000, cand = 990}, {base = 1000, cand = 995}}, 0.002)
    assert.is_true(keep)
    assert.near(0.005, gain, 1e-12)
    keep, gain = plan_step.decide({{base = 1000, cand = 990}, {base = 1000, cand = 999}}, 0.002)
    assert.is_false(keep)
    assert.near(0.001, gain, 1e-12)
    keep, gain = plan_step.decide({{base = 1000, cand = 1010}}, 0)
    assert.is_false(keep)
    assert.near(-0.01, gain, 1e-12)
    keep = plan_step.decide({{base = 1000, cand = 1000}, {base = 1000, cand = 990}}, 0)
    assert.is_false(keep) -- a tie in one pass is not faster, even at min_gain 0
    H.raises(function() plan_step.decide({}, 0.002) end, "plan_step.decide: no timing passes")
  end)

  it("render: the text loads back to the same entries, and low_latency takes them", function()
    local t = {arch = "sm90", machine = "NVIDIA H200", date = "2026-12-02 01:00 UTC", commit = "abc1234",
               method = "scripts/tune-step --m 1",
               plans = {["2112x7168"] = {[1] = {kernel = "skinny", config = A, step_us = 7129.04, base_step_us = 7247.1}}},
               silu_mul = {["8448x7168"] = {[16] = {kernel = "skinny", config = C, step_us = 8000, base_step_us = 8100}}}}
    local text = plan_step.render(t)
    assert.truthy(text:find("written by scripts/tune-step", 1, true), text)
    local back = assert(load(text))()
    assert.equal("sm90", back.arch)
    assert.equal("abc1234", back.commit)
    assert.same(A, back.plans["2112x7168"][1].config)
    assert.equal(7129.04, back.plans["2112x7168"][1].step_us)
    assert.equal(7247.10, back.plans["2112x7168"][1].base_step_us)
    assert.same(C, back.silu_mul["8448x7168"][16].config)
    assert.is_nil(back.earlier) -- no earlier runs: no field
    -- the earlier runs whose entries the file still carries load back in order
    t.earlier = {"2026-12-01 23:00 UTC def5678: scripts/tune-step --m 16", "older \"quoted\" run"}
    assert.same(t.earlier, assert(load(plan_step.render(t)))().earlier)
    t.earlier = nil
    -- an entry without times (carried over from a file written by hand) renders without them
    local bare = assert(load(plan_step.render({arch = "sm90",
      plans = {["64x64"] = {[2] = {kernel = "skinny", config = C}}}})))()
    assert.same({kernel = "skinny", config = C}, bare.plans["64x64"][2])
    -- a cuBLAS entry renders without a config
    local cub = plan_step.render({arch = "sm90",
      plans = {["64x64"] = {[3] = {kernel = plan_step.CUBLAS, step_us = 10, base_step_us = 11}}}})
    assert.truthy(cub:find('[3] = {kernel = "cuda.linear.cublas", step_us = 10.00, base_step_us = 11.00},', 1, true), cub)
    assert.same({kernel = "cuda.linear.cublas", step_us = 10, base_step_us = 11}, assert(load(cub))().plans["64x64"][3])
    -- a step entry as k3.plan_for hands it on: its extra keys are accepted
    local m = k3.method.low_latency(back.plans["2112x7168"], {static_weights = true})
    m:free()
  end)

  it("entries: nil without the file; the section's entries of a file; a broken file raises", function()
    assert.is_nil(plan_step.entries("k3.policy.no_such_step_file", "plans", "1x1"))
    local _, done = scratch_module("t1_step", plan_step.render({arch = "t1",
      plans = {["64x64"] = {[2] = {kernel = "skinny", config = C, step_us = 1, base_step_us = 2},
                            [3] = {kernel = plan_step.CUBLAS, step_us = 1, base_step_us = 2}}}}))
    local ok, err = pcall(function()
      local e = plan_step.entries("k3.policy.t1_step", "plans", "64x64")
      assert.same(C, e[2].config)
      assert.equal("cuda.linear.cublas", e[3].kernel)
      assert.is_nil(plan_step.entries("k3.policy.t1_step", "plans", "65x64"))
      assert.is_nil(plan_step.entries("k3.policy.t1_step", "silu_mul", "64x64"))
    end)
    done()
    assert(ok, err)
    -- a step file `text` as module k3.policy.<name>: entries' error for section's 64x64, each
    -- fragment of `want` in it
    local function refused(name, text, section, want)
      local _, d = scratch_module(name, text)
      local okb, errb = pcall(plan_step.entries, "k3.policy." .. name, section, "64x64")
      d()
      assert.is_false(okb, name)
      for _, w in ipairs(want) do assert.truthy(tostring(errb):find(w, 1, true), errb) end
    end
    refused("t2_step", "return 42\n", "plans", {"k3.policy.t2_step (", "must return a table; got number"})
    refused("t3_step", "return {plans = \n", "plans", {"t3_step"})
    -- a bad entry names the file, the section, the shape and the M
    refused("t4_step", "return {silu_mul = {['64x64'] = {[17] = {kernel = 'skinny', config = {}}}}}\n", "silu_mul",
            {"k3.policy.t4_step (", 'silu_mul["64x64"][17] must be an M in 1..16'})
    refused("t5_step", "return {plans = {['64x64'] = 'fast'}}\n", "plans", {'plans["64x64"] must be a table; got string'})
  end)
end)

describe("the committed step files", function()
  it("load, and every entry is one low_latency takes, under an NxK key", function()
    local root = H.root()
    local p = io.popen("ls '" .. root .. "/lua/k3/policy/'")
    local names = {}
    for f in p:lines() do
      local arch = f:match("^(sm%d+)_step%.lua$")
      if arch then names[#names + 1] = arch end
    end
    p:close()
    assert.is_true(#names > 0, "no lua/k3/policy/<arch>_step.lua")
    for _, arch in ipairs(names) do
      local t = require("k3.policy." .. arch .. "_step")
      -- a shape the plan files do not cover is tuned too (from other shapes' configs): the
      -- key is checked for its form, the entry by plan_step.entries and low_latency
      assert.equal(arch, t.arch)
      for _, section in ipairs({"plans", "silu_mul"}) do
        for key, entries in pairs(t[section] or {}) do
          assert.truthy(key:match("^%d+x%d+$"), arch .. "_step: " .. section .. " key " .. key .. " is not NxK")
          assert.equal(entries, plan_step.entries("k3.policy." .. arch .. "_step", section, key))
          for m, e in pairs(entries) do
            assert.truthy(e.step_us < e.base_step_us, key .. " M = " .. m .. ": not faster than what it replaced")
            k3.method.low_latency(plan_step.overlay(nil, {[m] = e}), {static_weights = true}):free()
          end
        end
      end
      -- the file is what render writes for its own values
      local f = assert(io.open(root .. "/lua/k3/policy/" .. arch .. "_step.lua"))
      local text = f:read("a")
      f:close()
      assert.equal(plan_step.render(t), text)
    end
  end)
end)

describe("scripts/tune-step", function()
  local root = H.root()
  local function run(args)
    return H.sh("cd '" .. root .. "' && scripts/tune-step " .. args)
  end

  it("--help prints its usage", function()
    local out, code = run("--help")
    assert.equal(0, code)
    assert.truthy(out:find("scripts/tune-step [--m 1,16]", 1, true), out)
  end)

  it("refuses bad options, naming them", function()
    for _, c in ipairs({
      {"--m 17", "tune-step: --m: a plan covers M = 1..16; got 17"},
      {"--m x", "tune-step: --m: bad item 'x'"},
      {"--replays 0", "tune-step: --replays must be >= 1; got 0"},
      {"--passes 0", "tune-step: --passes must be >= 1; got 0"},
      {"--shapes 12", "tune-step: --shapes: bad item '12'"},
      {"--write --out f.lua", "tune-step: --write and --out name two destinations; give one"},
      {"--tokens 4", "tune-step: unknown option --tokens"},
      {"--m ,", "tune-step: --m takes a comma-separated list; got ','"},
      {"--shapes ,", "tune-step: --shapes takes a comma-separated list; got ','"},
      {"--m 1,1", "tune-step: --m: M = 1 given twice"},
      {"--replays", "tune-step: --replays takes a count; got nothing"},
      {"--passes 1.5", "tune-step: --passes takes a count; got '1.5'"},
      -- a flag without its value does not swallow the next flag
      {"--out --dry-run", "tune-step: --out takes a file; got '--dry-run'"},
      {"--config --dry-run", "tune-step: --config takes a name; got '--dry-run'"},
      {"--min-gain --m 1", "tune-step: --min-gain takes a percentage; got '--m'"},
      {"--config nope", "tune-step: --config: kimi_k3: unknown config 'nope'"},
      {"--l2-prefetch 41", "tune-step: --l2-prefetch: bad item '41'"},
      {"--l2-prefetch --m 1", "tune-step: --l2-prefetch takes a comma-separated list; got '--m'"},
      {"--configs 't512 r32 u4,t256 q8'", "tune-step: --configs: unknown token 'q8' in 't256 q8' (expected tN rN uN vN sN wN bal pfN)"},
      {"--configs 't512 pf64'", "tune-step: --configs: 'pf64' in 't512 pf64' needs MiB 0..40"},
      {"--configs --m 1", "tune-step: --configs takes a comma-separated list; got '--m'"},
    }) do
      local out, code = run(c[1])
      assert.equal(2, code, c[1] .. ": " .. out)
      assert.truthy(out:find(c[2], 1, true), c[1] .. ": " .. out)
    end
  end)

  it("--help anywhere prints its usage and runs nothing", function()
    local out, code = run("--m 1 --out /tmp/k3-tune-step-help.lua --help")
    assert.equal(0, code, out)
    assert.truthy(out:find("scripts/tune-step [--m 1,16]", 1, true), out)
    assert.is_nil(io.open("/tmp/k3-tune-step-help.lua"))
  end)

  it("refuses a destination it cannot write before it times anything, naming it", function()
    local file = os.tmpname() -- a plain file: no folder can be made under it
    local out, code = run("--m 1 --out '" .. file .. "/x/sm90_step.lua'")
    os.remove(file)
    assert.equal(2, code, out)
    assert.truthy(out:find("tune-step: cannot write the step file under " .. file .. "/x", 1, true), out)
  end)

  it("without a CUDA device: says so and writes nothing", function()
    if H.cuda() then
      pending("a CUDA device is present")
      return
    end
    local out, code = run("--m 1 --out /tmp/k3-tune-step-none.lua")
    assert.equal(2, code, out)
    assert.truthy(out:find("tune-step: needs a CUDA device", 1, true), out)
    assert.is_nil(io.open("/tmp/k3-tune-step-none.lua"))
  end)
end)

describe("k3.plan_for with a step file #gpu", function()
  it("lays the step file's entries over the plan at their M, plain and epilogue", function()
    if not H.need_gpu(pending) then return end
    local arch = k3.cuda_arch(0)
    local w = k3.empty({2112, 7168}, {dtype = "bf16", device = "cuda"})
    local g = k3.empty({8448, 7168}, {dtype = "bf16", device = "cuda"})
    local saved = package.loaded["k3.policy." .. arch .. "_step"]
    package.loaded["k3.policy." .. arch .. "_step"] = nil
    -- the plans without step entries (the committed step file has some for these shapes)
    local _, done0 = scratch_module(arch .. "_step", plan_step.render({arch = arch}))
    local ok0, before, before_g = pcall(function()
      return k3.plan_for(w) or {}, k3.plan_for(g, {epilogue = "silu_mul"}) or {}
    end)
    done0()
    assert(ok0, before)
    local _, done = scratch_module(arch .. "_step", plan_step.render({arch = arch,
      plans = {["2112x7168"] = {[3] = {kernel = "skinny", config = C, step_us = 1, base_step_us = 2}},
               -- a plain call's entry on the gate_up shape: not the epilogue call's
               ["8448x7168"] = {[3] = {kernel = "skinny", config = C, step_us = 1, base_step_us = 2}}},
      silu_mul = {["8448x7168"] = {[16] = {kernel = "skinny", config = B, step_us = 1, base_step_us = 2}}}}))
    local ok, err = pcall(function()
      local p = k3.plan_for(w)
      assert.same(C, p[3].config)
      for m = 1, 16 do
        if m ~= 3 then assert.same(before[m], p[m]) end
      end
      local pg = k3.plan_for(g, {epilogue = "silu_mul"})
      assert.same(B, pg[16].config)
      for m = 1, 15 do assert.same(before_g[m], pg[m]) end
    end)
    done()
    package.loaded["k3.policy." .. arch .. "_step"] = saved
    w:free()
    g:free()
    assert(ok, err)
  end)
end)
