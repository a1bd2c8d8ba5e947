// Checkpoint tensor lookup / validation and TP-sliced placement into the expert parameters
// (spec quark-moe.md §7.2–7.4, checkpoint-format.md §4).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "methods/params_internal.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe::methods {

std::string_view shard_label(Shard s) {
  switch (s) {
    case Shard::Gate: return "gate (w1)";
    case Shard::Up: return "up (w3)";
    case Shard::Down: return "down (w2)";
    case Shard::GateUp: return "gate_up";
  }
  return "?";
}

int64_t ProjSource::out_dim() const {
  switch (shard) {
    case Shard::Gate:
    case Shard::Up: return inter_full;
    case Shard::GateUp: return 2 * inter_full;
    case Shard::Down: return hidden;
  }
  return 0;
}
int64_t ProjSource::in_dim() const { return shard == Shard::Down ? inter_full : hidden; }

bool stores_packed(WeightFormat f) { return is_mx_weight(f) || f == WeightFormat::Nvfp4; }

ColLayout weight_col_layout(WeightFormat f) {
  switch (f) {
    case WeightFormat::Mxfp4:
    case WeightFormat::Nvfp4: return {1, 2, 2, "fp4 packing (2 per byte)"};
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: return {3, 4, 4, "fp6 packing (4 in 3 bytes)"};
    case WeightFormat::Int8:
    case WeightFormat::Fp8E4M3: return {1, 1, 1, "byte"};
    case WeightFormat::BF16: return kF32Cols;
  }
  return {};
}

ColLayout block_scale_col_layout(WeightFormat f) {
  if (is_mx_weight(f)) return {1, kMxBlock, kMxBlock, "MX scale block (32)"};
  return {1, kNvfp4Block, kNvfp4Block, "NVFP4 scale block (16)"};
}

int64_t packed_bytes(WeightFormat f, int64_t n) {
  const ColLayout l = weight_col_layout(f);
  return n * l.num / l.den;
}

// ---------------------------------------------------------------------------------------------
bool has_tensor(const ProjSource& src, std::string_view suffix) { return src.ckpt->has(src.name(suffix)); }

Tensor fetch(const ProjSource& src, std::string_view suffix, std::string_view needed_for) {
  const std::string n = src.name(suffix);
  if (!src.ckpt->has(n))
    throw Error(fmt::format("tensor '{}' is missing from the checkpoint in '{}' (needed for {})", n, src.ckpt->dir(),
                            needed_for));
  return src.ckpt->get(n);
}

void expect_dtype(const Tensor& t, const std::string& name, std::initializer_list<DType> allowed,
                  std::string_view what) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
  throw Error(fmt::format("tensor '{}': dtype {} does not match the expected dtype {} ({})", name,
                          dtype_name(t.dtype()), names, what));
}

void expect_shape(const Tensor& t, const std::string& name, const Shape& expected, std::string_view what) {
  if (t.shape() == expected) return;
  throw Error(fmt::format("tensor '{}': shape {} does not match the expected shape {} ({})", name,
                          shape_str(t.shape()), shape_str(expected), what));
}

static Tensor fetch_scalar_tensor(const ProjSource& src, std::string_view suffix, std::string_view what) {
  Tensor t = fetch(src, suffix, what);
  const bool ok = t.ndim() == 0 || (t.ndim() == 1 && t.dim(0) == 1);
  if (!ok)
    throw Error(fmt::format("tensor '{}': shape {} is not a per-tensor scalar (expected shape [] or [1], found {} "
                            "elements; {})",
                            src.name(suffix), shape_str(t.shape()), t.numel(), what));
  return t;
}

float fetch_scalar(const ProjSource& src, std::string_view suffix, std::string_view what) {
  Tensor t = fetch_scalar_tensor(src, suffix, what);
  expect_dtype(t, src.name(suffix), kFloatDTypes, what);
  const float v = to_f32(t, src.name(suffix))[0];
  check_positive_scales(&v, 1, src.name(suffix), what);
  return v;
}

namespace {
std::string element_at(int64_t i, int64_t n) { return n == 1 ? std::string("its value") : fmt::format("element {}", i); }
}  // namespace

void check_positive_scales(const float* v, int64_t n, const std::string& name, std::string_view what) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i]) && v[i] > 0.0f) continue;
    throw Error(fmt::format("tensor '{}': {} is {}; expected a finite scale > 0 ({})", name, element_at(i, n), v[i],
                            what));
  }
}

void check_e8m0_scales(const Tensor& t, const std::string& name, std::string_view what) {
  const uint8_t* b = t.data_as<uint8_t>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (b[i] == 0xFF)
      throw Error(fmt::format("tensor '{}': {} is 255, the E8M0 encoding of NaN; expected scale bytes 0..254 ({})",
                              name, element_at(i, n), what));
}

