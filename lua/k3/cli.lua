-- k3.cli: the command-line tokenizer k3's scripts share (scripts/demo.lua, scripts/bench.lua,
-- the --tp demo): "--key value" and "--key=value", anything else passed through as it is.
local cli = {}

--- cli.options(args, missing) -> iterator of (key, value, arg): key is the option name
--- ("--out") or the argument itself; value() returns the option's value (after "=" or the
--- next argument, which it consumes); when there is none it calls missing(message) if given,
--- else returns nil; arg is the raw argument.
function cli.options(args, missing)
  local i = 0
  return function()
    i = i + 1
    local a = args[i]
    if a == nil then return nil end
    local key, val = a:match("^(%-%-[%w-]+)=(.*)$")
    key = key or a
    local function value()
      if val then return val end
      i = i + 1
      if args[i] == nil and missing then missing(key .. " needs a value") end
      return args[i]
    end
    return key, value, a
  end
end

return cli
