// ModelConfig::parse / load: per-architecture fields, MoE layer selection, module names, errors.
#include <set>

#include "quant_test_util.h"

namespace qmoe::test {
namespace {

Json mixtral() {
  return {{"model_type", "mixtral"},      {"hidden_size", 64},         {"intermediate_size", 96},
          {"num_local_experts", 8},       {"num_experts_per_tok", 2},  {"num_hidden_layers", 3},
          {"hidden_act", "silu"}};
}
Json qwen2() {
  Json j = qwen3_json();
  j["model_type"] = "qwen2_moe";
  j.erase("norm_topk_prob");
  j["shared_expert_intermediate_size"] = 80;
  return j;
}
Json deepseek_v2() {
  return {{"model_type", "deepseek_v2"}, {"hidden_size", 64},       {"moe_intermediate_size", 16},
          {"n_routed_experts", 16},      {"num_experts_per_tok", 6}, {"num_hidden_layers", 6},
          {"n_shared_experts", 2},       {"topk_method", "greedy"}, {"n_group", 1},
          {"topk_group", 1},             {"first_k_dense_replace", 1}, {"moe_layer_freq", 2},
          {"norm_topk_prob", false},     {"routed_scaling_factor", 1.0}, {"scoring_func", "softmax"},
          {"hidden_act", "silu"}};
}
Json deepseek_v3() {
  return {{"model_type", "deepseek_v3"}, {"hidden_size", 64},          {"moe_intermediate_size", 16},
          {"n_routed_experts", 32},      {"num_experts_per_tok", 4},    {"num_hidden_layers", 4},
          {"n_shared_experts", 1},       {"topk_method", "noaux_tc"},   {"n_group", 4},
          {"topk_group", 2},             {"first_k_dense_replace", 1},  {"moe_layer_freq", 1},
          {"norm_topk_prob", true},      {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
          {"hidden_act", "silu"}};
}
Json gpt_oss() {
  return {{"model_type", "gpt_oss"},    {"hidden_size", 64}, {"intermediate_size", 32}, {"num_local_experts", 8},
          {"experts_per_token", 4},     {"num_hidden_layers", 2}, {"hidden_act", "silu"}};
}

TEST(ModelConfig, Mixtral) {
  const ModelConfig c = model_from(mixtral());
  EXPECT_EQ(c.model_type, "mixtral");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.moe_intermediate_size, 96);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(c.routing.renormalize);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::Softmax);
  EXPECT_FALSE(c.routing.topk_then_softmax);
  EXPECT_EQ(c.activation, Activation::Silu);
  EXPECT_EQ(c.naming, ExpertNaming::Mixtral);
  EXPECT_EQ(c.moe_prefix(2), "model.layers.2.block_sparse_moe");
  EXPECT_EQ(c.experts_prefix(2), "model.layers.2.block_sparse_moe.experts");
  EXPECT_EQ(c.router_weight_name(0), "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(c.router_bias_name(0), "");
  EXPECT_EQ(c.correction_bias_name(0), "");
  EXPECT_EQ(c.shared_expert_prefix(0), "");
  EXPECT_EQ(c.shared_expert_gate_name(0), "");
  EXPECT_EQ(c.projection_names(), (std::vector<std::string>{"w1", "w3", "w2"}));
  EXPECT_FALSE(c.quant.has_value());
  EXPECT_FALSE(c.expert_bias);
  EXPECT_FALSE(c.swiglu_limit.has_value());
}

// transformers >= 5 + Quark 0.13 export Mixtral experts as mlp.experts.E.{gate,up,down}_proj and
// the router as mlp.gate (found by tests/interop); the naming follows the checkpoint.
TEST(ModelConfig, MixtralNamingFollowsTheCheckpoint) {
  const std::set<std::string> v5 = {"model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.gate.weight"};
  const std::set<std::string> v4 = {"model.layers.0.block_sparse_moe.experts.0.w1.weight",
                                    "model.layers.0.mlp.experts.0.gate_proj.weight"};
  for (const auto& [names, gate_up_down] : {std::pair{v5, true}, std::pair{v4, false}, std::pair{std::set<std::string>{}, false}}) {
    ModelConfig c = model_from(mixtral());
    c.adapt_naming_to_checkpoint([&](const std::string& n) { return names.count(n) > 0; });
    if (gate_up_down) {
      EXPECT_EQ(c.naming, ExpertNaming::GateUpDown);
      EXPECT_EQ(c.experts_prefix(1), "model.layers.1.mlp.experts");
      EXPECT_EQ(c.router_weight_name(0), "model.layers.0.mlp.gate.weight");
      EXPECT_EQ(c.projection_names(), (std::vector<std::string>{"gate_proj", "up_proj", "down_proj"}));
    } else {
      EXPECT_EQ(c.naming, ExpertNaming::Mixtral);  // transformers 4 names win; none found: unchanged
      EXPECT_EQ(c.experts_prefix(1), "model.layers.1.block_sparse_moe.experts");
    }
  }
  ModelConfig q = model_from(qwen3_json());  // other architectures are never changed
  q.adapt_naming_to_checkpoint([](const std::string&) { return false; });
  EXPECT_EQ(q.naming, ExpertNaming::GateUpDown);
}

TEST(ModelConfig, Qwen2MoeSharedExpertAndSparseStep) {
  Json j = qwen2();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const ModelConfig c = model_from(j);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{1, 5}));  // (L+1) % 2 == 0, minus mlp_only 3
  EXPECT_FALSE(c.routing.renormalize);                 // qwen2_moe default norm_topk_prob false
  EXPECT_EQ(c.shared_expert_intermediate_size, 80);
  EXPECT_TRUE(c.shared_expert_gate);
  EXPECT_EQ(c.shared_expert_prefix(1), "model.layers.1.mlp.shared_expert");
  EXPECT_EQ(c.shared_expert_gate_name(1), "model.layers.1.mlp.shared_expert_gate.weight");
  EXPECT_EQ(c.router_weight_name(1), "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(c.projection_names(), (std::vector<std::string>{"gate_proj", "up_proj", "down_proj"}));
  j["norm_topk_prob"] = true;
  EXPECT_TRUE(model_from(j).routing.renormalize);
  j["shared_expert_intermediate_size"] = 0;
  const ModelConfig no_shared = model_from(j);
  EXPECT_EQ(no_shared.shared_expert_prefix(1), "");
  EXPECT_EQ(no_shared.shared_expert_gate_name(1), "");
  EXPECT_FALSE(no_shared.shared_expert_gate);
}

TEST(ModelConfig, Qwen3Moe) {
  Json j = qwen3_json();
  ModelConfig c = model_from(j);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(c.routing.renormalize);
  EXPECT_EQ(c.shared_expert_intermediate_size, 0);
  EXPECT_EQ(c.experts_prefix(3), "model.layers.3.mlp.experts");
  j.erase("norm_topk_prob");
  EXPECT_TRUE(model_from(j).routing.renormalize);  // qwen3_moe default true
  j["norm_topk_prob"] = false;
  EXPECT_FALSE(model_from(j).routing.renormalize);
  j["mlp_only_layers"] = {0, 2};
  EXPECT_EQ(model_from(j).moe_layers, (std::vector<int>{1, 3}));
}

TEST(ModelConfig, DeepseekV2) {
  Json j = deepseek_v2();
  ModelConfig c = model_from(j);
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.top_k, 6);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{2, 4}));  // L >= 1 and L % 2 == 0
  EXPECT_EQ(c.shared_expert_intermediate_size, 32);  // 2 × 16
  EXPECT_EQ(c.shared_expert_prefix(2), "model.layers.2.mlp.shared_experts");
  EXPECT_EQ(c.shared_expert_gate_name(2), "");
  EXPECT_EQ(c.routing.n_group, 0);  // greedy: no grouping
  EXPECT_FALSE(c.routing.has_correction_bias);
  EXPECT_FALSE(c.routing.renormalize);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::Softmax);
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 4;
  j["topk_group"] = 2;
  c = model_from(j);
  EXPECT_EQ(c.routing.n_group, 4);
  EXPECT_EQ(c.routing.topk_group, 2);
  EXPECT_FALSE(c.routing.has_correction_bias);
  EXPECT_EQ(c.correction_bias_name(2), "");
  j.erase("scoring_func");
  EXPECT_EQ(model_from(j).routing.scoring, ScoringFunc::Softmax);  // v2 default
  j["n_shared_experts"] = nullptr;
  EXPECT_EQ(model_from(j).shared_expert_prefix(2), "");
}

