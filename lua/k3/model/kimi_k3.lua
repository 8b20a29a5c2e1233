-- A Kimi-K3-shaped decoder stack for decode: per layer an AttnRes read, an attention
-- stand-in made of the real (TP8-local) projections, a second read with the fused delta add
-- and a SwiGLU MLP; then the final read with the model norm. Configurations, seeded weight
-- generation, weights from a {name = tensor} table (safetensors), and the fp64 twin.
local k3 = require "k3"
local nn = require "k3.nn"
local Stream = require "k3.model.attn_res_stream"
local A = require "k3.args"

local M = {}

-- "cuda" -> "cuda:0" (what t:device() reports), so device comparisons are exact.
function M.canonical_device(d)
  if d == nil or d == "cpu" then return "cpu" end
  local t = k3.empty({0}, {device = d})
  local name = t:device()
  t:free()
  return name
end

-- Attention stand-in (MLA projection shapes). A decode token without a KV cache attends
-- only to itself, and softmax over one key is exactly 1: attention returns the value. So
-- the stand-in keeps every projection a decode step runs and replaces the score/softmax
-- with that identity:
--   a = qkv_a(h)            fused q_a + kv_a down-projection  [T, q_lora + kv_lora + rope]
--   q = q_b(rms_norm(a[:, :q_lora], q_a_layernorm))
--                           per-head up-projection            [T, heads * (nope + rope)]
--                           (the norm is q_b's rms_norm prologue, on one GPU and on the
--                           tensor-parallel column layer: one kernel fewer, the same bits)
--   v = q[:, head, :v_head_dim] for each head                 [T, heads * v_head_dim]
--   o = o_proj(v)                                             [T, hidden]
M.configs = {
  -- The CPU default: small enough that `make demo` (M = 1..16 plus the fp64 run) takes
  -- seconds on two cores, deep enough for four sealed blocks and the depth-fidelity spec.
  tiny = {
    name = "tiny", hidden_size = 256, num_layers = 16, block_size = 4,
    q_lora_rank = 64, kv_lora_rank = 32, qk_rope_head_dim = 16, num_heads = 4,
    qk_nope_head_dim = 32, v_head_dim = 32, intermediate_size = 512, eps = 1e-5,
  },
  -- Kimi-K3 at TP8 (DESIGN.md): hidden 7168, 93 layers, AttnRes block 12 (8 sealed blocks).
  -- Local projections: qkv_a (2112, 7168), q_b (2304, 1536), o_proj (7168, 1536),
  -- gate_up (8448, 7168), down (7168, 4224). weight_sets: the projections cycle through
  -- this many distinct seeded sets (each 241 MB in bf16, far above any cache), so
  -- generating the weights takes seconds, not the minutes 22 GB of random numbers would.
  ["kimi-k3-tp8"] = {
    name = "kimi-k3-tp8", hidden_size = 7168, num_layers = 93, block_size = 12,
    q_lora_rank = 1536, kv_lora_rank = 512, qk_rope_head_dim = 64, num_heads = 12,
    qk_nope_head_dim = 128, v_head_dim = 128, intermediate_size = 4224, eps = 1e-5,
    weight_sets = 2,
  },
}

-- A configuration's fields: the sizes, each a positive integer, then the optional ones.
local SIZES = {"hidden_size", "num_layers", "block_size", "q_lora_rank", "kv_lora_rank",
               "qk_rope_head_dim", "num_heads", "qk_nope_head_dim", "v_head_dim", "intermediate_size"}
