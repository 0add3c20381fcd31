# The lead's fragment: examples (plain ones with no backend, tcp_*.c with DISTMESH_TCP) build in
# every configuration, so the README's programs never rot.
EXAMPLE_SRCS := $(filter-out examples/tcp_%.c,$(wildcard examples/*.c))
EXAMPLE_TCP_SRCS := $(wildcard examples/tcp_*.c)
EXAMPLE_BINS := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS) $(EXAMPLE_TCP_SRCS))
EXTRA_BINS += $(EXAMPLE_BINS)

# distmesh.c compiled once per configuration, linked into every example as `cc example.c
# distmesh.c` would (one compile of the implementation instead of one per program).
DISTMESH_C_O     := $(BUILD)/examples/distmesh.o
DISTMESH_C_TCP_O := $(BUILD)/examples/distmesh_tcp.o
$(DISTMESH_C_O): distmesh.c $(DM_CORE_HDRS) distmesh_shm.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@
$(DISTMESH_C_TCP_O): distmesh.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) -c $< -o $@

$(BUILD)/examples/tcp_%: examples/tcp_%.c $(DISTMESH_C_TCP_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $^ -o $@ $(UV_LIBS) $(LDLIBS_ALL)

$(BUILD)/examples/%: examples/%.c $(DISTMESH_C_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(LDLIBS_ALL)
