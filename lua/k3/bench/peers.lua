-- k3.bench.peers — the figures k3 is compared against: read from scripts/bench-peers.py's
-- JSON (--peers file.json, measured on the same machine just before the run), or, when no
-- file is given, the figures hard-coded below: one measurement on an NVIDIA H200 on
-- 2026-11-29 with PyTorch 2.11 (CUDA 13.0) and Triton 3.6, taken with scripts/bench-peers.py's
-- method (median per call in a replayed CUDA graph, inputs rotated beyond L2, random data).
-- Tables always say which source their peer columns came from.
-- The plain Triton AttnRes kernel's figures come from the file when it has them
-- (bench-peers.py --only attn_res_triton, which scripts/bench attn_res runs in the same
-- command), else from the 2026-11-29 measurement, marked as not measured in this run.
local U = require "k3.bench.util"

local P = {}

P.PUBLISHED_SOURCE = "peer figures measured on an H200 on 2026-11-29 (PyTorch 2.11, Triton 3.6), not in this run"

-- 2026-11-29, linear: torch.matmul(x, w.t()) (cuBLAS), µs per call in a graph, M = 1, 2, 4, 8, 16.
P.published_linear = {
  {1536, 7168, {10.54, 11.26, 11.23, 11.31, 11.47}},
  {3072, 7168, {17.59, 17.46, 17.32, 17.41, 17.79}},
  {2112, 7168, {14.07, 13.86, 14.00, 13.86, 14.18}},
  {2304, 1536, {5.67, 5.68, 5.69, 5.71, 5.76}},
  {4608, 1536, {7.03, 6.98, 7.01, 7.08, 7.16}},
  {3584, 7168, {18.22, 18.09, 18.21, 18.37, 18.55}},
  {6288, 7168, {26.25, 26.43, 26.68, 26.92, 27.41}},
  {12448, 7168, {49.82, 49.75, 50.65, 50.71, 49.81}},
  {7168, 768, {5.84, 5.93, 5.87, 5.94, 6.04}},
  {7168, 1536, {8.98, 8.90, 9.09, 9.11, 9.29}},
  {7168, 3072, {16.73, 16.92, 17.02, 17.18, 15.04}},
  {7168, 3584, {18.29, 18.23, 18.46, 18.53, 16.29}},
  {7168, 4224, {20.43, 20.39, 20.72, 20.87, 18.51}},
  {7168, 8448, {35.69, 36.53, 37.36, 37.23, 37.75}},
  {8448, 7168, {31.81, 31.61, 31.38, 31.37, 31.71}},
  {16896, 7168, {58.89, 59.10, 59.27, 58.99, 59.07}},
  {7168, 14336, {54.56, 54.93, 55.49, 56.10, 58.62}},
  {20480, 7168, {80.80, 79.25, 78.71, 81.16, 78.40}},
  {7168, 7168, {30.16, 30.54, 30.52, 30.77, 31.18}},
}
P.published_linear_m = {1, 2, 4, 8, 16}

-- 2026-11-29, attn_res (H 7168, 8 slots, delta + output norm): T, num_blocks, eager, eager in a
-- graph, triton, triton in a graph (µs per call).
P.published_attn_res = {
  {1, 1, 469.8, 49.7, 44.1, 4.21},
  {1, 4, 413.8, 53.5, 38.8, 6.42},
  {1, 8, 410.7, 60.1, 40.1, 9.33},
  {4, 1, 408.3, 63.5, 38.3, 4.12},
  {4, 4, 406.2, 78.3, 27.2, 6.30},
  {4, 8, 468.4, 78.0, 37.3, 9.32},
  {16, 1, 472.1, 88.9, 26.7, 4.22},
  {16, 4, 303.4, 95.4, 42.4, 7.13},
  {16, 8, 440.2, 100.7, 43.3, 11.61},
  {256, 1, 457.5, 170.6, 43.2, 9.70},
  {256, 4, 451.8, 291.3, 49.0, 14.05},
  {256, 8, 478.9, 369.8, 50.1, 19.70},
  {4096, 1, 1761.4, 1703.7, 121.9, 97.66},
  {4096, 4, 3314.0, 3250.4, 180.4, 153.90},
  {4096, 8, 4539.2, 4469.6, 267.8, 238.66},
  {16384, 1, 6610.8, 6528.6, 393.8, 365.70},
  {16384, 4, 12750.5, 12649.9, 619.6, 583.58},
  {16384, 8, 17624.0, 17511.2, 926.9, 908.38},
}

-- The attn_res peer columns, in print order. graph = true: compared with k3's in-graph time.
P.ATTN_COLS = {
  {key = "eager_us", head = "torch", graph = false},
  {key = "eager_graph_us", head = "torch-g", graph = true},
  {key = "compile_us", head = "compile", graph = false},
  {key = "compile_graph_us", head = "compile-g", graph = true},
  {key = "triton_us", head = "triton", graph = false},
  {key = "triton_graph_us", head = "triton-g", graph = true},
}

