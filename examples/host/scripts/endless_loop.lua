-- Frame 2 never ends; frame 4 loops forever inside pcall, trying to swallow the budget error.
-- The instruction budget stops just those two frames; the others are normal decode steps.
-- decode.lua sits beside this script.
local decode = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "decode.lua")

local frame = 0

-- Frames 2 and 4 fail on purpose: the host exits 0 when the budget stops just those two.
expected_failures = {[2] = "budget", [4] = "budget"}

local function spin()
  local n = 0
  while true do n = n + 1 end
end

function on_frame(dt)
  frame = frame + 1
  if frame == 2 then spin() end
  if frame == 4 then
    while true do pcall(spin) end
  end
  return decode.step(frame)
end
