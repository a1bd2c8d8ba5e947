// Shape / dtype checks that make the reference safe on any ExpertParams, and the per-projection
// weight and bias views it uses (the decode itself is dequant_expert; layouts in include/qmoe/params.h).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <initializer_list>

#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"

namespace qmoe::ref {

namespace {

struct ProjDims {
  int64_t rows = 0, cols = 0;
};

ProjDims dims_of(const ExpertParams& p, Proj which) {
  return which == Proj::W13 ? ProjDims{2LL * p.inter, p.hidden} : ProjDims{p.hidden, p.inter};
}

const char* name_of(Proj which) { return which == Proj::W13 ? "w13" : "w2"; }

bool dtype_in(DType d, std::initializer_list<DType> ok) {
  for (DType o : ok)
    if (o == d) return true;
  return false;
}

// The expected shape of a checked tensor (up to 3 dims), formatted only for an error message.
struct ShapeSpec {
  int64_t d[3];
  int n;
};
ShapeSpec spec_of(std::initializer_list<int64_t> dims) {
  ShapeSpec s{{0, 0, 0}, 0};
  for (int64_t v : dims) s.d[s.n++] = v;
  return s;
}

// Field names and shapes are formatted only when a check fails: validation runs on every layer
// call, which must not allocate once warmed up.
void check_tensor(const Tensor& t, const char* pre, const char* suffix, std::initializer_list<DType> dtypes,
                  int64_t numel, ShapeSpec expected, const char* who) {
  auto field = [&] { return std::string(pre) + suffix; };
  auto shape = [&] { return shape_str(Shape(expected.d, expected.d + expected.n)); };
  if (!t.defined())
    throw Error(fmt::format("{}: ExpertParams.{} is missing; expected {} {}", who, field(), dtype_name(*dtypes.begin()),
                            shape()));
  if (!dtype_in(t.dtype(), dtypes))
    throw Error(fmt::format("{}: ExpertParams.{} has dtype {}; expected {}", who, field(), dtype_name(t.dtype()),
                            dtype_name(*dtypes.begin())));
  if (t.numel() != numel)
    throw Error(fmt::format("{}: ExpertParams.{} has shape {}; expected {}", who, field(), shape_str(t.shape()), shape()));
}

void validate_proj(const ExpertParams& p, Proj which, const char* who) {
  const SchemeInfo& s = *p.scheme;
  const ProjDims d = dims_of(p, which);
  const int64_t el = p.num_local;
  const char* pre = name_of(which);
  const int bs = weight_block_size(s.weight);
  if (bs > 0 && d.cols % bs != 0)
    throw Error(fmt::format("{}: {} input dimension {} is not a multiple of the {} block size {}", who, pre, d.cols,
                            to_string(s.weight), bs));
  if ((s.weight == WeightFormat::Mxfp6E2M3 || s.weight == WeightFormat::Mxfp6E3M2) && d.cols % 4 != 0)
    throw Error(fmt::format("{}: {} input dimension {} is not a multiple of 4 (fp6 packing)", who, pre, d.cols));
  const int64_t pc = weight_packed_cols(s.weight, d.cols);
  const ShapeSpec wshape = spec_of({el, d.rows, pc});
  const Tensor& w = which == Proj::W13 ? p.w13_weight : p.w2_weight;
  const Tensor& sc = which == Proj::W13 ? p.w13_weight_scale : p.w2_weight_scale;
  switch (s.weight) {
    case WeightFormat::BF16:
      check_tensor(w, pre, "_weight", {DType::BF16, DType::F16, DType::F32}, el * d.rows * pc, wshape, who);
      break;
    case WeightFormat::Fp8E4M3:
      check_tensor(w, pre, "_weight", {DType::U8, DType::F8_E4M3}, el * d.rows * pc, wshape, who);
      break;
    case WeightFormat::Int8:
      check_tensor(w, pre, "_weight", {DType::I8}, el * d.rows * pc, wshape, who);
      break;
    default:
      check_tensor(w, pre, "_weight", {DType::U8}, el * d.rows * pc, wshape, who);
      break;
  }
  switch (s.weight_scale) {
    case WeightScale::None:
      break;
    case WeightScale::PerTensor:
      check_tensor(sc, pre, "_weight_scale", {DType::F32}, el, spec_of({el}), who);
      break;
    case WeightScale::PerChannel:
      check_tensor(sc, pre, "_weight_scale", {DType::F32}, el * d.rows, spec_of({el, d.rows}), who);
      break;
    case WeightScale::MxE8M0:
      check_tensor(sc, pre, "_weight_scale", {DType::U8, DType::F8_E8M0}, el * d.rows * (d.cols / kMxBlock),
                   spec_of({el, d.rows, d.cols / kMxBlock}), who);
      break;
    case WeightScale::Nvfp4: {
      check_tensor(sc, pre, "_weight_scale", {DType::U8, DType::F8_E4M3}, el * d.rows * (d.cols / kNvfp4Block),
                   spec_of({el, d.rows, d.cols / kNvfp4Block}), who);
      const Tensor& s2 = which == Proj::W13 ? p.w13_weight_scale_2 : p.w2_weight_scale_2;
      check_tensor(s2, pre, "_weight_scale_2", {DType::F32}, el, spec_of({el}), who);
      break;
    }
  }
  const Tensor& b = which == Proj::W13 ? p.w13_bias : p.w2_bias;
  if (b.defined())
    check_tensor(b, pre, "_bias", {DType::F32, DType::BF16, DType::F16}, el * d.rows, spec_of({el, d.rows}), who);
}

}  // namespace

void validate_expert_params(const ExpertParams& p, const char* who) {
  if (p.scheme == nullptr) throw Error(fmt::format("{}: expert parameters have no scheme", who));
  if (!p.processed)
    throw Error(fmt::format("{}: expert parameters ({}) are not processed; call process_expert_params first", who,
                            p.scheme->name));
  if (p.hidden <= 0 || p.inter <= 0 || p.num_local < 0 || p.num_experts <= 0)
    throw Error(fmt::format("{}: invalid expert dimensions (hidden {}, inter {}, experts {}, local {})", who, p.hidden,
                            p.inter, p.num_experts, p.num_local));
  if (static_cast<int>(p.expert_map.size()) != p.num_experts)
    throw Error(fmt::format("{}: expert_map has {} entries; expected num_experts = {}", who, p.expert_map.size(),
                            p.num_experts));
  for (int g = 0; g < p.num_experts; ++g) {
    const int l = p.expert_map[static_cast<size_t>(g)];
    if (l < -1 || l >= p.num_local)
      throw Error(fmt::format("{}: expert_map[{}] = {} is outside [-1, {})", who, g, l, p.num_local));
  }
  validate_proj(p, Proj::W13, who);
  validate_proj(p, Proj::W2, who);
}

// The one exact decode of stored weights is dequant_expert (src/methods/dequant.cc).
void decode_weight(const ExpertParams& p, Proj which, int e, std::vector<float>& out) {
  std::vector<float> other;
  if (which == Proj::W13)
    dequant_expert(p, e, out, other);
  else
    dequant_expert(p, e, other, out);
}

void decode_bias(const ExpertParams& p, Proj which, int e, std::vector<float>& out) {
  const ProjDims d = dims_of(p, which);
  out.assign(static_cast<size_t>(d.rows), 0.0f);
  const Tensor& b = which == Proj::W13 ? p.w13_bias : p.w2_bias;
  if (!b.defined()) return;
  for (int64_t r = 0; r < d.rows; ++r)
    out[static_cast<size_t>(r)] = float_at(b, static_cast<int64_t>(e) * d.rows + r);
}

}  // namespace qmoe::ref
