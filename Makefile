# distmesh build. `make test` installs what it needs (scripts/deps.sh), builds and runs every test
# under a hard timeout, and prints a closing "N passed, N failed" line.
#   make            build tests, examples, bench
#   make test       unit + multi-process tests (plain build); T=pattern runs only the test
#                   programs or cmocka tests whose names match (e.g. T=test_env, T=agent_store)
#   make asan       the same under AddressSanitizer + UBSan (LeakSanitizer included)
#   make tsan       the same under ThreadSanitizer
#   make bench      the README's main job: all-reduce on 4 local ranks (shared memory; DISTMESH_TRANSPORT=tcp: loopback TCP)
#   make compare    distmesh against Gloo and OpenMPI (see bench/)
#   make parity     distmesh against OpenMPI, one harness for both under mpirun (bench/parity_bench.c)
#   make bench-launches  launch-to-launch spread, 20 launches per size, distmesh and OpenMPI alternated
#   make bench-overlap  communication hidden by dm_all_reduce_async: 2 local ranks, shm and tcp
#   make test-scale setup time, fds and small all_reduces at 16..256 ranks on 8 simulated hosts
#   make bench-hosts    all-reduce across simulated hosts (root: network namespaces, tc-shaped links;
#                   HOSTS RANKS_PER_HOST RATE FLOW_RATE SIZES REPS), distmesh auto / flat ring / Gloo
#   make bench-loss     time from kill -9 of a rank to every survivor's DM_ERR_PEER_LOST (shm, tcp)
#   make bench-shrink   dm_shrink after a kill -9 against destroy + re-create (8 local ranks, 2x2 hosts)
#   make test-shrink-trials  every kill -9 case of tests/test_shrink.c 20 times (a few minutes)
#   make bench-trace    what the flight recorder costs at 8 B, launches on / off alternated (bench/dm_trace_bench.c)
#   make trace-demo     a traced 4-rank run, scripts/dm_trace's report and docs/inside.md's timeline picture
#   make test-gpu   the GPU tests (needs a GPU, CUDA and NCCL)
#   make install    headers, pkg-config and CMake files, the Python package (PREFIX=/usr/local, DESTDIR=)
#   make bench-python   the Python package against mpi4py and torch's Gloo (bench/py_bench.py)
#   make test-fsdp-full  the torch 2.x FSDP2 tests at full size (4 layers, d_model 256, 20 steps; ~10 min)
#   make test-torch-suite  PyTorch's own distributed suite (its CPU part) under distmesh and Gloo at
#                   world sizes 2 and 3, one table in build/plain/torch_suite/table.md (~5 min)
#   make test-seed-projects  Optimus-DL 0.2.6 (its multi-process tests, its recipe) and LLaMA-Factory
#                   0.9.5 (v1 SFT, FSDP2) from PyPI on distmesh beside Gloo (scripts/seed_projects.sh)
#   make config-table  README's table of environment variables, rewritten from distmesh.h's registry
# Fragments tests/*.mk and bench/*.mk each add their own programs; they append to TEST_BINS.

CC      ?= cc
CXX     ?= c++
BUILD   ?= build/plain
SAN     ?=
OPT     ?= -O2 -g
WARN    := -Wall -Wextra -Wpedantic -Werror
# The TCP backend's encrypted links (distmesh_socket.h >>socket aead) use libcrypto: every build
# here defines DISTMESH_OPENSSL and links -lcrypto (scripts/deps.sh installs libssl-dev);
# OPENSSL=0 builds without them (DISTMESH_ENCRYPT=1 is then DM_ERR_UNSUPPORTED).
OPENSSL ?= 1
OPENSSL_CFLAGS := $(if $(filter 1,$(OPENSSL)),-DDISTMESH_OPENSSL)
CRYPTO_LIBS    := $(if $(filter 1,$(OPENSSL)),-lcrypto)
CFLAGS_ALL   := -std=c11 $(WARN) $(OPT) $(SAN) -I. -pthread $(OPENSSL_CFLAGS)
CXXFLAGS_ALL := -std=c++11 -Wall -Wextra -Werror $(OPT) $(SAN) -I. -pthread $(OPENSSL_CFLAGS)
LDLIBS_ALL   := $(SAN) -pthread -lm $(CRYPTO_LIBS)
UV_CFLAGS := $(shell pkg-config --cflags libuv 2>/dev/null)
UV_LIBS   := $(shell pkg-config --libs libuv 2>/dev/null || echo -luv)
CMOCKA_LIBS := -lcmocka
CUDA_HOME ?= /usr/local/cuda
# NCCL's headers for the stand-in tests where CUDA has none (scripts/deps.sh puts them here)
DM_NCCL_HEADERS := /usr/local/share/distmesh/nccl/include
TEST_TIMEOUT ?= 600
# The headers a build depends on: the core's layers (distmesh.h includes the rest of the
# implementation in this order), then the transports the TCP backend adds.
DM_CORE_HDRS := distmesh.h distmesh_kernels.h distmesh_trace.h distmesh_core.h distmesh_engine.h \
                distmesh_schedules.h distmesh_thread.h

