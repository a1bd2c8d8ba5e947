// Model config.json (MoE architectures) and Quark quantization_config parsing, and per-layer
// scheme resolution (spec quark-moe.md §2–5, §12, §16.3; checkpoint-format.md §2).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qmoe/formats.h"
#include "qmoe/schemes.h"

namespace qmoe {

// One Quark QTensorConfig. Absent / null fields keep these defaults. Legacy spellings
// (`dynamic`, `axis`) are accepted.
struct QTensorSpec {
  std::string dtype;                    // "fp4", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3", "int8", ...
  std::string qscheme;                  // "per_tensor" | "per_channel" | "per_group" | "per_block" | ""
  bool is_dynamic = false;
  std::optional<bool> symmetric;
  std::optional<int> ch_axis;
  std::optional<int> group_size;
  std::string scale_format;             // "e8m0", "float32", ... or ""
  std::string scale_calculation_mode;   // "even" | "floor" | "ceil" | "" (= even for e8m0)
  std::string scale_type;
  std::string round_method;
  bool is_scale_quant = false;
};

// One QLayerConfig. A list-valued weight / input_tensors keeps every element; a dict is a list
// of one with `*_is_list == false`; null is an empty list.
struct QLayerConfig {
  std::vector<QTensorSpec> weight;
  bool weight_is_list = false;
  std::vector<QTensorSpec> input_tensors;
  bool input_is_list = false;
  bool has_output_tensors = false;  // output_tensors set (truthy)
  bool has_bias = false;            // bias spec set (truthy)
};

struct QuarkConfig {
  QLayerConfig global_quant_config;
  bool has_global = false;
  std::vector<std::pair<std::string, QLayerConfig>> layer_quant_config;  // in file order
  std::map<std::string, QLayerConfig> layer_type_quant_config;           // "Linear", ...
  std::vector<std::string> exclude;
  std::vector<std::string> kv_cache_group;
  std::string pack_method;
  std::string weight_format;  // export.weight_format ("real_quantized")
  std::string version;

  // Parse the `quantization_config` object (JSON text). `where` names the file in messages.
  // Errors (qmoe::Error): quant_method != "quark", no `export`, fake_quantized weights,
  // malformed fields (with the field path).
  static QuarkConfig parse(std::string_view json_text, std::string_view where);
};

// Pattern matching used for exclude and layer_quant_config (spec §16.3): exact name, shell glob
// (`*`, `?`, `[..]`), or `re:<regex>` (RE2: Python re syntax without back-references and look-around,
// anchored at the start like Python re.match; linear time). A bad pattern: qmoe::Error naming it.
bool quark_pattern_matches(std::string_view pattern, std::string_view name);

enum class Activation { Silu, Gelu, GeluTanh, SwigluOai };
std::string_view to_string(Activation a);

enum class ScoringFunc { Softmax, Sigmoid };

// Routing of one MoE layer (spec §8).
struct RoutingConfig {
  ScoringFunc scoring = ScoringFunc::Softmax;
  bool renormalize = true;                // norm_topk_prob
  bool topk_then_softmax = false;         // gpt-oss: top-k of logits, softmax over the k
  int n_group = 0;                        // grouped top-k when > 1 (DeepSeek)
  int topk_group = 0;
  bool has_correction_bias = false;       // e_score_correction_bias (selection only)
  float routed_scaling_factor = 1.0f;
  bool apply_router_weight_on_input = false;  // only with top_k == 1
};

// Checkpoint tensor naming of the experts of one layer.
enum class ExpertNaming {
  Mixtral,     // {prefix}.experts.{e}.{w1,w3,w2}
  GateUpDown,  // {prefix}.experts.{e}.{gate_proj,up_proj,down_proj}
  GptOss,      // {prefix}.experts.{e}.{gate_up_proj (interleaved rows), down_proj}
};

struct ModelConfig {
  std::string dir;            // checkpoint directory ("" when parsed from text)
  std::string model_type;     // mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss
  int hidden_size = 0;        // H
  int moe_intermediate_size = 0;  // I (per expert, unsharded)
  int num_experts = 0;        // E (routed)
  int top_k = 0;              // K
  int num_layers = 0;
  RoutingConfig routing;
  Activation activation = Activation::Silu;
  std::optional<float> swiglu_limit;      // gpt-oss (7.0), also honoured for silu when set
  float swiglu_alpha = 1.702f;            // gpt-oss
  bool expert_bias = false;               // experts carry biases (gpt-oss)
  bool router_bias = false;               // router has a bias (gpt-oss)
  int shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool shared_expert_gate = false;          // Qwen2-MoE sigmoid gate on the shared expert
  ExpertNaming naming = ExpertNaming::GateUpDown;
  std::optional<QuarkConfig> quant;       // quantization_config (quant_method "quark")

