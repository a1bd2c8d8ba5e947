// GEMM instantiations: FP8 E4M3 weights (activations are fp8 codes: exact in fp16 for the fp16
// MMA kernels, or e4m3 bytes for the e4m3 wgmma kernel, AFmt::E4m3).
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_fp8(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (af == AFmt::E4m3) {
    if (!wg || (bt != 64 && bt != 128))
      throw Error("CUDA experts: e4m3 activations need the wgmma kernel and a 64- or 128-token tile, got " +
                  std::to_string(bt) + (wg ? "" : " without wgmma"));
    // Which e4m3 kernel: gemm_wg_f8_kernel (the one test_cuda has run, the default) or the
    // warp-specialised gemm_ws_f8_kernel with one / two weight tiles per CTA. Two tiles measured
    // 1.2-1.5x gemm_wg_f8_kernel at T = 1024 / 4096 on the standard shapes (bench/RESULTS.md,
    // 2026-12-04) but no test has run it yet: QMOE_CUDA_F8 = wg | ws1 | ws2 until one has.
    static const int ws = [] {
      const char* v = std::getenv("QMOE_CUDA_F8");
      if (v == nullptr || std::strcmp(v, "wg") == 0) return 0;
      return std::strcmp(v, "ws1") == 0 ? 1 : 2;
    }();
    if (bt == 64) launch_gemm_f8<64>(a, grid, s, ws);
    else launch_gemm_f8<128>(a, grid, s, ws);
    return;
  }
  launch_gemm_bt<WFmt::FP8, false>(bt, wg, a, grid, s);
}

}  // namespace qmoe::cuda
