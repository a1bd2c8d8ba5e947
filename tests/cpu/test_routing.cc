// Routing unit tests (spec quark-moe.md §8, §16.7): hand-computed ids and weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "moe/router_logits.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"

namespace qmoe {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed run_route(const RoutingConfig& rc, const std::vector<float>& logits, int E, int K,
                 const std::vector<float>* bias = nullptr) {
  const int T = static_cast<int>(logits.size()) / E;
  Routed r{std::vector<int32_t>(static_cast<size_t>(T) * K, -1), std::vector<float>(static_cast<size_t>(T) * K, -1.0f)};
  route(rc, logits.data(), T, E, K, bias ? bias->data() : nullptr, r.ids.data(), r.w.data());
  return r;
}

// Weights are fp32 math; 1e-6 relative is the conformance bound.
void expect_weights(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-12) << i;
}

double sig(double v) { return 1.0 / (1.0 + std::exp(-v)); }

TEST(Routing, SoftmaxTiesGoToLowerId) {
  RoutingConfig rc;
  const Routed r = run_route(rc, std::vector<float>(8, 0.25f), 8, 3);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  expect_weights(r.w, {1.0 / 3, 1.0 / 3, 1.0 / 3});
  // A tie between the 2nd and 3rd best, not at the front.
  const Routed r2 = run_route(rc, {0.f, 2.f, 1.f, 3.f, 2.f, 1.f}, 6, 3);
  EXPECT_EQ(r2.ids, (std::vector<int32_t>{3, 1, 4}));
}

TEST(Routing, SoftmaxRenormalizeOnAndOff) {
  const std::vector<float> logits{1.f, 2.f, 3.f, 4.f};
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  RoutingConfig rc;
  rc.renormalize = false;
  Routed r = run_route(rc, logits, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2}));
  expect_weights(r.w, {std::exp(4.0) / z, std::exp(3.0) / z});
  rc.renormalize = true;
  r = run_route(rc, logits, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2}));
  expect_weights(r.w, {sig(1.0), 1.0 - sig(1.0)});
}

TEST(Routing, TwoTokensAreIndependent) {
  RoutingConfig rc;
  const Routed r = run_route(rc, {5.f, 0.f, 0.f, 0.f, 1.f, 9.f}, 3, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  expect_weights(r.w, {1.0, 1.0});
}

TEST(Routing, SigmoidScoring) {
  RoutingConfig rc;
  rc.scoring = ScoringFunc::Sigmoid;
  rc.renormalize = false;
  const std::vector<float> logits{-1.f, 0.5f, 2.f, 0.f};
  Routed r = run_route(rc, logits, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1}));
  expect_weights(r.w, {sig(2.0), sig(0.5)});
  rc.renormalize = true;
  r = run_route(rc, logits, 4, 2);
  const double s = sig(2.0) + sig(0.5);
  expect_weights(r.w, {sig(2.0) / s, sig(0.5) / s});
}

TEST(Routing, CorrectionBiasSelectsButDoesNotWeigh) {
  RoutingConfig rc;
  rc.scoring = ScoringFunc::Sigmoid;
  rc.renormalize = false;
  rc.has_correction_bias = true;
  const std::vector<float> logits{2.f, 1.f, 0.f, -1.f};
  const std::vector<float> bias{0.f, 0.f, 0.f, 1.f};  // expert 3: sig(-1) + 1 = 1.269 > sig(2) = 0.881
  const Routed r = run_route(rc, logits, 4, 2, &bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 0}));
  expect_weights(r.w, {sig(-1.0), sig(2.0)});
  // Bias required when the config says so.
  EXPECT_THROW(run_route(rc, logits, 4, 2), Error);
}

