# launch fragment: rendezvous derived from mpirun / srun with no MASTER_* variables, launcher
# local ranks, rendezvous error messages (tests/test_launch.c), and a real `mpirun -np 4` of
# examples/tcp_all_reduce.c (openmpi-bin, installed by scripts/deps.sh).
LAUNCH_TEST := $(BUILD)/launch/test_launch
TEST_BINS += $(LAUNCH_TEST)

$(LAUNCH_TEST): tests/test_launch.c tests/test_filter.h $(BUILD)/tcp/impl.o | $(BUILD)/examples/tcp_all_reduce
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_EXAMPLE='"$(CURDIR)/$(BUILD)/examples/tcp_all_reduce"' $(UV_CFLAGS) \
	    $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
