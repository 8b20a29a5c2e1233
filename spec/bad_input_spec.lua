-- A catalogue of misuse across the Lua API: wrong types, nil tensors, bad sizes and indices
-- (negative, huge, NaN, infinite, non-integer), mismatched dtypes and devices, freed tensors
-- and views of freed storage, aliasing outs, num_blocks/write_block off by one, bad policies
-- and low-latency plans. Each case asserts the exact error text, then that every tensor it
-- involved is unchanged and still usable, and that a following valid call succeeds: the case's
-- own (the same op with valid arguments, through the case's tensors where it has them), else a
-- small linear.
local k3 = require "k3"
local H = require "spec.helpers"

local cases = {}
-- case(name, build, text): build() -> fn (must raise text), {tensors that must survive}, and
-- optionally valid, a function making the following valid call and asserting its result
-- (default: a small linear). A case may also carry it as a field: cases[i].valid.
local function case(name, build, text)
  cases[#cases + 1] = {name = name, build = build, text = text}
end
-- exact(name, build, text): a case whose message must be exactly `text` (H.raises_exact: after the
-- "file.lua:line: " position Lua puts in front), not merely contain it.
local function exact(name, build, text)
  case(name, build, text)
  cases[#cases].exact = true
end

-- The message for a tensor placed on cuda:1023, which exists nowhere: where the CUDA backend
-- cannot run (a CPU machine, a build without nvcc) the backend's reason, else the device count.
local function no_cuda_1023(fname)
  local c = k3.backends().cuda
  if not c.available then
    return ("%s: device cuda:1023 is not available: %s"):format(fname, c.reason)
  end
  return ("%s: device cuda:1023 does not exist (%d CUDA device%s)"):format(fname, c.devices,
    c.devices == 1 and "" or "s")
end

local function mat(r, c, opts) return k3.randn({r, c}, opts) end

-- ---- follow-up calls: the op again with valid arguments, checked against plain-Lua fp64 ------------
local function near(got, want, tol)
  local g = got:to("f64"):totable()
  assert.equal(#want, #g)
  for i, row in ipairs(want) do
    assert.equal(#row, #g[i])
    for j, v in ipairs(row) do
      assert(math.abs(g[i][j] - v) <= tol * (1 + math.abs(v)),
        string.format("follow-up [%d][%d] = %.17g; want %.17g", i, j, g[i][j], v))
    end
  end
end
local function valid_linear(x, w)
  local xs, ws = x:to("f64"):totable(), w:to("f64"):totable()
  local want = {}
  for i, xr in ipairs(xs) do
    want[i] = {}
    for j, wr in ipairs(ws) do
      local acc = 0
      for k, v in ipairs(xr) do acc = acc + v * wr[k] end
      want[i][j] = acc
    end
  end
  near(k3.linear(x, w), want, 1e-5)
end
local function valid_rms_norm(x, w)
  local xs, ws = x:to("f64"):totable(), w:to("f64"):totable()
  local want = {}
  for i, row in ipairs(xs) do
    local ss = 0
    for _, v in ipairs(row) do ss = ss + v * v end
    local r = 1 / math.sqrt(ss / #row + 1e-5)
    want[i] = {}
    for d, v in ipairs(row) do want[i][d] = v * r * ws[d] end
  end
  near(k3.rms_norm(x, w, 1e-5), want, 1e-5)
end
local function valid_silu_mul()
  local x = mat(2, 4, {seed = 7})
  local xs, want = x:to("f64"):totable(), {}
  for i, row in ipairs(xs) do
    want[i] = {}
    for j = 1, 2 do want[i][j] = row[j] / (1 + math.exp(-row[j])) * row[2 + j] end
  end
  near(k3.silu_mul(x), want, 1e-5)
end
-- attn_res with args a (no out, no delta, no write_block): the result has prefix's shape, no NaN,
-- and agrees with the reference kernel run on the same arguments.
local function valid_attn_res(a)
  local y = k3.attn_res(a)
  assert.same(a.prefix:size(), y:size())
  assert.is_false(H.has_nan(y))
  local r = {}
  for key, v in pairs(a) do r[key] = v end
  r.kernel = "cpu.attn_res.reference"
  near(y, k3.attn_res(r):to("f64"):totable(), 1e-5)
end
local function valid_safetensors(t)
  local path = os.tmpname()
  k3.save_safetensors(path, {w = t})
  local back = k3.load_safetensors(path)
  os.remove(path)
  assert.equal(0, k3.max_abs_diff(back.w, t))
end
-- a low-latency method built from a valid plan, applied: the same result as k3.linear (on a
-- CPU tensor the plan's CUDA kernel declines and the owned default method runs).
local function valid_method(x, w)
  x = x or mat(1, 3, {seed = 21})
  w = w or mat(4, x:size(2), {seed = 22})
  local m = k3.method.low_latency({[1] = {kernel = "skinny"}})
  assert.equal(0, k3.max_abs_diff(m:apply(x, w), k3.linear(x, w)))
  valid_linear(x, w)
end

-- ---- creation ------------------------------------------------------------------------------
case("empty(nil)", function() return function() k3.empty(nil) end end,
  "bad argument #1 to 'empty' (shape table or sizes expected, got nil)")
case("zeros(string)", function() return function() k3.zeros("3") end end,
  "bad argument #1 to 'zeros' (shape table or sizes expected, got string)")
case("ones with no dims", function() return function() k3.ones({}) end end,
  "bad argument #1 to 'ones' (shape must have 1 to 8 dims; got 0)")
case("empty with 9 dims", function() return function() k3.empty({1, 1, 1, 1, 1, 1, 1, 1, 1}) end end,
  "bad argument #1 to 'empty' (shape must have 1 to 8 dims; got 9)")
case("zeros negative size", function() return function() k3.zeros({2, -1}) end end,
  "bad argument #1 to 'zeros' (size of dim 2 must be >= 0; got -1)")
case("empty mininteger size", function() return function() k3.empty({math.mininteger}) end end,
  "bad argument #1 to 'empty' (size of dim 1 must be >= 0; got -9223372036854775808)")
case("empty overflowing element count", function() return function() k3.empty({2 ^ 62, 2 ^ 62}) end end,
  "empty: element count overflows at dim 2")
-- A zero size makes numel 0, but the strides of the other dims must still fit in an int64.
exact("empty whose strides overflow past a zero size", function() return function() k3.empty({0, 2 ^ 62, 4}) end end,
  "empty: stride computation overflows at dim 3 (size 4)")
exact("zeros whose strides overflow past a zero size", function() return function() k3.zeros({0, 2 ^ 62, 2}) end end,
  "zeros: stride computation overflows at dim 3 (size 2)")
case("empty overflowing byte size", function() return function() k3.empty({2 ^ 31, 2 ^ 31}, {dtype = "f64"}) end end,
  "empty: byte size of 4611686018427387904 f64 elements overflows")
case("empty absurd allocation", function() return function() k3.empty({2 ^ 30, 2 ^ 30}) end end,
  "empty: out of host memory")
case("empty non-integer size", function() return function() k3.empty({1.5}) end end,
  "bad argument #1 to 'empty' (shape[1] must be an integer; got 1.5)")
case("empty NaN size", function() return function() k3.empty({0 / 0}) end end,
  "bad argument #1 to 'empty' (shape[1] must be an integer; got nan)")
case("empty infinite size", function() return function() k3.empty({math.huge}) end end,
  "bad argument #1 to 'empty' (shape[1] must be an integer; got inf)")
case("empty -infinite size", function() return function() k3.empty({2, -math.huge}) end end,
  "bad argument #1 to 'empty' (shape[2] must be an integer; got -inf)")
case("empty string size", function() return function() k3.empty({"a"}) end end,
  "bad argument #1 to 'empty' (shape[1] must be an integer; got string)")
case("full with a string value", function() return function() k3.full({2}, "x") end end,
  "bad argument #2 to 'full' (number expected, got string)")
case("full with nil value", function() return function() k3.full({2}) end end,
  "bad argument #2 to 'full' (number expected, got no value)")
case("unknown dtype", function() return function() k3.empty({2}, {dtype = "int8"}) end end,
  "bad argument #2 to 'empty' (unknown dtype 'int8'; expected bf16, f16, f32 or f64)")
case("dtype not a string", function() return function() k3.zeros({2}, {dtype = 32}) end end,
  "bad argument #2 to 'zeros' (dtype must be a string; got number)")
case("unknown device", function() return function() k3.empty({2}, {device = "tpu"}) end end,
  "bad argument #2 to 'empty' (unknown device 'tpu'; expected cpu, cuda or cuda:N)")
case("malformed cuda ordinal", function() return function() k3.empty({2}, {device = "cuda:x"}) end end,
  "bad argument #2 to 'empty' (unknown device 'cuda:x'; expected cpu, cuda or cuda:N)")
case("cuda ordinal out of range", function() return function() k3.empty({2}, {device = "cuda:1024"}) end end,
  "bad argument #2 to 'empty' (unknown device 'cuda:1024'; expected cpu, cuda or cuda:N)")
exact("device that does not exist", function() return function() k3.empty({2}, {device = "cuda:1023"}) end end,
  no_cuda_1023("empty"))
exact("device a number", function() return function() k3.empty({1}, {device = 1}) end end,
  "bad argument #2 to 'empty' (device must be a string; got number)")
case("opts not a table", function() return function() k3.empty({2}, "f32") end end,
  "bad argument #2 to 'empty' (table expected, got string)")
case("non-integer seed", function() return function() k3.randn({2}, {seed = 1.5}) end end,
  "bad argument #2 to 'randn' (seed must be an integer; got 1.5)")
case("a numeric string as seed", function() return function() k3.randn({2}, {seed = "1"}) end end,
  "bad argument #2 to 'randn' (seed must be an integer; got string)")
case("a numeric string in a shape", function() return function() k3.zeros({"2"}) end end,
  "bad argument #1 to 'zeros' (shape[1] must be an integer; got string)")
case("tensor from a string", function() return function() k3.tensor("x") end end,
  "bad argument #1 to 'tensor' (table expected, got string)")
exact("tensor ragged", function() return function() k3.tensor({{1, 2}, {3}}) end end,
  "bad argument #1 to 'tensor' (ragged nesting: a list at depth 2 has 1 items, expected 2)")
case("tensor non-numeric", function() return function() k3.tensor({{1, "a"}}) end end,
  "bad argument #1 to 'tensor' (expected a number at depth 2; got string)")
case("tensor nested 9 deep", function()
  return function() k3.tensor({{{{{{{{{1}}}}}}}}}) end
end, "bad argument #1 to 'tensor' (more than 8 levels of nesting)")

-- ---- errors name the function the user called, not the core entry point behind it -----------------
-- (k3.zeros and k3.ones run the core's full, t:clone and t:contiguous its to, -t its mul, ...)
local ABSURD = {2 ^ 30, 2 ^ 30} -- 2^60 f32 elements: 4611686018427387904 bytes, never allocatable
case("zeros absurd allocation names zeros", function() return function() k3.zeros(ABSURD) end end,
  "zeros: out of host memory allocating 4611686018427387904 bytes")
case("ones absurd allocation names ones", function() return function() k3.ones(ABSURD) end end,
  "ones: out of host memory allocating 4611686018427387904 bytes")
case("ones overflowing element count names ones", function()
  return function() k3.ones({2 ^ 62, 2 ^ 62}) end
end, "ones: element count overflows at dim 2")
exact("zeros on a device that does not exist", function()
  return function() k3.zeros({2}, {device = "cuda:1023"}) end
end, no_cuda_1023("zeros"))
exact("randn on a device that does not exist", function()
  return function() k3.randn({2}, {device = "cuda:1023"}) end
end, no_cuda_1023("randn"))
exact("tensor on a device that does not exist", function()
  return function() k3.tensor({1, 2}, {device = "cuda:1023"}) end
end, no_cuda_1023("tensor"))
local function absurd_view_case(name, call, text)
  case(name, function()
    local base = mat(1, 1)
    local big = base:expand(ABSURD)
    return function() call(big) end, {base}
  end, text)
end
absurd_view_case("clone of an absurd broadcast view", function(t) return t:clone() end,
  "clone: out of host memory allocating 4611686018427387904 bytes")
absurd_view_case("contiguous of an absurd broadcast view", function(t) return t:contiguous() end,
  "contiguous: out of host memory allocating 4611686018427387904 bytes")
absurd_view_case("negating an absurd broadcast view", function(t) return -t end,
  "unm: out of host memory allocating 4611686018427387904 bytes")
case("load_safetensors of a missing file", function()
  return function() k3.load_safetensors("/nonexistent/k3-spec.safetensors") end, {},
    function() valid_safetensors(mat(2, 3, {seed = 5})) end
end, "load_safetensors: /nonexistent/k3-spec.safetensors: cannot open: No such file or directory")
case("save_safetensors into a missing directory", function()
  local t = mat(2, 3)
  return function() k3.save_safetensors("/nonexistent/k3-spec.safetensors", {w = t}) end, {t},
    function() valid_safetensors(t) end
end, "save_safetensors: /nonexistent/k3-spec.safetensors: cannot open for writing: No such file or directory")

-- ---- views -------------------------------------------------------------------------------------
local function view_case(name, call, text)
  case(name, function()
    local t = mat(2, 3)
    return function() call(t) end, {t}
  end, text)
end
-- (a method's argument numbers count from the first argument after self, as in Lua's own)
local function exact_view_case(name, call, text)
  view_case(name, call, text)
  cases[#cases].exact = true
end
view_case("narrow dim 0", function(t) t:narrow(0, 1, 1) end, "bad argument #1 to 'narrow' (dim must be in 1..2; got 0)")
view_case("narrow dim 3", function(t) t:narrow(3, 1, 1) end, "bad argument #1 to 'narrow' (dim must be in 1..2; got 3)")
view_case("narrow start 0", function(t) t:narrow(2, 0, 1) end, "narrow: start 0 and length 1 out of range for dim 2 of size 3")
view_case("narrow past the end", function(t) t:narrow(2, 2, 5) end, "narrow: start 2 and length 5 out of range for dim 2 of size 3")
view_case("narrow negative length", function(t) t:narrow(2, 1, -1) end, "narrow: start 1 and length -1 out of range for dim 2 of size 3")
view_case("narrow mininteger start", function(t) t:narrow(2, math.mininteger, 1) end,
  "narrow: start -9223372036854775808 and length 1 out of range for dim 2 of size 3")
view_case("narrow maxinteger start", function(t) t:narrow(2, math.maxinteger, 1) end,
  "narrow: start 9223372036854775807 and length 1 out of range for dim 2 of size 3")
view_case("narrow maxinteger length", function(t) t:narrow(2, 2, math.maxinteger) end,
  "narrow: start 2 and length 9223372036854775807 out of range for dim 2 of size 3")
exact_view_case("narrow NaN start", function(t) t:narrow(2, 0 / 0, 1) end,
  "bad argument #2 to 'narrow' (number has no integer representation)")
exact_view_case("narrow infinite length", function(t) t:narrow(2, 1, math.huge) end,
  "bad argument #3 to 'narrow' (number has no integer representation)")
exact_view_case("narrow non-integer dim", function(t) t:narrow(1.5, 1, 1) end,
  "bad argument #1 to 'narrow' (number has no integer representation)")
view_case("narrow string dim", function(t) t:narrow("a", 1, 1) end, "bad argument #1 to 'narrow' (number expected, got string)")
view_case("select index 0", function(t) t:select(1, 0) end, "select: index 0 out of range for dim 1 of size 2")
view_case("select index past the end", function(t) t:select(1, 3) end, "select: index 3 out of range for dim 1 of size 2")
view_case("select mininteger", function(t) t:select(2, math.mininteger) end,
  "select: index -9223372036854775808 out of range for dim 2 of size 3")
exact_view_case("select -infinity", function(t) t:select(1, -math.huge) end,
  "bad argument #2 to 'select' (number has no integer representation)")
view_case("select dim 5", function(t) t:select(5, 1) end, "bad argument #1 to 'select' (dim must be in 1..2; got 5)")
view_case("transpose dim 3", function(t) t:transpose(1, 3) end, "bad argument #2 to 'transpose' (dim must be in 1..2; got 3)")
exact_view_case("transpose NaN dim", function(t) t:transpose(0 / 0, 1) end,
  "bad argument #1 to 'transpose' (number has no integer representation)")
view_case("view with the wrong element count", function(t) t:view({5}) end, "view: shape [5] has 5 elements; tensor has 6")
view_case("view with two -1", function(t) t:view({-1, -1}) end, "view: only one size may be -1 (dims 1 and 2)")
view_case("view with -2", function(t) t:view({-2, 3}) end, "view: size of dim 1 must be >= 0 or -1; got -2")
exact_view_case("view non-integer", function(t) t:view({1.5}) end,
  "bad argument #1 to 'view' (shape[1] must be an integer; got 1.5)")
exact_view_case("view with no dims", function(t) t:view({}) end,
  "bad argument #1 to 'view' (shape must have 1 to 8 dims; got 0)")
exact_view_case("expand with no dims", function(t) t:expand({}) end,
  "bad argument #1 to 'expand' (shape must have 1 to 8 dims; got 0)")
exact("view overflowing element count", function()
  local t = k3.zeros({4})
  return function() t:view({2 ^ 62, 2 ^ 62, 0}) end, {t}
end, "view: element count overflows at dim 2")
exact("view whose strides overflow past a zero size", function()
  local t = k3.zeros({0})
  return function() t:view({0, 2 ^ 62, 4}) end, {t}
end, "view: stride computation overflows at dim 3 (size 4)")
exact("expand overflowing element count", function()
  local t = k3.ones({1, 1})
  return function() t:expand({2 ^ 62, 2 ^ 62}) end, {t}
end, "expand: element count overflows at dim 2")
exact("expand a new dim to a negative size", function()
  local t = k3.ones({1, 1})
  return function() t:expand({-2, 1, 1}) end, {t}
end, "expand: size of new dim 1 must be >= 0; got -2")
view_case("view -1 that cannot divide", function(t) t:view({-1, 4}) end, "view: cannot infer dim 1: 6 elements over 4")
view_case("expand a non-1 dim", function(t) t:expand({3, 3}) end,
  "expand: dim 1 of size 2 cannot expand to 3 (tensor shape [2, 3], target [3, 3])")
view_case("expand to fewer dims", function(t) t:expand({3}) end,
  "expand: shape [3] has fewer dims than the tensor (2) or more than 8")
view_case("as_strided shape/stride dims differ", function(t) t:as_strided({2, 2}, {1}) end,
  "as_strided: shape has 2 dims but stride has 1")
view_case("as_strided beyond the storage", function(t) t:as_strided({100}, {1}) end,
  "as_strided: view reaches element 99 but the storage holds 6")
view_case("as_strided negative stride", function(t) t:as_strided({2}, {-1}) end,
  "as_strided: stride of dim 1 must be >= 0; got -1")
view_case("as_strided negative offset", function(t) t:as_strided({2}, {1}, -1) end,
  "as_strided: offset must be >= 0; got -1")
view_case("as_strided overflowing extent", function(t) t:as_strided({2 ^ 61, 2}, {2 ^ 62, 1}) end,
  "as_strided: extent overflows at dim 1")
case("t() of a 3-D tensor", function()
  local t = k3.zeros({2, 2, 2})
  return function() t:t() end, {t}
end, "t: expected a 2-dim tensor; got 3 dims (use transpose(d1, d2))")
case("view of a padded-row view", function()
  local p = H.padded(2, 3, 2)
  return function() p:view({-1}) end, {p}
end, "view: tensor is not contiguous (shape [2, 3], strides [5, 1]); call contiguous() first")

-- ---- element access, copies, arithmetic ------------------------------------------------------------
view_case("get out of range", function(t) t:get(3, 1) end, "get: index 3 out of range for dim 1 of size 2")
view_case("get too few indices", function(t) t:get(1) end, "get: expected 2 indices for a 2-dim tensor; got 1")
view_case("get too many indices", function(t) t:get(1, 1, 1) end, "get: expected 2 indices for a 2-dim tensor; got 3")
exact_view_case("get NaN index", function(t) t:get(0 / 0, 1) end,
  "bad argument #1 to 'get' (number has no integer representation)")
exact_view_case("get infinite index", function(t) t:get(1, math.huge) end,
  "bad argument #2 to 'get' (number has no integer representation)")
view_case("get mininteger index", function(t) t:get(math.mininteger, 1) end,
  "get: index -9223372036854775808 out of range for dim 1 of size 2")
view_case("get maxinteger index", function(t) t:get(1, math.maxinteger) end,
  "get: index 9223372036854775807 out of range for dim 2 of size 3")
view_case("set a string value", function(t) t:set(1, 1, "x") end, "bad argument #3 to 'set' (number expected, got string)")
view_case("set too few indices", function(t) t:set(1, 0) end, "set: expected 2 indices for a 2-dim tensor; got 1")
exact_view_case("set non-integer index", function(t) t:set(1.5, 1, 0) end,
  "bad argument #1 to 'set' (number has no integer representation)")
view_case("fill a string", function(t) t:fill("x") end, "bad argument #1 to 'fill' (number expected, got string)")
view_case("fill nil", function(t) t:fill(nil) end, "bad argument #1 to 'fill' (number expected, got nil)")
view_case("copy a different shape", function(t) t:copy(k3.zeros({3, 2})) end,
  "copy: source shape [3, 2] must match destination shape [2, 3]")
view_case("copy nil", function(t) t:copy(nil) end, "bad argument #1 to 'copy' (k3.Tensor expected, got nil)")
view_case("copy a table", function(t) t:copy({1, 2, 3}) end, "bad argument #1 to 'copy' (k3.Tensor expected, got table)")
case("copy into a broadcast view", function()
  local base = k3.ones({1, 3})
  local b = base:expand({2, 3})
  return function() b:copy(k3.zeros({2, 3})) end, {base, b}
end, "copy: destination dim 1 has stride 0 (a broadcast view); it cannot be written")
view_case("to an unknown name", function(t) t:to("int") end,
  "bad argument #1 to 'to' ('int' is neither a dtype (bf16, f16, f32, f64) nor a device (cpu, cuda, cuda:N))")
view_case("to a number", function(t) t:to(5) end, "bad argument #1 to 'to' (string or table expected, got number)")
exact_view_case("to {dtype = number}", function(t) t:to({dtype = 3}) end,
  "bad argument #1 to 'to' (dtype must be a string; got number)")
view_case("add different shapes", function(t) return t + k3.zeros({3, 2}) end,
  "add: right operand shape [3, 2] must match left operand shape [2, 3]")
view_case("add different dtypes", function(t) return t + k3.zeros({2, 3}, {dtype = "f64"}) end,
  "add: dtypes differ (f32 and f64); convert with to()")
view_case("add a string", function(t) return t + "x" end, "attempt to add a k3.Tensor and a string value")
view_case("multiply by a table", function(t) return t * {} end, "attempt to multiply a k3.Tensor and a table value")
view_case("subtract nil", function(t) return t - nil end, "attempt to subtract a k3.Tensor and a nil value")
view_case("max_abs_diff with nil", function(t) return k3.max_abs_diff(t, nil) end,
  "bad argument #2 to 'max_abs_diff' (k3.Tensor expected, got nil)")
view_case("allclose with string opts", function(t) return k3.allclose(t, t, "x") end,
  "bad argument #3 to 'allclose' (table expected, got string)")
exact_view_case("allclose negative atol", function(t) return k3.allclose(t, t, {atol = -1e-3}) end,
  "allclose: atol must be a number >= 0; got -0.001")
exact_view_case("allclose NaN rtol", function(t) return k3.allclose(t, t, {rtol = 0 / 0}) end,
  "allclose: rtol must be a number >= 0; got nan")
exact_view_case("allclose -inf atol", function(t) return k3.allclose(t, t, {atol = -math.huge, rtol = 0}) end,
  "allclose: atol must be a number >= 0; got -inf")
view_case("cosine of different shapes", function(t) return k3.cosine(t, k3.zeros({3})) end,
  "cosine: b shape [3] must match a shape [2, 3]")
view_case("size of dim 3", function(t) return t:size(3) end, "bad argument #1 to 'size' (dim must be in 1..2; got 3)")
exact_view_case("stride of NaN dim", function(t) return t:stride(0 / 0) end,
  "bad argument #1 to 'stride' (number has no integer representation)")
exact_view_case("stride of dim 3", function(t) return t:stride(3) end,
  "bad argument #1 to 'stride' (dim must be in 1..2; got 3)")
exact_view_case("stride of dim 0", function(t) return t:stride(0) end,
  "bad argument #1 to 'stride' (dim must be in 1..2; got 0)")

-- ---- freed tensors and views of freed storage -------------------------------------------------------
local function freed_case(name, call)
  case(name, function()
    local keep = mat(2, 3)
    local t = mat(2, 3)
    local v = t:narrow(2, 1, 2)
    t:free()
    return function() call(t, v, keep) end, {keep}
  end, "tensor has been freed")
end
freed_case("size of a freed tensor", function(t) return t:size() end)
freed_case("get on a view of freed storage", function(_, v) return v:get(1, 1) end)
freed_case("narrow a view of freed storage", function(_, v) return v:narrow(1, 1, 1) end)
freed_case("clone a view of freed storage", function(_, v) return v:clone() end)
freed_case("copy from freed storage", function(_, v, keep) return keep:narrow(2, 1, 2):copy(v) end)
freed_case("copy into freed storage", function(_, v, keep) return v:copy(keep:narrow(2, 1, 2)) end)
freed_case("add a freed tensor", function(t, _, keep) return keep + t end)
freed_case("linear with freed x", function(t, _, keep) return k3.linear(t, keep) end)
freed_case("linear with a freed view as w", function(_, v, keep) return k3.linear(keep:narrow(2, 1, 2), v) end)
freed_case("linear into a freed out", function(_, v, keep)
  return k3.linear(keep:narrow(2, 1, 2), k3.ones({2, 2}), {out = v})
end)
freed_case("attn_res with freed prefix", function(t, _, keep)
  return k3.attn_res{prefix = t, blocks = k3.zeros({2, 1, 3}), num_blocks = 0,
                     norm_weight = k3.ones({3}), qk_weight = k3.ones({3})}
end)
freed_case("rms_norm of a freed view", function(_, v) return k3.rms_norm(v, k3.ones({2}), 1e-5) end)
freed_case("explain with a freed tensor", function(t, _, keep) return k3.explain("linear", keep, t) end)
freed_case("method apply with freed x", function(t, _, keep) return k3.method.default():apply(t, keep) end)
freed_case("tostring then use a freed tensor", function(t)
  assert(tostring(t) == "k3.Tensor (freed)")
  return t:totable()
end)

-- ---- linear --------------------------------------------------------------------------------------------
local function linear_case(name, make, text)
  case(name, function()
    local x, w = mat(2, 3, {seed = 1}), mat(4, 3, {seed = 2})
    local extra = {}
    local fn = make(x, w, extra)
    local ts = {x, w}
    for _, e in ipairs(extra) do ts[#ts + 1] = e end
    return fn, ts, function() valid_linear(x, w) end
  end, text)
end
linear_case("linear x nil", function(_, w) return function() k3.linear(nil, w) end end,
  "bad argument #1 to 'linear' (k3.Tensor expected, got nil)")
linear_case("linear w a string", function(x) return function() k3.linear(x, "w") end end,
  "bad argument #2 to 'linear' (k3.Tensor expected, got string)")
linear_case("linear x 3-D", function(_, w) return function() k3.linear(k3.zeros({1, 2, 3}), w) end end,
  "linear: x must be 2-D [M, K]; got 3-D [1, 2, 3]")
linear_case("linear w 1-D", function(x) return function() k3.linear(x, k3.zeros({3})) end end,
  "linear: w must be 2-D [N, K]; got 1-D [3]")
linear_case("linear K mismatch", function(x) return function() k3.linear(x, k3.zeros({4, 5})) end end,
  "linear: x dim 2 (3) must match w dim 2 (5)")
linear_case("linear dtype mismatch", function(x) return function() k3.linear(x, k3.zeros({4, 3}, {dtype = "f64"})) end end,
  "linear: w dtype (f64) must match x dtype (f32)")
linear_case("linear bias wrong shape", function(x, w, e)
  e[1] = k3.zeros({3})
  return function() k3.linear(x, w, {bias = e[1]}) end
end, "linear: bias must be [N] = [4] (w dim 1); got [3]")
linear_case("linear bias a number", function(x, w) return function() k3.linear(x, w, {bias = 1}) end end,
  "bad argument #3 to 'linear' (field 'bias' must be a k3.Tensor; got number)")
linear_case("linear bias dtype", function(x, w, e)
  e[1] = k3.zeros({4}, {dtype = "bf16"})
  return function() k3.linear(x, w, {bias = e[1]}) end
end, "linear: bias dtype (bf16) must match x dtype (f32)")
linear_case("linear residual wrong shape", function(x, w, e)
  e[1] = k3.zeros({4, 2})
  return function() k3.linear(x, w, {residual = e[1]}) end
end, "linear: residual must be [M, N] = [2, 4]; got [4, 2]")
linear_case("linear out wrong shape", function(x, w, e)
  e[1] = k3.zeros({4, 2})
  return function() k3.linear(x, w, {out = e[1]}) end
end, "linear: out must be [2, 4]; got [4, 2]")
linear_case("linear out wrong dtype", function(x, w, e)
  e[1] = k3.zeros({2, 4}, {dtype = "f64"})
  return function() k3.linear(x, w, {out = e[1]}) end
end, "linear: out dtype (f64) must be f32")
linear_case("linear out a table", function(x, w) return function() k3.linear(x, w, {out = {}}) end end,
  "bad argument #3 to 'linear' (field 'out' must be a k3.Tensor; got table)")
linear_case("linear out aliasing x", function(x)
  local sq = mat(3, 3, {seed = 3})
  return function() k3.linear(x, sq, {out = x}) end
end, "linear: out overlaps x")
linear_case("linear out aliasing w", function(x)
  local w2 = mat(3, 3, {seed = 4})
  return function() k3.linear(x:narrow(1, 1, 1):expand({3, 3}):contiguous(), w2, {out = w2}) end
end, "linear: out overlaps w")
linear_case("linear out a view of the residual", function(x, w, e)
  e[1] = mat(2, 4, {seed = 5})
  return function() k3.linear(x, w, {residual = e[1], out = e[1]}) end
end, "linear: out overlaps residual")
linear_case("linear out a broadcast view", function(x, w, e)
  e[1] = k3.zeros({1, 4})
  return function() k3.linear(x, w, {out = e[1]:expand({2, 4})}) end
end, "linear: out is written but its elements overlap (shape [2, 4], strides [0, 1])")
linear_case("linear unknown kernel", function(x, w) return function() k3.linear(x, w, {kernel = "nope"}) end end,
  "linear: unknown kernel 'nope'")
linear_case("linear kernel of another op", function(x, w)
  return function() k3.linear(x, w, {kernel = "cpu.attn_res.reference"}) end
end, "linear: kernel 'cpu.attn_res.reference' is for op attn_res, not linear")
-- The silu_mul prologue: x must be [M, 2K] against w [N, K] with unit last stride, and the
-- option is the string "silu_mul" or nil.
linear_case("linear prologue silu_mul with x dim 2 not 2K", function(x, w)
  return function() k3.linear(x, w, {prologue = "silu_mul"}) end
end, "linear: x dim 2 (3) must be 2 * w dim 2 (3) = 6 for prologue silu_mul")
linear_case("linear prologue silu_mul with x of odd width", function(_, w, e)
  e[1] = mat(2, 7, {seed = 6})
  return function() k3.linear(e[1], w, {prologue = "silu_mul"}) end
end, "linear: x dim 2 (7) must be 2 * w dim 2 (3) = 6 for prologue silu_mul")
linear_case("linear prologue silu_mul with a transposed x", function(_, w, e)
  e[1] = mat(6, 2, {seed = 7})
  return function() k3.linear(e[1]:t(), w, {prologue = "silu_mul"}) end
end, "linear: x must have unit stride in its last dim; got strides [1, 2]")
linear_case("linear prologue unknown name", function(x, w)
  return function() k3.linear(x, w, {prologue = "gelu"}) end
end, "bad argument #3 to 'linear' (field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got \"gelu\")")
linear_case("linear prologue a boolean", function(x, w)
  return function() k3.linear(x, w, {prologue = true}) end
end, "bad argument #3 to 'linear' (field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got boolean)")
linear_case("linear prologue rms_norm without norm_weight", function(x, w)
  return function() k3.linear(x, w, {prologue = "rms_norm"}) end
end, "linear: norm_weight is required")
linear_case("linear prologue rms_norm with norm_weight of the wrong size", function(x, w, e)
  e[1] = k3.ones({4})
  return function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = e[1]}) end
end, "linear: norm_weight must be [K] = [3] (w dim 2); got [4]")
linear_case("linear prologue rms_norm with a negative eps", function(x, w, e)
  e[1] = k3.ones({3})
  return function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = e[1], eps = -1}) end
end, "linear: eps must be a finite number >= 0; got -1")
linear_case("linear prologue rms_norm with a NaN eps", function(x, w, e)
  e[1] = k3.ones({3})
  return function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = e[1], eps = 0 / 0}) end
end, "linear: eps must be a finite number >= 0; got nan")
linear_case("linear norm_weight without the rms_norm prologue", function(x, w, e)
  e[1] = k3.ones({3})
  return function() k3.linear(x, w, {norm_weight = e[1]}) end
end, "linear: norm_weight is given but the prologue is not rms_norm")
linear_case("linear eps without the rms_norm prologue", function(x, w)
  return function() k3.linear(x, w, {eps = 1e-5}) end
end, "bad argument #3 to 'linear' (field 'eps' is for prologue \"rms_norm\" only)")
linear_case("linear prologue rms_norm with norm_weight a string", function(x, w)
  return function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = "w"}) end
end, "bad argument #3 to 'linear' (field 'norm_weight' must be a k3.Tensor; got string)")
case("method apply prologue silu_mul with x dim 2 not 2K", function()
  local x, w = mat(1, 3, {seed = 25}), mat(4, 3, {seed = 26})
  return function() k3.method.low_latency({[1] = {kernel = "skinny"}}):apply(x, w, nil, {prologue = "silu_mul"}) end,
    {x, w}, function() valid_method(x, w) end
end, "linear: x dim 2 (3) must be 2 * w dim 2 (3) = 6 for prologue silu_mul")
case("method apply prologue unknown name", function()
  local x, w = mat(1, 3, {seed = 27}), mat(4, 3, {seed = 28})
  return function() k3.method.default():apply(x, w, nil, {prologue = "swiglu"}) end,
    {x, w}, function() valid_method(x, w) end
end, "bad argument #4 to 'apply' (field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got \"swiglu\")")
-- Where CUDA runs, the kernel refuses the CPU tensors; elsewhere it is not registered.
linear_case("linear CUDA kernel on CPU tensors", function(x, w)
  return function() k3.linear(x, w, {kernel = "cuda.linear.cublas"}) end
end, H.cuda() and "linear: kernel cuda.linear.cublas runs on cuda tensors; got tensors on cpu"
  or "linear: kernel 'cuda.linear.cublas' is " .. H.cuda_absent_reason())
cases[#cases].exact = true
linear_case("linear kernel a number", function(x, w) return function() k3.linear(x, w, {kernel = 5}) end end,
  "bad argument #3 to 'linear' (field 'kernel' must be a string; got number)")
linear_case("linear opts a number", function(x, w) return function() k3.linear(x, w, 5) end end,
  "bad argument #3 to 'linear' (table expected, got number)")
linear_case("linear empty K mismatch", function(_, w) return function() k3.linear(k3.zeros({2, 0}), w) end end,
  "linear: x dim 2 (0) must match w dim 2 (3)")
linear_case("explain of an unknown op", function(x, w) return function() k3.explain("matmul", x, w) end end,
  "bad argument #1 to 'explain' (unknown op 'matmul'; expected linear, attn_res, rms_norm, silu_mul, abs, exp, sqrt, sum, mean, max or min)")

-- ---- attn_res (T = 2, H = 4, S = 3) ---------------------------------------------------------------------
local function ar_args()
  return {prefix = mat(2, 4, {seed = 11}), blocks = k3.randn({2, 3, 4}, {seed = 12}), num_blocks = 2,
          norm_weight = k3.randn({4}, {seed = 13}), qk_weight = k3.randn({4}, {seed = 14})}
end
local function ar_case(name, edit, text)
  case(name, function()
    local a = ar_args()
    local orig = {}
    for key, v in pairs(a) do orig[key] = v end
    local edited = edit(a) or a
    local ts = {}
    for _, key in ipairs({"prefix", "delta", "blocks", "norm_weight", "qk_weight", "output_norm_weight", "out"}) do
      if k3.is_tensor(a[key]) then ts[#ts + 1] = a[key] end
    end
    -- the follow-up: the case's own tensors before the edit (valid arguments)
    return function() k3.attn_res(edited) end, ts, function() valid_attn_res(orig) end
  end, text)
end
case("attn_res(nil)", function() return function() k3.attn_res(nil) end, {}, function() valid_attn_res(ar_args()) end end,
  "bad argument #1 to 'attn_res' (table expected, got nil)")
ar_case("attn_res missing prefix", function(a) a.prefix = nil end,
  "bad argument #1 to 'attn_res' (field 'prefix' must be a k3.Tensor; got nil)")
ar_case("attn_res prefix a table", function(a) a.prefix = {} end,
  "bad argument #1 to 'attn_res' (field 'prefix' must be a k3.Tensor; got table)")
ar_case("attn_res missing blocks", function(a) a.blocks = nil end,
  "bad argument #1 to 'attn_res' (field 'blocks' must be a k3.Tensor; got nil)")
ar_case("attn_res delta a number", function(a) a.delta = 1 end,
  "bad argument #1 to 'attn_res' (field 'delta' must be a k3.Tensor; got number)")
ar_case("attn_res num_blocks missing", function(a) a.num_blocks = nil end,
  "bad argument #1 to 'attn_res' (field 'num_blocks' must be an integer; got nil)")
ar_case("attn_res num_blocks 1.5", function(a) a.num_blocks = 1.5 end,
  "bad argument #1 to 'attn_res' (field 'num_blocks' must be an integer; got 1.5)")
ar_case("attn_res num_blocks NaN", function(a) a.num_blocks = 0 / 0 end,
  "bad argument #1 to 'attn_res' (field 'num_blocks' must be an integer; got nan)")
ar_case("attn_res num_blocks infinite", function(a) a.num_blocks = math.huge end,
  "bad argument #1 to 'attn_res' (field 'num_blocks' must be an integer; got inf)")
ar_case("attn_res num_blocks -1 (one below)", function(a) a.num_blocks = -1 end,
  "attn_res: num_blocks must be in 0..3 (blocks dim 2); got -1")
ar_case("attn_res num_blocks S+1 (one above)", function(a) a.num_blocks = 4 end,
  "attn_res: num_blocks must be in 0..3 (blocks dim 2); got 4")
ar_case("attn_res num_blocks maxinteger", function(a) a.num_blocks = math.maxinteger end,
  "attn_res: num_blocks must be in 0..3 (blocks dim 2); got 9223372036854775807")
ar_case("attn_res write_block 0 (one below)", function(a) a.write_block = 0 end,
  "attn_res: write_block must be in 1..3 (blocks dim 2); got 0")
ar_case("attn_res write_block S+1 (one above)", function(a) a.write_block = 4 end,
  "attn_res: write_block must be in 1..3 (blocks dim 2); got 4")
ar_case("attn_res write_block mininteger", function(a) a.write_block = math.mininteger end,
  "attn_res: write_block must be in 1..3 (blocks dim 2); got -9223372036854775808")
ar_case("attn_res write_block maxinteger", function(a) a.write_block = math.maxinteger end,
  "attn_res: write_block must be in 1..3 (blocks dim 2); got 9223372036854775807")
ar_case("attn_res write_block a boolean", function(a) a.write_block = true end,
  "bad argument #1 to 'attn_res' (field 'write_block' must be an integer; got boolean)")
ar_case("attn_res write_block NaN", function(a) a.write_block = 0 / 0 end,
  "bad argument #1 to 'attn_res' (field 'write_block' must be an integer; got nan)")
ar_case("attn_res blocks 2-D", function(a) a.blocks = k3.zeros({2, 4}) end,
  "attn_res: blocks must be 3-D [T, S, H]; got 2-D [2, 4]")
ar_case("attn_res blocks T mismatch", function(a) a.blocks = k3.zeros({3, 3, 4}) end,
  "attn_res: blocks dim 1 (3) must match prefix dim 1 (2)")
ar_case("attn_res blocks H mismatch", function(a) a.blocks = k3.zeros({2, 3, 5}) end,
  "attn_res: blocks dim 3 (5) must match prefix dim 2 (4)")
ar_case("attn_res delta wrong shape", function(a) a.delta = k3.zeros({2, 5}) end,
  "attn_res: delta must be [T, H] = [2, 4] (prefix); got [2, 5]")
ar_case("attn_res norm_weight wrong size", function(a) a.norm_weight = k3.ones({5}) end,
  "attn_res: norm_weight must be [H] = [4] (prefix dim 2); got [5]")
ar_case("attn_res qk_weight 2-D", function(a) a.qk_weight = k3.ones({1, 4}) end,
  "attn_res: qk_weight must be [H] = [4] (prefix dim 2); got [1, 4]")
ar_case("attn_res output_norm_weight wrong size", function(a) a.output_norm_weight = k3.ones({3}) end,
  "attn_res: output_norm_weight must be [H] = [4] (prefix dim 2); got [3]")
ar_case("attn_res blocks dtype", function(a) a.blocks = k3.zeros({2, 3, 4}, {dtype = "f64"}) end,
  "attn_res: blocks dtype (f64) must match prefix dtype (f32)")
ar_case("attn_res delta dtype", function(a) a.delta = k3.zeros({2, 4}, {dtype = "bf16"}) end,
  "attn_res: delta dtype (bf16) must match prefix dtype (f32)")
ar_case("attn_res prefix with a strided last dim", function(a) a.prefix = k3.zeros({4, 2}):t() end,
  "attn_res: prefix must have unit stride in its last dim; got strides [1, 2]")
ar_case("attn_res eps negative", function(a) a.eps = -1 end,
  "attn_res: eps must be a finite number >= 0; got -1")
ar_case("attn_res eps NaN", function(a) a.eps = 0 / 0 end,
  "attn_res: eps must be a finite number >= 0; got ")
ar_case("attn_res output_eps infinite", function(a) a.output_eps = math.huge end,
  "attn_res: output_eps must be a finite number >= 0; got inf")
ar_case("attn_res eps a string", function(a) a.eps = "x" end,
  "bad argument #1 to 'attn_res' (field 'eps' must be a number; got string)")
ar_case("attn_res out aliasing prefix", function(a) a.out = a.prefix end, "attn_res: out overlaps prefix")
ar_case("attn_res out a slot of blocks", function(a) a.out = a.blocks:select(2, 1) end,
  "attn_res: out overlaps blocks")
ar_case("attn_res delta aliasing prefix", function(a) a.delta = a.prefix end,
  "attn_res: prefix (updated by delta) overlaps delta")
-- The overlap tests are exact on the rows each operand covers, and name both layouts. Here
-- blocks is [2, 3, 4] (strides [12, 4, 1]) and num_blocks 2.
ar_case("attn_res prefix is the written slot", function(a)
  a.prefix = a.blocks:select(2, 3)
  a.write_block = 3
end, "attn_res: blocks (write_block) overlaps prefix: blocks[:, 3, :] (blocks shape [2, 3, 4], " ..
  "strides [12, 4, 1]) and prefix (shape [2, 4], strides [12, 1]) share memory")
cases[#cases].exact = true
ar_case("attn_res delta is the written slot", function(a)
  a.delta = a.blocks:select(2, 3)
  a.write_block = 3
end, "attn_res: blocks (write_block) overlaps delta: blocks[:, 3, :] (blocks shape [2, 3, 4], " ..
  "strides [12, 4, 1]) and delta (shape [2, 4], strides [12, 1]) share memory")
cases[#cases].exact = true
ar_case("attn_res out is a slot the call reads", function(a)
  a.out = a.blocks:select(2, 2)
end, "attn_res: out overlaps blocks: out (shape [2, 4], strides [12, 1]) and blocks[:, 2, :] " ..
  "(blocks shape [2, 3, 4], strides [12, 4, 1]) share memory")
cases[#cases].exact = true
ar_case("attn_res out is the written slot", function(a)
  a.out = a.blocks:select(2, 3)
  a.write_block = 3
end, "attn_res: out overlaps blocks: out (shape [2, 4], strides [12, 1]) and blocks[:, 3, :] " ..
  "(blocks shape [2, 3, 4], strides [12, 4, 1]) share memory")
cases[#cases].exact = true
ar_case("attn_res prefix updated by delta is a slot the call reads", function(a)
  a.prefix = a.blocks:select(2, 1)
  a.delta = k3.randn({2, 4}, {seed = 16})
end, "attn_res: prefix (updated by delta) overlaps blocks: prefix (shape [2, 4], " ..
  "strides [12, 1]) and blocks[:, 1, :] (blocks shape [2, 3, 4], strides [12, 4, 1]) share memory")
cases[#cases].exact = true
-- Rows interleaved with another operand's rows in one storage share no byte: only the
-- element that both cover is refused (out's rows 4 elements apart inside prefix's padded rows).
ar_case("attn_res out sharing one element with prefix's padded rows", function(a)
  local buf = k3.randn({20}, {seed = 17})
  a.prefix = buf:as_strided({2, 4}, {8, 1}, 0)
  a.out = buf:as_strided({2, 4}, {8, 1}, 3)
end, "attn_res: out overlaps prefix: out (shape [2, 4], strides [8, 1]) and prefix (shape [2, 4], " ..
  "strides [8, 1]) share memory")
cases[#cases].exact = true
-- T = 2, S = 3, H = 4 over one 12-element storage: slots sharing memory (slot stride 0), and
-- token 1's slot 2 being token 2's slot 1 (token stride = slot stride = H).
ar_case("attn_res write_block into slots that share memory", function(a)
  a.blocks = k3.randn({12}, {seed = 15}):as_strided({2, 3, 4}, {4, 0, 1}, 0)
  a.write_block = 2
end, "attn_res: write_block 2 would overwrite memory the call reads: blocks[1, 2, :] shares " ..
  "elements with blocks[1, 1, :] (blocks strides [4, 0, 1], hidden_size 4)")
cases[#cases].exact = true
ar_case("attn_res write_block into another token's slot", function(a)
  a.blocks = k3.randn({16}, {seed = 15}):as_strided({2, 3, 4}, {4, 4, 1}, 0)
  a.write_block = 2
end, "attn_res: write_block 2 would overwrite memory the call reads: blocks[1, 2, :] shares " ..
  "elements with blocks[2, 1, :] (blocks strides [4, 4, 1], hidden_size 4)")
cases[#cases].exact = true
ar_case("attn_res out wrong shape", function(a) a.out = k3.zeros({4, 2}) end,
  "attn_res: out must be [2, 4]; got [4, 2]")
-- Padded prefix rows forced onto cuda.attn_res.decode. Where CUDA runs, the arguments are ones
-- the decode kernel takes but for the rows' stride (bf16 on the device, H = 8, with delta and
-- output_norm_weight), so its layout refusal shows; elsewhere the kernel is not registered.
exact("attn_res padded rows forced onto the decode kernel", function()
  local on_gpu = H.cuda()
  local o = on_gpu and {dtype = "bf16", device = "cuda"} or {}
  local Hd = on_gpu and 8 or 4
  local function r(shape, seed) o.seed = seed; return k3.randn(shape, o) end
  local a = {prefix = r({2, Hd}, 31), delta = r({2, Hd}, 32), blocks = r({2, 3, Hd}, 33), num_blocks = 2,
             norm_weight = r({Hd}, 34), qk_weight = r({Hd}, 35), output_norm_weight = r({Hd}, 36)}
  o.seed = 37
  local padded = H.padded(2, Hd, 3, o)
  local forced = {}
  for key, v in pairs(a) do forced[key] = v end
  forced.prefix, forced.kernel = padded, "cuda.attn_res.decode"
  local ts = {padded, a.prefix, a.delta, a.blocks, a.norm_weight, a.qk_weight, a.output_norm_weight}
  -- the follow-up: the same call with densely packed rows (dispatch's choice; the decode kernel
  -- where CUDA runs), checked against the reference on f64 copies
  return function() k3.attn_res(forced) end, ts, function()
    local dense = {}
    for key, v in pairs(forced) do dense[key] = v end
    dense.prefix, dense.kernel = padded:contiguous(), nil
    local ref = {}
    for key, v in pairs(dense) do ref[key] = k3.is_tensor(v) and v:to("cpu"):to("f64") or v end
    ref.kernel = "cpu.attn_res.reference"
    local y = k3.attn_res(dense)
    assert.same({2, Hd}, y:size())
    assert(k3.max_abs_diff(y:to("cpu"):to("f64"), k3.attn_res(ref)) < (on_gpu and 0.1 or 1e-5))
    -- delta was added into the dense prefix, as the reference did into its copy
    assert(k3.max_abs_diff(dense.prefix:to("cpu"):to("f64"), ref.prefix) < (on_gpu and 0.05 or 1e-6))
  end
end, H.cuda()
  and "attn_res: cuda.attn_res.decode requires densely packed rows; got strides 11, 8, 8 for hidden_size 8"
  or "attn_res: kernel 'cuda.attn_res.decode' is " .. H.cuda_absent_reason())
ar_case("attn_res kernel of another op", function(a) a.kernel = "cpu.linear.blas" end,
  "attn_res: kernel 'cpu.linear.blas' is for op linear, not attn_res")
ar_case("attn_res empty prefix with non-empty blocks", function(a) a.prefix = k3.zeros({0, 4}) end,
  "attn_res: blocks dim 1 (2) must match prefix dim 1 (0)")

-- ---- rms_norm and silu_mul -------------------------------------------------------------------------------
local function norm_case(name, make, text)
  case(name, function()
    local x, w = mat(2, 3), k3.ones({3})
    local valid = name:match("^rms_norm") and function() valid_rms_norm(x, w) end or valid_silu_mul
    return make(x, w), {x, w}, valid
  end, text)
end
norm_case("rms_norm w wrong size", function(x) return function() k3.rms_norm(x, k3.ones({2}), 1e-5) end end,
  "rms_norm: w must be [H] = [3] (x dim 2); got [2]")
norm_case("rms_norm negative eps", function(x, w) return function() k3.rms_norm(x, w, -1) end end,
  "rms_norm: eps must be a finite number >= 0; got -1")
norm_case("rms_norm eps a string", function(x, w) return function() k3.rms_norm(x, w, "a") end end,
  "bad argument #3 to 'rms_norm' (eps (a number) or an options table expected; got string)")
norm_case("rms_norm x 1-D", function(_, w) return function() k3.rms_norm(k3.ones({3}), w) end end,
  "rms_norm: x must be 2-D [M, H]; got 1-D [3]")
norm_case("rms_norm out aliasing x", function(x, w) return function() k3.rms_norm(x, w, {out = x}) end end,
  "rms_norm: out overlaps x")
norm_case("silu_mul odd width", function(x) return function() k3.silu_mul(x) end end,
  "silu_mul: x dim 2 (3) must be even ([M, 2I])")
norm_case("silu_mul 1-D", function() return function() k3.silu_mul(k3.ones({6})) end end,
  "silu_mul: x must be 2-D [M, 2I]; got 1-D [6]")
norm_case("silu_mul out aliasing x", function()
  local x2 = mat(2, 4)
  return function() k3.silu_mul(x2, {out = x2:narrow(2, 1, 2)}) end
end, "silu_mul: out overlaps x")

-- ---- policies -------------------------------------------------------------------------------------------
local function policy_case(name, tbl, text)
  case(name, function()
    return function() k3.set_policy(tbl) end, {}
  end, text)
end
policy_case("set_policy a string", "x", "bad argument #1 to 'set_policy' (table expected, got string)")
policy_case("set_policy unknown kernel", {linear = {"nope"}}, "set_policy: unknown linear kernel 'nope' (known: ")
policy_case("set_policy kernel of another op", {linear = {"cpu.attn_res.reference"}},
  "set_policy: kernel 'cpu.attn_res.reference' is for op attn_res, not linear")
policy_case("set_policy candidates a string", {linear = "cpu.linear.blas"},
  "set_policy: linear must be a list of kernel names; got string")
policy_case("set_policy candidate a number", {attn_res = {1}},
  "set_policy: attn_res[1] must be a kernel name string; got number")
policy_case("set_policy on_layout_mismatch unknown", {on_layout_mismatch = "ignore"},
  "set_policy: on_layout_mismatch must be \"error\" or \"fallback\"; got ignore")
policy_case("set_policy on_layout_mismatch a number", {on_layout_mismatch = 1},
  "set_policy: on_layout_mismatch must be \"error\" or \"fallback\"; got number")
do
  local many = {}
  for i = 1, 17 do many[i] = "cpu.linear.blas" end
  policy_case("set_policy 17 candidates", {linear = many}, "set_policy: linear lists 17 kernels; at most 16")
end
policy_case("set_policy good op then a bad one", {linear = {"cpu.linear.reference"}, rms_norm = {"nope"}},
  "set_policy: unknown rms_norm kernel 'nope' (known: ")

-- ---- low-latency plans -----------------------------------------------------------------------------------
local function plan_case(name, plan, text)
  case(name, function() return function() k3.method.low_latency(plan) end, {}, function() valid_method() end end, text)
end
plan_case("plan a string", "x", "bad argument #1 to 'low_latency' (table expected, got string)")
plan_case("plan M = 0", {[0] = {kernel = "skinny"}}, "method.low_latency: plan M must be in 1..16; got 0")
plan_case("plan M = 17", {[17] = {kernel = "skinny"}}, "method.low_latency: plan M must be in 1..16; got 17")
plan_case("plan entry a string", {[1] = "skinny"}, "bad argument #1 to 'low_latency' (plan[1] must be a table; got string)")
plan_case("plan entry without kernel", {[1] = {}}, "bad argument #1 to 'low_latency' (plan[1].kernel must be a string; got nil)")
plan_case("plan unknown kernel", {[2] = {kernel = "nope"}},
  "method.low_latency: plan entry for M = 2 names 'nope', not a known linear kernel")
plan_case("plan kernel of another op", {[2] = {kernel = "cpu.attn_res.reference"}},
  "method.low_latency: plan entry for M = 2 names 'cpu.attn_res.reference', not a known linear kernel")
plan_case("plan config a number", {[1] = {kernel = "skinny", config = 5}},
  "bad argument #1 to 'low_latency' (plan[1].config must be a table; got number)")
plan_case("plan negative config", {[1] = {kernel = "skinny", config = {threads = -1}}},
  "method.low_latency: plan entry for M = 1 has a negative config value")
plan_case("plan rows_per_warp neither 8, 16 nor 32", {[1] = {kernel = "skinny", config = {rows_per_warp = 4}}},
  "method.low_latency: plan entry for M = 1 has rows_per_warp 4; expected 8, 16 or 32")
plan_case("plan balanced a number", {[4] = {kernel = "skinny", config = {rows = 16, balanced = 1}}},
  "bad argument #1 to 'low_latency' (field 'balanced' must be a boolean; got number)")
plan_case("plan balanced a string", {[1] = {kernel = "skinny", config = {balanced = "yes"}}},
  "bad argument #1 to 'low_latency' (field 'balanced' must be a boolean; got string)")
plan_case("plan non-integer config", {[1] = {kernel = "skinny", config = {split_k = 1.5}}},
  "bad argument #1 to 'low_latency' (field 'split_k' must be an integer; got 1.5)")
plan_case("plan string key", {x = {kernel = "skinny"}},
  "bad argument #1 to 'low_latency' (plan keys must be integer token counts M; got string)")
plan_case("plan non-integer key", {[1.5] = {kernel = "skinny"}},
  "bad argument #1 to 'low_latency' (plan keys must be integer token counts M; got number)")
plan_case("plan huge key", {[math.maxinteger] = {kernel = "skinny"}},
  "method.low_latency: plan M must be in 1..16; got 9223372036854775807")
plan_case("plan mininteger key", {[math.mininteger] = {kernel = "skinny"}},
  "method.low_latency: plan M must be in 1..16; got -9223372036854775808")
plan_case("plan key -5", {[-5] = {kernel = "skinny"}}, "method.low_latency: plan M must be in 1..16; got -5")
plan_case("plan huge key with a string entry", {[2 ^ 40] = "skinny"},
  "method.low_latency: plan M must be in 1..16; got 1099511627776")
plan_case("plan key 2^31 + 3 (past int)", {[2 ^ 31 + 3] = {kernel = 1}},
  "method.low_latency: plan M must be in 1..16; got 2147483651")
case("method apply with nil x", function()
  local w = mat(4, 3)
  return function() k3.method.low_latency({[1] = {kernel = "skinny"}}):apply(nil, w) end, {w},
    function() valid_method(mat(1, 3, {seed = 23}), w) end
end, "bad argument #1 to 'apply' (k3.Tensor expected, got nil)")
case("method apply K mismatch falls to the default's error", function()
  local x, w = mat(1, 3), mat(4, 5)
  return function() k3.method.low_latency({[1] = {kernel = "skinny"}}):apply(x, w) end, {x, w},
    function() valid_method(x, mat(4, 3, {seed = 24})) end
end, "linear: x dim 2 (3) must match w dim 2 (5)")

-- ---- long input: an echoed string shows its first 200 bytes (cut back to a UTF-8 boundary,
-- marked with its length); a message longer than k3's 1 KB buffer keeps its start and its end
-- (the reason), with the cut marked between ----------------------------------------------------
local function cut200(s)
  local keep = 200
  while keep > 0 and (s:byte(keep + 1) or 0) & 0xC0 == 0x80 do keep = keep - 1 end
  return s:sub(1, keep) .. ("... (cut at %d of %d bytes)"):format(keep, #s)
end
-- The core's rule for a message longer than 1023 bytes (ASCII text): the first 479 bytes, the
-- number of bytes cut, the last 480.
local function cut_middle(msg)
  if #msg <= 1023 then return msg end
  return msg:sub(1, 479) .. (" [... %d bytes cut ...] "):format(#msg - 959) .. msg:sub(-480)
end
local LONG = ("x"):rep(10 * 1024 * 1024)
local function long_case(name, fn, text)
  exact(name, function() return fn, {} end, text)
end
long_case("zeros with a 10 MB dtype", function() k3.zeros({2}, {dtype = LONG}) end,
  "bad argument #2 to 'zeros' (unknown dtype '" .. cut200(LONG) .. "'; expected bf16, f16, f32 or f64)")
long_case("zeros with a 10 MB device", function() k3.zeros({2}, {device = LONG}) end,
  "bad argument #2 to 'zeros' (unknown device '" .. cut200(LONG) .. "'; expected cpu, cuda or cuda:N)")
long_case("zeros with a 10 MB option name", function() k3.zeros({2}, {[LONG] = 1}) end,
  "bad argument #2 to 'zeros' (unknown option '" .. cut200(LONG) .. "' (expected dtype, device or seed))")
long_case("to a 10 MB string", function() k3.zeros({2}):to(LONG) end,
  "bad argument #1 to 'to' ('" .. cut200(LONG) .. "' is neither a dtype (bf16, f16, f32, f64) nor a device (cpu, cuda, cuda:N))")
long_case("explain a 10 MB op", function() k3.explain(LONG) end,
  "bad argument #1 to 'explain' (unknown op '" .. cut200(LONG) .. "'; expected linear, attn_res, rms_norm, silu_mul, abs, exp, sqrt, sum, mean, max or min)")
long_case("linear with a 10 MB kernel name", function() k3.linear(mat(1, 2), mat(2, 2), {kernel = LONG}) end,
  "linear: unknown kernel '" .. cut200(LONG) .. "' (known for linear: cpu.linear.blas, cpu.linear.reference, " ..
  "cpu.linear.batch_invariant, cuda.linear.cublas, cuda.linear.skinny, cuda.linear.batch_invariant)")
long_case("set_policy with a 10 MB kernel name", function() k3.set_policy({linear = {LONG}}) end,
  "set_policy: unknown linear kernel '" .. cut200(LONG) .. "' (known: cpu.linear.blas, cpu.linear.reference, " ..
  "cpu.linear.batch_invariant, cuda.linear.cublas, cuda.linear.skinny, cuda.linear.batch_invariant)")
long_case("save_safetensors with a 10 MB name for a number", function() k3.save_safetensors("/nonexistent/x", {[LONG] = 1}) end,
  "bad argument #2 to 'save_safetensors' (field '" .. cut200(LONG) .. "' must be a k3.Tensor; got number)")
do
  local euro = ("\u{20AC}"):rep(100) -- 300 bytes of 3-byte characters: cut at 198, a whole character
  long_case("zeros with a long UTF-8 dtype", function() k3.zeros({2}, {dtype = euro}) end,
    "bad argument #2 to 'zeros' (unknown dtype '" .. ("\u{20AC}"):rep(66) ..
    "... (cut at 198 of 300 bytes)'; expected bf16, f16, f32 or f64)")
end
do
  -- A 1,100-byte path: the message is longer than the buffer, and still ends with its reason.
  local path = ("/nonexistent" .. ("/" .. ("d"):rep(99)):rep(11)) .. "/k3.safetensors"
  local core = cut_middle("safetensors: " .. path .. ": cannot open: No such file or directory")
  case("load_safetensors of a 1,100-byte path keeps the reason", function()
    return function() k3.load_safetensors(path) end, {},
      function() valid_safetensors(mat(2, 3, {seed = 5})) end
  end, "load_safetensors" .. core:sub(#"safetensors" + 1))
  cases[#cases].exact = true
  local t = mat(2, 3)
  case("save_safetensors to a 1,100-byte path keeps the reason", function()
    return function() k3.save_safetensors(path, {w = t}) end, {t}, function() valid_safetensors(t) end
  end, "save_safetensors: " .. cut_middle("safetensors_save: " .. path ..
    ": cannot open for writing: No such file or directory"):sub(#"safetensors_save: " + 1))
  cases[#cases].exact = true
end

-- ---- k3.dist: wrong Lua types get `bad argument`, never a raw Lua error ----------------------------------
-- The follow-up: a simulated world of 2 that reduces and gathers.
local function valid_dist()
  local res = k3.dist.simulate(2, function(r, d)
    local t = k3.tensor({{r + 1, 2 * r}})
    d.all_reduce(t)
    return {t:totable(), d.all_gather(k3.tensor({{r}}), 2):totable()}
  end)
  assert.same({{{{3, 2}}, {{0, 1}}}, {{{3, 2}}, {{0, 1}}}}, res)
end
-- Exact texts; a rank's error inside simulate is "rank r: " and the rank's own message (with
-- the position of the rank's call where Lua gives one).
local function dist_case(name, fn, text)
  case(name, function() return fn, {}, valid_dist end, text)
  cases[#cases].exact = true
end
dist_case("dist.all_gather a number", function() k3.dist.all_gather(5) end,
  "bad argument #1 to 'all_gather' (k3.Tensor expected, got number)")
dist_case("dist.all_gather nil", function() k3.dist.all_gather(nil, 2) end,
  "bad argument #1 to 'all_gather' (k3.Tensor expected, got nil)")
dist_case("dist.destroy a string", function() k3.dist.destroy("abort") end,
  "bad argument #1 to 'destroy' (table expected, got string)")
dist_case("dist.destroy abort a string", function() k3.dist.destroy({abort = "yes"}) end,
  "bad argument #1 to 'destroy' (field 'abort' must be a boolean; got string)")
dist_case("dist.stats a number", function() k3.dist.stats(1) end,
  "bad argument #1 to 'stats' (table expected, got number)")
dist_case("dist.stats reset a number", function() k3.dist.stats({reset = 1}) end,
  "bad argument #1 to 'stats' (field 'reset' must be a boolean; got number)")
dist_case("dist.simulate fn a number", function() k3.dist.simulate(2, 5) end,
  "bad argument #2 to 'simulate' (function expected, got number)")
dist_case("dist.simulate opts a string", function() k3.dist.simulate(2, function() end, "return") end,
  "bad argument #3 to 'simulate' (table expected, got string)")
dist_case("dist.simulate errors unknown", function() k3.dist.simulate(2, function() end, {errors = "warn"}) end,
  "bad argument #3 to 'simulate' (field 'errors' must be \"raise\" or \"return\"; got 'warn')")
dist_case("dist.simulate errors a long string", function()
  k3.dist.simulate(2, function() end, {errors = ("w"):rep(10000)})
end, "bad argument #3 to 'simulate' (field 'errors' must be \"raise\" or \"return\"; got '" ..
  ("w"):rep(200) .. "... (cut at 200 of 10000 bytes)')")
dist_case("dist.simulate rank all_reduce a table", function()
  k3.dist.simulate(2, function(_, d) d.all_reduce({1, 2}) end)
end, "rank 0: " .. debug.getinfo(1, "S").short_src .. ":" .. debug.getinfo(1, "l").currentline - 1 ..
  ": bad argument #1 to 'all_reduce' (k3.Tensor expected, got table)")
dist_case("dist.simulate rank all_gather a string", function()
  k3.dist.simulate(2, function(_, d) return d.all_gather("t") end)
end, "rank 0: bad argument #1 to 'all_gather' (k3.Tensor expected, got string)")
dist_case("dist.simulate rank stats reset a string", function()
  k3.dist.simulate(2, function(_, d) return d.stats({reset = "no"}) end)
end, "rank 0: bad argument #1 to 'stats' (field 'reset' must be a boolean; got string)")

-- ---- the runner ------------------------------------------------------------------------------------------
local function snapshot(t)
  return {size = t:size(), stride = t:stride(), offset = t:offset(), dtype = t:dtype(),
          device = t:device(), values = t:totable()}
end

-- ---- tensor ops: elementwise, reductions, division, joins, ranges ------------------------------------
local function ops_case(name, call, text)
  exact(name, function()
    local x, y = mat(2, 3, {seed = 31}), k3.zeros({2, 3})
    return function() call(x, y) end, {x, y}
  end, text)
end
ops_case("sum dim out of range", function(x) x:sum(3) end,
  "bad argument #1 to 'sum' (dim 3 is out of range for a 2-dim tensor (expected 1..2))")
ops_case("max dim 0", function(x) x:max(0) end,
  "bad argument #1 to 'max' (dim 0 is out of range for a 2-dim tensor (expected 1..2))")
ops_case("mean dim not an integer", function(x) x:mean(0.5) end,
  "bad argument #1 to 'mean' (dim must be an integer; got 0.5)")
ops_case("sum out of the wrong shape", function(x, y) x:sum(1, {out = y}) end,
  "sum: out must be [1, 3]; got [2, 3]")
ops_case("abs out aliasing x", function(x) x:abs({out = x}) end, "abs: out overlaps x")
ops_case("exp out of another dtype", function(x) x:exp({out = k3.zeros({2, 3}, {dtype = "f64"})}) end,
  "exp: out dtype (f64) must be f32")
ops_case("sqrt out an expanded view", function(x) x:sqrt({out = k3.zeros({1, 3}):expand({2, 3})}) end,
  "sqrt: out is written but its elements overlap (shape [2, 3], strides [0, 1])")
ops_case("max of an empty dim", function() k3.max(k3.zeros({0, 3}), 1) end,
  "max: cannot reduce an empty dim 1 (size 0)")
ops_case("min of an empty tensor", function() k3.min(k3.zeros({2, 0})) end,
  "min: cannot reduce an empty tensor (shape [2, 0])")
ops_case("division of dtypes that differ", function(x) local _ = x / k3.zeros({2, 3}, {dtype = "bf16"}) end,
  "div: dtypes differ (f32 and bf16); convert with to()")
ops_case("cat of mismatched sizes", function(x) k3.cat({x, mat(3, 3)}, 2) end,
  "cat: tensor 2 dim 1 (3) must match tensor 1 (2)")
ops_case("cat dim out of range", function(x) k3.cat({x}, 0) end,
  "bad argument #2 to 'cat' (dim 0 is out of range (expected 1..2))")
ops_case("stack of a non-tensor", function(x) k3.stack({x, "x"}) end,
  "bad argument #1 to 'stack' (element 2 must be a k3.Tensor; got string)")
ops_case("arange step zero", function() k3.arange(0, 4, 0) end,
  "bad argument #3 to 'arange' (step must not be zero)")
ops_case("arange NaN end", function() k3.arange(0, 0 / 0) end,
  "arange: start, end and step must be finite")
ops_case("linspace negative n", function() k3.linspace(0, 1, -2) end,
  "bad argument #3 to 'linspace' (n must be >= 0; got -2)")

-- ---- values past the last argument, NUL bytes in names, keys that are not names ----------------
ops_case("rms_norm options after an eps table", function(x, y)
  k3.rms_norm(x, k3.ones({3}), {eps = 1e-5}, {out = y})
end, "bad argument #4 to 'rms_norm' (nothing expected here, past the last argument; got table)")
ops_case("linear options one place late", function(x, y)
  k3.linear(x, k3.ones({2, 3}), nil, {out = y})
end, "bad argument #4 to 'linear' (nothing expected here, past the last argument; got table)")
ops_case("silu_mul options after a nil", function(x, y)
  k3.silu_mul(x, nil, {out = y})
end, "bad argument #3 to 'silu_mul' (nothing expected here, past the last argument; got table)")
ops_case("sum options after the options", function(x) x:sum(1, {}, 5) end,
  "bad argument #3 to 'sum' (nothing expected here, past the last argument; got number)")
ops_case("attn_res with a second argument", function(x)
  k3.attn_res({prefix = x}, {})
end, "bad argument #2 to 'attn_res' (nothing expected here, past the last argument; got table)")
ops_case("cat with a third argument", function(x) k3.cat({x}, 1, 2) end,
  "bad argument #3 to 'cat' (nothing expected here, past the last argument; got number)")
ops_case("cat of a list with a named field", function(x) k3.cat({x, dim = 2}) end,
  "bad argument #1 to 'cat' (expected a list of tensors; got key [dim] (a string))")
ops_case("dtype holding a NUL byte", function() k3.zeros({2}, {dtype = "f32\0x"}) end,
  "bad argument #2 to 'zeros' (dtype must not contain a NUL byte (one follows 'f32'))")
ops_case("device holding a NUL byte", function(x) x:to{device = "cpu\0"} end,
  "bad argument #1 to 'to' (device must not contain a NUL byte (one follows 'cpu'))")
ops_case("kernel name holding a NUL byte", function(x)
  k3.linear(x, k3.ones({2, 3}), {kernel = "cpu.linear.blas\0x"})
end, "bad argument #3 to 'linear' (field 'kernel' must not contain a NUL byte (one follows 'cpu.linear.blas'))")
ops_case("a policy list's name holding a NUL byte", function()
  k3.set_policy({linear = {"cpu.linear.blas\0x"}})
end, "bad argument #1 to 'set_policy' (a kernel name must not contain a NUL byte (one follows 'cpu.linear.blas'))")
ops_case("an options key that is a number", function() k3.tensor({1}, {[1] = 2}) end,
  "bad argument #2 to 'tensor' (unknown option [1] (a number key; expected dtype, device or seed))")
ops_case("to with a creation-only option", function(x) x:to{seed = 1} end,
  "bad argument #1 to 'to' (unknown option 'seed' (expected dtype or device))")
ops_case("index a freed tensor", function()
  local t = k3.ones({3})
  t:free()
  return t[1]
end, "tensor has been freed (the operand of t[i])")
ops_case("stack with a freed element", function(x)
  local t = k3.ones({2, 3})
  t:free()
  k3.stack({x, t})
end, "bad argument #1 to 'stack' (element 2: tensor has been freed)")

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local r = {}
  for key, x in pairs(v) do r[key] = deep_copy(x) end
  return r
end

describe("bad input", function()
  it("the catalogue has at least 100 cases", function()
    assert.is_true(#cases >= 100, "only " .. #cases .. " cases")
  end)

  for i, c in ipairs(cases) do
    it(string.format("%03d %s", i, c.name), function()
      local policy_before = deep_copy(k3.policy)
      local fn, ts, valid = c.build()
      ts, valid = ts or {}, valid or c.valid
      local before = {}
      for j, t in ipairs(ts) do before[j] = snapshot(t) end
      if c.exact then H.raises_exact(fn, c.text) else H.raises(fn, c.text) end
      for j, t in ipairs(ts) do
        local now = snapshot(t)
        assert.same(before[j].size, now.size)
        assert.same(before[j].stride, now.stride)
        assert.equal(before[j].offset, now.offset)
        assert.equal(before[j].dtype, now.dtype)
        assert.is_true(H.nested_equal(before[j].values, now.values), "tensor " .. j .. " changed")
        -- still usable: a copy through it and a view of it work
        assert.equal(t:numel(), t:clone():numel())
      end
      -- nothing about the policy changed
      assert.same(policy_before, k3.policy)
      -- a following valid call succeeds: the case's own, else a small linear; and a linear
      -- through each involved 2-D tensor
      if valid then
        valid()
      else
        local x = k3.tensor({{1, 2, 3}})
        local y = k3.linear(x, k3.tensor({{1, 0, 1}, {0, 1, 0}}))
        assert.same({{4, 2}}, y:totable())
      end
      for _, t in ipairs(ts) do
        if t:numel() > 0 and t:dim() == 2 then
          local s = k3.linear(t, k3.ones({1, t:size(2)}, {dtype = t:dtype(), device = t:device()}))
          assert.equal(t:size(1), s:size(1))
        end
      end
    end)
  end
end)

describe("options tables", function()
  it("a misspelt option raises instead of falling back to a default", function()
    H.raises(function() k3.zeros({2}, {dtyp = "f64"}) end,
      "bad argument #2 to 'zeros' (unknown option 'dtyp' (expected dtype, device or seed))")
    H.raises(function() k3.linear(k3.ones({1, 2}), k3.ones({1, 2}), {bais = k3.ones({1})}) end,
      "unknown option 'bais'")
    -- rms_norm(x, w, nil, opts): eps defaults and the options are read, not dropped
    local x, buf = k3.randn({2, 4}, {seed = 3}), k3.zeros({2, 4})
    local y = k3.rms_norm(x, k3.ones({4}), nil, {out = buf, eps = 0.5})
    assert.equal(buf, y)
    assert.is_true(k3.equal(k3.rms_norm(x, k3.ones({4}), 0.5), buf))
    H.raises(function() k3.rms_norm(x, k3.ones({4}), nil, {kernel = "cpu.rms_norm.none"}) end,
      "cpu.rms_norm.none")
    H.raises(function() k3.method.low_latency({[1] = {kernel = "skinny", config = {thread = 128}}}) end,
      "unknown option 'thread' (expected threads, rows, unroll, vec, split_k, rows_per_warp, balanced or l2_prefetch_mb)")
  end)
end)
