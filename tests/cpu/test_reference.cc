// Scalar reference unit tests: hand-computed tiny experts (activations, biases, combine, EP,
// router weight on the input) and every activation quantization rule on tiny rows.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"

namespace qmoe {
namespace {

// Unquantized experts with bf16-exact values. w13[e]: [2I, H] row-major; w2[e]: [H, I].
// `map`: global → local (empty = identity); the vectors hold the LOCAL experts.
ExpertParams make_bf16_params(int E, int H, int I, const std::vector<std::vector<float>>& w13,
                              const std::vector<std::vector<float>>& w2, const ActivationSpec& act,
                              std::vector<int> map = {}) {
  ExpertParams p;
  p.scheme = find_scheme("unquantized");
  p.act = act;
  p.num_experts = E;
  if (map.empty())
    for (int e = 0; e < E; ++e) map.push_back(e);
  p.expert_map = map;
  p.num_local = static_cast<int>(w13.size());
  for (int g = 0; g < E; ++g)
    if (map[static_cast<size_t>(g)] >= 0) p.local_to_global.push_back(g);
  p.hidden = H;
  p.inter = p.inter_full = I;
  p.w13_weight = Tensor::zeros(DType::BF16, {p.num_local, 2 * I, H});
  p.w2_weight = Tensor::zeros(DType::BF16, {p.num_local, H, I});
  for (int e = 0; e < p.num_local; ++e) {
    for (int i = 0; i < 2 * I * H; ++i)
      p.w13_weight.mutable_data_as<uint16_t>()[e * 2 * I * H + i] =
          bf16_encode(w13[static_cast<size_t>(e)][static_cast<size_t>(i)]);
    for (int i = 0; i < H * I; ++i)
      p.w2_weight.mutable_data_as<uint16_t>()[e * H * I + i] =
          bf16_encode(w2[static_cast<size_t>(e)][static_cast<size_t>(i)]);
  }
  p.processed = true;
  return p;
}

std::vector<float> run_ref(const ExpertParams& p, const std::vector<float>& x, int K, const std::vector<int32_t>& ids,
                           const std::vector<float>& w, bool on_input = false, float init = 0.0f) {
  const int T = static_cast<int>(x.size()) / p.hidden;
  std::vector<float> out(x.size(), init);
  ExpertsArgs a;
  a.params = &p;
  a.x = x.data();
  a.T = T;
  a.K = K;
  a.topk_ids = ids.data();
  a.topk_weights = w.data();
  a.router_weight_on_input = on_input;
  a.out = out.data();
  experts_reference(a);
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i]) + 1e-9) << i;
}

// H = 2, I = 1: gate row [1, 0] picks x0, up row [0, 1] picks x1; w2 = [1, 2]ᵀ.
ExpertParams tiny_expert(const ActivationSpec& act) {
  // Interleaved rows (gate_0, up_0) coincide with (gate rows, up rows) when I = 1.
  return make_bf16_params(1, 2, 1, {{1, 0, 0, 1}}, {{1, 2}}, act);
}

TEST(Reference, SiluGateThenUp) {
  const ExpertParams p = tiny_expert({});
  // silu(2) · 3 · 0.5 = 2.6423912...
  expect_close(run_ref(p, {2, 3}, 1, {0}, {0.5f}), {2.642391233933647, 2 * 2.642391233933647});
}

TEST(Reference, GeluAndGeluTanh) {
  ActivationSpec act;
  act.kind = Activation::Gelu;
  expect_close(run_ref(tiny_expert(act), {2, 3}, 1, {0}, {0.5f}), {2.9317496041554625, 2 * 2.9317496041554625});
  act.kind = Activation::GeluTanh;
  expect_close(run_ref(tiny_expert(act), {2, 3}, 1, {0}, {0.5f}), {2.931896541131662, 2 * 2.931896541131662});
}

