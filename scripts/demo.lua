-- scripts/demo.lua — the main job (`make demo`): a Kimi-K3-shaped decode stack for
-- decode batches M, printing time per step (on a CUDA device as a CUDA graph and eager),
-- fidelity against the fp64 run and the kernels with every decline reason. Run as `scripts/k3 scripts/demo.lua [options]`.
local k3 = require "k3"
local demo = require "k3.model.decode_demo"
local kimi = require "k3.model.kimi_k3"

local usage = [[
usage: scripts/k3 scripts/demo.lua [options]
  --config NAME             tiny | kimi-k3-tp8 (default: kimi-k3-tp8 with a CUDA device, else tiny)
  --device DEV              cpu | cuda | cuda:N (default: cuda when available, else cpu)
  --weights PATH            load weights instead of generating them: a safetensors file, a
                            checkpoint folder with model.safetensors.index.json, or that index
                            (Hugging Face names are mapped: docs/API.md, "Checkpoints")
  --save-weights FILE       save the weights used to a safetensors file
  --steps N                 timed decode steps per M (default 5 on cpu, 20 on cuda)
  --m LIST                  decode batch sizes in 1..16, e.g. 1,2,4,16 or 1-16 (default 1-16)
  --seed N                  seed of the generated weights and inputs (default 1234)
  --eager                   run the step eagerly only (on a CUDA device the default also runs it
                            as a CUDA graph, k3.cuda_graph, and prints both)
  --tp N                    the tensor-parallel stack over N GPUs (one process per rank,
                            started through scripts/k3 --nproc N; needs N CUDA devices)
  --quiet                   no progress output (K3_PROGRESS=0 likewise; progress is a live
                            line on a terminal, a plain line every few seconds otherwise)
  -h, --help                this text]]

local function die(msg)
  io.stderr:write("demo: ", msg, "\n", usage, "\n")
  os.exit(2)
end

-- The --m list: decode batch sizes in 1..demo.max_m (the README's M = 1..16).
local function parse_m(s)
  local list, err = require("k3.cli").batch_sizes(s, demo.max_m)
  if not list then die("--m: " .. err) end
  return list
end

local opts = {}
local args = {...}
for _, a in ipairs(args) do -- --tp N: the tensor-parallel stack (re-runs itself via scripts/k3 --nproc N)
  if a == "--tp" or a:match("^%-%-tp=") then os.exit(require("k3.model.decode_demo_tp").main(args)) end
end
for key, value, a in require("k3.cli").options(args, die) do
  if key == "--config" then opts.config = value()
  elseif key == "--device" then opts.device = value()
  elseif key == "--weights" then opts.weights_path = value()
  elseif key == "--save-weights" then opts.save_weights = value()
  elseif key == "--steps" then
    local v = value()
    opts.steps = math.tointeger(tonumber(v))
    if not opts.steps or opts.steps < 1 then die("--steps must be a positive integer; got '" .. v .. "'") end
  elseif key == "--m" then opts.m = parse_m(value())
  elseif key == "--seed" then
    local v = value()
    opts.seed = math.tointeger(tonumber(v))
    if not opts.seed then die("--seed must be an integer; got '" .. v .. "'") end
  elseif key == "--quiet" then opts.quiet = true
  elseif key == "--eager" then opts.eager = true
  elseif key == "-h" or key == "--help" then print(usage) os.exit(0)
  else die("unknown option '" .. a .. "'") end
end

if opts.config and not kimi.configs[opts.config] then
  local names = {}
  for k in pairs(kimi.configs) do names[#names + 1] = k end
  table.sort(names)
  die(string.format("--config: unknown config '%s' (known: %s)", opts.config, table.concat(names, ", ")))
end

-- The device is checked with the other options, before any weight is generated: k3's own
-- parser (through kimi.canonical_device) names what it accepts, and a CUDA device that is not
-- available says why.
if opts.device then
  local dok, err = pcall(kimi.canonical_device, opts.device)
  if not dok then
    local msg = tostring(err):gsub("^[^\n]-:%d+: ", "")
    msg = msg:match("^bad argument #%d+ to '[^']*' %((.*)%)$") or msg:gsub("^empty: ", "")
    die("--device: " .. msg)
  end
end

if opts.weights_path then
  local lok, w = pcall(require("k3.model.hf").load, opts.weights_path)
  if not lok then
    -- the loader's message without the Lua location it was raised at
    io.stderr:write("demo: --weights: ", (tostring(w):gsub("^[^\n]-%.lua:%d+: ", "")), "\n")
    os.exit(1)
  end
  opts.weights = w
  opts.weights_source = "from " .. opts.weights_path
end

-- A failure prints its message (K3_DEBUG=1 adds the Lua traceback) and exits 1.
local ok, res = xpcall(demo.run, function(e)
  return os.getenv("K3_DEBUG") and debug.traceback(tostring(e), 2) or tostring(e)
end, opts)
if not ok then
  require("k3.cli").progress{quiet = opts.quiet}:clear() -- a live progress line, if any
  io.stderr:write("demo: ", res, "\n")
  os.exit(1)
end
print(demo.format(res))
