// AVX2 activation quantizers, gated activations (double, 4 lanes) and the AVX2 kernel table.
// Same definitions as quant_avx512.cc at 8 lanes (the Bf16 kind is not used on AVX2).
// No library inline code here (see gemm_avx512.cc).
// GCC 12's AVX-512 headers implement the "undefined upper bits" casts with self-initialised
// variables, which -Wuninitialized (-Werror) flags inside the intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernel_iface.h"

namespace qmoe::cpu {

namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float pow2f(int e) {
  if (e >= -126) return bits_to_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_to_float(1u << (e + 149));
}

inline __m256 vabs(__m256 v) { return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF))); }
inline __m256i sign_bits(__m256 v) { return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(static_cast<int>(0x80000000u))); }

inline __m256 round_minifloat(__m256 y, int mbits, int emin, float maxv) {
  const __m256 a = vabs(y);
  __m256i u = _mm256_castps_si256(a);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 23 - mbits), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32((1 << (22 - mbits)) - 1), lsb));
  u = _mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(~((1u << (23 - mbits)) - 1u))));
  const __m256 rn = _mm256_castsi256_ps(u);
  const __m256 big = _mm256_set1_ps(pow2f(emin - mbits + 23));
  const __m256 rsub = _mm256_sub_ps(_mm256_add_ps(a, big), big);
  const __m256 sub = _mm256_cmp_ps(a, _mm256_set1_ps(pow2f(emin)), _CMP_LT_OQ);
  __m256 r = _mm256_blendv_ps(rn, rsub, sub);
  r = _mm256_min_ps(r, _mm256_set1_ps(maxv));
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(r), sign_bits(y)));
}

inline __m256 clamp(__m256 v, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi)); }

inline __m256 round_half_away(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 d = vabs(_mm256_sub_ps(v, t));
  const __m256 up = _mm256_cmp_ps(d, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 one = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(_mm256_set1_ps(1.0f)), sign_bits(v)));
  return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// A 32-group as four 8-lane vectors v[0..3] (elements 0..7, 8..15, 16..23, 24..31).
inline void load_group(const float* x, int g, int k, __m256* v) {
  if (g + 32 <= k) {
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + g + 8 * j);
  } else {
    alignas(32) float tmp[32] = {};
    std::memcpy(tmp, x + g, static_cast<size_t>(k - g) * 4);
    for (int j = 0; j < 4; ++j) v[j] = _mm256_load_ps(tmp + 8 * j);
  }
}

// Act order of fp4 weights: even elements of the group, then odd.
inline void to_act_order(bool fp4, __m256* v) {
  if (!fp4) return;
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

struct Row {
  const ActLayout& l;
  uint8_t* dst;
  float* fvals() const { return reinterpret_cast<float*>(dst + l.vals_off); }
  int8_t* ivals() const { return reinterpret_cast<int8_t*>(dst + l.vals_off); }
};

inline void store_f32_group(const Row& r, int g, __m256* v) {
  to_act_order(r.l.fp4_order, v);
  if (r.l.fp4_order) {  // even elements at chunk + 16h, odd at chunk + 32 + 16h (see ActLayout)
    const int p0 = (g & ~63) + 16 * ((g >> 5) & 1);
    _mm256_storeu_ps(r.fvals() + p0, v[0]);
    _mm256_storeu_ps(r.fvals() + p0 + 8, v[1]);
    _mm256_storeu_ps(r.fvals() + p0 + 32, v[2]);
    _mm256_storeu_ps(r.fvals() + p0 + 40, v[3]);
    return;
  }
  for (int j = 0; j < 4; ++j) _mm256_storeu_ps(r.fvals() + g + 8 * j, v[j]);
}
// Integral values → int8 (natural order: the I8 kind only); returns the lane sums.
inline __m256i store_i8_group(const Row& r, int g, __m256* v) {
  const __m256i i0 = _mm256_cvtps_epi32(v[0]), i1 = _mm256_cvtps_epi32(v[1]);
  const __m256i i2 = _mm256_cvtps_epi32(v[2]), i3 = _mm256_cvtps_epi32(v[3]);
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.ivals() + g), ordered);
  return _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
}

