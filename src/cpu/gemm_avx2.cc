// The AVX2 target's GEMM translation unit (compiled with -mavx2 -mfma -mf16c): the generic kernels
// of simd/gemm.h instantiated on the AVX2 ISA layer (simd/avx2.h), plus the AVX2-only kernels:
//   MXFP4 weights on the F32 kind (W4A16): bf16-table decode into a register order the permuted
//         activations follow (gemm_mxfp4_f32);
#include "cpu/simd/avx2.h"
#include "cpu/simd/gemm.h"

namespace qmoe::cpu {

namespace {

constexpr int kNR = Avx2::kNR;
constexpr int kNT = Avx2::kNT;
constexpr int kFp4Rows = 4;  // rows per pass of the one-token MXFP4 W4A16 driver

// W4A16 MXFP4 with 1–4 tokens (decode): the nibbles of a 64-chunk (32 bytes) through two vpshufb
// tables (low and high byte of the code's bf16 value, exact) and vpunpck{l,h}bw give 64 bf16 words;
// each 256-bit word vector yields two fp32 vectors, even words (<< 16) and odd words
// (& 0xFFFF0000). No int → float conversion, and every operation stays inside its 128-bit lane, so
// lanes 0–3 of each of the 8 vectors hold block 2c and lanes 4–7 block 2c + 1: each token's partial
// sum is multiplied once per chunk by [2^(s_2c−127) × 4 | 2^(s_2c+1−127) × 4] (exact: powers of two).
// The activations are copied once per call into that register order (Mxfp4wTables::pos).
struct Mxfp4wTables {
  int8_t lo[16], hi[16];  // bf16 bits of e2m1 code c: low byte, high byte
  uint8_t pos[64];        // register slot v·8 + q of a 64-chunk → stored (fp4 order) position
};
constexpr Mxfp4wTables make_mxfp4w_tables() {
  Mxfp4wTables t{};
  const uint16_t mag[8] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0};
  for (int c = 0; c < 16; ++c) {
    const uint16_t b = static_cast<uint16_t>(mag[c & 7] | ((c & 8) ? 0x8000 : 0));
    t.lo[c] = static_cast<int8_t>(b & 0xFF);
    t.hi[c] = static_cast<int8_t>(b >> 8);
  }
  // Vector v = 4·o + 2·u + e (o: low / high nibble, u: unpacklo / unpackhi, e: even / odd word),
  // lane q: byte j = 16·(q / 4) + 8·u + 2·(q % 4) + e of the chunk, element 2j + o.
  for (int v = 0; v < 8; ++v)
    for (int q = 0; q < 8; ++q) {
      const int o = v >> 2, u = (v >> 1) & 1, e = v & 1;
      const int j = 16 * (q / 4) + 8 * u + 2 * (q % 4) + e;
      t.pos[8 * v + q] = static_cast<uint8_t>(fp4_value_position(2 * j + o));  // element 2j + o of the chunk
    }
  return t;
}
constexpr Mxfp4wTables kMxfp4w = make_mxfp4w_tables();

// The 64 weights of one chunk (32 bytes) as 8 fp32 vectors in register order (exact).
__attribute__((always_inline)) inline void mxfp4w_decode(__m256i bytes, __m256i tlo, __m256i thi, __m256i m4, __m256* w) {
  const __m256i top = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m256i nib[2] = {_mm256_and_si256(bytes, m4), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4)};
  for (int o = 0; o < 2; ++o) {
    const __m256i l = _mm256_shuffle_epi8(tlo, nib[o]), h = _mm256_shuffle_epi8(thi, nib[o]);
    const __m256i words[2] = {_mm256_unpacklo_epi8(l, h), _mm256_unpackhi_epi8(l, h)};
    for (int u = 0; u < 2; ++u) {
      w[4 * o + 2 * u] = _mm256_castsi256_ps(_mm256_slli_epi32(words[u], 16));
      w[4 * o + 2 * u + 1] = _mm256_castsi256_ps(_mm256_and_si256(words[u], top));
    }
  }
}

template <bool kFull>
__attribute__((always_inline)) inline __m256i mxfp4w_bytes(const uint8_t* row, int k, int K) {
  if constexpr (kFull) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (k >> 1)));
  uint8_t tmp[32];
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(padded(row + (k >> 1), (K - k) >> 1, tmp)));
}

