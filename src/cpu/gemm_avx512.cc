// AVX-512 GEMM kernels (compiled with -mavx512f/bw/vl/dq/vnni). Row-major micro-kernels over
// 4 weight rows × up to 4 tokens: each weight vector is decoded once in registers from the packed
// format and used for every token of the group; one fp32 / int32 accumulator vector per
// (token, row), reduced horizontally at the end of the row.
//   F32   : 32 weights per step decoded to two fp32 vectors (block scale folded into a 16-entry
//           table for fp4; shift/mask bit tricks for fp8 / fp6, checked against formats.h by the
//           tests), then FMA with the fp32 activation values.
//   I8    : VNNI vpdpbusd on (w XOR 0x80) as unsigned × activation codes as signed, corrected by
//           128·Σcodes (exact int32).
//   Fp4Mx / Fp4Nv : W4A4 integer kernels, gemm_fp4_avx512.cc.
// This translation unit uses no library inline code (only intrinsics and its own functions), so
// nothing compiled for AVX-512 can be picked by the linker for baseline callers.
#include "cpu/simd_avx512.h"

namespace qmoe::cpu {

namespace {

// ---------------------------------------------------------------------------------------------
// F32 decoders: load(i, k, w0, w1) gives the 32 weights [k, k+32) of row slot i in activation
// value order (zeros beyond K).
struct RowSet {
  const uint8_t* row[kNR];
  const uint8_t* scales[kNR];
};

RowSet row_set(const WeightView& w, const int* rows, int scale_cols) {
  RowSet r;
  for (int i = 0; i < kNR; ++i) {
    r.row[i] = w.data + static_cast<int64_t>(rows[i]) * w.row_bytes;
    r.scales[i] = w.scales ? w.scales + static_cast<int64_t>(rows[i]) * scale_cols : nullptr;
  }
  return r;
}

struct DecF32 {
  RowSet rs;
  int K;
  static constexpr int kStep = 32;
  void load(int i, int k, __m512* w) const {
    __m512& w0 = w[0];
    __m512& w1 = w[1];
    const float* p = reinterpret_cast<const float*>(rs.row[i]) + k;
    if (k + 32 <= K) {
      w0 = _mm512_loadu_ps(p);
      w1 = _mm512_loadu_ps(p + 16);
    } else {
      w0 = _mm512_maskz_loadu_ps(mask16(K - k), p);
      w1 = _mm512_maskz_loadu_ps(mask16(K - k - 16), p + 16);
    }
  }
};

struct DecBf16 {
  RowSet rs;
  int K;
  static __m512 cvt(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static constexpr int kStep = 32;
  void load(int i, int k, __m512* w) const {
    __m512& w0 = w[0];
    __m512& w1 = w[1];
    const uint16_t* p = reinterpret_cast<const uint16_t*>(rs.row[i]) + k;
    if (k + 32 <= K) {
      w0 = cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      w1 = cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
    } else {
      w0 = cvt(_mm256_maskz_loadu_epi16(mask16(K - k), p));
      w1 = cvt(_mm256_maskz_loadu_epi16(mask16(K - k - 16), p + 16));
    }
  }
};

struct DecF16 {
  RowSet rs;
  int K;
  static constexpr int kStep = 32;
  void load(int i, int k, __m512* w) const {
    __m512& w0 = w[0];
    __m512& w1 = w[1];
    const uint16_t* p = reinterpret_cast<const uint16_t*>(rs.row[i]) + k;
    if (k + 32 <= K) {
      w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
    } else {
      w0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(K - k), p));
      w1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(K - k - 16), p + 16));
    }
  }
};


// FP8 weights for the F32 kind: 32 codes → fp16 bits h = ((c << 8) >>arith 1) & 0xBF80 (sign at
// 15, exponent|mantissa at 13..7: the value × 2^−8 as a half, subnormals included) → vcvtph2ps;
// the 2^8 goes into the epilogue (kPostScale), so no denormal fp32 appears.
struct DecFp8 {
  RowSet rs;
  int K;
  static constexpr int kStep = 32;
  static constexpr double kPostScale = 256.0;
  void load(int i, int k, __m512* w) const {
    const uint8_t* p = rs.row[i] + k;
    const __m256i raw = k + 32 <= K ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                    : _mm256_maskz_loadu_epi8(static_cast<__mmask32>((1ull << (K - k)) - 1ull), p);
    const __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(_mm512_cvtepu8_epi16(raw), 8), 1),
                                       _mm512_set1_epi16(static_cast<short>(0xBF80)));
    w[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    w[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  }
};