local function lin_key(N, K, M) return string.format("%dx%d/%d", N, K, M) end
local function attn_key(T, nb) return string.format("%d/%d", T, nb) end

local function num(v)
  if type(v) == "number" and v == v and v > 0 then return v end
  return nil
end

-- P.merge(a, b): b's attn_res figures (a second peers file, e.g. the Triton kernel measured
-- in this run) over a's; the source line names both.
function P.merge(a, b)
  for k, row in pairs(b.attn_rows) do
    local t = a.attn_rows[k] or {}
    for kk, v in pairs(row) do
      if v and (b.from_file or not t[kk]) then t[kk] = v end
    end
    a.attn_rows[k] = t
  end
  a.triton_measured = a.triton_measured or b.triton_measured
  a.source = a.source .. "; " .. b.source
  for _, n in ipairs(b.notes) do a.notes[#a.notes + 1] = n end
  return a
end

-- P.load(path or nil) -> peers object:
--   peers.source                    one line naming where the figures came from
--   peers:linear(N, K, M)           -> {torch_us =, torch_eager_us =} or {}
--   peers:attn_res(T, nb)           -> {eager_us =, eager_graph_us =, compile_us =, ...} or {}
--   peers.copy_GBps                 the peers' own measured copy bandwidth (file only)
--   peers.notes                     notes from the file
function P.load(path)
  local self = {linear_rows = {}, attn_rows = {}, notes = {}}
  for _, r in ipairs(P.published_attn_res) do
    self.attn_rows[attn_key(r[1], r[2])] = {triton_us = r[5], triton_graph_us = r[6]}
  end
  if path then
    local ok, data = pcall(U.json_decode, U.read_file(path))
    if not ok then error(string.format("bench: --peers %s: %s", path, data), 0) end
    if type(data) ~= "table" or type(data.linear) ~= "table" and type(data.attn_res) ~= "table" then
      error(string.format("bench: --peers %s: not a bench-peers.py file (no 'linear' or 'attn_res' list)", path), 0)
    end
    self.source = string.format("%s (bench-peers.py, %s, %s, torch %s%s)", path,
                                tostring(data.date or "?"), tostring(data.device or "?"),
                                tostring(data.torch or "?"), data.dry_run and ", DRY RUN" or "")
    self.copy_GBps = num(data.copy_GBps)
    self.compile_mode = data.compile_mode
    for _, n in ipairs(type(data.notes) == "table" and data.notes or {}) do
      self.notes[#self.notes + 1] = tostring(n)
    end
    for _, r in ipairs(type(data.linear) == "table" and data.linear or {}) do
      if type(r) == "table" and r.N and r.K and r.M then
        self.linear_rows[lin_key(r.N, r.K, r.M)] = {torch_us = num(r.graph_us),
                                                     torch_eager_us = num(r.eager_us)}
      end
    end
    for _, r in ipairs(type(data.attn_res) == "table" and data.attn_res or {}) do
      if type(r) == "table" and r.T and r.num_blocks then
        local row = self.attn_rows[attn_key(r.T, r.num_blocks)] or {}
        row.eager_us = num(r.eager_us)
        row.eager_graph_us = num(r.eager_graph_us)
        row.compile_us = num(r.compile_us)
        row.compile_graph_us = num(r.compile_graph_us)
        self.attn_rows[attn_key(r.T, r.num_blocks)] = row
      end
    end
    for _, r in ipairs(type(data.attn_res_triton) == "table" and data.attn_res_triton or {}) do
      if type(r) == "table" and r.T and r.num_blocks then
        local row = self.attn_rows[attn_key(r.T, r.num_blocks)] or {}
        row.triton_us = num(r.eager_us)
        row.triton_graph_us = num(r.graph_us)
        self.attn_rows[attn_key(r.T, r.num_blocks)] = row
        self.triton_measured = true
      end
    end
    self.from_file = true
  else
    self.source = P.PUBLISHED_SOURCE
    for _, r in ipairs(P.published_linear) do
      for i, m in ipairs(P.published_linear_m) do
        self.linear_rows[lin_key(r[1], r[2], m)] = {torch_us = r[3][i]}
      end
    end
    for _, r in ipairs(P.published_attn_res) do
      local row = self.attn_rows[attn_key(r[1], r[2])]
      row.eager_us, row.eager_graph_us = r[3], r[4]
    end
    self.from_file = false
  end
  function self:linear(N, K, M) return self.linear_rows[lin_key(N, K, M)] or {} end
  function self:attn_res(T, nb) return self.attn_rows[attn_key(T, nb)] or {} end
  return self
end

return P