TEST_BINS :=

# A stand-in test program for a suite that cannot run here: it prints the reason and one cmocka
# skip (tests/run.sh counts it), and, given a test-name pattern (make test T=...), has no tests
# to match. Its rule sets SKIP_REASON for the target (no single quotes) and runs $(skip_program).
define skip_program
@mkdir -p $(dir $@)
@printf '#!/bin/sh\n[ $$# -gt 0 ] && exit 0\necho "%s"\necho "[  SKIPPED ] 1 test(s)"\n' '$(SKIP_REASON)' > $@
@chmod +x $@
endef

.PHONY: all deps test test-after-deps asan tsan bench compare parity test-gpu clean
all: deps
	@$(MAKE) --no-print-directory build-all

deps:
	@DM_NCCL_HEADERS='$(DM_NCCL_HEADERS)' bash scripts/deps.sh

include $(sort $(wildcard tests/*.mk)) $(sort $(wildcard bench/*.mk)) packaging/install.mk

build-all: $(TEST_BINS) $(EXTRA_BINS)

# The builds use every core unless make was given -j (then its jobserver decides).
NPROC := $(shell nproc 2>/dev/null || echo 2)
BUILD_JOBS = $(if $(findstring j,$(filter-out --%,$(MAKEFLAGS))),,-j$(NPROC))

# CHECK_BUILDS=0 (the sanitizer stages): build only what the tests run, without the programs
# that are only compiled (EXTRA_BINS: examples and benchmarks no test runs) and without the
# compile checks (tests/coretests.mk): a sanitizer finds nothing in a program that never runs,
# and the plain stage compiles all of them with the same compilers and warnings. Under ASan each
# is a 30 s compile of the whole implementation; leaving them out saves CI about 4 minutes.
CHECK_BUILDS ?= 1
# The build and the run are a second make, which reads the Makefile again after deps: the
# fragments' $(wildcard ...) tests (NCCL's headers, which scripts/deps.sh may install in this
# very run: tests/nccl_standin.mk) then see what deps installed, so the first `make test` on a
# fresh machine runs every suite it can, not the skips decided before deps ran.
test: deps
	@$(MAKE) --no-print-directory test-after-deps
test-after-deps:
	@$(MAKE) --no-print-directory $(BUILD_JOBS) $(TEST_BINS) $(if $(filter 0,$(CHECK_BUILDS)),,$(EXTRA_BINS))
	@DM_TEST_PATTERN='$(T)' bash tests/run.sh $(TEST_TIMEOUT) $(TEST_BINS)

asan:
	@$(MAKE) --no-print-directory test BUILD=build/asan OPT="-O1 -g" CHECK_BUILDS=0 \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

# gcc's -Wtsan says TSan does not model atomic_thread_fence (the bells' fences, distmesh.h
# >>links); as an error it stopped every tsan build. clang has no such warning (hence the
# second flag, which gcc ignores).
TSAN_WARN := -Wno-tsan -Wno-unknown-warning-option
# Tests that fork after a thread started (a rank's store thread, then children) need
# die_after_fork=0; the tcp program runs past make test's 600 s per program under TSan here.
tsan:
	@TSAN_OPTIONS="die_after_fork=0 $$TSAN_OPTIONS" $(MAKE) --no-print-directory test BUILD=build/tsan CHECK_BUILDS=0 \
	    OPT="-O1 -g" SAN="-fsanitize=thread $(TSAN_WARN)" TEST_TIMEOUT=1800

clean:
	rm -rf build
