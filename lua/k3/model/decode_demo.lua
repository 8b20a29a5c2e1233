-- The main job behind `make demo`: a Kimi-K3-shaped stack run for decode batches M, with
-- per M the time per step, fidelity against the fp64 twin and the kernels that served it,
-- then every dispatch decline with its count. On a CUDA device the step also runs as a CUDA
-- graph (k3.cuda_graph; the default, opts.eager turns it off): both times are shown, with the
-- graph's kernel count and whether its output has the eager step's bits. scripts/demo.lua is the command line around it;
-- specs call run() directly and compare its results.
local k3 = require "k3"
local kimi = require "k3.model.kimi_k3"
local cli = require "k3.cli"

local demo = {}

-- Wall-clock seconds, monotonic.
local wall = k3.clock

local function cuda_available() return k3.backends().cuda.available end

-- The largest decode batch M the demos take: M = 1..16, the batches the low-latency plans
-- and the skinny kernel serve (README, "The main job").
demo.max_m = 16

-- Defaults: kimi-k3-tp8 on a CUDA device when there is one, tiny on the CPU otherwise.
function demo.defaults()
  local gpu = cuda_available()
  local m = {}
  for i = 1, demo.max_m do m[i] = i end
  return {config = gpu and "kimi-k3-tp8" or "tiny", device = gpu and "cuda" or "cpu",
          steps = gpu and 20 or 5, m = m, seed = 1234}
end

-- ||a - b|| / ||b|| and ||a|| / ||b|| over all elements (both read back as f64).
function demo.compare(y, ref)
  local a, b = y:to("cpu"):to("f64"):totable(), ref:to("cpu"):to("f64"):totable()
  local d2, b2, a2 = 0, 0, 0
  for i = 1, #a do
    local ra, rb = a[i], b[i]
    for j = 1, #ra do
      local x, r = ra[j], rb[j]
      d2, a2, b2 = d2 + (x - r) ^ 2, a2 + x * x, b2 + r * r
    end
  end
  return math.sqrt(d2 / b2), math.sqrt(a2 / b2)
end

local function finite(t)
  for _, row in ipairs(t:to("cpu"):to("f64"):totable()) do
    for _, v in ipairs(row) do
      if v ~= v or v == math.huge or v == -math.huge then return false end
    end
  end
  return true
end
demo.finite = finite

local function count_kernels(trace)
  local per, declines = {}, {}
  for _, r in ipairs(trace) do
    if r.kernel and r.kernel ~= "" then per[r.kernel] = (per[r.kernel] or 0) + 1 end
    for _, d in ipairs(r.declined or {}) do
      local key = d.kernel .. ": " .. d.reason
      declines[key] = (declines[key] or 0) + 1
    end
  end
  return per, declines
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

