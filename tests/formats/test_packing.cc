// FP4 nibble packing and FP6 4-in-3 packing (quark-moe.md §10.1, §10.2; checkpoint-format.md §4.1–4.2),
// with hand-built byte expectations.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "qmoe/formats.h"
#include "reference_tables.h"

namespace qmoe {
namespace {

TEST(PackFp4, EvenElementInLowNibble) {
  const uint8_t codes[6] = {0x1, 0xA, 0xF, 0x0, 0x7, 0x8};
  uint8_t packed[3] = {0, 0, 0};
  pack_fp4(codes, 6, packed);
  EXPECT_EQ(packed[0], 0xA1);
  EXPECT_EQ(packed[1], 0x0F);
  EXPECT_EQ(packed[2], 0x87);
  uint8_t back[6] = {};
  unpack_fp4(packed, 6, back);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], codes[i]) << i;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(fp4_code_at(packed, i), codes[i]) << i;
}

TEST(PackFp4, HighBitsOfCodesAreIgnored) {
  const uint8_t codes[2] = {0xF3, 0x15};
  uint8_t packed[1] = {0};
  pack_fp4(codes, 2, packed);
  EXPECT_EQ(packed[0], 0x53);
}

TEST(PackFp6, SingleElementsLandWhereTheSpecSays) {
  struct Case {
    uint8_t v[4];
    uint8_t b[3];
  };
  // W = v0 | v1<<6 | v2<<12 | v3<<18, bytes little endian (§10.2):
  // b0 = v0 + v1[1:0]<<6, b1 = v1[5:2] + v2[3:0]<<4, b2 = v2[5:4] + v3<<2.
  const Case cases[] = {
      {{0x3F, 0, 0, 0}, {0x3F, 0x00, 0x00}},
      {{0, 0x3F, 0, 0}, {0xC0, 0x0F, 0x00}},
      {{0, 0, 0x3F, 0}, {0x00, 0xF0, 0x03}},
      {{0, 0, 0, 0x3F}, {0x00, 0x00, 0xFC}},
      {{0x01, 0x02, 0x04, 0x08}, {0x81, 0x40, 0x20}},
      {{0x2A, 0x15, 0x2A, 0x15}, {0x6A, 0xA5, 0x56}},
      {{0x3F, 0x3F, 0x3F, 0x3F}, {0xFF, 0xFF, 0xFF}},
  };
  for (const auto& c : cases) {
    uint8_t packed[3] = {0xEE, 0xEE, 0xEE};
    pack_fp6(c.v, 4, packed);
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(packed[k], c.b[k]) << "byte " << k << " for v = " << int(c.v[0]) << "," << int(c.v[1]) << ","
                                   << int(c.v[2]) << "," << int(c.v[3]);
    uint8_t back[4] = {};
    unpack_fp6(packed, 4, back);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(back[k], c.v[k]) << k;
      EXPECT_EQ(fp6_code_at(packed, k), c.v[k]) << k;
    }
  }
}

TEST(PackFp6, SecondGroupStartsAtByteThree) {
  const uint8_t codes[8] = {0, 0, 0, 0, 0x3F, 0x01, 0, 0x20};
  uint8_t packed[6] = {};
  pack_fp6(codes, 8, packed);
  const uint8_t want[6] = {0, 0, 0, 0x7F, 0x00, 0x80};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(packed[k], want[k]) << k;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fp6_code_at(packed, i), codes[i]) << i;
}

TEST(Packing, RandomRowsRoundTrip) {
  std::mt19937 rng(1234);
  const int rows = test::test_iterations(200, 20);
  for (int r = 0; r < rows; ++r) {
    const int n = 4 * (1 + static_cast<int>(rng() % 64));
    std::vector<uint8_t> c4(n), c6(n);
    for (int i = 0; i < n; ++i) {
      c4[i] = rng() & 0xF;
      c6[i] = rng() & 0x3F;
    }
    std::vector<uint8_t> p4(n / 2), p6(3 * n / 4), b4(n), b6(n);
    pack_fp4(c4.data(), n, p4.data());
    pack_fp6(c6.data(), n, p6.data());
    unpack_fp4(p4.data(), n, b4.data());
    unpack_fp6(p6.data(), n, b6.data());
    ASSERT_EQ(b4, c4);
    ASSERT_EQ(b6, c6);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(fp4_code_at(p4.data(), i), c4[i]);
      ASSERT_EQ(fp6_code_at(p6.data(), i), c6[i]);
      // Independent bit addressing: FP6 element i occupies bits [6i, 6i+6) of the little-endian row.
      unsigned v = 0;
      for (int b = 0; b < 6; ++b) {
        const int bit = 6 * i + b;
        v |= ((p6[bit / 8] >> (bit % 8)) & 1u) << b;
      }
      ASSERT_EQ(v, c6[i]) << i;
      ASSERT_EQ((p4[i / 2] >> (4 * (i % 2))) & 0xF, c4[i]) << i;
    }
  }
}

}  // namespace
}  // namespace qmoe
