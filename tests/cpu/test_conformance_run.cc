// Conformance: every case under shared/conformance/cases through MoELayer::from_checkpoint +
// plan(router_logits) + run with the reference kernel (spec §16.6; conformance/README.md).
#include <gtest/gtest.h>

#include "cpu/conformance_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"
#include "qmoe/safetensors.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;
using conformance::cases_dir;
using conformance::rel_l2;
std::vector<std::string> list_cases() { return conformance::list_cases(/*include_error_cases=*/true); }

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

void expect_finite_nonzero(const std::vector<float>& v, const std::string& what) {
  bool nonzero = false;
  for (float f : v) {
    ASSERT_TRUE(std::isfinite(f)) << what << " has a non-finite value";
    nonzero = nonzero || f != 0.0f;
  }
  EXPECT_TRUE(nonzero) << what << " is all zero";
}

struct RunResult {
  std::vector<int32_t> ids;
  std::vector<float> weights, out;
};

RunResult run_layer(const std::string& dir, const LoadOptions& load, const std::vector<float>& hidden,
                    const std::vector<float>& logits, int T) {
  MoELayerOptions opt;
  opt.load = load;
  opt.kernel = Kernel::Reference;
  const MoELayer layer = MoELayer::from_checkpoint(dir, 0, opt);
  MoEWorkspace ws;
  layer.plan(logits.data(), T, ws);
  RunResult r;
  r.ids = ws.topk_ids;
  r.weights = ws.topk_weights;
  r.out.assign(static_cast<size_t>(T) * layer.experts().hidden, 0.0f);
  layer.run(hidden.data(), ws, r.out.data());
  return r;
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, ReferenceKernel) {
  const std::string dir = cases_dir() + GetParam();
  const nlohmann::json c = read_json(dir + "/case.json");

  if (c.value("expect_error", false)) {
    std::vector<std::string> keywords = c.at("error_keywords").get<std::vector<std::string>>();
    try {
      MoELayerOptions opt;
      opt.kernel = Kernel::Reference;
      (void)MoELayer::from_checkpoint(dir, 0, opt);
      FAIL() << GetParam() << ": loading succeeded; expected an error";
    } catch (const Error& e) {
      std::string msg = e.what();
      std::transform(msg.begin(), msg.end(), msg.begin(), [](unsigned char ch) { return std::tolower(ch); });
      bool found = false;
      for (auto k : keywords) {
        std::transform(k.begin(), k.end(), k.begin(), [](unsigned char ch) { return std::tolower(ch); });
        found = found || msg.find(k) != std::string::npos;
      }
      EXPECT_TRUE(found) << "error message lacks the keywords: " << e.what();
      std::cout << "[ conformance ] " << GetParam() << ": error as expected: " << e.what() << "\n";
    }
    return;
  }

  const auto io = SafetensorsFile::open(dir + "/io.safetensors");
  const Tensor hs = io->get("hidden_states");
  const int T = static_cast<int>(hs.dim(0));
  const std::vector<float> hidden = to_f32(hs);
  const std::vector<float> logits = to_f32(io->get("router_logits"));
  const std::vector<float> expected = to_f32(io->get("expected"));
  const double tol = c.at("tolerance_rel_l2_fp32").get<double>();

  const RunResult r = run_layer(dir, {}, hidden, logits, T);
  const std::vector<float> want_w = to_f32(io->get("topk_weights"));
  const Tensor want_ids = io->get("topk_ids");
  ASSERT_EQ(r.ids.size(), static_cast<size_t>(want_ids.numel()));
  for (size_t i = 0; i < r.ids.size(); ++i) {
    ASSERT_EQ(r.ids[i], want_ids.data_as<int32_t>()[i]) << "topk_ids slot " << i;
    EXPECT_NEAR(r.weights[i], want_w[i], 1e-6 * std::fabs(want_w[i])) << "topk_weights slot " << i;
  }
  expect_finite_nonzero(r.out, "output");
  const double err = rel_l2(r.out, expected);
  std::cout << "[ conformance ] " << GetParam() << ": rel_l2 = " << err << " (tolerance " << tol << ")\n";
  RecordProperty("rel_l2", std::to_string(err));
  EXPECT_LE(err, tol);

  // Router logits from the router weight agree with the stored fp32 ones.
  MoELayerOptions opt;
  opt.kernel = Kernel::Reference;
  const MoELayer layer = MoELayer::from_checkpoint(dir, 0, opt);
  if (layer.has_router()) {
    MoEWorkspace ws;
    layer.plan_from_hidden(hidden.data(), T, ws);
    EXPECT_EQ(ws.topk_ids, r.ids) << "routing from compute_router_logits differs";
  }

  // The exactly dequantized experts after processing, by value (per-tensor INT8 / FP8: w13 as
  // requantized to max(s_w1, s_w3), `requant.<e>.w13`; `dequant.<e>.w13` holds the loaded values).
  for (int g : c.value("dequant_experts", std::vector<int>{})) {
    const int l = layer.experts().expert_map[static_cast<size_t>(g)];
    std::vector<float> w;
    ref::decode_weight(layer.experts(), ref::Proj::W13, l, w);
    const std::string requant = "requant." + std::to_string(g) + ".w13";
    const std::string w13_name = io->find(requant) ? requant : "dequant." + std::to_string(g) + ".w13";
    EXPECT_EQ(rel_l2(w, to_f32(io->get(w13_name))), 0.0) << w13_name;
    ref::decode_weight(layer.experts(), ref::Proj::W2, l, w);
    EXPECT_EQ(rel_l2(w, to_f32(io->get("dequant." + std::to_string(g) + ".w2"))), 0.0) << "expert " << g << " w2";
  }

  // The reference's decoder and the methods module's dequant_expert agree on every local expert.
  for (int l = 0; l < layer.experts().num_local; ++l) {
    std::vector<float> w13, w2, d13, d2;
    ref::decode_weight(layer.experts(), ref::Proj::W13, l, w13);
    ref::decode_weight(layer.experts(), ref::Proj::W2, l, w2);
    dequant_expert(layer.experts(), l, d13, d2);
    ASSERT_EQ(w13.size(), d13.size());
    ASSERT_EQ(w2.size(), d2.size());
    EXPECT_EQ(rel_l2(w13, d13), 0.0) << "local expert " << l;
    EXPECT_EQ(rel_l2(w2, d2), 0.0) << "local expert " << l;
  }

  // The shared expert alone.
  if (io->find("shared_expert_output") != nullptr) {
    ASSERT_TRUE(layer.shared_expert().has_value());
    std::vector<float> out(expected.size(), 0.0f);
    std::vector<int32_t> ids(static_cast<size_t>(T), 0);
    std::vector<float> w(static_cast<size_t>(T), 1.0f);
    ExpertsArgs a;
    a.params = &*layer.shared_expert();
    a.x = hidden.data();
    a.T = T;
    a.K = 1;
    a.topk_ids = ids.data();
    a.topk_weights = w.data();
    a.out = out.data();
    experts_reference(a);
    const double se = rel_l2(out, to_f32(io->get("shared_expert_output")));
    std::cout << "[ conformance ] " << GetParam() << ": shared expert rel_l2 = " << se << "\n";
    EXPECT_LE(se, tol);
  }

  // Tensor- and expert-parallel partial outputs.
  for (const char* kind : {"tp", "ep"}) {
    for (int rank = 0; rank < 2; ++rank) {
      const std::string name = std::string("expected_") + kind + "2_rank" + std::to_string(rank);
      if (io->find(name) == nullptr) continue;
      LoadOptions load;
      if (kind[0] == 't')
        load.tp_rank = rank, load.tp_size = 2;
      else
        load.ep_rank = rank, load.ep_size = 2;
      const RunResult pr = run_layer(dir, load, hidden, logits, T);
      const double pe = rel_l2(pr.out, to_f32(io->get(name)));
      std::cout << "[ conformance ] " << GetParam() << ": " << name << " rel_l2 = " << pe << "\n";
      EXPECT_LE(pe, tol) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Conformance, ::testing::ValuesIn(list_cases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(ConformanceData, CasesArePresent) { EXPECT_GE(list_cases().size(), 20u) << cases_dir(); }

}  // namespace
}  // namespace qmoe