TEST(Routing, GroupedTopKWithBiasUsesSumOfTopTwo) {
  // 8 experts in 4 groups of 2; keep 2 groups; K = 2; sigmoid scores; zero bias.
  // Group maxima would keep groups 0 and 1 (0.95, 0.9); the sums of the top two keep groups 2 and 3.
  RoutingConfig rc;
  rc.scoring = ScoringFunc::Sigmoid;
  rc.n_group = 4;
  rc.topk_group = 2;
  rc.has_correction_bias = true;
  rc.renormalize = true;
  rc.routed_scaling_factor = 2.5f;
  const std::vector<double> p{0.95, 0.05, 0.9, 0.1, 0.8, 0.7, 0.85, 0.6};
  std::vector<float> logits;
  for (double v : p) logits.push_back(static_cast<float>(std::log(v / (1.0 - v))));
  const std::vector<float> bias(8, 0.0f);
  const Routed r = run_route(rc, logits, 8, 2, &bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{6, 4}));
  expect_weights(r.w, {2.5 * 0.85 / 1.65, 2.5 * 0.8 / 1.65});

  // Without bias the group score is the max: groups 0 and 1 are kept.
  RoutingConfig nb = rc;
  nb.has_correction_bias = false;
  const Routed r2 = run_route(nb, logits, 8, 2);
  EXPECT_EQ(r2.ids, (std::vector<int32_t>{0, 2}));
  expect_weights(r2.w, {2.5 * 0.95 / 1.85, 2.5 * 0.9 / 1.85});

  // A bias that lifts group 1 over group 3 changes the kept groups; weights stay unbiased.
  std::vector<float> b2(8, 0.0f);
  b2[3] = 0.5f;  // group 1: 0.9 + (0.1 + 0.5) = 1.5 now beats group 3 (1.45): groups 1 and 2 are kept
  const Routed r3 = run_route(rc, logits, 8, 2, &b2);
  EXPECT_EQ(r3.ids, (std::vector<int32_t>{2, 4}));  // scores+bias: e2 0.9, e3 0.6, e4 0.8, e5 0.7
  expect_weights(r3.w, {2.5 * 0.9 / 1.7, 2.5 * 0.8 / 1.7});
}

TEST(Routing, GroupedTopKGroupTiesGoToLowerGroup) {
  // Softmax, no bias: both groups have max logit 1 → group 0 is kept; plain top-2 would take {1, 2}.
  RoutingConfig rc;
  rc.n_group = 2;
  rc.topk_group = 1;
  rc.renormalize = true;
  const Routed r = run_route(rc, {0.f, 1.f, 1.f, 0.5f}, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 0}));
  expect_weights(r.w, {sig(1.0), 1.0 - sig(1.0)});
}

TEST(Routing, GroupedTopKRejectsBadGroups) {
  RoutingConfig rc;
  rc.n_group = 3;
  rc.topk_group = 1;
  EXPECT_THROW(run_route(rc, std::vector<float>(8, 0.f), 8, 2), Error);  // 8 % 3
  rc.n_group = 4;
  EXPECT_THROW(run_route(rc, std::vector<float>(8, 0.f), 8, 3), Error);  // K > 1 group of 2
}

TEST(Routing, ScalingFactorOnPlainSoftmax) {
  RoutingConfig rc;
  rc.routed_scaling_factor = 2.0f;
  const Routed r = run_route(rc, {0.f, 1.f, 0.f}, 3, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 0}));
  expect_weights(r.w, {2.0 * sig(1.0), 2.0 * (1.0 - sig(1.0))});
}

TEST(Routing, GptOssTopKThenSoftmax) {
  RoutingConfig rc;
  rc.topk_then_softmax = true;
  rc.renormalize = false;  // irrelevant for gpt-oss
  const Routed r = run_route(rc, {0.5f, 3.f, 1.f, 2.f}, 4, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  expect_weights(r.w, {sig(1.0), 1.0 - sig(1.0)});
}

TEST(Routing, TopKEqualsNumExperts) {
  RoutingConfig rc;
  const std::vector<float> logits{0.1f, -2.f, 3.f, 0.1f, 1.f};
  const Routed r = run_route(rc, logits, 5, 5);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 4, 0, 3, 1}));
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  expect_weights(r.w,
                 {std::exp(3.0) / z, std::exp(1.0) / z, std::exp(0.1f) / z, std::exp(0.1f) / z, std::exp(-2.0) / z});
}

