// process_expert_params (the seed's process_weights_after_loading, spec §6 per method, §16.2,
// §16.4) and the merges shared by several methods.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "methods/params_internal.h"
#include "qmoe/error.h"

namespace qmoe::methods {

StaticMax reduce_static_input_scales(ExpertParams& p, std::string_view scale_name) {
  const std::string where = p.prefix.empty() ? std::string("these experts") : fmt::format("layer '{}'", p.prefix);
  if (!p.w13_input_scale.defined() || !p.w2_input_scale.defined())
    throw Error(fmt::format("QuantConfig has static quantization, but found activation scales are None ({}: "
                            "w13_{} {}, w2_{} {})",
                            where, scale_name, p.w13_input_scale.defined() ? "present" : "missing", scale_name,
                            p.w2_input_scale.defined() ? "present" : "missing"));
  auto reduce = [&](Tensor& t, const char* which) {
    const std::vector<float> v = to_f32(t, which);
    if (v.empty()) throw Error(fmt::format("{}: {}_{} holds no values", where, which, scale_name));
    const float mx = *std::max_element(v.begin(), v.end());
    const float mn = *std::min_element(v.begin(), v.end());
    for (float x : v)
      if (!(x > 0.0f) || !std::isfinite(x))
        throw Error(fmt::format("{}: static activation scale {}_{} has the value {}; expected positive finite "
                                "values",
                                where, which, scale_name, x));
    if (mn != mx)
      p.warnings.push_back(fmt::format("{}: {}_{} differs across experts (min {}, max {}); using the maximum over "
                                       "experts",
                                       where, which, scale_name, mn, mx));
    t = Tensor::from_f32({mx}, {});
    return mx;
  };
  StaticMax m;
  m.a13 = reduce(p.w13_input_scale, "w13");
  m.a2 = reduce(p.w2_input_scale, "w2");
  return m;
}

void merge_per_tensor_w13(ExpertParams& p, RequantFn requant) {
  if (!p.w13_weight_scale.defined() || p.w13_weight_scale.ndim() != 2) return;  // already merged
  const int64_t rows = p.rows13(), H = p.hidden, I = p.inter;
  const float* s = p.w13_weight_scale.data_as<float>();
  Tensor merged = Tensor::zeros(DType::F32, {p.num_local});
  float* m = merged.mutable_data_as<float>();
  uint8_t* w = p.w13_weight.mutable_data_as<uint8_t>();
  for (int e = 0; e < p.num_local; ++e) {
    const float sh[2] = {s[2 * e], s[2 * e + 1]};
    const float s_max = std::fmax(sh[0], sh[1]);
    if (!(s_max > 0.0f) || !std::isfinite(s_max))
      throw Error(fmt::format("{}: per-tensor weight scales w1 = {}, w3 = {}; expected positive finite scales",
                              expert_desc(p, e), sh[0], sh[1]));
    m[e] = s_max;
    // gpt-oss: one fused gate_up tensor with one scale, nothing to merge.
    if (p.act.interleaved && sh[0] == sh[1]) continue;
    for (int64_t r = 0; r < rows; ++r) {
      const int shard = p.act.interleaved ? static_cast<int>(r % 2) : (r < I ? 0 : 1);
      uint8_t* row = w + (e * rows + r) * H;
      for (int64_t k = 0; k < H; ++k) row[k] = requant(row[k], sh[shard], s_max);
    }
  }
  p.w13_weight_scale = merged;
}

}  // namespace qmoe::methods

namespace qmoe {

void process_expert_params(ExpertParams& p) {
  if (p.processed) return;
  if (p.scheme == nullptr) throw Error("process_expert_params: the parameters have no scheme");
  switch (p.scheme->method) {
    case Method::OcpMx: methods::process_ocp_mx(p); break;
    case Method::Nvfp4: methods::process_nvfp4(p); break;
    case Method::W8A8Int8: methods::process_w8a8_int8(p); break;
    case Method::W8A8Fp8: methods::process_w8a8_fp8(p); break;
    case Method::Unquantized: break;
  }
  p.processed = true;
}

}  // namespace qmoe
