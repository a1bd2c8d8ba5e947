// In-register weight decode for the GEMM kernels: 32 stored elements → 16 bf16x2 words (fp16x2
// for FP8) (element 2i in the low half of word i). Every function here is checked code by code against formats.h
// (tests/cuda/test_decode.cu). All results are exact: each format's values times its block scale
// have at most 6 significant bits, so the bf16 conversion does not round (for scales inside the
// bf16 normal range).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace qmoe::cuda {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// E8M0 byte → 2^(s−127) (s = 0: 2^−127, a float subnormal; 255: NaN), as formats.h e8m0_decode.
__device__ __forceinline__ float e8m0_to_f32(uint32_t s) {
  return s == 0u ? __uint_as_float(0x00400000u) : s == 255u ? __uint_as_float(0x7FC00000u) : __uint_as_float(s << 23);
}

// FP8 E4M3FN code → float. The exponent field lands in fp32's, the subnormals come out right
// because fp32 bits (m << 20) with exponent 0 are m·2^−129; × 2^120 gives m·2^−9.
__device__ __forceinline__ float fp8_e4m3_to_f32_nonan(uint32_t c) {
  return __uint_as_float(((c & 0x7Fu) << 20) | ((c & 0x80u) << 24)) * 0x1p120f;
}
__device__ __forceinline__ float fp8_e4m3_to_f32(uint32_t c) {
  return (c & 0x7Fu) == 0x7Fu ? __uint_as_float(0x7FC00000u) : fp8_e4m3_to_f32_nonan(c);
}

// E2M1 nibble (low 4 bits of `n`, other bits ignored) → value · 2^−126 as fp32 bits:
// (m << 22) puts the 2 exponent + 1 mantissa bits at the top of fp32's mantissa / bottom of the
// exponent, so fp32(bits) = e2m1(m) · 2^−126 for every m (0.5 is the float subnormal 2^−127).
__device__ __forceinline__ float e2m1_lo_nibble_scaled(uint32_t b) {
  return __uint_as_float(((b & 7u) << 22) | ((b & 8u) << 28));
}
__device__ __forceinline__ float e2m1_hi_nibble_scaled(uint32_t b) {
  return __uint_as_float(((b & 0x70u) << 18) | ((b & 0x80u) << 24));
}

// 4 E2M1 codes in the low 16 bits of x (code i at bits 4i..4i+3) → bf16 pairs (e0, e1), (e2, e3).
// The magnitude (3 bits) indexes two 8-byte tables with a byte permute: the low and the high
// byte of bf16(0, 0.5, 1, 1.5, 2, 3, 4, 6); the sign bit moves to bit 15 / 31.
__device__ __forceinline__ void e2m1x4_to_bf16x4(uint32_t x, uint32_t& o01, uint32_t& o23) {
  const uint32_t sel = x & 0x7777u;
  const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel);
  const uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
  o01 = __byte_perm(lo, hi, 0x5140u) | ((x << 12) & 0x8000u) | ((x << 24) & 0x80000000u);
  o23 = __byte_perm(lo, hi, 0x7362u) | ((x << 4) & 0x8000u) | ((x << 16) & 0x80000000u);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t v, __nv_bfloat162 m) {
  __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v);
  b = __hmul2(b, m);  // exact: ≤ 6 significant bits, products of a power of two or an fp8 value
  return *reinterpret_cast<const uint32_t*>(&b);
}

__device__ __forceinline__ uint32_t bf16x2_mul_bits(uint32_t v, uint32_t m) {
  return bf16x2_mul(v, *reinterpret_cast<const __nv_bfloat162*>(&m));
}

// E8M0 byte → bf16x2 (2^(s−127) in both halves; s = 0: the bf16 subnormal 2^−127; 255: NaN).
__device__ __forceinline__ __nv_bfloat162 e8m0_to_bf16x2(uint32_t s) {
  const uint32_t b = s == 0u ? 0x0040u : s == 255u ? 0x7FC0u : (s << 7);
  const uint32_t w = b | (b << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&w);
}

// 32 FP4 E2M1 codes (16 bytes as 4 words; element 2j in the low nibble of byte j) times mul0
// (elements 0..15) and mul1 (16..31); the multipliers must be exact in bf16 (E8M0 / FP8 values).
__device__ __forceinline__ void decode_fp4_x32(const uint32_t (&w)[4], float mul0, float mul1, uint32_t (&out)[16]) {
  const __nv_bfloat162 m0 = __float2bfloat162_rn(mul0), m1 = __float2bfloat162_rn(mul1);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 m = i < 2 ? m0 : m1;
    uint32_t a, b, c, d;
    e2m1x4_to_bf16x4(w[i], a, b);
    e2m1x4_to_bf16x4(w[i] >> 16, c, d);
    out[i * 4 + 0] = bf16x2_mul(a, m);
    out[i * 4 + 1] = bf16x2_mul(b, m);
    out[i * 4 + 2] = bf16x2_mul(c, m);
    out[i * 4 + 3] = bf16x2_mul(d, m);
  }
}

// FP6 code (6 bits) → value. E2M3: (c & 0x1F) << 20 places mmm at fp32 mantissa bits 22..20
// and ee at exponent bits 24..23, so fp32(bits) = value · 2^−126. E3M2: << 21, value · 2^−124.
template <bool kE3M2>
__device__ __forceinline__ float fp6_to_f32(uint32_t c) {
  const uint32_t bits = ((c & 0x1Fu) << (kE3M2 ? 21 : 20)) | ((c & 0x20u) << 26);
  return __uint_as_float(bits) * (kE3M2 ? 0x1p124f : 0x1p126f);
}

// 32 FP6 codes packed 4-in-3 bytes (24 bytes as 6 little-endian words: code i at bit 6i) × mul.
template <bool kE3M2>
__device__ __forceinline__ void decode_fp6_x32(const uint32_t (&w)[6], float mul, uint32_t (&out)[16]) {
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    const int o = 24 * g;
    const int idx = o >> 5, sh = o & 31;
    const uint32_t lo = w[idx];
    const uint32_t hi = (idx + 1 < 6) ? w[idx + 1 < 6 ? idx + 1 : 5] : 0u;
    const uint32_t v = __funnelshift_r(lo, hi, sh);
    const float f0 = fp6_to_f32<kE3M2>(v) * mul;
    const float f1 = fp6_to_f32<kE3M2>(v >> 6) * mul;
    const float f2 = fp6_to_f32<kE3M2>(v >> 12) * mul;
    const float f3 = fp6_to_f32<kE3M2>(v >> 18) * mul;
    out[2 * g] = pack_bf16x2(f0, f1);
    out[2 * g + 1] = pack_bf16x2(f2, f3);
  }
}

// 32 FP8 E4M3 codes (32 bytes as 8 words, element i = byte i) → 16 fp16x2 words (exact: every
// e4m3 value is an fp16 value), by the hardware cvt.rn.f16x2.e4m3x2. Scales come after the GEMM.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  uint32_t r;
  const unsigned short in = static_cast<unsigned short>(two_bytes);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(in));
  return r;
}
__device__ __forceinline__ void decode_fp8_x32(const uint32_t (&w)[8], uint32_t (&out)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    out[2 * i] = e4m3x2_to_f16x2(w[i] & 0xFFFFu);
    out[2 * i + 1] = e4m3x2_to_f16x2(w[i] >> 16);
  }
}

}  // namespace qmoe::cuda
