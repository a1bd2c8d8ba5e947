// The input file of `qmoe run` / a conformance case: hidden states and optional router logits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qmoe/safetensors.h"

namespace qmoe {

struct MoEInput {
  int64_t tokens = 0;  // T
  int64_t hidden = 0;  // H
  std::vector<float> hidden_states;                 // [T, H] fp32 (BF16 inputs converted exactly)
  int64_t logit_cols = 0;                           // E of router_logits (0 when absent)
  std::optional<std::vector<float>> router_logits;  // [T, E] fp32 when present
};

// Validate and convert: `hidden_states` [T, H] BF16 or F32 with T >= 1, T ≤ INT32_MAX and T·H
// within memory; optional `router_logits` F32 [T, E]; every value finite (the first NaN / ±Inf is
// reported with the tensor and the token). Errors are qmoe::Error naming the file.
MoEInput read_moe_input(const SafetensorsFile& in);

}  // namespace qmoe
