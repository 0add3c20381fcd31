# encrypt fragment: encrypted links between hosts (distmesh_socket.h >>socket aead): the key
# derivation, the link over a socket pair, and a man in the middle (this program's own connect()
# sends every data connection of a rank through a tampering proxy) between forked ranks on two
# simulated hosts. tests/test_encrypt.c compiles the implementation itself, with DISTMESH_TCP and
# DISTMESH_OPENSSL (OPENSSL=0 leaves it out); loopback only.
# tests/test_store_seal.c: the store's connections sealed (distmesh_store.h >>store seal): every
# operation, a tampering proxy, the plain-text control, a setting that differs; linked with
# tests/tcp.mk's impl.o. Both programs need the TCP backend and libcrypto.
ifneq ($(wildcard distmesh_tcp.h),)
ifeq ($(OPENSSL),1)
ENCRYPT_TEST := $(BUILD)/encrypt/test_encrypt
STORE_SEAL_TEST := $(BUILD)/encrypt/test_store_seal
TEST_BINS += $(ENCRYPT_TEST) $(STORE_SEAL_TEST)
endif
endif

$(BUILD)/encrypt/test_encrypt: tests/test_encrypt.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

$(BUILD)/encrypt/test_store_seal: tests/test_store_seal.c tests/test_filter.h tests/prelude.h tests/test_world.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
