// QuarkW8A8Int8MoEMethod (spec quark-moe.md §6.2): INT8 weights with per-tensor or per-channel fp32
// scales; static per-tensor or dynamic per-token INT8 activations. Zero points are loaded and must
// be zero (§16.4: asymmetric INT8 is an error); per-tensor w13 is requantized to max(s_w1, s_w3)
// through fp16 as the seed does.
#include <fmt/format.h>

#include "methods/params_internal.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe::methods {

void create_w8a8_int8(ExpertParams& p) {
  const int64_t E = p.num_local, H = p.hidden, I = p.inter;
  const bool per_tensor = p.scheme->weight_scale == WeightScale::PerTensor;
  p.w13_weight = Tensor::zeros(DType::I8, {E, 2 * I, H});
  p.w2_weight = Tensor::zeros(DType::I8, {E, H, I});
  const Shape s13 = per_tensor ? Shape{E, 2} : Shape{E, 2 * I};
  const Shape s2 = per_tensor ? Shape{E} : Shape{E, H};
  p.w13_weight_scale = Tensor::zeros(DType::F32, s13);
  p.w2_weight_scale = Tensor::zeros(DType::F32, s2);
  p.w13_weight_zero_point = Tensor::zeros(DType::I8, s13);
  p.w2_weight_zero_point = Tensor::zeros(DType::I8, s2);
  if (act_is_static(p.scheme->act)) {
    p.w13_input_scale = Tensor::zeros(DType::F32, {E});
    p.w2_input_scale = Tensor::zeros(DType::F32, {E});
    p.w13_input_zero_point = Tensor::zeros(DType::I8, {E, 2});
    p.w2_input_zero_point = Tensor::zeros(DType::I8, {E});
  }
}

namespace {

[[noreturn]] void asymmetric(const std::string& what, int value) {
  throw Error(fmt::format("asymmetric INT8 is not supported: {} is {} (only symmetric quantization with all-zero zero "
                          "points is supported)",
                          what, value));
}

void check_zero(const ProjSource& src, std::string_view suffix, const Tensor& t) {
  const int8_t* z = t.data_as<int8_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (z[i] != 0) asymmetric(fmt::format("tensor '{}' element {}", src.name(suffix), i), z[i]);
}

// Optional zero point (Quark writes one for int8; absent means symmetric).
void load_zero_point(const ProjSource& src, std::string_view suffix, bool per_tensor, Tensor& param) {
  if (!has_tensor(src, suffix)) return;
  const std::string name = src.name(suffix);
  if (per_tensor) {
    const int8_t z = fetch_scalar_i8(src, suffix, "per-tensor INT8 zero point");
    if (z != 0) asymmetric(fmt::format("tensor '{}'", name), z);
    place_per_tensor_i8(src, z, param);
    return;
  }
  const std::string what = fmt::format("per-channel INT8 zero point, one per output row (out={})", src.out_dim());
  Tensor t = fetch(src, suffix, what);
  expect_dtype(t, name, {DType::I8}, what);
  expect_shape(t, name, {src.out_dim()}, what);
  check_zero(src, suffix, t);
  place_rows_1d(src, t, param);
}

uint8_t requant_int8(uint8_t code, float s_shard, float s_max) {
  const float deq = fp16_round(static_cast<float>(static_cast<int8_t>(code)) * s_shard);  // fp16 · fp32 scalar
  return static_cast<uint8_t>(int8_saturate_rne(deq / s_max));
}

void drop_zero_points(ExpertParams& p) {
  struct Zp {
    Tensor* t;
    const char* name;
  };
  for (Zp z : {Zp{&p.w13_weight_zero_point, "w13_weight_zero_point"}, Zp{&p.w2_weight_zero_point, "w2_weight_zero_point"},
               Zp{&p.w13_input_zero_point, "w13_input_zero_point"}, Zp{&p.w2_input_zero_point, "w2_input_zero_point"}}) {
    if (!z.t->defined()) continue;
    const int8_t* d = z.t->data_as<int8_t>();
    const int64_t per_expert = p.num_local ? z.t->numel() / p.num_local : 0;
    for (int64_t i = 0; i < z.t->numel(); ++i)
      if (d[i] != 0)
        asymmetric(fmt::format("{}[{}] ({})", z.name, i, expert_desc(p, static_cast<int>(i / per_expert))), d[i]);
    *z.t = Tensor();
  }
}

}  // namespace

void load_w8a8_int8(ExpertParams& p, const ProjSource& src) {
  const bool per_tensor = p.scheme->weight_scale == WeightScale::PerTensor;
  load_weight_bytes(p, src, DType::I8);
  load_float_weight_scale(p, src);
  load_zero_point(src, "weight_zero_point", per_tensor,
                  is_w13(src.shard) ? p.w13_weight_zero_point : p.w2_weight_zero_point);
  if (act_is_static(p.scheme->act)) {
    load_static_input_scale(p, src, "input_scale");
    load_zero_point(src, "input_zero_point", true, is_w13(src.shard) ? p.w13_input_zero_point : p.w2_input_zero_point);
  }
}

void process_w8a8_int8(ExpertParams& p) {
  drop_zero_points(p);
  if (act_is_static(p.scheme->act)) {
    const StaticMax m = reduce_static_input_scales(p, "input_scale");
    p.a13_scale = m.a13;
    p.a2_scale = m.a2;
  }
  if (p.scheme->weight_scale == WeightScale::PerTensor) merge_per_tensor_w13(p, requant_int8);
}

}  // namespace qmoe::methods
