// QuarkNvfp4MoEMethod (spec quark-moe.md §6.4): E2M1 weights, FP8 E4M3 scales per 16 input
// elements, fp32 weight_scale_2 (dequantization multiplier) per projection and static fp32
// input_scale_2 (dequantization direction; the activation quantizer uses gs = 1 / max).
#include <fmt/format.h>

#include <cmath>

#include "methods/params_internal.h"
#include "qmoe/error.h"

namespace qmoe::methods {

void create_nvfp4(ExpertParams& p) {
  const int64_t E = p.num_local, H = p.hidden, I = p.inter;
  p.w13_weight = Tensor::zeros(DType::U8, {E, 2 * I, H / 2});
  p.w2_weight = Tensor::zeros(DType::U8, {E, H, I / 2});
  p.w13_weight_scale = Tensor::zeros(DType::F8_E4M3, {E, 2 * I, H / kNvfp4Block});
  p.w2_weight_scale = Tensor::zeros(DType::F8_E4M3, {E, H, I / kNvfp4Block});
  p.w13_weight_scale_2 = Tensor::zeros(DType::F32, {E, 2});
  p.w2_weight_scale_2 = Tensor::zeros(DType::F32, {E});
  p.w13_input_scale = Tensor::zeros(DType::F32, {E, 2});
  p.w2_input_scale = Tensor::zeros(DType::F32, {E});
}

void load_nvfp4(ExpertParams& p, const ProjSource& src) {
  load_weight_bytes(p, src, DType::U8);
  const std::string what = fmt::format("NVFP4 FP8 E4M3 block scales, one per 16 of in={} (Linear [out={}, in={}])",
                                       src.in_dim(), src.out_dim(), src.in_dim());
  Tensor s = fetch(src, "weight_scale", what);
  expect_dtype(s, src.name("weight_scale"), {DType::F8_E4M3}, what);
  expect_shape(s, src.name("weight_scale"), {src.out_dim(), src.in_dim() / kNvfp4Block}, what);
  check_fp8_block_scales(s, src.name("weight_scale"), what);
  place_slice(src, s, block_scale_col_layout(WeightFormat::Nvfp4),
              is_w13(src.shard) ? p.w13_weight_scale : p.w2_weight_scale);
  place_per_tensor_f32(src, fetch_scalar(src, "weight_scale_2", "NVFP4 per-tensor weight_scale_2"),
                       is_w13(src.shard) ? p.w13_weight_scale_2 : p.w2_weight_scale_2);
  load_static_input_scale(p, src, "input_scale_2");
}

// torch.allclose defaults (the seed's check): |a − b| ≤ 1e-8 + 1e-5·|b|.
static bool all_close(float a, float b) { return std::fabs(a - b) <= 1e-8f + 1e-5f * std::fabs(b); }

void process_nvfp4(ExpertParams& p) {
  // 1. One global weight scale per expert for w13 (§16.2: unequal w1 / w3 scales are an error).
  if (p.w13_weight_scale_2.ndim() == 2) {
    const float* s = p.w13_weight_scale_2.data_as<float>();
    Tensor merged = Tensor::zeros(DType::F32, {p.num_local});
    float* m = merged.mutable_data_as<float>();
    for (int e = 0; e < p.num_local; ++e) {
      const float s1 = s[2 * e], s3 = s[2 * e + 1];
      if (!all_close(s1, s3))
        throw Error(fmt::format("NVFP4 {}: the global weight scales of w1 (gate_proj.weight_scale_2 = {}) and w3 "
                                "(up_proj.weight_scale_2 = {}) differ; different global scales for w1 and w3 are "
                                "not supported",
                                expert_desc(p, e), s1, s3));
      m[e] = std::fmax(s1, s3);
    }
    p.w13_weight_scale_2 = merged;
  }
  // 2. Activation global scales: gs = 1 / max(input_scale_2) (quantization direction).
  const StaticMax mx = reduce_static_input_scales(p, "input_scale_2");
  p.a13_scale = 1.0f / mx.a13;
  p.a2_scale = 1.0f / mx.a2;
}

}  // namespace qmoe::methods
