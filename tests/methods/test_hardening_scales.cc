// Broken scales and sizes in checkpoints (issue #10, class 3): NaN, ±Inf, zero and negative
// scales of every kind, and E8M0 255, are load-time errors naming the tensor; a config declaring
// more than the checkpoint stores fails before allocating.
#include <cmath>

#include "methods_test_util.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/params.h"
#include "synthetic_model.h"

namespace qmoe::test {
namespace {

std::string load_error(const SyntheticModel& m) {
  try {
    (void)m.load();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const float kBad[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.5f};

TEST(HardeningScales, PerTensorWeightScale) {
  for (float bad : kBad) {
    SyntheticModel m("w_fp8_tensor_a_fp8_static", ExpertNaming::GateUpDown, 2, 64, 32);
    const std::string name = m.base(1, "up_proj") + ".weight_scale";
    m.set(name, scalar_f32(bad));
    const std::string msg = load_error(m);
    EXPECT_TRUE(msg.find(name) != std::string::npos && msg.find("finite scale > 0") != std::string::npos)
        << bad << ": " << msg;
  }
}

TEST(HardeningScales, StaticInputScale) {
  for (float bad : kBad) {
    SyntheticModel m("w_int8_tensor_a_int8_static", ExpertNaming::Mixtral, 2, 64, 32);
    const std::string name = m.base(0, "w2") + ".input_scale";
    m.set(name, scalar_f32(bad));
    const std::string msg = load_error(m);
    EXPECT_TRUE(msg.find(name) != std::string::npos) << bad << ": " << msg;
  }
}

TEST(HardeningScales, PerChannelWeightScale) {
  for (float bad : kBad) {
    SyntheticModel m("w_int8_channel_a_int8_dyn_token", ExpertNaming::GateUpDown, 2, 64, 32);
    const std::string name = m.base(1, "down_proj") + ".weight_scale";
    std::vector<float> v = to_f32(m.get(name));
    v[17] = bad;
    m.set(name, Tensor::from_f32(v, {64}));
    const std::string msg = load_error(m);
    EXPECT_TRUE(msg.find(name) != std::string::npos && msg.find("element 17") != std::string::npos)
        << bad << ": " << msg;
  }
}

TEST(HardeningScales, Nvfp4GlobalScales) {
  for (float bad : kBad) {
    for (const char* which : {".weight_scale_2", ".input_scale_2"}) {
      SyntheticModel m("nvfp4", ExpertNaming::GateUpDown, 2, 64, 32);
      const std::string name = m.base(0, "down_proj") + which;
      m.set(name, scalar_f32(bad));
      const std::string msg = load_error(m);
      EXPECT_TRUE(msg.find(name) != std::string::npos) << bad << which << ": " << msg;
    }
  }
}

TEST(HardeningScales, Nvfp4BlockScalesNaNOrNegative) {
  for (uint8_t bad : {uint8_t{0x7F}, uint8_t{0xFF}, uint8_t{0xB8} /* -1.0 */}) {
    SyntheticModel m("nvfp4", ExpertNaming::GateUpDown, 2, 64, 32);
    const std::string name = m.base(1, "gate_proj") + ".weight_scale";
    Tensor t = m.get(name).clone();
    t.mutable_data_as<uint8_t>()[5] = bad;
    m.set(name, t);
    const std::string msg = load_error(m);
    EXPECT_TRUE(msg.find(name) != std::string::npos && msg.find("element 5") != std::string::npos) << msg;
  }
  // Zero block scales are what an all-zero block quantizes to: accepted.
  SyntheticModel m("nvfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  const std::string name = m.base(1, "gate_proj") + ".weight_scale";
  Tensor t = m.get(name).clone();
  t.mutable_data_as<uint8_t>()[5] = 0;
  m.set(name, t);
  EXPECT_EQ(load_error(m), "");
}

TEST(HardeningScales, MxE8m0NaNByte) {
  for (const char* scheme : {"w_mxfp4_a_mxfp4", "w_mxfp6_e3m2"}) {
    SyntheticModel m(scheme, ExpertNaming::GateUpDown, 2, 64, 64);
    const std::string name = m.base(0, "up_proj") + ".weight_scale";
    Tensor t = m.get(name).clone();
    t.mutable_data_as<uint8_t>()[3] = 255;
    m.set(name, t);
    const std::string msg = load_error(m);
    EXPECT_TRUE(msg.find(name) != std::string::npos && msg.find("255") != std::string::npos) << msg;
  }
}

// Class 2: a config declaring more experts / larger sizes than stored fails before allocating.
TEST(HardeningSizes, ConfigLargerThanTheCheckpointFailsBeforeAllocating) {
  SyntheticModel m("w_mxfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  m.cfg.num_experts = 60000;  // 60000 × (2·32·32 + 64·16) bytes would be allocated before
  std::string msg = load_error(m);
  EXPECT_TRUE(msg.find("experts.2.gate_proj.weight' is missing") != std::string::npos) << msg;
  SyntheticModel n("w_mxfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  n.cfg.hidden_size = 1 << 20;
  n.cfg.moe_intermediate_size = 1 << 20;
  msg = load_error(n);
  EXPECT_TRUE(msg.find("does not match the expected shape") != std::string::npos) << msg;
}

}  // namespace
}  // namespace qmoe::test
