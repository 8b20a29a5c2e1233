-- The benchmarks' own code (lua/k3/bench/, scripts/bench) where it runs without a GPU: the JSON
-- of their result files.
local H = require "spec.helpers"

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

  -- A dry run maps every kernel to the CPU reference, so it names the kernel a GPU's dispatch
  -- would pick (kernels/attn_res_decode.cu decode_supports, the bench's rows carry a delta and
  -- the output norm at H = 7168): the decode kernel at T <= 64 and at 1..4 blocks below 256
  -- tokens, the ring kernel at 1..4 blocks from T = 256 and at 8 blocks from 65.
  it("scripts/bench attn_res --dry-run names the fast kernel a GPU's dispatch picks per row", function()
    local dir = os.tmpname()
    os.remove(dir)
    local out, code = sh(string.format("cd %q && env -u K3_PROGRESS scripts/bench attn_res --dry-run --quick --quiet " ..
                                       "--out %s 2>&1", root, dir))
    assert.equal(0, code, out)
    local rows = dkjson.decode(read(dir .. "/attn_res.json")).rows
    assert.equal(18, #rows)
    for _, r in ipairs(rows) do
      local want = (r.T <= 64 or r.num_blocks == 0) and "decode" or "ring"
      assert.equal(want, r.fast_name, string.format("T=%d num_blocks=%d", r.T, r.num_blocks))
    end
    os.execute("rm -rf " .. dir)
  end)
end)