struct DecInt8 {
  RowSet rs;
  int K;
  static __m512 cvt(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
  static constexpr int kStep = 32;
  void load(int i, int k, __m512* w) const {
    __m512& w0 = w[0];
    __m512& w1 = w[1];
    const uint8_t* p = rs.row[i] + k;
    if (k + 32 <= K) {
      w0 = cvt(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      w1 = cvt(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    } else {
      w0 = cvt(_mm_maskz_loadu_epi8(mask16(K - k), p));
      w1 = cvt(_mm_maskz_loadu_epi8(mask16(K - k - 16), p + 16));
    }
  }
};

// FP4 (MXFP4 / NVFP4): 64 weights per step in act order [even g | even g+1 | odd g | odd g+1]
// (ActLayout). Each 16-byte group half decodes through a 16-entry table pre-multiplied by its
// block factor (e2m1 × factor: one rounding, as the reference; exact for MX powers of two).
// NVFP4 groups hold two 16-blocks (bytes 0..7, 8..15): lanes 8..15 index the second table.
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

template <bool kMx>
struct DecFp4 {
  RowSet rs;
  int K;
  const float* table;  // E8M0 or F8_E4M3 values
  float ws2;
  __m512 base;
  static constexpr int kStep = 64;
  __m512 factor_table(const uint8_t* sc, int b, int nblocks) const {
    if (b >= nblocks) return _mm512_setzero_ps();
    return _mm512_mul_ps(base, _mm512_set1_ps(kMx ? table[sc[b]] : table[sc[b]] * ws2));
  }
  void load(int i, int k, __m512* w) const {
    const int g = k >> 5;  // first group of the chunk
    const uint8_t* sc = rs.scales[i];
    const uint8_t* p = rs.row[i] + (k >> 1);
    const int bytes = (K - k) >> 1;  // packed bytes left in this row from k
    if (kMx) {
      const int nb = K >> 5;
      fp4_group_decode(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), factor_table(sc, g, nb), base, false, w[0], w[2]);
      if (bytes >= 32) fp4_group_decode(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)), factor_table(sc, g + 1, nb), base, false, w[1], w[3]);
      else w[1] = w[3] = _mm512_setzero_ps();
    } else {
      const int nb = K >> 4, b = g * 2;
      const __m128i b0 = bytes >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : _mm_maskz_loadu_epi8(mask16(bytes), p);
      fp4_group_decode(b0, factor_table(sc, b, nb), factor_table(sc, b + 1, nb), true, w[0], w[2]);
      if (bytes > 16) {
        const __m128i b1 = bytes >= 32 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)) : _mm_maskz_loadu_epi8(mask16(bytes - 16), p + 16);
        fp4_group_decode(b1, factor_table(sc, b + 2, nb), factor_table(sc, b + 3, nb), true, w[1], w[3]);
      } else {
        w[1] = w[3] = _mm512_setzero_ps();
      }
    }
  }
};

// MXFP6 (natural order): 16 elements = 12 bytes; each 128-bit lane L takes bytes 3L..3L+2 of its
// 4-element group into every dword, shifts by 6·j and masks 6 bits. Code → fp32 bits:
// (c << 26) >>arith (6 − (mbits−2)) puts the sign at 31 and exponent|mantissa right below the
// fp32 exponent field's alignment, × 2^(127 − bias) (exact, subnormals included), × 2^(s−127).
template <bool kE2M3>
struct DecMxfp6 {
  RowSet rs;
  int K;
  const float* e8;
  static __m512 half16(const uint8_t* p) {
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
    __m512i bits;
    float mul;
    if (kE2M3) {
      bits = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(c, 26), 6), _mm512_set1_epi32(static_cast<int>(0x81F00000u)));
      mul = bits_to_float(0x7E800000u);  // 2^126
    } else {
      bits = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(c, 26), 5), _mm512_set1_epi32(static_cast<int>(0x83E00000u)));
      mul = bits_to_float(0x7D800000u);  // 2^124
    }
    return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(mul));
  }
  static constexpr int kStep = 32;
  void load(int i, int k, __m512* w) const {
    __m512& w0 = w[0];
    __m512& w1 = w[1];
    const __m512 s = _mm512_set1_ps(e8[rs.scales[i][k >> 5]]);
    const uint8_t* p = rs.row[i] + (k >> 2) * 3;
    w0 = _mm512_mul_ps(half16(p), s);
    w1 = _mm512_mul_ps(half16(p + 12), s);
  }
};