void check_fp8_block_scales(const Tensor& t, const std::string& name, std::string_view what) {
  const uint8_t* b = t.data_as<uint8_t>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t c = b[i];
    if ((c & 0x7F) == 0x7F)
      throw Error(fmt::format("tensor '{}': {} is NaN (FP8 E4M3 byte 0x{:02X}); expected finite scales >= 0 ({})",
                              name, element_at(i, n), c, what));
    if ((c & 0x80) && c != 0x80)
      throw Error(fmt::format("tensor '{}': {} is negative ({}, FP8 E4M3 byte 0x{:02X}); expected finite scales >= 0 "
                              "({})",
                              name, element_at(i, n), fp8_e4m3_decode(c), c, what));
  }
}

int8_t fetch_scalar_i8(const ProjSource& src, std::string_view suffix, std::string_view what) {
  Tensor t = fetch_scalar_tensor(src, suffix, what);
  expect_dtype(t, src.name(suffix), {DType::I8}, what);
  return t.data_as<int8_t>()[0];
}

Tensor as_f32(const Tensor& t, const std::string& name) {
  if (t.dtype() == DType::F32) return t;
  return Tensor::from_f32(to_f32(t, name), t.shape());
}

// ---------------------------------------------------------------------------------------------
namespace {

// Row range of the checkpoint tensor (w13 shards) and the destination row in param[local].
struct RowPlan {
  int64_t src_row0 = 0;
  int64_t nrows = 0;
  int64_t dst_row0 = 0;
};

RowPlan w13_rows(const ProjSource& src, int64_t param_rows) {
  RowPlan r;
  switch (src.shard) {
    case Shard::Gate: r = {src.slice.start, src.slice.len, 0}; break;
    case Shard::Up: r = {src.slice.start, src.slice.len, param_rows / 2}; break;
    case Shard::GateUp: r = {2 * src.slice.start, 2 * src.slice.len, 0}; break;
    case Shard::Down: break;
  }
  return r;
}

std::byte* expert_base(Tensor& param, int local, size_t& per_expert) {
  per_expert = param.nbytes() / static_cast<size_t>(param.dim(0));
  return param.mutable_data() + per_expert * static_cast<size_t>(local);
}

[[noreturn]] void internal_mismatch(const ProjSource& src, std::string_view what) {
  throw Error(fmt::format("internal error placing '{}' ({}): parameter layout mismatch", src.base, what));
}

}  // namespace

void place_slice(const ProjSource& src, const Tensor& t, const ColLayout& layout, Tensor& param) {
  const int64_t out = t.dim(0);
  const size_t src_row_bytes = out ? t.nbytes() / static_cast<size_t>(out) : 0;
  const int64_t rows = param.dim(1);
  size_t per_expert = 0;
  std::byte* dst = expert_base(param, src.local, per_expert);
  const size_t dst_row_bytes = rows ? per_expert / static_cast<size_t>(rows) : 0;
  const std::byte* s = t.data();
  if (is_w13(src.shard)) {
    const RowPlan r = w13_rows(src, rows);
    if (dst_row_bytes != src_row_bytes || r.dst_row0 + r.nrows > rows || r.src_row0 + r.nrows > out)
      internal_mismatch(src, "w13 rows");
    std::memcpy(dst + r.dst_row0 * dst_row_bytes, s + r.src_row0 * src_row_bytes,
                static_cast<size_t>(r.nrows) * src_row_bytes);
    return;
  }
  const int64_t a = src.slice.start, b = src.slice.start + src.slice.len;
  if (a % layout.align != 0 || b % layout.align != 0)
    throw Error(fmt::format("tensor '{}': the TP slice [{}, {}) of the intermediate dimension (tp_rank {}) does not "
                            "fall on the {} boundaries ({} elements); choose a tp_size whose slices are multiples "
                            "of {}",
                            src.base, a, b, src.tp_rank, layout.what, layout.align, layout.align));
  const size_t c0 = static_cast<size_t>(a * layout.num / layout.den);
  const size_t nc = static_cast<size_t>((b - a) * layout.num / layout.den);
  if (rows != out || nc != dst_row_bytes || c0 + nc > src_row_bytes) internal_mismatch(src, "w2 columns");
  for (int64_t i = 0; i < out; ++i)
    std::memcpy(dst + i * dst_row_bytes, s + i * src_row_bytes + c0, nc);
}

