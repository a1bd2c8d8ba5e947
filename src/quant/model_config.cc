// ModelConfig: the MoE-relevant fields of a Hugging Face config.json for the supported
// architectures, and the checkpoint module names derived from them (checkpoint-format.md §3.2).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "qmoe/config.h"
#include "qmoe/error.h"
#include "quant/json_fields.h"
#include "util/files.h"
#include "util/json.h"

namespace qmoe {

namespace {

using detail::Json;

// Plausibility limits on config sizes (docs/DECISIONS.md): far above every released MoE model, low
// enough that no size computed from them overflows and no loop over them runs long before the
// checkpoint's tensors are checked against them.
constexpr int kMaxLayers = 1 << 16;
constexpr int kMaxExperts = 1 << 16;
constexpr int kMaxHidden = 1 << 20;
constexpr int kMaxIntermediate = 1 << 20;

constexpr std::array<std::string_view, 6> kSupportedModelTypes{
    "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss"};

// Reads fields of one config.json; every error names the file, the model_type and the field.
class Fields {
 public:
  Fields(const Json& j, std::string_view where, std::string model_type)
      : j_(j), where_(where), model_type_(std::move(model_type)) {}

  bool has(std::string_view key) const {
    auto it = j_.find(std::string(key));
    return it != j_.end() && !it->is_null();
  }
  bool present(std::string_view key) const { return j_.contains(std::string(key)); }
  int req_int(std::string_view key) const {
    auto v = detail::opt_int(j_, key, "", where_);
    if (!v) missing(key);
    return checked_int(key, *v);
  }
  int opt_int(std::string_view key, int def) const {
    auto v = detail::opt_int(j_, key, "", where_);
    return v ? checked_int(key, *v) : def;
  }
  bool opt_bool(std::string_view key, bool def) const {
    return detail::opt_bool(j_, key, "", where_).value_or(def);
  }
  double opt_number(std::string_view key, double def) const {
    return detail::opt_number(j_, key, "", where_).value_or(def);
  }
  std::string opt_string(std::string_view key, std::string def) const {
    return detail::opt_string(j_, key, "", where_).value_or(std::move(def));
  }
  std::vector<int> opt_int_list(std::string_view key) const {
    std::vector<int> out;
    auto it = j_.find(std::string(key));
    if (it == j_.end() || it->is_null()) return out;
    if (!it->is_array()) fail(key, fmt::format("must be a list of integers, got {}", detail::json_type_name(*it)));
    for (const Json& e : *it) {
      if (!e.is_number_integer()) fail(key, fmt::format("must be a list of integers, has {}", util::json_brief(e)));
      out.push_back(checked_int(key, e.get<int64_t>()));
    }
    return out;
  }
  [[noreturn]] void missing(std::string_view key) const {
    throw Error(fmt::format("{}: missing required field '{}' (model_type {})", where_, key, model_type_));
  }
  [[noreturn]] void fail(std::string_view key, std::string_view what) const {
    throw Error(fmt::format("{}: field '{}' {} (model_type {})", where_, key, what, model_type_));
  }
  void require_positive(std::string_view key, int v) const {
    if (v <= 0) fail(key, fmt::format("must be > 0, got {}", v));
  }
  void require_at_most(std::string_view key, int v, int limit, std::string_view what) const {
    if (v > limit)
      fail(key, fmt::format("= {} exceeds qmoe's limit of {} {} (an implausible model size; is the file corrupt?)", v,
                            limit, what));
  }

