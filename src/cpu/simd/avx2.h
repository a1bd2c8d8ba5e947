// The AVX2 target of the CPU kernels (AVX2 + FMA + F16C): include only from translation units
// compiled with the AVX2 flags (*_avx2.cc). Everything is in an anonymous namespace (internal
// linkage), so no AVX2 instance of these functions can be picked by the linker for another
// translation unit.
//   vector    __m256 (8 fp32 lanes), __m256i
//   rows      2 weight rows × ≤ 4 tokens per micro-kernel
//   I8 step   int8 sign-extended to int16, vpmaddwd into int32 (exact; vpmaddubsw could
//             saturate), 16 codes per step
#pragma once

// GCC 12's AVX-512 headers implement the "undefined upper bits" casts with self-initialised
// variables, which -Wuninitialized (-Werror) flags inside the intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning (clang would warn about the unknown group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/kernel_iface.h"
#include "cpu/simd/common.h"

namespace qmoe::cpu {
namespace {


inline float hsum(__m256 v) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
inline int32_t hsum_epi32(__m256i v) {
  const __m128i b = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i c = _mm_add_epi32(b, _mm_unpackhi_epi64(b, b));
  return _mm_cvtsi128_si32(_mm_add_epi32(c, _mm_shuffle_epi32(c, 1)));
}

// Avx2::w6_weights' byte shuffles: 16-bit lane q of pass P (code 8P + q of the 128-bit lane's block)
// ← the two bytes holding the code, relative to the pass's load (bytes 0..15 of the block for passes
// 0 and 1, bytes 8..23 for passes 2 and 3; code 31 lies in bits 2..7 of byte 23 alone).
struct W6Idx {
  alignas(32) char t[4][32];
};
constexpr W6Idx make_w6_idx() {
  W6Idx x{};
  for (int pass = 0; pass < 4; ++pass)
    for (int h = 0; h < 2; ++h)
      for (int q = 0; q < 8; ++q) {
        const int code = 8 * pass + q, byte = 6 * code / 8 - (pass >= 2 ? 8 : 0);
        x.t[pass][16 * h + 2 * q] = static_cast<char>(byte);
        x.t[pass][16 * h + 2 * q + 1] = byte + 1 < 16 ? static_cast<char>(byte + 1) : static_cast<char>(-128);
      }
  return x;
}
constexpr W6Idx kW6Idx = make_w6_idx();

// FP6 codes to the top of 16-bit lanes (Avx2::dec_fp6, Avx2::w6_weights): the byte shuffle `sel`
// puts the two bytes that hold code j in 16-bit lane j, where it starts at bit 0, 6, 4 or 2 (j % 4
// = 0..3); one vpmullw by a per-lane power of two moves it to bits 10..15 (the bits above drop out
// of the lane).
inline __m256i fp6_codes_to_top(__m256i bytes, __m256i sel) {
  const __m256i to_top = _mm256_setr_epi16(1 << 10, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 4,
                                           1 << 6, 1 << 8, 1 << 10, 1 << 4, 1 << 6, 1 << 8);
  return _mm256_mullo_epi16(_mm256_shuffle_epi8(bytes, sel), to_top);
}

// Copies n ≤ size bytes at p into a zero-padded buffer of `size` bytes (32 unless said).
inline const uint8_t* padded(const uint8_t* p, int n, uint8_t* tmp, int size = 32) {
  std::memset(tmp, 0, static_cast<size_t>(size));
  std::memcpy(tmp, p, static_cast<size_t>(n));
  return tmp;
}

inline __m128i load8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }

// e2m1 nibbles (in the low 4 bits of each dword) → value × scale: magnitude from an 8-entry
// table (pre-multiplied by the block scale, which may be negative for NVFP4), sign bit 3 XORed in.
inline __m256 e2m1_lookup(__m256i nib, __m256 tbl) {
  const __m256 mag = _mm256_permutevar8x32_ps(tbl, nib);
  const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(nib, 28), _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(mag), sign));
}