// W4A4 kinds: integral values 2·q of a 32-group (v[0..3] = elements 0..31) as int8 in act order.
inline void store_fp4_i8_group(const Row& r, int g, __m256* v) {
  to_act_order(true, v);  // v[0], v[1]: the 16 even elements; v[2], v[3]: the 16 odd ones
  auto pack16 = [](__m256 a, __m256 b) {  // 16 int16 in element order
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b)), _MM_SHUFFLE(3, 1, 2, 0));
  };
  const __m256i e = pack16(v[0], v[1]), o = pack16(v[2], v[3]);
  // packs_epi16 per lane: [e0..7 | o0..7 | e8..15 | o8..15] → reorder the 64-bit quarters
  const __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi16(e, o), _MM_SHUFFLE(3, 1, 2, 0));
  const int p0 = (g & ~63) + 16 * ((g >> 5) & 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(r.ivals() + p0), _mm256_castsi256_si128(b));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(r.ivals() + p0 + 32), _mm256_extracti128_si256(b, 1));
}

int hsum_epi32(__m256i v) {
  const __m128i b = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i c = _mm_add_epi32(b, _mm_unpackhi_epi64(b, b));
  return _mm_cvtsi128_si32(_mm_add_epi32(c, _mm_shuffle_epi32(c, 1)));
}

int mx_elem_of(ActQuant a) { return a == ActQuant::Mxfp4 ? 0 : a == ActQuant::Mxfp6E2M3 ? 1 : 2; }

}  // namespace

float abs_max_avx2(const float* x, int64_t n) {
  __m256 m = _mm256_setzero_ps();
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, vabs(v));
  }
  float r = hmax(m);
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  for (; i < n; ++i) {
    const float a = x[i] < 0.0f ? -x[i] : x[i];
    if (a != a) any_nan = true;
    if (a > r) r = a;
  }
  return any_nan ? bits_to_float(0x7FC00000u) : r;
}

