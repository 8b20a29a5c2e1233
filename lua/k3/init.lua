-- k3: the Lua front end. The C core ("k3.core") owns tensors and all compute; this file adds
-- the thin conveniences: tensor printing, the policy table, linear methods, plan lookup and
-- k3.help(). docs/API.md is the reference of every name here.

local core = require "k3.core"

local k3 = {}
-- The C functions that init.lua wraps or regroups stay out of k3 itself.
local WRAPPED = {policy_table = true, policy_id = true, default_policy = true,
                 method_default = true, method_low_latency = true}
for name, fn in pairs(core) do
  if name:sub(1, 1) ~= "_" and not WRAPPED[name] then k3[name] = fn end
end

-- ---- tensor printing ------------------------------------------------------------------------

-- PyTorch's print options: EDGE items at each end of a summarised dim, summaries above
-- SUMMARY_THRESHOLD elements, rows of values wrapped at LINE_WIDTH columns.
local EDGE, SUMMARY_THRESHOLD, LINE_WIDTH = 3, 1000, 80

local function dims_string(v)
  return "[" .. table.concat(v, ", ") .. "]"
end

-- Indices shown along a dim of size n: all of them, or the first and last EDGE around "...".
local function shown(n, summarize)
  local idx = {}
  if summarize and n > 2 * EDGE then
    for i = 1, EDGE do idx[#idx + 1] = i end
    idx[#idx + 1] = false
    for i = n - EDGE + 1, n do idx[#idx + 1] = i end
  else
    for i = 1, n do idx[i] = i end
  end
  return idx
end

local function number_format(values)
  local all_int, maxabs, minabs = true, 0, math.huge
  for _, v in ipairs(values) do
    if v ~= v or v == math.huge or v == -math.huge then
      -- non-finite values print as nan/inf whatever the format
    else
      if v ~= math.floor(v) then all_int = false end
      local a = math.abs(v)
      if a > maxabs then maxabs = a end
      if a > 0 and a < minabs then minabs = a end
    end
  end
  if all_int and maxabs < 1e9 then return "%.0f" end
  if maxabs >= 1e5 or minabs < 1e-4 then return "%.4e" end
  return "%.4f"
end

local function format_number(fmt, v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  return string.format(fmt, v)
end

-- tostring(t): a header (shape, dtype, device; the strides when t is not contiguous, the
-- storage offset when it is not 0) and a summarised preview of the values (large tensors show
-- EDGE items at each end of every dim).
local function tensor_tostring(t)
  local ok, size = pcall(t.size, t)
  if not ok then return "k3.Tensor (freed)" end
  local head = string.format("k3.Tensor %s %s %s", dims_string(size), t:dtype(), t:device())
  if not t:is_contiguous() then head = head .. " strides " .. dims_string(t:stride()) end
  if t:offset() ~= 0 then head = head .. string.format(" offset %d", t:offset()) end
  local nd, numel = #size, t:numel()
  if numel == 0 then return head .. "\n[]" end
  local summarize = numel > SUMMARY_THRESHOLD
  local values, idx = {}, {}
  local function collect(d)
    if d > nd then
      values[#values + 1] = t:get(table.unpack(idx, 1, nd))
      return
    end
    for _, i in ipairs(shown(size[d], summarize)) do
      if i then idx[d] = i; collect(d + 1) end
    end
  end
  collect(1)
  local fmt = number_format(values)
  if nd == 0 then return head .. "\n" .. format_number(fmt, values[1]) end
  local strs, width = {}, 0
  for i, v in ipairs(values) do
    strs[i] = format_number(fmt, v)
    if #strs[i] > width then width = #strs[i] end
  end
  local pos = 0
  -- The innermost dim, opened at column d - 1, wraps as PyTorch's _vector_str does: as many
  -- values per line as fit in LINE_WIDTH with their ", ", continuation lines under the first.
  local per_line = math.max(1, (LINE_WIDTH - (nd - 1)) // (width + 2))
  local function render(d)
    local parts = {}
    for _, i in ipairs(shown(size[d], summarize)) do
      if not i then
        parts[#parts + 1] = "..."
      elseif d == nd then
        pos = pos + 1
        parts[#parts + 1] = string.rep(" ", width - #strs[pos]) .. strs[pos]
      else
        parts[#parts + 1] = render(d + 1)
      end
    end
    if d == nd then
      local lines = {}
      for first = 1, #parts, per_line do
        lines[#lines + 1] = table.concat(parts, ", ", first, math.min(#parts, first + per_line - 1))
      end
      return "[" .. table.concat(lines, ",\n" .. string.rep(" ", d)) .. "]"
    end
    return "[" .. table.concat(parts, "," .. string.rep("\n", nd - d) .. string.rep(" ", d)) .. "]"
  end
  return head .. "\n" .. render(1)
end

core._tensor_mt.__tostring = tensor_tostring
core._tensor_mt.__name = "k3.Tensor"

--- k3.is_tensor(v) -> boolean: whether v is a k3 tensor userdata.
k3.is_tensor = core.is_tensor

-- ---- policy ---------------------------------------------------------------------------------

local READ_ONLY = "k3.policy is a read-only view of the active policy; change the policy " ..
                  "with k3.set_policy(tbl)"

local function key_path(path, key)
  if type(key) == "string" and key:match("^[%a_][%w_]*$") then return path .. "." .. key end
  return string.format("%s[%s]", path, type(key) == "string" and string.format("%q", key)
                                       or tostring(key))
end

-- A read-only view of the plain table `data`: reads, #, pairs and ipairs see data (nested
-- tables as views of their own); any write, at any depth, raises an error that names what was
-- written and points to k3.set_policy. Writing would otherwise look accepted while dispatch,
-- which runs on the compiled policy, ignored it.
local function read_only_view(data, path)
  local children = {}
  for k, v in pairs(data) do
    if type(v) == "table" then children[k] = read_only_view(v, key_path(path, k)) end
  end
  local function get(k)
    local c = children[k]
    if c ~= nil then return c end
    return data[k]
  end
  return setmetatable({}, {
    __index = function(_, k) return get(k) end,
    __newindex = function(_, k)
      error(string.format("cannot assign %s: %s", key_path(path, k), READ_ONLY), 2)
    end,
    __len = function() return #data end,
    __pairs = function()
      return function(_, k)
        local nk = next(data, k)
        if nk == nil then return nil end
        return nk, get(nk)
      end, nil, nil
    end,
    __metatable = "k3.policy (read-only)",
  })
end

-- The view of the policy this state dispatches with, read back from the compiled policy
-- (k3.core.policy_table) whenever k3.set_policy has replaced it (core.policy_id tells).
local policy_view, policy_view_of
local function current_policy_view()
  local id = core.policy_id()
  if id ~= policy_view_of then
    policy_view, policy_view_of = read_only_view(core.policy_table(), "k3.policy"), id
  end
  return policy_view
end

--- k3.policy: a read-only view of the policy this Lua state dispatches with (per op the
--- ordered candidate kernels, batch_invariant's lists, and on_layout_mismatch). Reads, #, pairs, ipairs and
--- k3.inspect work; assigning to it or to anything in it raises an error pointing to
--- k3.set_policy. A reference kept across k3.set_policy still shows the policy it was read
--- from, so `local saved = k3.policy ... k3.set_policy(saved)` restores it.
setmetatable(k3, {
  __index = function(_, key)
    if key == "policy" then return current_policy_view() end
  end,
  __newindex = function(t, key, value)
    if key == "policy" then error("cannot assign k3.policy: " .. READ_ONLY, 2) end
    rawset(t, key, value)
  end,
})

--- k3.set_policy(tbl): compiles tbl (the form of k3.policy: per op a non-empty ordered list of
--- candidate kernels, batch_invariant = {<op> = list} for batch-invariant mode, and
--- on_layout_mismatch = "error" | "fallback") into this state's dispatch tables; tbl may be a
--- plain table or a k3.policy view. Lists it leaves out keep the default's; the state's
--- batch-invariant mode is kept. k3.policy then shows the policy now in effect. Unknown keys or
--- kernel names, holes in a list and empty lists raise and change nothing.
k3.set_policy = core.set_policy

-- ---- linear methods and plans -----------------------------------------------------------------

--- k3.method.default() -> the default linear method (the policy's linear candidates).
--- k3.method.low_latency(plan[, {static_weights = true}]) -> a low-latency method over plan
--- {[M] = {kernel = "skinny", config = {...}}}; it owns a default method that serves every call
--- it declines. static_weights: no kernel still running when the method's kernel starts writes
--- w, so the skinny kernel may start streaming w before the previous kernel ends.
--- m:apply(x, w, bias, {residual =, out =}) -> y; m:explain(x, w, bias) -> {op =, chosen =,
--- declined =}: where apply would raise (invalid arguments, or no kernel accepts the call),
--- explain returns chosen = nil, the method's declines and error = apply's message.
k3.method = {
  default = core.method_default,
  low_latency = core.method_low_latency,
}

local check_plan_options = require "k3.plan_options"
local plan_step = require "k3.plan_step"

--- k3.plan_for(w[, {epilogue = "silu_mul"}]) -> the measured plan for weight w ([N, K], on a
--- CUDA device) from lua/k3/policy/<arch>.lua (e.g. sm90), or nil when that architecture or
--- shape has none. With epilogue = "silu_mul" the plan for the SwiGLU gate_up call with that
--- epilogue (w = gate rows | up rows), measured against cuBLAS followed by a silu_mul kernel:
--- lua/k3/policy/<arch>_silu_mul.lua's entries where that file measured the shape (nil where
--- cuBLAS won at every M), else the plain plan. Entries of lua/k3/policy/<arch>_step.lua
--- (measured inside the decode step by scripts/tune-step) replace the plain or the epilogue
--- plan's entries at the M they cover, each section only for its own call
--- (k3.plan_step.compose).
function k3.plan_for(w, opts)
  if not k3.is_tensor(w) then
    error(string.format("bad argument #1 to 'plan_for' (k3.Tensor expected, got %s)", type(w)), 2)
  end
  local epilogue = check_plan_options(opts, "plan_for", 2)
  local dev = w:device()
  local index = dev:match("^cuda:(%d+)$")
  if not index or w:dim() ~= 2 then return nil end
  local arch = core.cuda_arch(tonumber(index))
  local key = string.format("%dx%d", w:size(1), w:size(2))
  local function plans(module)
    local ok, tbl = pcall(require, module)
    if not ok or type(tbl) ~= "table" or type(tbl.plans) ~= "table" then return nil end
    return tbl.plans[key]
  end
  local plain = plans("k3.policy." .. arch)
  local fused = epilogue and plans("k3.policy." .. arch .. "_" .. epilogue)
  local step = plan_step.entries("k3.policy." .. arch .. "_step", epilogue or "plans", key)
  return plan_step.compose(plain, fused, step, epilogue)
end

-- ---- tensor parallelism (lua/k3/dist.lua) ------------------------------------------------------

--- k3.dist: init(), rank(), world_size(), device(), all_reduce(t), all_gather(t, dim), barrier(),
--- synchronize(), destroy(), stats(), simulate(W, fn). Its C functions stay out of k3 itself.
for name in pairs(core) do
  if name:match("^dist_") then k3[name] = nil end
end
k3.dist = require "k3.dist"

-- ---- help -----------------------------------------------------------------------------------------

-- One line per name; spec/help_spec.lua checks that every function and value the module
-- exports (k3.*, k3.method.*, k3.dist.*) and every tensor method and operator is listed here.
local HELP = {
  {"k3.empty(shape, opts) k3.zeros(shape, opts) k3.ones(shape, opts)", "new tensor; opts {dtype = 'bf16'|'f16'|'f32'|'f64', device = 'cpu'|'cuda:N'}"},
  {"k3.zeros(2, 3, opts) ...", "the shape as sizes: k3.empty, zeros, ones, randn; t:view, expand, reshape"},
  {"k3.full(shape, value, opts)", "tensor filled with value"},
  {"k3.randn(shape, opts)", "standard normal values; opts.seed (same values on every device)"},
  {"k3.tensor(nested, opts)", "tensor from nested Lua lists"},
  {"t:size([d]) t:stride([d]) t:dim() t:numel() t:offset()", "shape, strides (elements), storage offset"},
  {"t:dtype() t:device() t:is_contiguous()", "metadata"},
  {"t:mark_static([owner]) t:is_static()", "mark the storage static: copy, fill, set and an op's out into it raise (a model's weights)"},
  {"t:narrow(d, start, len) t:select(d, i)", "views (1-based dims and indices)"},
  {"t:transpose(d1, d2) t:t() t:view(shape) t:expand(shape)", "views; view needs a contiguous tensor"},
  {"t:reshape(shape) t:permute(d1, ..., dn) t:squeeze([d]) t:unsqueeze(d)", "reshape: a view when the strides allow, else a copy; the others views"},
  {"t[i]  t[i] = v  #t", "t:select(1, i) (a number for 1 dim); write a number or a tensor into it; t:size(1)"},
  {"t:as_strided(shape, stride, offset)", "any view of the storage (checked against its bounds)"},
  {"t:contiguous() t:clone() t:to(device_or_dtype)", "copies"},
  {"t:copy(src) t:fill(v) t:get(i...) t:set(i..., v) t:totable()", "element access"},
  {"t:free()  local t <close> = ...", "release the storage now / the handle at scope end"},
  {"t:is_freed()", "whether t (or the storage it views) has been freed; never raises"},
  {"tostring(t)", "header (strides when not contiguous, offset when not 0) and values; rows wrap at 80 columns, over 1000 elements 3 at each end and ..."},
  {"t + u, t - u, t * u, -t, t * 2", "elementwise, new tensor"},
  {"k3.max_abs_diff(a, b) k3.allclose(a, b, {atol, rtol}) k3.cosine(a, b)", "comparisons (f64)"},
  -- tensor ops (the elementwise and reduction ops are catalogue lines, under "ops")
  {"t / u, t / s, s / t", "elementwise division (IEEE: x / 0 is inf or NaN)"},
  {"t:float() t:double() t:bf16() t:half()", "dtype conversions (new tensor on t's device, rounded once)"},
  {"k3.cat(list, d) k3.stack(list, d)", "join along dim d / along a new dim d (default 1)"},
  {"k3.arange(a, b [, step], opts) k3.linspace(a, b, n, opts)", "ranges: half-open, ceil((b - a) / step) elements / n points, both ends exact"},
  {"k3.equal(a, b)", "same shape and values (NaN equals nothing)"},
  "ops", -- one line per op of the catalogue (lib/k3_ops.def), then each op's kernels
  {"k3.explain(op, ...)", "which kernel would run and why the others declined (chosen nil + error when none would)"},
  {"k3.trace(fn)", "every dispatch made while fn runs (also those before an error); fn cannot yield"},
  {"k3.kernels() k3.has_kernel(name) k3.backends()", "what is registered and available"},
  {"k3.method.default() k3.method.low_latency(plan)", "linear methods (the low-latency one owns a default)"},
  {"m:apply(x, w, bias, {residual, out}) m:explain(x, w, bias) m:free()", "run, explain (chosen nil + declines + error where apply would raise) or free a method"},
  {"k3.plan_for(w[, {epilogue =}])", "the measured low-latency plan for a weight on this GPU"},
  {"k3.nn.Linear(w, {bias, method}) k3.nn.RMSNorm(w, eps) k3.nn.SwiGLU(gate_up, down)", "layers (callable; print as Linear(16 -> 8, bf16))"},
  {"k3.nn.default_method(w)", "the method a Linear gets: the low-latency plan for w where one exists"},
  {"k3.set_policy(tbl) k3.policy", "dispatch policy (candidates per op, batch_invariant lists, on_layout_mismatch); k3.policy is read-only"},
  {"k3.set_batch_invariant(on) k3.batch_invariant()", "this state's mode: rows independent of M, bit for bit"},
  {"k3.stats() k3.stats_reset()", "this state's calls per kernel and declines per reason"},
  {"k3.synchronize() k3.empty_cache()", "device queue and cached memory"},
  {"k3.load_safetensors(path, {names, match, device, dtype}) k3.save_safetensors(path, tbl, {metadata})",
   "weights as {name = tensor}: a file, a shard folder or its index"},
  {"k3.safetensors_info(path) k3.memory() k3.memory_reset_peak()", "checkpoint headers; k3's live host and device bytes"},
  {"k3.dist.init(opts) k3.dist.initialized() k3.dist.destroy{abort}", "join / leave the process group (scripts/k3 --nproc N)"},
  {"k3.dist.rank() k3.dist.world_size() k3.dist.device()", "this rank, the world size, this rank's device"},
  {"k3.dist.all_reduce(t, op) k3.dist.all_gather(t, dim)", "collectives (NCCL; no-ops at world size 1)"},
  {"k3.dist.explain(collective, t)", "which collective runs for t and why the others decline"},
  {"k3.dist.barrier() k3.dist.synchronize() k3.dist.stats{reset}", "wait for the ranks / the last collective; device time, stream waits"},
  {"k3.dist.simulate(W, fn, opts)", "run W ranks as coroutines in this process (CPU checks)"},
  {"k3.clock()", "monotonic seconds (host)"},
  {"k3.isatty(file)", "whether a file handle (io.stderr, ...) is a terminal"},
  {"k3.inspect(v)", "one-line rendering of tables (the REPL prints results with it)"},
  {"scripts/k3", "the REPL: results print through __tostring or k3.inspect; Tab completes globals, fields and methods"},
  {"k3.is_tensor(v) k3.known_kernel(name) k3.cuda_arch(i)", "type check, kernel catalogue, 'sm90'"},
  {"k3.cuda_time(fn, {iters, warmup, graph, calls})", "median µs per call of fn(i) on the GPU (events or graph replay)"},
  {"k3.cuda_graph(fn, {device, warmup})", "capture what fn dispatches into a CUDA graph (static tensors; refuses syncs, host copies, CPU ops)"},
  {"g:replay([n]) g:free() g:kernels() g:tensors() g:device()", "replay a captured graph / free it (also <close>, gc); its kernels, held tensors, device"},
  {"k3.version k3.help()", "the version string ('" .. tostring(core.version) .. "'); this list"},
}

-- HELP with the "ops" entry expanded from the catalogue k3.core hands out.
local function help_lines()
  local lines = {}
  for _, e in ipairs(HELP) do
    if e == "ops" then
      for _, op in ipairs(core._ops) do lines[#lines + 1] = {op.signature, op.summary} end
      for _, op in ipairs(core._ops) do
        lines[#lines + 1] = {"  " .. op.name .. " kernels", table.concat(op.kernels, ", ")}
      end
    else
      lines[#lines + 1] = e
    end
  end
  return lines
end

--- k3.help() prints the API with one line each.
function k3.help()
  local lines, w = help_lines(), 0
  for _, e in ipairs(lines) do if #e[1] > w then w = #e[1] end end
  for _, e in ipairs(lines) do
    io.write(e[1], string.rep(" ", w - #e[1] + 2), e[2], "\n")
  end
end

-- k3.inspect's bounds: what a table claims (its __len, its __pairs) is not trusted to be
-- small, so a rendering stops at INSPECT_ITEMS entries per table and INSPECT_TOTAL in all,
-- walks at most INSPECT_SCAN keys of a table, and shows at most INSPECT_TEXT bytes of a string
-- or of a value's text; each cut is marked where it happened.
local INSPECT_ITEMS, INSPECT_TOTAL, INSPECT_SCAN, INSPECT_TEXT = 100, 1000, 10000, 200

local function inspect_text(text, quote)
  local cut = #text > INSPECT_TEXT
  local shown = cut and text:sub(1, INSPECT_TEXT) or text
  shown = quote and string.format("%q", shown) or shown
  return cut and string.format("%s… (cut at %d of %d bytes)", shown, INSPECT_TEXT, #text) or shown
end

-- Whether v's metatable has a __tostring (read raw, as tostring does).
local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

-- k3.inspect's walk; depth counts the table levels above v; left.n is what the whole
-- rendering may still show.
local function inspect(v, depth, left)
  if k3.is_tensor(v) or (type(v) == "table" and has_tostring(v)) then
    return inspect_text((tostring(v):match("^[^\n]*")), false)
  elseif type(v) == "string" then
    return inspect_text(v, true)
  elseif type(v) ~= "table" then
    return inspect_text(tostring(v), false)
  elseif depth >= 3 then
    return "{…}"
  end
  local parts, n = {}, #v
  n = math.max(0, math.type(n) == "integer" and n or math.tointeger(n) or 0)
  local function room() return #parts < INSPECT_ITEMS and left.n > 0 end
  local shown_seq = 0
  for i = 1, n do
    if not room() then break end
    left.n = left.n - 1
    parts[#parts + 1] = inspect(v[i], depth + 1, left)
    shown_seq = i
  end
  local keys, scanned, complete = {}, 0, true
  for key in pairs(v) do
    scanned = scanned + 1
    if scanned > INSPECT_SCAN then complete = false break end
    if not (math.type(key) == "integer" and key >= 1 and key <= n) then keys[#keys + 1] = key end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local shown_keys = 0
  for _, key in ipairs(keys) do
    if not room() then break end
    left.n = left.n - 1
    local name = (type(key) == "string" and key:match("^[%a_][%w_]*$")) and key
      or "[" .. inspect(key, depth + 1, left) .. "]"
    parts[#parts + 1] = name .. " = " .. inspect(v[key], depth + 1, left)
    shown_keys = shown_keys + 1
  end
  local more = (n - shown_seq) + (#keys - shown_keys)
  if more > 0 or not complete then
    parts[#parts + 1] = complete and string.format("… (%d more)", more)
      or string.format("… (%d more, and keys past the first %d not read)", more, INSPECT_SCAN)
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

--- k3.inspect(v) -> string: a readable one-line rendering of v; tables show their contents
--- (keys sorted, nested up to 3 levels), tensors and objects with a __tostring (k3.nn layers,
--- models) the first line of it. Arguments after the first are ignored, so k3.inspect(f())
--- renders f's first result. The rendering is bounded
--- whatever v claims (its __len or __pairs): at most 100 entries per table and 1000 in all,
--- 10000 keys read per table, 200 bytes of any string; each cut says how much it left out.
function k3.inspect(v) return inspect(v, 0, {n = INSPECT_TOTAL}) end

-- k3.nn (lua/k3/nn/init.lua) as a field, so the REPL reaches k3.nn.Linear; it requires
-- "k3", which is this table from here on.
package.loaded.k3 = k3
k3.nn = require "k3.nn"

return k3
