// Helpers shared by the test_quant tests: building Quark / model configs and checking errors.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "error_of.h"
#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/schemes.h"

namespace qmoe::test {

using Json = nlohmann::ordered_json;

inline std::string cases_dir() { return QMOE_SOURCE_DIR "/../shared/conformance/cases/"; }

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

inline bool contains_ci(const std::string& haystack, const std::string& needle) {
  return lower(haystack).find(lower(needle)) != std::string::npos;
}

// The Quark quantization_config of a registry scheme, as a mutable JSON object.
inline Json quark_json(std::string_view scheme, std::vector<std::string> exclude = {"lm_head", "re:.*mlp.gate$"}) {
  return Json::parse(quark_quantization_config_json(scheme_by_name(scheme), exclude));
}

// A small Qwen3-MoE config.json (4 layers, 8 experts) with the given quantization_config
// (null: unquantized).
inline Json qwen3_json(const Json& quant = nullptr) {
  Json j = {{"model_type", "qwen3_moe"},   {"hidden_size", 64},          {"moe_intermediate_size", 32},
            {"num_experts", 8},            {"num_experts_per_tok", 2},   {"num_hidden_layers", 4},
            {"decoder_sparse_step", 1},    {"mlp_only_layers", Json::array()}, {"norm_topk_prob", true},
            {"hidden_act", "silu"}};
  if (!quant.is_null()) j["quantization_config"] = quant;
  return j;
}

inline ModelConfig model_from(const Json& j) { return ModelConfig::parse(j.dump(), "test/config.json"); }

inline QuarkConfig quark_from(const Json& q) { return QuarkConfig::parse(q.dump(), "test/config.json"); }

// Resolve the global config of a quantization_config JSON on a fixed prefix.
inline LayerScheme resolve_global(const Json& q, std::string_view prefix = "model.layers.0.mlp.experts") {
  return resolve_scheme_from_layer_config(quark_from(q).global_quant_config, prefix);
}

}  // namespace qmoe::test
