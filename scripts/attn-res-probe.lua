-- scripts/k3 scripts/attn-res-probe.lua [label] — the decode-size AttnRes reads (H = 7168,
-- 16 block slots, bf16, eps 1e-5) timed in a CUDA graph on each CUDA kernel that serves them,
-- one line per (T, num_blocks, read, kernel): µs per call, and the kernel's largest relative
-- difference from cuda.attn_res.generic on the first input set (out and written-back prefix).
-- Reads: "full" (delta and output norm: the common read), "seal" (the same plus a block write
-- into slot num_blocks + 1), "nodelta" (output norm, no delta). Each call's delta is the
-- previous call's output (as in scripts/bench attn_res); the inputs rotate over enough sets to
-- pass 200 MB. The decode kernel runs twice: with nothing static, and with static_weights and
-- static_blocks = num_blocks (its PDL contract: the weights and sealed blocks are loaded before
-- it waits for the previous kernel). The launch variables (K3_ATTN_RES_DECODE_CTAS,
-- K3_ATTN_RES_PDL, read when the backend loads) pick the shape: run it once per setting; the
-- label (default: their values) starts every line. K3_PROBE_OUT, when set, names a CSV file
-- the lines are appended to.
local k3 = require "k3"
local H, S = 7168, 16
local label = arg[1] or string.format("ctas=%s pdl=%s", os.getenv("K3_ATTN_RES_DECODE_CTAS") or "auto",
                                      os.getenv("K3_ATTN_RES_PDL") or "1")
local csv = os.getenv("K3_PROBE_OUT")
local TS = {1, 4, 16}
local NBS = {1, 4, 8, 15}
local READS = {"full", "seal", "nodelta"}

local rel_diff = require("k3.bench.util").rel_diff

local fh = csv and assert(io.open(csv, "a"))
local function emit(fmt, ...)
  local line = string.format(fmt, ...)
  print(line)
  if fh then fh:write(line, "\n") end
end

for _, T in ipairs(TS) do
  local per = 2 * H * T * (4 + 8)
  local n = math.max(2, math.min(2048, math.ceil(200e6 / per)))
  local P = k3.randn({n * T, H}, {device = "cuda", dtype = "bf16", seed = 1})
  local B = k3.randn({n * T, S, H}, {device = "cuda", dtype = "bf16", seed = 3})
  local O = k3.randn({n * T, H}, {device = "cuda", dtype = "bf16", seed = 2})
  local NW = (k3.randn({H}, {dtype = "bf16", seed = 4}) * 0.5 + 1):to("cuda")
  local QW = (k3.randn({H}, {dtype = "bf16", seed = 5}) * 0.5):to("cuda")
  local OW = (k3.randn({H}, {dtype = "bf16", seed = 6}) * 0.5 + 1):to("cuda")
  for _, nb in ipairs(NBS) do
    for _, read in ipairs(READS) do
      local function args(c, kname, static)
        local r, rp = (c - 1) * T + 1, ((c - 2) % n) * T + 1
        local a = {prefix = P:narrow(1, r, T), blocks = B:narrow(1, r, T), num_blocks = nb,
                   norm_weight = NW, qk_weight = QW, output_norm_weight = OW, eps = 1e-5,
                   output_eps = 1e-5, out = O:narrow(1, r, T), kernel = kname}
        if read ~= "nodelta" then a.delta = O:narrow(1, rp, T) end
        if read == "seal" then a.write_block = nb + 1 end
        if static then a.static_weights, a.static_blocks = true, nb end
        return a
      end
      local runs = {{"decode", "cuda.attn_res.decode", false},
                    {"decode+static", "cuda.attn_res.decode", true}}
      -- The reference output on set 1 (prefix restored around each call).
      local p0 = P:narrow(1, 1, T):clone()
      local b0 = B:narrow(1, 1, T):clone()
      local function once(kname, static)
        P:narrow(1, 1, T):copy(p0)
        B:narrow(1, 1, T):copy(b0)
        local a = args(1, kname, static)
        a.out = nil
        local y = k3.attn_res(a)
        return y, P:narrow(1, 1, T):clone()
      end
      for _, run in ipairs(runs) do
        local name, kname, static = run[1], run[2], run[3]
        local ok, e = pcall(k3.explain, "attn_res", (function()
          local a = args(1, nil, static)
          a.kernel = nil
          return a
        end)())
        local served = pcall(function()
          local saved = k3.policy
          local pol = {}
          for k, v in pairs(saved) do pol[k] = v end
          pol.attn_res = {kname}
          k3.set_policy(pol)
          local okx, ex = pcall(k3.explain, "attn_res", (function() local a = args(1, nil, static); return a end)())
          k3.set_policy(saved)
          assert(okx and ex.chosen == kname)
        end)
        if served then
          -- the reference now: an earlier run's timing rewrote every set's out, and so the
          -- delta of set 1 (set n's out)
          local yg, pg = once("cuda.attn_res.generic", false)
          local ya, pa = once(kname, static)
          local diff = math.max(rel_diff(ya, yg), rel_diff(pa, pg))
          for _, x in ipairs({yg, pg, ya, pa}) do x:free() end
          P:narrow(1, 1, T):copy(p0)
          B:narrow(1, 1, T):copy(b0)
          local calls = {}
          for c = 1, n do calls[c] = args(c, kname, static) end
          local us, st = k3.cuda_time(function(i) k3.attn_res(calls[(i - 1) % n + 1]) end,
                                      {graph = true, calls = n, iters = 20, warmup = 2})
          emit("%s,T=%d,nb=%d,%s,%s,%.2f,min %.2f,diff %.1e,default %s", label, T, nb, read, name,
               us, st.min, diff, ok and e.chosen or "?")
        end
        P:narrow(1, 1, T):copy(p0)
        B:narrow(1, 1, T):copy(b0)
      end
      p0:free()
      b0:free()
    end
  end
  for _, t in ipairs({P, B, O, NW, QW, OW}) do t:free() end
end
if fh then fh:close() end
