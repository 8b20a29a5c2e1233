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
    if not ok or type(v) ~= "table" then
      error(string.format("bench: %s is not a JSON object (%s); not overwritten", path,
                          ok and type(v) or tostring(v)), 0)
    end
    doc = v
  end
  doc[key] = obj
  U.write_file(path, U.json_encode(doc) .. "\n")
end

-- How a figure of kind `fmt` prints (STANDING's last field): "x" a ratio, "pct" a fraction 0..1
-- as a percentage, "us" / "ms" a time, "rows" a count of the record's rows.
local function show(v, fmt, of)
  if type(v) ~= "number" or v ~= v then return "-" end
  if fmt == "x" then return string.format("%.2fx", v) end
  if fmt == "pct" then return string.format("%.1f%%", 100 * v) end
  if fmt == "us" then return string.format("%.2f µs", v) end
  if fmt == "ms" then return string.format("%.3f ms", v) end
  if fmt == "rows" then return type(of) == "number" and string.format("%d of %d", v, of) or tostring(v) end
  return tostring(v)
end

-- S.standing(doc, benches, path) -> lines, met, total: each benchmark's record in doc (a decoded
-- summary file; path names it in the heading) against its targets. benches lists {name, rows}
-- in print order, rows as the modules' STANDING tables: {key, label, op, target, fmt}, op "<=",
-- ">=" or "all" (the figure equals the record's field named by target). A record missing from
-- doc, or a figure missing from a record, prints as such and counts as not met.
function S.standing(doc, benches, path)
  local lines = {string.format("where k3 stands: %s (each benchmark's last full run, against the " ..
                               "targets the benchmarks state today)", path or "the summary"), ""}
  local met, total = 0, 0
  for _, b in ipairs(benches) do
    local name, spec = b[1], b[2]
    local rec = type(doc) == "table" and doc[name] or nil
    total = total + #spec
    if type(rec) ~= "table" then
      lines[#lines + 1] = string.format("%s: no record in this file (run scripts/bench %s on the GPU)", name, name)
    else
      lines[#lines + 1] = string.format("%s: %s, commit %s, %s", name, tostring(rec.date or "no date"),
                                        tostring(rec.commit or "unknown"), tostring(rec.machine or "no machine"))
      if rec.command then lines[#lines + 1] = "  " .. tostring(rec.command) end
      local rows = {}
      for _, t in ipairs(spec) do
        local key, label, op, target, fmt = t[1], t[2], t[3], t[4], t[5]
        local v, verdict, want = rec[key], "n/a", nil
        if op == "all" then
          local of = rec[target]
          want = "all"
          if type(v) == "number" and type(of) == "number" then verdict = v == of and "MET" or "MISSED" end
          rows[#rows + 1] = {label = label, measured = show(v, fmt, of), target = want, verdict = verdict}
        else
          if type(v) == "number" then verdict = U.verdict(v, op, target) end
          want = op .. " " .. show(target, fmt)
          rows[#rows + 1] = {label = label, measured = show(v, fmt), target = want, verdict = verdict}
        end
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
