-- scripts/dist-probe.lua — what one all-reduce costs on this machine's GPUs, per message size:
-- every rank runs it under `scripts/k3 --nproc N` (scripts/dist-probe runs it in each NCCL
-- setting). Two loops per size of [M, 7168] bf16 (the Kimi-K3 stack's all-reduce):
--   back to back: n calls queued one after another (K3_DIST_WAIT as set), mean device time per
--     call from k3.dist.stats (CUDA events around the NCCL call) and wall time per call;
--   released: before each call the stream is drained and the ranks' hosts meet at the barrier,
--     so both launch within microseconds: the median and p90 of the device time is then the
--     collective's own latency, without waiting for a slower rank.
-- Rank 0 prints one row per size and, with $OUT set, writes $OUT/dist-probe-<label>.csv.
-- Arguments: label (default "default"), then sizes M (default 1 16 64 256).
local k3 = require "k3"
local d = k3.dist
d.init()
local rank, W = d.rank(), d.world_size()
local label = arg[1] or "default"
local ms = {}
for i = 2, #arg do ms[#ms + 1] = math.tointeger(tonumber(arg[i])) end
if #ms == 0 then ms = {1, 16, 64, 256} end
local hidden, n = 7168, 100
local device = d.device()

local function quantile(xs, q)
  table.sort(xs)
  return xs[math.max(1, math.ceil(q * #xs))]
end

local rows = {}
for _, m in ipairs(ms) do
  -- 2^-100 keeps n sums over the ranks finite in bf16.
  local t = k3.full({m, hidden}, 2 ^ -100, {dtype = "bf16", device = device})
  for _ = 1, 10 do d.all_reduce(t) end
  k3.synchronize()
  d.synchronize()
  d.barrier()
  d.stats{reset = true}
  local t0 = k3.clock()
  for _ = 1, n do d.all_reduce(t) end
  k3.synchronize()
  d.synchronize()
  local b2b_wall = (k3.clock() - t0) * 1e6 / n
  local st = d.stats{reset = true}
  local b2b_dev = st.all_reduce.calls > 0 and st.all_reduce.ms * 1e3 / st.all_reduce.calls or 0
  local dev, wall = {}, {}
  for i = 1, n do
    k3.synchronize()
    d.synchronize()
    d.barrier()
    local c0 = k3.clock()
    d.all_reduce(t)
    d.synchronize()
    wall[i] = (k3.clock() - c0) * 1e6
    local s = d.stats{reset = true}.all_reduce
    dev[i] = s.calls > 0 and s.ms * 1e3 / s.calls or 0
  end
  rows[#rows + 1] = {m = m, bytes = m * hidden * 2, b2b_dev = b2b_dev, b2b_wall = b2b_wall,
                     dev_med = quantile(dev, 0.5), dev_p90 = quantile(dev, 0.9),
                     wall_med = quantile(wall, 0.5), check_us = st.check.ms * 1e3 / math.max(1, st.check.calls)}
  t:free()
end
d.barrier()

if rank == 0 then
  local env = {}
  for _, v in ipairs{"NCCL_PROTO", "NCCL_ALGO", "K3_DIST_WAIT", "K3_DIST_CHECK"} do
    if os.getenv(v) then env[#env + 1] = v .. "=" .. os.getenv(v) end
  end
  print(string.format("dist-probe %s (%d ranks on %s; %s): all-reduce of [M, %d] bf16, %d calls per loop, µs",
                      label, W, device, #env > 0 and table.concat(env, " ") or "defaults", hidden, n))
  print(string.format("%5s %9s | %12s %12s | %12s %12s %12s | %9s", "M", "bytes", "b2b dev", "b2b wall",
                      "rel dev med", "rel dev p90", "rel wall med", "check"))
  local csv = {"label,m,bytes,b2b_dev_us,b2b_wall_us,released_dev_median_us,released_dev_p90_us,released_wall_median_us,check_us"}
  for _, r in ipairs(rows) do
    print(string.format("%5d %9d | %12.1f %12.1f | %12.1f %12.1f %12.1f | %9.1f", r.m, r.bytes, r.b2b_dev,
                        r.b2b_wall, r.dev_med, r.dev_p90, r.wall_med, r.check_us))
    csv[#csv + 1] = string.format("%s,%d,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f", label, r.m, r.bytes, r.b2b_dev,
                                  r.b2b_wall, r.dev_med, r.dev_p90, r.wall_med, r.check_us)
  end
  local out = os.getenv("OUT")
  if out and out ~= "" then
    local f = assert(io.open(out .. "/dist-probe-" .. label .. ".csv", "w"))
    f:write(table.concat(csv, "\n"), "\n")
    f:close()
  end
end
d.destroy()
