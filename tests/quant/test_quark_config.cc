// QuarkConfig::parse: structure, legacy spellings and the from_config errors (spec §3.1, §12;
// checkpoint-format.md §2).
#include "quant_test_util.h"

namespace qmoe::test {
namespace {

TEST(QuarkConfigParse, MxConfigFields) {
  Json j = quark_json("w_mxfp4_a_mxfp4");
  const QuarkConfig q = quark_from(j);
  EXPECT_TRUE(q.has_global);
  ASSERT_EQ(q.global_quant_config.weight.size(), 1u);
  EXPECT_FALSE(q.global_quant_config.weight_is_list);
  const QTensorSpec& w = q.global_quant_config.weight[0];
  EXPECT_EQ(w.dtype, "fp4");
  EXPECT_EQ(w.qscheme, "per_group");
  EXPECT_EQ(w.group_size, 32);
  EXPECT_EQ(w.ch_axis, -1);
  EXPECT_EQ(w.scale_format, "e8m0");
  EXPECT_EQ(w.scale_calculation_mode, "even");
  EXPECT_FALSE(w.symmetric.has_value());
  EXPECT_FALSE(w.is_dynamic);
  ASSERT_EQ(q.global_quant_config.input_tensors.size(), 1u);
  EXPECT_TRUE(q.global_quant_config.input_tensors[0].is_dynamic);
  EXPECT_FALSE(q.global_quant_config.has_output_tensors);
  EXPECT_FALSE(q.global_quant_config.has_bias);
  EXPECT_EQ(q.exclude, (std::vector<std::string>{"lm_head", "re:.*mlp.gate$"}));
  EXPECT_EQ(q.pack_method, "reorder");
  EXPECT_EQ(q.weight_format, "real_quantized");
  EXPECT_EQ(q.version, "0.13+unknown");
  EXPECT_TRUE(q.kv_cache_group.empty());
}

TEST(QuarkConfigParse, ListValuedWeightNvfp4) {
  const QuarkConfig q = quark_from(quark_json("nvfp4"));
  const QLayerConfig& g = q.global_quant_config;
  ASSERT_EQ(g.weight.size(), 2u);
  EXPECT_TRUE(g.weight_is_list);
  EXPECT_EQ(g.weight[0].dtype, "fp4");
  EXPECT_EQ(g.weight[0].group_size, 16);
  EXPECT_EQ(g.weight[1].dtype, "fp8_e4m3");
  EXPECT_TRUE(g.weight[1].is_scale_quant);
  ASSERT_EQ(g.input_tensors.size(), 2u);
  EXPECT_TRUE(g.input_is_list);
  EXPECT_TRUE(g.input_tensors[0].is_dynamic);
  EXPECT_FALSE(g.input_tensors[1].is_dynamic);
  EXPECT_EQ(resolve_scheme_from_layer_config(g, "p").scheme->name, "nvfp4");
}

TEST(QuarkConfigParse, LegacySpellingsDynamicAxisAndNulls) {
  // quark < 1.0: `dynamic` / `axis`, exclude and layer_quant_config may be null, pack_method on top.
  Json j = quark_json("w_int8_channel_a_int8_dyn_token");
  for (const char* f : {"weight", "input_tensors"}) {
    Json& s = j["global_quant_config"][f];
    s["dynamic"] = s["is_dynamic"];
    s.erase("is_dynamic");
    s["axis"] = s["ch_axis"];
    s.erase("ch_axis");
  }
  j["exclude"] = nullptr;
  j["layer_quant_config"] = nullptr;
  j["layer_type_quant_config"] = nullptr;
  j["export"] = {{"custom_mode", "quark"}, {"kv_cache_group", Json::array()}};
  j["pack_method"] = "order";
  const QuarkConfig q = quark_from(j);
  EXPECT_TRUE(q.global_quant_config.input_tensors[0].is_dynamic);
  EXPECT_EQ(q.global_quant_config.input_tensors[0].ch_axis, -1);
  EXPECT_EQ(q.global_quant_config.weight[0].ch_axis, 0);
  EXPECT_TRUE(q.exclude.empty());
  EXPECT_TRUE(q.layer_quant_config.empty());
  EXPECT_EQ(q.pack_method, "order");
  EXPECT_EQ(q.weight_format, "");
  EXPECT_EQ(resolve_scheme_from_layer_config(q.global_quant_config, "p").scheme->name,
            "w_int8_channel_a_int8_dyn_token");
}

TEST(QuarkConfigParse, LayerQuantConfigKeepsFileOrder) {
  // Keys deliberately in non-alphabetical order.
  const std::string text = R"({"quant_method": "quark", "export": {"kv_cache_group": []},
    "layer_quant_config": {"zzz*": null, "aaa*": null, "mmm*": null}})";
  const QuarkConfig q = QuarkConfig::parse(text, "t.json");
  ASSERT_EQ(q.layer_quant_config.size(), 3u);
  EXPECT_EQ(q.layer_quant_config[0].first, "zzz*");
  EXPECT_EQ(q.layer_quant_config[1].first, "aaa*");
  EXPECT_EQ(q.layer_quant_config[2].first, "mmm*");
  EXPECT_FALSE(q.has_global);
}

