// qmoe numeric formats: the one definition of every element / scale format and of the block
// quantizers (spec: shared/spec/quark-moe.md §10, checkpoint-format.md §4). Pure functions,
// usable on host and device (QMOE_HD). Every kernel bit trick is tested against these.
//
// Conventions
//  * Element codes are unsigned bytes: sign bit on top of the format's bits
//    (E2M1: bit 3, FP6: bit 5, FP8: bit 7).
//  * Encoders round to nearest, ties to even, and saturate to the format's largest finite value
//    (E2M1 6, E2M3 7.5, E3M2 28, E4M3FN 448, E5M2 57344). Values that round to zero encode as +0
//    (code 0), as Quark does (spec §16.9). NaN: E4M3FN → 0x7F, E5M2 → 0x7E; E2M1 / FP6 have no NaN
//    and encode NaN as +max (like PTX cvt.satfinite). BF16 / FP16 are IEEE conversions (RNE,
//    overflow → Inf, NaN kept, sign of zero kept).
//  * Divisions are IEEE round-to-nearest (spec §16.8). Never compile this with fast-math.
#pragma once

#include <cstdint>
#include <cstring>
#include <cmath>

#if defined(__CUDACC__)
#define QMOE_HD __host__ __device__ __forceinline__
#else
#define QMOE_HD inline
#endif

