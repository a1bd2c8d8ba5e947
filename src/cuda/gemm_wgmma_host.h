// Host side of the wgmma prefill kernels (gemm_wgmma.cuh).
#pragma once

#include "cuda/cuda_common.h"

namespace qmoe::cuda {

// Formats the wgmma kernel takes (3 pipeline stages must fit in shared memory): all but MXFP6
// with the bf16 hi + lo split (checked against WgCfg<>::kSupported at compile time, gemm.cuh).
constexpr bool wgmma_supported(WFmt f, AFmt a) {
  return !((f == WFmt::MXFP6_E2M3 || f == WFmt::MXFP6_E3M2) && a == AFmt::Bf16Split);
}

// Mean tokens per active expert from which 128-token tiles on the wgmma kernel beat 64-token
// tiles on the mma.sync kernel, by weight format: measured on the H200 over four shapes and
// T = 64…2048 (bench/RESULTS.md, "tile crossover", 2026-12-02). Shared-memory-A formats (BF16,
// INT8) win from 32; the register-decode formats from 64.
constexpr int wgmma_min_tokens_per_expert(WFmt f) { return f == WFmt::BF16 || f == WFmt::INT8 ? 32 : 64; }

// True when the current device runs this build's wgmma kernels: the library was compiled with an
// sm_90a image (QMOE_CUDA_SM90A) and the device has compute capability 9.0. QMOE_CUDA_WGMMA=0 in
// the environment turns them off for the process.
bool wgmma_available();

}  // namespace qmoe::cuda
