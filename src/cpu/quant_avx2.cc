// The AVX2 target's quantizer translation unit (compiled with -mavx2 -mfma -mf16c): the generic
// quantizers, gated activations and abs-max of simd/quant.h on the AVX2 ISA layer, and the AVX2
// row of the kernel table.
#include "cpu/simd/avx2.h"
#include "cpu/simd/quant.h"

namespace qmoe::cpu {

const KernelTable& avx2_kernels() {
  static const KernelTable t = make_kernel_table<Avx2>(Isa::Avx2, gemm_avx2);
  return t;
}

}  // namespace qmoe::cpu
