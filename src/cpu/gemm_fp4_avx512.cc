// AVX-512 VNNI W4A4 kernels (MXFP4 × MXFP4, NVFP4 × NVFP4), compiled with the AVX-512 flags:
//  * row-major: the generic kernel (simd/gemm.h gemm_w4a4_rows: 4 weight rows × ≤ 4 tokens, 64
//    weights per step decoded in registers; few tokens per expert: the memory-bound regime);
//  * 16-row tiles (here, AVX-512 only): 16 rows in the 16 lanes, decoded once per tile, each token
//    one vpdpbusd per 4 weights × 16 rows (many tokens per expert: the compute-bound regime).
// Both compute exact integer sums per block (2·e2m1 × 2·e2m1) and scale them in fp32.
// No library inline code here (see simd/gemm.h).
#include "cpu/simd/avx512.h"
#include "cpu/simd/gemm.h"
#include "cpu/simd/bf16_avx512.h"  // scales_in_window

namespace qmoe::cpu {

namespace {


// ---------------------------------------------------------------------------------------------
// Fp4 W4A4 for experts with many tokens: 16 weight rows in the 16 lanes. A tile of 16 rows is
// decoded once into u8 (2·e2m1 + 12) vectors W[chunk][q] (lane = row, 4 bytes = the 4 weights at
// stored positions 4q..4q+3), then each token costs one vpdpbusd per 4 positions × 16 rows with
// the activation dword broadcast, plus 4 ops per block (correction start, convert, scale, FMA):
// ~40 multiply-adds per instruction instead of ~16 for the row-major kernel.
// Lane l = 4a + b holds row 4·{0, 2, 1, 3}[a] + b of the tile (the transpose's natural order).
inline int tile_lane_row(int l) {
  static const int kGroup[4] = {0, 2, 1, 3};
  return 4 * kGroup[l >> 2] + (l & 3);
}

// Decodes rows [n0, n0 + 16) into wbuf[chunk·16 + q] and the block factors into
// wsv[block·16 + lane].
template <bool kMx>
void tile_decode(const WeightView& w, int n0, int K, int nblocks, __m512i* wbuf, float* wsv) {
  const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(15);
  const uint8_t* base = w.data + static_cast<int64_t>(n0) * w.row_bytes;
  for (int k = 0, c = 0; k < K; k += 64, ++c) {
    const int nbytes = (K - k) >> 1;
    const __mmask32 m = nbytes >= 32 ? ~0u : static_cast<__mmask32>((1ull << nbytes) - 1ull);
    __m512i z[8];
    for (int j = 0; j < 8; ++j) {
      const __m256i lo = _mm256_maskz_loadu_epi8(m, base + j * w.row_bytes + (k >> 1));
      const __m256i hi = _mm256_maskz_loadu_epi8(m, base + (j + 8) * w.row_bytes + (k >> 1));
      z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    __m512i t[8], u[8];
    for (int h = 0; h < 2; ++h) {
      t[4 * h + 0] = _mm512_unpacklo_epi32(z[4 * h + 0], z[4 * h + 1]);
      t[4 * h + 1] = _mm512_unpackhi_epi32(z[4 * h + 0], z[4 * h + 1]);
      t[4 * h + 2] = _mm512_unpacklo_epi32(z[4 * h + 2], z[4 * h + 3]);
      t[4 * h + 3] = _mm512_unpackhi_epi32(z[4 * h + 2], z[4 * h + 3]);
      u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
      u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    __m512i* W = wbuf + static_cast<int64_t>(c) * 16;
    for (int d = 0; d < 4; ++d) {
      const __m512i xa = _mm512_shuffle_i32x4(u[d], u[d + 4], _MM_SHUFFLE(2, 0, 2, 0));  // packed dword d
      const __m512i xb = _mm512_shuffle_i32x4(u[d], u[d + 4], _MM_SHUFFLE(3, 1, 3, 1));  // packed dword d + 4
      W[d] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(xa, low4));
      W[d + 8] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(xa, 4), low4));
      W[d + 4] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(xb, low4));
      W[d + 12] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(xb, 4), low4));
    }
  }
  // Block factors per lane: 4 blocks of the 16 rows per gather (same values as
  // nv_block_factors / the E8M0 table), the last < 4 blocks (whose dword could end past the
  // tensor) by table.
  const uint8_t* sc0 = w.scales + static_cast<int64_t>(n0) * nblocks;
  alignas(64) int32_t off[16];
  for (int l = 0; l < 16; ++l) off[l] = tile_lane_row(l) * nblocks;
  const __m512i vindex = _mm512_load_si512(off);
  int b = 0;
  for (; b + 4 <= nblocks; b += 4) {
    const __m512i g = _mm512_i32gather_epi32(vindex, sc0 + b, 1);
    for (int j = 0; j < 4; ++j) {
      const __m512i c = _mm512_and_si512(_mm512_srli_epi32(g, 8 * j), _mm512_set1_epi32(0xFF));
      __m512 f;
      if (kMx) {
        __m512i bits = _mm512_slli_epi32(c, 23);
        bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000));
        bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7FC00000));
        f = _mm512_castsi512_ps(bits);
      } else {
        f = _mm512_mul_ps(fp8_codes_to_f32(c), _mm512_set1_ps(w.nv_global));
      }
      _mm512_store_ps(wsv + (b + j) * 16, f);
    }
  }
  const float* table = kMx ? e8m0_table() : fp8_e4m3_table();
  for (; b < nblocks; ++b)
    for (int l = 0; l < 16; ++l) {
      const uint8_t code = sc0[off[l] + b];
      wsv[b * 16 + l] = kMx ? table[code] : table[code] * w.nv_global;
    }
}

