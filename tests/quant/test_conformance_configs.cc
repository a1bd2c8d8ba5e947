// Every conformance case's config.json: the model fields match case.json, layer 0 resolves to the
// case's scheme (or fails at resolution with one of error_keywords for config-stage error cases),
// and the quantization_config equals what quark_quantization_config_json writes for that scheme.
#include <filesystem>

#include "quant_test_util.h"

namespace qmoe::test {
namespace {

struct Case {
  std::string name, dir;
  nlohmann::json meta;
};

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const auto& e : std::filesystem::directory_iterator(cases_dir())) {
    if (!e.is_directory() || !std::filesystem::exists(e.path() / "config.json")) continue;
    Case c{e.path().filename().string(), e.path().string(), nlohmann::json::parse(read_text((e.path() / "case.json").string()))};
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  return out;
}

bool config_stage_error(const Case& c) {
  return c.meta.value("expect_error", false) && c.meta.value("error_stage", "") == "config";
}

TEST(ConformanceConfigs, CasesExist) { EXPECT_GE(all_cases().size(), 20u); }

TEST(ConformanceConfigs, ModelFieldsMatchCase) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    const ModelConfig cfg = ModelConfig::load(c.dir);
    EXPECT_EQ(cfg.model_type, c.meta.at("arch").get<std::string>());
    EXPECT_EQ(cfg.hidden_size, c.meta.at("H").get<int>());
    EXPECT_EQ(cfg.moe_intermediate_size, c.meta.at("I").get<int>());
    EXPECT_EQ(cfg.num_experts, c.meta.at("E").get<int>());
    EXPECT_EQ(cfg.top_k, c.meta.at("K").get<int>());
    ASSERT_FALSE(cfg.moe_layers.empty());
    EXPECT_EQ(cfg.moe_layers.front(), 0);
    ASSERT_TRUE(cfg.quant.has_value());
    if (c.meta.contains("routing")) {
      const auto& r = c.meta["routing"];
      const std::string type = r.value("type", "");
      EXPECT_EQ(cfg.routing.topk_then_softmax, type == "topk_then_softmax");
      EXPECT_EQ(cfg.routing.has_correction_bias, type.find("bias") != std::string::npos);
      if (r.contains("renormalize")) {
        EXPECT_EQ(cfg.routing.renormalize, r["renormalize"].get<bool>());
      }
      if (r.contains("n_group")) {
        EXPECT_EQ(cfg.routing.n_group, r["n_group"].get<int>());
      }
      if (r.contains("topk_group")) {
        EXPECT_EQ(cfg.routing.topk_group, r["topk_group"].get<int>());
      }
      if (r.contains("routed_scaling_factor")) {
        EXPECT_FLOAT_EQ(cfg.routing.routed_scaling_factor, r["routed_scaling_factor"].get<float>());
      }
      EXPECT_EQ(cfg.routing.scoring, type.find("sigmoid") != std::string::npos ? ScoringFunc::Sigmoid
                                                                               : ScoringFunc::Softmax);
    }
    if (c.meta.value("activation", "") == "swigluoai") {
      EXPECT_EQ(cfg.activation, Activation::SwigluOai);
      ASSERT_TRUE(cfg.swiglu_limit.has_value());
      EXPECT_FLOAT_EQ(*cfg.swiglu_limit, c.meta["activation_params"]["limit"].get<float>());
      EXPECT_FLOAT_EQ(cfg.swiglu_alpha, c.meta["activation_params"]["alpha"].get<float>());
    } else if (c.meta.contains("activation")) {
      EXPECT_EQ(to_string(cfg.activation), c.meta["activation"].get<std::string>());
    }
  }
}

TEST(ConformanceConfigs, SchemeResolvesOrFailsWithKeyword) {
  int resolved = 0, config_errors = 0;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    const ModelConfig cfg = ModelConfig::load(c.dir);
    if (config_stage_error(c)) {
      const std::string msg = error_of([&] { (void)resolve_moe_scheme(cfg, 0); });
      ASSERT_NE(msg, "");
      bool any = false;
      for (const auto& kw : c.meta.at("error_keywords")) any = any || contains_ci(msg, kw.get<std::string>());
      EXPECT_TRUE(any) << msg;
      EXPECT_TRUE(contains_ci(msg, "model.layers.0.mlp.experts")) << msg;
      ++config_errors;
      continue;
    }
    // Non-error cases, and load/open-stage error cases (their config is valid).
    const LayerScheme ls = resolve_moe_scheme(cfg, 0);
    ASSERT_NE(ls.scheme, nullptr);
    EXPECT_EQ(ls.scheme->name, c.meta.at("scheme").get<std::string>());
    EXPECT_EQ(ls.excluded, ls.scheme->name == "unquantized");
    EXPECT_FALSE(ls.reason.empty());
    ++resolved;
  }
  EXPECT_EQ(config_errors, 2);
  EXPECT_GE(resolved, 18);
}

TEST(ConformanceConfigs, DeepseekSharedExpertIsExcluded) {
  const ModelConfig cfg = ModelConfig::load(cases_dir() + "deepseek_v3_w_mxfp4_a_mxfp4");
  EXPECT_EQ(cfg.shared_expert_intermediate_size, cfg.moe_intermediate_size);
  const LayerScheme ls = resolve_shared_expert_scheme(cfg, 0);
  EXPECT_EQ(ls.prefix, "model.layers.0.mlp.shared_experts");
  EXPECT_TRUE(ls.excluded);
  EXPECT_EQ(ls.scheme->name, "unquantized");
}

// quark_quantization_config_json reproduces each case's quantization_config (keys and values).
TEST(ConformanceConfigs, QuarkJsonMatchesCaseConfigs) {
  int compared = 0;
  for (const Case& c : all_cases()) {
    if (config_stage_error(c)) continue;
    SCOPED_TRACE(c.name);
    const nlohmann::json cfg = nlohmann::json::parse(read_text(c.dir + "/config.json"));
    const nlohmann::json& expected = cfg.at("quantization_config");
    const auto exclude = expected.at("exclude").get<std::vector<std::string>>();
    // The excluded case quantizes everything else: compare with the scheme of its global config.
    std::string scheme = c.meta.at("scheme").get<std::string>();
    if (scheme == "unquantized")
      scheme = resolve_scheme_from_layer_config(ModelConfig::load(c.dir).quant->global_quant_config, "g").scheme->name;
    const nlohmann::json got =
        nlohmann::json::parse(quark_quantization_config_json(scheme_by_name(scheme), exclude));
    EXPECT_EQ(got, expected) << "diff: " << nlohmann::json::diff(expected, got).dump();
    ++compared;
  }
  EXPECT_GE(compared, 18);
}

}  // namespace
}  // namespace qmoe::test
