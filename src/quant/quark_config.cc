// QuarkConfig::parse: the `quantization_config` object of a Quark export (spec quark-moe.md §2,
// §3.1; checkpoint-format.md §2). Parsing checks structure and types only; whether a layer's
// config is a supported MoE scheme is decided at resolution (scheme_resolve.cc).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/error.h"
#include "quant/json_fields.h"
#include "util/json.h"

namespace qmoe {

namespace {

using detail::Json;
using detail::field_path;
using detail::json_type_name;

QTensorSpec parse_tensor_spec(const Json& v, const std::string& path, std::string_view where) {
  if (!v.is_object())
    throw Error(fmt::format("{}: field '{}' must be a QTensorConfig object, got {} {}", where, path,
                            json_type_name(v), util::json_brief(v)));
  QTensorSpec s;
  s.dtype = detail::opt_string(v, "dtype", path, where).value_or("");
  if (s.dtype.empty())
    throw Error(fmt::format("{}: field '{}' is missing (every QTensorConfig needs a dtype)", where,
                            field_path(path, "dtype")));
  s.qscheme = detail::opt_string(v, "qscheme", path, where).value_or("");
  // `is_dynamic`; legacy exports (quark < 1.0) spell it `dynamic`.
  if (auto d = detail::opt_bool(v, "is_dynamic", path, where)) {
    s.is_dynamic = *d;
  } else {
    s.is_dynamic = detail::opt_bool(v, "dynamic", path, where).value_or(false);
  }
  s.symmetric = detail::opt_bool(v, "symmetric", path, where);
  auto to_int = [&](std::string_view key) -> std::optional<int> {
    auto x = detail::opt_int(v, key, path, where);
    if (!x) return std::nullopt;
    if (*x < -1000000 || *x > 1000000000)
      throw Error(fmt::format("{}: field '{}' = {} is out of range", where, field_path(path, key), *x));
    return static_cast<int>(*x);
  };
  s.ch_axis = to_int("ch_axis");
  if (!s.ch_axis) s.ch_axis = to_int("axis");  // legacy spelling
  s.group_size = to_int("group_size");
  s.scale_format = detail::opt_string(v, "scale_format", path, where).value_or("");
  s.scale_calculation_mode = detail::opt_string(v, "scale_calculation_mode", path, where).value_or("");
  s.scale_type = detail::opt_string(v, "scale_type", path, where).value_or("");
  s.round_method = detail::opt_string(v, "round_method", path, where).value_or("");
  s.is_scale_quant = detail::opt_bool(v, "is_scale_quant", path, where).value_or(false);
  return s;
}

// A QSpec, a list of QSpecs, or null.
void parse_tensor_field(const Json& lc, std::string_view key, const std::string& path, std::string_view where,
                        std::vector<QTensorSpec>& specs, bool& is_list) {
  specs.clear();
  is_list = false;
  auto it = lc.find(std::string(key));
  if (it == lc.end() || it->is_null()) return;
  const std::string fpath = field_path(path, key);
  if (it->is_array()) {
    is_list = true;
    for (size_t i = 0; i < it->size(); ++i)
      specs.push_back(parse_tensor_spec((*it)[i], fmt::format("{}[{}]", fpath, i), where));
    return;
  }
  specs.push_back(parse_tensor_spec(*it, fpath, where));
}

QLayerConfig parse_layer_config(const Json& v, const std::string& path, std::string_view where) {
  QLayerConfig lc;
  if (v.is_null()) return lc;  // a null layer config quantizes nothing
  if (!v.is_object())
    throw Error(fmt::format("{}: field '{}' must be a QLayerConfig object, got {}", where, path,
                            json_type_name(v)));
  parse_tensor_field(v, "weight", path, where, lc.weight, lc.weight_is_list);
  parse_tensor_field(v, "input_tensors", path, where, lc.input_tensors, lc.input_is_list);
  if (auto it = v.find("output_tensors"); it != v.end()) lc.has_output_tensors = detail::json_truthy(*it);
  if (auto it = v.find("bias"); it != v.end()) lc.has_bias = detail::json_truthy(*it);
  return lc;
}

std::vector<std::string> parse_string_list(const Json& obj, std::string_view key, const std::string& path,
                                           std::string_view where) {
  std::vector<std::string> out;
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return out;
  const std::string fpath = field_path(path, key);
  if (!it->is_array())
    throw Error(fmt::format("{}: field '{}' must be a list of strings, got {}", where, fpath, json_type_name(*it)));
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& e = (*it)[i];
    if (!e.is_string())
      throw Error(fmt::format("{}: field '{}[{}]' must be a string, got {} {}", where, fpath, i,
                              json_type_name(e), util::json_brief(e)));
    out.push_back(e.get<std::string>());
  }
  return out;
}

// Compile every `re:` pattern now so that a bad regex is reported with its field.
void check_pattern(const std::string& pattern, const std::string& field, std::string_view where) {
  try {
    (void)quark_pattern_matches(pattern, "");
  } catch (const Error& e) {
    throw Error(fmt::format("{}: field '{}': {}", where, field, e.what()));
  }
}

// KV-cache groups (spec §3.1 step 3): every group must have layer configs; their output_tensors
// (the KV-cache spec) must agree and be set. qmoe runs no attention, so the KV spec is only
// validated structurally and then cleared from those entries (and from "*q_proj"), so that it is
// not mistaken for output quantization.
void apply_kv_cache_groups(QuarkConfig& q, const Json& lqc_json, std::string_view where) {
  if (q.kv_cache_group.empty()) return;
  std::vector<size_t> members;
  for (const std::string& group : q.kv_cache_group) {
    bool found = false;
    for (size_t i = 0; i < q.layer_quant_config.size(); ++i) {
      const std::string& key = q.layer_quant_config[i].first;
      if (key == group || quark_pattern_matches(group, key)) {
        found = true;
        members.push_back(i);
      }
    }
    if (!found)
      throw Error(fmt::format("{}: export.kv_cache_group has '{}' but no kv_cache quantization settings in "
                              "layer_quant_config match it",
                              where, group));
  }
  const Json* kv_spec = nullptr;
  std::string kv_key;
  for (size_t i : members) {
    const std::string& key = q.layer_quant_config[i].first;
    const Json& entry = lqc_json.at(key);
    const Json out = entry.is_object() && entry.contains("output_tensors") ? entry.at("output_tensors") : Json();
    if (out.is_null())
      throw Error(fmt::format("{}: layer_quant_config['{}'] is in export.kv_cache_group but its output_tensors "
                              "(the kv-cache spec) is null",
                              where, key));
    if (!kv_spec) {
      kv_spec = &entry.at("output_tensors");
      kv_key = key;
    } else if (*kv_spec != out) {
      throw Error(fmt::format("{}: the kv-cache specs (output_tensors) of layer_quant_config['{}'] and ['{}'] differ; "
                              "all kv_cache_group layers must use the same one",
                              where, kv_key, key));
    }
  }
  for (size_t i : members) q.layer_quant_config[i].second.has_output_tensors = false;
  for (auto& [key, lc] : q.layer_quant_config)
    if (key == "*q_proj") lc.has_output_tensors = false;
}

}  // namespace