// Positions q (4 stored values each) of block j within a 64-chunk.
template <bool kMx>
inline void block_dwords(int j, int* q, int& nq) {
  if (kMx) {  // j ∈ {0, 1}: even half then odd half of group j
    nq = 8;
    for (int i = 0; i < 4; ++i) q[i] = 4 * j + i, q[4 + i] = 8 + 4 * j + i;
  } else {  // j ∈ {0..3}: group j/2, first (j even) or second 8 elements of each half
    nq = 4;
    const int base = 4 * (j >> 1) + 2 * (j & 1);
    q[0] = base, q[1] = base + 1, q[2] = base + 8, q[3] = base + 9;
  }
}

// next: prefetched over the 64-chunks (the next tile, during the first token group; gemm_fp4_tile).
template <bool kMx, int NT>
void tile_tokens(const __m512i* wbuf, const float* wsv, int K, int nblocks, const uint8_t* const* act, const ActLayout& l,
                 __m512* out, const SpreadPrefetch& next) {
  __m512 accf[NT];
  for (int t = 0; t < NT; ++t) accf[t] = _mm512_setzero_ps();
  const int bpc = kMx ? 2 : 4;  // blocks per 64-chunk
  for (int k = 0, c = 0; k < K; k += 64, ++c) {
    const __m512i* W = wbuf + static_cast<int64_t>(c) * 16;
    next.at(c);
    for (int j = 0; j < bpc; ++j) {
      const int b = c * bpc + j;
      if (b >= nblocks) break;
      int q[8], nq;
      block_dwords<kMx>(j, q, nq);
      __m512i acc[NT];
      for (int t = 0; t < NT; ++t) acc[t] = _mm512_set1_epi32(reinterpret_cast<const int32_t*>(act[t] + l.bcorr_off)[b]);
      for (int i = 0; i < nq; ++i) {
        const __m512i wq = _mm512_load_si512(W + q[i]);
        for (int t = 0; t < NT; ++t) {
          const int32_t* av = reinterpret_cast<const int32_t*>(act[t] + l.vals_off + k) + q[i];
          acc[t] = _mm512_dpbusd_epi32(acc[t], wq, _mm512_set1_epi32(*av));
        }
      }
      const __m512 ws = _mm512_load_ps(wsv + b * 16);
      for (int t = 0; t < NT; ++t) {
        const float as = reinterpret_cast<const float*>(act[t] + l.scales_off)[b];
        accf[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(ws, _mm512_set1_ps(as)), accf[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = accf[t];
}

// Rows [n0, n0 + 16) for all tokens through the tile kernel.
template <bool kMx>
void gemm_fp4_tile(const GemmArgs& a, int n0, bool next_tile) {
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  const int chunks = (K + 63) / 64;
  __m512i* wbuf = static_cast<__m512i*>(thread_scratch_buffer(2, static_cast<size_t>(chunks) * 16 * 64));
  float* wsv = static_cast<float*>(thread_scratch_buffer(3, static_cast<size_t>(l.nblocks) * 16 * 4 + 64));
  tile_decode<kMx>(w, n0, K, l.nblocks, wbuf, wsv);
  alignas(64) int32_t lor[16];
  alignas(64) float bv[16];
  for (int l2 = 0; l2 < 16; ++l2) {
    lor[tile_lane_row(l2)] = l2;
    bv[l2] = w.bias ? bias_value(w, n0 + l2) : 0.0f;
  }
  const __m512i lane_of_row = _mm512_load_si512(lor);
  const __m512 bias = _mm512_load_ps(bv);
  // The next tile's 16 rows (contiguous, 16 KB at K = 2048) and block scales are prefetched into
  // L2 while the first token group computes, spread over its chunks: tile_decode otherwise met
  // them from DRAM, 16 row streams at once, with the vector units idle (a third of the tile
  // kernel's samples sat on its loads). Zen 4, 2 threads, qwen3-30b-a3b W4A4 T = 128: 40.5–40.7 →
  // 30.8–30.9 ms; T = 512 1.20–1.23x, gpt-oss-20b T = 512 1.14x (bench/RESULTS.md 2026-12-06,
  // session 41). T0 was slower (34.7–35.3 ms), T2 level with T1.
  SpreadPrefetch next{};
  if (next_tile) {
    next = SpreadPrefetch::over(w.data + static_cast<int64_t>(n0 + 16) * w.row_bytes, 16 * w.row_bytes, chunks);
    const uint8_t* sc = w.scales + static_cast<int64_t>(n0 + 16) * l.nblocks;
    for (int64_t o = 0; o < 16 * static_cast<int64_t>(l.nblocks); o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(sc + o), _MM_HINT_T1);
  }
  for (int j0 = 0; j0 < a.ntok; j0 += kNT) {
    const int nt = a.ntok - j0 < kNT ? a.ntok - j0 : kNT;
    const uint8_t* act[kNT];
    for (int t = 0; t < nt; ++t) act[t] = a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * l.stride;
    __m512 res[kNT];
    const SpreadPrefetch pf = j0 == 0 ? next : SpreadPrefetch{};
    switch (nt) {
      case 1: tile_tokens<kMx, 1>(wbuf, wsv, K, l.nblocks, act, l, res, pf); break;
      case 2: tile_tokens<kMx, 2>(wbuf, wsv, K, l.nblocks, act, l, res, pf); break;
      case 3: tile_tokens<kMx, 3>(wbuf, wsv, K, l.nblocks, act, l, res, pf); break;
      default: tile_tokens<kMx, 4>(wbuf, wsv, K, l.nblocks, act, l, res, pf); break;
    }
    // Lanes back to row order; the Fp4 kinds have no channel / tensor scale, so the epilogue is
    // y = dot·row_scale (exact: 0.25) + bias, then × router weight — in fp32, the same roundings
    // as the double epilogue of the row-major path.
    for (int t = 0; t < nt; ++t) {
      const uint8_t* row = act[t];
      float rs;
      std::memcpy(&rs, row, 4);
      __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_permutexvar_ps(lane_of_row, res[t]), _mm512_set1_ps(rs)), bias);
      if (a.post_mul) y = _mm512_mul_ps(y, _mm512_set1_ps(a.post_mul[j0 + t]));
      _mm512_storeu_ps(a.out + static_cast<int64_t>(j0 + t) * a.ldo + n0, y);
    }
  }
}

// Tokens per expert from which the tile kernel is used. Measured on Zen 4 (2 threads, whole layers,
// bench/RESULTS.md 2026-12-06, session 41): with the next tile prefetched the crossover fell from 8–10
// tokens to 3–4: qwen3-30b-a3b W4A4 T = 64 23.1–25.6 → 17.6–19.4 ms at 4 (3: level with 4, 10: slower),
// gpt-oss-20b W4A4 T = 32 / 64 30.1–30.4 / 38.8–40.1 → 23.1–25.8 / 33.0–32.7, NVFP4 1.1–1.2x.
constexpr int kTileMinTokens = 4;


template <bool kMx>
void gemm_fp4(const GemmArgs& a) {
  int first = a.row0;
  if (a.ntok >= kTileMinTokens)
    for (; first + 16 <= a.row1; first += 16) gemm_fp4_tile<kMx>(a, first, first + 32 <= a.row1);
  gemm_w4a4_rows<Avx512, kMx>(a, first);
}


// ---------------------------------------------------------------------------------------------
// MXFP4 weights on the F32 kind (W4A16), one token (the common case of a decode step's experts):
// one weight row after the other, so that the weights are read as one sequential stream. The
// row-major kernels' 4 interleaved rows kept this Intel part's prefetchers behind: one core,
// K = 2048, N = 1536, cold, 166–171 → 126–131 µs; 2–4 tokens were 0.8–0.95× in this form, so they
// keep the generic kernel (bench/RESULTS.md 2026-12-05 late). A 128-weight chunk is one 64-byte
// load; dword lane L holds elements 8L … 8L + 7 as its 8 nibbles, and nibble s (shifted down by
// 4s) indexes the 16-entry e2m1 table through vpermps (index bits 0–3), so vector s holds elements
// 8L + s: the activations are copied once per call into that order (kF32Mx4Src). Lanes 4j … 4j + 3
// lie in block 4c + j, so the 8 products per lane are summed first and multiplied once per chunk
// by [2^(s−127) × 4 per block] (exact: powers of two; E8M0 bytes in mx_bf16_table's window, other
// rows go to the scalar kernel).
struct F32Mx4Src {
  uint8_t pos[128];  // slot 16·s + L of a chunk → the stored (ActLayout fp4 order) position of its element
};
constexpr F32Mx4Src make_f32mx4_src() {
  F32Mx4Src t{};
  for (int s = 0; s < 8; ++s)
    for (int L = 0; L < 16; ++L) t.pos[16 * s + L] = static_cast<uint8_t>(fp4_value_position(8 * L + s));
  return t;
}
constexpr F32Mx4Src kF32Mx4Src = make_f32mx4_src();

// [2^(s_j − 127) in lanes 4j … 4j + 3] from the chunk's 4 scale bytes (n < 4 of them inside the row).
inline __m512 mx4_chunk_factors(const uint8_t* sc, int n) {
  int32_t word;
  if (n >= 4) std::memcpy(&word, sc, 4);  // any alignment
  else word = _mm_cvtsi128_si32(_mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1u), sc));
  const __m512i shift = _mm512_set_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
  const __m512i bits = _mm512_srli_epi32(_mm512_sllv_epi32(_mm512_set1_epi32(word), shift), 1);
  return _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0x7F800000)));  // byte j at bits 23..30
}