TEST(Routing, NonFiniteLogitsNameTheToken) {
  RoutingConfig rc;
  std::vector<float> logits{0.f, 1.f, 2.f, 3.f, NAN, 1.f};
  try {
    run_route(rc, logits, 3, 1);
    FAIL() << "expected qmoe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 1"), std::string::npos) << e.what();
  }
  logits[4] = INFINITY;
  EXPECT_THROW(run_route(rc, logits, 3, 1), Error);
}

TEST(Routing, BadSizes) {
  RoutingConfig rc;
  EXPECT_THROW(run_route(rc, {0.f, 1.f}, 2, 3), Error);  // K > E
  EXPECT_THROW(run_route(rc, {0.f, 1.f}, 2, 0), Error);  // K = 0
  int32_t id = 0;
  float w = 0;
  EXPECT_NO_THROW(route(rc, nullptr, 0, 2, 1, nullptr, &id, &w));  // T = 0 is a no-op
}

TEST(RouterLogits, Fp64AccumulationAndBias) {
  // x [2, 3] · W[2, 3]ᵀ + b, W stored as BF16.
  const std::vector<float> wv{1.f, 2.f, 3.f, -1.f, 0.5f, 0.25f};
  Tensor w = Tensor::zeros(DType::BF16, {2, 3});
  for (int i = 0; i < 6; ++i) w.mutable_data_as<uint16_t>()[i] = bf16_encode(wv[static_cast<size_t>(i)]);
  const Tensor b = Tensor::from_f32({0.5f, -1.f}, {2});
  const std::vector<float> x{1.f, 1.f, 1.f, 2.f, -4.f, 8.f};
  std::vector<float> logits(4);
  compute_router_logits(x.data(), 2, 3, w, &b, logits.data());
  EXPECT_EQ(logits, (std::vector<float>{6.5f, -1.25f, 18.5f, -3.f}));
  // fp64 accumulation: 1e8 + 1 − 1e8 is exact.
  const Tensor w2 = Tensor::from_f32({1.f, 1.f, 1.f}, {1, 3});
  const std::vector<float> x2{1e8f, 1.f, -1e8f};
  float l = 0;
  compute_router_logits(x2.data(), 1, 3, w2, nullptr, &l);
  EXPECT_EQ(l, 1.0f);
  EXPECT_THROW(compute_router_logits(x2.data(), 1, 4, w2, nullptr, &l), Error);  // H mismatch
}

// The layer's vectorisable router logits (32 interleaved fp64 partial sums) against the
// reference's sequential loop: the same fp32 products, so the fp32 results agree bit for bit except
// where the exact sum lies within ~2^-29 of a rounding boundary (at most one ulp there); odd H
// exercises the tail, a bias and T > 1 the indexing.
TEST(RouterLogits, VectorisedSumMatchesTheReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const int H : {1, 31, 64, 2048, 2881})
    for (const int T : {1, 5}) {
      const int E = 12;
      std::vector<float> x(static_cast<size_t>(T) * H), w(static_cast<size_t>(E) * H), b(E);
      for (float& v : x) v = nd(rng);
      for (float& v : w) v = 0.05f * nd(rng);
      for (float& v : b) v = nd(rng);
      const Tensor wt = Tensor::from_f32(w, {E, H}), bt = Tensor::from_f32(b, {E});
      std::vector<float> want(static_cast<size_t>(T) * E), got(want.size());
      compute_router_logits(x.data(), T, H, wt, &bt, want.data());
      detail::router_logits_f32(x.data(), T, H, w.data(), E, b.data(), got.data());
      int exact = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_LE(std::fabs(got[i] - want[i]), std::fabs(std::nextafter(want[i], INFINITY) - want[i]))
            << "H=" << H << " T=" << T << " i=" << i;
        exact += std::memcmp(&got[i], &want[i], 4) == 0;
      }
      EXPECT_GE(exact, static_cast<int>(want.size()) - 1) << "H=" << H << " T=" << T;
    }
}

}  // namespace
}  // namespace qmoe
