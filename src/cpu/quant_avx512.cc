// AVX-512 activation quantizers, gated activations and the AVX-512 kernel table. The quantizers
// produce bit-for-bit the values of the scalar definition (quantize_row_scalar / formats.h):
// scaling by powers of two and single IEEE multiplications / divisions are exact replicas, and the
// minifloat rounding (round_minifloat) is round-to-nearest-even with saturation, checked against
// the formats.h encoders by the tests. The activation is evaluated in double like the reference.
// No library inline code here (see simd/gemm.h).
#include "cpu/simd/avx512.h"

namespace qmoe::cpu {

namespace {

// 2^e as float for e in [-149, 127].
float pow2f(int e) {
  if (e >= -126) return bits_to_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_to_float(1u << (e + 149));
}

inline __m512 vabs(__m512 v) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF))); }
inline __m512i sign_bits(__m512 v) { return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(static_cast<int>(0x80000000u))); }

// Round |y| to the grid of a minifloat with `mbits` mantissa bits and smallest normal exponent
// `emin` (subnormals below), ties to even, saturate to `maxv`; keep the sign of y.
inline __m512 round_minifloat(__m512 y, int mbits, int emin, float maxv) {
  const __m512 a = vabs(y);
  __m512i u = _mm512_castps_si512(a);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 23 - mbits), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32((1 << (22 - mbits)) - 1), lsb));
  u = _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(~((1u << (23 - mbits)) - 1u))));
  const __m512 rn = _mm512_castsi512_ps(u);
  const __m512 big = _mm512_set1_ps(pow2f(emin - mbits + 23));
  const __m512 rsub = _mm512_sub_ps(_mm512_add_ps(a, big), big);
  const __mmask16 sub = _mm512_cmp_ps_mask(a, _mm512_set1_ps(pow2f(emin)), _CMP_LT_OQ);
  __m512 r = _mm512_mask_blend_ps(sub, rn, rsub);
  r = _mm512_min_ps(r, _mm512_set1_ps(maxv));  // NaN / overflow → max
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign_bits(y)));
}

inline float hmax_abs(__m512 a, __m512 b) { return _mm512_reduce_max_ps(_mm512_max_ps(vabs(a), vabs(b))); }

struct Row {
  const ActLayout& l;
  uint8_t* dst;
  float* fvals() const { return reinterpret_cast<float*>(dst + l.vals_off); }
  int8_t* ivals() const { return reinterpret_cast<int8_t*>(dst + l.vals_off); }
  float* bscales() const { return reinterpret_cast<float*>(dst + l.scales_off); }
};

// Reorders a 32-group (v0 = elements 0..15, v1 = 16..31) into act order.
inline void to_act_order(bool fp4, __m512& v0, __m512& v1) {
  if (!fp4) return;
  const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512 e = _mm512_permutex2var_ps(v0, ev, v1);
  const __m512 o = _mm512_permutex2var_ps(v0, od, v1);
  v0 = e;
  v1 = o;
}

