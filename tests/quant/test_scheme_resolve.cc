// resolve_scheme_from_layer_config: §4 predicates in the §5 order, the §6 method checks and the
// §12 errors. Every error names the module prefix and the offending field.
#include "quant_test_util.h"

namespace qmoe::test {
namespace {

constexpr std::string_view kPrefix = "model.layers.0.mlp.experts";

// The resolution error of a modified config; checks that it names the prefix.
std::string resolve_error(const Json& q) {
  const std::string msg = error_of([&] { (void)resolve_global(q); });
  EXPECT_TRUE(contains_ci(msg, std::string(kPrefix))) << msg;
  return msg;
}

Json& global(Json& j) { return j["global_quant_config"]; }

TEST(SchemeResolve, OutputTensorsOrBiasIsNotImplemented) {
  Json j = quark_json("w_mxfp4");
  global(j)["output_tensors"] = global(j)["weight"];
  std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "output_tensors")) << msg;
  EXPECT_TRUE(contains_ci(msg, "not supported")) << msg;
  j = quark_json("w_mxfp4");
  global(j)["bias"] = global(j)["weight"];
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "'bias'")) << msg;
}

TEST(SchemeResolve, WeightNullIsUnquantized) {
  const LayerScheme ls = resolve_global(quark_json("unquantized"));
  EXPECT_EQ(ls.scheme->name, "unquantized");
  EXPECT_EQ(ls.prefix, kPrefix);
  Json j = quark_json("unquantized");
  global(j)["input_tensors"] = quark_json("w_mxfp4_a_mxfp4")["global_quant_config"]["input_tensors"];
  EXPECT_TRUE(contains_ci(resolve_error(j), "Unsupported FusedMoe scheme"));
}

TEST(SchemeResolve, NoPredicateMatchesIsUnsupported) {
  Json j = quark_json("w_int8_tensor_a_int8_static");
  global(j)["weight"]["dtype"] = "bfloat16";
  global(j)["input_tensors"]["dtype"] = "bfloat16";
  std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "Unsupported FusedMoe scheme")) << msg;
  EXPECT_TRUE(contains_ci(msg, "bfloat16")) << msg;
  j = quark_json("w_int8_tensor_a_int8_static");
  global(j)["weight"]["dtype"] = "int4";
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "Unsupported FusedMoe scheme")) << msg;
  EXPECT_TRUE(contains_ci(msg, "int4")) << msg;
}

TEST(SchemeResolve, WeightOnlyInt8AndFp8AreUnsupported) {
  for (const char* s : {"w_int8_channel_a_int8_dyn_token", "w_fp8_tensor_a_fp8_static"}) {
    Json j = quark_json(s);
    global(j)["input_tensors"] = nullptr;
    const std::string msg = resolve_error(j);
    EXPECT_TRUE(contains_ci(msg, "Unsupported FusedMoe scheme")) << msg;
    EXPECT_TRUE(contains_ci(msg, "W8A16")) << msg;
  }
}

TEST(SchemeResolve, Fp8Combinations) {
  Json j = quark_json("w_fp8_tensor_a_fp8_static");
  EXPECT_EQ(resolve_global(j).scheme->name, "w_fp8_tensor_a_fp8_static");
  global(j)["input_tensors"]["is_dynamic"] = true;
  EXPECT_EQ(resolve_global(j).scheme->name, "w_fp8_tensor_a_fp8_dyn_tensor");
  j = quark_json("w_fp8_channel_a_fp8_dyn_token");
  EXPECT_EQ(resolve_global(j).scheme->name, "w_fp8_channel_a_fp8_dyn_token");
  // per-channel weights with static per-channel input.
  global(j)["input_tensors"]["is_dynamic"] = false;
  std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "require either per tensor or channelwise, dynamic per token")) << msg;
  EXPECT_TRUE(contains_ci(msg, "input_tensors.is_dynamic")) << msg;
  // mixed per_tensor weight + per-token input.
  j = quark_json("w_fp8_channel_a_fp8_dyn_token");
  global(j)["weight"]["qscheme"] = "per_tensor";
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "only per-tensor and per-channel scales")) << msg;
  EXPECT_TRUE(contains_ci(msg, "per_tensor, per_channel")) << msg;
  // per_channel weight + static per_tensor input.
  j = quark_json("w_fp8_channel_a_fp8_dyn_token");
  global(j)["input_tensors"]["qscheme"] = "per_tensor";
  global(j)["input_tensors"]["is_dynamic"] = false;
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "only per-tensor and per-channel scales")) << msg;
  // block-wise FP8 (dense [newer]) is not an MoE scheme.
  j = quark_json("w_fp8_tensor_a_fp8_static");
  global(j)["weight"]["qscheme"] = "per_block";
  EXPECT_TRUE(contains_ci(resolve_error(j), "per_block"));
  // dynamic weights
  j = quark_json("w_fp8_tensor_a_fp8_static");
  global(j)["weight"]["is_dynamic"] = true;
  EXPECT_TRUE(contains_ci(resolve_error(j), "weight.is_dynamic"));
}