 private:
  int checked_int(std::string_view key, int64_t v) const {
    if (v < -(int64_t{1} << 30) || v > (int64_t{1} << 30)) fail(key, fmt::format("= {} is out of range", v));
    return static_cast<int>(v);
  }
  const Json& j_;
  std::string_view where_;
  std::string model_type_;
};

Activation parse_activation(const Fields& f) {
  const std::string act = f.opt_string("hidden_act", "silu");
  if (act == "silu" || act == "swish") return Activation::Silu;
  if (act == "gelu") return Activation::Gelu;
  if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") return Activation::GeluTanh;
  f.fail("hidden_act", fmt::format("is \"{}\"; supported: silu, gelu, gelu_pytorch_tanh, gelu_tanh", act));
}

void parse_mixtral(ModelConfig& c, const Fields& f) {
  c.moe_intermediate_size = f.req_int("intermediate_size");
  c.num_experts = f.req_int("num_local_experts");
  c.top_k = f.req_int("num_experts_per_tok");
  c.routing.renormalize = true;
  c.naming = ExpertNaming::Mixtral;
  c.activation = parse_activation(f);
  for (int l = 0; l < c.num_layers; ++l) c.moe_layers.push_back(l);
}

void parse_qwen_moe(ModelConfig& c, const Fields& f, bool qwen2) {
  c.moe_intermediate_size = f.req_int("moe_intermediate_size");
  // transformers >= 5 saves Qwen2/3-MoE configs with `num_local_experts` (its attribute_map aliases
  // `num_experts` to it); earlier versions and vLLM's docs spell it `num_experts`. Both are read;
  // when both are present they must agree.
  if (f.has("num_experts")) {
    c.num_experts = f.req_int("num_experts");
    if (f.has("num_local_experts") && f.req_int("num_local_experts") != c.num_experts)
      f.fail("num_local_experts", fmt::format("= {} disagrees with num_experts = {}", f.req_int("num_local_experts"),
                                              c.num_experts));
  } else if (f.has("num_local_experts")) {
    c.num_experts = f.req_int("num_local_experts");
  } else {
    f.missing("num_experts");
  }
  c.top_k = f.req_int("num_experts_per_tok");
  c.routing.renormalize = f.opt_bool("norm_topk_prob", !qwen2);
  c.naming = ExpertNaming::GateUpDown;
  c.activation = parse_activation(f);
  const int step = f.opt_int("decoder_sparse_step", 1);
  if (step <= 0) f.fail("decoder_sparse_step", fmt::format("must be >= 1, got {}", step));
  std::vector<int> mlp_only = f.opt_int_list("mlp_only_layers");
  std::sort(mlp_only.begin(), mlp_only.end());
  for (int l = 0; l < c.num_layers; ++l) {
    const bool dense = std::binary_search(mlp_only.begin(), mlp_only.end(), l);
    if (!dense && c.num_experts > 0 && (l + 1) % step == 0) c.moe_layers.push_back(l);
  }
  if (qwen2) {
    c.shared_expert_intermediate_size = f.req_int("shared_expert_intermediate_size");
    if (c.shared_expert_intermediate_size < 0)
      f.fail("shared_expert_intermediate_size", fmt::format("must be >= 0, got {}", c.shared_expert_intermediate_size));
    f.require_at_most("shared_expert_intermediate_size", c.shared_expert_intermediate_size, kMaxIntermediate,
                      "elements");
    c.shared_expert_gate = c.shared_expert_intermediate_size > 0;
  }
}

void parse_deepseek(ModelConfig& c, const Fields& f, bool v3) {
  c.moe_intermediate_size = f.req_int("moe_intermediate_size");
  c.num_experts = f.req_int("n_routed_experts");
  c.top_k = f.req_int("num_experts_per_tok");
  c.naming = ExpertNaming::GateUpDown;
  c.activation = parse_activation(f);
  // Absent: DeepseekV3Config's default 1 (V2 has no default); null: no shared expert.
  if (!v3 && !f.present("n_shared_experts")) f.missing("n_shared_experts");
  const int n_shared = f.present("n_shared_experts") ? f.opt_int("n_shared_experts", 0) : 1;
  if (n_shared < 0) f.fail("n_shared_experts", fmt::format("must be >= 0, got {}", n_shared));
  f.require_positive("moe_intermediate_size", c.moe_intermediate_size);
  f.require_at_most("moe_intermediate_size", c.moe_intermediate_size, kMaxIntermediate, "elements");
  int64_t shared = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(n_shared), static_cast<int64_t>(c.moe_intermediate_size), &shared) ||
      shared > kMaxIntermediate)
    f.fail("n_shared_experts",
           fmt::format("= {} times moe_intermediate_size = {} is a shared-expert intermediate size beyond qmoe's "
                       "limit of {} elements",
                       n_shared, c.moe_intermediate_size, kMaxIntermediate));
  c.shared_expert_intermediate_size = static_cast<int>(shared);

