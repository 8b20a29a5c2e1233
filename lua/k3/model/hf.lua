-- k3.model.hf: checkpoints in the Hugging Face layout for the Kimi-K3 stack
-- (lua/k3/model/kimi_k3.lua). Maps Hugging Face (DeepSeek-V3-style) tensor names to the stack's,
-- joins the projections the stack runs as one GEMM, and dequantizes block-scaled FP8 weights.
--
--   Hugging Face name (per layer model.layers.<i>.)       the stack's weight
--   mlp.gate_proj.weight [I, H] + mlp.up_proj.weight [I, H]  mlp.gate_up_proj.weight [2I, H]
--                                                        (gate rows first: silu_mul gates with
--                                                         the first half)
--   self_attn.q_a_proj.weight [q_lora, H]
--     + self_attn.kv_a_proj_with_mqa.weight [kv_lora + rope, H]
--                                                        self_attn.qkv_a_proj.weight
--   input_layernorm, post_attention_layernorm, self_attn.q_a_layernorm, self_attn.q_b_proj,
--   self_attn.o_proj, mlp.down_proj (.weight)            the same names
--   attn_res.norm.weight, attn_res.proj.weight           the AttnRes read before attention
--   mlp_res.norm.weight, mlp_res.proj.weight             the AttnRes read before the MLP
--   model.final_res.norm.weight, model.final_res.proj.weight, model.norm.weight
--                                                        the final read and the model norm
-- Names the stack has no use for (embed_tokens, lm_head, kv_a_layernorm, kv_b_proj, ...) are not
-- read. A name already in the stack's form loads as it is (a checkpoint k3 saved itself).
local k3 = require "k3"
local A = require "k3.args"

local M = {}

-- The stack's per-layer names that a Hugging Face checkpoint holds as two tensors, and the
-- sources in the order they are stacked along dim 1.
M.joined = {
  ["mlp.gate_up_proj.weight"] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"},
  ["self_attn.qkv_a_proj.weight"] = {"self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"},
}

-- Per-layer names that keep their name, and the model-level ones.
M.same = {"attn_res.norm.weight", "attn_res.proj.weight", "input_layernorm.weight",
          "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight", "self_attn.o_proj.weight",
          "mlp_res.norm.weight", "mlp_res.proj.weight", "post_attention_layernorm.weight",
          "mlp.down_proj.weight"}
M.model = {"model.final_res.norm.weight", "model.final_res.proj.weight", "model.norm.weight"}

