# Python fragment (python/, issue 27): the package distmesh (the extension distmesh._C built
# from the headers for /usr/bin/python3, setuptools) under $(BUILD)/python/lib, the reference
# program of its tests, and python/tests/run_pytest.sh as one program of `make test`.
# `make install` also installs the package (install-python); `make bench-python` is in
# bench/python.mk.
PY ?= /usr/bin/python3
PY_BUILD := $(BUILD)/python
PY_LIB := $(PY_BUILD)/lib
PY_STAMP := $(PY_BUILD)/built.stamp
PY_REF := $(PY_BUILD)/ref_collectives
PY_TEST := $(PY_BUILD)/run_pytest
PY_SRCS := python/setup.py $(wildcard python/src/*.c python/src/*.h python/distmesh/*.py python/distmesh/*.pyi python/distmesh/py.typed) $(wildcard distmesh*.h)
TEST_BINS += $(PY_TEST)

# libcrypto as the C builds have it (OPENSSL, Makefile): the package then agrees with them on
# DISTMESH_ENCRYPT's auto
PY_OPENSSL := $(if $(filter 1,$(OPENSSL)),1,0)
# setuptools compiles with Python's own flags plus these (the sanitizers of asan builds too)
$(PY_STAMP): $(PY_SRCS)
	@mkdir -p $(PY_BUILD)
	cd python && DISTMESH_PY_WERROR=1 DISTMESH_OPENSSL=$(PY_OPENSSL) CC="$(CC)" CFLAGS="$(SAN)" LDFLAGS="$(SAN)" $(PY) setup.py -q build \
	    --build-base $(abspath $(PY_BUILD))/setuptools --build-lib $(abspath $(PY_LIB))
	@touch $@

$(PY_REF): python/tests/ref_collectives.c $(DISTMESH_C_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(LDLIBS_ALL)

# under ThreadSanitizer the tests are skipped (CPython is not built for it): nothing to build
ifneq (,$(findstring thread,$(SAN)))
PY_TEST_DEPS := python/tests/run_pytest.sh
else
PY_TEST_DEPS := python/tests/run_pytest.sh $(PY_STAMP) $(PY_REF)
endif
$(PY_TEST): $(PY_TEST_DEPS)
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\nexec env DM_PY=%s DM_PY_LIB=%s DM_PY_REF=%s DM_PY_SAN="%s" CC="%s" bash %s "$$@"\n' \
	    '$(PY)' '$(abspath $(PY_LIB))' '$(abspath $(PY_REF))' '$(SAN)' '$(CC)' '$(CURDIR)/python/tests/run_pytest.sh' > $@
	@chmod +x $@

.PHONY: python install-python
python: $(PY_STAMP)

# The package for the system python3, into $(PY_SITE): Debian's directory for packages
# installed by hand under $(PREFIX) ($(PREFIX)/lib/python3.N/dist-packages, on sys.path for
# /usr/local and /usr), staged under $(DESTDIR) when given. Debian marks its Python as
# externally managed; this target is the sanctioned way in (no network, no dependencies).
# PY_NCCL=1 builds the NCCL backend in (setup.py's DISTMESH_NCCL=1: CUDA_HOME, NCCL_HOME).
PY_SITE ?= $(PREFIX)/lib/python$(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)/dist-packages
PY_NCCL ?=
install: install-python
install-python:
	cd python && DISTMESH_NCCL=$(PY_NCCL) CUDA_HOME=$(CUDA_HOME) $(if $(NCCL_HOME),NCCL_HOME=$(NCCL_HOME)) \
	    $(PY) -m pip install --no-build-isolation --no-deps --no-index --break-system-packages \
	    --upgrade --no-warn-script-location --target $(DESTDIR)$(PY_SITE) .
