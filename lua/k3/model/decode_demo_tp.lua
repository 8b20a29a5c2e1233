-- The `--tp N` demo (scripts/demo.lua hands over here): the Kimi-K3 decode stack
-- tensor-parallel over k3.dist (lua/k3/model/kimi_k3_tp.lua), run for decode batches M on
-- every rank, timed, and checked on rank 0 against a TP=1 run of the same weights. A main of
-- the checkout, like lua/k3/model/decode_demo.lua: `make install` leaves it out.
local k3 = require "k3"
local kimi = require "k3.model.kimi_k3"
local tp = require "k3.model.kimi_k3_tp"

local M = {}
local wall = k3.clock

-- ||y - ref|| / ||ref||, cosine and max |y - ref|, in f64.
local function compare(y, ref)
  local a, b = y:to{device = "cpu", dtype = "f64"}, ref:to{device = "cpu", dtype = "f64"}
  local av, bv = a:totable(), b:totable()
  local s2, r2 = 0, 0
  for i = 1, #av do
    for j = 1, #av[i] do
      s2 = s2 + (av[i][j] - bv[i][j]) ^ 2
      r2 = r2 + bv[i][j] ^ 2
    end
  end
  local rel, cos, mad = math.sqrt(s2 / r2), k3.cosine(a, b), k3.max_abs_diff(a, b)
  a:free()
  b:free()
  return rel, cos, mad
end
M.compare = compare

