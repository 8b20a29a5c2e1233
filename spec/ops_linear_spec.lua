-- linear: every CPU kernel against the fp64 oracle across dtypes, layouts (transposed x,
-- padded weight rows, zero-stride expanded x) and odd sizes, outputs poisoned with NaN; fp32
-- accumulation; batch invariance; and the text of every error a caller can hit.
local k3 = require "k3"
local H = require "spec.helpers"

local DTYPES = {"bf16", "f16", "f32", "f64"}
local TOL = {
  bf16 = {rtol = 1e-2, atol = 1e-2},
  f16 = {rtol = 2e-3, atol = 2e-3},
  f32 = {rtol = 1e-5, atol = 1e-4},
  f64 = {rtol = 1e-12, atol = 1e-10},
}
local KERNELS = {"cpu.linear.blas", "cpu.linear.reference", "cpu.linear.batch_invariant"}

-- The oracle: fp64 inputs (exact widening), naive fp64 accumulation.
local function oracle(x, w, bias, residual)
  local function f64(t) return t and t:to("f64") end
  return k3.linear(f64(x), f64(w), {bias = f64(bias), residual = f64(residual),
                                    kernel = "cpu.linear.reference"})
end

local function close(y, ref, dt)
  local tol = TOL[dt]
  return k3.allclose(y:to("f64"), ref, {atol = tol.atol, rtol = tol.rtol})
end

-- Layouts of x [M,K] and w [N,K], each a view with the given values' shape.
local LAYOUTS = {
  contiguous = function(M, N, K, o)
    return k3.randn({M, K}, {dtype = o.dtype, seed = 1}), k3.randn({N, K}, {dtype = o.dtype, seed = 2})
  end,
  ["transposed x"] = function(M, N, K, o)
    return k3.randn({K, M}, {dtype = o.dtype, seed = 3}):t(), k3.randn({N, K}, {dtype = o.dtype, seed = 4})
  end,
  ["transposed w"] = function(M, N, K, o)
    return k3.randn({M, K}, {dtype = o.dtype, seed = 5}), k3.randn({K, N}, {dtype = o.dtype, seed = 6}):t()
  end,
  ["padded weight rows"] = function(M, N, K, o)
    return H.padded(M, K, 5, {dtype = o.dtype, seed = 7}), H.padded(N, K, 3, {dtype = o.dtype, seed = 8})
  end,
  ["zero-stride expanded x"] = function(M, N, K, o)
    return k3.randn({1, K}, {dtype = o.dtype, seed = 9}):expand({M, K}),
           k3.randn({N, K}, {dtype = o.dtype, seed = 10})
  end,
}
local LAYOUT_ORDER = {"contiguous", "transposed x", "transposed w", "padded weight rows",
                      "zero-stride expanded x"}

