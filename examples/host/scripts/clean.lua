-- A well-behaved frame script: each frame runs one decode step (M = 1..4 tokens, cycling)
-- and returns its output as exact text, which the host folds into its digest.
-- decode.lua sits beside this script.
local decode = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "decode.lua")

local frame = 0
function on_frame(dt)
  frame = frame + 1
  return decode.step(frame)
end