TEST(QuarkConfigParse, MissingExportIsAnError) {
  Json j = quark_json("w_mxfp4");
  j.erase("export");
  const std::string msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "export")) << msg;
  EXPECT_TRUE(contains_ci(msg, "test/config.json")) << msg;
}

TEST(QuarkConfigParse, FakeQuantizedIsAnError) {
  Json j = quark_json("w_mxfp4");
  j["export"]["weight_format"] = "fake_quantized";
  const std::string msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "fake_quantized")) << msg;
  EXPECT_TRUE(contains_ci(msg, "export.weight_format")) << msg;
}

TEST(QuarkConfigParse, OtherQuantMethodIsAnError) {
  Json j = quark_json("w_mxfp4");
  j["quant_method"] = "fp8";
  EXPECT_TRUE(contains_ci(error_of([&] { quark_from(j); }), "quark"));
  j.erase("quant_method");
  EXPECT_TRUE(contains_ci(error_of([&] { quark_from(j); }), "quant_method"));
}

TEST(QuarkConfigParse, MalformedInputsNameTheField) {
  EXPECT_TRUE(contains_ci(error_of([] { QuarkConfig::parse("{not json", "f.json"); }), "f.json"));
  EXPECT_TRUE(contains_ci(error_of([] { QuarkConfig::parse("[1,2]", "f.json"); }), "object"));

  Json j = quark_json("w_mxfp4");
  j["global_quant_config"]["weight"]["group_size"] = "32";
  std::string msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "global_quant_config.weight.group_size")) << msg;

  j = quark_json("nvfp4");
  j["global_quant_config"]["input_tensors"][1]["is_dynamic"] = 1;
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "global_quant_config.input_tensors[1].is_dynamic")) << msg;

  j = quark_json("w_mxfp4");
  j["global_quant_config"]["weight"].erase("dtype");
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "global_quant_config.weight.dtype")) << msg;

  j = quark_json("w_mxfp4");
  j["exclude"] = {"lm_head", 3};
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "exclude[1]")) << msg;

  j = quark_json("w_mxfp4");
  j["exclude"] = {"lm_head", "re:(unclosed"};
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "exclude[1]")) << msg;

  j = quark_json("w_mxfp4");
  j["layer_quant_config"] = {{"re:[bad", j["global_quant_config"]}};
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "layer_quant_config['re:[bad']")) << msg;

  j = quark_json("w_mxfp4");
  j["global_quant_config"]["weight"] = "fp4";
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "global_quant_config.weight")) << msg;

  j = quark_json("w_mxfp4");
  j["export"]["pack_method"] = "shuffle";
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "pack_method")) << msg;
}

TEST(QuarkConfigParse, OutputTensorsAndBiasTruthiness) {
  Json j = quark_json("w_mxfp4");
  j["global_quant_config"]["output_tensors"] = Json::object();  // empty dict is falsy (Python)
  j["global_quant_config"]["bias"] = false;
  QuarkConfig q = quark_from(j);
  EXPECT_FALSE(q.global_quant_config.has_output_tensors);
  EXPECT_FALSE(q.global_quant_config.has_bias);
  j["global_quant_config"]["bias"] = j["global_quant_config"]["weight"];
  q = quark_from(j);
  EXPECT_TRUE(q.global_quant_config.has_bias);
}

// KV-cache groups (spec §3.1 step 3).
Json with_kv(bool second_differs, bool drop_v) {
  Json j = quark_json("w_fp8_tensor_a_fp8_static");
  Json layer = j["global_quant_config"];
  Json kv = layer["weight"];
  layer["output_tensors"] = kv;
  Json v_layer = layer;
  if (second_differs) v_layer["output_tensors"]["qscheme"] = "per_channel";
  j["layer_quant_config"] = Json::object();
  j["layer_quant_config"]["*k_proj"] = layer;
  if (!drop_v) j["layer_quant_config"]["*v_proj"] = v_layer;
  j["layer_quant_config"]["*q_proj"] = layer;
  j["export"]["kv_cache_group"] = {"*k_proj", "*v_proj"};
  return j;
}

TEST(QuarkConfigParse, KvCacheGroupClearsOutputTensors) {
  const QuarkConfig q = quark_from(with_kv(false, false));
  ASSERT_EQ(q.layer_quant_config.size(), 3u);
  for (const auto& [key, lc] : q.layer_quant_config) EXPECT_FALSE(lc.has_output_tensors) << key;
  EXPECT_EQ(q.kv_cache_group, (std::vector<std::string>{"*k_proj", "*v_proj"}));
}

TEST(QuarkConfigParse, KvCacheGroupErrors) {
  std::string msg = error_of([] { quark_from(with_kv(false, true)); });
  EXPECT_TRUE(contains_ci(msg, "kv_cache_group")) << msg;
  EXPECT_TRUE(contains_ci(msg, "*v_proj")) << msg;
  msg = error_of([] { quark_from(with_kv(true, false)); });
  EXPECT_TRUE(contains_ci(msg, "differ")) << msg;
  Json j = with_kv(false, false);
  j["layer_quant_config"]["*k_proj"]["output_tensors"] = nullptr;
  msg = error_of([&] { quark_from(j); });
  EXPECT_TRUE(contains_ci(msg, "output_tensors")) << msg;
}

}  // namespace
}  // namespace qmoe::test