// Stored positions of the two 16-value halves of the 32-group at element g (see ActLayout).
inline void group_positions(const Row& r, int g, int& p0, int& p1) {
  if (r.l.fp4_order) {
    p0 = (g & ~63) + 16 * ((g >> 5) & 1);  // even elements
    p1 = p0 + 32;                          // odd elements
  } else {
    p0 = g;
    p1 = g + 16;
  }
}
// Bf16 kind: the three truncation terms of 16 fp32 values (split_bf16_terms) at stored position p.
inline void store_bf16_terms(const Row& r, int p, __m512 v) {
  const __m512i hi16 = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 fin = _mm512_cmp_ps_mask(vabs(v), _mm512_set1_ps(bits_to_float(0x7F800000u)), _CMP_LT_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  __m512i h = _mm512_and_si512(u, hi16);
  h = _mm512_mask_or_epi32(h, nan, _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                           _mm512_set1_epi32(0x7FC00000));
  const __m512 rres = _mm512_maskz_sub_ps(fin, v, _mm512_castsi512_ps(h));
  const __m512i m = _mm512_and_si512(_mm512_castps_si512(rres), hi16);
  const __m512 lres = _mm512_sub_ps(rres, _mm512_castsi512_ps(m));
  uint8_t* base = r.dst + r.l.vals_off + 2 * static_cast<int64_t>(p);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(base), _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + r.l.term_bytes), _mm512_cvtepi32_epi16(_mm512_srli_epi32(m, 16)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + 2 * r.l.term_bytes),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lres), 16)));
}
inline void store_f32_group(const Row& r, int g, __m512 v0, __m512 v1) {
  to_act_order(r.l.fp4_order, v0, v1);
  int p0, p1;
  group_positions(r, g, p0, p1);
  if (r.l.kind == DotKind::Bf16) {
    store_bf16_terms(r, p0, v0);
    store_bf16_terms(r, p1, v1);
    return;
  }
  _mm512_storeu_ps(r.fvals() + p0, v0);
  _mm512_storeu_ps(r.fvals() + p1, v1);
}
// Terms in use of a Bf16 row (header word at 8): 1 + the highest term row holding a nonzero.
inline int32_t bf16_terms_in_use(const ActLayout& l, const uint8_t* row) {
  int32_t nt = 1;
  for (int t = 1; t < kBf16Terms; ++t) {
    __m512i any = _mm512_setzero_si512();
    const uint8_t* p = row + l.vals_off + t * l.term_bytes;
    for (int64_t b = 0; b < l.term_bytes; b += 64) any = _mm512_or_si512(any, _mm512_loadu_si512(p + b));
    if (_mm512_test_epi64_mask(any, any) != 0) nt = t + 1;
  }
  return nt;
}
// Integer values (already integral floats) of a 32-group as int8 in act order; returns their sum.
inline __m512i store_i8_group(const Row& r, int g, __m512 v0, __m512 v1) {
  to_act_order(r.l.fp4_order, v0, v1);
  int p0, p1;
  group_positions(r, g, p0, p1);
  const __m512i i0 = _mm512_cvtps_epi32(v0), i1 = _mm512_cvtps_epi32(v1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(r.ivals() + p0), _mm512_cvtsepi32_epi8(i0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(r.ivals() + p1), _mm512_cvtsepi32_epi8(i1));
  return _mm512_add_epi32(i0, i1);
}

inline void load_group(const float* x, int g, int k, __m512& x0, __m512& x1) {
  if (g + 32 <= k) {
    x0 = _mm512_loadu_ps(x + g);
    x1 = _mm512_loadu_ps(x + g + 16);
  } else {
    x0 = _mm512_maskz_loadu_ps(mask16(k - g), x + g);
    x1 = _mm512_maskz_loadu_ps(mask16(k - g - 16), x + g + 16);
  }
}

float row_abs_max(const float* x, int k) { return abs_max_avx512(x, k); }

// Exact round half away from zero of integral-or-not v (formats.h round_half_away = roundf).
inline __m512 round_half_away(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 d = vabs(_mm512_sub_ps(v, t));
  const __mmask16 up = _mm512_cmp_ps_mask(d, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 one = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0f)), sign_bits(v)));
  return _mm512_mask_add_ps(t, up, t, one);
}

inline __m512 clamp(__m512 v, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi)); }

int mx_elem_of(ActQuant a) {  // MxElem numbering of formats.h: Fp4E2M1 0, Fp6E2M3 1, Fp6E3M2 2
  return a == ActQuant::Mxfp4 ? 0 : a == ActQuant::Mxfp6E2M3 ? 1 : 2;
}

}  // namespace

float abs_max_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, vabs(v));
  }
  if (i < n) {
    const __m512 v = _mm512_maskz_loadu_ps(mask16(static_cast<int>(n - i)), x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, vabs(v));
  }
  if (nan) return bits_to_float(0x7FC00000u);
  return _mm512_reduce_max_ps(m);
}

