// What the SIMD targets' ISA layers (simd/avx2.h, simd/avx512.h) share that is not an intrinsic:
// bit constants of the register decoders. Internal linkage, like the layers themselves.
#pragma once

#include <cstdint>
#include <cstring>

namespace qmoe::cpu {
namespace {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// MXFP6 code (6 bits: sign, exponent, mantissa) → fp32 in three integer steps and one multiply:
// (c << 26) >>arith kSra puts the sign at bit 31 and the exponent | mantissa bits right below the
// fp32 exponent field's alignment, & kMask clears the sign copies, × 2^kScaleExp (bits kMulBits)
// rebiases — exact, subnormals included (E2M3: bias 1, E3M2: bias 3).
template <bool kE2M3>
struct Fp6ToF32 {
  static constexpr int kSra = kE2M3 ? 6 : 5;
  static constexpr uint32_t kMask = kE2M3 ? 0x81F00000u : 0x83E00000u;
  static constexpr uint32_t kMulBits = kE2M3 ? 0x7E800000u : 0x7D800000u;  // 2^126 / 2^124
};

}  // namespace
}  // namespace qmoe::cpu
