#include <gtest/gtest.h>

#include "qmoe/formats.h"
#include "qmoe/schemes.h"

namespace qmoe {
namespace {

TEST(Fp4, DecodeTable) {
  const float expected[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(fp4_e2m1_decode(static_cast<uint8_t>(c)), expected[c]) << c;
}

TEST(Registry, EveryCanonicalNameResolves) {
  for (const auto& s : all_schemes()) EXPECT_EQ(find_scheme(s.name), &s);
  EXPECT_EQ(find_scheme("nope"), nullptr);
}

}  // namespace
}  // namespace qmoe