namespace qmoe {

// ---------------------------------------------------------------------------------------------
// Bit casts
QMOE_HD uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
QMOE_HD float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Generic small-float rounding. For a finite magnitude a ≥ 0 returns the unsigned code of the
// nearest value (ties to even) of a format with `mbits` mantissa bits and exponent bias `bias`
// (subnormals included), saturated to `max_code`. The code layout is exponent field << mbits |
// mantissa, with exponent field 0 for subnormals — true for every format here.
QMOE_HD uint32_t minifloat_round_magnitude(float a, int mbits, int bias, uint32_t max_code) {
  if (!(a > 0.0f)) return 0u;           // +0, -0 handled by the caller's sign logic
  if (a > 3.0e38f) return max_code;     // Inf or near-overflow: saturate
  const int emin = 1 - bias;            // exponent of the smallest normal
  int e2;
  frexpf(a, &e2);                       // a = f · 2^e2, f ∈ [0.5, 1)
  int ex = e2 - 1;                      // floor(log2 a)
  if (ex < emin) ex = emin;
  const int max_ex = emin + 40;         // far beyond any format's range here: saturate
  if (ex > max_ex) return max_code;
  // a · 2^(mbits-ex) is exact (power-of-two scaling); rintf rounds ties to even.
  const float n = rintf(ldexpf(a, mbits - ex));
  const uint32_t code = (static_cast<uint32_t>(ex - emin) << mbits) + static_cast<uint32_t>(n);
  return code > max_code ? max_code : code;
}

// Value of an unsigned code (no sign bit) of such a format.
QMOE_HD float minifloat_decode_magnitude(uint32_t code, int mbits, int bias) {
  const uint32_t e = code >> mbits;
  const uint32_t m = code & ((1u << mbits) - 1u);
  if (e == 0) return ldexpf(static_cast<float>(m), 1 - bias - mbits);
  return ldexpf(static_cast<float>(m + (1u << mbits)), static_cast<int>(e) - bias - mbits);
}

// ---------------------------------------------------------------------------------------------
// FP4 E2M1 (OCP MX / NVFP4 element): 1 sign, 2 exponent (bias 1), 1 mantissa; max 6; no Inf/NaN.
constexpr float kFp4Max = 6.0f;
QMOE_HD float fp4_e2m1_decode(uint8_t code) {
  const float mag = minifloat_decode_magnitude(code & 7u, 1, 1);
  return (code & 8u) ? -mag : mag;
}
QMOE_HD uint8_t fp4_e2m1_encode(float x) {
  if (x != x) return 7;  // NaN → +max
  const uint32_t c = minifloat_round_magnitude(fabsf(x), 1, 1, 7u);
  return static_cast<uint8_t>((c != 0 && x < 0.0f) ? (c | 8u) : c);
}

// FP6 E2M3: 1 sign, 2 exponent (bias 1), 3 mantissa; max 7.5.
constexpr float kFp6E2M3Max = 7.5f;
QMOE_HD float fp6_e2m3_decode(uint8_t code) {
  const float mag = minifloat_decode_magnitude(code & 0x1Fu, 3, 1);
  return (code & 0x20u) ? -mag : mag;
}
QMOE_HD uint8_t fp6_e2m3_encode(float x) {
  if (x != x) return 0x1F;
  const uint32_t c = minifloat_round_magnitude(fabsf(x), 3, 1, 0x1Fu);
  return static_cast<uint8_t>((c != 0 && x < 0.0f) ? (c | 0x20u) : c);
}

// FP6 E3M2: 1 sign, 3 exponent (bias 3), 2 mantissa; max 28.
constexpr float kFp6E3M2Max = 28.0f;
QMOE_HD float fp6_e3m2_decode(uint8_t code) {
  const float mag = minifloat_decode_magnitude(code & 0x1Fu, 2, 3);
  return (code & 0x20u) ? -mag : mag;
}
QMOE_HD uint8_t fp6_e3m2_encode(float x) {
  if (x != x) return 0x1F;
  const uint32_t c = minifloat_round_magnitude(fabsf(x), 2, 3, 0x1Fu);
  return static_cast<uint8_t>((c != 0 && x < 0.0f) ? (c | 0x20u) : c);
}

// FP8 E4M3FN: bias 7, max 448, no Inf, NaN = S.1111.111.
constexpr float kFp8E4M3Max = 448.0f;
QMOE_HD float fp8_e4m3_decode(uint8_t code) {
  if ((code & 0x7Fu) == 0x7Fu) return NAN;
  const float mag = minifloat_decode_magnitude(code & 0x7Fu, 3, 7);
  return (code & 0x80u) ? -mag : mag;
}
QMOE_HD uint8_t fp8_e4m3_encode(float x) {
  if (x != x) return 0x7F;
  const uint32_t c = minifloat_round_magnitude(fabsf(x), 3, 7, 0x7Eu);
  return static_cast<uint8_t>((c != 0 && x < 0.0f) ? (c | 0x80u) : c);
}

// FP8 E5M2: bias 15, max 57344, exponent 31 = Inf / NaN (decoded as such; the encoder saturates).
constexpr float kFp8E5M2Max = 57344.0f;
QMOE_HD float fp8_e5m2_decode(uint8_t code) {
  const uint32_t mag_code = code & 0x7Fu;
  float mag;
  if ((mag_code >> 2) == 31u) {
    mag = (mag_code & 3u) ? NAN : INFINITY;
  } else {
    mag = minifloat_decode_magnitude(mag_code, 2, 15);
  }
  return (code & 0x80u) ? -mag : mag;
}
QMOE_HD uint8_t fp8_e5m2_encode(float x) {
  if (x != x) return 0x7E;
  const uint32_t c = minifloat_round_magnitude(fabsf(x), 2, 15, 0x7Bu);
  return static_cast<uint8_t>((c != 0 && x < 0.0f) ? (c | 0x80u) : c);
}

// E8M0 scale: byte s means 2^(s-127); 255 is NaN.
QMOE_HD float e8m0_decode(uint8_t s) { return s == 255 ? NAN : ldexpf(1.0f, static_cast<int>(s) - 127); }
// Byte of the power of two 2^e, e ∈ [-127, 127].
QMOE_HD uint8_t e8m0_from_exponent(int e) { return static_cast<uint8_t>(e + 127); }

// BF16 (IEEE-style: RNE, overflow to Inf, NaN kept quiet).
QMOE_HD float bf16_decode(uint16_t b) { return bits_to_f32(static_cast<uint32_t>(b) << 16); }
QMOE_HD uint16_t bf16_encode(float x) {
  const uint32_t u = f32_to_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}
QMOE_HD float bf16_round(float x) { return bf16_decode(bf16_encode(x)); }

// FP16 (IEEE binary16: RNE, overflow to Inf, subnormals, NaN kept).
QMOE_HD float fp16_decode(uint16_t h) {
  const uint32_t mag_code = h & 0x7FFFu;
  float mag;
  if ((mag_code >> 10) == 31u) {
    mag = (mag_code & 0x3FFu) ? NAN : INFINITY;
  } else {
    mag = minifloat_decode_magnitude(mag_code, 10, 15);
  }
  return (h & 0x8000u) ? -mag : mag;
}
QMOE_HD uint16_t fp16_encode(float x) {
  const uint16_t sign = (f32_to_bits(x) >> 16) & 0x8000u;
  if (x != x) return static_cast<uint16_t>(sign | 0x7E00u);
  const float a = fabsf(x);
  // 65520 is the midpoint between 65504 (max) and 65536: from there on RNE overflows to Inf.
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00u);
  const uint32_t c = minifloat_round_magnitude(a, 10, 15, 0x7BFFu);
  return static_cast<uint16_t>(sign | c);
}
QMOE_HD float fp16_round(float x) { return fp16_decode(fp16_encode(x)); }

