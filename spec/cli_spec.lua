-- lua/k3/cli.lua, what k3's scripts share: the --m list of decode batch sizes, the progress
-- reporter (k3.cli.progress, used by scripts/demo.lua, the --tp demo and scripts/bench) and the
-- k3.isatty it asks.
local k3 = require "k3"
local H = require "spec.helpers"

describe("k3.cli.batch_sizes", function()
  local cli = require "k3.cli"

  it("reads numbers and ranges, in order", function()
    assert.are.same({1, 2, 4, 16}, cli.batch_sizes("1,2,4,16", 16))
    assert.are.same({1, 2, 3, 8}, cli.batch_sizes(" 1 - 3 ,8", 16))
    assert.are.same({16}, cli.batch_sizes("16-16", 16))
  end)

  it("refuses a size outside 1..max before expanding a range, naming it as written", function()
    for text, want in pairs({
      ["17"] = "batch sizes must be in 1..16; got 17 in '17'",
      ["0,1"] = "batch sizes must be in 1..16; got 0 in '0,1'",
      ["1-100000000000"] = "batch sizes must be in 1..16; got 100000000000 in '1-100000000000'",
      ["3-1"] = "range '3-1' runs backwards (write 1-3)",
      ["1,,2"] = "empty item in '1,,2'",
      [""] = "empty item in ''",
      ["1,x"] = "'x' is not a number or a range a-b",
      ["-1"] = "'-1' is not a number or a range a-b",
    }) do
      local list, err = cli.batch_sizes(text, 16)
      assert.is_nil(list, text)
      assert.equal(want, err, text)
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

  it("plain mode (K3_PROGRESS=plain, a pipe): each phase's first line at once, not held by the interval", function()
    local s, now = capture(), 100
    local r = cli.progress{stream = s, mode = "plain", interval = 5, clock = function() return now end}
    r:update("generating weights %d/%d", 50, 100)
    now = 101
    r:update("generating weights %d/%d", 100, 100)  -- held: within the interval
    now = 102
    r:update("M = %d: warm-up", 1)                  -- a new phase: at once, after the held line
    now = 103
    r:update("M = %d: step %d", 1, 1)
    r:update("M = %d: step %d", 1, 2)               -- same phase within the interval: held
    assert.equal("generating weights 50/100\ngenerating weights 100/100\nM = 1: warm-up\n" ..
                 "M = 1: step 1\n", s.text)
    r:done()
    assert.equal("generating weights 50/100\ngenerating weights 100/100\nM = 1: warm-up\n" ..
                 "M = 1: step 1\nM = 1: step 2\n", s.text)
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
end)
