# `make bench-python` (issue 27; not part of make test): the Python package against mpi4py and
# torch.distributed's Gloo, one harness for all (bench/py_bench.py): numpy float32 in-place
# all-reduce 8 B .. 64 MiB at 2 and 4 ranks, dist.all_reduce through the "distmesh" backend
# against Gloo, DDP step time on a model with 16 MiB of gradients, and Python's cost over the C
# call (parity_bench_dm at the same sizes). Tables on stdout, raw lines in
# $(BUILD)/bench-python/raw.txt. PYBENCH_ARGS: e.g. "--quick" (a check that it runs),
# "--ranks 2 --reps 5", "--systems dm mpi4py".
PYBENCH_ARGS ?=
.PHONY: bench-python
# Where tests/python_torch2.mk can make its torch 2.13 venv, the torch systems run under it too
# (gloo2, tdm2, ddp_dm2, ddp_gloo2: rows beside 1.13's).
PYBENCH_T2 := $(if $(PYT2_SKIP),,--torch2-python $(abspath $(PYT2_PY)) --torch2-lib $(abspath $(PYT2_LIB)))
bench-python: deps
	@$(MAKE) --no-print-directory $(PY_STAMP) $(PARITY_DIR)/parity_bench_dm $(if $(PYT2_SKIP),,$(PYT2_STAMP))
	PYTHONPATH=$(CURDIR)/$(PY_LIB) $(PY) bench/py_bench.py --c-bench $(CURDIR)/$(PARITY_DIR)/parity_bench_dm \
	    $(PYBENCH_T2) --out $(BUILD)/bench-python $(PYBENCH_ARGS)
