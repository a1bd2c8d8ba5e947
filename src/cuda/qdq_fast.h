// Quantize-dequantize of one fp32 value through FP4 E2M1, FP6 E2M3 / E3M2 and FP8 E4M3, for the
// device's activation quantizers (row_quant.cuh): bit operations and two fp32 additions in place
// of formats.h's frexpf / ldexpf / rintf walk, which made the activation quantization the slowest
// step of the layer outside the GEMMs (H200, mixtral-8x7b MXFP4 W4A4: 27 µs for one 14336-wide
// row, 1.0 ms of the 7.3 ms layer at T = 4096). Host and device (QMOE_HD), no CUDA headers: the CPU
// tests check it bit for bit against formats.h's encode → decode over every exponent
// (tests/formats/test_cuda_qdq_fast.cc).
//
// Rounding to the format's grid: with k = max(floor(log2 |y|), emin) − mbits the grid step is 2^k;
// for |y| < 2^(k+22), (y + c) − c with c = 1.5 · 2^(k+23) rounds y to a multiple of 2^k, ties to
// even (the sum lies in [2^(k+23), 2^(k+24)), whose fp32 spacing is 2^k, and c / 2^k is even), and
// the subtraction is exact. That is rintf(|y| · 2^−k) · 2^k with y's sign — and +0 where it rounds
// to zero, as the encoders give — then saturation to ±max, as the encoders' max_code does.
#pragma once

#include <cstdint>

#include "qmoe/formats.h"