TEST(ModelConfig, DeepseekV3) {
  Json j = deepseek_v3();
  ModelConfig c = model_from(j);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(c.routing.scoring, ScoringFunc::Sigmoid);
  EXPECT_TRUE(c.routing.has_correction_bias);
  EXPECT_EQ(c.routing.n_group, 4);
  EXPECT_EQ(c.routing.topk_group, 2);
  EXPECT_FLOAT_EQ(c.routing.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(c.routing.renormalize);
  EXPECT_EQ(c.correction_bias_name(1), "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(c.router_weight_name(1), "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(c.shared_expert_intermediate_size, 16);
  EXPECT_EQ(c.shared_expert_prefix(1), "model.layers.1.mlp.shared_experts");
  j.erase("scoring_func");
  j.erase("topk_method");
  c = model_from(j);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::Sigmoid);  // v3 defaults
  EXPECT_TRUE(c.routing.has_correction_bias);
  // Invalid grouping.
  j = deepseek_v3();
  j["n_group"] = 5;
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "n_group"));
  j = deepseek_v3();
  j["topk_group"] = 8;
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "topk_group"));
  j = deepseek_v3();
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 9;  // more than one group of 8 holds
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "num_experts_per_tok"));
  j = deepseek_v3();
  j["topk_method"] = "best";
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "topk_method"));
  j = deepseek_v3();
  j["scoring_func"] = "tanh";
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "scoring_func"));
}