void quantize_row_avx2(const QuantRowArgs& a) {
  const ActLayout& l = *a.layout;
  const ref::ActQuantRule& rule = *a.rule;
  const float* x = a.x;
  const int k = l.k;
  const Row r{l, a.dst};
  if (l.kind == DotKind::Bf16) return quantize_row_scalar(a);  // not used on AVX2 (dot_kind_for)
  const bool fp4i = l.kind == DotKind::Fp4Mx || l.kind == DotKind::Fp4Nv;
  std::memset(a.dst, 0, 64);
  {
    const int from = l.fp4_order ? (k & ~63) : (k & ~31);
    std::memset(a.dst + l.vals_off + static_cast<int64_t>(from) * l.elem_bytes, 0,
                static_cast<size_t>(l.k_pad - from) * l.elem_bytes);
    if (l.scales_off > 0) std::memset(a.dst + l.scales_off, 0, static_cast<size_t>(l.stride - l.scales_off));
  }
  float* bscales = reinterpret_cast<float*>(a.dst + l.scales_off);
  float row_scale = 1.0f;
  __m256i isum = _mm256_setzero_si256();
  const bool ints = l.kind == DotKind::I8;
  __m256 v[4];
  switch (rule.kind) {
    case ActQuant::None:
      for (int g = 0; g < k; g += 32) {
        load_group(x, g, k, v);
        store_f32_group(r, g, v);
      }
      break;
    case ActQuant::Fp8Static:
    case ActQuant::Fp8DynToken:
    case ActQuant::Fp8DynTensor: {
      float s = rule.static_scale;
      if (rule.kind == ActQuant::Fp8DynTensor) s = a.tensor_scale;
      if (rule.kind == ActQuant::Fp8DynToken) {
        const float m = abs_max_avx2(x, k) / 448.0f;
        const float lo = 1.0f / (448.0f * 512.0f);
        s = m > lo ? m : lo;
      }
      row_scale = s;
      const __m256 inv = _mm256_set1_ps(1.0f / s);
      for (int g = 0; g < k; g += 32) {
        load_group(x, g, k, v);
        for (int j = 0; j < 4; ++j) v[j] = round_minifloat(clamp(_mm256_mul_ps(v[j], inv), -448.0f, 448.0f), 3, -6, 448.0f);
        store_f32_group(r, g, v);
      }
      break;
    }
    case ActQuant::Int8Static:
    case ActQuant::Int8DynToken: {
      const bool divide = rule.kind == ActQuant::Int8Static;
      __m256 mul;
      if (divide) {
        row_scale = rule.static_scale;
        mul = _mm256_set1_ps(row_scale);
      } else {
        const float amax = abs_max_avx2(x, k);
        const float am = amax > 1e-10f ? amax : 1e-10f;
        row_scale = am / 127.0f;
        mul = _mm256_set1_ps(127.0f / am);
      }
      for (int g = 0; g < k; g += 32) {
        load_group(x, g, k, v);
        for (int j = 0; j < 4; ++j)
          v[j] = divide ? clamp(_mm256_round_ps(_mm256_div_ps(v[j], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), -128.0f, 127.0f)
                        : clamp(round_half_away(_mm256_mul_ps(v[j], mul)), -127.0f, 127.0f);
        if (ints) isum = _mm256_add_epi32(isum, store_i8_group(r, g, v));
        else store_f32_group(r, g, v);
      }
      break;
    }
    case ActQuant::Mxfp4:
    case ActQuant::Mxfp6E2M3:
    case ActQuant::Mxfp6E3M2: {
      const int elem = mx_elem_of(rule.kind);
      const int mbits = elem == 0 ? 1 : elem == 1 ? 3 : 2;
      const int emin = elem == 2 ? -2 : 0;
      const float maxv = elem == 0 ? 6.0f : elem == 1 ? 7.5f : 28.0f;
      for (int g = 0; g < k; g += 32) {
        load_group(x, g, k, v);
        const float amax = hmax(_mm256_max_ps(_mm256_max_ps(vabs(v[0]), vabs(v[1])), _mm256_max_ps(vabs(v[2]), vabs(v[3]))));
        const int shared = mx_shared_exponent_of(amax, elem, static_cast<int>(rule.mx_mode));
        const __m256 down = _mm256_set1_ps(pow2f(-shared)), up = _mm256_set1_ps(pow2f(shared));
        if (fp4i) {  // Fp4Mx: 2·e2m1 codes and the block scale
          for (int j = 0; j < 4; ++j) {
            const __m256 q = round_minifloat(_mm256_mul_ps(v[j], down), mbits, emin, maxv);
            v[j] = _mm256_add_ps(q, q);
          }
          store_fp4_i8_group(r, g, v);
          bscales[g / 32] = pow2f(shared);
          continue;
        }
        for (int j = 0; j < 4; ++j) v[j] = _mm256_mul_ps(round_minifloat(_mm256_mul_ps(v[j], down), mbits, emin, maxv), up);
        store_f32_group(r, g, v);
      }
      if (fp4i) row_scale = 0.25f;
      break;
    }
    case ActQuant::Nvfp4: {
      const float gs = rule.static_scale;
      for (int g = 0; g < k; g += 32) {
        load_group(x, g, k, v);
        for (int h = 0; h < 2; ++h) {
          __m256* b = v + 2 * h;
          if (g + 16 * h >= k) {
            b[0] = b[1] = _mm256_setzero_ps();
            continue;
          }
          const float amax = hmax(_mm256_max_ps(vabs(b[0]), vabs(b[1])));
          float s = gs * amax / 6.0f;
          s = s < -448.0f ? -448.0f : s > 448.0f ? 448.0f : s;
          const float sb = fp8_e4m3_round(s);
          const float inv = sb == 0.0f ? 0.0f : gs / sb;
          const __m256 deq = _mm256_set1_ps(sb / gs);
          for (int j = 0; j < 2; ++j) {
            const __m256 q = round_minifloat(clamp(_mm256_mul_ps(b[j], _mm256_set1_ps(inv)), -6.0f, 6.0f), 1, 0, 6.0f);
            b[j] = fp4i ? _mm256_add_ps(q, q) : _mm256_mul_ps(q, deq);
          }
          if (fp4i) bscales[g / 16 + h] = sb / gs;
        }
        if (fp4i) store_fp4_i8_group(r, g, v);
        else store_f32_group(r, g, v);
      }
      if (fp4i) row_scale = 0.25f;
      break;
    }
  }
  const int32_t sum = hsum_epi32(isum);
  std::memcpy(a.dst, &row_scale, 4);
  std::memcpy(a.dst + 4, &sum, 4);
  if (fp4i) fill_fp4_corrections(l, a.dst);
}

// ---------------------------------------------------------------------------------------------
namespace {

// e^x in double (4 lanes); x clamped to [−708, 709] so 2^n is a normal double (the clamped
// results only matter through 1/(1 + e^x), which they leave exact in fp32).
inline __m256d vexp(__m256d x) {
  x = _mm256_min_pd(_mm256_max_pd(x, _mm256_set1_pd(-708.0)), _mm256_set1_pd(709.0));
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634074)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), x);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);
  __m256d p = _mm256_set1_pd(1.0 / 6227020800.0);
  const double c[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
                      1.0 / 720.0,       1.0 / 120.0,      1.0 / 24.0,      1.0 / 6.0,      0.5,           1.0,
                      1.0};
  for (double ci : c) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(ci));
  // 2^n: n ∈ [−1022, 1023] here.
  const __m256i ni = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n));
  const __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
}
inline __m256d vsigmoid(__m256d v) {
  const __m256d one = _mm256_set1_pd(1.0);
  return _mm256_div_pd(one, _mm256_add_pd(one, vexp(_mm256_sub_pd(_mm256_setzero_pd(), v))));
}

