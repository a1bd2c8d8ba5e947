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
  int num = 1, den = 1;           // bytes per element = num / den
  template <int kStep>
  void at(int i, int k) const {
    if (base == nullptr) return;
    prefetch_seq(base, dist, k / kStep, i, kNR, kStep * num / den);
  }
};
Prefetch prefetch_of(const WeightView& w, int n0) {
  Prefetch p;
  p.base = w.data + static_cast<int64_t>(n0) * w.row_bytes;
  p.dist = prefetch_distance(kNR * w.row_bytes);
  switch (w.fmt) {
    case WeightFormat::BF16: p.num = w.dtype == DType::F32 ? 4 : 2; break;
    case WeightFormat::Mxfp4:
    case WeightFormat::Nvfp4: p.den = 2; break;
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: p.num = 3, p.den = 4; break;
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
    for (int i = 0; i < kNR; ++i) {
      __m512 w[V];
      pf.template at<D::kStep>(i, k);
      dec.load(i, k, w);
      for (int t = 0; t < NT; ++t)
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
  }
}

}  // namespace qmoe::cpu
