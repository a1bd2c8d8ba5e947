// GEMM instantiations: bf16 weights (unquantized) and FP8 E4M3 weights.
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_bf16(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (af == AFmt::Bf16Split) launch_gemm_bt<WFmt::BF16, true>(bt, wg, a, grid, s);
  else launch_gemm_bt<WFmt::BF16, false>(bt, wg, a, grid, s);
}

}  // namespace qmoe::cuda
