-- sm90.lua: measured cuda.linear.skinny plans for sm90, written by scripts/autotune
-- (tools/autotune.cu); regenerate on the machine rather than editing by hand.
-- An entry exists only where the skinny kernel beat cuBLAS by >= 5%.
-- Not measured yet: no plans, so every call runs the default method (cuBLAS).
return {
  arch = "sm90",
  machine = "not measured",
  date = "",
  method = "none yet: run scripts/autotune on an H200",
  plans = {
  },
}
