-- k3.cli: what k3's scripts share (scripts/demo.lua, scripts/bench.lua, the --tp demo): the
-- option tokenizer ("--key value" and "--key=value", anything else passed through as it is),
-- the --m list of decode batch sizes, and the progress reporter (a live line on a terminal,
-- occasional plain lines in a log).
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

--- cli.batch_sizes(text, max) -> list, or nil and a message: the decode batch sizes M of a
--- --m value, items separated by commas, each a number or a range a-b ("1,2,4,16", "1-16"),
--- every size in 1..max (checked before a range is expanded, so a typo such as 1-100000 is
--- refused at once). The message names the item: "empty item in '1,,2'", "range '3-1' runs
--- backwards (write 1-3)", "'x' is not a number or a range a-b", "batch sizes must be in
--- 1..16; got 17 in '1,17'".
function cli.batch_sizes(text, max)
  local list = {}
  for part in (text .. ","):gmatch("([^,]*),") do
    local a, b = part:match("^%s*(%d+)%s*%-%s*(%d+)%s*$")
    if not a then
      a = part:match("^%s*(%d+)%s*$")
      b = a
    end
    if part:match("^%s*$") then return nil, "empty item in '" .. text .. "'" end
    if not a then return nil, "'" .. part .. "' is not a number or a range a-b" end
    local lo, hi = math.tointeger(tonumber(a)), math.tointeger(tonumber(b))
    for _, m in ipairs({{lo, a}, {hi, b}}) do
      if not m[1] or m[1] < 1 or m[1] > max then
        return nil, string.format("batch sizes must be in 1..%d; got %s in '%s'", max, m[2], text)
      end
    end
    if lo > hi then return nil, string.format("range '%s' runs backwards (write %d-%d)", part, hi, lo) end
    for i = lo, hi do list[#list + 1] = i end
  end
  return list
end

-- ---- progress --------------------------------------------------------------------------------

local core = require "k3.core"

-- K3_PROGRESS values (any case, surrounding whitespace ignored): 0/1 and their boolean
-- synonyms, as K3_BATCH_INVARIANT takes them, and plain.
local MODES = {["0"] = "off", ["false"] = "off", no = "off", off = "off",
               ["1"] = "tty", ["true"] = "tty", yes = "tty", on = "tty", plain = "plain"}

-- Values already reported: each typo is reported once, however many reporters ask.
local warned = {}

--- cli.progress_mode(stream, setting) -> "tty" | "plain" | "off": how progress is shown on
--- stream (a Lua file handle, default io.stderr). setting (default: the K3_PROGRESS
--- environment variable; any case, surrounding whitespace ignored) "0" (or "off", "false",
--- "no") means off, "1" (or "on", "true", "yes") the live line even when stream is not a
--- terminal, "plain" plain lines even on a terminal; unset or empty picks the live line when
--- stream is a terminal (k3.isatty) and plain lines otherwise (a log file, a pipe). Any other
--- value is treated as unset and reported once on stderr ("k3: warning: K3_PROGRESS: ..."),
--- as k3 reports a K3_BATCH_INVARIANT it does not understand: a typo is not silently ignored.
function cli.progress_mode(stream, setting)
  if setting == nil then setting = os.getenv("K3_PROGRESS") end
  local value = setting ~= nil and tostring(setting):match("^%s*(.-)%s*$") or ""
  local mode = MODES[value:lower()]
  if mode then return mode end
  if value ~= "" and not warned[value] then
    warned[value] = true
    io.stderr:write(string.format("k3: warning: K3_PROGRESS: unrecognised value '%s' (expected 0, " ..
                                  "1, plain, true, false, yes, no, on or off); progress is shown " ..
                                  "as when it is unset\n", value:sub(1, 100)))
    io.stderr:flush()
  end
  local ok, tty = pcall(core.isatty, stream or io.stderr)
  return (ok and tty) and "tty" or "plain"
end

local Progress = {}
Progress.__index = Progress

--- cli.progress(opts) -> a reporter with r:update(fmt, ...), r:done() and r:clear().
--- opts (all optional): stream (default io.stderr), quiet (true: no output at all), mode
--- ("tty" | "plain" | "off"; default cli.progress_mode(stream)), interval (seconds between
--- plain lines, default 5), clock (a function returning seconds; default k3.clock).
---   "tty":   update rewrites one line in place ("\r\27[K" .. text); done and clear erase it.
---   "plain": update prints its text as a line of its own, the first of each phase (each
---            new format string) at once, after the held-back last line of the phase before,
---            and then at most one per `interval` seconds; done prints the last text when it
---            was not printed (so a log ends on the final state) and lets the next update print
---            at once; clear prints nothing. No carriage returns or escape sequences.
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
                       clock = opts.clock or core.clock}, Progress)
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
  -- A new phase (another format string) prints at once, after the last state of the one
  -- before when that was held back: a log shows every phase starting, and how each ended.
  local new_phase = fmt ~= self.phase
  if new_phase and self.pending then self.stream:write(self.pending, "\n") end
  self.phase = fmt
  if new_phase or self.printed_at == nil or now - self.printed_at >= self.interval then
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
    self.printed_at, self.pending, self.phase = nil, nil, nil
  end
end

function Progress:clear()
  if self.mode == "tty" then
    self.stream:write("\r\27[K")
    self.stream:flush()
  end
end

return cli
