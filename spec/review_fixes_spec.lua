-- Regressions found by review and by a new user trying to break k3: each case failed (crash,
-- wrong result or misleading message) before its fix.
local k3 = require "k3"
local H = require "spec.helpers"

describe("review regressions", function()
  it("tensors made by a proxy table's __index stay alive through the op", function()
    local mk = {
      prefix = function() return k3.ones({2, 4}) end,
      blocks = function() return k3.ones({2, 1, 4}) end,
      norm_weight = function() return k3.ones({4}) end,
      qk_weight = function() return k3.ones({4}) end,
      num_blocks = function() return 0 end,
    }
    local proxy = setmetatable({}, {__index = function(_, k)
      if k == "kernel" then collectgarbage(); collectgarbage(); return nil end
      return mk[k] and mk[k]()
    end})
    assert.same({{1, 1, 1, 1}, {1, 1, 1, 1}}, k3.attn_res(proxy):totable())
    local entry = setmetatable({}, {__index = function(_, k)
      if k == "kernel" then return ("skin" .. "ny") end
    end})
    local m = k3.method.low_latency({[1] = entry})
    collectgarbage()
    assert.same({{4, 4}}, m:apply(k3.ones({1, 4}), k3.ones({2, 4})):totable())
  end)

  it("a CPU attn_res whose scratch size overflows is refused, not written out of bounds", function()
    local Hd, S = (1 << 22) - 1, 1 << 40
    local b = k3.zeros({1, 1, Hd}, {dtype = "bf16"}):expand({1, S, Hd})
    local p = k3.ones({1, Hd}, {dtype = "bf16"})
    local w = k3.ones({Hd}, {dtype = "bf16"})
    H.raises(function()
      k3.attn_res{prefix = p, blocks = b, num_blocks = S - 1, norm_weight = w, qk_weight = w}
    end, "attn_res: cpu.attn_res.reference: scratch size overflows for num_blocks 1099511627775")
  end)

  it("num_blocks = 0 returns the prefix even when its logit is not finite", function()
    local out = k3.attn_res{prefix = k3.tensor({{3e38, 3e38, 1}}), blocks = k3.zeros({1, 1, 3}),
                            num_blocks = 0, norm_weight = k3.ones({3}), qk_weight = k3.ones({3})}
    assert.same(k3.tensor({{3e38, 3e38, 1}}):totable(), out:totable())
  end)

  it("a 0-dim tensor prints as a scalar", function()
    local s = k3.tensor({{1, 2}, {3, 4}}):select(1, 2):select(1, 1)
    assert.equal("k3.Tensor [] f32 cpu offset 2\n3", tostring(s))
    assert.equal("{k3.Tensor [] f32 cpu offset 2}", k3.inspect({s}))
  end)

  it("the AttnRes stream is unchanged by a read that raises", function()
    local Stream = require "k3.model.attn_res_stream"
    local Hd = 4
    local st = Stream.new{tokens = 1, hidden_size = Hd, num_layers = 4, block_size = 2,
                          dtype = "f32"}
    st:begin(k3.ones({1, Hd}))
    local good = {norm_weight = k3.ones({Hd}), qk_weight = k3.ones({Hd})}
    local bad = {norm_weight = k3.ones({Hd + 1}), qk_weight = k3.ones({Hd})}
    st:pre_attention(0, good)
    st:post_attention(0, good, k3.ones({1, Hd}))
    st:pre_attention(1, good, k3.ones({1, Hd}))
    st:post_attention(1, good, k3.ones({1, Hd}))
    local before = st.num_sealed
    -- layer 2 seals: the bad query raises, and the seal must not be recorded
    H.raises(function() st:pre_attention(2, bad, k3.ones({1, Hd})) end, "norm_weight")
    assert.equal(before, st.num_sealed)
    local out = st:pre_attention(2, good, k3.ones({1, Hd}))
    assert.same({1, Hd}, out:size())
    assert.equal(before + 1, st.num_sealed)
  end)

  it("K3_DISABLE_KERNELS is matched by whole entries in the not-registered detail", function()
    local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/[^/]*$") or "."
    local cmd = string.format("cd %q && K3_DISABLE_KERNELS=xx-cpu.linear.blas-xx scripts/k3 -e %q 2>/dev/null",
      root, 'print(select(2, pcall(k3.linear, k3.ones({1,2}), k3.ones({1,2}), {kernel = "cpu.linear.blas"})))')
    local f = io.popen(cmd)
    local out = f:read("a")
    f:close()
    assert.equal("k3.Tensor [1, 1] f32 cpu\n[[2]]\n", out)
  end)
end)

