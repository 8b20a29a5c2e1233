-- k3.bench.env — where scripts/bench runs: the device, the timer, random fills and the copy
-- bandwidth every floor is divided by.
--
-- On a GPU (the real run) tensors live on cuda:0 and every figure is k3.cuda_time: CUDA
-- events around each call (eager) or around one replay of a CUDA graph of `calls` captured
-- calls (graph), after a warm-up, median of `iters` samples.
--
-- With --dry-run (any machine, no GPU needed) the same code runs on the CPU: tensors are
-- allocated at the real shapes divided by `shrink` (the printed shapes, bytes and floors stay
-- the real ones), CUDA kernel names map to their CPU counterparts, every timed function is
-- really called (first and last rotated copy) so argument errors surface, and the time
-- returned is a model (bytes over a nominal bandwidth plus a fixed latency), never a
-- measurement. Dry-run output says so on its first line.
local k3 = require "k3"
local U = require "k3.bench.util"

local Env = {}
Env.__index = Env

Env.ROTATE_BYTES = 200e6   -- rotated inputs exceed this (over 3x the H200's 60 MB L2)
Env.NOMINAL_BW = 4170      -- GB/s: an H200's copy bandwidth measured 2026-11-29; --dry-run only

local CPU_KERNEL = {
  ["cuda.linear.cublas"] = "cpu.linear.blas",
  ["cuda.linear.skinny"] = "cpu.linear.blas",
  ["cuda.attn_res.decode"] = "cpu.attn_res.reference",
  ["cuda.attn_res.generic"] = "cpu.attn_res.reference",
  ["cuda.attn_res.stream"] = "cpu.attn_res.reference",
  ["cuda.attn_res.ring"] = "cpu.attn_res.reference",
}

-- Env.new{dry = bool, quick = bool, shrink = 16, bw = GB/s override}
function Env.new(o)
  local self = setmetatable({}, Env)
  self.dry = o.dry and true or false
  self.quick = o.quick and true or false
  self.shrink = self.dry and (o.shrink or 16) or 1
  self.device = self.dry and "cpu" or "cuda:0"
  self.iters = self.quick and 15 or 50
  self.warmup = self.quick and 3 or 5
  self.bw_override = o.bw
  if not self.dry then
    local b = k3.backends()
    if not (b.cuda and b.cuda.available) then
      error("bench: CUDA is not available (" .. tostring(b.cuda and b.cuda.reason) ..
            "); use --dry-run to check the script on this machine", 0)
    end
  end
  return self
end

-- The kernel to ask for: the CUDA name on a GPU, its CPU stand-in in a dry run.
function Env:kernel(name)
  if self.dry then return CPU_KERNEL[name] or name end
  return name
end

-- The allocated size of a real dimension: itself, or divided by shrink (at least `min`,
-- rounded up to a multiple of `mult`) in a dry run.
function Env:dim(n, min, mult)
  if not self.dry then return n end
  local d = math.max(min or 1, n // self.shrink)
  mult = mult or 1
  return U.ceil_div(d, mult) * mult
end

-- How many rotated copies are allocated for `copies` wanted (a dry run keeps at most 3).
function Env:alloc_copies(copies)
  if self.dry then return math.min(copies, 3) end
  return copies
end

-- Copies needed so that `bytes_per_call` rotated over them exceeds ROTATE_BYTES.
function Env.copies_for(bytes_per_call, min, max)
  local c = math.max(min or 1, math.ceil(Env.ROTATE_BYTES / bytes_per_call))
  if max then c = math.min(c, max) end
  return c
end

-- ---- random data -------------------------------------------------------------------------------

local POOL_ELEMS = 8 * 1024 * 1024 -- 16 MB of bf16 normal values, generated once on the host

-- The random pool (k3.randn, seeded) on the device, as a 1-D bf16 tensor.
function Env:pool()
  if not self._pool then
    local n = self.dry and 65536 or POOL_ELEMS
    self._pool = k3.randn({n}, {dtype = "bf16", device = self.device, seed = 20261129})
  end
  return self._pool
end

-- Fills a contiguous tensor t with random values: device-to-device copies of pool windows,
-- each window starting at a different offset so neighbouring chunks differ. Never zeros.
function Env:fill(t, salt)
  local n = t:numel()
  if n == 0 then return t end
  local flat = t:view({n})
  local pool = self:pool()
  local P = pool:numel()
  local chunk = P // 2
  local pos, k = 0, salt or 0
  while pos < n do
    local len = math.min(chunk, n - pos)
    local off = (k * 7919) % (P - len + 1)
    flat:narrow(1, pos + 1, len):copy(pool:narrow(1, off + 1, len))
    pos, k = pos + len, k + 1
  end
  return t
end

-- A new bf16 tensor of `shape` on the bench device, filled with random values.
function Env:random(shape, salt)
  local t = k3.empty(shape, {dtype = "bf16", device = self.device})
  return self:fill(t, salt)
end

function Env:empty(shape)
  return k3.empty(shape, {dtype = "bf16", device = self.device})
end

-- ---- timing ----------------------------------------------------------------------------------

-- Env:time(fn, opts, model_us) -> median µs per call, stats.
-- opts: {graph = bool, calls = n (graph: calls captured per replay), iters =, warmup =}.
-- model_us: the dry run's stand-in figure (a number or fn() -> number).
function Env:time(fn, opts, model_us)
  opts = opts or {}
  local iters = opts.iters or self.iters
  local warmup = opts.warmup or self.warmup
  if self.dry then
    fn(1)
    if opts.graph and (opts.calls or 1) > 1 then fn(opts.calls) end
    local v = type(model_us) == "function" and model_us() or model_us or 1.0
    return v, {median = v, min = v * 0.97, p90 = v * 1.04, samples = iters, model = true}
  end
  return k3.cuda_time(fn, {iters = iters, warmup = warmup, graph = opts.graph or false,
                           calls = opts.calls or 1, device = 0})
end

-- Env:try_time(label, fn, opts, model_us) -> µs, stats; or nil when timing raised an error
-- (a kernel missing from this build, a failed capture): the error is kept in self.errors
-- under `label` and printed after the table, and the run goes on.
function Env:try_time(label, fn, opts, model_us)
  local ok, us, st = pcall(self.time, self, fn, opts, model_us)
  if ok then return us, st end
  self.errors = self.errors or {}
  local msg = tostring(us):gsub("\n.*", "")
  self.errors[#self.errors + 1] = {label = label, error = msg}
  return nil, {}
end

-- Lines listing the errors kept since the last call (and forgets them).
function Env:take_errors()
  local lines = {}
  for _, e in ipairs(self.errors or {}) do
    lines[#lines + 1] = string.format("  ERROR %s: %s", e.label, e.error)
  end
  local errs = self.errors or {}
  self.errors = {}
  return lines, errs
end

-- ---- copy bandwidth --------------------------------------------------------------------------

-- Measures the device-to-device copy bandwidth (GB/s, bytes read plus bytes written) with a
-- 2 GiB t:copy(u), eager, events around each copy, median of iters. Stores it as self.bw.
function Env:measure_copy_bandwidth()
  local bytes = 2 * 1024 ^ 3
  local n = (self.dry and 1024 * 1024 or bytes // 2) // 1
  local src = k3.empty({n}, {dtype = "bf16", device = self.device})
  src:fill(1.25)                       -- any non-zero value: a copy does not look at it
  local dst = k3.empty({n}, {dtype = "bf16", device = self.device})
  dst:fill(-0.5)
  local us, st = self:time(function() dst:copy(src) end,
                           {graph = false, iters = self.quick and 10 or 20, warmup = 3},
                           function() return 2 * bytes / (Env.NOMINAL_BW * 1e3) end)
  src:free()
  dst:free()
  self:release()
  self.copy = {bytes_each_way = bytes, us = us, min_us = st.min, p90_us = st.p90,
               measured_GBps = 2 * bytes / (us * 1e3), model = st.model or false}
  self.bw = self.bw_override or self.copy.measured_GBps
  self.copy.used_GBps = self.bw
  self.copy.overridden = self.bw_override ~= nil
  return self.bw
end

-- Returns cached device memory to the driver between benchmarks (the 2 GiB copy buffers,
-- one shape's rotated weights), so the next one starts from a clean pool.
function Env:release()
  collectgarbage()
  if k3.empty_cache then pcall(k3.empty_cache) end
end

-- Floor in µs of moving `bytes` (read + written) at the copy bandwidth.
function Env:floor_us(bytes)
  return bytes / (self.bw * 1e3)
end

-- One line describing the run, printed above every table.
function Env:header()
  local c = self.copy
  local s = string.format("copy bandwidth %.0f GB/s (2 GiB device-to-device t:copy, read + written, median %.1f µs)",
                          c.measured_GBps, c.us)
  if c.overridden then
    s = s .. string.format("; floors use --bw %.0f GB/s", self.bw)
  end
  s = s .. "; an H200 measured 4170 GB/s on 2026-11-29"
  if self.dry then
    s = "DRY RUN: every time below is a model (bytes / nominal 4170 GB/s + latency), not a measurement\n" .. s
  end
  return s
end

-- The GPU's name as nvidia-smi reports it ("NVIDIA H200"), or nil (dry run, no nvidia-smi).
function Env:device_name()
  if self.dry then return nil end
  if self._device_name == nil then self._device_name = U.device_name() or false end
  return self._device_name or nil
end

function Env:meta()
  return {dry_run = self.dry, device_name = self:device_name(), quick = self.quick, device = self.device, shrink = self.shrink,
          iters = self.iters, warmup = self.warmup, copy = self.copy,
          rotate_bytes = Env.ROTATE_BYTES, date = U.date(), k3_version = k3.version}
end

return Env
