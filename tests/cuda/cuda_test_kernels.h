// Host wrappers around small test kernels that exercise the CUDA backend's device functions
// (decode bit tricks, row quantizers) one by one.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/cuda_common.h"

namespace qmoe::cuda::test {

// Each unit is 32 elements; the output is 16 bf16x2 words per unit.
std::vector<uint32_t> decode_fp4_units(const std::vector<uint32_t>& words /*4 per unit*/,
                                       const std::vector<float>& muls /*2 per unit*/);
// The GEMM's FP4 path (frag_layout.h): each fragment word decoded and multiplied by kernel scale
// byte `scale_byte` of its scale word → 4 bf16x2 words per input word.
std::vector<uint32_t> decode_fp4_fragments(bool nvfp4, const std::vector<uint32_t>& words,
                                           const std::vector<uint32_t>& scale_words, int scale_byte);
std::vector<uint32_t> decode_fp6_units(bool e3m2, const std::vector<uint32_t>& words /*6 per unit*/,
                                       const std::vector<float>& muls /*1 per unit*/);
std::vector<uint32_t> decode_fp8_units(const std::vector<uint32_t>& words /*8 per unit*/);
// e8m0_to_f32 and fp8_e4m3_to_f32 of every byte.
std::vector<float> e8m0_all();
std::vector<float> fp8_all();

struct QuantRowsResult {
  std::vector<float> hi, lo;  // bf16 operands as floats
  std::vector<int8_t> i8;     // int8 operands
  std::vector<float> rowscale;
};
// quantize_row on `rows` rows of n values (one block per row). For Fp8DynTensor the device
// tensor amax is set to `tensor_amax` first.
QuantRowsResult quantize_rows(RowQuant q, const std::vector<float>& x, int rows, int n, float tensor_amax);

}  // namespace qmoe::cuda::test