  RoutingConfig& r = c.routing;
  r.renormalize = f.opt_bool("norm_topk_prob", v3);
  r.routed_scaling_factor = static_cast<float>(f.opt_number("routed_scaling_factor", v3 ? 2.5 : 1.0));
  if (!(r.routed_scaling_factor > 0.0f))
    f.fail("routed_scaling_factor", fmt::format("must be > 0, got {}", r.routed_scaling_factor));
  const std::string scoring = f.opt_string("scoring_func", v3 ? "sigmoid" : "softmax");
  if (scoring == "softmax") {
    r.scoring = ScoringFunc::Softmax;
  } else if (scoring == "sigmoid") {
    r.scoring = ScoringFunc::Sigmoid;
  } else {
    f.fail("scoring_func", fmt::format("is \"{}\"; supported: softmax, sigmoid", scoring));
  }
  const std::string method = f.opt_string("topk_method", v3 ? "noaux_tc" : "greedy");
  if (method == "greedy" || method == "gready") {  // "gready": the spelling of DeepSeek-V2's remote code
    r.n_group = 0;
    r.topk_group = 0;
  } else if (method == "group_limited_greedy" || method == "noaux_tc") {
    r.has_correction_bias = method == "noaux_tc";
    r.n_group = f.opt_int("n_group", v3 ? 8 : 1);
    r.topk_group = f.opt_int("topk_group", v3 ? 4 : 1);
    f.require_positive("n_group", r.n_group);
    f.require_positive("topk_group", r.topk_group);
    if (r.topk_group > r.n_group)
      f.fail("topk_group", fmt::format("= {} exceeds n_group = {}", r.topk_group, r.n_group));
    if (c.num_experts % r.n_group != 0)
      f.fail("n_group", fmt::format("= {} does not divide n_routed_experts = {}", r.n_group, c.num_experts));
    if (r.n_group > 1 && c.top_k > r.topk_group * (c.num_experts / r.n_group))
      f.fail("num_experts_per_tok",
             fmt::format("= {} exceeds the experts of the topk_group = {} selected groups ({} each)", c.top_k,
                         r.topk_group, c.num_experts / r.n_group));
  } else {
    f.fail("topk_method", fmt::format("is \"{}\"; supported: greedy, group_limited_greedy, noaux_tc", method));
  }

  const int first_dense = f.opt_int("first_k_dense_replace", 0);
  const int freq = f.opt_int("moe_layer_freq", 1);
  if (first_dense < 0) f.fail("first_k_dense_replace", fmt::format("must be >= 0, got {}", first_dense));
  if (freq <= 0) f.fail("moe_layer_freq", fmt::format("must be >= 1, got {}", freq));
  for (int l = 0; l < c.num_layers; ++l)
    if (c.num_experts > 0 && l >= first_dense && l % freq == 0) c.moe_layers.push_back(l);
}