// ---------------------------------------------------------------------------------------------
// Packing (along the last / input dimension).
// FP4: byte j = code[2j] | code[2j+1] << 4 (even element in the low nibble). n must be even.
QMOE_HD void pack_fp4(const uint8_t* codes, int64_t n, uint8_t* out) {
  for (int64_t j = 0; j < n / 2; ++j)
    out[j] = static_cast<uint8_t>((codes[2 * j] & 0xF) | ((codes[2 * j + 1] & 0xF) << 4));
}
QMOE_HD void unpack_fp4(const uint8_t* packed, int64_t n, uint8_t* codes) {
  for (int64_t j = 0; j < n / 2; ++j) {
    codes[2 * j] = packed[j] & 0xF;
    codes[2 * j + 1] = packed[j] >> 4;
  }
}
QMOE_HD uint8_t fp4_code_at(const uint8_t* packed, int64_t i) {
  return (i & 1) ? (packed[i >> 1] >> 4) : (packed[i >> 1] & 0xF);
}
// FP6: 4 codes → 24-bit word v0 | v1<<6 | v2<<12 | v3<<18, stored little endian in 3 bytes.
// n must be a multiple of 4.
QMOE_HD void pack_fp6(const uint8_t* codes, int64_t n, uint8_t* out) {
  for (int64_t g = 0; g < n / 4; ++g) {
    const uint32_t w = (codes[4 * g] & 0x3Fu) | (uint32_t(codes[4 * g + 1] & 0x3Fu) << 6) |
                       (uint32_t(codes[4 * g + 2] & 0x3Fu) << 12) | (uint32_t(codes[4 * g + 3] & 0x3Fu) << 18);
    out[3 * g] = static_cast<uint8_t>(w);
    out[3 * g + 1] = static_cast<uint8_t>(w >> 8);
    out[3 * g + 2] = static_cast<uint8_t>(w >> 16);
  }
}
QMOE_HD void unpack_fp6(const uint8_t* packed, int64_t n, uint8_t* codes) {
  for (int64_t g = 0; g < n / 4; ++g) {
    const uint32_t w = packed[3 * g] | (uint32_t(packed[3 * g + 1]) << 8) | (uint32_t(packed[3 * g + 2]) << 16);
    codes[4 * g] = w & 0x3F;
    codes[4 * g + 1] = (w >> 6) & 0x3F;
    codes[4 * g + 2] = (w >> 12) & 0x3F;
    codes[4 * g + 3] = (w >> 18) & 0x3F;
  }
}
QMOE_HD uint8_t fp6_code_at(const uint8_t* packed, int64_t i) {
  const int64_t g = i >> 2;
  const uint32_t w = packed[3 * g] | (uint32_t(packed[3 * g + 1]) << 8) | (uint32_t(packed[3 * g + 2]) << 16);
  return (w >> (6 * (i & 3))) & 0x3F;
}

// ---------------------------------------------------------------------------------------------
// OCP MX block quantization (block of 32 along K, E8M0 shared exponent).
enum class MxElem : uint8_t { Fp4E2M1, Fp6E2M3, Fp6E3M2, Fp8E4M3 };
enum class MxScaleMode : uint8_t { Even, Floor, Ceil };
constexpr int kMxBlock = 32;

QMOE_HD int mx_elem_mbits(MxElem e) {
  return e == MxElem::Fp4E2M1 ? 1 : e == MxElem::Fp6E3M2 ? 2 : 3;
}
// emax: exponent of the element format's largest power of two.
QMOE_HD int mx_elem_emax(MxElem e) {
  return e == MxElem::Fp4E2M1 ? 2 : e == MxElem::Fp6E2M3 ? 2 : e == MxElem::Fp6E3M2 ? 4 : 8;
}
QMOE_HD float mx_elem_max(MxElem e) {
  return e == MxElem::Fp4E2M1 ? kFp4Max : e == MxElem::Fp6E2M3 ? kFp6E2M3Max
       : e == MxElem::Fp6E3M2 ? kFp6E3M2Max : kFp8E4M3Max;
}
QMOE_HD uint8_t mx_elem_encode(MxElem e, float x) {
  switch (e) {
    case MxElem::Fp4E2M1: return fp4_e2m1_encode(x);
    case MxElem::Fp6E2M3: return fp6_e2m3_encode(x);
    case MxElem::Fp6E3M2: return fp6_e3m2_encode(x);
    default: return fp8_e4m3_encode(x);
  }
}
QMOE_HD float mx_elem_decode(MxElem e, uint8_t c) {
  switch (e) {
    case MxElem::Fp4E2M1: return fp4_e2m1_decode(c);
    case MxElem::Fp6E2M3: return fp6_e2m3_decode(c);
    case MxElem::Fp6E3M2: return fp6_e3m2_decode(c);
    default: return fp8_e4m3_decode(c);
  }
}