// Decoded rows in a per-thread fp32 buffer (used when an expert has more tokens than one group).
struct DecBuf {
  const float* buf;
  int ld;
  static constexpr int kStep = 32;
  void load(int i, int k, __m512* w) const {
    __m512& w0 = w[0];
    __m512& w1 = w[1];
    w0 = _mm512_loadu_ps(buf + static_cast<int64_t>(i) * ld + k);
    w1 = _mm512_loadu_ps(buf + static_cast<int64_t>(i) * ld + k + 16);
  }
};

// Software prefetch of a later row block in address order (prefetch_seq).
struct Prefetch {
  const uint8_t* base = nullptr;  // row n0 of the block (null: data already in cache)
  int64_t dist = 0;               // bytes ahead
  int q4 = 4;                     // bytes per element × 4 (a constant divisor: no idiv per step)
  template <int kStep>
  void at(int i, int k) const {
    if (base == nullptr) return;
    prefetch_seq(base, dist, k / kStep, i, kNR, kStep * q4 / 4);
  }
};
Prefetch prefetch_of(const WeightView& w, int n0) {
  Prefetch p;
  p.base = w.data + static_cast<int64_t>(n0) * w.row_bytes;
  p.dist = prefetch_distance(kNR * w.row_bytes);
  switch (w.fmt) {
    case WeightFormat::BF16: p.q4 = w.dtype == DType::F32 ? 16 : 8; break;
    case WeightFormat::Mxfp4:
    case WeightFormat::Nvfp4: p.q4 = 2; break;
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: p.q4 = 3; break;
    default: break;
  }
  return p;
}

