-- The Kimi-K3 decode stack (lua/k3/model/kimi_k3.lua) tensor-parallel over k3.dist, sharded
-- the way the model is served: the MLA down-projection (qkv_a) and every norm and AttnRes
-- query replicated; q_b column-parallel over heads; o_proj row-parallel; gate_up
-- column-parallel with gate and up sharded separately; down row-parallel. The two
-- row-parallel outputs of a layer stay partial sums until the AttnRes read that consumes them:
-- a stream with `reduce_delta` all-reduces the delta, then runs the fused read, so every rank
-- holds the same residual stream. The `--tp N` demo that runs it is lua/k3/model/decode_demo_tp.lua.
local k3 = require "k3"
local nn = require "k3.nn"
local P = require "k3.nn.parallel"
local kimi = require "k3.model.kimi_k3"
local Stream = require "k3.model.attn_res_stream"
local A = require "k3.args"

local M = {}

-- ---- the stream with reduce_delta ------------------------------------------------------------

-- An AttnRes stream whose reads first all-reduce their delta over `reduce_delta` (k3.dist or
-- a simulated rank): the row-parallel module output arrives as this rank's partial sum, and
-- the read adds the full sum into the prefix, fused as on one GPU.
local TPStream = setmetatable({}, {__index = Stream})
TPStream.__index = TPStream
TPStream.__name = "k3.model.AttnResStreamTP"
M.Stream = TPStream

--- Stream.new(opts) with opts.reduce_delta = the group (k3.dist) whose sum the delta is.
function TPStream.new(opts)
  local s = Stream.new(opts)
  s.reduce_delta = opts.reduce_delta
  s.reduce_calls = 0
  return setmetatable(s, TPStream)
end

function TPStream:read(query, delta, seal, layer)
  if delta and self.reduce_delta then
    self.reduce_delta.all_reduce(delta)
    self.reduce_calls = self.reduce_calls + 1
  end
  return Stream.read(self, query, delta, seal, layer)
end

-- ---- configurations -------------------------------------------------------------------------

-- Logical (TP = 1) configurations: the whole model, which --tp N splits N ways. "kimi-k3" is
-- Kimi-K3 whole (96 heads, MLP 33792): its TP8 shards are DESIGN.md's TP8 shapes and its TP2
-- shards (48 heads, MLP 16896) what two H200s serve; with two weight sets it fits one GPU,
-- which the TP = 1 comparison needs.
M.configs = {
  tiny = kimi.config("tiny"),
  ["kimi-k3"] = kimi.config("kimi-k3-tp8", {name = "kimi-k3", num_heads = 96,
                                           intermediate_size = 33792, weight_sets = 2}),
}

function M.config(name, over)
  local base = type(name) == "table" and name or M.configs[name]
  if not base then
    error(string.format("kimi_k3_tp: unknown config '%s' (known: kimi-k3, tiny)", tostring(name)), 2)
  end
  return kimi.config(base, over)
end

-- The per-rank (local) shapes of config cfg at world size W, and a check that it splits.
function M.local_config(cfg, W)
  for _, f in ipairs{"num_heads", "intermediate_size"} do
    if cfg[f] % W ~= 0 then
      error(string.format("kimi_k3_tp: %s = %d does not split over %d ranks", f, cfg[f], W), 2)
    end
  end
  return kimi.config(cfg, {num_heads = cfg.num_heads // W, intermediate_size = cfg.intermediate_size // W,
                           name = string.format("%s-tp%d-local", cfg.name, W)})
end

-- ---- the stack -------------------------------------------------------------------------------

-- The attention stand-in is the single-GPU one (kimi_k3.Attention) built with this rank's
-- local config: q_b is column-parallel (this rank's heads, q_a_layernorm its rms_norm
-- prologue) and o_proj row-parallel without its reduce, so its output is this rank's partial
-- sum. The MLP is nn.SwiGLU's forward over a column-parallel gate_up (gate and up parts
-- sharded alike) and a row-parallel down, again a partial sum; fused (the default) gate_up
-- runs with the silu_mul epilogue and its fused call's plan and writes this rank's h
-- [T, I/W], as on one GPU. The stream all-reduces both partial sums before the next read.
-- A TP layer so makes the single-GPU layer's calls (5 linear, 2 attn_res) and the two
-- all-reduces.
local Attention = kimi.Attention
local MLP = nn.SwiGLU

