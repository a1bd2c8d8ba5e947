// Activation row layout, scheme → dot-product kind, and the scalar row quantizer (the definition
// every SIMD quantizer is tested against; it follows ref::act_qdq_row rule by rule).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/kernel_iface.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe::cpu {

namespace {
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
}  // namespace

const float* e8m0_table() {
  static const auto* t = [] {
    auto* a = new float[256];
    for (int i = 0; i < 256; ++i) a[i] = e8m0_decode(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

const float* fp8_e4m3_table() {
  static const auto* t = [] {
    auto* a = new float[256];
    for (int i = 0; i < 256; ++i) a[i] = fp8_e4m3_decode(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

ActLayout make_act_layout(DotKind kind, WeightFormat consumer, int k) {
  ActLayout l;
  l.kind = kind;
  l.fp4_order = consumer == WeightFormat::Mxfp4 || consumer == WeightFormat::Nvfp4;
  l.k = k;
  l.k_pad = static_cast<int>(round_up(k, 64));
  l.elem_bytes = kind == DotKind::F32 ? 4 : kind == DotKind::Bf16 ? 2 : 1;
  l.vals_off = 64;
  l.term_bytes = static_cast<int64_t>(l.k_pad) * l.elem_bytes;
  l.vals_bytes = kind == DotKind::Bf16 ? kBf16Terms * l.term_bytes : l.term_bytes;
  int64_t end = l.vals_off + l.vals_bytes;
  if (kind == DotKind::Fp4Mx || kind == DotKind::Fp4Nv) {
    l.block = kind == DotKind::Fp4Mx ? kMxBlock : kNvfp4Block;
    if (k % l.block != 0)
      throw Error(fmt::format("activation length {} is not a multiple of the block size {}", k, l.block));
    l.nblocks = k / l.block;
    if (consumer == WeightFormat::Mxfp6E2M3) {
      if (kind != DotKind::Fp4Mx) throw Error("internal: MXFP6 E2M3 weights on an integer kind other than Fp4Mx");
      l.fp6_order = true;
      l.w_mult = 8;
      l.w_offset = 60;
    }
    l.scales_off = end;
    end += round_up(static_cast<int64_t>(l.nblocks) * 4 + 64, 64);  // + slack for vector loads
    l.corr_off = end;
    end += l.k_pad;  // k_pad / 4 int32
    l.bcorr_off = end;
    end += round_up(static_cast<int64_t>(l.nblocks) * 4, 64);
  }
  l.stride = round_up(end, 64);
  return l;
}

int act_value_position(const ActLayout& l, int i) {
  return l.fp4_order ? fp4_value_position(i) : l.fp6_order ? fp6_value_position(i) : i;
}

void act_row_values(const ActLayout& l, const uint8_t* row, double* out) {
  float rs;
  std::memcpy(&rs, row, 4);
  const uint8_t* vals = row + l.vals_off;
  for (int i = 0; i < l.k; ++i) {
    const int p = act_value_position(l, i);
    switch (l.kind) {
      case DotKind::F32: {
        float v;
        std::memcpy(&v, vals + 4 * p, 4);
        out[i] = static_cast<double>(v) * rs;
        break;
      }
      case DotKind::I8: out[i] = static_cast<double>(static_cast<int8_t>(vals[p])) * rs; break;
      case DotKind::Bf16: {
        const int32_t nt = bf16_term_count(row);
        double v = 0.0;
        for (int t = 0; t < nt; ++t) {
          uint16_t h;
          std::memcpy(&h, vals + t * l.term_bytes + 2 * p, 2);
          v += static_cast<double>(bf16_decode(h));
        }
        out[i] = v * rs;
        break;
      }
      case DotKind::Fp4Mx:
      case DotKind::Fp4Nv: {
        float bs;
        std::memcpy(&bs, row + l.scales_off + 4 * (i / l.block), 4);
        // value · scale · row_scale(0.25) · 2: the stored value is 2·e2m1, the weight side the same.
        out[i] = static_cast<double>(static_cast<int8_t>(vals[p])) * 0.5 * bs;
        break;
      }
    }
  }
}

double w4a4_bf16_tokens() {
  return cpu_features().avx512_half_width ? std::numeric_limits<double>::infinity() : kW4a4Bf16Tokens;
}

DotKind dot_kind_for(const SchemeInfo& s, Isa isa, int gemm, DType unquantized_storage, double tokens_per_expert) {
  if (s.weight == WeightFormat::Int8 && (s.act == ActQuant::Int8Static || s.act == ActQuant::Int8DynToken))
    return DotKind::I8;
  if (s.weight == WeightFormat::Mxfp4 && (s.act == ActQuant::Mxfp4 || s.act == ActQuant::Mxfp6E2M3)) {
    // MXFP4 W4A4 from kW4a4Bf16Tokens tokens per expert (amx: kAmxW4a4Bf16Tokens) on: both
    // operands are exact in bf16 (e2m1 · 2^s), so vdpbf16ps over the once-decoded weight rows (one
    // term) beats the exact integer block sums, whose per-block conversion and scaling cost more
    // than the products once the decode is shared by many tokens. MXFP6 E2M3 activations (W4A6)
    // run on the same kernels: 8 · e2m3 is an integer in [−60, 60], an int8 value like 2 · e2m1
    // (make_act_layout's Fp4Mx row), so the work per weight is W4A4's.
    if (isa == Isa::Avx512Bf16 && tokens_per_expert >= w4a4_bf16_tokens()) return DotKind::Bf16;
    if (isa == Isa::Amx && tokens_per_expert >= kAmxW4a4Bf16Tokens) return DotKind::Bf16;
    return DotKind::Fp4Mx;
  }
  // MXFP6 E2M3 W6A6 on AVX2 below kAvx2W6a6IntTokens: the W4A4 row kernels with the 6-bit decoder
  // (Avx2::w6_weights): 8 · e2m3 is an int8 on both sides. (AVX-512 targets take the Bf16 kind below,
  // exact in bf16.)
  if (isa == Isa::Avx2 && s.weight == WeightFormat::Mxfp6E2M3 && s.act == ActQuant::Mxfp6E2M3 &&
      tokens_per_expert < kAvx2W6a6IntTokens)
    return DotKind::Fp4Mx;
  // Weights that the bf16 decoders give exactly (MX: the block scale in the exponent).
  const bool bf16_weights = (s.weight == WeightFormat::BF16 && unquantized_storage == DType::BF16) ||
                            is_mx_weight(s.weight) || s.weight == WeightFormat::Fp8E4M3;
  // GEMM2 of an unquantized intermediate: fp32 values, 3 bf16 terms on the Bf16 kind.
  const bool fp32_input = gemm == 2 && s.act == ActQuant::None;
  if (isa == Isa::Amx && tokens_per_expert >= kAmxBf16Tokens) {
    // AMX tiles (gemm_amx.cc): every weight format that decodes exactly to bf16 (NVFP4: e2m1 times
    // its fp8 block scale) takes TDPBF16PS, fp32 inputs too (NVFP4's dequantized activations and
    // unquantized intermediates in 3 terms: the tiles' throughput makes the extra products cheap).
    if (bf16_weights || (s.weight == WeightFormat::Nvfp4 && tokens_per_expert >= kAmxNvfp4Bf16Tokens)) return DotKind::Bf16;
  }
  if (isa == Isa::Amx && (s.weight == WeightFormat::Mxfp4 || s.weight == WeightFormat::Fp8E4M3)) {
    // Fewer tokens per expert on the AMX parts (Intel): MXFP4 and FP8 weights take the tiles from
    // kAmxMxfp4Bf16Tokens / kAmxFp8Bf16Tokens on one-term inputs (bf16 hidden states, quantized
    // intermediates: the F32 kind takes 5–8 tokens in two passes of ≤ 4, the tiles one), else the
    // fp32 FMA kind, faster than vdpbf16ps here (one core, K = 2048, N = 1536, bf16 activations,
    // cold, µs F32 / Bf16: MXFP4 1 token 144–154 / 183–184, 4 tokens 324–331 / 426–439; FP8 4
    // tokens 316–335 / 445–455; MXFP6 the other way, 1 token 321–333 / 237–243), where AMD's
    // AVX-512 parts measured the Bf16 kind faster (bench/RESULTS.md 2026-12-02, 2026-12-05
    // afternoon and 2026-12-06).
    const double from = s.weight == WeightFormat::Mxfp4 ? kAmxMxfp4Bf16Tokens : kAmxFp8Bf16Tokens;
    return !fp32_input && tokens_per_expert >= from ? DotKind::Bf16 : DotKind::F32;
  }
  if (s.weight == WeightFormat::Nvfp4 && s.act == ActQuant::Nvfp4) return DotKind::Fp4Nv;
  if (isa == Isa::Avx512Bf16 || isa == Isa::Amx) {
    // Weights exact in bf16 (MX: with the block scale in the exponent); any activation rule (the
    // terms hold the fp32 values exactly). GEMM1 inputs are bf16 values in practice (one term), as
    // are quantized intermediates; an unquantized intermediate needs 3 terms, 1.5× the fp32 FMA
    // work, so GEMM2 of bf16 / MXFP4 weight-only schemes keeps the F32 kind (measured faster from
    // 4 tokens per expert on); MXFP6's fp32 decode costs more than the extra terms below ~8
    // tokens per expert (the decode regime), not above. bench/RESULTS.md, 2026-12-02.
    if (bf16_weights) {
      const bool fp6 = s.weight == WeightFormat::Mxfp6E2M3 || s.weight == WeightFormat::Mxfp6E3M2;
      if (!fp32_input || (fp6 && tokens_per_expert < 8.0)) return DotKind::Bf16;
    }
  }
  return DotKind::F32;
}

MxBf16Table mx_bf16_table(WeightFormat f) {
  struct Built {
    uint16_t codes[3][64];
    int smin[3], smax[3];
  };
  static const Built* b = [] {
    auto* t = new Built{};
    const MxElem elems[3] = {MxElem::Fp4E2M1, MxElem::Fp6E2M3, MxElem::Fp6E3M2};
    for (int e = 0; e < 3; ++e) {
      const int n = e == 0 ? 16 : 64;
      int emin = 255, emax = 0;
      for (int c = 0; c < n; ++c) {
        const float v = mx_elem_decode(elems[e], static_cast<uint8_t>(c));
        t->codes[e][c] = bf16_encode(v);
        if (bf16_decode(t->codes[e][c]) != v) throw Error("internal: an MX code is not exact in bf16");
        const int ef = (t->codes[e][c] >> 7) & 0xFF;
        if (v != 0.0f) {
          emin = std::min(emin, ef);
          emax = std::max(emax, ef);
        }
      }
      // exponent field ef + (s − 127) must stay in [1, 254]
      t->smin[e] = 127 + 1 - emin;
      t->smax[e] = 127 + 254 - emax;
    }
    return t;
  }();
  const int e = f == WeightFormat::Mxfp4 ? 0 : f == WeightFormat::Mxfp6E2M3 ? 1 : 2;
  if (!is_mx_weight(f)) throw Error("internal: mx_bf16_table of a non-MX format");
  return {b->codes[e], b->smin[e], b->smax[e]};
}

const uint16_t* fp8_bf16_magnitudes() {
  static const uint16_t* t = [] {
    auto* a = new uint16_t[128];
    for (int c = 0; c < 128; ++c) {
      const float v = fp8_e4m3_decode(static_cast<uint8_t>(c));
      a[c] = bf16_encode(v);
      if (!std::isnan(v) && bf16_decode(a[c]) != v) throw Error("internal: an FP8 value is not exact in bf16");
    }
    return a;
  }();
  return t;
}

void split_bf16_terms(const ActLayout& l, const float* vals, uint8_t* row) {
  uint16_t* t0 = reinterpret_cast<uint16_t*>(row + l.vals_off);
  uint16_t* t1 = reinterpret_cast<uint16_t*>(row + l.vals_off + l.term_bytes);
  uint16_t* t2 = reinterpret_cast<uint16_t*>(row + l.vals_off + 2 * l.term_bytes);
  bool any1 = false, any2 = false;
  for (int i = 0; i < l.k_pad; ++i) {
    const float v = vals[i];
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if (!std::isfinite(v)) {
      t0[i] = std::isnan(v) ? static_cast<uint16_t>(0x7FC0 | ((u >> 16) & 0x8000)) : static_cast<uint16_t>(u >> 16);
      t1[i] = t2[i] = 0;
      continue;
    }
    auto hi = [](float x) {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      return static_cast<uint16_t>(b >> 16);
    };
    const float h = bf16_decode(hi(v));
    const float r = v - h;  // exact
    const float m = bf16_decode(hi(r));
    t0[i] = hi(v);
    t1[i] = hi(r);
    t2[i] = hi(r - m);  // exact and bf16-representable
    any1 = any1 || t1[i] != 0;
    any2 = any2 || t2[i] != 0;
  }
  const int32_t nt = any2 ? 3 : any1 ? 2 : 1;
  std::memcpy(row + 8, &nt, 4);
}

float bias_value(const WeightView& w, int n) {
  switch (w.bias_dtype) {
    case DType::BF16: return bf16_decode(static_cast<const uint16_t*>(w.bias)[n]);
    case DType::F16: return fp16_decode(static_cast<const uint16_t*>(w.bias)[n]);
    default: return static_cast<const float*>(w.bias)[n];
  }
}

ActParams act_params_of(const ActivationSpec& a) {
  ActParams r;
  r.kind = a.kind;
  r.interleaved = a.interleaved;
  r.has_limit = a.limit.has_value();
  r.limit = a.limit.value_or(0.0f);
  r.alpha = a.alpha;
  r.spec = &a;
  return r;
}

void activation_row_scalar(const ActParams& act, const float* y1, int inter, float* z) {
  ref::apply_activation_row(*act.spec, y1, inter, z);
}

int mx_shared_exponent_of(float amax, int elem, int mode) {
  return mx_shared_exponent(amax, static_cast<MxElem>(elem), static_cast<MxScaleMode>(mode));
}
// decode(encode(v)) by bit operations: formats.h's encoder and decoder go through frexpf / ldexpf /
// rintf, which took about half the NVFP4 row quantizer's time (one call per 16-block). The rule is
// round_minifloat's (simd/quant.h) for one value, with the codec's NaN (kept, where round_minifloat
// saturates it) and no −0. Equal to the codec for every float (tests/cpu/test_optimized_units.cc,
// E4m3RoundMatchesTheCodec).
float fp8_e4m3_round(float v) {
  if (v != v) return fp8_e4m3_decode(0x7F);  // NaN
  const float a = std::fabs(v);
  float r;
  if (a >= 448.0f) {
    r = 448.0f;  // saturated, Inf included
  } else if (a >= 0x1p-6f) {
    // Normal: keep 3 of the 23 fraction bits, ties to even (a carry moves into the exponent).
    uint32_t u;
    std::memcpy(&u, &a, 4);
    u = (u + 0x7FFFFu + ((u >> 20) & 1u)) & ~0xFFFFFu;
    std::memcpy(&r, &u, 4);
  } else {
    // Subnormal: the grid 2^-9. a · 512 < 8 is exact; adding and taking away 1.5 · 2^23 rounds
    // it to the nearest integer, ties to even.
    const float n = (a * 512.0f + 0x1.8p23f) - 0x1.8p23f;
    r = n * 0x1p-9f;
  }
  return (v < 0.0f && r != 0.0f) ? -r : r;  // the codec has no −0 code
}
float abs_max_scalar(const float* x, int64_t n) { return ref::abs_max(x, n); }

namespace {

MxElem mx_elem_of(ActQuant a) {
  return a == ActQuant::Mxfp4 ? MxElem::Fp4E2M1 : a == ActQuant::Mxfp6E2M3 ? MxElem::Fp6E2M3 : MxElem::Fp6E3M2;
}

float row_abs_max(const float* x, int n) { return ref::abs_max(x, n); }

// Dequantization-direction scale of the fp8 / int8 rules (ref::act_qdq_row).
float fp8_row_scale(const ref::ActQuantRule& r, const float* x, int n, float tensor_scale) {
  if (r.kind == ActQuant::Fp8DynToken) return fp8_token_scale(row_abs_max(x, n));
  if (r.kind == ActQuant::Fp8DynTensor) return tensor_scale;
  return r.static_scale;
}

[[noreturn]] void bad_combo(const ActLayout& l, const ref::ActQuantRule& r) {
  throw Error(fmt::format("internal: activation rule {} cannot produce dot kind {}", to_string(r.kind),
                          static_cast<int>(l.kind)));
}

}  // namespace

void fill_fp4_corrections(const ActLayout& l, uint8_t* row) {
  if (l.corr_off == 0) return;
  const int8_t* v = reinterpret_cast<const int8_t*>(row + l.vals_off);
  int32_t* corr = reinterpret_cast<int32_t*>(row + l.corr_off);
  for (int q = 0; q < l.k_pad / 4; ++q) corr[q] = -l.w_offset * (v[4 * q] + v[4 * q + 1] + v[4 * q + 2] + v[4 * q + 3]);
  fill_fp4_block_corrections(l, row);
}

void fill_fp4_block_corrections(const ActLayout& l, uint8_t* row) {
  if (l.bcorr_off == 0) return;
  const int32_t* corr = reinterpret_cast<const int32_t*>(row + l.corr_off);
  int32_t* bc = reinterpret_cast<int32_t*>(row + l.bcorr_off);
  // A block's even elements are stored at block / 2 consecutive positions from that of its first
  // element, its odd ones 32 further (the fp4 order; the fp6 order: its first and second halves):
  // two runs of block / 8 per-4 words (an MX block 2 × 4, an NVFP4 block 2 × 2). (Per element
  // through act_value_position this loop was ~1/3 of the MXFP4 row quantizer's time.)
  const int run = l.block / 8;
  for (int b = 0; b < l.nblocks; ++b) {
    const int q = act_value_position(l, b * l.block) / 4;
    int32_t sum = 0;
    for (int j = 0; j < run; ++j) sum += corr[q + j] + corr[q + 8 + j];
    bc[b] = sum;
  }
}

void quantize_row_scalar(const QuantRowArgs& a) {
  const ActLayout& l = *a.layout;
  const ref::ActQuantRule& r = *a.rule;
  const float* x = a.x;
  const int k = l.k;
  uint8_t* dst = a.dst;
  if (l.kind == DotKind::Bf16) {  // the F32 kind's values, then split into bf16 terms
    const ActLayout lf = make_act_layout(DotKind::F32, l.fp4_order ? WeightFormat::Mxfp4 : WeightFormat::BF16, k);
    thread_local std::vector<uint8_t> tmp;
    tmp.resize(static_cast<size_t>(lf.stride));
    QuantRowArgs q = a;
    q.layout = &lf;
    q.dst = tmp.data();
    if (r.kind == ActQuant::Nvfp4) {
      // e2m1 · fp8(block scale) (exact in bf16: one term), the tensor's 1/global scale as the row
      // scale, where the F32 kind stores e2m1 · (sb / gs) (rounded in fp32: three terms).
      std::memset(tmp.data(), 0, tmp.size());
      float* v = reinterpret_cast<float*>(tmp.data() + lf.vals_off);
      const float gs = r.static_scale;
      for (int b = 0; b < k; b += kNvfp4Block) {
        const int len = std::min(kNvfp4Block, k - b);
        float e2m1[kNvfp4Block];
        const float sb = nvfp4_block_codes(x + b, len, gs, e2m1);
        for (int i = 0; i < len; ++i) v[act_value_position(lf, b + i)] = e2m1[i] * sb;
      }
      const float rs = 1.0f / gs;
      std::memcpy(tmp.data(), &rs, 4);
    } else {
      quantize_row_scalar(q);
    }
    std::memset(dst, 0, static_cast<size_t>(l.stride));
    std::memcpy(dst, tmp.data(), 8);  // row scale, code sum
    split_bf16_terms(l, reinterpret_cast<const float*>(tmp.data() + lf.vals_off), dst);
    return;
  }
  std::memset(dst, 0, static_cast<size_t>(l.vals_off + l.vals_bytes));
  if (l.scales_off > 0) std::memset(dst + l.scales_off, 0, static_cast<size_t>(l.stride - l.scales_off));
  float row_scale = 1.0f;
  int32_t sum = 0;
  switch (l.kind) {
    case DotKind::Bf16: break;  // handled above
    case DotKind::F32: {
      float* v = reinterpret_cast<float*>(dst + l.vals_off);
      auto put = [&](int i, float val) { v[act_value_position(l, i)] = val; };
      switch (r.kind) {
        case ActQuant::None:
          for (int i = 0; i < k; ++i) put(i, x[i]);
          break;
        case ActQuant::Fp8Static:
        case ActQuant::Fp8DynToken:
        case ActQuant::Fp8DynTensor: {
          row_scale = fp8_row_scale(r, x, k, a.tensor_scale);
          const float inv = 1.0f / row_scale;
          for (int i = 0; i < k; ++i) put(i, fp8_e4m3_decode(fp8_quantize_act(x[i], inv)));
          break;
        }
        case ActQuant::Int8Static:
          row_scale = r.static_scale;
          for (int i = 0; i < k; ++i) put(i, static_cast<float>(int8_quantize_static(x[i], row_scale)));
          break;
        case ActQuant::Int8DynToken: {
          const float amax = row_abs_max(x, k);
          row_scale = int8_token_scale(amax);
          const float inv = int8_token_inv_scale(amax);
          for (int i = 0; i < k; ++i) put(i, static_cast<float>(int8_quantize_token(x[i], inv)));
          break;
        }
        case ActQuant::Mxfp4:
        case ActQuant::Mxfp6E2M3:
        case ActQuant::Mxfp6E3M2: {
          float buf[kMxBlock];
          for (int b = 0; b < k; b += kMxBlock) {
            const int len = k - b < kMxBlock ? k - b : kMxBlock;
            mx_qdq_block(x + b, len, mx_elem_of(r.kind), r.mx_mode, buf);
            for (int i = 0; i < len; ++i) put(b + i, buf[i]);
          }
          break;
        }
        case ActQuant::Nvfp4: {
          float buf[kNvfp4Block];
          for (int b = 0; b < k; b += kNvfp4Block) {
            const int len = k - b < kNvfp4Block ? k - b : kNvfp4Block;
            nvfp4_qdq_block(x + b, len, r.static_scale, buf);
            for (int i = 0; i < len; ++i) put(b + i, buf[i]);
          }
          break;
        }
      }
      break;
    }
    case DotKind::I8: {
      int8_t* v = reinterpret_cast<int8_t*>(dst + l.vals_off);
      if (r.kind == ActQuant::Int8Static) {
        row_scale = r.static_scale;
        for (int i = 0; i < k; ++i) v[i] = int8_quantize_static(x[i], row_scale);
      } else if (r.kind == ActQuant::Int8DynToken) {
        const float amax = row_abs_max(x, k);
        row_scale = int8_token_scale(amax);
        const float inv = int8_token_inv_scale(amax);
        for (int i = 0; i < k; ++i) v[i] = int8_quantize_token(x[i], inv);
      } else {
        bad_combo(l, r);
      }
      for (int i = 0; i < k; ++i) sum += v[i];
      break;
    }
    case DotKind::Fp4Mx: {
      if (r.kind != ActQuant::Mxfp4 && r.kind != ActQuant::Mxfp6E2M3) bad_combo(l, r);
      // The integer 2^mbits · element (2·e2m1, 8·e2m3) and the block scale 2^shared · 2 / 2^mbits
      // (the row's value / 2 · scale convention).
      const MxElem elem = r.kind == ActQuant::Mxfp6E2M3 ? MxElem::Fp6E2M3 : MxElem::Fp4E2M1;
      const float ival = std::ldexp(1.0f, mx_elem_mbits(elem));
      int8_t* v = reinterpret_cast<int8_t*>(dst + l.vals_off);
      float* bs = reinterpret_cast<float*>(dst + l.scales_off);
      uint8_t codes[kMxBlock];
      for (int b = 0; b < l.nblocks; ++b) {
        const int shared = mx_quantize_block(x + b * kMxBlock, kMxBlock, elem, r.mx_mode, codes);
        bs[b] = std::ldexp(1.0f, shared) * (2.0f / ival);
        for (int i = 0; i < kMxBlock; ++i)
          v[act_value_position(l, b * kMxBlock + i)] = static_cast<int8_t>(ival * mx_elem_decode(elem, codes[i]));
      }
      // The kernels sum value · (w_mult · w), and value / 2 · scale is the input: 1 / (2 · w_mult).
      row_scale = 0.5f / static_cast<float>(l.w_mult);
      break;
    }
    case DotKind::Fp4Nv: {
      if (r.kind != ActQuant::Nvfp4) bad_combo(l, r);
      int8_t* v = reinterpret_cast<int8_t*>(dst + l.vals_off);
      float* bs = reinterpret_cast<float*>(dst + l.scales_off);
      const float gs = r.static_scale;
      for (int b = 0; b < l.nblocks; ++b) {
        float e2m1[kNvfp4Block];
        const float sb = nvfp4_block_codes(x + b * kNvfp4Block, kNvfp4Block, gs, e2m1);
        bs[b] = sb / gs;
        for (int i = 0; i < kNvfp4Block; ++i) v[act_value_position(l, b * kNvfp4Block + i)] = static_cast<int8_t>(2.0f * e2m1[i]);
      }
      row_scale = 0.25f;
      break;
    }
  }
  std::memcpy(dst, &row_scale, 4);
  std::memcpy(dst + 4, &sum, 4);
  fill_fp4_corrections(l, dst);
}

}  // namespace qmoe::cpu
