-- k3.plan_step: plan entries measured inside the decode step, laid over the standalone plan.
--
-- scripts/autotune times each (shape, M) alone, chained to itself. Inside a decode step the
-- same kernel follows other kernels, and which configuration is fastest there can differ (a
-- configuration that streams as fast alone can start later behind the kernel before it, or
-- delay the one after). scripts/tune-step measures the candidates in the captured step itself
-- and writes the winners to lua/k3/policy/<arch>_step.lua:
--
--   return {arch =, machine =, date =, method =, commit =, earlier = {"date commit: method", ...},
--           plans    = {["NxK"] = {[M] = entry, ...}, ...},   -- plain calls
--           silu_mul = {["NxK"] = {[M] = entry, ...}, ...}}   -- calls with that epilogue
--
-- entry = {kernel = "skinny", config = {...}, step_us =, base_step_us =}: the config as in the
-- plan files, and the step's median time with it and with the entry it replaces, in the same
-- run; or {kernel = "cuda.linear.cublas", step_us =, base_step_us =} where cuBLAS beat the plan
-- file's skinny entry in the step. k3.plan_for lays these over the plain (or epilogue) plan:
-- M.overlay.
local M = {}

--- The kernel a step entry may name besides "skinny" (with no config): cuBLAS, the default
--- method's kernel for the decode shapes, where the step runs faster without the plan's entry.
M.CUBLAS = "cuda.linear.cublas"

--- The largest config.l2_prefetch_mb a plan entry may carry (K3_PLAN_MAX_L2_PREFETCH_MB, lib/k3.h).
M.MAX_L2_PREFETCH_MB = 40

--- plan_step.is_entry(e) -> boolean: whether e is a step entry, {kernel = "skinny", config =
--- {...}} or {kernel = plan_step.CUBLAS} (extra keys such as step_us allowed).
function M.is_entry(e)
  return type(e) == "table" and ((e.kernel == "skinny" and type(e.config) == "table")
                                 or (e.kernel == M.CUBLAS and e.config == nil))
end

--- plan_step.overlay(base, step) -> plan: a new table with base's entries ({[M] = entry} or
--- nil) and, for every M of step (nil: none), step's entry in its place; nil when both are nil.
--- Neither argument is changed.
function M.overlay(base, step)
  if step == nil then return base end
  if type(step) ~= "table" then
    error(string.format("plan_step.overlay: step entries must be a table; got %s", type(step)), 2)
  end
  local out = {}
  for m, e in pairs(base or {}) do out[m] = e end
  for m, e in pairs(step) do
    if math.type(m) ~= "integer" or not M.is_entry(e) then
      error(string.format("plan_step.overlay: entry [%s] must be {kernel = \"skinny\", config = {...}} "
                          .. "or {kernel = %q}", tostring(m), M.CUBLAS), 2)
    end
    out[m] = e
  end
  return out
end

--- plan_step.compose(plain, fused, step, epilogue) -> plan or nil: k3.plan_for's answer for one
--- shape from its entries in the plain plan file (`plain`), in the epilogue's plan file
--- (`fused`: nil where that file did not measure the shape, {} where cuBLAS won at every M) and
--- in the step file's section for the call (`step`: its plans for a plain call, its section
--- named after the epilogue for an epilogue call). A plain call: step's entries over plain. An
--- epilogue call: step's entries over fused, or over plain where fused is nil (the plain file's
--- own entries: a step entry of a plain call was measured with no epilogue and does not serve
--- one); nil when that leaves no entry and fused is {}.
function M.compose(plain, fused, step, epilogue)
  if not epilogue then return M.overlay(plain, step) end
  if fused == nil and step == nil then return plain end
  local out = M.overlay(fused or plain, step)
  return out ~= nil and next(out) ~= nil and out or nil
end

