// Tensor storage (util::alloc_zeroed): zero-filled, 64-byte aligned, and from util::kHugeMin bytes
// on aligned to a 2 MiB huge page (the page-table reach the decode kernels rely on).
#include <gtest/gtest.h>

#include <cstdint>

#include "qmoe/tensor.h"
#include "util/memory.h"

namespace qmoe {
namespace {

uintptr_t address(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); }

TEST(TensorStorage, ZeroedAndAligned) {
  for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{4097}, static_cast<int64_t>(util::kHugeMin) - 1,
                    static_cast<int64_t>(util::kHugeMin), static_cast<int64_t>(util::kHugeMin) * 3 + 5}) {
    const Tensor t = Tensor::zeros(DType::U8, {n});
    ASSERT_EQ(t.nbytes(), static_cast<size_t>(n));
    EXPECT_EQ(address(t) % 64, 0u) << n;
    if (n >= static_cast<int64_t>(util::kHugeMin)) {
      EXPECT_EQ(address(t) % util::kHugePage, 0u) << n;
    }
    const auto* p = reinterpret_cast<const uint8_t*>(t.data());
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; ++i) nonzero += p[i] != 0;
    EXPECT_EQ(nonzero, 0) << n;
  }
}

TEST(TensorStorage, EmptyTensorHasStorage) {
  const Tensor t = Tensor::zeros(DType::F32, {0, 7});
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_NE(t.data(), nullptr);
}

}  // namespace
}  // namespace qmoe
