-- The built-in dispatch policy, as the core has it (made from the ranks of lib/k3_kernels.def):
-- per op the candidate kernels in the order dispatch tries them (the first whose supports()
-- accepts the call runs; unregistered kernels and kernels for another device are skipped with a
-- recorded reason), batch_invariant's lists, which replace an op's list in batch-invariant mode,
-- and on_layout_mismatch = "error": a layout a kernel needs but does not get (padded rows for
-- the decode AttnRes kernel) raises that kernel's layout error ("fallback" makes it a decline).
-- k3.set_policy(tbl) replaces any of them.
return require("k3.core").default_policy()
