// Host wrappers around small test kernels that exercise the CUDA backend's device functions
// (decode bit tricks, row quantizers) one by one.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/cuda_common.h"

namespace qmoe::cuda::test {

// The GEMM's FP4 path (frag_layout.h): each fragment word decoded and multiplied by kernel scale
// byte `scale_byte` of its scale word → 4 bf16x2 words per input word.
std::vector<uint32_t> decode_fp4_fragments(bool nvfp4, const std::vector<uint32_t>& words,
                                           const std::vector<uint32_t>& scale_words, int scale_byte);
// e4m3x4_to_f16x2x2 of each word (both halves) → 2 fp16x2 words per input word.
std::vector<uint32_t> decode_fp8_units(const std::vector<uint32_t>& words);

// e4m3x2_act_codes (the hardware conversion on this card) and e4m3x2_act_codes_sw, both on the
// device, for pairs (a[i], b[i]).
struct E4m3Pairs {
  std::vector<uint16_t> hw, sw;
};
E4m3Pairs e4m3x2_codes(const std::vector<float>& a, const std::vector<float>& b, float inv_scale);

struct QuantRowsResult {
  std::vector<float> hi, lo;  // bf16 operands as floats
  std::vector<int8_t> i8;     // int8 operands
  std::vector<float> rowscale;
};
// quantize_row on `rows` rows of n values (one block per row). For Fp8DynTensor the device
// tensor amax is set to `tensor_amax` first.
QuantRowsResult quantize_rows(RowQuant q, const std::vector<float>& x, int rows, int n, float tensor_amax);

}  // namespace qmoe::cuda::test