void quantize_row_avx512(const QuantRowArgs& a) {
  const ActLayout& l = *a.layout;
  const ref::ActQuantRule& rule = *a.rule;
  const float* x = a.x;
  const int k = l.k;
  const Row r{l, a.dst};
  std::memset(a.dst, 0, 64);
  {  // zero the value tail from the last (partial) 32-group on (every term row), and the block-scale slack
    const int from = l.fp4_order ? (k & ~63) : (k & ~31);
    for (int64_t t = 0; t < l.vals_bytes / l.term_bytes; ++t)
      std::memset(a.dst + l.vals_off + t * l.term_bytes + static_cast<int64_t>(from) * l.elem_bytes, 0,
                  static_cast<size_t>(l.k_pad - from) * l.elem_bytes);
    if (l.scales_off > 0) std::memset(a.dst + l.scales_off, 0, static_cast<size_t>(l.stride - l.scales_off));
  }
  float row_scale = 1.0f;
  int32_t sum = 0;
  const bool ints = l.kind != DotKind::F32 && l.kind != DotKind::Bf16;
  __m512i isum = _mm512_setzero_si512();
  switch (rule.kind) {
    case ActQuant::None:
      for (int g = 0; g < k; g += 32) {
        __m512 x0, x1;
        load_group(x, g, k, x0, x1);
        store_f32_group(r, g, x0, x1);
      }
      break;
    case ActQuant::Fp8Static:
    case ActQuant::Fp8DynToken:
    case ActQuant::Fp8DynTensor: {
      float s = rule.static_scale;
      if (rule.kind == ActQuant::Fp8DynTensor) s = a.tensor_scale;
      if (rule.kind == ActQuant::Fp8DynToken) {
        const float m = row_abs_max(x, k) / 448.0f;
        const float lo = 1.0f / (448.0f * 512.0f);
        s = m > lo ? m : lo;  // fmaxf (NaN m → lo, as fmaxf)
        if (m != m) s = lo;
      }
      row_scale = s;
      const __m512 inv = _mm512_set1_ps(1.0f / s);
      for (int g = 0; g < k; g += 32) {
        __m512 x0, x1;
        load_group(x, g, k, x0, x1);
        const __m512 q0 = round_minifloat(clamp(_mm512_mul_ps(x0, inv), -448.0f, 448.0f), 3, -6, 448.0f);
        const __m512 q1 = round_minifloat(clamp(_mm512_mul_ps(x1, inv), -448.0f, 448.0f), 3, -6, 448.0f);
        store_f32_group(r, g, q0, q1);
      }
      break;
    }
    case ActQuant::Int8Static:
    case ActQuant::Int8DynToken: {
      __m512 mul;
      bool divide = rule.kind == ActQuant::Int8Static;
      if (divide) {
        row_scale = rule.static_scale;
        mul = _mm512_set1_ps(row_scale);
      } else {
        float amax = row_abs_max(x, k);
        const float am = amax > 1e-10f ? amax : 1e-10f;
        row_scale = am / 127.0f;
        mul = _mm512_set1_ps(127.0f / am);
      }
      for (int g = 0; g < k; g += 32) {
        __m512 x0, x1;
        load_group(x, g, k, x0, x1);
        __m512 q0, q1;
        if (divide) {
          q0 = clamp(_mm512_roundscale_ps(_mm512_div_ps(x0, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), -128.0f, 127.0f);
          q1 = clamp(_mm512_roundscale_ps(_mm512_div_ps(x1, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), -128.0f, 127.0f);
        } else {
          q0 = clamp(round_half_away(_mm512_mul_ps(x0, mul)), -127.0f, 127.0f);
          q1 = clamp(round_half_away(_mm512_mul_ps(x1, mul)), -127.0f, 127.0f);
        }
        if (ints) isum = _mm512_add_epi32(isum, store_i8_group(r, g, q0, q1));
        else store_f32_group(r, g, q0, q1);
      }
      sum = _mm512_reduce_add_epi32(isum);
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
        __m512 x0, x1;
        load_group(x, g, k, x0, x1);
        const int shared = mx_shared_exponent_of(hmax_abs(x0, x1), elem, static_cast<int>(rule.mx_mode));
        const __m512 down = _mm512_set1_ps(pow2f(-shared)), up = _mm512_set1_ps(pow2f(shared));
        const __m512 q0 = round_minifloat(_mm512_mul_ps(x0, down), mbits, emin, maxv);
        const __m512 q1 = round_minifloat(_mm512_mul_ps(x1, down), mbits, emin, maxv);
        if (l.kind == DotKind::Fp4Mx) {
          store_i8_group(r, g, _mm512_add_ps(q0, q0), _mm512_add_ps(q1, q1));
          r.bscales()[g / 32] = pow2f(shared);
        } else {
          store_f32_group(r, g, _mm512_mul_ps(q0, up), _mm512_mul_ps(q1, up));
        }
      }
      if (l.kind == DotKind::Fp4Mx) row_scale = 0.25f;
      break;
    }
    case ActQuant::Nvfp4: {
      const float gs = rule.static_scale;
      for (int g = 0; g < k; g += 32) {
        __m512 x0, x1;
        load_group(x, g, k, x0, x1);
        __m512 q[2], deqv[2];
        const __m512 xs[2] = {x0, x1};
        for (int h = 0; h < 2; ++h) {
          if (g + 16 * h >= k) {
            q[h] = deqv[h] = _mm512_setzero_ps();
            continue;
          }
          const float amax = _mm512_reduce_max_ps(vabs(xs[h]));
          float s = gs * amax / 6.0f;
          s = s < -448.0f ? -448.0f : s > 448.0f ? 448.0f : s;
          const float sb = fp8_e4m3_round(s);
          const float inv = sb == 0.0f ? 0.0f : gs / sb;
          const float deq = sb / gs;
          q[h] = round_minifloat(clamp(_mm512_mul_ps(xs[h], _mm512_set1_ps(inv)), -6.0f, 6.0f), 1, 0, 6.0f);
          deqv[h] = _mm512_set1_ps(deq);
          if (l.kind == DotKind::Fp4Nv) r.bscales()[g / 16 + h] = deq;
        }
        if (l.kind == DotKind::Fp4Nv) store_i8_group(r, g, _mm512_add_ps(q[0], q[0]), _mm512_add_ps(q[1], q[1]));
        else store_f32_group(r, g, _mm512_mul_ps(q[0], deqv[0]), _mm512_mul_ps(q[1], deqv[1]));
      }
      if (l.kind == DotKind::Fp4Nv) row_scale = 0.25f;
      break;
    }
  }
  std::memcpy(a.dst, &row_scale, 4);
  std::memcpy(a.dst + 4, &sum, 4);
  if (l.kind == DotKind::Bf16) {
    const int32_t nt = bf16_terms_in_use(l, a.dst);
    std::memcpy(a.dst + 8, &nt, 4);
  }
  if (l.corr_off > 0) {  // −12 · Σ of each 4 values (fill_fp4_corrections, vectorized)
    const __m512i ones = _mm512_set1_epi8(1), m12 = _mm512_set1_epi32(-12);
    for (int p = 0; p < l.k_pad; p += 64) {
      const __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(r.ivals() + p));
      _mm512_storeu_si512(a.dst + l.corr_off + p, _mm512_mullo_epi32(s4, m12));
    }
    fill_fp4_block_corrections(l, a.dst);
  }
}

