-- k3.bench.attn_res — `scripts/bench attn_res`: the AttnRes read with fused delta add and
-- output norm (hidden 7168, 8 block slots, bf16) at T = 1, 4, 16, 256, 4096, 16384 tokens and
-- num_blocks = 1, 4, 8, through each CUDA kernel that serves the row (cuda.attn_res.decode,
-- .stream, .generic: kernel = …, out = preallocated), each eager (events around every call,
-- launch included) and inside a CUDA graph (one call per rotated input set per replay),
-- against the copy-bandwidth floor, the peers and the targets. "fast" is the kernel default
-- dispatch picks for the row. Each call's delta is the previous call's output, so a kernel
-- launched with programmatic dependent launch overlaps its predecessor only as far as its
-- contract allows: the calls carry a decode step's contract (static_weights, static_blocks =
-- num_blocks: weights and blocks are written before the timed calls), delta and prefix are
-- read after the wait.
local k3 = require "k3"
local U = require "k3.bench.util"
local Env = require "k3.bench.env"
local Peers = require "k3.bench.peers"

local A = {}

A.H, A.S = 7168, 8
A.TS = {1, 4, 16, 256, 4096, 16384}
A.NBS = {1, 4, 8}
A.MAX_COPIES = 4096

-- Targets, in a graph: T = 1 and T = 16 latency (num_blocks 8; T = 1 num_blocks 1 has its
-- own), T = 256, and T >= 4096 bandwidth; the generic kernel within 2x of the fast one at
-- T <= 16.
A.TARGETS = {t1_us = 2.5, t1_nb1_us = 2.0, t16_us = 3.5, t256_us = 12.0, big_t = 4096,
             big_floor_frac = 0.90, generic_over_fast = 2.0}

-- The `attn_res` record's figures against A.TARGETS, for `scripts/bench standing`
-- (k3.bench.summary.standing): {key in the record, label, op, target, format}; "all" compares
-- the key with the record's field named by the target (every row).
A.STANDING = {
  {"t1_nb1_us", "T = 1, 1 block, in a graph", "<=", A.TARGETS.t1_nb1_us, "us"},
  {"t1_nb8_us", "T = 1, 8 blocks, in a graph", "<=", A.TARGETS.t1_us, "us"},
  {"t16_nb8_us", "T = 16, 8 blocks, in a graph", "<=", A.TARGETS.t16_us, "us"},
  {"t256_nb8_us", "T = 256, 8 blocks, in a graph", "<=", A.TARGETS.t256_us, "us"},
  {"big_floor_frac_min", "of the floor, worst row at T >= " .. A.TARGETS.big_t, ">=", A.TARGETS.big_floor_frac, "pct"},
  {"generic_over_fast_max_t16", "generic / fast kernel, worst at T <= 16", "<=", A.TARGETS.generic_over_fast, "x"},
  {"peer_wins", "rows faster than the Triton peer", "all", "peer_rows", "rows"},
}

-- The kernels timed, as {short name, kernel}.
A.KERNELS = {{"decode", "cuda.attn_res.decode"},
             {"ring", "cuda.attn_res.ring"},
             {"stream", "cuda.attn_res.stream"},
             {"generic", "cuda.attn_res.generic"}}

-- Bytes one call must move: prefix and delta read, prefix written back, num_blocks block
-- rows read, out written (all [T, H]), plus the three [H] weights read once.
function A.bytes(T, nb, H)
  H = H or A.H
  return 2 * H * (T * (4 + nb) + 3)
end

local function model_us(kind, floor, T, nb)
  if kind == "decode_g" then return floor / 0.93 + 1.6 + 0.06 * nb + (T >= 16 and 0.5 or 0) end
  if kind == "decode_e" then return floor / 0.93 + 5.5 + 0.06 * nb end
  if kind == "stream_g" then return floor / 0.90 + 2.0 end
  if kind == "stream_e" then return floor / 0.90 + 6.0 end
  if kind == "generic_g" then return floor / 0.80 + 3.0 + 0.4 * nb end
  return floor / 0.80 + 7.0 + 0.4 * nb
