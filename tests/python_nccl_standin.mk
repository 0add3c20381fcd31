# The Python package's NCCL build without a GPU (issue 27): python/src/*.c (the extension's files)
# compiled with -DDISTMESH_NCCL -DDISTMESH_TCP against CUDA's and NCCL's real headers, linked
# with tests/stand_in_cuda_nccl.c (the scripted stand-in for libcudart and libnccl,
# tests/nccl_standin.mk) instead of -lcudart -lnccl, beside a copy of python/distmesh/*.py under
# $(PYSI_LIB). The stand-in's symbols stay visible in the extension's .so, so the test
# (python/tests/test_nccl_standin.py, run by run_pytest.sh as its own program of `make test`)
# reaches cudaMalloc, si_count, ... through ctypes. Without the headers a script reports one
# skip with the reason, as tests/nccl_standin.mk does. `make python-nccl-standin` builds it.
PYSI_DIR  := $(BUILD)/python_nccl_standin
PYSI_LIB  := $(PYSI_DIR)/lib
PYSI_TEST := $(PYSI_DIR)/run_pytest_nccl_standin
TEST_BINS += $(PYSI_TEST)
.PHONY: python-nccl-standin

ifneq ($(SI_CFLAGS),)
PYSI_EXT_SUFFIX := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
PYSI_PY_INC := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PYSI_EXT := $(PYSI_LIB)/distmesh/_C$(PYSI_EXT_SUFFIX)
PYSI_PYS := $(patsubst python/distmesh/%,$(PYSI_LIB)/distmesh/%,$(wildcard python/distmesh/*.py))
# setup.py's flags for the extension, and the NCCL build's macros
PYSI_CFLAGS := -std=gnu11 -Wall -Wextra -Wno-missing-field-initializers -Werror $(OPT) $(SAN) -fPIC -fwrapv \
               -pthread -I. -I$(PYSI_PY_INC) $(SI_CFLAGS) -DDISTMESH_TCP $(UV_CFLAGS)

# the extension's files, each its own object (python/src/dmpy.h says what each holds)
PYSI_OBJS := $(patsubst python/src/%.c,$(PYSI_DIR)/%.o,$(wildcard python/src/*.c))
$(PYSI_OBJS): $(PYSI_DIR)/%.o: python/src/%.c python/src/dmpy.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h distmesh_nccl.h
	@mkdir -p $(dir $@)
	$(CC) $(PYSI_CFLAGS) -fvisibility=hidden -c $< -o $@
# position-independent, default visibility: the test calls it through the extension's .so
$(PYSI_DIR)/stand_in_cuda_nccl.o: tests/stand_in_cuda_nccl.c tests/stand_in_cuda_nccl.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(SI_CFLAGS) -fPIC -c $< -o $@
$(PYSI_EXT): $(PYSI_OBJS) $(PYSI_DIR)/stand_in_cuda_nccl.o
	@mkdir -p $(dir $@)
	$(CC) -shared $^ -o $@ $(UV_LIBS) $(LDLIBS_ALL)
$(PYSI_LIB)/distmesh/%.py: python/distmesh/%.py
	@mkdir -p $(dir $@)
	cp $< $@
python-nccl-standin: $(PYSI_EXT) $(PYSI_PYS)

# under ThreadSanitizer run_pytest.sh skips (CPython is not built for it): nothing to build
ifneq (,$(findstring thread,$(SAN)))
PYSI_TEST_DEPS := python/tests/run_pytest.sh
else
PYSI_TEST_DEPS := python/tests/run_pytest.sh $(PYSI_EXT) $(PYSI_PYS)
endif
$(PYSI_TEST): $(PYSI_TEST_DEPS)
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\nexec env DM_PY=%s DM_PY_LIB=%s %s DM_PY_SAN="%s" CC="%s" bash %s "$$@"\n' '$(PY)' \
	    '$(abspath $(PYSI_LIB))' 'DM_PY_TESTS=test_nccl_standin.py DM_PY_NCCL_STANDIN=1' '$(SAN)' '$(CC)' \
	    '$(CURDIR)/python/tests/run_pytest.sh' > $@
	@chmod +x $@
else
python-nccl-standin:
	@echo "$@: CUDA's cuda_runtime.h or NCCL's nccl.h not found (CUDA_HOME=$(CUDA_HOME))" && false
$(PYSI_TEST): SKIP_REASON := test_nccl_standin.py: skipped: cuda_runtime.h or nccl.h not found (CUDA_HOME=$(CUDA_HOME))
$(PYSI_TEST): tests/python_nccl_standin.mk
	$(skip_program)
endif