describe("linear", function()
  for _, kernel in ipairs(KERNELS) do
    for _, dt in ipairs(DTYPES) do
      for _, lname in ipairs(LAYOUT_ORDER) do
        it(string.format("%s %s %s matches the fp64 oracle (odd sizes, poisoned out)", kernel, dt, lname), function()
          -- 33, 132 and 260 each appear as M, N and K
          for _, size in ipairs({{3, 33, 33}, {5, 17, 132}, {2, 7, 260}, {1, 1, 1},
                                 {33, 132, 260}, {132, 260, 33}, {260, 33, 132}}) do
            local M, N, K = size[1], size[2], size[3]
            local x, w = LAYOUTS[lname](M, N, K, {dtype = dt})
            local out = H.poisoned({M, N}, {dtype = dt})
            local y = k3.linear(x, w, {out = out, kernel = kernel})
            assert.is_false(H.has_nan(y))
            assert.is_true(close(y, oracle(x, w), dt), string.format("M=%d N=%d K=%d", M, N, K))
          end
        end)
      end
      it(string.format("%s %s with bias and residual (padded residual)", kernel, dt), function()
        local M, N, K = 4, 33, 260
        local x = k3.randn({M, K}, {dtype = dt, seed = 11})
        local w = H.padded(N, K, 2, {dtype = dt, seed = 12})
        local bias = k3.randn({N}, {dtype = dt, seed = 13})
        local residual = H.padded(M, N, 7, {dtype = dt, seed = 14})
        local out = H.poisoned({M, N}, {dtype = dt})
        local y = k3.linear(x, w, {bias = bias, residual = residual, out = out, kernel = kernel})
        assert.is_false(H.has_nan(y))
        assert.is_true(close(y, oracle(x, w, bias, residual), dt))
      end)
    end
  end

  -- A 16-bit x is widened in blocks of 256 rows and a 16-bit w in blocks of 2^22 / K rows
  -- (838 at K = 5000): M = 300 and N = 900 end inside a second block of each. The call is full
  -- size; the oracle computes only the checked rows (whole rows of y) and columns (whole
  -- columns of y): the rows on both sides of x's block edge and the columns on both sides of
  -- w's, plus the first and last.
  for _, dt in ipairs({"bf16", "f16", "f32"}) do
    it("cpu.linear.blas " .. dt .. " M=300 N=900 K=5000, w rows padded by 8: the block tails match fp64", function()
      local M, N, K = 300, 900, 5000
      local x = k3.randn({M, K}, {dtype = dt, seed = 41})
      local w = H.padded(N, K, 8, {dtype = dt, seed = 42})
      assert.same({K + 8, 1}, w:stride())
      local out = H.poisoned({M, N}, {dtype = dt})
      local y = k3.linear(x, w, {out = out, kernel = "cpu.linear.blas"})
      assert.is_false(H.has_nan(y))
      local tol = TOL[dt]
      local opts = {rtol = tol.rtol, atol = tol.atol * math.sqrt(K)}
      local x64, w64 = x:to("f64"), w:to("f64")
      local function check(got, want, what)
        assert.is_true(k3.allclose(got:to("f64"), want, opts),
          string.format("%s %s: max diff %g", dt, what, k3.max_abs_diff(got:to("f64"), want)))
      end
      for _, r in ipairs({1, 255, 256, 257, 300}) do
        local want = k3.linear(x64:narrow(1, r, 1), w64, {kernel = "cpu.linear.reference"})
        check(y:narrow(1, r, 1), want, "row " .. r)
      end
      for _, c in ipairs({1, 837, 838, 839, 900}) do
        local want = k3.linear(x64, w64:narrow(1, c, 1), {kernel = "cpu.linear.reference"})
        check(y:narrow(2, c, 1), want, "column " .. c)
      end
    end)
  end

  it("dispatches to cpu.linear.blas by default and returns a new [M, N] tensor", function()
    local x, w = k3.randn({3, 8}), k3.randn({5, 8}, {seed = 1})
    local y = k3.linear(x, w)
    assert.same({3, 5}, y:size())
    assert.equal("f32", y:dtype())
    assert.equal("cpu.linear.blas", k3.explain("linear", x, w).chosen)
  end)

  it("writes a non-contiguous out (a padded view) and leaves its padding alone", function()
    local base = k3.zeros({4, 9})
    local out = base:narrow(2, 1, 6)
    local x, w = k3.randn({4, 5}), k3.randn({6, 5}, {seed = 2})
    for _, kernel in ipairs(KERNELS) do
      base:fill(0 / 0)
      k3.linear(x, w, {out = out, kernel = kernel})
      assert.is_false(H.has_nan(out))
      assert.is_true(close(out, oracle(x, w), "f32"))
      assert.is_true(base:get(1, 9) ~= base:get(1, 9)) -- padding still NaN
    end
  end)

  it("handles M = 0 and K = 0", function()
    local y = k3.linear(k3.randn({0, 4}), k3.randn({3, 4}))
    assert.same({0, 3}, y:size())
    for _, kernel in ipairs(KERNELS) do
      local z = k3.linear(k3.empty({2, 0}), k3.empty({3, 0}), {bias = k3.ones({3}), kernel = kernel})
      assert.same({{1, 1, 1}, {1, 1, 1}}, z:totable())
    end
  end)

  it("accumulates in fp32: ones[1,K] . ones[N,K] is exactly K in bf16 (K = 5120, 7168)", function()
    for _, K in ipairs({5120, 7168}) do
      local x = k3.ones({1, K}, {dtype = "bf16"})
      local w = k3.ones({3, K}, {dtype = "bf16"})
      for _, kernel in ipairs(KERNELS) do
        local y = k3.linear(x, w, {kernel = kernel})
        for n = 1, 3 do assert.equal(K, y:get(1, n), kernel) end
      end
    end
  end)

  it("batch-invariant kernel: row i of a batch equals that row computed alone, bit for bit", function()
    local K, N = 300, 37
    local w = k3.randn({N, K}, {dtype = "bf16", seed = 21})
    local bias = k3.randn({N}, {dtype = "bf16", seed = 22})
    local x = k3.randn({16, K}, {dtype = "bf16", seed = 23})
    local alone = {}
    for i = 1, 16 do
      alone[i] = k3.linear(x:narrow(1, i, 1), w, {bias = bias, kernel = "cpu.linear.batch_invariant"})
    end
    for M = 1, 16 do
      local y = k3.linear(x:narrow(1, 1, M), w, {bias = bias, kernel = "cpu.linear.batch_invariant"})
      for i = 1, M do
        assert.equal(0, k3.max_abs_diff(y:narrow(1, i, 1), alone[i]), string.format("M=%d row %d", M, i))
      end
    end
  end)

  -- M = 1 runs cblas_?gemv, not ?gemm: every layout of x (row, column of a transposed
  -- matrix, padded) and w (row-major, transposed, padded rows) with bias and residual.
  it("cpu.linear.blas at M = 1 (the gemv path): every x and w layout, every dtype", function()
    for _, dt in ipairs(DTYPES) do
      for _, K in ipairs({1, 7, 64}) do
        for _, N in ipairs({1, 5, 33}) do
          local o = {dtype = dt, seed = K * 100 + N}
          local xs = {k3.randn({1, K}, o), k3.randn({K, 1}, o):t(),
                      k3.randn({3, K + 2}, o):narrow(2, 2, K):narrow(1, 2, 1)}
          local ws = {k3.randn({N, K}, o), k3.randn({K, N}, o):t(), k3.randn({N, K + 3}, o):narrow(2, 1, K)}
          local b, r = k3.randn({N}, o), k3.randn({1, N}, o)
          for xi, x in ipairs(xs) do
            for wi, w in ipairs(ws) do
              local out = H.poisoned({1, N}, {dtype = dt})
              local y = k3.linear(x, w, {bias = b, residual = r, out = out, kernel = "cpu.linear.blas"})
              local ref = k3.linear(x:to("f64"), w:to("f64"), {bias = b:to("f64"), residual = r:to("f64"),
                                                               kernel = "cpu.linear.reference"})
              local tol = TOL[dt]
              assert.is_true(k3.allclose(y:to("f64"), ref, {rtol = tol.rtol, atol = tol.atol * math.sqrt(K)}),
                string.format("%s K=%d N=%d x layout %d w layout %d: max diff %g", dt, K, N, xi, wi,
                              k3.max_abs_diff(y:to("f64"), ref)))
            end
          end
        end
      end
    end
  end)

  describe("errors", function()
    local x, w = k3.randn({3, 8}), k3.randn({5, 8}, {seed = 1})

    it("K mismatch", function()
      H.raises(function() k3.linear(k3.randn({3, 7000}), k3.randn({4, 7168})) end,
        "linear: x dim 2 (7000) must match w dim 2 (7168)")
    end)
    it("wrong rank of x and w", function()
      H.raises(function() k3.linear(k3.randn({2, 3, 8}), w) end,
        "linear: x must be 2-D [M, K]; got 3-D [2, 3, 8]")
      H.raises(function() k3.linear(x, k3.randn({8})) end,
        "linear: w must be 2-D [N, K]; got 1-D [8]")
    end)
    it("dtype mismatch", function()
      H.raises(function() k3.linear(x, k3.randn({5, 8}, {dtype = "bf16"})) end,
        "linear: w dtype (bf16) must match x dtype (f32)")
      H.raises(function() k3.linear(x, w, {bias = k3.randn({5}, {dtype = "f64"})}) end,
        "linear: bias dtype (f64) must match x dtype (f32)")
    end)
    it("bias and residual shapes", function()
      H.raises(function() k3.linear(x, w, {bias = k3.randn({6})}) end,
        "linear: bias must be [N] = [5] (w dim 1); got [6]")
      H.raises(function() k3.linear(x, w, {residual = k3.randn({3, 4})}) end,
        "linear: residual must be [M, N] = [3, 5]; got [3, 4]")
    end)
    it("out shape, dtype, overlap and broadcast out", function()
      H.raises(function() k3.linear(x, w, {out = k3.empty({3, 4})}) end,
        "linear: out must be [3, 5]; got [3, 4]")
      H.raises(function() k3.linear(x, w, {out = k3.empty({3, 5}, {dtype = "f64"})}) end,
        "linear: out dtype (f64) must be f32")
      local big = k3.randn({5, 8})
      H.raises(function() k3.linear(big:narrow(2, 1, 5), k3.randn({5, 5}), {out = big:narrow(2, 1, 5)}) end,
        "linear: out overlaps x")
      H.raises(function() k3.linear(x, w, {out = k3.empty({1, 5}):expand({3, 5})}) end,
        "linear: out is written but its elements overlap (shape [3, 5], strides [0, 1])")
    end)
    it("kernel names: unknown, another op's, not registered", function()
      H.raises(function() k3.linear(x, w, {kernel = "cpu.linear.nope"}) end,
        "linear: unknown kernel 'cpu.linear.nope' (known for linear: cpu.linear.blas, cpu.linear.reference, " ..
        "cpu.linear.batch_invariant, cuda.linear.cublas, cuda.linear.skinny, cuda.linear.batch_invariant)")
      H.raises(function() k3.linear(x, w, {kernel = "cpu.rms_norm.reference"}) end,
        "linear: kernel 'cpu.rms_norm.reference' is for op rms_norm, not linear")
      if not k3.has_kernel("cuda.linear.cublas") then
        H.raises(function() k3.linear(x, w, {kernel = "cuda.linear.cublas"}) end,
          "linear: kernel 'cuda.linear.cublas' is " .. H.cuda_absent_reason())
      end
    end)
    it("a dimension over 2^31-1 (zero-stride views, nothing allocated): cpu.linear.blas declines it", function()
      local big = k3.ones({1, 1}):expand({1, 2 ^ 31})
      assert.same({1, 2 ^ 31}, big:size())
      -- BLAS takes int sizes: blas's supports() declines K = 2^31, so dispatch (and explain)
      -- go to the next candidate; forced, blas's run refuses it in words.
      local e = k3.explain("linear", big, big)
      assert.equal("cpu.linear.reference", e.chosen)
      local found
      for _, d in ipairs(e.declined) do
        if d.kernel == "cpu.linear.blas" then found = d.reason end
      end
      assert.equal("cpu.linear.blas supports M, N and K up to 2^31-1 (BLAS takes int); got M 1, N 1, K 2147483648", found)
      H.raises(function() k3.linear(big, big, {kernel = "cpu.linear.blas"}) end,
               "linear: cpu.linear.blas: a dimension exceeds 2^31-1")
    end)
    it("a freed input, named as the argument or the option it is", function()
      local z = k3.randn({3, 8})
      z:free()
      H.raises(function() k3.linear(z, w) end, "bad argument #1 to 'linear' (tensor has been freed)")
      H.raises(function() k3.linear(x, z) end, "bad argument #2 to 'linear' (tensor has been freed)")
      H.raises(function() k3.linear(x, w, {out = z}) end, "bad argument #3 to 'linear' (field 'out': tensor has been freed)")
      H.raises(function() k3.linear(x, w, {bias = z}) end, "bad argument #3 to 'linear' (field 'bias': tensor has been freed)")
      -- the operand of a metamethod has no argument number: the operation is named
      H.raises_exact(function() return z + z end, "tensor has been freed (the operand of +)")
    end)
    it("changes nothing when it raises", function()
      local out = H.poisoned({3, 5})
      H.raises(function() k3.linear(x, w, {bias = k3.randn({6}), out = out}) end, "linear: bias")
      local v = out:get(2, 2)
      assert.is_true(v ~= v) -- still the poison
    end)
  end)
end)