end

local function target_of(T, nb)
  if T == 1 and nb == 1 then return "<= " .. A.TARGETS.t1_nb1_us .. " µs", "<=", A.TARGETS.t1_nb1_us, "us" end
  if T == 1 and nb == 8 then return "<= " .. A.TARGETS.t1_us .. " µs", "<=", A.TARGETS.t1_us, "us" end
  if T == 16 and nb == 8 then return "<= " .. A.TARGETS.t16_us .. " µs", "<=", A.TARGETS.t16_us, "us" end
  if T == 256 and nb == 8 then return "<= " .. A.TARGETS.t256_us .. " µs", "<=", A.TARGETS.t256_us, "us" end
  if T >= A.TARGETS.big_t then
    return string.format(">= %.0f%% floor", 100 * A.TARGETS.big_floor_frac), ">=",
           A.TARGETS.big_floor_frac, "frac"
  end
  return nil
end

local rel_diff = U.rel_diff

-- The args of one call for set c (delta = the previous set's out: see the header).
local function call_args(sets, c, nb, kname)
  local s = sets[c]
  return {prefix = s.prefix, delta = s.delta, blocks = s.blocks, num_blocks = nb,
          norm_weight = s.norm_weight, qk_weight = s.qk_weight,
          output_norm_weight = s.output_norm_weight, eps = 1e-5, output_eps = 1e-5,
          static_weights = true, static_blocks = nb, out = s.out, kernel = kname}
end

-- True when kernel kname serves this call: dispatch under a policy whose attn_res list is
-- kname alone (then the CPU reference, which declines CUDA tensors) picks it. Else false and
-- kname's decline reason (a kernel asked for rows it does not serve is not an error: the row
-- shows '-'). A forced kernel= skips supports(), so it cannot answer this.
local function serves(a, kname)
  local saved = k3.policy
  local p = {}
  for k, v in pairs(saved) do p[k] = v end
  p.attn_res = kname == "cpu.attn_res.reference" and {kname} or {kname, "cpu.attn_res.reference"}
  p.on_layout_mismatch = "fallback"
  local probe = {}
  for k, v in pairs(a) do probe[k] = v end
  probe.kernel = nil
  k3.set_policy(p)
  local ok, e = pcall(k3.explain, "attn_res", probe)
  k3.set_policy(saved)
  if not ok then return false, tostring(e):gsub("\n.*", "") end
  if e.chosen == kname then return true end
  for _, d in ipairs(e.declined or {}) do
    if d.kernel == kname then return false, d.reason end
  end
  return false, e.error or "not chosen"
end

