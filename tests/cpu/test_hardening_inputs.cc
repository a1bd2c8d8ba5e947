// Non-finite activations (issue #10, class 4): every checked entry point refuses NaN / ±Inf hidden
// states, router logits and topk weights with an error naming the tensor and the first bad token,
// identically for the reference and the optimized kernels, for every scheme.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "error_of.h"
#include "cpu/random_params.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"
#include "qmoe/schemes.h"

namespace qmoe::test {
namespace {

MoELayer make_layer(const SchemeInfo& s, Kernel k) {
  cpu::RandomExpertsSpec spec;
  spec.scheme = &s;
  spec.num_experts = 4;
  spec.hidden = 64;
  spec.inter = 32;
  ModelConfig cfg;
  cfg.model_type = "qwen3_moe";
  cfg.top_k = 2;
  std::vector<float> rw(4 * 64, 0.01f);
  for (size_t i = 0; i < rw.size(); ++i) rw[i] = 0.01f * static_cast<float>(i % 7);
  MoELayerOptions opt;
  opt.kernel = k;
  return MoELayer(cfg, cpu::make_random_expert_params(spec), std::nullopt, Tensor::from_f32(rw, {4, 64}), {}, {}, {},
                  opt);
}

TEST(HardeningInputs, NonFiniteHiddenStatesAreRefusedByEveryScheme) {
  const int T = 5, H = 64;
  for (const SchemeInfo& s : all_schemes()) {
    for (Kernel k : {Kernel::Reference, Kernel::Optimized}) {
      const MoELayer layer = make_layer(s, k);
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        std::vector<float> x(T * H, 0.5f), out(T * H);
        std::vector<float> logits(T * 4, 0.0f);
        MoEWorkspace ws;
        layer.plan(logits.data(), T, ws);
        x[3 * H + 10] = bad;
        const std::string msg = error_of([&] { layer.run(x.data(), ws, out.data()); });
        EXPECT_NE(msg.find("'hidden_states'"), std::string::npos) << s.name << ": " << msg;
        EXPECT_NE(msg.find("token 3 (column 10)"), std::string::npos) << s.name << ": " << msg;
        // Without router logits the message blames the hidden states, not the router logits.
        const std::string m2 = error_of([&] { layer.plan_from_hidden(x.data(), T, ws); });
        EXPECT_NE(m2.find("'hidden_states'"), std::string::npos) << m2;
        EXPECT_EQ(m2.find("router logits"), std::string::npos) << m2;
      }
    }
  }
}

TEST(HardeningInputs, NonFiniteRouterLogitsNameTheToken) {
  const MoELayer layer = make_layer(scheme_by_name("w_mxfp4_a_mxfp4"), Kernel::Optimized);
  std::vector<float> logits(3 * 4, 0.0f);
  logits[2 * 4 + 1] = NAN;
  MoEWorkspace ws;
  const std::string msg = error_of([&] { layer.plan(logits.data(), 3, ws); });
  EXPECT_NE(msg.find("'router_logits'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token 2"), std::string::npos) << msg;
}

TEST(HardeningInputs, KernelEntryPointsRefuseNonFiniteInputsIdentically) {
  cpu::RandomExpertsSpec spec;
  spec.scheme = &scheme_by_name("w_int8_channel_a_int8_dyn_token");
  spec.num_experts = 4;
  const ExpertParams p = cpu::make_random_expert_params(spec);
  const int T = 2, K = 2, H = 64;
  std::vector<float> x(T * H, 1.0f), out(T * H, 0.0f), w(T * K, 0.5f);
  std::vector<int32_t> ids = {0, 1, 2, 3};
  ExpertsArgs a;
  a.params = &p;
  a.x = x.data();
  a.T = T;
  a.K = K;
  a.topk_ids = ids.data();
  a.topk_weights = w.data();
  a.out = out.data();
  x[H + 63] = INFINITY;
  const std::string r = error_of([&] { experts_reference(a); });
  const std::string o = error_of([&] { experts_optimized(a, 1); });
  EXPECT_NE(r.find("token 1 (column 63)"), std::string::npos) << r;
  EXPECT_NE(o.find("token 1 (column 63)"), std::string::npos) << o;
  x[H + 63] = 1.0f;
  w[3] = NAN;
  EXPECT_NE(error_of([&] { experts_reference(a); }).find("'topk_weights'"), std::string::npos);
  EXPECT_NE(error_of([&] { experts_optimized(a, 1); }).find("'topk_weights'"), std::string::npos);
  w[3] = 0.5f;
  EXPECT_EQ(error_of([&] { experts_optimized(a, 1); }), "");
}

TEST(HardeningInputs, NonFiniteRouterWeightIsALoadError) {
  cpu::RandomExpertsSpec spec;
  spec.scheme = &scheme_by_name("w_mxfp4");
  spec.num_experts = 4;
  ModelConfig cfg;
  cfg.top_k = 2;
  std::vector<float> rw(4 * 64, 0.0f);
  rw[70] = NAN;
  const std::string msg = error_of([&] {
    MoELayer(cfg, cpu::make_random_expert_params(spec), std::nullopt, Tensor::from_f32(rw, {4, 64}));
  });
  EXPECT_NE(msg.find("router weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("row 1 (column 6)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace qmoe::test