describe("the CPU linear sources", function()
  -- OpenBLAS's cblas.h happens to include <stdio.h>; the reference CBLAS header (netlib's,
  -- from libblas-dev) does not, so building against it shows every header a file needs itself.
  it("build against the reference CBLAS header as well as OpenBLAS's", function()
    local netlib = "/usr/include/x86_64-linux-gnu/cblas-netlib.h"
    local f = io.open(netlib, "r")
    if not f then
      pending(netlib .. " is missing (libblas-dev): the reference CBLAS header is not installed")
      return
    end
    f:close()
    local root = H.root()
    local files = H.sh("grep -rl '#include <cblas.h>' " .. root .. "/lib")
    assert.truthy(files:find("%.c\n"), "no source under lib/ includes <cblas.h>")
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir))
    assert(os.execute("ln -s " .. netlib .. " " .. dir .. "/cblas.h"))
    local failures = {}
    for file in files:gmatch("[^\n]+") do
      local out, code = H.sh(("%s -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE " ..
        "-fsyntax-only -I%s -I%s/lib %s"):format(os.getenv("CC") or "cc", dir, root, file))
      if code ~= 0 then failures[#failures + 1] = file .. "\n" .. out end
    end
    os.execute("rm -r " .. dir)
    assert.are.equal("", table.concat(failures, "\n"))
  end)
