# The torch suites under torch 2.x (issue 40), beside python.mk's run under Debian's torch 1.13:
# a virtual environment of the machine's Python 3.11 ($(PYT2_VENV)) with torch 2.13.0 installed
# from the CPU wheel on disk (PYT2_WHEEL, by its path: never a download of a CUDA build; numpy,
# pytest and torch's own dependencies come from the package index), the extension built for
# that Python (setup.py, as python.mk does), and python/tests/run_pytest.sh running the torch
# tests (test_torch.py, test_torch2.py) there as its own program of `make test`
# (run_pytest_torch2), with test_pip_install.py (docs/python.md's pip lines in a fresh venv of
# the same Python: it needs the package index, as this environment does). Creating the
# environment takes a minute or two, once per machine and wheel: it lives beside pip's cache
# ($(PYT2_CACHE), one folder per wheel file), not in the build folder, so fresh clones and
# builds reuse it; it holds only torch, numpy, pytest and setuptools (the extension is built per
# build folder). A lock keeps two makes from creating it at once.
# Skipped with the reason (one SKIPPED line) where the wheel or python3.11 is missing, and
# under the sanitizers: torch's libraries are not built with ASan (python.mk's run there leaves
# torch out too, DM_PY_NO_TORCH) and CPython is not built for TSan.
PYT2_WHEEL  ?= $(firstword $(wildcard /opt/wheels/torch-2.13.0+cpu-cp311-cp311-*.whl))
PYT2_PYTHON ?= $(firstword $(shell command -v python3.11 2>/dev/null))
PYT2_CACHE  ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/distmesh
PYT2_VENV   := $(PYT2_CACHE)/venv-$(basename $(notdir $(PYT2_WHEEL)))
PYT2_PY     := $(PYT2_VENV)/bin/python
PYT2_DIR    := $(BUILD)/python_torch2
PYT2_LIB    := $(PYT2_DIR)/lib
PYT2_STAMP  := $(PYT2_DIR)/built.stamp
PYT2_TEST   := $(PYT2_DIR)/run_pytest_torch2
TEST_BINS += $(PYT2_TEST)
.PHONY: python-torch2 test-fsdp-full

PYT2_SKIP :=
ifeq ($(PYT2_WHEEL),)
PYT2_SKIP := the torch 2.13.0 CPU wheel is not in /opt/wheels (PYT2_WHEEL=)
else ifeq ($(PYT2_PYTHON),)
PYT2_SKIP := python3.11 not found (PYT2_PYTHON=), the wheel is for CPython 3.11
else ifneq (,$(findstring address,$(SAN)))
PYT2_SKIP := not under AddressSanitizer: the torch libraries are not built with it, and the 1.13 run leaves torch out there too
else ifneq (,$(findstring thread,$(SAN)))
PYT2_SKIP := not under ThreadSanitizer: CPython is not built for it
endif

ifeq ($(PYT2_SKIP),)
# The environment: created whole or not at all (a failed install leaves no stamp behind).
$(PYT2_VENV)/installed.stamp:
	@mkdir -p $(PYT2_CACHE)
	flock $(PYT2_CACHE)/.lock sh -ec '\
	    [ -f $@ ] && exit 0; \
	    rm -rf $(PYT2_VENV); \
	    $(PYT2_PYTHON) -m venv $(PYT2_VENV); \
	    $(PYT2_PY) -m pip install -q --no-input --disable-pip-version-check "$(PYT2_WHEEL)" numpy pytest setuptools; \
	    $(PYT2_PY) -c "import torch, numpy, pytest; assert torch.__version__.startswith(\"2.13.0\"), torch.__version__"; \
	    touch $@'

$(PYT2_STAMP): $(PY_SRCS) $(PYT2_VENV)/installed.stamp
	@mkdir -p $(PYT2_DIR)
	cd python && DISTMESH_PY_WERROR=1 DISTMESH_OPENSSL=$(PY_OPENSSL) CC="$(CC)" $(abspath $(PYT2_PY)) setup.py -q build \
	    --build-base $(abspath $(PYT2_DIR))/setuptools --build-lib $(abspath $(PYT2_LIB))
	@touch $@

$(PYT2_TEST): python/tests/run_pytest.sh $(PYT2_STAMP) $(PY_REF)
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\nexec env DM_PY=%s DM_PY_LIB=%s DM_PY_REF=%s %s CC="%s" bash %s "$$@"\n' \
	    '$(abspath $(PYT2_PY))' '$(abspath $(PYT2_LIB))' '$(abspath $(PY_REF))' \
	    'DM_PY_TESTS="test_torch.py test_torch2.py test_pip_install.py" DM_PY_PIP_TEST=1' '$(CC)' \
	    '$(CURDIR)/python/tests/run_pytest.sh' > $@
	@chmod +x $@
python-torch2: $(PYT2_STAMP)

# The FSDP2 tests at the issue's size (4 layers, d_model 256, vocabulary 1000, 20 steps; make
# test runs a smaller model for 5): test_torch2.py's stack on 2 and 4 ranks and the checkpoint
# loaded on 2, against Gloo in the same processes. About 10 minutes on 2 cores.
test-fsdp-full: $(PYT2_STAMP) $(PY_REF)
	DM_PY='$(abspath $(PYT2_PY))' DM_PY_LIB='$(abspath $(PYT2_LIB))' DM_PY_REF='$(abspath $(PY_REF))' CC='$(CC)' \
	    DM_PY_TESTS=test_torch2.py DM_FSDP_FULL=1 DM_PY_TIMEOUT=3000 DM_PY_TEST_LIMIT=2400 \
	    DM_TORCH2_WORLD_LIMIT=1800 bash python/tests/run_pytest.sh 'not torchrun'
else
$(PYT2_TEST): SKIP_REASON := torch 2.x suite skipped: $(PYT2_SKIP)
$(PYT2_TEST): tests/python_torch2.mk
	$(skip_program)
python-torch2 test-fsdp-full:
	@echo "$@: $(PYT2_SKIP)" && false
endif
