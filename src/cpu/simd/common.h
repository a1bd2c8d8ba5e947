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

// MXFP6 code c (6 bits: sign, exponent, mantissa; E2M3: bias 1, E3M2: bias 3) → fp32, exactly and
// without a subnormal fp32 anywhere: Intel cores take a microcode assist (~100+ cycles) on every
// vector multiply with a subnormal operand, which made a decode that formed the fp6 value as an
// fp32 subnormal and rebiased it with one multiply 20–35× slower there (AMD cores do not care).
//  * AVX-512: kMag, the 32 magnitudes, in two registers, looked up with one vpermt2ps; the sign
//    is OR-ed in.
//  * AVX2: (mag << kShl) + kBiasBits is the value as a normal fp32 for exponent ≥ 1; for exponent 0
//    (mag < kSubBelow: fp6 zero / subnormals) that float is 2^(1−bias)·(1 + m/2^M)/2, and the value
//    is 2f − 2^(1−bias) (kSubFix), exact; a blend picks it; the sign is OR-ed in.
template <bool kE2M3>
struct Fp6ToF32 {
  static constexpr int kManBits = kE2M3 ? 3 : 2;
  static constexpr int kBias = kE2M3 ? 1 : 3;
  static constexpr int kShl = 23 - kManBits;                                     // mantissa → fp32's
  static constexpr uint32_t kBiasBits = static_cast<uint32_t>(127 - kBias) << 23;
  static constexpr int kSubBelow = 1 << kManBits;                                // mag < it: exponent 0
  static constexpr float kSubFix = kE2M3 ? 1.0f : 0.25f;                         // 2^(1 − bias)
  static constexpr float mag(int c) {
    const int e = c >> kManBits, m = c & (kSubBelow - 1);
    float v = e == 0 ? static_cast<float>(m) / kSubBelow : 1.0f + static_cast<float>(m) / kSubBelow;
    for (int k = 0; k < (e == 0 ? 1 : e) - kBias; ++k) v *= 2.0f;
    for (int k = 0; k < kBias - (e == 0 ? 1 : e); ++k) v *= 0.5f;
    return v;
  }
  static constexpr float kMag[32] = {mag(0),  mag(1),  mag(2),  mag(3),  mag(4),  mag(5),  mag(6),  mag(7),
                                     mag(8),  mag(9),  mag(10), mag(11), mag(12), mag(13), mag(14), mag(15),
                                     mag(16), mag(17), mag(18), mag(19), mag(20), mag(21), mag(22), mag(23),
                                     mag(24), mag(25), mag(26), mag(27), mag(28), mag(29), mag(30), mag(31)};
};
static_assert(Fp6ToF32<true>::kMag[31] == 7.5f && Fp6ToF32<true>::kMag[1] == 0.125f);
static_assert(Fp6ToF32<false>::kMag[31] == 28.0f && Fp6ToF32<false>::kMag[1] == 0.0625f);

}  // namespace
}  // namespace qmoe::cpu
