-- Frame 2 keeps growing a Lua table past the host's Lua memory cap; frame 4 asks k3 for a
-- tensor larger than the host's tensor cap. Each of those frames fails on its own; the
-- others are normal decode steps, and the memory of the failed frames is given back.
local k3 = require "k3"
-- decode.lua sits beside this script.
local decode = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "decode.lua")

local frame = 0

-- More bytes than any address space holds: a request that fails whatever the overcommit.
local IMPOSSIBLE = 1 << 60

-- Frames 2 and 4 fail on purpose: the host exits 0 when the caps stop just those two. The
-- expectations follow the host's options (its `host` table), so every option combination
-- keeps that contract. With --mem-cap 0 (no Lua cap) there is no cap to hoard past, and
-- hoarding would run until the instruction budget, or with --budget 0 until the machine's
-- memory, ran out: frame 2 asks string.rep for IMPOSSIBLE bytes instead, which Lua refuses
-- with a plain error ("resulting string too large"). With --tensor-cap 0 (no tensor cap)
-- frame 4's IMPOSSIBLE bytes are refused by malloc: a plain k3 error.
expected_failures = {[2] = host.mem_cap > 0 and "memory" or "error",
                     [4] = host.tensor_cap > 0 and "memory" or "error"}

-- Grows by 64 KiB strings, so even a large cap is reached in a few thousand iterations, well
-- inside the instruction budget. The strings are made by concatenation, which allocates
-- through Lua's collector: a refused growth gets its emergency collection and retry.
local function hoard()
  if host.mem_cap == 0 then return string.rep("x", IMPOSSIBLE) end
  local chunk = "x"
  for _ = 1, 16 do chunk = chunk .. chunk end
  local t = {}
  for i = 1, math.maxinteger do t[i] = chunk .. i end
end

function on_frame(dt)
  frame = frame + 1
  if frame == 2 then hoard() end
  if frame == 4 then
    local bytes = host.tensor_cap > 0 and host.tensor_cap or IMPOSSIBLE
    local big = k3.empty({bytes // 4 + 1}, {dtype = "f32"})
    big:fill(0)
  end
  return decode.step(frame)
end
