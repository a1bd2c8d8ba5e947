// dequant_expert: the exact fp32 value of every stored weight of one local expert, before or after
// processing (checkpoint-format.md §4: MX code·2^(byte−127); NVFP4 e2m1·fp8(scale)·scale_2 rounded
// once to fp32 — e2m1·fp8 is exact in fp32, so this is the true product correctly rounded, as the
// conformance cases' dequant.<e>.* hold (forming fp8·scale_2 first would round twice and differ by
// one ulp for the e2m1 magnitudes 1.5 / 3 / 6); INT8 / FP8 q·s; unquantized as stored).
#include <fmt/format.h>

#include <cstring>

#include "methods/params_internal.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe {

namespace {

MxElem mx_elem_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::Mxfp6E2M3: return MxElem::Fp6E2M3;
    case WeightFormat::Mxfp6E3M2: return MxElem::Fp6E3M2;
    default: return MxElem::Fp4E2M1;
  }
}

// Which w13 shard (0 = gate / w1, 1 = up / w3) parameter row r belongs to.
int shard_of_row(const ExpertParams& p, int64_t r) {
  return p.act.interleaved ? static_cast<int>(r % 2) : (r < p.inter ? 0 : 1);
}

// Block formats: n_rows rows of K elements, codes packed along K, one scale per `bs` elements;
// value(code, scale byte, row) supplied by the caller.
template <class Value>
void decode_blocked(const ExpertParams& p, const Tensor& w, const Tensor& s, int local, int64_t n_rows, int64_t K,
                    int bs, Value value, float* out) {
  const WeightFormat f = p.scheme->weight;
  const int64_t row_bytes = methods::packed_bytes(f, K), scale_cols = K / bs;
  const uint8_t* wb = w.data_as<uint8_t>() + local * n_rows * row_bytes;
  const uint8_t* sb = s.data_as<uint8_t>() + local * n_rows * scale_cols;
  const bool fp6 = f == WeightFormat::Mxfp6E2M3 || f == WeightFormat::Mxfp6E3M2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* codes = wb + r * row_bytes;
    const uint8_t* scales = sb + r * scale_cols;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t c = fp6 ? fp6_code_at(codes, k) : fp4_code_at(codes, k);
      out[r * K + k] = value(c, scales[k / bs], r);
    }
  }
}

// Byte / float formats with float scales: value(q index) · scale(row).
template <class Scale>
void decode_scaled(const ExpertParams& p, const Tensor& w, int local, int64_t n_rows, int64_t K, Scale scale,
                   float* out) {
  const int64_t off = local * n_rows * K;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float s = scale(r);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = off + r * K + k;
      float q = 0.0f;
      switch (p.scheme->weight) {
        case WeightFormat::Int8: q = static_cast<float>(w.data_as<int8_t>()[i]); break;
        case WeightFormat::Fp8E4M3: q = fp8_e4m3_decode(w.data_as<uint8_t>()[i]); break;
        default: q = float_at(w, i); break;  // unquantized: F32 (BF16 / F16 accepted)
      }
      out[r * K + k] = q * s;
    }
  }
}

}  // namespace

void dequant_expert(const ExpertParams& p, int local, std::vector<float>& w13, std::vector<float>& w2) {
  if (p.scheme == nullptr) throw Error("dequant_expert: the parameters have no scheme");
  if (local < 0 || local >= p.num_local)
    throw Error(fmt::format("dequant_expert: local expert {} is out of range (this rank holds {} experts)", local,
                            p.num_local));
  const int64_t H = p.hidden, I = p.inter, rows = p.rows13();
  w13.assign(static_cast<size_t>(rows * H), 0.0f);
  w2.assign(static_cast<size_t>(H * I), 0.0f);
  const WeightFormat f = p.scheme->weight;

  if (is_mx_weight(f)) {
    const MxElem el = mx_elem_of(f);
    auto v = [el](uint8_t c, uint8_t sb, int64_t) { return mx_elem_decode(el, c) * e8m0_decode(sb); };
    decode_blocked(p, p.w13_weight, p.w13_weight_scale, local, rows, H, kMxBlock, v, w13.data());
    decode_blocked(p, p.w2_weight, p.w2_weight_scale, local, H, I, kMxBlock, v, w2.data());
    return;
  }
  if (f == WeightFormat::Nvfp4) {
    const float* g13 = p.w13_weight_scale_2.data_as<float>();
    const bool merged = p.w13_weight_scale_2.ndim() == 1;
    const float g2 = p.w2_weight_scale_2.data_as<float>()[local];
    auto v13 = [&](uint8_t c, uint8_t sb, int64_t r) {
      const float g = merged ? g13[local] : g13[2 * local + shard_of_row(p, r)];
      return (fp4_e2m1_decode(c) * fp8_e4m3_decode(sb)) * g;  // exact product, one rounding
    };
    auto v2 = [&](uint8_t c, uint8_t sb, int64_t) { return (fp4_e2m1_decode(c) * fp8_e4m3_decode(sb)) * g2; };
    decode_blocked(p, p.w13_weight, p.w13_weight_scale, local, rows, H, kNvfp4Block, v13, w13.data());
    decode_blocked(p, p.w2_weight, p.w2_weight_scale, local, H, I, kNvfp4Block, v2, w2.data());
    return;
  }
  if (f == WeightFormat::BF16) {
    decode_scaled(p, p.w13_weight, local, rows, H, [](int64_t) { return 1.0f; }, w13.data());
    decode_scaled(p, p.w2_weight, local, H, I, [](int64_t) { return 1.0f; }, w2.data());
    return;
  }
  // INT8 / FP8 with float scales.
  const float* s13 = p.w13_weight_scale.data_as<float>();
  const float* s2 = p.w2_weight_scale.data_as<float>();
  if (p.scheme->weight_scale == WeightScale::PerChannel) {
    decode_scaled(p, p.w13_weight, local, rows, H, [&](int64_t r) { return s13[local * rows + r]; }, w13.data());
    decode_scaled(p, p.w2_weight, local, H, I, [&](int64_t r) { return s2[local * H + r]; }, w2.data());
    return;
  }
  const bool merged = p.w13_weight_scale.ndim() == 1;
  decode_scaled(
      p, p.w13_weight, local, rows, H,
      [&](int64_t r) { return merged ? s13[local] : s13[2 * local + shard_of_row(p, r)]; }, w13.data());
  decode_scaled(p, p.w2_weight, local, H, I, [&](int64_t) { return s2[local]; }, w2.data());
}

}  // namespace qmoe
