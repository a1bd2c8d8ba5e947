// Device helpers of the CUDA benchmark runner (bench_kernels.cu); host-callable launchers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace qmoe::bench::kernels {

// Streams `bytes` (a multiple of 16, 16-byte aligned) of `buf` once: 16-byte evict-first loads,
// nothing written (sink: one device unsigned, written only on a practically impossible XOR).
cudaError_t launch_read_stream(const void* buf, size_t bytes, unsigned* sink, cudaStream_t stream);
// `count` uniform bf16 values in [-1, 1) (a hash of index and seed).
cudaError_t launch_fill_bf16(void* buf, size_t count, uint64_t seed, cudaStream_t stream);

}  // namespace qmoe::bench::kernels
