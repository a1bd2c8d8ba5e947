// FP4 (E2M1) and FP6 (E2M3, E3M2) weights as the CUDA GEMM kernels store and decode them: the
// bit layout of a fragment word and the kernel form of the block scales. Host and device (QMOE_HD), no CUDA
// headers, so that the CPU tests check every code and scale byte in CI (tests/formats).
//
// Decode. An E2M1 code s·e1·e0·m read as bf16 with e1 e0 m at bits 8..6 and s at bit 15 is
// exactly e2m1 · 2^−126 (e = 0 gives the bf16 subnormal m · 2^−127 = (m · 0.5) · 2^−126). So a
// bf16x2 operand of two codes is a shift and a mask of the stored word (at most 2 integer ops)
// and one bf16x2 multiply by the block scale, pre-multiplied by 2^126 (all exact: the products
// have ≤ 6 significant bits and stay in the bf16 normal range, see the scale forms below).
//
// Fragment word (32 bits, 8 codes) = the four bf16x2 registers a0..a3 of one lane's
// m16n8k16 A fragment: a0 = (row g, k 2c, 2c+1), a1 = (row g+8, same k), a2 = (row g, k 2c+8,
// 2c+9), a3 = (row g+8, k 2c+8, 2c+9). Register j's low / high element keeps its 3 magnitude
// bits from bit kFp4MagBit[j][·] up and its sign at kFp4SignBit[j][·]; the positions are chosen
// so that a0 is w & M, a1 (w << 3) & M, a2 ((w & F2) · 66) & M (the product is (x << 6) | (x << 1)
// with no carries: magnitudes up 6, signs up 1, one IMAD where two shifts and a mask were) and a3
// one shift for the signs and one for the magnitudes (fp4_frag_decode): 10 integer operations per
// word. No single shift-and-mask per register can cover all 32 bits (the 8-bit mask 0x81C081C0
// does not tile a 32-bit word; an exhaustive search over shift, two-shift and multiply forms
// finds no layout under 10).
//
// Block scales, one byte per block in the kernel's scale stream, turned into a bf16x2 multiplier
// by one byte permute and one shift (or multiply-add):
//  * MXFP4 (E8M0 s, 2^(s−127)): byte f = s + 126 − c, multiplier bits f << 7 = 2^(s−1−c); the
//    per-expert shift c ≥ 0 keeps f ≤ 254 (c = max(0, s_max − 128)) and moves 2^c into the
//    expert's fp32 epilogue factor. Products e2m1 · 2^(s−127−c) are exact while
//    s_min + 5 ≥ c (mx_fp4_shift checks it; blocks whose codes are all ±0 don't count).
//  * NVFP4 (E4M3 scale v ∈ [2^−9, 448]): multiplier v · 2^118 (bf16 exponent field F ∈ [236,
//    253], 3 mantissa bits m); byte = (F − 236) << 3 | m, bits = (byte << 4) + (236 << 7). The
//    2^−8 left over goes into the epilogue factor (kNvfp4EpilogueScale). A zero scale becomes
//    zero codes (byte 0), a negative one flips the block's code signs at repack.
//
// FP6 in two planes. A 5-bit magnitude read as bf16 bits 8..4 (E2M3: e1 e0 m2 m1 m0) or 9..5
// (E3M2: e2 e1 e0 m1 m0) with the sign at bit 15 is exactly value · 2^−126 (E2M3) or · 2^−124
// (E3M2), subnormals included, by the same argument. The sign and three magnitude bits that land
// at bits 8..6 (E2M3: e1 e0 m2; E3M2: e1 e0 m1) form a 4-bit code stored in an FP4 fragment word
// (decoded by fp4_frag_decode); the other two bits (E2M3: m1 m0 → bits 5, 4; E3M2: e2 → 9,
// m0 → 5) of all 8 registers of the two m-fragments of a k16 step sit in one 32-bit plane-2 word,
// register slot t = 4·mt + j at positions kFp6Mask2 shifted by kFp6Shift2[t] (the 8 translates
// tile the word), so each register costs one shift and one or-under-mask more than FP4. The
// multiplier is the MX one with bias 126 (E2M3) / 124 (E3M2) in place of FP4's 126.
#pragma once

