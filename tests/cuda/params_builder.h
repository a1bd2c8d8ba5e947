// Random, already-processed ExpertParams of any registry scheme, quantized with the formats.h
// functions into the documented layouts (params.h), for tests that must not wait on the loader.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "qmoe/moe.h"
#include "qmoe/params.h"

namespace qmoe::cuda::test {

struct BuildSpec {
  const SchemeInfo* scheme = nullptr;
  int E = 8, H = 256, I = 128;
  std::vector<int> expert_map;  // empty: identity (all local)
  ActivationSpec act;
  bool bias = false;
  uint64_t seed = 1;
};

// Master weights N(0, 1/fan_in), quantized per scheme. Static activation scales are set from
// `x` (GEMM1 input) and from an fp32 estimate of the intermediate.
ExpertParams build_params(const BuildSpec& spec, const std::vector<float>& x, int T);

// Random routing: K distinct experts per token (all E, or `allowed` only), weights > 0 summing to 1.
void random_routing(int T, int K, int E, std::mt19937& rng, std::vector<int32_t>& ids, std::vector<float>& w,
                    const std::vector<int>& allowed = {});

// ‖a − b‖₂ / ‖b‖₂ (NaN / Inf in a: +inf).
double rel_l2(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace qmoe::cuda::test
