// The AVX-512 target of the CPU kernels (src/cpu/simd/README-style summary in gemm.h): include only
// from translation units compiled with the AVX-512 flags (*_avx512.cc). Everything is in an
// anonymous namespace (internal linkage), so no AVX-512 instance of these functions can be picked
// by the linker for another translation unit.
//   vector    __m512 (16 fp32 lanes), __m512i
//   rows      4 weight rows × ≤ 4 tokens per micro-kernel
//   I8 step   vpdpbusd on (w XOR 0x80) as unsigned × activation codes as signed, corrected by
//             128·Σcodes (exact int32), 64 codes per step
#pragma once

// GCC 12's AVX-512 headers implement the "undefined upper bits" casts with self-initialised
// variables, which -Wuninitialized (-Werror) flags inside the intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning (clang would warn about the unknown group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/kernel_iface.h"
#include "cpu/simd/common.h"

namespace qmoe::cpu {

// W4A4 entry points (gemm_fp4_avx512.cc).
void gemm_fp4_mx_avx512(const GemmArgs& a);
void gemm_fp4_nv_avx512(const GemmArgs& a);
// MXFP4 weights on the F32 kind (gemm_fp4_avx512.cc).
void gemm_mxfp4_f32_avx512(const GemmArgs& a);

namespace {

inline __mmask16 mask16(int n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1u); }
inline __mmask32 mask32(int n) { return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0u : static_cast<__mmask32>((1u << n) - 1u); }
inline __mmask64 mask64(int n) { return n >= 64 ? ~0ull : n <= 0 ? 0ull : ((1ull << n) - 1ull); }


inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

// Horizontal sums of 4 int32 accumulators → [Σa0, Σa1, Σa2, Σa3] (exact).
inline __m128i hsum4_epi32(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
  const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Horizontal sums of 4 accumulators → [Σa0, Σa1, Σa2, Σa3].
inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));  // a0 a1 a0 a1 per lane
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));  // a0 a1 a2 a3 per lane
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

const float kE2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// FP8 E4M3 codes (one per dword, bits above 7 zero) → fp32 in the subnormal-free form of
// SmallFloatToF32 (simd/common.h). Codes 0x7F/0xFF (NaN) decode as ±480: NaN weights are not
// representable here.
inline __m512 fp8_codes_to_f32(__m512i c) {
  using B = Fp8E4M3ToF32;
  const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
  const __m512 f = _mm512_castsi512_ps(
      _mm512_add_epi32(_mm512_slli_epi32(mag, B::kShl), _mm512_set1_epi32(static_cast<int>(B::kBiasBits))));
  const __mmask16 sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(B::kSubBelow));
  const __m512 v = _mm512_mask_mov_ps(f, sub, _mm512_fmsub_ps(f, _mm512_set1_ps(2.0f), _mm512_set1_ps(B::kSubFix)));
  const __m512i sign = _mm512_and_si512(_mm512_slli_epi32(c, 24), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}
inline __m512 fp8_to_f32(__m128i bytes) { return fp8_codes_to_f32(_mm512_cvtepu8_epi32(bytes)); }

// FP4 group decode through a 16-entry table pre-multiplied by its block factor (e2m1 × factor: one
// rounding, as the reference; exact for MX powers of two). NVFP4 groups hold two 16-blocks
// (bytes 0..7, 8..15): lanes 8..15 index the second table.
inline void fp4_group_decode(__m128i bytes, __m512 ta, __m512 tb, bool two_tables, __m512& even, __m512& odd) {
  const __m512i x = _mm512_cvtepu8_epi32(bytes);
  if (!two_tables) {
    even = _mm512_permutexvar_ps(x, ta);
    odd = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), ta);
    return;
  }
  const __m512i hi16 = _mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0);
  even = _mm512_permutex2var_ps(ta, _mm512_or_si512(_mm512_and_si512(x, _mm512_set1_epi32(15)), hi16), tb);
  odd = _mm512_permutex2var_ps(ta, _mm512_or_si512(_mm512_srli_epi32(x, 4), hi16), tb);
}

