// Optimized CPU expert kernels: options beyond the public experts_optimized(args, threads)
// (include/qmoe/moe.h), for tests and benchmarks.
#pragma once

#include <cstdint>
#include <optional>

#include "cpu/isa.h"
#include "qmoe/moe.h"

namespace qmoe::cpu {

struct OptimizedOptions {
  std::optional<Isa> isa;   // default: default_isa() (env QMOE_CPU_ISA or the best supported)
  // Tokens per chunk: scratch is O(chunk_tokens · K · (2I + I + H)); each chunk streams every
  // expert's weights once. 0: as many as kChunkScratchBytes of scratch hold, at least 256.
  int chunk_tokens = 0;
  // Schemes that leave activations unquantized (unquantized, weight-only): round the GEMM1 input
  // and the intermediate to bf16 once (vLLM's precision, rel-L2 ~1e-3; CudaOptions::
  // bf16_activations on the GPU) instead of carrying fp32 values (up to 3 bf16 terms on the Bf16
  // kind). Schemes that quantize activations are unchanged.
  bool bf16_activations = false;
};

inline constexpr int64_t kChunkScratchBytes = int64_t{128} << 20;

// experts_optimized with explicit options. Unsupported ISA: qmoe::Error.
void experts_optimized_with(const ExpertsArgs& a, int threads, const OptimizedOptions& opt);

}  // namespace qmoe::cpu