// Shared exponent of a block whose max |x| is `amax` (≥ 0, finite), clamped to [-127, 127].
// "even" (Quark's default, spec §10.4): round the amax mantissa to the element's mantissa width
// first, then floor(log2) − emax. For FP4 this bumps the exponent when the amax mantissa ≥ 1.75.
QMOE_HD int mx_shared_exponent(float amax, MxElem e, MxScaleMode mode) {
  int ex;  // floor(log2(value)) of the (rounded) amax
  if (mode == MxScaleMode::Even) {
    if (amax == 0.0f) {
      ex = -126;  // Quark: value = 2^-126 for an all-zero block
    } else {
      uint32_t bits = f32_to_bits(amax) + (1u << (22 - mx_elem_mbits(e)));
      bits &= 0x7F800000u;
      const int field = static_cast<int>(bits >> 23);
      if (field == 255) return 127;  // the rounded amax overflowed to +Inf: log2 = Inf, clamped (§10.4)
      ex = field == 0 ? -127 : field - 127;  // subnormal amax stays below 2^-126
    }
  } else {
    if (amax == 0.0f) {
      ex = -127;
    } else {
      int e2;
      const float f = frexpf(amax, &e2);  // amax = f·2^e2, f ∈ [0.5,1)
      ex = e2 - 1;                          // floor(log2 amax)
      if (mode == MxScaleMode::Ceil && f != 0.5f) ex += 1;
    }
  }
  int shared = ex - mx_elem_emax(e);
  if (shared < -127) shared = -127;
  if (shared > 127) shared = 127;
  return shared;
}

// Byte Quark stores for a block quantized with shared exponent `e`: its to_e8m0_uint8 clamps
// log2 at -126, so e = -127 is written as byte 1 (checkpoint-format §4.3).
QMOE_HD uint8_t mx_scale_byte_quark(int e) { return e8m0_from_exponent(e < -126 ? -126 : e); }

// Quantize one block of n ≤ 32 values: writes n element codes, returns the shared exponent.
QMOE_HD int mx_quantize_block(const float* x, int n, MxElem e, MxScaleMode mode, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const int shared = mx_shared_exponent(amax, e, mode);
  for (int i = 0; i < n; ++i) codes[i] = mx_elem_encode(e, ldexpf(x[i], -shared));
  return shared;
}
// Quantize-dequantize one block (the value a kernel sees after activation quantization).
QMOE_HD void mx_qdq_block(const float* x, int n, MxElem e, MxScaleMode mode, float* out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const int shared = mx_shared_exponent(amax, e, mode);
  for (int i = 0; i < n; ++i) out[i] = ldexpf(mx_elem_decode(e, mx_elem_encode(e, ldexpf(x[i], -shared))), shared);
}

// ---------------------------------------------------------------------------------------------
// NVFP4: E2M1 elements, FP8 E4M3 scale per 16, FP32 global scale.
constexpr int kNvfp4Block = 16;

// Per-tensor dequantization-direction global scale: amax / (6·448) (weight_scale_2, input_scale_2).
QMOE_HD float nvfp4_global_scale(float amax) { return amax / (kFp4Max * kFp8E4M3Max); }

// Weight block (checkpoint-format §4.4): block scale code = fp8(clamp((amax_b/6) / ws2, ±448)),
// elements quantized with the fp8-rounded scale fp8·ws2. Returns the fp8 scale code.
QMOE_HD uint8_t nvfp4_quantize_weight_block(const float* x, int n, float ws2, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
  uint8_t sc = 0;
  if (ws2 > 0.0f) {
    const float s = (amax / kFp4Max) / ws2;
    sc = fp8_e4m3_encode(fminf(fmaxf(s, -kFp8E4M3Max), kFp8E4M3Max));
  }
  const float eff = fp8_e4m3_decode(sc) * ws2;
  for (int i = 0; i < n; ++i) {
    float q = eff > 0.0f ? x[i] / eff : 0.0f;
    q = fminf(fmaxf(q, -kFp4Max), kFp4Max);
    codes[i] = fp4_e2m1_encode(q);
  }
  return sc;
}