TEST(Reference, SwigluOaiInterleavedClamps) {
  ActivationSpec act;
  act.kind = Activation::SwigluOai;
  act.interleaved = true;
  act.limit = 7.0f;
  const ExpertParams p = tiny_expert(act);
  // g = 10 → 7, u = −9 → −7: (−7 + 1) · 7 · σ(1.702 · 7) = −41.99971876...
  expect_close(run_ref(p, {10, -9}, 1, {0}, {1.0f}), {-41.99971876981991, 2 * -41.99971876981991});
  // No clamp: (2 + 1) · 1 · σ(1.702) = 2.5373872...
  expect_close(run_ref(p, {1, 2}, 1, {0}, {1.0f}), {2.537387297798464, 2 * 2.537387297798464});
  // Interleaving matters: rows [gate_0, up_0] = w13 rows 0, 1. Swap the rows → g = x1, u = x0.
  const ExpertParams q = make_bf16_params(1, 2, 1, {{0, 1, 1, 0}}, {{1, 2}}, act);
  expect_close(run_ref(q, {2, 1}, 1, {0}, {1.0f}), {2.537387297798464, 2 * 2.537387297798464});
}

TEST(Reference, SiluWithSwigluLimit) {
  ActivationSpec act;
  act.limit = 7.0f;
  // silu(min(10, 7)) · clamp(−9, ±7)
  expect_close(run_ref(tiny_expert(act), {10, -9}, 1, {0}, {1.0f}), {-48.95535849147437, 2 * -48.95535849147437});
}

TEST(Reference, BiasesAddedAfterGemms) {
  ExpertParams p = tiny_expert({});
  p.w13_bias = Tensor::from_f32({-1.0f, 1.0f}, {1, 2});
  p.w2_bias = Tensor::from_f32({0.5f, -0.5f}, {1, 2});
  // g = 2 − 1 = 1, u = 3 + 1 = 4: z = silu(1) · 4; y2 = [z + 0.5, 2z − 0.5] · 0.25
  const double z = 4.0 / (1.0 + std::exp(-1.0));
  expect_close(run_ref(p, {2, 3}, 1, {0}, {0.25f}), {0.25 * (z + 0.5), 0.25 * (2 * z - 0.5)});
}

TEST(Reference, CombinesTopKAndTokens) {
  // Two experts: expert 1 doubles the gate. T = 2, K = 2.
  const ExpertParams p = make_bf16_params(2, 2, 1, {{1, 0, 0, 1}, {2, 0, 0, 1}}, {{1, 2}, {1, -1}}, {});
  const auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  const std::vector<float> x{1, 2, -1, 0.5f};
  const std::vector<float> out = run_ref(p, x, 2, {1, 0, 0, 1}, {0.75f, 0.25f, 0.5f, 0.5f});
  const double a0 = silu(1) * 2, b0 = silu(2) * 2;        // token 0: expert 0 (z = a0), expert 1 (z = b0)
  const double a1 = silu(-1) * 0.5, b1 = silu(-2) * 0.5;  // token 1
  expect_close(out, {0.75 * b0 + 0.25 * a0, 0.75 * -b0 + 0.25 * 2 * a0, 0.5 * a1 + 0.5 * b1, 0.5 * 2 * a1 - 0.5 * b1});
}

TEST(Reference, ExpertParallelSkipsNonLocalExperts) {
  // Global experts {0, 1}; this rank holds only expert 1 (local 0).
  const ExpertParams p = make_bf16_params(2, 2, 1, {{1, 0, 0, 1}}, {{1, 2}}, {}, {-1, 0});
  const double z = 2 * 0.8807970779778823 * 3;  // silu(2) · 3
  expect_close(run_ref(p, {2, 3}, 2, {0, 1}, {0.3f, 0.7f}), {0.7 * z, 1.4 * z});
  // Only non-local experts: the output (accumulated into) stays as it was.
  expect_close(run_ref(p, {2, 3}, 1, {0}, {1.0f}, false, 1.5f), {1.5, 1.5});
  // Accumulation into a non-zero output.
  expect_close(run_ref(p, {2, 3}, 1, {1}, {1.0f}, false, 1.0f), {1.0 + z, 1.0 + 2 * z});
}

TEST(Reference, RouterWeightOnInput) {
  const ExpertParams p = tiny_expert({});
  // x ← 0.5·x, then weight 1 after GEMM2: silu(1) · 1.5
  const double z = 1.5 / (1.0 + std::exp(-1.0));
  expect_close(run_ref(p, {2, 3}, 1, {0}, {0.5f}, true), {z, 2 * z});
  EXPECT_THROW(run_ref(p, {2, 3}, 2, {0, 0}, {0.5f, 0.5f}, true), Error);  // needs K = 1
}

