// Unquantized experts (excluded from quantization): the checkpoint's BF16 / F16 / F32 weights are
// kept in their stored dtype (exactly the stored bytes; no widening to F32 at load). The
// parameters take the dtype of the first weight tensor loaded (adopt_unquantized_dtype, called by
// the load loop before anything is placed); a later tensor of another dtype widens both the
// parameter and itself to F32 (exact). create_expert_params alone gives BF16 zeros (Quark leaves
// excluded layers in bf16). Nothing to process.
#include <fmt/format.h>

#include "methods/params_internal.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe::methods {

namespace {

constexpr ColLayout k16BitCols{2, 1, 1, "16-bit float"};

// The parameter widened exactly to F32 (same shape).
Tensor widened(const Tensor& param) {
  if (param.dtype() == DType::F32) return param;
  Tensor t = Tensor::zeros(DType::F32, param.shape());
  float* d = t.mutable_data_as<float>();
  const uint16_t* s = param.data_as<uint16_t>();
  const bool bf = param.dtype() == DType::BF16;
  for (int64_t i = 0; i < param.numel(); ++i) d[i] = bf ? bf16_decode(s[i]) : fp16_decode(s[i]);
  return t;
}

bool is_float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

}  // namespace

void create_unquantized(ExpertParams& p) {
  const int64_t E = p.num_local, H = p.hidden, I = p.inter;
  p.w13_weight = Tensor::zeros(DType::BF16, {E, 2 * I, H});
  p.w2_weight = Tensor::zeros(DType::BF16, {E, H, I});
}

void adopt_unquantized_dtype(ExpertParams& p, const ProjSource& first) {
  if (!has_tensor(first, "weight")) return;  // the load reports the missing tensor
  const DType d = first.ckpt->get(first.name("weight")).dtype();
  if (!is_float_dtype(d) || d == p.w13_weight.dtype()) return;  // a wrong dtype is reported by the load
  p.w13_weight = Tensor::zeros(d, p.w13_weight.shape());
  p.w2_weight = Tensor::zeros(d, p.w2_weight.shape());
}

void load_unquantized(ExpertParams& p, const ProjSource& src) {
  const std::string what =
      fmt::format("unquantized weight of the {} Linear [out={}, in={}]", shard_label(src.shard), src.out_dim(),
                  src.in_dim());
  Tensor t = fetch(src, "weight", what);
  expect_dtype(t, src.name("weight"), kFloatDTypes, what);
  expect_shape(t, src.name("weight"), {src.out_dim(), src.in_dim()}, what);
  Tensor& param = is_w13(src.shard) ? p.w13_weight : p.w2_weight;
  if (t.dtype() != param.dtype()) {  // mixed dtypes: F32 holds both exactly
    p.w13_weight = widened(p.w13_weight);
    p.w2_weight = widened(p.w2_weight);
  }
  if (param.dtype() == DType::F32) place_slice(src, as_f32(t, src.name("weight")), kF32Cols, param);
  else place_slice(src, t, k16BitCols, param);
}

}  // namespace qmoe::methods
