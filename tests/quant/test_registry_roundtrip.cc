// Every registry scheme → quark_quantization_config_json → QuarkConfig::parse → resolution gives
// the same scheme back, directly and through a ModelConfig of each naming.
#include "quant_test_util.h"

namespace qmoe::test {
namespace {

TEST(RegistryRoundTrip, EveryScheme) {
  for (const SchemeInfo& s : all_schemes()) {
    SCOPED_TRACE(std::string(s.name));
    const std::string text = quark_quantization_config_json(s, {"lm_head", "re:.*mlp.gate$"});
    const QuarkConfig q = QuarkConfig::parse(text, "roundtrip");
    const LayerScheme ls = resolve_scheme_from_layer_config(q.global_quant_config, "model.layers.0.mlp.experts");
    ASSERT_NE(ls.scheme, nullptr);
    EXPECT_EQ(ls.scheme, &s);  // the registry row itself
    EXPECT_EQ(ls.weight_scale_mode, MxScaleMode::Even);
    EXPECT_EQ(ls.act_scale_mode, MxScaleMode::Even);
  }
}

TEST(RegistryRoundTrip, EverySchemeThroughModelConfigs) {
  const Json archs[] = {
      qwen3_json(),
      {{"model_type", "mixtral"}, {"hidden_size", 64}, {"intermediate_size", 32}, {"num_local_experts", 4},
       {"num_experts_per_tok", 2}, {"num_hidden_layers", 2}},
      {{"model_type", "gpt_oss"}, {"hidden_size", 64}, {"intermediate_size", 32}, {"num_local_experts", 4},
       {"num_experts_per_tok", 2}, {"num_hidden_layers", 2}},
  };
  for (const SchemeInfo& s : all_schemes()) {
    for (Json j : archs) {
      SCOPED_TRACE(std::string(s.name) + " / " + j["model_type"].get<std::string>());
      j["quantization_config"] = quark_json(s.name, {"lm_head", "re:.*mlp.gate$", "re:.*mlp.router$"});
      const ModelConfig cfg = model_from(j);
      const LayerScheme ls = resolve_moe_scheme(cfg, 1);
      EXPECT_EQ(ls.scheme->name, s.name);
      EXPECT_FALSE(ls.excluded);
      EXPECT_EQ(ls.prefix, cfg.experts_prefix(1));
    }
  }
}

TEST(RegistryRoundTrip, JsonHasQuarkKeysSorted) {
  const std::string text = quark_quantization_config_json(scheme_by_name("w_mxfp4_a_mxfp4"), {"lm_head"});
  const Json j = Json::parse(text);  // ordered: keeps the text's order
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  for (const char* k : {"algo_config", "exclude", "export", "global_quant_config", "kv_cache_post_rope",
                        "kv_cache_quant_config", "layer_quant_config", "layer_type_quant_config", "quant_method",
                        "quant_mode", "softmax_quant_spec", "version"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"kv_cache_group", "min_kv_scale", "pack_method", "weight_format", "weight_merge_groups"})
    EXPECT_TRUE(j["export"].contains(k)) << k;
  EXPECT_EQ(j["quant_method"], "quark");
  EXPECT_EQ(j["export"]["weight_format"], "real_quantized");
  std::vector<std::string> wkeys;
  for (const auto& [k, v] : j["global_quant_config"]["weight"].items()) wkeys.push_back(k);
  EXPECT_TRUE(std::is_sorted(wkeys.begin(), wkeys.end()));
  EXPECT_EQ(wkeys.size(), 16u);
}

}  // namespace
}  // namespace qmoe::test
