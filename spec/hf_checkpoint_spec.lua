-- Checkpoints in the Hugging Face layout for the Kimi-K3 stack (lua/k3/model/hf.lua): a
-- two-shard checkpoint of the tiny config with its index, written with Hugging Face names
-- (gate_proj / up_proj, q_a_proj / kv_a_proj_with_mqa apart), loads into a stack whose output
-- equals the stack built from the same weights directly, bit for bit; FP8 weights are
-- dequantized with their 128 x 128 block scales against an fp64 oracle, and refused without
-- them; `scripts/demo.lua --weights DIR` runs on such a folder.
local k3 = require "k3"
local H = require "spec.helpers"
local kimi = require "k3.model.kimi_k3"
local hf = require "k3.model.hf"

local function mkdir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  return dir
end

-- Writes `weights` ({Hugging Face name = tensor}) as two shards and their index: layers below
-- `split` in the first shard, the rest and the model-level tensors in the second.
local function write_checkpoint(dir, weights, split)
  local shards = {{}, {}}
  local names = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
  local map = {}
  for name, t in pairs(weights) do
    local i = tonumber(name:match("^model%.layers%.(%d+)%."))
    local s = (i and i < split) and 1 or 2
    shards[s][name] = t
    map[#map + 1] = string.format("%q: %q", name, names[s])
  end
  for s = 1, 2 do k3.save_safetensors(dir .. "/" .. names[s], shards[s]) end
  table.sort(map)
  local f = assert(io.open(dir .. "/model.safetensors.index.json", "w"))
  f:write('{"metadata": {"total_size": 0}, "weight_map": {', table.concat(map, ", "), "}}")
  f:close()
end

describe("Hugging Face checkpoints for the Kimi-K3 stack", function()
  local dir
  before_each(function() dir = mkdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  it("a two-shard tiny checkpoint with HF names loads into the same stack, bit for bit", function()
    local cfg = kimi.config("tiny")
    local weights = kimi.generate_weights(cfg, {seed = 7, dtype = "bf16"})
    local named = hf.from_stack(weights, cfg)
    assert.is_not_nil(named["model.layers.3.mlp.gate_proj.weight"])
    assert.is_not_nil(named["model.layers.3.self_attn.kv_a_proj_with_mqa.weight"])
    assert.is_nil(named["model.layers.3.mlp.gate_up_proj.weight"])
    -- tensors the stack does not use are in real checkpoints too: they are not read
    named["model.embed_tokens.weight"] = k3.zeros({8, cfg.hidden_size}, {dtype = "bf16"})
    named["model.layers.0.self_attn.kv_b_proj.weight"] = k3.zeros({4, 4}, {dtype = "bf16"})
    write_checkpoint(dir, named, 8)
    local info = k3.safetensors_info(dir)
    assert.are.equal("model-00001-of-00002.safetensors", info.tensors["model.layers.7.mlp.up_proj.weight"].file)
    assert.are.equal("model-00002-of-00002.safetensors", info.tensors["model.layers.8.mlp.up_proj.weight"].file)

    local loaded = hf.load(dir)
    assert.is_nil(loaded["model.embed_tokens.weight"])
    assert.are.equal(0, k3.max_abs_diff(loaded["model.layers.5.mlp.gate_up_proj.weight"],
                                        weights["model.layers.5.mlp.gate_up_proj.weight"]))
    local direct = kimi.build(cfg, weights)
    local from_ckpt = kimi.build(cfg, loaded)
    for _, T in ipairs({1, 3}) do
      local x = kimi.embedding(cfg, T, {seed = 7, step = T})
      local a, b = direct:forward(x), from_ckpt:forward(x)
      assert.are.equal(0, k3.max_abs_diff(a, b), "T = " .. T)
      assert.is_true(H.nested_equal(a:totable(), b:totable()))
    end
    -- kimi.build maps a table of HF names too (the parts stay the caller's)
    local via_build = kimi.build(cfg, k3.load_safetensors(dir))
    local x = kimi.embedding(cfg, 2, {seed = 7})
    assert.are.equal(0, k3.max_abs_diff(direct:forward(x), via_build:forward(x)))
  end)

  it("loads straight to a dtype, and names the missing source of a joined weight", function()
    local cfg = kimi.config("tiny", {num_layers = 2, block_size = 1})
    local named = hf.from_stack(kimi.generate_weights(cfg, {seed = 3, dtype = "f32"}), cfg)
    write_checkpoint(dir, named, 1)
    local w = hf.load(dir, {dtype = "bf16"})
    assert.are.equal("bf16", w["model.layers.1.mlp.gate_up_proj.weight"]:dtype())
    named["model.layers.1.mlp.up_proj.weight"] = nil
    os.execute("rm -f " .. dir .. "/*")
    write_checkpoint(dir, named, 1)
    H.raises(function() hf.load(dir) end,
             "hf.load: " .. dir .. ": no tensor 'model.layers.1.mlp.up_proj.weight' (needed for 'model.layers.1.mlp.gate_up_proj.weight')")
  end)

  it("hf.load, hf.to_stack and hf.dequantize refuse an unknown option, naming it and the ones they take", function()
    local cfg = kimi.config("tiny", {num_layers = 1, block_size = 1})
    local named = hf.from_stack(kimi.generate_weights(cfg, {seed = 5, dtype = "bf16"}), cfg)
    write_checkpoint(dir, named, 1)
    local before = k3.memory().host_allocations
    for _, c in ipairs({
      {hf.load, dir, {devce = "cpu"}, "bad argument #2 to 'hf.load' (unknown option 'devce' (expected dtype or device))"},
      {hf.load, dir, "cpu", "bad argument #2 to 'hf.load' (table or nil expected, got string)"},
      {hf.to_stack, named, {fre = true}, "bad argument #2 to 'hf.to_stack' (unknown option 'fre' (expected free))"},
    }) do
      assert.equal("caller.lua:2: " .. c[4], H.caller_error(c[1], c[2], c[3]))
    end
    -- nothing was read or joined; the parts given stay whole
    assert.equal(before, k3.memory().host_allocations)
    assert.is_false(named["model.layers.0.mlp.gate_proj.weight"]:is_freed())
    H.raises_exact(function() hf.dequantize(k3.ones({2, 2}), k3.ones({1, 1}), {blok = 64}) end,
                   "bad argument #3 to 'hf.dequantize' (unknown option 'blok' (expected block or dtype))")
  end)
end)

-- FP8 codes for values in [-1, 1]-ish: E4M3 codes 0x00..0x3F and 0x80..0xBF (no NaN).
local function fp8_bytes(n, seed)
  local b, x = {}, seed
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    local c = (x >> 8) & 0x3F
    if (x >> 20) & 1 == 1 then c = c | 0x80 end
    b[i] = string.char(c)
  end
  return table.concat(b)
end

local function e4m3(code)
  local sign = (code & 0x80) ~= 0 and -1 or 1
  local e, m = (code >> 3) & 0xF, code & 7
  if e == 0 then return sign * m / 8 * 2.0 ^ -6 end
  return sign * (1 + m / 8) * 2.0 ^ (e - 7)
end

describe("FP8 block-scaled weights", function()
  local path
  before_each(function() path = os.tmpname() end)
  after_each(function() os.remove(path) end)

  local N, K = 130, 260 -- partial blocks on both edges: scales [2, 3]
  local function write_fp8(with_scales)
    local codes = fp8_bytes(N * K, 11)
    local scales = {0.5, 3.0, 2 ^ -10, 1e-3, 7.25, 1.0}
    local hdr = '{"model.norm.weight":{"dtype":"F8_E4M3","shape":[' .. N .. ',' .. K .. '],"data_offsets":[0,' .. N * K .. ']}'
    local data = codes
    if with_scales then
      hdr = hdr .. ',"model.norm.weight_scale_inv":{"dtype":"F32","shape":[2,3],"data_offsets":[' ..
            N * K .. ',' .. N * K + 24 .. ']}'
      data = data .. string.pack("<ffffff", table.unpack(scales))
    end
    hdr = hdr .. "}"
    local f = assert(io.open(path, "wb"))
    f:write(string.pack("<I8", #hdr), hdr, data)
    f:close()
    local s32 = {}
    for i, v in ipairs(scales) do s32[i] = string.unpack("<f", string.pack("<f", v)) end
    return codes, s32
  end

  it("hf.dequantize: w = f8 * scale_inv[i // 128][j // 128], in f64 then rounded once", function()
    local codes, s = write_fp8(true)
    local t = k3.load_safetensors(path, {dtype = "f64"})
    local got = hf.dequantize(t["model.norm.weight"], t["model.norm.weight_scale_inv"], {dtype = "f64"})
    local want = {}
    for i = 1, N do
      local row = {}
      for j = 1, K do
        local sc = s[((i - 1) // 128) * 3 + (j - 1) // 128 + 1]
        row[j] = e4m3(codes:byte((i - 1) * K + j)) * sc
      end
      want[i] = row
    end
    local oracle = k3.tensor(want, {dtype = "f64"})
    assert.are.equal(0, k3.max_abs_diff(got, oracle))
    local bf = hf.dequantize(t["model.norm.weight"], t["model.norm.weight_scale_inv"])
    assert.are.equal("bf16", bf:dtype())
    assert.are.equal(0, k3.max_abs_diff(bf, oracle:to("bf16")))
    H.raises(function() hf.dequantize(t["model.norm.weight"], k3.ones({2, 2})) end,
             "hf.dequantize: weight [130, 260] in 128x128 blocks needs scales [2, 3]; got [2, 2]")
  end)

  it("the loader dequantizes FP8 weights with their scales and refuses them without", function()
    write_fp8(false)
    H.raises(function() hf.load(path) end,
             "tensor 'model.norm.weight' is F8_E4M3 without 'model.norm.weight_scale_inv': FP8 weights " ..
             "without their block scales would be wrong weights")
    local codes, s = write_fp8(true)
    local w = hf.load(path, {dtype = "f32"})["model.norm.weight"]
    assert.are.equal("f32", w:dtype())
    local function f32(v) return (string.unpack("<f", string.pack("<f", v))) end -- one rounding
    assert.are.equal(f32(e4m3(codes:byte(K + 200)) * s[2]), w:get(2, 200))
    assert.are.equal(f32(e4m3(codes:byte(129 * K + 1)) * s[4]), w:get(130, 1))
  end)

  it("a weight of a dtype that is no float is refused naming it", function()
    local hdr = '{"model.norm.weight":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}'
    local f = assert(io.open(path, "wb"))
    f:write(string.pack("<I8", #hdr), hdr, string.pack("<i4i4", 1, 2))
    f:close()
    H.raises(function() hf.load(path) end,
             "tensor 'model.norm.weight' has dtype I32; weights are BF16, F16, F32, F64 or FP8")
  end)
end)

describe("scripts/demo.lua --weights DIR", function()
  it("runs the stack from a Hugging Face checkpoint folder, as from the generated weights", function()
    local dir = mkdir()
    local cfg = kimi.config("tiny")
    write_checkpoint(dir, hf.from_stack(kimi.generate_weights(cfg, {seed = 1234, dtype = "bf16"}), cfg), 8)
    local root = H.root()
    local cmd = string.format("%q %q --config tiny --device cpu --m 2 --steps 1 --quiet ", root .. "/scripts/k3",
                              root .. "/scripts/demo.lua")
    local a, ca = H.sh(cmd)
    local b, cb = H.sh(cmd .. "--weights " .. dir)
    os.execute("rm -rf " .. dir)
    assert.are.equal(0, ca, a)
    assert.are.equal(0, cb, b)
    assert.truthy(b:find("weights from " .. dir, 1, true), b)
    -- the fidelity columns (rel err, cosine) are the same numbers
    local function row(out) return out:match("\n%s*2%s+[%d.]+%s+(%S+%s+%S+)") end
    assert.is_not_nil(row(a), a)
    assert.are.equal(row(a), row(b))
  end)

  it("make demo WEIGHTS=DIR passes the folder on as --weights", function()
    local out, code = H.sh(string.format("cd %q && make -n demo WEIGHTS=/ckpt/dir DEMO_ARGS='--config tiny' NVCC= 2>&1",
                                         H.root()))
    assert.are.equal(0, code, out)
    assert.truthy(out:find("scripts/k3 scripts/demo.lua --weights '/ckpt/dir' --config tiny", 1, true), out)
  end)
end)

describe("README: loading a sharded checkpoint folder", function()
  it("the example runs as written (on the GPU where there is one, else on the CPU)", function()
    local f = assert(io.open(H.root() .. "/README.md"))
    local readme = f:read("a")
    f:close()
    local code = readme:match("\n## Checkpoints\n.-\n```lua\n(local device = .-)\n```\n")
    assert.is_not_nil(code, "README has no ## Checkpoints loading example")
    local dir = mkdir()
    local cfg = kimi.config("tiny")
    write_checkpoint(dir, hf.from_stack(kimi.generate_weights(cfg, {seed = 5, dtype = "bf16"}), cfg), 8)
    local env = setmetatable({dir = dir, k3 = k3}, {__index = _G})
    local printed = {}
    env.print = function(...)
      local parts = {}
      for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
      printed[#printed + 1] = table.concat(parts, "\t")
    end
    local chunk = assert(load(code, "=README", "t", env))
    chunk()
    os.execute("rm -rf " .. dir)
    assert.are.equal("model-00001-of-00002.safetensors", printed[1])
    local device = k3.backends().cuda.available and "cuda:0" or "cpu"
    assert.truthy(printed[2]:find("k3.Tensor [512, 256] bf16 " .. device, 1, true), printed[2])
    assert.truthy(printed[3]:find("k3.Tensor [1, 256] bf16 " .. device, 1, true), printed[3])
  end)

  it("the folder it writes for the tiny configuration loads through the loading example", function()
    local f = assert(io.open(H.root() .. "/README.md"))
    local readme = f:read("a")
    f:close()
    local make = readme:match("\n## Checkpoints\n.-\n```lua\n(local k3, kimi, hf = .-)\n```\n")
    local use = readme:match("\n## Checkpoints\n.-\n```lua\n(local device = .-)\n```\n")
    assert.is_not_nil(make, "README has no ## Checkpoints folder-writing example")
    local dir = mkdir()
    make = make:gsub('"/tmp/kimi%-tiny"', string.format("%q", dir))
    assert.truthy(make:find(dir, 1, true), "the example's folder could not be redirected")
    local printed = {}
    local env = setmetatable({print = function(...) printed[#printed + 1] = tostring((...)) end}, {__index = _G})
    assert(load(make .. "\n" .. use, "=README", "t", env))()
    os.execute("rm -rf " .. dir)
    assert.are.equal("model.safetensors", printed[1])
    assert.truthy(printed[2]:find("k3.Tensor [512, 256] bf16", 1, true), printed[2])
    assert.truthy(printed[3]:find("k3.Tensor [1, 256] bf16", 1, true), printed[3])
  end)
end)
