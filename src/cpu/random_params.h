// Random, already-processed expert parameters of any registry scheme (tests and `qmoe bench`).
#pragma once

#include <cstdint>
#include <vector>

#include "qmoe/params.h"

namespace qmoe::cpu {

struct RandomExpertsSpec {
  const SchemeInfo* scheme = nullptr;
  int num_experts = 8;          // E (global)
  int hidden = 64;              // H
  int inter = 32;               // I
  ActivationSpec act;
  bool bias = false;            // w13_bias / w2_bias (F32)
  float bias_std = 0.1f;
  std::vector<int> expert_map;  // [E] global → local (−1: not local); empty: all local
  uint64_t seed = 1;
  // false: quantize N(0, 1/√K) floats with the formats.h quantizers (realistic blocks);
  // true: random element codes and plausible scales (fast, for benchmark-sized layers).
  bool fast = false;
  DType unquantized_dtype = DType::BF16;  // storage of unquantized weights: BF16 (as checkpoints), F16 or F32
};

// Processed parameters (ExpertParams::processed = true) in the layout of include/qmoe/params.h.
// Static activation scales are set for inputs ~ N(0, 1) and intermediates of the same order.
ExpertParams make_random_expert_params(const RandomExpertsSpec& spec);

// Bytes of one local expert's stored weights and scales (w13 + w2), as the kernels read them.
int64_t expert_weight_bytes(const ExpertParams& p);

}  // namespace qmoe::cpu