TEST(Reference, RejectsBadInputs) {
  ExpertParams p = tiny_expert({});
  EXPECT_THROW(run_ref(p, {2, 3}, 1, {1}, {1.0f}), Error);  // id out of range
  EXPECT_THROW(run_ref(p, {2, 3}, 1, {-1}, {1.0f}), Error);
  p.processed = false;
  EXPECT_THROW(run_ref(p, {2, 3}, 1, {0}, {1.0f}), Error);
  p.processed = true;
  p.w2_weight = Tensor::zeros(DType::BF16, {1, 2, 2});  // wrong shape
  EXPECT_THROW(run_ref(p, {2, 3}, 1, {0}, {1.0f}), Error);
}

TEST(Reference, Int8ChannelDynTokenExpert) {
  // W8A8 per-channel int8 weights with per-token int8 activations, H = 2, I = 1.
  ExpertParams p;
  p.scheme = find_scheme("w_int8_channel_a_int8_dyn_token");
  p.num_experts = p.num_local = 1;
  p.expert_map = {0};
  p.local_to_global = {0};
  p.hidden = 2;
  p.inter = p.inter_full = 1;
  p.w13_weight = Tensor::zeros(DType::I8, {1, 2, 2});
  const int8_t w13[4] = {64, 0, 0, 64};  // gate [1, 0], up [0, 1] with scale 1/64
  for (int i = 0; i < 4; ++i) p.w13_weight.mutable_data_as<int8_t>()[i] = w13[i];
  p.w13_weight_scale = Tensor::from_f32({1.0f / 64, 1.0f / 64}, {1, 2});
  p.w2_weight = Tensor::zeros(DType::I8, {1, 2, 1});
  p.w2_weight.mutable_data_as<int8_t>()[0] = 64;    // 1
  p.w2_weight.mutable_data_as<int8_t>()[1] = -128;  // −2
  p.w2_weight_scale = Tensor::from_f32({1.0f / 64, 1.0f / 64}, {1, 2});
  p.processed = true;
  // x = [1, −0.5]: absmax 1, q = [127, round_half_away(−63.5) = −64], s = 1/127 → x̂ = [1, −64/127].
  const double s = static_cast<double>(1.0f / 127.0f);
  const double g = 127 * s, u = -64 * s;
  const float zf = static_cast<float>(g / (1 + std::exp(-g)) * u);
  // The intermediate (one value) re-quantizes to ±127 · |z|/127.
  const double zq = -127.0 * static_cast<double>(std::fabs(zf) / 127.0f);
  expect_close(run_ref(p, {1.0f, -0.5f}, 1, {0}, {1.0f}), {zq, -2 * zq});
}

// ---------------------------------------------------------------------------------------------
// Activation quantization rules.
std::vector<double> qdq(ActQuant kind, const std::vector<float>& x, float static_scale = 0.0f,
                        float tensor_scale = 0.0f, MxScaleMode mode = MxScaleMode::Even) {
  ref::ActQuantRule r;
  r.kind = kind;
  r.static_scale = static_scale;
  r.mx_mode = mode;
  std::vector<double> out(x.size());
  ref::act_qdq_row(r, x.data(), static_cast<int>(x.size()), tensor_scale, out.data());
  return out;
}

TEST(ActQuant, NoneKeepsValues) {
  EXPECT_EQ(qdq(ActQuant::None, {1.5f, -0.1f}), (std::vector<double>{1.5, static_cast<double>(-0.1f)}));
}

TEST(ActQuant, Fp8Static) {
  // s = 0.5: x/s = [2, 0.6 → 0.625, −1000 → −448]
  EXPECT_EQ(qdq(ActQuant::Fp8Static, {1.0f, 0.3f, -500.0f}, 0.5f), (std::vector<double>{1.0, 0.3125, -224.0}));
  // The product fp8 · s is kept exact in double: 1.125 · 0.1f.
  EXPECT_EQ(qdq(ActQuant::Fp8Static, {0.1125f}, 0.1f)[0], 1.125 * static_cast<double>(0.1f));
}