namespace qmoe::cuda {

// The formats as formats.h's encoders see them: mantissa bits, the smallest normal exponent
// (1 − bias), the largest value, and the MX element kind they are.
struct QdqFp4E2M1 { static constexpr int kMbits = 1, kEmin = 0; static constexpr float kMax = kFp4Max; static constexpr MxElem kElem = MxElem::Fp4E2M1; };
struct QdqFp6E2M3 { static constexpr int kMbits = 3, kEmin = 0; static constexpr float kMax = kFp6E2M3Max; static constexpr MxElem kElem = MxElem::Fp6E2M3; };
struct QdqFp6E3M2 { static constexpr int kMbits = 2, kEmin = -2; static constexpr float kMax = kFp6E3M2Max; static constexpr MxElem kElem = MxElem::Fp6E3M2; };
struct QdqFp8E4M3 { static constexpr int kMbits = 3, kEmin = -6; static constexpr float kMax = kFp8E4M3Max; static constexpr MxElem kElem = MxElem::Fp8E4M3; };

// Correctly rounded fp32 add and multiply that the device compiler neither contracts into an FMA
// nor reassociates.
QMOE_HD float qdq_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
QMOE_HD float qdq_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// 2^n exactly, n ∈ [−149, 127].
QMOE_HD float exp2i(int n) {
  return n >= -126 ? bits_to_f32(static_cast<uint32_t>(n + 127) << 23) : bits_to_f32(1u << (n + 149));
}

// decode(encode(y)) of format F for any y; NaN gives +max (the FP4 / FP6 encoders' code for NaN;
// FP8 goes through qdq_fp8_act below, whose clamp maps NaN to −448 as the reference does).
template <class F>
QMOE_HD float minifloat_qdq(float y) {
  if (!(fabsf(y) < 2.0f * F::kMax)) return (y != y || y > 0.0f) ? F::kMax : -F::kMax;
  int ex = static_cast<int>((f32_to_bits(y) >> 23) & 0xFFu) - 127;  // floor(log2 |y|); −127 for 0 / subnormals
  if (ex < F::kEmin) ex = F::kEmin;
  const float c = bits_to_f32((static_cast<uint32_t>(ex - F::kMbits + 150) << 23) | 0x400000u);  // 1.5 · 2^(k+23)
  const float r = qdq_add(qdq_add(y, c), -c);
  return r > F::kMax ? F::kMax : (r < -F::kMax ? -F::kMax : r);
}

// fp8_quantize_act's clamp of the scaled value to ±448 (NaN → −448: fmaxf keeps the number).
QMOE_HD float fp8_act_clamp(float x, float inv_scale) {
  return fminf(fmaxf(x * inv_scale, -kFp8E4M3Max), kFp8E4M3Max);
}

// fp8_e4m3_decode(fp8_quantize_act(x, inv_scale)): the clamp, then the round trip.
QMOE_HD float qdq_fp8_act(float x, float inv_scale) { return minifloat_qdq<QdqFp8E4M3>(fp8_act_clamp(x, inv_scale)); }

// Where element k of a row goes in an AFmt::E4m3 row: within each 16-element chunk, element
// 2c + i (i = 0, 1) to 4c + i and element 8 + 2c + i to 4c + 2 + i. A k32 step of the e4m3 wgmma
// then meets, in logical slots 4c..4c+3, the row's elements 2c, 2c + 1, 2c + 8, 2c + 9 of each
// 16 — exactly the bytes that the FP8 fragment layout (cuda_common.h) holds in one lane's two words of a
// k16 step, so the kernel builds its A registers with two byte permutes and no decode.
QMOE_HD constexpr int e4m3_act_pos(int k) {
  return (k & ~15) | ((k & 7) >> 1) * 4 | ((k >> 3) & 1) * 2 | (k & 1);
}

// The E4M3FN code of a value E4M3 holds exactly (a qdq_fp8_act result), by bit operations: the
// code fp8_quantize_act gives for the same input (±0 as +0, like fp8_e4m3_encode).
QMOE_HD uint8_t e4m3_code(float y) {
  const uint32_t b = f32_to_bits(y);
  const float a = fabsf(y);
  const uint32_t mag = a < 0x1p-6f ? static_cast<uint32_t>(a * 0x1p9f)  // subnormal: m · 2^−9, m < 8
                                   : ((((b >> 23) & 0xFFu) - 120u) << 3) | ((b >> 20) & 7u);
  return static_cast<uint8_t>(mag == 0 ? 0u : (((b >> 24) & 0x80u) | mag));
}

// The E4M3 codes of two activation values (a → low byte, b → high byte) by the bit walk above:
// e4m3_code(qdq_fp8_act(·, inv_scale)) of each (the reference the hardware form is tested against).
QMOE_HD uint16_t e4m3x2_act_codes_sw(float a, float b, float inv_scale) {
  return static_cast<uint16_t>(e4m3_code(qdq_fp8_act(a, inv_scale)) |
                               (static_cast<uint32_t>(e4m3_code(qdq_fp8_act(b, inv_scale))) << 8));
}
// The same codes, on sm_89 and later by the hardware conversion: the clamp to ±448 first (NaN →
// −448, as the reference does), cvt.rn.satfinite.e4m3x2.f32 (round to nearest even, subnormals,
// saturation), then ±0 as +0 — about 30 fewer instructions per value than the bit walk, which the
// activation kernel of an FP8 layer spent most of its time on (bench/RESULTS.md 2026-12-06, session
// 39). CudaDecode.E4m3HardwareCodesMatchTheBitWalk checks the two agree.
QMOE_HD uint16_t e4m3x2_act_codes(float a, float b, float inv_scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float ya = fp8_act_clamp(a, inv_scale), yb = fp8_act_clamp(b, inv_scale);
  uint16_t c;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(c) : "f"(ya), "f"(yb));
  const uint32_t w = c;
  const uint32_t nonzero = ((w & 0x7F7Fu) + 0x7F7Fu) & 0x8080u;  // bit 7 of each byte whose magnitude is not 0
  return static_cast<uint16_t>(w & (0x7F7Fu | nonzero));
#else
  return e4m3x2_act_codes_sw(a, b, inv_scale);
#endif
}
// One value's code (the low byte of the pair form).
QMOE_HD uint8_t e4m3_act_code(float x, float inv_scale) {
  return static_cast<uint8_t>(e4m3x2_act_codes(x, 0.0f, inv_scale));
}

// One element of an MX block with shared exponent `shared` ∈ [−127, 127]: the value formats.h's
// mx_qdq_block gives, ldexpf(decode(encode(ldexpf(x, −shared))), shared).
template <class F>
QMOE_HD float mx_qdq(float x, int shared) {
  return qdq_mul(minifloat_qdq<F>(qdq_mul(x, exp2i(-shared))), exp2i(shared));
}

}  // namespace qmoe::cuda