TEST(SchemeResolve, Int8Combinations) {
  EXPECT_EQ(resolve_global(quark_json("w_int8_tensor_a_int8_static")).scheme->name, "w_int8_tensor_a_int8_static");
  Json j = quark_json("w_int8_tensor_a_int8_static");
  global(j)["input_tensors"]["symmetric"] = false;  // asymmetric static input: zero points checked at load (§16.4)
  EXPECT_EQ(resolve_global(j).scheme->name, "w_int8_tensor_a_int8_static");
  j = quark_json("w_int8_channel_a_int8_dyn_token");
  global(j)["weight"]["qscheme"] = "per_tensor";
  global(j)["weight"]["ch_axis"] = nullptr;
  EXPECT_EQ(resolve_global(j).scheme->name, "w_int8_tensor_a_int8_dyn_token");
  // weights must be symmetric
  for (const Json& sym : {Json(false), Json(nullptr)}) {
    j = quark_json("w_int8_channel_a_int8_static");
    global(j)["weight"]["symmetric"] = sym;
    const std::string msg = resolve_error(j);
    EXPECT_TRUE(contains_ci(msg, "weight.symmetric")) << msg;
  }
  // dynamic per-tensor int8 activations: no such qmoe scheme
  j = quark_json("w_int8_tensor_a_int8_static");
  global(j)["input_tensors"]["is_dynamic"] = true;
  EXPECT_TRUE(contains_ci(resolve_error(j), "Unsupported FusedMoe scheme"));
  // static per-channel activations
  j = quark_json("w_int8_channel_a_int8_dyn_token");
  global(j)["input_tensors"]["is_dynamic"] = false;
  EXPECT_TRUE(contains_ci(resolve_error(j), "Unsupported FusedMoe scheme"));
  // asymmetric dynamic activations
  j = quark_json("w_int8_channel_a_int8_dyn_token");
  global(j)["input_tensors"]["symmetric"] = false;
  EXPECT_TRUE(contains_ci(resolve_error(j), "asymmetric"));
  // int8 weights with fp8 input
  j = quark_json("w_int8_channel_a_int8_static");
  global(j)["input_tensors"]["dtype"] = "fp8_e4m3";
  EXPECT_TRUE(contains_ci(resolve_error(j), "Unsupported FusedMoe scheme"));
}

TEST(SchemeResolve, OcpMxWeightChecks) {
  Json j = quark_json("w_mxfp4");
  global(j)["weight"]["qscheme"] = "per_channel";
  std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "only per-group scales")) << msg;
  EXPECT_TRUE(contains_ci(msg, "weight.qscheme")) << msg;

  j = quark_json("w_mxfp4");
  global(j)["weight"]["group_size"] = 16;
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "weight.group_size")) << msg;
  EXPECT_TRUE(contains_ci(msg, "NVFP4")) << msg;  // hint: NVFP4 is a two-element list

  j = quark_json("w_mxfp6_e3m2");
  global(j)["weight"]["scale_format"] = "float32";
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "weight.scale_format")) << msg;
  EXPECT_TRUE(contains_ci(msg, "e8m0")) << msg;
}

TEST(SchemeResolve, OcpMxUnsupportedCombination) {
  const std::pair<const char*, const char*> bad[] = {
      {"fp6_e3m2", "fp4"}, {"fp6_e3m2", "fp6_e2m3"}, {"fp6_e2m3", "fp4"}, {"fp6_e2m3", "fp6_e3m2"}};
  for (const auto& [w, a] : bad) {
    Json j = quark_json("w_mxfp4_a_mxfp4");
    global(j)["weight"]["dtype"] = w;
    global(j)["input_tensors"]["dtype"] = a;
    const std::string msg = resolve_error(j);
    EXPECT_TRUE(contains_ci(msg, "Unsupported OCP MX dtype combination")) << msg;
    EXPECT_TRUE(contains_ci(msg, std::string("mx") + w)) << msg;
  }
}

