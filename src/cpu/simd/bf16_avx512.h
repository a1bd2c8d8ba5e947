// The AVX-512 bf16 weight decoders (DotKind::Bf16), shared by the targets that run bf16 dot
// products on them: avx512bf16 (vdpbf16ps, gemm_avx512.cc) and amx (TDPBF16PS tiles,
// gemm_amx.cc). Internal linkage, like the ISA layer (simd/avx512.h); include after it and
// simd/gemm.h.
#pragma once

#include "cpu/simd/avx512.h"
#include "cpu/simd/gemm.h"

namespace qmoe::cpu {
namespace {

constexpr int kNR = Avx512::kNR;
constexpr int kNT = Avx512::kNT;

// ---------------------------------------------------------------------------------------------
// Bf16: vdpbf16ps (AVX512_BF16; only reached on the avx512bf16 target, dot_kind_for) of bf16
// weights × the activation's bf16 terms. Each product of two bf16 values is exact in fp32; the
// instruction adds the two products of a lane pair to the fp32 accumulator (round to nearest even,
// bf16 / fp32 subnormals flushed to zero), so the error is that of an fp32 sum, as the F32 kind.
// Weights: BF16 storage as is; MX codes through a per-block 16 / 64-entry bf16 table whose
// exponent fields are raised by s − 127 (exact while the block's scale byte lies in
// [smin, smax], mx_bf16_table; a row block holding any other scale byte goes to the scalar kernel).
// Decoders: load(i, k, w) gives kStep / 32 vectors of 32 bf16 in act value order.
inline __m512 dpbf16(__m512 acc, __m512i w, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }

struct BDecBf16 {
  RowSet<kNR> rs;
  int K;
  static constexpr int kStep = 32, kBytes = 64;  // weights and bytes per row and step
  static constexpr bool kL2Prefetch = true;
  void load(int i, int k, __m512i* w) const {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(rs.row[i]) + k;
    w[0] = k + 32 <= K ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(K - k), p);
  }
};

// FP8 E4M3 (per-channel / per-tensor scale in the epilogue): the 7-bit magnitude through two
// 64-entry vpermt2w tables selected by bit 6, the sign bit moved to bit 15. Exact (subnormal fp8
// values are normal bf16); NaN codes give NaN.
struct BDecFp8 {
  RowSet<kNR> rs;
  int K;
  __m512i t0, t1, t2, t3;  // magnitudes 0..31, 32..63, 64..95, 96..127
  static constexpr int kStep = 32, kBytes = 32;
  static constexpr bool kRowStream = true;  // one token: rows one after the other (bf16_kernel)
  void load(int i, int k, __m512i* w) const {
    const uint8_t* p = rs.row[i] + k;
    const __m256i raw = k + 32 <= K ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                    : _mm256_maskz_loadu_epi8(mask32(K - k), p);
    const __m512i x = _mm512_cvtepu8_epi16(raw);
    const __m512i lo = _mm512_permutex2var_epi16(t0, x, t1), hi = _mm512_permutex2var_epi16(t2, x, t3);
    const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40)), lo, hi);
    w[0] = _mm512_ternarylogic_epi64(mag, _mm512_slli_epi16(x, 8), _mm512_set1_epi16(static_cast<short>(0x8000)), 0xF8);
  }
};

// bf16 table of 32 words: block b's 16 codes in words 0..15, block b+1's in 16..31 (MXFP4), or one
// block's 64 codes in two vectors (MXFP6), each nonzero entry's exponent raised by s − 127.
inline __m512i raise_exponents(__m512i tab, __mmask32 nonzero, __m512i delta) {
  return _mm512_mask_add_epi16(tab, nonzero, tab, delta);
}
inline __m512i exp_delta(int s) { return _mm512_set1_epi16(static_cast<short>((s - 127) << 7)); }

