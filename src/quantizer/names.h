// Checkpoint names of the expert linears the quantizer handles (internal).
#pragma once

#include <string>
#include <vector>

#include "qmoe/config.h"

namespace qmoe::quantizer_detail {

enum class ProjRole { Gate, Up, Down, GateUp };  // GateUp: gpt-oss fused, rows interleaved

struct ExpertLinear {
  std::string prefix;  // e.g. "model.layers.0.mlp.experts.3.gate_proj" (tensor = prefix + ".weight")
  ProjRole role;
  int layer = 0;
  int expert = -1;     // routed expert id, −1 for the shared expert
  int64_t out = 0, in = 0;  // expected weight shape [out, in]
};

// The linears of routed expert `e` of `layer` (gate, up, down; gpt-oss: gate_up, down).
std::vector<ExpertLinear> routed_expert_linears(const ModelConfig& cfg, int layer, int e);
// The shared expert's linears (empty when the model has none).
std::vector<ExpertLinear> shared_expert_linears(const ModelConfig& cfg, int layer);

}  // namespace qmoe::quantizer_detail