// MXFP6 (natural order): 16 elements = 12 bytes; each 128-bit lane L takes bytes 3L..3L+2 of its
// 4-element group into every dword, shifts by 6·j and masks 6 bits; code → fp32 by a table lookup
// (Fp6ToF32, simd/common.h).
template <bool kE2M3>
inline __m512 fp6_half16(const uint8_t* p) {
  const __m128i b = _mm_maskz_loadu_epi8(0x0FFF, p);
  const __m512i v = _mm512_broadcast_i32x4(b);
  const __m512i idx = _mm512_set_epi8(
      -128, 11, 10, 9, -128, 11, 10, 9, -128, 11, 10, 9, -128, 11, 10, 9,  //
      -128, 8, 7, 6, -128, 8, 7, 6, -128, 8, 7, 6, -128, 8, 7, 6,          //
      -128, 5, 4, 3, -128, 5, 4, 3, -128, 5, 4, 3, -128, 5, 4, 3,          //
      -128, 2, 1, 0, -128, 2, 1, 0, -128, 2, 1, 0, -128, 2, 1, 0);
  const __m512i w = _mm512_shuffle_epi8(v, idx);
  const __m512i sh = _mm512_set_epi32(18, 12, 6, 0, 18, 12, 6, 0, 18, 12, 6, 0, 18, 12, 6, 0);
  const __m512i c = _mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(0x3F));
  using B = Fp6ToF32<kE2M3>;
  // vpermt2ps reads index bits 0..4 only: the magnitude; bit 5 (the sign) goes to bit 31.
  const __m512 mag = _mm512_permutex2var_ps(_mm512_loadu_ps(B::kMag), c, _mm512_loadu_ps(B::kMag + 16));
  const __m512i sign = _mm512_and_si512(_mm512_slli_epi32(c, 26), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag), sign));
}