template <int NT, int NR, bool kFull>
__attribute__((always_inline)) inline void mxfp4w_step(const uint8_t* const* rows, const MxRow* f, const float* const* act,
                                                       int k, int K, __m256i tlo, __m256i thi, __m256i m4,
                                                       __m256 (&acc)[NT][NR]) {
  const int b = k >> 5;  // the chunk's first block
  if constexpr (NT == 1) {
    // One token: its chunk loaded once for the NR rows; four partial sums per row (short chains).
    __m256 x[8];
    for (int j = 0; j < 8; ++j) x[j] = _mm256_loadu_ps(act[0] + k + 8 * j);
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      __m256 w[8];
      mxfp4w_decode(mxfp4w_bytes<kFull>(rows[i], k, K), tlo, thi, m4, w);
      const __m256 sv = Avx2::w4_weight_scales<true, kFull>(f[i], b, K >> 5);
      __m256 p0 = _mm256_mul_ps(w[0], x[0]);
      __m256 p1 = _mm256_mul_ps(w[1], x[1]);
      __m256 p2 = _mm256_mul_ps(w[2], x[2]);
      __m256 p3 = _mm256_mul_ps(w[3], x[3]);
      p0 = _mm256_fmadd_ps(w[4], x[4], p0);
      p1 = _mm256_fmadd_ps(w[5], x[5], p1);
      p2 = _mm256_fmadd_ps(w[6], x[6], p2);
      p3 = _mm256_fmadd_ps(w[7], x[7], p3);
      acc[0][i] = _mm256_fmadd_ps(_mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3)), sv, acc[0][i]);
    }
  } else {
#pragma GCC unroll 2
    for (int i = 0; i < NR; ++i) {
      __m256 w[8];
      mxfp4w_decode(mxfp4w_bytes<kFull>(rows[i], k, K), tlo, thi, m4, w);
      const __m256 sv = Avx2::w4_weight_scales<true, kFull>(f[i], b, K >> 5);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const float* x = act[t] + k;
        __m256 p0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
        __m256 p1 = _mm256_mul_ps(w[1], _mm256_loadu_ps(x + 8));
        p0 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), p0);
        p1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), p1);
        p0 = _mm256_fmadd_ps(w[4], _mm256_loadu_ps(x + 32), p0);
        p1 = _mm256_fmadd_ps(w[5], _mm256_loadu_ps(x + 40), p1);
        p0 = _mm256_fmadd_ps(w[6], _mm256_loadu_ps(x + 48), p0);
        p1 = _mm256_fmadd_ps(w[7], _mm256_loadu_ps(x + 56), p1);
        acc[t][i] = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), sv, acc[t][i]);
      }
    }
  }
}

inline __m256i mxfp4w_table(const int8_t* t) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}

// NR rows (the first `nr` of `rows` / `f` real) × NT tokens; res[t][i] for i < NR.
template <int NT, int NR>
__attribute__((always_inline)) inline void mxfp4w_kernel(const uint8_t* const* rows, const MxRow* f, const float* const* act, int K, int64_t pf_dist,
                   float (*res)[kFp4Rows]) {
  const __m256i tlo = mxfp4w_table(kMxfp4w.lo), thi = mxfp4w_table(kMxfp4w.hi);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < NR; ++i) acc[t][i] = _mm256_setzero_ps();
  const int kfull = K & ~63;
  int k = 0;
  if (pf_dist != 0) {
    for (; k + 128 <= kfull; k += 128) {
      for (int i = 0; i < NR; ++i) _mm_prefetch(reinterpret_cast<const char*>(rows[i] + pf_dist + (k >> 1)), _MM_HINT_T0);
      mxfp4w_step<NT, NR, true>(rows, f, act, k, K, tlo, thi, m4, acc);
      mxfp4w_step<NT, NR, true>(rows, f, act, k + 64, K, tlo, thi, m4, acc);
    }
  }
  for (; k < kfull; k += 64) mxfp4w_step<NT, NR, true>(rows, f, act, k, K, tlo, thi, m4, acc);
  if (k < K) mxfp4w_step<NT, NR, false>(rows, f, act, k, K, tlo, thi, m4, acc);
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < NR; ++i) res[t][i] = hsum(acc[t][i]);
}

