-- scripts/tune-step.lua — the plan's entries chosen inside the decode step (run through
-- scripts/tune-step):
--
--   tune-step.lua [--m 1,16] [--config NAME] [--replays N] [--passes N] [--min-gain PCT]
--                 [--max-candidates N] [--shapes NxK,...] [--l2-prefetch MB,...]
--                 [--configs "t512 r32 u4 s8 w16 bal,..."] [--out FILE | --write] [--dry-run]
--
-- builds the stack of config NAME (default kimi-k3-tp8, seeded random bf16 weights as
-- `scripts/bench stack` makes them), finds its linear layers by shape (and by the SwiGLU
-- epilogue where a layer is called with it), and for each M and each shape in the step's order
-- tries the current configuration with each L2 prefetch budget of --l2-prefetch (MiB 0..40,
-- default 0,8,16,32; 0 is the configuration without its prefetch, where it has one:
-- k3.plan_step.prefetch_variants), cuBLAS in its place (an entry {kernel =
-- "cuda.linear.cublas"} where the plan names the skinny kernel), the configurations of
-- --configs (k3.plan_step.parse_short's short forms, in their order), then the candidate
-- configurations of k3.plan_step.candidates (the configs the plan files use for that shape at
-- any M, then those other shapes use at that M), at most N in all (default 12):
-- every layer of the shape gets k3.method.low_latency with the candidate at M (static
-- weights, as k3.nn builds them; a candidate its kernel declines for the shape and the call's
-- own prologue or epilogue is skipped, by the method's explain), the step is captured with
-- k3.cuda_graph and replayed (3 warm-up, then N timed by CUDA events, default 15: the median),
-- alternating with the step as it stands (each layer on its own method, as built; the step as
-- it stands first in odd passes, the candidate first in even ones), for --passes passes
-- (default 2). A candidate is kept when it is faster by at least PCT percent of the step
-- (default 0.2) in every pass (k3.plan_step.decide); of those kept, the one with the largest
-- smallest gain becomes the shape's entry at M and the search goes on from there (shape by
-- shape, greedily). The result is lua/k3/policy/<arch>_step.lua's
-- text (k3.plan_step.render): written to FILE, or to lua/k3/policy/<arch>_step.lua with
-- --write, where k3.plan_for lays it over the plan, else $OUT/<arch>_step.lua when OUT is set,
-- else build/tune-step/<arch>_step.lua (the folder is made and checked before any timing).
-- Entries of an existing step file for an (shape, M) not tuned in this run are carried over,
-- and the file's `earlier` lists the runs they came from (that file's run, then its own list).
-- --dry-run lists the shapes and candidates without timing anything. Progress on stderr.
local k3 = require "k3"
local plan_step = require "k3.plan_step"

local function die(msg)
  io.stderr:write("tune-step: ", msg, "\n")
  os.exit(2)
end

-- The value after option `what`, or a death naming it: missing, or the next option (a flag
-- given without its value must not swallow the flag after it).
local function value_of(v, what, takes)
  if v == nil or v:match("^%-%-") then
    die(string.format("%s takes %s; got %s", what, takes, v and ("'" .. v .. "'") or "nothing"))
  end
  return v
end

