-- k3.bench.util — the plumbing of scripts/bench: a small JSON encoder/decoder, CSV writing,
-- text tables, the progress line, statistics and target verdicts. Pure Lua, no k3 calls, so
-- every path here runs the same in --dry-run and on the GPU.
local U = {}

-- ---- JSON --------------------------------------------------------------------------------------

local function is_array(t)
  local n = 0
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 then return false end
    n = n + 1
  end
  for i = 1, n do if t[i] == nil then return false end end
  return true, n
end

local ESC = {['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n',
             ['\r'] = '\\r', ['\t'] = '\\t'}

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return ESC[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function encode_number(v)
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  if math.type(v) == "integer" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 2^53 then return string.format("%.1f", v) end
  return string.format("%.10g", v)
end

-- U.json_encode(v, indent): tables with keys 1..n are arrays, others objects (keys sorted,
-- so the files diff cleanly between runs). NaN and infinities become null.
function U.json_encode(v, indent, level)
  indent, level = indent or "  ", level or 0
  local t = type(v)
  if v == nil or v == U.null then return "null" end
  if t == "boolean" then return tostring(v) end
  if t == "number" then return encode_number(v) end
  if t == "string" then return encode_string(v) end
  if t ~= "table" then return encode_string(tostring(v)) end
  local pad, pad1 = "\n" .. indent:rep(level), "\n" .. indent:rep(level + 1)
  local arr, n = is_array(v)
  if arr and n == 0 and next(v) == nil then return "[]" end
  local parts = {}
  if arr then
    -- Arrays of scalars stay on one line.
    local flat = true
    for i = 1, n do if type(v[i]) == "table" then flat = false end end
    for i = 1, n do parts[i] = U.json_encode(v[i], indent, level + 1) end
    if flat then return "[" .. table.concat(parts, ", ") .. "]" end
    return "[" .. pad1 .. table.concat(parts, "," .. pad1) .. pad .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for i, k in ipairs(keys) do
    local val = v[k]
    if val == nil then val = v[tonumber(k)] end
    parts[i] = encode_string(k) .. ": " .. U.json_encode(val, indent, level + 1)
  end
  return "{" .. pad1 .. table.concat(parts, "," .. pad1) .. pad .. "}"
end

-- A sentinel for JSON null inside decoded arrays (nil would end a Lua sequence).
U.null = setmetatable({}, {__tostring = function() return "null" end})

-- U.json_decode(s) -> value. Raises "json: <what> at byte N" on malformed input.
function U.json_decode(s)
  local pos = 1
  local function fail(what) error(string.format("json: %s at byte %d", what, pos), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    pos = pos + 1
    local out = {}
    while true do
      local c = s:sub(pos, pos)
      if c == "" then fail("unterminated string") end
      if c == '"' then pos = pos + 1 break end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local map = {['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n',
                     r = '\r', t = '\t'}
        if map[e] then
          out[#out + 1] = map[e]
          pos = pos + 2
        elseif e == "u" then
          local hex = s:sub(pos + 2, pos + 5)
          if not hex:match("^%x%x%x%x$") then fail("bad \\u escape") end
          out[#out + 1] = utf8.char(tonumber(hex, 16))
          pos = pos + 6
        else
          fail("bad escape")
        end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
    return table.concat(out)
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      pos = pos + 1
      local obj = {}
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1 return obj end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("expected a string key") end
        local k = str()
        ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        local v = value()
        if v ~= U.null then obj[k] = v end
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then pos = pos - 1 fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      pos = pos + 1
      local arr = {}
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1 return arr end
      while true do
        arr[#arr + 1] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then pos = pos - 1 fail("expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4 return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5 return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4 return U.null
    else
      local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      if not num or num == "" or num == "-" then fail("unexpected character '" .. c .. "'") end
      pos = pos + #num
      local v = tonumber(num)
      if not v then fail("bad number '" .. num .. "'") end
      return v
    end
  end
  local v = value()
  ws()
  if pos <= #s then fail("trailing characters") end
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
  local s = f:read("a")
  f:close()
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

function U.date()
  local p = io.popen("date -u +%Y-%m-%dT%H:%M:%SZ 2>/dev/null")
  local s = p and p:read("l")
  if p then p:close() end
  return s or os.date("!%Y-%m-%dT%H:%M:%SZ")
end

return U
