-- safetensors load/save: round trips for every dtype (contiguous and strided inputs) and
-- the exact error of each malformed file: truncated, header longer than the file, offsets
-- out of range, unknown dtypes, shape/size disagreement, overlapping or gapped ranges.
local k3 = require "k3"
local H = require "spec.helpers"

-- A file from raw parts: the 8-byte little-endian header length (hlen, default the real
-- length), the header text and the data bytes.
local function write_raw(path, header, data, hlen)
  local f = assert(io.open(path, "wb"))
  f:write(string.pack("<I8", hlen or #header), header, data or "")
  f:close()
end

local function read_all(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function f32s(...)
  local parts = {}
  for _, v in ipairs({...}) do parts[#parts + 1] = string.pack("<f", v) end
  return table.concat(parts)
end

describe("safetensors", function()
  local path
  before_each(function() path = os.tmpname() end)
  after_each(function() if path then os.remove(path) end end)

  -- load(path) must fail with a message containing the path and `text`.
  local function load_fails(text)
    local err = H.raises(function() k3.load_safetensors(path) end, text)
    assert.truthy(err:find("load_safetensors: " .. path, 1, true), err)
    return err
  end

  describe("round trip", function()
    for _, dtype in ipairs({"bf16", "f16", "f32", "f64"}) do
      it("keeps every bit of " .. dtype .. " tensors, contiguous and strided", function()
        local base = k3.randn({6, 10}, {dtype = dtype, seed = 11})
        local vals = base:totable()
        vals[1][1], vals[1][2], vals[1][3] = 0 / 0, math.huge, -0.0
        base = k3.tensor(vals, {dtype = dtype})
        local tensors = {
          ["w.contiguous"] = base,
          ["w.transposed"] = base:t(),                   -- strides {1, 10}
          ["w.narrowed"] = base:narrow(2, 3, 5),         -- padded rows
          ["w.broadcast"] = base:select(1, 2):view({1, 10}):expand({4, 10}), -- stride 0
          ["w.3d"] = k3.randn({2, 3, 4}, {dtype = dtype, seed = 12}):transpose(1, 3),
          ["w.empty"] = k3.zeros({0, 7}, {dtype = dtype}),
        }
        k3.save_safetensors(path, tensors)
        local back = k3.load_safetensors(path)
        local n = 0
        for name, t in pairs(tensors) do
          local b = back[name]
          assert.is_not_nil(b, name)
          assert.are.equal(dtype, b:dtype())
          assert.are.equal("cpu", b:device())
          assert.are.same(t:size(), b:size())
          assert.is_true(b:is_contiguous())
          assert.is_true(H.nested_equal(t:totable(), b:totable()), name)
          n = n + 1
        end
        local m = 0
        for _ in pairs(back) do m = m + 1 end
        assert.are.equal(n, m)
      end)
    end

    it("writes names sorted, metadata first, offsets packed, data 8-byte aligned", function()
      k3.save_safetensors(path, {b = k3.ones({2}, {dtype = "f32"}), a = k3.zeros({3}, {dtype = "f16"})})
      local s = read_all(path)
      local hlen = string.unpack("<I8", s)
      assert.are.equal(0, hlen % 8)
      local header = s:sub(9, 8 + hlen)
      assert.are.equal(
        '{"__metadata__":{"format":"pt"},"a":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},' ..
        '"b":{"dtype":"F32","shape":[2],"data_offsets":[6,14]}}', header:gsub(" +$", ""))
      assert.are.equal(8 + hlen + 14, #s)
      assert.are.equal(f32s(1, 1), s:sub(8 + hlen + 7))
    end)

    it("reads files from other writers: __metadata__, header padding, key order", function()
      local header = '{"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},' ..
                     '"__metadata__":{"source":"test"},' ..
                     '"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}    '
      write_raw(path, header, f32s(1.5, -2, 3.25))
      local t = k3.load_safetensors(path)
      assert.are.same({1.5, -2}, t.x:totable())
      assert.are.same({3.25}, t.y:totable())
      assert.is_nil(t.__metadata__)
    end)

    it("round-trips an empty table", function()
      k3.save_safetensors(path, {})
      assert.are.same({}, k3.load_safetensors(path))
    end)
  end)

  describe("malformed files", function()
    local good_header = '{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}'

    it("a file truncated inside the data names the tensor and the sizes", function()
      write_raw(path, good_header, f32s(1, 2, 3, 4, 5))
      load_fails('tensor "w": data_offsets [0, 24] out of range: the data section holds 20 bytes')
    end)

    it("a file truncated inside the header", function()
      write_raw(path, good_header:sub(1, 20), "", #good_header)
      load_fails("header length " .. #good_header .. " is longer than the file (20 bytes after the 8-byte length)")
    end)

    it("a file shorter than the header length field", function()
      local f = assert(io.open(path, "wb"))
      f:write("\1\0\0")
      f:close()
      load_fails("file is 3 bytes, too short for the 8-byte header length")
    end)

    it("a header length beyond the file, up to 2^64 - 1 (2^63 - 1 among them)", function()
      write_raw(path, good_header, f32s(1, 2, 3, 4, 5, 6), 1 << 40)
      load_fails("header length 1099511627776 is longer than the file")
      write_raw(path, good_header, f32s(1, 2, 3, 4, 5, 6), math.maxinteger)
      load_fails("header length 9223372036854775807 is longer than the file")
      write_raw(path, good_header, f32s(1, 2, 3, 4, 5, 6), -1)
      load_fails("header length 18446744073709551615 is longer than the file")
    end)

    it("a header length over the 100 MB cap, even inside a larger file", function()
      local f = assert(io.open(path, "wb"))
      f:write(string.pack("<I8", 150 * 1000 * 1000))
      f:seek("set", 200 * 1000 * 1000) -- sparse: no 200 MB written
      f:write("\0")
      f:close()
      load_fails("header length 150000000 exceeds the 100000000-byte limit")
    end)

    it("offsets past the end of the data section", function()
      write_raw(path, '{"w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}', f32s(1, 2))
      load_fails('tensor "w": data_offsets [16, 24] out of range: the data section holds 8 bytes')
    end)

    it("offsets that end before they begin", function()
      write_raw(path, '{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', f32s(1, 2))
      load_fails('tensor "w": data_offsets [8, 0] end before they begin')
    end)

    it("offsets that are not non-negative integers", function()
      for _, offs in ipairs({"[-8,0]", "[0]", '"0,8"', "[0,null]"}) do
        write_raw(path, '{"w":{"dtype":"F32","shape":[2],"data_offsets":' .. offs .. '}}', f32s(1, 2))
        load_fails('tensor "w": "data_offsets" must be two non-negative integers [begin, end]')
      end
      -- cJSON reads 8.0 as 8: the text itself is checked, so a fraction or exponent is refused
      for _, num in ipairs({"8.0", "8.5", "1e300", "8E0", "08"}) do
        write_raw(path, '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,' .. num .. ']}}', f32s(1, 2))
        load_fails('tensor "w": ' .. num .. ' is not an integer (shapes and data_offsets are integers)')
      end
    end)

    it("an unknown or unsupported dtype", function()
      write_raw(path, '{"w":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": dtype I32 is not loadable (k3 loads BF16, F16, F32, F64, F8_E4M3 and F8_E5M2)')
      write_raw(path, '{"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": unknown dtype "Q4_K" (k3 reads BF16, F16, F32, F64, F8_E4M3 and F8_E5M2)')
      write_raw(path, '{"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": missing or non-string "dtype"')
    end)

    it("a shape whose size disagrees with the data range", function()
      write_raw(path, '{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}', f32s(1, 2, 3))
      load_fails('tensor "w": shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12] hold 12')
      write_raw(path, '{"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": shape [3] of BF16 needs 6 bytes but data_offsets [0, 8] hold 8')
    end)

    it("bad shapes: negative, fractional, too many dims, overflowing", function()
      write_raw(path, '{"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": shape entry 2 is not a non-negative integer')
      write_raw(path, '{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": 1.5 is not an integer (shapes and data_offsets are integers)')
      write_raw(path, '{"w":{"dtype":"F32","shape":[true],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": shape entry 1 is not a non-negative integer')
      write_raw(path, '{"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": shape has 9 dims (at most 8)')
      write_raw(path, '{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": shape element count overflows')
      write_raw(path, '{"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": shape entry 1 (4.61169e+18) is too large (sizes must be below 2^53)')
      write_raw(path, '{"w":{"dtype":"F32","data_offsets":[0,8]}}', f32s(1, 2))
      load_fails('tensor "w": missing or non-array "shape"')
    end)

    it("overlapping ranges name both tensors", function()
      write_raw(path, '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' ..
                      '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', f32s(1, 2, 3))
      load_fails('tensor "b": data_offsets [4, 12] overlap tensor "a" (which ends at 8)')
    end)

    it("a gap between ranges, and bytes after the last tensor", function()
      write_raw(path, '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},' ..
                      '"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', f32s(1, 2, 3))
      load_fails('tensor "b": data_offsets [8, 12] leave a gap: bytes [4, 8) belong to no tensor')
      write_raw(path, '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', f32s(1, 2))
      load_fails("tensors cover 4 bytes of data but the data section holds 8")
      -- a header with no tensors before data bytes (a fuzzer finding: corpus/safetensors/empty_header_data)
      write_raw(path, '{}', f32s(1, 2))
      load_fails("tensors cover 0 bytes of data but the data section holds 8")
    end)

    it("a name given twice", function()
      write_raw(path, '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},' ..
                      '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32s(1, 2))
      load_fails('tensor "a" appears twice in the header')
    end)

    it("headers that are not a JSON object of objects", function()
      write_raw(path, '{"a":{"dtype":', "")
      load_fails("header is not valid JSON")
      write_raw(path, '[1, 2]', "")
      load_fails("header is not a JSON object")
      write_raw(path, '{"a":[1]}', "")
      load_fails('tensor "a": header entry is not a JSON object')
      write_raw(path, '{"__metadata__":{"k":1}}', "")
      load_fails('"__metadata__" value "k" is not a string')
      write_raw(path, '{}xyz', "")
      load_fails("header has trailing bytes after the JSON object (at byte 2)")
    end)

    it("a missing file is an I/O error", function()
      os.remove(path)
      load_fails("cannot open: No such file or directory")
    end)
  end)

  describe("save errors", function()
    it("a freed tensor", function()
      local t = k3.zeros({2})
      t:free()
      H.raises(function() k3.save_safetensors(path, {x = t}) end, "tensor has been freed")
    end)

    it("the reserved name and non-tensor values", function()
      H.raises(function() k3.save_safetensors(path, {__metadata__ = k3.zeros({1})}) end,
               '"__metadata__" is reserved, not a tensor name')
      H.raises(function() k3.save_safetensors(path, {x = 3}) end, "bad argument #2 to 'save_safetensors'")
    end)

    it("an unwritable path is named as the caller gave it, not by the temporary file", function()
      local err = H.raises(function() k3.save_safetensors("/nonexistent-dir/x.safetensors", {x = k3.zeros({1})}) end,
                           "save_safetensors: /nonexistent-dir/x.safetensors: cannot open for writing: No such file or directory")
      assert.is_nil(err:find(".tmp", 1, true), err)
    end)
  end)
end)

describe("safetensors paths and names", function()
  it("save_safetensors refuses a path that is not a regular file and follows symlinks", function()
    H.raises(function() k3.save_safetensors("/dev/null", {a = k3.ones({2})}) end,
      "save_safetensors: /dev/null exists and is not a regular file")
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir .. " && echo old > " .. dir .. "/target.st && ln -s target.st " .. dir .. "/link.st"))
    k3.save_safetensors(dir .. "/link.st", {a = k3.tensor({1, 2})})
    assert.same({1, 2}, k3.load_safetensors(dir .. "/target.st").a:totable())
    local f = io.popen("test -L " .. dir .. "/link.st && echo link")
    assert.equal("link\n", f:read("a"))
    f:close()
    os.execute("rm -rf " .. dir)
  end)

  it("save_safetensors refuses a name with a NUL byte instead of cutting it short", function()
    local path = os.tmpname()
    local t = k3.ones({2})
    H.raises(function() k3.save_safetensors(path, {["a\0b"] = t}) end,
             'save_safetensors: ' .. path .. ': tensor name "a" contains a NUL byte at byte 2')
    assert.same({1, 1}, t:totable())
    k3.save_safetensors(path, {ab = t})
    assert.same({1, 1}, k3.load_safetensors(path).ab:totable())
    os.remove(path)
  end)
end)

-- ---- FP8, names, options, checkpoints ------------------------------------------------------

local function sorted_keys(t)
  local k = {}
  for name in pairs(t) do k[#k + 1] = name end
  table.sort(k)
  return k
end

-- The value of an 8-bit float code as the OCP 8-bit floating point specification (v1.0)
-- defines it: sign, exponent field e, mantissa field m, exponent bias; E4M3 has no infinities
-- and S.1111.111 as its only NaN, E5M2 follows IEEE-754. Written out from the specification's
-- definition, apart from the C decoders.
local function ocp_fp8(code, ebits, mbits)
  local bias = (1 << (ebits - 1)) - 1
  local sign = (code & 0x80) ~= 0 and -1 or 1
  local e = (code >> mbits) & ((1 << ebits) - 1)
  local m = code & ((1 << mbits) - 1)
  local emax = (1 << ebits) - 1
  if ebits == 4 and e == emax and m == (1 << mbits) - 1 then return 0 / 0 end
  if ebits == 5 and e == emax then return m == 0 and sign * math.huge or 0 / 0 end
  if e == 0 then return sign * (m / (1 << mbits)) * 2.0 ^ (1 - bias) end
  return sign * (1 + m / (1 << mbits)) * 2.0 ^ (e - bias)
end

local function write_raw2(path, header, data)
  local f = assert(io.open(path, "wb"))
  f:write(string.pack("<I8", #header), header, data or "")
  f:close()
end

local function all_codes()
  local b = {}
  for c = 0, 255 do b[#b + 1] = string.char(c) end
  return table.concat(b)
end

describe("safetensors FP8", function()
  local path
  before_each(function() path = os.tmpname() end)
  after_each(function() os.remove(path) end)

  for _, fmt in ipairs({{"F8_E4M3", 4, 3}, {"F8_E5M2", 5, 2}}) do
    local tag, ebits, mbits = fmt[1], fmt[2], fmt[3]
    it(tag .. ": all 256 codes load as their exact OCP values, in every dtype", function()
      write_raw2(path, '{"w":{"dtype":"' .. tag .. '","shape":[256],"data_offsets":[0,256]}}', all_codes())
      local default = k3.load_safetensors(path).w
      assert.are.equal("bf16", default:dtype())
      for _, dt in ipairs({"bf16", "f16", "f32", "f64"}) do
        local t = dt == "bf16" and default or k3.load_safetensors(path, {dtype = dt}).w
        assert.are.equal(dt, t:dtype())
        local v = t:totable()
        for c = 0, 255 do
          local want, got = ocp_fp8(c, ebits, mbits), v[c + 1]
          if want ~= want then
            assert.is_true(got ~= got, string.format("%s code 0x%02X: want NaN, got %s", tag, c, got))
          else
            assert.are.equal(want, got, string.format("%s code 0x%02X in %s", tag, c, dt))
            assert.are.equal(1 / want, 1 / got, string.format("%s code 0x%02X: sign of zero", tag, c))
          end
        end
      end
    end)
  end

  it("the specification's landmarks", function()
    assert.are.equal(448, ocp_fp8(0x7E, 4, 3))
    assert.are.equal(2 ^ -9, ocp_fp8(0x01, 4, 3))
    assert.are.equal(2 ^ -6, ocp_fp8(0x08, 4, 3))
    assert.are.equal(57344, ocp_fp8(0x7B, 5, 2))
    assert.are.equal(2 ^ -16, ocp_fp8(0x01, 5, 2))
    assert.are.equal(-math.huge, ocp_fp8(0xFC, 5, 2))
    write_raw2(path, '{"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]},' ..
                     '"b":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[4,8]}}',
               "\x7E\x7F\xFF\x80" .. "\x7B\x7C\x7D\x01")
    local t = k3.load_safetensors(path, {dtype = "f32"})
    local a, b = t.a:totable(), t.b:totable()
    assert.are.equal(448, a[1])
    assert.is_true(a[2] ~= a[2] and a[3] ~= a[3])
    assert.are.equal(-math.huge, 1 / a[4])
    assert.are.same({57344, math.huge}, {b[1], b[2]})
    assert.is_true(b[3] ~= b[3])
    assert.are.equal(2 ^ -16, b[4])
  end)
end)

describe("safetensors names and header text", function()
  local path
  before_each(function() path = os.tmpname() end)
  after_each(function() os.remove(path) end)

  local function fails(header, text, data)
    write_raw2(path, header, data or string.pack("<f", 1))
    local err = H.raises(function() k3.load_safetensors(path) end, text)
    assert.truthy(err:find("load_safetensors: " .. path, 1, true), err)
  end

  it("a name holding \\u0000 is refused, not cut short", function()
    fails('{"a\\u0000b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
          'header entry "a\\u0000b": the name contains a NUL character (\\u0000)')
    -- an escaped backslash followed by u0000 is six ordinary characters
    write_raw2(path, '{"a\\\\u0000b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', string.pack("<f", 1))
    assert.is_not_nil(k3.load_safetensors(path)["a\\u0000b"])
  end)

  it("a name that is empty or not valid UTF-8 is refused on load", function()
    fails('{"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "header entry 1 has an empty name")
    fails('{"ok\xFFname":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
          'header entry 1: name "ok\\xFFname" is not valid UTF-8 (byte 3)')
    fails('{"\xC0\xAF":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "is not valid UTF-8 (byte 1)")
    fails('{"\xED\xA0\x80":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "is not valid UTF-8 (byte 1)")
    write_raw2(path, '{"caf\xC3\xA9 \xF0\x9F\x98\x80":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', string.pack("<f", 1))
    assert.is_not_nil(k3.load_safetensors(path)["caf\xC3\xA9 \xF0\x9F\x98\x80"])
  end)

  it("a name that is not valid UTF-8 is refused on save, so every JSON reader can read the file", function()
    H.raises(function() k3.save_safetensors(path, {["bad\xFF"] = k3.ones({1})}) end,
             'save_safetensors: ' .. path .. ': tensor 1: name "bad\\xFF" is not valid UTF-8 (byte 4)')
    H.raises(function() k3.save_safetensors(path, {[""] = k3.ones({1})}) end, "has an empty name")
  end)

  it("a header with a byte-order mark is refused", function()
    fails('\xEF\xBB\xBF{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
          "header starts with a UTF-8 byte-order mark (the format is plain JSON)")
  end)

  it("a FIFO is refused at once instead of blocking on open", function()
    local fifo = path .. ".fifo"
    assert(os.execute("mkfifo " .. fifo))
    local t0 = k3.clock()
    H.raises(function() k3.load_safetensors(fifo) end,
             "load_safetensors: " .. fifo .. ": not a regular file (a FIFO)")
    H.raises(function() k3.safetensors_info(fifo) end, "not a regular file (a FIFO)")
    assert.is_true(k3.clock() - t0 < 5)
    os.remove(fifo)
    H.raises(function() k3.load_safetensors("/dev/zero") end, "not a regular file (a character device)")
  end)

  it("a tensor of a dtype k3 cannot hold is refused only when it is picked", function()
    write_raw2(path, '{"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},' ..
                     '"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
               string.pack("<i8ff", 7, 1.5, 2.5))
    H.raises(function() k3.load_safetensors(path) end,
             'tensor "ids": dtype I64 is not loadable (k3 loads BF16, F16, F32, F64, F8_E4M3 and F8_E5M2)')
    assert.are.same({1.5, 2.5}, k3.load_safetensors(path, {names = {"w"}}).w:totable())
    assert.are.same({dtype = "I64", shape = {1}, file = path:match("[^/]+$")},
                    k3.safetensors_info(path).tensors.ids)
  end)
end)

describe("safetensors options and metadata", function()
  local path
  before_each(function()
    path = os.tmpname()
    k3.save_safetensors(path, {["layer.0.w"] = k3.tensor({{1, 2}, {3, 4}}), ["layer.1.w"] = k3.tensor({5, 6}),
                               ["norm"] = k3.tensor({7}, {dtype = "bf16"})},
                        {metadata = {source = "spec", step = "12"}})
  end)
  after_each(function() os.remove(path) end)

  it("names, match and dtype pick and convert; only those are returned", function()
    local t = k3.load_safetensors(path, {names = {"norm", "layer.1.w"}, dtype = "f64"})
    assert.are.same({"layer.1.w", "norm"}, sorted_keys(t))
    assert.are.equal("f64", t.norm:dtype())
    assert.are.same({5, 6}, t["layer.1.w"]:totable())
    local m = k3.load_safetensors(path, {match = "^layer%.%d+%.w$", device = "cpu"})
    assert.are.same({"layer.0.w", "layer.1.w"}, sorted_keys(m))
    assert.are.same({}, k3.load_safetensors(path, {names = {}}))
  end)

  it("a missing name, both selectors, bad values and unknown options raise", function()
    H.raises(function() k3.load_safetensors(path, {names = {"nope"}}) end,
             'load_safetensors: ' .. path .. ': no tensor "nope" (the checkpoint holds 3)')
    H.raises(function() k3.load_safetensors(path, {names = {"norm"}, match = "n"}) end, "give names or match, not both")
    H.raises(function() k3.load_safetensors(path, {match = "[a"}) end,
             "(match is not a valid Lua pattern (malformed pattern (missing ']')): \"[a\")")
    H.raises(function() k3.load_safetensors(path, {match = "n%"}) end,
             "(match is not a valid Lua pattern (malformed pattern (ends with '%')): \"n%\")")
    H.raises(function() k3.load_safetensors(path, {dtype = "i8"}) end, "unknown dtype 'i8'")
    H.raises(function() k3.load_safetensors(path, {device = "tpu"}) end, "unknown device 'tpu'")
    if not k3.backends().cuda.available then -- refused before any tensor is read
      H.raises(function() k3.load_safetensors(path, {device = "cuda"}) end,
               "load_safetensors: device cuda:0 is not available: ")
    else
      H.raises(function() k3.load_safetensors(path, {device = "cuda:1000"}) end,
               "load_safetensors: device cuda:1000 does not exist")
    end
    H.raises(function() k3.load_safetensors(path, {name = {"norm"}}) end,
             "bad argument #2 to 'load_safetensors' (unknown option 'name' (expected names, match, device or dtype))")
    H.raises(function() k3.save_safetensors(path, {}, {meta = {}}) end, "unknown option 'meta' (expected metadata)")
    H.raises(function() k3.save_safetensors(path, {}, {metadata = {n = 1}}) end,
             "metadata keys and values must be strings; got string = number")
  end)

  it("safetensors_info reads headers and metadata without reading data", function()
    local info = k3.safetensors_info(path)
    assert.are.same({format = "pt", source = "spec", step = "12"}, info.metadata)
    assert.are.same({dtype = "F32", shape = {2, 2}, file = path:match("[^/]+$")}, info.tensors["layer.0.w"])
    assert.are.same({dtype = "BF16", shape = {1}, file = path:match("[^/]+$")}, info.tensors.norm)
    k3.save_safetensors(path, {x = k3.ones({1})}, {metadata = {format = "k3"}})
    assert.are.same({format = "k3"}, k3.safetensors_info(path).metadata)
  end)

  it("the mapping is gone when load returns", function()
    local t = k3.load_safetensors(path)
    assert.is_not_nil(t.norm)
    local f = assert(io.open("/proc/self/maps"))
    local maps = f:read("a")
    f:close()
    assert.is_nil(maps:find(path, 1, true), "still mapped: " .. path)
  end)
end)

-- A two-shard checkpoint in the Hugging Face layout: dir/model-0000{1,2}-of-00002.safetensors
-- and dir/model.safetensors.index.json.
local function write_index(dir, map, metadata)
  local names = {}
  for k in pairs(map) do names[#names + 1] = k end
  table.sort(names)
  local parts = {}
  for _, k in ipairs(names) do parts[#parts + 1] = string.format("%q: %q", k, map[k]) end
  local f = assert(io.open(dir .. "/model.safetensors.index.json", "w"))
  f:write('{\n  "metadata": ', metadata or '{"total_size": 40}', ',\n  "weight_map": {\n    ',
          table.concat(parts, ",\n    "), "\n  }\n}\n")
  f:close()
end

describe("safetensors sharded checkpoints", function()
  local dir
  local s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    k3.save_safetensors(dir .. "/" .. s1, {a = k3.tensor({1, 2}), b = k3.tensor({3})})
    k3.save_safetensors(dir .. "/" .. s2, {c = k3.tensor({{4, 5}}, {dtype = "bf16"})})
    write_index(dir, {a = s1, b = s1, c = s2})
  end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  it("loads from the directory or the index, picks across shards, and names each tensor's shard", function()
    for _, p in ipairs({dir, dir .. "/model.safetensors.index.json"}) do
      local t = k3.load_safetensors(p)
      assert.are.same({"a", "b", "c"}, sorted_keys(t))
      assert.are.same({{4, 5}}, t.c:totable())
      local picked = k3.load_safetensors(p, {match = "[bc]", dtype = "f32"})
      assert.are.same({"b", "c"}, sorted_keys(picked))
      assert.are.equal("f32", picked.c:dtype())
      local info = k3.safetensors_info(p)
      assert.are.same({total_size = "40"}, info.metadata)
      assert.are.equal(s1, info.tensors.a.file)
      assert.are.same({dtype = "BF16", shape = {1, 2}, file = s2}, info.tensors.c)
    end
  end)

  it("a directory with one model.safetensors loads too", function()
    os.execute("rm -f " .. dir .. "/*")
    k3.save_safetensors(dir .. "/model.safetensors", {x = k3.tensor({9})})
    assert.are.same({9}, k3.load_safetensors(dir).x:totable())
    os.remove(dir .. "/model.safetensors")
    H.raises(function() k3.load_safetensors(dir) end,
             "the directory holds neither model.safetensors.index.json nor model.safetensors")
  end)

  it("an index that disagrees with its shards, or leaves its directory, is refused", function()
    write_index(dir, {a = s1, b = s2, c = s2})
    H.raises(function() k3.load_safetensors(dir) end,
             'weight_map puts tensor "b" in ' .. s2 .. ", whose header has no such tensor")
    write_index(dir, {a = s1, c = s2})
    H.raises(function() k3.load_safetensors(dir) end,
             'tensor "b" of ' .. s1 .. " is not in the index's weight_map")
    write_index(dir, {a = "../" .. s1})
    H.raises(function() k3.load_safetensors(dir) end,
             "weight_map \"a\": the shard must be a file name inside the index's directory")
    write_index(dir, {a = "/etc/passwd"})
    H.raises(function() k3.load_safetensors(dir) end, "the shard must be a file name inside")
    local f = assert(io.open(dir .. "/model.safetensors.index.json", "w"))
    f:write('{"metadata": {}}')
    f:close()
    H.raises(function() k3.load_safetensors(dir) end, 'index has no "weight_map" object')
  end)

  it("a tensor in two shards is refused", function()
    k3.save_safetensors(dir .. "/" .. s2, {c = k3.tensor({{4, 5}}, {dtype = "bf16"}), a = k3.tensor({0})})
    write_index(dir, {a = s1, b = s1, c = s2})
    H.raises(function() k3.load_safetensors(dir) end, 'tensor "a" appears in ' .. s1 .. " and in " .. s2)
  end)
end)

describe("safetensors on the GPU #gpu", function()
  if not H.require_gpu() then return end
  it("opts.device puts picked tensors of a sharded checkpoint straight on the GPU, converted", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local a, c = k3.randn({64, 48}, {seed = 3}), k3.randn({7}, {dtype = "bf16", seed = 4})
    k3.save_safetensors(dir .. "/s1.safetensors", {a = a})
    k3.save_safetensors(dir .. "/s2.safetensors", {c = c})
    write_index(dir, {a = "s1.safetensors", c = "s2.safetensors"})
    local t = k3.load_safetensors(dir, {device = "cuda", dtype = "bf16"})
    assert.are.equal("cuda:0", t.a:device())
    assert.are.equal("bf16", t.a:dtype())
    assert.are.equal(0, k3.max_abs_diff(t.a:to("cpu"), a:to("bf16")))
    assert.are.equal(0, k3.max_abs_diff(t.c:to("cpu"), c))
    write_raw2(dir .. "/f8.safetensors", '{"w":{"dtype":"F8_E4M3","shape":[256],"data_offsets":[0,256]}}', all_codes())
    local g = k3.load_safetensors(dir .. "/f8.safetensors", {device = "cuda", dtype = "f32"}).w
    local h = k3.load_safetensors(dir .. "/f8.safetensors", {dtype = "f32"}).w
    assert.are.equal("cuda:0", g:device())
    assert.is_true(H.nested_equal(h:totable(), g:to("cpu"):totable()))
    os.execute("rm -rf " .. dir)
  end)
end)
