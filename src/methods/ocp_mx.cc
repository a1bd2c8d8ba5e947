// QuarkOCP_MX_MoEMethod (spec quark-moe.md §6.3): MXFP4 / MXFP6 weights with E8M0 scales per 32
// input elements; optional static FP8 activations (w_mx*_a_fp8). Emulation semantics: the weights
// stay packed, processing only reduces static input scales to their max over experts.
#include <fmt/format.h>

#include <cstring>

#include "methods/params_internal.h"
#include "qmoe/error.h"

namespace qmoe::methods {

void create_ocp_mx(ExpertParams& p) {
  const WeightFormat f = p.scheme->weight;
  const int64_t E = p.num_local, H = p.hidden, I = p.inter;
  p.w13_weight = Tensor::zeros(DType::U8, {E, 2 * I, packed_bytes(f, H)});
  p.w2_weight = Tensor::zeros(DType::U8, {E, H, packed_bytes(f, I)});
  // E8M0 scales start at byte 1 (2^-126), as the seed's torch.ones: harmless on zero weights.
  p.w13_weight_scale = Tensor::zeros(DType::U8, {E, 2 * I, H / kMxBlock});
  p.w2_weight_scale = Tensor::zeros(DType::U8, {E, H, I / kMxBlock});
  std::memset(p.w13_weight_scale.mutable_data(), 1, p.w13_weight_scale.nbytes());
  std::memset(p.w2_weight_scale.mutable_data(), 1, p.w2_weight_scale.nbytes());
  if (act_is_static(p.scheme->act)) {
    p.w13_input_scale = Tensor::zeros(DType::F32, {E});
    p.w2_input_scale = Tensor::zeros(DType::F32, {E});
  }
}

void load_ocp_mx(ExpertParams& p, const ProjSource& src) {
  const WeightFormat f = p.scheme->weight;
  load_weight_bytes(p, src, DType::U8);
  const std::string what = fmt::format("{} E8M0 weight scales, one byte per 32 of in={} (Linear [out={}, in={}])",
                                       to_string(f), src.in_dim(), src.out_dim(), src.in_dim());
  Tensor s = fetch(src, "weight_scale", what);
  expect_dtype(s, src.name("weight_scale"), {DType::U8, DType::F8_E8M0}, what);
  expect_shape(s, src.name("weight_scale"), {src.out_dim(), src.in_dim() / kMxBlock}, what);
  check_e8m0_scales(s, src.name("weight_scale"), what);
  place_slice(src, s, block_scale_col_layout(f), is_w13(src.shard) ? p.w13_weight_scale : p.w2_weight_scale);
  if (act_is_static(p.scheme->act)) load_static_input_scale(p, src, "input_scale");
}

void process_ocp_mx(ExpertParams& p) {
  if (!act_is_static(p.scheme->act)) return;
  const StaticMax m = reduce_static_input_scales(p, "input_scale");
  p.a13_scale = m.a13;
  p.a2_scale = m.a2;
}

}  // namespace qmoe::methods
