-- The AttnRes residual stream of a Kimi-K3 decoder stack: sealed blocks in one [T, S, H]
-- tensor, the live prefix sum of the open block, and reads through k3.attn_res with the
-- delta add and the block write fused into the read wherever the stack allows.
--
-- What it computes (Block Attention Residuals, DESIGN.md "attn_res" and "Kimi-K3 facts"):
-- a standard residual stream keeps h = x + f_1 + f_2 + ...; AttnRes instead lets every
-- module input attend over depth. Layers are grouped into blocks of `block_size` (12 in
-- Kimi-K3). The outputs of the modules (attention, MLP) of the open block are summed into
-- the *prefix* (the block's partial sum); a finished block is *sealed*: its sum is written
-- once into the next slot of `blocks` and the prefix starts again from zero. The token
-- embedding is the first block, sealed at layer 0. A *read* is the input of one module:
--
--   sources = sealed blocks 1..num_blocks, then the prefix
--   out     = sum_s softmax_s(<rmsnorm(v_s), query>) * v_s      (then the layer's RMSNorm)
--
-- where the query is the module's learned pseudo-query (qk_weight, with the key norm's
-- weight norm_weight) and the module's input RMSNorm is fused as the read's output norm.
-- One decoder layer l (0-based) does, in the order of the reference pseudo-code:
--
--   h     = read(prefix + delta)   pre-attention; delta = the previous layer's MLP output,
--                                  added into the prefix by the read itself (fused delta)
--   if l % block_size == 0: seal   the prefix just read becomes sealed block b, written by
--                                  the same read (fused write_block = b); the prefix is empty
--   a     = attention(h)
--   h     = read(prefix + a)       post-attention, fused delta again
--   m     = mlp(h)                 m is the delta of the next read
--
-- and the stack ends with one final read (delta = the last MLP output) whose output norm is
-- the model norm. At layer 0 nothing is sealed yet, so the pre-attention read has a single
-- source and is the identity: it is skipped (its output is rms_norm(embedding)) and the
-- embedding is sealed by a plain copy. With 93 layers and block size 12 that is 8 seals
-- (layers 0, 12, ..., 84: the embedding and seven full 12-layer blocks; layers 84..92 stay in
-- the prefix until the final read), 2 * 93 - 1 = 185 layer reads plus the final read = 186
-- reads, 7 of them fusing the seal. After a seal the open block is empty, so the next delta
-- is copied into the prefix instead of added to zero (the same bits, one op either way).
--
-- Decode tokens are independent rows: the stream is per forward pass (begin() resets it),
-- and its buffers are reused across steps of the same T.
local k3 = require "k3"

local Stream = {}
Stream.__index = Stream
Stream.__name = "k3.model.AttnResStream"

-- Number of blocks a stack of `num_layers` seals (the embedding at layer 0 and one per
-- further multiple of block_size).
function Stream.num_seals(num_layers, block_size)
  return (num_layers + block_size - 1) // block_size
end

-- Stream.new{tokens = T, hidden_size = H, num_layers = L, block_size = 12,
--            dtype = "bf16", device = "cpu", eps = 1e-5}
function Stream.new(opts)
  local T, H = assert(opts.tokens, "tokens"), assert(opts.hidden_size, "hidden_size")
  local L, bs = assert(opts.num_layers, "num_layers"), opts.block_size or 12
  local S = Stream.num_seals(L, bs)
  local topts = {dtype = opts.dtype or "bf16", device = opts.device or "cpu"}
  local self = setmetatable({
    tokens = T, hidden_size = H, num_layers = L, block_size = bs, num_slots = S,
    eps = opts.eps or 1e-5, dtype = topts.dtype, device = topts.device,
    blocks = k3.zeros({T, S, H}, topts),
    prefix = k3.zeros({T, H}, topts),
    -- What each read's kernel may load before its PDL wait (k3.attn_res's static_weights and
    -- static_blocks): reads issued so far, and per slot how many had been issued when it was
    -- last written.
    calls = 0, slot_written_after = {},
  }, Stream)
  self:reset_counts()
  return self
