# launch fragment: rendezvous derived from mpirun / srun with no MASTER_* variables, launcher
# local ranks, rendezvous error messages (tests/test_launch.c), and the launcher examples run for
# real on examples/tcp_all_reduce.c: examples/launch_mpirun.sh (`mpirun -np 4`, openmpi-bin),
# examples/launch_torchrun.sh (Debian's torchrun, python3-torch; both installed by
# scripts/deps.sh), examples/launch_by_hand.sh, and examples/launch_srun.sh in a private
# single-node Slurm (tests/slurm_single_node.sh; skipped without slurm-wlm, munge or root).
LAUNCH_TEST := $(BUILD)/launch/test_launch
TEST_BINS += $(LAUNCH_TEST)

$(LAUNCH_TEST): tests/test_launch.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h $(BUILD)/tcp/impl.o | $(BUILD)/examples/tcp_all_reduce
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_EXAMPLE='"$(abspath $(BUILD))/examples/tcp_all_reduce"' \
	    -DDM_SRCDIR='"$(CURDIR)"' $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
