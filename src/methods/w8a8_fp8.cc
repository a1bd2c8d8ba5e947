// QuarkW8A8Fp8MoEMethod (spec quark-moe.md §6.1): FP8 E4M3 weights with per-tensor or per-channel
// fp32 scales; static or dynamic per-tensor / per-token FP8 activations. Per-tensor w13 is
// requantized to max(s_w1, s_w3) through fp16 as the seed does.
#include <fmt/format.h>

#include <cmath>

#include "methods/params_internal.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe::methods {

void create_w8a8_fp8(ExpertParams& p) {
  const int64_t E = p.num_local, H = p.hidden, I = p.inter;
  const bool per_tensor = p.scheme->weight_scale == WeightScale::PerTensor;
  p.w13_weight = Tensor::zeros(DType::F8_E4M3, {E, 2 * I, H});
  p.w2_weight = Tensor::zeros(DType::F8_E4M3, {E, H, I});
  p.w13_weight_scale = Tensor::zeros(DType::F32, per_tensor ? Shape{E, 2} : Shape{E, 2 * I});
  p.w2_weight_scale = Tensor::zeros(DType::F32, per_tensor ? Shape{E} : Shape{E, H});
  if (act_is_static(p.scheme->act)) {
    p.w13_input_scale = Tensor::zeros(DType::F32, {E});
    p.w2_input_scale = Tensor::zeros(DType::F32, {E});
  }
}

void load_w8a8_fp8(ExpertParams& p, const ProjSource& src) {
  load_weight_bytes(p, src, DType::F8_E4M3);
  load_float_weight_scale(p, src);
  if (act_is_static(p.scheme->act)) load_static_input_scale(p, src, "input_scale");
}

static uint8_t requant_fp8(uint8_t code, float s_shard, float s_max) {
  const float deq = fp16_round(fp8_e4m3_decode(code) * s_shard);  // fp16 · fp32 scalar
  const float x = deq * (1.0f / s_max);
  if (std::isnan(x)) return fp8_e4m3_encode(x);  // clamp keeps NaN (torch semantics)
  return fp8_e4m3_encode(std::fmin(std::fmax(x, -kFp8E4M3Max), kFp8E4M3Max));
}

void process_w8a8_fp8(ExpertParams& p) {
  if (act_is_static(p.scheme->act)) {
    const StaticMax m = reduce_static_input_scales(p, "input_scale");
    p.a13_scale = m.a13;
    p.a2_scale = m.a2;
  }
  if (p.scheme->weight_scale == WeightScale::PerTensor) merge_per_tensor_w13(p, requant_fp8);
}

}  // namespace qmoe::methods
