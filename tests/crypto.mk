# crypto fragment: SHA-256 / HMAC-SHA256 of distmesh.h against FIPS 180-4 and RFC 4231 vectors.
# Links the core-only impl.o of tests/coretests.mk.
CRYPTO_TEST := $(BUILD)/core/test_crypto
TEST_BINS += $(CRYPTO_TEST)

$(CRYPTO_TEST): $(BUILD)/core/test_crypto.o $(BUILD)/core/impl.o
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
