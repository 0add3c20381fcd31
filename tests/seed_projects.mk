# make test-seed-projects (issue 51): the seeds' own projects from PyPI on distmesh beside Gloo
# (scripts/seed_projects.sh says what runs: Optimus-DL 0.2.6's multi-process tests and a tiny
# run of its own training recipe, LLaMA-Factory 0.9.5's v1 SFT trainer with FSDP2 on a tiny
# local model; each under Gloo and with DISTMESH_REPLACE_GLOO=1, compared).
# Not part of `make test`: the first run makes the projects' environments (a few minutes, from
# the package index), and Optimus-DL's tests take tens of minutes on 2 cores. Skipped, with the
# reason, where torch's CPU wheel, python3.11 or a package cannot be had. SEED_K=expr runs the
# tests pytest -k selects; results in build/seed-projects.
.PHONY: test-seed-projects
test-seed-projects:
	SEED_OUT='$(abspath $(BUILD))/seed-projects' bash scripts/seed_projects.sh