// Rows [0, nr) of the block at `w0` (consecutive rows, row_bytes apart; scales nb apart) against
// the permuted activation row x; res[i], rows past nr are 0.
void mx4_f32_rows(const uint8_t* w0, int64_t row_bytes, const uint8_t* sc0, int nb, int K, int nr, const float* x,
                  float* res) {
  constexpr int64_t kDist = 2048;  // bytes ahead in the stream (1–4 KB measured best, 8 KB 25 % slower)
  const __m512 tab = _mm512_loadu_ps(kE2m1);
  const int nfull = K / 128, tail = (K % 128) / 2;  // full chunks; bytes of the last one
  __m512 sums[kNR];
  for (int i = 0; i < kNR; ++i) sums[i] = _mm512_setzero_ps();
  for (int i = 0; i < nr; ++i) {
    const uint8_t* row = w0 + i * row_bytes;
    const uint8_t* sc = sc0 + static_cast<int64_t>(i) * nb;
    __m512 acc = _mm512_setzero_ps();  // in a register for the whole row
    auto chunk = [&](int c, __m512i v, __m512 f) __attribute__((always_inline)) {
      const float* xc = x + 128 * c;
      __m512 p0 = _mm512_mul_ps(_mm512_permutexvar_ps(v, tab), _mm512_loadu_ps(xc));
      __m512 p1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab), _mm512_loadu_ps(xc + 16));
#pragma GCC unroll 3
      for (int s = 2; s < 8; s += 2) {
        p0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * s), tab), _mm512_loadu_ps(xc + 16 * s), p0);
        p1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * s + 4), tab), _mm512_loadu_ps(xc + 16 * s + 16), p1);
      }
      acc = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), f, acc);
    };
    for (int c = 0; c < nfull; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(row + 64 * c + kDist), _MM_HINT_T0);
      chunk(c, _mm512_loadu_si512(row + 64 * c), mx4_chunk_factors(sc + 4 * c, 4));
    }
    if (tail > 0)
      chunk(nfull, _mm512_maskz_loadu_epi8(mask64(tail), row + 64 * nfull), mx4_chunk_factors(sc + 4 * nfull, nb - 4 * nfull));
    sums[i] = acc;
  }
  _mm_storeu_ps(res, hsum4(sums[0], sums[1], sums[2], sums[3]));
}