TEST(ModelConfig, GptOss) {
  Json j = gpt_oss();
  ModelConfig c = model_from(j);
  EXPECT_EQ(c.top_k, 4);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.activation, Activation::SwigluOai);  // hidden_act ignored
  ASSERT_TRUE(c.swiglu_limit.has_value());
  EXPECT_FLOAT_EQ(*c.swiglu_limit, 7.0f);
  EXPECT_FLOAT_EQ(c.swiglu_alpha, 1.702f);
  EXPECT_TRUE(c.expert_bias);
  EXPECT_TRUE(c.router_bias);
  EXPECT_TRUE(c.routing.topk_then_softmax);
  EXPECT_EQ(c.naming, ExpertNaming::GptOss);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.router_weight_name(1), "model.layers.1.mlp.router.weight");
  EXPECT_EQ(c.router_bias_name(1), "model.layers.1.mlp.router.bias");
  EXPECT_EQ(c.experts_prefix(1), "model.layers.1.mlp.experts");
  EXPECT_EQ(c.projection_names(), (std::vector<std::string>{"gate_up_proj", "", "down_proj"}));
  j["num_experts_per_tok"] = 4;
  j["swiglu_limit"] = 5.5;
  c = model_from(j);
  EXPECT_FLOAT_EQ(*c.swiglu_limit, 5.5f);
  j["num_experts_per_tok"] = 2;
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "experts_per_token"));
  j.erase("num_experts_per_tok");
  j.erase("experts_per_token");
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "num_experts_per_tok"));
}

TEST(ModelConfig, HiddenAct) {
  Json j = mixtral();
  const std::pair<const char*, Activation> acts[] = {{"silu", Activation::Silu},
                                                     {"gelu", Activation::Gelu},
                                                     {"gelu_pytorch_tanh", Activation::GeluTanh},
                                                     {"gelu_tanh", Activation::GeluTanh}};
  for (const auto& [name, act] : acts) {
    j["hidden_act"] = name;
    EXPECT_EQ(model_from(j).activation, act) << name;
  }
  j["hidden_act"] = "relu2";
  const std::string msg = error_of([&] { model_from(j); });
  EXPECT_TRUE(contains_ci(msg, "hidden_act")) << msg;
  EXPECT_TRUE(contains_ci(msg, "relu2")) << msg;
  EXPECT_EQ(to_string(Activation::Silu), "silu");
  EXPECT_EQ(to_string(Activation::Gelu), "gelu");
  EXPECT_EQ(to_string(Activation::GeluTanh), "gelu_tanh");
  EXPECT_EQ(to_string(Activation::SwigluOai), "swigluoai");
}

// transformers >= 5 writes Qwen2/3-MoE configs with `num_local_experts` instead of `num_experts`
// (found by tests/interop on a real Quark 0.13 export); both spellings load, and must agree.
TEST(ModelConfig, QwenMoeNumLocalExpertsSpelling) {
  for (Json j : {qwen3_json(), qwen2()}) {
    j.erase("num_experts");
    j["num_local_experts"] = 8;
    EXPECT_EQ(model_from(j).num_experts, 8);
    j["num_experts"] = 8;
    EXPECT_EQ(model_from(j).num_experts, 8);
    j["num_experts"] = 4;
    const std::string msg = error_of([&] { model_from(j); });
    EXPECT_TRUE(contains_ci(msg, "num_local_experts") && contains_ci(msg, "disagrees")) << msg;
    j.erase("num_experts");
    j["num_local_experts"] = 0;
    EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "'num_local_experts'"));
  }
}

