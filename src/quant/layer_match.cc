// Which Quark config applies to an MoE layer's experts (spec quark-moe.md §3.2–3.3 with the
// qmoe decisions of §16.3): exclusion first (all-or-nothing), then layer_quant_config in file
// order, layer_type_quant_config["Linear"], global_quant_config.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/error.h"

namespace qmoe {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The module whose scheme is resolved: its prefix and the names of all its linears.
struct Module {
  std::string prefix;                // "model.layers.3.mlp.experts" / "model.layers.3.mlp.shared_expert"
  std::vector<std::string> linears;  // "model.layers.3.mlp.experts.0.gate_proj", ...
};

// Why an exclude entry excludes the module, or "" when it does not.
std::string exclusion_reason(const std::string& pattern, const Module& m) {
  if (quark_pattern_matches(pattern, m.prefix)) return fmt::format("exclude '{}' matches '{}'", pattern, m.prefix);
  if (!starts_with(pattern, "re:")) {
    // vLLM's check_children: an entry naming the module or anything inside it.
    if (starts_with(pattern, m.prefix + ".")) return fmt::format("exclude '{}' names a part of '{}'", pattern, m.prefix);
    // An exact entry naming an enclosing module (Quark expands `X` to `X.*`).
    if (pattern.find_first_of("*?[") == std::string::npos && starts_with(m.prefix, pattern + "."))
      return fmt::format("exclude '{}' names a module enclosing '{}'", pattern, m.prefix);
  }
  for (const std::string& n : m.linears)
    if (quark_pattern_matches(pattern, n)) return fmt::format("exclude '{}' matches '{}'", pattern, n);
  return {};
}

bool same_spec(const QTensorSpec& a, const QTensorSpec& b) {
  return a.dtype == b.dtype && a.qscheme == b.qscheme && a.is_dynamic == b.is_dynamic && a.symmetric == b.symmetric &&
         a.ch_axis == b.ch_axis && a.group_size == b.group_size && a.scale_format == b.scale_format &&
         a.scale_calculation_mode == b.scale_calculation_mode && a.scale_type == b.scale_type &&
         a.round_method == b.round_method && a.is_scale_quant == b.is_scale_quant;
}
bool same_specs(const std::vector<QTensorSpec>& a, const std::vector<QTensorSpec>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), same_spec);
}
bool same_layer_config(const QLayerConfig& a, const QLayerConfig& b) {
  return same_specs(a.weight, b.weight) && a.weight_is_list == b.weight_is_list &&
         same_specs(a.input_tensors, b.input_tensors) && a.input_is_list == b.input_is_list &&
         a.has_output_tensors == b.has_output_tensors && a.has_bias == b.has_bias;
}

struct Match {
  const QLayerConfig* config = nullptr;  // nullptr: no config applies (not quantized)
  std::string source;
};

// The config of one linear: the first layer_quant_config pattern matching the module prefix or
// the linear's name, then layer_type_quant_config["Linear"], then global_quant_config.
Match match_linear(const QuarkConfig& q, const std::vector<bool>& prefix_hits, const std::string& linear) {
  for (size_t i = 0; i < q.layer_quant_config.size(); ++i) {
    const auto& [pattern, lc] = q.layer_quant_config[i];
    if (prefix_hits[i] || quark_pattern_matches(pattern, linear))
      return {&lc, fmt::format("layer_quant_config '{}'", pattern)};
  }
  if (auto it = q.layer_type_quant_config.find("Linear"); it != q.layer_type_quant_config.end())
    return {&it->second, "layer_type_quant_config 'Linear'"};
  if (q.has_global) return {&q.global_quant_config, "global_quant_config"};
  return {nullptr, "no global_quant_config and no layer config matches"};
}

LayerScheme resolve_module(const ModelConfig& cfg, const Module& m) {
  LayerScheme ls;
  ls.prefix = m.prefix;
  ls.scheme = &scheme_by_name("unquantized");
  if (!cfg.quant) {
    ls.reason = "no quantization_config (unquantized checkpoint)";
    return ls;
  }
  const QuarkConfig& q = *cfg.quant;
  for (const std::string& pattern : q.exclude) {
    std::string why = exclusion_reason(pattern, m);
    if (!why.empty()) {
      ls.excluded = true;
      ls.reason = std::move(why);
      return ls;
    }
  }
  std::vector<bool> prefix_hits;
  for (const auto& entry : q.layer_quant_config) prefix_hits.push_back(quark_pattern_matches(entry.first, m.prefix));

  // MoE is all-or-nothing: every linear of the module must resolve to the same config.
  Match first = match_linear(q, prefix_hits, m.linears.front());
  for (size_t i = 1; i < m.linears.size(); ++i) {
    Match other = match_linear(q, prefix_hits, m.linears[i]);
    if (other.config == first.config) continue;
    const bool equal = other.config && first.config && same_layer_config(*other.config, *first.config);
    if (!equal)
      throw Error(fmt::format("{}: the expert linears of one MoE module resolve to different quantization "
                              "configurations ('{}' uses {}, '{}' uses {}); qmoe requires all of them to use the "
                              "same scheme",
                              m.prefix, m.linears.front(), first.source, m.linears[i], other.source));
  }
  if (!first.config) {
    ls.reason = first.source;
    return ls;
  }
  try {
    ls = resolve_scheme_from_layer_config(*first.config, m.prefix);
  } catch (const Error& e) {
    throw Error(fmt::format("{} [config from {}]", e.what(), first.source));
  }
  ls.reason = first.source;
  return ls;
}

void check_moe_layer(const ModelConfig& cfg, int layer) {
  if (std::find(cfg.moe_layers.begin(), cfg.moe_layers.end(), layer) == cfg.moe_layers.end())
    throw Error(fmt::format("model.layers.{}: not an MoE layer of this {} model ({} layers; MoE layers: {} of them, "
                            "first {}, last {})",
                            layer, cfg.model_type, cfg.num_layers, cfg.moe_layers.size(),
                            cfg.moe_layers.empty() ? -1 : cfg.moe_layers.front(),
                            cfg.moe_layers.empty() ? -1 : cfg.moe_layers.back()));
}

}  // namespace

LayerScheme resolve_moe_scheme(const ModelConfig& cfg, int layer) {
  check_moe_layer(cfg, layer);
  Module m;
  m.prefix = cfg.experts_prefix(layer);
  const std::vector<std::string> projs = cfg.projection_names();
  m.linears.reserve(static_cast<size_t>(cfg.num_experts) * projs.size());
  for (int e = 0; e < cfg.num_experts; ++e)
    for (const std::string& p : projs)
      if (!p.empty()) m.linears.push_back(fmt::format("{}.{}.{}", m.prefix, e, p));
  if (m.linears.empty())
    throw Error(fmt::format("{}: the model has no experts (num_experts = {})", m.prefix, cfg.num_experts));
  return resolve_module(cfg, m);
}

LayerScheme resolve_shared_expert_scheme(const ModelConfig& cfg, int layer) {
  check_moe_layer(cfg, layer);
  Module m;
  m.prefix = cfg.shared_expert_prefix(layer);
  if (m.prefix.empty())
    throw Error(fmt::format("{}: this {} model has no shared expert", cfg.moe_prefix(layer), cfg.model_type));
  for (const char* p : {"gate_proj", "up_proj", "down_proj"}) m.linears.push_back(fmt::format("{}.{}", m.prefix, p));
  return resolve_module(cfg, m);
}

}  // namespace qmoe
