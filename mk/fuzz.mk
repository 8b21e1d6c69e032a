# Fuzzing with libFuzzer (clang): every tests/fuzz/fuzz_NAME.c is a target.
#
#   make fuzz FUZZ_SECONDS=60   run each target that long, from its seed corpus
#   make fuzz-smoke             run each target over its committed seeds and a
#                               few thousand mutations (seconds; CI runs it)
#
# Seeds live in tests/fuzz/corpus/NAME/ (never written to); what a run finds goes to
# $(BUILD)/fuzz/corpus-NAME/, and crashes to $(BUILD)/fuzz/crash-NAME-*.
# A crash becomes a regression test by adding the input to the seed corpus.

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD   := $(BUILD)/fuzz
FUZZ_FLAGS   := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=undefined -I include -I . -isystem $(CUDA_INC)
FUZZ_NAMES   := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

# What each target links besides its harness.
FUZZ_SRCS_config := $(wildcard config/*.c) node/segment.c $(wildcard telemetry/*.c)
FUZZ_LIBS_config := -linih -lpthread -lm
FUZZ_SRCS_trace  := policy/trace_mem.c policy/trace_read.c policy/trace_write.c map/map.c telemetry/log.c
FUZZ_LIBS_trace  := -lz
FUZZ_SRCS_cubin  := interpose/cubin.c telemetry/log.c
FUZZ_LIBS_cubin  := -lelf -lpthread
FUZZ_SRCS_shm    := $(filter-out telemetry/log.c,$(wildcard telemetry/*.c)) telemetry/log.c
FUZZ_LIBS_shm    := -lpthread -lm
FUZZ_SRCS_top    := $(addprefix tools/stagehand-top/,collect.c layout.c render.c text.c) \
                    $(FUZZ_SRCS_shm)
FUZZ_LIBS_top    := -lpthread -lm

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(PREREQ)
	@./mk/prereqs.sh fuzz
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(FUZZ_SRCS_$*) $(FUZZ_LIBS_$*)

.PHONY: fuzz fuzz-smoke
fuzz: $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)
	@for n in $(FUZZ_NAMES); do \
	    mkdir -p $(FUZZ_BUILD)/corpus-$$n; \
	    echo "fuzz: $$n for $(FUZZ_SECONDS) s"; \
	    $(FUZZ_BUILD)/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_BUILD)/crash-$$n- \
	        $(FUZZ_BUILD)/corpus-$$n tests/fuzz/corpus/$$n || exit 1; \
	done

fuzz-smoke: $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)
	@for n in $(FUZZ_NAMES); do \
	    rm -rf $(FUZZ_BUILD)/smoke-$$n; mkdir -p $(FUZZ_BUILD)/smoke-$$n; \
	    $(FUZZ_BUILD)/fuzz_$$n -runs=3000 -seed=1 -artifact_prefix=$(FUZZ_BUILD)/crash-$$n- \
	        $(FUZZ_BUILD)/smoke-$$n tests/fuzz/corpus/$$n >$(FUZZ_BUILD)/smoke-$$n.log 2>&1 \
	        && echo "fuzz-smoke: $$n ok" \
	        || { tail -30 $(FUZZ_BUILD)/smoke-$$n.log; echo "fuzz-smoke: $$n FAILED"; exit 1; }; \
	done
