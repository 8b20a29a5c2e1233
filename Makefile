# k3 — build, test and install.
#   make            libk3 (core), the Lua module and, where nvcc exists, the CUDA backend
#   make test       installs missing Debian packages (as root), builds, runs every spec
#   make demo       the Kimi-K3 decode stack on the embedded default configuration
# Outputs go to build/. LUA_INC / LUA_LIBDIR point at a Lua 5.4 elsewhere (GPU machine).

CC        ?= cc
NVCC      ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
LUA       ?= lua5.4
LUA_INC   ?= /usr/include/lua5.4
DEPS_INC  ?=
DEPS_LIB  ?=
BUILD     ?= build
SANITIZE  ?=
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90

SHELL     := /bin/bash
OPT       ?= -O2
CFLAGS_K3  = -std=c11 $(OPT) -g -fPIC -Wall -Wextra -Werror -Wno-unused-parameter \
             -fvisibility=hidden -fno-semantic-interposition -D_GNU_SOURCE -ffp-contract=off \
             -Ilib $(SANITIZE) $(DEPS_INC)
LDFLAGS_K3 = $(SANITIZE) $(DEPS_LIB)

# The core: lib/*.c and the CPU kernels in lib/cpu/. The Lua binding, lib/lua/, is apart: the
# only sources built against lua.h.
CORE_SRC  = $(wildcard lib/*.c) $(wildcard lib/cpu/*.c)
CORE_OBJ  = $(patsubst lib/%.c,$(BUILD)/obj/%.o,$(CORE_SRC))
LUA_SRC   = $(wildcard lib/lua/*.c)
LUA_OBJ   = $(patsubst lib/%.c,$(BUILD)/obj/%.o,$(LUA_SRC))
CU_SRC    = $(wildcard kernels/*.cu)
CU_OBJ    = $(patsubst kernels/%.cu,$(BUILD)/cuobj/%.o,$(CU_SRC))
HEADERS   = $(wildcard lib/*.h) $(wildcard lib/*.def) $(wildcard lib/lua/*.h) $(wildcard kernels/*.h) \
            $(wildcard kernels/*.cuh)

LIBK3     = $(BUILD)/libk3.so
LIBK3LUA  = $(BUILD)/libk3lua.so
LUAMOD    = $(BUILD)/lua/k3/core.so
LIBCUDA   = $(BUILD)/libk3_cuda.so

TARGETS   = $(LIBK3) $(LIBK3LUA) $(LUAMOD)
ifneq ($(NVCC),)
ifneq ($(strip $(CU_SRC)),)
TARGETS  += $(LIBCUDA)
endif
endif

.PHONY: all test deps demo clean install leak-check
all: $(TARGETS)

# The core's objects depend on the flags they were built with: a changed OPT, SANITIZE or
# CFLAGS_K3 rewrites $(BUILD)/.cflags, and that rebuilds them (make alone only sees dates).
FLAGS_FILE = $(BUILD)/.cflags
FLAGS_TEXT = $(CC) $(CFLAGS_K3) | $(LUA_INC)
$(FLAGS_FILE): FORCE
	@mkdir -p $(BUILD)
	@echo '$(FLAGS_TEXT)' | cmp -s - $@ || echo '$(FLAGS_TEXT)' > $@
.PHONY: FORCE
FORCE:

$(BUILD)/obj/%.o: lib/%.c $(HEADERS) $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_K3) -c $< -o $@

$(LIBK3): $(CORE_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS_K3) -Wl,-soname,libk3.so -Wl,-Bsymbolic-functions -lopenblas -lcjson -ldl -lm -lpthread

$(BUILD)/obj/lua/%.o: lib/lua/%.c $(HEADERS) $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_K3) -I$(LUA_INC) -c $< -o $@

$(LIBK3LUA): $(LUA_OBJ) $(LIBK3)
	$(CC) -shared -o $@ $(LUA_OBJ) $(LDFLAGS_K3) -L$(BUILD) -lk3 -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../..' -Wl,-soname,libk3lua.so

$(LUAMOD): $(LIBK3LUA)
	@mkdir -p $(dir $@)
	ln -sf ../../libk3lua.so $@

NVFLAGS = -std=c++17 -O3 $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-Wall \
          -Ilib -lineinfo $(DEPS_INC)

$(BUILD)/cuobj/%.o: kernels/%.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIBCUDA): $(CU_OBJ) $(LIBK3)
	$(NVCC) -shared -o $@ $(CU_OBJ) -L$(BUILD) -lk3 -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart \
	    -Xlinker -rpath,'$$ORIGIN' -Xlinker -rpath,$(CUDA_HOME)/lib64

# Debian packages k3 needs to build and test (lua-dkjson: scripts/bench's JSON); installed when
# missing and run as root.
DEB_PKGS = lua5.4 liblua5.4-dev lua-busted lua-dkjson libopenblas-dev libcjson-dev pkg-config
deps:
	@scripts/deps $(DEB_PKGS)

test: deps
	@$(MAKE) --no-print-directory all embed
	@scripts/run-specs

# The demo builds the CUDA backend only where a GPU device node exists: on a CPU-only machine
# with nvcc, compiling kernels/*.cu (about 2.5 min on 2 cores) would be most of the demo's
# time for a backend that cannot run there. `make` (or `make test`) still builds it.
DEMO_TARGETS = $(filter-out $(if $(wildcard /dev/nvidia[0-9]*),,$(LIBCUDA)),$(TARGETS))
# WEIGHTS=PATH: a checkpoint (file, folder or index) instead of generated weights; DEMO_ARGS:
# more options for scripts/demo.lua (`make demo WEIGHTS=ckpt/ DEMO_ARGS="--config tiny"`).
demo: $(DEMO_TARGETS)
	@scripts/k3 scripts/demo.lua $(if $(WEIGHTS),--weights '$(WEIGHTS)') $(DEMO_ARGS)

# valgrind (memcheck) over spec/scripts/leak_check.lua (tensors, ops, methods, trace, policy, and
# their failing versions) and over the game-loop host's clean run (scripts/leak-check says what
# each covers); each fails on a definite or indirect leak or any memory error (ld.so's own rpath
# reads are suppressed: spec/scripts/valgrind.supp says why). Prints "N passed, M failed".
# valgrind is installed here only (LEAK_PKGS): `make test` does not need it.
LEAK_PKGS = valgrind
leak-check:
	@scripts/deps $(DEB_PKGS) $(LEAK_PKGS)
	@$(MAKE) --no-print-directory all host
	@BUILD="$(BUILD)" LUA="$(LUA)" scripts/leak-check

clean:
	rm -rf $(BUILD)

# ---- reliability: sanitizers and fuzzing ------------------------------------------------------
#   make test-asan    the whole CPU spec suite against a k3 built with ASan + UBSan (build/asan/)
#   make fuzz-smoke   each libFuzzer target (spec/fuzz/) from its committed corpus, deterministic:
#                     fixed seed (FUZZ_SEED), fixed number of inputs (FUZZ_RUNS); what CI runs
#   make fuzz-explore each target for FUZZ_TIME seconds with a random seed (finds new inputs)
#   make fuzz         builds the fuzzers only (build/fuzz/fuzz_<target>)
ASAN_BUILD  ?= build/asan
ASAN_FLAGS  ?= -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
FUZZ_BUILD  ?= build/fuzz
FUZZ_CC     ?= clang
FUZZ_TIME   ?= 600
FUZZ_NAMES   = tensor ops safetensors
FUZZ_BINS    = $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_NAMES))
FUZZ_CFLAGS  = -std=c11 -g -O1 -D_GNU_SOURCE -Ilib -Wall -Wno-unused-parameter \
               -fno-omit-frame-pointer -fno-sanitize-recover=all $(DEPS_INC)
FUZZ_OBJ     = $(patsubst lib/%.c,$(FUZZ_BUILD)/obj/%.o,$(CORE_SRC))

.PHONY: asan test-asan fuzz fuzz-smoke fuzz-explore
asan:
	@$(MAKE) --no-print-directory BUILD=$(ASAN_BUILD) SANITIZE="$(ASAN_FLAGS)" OPT=-O1 NVCC= all host

test-asan: deps
	@$(MAKE) --no-print-directory all asan
	@K3_BUILD_DIR="$(CURDIR)/$(ASAN_BUILD)" scripts/test-asan

# The core is instrumented for coverage (fuzzer-no-link); each target links it with libFuzzer.
$(FUZZ_BUILD)/obj/%.o: lib/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: spec/fuzz/fuzz_%.c $(FUZZ_OBJ) spec/fuzz/fuzz_common.h
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined $< $(FUZZ_OBJ) -o $@ \
	    $(DEPS_LIB) -lopenblas -lcjson -ldl -lm -lpthread

.PRECIOUS: $(FUZZ_BUILD)/obj/%.o
fuzz: $(FUZZ_BINS)

fuzz-smoke: fuzz
	@FUZZ_BUILD="$(FUZZ_BUILD)" scripts/fuzz-smoke $(FUZZ_NAMES)

fuzz-explore: fuzz
	@FUZZ_BUILD="$(FUZZ_BUILD)" FUZZ_TIME="$(FUZZ_TIME)" scripts/fuzz-smoke --explore $(FUZZ_NAMES)

# ==== embedding: example host, install, pkg-config ===============================================
#   make host                       build/examples/host/k3-host (the game-loop host example)
#   make capi                       build/examples/capi/attn_res (C API example, in-tree flags)
#   make install PREFIX=/opt/k3     libk3.so, libk3lua.so, k3.h, the library's Lua files (not the
#                                   benchmarks or the demos), the C module k3/core.so, k3.pc and
#                                   k3-lua.pc (DESTDIR is honoured)
# EMBED_TARGETS: the example host and C API program; `make test` builds them (host specs).
PREFIX    ?= /usr/local
LIBDIR    ?= $(PREFIX)/lib
INCDIR    ?= $(PREFIX)/include
LUADIR    ?= $(PREFIX)/share/lua/5.4
LUACDIR   ?= $(PREFIX)/lib/lua/5.4
PCDIR     ?= $(LIBDIR)/pkgconfig
LUA_LIB   ?= lua5.4
HOST_BIN   = $(BUILD)/examples/host/k3-host
CAPI_BIN   = $(BUILD)/examples/capi/attn_res
EMBED_TARGETS = $(HOST_BIN) $(CAPI_BIN)
CFLAGS_EX  = -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE $(SANITIZE)
# The installed binding: one object installed as PREFIX/lib/libk3lua.so and as the Lua C module
# PREFIX/lib/lua/5.4/k3/core.so; its rpath finds libk3.so from either place, and from a
# LuaRocks tree (where libk3.so is deployed beside the k3/ module folder).
INSTALL_LUAMOD = $(BUILD)/install/libk3lua.so
# The Lua files a library user requires: the module, its policies, dist, nn and the model layers.
# The benchmarks (lua/k3/bench/), the demos' mains (lua/k3/model/decode_demo*.lua) and what only
# the scripts share (lua/k3/cli.lua) run from the checkout.
K3_LUA_FILES = $(filter-out lua/k3/bench/% lua/k3/model/decode_demo% lua/k3/cli.lua,\
                 $(shell find lua/k3 -name '*.lua' | sort))

.PHONY: host capi embed install uninstall
host: $(HOST_BIN)
capi: $(CAPI_BIN)
embed: $(EMBED_TARGETS)

$(HOST_BIN): examples/host/host.c lib/k3.h $(LIBK3) $(LIBK3LUA)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_EX) -Ilib -I$(LUA_INC) $(DEPS_INC) $< -o $@ -L$(BUILD) -lk3lua -lk3 -l$(LUA_LIB) \
	    -lpthread -lm $(DEPS_LIB) -Wl,-rpath,'$$ORIGIN/../..'

$(CAPI_BIN): examples/capi/attn_res.c lib/k3.h $(LIBK3)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_EX) -Ilib $< -o $@ -L$(BUILD) -lk3 -lm -Wl,-rpath,'$$ORIGIN/../..'

$(INSTALL_LUAMOD): $(LUA_OBJ) $(LIBK3)
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $(LUA_OBJ) $(LDFLAGS_K3) -L$(BUILD) -lk3 -Wl,-soname,libk3lua.so \
	    -Wl,-rpath,'$$ORIGIN:$$ORIGIN/..:$$ORIGIN/../../..'

$(BUILD)/%.pc: %.pc.in
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCDIR@|$(INCDIR)|g' \
	    -e 's|@LUADIR@|$(LUADIR)|g' -e 's|@LUACDIR@|$(LUACDIR)|g' \
	    -e 's|@VERSION@|$(shell sed -n 's/^#define K3_VERSION_STRING "\(.*\)"/\1/p' lib/k3.h)|g' $< > $@

# The .pc files are remade every install: PREFIX may differ from the last one. INSTALL_PC=0
# installs none (the rockspec sets it: see there why).
INSTALL_PC ?= 1
install: all $(INSTALL_LUAMOD)
	@rm -f $(BUILD)/k3.pc $(BUILD)/k3-lua.pc && $(MAKE) --no-print-directory $(BUILD)/k3.pc $(BUILD)/k3-lua.pc
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(LUACDIR)/k3
	install -m 755 $(LIBK3) $(DESTDIR)$(LIBDIR)/libk3.so
	install -m 755 $(INSTALL_LUAMOD) $(DESTDIR)$(LIBDIR)/libk3lua.so
	install -m 755 $(INSTALL_LUAMOD) $(DESTDIR)$(LUACDIR)/k3/core.so
	if [ -f $(LIBCUDA) ]; then install -m 755 $(LIBCUDA) $(DESTDIR)$(LIBDIR)/libk3_cuda.so; fi
	install -m 644 lib/k3.h $(DESTDIR)$(INCDIR)/k3.h
	if [ "$(INSTALL_PC)" != 0 ]; then install -d $(DESTDIR)$(PCDIR) && \
	    install -m 644 $(BUILD)/k3.pc $(BUILD)/k3-lua.pc $(DESTDIR)$(PCDIR)/; fi
	for f in $(K3_LUA_FILES); do install -D -m 644 $$f $(DESTDIR)$(LUADIR)/$${f#lua/}; done

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libk3.so $(DESTDIR)$(LIBDIR)/libk3lua.so $(DESTDIR)$(LIBDIR)/libk3_cuda.so \
	      $(DESTDIR)$(LUACDIR)/k3/core.so $(DESTDIR)$(INCDIR)/k3.h $(DESTDIR)$(PCDIR)/k3.pc $(DESTDIR)$(PCDIR)/k3-lua.pc
	rm -rf $(DESTDIR)$(LUADIR)/k3
