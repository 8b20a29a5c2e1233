-- k3.bench.util — the plumbing of scripts/bench: JSON (through lua-dkjson), CSV writing, text
-- tables, the progress line, statistics and target verdicts. No k3 calls (rel_diff aside), so
-- every path here runs the same in --dry-run and on the GPU.
local U = {}

-- ---- JSON --------------------------------------------------------------------------------------
-- Debian's lua-dkjson (module dkjson) does the encoding and decoding; here only the key order.

local json = require "dkjson"

-- The shortest of %.15g, %.16g, %.17g that reads back as the same double (dkjson writes
-- numbers with tostring, i.e. %.14g, which loses digits); integral values keep a ".0" so
-- they read back as floats.
local function float_text(x)
  local s
  for _, fmt in ipairs({"%.15g", "%.16g", "%.17g"}) do
    s = string.format(fmt, x)
    if tonumber(s) == x then break end
  end
  if not s:find("[.eEn]") then s = s .. ".0" end
  return s
end

-- A copy of v that dkjson can write exactly: finite non-integer-typed numbers become tables
-- whose __tojson gives float_text; every key is checked to be a string or a number (JSON
-- has nothing else, and dkjson fails inside on others); `keys` collects every key for the
-- key order. A table that contains itself raises.
local function prepare(v, keys, path)
  if math.type(v) == "float" and v == v and v ~= math.huge and v ~= -math.huge then
    return setmetatable({}, {__tojson = function() return float_text(v) end})
  end
  if type(v) ~= "table" or v == json.null then return v end
  if path[v] then error("json: reference cycle", 0) end
  path[v] = true
  local out = {}
  for k, x in pairs(v) do
    local tk = type(k)
    if tk ~= "string" and tk ~= "number" then
      error("json: object keys must be strings or numbers; got a " .. tk .. " key", 0)
    end
    keys[k] = true
    out[k] = prepare(x, keys, path)
  end
  path[v] = nil
  return out
end

-- A value JSON has no type for (a function, a userdata) is written as its tostring, so one
-- stray field cannot lose a benchmark's results; a cycle raises.
local function encode_exception(reason, value, _, message)
  if reason == "unsupported type" then return json.quotestring(tostring(value)) end
  error("json: " .. message, 0)
end