QuarkConfig QuarkConfig::parse(std::string_view json_text, std::string_view where) {
  const Json j = detail::parse_json(json_text, where);
  if (!j.is_object())
    throw Error(fmt::format("{}: quantization_config must be a JSON object, got {}", where, json_type_name(j)));
  QuarkConfig q;

  const auto method = detail::opt_string(j, "quant_method", "", where);
  if (!method)
    throw Error(fmt::format("{}: quantization_config.quant_method is missing; qmoe loads Quark checkpoints "
                            "(quant_method \"quark\")",
                            where));
  if (*method != "quark")
    throw Error(fmt::format("{}: quantization_config.quant_method is \"{}\"; qmoe only loads AMD Quark "
                            "checkpoints (quant_method \"quark\")",
                            where, *method));

  // export (required, spec §3.1 step 1).
  auto ex = j.find("export");
  if (ex == j.end() || ex->is_null())
    throw Error(fmt::format("{}: quantization_config has no 'export' key; the export key should be included in "
                            "a Quark export (it carries kv_cache_group, pack_method and weight_format)",
                            where));
  if (!ex->is_object())
    throw Error(fmt::format("{}: field 'export' must be an object, got {}", where, json_type_name(*ex)));
  q.kv_cache_group = parse_string_list(*ex, "kv_cache_group", "export", where);
  q.pack_method = detail::opt_string(*ex, "pack_method", "export", where)
                      .value_or(detail::opt_string(j, "pack_method", "", where).value_or(""));
  if (!q.pack_method.empty() && q.pack_method != "reorder" && q.pack_method != "order")
    throw Error(fmt::format("{}: field 'export.pack_method' is \"{}\"; expected \"reorder\" or \"order\"", where,
                            q.pack_method));
  q.weight_format = detail::opt_string(*ex, "weight_format", "export", where).value_or("");
  if (q.weight_format == "fake_quantized")
    throw Error(fmt::format("{}: field 'export.weight_format' is \"fake_quantized\" (dequantized float weights); "
                            "qmoe loads real_quantized Quark exports only",
                            where));
  if (!q.weight_format.empty() && q.weight_format != "real_quantized")
    throw Error(fmt::format("{}: field 'export.weight_format' is \"{}\"; expected \"real_quantized\"", where,
                            q.weight_format));
  if (auto mode = detail::opt_string(*ex, "custom_mode", "export", where); mode && *mode != "quark")
    throw Error(fmt::format("{}: field 'export.custom_mode' is \"{}\"; only Quark-format exports "
                            "(custom_mode \"quark\") are supported",
                            where, *mode));

  q.version = detail::opt_string(j, "version", "", where).value_or("");

  if (auto g = j.find("global_quant_config"); g != j.end() && !g->is_null()) {
    q.global_quant_config = parse_layer_config(*g, "global_quant_config", where);
    q.has_global = true;
  }

  Json lqc_json = Json::object();
  if (auto l = j.find("layer_quant_config"); l != j.end() && !l->is_null()) {
    if (!l->is_object())
      throw Error(fmt::format("{}: field 'layer_quant_config' must be an object {{pattern: QLayerConfig}}, got {}",
                              where, json_type_name(*l)));
    lqc_json = *l;
    for (const auto& [key, val] : l->items()) {
      const std::string path = fmt::format("layer_quant_config['{}']", key);
      check_pattern(key, path, where);
      q.layer_quant_config.emplace_back(key, parse_layer_config(val, path, where));
    }
  }

  if (auto t = j.find("layer_type_quant_config"); t != j.end() && !t->is_null()) {
    if (!t->is_object())
      throw Error(fmt::format("{}: field 'layer_type_quant_config' must be an object {{type: QLayerConfig}}, got {}",
                              where, json_type_name(*t)));
    for (const auto& [key, val] : t->items())
      q.layer_type_quant_config[key] =
          parse_layer_config(val, fmt::format("layer_type_quant_config['{}']", key), where);
  }

  q.exclude = parse_string_list(j, "exclude", "", where);
  for (size_t i = 0; i < q.exclude.size(); ++i) check_pattern(q.exclude[i], fmt::format("exclude[{}]", i), where);

  apply_kv_cache_groups(q, lqc_json, where);
  return q;
}

}  // namespace qmoe
