-- LuaRocks package for k3: `luarocks --lua-version 5.4 make --local` in a checkout builds it
-- with the project Makefile (build type "make") and installs the Lua files into
-- share/lua/5.4/k3/ and the C module into lib/lua/5.4/k3/core.so of the chosen tree, with
-- libk3.so, libk3lua.so (and libk3_cuda.so when built) beside it in lib/lua/5.4/.
--
-- CUDA is optional, and so is not an external_dependencies entry: LuaRocks treats every entry
-- there as required. Its "Dependencies" page (github.com/luarocks/luarocks/wiki/Dependencies):
-- "A rock will only be installed if all its dependencies can be fulfilled", and for an external
-- one whose files are not found "an error message is reported"; an entry may only name a
-- header, library or program (luarocks/type/rockspec.lua), there is no "optional" key, and
-- deps.check_external_deps stops the build at the first entry not found (LuaRocks 3.8). So the
-- Makefile decides: it builds the CUDA backend when it finds nvcc (on PATH or in
-- /usr/local/cuda), and `NVCC= luarocks ... make` (an empty NVCC in the environment) builds
-- without it. The backend is loaded at run time; without it everything runs on the CPU.
--
-- No pkg-config files are installed (INSTALL_PC=0): a .pc file would stay in the rock's own
-- folder (<tree>/lib/luarocks/rocks-5.4/k3/<version>/), on no PKG_CONFIG_PATH, and its libdir,
-- the rock's lib/, is gone once LuaRocks has deployed the libraries to <tree>/lib/lua/5.4 (the
-- deployed folder is no rockspec variable). A C host links k3 from `make install PREFIX=...`.
rockspec_format = "3.0"
package = "k3"
version = "0.1.0-1"

source = {
  url = "git+https://example.invalid/k3.git",
  tag = "v0.1.0",
}

description = {
  summary = "Decode-time kernels of Kimi-K3-style models: C core, Lua 5.4 front end",
  detailed = [[
k3 is an embeddable C library with a Lua 5.4 front end for decode-time kernels (bf16 linear
with a low-latency skinny-GEMM path, the fused AttnRes read, RMSNorm, SwiGLU) on the CPU and,
optionally, NVIDIA GPUs. The CUDA backend is built only when nvcc is found (on PATH or in
/usr/local/cuda, as the Makefile detects it) and is loaded at run time; without it everything
runs on the CPU. LuaRocks has no optional external dependency, so CUDA is not declared as one.
]],
  license = "MIT",
  labels = {"tensor", "inference", "cuda"},
}

dependencies = {
  "lua >= 5.4, < 5.5",
}

external_dependencies = {
  OPENBLAS = {library = "openblas"},
  CJSON = {header = "cjson/cJSON.h", library = "cjson"},
}

build = {
  type = "make",
  build_target = "all",
  build_variables = {
    CC = "$(CC)",
    CFLAGS = "$(CFLAGS)",
    LUA = "$(LUA)",
    LUA_INC = "$(LUA_INCDIR)",
    DEPS_INC = "-I$(CJSON_INCDIR)",
    DEPS_LIB = "-L$(OPENBLAS_LIBDIR) -L$(CJSON_LIBDIR)",
  },
  install_target = "install",
  install_variables = {
    -- LuaRocks deploys the rock's lib/ to <tree>/lib/lua/5.4 and its lua/ to
    -- <tree>/share/lua/5.4; the header stays in the rock's own folder (include/k3.h).
    PREFIX = "$(PREFIX)",
    LIBDIR = "$(LIBDIR)",
    LUACDIR = "$(LIBDIR)",
    LUADIR = "$(LUADIR)",
    INCDIR = "$(PREFIX)/include",
    INSTALL_PC = "0",
  },
}