// ---------------------------------------------------------------------------------------------
// Gated activations in double (8 lanes), rounded once to fp32, like ref::activation_value.
namespace {

// e^x in double, |relative error| ≲ 2 ulp: x = n·ln2 + r, |r| ≤ ln2/2, degree-13 Taylor, scalef.
inline __m512d vexp(__m512d x) {
  x = _mm512_min_pd(_mm512_max_pd(x, _mm512_set1_pd(-746.0)), _mm512_set1_pd(710.0));
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634074)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), x);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
  __m512d p = _mm512_set1_pd(1.0 / 6227020800.0);
  const double c[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
                      1.0 / 720.0,       1.0 / 120.0,      1.0 / 24.0,      1.0 / 6.0,      0.5,           1.0,
                      1.0};
  for (double ci : c) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(ci));
  return _mm512_scalef_pd(p, n);
}
inline __m512d vsigmoid(__m512d v) {
  const __m512d one = _mm512_set1_pd(1.0);
  return _mm512_div_pd(one, _mm512_add_pd(one, vexp(_mm512_sub_pd(_mm512_setzero_pd(), v))));
}

inline __m512d act8(const ActParams& a, __m512d g, __m512d u) {
  switch (a.kind) {
    case Activation::Silu: {
      if (a.has_limit) {
        const __m512d lim = _mm512_set1_pd(static_cast<double>(a.limit));
        g = _mm512_min_pd(g, lim);
        u = _mm512_min_pd(_mm512_max_pd(u, _mm512_sub_pd(_mm512_setzero_pd(), lim)), lim);
      }
      return _mm512_mul_pd(_mm512_mul_pd(g, vsigmoid(g)), u);
    }
    case Activation::GeluTanh: {
      const __m512d g3 = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(_mm512_set1_pd(0.044715), g), g), g);
      const __m512d z = _mm512_mul_pd(_mm512_set1_pd(0.79788456080286535588), _mm512_add_pd(g, g3));
      // tanh z = sign(z)·(1 − 2/(e^{2|z|} + 1)): close to correctly rounded near ±1, where the
      // reference's 1 + tanh z cancels.
      const __m512d one = _mm512_set1_pd(1.0);
      const __m512d az = _mm512_abs_pd(z);
      const __m512d ta = _mm512_sub_pd(one, _mm512_div_pd(_mm512_set1_pd(2.0), _mm512_add_pd(vexp(_mm512_add_pd(az, az)), one)));
      const __m512d t = _mm512_castsi512_pd(_mm512_or_si512(
          _mm512_castpd_si512(ta), _mm512_and_si512(_mm512_castpd_si512(z), _mm512_set1_epi64(static_cast<long long>(0x8000000000000000ull)))));
      return _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(_mm512_set1_pd(0.5), g), _mm512_add_pd(one, t)), u);
    }
    default: {  // SwigluOai
      const __m512d lim = _mm512_set1_pd(a.has_limit ? static_cast<double>(a.limit) : 7.0);
      const __m512d gc = _mm512_min_pd(g, lim);
      const __m512d uc = _mm512_min_pd(_mm512_max_pd(u, _mm512_sub_pd(_mm512_setzero_pd(), lim)), lim);
      const __m512d sg = vsigmoid(_mm512_mul_pd(_mm512_set1_pd(static_cast<double>(a.alpha)), gc));
      return _mm512_mul_pd(_mm512_mul_pd(_mm512_add_pd(uc, _mm512_set1_pd(1.0)), gc), sg);
    }
  }
}

}  // namespace

