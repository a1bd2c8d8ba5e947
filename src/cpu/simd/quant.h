// The activation quantizers, gated activations and abs-max of the CPU kernels, written once
// against a target's ISA layer T (simd/avx2.h, simd/avx512.h) and compiled once per target by that
// target's quant_<target>.cc (see simd/gemm.h for the scheme).
//
// The quantizers produce bit-for-bit the values of the scalar definition (quantize_row_scalar /
// formats.h): scaling by powers of two and single IEEE multiplications / divisions are exact
// replicas, and the minifloat rounding (round_minifloat) is round-to-nearest-even with
// saturation, checked against the formats.h encoders by the tests. A 32-group is kG = 32 / kLanes
// vectors; the activation is evaluated in double (T::kDLanes lanes) like the reference.
// What T provides beyond simd/gemm.h: float ops (set1, add, sub, mul, div, min, max, abs,
// trunc, round_even, reduce_max), bit ops (as_int / as_float, iset1, iand, ior, iadd, srli,
// sign_bits), masks M (lt, ge, isnan, select, mask_add, mor, any), load_partial, act_order
// (a group's even elements, then odd), store_i8_half, the Fp4 corrections, the Bf16 terms (where
// T::kBf16Rows), and the double ops of vexp / act (D, dset1 … dscale2, load_gate_up, store_d).
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/kernel_iface.h"

