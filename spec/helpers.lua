-- Shared spec helpers: GPU gating, poisoned outputs, f64 references and error matching.
local k3 = require "k3"

local H = {}

--- H.cuda() -> true when a CUDA device is available, else false and the one-line reason.
--- H.root() -> the checkout's absolute path (this file is <root>/spec/helpers.lua), so specs
--- that build or run programs work from any working directory.
function H.root()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/spec/[^/]*$") or "."
  if dir:sub(1, 1) ~= "/" then
    local p = io.popen("pwd")
    local cwd = p:read("l")
    p:close()
    dir = dir == "." and cwd or cwd .. "/" .. dir
  end
  return dir
end

--- H.sh(cmd) -> output, status: runs cmd with stderr merged into stdout; status is the exit
--- code, or 128 + the signal number when a signal ended it (as a shell reports it).
function H.sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local _, how, code = p:close()
  return out, how == "exit" and code or 128 + code
end

--- H.need_gpu(pending) -> true when a CUDA device is available; otherwise marks the running
--- `it` pending with the backend's one-line reason and returns false. Pass the spec file's own
--- `pending` (busted puts it in the spec file's environment, not in this module's):
---   it("...", function() if not H.need_gpu(pending) then return end ... end)
function H.need_gpu(pending)
  local c = k3.backends().cuda
  if not c.available then
    pending("no CUDA device: " .. tostring(c.reason))
    return false
  end
  return true
end

function H.cuda()
  local c = k3.backends().cuda
  return c.available, c.reason
end