end)

-- The silu_mul prologue: y = silu_mul(x) w^T with x [M, 2K] (gate | up). Every CPU kernel
-- against the fp64 oracle over dtypes and layouts of x (the gate and up halves of a padded,
-- odd-offset or broadcast x), fused == silu_mul then linear bit for bit on each kernel, outputs
-- poisoned with NaN, through a method as through k3.linear, and the refusals.
describe("linear with prologue silu_mul", function()
  -- [M, 2K] gate | up values: gates ~ 3 N(0, 1) (silu's both regimes), ups ~ N(0, 1).
  local function values(M, K, dt, seed)
    local v = k3.randn({M, 2 * K}, {dtype = dt, seed = seed})
    local g = v:narrow(2, 1, K)
    g:copy(g * 3)
    return v
  end
  -- x [M, 2K] in a layout with unit last stride (what silu_mul reads).
  local XLAYOUTS = {
    contiguous = function(M, K, dt, seed) return values(M, K, dt, seed) end,
    ["padded rows"] = function(M, K, dt, seed)
      local x = H.padded(M, 2 * K, 5, {dtype = dt})
      x:copy(values(M, K, dt, seed))
      return x
    end,
    ["odd offset"] = function(M, K, dt, seed)
      local x = k3.empty({M * 2 * K + 1}, {dtype = dt}):narrow(1, 2, M * 2 * K):view({M, 2 * K})
      x:copy(values(M, K, dt, seed))
      return x
    end,
    ["zero-stride rows"] = function(M, K, dt, seed) return values(1, K, dt, seed):expand({M, 2 * K}) end,
  }
  local XORDER = {"contiguous", "padded rows", "odd offset", "zero-stride rows"}
  local function gate_up(M, K, dt, layout, seed) return XLAYOUTS[layout](M, K, dt, seed) end
  -- h is rounded to x's dtype before the product (as silu_mul rounds it): the fp64 oracle
  -- differs by that rounding, |h| up to ~10, summed over K.
  local function oracle_opts(dt, K)
    local tol = TOL[dt]
    return {atol = tol.atol * 4 * math.sqrt(K), rtol = tol.rtol}
  end
  local function oracle(x, w, bias, residual)
    local function f64(t) return t and t:to("f64") end
    return k3.linear(f64(x), f64(w), {bias = f64(bias), residual = f64(residual),
                                      prologue = "silu_mul", kernel = "cpu.linear.reference"})
  end

  for _, kernel in ipairs(KERNELS) do
    for _, dt in ipairs(DTYPES) do
      for _, lname in ipairs(XORDER) do
        it(string.format("%s %s x %s: fp64 oracle, and the bits of silu_mul then linear", kernel, dt, lname), function()
          for _, size in ipairs({{3, 33, 33}, {5, 17, 132}, {1, 7, 260}, {1, 1, 1}, {33, 132, 8}}) do
            local M, N, K = size[1], size[2], size[3]
            local what = string.format("M=%d N=%d K=%d", M, N, K)
            local x = gate_up(M, K, dt, lname, M * 1000 + K)
            local w = k3.randn({N, K}, {dtype = dt, seed = N}) * (1 / math.sqrt(K))
            local bias = k3.randn({N}, {dtype = dt, seed = 3})
            local out = H.poisoned({M, N}, {dtype = dt})
            local y = k3.linear(x, w, {bias = bias, prologue = "silu_mul", out = out, kernel = kernel})
            assert.is_false(H.has_nan(y), what)
            local ref = oracle(x, w, bias)
            assert.is_true(k3.allclose(y:to("f64"), ref, oracle_opts(dt, K)),
              string.format("%s: max diff %g", what, k3.max_abs_diff(y:to("f64"), ref)))
            local unfused = k3.linear(k3.silu_mul(x), w, {bias = bias, kernel = kernel})
            assert.equal(0, k3.max_abs_diff(y, unfused), what .. ": fused differs from silu_mul then linear")
          end
        end)
      end
      it(string.format("%s %s: residual and padded w, the bits of silu_mul then linear", kernel, dt), function()
        local M, N, K = 4, 33, 132
        local x = gate_up(M, K, dt, "contiguous", 51)
        local w = H.padded(N, K, 2, {dtype = dt, seed = 52})
        local residual = H.padded(M, N, 7, {dtype = dt, seed = 53})
        local out = H.poisoned({M, N}, {dtype = dt})
        local y = k3.linear(x, w, {residual = residual, prologue = "silu_mul", out = out, kernel = kernel})
        assert.is_false(H.has_nan(y))
        assert.is_true(k3.allclose(y:to("f64"), oracle(x, w, nil, residual), oracle_opts(dt, K)))
        assert.equal(0, k3.max_abs_diff(y, k3.linear(k3.silu_mul(x), w, {residual = residual, kernel = kernel})))
      end)
    end
  end

  it("the gate's special values: silu(-inf) = 0, silu(inf) = inf, NaN stays NaN, as silu_mul", function()
    -- One token per special gate, K = 1 and w = 1: y is h itself.
    local x = k3.tensor({{-math.huge, 3}, {math.huge, 2}, {0 / 0, 5}, {-1e30, 7}, {-90, 1}}, {dtype = "f32"})
    local w = k3.ones({1, 1})
    local h = k3.silu_mul(x)
    for _, kernel in ipairs(KERNELS) do
      local y = k3.linear(x, w, {prologue = "silu_mul", kernel = kernel})
      assert.equal(0, y:get(1, 1), kernel)
      assert.equal(math.huge, y:get(2, 1), kernel)
      assert.is_true(y:get(3, 1) ~= y:get(3, 1), kernel)
      for i = 4, 5 do assert.equal(h:get(i, 1), y:get(i, 1), kernel) end
    end
  end)

  it("the batch-invariant kernel keeps rows invariant across M with the prologue", function()
    local K, N = 300, 37
    local w = k3.randn({N, K}, {dtype = "bf16", seed = 61})
    local x = k3.randn({16, 2 * K}, {dtype = "bf16", seed = 62})
    for M = 1, 16 do
      local y = k3.linear(x:narrow(1, 1, M), w, {prologue = "silu_mul", kernel = "cpu.linear.batch_invariant"})
      for i = 1, M, 5 do
        local alone = k3.linear(x:narrow(1, i, 1), w, {prologue = "silu_mul", kernel = "cpu.linear.batch_invariant"})
        assert.equal(0, k3.max_abs_diff(y:narrow(1, i, 1), alone), string.format("M=%d row %d", M, i))
      end
    end
  end)

  it("dispatches like the plain linear, through k3.linear, k3.explain and a method's apply", function()
    local x = k3.randn({3, 16}, {dtype = "bf16", seed = 71})
    local w = k3.randn({5, 8}, {dtype = "bf16", seed = 72})
    local want = k3.linear(k3.silu_mul(x), w)
    assert.equal("cpu.linear.blas", k3.explain("linear", x, w, {prologue = "silu_mul"}).chosen)
    assert.equal(0, k3.max_abs_diff(k3.linear(x, w, {prologue = "silu_mul"}), want))
    local ll = k3.method.low_latency({[3] = {kernel = "skinny"}}, {static_weights = true})
    local e = ll:explain(x, w, nil, {prologue = "silu_mul"})
    assert.equal("cpu.linear.blas", e.chosen)
    assert.equal(0, k3.max_abs_diff(ll:apply(x, w, nil, {prologue = "silu_mul"}), want))
    assert.equal(0, k3.max_abs_diff(k3.method.default():apply(x, w, nil, {prologue = "silu_mul"}), want))
    local trace = k3.trace(function() k3.linear(x, w, {prologue = "silu_mul"}) end)
    assert.equal(1, #trace)
    assert.equal("linear", trace[1].op)
  end)

  it("handles M = 0 and K = 0", function()
    for _, kernel in ipairs(KERNELS) do
      assert.same({0, 3}, k3.linear(k3.randn({0, 8}), k3.randn({3, 4}), {prologue = "silu_mul", kernel = kernel}):size())
      local z = k3.linear(k3.empty({2, 0}), k3.empty({3, 0}), {bias = k3.ones({3}), prologue = "silu_mul", kernel = kernel})
      assert.same({{1, 1, 1}, {1, 1, 1}}, z:totable())
    end
  end)

  describe("errors", function()
    local w = k3.randn({5, 4}, {seed = 1})
    it("x dim 2 must be 2K", function()
      H.raises(function() k3.linear(k3.randn({3, 4}), w, {prologue = "silu_mul"}) end,
        "linear: x dim 2 (4) must be 2 * w dim 2 (4) = 8 for prologue silu_mul")
      H.raises(function() k3.linear(k3.randn({3, 9}), w, {prologue = "silu_mul"}) end,
        "linear: x dim 2 (9) must be 2 * w dim 2 (4) = 8 for prologue silu_mul")
      H.raises(function() k3.linear(k3.randn({3, 8, 1}), w, {prologue = "silu_mul"}) end,
        "linear: x must be 2-D [M, 2K]; got 3-D [3, 8, 1]")
    end)
    it("x must have unit stride in its last dim", function()
      H.raises(function() k3.linear(k3.randn({8, 3}):t(), w, {prologue = "silu_mul"}) end,
        "linear: x must have unit stride in its last dim; got strides [1, 3]")
    end)
    it("the option names silu_mul or nothing", function()
      H.raises(function() k3.linear(k3.randn({3, 8}), w, {prologue = "SiLU"}) end,
        "field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got \"SiLU\"")
      H.raises(function() k3.linear(k3.randn({3, 8}), w, {prologue = 1}) end,
        "field 'prologue' must be \"silu_mul\", \"rms_norm\" or nil; got number")
    end)
    it("changes nothing when it raises", function()
      local out = H.poisoned({3, 5})
      H.raises(function() k3.linear(k3.randn({3, 6}), w, {prologue = "silu_mul", out = out}) end, "linear: x dim 2")
      local v = out:get(2, 2)
      assert.is_true(v ~= v)
    end)
  end)
end)

-- The rms_norm prologue: y = rms_norm(x, norm_weight, eps) w^T. Every CPU kernel gives the bits
-- of k3.rms_norm followed by the same kernel, over dtypes, views of x with a row stride (a
-- narrow of a wider projection output, as the stack's q_b reads it), rows whose sum of squares
-- overflows or underflows (rms_norm's rescaled pass) and norm weights of another dtype; the fp64
-- oracle; and the refusals.
describe("linear with prologue rms_norm", function()
  local function rows_of(M, K, dt, kind, seed)
    local base = k3.randn({M, K + 11}, {dtype = "f32", seed = seed})
    if kind == "huge" then base = base * 1e30 elseif kind == "tiny" then base = base * 1e-30 end
    return base:to(dt):narrow(2, 4, K) -- row stride K + 11, offset 3
  end
  for _, kernel in ipairs(KERNELS) do
    for _, dt in ipairs(DTYPES) do
      it(string.format("%s %s: the bits of rms_norm then linear, and the fp64 oracle", kernel, dt), function()
        for _, kind in ipairs({"plain", "huge", "tiny"}) do
          for _, size in ipairs({{3, 33, 33}, {5, 17, 260}, {1, 7, 8}, {16, 24, 1536}}) do
            local M, N, K = size[1], size[2], size[3]
            if not (kind ~= "plain" and dt ~= "f32" and dt ~= "bf16") then -- 1e30 is inf in f16
              local what = string.format("%s M=%d N=%d K=%d", kind, M, N, K)
              local x = rows_of(M, K, dt, kind, M + K)
              local nw = (k3.randn({K}, {seed = K}) * 0.1 + 1):to(dt)
              local w = k3.randn({N, K}, {dtype = dt, seed = N}) * (1 / math.sqrt(K))
              local eps = kind == "tiny" and 0 or 1e-5
              local out = H.poisoned({M, N}, {dtype = dt})
              local y = k3.linear(x, w, {prologue = "rms_norm", norm_weight = nw, eps = eps, out = out, kernel = kernel})
              assert.is_false(H.has_nan(y), what)
              local unfused = k3.linear(k3.rms_norm(x, nw, eps), w, {kernel = kernel})
              assert.equal(0, k3.max_abs_diff(y, unfused), what .. ": fused differs from rms_norm then linear")
              local f = function(t) return t:to("f64") end
              local ref = k3.linear(k3.rms_norm(f(x), f(nw), eps), f(w), {kernel = "cpu.linear.reference"})
              local tol = TOL[dt]
              assert.is_true(k3.allclose(f(y), ref, {atol = tol.atol * 4 * math.sqrt(K), rtol = tol.rtol}),
                string.format("%s: max diff %g", what, k3.max_abs_diff(f(y), ref)))
            end
          end
        end
      end)
    end
  end

  it("a norm weight of another dtype than x, with bias and residual, through a method", function()
    local x = k3.randn({4, 64}, {dtype = "bf16", seed = 81})
    local nw = k3.randn({64}, {dtype = "f32", seed = 82})
    local w = k3.randn({9, 64}, {dtype = "bf16", seed = 83})
    local b, r = k3.randn({9}, {dtype = "bf16", seed = 84}), k3.randn({4, 9}, {dtype = "bf16", seed = 85})
    local want = k3.linear(k3.rms_norm(x, nw, 1e-6), w, {bias = b, residual = r})
    local opts = {prologue = "rms_norm", norm_weight = nw, eps = 1e-6}
    assert.equal(0, k3.max_abs_diff(k3.linear(x, w, {bias = b, residual = r, prologue = "rms_norm",
                                                      norm_weight = nw, eps = 1e-6}), want))
    local ll = k3.method.low_latency({[4] = {kernel = "skinny"}}, {static_weights = true})
    assert.equal(0, k3.max_abs_diff(ll:apply(x, w, b, {residual = r, prologue = "rms_norm", norm_weight = nw, eps = 1e-6}), want))
    assert.equal("cpu.linear.blas", ll:explain(x, w, b, opts).chosen)
    -- the default eps is rms_norm's, 1e-5
    assert.equal(0, k3.max_abs_diff(k3.linear(x, w, {prologue = "rms_norm", norm_weight = nw}),
                                    k3.linear(k3.rms_norm(x, nw, 1e-5), w)))
  end)

  describe("errors", function()
    local x, w = k3.randn({3, 4}), k3.randn({5, 4}, {seed = 1})
    it("norm_weight and eps", function()
      H.raises(function() k3.linear(x, w, {prologue = "rms_norm"}) end, "linear: norm_weight is required")
      H.raises(function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = k3.ones({5})}) end,
        "linear: norm_weight must be [K] = [4] (w dim 2); got [5]")
      H.raises(function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = k3.ones({2, 2})}) end,
        "linear: norm_weight must be [K] = [4] (w dim 2); got [2, 2]")
      H.raises(function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = k3.ones({4}), eps = math.huge}) end,
        "linear: eps must be a finite number >= 0; got inf")
      H.raises(function() k3.linear(x, w, {prologue = "silu_mul", norm_weight = k3.ones({4})}) end,
        "linear: norm_weight is given but the prologue is not rms_norm")
      H.raises(function() k3.linear(x, w, {prologue = "silu_mul", eps = 1e-5}) end,
        "field 'eps' is for prologue \"rms_norm\" only")
    end)
    it("x must have unit stride in its last dim; norm_weight too", function()
      H.raises(function() k3.linear(k3.randn({4, 3}):t(), w, {prologue = "rms_norm", norm_weight = k3.ones({4})}) end,
        "linear: x must have unit stride in its last dim; got strides [1, 3]")
      H.raises(function() k3.linear(x, w, {prologue = "rms_norm", norm_weight = k3.ones({4, 2}):select(2, 1)}) end,
        "linear: norm_weight must have unit stride in its last dim; got strides [2]")
    end)
  end)
end)