void place_rows_1d(const ProjSource& src, const Tensor& t, Tensor& param) {
  const size_t elem = static_cast<size_t>(dtype_bits(t.dtype()) / 8);
  if (elem == 0 || param.dtype() != t.dtype()) internal_mismatch(src, "1-d dtype");
  const int64_t rows = param.dim(1);
  size_t per_expert = 0;
  std::byte* dst = expert_base(param, src.local, per_expert);
  if (is_w13(src.shard)) {
    const RowPlan r = w13_rows(src, rows);
    if (r.dst_row0 + r.nrows > rows || r.src_row0 + r.nrows > t.numel()) internal_mismatch(src, "1-d rows");
    std::memcpy(dst + r.dst_row0 * elem, t.data() + r.src_row0 * elem, static_cast<size_t>(r.nrows) * elem);
    return;
  }
  if (t.numel() != rows) internal_mismatch(src, "1-d down");
  std::memcpy(dst, t.data(), static_cast<size_t>(rows) * elem);
}

template <class T>
static void place_per_tensor(const ProjSource& src, T v, Tensor& param) {
  T* d = param.mutable_data_as<T>();
  if (src.shard == Shard::Down) {
    d[src.local] = v;
    return;
  }
  if (param.ndim() != 2 || param.dim(1) != 2) internal_mismatch(src, "per-tensor w13");
  if (src.shard != Shard::Up) d[2 * src.local] = v;
  if (src.shard != Shard::Gate) d[2 * src.local + 1] = v;
}
void place_per_tensor_f32(const ProjSource& src, float v, Tensor& param) { place_per_tensor(src, v, param); }
void place_per_tensor_i8(const ProjSource& src, int8_t v, Tensor& param) { place_per_tensor(src, v, param); }

// ---------------------------------------------------------------------------------------------
void load_weight_bytes(ExpertParams& p, const ProjSource& src, DType dtype) {
  const WeightFormat f = p.scheme->weight;
  const std::string what = fmt::format("{} weight of the {} Linear [out={}, in={}]", to_string(f),
                                       shard_label(src.shard), src.out_dim(), src.in_dim());
  Tensor t = fetch(src, "weight", what);
  expect_dtype(t, src.name("weight"), {dtype}, what);
  expect_shape(t, src.name("weight"), {src.out_dim(), packed_bytes(f, src.in_dim())}, what);
  place_slice(src, t, weight_col_layout(f), is_w13(src.shard) ? p.w13_weight : p.w2_weight);
}

void load_float_weight_scale(ExpertParams& p, const ProjSource& src) {
  Tensor& param = is_w13(src.shard) ? p.w13_weight_scale : p.w2_weight_scale;
  if (p.scheme->weight_scale == WeightScale::PerTensor) {
    place_per_tensor_f32(src, fetch_scalar(src, "weight_scale", "per-tensor weight scale"), param);
    return;
  }
  const std::string what = fmt::format("per-channel weight scale, one per output row of [out={}, in={}]",
                                       src.out_dim(), src.in_dim());
  Tensor t = fetch(src, "weight_scale", what);
  expect_dtype(t, src.name("weight_scale"), kFloatDTypes, what);
  expect_shape(t, src.name("weight_scale"), {src.out_dim()}, what);
  const Tensor f = as_f32(t, src.name("weight_scale"));
  check_positive_scales(f.data_as<float>(), f.numel(), src.name("weight_scale"), what);
  place_rows_1d(src, f, param);
}

void load_static_input_scale(ExpertParams& p, const ProjSource& src, std::string_view suffix) {
  const float v = fetch_scalar(
      src, suffix,
      fmt::format("static activation scale of scheme {}: QuantConfig has static quantization", p.scheme->name));
  if (src.shard == Shard::Down) {
    p.w2_input_scale.mutable_data_as<float>()[src.local] = v;
    return;
  }
  // Every w13 shard writes the whole row of its expert: the last one loaded (up) wins (§7.4).
  Tensor& param = p.w13_input_scale;
  const int64_t cols = param.ndim() == 2 ? param.dim(1) : 1;
  float* d = param.mutable_data_as<float>() + src.local * cols;
  std::fill(d, d + cols, v);
}

void load_bias(ExpertParams& p, const ProjSource& src) {
  const std::string what = fmt::format("bias of the {} Linear [out={}]", shard_label(src.shard), src.out_dim());
  Tensor t = fetch(src, "bias", what);
  expect_dtype(t, src.name("bias"), kFloatDTypes, what);
  expect_shape(t, src.name("bias"), {src.out_dim()}, what);
  // w2 bias: added once, on TP rank 0 (§16.5); the other ranks keep zeros.
  if (src.shard == Shard::Down && src.tp_rank != 0) return;
  place_rows_1d(src, as_f32(t, src.name("bias")), is_w13(src.shard) ? p.w13_bias : p.w2_bias);
}

}  // namespace qmoe::methods