TEST(ActQuant, Int8Static) {
  // s = 0.125: x/s = [2.5 → 2 (ties to even), −3.5 → −4, 160 → 127]
  EXPECT_EQ(qdq(ActQuant::Int8Static, {0.3125f, -0.4375f, 20.0f}, 0.125f), (std::vector<double>{0.25, -0.5, 15.875}));
}

TEST(ActQuant, Int8DynToken) {
  // absmax 4: x · 31.75 = [31.75 → 32, −63.5 → −64 (half away from zero), 15.875 → 16, 127]
  const double s = static_cast<double>(4.0f / 127.0f);
  EXPECT_EQ(qdq(ActQuant::Int8DynToken, {1.0f, -2.0f, 0.5f, 4.0f}),
            (std::vector<double>{32 * s, -64 * s, 16 * s, 127 * s}));
  // All-zero row: scale floor 1e-10/127, values 0.
  EXPECT_EQ(qdq(ActQuant::Int8DynToken, {0.0f, 0.0f}), (std::vector<double>{0.0, 0.0}));
}

TEST(ActQuant, Fp8DynToken) {
  // absmax 3: s = 3/448, x/s = [448, −224, 14.93 → 15]
  const double s = static_cast<double>(3.0f / 448.0f);
  EXPECT_EQ(qdq(ActQuant::Fp8DynToken, {3.0f, -1.5f, 0.1f}), (std::vector<double>{448 * s, -224 * s, 15 * s}));
  // Tiny rows use the floor 1/(448·512): 1e-6 · 229376 = 0.229 → fp8 0.234375 (E4M3 step 2^-6·1/8 at 0.23).
  const double floor_s = static_cast<double>(1.0f / (448.0f * 512.0f));
  EXPECT_EQ(qdq(ActQuant::Fp8DynToken, {1e-6f})[0], 0.234375 * floor_s);
}

TEST(ActQuant, Fp8DynTensorUsesTheGivenScale) {
  // tensor absmax 8 (elsewhere in the tensor): s = 8/448; this row [1, −2] → x/s = [56, −112]
  ref::ActQuantRule r;
  r.kind = ActQuant::Fp8DynTensor;
  const float s = ref::act_tensor_scale(r, 8.0f);
  EXPECT_EQ(s, 8.0f / 448.0f);
  const std::vector<double> v = qdq(ActQuant::Fp8DynTensor, {1.0f, -2.0f}, 0.0f, s);
  EXPECT_EQ(v, (std::vector<double>{56 * static_cast<double>(s), -112 * static_cast<double>(s)}));
}

TEST(ActQuant, Mxfp4EvenRule) {
  // amax 6 → scale 1: values go to the E2M1 grid. 2.6 → 3, 0.2 → 0, −0.3 → −0.5.
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f, x[1] = 2.6f, x[2] = 0.2f, x[3] = -0.3f, x[4] = 5.0f;
  std::vector<double> v = qdq(ActQuant::Mxfp4, x);
  EXPECT_EQ(v[0], 6.0);
  EXPECT_EQ(v[1], 3.0);
  EXPECT_EQ(v[2], 0.0);
  EXPECT_EQ(v[3], -0.5);
  EXPECT_EQ(v[4], 4.0);  // 5 is the midpoint of 4 and 6: ties to even mantissa (4)
  // amax 7 = 1.75·4 rounds up to 8 ("even" rule) → scale 2: 7/2 = 3.5 → 4 → 8; 2.6/2 = 1.3 → 1.5 → 3.
  x[0] = 7.0f;
  v = qdq(ActQuant::Mxfp4, x);
  EXPECT_EQ(v[0], 8.0);
  EXPECT_EQ(v[1], 3.0);
  // The floor rule keeps scale 1 and saturates 7 to 6.
  EXPECT_EQ(qdq(ActQuant::Mxfp4, x, 0, 0, MxScaleMode::Floor)[0], 6.0);
  // Blocks are independent: a second block with amax 0.75.
  std::vector<float> y(64, 0.0f);
  y[0] = 6.0f;
  y[32] = 0.75f, y[33] = 0.1f;  // amax 0.75 = 1.5·2^-1 → shared exponent −3: 0.75·8 = 6, 0.1·8 = 0.8 → 1 → 0.125
  v = qdq(ActQuant::Mxfp4, y);
  EXPECT_EQ(v[32], 0.75);
  EXPECT_EQ(v[33], 0.125);
}