TEST(SchemeResolve, OcpMxActivationChecks) {
  // MX activations must be dynamic.
  Json j = quark_json("w_mxfp4_a_mxfp6_e2m3");
  global(j)["input_tensors"]["is_dynamic"] = false;
  std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "static")) << msg;
  EXPECT_TRUE(contains_ci(msg, "dynamic")) << msg;
  EXPECT_TRUE(contains_ci(msg, "input_tensors.is_dynamic")) << msg;
  // FP8 activations with MX weights must be static per-tensor.
  j = quark_json("w_mxfp4_a_fp8");
  global(j)["input_tensors"]["is_dynamic"] = true;
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "dynamic FP8")) << msg;
  j = quark_json("w_mxfp4_a_fp8");
  global(j)["input_tensors"]["qscheme"] = "per_channel";
  EXPECT_TRUE(contains_ci(resolve_error(j), "input_tensors.qscheme"));
  // Input dtypes outside {fp4, fp6_*, fp8_e4m3}.
  j = quark_json("w_mxfp4_a_fp8");
  global(j)["input_tensors"]["dtype"] = "int8";
  msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "not compatible with OCP MX")) << msg;
  // MX activation group size / scale format.
  j = quark_json("w_mxfp4_a_mxfp4");
  global(j)["input_tensors"]["group_size"] = 16;
  EXPECT_TRUE(contains_ci(resolve_error(j), "input_tensors.group_size"));
  j = quark_json("w_mxfp4_a_mxfp4");
  global(j)["input_tensors"]["scale_format"] = nullptr;
  EXPECT_TRUE(contains_ci(resolve_error(j), "input_tensors.scale_format"));
  // qmoe supports MXFP6 weights with static FP8 activations (registry rows).
  EXPECT_EQ(resolve_global(quark_json("w_mxfp6_e2m3_a_fp8")).scheme->name, "w_mxfp6_e2m3_a_fp8");
  EXPECT_EQ(resolve_global(quark_json("w_mxfp6_e3m2_a_fp8")).scheme->name, "w_mxfp6_e3m2_a_fp8");
}

TEST(SchemeResolve, OcpMxScaleCalculationModes) {
  Json j = quark_json("w_mxfp4_a_mxfp4");
  LayerScheme ls = resolve_global(j);
  EXPECT_EQ(ls.weight_scale_mode, MxScaleMode::Even);
  EXPECT_EQ(ls.act_scale_mode, MxScaleMode::Even);
  global(j)["weight"]["scale_calculation_mode"] = "floor";
  global(j)["input_tensors"]["scale_calculation_mode"] = "ceil";
  ls = resolve_global(j);
  EXPECT_EQ(ls.weight_scale_mode, MxScaleMode::Floor);
  EXPECT_EQ(ls.act_scale_mode, MxScaleMode::Ceil);
  global(j)["weight"]["scale_calculation_mode"] = nullptr;  // null = even for e8m0
  EXPECT_EQ(resolve_global(j).weight_scale_mode, MxScaleMode::Even);
  global(j)["input_tensors"]["scale_calculation_mode"] = "round_up";
  const std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "input_tensors.scale_calculation_mode")) << msg;
  EXPECT_TRUE(contains_ci(msg, "round_up")) << msg;
}

TEST(SchemeResolve, LegacyMxDtypeIsUnsupported) {
  Json j = quark_json("w_mxfp4");
  global(j)["weight"]["dtype"] = "mx";
  global(j)["weight"]["mx_element_dtype"] = "fp4";
  const std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "legacy")) << msg;
  EXPECT_TRUE(contains_ci(msg, "weight.dtype")) << msg;
}

TEST(SchemeResolve, W4A8IsRocmOnly) {
  Json j = quark_json("w_fp8_tensor_a_fp8_static");
  Json int4 = quark_json("w_int8_channel_a_int8_static")["global_quant_config"]["weight"];
  int4["dtype"] = "int4";
  global(j)["weight"] = Json::array({global(j)["weight"], int4});
  global(j)["input_tensors"]["is_dynamic"] = true;
  const std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "W4A8")) << msg;
  EXPECT_TRUE(contains_ci(msg, "AITER")) << msg;
}

TEST(SchemeResolve, Nvfp4NeedsBothTwoLevelLists) {
  Json j = quark_json("nvfp4");
  global(j)["input_tensors"] = nullptr;
  std::string msg = resolve_error(j);
  EXPECT_TRUE(contains_ci(msg, "NVFP4")) << msg;
  EXPECT_TRUE(contains_ci(msg, "Unsupported FusedMoe scheme")) << msg;
  j = quark_json("nvfp4");
  global(j)["input_tensors"][0]["is_dynamic"] = false;
  EXPECT_TRUE(contains_ci(resolve_error(j), "input_tensors must be"));
  j = quark_json("nvfp4");
  global(j)["weight"][0]["group_size"] = 32;
  EXPECT_TRUE(contains_ci(resolve_error(j), "list-valued weight"));
  // A one-element list is the same as the dict.
  j = quark_json("w_mxfp4_a_mxfp4");
  global(j)["weight"] = Json::array({global(j)["weight"]});
  global(j)["input_tensors"] = Json::array({global(j)["input_tensors"]});
  EXPECT_EQ(resolve_global(j).scheme->name, "w_mxfp4_a_mxfp4");
}

TEST(SchemeResolve, KeepsMatchedConfigAndPrefix) {
  const LayerScheme ls = resolve_global(quark_json("w_mxfp6_e3m2_a_mxfp6_e3m2"), "model.layers.9.mlp.experts");
  EXPECT_EQ(ls.prefix, "model.layers.9.mlp.experts");
  ASSERT_EQ(ls.config.weight.size(), 1u);
  EXPECT_EQ(ls.config.weight[0].dtype, "fp6_e3m2");
  EXPECT_FALSE(ls.excluded);
  EXPECT_EQ(ls.scheme->method, Method::OcpMx);
}

}  // namespace
}  // namespace qmoe::test
