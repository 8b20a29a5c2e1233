-- k3.plan_options: the check of a plan lookup's options, shared by k3.plan_for and
-- nn.default_method so both name their own argument alike.
--   check(opts, fname, argn[, level]) -> epilogue (nil or "silu_mul"); raises "bad argument
--   #<argn> to '<fname>' (...)" for a non-table, an unknown option name or another epilogue,
--   at `level` as error() counts it from this function (default 3: the caller of the function
--   that called the check).
return function(opts, fname, argn, level)
  level = level or 3
  if opts == nil then return nil end
  if type(opts) ~= "table" then
    error(string.format("bad argument #%d to '%s' (table or nil expected, got %s)", argn, fname, type(opts)), level)
  end
  for k in pairs(opts) do
    if k ~= "epilogue" then
      error(string.format("bad argument #%d to '%s' (unknown option '%s' (expected epilogue))",
                          argn, fname, tostring(k)), level)
    end
  end
  local e = opts.epilogue
  if e ~= nil and e ~= "silu_mul" then
    error(string.format("bad argument #%d to '%s' (field 'epilogue' must be \"silu_mul\" or nil; got %s)",
                        argn, fname, type(e) == "string" and string.format("%q", e) or type(e)), level)
  end
  return e
end
