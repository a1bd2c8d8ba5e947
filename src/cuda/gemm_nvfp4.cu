// GEMM instantiations: NVFP4 weights (E2M1 + FP8 E4M3 per 16; the fp32 global scales are applied
// per expert after the GEMM).
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_nvfp4(AFmt, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  launch_gemm_bt<WFmt::NVFP4, false>(bt, wg, a, grid, s);
}

}  // namespace qmoe::cuda
