// CUDA backend: device queries used by the CLI, tests and benchmarks.
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/gemm_wgmma_host.h"
#include "qmoe/cuda.h"
#include "qmoe/error.h"

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

CUtensorMap make_rows_tmap(const void* base, int64_t rows, int64_t row_bytes, int box_rows) {
  // The driver's encoder through the runtime (no link against libcuda).
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    QMOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr)
      throw Error("CUDA: the driver has no cuTensorMapEncodeTiled (TMA tensor maps need CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (rows <= 0 || row_bytes <= 0 || row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(base) % 16 != 0 || box_rows <= 0 ||
      box_rows > 256)
    throw Error("CUDA: tensor map of " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) +
                " bytes, box rows " + std::to_string(box_rows) + ": expected rows of a multiple of 16 bytes at a 16-byte "
                "aligned address and 1-256 box rows");
  CUtensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {128, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, estr,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("CUDA: cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) + ") for " +
                std::to_string(rows) + " rows of " + std::to_string(row_bytes) + " bytes");
  return m;
}

}  // namespace qmoe::cuda
