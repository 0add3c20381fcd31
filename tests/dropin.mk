# Dropping distmesh into an existing C program (issue 29). Everything lands in $(BUILD)/dropin/.
# - test_dropin (tests/test_dropin.c): what a failed create, a successful start and a later error
#   print, DISTMESH_LOG, DM_CHECK, README's first screen; forked children on the TCP build
#   (tests/tcp.mk's impl.o).
# - include order: test_include_after_gcc / _clang (tests/test_include_after.c), the implementation
#   after <stdio.h>, <pthread.h>, <math.h> in the compilers' default mode, -Werror, DISTMESH_TCP,
#   run on shared memory and sockets; include_strict_*.ok: under -std=c11 the same includes stop
#   with distmesh.h's one #error naming the rule; include_same.ok: what the preprocessor emits of
#   distmesh's own lines is the same included first or after (scripts/check_include_order.py).
# - compile cost: cold_regions.ok, scripts/check_cold.py on the headers (markers balanced, hot code
#   calls cold functions only on the paths its ALLOWED list names) and on clang's IR of the
#   implementation (the cold regions' functions optnone, no other). `make compile-cost` times the
#   TU (scripts/compile_cost.sh; BASE=dir compares with another tree), `make bench-reduce-local`
#   runs the kernel benchmark (bench/reduce_local.c; scripts/reduce_local_ab.sh for A/B).
# - fast-math: tests/impl.c compiled with -Ofast (gcc; clang), linked with test_reduce.o
#   (test_reduce_ofast_*: every kernel, bit for bit) and with tests/test_fastmath.c linked with
#   -Ofast as a user's program is (test_fastmath_*: the threaded world of 3, NaN on each rank).
# The compile checks are prerequisites of test_dropin, so a failure fails `make test`. Cost: the
# implementation compiled 4 more times (two at -O0, two at -Ofast without TCP), once more by clang
# to IR, and preprocessed twice.
DROPIN_DIR := $(BUILD)/dropin
DROPIN_CLANG := $(shell command -v clang 2>/dev/null)
DROPIN_WARN := -Wall -Wextra -Wpedantic -Werror
DROPIN_HDRS := $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
DROPIN_CCS := gcc $(if $(DROPIN_CLANG),clang)

ifneq ($(wildcard distmesh_tcp.h),)
TEST_BINS += $(DROPIN_DIR)/test_dropin $(foreach c,$(DROPIN_CCS),$(DROPIN_DIR)/test_include_after_$(c))
endif
TEST_BINS += $(foreach c,$(DROPIN_CCS),$(DROPIN_DIR)/test_reduce_ofast_$(c) $(DROPIN_DIR)/test_fastmath_$(c))
DROPIN_CHECKS := $(foreach c,$(DROPIN_CCS),$(DROPIN_DIR)/include_strict_$(c).ok) $(DROPIN_DIR)/include_same.ok \
                 $(DROPIN_DIR)/cold_regions.ok

