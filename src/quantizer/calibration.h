// Static activation calibration (internal): the amax of every expert linear's input over the
// calibration tokens: GEMM1 in fp32 with the unquantized weights, the reference's gated activation.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/safetensors.h"

namespace qmoe::quantizer_detail {

struct ExpertInputAmax {
  float gemm1 = 0.0f;  // max |x| over the tokens routed to the expert (all tokens when none are)
  float gemm2 = 0.0f;  // max |act(x·W13ᵀ + b13)| over the same tokens
  int tokens = 0;      // calibration tokens routed to the expert
};

struct LayerCalibration {
  std::vector<ExpertInputAmax> experts;   // [E]
  std::optional<ExpertInputAmax> shared;  // the shared expert (every token)
};

// Calibration hidden states of `layer`: `model.layers.L.hidden_states`, else `hidden_states`;
// [N, H] of any float dtype. Errors name the file, the tensor and the expected shape.
std::vector<float> calibration_inputs(const SafetensorsFile& calib, int layer, int hidden, int& tokens);

// Route the tokens with the source router (fp32 logits, qmoe routing) and measure every expert's
// GEMM1 / GEMM2 input amax. `shared`: also the shared expert.
LayerCalibration calibrate_layer(const Checkpoint& ckpt, const ModelConfig& cfg, int layer, const std::vector<float>& x,
                                 int tokens, bool routed, bool shared, int threads);

}  // namespace qmoe::quantizer_detail
