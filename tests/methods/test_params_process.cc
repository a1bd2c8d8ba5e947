// process_expert_params rules: static scales → max over experts (warning when they differ),
// missing scales, NVFP4 global-scale merge and gs = 1/max(input_scale_2), INT8 zero points,
// per-tensor w13 requantization through fp16 (INT8 and FP8), idempotence, dequant before / after.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "error_of.h"
#include "methods_test_util.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/params.h"
#include "synthetic_model.h"

namespace qmoe::test {
namespace {

std::string pname(int e, const char* proj, const char* suffix) {
  return "model.layers.0.mlp.experts." + std::to_string(e) + "." + proj + "." + suffix;
}

TEST(ProcessExpertParams, StaticScalesBecomeMaxOverExpertsWithWarning) {
  SyntheticModel m("w_fp8_tensor_a_fp8_static", ExpertNaming::GateUpDown, 3, 64, 32);
  const float a13[3] = {0.5f, 0.75f, 0.625f}, a2[3] = {0.25f, 0.25f, 0.25f};
  for (int e = 0; e < 3; ++e) {
    m.set(pname(e, "gate_proj", "input_scale"), scalar_f32(a13[e]));
    m.set(pname(e, "up_proj", "input_scale"), scalar_f32(a13[e]));
    m.set(pname(e, "down_proj", "input_scale"), scalar_f32(a2[e]));
  }
  ExpertParams p = m.load();
  process_expert_params(p);
  EXPECT_EQ(p.a13_scale, 0.75f);
  EXPECT_EQ(p.a2_scale, 0.25f);
  EXPECT_EQ(p.w13_input_scale.ndim(), 0);
  EXPECT_EQ(p.w13_input_scale.data_as<float>()[0], 0.75f);
  ASSERT_EQ(p.warnings.size(), 1u);  // only w13 differs
  EXPECT_NE(p.warnings[0].find("w13_input_scale differs across experts"), std::string::npos) << p.warnings[0];
  EXPECT_NE(p.warnings[0].find("maximum"), std::string::npos);
  // Idempotent: nothing changes, no second warning.
  process_expert_params(p);
  EXPECT_EQ(p.warnings.size(), 1u);
  EXPECT_EQ(p.a13_scale, 0.75f);
}

TEST(ProcessExpertParams, MissingStaticScalesAreAnErrorNamingTheLayer) {
  SyntheticModel m("w_int8_tensor_a_int8_static", ExpertNaming::GateUpDown, 2, 64, 32);
  ExpertParams p = m.load();
  p.w2_input_scale = Tensor();
  const std::string msg = error_of([&] { process_expert_params(p); });
  EXPECT_NE(msg.find("QuantConfig has static quantization, but found activation scales are None"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.layers.0.mlp.experts"), std::string::npos) << msg;

  ExpertParams q = m.load();
  q.w13_input_scale.mutable_data_as<float>()[1] = 0.0f;
  EXPECT_NE(error_of([&] { process_expert_params(q); }).find("positive"), std::string::npos);
}

TEST(ProcessExpertParams, Nvfp4UnequalGlobalWeightScalesAreAnError) {
  SyntheticModel m("nvfp4", ExpertNaming::GateUpDown, 3, 64, 32);
  m.set(pname(2, "gate_proj", "weight_scale_2"), scalar_f32(0.5f));
  m.set(pname(2, "up_proj", "weight_scale_2"), scalar_f32(0.25f));
  ExpertParams p = m.load();
  // Before processing the dequant uses each shard's own global scale.
  std::vector<float> w13, w2;
  dequant_expert(p, 2, w13, w2);
  const Tensor& gw = m.get(pname(2, "gate_proj", "weight"));
  const Tensor& gs = m.get(pname(2, "gate_proj", "weight_scale"));
  const Tensor& uw = m.get(pname(2, "up_proj", "weight"));
  const Tensor& us = m.get(pname(2, "up_proj", "weight_scale"));
  EXPECT_EQ(w13[5], fp4_e2m1_decode(fp4_code_at(gw.data_as<uint8_t>(), 5)) * fp8_e4m3_decode(gs.data_as<uint8_t>()[0]) * 0.5f);
  EXPECT_EQ(w13[32 * 64 + 17],
            fp4_e2m1_decode(fp4_code_at(uw.data_as<uint8_t>(), 17)) * fp8_e4m3_decode(us.data_as<uint8_t>()[1]) * 0.25f);
  const std::string msg = error_of([&] { process_expert_params(p); });
  EXPECT_NE(msg.find("expert 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0.5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0.25"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
}

TEST(ProcessExpertParams, Nvfp4MergesGlobalScalesAndInvertsInputScales) {
  SyntheticModel m("nvfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  for (int e = 0; e < 2; ++e) {
    m.set(pname(e, "gate_proj", "weight_scale_2"), scalar_f32(0.001f * static_cast<float>(e + 1)));
    m.set(pname(e, "up_proj", "weight_scale_2"), scalar_f32(0.001f * static_cast<float>(e + 1)));
  }
  m.set(pname(0, "gate_proj", "input_scale_2"), scalar_f32(0.3f));  // overwritten by up (last wins)
  m.set(pname(0, "up_proj", "input_scale_2"), scalar_f32(0.01f));
  m.set(pname(1, "gate_proj", "input_scale_2"), scalar_f32(0.02f));
  m.set(pname(1, "up_proj", "input_scale_2"), scalar_f32(0.03f));
  m.set(pname(0, "down_proj", "input_scale_2"), scalar_f32(0.07f));
  m.set(pname(1, "down_proj", "input_scale_2"), scalar_f32(0.05f));
  ExpertParams p = m.load();
  std::vector<float> before13, before2, after13, after2;
  dequant_expert(p, 1, before13, before2);
  process_expert_params(p);
  EXPECT_EQ(p.w13_weight_scale_2.shape(), (Shape{2}));
  EXPECT_EQ(p.w13_weight_scale_2.data_as<float>()[1], 0.002f);
  EXPECT_EQ(p.a13_scale, 1.0f / 0.03f);
  EXPECT_EQ(p.a2_scale, 1.0f / 0.07f);
  dequant_expert(p, 1, after13, after2);
  EXPECT_TRUE(same_values(after13, before13, "nvfp4 w13 before/after"));
  EXPECT_TRUE(same_values(after2, before2, "nvfp4 w2 before/after"));
}

TEST(ProcessExpertParams, Int8ZeroPointsMustBeZero) {
  // Non-zero zero points in the checkpoint: rejected at load, naming the tensor.
  SyntheticModel m("w_int8_tensor_a_int8_static", ExpertNaming::GateUpDown, 2, 64, 32);
  m.set(pname(1, "up_proj", "input_zero_point"), scalar_i8(3));
  std::string msg = error_of([&] { m.load(); });
  EXPECT_NE(msg.find("asymmetric INT8 is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("experts.1.up_proj.input_zero_point"), std::string::npos) << msg;

  SyntheticModel c("w_int8_channel_a_int8_dyn_token", ExpertNaming::GateUpDown, 2, 64, 32);
  Tensor z = Tensor::zeros(DType::I8, {64});
  z.mutable_data_as<int8_t>()[9] = -1;
  c.set(pname(0, "down_proj", "weight_zero_point"), z);
  msg = error_of([&] { c.load(); });
  EXPECT_NE(msg.find("asymmetric INT8 is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("experts.0.down_proj.weight_zero_point"), std::string::npos) << msg;

  // All-zero zero points (and absent ones) are dropped by processing.
  SyntheticModel ok("w_int8_channel_a_int8_dyn_token", ExpertNaming::GateUpDown, 2, 64, 32);
  ok.erase(pname(1, "gate_proj", "weight_zero_point"));
  ExpertParams p = ok.load();
  EXPECT_TRUE(p.w13_weight_zero_point.defined());
  ExpertParams q = p;
  q.w13_weight_zero_point = p.w13_weight_zero_point.clone();
  process_expert_params(p);
  EXPECT_FALSE(p.w13_weight_zero_point.defined());
  EXPECT_FALSE(p.w2_weight_zero_point.defined());
  // A non-zero value that reaches processing (parameters built by hand) is rejected too.
  q.w13_weight_zero_point.mutable_data_as<int8_t>()[40] = 2;
  msg = error_of([&] { process_expert_params(q); });
  EXPECT_NE(msg.find("asymmetric INT8 is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("w13_weight_zero_point"), std::string::npos) << msg;
}

// The gate rows hold every code; the per-tensor merge must requantize through fp16 exactly as
// the seed: deq = fp16(q · s_shard), INT8 q' = rne_sat(deq / s_max), FP8 q' = fp8(clamp(deq · (1/s_max))).
struct RequantCase {
  const char* scheme;
  float s_gate, s_up;
  uint8_t (*expected)(uint8_t, float, float);
  uint8_t (*without_fp16)(uint8_t, float, float);
};

uint8_t int8_expected(uint8_t c, float s, float m) {
  return static_cast<uint8_t>(int8_saturate_rne(fp16_round(static_cast<float>(static_cast<int8_t>(c)) * s) / m));
}
uint8_t int8_plain(uint8_t c, float s, float m) {
  return static_cast<uint8_t>(int8_saturate_rne(static_cast<float>(static_cast<int8_t>(c)) * s / m));
}
uint8_t fp8_expected(uint8_t c, float s, float m) {
  return fp8_e4m3_encode(std::fmin(std::fmax(fp16_round(fp8_e4m3_decode(c) * s) * (1.0f / m), -448.0f), 448.0f));
}
uint8_t fp8_plain(uint8_t c, float s, float m) {
  return fp8_e4m3_encode(std::fmin(std::fmax(fp8_e4m3_decode(c) * s * (1.0f / m), -448.0f), 448.0f));
}

TEST(ProcessExpertParams, PerTensorW13IsRequantizedThroughFp16) {
  // Tiny scales put q·s into the fp16 subnormal range, where the fp16 rounding changes codes.
  const RequantCase cases[] = {{"w_int8_tensor_a_int8_static", 3.1e-7f, 4.3e-7f, int8_expected, int8_plain},
                               {"w_fp8_tensor_a_fp8_static", 1.1e-9f, 1.7e-9f, fp8_expected, fp8_plain}};
  for (const RequantCase& rc : cases) {
    SCOPED_TRACE(rc.scheme);
    const int H = 256, I = 32;
    SyntheticModel m(rc.scheme, ExpertNaming::GateUpDown, 2, H, I);
    const bool fp8 = std::string(rc.scheme).find("fp8") != std::string::npos;
    Tensor gate = Tensor::zeros(fp8 ? DType::F8_E4M3 : DType::I8, {I, H});
    for (int i = 0; i < I * H; ++i) {
      uint8_t c = static_cast<uint8_t>(i % 256);
      if (fp8 && (c & 0x7F) == 0x7F) c = 0;
      gate.mutable_data_as<uint8_t>()[i] = c;
    }
    m.set(pname(1, "gate_proj", "weight"), gate);
    m.set(pname(1, "up_proj", "weight"), gate);
    m.set(pname(1, "gate_proj", "weight_scale"), scalar_f32(rc.s_gate));
    m.set(pname(1, "up_proj", "weight_scale"), scalar_f32(rc.s_up));
    ExpertParams p = m.load();
    std::vector<float> before13, w2;
    dequant_expert(p, 1, before13, w2);
    EXPECT_EQ(before13[1], (fp8 ? fp8_e4m3_decode(1) : 1.0f) * rc.s_gate);  // gate rows use s_w1
    EXPECT_EQ(before13[I * H + 1], (fp8 ? fp8_e4m3_decode(1) : 1.0f) * rc.s_up);  // up rows use s_w3
    process_expert_params(p);
    ASSERT_EQ(p.w13_weight_scale.shape(), (Shape{2}));
    const float s_max = p.w13_weight_scale.data_as<float>()[1];
    EXPECT_EQ(s_max, rc.s_up);
    const uint8_t* w = p.w13_weight.data_as<uint8_t>() + 2 * I * H;
    const uint8_t* src = gate.data_as<uint8_t>();
    int mismatches = 0, fp16_matters = 0;
    for (int i = 0; i < I * H; ++i) {
      const float s = rc.s_gate;
      mismatches += w[i] != rc.expected(src[i], s, s_max);
      mismatches += w[I * H + i] != rc.expected(src[i], rc.s_up, s_max);
      fp16_matters += rc.expected(src[i], s, s_max) != rc.without_fp16(src[i], s, s_max);
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_GT(fp16_matters, 0) << "the test data does not exercise the fp16 rounding";
    std::vector<float> after13;
    dequant_expert(p, 1, after13, w2);
    EXPECT_EQ(after13[I * H + 1], (fp8 ? fp8_e4m3_decode(w[I * H + 1]) : static_cast<float>(static_cast<int8_t>(w[I * H + 1]))) * s_max);
  }
}

TEST(ProcessExpertParams, GptOssPerTensorFp8NeedsNoRequant) {
  SyntheticModel m("w_fp8_tensor_a_fp8_static", ExpertNaming::GptOss, 2, 64, 32, true);
  ExpertParams p = m.load();
  EXPECT_TRUE(p.act.interleaved);
  EXPECT_EQ(p.w13_weight_scale.data_as<float>()[0], p.w13_weight_scale.data_as<float>()[1]);
  const Tensor before = p.w13_weight.clone();
  process_expert_params(p);
  EXPECT_EQ(std::memcmp(before.data(), p.w13_weight.data(), before.nbytes()), 0);
  EXPECT_EQ(p.w13_weight_scale.shape(), (Shape{2}));
}

TEST(ProcessExpertParams, MxAFp8StaticScalesAndUnquantizedNoop) {
  SyntheticModel m("w_mxfp4_a_fp8", ExpertNaming::GateUpDown, 2, 64, 32);
  m.set(pname(0, "down_proj", "input_scale"), scalar_f32(0.5f));
  m.set(pname(1, "down_proj", "input_scale"), scalar_f32(0.125f));
  ExpertParams p = m.load();
  process_expert_params(p);
  EXPECT_EQ(p.a2_scale, 0.5f);
  EXPECT_TRUE(p.processed);

  SyntheticModel u("unquantized", ExpertNaming::GateUpDown, 2, 16, 8);
  ExpertParams q = u.load();
  std::vector<float> a13, a2, b13, b2;
  dequant_expert(q, 1, a13, a2);
  process_expert_params(q);
  dequant_expert(q, 1, b13, b2);
  EXPECT_TRUE(same_values(a13, b13, "unquantized w13"));
  EXPECT_TRUE(q.warnings.empty());
}

}  // namespace
}  // namespace qmoe::test
