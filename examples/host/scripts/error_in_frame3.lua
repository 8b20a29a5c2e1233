-- Frame 3 raises an error from inside a nested call; every other frame is a normal decode
-- step. The host reports frame 3 with a traceback and runs the remaining frames.
-- decode.lua sits beside this script.
local decode = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "decode.lua")

local frame = 0

-- Frame 3 fails on purpose: the host exits 0 when it fails (and only it), 3 otherwise.
expected_failures = {[3] = "error"}

local function check_frame(n)
  if n == 3 then error("frame 3 went wrong on purpose") end
end

function on_frame(dt)
  frame = frame + 1
  check_frame(frame)
  return decode.step(frame)
end