TEST(ActQuant, Mxfp6) {
  std::vector<float> x(32, 0.0f);
  x[0] = 7.5f, x[1] = 1.06f;  // E2M3 amax 7.5 → scale 1; 1.06 → 1.0 (step 0.125)
  std::vector<double> v = qdq(ActQuant::Mxfp6E2M3, x);
  EXPECT_EQ(v[0], 7.5);
  EXPECT_EQ(v[1], 1.0);
  x[0] = 28.0f, x[1] = 9.1f;  // E3M2 amax 28 → scale 1; grid in [8, 16): 8, 10, 12, 14
  v = qdq(ActQuant::Mxfp6E3M2, x);
  EXPECT_EQ(v[0], 28.0);
  EXPECT_EQ(v[1], 10.0);  // 9.1 is nearer 10 than 8
}

TEST(ActQuant, Nvfp4) {
  // gs = 1, block amax 12: s = 2 (fp8 exact), x/2 to the E2M1 grid, × 2.
  std::vector<float> x(16, 0.0f);
  x[0] = 12.0f, x[1] = -5.0f, x[2] = 0.9f;
  std::vector<double> v = qdq(ActQuant::Nvfp4, x, 1.0f);
  EXPECT_EQ(v[0], 12.0);
  EXPECT_EQ(v[1], -4.0);  // −2.5 → −2 (tie → even)
  EXPECT_EQ(v[2], 1.0);   // 0.45 → 0.5
  // gs = 4: s = 8, x · 4/8 → same grid, × 2 → same values.
  EXPECT_EQ(qdq(ActQuant::Nvfp4, x, 4.0f), v);
}

TEST(ActQuant, StaticRulesNeedScales) {
  ExpertParams p;
  p.scheme = find_scheme("w_fp8_tensor_a_fp8_static");
  EXPECT_THROW(ref::gemm1_act_rule(p), Error);  // a13_scale 0
  p.a13_scale = 0.5f;
  EXPECT_EQ(ref::gemm1_act_rule(p).static_scale, 0.5f);
  p.scheme = find_scheme("w_mxfp4_a_mxfp4");
  EXPECT_NO_THROW(ref::gemm2_act_rule(p));  // dynamic: no scale needed
}

// ---------------------------------------------------------------------------------------------
// Weight decoding of packed formats.
TEST(WeightDecode, Mxfp4AndNvfp4) {
  ExpertParams p;
  p.scheme = find_scheme("w_mxfp4");
  p.num_experts = p.num_local = 1;
  p.expert_map = {0};
  p.hidden = 32;
  p.inter = 32;
  p.w13_weight = Tensor::zeros(DType::U8, {1, 64, 16});
  p.w13_weight_scale = Tensor::zeros(DType::U8, {1, 64, 1});
  p.w2_weight = Tensor::zeros(DType::U8, {1, 32, 16});
  p.w2_weight_scale = Tensor::zeros(DType::U8, {1, 32, 1});
  p.processed = true;
  p.w13_weight.mutable_data_as<uint8_t>()[16] = 0x72;      // row 1: element 0 = code 2 (1.0), element 1 = code 7 (6.0)
  p.w13_weight_scale.mutable_data_as<uint8_t>()[1] = 128;  // × 2
  ASSERT_NO_THROW(ref::validate_expert_params(p, "test"));
  std::vector<float> w;
  ref::decode_weight(p, ref::Proj::W13, 0, w);
  ASSERT_EQ(w.size(), 64u * 32u);
  EXPECT_EQ(w[32], 2.0f);
  EXPECT_EQ(w[33], 12.0f);
  EXPECT_EQ(w[34], 0.0f);

  ExpertParams n = p;
  n.scheme = find_scheme("nvfp4");
  n.w13_weight_scale = Tensor::zeros(DType::U8, {1, 64, 2});
  n.w2_weight_scale = Tensor::zeros(DType::U8, {1, 32, 2});
  n.w13_weight_scale.mutable_data_as<uint8_t>()[2] = fp8_e4m3_encode(1.5f);  // row 1, block 0
  n.w13_weight_scale_2 = Tensor::from_f32({0.25f}, {1});
  n.w2_weight_scale_2 = Tensor::from_f32({1.0f}, {1});
  ASSERT_NO_THROW(ref::validate_expert_params(n, "test"));
  ref::decode_weight(n, ref::Proj::W13, 0, w);
  EXPECT_EQ(w[32], 1.0f * 1.5f * 0.25f);
  EXPECT_EQ(w[33], 6.0f * 1.5f * 0.25f);
  n.w13_weight_scale_2 = Tensor{};
  EXPECT_THROW(ref::validate_expert_params(n, "test"), Error);
}