// The 32 code bytes of the 64-element fp4 step at element k of a packed row, one per word (MXFP4,
// NVFP4). K % 64 == 32: the last step holds group g only, group g + 1's words read as zero.
inline __m512i fp4_step_bytes(const uint8_t* row, int k, int K) {
  const uint8_t* p = row + (k >> 1);
  return _mm512_cvtepu8_epi16(k + 64 <= K ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi8(0xFFFFu, p));
}

// The few-token kernel (bf16_kernel) takes the codes unscaled (load_unscaled: the fixed table)
// and multiplies each step's fp32 products by [2^(s_g−127) ×8 | 2^(s_g+1−127) ×8] (factor: the
// fp32 lanes 0–7 of a step hold block g's products, 8–15 block g + 1's), one FMA per step, row and
// activation row instead of raising the table per step and row; the decoded-row buffer takes the
// raised codes (load).
//
// The amx ring's panel fill (gemm_amx.cc) raises a pair-interleaved table instead (raised_words):
// entry 2c holds code c for block g, 2c + 1 for block g + 1, so one step's two exponent deltas are
// one dword broadcast from memory (row_deltas, once per row and panel) where load builds them from
// two scalar broadcasts and a blend per step.
struct BDecMxfp4 {
  RowSet<kNR> rs;
  int K;
  __m512i base;      // codes 0..15 twice
  __mmask32 nonzero; // entries that are not ±0
  const float* e8;   // e8m0_table()
  __m512i ibase;     // codes 0..15, each twice in a row (raised_words)
  __mmask32 inz;     // its entries that are not ±0
  static constexpr int kStep = 64, kBytes = 32;
  // Dwords of row_deltas per row: the row's steps, rounded up to whole stores of 16.
  static constexpr int delta_dwords(int K) { return (K / 32 + 31) / 32 * 16; }
  // dd[j]: the deltas (s − 127) << 7 of blocks 2j (low word) and 2j + 1 (high) of a row's nb block
  // scales sc; dwords past the row hold arbitrary deltas (the codes there read as +0, which no
  // delta raises).
  static void row_deltas(const uint8_t* sc, int nb, uint32_t* dd) {
    for (int j = 0; j < nb; j += 32) {
      const __m256i s8 = _mm256_maskz_loadu_epi8(nb - j >= 32 ? ~0u : (1u << (nb - j)) - 1u, sc + j);
      _mm512_storeu_si512(dd + j / 2, _mm512_slli_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(s8), _mm512_set1_epi16(127)), 7));
    }
  }
  // A step's two vectors from its code bytes x (fp4_step_bytes) and its deltas' word pair dd, through
  // the pair-interleaved table ibase (nonzero entries inz).
  static void raised_words(__m512i x, uint32_t dd, __m512i ibase, __mmask32 inz, __m512i* w) {
    const __m512i tab = raise_exponents(ibase, inz, _mm512_set1_epi32(static_cast<int>(dd)));
    const __m512i sel = _mm512_set_epi64(0x0001000100010001ll, 0x0001000100010001ll, 0x0001000100010001ll, 0x0001000100010001ll, 0, 0, 0, 0);
    const __m512i m = _mm512_set1_epi16(0x1E);
    w[0] = _mm512_permutexvar_epi16(_mm512_ternarylogic_epi64(_mm512_slli_epi16(x, 1), m, sel, 0xEA), tab);  // 2·lo | block
    w[1] = _mm512_permutexvar_epi16(_mm512_ternarylogic_epi64(_mm512_srli_epi16(x, 3), m, sel, 0xEA), tab);  // 2·hi | block
  }
  static constexpr bool kBlockFactor = true;
  void words(int i, int k, __m512i tab, __m512i* w) const {
    const __m512i x = fp4_step_bytes(rs.row[i], k, K);
    const __m512i sel = _mm512_set_epi64(0x0010001000100010ll, 0x0010001000100010ll, 0x0010001000100010ll, 0x0010001000100010ll, 0, 0, 0, 0);
    const __m512i lo = _mm512_ternarylogic_epi64(x, _mm512_set1_epi16(0x000F), sel, 0xEA);  // (x & 15) | sel
    const __m512i hi = _mm512_or_si512(_mm512_srli_epi16(x, 4), sel);
    w[0] = _mm512_permutexvar_epi16(lo, tab);  // even elements of g | of g+1
    w[1] = _mm512_permutexvar_epi16(hi, tab);  // odd elements
  }
  void load(int i, int k, __m512i* w) const {
    const int g = k >> 5;
    const uint8_t* sc = rs.scales[i];
    const bool two = k + 64 <= K;
    const __m512i delta = _mm512_mask_blend_epi16(0xFFFF0000u, exp_delta(sc[g]), exp_delta(two ? sc[g + 1] : 127));
    words(i, k, raise_exponents(base, nonzero, delta), w);
  }
  void load_unscaled(int i, int k, __m512i* w) const { words(i, k, base, w); }
  __m512 factor(int i, int k) const {
    const int g = k >> 5;
    const float f1 = k + 64 <= K ? e8[rs.scales[i][g + 1]] : 0.0f;
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(e8[rs.scales[i][g]]), _mm512_set1_ps(f1));
  }
};

