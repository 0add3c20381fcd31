# The lead's fragment: examples (plain ones with no backend, tcp_*.c with DISTMESH_TCP) build in
# every configuration, so the README's programs never rot.
EXAMPLE_SRCS := $(filter-out examples/tcp_%.c,$(wildcard examples/*.c))
EXAMPLE_TCP_SRCS := $(wildcard examples/tcp_*.c)
EXAMPLE_BINS := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS) $(EXAMPLE_TCP_SRCS))
EXTRA_BINS += $(EXAMPLE_BINS)

$(BUILD)/examples/tcp_%: examples/tcp_%.c distmesh.c distmesh.h distmesh_trace.h distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< distmesh.c -o $@ $(UV_LIBS) $(LDLIBS_ALL)

$(BUILD)/examples/%: examples/%.c distmesh.c distmesh.h distmesh_trace.h distmesh_shm.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< distmesh.c -o $@ $(LDLIBS_ALL)