$(DROPIN_DIR)/test_dropin: tests/test_dropin.c tests/test_world.h tests/test_tmpdir.h tests/test_filter.h tests/prelude.h \
                           $(BUILD)/tcp/impl.o | $(DROPIN_CHECKS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_SRCDIR='"$(CURDIR)"' $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ \
	    $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

# No -std: each compiler's default (gnu17 here), as in a program's own Makefile. -O0: the point is
# what compiles, not how fast (the implementation's other builds optimise).
$(DROPIN_DIR)/test_include_after_%: tests/test_include_after.c tests/test_world.h tests/test_filter.h tests/prelude.h $(DROPIN_HDRS)
	@mkdir -p $(dir $@)
	$* $(DROPIN_WARN) -O0 $(SAN) -I. -pthread -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(CMOCKA_LIBS) -pthread -lm

# -std=c11 after <stdio.h>: exactly one error, distmesh.h's, naming the rule.
$(DROPIN_DIR)/include_strict_%.ok: tests/test_include_after.c $(DROPIN_HDRS)
	@mkdir -p $(dir $@)
	@if $* -std=c11 -DDM_TEST_INCLUDE_ONLY -DDISTMESH_TCP -I. $(UV_CFLAGS) -fsyntax-only $< 2> $@.log; then \
	    echo "$*: -std=c11 after <stdio.h> compiled; distmesh.h's #error should have stopped it"; exit 1; fi
	@if [ "$$(grep -c 'error:' $@.log)" != 1 ]; then \
	    echo "$*: -std=c11: not exactly one error:"; cat $@.log; exit 1; fi
	@grep -q 'distmesh.h: the implementation needs POSIX 2008' $@.log && \
	    grep -q 'include distmesh.h with DISTMESH_IMPLEMENTATION before any other header' $@.log || \
	    { echo "$*: -std=c11: the error does not name the rule:"; cat $@.log; exit 1; }
	@touch $@

# distmesh's own lines, preprocessed: included first (distmesh.c) and after <stdio.h> ... must
# read the same, but for >>libc's declarations of what glibc hid (a feature silently left out by
# an #ifdef on a GNU-only macro would show here, not as a compile error).
$(DROPIN_DIR)/include_same.ok: distmesh.c tests/test_include_after.c scripts/check_include_order.py $(DROPIN_HDRS)
	@mkdir -p $(dir $@)
	gcc -E -DDISTMESH_TCP -I. $(UV_CFLAGS) distmesh.c -o $(DROPIN_DIR)/first.i
	gcc -E -DDISTMESH_TCP -DDM_TEST_INCLUDE_ONLY -I. $(UV_CFLAGS) tests/test_include_after.c -o $(DROPIN_DIR)/after.i
	python3 scripts/check_include_order.py $(DROPIN_DIR)/first.i $(DROPIN_DIR)/after.i
	@touch $@

# The implementation at -Ofast, without TCP (the kernels and the threaded world); under `make
# asan` / `make tsan` with the sanitizer's flags too, like every other object (an uninstrumented
# one hides its atomics from ThreadSanitizer, which then reports the threaded world's hand-offs).
$(DROPIN_DIR)/impl_ofast_%.o: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h
	@mkdir -p $(dir $@)
	$* -std=c11 $(DROPIN_WARN) -Ofast $(SAN) -I. -pthread -c $< -o $@

# Linked without -Ofast: no flush-to-zero at startup, so test_reduce's subnormals keep IEEE.
$(DROPIN_DIR)/test_reduce_ofast_%: $(BUILD)/core/test_reduce.o $(DROPIN_DIR)/impl_ofast_%.o
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)

# Linked with -Ofast, as the user's program would be; the test's own file with the usual flags (its
# expectations are IEEE), by the same compiler (one sanitizer runtime under `make asan`).
$(DROPIN_DIR)/test_fastmath_%: tests/test_fastmath.c tests/test_util.h tests/test_filter.h tests/prelude.h $(DROPIN_DIR)/impl_ofast_%.o
	$* $(CFLAGS_ALL) -c $< -o $@.o
	$* -Ofast -pthread $@.o $(DROPIN_DIR)/impl_ofast_$*.o -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)

# The regions on paper, and (with clang) as compiled.
$(DROPIN_DIR)/cold_regions.ok: scripts/check_cold.py distmesh.c $(DROPIN_HDRS) $(wildcard distmesh_nccl.h)
	@mkdir -p $(dir $@)
ifneq ($(DROPIN_CLANG),)
	clang -std=c11 -O2 -DDISTMESH_TCP -I. $(UV_CFLAGS) -S -emit-llvm distmesh.c -o $(DROPIN_DIR)/impl.ll
	python3 scripts/check_cold.py --ir $(DROPIN_DIR)/impl.ll .
else
	python3 scripts/check_cold.py .
endif
	@touch $@

# Not in `make test`: timings mean something on a quiet machine only.
REDUCE_LOCAL_BENCH := $(BUILD)/bench/reduce_local
EXTRA_BINS += $(REDUCE_LOCAL_BENCH)
$(REDUCE_LOCAL_BENCH): bench/reduce_local.c $(DISTMESH_C_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(LDLIBS_ALL)

.PHONY: compile-cost bench-reduce-local
compile-cost:
	@bash scripts/compile_cost.sh $(or $(REPS),3) $(BASE)
bench-reduce-local: $(REDUCE_LOCAL_BENCH)
	$(REDUCE_LOCAL_BENCH)
