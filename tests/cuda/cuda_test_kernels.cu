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

__global__ void k_fp4(const uint32_t* w, const float* mul, uint32_t* out, int units) {
  const int u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const uint32_t in[4] = {w[4 * u], w[4 * u + 1], w[4 * u + 2], w[4 * u + 3]};
  uint32_t o[16];
  decode_fp4_x32(in, mul[2 * u], mul[2 * u + 1], o);
  for (int i = 0; i < 16; ++i) out[16 * u + i] = o[i];
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
template <bool kE3M2>
__global__ void k_fp6(const uint32_t* w, const float* mul, uint32_t* out, int units) {
  const int u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= units) return;
  uint32_t in[6];
  for (int i = 0; i < 6; ++i) in[i] = w[6 * u + i];
  uint32_t o[16];
  decode_fp6_x32<kE3M2>(in, mul[u], o);
  for (int i = 0; i < 16; ++i) out[16 * u + i] = o[i];
}
__global__ void k_fp8(const uint32_t* w, uint32_t* out, int units) {
  const int u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= units) return;
  uint32_t in[8];
  for (int i = 0; i < 8; ++i) in[i] = w[8 * u + i];
  uint32_t o[16];
  decode_fp8_x32(in, o);
  for (int i = 0; i < 16; ++i) out[16 * u + i] = o[i];
}
__global__ void k_scalars(float* e8m0, float* fp8) {
  const uint32_t c = threadIdx.x;
  e8m0[c] = e8m0_to_f32(c);
  fp8[c] = fp8_e4m3_to_f32(c);
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

std::vector<uint32_t> decode_fp4_units(const std::vector<uint32_t>& words, const std::vector<float>& muls) {
  const int units = static_cast<int>(words.size() / 4);
  uint32_t* w = to_device(words);
  float* m = to_device(muls);
  uint32_t* o = to_device(std::vector<uint32_t>(16 * static_cast<size_t>(units)));
  k_fp4<<<(units + 127) / 128, 128>>>(w, m, o, units);
  QMOE_CUDA_CHECK(cudaGetLastError());
  auto r = from_device(o, 16 * static_cast<size_t>(units));
  cudaFree(w); cudaFree(m); cudaFree(o);
  return r;
}

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

std::vector<uint32_t> decode_fp6_units(bool e3m2, const std::vector<uint32_t>& words, const std::vector<float>& muls) {
  const int units = static_cast<int>(words.size() / 6);
  uint32_t* w = to_device(words);
  float* m = to_device(muls);
  uint32_t* o = to_device(std::vector<uint32_t>(16 * static_cast<size_t>(units)));
  if (e3m2) k_fp6<true><<<(units + 127) / 128, 128>>>(w, m, o, units);
  else k_fp6<false><<<(units + 127) / 128, 128>>>(w, m, o, units);
  QMOE_CUDA_CHECK(cudaGetLastError());
  auto r = from_device(o, 16 * static_cast<size_t>(units));
  cudaFree(w); cudaFree(m); cudaFree(o);
  return r;
}

std::vector<uint32_t> decode_fp8_units(const std::vector<uint32_t>& words) {
  const int units = static_cast<int>(words.size() / 8);
  uint32_t* w = to_device(words);
  uint32_t* o = to_device(std::vector<uint32_t>(16 * static_cast<size_t>(units)));
  k_fp8<<<(units + 127) / 128, 128>>>(w, o, units);
  QMOE_CUDA_CHECK(cudaGetLastError());
  auto r = from_device(o, 16 * static_cast<size_t>(units));
  cudaFree(w); cudaFree(o);
  return r;
}

static std::vector<float> scalars(bool e8m0) {
  float* a = to_device(std::vector<float>(256));
  float* b = to_device(std::vector<float>(256));
  k_scalars<<<1, 256>>>(a, b);
  QMOE_CUDA_CHECK(cudaGetLastError());
  auto r = from_device(e8m0 ? a : b, 256);
  cudaFree(a); cudaFree(b);
  return r;
}
std::vector<float> e8m0_all() { return scalars(true); }
std::vector<float> fp8_all() { return scalars(false); }

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
