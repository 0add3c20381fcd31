# maps fragment: the code's maps held against the code (tests/test_maps.c): the cost model on
# paper (scripts/cost_model.py, which runs the model's front end, scripts/cost_model.c, built
# here from distmesh.h's own choice) against what the collectives run, and the headers' tag
# indexes (scripts/check_tags.py). The front end is also what the script builds for itself.
MAPS_TEST := $(BUILD)/maps/test_maps
COST_MODEL_TOOL := $(BUILD)/tools/cost_model
TEST_BINS += $(MAPS_TEST)

$(COST_MODEL_TOOL): scripts/cost_model.c $(DM_CORE_HDRS) distmesh_shm.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< -o $@ $(LDLIBS_ALL)

$(MAPS_TEST): tests/test_maps.c tests/test_filter.h tests/prelude.h tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h | $(COST_MODEL_TOOL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDM_SRCDIR='"$(CURDIR)"' -DDM_COST_MODEL='"$(abspath $(COST_MODEL_TOOL))"' \
	    tests/test_maps.c tests/impl.c -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
