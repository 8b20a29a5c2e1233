-- k3.bench.attn_res — `scripts/bench attn_res`: the AttnRes read with fused delta add and
-- output norm (hidden 7168, 8 block slots, bf16) at T = 1, 4, 16, 256, 4096, 16384 tokens and
-- num_blocks = 1, 4, 8, through cuda.attn_res.packed and cuda.attn_res.generic (kernel = …,
-- out = preallocated), each eager (events around every call, launch included) and inside a
-- CUDA graph (one call per rotated input set per replay), against the copy-bandwidth floor,
-- the peers and the targets of the benchmarks issue.
local k3 = require "k3"
local U = require "k3.bench.util"
local Env = require "k3.bench.env"
local Peers = require "k3.bench.peers"

local A = {}

A.H, A.S = 7168, 8
A.TS = {1, 4, 16, 256, 4096, 16384}
A.NBS = {1, 4, 8}
A.MAX_COPIES = 4096

-- Targets (benchmarks issue): in a graph, T = 1 and T = 16 latency; T >= 4096 bandwidth.
A.TARGETS = {t1_us = 2.5, t16_us = 3.5, big_t = 4096, big_floor_frac = 0.90}

-- Bytes one call must move: prefix and delta read, prefix written back, num_blocks block
-- rows read, out written (all [T, H]), plus the three [H] weights read once.
function A.bytes(T, nb, H)
  H = H or A.H
  return 2 * H * (T * (4 + nb) + 3)
end

local function model_us(kind, floor, T, nb)
  if kind == "packed_g" then return floor / 0.93 + 1.6 + 0.06 * nb + (T >= 16 and 0.5 or 0) end
  if kind == "packed_e" then return floor / 0.93 + 5.5 + 0.06 * nb end
  if kind == "generic_g" then return floor / 0.80 + 3.0 + 0.4 * nb end
  return floor / 0.80 + 7.0 + 0.4 * nb
end

local function target_of(T)
  if T == 1 then return "<= " .. A.TARGETS.t1_us .. " µs", "<=", A.TARGETS.t1_us, "us" end
  if T == 16 then return "<= " .. A.TARGETS.t16_us .. " µs", "<=", A.TARGETS.t16_us, "us" end
  if T >= A.TARGETS.big_t then
    return string.format(">= %.0f%% floor", 100 * A.TARGETS.big_floor_frac), ">=",
           A.TARGETS.big_floor_frac, "frac"
  end
  return nil
end

local rel_diff = U.rel_diff

