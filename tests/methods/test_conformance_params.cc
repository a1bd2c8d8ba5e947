// Conformance: every non-error case of shared/conformance/cases is loaded through ModelConfig →
// Checkpoint → resolve_moe_scheme → load_expert_params, and the exactly dequantized experts listed
// in case.json "dequant_experts" must equal io.safetensors dequant.<e>.* bit for bit (by value)
// before processing, and requant.<e>.w13 (where present, else dequant.<e>.w13) after processing;
// TP 2 ranks must hold the row / column slices; EP 2 ranks only their experts. Error cases must
// fail with one of their error_keywords.
#include <gtest/gtest.h>

#include <cstdio>

#include "methods_test_util.h"
#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/params.h"
#include "qmoe/safetensors.h"

namespace qmoe::test {
namespace {

struct CaseData {
  std::string dir;
  nlohmann::json meta;
  ModelConfig cfg;
  Checkpoint ckpt;
  LayerScheme scheme;
  std::shared_ptr<SafetensorsFile> io;
  int layer = 0;
};

CaseData open_case(const std::string& name) {
  const std::string dir = (cases_dir() / name).string();
  CaseData c{dir, read_json(cases_dir() / name / "case.json"), ModelConfig::load(dir), Checkpoint::open(dir), {}, {}, 0};
  c.layer = c.cfg.moe_layers.empty() ? 0 : c.cfg.moe_layers.front();
  c.scheme = resolve_moe_scheme(c.cfg, c.layer);
  c.io = SafetensorsFile::open(dir + "/io.safetensors");
  return c;
}

std::vector<float> io_tensor(const CaseData& c, const std::string& name) { return to_f32(c.io->get(name), name); }

std::vector<int> dequant_experts(const CaseData& c) { return c.meta.at("dequant_experts").get<std::vector<int>>(); }

class ConformanceParams : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceParams, DequantBeforeAndAfterProcessingIsExact) {
  const CaseData c = open_case(GetParam());
  ASSERT_EQ(c.scheme.scheme->name, c.meta.at("scheme").get<std::string>());
  ExpertParams p = load_expert_params(c.ckpt, c.cfg, c.scheme, c.layer, LoadOptions{});
  ASSERT_EQ(p.num_local, c.cfg.num_experts);
  const std::vector<int> experts = dequant_experts(c);
  ASSERT_FALSE(experts.empty());
  std::vector<float> w13, w2;
  for (int e : experts) {
    dequant_expert(p, p.expert_map.at(static_cast<size_t>(e)), w13, w2);
    const std::string k = "dequant." + std::to_string(e);
    EXPECT_TRUE(same_values(w13, io_tensor(c, k + ".w13"), k + ".w13 (before processing)"));
    EXPECT_TRUE(same_values(w2, io_tensor(c, k + ".w2"), k + ".w2 (before processing)"));
  }
  process_expert_params(p);
  EXPECT_TRUE(p.processed);
  for (int e : experts) {
    dequant_expert(p, p.expert_map.at(static_cast<size_t>(e)), w13, w2);
    const std::string rq = "requant." + std::to_string(e) + ".w13";
    const std::string k = "dequant." + std::to_string(e);
    const std::string want13 = c.io->find(rq) ? rq : k + ".w13";
    EXPECT_TRUE(same_values(w13, io_tensor(c, want13), want13 + " (after processing)"));
    EXPECT_TRUE(same_values(w2, io_tensor(c, k + ".w2"), k + ".w2 (after processing)"));
  }
  // Static scales recorded by the case generator.
  const auto& ss = c.meta.value("static_scales", nlohmann::json::object());
  auto expect_scale = [&](const char* key, float got) {
    if (ss.contains(key)) {
      EXPECT_EQ(got, ss[key].get<float>()) << key;
    }
  };
  expect_scale("w13_input_scale_max", p.a13_scale);
  expect_scale("w2_input_scale_max", p.a2_scale);
  expect_scale("a13_gs", p.a13_scale);
  expect_scale("a2_gs", p.a2_scale);
  std::printf("[ conformance ] %s: %s, %zu experts bit-exact before and after processing\n", GetParam().c_str(),
              std::string(p.scheme->name).c_str(), experts.size());
}

TEST_P(ConformanceParams, TensorParallel2RanksHoldTheirSlices) {
  const CaseData c = open_case(GetParam());
  const int I = c.cfg.moe_intermediate_size, H = c.cfg.hidden_size;
  int64_t start = 0;
  for (int r = 0; r < 2; ++r) {
    LoadOptions o;
    o.tp_rank = r;
    o.tp_size = 2;
    ExpertParams p = load_expert_params(c.ckpt, c.cfg, c.scheme, c.layer, o);
    const int64_t Ip = p.inter;
    ASSERT_GT(Ip, 0);
    ASSERT_LE(start + Ip, I);
    if (r == 1) {
      EXPECT_EQ(start + Ip, I);
    }
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1) process_expert_params(p);
      for (int e : dequant_experts(c)) {
        std::vector<float> w13, w2;
        dequant_expert(p, p.expert_map.at(static_cast<size_t>(e)), w13, w2);
        const std::string k = "dequant." + std::to_string(e);
        const std::string rq = "requant." + std::to_string(e) + ".w13";
        const std::vector<float> full13 = io_tensor(c, pass == 1 && c.io->find(rq) ? rq : k + ".w13");
        const std::vector<float> full2 = io_tensor(c, k + ".w2");
        std::vector<float> want13, want2;
        if (p.act.interleaved) {
          want13.assign(full13.begin() + 2 * start * H, full13.begin() + 2 * (start + Ip) * H);
        } else {
          for (int half = 0; half < 2; ++half)
            want13.insert(want13.end(), full13.begin() + (half * I + start) * H,
                          full13.begin() + (half * I + start + Ip) * H);
        }
        for (int h = 0; h < H; ++h)
          want2.insert(want2.end(), full2.begin() + int64_t{h} * I + start, full2.begin() + int64_t{h} * I + start + Ip);
        const std::string tag = " tp rank " + std::to_string(r) + (pass ? " after" : " before") + " processing";
        EXPECT_TRUE(same_values(w13, want13, k + ".w13" + tag));
        EXPECT_TRUE(same_values(w2, want2, k + ".w2" + tag));
      }
    }
    if (p.w2_bias.defined() && r != 0) {
      const std::vector<float> b = to_f32(p.w2_bias);
      EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](float v) { return v == 0.0f; })) << "w2 bias on tp rank 1";
    }
    start += Ip;
  }
}