-- The decoder layer is the single-GPU one (kimi_k3.Layer): the TP stream reduces each
-- delta (the previous layer's MLP partial output) before its read, so the layer itself is
-- the same.
local Layer = kimi.Layer

local Stack = {}
Stack.__index = Stack
M.Stack = Stack

--- build(cfg, weights, opts) -> this rank's stack. cfg: a logical config (name or table);
--- weights: the whole model's {name = tensor} (kimi_k3.generate_weights of cfg, or a
--- safetensors file's table); opts: device, dtype, dist (default k3.dist), rank, world_size,
--- fused (default true: each MLP's gate_up carries the silu_mul epilogue, as nn.SwiGLU's;
--- false: gate_up, k3.silu_mul and down apart, with the plain call's plan). Only this rank's
--- shards are moved to the device; shared weight sets stay shared.
function M.build(cfg, weights, opts)
  if type(cfg) == "string" then cfg = M.config(cfg) end
  kimi.check_config(cfg, "kimi_k3_tp.build")
  opts = A.options(opts, "kimi_k3_tp.build", {"device", "dtype", "dist", "rank", "world_size", "fused"}, 3)
  if opts.fused ~= nil and type(opts.fused) ~= "boolean" then
    error(string.format("kimi_k3_tp: fused must be a boolean (got %s)", type(opts.fused)), 2)
  end
  local fused = opts.fused ~= false
  local d = opts.dist or k3.dist
  local rank, W = opts.rank or d.rank(), opts.world_size or d.world_size()
  local lcfg = M.local_config(cfg, W)
  local any = weights["model.norm.weight"]
  local dtype = opts.dtype or (any and any:dtype()) or "bf16"
  local device = kimi.canonical_device(opts.device or "cpu")
  local specs = kimi.weight_specs(cfg)
  local cache = {} -- [role][source tensor] -> local tensor or layer
  local function fetch(name)
    local t = weights[name]
    if t == nil then error(string.format("kimi_k3_tp: weights: missing '%s'", name), 0) end
    local want, got = specs[name].shape, t:size()
    local ok = #got == #want
    for i = 1, #want do ok = ok and got[i] == want[i] end
    if not ok then
      error(string.format("kimi_k3_tp: weights: '%s' has shape [%s], the config needs [%s]", name,
                          table.concat(got, ", "), table.concat(want, ", ")), 0)
    end
    return t
  end
  local function shared(role, name, make)
    local src = fetch(name)
    cache[role] = cache[role] or {}
    local v = cache[role][src]
    if not v then
      v = make(src)
      cache[role][src] = v
    end
    return v
  end
  local popts = {dist = d, rank = rank, world_size = W, device = device, dtype = dtype}
  local function with(extra)
    local o = {}
    for k, v in pairs(popts) do o[k] = v end
    for k, v in pairs(extra) do o[k] = v end
    return o
  end
  local function replicated(name)
    return shared("rep", name, function(t) return t:to{device = device, dtype = dtype} end)
  end
  local I = cfg.intermediate_size
  local self = setmetatable({cfg = cfg, lcfg = lcfg, dist = d, rank = rank, world_size = W,
                             device = device, dtype = dtype, layers = {}, streams = {}}, Stack)
  for i = 0, cfg.num_layers - 1 do
    local p = "model.layers." .. i .. "."
    self.layers[i + 1] = setmetatable({
      index = i,
      attn_query = {norm_weight = replicated(p .. "attn_res.norm.weight"),
                    qk_weight = replicated(p .. "attn_res.proj.weight"),
                    output_norm_weight = replicated(p .. "input_layernorm.weight")},
      mlp_query = {norm_weight = replicated(p .. "mlp_res.norm.weight"),
                   qk_weight = replicated(p .. "mlp_res.proj.weight"),
                   output_norm_weight = replicated(p .. "post_attention_layernorm.weight")},
      attn = setmetatable({
        cfg = lcfg,
        qkv_a = shared("qkv_a", p .. "self_attn.qkv_a_proj.weight",
                       function(t) local w = t:to{device = device, dtype = dtype}; return nn.Linear(w, {method = P.method_for(w)}) end),
        q_a_norm = replicated(p .. "self_attn.q_a_layernorm.weight"),
        q_b = shared("q_b", p .. "self_attn.q_b_proj.weight",
                     function(t) return P.ColumnParallelLinear(t, with{}) end),
        o_proj = shared("o_proj", p .. "self_attn.o_proj.weight",
                        function(t) return P.RowParallelLinear(t, with{reduce = false}) end),
      }, Attention),
      mlp = setmetatable({
        gate_up = shared("gate_up", p .. "mlp.gate_up_proj.weight",
                         function(t)
                           return P.ColumnParallelLinear(t, with{parts = {I, I},
                                                                 epilogue = fused and "silu_mul" or nil})
                         end),
        down = shared("down", p .. "mlp.down_proj.weight",
                      function(t) return P.RowParallelLinear(t, with{reduce = false}) end),
        fused = fused,
      }, MLP),
    }, Layer)
  end
  self.final_query = {norm_weight = replicated("model.final_res.norm.weight"),
                      qk_weight = replicated("model.final_res.proj.weight"),
                      output_norm_weight = replicated("model.norm.weight")}
  self.cache = cache
  return self
end

function Stack:stream(T)
  local s = self.streams[T]
  if not s then
    s = TPStream.new{tokens = T, hidden_size = self.cfg.hidden_size, num_layers = self.cfg.num_layers,
                     block_size = self.cfg.block_size, dtype = self.dtype, device = self.device,
                     eps = self.cfg.eps, reduce_delta = self.world_size > 1 and self.dist or nil}
    self.streams[T] = s
  end
  return s
end

--- forward(x) -> final hidden state [T, H] (the same on every rank), the stream. x: the
--- tokens' embedding rows, replicated on every rank. The single-GPU step (kimi_k3.Stack):
--- this stack's own stream(T) makes it tensor-parallel.
Stack.forward = kimi.Stack.forward

function Stack:free()
  for _, s in pairs(self.streams) do s:free() end
  self.streams = {}
  for _, per in pairs(self.cache) do
    for _, v in pairs(per) do v:free() end
  end
  self.cache = {}
end


TPStream.__tostring = Stream.__tostring -- metamethods are read raw: not through __index

function Stack:__tostring()
  return kimi.describe(self, string.format("KimiK3TP[rank %d of %d]", self.rank, self.world_size))
end

return M
