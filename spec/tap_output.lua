-- spec/tap_output.lua — busted output in TAP (scripts/run-specs runs busted with it). Busted's
-- own TAP handler prints a skipped test as "ok 3 - # SKIP <reason>", losing which test it was;
-- here every line keeps the test's full name, with the reason as the TAP SKIP directive:
-- "ok 3 - cuda tensors #gpu copies host to device # SKIP no CUDA device: ...". Failures print
-- the source line and the message as "#" comments, as busted's handler does.
return function(options)
  local busted = require "busted"
  local handler = require("busted.outputHandlers.base")()
  local n = 0

  local function line(s)
    io.write(s, "\n")
    io.flush()
  end

  local function text(v)
    if v == nil then return "Nil error" end
    if type(v) == "string" then return v end
    return require("pl.pretty").write(v)
  end

  local function failed(t)
    line(string.format("not ok %d - %s", n, t.name))
    local tr = t.element and t.element.trace
    if tr and tr.short_src then line("# " .. tr.short_src .. " @ " .. tostring(tr.currentline)) end
    if t.randomseed then line("# Random seed: " .. t.randomseed) end
    line("# Failure message: " .. text(t.message):gsub("\n", "\n# "))
    if options.verbose and t.trace and t.trace.traceback then
      line("# " .. t.trace.traceback:gsub("^\n", "", 1):gsub("\n", "\n# "))
    end
  end

  -- The name and reason of a pending test: pending("why") inside an `it` keeps the test's
  -- name and says why (without busted's "file:line: " prefix); a `pending` at describe level
  -- is an element of its own, named by its reason, under the describe's name.
  local function skipped(element, parent, t)
    if element.descriptor == "pending" then
      return handler.getFullName(parent), element.name
    end
    local reason = t and t.message
    if type(reason) == "string" then reason = reason:gsub("^[^\n]-:%d+: ", "", 1) end
    return handler.getFullName(element), reason
  end

  handler.suiteReset = function()
    n = 0
    return nil, true
  end

  handler.suiteEnd = function()
    line("1.." .. n)
    return nil, true
  end

  handler.testEnd = function(element, parent, status)
    n = n + 1
    if status == "success" then
      line(string.format("ok %d - %s", n, handler.getFullName(element)))
    elseif status == "pending" then
      local name, reason = skipped(element, parent, handler.pendings[#handler.pendings])
      line(string.format("ok %d - %s # SKIP%s", n, name, reason and reason ~= "" and (" " .. reason) or ""))
    elseif status == "failure" then
      failed(handler.failures[#handler.failures])
    else
      failed(handler.errors[#handler.errors])
    end
    return nil, true
  end

  handler.error = function(element)
    if element.descriptor ~= "it" then
      n = n + 1
      failed(handler.errors[#handler.errors])
    end
    return nil, true
  end

  busted.subscribe({"suite", "reset"}, handler.suiteReset)
  busted.subscribe({"suite", "end"}, handler.suiteEnd)
  busted.subscribe({"test", "end"}, handler.testEnd, {predicate = handler.cancelOnPending})
  busted.subscribe({"error"}, handler.error)
  return handler
end