--- U.json_encode(v) -> JSON text, indented, keys of every object sorted (dkjson's keyorder:
--- every key of the document in sorted order), so result files diff cleanly between runs.
--- Tables with keys 1..n are arrays, others objects; floats are written exactly (the
--- shortest text that reads back as the same double); NaN and infinities become null, as
--- does U.null; other values JSON cannot hold become their tostring. Raises "json: reference
--- cycle" for a table that contains itself and "json: object keys must be strings or
--- numbers" for other keys.
function U.json_encode(v)
  local keys, order = {}, {}
  v = prepare(v, keys, {})
  for k in pairs(keys) do order[#order + 1] = k end
  table.sort(order, function(a, b) -- numbers (integer keys of sparse tables) before strings
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
  end)
  return json.encode(v, {indent = true, keyorder = order, exception = encode_exception})
end

-- A value that encodes as JSON null (dkjson's sentinel), for a missing cell in a row.
U.null = json.null

--- U.json_decode(s) -> value. JSON null decodes to nil (an object drops the key). Raises
--- "json: <what> at line L, column C" or "json: trailing characters at byte N" on malformed
--- input.
function U.json_decode(s)
  local v, pos, err = json.decode(s, 1, nil)
  if err then error("json: " .. err, 0) end
  local extra = s:find("%S", pos)
  if extra then error(string.format("json: trailing characters at byte %d", extra), 0) end
  return v
end

-- ---- files -------------------------------------------------------------------------------------

function U.shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function U.mkdir_p(dir)
  local ok = os.execute("mkdir -p " .. U.shell_quote(dir))
  if not ok then error("bench: cannot create directory " .. dir, 0) end
end

function U.write_file(path, text)
  local f, err = io.open(path, "w")
  if not f then error("bench: cannot write " .. tostring(err), 0) end
  f:write(text)
  f:close()
end

function U.read_file(path)
  local f, err = io.open(path, "r")
  if not f then error("bench: cannot read " .. tostring(err), 0) end
  local s, rerr = f:read("a")
  f:close()
  if not s then error(string.format("bench: cannot read %s: %s", path, tostring(rerr or "not a file")), 0) end
  return s
end

local function csv_cell(v)
  if v == nil or v == U.null then return "" end
  if type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "" end
    if math.type(v) == "integer" then return tostring(v) end
    return string.format("%.6g", v)
  end
  if type(v) == "boolean" then return v and "true" or "false" end
  local s = tostring(v)
  if s:find('[,"\n\r]') then s = '"' .. s:gsub('"', '""') .. '"' end
  return s
end

-- U.write_csv(path, keys, rows): one header line of keys, then one line per row (row[key]).
function U.write_csv(path, keys, rows)
  local lines = {table.concat(keys, ",")}
  for _, r in ipairs(rows) do
    local cells = {}
    for i, k in ipairs(keys) do cells[i] = csv_cell(r[k]) end
    lines[#lines + 1] = table.concat(cells, ",")
  end
  U.write_file(path, table.concat(lines, "\n") .. "\n")
end

-- ---- text tables -------------------------------------------------------------------------------

-- U.format_table(cols, rows) -> lines. cols: {{head =, key = | get = fn(row), fmt = "%.2f" |
-- fn(v, row), align = "l"|"r"}}. Missing values print as "-".
function U.format_table(cols, rows)
  local cells, width = {}, {}
  for j, c in ipairs(cols) do width[j] = utf8.len(c.head) or #c.head end
  for i, r in ipairs(rows) do
    cells[i] = {}
    for j, c in ipairs(cols) do
      local v
      if c.get then v = c.get(r) else v = r[c.key] end
      local s
      if v == nil or v == U.null or (type(v) == "number" and v ~= v) then
        s = "-"
      elseif type(c.fmt) == "function" then
        s = c.fmt(v, r)
      elseif c.fmt then
        s = string.format(c.fmt, v)
      else
        s = tostring(v)
      end
      cells[i][j] = s
      local len = utf8.len(s) or #s
      if len > width[j] then width[j] = len end
    end
  end
  local function pad(s, w, align)
    local n = w - (utf8.len(s) or #s)
    if n <= 0 then return s end
    if align == "l" then return s .. string.rep(" ", n) end
    return string.rep(" ", n) .. s
  end
  local lines = {}
  local head, rule = {}, {}
  for j, c in ipairs(cols) do
    head[j] = pad(c.head, width[j], c.align)
    rule[j] = string.rep("-", width[j])
  end
  lines[1] = table.concat(head, "  ")
  lines[2] = table.concat(rule, "  ")
  for i = 1, #rows do
    local parts = {}
    for j, c in ipairs(cols) do parts[j] = pad(cells[i][j], width[j], c.align) end
    lines[#lines + 1] = table.concat(parts, "  ")
  end
  return lines
end

-- ---- progress ------------------------------------------------------------------------------------

-- One k3.cli reporter on stderr for the whole run: a live line on a terminal, a plain line
-- every few seconds (and the last one at each progress_done) in a log; K3_PROGRESS overrides.
U.quiet = false
local reporter

--- U.progress(fmt, ...): the current step (nothing when U.quiet).
function U.progress(fmt, ...)
  if U.quiet then return end
  reporter = reporter or require("k3.cli").progress()
  reporter:update(fmt, ...)
end

--- U.progress_done(): ends the progress output before other text is printed.
function U.progress_done()
  if U.quiet or not reporter then return end
  reporter:done()
end

-- ---- numbers ---------------------------------------------------------------------------------

function U.geomean(xs)
  local s, n = 0, 0
  for _, x in ipairs(xs) do
    if x and x > 0 then s, n = s + math.log(x), n + 1 end
  end
  if n == 0 then return nil end
  return math.exp(s / n)
end

function U.median(xs)
  local t = {}
  for i, x in ipairs(xs) do t[i] = x end
  table.sort(t)
  if #t == 0 then return nil end
  return t[#t // 2 + 1]
end

function U.ceil_div(a, b) return (a + b - 1) // b end

-- "MET" / "MISSED" / "n/a" for a value against a target: op is "<=" or ">=".
function U.verdict(v, op, target)
  if v == nil or v ~= v then return "n/a" end
  if op == "<=" then return v <= target and "MET" or "MISSED" end
  return v >= target and "MET" or "MISSED"
end

function U.pct(v) return v and string.format("%.0f%%", 100 * v) or "-" end

function U.fmt_us(v)
  if v == nil then return "-" end
  if v >= 1000 then return string.format("%.0f", v) end
  if v >= 100 then return string.format("%.1f", v) end
  return string.format("%.2f", v)
end

--- U.rel_diff(a, b) -> max|a - b| / max|b| (max|a - b| when b is all zero); any devices.
function U.rel_diff(a, b)
  local k3 = require "k3"
  local z = k3.zeros(b:size(), {dtype = b:dtype(), device = b:device()})
  local scale = k3.max_abs_diff(b, z)
  z:free()
  local d = k3.max_abs_diff(a, b)
  if scale == 0 then return d end
  return d / scale
end

-- The name of GPU 0 as nvidia-smi reports it ("NVIDIA H200"), or nil (no nvidia-smi, no GPU).
function U.device_name()
  local f = io.popen("nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null")
  local name = f and f:read("l")
  if f then f:close() end
  return name and name ~= "" and name or nil
end

function U.date()
  local p = io.popen("date -u +%Y-%m-%dT%H:%M:%SZ 2>/dev/null")
  local s = p and p:read("l")
  if p then p:close() end
  return s or os.date("!%Y-%m-%dT%H:%M:%SZ")
end

return U
