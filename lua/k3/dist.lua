-- k3.dist: tensor parallelism. The process group (one process per GPU, started by
-- `scripts/k3 --nproc N`) and its collectives are C (lib/dist.c, kernels/dist.cu over NCCL);
-- this file adds all_gather along any dim, explain, and `simulate`, which runs the ranks of a
-- world as coroutines in one process with the same collective semantics and the same
-- agreement check, so sharded layers can be checked on the CPU without GPUs.
local core = require "k3.core"

local dist = {}

-- The name Lua's own `bad argument` messages give a value's type (luaL_typeerror's rule: a
-- metatable's __name first, so a tensor is a k3.Tensor).
local function type_name(v)
  local mt = getmetatable(v)
  if type(mt) == "table" and type(mt.__name) == "string" then return mt.__name end
  return type(v)
end

-- A value as a message shows it: a string quoted, only its first 200 bytes when longer (cut
-- back to a UTF-8 character boundary and marked with its length, as the C core echoes user
-- input), anything else by its type name.
local function shown(v)
  if type(v) ~= "string" then return type_name(v) end
  if #v <= 200 then return "'" .. v .. "'" end
  local keep = 200
  while keep > 0 and v:byte(keep + 1) & 0xC0 == 0x80 do keep = keep - 1 end
  return string.format("'%s... (cut at %d of %d bytes)'", v:sub(1, keep), keep, #v)
end

-- Raises Lua's `bad argument #n to 'fname' (why)` at the caller of the k3.dist function
-- whose check called this one.
local function bad_argument(n, fname, why)
  error(string.format("bad argument #%d to '%s' (%s)", n, fname, why), 4)
end

local function check_tensor(v, n, fname)
  if not core.is_tensor(v) then
    bad_argument(n, fname, "k3.Tensor expected, got " .. type_name(v))
  end
end

-- opts: nil or a table whose `field`, when present, is a boolean; returns that field (false
-- when absent).
local function boolean_option(opts, field, n, fname)
  if opts == nil then return false end
  if type(opts) ~= "table" then bad_argument(n, fname, "table expected, got " .. type_name(opts)) end
  local v = opts[field]
  if v == nil then return false end
  if type(v) ~= "boolean" then
    bad_argument(n, fname, string.format("field '%s' must be a boolean; got %s", field, type_name(v)))
  end
  return v
end

--- k3.dist.init(opts) joins the group; opts (all optional, defaults from the launcher's
--- environment): rank, world_size, device (CUDA index), dir, timeout (s), check_shapes,
--- wait = "each" | "next". Without the launcher: world size 1, rank 0 (everything local).
dist.init = core.dist_init

dist.initialized = core.dist_initialized
dist.rank = core.dist_rank
dist.world_size = core.dist_world_size
dist.barrier = core.dist_barrier
dist.synchronize = core.dist_synchronize

--- k3.dist.device() -> this rank's device: "cuda:N" when CUDA is available, else "cpu".
function dist.device()
  if core.backends().cuda.available then return "cuda:" .. core.dist_device() end
  return "cpu"
end

--- k3.dist.all_reduce(t, op = "sum"|"max"|"min") -> t, reduced in place over the ranks.
dist.all_reduce = core.dist_all_reduce

-- g holds the ranks' tensors of shape s stacked along dim 1 ([W * s1, ...]); returns a new
-- tensor with them concatenated along `dim` instead (one strided copy).
local function restack(g, s, dim, W)
  local out_shape, split, src_shape = {}, {}, {W}
  for i, n in ipairs(s) do
    out_shape[i] = i == dim and W * n or n
    if i == dim then split[#split + 1] = W end
    split[#split + 1] = n
    src_shape[#src_shape + 1] = n
  end
  local out = core.empty(out_shape, {dtype = g:dtype(), device = g:device()})
  local src = g:view(src_shape)
  for i = 1, dim - 1 do src = src:transpose(i, i + 1) end -- the rank dim moves next to `dim`
  out:view(split):copy(src)
  return out
end

local function gather_along(gather1, t, dim, W, fname)
  if not core.is_tensor(t) then
    error(string.format("bad argument #1 to '%s' (k3.Tensor expected, got %s)", fname,
                        type_name(t)), 3)
  end
  dim = dim or 1
  if math.type(dim) ~= "integer" or dim < 1 or dim > math.max(t:dim(), 1) then
    error(string.format("bad argument #2 to '%s' (dim must be in 1..%d; got %s)", fname,
                        math.max(t:dim(), 1), tostring(dim)), 3)
  end
  local ok, g = pcall(gather1, t)
  if not ok then error((tostring(g):gsub("^[^:]*:%d+: ", "")), 3) end
  if dim == 1 or W == 1 then return g end
  local out = restack(g, t:size(), dim, W)
  g:free()
  return out
end

--- k3.dist.all_gather(t, dim = 1) -> a new tensor: every rank's t concatenated along dim,
--- in rank order ([M, n] per rank with dim 2 gives [M, W * n]). A t that is not a tensor or a
--- dim out of 1..t:dim() is a `bad argument` error.
function dist.all_gather(t, dim)
  return gather_along(core.dist_all_gather, t, dim, core.dist_world_size(), "all_gather")
end

--- k3.dist.explain(collective, t) -> record: which collective k3.dist.all_reduce
--- ("all_reduce") or k3.dist.all_gather ("all_gather") runs for t now and why the others
--- decline, as k3.explain gives a kernel's: {op =, chosen =, kernel =, declined = {{kernel =,
--- reason =}, ...}}. Nothing runs. k3.trace records each collective the same way.
function dist.explain(collective, t)
  if t ~= nil then check_tensor(t, 2, "explain") end
  return core.dist_explain(collective, t)
end

--- k3.dist.destroy{abort = false} leaves the group (graceful unless abort). opts other than
--- nil or a table, or an abort other than a boolean, is a `bad argument` error.
function dist.destroy(opts)
  core.dist_destroy(boolean_option(opts, "abort", 1, "destroy"))
end

--- k3.dist.stats{reset = false} -> {all_reduce = {calls =, ms =, stream_waits =}, all_gather =
--- ..., check = ...}: ms the device time of the collectives (CUDA events around each NCCL
--- call; includes waiting for the slowest rank), stream_waits the host's waits for one on the
--- compute stream; for check, ms the host time waiting for the other ranks' posts and
--- stream_waits 0 (the check reads host metadata only). Zero at world size 1. opts other
--- than nil or a table, or a reset other than a boolean, is a `bad argument` error.
function dist.stats(opts) return core.dist_stats(boolean_option(opts, "reset", 1, "stats")) end

-- ---- a simulated world ---------------------------------------------------------------------

local function dims(t) return "[" .. table.concat(t:size(), ", ") .. "]" end

-- The board's name of a request's call (lib/dist.h).
local function call_name(req)
  if req.op == "all_reduce" then return "all_reduce(" .. req.reduce .. ")" end
  return req.op
end

-- Runs one collective for every rank's request (each posted to `board`); returns per-rank
-- replies. The agreement check is the process group's own (the C board): every rank's
-- verdict over the same signatures, so a difference fails every rank with one message.
local function run_collective(reqs, W, board)
  local replies, differ = {}, false
  for r = 0, W - 1 do
    local msg = board:verdict(r, reqs[r].op)
    if msg then differ = true end
    replies[r] = {err = msg}
  end
  if differ then return replies end
  local first = reqs[0]
  if first.op == "all_reduce" then
    if first.reduce == "sum" then
      -- Summed in f64 and rounded once: what NCCL's sum gives for two ranks.
      local acc = reqs[0].t:to("f64")
      for r = 1, W - 1 do
        local x = reqs[r].t:to("f64")
        local s = acc + x
        acc:free(); x:free()
        acc = s
      end
      for r = 0, W - 1 do reqs[r].t:copy(acc); replies[r] = {value = reqs[r].t} end
      acc:free()
    else
      local best = reqs[0].t:contiguous():view({-1}):totable()
      for r = 1, W - 1 do
        for i, v in ipairs(reqs[r].t:contiguous():view({-1}):totable()) do
          if (first.reduce == "max" and v > best[i]) or (first.reduce == "min" and v < best[i]) then
            best[i] = v
          end
        end
      end
      local flat = core.tensor(best, {dtype = "f64"})
      for r = 0, W - 1 do
        local t = reqs[r].t
        t:copy(flat:view(t:size()))
        replies[r] = {value = t}
      end
      flat:free()
    end
  elseif first.op == "all_gather" then
    for r = 0, W - 1 do
      local s = reqs[r].t:size()
      local shape = {}
      for i, n in ipairs(s) do shape[i] = n end
      shape[1] = W * s[1]
      local out = core.empty(shape, {dtype = reqs[r].t:dtype(), device = reqs[r].t:device()})
      for q = 0, W - 1 do out:narrow(1, q * s[1] + 1, s[1]):copy(reqs[q].t) end
      replies[r] = {value = out}
    end
  else
    for r = 0, W - 1 do replies[r] = {} end
  end
  return replies
end

-- The rank object handed to each simulated rank: k3.dist's interface.
local function sim_rank(rank, W, board)
  local d = {}
  local calls = {all_reduce = 0, all_gather = 0}
  local dead -- as the process group's: after a wait that failed, every later call fails so
  local function call(req)
    if dead then error(dead, 0) end
    board:post(rank, call_name(req), req.t)
    if calls[req.op] then calls[req.op] = calls[req.op] + 1 end
    local reply = coroutine.yield(req)
    if reply.fatal then dead = reply.err end
    if reply.err then error(reply.err, 0) end
    if req.op ~= "barrier" then core.dist_trace(req.op, req.t, W) end
    return reply.value
  end
  function d.explain(collective, t)
    if t ~= nil then check_tensor(t, 2, "explain") end
    return core.dist_explain(collective, t, W)
  end
  function d.rank() return rank end
  function d.world_size() return W end
  function d.device() return "cpu" end
  function d.initialized() return true end
  function d.all_reduce(t, op)
    check_tensor(t, 1, "all_reduce")
    op = op or "sum"
    if op ~= "sum" and op ~= "max" and op ~= "min" then
      error("bad argument #2 to 'all_reduce' (invalid option '" .. tostring(op) .. "')", 2)
    end
    if not t:is_contiguous() then
      error(string.format("k3.dist.all_reduce: tensor must be contiguous (NCCL reads packed " ..
                          "memory); got shape %s strides [%s]", dims(t),
                          table.concat(t:stride(), ", ")), 2)
    end
    return call{op = "all_reduce", reduce = op, t = t}
  end
  function d.all_gather(t, dim)
    return gather_along(function(x) return call{op = "all_gather", t = x} end, t, dim, W,
                        "all_gather")
  end
  function d.barrier() call{op = "barrier"} end
  function d.synchronize() end
  -- Calls made, and the checks this rank ran on the board; no time and no stream waits (a
  -- simulated world has no streams, and the check never waits for one).
  local checks0 = 0
  function d.stats(opts)
    local reset = boolean_option(opts, "reset", 1, "stats")
    local st = {all_reduce = {calls = calls.all_reduce, ms = 0, stream_waits = 0},
                all_gather = {calls = calls.all_gather, ms = 0, stream_waits = 0},
                check = {calls = board:checks(rank) - checks0, ms = 0, stream_waits = 0}}
    if reset then
      calls.all_reduce, calls.all_gather, checks0 = 0, 0, board:checks(rank)
    end
    return st
  end
  return d
end

--- k3.dist.simulate(world_size, fn, {errors = "raise"|"return"}) runs fn(rank, d) for every
--- rank as a coroutine; d has k3.dist's interface (rank, world_size, all_reduce, all_gather,
--- barrier, explain, stats) and its collectives meet like NCCL's: each waits for every rank's
--- call, and calls that differ in kind, dtype or shape fail on every rank (checked on the
--- process group's own agreement board, lib/dist.h). Returns {[rank + 1] = fn's first
--- result}; with errors = "return" also {[rank + 1] = message} instead of raising. A world
--- size that is not an integer >= 1, an fn that is not a function, opts other than nil or a
--- table and an errors other than "raise" or "return" are `bad argument` errors; inside a
--- rank, d's functions check their arguments as k3.dist's do.
function dist.simulate(W, fn, opts)
  if math.type(W) ~= "integer" or W < 1 then
    error("bad argument #1 to 'simulate' (world size must be an integer >= 1)", 2)
  end
  if type(fn) ~= "function" then
    error("bad argument #2 to 'simulate' (function expected, got " .. type_name(fn) .. ")", 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #3 to 'simulate' (table expected, got " .. type_name(opts) .. ")", 2)
  end
  if opts and opts.errors ~= nil and opts.errors ~= "raise" and opts.errors ~= "return" then
    error("bad argument #3 to 'simulate' (field 'errors' must be \"raise\" or \"return\"; got " ..
          shown(opts.errors) .. ")", 2)
  end
  local cos, results, errors, pending, live = {}, {}, {}, {}, {}
  local board = core.dist_board(W)
  local function step(r, reply)
    local ok, v = coroutine.resume(cos[r], reply)
    if not ok then
      errors[r + 1] = string.format("rank %d: %s", r, tostring(v))
    elseif coroutine.status(cos[r]) == "dead" then
      results[r + 1] = v
    else
      pending[r] = v
      return
    end
    live[r] = nil
  end
  for r = 0, W - 1 do
    cos[r] = coroutine.create(function() return fn(r, sim_rank(r, W, board)) end)
    live[r] = true
  end
  for r = 0, W - 1 do step(r) end
  while next(live) do
    local waiting, gone = {}, {}
    for r = 0, W - 1 do
      if pending[r] then waiting[#waiting + 1] = r else gone[#gone + 1] = r end
    end
    local reqs = pending
    pending = {}
    if #gone == 0 then
      local replies = run_collective(reqs, W, board)
      for r = 0, W - 1 do step(r, replies[r]) end
    else
      -- Ranks that finished or failed never join: in a real world the others would time out.
      local why = {}
      for _, r in ipairs(gone) do
        why[#why + 1] = errors[r + 1] and ("rank " .. r .. " failed") or ("rank " .. r .. " finished")
      end
      for _, r in ipairs(waiting) do
        step(r, {err = string.format("k3.dist.%s: rank %d waits for ranks that will not join (%s)",
                                     reqs[r].op, r, table.concat(why, ", ")), fatal = true})
      end
    end
  end
  if not (opts and opts.errors == "return") then
    for r = 1, W do
      if errors[r] then error(errors[r], 2) end
    end
  end
  return results, errors
end

return dist
