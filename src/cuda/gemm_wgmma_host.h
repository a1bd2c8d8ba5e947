// Host side of the wgmma prefill kernels (gemm_wgmma.cuh).
#pragma once

namespace qmoe::cuda {

// True when the current device runs this build's wgmma kernels: the library was compiled with an
// sm_90a image (QMOE_CUDA_SM90A) and the device has compute capability 9.0. QMOE_CUDA_WGMMA=0 in
// the environment turns them off for the process.
bool wgmma_available();

}  // namespace qmoe::cuda