describe("new-user regressions", function()
  it("a misspelt option raises instead of falling back to a default", function()
    H.raises(function() k3.zeros({2}, {dtyp = "f64"}) end,
      "bad argument #2 to 'zeros' (unknown option 'dtyp' (expected dtype, device or seed))")
    H.raises(function() k3.linear(k3.ones({1, 2}), k3.ones({1, 2}), {bais = k3.ones({1})}) end,
      "unknown option 'bais'")
    H.raises(function() k3.method.low_latency({[1] = {kernel = "skinny", config = {thread = 128}}}) end,
      "unknown option 'thread' (expected threads, rows, unroll, vec or split_k)")
  end)

  it("allclose names its options argument", function()
    H.raises(function() k3.allclose(k3.ones({2}), k3.ones({2}), {atol = "x"}) end,
      "bad argument #3 to 'allclose' (field 'atol' must be a number; got string)")
  end)

  it("save_safetensors refuses a path that is not a regular file and follows symlinks", function()
    H.raises(function() k3.save_safetensors("/dev/null", {a = k3.ones({2})}) end,
      "save_safetensors: /dev/null exists and is not a regular file")
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir .. " && echo old > " .. dir .. "/target.st && ln -s target.st " .. dir .. "/link.st"))
    k3.save_safetensors(dir .. "/link.st", {a = k3.tensor({1, 2})})
    assert.same({1, 2}, k3.load_safetensors(dir .. "/target.st").a:totable())
    local f = io.popen("test -L " .. dir .. "/link.st && echo link")
    assert.equal("link\n", f:read("a"))
    f:close()
    os.execute("rm -rf " .. dir)
  end)

  it("set_policy rejects unknown keys, holes and empty lists at the caller's line", function()
    local before = k3.inspect(k3.policy)
    H.raises(function() k3.set_policy({bogus = {}}) end, "set_policy: unknown key \"bogus\"")
    H.raises(function() k3.set_policy({linear = {}}) end, "set_policy: linear lists no kernels")
    local err = H.raises(function() k3.set_policy({linear = {"nope"}}) end,
      "set_policy: unknown linear kernel 'nope'")
    assert.is_nil(err:find("init.lua", 1, true))
    assert.equal(before, k3.inspect(k3.policy))
    k3.set_policy({linear = {"cpu.linear.reference"}})
    assert.same({"cpu.linear.reference"}, k3.policy.linear)
    assert.same({"cuda.rms_norm.generic", "cpu.rms_norm.reference"}, k3.policy.rms_norm)
    k3.set_policy(require "k3.policy.default")
  end)
  it("get/set on an empty view with huge strides report the index, with no overflow", function()
    -- An empty view's strides are never needed, so they may be anything; element access must
    -- reject the out-of-range index before it multiplies an index by a stride (found by
    -- fuzz_tensor under UBSan; make test-asan runs this).
    local t = k3.zeros({4})
    local v = t:as_strided({2, 0}, {2^61, 1}, 0)
    H.raises(function() return v:get(2, 1) end, "get: index 1 out of range for dim 2 of size 0")
    H.raises(function() v:set(2, 1, 5) end, "set: index 1 out of range for dim 2 of size 0")
    assert.same({0, 0, 0, 0}, t:totable())
  end)
end)

