-- k3.bench.linear — `scripts/bench linear`: every Kimi-K3 TP8 projection shape (DESIGN.md, plus
-- 7168x7168) at M = 1, 2, 4, 8, 16: the low-latency plan's choice (k3.method.low_latency over
-- k3.plan_for(w) with static weights, as a model's layers run it; what m:explain says it runs)
-- against cuBLAS (kernel = "cuda.linear.cublas"), each timed in a CUDA graph of one call per
-- rotated weight copy (launch overhead excluded, as scripts/bench-peers.py times cuBLAS),
-- with eager times at M = 1, bandwidth, the copy-bandwidth floor, the read limit and the
-- targets below.
--
-- The read limit of a shape is what k3's read-only streaming kernel (tools/read_limit.cuh, run
-- by scripts/read-limit in the same bench run) takes for exactly the weight's bytes, timed the
-- same way: the floor a weight-streaming kernel can reach. Where the plan's kernel launches
-- with programmatic dependent launch (the skinny kernel always does) the read limit used is
-- the read kernel chained with PDL, and the calls of every timed graph form
-- a decode-like chain: call c reads as x the buffer call c - 1 wrote as y (its first M x K
-- elements; the first M x N are that call's output), so the overlap PDL buys is the overlap a
-- decode step can get. The weights are scaled by 1/sqrt(K) so the chain's values stay near
-- unit size. cuBLAS is timed over the same chain.
local k3 = require "k3"
local U = require "k3.bench.util"
local Env = require "k3.bench.env"

local L = {}

-- DESIGN.md's local bf16 projection shapes (N, K) at TP8, plus the square 7168x7168.
L.SHAPES = {
  {1536, 7168}, {3072, 7168}, {2112, 7168}, {2304, 1536}, {4608, 1536}, {3584, 7168},
  {6288, 7168}, {12448, 7168}, {7168, 768}, {7168, 1536}, {7168, 3072}, {7168, 3584},
  {7168, 4224}, {7168, 8448}, {8448, 7168}, {16896, 7168}, {7168, 14336}, {20480, 7168},
  {7168, 7168},
}
L.MS = {1, 2, 4, 8, 16}

-- The targets of the low-latency plan (after scripts/autotune), against cuBLAS and the read limit.
L.TARGETS = {
  geomean_m1 = 1.30,        -- geomean speed-up over cuBLAS at M = 1
  geomean_m16 = 1.20,       -- ... at M = 16
  worst_ratio = 0.98,       -- never slower than cuBLAS by more than 2%
  read_frac_m1 = 0.95,      -- every shape at >= 95% of its read limit at M = 1
  read_frac_m16 = 0.90,     -- ... >= 90% at M = 16
  floor_gap_us = 1.5,       -- (reported) shapes within 1.5 µs of the copy floor at M = 1
  big_floor_frac = 0.92,    -- (reported) fraction of the copy floor on weights above 100 MB
  big_bytes = 100e6,
}

-- The `linear` record's figures against L.TARGETS, for `scripts/bench standing` (k3.bench.summary
-- .standing): {key in the record, label, op, target, format, the field naming where}.
L.STANDING = {
  {"geomean_m1", "speed-up over cuBLAS, geomean, M = 1", ">=", L.TARGETS.geomean_m1, "x"},
  {"geomean_m16", "speed-up over cuBLAS, geomean, M = 16", ">=", L.TARGETS.geomean_m16, "x"},
  {"worst_ratio", "speed-up over cuBLAS, worst (shape, M)", ">=", L.TARGETS.worst_ratio, "x", "worst_at"},
  {"read_limit_frac_m1_min", "of the read limit, worst shape, M = 1", ">=", L.TARGETS.read_frac_m1, "pct"},
  {"read_limit_frac_m16_min", "of the read limit, worst shape, M = 16", ">=", L.TARGETS.read_frac_m16, "pct"},
}

-- A plan used by --dry-run only when the machine has none (CPU tensors never get one): it
-- exercises the plan and config code paths; its entries decline on the CPU like any other.
local DRY_PLAN = {
  [1] = {kernel = "skinny", config = {threads = 256, rows = 8, unroll = 4, vec = 8}},
  [2] = {kernel = "skinny", config = {threads = 128, rows = 2, unroll = 4, vec = 8}},
  [4] = {kernel = "skinny", config = {threads = 256, rows = 2, vec = 8, split_k = 2}},
}