void parse_gpt_oss(ModelConfig& c, const Fields& f) {
  c.moe_intermediate_size = f.req_int("intermediate_size");
  c.num_experts = f.req_int("num_local_experts");
  const bool has_k = f.has("num_experts_per_tok"), has_alias = f.has("experts_per_token");
  if (!has_k && !has_alias) f.missing("num_experts_per_tok (or experts_per_token)");
  c.top_k = has_k ? f.req_int("num_experts_per_tok") : f.req_int("experts_per_token");
  if (has_k && has_alias && f.req_int("experts_per_token") != c.top_k)
    f.fail("experts_per_token", fmt::format("= {} disagrees with num_experts_per_tok = {}",
                                            f.req_int("experts_per_token"), c.top_k));
  c.swiglu_limit = static_cast<float>(f.opt_number("swiglu_limit", 7.0));
  if (!(*c.swiglu_limit > 0.0f)) f.fail("swiglu_limit", fmt::format("must be > 0, got {}", *c.swiglu_limit));
  c.activation = Activation::SwigluOai;  // gpt-oss ignores hidden_act
  c.swiglu_alpha = 1.702f;
  c.expert_bias = true;
  c.router_bias = true;
  c.routing.topk_then_softmax = true;
  c.routing.renormalize = true;
  c.naming = ExpertNaming::GptOss;
  for (int l = 0; l < c.num_layers; ++l) c.moe_layers.push_back(l);
}

std::string layer_prefix(int layer) { return fmt::format("model.layers.{}", layer); }

}  // namespace

std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::Silu: return "silu";
    case Activation::Gelu: return "gelu";
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::SwigluOai: return "swigluoai";
  }
  return "?";
}

ModelConfig ModelConfig::parse(std::string_view json_text, std::string_view where) {
  const Json j = detail::parse_json(json_text, where);
  if (!j.is_object())
    throw Error(fmt::format("{}: config.json must be a JSON object, got {}", where, detail::json_type_name(j)));
  ModelConfig c;
  const auto type = detail::opt_string(j, "model_type", "", where);
  if (!type)
    throw Error(fmt::format("{}: missing required field 'model_type' (supported: {})", where,
                            fmt::join(kSupportedModelTypes, ", ")));
  if (std::find(kSupportedModelTypes.begin(), kSupportedModelTypes.end(), *type) == kSupportedModelTypes.end())
    throw Error(fmt::format("{}: model_type \"{}\" is not supported; supported MoE architectures: {}", where, *type,
                            fmt::join(kSupportedModelTypes, ", ")));
  c.model_type = *type;
  const Fields f(j, where, c.model_type);
  c.hidden_size = f.req_int("hidden_size");
  c.num_layers = f.req_int("num_hidden_layers");
  f.require_positive("hidden_size", c.hidden_size);
  f.require_positive("num_hidden_layers", c.num_layers);
  f.require_at_most("hidden_size", c.hidden_size, kMaxHidden, "elements");
  f.require_at_most("num_hidden_layers", c.num_layers, kMaxLayers, "layers");

  if (c.model_type == "mixtral") {
    parse_mixtral(c, f);
  } else if (c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe") {
    parse_qwen_moe(c, f, c.model_type == "qwen2_moe");
  } else if (c.model_type == "deepseek_v2" || c.model_type == "deepseek_v3") {
    parse_deepseek(c, f, c.model_type == "deepseek_v3");
  } else {
    parse_gpt_oss(c, f);
  }

  const std::string_view i_field = c.model_type == "mixtral" || c.model_type == "gpt_oss"
                                       ? "intermediate_size" : "moe_intermediate_size";
  f.require_positive(i_field, c.moe_intermediate_size);
  f.require_at_most(i_field, c.moe_intermediate_size, kMaxIntermediate, "elements");
  const std::string_view e_field = c.model_type == "mixtral" || c.model_type == "gpt_oss" ? "num_local_experts"
                                   : c.model_type.starts_with("deepseek")                ? "n_routed_experts"
                                   : !f.has("num_experts") && f.has("num_local_experts") ? "num_local_experts"
                                                                                         : "num_experts";
  f.require_positive(e_field, c.num_experts);
  f.require_at_most(e_field, c.num_experts, kMaxExperts, "experts");
  f.require_positive("num_experts_per_tok", c.top_k);
  if (c.top_k > c.num_experts)
    f.fail("num_experts_per_tok", fmt::format("= {} exceeds the number of experts {}", c.top_k, c.num_experts));
  if (c.moe_layers.empty())
    throw Error(fmt::format("{}: no decoder layer has an MoE block (check mlp_only_layers / decoder_sparse_step / "
                            "first_k_dense_replace / moe_layer_freq; model_type {})",
                            where, c.model_type));

  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    if (!q->is_object())
      throw Error(fmt::format("{}: field 'quantization_config' must be an object, got {}", where,
                              detail::json_type_name(*q)));
    const auto method = detail::opt_string(*q, "quant_method", "quantization_config", where);
    if (!method || *method != "quark")
      throw Error(fmt::format("{}: quantization_config.quant_method is {}; qmoe only loads AMD Quark checkpoints "
                              "(quant_method \"quark\")",
                              where, method ? fmt::format("\"{}\"", *method) : std::string("missing")));
    c.quant = QuarkConfig::parse(q->dump(), where);
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!util::describe_non_regular(dir).empty() && util::describe_non_regular(dir) != "a directory")
    throw Error(fmt::format("checkpoint directory {} is {}; expected a directory", dir, util::describe_non_regular(dir)));
  std::string text;
  try {
    text = util::read_regular_file(path, "model config", util::kMaxJsonFileBytes);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: cannot read the model config (does the checkpoint directory exist?): {}", path,
                            e.what()));
  }
  ModelConfig c = parse(text, path);
  c.dir = dir;
  return c;
}