template <class D, int NT>
void f32_kernel(const D& dec, const Prefetch& pf, const float* const* act, int kend, float (*res)[kNR]) {
  constexpr int V = D::kStep / 16;
  __m512 acc[NT][kNR];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < kNR; ++i) acc[t][i] = _mm512_setzero_ps();
  for (int k = 0; k < kend; k += D::kStep) {
#pragma GCC unroll 4
    for (int i = 0; i < kNR; ++i) {
      __m512 w[V];
      pf.template at<D::kStep>(i, k);
      dec.load(i, k, w);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[t][i] = _mm512_fmadd_ps(w[v], _mm512_loadu_ps(act[t] + k + 16 * v), acc[t][i]);
    }
  }
  for (int t = 0; t < NT; ++t)
    _mm_storeu_ps(res[t], hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

template <class D>
void f32_group(const D& dec, const Prefetch& pf, const float* const* act, int nt, int kend, float (*res)[kNR]) {
  switch (nt) {
    case 1: f32_kernel<D, 1>(dec, pf, act, kend, res); break;
    case 2: f32_kernel<D, 2>(dec, pf, act, kend, res); break;
    case 3: f32_kernel<D, 3>(dec, pf, act, kend, res); break;
    default: f32_kernel<D, 4>(dec, pf, act, kend, res); break;
  }
}


template <class D, class Make>
void run_f32(const GemmArgs& a, Make make_dec) {
  const ActLayout& l = *a.layout;
  const int K = a.w->cols;
  const int kend = (K + D::kStep - 1) / D::kStep * D::kStep;  // ≤ k_pad; decoders zero-fill past K
  for (int n0 = a.row0; n0 < a.row1; n0 += kNR) {
    const int nr = a.row1 - n0 < kNR ? a.row1 - n0 : kNR;
    int rows[kNR];
    for (int i = 0; i < kNR; ++i) rows[i] = n0 + (i < nr ? i : nr - 1);
    const D dec = make_dec(rows);
    float dot[kNT][kNR];
    if (a.ntok <= kNT) {
      const float* act[kNT];
      for (int t = 0; t < a.ntok; ++t)
        act[t] = reinterpret_cast<const float*>(a.act_base + static_cast<int64_t>(a.act_index[t]) * l.stride + l.vals_off);
      f32_group(dec, prefetch_of(*a.w, n0), act, a.ntok, kend, dot);
      epilogue(a, n0, nr, 0, a.ntok, dot, post_scale_of<D>());
      continue;
    }
    // Many tokens: decode the 4 rows once into an L1/L2-resident buffer.
    float* buf = static_cast<float*>(thread_scratch_buffer(0, sizeof(float) * kNR * static_cast<size_t>(kend)));
    const Prefetch pf = prefetch_of(*a.w, n0);
    for (int i = 0; i < kNR; ++i)
      for (int k = 0; k < kend; k += D::kStep) {
        pf.template at<D::kStep>(i, k);
        __m512 w[D::kStep / 16];
        dec.load(i, k, w);
        for (int v = 0; v < D::kStep / 16; ++v) _mm512_storeu_ps(buf + static_cast<int64_t>(i) * kend + k + 16 * v, w[v]);
      }
    const DecBuf bdec{buf, kend};
    for (int j0 = 0; j0 < a.ntok; j0 += kNT) {
      const int nt = a.ntok - j0 < kNT ? a.ntok - j0 : kNT;
      const float* act[kNT];
      for (int t = 0; t < nt; ++t)
        act[t] = reinterpret_cast<const float*>(a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * l.stride + l.vals_off);
      f32_group(bdec, Prefetch{}, act, nt, kend, dot);
      epilogue(a, n0, nr, j0, nt, dot, post_scale_of<D>());
    }
  }
}

void gemm_f32(const GemmArgs& a) {
  const WeightView& w = *a.w;
  const int K = w.cols;
  switch (w.fmt) {
    case WeightFormat::BF16:
      if (w.dtype == DType::BF16) run_f32<DecBf16>(a, [&](const int* r) { return DecBf16{row_set(w, r, 0), K}; });
      else if (w.dtype == DType::F16) run_f32<DecF16>(a, [&](const int* r) { return DecF16{row_set(w, r, 0), K}; });
      else run_f32<DecF32>(a, [&](const int* r) { return DecF32{row_set(w, r, 0), K}; });
      break;
    case WeightFormat::Fp8E4M3: run_f32<DecFp8>(a, [&](const int* r) { return DecFp8{row_set(w, r, 0), K}; }); break;
    case WeightFormat::Int8: run_f32<DecInt8>(a, [&](const int* r) { return DecInt8{row_set(w, r, 0), K}; }); break;
    case WeightFormat::Mxfp4: {
      const __m512 base = _mm512_loadu_ps(kE2m1);
      const float* e8 = e8m0_table();
      run_f32<DecFp4<true>>(a, [&](const int* r) { return DecFp4<true>{row_set(w, r, K / 32), K, e8, 1.0f, base}; });
      break;
    }
    case WeightFormat::Nvfp4: {
      const __m512 base = _mm512_loadu_ps(kE2m1);
      const float* f8 = fp8_e4m3_table();
      run_f32<DecFp4<false>>(a, [&](const int* r) { return DecFp4<false>{row_set(w, r, K / 16), K, f8, w.nv_global, base}; });
      break;
    }
    case WeightFormat::Mxfp6E2M3: {
      const float* e8 = e8m0_table();
      run_f32<DecMxfp6<true>>(a, [&](const int* r) { return DecMxfp6<true>{row_set(w, r, K / 32), K, e8}; });
      break;
    }
    case WeightFormat::Mxfp6E3M2: {
      const float* e8 = e8m0_table();
      run_f32<DecMxfp6<false>>(a, [&](const int* r) { return DecMxfp6<false>{row_set(w, r, K / 32), K, e8}; });
      break;
    }
  }
}

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
inline __mmask32 mask32(int n) { return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0u : static_cast<__mmask32>((1u << n) - 1u); }

struct BDecBf16 {
  RowSet rs;
  int K;
  static constexpr int kStep = 32;
  void load(int i, int k, __m512i* w) const {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(rs.row[i]) + k;
    w[0] = k + 32 <= K ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(K - k), p);
  }
};

