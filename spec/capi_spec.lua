-- Packaging and the C API: `make install` into a temporary prefix, pkg-config flags, a C
-- program (examples/capi/attn_res.c) built only with those flags that runs an AttnRes read
-- through k3_attn_res, compared bit for bit with the same read made from Lua; the C API's
-- edges (spec/capi/checks.c: NULL arguments, 0-based messages, invalid values, op output
-- names, writes through overlapping views, single rounding, messages in C names, the
-- per-thread last error, the log hook), line by line; and the installed Lua module loading from the prefix alone.
local H = require "spec.helpers"
local k3 = require "k3"

local root = H.root()

local sh = H.sh

local function have(tool)
  local _, code = sh("command -v " .. tool)
  return code == 0
end

-- Hex-float text ("0x1.8p+1 -0x1p-2 ...") -> list of numbers.
local function numbers(text)
  local v = {}
  for w in text:gmatch("%S+") do v[#v + 1] = assert(tonumber(w), w) end
  return v
end

local function flat(t)
  local v = {}
  local function walk(x)
    if type(x) == "table" then for _, y in ipairs(x) do walk(y) end else v[#v + 1] = x end
  end
  walk(t:to("f64"):totable())
  return v
end

-- The Lua twin of examples/capi/attn_res.c (same seeds, 1-based write_block).
local function lua_attn_res(T, S, H, nb, wb, seed)
  local bf = function(shape, s) return k3.randn(shape, {dtype = "bf16", seed = s}) end
  local prefix, delta, blocks = bf({T, H}, seed), bf({T, H}, seed + 1), bf({T, S, H}, seed + 2)
  local out = k3.attn_res{prefix = prefix, delta = delta, blocks = blocks, num_blocks = nb,
                          write_block = wb >= 0 and wb + 1 or nil,
                          norm_weight = bf({H}, seed + 3), qk_weight = bf({H}, seed + 4),
                          output_norm_weight = k3.full({H}, 1.5, {dtype = "bf16"})}
  return {out = flat(out), prefix = flat(prefix), blocks = flat(blocks)}
end

-- spec/capi/checks.c: the C API at its edges, one line "name<TAB>STATUS<TAB>message" per case
-- (a value as a hex float where the case returns one). Each group below is one review item.
local checks = {
  null = {
    {"empty out", "K3_EINVAL", "empty: out is NULL"},
    {"empty shape", "K3_EINVAL", "empty: shape is NULL"},
    {"full out", "K3_EINVAL", "full: out is NULL"},
    {"full shape", "K3_EINVAL", "full: shape is NULL"},
    {"randn out", "K3_EINVAL", "randn: out is NULL"},
    {"randn shape", "K3_EINVAL", "randn: shape is NULL"},
    {"from_f64 out", "K3_EINVAL", "from_f64: out is NULL"},
    {"from_f64 values", "K3_EINVAL", "from_f64: values is NULL"},
    {"narrow out", "K3_EINVAL", "narrow: out is NULL"},
    {"narrow t", "K3_EINVAL", "narrow: t is NULL"},
    {"select out", "K3_EINVAL", "select: out is NULL"},
    {"transpose out", "K3_EINVAL", "transpose: out is NULL"},
    {"view out", "K3_EINVAL", "view: out is NULL"},
    {"view shape", "K3_EINVAL", "view: shape is NULL"},
    {"expand out", "K3_EINVAL", "expand: out is NULL"},
    {"expand shape", "K3_EINVAL", "expand: shape is NULL"},
    {"reshape out", "K3_EINVAL", "reshape: out is NULL"},
    {"reshape shape", "K3_EINVAL", "reshape: shape is NULL"},
    {"permute out", "K3_EINVAL", "permute: out is NULL"},
    {"permute dims", "K3_EINVAL", "permute: dims is NULL"},
    {"squeeze t", "K3_EINVAL", "squeeze: t is NULL"},
    {"unsqueeze out", "K3_EINVAL", "unsqueeze: out is NULL"},
    {"as_strided out", "K3_EINVAL", "as_strided: out is NULL"},
    {"as_strided shape", "K3_EINVAL", "as_strided: shape is NULL"},
    {"as_strided stride", "K3_EINVAL", "as_strided: stride is NULL"},
    {"to out", "K3_EINVAL", "to: out is NULL"},
    {"to t", "K3_EINVAL", "to: t is NULL"},
    {"copy dst", "K3_EINVAL", "copy: dst is NULL"},
    {"copy src", "K3_EINVAL", "copy: src is NULL"},
    {"fill t", "K3_EINVAL", "fill: t is NULL"},
    {"get t", "K3_EINVAL", "get: t is NULL"},
    {"get idx", "K3_EINVAL", "get: idx is NULL"},
    {"get out", "K3_EINVAL", "get: out is NULL"},
    {"set idx", "K3_EINVAL", "set: idx is NULL"},
    {"to_f64 out", "K3_EINVAL", "to_f64: out is NULL"},
    {"binary out", "K3_EINVAL", "binary: out is NULL"},
    {"binary a", "K3_EINVAL", "binary: a is NULL"},
    {"binary b", "K3_EINVAL", "binary: b is NULL"},
    {"binary_scalar out", "K3_EINVAL", "binary_scalar: out is NULL"},
    {"binary_scalar a", "K3_EINVAL", "binary_scalar: a is NULL"},
    {"max_abs_diff out", "K3_EINVAL", "max_abs_diff: out is NULL"},
    {"max_abs_diff b", "K3_EINVAL", "max_abs_diff: b is NULL"},
    {"allclose out", "K3_EINVAL", "allclose: out is NULL"},
    {"cosine a", "K3_EINVAL", "cosine: a is NULL"},
    {"device_parse out", "K3_EINVAL", "device_parse: out is NULL"},
    {"device_parse text", "K3_EINVAL", "device_parse: text is NULL"},
    {"dtype_parse name", "K3_EINVAL", "dtype_parse: name is NULL"},
    {"dtype_parse out", "K3_EINVAL", "dtype_parse: out is NULL"},
    {"policy_new out", "K3_EINVAL", "policy_new: out is NULL"},
    {"policy_set_candidates op", "K3_EINVAL", "policy_set_candidates: op is NULL"},
    {"policy_set_candidates names[1]", "K3_EINVAL", "policy_set_candidates: names[1] is NULL"},
    {"safetensors_save names[0]", "K3_EINVAL", "safetensors_save: names[0] is NULL"},
    {"safetensors_save tensors[0]", "K3_EINVAL", "safetensors_save: tensors[0] (\"w\") is NULL"},
    {"method_default out", "K3_EINVAL", "method_default: out is NULL"},
    {"linear x", "K3_EINVAL", "linear: x is required"},
    {"graph_capture out", "K3_EINVAL", "graph_capture: out is NULL"},
    {"graph_capture fn", "K3_EINVAL", "graph_capture: fn is NULL"},
    {"graph_capture warmup", "K3_EINVAL", "graph_capture: warmup must be >= 0; got -1"},
    {"graph_replay g", "K3_EINVAL", "graph_replay: g is NULL"},
    {"empty 0-dim shape NULL", "K3_OK", ""},
    {"get 0-dim idx NULL", "K3_OK", ""},
    {"from_f64 empty values NULL", "K3_OK", ""},
    {"to_f64 empty out NULL", "K3_OK", ""},
    {"free NULL", "K3_OK", ""},
  },
  zero_based = {
    {"narrow dim", "K3_ESHAPE", "narrow: dim must be in 0..1 for a 2-dim tensor; got 2"},
    {"narrow start", "K3_ESHAPE", "narrow: start 3 and length 1 out of range for dim 1 of size 3"},
    {"narrow length", "K3_ESHAPE", "narrow: start 1 and length 5 out of range for dim 1 of size 3"},
    {"select index", "K3_ESHAPE", "select: index 2 out of range for dim 0 of size 2"},
    {"select mininteger", "K3_ESHAPE", "select: index -9223372036854775808 out of range for dim 1 of size 3"},
    {"transpose d2", "K3_ESHAPE", "transpose: d2 must be in 0..1 for a 2-dim tensor; got 2"},
    {"get index", "K3_ESHAPE", "get: index 2 out of range for dim 0 of size 2"},
    {"set index", "K3_ESHAPE", "set: index 3 out of range for dim 1 of size 3"},
    {"view two -1", "K3_ESHAPE", "view: only one size may be -1 (dims 0 and 1)"},
    {"view infer", "K3_ESHAPE", "view: cannot infer dim 0: 6 elements over 4"},
    {"expand", "K3_ESHAPE", "expand: dim 0 of size 2 cannot expand to 3 (tensor shape [2, 3], target [3, 3])"},
    {"reshape count", "K3_ESHAPE", "reshape: shape [4, 2] has 8 elements; tensor has 6"},
    {"reshape two -1", "K3_ESHAPE", "reshape: only one size may be -1 (dims 0 and 1)"},
    {"permute range", "K3_ESHAPE", "permute: dim 2 at position 1 is out of range 0..1"},
    {"permute twice", "K3_ESHAPE", "permute: dim 1 appears twice (positions 0 and 1)"},
    {"squeeze dim", "K3_ESHAPE", "squeeze: dim must be in 0..1 for a 2-dim tensor; got 2"},
    {"unsqueeze dim", "K3_ESHAPE", "unsqueeze: dim must be in 0..2 for a 2-dim tensor; got 3"},
    {"as_strided negative stride", "K3_ELAYOUT", "as_strided: stride of dim 1 must be >= 0; got -1"},
    {"empty size", "K3_ESHAPE", "empty: size of dim 1 must be >= 0; got -1"},
    {"empty overflow", "K3_EOVERFLOW", "empty: element count overflows at dim 1 (size 4611686018427387904)"},
    {"linear K mismatch", "K3_ESHAPE", "linear: x dim 1 (3) must match w dim 1 (4)"},
    {"linear bias", "K3_ESHAPE", "linear: bias must be [N] = [2] (w dim 0); got [4]"},
    {"linear prologue silu_mul K", "K3_ESHAPE", "linear: x dim 1 (3) must be 2 * w dim 1 (3) = 6 for prologue silu_mul"},
    {"linear prologue value", "K3_EINVAL", "linear: prologue must be 0 (none), 1 (silu_mul) or 2 (rms_norm); got 7"},
    {"linear prologue rms_norm weight", "K3_ESHAPE", "linear: norm_weight must be [K] = [3] (w dim 1); got [4]"},
    {"linear epilogue odd w", "K3_ESHAPE", "linear: w dim 0 (5) must be even for epilogue silu_mul"},
    {"linear epilogue value", "K3_EINVAL", "linear: epilogue must be 0 (none) or 1 (silu_mul); got 5"},
    {"linear epilogue residual", "K3_EINVAL", "linear: residual cannot be combined with epilogue silu_mul (it would be added before the gate); add it to the result instead"},
    {"linear epilogue out", "K3_ESHAPE", "linear: out must be [2, 1]; got [2, 3]"},
    {"method_apply_fused m", "K3_EINVAL", "method_apply: m is NULL"},
    {"rms_norm w", "K3_ESHAPE", "rms_norm: w must be [H] = [3] (x dim 1); got [4]"},
    {"silu_mul odd", "K3_ESHAPE", "silu_mul: x dim 1 (3) must be even ([M, 2I])"},
    {"narrow 0-dim", "K3_ESHAPE", "narrow: dim 0 is out of range: the tensor has 0 dims"},
    {"attn_res write_block 3", "K3_ESHAPE", "attn_res: write_block must be -1 (no write) or in 0..2 (blocks has S = 3 slots); got 3"},
    {"attn_res num_blocks 4", "K3_ESHAPE", "attn_res: num_blocks must be in 0..3 (blocks dim 1); got 4"},
    {"attn_res qk_weight", "K3_ESHAPE", "attn_res: qk_weight must be [H] = [4] (prefix dim 1); got [2, 3]"},
    {"attn_res write_block -2", "K3_ESHAPE", "attn_res: write_block must be -1 (no write) or in 0..2 (blocks has S = 3 slots); got -2"},
    {"attn_res write_block S=0", "K3_ESHAPE", "attn_res: write_block must be -1 (no write): blocks has S = 0 slots; got 0"},
    {"sum dim 2 of 2 dims", "K3_EINVAL",
     "sum: dim 2 is out of range for a 2-dim tensor (expected 0..1 or -1 for all)"},
    {"max dim -2", "K3_EINVAL",
     "max: dim -2 is out of range for a 2-dim tensor (expected 0..1 or -1 for all)"},
    {"max of an empty dim 0", "K3_ESHAPE", "max: cannot reduce an empty dim 0 (size 0)"},
    {"min index over all, base 0", "K3_OK", "0x1.4p+2"},
    {"sum over dim 0", "K3_OK", "0x1.ep+3"},
    {"cat of 1-dim and 2-dim", "K3_ESHAPE", "cat: tensor 1 has 2 dims; tensor 0 has 1"},
    {"cat of none", "K3_EINVAL", "cat: expected at least one tensor; got 0"},
  },
  invalid = {
    {"empty cpu index 3", "K3_EINVAL", "empty: invalid device index 3 for cpu (must be 0)"},
    {"empty device type 5", "K3_EINVAL", "empty: invalid device type 5 (expected K3_DEVICE_CPU = 0 or K3_DEVICE_CUDA = 1)"},
    {"full cuda index -1", "K3_EINVAL", "full: invalid device index -1 for cuda (must be >= 0)"},
    {"randn device type 5", "K3_EINVAL", "randn: invalid device type 5 (expected K3_DEVICE_CPU = 0 or K3_DEVICE_CUDA = 1)"},
    {"to cpu index 1", "K3_EINVAL", "to: invalid device index 1 for cpu (must be 0)"},
    {"layout_fallback 7", "K3_EINVAL", "policy_set_layout_fallback: fallback must be 0 (error) or 1 (fallback); got 7"},
    {"layout_fallback 1", "K3_OK", ""},
    {"device_name type 5", "K3_OK", "device type 5"},
    {"device_name NULL buf", "K3_OK", "[]"},
    {"attn_res output_eps nan", "K3_EINVAL", "attn_res: output_eps must be a finite number >= 0; got nan"},
    {"attn_res output_eps -nan", "K3_EINVAL", "attn_res: output_eps must be a finite number >= 0; got nan"},
    {"attn_res eps -inf", "K3_EINVAL", "attn_res: eps must be a finite number >= 0; got -inf"},
    {"rms_norm eps nan", "K3_EINVAL", "rms_norm: eps must be a finite number >= 0; got nan"},
    {"set_host_threads 0", "K3_EINVAL", "set_host_threads: n must be 1..64; got 0"},
    {"set_host_threads 65", "K3_EINVAL", "set_host_threads: n must be 1..64; got 65"},
    {"randn on 1 and 5 host threads", "K3_OK", "1 5 0"},
  },
  op_out_names = {
    {"attn_res out of memory", "K3_ENOMEM", "attn_res: out of host memory allocating 1125899906842624 bytes"},
    {"rms_norm out of memory", "K3_ENOMEM", "rms_norm: out of host memory allocating 1125899906842624 bytes"},
    {"silu_mul out of memory", "K3_ENOMEM", "silu_mul: out of host memory allocating 562949953421312 bytes"},
    {"linear out of memory", "K3_ENOMEM", "linear: out of host memory allocating 281474976710656 bytes"},
  },
  overlap = {
    {"copy into stride 0", "K3_ELAYOUT", "copy: destination dim 0 has stride 0 (a broadcast view); it cannot be written"},
    {"copy into as_strided overlap", "K3_ELAYOUT", "copy: destination is written but its elements overlap (shape [2, 2], strides [1, 1])"},
    {"copy view onto itself", "K3_OK", ""},
    {"fill through overlap", "K3_OK", ""},
    {"get after fill", "K3_OK", "0x1.cp+2"},
    {"set through overlap", "K3_OK", ""},
    {"get after set", "K3_OK", "0x1.2p+3"},
    {"rms_norm out overlap", "K3_ELAYOUT", "rms_norm: out is written but its elements overlap (shape [2, 2], strides [1, 1])"},
  },
  -- Messages name the function as C calls it (no k3_ prefix, no Lua-style dotted name), the
  -- argument at fault and, for a file, the path the caller passed.
  c_names = {
    {"safetensors_save unwritable", "K3_EIO", "safetensors_save: /nonexistent/x.st: cannot open for writing: No such file or directory"},
    {"dist_all_reduce t", "K3_EINVAL", "dist_all_reduce: t is NULL"},
    {"dist_all_reduce op", "K3_EINVAL", "dist_all_reduce: op must be K3_DIST_SUM (0), K3_DIST_MAX (1) or K3_DIST_MIN (2); got 7"},
    {"dist_all_gather out", "K3_EINVAL", "dist_all_gather: out is NULL"},
    {"dist_all_gather t", "K3_EINVAL", "dist_all_gather: t is NULL"},
    {"dist_get_stats out", "K3_EINVAL", "dist_get_stats: out is NULL"},
    {"set_allocator live", "K3_EINVAL", "set_allocator: N host allocations are live; set the allocator before creating tensors"},
    {"method_low_latency out", "K3_EINVAL", "method_low_latency: out is NULL"},
    {"method_low_latency plan", "K3_EINVAL", "method_low_latency: plan is NULL but n is 1"},
    {"method_low_latency n", "K3_EINVAL", "method_low_latency: n must be >= 0; got -1"},
    {"method_apply m", "K3_EINVAL", "method_apply: m is NULL"},
    {"policy_set_batch_invariant p", "K3_EINVAL", "policy_set_batch_invariant: p is NULL"},
  },
  -- k3_last_error() is per thread: A fails, B fails differently, then each reads its own.
  threads = {
    {"thread A reads its own after B fails", "K3_EINVAL", "narrow: t is NULL"},
    {"thread B reads its own after A fails", "K3_ESHAPE", "select: index 2 out of range for dim 0 of size 2"},
    {"main thread keeps its own", "K3_ESHAPE", "empty: size of dim 0 must be >= 0; got -1"},
  },
  refusals = {
    {"method_low_latency M twice", "K3_EINVAL", "method.low_latency: plan has two entries for M = 3"},
    {"method_low_latency M twice out", "K3_OK", "NULL"},
    {"method_low_latency balanced 2", "K3_EINVAL", "method.low_latency: plan entry for M = 2 has balanced 2; expected 0 or 1"},
    {"method_low_latency l2_prefetch_mb 41", "K3_EINVAL", "method.low_latency: plan entry for M = 5 has l2_prefetch_mb 41; expected 0..40"},
    {"policy_set_candidates unknown op", "K3_EINVAL",
     "policy: unknown op 'matmul' (expected linear, attn_res, rms_norm, silu_mul, abs, exp, sqrt, sum, mean, max or min)"},
    {"policy_set_candidates 17", "K3_EINVAL", "policy: linear has 17 candidates; expected 0..16"},
    {"linear y and out NULL", "K3_EINVAL", "linear: y and out are both NULL (the result would be lost)"},
    {"attn_res args NULL", "K3_EINVAL", "attn_res: args is NULL"},
    {"empty 9 dims", "K3_ESHAPE", "empty: a tensor has 0 to 8 dimensions; got 9"},
    {"empty dtype 7", "K3_EDTYPE", "empty: invalid dtype 7"},
    {"binary op 9", "K3_EINVAL", "binary: invalid op 9"},
    {"method_apply K mismatch", "K3_ESHAPE", "linear: x dim 1 (7) must match w dim 1 (8)"},
    {"method_apply K mismatch record", "K3_OK",
     "op=linear chosen=[] n=1 cuda.linear.skinny: plan has no entry for M = 1"},
  },
  -- k3_set_log: checks.c sets K3_DISABLE_KERNELS=cpu.linear.nosuch and K3_BATCH_INVARIANT=maybe
  -- before any k3 call, installs a hook, sets up the registry (one warning to the hook), sets
  -- the hook back to NULL and reads the batch-invariant default (its warning, the one
  -- spec/dispatch_spec.lua shows on stderr through the Lua module, reaches no hook). With NULL
  -- the C library drops the message: the header's "k3 never prints" — nothing on stderr, which
  -- the case redirects to a file. (Only the Lua module writes configuration warnings to stderr,
  -- at load, when no hook is set.)
  log_hook = {
    {"log hook calls", "K3_OK", "1"},
    {"log hook level", "K3_OK", "K3_LOG_WARN"},
    {"log hook text", "K3_OK", "K3_DISABLE_KERNELS: unknown kernel 'cpu.linear.nosuch' ignored"},
    {"log hook text lists known kernels", "K3_OK", "yes"},
    {"log hook userdata", "K3_OK", "passed"},
    {"log hook NULL calls", "K3_OK", "0"},
    {"log hook stderr bytes", "K3_OK", "0"},
  },
  -- spec/capi/checks.c section 9: a 10 MB name, a 1,100-byte path.
  long_input = (function()
    local x200 = ("x"):rep(200) .. "... (cut at 200 of 10485760 bytes)"
    local path = "/nonexistent" .. ("/" .. ("d"):rep(99)):rep(11) .. "/k3.safetensors"
    local full = "safetensors: " .. path .. ": cannot open: No such file or directory"
    -- the rule for a message over 1023 bytes (ASCII): first 479 bytes, the count cut, last 480
    local cut = full:sub(1, 479) .. (" [... %d bytes cut ...] "):format(#full - 959) .. full:sub(-480)
    return {
      {"dtype_parse 10 MB name", "K3_EDTYPE", "unknown dtype '" .. x200 .. "' (expected bf16, f16, f32 or f64)"},
      {"device_parse 10 MB text", "K3_EDEVICE", "unknown device '" .. x200 .. "' (expected cpu, cuda or cuda:N)"},
      {"policy_set_candidates 10 MB kernel", "K3_EINVAL", "policy: unknown linear kernel '" .. x200 ..
       "' (known: cpu.linear.blas, cpu.linear.reference, cpu.linear.batch_invariant, cuda.linear.cublas, " ..
       "cuda.linear.skinny, cuda.linear.batch_invariant)"},
      {"safetensors_load 1,100-byte path", "K3_EIO", cut},
    }
  end)(),
  round_once = {
    {"mul scalar bf16", "K3_OK", "0x1.02p+0"},
    {"add scalar first bf16", "K3_OK", "0x1.02p+0"},
    {"mul scalar f16", "K3_OK", "0x1.004p+0"},
    {"add scalar first f16", "K3_OK", "0x1.004p+0"},
    {"mul scalar f32", "K3_OK", "0x1.000002p+0"},
    {"add scalar first f32", "K3_OK", "0x1.000002p+0"},
    {"mul scalar f64", "K3_OK", "0x1.0000000000001p+0"},
    {"add scalar first f64", "K3_OK", "0x1.0000000000001p+0"},
    {"int64_to_dtype f32", "K3_OK", "0x1.000002p+55"},
    {"int64_to_dtype bf16", "K3_OK", "0x1.02p+60"},
  },
}

describe("install and the C API", function()
  local prefix, pc_env

  setup(function()
    if not (have("pkg-config") and have("cc") and have("make")) then return end
    prefix = (sh("mktemp -d /tmp/k3-install-XXXXXX")):gsub("%s+$", "")
    local out, code = sh(string.format("make -C %q --no-print-directory install PREFIX=%q",
                                       root, prefix))
    if code ~= 0 then error("make install failed:\n" .. out) end
    pc_env = "PKG_CONFIG_PATH=" .. prefix .. "/lib/pkgconfig "
  end)

  teardown(function()
    if prefix and prefix:match("^/tmp/k3%-install%-") then sh("rm -rf " .. prefix) end
  end)

  local function ready()
    if prefix then return true end
    pending("needs pkg-config, cc and make on PATH")
    return false
  end

  it("installs the library, header, Lua files, C module and pkg-config file", function()
    if not ready() then return end
    for _, f in ipairs{"lib/libk3.so", "lib/libk3lua.so", "include/k3.h",
                       "lib/lua/5.4/k3/core.so", "share/lua/5.4/k3/init.lua",
                       "share/lua/5.4/k3/policy/default.lua", "lib/pkgconfig/k3.pc"} do
      local fh = io.open(prefix .. "/" .. f, "rb")
      assert.truthy(fh, "missing " .. prefix .. "/" .. f)
      fh:close()
    end
    local out, code = sh(pc_env .. "pkg-config --cflags --libs k3")
    assert.are.equal(0, code, out)
    assert.are.equal("-I" .. prefix .. "/include -L" .. prefix .. "/lib -lk3", (out:gsub("%s+$", "")))
    out = sh(pc_env .. "pkg-config --modversion k3")
    assert.are.equal(k3.version, (out:gsub("%s+$", "")))
  end)

  it("builds a C program with only pkg-config flags; its attn_res equals the Lua result", function()
    if not ready() then return end
    local exe = prefix .. "/attn_res"
    local out, code = sh(string.format(
      "%scc -std=c11 -Wall -Werror %q -o %q $(%spkg-config --cflags --libs k3) " ..
      "-Wl,-rpath,$(%spkg-config --variable=libdir k3)",
      pc_env, root .. "/examples/capi/attn_res.c", exe, pc_env, pc_env))
    assert.are.equal(0, code, out)
    for _, case in ipairs{{3, 4, 96, 3, 3, 7}, {1, 2, 33, 0, -1, 11}, {5, 8, 260, 8, 2, 3}} do
      out, code = sh(exe .. " " .. table.concat(case, " "))
      assert.are.equal(0, code, out)
      assert.truthy(out:find("chosen cpu.attn_res.", 1, true), out)
      local ref = lua_attn_res(table.unpack(case))
      for _, name in ipairs{"out", "prefix", "blocks"} do
        local got = numbers(assert(out:match("\n" .. name .. " ([^\n]*)"), out))
        assert.are.equal(#ref[name], #got, name)
        for i = 1, #got do
          if got[i] ~= ref[name][i] then
            error(string.format("%s[%d]: C %a, Lua %a (case %s)", name, i, got[i], ref[name][i],
                                table.concat(case, " ")))
          end
        end
      end
      assert.truthy(out:find("bad call: K3_ESHAPE: attn_res: qk_weight must be [H] = [" ..
                             case[3] .. "]", 1, true), out)
    end
  end)

  -- spec/capi/checks.c, built once with pkg-config flags only and run once; its lines by name.
  local checks_run
  local function run_checks()
    if checks_run then return checks_run end
    local exe = prefix .. "/capi_checks"
    local out, code = sh(string.format(
      "%scc -std=c11 -Wall -Werror %q -o %q $(%spkg-config --cflags --libs k3) -lm -lpthread " ..
      "-Wl,-rpath,$(%spkg-config --variable=libdir k3)",
      pc_env, root .. "/spec/capi/checks.c", exe, pc_env, pc_env))
    assert.are.equal(0, code, out)
    out, code = sh(exe)
    local lines = {}
    for name, status, msg in out:gmatch("([^\t\n]+)\t([^\t\n]+)\t([^\n]*)\n") do
      assert(not lines[name], "spec/capi/checks.c prints case " .. name .. " twice")
      lines[name] = {status, msg}
    end
    checks_run = {out = out, code = code, lines = lines}
    return checks_run
  end

  local function expect(group)
    if not ready() then return end
    local r = run_checks()
    for _, case in ipairs(checks[group]) do
      local got = r.lines[case[1]]
      if not got then
        error(string.format("case %q did not run (exit %d); output:\n%s", case[1], r.code, r.out))
      end
      assert.are.same({case[2], case[3]}, got, case[1])
    end
    assert.are.equal(0, r.code, r.out)
    assert.truthy(r.out:find("\ndone\n$"), r.out)
  end

  it("C API: a NULL argument is K3_EINVAL naming the function and the argument, never a crash",
     function() expect("null") end)
  it("C API: messages count dims, indices and write_block from 0, in C terms (ops too)",
     function() expect("zero_based") end)
  it("C API: invalid devices, flags, host thread counts and non-finite eps are errors that say so; " ..
     "randn gives the same values on 1 and 5 host threads",
     function() expect("invalid") end)
  it("C API: an op's output allocation failure names the op", function() expect("op_out_names") end)
  it("C API: overlapping destinations refuse copies and op outputs; fill and set write through",
     function() expect("overlap") end)
  it("C API: scalar arithmetic rounds once for every dtype", function() expect("round_once") end)
  it("C API: an echoed 10 MB name is cut at 200 bytes and marked; a message past the 1 KB buffer keeps its reason",
     function() expect("long_input") end)
  it("C API: a duplicate plan M, an unknown policy op, 17 candidates, a lost result, NULL attn_res args, " ..
     "9 dims, dtype 7 and binary op 9 are refused in words; a refused method call still fills the record",
     function() expect("refusals") end)
  it("C API: messages use the C function's name and name the argument or the caller's path",
     function() expect("c_names") end)
  it("C API: k3_set_log hands a configuration warning to the hook (level, text, userdata); " ..
     "NULL drops the next one, writing nothing to stderr",
     function() expect("log_hook") end)
  it("C API: k3_last_error() is per thread: two pthreads failing in turn each read their own",
     function() expect("threads") end)

  it("builds the game-loop host against the installed k3 with pkg-config k3-lua", function()
    if not ready() then return end
    local _, has_lua_pc = sh("pkg-config --exists lua5.4")
    if has_lua_pc ~= 0 then pending("no lua5.4.pc for pkg-config") return end
    os.execute("mkdir -p " .. prefix .. "/bin")
    local exe = prefix .. "/bin/k3-host"
    local out, code = sh(string.format(
      "%scc -std=c11 -Wall -Werror %q -o %q $(%spkg-config --cflags --libs k3-lua lua5.4) " ..
      "-lpthread -Wl,-rpath,$(%spkg-config --variable=libdir k3)",
      pc_env, root .. "/examples/host/host.c", exe, pc_env, pc_env))
    assert.are.equal(0, code, out)
    -- From PREFIX/bin the host finds PREFIX/share/lua/5.4/k3 by itself.
    out, code = sh(string.format("cd / && %q --frames 3 --script %q", exe,
                                 root .. "/examples/host/scripts/error_in_frame3.lua"))
    assert.are.equal(0, code, out)
    assert.truthy(out:find("frames run: 3\nframes failed: 1\n"), out)
    assert.truthy(out:find("frame 3 failed (error)", 1, true), out)
  end)

  it("loads the installed Lua module from the prefix alone", function()
    if not ready() then return end
    local env = string.format("LUA_PATH='%s/share/lua/5.4/?.lua;%s/share/lua/5.4/?/init.lua' " ..
                              "LUA_CPATH='%s/lib/lua/5.4/?.so' ", prefix, prefix, prefix)
    local out, code = sh("cd / && " .. env .. (os.getenv("K3_LUA") or "lua5.4") .. " -e 'local k3 = require \"k3\"; " ..
                         "print(k3.version, k3.zeros({2}):get(2) == 0, " ..
                         "#k3.kernels() > 0, package.searchpath(\"k3.core\", package.cpath))'")
    assert.are.equal(0, code, out)
    assert.are.equal(k3.version .. "\ttrue\ttrue\t" .. prefix .. "/lib/lua/5.4/k3/core.so", (out:gsub("%s+$", "")))
  end)

  it("installs the modules a library user requires, not the benchmarks or the demos' mains", function()
    if not ready() then return end
    local env = string.format("LUA_PATH='%s/share/lua/5.4/?.lua;%s/share/lua/5.4/?/init.lua' " ..
                              "LUA_CPATH='%s/lib/lua/5.4/?.so' ", prefix, prefix, prefix)
    local chunk = "local names = {} " ..
      "for _, m in ipairs{\"k3.dist\", \"k3.nn\", \"k3.nn.parallel\", \"k3.model.kimi_k3\", " ..
      "\"k3.model.kimi_k3_tp\", \"k3.model.attn_res_stream\", \"k3.policy.default\", \"k3.policy.sm90\", " ..
      "\"k3.policy.sm90_step\", \"k3.plan_step\"} do " ..
      "require(m) end " ..
      "for _, m in ipairs{\"k3.bench.util\", \"k3.bench.linear\", \"k3.model.decode_demo\", " ..
      "\"k3.model.decode_demo_tp\", \"k3.cli\"} do " ..
      "if package.searchpath(m, package.path) then names[#names + 1] = m end end " ..
      "print(#names == 0 and \"none\" or table.concat(names, \" \"))"
    local out, code = sh("cd / && " .. env .. (os.getenv("K3_LUA") or "lua5.4") .. " -e 'require \"k3\"; " .. chunk .. "'")
    assert.are.equal(0, code, out)
    assert.are.equal("none", (out:gsub("%s+$", "")))
  end)
end)
