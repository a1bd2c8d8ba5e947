// A small owning / non-owning host tensor: dtype, shape (row-major, contiguous), bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qmoe {

// safetensors dtypes, in the safetensors enum order (the writer sorts by it).
enum class DType : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

std::string_view dtype_name(DType d);                       // "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view s);  // nullopt for unknown strings
int dtype_bits(DType d);                                    // 4 for F4, 6 for F6_*, 8·size otherwise

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  // Owning, zero-filled.
  static Tensor zeros(DType dtype, Shape shape);
  // Non-owning view of external bytes; `keepalive` (may be null) owns them.
  static Tensor view(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> keepalive);
  // Owning copy of a float vector as F32.
  static Tensor from_f32(const std::vector<float>& v, Shape shape);

  bool defined() const { return dtype_set_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i < 0 ? i + ndim() : i)); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return nbytes_; }

  const std::byte* data() const { return ptr_; }
  std::byte* mutable_data();  // throws qmoe::Error for a read-only view
  template <class T> const T* data_as() const { return reinterpret_cast<const T*>(ptr_); }
  template <class T> T* mutable_data_as() { return reinterpret_cast<T*>(mutable_data()); }

  Tensor clone() const;  // owning deep copy
  // Same bytes, new shape with the same numel (shares storage).
  Tensor reshape(Shape shape) const;

 private:
  DType dtype_ = DType::U8;
  bool dtype_set_ = false;
  Shape shape_;
  std::byte* ptr_ = nullptr;
  size_t nbytes_ = 0;
  bool writable_ = false;
  std::shared_ptr<const void> holder_;
};

// Values of a float-like tensor (F32, F16, BF16, F64, F8_E4M3, F8_E5M2, I8, U8, I32, I64...) as float.
// Throws qmoe::Error naming `what` for dtypes that are not numeric.
std::vector<float> to_f32(const Tensor& t, std::string_view what = "tensor");

// Element i of a F32, BF16 or F16 tensor as float (an unaligned read: views of a mapped file need
// not be aligned); any other dtype throws qmoe::Error.
float float_at(const Tensor& t, int64_t i);

// One pass over rows × cols row-major fp32 values: the first NaN / ±Inf throws qmoe::Error
// "WHERE: tensor 'NAME' holds nan at token R (column C) ...; expected finite values" (`row_word`
// names a row: "token" for activations).
void check_finite_rows(const float* x, int64_t rows, int64_t cols, std::string_view tensor, std::string_view where,
                       std::string_view row_word = "token");

}  // namespace qmoe
