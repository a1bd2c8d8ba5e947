#include "cuda_test_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "cuda/decode.cuh"
#include "cuda/frag_layout.h"
#include "cuda/row_quant.cuh"

namespace qmoe::cuda::test {

namespace {

template <class T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  QMOE_CUDA_CHECK(cudaMalloc(&p, sizeof(T) * std::max<size_t>(v.size(), 1)));
  if (!v.empty()) QMOE_CUDA_CHECK(cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice));
  return p;
}
template <class T>
std::vector<T> from_device(const T* p, size_t n) {
  std::vector<T> v(n);
  QMOE_CUDA_CHECK(cudaDeviceSynchronize());
  if (n) QMOE_CUDA_CHECK(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
  return v;
}

template <bool kNv>
__global__ void k_fp4_frag(const uint32_t* w, const uint32_t* sw, int sbyte, uint32_t* out, int n) {
  const int u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= n) return;
  uint32_t o[4];
  fp4_frag_decode(w[u], o);
  const uint32_t m = fp4_scale_bf16x2<kNv>(sw[u], sbyte);
  for (int j = 0; j < 4; ++j) out[4 * u + j] = bf16x2_mul_bits(o[j], m);
}
__global__ void k_fp8(const uint32_t* w, uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  e4m3x4_to_f16x2x2(w[i], out[2 * i], out[2 * i + 1]);
}
__global__ void k_e4m3x2(const float* a, const float* b, float inv, uint16_t* hw, uint16_t* sw, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  hw[i] = e4m3x2_act_codes(a[i], b[i], inv);
  sw[i] = e4m3x2_act_codes_sw(a[i], b[i], inv);
}
__global__ void k_quant_rows(const float* x, int n, const RowQuant q, const RowOut o) {
  extern __shared__ float sv[];
  __shared__ float red[32];
  for (int i = threadIdx.x; i < n; i += blockDim.x) sv[i] = x[static_cast<int64_t>(blockIdx.x) * n + i];
  __syncthreads();
  quantize_row(sv, n, q, o, blockIdx.x, red);
}
__global__ void k_bf16_to_f32(const __nv_bfloat16* a, float* b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) b[i] = __bfloat162float(a[i]);
}
__global__ void k_f16_to_f32(const __half* a, float* b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) b[i] = __half2float(a[i]);
}

}  // namespace

std::vector<uint32_t> decode_fp4_fragments(bool nvfp4, const std::vector<uint32_t>& words,
                                           const std::vector<uint32_t>& scale_words, int scale_byte) {
  const int n = static_cast<int>(words.size());
  uint32_t* w = to_device(words);
  uint32_t* sw = to_device(scale_words);
  uint32_t* o = to_device(std::vector<uint32_t>(4 * static_cast<size_t>(n)));
  if (nvfp4) k_fp4_frag<true><<<(n + 127) / 128, 128>>>(w, sw, scale_byte, o, n);
  else k_fp4_frag<false><<<(n + 127) / 128, 128>>>(w, sw, scale_byte, o, n);
  QMOE_CUDA_CHECK(cudaGetLastError());
  auto r = from_device(o, 4 * static_cast<size_t>(n));
  cudaFree(w); cudaFree(sw); cudaFree(o);
  return r;
}

E4m3Pairs e4m3x2_codes(const std::vector<float>& a, const std::vector<float>& b, float inv_scale) {
  const int n = static_cast<int>(a.size());
  float* da = to_device(a);
  float* db = to_device(b);
  uint16_t *hw = nullptr, *sw = nullptr;
  QMOE_CUDA_CHECK(cudaMalloc(&hw, sizeof(uint16_t) * std::max(n, 1)));
  QMOE_CUDA_CHECK(cudaMalloc(&sw, sizeof(uint16_t) * std::max(n, 1)));
  if (n > 0) k_e4m3x2<<<(n + 255) / 256, 256>>>(da, db, inv_scale, hw, sw, n);
  QMOE_CUDA_CHECK(cudaGetLastError());
  E4m3Pairs r{from_device(hw, static_cast<size_t>(n)), from_device(sw, static_cast<size_t>(n))};
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(hw), static_cast<void*>(sw)})
    QMOE_CUDA_CHECK(cudaFree(p));
  return r;
}

std::vector<uint32_t> decode_fp8_units(const std::vector<uint32_t>& words) {
  const int n = static_cast<int>(words.size());
  uint32_t* w = to_device(words);
  uint32_t* o = to_device(std::vector<uint32_t>(2 * static_cast<size_t>(n)));
  k_fp8<<<(n + 127) / 128, 128>>>(w, o, n);
  QMOE_CUDA_CHECK(cudaGetLastError());
  auto r = from_device(o, 2 * static_cast<size_t>(n));
  cudaFree(w); cudaFree(o);
  return r;
}


QuantRowsResult quantize_rows(RowQuant q, const std::vector<float>& x, int rows, int n, float tensor_amax) {
  const bool int8 = q.mode == ActQuant::Int8Static || q.mode == ActQuant::Int8DynToken;
  const size_t total = static_cast<size_t>(rows) * n;
  float* dx = to_device(x);
  void* hi = nullptr;
  void* lo = nullptr;
  QMOE_CUDA_CHECK(cudaMalloc(&hi, total * 2));
  QMOE_CUDA_CHECK(cudaMalloc(&lo, total * 2));
  QMOE_CUDA_CHECK(cudaMemset(hi, 0, total * 2));
  QMOE_CUDA_CHECK(cudaMemset(lo, 0, total * 2));
  float* rs = to_device(std::vector<float>(static_cast<size_t>(rows), -1.0f));
  unsigned bits = 0;
  std::memcpy(&bits, &tensor_amax, 4);
  unsigned* amax = to_device(std::vector<unsigned>{bits});
  q.tensor_amax = amax;
  RowOut o{hi, q.split ? lo : nullptr, rs, n};
  k_quant_rows<<<rows, kRowThreads, sizeof(float) * n>>>(dx, n, q, o);
  QMOE_CUDA_CHECK(cudaGetLastError());
  QuantRowsResult r;
  r.rowscale = from_device(rs, static_cast<size_t>(rows));
  if (int8) {
    r.i8 = from_device(static_cast<const int8_t*>(hi), total);
  } else {
    float* f = to_device(std::vector<float>(total));
    if (q.f16) k_f16_to_f32<<<static_cast<int>((total + 255) / 256), 256>>>(static_cast<const __half*>(hi), f, total);
    else k_bf16_to_f32<<<static_cast<int>((total + 255) / 256), 256>>>(static_cast<const __nv_bfloat16*>(hi), f, total);
    r.hi = from_device(f, total);
    k_bf16_to_f32<<<static_cast<int>((total + 255) / 256), 256>>>(static_cast<const __nv_bfloat16*>(lo), f, total);
    r.lo = from_device(f, total);
    cudaFree(f);
  }
  cudaFree(dx); cudaFree(hi); cudaFree(lo); cudaFree(rs); cudaFree(amax);
  return r;
}

}  // namespace qmoe::cuda::test
