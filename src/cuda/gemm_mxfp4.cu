// GEMM instantiations: MXFP4 weights (E2M1 + E8M0 per 32).
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_mxfp4(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (af == AFmt::Bf16Split) launch_gemm_bt<WFmt::MXFP4, true>(bt, wg, a, grid, s);
  else launch_gemm_bt<WFmt::MXFP4, false>(bt, wg, a, grid, s);
}

}  // namespace qmoe::cuda
