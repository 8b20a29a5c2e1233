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

    it("a header length beyond the file, up to 2^64 - 1", function()
      write_raw(path, good_header, f32s(1, 2, 3, 4, 5, 6), 1 << 40)
      load_fails("header length 1099511627776 is longer than the file")
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
