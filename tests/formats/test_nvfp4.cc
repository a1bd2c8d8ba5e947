// NVFP4: global scale, weight block quantization (checkpoint-format.md §4.4) and activation QDQ
// (quark-moe.md §10.6, §16.8).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "qmoe/formats.h"
#include "reference_tables.h"

namespace qmoe {
namespace {

using test::pow2;

TEST(Nvfp4, GlobalScale) {
  EXPECT_EQ(kNvfp4Block, 16);
  EXPECT_EQ(nvfp4_global_scale(2688.0f), 1.0f);  // 6 · 448
  EXPECT_EQ(nvfp4_global_scale(0.0f), 0.0f);
  for (float amax : {1.0f, 3.0f, 0.1234f, 1e-20f, 7.5e30f}) {
    // Correctly rounded amax / 2688 (a float quotient computed in double and rounded once is exact).
    EXPECT_EQ(nvfp4_global_scale(amax), static_cast<float>(static_cast<double>(amax) / 2688.0)) << amax;
  }
}

std::vector<uint8_t> quantize_weight(std::vector<float> x, float ws2, uint8_t* scale_code) {
  x.resize(16, 0.0f);
  std::vector<uint8_t> codes(16, 0xAA);
  *scale_code = nvfp4_quantize_weight_block(x.data(), 16, ws2, codes.data());
  return codes;
}

TEST(Nvfp4, WeightBlockKnownAnswers) {
  uint8_t sc = 0xFF;
  // ws2 = 1: block amax 2688 → s = 448 (code 0x7E); elements /448.
  auto c = quantize_weight({2688, 1344, 448, -224, 0, 100, -0.0f}, 1.0f, &sc);
  EXPECT_EQ(sc, 0x7E);
  const uint8_t want1[7] = {7, 5, 2, 9, 0, 0, 0};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(c[i], want1[i]) << i;
  // amax 600 → s = 100, which ties between 96 (mantissa 4) and 104 (mantissa 5) → 96 = code 0x6C.
  c = quantize_weight({600, 300, -150, 48, 47}, 1.0f, &sc);
  EXPECT_EQ(sc, 0x6C);
  EXPECT_EQ(fp8_e4m3_decode(sc), 96.0f);
  const uint8_t want2[5] = {7, 5, 0xB, 1, 1};  // 6.25 → clamp 6; 3.125 → 3; −1.5625 → −1.5; 0.5; 0.4896 → 0.5
  for (int i = 0; i < 5; ++i) EXPECT_EQ(c[i], want2[i]) << i;
  // The block holding the tensor amax maps to scale 448 with ws2 = amax/(6·448).
  const float ws2 = nvfp4_global_scale(3.0f);
  c = quantize_weight({3.0f, -1.5f, 0.75f}, ws2, &sc);
  EXPECT_EQ(sc, 0x7E);
  EXPECT_EQ(c[0], 7);
  EXPECT_EQ(c[1], 0xD);  // −1.5 / 0.5 = −3
  EXPECT_EQ(c[2], 3);    // 0.75 / 0.5 = 1.5
}

TEST(Nvfp4, WeightBlockEdgeCases) {
  uint8_t sc = 0xFF;
  auto c = quantize_weight({1, 2, 3}, 0.0f, &sc);  // ws2 = 0 → scale 0, codes 0
  EXPECT_EQ(sc, 0);
  for (auto v : c) EXPECT_EQ(v, 0);
  c = quantize_weight({}, 1.0f, &sc);  // all-zero block
  EXPECT_EQ(sc, 0);
  for (auto v : c) EXPECT_EQ(v, 0);
  c = quantize_weight({0.001f, -0.0005f}, 1.0f, &sc);  // s = 1.7e-4 < 2^-10 → scale 0 → codes 0
  EXPECT_EQ(sc, 0);
  for (auto v : c) EXPECT_EQ(v, 0);
  c = quantize_weight({6000, -6000, 1}, 1.0f, &sc);  // s = 1000 clamps to 448; elements clamp to ±6
  EXPECT_EQ(sc, 0x7E);
  EXPECT_EQ(c[0], 7);
  EXPECT_EQ(c[1], 15);
  EXPECT_EQ(c[2], 0);  // 1/448 → 0
}

std::vector<float> act_qdq(std::vector<float> x, float gs) {
  std::vector<float> out(x.size());
  nvfp4_qdq_block(x.data(), static_cast<int>(x.size()), gs, out.data());
  return out;
}

void expect_values(const std::vector<float>& got, const std::vector<float>& want, float gs) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "gs " << gs << " element " << i;
}

TEST(Nvfp4, ActivationQdqKnownAnswers) {
  // amax 600: s = gs·600/6 ties in fp8 to 96·gs for gs ∈ {0.5, 1, 2}; the effective step is 96 each time.
  for (float gs : {0.5f, 1.0f, 2.0f})
    expect_values(act_qdq({600, 300, 100, -50, 10, 0, -0.0f, 575}, gs), {576, 288, 96, -48, 0, 0, 0, 576}, gs);
  // Block scale clamps to 448: 6000 → 6 · 448.
  expect_values(act_qdq({6000, -3000, 1}, 1.0f), {2688, -2688, 0}, 1.0f);
  // fp8-subnormal block scale 2^-8 (amax = 6·2^-8): 0.01·256 = 2.56 → 3; −0.005·256 = −1.28 → −1.5.
  expect_values(act_qdq({0.0234375f, 0.01f, -0.005f}, 1.0f), {0.0234375f, 0.01171875f, -0.005859375f}, 1.0f);
}

TEST(Nvfp4, ActivationZeroAndFlushedBlocks) {
  for (float gs : {0.001f, 1.0f, 1000.0f}) {
    for (float v : act_qdq(std::vector<float>(16, 0.0f), gs)) {
      EXPECT_FALSE(std::isnan(v));
      EXPECT_EQ(v, 0.0f);
    }
  }
  // gs · amax / 6 below half the smallest fp8 subnormal (2^-10): the block scale is 0, so is the output.
  for (float v : act_qdq({0.001f, -0.0005f, 0.0002f}, 1.0f)) EXPECT_EQ(v, 0.0f);
}

// Random blocks at gs ∈ {0.5, 1, 0.001}: each output equals an independent evaluation of §10.6
// (tables of reference_tables.h, same fp32 operation order) and is within half an E2M1 grid step
// (or the clamp excess beyond 6) of x at the block's effective step sb/gs.
TEST(Nvfp4, RandomActivationBlocksRoundTrip) {
  const auto e2m1 = test::e2m1_magnitudes();
  const auto e4m3 = test::e4m3_magnitudes();
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_real_distribution<float> log_amax(-12.0f, 9.0f);  // gs·amax/6 from fp8 subnormals to > 448
  const int blocks = test::test_iterations(2000, 200);
  for (float gs : {0.5f, 1.0f, 0.001f}) {
    int nonzero_blocks = 0;
    for (int b = 0; b < blocks; ++b) {
      const float target = std::exp2(log_amax(rng)) * 6.0f / gs;  // wanted amax
      std::vector<float> x(16);
      for (auto& v : x) v = u(rng) * target;
      std::vector<float> out(16);
      nvfp4_qdq_block(x.data(), 16, gs, out.data());
      float amax = 0;
      for (float v : x) amax = std::fmax(amax, std::fabs(v));
      float s = gs * amax / 6.0f;
      s = std::fmin(s, 448.0f);
      const float sb = static_cast<float>(test::round_to_grid(e4m3, s));
      if (sb == 0.0f) {
        for (float v : out) ASSERT_EQ(v, 0.0f);
        ASSERT_LE(s, pow2(-10));
        continue;
      }
      ++nonzero_blocks;
      const float inv = gs / sb, deq = sb / gs;
      for (int i = 0; i < 16; ++i) {
        const float y = x[i] * inv;
        const double q = test::round_to_grid(e2m1, std::fabs(static_cast<double>(y)));
        const float want = static_cast<float>(y < 0 ? -q : q) * deq;
        ASSERT_EQ(out[i], want) << "gs " << gs << " x " << x[i] << " sb " << sb;
        const double ay = std::fabs(static_cast<double>(x[i]) / deq);
        const double bound = (ay >= 6 ? ay - 6 : test::half_step_at(e2m1, ay)) * deq;
        ASSERT_LE(std::fabs(static_cast<double>(out[i]) - x[i]), bound * (1 + 1e-5) + 1e-6 * std::fabs(x[i]))
            << "gs " << gs << " x " << x[i];
      }
    }
    EXPECT_GT(nonzero_blocks, blocks / 2) << gs;
  }
}

// Weight blocks: dequantization w = e2m1 · (fp8(scale) · ws2) is within half a grid step of the
// input (elements were quantized with exactly that effective scale).
TEST(Nvfp4, RandomWeightBlocksRoundTrip) {
  const auto e2m1 = test::e2m1_magnitudes();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int rows = test::test_iterations(200, 20);
  std::vector<float> w(rows * 64);
  for (auto& v : w) v = nd(rng) * 0.02f;
  float amax = 0;
  for (float v : w) amax = std::fmax(amax, std::fabs(v));
  const float ws2 = nvfp4_global_scale(amax);
  int max_scale_blocks = 0;
  for (size_t b = 0; b < w.size() / 16; ++b) {
    uint8_t codes[16];
    const uint8_t sc = nvfp4_quantize_weight_block(&w[16 * b], 16, ws2, codes);
    const float eff = fp8_e4m3_decode(sc) * ws2;
    if (sc == 0x7E) ++max_scale_blocks;
    for (int i = 0; i < 16; ++i) {
      const float x = w[16 * b + i];
      const float deq = fp4_e2m1_decode(codes[i]) * eff;
      const double ay = std::fabs(static_cast<double>(x) / eff);
      const double bound = (ay >= 6 ? ay - 6 : test::half_step_at(e2m1, ay)) * eff;
      ASSERT_LE(std::fabs(static_cast<double>(deq) - x), bound * (1 + 1e-5) + 1e-6 * std::fabs(x)) << "block " << b << " i " << i;
    }
  }
  EXPECT_GE(max_scale_blocks, 1);  // the block holding the tensor amax maps to 448
}

}  // namespace
}  // namespace qmoe
