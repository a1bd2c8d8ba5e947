// quantize_linear: per scheme, the stored tensors are the formats library's quantization of the
// weights, dequantization is exact, and quantize(dequant(q)) reproduces q.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/quantizer.h"
#include "qmoe/schemes.h"

namespace qmoe {
namespace {

// Bf16-valued N(0, 0.02) weights with a few ×10 outliers per row and one all-zero MX block.
std::vector<float> test_weights(int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (auto& v : w) v = bf16_round(n(rng));
  for (int64_t r = 0; r < out; ++r) {
    w[static_cast<size_t>(r * in + (r * 7) % in)] = bf16_round(w[static_cast<size_t>(r * in + (r * 7) % in)] * 10.0f);
    w[static_cast<size_t>(r * in + (r * 13 + 5) % in)] = bf16_round(w[static_cast<size_t>(r * in + (r * 13 + 5) % in)] * 10.0f);
  }
  for (int64_t i = 0; i < 32 && i < in; ++i) w[static_cast<size_t>(i)] = 0.0f;  // row 0, block 0: all zero
  return w;
}

const Tensor& find(const std::vector<NamedTensor>& v, const std::string& name) {
  for (const auto& t : v)
    if (t.name == name) return t.tensor;
  throw Error("missing " + name);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

class QuantizeLinearScheme : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeLinearScheme, LayoutDequantAndFixedPoint) {
  const SchemeInfo& s = scheme_by_name(GetParam());
  const int64_t out = 48, in = 256;
  const auto w = test_weights(out, in, 7);
  LinearQuantOptions opt;
  opt.input_amax = 3.25f;
  opt.threads = 3;
  const auto q = quantize_linear("l", w.data(), out, in, s, opt);

  // Same names / dtypes / shapes as the layout.
  const auto layout = quantized_linear_layout("l", out, in, s);
  ASSERT_EQ(layout.size(), q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    EXPECT_EQ(layout[i].name, q[i].name);
    EXPECT_EQ(layout[i].dtype, q[i].tensor.dtype()) << q[i].name;
    EXPECT_EQ(layout[i].shape, q[i].tensor.shape()) << q[i].name;
  }

  // Threads do not change the bytes.
  LinearQuantOptions opt1 = opt;
  opt1.threads = 1;
  const auto q1 = quantize_linear("l", w.data(), out, in, s, opt1);
  for (size_t i = 0; i < q.size(); ++i) EXPECT_TRUE(same_bytes(q[i].tensor, q1[i].tensor)) << q[i].name;

  // Dequantization against an independent per-element computation with formats.h.
  const auto d = dequantize_linear("l", q, s);
  ASSERT_EQ(d.size(), w.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    err += (double(d[i]) - w[i]) * (double(d[i]) - w[i]);
    ref += double(w[i]) * w[i];
  }
  const double rel = std::sqrt(err / ref);
  // Error bound per format: half a grid step relative to the block/row/tensor max, loosely.
  const double bound = s.weight == WeightFormat::BF16 ? 0.0
                       : s.weight == WeightFormat::Mxfp4 || s.weight == WeightFormat::Nvfp4 ? 0.25
                       : s.weight == WeightFormat::Int8 ? 0.05 : 0.12;
  EXPECT_LE(rel, bound) << s.name;
  if (s.weight != WeightFormat::BF16) {
    EXPECT_GT(rel, 0.0) << s.name;
  }

  // quantize(dequant(q)) == q for formats whose scales are reproduced exactly by the max element
  // (MX: powers of two; NVFP4 / FP8: the max maps to the format's max). INT8's amax/127.5 scale
  // does not round-trip (the max element lands on 127 or −128, not ±127.5), so only its codes at a
  // fixed scale are checked below.
  if (s.weight != WeightFormat::Int8) {
    const auto q2 = quantize_linear("l", d.data(), out, in, s, opt);
    for (size_t i = 0; i < q.size(); ++i) EXPECT_TRUE(same_bytes(q[i].tensor, q2[i].tensor)) << s.name << " " << q[i].name;
  }