const float kE2m1Mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// One fp4 group (16 bytes at p, `bytes` of them valid): even elements → e[0..1], odd → o[0..1];
// ta / tb: the tables of bytes 0..7 / 8..15 (NVFP4: two 16-blocks; MX: the same table).
inline void fp4_group(const uint8_t* p, int bytes, __m256 ta, __m256 tb, __m256* e, __m256* o) {
  uint8_t tmp[32];
  if (bytes < 16) p = padded(p, bytes < 0 ? 0 : bytes, tmp);
  const __m256i lo_mask = _mm256_set1_epi32(15);
  const __m256i xa = _mm256_cvtepu8_epi32(load8(p));
  const __m256i xb = _mm256_cvtepu8_epi32(load8(p + 8));
  e[0] = e2m1_lookup(_mm256_and_si256(xa, lo_mask), ta);
  e[1] = e2m1_lookup(_mm256_and_si256(xb, lo_mask), tb);
  o[0] = e2m1_lookup(_mm256_srli_epi32(xa, 4), ta);
  o[1] = e2m1_lookup(_mm256_srli_epi32(xb, 4), tb);
}

// The ISA layer of the AVX2 target, as the generic kernels (simd/gemm.h) use it.
struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static constexpr int kNR = 2;  // weight rows per micro-kernel
  static constexpr int kNT = 4;  // tokens per micro-kernel
  // Target-only kernels (declared in simd/gemm.h, defined in this target's translation units).
  static constexpr bool kMxfp4F32Kernel = true;  // MXFP4 on the F32 kind: gemm_mxfp4_f32 (gemm_avx2.cc)
  static constexpr bool kBf16Dot = false;        // DotKind::Bf16 is not selected on AVX2
  static constexpr bool kPlainRowBuffer = false;  // run_f32: plain-stream rows re-decoded per token group
  // The integer kernels (INT8, W4A4 rows) split an expert's tokens into even groups (token_group):
  // one core, Zen 3, K × N = 1024 × 768, minimum µs over 3 rounds: INT8 at 5 / 9 / 13 tokens
  // 133 / 226 / 318 → 109 / 181 / 275, W4A4 2–4 % at 5–14 tokens; the F32 kinds measured level to
  // 6 % slower (MXFP6 at 5 tokens), so they keep groups of four (bench/RESULTS.md 2026-12-07, session 44).
  static constexpr bool kEvenTokenGroups = true;
  // f32_kernel, one token on interleaved rows: one accumulator per vector for steps of up to 4
  // vectors. One core, Zen 3, K = 2048, N = 1536, MXFP6 (after dec_fp6's one-multiply form):
  // 457 → 415 µs for E2M3 and E3M2 (2 accumulators: 450; bench/RESULTS.md 2026-12-07, session 43).
  static constexpr int kOneTokenAcc = 4;

  static F zero() { return _mm256_setzero_ps(); }
  static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  template <int NR>
  static void hsum_rows(const F (&acc)[NR], float* out) {
    for (int i = 0; i < NR; ++i) out[i] = hsum(acc[i]);
  }

  // F32-kind decoders: the 32 weights [k, k + 32) of a row as 4 vectors, `n` of them inside K
  // (zeros beyond).
  static void dec_f32(const float* p, int n, F* w) {
    if (n >= 32) {
      for (int j = 0; j < 4; ++j) w[j] = _mm256_loadu_ps(p + 8 * j);
    } else {
      alignas(32) float tmp[32] = {};
      std::memcpy(tmp, p, static_cast<size_t>(n) * 4);
      for (int j = 0; j < 4; ++j) w[j] = _mm256_load_ps(tmp + 8 * j);
    }
  }
  template <bool kBf16>
  static void dec_half(const uint8_t* p, int n, F* w) {
    uint8_t tmp[64];
    if (n < 32) {
      std::memset(tmp, 0, 64);
      std::memcpy(tmp, p, static_cast<size_t>(n) * 2);
      p = tmp;
    }
    for (int j = 0; j < 4; ++j) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j));
      if (kBf16) w[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      else w[j] = _mm256_cvtph_ps(h);
    }
  }
  // FP8 through fp16: h = ((c << 8) >>arith 1) & 0xBF80 is the value × 2^−8 (subnormals
  // included; the 2^8 goes into the epilogue).
  static void dec_fp8(const uint8_t* p, int n, F* w) {
    uint8_t tmp[32];
    if (n < 32) p = padded(p, n, tmp);
    for (int j = 0; j < 2; ++j) {  // 16 codes per pass: the widening and bit moves on 256-bit vectors
      const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j)));
      const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(x, 8), 1), _mm256_set1_epi16(static_cast<short>(0xBF80)));
      w[2 * j] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
      w[2 * j + 1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    }
  }
  static void dec_i8(const uint8_t* p, int n, F* w) {
    uint8_t tmp[32];
    if (n < 32) p = padded(p, n, tmp);
    for (int j = 0; j < 4; ++j) w[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p + 8 * j)));
  }
  // FP6 through fp16, like FP8 above: the code's five magnitude bits at fp16 bits 11..7 (E2M3:
  // the value × 2^−14) or 12..8 (E3M2: × 2^−12) and its sign at bit 15 — exact, subnormals
  // included — then vcvtph2ps and × s · 2^14 (2^12), or × 2^14 then × s where s · 2^14 would
  // overflow: the same fp32 product value · s either way. 16 codes (12 bytes) per pass, each at the
  // top of its 16-bit lane (fp6_codes_to_top); an arithmetic shift right by 3 (2) puts the magnitude
  // in place and copies the sign down over the gap, and a mask keeps bit 15 and the magnitude.
  template <bool kE2M3>
  static void dec_fp6(const uint8_t* p, float s, F* w) {
    constexpr float kUnit = kE2M3 ? 16384.0f : 4096.0f;
    const __m256i keep = _mm256_set1_epi16(static_cast<short>(kE2M3 ? 0x8F80 : 0x9F00));
    constexpr char z = -128;
    for (int j = 0; j < 2; ++j) {
      // Pass 0: bytes 0..11 from a load at p; pass 1: bytes 12..23 at offsets 4..15 of a load at
      // p + 8 (inside the block's 24 bytes).
      const char o = static_cast<char>(4 * j);
      const __m256i idx = _mm256_setr_epi8(o, o + 1, o, o + 1, o + 1, o + 2, o + 2, z, o + 3, o + 4, o + 3, o + 4, o + 4, o + 5, o + 5, z,
                                           o + 6, o + 7, o + 6, o + 7, o + 7, o + 8, o + 8, z, o + 9, o + 10, o + 9, o + 10, o + 10,
                                           o + 11, o + 11, z);
      const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * j)));
      const __m256i h = _mm256_and_si256(_mm256_srai_epi16(fp6_codes_to_top(b, idx), kE2M3 ? 3 : 2), keep);
      w[2 * j] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
      w[2 * j + 1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    }
    const float s2 = s * kUnit;
    if (std::isfinite(s2)) {
      const __m256 sv = _mm256_set1_ps(s2);
      for (int v = 0; v < 4; ++v) w[v] = _mm256_mul_ps(w[v], sv);
    } else {
      const __m256 u = _mm256_set1_ps(kUnit), sv = _mm256_set1_ps(s);
      for (int v = 0; v < 4; ++v) w[v] = _mm256_mul_ps(_mm256_mul_ps(w[v], u), sv);
    }
  }
  // FP4, 64 weights in act order [even g | even g+1 | odd g | odd g+1] as 8 vectors (see Avx512).
  static F fp4_base() { return _mm256_loadu_ps(kE2m1Mag); }
  template <bool kMx>
  static void dec_fp4(const uint8_t* p, int bytes, const float* f, F base, F* w) {
    for (int h = 0; h < 2; ++h) {
      const __m256 ta = _mm256_mul_ps(base, _mm256_set1_ps(kMx ? f[h] : f[2 * h]));
      const __m256 tb = kMx ? ta : _mm256_mul_ps(base, _mm256_set1_ps(f[2 * h + 1]));
      if (bytes - 16 * h <= 0) {
        w[2 * h] = w[2 * h + 1] = w[4 + 2 * h] = w[5 + 2 * h] = _mm256_setzero_ps();
        continue;
      }
      fp4_group(p + 16 * h, bytes - 16 * h, ta, tb, w + 2 * h, w + 4 + 2 * h);
    }
  }

  // I8 kind: 16 codes per step, int16 products summed pairwise into int32 (no offset).
  static constexpr int kI8Step = 16;
  static constexpr int kI8Offset = 0;
  static I izero() { return _mm256_setzero_si256(); }
  static I i8_act(const uint8_t* x) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))); }
  static I i8_weights(const uint8_t* p, int n) {
    if (n >= 16) return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    uint8_t tmp[32];
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(padded(p, n, tmp))));
  }
  // One token keeps the 4 interleaved rows here: the one-row stream of the AVX-512 targets was
  // 0.8-0.9x with this target's code on the AMX Xeon (bench/RESULTS.md 2026-12-05 late).
  static constexpr bool kI8RowStream = false;
  static I i8_dot(I acc, I w, I x) { return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x)); }
  template <int NR>
  static void hsum_rows_i32(const I (&acc)[NR], int32_t* out) {
    for (int i = 0; i < NR; ++i) out[i] = hsum_epi32(acc[i]);
  }

  // --- quantizers (simd/quant.h) ---
  using M = __m256;  // compare results (all-ones lanes)
  using D = __m256d;
  static constexpr int kDLanes = 4;
  static constexpr bool kBf16Rows = false;  // DotKind::Bf16 rows: the scalar quantizer
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F abs(F v) { return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF))); }
  static F trunc(F v) { return _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); }
  static F round_even(F v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static float reduce_max(F v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  static I as_int(F v) { return _mm256_castps_si256(v); }
  static F as_float(I v) { return _mm256_castsi256_ps(v); }
  static I iset1(int v) { return _mm256_set1_epi32(v); }
  static I iand(I a, I b) { return _mm256_and_si256(a, b); }
  static I ior(I a, I b) { return _mm256_or_si256(a, b); }
  static I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
  static I srli(I a, int n) { return _mm256_srli_epi32(a, n); }
  static I sign_bits(F v) { return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(static_cast<int>(0x80000000u))); }
  static int32_t reduce_add_i32(I v) { return hsum_epi32(v); }
  static M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M ge(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M isnan(F v) { return _mm256_cmp_ps(v, v, _CMP_UNORD_Q); }
  static M mzero() { return _mm256_setzero_ps(); }
  static M mor(M a, M b) { return _mm256_or_ps(a, b); }
  static bool any(M m) { return _mm256_movemask_ps(m) != 0; }
  static F select(M m, F yes, F no) { return _mm256_blendv_ps(no, yes, m); }
  static F mask_add(F a, M m, F b) { return _mm256_add_ps(a, _mm256_and_ps(m, b)); }
  static F load_partial(const float* p, int n) {
    alignas(32) float tmp[8] = {};
    std::memcpy(tmp, p, static_cast<size_t>(n < 0 ? 0 : n > 8 ? 8 : n) * 4);
    return _mm256_load_ps(tmp);
  }
  // A 32-group (v[0..3] = elements 0..7, 8..15, 16..23, 24..31) → [even elements | odd elements].
  static void act_order(F* v) {
    auto even = [](__m256 a, __m256 b) {
      return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
    };
    auto odd = [](__m256 a, __m256 b) {
      return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
    };
    const __m256 e0 = even(v[0], v[1]), e1 = even(v[2], v[3]), o0 = odd(v[0], v[1]), o1 = odd(v[2], v[3]);
    v[0] = e0;
    v[1] = e1;
    v[2] = o0;
    v[3] = o1;
  }
  // 16 integral values (v[0], v[1]) → int8 at p (saturating); returns their lane sums as int32.
  static I store_i8_half(int8_t* p, const F* v) {
    const __m256i i0 = _mm256_cvtps_epi32(v[0]), i1 = _mm256_cvtps_epi32(v[1]);
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), _MM_SHUFFLE(3, 1, 2, 0));  // 16 int16 in order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    return _mm256_add_epi32(i0, i1);
  }
  static void fp4_corrections(const ActLayout& l, uint8_t* row) { fill_fp4_corrections(l, row); }
  // Doubles: 2^n built from its bits, exact for x in [−708, 709] (a normal double).
  static constexpr double kExpLo = -708.0, kExpHi = 709.0;
  static D dset1(double v) { return _mm256_set1_pd(v); }
  static D dadd(D a, D b) { return _mm256_add_pd(a, b); }
  static D dsub(D a, D b) { return _mm256_sub_pd(a, b); }
  static D dmul(D a, D b) { return _mm256_mul_pd(a, b); }
  static D ddiv(D a, D b) { return _mm256_div_pd(a, b); }
  static D dmin(D a, D b) { return _mm256_min_pd(a, b); }
  static D dmax(D a, D b) { return _mm256_max_pd(a, b); }
  static D dfmadd(D a, D b, D c) { return _mm256_fmadd_pd(a, b, c); }
  static D dfnmadd(D a, D b, D c) { return _mm256_fnmadd_pd(a, b, c); }
  static D dround(D v) { return _mm256_round_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static D dabs(D v) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), v); }
  static D dscale2(D p, D n) {  // p · 2^n, n ∈ [−1022, 1023]
    const __m256i ni = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n));
    const __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
  }
  static D dcopysign(D a, D s) { return _mm256_or_pd(a, _mm256_and_pd(s, _mm256_set1_pd(-0.0))); }
  static void load_gate_up(bool interleaved, const float* y1, int inter, int j, int n, D& g, D& u) {
    __m128 gf, uf;
    if (n == kDLanes) {  // whole lanes straight from the row (no stack round trip)
      if (interleaved) {
        const __m128 a = _mm_loadu_ps(y1 + 2 * j), b = _mm_loadu_ps(y1 + 2 * j + 4);
        gf = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        uf = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
      } else {
        gf = _mm_loadu_ps(y1 + j);
        uf = _mm_loadu_ps(y1 + inter + j);
      }
    } else {
      alignas(16) float gb[4] = {}, ub[4] = {};
      for (int i = 0; i < n; ++i) {
        gb[i] = interleaved ? y1[2 * (j + i)] : y1[j + i];
        ub[i] = interleaved ? y1[2 * (j + i) + 1] : y1[inter + j + i];
      }
      gf = _mm_load_ps(gb);
      uf = _mm_load_ps(ub);
    }
    g = _mm256_cvtps_pd(gf);
    u = _mm256_cvtps_pd(uf);
  }
  static void store_d(float* z, int n, D r) {
    const __m128 v = _mm256_cvtpd_ps(r);
    if (n == kDLanes) return _mm_storeu_ps(z, v);
    alignas(16) float out[4];
    _mm_store_ps(out, v);
    for (int i = 0; i < n; ++i) z[i] = out[i];
  }

  // --- W4A4 (Fp4Mx / Fp4Nv, simd/gemm.h) ---
  // A 64-chunk: weights through a 16-entry byte table (vpshufb on the nibbles) as
  // 2·e2m1 + 12 ∈ [0, 24] (unsigned), low nibbles (stored positions 0..31) and high (32..63);
  // vpmaddubsw forms unsigned × signed pair sums in int16 (low- plus high-nibble halves:
  // |·| ≤ 4·24·60 = 5760 with 8·e2m3 activations, no saturation), vpmaddwd with ones sums pairs
  // into int32: lane j covers the positions 4j..4j+3 and 32+4j..32+4j+3 — one MX block (j < 4:
  // block 2c, else 2c+1) or one NVFP4 block (j / 2). One token: 4 rows per pass; 2–4 tokens: one row at a time (kW4LaneAct).
  struct W4 {
    __m256i lo, hi;
  };
  using W4A = W4;
  template <int NT>
  static constexpr int kW4Rows = NT == 1 ? 4 : 1;
  template <bool kFull>
  static W4 w4_weights(const uint8_t* p, int nbytes) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    uint8_t tmp[32];
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kFull ? p : padded(p, nbytes, tmp)));
    return {_mm256_shuffle_epi8(lut, _mm256_and_si256(bytes, m4)), _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4))};
  }
  // MXFP6 E2M3 weights on the same kernels (Fp4Mx, W6A6; ActLayout's fp6 order): a 64-chunk is two
  // 24-byte blocks, 8·e2m3 + 60 ∈ [0, 120] as unsigned bytes (vpmaddubsw against |v| ≤ 60: pair sums
  // ≤ 14400, the two halves' sum ≤ 28800 in int16). Lane 0 of both vectors holds block 0, lane 1
  // block 1; lo = codes 0–15 of each block, hi = codes 16–31. Codes to bytes as dec_fp6 does
  // (fp6_codes_to_top, then a shift right by 10), two passes per vector packed to bytes; then the
  // magnitude m (5 bits) to 8·e2m3: m itself below 16, a byte table above (16 + 2j, 32 + 4j); the
  // sign by vpsignb and the offset 60.
  static constexpr bool kW6Int = true;
  template <bool kFull>
  static W4 w6_weights(const uint8_t* p, int nbytes) {
    alignas(16) uint8_t tmp[48];
    if constexpr (!kFull) p = padded(p, nbytes, tmp, static_cast<int>(sizeof(tmp)));
    const __m256i* ix = reinterpret_cast<const __m256i*>(kW6Idx.t);
    const __m256i i0 = _mm256_load_si256(ix), i1 = _mm256_load_si256(ix + 1), i2 = _mm256_load_si256(ix + 2),
                  i3 = _mm256_load_si256(ix + 3);
    const __m256i a = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + 24), reinterpret_cast<const __m128i*>(p));
    const __m256i b = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + 32), reinterpret_cast<const __m128i*>(p + 8));
    auto codes = [](__m256i src, __m256i sel) { return _mm256_srli_epi16(fp6_codes_to_top(src, sel), 10); };
    const __m256i hi_tab = _mm256_setr_epi8(16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 16, 18, 20, 22, 24, 26,
                                            28, 30, 32, 36, 40, 44, 48, 52, 56, 60);
    auto values = [&](__m256i c) {  // 6-bit codes → 8·e2m3 + 60
      const __m256i m = _mm256_and_si256(c, _mm256_set1_epi8(0x1F));
      const __m256i v = _mm256_blendv_epi8(m, _mm256_shuffle_epi8(hi_tab, m), _mm256_slli_epi16(m, 3));
      return _mm256_add_epi8(_mm256_sign_epi8(v, _mm256_slli_epi16(c, 2)), _mm256_set1_epi8(60));
    };
    return {values(_mm256_packus_epi16(codes(a, i0), codes(a, i1))), values(_mm256_packus_epi16(codes(b, i2), codes(b, i3)))};
  }
  static W4A w4_act(const int8_t* v) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32))};
  }
  // Lane j: the correction words of positions 4j..4j+3 and 32+4j..32+4j+3.
  static I w4_corr(const int32_t* c) {
    return _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 8)));
  }
  // Per-lane block scales from the chunk's first block on (MX lanes 0–3 block 0, 4–7 block 1;
  // NVFP4 lane j block j / 2).
  template <bool kMx>
  static F w4_lane_scales(const float* s) {
    const __m256i lane_block = kMx ? _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1) : _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(s), lane_block);
  }
  // A weight row's block factors, per lane as the activation's. MX: read from the row's E8M0
  // bytes through e8m0_table() at each chunk (two broadcast loads and an insert), as on AVX-512,
  // rather than a per-row factor buffer filled first: one token, one core, Zen 3, K × N = 768 × 2048
  // W4A4 77–79 → 69–70 µs, W4A16 120 → 104 µs; 2048 × 1536 W4A4 level, W4A16 214 → 194 µs
  // (bench/RESULTS.md 2026-12-06, session 42). NVFP4: a per-row buffer (w4_nv_factors).
  template <bool kMx>
  using W4Factors = std::conditional_t<kMx, MxRow, const float*>;
  template <bool kMx>
  static W4Factors<kMx> w4_row_factors(const uint8_t* sc, int nb, float ws2, float* buf) {
    if constexpr (kMx) {
      return MxRow::of(sc);
    } else {
      w4_nv_factors(sc, nb, ws2, buf);
      return buf;
    }
  }
  // kBits (MX, a row block whose E8M0 bytes are all 1…254: w4_scale_bytes_normal): 2^(s−127) is
  // the float with bits s << 23, built from the chunk's two bytes by one broadcast, one byte
  // shuffle (byte s_b to bits 24…31 of lanes 0–3, s_b+1 of lanes 4–7) and one shift, instead of
  // two table loads and an insert. The other bytes (0: 2^−127, a subnormal; 255: NaN) take the
  // table. One core, Zen 3, W4A4 one token K × N = 2048 × 1536 118–119 → 106–107 µs, 768 × 2048
  // 68 → 62–63, 2 / 4 tokens −3 % (bench/RESULTS.md 2026-12-07, session 46). W4A16's one-token
  // kernel (gemm_avx2.cc) keeps the table: the bit form measured 1 % slower there.
  static constexpr bool kW4ScaleBits = true;
  // True when the n E8M0 bytes at p are all 1…254 (kBits above).
  static bool w4_scale_bytes_normal(const uint8_t* p, int64_t n) {
    const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi8(-1);
    __m256i bad = zero;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
      bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_cmpeq_epi8(v, zero), _mm256_cmpeq_epi8(v, ones)));
    }
    bool ok = _mm256_testz_si256(bad, bad);
    for (; i < n; ++i) ok = ok && p[i] != 0 && p[i] != 0xFF;
    return ok;
  }
  template <bool kMx, bool kFull, bool kBits = false>
  static F w4_weight_scales(const W4Factors<kMx>& f, int b, int nb) {
    if constexpr (kMx && kFull && kBits) {
      (void)nb;
      uint16_t two;
      std::memcpy(&two, f.sc + b, 2);
      constexpr char z = -128;
      const __m256i to_top = _mm256_setr_epi8(z, z, z, 0, z, z, z, 0, z, z, z, 0, z, z, z, 0, z, z, z, 1, z, z, z, 1, z, z, z, 1, z, z, z, 1);
      return _mm256_castsi256_ps(_mm256_srli_epi32(_mm256_shuffle_epi8(_mm256_set1_epi16(static_cast<short>(two)), to_top), 1));
    } else if constexpr (kMx) {
      return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(f.first(b))), _mm_set1_ps(f.template second<kFull>(b, nb)), 1);
    } else {
      return w4_lane_scales<kMx>(f + b);
    }
  }
  static I w4_dot(const W4& w, const W4A& a, I corr) {
    const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, a.lo), _mm256_maddubs_epi16(w.hi, a.hi));
    return _mm256_add_epi32(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)), corr);
  }
  static F cvt_i32(I v) { return _mm256_cvtepi32_ps(v); }
  // Several tokens (kW4LaneAct): each token's w4_lane_scales and w4_corr vectors of every 64-chunk,
  // built once per call and read back with plain loads.
  static constexpr bool kW4LaneAct = true;
  template <bool kMx>
  static void w4_lane_act(const float* scale, const int32_t* corr, int K, float* ls, int32_t* lc) {
    for (int k = 0, c = 0; k < K; k += 64, c += 8) {
      _mm256_storeu_ps(ls + c, w4_lane_scales<kMx>(scale + (kMx ? k >> 5 : k >> 4)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lc + c), w4_corr(corr + (k >> 2)));
    }
  }
  static I w4_lane_corr(const int32_t* c) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)); }
  // NVFP4's per-block weight factors of one row, fp8(s)·ws2 (one rounding, as the reference), then
  // 16 zeros. 32 codes at a time through dec_fp8 (the value × 2^−8, exact) times ws2 · 2^8 (exact
  // while finite): the same real product, so the same fp32. A run holding a NaN code (dec_fp8 reads
  // e4m3's finite codes only) takes the table; the tail (nb % 32 codes: 16 of K = 768's 48) runs as
  // the row's last 32 codes, overlapping the run before. The scalar loop was ~40 % of the
  // one-token GEMM (Zen 3, one core, K = 2048, N = 1536: 188 µs, 110 without the factors;
  // bench/RESULTS.md 2026-12-06, session 42).
  static void w4_nv_factors(const uint8_t* sc, int nb, float ws2, float* f) {
    const float* table = fp8_e4m3_table();
    const float ws2_256 = ws2 * 256.0f;
    int b = 0;
    if (std::isfinite(ws2_256)) {
      const __m256 m = _mm256_set1_ps(ws2_256);
      const __m256i low7 = _mm256_set1_epi8(0x7F);
      // Codes [at, at + 32) → f; false (nothing written) when the run holds a NaN code.
      auto run = [&](int at) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + at));
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(x, low7), low7)) != 0) return false;
        F w[4];
        dec_fp8(sc + at, 32, w);
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(f + at + 8 * j, _mm256_mul_ps(w[j], m));
        return true;
      };
      for (; b + 32 <= nb; b += 32)
        if (!run(b)) break;
      // The tail: the row's last 32 codes, overlapping the run before (its values written again).
      if (b + 32 > nb && b < nb && nb >= 32 && run(nb - 32)) b = nb;
    }
    for (; b < nb; ++b) f[b] = table[sc[b]] * ws2;
    for (int z = nb; z < nb + 16; ++z) f[z] = 0.0f;
  }
};

}  // namespace
}  // namespace qmoe::cpu
