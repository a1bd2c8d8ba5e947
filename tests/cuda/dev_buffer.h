// Device buffers for the CUDA tests: freed on scope exit (also when an assertion returns early),
// filled from and read back into host vectors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace qmoe::cuda::test {

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p); }
};
// v → dst (synchronised: a pageable copy may still be in flight for other streams).
template <class T> void put(void* dst, const std::vector<T>& v) {
  ASSERT_EQ(cudaMemcpy(dst, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}
template <class T> void put(const Dev& d, const std::vector<T>& v) { put(d.p, v); }
template <class T> std::vector<T> get(const void* src, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), src, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
template <class T> std::vector<T> get(const Dev& d, size_t n) { return get<T>(d.p, n); }

}  // namespace qmoe::cuda::test
