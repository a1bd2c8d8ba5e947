// GEMM instantiations: FP8 E4M3 weights (activations are fp8 codes, exact in bf16).
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_fp8(AFmt, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  launch_gemm_bt<WFmt::FP8, false>(bt, wg, a, grid, s);
}

}  // namespace qmoe::cuda