// MXFP6: 32 codes = 24 bytes (4 codes in 3 bytes, little endian) per block. Lane L of the vector
// takes source words 3L..3L+2 (bytes 6L..6L+5: its 8 codes), a byte shuffle puts the 16-bit window
// holding code j into word j, a variable shift aligns it; vpermt2w looks up the 6-bit code.
// The few-token kernel (bf16_kernel) takes the block's codes unscaled (load_unscaled: the fixed
// table) and multiplies each block's fp32 dot product by its factor 2^(s−127) (one FMA per block
// and activation row, where raising the two tables cost a scalar round trip, a broadcast and two
// masked adds per block and row); the decoded-row buffer takes the raised codes (load).
struct BDecMxfp6 {
  RowSet<kNR> rs;
  int K;
  __m512i base_lo, base_hi;  // codes 0..31, 32..63
  __mmask32 nz_lo, nz_hi;
  const float* e8;  // e8m0_table()
  static constexpr int kStep = 32, kBytes = 24;
  static constexpr bool kBlockFactor = true;
  __m512i codes(int i, int k) const {
    const uint8_t* p = rs.row[i] + (k >> 2) * 3;
    const __m512i src = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(0x00FFFFFFu, p));
    const __m512i spread = _mm512_permutexvar_epi16(
        _mm512_set_epi16(11, 11, 11, 11, 11, 11, 10, 9, 8, 8, 8, 8, 8, 8, 7, 6, 5, 5, 5, 5, 5, 5, 4, 3, 2, 2, 2, 2, 2, 2, 1, 0), src);
    const __m512i pairs = _mm512_shuffle_epi8(
        spread, _mm512_broadcast_i32x4(_mm_set_epi8(-128, 5, 5, 4, 4, 3, 4, 3, -128, 2, 2, 1, 1, 0, 1, 0)));
    return _mm512_srlv_epi16(pairs, _mm512_broadcast_i32x4(_mm_set_epi16(2, 4, 6, 0, 2, 4, 6, 0)));
  }
  void load(int i, int k, __m512i* w) const {
    const __m512i d = exp_delta(rs.scales[i][k >> 5]);
    w[0] = _mm512_permutex2var_epi16(raise_exponents(base_lo, nz_lo, d), codes(i, k), raise_exponents(base_hi, nz_hi, d));
  }
  void load_unscaled(int i, int k, __m512i* w) const { w[0] = _mm512_permutex2var_epi16(base_lo, codes(i, k), base_hi); }
  __m512 factor(int i, int k) const { return _mm512_set1_ps(e8[rs.scales[i][k >> 5]]); }
};