// ---------------------------------------------------------------------------------------------
// MoELayer built in memory: plan (routing + slots grouped by local expert) and run.
MoELayer make_layer(std::vector<int> map, int K = 2) {
  // 4 global experts; local ones get distinct gate scales so their outputs differ.
  std::vector<std::vector<float>> w13, w2;
  for (int g = 0; g < 4; ++g)
    if (map[static_cast<size_t>(g)] >= 0) {
      w13.push_back({static_cast<float>(g + 1), 0, 0, 1});
      w2.push_back({1, -0.5f});
    }
  ModelConfig cfg;
  cfg.top_k = K;
  return MoELayer(cfg, make_bf16_params(4, 2, 1, w13, w2, {}, map));
}

TEST(Plan, GroupsSlotsByLocalExpert) {
  // Global experts 1 and 3 are local (local ids 0 and 1).
  const MoELayer layer = make_layer({-1, 0, -1, 1});
  // T = 3, K = 2: token 0 → {3, 1}, token 1 → {0, 2}, token 2 → {1, 0}
  const std::vector<float> logits{0, 2, 0, 3, 3, 0, 2, 0, 2, 3, 0, 0};
  MoEWorkspace ws;
  layer.plan(logits.data(), 3, ws);
  EXPECT_EQ(ws.topk_ids, (std::vector<int32_t>{3, 1, 0, 2, 1, 0}));
  EXPECT_EQ(ws.counts, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(ws.offsets, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(ws.sorted_slots, (std::vector<int32_t>{1, 4, 0}));
  EXPECT_THROW(layer.plan(logits.data(), 0, ws), Error);
  EXPECT_THROW(layer.plan(nullptr, 3, ws), Error);
  EXPECT_THROW(layer.plan_from_hidden(logits.data(), 1, ws), Error);  // no router weight
}

TEST(Plan, RunMatchesTheReferenceAndIsThreadSafe) {
  const MoELayer layer = make_layer({0, 1, 2, 3});
  const std::vector<float> logits{0, 2, 0, 3, 3, 0, 2, 0, 2, 3, 0, 0};
  const std::vector<float> x{1, 2, -1, 0.5f, 0.25f, -3};
  MoEWorkspace ws;
  EXPECT_THROW(layer.run(x.data(), ws, nullptr), Error);  // no plan yet
  layer.plan(logits.data(), 3, ws);
  std::vector<float> out(6, 123.0f);  // run overwrites
  layer.run(x.data(), ws, out.data());
  std::vector<float> want(6, 0.0f);
  ExpertsArgs a;
  a.params = &layer.experts();
  a.x = x.data();
  a.T = 3;
  a.K = 2;
  a.topk_ids = ws.topk_ids.data();
  a.topk_weights = ws.topk_weights.data();
  a.out = want.data();
  experts_reference(a);
  EXPECT_EQ(out, want);
  // Two threads with their own workspaces.
  std::vector<float> o1(6), o2(6);
  auto job = [&](std::vector<float>* o) {
    MoEWorkspace w;
    layer.plan(logits.data(), 3, w);
    layer.run(x.data(), w, o->data());
  };
  std::thread t1(job, &o1), t2(job, &o2);
  t1.join();
  t2.join();
  EXPECT_EQ(o1, want);
  EXPECT_EQ(o2, want);
}

TEST(Plan, LayerChecks) {
  EXPECT_THROW(make_layer({0, 1, 2, 3}, 5), Error);  // top_k > E
  ModelConfig cfg;
  cfg.top_k = 2;
  cfg.routing.apply_router_weight_on_input = true;  // needs top_k 1
  EXPECT_THROW(MoELayer(cfg, make_bf16_params(2, 2, 1, {{1, 0, 0, 1}, {1, 0, 0, 1}}, {{1, 2}, {1, 2}}, {})), Error);
}

}  // namespace
}  // namespace qmoe
