// The AVX-512 targets' quantizer translation unit (compiled with the AVX-512 flags): the generic
// quantizers, gated activations and abs-max of simd/quant.h on the AVX-512 ISA layer, and the
// avx512 / avx512bf16 / amx rows of the kernel table (the same functions but amx's GEMM: the
// DotKind::Bf16 paths, vdpbf16ps, are selected only on avx512bf16 and amx, dot_kind_for; amx's
// GEMM is gemm_amx.cc).
#include "cpu/simd/avx512.h"
#include "cpu/simd/quant.h"

namespace qmoe::cpu {

const KernelTable& avx512_kernels() {
  static const KernelTable t = make_kernel_table<Avx512>(Isa::Avx512, gemm_avx512);
  return t;
}

const KernelTable& avx512bf16_kernels() {
  static const KernelTable t = make_kernel_table<Avx512>(Isa::Avx512Bf16, gemm_avx512);
  return t;
}

const KernelTable& amx_kernels() {
  static const KernelTable t = make_kernel_table<Avx512>(Isa::Amx, gemm_amx);
  return t;
}

}  // namespace qmoe::cpu
