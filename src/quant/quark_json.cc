// The quantization_config a Quark export of one registry scheme carries (checkpoint-format.md §2:
// Quark 0.13 key set, tensor specs as QTensorConfig.to_dict() writes them).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qmoe/config.h"
#include "qmoe/error.h"

namespace qmoe {

namespace {

using Json = nlohmann::json;  // std::map keys: sorted, like transformers' json.dumps(sort_keys=True)

constexpr int64_t kMaxInputNumel = 4194304;

// A QTensorConfig with every key; callers set what differs from a non-MX per-tensor spec.
Json tensor_spec(std::string_view dtype, std::string_view qscheme, bool dynamic) {
  return Json{{"block_size", nullptr},
              {"ch_axis", nullptr},
              {"dtype", dtype},
              {"enable_buffer_reuse", false},
              {"group_size", nullptr},
              {"is_dynamic", dynamic},
              {"is_scale_quant", false},
              {"max_input_numel", kMaxInputNumel},
              {"mx_element_dtype", nullptr},
              {"observer_cls", "PerTensorMinMaxObserver"},
              {"qscheme", qscheme},
              {"round_method", "half_even"},
              {"scale_calculation_mode", nullptr},
              {"scale_format", nullptr},
              {"scale_type", "float"},
              {"symmetric", true}};
}

Json per_channel_spec(std::string_view dtype, int ch_axis, bool dynamic) {
  Json s = tensor_spec(dtype, "per_channel", dynamic);
  s["ch_axis"] = ch_axis;
  s["observer_cls"] = "PerChannelMinMaxObserver";
  return s;
}

// OCP MX (Quark OCP_MXFP4Spec / MXFP6 specs): per_group 32, e8m0 scales, "even" rule.
Json mx_spec(std::string_view dtype, bool dynamic) {
  Json s = tensor_spec(dtype, "per_group", dynamic);
  s["ch_axis"] = -1;
  s["group_size"] = 32;
  s["observer_cls"] = "PerBlockMXObserver";
  s["scale_calculation_mode"] = "even";
  s["scale_format"] = "e8m0";
  s["symmetric"] = nullptr;
  return s;
}

// NVFP4 (Quark ScaleQuantSpec): [fp4 per_group 16 with fp32 scales, fp8_e4m3 per-tensor on that scale].
Json nvfp4_spec(bool dynamic) {
  Json s0 = tensor_spec("fp4", "per_group", dynamic);
  s0["ch_axis"] = -1;
  s0["group_size"] = 16;
  s0["observer_cls"] = "PerBlockMXObserver";
  s0["scale_format"] = "float32";
  s0["scale_type"] = "float32";
  s0["symmetric"] = nullptr;
  Json s1 = tensor_spec("fp8_e4m3", "per_tensor", false);
  s1["is_scale_quant"] = true;
  s1["scale_type"] = "float32";
  return Json::array({s0, s1});
}

std::string_view mx_dtype(WeightFormat f) {
  switch (f) {
    case WeightFormat::Mxfp4: return "fp4";
    case WeightFormat::Mxfp6E2M3: return "fp6_e2m3";
    case WeightFormat::Mxfp6E3M2: return "fp6_e3m2";
    default: return "";
  }
}

Json weight_spec(const SchemeInfo& s) {
  switch (s.weight) {
    case WeightFormat::BF16: return nullptr;
    case WeightFormat::Fp8E4M3:
    case WeightFormat::Int8: {
      const std::string_view dt = s.weight == WeightFormat::Int8 ? "int8" : "fp8_e4m3";
      if (s.weight_scale == WeightScale::PerChannel) return per_channel_spec(dt, 0, false);
      return tensor_spec(dt, "per_tensor", false);
    }
    case WeightFormat::Mxfp4:
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: return mx_spec(mx_dtype(s.weight), false);
    case WeightFormat::Nvfp4: return nvfp4_spec(false);
  }
  throw Error(fmt::format("quark_quantization_config_json: scheme {} has an unknown weight format", s.name));
}

Json input_spec(const SchemeInfo& s) {
  switch (s.act) {
    case ActQuant::None: return nullptr;
    case ActQuant::Fp8Static: return tensor_spec("fp8_e4m3", "per_tensor", false);
    case ActQuant::Fp8DynTensor: return tensor_spec("fp8_e4m3", "per_tensor", true);
    case ActQuant::Fp8DynToken: return per_channel_spec("fp8_e4m3", 1, true);
    case ActQuant::Int8Static: return tensor_spec("int8", "per_tensor", false);
    case ActQuant::Int8DynToken: return per_channel_spec("int8", -1, true);
    case ActQuant::Mxfp4: return mx_spec("fp4", true);
    case ActQuant::Mxfp6E2M3: return mx_spec("fp6_e2m3", true);
    case ActQuant::Mxfp6E3M2: return mx_spec("fp6_e3m2", true);
    case ActQuant::Nvfp4: return nvfp4_spec(true);
  }
  throw Error(fmt::format("quark_quantization_config_json: scheme {} has an unknown activation quantization", s.name));
}

}  // namespace

std::string quark_quantization_config_json(const SchemeInfo& s, const std::vector<std::string>& exclude) {
  Json global = {{"bias", nullptr},
                 {"input_tensors", input_spec(s)},
                 {"output_tensors", nullptr},
                 {"target_device", nullptr},
                 {"weight", weight_spec(s)}};
  Json q = {{"algo_config", nullptr},
            {"exclude", exclude},
            {"export",
             {{"kv_cache_group", Json::array()},
              {"min_kv_scale", 0.0},
              {"pack_method", "reorder"},
              {"weight_format", "real_quantized"},
              {"weight_merge_groups", nullptr}}},
            {"global_quant_config", global},
            {"kv_cache_post_rope", false},
            {"kv_cache_quant_config", Json::object()},
            {"layer_quant_config", Json::object()},
            {"layer_type_quant_config", Json::object()},
            {"quant_method", "quark"},
            {"quant_mode", "eager_mode"},
            {"softmax_quant_spec", nullptr},
            {"version", "0.13+unknown"}};
  return q.dump(2);
}

}  // namespace qmoe
