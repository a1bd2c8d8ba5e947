// Optimized CPU expert kernels: options beyond the public experts_optimized(args, threads)
// (include/qmoe/moe.h), for tests and benchmarks.
#pragma once

#include <optional>

#include "cpu/isa.h"
#include "qmoe/moe.h"

namespace qmoe::cpu {

struct OptimizedOptions {
  std::optional<Isa> isa;   // default: default_isa() (env QMOE_CPU_ISA or the best supported)
  int chunk_tokens = 256;   // tokens per chunk: scratch is O(chunk_tokens · K · max(2I, H))
};

// experts_optimized with explicit options. Unsupported ISA: qmoe::Error.
void experts_optimized_with(const ExpertsArgs& a, int threads, const OptimizedOptions& opt);

}  // namespace qmoe::cpu