// NVFP4: e2m1 × fp8(block scale) is exact in bf16 (≤ 6 significant bits; 2^-10 .. 2688), so a
// step's four 16-blocks get two 32-entry tables [e2m1 · f0 | e2m1 · f1], [e2m1 · f2 | e2m1 · f3]
// (fp32 products, converted exactly) and each code is looked up with vpermt2w. The tensor's
// weight_scale_2 stays out (the epilogue's tensor scale, bf16_args). NaN scale codes give NaN.
struct BDecNvfp4 {
  RowSet<kNR> rs;
  int K;
  __m512 e2m1;      // the 16 code values, fp32
  const float* f8;  // fp8_e4m3_table()
  static constexpr int kStep = 64, kBytes = 32;
  void load(int i, int k, __m512i* w) const {
    const int b = k >> 4, nb = K >> 4;  // first block of the step; blocks in the row
    const uint8_t* sc = rs.scales[i] + b;
    const float f0 = f8[sc[0]], f1 = f8[sc[1]], f2 = b + 2 < nb ? f8[sc[2]] : 0.0f, f3 = b + 3 < nb ? f8[sc[3]] : 0.0f;
    const __m512i ta = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(e2m1, _mm512_set1_ps(f1)), _mm512_mul_ps(e2m1, _mm512_set1_ps(f0)));
    const __m512i tb = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(e2m1, _mm512_set1_ps(f3)), _mm512_mul_ps(e2m1, _mm512_set1_ps(f2)));
    const __m512i x = fp4_step_bytes(rs.row[i], k, K);
    // words 0–7: block 2g (table a, entries 0–15), 8–15: 2g + 1 (16–31), 16–23: 2g + 2 (table b),
    // 24–31: 2g + 3
    const __m512i sel = _mm512_set_epi64(0x0030003000300030ll, 0x0030003000300030ll, 0x0020002000200020ll, 0x0020002000200020ll,
                                         0x0010001000100010ll, 0x0010001000100010ll, 0, 0);
    const __m512i lo = _mm512_ternarylogic_epi64(x, _mm512_set1_epi16(0x000F), sel, 0xEA);  // (x & 15) | sel
    const __m512i hi = _mm512_or_si512(_mm512_srli_epi16(x, 4), sel);
    w[0] = _mm512_permutex2var_epi16(ta, lo, tb);  // even elements of g | of g+1
    w[1] = _mm512_permutex2var_epi16(ta, hi, tb);  // odd elements
  }
};

// Decoded rows in a per-thread bf16 buffer (experts with more activation rows than one group).
struct BDecBuf {
  const uint16_t* buf;
  int ld;
  SpreadPrefetch next{};  // the next row block, into L2 while this buffer is read (run_bf16)
  static constexpr int kStep = 32, kBytes = 0;  // (never prefetched)
  void load(int i, int k, __m512i* w) const {
    if (i == 0) next.at(k / kStep);
    w[0] = _mm512_loadu_si512(buf + static_cast<int64_t>(i) * ld + k);
  }
};

template <class D>
constexpr bool block_factor_of() {
  if constexpr (requires { D::kBlockFactor; }) return D::kBlockFactor;
  return false;
}

// Whether every scale byte of the rows lies in [smin, smax] (MX: the bf16 exponent trick is exact).
bool scales_in_window(const RowSet<kNR>& rs, int nb, int smin, int smax) {
  const __m512i lo = _mm512_set1_epi8(static_cast<char>(smin)), hi = _mm512_set1_epi8(static_cast<char>(smax));
  for (int i = 0; i < kNR; ++i)
    for (int b = 0; b < nb; b += 64) {
      const __m512i s = _mm512_maskz_loadu_epi8(mask64(nb - b), rs.scales[i] + b);
      const __mmask64 m = mask64(nb - b);
      if ((_mm512_mask_cmplt_epu8_mask(m, s, lo) | _mm512_mask_cmpgt_epu8_mask(m, s, hi)) != 0) return false;
    }
  return true;
}

