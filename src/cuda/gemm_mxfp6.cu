// GEMM instantiations: MXFP6 weights (E2M3 / E3M2 + E8M0 per 32).
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_mxfp6(WFmt wf, AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  const bool split = af == AFmt::Bf16Split;
  if (wf == WFmt::MXFP6_E2M3) {
    if (split) launch_gemm_bt<WFmt::MXFP6_E2M3, true>(bt, wg, a, grid, s);
    else launch_gemm_bt<WFmt::MXFP6_E2M3, false>(bt, wg, a, grid, s);
  } else {
    if (split) launch_gemm_bt<WFmt::MXFP6_E3M2, true>(bt, wg, a, grid, s);
    else launch_gemm_bt<WFmt::MXFP6_E3M2, false>(bt, wg, a, grid, s);
  }
}

}  // namespace qmoe::cuda