-- The checkout's root (this file is <root>/lua/k3/bench/linear.lua).
local function repo_root()
  local path = package.searchpath("k3.bench.linear", package.path) or ""
  local root = path:gsub("/?lua/k3/bench/linear%.lua$", "")
  return root ~= "" and root or "."
end
L.repo_root = repo_root

-- L.read_limits(env, byte_counts[, flags]) -> {[bytes] = {read_us =, read_pdl_us =, read_shape =,
-- read_pdl_shape =, read_dep_us =, read_dep_shape =}}, machine, method (read_dep_us: chained
-- with PDL through a data dependency, tools/read_limit.cuh's dependent chain). flags: more arguments of scripts/read-limit (the stack
-- bench's {"--single", "--reps", "5"}). On the GPU: scripts/read-limit (tools/read_limit.cu),
-- which raises here when it fails; in a dry run: a model (bytes over the nominal bandwidth
-- plus a 1.5 µs ramp; 0.3 µs of it left when chained with PDL, 1.0 µs in the dependent chain).
function L.read_limits(env, byte_counts, flags)
  local out = {}
  if env.dry then
    for _, b in ipairs(byte_counts) do
      local t = b / (Env.NOMINAL_BW * 1e3)
      out[b] = {read_us = t + 1.5, read_pdl_us = t + 0.3, read_dep_us = t + 1.0, read_shape = "model",
                read_pdl_shape = "model", read_dep_shape = "model"}
    end
    return out, "dry run (CPU): modelled read limits", "model"
  end
  local list = {}
  for i, b in ipairs(byte_counts) do list[i] = string.format("%d", b) end
  local tmp = os.tmpname()
  local cmd = string.format("%s/scripts/read-limit --bytes %s --json %s%s", U.shell_quote(repo_root()),
                            table.concat(list, ","), U.shell_quote(tmp),
                            flags and #flags > 0 and " " .. table.concat(flags, " ") or "")
  local ok = os.execute(cmd .. " >&2")
  local text = ok and U.read_file(tmp) or nil
  os.remove(tmp)
  if not text then error("linear: scripts/read-limit failed (" .. cmd .. ")", 0) end
  local doc = U.json_decode(text)
  for _, r in ipairs(doc.results or {}) do out[math.tointeger(r.bytes) or r.bytes] = r end
  for _, b in ipairs(byte_counts) do
    if not out[b] then error(string.format("linear: scripts/read-limit gave no figure for %d bytes", b), 0) end
  end
  return out, doc.machine, doc.method
end

local function config_string(entry)
  if not entry then return nil end
  local c = entry.config or {}
  local parts = {}
  for _, f in ipairs({{"threads", "t"}, {"rows", "r"}, {"unroll", "u"}, {"vec", "v"},
                      {"split_k", "s"}, {"rows_per_warp", "w"}}) do
    if c[f[1]] then parts[#parts + 1] = f[2] .. tostring(c[f[1]]) end
  end
  if c.balanced then parts[#parts + 1] = "bal" end -- the balanced grid
  if (c.l2_prefetch_mb or 0) > 0 then parts[#parts + 1] = "pf" .. c.l2_prefetch_mb end -- MiB into L2 first
  return tostring(entry.kernel) .. (#parts > 0 and (" " .. table.concat(parts, "/")) or "")
end

local function short_kernel(name)
  return (name or "?"):gsub("^cuda%.linear%.", ""):gsub("^cpu%.linear%.", "cpu.")
end

local rel_diff = U.rel_diff

-- Dry-run stand-in timings: bytes over the nominal bandwidth with kernel-like efficiencies
-- and latencies, varied per shape so every summary branch is exercised.
local function model_us(env, kind, N, K, M, bytes)
  local floor = bytes / (Env.NOMINAL_BW * 1e3)
  local wiggle = ((N // 64 + K // 64 + M) % 7) / 100
  if kind == "plan" then return floor / (0.93 - wiggle) + 0.9 end
  if kind == "plan_eager" then return floor / (0.93 - wiggle) + 4.5 end
  if kind == "cublas_eager" then return floor / 0.85 + 7.0 end
  return floor / 0.85 + 3.5 - 3 * wiggle
end

-- L.run(env, peers, opts) -> {rows =, summary =, lines =}; opts.shapes / opts.ms override.
function L.run(env, peers, opts)
  opts = opts or {}
  local shapes, ms = opts.shapes or L.SHAPES, opts.ms or L.MS
  local cublas = env:kernel("cuda.linear.cublas")
  local rows = {}
  local total = #shapes * #ms
  local done = 0
  local sizes, seen = {}, {}
  for _, sh in ipairs(shapes) do
    local b = 2 * sh[1] * sh[2]
    if not seen[b] then seen[b] = true; sizes[#sizes + 1] = b end
  end
  U.progress("linear: the read limit of %d weight sizes (scripts/read-limit)", #sizes)
  local limits, machine, limit_method = L.read_limits(env, sizes)
  for si, sh in ipairs(shapes) do
    local N, K = sh[1], sh[2]
    local n, k = env:dim(N, 16, 8), env:dim(K, 16, 8)
    local wbytes = 2 * N * K
    -- at least 8 copies: chained with PDL several calls are in flight, never on one copy
    local copies = Env.copies_for(wbytes, 8)
    local alloc = env:alloc_copies(copies)
    U.progress("linear %d/%d %dx%d: filling %d weight copies (%.0f MB)", si, #shapes, N, K,
               copies, copies * wbytes / 1e6)
    local ws = {}
    for c = 1, alloc do
      local raw = env:random({n, k}, si * 1000 + c)
      ws[c] = raw * (1 / math.sqrt(k))
      raw:free()
    end
    local plan = k3.plan_for(ws[1])
    local plan_source = plan and "policy" or "none"
    if not plan and env.dry then plan, plan_source = DRY_PLAN, "dry-run stand-in" end
    local method = k3.method.low_latency(plan or {}, {static_weights = true})
    local lim = limits[wbytes]
    for _, M in ipairs(ms) do
      done = done + 1
      U.progress("linear %d/%d %dx%d M=%d (%d/%d)", si, #shapes, N, K, M, done, total)
      -- The chain: buffer c holds call c's y (first M*N elements) and is call c + 1's x
      -- (first M*K); alloc buffers, one per call of the graph, call 1 reading buffer alloc.
      local width = M * math.max(n, k)
      local CH = env:random({alloc, width}, si * 7 + M)
      local xs, ys, popt, copt = {}, {}, {}, {}
      for c = 1, alloc do
        local prev = (c - 2) % alloc + 1
        xs[c] = CH:select(1, prev):narrow(1, 1, M * k):view({M, k})
        ys[c] = CH:select(1, c):narrow(1, 1, M * n):view({M, n})
        popt[c] = {out = ys[c]}
        copt[c] = {kernel = cublas, out = ys[c]}
      end
      local X1 = env:random({M, k}, si * 11 + M) -- the unchained input of the check
      local bytes = 2 * (N * K + M * K + M * N)
      local floor = env:floor_us(bytes)
      local ex = method:explain(X1, ws[1])
      local entry = plan and plan[M]
      local fast = ex.chosen and ex.chosen:find("skinny", 1, true) ~= nil
      local pdl = fast -- the skinny kernel launches with PDL
      local read_us = pdl and lim.read_pdl_us or lim.read_us
      local dep_us = pdl and lim.read_dep_us or lim.read_us
      local note
      if not fast then
        for _, d in ipairs(ex.declined or {}) do
          if d.kernel == "cuda.linear.skinny" or d.kernel == "low_latency" or
             d.kernel:find("skinny") then
            note = d.reason
            break
          end
        end
        note = note or (entry and "plan entry not used" or "no plan entry for this M")
      end
      local function plan_fn(i)
        local c = (i - 1) % alloc + 1
        method:apply(xs[c], ws[c], nil, popt[c])
      end
      local function cublas_fn(i)
        local c = (i - 1) % alloc + 1
        k3.linear(xs[c], ws[c], copt[c])
      end
      -- One eager call per copy first: a static-weights method marks each weight static on
      -- its first call, which loads w after the wait; the timed calls are the later ones.
      for c = 1, alloc do plan_fn(c) end
      local gopts = {graph = true, calls = alloc}
      local tag = string.format("%dx%d M=%d", N, K, M)
      local t_plan, s_plan = env:try_time(tag .. " plan (graph)", plan_fn, gopts,
                                          model_us(env, "plan", N, K, M, bytes))
      local t_cub, s_cub = env:try_time(tag .. " cuBLAS (graph)", cublas_fn, gopts,
                                        model_us(env, "cublas", N, K, M, bytes))
      local t_plan_e, t_cub_e
      if M == 1 then
        local eopts = {graph = false, iters = math.max(env.iters, copies)}
        t_plan_e = env:try_time(tag .. " plan (eager)", plan_fn, eopts,
                                model_us(env, "plan_eager", N, K, M, bytes))
        t_cub_e = env:try_time(tag .. " cuBLAS (eager)", cublas_fn, eopts,
                               model_us(env, "cublas_eager", N, K, M, bytes))
      end
      -- Fast garbage is not fast: the plan's output (into a NaN-poisoned out) against cuBLAS's
      -- on the first copy.
      local okc, check = pcall(function()
        local y1 = env:empty({M, n})
        y1:fill(0 / 0)
        method:apply(X1, ws[1], nil, {out = y1})
        local y2 = k3.linear(X1, ws[1], {kernel = cublas})
        local d = rel_diff(y1, y2)
        y1:free()
        y2:free()
        return d
      end)
      if not okc then
        env.errors = env.errors or {}
        env.errors[#env.errors + 1] = {label = tag .. " check", error = tostring(check):gsub("\n.*", "")}
        check = nil
      end
      local peer = peers:linear(N, K, M)
      local function ratio(a, b) return a and b and a / b or nil end
      rows[#rows + 1] = {
        shape = string.format("%dx%d", N, K), N = N, K = K, M = M,
        weight_MB = wbytes / 1e6, bytes = bytes, copies = copies,
        choice = ex.chosen, config = fast and config_string(entry) or nil,
        plan_entry = config_string(entry), plan_source = plan_source, note = note,
        plan_us = t_plan, plan_min_us = s_plan.min, plan_p90_us = s_plan.p90,
        cublas_us = t_cub, cublas_min_us = s_cub.min, cublas_p90_us = s_cub.p90,
        speedup = ratio(t_cub, t_plan), floor_us = floor, gap_us = t_plan and t_plan - floor,
        plan_GBps = t_plan and bytes / (t_plan * 1e3), cublas_GBps = t_cub and bytes / (t_cub * 1e3),
        plan_floor_frac = ratio(floor, t_plan), cublas_floor_frac = ratio(floor, t_cub),
        launch = pdl and "pdl" or "plain", read_us = read_us,
        read_shape = pdl and lim.read_pdl_shape or lim.read_shape,
        read_frac = ratio(read_us, t_plan), cublas_read_frac = ratio(read_us, t_cub),
        dep_us = dep_us, dep_frac = ratio(dep_us, t_plan),
        plan_eager_us = t_plan_e, cublas_eager_us = t_cub_e,
        torch_us = peer.torch_us, torch_eager_us = peer.torch_eager_us,
        vs_torch = ratio(peer.torch_us, t_plan),
        check_rel = check, check_ok = check ~= nil and check <= 2e-2,
      }
      X1:free()
      CH:free()
    end
    for c = 1, alloc do ws[c]:free() end
    method:free()
    env:release()
  end
  U.progress_done()
  local res = {rows = rows, summary = L.summarize(rows), machine = machine,
               read_limit_method = limit_method}
  res.lines = L.format(env, peers, res)
  return res
end

-- Summary against the targets.
function L.summarize(rows)
  local T = L.TARGETS
  local by_m = {}
  local worst, worst_row
  local big_min, big_min_row, big_m1_min, big_m1_row
  local near, near_total, far = 0, 0, {}
  local vs_torch_m1 = {}
  local bad_checks = {}
  local read_min, read_min_at = {}, {}
  local dep_min, dep_min_at = {}, {}
  local won = {}
  for _, r in ipairs(rows) do
    if (r.M == 1 or r.M == 16) and r.read_frac and
       (not read_min[r.M] or r.read_frac < read_min[r.M]) then
      read_min[r.M], read_min_at[r.M] = r.read_frac, r.shape
    end
    if (r.M == 1 or r.M == 16) and r.dep_frac and
       (not dep_min[r.M] or r.dep_frac < dep_min[r.M]) then
      dep_min[r.M], dep_min_at[r.M] = r.dep_frac, r.shape
    end
    if r.M == 1 and r.config then won[#won + 1] = r.shape end
    by_m[r.M] = by_m[r.M] or {}
    if r.speedup then table.insert(by_m[r.M], r.speedup) end
    if r.speedup and (not worst or r.speedup < worst) then worst, worst_row = r.speedup, r end
    if r.weight_MB * 1e6 > T.big_bytes and r.plan_floor_frac then
      if not big_min or r.plan_floor_frac < big_min then big_min, big_min_row = r.plan_floor_frac, r end
      if r.M == 1 and (not big_m1_min or r.plan_floor_frac < big_m1_min) then
        big_m1_min, big_m1_row = r.plan_floor_frac, r
      end
    end
    if r.M == 1 then
      near_total = near_total + 1
      if r.gap_us and r.gap_us <= T.floor_gap_us then near = near + 1 else far[#far + 1] = r.shape end
      if r.vs_torch then vs_torch_m1[#vs_torch_m1 + 1] = r.vs_torch end
    end
    if r.check_rel ~= nil and not r.check_ok then bad_checks[#bad_checks + 1] = string.format("%s M=%d", r.shape, r.M) end
  end
  local s = {
    geomean_m1 = U.geomean(by_m[1] or {}), geomean_m16 = U.geomean(by_m[16] or {}),
    geomean_by_m = {},
    worst_ratio = worst, worst_at = worst_row and string.format("%s M=%d", worst_row.shape, worst_row.M),
    near_floor_m1 = near, near_floor_total = near_total, far_from_floor_m1 = far,
    big_floor_frac_min = big_min,
    big_floor_frac_min_at = big_min_row and string.format("%s M=%d", big_min_row.shape, big_min_row.M),
    big_floor_frac_m1_min = big_m1_min,
    big_floor_frac_m1_at = big_m1_row and big_m1_row.shape,
    geomean_vs_torch_m1 = U.geomean(vs_torch_m1),
    bad_checks = bad_checks,
    read_limit_frac_m1_min = read_min[1], read_limit_frac_m1_at = read_min_at[1],
    read_limit_frac_m16_min = read_min[16], read_limit_frac_m16_at = read_min_at[16],
    dep_floor_frac_m1_min = dep_min[1], dep_floor_frac_m1_at = dep_min_at[1],
    dep_floor_frac_m16_min = dep_min[16], dep_floor_frac_m16_at = dep_min_at[16],
    shapes_won = won,
  }
  for m, xs in pairs(by_m) do s.geomean_by_m[tostring(m)] = U.geomean(xs) end
  s.verdicts = {
    geomean_m1 = U.verdict(s.geomean_m1, ">=", T.geomean_m1),
    geomean_m16 = U.verdict(s.geomean_m16, ">=", T.geomean_m16),
    worst_ratio = U.verdict(s.worst_ratio, ">=", T.worst_ratio),
    near_floor_m1 = near_total > 0 and (near == near_total and "MET" or "MISSED") or "n/a",
    big_floor_frac = U.verdict(s.big_floor_frac_min, ">=", T.big_floor_frac),
    read_frac_m1 = U.verdict(s.read_limit_frac_m1_min, ">=", T.read_frac_m1),
    read_frac_m16 = U.verdict(s.read_limit_frac_m16_min, ">=", T.read_frac_m16),
  }
  return s
end

function L.format(env, peers, res)
  local rows, s, T = res.rows, res.summary, L.TARGETS
  local out = {}
  local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  p("== linear: y[M,N] = x[M,K] w[N,K]^T, bf16; k3's low-latency plan vs cuBLAS ==")
  p("%s", env:header())
  p("times: median µs per call inside a CUDA graph of one call per rotated weight copy (copies x weight > 200 MB),")
  p("each call's x the previous call's y; random bf16 data; floor = (weight + x + y bytes) / copy bandwidth;")
  p("%%floor = floor / time; gap = time - floor; read = the read limit of the weight's bytes (k3's read-only")
  p("streaming kernel, best launch shape, timed the same way; chained with PDL where 'launch' is pdl);")
  p("%%read = read / time; dep = the same read chained through a data dependency (after its wait each")
  p("read loads the previous read's output, then meets at a barrier, then writes: a decode chain's floor);")
  p("%%dep = dep / time. Read limit: %s; %s", res.read_limit_method or "-", res.machine or "-")
  p("peer column 'torch': torch.nn.functional.linear, from %s", peers.source)
  p("")
  local cols = {
    {head = "N x K", key = "shape", align = "l"},
    {head = "MB", key = "weight_MB", fmt = "%.1f"},
    {head = "M", key = "M", fmt = "%d"},
    {head = "plan runs", align = "l", get = function(r)
      return r.config or short_kernel(r.choice)
    end},
    {head = "k3 µs", key = "plan_us", fmt = U.fmt_us},
    {head = "cuBLAS µs", key = "cublas_us", fmt = U.fmt_us},
    {head = "speed-up", key = "speedup", fmt = "%.2fx"},
    {head = "GB/s", key = "plan_GBps", fmt = "%.0f"},
    {head = "launch", key = "launch", align = "l"},
    {head = "read µs", key = "read_us", fmt = U.fmt_us},
    {head = "%read", key = "read_frac", fmt = U.pct},
    {head = "cuBLAS %read", key = "cublas_read_frac", fmt = U.pct},
    {head = "dep µs", key = "dep_us", fmt = U.fmt_us},
    {head = "%dep", key = "dep_frac", fmt = U.pct},
    {head = "floor µs", key = "floor_us", fmt = U.fmt_us},
    {head = "%floor", key = "plan_floor_frac", fmt = U.pct},
    {head = "cuBLAS %floor", key = "cublas_floor_frac", fmt = U.pct},
    {head = "gap µs", key = "gap_us", fmt = "%.2f"},
    {head = "torch µs", key = "torch_us", fmt = U.fmt_us},
    {head = "vs torch", key = "vs_torch", fmt = "%.2fx"},
    {head = "eager k3", key = "plan_eager_us", fmt = U.fmt_us},
    {head = "eager cuBLAS", key = "cublas_eager_us", fmt = U.fmt_us},
    {head = "check", get = function(r)
      if r.check_rel == nil then return "n/a" end
      return r.check_ok and "ok" or string.format("BAD %.1e", r.check_rel)
    end},
  }
  for _, line in ipairs(U.format_table(cols, rows)) do out[#out + 1] = line end
  local errs = env:take_errors()
  if #errs > 0 then
    p("")
    p("measurements that raised an error (shown as '-' above):")
    for _, l in ipairs(errs) do out[#out + 1] = l end
  end
  p("")
  p("'plan runs': the kernel m:explain chose (skinny with its plan config, or cublas where the plan")
  p("has no entry or declined); 'eager' columns: M = 1, one call per sample, launch overhead included;")
  p("'check': max|k3 - cuBLAS| / max|cuBLAS| <= 2e-2 on the first copy.")
  local notes = {}
  for _, r in ipairs(rows) do
    if r.note then notes[r.note] = (notes[r.note] or 0) + 1 end
  end
  local nk = {}
  for k in pairs(notes) do nk[#nk + 1] = k end
  table.sort(nk)
  if #nk > 0 then
    p("why the plan ran cuBLAS (reason, rows):")
    for _, k in ipairs(nk) do p("  %3d  %s", notes[k], k) end
  end
  p("")
  p("summary against the targets (plan after scripts/autotune):")
  local function fx(v) return v and string.format("%.2fx", v) or "-" end
  p("  geomean speed-up over cuBLAS, M = 1:   %-8s target >= %.2fx   %s", fx(s.geomean_m1),
    T.geomean_m1, s.verdicts.geomean_m1)
  p("  geomean speed-up over cuBLAS, M = 16:  %-8s target >= %.2fx   %s", fx(s.geomean_m16),
    T.geomean_m16, s.verdicts.geomean_m16)
  local ms = {}
  for m in pairs(s.geomean_by_m) do ms[#ms + 1] = tonumber(m) end
  table.sort(ms)
  local parts = {}
  for _, m in ipairs(ms) do parts[#parts + 1] = string.format("M=%d %s", m, fx(s.geomean_by_m[tostring(m)])) end
  p("  geomean speed-up by M:                 %s", table.concat(parts, ", "))
  p("  worst ratio (cuBLAS / k3):             %-8s target >= %.2fx (never > 2%% slower)   %s   at %s",
    fx(s.worst_ratio), T.worst_ratio, s.verdicts.worst_ratio, s.worst_at or "-")
  p("  %%read limit, min over shapes, M = 1:   %-8s target >= %.0f%%   %s   at %s",
    U.pct(s.read_limit_frac_m1_min), 100 * T.read_frac_m1, s.verdicts.read_frac_m1,
    s.read_limit_frac_m1_at or "-")
  p("  %%read limit, min over shapes, M = 16:  %-8s target >= %.0f%%   %s   at %s",
    U.pct(s.read_limit_frac_m16_min), 100 * T.read_frac_m16, s.verdicts.read_frac_m16,
    s.read_limit_frac_m16_at or "-")
  p("  %%dependent-chain floor, min, M = 1:    %-8s (no target: the floor a chain of dependent calls can reach)   at %s",
    U.pct(s.dep_floor_frac_m1_min), s.dep_floor_frac_m1_at or "-")
  p("  %%dependent-chain floor, min, M = 16:   %-8s   at %s", U.pct(s.dep_floor_frac_m16_min),
    s.dep_floor_frac_m16_at or "-")
  p("  shapes the plan runs skinny at M = 1:   %d/%d   %s", #s.shapes_won, s.near_floor_total,
    table.concat(s.shapes_won, ", "))
  p("  shapes within %.1f µs of floor, M = 1:  %d/%d     target %d/%d   %s%s", T.floor_gap_us,
    s.near_floor_m1, s.near_floor_total, s.near_floor_total, s.near_floor_total,
    s.verdicts.near_floor_m1,
    #s.far_from_floor_m1 > 0 and ("   beyond: " .. table.concat(s.far_from_floor_m1, ", ")) or "")
  p("  %%floor on weights > 100 MB, min:       %-8s target >= %.0f%%   %s   at %s (M = 1 min %s at %s)",
    U.pct(s.big_floor_frac_min), 100 * T.big_floor_frac, s.verdicts.big_floor_frac,
    s.big_floor_frac_min_at or "-", U.pct(s.big_floor_frac_m1_min), s.big_floor_frac_m1_at or "-")
  if s.geomean_vs_torch_m1 then
    p("  geomean speed-up over torch (peer), M = 1: %s", fx(s.geomean_vs_torch_m1))
  end
  if #s.bad_checks > 0 then
    p("  OUTPUT CHECK FAILED (k3 vs cuBLAS > 2e-2): %s", table.concat(s.bad_checks, ", "))
  end
  return out
end

L.CSV_KEYS = {"shape", "N", "K", "M", "weight_MB", "copies", "choice", "config", "plan_entry",
              "plan_source", "note", "plan_us", "plan_min_us", "plan_p90_us", "cublas_us",
              "cublas_min_us", "cublas_p90_us", "speedup", "launch", "read_us", "read_shape",
              "read_frac", "cublas_read_frac", "dep_us", "dep_frac", "floor_us", "gap_us", "plan_GBps",
              "cublas_GBps", "plan_floor_frac", "cublas_floor_frac", "plan_eager_us",
              "cublas_eager_us", "torch_us", "torch_eager_us", "vs_torch", "check_rel", "check_ok"}

-- L.summary_object(res, cmd, commit) -> the `linear` object of bench/summary-<gpu>.json
-- (ratios > 1 when k3 is faster; fractions 0..1; shapes_won: "NxK" where the plan runs the
-- skinny kernel at M = 1).
function L.summary_object(res, cmd, commit)
  local s = res.summary
  return {
    date = U.date(), machine = res.machine, commit = commit, command = cmd,
    geomean_m1 = s.geomean_m1, geomean_m16 = s.geomean_m16, worst_ratio = s.worst_ratio,
    worst_at = s.worst_at,
    read_limit_frac_m1_min = s.read_limit_frac_m1_min,
    read_limit_frac_m16_min = s.read_limit_frac_m16_min,
    dep_floor_frac_m1_min = s.dep_floor_frac_m1_min,
    dep_floor_frac_m16_min = s.dep_floor_frac_m16_min,
    shapes_won = s.shapes_won,
    targets = {geomean_m1 = L.TARGETS.geomean_m1, geomean_m16 = L.TARGETS.geomean_m16,
               worst_ratio = L.TARGETS.worst_ratio, read_limit_frac_m1_min = L.TARGETS.read_frac_m1,
               read_limit_frac_m16_min = L.TARGETS.read_frac_m16},
  }
end

return L
