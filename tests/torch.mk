# torch fragment: TCPStore interop with the installed torch (Debian's python3-torch 1.13, torch
# < 2.2 protocol; 2.x where installed), both directions, through tests/fixtures/store_tool.c.
TORCH_TEST := $(BUILD)/torch/test_torch
STORE_TOOL := $(BUILD)/fixtures/store_tool
TEST_BINS += $(TORCH_TEST)

$(STORE_TOOL): tests/fixtures/store_tool.c $(DISTMESH_C_TCP_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_LINKS_DISTMESH_C $(UV_CFLAGS) $^ -o $@ $(UV_LIBS) $(LDLIBS_ALL)

$(TORCH_TEST): tests/test_torch.c tests/test_filter.h tests/prelude.h | $(STORE_TOOL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDM_SRCDIR='"$(CURDIR)"' -DDM_STORE_TOOL='"$(abspath $(STORE_TOOL))"' $< -o $@ \
	    $(CMOCKA_LIBS) $(LDLIBS_ALL)