  // Elements equal the formats-library quantization of the source weights.
  const Tensor& wq = find(q, "l.weight");
  switch (s.weight) {
    case WeightFormat::Int8:
    case WeightFormat::Fp8E4M3: {
      const auto sc = to_f32(find(q, "l.weight_scale"));
      const bool pc = s.weight_scale == WeightScale::PerChannel;
      float amax_t = 0;
      for (float v : w) amax_t = std::max(amax_t, std::fabs(v));
      for (int64_t r = 0; r < out; ++r) {
        float amax = 0;
        for (int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(w[r * in + i]));
        const float expect_scale = s.weight == WeightFormat::Int8 ? int8_weight_scale(pc ? amax : amax_t)
                                                                  : fp8_weight_scale(pc ? amax : amax_t);
        ASSERT_EQ(sc[pc ? r : 0], expect_scale);
        for (int64_t i = 0; i < in; ++i) {
          const uint8_t expect = s.weight == WeightFormat::Int8
                                     ? static_cast<uint8_t>(int8_quantize_weight(w[r * in + i], expect_scale))
                                     : fp8_quantize_weight(w[r * in + i], expect_scale);
          ASSERT_EQ(wq.data_as<uint8_t>()[r * in + i], expect) << r << "," << i;
        }
      }
      if (s.weight == WeightFormat::Int8) {
        const Tensor& zp = find(q, "l.weight_zero_point");
        for (size_t i = 0; i < zp.nbytes(); ++i) EXPECT_EQ(zp.data_as<int8_t>()[i], 0);
      }
      break;
    }
    case WeightFormat::Nvfp4: {
      float amax_t = 0;
      for (float v : w) amax_t = std::max(amax_t, std::fabs(v));
      EXPECT_EQ(to_f32(find(q, "l.weight_scale_2"))[0], amax_t / (6.0f * 448.0f));
      EXPECT_EQ(to_f32(find(q, "l.input_scale_2"))[0], 3.25f / (6.0f * 448.0f));
      // The largest block scale code is 448 (0x7E).
      const Tensor& sc = find(q, "l.weight_scale");
      uint8_t mx = 0;
      for (size_t i = 0; i < sc.nbytes(); ++i) mx = std::max<uint8_t>(mx, sc.data_as<uint8_t>()[i] & 0x7F);
      EXPECT_EQ(mx, 0x7E);
      break;
    }
    case WeightFormat::Mxfp4:
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: {
      // The all-zero block stores byte 1 (Quark's to_e8m0_uint8 clamp) and code 0.
      EXPECT_EQ(find(q, "l.weight_scale").data_as<uint8_t>()[0], 1);
      EXPECT_EQ(d[0], 0.0f);
      break;
    }
    default: break;
  }

  // Static input scales.
  if (s.act == ActQuant::Fp8Static) {
    EXPECT_EQ(to_f32(find(q, "l.input_scale"))[0], 3.25f / 448.0f);
  }
  if (s.act == ActQuant::Int8Static) {
    EXPECT_EQ(to_f32(find(q, "l.input_scale"))[0], 3.25f / 127.0f);
    EXPECT_EQ(find(q, "l.input_zero_point").data_as<int8_t>()[0], 0);
  }
}

std::vector<std::string> all_scheme_names() {
  std::vector<std::string> v;
  for (const auto& s : all_schemes()) v.emplace_back(s.name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, QuantizeLinearScheme, ::testing::ValuesIn(all_scheme_names()),
                         [](const auto& info) { return info.param; });

TEST(QuantizeLinear, StaticSchemeWithoutCalibrationFails) {
  const std::vector<float> w(16 * 64, 0.5f);
  for (const auto& s : all_schemes()) {
    if (!act_is_static(s.act)) continue;
    try {
      quantize_linear("model.layers.0.mlp.experts.0.up_proj", w.data(), 16, 64, s);
      ADD_FAILURE() << s.name << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("calibration"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("experts.0.up_proj"), std::string::npos) << e.what();
    }
  }
}

TEST(QuantizeLinear, BadShapesAndValuesFail) {
  std::vector<float> w(16 * 48, 0.5f);
  EXPECT_THROW(quantize_linear("x", w.data(), 16, 48, scheme_by_name("w_mxfp4")), Error);  // 48 % 32
  std::vector<float> w2(16 * 64, 0.5f);
  w2[5] = NAN;
  EXPECT_THROW(quantize_linear("x", w2.data(), 16, 64, scheme_by_name("w_mxfp4")), Error);
  EXPECT_THROW(quantize_linear("x", w2.data(), 16, 64, scheme_by_name("w_int8_channel_a_int8_dyn_token")), Error);
}

}  // namespace
}  // namespace qmoe
