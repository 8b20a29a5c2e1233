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
K3_PACKED_ATTN_RES ?= 1
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90

SHELL     := /bin/bash
OPT       ?= -O2
CFLAGS_K3  = -std=c11 $(OPT) -g -fPIC -Wall -Wextra -Werror -Wno-unused-parameter \
             -fvisibility=hidden -D_GNU_SOURCE -ffp-contract=off $(SANITIZE) $(DEPS_INC)
LDFLAGS_K3 = $(SANITIZE) $(DEPS_LIB)

CORE_SRC  = $(filter-out lib/k3_lua.c,$(wildcard lib/*.c))
CORE_OBJ  = $(patsubst lib/%.c,$(BUILD)/obj/%.o,$(CORE_SRC))
CU_SRC    = $(wildcard kernels/*.cu)
CU_OBJ    = $(patsubst kernels/%.cu,$(BUILD)/cuobj/%.o,$(CU_SRC))
HEADERS   = $(wildcard lib/*.h) $(wildcard kernels/*.h) $(wildcard kernels/*.cuh)

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

.PHONY: all test deps demo clean install check-deps leak-check
all: $(TARGETS)

$(BUILD)/obj/%.o: lib/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_K3) -c $< -o $@

$(LIBK3): $(CORE_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS_K3) -Wl,-soname,libk3.so -lopenblas -lcjson -ldl -lm -lpthread

$(BUILD)/obj/k3_lua.o: lib/k3_lua.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_K3) -I$(LUA_INC) -c $< -o $@

$(LIBK3LUA): $(BUILD)/obj/k3_lua.o $(LIBK3)
	$(CC) -shared -o $@ $< $(LDFLAGS_K3) -L$(BUILD) -lk3 -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../..' -Wl,-soname,libk3lua.so

$(LUAMOD): $(LIBK3LUA)
	@mkdir -p $(dir $@)
	ln -sf ../../libk3lua.so $@

NVFLAGS = -std=c++17 -O3 $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-Wall \
          -DK3_PACKED_ATTN_RES=$(K3_PACKED_ATTN_RES) -Ilib -lineinfo $(DEPS_INC)

$(BUILD)/cuobj/%.o: kernels/%.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIBCUDA): $(CU_OBJ) $(LIBK3)
	$(NVCC) -shared -o $@ $(CU_OBJ) -L$(BUILD) -lk3 -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart \
	    -Xlinker -rpath,'$$ORIGIN' -Xlinker -rpath,$(CUDA_HOME)/lib64

# Debian packages k3 needs to build and test; installed when missing and run as root.
DEB_PKGS = lua5.4 liblua5.4-dev lua-busted libopenblas-dev libcjson-dev pkg-config
deps:
	@scripts/deps $(DEB_PKGS)

test: deps
	@$(MAKE) --no-print-directory all
	@scripts/run-specs

demo: all
	@scripts/k3 scripts/demo.lua

# valgrind over a script that creates, views, copies, prints and frees tensors; fails on a
# definite or indirect leak or any memory error (ld.so's own rpath reads are suppressed:
# spec/scripts/valgrind.supp says why).
leak-check: all
	LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;" LUA_CPATH="$(CURDIR)/build/lua/?.so;;" \
	  valgrind --leak-check=full --show-leak-kinds=definite,indirect --suppressions=spec/scripts/valgrind.supp \
	  --errors-for-leak-kinds=definite,indirect --error-exitcode=3 \
	  $(LUA) spec/scripts/leak_check.lua 2>&1 | grep -E "leak_check|definitely|indirectly|ERROR SUMMARY"; \
	  test $${PIPESTATUS[0]} -eq 0

clean:
	rm -rf $(BUILD)
