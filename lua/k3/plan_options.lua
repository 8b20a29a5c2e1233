-- k3.plan_options: the check of a plan lookup's options, shared by k3.plan_for and
-- nn.default_method so both name their own argument alike.
--   check(opts, fname, argn) -> epilogue (nil or "silu_mul"); raises "bad argument #<argn> to
--   '<fname>' (...)" for a non-table, an unknown option name or another epilogue.
return function(opts, fname, argn)
  if opts == nil then return nil end
  if type(opts) ~= "table" then
    error(string.format("bad argument #%d to '%s' (table or nil expected, got %s)", argn, fname, type(opts)), 3)
  end
  for k in pairs(opts) do
    if k ~= "epilogue" then
      error(string.format("bad argument #%d to '%s' (unknown option '%s'; the option is epilogue)",
                          argn, fname, tostring(k)), 3)
    end
  end
  local e = opts.epilogue
  if e ~= nil and e ~= "silu_mul" then
    error(string.format("bad argument #%d to '%s' (field 'epilogue' must be \"silu_mul\" or nil; got %s)",
                        argn, fname, type(e) == "string" and string.format("%q", e) or type(e)), 3)
  end
  return e
end