local function count_kernels(trace)
  local per = {}
  for _, r in ipairs(trace) do
    if r.kernel and r.kernel ~= "" then per[r.kernel] = (per[r.kernel] or 0) + 1 end
  end
  local ks = {}
  for k in pairs(per) do ks[#ks + 1] = k end
  table.sort(ks)
  local parts = {}
  for _, k in ipairs(ks) do parts[#parts + 1] = string.format("%s x%d", k, per[k]) end
  return table.concat(parts, ", ")
end

--- run(opts) -> result (every rank runs it; rank 0 formats it). opts: tp (world size, checked
--- against k3.dist), config (logical config name or table), device, dtype, steps, m (list),
--- seed, weight_sets, weights ({name = tensor}), tol = {rel_err =, cosine =}, quiet.
function M.run(opts)
  opts = opts or {}
  local d = k3.dist
  if not d.initialized() then d.init() end
  local W, rank = d.world_size(), d.rank()
  if opts.tp and opts.tp ~= W then
    error(string.format("demo --tp %d, but this process group has %d rank(s)", opts.tp, W), 0)
  end
  local gpu = k3.backends().cuda.available
  local device = opts.device or d.device()
  local cfg = tp.config(opts.config or (gpu and "kimi-k3" or "tiny"),
                       opts.weight_sets and {weight_sets = opts.weight_sets} or nil)
  local lcfg = tp.local_config(cfg, W)
  local steps = opts.steps or (gpu and 20 or 5)
  local ms_list = opts.m or (gpu and {1, 2, 4, 8, 16} or {1, 4})
  local tol = opts.tol or {rel_err = 5e-2, cosine = 0.998}
  local seed = opts.seed or 1234
  local mmax = 0
  for _, m in ipairs(ms_list) do mmax = math.max(mmax, m) end
  -- Rank 0 reports progress: a live line on a terminal, occasional plain lines in a log.
  local reporter = require("k3.cli").progress{quiet = rank ~= 0 or opts.quiet}
  local function say(fmt, ...) reporter:update(fmt, ...) end
  say("generating weights (%s, seed %d)", cfg.name, seed)
  local weights = opts.weights or kimi.generate_weights(cfg, {seed = seed, dtype = opts.dtype or "bf16",
                                                              device = "cpu"})
  say("building the TP%d stack on %s", W, device)
  local stack = tp.build(cfg, weights, {device = device, dtype = opts.dtype or "bf16"})
  local xs = {}
  for s = 1, steps do
    xs[s] = kimi.embedding(cfg, mmax, {seed = seed, step = s, dtype = stack.dtype, device = device})
  end
  local rows = {}
  for _, m in ipairs(ms_list) do
    say("M=%-2d warm-up (traced)", m)
    local y0
    local trace = k3.trace(function() y0 = stack:forward(xs[1]:narrow(1, 1, m)) end)
    y0:free()
    k3.synchronize()
    d.barrier()
    d.stats{reset = true}
    local t0 = wall()
    local y
    for s = 1, steps do
      if y then y:free() end
      y = stack:forward(xs[s]:narrow(1, 1, m))
    end
    k3.synchronize()
    d.synchronize()
    local ms = (wall() - t0) * 1000 / steps
    local st = d.stats()
    rows[#rows + 1] = {m = m, ms = ms, ar_ms = st.all_reduce.ms / steps,
                       ar_calls = st.all_reduce.calls / steps, check_ms = st.check.ms / steps,
                       waits = (st.all_reduce.stream_waits + st.all_gather.stream_waits +
                                st.check.stream_waits) / steps,
                       kernels = count_kernels(trace), output = y}
  end
  -- TP = 1 on every rank at once (so no rank idles into a timeout): the same weights whole,
  -- timed like the TP rows (one warm-up step, then `steps` steps), its last step compared.
  local whole = kimi.build(cfg, weights, {device = device, dtype = stack.dtype})
  for _, r in ipairs(rows) do
    say("M=%-2d TP=1 run of the same weights (timed, then compared)", r.m)
    local y1 = whole:forward(xs[1]:narrow(1, 1, r.m))
    k3.synchronize()
    local t0 = wall()
    for s = 1, steps do
      y1:free()
      y1 = whole:forward(xs[s]:narrow(1, 1, r.m))
    end
    k3.synchronize()
    r.tp1_ms = (wall() - t0) * 1000 / steps
    r.rel_err, r.cosine, r.max_abs = compare(r.output, y1)
    r.pass = r.rel_err <= tol.rel_err and r.cosine >= tol.cosine
    y1:free()
  end
  whole:free()
  -- The collective alone: one all-reduce of an [M, hidden] activation, as the stack issues
  -- it, 50 times after 5 warm-ups. Device time from k3.dist.stats (events around each NCCL
  -- call, so waiting for the slower rank is included) and wall time per call (with the
  -- default K3_DIST_WAIT=each that includes k3's bounded host wait). The values start at
  -- 2^-100 so 55 sums over up to 16 ranks stay finite in bf16.
  for _, r in ipairs(rows) do
    say("M=%-2d all-reduce of [%d, %d] alone", r.m, r.m, cfg.hidden_size)
    local t = k3.full({r.m, cfg.hidden_size}, 2 ^ -100, {dtype = stack.dtype, device = device})
    for _ = 1, 5 do d.all_reduce(t) end
    k3.synchronize()
    d.synchronize()
    d.barrier()
    d.stats{reset = true}
    local n = 50
    local t0 = wall()
    for _ = 1, n do d.all_reduce(t) end
    k3.synchronize()
    d.synchronize()
    r.ar_alone_wall_us = (wall() - t0) * 1e6 / n
    local st = d.stats().all_reduce
    r.ar_alone_dev_us = st.calls > 0 and st.ms * 1000 / st.calls or nil
    t:free()
  end
  d.barrier()
  reporter:done()
  for s = 1, steps do xs[s]:free() end
  return {config = cfg, local_config = lcfg, world_size = W, device = device, dtype = stack.dtype,
          steps = steps, rows = rows, tol = tol, stack = stack, weights = weights}
end

function M.format(res)
  local cfg, l = res.config, res.local_config
  local out = {}
  local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  p("k3 demo --tp %d: Kimi-K3 decode stack, config %s across %d rank(s) on %s, %s", res.world_size,
    cfg.name, res.world_size, res.device, res.dtype)
  p("  hidden %d, %d layers, AttnRes block size %d; per rank: %d heads, MLP %d (q_b %dx%d, o_proj %dx%d, gate_up %dx%d, down %dx%d)",
    cfg.hidden_size, cfg.num_layers, cfg.block_size, l.num_heads, l.intermediate_size,
    l.num_heads * (l.qk_nope_head_dim + l.qk_rope_head_dim), l.q_lora_rank, cfg.hidden_size,
    l.num_heads * l.v_head_dim, 2 * l.intermediate_size, cfg.hidden_size, cfg.hidden_size,
    l.intermediate_size)
  p("  %d decode steps per M; all-reduce: NCCL device time per step (includes waiting for the slower rank);",
    res.steps)
  p("  fidelity: rank 0's final hidden state of the last step vs a TP=1 run of the same weights (pass: rel err <= %g, cosine >= %g)",
    res.tol.rel_err, res.tol.cosine)
  p("")
  p("%3s  %10s  %10s  %8s  %10s  %7s  %8s  %10s  %11s  %12s  %12s  %11s  %10s  %9s  %4s  %s", "M",
    "ms/step", "TP1 ms", "speed-up", "AR ms/step", "AR %", "AR/step", "waits/step", "check ms",
    "AR alone µs", "(wall µs)", "rel err", "cosine", "max |d|", "ok", "kernels (calls per step, rank 0)")
  for _, r in ipairs(res.rows) do
    p("%3d  %10.3f  %10.3f  %7.2fx  %10.3f  %6.1f%%  %8.0f  %10.0f  %11.3f  %12s  %12.1f  %11.3e  %10.7f  %9.3e  %4s  %s",
      r.m, r.ms, r.tp1_ms, r.ms > 0 and r.tp1_ms / r.ms or 0, r.ar_ms,
      r.ms > 0 and 100 * r.ar_ms / r.ms or 0, r.ar_calls, r.waits, r.check_ms,
      r.ar_alone_dev_us and string.format("%.1f", r.ar_alone_dev_us) or "-", r.ar_alone_wall_us,
      r.rel_err, r.cosine, r.max_abs, r.pass and "yes" or "NO", r.kernels)
  end
  p("")
  p("TP1 ms: the whole model on each rank's device, timed the same way; speed-up = TP1 ms / ms/step.")
  p("AR alone: NCCL's own all-reduce of one [M, %d] %s tensor (the stack's all-reduce), device time",
    cfg.hidden_size, res.dtype)
  p("per call from CUDA events around it ('-' at world size 1: no collective runs), and wall time")
  p("per call including k3's bounded host wait; AR ms/step = the stack's all-reduces, device time.")
  p("waits/step: the host's waits for a collective on the compute stream (K3_DIST_WAIT=each: one per")
  p("collective); check ms: host time per step in the agreement check, waiting for the other ranks.")
  return table.concat(out, "\n")
end

local usage = [[
usage: scripts/k3 scripts/demo.lua --tp N [options]   (re-runs itself through scripts/k3 --nproc N)
  --config NAME      kimi-k3 (whole model; default on a GPU) | tiny (default on the CPU)
  --steps N          timed decode steps per M (default 20 on a GPU, 5 on the CPU)
  --m LIST           decode batch sizes in 1..16, e.g. 1,16 or 1-16 (default 1,2,4,8,16 on a GPU)
  --weight-sets N    distinct seeded weight sets the layers cycle through (default 2)
  --seed N           seed of weights and inputs (default 1234)
  --timeout S        bound of every wait across ranks (K3_DIST_TIMEOUT)
  --quiet            no progress output (K3_PROGRESS=0 likewise)]]

local function root_dir()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  return (src:match("^(.*)/lua/k3/model/decode_demo_tp%.lua$")) or "."
end

--- main(args): scripts/demo.lua's `--tp N` path. Outside the launcher it re-runs itself as
--- `scripts/k3 --nproc N scripts/demo.lua args…`; under it, every rank runs and rank 0 prints.
--- Returns the process exit status.
function M.main(args)
  local opts = {}
  local function die(msg)
    io.stderr:write("demo: ", msg, "\n", usage, "\n")
    return 2
  end
  -- An option's value as a number (an integer when int), or nil; and the text given.
  local function num(value, int)
    local v = value() or ""
    local x = tonumber(v)
    if int then x = math.tointeger(x) end
    return x, v
  end
  for key, value, a in require("k3.cli").options(args) do
    local v
    if key == "--tp" then opts.tp, v = num(value, true)
      if not opts.tp or opts.tp < 1 then return die("--tp needs a positive integer; got '" .. v .. "'") end
    elseif key == "--config" then opts.config = value()
    elseif key == "--steps" then opts.steps, v = num(value, true)
      if not opts.steps or opts.steps < 1 then return die("--steps must be a positive integer; got '" .. v .. "'") end
    elseif key == "--m" then
      local err
      opts.m, err = require("k3.cli").batch_sizes(value() or "", require("k3.model.decode_demo").max_m)
      if not opts.m then return die("--m: " .. err) end
    elseif key == "--weight-sets" then opts.weight_sets, v = num(value, true)
      if not opts.weight_sets or opts.weight_sets < 1 then
        return die("--weight-sets must be a positive integer; got '" .. v .. "'")
      end
    elseif key == "--seed" then opts.seed, v = num(value, true)
      if not opts.seed then return die("--seed must be an integer; got '" .. v .. "'") end
    elseif key == "--timeout" then opts.timeout, v = num(value, false)
      if not opts.timeout or opts.timeout <= 0 then
        return die("--timeout must be a number of seconds > 0; got '" .. v .. "'")
      end
    elseif key == "--quiet" then opts.quiet = true
    elseif key == "-h" or key == "--help" then print(usage) return 0
    else return die("unknown option '" .. a .. "' (with --tp)") end
  end
  if not opts.tp then return die("--tp N is required here") end
  if not os.getenv("K3_WORLD_SIZE") and opts.tp > 1 then
    -- Checked before any rank starts: N processes failing alike say it N times.
    local cuda = k3.backends().cuda
    if not cuda.available then
      io.stderr:write(string.format("demo: --tp %d needs %d CUDA devices; the CUDA backend is not available: %s\n",
                                    opts.tp, opts.tp, tostring(cuda.reason)))
      return 1
    elseif (cuda.devices or 0) < opts.tp then
      io.stderr:write(string.format("demo: --tp %d needs %d CUDA devices; this machine has %d\n",
                                    opts.tp, opts.tp, cuda.devices or 0))
      return 1
    end
    local quoted = {}
    for _, a in ipairs(args) do quoted[#quoted + 1] = "'" .. a:gsub("'", "'\\''") .. "'" end
    local root = root_dir()
    local cmd = string.format("'%s/scripts/k3' --nproc %d %s'%s/scripts/demo.lua' %s", root, opts.tp,
                              opts.timeout and string.format("--timeout %g ", opts.timeout) or "",
                              root, table.concat(quoted, " "))
    local ok, how, code = os.execute(cmd)
    if ok then return 0 end
    return how == "exit" and code or 1
  end
  local iok, ierr = pcall(k3.dist.init, opts.timeout and {timeout = opts.timeout} or nil)
  if not iok then
    io.stderr:write(string.format("demo (rank %s): %s\n", os.getenv("K3_RANK") or "0",
                                  tostring(ierr):gsub("^[^\n]-:%d+: ", "")))
    return 1
  end
  local ok, res = xpcall(M.run, debug.traceback, opts)
  if not ok then
    require("k3.cli").progress{quiet = opts.quiet}:clear()
    io.stderr:write(string.format("demo (rank %d): %s\n", k3.dist.rank(), tostring(res)))
    return 1
  end
  local pass = true
  for _, r in ipairs(res.rows) do pass = pass and r.pass end
  if k3.dist.rank() == 0 then
    print(M.format(res))
    print(pass and "TP check: rank 0 matches TP=1 within tolerance for every M"
               or "TP check FAILED: rank 0 differs from TP=1 beyond tolerance")
  end
  k3.dist.destroy()
  return pass and 0 or 1
end

return M
