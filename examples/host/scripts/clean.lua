-- A well-behaved frame script: each frame runs one decode step (M = 1..4 tokens, cycling)
-- and returns its output as exact text, which the host folds into its digest.
local decode = dofile(host.root .. "/examples/host/scripts/decode.lua")

local frame = 0
function on_frame(dt)
  frame = frame + 1
  return decode.step(frame)
end