-- `scripts/bench standing`: the committed record against the targets the benchmarks state, on
-- any machine (it reads a file and measures nothing).
describe("scripts/bench standing", function()
  local U = require "k3.bench.util"
  local S = require "k3.bench.summary"
  local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/[^/]*$") or "."
  local sh = H.sh
  local spec = {{"linear", require("k3.bench.linear").STANDING},
                {"attn_res", require("k3.bench.attn_res").STANDING},
                {"stack", require("k3.bench.stack").STANDING}}

  local function line_with(lines, text)
    for _, l in ipairs(lines) do if l:find(text, 1, true) then return l end end
  end

  -- A temporary file holding text (path given to rewrite one).
  local function temp_file(text, path)
    path = path or os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    return path
  end

  it("compares each figure with its target; a missing record or figure is said and not met", function()
    local doc = {
      linear = {date = "2026-12-01T00:00:00Z", commit = "abc1234", machine = "spec GPU", command = "scripts/bench linear",
                geomean_m1 = 1.31, geomean_m16 = 1.1, worst_ratio = 0.99, read_limit_frac_m1_min = 0.96},
      attn_res = {date = "2026-12-02T00:00:00Z", commit = "def5678", machine = "spec GPU",
                  t1_nb1_us = 1.5, t1_nb8_us = 2.6, t16_nb8_us = 3.5, t256_nb8_us = 11, big_floor_frac_min = 0.9,
                  generic_over_fast_max_t16 = 2.5, peer_rows = 18, peer_wins = 17},
    }
    local lines, met, total = S.standing(doc, spec, "spec.json")
    assert.equal(16, total)
    -- linear: geomean_m1, worst_ratio, read_m1 met; geomean_m16 missed; read_m16 absent.
    -- attn_res: t1_nb1, t16 (equal to its target), t256, big met; t1_nb8, generic, peers missed.
    assert.equal(7, met)
    assert.equal("targets met: 7 of 16", lines[#lines])
    assert.truthy(lines[1]:find("where k3 stands: spec.json", 1, true))
    assert.truthy(line_with(lines, "linear: 2026-12-01T00:00:00Z, commit abc1234, spec GPU"))
    assert.truthy(line_with(lines, "scripts/bench linear"))
    assert.truthy(line_with(lines, "speed-up over cuBLAS, geomean, M = 1"):find("1.31x%s+>= 1.30x%s+MET$"))
    assert.truthy(line_with(lines, "speed-up over cuBLAS, geomean, M = 16"):find("1.10x%s+>= 1.20x%s+MISSED$"))
    assert.truthy(line_with(lines, "of the read limit, worst shape, M = 16"):find("%-%s+>= 90.0%%%s+n/a$"))
    assert.truthy(line_with(lines, "T = 16, 8 blocks"):find("3.50 µs%s+<= 3.50 µs%s+MET$"))
    assert.truthy(line_with(lines, "rows faster than the Triton peer"):find("17 of 18%s+all%s+MISSED$"))
    assert.truthy(line_with(lines, "stack: no record in this file (run scripts/bench stack on the GPU)"))
    for _, l in ipairs(lines) do assert.is_nil(l:find("%s$"), l) end
  end)

  it("prints the committed file's records, every figure as the file holds it", function()
    local out, code = sh(string.format("cd %q && scripts/bench standing 2>&1", root))
    assert.equal(0, code, out)
    local doc = U.json_decode(U.read_file(root .. "/bench/summary-h200.json"))
    assert.truthy(out:find("where k3 stands: bench/summary-h200.json", 1, true), out)
    for _, name in ipairs({"linear", "attn_res", "stack"}) do
      assert.truthy(out:find(string.format("%s: %s, commit %s", name, doc[name].date, doc[name].commit), 1, true), out)
    end
    assert.truthy(out:find(string.format("%.2f µs", doc.attn_res.t1_nb8_us), 1, true), out)
    assert.truthy(out:find(string.format("%.3f ms", doc.stack.step_graph_ms_m1), 1, true), out)
    assert.truthy(out:find(string.format("%.2fx", doc.linear.geomean_m1), 1, true), out)
    local _, met, total = S.standing(doc, spec, "x")
    assert.truthy(out:find(string.format("targets met: %d of %d\n$", met, total)), out)
  end)

  it("bench/RESULTS.md opens with the same standing as the committed file gives", function()
    local out, code = sh(string.format("cd %q && scripts/bench standing --summary bench/summary-h200.json 2>&1", root))
    assert.equal(0, code, out)
    local text = U.read_file(root .. "/bench/RESULTS.md")
    local block = text:match("## Where k3 stands\n.-```\n(where k3 stands:.-\n)```\n")
    assert.truthy(block, "bench/RESULTS.md has no standing block under '## Where k3 stands'")
    assert.equal(out, block)
  end)

  it("refuses a file that is not a summary, and any benchmark named beside it", function()
    local bad = temp_file("[1, 2]")
    local out, code = sh(string.format("cd %q && scripts/bench standing --summary %s 2>&1", root, bad))
    assert.equal(1, code, out)
    assert.truthy(out:find("bench: standing: " .. bad .. " is not a JSON object", 1, true), out)
    os.remove(bad)
    out, code = sh(string.format("cd %q && scripts/bench standing --summary %s 2>&1", root, bad))
    assert.equal(1, code, out)
    assert.truthy(out:find("bench: cannot read " .. bad, 1, true), out)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir))
    out, code = sh(string.format("cd %q && scripts/bench standing --summary %s 2>&1", root, dir))
    assert.equal(1, code, out)
    assert.truthy(out:find("bench: cannot read " .. dir .. ": Is a directory", 1, true), out)
    os.execute("rmdir " .. dir)
    for _, bad_doc in ipairs({{"[]", "is not a JSON object"}, {'{"linear": 5}', "`linear` is not an object (a number)"},
                              {'{"stack": [1]}', "`stack` is not an object (a JSON array)"}}) do
      temp_file(bad_doc[1], bad)
      out, code = sh(string.format("cd %q && scripts/bench standing --summary %s 2>&1", root, bad))
      assert.equal(1, code, out)
      assert.truthy(out:find(bad_doc[2], 1, true), out)
    end
    os.remove(bad)
    -- No benchmark and no run option beside standing, in any order; --summary only with it.
    for _, args in ipairs({"standing linear", "linear standing --dry-run"}) do
      out, code = sh(string.format("cd %q && scripts/bench %s 2>&1", root, args))
      assert.equal(2, code, out)
      assert.truthy(out:find("bench: standing reads the record: name no other benchmark with it", 1, true), out)
    end
    out, code = sh(string.format("cd %q && scripts/bench standing --quick 2>&1", root))
    assert.equal(2, code, out)
    assert.truthy(out:find("bench: standing takes --summary FILE only; got --quick", 1, true), out)
    out, code = sh(string.format("cd %q && scripts/bench linear --dry-run --summary x 2>&1", root))
    assert.equal(2, code, out)
    assert.truthy(out:find("bench: --summary is standing's option", 1, true), out)
  end)

  it("a benchmark run refuses to write its record into a summary file that holds an array", function()
    local path = temp_file("[1, 2]")
    H.raises(function() S.update(path, "linear", {geomean_m1 = 1}) end,
      "bench: " .. path .. " is not a JSON object (a JSON array); not overwritten")
    assert.equal("[1, 2]", U.read_file(path))
    os.remove(path)
  end)

  it("counts no rows compared as not measured, prints a count only when whole, and more decimals at the target", function()
    local lines, met = S.standing({attn_res = {peer_wins = 0, peer_rows = 0}, stack = {eager_over_graph_m1 = 1.1549},
                                   linear = {worst_ratio = 0.9795, worst_at = "7168x4224 M=16",
                                             read_limit_frac_m1_min = 0.94996, geomean_m1 = 1.3}}, spec, "x")
    assert.equal(1, met) -- geomean_m1 at its target exactly
    assert.truthy(line_with(lines, "rows faster than the Triton peer"):find("0 of 0%s+all%s+n/a$"))
    assert.truthy(line_with(lines, "worst (shape, M)"):find("0.9795x %(7168x4224 M=16%)%s+>= 0.9800x%s+MISSED$"))
    assert.truthy(line_with(lines, "of the read limit, worst shape, M = 1"):find("94.996%%%s+>= 95.000%%%s+MISSED$"))
    assert.truthy(line_with(lines, "eager step / graph step"):find("1.1549x%s+<= 1.1500x%s+MISSED$"))
    assert.truthy(line_with(lines, "geomean, M = 1"):find("1.30x%s+>= 1.30x%s+MET$"))
    lines = S.standing({attn_res = {peer_wins = 17.5, peer_rows = 18}}, spec, "x")
    assert.truthy(line_with(lines, "rows faster than the Triton peer"):find("%-%s+all%s+n/a$"))
    H.raises(function() S.standing(U.json_decode("[1, 2]"), spec, "y.json") end, "bench: standing: y.json is not a JSON object")
  end)
end)
