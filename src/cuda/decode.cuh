// The two hardware conversions the GEMM's register decode uses on top of frag_layout.h: the bf16x2
// multiply by a block-scale multiplier (exact for the operands frag_layout.h builds: ≤ 6
// significant bits, products in the bf16 range, subnormal inputs included) and FP8 E4M3 → fp16x2
// (exact: every e4m3 value is an fp16 value). Checked code by code on the device
// (tests/cuda/test_decode.cc).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace qmoe::cuda {

__device__ __forceinline__ uint32_t bf16x2_mul_bits(uint32_t v, uint32_t m) {
  __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v);
  b = __hmul2(b, *reinterpret_cast<const __nv_bfloat162*>(&m));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// v · (half h of m, in both lanes): the multiplier of a scale pair (fp4_scale_pair_bf16x2);
// ptxas turns the broadcast into an operand swizzle of the HMUL2.
__device__ __forceinline__ uint32_t bf16x2_mul_half_bits(uint32_t v, uint32_t m, int h) {
  const __nv_bfloat162 mm = *reinterpret_cast<const __nv_bfloat162*>(&m);
  const __nv_bfloat162 b = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v), h ? __high2bfloat162(mm) : __low2bfloat162(mm));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// A word of four e4m3 codes → two fp16x2 by cvt.rn.f16x2.e4m3x2 (lo: bytes 0, 1; hi: bytes 2, 3;
// the lower byte becomes the lower half). The 16-bit halves are taken by a register-pair move,
// which ptxas folds into the conversions' operands (.H1), where `w >> 16` cost a shift per word.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

}  // namespace qmoe::cuda