// The ISA layer of the AVX-512 target, as the generic kernels (simd/gemm.h) use it.
struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static constexpr int kNR = 4;  // weight rows per micro-kernel
  static constexpr int kNT = 4;  // tokens per micro-kernel
  // Target-only kernels (declared in simd/gemm.h, defined in this target's translation units).
  static constexpr bool kMxfp4F32Kernel = true;  // MXFP4 on the F32 kind: gemm_mxfp4_f32_avx512
  static constexpr bool kBf16Dot = true;          // DotKind::Bf16: vdpbf16ps (gemm_avx512.cc)
  static constexpr bool kPlainRowBuffer = true;   // run_f32: many tokens read plain-stream rows from the fp32 row buffer
  static constexpr bool kEvenTokenGroups = false;  // token_group: groups of four, then the rest (not measured here)
  static constexpr int kOneTokenAcc = 1;  // f32_kernel, one token on 4 interleaved rows: one accumulator per row (not measured)

  static F zero() { return _mm512_setzero_ps(); }
  static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // out[i] = Σ lanes of acc[i], i < NR.
  template <int NR>
  static void hsum_rows(const F (&acc)[NR], float* out) {
    if constexpr (NR == 4) _mm_storeu_ps(out, hsum4(acc[0], acc[1], acc[2], acc[3]));
    else
      for (int i = 0; i < NR; ++i) out[i] = hsum(acc[i]);
  }

  // F32-kind decoders: the 32 weights [k, k + 32) of a row as 2 vectors, `n` of them inside K
  // (zeros beyond).
  static void dec_f32(const float* p, int n, F* w) {
    if (n >= 32) {
      w[0] = _mm512_loadu_ps(p);
      w[1] = _mm512_loadu_ps(p + 16);
    } else {
      w[0] = _mm512_maskz_loadu_ps(mask16(n), p);
      w[1] = _mm512_maskz_loadu_ps(mask16(n - 16), p + 16);
    }
  }
  static F bf16_cvt(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  template <bool kBf16>
  static void dec_half(const uint8_t* q, int n, F* w) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(q);
    auto cvt = [](__m256i h) { return kBf16 ? bf16_cvt(h) : _mm512_cvtph_ps(h); };
    if (n >= 32) {
      w[0] = cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      w[1] = cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
    } else {
      w[0] = cvt(_mm256_maskz_loadu_epi16(mask16(n), p));
      w[1] = cvt(_mm256_maskz_loadu_epi16(mask16(n - 16), p + 16));
    }
  }
  // FP8 through fp16: h = ((c << 8) >>arith 1) & 0xBF80 (sign at 15, exponent|mantissa at 13..7)
  // is the value × 2^−8 as a half, subnormals included (the 2^8 goes into the epilogue).
  static void dec_fp8(const uint8_t* p, int n, F* w) {
    const __m256i raw = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                : _mm256_maskz_loadu_epi8(static_cast<__mmask32>((1ull << n) - 1ull), p);
    const __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(_mm512_cvtepu8_epi16(raw), 8), 1),
                                       _mm512_set1_epi16(static_cast<short>(0xBF80)));
    w[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    w[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  }
  static void dec_i8(const uint8_t* p, int n, F* w) {
    auto cvt = [](__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); };
    if (n >= 32) {
      w[0] = cvt(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      w[1] = cvt(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    } else {
      w[0] = cvt(_mm_maskz_loadu_epi8(mask16(n), p));
      w[1] = cvt(_mm_maskz_loadu_epi8(mask16(n - 16), p + 16));
    }
  }
  // MXFP6, 32 elements (24 bytes at p, natural order) × the block scale s.
  template <bool kE2M3>
  static void dec_fp6(const uint8_t* p, float s, F* w) {
    const __m512 sv = _mm512_set1_ps(s);
    w[0] = _mm512_mul_ps(fp6_half16<kE2M3>(p), sv);
    w[1] = _mm512_mul_ps(fp6_half16<kE2M3>(p + 12), sv);
  }
  // FP4 (MXFP4 / NVFP4), 64 weights (the 32 packed bytes at p, `bytes` of them inside K) in act
  // order [even g | even g+1 | odd g | odd g+1] as 4 vectors; f: the block factors of the chunk
  // (MX: groups g, g+1; NVFP4: its 4 16-blocks), 0 past the row.
  static F fp4_base() { return _mm512_loadu_ps(kE2m1); }
  template <bool kMx>
  static void dec_fp4(const uint8_t* p, int bytes, const float* f, F base, F* w) {
    auto table = [&](float s) { return _mm512_mul_ps(base, _mm512_set1_ps(s)); };
    if (kMx) {
      fp4_group_decode(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), table(f[0]), base, false, w[0], w[2]);
      if (bytes >= 32) fp4_group_decode(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)), table(f[1]), base, false, w[1], w[3]);
      else w[1] = w[3] = _mm512_setzero_ps();
    } else {
      const __m128i b0 = bytes >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : _mm_maskz_loadu_epi8(mask16(bytes), p);
      fp4_group_decode(b0, table(f[0]), table(f[1]), true, w[0], w[2]);
      if (bytes > 16) {
        const __m128i b1 = bytes >= 32 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)) : _mm_maskz_loadu_epi8(mask16(bytes - 16), p + 16);
        fp4_group_decode(b1, table(f[2]), table(f[3]), true, w[1], w[3]);
      } else {
        w[1] = w[3] = _mm512_setzero_ps();
      }
    }
  }

  // I8 kind: 64 codes per step; dot = Σ (w + 128)·x − 128·Σx.
  static constexpr int kI8Step = 64;
  static constexpr int kI8Offset = 128;
  static constexpr bool kI8RowStream = true;  // one token: one row after the other (i8_kernel)
  static I izero() { return _mm512_setzero_si512(); }
  static I i8_act(const uint8_t* x) { return _mm512_loadu_si512(x); }
  static I i8_weights(const uint8_t* p, int n) {
    return _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask64(n), p), _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static I i8_dot(I acc, I w, I x) { return _mm512_dpbusd_epi32(acc, w, x); }
  template <int NR>
  static void hsum_rows_i32(const I (&acc)[NR], int32_t* out) {
    static_assert(NR == 4);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), hsum4_epi32(acc[0], acc[1], acc[2], acc[3]));
  }

  // --- quantizers (simd/quant.h) ---
  using M = __mmask16;
  using D = __m512d;
  static constexpr int kDLanes = 8;
  static constexpr bool kBf16Rows = true;   // DotKind::Bf16 rows (the avx512bf16 target's kind)
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F abs(F v) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF))); }
  static F trunc(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); }
  static F round_even(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
  static I as_int(F v) { return _mm512_castps_si512(v); }
  static F as_float(I v) { return _mm512_castsi512_ps(v); }
  static I iset1(int v) { return _mm512_set1_epi32(v); }
  static I iand(I a, I b) { return _mm512_and_si512(a, b); }
  static I ior(I a, I b) { return _mm512_or_si512(a, b); }
  static I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  static I srli(I a, int n) { return _mm512_srli_epi32(a, n); }
  static I sign_bits(F v) { return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(static_cast<int>(0x80000000u))); }
  static int32_t reduce_add_i32(I v) { return _mm512_reduce_add_epi32(v); }
  static M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M ge(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M isnan(F v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
  static M mzero() { return 0; }
  static M mor(M a, M b) { return static_cast<M>(a | b); }
  static bool any(M m) { return m != 0; }
  static F select(M m, F yes, F no) { return _mm512_mask_blend_ps(m, no, yes); }
  static F mask_add(F a, M m, F b) { return _mm512_mask_add_ps(a, m, a, b); }
  static F load_partial(const float* p, int n) { return _mm512_maskz_loadu_ps(mask16(n), p); }
  // A 32-group (v[0] = elements 0..15, v[1] = 16..31) → [even elements | odd elements].
  static void act_order(F* v) {
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512 e = _mm512_permutex2var_ps(v[0], ev, v[1]);
    const __m512 o = _mm512_permutex2var_ps(v[0], od, v[1]);
    v[0] = e;
    v[1] = o;
  }
  // 16 integral values (v[0]) → int8 at p (saturating); returns them as int32.
  static I store_i8_half(int8_t* p, const F* v) {
    const __m512i i0 = _mm512_cvtps_epi32(v[0]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(i0));
    return i0;
  }
  // −w_offset · Σ of each 4 values (fill_fp4_corrections, vectorized), then the per-block words.
  static void fp4_corrections(const ActLayout& l, uint8_t* row) {
    const __m512i ones = _mm512_set1_epi8(1), moff = _mm512_set1_epi32(-l.w_offset);
    for (int p = 0; p < l.k_pad; p += 64) {
      const __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(row + l.vals_off + p));
      _mm512_storeu_si512(row + l.corr_off + p, _mm512_mullo_epi32(s4, moff));
    }
    fill_fp4_block_corrections(l, row);
  }
  // Bf16 kind: the three truncation terms of 16 fp32 values (split_bf16_terms) at stored
  // position p of the term rows at vals (term_bytes apart).
  static void store_bf16_terms(uint8_t* vals, int64_t term_bytes, int p, F v) {
    const __m512i hi16 = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 fin = _mm512_cmp_ps_mask(abs(v), _mm512_set1_ps(bits_to_float(0x7F800000u)), _CMP_LT_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i h = _mm512_and_si512(u, hi16);
    h = _mm512_mask_or_epi32(h, nan, _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                             _mm512_set1_epi32(0x7FC00000));
    const __m512 rres = _mm512_maskz_sub_ps(fin, v, _mm512_castsi512_ps(h));
    const __m512i m = _mm512_and_si512(_mm512_castps_si512(rres), hi16);
    const __m512 lres = _mm512_sub_ps(rres, _mm512_castsi512_ps(m));
    uint8_t* base = vals + 2 * static_cast<int64_t>(p);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(base), _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + term_bytes), _mm512_cvtepi32_epi16(_mm512_srli_epi32(m, 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + 2 * term_bytes),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lres), 16)));
  }
  // Terms in use of a Bf16 row (header word at 8): 1 + the highest term row holding a nonzero.
  static int32_t bf16_terms_in_use(const ActLayout& l, const uint8_t* row) {
    int32_t nt = 1;
    for (int t = 1; t < kBf16Terms; ++t) {
      __m512i any = _mm512_setzero_si512();
      const uint8_t* p = row + l.vals_off + t * l.term_bytes;
      for (int64_t b = 0; b < l.term_bytes; b += 64) any = _mm512_or_si512(any, _mm512_loadu_si512(p + b));
      if (_mm512_test_epi64_mask(any, any) != 0) nt = t + 1;
    }
    return nt;
  }
  // Doubles: e^x is exact for x in [−746, 710] through vscalefpd.
  static constexpr double kExpLo = -746.0, kExpHi = 710.0;
  static D dset1(double v) { return _mm512_set1_pd(v); }
  static D dadd(D a, D b) { return _mm512_add_pd(a, b); }
  static D dsub(D a, D b) { return _mm512_sub_pd(a, b); }
  static D dmul(D a, D b) { return _mm512_mul_pd(a, b); }
  static D ddiv(D a, D b) { return _mm512_div_pd(a, b); }
  static D dmin(D a, D b) { return _mm512_min_pd(a, b); }
  static D dmax(D a, D b) { return _mm512_max_pd(a, b); }
  static D dfmadd(D a, D b, D c) { return _mm512_fmadd_pd(a, b, c); }
  static D dfnmadd(D a, D b, D c) { return _mm512_fnmadd_pd(a, b, c); }
  static D dround(D v) { return _mm512_roundscale_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static D dabs(D v) { return _mm512_abs_pd(v); }
  static D dscale2(D p, D n) { return _mm512_scalef_pd(p, n); }  // p · 2^n
  // |a| with the sign of s.
  static D dcopysign(D a, D s) {
    return _mm512_castsi512_pd(_mm512_or_si512(
        _mm512_castpd_si512(a), _mm512_and_si512(_mm512_castpd_si512(s), _mm512_set1_epi64(static_cast<long long>(0x8000000000000000ull)))));
  }
  // Gate and up values j .. j + n (n ≤ 8) of a GEMM1 output row, widened to double.
  static void load_gate_up(bool interleaved, const float* y1, int inter, int j, int n, D& g, D& u) {
    const __mmask8 m = static_cast<__mmask8>((1u << n) - 1u);
    __m256 gf, uf;
    if (interleaved) {
      const __m512 v = _mm512_maskz_loadu_ps(mask16(2 * n), y1 + 2 * j);
      const __m512 p = _mm512_permutexvar_ps(_mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0), v);
      gf = _mm512_castps512_ps256(p);
      uf = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
    } else {
      gf = _mm256_maskz_loadu_ps(m, y1 + j);
      uf = _mm256_maskz_loadu_ps(m, y1 + inter + j);
    }
    g = _mm512_cvtps_pd(gf);
    u = _mm512_cvtps_pd(uf);
  }
  static void store_d(float* z, int n, D r) { _mm256_mask_storeu_ps(z, static_cast<__mmask8>((1u << n) - 1u), _mm512_cvtpd_ps(r)); }

  // --- W4A4 (Fp4Mx / Fp4Nv, simd/gemm.h) ---
  // A 64-chunk: the 32 packed bytes broadcast to both halves, shifted by 0 / 4 and masked give the
  // nibbles in act order [even g | even g+1 | odd g | odd g+1]; one vpshufb maps them to u8
  // (2·e2m1 + 12). vpdpbusd starts from the row's correction word −12·Σ(4 values), so each int32
  // lane holds the exact sum of 4 products of one block. Lane → block: MX
  // [A A A A B B B B A A A A B B B B] (A = group g); NVFP4 (blocks a0 a1 of g, b0 b1 of g+1)
  // [a0 a0 a1 a1 b0 b0 b1 b1 a0 a0 a1 a1 b0 b0 b1 b1]. 4 rows per pass for every token count.
  using W4 = __m512i;
  using W4A = __m512i;
  template <int NT>
  static constexpr int kW4Rows = 4;
  template <bool kFull>
  static W4 w4_weights(const uint8_t* p, int nbytes) {
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i shifts = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    __m512i q;
    if (kFull) q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    else q = _mm512_broadcast_i64x4(_mm256_maskz_loadu_epi8(static_cast<__mmask32>((1ull << nbytes) - 1ull), p));
    return _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srlv_epi64(q, shifts), _mm512_set1_epi8(15)));
  }
  static W4A w4_act(const int8_t* v) { return _mm512_loadu_si512(v); }
  static I w4_corr(const int32_t* c) { return _mm512_loadu_si512(c); }
  template <bool kMx>
  static F w4_lane_scales(const float* s) {
    const __m512i bidx = kMx ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                             : _mm512_set_epi32(3, 3, 2, 2, 1, 1, 0, 0, 3, 3, 2, 2, 1, 1, 0, 0);
    return _mm512_permutexvar_ps(bidx, _mm512_loadu_ps(s));
  }
  // A weight row's block factors, per lane, without a cross-lane permute (one per row and
  // step): MX straight from the E8M0 bytes (two table reads, broadcast and blended; 0 past the
  // row's last block), NVFP4 from the row's factor buffer ((a0 a1 b0 b1) in every 128-bit lane →
  // [a0 a0 a1 a1 | …]).
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
  static constexpr bool kW6Int = false;  // MXFP6 E2M3 weights on Fp4Mx: AVX2 only (dot_kind_for)
  static constexpr bool kW4ScaleBits = false;  // (AVX2's factors from the E8M0 bits: not measured here)
  template <bool kMx, bool kFull, bool kBits = false>
  static F w4_weight_scales(const W4Factors<kMx>& f, int b, int nb) {
    if constexpr (kMx) {
      return _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(f.first(b)), _mm512_set1_ps(f.template second<kFull>(b, nb)));
    } else {
      const __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(f + b));  // (a shuffle, not _mm512_broadcast_f32x4:
      return _mm512_permutevar_ps(_mm512_shuffle_f32x4(v, v, 0),      // GCC 12 ICEs on it under -fsanitize)
                                  _mm512_set_epi32(3, 3, 2, 2, 1, 1, 0, 0, 3, 3, 2, 2, 1, 1, 0, 0));
    }
  }
  static I w4_dot(W4 w, W4A a, I corr) { return _mm512_dpbusd_epi32(corr, w, a); }
  static constexpr bool kW4LaneAct = false;  // the token vectors are built in the step (w4_step)
  static F cvt_i32(I v) { return _mm512_cvtepi32_ps(v); }
  // NVFP4 per-block weight factors fp8(s)·ws2 of one row (rounded once, as the reference), then 16 zeros.
  static void w4_nv_factors(const uint8_t* sc, int nb, float ws2, float* f) {
    for (int b = 0; b < nb; b += 16) {
      const int n = nb - b < 16 ? nb - b : 16;
      const __m128i raw = n == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + b)) : _mm_maskz_loadu_epi8(mask16(n), sc + b);
      _mm512_mask_storeu_ps(f + b, mask16(n), _mm512_mul_ps(fp8_to_f32(raw), _mm512_set1_ps(ws2)));
    }
    _mm512_storeu_ps(f + nb, _mm512_setzero_ps());
  }
};

}  // namespace
}  // namespace qmoe::cpu
