// Unquantized experts (excluded from quantization): the checkpoint's BF16 / F16 / F32 weights are
// kept as F32 parameters holding exactly the stored values. Nothing to process.
#include <fmt/format.h>

#include "methods/params_internal.h"
#include "qmoe/error.h"

namespace qmoe::methods {

void create_unquantized(ExpertParams& p) {
  const int64_t E = p.num_local, H = p.hidden, I = p.inter;
  p.w13_weight = Tensor::zeros(DType::F32, {E, 2 * I, H});
  p.w2_weight = Tensor::zeros(DType::F32, {E, H, I});
}

void load_unquantized(ExpertParams& p, const ProjSource& src) {
  const std::string what =
      fmt::format("unquantized weight of the {} Linear [out={}, in={}]", shard_label(src.shard), src.out_dim(),
                  src.in_dim());
  Tensor t = fetch(src, "weight", what);
  expect_dtype(t, src.name("weight"), kFloatDTypes, what);
  expect_shape(t, src.name("weight"), {src.out_dim(), src.in_dim()}, what);
  place_slice(src, as_f32(t, src.name("weight")), kF32Cols, is_w13(src.shard) ? p.w13_weight : p.w2_weight);
}

}  // namespace qmoe::methods
