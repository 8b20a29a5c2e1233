-- k3.nn.parallel — tensor-parallel linear layers (Megatron style) over k3.dist:
-- ColumnParallelLinear shards the output features N (each rank holds w[N/W rows, K]; its output
-- stays sharded or is all-gathered), RowParallelLinear shards the input features K (each rank
-- holds w[N, K/W columns]; the partial outputs are all-reduced). Each loads only its shard,
-- from a full weight tensor or a {name = tensor} table (k3.load_safetensors), and runs the
-- low-latency method with the plan for its *local* shape when the device has one.
local k3 = require "k3"
local nn = require "k3.nn"
local check_plan_options = require "k3.plan_options"
local A = require "k3.args"

local P = {}

-- [start, start + len) (1-based) of `rank`'s shard of n features split `world` ways.
function P.shard_range(n, rank, world, what)
  if n % world ~= 0 then
    error(string.format("%s: %d features do not split evenly over world size %d", what or "shard",
                        n, world), 3)
  end
  local len = n // world
  return rank * len + 1, len
end

-- The group a layer uses: opts.dist (k3.dist, or a simulated rank from k3.dist.simulate),
-- with opts.rank / opts.world_size overriding it (e.g. to build every shard in one process).
local function group(opts)
  local d = opts.dist or k3.dist
  local rank = opts.rank or d.rank()
  local world = opts.world_size or d.world_size()
  if math.type(rank) ~= "integer" or math.type(world) ~= "integer" or world < 1 or rank < 0 or
     rank >= world then
    error(string.format("parallel: rank %s is not in 0..%s", tostring(rank), tostring(world - 1)), 3)
  end
  return d, rank, world
end

