// Kernel launches of the layer pipeline with programmatic dependent launch (PDL, sm_90).
//
// Every pipeline kernel is launched with programmatic stream serialization, so that the next
// kernel's CTAs start while the current one drains instead of after a full launch gap. The
// contract every pipeline kernel keeps:
//  * pdl_wait() before reading anything its predecessor in the stream wrote and before writing
//    anything an earlier kernel may still read (griddepcontrol.wait returns once the whole
//    preceding grid has completed and its writes are visible; without PDL it returns at once);
//  * pdl_trigger() only after its own pdl_wait(), so that when a kernel starts, the kernel two
//    places before it in the stream has completed. The GEMMs rely on that: before their wait
//    they read align's tile lists (complete by then) and start streaming the weights, which no
//    kernel writes, overlapping the previous kernel's tail. One kernel breaks it on purpose:
//    quant_input with after_align triggers before its wait (it runs beside align), so the GEMM
//    right after it reads the tile lists after its wait (GemmArgs::tiles_after_wait, experts.cc).
// QMOE_CUDA_PDL=0 in the environment launches without the attribute (plain stream order).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda/cuda_common.h"

namespace qmoe::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A process-wide switch that is on unless the environment sets it to "0" (read by the caller
// once, into a static).
inline bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::strcmp(v, "0") == 0);
}

inline bool pdl_enabled() {
  static const bool on = env_switch("QMOE_CUDA_PDL");
  return on;
}

template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  QMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// launch_pdl of a kernel that takes kSmem bytes of dynamic shared memory, raising its limit to
// that once (the first launch of each kernel instantiation).
template <auto kKernel, int kSmem, class... Args>
void launch_pdl_smem(dim3 grid, dim3 block, cudaStream_t s, Args&&... args) {
  static const bool configured = [] {
    QMOE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)configured;
  launch_pdl(kKernel, grid, block, kSmem, s, std::forward<Args>(args)...);
}

}  // namespace qmoe::cuda