void ModelConfig::adapt_naming_to_checkpoint(const std::function<bool(const std::string&)>& has_tensor) {
  if (naming != ExpertNaming::Mixtral || moe_layers.empty()) return;
  const int l = moe_layers.front();
  if (has_tensor(experts_prefix(l) + ".0.w1.weight")) return;
  if (has_tensor(layer_prefix(l) + ".mlp.experts.0.gate_proj.weight")) naming = ExpertNaming::GateUpDown;
}

std::string ModelConfig::moe_prefix(int layer) const {
  return layer_prefix(layer) + (naming == ExpertNaming::Mixtral ? ".block_sparse_moe" : ".mlp");
}
std::string ModelConfig::experts_prefix(int layer) const { return moe_prefix(layer) + ".experts"; }
std::string ModelConfig::router_weight_name(int layer) const {
  return moe_prefix(layer) + (naming == ExpertNaming::GptOss ? ".router.weight" : ".gate.weight");
}
std::string ModelConfig::router_bias_name(int layer) const {
  return router_bias ? moe_prefix(layer) + ".router.bias" : std::string();
}
std::string ModelConfig::correction_bias_name(int layer) const {
  return routing.has_correction_bias ? moe_prefix(layer) + ".gate.e_score_correction_bias" : std::string();
}
std::string ModelConfig::shared_expert_prefix(int layer) const {
  if (shared_expert_intermediate_size <= 0) return {};
  if (model_type == "qwen2_moe") return moe_prefix(layer) + ".shared_expert";
  return moe_prefix(layer) + ".shared_experts";  // DeepSeek
}
std::string ModelConfig::shared_expert_gate_name(int layer) const {
  if (!shared_expert_gate || shared_expert_intermediate_size <= 0) return {};
  return moe_prefix(layer) + ".shared_expert_gate.weight";
}
std::vector<std::string> ModelConfig::projection_names() const {
  switch (naming) {
    case ExpertNaming::Mixtral: return {"w1", "w3", "w2"};
    case ExpertNaming::GateUpDown: return {"gate_proj", "up_proj", "down_proj"};
    case ExpertNaming::GptOss: return {"gate_up_proj", "", "down_proj"};
  }
  return {};
}

}  // namespace qmoe
