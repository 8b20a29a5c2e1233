-- k3.args: the checks k3's Lua modules make of their callers' arguments (options tables that
-- accept only their listed keys, the options of a layer's linear call) and the placement of
-- their errors at the first caller outside k3's own modules, as the C ops place theirs.
local k3 = require "k3"
local check_plan_options = require "k3.plan_options"

local A = {}

-- The chunk name prefix of k3's own Lua modules ("@.../k3/"), from this file's.
local K3_DIR = debug.getinfo(1, "S").source:match("^(@.*/)args%.lua$")

--- A.raise(msg): raises msg placed at the first caller outside k3's own modules (a model
--- building or calling its layers is skipped, so the message names the user's line); without
--- a position when that caller is C (`pcall(layer, x)`), as luaL_where gives it.
function A.raise(msg)
  local level = 2 -- raise's caller; levels count as error's do
  while true do
    local info = debug.getinfo(level, "S")
    if not info or info.what == "C" or not (K3_DIR and info.source:sub(1, #K3_DIR) == K3_DIR) then
      break
    end
    level = level + 1
  end
  error(msg, level)
end

--- A.list(names) -> "a, b or c", as the C ops list what they expect.
function A.list(names)
  if #names < 2 then return names[1] or "" end
  return table.concat(names, ", ", 1, #names - 1) .. " or " .. names[#names]
end

-- Raises `what` as argument argn of fn (`bad argument #<argn> to '<fn>' (<what>)`), or as
-- `<fn>: <what>` without argn.
local function refuse(fn, argn, what)
  A.raise(argn and string.format("bad argument #%d to '%s' (%s)", argn, fn, what) or fn .. ": " .. what)
end

-- {name = true} of a list of keys, made once per list (the lists are the modules' constants):
-- a layer call checks its options on every call, so a key costs one lookup.
local key_sets = setmetatable({}, {__mode = "k"})
local function key_set(keys)
  local set = key_sets[keys]
  if not set then
    set = {}
    for _, name in ipairs(keys) do set[name] = true end
    key_sets[keys] = set
  end
  return set
end

-- The metatable of k3 tensors: a live tensor is a userdata with it (a cheaper test than a call
-- into C on a layer's every call).
local TENSOR_MT = getmetatable(k3.empty({0}))

--- A.options(opts, fn, keys[, argn[, noun]]) -> opts, or {} for nil: raises unless opts is
--- nil or a table whose keys are all in `keys` (a list), naming fn, the key and the keys
--- allowed. With argn the message is the C ops' `bad argument #<argn> to '<fn>' (unknown
--- option 'k' (expected a, b or c))`; without it the k3.nn constructors' `<fn>: unknown option
--- ...`. noun (default "option") names what a key is ("config field").
function A.options(opts, fn, keys, argn, noun)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    refuse(fn, argn, argn and "table or nil expected, got " .. type(opts)
                     or string.format("options must be a table (got %s)", type(opts)))
  end
  local set = key_set(keys)
  for k in pairs(opts) do
    if not set[k] then
      refuse(fn, argn, string.format("unknown %s '%s' (expected %s)", noun or "option", tostring(k), A.list(keys)))
    end
  end
  return opts
end

-- The options of a linear call (m:apply's), which the k3.nn layers forward to their method.
A.LINEAR_KEYS = {"residual", "prologue", "norm_weight", "eps", "epilogue", "out"}


local function not_tensor(fn, field, v)
  refuse(fn, 2, string.format("field '%s' must be a k3.Tensor; got %s", field, type(v)))
end

--- A.linear_options(opts, fn[, keys]) -> opts: checks the options of a layer call, its
--- argument #2, naming the layer fn: nil or a table of `keys` (default LINEAR_KEYS; a layer
--- with a key of its own lists it first), the epilogue in
--- k3.plan_options' words, the prologue's name as k3.linear checks it, residual, norm_weight
--- and out k3 tensors. Shapes, eps, freed tensors and the rest are the linear's own checks.
function A.linear_options(opts, fn, keys)
  if opts == nil then return nil end
  A.options(opts, fn, keys or A.LINEAR_KEYS, 2)
  local epi, pro = opts.epilogue, opts.prologue
  if epi ~= nil and epi ~= "silu_mul" then
    local _, err = pcall(check_plan_options, {epilogue = epi}, fn, 2, 0)
    A.raise(err)
  end
  if pro ~= nil and pro ~= "silu_mul" and pro ~= "rms_norm" then
    refuse(fn, 2, string.format("field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got %s",
                                type(pro) == "string" and string.format("%q", pro) or type(pro)))
  end
  local out, res, nw = opts.out, opts.residual, opts.norm_weight
  if out ~= nil and getmetatable(out) ~= TENSOR_MT then not_tensor(fn, "out", out) end
  if res ~= nil and getmetatable(res) ~= TENSOR_MT then not_tensor(fn, "residual", res) end
  if nw ~= nil and getmetatable(nw) ~= TENSOR_MT then not_tensor(fn, "norm_weight", nw) end
  return opts
end

--- A.tensor(v, argn, fn) -> v: raises `bad argument #<argn> to '<fn>' (k3.Tensor expected,
--- got <type>)`, or `(tensor has been freed)`, the C binding's words, unless v is a live tensor.
function A.tensor(v, argn, fn)
  if getmetatable(v) ~= TENSOR_MT then
    A.raise(string.format("bad argument #%d to '%s' (k3.Tensor expected, got %s)", argn, fn, type(v)))
  elseif v:is_freed() then
    A.raise(string.format("bad argument #%d to '%s' (tensor has been freed)", argn, fn))
  end
  return v
end

return A