// FP8 E4M3 (per-channel / per-tensor scale in the epilogue): the 7-bit magnitude through two
// 64-entry vpermt2w tables selected by bit 6, the sign bit moved to bit 15. Exact (subnormal fp8
// values are normal bf16); NaN codes give NaN.
struct BDecFp8 {
  RowSet rs;
  int K;
  __m512i t0, t1, t2, t3;  // magnitudes 0..31, 32..63, 64..95, 96..127
  static constexpr int kStep = 32;
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

struct BDecMxfp4 {
  RowSet rs;
  int K;
  __m512i base;      // codes 0..15 twice
  __mmask32 nonzero; // entries that are not ±0
  static constexpr int kStep = 64;
  void load(int i, int k, __m512i* w) const {
    const int g = k >> 5;
    const uint8_t* sc = rs.scales[i];
    const uint8_t* p = rs.row[i] + (k >> 1);
    const bool two = k + 64 <= K;  // else only group g (K % 64 == 32)
    const __m256i bytes = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi8(0xFFFFu, p);
    const __m512i delta = _mm512_mask_blend_epi16(0xFFFF0000u, exp_delta(sc[g]), exp_delta(two ? sc[g + 1] : 127));
    const __m512i tab = raise_exponents(base, nonzero, delta);
    const __m512i x = _mm512_cvtepu8_epi16(bytes);
    const __m512i sel = _mm512_set_epi64(0x0010001000100010ll, 0x0010001000100010ll, 0x0010001000100010ll, 0x0010001000100010ll, 0, 0, 0, 0);
    const __m512i lo = _mm512_ternarylogic_epi64(x, _mm512_set1_epi16(0x000F), sel, 0xEA);  // (x & 15) | sel
    const __m512i hi = _mm512_or_si512(_mm512_srli_epi16(x, 4), sel);
    w[0] = _mm512_permutexvar_epi16(lo, tab);  // even elements of g | of g+1
    w[1] = _mm512_permutexvar_epi16(hi, tab);  // odd elements
  }
};

// MXFP6: 32 codes = 24 bytes (4 codes in 3 bytes, little endian) per block. Lane L of the vector
// takes source words 3L..3L+2 (bytes 6L..6L+5: its 8 codes), a byte shuffle puts the 16-bit window
// holding code j into word j, a variable shift aligns it; vpermt2w looks up the 6-bit code.
struct BDecMxfp6 {
  RowSet rs;
  int K;
  __m512i base_lo, base_hi;  // codes 0..31, 32..63
  __mmask32 nz_lo, nz_hi;
  static constexpr int kStep = 32;
  void load(int i, int k, __m512i* w) const {
    const uint8_t* p = rs.row[i] + (k >> 2) * 3;
    const __m512i src = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(0x00FFFFFFu, p));
    const __m512i spread = _mm512_permutexvar_epi16(
        _mm512_set_epi16(11, 11, 11, 11, 11, 11, 10, 9, 8, 8, 8, 8, 8, 8, 7, 6, 5, 5, 5, 5, 5, 5, 4, 3, 2, 2, 2, 2, 2, 2, 1, 0), src);
    const __m512i pairs = _mm512_shuffle_epi8(
        spread, _mm512_broadcast_i32x4(_mm_set_epi8(-128, 5, 5, 4, 4, 3, 4, 3, -128, 2, 2, 1, 1, 0, 1, 0)));
    const __m512i codes = _mm512_srlv_epi16(pairs, _mm512_broadcast_i32x4(_mm_set_epi16(2, 4, 6, 0, 2, 4, 6, 0)));
    const int s = rs.scales[i][k >> 5];
    const __m512i d = exp_delta(s);
    w[0] = _mm512_permutex2var_epi16(raise_exponents(base_lo, nz_lo, d), codes, raise_exponents(base_hi, nz_hi, d));
  }
};

