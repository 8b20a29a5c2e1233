-- The built-in dispatch policy: per op, the candidate kernels in the order dispatch tries
-- them (the first whose supports() accepts the call runs; unregistered kernels and kernels
-- for another device are skipped with a recorded reason), and what a layout mismatch does.
-- lib/dispatch.c compiles the same lists in as the default; k3.set_policy(tbl) replaces them.
-- Each list ends in a CPU kernel that accepts every valid call: cpu.linear.reference after
-- cpu.linear.blas, so K3_DISABLE_KERNELS=cpu.linear.blas still leaves linear a kernel (attn_res,
-- rms_norm and silu_mul have one CPU kernel each, the reference).
return {
  linear = {"cuda.linear.cublas", "cpu.linear.blas", "cpu.linear.reference"},
  attn_res = {"cuda.attn_res.packed", "cuda.attn_res.decode", "cuda.attn_res.stream",
              "cuda.attn_res.generic", "cpu.attn_res.reference"},
  rms_norm = {"cuda.rms_norm.generic", "cpu.rms_norm.reference"},
  silu_mul = {"cuda.silu_mul.generic", "cpu.silu_mul.reference"},
  -- "error": a layout a kernel needs but does not get (padded rows for the packed AttnRes
  -- kernel) raises that kernel's layout error; "fallback": it is a decline like any other.
  on_layout_mismatch = "error",
}