local function list_of(v, what, conv)
  v = value_of(v, what, "a comma-separated list")
  local out = {}
  for item in v:gmatch("[^,]+") do
    local x = conv(item) or die(what .. ": bad item '" .. item .. "'")
    out[#out + 1] = x
  end
  if #out == 0 then die(what .. " takes a comma-separated list; got '" .. v .. "'") end
  return out
end

local function count_of(v, what)
  local n = math.tointeger(tonumber(value_of(v, what, "a count")))
  return n or die(string.format("%s takes a count; got '%s'", what, v))
end

local function opts_of(argv)
  local o = {ms = {1, 16}, config = "kimi-k3-tp8", replays = 15, passes = 2, min_gain = 0.2,
             max_candidates = 12, l2_prefetch = {0, 8, 16, 32}}
  local i = 1
  while i <= #argv do
    local a, v = argv[i], argv[i + 1]
    local step = 2
    if a == "--m" then o.ms = list_of(v, "--m", function(s) return math.tointeger(tonumber(s)) end)
    elseif a == "--config" then o.config = value_of(v, a, "a name")
    elseif a == "--replays" then o.replays = count_of(v, a)
    elseif a == "--passes" then o.passes = count_of(v, a)
    elseif a == "--min-gain" then
      o.min_gain = tonumber(value_of(v, a, "a percentage"))
        or die("--min-gain takes a percentage; got '" .. v .. "'")
    elseif a == "--max-candidates" then o.max_candidates = count_of(v, a)
    elseif a == "--shapes" then
      o.shapes, o.shapes_text = {}, v
      for _, s in ipairs(list_of(v, "--shapes", function(s) return s:match("^%d+x%d+$") end)) do
        o.shapes[s] = true
      end
    elseif a == "--l2-prefetch" then
      o.l2_prefetch = list_of(v, a, function(s)
        local n = math.tointeger(tonumber(s))
        local max = plan_step.MAX_L2_PREFETCH_MB
        if not (n and n >= 0 and n <= max) then
          die(string.format("--l2-prefetch: bad item '%s' (MiB, an integer in 0..%d)", s, max))
        end
        return n
      end)
    elseif a == "--configs" then
      o.configs_text, o.configs = list_of(v, a, function(item) return item end), {}
      for i, item in ipairs(o.configs_text) do
        local ok, cfg = pcall(plan_step.parse_short, item)
        if not ok then die("--configs: " .. tostring(cfg):gsub("^.-plan_step%.parse_short: ", "")) end
        o.configs[i] = cfg
      end
    elseif a == "--out" then o.out = value_of(v, a, "a file")
    elseif a == "--write" then o.write, step = true, 1
    elseif a == "--dry-run" then o.dry_run, step = true, 1
    else die("unknown option " .. tostring(a)) end
    i = i + step
  end
  local seen_m = {}
  for _, m in ipairs(o.ms) do
    if m < 1 or m > 16 then die("--m: a plan covers M = 1..16; got " .. m) end
    if seen_m[m] then die("--m: M = " .. m .. " given twice") end
    seen_m[m] = true
  end
  if o.replays < 1 then die("--replays must be >= 1; got " .. o.replays) end
  if o.passes < 1 then die("--passes must be >= 1; got " .. o.passes) end
  if o.max_candidates < 1 then die("--max-candidates must be >= 1; got " .. o.max_candidates) end
  if o.min_gain < 0 then die("--min-gain must be >= 0; got " .. o.min_gain) end
  if o.write and o.out then die("--write and --out name two destinations; give one") end
  return o
end

local short = plan_step.short -- "t512 r8 u4 v8 s16 w16 bal": the benchmarks' short form

-- A step entry in that form: "cuBLAS" for plan_step.CUBLAS.
local function short_entry(e)
  return e.kernel == "skinny" and short(e.config) or "cuBLAS"
end

local function copy_plan(p)
  local out = {}
  for m, e in pairs(p or {}) do out[m] = e end
  return out
end

-- The folder the step file goes to: lua/k3/policy with --write, FILE's with --out, else $OUT
-- when set, else build/tune-step. Made and checked writable before anything is timed.
local function out_dir(o)
  if o.write then return "lua/k3/policy" end
  if o.out then return o.out:match("^(.*)/[^/]*$") or "." end
  local env = os.getenv("OUT")
  return env and env ~= "" and env or "build/tune-step"
end

local function check_dir(dir)
  os.execute("mkdir -p " .. require("k3.bench.util").shell_quote(dir) .. " 2>/dev/null")
  local probe = dir .. "/.tune-step-probe"
  local f, err = io.open(probe, "w")
  if not f then die("cannot write the step file under " .. dir .. ": " .. tostring(err)) end
  f:close()
  os.remove(probe)
end

local function main(argv)
  local o = opts_of(argv)
  local kimi = require "k3.model.kimi_k3"
  local nn = require "k3.nn"
  local cfg_ok, cfg = pcall(kimi.config, o.config)
  if not cfg_ok then die("--config: " .. tostring(cfg)) end
  if not o.dry_run then check_dir(out_dir(o)) end
  if not k3.plan_for then die("k3.plan_for is missing from this build") end
  local dev_ok, arch = pcall(k3.cuda_arch, 0)
  if not dev_ok then die("needs a CUDA device: " .. tostring(arch)) end
  local function plans_of(module)
    local ok, t = pcall(require, module)
    return ok and type(t) == "table" and type(t.plans) == "table" and t.plans or {}
  end
  local plain_plans = plans_of("k3.policy." .. arch)
  local section_plans = {plans = plain_plans, silu_mul = plans_of("k3.policy." .. arch .. "_silu_mul")}
  local step_module = "k3.policy." .. arch .. "_step"
  local ok_prev, prev = pcall(require, step_module)
  if not ok_prev and package.searchpath(step_module, package.path) then
    die(step_module .. " does not load: " .. tostring(prev))
  end
  prev = ok_prev and type(prev) == "table" and prev or {}

  io.stderr:write(string.format("tune-step: %s on %s: generating weights\n", o.config, arch))
  local weights = kimi.generate_weights(cfg, {seed = 1234, dtype = "bf16", device = "cuda"})
  local stack = kimi.build(cfg, weights, {dtype = "bf16", device = "cuda"})

  -- the linear layers by (shape, epilogue), in the order a step first calls them
  local roles, by_id = {}, {}
  do
    local x = kimi.embedding(cfg, 1, {seed = 1234, step = 1, dtype = "bf16", device = "cuda"})
    local orig = nn.Linear.__call
    nn.Linear.__call = function(self, xx, co)
      local epi = co and co.epilogue or nil
      local key = string.format("%dx%d", self.weight:size(1), self.weight:size(2))
      local id = key .. (epi and (" +" .. epi) or "")
      local r = by_id[id]
      if not r then
        -- the first call's options (its prologue and norm weight, its epilogue) and x's width:
        -- what a candidate is checked against with the method's explain
        local call = co and {prologue = co.prologue, norm_weight = co.norm_weight, eps = co.eps,
                             epilogue = co.epilogue} or nil
        r = {id = id, key = key, epilogue = epi, section = epi or "plans", layers = {}, seen = {},
             weight = self.weight, x_width = xx:size(2), call = call}
        by_id[id] = r
        roles[#roles + 1] = r
      end
      if not r.seen[self] then
        r.seen[self] = true
        r.layers[#r.layers + 1] = self
      end
      return orig(self, xx, co)
    end
    local ok, err = pcall(function() stack:forward(x):free() end)
    nn.Linear.__call = orig
    x:free()
    if not ok then die("the step failed: " .. tostring(err)) end
  end

  local results = {plans = {}, silu_mul = {}}
  for _, section in ipairs({"plans", "silu_mul"}) do
    for key, ms in pairs(prev[section] or {}) do
      results[section][key] = {}
      for m, e in pairs(ms) do results[section][key][m] = e end
    end
  end

  local y = k3.empty({16, cfg.hidden_size}, {dtype = "bf16", device = "cuda"})
  local function measure(x)
    local M = x:size(1)
    local g = k3.cuda_graph(function()
      local out = stack:forward(x)
      y:narrow(1, 1, M):copy(out)
      out:free()
    end)
    g:replay(3)
    local us = k3.cuda_time(function() g:replay() end, {iters = o.replays, warmup = 0, device = 0})
    g:free()
    return us
  end

  if o.shapes then
    local have = {}
    for _, r in ipairs(roles) do have[r.key] = true end
    for s in pairs(o.shapes) do
      if not have[s] then
        local keys = {}
        for _, r in ipairs(roles) do keys[#keys + 1] = r.id end
        die(string.format("--shapes: %s is not a linear shape of the %s step (%s)", s, o.config,
                          table.concat(keys, ", ")))
      end
    end
  end

  -- every layer of a role on method m; restore(role) puts back each layer's own method
  local function set_method(role, m)
    for _, lin in ipairs(role.layers) do lin.method = m end
  end
  local function restore(role)
    for i, lin in ipairs(role.layers) do lin.method = role.own[i] end
  end

  local report = {}
  for _, M in ipairs(o.ms) do
    local x = kimi.embedding(cfg, M, {seed = 1234, step = 1, dtype = "bf16", device = "cuda"})
    stack:forward(x):free() -- eager once at this M: every method's first call is behind it
    local start_us = (not o.dry_run) and measure(x) or nil
    if start_us then
      io.stderr:write(string.format("tune-step: M = %d: the step as planned %.1f µs\n", M, start_us))
    end
    for _, role in ipairs(roles) do
      if not o.shapes or o.shapes[role.key] then
        local current = copy_plan(k3.plan_for(role.weight, role.epilogue and {epilogue = role.epilogue} or nil))
        role.own = {}
        for i, lin in ipairs(role.layers) do role.own[i] = lin.method end
        local cur_entry = current[M]
        -- the current skinny config with each prefetch budget, cuBLAS in its place, then the
        -- plan files' configs (an epilogue role also tries the plain plan's: the kernel
        -- declines those it cannot run)
        local cur_cfg = cur_entry and cur_entry.kernel == "skinny" and cur_entry.config or nil
        local all, listed = {}, {}
        for _, c in ipairs(plan_step.prefetch_variants(cur_cfg, o.l2_prefetch)) do
          all[#all + 1] = {kernel = "skinny", config = c}
          listed[plan_step.config_key(c)] = true
        end
        if cur_cfg then all[#all + 1] = {kernel = plan_step.CUBLAS} end
        -- --configs: tried next, in their order (those the kernel declines for the call are
        -- skipped below, as any candidate)
        if cur_cfg then listed[plan_step.config_key(cur_cfg)] = true end
        for _, c in ipairs(o.configs or {}) do
          local k = plan_step.config_key(c)
          if not listed[k] then
            all[#all + 1] = {kernel = "skinny", config = c, given = true}
            listed[k] = true
          end
        end
        for _, c in ipairs(plan_step.candidates(section_plans[role.section], role.key, M, cur_cfg,
                                                role.section ~= "plans" and plain_plans or nil)) do
          if not listed[plan_step.config_key(c)] then all[#all + 1] = {kernel = "skinny", config = c} end
        end
        -- a candidate its kernel takes for this shape and M
        local xm = k3.empty({M, role.x_width}, {dtype = "bf16", device = "cuda"})
        local co = role.call
        local cands = {}
        -- a --configs entry not tried says why (declined, or past --max-candidates)
        local function untried(e, why)
          if e.given then
            io.stderr:write(string.format("tune-step: M = %d, %s: --configs %s not tried: %s\n", M,
                                          role.id, short(e.config), why))
          end
        end
        for _, e in ipairs(all) do
          if #cands >= o.max_candidates then
            untried(e, "past --max-candidates " .. o.max_candidates)
          else
            local plan = copy_plan(current)
            plan[M] = {kernel = e.kernel, config = e.config}
            local want = e.kernel == "skinny" and "cuda.linear.skinny" or e.kernel
            local okm, m = pcall(k3.method.low_latency, plan, {static_weights = true})
            if okm then
              local r = m:explain(xm, role.weight, nil, co)
              local ours, why = r.chosen == want, "the plan's kernel is not chosen (" .. tostring(r.chosen) .. ")"
              for _, d in ipairs(r.declined or {}) do
                if d.kernel == want then ours, why = false, tostring(d.reason) end
              end
              if ours then cands[#cands + 1] = {entry = plan[M], method = m} else m:free(); untried(e, why) end
            else
              untried(e, tostring(m))
            end
          end
        end
        xm:free()
        io.stderr:write(string.format("tune-step: M = %d, %s (%d layers): now %s; %d candidates\n", M,
          role.id, #role.layers, cur_entry and short_entry(cur_entry) or "the default method", #cands))
        local best
        for ci, c in ipairs(cands) do
          if not o.dry_run then
            local pairs_ = {}
            -- one eager step first: what the candidate's method sets up at its first call
            -- (a split-K workspace) is then in place before any capture
            set_method(role, c.method)
            local okp, perr = pcall(function()
              stack:forward(x):free()
              -- the order alternates (base first in odd passes, the candidate first in even
              -- ones), so a drift of the clocks over a pass does not favour either
              for pass = 1, o.passes do
                local b, t
                if pass % 2 == 1 then
                  restore(role)
                  b = measure(x)
                end
                set_method(role, c.method)
                t = measure(x)
                if pass % 2 == 0 then
                  restore(role)
                  b = measure(x)
                end
                pairs_[#pairs_ + 1] = {base = b, cand = t}
              end
            end)
            restore(role)
            if not okp then
              die(string.format("M = %d, %s, candidate %s: %s", M, role.id, short_entry(c.entry), tostring(perr)))
            end
            local keep, gain = plan_step.decide(pairs_, o.min_gain / 100)
            local bs, cs = 0, 0
            for _, p in ipairs(pairs_) do bs, cs = bs + p.base, cs + p.cand end
            c.base_us, c.us, c.gain = bs / #pairs_, cs / #pairs_, gain
            io.stderr:write(string.format("tune-step:   (%d/%d) %-26s %8.1f µs against %8.1f: %+.2f%% at worst%s\n",
              ci, #cands, short_entry(c.entry), c.us, c.base_us, 100 * gain, keep and ", kept" or ""))
            if keep and (not best or gain > best.gain) then best = c end
          else
            io.stderr:write(string.format("tune-step:   (%d/%d) %s\n", ci, #cands, short_entry(c.entry)))
          end
        end
        for _, c in ipairs(cands) do
          if c ~= best then c.method:free() end
        end
        if best then
          set_method(role, best.method)
          for i = 1, #role.layers do role.own[i] = best.method end
          local sec = results[role.section]
          sec[role.key] = sec[role.key] or {}
          sec[role.key][M] = {kernel = best.entry.kernel, config = best.entry.config, step_us = best.us,
                              base_step_us = best.base_us}
          report[#report + 1] = string.format("M = %2d  %-22s %-26s -> %-26s %8.1f -> %8.1f µs",
            M, role.id, cur_entry and short_entry(cur_entry) or "default", short_entry(best.entry),
            best.base_us, best.us)
        end
      end
    end
    if start_us then
      local end_us = measure(x)
      report[#report + 1] = string.format("M = %2d  the step: %.1f µs as planned, %.1f µs with the entries kept (same run)",
                                          M, start_us, end_us)
    end
    x:free()
  end
  y:free()

  print(string.format("tune-step: %s on %s, M = %s", o.config, arch, table.concat(o.ms, ",")))
  for _, l in ipairs(report) do print(l) end
  if o.dry_run then return end
  local path = o.out or (out_dir(o) .. "/" .. arch .. "_step.lua")
  -- The runs whose entries this file may still carry: the file before's own run first, then
  -- the ones it listed, the twelve most recent (an entry older than those goes unnamed).
  local earlier = {}
  if type(prev.method) == "string" then
    earlier[1] = string.format("%s %s: %s", tostring(prev.date), tostring(prev.commit), prev.method)
  end
  for _, e in ipairs(type(prev.earlier) == "table" and prev.earlier or {}) do
    if #earlier < 12 and type(e) == "string" then earlier[#earlier + 1] = e end
  end
  local text = plan_step.render({
    arch = arch, machine = require("k3.bench.util").device_name(), earlier = earlier,
    date = os.date("!%Y-%m-%d %H:%M UTC"), commit = require("k3.bench.summary").commit("."),
    method = string.format("scripts/tune-step --m %s --l2-prefetch %s --max-candidates %d%s%s: %s, the step captured with k3.cuda_graph, median of %d replays after 3, %d passes alternating with the step as it stood; kept where >= %.2f%% faster in every pass",
                           table.concat(o.ms, ","), table.concat(o.l2_prefetch, ","), o.max_candidates,
                           o.shapes_text and (" --shapes " .. o.shapes_text) or "",
                           o.configs and string.format(' --configs "%s"', table.concat(o.configs_text, ",")) or "",
                           o.config, o.replays, o.passes, o.min_gain),
    plans = results.plans, silu_mul = results.silu_mul})
  local f, err = io.open(path, "w")
  if not f then die("cannot write " .. path .. ": " .. tostring(err)) end
  local wok, werr = f:write(text)
  f:close()
  if not wok then die("cannot write " .. path .. ": " .. tostring(werr)) end
  print("tune-step: wrote " .. path)
end

main(arg)