--- plan_step.entries(module, section, key) -> {[M] = entry} or nil: section ("plans" or an
--- epilogue's name) of the step file `module` (for example "k3.policy.sm90_step") for shape key
--- "NxK"; nil when the file does not exist or has no such entries. A file that exists but does
--- not load, or whose entries for the shape are not {[M] = {kernel = "skinny", config = {...}}}
--- or {[M] = {kernel = plan_step.CUBLAS}} with M in 1..16, raises naming the file, the section, the shape and the M (a broken plan
--- must not be skipped silently).
function M.entries(module, section, key)
  local found = package.searchpath(module, package.path)
  if not found then return nil end
  local tbl = require(module)
  if type(tbl) ~= "table" then
    error(string.format("%s (%s): must return a table; got %s", module, found, type(tbl)), 2)
  end
  local sec = tbl[section]
  if sec == nil then return nil end
  if type(sec) ~= "table" then
    error(string.format("%s (%s): field '%s' must be a table; got %s", module, found, section, type(sec)), 2)
  end
  local e = sec[key]
  if e == nil then return nil end
  if type(e) ~= "table" then
    error(string.format("%s (%s): %s[%q] must be a table; got %s", module, found, section, key, type(e)), 2)
  end
  for m, v in pairs(e) do
    if math.type(m) ~= "integer" or m < 1 or m > 16 or not M.is_entry(v) then
      error(string.format("%s (%s): %s[%q][%s] must be an M in 1..16 and "
                          .. "{kernel = \"skinny\", config = {...}} or {kernel = %q}", module, found,
                          section, key, tostring(m), M.CUBLAS), 2)
    end
  end
  return e
end

--- plan_step.config_key(cfg) -> string: a config table as one canonical string, its fields
--- sorted by name ("balanced=true,rows=8,..."), so that equal configs give equal keys.
function M.config_key(cfg)
  local names = {}
  for k in pairs(cfg) do names[#names + 1] = k end
  table.sort(names)
  local parts = {}
  for i, k in ipairs(names) do parts[i] = k .. "=" .. tostring(cfg[k]) end
  return table.concat(parts, ",")
end

--- plan_step.candidates(plans, key, m, current[, more, ...]) -> {config, ...}: the distinct
--- skinny configs a step tuner tries for shape `key` at M = m: every config `plans[key]` uses at
--- any M, then every config another shape uses at M = m, in a fixed order (the shape's own by M,
--- then the other shapes by name), then the same from each further plan table `more` (an
--- epilogue call also tries the plain plan's configs), without `current` (the config the step
--- runs now; may be nil) and without repeats.
function M.candidates(plans, key, m, current, ...)
  local seen, out = {}, {}
  if current then seen[M.config_key(current)] = true end
  local function add(e)
    if type(e) == "table" and e.kernel == "skinny" and type(e.config) == "table" then
      local k = M.config_key(e.config)
      if not seen[k] then
        seen[k] = true
        out[#out + 1] = e.config
      end
    end
  end
  for _, set in ipairs({plans, ...}) do
    local own = set[key] or {}
    local ms = {}
    for mm in pairs(own) do ms[#ms + 1] = mm end
    table.sort(ms)
    for _, mm in ipairs(ms) do add(own[mm]) end
    local keys = {}
    for k in pairs(set) do if k ~= key then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do add(set[k][m]) end
  end
  return out
end

--- plan_step.short(cfg) -> string: a skinny config in the benchmarks' short form, "t512 r8 u4
--- v8 s16 w16 bal pf8": threads, rows, unroll, vec and split_k always ("-" for a field left to
--- the kernel's default), then " w16" for rows_per_warp 16, " bal" for the balanced grid and
--- " pfN" for an L2 prefetch of N MiB. plan_step.parse_short reads it back.
function M.short(cfg)
  local function f(v) return v ~= nil and tostring(v) or "-" end
  local s = string.format("t%s r%s u%s v%s s%s", f(cfg.threads), f(cfg.rows), f(cfg.unroll),
                          f(cfg.vec), f(cfg.split_k))
  if cfg.rows_per_warp and cfg.rows_per_warp ~= 8 then s = s .. " w" .. cfg.rows_per_warp end
  if cfg.balanced then s = s .. " bal" end
  if (cfg.l2_prefetch_mb or 0) > 0 then s = s .. " pf" .. cfg.l2_prefetch_mb end
  return s
end

-- The config field of each short-form letter.
local SHORT_FIELDS = {t = "threads", r = "rows", u = "unroll", v = "vec", s = "split_k",
                      w = "rows_per_warp", pf = "l2_prefetch_mb"}

--- plan_step.parse_short(text) -> config: the skinny config a short form names (plan_step.short's
--- text, or any subset of its tokens in any order: "t512 r32 u4 s8 w16 bal"), a field given as
--- "-" or left out being the kernel's default, as are w8 and pf0 (plan_step.short leaves them
--- out too, so equal configs give equal texts). Raises on an empty text, an unknown or repeated
--- token, or a count that is not written in decimal digits as a positive integer (pf:
--- 0..MAX_L2_PREFETCH_MB), naming the token; whether the kernel has the configuration is its
--- own check (explain says).
function M.parse_short(text)
  if type(text) ~= "string" or not text:find("%S") then
    error(string.format("plan_step.parse_short: expected a config such as 't512 r8 u4 v8 s16'; got %s",
                        type(text) == "string" and "'" .. text .. "'" or type(text)), 2)
  end
  local cfg, seen = {}, {}
  for tok in text:gmatch("%S+") do
    local letter, num = tok:match("^(%a+)(.*)$")
    local field = letter and (letter == "bal" and "balanced" or SHORT_FIELDS[letter])
    if not field or (letter == "bal" and num ~= "") then
      error(string.format("plan_step.parse_short: unknown token '%s' in '%s' (expected tN rN uN vN sN wN bal pfN)",
                          tok, text), 2)
    end
    if seen[field] then
      error(string.format("plan_step.parse_short: '%s' repeats %s in '%s'", tok, field, text), 2)
    end
    seen[field] = true
    if letter == "bal" then
      cfg.balanced = true
    elseif num ~= "-" then
      local n = num:match("^%d+$") and #num <= 9 and math.tointeger(tonumber(num)) or nil
      local lo = letter == "pf" and 0 or 1
      if not n or n < lo or (letter == "pf" and n > M.MAX_L2_PREFETCH_MB) then
        error(string.format("plan_step.parse_short: '%s' in '%s' needs %s", tok, text,
                            letter == "pf" and ("MiB 0.." .. M.MAX_L2_PREFETCH_MB) or "a positive integer"), 2)
      end
      if not ((letter == "pf" and n == 0) or (letter == "w" and n == 8)) then cfg[field] = n end
    end
  end
  return cfg
end

--- plan_step.prefetch_variants(cfg, mbs) -> {config, ...}: copies of skinny config `cfg` with
--- l2_prefetch_mb set to each budget of `mbs` (a list of integers, MiB 0..40, in order; 0 gives
--- cfg without the field where cfg has a prefetch; cfg's own value and repeats are skipped), for
--- a step tuner to try the L2 prefetch on, or off, the configuration a shape runs now; {} when
--- cfg is nil (the shape is not on the skinny kernel). A bad `mbs` raises whatever cfg is.
function M.prefetch_variants(cfg, mbs)
  if type(mbs) ~= "table" then
    error("plan_step.prefetch_variants: mbs must be a list of MiB; got " .. type(mbs), 2)
  end
  for i, mb in ipairs(mbs) do
    if math.type(mb) ~= "integer" or mb < 0 or mb > M.MAX_L2_PREFETCH_MB then
      error(string.format("plan_step.prefetch_variants: mbs[%d] must be an integer in 0..%d (MiB); got %s %s",
                          i, M.MAX_L2_PREFETCH_MB, math.type(mb) or type(mb), tostring(mb)), 2)
    end
  end
  local out, seen = {}, {}
  if cfg == nil then return out end
  if type(cfg) ~= "table" then error("plan_step.prefetch_variants: cfg must be a table or nil; got " .. type(cfg), 2) end
  local own = cfg.l2_prefetch_mb or 0
  for _, mb in ipairs(mbs) do
    if mb ~= own and not seen[mb] then
      seen[mb] = true
      local c = {}
      for k, v in pairs(cfg) do c[k] = v end
      c.l2_prefetch_mb = mb > 0 and mb or nil
      out[#out + 1] = c
    end
  end
  return out
end

--- plan_step.decide(pairs, min_gain) -> keep, gain: pairs = {{base = µs, cand = µs}, ...}, one
--- per timing pass (each pass times the step with the current entry, then with the candidate);
--- keep is true when the candidate is faster by at least min_gain (a fraction, e.g. 0.002) in
--- every pass, and faster at all (with min_gain 0 a tie is not kept); gain is the smallest
--- fractional gain over the passes (negative: slower).
function M.decide(pairs, min_gain)
  if #pairs == 0 then error("plan_step.decide: no timing passes", 2) end
  local worst = math.huge
  for _, p in ipairs(pairs) do
    local g = (p.base - p.cand) / p.base
    if g < worst then worst = g end
  end
  return worst >= min_gain and worst > 0, worst
end

local function lua_value(v)
  if type(v) == "string" then return string.format("%q", v) end
  if math.type(v) == "float" then return string.format("%.2f", v) end
  return tostring(v)
end

-- {threads = 256, rows = 8, ...} in the plan files' field order, then any others by name.
local ORDER = {"threads", "rows", "unroll", "vec", "split_k", "rows_per_warp", "balanced",
               "l2_prefetch_mb"}
local function config_text(cfg)
  local parts, done = {}, {}
  for _, k in ipairs(ORDER) do
    if cfg[k] ~= nil then
      parts[#parts + 1] = k .. " = " .. lua_value(cfg[k])
      done[k] = true
    end
  end
  local rest = {}
  for k in pairs(cfg) do if not done[k] then rest[#rest + 1] = k end end
  table.sort(rest)
  for _, k in ipairs(rest) do parts[#parts + 1] = k .. " = " .. lua_value(cfg[k]) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

--- plan_step.render(t) -> string: the Lua source of a step file (the layout above) for
--- t = {arch =, machine =, date =, method =, commit =, earlier =, plans =, silu_mul =} (earlier:
--- optional, a list of strings, the runs whose entries the file may still carry); loading the text
--- gives back t's values (times rounded to 0.01 µs; an entry without them, as a file written
--- by hand may carry over, is written without them).
function M.render(t)
  local out = {"-- " .. t.arch .. "_step.lua: plan entries (cuda.linear.skinny configurations, or cuBLAS) measured",
               "-- inside the decode step, written by scripts/tune-step; k3.plan_for lays `plans` over",
               "-- " .. t.arch .. ".lua and `silu_mul` over " .. t.arch .. "_silu_mul.lua (k3.plan_step).",
               "-- step_us / base_step_us: the step's median time with the entry and with the one it",
               "-- replaces, in the same run; `earlier`: the runs whose entries the file may still carry.",
               "-- Regenerate on the machine rather than editing by hand.",
               "return {"}
  for _, f in ipairs({"arch", "machine", "date", "commit", "method"}) do
    if t[f] ~= nil then out[#out + 1] = string.format("  %s = %s,", f, lua_value(t[f])) end
  end
  if t.earlier and #t.earlier > 0 then
    out[#out + 1] = "  earlier = {"
    for _, e in ipairs(t.earlier) do out[#out + 1] = "    " .. lua_value(e) .. "," end
    out[#out + 1] = "  },"
  end
  for _, section in ipairs({"plans", "silu_mul"}) do
    local sec = t[section] or {}
    out[#out + 1] = "  " .. section .. " = {"
    local keys = {}
    for k in pairs(sec) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
      out[#out + 1] = string.format("    [%q] = {", k)
      local ms = {}
      for m in pairs(sec[k]) do ms[#ms + 1] = m end
      table.sort(ms)
      for _, m in ipairs(ms) do
        local e = sec[k][m]
        local times = {}
        for _, f in ipairs({"step_us", "base_step_us"}) do
          if type(e[f]) == "number" then times[#times + 1] = string.format(", %s = %.2f", f, e[f]) end
        end
        local cfg = e.config and (", config = " .. config_text(e.config)) or ""
        out[#out + 1] = string.format("      [%d] = {kernel = %q%s%s},", m, e.kernel, cfg,
                                      table.concat(times))
      end
      out[#out + 1] = "    },"
    end
    out[#out + 1] = "  },"
  end
  out[#out + 1] = "}"
  return table.concat(out, "\n") .. "\n"
end

return M
