#include "qmoe/tensor.h"

#include <fmt/format.h>

#include <cmath>

#include <array>
#include <cstring>

#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "util/memory.h"

namespace qmoe {

namespace {
struct DTypeRow {
  DType d;
  std::string_view name;
  int bits;
};
constexpr std::array<DTypeRow, 20> kDTypes{{
    {DType::BOOL, "BOOL", 8},       {DType::F4, "F4", 4},           {DType::F6_E2M3, "F6_E2M3", 6},
    {DType::F6_E3M2, "F6_E3M2", 6}, {DType::U8, "U8", 8},           {DType::I8, "I8", 8},
    {DType::F8_E5M2, "F8_E5M2", 8}, {DType::F8_E4M3, "F8_E4M3", 8}, {DType::F8_E8M0, "F8_E8M0", 8},
    {DType::I16, "I16", 16},        {DType::U16, "U16", 16},        {DType::F16, "F16", 16},
    {DType::BF16, "BF16", 16},      {DType::I32, "I32", 32},        {DType::U32, "U32", 32},
    {DType::F32, "F32", 32},        {DType::C64, "C64", 64},        {DType::F64, "F64", 64},
    {DType::I64, "I64", 64},        {DType::U64, "U64", 64},
}};
}  // namespace

std::string_view dtype_name(DType d) { return kDTypes[static_cast<size_t>(d)].name; }
int dtype_bits(DType d) { return kDTypes[static_cast<size_t>(d)].bits; }
std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& r : kDTypes)
    if (r.name == s) return r.d;
  return std::nullopt;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

static size_t bytes_for(DType d, int64_t numel) {
  return static_cast<size_t>((numel * dtype_bits(d) + 7) / 8);
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  for (int64_t d : shape)
    if (d < 0) throw Error(fmt::format("negative dimension in shape {}", shape_str(shape)));
  Tensor t;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.shape_ = std::move(shape);
  t.nbytes_ = bytes_for(dtype, shape_numel(t.shape_));
  std::shared_ptr<void> buf = util::alloc_zeroed(static_cast<size_t>(t.nbytes_));
  t.ptr_ = static_cast<std::byte*>(buf.get());
  t.holder_ = std::move(buf);
  t.writable_ = true;
  return t;
}

Tensor Tensor::view(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> keepalive) {
  Tensor t;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.shape_ = std::move(shape);
  t.nbytes_ = bytes_for(dtype, shape_numel(t.shape_));
  t.ptr_ = const_cast<std::byte*>(static_cast<const std::byte*>(data));
  t.holder_ = std::move(keepalive);
  t.writable_ = false;
  return t;
}

Tensor Tensor::from_f32(const std::vector<float>& v, Shape shape) {
  if (shape_numel(shape) != static_cast<int64_t>(v.size()))
    throw Error(fmt::format("from_f32: {} values do not fill shape {}", v.size(), shape_str(shape)));
  Tensor t = zeros(DType::F32, std::move(shape));
  if (!v.empty()) std::memcpy(t.mutable_data(), v.data(), v.size() * 4);
  return t;
}

std::byte* Tensor::mutable_data() {
  if (!writable_) throw Error("tensor is a read-only view");
  return ptr_;
}

Tensor Tensor::clone() const {
  Tensor t = zeros(dtype_, shape_);
  if (nbytes_) std::memcpy(t.ptr_, ptr_, nbytes_);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape_numel(shape) != numel())
    throw Error(fmt::format("cannot reshape {} to {}", shape_str(shape_), shape_str(shape)));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

float float_at(const Tensor& t, int64_t i) {
  const std::byte* p = t.data();
  if (t.dtype() == DType::F32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (t.dtype() != DType::BF16 && t.dtype() != DType::F16)
    throw Error(fmt::format("float_at: a {} tensor (expected F32, BF16 or F16)", dtype_name(t.dtype())));
  uint16_t b;
  std::memcpy(&b, p + 2 * i, 2);
  return t.dtype() == DType::BF16 ? bf16_decode(b) : fp16_decode(b);
}

std::vector<float> to_f32(const Tensor& t, std::string_view what) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const std::byte* p = t.data();
  auto load = [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      out[i] = static_cast<float>(v);
    }
  };
  switch (t.dtype()) {
    case DType::F32: load(float{}); break;
    case DType::F64: load(double{}); break;
    case DType::I8: load(int8_t{}); break;
    case DType::U8: load(uint8_t{}); break;
    case DType::I16: load(int16_t{}); break;
    case DType::U16: load(uint16_t{}); break;
    case DType::I32: load(int32_t{}); break;
    case DType::U32: load(uint32_t{}); break;
    case DType::I64: load(int64_t{}); break;
    case DType::U64: load(uint64_t{}); break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = bf16_decode(b);
      }
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = fp16_decode(b);
      }
      break;
    case DType::F8_E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = fp8_e4m3_decode(static_cast<uint8_t>(p[i]));
      break;
    case DType::F8_E5M2:
      for (int64_t i = 0; i < n; ++i) out[i] = fp8_e5m2_decode(static_cast<uint8_t>(p[i]));
      break;
    case DType::F8_E8M0:
      for (int64_t i = 0; i < n; ++i) out[i] = e8m0_decode(static_cast<uint8_t>(p[i]));
      break;
    default:
      throw Error(fmt::format("{}: dtype {} cannot be read as numbers (expected a float or integer dtype)", what,
                              dtype_name(t.dtype())));
  }
  return out;
}

void check_finite_rows(const float* x, int64_t rows, int64_t cols, std::string_view tensor, std::string_view where,
                       std::string_view row_word) {
  const int64_t n = rows * cols;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) continue;
    const int64_t r = cols ? i / cols : 0, c = cols ? i % cols : 0;
    throw Error(fmt::format("{}: tensor '{}' holds {} at {} {} (column {}); expected finite values (the first "
                            "non-finite value of {} [{}, {}])",
                            where, tensor, x[i], row_word, r, c, tensor, rows, cols));
  }
}

}  // namespace qmoe