-- The C API review: the C side is spec/capi/checks.c (spec/capi_spec.lua); these are the same
-- rules seen from Lua, whose messages stay 1-based.
describe("C API review, from Lua", function()
  it("messages stay 1-based in Lua while the C core counts from 0", function()
    local t = k3.zeros({2, 3})
    H.raises(function() t:narrow(2, 3, 2) end, "narrow: start 3 and length 2 out of range for dim 2 of size 3")
    H.raises(function() t:select(1, 3) end, "select: index 3 out of range for dim 1 of size 2")
    H.raises(function() t:get(1, 4) end, "get: index 4 out of range for dim 2 of size 3")
    H.raises(function() t:set(3, 1, 0) end, "set: index 3 out of range for dim 1 of size 2")
    H.raises(function() t:view({-1, -1}) end, "view: only one size may be -1 (dims 1 and 2)")
    H.raises(function() t:expand({3, 3}) end, "expand: dim 1 of size 2 cannot expand to 3")
    H.raises(function() t:as_strided({2, 3}, {3, -1}) end, "as_strided: stride of dim 2 must be >= 0; got -1")
    H.raises(function() k3.zeros({2 ^ 31, 2 ^ 31, 4}) end, "zeros: element count overflows at dim 3")
    H.raises(function() k3.zeros({1, 3}):expand({2, 3}):copy(t) end,
      "copy: destination dim 1 has stride 0 (a broadcast view); it cannot be written")
    local w = k3.ones({4})
    local args = {prefix = k3.ones({1, 4}), blocks = k3.ones({1, 3, 4}), num_blocks = 0,
                  norm_weight = w, qk_weight = w}
    args.write_block = 4
    H.raises(function() k3.attn_res(args) end, "attn_res: write_block must be in 1..3 (blocks dim 2); got 4")
    args.blocks, args.write_block = k3.ones({1, 0, 4}), 1
    H.raises(function() k3.attn_res(args) end, "attn_res: write_block must be nil: blocks dim 2 is 0; got 1")
  end)

  it("a copy into a destination whose elements overlap is refused, whatever makes them overlap", function()
    local base = k3.tensor({1, 2, 3, 4})
    local ov = base:as_strided({2, 2}, {1, 1}, 0) -- elements at offsets 0, 1, 1, 2
    H.raises(function() ov:copy(k3.tensor({{5, 6}, {7, 8}})) end,
      "copy: destination is written but its elements overlap (shape [2, 2], strides [1, 1])")
    assert.same({1, 2, 3, 4}, base:totable()) -- nothing was written
    -- The same rule as the ops' out.
    H.raises(function() k3.rms_norm(k3.ones({2, 2}), k3.ones({2}), 1e-5, {out = ov}) end,
      "rms_norm: out is written but its elements overlap (shape [2, 2], strides [1, 1])")
    H.raises(function() k3.silu_mul(k3.ones({2, 4}), {out = ov}) end,
      "silu_mul: out is written but its elements overlap (shape [2, 2], strides [1, 1])")
    -- The test is conservative for interleaved views: offsets 0, 3, 2, 5, 4, 7 share nothing,
    -- but the dims interleave, so the view is refused as a destination (k3.h documents it).
    local il = k3.zeros({8}):as_strided({3, 2}, {2, 3}, 0)
    H.raises(function() il:copy(k3.ones({3, 2})) end,
      "copy: destination is written but its elements overlap (shape [3, 2], strides [2, 3])")
    -- Disjoint strided destinations are still written.
    local pad = k3.zeros({2, 5})
    pad:as_strided({2, 2}, {5, 2}, 1):copy(k3.tensor({{1, 2}, {3, 4}}))
    assert.same({{0, 1, 0, 2, 0}, {0, 3, 0, 4, 0}}, pad:totable())
  end)

  it("fill and set write through overlapping views; a view copied onto itself is a no-op", function()
    local base = k3.tensor({1, 2, 3, 4})
    local ov = base:as_strided({2, 2}, {1, 1}, 0)
    ov:fill(7)
    assert.same({7, 7, 7, 4}, base:totable())
    ov:set(2, 1, 9) -- offset 1, shared with ov[1][2]
    assert.equal(9, ov:get(1, 2))
    assert.same({7, 9, 7, 4}, base:totable())
    ov:copy(ov)
    assert.same({7, 9, 7, 4}, base:totable())
    local b = k3.zeros({1, 3}):expand({2, 3})
    b:fill(2)
    assert.same({{2, 2, 2}, {2, 2, 2}}, b:totable())
  end)

  it("an op's output allocation failure names the op", function()
    -- 2^46 rows: more bytes than any address space, so the allocation fails on any machine.
    local rows = 2 ^ 46
    local x = k3.zeros({1, 4}):expand({rows, 4})
    H.raises(function() k3.rms_norm(x, k3.ones({4}), 1e-5) end,
      "rms_norm: out of host memory allocating " .. math.tointeger(rows * 16) .. " bytes")
    H.raises(function() k3.silu_mul(x) end,
      "silu_mul: out of host memory allocating " .. math.tointeger(rows * 8) .. " bytes")
    H.raises(function() k3.linear(x, k3.ones({1, 4})) end,
      "linear: out of host memory allocating " .. math.tointeger(rows * 4) .. " bytes")
    H.raises(function() k3.method.default():apply(x, k3.ones({1, 4})) end,
      "linear: out of host memory allocating ")
    local w = k3.ones({4})
    H.raises(function()
      k3.attn_res{prefix = x, blocks = k3.zeros({1, 1, 4}):expand({rows, 1, 4}), num_blocks = 1,
                  norm_weight = w, qk_weight = w}
    end, "attn_res: out of host memory allocating " .. math.tointeger(rows * 16) .. " bytes")
  end)

  it("a NaN in a message prints as nan, whatever its sign bit", function()
    local w = k3.ones({4})
    local args = {prefix = k3.ones({1, 4}), blocks = k3.ones({1, 1, 4}), num_blocks = 1,
                  norm_weight = w, qk_weight = w}
    args.output_eps = 0 / 0
    local err = H.raises(function() k3.attn_res(args) end,
      "attn_res: output_eps must be a finite number >= 0; got nan")
    assert.is_nil(err:find("-nan", 1, true))
    args.output_eps, args.eps = nil, -(0 / 0)
    H.raises(function() k3.attn_res(args) end, "attn_res: eps must be a finite number >= 0; got nan")
    H.raises(function() k3.rms_norm(k3.ones({1, 4}), w, -math.huge) end,
      "rms_norm: eps must be a finite number >= 0; got -inf")
  end)

  it("scalar arithmetic rounds each element once, for every dtype and operand order", function()
    -- The review's case: 1 * (1 + 2^-8 + 2^-40) lies just above bf16's tie 1 + 2^-8, so it
    -- rounds up; the scalar rounded to f32 first (1 + 2^-8) would tie to even, 1.
    assert.equal(1 + 2 ^ -7, (k3.full({1}, 1, {dtype = "bf16"}) * (1 + 2 ^ -8 + 2 ^ -40)):get(1))
    -- Each dtype: operands whose exact result a double holds (so rounding that double once,
    -- as k3.full does, is the oracle), straddling the dtype's ties by 2^-40 and less.
    local ulp = {bf16 = 2 ^ -7, f16 = 2 ^ -10, f32 = 2 ^ -23, f64 = 2 ^ -52}
    for dt, u in pairs(ulp) do
      local tiny = dt == "f64" and 0 or 2 ^ -40
      local xs = {1, -1.5, 3, 0.75, 2 ^ 10 + 2 ^ 3, -(2 ^ -3)}
      local ss = {1 + u / 2 + tiny, 1 + u / 2 - tiny, 1 + 3 * u / 2 + tiny, -(1 + u / 2 + tiny),
                  u / 2 + tiny, u / 2 - tiny, -(u / 2) - tiny, 3 * u / 2 + tiny, 0.1, 1 / 3}
      local x = k3.tensor(xs, {dtype = dt})
      local xv = x:to("f64"):totable()
      -- A strided view too: every element of x, read with stride 2.
      local strided = k3.zeros({#xs, 2}, {dtype = dt}):select(2, 1)
      strided:copy(x)
      for _, s in ipairs(ss) do
        for _, case in ipairs{
          {"x*s", function(t) return t * s end, function(a) return a * s end},
          {"s*x", function(t) return s * t end, function(a) return s * a end},
          {"x+s", function(t) return t + s end, function(a) return a + s end},
          {"s+x", function(t) return s + t end, function(a) return s + a end},
          {"x-s", function(t) return t - s end, function(a) return a - s end},
          {"s-x", function(t) return s - t end, function(a) return s - a end},
        } do
          local want = {}
          for i, a in ipairs(xv) do
            local exact = case[3](a)
            -- 0.1 and 1/3 have 53 bits: their products need more, so skip those oracles.
            if (s == 0.1 or s == 1 / 3) and case[1]:find("*", 1, true) then exact = nil end
            want[i] = exact and k3.full({1}, exact, {dtype = dt}):get(1)
          end
          for _, t in ipairs{x, strided} do
            local got = case[2](t):totable()
            for i = 1, #xs do
              if want[i] and got[i] ~= want[i] then
                error(string.format("%s %s with x = %a, s = %a: got %a, want %a", dt, case[1],
                                    xv[i], s, got[i], want[i]))
              end
            end
          end
        end
      end
    end
  end)
end)

-- Progress output (k3.cli.progress, used by scripts/demo.lua, the --tp demo and scripts/bench):
-- a live "\r\27[K" line only on a terminal; in a log, plain lines and no escape sequences.
describe("progress output", function()
  local cli = require "k3.cli"
  local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/[^/]*$") or "."

  -- A stream that records what is written, and a clock the spec moves by hand.
  local function capture()
    local s = {text = ""}
    function s:write(...) for _, v in ipairs({...}) do self.text = self.text .. v end return self end
    function s:flush() end
    return s
  end

  local sh = H.sh

  it("k3.isatty tells a terminal from a file and names its argument", function()
    local f = io.tmpfile()
    assert.is_false(k3.isatty(f))
    f:close()
    H.raises(function() k3.isatty(f) end, "bad argument #1 to 'isatty' (file is closed)")
    H.raises(function() k3.isatty(2) end, "(FILE* expected, got number)")
    local out = sh(string.format("cd %q && scripts/k3 -e 'print(k3.isatty(io.stderr))' 2>&1 </dev/null | cat", root))
    assert.equal("false\n", out)
    if not os.execute("command -v script >/dev/null 2>&1") then
      return pending("util-linux `script` is missing: the terminal case is not run")
    end
    out = sh(string.format("cd %q && script -qec \"scripts/k3 -e 'print(k3.isatty(io.stdout))'\" /dev/null </dev/null", root))
    assert.equal("true", (out:gsub("%s+$", "")))
  end)

  it("K3_PROGRESS overrides; otherwise a file gets plain lines", function()
    local f = io.tmpfile()
    assert.equal("off", cli.progress_mode(f, "0"))
    assert.equal("tty", cli.progress_mode(f, "1"))
    assert.equal("plain", cli.progress_mode(f, "plain"))
    assert.equal("plain", cli.progress_mode(f, ""))
    f:close()
  end)

  it("K3_PROGRESS accepts 0, 1, plain and off/on, false/true, no/yes; anything else is reported once", function()
    local f = io.tmpfile()
    for value, mode in pairs({["0"] = "off", off = "off", OFF = "off", ["false"] = "off", no = "off",
                              ["1"] = "tty", on = "tty", ["true"] = "tty", Yes = "tty",
                              plain = "plain", [" plain "] = "plain", PLAIN = "plain"}) do
      assert.equal(mode, cli.progress_mode(f, value), "K3_PROGRESS=" .. value)
    end
    f:close()
    -- Three reporters ask for the mode; a typo is reported once (on stderr), then treated as
    -- unset: a file gets plain lines.
    local chunk = 'local cli = require "k3.cli"; local f = io.tmpfile(); ' ..
                  'print(cli.progress_mode(f), cli.progress_mode(f), cli.progress{stream = f}.mode)'
    local function run(env)
      return sh(string.format("cd %q && env %s scripts/k3 -e '%s' 2>&1", root, env, chunk))
    end
    local out, code = run("K3_PROGRESS=fast")
    assert.equal(0, code, out)
    assert.equal("k3: warning: K3_PROGRESS: unrecognised value 'fast' (expected 0, 1, plain, " ..
                 "true, false, yes, no, on or off); progress is shown as when it is unset\n" ..
                 "plain\tplain\tplain\n", out)
    assert.equal("off\toff\toff\n", (run("K3_PROGRESS=off")))
    assert.equal("tty\ttty\ttty\n", (run("K3_PROGRESS=yes")))
    assert.equal("plain\tplain\tplain\n", (run("K3_PROGRESS=")))
    assert.equal("plain\tplain\tplain\n", (run("-u K3_PROGRESS")))
  end)

  it("plain mode: the first line at once, then at most one per interval, the last at done", function()
    local s, now = capture(), 100
    local r = cli.progress{stream = s, mode = "plain", interval = 5, clock = function() return now end}
    r:update("step %d/%d", 1, 4)
    now = 102
    r:update("step %d/%d", 2, 4)
    now = 106
    r:update("step %d/%d", 3, 4)
    now = 107
    r:update("step %d/%d", 4, 4)
    r:done()
    r:done()
    r:update("next phase")
    assert.equal("step 1/4\nstep 3/4\nstep 4/4\nnext phase\n", s.text)
    r:clear()
    assert.equal("step 1/4\nstep 3/4\nstep 4/4\nnext phase\n", s.text)
  end)

  it("tty mode rewrites one line; off and quiet write nothing", function()
    local s = capture()
    local r = cli.progress{stream = s, mode = "tty"}
    r:update("a %d", 1)
    r:update("b")
    r:done()
    assert.equal("\r\27[Ka 1\r\27[Kb\r\27[K", s.text)
    for _, o in ipairs({{mode = "off"}, {mode = "tty", quiet = true}}) do
      local q = capture()
      o.stream = q
      local rq = cli.progress(o)
      rq:update("x")
      rq:done()
      rq:clear()
      assert.equal("", q.text)
    end
    H.raises(function() cli.progress{mode = "fancy"} end,
      "bad argument #1 to 'progress' (mode must be \"tty\", \"plain\" or \"off\"; got fancy)")
  end)

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
    assert.truthy(text:find("\nM=2  step 2/2\n$"), text)
    assert.equal("", demo("0"))
    assert.truthy(demo("1"):find("\r\27[K", 1, true))
    os.remove(err)
  end)
end)

-- scripts/bench's JSON goes through Debian's lua-dkjson (the project takes libraries over
-- home-made code): keys sorted in every object, NaN and infinities as null, and the benchmark
-- files, written twice, identical but for the date.
describe("bench JSON (lua-dkjson)", function()
  local U = require "k3.bench.util"
  local dkjson = require "dkjson"
  local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/[^/]*$") or "."

  local sh = H.sh

  local function read(path)
    local f = assert(io.open(path))
    local s = f:read("a")
    f:close()
    return s
  end

  it("encodes through dkjson with sorted keys; NaN, infinities and U.null become null", function()
    assert.equal(dkjson.null, U.null)
    local doc = {zeta = 1, alpha = {b = 0 / 0, a = math.huge, c = U.null}, mid = {3, 2.5, -math.huge},
                 empty = {}, text = "q\"\n"}
    assert.equal('{\n  "alpha":{\n    "a":null,\n    "b":null,\n    "c":null\n  },\n  "empty":[],\n' ..
                 '  "mid":[3,2.5,null],\n  "text":"q\\"\\n",\n  "zeta":1\n}', U.json_encode(doc))
    -- The order does not depend on how the tables were built.
    local a, b = {}, {}
    for i = 1, 40 do a["k" .. i] = i end
    for i = 40, 1, -1 do b["k" .. i] = i end
    assert.equal(U.json_encode(a), U.json_encode(b))
  end)

  it("decodes with dkjson: null is nil; malformed input raises 'json: ...'", function()
    local v = U.json_decode('{"a": [1, 2.5, "x"], "b": null, "c": {"d": true}}')
    assert.same({1, 2.5, "x"}, {v.a[1], v.a[2], v.a[3]})
    assert.is_nil(v.b)
    assert.is_true(v.c.d)
    H.raises(function() U.json_decode('{"a": 1,') end, "json: unterminated object at line 1, column 1")
    H.raises(function() U.json_decode('[1, 2] x') end, "json: trailing characters at byte 8")
    local c = {}
    c.self = c
    H.raises(function() U.json_encode(c) end, "json: reference cycle")
    -- Keys JSON cannot hold are an error of ours, not a crash inside dkjson.
    H.raises(function() U.json_encode({[true] = 1}) end,
      "json: object keys must be strings or numbers; got a boolean key")
    -- Floats survive a write and a read exactly (dkjson alone writes %.14g); integers stay
    -- integers and integral floats stay floats.
    local doc = {t = 1030.0123456789012, e = 2 ^ 53, tenth = 0.1, i = 3, f = 2.0, big = 1e300}
    local back = U.json_decode(U.json_encode(doc))
    for k, x in pairs(doc) do
      assert.equal(x, back[k], k)
      assert.equal(math.type(x), math.type(back[k]), k)
    end
    assert.truthy(U.json_encode({x = 0.1}):find('"x":0.1', 1, true))
  end)

  it("scripts/bench --dry-run writes the same sorted JSON twice and reads a --peers file", function()
    local dirs = {os.tmpname(), os.tmpname()}
    local peers = os.tmpname()
    local f = assert(io.open(peers, "w"))
    f:write('{"date": "2026-11-30", "device": "spec", "torch": "none", "copy_GBps": null,\n' ..
            ' "notes": ["from the bench spec"], "attn_res": [],\n' ..
            ' "linear": [{"N": 1536, "K": 7168, "M": 1, "graph_us": 9.5, "eager_us": null}]}\n')
    f:close()
    local texts, err = {}, os.tmpname()
    for i, dir in ipairs(dirs) do
      os.remove(dir)
      local out, code = sh(string.format("(cd %q && env -u K3_PROGRESS scripts/bench linear --dry-run --quick " ..
                                         "--peers %s --out %s 2>%s)", root, peers, dir, err))
      assert.equal(0, code, out)
      assert.truthy(out:find("peers note: from the bench spec", 1, true), out)
      texts[i] = read(dir .. "/linear.json")
      -- dkjson's own decoding of the file re-encodes to the same text: sorted and stable.
      assert.equal(texts[i], U.json_encode(dkjson.decode(texts[i])) .. "\n")
      assert.truthy(texts[i]:find('\n  "meta":{\n', 1, true))
      -- The progress went to a file: plain lines, no carriage returns.
      assert.is_nil(read(err):find("\r", 1, true))
    end
    local function undated(s) return (s:gsub('"date":"[^"]*"', ""):gsub('"command":"[^"]*"', "")) end
    assert.equal(undated(texts[1]), undated(texts[2]))
    f = assert(io.open(peers, "w"))
    f:write('{"linear": [')
    f:close()
    local out, code = sh(string.format("cd %q && scripts/bench linear --dry-run --quiet --peers %s --out %s 2>&1",
                                       root, peers, dirs[1]))
    assert.equal(1, code, out)
    assert.truthy(out:find("bench: --peers " .. peers .. ": json: unterminated array at line 1, column 12", 1, true), out)
    os.remove(err)
    for _, dir in ipairs(dirs) do os.execute("rm -rf " .. dir) end
    os.remove(peers)
  end)
end)

-- Found by a new user trying to break k3 (session 3): each failed before its fix.
describe("new-user regressions", function()
  local root = H.root()

  it("k3.inspect renders its first argument and ignores the rest", function()
    assert.equal('{1, {a = 2}}', k3.inspect({1, {a = 2}}, "extra", 3))
    assert.equal("{1, {2, {3, {…}}}}", k3.inspect({1, {2, {3, {4}}}}))
  end)

  it("save_safetensors refuses a name with a NUL byte instead of cutting it short", function()
    local path = os.tmpname()
    local t = k3.ones({2})
    H.raises(function() k3.save_safetensors(path, {["a\0b"] = t}) end,
             'save_safetensors: ' .. path .. ': tensor name "a" contains a NUL byte at byte 2')
    assert.same({1, 1}, t:totable())
    k3.save_safetensors(path, {ab = t})
    assert.same({1, 1}, k3.load_safetensors(path).ab:totable())
    os.remove(path)
  end)

  it("set_batch_invariant takes a boolean only: 'off' and 0 are refused, the mode unchanged", function()
    local before = k3.batch_invariant()
    for _, v in ipairs{"off", 0, "false"} do
      H.raises(function() k3.set_batch_invariant(v) end,
               "set_batch_invariant' (boolean expected, got " .. type(v) .. ")")
      assert.equal(before, k3.batch_invariant())
    end
    H.raises(function() k3.set_batch_invariant() end, "(boolean expected, got no value)")
    k3.set_batch_invariant(not before)
    assert.equal(not before, k3.batch_invariant())
    k3.set_batch_invariant(before)
  end)

  it("k3.tensor refuses lists with holes or named fields instead of dropping values", function()
    H.raises(function() k3.tensor({[1] = 1, [3] = 3}) end,
             "bad argument #1 to 'tensor' (a list at depth 1 has key 3; expected only the indices 1..1")
    H.raises(function() k3.tensor({1, x = 2}) end, "a list at depth 1 has key 'x'")
    H.raises(function() k3.tensor({{1, 2}, {3, 4, n = 1}}) end, "a list at depth 2 has key 'n'")
    H.raises(function() k3.tensor({[1.5] = 1}) end, "a list at depth 1 has key 1.5")
    H.raises(function() k3.tensor({{1, 2}, 3}) end, "expected a list at depth 2; got number")
    H.raises(function() k3.tensor({{1, 2}, {3}}) end,
             "ragged nesting: a list at depth 2 has 1 items, expected 2")
    -- Metamethods are not consulted: the shape is what the table holds.
    local proxy = setmetatable({}, {__len = function() return 3 end, __index = function() return 7 end})
    assert.same({0}, k3.tensor(proxy):size())
    assert.same({{1, 2}, {3, 4}}, k3.tensor({{1, 2}, {3, 4}}):totable())
  end)

  it("k3.tensor over shared sub-lists whose element count overflows is refused, not a heap overflow", function()
    -- 65536 items nested 4 deep (each level the same list) is 2^64 elements: the count wraps to 0.
    local t = {}
    for i = 1, 65536 do t[i] = 0 end
    for _ = 2, 4 do
      local u = {}
      for i = 1, 65536 do u[i] = t end
      t = u
    end
    H.raises(function() k3.tensor(t) end,
             "bad argument #1 to 'tensor' (the nested lists' shape has more elements than memory can hold: sizes overflow at depth 4)")
  end)

  it("fill of a broadcast view stores each distinct element once", function()
    local base = k3.zeros({3, 1})
    local huge = base:expand({3, 1 << 40}) -- 3 x 2^40 elements, 3 in memory
    huge:fill(5)
    assert.same({{5}, {5}, {5}}, base:totable())
    assert.equal(5, huge:get(2, (1 << 40) - 7))
  end)

  it("demo.lua: an empty --m item and a backwards range are named", function()
    local demo = string.format("%q %q ", root .. "/scripts/k3", root .. "/scripts/demo.lua")
    local out, code = H.sh(demo .. "--m 1,,2")
    assert.equal(2, code, out)
    assert.truthy(out:find("demo: --m: empty item in '1,,2'", 1, true), out)
    out, code = H.sh(demo .. "--m 3-1")
    assert.equal(2, code, out)
    assert.truthy(out:find("demo: --m: range '3-1' runs backwards (write 1-3)", 1, true), out)
    out = H.sh(demo .. "--help")
    assert.truthy(out:find("--tp N", 1, true), out)
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

-- Findings of the libFuzzer targets (spec/fuzz/), reproduced through the Lua API.
describe("fuzzer findings", function()
  -- 8bcf977: k3_tensor_extent multiplied (size - 1) * stride for the dims before a zero size, so an
  -- empty view with huge strides there overflowed int64 (undefined behaviour; UBSan under
  -- `make test-asan`). An empty view reaches no element: its extent is 0.
  it("an empty view with huge strides before its zero dim (8bcf977: k3_tensor_extent)", function()
    local base = k3.zeros({4})
    for _, l in ipairs({{{3, 0}, {2 ^ 62, 1}}, {{3, 0, 5}, {2 ^ 62, 1, 2 ^ 61}}, {{2, 2, 0}, {2 ^ 62, 2 ^ 62, 1}}}) do
      local v = base:as_strided(l[1], l[2], 1)
      assert.same(l[1], v:size())
      assert.same(l[2], v:stride())
      assert.equal(0, v:numel())
      assert.same(l[1], v:clone():size())
      assert.equal("f64", v:to("f64"):dtype())
      assert.same(l[1], (v + v):size())
      assert.same(l[1], (-v):size())
      v:copy(k3.zeros(l[1]))
      v:fill(1)
      assert.equal(0, k3.max_abs_diff(v, v))
    end
    -- an op's overlap check measures the extents of an out and an input of one storage
    local out = base:as_strided({3, 0}, {2 ^ 62, 1}, 0)
    local y = k3.linear(base:as_strided({3, 1}, {1, 1}, 0), k3.zeros({0, 1}), {out = out})
    assert.same({3, 0}, y:size())
    local v = base:as_strided({3, 0}, {2 ^ 62, 1}, 0)
    v:copy(base:as_strided({3, 0}, {1, 2 ^ 62}, 0))
    -- nothing was written: base is as it was
    assert.same({0, 0, 0, 0}, base:totable())
    -- and the 1-based index messages of the same change at the INT64 extremes (wrapping)
    local t = k3.zeros({2, 3})
    H.raises_exact(function() t:select(1, math.mininteger) end,
      "select: index -9223372036854775808 out of range for dim 1 of size 2")
    H.raises_exact(function() t:narrow(2, math.maxinteger, 1) end,
      "narrow: start 9223372036854775807 and length 1 out of range for dim 2 of size 3")
  end)

  -- An expand of an empty tensor can make an empty view whose row-major strides would overflow
  -- ([0, 2^62, 4]: 2^62 * 4); k3.empty refuses that shape, so a new tensor of it must be refused
  -- too (K3_EOVERFLOW), not allocated with wrapped strides. From Lua the dim is counted from
  -- 1, as in k3.empty's message for the same shape.
  local function overflowing_empty_view()
    local e = k3.zeros({1}):expand({0, 2 ^ 62, 4})
    assert.same({0, 2 ^ 62, 4}, e:size())
    assert.equal(0, e:numel())
    return e
  end
  local function refused(fn, name)
    H.raises(fn, name .. ": stride computation overflows at dim 3 (size 4)")
  end

  it("to / clone of an empty view whose row-major strides overflow is refused (5e8f823)", function()
    H.raises_exact(function() k3.empty({0, 2 ^ 62, 4}) end, "empty: stride computation overflows at dim 3 (size 4)")
    local e = overflowing_empty_view()
    refused(function() return e:to("f64") end, "to")
    refused(function() return e:to({dtype = "f16"}) end, "to")
    refused(function() return e:clone() end, "clone")
    -- the view itself is unharmed and usable
    assert.same({0, 2 ^ 62, 4}, e:size())
    assert.same({0, 0, 0}, e:stride())
    assert.same({0, 2, 4}, e:narrow(2, 1, 2):clone():size())
    assert.equal(0, k3.max_abs_diff(e, e))
  end)

  it("binary ops on an empty view whose row-major strides overflow are refused (f2f014c)", function()
    local e = overflowing_empty_view()
    refused(function() return e + e end, "add")
    refused(function() return e - e end, "sub")
    refused(function() return e * e end, "mul")
    refused(function() return e * 2 end, "mul")
    refused(function() return 2 - e end, "sub")
    refused(function() return -e end, "unm")
    assert.same({0, 2 ^ 62, 4}, e:size())
    local small = e:narrow(2, 1, 3)
    assert.same({0, 3, 4}, (small + small):size())
  end)
end)

-- Values that lie about themselves, and edge-case arguments: each case failed before its fix.
describe("lying values and edge-case arguments", function()
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