namespace qmoe::cpu {
namespace {

// 2^e as float for e in [-149, 127].
inline float pow2f(int e) {
  if (e >= -126) return bits_to_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_to_float(1u << (e + 149));
}

// Round |y| to the grid of a minifloat with `mbits` mantissa bits and smallest normal exponent
// `emin` (subnormals below), ties to even, saturate to `maxv`; keep the sign of y.
template <class T>
inline typename T::F round_minifloat(typename T::F y, int mbits, int emin, float maxv) {
  const typename T::F a = T::abs(y);
  typename T::I u = T::as_int(a);
  const typename T::I lsb = T::iand(T::srli(u, 23 - mbits), T::iset1(1));
  u = T::iadd(u, T::iadd(T::iset1((1 << (22 - mbits)) - 1), lsb));
  u = T::iand(u, T::iset1(static_cast<int>(~((1u << (23 - mbits)) - 1u))));
  const typename T::F rn = T::as_float(u);
  const typename T::F big = T::set1(pow2f(emin - mbits + 23));
  const typename T::F rsub = T::sub(T::add(a, big), big);
  typename T::F r = T::select(T::lt(a, T::set1(pow2f(emin))), rsub, rn);
  r = T::min(r, T::set1(maxv));  // NaN / overflow → max
  return T::as_float(T::ior(T::as_int(r), T::sign_bits(y)));
}

template <class T>
inline typename T::F clamp(typename T::F v, float lo, float hi) {
  return T::min(T::max(v, T::set1(lo)), T::set1(hi));
}

// Exact round half away from zero of integral-or-not v (formats.h round_half_away = roundf).
template <class T>
inline typename T::F round_half_away(typename T::F v) {
  const typename T::F t = T::trunc(v);
  const typename T::F d = T::abs(T::sub(v, t));
  const typename T::F one = T::as_float(T::ior(T::as_int(T::set1(1.0f)), T::sign_bits(v)));
  return T::mask_add(t, T::ge(d, T::set1(0.5f)), one);
}

template <class T>
struct Row {
  const ActLayout& l;
  uint8_t* dst;
  float* fvals() const { return reinterpret_cast<float*>(dst + l.vals_off); }
  int8_t* ivals() const { return reinterpret_cast<int8_t*>(dst + l.vals_off); }
  float* bscales() const { return reinterpret_cast<float*>(dst + l.scales_off); }
};

template <class T>
constexpr int kG = 32 / T::kLanes;  // vectors per 32-group

// The 32-group at element g of x[0..k) (zeros past k).
template <class T>
inline void load_group(const float* x, int g, int k, typename T::F* v) {
  for (int j = 0; j < kG<T>; ++j) v[j] = g + 32 <= k ? T::loadu(x + g + T::kLanes * j) : T::load_partial(x + g + T::kLanes * j, k - g - T::kLanes * j);
}

// Stored positions of the two 16-value halves of the 32-group at element g (see ActLayout):
// fp4 order: the even elements, then the odd ones, 32 apart; fp6 order: the halves, 32 apart;
// else g and g + 16.
template <class T>
inline void group_positions(const Row<T>& r, int g, int& p0, int& p1) {
  if (halves_apart(r.l)) {
    p0 = (g & ~63) + 16 * ((g >> 5) & 1);
    p1 = p0 + 32;
  } else {
    p0 = g;
    p1 = g + 16;
  }
}

template <class T>
inline void store_f32_group(const Row<T>& r, int g, typename T::F* v) {
  constexpr int H = kG<T> / 2;
  if (r.l.fp4_order) T::act_order(v);
  int p0, p1;
  group_positions(r, g, p0, p1);
  if constexpr (T::kBf16Rows) {
    if (r.l.kind == DotKind::Bf16) {
      for (int j = 0; j < H; ++j) {
        T::store_bf16_terms(r.dst + r.l.vals_off, r.l.term_bytes, p0 + T::kLanes * j, v[j]);
        T::store_bf16_terms(r.dst + r.l.vals_off, r.l.term_bytes, p1 + T::kLanes * j, v[H + j]);
      }
      return;
    }
  }
  for (int j = 0; j < H; ++j) {
    T::storeu(r.fvals() + p0 + T::kLanes * j, v[j]);
    T::storeu(r.fvals() + p1 + T::kLanes * j, v[H + j]);
  }
}

// Integer values (already integral floats) of a 32-group as int8 in act order; returns the lane
// sums of their int32 values.
template <class T>
inline typename T::I store_i8_group(const Row<T>& r, int g, typename T::F* v) {
  if (r.l.fp4_order) T::act_order(v);
  int p0, p1;
  group_positions(r, g, p0, p1);
  return T::iadd(T::store_i8_half(r.ivals() + p0, v), T::store_i8_half(r.ivals() + p1, v + kG<T> / 2));
}

// max |v[j]| over n ∈ {1, 2, 4} vectors, as a pairwise tree.
template <class T, int N>
inline typename T::F abs_max_tree(const typename T::F* v) {
  if constexpr (N == 1) return T::abs(v[0]);
  else if constexpr (N == 2) return T::max(T::abs(v[0]), T::abs(v[1]));
  else return T::max(abs_max_tree<T, 2>(v), abs_max_tree<T, 2>(v + 2));
}

inline int mx_elem_of(ActQuant a) {  // MxElem numbering of formats.h: Fp4E2M1 0, Fp6E2M3 1, Fp6E3M2 2
  return a == ActQuant::Mxfp4 ? 0 : a == ActQuant::Mxfp6E2M3 ? 1 : 2;
}

template <class T>
float abs_max(const float* x, int64_t n) {
  typename T::F m = T::zero();
  typename T::M nan = T::mzero();
  int64_t i = 0;
  for (; i + T::kLanes <= n; i += T::kLanes) {
    const typename T::F v = T::loadu(x + i);
    nan = T::mor(nan, T::isnan(v));
    m = T::max(m, T::abs(v));
  }
  if (i < n) {
    const typename T::F v = T::load_partial(x + i, static_cast<int>(n - i));
    nan = T::mor(nan, T::isnan(v));
    m = T::max(m, T::abs(v));
  }
  if (T::any(nan)) return bits_to_float(0x7FC00000u);
  return T::reduce_max(m);
}

template <class T>
void quantize_row(const QuantRowArgs& a) {
  using F = typename T::F;
  constexpr int G = kG<T>, H = G / 2;
  const ActLayout& l = *a.layout;
  const ref::ActQuantRule& rule = *a.rule;
  const float* x = a.x;
  const int k = l.k;
  const Row<T> r{l, a.dst};
  if constexpr (!T::kBf16Rows)
    if (l.kind == DotKind::Bf16) return quantize_row_scalar(a);  // not selected on this target (dot_kind_for)
  std::memset(a.dst, 0, 64);
  {  // zero the value tail from the last (partial) 32-group on (every term row), and the block-scale slack
    const int from = halves_apart(l) ? (k & ~63) : (k & ~31);
    for (int64_t t = 0; t < l.vals_bytes / l.term_bytes; ++t)
      std::memset(a.dst + l.vals_off + t * l.term_bytes + static_cast<int64_t>(from) * l.elem_bytes, 0,
                  static_cast<size_t>(l.k_pad - from) * l.elem_bytes);
    if (l.scales_off > 0) std::memset(a.dst + l.scales_off, 0, static_cast<size_t>(l.stride - l.scales_off));
  }
  float row_scale = 1.0f;
  const bool ints = l.kind == DotKind::I8;
  typename T::I isum = T::izero();
  F v[G];
  switch (rule.kind) {
    case ActQuant::None:
      for (int g = 0; g < k; g += 32) {
        load_group<T>(x, g, k, v);
        store_f32_group(r, g, v);
      }
      break;
    case ActQuant::Fp8Static:
    case ActQuant::Fp8DynToken:
    case ActQuant::Fp8DynTensor: {
      float s = rule.static_scale;
      if (rule.kind == ActQuant::Fp8DynTensor) s = a.tensor_scale;
      if (rule.kind == ActQuant::Fp8DynToken) {
        const float m = abs_max<T>(x, k) / 448.0f;
        const float lo = 1.0f / (448.0f * 512.0f);
        s = m > lo ? m : lo;  // fmaxf (NaN m → lo, as fmaxf)
      }
      row_scale = s;
      const F inv = T::set1(1.0f / s);
      for (int g = 0; g < k; g += 32) {
        load_group<T>(x, g, k, v);
        for (int j = 0; j < G; ++j) v[j] = round_minifloat<T>(clamp<T>(T::mul(v[j], inv), -448.0f, 448.0f), 3, -6, 448.0f);
        store_f32_group(r, g, v);
      }
      break;
    }
    case ActQuant::Int8Static:
    case ActQuant::Int8DynToken: {
      const bool divide = rule.kind == ActQuant::Int8Static;
      F mul;
      if (divide) {
        row_scale = rule.static_scale;
        mul = T::set1(row_scale);
      } else {
        const float amax = abs_max<T>(x, k);
        const float am = amax > 1e-10f ? amax : 1e-10f;
        row_scale = am / 127.0f;
        mul = T::set1(127.0f / am);
      }
      for (int g = 0; g < k; g += 32) {
        load_group<T>(x, g, k, v);
        for (int j = 0; j < G; ++j)
          v[j] = divide ? clamp<T>(T::round_even(T::div(v[j], mul)), -128.0f, 127.0f)
                        : clamp<T>(round_half_away<T>(T::mul(v[j], mul)), -127.0f, 127.0f);
        if (ints) isum = T::iadd(isum, store_i8_group(r, g, v));
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
      // Fp4Mx (e2m1 or e2m3 elements, dot_kind_for): the integer 2^mbits · q (2·e2m1, 8·e2m3) and
      // the block scale 2^shared · 2 / 2^mbits (the layout's value / 2 · scale convention).
      const bool fp4i = l.kind == DotKind::Fp4Mx;
      const F ival = T::set1(static_cast<float>(1 << mbits));
      const float bs_mul = 2.0f / static_cast<float>(1 << mbits);
      for (int g = 0; g < k; g += 32) {
        load_group<T>(x, g, k, v);
        const int shared = mx_shared_exponent_of(T::reduce_max(abs_max_tree<T, G>(v)), elem, static_cast<int>(rule.mx_mode));
        const F down = T::set1(pow2f(-shared)), up = T::set1(pow2f(shared));
        for (int j = 0; j < G; ++j) {
          const F q = round_minifloat<T>(T::mul(v[j], down), mbits, emin, maxv);
          v[j] = T::mul(q, fp4i ? ival : up);
        }
        if (fp4i) {
          store_i8_group(r, g, v);
          r.bscales()[g / 32] = pow2f(shared) * bs_mul;
        } else {
          store_f32_group(r, g, v);
        }
      }
      // The kernels sum value · (w_mult · w), and value / 2 · scale is the input: 1 / (2 · w_mult).
      if (fp4i) row_scale = 0.5f / static_cast<float>(l.w_mult);
      break;
    }
    case ActQuant::Nvfp4: {
      const float gs = rule.static_scale;
      const bool fp4i = l.kind == DotKind::Fp4Nv;
      const bool bf16 = l.kind == DotKind::Bf16;  // e2m1 · sb (one bf16 term), 1 / gs as the row scale
      for (int g = 0; g < k; g += 32) {
        load_group<T>(x, g, k, v);
        for (int h = 0; h < 2; ++h) {
          F* b = v + H * h;  // the 16-block at g + 16h
          if (g + 16 * h >= k) {
            for (int j = 0; j < H; ++j) b[j] = T::zero();
            continue;
          }
          float s = gs * T::reduce_max(abs_max_tree<T, H>(b)) / 6.0f;
          s = s < -448.0f ? -448.0f : s > 448.0f ? 448.0f : s;
          const float sb = fp8_e4m3_round(s);
          const float inv = sb == 0.0f ? 0.0f : gs / sb;
          const float deq = sb / gs;
          for (int j = 0; j < H; ++j) {
            const F q = round_minifloat<T>(clamp<T>(T::mul(b[j], T::set1(inv)), -6.0f, 6.0f), 1, 0, 6.0f);
            b[j] = fp4i ? T::add(q, q) : T::mul(q, T::set1(bf16 ? sb : deq));
          }
          if (fp4i) r.bscales()[g / 16 + h] = deq;
        }
        if (fp4i) store_i8_group(r, g, v);
        else store_f32_group(r, g, v);
      }
      if (fp4i) row_scale = 0.25f;
      if (bf16) row_scale = 1.0f / gs;
      break;
    }
  }
  const int32_t sum = T::reduce_add_i32(isum);
  std::memcpy(a.dst, &row_scale, 4);
  std::memcpy(a.dst + 4, &sum, 4);
  if constexpr (T::kBf16Rows) {
    if (l.kind == DotKind::Bf16) {
      const int32_t nt = T::bf16_terms_in_use(l, a.dst);
      std::memcpy(a.dst + 8, &nt, 4);
    }
  }
  if (l.corr_off > 0) T::fp4_corrections(l, a.dst);
}

// ---------------------------------------------------------------------------------------------
// Gated activations in double (T::kDLanes lanes), rounded once to fp32, like ref::activation_value.

// e^x in double, |relative error| ≲ 2 ulp: x = n·ln2 + r, |r| ≤ ln2/2, degree-13 Taylor, × 2^n
// (T::dscale2; x clamped to [T::kExpLo, T::kExpHi], the range where it is exact).
template <class T>
inline typename T::D vexp(typename T::D x) {
  x = T::dmin(T::dmax(x, T::dset1(T::kExpLo)), T::dset1(T::kExpHi));
  const typename T::D n = T::dround(T::dmul(x, T::dset1(1.4426950408889634074)));
  typename T::D r = T::dfnmadd(n, T::dset1(6.93147180369123816490e-01), x);
  r = T::dfnmadd(n, T::dset1(1.90821492927058770002e-10), r);
  // Σ_{i ≤ 13} r^i / i! by Estrin's scheme: pairs, then r², r⁴, r⁸ (a dependent depth of 5 FMAs
  // rather than Horner's 13). Zen 3, SiLU over 8 rows × 768: 16.7–17.1 → 14.6–14.9 µs
  // (bench/RESULTS.md 2026-12-07, session 44).
  using D = typename T::D;
  auto c = [](double v) { return T::dset1(v); };
  const D r2 = T::dmul(r, r), r4 = T::dmul(r2, r2), r8 = T::dmul(r4, r4);
  const D q0 = T::dfmadd(r, c(1.0), c(1.0));
  const D q1 = T::dfmadd(r, c(1.0 / 6.0), c(0.5));
  const D q2 = T::dfmadd(r, c(1.0 / 120.0), c(1.0 / 24.0));
  const D q3 = T::dfmadd(r, c(1.0 / 5040.0), c(1.0 / 720.0));
  const D q4 = T::dfmadd(r, c(1.0 / 362880.0), c(1.0 / 40320.0));
  const D q5 = T::dfmadd(r, c(1.0 / 39916800.0), c(1.0 / 3628800.0));
  const D q6 = T::dfmadd(r, c(1.0 / 6227020800.0), c(1.0 / 479001600.0));
  const D s0 = T::dfmadd(q1, r2, q0), s1 = T::dfmadd(q3, r2, q2), s2 = T::dfmadd(q5, r2, q4);
  const D t0 = T::dfmadd(s1, r4, s0), t1 = T::dfmadd(q6, r4, s2);
  return T::dscale2(T::dfmadd(t1, r8, t0), n);
}
template <class T>
inline typename T::D vsigmoid(typename T::D v) {
  const typename T::D one = T::dset1(1.0);
  return T::ddiv(one, T::dadd(one, vexp<T>(T::dsub(T::dset1(0.0), v))));
}

template <class T, Activation kKind>
inline typename T::D act_lanes(const ActParams& a, typename T::D g, typename T::D u) {
  static_assert(kKind != Activation::Gelu, "erf: Gelu rows take activation_row_scalar");
  using D = typename T::D;
  switch (kKind) {
    case Activation::Silu: {
      if (a.has_limit) {
        const D lim = T::dset1(static_cast<double>(a.limit));
        g = T::dmin(g, lim);
        u = T::dmin(T::dmax(u, T::dsub(T::dset1(0.0), lim)), lim);
      }
      // g·u / (1 + e^−g): the product beside the exp, one multiply fewer after the division.
      return T::ddiv(T::dmul(g, u), T::dadd(T::dset1(1.0), vexp<T>(T::dsub(T::dset1(0.0), g))));
    }
    case Activation::GeluTanh: {
      const D g3 = T::dmul(T::dmul(T::dmul(T::dset1(0.044715), g), g), g);
      const D z = T::dmul(T::dset1(0.79788456080286535588), T::dadd(g, g3));
      // tanh z = sign(z)·(1 − 2/(e^{2|z|} + 1)): close to correctly rounded near ±1, where the
      // reference's 1 + tanh z cancels.
      const D one = T::dset1(1.0);
      const D az = T::dabs(z);
      const D ta = T::dsub(one, T::ddiv(T::dset1(2.0), T::dadd(vexp<T>(T::dadd(az, az)), one)));
      const D t = T::dcopysign(ta, z);
      return T::dmul(T::dmul(T::dmul(T::dset1(0.5), g), T::dadd(one, t)), u);
    }
    default: {  // SwigluOai
      const D lim = T::dset1(a.has_limit ? static_cast<double>(a.limit) : 7.0);
      const D gc = T::dmin(g, lim);
      const D uc = T::dmin(T::dmax(u, T::dsub(T::dset1(0.0), lim)), lim);
      const D sg = vsigmoid<T>(T::dmul(T::dset1(static_cast<double>(a.alpha)), gc));
      return T::dmul(T::dmul(T::dadd(uc, T::dset1(1.0)), gc), sg);
    }
  }
}

// One activation kind over a row (the kind a template argument: no switch per vector).
template <class T, Activation kKind>
void activation_loop(const ActParams& act, const float* y1, int inter, float* z) {
  using D = typename T::D;
  constexpr int L = T::kDLanes;
  // kU vectors per pass: independent exp chains side by side keep the FMA pipes busy.
  constexpr int kU = 4;
  int j0 = 0;
  for (; j0 + kU * L <= inter; j0 += kU * L) {
    D g[kU], u[kU], r[kU];
    for (int v = 0; v < kU; ++v) T::load_gate_up(act.interleaved, y1, inter, j0 + v * L, L, g[v], u[v]);
    for (int v = 0; v < kU; ++v) r[v] = act_lanes<T, kKind>(act, g[v], u[v]);
    for (int v = 0; v < kU; ++v) T::store_d(z + j0 + v * L, L, r[v]);
  }
  for (int j = j0; j < inter; j += L) {
    const int n = inter - j < L ? inter - j : L;
    D g, u;
    T::load_gate_up(act.interleaved, y1, inter, j, n, g, u);
    T::store_d(z + j, n, act_lanes<T, kKind>(act, g, u));
  }
}

template <class T>
void activation_row(const ActParams& act, const float* y1, int inter, float* z) {
  switch (act.kind) {
    case Activation::Silu: return activation_loop<T, Activation::Silu>(act, y1, inter, z);
    case Activation::GeluTanh: return activation_loop<T, Activation::GeluTanh>(act, y1, inter, z);
    case Activation::SwigluOai: return activation_loop<T, Activation::SwigluOai>(act, y1, inter, z);
    default: return activation_row_scalar(act, y1, inter, z);  // Gelu: erf
  }
}

// A target's row of the kernel table: its GEMM entry point (gemm_<target>.cc) and the functions
// above instantiated on its ISA layer.
template <class T>
KernelTable make_kernel_table(Isa isa, void (*gemm)(const GemmArgs&)) {
  KernelTable k;
  k.isa = isa;
  k.quantize_row = quantize_row<T>;
  k.gemm = gemm;
  k.activation_row = activation_row<T>;
  k.abs_max = abs_max<T>;
  return k;
}

}  // namespace
}  // namespace qmoe::cpu