--- H.require_gpu(): at the top of a `#gpu` describe; marks it pending with the reason and
--- returns false where there is no device (busted's `pending` is not a global in modules).
function H.require_gpu()
  local ok, reason = H.cuda()
  if not ok then
    require("busted").pending("no CUDA device: " .. tostring(reason))
    return false
  end
  return true
end

--- H.cuda_absent_reason() -> the decline reason dispatch gives a CUDA kernel where the CUDA
--- backend is not available (nil where it is): "not registered: CUDA backend unavailable
--- (<k3.backends().cuda.reason>)" when the backend was built but cannot run here, "not
--- registered in this build" when there is no libk3_cuda.so (a build without nvcc).
function H.cuda_absent_reason()
  local c = k3.backends().cuda
  if c.available then return nil end
  if c.reason:find("^libk3_cuda%.so not found") and not os.getenv("K3_CUDA_BACKEND") then
    return "not registered in this build"
  end
  return ("not registered: CUDA backend unavailable (" .. c.reason .. ")"):sub(1, 255)
end

--- H.poisoned(shape, opts) -> a tensor filled with NaN, so unwritten outputs show.
function H.poisoned(shape, opts)
  return k3.full(shape, 0 / 0, opts)
end

--- H.has_nan(t) -> true when any element of t is NaN.
function H.has_nan(t)
  local n = k3.max_abs_diff(t, t)
  return n ~= n
end

--- H.raises(fn, text): fn must raise an error whose message contains `text` (plain).
function H.raises(fn, text)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error containing: " .. text)
  err = tostring(err)
  assert(err:find(text, 1, true), string.format("error %q does not contain %q", err, text))
  return err
end

--- H.unplaced(err) -> the error message without the "file.lua:line: " position Lua may put in
--- front of it.
function H.unplaced(err)
  return (tostring(err):gsub("^[^\n]-%.lua:%d+: ", "", 1))
end

--- H.error_of(fn, ...) -> fn(...)'s error message without its position (H.unplaced), or
--- "no error" when it returns.
function H.error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  return ok and "no error" or H.unplaced(err)
end

--- H.caller_error(fn, ...) -> the error of fn(...) called from line 2 of a chunk named
--- caller.lua (a user's script), position included; fails when fn returns. For errors that
--- must be placed at the caller's line ("caller.lua:2: ..."), not inside k3's modules.
function H.caller_error(fn, ...)
  local call = assert(load("local fn = ...\nlocal r = fn(select(2, ...))\nreturn r\n", "@caller.lua"))
  local ok, err = pcall(call, fn, ...)
  assert(not ok, "expected an error")
  return err
end

--- H.raises_exact(fn, text): fn must raise exactly `text`, after the "file.lua:line: " position
--- Lua may put in front of it.
function H.raises_exact(fn, text)
  local err = H.raises(fn, text)
  assert(H.unplaced(err) == text,
    string.format("error %q is not exactly %q", err, text))
  return err
end

--- H.padded(rows, cols, pad, opts) -> a [rows, cols] view with row stride cols + pad, random.
function H.padded(rows, cols, pad, opts)
  local base = k3.randn({rows, cols + pad}, opts)
  return base:narrow(2, 1, cols)
end

--- H.nested_equal(a, b): deep equality of nested lists of numbers.
function H.nested_equal(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b or (a ~= a and b ~= b) end
  if #a ~= #b then return false end
  for i = 1, #a do
    if not H.nested_equal(a[i], b[i]) then return false end
  end
  return true
end

--- H.rms_f64(v, eps) -> s, r: the RMS normalisation of the list v in plain-Lua fp64 that
--- cannot overflow or underflow itself: v[d] / s * r equals v[d] / sqrt(mean(v^2) + eps),
--- taken as z / sqrt(mean(z^2) + eps / m^2) with z = v / m, m = max |v|. When eps / m^2
--- overflows the squares are negligible beside eps: s = 1, r = 1 / sqrt(eps); a zero row has
--- s = 1, r = 1 / sqrt(eps) (NaN times 0 with eps = 0, as the formula says).
function H.rms_f64(v, eps)
  local m = 0
  for _, x in ipairs(v) do m = math.max(m, math.abs(x)) end
  if m == 0 then return 1, 1 / math.sqrt(eps) end
  local ss = 0
  for _, x in ipairs(v) do ss = ss + (x / m) ^ 2 end
  local t = eps / m / m
  if t == math.huge then return 1, 1 / math.sqrt(eps) end
  return m, 1 / math.sqrt(ss / #v + t)
end

--- H.rms_norm_f64(x, w, eps) -> rows: RMSNorm over the last dim in plain-Lua fp64 (nested
--- lists, x [M, H], w [H]): x * 1/sqrt(mean(x^2) + eps) * w, through H.rms_f64 so rows of any
--- magnitude are right. The oracle of the norm specs.
function H.rms_norm_f64(x, w, eps)
  local xs, ws = x:to("cpu"):to("f64"):totable(), w:to("cpu"):to("f64"):totable()
  local out = {}
  for i, row in ipairs(xs) do
    local sc, r = H.rms_f64(row, eps)
    out[i] = {}
    for d, v in ipairs(row) do out[i][d] = v / sc * r * ws[d] end
  end
  return out
end

--- H.EDGE_SCALES[dtype]: powers of two that push a row's fp32 (fp64 for f64) sum of squares
--- past overflow (|x| above ~1e19 in fp32) or underflow, subnormal values included.
H.EDGE_SCALES = {
  f32 = {2 ^ 70, 2 ^ 100, 2 ^ 124, 2 ^ -70, 2 ^ -100, 2 ^ -135},
  bf16 = {2 ^ 70, 2 ^ 124, 2 ^ -70, 2 ^ -120},
  f16 = {2 ^ 12, 2 ^ -20},
  f64 = {2 ^ 520, 2 ^ 1000, 2 ^ -520, 2 ^ -1060},
}

--- H.scales_exactly(t, sc) -> whether t * sc holds exactly t's values times sc (no value
--- rounded to a subnormal or past the dtype's range), so results on it may be compared with
--- results on t.
function H.scales_exactly(t, sc)
  return k3.max_abs_diff((t * sc):to("f64") * (1 / sc), t:to("f64")) == 0
end

--- H.skinny_plan(config) -> a low-latency plan naming the skinny kernel with `config` (nil: its
--- defaults) at every M = 1..16.
function H.skinny_plan(config)
  local plan = {}
  for m = 1, 16 do plan[m] = {kernel = "skinny", config = config} end
  return plan
end

--- H.silu_mul_f64(x, I) -> rows: silu(x[:, :I]) * x[:, I+1:2I] in plain-Lua fp64 (nested lists;
--- I defaults to half of x's row). silu(-inf) is its limit, 0.
function H.silu_mul_f64(x, I)
  local xs = x:to("f64"):totable()
  local out = {}
  for i, row in ipairs(xs) do
    local n = I or #row // 2
    out[i] = {}
    for j = 1, n do
      local g = row[j]
      out[i][j] = (g == -math.huge and 0 or g / (1 + math.exp(-g))) * row[n + j]
    end
  end
  return out
end

return H