#include <cstdint>

#include "qmoe/formats.h"

namespace qmoe::cuda {

constexpr int kFp4MagBit[4][2] = {{6, 22}, {3, 19}, {0, 16}, {9, 25}};
constexpr int kFp4SignBit[4][2] = {{15, 31}, {12, 28}, {14, 30}, {13, 29}};

// Place code (4 bits) as element h (0 = low, 1 = high half) of register j in a fragment word
// (host: the upload's repack and the tests).
inline uint32_t fp4_frag_place(uint32_t code, int j, int h) {
  return ((code & 7u) << kFp4MagBit[j][h]) | (((code >> 3) & 1u) << kFp4SignBit[j][h]);
}

// Fragment word → a0..a3 as bf16x2 bit patterns of e2m1 · 2^−126.
QMOE_HD void fp4_frag_decode(uint32_t w, uint32_t (&o)[4]) {
  constexpr uint32_t kM = 0x81C081C0u, kMag = 0x01C001C0u, kSign = 0x80008000u;
  o[0] = w & kM;
  o[1] = (w << 3) & kM;
  o[2] = ((w & 0x40074007u) * 66u) & kM;  // register 2's bits (magnitudes 0, 16; signs 14, 30)
  o[3] = ((w << 2) & kSign) | ((w >> 3) & kMag);
}

// ---- FP6 planes -----------------------------------------------------------------------------
template <bool kE3M2>
struct Fp6Planes {
  static constexpr uint32_t kMask2 = kE3M2 ? 0x02200220u : 0x00300030u;  // the two bits per element
  static constexpr int kBias = kE3M2 ? 124 : 126;                        // scale byte s + kBias − c
  static constexpr int kMargin = kE3M2 ? 2 : 3;                          // exact while c ≤ s_min + margin
};
// Stored position of plane-2 slot t relative to the decoded one (right shift by this, or left
// by its negative): E2M3 slot t holds bits 2t, 2t+1 (+16); E3M2 bits a, a+4 (+16), a ∈ 0–3, 8–11.
QMOE_HD int fp6_shift2(bool e3m2, int t) { return e3m2 ? ((t < 4 ? t : t + 4) - 5) : (2 * t - 4); }

// Host: the plane-4 code (sign + 3 bits at 8..6) and the plane-2 bits of a 6-bit code as element
// h of register slot t.
inline uint32_t fp6_plane4_code(uint32_t code, bool e3m2) {
  return ((code >> 2) & 8u) | (e3m2 ? (code >> 1) & 7u : (code >> 2) & 7u);
}
inline uint32_t fp6_plane2_place(uint32_t code, bool e3m2, int t, int h) {
  // Decoded positions of the two bits: E2M3 m1 → 5, m0 → 4; E3M2 e2 → 9, m0 → 5 (+16 for h).
  const uint32_t bits = e3m2 ? (((code >> 4) & 1u) << 9) | ((code & 1u) << 5) : (code & 3u) << 4;
  const int sh = fp6_shift2(e3m2, t);
  const uint32_t at = bits << (16 * h);
  return sh >= 0 ? at << sh : at >> -sh;
}

// a0..a3 of one m-fragment: plane-4 word decoded, plane-2 bits of slots 4·mt + j merged in →
// bf16x2 bits of value · 2^−126 (E2M3) / 2^−124 (E3M2).
template <bool kE3M2>
QMOE_HD void fp6_frag_decode(uint32_t w4, uint32_t w2, int mt, uint32_t (&o)[4]) {
  fp4_frag_decode(w4, o);
  for (int j = 0; j < 4; ++j) {  // constant trip count: unrolled, shifts become immediates
    const int sh = fp6_shift2(kE3M2, 4 * mt + j);
    o[j] |= (sh >= 0 ? w2 >> sh : w2 << -sh) & Fp6Planes<kE3M2>::kMask2;
  }
}

// ---- BF16 / INT8 stage rows: the 128-byte swizzle -----------------------------------------------
// Row r's 16-byte chunk q of a 128-byte row sits at chunk position sw128_chunk(r, q): wgmma's and
// TMA's 128B swizzle (address bits 4–6 XOR bits 7–9 inside a 1024-byte-aligned block of 8 rows).
// An involution: the same function maps a stored position back to its chunk.
QMOE_HD constexpr int sw128_chunk(int r, int q) { return (q ^ r) & 7; }

// ---- block scales -------------------------------------------------------------------------
constexpr uint32_t kNvfp4ScaleBase = 236;           // bf16 exponent field of byte 0
constexpr float kNvfp4EpilogueScale = 256.0f;        // 2^8

// Kernel byte of an E8M0 block scale s (s ≠ 255) under the expert's shift c; bias 126 for
// FP4 and FP6 E2M3, 124 for FP6 E3M2.
QMOE_HD uint8_t mx_fp4_scale_byte(uint8_t s, int c, int bias = 126) { return static_cast<uint8_t>(int{s} + bias - c); }

// Kernel byte of a finite, non-zero NVFP4 E4M3 scale magnitude (code & 0x7F in 0x01..0x7E).
QMOE_HD uint8_t nvfp4_scale_byte(uint8_t code) {
  const float v = fp8_e4m3_decode(static_cast<uint8_t>(code & 0x7F)) * 0x1p118f;  // exact, normal
  const uint32_t b = f32_to_bits(v);
  const uint32_t F = ((b >> 23) & 0xFF);  // fp32 and bf16 share the exponent field
  const uint32_t m = (b >> 20) & 7u;      // ≤ 4 significant bits in an E4M3 value
  return static_cast<uint8_t>(((F - kNvfp4ScaleBase) << 3) | m);
}

// bf16x2 multiplier bits of kernel scale byte i (0..3) of a 32-bit scale word.
template <bool kNvfp4>
QMOE_HD uint32_t fp4_scale_bf16x2(uint32_t word, int i) {
  // Byte i into bytes 0 and 2, zeros elsewhere (one byte permute on the device).
#if defined(__CUDA_ARCH__)
  const uint32_t x = __byte_perm(word, 0u, 0x4040u | static_cast<uint32_t>(i) | (static_cast<uint32_t>(i) << 8));
#else
  const uint32_t b = (word >> (8 * i)) & 0xFFu;
  const uint32_t x = b | (b << 16);
#endif
  if constexpr (kNvfp4) return (x << 4) + ((kNvfp4ScaleBase << 7) | (kNvfp4ScaleBase << 23));
  else return x << 7;
}

// The multipliers of two kernel scale bytes of a word in the two halves of one bf16x2: pair 0 holds
// bytes 0 (low half) and 2 (high), pair 1 bytes 1 and 3; byte i's multiplier (fp4_scale_bf16x2(word,
// i), both halves) is half i / 2 of pair i % 2. Two integer operations per pair (MX; three for NVFP4)
// where fp4_scale_bf16x2 takes two per byte; the GEMM multiplies by one half of a pair (a
// half-broadcast operand of HMUL2).
template <bool kNvfp4>
QMOE_HD uint32_t fp4_scale_pair_bf16x2(uint32_t word, int pair) {
  if constexpr (kNvfp4) {
    // byte ≤ 143 (nvfp4_scale_byte): (byte << 4) + (236 << 7) < 2^15 stays inside its half.
    const uint32_t x = pair == 0 ? (word & 0x00FF00FFu) << 4 : (word >> 4) & 0x0FF00FF0u;
    return x + ((kNvfp4ScaleBase << 7) | (kNvfp4ScaleBase << 23));
  } else {
    return pair == 0 ? (word << 7) & 0x7F807F80u : (word >> 1) & 0x7F807F80u;
  }
}

}  // namespace qmoe::cuda
