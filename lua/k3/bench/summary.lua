-- k3.bench.summary — the machine-readable result file of a GPU's benchmark runs,
-- bench/summary-<gpu>.json (bench/summary-h200.json for the H200): one top-level object per
-- benchmark (`linear`, `attn_res`, `stack`), each with date (UTC, ISO 8601), machine, commit
-- and command beside its figures. A run rewrites only its own benchmark's objects; the rest
-- of the file is kept as it was.
local U = require "k3.bench.util"

local S = {}

-- S.gpu_tag(machine) -> "h200" for "NVIDIA H200, 132 SMs, ..."; the lower-case model name's
-- last word (letters and digits) otherwise; "gpu" when machine names none.
function S.gpu_tag(machine)
  local name = tostring(machine or ""):match("^([^,]+)") or ""
  local tag = name:lower():match("(h%d+)") or name:lower():match("([%w]+)%s*$")
  return tag and tag ~= "" and tag or "gpu"
end

-- S.commit(root) -> $K3_COMMIT, else `git rev-parse --short HEAD` in root, else "unknown"
-- (a copy of the tree without its .git).
function S.commit(root)
  local c = os.getenv("K3_COMMIT")
  if c and c ~= "" then return c end
  local p = io.popen("git -C " .. U.shell_quote(root) .. " rev-parse --short HEAD 2>/dev/null")
  local s = p and p:read("l")
  if p then p:close() end
  return s and s ~= "" and s or "unknown"
end

-- A decoded JSON object (dkjson marks arrays), or a table built in Lua.
local function is_object(v)
  local m = type(v) == "table" and getmetatable(v)
  return type(v) == "table" and not (m and m.__jsontype == "array")
end

-- S.update(path, key, obj): sets the top-level `key` of the JSON object in `path` (created when
-- missing) to obj and writes the file back (keys sorted). Raises when the file exists but is
-- not a JSON object, rather than overwrite what it cannot read.
function S.update(path, key, obj)
  local doc = {}
  local f = io.open(path, "r")
  local text = f and f:read("a")
  if f then f:close() end
  if text then
    local ok, v = pcall(U.json_decode, text)
    if not ok or not is_object(v) then
      error(string.format("bench: %s is not a JSON object (%s); not overwritten", path,
                          not ok and tostring(v) or type(v) == "table" and "a JSON array" or type(v)), 0)
    end
    doc = v
  end
  doc[key] = obj
  U.write_file(path, U.json_encode(doc) .. "\n")
end

-- How a figure of kind `fmt` prints (STANDING's fifth field): "x" a ratio, "pct" a fraction
-- 0..1 as a percentage, "us" / "ms" a time; `digits` more decimals than the usual (so that a
-- figure next to its target does not print as the target).
local FORMATS = {x = {"%%.%dfx", 2, 1}, pct = {"%%.%df%%%%", 1, 100}, us = {"%%.%df µs", 2, 1},
                 ms = {"%%.%df ms", 3, 1}}
local function show(v, fmt, digits)
  if math.type(v) == nil or v ~= v then return "-" end
  local f = FORMATS[fmt]
  if not f then return tostring(v) end
  return string.format(string.format(f[1], f[2] + (digits or 0)), f[3] * v)
end

-- A figure and its target as they print: with two more decimals where the usual ones would
-- print the figure as its target but the two differ.
local function show_pair(v, target, fmt)
  local a, b = show(v, fmt), show(target, fmt)
  if a == b and v ~= target then a, b = show(v, fmt, 2), show(target, fmt, 2) end
  return a, b
end

local function text_or(v, default) return type(v) == "string" and v ~= "" and v or default end

-- S.standing(doc, benches, path) -> lines, met, total: each benchmark's record in doc (a decoded
-- summary file; path names it in the heading) against its targets. benches lists {name, rows}
-- in print order, rows as the modules' STANDING tables: {key, label, op, target, fmt, where},
-- op "<=", ">=" or "all" (the figure, a count, equals the count in the record's field named by
-- target, and is not 0), where (optional) a record field printed after the figure. A record
-- missing from doc, or a figure missing from a record (or not a number), prints as such and
-- counts as not met. Raises "bench: standing: ..." when doc is not an object or a benchmark's
-- entry in it is not one.
function S.standing(doc, benches, path)
  path = path or "the summary"
  if not is_object(doc) then error(string.format("bench: standing: %s is not a JSON object", path), 0) end
  local lines = {string.format("where k3 stands: %s (each benchmark's last full run, against the " ..
                               "targets the benchmarks state today)", path), ""}
  local met, total = 0, 0
  for _, b in ipairs(benches) do
    local name, spec = b[1], b[2]
    local rec = doc[name]
    total = total + #spec
    if rec == nil then
      lines[#lines + 1] = string.format("%s: no record in this file (run scripts/bench %s on the GPU)", name, name)
    elseif not is_object(rec) then
      error(string.format("bench: standing: %s: `%s` is not an object (a %s)", path, name,
                          type(rec) == "table" and "JSON array" or type(rec)), 0)
    else
      lines[#lines + 1] = string.format("%s: %s, commit %s, %s", name, text_or(rec.date, "no date"),
                                        text_or(rec.commit, "unknown"), text_or(rec.machine, "no machine"))
      if text_or(rec.command) then lines[#lines + 1] = "  " .. rec.command end
      local rows = {}
      for _, t in ipairs(spec) do
        local key, label, op, target, fmt, where = t[1], t[2], t[3], t[4], t[5], t[6]
        local v, verdict, measured, want = rec[key], "n/a"
        if op == "all" then
          local n, of = math.tointeger(v), math.tointeger(rec[target])
          want = "all"
          measured = n and of and string.format("%d of %d", n, of) or "-"
          if n and of and of > 0 then verdict = n == of and "MET" or "MISSED" end
        else
          if math.type(v) and v == v then verdict = U.verdict(v, op, target) end
          measured, want = show_pair(v, target, fmt)
          want = op .. " " .. want
        end
        if where and text_or(rec[where]) and measured ~= "-" then measured = measured .. " (" .. rec[where] .. ")" end
        rows[#rows + 1] = {label = label, measured = measured, target = want, verdict = verdict}
        if verdict == "MET" then met = met + 1 end
      end
      local cols = {{head = "figure", key = "label", align = "l"}, {head = "measured", key = "measured"},
                    {head = "target", key = "target"}, {head = "verdict", key = "verdict", align = "l"}}
      for _, l in ipairs(U.format_table(cols, rows)) do lines[#lines + 1] = ("  " .. l):gsub("%s+$", "") end
    end
    lines[#lines + 1] = ""
  end
  lines[#lines + 1] = string.format("targets met: %d of %d", met, total)
  return lines, met, total
end

return S
