// GEMM instantiations: FP8 E4M3 weights (activations are fp8 codes: exact in fp16 for the fp16
// MMA kernels, or e4m3 bytes for the e4m3 wgmma kernel, AFmt::E4m3).
#include <string>

#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_fp8(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (af == AFmt::E4m3) {
    if (!wg || (bt != 64 && bt != 128))
      throw Error("CUDA experts: e4m3 activations need the wgmma kernel and a 64- or 128-token tile, got " +
                  std::to_string(bt) + (wg ? "" : " without wgmma"));
    if (a.a_tma && a.f8_kernel == 0)
      throw Error("CUDA experts: TMA activation tiles need the warp-specialised e4m3 kernel");
    if (bt == 64) launch_gemm_f8<64>(a, grid, s, a.f8_kernel);
    else launch_gemm_f8<128>(a, grid, s, a.f8_kernel);
    return;
  }
  launch_gemm_bt<WFmt::FP8, false>(bt, wg, a, grid, s);
}

}  // namespace qmoe::cuda
