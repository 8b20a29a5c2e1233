-- LuaRocks package for k3: `luarocks --lua-version 5.4 make --local` in a checkout builds it
-- with the project Makefile (build type "make") and installs the Lua files into
-- share/lua/5.4/k3/ and the C module into lib/lua/5.4/k3/core.so of the chosen tree, with
-- libk3.so (and libk3_cuda.so when built) beside it in lib/lua/5.4/.
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
    -- <tree>/share/lua/5.4; the header and pkg-config file stay in the rock's own folder.
    PREFIX = "$(PREFIX)",
    LIBDIR = "$(LIBDIR)",
    LUACDIR = "$(LIBDIR)",
    LUADIR = "$(LUADIR)",
    INCDIR = "$(PREFIX)/include",
    PCDIR = "$(PREFIX)/pkgconfig",
  },
}
