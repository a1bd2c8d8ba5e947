// What the SIMD targets' ISA layers (simd/avx2.h, simd/avx512.h) share that is not an intrinsic:
// bit constants of the register decoders. Internal linkage, like the layers themselves.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/kernel_iface.h"

namespace qmoe::cpu {
namespace {

// One MX weight row's E8M0 block scales, read through e8m0_table() at each 64-chunk (its two
// blocks b, b + 1) by the layers' w4_weight_scales — the W4A4 and W4A16 kernels' weight factors,
// with no per-row factor buffer filled first.
struct MxRow {
  const uint8_t* sc;  // the row's E8M0 bytes
  const float* e8;    // e8m0_table()
  static MxRow of(const uint8_t* sc) { return {sc, e8m0_table()}; }
  float first(int b) const { return e8[sc[b]]; }
  // Block b + 1's factor; 0 past the row's nb blocks (a partial last chunk, !kFull).
  template <bool kFull>
  float second(int b, int nb) const { return (!kFull && b + 1 >= nb) ? 0.0f : e8[sc[b + 1]]; }
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A small float code c (sign | exponent | kManBits mantissa bits, bias kBias: FP6 E2M3 / E3M2, FP8
// E4M3) → fp32, exactly and without a subnormal fp32 anywhere. Intel cores take a microcode assist
// (~100+ cycles) on every vector multiply with a subnormal operand, which made decodes that formed
// the value as an fp32 subnormal and rebiased it with one multiply 20–35× slower there (AMD cores
// do not care; bench/RESULTS.md, 2026-12-02). The form the decoders use: (mag << kShl) + kBiasBits
// is the value as a normal fp32 for exponent ≥ 1; for exponent 0 (mag < kSubBelow: zero and the
// subnormals) that float is 2^(1−bias)·(1 + m/2^M)/2 and the value is 2f − kSubFix
// (kSubFix = 2^(1−bias) = mag(kSubBelow)), exact; the sign is OR-ed in. (AVX-512's FP6 decode
// looks the 32 magnitudes kMag up with one vpermt2ps instead.)
template <int kManBits, int kBias>
struct SmallFloatToF32 {
  static constexpr int kShl = 23 - kManBits;  // mantissa → fp32's
  static constexpr uint32_t kBiasBits = static_cast<uint32_t>(127 - kBias) << 23;
  static constexpr int kSubBelow = 1 << kManBits;  // mag < it: exponent 0
  static constexpr float mag(int c) {
    const int e = c >> kManBits, m = c & (kSubBelow - 1);
    float v = e == 0 ? static_cast<float>(m) / kSubBelow : 1.0f + static_cast<float>(m) / kSubBelow;
    for (int k = 0; k < (e == 0 ? 1 : e) - kBias; ++k) v *= 2.0f;
    for (int k = 0; k < kBias - (e == 0 ? 1 : e); ++k) v *= 0.5f;
    return v;
  }
  static constexpr float kSubFix = mag(kSubBelow);  // 2^(1 − bias)
};

template <bool kE2M3>
struct Fp6ToF32 : SmallFloatToF32<kE2M3 ? 3 : 2, kE2M3 ? 1 : 3> {
  using B = SmallFloatToF32<kE2M3 ? 3 : 2, kE2M3 ? 1 : 3>;
  static constexpr float kMag[32] = {B::mag(0),  B::mag(1),  B::mag(2),  B::mag(3),  B::mag(4),  B::mag(5),
                                     B::mag(6),  B::mag(7),  B::mag(8),  B::mag(9),  B::mag(10), B::mag(11),
                                     B::mag(12), B::mag(13), B::mag(14), B::mag(15), B::mag(16), B::mag(17),
                                     B::mag(18), B::mag(19), B::mag(20), B::mag(21), B::mag(22), B::mag(23),
                                     B::mag(24), B::mag(25), B::mag(26), B::mag(27), B::mag(28), B::mag(29),
                                     B::mag(30), B::mag(31)};
};
using Fp8E4M3ToF32 = SmallFloatToF32<3, 7>;
static_assert(Fp8E4M3ToF32::kSubFix == 1.0f / 64 && Fp8E4M3ToF32::mag(126) == 448.0f && Fp8E4M3ToF32::mag(1) == 1.0f / 512);
static_assert(Fp6ToF32<true>::kSubFix == 1.0f && Fp6ToF32<false>::kSubFix == 0.25f);
static_assert(Fp6ToF32<true>::kMag[31] == 7.5f && Fp6ToF32<true>::kMag[1] == 0.125f);
static_assert(Fp6ToF32<false>::kMag[31] == 28.0f && Fp6ToF32<false>::kMag[1] == 0.0625f);

}  // namespace
}  // namespace qmoe::cpu