void activation_row_avx512(const ActParams& act, const float* y1, int inter, float* z) {
  if (act.kind == Activation::Gelu) return activation_row_scalar(act, y1, inter, z);  // erf
  for (int j = 0; j < inter; j += 8) {
    const int n = inter - j < 8 ? inter - j : 8;
    const __mmask8 m = static_cast<__mmask8>((1u << n) - 1u);
    __m256 g, u;
    if (act.interleaved) {
      const __m512 v = _mm512_maskz_loadu_ps(mask16(2 * n), y1 + 2 * j);
      g = _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0), v));
      u = _mm256_castpd_ps(_mm512_extractf64x4_pd(
          _mm512_castps_pd(_mm512_permutexvar_ps(_mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0), v)), 1));
    } else {
      g = _mm256_maskz_loadu_ps(m, y1 + j);
      u = _mm256_maskz_loadu_ps(m, y1 + inter + j);
    }
    const __m512d r = act8(act, _mm512_cvtps_pd(g), _mm512_cvtps_pd(u));
    _mm256_mask_storeu_ps(z + j, m, _mm512_cvtpd_ps(r));
  }
}

const KernelTable& avx512_kernels() {
  static const KernelTable t = [] {
    KernelTable k;
    k.isa = Isa::Avx512;
    k.quantize_row = quantize_row_avx512;
    k.gemm = gemm_avx512;
    k.activation_row = activation_row_avx512;
    k.abs_max = abs_max_avx512;
    return k;
  }();
  return t;
}

const KernelTable& avx512bf16_kernels() {
  static const KernelTable t = [] {
    KernelTable k = avx512_kernels();
    k.isa = Isa::Avx512Bf16;
    return k;
  }();
  return t;
}

}  // namespace qmoe::cpu