end

function Stream:reset_counts()
  self.counts = {reads = 0, layer_reads = 0, final_reads = 0, skipped_reads = 0, seals = 0,
                 fused_seals = 0, fused_deltas = 0, copied_deltas = 0}
end

-- Starts a forward pass: the prefix holds the embedding (a [T, H] tensor), nothing sealed.
function Stream:begin(embedding)
  if embedding:size(1) ~= self.tokens or embedding:size(2) ~= self.hidden_size then
    error(string.format("AttnResStream:begin: embedding must be [%d, %d] (got [%s])", self.tokens,
                        self.hidden_size, table.concat(embedding:size(), ", ")), 2)
  end
  self.prefix:copy(embedding)
  self.num_sealed = 0
  self.prefix_empty = false
  self.written = {}   -- slot -> layer that sealed it (write-once check)
  self.layer = nil
  self.finished = false
end

function Stream:seals_at(layer) return layer % self.block_size == 0 end

-- Raises unless `slot` may be written now (write-once, within the stream's slots).
local function check_slot(self, slot, layer)
  if self.written[slot] then
    error(string.format("AttnResStream: block %d already sealed at layer %d (write-once), sealing again at layer %s",
                        slot, self.written[slot], tostring(layer)), 3)
  end
  if slot > self.num_slots then
    error(string.format("AttnResStream: seal at layer %s needs block %d but the stream has %d slots",
                        tostring(layer), slot, self.num_slots), 3)
  end
end

local function mark_written(self, slot, layer)
  check_slot(self, slot, layer)
  self.written[slot] = layer
end

-- One read through k3.attn_res. query = {norm_weight =, qk_weight =, output_norm_weight =}.
-- delta (may be nil) is added into the prefix by the read; seal = true writes the prefix
-- (after the add) into the next block slot in the same call, then empties the prefix.
-- Returns a new [T, H] tensor the caller owns.
function Stream:read(query, delta, seal, layer)
  if self.finished then error("AttnResStream: read after the final read", 2) end
  -- Every check comes before any state changes, and the state changes only after the op has
  -- succeeded, so a read that raises (a bad query, say) leaves the stream as it was.
  if self.prefix_empty and not delta then
    error("AttnResStream: read of an empty open block needs a delta", 2)
  end
  local slot
  if seal then
    slot = self.num_sealed + 1
    check_slot(self, slot, layer)
  end
  local copied = false
  if delta and self.prefix_empty then
    -- The open block is empty: its sum is exactly delta (the prefix's old values are unused,
    -- so overwriting them before the op is harmless if the op then raises).
    self.prefix:copy(delta)
    delta, copied = nil, true
  end
  -- The contract of static_weights / static_blocks (lib/k3.h, k3_attn_res_args): what the
  -- call's kernel loads before its wait was last written before the previous attn_res call
  -- on this CUDA stream. The query weights are never written while the stream runs, so they
  -- qualify from the second read on. Slot j qualifies when it was last written after call w
  -- (a seal by a copy after w calls, or by call w itself) and this is call w + 2 or later;
  -- slots are sealed in order, so the static ones are a leading run.
  local call = self.calls + 1
  local nstatic = 0
  while nstatic < self.num_sealed do
    local w = self.slot_written_after[nstatic + 1]
    if not w or call < w + 2 then break end
    nstatic = nstatic + 1
  end
  local out = k3.attn_res{
    prefix = self.prefix, delta = delta, blocks = self.blocks, num_blocks = self.num_sealed,
    write_block = slot, norm_weight = query.norm_weight, qk_weight = query.qk_weight,
    output_norm_weight = query.output_norm_weight, eps = self.eps, output_eps = self.eps,
    static_weights = call >= 2, static_blocks = nstatic,
  }
  self.calls = call
  if slot then self.slot_written_after[slot] = call end
  self.prefix_empty = false
  if copied then
    self.counts.copied_deltas = self.counts.copied_deltas + 1
  elseif delta then
    self.counts.fused_deltas = self.counts.fused_deltas + 1
  end
  self.counts.reads = self.counts.reads + 1
  if seal then
    self.written[slot] = layer
    self.num_sealed = slot
    self.prefix_empty = true
    self.counts.seals = self.counts.seals + 1
    self.counts.fused_seals = self.counts.fused_seals + 1
  end
  return out
end

-- Seals the prefix with a plain copy (no read), then empties it.
function Stream:seal(layer)
  local slot = self.num_sealed + 1
  mark_written(self, slot, layer)
  self.blocks:select(2, slot):copy(self.prefix)
  self.slot_written_after[slot] = self.calls
  self.num_sealed = slot
  self.prefix_empty = true
  self.counts.seals = self.counts.seals + 1
end

-- The pre-attention read of layer `layer` (0-based): adds delta (the previous MLP output,
-- nil at layer 0), seals where the block boundary falls, returns the attention input.
function Stream:pre_attention(layer, query, delta)
  self.layer = layer
  local seal = self:seals_at(layer)
  if self.num_sealed == 0 then
    -- Nothing sealed: a read has one source and returns it (normed). Skip the read.
    if delta then
      error(string.format("AttnResStream: layer %d: a delta before the first seal has no block to go to", layer), 2)
    end
    local h
    if query.output_norm_weight then
      h = k3.rms_norm(self.prefix, query.output_norm_weight, self.eps)
    else
      h = self.prefix:clone()
    end
    self.counts.skipped_reads = self.counts.skipped_reads + 1
    if seal then self:seal(layer) end
    return h
  end
  self.counts.layer_reads = self.counts.layer_reads + 1
  return self:read(query, delta, seal, layer)
end

-- The post-attention read: adds the attention output into the prefix, returns the MLP input.
function Stream:post_attention(layer, query, delta)
  self.counts.layer_reads = self.counts.layer_reads + 1
  return self:read(query, delta, false, layer)
end

-- The final read before the model norm (fused as its output norm): adds the last MLP output.
function Stream:final(query, delta)
  self.counts.final_reads = self.counts.final_reads + 1
  local out = self:read(query, delta, false, "final")
  self.finished = true
  return out
end

-- The prefix (the open block's partial sum) as it stands; a view the stream owns.
function Stream:current_prefix() return self.prefix end

function Stream:free()
  self.blocks:free()
  self.prefix:free()
end

-- The bookkeeping a stack of `num_layers` (block size bs) must produce, by a plain walk of
-- the schedule with no tensors: what the spec compares the stream's counters against.
function Stream.expected_counts(num_layers, bs)
  local c = {reads = 0, layer_reads = 0, final_reads = 0, skipped_reads = 0, seals = 0,
             fused_seals = 0, seal_layers = {}}
  local sealed = 0
  for l = 0, num_layers - 1 do
    local seal = l % bs == 0
    if sealed == 0 then
      c.skipped_reads = c.skipped_reads + 1
    else
      c.layer_reads, c.reads = c.layer_reads + 1, c.reads + 1
      if seal then c.fused_seals = c.fused_seals + 1 end
    end
    if seal then
      sealed = sealed + 1
      c.seals = c.seals + 1
      c.seal_layers[#c.seal_layers + 1] = l
    end
    c.layer_reads, c.reads = c.layer_reads + 1, c.reads + 1
  end
  c.final_reads, c.reads = 1, c.reads + 1
  return c
end


function Stream:__tostring()
  return string.format("AttnResStream(%d token%s, hidden_size %d, %d layers, block_size %d, " ..
                       "%d slots, %s on %s)", self.tokens, self.tokens == 1 and "" or "s",
                       self.hidden_size, self.num_layers,
                       self.block_size, self.num_slots, self.dtype, self.device)
end

return Stream
