// GEMM instantiations: INT8 W8A8 (int8 mma, exact int32 accumulation).
#include "cuda/gemm.cuh"

namespace qmoe::cuda {

void launch_gemm_int8(AFmt, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  launch_gemm_bt<WFmt::INT8, false>(bt, wg, a, grid, s);
}

}  // namespace qmoe::cuda