-- The block of the DeepSeek-V3 FP8 convention: weight [N, K] in F8_E4M3 with
-- <name>_scale_inv [ceil(N / 128), ceil(K / 128)] in F32, w = f8 * scale_inv[i // 128][j // 128].
M.block = 128

local FP8 = {F8_E4M3 = true, F8_E5M2 = true}
local WEIGHT_DTYPES = {BF16 = true, F16 = true, F32 = true, F64 = true, F8_E4M3 = true, F8_E5M2 = true}

--- hf.dequantize(w, scale_inv, opts) -> tensor [N, K]: w (any float dtype, the FP8 codes' exact
--- values) times its block scales scale_inv [ceil(N / b), ceil(K / b)] (b = opts.block, default
--- 128): out[i][j] = w[i][j] * scale_inv[ceil(i / b)][ceil(j / b)] (1-based), computed in f64
--- (an FP8 value times an f32 scale is exact there) and rounded once to opts.dtype (default
--- "bf16"). CPU tensors; raises naming both shapes when the scales do not cover w.
function M.dequantize(w, scale_inv, opts)
  opts = A.options(opts, "hf.dequantize", {"block", "dtype"}, 3)
  local b, dtype = opts.block or M.block, opts.dtype or "bf16"
  if w:dim() ~= 2 or scale_inv:dim() ~= 2 then
    error(string.format("hf.dequantize: weight and scales must be 2-D; got %d-D and %d-D",
                        w:dim(), scale_inv:dim()), 2)
  end
  local N, K = w:size(1), w:size(2)
  local nb, kb = (N + b - 1) // b, (K + b - 1) // b
  if scale_inv:size(1) ~= nb or scale_inv:size(2) ~= kb then
    error(string.format("hf.dequantize: weight [%d, %d] in %dx%d blocks needs scales [%d, %d]; got [%d, %d]",
                        N, K, b, b, nb, kb, scale_inv:size(1), scale_inv:size(2)), 2)
  end
  local w64 = w:to("f64")
  local s64 = scale_inv:to("f64")
  local out = k3.empty({N, K}, {dtype = "f64"})
  for bi = 1, nb do
    local r = math.min(b, N - (bi - 1) * b)
    -- row bi of the scales, each repeated b times along K, cut to K, for r rows
    local srow = s64:select(1, bi):view({1, kb, 1}):expand({r, kb, b}):contiguous()
    local s = srow:view({r, kb * b}):narrow(2, 1, K)
    local p = w64:narrow(1, (bi - 1) * b + 1, r) * s
    out:narrow(1, (bi - 1) * b + 1, r):copy(p)
    p:free()
    srow:free()
  end
  w64:free()
  s64:free()
  local res = out:to(dtype)
  out:free()
  return res
end

-- The sources of the stack weights that `names` (a set of tensor names) provides: {stack name
-- = {source, ...}}, one source when the name is kept, both parts of a joined weight when either
-- is there (a missing part is the loader's error; a missing weight is kimi_k3.build's).
local function plan(names)
  local layers = {}
  for n in pairs(names) do
    local i = n:match("^model%.layers%.(%d+)%.")
    if i then layers[tonumber(i)] = true end
  end
  local p = {}
  for i in pairs(layers) do
    local pre = "model.layers." .. i .. "."
    for _, n in ipairs(M.same) do
      if names[pre .. n] then p[pre .. n] = {pre .. n} end
    end
    for target, srcs in pairs(M.joined) do
      if names[pre .. target] then
        p[pre .. target] = {pre .. target}
      elseif names[pre .. srcs[1]] or names[pre .. srcs[2]] then
        p[pre .. target] = {pre .. srcs[1], pre .. srcs[2]}
      end
    end
  end
  for _, n in ipairs(M.model) do
    if names[n] then p[n] = {n} end
  end
  return p
end

--- hf.load(path, opts) -> {stack name = tensor}: the Kimi-K3 stack's weights from a checkpoint
--- (path: a .safetensors file, a directory with model.safetensors.index.json, or the index;
--- see k3.load_safetensors). Hugging Face names are mapped and joined as the table at the top of
--- this file says; only the tensors the stack uses are read. FP8 weights are dequantized with
--- their <name>_scale_inv block scales (hf.dequantize) and refused without them. opts: dtype
--- (default: the file's; FP8 weights become bf16) and device (default "cpu"). Raises naming the
--- tensor for a missing source, an FP8 weight without scales, or a dtype that is not a float.
function M.load(path, opts)
  opts = A.options(opts, "hf.load", {"dtype", "device"}, 2)
  local device = opts.device or "cpu"
  local info = k3.safetensors_info(path)
  local have = {}
  for n in pairs(info.tensors) do have[n] = true end
  local p = plan(have)
  local targets = {}
  for t in pairs(p) do targets[#targets + 1] = t end
  table.sort(targets)
  -- Every source exists and is a float weight, FP8 only with its scales.
  local plain, fp8 = {}, {}
  for _, t in ipairs(targets) do
    for _, src in ipairs(p[t]) do
      local e = info.tensors[src]
      if not e then
        error(string.format("hf.load: %s: no tensor '%s' (needed for '%s')", path, src, t), 2)
      end
      if not WEIGHT_DTYPES[e.dtype] then
        error(string.format("hf.load: %s: tensor '%s' has dtype %s; weights are BF16, F16, F32, F64 or FP8",
                            path, src, e.dtype), 2)
      end
      if FP8[e.dtype] then
        local sname = src .. "_scale_inv"
        if not info.tensors[sname] then
          error(string.format("hf.load: %s: tensor '%s' is %s without '%s': FP8 weights without their " ..
                              "block scales would be wrong weights", path, src, e.dtype, sname), 2)
        end
        fp8[#fp8 + 1] = src
      else
        plain[#plain + 1] = src
      end
    end
  end
  local src = k3.load_safetensors(path, {names = plain, device = device, dtype = opts.dtype})
  -- FP8 codes are exact in bf16; the scales are read in f64, where nothing rounds them.
  local scale_names = {}
  for i, name in ipairs(fp8) do scale_names[i] = name .. "_scale_inv" end
  local codes = k3.load_safetensors(path, {names = fp8, dtype = "bf16"})
  local scales = k3.load_safetensors(path, {names = scale_names, dtype = "f64"})
  for _, name in ipairs(fp8) do
    local w = M.dequantize(codes[name], scales[name .. "_scale_inv"], {dtype = opts.dtype or "bf16"})
    codes[name]:free()
    scales[name .. "_scale_inv"]:free()
    if device ~= "cpu" then
      local d = w:to(device)
      w:free()
      w = d
    end
    src[name] = w
  end
  return M.to_stack(src, {free = true})
end

--- hf.to_stack(weights, opts) -> weights with the stack's names: a table of Hugging Face names
--- (as k3.load_safetensors returns them) with each joined pair stacked into a new tensor, the
--- stack's weight (opts.free: the parts are freed then); names the stack uses are kept, others
--- dropped. A table already in the stack's names (nothing to join) is returned as it is.
function M.to_stack(weights, opts)
  opts = A.options(opts, "hf.to_stack", {"free"}, 2)
  local have = {}
  for n in pairs(weights) do have[n] = true end
  local p = plan(have)
  local joins = false
  for _, srcs in pairs(p) do joins = joins or #srcs > 1 end
  if not joins then return weights end
  local out = {}
  for target, srcs in pairs(p) do
    if #srcs == 1 then
      out[target] = weights[srcs[1]]
    else
      local parts = {}
      for i, s in ipairs(srcs) do
        parts[i] = weights[s]
        if not parts[i] then error(string.format("hf.to_stack: no tensor '%s' (needed for '%s')", s, target), 2) end
      end
      out[target] = k3.cat(parts, 1)
      if opts.free then
        for _, t in ipairs(parts) do t:free() end
      end
    end
  end
  return out
end

--- hf.from_stack(weights, cfg) -> a new table with Hugging Face names: each joined weight split back
--- into its two parts (views of it: narrow), everything else under its own name. For writing a
--- checkpoint in the Hugging Face layout (the specs do).
function M.from_stack(weights, cfg)
  local out = {}
  for name, t in pairs(weights) do
    local pre, rest = name:match("^(model%.layers%.%d+%.)(.+)$")
    local srcs = rest and M.joined[rest]
    if srcs then
      local first = rest == "mlp.gate_up_proj.weight" and t:size(1) // 2 or cfg.q_lora_rank
      out[pre .. srcs[1]] = t:narrow(1, 1, first)
      out[pre .. srcs[2]] = t:narrow(1, first + 1, t:size(1) - first)
    else
      out[name] = t
    end
  end
  return out
end

return M
