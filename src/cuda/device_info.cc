// CUDA backend: device queries used by the CLI, tests and benchmarks.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/gemm_wgmma_host.h"
#include "qmoe/cuda.h"

namespace qmoe::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool available() { return device_count() > 0; }

std::string device_description(int device) {
  cudaDeviceProp p{};
  if (device < 0 || device >= device_count() || cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + std::to_string(p.totalGlobalMem >> 20) + " MiB, L2 " +
         std::to_string(p.l2CacheSize >> 20) + " MiB)";
}

bool wgmma_available() {
#if defined(QMOE_CUDA_SM90A)
  static const bool off = [] {
    const char* v = std::getenv("QMOE_CUDA_WGMMA");
    return v && std::strcmp(v, "0") == 0;
  }();
  if (off) return false;
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return p.major == 9 && p.minor == 0;
#else
  return false;
#endif
}

}  // namespace qmoe::cuda
