-- Frame 2 keeps growing a Lua table past the host's Lua memory cap; frame 4 asks k3 for a
-- tensor larger than the host's tensor cap. Each of those frames fails on its own; the
-- others are normal decode steps, and the memory of the failed frames is given back.
local k3 = require "k3"
-- decode.lua sits beside this script.
local decode = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "decode.lua")

local frame = 0

-- Frames 2 and 4 fail on purpose: the host exits 0 when the caps stop just those two. With
-- --tensor-cap 0 (no cap) frame 4's terabyte is refused by malloc: a plain k3 error.
expected_failures = {[2] = "memory", [4] = host.tensor_cap > 0 and "memory" or "error"}

local function hoard()
  local t = {}
  for i = 1, math.maxinteger do t[i] = string.rep("x", 64) .. i end
end

function on_frame(dt)
  frame = frame + 1
  if frame == 2 then hoard() end
  if frame == 4 then
    local cap = host.tensor_cap > 0 and host.tensor_cap or (1 << 40)
    local big = k3.empty({cap // 4 + 1}, {dtype = "f32"})
    big:fill(0)
  end
  return decode.step(frame)
end