// Decoded rows in a per-thread bf16 buffer (experts with more activation rows than one group).
struct BDecBuf {
  const uint16_t* buf;
  int ld;
  static constexpr int kStep = 32;
  void load(int i, int k, __m512i* w) const { w[0] = _mm512_loadu_si512(buf + static_cast<int64_t>(i) * ld + k); }
};

template <class D, int NV>
void bf16_kernel(const D& dec, const Prefetch& pf, const uint16_t* const* act, int kend, float (*res)[kNR]) {
  constexpr int V = D::kStep / 32;
  __m512 acc[NV][kNR];
  for (int t = 0; t < NV; ++t)
    for (int i = 0; i < kNR; ++i) acc[t][i] = _mm512_setzero_ps();
  for (int k = 0; k < kend; k += D::kStep) {
#pragma GCC unroll 4
    for (int i = 0; i < kNR; ++i) {
      __m512i w[V];
      pf.template at<D::kStep>(i, k);
      dec.load(i, k, w);
#pragma GCC unroll 4
      for (int t = 0; t < NV; ++t)
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) acc[t][i] = dpbf16(acc[t][i], w[v], _mm512_loadu_si512(act[t] + k + 32 * v));
    }
  }
  for (int t = 0; t < NV; ++t) _mm_storeu_ps(res[t], hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

template <class D>
void bf16_group(const D& dec, const Prefetch& pf, const uint16_t* const* act, int nv, int kend, float (*res)[kNR]) {
  switch (nv) {
    case 1: bf16_kernel<D, 1>(dec, pf, act, kend, res); break;
    case 2: bf16_kernel<D, 2>(dec, pf, act, kend, res); break;
    case 3: bf16_kernel<D, 3>(dec, pf, act, kend, res); break;
    default: bf16_kernel<D, 4>(dec, pf, act, kend, res); break;
  }
}

// Whether every scale byte of the rows lies in [smin, smax] (MX: the bf16 exponent trick is exact).
bool scales_in_window(const RowSet& rs, int nb, int smin, int smax) {
  const __m512i lo = _mm512_set1_epi8(static_cast<char>(smin)), hi = _mm512_set1_epi8(static_cast<char>(smax));
  for (int i = 0; i < kNR; ++i)
    for (int b = 0; b < nb; b += 64) {
      const __m512i s = _mm512_maskz_loadu_epi8(mask64(nb - b), rs.scales[i] + b);
      const __mmask64 m = mask64(nb - b);
      if ((_mm512_mask_cmplt_epu8_mask(m, s, lo) | _mm512_mask_cmpgt_epu8_mask(m, s, hi)) != 0) return false;
    }
  return true;
}

// The activation rows of a GEMM as (token, term) pairs: vrow v reads term term_of[v] of token
// tok_of[v]; tokens' vrows are consecutive.
struct VRows {
  const uint16_t** ptr;
  int* tok;
  int n = 0;
};

template <class D, class Make>
void run_bf16(const GemmArgs& a, Make make_dec, int scale_cols, int smin, int smax) {
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  const int kend = (K + D::kStep - 1) / D::kStep * D::kStep;  // ≤ k_pad; decoders zero-fill past K
  if (a.ntok <= 0) return;
  // vrows of every token (per-thread scratch, grown only).
  const size_t cap = static_cast<size_t>(a.ntok) * kBf16Terms;
  auto* vmem = static_cast<uint8_t*>(thread_scratch_buffer(1, cap * (sizeof(const uint16_t*) + sizeof(int)) + 64));
  VRows vr{reinterpret_cast<const uint16_t**>(vmem), reinterpret_cast<int*>(vmem + cap * sizeof(const uint16_t*))};
  for (int j = 0; j < a.ntok; ++j) {
    const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j]) * l.stride;
    int32_t nt;
    std::memcpy(&nt, row + 8, 4);
    for (int t = 0; t < nt; ++t) {
      vr.ptr[vr.n] = reinterpret_cast<const uint16_t*>(row + l.vals_off + t * l.term_bytes);
      vr.tok[vr.n++] = j;
    }
  }
  for (int n0 = a.row0; n0 < a.row1; n0 += kNR) {
    const int nr = a.row1 - n0 < kNR ? a.row1 - n0 : kNR;
    int rows[kNR];
    for (int i = 0; i < kNR; ++i) rows[i] = n0 + (i < nr ? i : nr - 1);
    const D dec = make_dec(rows);
    if (scale_cols > 0 && !scales_in_window(row_set(w, rows, scale_cols), scale_cols, smin, smax)) {
      GemmArgs sub = a;  // rare: extreme / NaN block scales, exactly in the scalar kernel
      sub.row0 = n0;
      sub.row1 = n0 + nr;
      scalar_kernels().gemm(sub);
      continue;
    }
    const Prefetch pf = prefetch_of(w, n0);
    double dot[kNT][kNR];
    float res[kNT][kNR];
    if (vr.n <= kNT) {
      bf16_group(dec, pf, vr.ptr, vr.n, kend, res);
      for (int j = 0; j < a.ntok; ++j)
        for (int i = 0; i < kNR; ++i) dot[j][i] = 0.0;
      for (int v = 0; v < vr.n; ++v)
        for (int i = 0; i < kNR; ++i) dot[vr.tok[v]][i] += static_cast<double>(res[v][i]);
      epilogue(a, n0, nr, 0, a.ntok, dot);
      continue;
    }
    // Many activation rows: decode the 4 rows once into an L1-resident bf16 buffer.
    const int ld = (kend + 31) / 32 * 32;
    uint16_t* buf = static_cast<uint16_t*>(thread_scratch_buffer(0, sizeof(uint16_t) * kNR * static_cast<size_t>(ld)));
    for (int i = 0; i < kNR; ++i)
      for (int k = 0; k < kend; k += D::kStep) {
        pf.template at<D::kStep>(i, k);
        __m512i wv[D::kStep / 32];
        dec.load(i, k, wv);
        for (int v = 0; v < D::kStep / 32; ++v) _mm512_storeu_si512(buf + static_cast<int64_t>(i) * ld + k + 32 * v, wv[v]);
      }
    const BDecBuf bdec{buf, ld};
    // Token groups of ≤ kNT tokens; their vrows in runs of ≤ kNT.
    int v0 = 0;
    for (int j0 = 0; j0 < a.ntok; j0 += kNT) {
      const int nt = a.ntok - j0 < kNT ? a.ntok - j0 : kNT;
      int v1 = v0;
      while (v1 < vr.n && vr.tok[v1] < j0 + nt) ++v1;
      for (int t = 0; t < nt; ++t)
        for (int i = 0; i < kNR; ++i) dot[t][i] = 0.0;
      for (int v = v0; v < v1; v += kNT) {
        const int nv = v1 - v < kNT ? v1 - v : kNT;
        bf16_group(bdec, Prefetch{}, vr.ptr + v, nv, kend, res);
        for (int q = 0; q < nv; ++q)
          for (int i = 0; i < kNR; ++i) dot[vr.tok[v + q] - j0][i] += static_cast<double>(res[q][i]);
      }
      epilogue(a, n0, nr, j0, nt, dot);
      v0 = v1;
    }
  }
}

