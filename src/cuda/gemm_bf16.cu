// GEMM instantiations: bf16 weights (unquantized); and which formats have the TMA ws kernel.
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_bf16(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (af == AFmt::Bf16Split) launch_gemm_bt<WFmt::BF16, true>(bt, wg, a, grid, s);
  else launch_gemm_bt<WFmt::BF16, false>(bt, wg, a, grid, s);
}

namespace {
// The 128-token warp-specialised kernel of WF with (split) or without the bf16 hi + lo operand.
template <WFmt WF>
bool ws_built_128(bool split) {
  return split ? ws_built<WF, true, 128>() : ws_built<WF, false, 128>();
}
}  // namespace

bool ws_tma_built(WFmt wf, AFmt af) {
  const bool split = af == AFmt::Bf16Split;  // never with INT8 or FP8 weights
  switch (wf) {
    case WFmt::BF16: return ws_built_128<WFmt::BF16>(split);
    case WFmt::INT8: return ws_built<WFmt::INT8, false, 128>();
    case WFmt::FP8: return af == AFmt::E4m3 || ws_built<WFmt::FP8, false, 128>();  // E4m3: gemm_ws_f8_kernel
    case WFmt::MXFP4: return ws_built_128<WFmt::MXFP4>(split);
    case WFmt::NVFP4: return ws_built_128<WFmt::NVFP4>(split);
    case WFmt::MXFP6_E2M3: return ws_built_128<WFmt::MXFP6_E2M3>(split);
    case WFmt::MXFP6_E3M2: return ws_built_128<WFmt::MXFP6_E3M2>(split);
  }
  return false;
}

}  // namespace qmoe::cuda