-- The full weight from a table of tensors (opts.name) or a safetensors file path. Errors
-- point at the caller of the layer's constructor (named_weight < source_weight < __call).
local function named_weight(src, opts, what)
  if type(src) == "string" and type(opts.name) == "string" then
    -- only that tensor is read (a missing one gives the table's error below)
    src = k3.load_safetensors(src, {match = "^" .. opts.name:gsub("%p", "%%%0") .. "$"})
  elseif type(src) == "string" then
    src = {}
  end
  if type(src) ~= "table" then
    error(string.format("%s: weight must be a k3 tensor or a {name = tensor} table (got %s)", what,
                        type(src)), 4)
  end
  if type(opts.name) ~= "string" then error(what .. ": a weight table needs opts.name", 4) end
  local w = src[opts.name]
  if not k3.is_tensor(w) then
    error(string.format("%s: the weight table has no tensor '%s'", what, opts.name), 4)
  end
  return w
end

-- The full weight [N, K] from a tensor, a table or a path; anything but 2-D is an error.
local function source_weight(src, opts, what)
  local w = src
  if not k3.is_tensor(src) then w = named_weight(src, opts, what) end
  if w:dim() ~= 2 then error(string.format("%s: weight must be 2-D [N, K] (got %d dims)", what, w:dim()), 3) end
  return w
end

-- Copies `view` (a shard of the full weight) into a new contiguous tensor in the target
-- dtype and device: only the shard is ever moved to the device.
local function materialize(view, opts)
  return view:to{dtype = opts.dtype or view:dtype(), device = opts.device or view:device()}
end

-- The method for a local weight: the low-latency one when this device has a plan for the
-- local shape (it owns a default method for everything it declines; the weights static, as
-- nn.default_method says), else the default. opts = {epilogue = "silu_mul"}: the plan of
-- the fused gate_up call (nn.default_method's option).
--   P.method_for(w[, {epilogue = "silu_mul"}]) -> method
function P.method_for(w, opts)
  return nn.default_method(w, "a tensor-parallel k3.nn layer's weight", opts)
end

-- A boolean setting opts[field] of a constructor or a call: nil or a boolean, else a bad
-- argument error at level (default 3: the caller of the function that checks).
local function check_flag(opts, field, what, level)
  local v = opts[field]
  if v ~= nil and type(v) ~= "boolean" then
    error(string.format("bad argument #2 to '%s' (field '%s' must be a boolean or nil; got %s)", what, field, type(v)),
          level or 3)
  end
end

-- Checks a tensor-parallel layer's call options: opts nil or a table of the linear call's keys
-- and the layer's own key `own` (a boolean or nil), checked as k3.args.linear_options checks
-- nn.Linear's (errors at the layer's caller); tensors' shapes and eps are the linear's own
-- checks. Returns a fresh table of the linear options present (nil when none) and opts[own].
local CALL_KEYS = {gather = {"gather", table.unpack(A.LINEAR_KEYS)},
                   reduce = {"reduce", table.unpack(A.LINEAR_KEYS)}}

local function call_options(opts, what, own)
  if opts == nil then return nil, nil end
  A.linear_options(opts, what, CALL_KEYS[own])
  check_flag(opts, own, what, 4)
  local fwd
  for k, v in pairs(opts) do
    if k ~= own then
      fwd = fwd or {}
      fwd[k] = v
    end
  end
  return fwd, opts[own]
end

-- Whether parts make each rank's rows [its gate rows | its up rows] (two equal parts).
local function is_gate_up(parts)
  return #parts == 2 and parts[1] == parts[2]
end

-- ---- ColumnParallelLinear ---------------------------------------------------------------------

local Column = {}
Column.__index = Column
Column.__name = "k3.nn.ColumnParallelLinear"

--- ColumnParallelLinear(weight, opts): weight [N, K] (tensor, table with opts.name, or a
--- safetensors path). opts: gather (output all-gathered to [M, N]; default false: [M, N/W]),
--- parts ({n1, n2, ...}: N is a fused stack of parts, each sharded on its own, e.g. {I, I} for
--- gate_up, so a rank holds [gate shard; up shard]), epilogue ("silu_mul": the layer serves
--- gate_up calls with that epilogue, so its default method takes the plan measured for them,
--- k3.plan_for(w_local, {epilogue = "silu_mul"}); needs parts = {I, I}; the calls still pass
--- it), bias ([N]), dtype, device, method, dist, rank, world_size, name. gather, when given,
--- is a boolean; it and any other key are bad argument errors.
P.ColumnParallelLinear = setmetatable(Column, {
  __call = function(_, src, opts)
    local what = "ColumnParallelLinear"
    opts = A.options(opts, what, {"gather", "parts", "epilogue", "bias", "dtype", "device", "method",
                                  "dist", "rank", "world_size", "name"}, 2)
    check_flag(opts, "gather", what)
    local epilogue = check_plan_options({epilogue = opts.epilogue}, what, 2)
    local full = source_weight(src, opts, what)
    local d, rank, world = group(opts)
    local N, K = full:size(1), full:size(2)
    local parts = opts.parts or {N}
    local total = 0
    for _, n in ipairs(parts) do total = total + n end
    if total ~= N then
      error(string.format("%s: parts {%s} add up to %d, but the weight has N = %d", what,
                          table.concat(parts, ", "), total, N), 2)
    end
    if epilogue and not is_gate_up(parts) then
      error(string.format("%s: epilogue \"silu_mul\" needs a gate_up weight sharded with parts = {I, I} (got parts {%s})",
                          what, table.concat(parts, ", ")), 2)
    end
    local pieces, bias_pieces, off, local_n = {}, {}, 0, 0
    for _, n in ipairs(parts) do
      local s, len = P.shard_range(n, rank, world, what)
      pieces[#pieces + 1] = {off + s, len}
      off, local_n = off + n, local_n + len
    end
    local w
    if #pieces == 1 then
      w = materialize(full:narrow(1, pieces[1][1], pieces[1][2]), opts)
    else
      w = k3.empty({local_n, K}, {dtype = opts.dtype or full:dtype(), device = opts.device or full:device()})
      local row = 1
      for _, p in ipairs(pieces) do
        w:narrow(1, row, p[2]):copy(full:narrow(1, p[1], p[2]))
        row = row + p[2]
      end
    end
    local b
    if opts.bias then
      b = k3.empty({local_n}, {dtype = w:dtype(), device = w:device()})
      local row = 1
      for _, p in ipairs(pieces) do
        b:narrow(1, row, p[2]):copy(opts.bias:narrow(1, p[1], p[2]))
        row = row + p[2]
      end
    end
    return setmetatable({weight = w, bias = b, dist = d, rank = rank, world_size = world,
                         gather = opts.gather or false, full_shape = {N, K}, parts = parts,
                         method = opts.method or P.method_for(w, epilogue and {epilogue = epilogue})},
                        Column)
  end,
})

--- layer(x[, opts]) -> y: x [M, K] (replicated on every rank) -> [M, N/W], or [M, N] with
--- gather. opts: gather (the layer's setting for this call) and nn.Linear's call options,
--- passed to the method on this rank's shard: prologue = "silu_mul" (x [M, 2K], gate | up) or
--- "rms_norm" (with norm_weight [K], eps), as k3.linear takes them (x is whole on every
--- rank); epilogue = "silu_mul" on a gate_up layer (parts = {I, I}: each rank's rows are its
--- gate rows, then its up rows, so the epilogue pairs matching halves) -> h [M, I/W], or
--- h [M, I] gathered, the bits of the unfused call then k3.silu_mul; residual and out are
--- this rank's output ([M, N/W], or [M, I/W] with the epilogue) and are refused with gather
--- above world size 1 (the gathered result is a new tensor). Errors name the layer: an
--- unknown option, a gather that is not a boolean, a bad epilogue or prologue name, the
--- epilogue on a layer that is no gate_up, residual or out with gather; the rest are
--- k3.linear's.
function Column:__call(x, opts)
  local what = "ColumnParallelLinear"
  local fwd, gather = call_options(opts, what, "gather")
  if gather == nil then gather = self.gather end
  gather = gather and self.world_size > 1
  local epilogue = fwd and fwd.epilogue
  if epilogue and not is_gate_up(self.parts) then
    error(string.format("%s: epilogue \"silu_mul\" needs a gate_up layer built with parts = {I, I} (this layer's parts are {%s})",
                        what, table.concat(self.parts, ", ")), 2)
  end
  if gather and fwd and (fwd.residual ~= nil or fwd.out ~= nil) then
    error(string.format("%s: %s is this rank's [M, n] output and cannot be combined with gather (world size %d); call without gather",
                        what, fwd.residual ~= nil and "residual" or "out", self.world_size), 2)
  end
  local y = self.method:apply(x, self.weight, self.bias, fwd)
  if not gather then return y end
  local g = self.dist.all_gather(y, 2)
  y:free()
  -- with the epilogue every rank's h is its own slice of h in rank order: the gather is whole
  if #self.parts > 1 and not epilogue then
    -- The gather lays out [rank 0: parts..., rank 1: parts...]; put each part back whole.
    local out = k3.empty({g:size(1), self.full_shape[1]}, {dtype = g:dtype(), device = g:device()})
    local W = self.world_size
    local local_n = self.weight:size(1)
    local src_off, dst_off = 0, 0
    for _, n in ipairs(self.parts) do
      local len = n // W
      for r = 0, W - 1 do
        out:narrow(2, dst_off + r * len + 1, len):copy(g:narrow(2, r * local_n + src_off + 1, len))
      end
      src_off, dst_off = src_off + len, dst_off + n
    end
    g:free()
    return out
  end
  return g
end

function Column:out_features() return self.weight:size(1) end
function Column:in_features() return self.weight:size(2) end
function Column:free()
  self.weight:free()
  if self.bias then self.bias:free() end
end
function Column:__tostring()
  return string.format("ColumnParallelLinear(%d -> %d, shard %d/%d: %d rows, %s%s)", self.full_shape[2],
                       self.full_shape[1], self.rank, self.world_size, self.weight:size(1),
                       self.weight:dtype(), self.gather and ", gathered" or "")
end

-- ---- RowParallelLinear ------------------------------------------------------------------------

local Row = {}
Row.__index = Row
Row.__name = "k3.nn.RowParallelLinear"

--- RowParallelLinear(weight, opts): weight [N, K]; this rank keeps columns K/W. opts:
--- input_is_parallel (default true: x is already [M, K/W], e.g. a column-parallel output;
--- false: x is [M, K] and the layer takes its columns), reduce (default true: all-reduce the
--- partial outputs; false: return the partial sum, e.g. for a fused reduce elsewhere),
--- input_is_parallel and reduce, when given, are booleans (else a bad argument error);
--- bias ([N], added once after the reduction; at world size 1 a call with the silu_mul
--- epilogue takes it inside the linear, before the gate, as k3.linear does), dtype, device,
--- method, dist, rank, world_size, name; any other key is a bad argument error.
P.RowParallelLinear = setmetatable(Row, {
  __call = function(_, src, opts)
    local what = "RowParallelLinear"
    opts = A.options(opts, what, {"input_is_parallel", "reduce", "bias", "dtype", "device", "method",
                                  "dist", "rank", "world_size", "name"}, 2)
    check_flag(opts, "input_is_parallel", what)
    check_flag(opts, "reduce", what)
    local full = source_weight(src, opts, what)
    local d, rank, world = group(opts)
    local N, K = full:size(1), full:size(2)
    local s, len = P.shard_range(K, rank, world, what)
    local w = materialize(full:narrow(2, s, len), opts)
    local b
    if opts.bias then b = materialize(opts.bias, opts) end
    local input_parallel = opts.input_is_parallel
    if input_parallel == nil then input_parallel = true end
    local reduce = opts.reduce
    if reduce == nil then reduce = true end
    return setmetatable({weight = w, bias = b, dist = d, rank = rank, world_size = world,
                         k_start = s, input_is_parallel = input_parallel, reduce = reduce,
                         full_shape = {N, K}, method = opts.method or P.method_for(w)}, Row)
  end,
})

--- layer(x[, opts]) -> y [M, N]: the all-reduced sum of every rank's x_local w_local^T
--- (+ bias), or this rank's partial sum with reduce = false; with input_is_parallel = false x
--- must be [M, K] whole (checked on every rank). opts: reduce (the layer's
--- setting for this call) and nn.Linear's call options where a shard of K can serve them:
--- prologue = "silu_mul" (x is gate | up: [M, 2K/W], this rank's gate columns then its up
--- columns as a column-parallel gate_up returns them, or [M, 2K] whole with
--- input_is_parallel = false, of which the layer takes its gate and up columns; the product
--- takes silu_mul's bits of them); residual ([M, N]: rank 0 adds it in its partial sum, so
--- the reduced sum, or the partial sums summed elsewhere, hold it once; the rounding is that
--- of rank 0's partial sum, not of a sum after the reduction; every rank checks it, so one the
--- linear refuses fails every rank); out ([M, N], contiguous, else refused before anything is
--- written: the result is written there). Refused above world size 1, naming the layer:
--- epilogue (the gate of a partial sum is not the gate of the sum) and prologue = "rms_norm"
--- (the norm needs x's whole row: normalize before the layer); a reduce that is not a
--- boolean; the rest are k3.linear's errors.
function Row:__call(x, opts)
  local what = "RowParallelLinear"
  local fwd, reduce = call_options(opts, what, "reduce")
  if reduce == nil then reduce = self.reduce end
  local W = self.world_size
  local prologue = fwd and fwd.prologue
  if fwd and W > 1 then
    if fwd.epilogue then
      error(string.format("%s: epilogue \"silu_mul\" would gate this rank's partial sum (world size %d), and the gate of a partial sum is not the gate of the sum",
                          what, W), 2)
    end
    if prologue == "rms_norm" then
      error(string.format("%s: prologue \"rms_norm\" needs the whole row of x and this rank holds %d of its %d columns; normalize x before the layer",
                          what, self.weight:size(2), self.full_shape[2]), 2)
    end
  end
  -- out receives the product, then the all-reduce sums it in place (packed memory): a strided
  -- out is refused before anything is written, at every world size alike.
  local out = fwd and fwd.out
  if k3.is_tensor(out) and not out:is_contiguous() then
    error(string.format("%s: out must be contiguous (the all-reduce sums it in place); got shape [%s] strides [%s]",
                        what, table.concat(out:size(), ", "), table.concat(out:stride(), ", ")), 2)
  end
  local xl, own = x, false
  if not self.input_is_parallel then
    local len, K = self.weight:size(2), self.full_shape[2]
    -- every rank checks x's whole width before it takes its own columns
    if not k3.is_tensor(x) then
      error(string.format("bad argument #1 to '%s' (k3.Tensor expected, got %s)", what, type(x)), 2)
    end
    if prologue ~= "silu_mul" and (x:dim() ~= 2 or x:size(2) ~= K) then
      error(string.format("%s: x must be [M, K] = [M, %d] with input_is_parallel = false; got [%s]",
                          what, K, table.concat(x:size(), ", ")), 2)
    end
    if prologue == "silu_mul" then
      -- x is [M, 2K] gate | up: this rank's gate columns, then its up columns
      if x:dim() ~= 2 or x:size(2) ~= 2 * K then
        error(string.format("%s: x must be [M, 2K] = [M, %d] (gate | up) for prologue silu_mul with input_is_parallel = false; got [%s]",
                            what, 2 * K, table.concat(x:size(), ", ")), 2)
      end
      xl = k3.empty({x:size(1), 2 * len}, {dtype = x:dtype(), device = x:device()})
      xl:narrow(2, 1, len):copy(x:narrow(2, self.k_start, len))
      xl:narrow(2, len + 1, len):copy(x:narrow(2, K + self.k_start, len))
      own = true
    else
      -- t:free() releases the whole storage: free only a copy contiguous() made, never a view.
      local v = x:narrow(2, self.k_start, len)
      xl = v:contiguous()
      own = xl ~= v
    end
  end
  -- Only rank 0 adds the residual; the others check the call with it (m:explain runs nothing),
  -- so a residual the linear refuses fails every rank alike instead of leaving rank 0 alone.
  if fwd and W > 1 and self.rank ~= 0 and fwd.residual ~= nil then
    local rec = self.method:explain(xl, self.weight, nil, fwd)
    if rec.error then
      if own then xl:free() end
      error(rec.error, 2)
    end
    fwd.residual = nil
  end
  -- The epilogue (world size 1 only, refused above it) gates the biased product: the bias goes
  -- into the linear, as k3.linear takes it, not onto h afterwards.
  local epi_bias = fwd and fwd.epilogue ~= nil and self.bias or nil
  local y = self.method:apply(xl, self.weight, epi_bias, fwd)
  if own then xl:free() end
  if reduce and W > 1 then self.dist.all_reduce(y) end
  if self.bias and reduce and not epi_bias then
    local yb = y + self.bias:view({1, -1}):expand(y:size())
    if fwd and fwd.out ~= nil then
      y:copy(yb) -- y is out
      yb:free()
    else
      y:free()
      y = yb
    end
  end
  return y
end

function Row:out_features() return self.weight:size(1) end
function Row:in_features() return self.weight:size(2) end
function Row:free()
  self.weight:free()
  if self.bias then self.bias:free() end
end
function Row:__tostring()
  return string.format("RowParallelLinear(%d -> %d, shard %d/%d: %d columns, %s)", self.full_shape[2],
                       self.full_shape[1], self.rank, self.world_size, self.weight:size(2),
                       self.weight:dtype())
end

return P
