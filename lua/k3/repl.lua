-- k3.repl — what scripts/k3 adds to the interpreter's own REPL (lua5.4 -i): results that print
-- readably (tables through k3.inspect, objects with a __tostring through it) and Tab completion
-- of globals, fields and methods on the interpreter's readline. Where the interpreter has no
-- readline, lines are read as plain input and Tab is just a character.
local k3 = require "k3"
local core = require "k3.core"

local repl = {}

local KEYWORDS = {"and", "break", "do", "else", "elseif", "end", "false", "for", "function",
                  "goto", "if", "in", "local", "nil", "not", "or", "repeat", "return", "then",
                  "true", "until", "while"}

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

-- The names v offers after "." or ":": a tensor's methods; a table's own string keys and,
-- through each metatable's __index table (a class and the classes it inherits from), its
-- class's; a userdata's __index table. Names that are not identifiers are left out. Walking
-- is guarded: a __pairs or __index that raises offers nothing more.
local function names_of(v)
  local out, seen = {}, {}
  local function add(k)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k] then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  if k3.is_tensor(v) then
    for k in pairs(core._tensor_methods) do add(k) end
    return out
  end
  if v == k3 then add("policy") end -- served by k3's __index, not a raw field
  local t, depth = v, 0
  while t ~= nil and depth < 8 do
    if type(t) == "table" then
      pcall(function() for k in pairs(t) do add(k) end end)
    end
    local mt = getmetatable(t)
    local idx = type(mt) == "table" and rawget(mt, "__index") or nil
    if type(idx) ~= "table" or idx == t then break end
    t, depth = idx, depth + 1
  end
  return out
end

-- Resolves a dotted path of identifiers ("k3.nn") from the globals; nil when any step is
-- missing or raises.
local function resolve(path)
  local v = _G
  for name in path:gmatch("[^.]+") do
    if not name:match("^[%a_][%w_]*$") then return nil end
    local ok, r = pcall(function() return v[name] end)
    if not ok or r == nil then return nil end
    v = r
  end
  return v
end

--- repl.complete(word) -> the sorted candidates for the word before the cursor, each a whole
--- replacement for it: "k3.ze" -> {"k3.zeros"}, "t:si" -> {"t:size"}, "pri" -> {"print"}.
--- Globals and keywords complete a bare word; "a.b.c" completes the fields of a.b and
--- "a.b:c" the methods of a.b (a tensor's methods, a class's through its metatable). Names
--- starting with "_" are offered only when the word's last part starts with "_".
function repl.complete(word)
  local path, sep, part = word:match("^(.-)([.:])([%w_]*)$")
  local names
  if path then
    if not path:match("^[%a_][%w_.]*$") or path:find("%.%.") or path:sub(-1) == "." then
      return {}
    end
    local v = resolve(path)
    if v == nil then return {} end
    names = names_of(v)
  else
    if not word:match("^[%a_]?[%w_]*$") then return {} end
    path, sep, part = "", "", word
    names = names_of(_G)
    for _, kw in ipairs(KEYWORDS) do names[#names + 1] = kw end
  end
  local out, hidden = {}, part:sub(1, 1) ~= "_"
  for _, n in ipairs(names) do
    if n:sub(1, #part) == part and not (hidden and n:sub(1, 1) == "_") then
      out[#out + 1] = path .. sep .. n
    end
  end
  table.sort(out)
  return out
end

--- repl.start() -> whether Tab completion is on: makes the global print show tables through
--- k3.inspect and objects with a __tostring through it (lua.c prints each result with the
--- global print), installs repl.complete on the interpreter's readline where it has one, and
--- writes k3's banner line.
function repl.start()
  local plain_print = print
  _G.print = function(...)
    local out = table.pack(...)
    for i = 1, out.n do
      if type(out[i]) == "table" and not has_tostring(out[i]) then out[i] = k3.inspect(out[i]) end
    end
    plain_print(table.unpack(out, 1, out.n))
  end
  local completing = core._repl_complete(function(word) return repl.complete(word) end)
  local b = k3.backends()
  io.write(string.format("k3 %s: cuda %s. k3.help() lists the API.\n", k3.version,
    b.cuda.available and ("available, " .. b.cuda.devices .. " device(s)") or
    ("unavailable (" .. tostring(b.cuda.reason) .. ")")))
  return completing
end

return repl
