-- Creates, views, copies, prints and frees tensors, for `valgrind --leak-check=full`
-- (see README: "Checking for leaks"). Ends with a full collection so every handle is gone.
local k3 = require "k3"
for i = 1, 50 do
  local a = k3.randn({17, 33}, {seed = i, dtype = "bf16"})
  local v = a:narrow(2, 2, 30):t()
  local c = v:contiguous():to("f64")
  local d = k3.zeros({30, 17}, {dtype = "f16"}):copy(v)
  local e = (c + c) * 2 - c
  local s = tostring(e) .. tostring(d:select(1, 3))
  local t <close> = k3.ones({4, 4})
  local x = k3.tensor({{1, 2}, {3, 4}}):expand({3, 2, 2})
  assert(#s > 0 and x:numel() == 12 and t:numel() == 16)
  if i % 2 == 0 then a:free() end
  pcall(k3.empty, {-1})
  pcall(function() return a + k3.zeros({1}) end)
end
collectgarbage()
collectgarbage()
print("leak_check: done")