void gemm_bf16(const GemmArgs& a) {
  const WeightView& w = *a.w;
  const int K = w.cols;
  switch (w.fmt) {
    case WeightFormat::BF16:
      run_bf16<BDecBf16>(a, [&](const int* r) { return BDecBf16{row_set(w, r, 0), K}; }, 0, 0, 0);
      break;
    case WeightFormat::Mxfp4: {
      const MxBf16Table t = mx_bf16_table(w.fmt);
      uint16_t b32[32];
      for (int c = 0; c < 32; ++c) b32[c] = t.codes[c & 15];
      const __m512i base = _mm512_loadu_si512(b32);
      const __mmask32 nz = _mm512_test_epi16_mask(base, _mm512_set1_epi16(0x7FFF));
      run_bf16<BDecMxfp4>(a, [&](const int* r) { return BDecMxfp4{row_set(w, r, K / 32), K, base, nz}; }, K / 32, t.smin,
                          t.smax);
      break;
    }
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: {
      const MxBf16Table t = mx_bf16_table(w.fmt);
      const __m512i lo = _mm512_loadu_si512(t.codes), hi = _mm512_loadu_si512(t.codes + 32);
      const __mmask32 nzl = _mm512_test_epi16_mask(lo, _mm512_set1_epi16(0x7FFF));
      const __mmask32 nzh = _mm512_test_epi16_mask(hi, _mm512_set1_epi16(0x7FFF));
      run_bf16<BDecMxfp6>(a, [&](const int* r) { return BDecMxfp6{row_set(w, r, K / 32), K, lo, hi, nzl, nzh}; }, K / 32,
                          t.smin, t.smax);
      break;
    }
    case WeightFormat::Fp8E4M3: {
      const uint16_t* t = fp8_bf16_magnitudes();
      const __m512i t0 = _mm512_loadu_si512(t), t1 = _mm512_loadu_si512(t + 32), t2 = _mm512_loadu_si512(t + 64),
                    t3 = _mm512_loadu_si512(t + 96);
      run_bf16<BDecFp8>(a, [&](const int* r) { return BDecFp8{row_set(w, r, 0), K, t0, t1, t2, t3}; }, 0, 0, 0);
      break;
    }
    default:  // not selected by dot_kind_for
      scalar_kernels().gemm(a);
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// I8: int8 × int8 with VNNI.
template <int NT>
void i8_kernel(const uint8_t* const* w, int64_t stride, const uint8_t* const* act, int K, int32_t (*res)[kNR]) {
  const int64_t dist = prefetch_distance(kNR * stride);
  __m512i acc[NT][kNR];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < kNR; ++i) acc[t][i] = _mm512_setzero_si512();
  const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int k = 0; k < K; k += 64) {
    const __mmask64 m = mask64(K - k);
    for (int i = 0; i < kNR; ++i) {
      prefetch_seq(w[0], dist, k >> 6, i, kNR, 64);
      const __m512i wu = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w[i] + k), x80);
      for (int t = 0; t < NT; ++t)
        acc[t][i] = _mm512_dpbusd_epi32(acc[t][i], wu, _mm512_loadu_si512(act[t] + k));
    }
  }
  for (int t = 0; t < NT; ++t)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(res[t]), hsum4_epi32(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

void gemm_i8(const GemmArgs& a) {
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  for (int n0 = a.row0; n0 < a.row1; n0 += kNR) {
    const int nr = a.row1 - n0 < kNR ? a.row1 - n0 : kNR;
    const uint8_t* wr[kNR];
    for (int i = 0; i < kNR; ++i) wr[i] = w.data + static_cast<int64_t>(n0 + (i < nr ? i : nr - 1)) * w.row_bytes;
    for (int j0 = 0; j0 < a.ntok; j0 += kNT) {
      const int nt = a.ntok - j0 < kNT ? a.ntok - j0 : kNT;
      const uint8_t* act[kNT];
      int32_t sums[kNT];
      for (int t = 0; t < nt; ++t) {
        const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * l.stride;
        act[t] = row + l.vals_off;
        std::memcpy(&sums[t], row + 4, 4);
      }
      int32_t ires[kNT][kNR];
      switch (nt) {
        case 1: i8_kernel<1>(wr, w.row_bytes, act, K, ires); break;
        case 2: i8_kernel<2>(wr, w.row_bytes, act, K, ires); break;
        case 3: i8_kernel<3>(wr, w.row_bytes, act, K, ires); break;
        default: i8_kernel<4>(wr, w.row_bytes, act, K, ires); break;
      }
      double dot[kNT][kNR];
      for (int t = 0; t < nt; ++t)
        for (int i = 0; i < kNR; ++i) dot[t][i] = static_cast<double>(ires[t][i] - 128 * sums[t]);
      epilogue(a, n0, nr, j0, nt, dot);
    }
  }
}

}  // namespace

void gemm_avx512(const GemmArgs& a) {
  switch (a.layout->kind) {
    case DotKind::F32: gemm_f32(a); break;
    case DotKind::I8: gemm_i8(a); break;
    case DotKind::Fp4Mx: gemm_fp4_mx_avx512(a); break;
    case DotKind::Fp4Nv: gemm_fp4_nv_avx512(a); break;
    case DotKind::Bf16: gemm_bf16(a); break;
  }
}

}  // namespace qmoe::cpu
