// GEMM instantiations: bf16 weights (unquantized); and which formats have the TMA ws kernel.
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_bf16(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (af == AFmt::Bf16Split) launch_gemm_bt<WFmt::BF16, true>(bt, wg, a, grid, s);
  else launch_gemm_bt<WFmt::BF16, false>(bt, wg, a, grid, s);
}

namespace {
// The warp-specialised kernel of WF at a 64- or 128-token tile, with (split) or without the bf16
// hi + lo operand.
template <WFmt WF>
bool ws_built_at(bool split, int bt) {
  return split ? ws_tma_built_for<WF, true>(bt) : ws_tma_built_for<WF, false>(bt);
}
}  // namespace

bool ws_tma_built(WFmt wf, AFmt af, int bt) {
  const bool split = af == AFmt::Bf16Split;  // never with INT8 or FP8 weights
  switch (wf) {
    case WFmt::BF16: return ws_built_at<WFmt::BF16>(split, bt);
    case WFmt::INT8: return ws_tma_built_for<WFmt::INT8, false>(bt);
    case WFmt::FP8:  // E4m3: gemm_ws_f8_kernel
      return af == AFmt::E4m3 ? (bt == 64 || bt == 128) : ws_tma_built_for<WFmt::FP8, false>(bt);
    case WFmt::MXFP4: return ws_built_at<WFmt::MXFP4>(split, bt);
    case WFmt::NVFP4: return ws_built_at<WFmt::NVFP4>(split, bt);
    case WFmt::MXFP6_E2M3: return ws_built_at<WFmt::MXFP6_E2M3>(split, bt);
    case WFmt::MXFP6_E3M2: return ws_built_at<WFmt::MXFP6_E3M2>(split, bt);
  }
  return false;
}

}  // namespace qmoe::cuda
