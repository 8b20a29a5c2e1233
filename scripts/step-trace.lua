-- scripts/step-trace.lua — the two halves of scripts/step-trace (run that, not this):
--
--   step-trace.lua run [--m M] [--replays N] [--config NAME] [--json FILE]
--     builds the stack of config NAME (default kimi-k3-tp8: lua/k3/model/kimi_k3.lua, seeded
--     random bf16 weights as `scripts/bench stack` makes them), captures one decode step of M
--     tokens (default 1) with k3.cuda_graph, replays it 3 times to warm up and N times (default
--     20) timed with CUDA events (k3.cuda_time, one replay per sample), and writes to FILE the
--     median step time and a layer's linear calls in order (N x K, the kernel its method
--     picks). Under build/libk3-kernel-trace.so (tools/kernel_trace.cpp, loaded by the CUDA
--     driver through CUDA_INJECTION64_PATH) every kernel of every replay is recorded.
--
--   step-trace.lua report TRACE.csv RUN.json [UNTRACED.json]
--     reads the tracer's CSV, takes the graph launched most often (the step), drops its first
--     3 launches (the warm-up), and prints, per launch kind (kernel name and grid), its calls
--     per step and the medians over replays of: its duration (end - start), its start relative
--     to the end of the kernel before it (negative: it started earlier, under programmatic
--     dependent launch; the step's first kernel has none), and the time by which it moves the
--     step's end (end minus the latest end before it, the first kernel's whole duration: the
--     sum over a step is the step's span). Then the first layer's kernels in order. With UNTRACED.json, the untraced step
--     time beside the traced one: the trace's own cost.
local k3 = require "k3"

local function die(msg)
  io.stderr:write("step-trace: ", msg, "\n")
  os.exit(2)
end

local function opts_of(argv, first)
  local o = {m = 1, replays = 20, config = "kimi-k3-tp8"}
  local i = first
  while i <= #argv do
    local a, v = argv[i], argv[i + 1]
    if a == "--m" then o.m = math.tointeger(tonumber(v)) or die("--m takes a token count")
    elseif a == "--replays" then o.replays = math.tointeger(tonumber(v)) or die("--replays takes a count")
    elseif a == "--config" then o.config = v or die("--config takes a name")
    elseif a == "--json" then o.json = v or die("--json takes a file")
    else die("unknown option " .. tostring(a)) end
    i = i + 2
  end
  if o.m < 1 or o.m > 64 then die("--m must be 1..64; got " .. o.m) end
  if o.replays < 1 then die("--replays must be >= 1; got " .. o.replays) end
  return o
end

local function run(o)
  local json = require "dkjson"
  local kimi = require "k3.model.kimi_k3"
  local nn = require "k3.nn"
  local cfg = kimi.config(o.config)
  io.stderr:write(string.format("step-trace: %s, M = %d: generating weights\n", o.config, o.m))
  local weights = kimi.generate_weights(cfg, {seed = 1234, dtype = "bf16", device = "cuda"})
  local stack = kimi.build(cfg, weights, {dtype = "bf16", device = "cuda"})
  local x = kimi.embedding(cfg, o.m, {seed = 1234, step = 1, dtype = "bf16", device = "cuda"})
  local y = k3.empty({o.m, cfg.hidden_size}, {dtype = "bf16", device = "cuda"})
  -- the linear calls in order, as the capture makes them
  local calls, orig = {}, nn.Linear.__call
  nn.Linear.__call = function(self, xx, co)
    -- the kernel the call's method picks (its explain writes nothing and launches nothing)
    local ok_e, r = pcall(function() return self.method:explain(xx, self.weight, self.bias, co) end)
    calls[#calls + 1] = string.format("%dx%d %s%s", self.weight:size(1), self.weight:size(2),
      ok_e and r and r.kernel or "?", co and co.epilogue and (" +" .. co.epilogue) or
                                      co and co.prologue and (" " .. co.prologue .. "+") or "")
    return orig(self, xx, co)
  end
  local ok, g = pcall(k3.cuda_graph, function()
    local out = stack:forward(x)
    y:copy(out)
    out:free()
  end)
  nn.Linear.__call = orig
  if not ok then die("capture failed: " .. tostring(g)) end
  local per_layer = #calls // cfg.num_layers
  local layer_calls = {}
  for i = 1, per_layer do layer_calls[i] = calls[per_layer + i] end -- layer 1 (after layer 0)
  io.stderr:write(string.format("step-trace: %d kernels a step; %d replays\n", g:kernels(), o.replays))
  g:replay(3)
  local us, st = k3.cuda_time(function() g:replay() end, {iters = o.replays, warmup = 0, device = 0})
  local res = {config = o.config, M = o.m, kernels = g:kernels(), step_us = us, step_min_us = st.min,
               replays = o.replays, warmup = 3, linear_calls = #calls, layer_linear_calls = layer_calls,
               layers = cfg.num_layers}
  g:free()
  k3.synchronize()
  if o.json then
    local f = assert(io.open(o.json, "w"))
    f:write(json.encode(res), "\n")
    f:close()
  end
  print(string.format("step-trace: M = %d, %d kernels, step %.1f µs (median of %d replays)",
                      o.m, res.kernels, us, o.replays))
  -- the tracer's worker flushes every 100 ms: give it the last round before exiting
  local t0 = os.clock()
  while os.clock() - t0 < 0.3 do end
end

-- ---- report --------------------------------------------------------------------------------

local function median(t)
  if #t == 0 then return 0 / 0 end
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

local function read_csv(path)
  local f = io.open(path) or die("no trace " .. path .. " (did CUPTI start? see its stderr)")
  local header = f:read("l")
  if not header or not header:find("^graph_id,") then die(path .. ": not a kernel-trace CSV") end
  local rows = {}
  for line in f:lines() do
    local gid, nid, cid, s, e, grid, block, cluster, regs, smem, name =
      line:match("^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(.*)$")
    if gid then
      rows[#rows + 1] = {graph = tonumber(gid), node = tonumber(nid), corr = tonumber(cid),
                         s = tonumber(s), e = tonumber(e), grid = tonumber(grid),
                         block = tonumber(block), cluster = tonumber(cluster),
                         regs = tonumber(regs), smem = tonumber(smem), name = name}
    end
  end
  f:close()
  return rows
end

-- "k3_skinny_kernel<512; 16; 8; 1; false; 2>" [grid x block] -> itself; with `short`, cuBLAS /
-- CUTLASS names cut to 60 characters (the launch kinds are told apart by the whole label).
local function label(r, short)
  local n = r.name:gsub("^%(anonymous namespace%)::", ""):gsub("k3ar::", "")
  if short and #n > 60 then n = n:sub(1, 57) .. "..." end
  return string.format("%s [%d x %d]", n, r.grid, r.block)
end

local function report(trace, runjson, untraced)
  local json = require "dkjson"
  local function load(p)
    local f = io.open(p) or die("no " .. p)
    local v = json.decode(f:read("a"))
    f:close()
    return v or die(p .. ": not JSON")
  end
  local run_res = load(runjson)
  local rows = read_csv(trace)
  -- the step: the graph with the most launches (one correlation id per launch)
  local launches = {}
  for _, r in ipairs(rows) do
    if r.graph ~= 0 then
      local g = launches[r.graph] or {}
      launches[r.graph] = g
      g[r.corr] = g[r.corr] or {}
      table.insert(g[r.corr], r)
    end
  end
  local best, best_n = nil, 0
  for gid, g in pairs(launches) do
    local n = 0
    for _ in pairs(g) do n = n + 1 end
    if n > best_n then best, best_n = gid, n end
  end
  if not best then die(trace .. ": no graph kernels recorded") end
  local reps = {}
  for _, ks in pairs(launches[best]) do reps[#reps + 1] = ks end
  table.sort(reps, function(a, b) return a[1].corr < b[1].corr end)
  local skip = math.min(run_res.warmup or 3, #reps - 1)
  local kinds, order, spans, per = {}, {}, {}, nil
  for ri = skip + 1, #reps do
    local ks = reps[ri]
    table.sort(ks, function(a, b) return a.s < b.s or (a.s == b.s and a.node < b.node) end)
    per = per or #ks
    if #ks ~= per then
      die(string.format("launch %d of the step's graph has %d kernels, launch %d has %d", ri, #ks,
                        skip + 1, per))
    end
    -- frontier: the latest end so far; the span ends at the latest end of all, not the last
    -- start's (branches of a graph that is not a chain, a kernel ending before an earlier one)
    local frontier = ks[1].s
    local step = {}
    for i, r in ipairs(ks) do
      local l = label(r)
      local k = kinds[l]
      if not k then
        k = {label = l, short = label(r, true), dur = {}, start = {}, adv = {}, per_step = {}, regs = r.regs, smem = r.smem,
             cluster = r.cluster}
        kinds[l] = k
        order[#order + 1] = l
      end
      table.insert(k.dur, (r.e - r.s) / 1e3)
      -- the step's first kernel has no previous one
      if i > 1 then table.insert(k.start, (r.s - ks[i - 1].e) / 1e3) end
      local adv = math.max(0, r.e - frontier) / 1e3
      table.insert(k.adv, adv)
      frontier = math.max(frontier, r.e)
      step[l] = (step[l] or 0) + adv
    end
    for l, v in pairs(step) do table.insert(kinds[l].per_step, v) end
    spans[#spans + 1] = (frontier - ks[1].s) / 1e3
  end
  local span = median(spans)
  print(string.format("step-trace: %s, M = %d: %d kernels a step, %d replays traced (first %d dropped)",
                      run_res.config, run_res.M, per, #spans, skip))
  print(string.format("  traced step span (first start to last end), median: %.1f µs", span))
  print(string.format("  traced step, CUDA events around a replay:          %.1f µs", run_res.step_us))
  if untraced then
    local u = load(untraced)
    print(string.format("  untraced step, CUDA events around a replay:        %.1f µs (the trace adds %.1f%%)",
                        u.step_us, 100 * (run_res.step_us / u.step_us - 1)))
  end
  print("")
  print("per launch kind (name [CTAs x threads]); medians over the replays, µs:")
  print("  calls  duration  start-prev_end  moves end  per step  share  regs  smem  cl  kind")
  table.sort(order, function(a, b) return median(kinds[a].per_step) > median(kinds[b].per_step) end)
  -- a shortened name two kinds share is printed whole
  local shorts = {}
  for _, l in ipairs(order) do shorts[kinds[l].short] = (shorts[kinds[l].short] or 0) + 1 end
  for _, l in ipairs(order) do
    local k = kinds[l]
    local calls = #k.dur // #spans
    local ps = median(k.per_step)
    -- a kind only the step's first kernel has has no start against a previous end
    local st = #k.start > 0 and string.format("%.2f", median(k.start)) or "-"
    print(string.format("  %5d  %8.2f  %14s  %9.2f  %8.1f  %4.1f%%  %4d  %5d  %2d  %s", calls,
      median(k.dur), st, median(k.adv), ps, 100 * ps / span, k.regs, k.smem, k.cluster,
      shorts[k.short] > 1 and l or k.short))
  end
  -- the first two layers' kernels in order (the step's first kernels included), last replay
  local ks = reps[#reps]
  local n = math.min(#ks, 2 * -(-per // math.max(1, run_res.layers or 1)))
  print("")
  print("a layer's linear calls in order: " .. table.concat(run_res.layer_linear_calls or {}, ", "))
  print(string.format("kernels 1..%d of the last replay (about two layers), µs from the step's start:", n))
  print("      start       end  duration  start-prev_end  kind")
  for i = 1, n do
    local r = ks[i]
    print(string.format("  %9.2f %9.2f  %8.2f  %14s  %s", (r.s - ks[1].s) / 1e3, (r.e - ks[1].s) / 1e3,
      (r.e - r.s) / 1e3, i > 1 and string.format("%.2f", (r.s - ks[i - 1].e) / 1e3) or "-", label(r, true)))
  end
end

local argv = {...}
local mode = argv[1]
if mode == "run" then run(opts_of(argv, 2))
elseif mode == "report" then
  if not argv[2] or not argv[3] then die("usage: step-trace.lua report TRACE.csv RUN.json [UNTRACED.json]") end
  report(argv[2], argv[3], argv[4])
else
  die("usage: step-trace.lua run|report ... (scripts/step-trace runs both)")
end
