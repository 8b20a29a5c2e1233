-- scripts/bench.lua — k3's benchmarks against cuBLAS, PyTorch and the copy-bandwidth floor,
-- with their targets. Run through scripts/bench; bench/README.md says how and what each
-- column means. Tables go to stdout; a progress line to stderr; CSV and JSON copies of every
-- table to --out.
local k3 = require "k3"
local U = require "k3.bench.util"
local Env = require "k3.bench.env"
local Peers = require "k3.bench.peers"
local Summary = require "k3.bench.summary"

local usage = [[
usage: scripts/bench linear|attn_res|stack|all ... [options]
       scripts/bench standing [--summary FILE]
  linear        every Kimi-K3 TP8 projection shape (+7168x7168), M = 1,2,4,8,16: plan vs cuBLAS
  attn_res      T = 1,4,16,256,4096,16384 x num_blocks = 1,4,8: decode, stream and generic,
                eager and in a graph, beside a plain Triton AttnRes kernel timed in the same command
  stack         the kimi-k3-tp8 decode step at M = 1 and 16: time per step, AttnRes/linear/rest shares
  all           linear, attn_res and stack
  standing      the committed record (bench/summary-<gpu>.json, every such file) against the
                targets, met or missed; needs the CPU build only (no GPU), measures nothing,
                exits 0 whatever the verdicts
options:
  --out DIR         where the CSV and JSON copies go (default bench/out)
  --summary FILE    standing: read this summary file instead of bench/summary-*.json
  --peers FILE      peer figures from scripts/bench-peers.py (default: the 2026-11-29 H200 figures in k3.bench.peers)
  --quick           fewer timing samples (15 graph replays instead of 50; 5 steps instead of 10)
  --dry-run         run every code path on the CPU at shrunk shapes with modelled (fake) times
  --bw GBPS         use this copy bandwidth for the floors instead of the measured one
  --ts 1,16         attn_res: only these token counts;  --nbs 1,8  only these num_blocks
  --kernels a,b     attn_res: only these kernels (decode, ring, stream, generic)
  --graph-only      attn_res: no eager figures
  --independent-delta  attn_res: each call's delta is its own input, not the previous output
  --no-triton       attn_res: do not run scripts/bench-peers.py --only attn_res_triton first
                    (without it, a GPU run times the Triton peer in the same command)
  --quiet           no progress output (K3_PROGRESS=0 likewise; a live line on a terminal,
                    a plain line every few seconds otherwise)
  -h, --help        this text]]

-- The checkout's root (this file is <root>/scripts/bench.lua).
local function repo_root()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local root = src:gsub("/?scripts/bench%.lua$", "")
  return root ~= "" and root or "."
end

local function die(msg)
  io.stderr:write("bench: ", msg, "\n", usage, "\n")
  os.exit(2)
end

