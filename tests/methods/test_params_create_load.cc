// create_expert_params shapes / dtypes / initial values for every registry scheme, and the load
// rules: placement (gate then up), dtype / shape / missing-tensor errors, per-tensor scalars of
// shape [] or [1], float scale dtypes, last-written input scale wins.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "error_of.h"
#include "methods_test_util.h"
#include "qmoe/error.h"
#include "qmoe/params.h"
#include "synthetic_model.h"

namespace qmoe::test {
namespace {

TEST(CreateExpertParams, ShapesAndInitialValuesForEveryScheme) {
  const int64_t E = 3, H = 64, I = 32;
  for (const SchemeInfo& s : all_schemes()) {
    SCOPED_TRACE(std::string(s.name));
    const ExpertParams p = create_expert_params(s, E, {}, H, I, true, ActivationSpec{});
    EXPECT_EQ(p.num_local, E);
    EXPECT_EQ(p.rows13(), 2 * I);
    const int64_t k13 = s.weight == WeightFormat::Mxfp4 || s.weight == WeightFormat::Nvfp4 ? H / 2
                        : is_mx_weight(s.weight)                                         ? H * 3 / 4
                                                                                          : H;
    EXPECT_EQ(p.w13_weight.shape(), (Shape{E, 2 * I, k13}));
    EXPECT_EQ(p.w2_weight.shape()[1], H);
    const DType wd = s.weight == WeightFormat::Int8      ? DType::I8
                     : s.weight == WeightFormat::Fp8E4M3 ? DType::F8_E4M3
                     : s.weight == WeightFormat::BF16    ? DType::BF16  // Quark's excluded layers
                                                         : DType::U8;
    EXPECT_EQ(p.w13_weight.dtype(), wd);
    EXPECT_EQ(p.w2_weight.dtype(), wd);
    EXPECT_EQ(p.w13_bias.shape(), (Shape{E, 2 * I}));
    EXPECT_EQ(p.w2_bias.shape(), (Shape{E, H}));
    switch (s.weight_scale) {
      case WeightScale::MxE8M0: {
        EXPECT_EQ(p.w13_weight_scale.shape(), (Shape{E, 2 * I, H / 32}));
        EXPECT_EQ(p.w2_weight_scale.shape(), (Shape{E, H, I / 32}));
        const uint8_t* b = p.w13_weight_scale.data_as<uint8_t>();
        EXPECT_TRUE(std::all_of(b, b + p.w13_weight_scale.nbytes(), [](uint8_t v) { return v == 1; }));
        break;
      }
      case WeightScale::Nvfp4:
        EXPECT_EQ(p.w13_weight_scale.dtype(), DType::F8_E4M3);
        EXPECT_EQ(p.w13_weight_scale.shape(), (Shape{E, 2 * I, H / 16}));
        EXPECT_EQ(p.w2_weight_scale.shape(), (Shape{E, H, I / 16}));
        EXPECT_EQ(p.w13_weight_scale_2.shape(), (Shape{E, 2}));
        EXPECT_EQ(p.w13_input_scale.shape(), (Shape{E, 2}));
        EXPECT_EQ(p.w2_input_scale.shape(), (Shape{E}));
        break;
      case WeightScale::PerTensor:
        EXPECT_EQ(p.w13_weight_scale.shape(), (Shape{E, 2}));
        EXPECT_EQ(p.w2_weight_scale.shape(), (Shape{E}));
        break;
      case WeightScale::PerChannel:
        EXPECT_EQ(p.w13_weight_scale.shape(), (Shape{E, 2 * I}));
        EXPECT_EQ(p.w2_weight_scale.shape(), (Shape{E, H}));
        break;
      case WeightScale::None: EXPECT_FALSE(p.w13_weight_scale.defined()); break;
    }
    EXPECT_EQ(p.w13_input_scale.defined(), act_is_static(s.act));
    EXPECT_EQ(p.w13_weight_zero_point.defined(), s.weight == WeightFormat::Int8);
  }
}

TEST(CreateExpertParams, RejectsSizesOffTheBlockGrid) {
  const ActivationSpec act;
  EXPECT_NE(error_of([&] { create_expert_params(scheme_by_name("w_mxfp4"), 2, {}, 48, 32, false, act); })
                .find("H=48 is not a multiple of the MX block size 32"),
            std::string::npos);
  EXPECT_NE(error_of([&] { create_expert_params(scheme_by_name("w_mxfp6_e2m3"), 2, {}, 64, 16, false, act); })
                .find("I_p=16 is not a multiple"),
            std::string::npos);
  EXPECT_NE(error_of([&] { create_expert_params(scheme_by_name("nvfp4"), 2, {}, 64, 24, false, act); })
                .find("NVFP4 block size 16"),
            std::string::npos);
  EXPECT_FALSE(error_of([&] { create_expert_params(scheme_by_name("unquantized"), 2, {}, 0, 8, false, act); }).empty());
  EXPECT_FALSE(error_of([&] { create_expert_params(scheme_by_name("unquantized"), 0, {}, 8, 8, false, act); }).empty());
  // Non-block formats accept any positive size.
  EXPECT_NO_THROW(create_expert_params(scheme_by_name("w_int8_channel_a_int8_dyn_token"), 2, {}, 24, 12, false, act));
}

// Every scheme: gate rows land in w13 [0, I), up rows in [I, 2I), down in w2 — byte for byte.
TEST(LoadExpertParams, PlacesGateUpDownForEveryScheme) {
  for (const SchemeInfo& s : all_schemes()) {
    SCOPED_TRACE(std::string(s.name));
    const int E = 2, H = 64, I = 32;
    SyntheticModel m(std::string(s.name), ExpertNaming::Mixtral, E, H, I, false, 7);
    const ExpertParams p = m.load();
    ASSERT_EQ(p.prefix, "model.layers.0.block_sparse_moe.experts");
    for (int e = 0; e < E; ++e) {
      const Tensor w1 = m.get(m.base(e, "w1") + ".weight"), w3 = m.get(m.base(e, "w3") + ".weight"),
                   w2 = m.get(m.base(e, "w2") + ".weight");
      if (s.weight == WeightFormat::BF16) {  // kept in the checkpoint's dtype: the same bytes
        EXPECT_EQ(p.w13_weight.dtype(), w1.dtype());
        EXPECT_EQ(p.w2_weight.dtype(), w2.dtype());
      }
      const size_t n13 = w1.nbytes(), n2 = w2.nbytes();
      const std::byte* w13 = p.w13_weight.data() + e * 2 * n13;
      EXPECT_EQ(std::memcmp(w13, w1.data(), n13), 0);
      EXPECT_EQ(std::memcmp(w13 + n13, w3.data(), n13), 0);
      EXPECT_EQ(std::memcmp(p.w2_weight.data() + e * n2, w2.data(), n2), 0);
    }
  }
}

TEST(LoadExpertParams, MissingTensorNamesIt) {
  SyntheticModel m("w_mxfp4", ExpertNaming::GateUpDown, 4, 64, 32);
  m.erase("model.layers.0.mlp.experts.3.down_proj.weight_scale");
  const std::string msg = error_of([&] { m.load(); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.layers.0.mlp.experts.3.down_proj.weight_scale"), std::string::npos) << msg;
}

TEST(LoadExpertParams, ShapeErrorNamesTensorFoundAndExpected) {
  SyntheticModel m("w_mxfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  m.set("model.layers.0.mlp.experts.1.up_proj.weight_scale", Tensor::zeros(DType::U8, {32, 1}));
  std::string msg = error_of([&] { m.load(); });
  EXPECT_NE(msg.find("experts.1.up_proj.weight_scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape [32, 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 2]"), std::string::npos) << msg;

  SyntheticModel n("w_int8_channel_a_int8_dyn_token", ExpertNaming::GateUpDown, 2, 64, 32);
  n.set("model.layers.0.mlp.experts.0.down_proj.weight", Tensor::zeros(DType::I8, {64, 31}));
  msg = error_of([&] { n.load(); });
  EXPECT_NE(msg.find("shape [64, 31]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, 32]"), std::string::npos) << msg;
}

TEST(LoadExpertParams, BadDtypeIsAnError) {
  SyntheticModel m("w_mxfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  m.set("model.layers.0.mlp.experts.0.gate_proj.weight", Tensor::zeros(DType::I8, {32, 32}));
  std::string msg = error_of([&] { m.load(); });
  EXPECT_NE(msg.find("dtype I8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("U8"), std::string::npos) << msg;

  SyntheticModel n("nvfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  n.set("model.layers.0.mlp.experts.1.down_proj.weight_scale", Tensor::zeros(DType::U8, {64, 2}));
  msg = error_of([&] { n.load(); });
  EXPECT_NE(msg.find("F8_E4M3"), std::string::npos) << msg;

  SyntheticModel f("w_fp8_tensor_a_fp8_static", ExpertNaming::GateUpDown, 2, 64, 32);
  f.set("model.layers.0.mlp.experts.1.down_proj.weight_scale", Tensor::zeros(DType::I32, {}));
  msg = error_of([&] { f.load(); });
  EXPECT_NE(msg.find("dtype I32"), std::string::npos) << msg;
}

TEST(LoadExpertParams, PerTensorScalarsMayBeShape1AndAnyFloatDtype) {
  SyntheticModel m("w_fp8_tensor_a_fp8_static", ExpertNaming::GateUpDown, 2, 64, 32);
  m.set("model.layers.0.mlp.experts.0.gate_proj.weight_scale", scalar_f32(0.25f, {1}));
  m.set("model.layers.0.mlp.experts.0.up_proj.weight_scale", bf16_tensor({0.375f}, {}));
  Tensor h = Tensor::zeros(DType::F16, {1});
  h.mutable_data_as<uint16_t>()[0] = fp16_encode(0.1f);  // 0.0999755859375 in fp16
  m.set("model.layers.0.mlp.experts.0.down_proj.weight_scale", h);
  const ExpertParams p = m.load();
  EXPECT_EQ(p.w13_weight_scale.data_as<float>()[0], 0.25f);
  EXPECT_EQ(p.w13_weight_scale.data_as<float>()[1], 0.375f);
  EXPECT_EQ(p.w2_weight_scale.data_as<float>()[0], fp16_round(0.1f));

  m.set("model.layers.0.mlp.experts.1.up_proj.weight_scale", Tensor::from_f32({0.1f, 0.2f}, {2}));
  const std::string msg = error_of([&] { m.load(); });
  EXPECT_NE(msg.find("shape [2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("experts.1.up_proj.weight_scale"), std::string::npos) << msg;
}

TEST(LoadExpertParams, InputScaleOfUpWinsOverGate) {
  SyntheticModel m("w_fp8_tensor_a_fp8_static", ExpertNaming::GateUpDown, 2, 64, 32);
  m.set("model.layers.0.mlp.experts.1.gate_proj.input_scale", scalar_f32(2.0f));
  m.set("model.layers.0.mlp.experts.1.up_proj.input_scale", scalar_f32(3.0f));
  m.set("model.layers.0.mlp.experts.1.down_proj.input_scale", scalar_f32(5.0f));
  ExpertParams p = m.load();
  EXPECT_EQ(p.w13_input_scale.data_as<float>()[1], 3.0f);
  EXPECT_EQ(p.w2_input_scale.data_as<float>()[1], 5.0f);

  // NVFP4: each of w1 / w3 writes the whole [e, :] row of w13_input_scale_2.
  SyntheticModel n("nvfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  n.set("model.layers.0.mlp.experts.0.gate_proj.input_scale_2", scalar_f32(0.25f));
  n.set("model.layers.0.mlp.experts.0.up_proj.input_scale_2", scalar_f32(0.125f));
  p = n.load();
  EXPECT_EQ(p.w13_input_scale.data_as<float>()[0], 0.125f);
  EXPECT_EQ(p.w13_input_scale.data_as<float>()[1], 0.125f);
}

TEST(LoadExpertParams, MissingStaticInputScaleIsAnError) {
  SyntheticModel m("w_int8_tensor_a_int8_static", ExpertNaming::GateUpDown, 2, 64, 32);
  m.erase("model.layers.0.mlp.experts.1.down_proj.input_scale");
  const std::string msg = error_of([&] { m.load(); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("experts.1.down_proj.input_scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("static"), std::string::npos) << msg;
}

TEST(LoadExpertParams, UnquantizedKeepsExactF16AndF32Values) {
  SyntheticModel m("unquantized", ExpertNaming::GateUpDown, 1, 8, 4);
  Tensor h = Tensor::zeros(DType::F16, {4, 8});
  for (int i = 0; i < 32; ++i) h.mutable_data_as<uint16_t>()[i] = fp16_encode(0.001f * static_cast<float>(i * i) - 0.3f);
  m.set("model.layers.0.mlp.experts.0.gate_proj.weight", h);
  std::vector<float> f(32);
  for (int i = 0; i < 32; ++i) f[static_cast<size_t>(i)] = 1.0f / static_cast<float>(i + 3);  // not bf16-exact
  m.set("model.layers.0.mlp.experts.0.up_proj.weight", Tensor::from_f32(f, {4, 8}));
  const ExpertParams p = m.load();
  std::vector<float> w13, w2;
  dequant_expert(p, 0, w13, w2);
  const std::vector<float> want_gate = to_f32(h);
  EXPECT_TRUE(same_values(w13.data(), want_gate.data(), 32, "gate from F16"));
  EXPECT_TRUE(same_values(w13.data() + 32, f.data(), 32, "up from F32"));
  EXPECT_EQ(p.w13_weight.dtype(), DType::F32);  // mixed dtypes: widened (exactly)
  EXPECT_EQ(p.w2_weight.dtype(), DType::F32);
}

// One dtype throughout: the parameters keep it (no widening at load: half the memory of F32).
TEST(LoadExpertParams, UnquantizedKeepsTheCheckpointDtype) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const int E = 2, H = 16, I = 8;
    SyntheticModel m("unquantized", ExpertNaming::GateUpDown, E, H, I);
    std::mt19937 rng(4);
    std::normal_distribution<float> nd;
    for (int e = 0; e < E; ++e)
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string n = m.base(e, proj) + ".weight";
        const Shape sh = m.get(n).shape();
        std::vector<float> v(static_cast<size_t>(sh[0] * sh[1]));
        for (float& x : v) x = nd(rng);
        Tensor t = Tensor::zeros(dt, sh);
        for (size_t i = 0; i < v.size(); ++i) {
          if (dt == DType::F32) t.mutable_data_as<float>()[i] = v[i];
          else t.mutable_data_as<uint16_t>()[i] = dt == DType::BF16 ? bf16_encode(v[i]) : fp16_encode(v[i]);
        }
        m.set(n, t);
      }
    const ExpertParams p = m.load();
    EXPECT_EQ(p.w13_weight.dtype(), dt);
    EXPECT_EQ(p.w2_weight.dtype(), dt);
    const size_t esz = static_cast<size_t>(dtype_bits(dt) / 8);
    for (int e = 0; e < E; ++e) {
      const Tensor g = m.get(m.base(e, "gate_proj") + ".weight"), u = m.get(m.base(e, "up_proj") + ".weight"),
                   d = m.get(m.base(e, "down_proj") + ".weight");
      const std::byte* w13 = p.w13_weight.data() + static_cast<size_t>(e) * 2 * I * H * esz;
      EXPECT_EQ(std::memcmp(w13, g.data(), g.nbytes()), 0);
      EXPECT_EQ(std::memcmp(w13 + g.nbytes(), u.data(), u.nbytes()), 0);
      EXPECT_EQ(std::memcmp(p.w2_weight.data() + static_cast<size_t>(e) * H * I * esz, d.data(), d.nbytes()), 0);
    }
  }
}

TEST(LoadExpertParams, RejectsBadLayerAndScheme) {
  SyntheticModel m("w_mxfp4", ExpertNaming::GateUpDown, 2, 64, 32);
  TempDir dir("badlayer");
  write_safetensors((dir.path() / "model.safetensors").string(), m.tensors);
  const Checkpoint ckpt = Checkpoint::open(dir.str());
  EXPECT_THROW(load_expert_params(ckpt, m.cfg, m.scheme, 1, {}), Error);
  EXPECT_THROW(load_expert_params(ckpt, m.cfg, m.scheme, -1, {}), Error);
  LayerScheme none = m.scheme;
  none.scheme = nullptr;
  EXPECT_THROW(load_expert_params(ckpt, m.cfg, none, 0, {}), Error);
}

TEST(LoadSharedExpertParams, LoadsGateUpDownOfTheSharedExpert) {
  SyntheticModel m("unquantized", ExpertNaming::GateUpDown, 2, 16, 8);
  m.cfg.model_type = "qwen2_moe";
  m.cfg.shared_expert_intermediate_size = 12;
  const std::string sp = m.cfg.shared_expert_prefix(0);
  ASSERT_EQ(sp, "model.layers.0.mlp.shared_expert");
  std::vector<float> g(12 * 16), u(12 * 16), d(16 * 12);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(i) * 0.25f;
    u[i] = -static_cast<float>(i);
    d[i] = static_cast<float>(i % 7);
  }
  m.set(sp + ".gate_proj.weight", bf16_tensor(g, {12, 16}));
  m.set(sp + ".up_proj.weight", bf16_tensor(u, {12, 16}));
  m.set(sp + ".down_proj.weight", bf16_tensor(d, {16, 12}));
  TempDir dir("shared");
  write_safetensors((dir.path() / "model.safetensors").string(), m.tensors);
  const Checkpoint ckpt = Checkpoint::open(dir.str());
  LoadOptions o;
  o.tp_rank = 1;
  o.tp_size = 2;
  ExpertParams p = load_shared_expert_params(ckpt, m.cfg, m.scheme, 0, o);
  EXPECT_EQ(p.num_experts, 1);
  EXPECT_EQ(p.inter, 6);
  std::vector<float> w13, w2;
  dequant_expert(p, 0, w13, w2);
  EXPECT_TRUE(same_values(w13.data(), to_f32(bf16_tensor(g, {12, 16})).data() + 6 * 16, 6 * 16, "shared gate rank 1"));
  EXPECT_TRUE(same_values(w13.data() + 6 * 16, to_f32(bf16_tensor(u, {12, 16})).data() + 6 * 16, 6 * 16, "shared up"));
  EXPECT_EQ(w2[0], d[6]);

  m.cfg.shared_expert_intermediate_size = 0;
  EXPECT_THROW(load_shared_expert_params(ckpt, m.cfg, m.scheme, 0, {}), Error);
}

}  // namespace
}  // namespace qmoe::test
