# fuzz fragment (issue 9): libFuzzer targets for the store's request parser and the TCP
# backend's connection hello. Not part of `make test`: `make fuzz` builds them with clang and
# runs each for FUZZ_SECONDS (default 60) from the committed seed corpus (tests/fuzz/corpus/,
# copied under build/fuzz/ so new inputs never dirty the tree; crashes land in build/fuzz/).
# Without a clang that links libFuzzer it says so and succeeds.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := store hello
FUZZ_FLAGS := -std=c11 -Wall -Wextra -Werror -g -O1 -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=all -I. -pthread -DDISTMESH_TCP $(UV_CFLAGS)

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< -o $@ $(UV_LIBS) -pthread -lm

.PHONY: fuzz
fuzz:
	@mkdir -p build/fuzz
	@if ! printf 'int LLVMFuzzerTestOneInput(const unsigned char* d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
	    | $(FUZZ_CC) -x c -fsanitize=fuzzer - -o build/fuzz/probe 2>/dev/null; then \
	    echo "fuzz: $(FUZZ_CC) with libFuzzer not found, skipped"; exit 0; fi; \
	$(MAKE) --no-print-directory $(BUILD_JOBS) $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS)) || exit 1; \
	for t in $(FUZZ_TARGETS); do \
	    mkdir -p build/fuzz/corpus-$$t && cp tests/fuzz/corpus/$$t/* build/fuzz/corpus-$$t/ && \
	    echo "== fuzz $$t for $(FUZZ_SECONDS) s" && \
	    build/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
	        -artifact_prefix=build/fuzz/$$t- -print_final_stats=1 build/fuzz/corpus-$$t \
	        > build/fuzz/$$t.log 2>&1; rc=$$?; tail -8 build/fuzz/$$t.log; [ $$rc -eq 0 ] || exit 1; \
	done