local FIELDS = {"name", table.unpack(SIZES)}
FIELDS[#FIELDS + 1] = "eps"
FIELDS[#FIELDS + 1] = "weight_sets"

--- M.check_config(cfg, fn) -> cfg: raises "<fn>: config field '<f>' must be ...; got ..."
--- (at the caller outside k3's modules) unless every size is a positive integer, eps (when
--- given) a number > 0 and weight_sets false, nil or a positive integer, and no other field
--- than these and name is set. Every function that takes a configuration table checks it.
function M.check_config(cfg, fn)
  if type(cfg) ~= "table" then
    A.raise(string.format("%s: config must be a config name or table; got %s", fn, type(cfg)))
  end
  local function refuse(f, want)
    local v = cfg[f]
    A.raise(string.format("%s: config field '%s' must be %s; got %s", fn, f, want,
                          type(v) == "number" and tostring(v) or type(v)))
  end
  for _, f in ipairs(SIZES) do
    if math.type(cfg[f]) ~= "integer" or cfg[f] < 1 then refuse(f, "a positive integer") end
  end
  local eps, sets = cfg.eps, cfg.weight_sets
  if eps ~= nil and not (type(eps) == "number" and eps > 0 and eps < math.huge) then
    refuse("eps", "a finite number > 0 or nil")
  end
  if sets and not (math.type(sets) == "integer" and sets >= 1) then
    refuse("weight_sets", "a positive integer, false or nil")
  end
  return A.options(cfg, fn, FIELDS, nil, "config field")
end

-- A copy of configuration `name` (or of a table) with fields of `over` replacing its own;
-- the result is checked (M.check_config).
function M.config(name, over)
  local base = type(name) == "table" and name or M.configs[name]
  if not base then
    local names = {}
    for k in pairs(M.configs) do names[#names + 1] = k end
    table.sort(names)
    error(string.format("kimi_k3: unknown config '%s' (known: %s)", tostring(name),
                        table.concat(names, ", ")), 2)
  end
  if over ~= nil and type(over) ~= "table" then
    A.raise(string.format("bad argument #2 to 'kimi_k3.config' (table or nil expected, got %s)", type(over)))
  end
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(over or {}) do c[k] = v end
  return M.check_config(c, "kimi_k3.config")
end

-- Every weight of the stack: name -> {shape, kind, fan_in}. kind says how it is generated:
-- "proj" (std 1/sqrt(fan_in)), "out" (module output projection: std 1/sqrt(fan_in * L), so
-- each module adds ~1/sqrt(L) and nothing grows with depth), "norm" (1 + 0.1 n),
-- "query" (AttnRes pseudo-query: n / sqrt(H), logits of order 1).
function M.weight_specs(cfg)
  M.check_config(cfg, "kimi_k3.weight_specs")
  local H, L = cfg.hidden_size, cfg.num_layers
  local qkv_n = cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim
  local head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
  local I = cfg.intermediate_size
  local specs, order = {}, {}
  local function add(name, shape, kind, fan_in, set_name)
    specs[name] = {shape = shape, kind = kind, fan_in = fan_in, set_name = set_name}
    order[#order + 1] = name
  end
  for i = 0, L - 1 do
    local p = "model.layers." .. i .. "."
    local s = cfg.weight_sets and string.format("set.%d.", i % cfg.weight_sets) or p
    add(p .. "attn_res.norm.weight", {H}, "norm")
    add(p .. "attn_res.proj.weight", {H}, "query")
    add(p .. "input_layernorm.weight", {H}, "norm")
    add(p .. "self_attn.qkv_a_proj.weight", {qkv_n, H}, "proj", H, s .. "qkv_a")
    add(p .. "self_attn.q_a_layernorm.weight", {cfg.q_lora_rank}, "norm")
    add(p .. "self_attn.q_b_proj.weight", {cfg.num_heads * head_dim, cfg.q_lora_rank}, "proj",
        cfg.q_lora_rank, s .. "q_b")
    add(p .. "self_attn.o_proj.weight", {H, cfg.num_heads * cfg.v_head_dim}, "out",
        cfg.num_heads * cfg.v_head_dim, s .. "o")
    add(p .. "mlp_res.norm.weight", {H}, "norm")
    add(p .. "mlp_res.proj.weight", {H}, "query")
    add(p .. "post_attention_layernorm.weight", {H}, "norm")
    add(p .. "mlp.gate_up_proj.weight", {2 * I, H}, "proj", H, s .. "gate_up")
    add(p .. "mlp.down_proj.weight", {H, I}, "out", I, s .. "down")
  end
  add("model.final_res.norm.weight", {H}, "norm")
  add("model.final_res.proj.weight", {H}, "query")
  add("model.norm.weight", {H}, "norm")
  return specs, order
end

-- A stable 31-bit hash of a name: the weight's seed offset, so adding a weight never
-- changes the values of the others.
local function name_seed(name)
  local h = 2166136261
  for i = 1, #name do h = ((h ~ name:byte(i)) * 16777619) & 0xffffffff end
  return h & 0x7fffffff
end

-- Generates every weight from `seed`: values drawn in f32, scaled, rounded once to dtype.
-- opts = {seed = 1234, dtype = "bf16", device = "cpu", progress = fn(done, total)}.
-- Returns {name = tensor} (tensors of a shared weight set appear under each layer's name).
function M.generate_weights(cfg, opts)
  M.check_config(cfg, "kimi_k3.generate_weights")
  opts = A.options(opts, "kimi_k3.generate_weights", {"seed", "dtype", "device", "progress"}, 2)
  local seed, dtype, device = opts.seed or 1234, opts.dtype or "bf16", opts.device or "cpu"
  local specs, order = M.weight_specs(cfg)
  local L = cfg.num_layers
  local weights, sets = {}, {}
  for n, name in ipairs(order) do
    local s = specs[name]
    local key = s.set_name or name
    local t = sets[key]
    if not t then
      local r = k3.randn(s.shape, {dtype = "f32", seed = seed * 1000003 + name_seed(key)})
      local v
      if s.kind == "proj" then
        v = r * (1 / math.sqrt(s.fan_in))
      elseif s.kind == "out" then
        v = r * (1 / math.sqrt(s.fan_in * L))
      elseif s.kind == "norm" then
        v = r * 0.1 + 1
      else
        v = r * (1 / math.sqrt(cfg.hidden_size))
      end
      r:free()
      t = v:to(dtype)
      v:free()
      if device ~= "cpu" then
        local d = t:to(device)
        t:free()
        t = d
      end
      sets[key] = t
    end
    weights[name] = t
    if opts.progress then opts.progress(n, #order) end
  end
  return weights
end

-- The tokens' hidden states entering the stack (the embedding rows) for decode step `step`.
-- opts = {seed = 1234, step = 0, dtype = "bf16", device = "cpu"}.
function M.embedding(cfg, tokens, opts)
  M.check_config(cfg, "kimi_k3.embedding")
  if math.type(tokens) ~= "integer" or tokens < 1 then
    A.raise(string.format("bad argument #2 to 'kimi_k3.embedding' (tokens must be a positive integer; got %s)",
                          type(tokens) == "number" and tostring(tokens) or type(tokens)))
  end
  opts = A.options(opts, "kimi_k3.embedding", {"seed", "step", "dtype", "device"}, 3)
  local r = k3.randn({tokens, cfg.hidden_size},
                     {dtype = "f32", seed = (opts.seed or 1234) * 7919 + (opts.step or 0)})
  local t = r:to(opts.dtype or "bf16")
  r:free()
  if (opts.device or "cpu") ~= "cpu" then
    local d = t:to(opts.device)
    t:free()
    t = d
  end
  return t
end

-- ---- the stack -----------------------------------------------------------------------

local Attention = {}
Attention.__index = Attention
M.Attention = Attention -- shared by the tensor-parallel stack, built with a rank's local cfg

function Attention:__call(h)
  local cfg = self.cfg
  local T = h:size(1)
  local a = self.qkv_a(h)
  -- q_b (an nn.Linear, or the tensor-parallel column layer) takes the norm as its prologue
  local qb = self.q_b(a:narrow(2, 1, cfg.q_lora_rank),
                      {prologue = "rms_norm", norm_weight = self.q_a_norm, eps = cfg.eps})
  a:free()
  local hd = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
  local v = k3.empty({T, cfg.num_heads * cfg.v_head_dim}, {dtype = qb:dtype(), device = qb:device()})
  v:view({T, cfg.num_heads, cfg.v_head_dim})
   :copy(qb:view({T, cfg.num_heads, hd}):narrow(3, 1, cfg.v_head_dim))
  qb:free()
  local o = self.o_proj(v)
  v:free()
  return o
end

local Layer = {}
Layer.__index = Layer
M.Layer = Layer -- shared by the tensor-parallel stack (lua/k3/model/kimi_k3_tp.lua)

-- One decoder layer. delta: the previous layer's MLP output (nil at layer 0), consumed.
-- Returns this layer's MLP output, the delta of the next read (the caller owns it).
function Layer:forward(stream, delta)
  local h = stream:pre_attention(self.index, self.attn_query, delta)
  if delta then delta:free() end
  local a = self.attn(h)
  h:free()
  h = stream:post_attention(self.index, self.mlp_query, a)
  a:free()
  local m = self.mlp(h)
  h:free()
  return m
end

local Stack = {}
Stack.__index = Stack
M.Stack = Stack

local function fetch(weights, specs, name, dtype, device, converted)
  local t = weights[name]
  if t == nil then error(string.format("kimi_k3: weights: missing '%s'", name), 0) end
  local want = specs[name].shape
  local got = t:size()
  local ok = #got == #want
  for d = 1, #want do ok = ok and got[d] == want[d] end
  if not ok then
    error(string.format("kimi_k3: weights: '%s' has shape [%s], the config needs [%s]", name,
                        table.concat(got, ", "), table.concat(want, ", ")), 0)
  end
  if t:dtype() == dtype and t:device() == device then return t end
  -- One converted copy per source tensor, so shared weight sets stay shared.
  local c = converted[t]
  if not c then
    c = t:device() == device and t:to(dtype) or t:to(device):to(dtype)
    converted[t] = c
  end
  return c
end

local function build_layer(cfg, weights, specs, i, dtype, device, converted)
  local p = "model.layers." .. i .. "."
  local function w(n) return fetch(weights, specs, p .. n, dtype, device, converted) end
  return setmetatable({
    index = i,
    attn_query = {norm_weight = w "attn_res.norm.weight", qk_weight = w "attn_res.proj.weight",
                  output_norm_weight = w "input_layernorm.weight"},
    mlp_query = {norm_weight = w "mlp_res.norm.weight", qk_weight = w "mlp_res.proj.weight",
                 output_norm_weight = w "post_attention_layernorm.weight"},
    attn = setmetatable({
      cfg = cfg,
      qkv_a = nn.Linear(w "self_attn.qkv_a_proj.weight"),
      q_a_norm = w "self_attn.q_a_layernorm.weight",
      q_b = nn.Linear(w "self_attn.q_b_proj.weight"),
      o_proj = nn.Linear(w "self_attn.o_proj.weight"),
    }, Attention),
    mlp = nn.SwiGLU(w "mlp.gate_up_proj.weight", w "mlp.down_proj.weight"),
  }, Layer)
end

-- Builds the stack of config `cfg` (a name or a table) from `weights` ({name = tensor},
-- e.g. generate_weights, k3.load_safetensors or k3.model.hf.load; Hugging Face names are
-- mapped and joined by k3.model.hf). opts = {dtype =, device =}: weights of
-- another dtype or device are converted (the fp64 twin: {dtype = "f64", device = "cpu"}).
function M.build(cfg, weights, opts)
  if type(cfg) == "string" then cfg = M.config(cfg) end
  M.check_config(cfg, "kimi_k3.build")
  if type(weights) ~= "table" then
    A.raise(string.format("bad argument #2 to 'kimi_k3.build' (a {name = tensor} table of weights expected, got %s)",
                          type(weights)))
  end
  opts = A.options(opts, "kimi_k3.build", {"dtype", "device"}, 3)
  weights = require("k3.model.hf").to_stack(weights) -- Hugging Face names (lua/k3/model/hf.lua)
  local any = weights["model.norm.weight"]
  local dtype = opts.dtype or (any and any:dtype()) or "bf16"
  local device = M.canonical_device(opts.device or (any and any:device()) or "cpu")
  local specs = M.weight_specs(cfg)
  local converted = {}
  local self = setmetatable({cfg = cfg, weights = weights, specs = specs, dtype = dtype,
                             device = device, layers = {}, streams = {}}, Stack)
  for i = 0, cfg.num_layers - 1 do
    self.layers[i + 1] = build_layer(cfg, weights, specs, i, dtype, device, converted)
  end
  local function w(n) return fetch(weights, specs, n, dtype, device, converted) end
  self.final_query = {norm_weight = w "model.final_res.norm.weight",
                      qk_weight = w "model.final_res.proj.weight",
                      output_norm_weight = w "model.norm.weight"}
  return self
end

-- The stream for T tokens (buffers reused across steps).
function Stack:stream(T)
  local s = self.streams[T]
  if not s then
    s = Stream.new{tokens = T, hidden_size = self.cfg.hidden_size,
                   num_layers = self.cfg.num_layers, block_size = self.cfg.block_size,
                   dtype = self.dtype, device = self.device, eps = self.cfg.eps}
    self.streams[T] = s
  end
  return s
end

-- Raises, naming fn, unless x is a step's input: a tensor [M, hidden_size], M >= 1 tokens
-- (the stream's first copy takes it into the stack's dtype and device, which the message
-- names as what x should be).
local function check_input(self, x, fn)
  local H, given, ok = self.cfg.hidden_size, type(x), false
  if k3.is_tensor(x) and x:is_freed() then
    given = "a freed tensor"
  elseif k3.is_tensor(x) then
    local sz = x:size()
    ok = #sz == 2 and sz[1] >= 1 and sz[2] == H
    given = string.format("[%s] %s on %s", table.concat(sz, ", "), x:dtype(), x:device())
  end
  if not ok then
    A.raise(string.format("%s: x must be [M, hidden_size] = [M, %d] %s on %s (M >= 1 tokens); got %s",
                          fn, H, self.dtype, self.device, given))
  end
end

-- One decode step: x [T, H] (the tokens' embedding rows, the stack's dtype and device) ->
-- the final hidden state [T, H] after the final read and the model norm (caller owns it).
-- opts.on_layer(i, stream) runs after each layer (0-based i), e.g. to inspect the prefix.
function Stack:forward(x, opts)
  check_input(self, x, "Stack:forward")
  opts = A.options(opts, "Stack:forward", {"on_layer"}, 2)
  local stream = self:stream(x:size(1))
  stream:begin(x)
  local delta
  for i, layer in ipairs(self.layers) do
    delta = layer:forward(stream, delta)
    if opts.on_layer then opts.on_layer(i - 1, stream) end
  end
  local out = stream:final(self.final_query, delta)
  delta:free()
  return out, stream
end

-- The same step in `dtype` on `device` (default f64 on the CPU) with this stack's weights
-- widened exactly, one layer at a time, so the twin never holds more than one layer's
-- converted weights (the full Kimi-K3 stack in f64 would be 90 GB).
function Stack:reference_forward(x, opts)
  check_input(self, x, "Stack:reference_forward")
  opts = A.options(opts, "Stack:reference_forward", {"dtype", "device", "on_layer"}, 2)
  local dtype, device = opts.dtype or "f64", M.canonical_device(opts.device or "cpu")
  if not self.ref then
    self.ref = setmetatable({cfg = self.cfg, dtype = dtype, device = device, streams = {}}, Stack)
  end
  local ref = self.ref
  local stream = ref:stream(x:size(1))
  stream:begin(x) -- the copy widens x exactly
  -- A weight shared by several layers (config weight_sets) is converted once and kept;
  -- a layer's own weights are converted for that layer and freed after it.
  local uses = {}
  for _, t in pairs(self.weights) do uses[t] = (uses[t] or 0) + 1 end
  local keep = {}
  local function run_with(fn)
    local converted = setmetatable({}, {__index = keep})
    local r = fn(converted)
    for src, c in pairs(converted) do
      if uses[src] > 1 then keep[src] = c else c:free() end
    end
    return r
  end
  local delta
  for i = 0, self.cfg.num_layers - 1 do
    delta = run_with(function(converted)
      local layer = build_layer(self.cfg, self.weights, self.specs, i, dtype, device, converted)
      return layer:forward(stream, delta)
    end)
    if opts.on_layer then opts.on_layer(i, stream) end
  end
  local out = run_with(function(converted)
    local function w(n) return fetch(self.weights, self.specs, n, dtype, device, converted) end
    return stream:final({norm_weight = w "model.final_res.norm.weight",
                         qk_weight = w "model.final_res.proj.weight",
                         output_norm_weight = w "model.norm.weight"}, delta)
  end)
  delta:free()
  for _, c in pairs(keep) do c:free() end
  return out, stream
end

-- The weight names of the stack, sorted (what save_safetensors writes).
function M.weight_names(cfg)
  M.check_config(cfg, "kimi_k3.weight_names")
  local _, order = M.weight_specs(cfg)
  local names = {}
  for i, n in ipairs(order) do names[i] = n end
  table.sort(names)
  return names
end

function Stack:free()
  for _, s in pairs(self.streams) do s:free() end
  self.streams = {}
  if self.ref then
    for _, s in pairs(self.ref.streams) do s:free() end
    self.ref = nil
  end
end

-- ---- printing (the REPL shows objects through __tostring) --------------------------------

function Attention:__tostring()
  return string.format("Attention(qkv_a %s, q_b %s, o_proj %s)", tostring(self.qkv_a),
                       tostring(self.q_b), tostring(self.o_proj))
end

function Layer:__tostring()
  return string.format("Layer %d: attn %s, mlp %s", self.index, tostring(self.attn),
                       tostring(self.mlp))
end

--- M.describe(stack, title) -> a compact summary of a built stack: the config, then one line
--- per module of a layer (every layer has the same shapes), then the final read. The
--- tensor-parallel stack prints through it too.
function M.describe(stack, title)
  local cfg, layer = stack.cfg, stack.layers and stack.layers[1]
  local lines = {string.format("%s(%s): %d layers, hidden_size %d, AttnRes block_size %d " ..
                               "(%d sealed blocks), %s on %s", title, tostring(cfg.name or "custom"),
                               cfg.num_layers, cfg.hidden_size, cfg.block_size,
                               Stream.num_seals(cfg.num_layers, cfg.block_size), stack.dtype,
                               stack.device)}
  if layer then
    lines[#lines + 1] = "  each layer: AttnRes read, Attention, AttnRes read, SwiGLU"
    for _, m in ipairs({{"attn.qkv_a", layer.attn.qkv_a}, {"attn.q_b", layer.attn.q_b},
                        {"attn.o_proj", layer.attn.o_proj}, {"mlp", layer.mlp}}) do
      lines[#lines + 1] = string.format("    %-12s %s", m[1], tostring(m[2]))
    end
  end
  lines[#lines + 1] = string.format("  final: AttnRes read, RMSNorm(%d)", cfg.hidden_size)
  return table.concat(lines, "\n")
end

function Stack:__tostring() return M.describe(self, "KimiK3") end

return M