-- A.run(env, peers, opts) -> {rows =, summary =, lines =}; opts.ts / opts.nbs override.
function A.run(env, peers, opts)
  opts = opts or {}
  local ts, nbs = opts.ts or A.TS, opts.nbs or A.NBS
  local H, S = A.H, A.S
  local h = env:dim(H, 16, 8)
  local packed, generic = env:kernel("cuda.attn_res.packed"), env:kernel("cuda.attn_res.generic")
  local rows = {}
  local total, done = #ts * #nbs, 0
  for ti, T in ipairs(ts) do
    local tl = env.dry and math.max(1, T // env.shrink) or T
    -- Rotation sized for the smallest call (num_blocks = 1) serves every num_blocks.
    local copies = Env.copies_for(A.bytes(T, 1), 1, A.MAX_COPIES)
    local alloc = env:alloc_copies(copies)
    U.progress("attn_res T=%d: filling %d input sets (%.0f MB)", T, copies,
               copies * 2 * (T * (3 + S) + 3) * H / 1e6)
    local P = env:random({alloc * tl, h}, ti * 10 + 1)
    local D = env:random({alloc * tl, h}, ti * 10 + 2)
    local B = env:random({alloc * tl, S, h}, ti * 10 + 3)
    local O = env:empty({alloc * tl, h})
    O:fill(7)
    local NW = env:random({alloc, h}, ti * 10 + 4)
    local QW = env:random({alloc, h}, ti * 10 + 5)
    local OW = env:random({alloc, h}, ti * 10 + 6)
    local sets = {}
    for c = 1, alloc do
      local r = (c - 1) * tl + 1
      sets[c] = {prefix = P:narrow(1, r, tl), delta = D:narrow(1, r, tl),
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
      for _, kern in ipairs({{"packed", packed}, {"generic", generic}}) do
        local name, kname = kern[1], kern[2]
        local args = {}
        for c = 1, alloc do
          local s = sets[c]
          args[c] = {prefix = s.prefix, delta = s.delta, blocks = s.blocks, num_blocks = nb,
                     norm_weight = s.norm_weight, qk_weight = s.qk_weight,
                     output_norm_weight = s.output_norm_weight, eps = 1e-5, output_eps = 1e-5,
                     out = s.out, kernel = kname}
        end
        local function fn(i) k3.attn_res(args[(i - 1) % alloc + 1]) end
        U.progress("attn_res T=%d num_blocks=%d %s eager (%d/%d)", T, nb, name, done, total)
        local tag = string.format("T=%d num_blocks=%d %s", T, nb, name)
        local te, se = env:try_time(tag .. " (eager)", fn,
                                    {graph = false, iters = math.max(env.iters, copies)},
                                    model_us(name .. "_e", floor, T, nb))
        U.progress("attn_res T=%d num_blocks=%d %s graph of %d calls (%d/%d)", T, nb, name,
                   alloc, done, total)
        local tg, sg = env:try_time(tag .. " (graph)", fn, {graph = true, calls = alloc},
                                    model_us(name .. "_g", floor, T, nb))
        row[name .. "_us"], row[name .. "_p90_us"] = te, se.p90
        row[name .. "_graph_us"], row[name .. "_graph_min_us"], row[name .. "_graph_p90_us"] =
          tg, sg.min, sg.p90
        row[name .. "_floor_frac"] = tg and floor / tg
        row[name .. "_GBps"] = tg and bytes / (tg * 1e3)
      end
      -- Check: packed against generic on the first set, from the same prefix (both add
      -- delta into it in place, so it is restored around each call).
      local s = sets[1]
      local p0 = s.prefix:clone()
      local okc, check = pcall(function()
        local function once(kname)
          s.prefix:copy(p0)
          local y = k3.attn_res{prefix = s.prefix, delta = s.delta, blocks = s.blocks,
                                num_blocks = nb, norm_weight = s.norm_weight,
                                qk_weight = s.qk_weight,
                                output_norm_weight = s.output_norm_weight, kernel = kname}
          return y, s.prefix:clone()
        end
        local ya, pa = once(packed)
        local yb, pb = once(generic)
        local d = math.max(rel_diff(ya, yb), rel_diff(pa, pb))
        for _, t in ipairs({ya, pa, yb, pb}) do t:free() end
        return d
      end)
      s.prefix:copy(p0)
      p0:free()
      if okc then
        row.check_rel = check
        row.check_ok = check <= 2e-2
      else
        env.errors = env.errors or {}
        env.errors[#env.errors + 1] = {label = string.format("T=%d num_blocks=%d check", T, nb),
                                       error = (tostring(check):gsub("\n.*", ""))}
      end
      -- Peers and targets.
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
      local pg, pe = row.packed_graph_us, row.packed_us
      row.vs_best_peer_graph = best_g and pg and best_g / pg or nil
      row.vs_best_peer_eager = best_e and pe and best_e / pe or nil
      row.beats_peers = (not best_g or (pg ~= nil and pg < best_g)) and
                        (not best_e or (pe ~= nil and pe < best_e))
      local tdesc, op, tv, unit = target_of(T)
      row.target = tdesc
      if tdesc then
        local v = unit == "us" and row.packed_graph_us or row.packed_floor_frac
        row.target_verdict = U.verdict(v, op, tv)
      end
      row.packed_vs_generic = row.generic_graph_us and pg and row.generic_graph_us / pg or nil
      rows[#rows + 1] = row
    end
    for _, t in ipairs({P, D, B, O, NW, QW, OW}) do t:free() end
    sets = nil
    env:release()
  end
  U.progress_done()
  local res = {rows = rows, summary = A.summarize(rows)}
  res.lines = A.format(env, peers, res)
  return res
end

function A.summarize(rows)
  local T = A.TARGETS
  local s = {losses = {}, bad_checks = {}}
  local wins, n, pvg = 0, 0, {}
  for _, r in ipairs(rows) do
    if r.T == 1 and r.num_blocks == 8 then s.t1_nb8_us = r.packed_graph_us end
    if r.T == 16 and r.num_blocks == 8 then s.t16_nb8_us = r.packed_graph_us end
    if r.T == 1 and r.packed_graph_us then s.t1_max_us = math.max(s.t1_max_us or 0, r.packed_graph_us) end
    if r.T == 16 and r.packed_graph_us then s.t16_max_us = math.max(s.t16_max_us or 0, r.packed_graph_us) end
    if r.T >= T.big_t and r.packed_floor_frac and (not s.big_floor_frac_min or r.packed_floor_frac < s.big_floor_frac_min) then
      s.big_floor_frac_min = r.packed_floor_frac
      s.big_floor_frac_at = string.format("T=%d num_blocks=%d", r.T, r.num_blocks)
    end
    if r.best_peer_graph_us or r.best_peer_eager_us then
      n = n + 1
      if r.beats_peers then
        wins = wins + 1
      else
        s.losses[#s.losses + 1] = string.format("T=%d nb=%d", r.T, r.num_blocks)
      end
    end
    if r.packed_vs_generic then pvg[#pvg + 1] = r.packed_vs_generic end
    if r.check_rel ~= nil and not r.check_ok then
      s.bad_checks[#s.bad_checks + 1] = string.format("T=%d nb=%d", r.T, r.num_blocks)
    end
  end
  s.peer_wins, s.peer_rows = wins, n
  s.packed_vs_generic_geomean = U.geomean(pvg)
  s.verdicts = {
    t1 = U.verdict(s.t1_nb8_us, "<=", T.t1_us),
    t16 = U.verdict(s.t16_nb8_us, "<=", T.t16_us),
    big = U.verdict(s.big_floor_frac_min, ">=", T.big_floor_frac),
    peers = n > 0 and (wins == n and "MET" or "MISSED") or "n/a",
  }
  return s
end

function A.format(env, peers, res)
  local rows, s, T = res.rows, res.summary, A.TARGETS
  local out = {}
  local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  p("== attn_res: hidden %d, %d block slots, bf16, fused delta add and output norm ==", A.H, A.S)
  p("%s", env:header())
  p("µs per call, median; '-g': inside a CUDA graph of one call per rotated input set (sets x bytes > 200 MB),")
  p("else eager (events around each call, launch included). bytes = prefix + delta read, prefix written,")
  p("num_blocks block rows read, out written, 3 weights; floor = bytes / copy bandwidth; %%floor = floor / packed-g.")
  p("peers: %s", peers.source)
  p("  (* triton: PEERS.md's published plain Triton kernel, not re-measured; 'vs peers' = best peer-g / packed-g)")
  p("")
  local cols = {
    {head = "T", key = "T", fmt = "%d"},
    {head = "nb", key = "num_blocks", fmt = "%d"},
    {head = "MB", key = "MB", fmt = function(v) return v < 1 and string.format("%.3f", v) or string.format("%.1f", v) end},
    {head = "floor", key = "floor_us", fmt = U.fmt_us},
    {head = "packed", key = "packed_us", fmt = U.fmt_us},
    {head = "packed-g", key = "packed_graph_us", fmt = U.fmt_us},
    {head = "%floor", key = "packed_floor_frac", fmt = U.pct},
    {head = "generic", key = "generic_us", fmt = U.fmt_us},
    {head = "generic-g", key = "generic_graph_us", fmt = U.fmt_us},
    {head = "gen %floor", key = "generic_floor_frac", fmt = U.pct},
  }
  for _, c in ipairs(Peers.ATTN_COLS) do
    local any = false
    for _, r in ipairs(rows) do if r["peer_" .. c.key] then any = true end end
    if any then cols[#cols + 1] = {head = c.head, key = "peer_" .. c.key, fmt = U.fmt_us} end
  end
  cols[#cols + 1] = {head = "vs peers", key = "vs_best_peer_graph", fmt = "%.1fx"}
  cols[#cols + 1] = {head = "target", align = "l", get = function(r)
    return r.target and (r.target .. " " .. r.target_verdict) or nil
  end}
  cols[#cols + 1] = {head = "check", get = function(r)
    if r.check_rel == nil then return "n/a" end
    return r.check_ok and "ok" or string.format("BAD %.1e", r.check_rel)
  end}
  for _, line in ipairs(U.format_table(cols, rows)) do out[#out + 1] = line end
  local errs = env:take_errors()
  if #errs > 0 then
    p("")
    p("measurements that raised an error (shown as '-' above):")
    for _, l in ipairs(errs) do out[#out + 1] = l end
  end
  p("")
  p("'check': packed vs generic (out and written-back prefix), max|diff| / max|generic| <= 2e-2.")
  p("")
  p("summary against the benchmarks issue's targets (packed kernel):")
  p("  T = 1, 8 blocks, in a graph:     %-9s target <= %.1f µs   %s   (max over num_blocks %s)",
    U.fmt_us(s.t1_nb8_us) .. " µs", T.t1_us, s.verdicts.t1, U.fmt_us(s.t1_max_us))
  p("  T = 16, 8 blocks, in a graph:    %-9s target <= %.1f µs   %s   (max over num_blocks %s)",
    U.fmt_us(s.t16_nb8_us) .. " µs", T.t16_us, s.verdicts.t16, U.fmt_us(s.t16_max_us))
  p("  T >= %d, min %%floor (graph):  %-9s target >= %.0f%%      %s   at %s", T.big_t,
    U.pct(s.big_floor_frac_min), 100 * T.big_floor_frac, s.verdicts.big, s.big_floor_frac_at or "-")
  p("  faster than every peer:          %d/%d rows (graph vs graph, eager vs eager)   %s%s",
    s.peer_wins, s.peer_rows, s.verdicts.peers,
    #s.losses > 0 and ("   not at: " .. table.concat(s.losses, ", ")) or "")
  p("  packed vs generic in a graph:    geomean %s", s.packed_vs_generic_geomean and
    string.format("%.2fx", s.packed_vs_generic_geomean) or "-")
  if #s.bad_checks > 0 then
    p("  OUTPUT CHECK FAILED (packed vs generic > 2e-2): %s", table.concat(s.bad_checks, ", "))
  end
  return out
end

A.CSV_KEYS = {"T", "num_blocks", "copies", "bytes", "MB", "floor_us",
              "packed_us", "packed_p90_us", "packed_graph_us", "packed_graph_min_us",
              "packed_graph_p90_us", "packed_floor_frac", "packed_GBps",
              "generic_us", "generic_p90_us", "generic_graph_us", "generic_graph_min_us",
              "generic_graph_p90_us", "generic_floor_frac", "generic_GBps", "packed_vs_generic",
              "peer_eager_us", "peer_eager_graph_us", "peer_compile_us", "peer_compile_graph_us",
              "peer_triton_us", "peer_triton_graph_us", "best_peer_graph", "best_peer_graph_us",
              "vs_best_peer_graph", "best_peer_eager", "best_peer_eager_us", "vs_best_peer_eager",
              "beats_peers", "target", "target_verdict", "check_rel", "check_ok"}

return A
