// CUDA backend: device queries used by the CLI and benchmarks.
#include <cuda_runtime.h>

#include <string>

namespace qmoe::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace qmoe::cuda
