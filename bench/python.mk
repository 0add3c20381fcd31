# `make bench-python` (issue 27; not part of make test): the Python package against mpi4py and
# torch.distributed's Gloo, one harness for all (bench/py_bench.py): numpy float32 in-place
# all-reduce 8 B .. 64 MiB at 2 and 4 ranks, dist.all_reduce through the "distmesh" backend
# against Gloo, DDP step time on a model with 16 MiB of gradients, and Python's cost over the C
# call (parity_bench_dm at the same sizes). Tables on stdout, raw lines in
# $(BUILD)/bench-python/raw.txt. PYBENCH_ARGS: e.g. "--quick" (a check that it runs),
# "--ranks 2 --reps 5", "--systems dm mpi4py".
PYBENCH_ARGS ?=
.PHONY: bench-python
bench-python: deps
	@$(MAKE) --no-print-directory $(PY_STAMP) $(PARITY_DIR)/parity_bench_dm
	PYTHONPATH=$(CURDIR)/$(PY_LIB) $(PY) bench/py_bench.py --c-bench $(CURDIR)/$(PARITY_DIR)/parity_bench_dm \
	    --out $(BUILD)/bench-python $(PYBENCH_ARGS)
