-- k3.bench.stack — `scripts/bench stack`: one decode step of the kimi-k3-tp8 stack
-- (lua/k3/model/kimi_k3.lua: 93 layers, hidden 7168, TP8 projections, AttnRes stream) at
-- M = 1 and 16 tokens, and where its time goes.
--
-- Method (printed with the table):
--   1. step: Stack:forward(x) timed with CUDA events around the whole step, eager, exactly as
--      a user runs it (median of several steps after a warm-up step).
--   2. one step is run with nn.Linear's call and k3.attn_res wrapped, recording every linear
--      call (its method, weight, M, K) and every AttnRes read (its num_blocks, write_block,
--      weights); k3.trace of a step counts the other ops.
--   3. the recorded linear calls are replayed back to back (same methods and weights, so the
--      same kernels and the same weight addresses as in the step; random inputs, preallocated
--      outputs), likewise the AttnRes reads (the step's own weights, a scratch stream buffer):
--      each replay inside one CUDA graph (device time, no launch gaps) and eager.
--   4. the step itself captured in a CUDA graph, best effort (the allocator's cache is
--      pre-filled so the capture needs no cudaMalloc); where capture fails the reason is shown.
--   shares = replay-in-graph / step-in-graph when the step was captured, else / eager step
--   (then host launch overhead lands in "rest"); rest = step - linear - attn_res.
local k3 = require "k3"
local U = require "k3.bench.util"
local Env = require "k3.bench.env"

local S = {}
S.MS = {1, 16}
S.TARGET_ATTN_SHARE = 0.03   -- AttnRes under 3% of the step at M = 1

local function sum(t) local s = 0 for _, v in ipairs(t) do s = s + v end return s end

-- Runs one step with the wrappers in place; returns {linear = {...}, attn = {...}}.
local function record_step(stack, x)
  local nn = require "k3.nn"
  local rec = {linear = {}, attn = {}}
  local orig_call, orig_attn = nn.Linear.__call, k3.attn_res
  nn.Linear.__call = function(self, xx)
    rec.linear[#rec.linear + 1] = {method = self.method, weight = self.weight, bias = self.bias,
                                   M = xx:size(1), K = xx:size(2), N = self.weight:size(1),
                                   packed = xx:stride(1) == xx:size(2) and xx:stride(2) == 1}
    return orig_call(self, xx)
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
    lin[i] = {m = c.method, w = c.weight, b = c.bias, x = buf(xb, {c.M, c.K}, true),
              o = {out = buf(yb, {c.M, c.N}, false)}}
    lin_bytes = lin_bytes + 2 * (c.N * c.K + c.M * c.K + c.M * c.N)
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

-- Fills the allocator's cache with enough free blocks of every size the step allocates, so
-- a captured step takes each allocation from the cache (blocks freed during a capture are
-- held by the graph, never reused within it).
local function prewarm_cache(env, rec, cfg)
  local sizes = {}
  local function add(n) sizes[n] = true end
  for _, c in ipairs(rec.linear) do add(c.M * c.N); add(c.M * c.K) end
  for _, a in ipairs(rec.attn) do add(a.T * a.H) end
  local per = 6 * cfg.num_layers + 32
  local hold = {}
  for n in pairs(sizes) do
    for _ = 1, per do hold[#hold + 1] = k3.empty({n}, {dtype = "bf16", device = env.device}) end
  end
  for _, t in ipairs(hold) do t:free() end
  return #hold
end

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
      linear_calls = #rec.linear, attn_res_calls = #rec.attn, linear_unpacked_x = unpacked,
      step_us = t_step, step_min_us = s_step.min, step_p90_us = s_step.p90,
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
  for _, row in ipairs(rows) do
    local st = per_m[row.M]
    U.progress("stack M=%d: capturing the step in a CUDA graph", row.M)
    local ok, res = pcall(function()
      if not env.dry then prewarm_cache(env, st.rec, cfg) end
      return env:time(function()
        local y = stack:forward(st.x)
        y:free()
      end, {graph = true, calls = 1, iters = env.quick and 5 or 10, warmup = 1}, st.m_step_g)
    end)
    if ok then
      row.step_graph_us = res
    else
      row.step_graph_error = tostring(res):gsub("\n.*", "")
    end
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
  local res = {rows = rows, summary = S.summarize(rows)}
  res.lines = S.format(env, res)
  return res
end

function S.summarize(rows)
  local s = {}
  for _, r in ipairs(rows) do
    if r.M == 1 then
      s.attn_res_share_m1 = r.attn_res_share
      s.attn_res_share_m1_base = r.share_base
      s.attn_res_share_m1_eager = r.attn_res_share_eager
    end
  end
  s.verdict = U.verdict(s.attn_res_share_m1, "<=", S.TARGET_ATTN_SHARE)
  return s
end

function S.format(env, res)
  local rows, s = res.rows, res.summary
  local out = {}
  local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  local cfg = rows[1] and rows[1].config or "?"
  p("== stack: one decode step of %s (lua/k3/model/kimi_k3.lua) ==", cfg)
  p("%s", env:header())
  p("method: 'step' = CUDA events around Stack:forward (eager, as a user runs it); 'step-g' = the step")
  p("captured in one CUDA graph (best effort); 'linear'/'attn_res' = every linear call / AttnRes read of")
  p("one recorded step replayed back to back with the same methods and weights, in a CUDA graph (device")
  p("time); shares = replay / step-g when captured, else / eager step (host overhead then lands in 'rest');")
  p("rest = step - linear - attn_res (norms, SwiGLU gate, copies, launch gaps). floor = bytes / copy bw.")
  p("")
  local cols = {
    {head = "M", key = "M", fmt = "%d"},
    {head = "ops", key = "ops_total", fmt = "%d"},
    {head = "step ms", key = "step_us", fmt = function(v) return string.format("%.3f", v / 1000) end},
    {head = "step-g ms", key = "step_graph_us", fmt = function(v) return string.format("%.3f", v / 1000) end},
    {head = "floor ms", key = "step_floor_us", fmt = function(v) return string.format("%.3f", v / 1000) end},
    {head = "%floor", key = "step_floor_frac", fmt = U.pct},
    {head = "linear calls", key = "linear_calls", fmt = "%d"},
    {head = "linear ms", key = "linear_graph_us", fmt = function(v) return string.format("%.3f", v / 1000) end},
    {head = "linear", key = "linear_share", fmt = U.pct},
    {head = "reads", key = "attn_res_calls", fmt = "%d"},
    {head = "attn_res ms", key = "attn_res_graph_us", fmt = function(v) return string.format("%.3f", v / 1000) end},
    {head = "attn_res", key = "attn_res_share", fmt = function(v) return string.format("%.1f%%", 100 * v) end},
    {head = "rest ms", key = "rest_us", fmt = function(v) return string.format("%.3f", v / 1000) end},
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
    local function ms(v) return v and string.format("%.3f ms", v / 1000) or "-" end
    p("M=%d: dispatches per step: %s; eager replays: linear %s, attn_res %s%s", r.M,
      table.concat(parts, ", "), ms(r.linear_eager_us), ms(r.attn_res_eager_us),
      r.linear_unpacked_x > 0 and string.format("; %d linear calls had a strided x (replayed packed)", r.linear_unpacked_x) or "")
    if r.step_graph_error then p("M=%d: step not captured in a graph: %s", r.M, r.step_graph_error) end
  end
  local errs = env:take_errors()
  if #errs > 0 then
    p("measurements that raised an error (shown as '-' above):")
    for _, l in ipairs(errs) do out[#out + 1] = l end
  end
  p("")
  p("summary against the target:")
  p("  AttnRes share of the decode step, M = 1: %s of the %s (%s of the eager step)   target < %.0f%%   %s",
    s.attn_res_share_m1 and string.format("%.2f%%", 100 * s.attn_res_share_m1) or "-",
    s.attn_res_share_m1_base or "-",
    s.attn_res_share_m1_eager and string.format("%.2f%%", 100 * s.attn_res_share_m1_eager) or "-",
    100 * S.TARGET_ATTN_SHARE, s.verdict)
  return out
end

S.CSV_KEYS = {"M", "config", "layers", "ops_total", "linear_calls", "attn_res_calls",
              "linear_unpacked_x", "step_us", "step_min_us", "step_p90_us", "step_graph_us",
              "step_graph_error", "linear_graph_us", "linear_eager_us", "attn_res_graph_us",
              "attn_res_eager_us", "rest_us", "share_base", "base_us", "linear_share",
              "attn_res_share", "rest_share", "attn_res_share_eager", "linear_bytes",
              "attn_res_bytes", "linear_floor_us", "attn_res_floor_us", "step_floor_us",
              "step_floor_frac"}

return S