local function parse(args)
  local o = {out = "bench/out", subs = {}, sub_opts = {}}
  local given = {} -- the options given, for standing's check
  for key, value, a in require("k3.cli").options(args, die) do
    if key and key:sub(1, 1) == "-" and key ~= "-h" and key ~= "--help" then given[#given + 1] = key end
    if key == "--out" then o.out = value()
    elseif key == "--peers" then o.peers = value()
    elseif key == "--summary" then o.summary = value()
    elseif key == "--quick" then o.quick = true
    elseif key == "--dry-run" then o.dry = true
    elseif key == "--quiet" then o.quiet = true
    elseif key == "--ts" or key == "--nbs" then
      local list = {}
      for v in value():gmatch("[^,]+") do
        local n = math.tointeger(tonumber(v))
        if not n or n < (key == "--ts" and 1 or 0) then die(key .. " takes a comma list of integers") end
        list[#list + 1] = n
      end
      o.sub_opts[key == "--ts" and "ts" or "nbs"] = list
    elseif key == "--kernels" then
      local list = {}
      for v in value():gmatch("[^,]+") do
        if v ~= "decode" and v ~= "ring" and v ~= "stream" and v ~= "generic" then
          die("--kernels: unknown kernel '" .. v .. "' (decode, ring, stream, generic)")
        end
        list[#list + 1] = v
      end
      o.sub_opts.kernels = list
    elseif key == "--graph-only" then o.sub_opts.graph_only = true
    elseif key == "--independent-delta" then o.sub_opts.independent_delta = true
    elseif key == "--no-triton" then o.no_triton = true
    elseif key == "--bw" then
      o.bw = tonumber(value())
      if not o.bw or o.bw <= 0 then die("--bw must be a positive number (GB/s)") end
    elseif key == "-h" or key == "--help" then print(usage) os.exit(0)
    elseif a:sub(1, 1) == "-" then die("unknown option '" .. a .. "'")
    elseif a == "all" then
      for _, s in ipairs({"linear", "attn_res", "stack"}) do o.subs[#o.subs + 1] = s end
    elseif a == "linear" or a == "attn_res" or a == "stack" or a == "standing" then o.subs[#o.subs + 1] = a
    else die("unknown benchmark '" .. a .. "'") end
  end
  if #o.subs == 0 then die("name a benchmark: linear, attn_res, stack or all (or standing)") end
  for _, sub in ipairs(o.subs) do if sub == "standing" then o.standing = true end end
  if o.standing then
    -- standing reads the record and measures nothing: no benchmark and no run option beside it.
    if #o.subs > 1 then die("standing reads the record: name no other benchmark with it") end
    for _, k in ipairs(given) do
      if k ~= "--summary" and k ~= "--quiet" then die("standing takes --summary FILE only; got " .. k) end
    end
  elseif o.summary then
    die("--summary is standing's option (scripts/bench standing --summary FILE)")
  end
  -- Each benchmark once, in the order given.
  local seen, subs = {}, {}
  for _, s in ipairs(o.subs) do
    if not seen[s] then seen[s] = true; subs[#subs + 1] = s end
  end
  o.subs = subs
  return o
end

local MODULES = {
  linear = "k3.bench.linear", attn_res = "k3.bench.attn_res", stack = "k3.bench.stack",
}

-- `scripts/bench standing`: each summary file's records against the modules' STANDING tables.
local function standing(o)
  local root = repo_root()
  local paths = {}
  if o.summary then
    paths[1] = o.summary
  else
    -- (a dry run's summary-dry-run.json, written where --out says, is not a record)
    local p = io.popen("ls " .. U.shell_quote(root .. "/bench") .. "/summary-*.json 2>/dev/null")
    for line in p:lines() do
      if not line:match("/summary%-dry%-run%.json$") then paths[#paths + 1] = line end
    end
    p:close()
    if #paths == 0 then
      error(string.format("bench: standing: no bench/summary-*.json in %s (a GPU run of " ..
                          "scripts/bench writes it)", root), 0)
    end
  end
  local benches = {}
  for _, name in ipairs({"linear", "attn_res", "stack"}) do
    benches[#benches + 1] = {name, require(MODULES[name]).STANDING}
  end
  for i, path in ipairs(paths) do
    local text = U.read_file(path)
    local ok, doc = pcall(U.json_decode, text)
    if not ok then error(string.format("bench: standing: %s is not a JSON object (%s)", path, tostring(doc)), 0) end
    if i > 1 then print("") end
    local shown = path:sub(1, #root + 1) == root .. "/" and path:sub(#root + 2) or path
    for _, line in ipairs((Summary.standing(doc, benches, shown))) do print(line) end
  end
end

local function main(args)
  local o = parse(args)
  if o.standing then return standing(o) end
  U.quiet = o.quiet or false
  local peers = Peers.load(o.peers)
  U.mkdir_p(o.out)
  local has_attn = false
  for _, s in ipairs(o.subs) do if s == "attn_res" then has_attn = true end end
  if has_attn and not o.dry and not o.no_triton then
    -- The Triton peer, timed by the GPU machine's Python in this same command.
    local file = o.out .. "/peers-attn_res_triton.json"
    local cmd = string.format("python3 scripts/bench-peers.py --only attn_res_triton --out %s%s%s%s >&2",
                              U.shell_quote(file), o.quick and " --quick" or "",
                              o.sub_opts.ts and (" --ts " .. table.concat(o.sub_opts.ts, ",")) or "",
                              o.sub_opts.nbs and (" --nbs " .. table.concat(o.sub_opts.nbs, ",")) or "")
    U.progress("attn_res: the Triton peer (%s)", cmd)
    local okp = os.execute(cmd)
    U.progress_done()
    if okp then
      peers = Peers.merge(peers, Peers.load(file))
    else
      peers.notes[#peers.notes + 1] = "scripts/bench-peers.py --only attn_res_triton failed; " ..
                                      "the Triton figures are the 2026-11-29 ones"
    end
  end
  local env = Env.new{dry = o.dry, quick = o.quick, bw = o.bw}
  U.progress("copy bandwidth: 2 GiB device-to-device copy")
  env:measure_copy_bandwidth()
  U.progress_done()
  local cmd = "scripts/bench " .. table.concat(args, " ")
  print(string.format("k3 %s bench: %s  (%s)", k3.version, cmd, U.date()))
  if peers.copy_GBps then
    print(string.format("bench-peers.py measured copy bandwidth %.0f GB/s in its own run", peers.copy_GBps))
  end
  for _, n in ipairs(peers.notes) do print("peers note: " .. n) end
  print("")
  local all = {meta = env:meta(), command = cmd, peers_source = peers.source}
  U.write_file(o.out .. "/copy.json", U.json_encode({meta = env:meta(), copy = env.copy}) .. "\n")
  local failed = {}
  -- results.md: every table of this run in code blocks, ready to paste into bench/RESULTS.md.
  local md = {string.format("<!-- written by %s on %s -->", cmd, U.date()),
              string.format("Command: `%s`  ", cmd), string.format("Date: %s  ", U.date()),
              string.format("Copy bandwidth: %.0f GB/s measured (floors use %.0f GB/s)  ",
                            env.copy.measured_GBps, env.bw),
              string.format("Peers: %s", peers.source), ""}
  for _, sub in ipairs(o.subs) do
    local mod = require(MODULES[sub])
    local ok, res = xpcall(mod.run, debug.traceback, env, peers, o.sub_opts)
    U.progress_done()
    if not ok then
      io.stderr:write("bench: ", sub, " failed: ", tostring(res), "\n")
      failed[#failed + 1] = sub
      all[sub] = {error = tostring(res)}
    else
      for _, line in ipairs(res.lines) do print(line) end
      print("")
      local rows = res.rows
      if sub == "stack" then
        -- ops (a table) does not fit a CSV cell; the JSON keeps it.
        rows = {}
        for i, r in ipairs(res.rows) do rows[i] = r end
      end
      U.write_csv(string.format("%s/%s.csv", o.out, sub), mod.CSV_KEYS, rows)
      local doc = {meta = env:meta(), command = cmd, peers_source = peers.source,
                   rows = res.rows, summary = res.summary, table = res.lines}
      U.write_file(string.format("%s/%s.json", o.out, sub), U.json_encode(doc) .. "\n")
      U.write_file(string.format("%s/%s.txt", o.out, sub), table.concat(res.lines, "\n") .. "\n")
      all[sub] = {summary = res.summary}
      if mod.summary_object then
        -- bench/summary-<gpu>.json (committed) on a GPU; a dry run's copy stays in --out.
        local root = repo_root()
        local path = o.dry and (o.out .. "/summary-dry-run.json")
                     or string.format("%s/bench/summary-%s.json", root, Summary.gpu_tag(res.machine))
        -- nil: a partial run (attn_res with --ts, --kernels, ...) leaves the file alone.
        local obj = mod.summary_object(res, cmd, Summary.commit(root))
        if obj then
          Summary.update(path, sub, obj)
          print(string.format("(%s: its object in %s)", sub, path))
        end
      end
      md[#md + 1] = "### " .. sub
      md[#md + 1] = ""
      md[#md + 1] = "```"
      for _, line in ipairs(res.lines) do md[#md + 1] = line end
      md[#md + 1] = "```"
      md[#md + 1] = ""
      print(string.format("(%s: %s/%s.csv, %s.json, %s.txt)", sub, o.out, sub, sub, sub))
      print("")
    end
    collectgarbage()
  end
  U.write_file(o.out .. "/summary.json", U.json_encode(all) .. "\n")
  U.write_file(o.out .. "/results.md", table.concat(md, "\n") .. "\n")
  print(string.format("(all tables for bench/RESULTS.md: %s/results.md)", o.out))
  if #failed > 0 then
    io.stderr:write("bench: failed: ", table.concat(failed, ", "), "\n")
    os.exit(1)
  end
end

local ok, err = xpcall(main, function(e)
  if type(e) == "string" and e:match("^bench: ") then return e end
  return debug.traceback(e)
end, {...})
if not ok then
  U.progress_done()
  local msg = tostring(err):gsub("^bench: ", "")
  io.stderr:write("bench: ", msg, "\n")
  os.exit(1)
end
