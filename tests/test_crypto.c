/* SHA-256 and HMAC-SHA256 of distmesh.h against the published vectors: FIPS 180-4's examples
   ("abc", the 448-bit message, one million 'a'; the values from NIST's example files), the
   empty message, and every test case of RFC 4231 (case 5 compares the first 128 bits, as the
   RFC does). Also: incremental updates in odd pieces give the one-shot digest. */
#include "prelude.h"
#include "distmesh.h"

static void check_sha(const void* msg, size_t n, const char* want) {
    unsigned char d[32];
    char hx[65];
    dm_sha256(msg, n, d);
    tohex(d, 32, hx);
    assert_string_equal(hx, want);
}

static void test_sha256_fips(void** state) {
    static char million[1000000];
    dm_sha256_ctx c;
    unsigned char d[32];
    char hx[65];
    size_t i;
    (void)state;
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha(NULL, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    memset(million, 'a', sizeof(million));
    check_sha(million, sizeof(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* the same million in pieces of 1..127 bytes through the incremental interface */
    dm_sha256_init(&c);
    for (i = 0; i < sizeof(million);) {
        size_t k = 1 + (i * 7919) % 127;
        if (k > sizeof(million) - i) k = sizeof(million) - i;
        dm_sha256_update(&c, million + i, k);
        i += k;
    }
    dm_sha256_final(&c, d);
    tohex(d, 32, hx);
    assert_string_equal(hx, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* padding edges: 55, 56, 63, 64 bytes (one or two final blocks) agree between interfaces */
    {
        static const size_t lens[] = { 55, 56, 57, 63, 64, 65, 119, 120 };
        for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            unsigned char d2[32];
            size_t j;
            dm_sha256(million, lens[i], d);
            dm_sha256_init(&c);
            for (j = 0; j < lens[i]; j++) dm_sha256_update(&c, million + j, 1);
            dm_sha256_final(&c, d2);
            assert_memory_equal(d, d2, 32);
        }
    }
}

static void test_hmac_rfc4231(void** state) {
    /* key (hex), data (hex), HMAC-SHA-256 (hex) */
    static const char* const v[][3] = {
        { "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
          "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7" },
        { "4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843" },
        { "aa*20",
          "dd*50",
          "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe" },
        { "0102030405060708090a0b0c0d0e0f10111213141516171819",
          "cd*50",
          "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b" },
        { "0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "546573742057697468205472756e636174696f6e",
          "a3b6167473100ee06e0c796c2955552b" },       /* truncated to 128 bits */
        { "aa*131",
          "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048617368204b6579204669727374",
          "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54" },
        { "aa*131",
          "5468697320697320612074657374207573696e672061206c6172676572207468616e20626c6f636b2d73697a65206b657920616e642061206c6172676572207468616e20626c6f636b2d73697a6520646174612e20546865206b6579206e6565647320746f20626520686173686564206265666f7265206265696e6720757365642062792074686520484d414320616c676f726974686d2e",
          "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2" },
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        unsigned char key[256], msg[256], mac[32];
        char hx[65];
        size_t kn = unhex(v[i][0], key, sizeof(key)), mn = unhex(v[i][1], msg, sizeof(msg)), want = strlen(v[i][2]) / 2;
        dm_hmac_sha256(key, kn, msg, mn, mac);
        tohex(mac, want, hx);
        if (strcmp(hx, v[i][2]) != 0) print_message("RFC 4231 case %zu: got %s\n", i + 1, hx);
        assert_string_equal(hx, v[i][2]);
    }
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_sha256_fips),
    cmocka_unit_test(test_hmac_rfc4231))
