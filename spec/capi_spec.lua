-- Packaging and the C API: `make install` into a temporary prefix, pkg-config flags, a C
-- program (examples/capi/attn_res.c) built only with those flags that runs an AttnRes read
-- through k3_attn_res, compared bit for bit with the same read made from Lua; and the
-- installed Lua module loading from the prefix alone.
local k3 = require "k3"

-- The checkout's absolute path (this file is <root>/spec/<name>).
local function checkout_root()
  local src = debug.getinfo(1, "S").source:sub(2)
  local dir = src:match("^(.*)/spec/[^/]*$") or "."
  if dir:sub(1, 1) ~= "/" then
    local p = io.popen("pwd")
    local cwd = p:read("l")
    p:close()
    dir = dir == "." and cwd or cwd .. "/" .. dir
  end
  return dir
end
local root = checkout_root()

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local _, how, code = p:close()
  return out, how == "exit" and code or 128 + code
end

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
end)