// Activation quantization of one block (spec §10.6) with quantization-direction global scale gs
// (= 1 / input_scale_2), the code and the scale kept apart: the block's e2m1 values e2m1[0..n)
// (e2m1 may alias x) and, returned, its fp8 scale sb; the dequantized value is e2m1 · (sb / gs).
QMOE_HD float nvfp4_block_codes(const float* x, int n, float gs, float* e2m1) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
  float s = gs * amax / kFp4Max;
  s = fminf(fmaxf(s, -kFp8E4M3Max), kFp8E4M3Max);
  const float sb = fp8_e4m3_decode(fp8_e4m3_encode(s));
  const float inv = sb == 0.0f ? 0.0f : gs / sb;
  for (int i = 0; i < n; ++i) {
    float q = x[i] * inv;
    q = fminf(fmaxf(q, -kFp4Max), kFp4Max);
    e2m1[i] = fp4_e2m1_decode(fp4_e2m1_encode(q));
  }
  return sb;
}

// Activation QDQ of one block (spec §10.6): nvfp4_block_codes, dequantized.
QMOE_HD void nvfp4_qdq_block(const float* x, int n, float gs, float* out) {
  const float deq = nvfp4_block_codes(x, n, gs, out) / gs;
  for (int i = 0; i < n; ++i) out[i] *= deq;
}

// ---------------------------------------------------------------------------------------------
// INT8
QMOE_HD int8_t int8_saturate_rne(float v) {  // round half to even, saturate to [-128, 127]
  if (v != v) return 0;
  float r = rintf(v);
  r = fminf(fmaxf(r, -128.0f), 127.0f);
  return static_cast<int8_t>(r);
}
// roundf is exact; floor(v + 0.5) is not (0.49999997f + 0.5f rounds up to 1.0f in fp32).
QMOE_HD float round_half_away(float v) { return roundf(v); }

// Quark symmetric weight scale: amax / 127.5, at least FLT_EPSILON.
QMOE_HD float int8_weight_scale(float amax) {
  const float s = amax / 127.5f;
  return s < 1.1920928955078125e-07f ? 1.1920928955078125e-07f : s;
}
QMOE_HD int8_t int8_quantize_weight(float x, float scale) { return int8_saturate_rne(x * (1.0f / scale)); }
// Static activation: sat(rne(x / s)).
QMOE_HD int8_t int8_quantize_static(float x, float s) { return int8_saturate_rne(x / s); }
// Dynamic per-token: scale = max(absmax, 1e-10) / 127, q = round_half_away(x · (127 / max(absmax, 1e-10))).
QMOE_HD float int8_token_scale(float absmax) { return fmaxf(absmax, 1e-10f) / 127.0f; }
QMOE_HD float int8_token_inv_scale(float absmax) { return 127.0f / fmaxf(absmax, 1e-10f); }
QMOE_HD int8_t int8_quantize_token(float x, float inv_scale) {
  float r = round_half_away(x * inv_scale);
  r = fminf(fmaxf(r, -127.0f), 127.0f);
  return static_cast<int8_t>(r);
}

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 with float scales
// Weight scale (per tensor / per channel): amax / 448 (FLT_EPSILON when amax is 0).
QMOE_HD float fp8_weight_scale(float amax) {
  const float s = amax / kFp8E4M3Max;
  return s < 1.1920928955078125e-07f ? 1.1920928955078125e-07f : s;
}
QMOE_HD uint8_t fp8_quantize_weight(float x, float scale) {
  return fp8_e4m3_encode(fminf(fmaxf(x / scale, -kFp8E4M3Max), kFp8E4M3Max));
}
// Activations (static scalar or dynamic): q = fp8(clamp(x · (1/s), ±448)).
QMOE_HD uint8_t fp8_quantize_act(float x, float inv_scale) {
  return fp8_e4m3_encode(fminf(fmaxf(x * inv_scale, -kFp8E4M3Max), kFp8E4M3Max));
}
// Dynamic per-token scale: max(absmax/448, 1/(448·512)).
QMOE_HD float fp8_token_scale(float absmax) {
  return fmaxf(absmax / kFp8E4M3Max, 1.0f / (kFp8E4M3Max * 512.0f));
}
// Dynamic per-tensor scale: absmax / 448 (FLT_EPSILON-floored so an all-zero tensor stays finite).
QMOE_HD float fp8_tensor_scale(float absmax) {
  const float s = absmax / kFp8E4M3Max;
  return s < 1.1920928955078125e-07f ? 1.1920928955078125e-07f : s;
}

}  // namespace qmoe
