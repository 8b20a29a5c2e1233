-- k3.cli: what k3's scripts share (scripts/demo.lua, scripts/bench.lua, the --tp demo): the
-- option tokenizer ("--key value" and "--key=value", anything else passed through as it is)
-- and the progress reporter (a live line on a terminal, occasional plain lines in a log).
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

-- ---- progress --------------------------------------------------------------------------------

-- k3.core when it is built (isatty, clock); the tokenizer above works without it.
local has_core, core = pcall(require, "k3.core")
if not has_core then core = {} end

local MODES = {["0"] = "off", ["1"] = "tty", plain = "plain"}

--- cli.progress_mode(stream, setting) -> "tty" | "plain" | "off": how progress is shown on
--- stream (a Lua file handle, default io.stderr). setting (default: the K3_PROGRESS
--- environment variable) "0" means off, "1" the live line even when stream is not a terminal,
--- "plain" plain lines even on a terminal; anything else (or unset) picks the live line when
--- stream is a terminal (k3.isatty) and plain lines otherwise (a log file, a pipe).
function cli.progress_mode(stream, setting)
  if setting == nil then setting = os.getenv("K3_PROGRESS") end
  if MODES[setting] then return MODES[setting] end
  local ok, tty = pcall(core.isatty or function() return false end, stream or io.stderr)
  return (ok and tty) and "tty" or "plain"
end

local Progress = {}
Progress.__index = Progress

--- cli.progress(opts) -> a reporter with r:update(fmt, ...), r:done() and r:clear().
--- opts (all optional): stream (default io.stderr), quiet (true: no output at all), mode
--- ("tty" | "plain" | "off"; default cli.progress_mode(stream)), interval (seconds between
--- plain lines, default 5), clock (a function returning seconds; default k3.clock).
---   "tty":   update rewrites one line in place ("\r\27[K" .. text); done and clear erase it.
---   "plain": update prints its text as a line of its own, the first at once and then at most
---            one per `interval` seconds; done prints the last text when it was not printed
---            (so a log ends on the final state) and lets the next update print at once;
---            clear prints nothing. No carriage returns or escape sequences.
---   "off":   nothing.
function cli.progress(opts)
  opts = opts or {}
  local stream = opts.stream or io.stderr
  local mode = opts.quiet and "off" or opts.mode or cli.progress_mode(stream)
  if mode ~= "tty" and mode ~= "plain" and mode ~= "off" then
    error(string.format("bad argument #1 to 'progress' (mode must be \"tty\", \"plain\" or \"off\"; got %s)",
                        tostring(mode)), 2)
  end
  return setmetatable({stream = stream, mode = mode, interval = opts.interval or 5,
                       clock = opts.clock or core.clock or os.time}, Progress)
end

function Progress:update(fmt, ...)
  if self.mode == "off" then return end
  local text = string.format(fmt, ...)
  if self.mode == "tty" then
    self.stream:write("\r\27[K", text)
    self.stream:flush()
    return
  end
  local now = self.clock()
  if self.printed_at == nil or now - self.printed_at >= self.interval then
    self.stream:write(text, "\n")
    self.stream:flush()
    self.printed_at, self.pending = now, nil
  else
    self.pending = text
  end
end

function Progress:done()
  if self.mode == "tty" then
    self.stream:write("\r\27[K")
    self.stream:flush()
  elseif self.mode == "plain" then
    if self.pending then
      self.stream:write(self.pending, "\n")
      self.stream:flush()
    end
    self.printed_at, self.pending = nil, nil
  end
end

function Progress:clear()
  if self.mode == "tty" then
    self.stream:write("\r\27[K")
    self.stream:flush()
  end
end

return cli
