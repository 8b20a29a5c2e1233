-- spec/scripts/attn_res_decode_split.lua FILE — run by spec/cuda_attn_res_spec.lua in a child
-- process with K3_ATTN_RES_DECODE_SPLIT=1 (read once per process): the calls of
-- spec/scripts/attn_res_decode_cases.lua, their results saved to FILE (safetensors, one
-- tensor a result) for the parent to compare with the same calls under its own setting.
-- Prints "attn_res decode cases: N results" last.
local k3 = require "k3"
local path = assert(arg[1], "usage: attn_res_decode_split.lua FILE")
local run = dofile(debug.getinfo(1, "S").source:sub(2):gsub("[^/]*$", "") .. "attn_res_decode_cases.lua")
local names, results = run(k3)
k3.save_safetensors(path, results)
print(string.format("attn_res decode cases: %d results", #names))
