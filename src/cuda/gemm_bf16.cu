// GEMM instantiations: bf16 weights (unquantized); and which formats have the TMA ws kernel.
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_bf16(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (af == AFmt::Bf16Split) launch_gemm_bt<WFmt::BF16, true>(bt, wg, a, grid, s);
  else launch_gemm_bt<WFmt::BF16, false>(bt, wg, a, grid, s);
}

bool ws_tma_built(WFmt wf, AFmt af) {
  const bool split = af == AFmt::Bf16Split;
  switch (wf) {
    case WFmt::BF16: return split ? ws_tma_built_for<WFmt::BF16, true>() : ws_tma_built_for<WFmt::BF16, false>();
    case WFmt::INT8: return ws_tma_built_for<WFmt::INT8, false>();
    case WFmt::FP8:
      return af == AFmt::E4m3 || ws_tma_built_for<WFmt::FP8, false>();  // E4m3: gemm_ws_f8_kernel (f8_kernel 1, 2)
    case WFmt::MXFP4: return split ? ws_tma_built_for<WFmt::MXFP4, true>() : ws_tma_built_for<WFmt::MXFP4, false>();
    case WFmt::NVFP4: return split ? ws_tma_built_for<WFmt::NVFP4, true>() : ws_tma_built_for<WFmt::NVFP4, false>();
    case WFmt::MXFP6_E2M3:
      return split ? ws_tma_built_for<WFmt::MXFP6_E2M3, true>() : ws_tma_built_for<WFmt::MXFP6_E2M3, false>();
    case WFmt::MXFP6_E3M2:
      return split ? ws_tma_built_for<WFmt::MXFP6_E3M2, true>() : ws_tma_built_for<WFmt::MXFP6_E3M2, false>();
  }
  return false;
}

}  // namespace qmoe::cuda