// MXFP4 weights on the F32 kind. The token rows are copied once per call (per tile of up to
// kMxfp4wTile tokens) into the register order of mxfp4w_decode (Mxfp4wTables::pos). One token: 4
// rows per pass through mxfp4w_kernel; more: 2 rows per pass, decoded again for every group of up
// to 4 tokens (only the first group prefetches; the rows stay in L1 / L2). Decoding a row pair once
// into an fp32 row buffer for all groups was slower from 5 tokens up to 16 and level at 32–64
// (Zen 3, one core, K = 2048, ns per token, row and 64 weights: 5 tokens 3.51 → 2.56–3.14, 8 tokens
// 2.53–3.15 → 2.11–2.65, 16 tokens 2.37 → 2.20; bench/RESULTS.md 2026-12-06, session 42). The
// kernel is inlined into this driver: called out of line (as GCC chose once the group loop came)
// the 4-token kernel took 2.54 ns instead of 2.19.
constexpr int kMxfp4wTile = 128;
template <>
void gemm_mxfp4_f32<Avx2>(const GemmArgs& a) {
  const WeightView& w = *a.w;
  const int K = w.cols;
  const ActLayout& l = *a.layout;
  const int nb = K / 32;
  const int kch = (K + 63) / 64 * 64;  // ≤ k_pad
  const int rows_per_pass = a.ntok == 1 ? kFp4Rows : kNR;
  const int tile = a.ntok < kMxfp4wTile ? a.ntok : kMxfp4wTile;
  float* xperm = static_cast<float*>(thread_scratch_buffer(1, sizeof(float) * static_cast<size_t>(tile) * static_cast<size_t>(kch)));
  const int64_t pf_dist = prefetch_distance(rows_per_pass * w.row_bytes);
  const float* e8 = e8m0_table();
  for (int t0 = 0; t0 < a.ntok; t0 += kMxfp4wTile) {
    const int ntt = a.ntok - t0 < kMxfp4wTile ? a.ntok - t0 : kMxfp4wTile;
    for (int t = 0; t < ntt; ++t) {
      const float* x =
          reinterpret_cast<const float*>(a.act_base + static_cast<int64_t>(a.act_index[t0 + t]) * l.stride + l.vals_off);
      float* y = xperm + static_cast<int64_t>(t) * kch;
      for (int c = 0; c < kch; c += 64)
        for (int q = 0; q < 64; ++q) y[c + q] = x[c + kMxfp4w.pos[q]];
    }
    for (int n0 = a.row0; n0 < a.row1; n0 += rows_per_pass) {
      const int nr = a.row1 - n0 < rows_per_pass ? a.row1 - n0 : rows_per_pass;
      const uint8_t* rows[kFp4Rows];
      MxRow hf[kFp4Rows];  // rows past nr repeat the last one
      for (int i = 0; i < rows_per_pass; ++i) {
        const int n = n0 + (i < nr ? i : nr - 1);
        rows[i] = w.data + static_cast<int64_t>(n) * w.row_bytes;
        hf[i] = {w.scales + static_cast<int64_t>(n) * nb, e8};
      }
      for (int j0 = 0; j0 < ntt; j0 += kNT) {
        const int nt = ntt - j0 < kNT ? ntt - j0 : kNT;
        const float* act[kNT];
        for (int t = 0; t < nt; ++t) act[t] = xperm + static_cast<int64_t>(j0 + t) * kch;
        const int64_t pf = j0 == 0 ? pf_dist : 0;
        float dot[kNT][kFp4Rows];
        switch (nt) {
          case 1:
            if (rows_per_pass == kFp4Rows) mxfp4w_kernel<1, kFp4Rows>(rows, hf, act, K, pf, dot);
            else mxfp4w_kernel<1, kNR>(rows, hf, act, K, pf, dot);
            break;
          case 2: mxfp4w_kernel<2, kNR>(rows, hf, act, K, pf, dot); break;
          case 3: mxfp4w_kernel<3, kNR>(rows, hf, act, K, pf, dot); break;
          default: mxfp4w_kernel<4, kNR>(rows, hf, act, K, pf, dot); break;
        }
        epilogue(a, n0, nr, t0 + j0, nt, dot);
      }
    }
  }
}
}  // namespace

void gemm_avx2(const GemmArgs& a) { gemm<Avx2>(a); }

}  // namespace qmoe::cpu