  // Which decoder layers have an MoE block (mlp_only_layers, decoder_sparse_step,
  // first_k_dense_replace, moe_layer_freq).
  std::vector<int> moe_layers;

  // Module prefixes of layer L: "model.layers.L.mlp" or "model.layers.L.block_sparse_moe".
  std::string moe_prefix(int layer) const;
  std::string experts_prefix(int layer) const;          // moe_prefix + ".experts"
  std::string router_weight_name(int layer) const;      // ….gate.weight or ….router.weight
  std::string router_bias_name(int layer) const;        // gpt-oss ….router.bias ("" otherwise)
  std::string correction_bias_name(int layer) const;    // ….gate.e_score_correction_bias
  std::string shared_expert_prefix(int layer) const;    // ….shared_expert(s) ("" if none)
  std::string shared_expert_gate_name(int layer) const; // ….shared_expert_gate.weight ("" if none)
  // Names of the three projections for this naming: {gate, up, down} ("w1","w3","w2" for
  // Mixtral; gpt-oss has {"gate_up_proj", "", "down_proj"}).
  std::vector<std::string> projection_names() const;

  // Mixtral checkpoints come in two spellings: transformers 4 modules
  // (`block_sparse_moe.experts.E.{w1,w3,w2}`, `block_sparse_moe.gate`) and, from transformers 5
  // (whose Mixtral fuses the experts; Quark 0.13 unfuses them into Linears), `mlp.experts.E.
  // {gate_proj,up_proj,down_proj}` and `mlp.gate`. Call this once the checkpoint is open: when the
  // first MoE layer's expert 0 exists only in the second spelling, naming becomes GateUpDown.
  void adapt_naming_to_checkpoint(const std::function<bool(const std::string&)>& has_tensor);

  // Parse config.json text. Errors name the field and what was expected.
  static ModelConfig parse(std::string_view json_text, std::string_view where);
  // Read DIR/config.json.
  static ModelConfig load(const std::string& dir);
};

// The resolved scheme of one MoE layer (or of its shared expert).
struct LayerScheme {
  std::string prefix;                 // e.g. "model.layers.3.mlp.experts"
  const SchemeInfo* scheme = nullptr; // never null after resolve (unquantized when excluded)
  bool excluded = false;
  std::string reason;                 // how it was matched: "exclude 're:.*mlp.experts.*'", "global_quant_config", ...
  MxScaleMode weight_scale_mode = MxScaleMode::Even;  // scale_calculation_mode of weights (MX)
  MxScaleMode act_scale_mode = MxScaleMode::Even;     // of MX activations
  QLayerConfig config;                // the matched layer config
};

// Resolve the scheme of the routed experts of `layer` (all-or-nothing, spec §3.2): exclusion when
// an exclude pattern matches the experts prefix or any expert linear; otherwise the first
// layer_quant_config pattern matching the experts prefix or an expert linear name, then
// layer_type_quant_config["Linear"], then global. Then the §4 predicates in the §5 order, with
// the §6 checks; unsupported or contradictory configs throw qmoe::Error naming the layer and field.
LayerScheme resolve_moe_scheme(const ModelConfig& cfg, int layer);
// Same for the layer's shared expert (its linears named `{shared_prefix}.{gate,up,down}_proj`).
LayerScheme resolve_shared_expert_scheme(const ModelConfig& cfg, int layer);
// Resolution from a layer config alone (used by the above and by the quantizer's round trip).
LayerScheme resolve_scheme_from_layer_config(const QLayerConfig& lc, std::string_view prefix);

// The `quantization_config` object (JSON text, keys sorted, as Quark 0.13 exports it:
// checkpoint-format.md §2, incl. the `export` block) of a checkpoint quantized with scheme `s`
// (global_quant_config only; layer_quant_config empty), with the given exclude list. The
// "unquantized" scheme gives weight and input_tensors null. Used by the quantizer.
std::string quark_quantization_config_json(const SchemeInfo& s, const std::vector<std::string>& exclude);

}  // namespace qmoe