-- Runs the demo. opts: config (name or table), device, dtype ("bf16"), steps, m (list),
-- seed, weights ({name = tensor}: used instead of generating), save_weights (path),
-- quiet, reporter (a k3.cli.progress reporter; default one on stderr, none when quiet: a live
-- line on a terminal, occasional plain lines in a log), eager (no graph on a CUDA device).
-- Returns {config =, graph = bool, rows = {{m =, ms = (eager), graph_ms =, graph_kernels =,
-- same_bits = (graph output == eager output), rel_err =, cosine =, norm_ratio =,
-- finite =, kernels = {name = calls per step}, output = tensor}, ...},
-- declines = {["kernel: reason"] = count}, kernels = {name = count}, weights =, stack =}.
function demo.run(opts)
  local d = demo.defaults()
  opts = opts or {}
  for k, v in pairs(d) do if opts[k] == nil then opts[k] = v end end
  local cfg = type(opts.config) == "table" and opts.config or kimi.config(opts.config)
  local reporter = opts.reporter or cli.progress{quiet = opts.quiet}
  local device, dtype = opts.device, opts.dtype or "bf16"
  local mmax = 0
  for _, m in ipairs(opts.m) do mmax = math.max(mmax, m) end

  local weights = opts.weights
  local source
  if weights then
    source = opts.weights_source or "given table"
    -- Loaded tensors live on the CPU; move each once (shared tensors stay shared).
    local moved, w2 = {}, {}
    local dev = kimi.canonical_device(device)
    for name, t in pairs(weights) do
      local c = moved[t]
      if not c then
        c = t
        if c:device() ~= dev then c = c:to(dev) end
        if c:dtype() ~= dtype then c = c:to(dtype) end
        moved[t] = c
      end
      w2[name] = c
    end
    weights = w2
  else
    source = string.format("generated, seed %d", opts.seed)
    weights = kimi.generate_weights(cfg, {seed = opts.seed, dtype = dtype, device = device,
      progress = function(n, total)
        if n % 50 == 0 or n == total then reporter:update("generating weights %d/%d", n, total) end
      end})
  end
  if opts.save_weights then
    reporter:update("saving weights to %s", opts.save_weights)
    k3.save_safetensors(opts.save_weights, weights)
  end
  local stack = kimi.build(cfg, weights, {dtype = dtype, device = device})

  -- The fp64 twin runs once on the last step's mmax rows; rows are independent tokens, so
  -- the first M rows of it are the reference of every M.
  local steps = opts.steps
  -- The checked step's input does not depend on --steps, so runs compare across options.
  local x_last = kimi.embedding(cfg, mmax, {seed = opts.seed, step = 0, dtype = dtype,
                                            device = device})
  reporter:update("fp64 reference run (%d token%s, %d layers)", mmax, mmax == 1 and "" or "s", cfg.num_layers)
  local ref = stack:reference_forward(x_last)

  -- The graph: on a CUDA device unless opts.eager. Fidelity is then the graph's output's.
  local use_graph = not opts.eager and kimi.canonical_device(device):match("^cuda") ~= nil
  local result = {config = cfg, device = device, dtype = dtype, steps = steps, graph = use_graph,
                  weights_source = source, rows = {}, declines = {}, kernels = {},
                  weights = weights, stack = stack, reference = ref}
  local xs = {}
  for s = 1, steps - 1 do
    xs[s] = kimi.embedding(cfg, mmax, {seed = opts.seed, step = s, dtype = dtype, device = device})
  end
  xs[steps] = x_last
  k3.stats_reset()
  for _, m in ipairs(opts.m) do
    reporter:update("M=%-2d warm-up (traced)", m)
    -- One traced step shows which kernel served each op and why others declined.
    local y0
    local trace = k3.trace(function() y0 = stack:forward(xs[1]:narrow(1, 1, m)) end)
    y0:free()
    local per = count_kernels(trace)
    k3.synchronize()
    local t0 = wall()
    local y
    for s = 1, steps do
      if y then y:free() end
      y = stack:forward(xs[s]:narrow(1, 1, m))
      if s % 5 == 0 or s == steps then reporter:update("M=%-2d step %d/%d", m, s, steps) end
    end
    k3.synchronize()
    local ms = (wall() - t0) * 1000 / steps
    local row = {m = m, ms = ms, kernels = per}
    local out = y
    if use_graph then
      -- The same steps replayed from a CUDA graph: each step copies its input into the
      -- graph's static input, then replays (timed like the eager loop, host time included).
      reporter:update("M=%-2d capturing the step (k3.cuda_graph)", m)
      local xg = k3.empty({m, cfg.hidden_size}, {dtype = dtype, device = device})
      local yg = k3.empty({m, cfg.hidden_size}, {dtype = dtype, device = device})
      xg:copy(xs[1]:narrow(1, 1, m))
      local g <close> = k3.cuda_graph(function()
        local o = stack:forward(xg)
        yg:copy(o)
        o:free()
      end)
      row.graph_kernels = g:kernels()
      k3.synchronize()
      local t1 = wall()
      for s = 1, steps do
        xg:copy(xs[s]:narrow(1, 1, m))
        g:replay()
        if s % 5 == 0 or s == steps then reporter:update("M=%-2d graph step %d/%d", m, s, steps) end
      end
      k3.synchronize()
      row.graph_ms = (wall() - t1) * 1000 / steps
      row.same_bits = k3.max_abs_diff(yg, y) == 0
      xg:free()
      y:free()
      out = yg
    end
    local r = ref:narrow(1, 1, m)
    local rel, ratio = demo.compare(out, r)
    row.rel_err, row.norm_ratio = rel, ratio
    row.cosine = k3.cosine(out:to("cpu"):to("f64"), r)
    row.finite = finite(out)
    row.output = out
    result.rows[#result.rows + 1] = row
    collectgarbage("step")
  end
  local st = k3.stats()
  result.kernels, result.declines = st.kernels or {}, st.declines or {}
  reporter:done()
  for s = 1, steps - 1 do xs[s]:free() end
  return result
end

local function kernel_cell(per)
  local parts = {}
  for _, k in ipairs(sorted_keys(per)) do parts[#parts + 1] = string.format("%s x%d", k, per[k]) end
  return table.concat(parts, ", ")
end

-- The report as text (what `make demo` prints).
function demo.format(res)
  local cfg = res.config
  local out = {}
  local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  p("k3 demo: Kimi-K3 decode stack, config %s on %s, %s", cfg.name or "?", res.device, res.dtype)
  p("  hidden %d, %d layers, AttnRes block size %d (%d sealed blocks), MLP %d, weights %s",
    cfg.hidden_size, cfg.num_layers, cfg.block_size,
    (cfg.num_layers + cfg.block_size - 1) // cfg.block_size, cfg.intermediate_size,
    res.weights_source)
  p("  %d decode step%s per M; fidelity: final hidden state of the last step vs the fp64 run", res.steps,
    res.steps == 1 and "" or "s")
  if res.graph then
    p("  the step runs as a CUDA graph (k3.cuda_graph; --eager for the eager step only): 'graph' and")
    p("  'eager' are wall ms per step (input copy and replay / Stack:forward), 'nodes' the graph's")
    p("  kernels per step, 'bits' whether its output equals the eager step's bit for bit")
    p("")
    p("%3s  %10s  %10s  %6s  %5s  %11s  %10s  %s", "M", "graph ms", "eager ms", "nodes", "bits",
      "rel err", "cosine", "kernels (calls per step)")
    for _, r in ipairs(res.rows) do
      p("%3d  %10.3f  %10.3f  %6d  %5s  %11.3e  %10.7f  %s%s", r.m, r.graph_ms, r.ms, r.graph_kernels,
        r.same_bits and "same" or "DIFF", r.rel_err, r.cosine, kernel_cell(r.kernels),
        r.finite and "" or "  NON-FINITE")
    end
  else
    p("")
    p("%3s  %10s  %11s  %10s  %s", "M", "ms/step", "rel err", "cosine", "kernels (calls per step)")
    for _, r in ipairs(res.rows) do
      p("%3d  %10.3f  %11.3e  %10.7f  %s%s", r.m, r.ms, r.rel_err, r.cosine, kernel_cell(r.kernels),
        r.finite and "" or "  NON-FINITE")
    end
  end
  p("")
  p("dispatch summary over all timed and traced steps:")
  for _, k in ipairs(sorted_keys(res.kernels)) do p("  %-28s served %d calls", k, res.kernels[k]) end
  local ds = sorted_keys(res.declines)
  if #ds == 0 then
    p("  no declines")
  else
    p("declines (kernel: reason, times):")
    table.sort(ds, function(a, b)
      if res.declines[a] ~= res.declines[b] then return res.declines[a] > res.declines[b] end
      return a < b
    end)
    for _, k in ipairs(ds) do p("  %8d  %s", res.declines[k], k) end
  end
  return table.concat(out, "\n")
end

return demo
