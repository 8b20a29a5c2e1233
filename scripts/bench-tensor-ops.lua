-- scripts/k3 scripts/bench-tensor-ops.lua — one line per case: the CUDA tensor ops
-- (cuda.abs.generic, cuda.exp.generic, t / u, cuda.sum/max.generic over a dim and over all
-- elements) on [7168, 7168] tensors, larger than L2, out = preallocated; µs per call with CUDA
-- events (launch included, warm-up first, median of 20) beside the floor: bytes moved over the
-- read limit (4.3 TB/s for a read, 4.2 TB/s copy rate for read plus write, notes/PERF.md).
-- Writes tensor_ops_bench.csv under $OUT when set.
local k3 = require "k3"
assert(k3.backends().cuda.available, "bench-tensor-ops: needs a CUDA device")
local N = 7168
local READ, COPY = 4.3e12, 4.2e12
local rows = {}

local function case(name, bytes, bw, fn)
  fn(0)
  k3.synchronize()
  local us = k3.cuda_time(fn, {iters = 20, warmup = 3})
  local floor = bytes / bw * 1e6
  rows[#rows + 1] = {name, us, floor}
  print(string.format("%-44s %9.2f us  floor %8.2f us  %5.1f%% of floor", name, us, floor,
                      100 * floor / us))
end

for _, dt in ipairs({"bf16", "f32"}) do
  local s = dt == "bf16" and 2 or 4
  local x = k3.randn({N, N}, {device = "cuda", dtype = dt, seed = 1})
  local u = (k3.randn({N, N}, {device = "cuda", dtype = dt, seed = 2}) * 0.5 + 3)
  local y = k3.empty({N, N}, {device = "cuda", dtype = dt})
  local bytes = N * N * s
  case(dt .. " abs [7168, 7168]", 2 * bytes, COPY, function() k3.abs(x, {out = y}) end)
  case(dt .. " exp [7168, 7168]", 2 * bytes, COPY, function() k3.exp(x, {out = y}) end)
  case(dt .. " t / u [7168, 7168] (new tensor)", 3 * bytes, COPY, function() local _ = x / u end)
  local r = k3.empty({N, 1}, {device = "cuda", dtype = dt})
  case(dt .. " sum over dim 2 (7168 outputs)", bytes, READ, function() k3.sum(x, 2, {out = r}) end)
  case(dt .. " max over dim 2 (values and indices)", bytes, READ, function() k3.max(x, 2, {out = r}) end)
  local c = k3.empty({1, N}, {device = "cuda", dtype = dt})
  case(dt .. " sum over dim 1 (stride 7168)", bytes, READ, function() k3.sum(x, 1, {out = c}) end)
  local flat = x:view(N * N)
  local one = k3.empty({1}, {device = "cuda", dtype = dt})
  case(dt .. " sum of all 51.4M elements", bytes, READ, function() k3.sum(flat, 1, {out = one}) end)
  case(dt .. " max of all 51.4M elements", bytes, READ, function() k3.max(flat, 1, {out = one}) end)
  for _, t in ipairs({x, u, y, r, c, one}) do t:free() end
end

local dir = os.getenv("OUT")
if dir and dir ~= "" then
  os.execute("mkdir -p '" .. dir .. "'")
  local f = assert(io.open(dir .. "/tensor_ops_bench.csv", "w"))
  f:write("case,us,floor_us\n")
  for _, r in ipairs(rows) do f:write(string.format("%s,%.3f,%.3f\n", r[1], r[2], r[3])) end
  f:close()
end