// The GEMM's arguments as the Bf16 kernels' epilogue needs them: NVFP4's weight_scale_2 as the
// tensor scale (its decoder leaves it out); `tmp` holds the changed view.
inline GemmArgs bf16_args(const GemmArgs& a, WeightView& tmp) {
  if (a.w->fmt != WeightFormat::Nvfp4) return a;
  tmp = *a.w;
  tmp.tensor_scale = tmp.nv_global;
  GemmArgs b = a;
  b.w = &tmp;
  return b;
}

// Calls f(make_dec, scale_cols, smin, smax) with the decoder factory of w's format (make_dec(rows)
// → decoder of the kNR rows rows[0..kNR)); scale_cols > 0: MX block scales that must lie in
// [smin, smax] (scales_in_window) for the decoder to be exact. Returns false for formats without
// a bf16 decoder (not selected by dot_kind_for).
template <class F>
bool with_bf16_decoder(const WeightView& w, F&& f) {
  const int K = w.cols;
  switch (w.fmt) {
    case WeightFormat::BF16:
      if (w.dtype != DType::BF16) return false;
      f([&](const int* r) { return BDecBf16{row_set<kNR>(w, r, 0), K}; }, 0, 0, 0);
      return true;
    case WeightFormat::Mxfp4: {
      const MxBf16Table t = mx_bf16_table(w.fmt);
      uint16_t b32[32];
      for (int c = 0; c < 32; ++c) b32[c] = t.codes[c & 15];
      const __m512i base = _mm512_loadu_si512(b32);
      const __mmask32 nz = _mm512_test_epi16_mask(base, _mm512_set1_epi16(0x7FFF));
      uint16_t i32[32];
      for (int c = 0; c < 32; ++c) i32[c] = t.codes[c >> 1];
      const __m512i ibase = _mm512_loadu_si512(i32);
      const __mmask32 inz = _mm512_test_epi16_mask(ibase, _mm512_set1_epi16(0x7FFF));
      const float* e8 = e8m0_table();  // here, not per decoder: the ring makes one per row and chunk
      f([&](const int* r) { return BDecMxfp4{row_set<kNR>(w, r, K / 32), K, base, nz, e8, ibase, inz}; }, K / 32, t.smin, t.smax);
      return true;
    }
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: {
      const MxBf16Table t = mx_bf16_table(w.fmt);
      const __m512i lo = _mm512_loadu_si512(t.codes), hi = _mm512_loadu_si512(t.codes + 32);
      const __mmask32 nzl = _mm512_test_epi16_mask(lo, _mm512_set1_epi16(0x7FFF));
      const __mmask32 nzh = _mm512_test_epi16_mask(hi, _mm512_set1_epi16(0x7FFF));
      const float* e8 = e8m0_table();
      f([&](const int* r) { return BDecMxfp6{row_set<kNR>(w, r, K / 32), K, lo, hi, nzl, nzh, e8}; }, K / 32, t.smin, t.smax);
      return true;
    }
    case WeightFormat::Nvfp4: {
      const __m512 e2m1 = Avx512::fp4_base();
      const float* f8 = fp8_e4m3_table();
      f([&](const int* r) { return BDecNvfp4{row_set<kNR>(w, r, K / 16), K, e2m1, f8}; }, 0, 0, 0);
      return true;
    }
    case WeightFormat::Fp8E4M3: {
      const uint16_t* t = fp8_bf16_magnitudes();
      const __m512i t0 = _mm512_loadu_si512(t), t1 = _mm512_loadu_si512(t + 32), t2 = _mm512_loadu_si512(t + 64),
                    t3 = _mm512_loadu_si512(t + 96);
      f([&](const int* r) { return BDecFp8{row_set<kNR>(w, r, 0), K, t0, t1, t2, t3}; }, 0, 0, 0);
      return true;
    }
    default: return false;
  }
}

}  // namespace
}  // namespace qmoe::cpu
