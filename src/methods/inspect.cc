// The inspection report (include/qmoe/inspect.h), shared by `qmoe inspect` and the Python module.
#include "qmoe/inspect.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/params.h"
#include "qmoe/safetensors.h"

namespace qmoe {

namespace {

using Json = nlohmann::ordered_json;

std::string_view naming_name(ExpertNaming n) {
  switch (n) {
    case ExpertNaming::Mixtral: return "mixtral (experts.E.{w1,w3,w2})";
    case ExpertNaming::GateUpDown: return "gate_up_down (experts.E.{gate,up,down}_proj)";
    case ExpertNaming::GptOss: return "gpt_oss (experts.E.{gate_up_proj (interleaved), down_proj})";
  }
  return "?";
}

Json routing_json(const RoutingConfig& r) {
  return Json{{"scoring", r.scoring == ScoringFunc::Softmax ? "softmax" : "sigmoid"},
              {"renormalize", r.renormalize},
              {"topk_then_softmax", r.topk_then_softmax},
              {"n_group", r.n_group},
              {"topk_group", r.topk_group},
              {"correction_bias", r.has_correction_bias},
              {"routed_scaling_factor", r.routed_scaling_factor},
              {"apply_router_weight_on_input", r.apply_router_weight_on_input}};
}

std::string routing_text(const RoutingConfig& r) {
  std::string s = r.topk_then_softmax ? "top-k of logits, then softmax over the k"
                                      : fmt::format("{} then top-k", r.scoring == ScoringFunc::Softmax ? "softmax" : "sigmoid");
  if (r.n_group > 1) s += fmt::format(", grouped (n_group {}, topk_group {})", r.n_group, r.topk_group);
  if (r.has_correction_bias) s += ", e_score_correction_bias";
  if (!r.topk_then_softmax) s += r.renormalize ? ", renormalized" : ", not renormalized";
  if (r.routed_scaling_factor != 1.0f) s += fmt::format(", scaling {}", r.routed_scaling_factor);
  if (r.apply_router_weight_on_input) s += ", router weight on input";
  return s;
}

// Name, shape, dtype, bytes of every defined parameter.
Json param_table(const ExpertParams& p, int64_t& total_bytes) {
  const std::pair<const char*, const Tensor*> fields[] = {
      {"w13_weight", &p.w13_weight},
      {"w2_weight", &p.w2_weight},
      {"w13_weight_scale", &p.w13_weight_scale},
      {"w2_weight_scale", &p.w2_weight_scale},
      {"w13_weight_scale_2", &p.w13_weight_scale_2},
      {"w2_weight_scale_2", &p.w2_weight_scale_2},
      {"w13_input_scale", &p.w13_input_scale},
      {"w2_input_scale", &p.w2_input_scale},
      {"w13_weight_zero_point", &p.w13_weight_zero_point},
      {"w2_weight_zero_point", &p.w2_weight_zero_point},
      {"w13_input_zero_point", &p.w13_input_zero_point},
      {"w2_input_zero_point", &p.w2_input_zero_point},
      {"w13_bias", &p.w13_bias},
      {"w2_bias", &p.w2_bias},
  };
  Json rows = Json::array();
  total_bytes = 0;
  for (const auto& [name, t] : fields) {
    if (!t->defined()) continue;
    rows.push_back(Json{{"name", name},
                        {"shape", t->shape()},
                        {"dtype", std::string(dtype_name(t->dtype()))},
                        {"bytes", t->nbytes()}});
    total_bytes += static_cast<int64_t>(t->nbytes());
  }
  return rows;
}

Json experts_json(const ExpertParams& p, const LayerScheme& ls) {
  const SchemeInfo& s = *p.scheme;
  int64_t total = 0;
  Json params = param_table(p, total);
  const double weights = static_cast<double>(p.num_local) * 3.0 * p.hidden * p.inter;
  Json j{{"prefix", p.prefix},
         {"scheme", std::string(s.name)},
         {"method", std::string(to_string(s.method))},
         {"weights", std::string(to_string(s.weight))},
         {"weight_scale", std::string(to_string(s.weight_scale))},
         {"activations", std::string(to_string(s.act))},
         {"excluded", ls.excluded},
         {"matched_by", ls.reason},
         {"num_experts", p.num_experts},
         {"num_local", p.num_local},
         {"hidden", p.hidden},
         {"intermediate", p.inter_full},
         {"intermediate_per_rank", p.inter},
         {"params", params},
         {"total_bytes", total},
         {"bits_per_weight", weights > 0 ? static_cast<double>(total) * 8.0 / weights : 0.0}};
  if (is_mx_weight(s.weight) && act_is_quantized(s.act) && !act_is_static(s.act))
    j["act_scale_mode"] = ls.act_scale_mode == MxScaleMode::Even ? "even" : ls.act_scale_mode == MxScaleMode::Floor ? "floor" : "ceil";
  if (act_is_static(s.act)) {
    j["a13_scale"] = p.a13_scale;
    j["a2_scale"] = p.a2_scale;
    j["static_scale_meaning"] = s.act == ActQuant::Nvfp4 ? "quantization global scale 1/max(input_scale_2)"
                                                           : "max over experts of input_scale";
  }
  return j;
}

Json inspect_report(const std::string& dir, const std::vector<int>& only_layers) {
  ModelConfig cfg = ModelConfig::load(dir);
  const Checkpoint ckpt = Checkpoint::open(dir);
  cfg.adapt_naming_to_checkpoint([&](const std::string& n) { return ckpt.has(n); });
  Json arch{{"model_type", cfg.model_type},
            {"hidden_size", cfg.hidden_size},
            {"moe_intermediate_size", cfg.moe_intermediate_size},
            {"num_experts", cfg.num_experts},
            {"top_k", cfg.top_k},
            {"num_layers", cfg.num_layers},
            {"moe_layers", cfg.moe_layers},
            {"activation", std::string(to_string(cfg.activation))},
            {"expert_bias", cfg.expert_bias},
            {"naming", std::string(naming_name(cfg.naming))},
            {"shared_expert_intermediate_size", cfg.shared_expert_intermediate_size},
            {"routing", routing_json(cfg.routing)},
            {"routing_text", routing_text(cfg.routing)}};
  if (cfg.swiglu_limit) arch["swiglu_limit"] = *cfg.swiglu_limit;
  Json quant = nullptr;
  if (cfg.quant) {
    quant = Json{{"quant_method", "quark"},
                 {"version", cfg.quant->version},
                 {"exclude", cfg.quant->exclude},
                 {"layer_quant_config", Json::array()}};
    for (const auto& [pattern, lc] : cfg.quant->layer_quant_config) quant["layer_quant_config"].push_back(pattern);
  }
  std::vector<int> layers = only_layers.empty() ? cfg.moe_layers : only_layers;
  Json out{{"model_dir", dir}, {"architecture", arch}, {"quantization", quant}};
  Json jl = Json::array(), excluded = Json::array(), warnings = Json::array();
  for (int layer : layers) {
    const LayerScheme ls = resolve_moe_scheme(cfg, layer);
    // Loaded and processed one layer at a time, so only one layer's parameters are in memory.
    ExpertParams p = load_expert_params(ckpt, cfg, ls, layer, LoadOptions{});
    process_expert_params(p);
    Json j{{"layer", layer}, {"top_k", cfg.top_k}};
    j.update(experts_json(p, ls));
    if (ls.excluded) excluded.push_back(Json{{"layer", layer}, {"prefix", p.prefix}, {"reason", ls.reason}});
    for (const auto& w : p.warnings) warnings.push_back(w);  // warnings name the layer's prefix
    if (cfg.shared_expert_intermediate_size > 0 && !cfg.shared_expert_prefix(layer).empty()) {
      const LayerScheme ss = resolve_shared_expert_scheme(cfg, layer);
      ExpertParams sp = load_shared_expert_params(ckpt, cfg, ss, layer, LoadOptions{});
      process_expert_params(sp);
      j["shared_expert"] = experts_json(sp, ss);
      if (ss.excluded) excluded.push_back(Json{{"layer", layer}, {"prefix", sp.prefix}, {"reason", ss.reason}});
      for (const auto& w : sp.warnings) warnings.push_back(w);
    }
    jl.push_back(std::move(j));
  }
  out["layers"] = jl;
  out["excluded"] = excluded;
  out["warnings"] = warnings;
  return out;
}

}  // namespace

std::string inspect_report_json(const std::string& dir, const std::vector<int>& layers, int indent) {
  return inspect_report(dir, layers).dump(indent < 0 ? -1 : indent);
}

}  // namespace qmoe
