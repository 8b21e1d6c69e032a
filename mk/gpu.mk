# Real-GPU suite: see tests/gpu/README.md.
#
#   make gpu-build    compile the tests/gpu/*.cu programs for $(GPU_ARCH) (needs nvcc, no GPU)
#   make gpu-check    GPU-free checks: script syntax, GPU detection, the report's
#                     self-test, the PyTorch script's CPU dry run (skips without torch);
#                     make test runs it
#   make gpu-test     the whole suite on a real GPU; skips cleanly without one
#   make gpu-bundle   the library, its non-system libraries and the programs in
#                     $(BUILD)/gpu, for a GPU machine that cannot build them itself
#
# gpu-test passes its arguments on: make gpu-test GPU_TEST_ARGS=--quick

NVCC       ?= $(CUDA_HOME)/bin/nvcc
GPU_ARCH   ?= sm_90
GPU_BUILD  := $(BUILD)/gpu
GPU_SRCS   := $(wildcard tests/gpu/*.cu)
GPU_BINS   := $(GPU_SRCS:tests/gpu/%.cu=$(GPU_BUILD)/%)
GPU_TEST_ARGS ?=

# -cudart shared: a statically linked runtime would hide cudaMalloc and the
# launch entry points from LD_PRELOAD.
GPU_NVCCFLAGS := -std=c++17 -O2 -lineinfo -arch=$(GPU_ARCH) -cudart shared \
                 -I include -I $(CUDA_HOME)/extras/CUPTI/include \
                 -Xcompiler -Wall,-Wextra \
                 -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64
GPU_LDLIBS := -L$(CUDA_HOME)/lib64/stubs -lcuda -ldl -lpthread

.PHONY: gpu-build gpu-check gpu-test gpu-bundle

$(GPU_BUILD)/%: tests/gpu/%.cu tests/gpu/common.cuh include/stagehand.h
	@mkdir -p $(@D)
	$(NVCC) $(GPU_NVCCFLAGS) -o $@ $< $(GPU_LDLIBS)

# fingerprint checks the library's PTX against its CPU fingerprint: both
# linked in as the library builds them.
$(GPU_BUILD)/clean_%.o: clean/%.c clean/clean.h
	@mkdir -p $(@D)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -I include -I . -c $< -o $@

$(GPU_BUILD)/fingerprint: tests/gpu/fingerprint.cu tests/gpu/common.cuh clean/clean.h \
        $(GPU_BUILD)/clean_hash.o $(GPU_BUILD)/clean_ptx.o
	@mkdir -p $(@D)
	$(NVCC) $(GPU_NVCCFLAGS) -I . -o $@ $< $(GPU_BUILD)/clean_hash.o $(GPU_BUILD)/clean_ptx.o \
	    $(GPU_LDLIBS)

$(GPU_BUILD)/probe: tests/gpu/probe.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -O2 -Wall -Wextra -o $@ $< -ldl

gpu-build: $(GPU_BINS) $(GPU_BUILD)/probe

gpu-check:
	@bash -n tests/gpu/run.sh
	@bash tests/gpu/run.sh --detect
	@python3 tests/gpu/report.py --self-test
	@python3 tests/gpu/train_gpt.py --dry-run

# make test runs the suite's GPU-free checks (seconds), and shows it skips
# without a GPU; the suite itself is make gpu-test.
test: gpu-check

gpu-test:
	@BUILD=$(BUILD) CUDA_HOME=$(CUDA_HOME) NVCC=$(NVCC) GPU_ARCH=$(GPU_ARCH) \
	    bash tests/gpu/run.sh $(GPU_TEST_ARGS)

# Copies the library and the shared libraries it needs that a CUDA machine
# may lack (libinih, libelf) into $(GPU_BUILD)/lib; run.sh prefers that copy.
gpu-bundle: $(BUILD)/libstagehand.so gpu-build
	@mkdir -p $(GPU_BUILD)/lib
	cp $(BUILD)/libstagehand.so $(GPU_BUILD)/lib/
	@ldd $(BUILD)/libstagehand.so | awk '$$3 ~ /^\// && $$1 !~ /^(libc|libm|libdl|libpthread|librt|libz|ld-linux)/ {print $$3}' | \
	    while read -r so; do cp -L "$$so" $(GPU_BUILD)/lib/; echo "bundled $$so"; done
	@{ echo "built $$(date -u +%Y-%m-%dT%H:%M:%SZ) on $$(uname -n)"; \
	   echo "commit $$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"; \
	   ls $(GPU_BUILD)/lib; } > $(GPU_BUILD)/lib/BUNDLE
	@cat $(GPU_BUILD)/lib/BUNDLE
