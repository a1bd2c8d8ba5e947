// Helpers shared by the AVX-512 translation units (*_avx512.cc) only: never include it from code
// compiled for the baseline ISA. Everything is in an anonymous namespace (internal linkage), so
// no AVX-512 instance of these functions can be picked by the linker for another TU.
#pragma once

// GCC 12's AVX-512 headers implement the "undefined upper bits" casts with self-initialised
// variables, which -Wuninitialized (-Werror) flags inside the intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernel_iface.h"

namespace qmoe::cpu {

// W4A4 entry points (gemm_fp4_avx512.cc).
void gemm_fp4_mx_avx512(const GemmArgs& a);
void gemm_fp4_nv_avx512(const GemmArgs& a);

namespace {

constexpr int kNR = 4;  // weight rows per micro-kernel
constexpr int kNT = 4;  // tokens per micro-kernel
constexpr int64_t kPrefetchBytes = 8192;  // software prefetch distance (see Prefetch)

// Row-major kernels read kNR rows interleaved, each a short stream, which the hardware
// prefetchers follow poorly (measured on Zen 4: ~10 GB/s against ~17 GB/s sequential, one core).
// So they prefetch a later row block in address order: step s of row i fetches the bytes
// (s·nr + i)·bytes_per_step of the block at distance ≥ kPrefetchBytes, which sweeps that block
// sequentially while the current one is consumed (measured back to ~16 GB/s).
inline int64_t prefetch_distance(int64_t block_bytes) {
  return block_bytes <= 0 ? 0 : (kPrefetchBytes + block_bytes - 1) / block_bytes * block_bytes;
}
inline void prefetch_seq(const uint8_t* block, int64_t dist, int step, int i, int nr, int bytes_per_step) {
  const uint8_t* p = block + dist + (static_cast<int64_t>(step) * nr + i) * bytes_per_step;
  for (int off = 0; off < bytes_per_step; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
}

inline __mmask16 mask16(int n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1u); }
inline __mmask64 mask64(int n) { return n >= 64 ? ~0ull : n <= 0 ? 0ull : ((1ull << n) - 1ull); }

inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
inline int32_t hsum_epi32(__m512i v) {
  const __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  const __m128i b = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  const __m128i c = _mm_add_epi32(b, _mm_unpackhi_epi64(b, b));
  return _mm_cvtsi128_si32(_mm_add_epi32(c, _mm_shuffle_epi32(c, 1)));
}

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
const float kE2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};


// FP8 E4M3 code c → (c << 24) >>arith 4 keeps the sign in bit 31 and puts exponent|mantissa at
// bits 26..20 (an fp32 of value v·2^−120, subnormals included), then × 2^120. Codes 0x7F/0xFF
// (NaN) decode as ±480: NaN weights are not representable here.
inline __m512 fp8_to_f32(__m128i bytes) {
  const __m512i c = _mm512_cvtepu8_epi32(bytes);
  const __m512i b = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(c, 24), 4), _mm512_set1_epi32(static_cast<int>(0x87F00000u)));
  return _mm512_mul_ps(_mm512_castsi512_ps(b), _mm512_set1_ps(bits_to_float(0x7B800000u)));  // 2^120
}

// Decoders may produce weights × 2^−s (kPostScale = 2^s restores them in the epilogue).
template <class D>
constexpr double post_scale_of() {
  if constexpr (requires { D::kPostScale; }) return D::kPostScale;
  return 1.0;
}

// Output of one (row block, token group).
template <class Dot>
inline void epilogue(const GemmArgs& a, int n0, int nr, int j0, int nt, const Dot (*dot)[kNR], double post_scale = 1.0) {
  const WeightView& w = *a.w;
  alignas(32) double ws[kNR] = {}, bias[kNR] = {};
  for (int i = 0; i < nr; ++i) {
    const int n = n0 + i;
    ws[i] = (w.channel_scale ? static_cast<double>(w.channel_scale[n]) : static_cast<double>(w.tensor_scale)) * post_scale;
    bias[i] = w.bias ? static_cast<double>(bias_value(w, n)) : 0.0;
  }
  const __m256d wsv = _mm256_load_pd(ws), bv = _mm256_load_pd(bias);
  for (int t = 0; t < nt; ++t) {
    const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * a.layout->stride;
    float rs;
    std::memcpy(&rs, row, 4);
    float* out = a.out + static_cast<int64_t>(j0 + t) * a.ldo + n0;
    // y = fl32(dot · rs · ws + bias) in double (separate mul / add roundings), then × router weight.
    __m256d d;
    if constexpr (sizeof(Dot) == 8) d = _mm256_loadu_pd(reinterpret_cast<const double*>(dot[t]));
    else d = _mm256_cvtps_pd(_mm_loadu_ps(reinterpret_cast<const float*>(dot[t])));
    d = _mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(d, _mm256_set1_pd(static_cast<double>(rs))), wsv), bv);
    __m128 y = _mm256_cvtpd_ps(d);
    if (a.post_mul) y = _mm_mul_ps(y, _mm_set1_ps(a.post_mul[j0 + t]));
    _mm_mask_storeu_ps(out, static_cast<__mmask8>((1u << nr) - 1u), y);
  }
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

}  // namespace
}  // namespace qmoe::cpu