TEST_P(ConformanceParams, ExpertParallel2RanksLoadOnlyTheirExperts) {
  const CaseData c = open_case(GetParam());
  const int E = c.cfg.num_experts;
  int covered = 0;
  for (int r = 0; r < 2; ++r) {
    LoadOptions o;
    o.ep_rank = r;
    o.ep_size = 2;
    ExpertParams p = load_expert_params(c.ckpt, c.cfg, c.scheme, c.layer, o);
    const int first = r == 0 ? 0 : (E + 1) / 2;
    ASSERT_EQ(p.num_local, r == 0 ? (E + 1) / 2 : E / 2);
    ASSERT_EQ(p.w13_weight.dim(0), p.num_local);
    for (int l = 0; l < p.num_local; ++l) EXPECT_EQ(p.local_to_global[static_cast<size_t>(l)], first + l);
    process_expert_params(p);
    for (int e : dequant_experts(c)) {
      const int l = p.expert_map.at(static_cast<size_t>(e));
      if (l < 0) continue;
      ++covered;
      std::vector<float> w13, w2;
      dequant_expert(p, l, w13, w2);
      const std::string k = "dequant." + std::to_string(e);
      const std::string rq = "requant." + std::to_string(e) + ".w13";
      EXPECT_TRUE(same_values(w13, io_tensor(c, c.io->find(rq) ? rq : k + ".w13"), k + ".w13 ep rank " + std::to_string(r)));
      EXPECT_TRUE(same_values(w2, io_tensor(c, k + ".w2"), k + ".w2 ep rank " + std::to_string(r)));
    }
  }
  EXPECT_EQ(covered, static_cast<int>(dequant_experts(c).size()));
}

INSTANTIATE_TEST_SUITE_P(Cases, ConformanceParams, ::testing::ValuesIn(case_names(false)),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Error cases: the pipeline must fail with a qmoe::Error carrying one of the keywords; cases whose
// error_stage is "load" must fail inside load_expert_params (config, checkpoint and scheme are fine).
class ConformanceErrors : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceErrors, FailsWithKeyword) {
  const auto meta = read_json(cases_dir() / GetParam() / "case.json");
  const auto keywords = meta.at("error_keywords").get<std::vector<std::string>>();
  const std::string dir = (cases_dir() / GetParam()).string();
  const bool load_stage = meta.value("error_stage", "") == "load";
  std::string msg;
  bool reached_load = false;
  try {
    const ModelConfig cfg = ModelConfig::load(dir);
    const Checkpoint ckpt = Checkpoint::open(dir);
    const int layer = cfg.moe_layers.empty() ? 0 : cfg.moe_layers.front();
    const LayerScheme ls = resolve_moe_scheme(cfg, layer);
    reached_load = true;
    ExpertParams p = load_expert_params(ckpt, cfg, ls, layer, LoadOptions{});
    process_expert_params(p);
  } catch (const Error& e) {
    msg = e.what();
  }
  ASSERT_FALSE(msg.empty()) << GetParam() << ": no qmoe::Error was thrown";
  EXPECT_TRUE(contains_any_ci(msg, keywords)) << GetParam() << ": message lacks the keywords: " << msg;
  if (load_stage) {
    EXPECT_TRUE(reached_load) << GetParam() << ": failed before load_expert_params: " << msg;
  }
  std::printf("[ conformance ] %s: %s\n", GetParam().c_str(), msg.c_str());
}

INSTANTIATE_TEST_SUITE_P(Cases, ConformanceErrors, ::testing::ValuesIn(case_names(true)),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace qmoe::test