TEST(ModelConfig, MissingRequiredFieldsNameFieldAndFile) {
  const std::vector<std::pair<Json, std::vector<std::string>>> archs = {
      {mixtral(), {"hidden_size", "intermediate_size", "num_local_experts", "num_experts_per_tok", "num_hidden_layers"}},
      {qwen3_json(), {"hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "num_hidden_layers"}},
      {qwen2(), {"shared_expert_intermediate_size"}},
      {deepseek_v2(), {"moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "n_shared_experts"}},
      {deepseek_v3(), {"moe_intermediate_size", "n_routed_experts", "num_experts_per_tok"}},
      {gpt_oss(), {"intermediate_size", "num_local_experts", "hidden_size"}},
  };
  for (const auto& [base, fields] : archs) {
    for (const std::string& f : fields) {
      Json j = base;
      j.erase(f);
      const std::string msg = error_of([&] { model_from(j); });
      EXPECT_TRUE(contains_ci(msg, "'" + f + "'")) << f << ": " << msg;
      EXPECT_TRUE(contains_ci(msg, "test/config.json")) << msg;
    }
  }
  Json j = mixtral();
  j.erase("model_type");
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "model_type"));
}

TEST(ModelConfig, InvalidValues) {
  Json j = mixtral();
  j["model_type"] = "llama";
  std::string msg = error_of([&] { model_from(j); });
  EXPECT_TRUE(contains_ci(msg, "llama")) << msg;
  for (const char* t : {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss"})
    EXPECT_TRUE(contains_ci(msg, t)) << msg;
  j = mixtral();
  j["num_experts_per_tok"] = 9;
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "num_experts_per_tok"));
  j = mixtral();
  j["hidden_size"] = "64";
  msg = error_of([&] { model_from(j); });
  EXPECT_TRUE(contains_ci(msg, "hidden_size")) << msg;
  EXPECT_TRUE(contains_ci(msg, "integer")) << msg;
  j = mixtral();
  j["hidden_size"] = 0;
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "hidden_size"));
  j = qwen3_json();
  j["decoder_sparse_step"] = 0;
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "decoder_sparse_step"));
  j = qwen3_json();
  j["mlp_only_layers"] = {0, 1, 2, 3};
  EXPECT_TRUE(contains_ci(error_of([&] { model_from(j); }), "no decoder layer has an MoE block"));
  EXPECT_TRUE(contains_ci(error_of([] { ModelConfig::parse("{", "bad.json"); }), "bad.json"));
}

TEST(ModelConfig, QuantizationConfig) {
  Json j = qwen3_json(quark_json("w_mxfp4"));
  const ModelConfig c = model_from(j);
  ASSERT_TRUE(c.quant.has_value());
  EXPECT_EQ(c.quant->global_quant_config.weight[0].dtype, "fp4");
  j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "static"}};
  std::string msg = error_of([&] { model_from(j); });
  EXPECT_TRUE(contains_ci(msg, "Quark")) << msg;
  EXPECT_TRUE(contains_ci(msg, "fp8")) << msg;
  j["quantization_config"] = {{"bits", 4}};
  msg = error_of([&] { model_from(j); });
  EXPECT_TRUE(contains_ci(msg, "quant_method")) << msg;
  j["quantization_config"] = nullptr;  // null: unquantized
  EXPECT_FALSE(model_from(j).quant.has_value());
}

TEST(ModelConfig, LoadReadsConfigJsonAndSetsDir) {
  const std::string dir = cases_dir() + "qwen3_w_mxfp4";
  const ModelConfig c = ModelConfig::load(dir);
  EXPECT_EQ(c.dir, dir);
  EXPECT_EQ(c.model_type, "qwen3_moe");
  const std::string msg = error_of([] { ModelConfig::load("/nonexistent/qmoe-dir"); });
  EXPECT_TRUE(contains_ci(msg, "/nonexistent/qmoe-dir/config.json")) << msg;
}

}  // namespace
}  // namespace qmoe::test