-- A.run(env, peers, opts) -> {rows =, summary =, lines =}; opts.ts / opts.nbs override the
-- rows, opts.kernels (short names) the kernels, opts.graph_only skips the eager figures,
-- opts.independent_delta gives each call a delta of its own (no chain through the outputs).
function A.run(env, peers, opts)
  opts = opts or {}
  local ts, nbs = opts.ts or A.TS, opts.nbs or A.NBS
  local H, S = A.H, A.S
  local h = env:dim(H, 16, 8)
  local kernels = {}
  for _, kk in ipairs(A.KERNELS) do
    local want = not opts.kernels
    for _, n in ipairs(opts.kernels or {}) do if n == kk[1] then want = true end end
    if want then kernels[#kernels + 1] = {kk[1], env:kernel(kk[2])} end
  end
  local rows, other_reads = {}, {}
  local total, done = #ts * #nbs, 0
  for ti, T in ipairs(ts) do
    local tl = env.dry and math.max(1, T // env.shrink) or T
    -- Rotation sized for the smallest call (num_blocks = 1) serves every num_blocks.
    local copies = Env.copies_for(A.bytes(T, 1), 2, A.MAX_COPIES)
    local alloc = env:alloc_copies(copies)
    U.progress("attn_res T=%d: filling %d input sets (%.0f MB)", T, copies,
               copies * 2 * (T * (3 + S) + 3) * H / 1e6)
    local P = env:random({alloc * tl, h}, ti * 10 + 1)
    local B = env:random({alloc * tl, S, h}, ti * 10 + 3)
    local O = env:random({alloc * tl, h}, ti * 10 + 2)
    local D = opts.independent_delta and env:random({alloc * tl, h}, ti * 10 + 7) or nil
    local NW = env:random({alloc, h}, ti * 10 + 4)
    local QW = env:random({alloc, h}, ti * 10 + 5)
    local OW = env:random({alloc, h}, ti * 10 + 6)
    local sets = {}
    for c = 1, alloc do
      local r, rp = (c - 1) * tl + 1, ((c - 2) % alloc) * tl + 1
      sets[c] = {prefix = P:narrow(1, r, tl), delta = D and D:narrow(1, r, tl) or O:narrow(1, rp, tl),
                 blocks = B:narrow(1, r, tl), out = O:narrow(1, r, tl),
                 norm_weight = NW:select(1, c), qk_weight = QW:select(1, c),
                 output_norm_weight = OW:select(1, c)}
    end
    for _, nb in ipairs(nbs) do
      done = done + 1
      local bytes = A.bytes(T, nb)
      local floor = env:floor_us(bytes)
      local row = {T = T, num_blocks = nb, copies = copies, bytes = bytes, MB = bytes / 1e6,
                   floor_us = floor}
      local probe = call_args(sets, 1, nb, nil)
      local okx, ex = pcall(k3.explain, "attn_res", probe)
      row.fast = okx and ex.chosen or nil
      for _, kern in ipairs(kernels) do
        local name, kname = kern[1], kern[2]
        local served, why = serves(call_args(sets, 1, nb, kname), kname)
        if not served then row[name .. "_declined"] = why end
        if served then
          local args = {}
          for c = 1, alloc do args[c] = call_args(sets, c, nb, kname) end
          local function fn(i) k3.attn_res(args[(i - 1) % alloc + 1]) end
          local tag = string.format("T=%d num_blocks=%d %s", T, nb, name)
          if not opts.graph_only then
            U.progress("attn_res T=%d num_blocks=%d %s eager (%d/%d)", T, nb, name, done, total)
            local te, se = env:try_time(tag .. " (eager)", fn,
                                        {graph = false, iters = math.max(env.iters, copies)},
                                        model_us(name .. "_e", floor, T, nb))
            row[name .. "_us"], row[name .. "_p90_us"] = te, se.p90
          end
          U.progress("attn_res T=%d num_blocks=%d %s graph of %d calls (%d/%d)", T, nb, name,
                     alloc, done, total)
          local tg, sg = env:try_time(tag .. " (graph)", fn, {graph = true, calls = alloc},
                                      model_us(name .. "_g", floor, T, nb))
          row[name .. "_graph_us"], row[name .. "_graph_min_us"], row[name .. "_graph_p90_us"] =
            tg, sg.min, sg.p90
          row[name .. "_floor_frac"] = tg and floor / tg
          row[name .. "_GBps"] = tg and bytes / (tg * 1e3)
        end
      end
      for _, kk in ipairs(A.KERNELS) do
        if not row.fast_name and env:kernel(kk[2]) == row.fast then row.fast_name = kk[1] end
      end
      -- A dry run maps every kernel to the CPU reference: name the one a GPU would pick (these
      -- rows carry a delta and the output norm at H = 7168, so the ring kernel takes what the
      -- decode kernel leaves: kernels/attn_res_decode.cu decode_supports, attn_res_ring.cu
      -- ring_supports).
      if env.dry then
        row.fast_name = (T <= 64 or nb == 0 or (nb <= 4 and T < 256)) and "decode" or "ring"
      end
      if row.fast_name then
        row.fast_graph_us = row[row.fast_name .. "_graph_us"]
        row.fast_us = row[row.fast_name .. "_us"]
        row.fast_floor_frac = row[row.fast_name .. "_floor_frac"]
      end
      -- Check: every timed kernel against generic on the first set, from the same prefix
      -- (each adds delta into it in place, so it is restored around each call).
      local s = sets[1]
      local p0 = s.prefix:clone()
      local worst, checked = 0, 0
      local okc, err = pcall(function()
        local function once(kname)
          s.prefix:copy(p0)
          local a = call_args(sets, 1, nb, kname)
          a.out = nil
          local y = k3.attn_res(a)
          return y, s.prefix:clone()
        end
        local yb, pb = once(env:kernel("cuda.attn_res.generic"))
        for _, kern in ipairs(kernels) do
          if kern[1] ~= "generic" and row[kern[1] .. "_graph_us"] then
            local ya, pa = once(kern[2])
            worst = math.max(worst, rel_diff(ya, yb), rel_diff(pa, pb))
            checked = checked + 1
            ya:free()
            pa:free()
          end
        end
        yb:free()
        pb:free()
      end)
      s.prefix:copy(p0)
      p0:free()
      if okc and checked > 0 then
        row.check_rel = worst
        row.check_ok = worst <= 2e-2
      elseif not okc then
        env.errors = env.errors or {}
        env.errors[#env.errors + 1] = {label = string.format("T=%d num_blocks=%d check", T, nb),
                                       error = (tostring(err):gsub("\n.*", ""))}
      end
      -- Peers and targets: the fast kernel against the best peer (graph vs graph, eager vs
      -- eager), and against the Triton peer in a graph alone.
      local peer = peers:attn_res(T, nb)
      local best_g, best_g_name, best_e, best_e_name
      for _, c in ipairs(Peers.ATTN_COLS) do
        local v = peer[c.key]
        row["peer_" .. c.key] = v
        if v then
          if c.graph and (not best_g or v < best_g) then best_g, best_g_name = v, c.head end
          if not c.graph and (not best_e or v < best_e) then best_e, best_e_name = v, c.head end
        end
      end
      row.best_peer_graph_us, row.best_peer_graph = best_g, best_g_name
      row.best_peer_eager_us, row.best_peer_eager = best_e, best_e_name
      local pg, pe = row.fast_graph_us, row.fast_us
      row.vs_best_peer_graph = best_g and pg and best_g / pg or nil
      row.vs_best_peer_eager = best_e and pe and best_e / pe or nil
      row.beats_peers = (not best_g or (pg ~= nil and pg < best_g)) and
                        (opts.graph_only or not best_e or (pe ~= nil and pe < best_e))
      local tri = peer.triton_graph_us
      row.vs_triton = tri and pg and tri / pg or nil
      row.beats_triton = tri and pg and pg < tri or nil
      local tdesc, op, tv, unit = target_of(T, nb)
      row.target = tdesc
      if tdesc then
        local v = unit == "us" and row.fast_graph_us or row.fast_floor_frac
        row.target_verdict = U.verdict(v, op, tv)
      end
      row.generic_over_fast = row.generic_graph_us and pg and row.generic_graph_us / pg or nil
      rows[#rows + 1] = row
    end
    if T == 1 and not opts.kernels then
      A.run_other_reads(env, sets, alloc, copies, other_reads)
    end
    for _, t in ipairs({P, B, O, NW, QW, OW, D}) do t:free() end
    sets = nil
    env:release()
  end
  U.progress_done()
  local res = {rows = rows, summary = A.summarize(rows), independent_delta = opts.independent_delta,
               other_reads = other_reads,
               machine = env:device_name(),
               partial = (opts.ts or opts.nbs or opts.kernels or opts.independent_delta) and true or nil}
  res.lines = A.format(env, peers, res, kernels)
  return res
end

-- The decode step's other reads, at T = 1: no delta (the read after a seal) and a fused seal
-- (write_block = num_blocks + 1, so static_blocks stays num_blocks), num_blocks 1 and 7, in a
-- graph over the same rotated sets, by the kernel dispatch picks and by the generic kernel.
A.OTHER_READS = {{"no delta", false}, {"seal", true}}
function A.run_other_reads(env, sets, alloc, copies, out)
  for _, nb in ipairs({1, A.S - 1}) do
    for _, case in ipairs(A.OTHER_READS) do
      local row = {T = 1, num_blocks = nb, read = case[1]}
      local function args_for(kname)
        local a = {}
        for c = 1, alloc do
          local x = call_args(sets, c, nb, kname)
          if case[2] then x.write_block = nb + 1 else x.delta = nil end
          a[c] = x
        end
        return a
      end
      local probe = args_for(nil)[1]
      local okx, ex = pcall(k3.explain, "attn_res", probe)
      row.fast = okx and ex.chosen or nil
      for _, k in ipairs({{"fast", nil}, {"generic", env:kernel("cuda.attn_res.generic")}}) do
        local a = args_for(k[2])
        local tag = string.format("T=1 num_blocks=%d %s %s", nb, case[1], k[1])
        U.progress("attn_res %s graph of %d calls", tag, alloc)
        local tg = env:try_time(tag .. " (graph)", function(i) k3.attn_res(a[(i - 1) % alloc + 1]) end,
                                {graph = true, calls = alloc}, 3.0 + 0.3 * nb)
        row[k[1] .. "_graph_us"] = tg
      end
      row.generic_over_fast = row.generic_graph_us and row.fast_graph_us and
                              row.generic_graph_us / row.fast_graph_us or nil
      out[#out + 1] = row
    end
  end
end

-- The summary (the `attn_res` object of bench/summary-h200.json takes its keys from here).
function A.summarize(rows)
  local T = A.TARGETS
  local s = {losses = {}, bad_checks = {}}
  local wins, n, twins, tn = 0, 0, 0, 0
  for _, r in ipairs(rows) do
    local g = r.fast_graph_us
    if r.T == 1 and r.num_blocks == 1 then s.t1_nb1_us = g end
    if r.T == 1 and r.num_blocks == 8 then s.t1_nb8_us = g end
    if r.T == 16 and r.num_blocks == 8 then s.t16_nb8_us = g end
    if r.T == 256 and r.num_blocks == 8 then s.t256_nb8_us = g end
    if r.T >= T.big_t and r.fast_floor_frac and (not s.big_floor_frac_min or r.fast_floor_frac < s.big_floor_frac_min) then
      s.big_floor_frac_min = r.fast_floor_frac
      s.big_floor_frac_at = string.format("T=%d num_blocks=%d", r.T, r.num_blocks)
    end
    if r.peer_triton_graph_us then
      tn = tn + 1
      if r.beats_triton then
        twins = twins + 1
      else
        s.losses[#s.losses + 1] = string.format("T=%d nb=%d", r.T, r.num_blocks)
      end
    end
    if r.best_peer_graph_us or r.best_peer_eager_us then
      n = n + 1
      if r.beats_peers then wins = wins + 1 end
    end
    if r.T <= 16 and r.generic_over_fast then
      s.generic_over_fast_max_t16 = math.max(s.generic_over_fast_max_t16 or 0, r.generic_over_fast)
    end
    if r.check_rel ~= nil and not r.check_ok then
      s.bad_checks[#s.bad_checks + 1] = string.format("T=%d nb=%d", r.T, r.num_blocks)
    end
  end
  s.peer_rows, s.peer_wins = tn, twins
  s.all_peer_rows, s.all_peer_wins = n, wins
  s.verdicts = {
    t1_nb1 = U.verdict(s.t1_nb1_us, "<=", T.t1_nb1_us),
    t1 = U.verdict(s.t1_nb8_us, "<=", T.t1_us),
    t16 = U.verdict(s.t16_nb8_us, "<=", T.t16_us),
    t256 = U.verdict(s.t256_nb8_us, "<=", T.t256_us),
    big = U.verdict(s.big_floor_frac_min, ">=", T.big_floor_frac),
    peers = tn > 0 and (twins == tn and "MET" or "MISSED") or "n/a",
    generic = U.verdict(s.generic_over_fast_max_t16, "<=", T.generic_over_fast),
  }
  return s
end

function A.format(env, peers, res, kernels)
  local rows, s, T = res.rows, res.summary, A.TARGETS
  local out = {}
  local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  p("== attn_res: hidden %d, %d block slots, bf16, fused delta add and output norm ==", A.H, A.S)
  p("%s", env:header())
  p("µs per call, median; '-g': inside a CUDA graph of one call per rotated input set (sets x bytes > 200 MB),")
  p("else eager (events around each call, launch included). bytes = prefix + delta read, prefix written,")
  p("num_blocks block rows read, out written, 3 weights; floor = bytes / copy bandwidth; %%floor = floor / fast-g;")
  p("fast = the kernel default dispatch picks; %s;", res.independent_delta and
    "each call's delta is an input of its own" or "each call's delta is the previous call's output")
  p("'-' under a kernel: it declines the row (its reason is the row's <kernel>_declined in attn_res.json).")
  p("peers: %s", peers.source)
  p("")
  local cols = {
    {head = "T", key = "T", fmt = "%d"},
    {head = "nb", key = "num_blocks", fmt = "%d"},
    {head = "MB", key = "MB", fmt = function(v) return v < 1 and string.format("%.3f", v) or string.format("%.1f", v) end},
    {head = "floor", key = "floor_us", fmt = U.fmt_us},
  }
  for _, kern in ipairs(kernels or A.KERNELS) do
    local name = kern[1]
    cols[#cols + 1] = {head = name, key = name .. "_us", fmt = U.fmt_us}
    cols[#cols + 1] = {head = name .. "-g", key = name .. "_graph_us", fmt = U.fmt_us}
  end
  cols[#cols + 1] = {head = "fast", key = "fast_name", fmt = "%s", align = "l"}
  cols[#cols + 1] = {head = "%floor", key = "fast_floor_frac", fmt = U.pct}
  for _, c in ipairs(Peers.ATTN_COLS) do
    local any = false
    for _, r in ipairs(rows) do if r["peer_" .. c.key] then any = true end end
    if any then cols[#cols + 1] = {head = c.head, key = "peer_" .. c.key, fmt = U.fmt_us} end
  end
  cols[#cols + 1] = {head = "vs triton-g", key = "vs_triton", fmt = "%.2fx"}
  cols[#cols + 1] = {head = "gen/fast", key = "generic_over_fast", fmt = "%.2fx"}
  cols[#cols + 1] = {head = "target", align = "l", get = function(r)
    return r.target and (r.target .. " " .. r.target_verdict) or nil
  end}
  cols[#cols + 1] = {head = "check", get = function(r)
    if r.check_rel == nil then return "n/a" end
    return r.check_ok and "ok" or string.format("BAD %.1e", r.check_rel)
  end}
  -- Columns with no value in any row are left out (eager figures under --graph-only).
  local used = {}
  for _, c in ipairs(cols) do
    local any = c.get ~= nil
    for _, r in ipairs(rows) do if c.key and r[c.key] ~= nil then any = true end end
    if any then used[#used + 1] = c end
  end
  for _, line in ipairs(U.format_table(used, rows)) do out[#out + 1] = line end
  local errs = env:take_errors()
  if #errs > 0 then
    p("")
    p("measurements that raised an error (shown as '-' above):")
    for _, l in ipairs(errs) do out[#out + 1] = l end
  end
  if res.other_reads and #res.other_reads > 0 then
    p("")
    p("the decode step's other reads (T = 1, in a graph, µs; 'fast' = what dispatch picks):")
    local dcols = {
      {head = "T", key = "T", fmt = "%d"}, {head = "nb", key = "num_blocks", fmt = "%d"},
      {head = "read", key = "read", fmt = "%s", align = "l"}, {head = "fast", key = "fast", fmt = "%s", align = "l"},
      {head = "fast-g", key = "fast_graph_us", fmt = U.fmt_us},
      {head = "generic-g", key = "generic_graph_us", fmt = U.fmt_us},
      {head = "gen/fast", key = "generic_over_fast", fmt = "%.2fx"},
    }
    for _, line in ipairs(U.format_table(dcols, res.other_reads)) do out[#out + 1] = line end
  end
  p("")
  p("'check': each kernel vs generic (out and written-back prefix), max|diff| / max|generic| <= 2e-2.")
  p("")
  p("summary against the targets (fast kernel, in a graph):")
  p("  T = 1, 1 block:         %-9s target <= %.1f µs   %s", U.fmt_us(s.t1_nb1_us) .. " µs", T.t1_nb1_us, s.verdicts.t1_nb1)
  p("  T = 1, 8 blocks:        %-9s target <= %.1f µs   %s", U.fmt_us(s.t1_nb8_us) .. " µs", T.t1_us, s.verdicts.t1)
  p("  T = 16, 8 blocks:       %-9s target <= %.1f µs   %s", U.fmt_us(s.t16_nb8_us) .. " µs", T.t16_us, s.verdicts.t16)
  p("  T = 256, 8 blocks:      %-9s target <= %.1f µs  %s", U.fmt_us(s.t256_nb8_us) .. " µs", T.t256_us, s.verdicts.t256)
  p("  T >= %d, min %%floor:  %-9s target >= %.0f%%     %s   at %s", T.big_t,
    U.pct(s.big_floor_frac_min), 100 * T.big_floor_frac, s.verdicts.big, s.big_floor_frac_at or "-")
  p("  faster than Triton-g:   %d/%d rows   %s%s", s.peer_wins, s.peer_rows, s.verdicts.peers,
    #s.losses > 0 and ("   not at: " .. table.concat(s.losses, ", ")) or "")
  p("  generic / fast, T<=16:  %s (max)   target <= %.1fx   %s", s.generic_over_fast_max_t16 and
    string.format("%.2fx", s.generic_over_fast_max_t16) or "-", T.generic_over_fast, s.verdicts.generic)
  if #s.bad_checks > 0 then
    p("  OUTPUT CHECK FAILED (kernel vs generic > 2e-2): %s", table.concat(s.bad_checks, ", "))
  end
  return out
end

-- A.summary_object(res, cmd, commit) -> the `attn_res` object of bench/summary-<gpu>.json
-- (k3.bench.summary writes it): date (UTC, ISO 8601), machine, commit, command, t1_nb1_us,
-- t1_nb8_us, t16_nb8_us, t256_nb8_us, big_floor_frac_min (T >= 4096), peer_rows and peer_wins
-- (rows where the fast kernel beats the Triton peer in a graph), generic_over_fast_max_t16.
-- nil for a partial run (a subset of rows or kernels, independent delta), whose figures are
-- not the benchmark's (every figure here is a graph figure, so --graph-only is a full run).
function A.summary_object(res, cmd, commit)
  if res.partial then return nil end
  local s = res.summary
  return {
    date = U.date(), machine = res.machine, commit = commit, command = cmd,
    t1_nb1_us = s.t1_nb1_us, t1_nb8_us = s.t1_nb8_us, t16_nb8_us = s.t16_nb8_us,
    t256_nb8_us = s.t256_nb8_us, big_floor_frac_min = s.big_floor_frac_min,
    peer_rows = s.peer_rows, peer_wins = s.peer_wins,
    generic_over_fast_max_t16 = s.generic_over_fast_max_t16,
  }
end

A.CSV_KEYS = {"T", "num_blocks", "copies", "bytes", "MB", "floor_us", "fast", "fast_name",
              "fast_us", "fast_graph_us", "fast_floor_frac"}
for _, kk in ipairs(A.KERNELS) do
  for _, suffix in ipairs({"_us", "_p90_us", "_graph_us", "_graph_min_us", "_graph_p90_us",
                           "_floor_frac", "_GBps"}) do
    A.CSV_KEYS[#A.CSV_KEYS + 1] = kk[1] .. suffix
  end
end
for _, k in ipairs({"generic_over_fast", "peer_eager_us", "peer_eager_graph_us", "peer_compile_us",
                    "peer_compile_graph_us", "peer_triton_us", "peer_triton_graph_us",
                    "best_peer_graph", "best_peer_graph_us", "vs_best_peer_graph", "best_peer_eager",
                    "best_peer_eager_us", "vs_best_peer_eager", "beats_peers", "vs_triton",
                    "beats_triton", "target", "target_verdict", "check_rel", "check_ok"}) do
  A.CSV_KEYS[#A.CSV_KEYS + 1] = k
end

return A
