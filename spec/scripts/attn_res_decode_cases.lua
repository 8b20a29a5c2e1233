-- spec/scripts/attn_res_decode_cases.lua — a fixed set of cuda.attn_res.decode calls on seeded
-- inputs, for comparing two builds or two launch settings of the kernel bit for bit (the
-- settings are read once per process, so one side runs in a child: spec/scripts/
-- attn_res_decode_split.lua). Returns run(k3) -> names, results: the case names in order and
-- {name = tensor} with each case's output, its prefix after the call and, where the call
-- writes a block, the written slot (CPU tensors, the call's dtype). The cases: num_blocks
-- 0..16 with and without a delta and with a fused seal, bf16 and f16, a written slot inside
-- num_blocks, no output norm, f32 weights, hidden 64 and 8192, rows near 1e20 and 1e-25 with
-- eps = 0 (the rescaled sums), and the seal-then-read sequence under the static_weights /
-- static_blocks contract.
local K = "cuda.attn_res.decode"

return function(k3)
  local names, results = {}, {}
  local function keep(name, t)
    names[#names + 1] = name
    results[name] = t:to("cpu")
  end
  local function randn(shape, dt, seed, scale, shift)
    local t = k3.randn(shape, {dtype = "f32", seed = seed, device = "cuda"})
    if scale then t = t * scale end
    if shift then t = t + shift end
    return t:to(dt)
  end
  -- one call on fresh inputs: T tokens, S slots, hidden Hd; o: dtype, wdtype, num_blocks,
  -- write_block, delta (false: none), onorm (false: none), scale (of prefix and blocks), eps
  local function case(name, T, S, Hd, o)
    local dt, wdt, seed = o.dtype or "bf16", o.wdtype or o.dtype or "bf16", o.seed
    local a = {
      prefix = randn({T, Hd}, dt, seed + 1, o.scale),
      blocks = randn({T, S, Hd}, dt, seed + 2, o.scale),
      delta = o.delta ~= false and randn({T, Hd}, dt, seed + 3) or nil,
      num_blocks = o.num_blocks, write_block = o.write_block,
      norm_weight = randn({Hd}, wdt, seed + 4, 0.5, 1),
      qk_weight = randn({Hd}, wdt, seed + 5, 0.1),
      output_norm_weight = o.onorm ~= false and randn({Hd}, wdt, seed + 6, 0.1, 1) or nil,
      eps = o.eps, output_eps = o.eps, kernel = K,
    }
    keep(name .. " out", k3.attn_res(a))
    keep(name .. " prefix", a.prefix)
    if o.write_block then keep(name .. " slot", a.blocks:select(2, o.write_block)) end
  end

  for _, dt in ipairs({"bf16", "f16"}) do
    for nb = 0, 16 do
      local T = ({1, 3, 16})[nb % 3 + 1]
      local s = 1000 + 100 * nb + (dt == "f16" and 50 or 0)
      case(string.format("%s nb=%d delta", dt, nb), T, 17, 7168, {dtype = dt, num_blocks = nb, seed = s})
      case(string.format("%s nb=%d no delta", dt, nb), T, 17, 7168,
           {dtype = dt, num_blocks = nb, delta = false, seed = s + 10})
      case(string.format("%s nb=%d seal", dt, nb), T, 17, 7168,
           {dtype = dt, num_blocks = nb, write_block = nb + 1, seed = s + 20})
    end
  end
  case("slot 3 inside num_blocks 6", 2, 8, 7168, {num_blocks = 6, write_block = 3, seed = 3000})
  case("no output norm", 2, 8, 7168, {num_blocks = 6, onorm = false, seed = 3010})
  case("f32 weights", 16, 8, 7168, {num_blocks = 8, wdtype = "f32", seed = 3020})
  case("hidden 64", 2, 4, 64, {num_blocks = 4, seed = 3030})
  case("hidden 8192", 16, 8, 8192, {num_blocks = 8, seed = 3040})
  for i, scale in ipairs({1e20, 1e-25}) do
    case(string.format("scale %g eps 0", scale), 3, 8, 7168,
         {num_blocks = 5, delta = false, scale = scale, eps = 0, seed = 3050 + i})
  end

  -- seal then read back to back, slots sealed before the previous call static
  local T, S, Hd = 4, 8, 7168
  local prefix, blocks = randn({T, Hd}, "bf16", 4001), randn({T, S, Hd}, "bf16", 4002)
  local w = {norm_weight = randn({Hd}, "bf16", 4004, 0.5, 1), qk_weight = randn({Hd}, "bf16", 4005, 0.1),
             output_norm_weight = randn({Hd}, "bf16", 4006, 0.1, 1)}
  local delta = randn({T, Hd}, "bf16", 4003)
  k3.synchronize()
  for i = 1, S do
    local function call(nb, wb)
      return k3.attn_res{prefix = prefix, delta = delta, blocks = blocks, num_blocks = nb,
                         write_block = wb, norm_weight = w.norm_weight, qk_weight = w.qk_weight,
                         output_norm_weight = w.output_norm_weight, kernel = K,
                         static_weights = true, static_blocks = i - 1}
    end
    local sealed = call(i - 1, i)
    keep(string.format("static seal %d out", i), sealed)
    delta = call(i, nil)
    keep(string.format("static read %d out", i), delta)
  end
  keep("static prefix", prefix)
  keep("static blocks", blocks)
  return names, results
end
