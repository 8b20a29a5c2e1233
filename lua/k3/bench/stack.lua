-- k3.bench.stack — `scripts/bench stack`: one decode step of the kimi-k3-tp8 stack
-- (lua/k3/model/kimi_k3.lua: 93 layers, hidden 7168, TP8 projections, AttnRes stream) at
-- M = 1 and 16 tokens, and where its time goes.
--
-- Method (printed with the table):
--   1. step: Stack:forward(x) timed with CUDA events around the whole step, eager, exactly as
--      a user runs it (median of several steps after a warm-up step); and the host's part of
--      it: the clock from the call of Stack:forward to its return, the device drained before
--      (best of three), so an eager step slower than its graph shows whether the host is why.
--   2. one step is run with nn.Linear's call and k3.attn_res wrapped, recording every linear
--      call (its method, weight, M, K) and every AttnRes read (its num_blocks, write_block,
--      weights); k3.trace of a step counts the other ops.
--   3. the recorded linear calls are replayed back to back (same methods and weights, so the
--      same kernels and the same weight addresses as in the step; random inputs, preallocated
--      outputs), likewise the AttnRes reads (the step's own weights, a scratch stream buffer):
--      each replay inside one CUDA graph (device time, no launch gaps) and eager.
--   4. the step as a user captures it: k3.cuda_graph around Stack:forward into a static
--      output, timed by replay (events around each replay); its kernel count is the graph's
--      kernel nodes. Then the same capture with every AttnRes read replaced by a plain copy of
--      its prefix: AttnRes's marginal cost is (step - that step) / step, the only share that
--      means something once kernels overlap (PDL).
--   5. the read limit of the step's bytes: tools/read_limit.cuh's read-only kernel over exactly
--      that many bytes, one read (scripts/read-limit --single), in the same run.
--   shares = replay-in-graph / step-in-graph when the step was captured, else / eager step
--   (then host launch overhead lands in "rest"); rest = step - linear - attn_res.
local k3 = require "k3"
local U = require "k3.bench.util"
local Env = require "k3.bench.env"

local S = {}
S.MS = {1, 16}
-- A read-only pass cannot beat the memory: an H200's HBM peak (4.8 TB/s) is about 1.1x its
-- measured copy bandwidth (4.2-4.3 TB/s, read + written). A read limit faster than this many
-- times the copy bandwidth is a measurement error and is refused.
S.READ_BW_MAX = 1.15
-- The targets of the decode step (a benchmark, never a timed test): kimi-k3-tp8 on one H200,
-- in a graph, about 83% / 79% of the read limit; AttnRes's marginal cost; eager vs graph.
S.TARGETS = {
  step_graph_ms_m1 = 6.0,
  step_graph_ms_m16 = 6.3,
  attn_res_share_m1 = 0.05,  -- the graph step's marginal cost of AttnRes, M = 1
  eager_over_graph_m1 = 1.15,
}

-- The `stack` record's figures against S.TARGETS, for `scripts/bench standing`
-- (k3.bench.summary.standing): {key in the record, label, op, target, format}.
S.STANDING = {
  {"step_graph_ms_m1", "decode step in a graph, M = 1", "<=", S.TARGETS.step_graph_ms_m1, "ms"},
  {"step_graph_ms_m16", "decode step in a graph, M = 16", "<=", S.TARGETS.step_graph_ms_m16, "ms"},
  {"attn_res_share_m1", "AttnRes marginal cost of the step, M = 1", "<=", S.TARGETS.attn_res_share_m1, "pct"},
  {"eager_over_graph_m1", "eager step / graph step, M = 1", "<=", S.TARGETS.eager_over_graph_m1, "x"},
}

local function sum(t) local s = 0 for _, v in ipairs(t) do s = s + v end return s end

-- Runs one step with the wrappers in place; returns {linear = {...}, attn = {...}}.
local function record_step(stack, x)
  local nn = require "k3.nn"
  local rec = {linear = {}, attn = {}}
  local orig_call, orig_attn = nn.Linear.__call, k3.attn_res
  -- x is [M, K], or [M, 2K] (gate | up) with a silu_mul prologue; the result is [M, N], or
  -- [M, N / 2] with gate_up's silu_mul epilogue; the call's options (a prologue and what it
  -- needs: norm_weight, eps; an epilogue) are replayed as given.
  nn.Linear.__call = function(self, xx, o)
    local opts = {}
    for k, v in pairs(o or {}) do opts[k] = v end
    rec.linear[#rec.linear + 1] = {method = self.method, weight = self.weight, bias = self.bias,
                                   M = xx:size(1), K = self.weight:size(2), XK = xx:size(2),
                                   N = self.weight:size(1), opts = opts,
                                   YN = opts.epilogue == "silu_mul" and self.weight:size(1) // 2
                                        or self.weight:size(1),
                                   packed = xx:stride(1) == xx:size(2) and xx:stride(2) == 1}
    return orig_call(self, xx, o)
  end
  k3.attn_res = function(a)
    rec.attn[#rec.attn + 1] = {T = a.prefix:size(1), H = a.prefix:size(2),
                               S = a.blocks:size(2), num_blocks = a.num_blocks or 0,
                               write_block = a.write_block, delta = a.delta ~= nil,
                               norm_weight = a.norm_weight, qk_weight = a.qk_weight,
                               output_norm_weight = a.output_norm_weight,
                               eps = a.eps, output_eps = a.output_eps}
    return orig_attn(a)
  end
  local ok, err = pcall(function()
    local y = stack:forward(x)
    y:free()
  end)
  nn.Linear.__call, k3.attn_res = orig_call, orig_attn
  if not ok then error(err, 0) end
  return rec
end

local function count_ops(stack, x)
  local counts = {}
  local tr = k3.trace(function()
    local y = stack:forward(x)
    y:free()
  end)
  for _, r in ipairs(tr) do counts[r.op or "?"] = (counts[r.op or "?"] or 0) + 1 end
  return counts
end

-- Builds the replays: {fn_linear, fn_attn, bytes, buffers to free}.
local function build_replays(env, rec)
  local bufs, xb, yb = {}, {}, {}
  local function buf(cache, shape, random)
    local key = table.concat(shape, "x")
    if not cache[key] then
      local t = random and env:random(shape, #bufs + 1) or env:empty(shape)
      bufs[#bufs + 1] = t
      cache[key] = t
    end
    return cache[key]
  end
  local lin, lin_bytes = {}, 0
  for i, c in ipairs(rec.linear) do
    local o = {}
    for k, v in pairs(c.opts) do o[k] = v end
    o.out = buf(yb, {c.M, c.YN}, false)
    lin[i] = {m = c.method, w = c.weight, b = c.bias, x = buf(xb, {c.M, c.XK}, true), o = o}
    lin_bytes = lin_bytes + 2 * (c.N * c.K + c.M * c.XK + c.M * c.YN)
  end
  local attn, attn_bytes = {}, 0
  local a1 = rec.attn[1]
  local sc
  if a1 then
    sc = {prefix = env:random({a1.T, a1.H}, 91), delta = env:random({a1.T, a1.H}, 92),
          blocks = env:random({a1.T, a1.S, a1.H}, 93), out = env:empty({a1.T, a1.H})}
    for _, t in pairs(sc) do bufs[#bufs + 1] = t end
  end
  for i, a in ipairs(rec.attn) do
    attn[i] = {prefix = sc.prefix, delta = a.delta and sc.delta or nil, blocks = sc.blocks,
               num_blocks = a.num_blocks, write_block = a.write_block,
               norm_weight = a.norm_weight, qk_weight = a.qk_weight,
               output_norm_weight = a.output_norm_weight, eps = a.eps, output_eps = a.output_eps,
               out = sc.out}
    -- prefix (+ delta read, prefix written back), blocks read, block written, out, weights
    local rows = 2 + (a.delta and 2 or 0) + a.num_blocks + (a.write_block and 1 or 0)
    local nw = (a.norm_weight and 1 or 0) + (a.qk_weight and 1 or 0) + (a.output_norm_weight and 1 or 0)
    attn_bytes = attn_bytes + 2 * a.H * (a.T * rows + nw)
  end
  local function fn_linear()
    for _, c in ipairs(lin) do c.m:apply(c.x, c.w, c.b, c.o) end
  end
  local function fn_attn()
    for _, a in ipairs(attn) do k3.attn_res(a) end
  end
  return fn_linear, fn_attn, lin_bytes, attn_bytes, bufs
end

-- The step as a user captures it: k3.cuda_graph around Stack:forward(x), the result copied
-- into y (static tensors: x and y are the graph's input and output).
local function capture_step(stack, x, y)
  return k3.cuda_graph(function()
    local out = stack:forward(x)
    y:copy(out)
    out:free()
  end)
end

-- The same capture with every AttnRes read replaced by a plain copy of its prefix.
local function capture_step_copying_reads(stack, x, y)
  local orig = k3.attn_res
  k3.attn_res = function(a) return a.prefix:clone() end
  local ok, g = pcall(capture_step, stack, x, y)
  k3.attn_res = orig
  if not ok then error(g, 0) end
  return g
end

-- Bytes rounded up to the read kernel's 16-byte granule.
local function granule(b) return (b + 15) // 16 * 16 end

function S.run(env, peers, opts)
  opts = opts or {}
  local kimi = require "k3.model.kimi_k3"
  local cfgname = env.dry and "tiny" or "kimi-k3-tp8"
  local cfg = kimi.config(cfgname)
  local ms = opts.ms or S.MS
  local mmax = 0
  for _, m in ipairs(ms) do mmax = math.max(mmax, m) end
  local weights = kimi.generate_weights(cfg, {seed = 1234, dtype = "bf16", device = env.device,
    progress = function(n, total)
      if n % 100 == 0 or n == total then U.progress("stack: generating %s weights %d/%d", cfgname, n, total) end
    end})
  local stack = kimi.build(cfg, weights, {dtype = "bf16", device = env.device})
  local X = kimi.embedding(cfg, mmax, {seed = 1234, step = 1, dtype = "bf16", device = env.device})
  local rows = {}
  local steps = env.quick and 5 or 10
  local per_m = {}
  for _, M in ipairs(ms) do
    local x = X:narrow(1, 1, M)
    U.progress("stack M=%d: recording one step", M)
    local rec = record_step(stack, x)
    local ops = count_ops(stack, x)
    local fn_lin, fn_attn, lin_bytes, attn_bytes, bufs = build_replays(env, rec)
    local floor_lin, floor_attn = env:floor_us(lin_bytes), env:floor_us(attn_bytes)
    local nops = 0
    for _, n in pairs(ops) do nops = nops + n end
    -- Dry-run models: replays near their floors, the eager step paying ~6 µs per op launch.
    local m_lin = floor_lin / 0.9 + 1.0 * #rec.linear
    local m_attn = floor_attn / 0.9 + 2.0 * #rec.attn
    local m_step_g = m_lin + m_attn + 1.5 * (nops - #rec.linear - #rec.attn)
    local m_step = m_step_g + 6 * nops
    U.progress("stack M=%d: %d eager steps", M, steps)
    local t_step, s_step = env:time(function()
      local y = stack:forward(x)
      y:free()
    end, {graph = false, iters = steps, warmup = 2}, m_step)
    -- The host's share of the eager step: the best of three enqueues of Stack:forward (clock
    -- from the call to its return, the device drained before each), against the device time.
    local t_host
    if env.dry then
      t_host = 5.5 * nops
    else
      for _ = 1, 3 do
        k3.synchronize()
        local c0 = k3.clock()
        local y = stack:forward(x)
        local us = (k3.clock() - c0) * 1e6
        y:free()
        k3.synchronize()
        t_host = t_host and math.min(t_host, us) or us
      end
    end
    local gi = env.quick and 8 or 20
    U.progress("stack M=%d: replaying %d linear calls (graph, eager)", M, #rec.linear)
    local tag = string.format("M=%d", M)
    local t_lin_g = env:try_time(tag .. " linear replay (graph)", fn_lin,
                                 {graph = true, calls = 1, iters = gi, warmup = 1}, m_lin)
    local t_lin_e = env:try_time(tag .. " linear replay (eager)", fn_lin,
                                 {graph = false, iters = steps, warmup = 1}, m_lin + 5 * #rec.linear)
    U.progress("stack M=%d: replaying %d AttnRes reads (graph, eager)", M, #rec.attn)
    local t_attn_g = env:try_time(tag .. " attn_res replay (graph)", fn_attn,
                                  {graph = true, calls = 1, iters = gi, warmup = 1}, m_attn)
    local t_attn_e = env:try_time(tag .. " attn_res replay (eager)", fn_attn,
                                  {graph = false, iters = steps, warmup = 1}, m_attn + 5 * #rec.attn)
    for _, t in ipairs(bufs) do t:free() end
    local unpacked = 0
    for _, c in ipairs(rec.linear) do if not c.packed then unpacked = unpacked + 1 end end
    local row = {
      M = M, config = cfgname, layers = cfg.num_layers, ops = ops, ops_total = nops,
      step_bytes = lin_bytes + attn_bytes,
      linear_calls = #rec.linear, attn_res_calls = #rec.attn, linear_unpacked_x = unpacked,
      step_us = t_step, step_min_us = s_step.min, step_p90_us = s_step.p90,
      step_host_us = t_host, host_us_per_op = t_host / nops,
      linear_graph_us = t_lin_g, linear_eager_us = t_lin_e,
      attn_res_graph_us = t_attn_g, attn_res_eager_us = t_attn_e,
      linear_bytes = lin_bytes, attn_res_bytes = attn_bytes,
      linear_floor_us = floor_lin, attn_res_floor_us = floor_attn,
      step_floor_us = floor_lin + floor_attn,
    }
    rows[#rows + 1] = row
    per_m[M] = {rec = rec, x = x, m_step_g = m_step_g}
  end
  -- The step in a CUDA graph, last: a failed capture must not disturb the figures above.
  local gi = env.quick and 10 or 20
  for _, row in ipairs(rows) do
    local st = per_m[row.M]
    U.progress("stack M=%d: the step as a CUDA graph (k3.cuda_graph), then with copies for the reads", row.M)
    if env.dry then
      -- Dry run: no graph on the CPU; the model's figures (AttnRes reads modelled at 2 µs).
      row.step_graph_us = st.m_step_g
      row.step_graph_copy_us = st.m_step_g - 2.0 * row.attn_res_calls
      row.kernels_per_step = row.ops_total
    else
      local ok, err = pcall(function()
        local y = k3.empty({row.M, cfg.hidden_size}, {dtype = "bf16", device = env.device})
        local g = capture_step(stack, st.x, y)
        row.kernels_per_step = g:kernels()
        row.step_graph_us = env:time(function() g:replay() end, {graph = false, iters = gi, warmup = 2})
        g:free()
        local gc = capture_step_copying_reads(stack, st.x, y)
        row.kernels_copy_reads = gc:kernels()
        row.step_graph_copy_us = env:time(function() gc:replay() end, {graph = false, iters = gi, warmup = 2})
        gc:free()
        y:free()
      end)
      if not ok then row.step_graph_error = tostring(err):gsub("\n.*", "") end
    end
  end
  -- The read limit of each row's bytes, one read each, in this run.
  local sizes, seen_b = {}, {}
  for _, row in ipairs(rows) do
    local b = granule(row.step_bytes)
    if not seen_b[b] then seen_b[b] = true; sizes[#sizes + 1] = b end
  end
  U.progress("stack: the read limit of %d step byte counts (scripts/read-limit --single)", #sizes)
  local L = require "k3.bench.linear"
  local lok, limits, machine, limit_method = pcall(L.read_limits, env, sizes, {"--single", "--reps", "5"})
  if lok then
    -- The plain read only: chained with PDL, two reads of one buffer overlap and the second
    -- finds the first's lines in L2. A figure faster than any memory can be (above
    -- S.READ_BW_MAX x the measured copy bandwidth) is refused, never reported.
    for _, row in ipairs(rows) do
      local r = limits[granule(row.step_bytes)]
      local us = r and r.read_us
      local bw = us and us > 0 and row.step_bytes / (us * 1e3)
      if bw and not env.dry and bw > S.READ_BW_MAX * env.bw then
        env.errors = env.errors or {}
        env.errors[#env.errors + 1] = {label = string.format("M=%d read limit", row.M),
          error = string.format("%.3f ms for %.2f GB is %.0f GB/s, above %.1fx the measured copy bandwidth (%.0f GB/s): refused",
                                us / 1000, row.step_bytes / 1e9, bw, S.READ_BW_MAX, env.bw)}
      else
        row.read_limit_us = us
      end
    end
  else
    env.errors = env.errors or {}
    env.errors[#env.errors + 1] = {label = "read limit", error = tostring(limits):gsub("\n.*", "")}
  end
  for _, row in ipairs(rows) do
    local base = row.step_graph_us or row.step_us
    row.share_base = row.step_graph_us and "step in a CUDA graph" or "eager step"
    row.base_us = base
    local lin, att = row.linear_graph_us, row.attn_res_graph_us
    row.linear_share = lin and lin / base
    row.attn_res_share = att and att / base
    row.rest_us = lin and att and base - lin - att
    row.rest_share = row.rest_us and row.rest_us / base
    row.attn_res_share_eager = att and att / row.step_us
    row.step_floor_frac = row.step_floor_us / base
    if row.step_graph_us and row.step_graph_copy_us then
      row.attn_res_marginal_us = row.step_graph_us - row.step_graph_copy_us
      row.attn_res_marginal_share = row.attn_res_marginal_us / row.step_graph_us
    end
    row.read_limit_frac = row.read_limit_us and row.step_graph_us and row.read_limit_us / row.step_graph_us
    row.eager_over_graph = row.step_graph_us and row.step_us / row.step_graph_us
  end
  X:free()
  stack:free()
  -- The weights table maps many names to a few shared tensors: free each once.
  local seen = {}
  for _, t in pairs(weights) do
    if not seen[t] then seen[t] = true; t:free() end
  end
  env:release()
  U.progress_done()
  local res = {rows = rows, summary = S.summarize(rows), machine = env:device_name(),
               read_limit_method = lok and limit_method or nil, read_limit_machine = lok and machine or nil}
  res.lines = S.format(env, res)
  return res
end

function S.summarize(rows)
  local s = {}
  local function ms(v) return v and v / 1000 end
  for _, r in ipairs(rows) do
    if r.M == 1 then
      s.step_graph_ms_m1 = ms(r.step_graph_us)
      s.step_eager_ms_m1 = ms(r.step_us)
      s.step_host_ms_m1 = ms(r.step_host_us)
      s.kernels_per_step = r.kernels_per_step
      s.read_limit_ms = ms(r.read_limit_us)
      s.read_limit_frac_m1 = r.read_limit_frac
      s.attn_res_share_m1 = r.attn_res_marginal_share
      s.attn_res_replay_share_m1 = r.attn_res_share
      s.eager_over_graph_m1 = r.eager_over_graph
    elseif r.M == 16 then
      s.step_graph_ms_m16 = ms(r.step_graph_us)
      s.read_limit_frac_m16 = r.read_limit_frac
    end
  end
  local T = S.TARGETS
  s.verdicts = {
    step_graph_ms_m1 = U.verdict(s.step_graph_ms_m1, "<=", T.step_graph_ms_m1),
    step_graph_ms_m16 = U.verdict(s.step_graph_ms_m16, "<=", T.step_graph_ms_m16),
    attn_res_share_m1 = U.verdict(s.attn_res_share_m1, "<=", T.attn_res_share_m1),
    eager_over_graph_m1 = U.verdict(s.eager_over_graph_m1, "<=", T.eager_over_graph_m1),
  }
  return s
end

function S.format(env, res)
  local rows, s = res.rows, res.summary
  local out = {}
  local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  local function ms(v) return v and string.format("%.3f", v / 1000) or "-" end
  local function pct1(v) return v and string.format("%.1f%%", 100 * v) or "-" end
  local cfg = rows[1] and rows[1].config or "?"
  p("== stack: one decode step of %s (lua/k3/model/kimi_k3.lua) ==", cfg)
  p("%s", env:header())
  p("method: 'step' = CUDA events around Stack:forward (eager, as a user runs it); 'graph' = the step")
  p("captured with k3.cuda_graph, events around each replay; 'kernels' = the graph's kernel nodes;")
  p("'read' = the read limit of the step's bytes (scripts/read-limit --single: one read-only pass over")
  p("exactly those bytes, this run); 'AttnRes marginal' = (graph - the graph with each AttnRes read")
  p("replaced by a plain copy of its prefix) / graph; 'linear'/'attn_res' = every linear call / AttnRes")
  p("read of one recorded step replayed back to back in a CUDA graph, shares of the graph step;")
  p("rest = graph - linear - attn_res (norms, SwiGLU gate, copies, launch gaps). floor = bytes / copy bw.")
  p("'host enqueues' = the clock from calling Stack:forward to its return, device drained before (best of 3).")
  p("")
  local cols = {
    {head = "M", key = "M", fmt = "%d"},
    {head = "kernels", key = "kernels_per_step", fmt = "%d"},
    {head = "step ms", key = "step_us", fmt = ms},
    {head = "graph ms", key = "step_graph_us", fmt = ms},
    {head = "eager/graph", key = "eager_over_graph", fmt = function(v) return string.format("%.2fx", v) end},
    {head = "read ms", key = "read_limit_us", fmt = ms},
    {head = "%read", key = "read_limit_frac", fmt = U.pct},
    {head = "floor ms", key = "step_floor_us", fmt = ms},
    {head = "AttnRes marginal", key = "attn_res_marginal_share", fmt = pct1},
    {head = "linear ms", key = "linear_graph_us", fmt = ms},
    {head = "linear", key = "linear_share", fmt = U.pct},
    {head = "attn_res ms", key = "attn_res_graph_us", fmt = ms},
    {head = "attn_res", key = "attn_res_share", fmt = pct1},
    {head = "rest ms", key = "rest_us", fmt = ms},
    {head = "rest", key = "rest_share", fmt = U.pct},
    {head = "share of", key = "share_base", align = "l"},
  }
  for _, line in ipairs(U.format_table(cols, rows)) do out[#out + 1] = line end
  p("")
  for _, r in ipairs(rows) do
    local names = {}
    for k in pairs(r.ops) do names[#names + 1] = k end
    table.sort(names)
    local parts = {}
    for _, k in ipairs(names) do parts[#parts + 1] = string.format("%s %d", k, r.ops[k]) end
    local function msu(v) return v and string.format("%.3f ms", v / 1000) or "-" end
    p("M=%d: dispatches per step: %s (%d); the host enqueues the eager step in %s (%.1f µs a dispatch); eager replays: linear %s, attn_res %s; graph with copies for the reads %s (%s kernels)%s",
      r.M, table.concat(parts, ", "), r.ops_total, msu(r.step_host_us), r.host_us_per_op,
      msu(r.linear_eager_us), msu(r.attn_res_eager_us),
      msu(r.step_graph_copy_us), r.kernels_copy_reads or "-",
      r.linear_unpacked_x > 0 and string.format("; %d linear calls had a strided x (replayed packed)", r.linear_unpacked_x) or "")
    if r.step_graph_error then p("M=%d: step not captured in a graph: %s", r.M, r.step_graph_error) end
  end
  if res.read_limit_method then p("read limit: %s", res.read_limit_method) end
  local errs = env:take_errors()
  if #errs > 0 then
    p("measurements that raised an error (shown as '-' above):")
    for _, l in ipairs(errs) do out[#out + 1] = l end
  end
  local T, v = S.TARGETS, s.verdicts
  local function f3(x) return x and string.format("%.3f", x) or "-" end
  p("")
  p("summary against the targets (kimi-k3-tp8 on one H200):")
  p("  graph step, M = 1:   %s ms   target <= %.1f ms   %s   (read limit %s ms: the step runs at %s of it)",
    f3(s.step_graph_ms_m1), T.step_graph_ms_m1, v.step_graph_ms_m1, f3(s.read_limit_ms), U.pct(s.read_limit_frac_m1))
  p("  graph step, M = 16:  %s ms   target <= %.1f ms   %s   (the step runs at %s of its read limit)",
    f3(s.step_graph_ms_m16), T.step_graph_ms_m16, v.step_graph_ms_m16, U.pct(s.read_limit_frac_m16))
  p("  AttnRes marginal cost, M = 1: %s of the graph step   target <= %.0f%%   %s   (replayed alone: %s)",
    pct1(s.attn_res_share_m1), 100 * T.attn_res_share_m1, v.attn_res_share_m1, pct1(s.attn_res_replay_share_m1))
  p("  eager step / graph step, M = 1: %s   target <= %.2fx   %s   (eager %s ms, its host enqueue %s ms, %s kernels per step)",
    s.eager_over_graph_m1 and string.format("%.2fx", s.eager_over_graph_m1) or "-", T.eager_over_graph_m1,
    v.eager_over_graph_m1, f3(s.step_eager_ms_m1), f3(s.step_host_ms_m1), s.kernels_per_step or "-")
  return out
end

S.CSV_KEYS = {"M", "config", "layers", "ops_total", "kernels_per_step", "linear_calls",
              "attn_res_calls", "linear_unpacked_x", "step_us", "step_min_us", "step_p90_us",
              "step_host_us", "host_us_per_op",
              "step_graph_us", "step_graph_error", "eager_over_graph",
              "step_bytes", "read_limit_us",
              "read_limit_frac", "step_graph_copy_us", "kernels_copy_reads", "attn_res_marginal_us",
              "attn_res_marginal_share", "linear_graph_us", "linear_eager_us", "attn_res_graph_us",
              "attn_res_eager_us", "rest_us", "share_base", "base_us", "linear_share",
              "attn_res_share", "rest_share", "attn_res_share_eager", "linear_bytes",
              "attn_res_bytes", "linear_floor_us", "attn_res_floor_us", "step_floor_us",
              "step_floor_frac"}

-- S.summary_object(res, cmd, commit) -> the `stack` object of bench/summary-<gpu>.json (times
-- in ms, shares and fractions 0..1; attn_res_share_m1 is the marginal cost in the graph step).
function S.summary_object(res, cmd, commit)
  local s = res.summary
  return {
    date = U.date(), machine = res.machine, commit = commit, command = cmd,
    step_graph_ms_m1 = s.step_graph_ms_m1, step_graph_ms_m16 = s.step_graph_ms_m16,
    step_eager_ms_m1 = s.step_eager_ms_m1, step_host_ms_m1 = s.step_host_ms_m1,
    kernels_per_step = s.kernels_per_step,
    read_limit_ms = s.read_limit_ms, read_limit_frac_m1 = s.read_limit_frac_m1,
    read_limit_frac_m16 = s.read_limit_frac_m16, attn_res_share_m1 = s.attn_res_share_m1,
    eager_over_graph_m1 = s.eager_over_graph_m1,
    targets = S.TARGETS,
  }
end

return S