inline __m256d act4(const ActParams& a, __m256d g, __m256d u) {
  switch (a.kind) {
    case Activation::Silu: {
      if (a.has_limit) {
        const __m256d lim = _mm256_set1_pd(static_cast<double>(a.limit));
        g = _mm256_min_pd(g, lim);
        u = _mm256_min_pd(_mm256_max_pd(u, _mm256_sub_pd(_mm256_setzero_pd(), lim)), lim);
      }
      return _mm256_mul_pd(_mm256_mul_pd(g, vsigmoid(g)), u);
    }
    case Activation::GeluTanh: {
      const __m256d g3 = _mm256_mul_pd(_mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(0.044715), g), g), g);
      const __m256d z = _mm256_mul_pd(_mm256_set1_pd(0.79788456080286535588), _mm256_add_pd(g, g3));
      const __m256d one = _mm256_set1_pd(1.0);
      // tanh z = sign(z)·(1 − 2/(e^{2|z|} + 1)): close to correctly rounded near ±1, where the
      // reference's 1 + tanh z cancels.
      const __m256d az = _mm256_andnot_pd(_mm256_set1_pd(-0.0), z);
      const __m256d ta = _mm256_sub_pd(one, _mm256_div_pd(_mm256_set1_pd(2.0), _mm256_add_pd(vexp(_mm256_add_pd(az, az)), one)));
      const __m256d t = _mm256_or_pd(ta, _mm256_and_pd(z, _mm256_set1_pd(-0.0)));
      return _mm256_mul_pd(_mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(0.5), g), _mm256_add_pd(one, t)), u);
    }
    default: {
      const __m256d lim = _mm256_set1_pd(a.has_limit ? static_cast<double>(a.limit) : 7.0);
      const __m256d gc = _mm256_min_pd(g, lim);
      const __m256d uc = _mm256_min_pd(_mm256_max_pd(u, _mm256_sub_pd(_mm256_setzero_pd(), lim)), lim);
      const __m256d sg = vsigmoid(_mm256_mul_pd(_mm256_set1_pd(static_cast<double>(a.alpha)), gc));
      return _mm256_mul_pd(_mm256_mul_pd(_mm256_add_pd(uc, _mm256_set1_pd(1.0)), gc), sg);
    }
  }
}

}  // namespace

void activation_row_avx2(const ActParams& act, const float* y1, int inter, float* z) {
  if (act.kind == Activation::Gelu) return activation_row_scalar(act, y1, inter, z);
  for (int j = 0; j < inter; j += 4) {
    const int n = inter - j < 4 ? inter - j : 4;
    alignas(16) float g[4] = {}, u[4] = {}, out[4];
    for (int i = 0; i < n; ++i) {
      g[i] = act.interleaved ? y1[2 * (j + i)] : y1[j + i];
      u[i] = act.interleaved ? y1[2 * (j + i) + 1] : y1[inter + j + i];
    }
    const __m256d r = act4(act, _mm256_cvtps_pd(_mm_load_ps(g)), _mm256_cvtps_pd(_mm_load_ps(u)));
    _mm_store_ps(out, _mm256_cvtpd_ps(r));
    for (int i = 0; i < n; ++i) z[j + i] = out[i];
  }
}

const KernelTable& avx2_kernels() {
  static const KernelTable t = [] {
    KernelTable k;
    k.isa = Isa::Avx2;
    k.quantize_row = quantize_row_avx2;
    k.gemm = gemm_avx2;
    k.activation_row = activation_row_avx2;
    k.abs_max = abs_max_avx2;
    return k;
  }();
  return t;
}

}  // namespace qmoe::cpu
