// resolve_moe_scheme / resolve_shared_expert_scheme: exclusion (all-or-nothing, wins), the
// layer_quant_config → layer_type_quant_config["Linear"] → global order (spec §3, §16.3).
#include "quant_test_util.h"

namespace qmoe::test {
namespace {

Json layer_config(std::string_view scheme) { return quark_json(scheme)["global_quant_config"]; }

LayerScheme resolve_layer(const Json& quant, int layer = 1) { return resolve_moe_scheme(model_from(qwen3_json(quant)), layer); }

TEST(LayerMatch, NoQuantizationConfigIsUnquantized) {
  const ModelConfig cfg = model_from(qwen3_json());
  EXPECT_FALSE(cfg.quant.has_value());
  const LayerScheme ls = resolve_moe_scheme(cfg, 0);
  EXPECT_EQ(ls.scheme->name, "unquantized");
  EXPECT_FALSE(ls.excluded);
  EXPECT_EQ(ls.prefix, "model.layers.0.mlp.experts");
}

TEST(LayerMatch, GlobalConfig) {
  const LayerScheme ls = resolve_layer(quark_json("w_mxfp4_a_mxfp4"));
  EXPECT_EQ(ls.scheme->name, "w_mxfp4_a_mxfp4");
  EXPECT_EQ(ls.reason, "global_quant_config");
  EXPECT_EQ(ls.prefix, "model.layers.1.mlp.experts");
}

TEST(LayerMatch, RouterExclusionsDoNotExcludeExperts) {
  Json q = quark_json("w_mxfp4", {"lm_head", "re:.*mlp.gate$", "*.gate", "*.gate.*", "re:.*self_attn.*"});
  EXPECT_EQ(resolve_layer(q).scheme->name, "w_mxfp4");
}

TEST(LayerMatch, ExclusionForms) {
  const std::vector<std::string> excluding = {
      "model.layers.1.mlp.experts",                 // exact prefix
      "re:model\\.layers\\.1\\.mlp\\.experts",      // regex on the prefix
      "re:.*experts.*",                             // regex
      "model.layers.1.mlp.experts.5.down_proj",     // exact expert linear
      "model.layers.1.mlp.experts.99.down_proj",    // a child name (vLLM check_children), even unknown
      "model.layers.1.mlp.experts.5",               // a child module
      "model.layers.*.mlp.experts.*.down_proj",     // glob over linears
      "*experts.[0-3].up_proj",                     // glob with a class, some experts only
      "re:model.layers.1.mlp.experts.7.gate_proj",  // regex on one linear
      "model.layers.1",                             // enclosing module (Quark expands X to X.*)
      "model.layers.1.*",                           // glob on everything under the layer
  };
  for (const std::string& p : excluding) {
    const LayerScheme ls = resolve_layer(quark_json("w_mxfp4_a_mxfp4", {"lm_head", p}));
    EXPECT_EQ(ls.scheme->name, "unquantized") << p;
    EXPECT_TRUE(ls.excluded) << p;
    EXPECT_TRUE(contains_ci(ls.reason, p)) << ls.reason;
  }
  const std::vector<std::string> not_excluding = {
      "model.layers.2.mlp.experts",        // another layer
      "re:model\\.layers\\.10\\.",         // layer 10, not 1
      "re:mlp.experts",                    // anchored at the start
      "model.layers.1.mlp.shared_expert",  // another module
      "model.layers.1.mlp.gate",           // the router
      "model.layers.1.mlp.experts_x",      // not a child (no '.')
      "*experts.[4-7].gate",               // not an expert projection name
  };
  for (const std::string& p : not_excluding) {
    const LayerScheme ls = resolve_layer(quark_json("w_mxfp4_a_mxfp4", {"lm_head", p}));
    EXPECT_EQ(ls.scheme->name, "w_mxfp4_a_mxfp4") << p;
    EXPECT_FALSE(ls.excluded) << p;
  }
  EXPECT_TRUE(resolve_layer(quark_json("w_mxfp4_a_mxfp4", {"model.layers"})).excluded);
}

TEST(LayerMatch, ExclusionWinsOverLayerQuantConfig) {
  Json q = quark_json("w_mxfp4_a_mxfp4", {"re:.*experts.*"});
  q["layer_quant_config"]["model.layers.1.mlp.experts"] = layer_config("nvfp4");
  const LayerScheme ls = resolve_layer(q);
  EXPECT_TRUE(ls.excluded);
  EXPECT_EQ(ls.scheme->name, "unquantized");
  EXPECT_TRUE(contains_ci(ls.reason, "exclude")) << ls.reason;
}

TEST(LayerMatch, ExclusionWinsOverInvalidConfig) {
  Json q = quark_json("w_mxfp4_a_mxfp4", {"model.layers.1.mlp.experts"});
  q["global_quant_config"]["input_tensors"]["is_dynamic"] = false;  // invalid, but never resolved
  EXPECT_TRUE(resolve_layer(q, 1).excluded);
  EXPECT_NE(error_of([&] { resolve_layer(q, 0); }), "");
}

TEST(LayerMatch, LayerQuantConfigFirstMatchInFileOrder) {
  Json q = quark_json("w_mxfp4");
  q["layer_quant_config"] = Json::object();
  q["layer_quant_config"]["zzz.never"] = layer_config("w_int8_tensor_a_int8_static");
  q["layer_quant_config"]["re:model\\.layers\\.1\\."] = layer_config("nvfp4");  // matches first
  q["layer_quant_config"]["*experts*"] = layer_config("w_fp8_tensor_a_fp8_static");
  LayerScheme ls = resolve_layer(q, 1);
  EXPECT_EQ(ls.scheme->name, "nvfp4");
  EXPECT_EQ(ls.reason, "layer_quant_config 're:model\\.layers\\.1\\.'");
  ls = resolve_layer(q, 2);  // layer 2: the glob
  EXPECT_EQ(ls.scheme->name, "w_fp8_tensor_a_fp8_static");
  EXPECT_EQ(ls.reason, "layer_quant_config '*experts*'");
}

TEST(LayerMatch, LayerQuantConfigOnExpertLinearNames) {
  Json q = quark_json("w_mxfp4");
  q["layer_quant_config"]["model.layers.*.mlp.experts.*"] = layer_config("w_mxfp6_e2m3_a_mxfp6_e2m3");
  EXPECT_EQ(resolve_layer(q).scheme->name, "w_mxfp6_e2m3_a_mxfp6_e2m3");
  // An exact linear name covers only that expert: the others fall back to global → mixed error.
  q = quark_json("w_mxfp4");
  q["layer_quant_config"]["model.layers.1.mlp.experts.0.gate_proj"] = layer_config("nvfp4");
  const std::string msg = error_of([&] { resolve_layer(q); });
  EXPECT_TRUE(contains_ci(msg, "model.layers.1.mlp.experts")) << msg;
  EXPECT_TRUE(contains_ci(msg, "different quantization")) << msg;
  // ... unless the configs are equal.
  q["layer_quant_config"]["model.layers.1.mlp.experts.0.gate_proj"] = layer_config("w_mxfp4");
  EXPECT_EQ(resolve_layer(q).scheme->name, "w_mxfp4");
}

TEST(LayerMatch, LayerTypeQuantConfigLinear) {
  Json q = quark_json("w_mxfp4");
  q["layer_type_quant_config"]["Conv2d"] = layer_config("nvfp4");
  q["layer_type_quant_config"]["Linear"] = layer_config("w_int8_channel_a_int8_dyn_token");
  LayerScheme ls = resolve_layer(q);
  EXPECT_EQ(ls.scheme->name, "w_int8_channel_a_int8_dyn_token");
  EXPECT_EQ(ls.reason, "layer_type_quant_config 'Linear'");
  // layer_quant_config has priority.
  q["layer_quant_config"]["*.experts.*"] = layer_config("w_mxfp4_a_fp8");
  EXPECT_EQ(resolve_layer(q).scheme->name, "w_mxfp4_a_fp8");
}

TEST(LayerMatch, NoApplicableConfigIsUnquantized) {
  Json q = quark_json("w_mxfp4");
  q.erase("global_quant_config");
  q["layer_quant_config"]["model.layers.0.mlp.experts"] = layer_config("w_mxfp4");
  EXPECT_EQ(resolve_layer(q, 0).scheme->name, "w_mxfp4");
  const LayerScheme ls = resolve_layer(q, 1);
  EXPECT_EQ(ls.scheme->name, "unquantized");
  EXPECT_FALSE(ls.excluded);
}

TEST(LayerMatch, ErrorsNameLayerFieldAndConfigSource) {
  Json q = quark_json("w_mxfp4");
  q["layer_quant_config"]["re:model.layers.3"] = layer_config("w_mxfp4_a_mxfp4");
  q["layer_quant_config"]["re:model.layers.3"]["input_tensors"]["is_dynamic"] = false;
  const std::string msg = error_of([&] { resolve_layer(q, 3); });
  EXPECT_TRUE(contains_ci(msg, "model.layers.3.mlp.experts")) << msg;
  EXPECT_TRUE(contains_ci(msg, "input_tensors.is_dynamic")) << msg;
  EXPECT_TRUE(contains_ci(msg, "layer_quant_config 're:model.layers.3'")) << msg;
}

TEST(LayerMatch, NonMoeLayerIsAnError) {
  Json j = qwen3_json(quark_json("w_mxfp4"));
  j["mlp_only_layers"] = {0};
  const ModelConfig cfg = model_from(j);
  EXPECT_TRUE(contains_ci(error_of([&] { resolve_moe_scheme(cfg, 0); }), "model.layers.0"));
  EXPECT_TRUE(contains_ci(error_of([&] { resolve_moe_scheme(cfg, 4); }), "not an MoE layer"));
  EXPECT_TRUE(contains_ci(error_of([&] { resolve_moe_scheme(cfg, -1); }), "not an MoE layer"));
}

TEST(LayerMatch, MixtralAndGptOssLinearNames) {
  Json mix = {{"model_type", "mixtral"}, {"hidden_size", 64}, {"intermediate_size", 32}, {"num_local_experts", 4},
              {"num_experts_per_tok", 2}, {"num_hidden_layers", 2}};
  mix["quantization_config"] = quark_json("w_mxfp4", {"model.layers.0.block_sparse_moe.experts.2.w3"});
  const ModelConfig m = model_from(mix);
  EXPECT_TRUE(resolve_moe_scheme(m, 0).excluded);
  EXPECT_FALSE(resolve_moe_scheme(m, 1).excluded);
  EXPECT_EQ(resolve_moe_scheme(m, 1).prefix, "model.layers.1.block_sparse_moe.experts");

  Json oss = {{"model_type", "gpt_oss"}, {"hidden_size", 64}, {"intermediate_size", 32}, {"num_local_experts", 4},
              {"experts_per_token", 2}, {"num_hidden_layers", 2}};
  oss["quantization_config"] = quark_json("w_mxfp4", {"*experts.1.gate_up_proj"});
  const ModelConfig g = model_from(oss);
  EXPECT_TRUE(resolve_moe_scheme(g, 0).excluded);
  oss["quantization_config"] = quark_json("w_mxfp4", {"re:.*mlp.router$"});
  EXPECT_EQ(resolve_moe_scheme(model_from(oss), 0).scheme->name, "w_mxfp4");
}

Json qwen2_json(const Json& quant) {
  Json j = qwen3_json(quant);
  j["model_type"] = "qwen2_moe";
  j["shared_expert_intermediate_size"] = 48;
  return j;
}

TEST(LayerMatch, SharedExpertScheme) {
  Json q = quark_json("w_int8_channel_a_int8_dyn_token", {"lm_head", "re:.*mlp\\.gate$", "re:.*shared_expert_gate$"});
  ModelConfig cfg = model_from(qwen2_json(q));
  LayerScheme ls = resolve_shared_expert_scheme(cfg, 0);
  EXPECT_EQ(ls.prefix, "model.layers.0.mlp.shared_expert");
  EXPECT_EQ(ls.scheme->name, "w_int8_channel_a_int8_dyn_token");
  // Excluding the shared expert does not exclude the routed experts, and vice versa.
  q["exclude"].push_back("model.layers.0.mlp.shared_expert.down_proj");
  cfg = model_from(qwen2_json(q));
  EXPECT_TRUE(resolve_shared_expert_scheme(cfg, 0).excluded);
  EXPECT_FALSE(resolve_moe_scheme(cfg, 0).excluded);
  q["exclude"] = {"re:.*mlp.experts"};
  cfg = model_from(qwen2_json(q));
  EXPECT_FALSE(resolve_shared_expert_scheme(cfg, 0).excluded);
  EXPECT_TRUE(resolve_moe_scheme(cfg, 0).excluded);
  // A layer config on the shared expert's linears.
  q = quark_json("w_mxfp4");
  q["layer_quant_config"]["*shared_expert.*"] = layer_config("w_fp8_channel_a_fp8_dyn_token");
  cfg = model_from(qwen2_json(q));
  EXPECT_EQ(resolve_shared_expert_scheme(cfg, 0).scheme->name, "w_fp8_channel_a_fp8_dyn_token");
  EXPECT_EQ(resolve_moe_scheme(cfg, 0).scheme->name, "w_mxfp4");
  // No shared expert.
  const std::string msg = error_of([] { resolve_shared_expert_scheme(model_from(qwen3_json()), 0); });
  EXPECT_TRUE(contains_ci(msg, "no shared expert")) << msg;
}

}  // namespace
}  // namespace qmoe::test
