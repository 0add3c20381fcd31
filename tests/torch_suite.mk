# PyTorch's own distributed suite on the "distmesh" backend beside Gloo (issue 51):
# python/tests/torch_suite.py runs torch 2.13's DistributedTest._DistTestBase (shipped in the
# wheel) under both backends in the torch 2.x environment of tests/python_torch2.mk, each test
# under a hard limit, and writes one table (per test: Gloo's and distmesh's outcome at each world
# size). It fails when a test that passes under Gloo fails or hangs under distmesh.
#   make test-torch-suite   the whole CPU part, world sizes 2 and 3: $(BUILD)/torch_suite/table.md
#                           (TORCH_SUITE_ARGS adds options: --start spawn, --tests a,b, --limit S)
#   make test               a subset (torch_suite.py's SUBSET: every cause the issue lists) at world
#                           size 2 as its own program, run_torch_suite_ci (about a minute here)
# torch's test helpers need expecttest, installed into the shared environment once (under its
# lock). Skipped with the reason where the environment cannot be made (python_torch2.mk's reasons:
# no wheel, no python3.11, a sanitizer build).
TSUITE_DIR   := $(BUILD)/torch_suite
TSUITE_TEST  := $(TSUITE_DIR)/run_torch_suite_ci
TSUITE_STAMP := $(PYT2_VENV)/suite.stamp
TORCH_SUITE_ARGS ?=
TEST_BINS += $(TSUITE_TEST)
.PHONY: test-torch-suite

ifeq ($(PYT2_SKIP),)
$(TSUITE_STAMP): $(PYT2_VENV)/installed.stamp
	flock $(PYT2_CACHE)/.lock sh -ec '\
	    [ -f $@ ] && exit 0; \
	    $(PYT2_PY) -m pip install -q --no-input --disable-pip-version-check expecttest; \
	    $(PYT2_PY) -c "import expecttest, torch.testing._internal.common_utils"; \
	    touch $@'

# the subset for make test: an argument (make test T=...) runs the subset's tests whose names
# match it (a glob), none matching: nothing
$(TSUITE_TEST): python/tests/torch_suite.py $(PYT2_STAMP) $(TSUITE_STAMP) tests/torch_suite.mk
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\nexec env PYTHONPATH=%s PYTHONDONTWRITEBYTECODE=1 %s %s --table %s --subset --worlds 2 --limit 60 --budget 280 --cmocka "$$@"\n' \
	    '$(abspath $(PYT2_LIB))' '$(abspath $(PYT2_PY))' '$(CURDIR)/python/tests/torch_suite.py' \
	    '$(abspath $(TSUITE_DIR))/ci' > $@
	@chmod +x $@

test-torch-suite: $(PYT2_STAMP) $(TSUITE_STAMP)
	PYTHONPATH='$(abspath $(PYT2_LIB))' PYTHONDONTWRITEBYTECODE=1 '$(abspath $(PYT2_PY))' python/tests/torch_suite.py \
	    --table '$(abspath $(TSUITE_DIR))' --worlds 2,3 $(TORCH_SUITE_ARGS)
else
$(TSUITE_TEST): SKIP_REASON := torch distributed suite skipped: $(PYT2_SKIP)
$(TSUITE_TEST): tests/torch_suite.mk tests/python_torch2.mk
	$(skip_program)
test-torch-suite:
	@echo "$@: $(PYT2_SKIP)" && false
endif