void gemm_mxfp4_f32_rows(const GemmArgs& a) {
  const WeightView& w = *a.w;
  const ActLayout& l = *a.layout;
  const int K = w.cols, nb = K / 32;
  if (a.ntok != 1) {  // the generic F32 kernel (4 interleaved rows; decoded-row buffer past kNT tokens)
    run_f32_mxfp4<Avx512>(a);
    return;
  }
  const int kch = (K + 127) / 128 * 128;
  float* y = static_cast<float*>(thread_scratch_buffer(1, sizeof(float) * static_cast<size_t>(kch)));
  const float* x = reinterpret_cast<const float*>(a.act_base + static_cast<int64_t>(a.act_index[0]) * l.stride + l.vals_off);
  for (int c = 0; c < kch; c += 128)
    for (int q = 0; q < 128; ++q) {
      const int p = c + kF32Mx4Src.pos[q];
      y[c + q] = p < l.k_pad ? x[p] : 0.0f;
    }
  const MxBf16Table win = mx_bf16_table(WeightFormat::Mxfp4);
  for (int n0 = a.row0; n0 < a.row1; n0 += kNR) {
    const int nr = a.row1 - n0 < kNR ? a.row1 - n0 : kNR;
    int rows[kNR];
    for (int i = 0; i < kNR; ++i) rows[i] = n0 + (i < nr ? i : nr - 1);
    if (!scales_in_window(row_set<kNR>(w, rows, nb), nb, win.smin, win.smax)) {
      GemmArgs sub = a;  // rare: extreme / NaN block scales, exactly in the scalar kernel
      sub.row0 = n0;
      sub.row1 = n0 + nr;
      scalar_kernels().gemm(sub);
      continue;
    }
    const uint8_t* w0 = w.data + static_cast<int64_t>(n0) * w.row_bytes;
    const uint8_t* s0 = w.scales + static_cast<int64_t>(n0) * nb;
    float dot[1][kNR];
    mx4_f32_rows(w0, w.row_bytes, s0, nb, K, nr, y, dot[0]);
    epilogue(a, n0, nr, 0, 1, dot);
  }
}
}  // namespace

void gemm_fp4_mx_avx512(const GemmArgs& a) { gemm_fp4<true>(a); }
void gemm_fp4_nv_avx512(const GemmArgs& a) { gemm_fp4<false>(a); }
void gemm_mxfp4_f32_avx512(const GemmArgs& a) { gemm_mxfp4_f32_rows(a); }

}  // namespace qmoe::cpu
