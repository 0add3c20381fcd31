# The lead's fragment: examples and the shipped distmesh.c must build with every flag set.
EXAMPLE_SRCS := $(wildcard examples/*.c)
EXAMPLE_BINS := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS))
EXTRA_BINS += $(EXAMPLE_BINS)

$(BUILD)/examples/%: examples/%.c distmesh.c distmesh.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< distmesh.c -o $@ $(LDLIBS_ALL)
